/* gw_trig.c — decode-time compression pieces of §4.9 (see gw_trig.h). */
#include "gpu_worker/model/gw_trig.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_trig.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

int gw_trig_caps(const double *budget, int H, int64_t c, int window,
                 int uniform, int32_t *cap)
{
    if (H < 1)
        return TG_EINVAL;
    double mean = 0.0;
    for (int h = 0; h < H; h++)
        mean += budget[h];
    return gw_trig_caps_mean(budget, H, mean / (double)H, c, window, uniform,
                             cap);
}

int gw_trig_caps_mean(const double *budget, int H, double mean, int64_t c,
                      int window, int uniform, int32_t *cap)
{
    /* The rule lives in common/kv (the router's admission bound uses it
     * too). */
    return kv_trig_caps_mean(budget, H, mean, c, window, uniform, cap);
}

double gw_trig_score(const struct gw_trig_qstat *q, int G, const float *k,
                     int d, const float *inv_freq, int64_t t)
{
    const int half = d / 2;
    double sum = 0.0;
    for (int f = 0; f < half; f++) {
        double kx = k[f], ky = k[f + half];
        double kn = sqrt(kx * kx + ky * ky);
        for (int o = 0; o < GW_TRIG_N_OFFSETS; o++) {
            double ang = (double)inv_freq[f] * (double)(t + ((int64_t)1 << o));
            double c = cos(ang), s = sin(ang);
            for (int g = 0; g < G; g++) {
                double a = q[g].re[f], b = q[g].im[f];
                /* qbar e^{i ang} = u + i v; Re((u + i v) conj(k)) =
                 * u kx + v ky. */
                double u = a * c - b * s, v = a * s + b * c;
                sum += u * kx + v * ky;
            }
        }
        for (int g = 0; g < G; g++) {
            double a = q[g].re[f], b = q[g].im[f];
            sum += GW_TRIG_N_OFFSETS *
                   ((double)q[g].abs[f] - sqrt(a * a + b * b)) * kn;
        }
    }
    return sum / ((double)G * GW_TRIG_N_OFFSETS * sqrt((double)d));
}

struct scored {
    double v;
    int i;
};

