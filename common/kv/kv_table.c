/* kv_table.c — CSR block table of a batch: OpenMP over rows with one
 * contiguous copy per (layer, group) row, a padded variant refreshed in
 * place, and the plain baseline (see kv_table.h). */
#include "common/kv/kv_table.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* Below this many ids copied, an OpenMP team costs more than it saves
 * (waking threads is tens of microseconds, and far worse on a loaded
 * machine); 1M ids = 4 MB. */
#define PAR_MIN_IDS (1 << 20)
/* Refresh touches a few words per row (about 1 ns each): serial is
 * ~0.25 ms even for 1024 requests x 256 rows, less than a contended
 * OpenMP team costs, so only batches of millions of rows go parallel. */
#define PAR_MIN_ROWS_REFRESH (1 << 22)

/* Buffers are allocated even for 0 rows or ids (need at least 1), so a
 * table that was initialised has every array. */

/* indptr needs rows + 1 entries, npages and lens rows; all get rows + 1.
 * A failure part-way leaves larger arrays and cap_rows unchanged. */
static int reserve_rows(struct kv_table *t, int64_t rows)
{
    int64_t c1 = t->cap_rows + 1, c2 = c1, c3 = c1;
    if (t->cap_rows == 0)
        c1 = c2 = c3 = 0;
    if (TG_GROW(t->indptr, &c1, rows + 1) != 0 ||
        TG_GROW(t->npages, &c2, rows + 1) != 0 ||
        TG_GROW(t->lens, &c3, rows + 1) != 0)
        return TG_ENOMEM;
    t->cap_rows = c1 - 1;
    return 0;
}

static int reserve_slots(struct kv_table *t, int64_t slots)
{
    return TG_GROW(t->indices, &t->cap_slots, slots > 0 ? slots : 1);
}

/* seq_base needs n + 1 entries, slot_seq and slot_epoch n; all get n + 1
 * and share cap_seqs, moved once all three have grown. */
static int reserve_seqs(struct kv_table *t, int64_t n)
{
    int64_t c1 = t->cap_seqs, c2 = c1, c3 = c1;
    if (TG_GROW(t->seq_base, &c1, n + 1) != 0 ||
        TG_GROW(t->slot_seq, &c2, n + 1) != 0 ||
        TG_GROW(t->slot_epoch, &c3, n + 1) != 0)
        return TG_ENOMEM;
    t->cap_seqs = c1;
    return 0;
}

int kv_table_init(struct kv_table *table, int64_t rows, int64_t slots,
                  char *err, size_t errlen)
{
    memset(table, 0, sizeof(*table));
    if (rows < 0 || slots < 0 || rows >= INT32_MAX || slots > INT32_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_table: capacity %lld rows, %lld ids is invalid",
                          (long long)rows, (long long)slots);
    if (reserve_rows(table, rows) != 0 || reserve_slots(table, slots) != 0 ||
        reserve_seqs(table, 0) != 0) {
        kv_table_free(table);
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_table: cannot reserve %lld rows, %lld ids",
                          (long long)rows, (long long)slots);
    }
    return 0;
}

void kv_table_free(struct kv_table *table)
{
    free(table->indptr);
    free(table->indices);
    free(table->npages);
    free(table->lens);
    free(table->seq_base);
    free(table->slot_seq);
    free(table->slot_epoch);
    free(table->dirty);
    free(table->prev_npages);
    free(table->slot_moved);
    memset(table, 0, sizeof(*table));
}

int kv_table_set_rows(struct kv_table *table, int32_t len_bias,
                      int32_t pad_page)
{
    if (len_bias < 0 || pad_page < -1)
        return TG_EINVAL;
    int32_t has = pad_page >= 0;
    if (len_bias != table->len_bias || has != table->has_pad ||
        (has && pad_page != table->pad_page))
        table->stale = 1;
    table->len_bias = len_bias;
    table->has_pad = has;
    table->pad_page = has ? pad_page : 0;
    return 0;
}

int kv_table_track(struct kv_table *table, int on)
{
    table->track = on != 0;
    table->n_dirty = 0;
    table->rebuilt = 1;
    return 0;
}

void kv_table_invalidate(struct kv_table *table)
{
    table->stale = 1;
}

/* The lengths of slot s's rows: filled plus the bias. */
static void put_lens(int32_t *dst, const struct kv_seq *s, int32_t per,
                     int32_t bias)
{
    if (bias == 0) {
        memcpy(dst, s->filled, (size_t)per * sizeof(int32_t));
        return;
    }
    for (int32_t r = 0; r < per; r++)
        dst[r] = s->filled[r] + bias;
}

/* Pages a slot holds in the table: its seq's, or the padding pages. */
static int64_t slot_pages(const struct kv_table *t, const struct kv_seq *s,
                          int32_t per)
{
    if (s != NULL)
        return s->used_pages;
    return t->has_pad ? per : 0;
}

