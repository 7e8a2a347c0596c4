/*
 * cpu_attn.c — attention over ragged pages: prefill chunks and decode.
 *
 * One work item is (token, KV head): the G query heads that share a KV head
 * are processed together, so every K/V row read from a page is used G
 * times while it is in L1 (GQA is memory-bound on the KV side).
 *
 * Softmax is the online (flash-attention) form: keys are consumed in tiles
 * of ATTN_TILE, a tile's logits are computed first, then the running max m
 * is raised once per tile and the accumulator rescaled by exp(m_old - m_new)
 * (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax";
 * Dao et al. 2022, FlashAttention). The denominator is summed in double so
 * long rows stay within 1e-6 of a float64 reference; logits, weights and
 * the value accumulator are fp32.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/cpu/cpu_internal.h"

#define ATTN_TILE 32

/* Online-softmax state of the G query heads of one work item; every array
 * lives in the calling thread's scratch slab. */
struct osm {
    int G, d;
    float scale;
    const float *q; /* (G, d) queries */
    double *l;      /* (G) running softmax denominators */
    float *m;       /* (G) running logit maxima */
    float *acc;     /* (G, d) unnormalised weighted value sums */
    float *s;       /* (G, ATTN_TILE) logits, then weights, of one tile */
};

/* Bytes of scratch one work item needs for G query heads of dim d. */
static size_t osm_bytes(int G, int d)
{
    return (size_t)G * sizeof(double) +
           (size_t)G * (1 + (size_t)d + ATTN_TILE) * sizeof(float);
}

static void osm_init(struct osm *o, void *slab, int G, int d, float scale,
                     const float *q)
{
    o->G = G;
    o->d = d;
    o->scale = scale;
    o->q = q;
    o->l = slab;
    o->m = (float *)(o->l + G);
    o->acc = o->m + G;
    o->s = o->acc + (size_t)G * (size_t)d;
    for (int g = 0; g < G; g++) {
        o->l[g] = 0.0;
        o->m[g] = -INFINITY;
    }
    memset(o->acc, 0, (size_t)G * (size_t)d * sizeof(float));
}

/* Feeds cnt keys/values, row t at kb + t*stride and vb + t*stride. */
static void osm_feed(struct osm *o, const float *kb, const float *vb,
                     size_t stride, int cnt)
{
    const int G = o->G, d = o->d;
    for (int t0 = 0; t0 < cnt; t0 += ATTN_TILE) {
        int tn = cnt - t0 < ATTN_TILE ? cnt - t0 : ATTN_TILE;
        const float *kt = kb + (size_t)t0 * stride;
        const float *vt = vb + (size_t)t0 * stride;
        for (int g = 0; g < G; g++) {
            const float *qg = o->q + (size_t)g * (size_t)d;
            float *sg = o->s + (size_t)g * ATTN_TILE;
            float mx = -INFINITY;
            int t = 0;
            /* Four keys per pass: four independent accumulators hide the
             * add latency that a single reduction chain would expose. */
            for (; t + 4 <= tn; t += 4) {
                const float *k0 = kt + (size_t)t * stride, *k1 = k0 + stride;
                const float *k2 = k1 + stride, *k3 = k2 + stride;
                float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
                for (int j = 0; j < d; j++) {
                    a0 += qg[j] * k0[j];
                    a1 += qg[j] * k1[j];
                    a2 += qg[j] * k2[j];
                    a3 += qg[j] * k3[j];
                }
                sg[t] = a0 * o->scale;
                sg[t + 1] = a1 * o->scale;
                sg[t + 2] = a2 * o->scale;
                sg[t + 3] = a3 * o->scale;
            }
            for (; t < tn; t++) {
                const float *kr = kt + (size_t)t * stride;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int j = 0; j < d; j++)
                    dot += qg[j] * kr[j];
                sg[t] = dot * o->scale;
            }
            for (t = 0; t < tn; t++)
                mx = sg[t] > mx ? sg[t] : mx;
            if (mx > o->m[g]) {
                /* Raise the running max; old terms shrink by e^(m_old - m). */
                float c = o->m[g] == -INFINITY ? 0.0f : expf(o->m[g] - mx);
                o->l[g] *= c;
                float *ag = o->acc + (size_t)g * (size_t)d;
#pragma omp simd
                for (int j = 0; j < d; j++)
                    ag[j] *= c;
                o->m[g] = mx;
            }
            double sum = 0.0;
            float mg = o->m[g];
            for (t = 0; t < tn; t++) {
                sg[t] = expf(sg[t] - mg);
                sum += sg[t];
            }
            o->l[g] += sum;
        }
        /* acc_g += sum_t p[g][t] v_t, four value rows per pass so each
         * accumulator element is loaded and stored once per four keys; the
         * tile's V rows stay in L1 across the G query heads. */
        for (int g = 0; g < G; g++) {
            const float *pg = o->s + (size_t)g * ATTN_TILE;
            float *ag = o->acc + (size_t)g * (size_t)d;
            int t = 0;
            for (; t + 4 <= tn; t += 4) {
                const float *v0 = vt + (size_t)t * stride, *v1 = v0 + stride;
                const float *v2 = v1 + stride, *v3 = v2 + stride;
                float p0 = pg[t], p1 = pg[t + 1], p2 = pg[t + 2], p3 = pg[t + 3];
#pragma omp simd
                for (int j = 0; j < d; j++)
                    ag[j] += p0 * v0[j] + p1 * v1[j] + p2 * v2[j] + p3 * v3[j];
            }
            for (; t < tn; t++) {
                const float *vr = vt + (size_t)t * stride;
                float p = pg[t];
#pragma omp simd
                for (int j = 0; j < d; j++)
                    ag[j] += p * vr[j];
            }
        }
    }
}

