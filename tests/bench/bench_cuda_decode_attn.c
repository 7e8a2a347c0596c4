/* bench_cuda_decode_attn.c — split-map decode attention on a skewed
 * profile (DESIGN.md §4.6): the profile's split map (TANGRAM
 * Algorithm 1 via pf_split_layer) vs a FlashDecoding-style uniform split
 * (tg_cuda_decode_uniform_splits) vs no split, on the same kernel.
 *
 * Shapes: Llama-3.1-8B (32 layers x 8 KV heads, d 128, G 4) and Qwen3-32B
 * (64 x 8, d 128, G 8), H_p heads per group (default 2), P = 16. Profile:
 * per layer budgets u^3 (u uniform) scaled to mean 0.25 and clamped to
 * [1/1024, 1], heads clustered by budget (sorted ascending, H_p per
 * group), group budget = max of its heads. Every sequence holds ctx tokens
 * of history; group g keeps ceil(b_g * ctx) of them. Batch 1..64, context
 * 8K..128K. A run times `nl` distinct layers (default 8, page ids shuffled
 * over the pool); when their pages exceed half the free device memory,
 * page ids wrap around the pool (reported as "wrapped": reads then alias,
 * which is fine for timing but can flatter small working sets via L2).
 *
 * Reported per configuration and variant: time per layer-step (one layer's
 * decode attention for the whole batch, split + combine kernels), the K/V
 * bytes it reads over that time, and that bandwidth as a fraction of the
 * measured device-to-device cudaMemcpy bandwidth (read + write bytes per
 * second, the usual copy ceiling).
 *
 * Usage: bench-cuda-decode-attn [--quick] [--bench] [--heads-per-group N]
 *        [--layers N] [--reps N] [--target-pct N]
 * --target-pct sets the profile's mean budget in percent (default 25; 100
 * is full KV, every group holding ctx tokens: the shape
 * tests/bench/bench_peer_sdpa.py times torch's attention on).
 * Without a CUDA build or device it prints "skipped: no CUDA device" and
 * exits 77 (skipped). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "common/profile/pf_split.h"
#include "common/base/tg_err.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/decode_attn.h"
#endif

#define PROG "bench"

#ifdef TANGRAM_CUDA
#define CK(expr) TT_CUDA_CK(PROG, expr)

static struct tt_xrng rng = {0x2545f4914f6cdd1dull};

struct model {
    const char *name;
    int layers, kv_heads, g, d;
};

/* Skewed budgets of one layer: u^3 scaled so the clamped mean is `target`
 * (a few fixed-point rounds of rescaling after clamping); target 1 is full
 * KV (every budget 1). */
static void skewed_budgets(double *b, int H, double target)
{
    if (target >= 1.0) {
        for (int h = 0; h < H; h++)
            b[h] = 1.0;
        return;
    }
    for (int h = 0; h < H; h++) {
        double u = tt_xrng_unit(&rng);
        b[h] = u * u * u + 1e-6;
    }
    for (int it = 0; it < 50; it++) {
        double mean = 0.0;
        for (int h = 0; h < H; h++)
            mean += b[h];
        mean /= H;
        if (fabs(mean - target) < 1e-9)
            break;
        for (int h = 0; h < H; h++) {
            b[h] *= target / mean;
            b[h] = b[h] > 1.0 ? 1.0 : b[h] < 1.0 / 1024 ? 1.0 / 1024 : b[h];
        }
    }
}

static int cmp_budget_idx(const void *x, const void *y, void *ctx)
{
    const double *b = ctx;
    int i = *(const int *)x, j = *(const int *)y;
    if (b[i] != b[j])
        return b[i] < b[j] ? -1 : 1;
    return i - j;
}

struct variant {
    const char *name;
    struct tg_cuda_split_map map;
};

