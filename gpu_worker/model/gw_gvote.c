/* gw_gvote.c — GVote key selection of one prefill chunk (see .h). */
#include "gpu_worker/model/gw_gvote.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

struct gw_gvote_params gw_gvote_params_default(void)
{
    return (struct gw_gvote_params){.p = GW_GVOTE_P_DEFAULT,
                                    .samples = GW_GVOTE_SAMPLES_DEFAULT,
                                    .future = GW_GVOTE_FUTURE_DEFAULT};
}

int gw_gvote_params_check(const struct gw_gvote_params *p, char *err,
                          size_t errlen)
{
    if (!(p->p > 0.0 && p->p <= 1.0))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "gvote-p must be in (0, 1], got %g", p->p);
    if (p->samples < 0 || p->samples > GW_GVOTE_MAX_SAMPLES)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "gvote-samples must be in [0, %d], got %d",
                          GW_GVOTE_MAX_SAMPLES, p->samples);
    if (p->future < 1 || p->future > GW_GVOTE_MAX_FUTURE)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "gvote-future must be in [1, %d], got %d",
                          GW_GVOTE_MAX_FUTURE, p->future);
    return 0;
}

void gw_gvote_free(struct gw_gvote *g)
{
    free(g->xs);
    free(g->qs);
    free(g->mu);
    free(g->m2);
    free(g->cs);
    free(g->sn);
    free(g->a);
    free(g->ord);
    free(g->votes);
    free(g->forced);
    free(g->pr);
    memset(g, 0, sizeof(*g));
}

int gw_gvote_init(struct gw_gvote *g, const struct gw_model *md, int max_n,
                  const struct gw_gvote_params *par, char *err, size_t errlen)
{
    memset(g, 0, sizeof(*g));
    int rc = gw_gvote_params_check(par, err, errlen);
    if (rc != 0)
        return rc;
    if (max_n < 1)
        return tg_err_set(err, errlen, TG_EINVAL, "gvote: max_n %d", max_n);
    g->par = *par;
    g->max_n = max_n;
    size_t S = par->samples > 0 ? (size_t)par->samples : 1;
    size_t H = (size_t)md->hidden, n = (size_t)max_n;
    size_t qd = (size_t)md->n_q_heads * (size_t)md->head_dim;
    size_t half = (size_t)md->head_dim / 2 + 1;
    g->xs = malloc(S * H * sizeof(float));
    g->qs = malloc(S * qd * sizeof(float));
    g->mu = malloc(H * sizeof(double));
    g->m2 = malloc(H * sizeof(double));
    g->cs = malloc(half * sizeof(float));
    g->sn = malloc(half * sizeof(float));
    g->a = malloc(n * sizeof(float));
    g->ord = malloc(n * sizeof(int32_t));
    g->votes = malloc(n * sizeof(int32_t));
    g->forced = malloc(n);
    g->pr = malloc(n * sizeof(*g->pr));
    if (!g->xs || !g->qs || !g->mu || !g->m2 || !g->cs || !g->sn || !g->a ||
        !g->ord || !g->votes || !g->forced || !g->pr) {
        gw_gvote_free(g);
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "gvote: cannot allocate scratch for %d tokens",
                          max_n);
    }
    return 0;
}

/* splitmix64 (Steele, Lea & Flood 2014; constants of Vigna's reference
 * implementation), the project's seeded generator. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t gw_gvote_stream(uint64_t seed, int layer, int64_t start)
{
    /* Mix the three coordinates through the generator itself so nearby
     * seeds, layers and chunks give unrelated streams. */
    uint64_t s = seed;
    uint64_t a = splitmix64(&s);
    s = a ^ ((uint64_t)(uint32_t)layer * 0xd1342543de82ef95ULL);
    uint64_t b = splitmix64(&s);
    s = b ^ ((uint64_t)start * 0xaf251af3b0f025b5ULL);
    return splitmix64(&s);
}

