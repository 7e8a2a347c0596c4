/* kv_seq.c — one request's pages per (layer, group): reservation at
 * admission, prefill commits, decode growth, tail truncation and release
 * (see kv_seq.h). */
#include "common/kv/kv_seq.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_seq_internal.h"
#include "common/base/tg_err.h"

#define ROWS_MAX (1 << 24)

/* Epochs come from one process-wide counter, so a (seq address, epoch)
 * pair never repeats, even for a seq freed and initialised again at the
 * same address; a table can then trust that pair (kv_table_refresh). */
static _Atomic uint64_t epoch_source;

static uint64_t next_epoch(void)
{
    return atomic_fetch_add(&epoch_source, 1) + 1;
}

uint64_t kv_seq__next_epoch(void)
{
    return next_epoch();
}


/* ---- helpers -------------------------------------------------------- */

/* kv_turn_keep (kv_budget.c) with the middle of the turn in closed form:
 * a chunk that holds no sink keeps the same count wherever it sits, so
 * only the chunks starting below n_sink and the short last chunk are
 * computed one by one. O(n_sink / C + 1) instead of O(n_new / C); the unit
 * tests check it against kv_turn_keep. */
int64_t kv_seq__turn_keep(int64_t start, int64_t n_new, int64_t chunk,
                          double budget, const struct kv_forced_rule *rule)
{
    if (n_new <= 0)
        return 0;
    if (budget >= 1.0)
        return n_new;
    int64_t kept = 0, off = 0;
    while (off < n_new && start + off < rule->n_sink) {
        int64_t n = n_new - off < chunk ? n_new - off : chunk;
        kept += kv_chunk_keep(n, budget, kv_chunk_forced(start + off, n, rule));
        off += n;
    }
    int64_t rest = n_new - off;
    int64_t full = rest / chunk;
    if (full > 0)
        kept += full * kv_chunk_keep(chunk, budget,
                                     kv_chunk_forced(start + off, chunk, rule));
    int64_t tail = rest - full * chunk;
    if (tail > 0)
        kept += kv_chunk_keep(tail, budget,
                              kv_chunk_forced(start + off + full * chunk, tail,
                                              rule));
    return kept;
}

static int32_t pages_for(int64_t tokens, int32_t page_size)
{
    return (int32_t)kv_pages_for(tokens, page_size);
}

static int check_layout(const struct kv_seq *seq,
                        const struct kv_layout *layout, char *err,
                        size_t errlen)
{
    if (seq->n_rows != layout->n_layers * layout->n_groups ||
        seq->page_size != layout->page_size)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: made for %d rows of %d-token pages, used "
                          "with a layout of %d x %d rows of %d-token pages",
                          (int)seq->n_rows, (int)seq->page_size,
                          layout->n_layers, layout->n_groups,
                          layout->page_size);
    return 0;
}

static int prefill_pending(const struct kv_seq *seq)
{
    return seq->committed < seq->turn_len;
}

/* Sets mono_pages from max_tokens and moves the pool's aggregate along. */
static void update_mono(struct kv_seq *seq, struct kv_pool *pool)
{
    int64_t mono = kv_pages_for(seq->max_tokens, seq->page_size) *
                   (int64_t)seq->n_rows;
    pool->mono_pages += mono - seq->mono_pages;
    seq->mono_pages = mono;
}

static void recompute_max(struct kv_seq *seq)
{
    int32_t m = 0;
    for (int32_t r = 0; r < seq->n_rows; r++)
        m = seq->tokens[r] > m ? seq->tokens[r] : m;
    seq->max_tokens = m;
}

/* Makes room for extra[r] more ids behind every row. When some row lacks
 * room, the slab is rebuilt with every row given the same headroom of
 * 4 + 1/32 of the longest row: decode grows all rows alike, so equal
 * headroom delays the next rebuild for all of them (about 1,000 decode
 * tokens at a 32K context with P = 16), and tying it to the longest row
 * keeps rebuilds rarer as a conversation grows while wasting at most a few
 * percent of the slab (ids are 4 bytes per P tokens of KV). */
