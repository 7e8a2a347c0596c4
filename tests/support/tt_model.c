/* tt_model.c — synthetic models and profiles for benchmarks (see
 * tt_model.h). */
#include "tests/support/tt_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/profile/pf_build.h"
#include "common/base/tg_err.h"

/* ---- random stream ------------------------------------------------------ */

void tt_rng_init(struct tt_rng *r, uint64_t seed)
{
    r->state = seed != 0 ? seed : TT_RNG_SEED;
}

double tt_rng_uniform(struct tt_rng *r)
{
    uint64_t x = r->state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->state = x;
    return (double)(x >> 11) * 0x1.0p-53;
}

double tt_rng_normal(struct tt_rng *r)
{
    double u1 = tt_rng_uniform(r) + 0x1.0p-54, u2 = tt_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void tt_fill_uniform(struct tt_rng *r, float *x, size_t n, double a)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((tt_rng_uniform(r) * 2.0 - 1.0) * a);
}

/* ---- the model ---------------------------------------------------------- */

size_t tt_model_param_count(const struct tt_shape *s)
{
    size_t h = (size_t)s->hidden, qd = (size_t)s->Hq * (size_t)s->d;
    size_t kd = (size_t)s->Hkv * (size_t)s->d;
    size_t qk_norm = s->arch == MC_ARCH_QWEN3 ? 2 * (size_t)s->d : 0;
    size_t layer = 2 * h + qd * h + 2 * kd * h + qk_norm + h * qd +
                   3 * (size_t)s->ffn * h;
    size_t head = s->tied ? 0 : (size_t)s->vocab * h;
    return (size_t)s->vocab * h + (size_t)s->L * layer + h + head;
}

static float *carve(float **cur, size_t n)
{
    float *p = *cur;
    *cur += n;
    return p;
}

static void fill_ones(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f;
}

/* The config.json a checkpoint of shape *s would carry. */
static int shape_config(struct mc_model_config *c, const struct tt_shape *s,
                        char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->arch = s->arch;
    c->hidden_size = s->hidden;
    c->intermediate_size = s->ffn;
    c->num_layers = s->L;
    c->num_heads = s->Hq;
    c->num_kv_heads = s->Hkv;
    c->head_dim = s->d;
    c->vocab_size = s->vocab;
    c->tie_word_embeddings = s->tied != 0;
    c->bos_token_id = -1;
    snprintf(c->torch_dtype, sizeof(c->torch_dtype), "float32");
    if (s->arch == MC_ARCH_QWEN3) {
        c->max_position_embeddings = 40960;
        c->rms_norm_eps = 1e-6;
        c->rope_theta = 1000000.0;
        c->rope_scaling.type = MC_ROPE_DEFAULT;
        c->qk_norm = true;
    } else if (s->arch == MC_ARCH_LLAMA) {
        c->max_position_embeddings = 131072;
        c->rms_norm_eps = 1e-5;
        c->rope_theta = 500000.0;
        c->rope_scaling.type = MC_ROPE_LLAMA3;
        c->rope_scaling.factor = 8.0;
        c->rope_scaling.low_freq_factor = 1.0;
        c->rope_scaling.high_freq_factor = 4.0;
        c->rope_scaling.original_max_position_embeddings = 8192;
    } else {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "synthetic models are Llama or Qwen3 (got %s)",
                          mc_arch_name(s->arch));
    }
    int rc = mc_model_config_validate(c, err, errlen);
    return rc == 0 ? 0 : TG_EINVAL;
}

