/* bench_cuda_gemm.c — TFLOP/s of the bf16 GEMM wrapper (kernels/cuda/gemm.h)
 * against the measured cuBLASLt ceiling on the same shapes in the same run.
 *
 * Shapes are the Llama-3.1-8B projections (hidden 4096, 32 query / 8 KV
 * heads of 128, intermediate 14336, vocabulary 128256): fused QKV
 * (6144 x 4096), o_proj (4096 x 4096), fused gate/up (28672 x 4096), down
 * (4096 x 14336) in bf16 out, the LM head (128256 x 4096) in fp32 out,
 * for m = 1 .. 4096 tokens.
 *
 * The ceiling is a plain cublasLtMatmul on prebuilt descriptors, timed for
 * each of up to 8 algorithms cuBLASLt's heuristic offers, best one kept:
 * what the library can do on this device for this shape. Our number is the
 * wrapper as the worker calls it (cache lookup, first heuristic answer).
 * "frac" is ours / ceiling.
 *
 * Usage: bench-cuda-gemm [--quick] [--bench]. --quick (what ctest runs)
 * times two shapes at two sizes briefly. Without CUDA or a device it prints
 * "skipped: ..." and exits 77 (skipped). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "common/model/st_safetensors.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemm.h"

#define PROG "bench-cuda-gemm"
#define CK(expr) TT_CUDA_CK(PROG, expr)
#define CKB(expr)                                                          \
    do {                                                                   \
        cublasStatus_t ck__ = (expr);                                      \
        if (ck__ != CUBLAS_STATUS_SUCCESS) {                               \
            fprintf(stderr, PROG ": %s: %s\n", #expr,                      \
                    cublasLtGetStatusString(ck__));                        \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

#define MAX_ALGOS 8

struct shape {
    const char *name;
    int n, k;
    int f32; /* fp32 output (LM head logits) */
};

static const struct shape shapes[] = {
    {"qkv", 6144, 4096, 0},     {"o_proj", 4096, 4096, 0},
    {"gate_up", 28672, 4096, 0}, {"down", 4096, 14336, 0},
    {"lm_head", 128256, 4096, 1},
};
static const int ms_full[] = {1, 16, 64, 256, 1024, 4096};
static const int ms_quick[] = {1, 256};

/* Fills `count` bf16 values at device address d with uniform [-1, 1)
 * values (tiling one random host block), so clocks see realistic data. */
static void fill_random(void *d, size_t count)
{
    const size_t blk = (size_t)1 << 22;
    static uint16_t *host;
    if (host == NULL) {
        host = tt_bench_malloc(PROG, blk * sizeof(uint16_t));
        struct tt_xrng r = {0x9e3779b97f4a7c15ull};
        for (size_t i = 0; i < blk; i++)
            host[i] = st_f32_to_bf16(tt_xrng_sym(&r));
    }
    for (size_t off = 0; off < count; off += blk) {
        size_t c = count - off < blk ? count - off : blk;
        CK(cudaMemcpy((char *)d + off * 2, host, c * 2,
                      cudaMemcpyHostToDevice));
    }
}

/* Average milliseconds of `iters` wrapper calls (after a warm-up that
 * also builds the cached plan). */
static double time_ours(struct tg_cuda_gemm *g, const void *x, const void *w,
                        void *y, int m, const struct shape *s, int iters,
                        struct tt_cuda_timer *t)
{
    enum tg_cuda_gemm_dtype dt = s->f32 ? TG_CUDA_GEMM_F32 : TG_CUDA_GEMM_BF16;
    for (int i = 0; i < 2; i++)
        if (tg_cuda_gemm_bf16(g, x, w, NULL, m, s->n, s->k, y, dt, NULL) != 0) {
            fprintf(stderr, PROG ": wrapper failed on %s m %d\n", s->name,
                    m);
            exit(1);
        }
    tt_cuda_timer_start(t, NULL);
    for (int i = 0; i < iters; i++)
        (void)tg_cuda_gemm_bf16(g, x, w, NULL, m, s->n, s->k, y, dt, NULL);
    return tt_cuda_timer_ms(t, NULL) / iters;
}

/* Best average milliseconds over the heuristic's algorithms for the same
 * TN problem with plain cublasLtMatmul calls; *n_algos gets how many. */
static double time_ceiling(cublasLtHandle_t lt, void *ws, size_t ws_bytes,
                           const void *x, const void *w, void *y, int m,
                           const struct shape *s, int iters,
                           struct tt_cuda_timer *t, int *n_algos)
{
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    CKB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                       sizeof(ta)));
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                       sizeof(tb)));
    CKB(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, (uint64_t)s->k,
                                   (uint64_t)s->n, s->k));
    CKB(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, (uint64_t)s->k,
                                   (uint64_t)m, s->k));
    CKB(cublasLtMatrixLayoutCreate(&d, s->f32 ? CUDA_R_32F : CUDA_R_16BF,
                                   (uint64_t)s->n, (uint64_t)m, s->n));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = ws_bytes;
    CKB(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int got = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, d, d, pref, MAX_ALGOS,
                                       res, &got));
    const float alpha = 1.0f, beta = 0.0f;
    double best = INFINITY;
    int tried = 0;
    for (int i = 0; i < got; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS)
            continue;
        const cublasLtMatmulAlgo_t *al = &res[i].algo;
        int ok = 1;
        for (int r = 0; r < 2 && ok; r++)
            ok = cublasLtMatmul(lt, op, &alpha, w, a, x, b, &beta, y, d, y, d,
                                al, ws, ws_bytes, NULL) ==
                 CUBLAS_STATUS_SUCCESS;
        if (!ok)
            continue;
        tried++;
        tt_cuda_timer_start(t, NULL);
        for (int r = 0; r < iters; r++)
            (void)cublasLtMatmul(lt, op, &alpha, w, a, x, b, &beta, y, d, y,
                                 d, al, ws, ws_bytes, NULL);
        double ms = tt_cuda_timer_ms(t, NULL);
        if (ms / iters < best)
            best = ms / iters;
    }
    CK(cudaGetLastError());
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
    *n_algos = tried;
    return best;
}

