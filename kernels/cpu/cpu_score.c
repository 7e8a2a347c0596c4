/*
 * cpu_score.c — chunk compression on the CPU: key scoring (DESIGN.md §4.4),
 * per-head top-k selection with forced keys, and the KV append into pages.
 *
 * Scoring methods, per KV head h with query heads h*G .. h*G+G-1, chunk of n
 * keys, window W = min(window, n) (window <= 0 means the whole chunk):
 *
 * snapkv (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before
 *   Generation"; exact form of §4.4):
 *     s[j] = 1/(G*W) * sum_{g, i in last W} softmax_{j' <= i}(q_{g,i}.k_j' *
 *            scale)[j]      (0 when j > i)
 *     score[j] = (s[j-2] + s[j-1] + s[j] + s[j+1] + s[j+2]) / 5, out-of-range
 *     terms 0 (avg_pool1d, kernel 5, padding 2, count_include_pad).
 *
 * keydiff (kvpress KeyDiffPress, NVIDIA/kvpress
 *   kvpress/presses/keydiff_press.py; Park et al. 2025, "KeyDiff"):
 *     a = mean_j k_j / ||k_j||,   score[j] = -cos(k_j, a)
 *   A zero key (or a zero anchor) has cosine 0 and contributes 0 to a.
 *
 * expected_attention (kvpress ExpectedAttentionPress, NVIDIA/kvpress
 *   kvpress/presses/expected_attention_press.py). For each query head, the
 *   chunk's last W queries give the mean mu and the population covariance
 *   Sigma = 1/W sum_i (q_i - mu)(q_i - mu)^T; a query q ~ N(mu, Sigma) has
 *   E[exp(q.k*scale)] = exp(mu.k*scale + 0.5*scale^2 k^T Sigma k), so
 *     z_j = mu.k_j*scale + 0.5*scale^2 * k_j^T Sigma k_j
 *     score[j] = ||v_j|| * mean over the G query heads of softmax_j(z)
 *   over all n chunk keys (use_vnorm=True, epsilon 0, as kvpress's defaults).
 *   Documented simplification: kvpress estimates mu/Sigma from pre-RoPE
 *   queries and rotates them by the average RoPE matrix of the next 512
 *   positions; we use the queries as given (after RoPE at their own
 *   positions), which needs no weights inside the op. k^T Sigma k is
 *   evaluated as 1/W sum_i ((q_i - mu).k)^2, O(W d) per key instead of d^2.
 *   Sinks are not special here: select_topk forces them.
 *
 * Sums over keys, queries and softmax denominators are kept in double; the
 * dot products themselves are fp32 simd reductions.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/cpu/cpu_internal.h"

static float dotf(const float *a, const float *b, int d)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < d; j++)
        s += a[j] * b[j];
    return s;
}

/* ---- snapkv ------------------------------------------------------------ */

/* Scratch: acc (n doubles), z (n floats). */
static void snapkv_head(const float *q, const float *k, int n, int Hq, int Hkv,
                        int d, int W, float scale, int h, void *slab,
                        float *score)
{
    const int G = Hq / Hkv;
    double *acc = slab;
    float *z = (float *)(acc + n);
    memset(acc, 0, (size_t)n * sizeof(double));
    for (int g = 0; g < G; g++) {
        int qh = h * G + g;
        for (int i = n - W; i < n; i++) {
            const float *qi = q + ((size_t)i * Hq + qh) * (size_t)d;
            float mx = -INFINITY;
            for (int j = 0; j <= i; j++) {
                z[j] = dotf(qi, k + ((size_t)j * Hkv + h) * (size_t)d, d) * scale;
                mx = z[j] > mx ? z[j] : mx;
            }
            double sum = 0.0;
            for (int j = 0; j <= i; j++) {
                z[j] = expf(z[j] - mx);
                sum += z[j];
            }
            double inv = 1.0 / sum;
            for (int j = 0; j <= i; j++)
                acc[j] += z[j] * inv;
        }
    }
    double norm = 1.0 / ((double)G * (double)W);
    for (int j = 0; j < n; j++) {
        double p = 0.0;
        for (int t = j - 2; t <= j + 2; t++)
            if (t >= 0 && t < n)
                p += acc[t];
        score[j] = (float)(p * norm / 5.0);
    }
}

/* ---- keydiff ----------------------------------------------------------- */

