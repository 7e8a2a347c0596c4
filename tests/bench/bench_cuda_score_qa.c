/* bench_cuda_score_qa.c — the three chunk scoring methods on the device,
 * side by side on the same chunk (kernels/cuda/score_qa.h, compress.h):
 * snapkv (query-aware, cmp_score_snapkv), keydiff and expected_attention
 * (query-agnostic), all through cmp_score.
 *
 * Shapes: Llama-3.1-8B (Hq 32, Hkv 8, d 128) and Qwen3-32B (Hq 64, Hkv 8,
 * d 128) at chunk sizes 512 and 2048, window 32. Reported per method:
 * microseconds per call (mean over reps, CUDA events, after a warm-up),
 * the ratio to snapkv on the same chunk, and
 *  - keydiff: K bytes read (two passes over the chunk's keys) per second,
 *    as a fraction of the measured device-to-device copy bandwidth (read +
 *    write bytes per second, the usual ceiling of a streaming kernel);
 *  - expected_attention: its multiply-adds (Hq * n * d * (W + 1)) as
 *    GFLOP/s (2 flops each).
 *
 * Usage: bench-cuda-score-qa [--quick] [--bench] [--reps N]
 * Without a CUDA build or device it prints "skipped: no CUDA device" and
 * exits 0. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "common/st_safetensors.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/score_qa.h"
#endif

#ifdef TANGRAM_CUDA
#define CK(expr)                                                           \
    do {                                                                   \
        cudaError_t ck__ = (expr);                                         \
        if (ck__ != cudaSuccess) {                                         \
            fprintf(stderr, "bench: %s: %s\n", #expr,                      \
                    cudaGetErrorString(ck__));                             \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

static uint64_t rng_state = 0x853c49e6748fea9bull;

static float urand(void)
{
    /* xorshift64* (Vigna 2016). */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t x = rng_state * 2685821657736338717ull;
    return (float)((x >> 11) * (1.0 / 9007199254740992.0));
}

static uint16_t *dev_random_bf16(size_t len, float lo, float hi)
{
    uint16_t *h = malloc(len * 2);
    if (h == NULL) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < len; i++)
        h[i] = st_f32_to_bf16(lo + (hi - lo) * urand());
    uint16_t *d = NULL;
    CK(cudaMalloc((void **)&d, len * 2));
    CK(cudaMemcpy(d, h, len * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static double copy_bandwidth(size_t bytes)
{
    void *a = NULL, *b = NULL;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 10;
    CK(cudaEventRecord(e0, NULL));
    for (int i = 0; i < reps; i++)
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, NULL));
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * (double)bytes * reps / (ms * 1e-3); /* read + write */
}

/* Mean microseconds of one cmp_score call over reps (after one warm-up). */
static double time_method(enum tg_score_method m, const struct cmp_chunk *c,
                          float *scores, void *ws, size_t wsb, int reps)
{
    if (cmp_score(m, c, scores, ws, wsb, NULL) != 0) {
        fprintf(stderr, "bench: cmp_score(%d) failed\n", (int)m);
        exit(1);
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, NULL));
    for (int r = 0; r < reps; r++)
        if (cmp_score(m, c, scores, ws, wsb, NULL) != 0) {
            fprintf(stderr, "bench: cmp_score(%d) failed\n", (int)m);
            exit(1);
        }
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms * 1e3 / reps;
}

struct model {
    const char *name;
    int hq, hkv, d;
};

static void run_config(const struct model *md, int n, int reps, double copy_bw)
{
    const int W = 32;
    const size_t nq = (size_t)n * md->hq * md->d, nk = (size_t)n * md->hkv * md->d;
    uint16_t *q = dev_random_bf16(nq, -2.0f, 2.0f);
    uint16_t *k = dev_random_bf16(nk, -1.0f, 1.0f);
    uint16_t *v = dev_random_bf16(nk, -3.0f, 3.0f);
    struct cmp_chunk c = {
        .q = q, .k = k, .v = v, .n = n, .n_q_heads = md->hq,
        .n_kv_heads = md->hkv, .head_dim = md->d, .start = 0, .window = W,
        .n_sink = 4, .scale = 1.0f / sqrtf((float)md->d),
    };
    const enum tg_score_method ms[3] = {TG_SCORE_SNAPKV, TG_SCORE_KEYDIFF,
                                        TG_SCORE_EXPECTED_ATTENTION};
    size_t wsb = 0;
    for (int i = 0; i < 3; i++) {
        size_t b = cmp_qa_workspace_bytes(ms[i], n, md->hq, md->hkv, md->d, W);
        wsb = b > wsb ? b : wsb;
    }
    void *ws = NULL;
    float *scores = NULL;
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMalloc((void **)&scores, (size_t)md->hkv * n * sizeof(float)));
    double us[3];
    for (int i = 0; i < 3; i++)
        us[i] = time_method(ms[i], &c, scores, ws, wsb, reps);
    const double kd_bytes = 2.0 * (double)nk * 2.0; /* two passes over K */
    const double kd_bw = kd_bytes / (us[1] * 1e-6);
    const double ea_flop = 2.0 * md->hq * (double)n * md->d * (W + 1);
    printf("%-13s n %4d | snapkv %8.1f us | keydiff %7.1f us (%.2fx snapkv; "
           "%.1f GB/s = %.2f of copy) | expected_attention %8.1f us (%.2fx "
           "snapkv; %.1f GFLOP/s)\n", md->name, n, us[0], us[1],
           us[1] / us[0], kd_bw * 1e-9, kd_bw / copy_bw, us[2],
           us[2] / us[0], ea_flop / (us[2] * 1e-6) * 1e-9);
    CK(cudaFree(ws));
    CK(cudaFree(scores));
    CK(cudaFree(q));
    CK(cudaFree(k));
    CK(cudaFree(v));
}
#endif

int main(int argc, char **argv)
{
    int quick = 0, reps = 50;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--bench") == 0) {
            continue;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            char *end = NULL;
            long r = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end != '\0' || r < 1 || r > 100000) {
                fprintf(stderr, "bench: --reps wants 1..100000\n");
                return 2;
            }
            reps = (int)r;
        } else {
            fprintf(stderr, "usage: %s [--quick] [--bench] [--reps N]\n",
                    argv[0]);
            return 2;
        }
    }
#ifdef TANGRAM_CUDA
    int n_dev = 0;
    if (tg_cuda_device_count(&n_dev) != 0) {
        printf("skipped: no CUDA device\n");
        return 0;
    }
    struct tg_cuda_device_info info;
    if (tg_cuda_device_query(0, &info) != 0) {
        fprintf(stderr, "bench: device query failed\n");
        return 1;
    }
    if (quick)
        reps = 3;
    double copy_bw = copy_bandwidth(quick ? (size_t)64 << 20 : (size_t)1 << 30);
    printf("device: %s, %d SMs, sm_%d%d; copy bandwidth %.1f GB/s (read + "
           "write); window 32, %d reps\n", info.name, info.sm_count,
           info.cc_major, info.cc_minor, copy_bw * 1e-9, reps);
    const struct model models[] = {{"llama-3.1-8b", 32, 8, 128},
                                   {"qwen3-32b", 64, 8, 128}};
    static const int ns[] = {512, 2048};
    for (int mi = 0; mi < (quick ? 1 : 2); mi++)
        for (int ni = 0; ni < (quick ? 1 : 2); ni++)
            run_config(&models[mi], ns[ni], reps, copy_bw);
    return 0;
#else
    (void)quick;
    (void)reps;
    printf("skipped: no CUDA device\n");
    return 0;
#endif
}
