/* kv_seq_heads.c — per-head lengths of a request's rows for adaptive
 * methods: enabling them, committing a chunk whose heads kept different
 * counts, rewinding (see "per-head lengths" in kv_seq.h). */
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_seq.h"
#include "common/kv/kv_seq_internal.h"
#include "common/base/tg_err.h"

/* Rows (L * G) and heads (L * Hkv) of a layout with head maps, or -1. */
static int32_t layout_heads(const struct kv_layout *layout)
{
    if (layout->head_group == NULL || layout->n_kv_heads < 1)
        return -1;
    return layout->n_layers * layout->n_kv_heads;
}

static int check_heads(const struct kv_seq *seq,
                       const struct kv_layout *layout, char *err,
                       size_t errlen)
{
    if (seq->n_rows != layout->n_layers * layout->n_groups ||
        seq->page_size != layout->page_size)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: made for %d rows, used with a layout of "
                          "%d x %d rows", (int)seq->n_rows, layout->n_layers,
                          layout->n_groups);
    if (seq->head_len == NULL || seq->n_heads != layout_heads(layout))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: no per-head lengths for this layout (%d "
                          "kept, the layout has %d heads)",
                          (int)seq->n_heads, (int)layout_heads(layout));
    return 0;
}

void kv_heads_row_max(const struct kv_layout *layout, const int32_t *head_len,
                      int32_t *row_max)
{
    const int G = layout->n_groups, H = layout->n_kv_heads;
    memset(row_max, 0, (size_t)layout->n_layers * (size_t)G * sizeof(int32_t));
    for (int l = 0; l < layout->n_layers; l++)
        for (int h = 0; h < H; h++) {
            size_t i = (size_t)l * (size_t)H + (size_t)h;
            int32_t *m = row_max + (size_t)l * (size_t)G + layout->head_group[i];
            if (head_len[i] > *m)
                *m = head_len[i];
        }
}

int kv_seq_heads_enable(struct kv_seq *seq, const struct kv_layout *layout,
                        char *err, size_t errlen)
{
    int32_t heads = layout_heads(layout);
    if (heads < 1 || seq->n_rows != layout->n_layers * layout->n_groups)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: per-head lengths need a layout with head "
                          "maps matching the seq");
    if (seq->head_len != NULL && seq->n_heads == heads)
        return 0;
    int32_t *hl = malloc((size_t)heads * sizeof(int32_t));
    if (hl == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "kv_seq: cannot allocate %d head lengths",
                          (int)heads);
    free(seq->head_len);
    seq->head_len = hl;
    seq->n_heads = heads;
    kv_seq_heads_from_rows(seq, layout);
    return 0;
}

void kv_seq_heads_from_rows(struct kv_seq *seq, const struct kv_layout *layout)
{
    TG_ASSERT(seq->head_len != NULL && seq->n_heads == layout_heads(layout));
    /* A seq of whole rows: every head holds its row. */
    for (int l = 0; l < layout->n_layers; l++)
        for (int h = 0; h < layout->n_kv_heads; h++) {
            size_t i = (size_t)l * (size_t)layout->n_kv_heads + (size_t)h;
            seq->head_len[i] = seq->filled[(size_t)l * (size_t)layout->n_groups +
                                           layout->head_group[i]];
        }
}

void kv_seq__heads_commit(struct kv_seq *seq, const struct kv_layout *layout,
                          int64_t at, int64_t n)
{
    /* kv_seq_commit checked the layout's rows; a seq with heads was
     * enabled for a layout with head maps of the same rows. */
    TG_ASSERT(seq->n_heads == layout_heads(layout));
    const int G = layout->n_groups, H = layout->n_kv_heads;
    for (int l = 0; l < layout->n_layers; l++)
        for (int h = 0; h < H; h++) {
            size_t i = (size_t)l * (size_t)H + (size_t)h;
            size_t r = (size_t)l * (size_t)G + (size_t)layout->head_group[i];
            seq->head_len[i] += (int32_t)kv_seq__turn_keep(
                at, n, layout->prefill_chunk, layout->group_budget[r],
                &layout->rule);
        }
}

int kv_seq_heads_fit(const struct kv_seq *seq, const struct kv_layout *layout,
                     int64_t n, const int32_t *head_after, int64_t n_heads,
                     char *err, size_t errlen)
{
    int rc = check_heads(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (head_after == NULL || n_heads != seq->n_heads)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: %lld head lengths for %d heads",
                          (long long)n_heads, (int)seq->n_heads);
    if ((rc = kv_seq__check_commit(seq, layout, n, err, errlen)) != 0)
        return rc;
    int64_t C = layout->prefill_chunk;
    int64_t at = seq->turn_start + seq->committed;
    const int G = layout->n_groups, H = layout->n_kv_heads;
    for (int l = 0; l < layout->n_layers; l++)
        for (int h = 0; h < H; h++) {
            size_t i = (size_t)l * (size_t)H + (size_t)h;
            size_t r = (size_t)l * (size_t)G + (size_t)layout->head_group[i];
            int64_t keep = kv_seq__turn_keep(at, n, C, layout->group_budget[r],
                                             &layout->rule);
            if (head_after[i] < seq->head_len[i] ||
                head_after[i] > seq->head_len[i] + keep)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "kv_seq: layer %d head %d would hold %d "
                                  "tokens after the chunk; it may hold %d .. "
                                  "%lld (its reservation)", l, h,
                                  (int)head_after[i], (int)seq->head_len[i],
                                  (long long)(seq->head_len[i] + keep));
        }
    return 0;
}

