/* bench_cuda_compress.c — time of the device chunk compression per layer
 * (kernels/cuda/compress.h): snapkv scoring, top-k selection and KV append
 * of one prefill chunk with Llama-3-8B heads (Hq 32, Hkv 8, d 128, H_p 4,
 * P 16, w 32, 4 sinks, budget 0.25), each step alone and fused, next to
 * the CPU reference ops on the same data.
 *
 * Reported against the device's ceilings: scoring as TFLOP/s of the
 * required multiply-adds (one pass of G*sum_i(i+1)*d per KV head, causal
 * keys of the W window queries; the kernels do this twice) over the fp32
 * FMA peak (SMs x 128 lanes x 2 x clock); the append as GB/s (K and V rows
 * read and written) over the measured device-to-device copy bandwidth.
 *
 * Usage: bench-cuda-compress [--quick] [--chunk N] [--iters N]
 * Without CUDA or a device it prints "skipped: no CUDA device", exits 77 (skipped). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tg_ops.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/compress.h"
#include "kernels/cuda/cuda_device.h"
#endif

#ifdef TANGRAM_CUDA
enum { HQ = 32, HKV = 8, D = 128, HP = 4, PAGE = 16, WIN = 32, SINKS = 4 };

#define PROG "bench-cuda-compress"
#define CK(expr) TT_CUDA_CK(PROG, expr)

static struct tt_xrng rng = {0x2545f4914f6cdd1dull};

#define OK(expr)                                                          \
    do {                                                                  \
        int ok__ = (expr);                                                \
        if (ok__ != 0) {                                                  \
            fprintf(stderr, PROG ": %s failed (%d)\n", #expr, ok__);     \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

struct bench_ctx {
    struct tg_cuda_compress_chunk c;
    struct tg_cuda_compress_dst dst;
    int32_t keep[HKV];
    float *scores;
    int32_t *idx;
    void *ws;
    size_t ws_bytes;
};

enum step { STEP_SCORE, STEP_SELECT, STEP_APPEND, STEP_FUSED };

static void run_step(struct bench_ctx *x, enum step s)
{
    switch (s) {
    case STEP_SCORE:
        OK(tg_cuda_compress_score_snapkv(&x->c, x->scores, x->ws, x->ws_bytes,
                                         NULL));
        break;
    case STEP_SELECT:
        OK(tg_cuda_compress_select_topk(x->scores, x->c.n, HKV, x->keep,
                                        x->c.start, x->c.window, x->c.n_sink,
                                        x->idx, NULL));
        break;
    case STEP_APPEND:
        OK(tg_cuda_compress_kv_append(&x->dst, x->c.k, x->c.v, x->c.n, x->idx,
                                      x->keep, NULL));
        break;
    case STEP_FUSED:
        OK(tg_cuda_compress_chunk_compress(&x->c, x->keep, &x->dst, x->scores,
                                           x->idx, x->ws, x->ws_bytes, NULL));
        break;
    }
}

/* Mean seconds of one step over `iters` launches after a warm-up. */
static double time_step(struct bench_ctx *x, enum step s, int iters)
{
    run_step(x, s);
    CK(cudaDeviceSynchronize());
    struct tt_cuda_timer t;
    tt_cuda_timer_init(&t, PROG);
    tt_cuda_timer_start(&t, NULL);
    for (int i = 0; i < iters; i++)
        run_step(x, s);
    double ms = tt_cuda_timer_ms(&t, NULL);
    tt_cuda_timer_free(&t);
    return ms * 1e-3 / iters;
}