static int relayout(struct kv_seq *seq)
{
    int32_t rows = seq->n_rows;
    int64_t max_need = 0;
    for (int32_t r = 0; r < rows; r++) {
        int64_t need = (int64_t)seq->n_pages[r] + seq->extra[r];
        max_need = need > max_need ? need : max_need;
    }
    int64_t head = 4 + max_need / 32;
    if (max_need + head > INT32_MAX)
        head = INT32_MAX - max_need;
    int64_t total = 0;
    for (int32_t r = 0; r < rows; r++)
        total += (int64_t)seq->n_pages[r] + seq->extra[r] + head;
    if (seq->used_pages == 0 && total <= seq->ids_cap) {
        /* Empty (a released seq taking its next request): re-partition
         * the slab it already has. */
        int64_t off = 0;
        for (int32_t r = 0; r < rows; r++) {
            seq->off[r] = off;
            seq->cap[r] = (int32_t)(seq->extra[r] + head);
            off += seq->cap[r];
        }
        return 0;
    }
    int32_t *ids = malloc((size_t)total * sizeof(int32_t));
    if (ids == NULL)
        return TG_ENOMEM;
    /* Writing the whole slab now (ids, then -1 in the spare slots) takes
     * its page faults at admission instead of in later decode steps. */
    int64_t off = 0;
    for (int32_t r = 0; r < rows; r++) {
        if (seq->n_pages[r] > 0)
            memcpy(ids + off, seq->ids + seq->off[r],
                   (size_t)seq->n_pages[r] * sizeof(int32_t));
        memset(ids + off + seq->n_pages[r], 0xff,
               (size_t)(seq->extra[r] + head) * sizeof(int32_t));
        seq->off[r] = off;
        seq->cap[r] = (int32_t)(seq->n_pages[r] + seq->extra[r] + head);
        off += seq->cap[r];
    }
    free(seq->ids);
    seq->ids = ids;
    seq->ids_cap = total;
    return 0;
}

static int ensure_room(struct kv_seq *seq)
{
    for (int32_t r = 0; r < seq->n_rows; r++)
        if (seq->n_pages[r] + seq->extra[r] > seq->cap[r])
            return relayout(seq);
    return 0;
}

/* ---- life cycle ----------------------------------------------------- */

int kv_seq_init(struct kv_seq *seq, const struct kv_layout *layout,
                char *err, size_t errlen)
{
    memset(seq, 0, sizeof(*seq));
    size_t rows = (size_t)layout->n_layers * (size_t)layout->n_groups;
    if (rows < 1 || rows > ROWS_MAX || layout->page_size < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: layout is not initialised");
    if ((seq->tokens = calloc(rows, sizeof(int32_t))) == NULL)
        goto oom;
    if ((seq->filled = calloc(rows, sizeof(int32_t))) == NULL)
        goto oom;
    if ((seq->n_pages = calloc(rows, sizeof(int32_t))) == NULL)
        goto oom;
    if ((seq->cap = calloc(rows, sizeof(int32_t))) == NULL)
        goto oom;
    if ((seq->off = calloc(rows, sizeof(int64_t))) == NULL)
        goto oom;
    if ((seq->extra = calloc(rows, sizeof(int32_t))) == NULL)
        goto oom;
    if ((seq->add = calloc(rows, sizeof(int32_t))) == NULL)
        goto oom;
    seq->n_rows = (int32_t)rows;
    seq->page_size = layout->page_size;
    seq->epoch = next_epoch();
    return 0;
oom:
    kv_seq_free(seq, NULL);
    return tg_err_set(err, errlen, TG_ENOMEM,
                      "kv_seq: cannot allocate %zu rows", rows);
}

int kv_seq_release(struct kv_seq *seq, struct kv_pool *pool)
{
    if (seq->used_pages > 0) {
        if (pool == NULL)
            return TG_EINVAL;
        /* Compact the rows to the front of the slab, then give everything
         * back with one push. The compacted layout stays valid (caps =
         * counts) even if the pool rejects the ids. */
        int64_t w = 0;
        for (int32_t r = 0; r < seq->n_rows; r++) {
            if (seq->n_pages[r] > 0 && seq->off[r] != w)
                memmove(seq->ids + w, seq->ids + seq->off[r],
                        (size_t)seq->n_pages[r] * sizeof(int32_t));
            seq->off[r] = w;
            seq->cap[r] = seq->n_pages[r];
            w += seq->n_pages[r];
        }
        if (w > INT32_MAX)
            return TG_EINVAL;
        int rc = kv_pool_push(pool, (int32_t)w, seq->ids);
        if (rc != 0)
            return rc;
    }
    if (pool != NULL)
        pool->mono_pages -= seq->mono_pages;
    kv_seq_clear(seq);
    /* No room anywhere: the next reservation re-partitions the slab with
     * fresh headroom (ensure_room). */
    if (seq->n_rows > 0)
        memset(seq->cap, 0, (size_t)seq->n_rows * sizeof(int32_t));
    return 0;
}

void kv_seq_free(struct kv_seq *seq, struct kv_pool *pool)
{
    TG_ASSERT(pool != NULL || seq->used_pages == 0);
    if (pool != NULL)
        (void)kv_seq_release(seq, pool);
    free(seq->tokens);
    free(seq->filled);
    free(seq->n_pages);
    free(seq->cap);
    free(seq->off);
    free(seq->ids);
    free(seq->extra);
    free(seq->add);
    free(seq->head_len);
    memset(seq, 0, sizeof(*seq));
}

/* ---- prompt reservation --------------------------------------------- */

static int check_turn(const struct kv_seq *seq, const struct kv_layout *layout,
                      int64_t start_pos, int64_t n_new, char *err,
                      size_t errlen)
{
    if (start_pos < 0 || n_new < 0 || n_new > INT64_MAX / 2 - start_pos)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: turn at %lld of %lld tokens is invalid",
                          (long long)start_pos, (long long)n_new);
    if (seq == NULL)
        return 0;
    int rc = check_layout(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (start_pos < seq->pos)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: turn starts at %lld but %lld positions are "
                          "already held", (long long)start_pos,
                          (long long)seq->pos);
    if (prefill_pending(seq))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: previous turn has %lld tokens not committed",
                          (long long)(seq->turn_len - seq->committed));
    return 0;
}

