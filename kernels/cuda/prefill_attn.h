/*
 * prefill_attn.h — attention of one prefill chunk over the sequence's
 * ragged compressed history plus the chunk's own causal keys, on tensor
 * cores (DESIGN.md §4.3 step 2, §6).
 *
 * For one sequence at one layer: the query at chunk index i (absolute
 * position start + i) of query head q (KV head h = q / G, G = Hq / Hkv)
 * attends to
 *   1. every history token of head h: the lens[g] tokens of its group row
 *      g = head_group[h] (slot s = head_slot[h]; head_lens[h] tokens
 *      instead when per-head lengths are given), token t in page
 *      indices[indptr[g] + t / P] at offset t % P, K at
 *      ((s*2+0)*P + t%P)*d and V at ((s*2+1)*P + t%P)*d inside the page
 *      (the page layout of kernels/tg_ops.h, the same CSR view as
 *      compress.h's struct tg_cuda_compress_dst); history rows may hold 0
 *      tokens and differ in length between groups;
 *   2. the chunk's keys/values 0..i of head h (causal).
 * out = softmax(q . k * scale) v with an online softmax in fp32 (Milakov &
 * Gimelshein 2018); QK^T and PV run on bf16 tensor cores with fp32
 * accumulation. The CPU reference is tg_ops_cpu.attn_chunk on the same
 * bf16-rounded inputs.
 *
 * Kernel (FlashAttention-2 tiling, Dao 2023): one CTA per (tile of 64
 * query rows, KV head); the G query heads of a KV head are packed as extra
 * rows (row = token * G + head), so each 64-key K/V tile is read once for
 * all G heads. Keys stream through shared memory: the head's history pages
 * first (gathered token by token, so any P works), then the chunk's keys up
 * to the tile's last token under the causal mask. The softmax weights P are
 * rounded to bf16 before the PV product (the denominator sums the rounded
 * weights) and the output is bf16, so results agree with the fp32 CPU
 * reference to about 1e-2 of the largest output magnitude of each row (the
 * device test asserts max |err| <= 2e-2 * max |out| per (token, head) row).
 *
 * The header is plain C without CUDA types: bf16 tensors are uint16_t bit
 * patterns, streams are void * (NULL = the default stream). Supported:
 * d in {64, 128}, G in 1..16, H_p in 1..16, P >= 1, n in 0..65535, history
 * rows of 0 .. INT32_MAX tokens; q, k, v, pool and out 16-byte aligned
 * (the kernel moves rows in 16-byte pieces). The caller guarantees what
 * the entry cannot check without a copy: head_group / head_slot map the
 * Hkv heads onto (group < n_groups, slot < H_p), and the first
 * ceil(lens[g] / P) ids of every row are pages of the pool. Functions
 * exist only in CUDA builds (TANGRAM_CUDA); argument errors are reported
 * without touching the device. Never allocates, never synchronises
 * (capturable). The first call per device for d = 128 sets the kernel's
 * shared-memory opt-in attribute (62976 bytes, above the 48 KiB default;
 * host-side state, not stream work), so make one call before capturing a
 * graph. Any thread; calls on one stream are ordered.
 */
#ifndef TG_CUDA_PREFILL_ATTN_H
#define TG_CUDA_PREFILL_ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tg_cuda_prefill_attn_args {
    const uint16_t *q;         /* device bf16 (n, Hq, d), RoPE applied */
    const uint16_t *k;         /* device bf16 (n, Hkv, d), RoPE applied */
    const uint16_t *v;         /* device bf16 (n, Hkv, d) */
    int n;                     /* chunk tokens */
    int n_q_heads;             /* Hq, a multiple of Hkv */
    int n_kv_heads;            /* Hkv = n_groups * H_p */
    int head_dim;              /* d: 64 or 128 */
    /* history (read only) */
    const uint16_t *pool;      /* device bf16 (n_pages, H_p, 2, P, d) */
    int heads_per_group;       /* H_p */
    int page_size;             /* P */
    int n_groups;              /* groups of this layer */
    const int32_t *head_group; /* device (Hkv) group of each KV head */
    const int32_t *head_slot;  /* device (Hkv) slot of each KV head */
    const int32_t *indptr;     /* device (n_groups) first id of each row */
    const int32_t *indices;    /* device page ids, read at indptr[g] + i */
    const int32_t *lens;       /* device (n_groups) history tokens per row
                                  (before this chunk's append) */
    const int32_t *head_lens;  /* device (Hkv) history tokens of each KV
                                  head, or NULL: every head reads its
                                  row's lens. For rows whose heads hold
                                  different counts (adaptive budgets,
                                  decode-time compaction): head h reads
                                  its first head_lens[h] tokens, which
                                  the caller keeps <= lens[head_group[h]] */
    float scale;               /* 1/sqrt(d) */
    uint16_t *out;             /* device bf16 (n, Hq, d) */
    void *stream;              /* cudaStream_t or NULL */
};

/* Enqueues the attention of one chunk (see the top of this file) on
 * a->stream; out is complete when the stream is. Shapes are checked
 * first, then n == 0 returns 0 and queues nothing (device pointers may
 * then be NULL). Returns 0, TG_EINVAL (unsupported shape, NULL or
 * misaligned pointer, non-finite scale; detail in err) or TG_EDEVICE
 * (attribute or launch error). Borrows every pointer for the duration of
 * the queued work only. */
int tg_cuda_prefill_attn(const struct tg_cuda_prefill_attn_args *a, char *err,
                         size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_PREFILL_ATTN_H */
