/* test_cuda_sample.c — the device sampler (kernels/cuda/sample.h) against
 * the CPU reference (tg_ops_cpu.logprobs / .sample):
 *   - logprobs vs CPU log_softmax over vocabularies 1..151936, with -inf
 *     entries, tied maxima and large offsets; out-of-range targets give NaN;
 *   - argmax and greedy sampling equal CPU greedy (ties to the lower id,
 *     NaN never wins, all -inf/NaN rows give 0); top-k = 1 equals greedy;
 *   - top-K logprobs equal the CPU's top ids and values;
 *   - seeded reproducibility: the same (row, params, seed, step) gives the
 *     same token alone, in a batch, in another batch order, across sort
 *     chunks; the returned logprob is the CPU's for that token;
 *   - empirical distribution of 20000 draws on a 16-token vocabulary under
 *     temperature/top-k/top-p/min-p vs the exact distribution of the
 *     sampler's definition (and the CPU sampler against the same numbers);
 *   - tokens of weight 0 (-inf logits, below min-p) are never drawn on a
 *     151936-token vocabulary, whatever the block scan's rounding;
 *   - the first non-finite logit of each row (NaN, +-inf) equals a host
 *     scan's;
 *   - bad arguments.
 * Skipped (77) without CUDA or a device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/tg_ops.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/sample.h"
#endif

#ifdef TANGRAM_CUDA
static char err[256];
static struct tt_xrng rng = {0x2545f4914f6cdd1dull};

/* Random logits (roughly 3 * N(0, 1/3) per entry) for n rows of V with
 * the special rows tests want: row kind = i % 6:
 *   0 plain, 1 tied maximum at two ids (the higher id written first),
 *   2 some -inf, 3 offset by 1e4, 4 some NaN, 5 plain. */
static float *make_logits(int n, int V)
{
    float *x = malloc((size_t)n * (size_t)V * sizeof(float));
    assert_non_null(x);
    for (int i = 0; i < n; i++) {
        float *r = x + (size_t)i * V;
        for (int j = 0; j < V; j++)
            r[j] = 3.0f *
                   (tt_xrng_sym(&rng) + tt_xrng_sym(&rng) + tt_xrng_sym(&rng)) /
                   3.0f;
        switch (i % 6) {
        case 1:
            if (V >= 3) {
                r[V - 1] = 9.0f;
                r[V / 2] = 9.0f;
            }
            break;
        case 2:
            for (int j = 0; j < V; j += 3)
                r[j] = -INFINITY;
            if (V == 1)
                r[0] = 0.0f; /* keep one finite entry */
            break;
        case 3:
            for (int j = 0; j < V; j++)
                r[j] += 1e4f;
            break;
        case 4:
            for (int j = 1; j < V; j += 7)
                r[j] = NAN;
            break;
        default:
            break;
        }
    }
    return x;
}

static const struct tg_sampling greedy_sp = TG_SAMPLING_OFF;

/* CPU greedy token of one row (the CPU op may scribble on its input). */
static int32_t cpu_greedy(struct tg_backend *cpu, const float *row, int V)
{
    float *tmp = malloc((size_t)V * sizeof(float));
    assert_non_null(tmp);
    memcpy(tmp, row, (size_t)V * sizeof(float));
    int32_t tok = -1;
    assert_int_equal(tg_ops_cpu.sample(cpu, tmp, V, &greedy_sp, NULL, NULL,
                                       &tok, NULL, 0, NULL, NULL), 0);
    free(tmp);
    return tok;
}