/* For every row: the tokens the turn adds (into add[] when non-NULL) and
 * the pages that takes beyond what the row holds (extra[] when non-NULL);
 * their sum goes to *pages. */
static int plan_prompt(const struct kv_seq *seq, const struct kv_layout *layout,
                       int64_t start_pos, int64_t n_new, int32_t *add,
                       int32_t *extra, int64_t *pages, char *err,
                       size_t errlen)
{
    int32_t rows = layout->n_layers * layout->n_groups;
    int32_t P = layout->page_size;
    int64_t total = 0;
    for (int32_t r = 0; r < rows; r++) {
        int64_t keep = kv_seq__turn_keep(start_pos, n_new,
                                         layout->prefill_chunk,
                                         layout->group_budget[r],
                                         &layout->rule);
        int64_t held = seq != NULL ? seq->tokens[r] : 0;
        if (held + keep > INT32_MAX)
            return tg_err_set(err, errlen, TG_ERANGE,
                              "kv_seq: row %d would hold %lld tokens",
                              (int)r, (long long)(held + keep));
        int32_t more = pages_for(held + keep, P) - pages_for(held, P);
        total += more;
        if (add != NULL)
            add[r] = (int32_t)keep;
        if (extra != NULL)
            extra[r] = more;
    }
    *pages = total;
    return 0;
}

int kv_seq_prompt_pages(const struct kv_seq *seq,
                        const struct kv_layout *layout, int64_t start_pos,
                        int64_t n_new, int64_t *pages, char *err,
                        size_t errlen)
{
    *pages = 0;
    int rc = check_turn(seq, layout, start_pos, n_new, err, errlen);
    if (rc != 0)
        return rc;
    return plan_prompt(seq, layout, start_pos, n_new, NULL, NULL, pages, err,
                       errlen);
}

/* Bookkeeping shared by the prompt paths once the ids are in place. */
static void finish_prompt(struct kv_seq *seq, struct kv_pool *pool,
                          int64_t start_pos, int64_t n_new, int64_t pages)
{
    int32_t m = 0;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        seq->tokens[r] += seq->add[r];
        m = seq->tokens[r] > m ? seq->tokens[r] : m;
    }
    seq->max_tokens = m;
    seq->used_pages += pages;
    seq->turn_start = start_pos;
    seq->turn_len = n_new;
    seq->committed = 0;
    seq->pos = start_pos + n_new;
    update_mono(seq, pool);
}