/* Feeds every token of KV head h's ragged row, page by page. */
static void osm_feed_rows(struct osm *o, const struct tg_kv_rows *r, int h)
{
    int g = r->head_group[h];
    int len = r->head_len != NULL ? r->head_len[h] : r->group_len[g];
    const int P = r->page_size, d = r->head_dim;
    size_t page_floats = (size_t)r->heads_per_group * 2 * (size_t)P * (size_t)d;
    size_t slot_off = (size_t)r->head_slot[h] * 2 * (size_t)P * (size_t)d;
    for (int t0 = 0, pi = 0; t0 < len; t0 += P, pi++) {
        const float *kb = r->pool + (size_t)r->group_pages[g][pi] * page_floats +
                          slot_off;
        int cnt = len - t0 < P ? len - t0 : P;
        osm_feed(o, kb, kb + (size_t)P * (size_t)d, (size_t)d, cnt);
    }
}

static void osm_finish(const struct osm *o, float *out)
{
    for (int g = 0; g < o->G; g++) {
        float inv = o->l[g] > 0.0 ? (float)(1.0 / o->l[g]) : 0.0f;
        const float *ag = o->acc + (size_t)g * (size_t)o->d;
        float *og = out + (size_t)g * (size_t)o->d;
#pragma omp simd
        for (int j = 0; j < o->d; j++)
            og[j] = ag[j] * inv;
    }
}

int cpu__rows_check(const struct tg_kv_rows *r)
{
    if (r == NULL || r->pool == NULL || r->head_group == NULL ||
        r->head_slot == NULL || r->group_pages == NULL || r->group_len == NULL ||
        r->heads_per_group < 1 || r->page_size < 1 || r->head_dim < 1 ||
        r->n_kv_heads < 1)
        return TG_EINVAL;
    for (int h = 0; h < r->n_kv_heads; h++) {
        int g = r->head_group[h], s = r->head_slot[h];
        if (g < 0 || s < 0 || s >= r->heads_per_group || r->group_len[g] < 0)
            return TG_EINVAL;
        if (r->group_len[g] > 0 && r->group_pages[g] == NULL)
            return TG_EINVAL;
        if (r->head_len != NULL &&
            (r->head_len[h] < 0 || r->head_len[h] > r->group_len[g]))
            return TG_EINVAL;
    }
    return 0;
}