static void test_logprobs(void **state)
{
    (void)state;
    static const int shapes[][2] = {{1, 1},    {3, 7},      {12, 1000},
                                    {6, 32000}, {6, 128256}, {2, 151936}};
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], V = shapes[s][1];
        float *x = make_logits(n, V);
        /* NaN rows give NaN on both sides (checked in the top-K test);
         * compare finite numbers here. */
        for (int i = 0; i < n; i++)
            if (i % 6 == 4)
                for (int j = 0; j < V; j++)
                    if (isnan(x[(size_t)i * V + j]))
                        x[(size_t)i * V + j] = -1.0f;
        int32_t *t = malloc((size_t)n * sizeof(int32_t));
        float *ref = malloc((size_t)n * sizeof(float));
        float *got = malloc((size_t)n * sizeof(float));
        assert_non_null(t);
        assert_non_null(ref);
        assert_non_null(got);
        for (int i = 0; i < n; i++) {
            t[i] = (int32_t)(tt_xrng_next(&rng) % (uint64_t)V);
            if (i % 6 == 2 && isinf(x[(size_t)i * V + t[i]]))
                t[i] = (int32_t)((t[i] + 1) % V); /* a finite target */
        }
        assert_int_equal(tg_ops_cpu.logprobs(cpu, x, n, V, t, ref), 0);
        float *dx = tt_cuda_upload(x, (size_t)n * V * sizeof(float));
        int32_t *dt = tt_cuda_upload(t, (size_t)n * sizeof(int32_t));
        float *dl = tt_cuda_alloc((size_t)n * sizeof(float));
        assert_int_equal(tg_cuda_logprobs(dx, n, V, dt, dl, NULL), 0);
        tt_cuda_sync_to_host(got, dl, (size_t)n * sizeof(float));
        for (int i = 0; i < n; i++) {
            float mx = 0.0f;
            for (int j = 0; j < V; j++)
                if (fabsf(x[(size_t)i * V + j]) > mx &&
                    !isinf(x[(size_t)i * V + j]))
                    mx = fabsf(x[(size_t)i * V + j]);
            /* fp32 lse: a few ulps of the row's magnitude, plus the
             * fp32 sum's relative error. */
            double tol = 1e-4 + 1e-5 * fabs(ref[i]) + 5e-7 * mx;
            if (!(fabs((double)got[i] - ref[i]) <= tol))
                fail_msg("V %d row %d: lp %.7g, cpu %.7g", V, i, got[i],
                         ref[i]);
        }
        /* Out-of-range targets: NaN, not a crash. */
        t[0] = V;
        if (n > 1)
            t[1] = -1;
        assert_int_equal(cudaMemcpy(dt, t, (size_t)n * sizeof(int32_t),
                                    cudaMemcpyHostToDevice), cudaSuccess);
        assert_int_equal(tg_cuda_logprobs(dx, n, V, dt, dl, NULL), 0);
        tt_cuda_sync_to_host(got, dl, (size_t)n * sizeof(float));
        assert_true(isnan(got[0]));
        if (n > 1)
            assert_true(isnan(got[1]));
        cudaFree(dx);
        cudaFree(dt);
        cudaFree(dl);
        free(x);
        free(t);
        free(ref);
        free(got);
    }
    tg_backend_cpu_free(cpu);
}

static void test_argmax_greedy_topk1(void **state)
{
    (void)state;
    static const int shapes[][2] = {{1, 1}, {6, 5}, {12, 1000}, {7, 128256}};
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0] + 3, V = shapes[s][1];
        float *x = make_logits(n, V);
        /* Three extra rows: all -inf, all NaN, two +inf. */
        for (int j = 0; j < V; j++) {
            x[(size_t)(n - 3) * V + j] = -INFINITY;
            x[(size_t)(n - 2) * V + j] = NAN;
            x[(size_t)(n - 1) * V + j] = tt_xrng_sym(&rng);
        }
        x[(size_t)(n - 1) * V + (V - 1)] = INFINITY;
        x[(size_t)(n - 1) * V + V / 2] = INFINITY;
        int32_t *ref = malloc((size_t)n * sizeof(int32_t));
        int32_t *got = malloc((size_t)n * sizeof(int32_t));
        assert_non_null(ref);
        assert_non_null(got);
        for (int i = 0; i < n; i++)
            ref[i] = cpu_greedy(cpu, x + (size_t)i * V, V);
        assert_int_equal(ref[n - 3], 0);
        assert_int_equal(ref[n - 2], 0);
        assert_int_equal(ref[n - 1], V / 2);
        float *dx = tt_cuda_upload(x, (size_t)n * V * sizeof(float));
        int32_t *dk = tt_cuda_alloc((size_t)n * sizeof(int32_t));
        assert_int_equal(tg_cuda_argmax(dx, n, V, dk, NULL), 0);
        tt_cuda_sync_to_host(got, dk, (size_t)n * sizeof(int32_t));
        assert_memory_equal(got, ref, (size_t)n * sizeof(int32_t));

        struct tg_cuda_sampler *sm = NULL;
        assert_int_equal(tg_cuda_sampler_new(V, n, &sm, err, sizeof(err)), 0);
        struct tg_cuda_sample_params *p = calloc((size_t)n, sizeof(*p));
        assert_non_null(p);
        /* Greedy through the sampler: temperature 0 or below 1e-5, with
         * filters that must not matter. */
        for (int i = 0; i < n; i++) {
            p[i].temperature = i % 2 ? 0.0f : 5e-6f;
            p[i].top_k = i % 3 ? 0 : 3;
            p[i].top_p = i % 4 ? 1.0f : 0.5f;
            p[i].min_p = 0.0f;
            p[i].seed = tt_xrng_next(&rng);
            p[i].step = (uint64_t)i;
        }
        memset(got, 0xff, (size_t)n * sizeof(int32_t));
        assert_int_equal(cudaMemset(dk, 0xff, (size_t)n * sizeof(int32_t)),
                         cudaSuccess);
        assert_int_equal(tg_cuda_sample(sm, dx, n, V, p, dk, NULL, NULL), 0);
        tt_cuda_sync_to_host(got, dk, (size_t)n * sizeof(int32_t));
        assert_memory_equal(got, ref, (size_t)n * sizeof(int32_t));
        /* top-k = 1 at any temperature and seed is greedy (exactly k ids,
         * ties to the lower id). */
        for (int round = 0; round < 4; round++) {
            for (int i = 0; i < n; i++) {
                p[i].temperature = 0.3f + 0.5f * (float)round;
                p[i].top_k = 1;
                p[i].top_p = round % 2 ? 0.9f : 1.0f;
                p[i].min_p = round == 3 ? 0.2f : 0.0f;
                p[i].seed = tt_xrng_next(&rng);
                p[i].step = tt_xrng_next(&rng);
            }
            assert_int_equal(tg_cuda_sample(sm, dx, n, V, p, dk, NULL, NULL),
                             0);
            tt_cuda_sync_to_host(got, dk, (size_t)n * sizeof(int32_t));
            assert_memory_equal(got, ref, (size_t)n * sizeof(int32_t));
        }
        tg_cuda_sampler_free(sm);
        free(p);
        cudaFree(dx);
        cudaFree(dk);
        free(x);
        free(ref);
        free(got);
    }
    tg_backend_cpu_free(cpu);
}

