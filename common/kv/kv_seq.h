/*
 * kv_seq.h — one request's KV pages on one rank, per (layer, group)
 * (DESIGN.md §4.3, §4.5).
 *
 * A rank's ragged layout (struct kv_layout) has L layers of G groups of H_p
 * heads each; a page is [H_p][2][P][d] elements of one (layer, group). Row
 * r = l * G + g of a request holds the page ids of group (l, g) and two
 * token counts:
 *   tokens[r] — tokens reserved: everything the request will hold once the
 *               reserved turn's prefill is done (exact §4.3 math), plus
 *               decode tokens;
 *   filled[r] — tokens written so far (what attention may read).
 * Invariant: n_pages[r] == ceil(tokens[r] / P) at all times, so nothing is
 * ever reclaimed after compression except through explicit tail truncation.
 *
 * Life of a request: kv_seq_reserve_prompt at admission (one pool pop for
 * every row), kv_seq_commit as prefill chunks run, kv_seq_reserve_decode
 * before each decode step (a row takes a page exactly when its last page
 * is full), another kv_seq_reserve_prompt for the next turn (history stays,
 * the new turn is appended), kv_seq_release / kv_seq_free at the end (one
 * pool push). kv_seq_truncate_row releases a row's unused tail (GVote);
 * kv_seq_compact_rows gives back the tails decode-time compression
 * emptied (§4.9). kv_seq_fork makes a second sequence share a request's
 * full pages (parallel samples); a pool push then drops one owner of a
 * shared page.
 *
 * Page ids live in one slab per request, row r at ids[off[r] ..
 * off[r] + n_pages[r]) with spare capacity behind each row, so decode
 * growth appends in place and the block table copies each row with one
 * memcpy. (tests/support/tt_kv.h holds the naive one-pop-per-page
 * references the tests and bench-kv-table compare them with.)
 *
 * All functions: one thread per seq, and the pool's owner thread.
 */
#ifndef KV_SEQ_H
#define KV_SEQ_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_pool.h"



struct kv_seq {
    int32_t n_rows;      /* L * G of the layout it was made for */
    int32_t page_size;   /* P */
    int64_t pos;         /* absolute positions consumed: turns + decode */
    int64_t turn_start;  /* first position of the last reserved turn */
    int64_t turn_len;    /* its prompt tokens */
    int64_t committed;   /* its positions already written; its prefill is
                            done when committed == turn_len */
    int32_t *tokens;     /* (rows) tokens reserved per (l, g) */
    int32_t *filled;     /* (rows) tokens written per (l, g) */
    int32_t *n_pages;    /* (rows) pages held = ceil(tokens / P) */
    int32_t *cap;        /* (rows) id slots reserved per row in the slab */
    int64_t *off;        /* (rows) first slot of each row in ids */
    int32_t *ids;        /* (ids_cap) page ids, row by row */
    int64_t ids_cap;     /* slots in ids (>= sum of cap) */
    int32_t *extra;      /* (rows) scratch: pages a reservation adds */
    int32_t *add;        /* (rows) scratch: tokens a turn adds per row, or
                            the rows a decode step gives pages */
    int64_t used_pages;  /* sum of n_pages */
    int32_t max_tokens;  /* max over rows of tokens */
    int64_t mono_pages;  /* ceil(max_tokens / P) * rows: pages of an
                            all-heads layout, in H_p-head page units */
    uint64_t epoch;      /* renewed (from a process-wide counter) at init
                            and whenever held ids leave a row (release,
                            truncation); reservations only append, so a
                            table refreshed at the same epoch only needs
                            each row's new tail (kv_table_refresh) */
    int32_t n_heads;     /* L * Hkv when head_len is kept, else 0 */
    int32_t *head_len;   /* (L, Hkv) tokens held by each KV head of the
                            rank (layout head order), or NULL: see "per-head
                            lengths" below */
};