static int prepare_prompt(struct kv_seq *seq, const struct kv_layout *layout,
                          struct kv_pool *pool, int64_t start_pos,
                          int64_t n_new, int64_t *pages, char *err,
                          size_t errlen)
{
    int rc = check_turn(seq, layout, start_pos, n_new, err, errlen);
    if (rc != 0)
        return rc;
    rc = plan_prompt(seq, layout, start_pos, n_new, seq->add, seq->extra,
                     pages, err, errlen);
    if (rc != 0)
        return rc;
    if (*pages > pool->n_free)
        return tg_err_set(err, errlen, TG_ENOSPC,
                          "kv_seq: turn needs %lld pages, %d free",
                          (long long)*pages, (int)pool->n_free);
    if (ensure_room(seq) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_seq: cannot grow the page-id slab");
    return 0;
}

int kv_seq_reserve_prompt(struct kv_seq *seq, const struct kv_layout *layout,
                          struct kv_pool *pool, int64_t start_pos,
                          int64_t n_new, char *err, size_t errlen)
{
    int64_t pages = 0;
    int rc = prepare_prompt(seq, layout, pool, start_pos, n_new, &pages, err,
                            errlen);
    if (rc != 0)
        return rc;
    const int32_t *src = kv_pool_pop_view(pool, (int32_t)pages);
    TG_ASSERT(src != NULL); /* checked against n_free above */
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int32_t k = seq->extra[r];
        if (k == 0)
            continue;
        memcpy(seq->ids + seq->off[r] + seq->n_pages[r], src,
               (size_t)k * sizeof(int32_t));
        src += k;
        seq->n_pages[r] += k;
    }
    finish_prompt(seq, pool, start_pos, n_new, pages);
    return 0;
}

int kv_seq__check_commit(const struct kv_seq *seq,
                         const struct kv_layout *layout, int64_t n,
                         char *err, size_t errlen)
{
    int64_t left = seq->turn_len - seq->committed;
    int64_t C = layout->prefill_chunk;
    if (n < 1 || n > left)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: cannot commit %lld tokens, %lld pending",
                          (long long)n, (long long)left);
    if ((seq->committed + n) % C != 0 && n != left)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: commit of %lld tokens at turn offset %lld "
                          "does not end on a %lld-token chunk boundary",
                          (long long)n, (long long)seq->committed,
                          (long long)C);
    return 0;
}

/* Shrinks row r's reservation to `tokens` (<= what it reserves) and gives
 * its pages beyond ceil(tokens / P) back to `pool` in one push; *shrank is
 * set when the row was the longest (max_tokens must be recomputed).
 * Returns the pages given back. The caller ends with shrink_done. */
static int32_t row_shrink(struct kv_seq *seq, struct kv_pool *pool,
                          int32_t r, int32_t tokens, int *shrank)
{
    if (seq->tokens[r] == seq->max_tokens)
        *shrank = 1;
    seq->tokens[r] = tokens;
    int32_t keep_pages = pages_for(tokens, seq->page_size);
    int32_t drop = seq->n_pages[r] - keep_pages;
    if (drop <= 0)
        return 0;
    int rc = kv_pool_push(pool, drop, seq->ids + seq->off[r] + keep_pages);
    /* The ids came from this pool: a rejection is a broken invariant. */
    TG_ASSERT(rc == 0);
    (void)rc;
    seq->n_pages[r] = keep_pages;
    seq->used_pages -= drop;
    return drop;
}

/* After row_shrink calls: a new epoch when held ids left (block tables
 * must rebuild), max_tokens and the pool's monolithic count again. */
static void shrink_done(struct kv_seq *seq, struct kv_pool *pool,
                        int64_t freed, int shrank)
{
    if (freed > 0)
        seq->epoch = next_epoch();
    if (shrank)
        recompute_max(seq);
    update_mono(seq, pool);
}

int kv_seq_commit(struct kv_seq *seq, const struct kv_layout *layout,
                  int64_t n, char *err, size_t errlen)
{
    int rc = check_layout(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if ((rc = kv_seq__check_commit(seq, layout, n, err, errlen)) != 0)
        return rc;
    int64_t C = layout->prefill_chunk;
    int64_t at = seq->turn_start + seq->committed;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int64_t keep = kv_seq__turn_keep(at, n, C, layout->group_budget[r],
                                 &layout->rule);
        seq->filled[r] += (int32_t)keep;
        /* The reservation already counted these tokens. */
        TG_ASSERT(seq->filled[r] <= seq->tokens[r]);
    }
    if (seq->head_len != NULL)
        kv_seq__heads_commit(seq, layout, at, n);
    seq->committed += n;
    return 0;
}