/* Checks the batch against the layout, sizes the row and slot-record
 * buffers, records which seq (and epoch) each slot holds, and sets the
 * header fields. Every builder starts here. */
static int begin_build(struct kv_table *t, const struct kv_layout *layout,
                       const struct kv_seq *const *seqs, int32_t n_seqs,
                       int32_t slack, char *err, size_t errlen)
{
    int64_t per = (int64_t)layout->n_layers * layout->n_groups;
    if (n_seqs < 0 || per < 1 || slack < 0 || (n_seqs > 0 && seqs == NULL))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_table: %d slots over %lld rows per slot, "
                          "slack %d", (int)n_seqs, (long long)per, (int)slack);
    if ((int64_t)n_seqs * per >= INT32_MAX)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "kv_table: %d slots x %lld rows is too many",
                          (int)n_seqs, (long long)per);
    for (int32_t b = 0; b < n_seqs; b++) {
        const struct kv_seq *s = seqs[b];
        if (s != NULL &&
            (s->n_rows != per || s->page_size != layout->page_size))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_table: slot %d was made for another layout",
                              (int)b);
    }
    int64_t rows = (int64_t)n_seqs * per;
    if (reserve_rows(t, rows) != 0 || reserve_seqs(t, n_seqs) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_table: cannot grow to %lld rows",
                          (long long)rows);
    for (int32_t b = 0; b < n_seqs; b++) {
        t->slot_seq[b] = seqs[b];
        t->slot_epoch[b] = seqs[b] != NULL ? seqs[b]->epoch : 0;
    }
    t->n_seqs = n_seqs;
    t->rows_per_seq = (int32_t)per;
    t->n_rows = (int32_t)rows;
    t->page_size = layout->page_size;
    t->slack = slack;
    t->nnz = 0;
    t->n_slots = 0;
    t->indptr[0] = 0;
    t->n_builds++;
    return 0;
}

/* After a failed build the table reads as an empty batch, so a refresh
 * of any real batch rebuilds it instead of trusting half-written rows. */
static int build_failed(struct kv_table *t, int rc)
{
    t->n_seqs = t->n_rows = 0;
    t->nnz = t->n_slots = 0;
    if (t->indptr != NULL)
        t->indptr[0] = 0;
    return rc;
}

static int build(struct kv_table *table, const struct kv_layout *layout,
                 const struct kv_seq *const *seqs, int32_t n_seqs,
                 int32_t slack, char *err, size_t errlen)
{
    int rc = begin_build(table, layout, seqs, n_seqs, slack, err, errlen);
    if (rc != 0)
        return build_failed(table, rc);
    const int32_t per = table->rows_per_seq;
    /* Each kv_seq already knows its page total, so the prefix over slots is
     * n_seqs additions and every slot can then be laid out independently. */
    int64_t *base = table->seq_base;
    int64_t nnz = 0;
    base[0] = 0;
    for (int32_t b = 0; b < n_seqs; b++) {
        int64_t pages = slot_pages(table, seqs[b], per);
        nnz += pages;
        base[b + 1] = base[b] + pages + (int64_t)per * slack;
    }
    int64_t n_slots = base[n_seqs];
    if (n_slots > INT32_MAX)
        return build_failed(table,
                            tg_err_set(err, errlen, TG_ERANGE,
                                       "kv_table: %lld slots exceed int32 "
                                       "indices", (long long)n_slots));
    if (reserve_slots(table, n_slots) != 0)
        return build_failed(table,
                            tg_err_set(err, errlen, TG_ENOMEM,
                                       "kv_table: cannot grow to %lld ids",
                                       (long long)n_slots));

    const int32_t n_rows = table->n_rows;
    int32_t *indptr = table->indptr;
    int32_t *indices = table->indices;
    int32_t *npages = table->npages;
    int32_t *lens = table->lens;
    const int32_t pad = table->has_pad ? table->pad_page : -1;
    const int32_t bias = table->len_bias;
#pragma omp parallel if (n_slots >= PAR_MIN_IDS)
    {
        /* Pass 1: row offsets (a local scan per slot), counts, lengths. */
#pragma omp for schedule(static)
        for (int32_t b = 0; b < n_seqs; b++) {
            const struct kv_seq *s = seqs[b];
            int64_t o = (int64_t)b * per;
            int32_t acc = (int32_t)base[b];
            if (s == NULL) {
                int32_t k = pad >= 0 ? 1 : 0;
                for (int32_t r = 0; r < per; r++) {
                    indptr[o + r] = acc + r * (k + slack);
                    npages[o + r] = k;
                    lens[o + r] = k;
                }
                continue;
            }
            const int32_t *np = s->n_pages;
            for (int32_t r = 0; r < per; r++) {
                indptr[o + r] = acc;
                acc += np[r] + slack;
            }
            memcpy(npages + o, np, (size_t)per * sizeof(int32_t));
            put_lens(lens + o, s, per, bias);
        }
        /* Pass 2: every (layer, group) row is one contiguous copy from the
         * seq's slab (memcpy is the SIMD loop here), then its gap. */
#pragma omp for schedule(static) collapse(2)
        for (int32_t b = 0; b < n_seqs; b++) {
            for (int32_t r = 0; r < per; r++) {
                const struct kv_seq *s = seqs[b];
                int32_t *dst = indices + indptr[(int64_t)b * per + r];
                int32_t n = s != NULL ? s->n_pages[r] : pad >= 0 ? 1 : 0;
                if (s == NULL && n > 0)
                    dst[0] = pad;
                else if (n > 0)
                    memcpy(dst, s->ids + s->off[r], (size_t)n * sizeof(int32_t));
                if (slack > 0)
                    memset(dst + n, 0xff, (size_t)slack * sizeof(int32_t));
            }
        }
    }
    indptr[n_rows] = (int32_t)n_slots;
    table->nnz = nnz;
    table->n_slots = n_slots;
    table->stale = 0;
    table->rebuilt = 1;
    table->n_dirty = 0;
    return 0;
}