/* One (model, batch, ctx) configuration: all three variants. */
static void run_config(const struct model *m, int hp, int batch, int ctx,
                       int nl, int reps, double copy_bw, double target)
{
    const int H = m->kv_heads, NG = H / hp, G = m->g, d = m->d, P = 16;
    const int Hq = H * G;
    char err[256];
    int n_cta = 0;
    if (tg_cuda_decode_attn_n_cta(G, d, &n_cta) != 0) {
        fprintf(stderr, "bench: n_cta failed\n");
        exit(1);
    }
    /* Profile of the nl timed layers (layers of a full model differ; nl
     * samples of the same distribution stand in for them). */
    double *budget = malloc((size_t)nl * H * sizeof(double));
    int *groups = malloc((size_t)nl * H * sizeof(int));
    double *gb = malloc((size_t)nl * NG * sizeof(double));
    int *s_map = malloc((size_t)nl * NG * sizeof(int));
    int *s_uni = malloc((size_t)nl * NG * sizeof(int));
    int *s_one = malloc((size_t)nl * NG * sizeof(int));
    if (!budget || !groups || !gb || !s_map || !s_uni || !s_one) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    for (int l = 0; l < nl; l++) {
        double *b = budget + (size_t)l * H;
        int *gr = groups + (size_t)l * H;
        skewed_budgets(b, H, target);
        for (int h = 0; h < H; h++)
            gr[h] = h;
        qsort_r(gr, (size_t)H, sizeof(int), cmp_budget_idx, b);
        for (int g = 0; g < NG; g++) {
            double mx = 0.0;
            for (int k = 0; k < hp; k++)
                mx = b[gr[g * hp + k]] > mx ? b[gr[g * hp + k]] : mx;
            gb[l * NG + g] = mx;
        }
        if (pf_split_layer(b, H, gr, hp, n_cta, s_map + (size_t)l * NG, err,
                           sizeof(err)) != 0) {
            fprintf(stderr, "bench: split map: %s\n", err);
            exit(1);
        }
        int64_t longest = 1;
        for (int g = 0; g < NG; g++) {
            int64_t t = (int64_t)ceil(gb[l * NG + g] * ctx);
            longest = t > longest ? t : longest;
            s_one[l * NG + g] = 1;
        }
        tg_cuda_decode_uniform_splits(batch, NG, longest, P, n_cta,
                                      s_uni + (size_t)l * NG);
    }
    /* Table: rows (seq, layer, group), every seq at context ctx. */
    const int rows = batch * nl * NG;
    int32_t *lens = malloc((size_t)rows * sizeof(int32_t));
    int32_t *indptr = malloc((size_t)(rows + 1) * sizeof(int32_t));
    if (!lens || !indptr) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    indptr[0] = 0;
    double kv_bytes = 0.0; /* K/V bytes read per layer-step, all nl layers */
    for (int s = 0; s < batch; s++)
        for (int l = 0; l < nl; l++)
            for (int g = 0; g < NG; g++) {
                int r = (s * nl + l) * NG + g;
                int64_t t = (int64_t)ceil(gb[l * NG + g] * ctx);
                lens[r] = (int32_t)(t < 1 ? 1 : t);
                indptr[r + 1] = indptr[r] + (lens[r] + P - 1) / P;
                kv_bytes += (double)lens[r] * hp * 2 * d * 2;
            }
    const int64_t need_pages = indptr[rows];
    const size_t page_bytes = (size_t)hp * 2 * P * d * 2;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    int64_t pool_pages = need_pages;
    if ((double)pool_pages * page_bytes > 0.5 * (double)free_b)
        pool_pages = (int64_t)(0.5 * (double)free_b / (double)page_bytes);
    int wrapped = pool_pages < need_pages;
    int32_t *indices = malloc((size_t)need_pages * sizeof(int32_t));
    if (!indices) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < need_pages; i++)
        indices[i] = (int32_t)(i % pool_pages);
    tt_xrng_shuffle(&rng, indices, need_pages);
    int32_t *hg = malloc((size_t)H * sizeof(int32_t));
    int32_t *hs = malloc((size_t)H * sizeof(int32_t));
    for (int h = 0; h < H; h++) { /* one layout for every timed layer */
        hg[h] = h / hp;
        hs[h] = h % hp;
    }

    void *d_pool = tt_cuda_bench_alloc(PROG, (size_t)pool_pages * page_bytes);
    /* 0x3c3c as bf16 is ~0.0115: finite, harmless values. */
    CK(cudaMemset(d_pool, 0x3c, (size_t)pool_pages * page_bytes));
    void *d_q = tt_cuda_bench_alloc(PROG, (size_t)batch * Hq * d * 2);
    CK(cudaMemset(d_q, 0x3c, (size_t)batch * Hq * d * 2));
    void *d_out = tt_cuda_bench_alloc(PROG, (size_t)batch * Hq * d * 2);
    int32_t *d_indptr = tt_cuda_bench_upload(
        PROG, indptr, (size_t)(rows + 1) * sizeof(int32_t));
    int32_t *d_indices = tt_cuda_bench_upload(
        PROG, indices, (size_t)need_pages * sizeof(int32_t));
    int32_t *d_lens =
        tt_cuda_bench_upload(PROG, lens, (size_t)rows * sizeof(int32_t));
    int32_t *d_hg = tt_cuda_bench_upload(PROG, hg, (size_t)H * sizeof(int32_t));
    int32_t *d_hs = tt_cuda_bench_upload(PROG, hs, (size_t)H * sizeof(int32_t));

    struct variant vs[3] = {{"split-map", {0}}, {"uniform", {0}},
                            {"no-split", {0}}};
    const int *maps[3] = {s_map, s_uni, s_one};
    size_t ws_bytes = 0;
    for (int v = 0; v < 3; v++) {
        if (tg_cuda_split_map_init(&vs[v].map, maps[v], nl, NG, err,
                                   sizeof(err)) != 0) {
            fprintf(stderr, "bench: %s map: %s\n", vs[v].name, err);
            exit(1);
        }
        for (int l = 0; l < nl; l++) {
            size_t w = tg_cuda_decode_attn_ws_bytes(batch, Hq, d,
                                                    vs[v].map.max[l]);
            ws_bytes = w > ws_bytes ? w : ws_bytes;
        }
    }
    float *d_ws = NULL;
    if (ws_bytes > 0)
        CK(cudaMalloc((void **)&d_ws, ws_bytes));

    struct tt_cuda_timer tm;
    tt_cuda_timer_init(&tm, PROG);
    double t_us[3];
    int cta_sum[3];
    for (int v = 0; v < 3; v++) {
        struct tg_cuda_decode_attn_args a = {
            .q = d_q, .pool = d_pool, .n_seq = batch, .n_q_heads = Hq,
            .n_kv_heads = H, .n_groups = NG, .heads_per_group = hp,
            .page_size = P, .head_dim = d, .head_group = d_hg,
            .head_slot = d_hs,
            .table = {d_indptr, d_indices, d_lens, rows, nl * NG, 0},
            .splits = &vs[v].map, .layer = 0, .scale = 1.0f / sqrtf((float)d),
            .ws = d_ws, .ws_bytes = ws_bytes, .out = d_out,
            .out_dtype = TG_CUDA_DECODE_OUT_BF16, .stream = NULL};
        cta_sum[v] = 0;
        for (int l = 0; l < nl; l++)
            cta_sum[v] += vs[v].map.total[l];
        for (int rep = -1; rep < reps; rep++) { /* rep -1: warm-up */
            if (rep == 0)
                tt_cuda_timer_start(&tm, NULL);
            for (int l = 0; l < nl; l++) {
                a.layer = l;
                a.table.row_offset = l * NG;
                if (tg_cuda_decode_attn(&a, err, sizeof(err)) != 0) {
                    fprintf(stderr, "bench: decode_attn: %s\n", err);
                    exit(1);
                }
            }
        }
        t_us[v] = tt_cuda_timer_ms(&tm, NULL) * 1e3 / ((double)reps * nl);
    }
    const double bytes_layer = kv_bytes / nl;
    for (int v = 0; v < 3; v++) {
        double bw = bytes_layer / (t_us[v] * 1e-6);
        printf("%-14s batch %3d ctx %6d  %-9s  %9.1f us/layer  %7.1f GB/s  "
               "%5.1f%% of copy  CTAs/seq/layer %6.1f%s\n",
               m->name, batch, ctx, vs[v].name, t_us[v], bw * 1e-9,
               100.0 * bw / copy_bw, (double)cta_sum[v] / nl,
               wrapped ? "  wrapped" : "");
    }
    printf("%-14s batch %3d ctx %6d  split-map speedup: %.2fx vs uniform, "
           "%.2fx vs no-split\n", m->name, batch, ctx, t_us[1] / t_us[0],
           t_us[2] / t_us[0]);
    fflush(stdout);

    tt_cuda_timer_free(&tm);
    for (int v = 0; v < 3; v++)
        tg_cuda_split_map_free(&vs[v].map);
    CK(cudaFree(d_ws));
    CK(cudaFree(d_pool));
    CK(cudaFree(d_q));
    CK(cudaFree(d_out));
    CK(cudaFree(d_indptr));
    CK(cudaFree(d_indices));
    CK(cudaFree(d_lens));
    CK(cudaFree(d_hg));
    CK(cudaFree(d_hs));
    free(budget);
    free(groups);
    free(gb);
    free(s_map);
    free(s_uni);
    free(s_one);
    free(lens);
    free(indptr);
    free(indices);
    free(hg);
    free(hs);
}
#endif