double gw_gvote_normal(uint64_t *state)
{
    /* Box-Muller; u1 in (0, 1] so the log is finite. Only the cosine
     * branch is used, so one normal costs two draws and the stream has no
     * hidden state. */
    double u1 = ((double)(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = (double)(splitmix64(state) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Key order of one query: value descending, ties to the lower index. */
static int pair_desc(const void *pa, const void *pb)
{
    const struct gw_gvote_pair *a = pa, *b = pb;
    if (a->v > b->v)
        return -1;
    if (a->v < b->v)
        return 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Fills ord with the indices of a[] in that order (NaN ranks last so the
 * order stays total). */
static void order_desc(struct gw_gvote *g, const float *a, int32_t *ord, int n)
{
    for (int i = 0; i < n; i++) {
        g->pr[i].v = isnan(a[i]) ? -INFINITY : a[i];
        g->pr[i].i = i;
    }
    qsort(g->pr, (size_t)n, sizeof(*g->pr), pair_desc);
    for (int i = 0; i < n; i++)
        ord[i] = g->pr[i].i;
}

static float dotf(const float *x, const float *y, int d)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < d; j++)
        s += x[j] * y[j];
    return s;
}

/* Step 2: S synthetic queries into g->qs (S, Hq, d). */
static int synth_queries(struct gw_gvote *g, const struct gw_model *md,
                         const struct tg_ops *ops, struct tg_backend *be,
                         const struct gw_gvote_chunk *c)
{
    const int S = g->par.samples, H = md->hidden, n = c->n;
    const int d = md->head_dim, half = d / 2, Hq = md->n_q_heads;
    /* Welford per channel, in double. */
    for (int j = 0; j < H; j++) {
        g->mu[j] = 0.0;
        g->m2[j] = 0.0;
    }
    for (int i = 0; i < n; i++) {
        const float *xr = c->x + (size_t)i * (size_t)H;
        for (int j = 0; j < H; j++) {
            double dx = (double)xr[j] - g->mu[j];
            g->mu[j] += dx / (double)(i + 1);
            g->m2[j] += dx * ((double)xr[j] - g->mu[j]);
        }
    }
    uint64_t st = gw_gvote_stream(c->seed, c->layer, c->start);
    for (int s = 0; s < S; s++) {
        float *xs = g->xs + (size_t)s * (size_t)H;
        for (int j = 0; j < H; j++) {
            double sd = n > 1 ? sqrt(g->m2[j] / (double)(n - 1)) : 0.0;
            xs[j] = (float)(g->mu[j] + sd * gw_gvote_normal(&st));
        }
    }
    if (c->proj == NULL) {
        TG_TRY(gw_model_gemm(md, ops, be, g->xs, c->w->wq, c->w->bq, S, Hq * d,
                             H, g->qs));
    } else {
        TG_TRY(c->proj->run(c->proj->ctx, c->layer, g->xs, S, g->qs));
        if (c->w->bq != NULL)
            for (size_t r = 0; r < (size_t)S; r++)
                for (size_t j = 0; j < (size_t)Hq * (size_t)d; j++)
                    g->qs[r * (size_t)Hq * (size_t)d + j] += c->w->bq[j];
    }
    if (c->w->q_norm != NULL)
        TG_TRY(ops->rmsnorm(be, g->qs, c->w->q_norm, S * Hq, d, md->norm_eps,
                            g->qs));
    /* Averaged rotation of positions t+1 .. t+n_f (double sums). */
    int64_t t = c->start + n - 1;
    for (int f = 0; f < half; f++) {
        double cs = 0.0, sn = 0.0;
        for (int o = 1; o <= g->par.future; o++) {
            double ang = (double)(t + o) * (double)md->inv_freq[f];
            cs += cos(ang);
            sn += sin(ang);
        }
        g->cs[f] = (float)(cs / g->par.future);
        g->sn[f] = (float)(sn / g->par.future);
    }
    for (size_t r = 0; r < (size_t)S * (size_t)Hq; r++) {
        float *v = g->qs + r * (size_t)d;
        for (int f = 0; f < half; f++) {
            float x0 = v[f], x1 = v[f + half];
            v[f] = x0 * g->cs[f] - x1 * g->sn[f];
            v[f + half] = x1 * g->cs[f] + x0 * g->sn[f];
        }
    }
    return 0;
}

/* Step 1 for one real query: B = (#prefix sums < p) + 1, at most n. */
static int nucleus_count(float *a, const int32_t *ord, int n, double p)
{
    double sum = 0.0;
    int below = 0;
    for (int i = 0; i < n; i++) {
        sum += (double)a[ord[i]];
        if (sum < p)
            below++;
        else
            break; /* prefix sums only grow */
    }
    return below + 1 < n ? below + 1 : n;
}

/* One KV head: votes and selection. */
static void select_head(struct gw_gvote *g, const struct gw_model *md,
                        const struct gw_gvote_chunk *c, int h, float scale,
                        int32_t *keep, int32_t *idx_h)
{
    const int n = c->n, d = md->head_dim, Hq = md->n_q_heads;
    const int Hkv = md->n_kv_heads, G = Hq / Hkv, S = g->par.samples;
    int W = c->rule->window > 0 ? (c->rule->window < n ? c->rule->window : n) : 0;
    memset(g->votes, 0, (size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        g->forced[i] = i >= n - W || c->start + i < (int64_t)c->rule->n_sink;
    for (int qi = 0; qi < G; qi++) {
        int qh = h * G + qi;
        /* Step 1: the real last query's nucleus over the chunk's keys. */
        const float *q0 = c->q + ((size_t)(n - 1) * Hq + qh) * (size_t)d;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            g->a[j] = dotf(q0, c->k + ((size_t)j * Hkv + h) * (size_t)d, d) *
                      scale;
            mx = g->a[j] > mx ? g->a[j] : mx;
        }
        double den = 0.0;
        for (int j = 0; j < n; j++) {
            g->a[j] = expf(g->a[j] - mx);
            den += g->a[j];
        }
        for (int j = 0; j < n; j++)
            g->a[j] = (float)(g->a[j] / den);
        order_desc(g, g->a, g->ord, n);
        int B = nucleus_count(g->a, g->ord, n, g->par.p);
        for (int i = 0; i < B; i++)
            g->votes[g->ord[i]]++;
        /* Step 3: each synthetic query's top-B by raw dot product. */
        for (int s = 0; s < S; s++) {
            const float *qs = g->qs + ((size_t)s * Hq + qh) * (size_t)d;
            for (int j = 0; j < n; j++)
                g->a[j] = dotf(qs, c->k + ((size_t)j * Hkv + h) * (size_t)d, d);
            order_desc(g, g->a, g->ord, n);
            for (int i = 0; i < B; i++)
                g->votes[g->ord[i]]++;
        }
    }
    /* Step 4: U = voted or forced. */
    int u = 0;
    for (int j = 0; j < n; j++)
        u += g->votes[j] > 0 || g->forced[j];
    int cap = c->kcap[h];
    if (u <= cap) {
        int o = 0;
        for (int j = 0; j < n; j++)
            if (g->votes[j] > 0 || g->forced[j])
                idx_h[o++] = j;
        *keep = o;
        return;
    }
    /* Forced keys first (their count never exceeds the §4.3 keep), then
     * the most-voted; rank by (forced, votes) descending, ties earlier. */
    for (int j = 0; j < n; j++)
        g->a[j] = g->forced[j] ? INFINITY
                               : (g->votes[j] > 0 ? (float)g->votes[j] : -1.0f);
    order_desc(g, g->a, g->ord, n);
    uint8_t *mark = g->forced; /* forced flags are no longer needed */
    memset(mark, 0, (size_t)n);
    for (int i = 0; i < cap; i++)
        mark[g->ord[i]] = 1;
    int o = 0;
    for (int j = 0; j < n; j++)
        if (mark[j])
            idx_h[o++] = j;
    *keep = o;
}

int gw_gvote_select(struct gw_gvote *g, const struct gw_model *md,
                    const struct tg_ops *ops, struct tg_backend *be,
                    const struct gw_gvote_chunk *c, int32_t *keep,
                    int32_t *idx)
{
    if (c->n < 1 || c->n > g->max_n || c->x == NULL || c->q == NULL ||
        c->k == NULL || c->kcap == NULL || c->rule == NULL || c->w == NULL ||
        md->head_dim % 2 != 0 || md->n_q_heads % md->n_kv_heads != 0 ||
        (c->proj == NULL && c->w->wq == NULL && g->par.samples > 0))
        return TG_EINVAL;
    for (int h = 0; h < md->n_kv_heads; h++)
        if (c->kcap[h] < 0 || c->kcap[h] > c->n)
            return TG_EINVAL;
    if (g->par.samples > 0)
        TG_TRY(synth_queries(g, md, ops, be, c));
    float scale = 1.0f / sqrtf((float)md->head_dim);
    for (int h = 0; h < md->n_kv_heads; h++)
        select_head(g, md, c, h, scale, &keep[h], idx + (size_t)h * (size_t)c->n);
    return 0;
}