static int run(int quick)
{
    if (!tt_cuda_have_device("skipped: no CUDA device"))
        return 77; /* ctest: skipped */
    struct tg_cuda_device_info info;
    if (tg_cuda_device_query(0, &info) != 0) {
        fprintf(stderr, PROG ": cannot query device 0\n");
        return 1;
    }
    printf("device: %s (sm_%d%d, %d SMs)%s\n", info.name, info.cc_major,
           info.cc_minor, info.sm_count, quick ? "  [quick]" : "");
    char err[256];
    struct tg_cuda_gemm *g = NULL;
    if (tg_cuda_gemm_new(0, &g, err, sizeof(err)) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    void *ws = NULL;
    CK(cudaMalloc(&ws, TG_CUDA_GEMM_WORKSPACE_DEFAULT));
    struct tt_cuda_timer t;
    tt_cuda_timer_init(&t, PROG);

    const int *ms = quick ? ms_quick : ms_full;
    int n_ms = quick ? 2 : (int)(sizeof(ms_full) / sizeof(ms_full[0]));
    int n_shapes = quick ? 2 : (int)(sizeof(shapes) / sizeof(shapes[0]));
    static const int quick_pick[] = {0, 3}; /* qkv, down */
    double log_sum = 0.0;
    int count = 0;
    printf("%-8s %5s %6s %6s %9s %9s %7s  %s\n", "shape", "m", "n", "k",
           "ours", "ceiling", "frac", "(TFLOP/s; ceiling = best of cuBLASLt "
           "heuristic algos)");
    for (int si = 0; si < n_shapes; si++) {
        const struct shape *s = &shapes[quick ? quick_pick[si] : si];
        int m_max = ms[n_ms - 1];
        size_t ysz = s->f32 ? 4 : 2;
        void *x = NULL, *w = NULL, *y = NULL;
        CK(cudaMalloc(&x, (size_t)m_max * s->k * 2));
        CK(cudaMalloc(&w, (size_t)s->n * s->k * 2));
        CK(cudaMalloc(&y, (size_t)m_max * s->n * ysz));
        fill_random(x, (size_t)m_max * s->k);
        fill_random(w, (size_t)s->n * s->k);
        for (int mi = 0; mi < n_ms; mi++) {
            int m = ms[mi];
            double flop = 2.0 * m * (double)s->n * s->k;
            /* Size the loop to ~25 ms from one timed call (3 in quick). */
            double t1 = time_ours(g, x, w, y, m, s, 1, &t);
            int iters = 3;
            if (!quick) {
                double want = 25.0 / (t1 > 1e-4 ? t1 : 1e-4);
                iters = want < 5 ? 5 : want > 500 ? 500 : (int)want;
            }
            double t_ours = time_ours(g, x, w, y, m, s, iters, &t);
            int n_algos = 0;
            double t_ceil = time_ceiling(lt, ws, TG_CUDA_GEMM_WORKSPACE_DEFAULT,
                                         x, w, y, m, s, iters, &t, &n_algos);
            double tf_ours = flop / (t_ours * 1e-3) / 1e12;
            double tf_ceil = n_algos > 0 ? flop / (t_ceil * 1e-3) / 1e12 : 0.0;
            /* The wrapper's algorithm is one of the candidates, so the
             * ceiling can only be beaten by timing noise. */
            double frac = tf_ceil > 0.0 ? tf_ours / tf_ceil : 0.0;
            printf("%-8s %5d %6d %6d %9.1f %9.1f %7.3f  %s%s\n", s->name, m,
                   s->n, s->k, tf_ours, tf_ceil, frac,
                   s->f32 ? "fp32 out" : "bf16 out",
                   n_algos > 0 ? "" : " (no ceiling algo)");
            if (frac > 0.0) {
                log_sum += log(frac);
                count++;
            }
        }
        CK(cudaFree(x));
        CK(cudaFree(w));
        CK(cudaFree(y));
    }
    if (count > 0)
        printf("geometric mean frac of ceiling: %.3f over %d shapes\n",
               exp(log_sum / count), count);
    tt_cuda_timer_free(&t);
    CK(cudaFree(ws));
    CKB(cublasLtDestroy(lt));
    tg_cuda_gemm_free(g);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--bench") == 0) {
            /* the default: full benchmark */
        } else if (strcmp(argv[i], "--help") == 0 ||
                   strcmp(argv[i], "-h") == 0) {
            printf("usage: bench-cuda-gemm [--quick] [--bench]\n");
            return 0;
        } else {
            fprintf(stderr, "bench-cuda-gemm: unknown argument '%s'\n",
                    argv[i]);
            return 2;
        }
    }
#ifdef TANGRAM_CUDA
    return run(quick);
#else
    (void)quick;
    return tt_cuda_skip("built without CUDA");
#endif
}
