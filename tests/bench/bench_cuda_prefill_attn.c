/* bench_cuda_prefill_attn.c — prefill-chunk attention on tensor cores
 * (kernels/cuda/prefill_attn.h) on ragged vs monolithic history, against
 * a cuBLASLt bf16 GEMM ceiling measured in the same run.
 *
 * Shapes: Llama-3.1-8B (Hq 32, Hkv 8, d 128) and Qwen3-32B (Hq 64, Hkv 8,
 * d 128), H_p heads per group (default 2, so 4 groups), P = 16; chunk n in
 * {512, 2048}; history H in {0, 8K, 32K} tokens. Skewed ragged profile:
 * group g keeps ceil(H / 4^g) tokens (H, H/4, H/16, H/64 for 4 groups:
 * some groups long, some short), page ids shuffled over the pool. The
 * monolithic variant pads every group to the longest row (H tokens), what
 * a uniform paged layout would attend over.
 *
 * Reported per configuration and variant: time per call, achieved TFLOP/s
 * counting 4 * n * (hist + n/2) * d * Hq flops (QK^T and PV, 2 flops per
 * multiply-add; hist = the mean history over KV heads of that variant,
 * n/2 = the causal half of the chunk), that rate as a fraction of the
 * measured cuBLASLt bf16 GEMM rate (8192^3, 2*M*N*K flops), and the
 * ragged / monolithic time ratio.
 *
 * Usage: bench-cuda-prefill-attn [--quick] [--bench] [--reps N]
 *        [--heads-per-group N]
 * --quick runs one tiny shape (and a 1024^3 GEMM) and exits. Without a
 * CUDA build or device it prints "skipped: no CUDA device" and exits 77 (skipped). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "common/base/tg_err.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/prefill_attn.h"
#endif

#define PROG "bench"

#ifdef TANGRAM_CUDA
#define CK(expr) TT_CUDA_CK(PROG, expr)

static struct tt_xrng rng = {0x2545f4914f6cdd1dull};

struct model {
    const char *name;
    int hq, hkv, d;
};

/* The cuBLASLt bf16 GEMM rate for an s x s x s product, in flop/s. */
static double gemm_ceiling(int s, int reps)
{
    char err[256];
    struct tg_cuda_gemm *g = NULL;
    if (tg_cuda_gemm_new(0, &g, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench: gemm: %s\n", err);
        exit(1);
    }
    const size_t bytes = (size_t)s * s * 2;
    void *x = NULL, *w = NULL, *y = NULL;
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&w, bytes));
    CK(cudaMalloc(&y, bytes));
    /* 0x3c3c as bf16 is ~0.0115: finite, harmless values. */
    CK(cudaMemset(x, 0x3c, bytes));
    CK(cudaMemset(w, 0x3c, bytes));
    struct tt_cuda_timer t;
    tt_cuda_timer_init(&t, PROG);
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up, plan cache */
        if (r == 0)
            tt_cuda_timer_start(&t, NULL);
        if (tg_cuda_gemm_bf16(g, x, w, NULL, s, s, s, y, TG_CUDA_GEMM_BF16,
                              NULL) != 0) {
            fprintf(stderr, "bench: gemm %d^3 failed\n", s);
            exit(1);
        }
    }
    const double ms = tt_cuda_timer_ms(&t, NULL);
    tt_cuda_timer_free(&t);
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(y));
    tg_cuda_gemm_free(g);
    return 2.0 * (double)s * s * s * reps / (ms * 1e-3);
}

/* Device CSR of one variant (ragged or monolithic). */
struct hist_view {
    int32_t *d_indptr, *d_indices, *d_lens;
    double mean_len; /* mean history tokens over KV heads */
};

