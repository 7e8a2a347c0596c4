/* bench_cuda_trig.c — the cost of one decode-time compression trigger
 * (DESIGN.md §4.9) on the device, next to the decode step it interrupts.
 *
 * Shape: Llama-3.1-8B (32 layers x 8 KV heads, G 4, d 128), H_p 2, P 16,
 * default caps (c = 2048 for every head, beta = 128, W_d = 32): at a
 * trigger every head of every layer of a sequence holds a 512-token
 * compressed prompt plus a decode region of c + beta = 2176 tokens, and
 * keeps 2048 of them. B sequences trigger in the same step (the worst
 * case: a batch admitted together decodes in lockstep).
 *
 * Timed, side by side in one run:
 *  - trigger: tg_cuda_trig_score + tg_cuda_trig_select +
 *    tg_cuda_trig_compact for all B x 32 x 8 heads (three launches);
 *  - attention: one decode step's attention over the same rows, all 32
 *    layers (tg_cuda_decode_attn, no splits);
 *  - floor: an 8B decode step cannot be faster than streaming its 16.06 GB
 *    of bf16 weights once at the measured copy bandwidth.
 * Printed: the trigger as a share of (floor + attention), the share of one
 * decode step in the step that triggers, and amortised over the beta
 * steps between triggers; and the compaction's bytes against the copy
 * bandwidth.
 *
 * Usage: bench-cuda-trig [--quick] [--bench] [--reps N]
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

#include "common/base/tg_err.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/decode_attn.h"
#include "kernels/cuda/trig.h"
#endif

#define PROG "bench"

#ifdef TANGRAM_CUDA
#define CK(expr) TT_CUDA_CK(PROG, expr)

enum { L = 32, HKV = 8, G = 4, D = 128, HP = 2, NG = HKV / HP, P = 16 };
enum { PROMPT = 512, CAP = 2048, BETA = 128, WINDOW = 32 };
#define WEIGHT_BYTES 16.06e9 /* Llama-3.1-8B in bf16 */

static struct tt_xrng rng = {0x3c6ef372fe94f82bull};

static void die_rc(int rc, const char *what, const char *err)
{
    if (rc != 0) {
        fprintf(stderr, "%s: %s: %s\n", PROG, what, err);
        exit(1);
    }
}