/* Initialises an empty `seq` for `layout`. Returns 0 or TG_ENOMEM (seq
 * zeroed then). The caller owns the storage of `seq`. */
int kv_seq_init(struct kv_seq *seq, const struct kv_layout *layout,
                char *err, size_t errlen);

/* Returns every page to `pool` in one push (the pool the pages came from;
 * NULL is allowed only when the seq holds no pages) and frees the seq's
 * memory. Safe on a zeroed or failed-init seq. */
void kv_seq_free(struct kv_seq *seq, struct kv_pool *pool);

/* Returns every page to `pool` in one push and empties the seq (positions
 * back to 0), keeping its buffers for the next request. Returns 0, or
 * TG_EINVAL when pool is NULL while pages are held or the pool rejects the
 * ids (not this pool's pages); the seq then still holds its pages. */
int kv_seq_release(struct kv_seq *seq, struct kv_pool *pool);

/* Admission control without side effects: stores in *pages the pages that
 * kv_seq_reserve_prompt(seq, layout, ., start_pos, n_new) would take.
 * `seq` may be NULL for a request that holds nothing yet. Returns 0 or
 * TG_EINVAL (bad positions or layout mismatch, detail in err). */
int kv_seq_prompt_pages(const struct kv_seq *seq,
                        const struct kv_layout *layout, int64_t start_pos,
                        int64_t n_new, int64_t *pages, char *err,
                        size_t errlen);

/* Reserves a new turn of `n_new` prompt tokens at absolute positions
 * [start_pos, start_pos + n_new): for every (l, g) the tokens kept by
 * §4.3 chunked compression, kv_turn_keep(start_pos, n_new, C, b[l][g],
 * rule), are added to what the row holds, and all extra pages of all rows
 * are taken in one pool pop. start_pos must be >= the positions already
 * consumed and the previous turn's prefill must be committed. All or
 * nothing: returns 0, TG_ENOSPC (pool too small), TG_EINVAL, TG_ERANGE
 * (row over INT32_MAX tokens) or TG_ENOMEM, and on failure neither the
 * seq's contents nor the pool change. */
int kv_seq_reserve_prompt(struct kv_seq *seq, const struct kv_layout *layout,
                          struct kv_pool *pool, int64_t start_pos,
                          int64_t n_new, char *err, size_t errlen);

/* Marks the next `n` positions of the reserved turn as written: each row's
 * filled count grows by what §4.3 keeps of them. n must end on a chunk
 * boundary of the turn (a multiple of C from the turn start) or at the end
 * of the turn; committing the whole turn at once is allowed. Returns 0 or
 * TG_EINVAL. */
int kv_seq_commit(struct kv_seq *seq, const struct kv_layout *layout,
                  int64_t n, char *err, size_t errlen);

/* kv_seq_commit for adaptive budgets (gvote, DESIGN.md §4.8 step 5): the
 * next n positions of the turn are written and row r now holds
 * filled_after[r] tokens, between what it held and what §4.3 keeps (its
 * reservation for the chunk). The rows' reservations shrink by what they
 * did not keep and every page no longer needed (beyond ceil(tokens / P),
 * tokens still covering the remaining chunks) goes back to `pool` at
 * once; *released gets their count. Same chunk rule as kv_seq_commit.
 * All or nothing: returns 0 or TG_EINVAL (nothing changed). */
int kv_seq_commit_kept(struct kv_seq *seq, const struct kv_layout *layout,
                       struct kv_pool *pool, int64_t n,
                       const int32_t *filled_after, int64_t *released,
                       char *err, size_t errlen);

/* Stores in *pages the pages kv_seq_reserve_decode(seq, layout, ., n)
 * would take: one for every row whose last page cannot hold the n new
 * tokens (more for n > P). No side effects. Returns 0 or TG_EINVAL. */
int kv_seq_decode_pages(const struct kv_seq *seq,
                        const struct kv_layout *layout, int64_t n,
                        int64_t *pages);

