/* tt_kv.c — naive references of ragged paging (tt_kv.h). */
#include "tests/support/tt_kv.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/kv/kv_budget.h"

/* Makes room in seq's page-id slab for want[r] ids in every row r: when a
 * row lacks it, a new slab with every row at its wanted size plus a few
 * spare slots (-1), the ids held copied over. Returns 0 or TG_ENOMEM
 * (seq unchanged). */
static int make_room(struct kv_seq *seq, const int32_t *want)
{
    int short_of_room = 0;
    for (int32_t r = 0; r < seq->n_rows; r++)
        short_of_room |= want[r] > seq->cap[r];
    if (!short_of_room)
        return 0;
    int64_t total = 0;
    for (int32_t r = 0; r < seq->n_rows; r++)
        total += (int64_t)want[r] + 4;
    int32_t *ids = malloc((size_t)total * sizeof(int32_t));
    if (ids == NULL)
        return TG_ENOMEM;
    memset(ids, 0xff, (size_t)total * sizeof(int32_t));
    int64_t off = 0;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        if (seq->n_pages[r] > 0)
            memcpy(ids + off, seq->ids + seq->off[r],
                   (size_t)seq->n_pages[r] * sizeof(int32_t));
        seq->off[r] = off;
        seq->cap[r] = want[r] + 4;
        off += seq->cap[r];
    }
    free(seq->ids);
    seq->ids = ids;
    seq->ids_cap = total;
    return 0;
}

/* Pops pages one at a time until every row r holds want[r]. */
static void pop_pages(struct kv_seq *seq, struct kv_pool *pool,
                      const int32_t *want)
{
    for (int32_t r = 0; r < seq->n_rows; r++)
        while (seq->n_pages[r] < want[r]) {
            int32_t id;
            int rc = kv_pool_pop(pool, 1, &id);
            TG_ASSERT(rc == 0); /* the free count was checked */
            seq->ids[seq->off[r] + seq->n_pages[r]++] = id;
        }
}

/* The pool's monolithic count follows the seq's longest row. */
static void set_mono(struct kv_seq *seq, struct kv_pool *pool)
{
    int64_t mono = kv_pages_for(seq->max_tokens, seq->page_size) *
                   (int64_t)seq->n_rows;
    pool->mono_pages += mono - seq->mono_pages;
    seq->mono_pages = mono;
}

int tt_kv_seq_reserve_prompt_plain(struct kv_seq *seq,
                                   const struct kv_layout *layout,
                                   struct kv_pool *pool, int64_t start_pos,
                                   int64_t n_new, char *err, size_t errlen)
{
    int64_t pages = 0;
    int rc = kv_seq_prompt_pages(seq, layout, start_pos, n_new, &pages, err,
                                 errlen);
    if (rc != 0)
        return rc;
    if (pages > pool->n_free)
        return tg_err_set(err, errlen, TG_ENOSPC,
                          "kv_seq: turn needs %lld pages, %d free",
                          (long long)pages, (int)pool->n_free);
    int32_t *tokens = malloc((size_t)seq->n_rows * sizeof(int32_t));
    int32_t *want = malloc((size_t)seq->n_rows * sizeof(int32_t));
    if (tokens == NULL || want == NULL) {
        rc = TG_ENOMEM;
        goto out;
    }
    for (int32_t r = 0; r < seq->n_rows; r++) {
        tokens[r] = seq->tokens[r] +
                    (int32_t)kv_turn_keep(
                        start_pos, n_new, layout->prefill_chunk,
                        layout->group_budget[r], &layout->rule);
        want[r] = (int32_t)kv_pages_for(tokens[r], seq->page_size);
    }
    if ((rc = make_room(seq, want)) != 0)
        goto out;
    pop_pages(seq, pool, want);
    int32_t m = 0;
    for (int32_t r = 0; r < seq->n_rows; r++) {
        seq->tokens[r] = tokens[r];
        m = tokens[r] > m ? tokens[r] : m;
    }
    seq->max_tokens = m;
    seq->used_pages += pages;
    seq->turn_start = start_pos;
    seq->turn_len = n_new;
    seq->committed = 0;
    seq->pos = start_pos + n_new;
    set_mono(seq, pool);
out:
    free(tokens);
    free(want);
    if (rc == TG_ENOMEM)
        tg_err_set(err, errlen, rc, "kv_seq: cannot grow the page-id slab");
    return rc;
}