static void run_batch(int B, int reps, double copy_bw)
{
    const int len = PROMPT + CAP + BETA;          /* row length at a trigger */
    const int npg = (len + P - 1) / P;
    const int32_t n_rows = B * L * NG;            /* rows (s, l, g) */
    const int64_t n_pages = (int64_t)n_rows * npg;
    const size_t page_elems = (size_t)HP * 2 * P * D;
    const int n_items = B * L * HKV, region = CAP + BETA;

    int32_t *indptr = tt_bench_malloc(PROG, (size_t)(n_rows + 1) * 4);
    int32_t *indices = tt_bench_malloc(PROG, (size_t)n_pages * 4);
    int32_t *lens = tt_bench_malloc(PROG, (size_t)n_rows * 4);
    tt_xrng_perm(&rng, indices, n_pages);
    for (int32_t r = 0; r <= n_rows; r++)
        indptr[r] = r * npg;
    for (int32_t r = 0; r < n_rows; r++)
        lens[r] = len;
    struct tg_cuda_trig_item *it =
        tt_bench_malloc(PROG, (size_t)n_items * sizeof(*it));
    for (int s = 0, i = 0; s < B; s++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < HKV; h++, i++) {
                it[i].row = (s * L + l) * NG + h / HP;
                it[i].head = h;
                it[i].slot = h % HP;
                it[i].layer = l;
                it[i].first = PROMPT;
                it[i].n = region;
                it[i].off = i * region;
                it[i].n_keep = CAP;
                it[i].t = len;
            }
    const size_t ns = (size_t)L * HKV * G * (D / 2);
    float *stat = tt_bench_malloc(PROG, ns * 4), *inv = tt_bench_malloc(PROG, D / 2 * 4);
    for (size_t i = 0; i < ns; i++)
        stat[i] = tt_xrng_float(&rng, 0.0f, 1.0f);
    for (int f = 0; f < D / 2; f++)
        inv[f] = (float)pow(500000.0, -2.0 * f / D);

    uint16_t *pool = tt_cuda_bench_alloc(PROG, (size_t)n_pages * page_elems * 2);
    CK(cudaMemset(pool, 0x3e, (size_t)n_pages * page_elems * 2));
    int32_t *d_indptr = tt_cuda_bench_upload(PROG, indptr, (size_t)(n_rows + 1) * 4);
    int32_t *d_indices = tt_cuda_bench_upload(PROG, indices, (size_t)n_pages * 4);
    int32_t *d_lens = tt_cuda_bench_upload(PROG, lens, (size_t)n_rows * 4);
    struct tg_cuda_trig_item *d_it =
        tt_cuda_bench_upload(PROG, it, (size_t)n_items * sizeof(*it));
    float *d_stat = tt_cuda_bench_upload(PROG, stat, ns * 4);
    float *d_inv = tt_cuda_bench_upload(PROG, inv, D / 2 * 4);
    float *d_score = tt_cuda_bench_alloc(PROG, (size_t)n_items * region * 4);
    int32_t *d_src = tt_cuda_bench_alloc(PROG, (size_t)n_items * region * 4);
    int32_t *d_fault = tt_cuda_bench_upload(PROG, &(int32_t){0}, 4);

    struct tg_cuda_trig_pages pg = {
        .pool = pool, .n_pages = n_pages, .heads_per_group = HP,
        .page_size = P, .head_dim = D, .indptr = d_indptr,
        .indices = d_indices, .n_rows = n_rows,
    };
    struct tg_cuda_trig_score_args sa = {
        .pg = pg, .items = d_it, .n_items = n_items, .n_q_per_kv = G,
        .n_q_heads = HKV * G, .n_layers = L, .re = d_stat, .im = d_stat,
        .abs = d_stat, .inv_freq = d_inv, .score = d_score, .fault = d_fault,
    };
    struct tg_cuda_trig_select_args se = {
        .items = d_it, .n_items = n_items, .window = WINDOW, .score = d_score,
        .src = d_src, .fault = d_fault,
    };
    struct tg_cuda_trig_compact_args ca = {
        .pg = pg, .items = d_it, .n_items = n_items, .src = d_src,
        .fault = d_fault,
    };
    char err[256] = "";
    struct tt_cuda_timer t;
    tt_cuda_timer_init(&t, PROG);
    /* The trigger, three launches; a warm-up first. Compacting the same
     * regions again moves the same amount of data (every run keeps CAP of
     * REGION slots), so repeats are representative. */
    double *ms = tt_bench_malloc(PROG, (size_t)reps * sizeof(double));
    for (int r = -1; r < reps; r++) {
        tt_cuda_timer_start(&t, NULL);
        die_rc(tg_cuda_trig_score(&sa, err, sizeof(err)), "score", err);
        die_rc(tg_cuda_trig_select(&se, err, sizeof(err)), "select", err);
        die_rc(tg_cuda_trig_compact(&ca, err, sizeof(err)), "compact", err);
        double v = tt_cuda_timer_ms(&t, NULL);
        if (r >= 0)
            ms[r] = v;
    }
    const double trig_ms = tt_median(ms, reps);
    int32_t fault = -1;
    CK(cudaMemcpy(&fault, d_fault, 4, cudaMemcpyDeviceToHost));
    if (fault != 0) {
        fprintf(stderr, "%s: the trigger reported a fault\n", PROG);
        exit(1);
    }

    /* One decode step's attention over the same rows, all layers. */
    int splits[L * NG];
    for (int i = 0; i < L * NG; i++)
        splits[i] = 1;
    struct tg_cuda_split_map sm;
    die_rc(tg_cuda_split_map_init(&sm, splits, L, NG, err, sizeof(err)),
           "split map", err);
    const size_t qn = (size_t)B * HKV * G * D;
    uint16_t *d_q = tt_cuda_bench_alloc(PROG, qn * 2);
    CK(cudaMemset(d_q, 0x3c, qn * 2));
    void *d_out = tt_cuda_bench_alloc(PROG, qn * 4);
    int32_t hg[HKV], hs[HKV];
    for (int h = 0; h < HKV; h++) {
        hg[h] = h / HP;
        hs[h] = h % HP;
    }
    int32_t *d_hg = tt_cuda_bench_upload(PROG, hg, sizeof(hg));
    int32_t *d_hs = tt_cuda_bench_upload(PROG, hs, sizeof(hs));
    struct tg_cuda_decode_attn_args da = {
        .q = d_q, .pool = pool, .n_seq = B, .n_q_heads = HKV * G,
        .n_kv_heads = HKV, .n_groups = NG, .heads_per_group = HP,
        .page_size = P, .head_dim = D, .head_group = d_hg, .head_slot = d_hs,
        .table = {d_indptr, d_indices, d_lens, n_rows, L * NG, 0, NULL, 0, 0},
        .splits = &sm, .scale = 1.0f / sqrtf((float)D), .out = d_out,
        .out_dtype = TG_CUDA_DECODE_OUT_BF16,
    };
    for (int r = -1; r < reps; r++) {
        tt_cuda_timer_start(&t, NULL);
        for (int l = 0; l < L; l++) {
            da.layer = l;
            da.table.row_offset = l * NG;
            die_rc(tg_cuda_decode_attn(&da, err, sizeof(err)), "decode attn",
                   err);
        }
        double v = tt_cuda_timer_ms(&t, NULL);
        if (r >= 0)
            ms[r] = v;
    }
    const double attn_ms = tt_median(ms, reps);
    const double floor_ms = WEIGHT_BYTES / copy_bw * 1e3;
    const double step_ms = floor_ms + attn_ms;
    /* Compaction moves CAP survivors' K and V rows per head: read + write. */
    const double moved = (double)n_items * CAP * 2.0 * D * 2.0 * 2.0;
    printf("B %3d | trigger %8.3f ms | attention %7.3f ms | step >= %7.3f ms "
           "| trigger/step %6.2f%% | amortised over beta %5.3f%% | "
           "compaction bytes at copy bw %6.3f ms\n", B, trig_ms, attn_ms,
           step_ms, 100.0 * trig_ms / step_ms,
           100.0 * trig_ms / (BETA * step_ms), moved / copy_bw * 1e3);
    tt_cuda_timer_free(&t);
    tg_cuda_split_map_free(&sm);
    void *dev[] = {pool, d_indptr, d_indices, d_lens, d_it, d_stat, d_inv,
                   d_score, d_src, d_fault, d_q, d_out, d_hg, d_hs};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        CK(cudaFree(dev[i]));
    free(ms);
    free(indptr);
    free(indices);
    free(lens);
    free(it);
    free(stat);
    free(inv);
}
#endif

