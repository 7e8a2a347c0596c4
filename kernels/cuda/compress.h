/*
 * compress.h — fused per-chunk KV compression on the device (DESIGN.md
 * §4.3 steps 3-5, §4.4 snapkv), entries tg_cuda_compress_*.
 *
 * For one prefill chunk of n tokens at one layer of one sequence:
 *  1. score  — snapkv scores of the chunk's keys per KV head: window
 *     W = min(window, n) last queries (window <= 0: all n); for KV head h
 *     the mean over its G query heads and W queries of
 *     softmax_j(q . k_j * scale) over the chunk's causal keys (j <= i), in
 *     fp32, then average pooling (width 5, zero padding 2, divisor 5);
 *  2. select — per KV head the top keep[h] keys by score, forced keys (the
 *     chunk's last min(window, n) keys and absolute positions < n_sink)
 *     ranking as +inf, NaN as -inf, ties to the lower index; the kept
 *     chunk indices in ascending order;
 *  3. append — the kept K/V rows of each head copied into its group's
 *     pages after the group's current length (or the head's own length,
 *     when the rows keep per-head lengths).
 * The CPU reference is tg_ops_cpu.score / select_topk / kv_append
 * (kernels/cpu/cpu_score.c); results match it up to fp32 rounding of the
 * scores (different summation order), and exactly for select and append
 * given the same scores / indices.
 *
 * Memory: q, k, v, the pool, scores, idx, the workspace and the page
 * tables are device memory; the per-head arrays (keep, head_group,
 * head_slot) are host memory, validated and copied into the launch
 * parameters, so the caller may reuse them as soon as a call returns.
 * bf16 tensors are passed as uint16_t bit patterns (the top half of an
 * IEEE binary32, as common/model/st_safetensors.h converts), so this header is
 * plain C without CUDA types; streams are void * (NULL = default stream).
 *
 * Limits (TG_EINVAL beyond them): n <= TG_CUDA_COMPRESS_MAX_CHUNK (the
 * selection sorts a head's keys in one thread block's shared memory), head_dim
 * <= TG_CUDA_COMPRESS_MAX_HEAD_DIM, n_kv_heads <= TG_CUDA_COMPRESS_MAX_KV_HEADS
 * and group / slot numbers below TG_CUDA_COMPRESS_MAX_KV_HEADS (per-head arrays
 * travel in the kernel parameters).
 *
 * Every call is asynchronous on `stream` and returns 0, TG_EINVAL (bad
 * arguments, checked before anything is queued) or TG_EDEVICE (a CUDA
 * error, detail printed by cuda_check.cuh). Functions need a CUDA build
 * (TANGRAM_CUDA); argument errors are reported without touching the
 * device. Any thread; calls on one stream are ordered.
 */
#ifndef TG_CUDA_COMPRESS_H
#define TG_CUDA_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    /* keys per chunk (bitonic sort of 2048 in smem) */
    TG_CUDA_COMPRESS_MAX_CHUNK = 2048,
    TG_CUDA_COMPRESS_MAX_HEAD_DIM = 256, /* head_dim */
    TG_CUDA_COMPRESS_MAX_KV_HEADS = 256, /* KV heads per rank and layer */
};

/* One chunk's projections at one layer (all device memory). */
struct tg_cuda_compress_chunk {
    const uint16_t *q; /* bf16 (n, Hq, d), after RoPE */
    const uint16_t *k; /* bf16 (n, Hkv, d), after RoPE */
    const uint16_t *v; /* bf16 (n, Hkv, d) */
    int n;             /* tokens in the chunk, 0..TG_CUDA_COMPRESS_MAX_CHUNK */
    int n_q_heads;     /* Hq, a multiple of Hkv; query head q reads q / G */
    int n_kv_heads;    /* Hkv */
    int head_dim;      /* d */
    int64_t start;     /* absolute position of chunk index 0 */
    int window;        /* snapkv w (32); <= 0: the whole chunk */
    int n_sink;        /* absolute positions < n_sink are forced (4) */
    float scale;       /* softmax scale, 1/sqrt(d) */
};

/* Where one sequence's rows of one layer live: the bf16 page pool and the
 * CSR page lists of its groups (kv_table layout, common/kv/kv_table.h). With
 * a device kv_table_dev `dt` and the sequence's first row r0 of the layer
 * (r0 = (slot * L + l) * n_groups), indptr = dt.indptr + r0, indices =
 * dt.indices, npages = dt.npages + r0, lens = dt.lens + r0. Head h writes
 * token t of its group row g = head_group[h] (slot s = head_slot[h]) at
 * page indices[indptr[g] + t / P], K at ((s*2+0)*P + t%P)*d and V at
 * ((s*2+1)*P + t%P)*d inside the page — the CPU backend's layout. */