int kv_seq_commit_kept(struct kv_seq *seq, const struct kv_layout *layout,
                       struct kv_pool *pool, int64_t n,
                       const int32_t *filled_after, int64_t *released,
                       char *err, size_t errlen)
{
    *released = 0;
    if (seq->head_len != NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: a seq with per-head lengths commits "
                          "through kv_seq_commit_heads");
    return kv_seq__commit_rows(seq, layout, pool, n, filled_after, released,
                               err, errlen);
}

int kv_seq__commit_rows(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int64_t n,
                        const int32_t *filled_after, int64_t *released,
                        char *err, size_t errlen)
{
    *released = 0;
    int rc = check_layout(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (pool == NULL || filled_after == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: commit_kept needs a pool and the rows");
    if ((rc = kv_seq__check_commit(seq, layout, n, err, errlen)) != 0)
        return rc;
    int64_t C = layout->prefill_chunk;
    int64_t at = seq->turn_start + seq->committed;
    /* Validate every row before changing any. */
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int64_t keep = kv_seq__turn_keep(at, n, C, layout->group_budget[r],
                                 &layout->rule);
        if (filled_after[r] < seq->filled[r] ||
            filled_after[r] > seq->filled[r] + keep)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_seq: row %d would hold %d tokens after the "
                              "chunk; it may hold %d .. %lld", (int)r,
                              (int)filled_after[r], (int)seq->filled[r],
                              (long long)(seq->filled[r] + keep));
    }
    int64_t freed = 0;
    int shrank = 0;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int64_t keep = kv_seq__turn_keep(at, n, C, layout->group_budget[r],
                                 &layout->rule);
        int32_t short_by = (int32_t)(seq->filled[r] + keep - filled_after[r]);
        seq->filled[r] = filled_after[r];
        if (short_by == 0)
            continue;
        /* The reservation of this chunk shrinks by what the row did not
         * keep; what later chunks and decode need stays reserved. */
        freed += row_shrink(seq, pool, r, seq->tokens[r] - short_by, &shrank);
    }
    shrink_done(seq, pool, freed, shrank);
    seq->committed += n;
    *released = freed;
    return 0;
}

/* ---- decode --------------------------------------------------------- */

static int check_decode(const struct kv_seq *seq,
                        const struct kv_layout *layout, int64_t n, char *err,
                        size_t errlen)
{
    int rc = check_layout(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (n < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: decode of %lld tokens", (long long)n);
    if (prefill_pending(seq))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: decode before the turn's prefill is "
                          "committed");
    if ((int64_t)seq->max_tokens + n > INT32_MAX)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "kv_seq: decode would exceed %d tokens in a row",
                          INT32_MAX);
    return 0;
}

/* Pages row r takes for n more tokens, without a division in the common
 * case: the row's pages have n_pages * P - tokens free slots, and only
 * when n exceeds them (once every P tokens at n = 1) is one needed. */
static inline int32_t decode_extra(int32_t tokens, int32_t n_pages,
                                   int32_t page_size, int64_t n)
{
    int64_t free_slots = (int64_t)n_pages * page_size - tokens;
    if (n <= free_slots)
        return 0;
    return (int32_t)((n - free_slots + page_size - 1) / page_size);
}

int kv_seq_decode_pages(const struct kv_seq *seq,
                        const struct kv_layout *layout, int64_t n,
                        int64_t *pages)
{
    *pages = 0;
    int rc = check_decode(seq, layout, n, NULL, 0);
    if (rc != 0)
        return rc;
    int64_t total = 0;
    for (int32_t r = 0; r < seq->n_rows; r++)
        total += decode_extra(seq->tokens[r], seq->n_pages[r], seq->page_size,
                              n);
    *pages = total;
    return 0;
}

/* One pass over the rows: extra[r] for every row, the rows that take
 * pages listed in add[0..*n_list), and room for them in the slab. */
