/*
 * test_cpu_score.c — chunk scoring (snapkv, keydiff, expected attention) and
 * select_topk of the CPU backend: hand-computed cases, edge cases and naive
 * double-precision references on random shapes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/tg_ops.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1.0p-53;
}

static int irand(int n)
{
    return (int)(urand() * n);
}

static void fill(float *x, size_t n, double amp)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((urand() * 2.0 - 1.0) * amp);
}

static void near(double got, double want, double tol)
{
    double lim = tol * (fabs(want) > 1.0 ? fabs(want) : 1.0);
    if (!(fabs(got - want) <= lim)) {
        print_error("got %.9g want %.9g (tol %.3g)\n", got, want, tol);
        fail();
    }
}

static struct tg_backend *be(void)
{
    struct tg_backend *b = NULL;
    assert_int_equal(tg_backend_cpu_new(2, &b), 0);
    return b;
}

static double dotd(const float *a, const float *b, int d)
{
    double s = 0;
    for (int j = 0; j < d; j++)
        s += (double)a[j] * b[j];
    return s;
}

/* ---- references -------------------------------------------------------- */

static void ref_snapkv(const float *q, const float *k, int n, int Hq, int Hkv,
                       int d, int window, double scale, double *out)
{
    int G = Hq / Hkv, W = window < n ? window : n;
    double *s = calloc((size_t)n, sizeof(double)), *p = malloc(sizeof(double) * n);
    for (int h = 0; h < Hkv; h++) {
        memset(s, 0, sizeof(double) * n);
        for (int g = 0; g < G; g++)
            for (int i = n - W; i < n; i++) {
                const float *qi = q + ((size_t)i * Hq + h * G + g) * d;
                double mx = -INFINITY, z = 0;
                for (int j = 0; j <= i; j++) {
                    p[j] = dotd(qi, k + ((size_t)j * Hkv + h) * d, d) * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= i; j++)
                    z += exp(p[j] - mx);
                for (int j = 0; j <= i; j++)
                    s[j] += exp(p[j] - mx) / z / (G * W);
            }
        for (int j = 0; j < n; j++) {
            double a = 0;
            for (int t = j - 2; t <= j + 2; t++)
                a += (t >= 0 && t < n) ? s[t] : 0.0;
            out[h * n + j] = a / 5;
        }
    }
    free(s);
    free(p);
}

static void ref_keydiff(const float *k, int n, int Hkv, int d, double *out)
{
    double *a = malloc(sizeof(double) * d);
    for (int h = 0; h < Hkv; h++) {
        for (int c = 0; c < d; c++)
            a[c] = 0;
        for (int j = 0; j < n; j++) {
            const float *kj = k + ((size_t)j * Hkv + h) * d;
            double nr = sqrt(dotd(kj, kj, d));
            for (int c = 0; c < d; c++)
                a[c] += nr > 0 ? kj[c] / nr / n : 0.0;
        }
        double an = 0;
        for (int c = 0; c < d; c++)
            an += a[c] * a[c];
        an = sqrt(an);
        for (int j = 0; j < n; j++) {
            const float *kj = k + ((size_t)j * Hkv + h) * d;
            double nr = sqrt(dotd(kj, kj, d)), dot = 0;
            for (int c = 0; c < d; c++)
                dot += kj[c] * a[c];
            out[h * n + j] = (nr > 0 && an > 0) ? -dot / (nr * an) : 0.0;
        }
    }
    free(a);
}

/* Builds the full d x d covariance (independent of the op's shortcut). */
static void ref_ea(const float *q, const float *k, const float *v, int n, int Hq,
                   int Hkv, int d, int window, double scale, double *out)
{
    int G = Hq / Hkv, W = window < n ? window : n;
    double *mu = malloc(sizeof(double) * d), *S = malloc(sizeof(double) * d * d);
    double *z = malloc(sizeof(double) * n);
    for (int h = 0; h < Hkv; h++) {
        for (int j = 0; j < n; j++)
            out[h * n + j] = 0;
        for (int g = 0; g < G; g++) {
            int qh = h * G + g;
            for (int c = 0; c < d; c++) {
                mu[c] = 0;
                for (int i = n - W; i < n; i++)
                    mu[c] += q[((size_t)i * Hq + qh) * d + c] / W;
            }
            for (int r = 0; r < d; r++)
                for (int c = 0; c < d; c++) {
                    double acc = 0;
                    for (int i = n - W; i < n; i++)
                        acc += (q[((size_t)i * Hq + qh) * d + r] - mu[r]) *
                               (q[((size_t)i * Hq + qh) * d + c] - mu[c]);
                    S[r * d + c] = acc / W;
                }
            double mx = -INFINITY, Z = 0;
            for (int j = 0; j < n; j++) {
                const float *kj = k + ((size_t)j * Hkv + h) * d;
                double m1 = 0, quad = 0;
                for (int r = 0; r < d; r++) {
                    m1 += mu[r] * kj[r];
                    for (int c = 0; c < d; c++)
                        quad += kj[r] * S[r * d + c] * kj[c];
                }
                z[j] = m1 * scale + 0.5 * scale * scale * quad;
                mx = z[j] > mx ? z[j] : mx;
            }
            for (int j = 0; j < n; j++)
                Z += exp(z[j] - mx);
            for (int j = 0; j < n; j++)
                out[h * n + j] += exp(z[j] - mx) / Z / G;
        }
        for (int j = 0; j < n; j++) {
            const float *vj = v + ((size_t)j * Hkv + h) * d;
            out[h * n + j] *= sqrt(dotd(vj, vj, d));
        }
    }
    free(mu);
    free(S);
    free(z);
}

