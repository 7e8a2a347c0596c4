/*
 * kv_table.h — the CSR block table of a batch on one rank (DESIGN.md §4.5).
 *
 * Rows are (request slot b, layer l, group g) with r = (b * L + l) * G + g,
 * i.e. slot b's rows are its kv_seq rows in order. Row r owns the id slots
 * indices[indptr[r] .. indptr[r + 1]); its pages are the first npages[r]
 * of them, in token order, and lens[r] is the tokens written in it (the
 * kv_seq filled count). Token t of row r lives in page
 * indices[indptr[r] + t / P] at slot t % P.
 *
 * Two shapes of the same structure:
 *  - dense (kv_table_build): no gaps, npages[r] == indptr[r+1] - indptr[r]
 *    and indptr[n_rows] == nnz: plain CSR. Built with a serial prefix over
 *    the requests' page totals, OpenMP over requests for offsets and
 *    lengths (pass 1) and OpenMP over rows for the ids, one contiguous
 *    memcpy per (layer, group) row (pass 2).
 *  - padded (kv_table_build_padded): every row gets `slack` spare slots
 *    (filled with -1) behind its pages, so kv_table_refresh can bring the
 *    table up to date after decode steps or a new turn by copying only
 *    each row's new tail ids and the lengths: O(rows + new pages) per step
 *    instead of O(all pages). A consumer reads ceil(len / P) pages of a row
 *    (plus the page of the next append), never the gaps.
 * Rebuilding a big dense table every step is memory-bound (every id read
 * and written: ~140 MB for 256 requests x 32 layers x 8 groups at a 32K
 * context); the padded table is the per-step path, the dense one suits a
 * new batch and compact uploads.
 *
 * The CUDA decode path keeps a device copy of a padded table in step with
 * it (kernels/cuda/kv_table_dev.h, gpu_worker/gw_cuda_step.c): it builds
 * from the worker's slots (kv_seqs mirroring the router's rows, see
 * kv_seq.h), with kv_table_set_rows giving lengths that include the token
 * being appended and padding slots (batches padded to a CUDA graph's
 * bucket) one scratch page each, and kv_table_track listing the id
 * positions a refresh wrote in place, so a step uploads the O(rows)
 * counts and scatters only those ids.
 *
 * (tests/support/tt_kv.h holds the naive serial per-page build the tests
 * and bench-kv-table compare kv_table_build with.)
 *
 * Buffers only grow, geometrically, so a steady batch never allocates.
 * A table is used by one thread at a time; builds use OpenMP inside.
 */
#ifndef KV_TABLE_H
#define KV_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_seq.h"

struct kv_table {
    int32_t n_seqs;       /* request slots in the batch */
    int32_t rows_per_seq; /* L * G */
    int32_t n_rows;       /* n_seqs * rows_per_seq */
    int32_t page_size;    /* P, tokens per page */
    int32_t slack;        /* spare id slots per row; 0 = dense CSR */
    int64_t nnz;          /* pages in the table, <= INT32_MAX */
    int64_t n_slots;      /* indptr[n_rows] = nnz + gaps */
    int32_t *indptr;      /* (n_rows + 1) first slot of each row */
    int32_t *indices;     /* (n_slots) page ids; -1 in gaps */
    int32_t *npages;      /* (n_rows) pages in each row */
    int32_t *lens;        /* (n_rows) tokens written per row */
    int64_t cap_rows;     /* rows indptr / npages / lens can hold */
    int64_t cap_slots;    /* ids indices can hold */
    int64_t *seq_base;    /* (cap_seqs + 1) scratch: first slot per request */
    const struct kv_seq **slot_seq; /* (cap_seqs) seq each slot was built
                                       from (borrowed, compared only) */
    uint64_t *slot_epoch; /* (cap_seqs) its epoch at that time */
    int64_t cap_seqs;     /* slots the three arrays above can hold */
    int64_t n_builds;     /* full builds so far (refresh statistics) */
    /* What rows say (kv_table_set_rows). */
    int32_t len_bias;     /* added to every real row's length */
    int32_t has_pad;      /* 1: an empty slot's rows hold the one page
                             pad_page with one token; 0 (zeroed): empty */
    int32_t pad_page;
    /* Device mirrors (kv_table_track). */
    int track;            /* record what refreshes write */
    int stale;            /* the next refresh must rebuild */
    int rebuilt;          /* the last build or refresh rebuilt the table:
                             a mirror must take all of it */
    int64_t n_dirty;      /* positions of indices[] the last in-place
                             refresh wrote */
    int32_t *dirty;       /* (n_dirty) */
    int64_t cap_dirty;
    /* Scratch of a tracked refresh, each with its own capacity: the page
     * counts before it (cap_prev >= n_rows) and the slots it laid out
     * again (cap_moved >= n_seqs). */
    int32_t *prev_npages;
    int64_t cap_prev;
    uint8_t *slot_moved;
    int64_t cap_moved;
};

