/*
 * tt_kv.h — naive references of ragged paging's hot paths, for the tests
 * that check the product against them and the benchmark that times the
 * product beside them (bench-kv-table). They live here, not in
 * common/kv: nothing that serves needs them.
 *
 * Written from the contracts in common/kv (kv_seq.h, kv_table.h,
 * kv_budget.h) through the public structs, the straightforward way: one
 * kv_pool_pop per page, row after row; a CSR table appended page by page
 * with a bounds check. Each gives the state the product's path gives for
 * the same input (tests compare them field by field).
 *
 * One thread, like the objects they work on.
 */
#ifndef TT_KV_H
#define TT_KV_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"

/* kv_seq_reserve_prompt with one kv_pool_pop per page: same checks and
 * returns (0, TG_ENOSPC, TG_EINVAL, TG_ERANGE, TG_ENOMEM; nothing changes
 * on failure) and the same rows, counts and pool state on success. The
 * page-id slab is laid out its own way (a row's ids stay contiguous). */
int tt_kv_seq_reserve_prompt_plain(struct kv_seq *seq,
                                   const struct kv_layout *layout,
                                   struct kv_pool *pool, int64_t start_pos,
                                   int64_t n_new, char *err, size_t errlen);

/* kv_seq_reserve_decode the same way. */
int tt_kv_seq_reserve_decode_plain(struct kv_seq *seq,
                                   const struct kv_layout *layout,
                                   struct kv_pool *pool, int64_t n, char *err,
                                   size_t errlen);

/* A dense CSR block table built serially, page by page: what
 * kv_table_build gives (indptr, indices, npages, lens). */
struct tt_csr {
    int32_t n_seqs, rows_per_seq, n_rows;
    int64_t nnz;
    int32_t *indptr;  /* (n_rows + 1) */
    int32_t *indices; /* (nnz) */
    int32_t *npages;  /* (n_rows) */
    int32_t *lens;    /* (n_rows) */
    int64_t cap_rows, cap_slots;
};

/* Builds c (zeroed, or built before: its buffers are reused) for slots
 * seqs[0..n_seqs) of `layout`, a NULL slot giving empty rows. Returns 0,
 * TG_EINVAL (a seq of another layout, n_seqs < 0, seqs NULL with
 * n_seqs > 0), TG_ERANGE (over INT32_MAX pages) or TG_ENOMEM. */
int tt_csr_build(struct tt_csr *c, const struct kv_layout *layout,
                 const struct kv_seq *const *seqs, int32_t n_seqs, char *err,
                 size_t errlen);

void tt_csr_free(struct tt_csr *c);

#endif /* TT_KV_H */