static void test_topk_logprobs(void **state)
{
    (void)state;
    static const int cases[][3] = {/* n, V, k */
                                   {6, 5, 5},     {6, 5, 1},
                                   {12, 1000, 3}, {6, 32000, 20},
                                   {6, 128256, 8}};
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int n = cases[c][0], V = cases[c][1], k = cases[c][2];
        float *x = make_logits(n, V);
        /* Extra ties below the top so the order among equals matters. */
        for (int i = 0; i < n; i++)
            if (V >= 8) {
                x[(size_t)i * V + 6] = 7.0f;
                x[(size_t)i * V + 2] = 7.0f;
                x[(size_t)i * V + 4] = 7.0f;
            }
        size_t nk = (size_t)n * (size_t)k;
        int32_t *ids = malloc(nk * sizeof(int32_t)), *rids = malloc(nk * 4);
        float *lps = malloc(nk * sizeof(float)), *rlps = malloc(nk * 4);
        float *tmp = malloc((size_t)V * sizeof(float));
        assert_non_null(ids);
        assert_non_null(rids);
        assert_non_null(lps);
        assert_non_null(rlps);
        assert_non_null(tmp);
        for (int i = 0; i < n; i++) {
            memcpy(tmp, x + (size_t)i * V, (size_t)V * sizeof(float));
            int32_t tok;
            float lp;
            assert_int_equal(tg_ops_cpu.sample(cpu, tmp, V, &greedy_sp, NULL,
                                               NULL, &tok, &lp, k,
                                               rids + (size_t)i * k,
                                               rlps + (size_t)i * k), 0);
        }
        float *dx = tt_cuda_upload(x, (size_t)n * V * sizeof(float));
        int32_t *di = tt_cuda_alloc(nk * sizeof(int32_t));
        float *dl = tt_cuda_alloc(nk * sizeof(float));
        assert_int_equal(tg_cuda_topk_logprobs(dx, n, V, k, di, dl, NULL), 0);
        tt_cuda_sync_to_host(ids, di, nk * sizeof(int32_t));
        tt_cuda_sync_to_host(lps, dl, nk * sizeof(float));
        assert_memory_equal(ids, rids, nk * sizeof(int32_t));
        for (size_t t = 0; t < nk; t++) {
            if (isnan(rlps[t])) { /* rows holding NaN: NaN lse on both */
                assert_true(isnan(lps[t]));
                continue;
            }
            double tol = 1e-4 + 1e-5 * fabs(rlps[t]) + 5e-7 * 1.1e4;
            if (!(fabs((double)lps[t] - rlps[t]) <= tol))
                fail_msg("V %d k %d entry %zu: lp %.7g cpu %.7g", V, k, t,
                         lps[t], rlps[t]);
        }
        cudaFree(dx);
        cudaFree(di);
        cudaFree(dl);
        free(x);
        free(ids);
        free(rids);
        free(lps);
        free(rlps);
        free(tmp);
    }
    tg_backend_cpu_free(cpu);
}

/* Random sampling parameters; a third of the rows need no sort. */
static void random_params(struct tg_cuda_sample_params *p, int n)
{
    for (int i = 0; i < n; i++) {
        p[i].temperature = 0.5f + (float)(tt_xrng_next(&rng) % 100) / 100.0f;
        p[i].top_k = i % 3 == 0 ? 0 : (int32_t)(tt_xrng_next(&rng) % 50);
        p[i].top_p = i % 3 == 0
                         ? 1.0f
                         : 0.5f + (float)(tt_xrng_next(&rng) % 50) / 100.0f;
        p[i].min_p = i % 2 ? 0.0f : (float)(tt_xrng_next(&rng) % 20) / 100.0f;
        p[i].seed = tt_xrng_next(&rng);
        p[i].step = tt_xrng_next(&rng) % 1000;
    }
}