int kv_table_build(struct kv_table *table, const struct kv_layout *layout,
                   const struct kv_seq *const *seqs, int32_t n_seqs,
                   char *err, size_t errlen)
{
    return build(table, layout, seqs, n_seqs, 0, err, errlen);
}

int kv_table_build_padded(struct kv_table *table,
                          const struct kv_layout *layout,
                          const struct kv_seq *const *seqs, int32_t n_seqs,
                          int32_t slack, char *err, size_t errlen)
{
    return build(table, layout, seqs, n_seqs, slack, err, errlen);
}

/* Lays slot b out again inside its region [seq_base[b], seq_base[b + 1])
 * for seq s (NULL = empty): rows back to back, each followed by `slack`
 * spare slots, and whatever is left of the region goes to the last row's
 * gap. The caller checked that it fits. */
static void relayout_slot(struct kv_table *t, int32_t b,
                          const struct kv_seq *s)
{
    const int32_t per = t->rows_per_seq, slack = t->slack;
    int64_t o = (int64_t)b * per;
    int32_t acc = (int32_t)t->seq_base[b];
    int32_t pad = t->has_pad ? t->pad_page : -1;
    for (int32_t r = 0; r < per; r++) {
        int32_t n = s != NULL ? s->n_pages[r] : pad >= 0 ? 1 : 0;
        t->indptr[o + r] = acc;
        if (s == NULL && n > 0)
            t->indices[acc] = pad;
        else if (n > 0)
            memcpy(t->indices + acc, s->ids + s->off[r],
                   (size_t)n * sizeof(int32_t));
        t->npages[o + r] = n;
        acc += n;
        /* This row's gap runs to the next row's start: slack here, the
         * rest of the region for the last row. */
        int64_t end = r + 1 < per ? (int64_t)acc + slack : t->seq_base[b + 1];
        memset(t->indices + acc, 0xff, (size_t)(end - acc) * sizeof(int32_t));
        acc = (int32_t)end;
    }
    if (s != NULL)
        put_lens(t->lens + o, s, per, t->len_bias);
    else
        for (int32_t r = 0; r < per; r++)
            t->lens[o + r] = pad >= 0 ? 1 : 0;
    t->slot_seq[b] = s;
    t->slot_epoch[b] = s != NULL ? s->epoch : 0;
    if (t->slot_moved != NULL)
        t->slot_moved[b] = 1;
}

/* After an in-place refresh: lists every id position it wrote (rows that
 * grew, and whole slots laid out again) for a device copy. */
static int collect_dirty(struct kv_table *t)
{
    const int32_t per = t->rows_per_seq;
    int64_t n = 0;
    for (int32_t b = 0; b < t->n_seqs; b++)
        for (int32_t r = 0; r < per; r++) {
            int64_t row = (int64_t)b * per + r;
            int32_t from = t->slot_moved[b] ? 0 : t->prev_npages[row];
            if (t->npages[row] > from)
                n += t->npages[row] - from;
        }
    if (TG_GROW(t->dirty, &t->cap_dirty, n > 0 ? n : 1) != 0)
        return TG_ENOMEM;
    n = 0;
    for (int32_t b = 0; b < t->n_seqs; b++)
        for (int32_t r = 0; r < per; r++) {
            int64_t row = (int64_t)b * per + r;
            int32_t from = t->slot_moved[b] ? 0 : t->prev_npages[row];
            for (int32_t i = from; i < t->npages[row]; i++)
                t->dirty[n++] = t->indptr[row] + i;
        }
    t->n_dirty = n;
    return 0;
}