/* Scratch: anchor (d doubles), inverse key norms (n doubles). */
static void keydiff_head(const float *k, int n, int Hkv, int d, int h,
                         void *slab, float *score)
{
    double *a = slab;
    double *inv = a + d;
    memset(a, 0, (size_t)d * sizeof(double));
    for (int j = 0; j < n; j++) {
        const float *kj = k + ((size_t)j * Hkv + h) * (size_t)d;
        double ss = 0.0;
        for (int c = 0; c < d; c++)
            ss += (double)kj[c] * kj[c];
        inv[j] = ss > 0.0 ? 1.0 / sqrt(ss) : 0.0;
        for (int c = 0; c < d; c++)
            a[c] += kj[c] * inv[j];
    }
    double an = 0.0;
    for (int c = 0; c < d; c++) {
        a[c] /= n;
        an += a[c] * a[c];
    }
    an = an > 0.0 ? 1.0 / sqrt(an) : 0.0;
    for (int j = 0; j < n; j++) {
        const float *kj = k + ((size_t)j * Hkv + h) * (size_t)d;
        double dot = 0.0;
        for (int c = 0; c < d; c++)
            dot += kj[c] * a[c];
        score[j] = (float)(-dot * inv[j] * an);
    }
}

/* ---- expected attention ------------------------------------------------ */

/* Scratch: acc (n doubles), z (n doubles), mu (d doubles),
 * centred queries (W, d) floats. */
static size_t ea_bytes(int n, int d, int W)
{
    return (2 * (size_t)n + (size_t)d) * sizeof(double) +
           (size_t)W * (size_t)d * sizeof(float);
}

static void ea_head(const float *q, const float *k, const float *v, int n,
                    int Hq, int Hkv, int d, int W, float scale, int h,
                    void *slab, float *score)
{
    const int G = Hq / Hkv;
    double *acc = slab;
    double *z = acc + n;
    double *mu = z + n;
    float *cq = (float *)(mu + d);
    memset(acc, 0, (size_t)n * sizeof(double));
    for (int g = 0; g < G; g++) {
        int qh = h * G + g;
        memset(mu, 0, (size_t)d * sizeof(double));
        for (int i = n - W; i < n; i++) {
            const float *qi = q + ((size_t)i * Hq + qh) * (size_t)d;
            for (int c = 0; c < d; c++)
                mu[c] += qi[c];
        }
        for (int c = 0; c < d; c++)
            mu[c] /= W;
        for (int w = 0; w < W; w++) {
            const float *qi = q + ((size_t)(n - W + w) * Hq + qh) * (size_t)d;
            float *cw = cq + (size_t)w * (size_t)d;
            for (int c = 0; c < d; c++)
                cw[c] = (float)(qi[c] - mu[c]);
        }
        double mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            const float *kj = k + ((size_t)j * Hkv + h) * (size_t)d;
            double m1 = 0.0;
            for (int c = 0; c < d; c++)
                m1 += mu[c] * kj[c];
            double quad = 0.0; /* k^T Sigma k = 1/W sum_w (c_w . k)^2 */
            for (int w = 0; w < W; w++) {
                double t = dotf(cq + (size_t)w * (size_t)d, kj, d);
                quad += t * t;
            }
            quad /= W;
            z[j] = m1 * scale + 0.5 * (double)scale * scale * quad;
            mx = z[j] > mx ? z[j] : mx;
        }
        double sum = 0.0;
        for (int j = 0; j < n; j++) {
            z[j] = exp(z[j] - mx);
            sum += z[j];
        }
        for (int j = 0; j < n; j++)
            acc[j] += z[j] / sum;
    }
    for (int j = 0; j < n; j++) {
        const float *vj = v + ((size_t)j * Hkv + h) * (size_t)d;
        double ss = 0.0;
        for (int c = 0; c < d; c++)
            ss += (double)vj[c] * vj[c];
        score[j] = (float)(acc[j] / G * sqrt(ss));
    }
}