/* Appends `n` >= 1 uncompressed decode tokens to every row (tokens and
 * filled), taking the pages for rows whose last page fills in one pool
 * pop. Requires the turn's prefill to be committed. All or nothing:
 * returns 0, TG_ENOSPC, TG_EINVAL, TG_ERANGE or TG_ENOMEM. */
int kv_seq_reserve_decode(struct kv_seq *seq, const struct kv_layout *layout,
                          struct kv_pool *pool, int64_t n, char *err,
                          size_t errlen);

/* Shrinks row (l, g) to `tokens` reserved tokens (0 <= tokens <= current)
 * and returns its tail pages beyond ceil(tokens / P) to `pool` in one push:
 * the unused tail of a reservation, never scattered pages. filled is
 * clipped to tokens. Only once the turn's prefill is committed (GVote
 * truncates after its vote). Returns 0 or TG_EINVAL. */
int kv_seq_truncate_row(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int l, int g, int64_t tokens,
                        char *err, size_t errlen);

/* Pages kv_seq_fork(., src, ...) takes from the pool: one per row whose
 * reserved tokens end inside a page. No side effects. */
int64_t kv_seq_fork_pages(const struct kv_seq *src);

/* Makes the empty `dst` (initialised for the same layout, holding no
 * pages) a second owner of src's rows, as they stand once src's reserved
 * turn is committed (parallel samples, docs/API.md `n`): for every row,
 * the pages full of reserved tokens are shared (one more owner each,
 * kv_pool_ref), and a last page only partly covered by them is replaced in
 * dst by a fresh private page taken from `pool` (all in one pop), whose
 * content the worker copies from src's page. So neither sequence ever
 * writes into a shared page: decode appends into each one's own last page
 * or into pages taken later, and a next turn of either starts past the
 * shared pages. dst gets src's positions with its turn committed (filled
 * = tokens); src does not change. The router forks when it reserves src's
 * turn, before that turn runs; the worker copies once src's last chunk has
 * run. Either sequence may be released first; each gives back only its
 * ownerships. *private_pages (may be NULL) gets the pages taken. All or
 * nothing: returns 0, TG_ENOSPC (fewer free pages than kv_seq_fork_pages),
 * TG_EINVAL (dst not empty, layouts differ) or TG_ENOMEM. */
int kv_seq_fork(struct kv_seq *dst, const struct kv_seq *src,
                const struct kv_layout *layout, struct kv_pool *pool,
                int64_t *private_pages, char *err, size_t errlen);

/* Decode-phase shrink of decode-time compression (DESIGN.md §4.9): the
 * rows were compacted in place (survivors slid forward, order kept) and
 * row r now fills filled_after[r] <= filled[r] tokens (L * G values,
 * layer-major). Each row's reservation shrinks by what it lost, and every
 * page beyond ceil(tokens / P) goes back to `pool`: pages freed = pages
 * no longer filled (nothing reserved and unwritten is given up). Only
 * with no prefill pending. *released gets the count. All or nothing:
 * returns 0 or TG_EINVAL (nothing changed). */
int kv_seq_compact_rows(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, const int32_t *filled_after,
                        int64_t *released, char *err, size_t errlen);

/* Returns the page ids of row (l, g) (count in *n_pages), borrowed from the
 * seq until its next reservation, truncation or release. */
const int32_t *kv_seq_row_ids(const struct kv_seq *seq,
                              const struct kv_layout *layout, int l, int g,
                              int32_t *n_pages);

/* Rewinds the sequence to an earlier turn boundary: position `pos`
 * (<= seq->pos) with row_tokens[r] (<= the row's tokens) tokens per row
 * (L * G values, layer-major) — the state it had right after that turn's
 * prefill. Tail pages beyond ceil(row_tokens / P) go back to `pool` in one
 * push per row; written counts follow. Used by multi-turn reuse when a
 * conversation keeps the prompt but not the generated answer. Only with no
 * prefill pending. Returns 0 or TG_EINVAL (nothing changed). */