int main(int argc, char **argv)
{
    int quick = 0, hp = 2, nl = 8, reps = 5, target_pct = 25;
    const struct tt_bench_opt opts[] = {
        {"--heads-per-group", 1, 8, &hp},
        {"--layers", 1, 64, &nl},
        {"--reps", 1, 1000, &reps},
        {"--target-pct", 1, 100, &target_pct},
    };
    if (tt_bench_args(PROG, argc, argv, &quick, opts, TT_COUNT(opts),
                      "[--quick] [--bench] [--heads-per-group N] "
                      "[--layers N] [--reps N] [--target-pct N]") != 0)
        return 2;
    double target = target_pct / 100.0;
    if (8 % hp != 0) {
        fprintf(stderr, "bench: --heads-per-group must divide 8\n");
        return 2;
    }
#ifdef TANGRAM_CUDA
    struct tg_cuda_device_info info;
    if (!tt_cuda_bench_device(PROG, &info))
        return 77; /* ctest: skipped */
    const struct model models[] = {{"llama-3.1-8b", 32, 8, 4, 128},
                                   {"qwen3-32b", 64, 8, 8, 128}};
    static const int batches[] = {1, 8, 32, 64}, ctxs[] = {8192, 32768, 131072};
    if (quick) {
        nl = 2;
        reps = 2;
    }
    double copy_bw = tt_cuda_copy_bandwidth(
        PROG, quick ? (size_t)64 << 20 : (size_t)1 << 30, 10);
    printf("device: %s, %d SMs, sm_%d%d; copy bandwidth %.1f GB/s "
           "(read + write); H_p %d, P 16, target %.2f%s, %d layers x %d "
           "reps\n", info.name, info.sm_count, info.cc_major, info.cc_minor,
           copy_bw * 1e-9, hp, target, target >= 1.0 ? " (full KV)" : "",
           nl, reps);
    for (int mi = 0; mi < (quick ? 1 : 2); mi++) {
        int n_cta = 0;
        if (tg_cuda_decode_attn_n_cta(models[mi].g, models[mi].d, &n_cta) == 0)
            printf("%s: N_CTA = %d\n", models[mi].name, n_cta);
        for (int ci = 0; ci < (quick ? 1 : 3); ci++)
            for (int bi = 0; bi < (quick ? 2 : 4); bi++)
                run_config(&models[mi], hp, batches[bi], ctxs[ci],
                           nl < models[mi].layers ? nl : models[mi].layers,
                           reps, copy_bw, target);
    }
    return 0;
#else
    (void)quick;
    (void)target;
    return tt_cuda_skip("built without CUDA");
#endif
}
