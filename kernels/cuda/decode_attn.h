/*
 * decode_attn.h — decode attention over ragged head-group pages, driven by
 * the static split map (DESIGN.md §4.6, TANGRAM Algorithm 1), and its
 * log-sum-exp combine kernel.
 *
 * One decode step of one layer: n_seq sequences, one query token each,
 * every KV head h of the layer stored in group head_group[h] at slot
 * head_slot[h] of that group's pages (the page layout of the CPU backend,
 * kernels/tg_ops.h: a page is [H_p][2][P][d], K then V for each slot).
 * Query head q reads KV head q / G.
 *
 * Work decomposition. One CTA per (sequence, group, split s < S[g]): the
 * row's ceil(len / P) pages are cut into S[g] contiguous ranges, split s
 * covering pages [floor(s*n/S), floor((s+1)*n/S)) (sizes differ by at most
 * one; with S > n some ranges are empty). A CTA walks the H_p heads of its
 * group and, for each, the G query heads over its token range with an
 * online softmax in fp32 (running max m, sum l, unnormalised acc(d);
 * Milakov & Gimelshein 2018, "Online normalizer calculation for softmax").
 * A split with no pages yields the neutral partial m = -inf, l = 0,
 * acc = 0.
 *
 * Combine. For groups with S[g] > 1 the partials (m_s, l_s, acc_s) go to a
 * workspace and a second kernel merges them with log-sum-exp in natural
 * log (FlashDecoding, Dao et al. 2023):
 *     M = max_s m_s,  out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
 * Groups with S[g] = 1 skip the workspace: their CTA normalises and
 * writes the output directly, and the combine kernel leaves them alone
 * (it is not launched at all when every group of the layer has S = 1).
 *
 * Split maps. tg_cuda_split_map holds S[l][g] for every layer as device
 * prefix offsets, uploaded once at worker start; nothing is planned per
 * step. The same kernel runs with any map, so the benchmark compares the
 * profile's map (common/profile/pf_split.h), a FlashDecoding-style uniform map
 * (tg_cuda_decode_uniform_splits) and no split (all ones) fairly.
 * tg_cuda_decode_attn_n_cta gives the N_CTA that pf_split_map needs.
 *
 * Storage: q, pool bf16 (raw bits, uint16_t here so C can hold the
 * pointers); output bf16 or fp32; all math fp32. Supported shapes:
 * d in {64, 128}, G = Hq / Hkv in 1..16, H_p in 1..16, P >= 1.
 *
 * The header is plain C (streams are void *, NULL = the default stream).
 * The functions exist only in CUDA builds (TANGRAM_CUDA). Errors: TG_EINVAL
 * for bad arguments (with detail in err), TG_EDEVICE from the CUDA runtime,
 * TG_ENOMEM for host memory. Launches are asynchronous; one thread per
 * stream.
 */