static int scored_desc(const void *pa, const void *pb)
{
    const struct scored *a = pa, *b = pb;
    if (a->v > b->v)
        return -1;
    if (a->v < b->v)
        return 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

int gw_trig_select(const double *score, int n, int cap, int window,
                   uint8_t *keep)
{
    if (window < 0 || cap < window || cap > n || n < 0)
        return TG_EINVAL;
    memset(keep, 0, (size_t)n);
    for (int i = n - window; i < n; i++)
        keep[i] = 1;
    int m = n - window, want = cap - window;
    if (want == 0)
        return 0;
    struct scored *s = malloc((size_t)m * sizeof(*s));
    if (s == NULL)
        return TG_ENOMEM;
    for (int i = 0; i < m; i++) {
        s[i].v = isnan(score[i]) ? -INFINITY : score[i];
        s[i].i = i;
    }
    qsort(s, (size_t)m, sizeof(*s), scored_desc);
    for (int r = 0; r < want; r++)
        keep[s[r].i] = 1;
    free(s);
    return 0;
}

/* Address of K (kv = 0) or V (kv = 1) of slot t of head h. */
static float *slot_ptr(const struct tg_kv_rows *r, int h, int t, int kv)
{
    const int P = r->page_size, d = r->head_dim;
    size_t page_floats = (size_t)r->heads_per_group * 2 * (size_t)P * (size_t)d;
    int g = r->head_group[h];
    return r->pool + (size_t)r->group_pages[g][t / P] * page_floats +
           ((size_t)r->head_slot[h] * 2 + (size_t)kv) * (size_t)P * (size_t)d +
           (size_t)(t % P) * (size_t)d;
}

int gw_trig_compact_head(const struct tg_kv_rows *rows, int h, int first,
                         int n, const uint8_t *keep, float *scratch)
{
    if (rows == NULL || h < 0 || h >= rows->n_kv_heads || first < 0 ||
        n < 0 || (n > 0 && (keep == NULL || scratch == NULL)))
        return TG_EINVAL;
    int len = rows->head_len != NULL ? rows->head_len[h]
                                     : rows->group_len[rows->head_group[h]];
    if (first + n > len)
        return TG_EINVAL;
    const int d = rows->head_dim;
    size_t rb = (size_t)d * sizeof(float);
    int m = 0;
    /* Read every survivor first: a survivor's destination may be another
     * survivor's source. */
    for (int i = 0; i < n; i++)
        if (keep[i]) {
            memcpy(scratch + (size_t)(2 * m) * d, slot_ptr(rows, h, first + i, 0), rb);
            memcpy(scratch + (size_t)(2 * m + 1) * d, slot_ptr(rows, h, first + i, 1), rb);
            m++;
        }
    for (int j = 0; j < m; j++) {
        memcpy(slot_ptr(rows, h, first + j, 0), scratch + (size_t)(2 * j) * d, rb);
        memcpy(slot_ptr(rows, h, first + j, 1), scratch + (size_t)(2 * j + 1) * d, rb);
    }
    return m;
}

void gw_trig_coef(const struct gw_trig_qstat *q, int G, int d,
                  const float *inv_freq, int64_t t, double *coef)
{
    const int half = d / 2;
    const double norm = 1.0 / ((double)G * GW_TRIG_N_OFFSETS * sqrt((double)d));
    double *U = coef, *V = coef + half, *N = coef + 2 * half;
    for (int f = 0; f < half; f++) {
        double sc = 0.0, ss = 0.0;
        /* sum over o of e^{i w (t+o)} = sc + i ss, shared by the G heads. */
        for (int o = 0; o < GW_TRIG_N_OFFSETS; o++) {
            double ang = (double)inv_freq[f] * (double)(t + ((int64_t)1 << o));
            sc += cos(ang);
            ss += sin(ang);
        }
        double u = 0.0, v = 0.0, n = 0.0;
        for (int g = 0; g < G; g++) {
            double a = q[g].re[f], b = q[g].im[f];
            u += a * sc - b * ss;
            v += a * ss + b * sc;
            n += GW_TRIG_N_OFFSETS * ((double)q[g].abs[f] - sqrt(a * a + b * b));
        }
        U[f] = u * norm;
        V[f] = v * norm;
        N[f] = n * norm;
    }
}

double gw_trig_score_coef(const double *coef, const float *k, int d)
{
    const int half = d / 2;
    const double *U = coef, *V = coef + half, *N = coef + 2 * half;
    double s = 0.0;
    for (int f = 0; f < half; f++) {
        double kx = k[f], ky = k[f + half];
        s += U[f] * kx + V[f] * ky + N[f] * sqrt(kx * kx + ky * ky);
    }
    return s;
}

void gw_trig_cfg_free(struct gw_trig_cfg *c)
{
    if (c == NULL)
        return;
    free(c->cap);
    free(c->group_cap);
    memset(c, 0, sizeof(*c));
}

int gw_trig_cfg_init(struct gw_trig_cfg *c, const struct gw_trig_opts *o,
                     const struct pf_profile *p, const struct kv_layout *lay,
                     const struct pf_trig *stats, int n_q_heads,
                     const float *inv_freq, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    struct kv_trig_opts ko = {.enabled = o->enabled, .budget = o->budget,
                              .uniform = o->uniform, .every = o->every,
                              .window = o->window};
    int rc = kv_trig_opts_check(&ko, err, errlen);
    if (rc != 0)
        return rc;
    const int L = lay->n_layers, H = lay->n_kv_heads, d = lay->head_dim;
    if (stats == NULL || stats->num_q_heads == 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--decode-compress trig needs the profile's trig "
                          "statistics (tangram-profile calibrate --trig)");
    if (p->num_layers != L || p->num_kv_heads != H || n_q_heads % H != 0 ||
        stats->num_q_heads != n_q_heads || stats->half != d / 2 ||
        d % 2 != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig statistics for %d query heads of %d pairs do "
                          "not fit the model's %d query heads of dimension %d",
                          stats->num_q_heads, stats->half, n_q_heads, d);
    /* The caps are common/kv's (one rule for the router and workers). */
    struct kv_trig kt;
    rc = kv_trig_init(&kt, &ko, p, lay, err, errlen);
    if (rc != 0)
        return rc;
    c->every = o->every;
    c->window = o->window;
    c->n_layers = L;
    c->n_kv_heads = H;
    c->group = n_q_heads / H;
    c->head_dim = d;
    c->n_groups = lay->n_groups;
    c->stats = stats;
    c->inv_freq = inv_freq;
    c->cap = kt.cap;             /* ownership moves to c */
    c->group_cap = kt.group_cap;
    return 0;
}

void gw_trig_work_free(struct gw_trig_work *w)
{
    if (w == NULL)
        return;
    free(w->score);
    free(w->coef);
    free(w->keep);
    free(w->kv);
    free(w->pos);
    memset(w, 0, sizeof(*w));
}

static int work_grow(struct gw_trig_work *w, int n, int d)
{
    if (w->coef == NULL) {
        w->coef = malloc((size_t)3 * (size_t)(d / 2) * sizeof(double));
        if (w->coef == NULL)
            return TG_ENOMEM;
    }
    /* Four arrays of n rows, one capacity: it moves once all have grown
     * (a kv row is 2 d floats). */
    int32_t c1 = w->cap_n, c2 = c1, c3 = c1, c4 = c1;
    if (TG_GROW(w->score, &c1, n) || TG_GROW(w->keep, &c2, n) ||
        tg_grow_i32((void **)&w->kv, &c3, n, 2 * (size_t)d * sizeof(float)) ||
        TG_GROW(w->pos, &c4, n))
        return TG_ENOMEM;
    w->cap_n = c1;
    return 0;
}

int gw_trig_compact_layer(const struct gw_trig_cfg *c, int l,
                          const struct tg_kv_rows *rows, int32_t *hlen,
                          const int32_t *dstart, int64_t t, int32_t *slot_pos,
                          int32_t slot_cap, struct gw_trig_work *w)
{
    const int H = c->n_kv_heads, G = c->group, d = c->head_dim;
    const int half = d / 2;
    if (rows->head_len != hlen || l < 0 || l >= c->n_layers)
        return TG_EINVAL;
    int done = 0;
    for (int h = 0; h < H; h++) {
        int cap = c->cap[(size_t)l * (size_t)H + (size_t)h];
        int first = dstart[h], n = hlen[h] - dstart[h];
        if (n <= cap)
            continue;
        if (first < 0)
            return TG_EINVAL;
        if (work_grow(w, n, d) != 0)
            return TG_ENOMEM;
        /* The statistics of the head's G query heads (rank order). */
        struct gw_trig_qstat q[64];
        struct gw_trig_qstat *qs = G <= 64 ? q : malloc((size_t)G * sizeof(*qs));
        if (qs == NULL)
            return TG_ENOMEM;
        const struct pf_trig *st = c->stats;
        for (int g = 0; g < G; g++) {
            size_t off = ((size_t)l * (size_t)st->num_q_heads +
                          (size_t)h * (size_t)G + (size_t)g) * (size_t)half;
            qs[g] = (struct gw_trig_qstat){st->re + off, st->im + off,
                                           st->abs + off};
        }
        gw_trig_coef(qs, G, d, c->inv_freq, t, w->coef);
        if (qs != q)
            free(qs);
        /* The window is kept whatever it scores; score the rest. */
        for (int i = 0; i < n - c->window; i++)
            w->score[i] = gw_trig_score_coef(w->coef,
                                             slot_ptr(rows, h, first + i, 0), d);
        int rc = gw_trig_select(w->score, n, cap, c->window, w->keep);
        if (rc != 0)
            return rc;
        rc = gw_trig_compact_head(rows, h, first, n, w->keep, w->kv);
        if (rc != cap)
            return rc < 0 ? rc : TG_EINVAL;
        if (slot_pos != NULL) {
            int32_t *sp = slot_pos + (size_t)h * (size_t)slot_cap;
            int m = 0;
            for (int i = 0; i < n; i++)
                if (w->keep[i])
                    sp[first + m++] = sp[first + i];
        }
        hlen[h] = first + cap;
        done++;
    }
    return done;
}