int tt_model_init_random(struct gw_model *m, const struct tt_shape *s,
                         struct tt_rng *r, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    int rc = shape_config(&m->cfg, s, err, errlen);
    if (rc != 0)
        return rc;
    const struct mc_model_config *c = &m->cfg;
    m->rank = 0;
    m->world = 1;
    m->n_layers = s->L;
    m->hidden = s->hidden;
    m->n_q_heads = s->Hq;
    m->n_kv_heads = s->Hkv;
    m->head_dim = s->d;
    m->ffn = s->ffn;
    m->vocab = s->vocab;
    m->max_positions = (int)c->max_position_embeddings;
    m->norm_eps = (float)c->rms_norm_eps;
    m->tied = s->tied != 0;

    size_t h = (size_t)s->hidden, qd = (size_t)s->Hq * (size_t)s->d;
    size_t kd = (size_t)s->Hkv * (size_t)s->d, f = (size_t)s->ffn;
    size_t V = (size_t)s->vocab;
    m->slab_elems = tt_model_param_count(s);
    m->slab_bytes = m->slab_elems * sizeof(float);
    m->slab = malloc(m->slab_bytes);
    m->layers = calloc((size_t)s->L, sizeof(*m->layers));
    m->inv_freq = calloc((size_t)s->d / 2, sizeof(float));
    if (m->slab == NULL || m->layers == NULL || m->inv_freq == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM,
                        "random model: out of memory (%zu weights)",
                        m->slab_elems);
        goto fail;
    }
    if ((rc = mc_rope_inv_freq(c, m->inv_freq)) != 0) {
        rc = tg_err_set(err, errlen, TG_EINVAL, "RoPE frequencies of d %d",
                        s->d);
        goto fail;
    }

    const double a = 0.02 * sqrt(3.0);
    int qk_norm = s->arch == MC_ARCH_QWEN3;
    float *const base = m->slab;
    float *cur = base;
    m->embed = carve(&cur, V * h);
    tt_fill_uniform(r, m->embed, V * h, a);
    for (int l = 0; l < s->L; l++) {
        struct gw_layer *w = &m->layers[l];
        w->attn_norm = carve(&cur, h);
        w->wq = carve(&cur, qd * h);
        w->wk = carve(&cur, kd * h);
        w->wv = carve(&cur, kd * h);
        if (qk_norm) {
            w->q_norm = carve(&cur, (size_t)s->d);
            w->k_norm = carve(&cur, (size_t)s->d);
            fill_ones(w->q_norm, (size_t)s->d);
            fill_ones(w->k_norm, (size_t)s->d);
        }
        w->wo = carve(&cur, h * qd);
        w->ffn_norm = carve(&cur, h);
        w->w_gate = carve(&cur, f * h);
        w->w_up = carve(&cur, f * h);
        w->w_down = carve(&cur, h * f);
        tt_fill_uniform(r, w->wq, qd * h, a);
        tt_fill_uniform(r, w->wk, kd * h, a);
        tt_fill_uniform(r, w->wv, kd * h, a);
        tt_fill_uniform(r, w->wo, h * qd, a);
        tt_fill_uniform(r, w->w_gate, f * h, a);
        tt_fill_uniform(r, w->w_up, f * h, a);
        tt_fill_uniform(r, w->w_down, h * f, a);
        fill_ones(w->attn_norm, h);
        fill_ones(w->ffn_norm, h);
    }
    m->final_norm = carve(&cur, h);
    fill_ones(m->final_norm, h);
    if (s->tied) {
        m->lm_head = m->embed;
    } else {
        m->lm_head = carve(&cur, V * h);
        tt_fill_uniform(r, m->lm_head, V * h, a);
    }
    TG_ASSERT((size_t)(cur - base) == m->slab_elems);
    return 0;
fail:
    gw_model_free(m);
    return rc;
}

void tt_model_drop_weights(struct gw_model *m)
{
    free(m->slab);
    m->slab = NULL;
    m->slab_elems = 0;
    m->slab_bytes = 0;
    m->embed = m->final_norm = m->lm_head = NULL;
    for (int l = 0; m->layers != NULL && l < m->n_layers; l++)
        memset(&m->layers[l], 0, sizeof(m->layers[l]));
}

/* ---- budgets and profiles ----------------------------------------------- */

static double clipped_mean(const double *raw, int n, double scale)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += fmin(1.0, fmax(PF_BUDGET_MIN, scale * raw[i]));
    return sum / n;
}

int tt_skewed_budgets(struct tt_rng *r, double *b, int n, double target)
{
    if (n < 1 || !(target >= PF_BUDGET_MIN && target <= 1.0))
        return TG_EINVAL;
    double *raw = malloc((size_t)n * sizeof(double));
    if (raw == NULL)
        return TG_ENOMEM;
    for (int i = 0; i < n; i++)
        raw[i] = exp(tt_rng_normal(r));
    /* Double the upper end until it reaches the target (clipping at 1
     * makes the mean 1 for a large enough scale), then bisect. */
    double lo = 0.0, hi = 1.0;
    while (clipped_mean(raw, n, hi) < target)
        hi *= 2.0;
    for (int it = 0; it < 100; it++) {
        double mid = 0.5 * (lo + hi);
        if (clipped_mean(raw, n, mid) < target)
            lo = mid;
        else
            hi = mid;
    }
    for (int i = 0; i < n; i++)
        b[i] = fmin(1.0, fmax(PF_BUDGET_MIN, hi * raw[i]));
    free(raw);
    return 0;
}

int tt_profile_from_budgets(struct pf_profile *p, const char *architecture,
                            int L, int H, int d, int H_p,
                            const double *budgets, double target, char *err,
                            size_t errlen)
{
    if (budgets == NULL)
        return pf_profile_init_full(p, L, H, d, H_p, err, errlen);
    int rc = pf_profile_init(p, architecture, "snapkv", L, H, d, H_p, err,
                             errlen);
    if (rc != 0)
        return rc;
    p->target_ratio = target;
    p->alpha = 2.0;
    p->samples = 50;
    for (int i = 0; i < L * H; i++) {
        /* As if calibrated with std 0: mean = budget. */
        p->budget[i] = budgets[i];
        p->mean[i] = budgets[i];
        p->std[i] = 0.0;
    }
    rc = pf_profile_regroup(p, H_p, PF_GROUPING_CLUSTERED, err, errlen);
    if (rc != 0)
        pf_profile_free(p);
    return rc;
}