static void view_init(struct hist_view *v, const int32_t *lens, int ng,
                      int hp, int P, int64_t pool_pages)
{
    int32_t *indptr = tt_bench_malloc(PROG, (size_t)ng * sizeof(int32_t));
    int64_t need = 0;
    for (int g = 0; g < ng; g++) {
        indptr[g] = (int32_t)need;
        need += (lens[g] + P - 1) / P;
    }
    /* Distinct page ids, shuffled over the pool. */
    int32_t *perm = tt_bench_malloc(PROG, (size_t)pool_pages * sizeof(int32_t));
    tt_xrng_perm(&rng, perm, pool_pages);
    const size_t n_idx = need > 0 ? (size_t)need : 1;
    v->d_indptr =
        tt_cuda_bench_upload(PROG, indptr, (size_t)ng * sizeof(int32_t));
    v->d_indices = tt_cuda_bench_upload(PROG, perm, n_idx * sizeof(int32_t));
    v->d_lens = tt_cuda_bench_upload(PROG, lens, (size_t)ng * sizeof(int32_t));
    double sum = 0.0;
    for (int g = 0; g < ng; g++)
        sum += (double)lens[g] * hp;
    v->mean_len = sum / ((double)ng * hp);
    free(indptr);
    free(perm);
}

static void view_free(struct hist_view *v)
{
    CK(cudaFree(v->d_indptr));
    CK(cudaFree(v->d_indices));
    CK(cudaFree(v->d_lens));
}

/* One (model, chunk, history) configuration: ragged and monolithic. */
static void run_config(const struct model *m, int hp, int n, int hist,
                       int reps, double gemm_flops)
{
    const int Hq = m->hq, Hkv = m->hkv, d = m->d, NG = Hkv / hp, P = 16;
    char err[256];
    int32_t *lens_r = tt_bench_malloc(PROG, (size_t)NG * sizeof(int32_t));
    int32_t *lens_m = tt_bench_malloc(PROG, (size_t)NG * sizeof(int32_t));
    int64_t div = 1;
    for (int g = 0; g < NG; g++, div *= 4) {
        lens_r[g] = (int32_t)((hist + div - 1) / div);
        lens_m[g] = hist;
    }
    const int64_t pool_pages = (int64_t)NG * ((hist + P - 1) / P) + 1;
    const size_t page_bytes = (size_t)hp * 2 * P * d * 2;
    void *d_pool = tt_cuda_bench_alloc(PROG, (size_t)pool_pages * page_bytes);
    CK(cudaMemset(d_pool, 0x3c, (size_t)pool_pages * page_bytes));
    void *d_q = tt_cuda_bench_alloc(PROG, (size_t)n * Hq * d * 2);
    CK(cudaMemset(d_q, 0x3c, (size_t)n * Hq * d * 2));
    void *d_k = tt_cuda_bench_alloc(PROG, (size_t)n * Hkv * d * 2);
    CK(cudaMemset(d_k, 0x3c, (size_t)n * Hkv * d * 2));
    void *d_v = tt_cuda_bench_alloc(PROG, (size_t)n * Hkv * d * 2);
    CK(cudaMemset(d_v, 0x3c, (size_t)n * Hkv * d * 2));
    void *d_out = tt_cuda_bench_alloc(PROG, (size_t)n * Hq * d * 2);
    int32_t *hg = tt_bench_malloc(PROG, (size_t)Hkv * sizeof(int32_t));
    int32_t *hs = tt_bench_malloc(PROG, (size_t)Hkv * sizeof(int32_t));
    for (int h = 0; h < Hkv; h++) {
        hg[h] = h / hp;
        hs[h] = h % hp;
    }
    int32_t *d_hg =
        tt_cuda_bench_upload(PROG, hg, (size_t)Hkv * sizeof(int32_t));
    int32_t *d_hs =
        tt_cuda_bench_upload(PROG, hs, (size_t)Hkv * sizeof(int32_t));

    struct hist_view views[2];
    view_init(&views[0], lens_r, NG, hp, P, pool_pages);
    view_init(&views[1], lens_m, NG, hp, P, pool_pages);
    static const char *names[2] = {"ragged", "monolithic"};
    struct tt_cuda_timer tm;
    tt_cuda_timer_init(&tm, PROG);
    double t_us[2], tflops[2];
    for (int vi = 0; vi < 2; vi++) {
        struct tg_cuda_prefill_attn_args a = {
            .q = d_q, .k = d_k, .v = d_v, .n = n, .n_q_heads = Hq,
            .n_kv_heads = Hkv, .head_dim = d, .pool = d_pool,
            .heads_per_group = hp, .page_size = P, .n_groups = NG,
            .head_group = d_hg, .head_slot = d_hs,
            .indptr = views[vi].d_indptr, .indices = views[vi].d_indices,
            .lens = views[vi].d_lens, .scale = 1.0f / sqrtf((float)d),
            .out = d_out, .stream = NULL};
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            if (r == 0)
                tt_cuda_timer_start(&tm, NULL);
            if (tg_cuda_prefill_attn(&a, err, sizeof(err)) != 0) {
                fprintf(stderr, "bench: prefill_attn: %s\n", err);
                exit(1);
            }
        }
        t_us[vi] = tt_cuda_timer_ms(&tm, NULL) * 1e3 / reps;
        const double flops = 4.0 * n * (views[vi].mean_len + n / 2.0) * d * Hq;
        tflops[vi] = flops / (t_us[vi] * 1e-6);
    }
    for (int vi = 0; vi < 2; vi++)
        printf("%-13s chunk %5d hist %6d (mean %8.1f)  %-10s %10.1f us  "
               "%7.1f TFLOP/s  %5.1f%% of GEMM\n", m->name, n, hist,
               views[vi].mean_len, names[vi], t_us[vi], tflops[vi] * 1e-12,
               100.0 * tflops[vi] / gemm_flops);
    printf("%-13s chunk %5d hist %6d  ragged / monolithic time: %.3f\n",
           m->name, n, hist, t_us[0] / t_us[1]);
    fflush(stdout);

    tt_cuda_timer_free(&tm);
    view_free(&views[0]);
    view_free(&views[1]);
    CK(cudaFree(d_pool));
    CK(cudaFree(d_q));
    CK(cudaFree(d_k));
    CK(cudaFree(d_v));
    CK(cudaFree(d_out));
    CK(cudaFree(d_hg));
    CK(cudaFree(d_hs));
    free(hg);
    free(hs);
    free(lens_r);
    free(lens_m);
}
#endif

