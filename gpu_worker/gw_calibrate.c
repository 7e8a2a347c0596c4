/* gw_calibrate.c — per-head retention under global top-k (gw_calibrate.h). */
#include "gpu_worker/gw_calibrate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"

struct cand {
    float score;
    int32_t head;
    int32_t pos;
};

/* Orders by score descending, then head, then position ascending. */
static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->head != y->head)
        return x->head < y->head ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

int gw_calibrate_layer(const float *scores, int H, int N, double ratio,
                       int window, int n_sink, double *retention)
{
    size_t total = (size_t)H * (size_t)N;
    int64_t budget = (int64_t)ceil(ratio * (double)total);
    if (budget > (int64_t)total)
        budget = (int64_t)total;
    int w = window < N ? window : N;
    struct cand *c = malloc(total * sizeof(*c));
    if (c == NULL)
        return TG_ENOMEM;
    for (int h = 0; h < H; h++)
        for (int j = 0; j < N; j++) {
            struct cand *x = &c[(size_t)h * N + j];
            int forced = j >= N - w || j < n_sink;
            x->score = forced ? INFINITY : scores[(size_t)h * N + j];
            x->head = h;
            x->pos = j;
        }
    qsort(c, total, sizeof(*c), cand_cmp);
    for (int h = 0; h < H; h++)
        retention[h] = 0;
    /* Forced keys are kept even past the budget (they are at serving time). */
    for (size_t i = 0; i < total; i++)
        if ((int64_t)i < budget || isinf(c[i].score))
            retention[c[i].head] += 1.0;
    for (int h = 0; h < H; h++)
        retention[h] /= (double)N;
    free(c);
    return 0;
}

void gw_calibrate_on_scores(void *ud, int layer, const float *scores, int n,
                            int n_kv_heads)
{
    struct gw_calib_state *st = ud;
    int rc = gw_calibrate_layer(scores, n_kv_heads, n, st->ratio, st->window,
                                st->n_sink, st->cur + (size_t)layer * n_kv_heads);
    if (rc != 0)
        st->failed = rc;
}

int gw_calibrate_run(struct gw_engine *e, struct gw_calib_state *st,
                     const int32_t *const *samples, const int *lens,
                     int n_samples, struct pf_retention *r,
                     gw_calib_progress_fn progress, void *progress_ud,
                     char *err, size_t errlen)
{
    const struct gw_model *m = &e->model;
    size_t LH = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    r->ratio = calloc((size_t)n_samples * LH, sizeof(double));
    if (r->ratio == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    r->samples = n_samples;
    r->num_layers = m->n_layers;
    r->num_kv_heads = m->n_kv_heads;
    r->head_dim = m->head_dim;
    r->target_ratio = st->ratio;
    for (int s = 0; s < n_samples; s++) {
        if (lens[s] > e->layout.kv.prefill_chunk)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "sample %d has %d tokens, more than the chunk of %d",
                              s, lens[s], e->layout.kv.prefill_chunk);
        st->cur = r->ratio + (size_t)s * LH;
        st->failed = 0;
        struct gw_gen_params gp = {.max_tokens = 0, .ignore_eos = 1};
        struct gw_gen_result res;
        int rc = gw_engine_generate(e, samples[s], lens[s], &gp, &res, err, errlen);
        gw_gen_result_free(&res);
        if (rc != 0)
            return rc;
        if (st->failed != 0)
            return tg_err_set(err, errlen, st->failed, "out of memory scoring sample %d", s);
        if (progress != NULL)
            progress(progress_ud, s + 1, n_samples, lens[s]);
    }
    return 0;
}