int main(int argc, char **argv)
{
    int quick = 0, reps = 20;
    const struct tt_bench_opt opts[] = {{"--reps", 1, 100000, &reps}};
    if (tt_bench_args(PROG, argc, argv, &quick, opts, TT_COUNT(opts),
                      "[--quick] [--bench] [--reps N]") != 0)
        return 2;
#ifdef TANGRAM_CUDA
    struct tg_cuda_device_info info;
    if (!tt_cuda_bench_device(PROG, &info))
        return 77; /* ctest: skipped */
    if (quick)
        reps = 2;
    double bw = tt_cuda_copy_bandwidth(PROG, (size_t)256 << 20, quick ? 2 : 10);
    printf("device: %s, %d SMs, sm_%d%d; Llama-3.1-8B shape (32 x 8 KV heads, "
           "G 4, d 128), H_p 2, P 16; prompt %d kept, cap %d, beta %d, window "
           "%d; copy bandwidth %.0f GB/s; %d reps (median)\n", info.name,
           info.sm_count, info.cc_major, info.cc_minor, PROMPT, CAP, BETA,
           WINDOW, bw * 1e-9, reps);
    static const int batches[] = {1, 8, 32, 64}, quick_batches[] = {1, 4};
    for (int b = 0; b < (quick ? 2 : 4); b++)
        run_batch(quick ? quick_batches[b] : batches[b], reps, bw);
    return 0;
#else
    (void)quick;
    (void)reps;
    return tt_cuda_skip("built without CUDA");
#endif
}