/* ---- scoring ----------------------------------------------------------- */

/* Zero queries give a uniform causal softmax: query i puts 1/(i+1) on every
 * key j <= i. n = 6, window 32 > n so W = 6, G = 1:
 *   s[j] = (1/6) * sum_{i=j..5} 1/(i+1)
 *   s = {147/360, 87/360, 57/360, 37/360, 22/360, 10/360}
 *   pooled[j] = sum of s over [j-2, j+2] clipped to [0,5], divided by 5. */
static void test_snapkv_hand(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    float q[6 * 2] = {0}, k[6 * 2];
    fill(k, 12, 3.0);
    float sc[6];
    assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_SNAPKV, q, k, k, 6, 1, 1, 2, 32,
                                      0.7f, sc), 0);
    const double s[6] = {147 / 360.0, 87 / 360.0, 57 / 360.0,
                         37 / 360.0,  22 / 360.0, 10 / 360.0};
    const double want[6] = {(s[0] + s[1] + s[2]) / 5,
                            (s[0] + s[1] + s[2] + s[3]) / 5,
                            (s[0] + s[1] + s[2] + s[3] + s[4]) / 5,
                            (s[1] + s[2] + s[3] + s[4] + s[5]) / 5,
                            (s[2] + s[3] + s[4] + s[5]) / 5,
                            (s[3] + s[4] + s[5]) / 5};
    for (int j = 0; j < 6; j++)
        near(sc[j], want[j], 1e-6);
    /* Window 2 of n = 6: queries 4 and 5 only, mean over 2:
     *   s[j<=4] = (1/5 + 1/6)/2 = 11/60, s[5] = 1/12. */
    assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_SNAPKV, q, k, k, 6, 1, 1, 2, 2,
                                      0.7f, sc), 0);
    const double a = 11 / 60.0, c = 1 / 12.0;
    near(sc[0], 3 * a / 5, 1e-6);
    near(sc[1], 4 * a / 5, 1e-6);
    near(sc[2], 5 * a / 5, 1e-6);
    near(sc[3], (4 * a + c) / 5, 1e-6);
    near(sc[4], (3 * a + c) / 5, 1e-6);
    near(sc[5], (2 * a + c) / 5, 1e-6);
    /* One token: softmax is 1 on itself, pooled 1/5. */
    assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_SNAPKV, q, k, k, 1, 1, 1, 2, 32,
                                      0.7f, sc), 0);
    near(sc[0], 0.2, 1e-7);
    tg_backend_cpu_free(b);
}

