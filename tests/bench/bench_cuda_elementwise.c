/*
 * bench_cuda_elementwise.c — achieved memory bandwidth of the CUDA
 * elementwise ops (kernels/cuda/elementwise.h) against the device's
 * measured copy bandwidth, side by side in one run (DESIGN.md §8 item 7).
 *
 * The ceiling is a cudaMemcpyAsync device-to-device copy of a large
 * buffer, counted as bytes read + bytes written. Each op is timed with CUDA
 * events over repeated launches on one stream and charged the bytes it must
 * move at minimum (every input element read once, every output written
 * once); GB/s = 1e9 bytes per second. Shapes are prefill-sized
 * (Llama-3.1-8B: hidden 4096, 32 query heads, d 128, intermediate 14336).
 *
 * usage: bench-cuda-elementwise [--quick]
 *   --quick   small shapes, few iterations (the ctest smoke run)
 * Without a CUDA build or a device it prints "skipped: no CUDA device" and
 * exits 77 (skipped). Exits 1 if an op fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/elementwise.h"
#endif

#ifdef TANGRAM_CUDA
enum op {
    OP_COPY,
    OP_EMBEDDING,
    OP_RMSNORM,
    OP_RMSNORM_RES_BF16,
    OP_RMSNORM_RES_F32,
    OP_ROPE,
    OP_ROPE_NORM,
    OP_SILU_MUL,
    OP_F32_TO_BF16,
    OP_BF16_TO_F32,
};

struct bench {
    cudaStream_t stream;
    char *a, *b, *c;       /* device scratch, `cap` bytes each */
    size_t cap;
    uint16_t *table;       /* (vocab, hidden) bf16 */
    uint16_t *w;           /* (max(hidden, d)) bf16 norm weights */
    int32_t *ids, *pos;    /* (tokens) */
    float *inv_freq;       /* (d/2) */
    int tokens, hidden, vocab, heads, d, inter;
    size_t conv_len;       /* elements of the conversion case */
    size_t copy_bytes;
};

/* Enqueues one instance of `op`; returns 0 or a TG_E* code. */
static int run_op(const struct bench *B, enum op op)
{
    const enum tg_cuda_elementwise_dtype F = TG_CUDA_ELEMENTWISE_F32,
                                         H = TG_CUDA_ELEMENTWISE_BF16;
    void *s = B->stream;
    switch (op) {
    case OP_COPY:
        return cudaMemcpyAsync(B->b, B->a, B->copy_bytes,
                               cudaMemcpyDeviceToDevice, B->stream) ==
                       cudaSuccess ? 0 : TG_EDEVICE;
    case OP_EMBEDDING:
        return tg_cuda_elementwise_embedding(B->table, B->vocab, B->hidden,
                                             B->ids, B->tokens, B->a, H, s);
    case OP_RMSNORM:
        return tg_cuda_elementwise_rmsnorm(B->a, H, NULL, H, B->w, B->tokens,
                                           B->hidden, 1e-5f, B->c, H, s);
    case OP_RMSNORM_RES_BF16:
        return tg_cuda_elementwise_rmsnorm(B->a, H, B->b, H, B->w, B->tokens,
                                           B->hidden, 1e-5f, B->c, H, s);
    case OP_RMSNORM_RES_F32:
        return tg_cuda_elementwise_rmsnorm(B->a, F, B->b, H, B->w, B->tokens,
                                           B->hidden, 1e-5f, B->c, H, s);
    case OP_ROPE:
        return tg_cuda_elementwise_rope(B->a, H, B->tokens, B->heads, B->d,
                                        (int64_t)B->heads * B->d, B->pos,
                                        B->inv_freq, NULL, 1e-6f, s);
    case OP_ROPE_NORM:
        return tg_cuda_elementwise_rope(B->a, H, B->tokens, B->heads, B->d,
                                        (int64_t)B->heads * B->d, B->pos,
                                        B->inv_freq, B->w, 1e-6f, s);
    case OP_SILU_MUL:
        /* Fused gate_up output (tokens, 2 * inter) -> (tokens, inter). */
        return tg_cuda_elementwise_silu_mul(
            B->a, B->a + (size_t)B->inter * 2, H, B->tokens, B->inter,
            2 * (int64_t)B->inter, B->b, H, B->inter, s);
    case OP_F32_TO_BF16:
        return tg_cuda_elementwise_f32_to_bf16(
            (const float *)B->a, (uint16_t *)B->b, B->conv_len, s);
    case OP_BF16_TO_F32:
        return tg_cuda_elementwise_bf16_to_f32((const uint16_t *)B->a,
                                               (float *)B->b, B->conv_len, s);
    }
    return TG_EINVAL;
}