int cpu__score(struct tg_backend *b, enum tg_score_method method,
               const float *q, const float *k, const float *v, int n,
               int n_q_heads, int n_kv_heads, int d, int window, float scale,
               float *scores)
{
    if (k == NULL || scores == NULL || n < 0 || n_kv_heads < 1 || d < 1 ||
        n_q_heads < 1 || n_q_heads % n_kv_heads != 0)
        return TG_EINVAL;
    if (method != TG_SCORE_KEYDIFF && q == NULL)
        return TG_EINVAL;
    if (method == TG_SCORE_EXPECTED_ATTENTION && v == NULL)
        return TG_EINVAL;
    if (method != TG_SCORE_SNAPKV && method != TG_SCORE_KEYDIFF &&
        method != TG_SCORE_EXPECTED_ATTENTION)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    const int W = window > 0 && window < n ? window : n;
    const int G = n_q_heads / n_kv_heads;
    size_t bytes, work;
    switch (method) {
    case TG_SCORE_SNAPKV:
        bytes = (size_t)n * (sizeof(double) + sizeof(float));
        work = (size_t)G * W * n * d;
        break;
    case TG_SCORE_KEYDIFF:
        bytes = ((size_t)d + (size_t)n) * sizeof(double);
        work = (size_t)n * d;
        break;
    default:
        bytes = ea_bytes(n, d, W);
        work = (size_t)G * W * n * d;
        break;
    }
    if (cpu__scratch_reserve(b, bytes) != 0)
        return TG_ENOMEM;
    int par = n_kv_heads > 1 && work * (size_t)n_kv_heads >= CPU_PAR_MIN_WORK;
#pragma omp parallel num_threads(b->n_threads) if (par)
    {
        void *slab = cpu__scratch(b, omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
        for (int h = 0; h < n_kv_heads; h++) {
            float *sc = scores + (size_t)h * (size_t)n;
            if (method == TG_SCORE_SNAPKV)
                snapkv_head(q, k, n, n_q_heads, n_kv_heads, d, W, scale, h,
                            slab, sc);
            else if (method == TG_SCORE_KEYDIFF)
                keydiff_head(k, n, n_kv_heads, d, h, slab, sc);
            else
                ea_head(q, k, v, n, n_q_heads, n_kv_heads, d, W, scale, h,
                        slab, sc);
        }
    }
    return 0;
}

/* ---- selection --------------------------------------------------------- */

static void swap_pairs(struct cpu_pair *a, int i, int j)
{
    struct cpu_pair t = a[i];
    a[i] = a[j];
    a[j] = t;
}

void cpu__select_first(struct cpu_pair *a, int n, int k)
{
    if (k <= 0 || k >= n)
        return;
    /* Quickselect for rank k-1 (Hoare 1961, "FIND"), median-of-three pivot,
     * Lomuto partition. The order is total (indices are unique), so no
     * equal-key degeneracy. */
    int lo = 0, hi = n - 1, target = k - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (cpu__pair_before(a[mid], a[lo]))
            swap_pairs(a, mid, lo);
        if (cpu__pair_before(a[hi], a[lo]))
            swap_pairs(a, hi, lo);
        if (cpu__pair_before(a[hi], a[mid]))
            swap_pairs(a, hi, mid);
        /* a[lo] <= a[mid] <= a[hi] in rank order: the median goes last. */
        swap_pairs(a, mid, hi);
        struct cpu_pair piv = a[hi];
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (cpu__pair_before(a[i], piv))
                swap_pairs(a, i, store++);
        swap_pairs(a, store, hi);
        if (store == target)
            return;
        if (store > target)
            hi = store - 1;
        else
            lo = store + 1;
    }
}

static int pair_cmp(const void *pa, const void *pb)
{
    const struct cpu_pair *a = pa, *b = pb;
    if (cpu__pair_before(*a, *b))
        return -1;
    if (cpu__pair_before(*b, *a))
        return 1;
    return 0;
}

void cpu__sort_pairs(struct cpu_pair *a, int n)
{
    if (n > 1)
        qsort(a, (size_t)n, sizeof(*a), pair_cmp);
}