static int run(int n, int iters, int quick)
{
    struct tg_cuda_device_info info;
    OK(tg_cuda_device_query(0, &info));
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const double fp32_peak = (double)info.sm_count * 128.0 * 2.0 * clock_khz * 1e3;
    /* Device-to-device copy of a 512 MiB buffer: the ceiling of a
     * memory-bound kernel. */
    const double copy_bw =
        tt_cuda_copy_bandwidth(PROG, (size_t)512 << 20, quick ? 3 : 20);

    const size_t nq = (size_t)n * HQ * D, nk = (size_t)n * HKV * D;
    uint16_t *qb = tt_bench_malloc(PROG, nq * 2);
    uint16_t *kb = tt_bench_malloc(PROG, nk * 2);
    uint16_t *vb = tt_bench_malloc(PROG, nk * 2);
    float *qf = tt_bench_malloc(PROG, nq * 4);
    float *kf = tt_bench_malloc(PROG, nk * 4);
    float *vf = tt_bench_malloc(PROG, nk * 4);
    tt_fill_bf16(&rng, qb, qf, nq, -2.0f, 2.0f);
    for (size_t i = 0; i < nk; i++) { /* K and V interleaved */
        tt_fill_bf16(&rng, kb + i, kf + i, 1, -1.0f, 1.0f);
        tt_fill_bf16(&rng, vb + i, vf + i, 1, -1.0f, 1.0f);
    }

    /* keep = min(n, max(ceil(0.25 n), forced)), DESIGN §4.3; a history of
     * 4096 tokens per group before this chunk. */
    const int W = WIN < n ? WIN : n;
    const int hist = 4096;
    int forced = 0;
    for (int i = 0; i < n; i++)
        forced += i >= n - W || hist + i < SINKS;
    int kk = (int)ceil(0.25 * n);
    kk = kk > forced ? kk : forced;
    kk = kk < n ? kk : n;
    const int n_groups = HKV / HP;
    const int pages_per_group = (hist + kk + PAGE - 1) / PAGE;
    int32_t head_group[HKV], head_slot[HKV], lens[HKV / HP],
        npages[HKV / HP], indptr[HKV / HP + 1];
    for (int h = 0; h < HKV; h++) {
        head_group[h] = h / HP;
        head_slot[h] = h % HP;
    }
    int32_t *ids = tt_bench_malloc(
        PROG, (size_t)n_groups * pages_per_group * sizeof(int32_t));
    for (int g = 0; g < n_groups; g++) {
        lens[g] = hist;
        npages[g] = pages_per_group;
        indptr[g] = g * pages_per_group;
        for (int p = 0; p < pages_per_group; p++) /* interleaved groups */
            ids[g * pages_per_group + p] = p * n_groups + g;
    }
    indptr[n_groups] = n_groups * pages_per_group;
    const int64_t n_pages = (int64_t)n_groups * pages_per_group;
    const size_t pool_elems = (size_t)n_pages * HP * 2 * PAGE * D;

    struct bench_ctx x;
    memset(&x, 0, sizeof(x));
    uint16_t *dq = tt_cuda_bench_upload(PROG, qb, nq * 2);
    uint16_t *dk = tt_cuda_bench_upload(PROG, kb, nk * 2);
    uint16_t *dv = tt_cuda_bench_upload(PROG, vb, nk * 2);
    int32_t *dtab = tt_cuda_bench_alloc(
        PROG, (size_t)(3 * n_groups + 2 + indptr[n_groups]) * sizeof(int32_t));
    int32_t *d_indptr = dtab, *d_npages = dtab + n_groups + 1,
            *d_lens = d_npages + n_groups, *d_fault = d_lens + n_groups,
            *d_ids = d_fault + 1;
    CK(cudaMemcpy(d_indptr, indptr, sizeof(indptr), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_npages, npages, sizeof(npages), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_lens, lens, sizeof(lens), cudaMemcpyHostToDevice));
    CK(cudaMemset(d_fault, 0, sizeof(int32_t)));
    CK(cudaMemcpy(d_ids, ids, (size_t)indptr[n_groups] * sizeof(int32_t),
                  cudaMemcpyHostToDevice));
    uint16_t *dpool = tt_cuda_bench_alloc(PROG, pool_elems * 2);
    CK(cudaMemset(dpool, 0, pool_elems * 2));

    x.c = (struct tg_cuda_compress_chunk){
        .q = dq, .k = dk, .v = dv, .n = n, .n_q_heads = HQ,
        .n_kv_heads = HKV, .head_dim = D, .start = hist, .window = WIN,
        .n_sink = SINKS, .scale = 1.0f / sqrtf((float)D),
    };
    x.dst = (struct tg_cuda_compress_dst){
        .pool = dpool, .n_pages = n_pages, .heads_per_group = HP,
        .page_size = PAGE, .head_dim = D, .n_kv_heads = HKV,
        .n_groups = n_groups, .head_group = head_group,
        .head_slot = head_slot, .indptr = d_indptr, .indices = d_ids,
        .npages = d_npages, .lens = d_lens, .fault = d_fault,
    };
    for (int h = 0; h < HKV; h++)
        x.keep[h] = kk;
    x.scores = tt_cuda_bench_alloc(PROG, (size_t)HKV * n * sizeof(float));
    x.idx = tt_cuda_bench_alloc(PROG, (size_t)HKV * n * sizeof(int32_t));
    x.ws_bytes = tg_cuda_compress_workspace_bytes(n, HQ, HKV, WIN);
    x.ws = tt_cuda_bench_alloc(PROG, x.ws_bytes);

    double t_score = time_step(&x, STEP_SCORE, iters);
    double t_select = time_step(&x, STEP_SELECT, iters);
    double t_append = time_step(&x, STEP_APPEND, iters);
    double t_fused = time_step(&x, STEP_FUSED, iters);
    int32_t fault = 0;
    CK(cudaMemcpy(&fault, d_fault, sizeof(fault), cudaMemcpyDeviceToHost));
    if (fault != 0) {
        fprintf(stderr, PROG ": append reported a fault\n");
        return 1;
    }

    /* The CPU reference on the same data, once (it is slow). */
    struct tg_backend *cpu = NULL;
    OK(tg_backend_cpu_new(0, &cpu));
    float *rs = tt_bench_malloc(PROG, (size_t)HKV * n * sizeof(float));
    int32_t *ri = tt_bench_malloc(PROG, (size_t)HKV * n * sizeof(int32_t));
    float *cpool = tt_bench_malloc(PROG, pool_elems * sizeof(float));
    memset(cpool, 0, pool_elems * sizeof(float));
    const int32_t *gp[HKV / HP];
    for (int g = 0; g < n_groups; g++)
        gp[g] = ids + indptr[g];
    struct tg_kv_rows rows = {
        .pool = cpool, .heads_per_group = HP, .page_size = PAGE,
        .head_dim = D, .n_kv_heads = HKV, .head_group = head_group,
        .head_slot = head_slot, .group_pages = gp, .group_len = lens,
    };
    double c0 = tt_now_s();
    OK(tg_ops_cpu.score(cpu, TG_SCORE_SNAPKV, qf, kf, vf, n, HQ, HKV, D, WIN,
                        x.c.scale, rs));
    OK(tg_ops_cpu.select_topk(cpu, rs, n, HKV, x.keep, hist, WIN, SINKS, ri));
    OK(tg_ops_cpu.kv_append(cpu, &rows, kf, vf, n, ri, x.keep));
    double t_cpu = tt_now_s() - c0;
    tg_backend_cpu_free(cpu);

    double macs = 0.0; /* one pass: G * sum over window rows of (i+1) * d */
    for (int i = n - W; i < n; i++)
        macs += (double)(i + 1);
    macs *= (double)HQ * D;
    double flops = 2.0 * macs;
    double app_bytes = 2.0 /* K,V */ * HKV * kk * D * 2.0 /* bf16 */ * 2.0;

    printf("device: %s (%d SMs, %.0f MHz), fp32 FMA peak %.1f TFLOP/s, "
           "copy bandwidth %.0f GB/s\n", info.name, info.sm_count,
           clock_khz / 1e3, fp32_peak / 1e12, copy_bw / 1e9);
    printf("chunk %d, Hq %d, Hkv %d, d %d, H_p %d, P %d, w %d, keep %d per "
           "head, %d iterations\n", n, HQ, HKV, D, HP, PAGE, WIN, kk, iters);
    printf("score   %8.1f us  %6.2f TFLOP/s (%.1f%% of fp32 peak; kernels do "
           "2x this work)\n", t_score * 1e6, flops / t_score / 1e12,
           100.0 * flops / t_score / fp32_peak);
    printf("select  %8.1f us  %6.1f Mkeys/s\n", t_select * 1e6,
           HKV * (double)n / t_select / 1e6);
    printf("append  %8.1f us  %6.1f GB/s (%.1f%% of copy bandwidth)\n",
           t_append * 1e6, app_bytes / t_append / 1e9,
           100.0 * app_bytes / t_append / copy_bw);
    printf("fused   %8.1f us per layer (score + select + append), %.2f ms "
           "per chunk over 32 layers\n", t_fused * 1e6, t_fused * 32e3);
    printf("cpu     %8.1f us per layer (reference ops); device speedup "
           "%.1fx\n", t_cpu * 1e6, t_cpu / t_fused);

    CK(cudaFree(dq));
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(dtab));
    CK(cudaFree(dpool));
    CK(cudaFree(x.scores));
    CK(cudaFree(x.idx));
    CK(cudaFree(x.ws));
    free(qb); free(kb); free(vb); free(qf); free(kf); free(vf);
    free(ids); free(rs); free(ri); free(cpool);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    int quick = 0, n = 512, iters = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc) {
            n = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench-cuda-compress [--quick] [--chunk N] "
                            "[--iters N]\n");
            return 2;
        }
    }
    if (n < 1 || n > 2048 || iters < 0) {
        fprintf(stderr, "bench-cuda-compress: --chunk must be 1..2048 and "
                        "--iters >= 0\n");
        return 2;
    }
    if (iters == 0)
        iters = quick ? 5 : 200;
#ifdef TANGRAM_CUDA
    if (!tt_cuda_have_device("skipped: no CUDA device"))
        return 77; /* ctest: skipped */
    return run(n, iters, quick);
#else
    (void)quick;
    return tt_cuda_skip("built without CUDA");
#endif
}
