/* gw_cuda_table.c — the host side of the CUDA runtime's block tables:
 * filling the pinned mirrors and deciding whether a cached decode table
 * can be updated in place (see gw_cuda.h). Pure host code in every build,
 * so the caching rules are unit-tested in CI (test_gw_cuda_table). */
#include "gpu_worker/gw_cuda.h"

#include <string.h>

#include "common/tg_err.h"

int gw_cuda_table_put_seq(struct gw_cuda_table *t, const struct gw_seq *seq,
                          int rows, int64_t r0, int64_t *at, int add,
                          int slack, char *err, size_t errlen)
{
    if (r0 + rows > t->cap_rows)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "block table overflow (%lld rows, capacity %lld)",
                          (long long)(r0 + rows), (long long)t->cap_rows);
    for (int r = 0; r < rows; r++) {
        int32_t np = seq->n_pages[r];
        if (np < 0 || *at + np + slack > t->cap_ids)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "block table overflow (%lld ids, capacity %lld)",
                              (long long)(*at + np + slack),
                              (long long)t->cap_ids);
        t->h_indptr[r0 + r] = (int32_t)*at;
        t->h_npages[r0 + r] = np;
        t->h_lens[r0 + r] = seq->len[r] + add;
        if (np > 0)
            memcpy(t->h_indices + *at, seq->pages[r], (size_t)np * 4);
        for (int i = 0; i < slack; i++)
            t->h_indices[*at + np + i] = -1;
        *at += np + slack;
    }
    return 0;
}

int gw_cuda_table_put_pad(struct gw_cuda_table *t, int rows, int64_t r0,
                          int64_t *at, int32_t scratch_page, char *err,
                          size_t errlen)
{
    if (r0 + rows > t->cap_rows || *at + rows > t->cap_ids)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "block table overflow (%lld rows / %lld ids, "
                          "capacity %lld / %lld)", (long long)(r0 + rows),
                          (long long)(*at + rows), (long long)t->cap_rows,
                          (long long)t->cap_ids);
    for (int r = 0; r < rows; r++) {
        t->h_indptr[r0 + r] = (int32_t)*at;
        t->h_npages[r0 + r] = 1;
        t->h_lens[r0 + r] = 1;
        t->h_indices[(*at)++] = scratch_page;
    }
    return 0;
}

int gw_cuda_table_prepare(struct gw_cuda_table *t,
                          struct gw_cuda_table_cache *cache,
                          struct gw_seq *const *seqs, int n_seq, int B,
                          int rows, int32_t scratch_page, int32_t *sc_pos,
                          int32_t *sc_val, int64_t sc_cap, int64_t *n_out,
                          char *err, size_t errlen)
{
    *n_out = 0;
    if (n_seq < 0 || B < n_seq || B > cache->cap)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode batch of %d rows (%d sequences, cache of "
                          "%d)", B, n_seq, cache->cap);
    int ok = cache->B == B;
    for (int s = 0; s < B && ok; s++)
        ok = s < n_seq ? cache->seq[s] == seqs[s] &&
                             cache->epoch[s] == seqs[s]->epoch
                       : cache->seq[s] == NULL;
    int64_t n = 0;
    for (int s = 0; s < n_seq && ok; s++) {
        const struct gw_seq *q = seqs[s];
        for (int r = 0; r < rows && ok; r++) {
            int64_t row = (int64_t)s * rows + r;
            int32_t np = q->n_pages[r], up = t->h_npages[row];
            int32_t cap = t->h_indptr[row + 1] - t->h_indptr[row];
            if (np < up || np > cap || n + (np - up) > sc_cap) {
                ok = 0;
                break;
            }
            for (int32_t i = up; i < np; i++) {
                sc_pos[n] = t->h_indptr[row] + i;
                sc_val[n] = q->pages[r][i];
                n++;
            }
            t->h_npages[row] = np;
            t->h_lens[row] = q->len[r] + 1;
        }
    }
    /* Either way the cache holds nothing until the caller has sent the
     * table and the step went through (gw_cuda_table_commit). */
    cache->B = 0;
    if (ok) {
        *n_out = n;
        return 1;
    }
    int64_t at = 0;
    for (int s = 0; s < B; s++) {
        int rc;
        if (s < n_seq) {
            rc = gw_cuda_table_put_seq(t, seqs[s], rows, (int64_t)s * rows,
                                       &at, 1, GW_CUDA_ROW_SLACK, err, errlen);
            cache->seq[s] = seqs[s];
            cache->epoch[s] = seqs[s]->epoch;
        } else {
            rc = gw_cuda_table_put_pad(t, rows, (int64_t)s * rows, &at,
                                       scratch_page, err, errlen);
            cache->seq[s] = NULL;
        }
        if (rc != 0)
            return rc;
    }
    t->h_indptr[(int64_t)B * rows] = (int32_t)at;
    *n_out = at;
    return 0;
}

void gw_cuda_table_commit(struct gw_cuda_table_cache *cache, int B)
{
    cache->B = B;
}