int kv_seq_commit_heads(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int64_t n,
                        const int32_t *head_after, int64_t n_heads,
                        int64_t *released, char *err, size_t errlen)
{
    *released = 0;
    int rc = kv_seq_heads_fit(seq, layout, n, head_after, n_heads, err,
                              errlen);
    if (rc != 0)
        return rc;
    /* seq->add is the seq's row scratch (reservations rebuild it). The
     * rows were longest-head long and every head grew within its row's
     * keep, so the new row counts pass kv_seq__commit_rows's check. */
    kv_heads_row_max(layout, head_after, seq->add);
    rc = kv_seq__commit_rows(seq, layout, pool, n, seq->add, released, err,
                             errlen);
    if (rc != 0)
        return rc;
    memcpy(seq->head_len, head_after, (size_t)n_heads * sizeof(int32_t));
    return 0;
}

int kv_seq_rewind_heads(struct kv_seq *seq, const struct kv_layout *layout,
                        struct kv_pool *pool, int64_t pos,
                        const int32_t *row_tokens, const int32_t *head_tokens,
                        char *err, size_t errlen)
{
    if (seq->head_len == NULL) {
        if (head_tokens != NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_seq: head lengths for a seq without them");
        return kv_seq_rewind(seq, layout, pool, pos, row_tokens, err, errlen);
    }
    int rc = check_heads(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (head_tokens == NULL || row_tokens == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: rewinding a seq with heads needs the "
                          "rows' and the heads' lengths");
    for (int32_t i = 0; i < seq->n_heads; i++)
        if (head_tokens[i] < 0 || head_tokens[i] > seq->head_len[i])
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_seq: head %d cannot go from %d to %d "
                              "tokens", (int)i, (int)seq->head_len[i],
                              (int)head_tokens[i]);
    /* The rows must be their longest heads, as they were at the bound. */
    kv_heads_row_max(layout, head_tokens, seq->extra);
    for (int32_t r = 0; r < seq->n_rows; r++)
        if (seq->extra[r] != row_tokens[r]) {
            int32_t want = seq->extra[r];
            memset(seq->extra, 0, (size_t)seq->n_rows * sizeof(int32_t));
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_seq: row %d rewinds to %d tokens but its "
                              "longest head to %d", (int)r,
                              (int)row_tokens[r], (int)want);
        }
    memset(seq->extra, 0, (size_t)seq->n_rows * sizeof(int32_t));
    rc = kv_seq__rewind_rows(seq, layout, pool, pos, row_tokens, err, errlen);
    if (rc != 0)
        return rc;
    memcpy(seq->head_len, head_tokens, (size_t)seq->n_heads * sizeof(int32_t));
    return 0;
}

int kv_seq_compact_heads(struct kv_seq *seq, const struct kv_layout *layout,
                         struct kv_pool *pool, const int32_t *head_after,
                         int64_t n_heads, int64_t *released, char *err,
                         size_t errlen)
{
    *released = 0;
    int rc = check_heads(seq, layout, err, errlen);
    if (rc != 0)
        return rc;
    if (head_after == NULL || n_heads != seq->n_heads)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "kv_seq: %lld head lengths for %d heads",
                          (long long)n_heads, (int)seq->n_heads);
    for (int32_t h = 0; h < seq->n_heads; h++)
        if (head_after[h] < 0 || head_after[h] > seq->head_len[h])
            return tg_err_set(err, errlen, TG_EINVAL,
                              "kv_seq: head %d cannot go from %d to %d "
                              "tokens in a compaction", (int)h,
                              (int)seq->head_len[h], (int)head_after[h]);
    /* The rows become their longest heads; seq->add is free scratch
     * outside a reservation. */
    kv_heads_row_max(layout, head_after, seq->add);
    rc = kv_seq_compact_rows(seq, layout, pool, seq->add, released, err,
                             errlen);
    if (rc != 0)
        return rc;
    memcpy(seq->head_len, head_after, (size_t)seq->n_heads * sizeof(int32_t));
    return 0;
}

int kv_seq_fork_heads(struct kv_seq *dst, const struct kv_seq *src,
                      const struct kv_layout *layout, char *err,
                      size_t errlen)
{
    int rc = check_heads(src, layout, err, errlen);
    if (rc == 0)
        rc = kv_seq_heads_enable(dst, layout, err, errlen);
    if (rc != 0)
        return rc;
    /* src's reserved turn is still to be committed: every head of a row
     * adds the row's §4.3 keep, i.e. what the row reserves beyond what it
     * holds (the predicted case, kv_seq_commit). */
    const int G = layout->n_groups, H = layout->n_kv_heads;
    for (int l = 0; l < layout->n_layers; l++)
        for (int h = 0; h < H; h++) {
            size_t i = (size_t)l * (size_t)H + (size_t)h;
            size_t r = (size_t)l * (size_t)G + (size_t)layout->head_group[i];
            dst->head_len[i] = src->head_len[i] + src->tokens[r] -
                               src->filled[r];
        }
    return 0;
}