int tt_kv_seq_reserve_decode_plain(struct kv_seq *seq,
                                   const struct kv_layout *layout,
                                   struct kv_pool *pool, int64_t n, char *err,
                                   size_t errlen)
{
    int64_t pages = 0;
    int rc = kv_seq_decode_pages(seq, layout, n, &pages);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "kv_seq: decode of %lld tokens",
                          (long long)n);
    if (pages > pool->n_free)
        return tg_err_set(err, errlen, TG_ENOSPC,
                          "kv_seq: decode needs %lld pages, %d free",
                          (long long)pages, (int)pool->n_free);
    int32_t *want = malloc((size_t)seq->n_rows * sizeof(int32_t));
    for (int32_t r = 0; want != NULL && r < seq->n_rows; r++)
        want[r] = (int32_t)kv_pages_for(seq->tokens[r] + n, seq->page_size);
    if (want == NULL || make_room(seq, want) != 0) {
        free(want);
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_seq: cannot grow the page-id slab");
    }
    pop_pages(seq, pool, want);
    free(want);
    for (int32_t r = 0; r < seq->n_rows; r++) {
        seq->tokens[r] += (int32_t)n;
        seq->filled[r] += (int32_t)n;
    }
    for (int32_t h = 0; seq->head_len != NULL && h < seq->n_heads; h++)
        seq->head_len[h] += (int32_t)n;
    seq->max_tokens += (int32_t)n;
    seq->used_pages += pages;
    seq->pos += n;
    set_mono(seq, pool);
    return 0;
}

int tt_csr_build(struct tt_csr *c, const struct kv_layout *layout,
                 const struct kv_seq *const *seqs, int32_t n_seqs, char *err,
                 size_t errlen)
{
    const int32_t per = layout->n_layers * layout->n_groups;
    if (n_seqs < 0 || (seqs == NULL && n_seqs > 0))
        return tg_err_set(err, errlen, TG_EINVAL, "tt_csr: bad batch");
    for (int32_t b = 0; b < n_seqs; b++)
        if (seqs[b] != NULL &&
            (seqs[b]->n_rows != per || seqs[b]->page_size != layout->page_size))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "tt_csr: slot %d was made for another layout",
                              (int)b);
    int64_t rows = (int64_t)n_seqs * per;
    if (rows > INT32_MAX)
        return tg_err_set(err, errlen, TG_ERANGE, "tt_csr: too many rows");
    if (tg_grow_i64((void **)&c->indptr, &c->cap_rows, rows + 1,
                    sizeof(int32_t)) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM, "tt_csr: out of memory");
    /* The three row arrays share one capacity: the others follow indptr's
     * (a realloc to the size they have is a no-op). */
    size_t bytes = (size_t)c->cap_rows * sizeof(int32_t);
    int32_t *np = realloc(c->npages, bytes);
    if (np == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "tt_csr: out of memory");
    c->npages = np;
    int32_t *ln = realloc(c->lens, bytes);
    if (ln == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "tt_csr: out of memory");
    c->lens = ln;
    c->n_seqs = n_seqs;
    c->rows_per_seq = per;
    c->n_rows = (int32_t)rows;
    int64_t nnz = 0;
    int32_t row = 0;
    for (int32_t b = 0; b < n_seqs; b++) {
        const struct kv_seq *s = seqs[b];
        for (int l = 0; l < layout->n_layers; l++)
            for (int g = 0; g < layout->n_groups; g++, row++) {
                c->indptr[row] = (int32_t)nnz;
                c->npages[row] = 0;
                c->lens[row] = 0;
                if (s == NULL)
                    continue;
                int32_t n;
                const int32_t *ids = kv_seq_row_ids(s, layout, l, g, &n);
                for (int32_t p = 0; p < n; p++) {
                    if (nnz >= c->cap_slots) {
                        if (nnz >= INT32_MAX)
                            return tg_err_set(err, errlen, TG_ERANGE,
                                              "tt_csr: too many pages");
                        if (tg_grow_i64((void **)&c->indices, &c->cap_slots,
                                        nnz + 1, sizeof(int32_t)) != 0)
                            return tg_err_set(err, errlen, TG_ENOMEM,
                                              "tt_csr: out of memory");
                    }
                    c->indices[nnz++] = ids[p];
                    c->npages[row]++;
                }
                c->lens[row] = s->filled[l * layout->n_groups + g];
            }
    }
    c->indptr[row] = (int32_t)nnz;
    c->nnz = nnz;
    return 0;
}

void tt_csr_free(struct tt_csr *c)
{
    free(c->indptr);
    free(c->indices);
    free(c->npages);
    free(c->lens);
    memset(c, 0, sizeof(*c));
}
