/* gw_trig.c — decode-time compression pieces of §4.9 (see gw_trig.h). */
#include "gpu_worker/gw_trig.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"

int gw_trig_caps(const double *budget, int H, int64_t c, int window,
                 int uniform, int32_t *cap)
{
    int64_t F = GW_TRIG_SINKS + (int64_t)window;
    if (H < 1 || window < 0 || c < F || c > INT32_MAX)
        return TG_EINVAL;
    double mean = 0.0;
    for (int h = 0; h < H; h++) {
        if (!(budget[h] > 0.0 && budget[h] <= 1.0))
            return TG_EINVAL;
        mean += budget[h];
    }
    mean /= (double)H;
    for (int h = 0; h < H; h++) {
        if (uniform) {
            cap[h] = (int32_t)c;
            continue;
        }
        /* round(): half away from zero, as C's round() does. */
        double r = round((double)c * budget[h] / mean);
        if (r > (double)INT32_MAX)
            r = (double)INT32_MAX;
        cap[h] = (int32_t)(r < (double)F ? (double)F : r);
    }
    return 0;
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
