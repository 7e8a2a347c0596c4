// kv_csr.cuh — the decode block table (struct tg_cuda_kv_csr, decode_attn.h)
// as the decode kernels read it, written once for decode attention and the
// decode append: the row of a (sequence, group), the tokens a KV head
// holds, and the host's check of a table against a launch. The kernels
// take the table itself among their parameters (by value), never a copy
// of its fields.
#ifndef TG_CUDA_KV_CSR_CUH
#define TG_CUDA_KV_CSR_CUH

#include <cstddef>
#include <cstdint>

#include "common/base/tg_err.h"
#include "kernels/cuda/decode_attn.h"

// The table's row of group g of sequence s.
static __device__ __forceinline__ int64_t kv_csr_row(const tg_cuda_kv_csr &t,
                                                     int s, int g)
{
    return (int64_t)s * t.row_stride + t.row_offset + g;
}

// Tokens KV head h of sequence s holds: its own count with per-head
// lengths, else row_len (its row's count).
static __device__ __forceinline__ int64_t
kv_csr_head_len(const tg_cuda_kv_csr &t, int s, int h, int64_t row_len)
{
    return t.head_lens != nullptr
               ? (int64_t)
                     t.head_lens[(size_t)s * t.head_stride + t.head_offset + h]
               : row_len;
}

// Host: a launch over n_seq (>= 1) sequences that reads `span` rows from
// each sequence's first (a layer's groups, or the one row of a head's
// group) and n_heads heads of per-head lengths fits table t: rows
// (n_seq - 1) * row_stride + row_offset + [0, span) lie inside n_rows
// (row_stride >= span, row_offset >= 0), and per-head lengths' stride
// holds the heads past their offset. Returns 0 or TG_EINVAL naming `who`.
static inline int kv_csr_check(const tg_cuda_kv_csr *t, int n_seq, int span,
                               int n_heads, const char *who, char *err,
                               size_t errlen)
{
    if (t->row_stride < span || t->row_offset < 0 ||
        (int64_t)(n_seq - 1) * t->row_stride + t->row_offset + span >
            (int64_t)t->n_rows)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: %d sequences x stride %d + offset %d + %d "
                          "rows exceed the table's %d rows",
                          who, n_seq, t->row_stride, t->row_offset, span,
                          t->n_rows);
    if (t->head_lens != nullptr &&
        (t->head_offset < 0 || t->head_stride < t->head_offset + n_heads))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: head lengths with stride %d and offset %d "
                          "cannot hold %d heads",
                          who, t->head_stride, t->head_offset, n_heads);
    return 0;
}

#endif // TG_CUDA_KV_CSR_CUH