static void test_seeded_reproducibility(void **state)
{
    (void)state;
    const int n = 70, V = 1000; /* 70 rows: three sort chunks of 32 */
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    /* Flat-ish logits so draws really vary. */
    float *x = malloc((size_t)n * V * sizeof(float));
    float *xr = malloc((size_t)n * V * sizeof(float));
    assert_non_null(x);
    assert_non_null(xr);
    for (size_t i = 0; i < (size_t)n * V; i++)
        x[i] = 0.5f * tt_xrng_sym(&rng);
    struct tg_cuda_sample_params p[70], pr[70];
    random_params(p, n);
    struct tg_cuda_sampler *sm = NULL;
    assert_int_equal(tg_cuda_sampler_new(V, n, &sm, err, sizeof(err)), 0);
    float *dx = tt_cuda_upload(x, (size_t)n * V * sizeof(float));
    int32_t *dk = tt_cuda_alloc((size_t)n * sizeof(int32_t));
    float *dl = tt_cuda_alloc((size_t)n * sizeof(float));
    int32_t a[70], b[70], one;
    float lp[70], ref[70];
    assert_int_equal(tg_cuda_sample(sm, dx, n, V, p, dk, dl, NULL), 0);
    tt_cuda_sync_to_host(a, dk, sizeof(a));
    tt_cuda_sync_to_host(lp, dl, sizeof(lp));
    for (int i = 0; i < n; i++)
        assert_true(a[i] >= 0 && a[i] < V);
    /* The returned logprob is log_softmax of the raw logits. */
    assert_int_equal(tg_ops_cpu.logprobs(cpu, x, n, V, a, ref), 0);
    for (int i = 0; i < n; i++)
        assert_true(fabsf(lp[i] - ref[i]) <= 1e-4f + 1e-5f * fabsf(ref[i]));
    /* Again: identical. */
    assert_int_equal(tg_cuda_sample(sm, dx, n, V, p, dk, NULL, NULL), 0);
    tt_cuda_sync_to_host(b, dk, sizeof(b));
    assert_memory_equal(a, b, sizeof(a));
    /* Each row alone (no neighbours, its own sort decision). */
    for (int i = 0; i < n; i++) {
        assert_int_equal(tg_cuda_sample(sm, dx + (size_t)i * V, 1, V, &p[i],
                                         dk, NULL, NULL), 0);
        tt_cuda_sync_to_host(&one, dk, sizeof(one));
        assert_int_equal(one, a[i]);
    }
    /* Reversed batch: row i moves to n-1-i, in another sort chunk. */
    for (int i = 0; i < n; i++) {
        memcpy(xr + (size_t)(n - 1 - i) * V, x + (size_t)i * V,
               (size_t)V * sizeof(float));
        pr[n - 1 - i] = p[i];
    }
    float *dxr = tt_cuda_upload(xr, (size_t)n * V * sizeof(float));
    assert_int_equal(tg_cuda_sample(sm, dxr, n, V, pr, dk, NULL, NULL), 0);
    tt_cuda_sync_to_host(b, dk, sizeof(b));
    for (int i = 0; i < n; i++)
        assert_int_equal(b[n - 1 - i], a[i]);
    /* Another step of the same requests draws differently somewhere. */
    for (int i = 0; i < n; i++)
        p[i].step++;
    assert_int_equal(tg_cuda_sample(sm, dx, n, V, p, dk, NULL, NULL), 0);
    tt_cuda_sync_to_host(b, dk, sizeof(b));
    int differ = 0;
    for (int i = 0; i < n; i++)
        differ += a[i] != b[i];
    assert_true(differ > n / 4);
    tg_cuda_sampler_free(sm);
    cudaFree(dx);
    cudaFree(dxr);
    cudaFree(dk);
    cudaFree(dl);
    free(x);
    free(xr);
    tg_backend_cpu_free(cpu);
}

#define DV 16
#define DN 20000

/* The exact distribution of the sampler's definition (cpu_sample.c's
 * steps 2-6) in double, for one row of DV logits. */
static void expected_dist(const float *x, const struct tg_cuda_sample_params *p,
                          double *out)
{
    float v[DV];
    int ord[DV];
    for (int j = 0; j < DV; j++) {
        v[j] = isnan(x[j]) ? -INFINITY : x[j];
        if (p->temperature != 1.0f)
            v[j] *= 1.0f / p->temperature;
        ord[j] = j;
    }
    for (int a = 1; a < DV; a++) /* insertion sort: (v desc, id asc) */
        for (int b = a; b > 0 && v[ord[b]] > v[ord[b - 1]]; b--) {
            int t = ord[b];
            ord[b] = ord[b - 1];
            ord[b - 1] = t;
        }
    int nc = p->top_k > 0 && p->top_k < DV ? p->top_k : DV;
    double m = v[ord[0]];
    if (p->top_p < 1.0f) {
        double z = 0.0, cum = 0.0;
        for (int j = 0; j < nc; j++)
            z += exp(v[ord[j]] - m);
        for (int j = 0; j < nc; j++) {
            cum += exp(v[ord[j]] - m);
            if (cum >= p->top_p * z) {
                nc = j + 1;
                break;
            }
        }
    }
    double floor_v = p->min_p > 0.0f ? m + log(p->min_p) : -INFINITY;
    double z = 0.0;
    memset(out, 0, DV * sizeof(double));
    for (int j = 0; j < nc; j++)
        if (v[ord[j]] >= floor_v)
            z += out[ord[j]] = exp(v[ord[j]] - m);
    for (int j = 0; j < DV; j++)
        out[j] /= z;
}