/* Initialises an empty table with room for `rows` rows and `slots` page
 * ids (0 and 0 are fine: buffers then grow on the first build). Returns 0,
 * TG_EINVAL or TG_ENOMEM (table zeroed). The caller owns `table`. */
int kv_table_init(struct kv_table *table, int64_t rows, int64_t slots,
                  char *err, size_t errlen);

/* Sets what the rows of the following builds and refreshes say: lengths
 * are the seq's filled counts plus len_bias (>= 0; a decode table counts
 * the token its step appends), and a NULL slot's rows hold the one page
 * pad_page with one token when pad_page >= 0 (else they are empty). A
 * change forces the next refresh to rebuild. Returns 0 or TG_EINVAL. */
int kv_table_set_rows(struct kv_table *table, int32_t len_bias,
                      int32_t pad_page);

/* Turns recording on or off: after each build or refresh, `rebuilt` says
 * whether the whole table was laid out anew, and otherwise dirty[0 ..
 * n_dirty) lists every position of indices[] the refresh wrote (appended
 * ids, and every id of a slot laid out again in its region), so a copy
 * elsewhere (a GPU's) stays equal to the table by taking indptr, npages
 * and lens (O(rows)) and those ids. Returns 0 or TG_ENOMEM. */
int kv_table_track(struct kv_table *table, int on);

/* Makes the next refresh rebuild (a device copy could not be updated, say,
 * so neither table nor copy can be trusted to match the last layout). */
void kv_table_invalidate(struct kv_table *table);

/* Frees the buffers. Safe on a zeroed or failed-init table. */
void kv_table_free(struct kv_table *table);

/* Rebuilds the table dense for slots seqs[0..n_seqs) of `layout`; a NULL
 * slot gives empty rows. Every seq must have been made for `layout`. The
 * seqs are only read (concurrent readers are fine; no writer). Returns 0,
 * TG_EINVAL (layout mismatch, n_seqs < 0), TG_ERANGE (more than INT32_MAX
 * slots or rows) or TG_ENOMEM; on failure the table reads as an empty
 * batch (n_rows = 0) and stays valid to rebuild, refresh or free. */
int kv_table_build(struct kv_table *table, const struct kv_layout *layout,
                   const struct kv_seq *const *seqs, int32_t n_seqs,
                   char *err, size_t errlen);

/* Like kv_table_build, with `slack` >= 0 spare slots behind every row so
 * that kv_table_refresh can append in place. Same returns. */
int kv_table_build_padded(struct kv_table *table,
                          const struct kv_layout *layout,
                          const struct kv_seq *const *seqs, int32_t n_seqs,
                          int32_t slack, char *err, size_t errlen);

/* Brings a padded table up to date with seqs[0..n_seqs) after
 * reservations, releases and slot changes, touching only what changed:
 *  - a slot holding the same seq at the same epoch as at its last layout
 *    (it only appended pages since) gets each row's new tail ids, page
 *    counts and lengths written in place;
 *  - a slot whose seq or epoch changed (another request, a release or a
 *    truncation) is laid out again inside its own region when its pages
 *    plus slack fit there;
 *  - anything else (a row outgrowing its slack, a slot outgrowing its
 *    region, another slot count or layout, a dense table) rebuilds the
 *    whole table with its current slack (n_builds counts rebuilds).
 * Either way every row's pages, count and length equal a fresh build's.
 * Same returns as kv_table_build. */
int kv_table_refresh(struct kv_table *table, const struct kv_layout *layout,
                     const struct kv_seq *const *seqs, int32_t n_seqs,
                     char *err, size_t errlen);

/* Resolves token `token` of row `row` to its page id and slot in the page
 * (the CPU reference of the device lookup). Any token below the row's
 * page capacity (npages * P) resolves, so the next append position does
 * too. Returns 0, or TG_ERANGE for a row or token out of range. */
int kv_table_resolve(const struct kv_table *table, int32_t row, int32_t token,
                     int32_t *page, int32_t *slot);

/* Resolves n queries (rows[i], tokens[i]) like kv_table_resolve, writing
 * -1 to page[i] and slot[i] for a query out of range: the CPU reference of
 * the device lookup (kernels/cuda/kv_table_dev.h). */
void kv_table_resolve_batch(const struct kv_table *table, int32_t n,
                            const int32_t *rows, const int32_t *tokens,
                            int32_t *page, int32_t *slot);

#endif /* KV_TABLE_H */