int cpu__attn_chunk(struct tg_backend *b, const float *q, const float *k,
                    const float *v, int n, int n_q_heads,
                    const struct tg_kv_rows *hist, float scale, float *out)
{
    if (q == NULL || k == NULL || v == NULL || out == NULL || n < 0 ||
        n_q_heads < 1 || cpu__rows_check(hist) != 0)
        return TG_EINVAL;
    const int Hkv = hist->n_kv_heads, d = hist->head_dim;
    if (n_q_heads % Hkv != 0)
        return TG_EINVAL;
    const int G = n_q_heads / Hkv;
    if (cpu__scratch_reserve(b, osm_bytes(G, d)) != 0)
        return TG_ENOMEM;
    const size_t kstride = (size_t)Hkv * (size_t)d;
    const size_t qstride = (size_t)n_q_heads * (size_t)d;
    const long items = (long)n * Hkv;
    /* Total work ~ items * (history + n/2) * G * d multiply-adds. */
    size_t hist_max = 0;
    for (int h = 0; h < Hkv; h++) {
        size_t l = (size_t)hist->group_len[hist->head_group[h]];
        hist_max = l > hist_max ? l : hist_max;
    }
    int par = (size_t)items * (hist_max + (size_t)n / 2 + 1) * (size_t)G *
                  (size_t)d >= CPU_PAR_MIN_WORK;
#pragma omp parallel num_threads(b->n_threads) if (par)
    {
        void *slab = cpu__scratch(b, omp_get_thread_num());
        struct osm o;
        /* Later queries see more keys: hand out items dynamically. */
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < items; it++) {
            int i = (int)(it / Hkv), h = (int)(it % Hkv);
            size_t qoff = (size_t)i * qstride + (size_t)h * (size_t)G * (size_t)d;
            osm_init(&o, slab, G, d, scale, q + qoff);
            osm_feed_rows(&o, hist, h);
            osm_feed(&o, k + (size_t)h * (size_t)d, v + (size_t)h * (size_t)d,
                     kstride, i + 1);
            osm_finish(&o, out + qoff);
        }
    }
    return 0;
}

int cpu__attn_decode(struct tg_backend *b, const float *q, int n_seq,
                     int n_q_heads, const struct tg_kv_rows *rows, float scale,
                     float *out)
{
    if (q == NULL || out == NULL || n_seq < 0 || n_q_heads < 1 ||
        (rows == NULL && n_seq > 0))
        return TG_EINVAL;
    if (n_seq == 0)
        return 0;
    const int Hkv = rows[0].n_kv_heads, d = rows[0].head_dim;
    size_t total = 0;
    for (int s = 0; s < n_seq; s++) {
        const struct tg_kv_rows *r = &rows[s];
        if (cpu__rows_check(r) != 0 || r->n_kv_heads != Hkv || r->head_dim != d)
            return TG_EINVAL;
        for (int h = 0; h < Hkv; h++) {
            int l = r->head_len != NULL ? r->head_len[h]
                                        : r->group_len[r->head_group[h]];
            /* The rows already hold the new token, so none may be empty. */
            if (l < 1)
                return TG_EINVAL;
            total += (size_t)l;
        }
    }
    if (n_q_heads % Hkv != 0)
        return TG_EINVAL;
    const int G = n_q_heads / Hkv;
    if (cpu__scratch_reserve(b, osm_bytes(G, d)) != 0)
        return TG_ENOMEM;
    const size_t qstride = (size_t)n_q_heads * (size_t)d;
    const long items = (long)n_seq * Hkv;
    int par = items > 1 && total * (size_t)G * (size_t)d >= CPU_PAR_MIN_WORK;
#pragma omp parallel num_threads(b->n_threads) if (par)
    {
        void *slab = cpu__scratch(b, omp_get_thread_num());
        struct osm o;
        /* Rows differ in length (ragged budgets): balance dynamically. */
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < items; it++) {
            int s = (int)(it / Hkv), h = (int)(it % Hkv);
            size_t qoff = (size_t)s * qstride + (size_t)h * (size_t)G * (size_t)d;
            osm_init(&o, slab, G, d, scale, q + qoff);
            osm_feed_rows(&o, &rows[s], h);
            osm_finish(&o, out + qoff);
        }
    }
    return 0;
}