/* Frequencies within 4.5 standard deviations (+ 1e-3) of p, and tokens of
 * probability 0 never drawn. */
static void check_freq(const int *count, const double *p, const char *who,
                       int cfg)
{
    for (int j = 0; j < DV; j++) {
        double f = (double)count[j] / DN;
        double tol = 4.5 * sqrt(p[j] * (1.0 - p[j]) / DN) + 1e-3;
        if (p[j] == 0.0 ? count[j] != 0 : !(fabs(f - p[j]) <= tol))
            fail_msg("%s config %d token %d: freq %.4f, expected %.4f", who,
                     cfg, j, f, p[j]);
    }
}

static void test_distribution(void **state)
{
    (void)state;
    /* A tie at ids 4 and 7 (top-k 2 must keep 4, not 7); a NaN and a -inf
     * row variant for the plain config. */
    static const float base[DV] = {1.2f,  -0.5f, 2.0f,  0.3f, 1.5f, -1.0f,
                                   0.0f,  1.5f,  -2.0f, 0.7f, -3.0f, -0.2f,
                                   1.0f, -1.5f, -4.0f, -1.2f};
    static const struct {
        float t;
        int k;
        float top_p, min_p;
        int special;
    } cfg[] = {
        {1.0f, 0, 1.0f, 0.0f, 0},  {0.7f, 2, 1.0f, 0.0f, 0},
        {1.0f, 0, 0.8f, 0.0f, 0},  {1.3f, 0, 1.0f, 0.1f, 0},
        {0.9f, 8, 0.9f, 0.25f, 0}, {1.0f, 0, 1.0f, 0.0f, 1},
        /* top-p over the renormalised top 3 (ids 2, 4, 7: 0.452, 0.274,
         * 0.274) keeps {2, 4}; a nucleus over the whole row would keep
         * id 7 too. */
        {1.0f, 3, 0.6f, 0.0f, 0},
    };
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(1, &cpu), 0);
    struct tg_cuda_sampler *sm = NULL;
    assert_int_equal(tg_cuda_sampler_new(DV, DN, &sm, err, sizeof(err)), 0);
    float *x = malloc((size_t)DN * DV * sizeof(float));
    struct tg_cuda_sample_params *p = calloc(DN, sizeof(*p));
    int32_t *tok = malloc(DN * sizeof(int32_t));
    assert_non_null(x);
    assert_non_null(p);
    assert_non_null(tok);
    float *dx = tt_cuda_alloc((size_t)DN * DV * sizeof(float));
    int32_t *dk = tt_cuda_alloc(DN * sizeof(int32_t));
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        float row[DV];
        memcpy(row, base, sizeof(row));
        if (cfg[c].special) {
            row[14] = NAN;
            row[10] = -INFINITY;
        }
        struct tg_cuda_sample_params pc = {cfg[c].t, cfg[c].k, cfg[c].top_p,
                                           cfg[c].min_p, 0xC0FFEEull, 0};
        double want[DV];
        expected_dist(row, &pc, want);
        for (int i = 0; i < DN; i++) {
            memcpy(x + (size_t)i * DV, row, sizeof(row));
            p[i] = pc;
            p[i].step = (uint64_t)i; /* one request, DN successive steps */
        }
        assert_int_equal(cudaMemcpy(dx, x, (size_t)DN * DV * sizeof(float),
                                    cudaMemcpyHostToDevice), cudaSuccess);
        assert_int_equal(tg_cuda_sample(sm, dx, DN, DV, p, dk, NULL, NULL),
                         0);
        tt_cuda_sync_to_host(tok, dk, DN * sizeof(int32_t));
        int count[DV] = {0};
        for (int i = 0; i < DN; i++) {
            assert_true(tok[i] >= 0 && tok[i] < DV);
            count[tok[i]]++;
        }
        check_freq(count, want, "cuda", (int)c);
        /* The CPU sampler against the same numbers validates them. */
        struct tg_sampling sp = TG_SAMPLING_OFF;
        sp.temperature = pc.temperature;
        sp.top_k = pc.top_k;
        sp.top_p = pc.top_p;
        sp.min_p = pc.min_p;
        uint64_t state_rng = 42;
        memset(count, 0, sizeof(count));
        for (int i = 0; i < DN; i++) {
            float tmp[DV];
            int32_t t;
            memcpy(tmp, row, sizeof(tmp));
            assert_int_equal(tg_ops_cpu.sample(cpu, tmp, DV, &sp, NULL,
                                               &state_rng, &t, NULL, 0, NULL,
                                               NULL), 0);
            count[t]++;
        }
        check_freq(count, want, "cpu", (int)c);
    }
    tg_cuda_sampler_free(sm);
    cudaFree(dx);
    cudaFree(dk);
    free(x);
    free(p);
    free(tok);
    tg_backend_cpu_free(cpu);
}