int cpu__select_topk(struct tg_backend *b, const float *scores, int n,
                     int n_kv_heads, const int32_t *keep, int64_t start,
                     int window, int n_sink, int32_t *idx)
{
    if (scores == NULL || keep == NULL || idx == NULL || n < 0 ||
        n_kv_heads < 1 || start < 0)
        return TG_EINVAL;
    for (int h = 0; h < n_kv_heads; h++)
        if (keep[h] < 0 || keep[h] > n)
            return TG_EINVAL;
    if (n == 0)
        return 0;
    int W = window > 0 ? (window < n ? window : n) : 0;
    if (cpu__scratch_reserve(b, (size_t)n * (sizeof(struct cpu_pair) + 1)) != 0)
        return TG_ENOMEM;
    const size_t nn = (size_t)n;
    int par = n_kv_heads > 1 && nn * (size_t)n_kv_heads >= 8192;
#pragma omp parallel num_threads(b->n_threads) if (par)
    {
        struct cpu_pair *pr = cpu__scratch(b, omp_get_thread_num());
        uint8_t *mark = (uint8_t *)(pr + nn);
#pragma omp for schedule(static)
        for (int h = 0; h < n_kv_heads; h++) {
            const float *s = scores + (size_t)h * (size_t)n;
            for (int i = 0; i < n; i++) {
                float x = s[i];
                /* Forced keys rank as +inf; NaN ranks last so the order
                 * stays total. */
                if (i >= n - W || start + i < (int64_t)n_sink)
                    x = INFINITY;
                else if (isnan(x))
                    x = -INFINITY;
                pr[i].v = x;
                pr[i].i = i;
            }
            int kk = keep[h];
            cpu__select_first(pr, n, kk);
            memset(mark, 0, nn);
            for (int t = 0; t < kk; t++)
                mark[pr[t].i] = 1;
            int32_t *out = idx + (size_t)h * (size_t)n;
            int o = 0;
            for (int i = 0; i < n; i++)
                if (mark[i])
                    out[o++] = i;
        }
    }
    return 0;
}

/* ---- append ------------------------------------------------------------ */

int cpu__kv_append(struct tg_backend *b, const struct tg_kv_rows *rows,
                   const float *k, const float *v, int n, const int32_t *idx,
                   const int32_t *n_keep)
{
    if (cpu__rows_check(rows) != 0 || k == NULL || v == NULL || n < 0 ||
        (idx != NULL && n_keep == NULL))
        return TG_EINVAL;
    const int Hkv = rows->n_kv_heads, d = rows->head_dim, P = rows->page_size;
    /* Validate everything before the first write, so a bad call leaves the
     * pages untouched. */
    for (int h = 0; h < Hkv; h++) {
        int cnt = idx != NULL ? n_keep[h] : n;
        int g = rows->head_group[h];
        if (cnt < 0 || cnt > n)
            return TG_EINVAL;
        if (cnt > 0 && rows->group_pages[g] == NULL)
            return TG_EINVAL;
        for (int h2 = 0; h2 < h && rows->head_len == NULL; h2++)
            if (rows->head_group[h2] == g &&
                (idx != NULL ? n_keep[h2] : n) != cnt)
                return TG_EINVAL; /* a group's heads share one length */
        if (idx != NULL)
            for (int t = 0; t < cnt; t++)
                if (idx[(size_t)h * n + t] < 0 || idx[(size_t)h * n + t] >= n)
                    return TG_EINVAL;
    }
    size_t page_floats = (size_t)rows->heads_per_group * 2 * (size_t)P * (size_t)d;
    size_t row_bytes = (size_t)d * sizeof(float);
    int par = Hkv > 1 && (size_t)n * (size_t)Hkv * (size_t)d * 2 >= 4 * CPU_PAR_MIN_WORK;
#pragma omp parallel for num_threads(b->n_threads) if (par) schedule(static)
    for (int h = 0; h < Hkv; h++) {
        int g = rows->head_group[h];
        int cnt = idx != NULL ? n_keep[h] : n;
        int64_t base = rows->head_len != NULL ? rows->head_len[h]
                                              : rows->group_len[g];
        size_t slot_off = (size_t)rows->head_slot[h] * 2 * (size_t)P * (size_t)d;
        for (int t = 0; t < cnt; t++) {
            int src = idx != NULL ? idx[(size_t)h * n + t] : t;
            int64_t pos = base + t;
            float *pg = rows->pool +
                        (size_t)rows->group_pages[g][pos / P] * page_floats +
                        slot_off;
            size_t off = (size_t)(pos % P) * (size_t)d;
            size_t so = ((size_t)src * Hkv + h) * (size_t)d;
            memcpy(pg + off, k + so, row_bytes);
            memcpy(pg + (size_t)P * (size_t)d + off, v + so, row_bytes);
        }
    }
    return 0;
}
