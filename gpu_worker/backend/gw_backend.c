/* gw_backend.c — what both worker backends share: the prefill and decode
 * calls with their rows resolved, the host logits rows and the host
 * sampler (gw_backend.h). */
#include "gpu_worker/backend/gw_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

/* splitmix64's increment: the RNG state of the k-th draw of a request is
 * seed + k * GOLDEN (Steele, Lea & Flood 2014), so draw k does not depend
 * on how the earlier draws were batched. */
#define GOLDEN 0x9E3779B97F4A7C15ull

void gw_backend_free(struct gw_backend *b)
{
    if (b != NULL)
        b->ops->free(b);
}

/* Host logits row `row` of rank 0, or NULL (no row, another rank). */
static float *host_row(const struct gw_backend *b, int row)
{
    if (row < 0 || b->logits == NULL)
        return NULL;
    return b->logits + (size_t)row * (size_t)b->cfg.model->vocab;
}

int gw_backend_prefill(struct gw_backend *b, struct gw_seq *seq,
                       const int32_t *ids, int n, int row,
                       const struct gw_prefill_out *lp, char *err,
                       size_t errlen)
{
    struct gw_prefill_out po = {0};
    if (lp != NULL)
        po = *lp;
    po.want_logits = row >= 0;
    po.last_logits = host_row(b, row);
    return b->ops->prefill(b, seq, ids, n, &po, err, errlen);
}

int gw_backend_decode(struct gw_backend *b, struct gw_seq *const *seqs,
                      const int32_t *ids, int n, int first_row,
                      const struct gw_draw *draws, int n_draws, char *err,
                      size_t errlen)
{
    return b->ops->decode(b, seqs, ids, n, first_row, host_row(b, first_row),
                          draws, n_draws, err, errlen);
}

int gw_backend__base_init(struct gw_backend *b, const struct gw_backend_cfg *cfg,
                          char *err, size_t errlen)
{
    b->cfg = *cfg;
    if (cfg->rank == 0) {
        size_t rows = (size_t)cfg->max_slots, V = (size_t)cfg->model->vocab;
        b->logits = malloc(rows * V * sizeof(float));
        if (b->logits == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM,
                              "out of memory for %zu logits rows of %zu",
                              rows, V);
    }
    int rc = tg_backend_cpu_new(cfg->n_threads, &b->host);
    if (rc != 0)
        return tg_err_set(err, errlen, rc,
                          "cannot create the host sampler's CPU context");
    return 0;
}

void gw_backend__base_free(struct gw_backend *b)
{
    free(b->logits);
    tg_backend_cpu_free(b->host);
    b->logits = NULL;
    b->host = NULL;
}

int gw_backend__nonfinite(uint32_t slot, int64_t id, float value, char *err,
                          size_t errlen)
{
    return tg_err_set(err, errlen, TG_ERANGE,
                      "slot %u: the model produced a non-finite logit (%g "
                      "for token id %lld): its output cannot be sampled",
                      slot, (double)value, (long long)id);
}

int gw_backend__host_sample(struct gw_backend *b, const struct gw_draw *d,
                            struct gw_token *out, int32_t *top_ids,
                            float *top_lps, char *err, size_t errlen)
{
    size_t V = (size_t)b->cfg.model->vocab;
    if (b->logits == NULL || d->row < 0 || d->row >= b->cfg.max_slots)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u: no logits row %d to draw from", d->slot,
                          d->row);
    const float *x = b->logits + (size_t)d->row * V;
    for (size_t j = 0; j < V; j++)
        if (!isfinite(x[j]))
            return gw_backend__nonfinite(d->slot, (int64_t)j, x[j], err,
                                         errlen);
    if (d->mask != NULL)
        (void)tg_ops_cpu.logits_mask(b->host, b->logits + (size_t)d->row * V,
                                     (int)V, d->mask);
    int K = d->sampling->n_top;
    uint64_t rng = d->sampling->seed + d->index * GOLDEN;
    int32_t tok;
    float lp;
    int rc = tg_ops_cpu.sample(b->host, b->logits + (size_t)d->row * V, (int)V,
                               d->sampling, &d->hist, &rng, &tok, &lp, K,
                               top_ids, top_lps);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "slot %u: sampling failed (%s)",
                          d->slot, tg_strerror(rc));
    out->slot = d->slot;
    out->token = tok;
    out->logprob = lp;
    out->n_top = K;
    out->top_ids = top_ids;
    out->top_lps = top_lps;
    return 0;
}