/* Tokens of weight 0 are never drawn, whatever the rounding of the block
 * scan: a large vocabulary with a -inf logit at every 16th id (the start of
 * each 16-item raking segment of cub's block scan, where the prefix sum is
 * re-derived from a tree sum and can round above its predecessor's) and,
 * on odd rows, min-p filtering that zeroes interleaved ids. Unsorted rows
 * (no top-k/top-p) draw in id order, so zero weights sit between positive
 * ones. 51200 draws. */
static void test_zero_weight_never_drawn(void **state)
{
    (void)state;
    const int n = 256, V = 151936, calls = 200;
    const float min_p = 0.6f;
    float *x = malloc((size_t)n * V * sizeof(float));
    float *mx = malloc((size_t)n * sizeof(float));
    assert_non_null(x);
    assert_non_null(mx);
    for (int i = 0; i < n; i++) {
        float *r = x + (size_t)i * V;
        mx[i] = -INFINITY;
        for (int j = 0; j < V; j++) {
            r[j] = j % 16 == 0 ? -INFINITY : 0.5f * tt_xrng_sym(&rng) + 0.5f;
            if (r[j] > mx[i])
                mx[i] = r[j];
        }
    }
    struct tg_cuda_sampler *sm = NULL;
    assert_int_equal(tg_cuda_sampler_new(V, n, &sm, err, sizeof(err)), 0);
    float *dx = tt_cuda_upload(x, (size_t)n * V * sizeof(float));
    int32_t *dk = tt_cuda_alloc((size_t)n * sizeof(int32_t));
    int32_t *tok = malloc((size_t)n * sizeof(int32_t));
    struct tg_cuda_sample_params *p = calloc((size_t)n, sizeof(*p));
    assert_non_null(tok);
    assert_non_null(p);
    for (int c = 0; c < calls; c++) {
        for (int i = 0; i < n; i++) {
            p[i] = (struct tg_cuda_sample_params){1.0f, 0, 1.0f,
                                                  i % 2 ? min_p : 0.0f,
                                                  0x5EEDull,
                                                  (uint64_t)c * n + i};
        }
        assert_int_equal(tg_cuda_sample(sm, dx, n, V, p, dk, NULL, NULL), 0);
        tt_cuda_sync_to_host(tok, dk, (size_t)n * sizeof(int32_t));
        for (int i = 0; i < n; i++) {
            assert_true(tok[i] >= 0 && tok[i] < V);
            float v = x[(size_t)i * V + tok[i]];
            if (isinf(v))
                fail_msg("call %d row %d: drew id %d of logit -inf", c, i,
                         tok[i]);
            /* The device floor is m + logf(min_p) in fp32. */
            if (i % 2 && !((double)v >= (double)mx[i] + log(min_p) - 1e-5))
                fail_msg("call %d row %d: drew id %d (%g) below min-p of "
                         "max %g", c, i, tok[i], v, mx[i]);
        }
    }
    tg_cuda_sampler_free(sm);
    cudaFree(dx);
    cudaFree(dk);
    free(x);
    free(mx);
    free(tok);
    free(p);
}

/* tg_cuda_logit_bias: the device adds exactly what the CPU sampler adds
 * (greedy draws agree with the CPU's under the same bias), scale -1 takes
 * it back off to within an ulp, and bad arguments are refused. */