#ifndef TG_CUDA_DECODE_ATTN_H
#define TG_CUDA_DECODE_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/kv_table_dev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's view of a device CSR block table (common/kv/kv_table.h layout):
 * the row of (sequence s, group g) is s * row_stride + row_offset + g; it
 * owns page ids indices[indptr[row] ..], of which the first
 * ceil(lens[row] / P) are read (padded tables' gaps are never touched). */
struct tg_cuda_kv_csr {
    const int32_t *indptr;  /* device (n_rows + 1) first id slot per row */
    const int32_t *indices; /* device (n_slots) page ids */
    const int32_t *lens;    /* device (n_rows) tokens per row, >= 1 here */
    int32_t n_rows;         /* rows in the table (for argument checks) */
    int32_t row_stride;     /* rows per sequence: L * n_groups, or n_groups */
    int32_t row_offset;     /* row of (sequence 0, group 0): layer * n_groups */
    /* Optional per-head lengths, for rows whose heads hold different
     * counts (adaptive budgets, decode-time compaction). NULL: every head
     * holds its row's lens. Otherwise KV head h of sequence s holds
     * head_lens[s * head_stride + head_offset + h] tokens, at most its
     * row's lens (the caller guarantees it): attention reads only those,
     * and the decode append writes the new token at that count - 1 (the
     * count already includes it, as lens does). */
    const int32_t *head_lens; /* device (n_seq * head_stride) or NULL */
    int32_t head_stride;      /* heads per sequence: L * Hkv, or Hkv */
    int32_t head_offset;      /* head 0 of this layer: layer * Hkv */
};

/* Fills *csr with layer `layer` of an uploaded kv_table_dev whose rows are
 * (slot, layer, group) for n_layers layers of n_groups groups. Returns 0
 * or TG_EINVAL (nothing uploaded, layer out of range, or a row count that
 * is not a multiple of n_layers * n_groups). Host only; borrows dt's
 * buffers (valid until its next upload that grows them). */
int tg_cuda_decode_csr_layer(struct tg_cuda_kv_csr *csr,
                             const struct tg_cuda_kv_table_dev *dt,
                             int n_layers, int n_groups, int layer, char *err,
                             size_t errlen);

/* S[l][g] of every layer, on the device as prefix offsets. */
struct tg_cuda_split_map {
    int32_t *offsets; /* device (n_layers, n_groups + 1): offsets[l][g] =
                         sum_{g' < g} S[l][g'] */
    int32_t *total;   /* host (n_layers) sum_g S[l][g]: CTAs per sequence */
    int32_t *max;     /* host (n_layers) max_g S[l][g]: workspace splits */
    int n_layers;
    int n_groups;
};

/* Validates splits[n_layers * n_groups] (layer-major, each S >= 1 and the
 * per-layer sum <= 2^20) and uploads it synchronously. Returns 0,
 * TG_EINVAL (map zeroed, nothing allocated), TG_ENOMEM or TG_EDEVICE (map
 * freed). The caller owns *map (tg_cuda_split_map_free); the host array is
 * not kept. */
int tg_cuda_split_map_init(struct tg_cuda_split_map *map, const int *splits,
                           int n_layers, int n_groups, char *err,
                           size_t errlen);

/* Frees what *map owns (synchronising the device) and zeroes it. Safe on a
 * zeroed or freed map. */
void tg_cuda_split_map_free(struct tg_cuda_split_map *map);

enum tg_cuda_decode_out_dtype {
    TG_CUDA_DECODE_OUT_BF16 = 0,
    TG_CUDA_DECODE_OUT_F32 = 1,
};

/* Arguments of one layer's decode attention. Every pointer is device
 * memory. The caller guarantees what the entry cannot check without a
 * copy: head_group / head_slot map the Hkv heads one-to-one onto
 * (group < n_groups, slot < H_p), every row of the batch holds >= 1 token,
 * and its page ids are < the pool's page count. */
struct tg_cuda_decode_attn_args {
    const uint16_t *q;          /* (n_seq, Hq, d) bf16 query, RoPE applied */
    const uint16_t *pool;       /* (n_pages, H_p, 2, P, d) bf16 KV pool */
    int n_seq;                  /* sequences (one query token each) */
    int n_q_heads;              /* Hq */
    int n_kv_heads;             /* Hkv = n_groups * H_p */
    int n_groups;               /* groups of the layer */
    int heads_per_group;        /* H_p */
    int page_size;              /* P, tokens per page */
    int head_dim;               /* d: 64 or 128 */
    const int32_t *head_group;  /* (Hkv) group of each KV head */
    const int32_t *head_slot;   /* (Hkv) slot of each KV head in its page */
    struct tg_cuda_kv_csr table;/* the layer's rows */
    const struct tg_cuda_split_map *splits; /* host struct, device offsets */
    int layer;                  /* which layer of `splits` */
    float scale;                /* softmax scale, usually 1/sqrt(d) */
    float *ws;                  /* (n_seq, Hq, max_splits, d + 2) partials:
                                   acc (d), m, l; NULL allowed when the
                                   layer's max split is 1 */
    size_t ws_bytes;            /* bytes at ws */
    void *out;                  /* (n_seq, Hq, d) in out_dtype */
    enum tg_cuda_decode_out_dtype out_dtype;
    void *stream;               /* cudaStream_t; NULL = default stream */
};

/* Returns the workspace bytes decode attention needs for n_seq sequences
 * of n_q_heads heads of dimension head_dim at `max_splits` splits (0 when
 * max_splits <= 1, which needs none). Pure; any thread. */
size_t tg_cuda_decode_attn_ws_bytes(int n_seq, int n_q_heads, int head_dim,
                                    int max_splits);

/* Runs decode attention of one layer on `stream`: the split kernel, then
 * the combine kernel when some group has S > 1. out receives
 * softmax(q k^T * scale) v per query head. Returns 0, TG_EINVAL (bad
 * dtype, shape, pointer or workspace size; detail in err) or TG_EDEVICE
 * (launch error). Asynchronous: results are ready when the stream is. */
int tg_cuda_decode_attn(const struct tg_cuda_decode_attn_args *a, char *err,
                        size_t errlen);

/* N_CTA for pf_split_map (DESIGN.md §4.6): the decode kernel's maximum
 * resident CTAs per SM for G = n_q_per_kv and d = head_dim, from
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor, times the SM count of the
 * current device. Returns 0, TG_EINVAL (unsupported G or d) or TG_EDEVICE
 * / TG_ENODEV. */
int tg_cuda_decode_attn_n_cta(int n_q_per_kv, int head_dim, int *n_cta);

/* The FlashDecoding-style uniform heuristic the benchmark compares with
 * (after FlashAttention-2's num_splits_heuristic, Dao 2023): every
 * (sequence, group) gets the same S, chosen from the longest row and the
 * device's CTA slots n_cta. With b = n_seq * n_groups CTAs unsplit: S = 1
 * when b >= 0.8 * n_cta; otherwise, over S in 1..min(n_cta, pages of the
 * longest row, 128) that change ceil(pages / S), the wave efficiency
 * e(S) = w / ceil(w) with w = b * S / n_cta, and the smallest S with
 * e(S) >= 0.85 * max e. Writes S to splits[0 .. n_groups) and returns it
 * (>= 1), or TG_EINVAL. Pure host code; any thread. */
int tg_cuda_decode_uniform_splits(int n_seq, int n_groups,
                                  int64_t max_row_tokens, int page_size,
                                  int n_cta, int *splits);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_DECODE_ATTN_H */