static void test_score_random(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int cfg[][5] = {/* n, Hkv, G, d, window */
                          {1, 1, 1, 4, 32},  {2, 2, 2, 8, 32},   {7, 1, 4, 16, 3},
                          {40, 4, 2, 8, 32}, {64, 2, 4, 32, 32}, {33, 3, 1, 8, 5},
                          {200, 2, 2, 16, 32}};
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        int n = cfg[c][0], Hkv = cfg[c][1], G = cfg[c][2], d = cfg[c][3], w = cfg[c][4];
        int Hq = Hkv * G;
        float *q = malloc(sizeof(float) * n * Hq * d), *k = malloc(sizeof(float) * n * Hkv * d);
        float *v = malloc(sizeof(float) * n * Hkv * d), *sc = malloc(sizeof(float) * Hkv * n);
        double *ref = malloc(sizeof(double) * Hkv * n);
        fill(q, (size_t)n * Hq * d, 2.0);
        fill(k, (size_t)n * Hkv * d, 2.0);
        fill(v, (size_t)n * Hkv * d, 1.0);
        double scale = 1.0 / sqrt((double)d);

        assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_SNAPKV, q, k, v, n, Hq, Hkv, d, w,
                                          (float)scale, sc), 0);
        ref_snapkv(q, k, n, Hq, Hkv, d, w, scale, ref);
        for (int j = 0; j < Hkv * n; j++)
            near(sc[j], ref[j], 1e-5);

        assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_KEYDIFF, q, k, v, n, Hq, Hkv, d, w,
                                          (float)scale, sc), 0);
        ref_keydiff(k, n, Hkv, d, ref);
        for (int j = 0; j < Hkv * n; j++)
            near(sc[j], ref[j], 1e-5);

        assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_EXPECTED_ATTENTION, q, k, v, n, Hq,
                                          Hkv, d, w, (float)scale, sc), 0);
        ref_ea(q, k, v, n, Hq, Hkv, d, w, scale, ref);
        for (int j = 0; j < Hkv * n; j++)
            near(sc[j], ref[j], 1e-4);
        free(q);
        free(k);
        free(v);
        free(sc);
        free(ref);
    }
    tg_backend_cpu_free(b);
}

static void test_keydiff_edges(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    /* d = 2, one head: keys (1,0), (2,0), (0,0), (0,3).
     * a = mean of unit keys = ((1+1+0+0)/4, (0+0+0+1)/4) = (0.5, 0.25),
     * cos((1,0), a) = 0.5/|a| = 2/sqrt(5); cos((0,1), a) = 1/sqrt(5);
     * the zero key scores 0. */
    float k[8] = {1, 0, 2, 0, 0, 0, 0, 3}, sc[4];
    assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_KEYDIFF, NULL, k, NULL, 4, 1, 1, 2, 0,
                                      1.0f, sc), 0);
    near(sc[0], -2 / sqrt(5.0), 1e-6);
    near(sc[1], -2 / sqrt(5.0), 1e-6);
    near(sc[2], 0.0, 1e-7);
    near(sc[3], -1 / sqrt(5.0), 1e-6);
    tg_backend_cpu_free(b);
}

static void test_ea_constant_queries(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    /* Identical queries: Sigma = 0, so scores are softmax(mu.k*scale)*|v|.
     * d = 1, q = 1, keys 0, ln 2, ln 3 with scale 1: softmax = 1/6, 2/6, 3/6;
     * values of norm 1, 2, 0.5. */
    float q[3] = {1, 1, 1}, k[3] = {0, (float)log(2.0), (float)log(3.0)};
    float v[3] = {1, -2, 0.5f}, sc[3];
    assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_EXPECTED_ATTENTION, q, k, v, 3, 1, 1,
                                      1, 32, 1.0f, sc), 0);
    near(sc[0], 1 / 6.0, 1e-6);
    near(sc[1], 2 * 2 / 6.0, 1e-6);
    near(sc[2], 0.5 * 3 / 6.0, 1e-6);
    tg_backend_cpu_free(b);
}

static void test_score_bad(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    float x[16] = {0}, sc[4];
    assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_SNAPKV, x, x, x, 2, 3, 2, 2, 32, 1.0f, sc),
                     TG_EINVAL);
    assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_SNAPKV, NULL, x, x, 2, 2, 2, 2, 32, 1.0f, sc),
                     TG_EINVAL);
    assert_int_equal(tg_ops_cpu.score(b, (enum tg_score_method)7, x, x, x, 2, 2, 2, 2, 32,
                                      1.0f, sc), TG_EINVAL);
    assert_int_equal(tg_ops_cpu.score(b, TG_SCORE_SNAPKV, x, x, x, 0, 2, 2, 2, 32, 1.0f, sc), 0);
    tg_backend_cpu_free(b);
}

/* ---- select_topk ------------------------------------------------------- */

static void ref_topk(const float *s, int n, int keep, int64_t start, int window,
                     int n_sink, int32_t *out)
{
    int W = window > 0 ? (window < n ? window : n) : 0;
    uint8_t *taken = calloc((size_t)n, 1);
    for (int t = 0; t < keep; t++) {
        int best = -1;
        double bv = 0;
        for (int i = 0; i < n; i++) {
            if (taken[i])
                continue;
            double x = (i >= n - W || start + i < n_sink) ? INFINITY : s[i];
            if (best < 0 || x > bv) {
                best = i;
                bv = x;
            }
        }
        taken[best] = 1;
    }
    int o = 0;
    for (int i = 0; i < n; i++)
        if (taken[i])
            out[o++] = i;
    free(taken);
}