static void test_logit_bias(void **state)
{
    (void)state;
    const int n = 5, V = 1000;
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    float *x = make_logits(n, V);
    /* Even rows force token 7 * i + 3 with +100, odd rows ban their argmax
     * with -100; every row also gets +0.5 on one other token. */
    int32_t rows[15], ids[15];
    float vals[15];
    int m = 0;
    for (int i = 0; i < n; i++) {
        int32_t best = cpu_greedy(cpu, x + (size_t)i * V, V);
        if (i % 2 == 1) {
            rows[m] = i, ids[m] = best, vals[m++] = -100.0f;
        } else {
            rows[m] = i, ids[m] = 7 * i + 3, vals[m++] = 100.0f;
        }
        rows[m] = i, ids[m] = (best + 11) % V, vals[m++] = 0.5f;
    }
    int32_t ref[5], got[5];
    for (int i = 0; i < n; i++) {
        int32_t bid[3];
        float bval[3];
        int nb = 0;
        for (int k = 0; k < m; k++)
            if (rows[k] == i)
                bid[nb] = ids[k], bval[nb++] = vals[k];
        struct tg_sampling sp = TG_SAMPLING_OFF;
        sp.bias_ids = bid;
        sp.bias_vals = bval;
        sp.n_bias = nb;
        float *row = malloc((size_t)V * sizeof(float));
        assert_non_null(row);
        memcpy(row, x + (size_t)i * V, (size_t)V * sizeof(float));
        assert_int_equal(tg_ops_cpu.sample(cpu, row, V, &sp, NULL, NULL,
                                           &ref[i], NULL, 0, NULL, NULL), 0);
        free(row);
    }
    float *dx = tt_cuda_upload(x, (size_t)n * V * sizeof(float));
    int32_t *drows = tt_cuda_upload(rows, (size_t)m * sizeof(int32_t));
    int32_t *dids = tt_cuda_upload(ids, (size_t)m * sizeof(int32_t));
    float *dvals = tt_cuda_upload(vals, (size_t)m * sizeof(float));
    int32_t *dk = tt_cuda_alloc((size_t)n * sizeof(int32_t));
    assert_int_equal(tg_cuda_logit_bias(dx, V, drows, dids, dvals, m, 1.0f,
                                        NULL), 0);
    assert_int_equal(tg_cuda_argmax(dx, n, V, dk, NULL), 0);
    tt_cuda_sync_to_host(got, dk, (size_t)n * sizeof(int32_t));
    assert_memory_equal(got, ref, (size_t)n * sizeof(int32_t));
    assert_int_equal(got[0], 3);
    /* Off again: the raw logits, to within an ulp of the bias. */
    assert_int_equal(tg_cuda_logit_bias(dx, V, drows, dids, dvals, m, -1.0f,
                                        NULL), 0);
    float *back = malloc((size_t)n * V * sizeof(float));
    assert_non_null(back);
    tt_cuda_sync_to_host(back, dx, (size_t)n * V * sizeof(float));
    for (size_t j = 0; j < (size_t)n * V; j++)
        assert_true(fabsf(back[j] - x[j]) <= 1e-4f);
    /* Refused: negative count, vocab < 1, NULL arrays, non-finite scale. */
    assert_int_equal(tg_cuda_logit_bias(dx, V, drows, dids, dvals, -1, 1.0f,
                                        NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_logit_bias(dx, 0, drows, dids, dvals, m, 1.0f,
                                        NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_logit_bias(dx, V, NULL, dids, dvals, m, 1.0f,
                                        NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_logit_bias(dx, V, drows, dids, dvals, m, NAN,
                                        NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_logit_bias(NULL, V, drows, dids, dvals, 0, 1.0f,
                                        NULL), 0); /* nothing to do */
    free(back);
    cudaFree(dx);
    cudaFree(drows);
    cudaFree(dids);
    cudaFree(dvals);
    cudaFree(dk);
    free(x);
    tg_backend_cpu_free(cpu);
}

/* The first non-finite logit of each row against a scan on the host, over
 * the rows of make_logits (with -inf, NaN, large offsets) plus rows with a
 * single +inf, NaN or -inf at the first, a middle and the last id. */
static void test_first_nonfinite(void **state)
{
    (void)state;
    static const int vocabs[] = {1, 7, 513, 151936};
    for (size_t vi = 0; vi < sizeof(vocabs) / sizeof(vocabs[0]); vi++) {
        int V = vocabs[vi], n = 15;
        float *x = make_logits(n, V);
        float *r;
        r = x + (size_t)6 * V;  /* clean plain rows get one bad value */
        for (int j = 0; j < V; j++)
            r[j] = (float)(j % 5);
        r[V - 1] = INFINITY;
        r = x + (size_t)12 * V;
        for (int j = 0; j < V; j++)
            r[j] = 0.5f;
        r[V / 2] = NAN;
        r = x + (size_t)13 * V;
        for (int j = 0; j < V; j++)
            r[j] = -1.0f;
        r[0] = -INFINITY;
        int32_t want[15];
        float want_v[15];
        for (int i = 0; i < n; i++) {
            want[i] = -1;
            want_v[i] = 0.0f;
            for (int j = 0; j < V; j++)
                if (!isfinite(x[(size_t)i * V + j])) {
                    want[i] = j;
                    want_v[i] = x[(size_t)i * V + j];
                    break;
                }
        }
        float *dx = tt_cuda_upload(x, (size_t)n * V * sizeof(float));
        int32_t *df = tt_cuda_alloc((size_t)n * sizeof(int32_t));
        float *dv = tt_cuda_alloc((size_t)n * sizeof(float));
        assert_int_equal(tg_cuda_first_nonfinite(dx, n, V, df, dv, NULL), 0);
        int32_t got[15];
        float got_v[15];
        tt_cuda_sync_to_host(got, df, (size_t)n * sizeof(int32_t));
        tt_cuda_sync_to_host(got_v, dv, (size_t)n * sizeof(float));
        for (int i = 0; i < n; i++) {
            assert_int_equal(got[i], want[i]);
            if (want[i] >= 0)
                assert_true(isnan(want_v[i]) ? isnan(got_v[i])
                                             : got_v[i] == want_v[i]);
        }
        assert_int_equal(got[6], V - 1);
        assert_int_equal(got[12], V / 2);
        assert_int_equal(got[13], 0);
        assert_int_equal(got[0], -1);
        assert_int_equal(tg_cuda_first_nonfinite(dx, 1, 0, df, dv, NULL),
                         TG_EINVAL);
        assert_int_equal(tg_cuda_first_nonfinite(dx, 1, V, NULL, dv, NULL),
                         TG_EINVAL);
        assert_int_equal(tg_cuda_first_nonfinite(NULL, 0, V, NULL, NULL,
                                                 NULL), 0);
        cudaFree(dx);
        cudaFree(df);
        cudaFree(dv);
        free(x);
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    struct tg_cuda_sampler *sm = NULL;
    assert_int_equal(tg_cuda_sampler_new(0, 4, &sm, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_sampler_new(10, 0, &sm, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_sampler_new(10, 4, NULL, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_sampler_new(1 << 30, 64, &sm, err, sizeof(err)),
                     TG_EINVAL); /* 32 x 2^30 sort items */
    assert_null(sm);
    assert_int_equal(tg_cuda_sampler_new(10, 4, &sm, err, sizeof(err)), 0);
    float *dx = tt_cuda_alloc(4 * 10 * sizeof(float));
    int32_t *dk = tt_cuda_alloc(4 * 10 * sizeof(int32_t));
    float *dl = tt_cuda_alloc(4 * 10 * sizeof(float));
    assert_int_equal(cudaMemset(dx, 0, 4 * 10 * sizeof(float)), cudaSuccess);
    struct tg_cuda_sample_params p[5];
    for (int i = 0; i < 5; i++)
        p[i] = (struct tg_cuda_sample_params){1.0f, 0, 1.0f, 0.0f, 1, 0};
    assert_int_equal(tg_cuda_sample(sm, dx, 4, 10, p, dk, NULL, NULL), 0);
    assert_int_equal(tg_cuda_sample(sm, dx, 0, 10, NULL, NULL, NULL, NULL),
                     0);
    assert_int_equal(tg_cuda_sample(sm, dx, 5, 10, p, dk, NULL, NULL),
                     TG_EINVAL); /* more rows than max_rows */
    assert_int_equal(tg_cuda_sample(sm, dx, 4, 11, p, dk, NULL, NULL),
                     TG_EINVAL); /* another vocabulary */
    assert_int_equal(tg_cuda_sample(NULL, dx, 4, 10, p, dk, NULL, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_sample(sm, NULL, 4, 10, p, dk, NULL, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_sample(sm, dx, 4, 10, NULL, dk, NULL, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_sample(sm, dx, 4, 10, p, NULL, NULL, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_sample(sm, dx, -1, 10, p, dk, NULL, NULL),
                     TG_EINVAL);
    /* Parameters out of range are no input here: they come from values
     * tg_sampling_check accepted where they entered, and the sampler only
     * asserts them (tests/unit/test_cpu_sample.c holds the CPU sampler to
     * the same; a CUDA process's child cannot safely show it here). */
    /* The other entries. */
    assert_int_equal(tg_cuda_logprobs(dx, -1, 10, dk, dl, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_logprobs(dx, 1, 0, dk, dl, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_logprobs(NULL, 1, 10, dk, dl, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_logprobs(dx, 1, 10, NULL, dl, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_logprobs(NULL, 0, 10, NULL, NULL, NULL), 0);
    assert_int_equal(tg_cuda_argmax(dx, 1, 0, dk, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_argmax(dx, 1, 10, NULL, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_argmax(NULL, 0, 10, NULL, NULL), 0);
    assert_int_equal(tg_cuda_topk_logprobs(dx, 1, 10, 0, dk, dl, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_topk_logprobs(dx, 1, 10, 11, dk, dl, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_topk_logprobs(dx, 1, 10, 2, dk, NULL, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_topk_logprobs(dx, 1, 10, 10, dk, dl, NULL), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    tg_cuda_sampler_free(sm);
    tg_cuda_sampler_free(NULL);
    cudaFree(dx);
    cudaFree(dk);
    cudaFree(dl);
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    if (!tt_cuda_have_device("no CUDA device: skipped"))
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_argmax_greedy_topk1),
        cmocka_unit_test(test_topk_logprobs),
        cmocka_unit_test(test_seeded_reproducibility),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_zero_weight_never_drawn),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_first_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