/* Minimum bytes moved by one instance of `op`. */
static double op_bytes(const struct bench *B, enum op op)
{
    double t = B->tokens, hd = (double)B->tokens * B->hidden;
    double q = t * B->heads * B->d, g = t * B->inter;
    switch (op) {
    case OP_COPY: return 2.0 * (double)B->copy_bytes;
    case OP_EMBEDDING: return hd * 2 * 2 + t * 4;
    case OP_RMSNORM: return hd * 2 * 2 + B->hidden * 2.0;
    /* read x, r; write x, out */
    case OP_RMSNORM_RES_BF16: return hd * 2 * 4 + B->hidden * 2.0;
    case OP_RMSNORM_RES_F32: return hd * (4 + 2 + 4 + 2) + B->hidden * 2.0;
    case OP_ROPE: return q * 2 * 2 + t * 4 + B->d * 2.0;
    case OP_ROPE_NORM: return q * 2 * 2 + t * 4 + B->d * 2.0 + B->d * 2.0;
    case OP_SILU_MUL: return g * 2 * 3;
    case OP_F32_TO_BF16:
    case OP_BF16_TO_F32: return (double)B->conv_len * 6;
    }
    return 0;
}

static const char *op_name(enum op op)
{
    switch (op) {
    case OP_COPY: return "memcpy D2D (ceiling)";
    case OP_EMBEDDING: return "embedding bf16";
    case OP_RMSNORM: return "rmsnorm bf16";
    case OP_RMSNORM_RES_BF16: return "rmsnorm+residual bf16";
    case OP_RMSNORM_RES_F32: return "rmsnorm+residual f32 stream";
    case OP_ROPE: return "rope bf16";
    case OP_ROPE_NORM: return "rope+qk-norm bf16";
    case OP_SILU_MUL: return "silu_mul bf16 (fused gate_up)";
    case OP_F32_TO_BF16: return "f32 -> bf16";
    case OP_BF16_TO_F32: return "bf16 -> f32";
    }
    return "?";
}

/* Mean milliseconds per launch over `iters` launches after a warm-up;
 * negative on failure. */
static double time_op(const struct bench *B, enum op op, int iters)
{
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess)
        return -1;
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return -1;
    }
    double ms = -1;
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = run_op(B, op);
    if (rc == 0 && cudaEventRecord(e0, B->stream) == cudaSuccess) {
        for (int i = 0; i < iters && rc == 0; i++)
            rc = run_op(B, op);
        float f = 0;
        if (rc == 0 && cudaEventRecord(e1, B->stream) == cudaSuccess &&
            cudaEventSynchronize(e1) == cudaSuccess &&
            cudaEventElapsedTime(&f, e0, e1) == cudaSuccess)
            ms = (double)f / iters;
    }
    if (rc != 0)
        fprintf(stderr, "bench-cuda-elementwise: %s failed: %s\n",
                op_name(op), tg_strerror(rc));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms;
}

