/* bench_cuda_decode_append.c — the batched decode-step KV append
 * (kernels/cuda/decode_append.h) side by side with a device-to-device
 * cudaMemcpyAsync of the same payload.
 *
 * Shape: Llama-3.1-8B per rank and layer (Hkv 8, d 128), H_p 2, P 16, one
 * layer's rows of a decode table; every row holds a random 1..4096 tokens
 * (the new one included) and its page for the new token is a random page
 * of a pool four times the size the batch touches, so the writes scatter
 * as in serving. Batches 1..1024 sequences.
 *
 * Reported per batch: microseconds per launch (mean over reps, CUDA
 * events, after a warm-up) and the payload moved per second (K and V rows
 * read and written: 2 * 2 * n_seq * Hkv * d * 2 bytes) for the append and
 * for one contiguous memcpy of the same payload, and their ratio. Small
 * batches are launch-bound on both sides.
 *
 * Usage: bench-cuda-decode-append [--quick] [--bench] [--reps N]
 * Without a CUDA build or device it prints "skipped: no CUDA device" and
 * exits 77 (skipped). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/decode_append.h"
#endif

#define PROG "bench"

#ifdef TANGRAM_CUDA
#define CK(expr) TT_CUDA_CK(PROG, expr)

static struct tt_xrng rng = {0x9fb21c651e98df25ull};

static void run_batch(int n_seq, int reps)
{
    const int Hkv = 8, d = 128, Hp = 2, P = 16, NG = Hkv / Hp;
    const int n_rows = n_seq * NG;
    /* Host table: only each row's slot of the new token holds a page. */
    int32_t *indptr = tt_bench_malloc(PROG, (size_t)(n_rows + 1) * 4);
    int32_t *lens = tt_bench_malloc(PROG, (size_t)n_rows * 4);
    indptr[0] = 0;
    for (int r = 0; r < n_rows; r++) {
        lens[r] = 1 + (int32_t)(tt_xrng_next(&rng) % 4096);
        indptr[r + 1] = indptr[r] + (lens[r] + P - 1) / P;
    }
    const int64_t n_slots = indptr[n_rows], n_pages = 4 * (int64_t)n_rows;
    int32_t *indices = tt_bench_malloc(PROG, (size_t)n_slots * 4);
    for (int64_t i = 0; i < n_slots; i++)
        indices[i] = -1;
    /* Distinct random pages: a prefix of a shuffled id list. */
    int32_t *ids = tt_bench_malloc(PROG, (size_t)n_pages * 4);
    tt_xrng_perm(&rng, ids, n_pages);
    for (int r = 0; r < n_rows; r++)
        indices[indptr[r] + (lens[r] - 1) / P] = ids[r];
    int32_t hg[8], hs[8];
    for (int h = 0; h < Hkv; h++) {
        hg[h] = h / Hp;
        hs[h] = h % Hp;
    }
    const size_t payload = (size_t)n_seq * Hkv * d * 2; /* bytes of K (= V) */
    const size_t pool_bytes = (size_t)n_pages * Hp * 2 * P * d * 2;
    uint16_t *k = NULL, *v = NULL, *pool = NULL, *dst = NULL;
    CK(cudaMalloc((void **)&k, payload));
    CK(cudaMalloc((void **)&v, payload));
    CK(cudaMalloc((void **)&pool, pool_bytes));
    CK(cudaMalloc((void **)&dst, 2 * payload));
    CK(cudaMemset(k, 0x3f, payload));
    CK(cudaMemset(v, 0x3f, payload));
    struct tg_cuda_decode_append_args a;
    memset(&a, 0, sizeof(a));
    a.k = k;
    a.v = v;
    a.n_seq = n_seq;
    a.n_kv_heads = Hkv;
    a.head_dim = d;
    a.heads_per_group = Hp;
    a.page_size = P;
    a.pool = pool;
    a.n_pages = n_pages;
    a.head_group = tt_cuda_bench_upload(PROG, hg, sizeof(hg));
    a.head_slot = tt_cuda_bench_upload(PROG, hs, sizeof(hs));
    a.table.indptr =
        tt_cuda_bench_upload(PROG, indptr, (size_t)(n_rows + 1) * 4);
    a.table.indices = tt_cuda_bench_upload(PROG, indices, (size_t)n_slots * 4);
    a.table.lens = tt_cuda_bench_upload(PROG, lens, (size_t)n_rows * 4);
    a.table.n_rows = n_rows;
    a.table.row_stride = NG;
    a.table.row_offset = 0;
    a.fault = tt_cuda_bench_upload(PROG, &(int32_t){0}, 4);
    char err[256];
    if (tg_cuda_decode_append(&a, err, sizeof(err)) != 0) { /* warm-up */
        fprintf(stderr, "bench: decode_append: %s\n", err);
        exit(1);
    }
    CK(cudaMemcpyAsync(dst, k, payload, cudaMemcpyDeviceToDevice, NULL));
    struct tt_cuda_timer t;
    tt_cuda_timer_init(&t, PROG);
    tt_cuda_timer_start(&t, NULL);
    for (int r = 0; r < reps; r++)
        if (tg_cuda_decode_append(&a, err, sizeof(err)) != 0) {
            fprintf(stderr, "bench: decode_append: %s\n", err);
            exit(1);
        }
    const double us_app = tt_cuda_timer_ms(&t, NULL) * 1e3 / reps;
    /* The memcpy side: K and V payload, as one contiguous copy of 2x. */
    uint16_t *src2 = NULL;
    CK(cudaMalloc((void **)&src2, 2 * payload));
    CK(cudaMemset(src2, 0x3f, 2 * payload));
    tt_cuda_timer_start(&t, NULL);
    for (int r = 0; r < reps; r++)
        CK(cudaMemcpyAsync(dst, src2, 2 * payload, cudaMemcpyDeviceToDevice,
                           NULL));
    const double us_cpy = tt_cuda_timer_ms(&t, NULL) * 1e3 / reps;
    int32_t fault = -1;
    CK(cudaMemcpy(&fault, a.fault, 4, cudaMemcpyDeviceToHost));
    if (fault != 0) {
        fprintf(stderr, "bench: the append reported a fault\n");
        exit(1);
    }
    const double moved = 2.0 * 2.0 * (double)payload; /* read + write, K + V */
    printf("n_seq %5d | %8.1f KB | append %7.2f us %7.1f GB/s | memcpy "
           "%7.2f us %7.1f GB/s | append/memcpy time %.2f\n", n_seq,
           2.0 * payload / 1024.0, us_app, moved / (us_app * 1e-6) * 1e-9,
           us_cpy, moved / (us_cpy * 1e-6) * 1e-9, us_app / us_cpy);
    tt_cuda_timer_free(&t);
    CK(cudaFree(k));
    CK(cudaFree(v));
    CK(cudaFree(pool));
    CK(cudaFree(dst));
    CK(cudaFree(src2));
    CK(cudaFree((void *)a.head_group));
    CK(cudaFree((void *)a.head_slot));
    CK(cudaFree((void *)a.table.indptr));
    CK(cudaFree((void *)a.table.indices));
    CK(cudaFree((void *)a.table.lens));
    CK(cudaFree(a.fault));
    free(indptr);
    free(lens);
    free(indices);
    free(ids);
}
#endif

int main(int argc, char **argv)
{
    int quick = 0, reps = 200;
    const struct tt_bench_opt opts[] = {{"--reps", 1, 1000000, &reps}};
    if (tt_bench_args(PROG, argc, argv, &quick, opts, TT_COUNT(opts),
                      "[--quick] [--bench] [--reps N]") != 0)
        return 2;
#ifdef TANGRAM_CUDA
    struct tg_cuda_device_info info;
    if (!tt_cuda_bench_device(PROG, &info))
        return 77; /* ctest: skipped */
    if (quick)
        reps = 3;
    printf("device: %s, %d SMs, sm_%d%d; Hkv 8, d 128, H_p 2, P 16; %d reps; "
           "GB/s = K and V bytes read + written per second\n", info.name,
           info.sm_count, info.cc_major, info.cc_minor, reps);
    static const int batches[] = {1, 8, 64, 256, 1024}, quick_batches[] = {1, 64};
    for (int b = 0; b < (quick ? 2 : 5); b++)
        run_batch(quick ? quick_batches[b] : batches[b], reps);
    return 0;
#else
    (void)quick;
    (void)reps;
    return tt_cuda_skip("built without CUDA");
#endif
}