int kv_seq_rewind(struct kv_seq *seq, const struct kv_layout *layout,
                  struct kv_pool *pool, int64_t pos, const int32_t *row_tokens,
                  char *err, size_t errlen);

const int32_t *kv_seq_row_ids(const struct kv_seq *seq,
                              const struct kv_layout *layout, int l, int g,
                              int32_t *n_pages);

/* ---- per-head lengths (adaptive methods) -------------------------------
 * A method whose heads keep counts the router cannot predict (gvote's
 * votes, DESIGN.md §4.8; decode-time compaction, §4.9) needs each head's
 * length, not only its row's: head_len[l * Hkv + h] for the rank's local
 * head h (kv_layout.head_group maps it to its row). The row's filled count
 * is then its longest head's (a head appends at its own end, so a shorter
 * head leaves unused slots at the row's tail only). Only such requests pay
 * for the array (kv_seq_heads_enable). Once enabled, the functions above
 * keep it in step: kv_seq_commit adds the §4.3 keep to every head (the
 * predicted case), a decode token adds one to every head, release and
 * clear zero it, free frees it. kv_seq_commit_kept and kv_seq_rewind refuse
 * a seq with heads (their row counts cannot say which head kept what):
 * kv_seq_commit_heads and kv_seq_rewind_heads take the heads instead. */

/* Gives `seq` per-head lengths for `layout` (which must carry its head
 * maps, kv_layout_from_profile), every head set to its row's filled count.
 * A no-op when already enabled. Returns 0, TG_EINVAL (no head maps, layout
 * mismatch) or TG_ENOMEM (nothing changed). */
int kv_seq_heads_enable(struct kv_seq *seq, const struct kv_layout *layout,
                        char *err, size_t errlen);

/* Sets every head of a seq with heads (enabled for `layout`) to its row's
 * filled count: the state of rows filled whole (a worker adopting KV that
 * was kept by rows). */
void kv_seq_heads_from_rows(struct kv_seq *seq, const struct kv_layout *layout);

/* Stores in row_max[r] (L * G values) the longest of head_len's heads of
 * row r (0 for a row without heads) under `layout`'s head maps. Pure; the
 * one place that turns head lengths into row lengths, for the router's
 * accounting and a worker's checks alike. */
void kv_heads_row_max(const struct kv_layout *layout, const int32_t *head_len,
                      int32_t *row_max);

/* Checks, without side effects, that the next `n` positions of the turn
 * may leave the heads at head_after (n_heads values, L * Hkv): the count
 * matches, every head holds at least what it held and at most that plus
 * its row's §4.3 keep for those positions (its reservation), and n ends on
 * a chunk boundary or the turn. Returns 0 or TG_EINVAL naming the head. */
int kv_seq_heads_fit(const struct kv_seq *seq, const struct kv_layout *layout,
                     int64_t n, const int32_t *head_after, int64_t n_heads,
                     char *err, size_t errlen);

/* kv_seq_commit for a seq with heads whose chunk kept head_after (checked
 * as kv_seq_heads_fit): every row's filled count becomes its longest
 * head's, and the pages its reservation no longer needs go back to `pool`
 * at once by kv_seq_commit_kept's rule (a row keeps ceil((filled + tokens
 * still reserved) / P) pages); *released gets their count. All or
 * nothing: returns 0 or TG_EINVAL (nothing changed). */
int kv_seq_commit_heads(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int64_t n,
                        const int32_t *head_after, int64_t n_heads,
                        int64_t *released, char *err, size_t errlen);

/* kv_seq_rewind for a seq with heads: head_tokens (n_heads values) are the
 * heads' lengths at the boundary (each at most what the head holds), and
 * row_tokens[r] must be the longest of its heads. A seq without heads
 * takes head_tokens NULL (plain kv_seq_rewind). Returns 0 or TG_EINVAL
 * (nothing changed). */