static int setup(struct bench *B, int quick)
{
    memset(B, 0, sizeof(*B));
    B->hidden = 4096;
    B->heads = 32;
    B->d = 128;
    B->inter = 14336;
    B->tokens = quick ? 256 : 16384;
    B->vocab = quick ? 1024 : 32768;
    B->conv_len = quick ? (size_t)1 << 20 : (size_t)1 << 26;
    /* Largest case: the fused gate_up input, tokens x 2 x inter bf16. */
    B->cap = (size_t)B->tokens * 2 * B->inter * 2;
    if (B->cap < B->conv_len * 4)
        B->cap = B->conv_len * 4;
    B->copy_bytes = B->cap;
    if (cudaStreamCreate(&B->stream) != cudaSuccess ||
        cudaMalloc((void **)&B->a, B->cap) != cudaSuccess ||
        cudaMalloc((void **)&B->b, B->cap) != cudaSuccess ||
        cudaMalloc((void **)&B->c, B->cap) != cudaSuccess ||
        cudaMalloc((void **)&B->table,
                   (size_t)B->vocab * B->hidden * 2) != cudaSuccess ||
        cudaMalloc((void **)&B->w, (size_t)B->hidden * 2) != cudaSuccess ||
        cudaMalloc((void **)&B->ids, (size_t)B->tokens * 4) != cudaSuccess ||
        cudaMalloc((void **)&B->pos, (size_t)B->tokens * 4) != cudaSuccess ||
        cudaMalloc((void **)&B->inv_freq, (size_t)B->d / 2 * 4) != cudaSuccess)
        return TG_EDEVICE;
    /* Byte 0x3f everywhere: finite, non-zero values as bf16 (0x3f3f ~ 0.75)
     * and as f32 (0x3f3f3f3f ~ 0.75). */
    if (cudaMemset(B->a, 0x3f, B->cap) != cudaSuccess ||
        cudaMemset(B->b, 0x3f, B->cap) != cudaSuccess ||
        cudaMemset(B->table, 0x3f, (size_t)B->vocab * B->hidden * 2) !=
            cudaSuccess ||
        cudaMemset(B->w, 0x3f, (size_t)B->hidden * 2) != cudaSuccess)
        return TG_EDEVICE;
    int32_t *ids = malloc((size_t)B->tokens * 4);
    int32_t *pos = malloc((size_t)B->tokens * 4);
    float *inv = malloc((size_t)B->d / 2 * 4);
    if (ids == NULL || pos == NULL || inv == NULL) {
        free(ids);
        free(pos);
        free(inv);
        return TG_ENOMEM;
    }
    struct tt_xrng r = {0x2545f4914f6cdd1dull};
    for (int i = 0; i < B->tokens; i++) {
        ids[i] = (int32_t)((tt_xrng_next(&r) >> 33) % (uint64_t)B->vocab);
        pos[i] = i; /* one long prompt */
    }
    /* HF default RoPE table, theta = 5e5 (Llama-3): theta^(-2j/d). */
    for (int j = 0; j < B->d / 2; j++)
        inv[j] = (float)pow(5e5, -2.0 * j / B->d);
    int rc = 0;
    if (cudaMemcpy(B->ids, ids, (size_t)B->tokens * 4,
                   cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(B->pos, pos, (size_t)B->tokens * 4,
                   cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(B->inv_freq, inv, (size_t)B->d / 2 * 4,
                   cudaMemcpyHostToDevice) != cudaSuccess)
        rc = TG_EDEVICE;
    free(ids);
    free(pos);
    free(inv);
    return rc;
}

static void teardown(struct bench *B)
{
    cudaFree(B->a);
    cudaFree(B->b);
    cudaFree(B->c);
    cudaFree(B->table);
    cudaFree(B->w);
    cudaFree(B->ids);
    cudaFree(B->pos);
    cudaFree(B->inv_freq);
    if (B->stream != NULL)
        cudaStreamDestroy(B->stream);
}
#endif

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
            return 2;
        }
    }
#ifndef TANGRAM_CUDA
    (void)quick;
    return tt_cuda_skip("built without CUDA");
#else
    int n_dev = 0;
    struct tg_cuda_device_info info;
    if (!tt_cuda_have_device(NULL))
        return tt_cuda_skip("no CUDA device");
    if (tg_cuda_device_count(&n_dev) != 0 ||
        tg_cuda_device_query(0, &info) != 0) {
        fprintf(stderr, "bench-cuda-elementwise: device query failed\n");
        return 1;
    }
    struct bench B;
    int rc = setup(&B, quick);
    if (rc != 0) {
        fprintf(stderr, "bench-cuda-elementwise: setup failed: %s\n",
                tg_strerror(rc));
        teardown(&B);
        return 1;
    }
    const int iters = quick ? 3 : 20;
    printf("device: %s (sm_%d%d, %d SMs)\n", info.name, info.cc_major,
           info.cc_minor, info.sm_count);
    printf("shapes: tokens %d, hidden %d, heads %d x d %d, intermediate %d, "
           "conversion %zu elements; %d iterations%s\n",
           B.tokens, B.hidden, B.heads, B.d, B.inter, B.conv_len, iters,
           quick ? " (quick)" : "");
    double ceiling = 0;
    int failed = 0;
    printf("%-32s %10s %10s %8s\n", "op", "ms", "GB/s", "of copy");
    for (int op = OP_COPY; op <= OP_BF16_TO_F32; op++) {
        double ms = time_op(&B, (enum op)op, iters);
        if (ms < 0) {
            failed = 1;
            continue;
        }
        double gbs = op_bytes(&B, (enum op)op) / (ms * 1e-3) / 1e9;
        if (op == OP_COPY)
            ceiling = gbs;
        printf("%-32s %10.4f %10.1f %7.1f%%\n", op_name((enum op)op), ms, gbs,
               ceiling > 0 ? 100.0 * gbs / ceiling : 0.0);
    }
    teardown(&B);
    return failed ? 1 : 0;
#endif
}