static int prepare_decode(struct kv_seq *seq, const struct kv_layout *layout,
                          struct kv_pool *pool, int64_t n, int64_t *pages,
                          int32_t *n_list, char *err, size_t errlen)
{
    int rc = check_decode(seq, layout, n, err, errlen);
    if (rc != 0)
        return rc;
    const int32_t P = seq->page_size;
    int64_t total = 0;
    int32_t listed = 0;
    int short_of_room = 0;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int32_t k = decode_extra(seq->tokens[r], seq->n_pages[r], P, n);
        seq->extra[r] = k;
        if (k == 0)
            continue;
        seq->add[listed++] = r;
        total += k;
        short_of_room |= seq->n_pages[r] + k > seq->cap[r];
    }
    *pages = total;
    *n_list = listed;
    if (total > pool->n_free)
        return tg_err_set(err, errlen, TG_ENOSPC,
                          "kv_seq: decode needs %lld pages, %d free",
                          (long long)total, (int)pool->n_free);
    if (short_of_room && relayout(seq) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_seq: cannot grow the page-id slab");
    return 0;
}

static void finish_decode(struct kv_seq *seq, struct kv_pool *pool, int64_t n,
                          int64_t pages)
{
    const int32_t n32 = (int32_t)n;
    int32_t *tokens = seq->tokens, *filled = seq->filled;
    /* Every row grows alike: two contiguous SIMD adds. */
#pragma omp simd
    for (int32_t r = 0; r < seq->n_rows; r++)
        tokens[r] += n32;
#pragma omp simd
    for (int32_t r = 0; r < seq->n_rows; r++)
        filled[r] += n32;
    if (seq->head_len != NULL) /* a decode token goes to every head */
        for (int32_t h = 0; h < seq->n_heads; h++)
            seq->head_len[h] += n32;
    seq->max_tokens += n32;
    seq->used_pages += pages;
    seq->pos += n;
    update_mono(seq, pool);
}

int kv_seq_reserve_decode(struct kv_seq *seq, const struct kv_layout *layout,
                          struct kv_pool *pool, int64_t n, char *err,
                          size_t errlen)
{
    int64_t pages = 0;
    int32_t n_list = 0;
    int rc = prepare_decode(seq, layout, pool, n, &pages, &n_list, err, errlen);
    if (rc != 0)
        return rc;
    const int32_t *src = kv_pool_pop_view(pool, (int32_t)pages);
    TG_ASSERT(src != NULL); /* checked against n_free above */
    for (int32_t i = 0; i < n_list; i++) {
        int32_t r = seq->add[i], k = seq->extra[r];
        int32_t *dst = seq->ids + seq->off[r] + seq->n_pages[r];
        if (k == 1)
            *dst = *src; /* the common case: one page for a full row */
        else
            memcpy(dst, src, (size_t)k * sizeof(int32_t));
        src += k;
        seq->n_pages[r] += k;
    }
    finish_decode(seq, pool, n, pages);
    return 0;
}

/* ---- truncation and access ------------------------------------------ */

int kv_seq_truncate_row(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int l, int g, int64_t tokens,
                        char *err, size_t errlen)
{
    int rc = check_layout(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (l < 0 || l >= layout->n_layers || g < 0 || g >= layout->n_groups)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: no row (layer %d, group %d)", l, g);
    if (prefill_pending(seq))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: truncation while the turn's prefill is "
                          "pending (its commits would overrun the row)");
    int32_t r = l * layout->n_groups + g;
    if (tokens < 0 || tokens > seq->tokens[r])
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: cannot truncate row (%d, %d) of %d tokens "
                          "to %lld", l, g, (int)seq->tokens[r],
                          (long long)tokens);
    int32_t keep = pages_for(tokens, seq->page_size);
    int32_t drop = seq->n_pages[r] - keep;
    rc = kv_pool_push(pool, drop, seq->ids + seq->off[r] + keep);
    if (rc != 0)
        return tg_err_set(err, errlen, rc,
                          "kv_seq: the pool rejected %d tail pages of row "
                          "(%d, %d)", (int)drop, l, g);
    int32_t old = seq->tokens[r];
    if (drop > 0)
        seq->epoch = next_epoch();
    seq->n_pages[r] = keep;
    seq->tokens[r] = (int32_t)tokens;
    if (seq->filled[r] > tokens)
        seq->filled[r] = (int32_t)tokens;
    seq->used_pages -= drop;
    if (old == seq->max_tokens)
        recompute_max(seq);
    update_mono(seq, pool);
    return 0;
}