int kv_seq_rewind_heads(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int64_t pos,
                        const int32_t *row_tokens, const int32_t *head_tokens,
                        char *err, size_t errlen);

/* kv_seq_compact_rows for a seq with heads (decode-time compression,
 * DESIGN.md §4.9): every head now holds head_after[h] tokens (n_heads
 * values, each between 0 and what it holds), every row its longest head,
 * and the pages no longer filled go back to `pool` at once (*released).
 * Only with no prefill pending. All or nothing: returns 0 or TG_EINVAL
 * (nothing changed). */
int kv_seq_compact_heads(struct kv_seq *seq, const struct kv_layout *layout,
                         struct kv_pool *pool, const int32_t *head_after,
                         int64_t n_heads, int64_t *released, char *err,
                         size_t errlen);

/* Gives dst, just forked from src (kv_seq_fork) while src's turn is
 * reserved and not yet committed, per-head lengths: each head holds what
 * its source head will hold once that turn commits as predicted (its
 * row's §4.3 keep added). src must keep heads. Returns 0, TG_EINVAL or
 * TG_ENOMEM. */
int kv_seq_fork_heads(struct kv_seq *dst, const struct kv_seq *src,
                      const struct kv_layout *layout, char *err,
                      size_t errlen);

/* ---- moving a sequence between pools (the host tier, DESIGN.md §4.10) --
 * A stored conversation moves whole between the device pool of its rank
 * and that rank's host tier, which the router counts as a second kv_pool
 * of host page ids: the seq keeps its rows, counts and heads, and only the
 * ids in its slab change pool. */

/* Takes seq->used_pages pages from `to` in one pop and puts them in the
 * slab in place of the ids it holds, row by row (row 0's pages first, each
 * row in order); those old ids go to old_ids[0 .. used_pages) in the same
 * order, so page i of the sequence was old_ids[i] and is now new_ids[i]
 * (new_ids may be NULL). The old ids stay taken in `from`: the caller
 * gives them back (kv_pool_push) once their content was copied. The
 * monolithic count moves from `from` to `to` and the epoch is renewed.
 * Only with no prefill pending. All or nothing: returns 0, TG_ENOSPC
 * (fewer free pages in `to`) or TG_EINVAL (nothing changed). */
int kv_seq_move_pages(struct kv_seq *seq, struct kv_pool *from,
                      struct kv_pool *to, int32_t *old_ids, int32_t *new_ids,
                      char *err, size_t errlen);

/* ---- a worker's mirror of the router's rows ---------------------------
 * A worker does not reserve: the router hands it page ids row by row (the
 * BatchPlan's page deltas). These three keep the same slab, counts and
 * epoch rules without a pool, so block tables (kv_table) and the forward
 * passes read a worker's rows exactly as they read the router's. A row
 * filled this way reserves whole pages (tokens[r] = n_pages[r] * P); such
 * a seq is for reading, not for kv_seq_reserve_* (mono_pages and
 * max_tokens are not kept). */

/* Appends n page ids to row `row` (the slab grows as for a reservation).
 * The epoch stays: ids only appended. Returns 0, TG_EINVAL (row out of
 * range, n < 0) or TG_ENOMEM (nothing changed). */
int kv_seq_row_append(struct kv_seq *seq, int32_t row, const int32_t *ids,
                      int32_t n);

/* Cuts row `row` to its first n_pages pages (no pool: the ids are the
 * router's to reuse); filled[row] is clamped to what they hold. A cut that
 * drops ids renews the epoch. Returns 0 or TG_EINVAL (row out of range, or
 * n_pages above what the row holds). */
int kv_seq_row_cut(struct kv_seq *seq, int32_t row, int32_t n_pages);

/* Empties every row without a pool (a worker's slot freed or started
 * afresh) and renews the epoch; positions and the turn go back to 0. */
void kv_seq_clear(struct kv_seq *seq);

#endif /* KV_SEQ_H */