struct tg_cuda_compress_dst {
    uint16_t *pool;            /* device bf16 (n_pages, H_p, 2, P, d) */
    int64_t n_pages;           /* pages in the pool; ids must be below */
    int heads_per_group;       /* H_p */
    int page_size;             /* P, tokens per page */
    int head_dim;              /* d */
    int n_kv_heads;            /* Hkv */
    int n_groups;              /* groups of this layer */
    const int32_t *head_group; /* host (Hkv) group of each head, < n_groups */
    const int32_t *head_slot;  /* host (Hkv) slot in its group's pages, < H_p */
    const int32_t *indptr;     /* device (n_groups) first id of each group */
    const int32_t *indices;    /* device page ids, read at indptr[g] + i */
    const int32_t *npages;     /* device (n_groups) pages of each group row */
    const int32_t *lens;       /* device (n_groups) tokens already held: the
                                  append offset (the caller advances it) */
    const int32_t *head_lens;  /* device (Hkv) or NULL: tokens each head
                                  already holds, its own append offset
                                  (adaptive budgets, compacted decode
                                  regions: a group's heads then differ).
                                  The caller keeps head_lens[h] + keep[h]
                                  within the row's pages and advances both */
    int32_t *fault;            /* device (1) or NULL: set to 1 when a kept
                                  row's destination is missing (token past
                                  npages * P, or a page id outside the
                                  pool); that row is then not written */
};

/* Bytes of device workspace tg_cuda_compress_score_snapkv /
 * tg_cuda_compress_chunk_compress need for a chunk of n tokens (per query row
 * softmax max and sum: Hkv * G * W * 2 floats). 0 when n <= 0 or the shape is
 * invalid. */
size_t tg_cuda_compress_workspace_bytes(int n, int n_q_heads, int n_kv_heads,
                                        int window);

/* Writes the snapkv scores of chunk `c` to scores (device fp32 (Hkv, n)),
 * using `ws` (device, 8-byte aligned, ws_bytes >=
 * tg_cuda_compress_workspace_bytes) as scratch. Forced keys are not applied
 * here (see tg_cuda_compress_select_topk). n == 0 queues nothing. Returns 0,
 * TG_EINVAL or TG_EDEVICE. */
int tg_cuda_compress_score_snapkv(const struct tg_cuda_compress_chunk *c,
                                  float *scores, void *ws, size_t ws_bytes,
                                  void *stream);

/* Per KV head h, writes the keep[h] selected chunk indices in ascending
 * order to idx[h * n .. h * n + keep[h]) (device int32 (Hkv, n); the rest
 * of each row is left as is). scores: device fp32 (Hkv, n); keep: host
 * (Hkv), 0..n. Forced keys: i >= n - min(window, n) when window > 0, and
 * start + i < n_sink. Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_compress_select_topk(const float *scores, int n, int n_kv_heads,
                                 const int32_t *keep, int64_t start, int window,
                                 int n_sink, int32_t *idx, void *stream);

/* Appends chunk rows to every head's group row at offset lens[g]: head h
 * copies k[idx[h*n + t], h, :] and v[...] for t < n_keep[h] (idx NULL:
 * all n rows in order, n_keep ignored). k, v: device bf16 (n, Hkv, d);
 * idx: device int32 (Hkv, n) or NULL; n_keep: host (Hkv), 0..n, equal
 * within a group unless dst->head_lens is given. Indices outside
 * [0, n) and missing destinations skip the row and set dst->fault.
 * With dst->head_lens head h appends at its own length, and n_keep may
 * differ within a group.
 * Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_compress_kv_append(const struct tg_cuda_compress_dst *dst,
                               const uint16_t *k, const uint16_t *v, int n,
                               const int32_t *idx, const int32_t *n_keep,
                               void *stream);

/* The three steps for one chunk on one stream: tg_cuda_compress_score_snapkv
 * into `scores`, tg_cuda_compress_select_topk with `keep` into `idx`,
 * tg_cuda_compress_kv_append of the kept rows into `dst` (which must describe
 * c->n_kv_heads heads of c->head_dim). scores and idx stay readable afterwards
 * (for tests and calibration). Returns 0, TG_EINVAL (nothing queued) or
 * TG_EDEVICE. */
int tg_cuda_compress_chunk_compress(const struct tg_cuda_compress_chunk *c,
                                    const int32_t *keep,
                                    const struct tg_cuda_compress_dst *dst,
                                    float *scores, int32_t *idx, void *ws,
                                    size_t ws_bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_COMPRESS_H */