int main(int argc, char **argv)
{
    int quick = 0, hp = 2, reps = 10;
    const struct tt_bench_opt opts[] = {
        {"--heads-per-group", 1, 8, &hp},
        {"--reps", 1, 1000, &reps},
    };
    if (tt_bench_args(PROG, argc, argv, &quick, opts, TT_COUNT(opts),
                      "[--quick] [--bench] [--reps N] "
                      "[--heads-per-group N]") != 0)
        return 2;
    if (8 % hp != 0) {
        fprintf(stderr, "bench: --heads-per-group must divide 8\n");
        return 2;
    }
#ifdef TANGRAM_CUDA
    struct tg_cuda_device_info info;
    if (!tt_cuda_bench_device(PROG, &info))
        return 77; /* ctest: skipped */
    if (quick)
        reps = 2;
    const int gemm_s = quick ? 1024 : 8192;
    const double gemm_flops = gemm_ceiling(gemm_s, quick ? 2 : 10);
    printf("device: %s, %d SMs, sm_%d%d; cuBLASLt bf16 GEMM %d^3: %.1f "
           "TFLOP/s; P 16, %d reps\n", info.name, info.sm_count,
           info.cc_major, info.cc_minor, gemm_s, gemm_flops * 1e-12, reps);
    if (quick) {
        const struct model tiny = {"tiny", 8, 2, 64};
        run_config(&tiny, 1, 64, 256, reps, gemm_flops);
        return 0;
    }
    printf("H_p %d: group g keeps ceil(hist / 4^g) tokens (ragged) or hist "
           "(monolithic)\n", hp);
    const struct model models[] = {{"llama-3.1-8b", 32, 8, 128},
                                   {"qwen3-32b", 64, 8, 128}};
    static const int chunks[] = {512, 2048}, hists[] = {0, 8192, 32768};
    for (int mi = 0; mi < 2; mi++)
        for (int ci = 0; ci < 2; ci++)
            for (int hi = 0; hi < 3; hi++)
                run_config(&models[mi], hp, chunks[ci], hists[hi], reps,
                           gemm_flops);
    return 0;
#else
    (void)quick;
    return tt_cuda_skip("built without CUDA");
#endif
}