int kv_seq_compact_rows(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, const int32_t *filled_after,
                        int64_t *released, char *err, size_t errlen)
{
    *released = 0;
    int rc = check_layout(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (pool == NULL || filled_after == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: compact_rows needs a pool and the rows");
    if (prefill_pending(seq))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: decode compaction while the turn's "
                          "prefill is pending");
    for (int32_t r = 0; r < seq->n_rows; r++)
        if (filled_after[r] < 0 || filled_after[r] > seq->filled[r])
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_seq: row %d cannot shrink from %d to %d "
                              "tokens", (int)r, (int)seq->filled[r],
                              (int)filled_after[r]);
    int64_t freed = 0;
    int shrank = 0;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int32_t lost = seq->filled[r] - filled_after[r];
        if (lost == 0)
            continue;
        seq->filled[r] = filled_after[r];
        freed += row_shrink(seq, pool, r, seq->tokens[r] - lost, &shrank);
    }
    shrink_done(seq, pool, freed, shrank);
    *released = freed;
    return 0;
}

int kv_seq_rewind(struct kv_seq *seq, const struct kv_layout *layout,
                  struct kv_pool *pool, int64_t pos, const int32_t *row_tokens,
                  char *err, size_t errlen)
{
    if (seq->head_len != NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: a seq with per-head lengths rewinds "
                          "through kv_seq_rewind_heads");
    return kv_seq__rewind_rows(seq, layout, pool, pos, row_tokens, err,
                               errlen);
}

int kv_seq__rewind_rows(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int64_t pos,
                        const int32_t *row_tokens, char *err, size_t errlen)
{
    int rc = check_layout(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (prefill_pending(seq))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: rewind while the turn's prefill is pending");
    if (pos < 0 || pos > seq->pos)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: cannot rewind %lld positions to %lld",
                          (long long)seq->pos, (long long)pos);
    for (int32_t r = 0; r < seq->n_rows; r++)
        if (row_tokens[r] < 0 || row_tokens[r] > seq->tokens[r] ||
            row_tokens[r] > pos)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_seq: row %d cannot go from %d to %d tokens "
                              "at position %lld", (int)r, (int)seq->tokens[r],
                              (int)row_tokens[r], (long long)pos);
    int dropped = 0;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int32_t keep = pages_for(row_tokens[r], seq->page_size);
        int32_t drop = seq->n_pages[r] - keep;
        if (drop > 0) {
            /* Pages of this seq belong to the pool: a refusal is a broken
             * invariant, not an input error. */
            int prc = kv_pool_push(pool, drop, seq->ids + seq->off[r] + keep);
            TG_ASSERT(prc == 0);
            seq->used_pages -= drop;
            dropped = 1;
        }
        seq->n_pages[r] = keep;
        seq->tokens[r] = row_tokens[r];
        seq->filled[r] = row_tokens[r];
    }
    if (dropped)
        seq->epoch = next_epoch();
    seq->pos = pos;
    seq->turn_start = pos;
    seq->turn_len = seq->committed = 0;
    recompute_max(seq);
    update_mono(seq, pool);
    return 0;
}

/* ---- fork (parallel samples) ----------------------------------------- */

int64_t kv_seq_fork_pages(const struct kv_seq *src)
{
    int64_t n = 0;
    for (int32_t r = 0; r < src->n_rows; r++)
        n += src->tokens[r] % src->page_size != 0;
    return n;
}

