/*
 * decode_append.h — batched KV append of one decode step on the device
 * (DESIGN.md §4.3: "decode tokens are appended to every head,
 * uncompressed"), one launch per layer for the whole batch.
 *
 * For every sequence s < n_seq and KV head h, the new token's K row
 * k[s, h, :] and V row v[s, h, :] are copied into the pool at token
 * t = lens[row] - 1 of row = s * row_stride + row_offset + head_group[h]
 * of the decode table (struct tg_cuda_kv_csr, decode_attn.h): the table's
 * lens already count the new token, exactly as decode attention reads
 * them, so the worker uploads one table per step and both kernels agree.
 * With per-head lengths in the table (tg_cuda_kv_csr.head_lens) head h's
 * token goes to its own count - 1 instead (the count includes it).
 * With slot = head_slot[h] and P = page_size, the token goes to page
 * indices[indptr[row] + t / P] at offset t % P: K at
 * ((slot*2+0)*P + t%P)*d and V at ((slot*2+1)*P + t%P)*d inside a page
 * of H_p*2*P*d elements (the CPU backend's layout, kernels/tg_ops.h). The
 * CPU reference is tg_ops_cpu.kv_append with one token per sequence.
 *
 * Faults. A destination that does not exist is skipped (nothing written
 * for that (s, h)) and *fault is set to 1 when fault != NULL: t < 0 (an
 * empty row), row outside [0, n_rows), t / P at or past the row's id
 * slots (indptr[row + 1] - indptr[row]), a page id outside [0, n_pages)
 * (which also catches the -1 gaps of padded tables), or a head_group /
 * head_slot entry below 0 or a slot >= H_p. The flag is never cleared
 * here: the caller zeroes it and reads it when convenient (e.g. with the
 * step's results), so no synchronisation is needed per step.
 *
 * The caller guarantees what the kernel cannot know: head_group /
 * head_slot map the Hkv heads one-to-one onto (group, slot) pairs of this
 * layer (two heads in one slot would overwrite each other).
 *
 * Work decomposition: one warp per (s, h) item, four items per block,
 * one launch for the batch; lanes copy the K and V rows as 16-byte vectors
 * (8 bf16) when d % 8 == 0 and k, v and the pool are 16-byte aligned, as
 * single bf16 otherwise.
 *
 * The header is plain C (bf16 as uint16_t bits, streams as void *, NULL =
 * the default stream); the function exists only in CUDA builds
 * (TANGRAM_CUDA). It never allocates or synchronises, so it can be
 * captured in a CUDA graph.
 */
#ifndef TG_CUDA_DECODE_APPEND_H
#define TG_CUDA_DECODE_APPEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/decode_attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arguments of one layer's decode append. Every pointer is device memory
 * except the struct itself (read during the call only). */
struct tg_cuda_decode_append_args {
    const uint16_t *k, *v;     /* bf16 (n_seq, Hkv, d) packed: the new token */
    int n_seq;                 /* sequences in the batch (>= 0) */
    int n_kv_heads;            /* Hkv */
    int head_dim;              /* d */
    int heads_per_group;       /* H_p: slots per page */
    int page_size;             /* P: tokens per page */
    uint16_t *pool;            /* bf16 (n_pages, H_p, 2, P, d) */
    int64_t n_pages;           /* pages in the pool; ids must be below */
    const int32_t *head_group; /* (Hkv) group of each KV head */
    const int32_t *head_slot;  /* (Hkv) slot of each KV head in its pages */
    struct tg_cuda_kv_csr table; /* the layer's rows, lens incl. the token */
    int32_t *fault;            /* (1) or NULL: set to 1 on a skipped write */
    void *stream;              /* cudaStream_t; NULL = the default stream */
};

/* Queues the append of a->n_seq tokens on a->stream. Returns 0 (also for
 * n_seq == 0, which queues nothing), TG_EINVAL (a NULL pointer, a
 * non-positive size, n_seq * Hkv beyond the grid, or a batch whose rows
 * s * row_stride + row_offset cannot lie inside the table's n_rows; detail
 * in err) or TG_EDEVICE (launch error). Any thread; calls on one stream
 * are ordered. */
int tg_cuda_decode_append(const struct tg_cuda_decode_append_args *a,
                          char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_DECODE_APPEND_H */