static void test_topk_hand(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    /* Ties go to the lower index: scores 1 at 1, 3, 4, 6; keep 3, no forced. */
    float s[8] = {0, 1, 0, 1, 1, 0, 1, 0};
    int32_t keep[1] = {3}, idx[8];
    assert_int_equal(tg_ops_cpu.select_topk(b, s, 8, 1, keep, 100, 0, 4, idx), 0);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 3);
    assert_int_equal(idx[2], 4);
    /* Forced: window 2 (indices 6, 7) and sinks (start 2: indices 0, 1). */
    keep[0] = 5;
    assert_int_equal(tg_ops_cpu.select_topk(b, s, 8, 1, keep, 2, 2, 4, idx), 0);
    const int32_t want[5] = {0, 1, 3, 6, 7};
    assert_memory_equal(idx, want, sizeof(want));
    /* Fewer slots than forced keys: the lowest-index forced keys win. */
    keep[0] = 3;
    assert_int_equal(tg_ops_cpu.select_topk(b, s, 8, 1, keep, 2, 2, 4, idx), 0);
    assert_int_equal(idx[0], 0);
    assert_int_equal(idx[1], 1);
    assert_int_equal(idx[2], 6);
    /* keep = n keeps everything in order; keep = 0 writes nothing. */
    keep[0] = 8;
    assert_int_equal(tg_ops_cpu.select_topk(b, s, 8, 1, keep, 0, 32, 4, idx), 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(idx[i], i);
    keep[0] = 0;
    idx[0] = -7;
    assert_int_equal(tg_ops_cpu.select_topk(b, s, 8, 1, keep, 0, 2, 0, idx), 0);
    assert_int_equal(idx[0], -7);
    /* Window larger than n forces every key. */
    float s3[3] = {5, 9, 7};
    keep[0] = 2;
    assert_int_equal(tg_ops_cpu.select_topk(b, s3, 3, 1, keep, 50, 32, 4, idx), 0);
    assert_int_equal(idx[0], 0);
    assert_int_equal(idx[1], 1);
    /* NaN ranks below everything. */
    float sn[3] = {NAN, -1e30f, 2};
    keep[0] = 2;
    assert_int_equal(tg_ops_cpu.select_topk(b, sn, 3, 1, keep, 50, 0, 0, idx), 0);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 2);
    /* keep outside [0, n]. */
    keep[0] = 9;
    assert_int_equal(tg_ops_cpu.select_topk(b, s, 8, 1, keep, 0, 2, 4, idx), TG_EINVAL);
    keep[0] = -1;
    assert_int_equal(tg_ops_cpu.select_topk(b, s, 8, 1, keep, 0, 2, 4, idx), TG_EINVAL);
    tg_backend_cpu_free(b);
}

static void test_topk_random(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    for (int rep = 0; rep < 60; rep++) {
        int n = 1 + irand(rep < 50 ? 40 : 600), Hkv = 1 + irand(8);
        int window = irand(3) == 0 ? 0 : irand(40);
        int n_sink = irand(6);
        int64_t start = irand(3) == 0 ? 0 : irand(10);
        float *s = malloc(sizeof(float) * n * Hkv);
        int32_t *idx = malloc(sizeof(int32_t) * n * Hkv), *ref = malloc(sizeof(int32_t) * n);
        int32_t *keep = malloc(sizeof(int32_t) * Hkv);
        /* Few distinct values so ties are common. */
        for (int i = 0; i < n * Hkv; i++)
            s[i] = (float)irand(5);
        for (int h = 0; h < Hkv; h++)
            keep[h] = irand(n + 1);
        assert_int_equal(tg_ops_cpu.select_topk(b, s, n, Hkv, keep, start, window, n_sink,
                                                idx), 0);
        for (int h = 0; h < Hkv; h++) {
            ref_topk(s + (size_t)h * n, n, keep[h], start, window, n_sink, ref);
            assert_memory_equal(idx + (size_t)h * n, ref, sizeof(int32_t) * keep[h]);
        }
        free(s);
        free(idx);
        free(ref);
        free(keep);
    }
    tg_backend_cpu_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapkv_hand),
        cmocka_unit_test(test_score_random),
        cmocka_unit_test(test_keydiff_edges),
        cmocka_unit_test(test_ea_constant_queries),
        cmocka_unit_test(test_score_bad),
        cmocka_unit_test(test_topk_hand),
        cmocka_unit_test(test_topk_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