int kv_table_refresh(struct kv_table *table, const struct kv_layout *layout,
                     const struct kv_seq *const *seqs, int32_t n_seqs,
                     char *err, size_t errlen)
{
    if (table->slack == 0 || table->indptr == NULL || table->stale ||
        n_seqs != table->n_seqs ||
        (int64_t)layout->n_layers * layout->n_groups != table->rows_per_seq ||
        layout->page_size != table->page_size || (n_seqs > 0 && seqs == NULL))
        return build(table, layout, seqs, n_seqs, table->slack, err, errlen);
    const int32_t per = table->rows_per_seq;
    for (int32_t b = 0; b < n_seqs; b++)
        if (seqs[b] != NULL && (seqs[b]->n_rows != per ||
                                seqs[b]->page_size != table->page_size))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_table: slot %d was made for another layout",
                              (int)b);
    if (table->track) {
        /* Their own capacities: a rebuild since the last tracked refresh
         * may have grown the rows and slots. */
        if (TG_GROW(table->prev_npages, &table->cap_prev,
                    table->n_rows > 0 ? table->n_rows : 1) != 0 ||
            TG_GROW(table->slot_moved, &table->cap_moved,
                    n_seqs > 0 ? n_seqs : 1) != 0)
            return tg_err_set(err, errlen, TG_ENOMEM,
                              "kv_table: cannot track %d rows",
                              (int)table->n_rows);
        memcpy(table->prev_npages, table->npages,
               (size_t)table->n_rows * sizeof(int32_t));
        memset(table->slot_moved, 0, (size_t)n_seqs);
    }
    const int64_t slack_per_slot = (int64_t)per * table->slack;
    int32_t *indptr = table->indptr;
    int32_t *indices = table->indices;
    int32_t *npages = table->npages;
    int32_t *lens = table->lens;
    int64_t nnz = 0;
    int overflow = 0;
#pragma omp parallel for schedule(static) reduction(+ : nnz) \
    reduction(| : overflow) if (table->n_rows >= PAR_MIN_ROWS_REFRESH)
    for (int32_t b = 0; b < n_seqs; b++) {
        const struct kv_seq *s = seqs[b];
        if (s != table->slot_seq[b] ||
            (s != NULL && s->epoch != table->slot_epoch[b])) {
            /* Another request in this slot, or ids left a row: lay the
             * slot out again if it fits its region, else rebuild all. */
            int64_t need = slot_pages(table, s, per) + slack_per_slot;
            if (need > table->seq_base[b + 1] - table->seq_base[b])
                overflow = 1;
            else
                relayout_slot(table, b, s);
            nnz += slot_pages(table, s, per);
            continue;
        }
        if (s == NULL) {
            nnz += slot_pages(table, s, per);
            continue;
        }
        int64_t o = (int64_t)b * per;
        for (int32_t r = 0; r < per; r++) {
            int32_t np = s->n_pages[r], old = npages[o + r];
            if (np == old)
                continue;
            if (np > indptr[o + r + 1] - indptr[o + r]) {
                overflow = 1;
                break;
            }
            /* Same seq, same epoch: it only appended, ids [0, old) stand. */
            if (np > old)
                memcpy(indices + indptr[o + r] + old, s->ids + s->off[r] + old,
                       (size_t)(np - old) * sizeof(int32_t));
            npages[o + r] = np;
        }
        put_lens(lens + o, s, per, table->len_bias);
        nnz += s->used_pages;
    }
    if (overflow)
        return build(table, layout, seqs, n_seqs, table->slack, err, errlen);
    table->nnz = nnz;
    table->rebuilt = 0;
    table->n_dirty = 0;
    if (table->track && collect_dirty(table) != 0) {
        table->stale = 1; /* the copy can no longer be told what changed */
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_table: cannot list the changed ids");
    }
    return 0;
}

int kv_table_resolve(const struct kv_table *table, int32_t row, int32_t token,
                     int32_t *page, int32_t *slot)
{
    if (row < 0 || row >= table->n_rows || token < 0)
        return TG_ERANGE;
    int32_t p = token / table->page_size;
    if (p >= table->npages[row])
        return TG_ERANGE;
    *page = table->indices[table->indptr[row] + p];
    *slot = token % table->page_size;
    return 0;
}

void kv_table_resolve_batch(const struct kv_table *table, int32_t n,
                            const int32_t *rows, const int32_t *tokens,
                            int32_t *page, int32_t *slot)
{
    for (int32_t i = 0; i < n; i++)
        if (kv_table_resolve(table, rows[i], tokens[i], &page[i], &slot[i]) !=
            0)
            page[i] = slot[i] = -1;
}
