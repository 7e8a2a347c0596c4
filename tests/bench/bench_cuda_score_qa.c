/* bench_cuda_score_qa.c — the three chunk scoring methods on the device,
 * side by side on the same chunk (kernels/cuda/score_qa.h, compress.h):
 * snapkv (query-aware, tg_cuda_compress_score_snapkv), keydiff and
 * expected_attention (query-agnostic), all through tg_cuda_score_qa_score.
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

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/score_qa.h"
#endif

#define PROG "bench"

#ifdef TANGRAM_CUDA
#define CK(expr) TT_CUDA_CK(PROG, expr)

static struct tt_xrng rng = {0x853c49e6748fea9bull};

/* A device buffer of len random bf16 values in [lo, hi). */
static uint16_t *dev_random_bf16(size_t len, float lo, float hi)
{
    uint16_t *h = tt_bench_malloc(PROG, len * 2);
    tt_fill_bf16(&rng, h, NULL, len, lo, hi);
    uint16_t *d = tt_cuda_bench_upload(PROG, h, len * 2);
    free(h);
    return d;
}

/* Mean microseconds of one tg_cuda_score_qa_score call over reps (after one
 * warm-up). */
static double time_method(enum tg_score_method m,
                          const struct tg_cuda_compress_chunk *c, float *scores,
                          void *ws, size_t wsb, int reps)
{
    if (tg_cuda_score_qa_score(m, c, scores, ws, wsb, NULL) != 0) {
        fprintf(stderr, "bench: tg_cuda_score_qa_score(%d) failed\n", (int)m);
        exit(1);
    }
    struct tt_cuda_timer t;
    tt_cuda_timer_init(&t, PROG);
    tt_cuda_timer_start(&t, NULL);
    for (int r = 0; r < reps; r++)
        if (tg_cuda_score_qa_score(m, c, scores, ws, wsb, NULL) != 0) {
            fprintf(stderr, "bench: tg_cuda_score_qa_score(%d) failed\n",
                    (int)m);
            exit(1);
        }
    double ms = tt_cuda_timer_ms(&t, NULL);
    tt_cuda_timer_free(&t);
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
    struct tg_cuda_compress_chunk c = {
        .q = q, .k = k, .v = v, .n = n, .n_q_heads = md->hq,
        .n_kv_heads = md->hkv, .head_dim = md->d, .start = 0, .window = W,
        .n_sink = 4, .scale = 1.0f / sqrtf((float)md->d),
    };
    const enum tg_score_method ms[3] = {TG_SCORE_SNAPKV, TG_SCORE_KEYDIFF,
                                        TG_SCORE_EXPECTED_ATTENTION};
    size_t wsb = 0;
    for (int i = 0; i < 3; i++) {
        size_t b = tg_cuda_score_qa_workspace_bytes(ms[i], n, md->hq, md->hkv,
                                                    md->d, W);
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
    const struct tt_bench_opt opts[] = {{"--reps", 1, 100000, &reps}};
    if (tt_bench_args(PROG, argc, argv, &quick, opts, TT_COUNT(opts),
                      "[--quick] [--bench] [--reps N]") != 0)
        return 2;
#ifdef TANGRAM_CUDA
    struct tg_cuda_device_info info;
    if (!tt_cuda_bench_device(PROG, &info))
        return 77; /* ctest: skipped */
    if (quick)
        reps = 3;
    double copy_bw = tt_cuda_copy_bandwidth(
        PROG, quick ? (size_t)64 << 20 : (size_t)1 << 30, 10);
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
    return tt_cuda_skip("built without CUDA");
#endif
}