int kv_seq_fork(struct kv_seq *dst, const struct kv_seq *src,
                const struct kv_layout *layout, struct kv_pool *pool,
                int64_t *private_pages, char *err, size_t errlen)
{
    if (private_pages != NULL)
        *private_pages = 0;
    int rc = check_layout(src, layout, err, errlen);
    if (rc == 0)
        rc = check_layout(dst, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (dst == src || dst->used_pages != 0 || pool == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: a fork needs an empty destination (it "
                          "holds %lld pages) and a pool",
                          (long long)dst->used_pages);
    const int32_t P = src->page_size;
    int64_t priv = kv_seq_fork_pages(src);
    if (priv > pool->n_free)
        return tg_err_set(err, errlen, TG_ENOSPC,
                          "kv_seq: fork needs %lld private pages, %d free",
                          (long long)priv, (int)pool->n_free);
    for (int32_t r = 0; r < dst->n_rows; r++)
        dst->extra[r] = src->n_pages[r];
    rc = ensure_room(dst);
    for (int32_t r = 0; r < dst->n_rows; r++)
        dst->extra[r] = 0;
    if (rc != 0)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_seq: cannot grow the page-id slab");
    /* Shared pages first, row by row; a refusal (ids not of this pool: a
     * broken invariant) gives back the references already added. */
    for (int32_t r = 0; r < src->n_rows; r++) {
        int32_t full = src->tokens[r] / P;
        const int32_t *ids = src->ids + src->off[r];
        rc = kv_pool_ref(pool, full, ids);
        if (rc != 0) {
            for (int32_t q = 0; q < r; q++)
                (void)kv_pool_push(pool, src->tokens[q] / P,
                                   src->ids + src->off[q]);
            return tg_err_set(err, errlen, rc,
                              "kv_seq: the pool refused to share row %d",
                              (int)r);
        }
        if (full > 0)
            memcpy(dst->ids + dst->off[r], ids,
                   (size_t)full * sizeof(int32_t));
        dst->n_pages[r] = full;
    }
    const int32_t *fresh = kv_pool_pop_view(pool, (int32_t)priv);
    TG_ASSERT(fresh != NULL); /* checked against n_free above */
    for (int32_t r = 0; r < src->n_rows; r++) {
        if (src->tokens[r] % P != 0)
            dst->ids[dst->off[r] + dst->n_pages[r]++] = *fresh++;
        TG_ASSERT(dst->n_pages[r] == src->n_pages[r]);
        dst->tokens[r] = src->tokens[r];
        dst->filled[r] = src->tokens[r];
    }
    dst->used_pages = src->used_pages;
    dst->pos = src->pos;
    dst->turn_start = src->turn_start;
    dst->turn_len = src->turn_len;
    dst->committed = src->turn_len;
    dst->max_tokens = src->max_tokens;
    update_mono(dst, pool);
    if (private_pages != NULL)
        *private_pages = priv;
    return 0;
}

const int32_t *kv_seq_row_ids(const struct kv_seq *seq,
                              const struct kv_layout *layout, int l, int g,
                              int32_t *n_pages)
{
    int32_t r = l * layout->n_groups + g;
    TG_ASSERT(l >= 0 && l < layout->n_layers && g >= 0 &&
              g < layout->n_groups && r < seq->n_rows);
    *n_pages = seq->n_pages[r];
    return seq->ids + seq->off[r];
}

/* ---- a worker's mirror of the router's rows -------------------------- */

int kv_seq_row_append(struct kv_seq *seq, int32_t row, const int32_t *ids,
                      int32_t n)
{
    if (row < 0 || row >= seq->n_rows || n < 0 || (n > 0 && ids == NULL) ||
        (int64_t)seq->n_pages[row] + n > INT32_MAX / seq->page_size)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    memset(seq->extra, 0, (size_t)seq->n_rows * sizeof(int32_t));
    seq->extra[row] = n;
    int rc = ensure_room(seq);
    seq->extra[row] = 0;
    if (rc != 0)
        return rc;
    memcpy(seq->ids + seq->off[row] + seq->n_pages[row], ids,
           (size_t)n * sizeof(int32_t));
    seq->n_pages[row] += n;
    seq->tokens[row] = seq->n_pages[row] * seq->page_size;
    seq->used_pages += n;
    return 0;
}

int kv_seq_row_cut(struct kv_seq *seq, int32_t row, int32_t n_pages)
{
    if (row < 0 || row >= seq->n_rows || n_pages < 0 ||
        n_pages > seq->n_pages[row])
        return TG_EINVAL;
    int32_t drop = seq->n_pages[row] - n_pages;
    if (drop == 0)
        return 0;
    seq->epoch = next_epoch();
    seq->n_pages[row] = n_pages;
    seq->tokens[row] = n_pages * seq->page_size;
    if (seq->filled[row] > seq->tokens[row])
        seq->filled[row] = seq->tokens[row];
    seq->used_pages -= drop;
    return 0;
}

void kv_seq_clear(struct kv_seq *seq)
{
    size_t bytes = (size_t)seq->n_rows * sizeof(int32_t);
    if (seq->n_rows > 0) {
        memset(seq->tokens, 0, bytes);
        memset(seq->filled, 0, bytes);
        memset(seq->n_pages, 0, bytes);
    }
    if (seq->head_len != NULL)
        memset(seq->head_len, 0, (size_t)seq->n_heads * sizeof(int32_t));
    seq->epoch = next_epoch();
    seq->pos = seq->turn_start = seq->turn_len = seq->committed = 0;
    seq->used_pages = 0;
    seq->max_tokens = 0;
    seq->mono_pages = 0;
}
