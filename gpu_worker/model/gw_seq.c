/* gw_seq.c — one chunk's accounting, shared by every forward pass (see
 * gw_seq.h). */
#include "gpu_worker/model/gw_seq.h"

#include "common/base/tg_err.h"
#include "common/kv/kv_budget.h"

int gw_method_per_head(enum tg_score_method method)
{
    return method == TG_SCORE_GVOTE;
}

int gw_seq_room(const struct kv_layout *lay, const struct gw_seq *seq, int l,
                const int32_t *add, char *err, size_t errlen)
{
    size_t base = (size_t)l * (size_t)lay->n_groups;
    for (int g = 0; g < lay->n_groups; g++) {
        int64_t need = kv_pages_for((int64_t)seq->len[base + g] + add[g],
                                    lay->page_size);
        if (need > seq->n_pages[base + g])
            return tg_err_set(err, errlen, TG_ENOSPC,
                              "layer %d group %d needs %lld pages, holds %d", l,
                              g, (long long)need, seq->n_pages[base + g]);
    }
    return 0;
}

int gw_chunk_plan(const struct kv_layout *lay, const struct gw_seq *seq, int n,
                  int32_t *keep, int *forced, char *err, size_t errlen)
{
    int f = (int)kv_chunk_forced(seq->pos, n, &lay->rule);
    size_t G = (size_t)lay->n_groups;
    for (int l = 0; l < lay->n_layers; l++) {
        int32_t *k = keep + (size_t)l * G;
        for (size_t g = 0; g < G; g++)
            k[g] = (int32_t)kv_chunk_keep(n, lay->group_budget[l * G + g], f);
        int rc = gw_seq_room(lay, seq, l, k, err, errlen);
        if (rc != 0)
            return rc;
    }
    *forced = f;
    return 0;
}

void gw_chunk_advance(struct gw_seq *seq, const struct kv_layout *lay,
                      const int32_t *keep, int n)
{
    size_t rows = (size_t)lay->n_layers * (size_t)lay->n_groups;
    for (size_t r = 0; r < rows; r++)
        seq->len[r] += keep[r];
    seq->pos += n;
}
