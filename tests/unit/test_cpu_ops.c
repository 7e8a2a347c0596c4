/*
 * test_cpu_ops.c — the dense ops, attention over ragged pages and the KV
 * append of the CPU backend against naive double-precision references.
 *
 * Ragged rows are built the way the worker builds them: KV heads are spread
 * over groups in a shuffled (group, slot) assignment, every group has its
 * own length, and page ids are a shuffled, non-contiguous subset of a pool.
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

static uint64_t rs = 0x1234567;

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

/* |got - want| <= tol * max(1, |want|). */
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
    assert_non_null(b);
    return b;
}

/* ---- dense ops --------------------------------------------------------- */

static void test_embedding(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    float table[5 * 3], out[4 * 3];
    fill(table, 15, 1.0);
    int32_t ids[4] = {4, 0, 4, 2};
    assert_int_equal(tg_ops_cpu.embedding(b, table, 5, 3, ids, 4, out), 0);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            assert_true(out[i * 3 + j] == table[ids[i] * 3 + j]);
    int32_t bad[2] = {1, 5};
    assert_int_equal(tg_ops_cpu.embedding(b, table, 5, 3, bad, 2, out), TG_EINVAL);
    bad[1] = -1;
    assert_int_equal(tg_ops_cpu.embedding(b, table, 5, 3, bad, 2, out), TG_EINVAL);
    assert_int_equal(tg_ops_cpu.embedding(b, table, 5, 3, ids, 0, out), 0);
    tg_backend_cpu_free(b);
}

static void test_rmsnorm(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int shapes[][2] = {{1, 1}, {3, 7}, {64, 256}, {5, 1000}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], dim = shapes[s][1];
        float *x = malloc(sizeof(float) * n * dim), *w = malloc(sizeof(float) * dim);
        float *out = malloc(sizeof(float) * n * dim);
        fill(x, (size_t)n * dim, 3.0);
        fill(w, (size_t)dim, 2.0);
        assert_int_equal(tg_ops_cpu.rmsnorm(b, x, w, n, dim, 1e-5f, out), 0);
        for (int i = 0; i < n; i++) {
            double ss = 0;
            for (int j = 0; j < dim; j++)
                ss += (double)x[i * dim + j] * x[i * dim + j];
            double r = 1.0 / sqrt(ss / dim + 1e-5);
            for (int j = 0; j < dim; j++)
                near(out[i * dim + j], x[i * dim + j] * r * w[j], 1e-5);
        }
        /* In place gives the same result. */
        assert_int_equal(tg_ops_cpu.rmsnorm(b, x, w, n, dim, 1e-5f, x), 0);
        assert_memory_equal(x, out, sizeof(float) * n * dim);
        free(x);
        free(w);
        free(out);
    }
    float one = 1, w1 = 1;
    assert_int_equal(tg_ops_cpu.rmsnorm(b, &one, &w1, 1, 0, 1e-5f, &one), TG_EINVAL);
    tg_backend_cpu_free(b);
}

static void test_add_silu(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    size_t lens[] = {0, 1, 17, 300000};
    for (size_t s = 0; s < 4; s++) {
        size_t n = lens[s];
        float *y = malloc(sizeof(float) * (n + 1)), *x = malloc(sizeof(float) * (n + 1));
        float *y0 = malloc(sizeof(float) * (n + 1)), *o = malloc(sizeof(float) * (n + 1));
        fill(x, n, 8.0);
        fill(y, n, 8.0);
        memcpy(y0, y, sizeof(float) * n);
        assert_int_equal(tg_ops_cpu.add(b, y, x, n), 0);
        for (size_t i = 0; i < n; i++)
            assert_true(y[i] == y0[i] + x[i]);
        assert_int_equal(tg_ops_cpu.silu_mul(b, x, y0, n, o), 0);
        for (size_t i = 0; i < n; i++) {
            double g = x[i];
            near(o[i], g / (1.0 + exp(-g)) * y0[i], 1e-5);
        }
        /* out == gate */
        assert_int_equal(tg_ops_cpu.silu_mul(b, x, y0, n, x), 0);
        assert_memory_equal(x, o, sizeof(float) * n);
        free(y);
        free(x);
        free(y0);
        free(o);
    }
    tg_backend_cpu_free(b);
}

static void test_gemm(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int shapes[][3] = {{1, 1, 1}, {1, 33, 64}, {7, 5, 3}, {64, 96, 128}, {3, 4, 0}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *x = malloc(sizeof(float) * (m * k + 1)), *w = malloc(sizeof(float) * (n * k + 1));
        float *bias = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * m * n);
        fill(x, (size_t)m * k, 1.0);
        fill(w, (size_t)n * k, 1.0);
        fill(bias, (size_t)n, 1.0);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            assert_int_equal(tg_ops_cpu.gemm(b, x, w, with_bias ? bias : NULL, m, n, k, y), 0);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double acc = with_bias ? bias[j] : 0.0;
                    for (int t = 0; t < k; t++)
                        acc += (double)x[i * k + t] * w[j * k + t];
                    near(y[i * n + j], acc, 1e-4);
                }
        }
        free(x);
        free(w);
        free(bias);
        free(y);
    }
    float z = 0;
    assert_int_equal(tg_ops_cpu.gemm(b, &z, &z, NULL, -1, 1, 1, &z), TG_EINVAL);
    tg_backend_cpu_free(b);
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    u += 0x7FFFu + ((u >> 16) & 1u); /* nearest even; no NaN here */
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* gemm and gemm_bf16 at every ISA level the machine has and on both paths
 * (the streaming kernels up to the gemv rows, BLAS above): shapes with
 * row counts around the kernels' tiles (1, 2, 3, 4, 5, 8, 9 and either side
 * of the gemv/BLAS switch), odd k (the kernels' scalar tails and an odd
 * element left from bf16's pairs) and n off every tile width, against a
 * float64 product of the same values (the bf16 ones converted exactly).
 * Each output may differ from it by fp32 rounding of a length-k sum,
 * bounded relative to sum |x w|. Every level and path gives the same
 * value up to that rounding, and a row's result does not depend on the
 * other rows of the call or the thread count (the streaming kernels). */
static void test_gemm_paths(void **st)
{
    (void)st;
    struct tg_backend *b = be(), *b1 = NULL;
    assert_int_equal(tg_backend_cpu_new(1, &b1), 0);
    const int shapes[][3] = {{1, 37, 64},  {2, 19, 33},  {3, 40, 1},
                             {4, 17, 100}, {5, 65, 31},  {8, 129, 96},
                             {9, 7, 17},   {31, 33, 65}, {32, 20, 64},
                             {33, 41, 47}, {64, 24, 32}, {1, 1000, 1024}};
    enum tg_cpu_isa top = tg_cpu_isa_detect();
    assert_int_equal(tg_backend_cpu_isa(b), top);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        size_t mk = (size_t)m * k, nk = (size_t)n * k, mn = (size_t)m * n;
        float *x = malloc(sizeof(float) * mk), *w = malloc(sizeof(float) * nk);
        float *wr = malloc(sizeof(float) * nk),
              *bias = malloc(sizeof(float) * n);
        uint16_t *h = malloc(sizeof(uint16_t) * nk);
        float *y = malloc(sizeof(float) * mn), *y1 = malloc(sizeof(float) * mn);
        double *want = malloc(sizeof(double) * mn * 2);
        double *mag = malloc(sizeof(double) * mn * 2);
        fill(x, mk, 1.0);
        fill(w, nk, 1.0);
        fill(bias, (size_t)n, 1.0);
        for (size_t e = 0; e < nk; e++) {
            h[e] = to_bf16(w[e]);
            wr[e] = from_bf16(h[e]);
        }
        for (int bf = 0; bf < 2; bf++)
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double acc = bias[j], a = fabs(bias[j]);
                    for (int t = 0; t < k; t++) {
                        double p = (double)x[(size_t)i * k + t] *
                                   (bf ? wr : w)[(size_t)j * k + t];
                        acc += p;
                        a += fabs(p);
                    }
                    want[bf * mn + (size_t)i * n + j] = acc;
                    mag[bf * mn + (size_t)i * n + j] = a;
                }
        for (int isa = 0; isa <= (int)top; isa++) {
            for (int path = 0; path < 2; path++) {
                /* path 0: the default switch; 1: BLAS for every m. */
                int rows = path == 0 ? TG_CPU_GEMV_ROWS : 0;
                for (int bf = 0; bf < 2; bf++) {
                    struct tg_backend *bs[2] = {b, b1};
                    for (int t = 0; t < 2; t++) {
                        assert_int_equal(tg_backend_cpu_set_isa(bs[t], isa), 0);
                        assert_int_equal(
                            tg_backend_cpu_set_gemv_rows(bs[t], rows), 0);
                        float *out = t == 0 ? y : y1;
                        int rc = bf ? tg_ops_cpu.gemm_bf16(bs[t], x, h, bias, m,
                                                           n, k, out)
                                    : tg_ops_cpu.gemm(bs[t], x, w, bias, m, n,
                                                      k, out);
                        assert_int_equal(rc, 0);
                    }
                    for (size_t e = 0; e < mn; e++) {
                        double d = fabs(y[e] - want[bf * mn + e]);
                        if (!(d <= 1e-5 * mag[bf * mn + e] + 1e-6)) {
                            print_error(
                                "isa %s path %d bf16 %d m %d n %d k %d: "
                                "y[%zu] = %.9g, float64 %.9g\n",
                                tg_cpu_isa_name(isa), path, bf, m, n, k, e,
                                y[e], want[bf * mn + e]);
                            fail();
                        }
                    }
                    if (m <= TG_CPU_GEMV_ROWS && path == 0) {
                        /* The streaming kernels: the same bits on 1 and 2
                         * threads, and row 0 alone equals row 0 of m. */
                        assert_memory_equal(y, y1, sizeof(float) * mn);
                        int rc = bf ? tg_ops_cpu.gemm_bf16(b, x, h, bias, 1, n,
                                                           k, y1)
                                    : tg_ops_cpu.gemm(b, x, w, bias, 1, n, k,
                                                      y1);
                        assert_int_equal(rc, 0);
                        assert_memory_equal(y, y1, sizeof(float) * n);
                    }
                }
            }
        }
        free(x);
        free(w);
        free(wr);
        free(bias);
        free(h);
        free(y);
        free(y1);
        free(want);
        free(mag);
    }
    assert_int_equal(tg_backend_cpu_set_gemv_rows(b, -1), TG_EINVAL);
    assert_int_equal(tg_backend_cpu_set_gemv_rows(b, TG_CPU_GEMV_ROWS_MAX + 1),
                     TG_EINVAL);
    assert_int_equal(tg_backend_cpu_set_isa(b, (enum tg_cpu_isa)(top + 1)),
                     TG_EUNSUPPORTED);
    assert_string_equal(tg_cpu_isa_name(TG_CPU_ISA_AVX512), "avx512");
    uint16_t hz = 0;
    float z = 0;
    assert_int_equal(tg_ops_cpu.gemm_bf16(b, &z, &hz, NULL, -1, 1, 1, &z),
                     TG_EINVAL);
    assert_int_equal(tg_ops_cpu.gemm_bf16(b, &z, NULL, NULL, 1, 1, 1, &z),
                     TG_EINVAL);
    tg_backend_cpu_free(b);
    tg_backend_cpu_free(b1);
}

/* embedding_bf16: each row the exact fp32 of the table's bf16 values. */
static void test_embedding_bf16(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int V = 50, H = 37;
    uint16_t *t = malloc(sizeof(uint16_t) * V * H);
    float *out = malloc(sizeof(float) * 3 * H);
    for (int e = 0; e < V * H; e++)
        t[e] = to_bf16((float)(urand() * 2.0 - 1.0));
    const int32_t ids[3] = {49, 0, 17};
    assert_int_equal(tg_ops_cpu.embedding_bf16(b, t, V, H, ids, 3, out), 0);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < H; j++)
            assert_true(out[i * H + j] == from_bf16(t[ids[i] * H + j]));
    const int32_t bad = V;
    assert_int_equal(tg_ops_cpu.embedding_bf16(b, t, V, H, &bad, 1, out),
                     TG_EINVAL);
    free(t);
    free(out);
    tg_backend_cpu_free(b);
}

/* The sampler's vocabulary buffers and gemm_bf16's split copy of x are
 * separate: growing the one (a first sample over a vocabulary) leaves the
 * other valid, so a later bf16 gemm gives the same bits and freeing the
 * backend frees each buffer once (glibc aborts on a double free). */
static void test_bf16_after_sample(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int n = 40, k = 96, V = 4096;
    float *x = malloc(sizeof(float) * k), *y = malloc(sizeof(float) * n);
    float *y2 = malloc(sizeof(float) * n), *logits = malloc(sizeof(float) * V);
    uint16_t *w = malloc(sizeof(uint16_t) * n * k);
    fill(x, (size_t)k, 1.0);
    for (int e = 0; e < n * k; e++)
        w[e] = to_bf16((float)(urand() * 2.0 - 1.0));
    fill(logits, (size_t)V, 1.0);
    assert_int_equal(tg_ops_cpu.gemm_bf16(b, x, w, NULL, 1, n, k, y), 0);
    const struct tg_sampling greedy = {
        .temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    int32_t tok = -1;
    assert_int_equal(tg_ops_cpu.sample(b, logits, V, &greedy, NULL, NULL, &tok,
                                       NULL, 0, NULL, NULL),
                     0);
    assert_true(tok >= 0 && tok < V);
    /* A block the size of the split copy, allocated right after the
     * sample: had the sample freed the copy, the allocator would hand its
     * memory out here (both glibc and jemalloc reuse a just-freed block of
     * the size first) and the next gemm_bf16 would write into it. */
    float *probe = aligned_alloc(64, sizeof(float) * k);
    for (int e = 0; e < k; e++)
        probe[e] = -7.0f;
    assert_int_equal(tg_ops_cpu.gemm_bf16(b, x, w, NULL, 1, n, k, y2), 0);
    for (int e = 0; e < k; e++)
        if (probe[e] != -7.0f)
            fail_msg("gemm_bf16 wrote into memory the sampler freed");
    assert_memory_equal(y, y2, sizeof(float) * n);
    free(probe);
    tg_backend_cpu_free(b);
    free(x);
    free(y);
    free(y2);
    free(logits);
    free(w);
}

static void test_rope(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int n = 5, heads = 3, d = 8;
    float x[5 * 3 * 8], x0[5 * 3 * 8], inv[4];
    int32_t pos[5] = {0, 1, 7, 100, 4095};
    fill(x, sizeof(x) / sizeof(x[0]), 2.0);
    memcpy(x0, x, sizeof(x));
    for (int j = 0; j < d / 2; j++)
        inv[j] = (float)pow(10000.0, -2.0 * j / d);
    assert_int_equal(tg_ops_cpu.rope(b, x, n, heads, d, pos, inv), 0);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++)
            for (int j = 0; j < d / 2; j++) {
                const float *r0 = x0 + (i * heads + h) * d;
                const float *r = x + (i * heads + h) * d;
                double a = (double)((float)pos[i] * inv[j]); /* fp32 angle, as HF */
                double x1 = r0[j], x2 = r0[j + d / 2];
                near(r[j], x1 * cos(a) - x2 * sin(a), 1e-5);
                near(r[j + d / 2], x2 * cos(a) + x1 * sin(a), 1e-5);
            }
    /* Position 0 is the identity on every pair. */
    for (int j = 0; j < heads * d; j++)
        near(x[j], x0[j], 1e-7);
    assert_int_equal(tg_ops_cpu.rope(b, x, n, heads, 7, pos, inv), TG_EINVAL);
    tg_backend_cpu_free(b);
}

/* ---- ragged rows ------------------------------------------------------- */

struct ragged {
    struct tg_kv_rows r;
    float *pool;
    int32_t *head_group, *head_slot, *len;
    int32_t **pages;
    int n_groups;
    int cap; /* tokens each group can hold */
};

/* Builds rows for Hkv heads in groups of H_p with random lengths in
 * [0, max_len] (first group forced to 0 when zero_first), room for `extra`
 * more tokens per group, pages scattered over a shuffled pool. */
static void ragged_init(struct ragged *g, int Hkv, int H_p, int P, int d,
                        int max_len, int extra, int zero_first)
{
    memset(g, 0, sizeof(*g));
    g->n_groups = Hkv / H_p;
    g->cap = max_len + extra;
    int pages_per = (g->cap + P - 1) / P;
    int n_pages = g->n_groups * pages_per + 3;
    size_t page_floats = (size_t)H_p * 2 * P * d;
    g->pool = malloc(sizeof(float) * page_floats * n_pages);
    fill(g->pool, page_floats * n_pages, 1.0); /* garbage outside rows */
    int32_t *perm = malloc(sizeof(int32_t) * n_pages);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = irand(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    g->pages = malloc(sizeof(int32_t *) * g->n_groups);
    g->len = malloc(sizeof(int32_t) * g->n_groups);
    for (int q = 0; q < g->n_groups; q++) {
        g->pages[q] = malloc(sizeof(int32_t) * (pages_per + 1));
        for (int p = 0; p < pages_per; p++)
            g->pages[q][p] = perm[q * pages_per + p];
        g->len[q] = (zero_first && q == 0) ? 0 : irand(max_len + 1);
    }
    free(perm);
    /* Shuffled (group, slot) assignment of heads. */
    int *hp = malloc(sizeof(int) * Hkv);
    for (int i = 0; i < Hkv; i++)
        hp[i] = i;
    for (int i = Hkv - 1; i > 0; i--) {
        int j = irand(i + 1), t = hp[i];
        hp[i] = hp[j];
        hp[j] = t;
    }
    g->head_group = malloc(sizeof(int32_t) * Hkv);
    g->head_slot = malloc(sizeof(int32_t) * Hkv);
    for (int i = 0; i < Hkv; i++) {
        g->head_group[hp[i]] = i / H_p;
        g->head_slot[hp[i]] = i % H_p;
    }
    free(hp);
    g->r = (struct tg_kv_rows){
        .pool = g->pool, .heads_per_group = H_p, .page_size = P, .head_dim = d,
        .n_kv_heads = Hkv, .head_group = g->head_group, .head_slot = g->head_slot,
        .group_pages = (const int32_t *const *)g->pages, .group_len = g->len};
}

static void ragged_free(struct ragged *g)
{
    for (int q = 0; q < g->n_groups; q++)
        free(g->pages[q]);
    free(g->pages);
    free(g->len);
    free(g->head_group);
    free(g->head_slot);
    free(g->pool);
}

/* Pointer to K (kv = 0) or V (kv = 1) of token t of head h, straight from
 * the layout contract in tg_ops.h. */
static float *row_at(const struct ragged *g, int h, int t, int kv)
{
    const struct tg_kv_rows *r = &g->r;
    int grp = r->head_group[h], slot = r->head_slot[h];
    int P = r->page_size, d = r->head_dim;
    size_t page = (size_t)r->group_pages[grp][t / P];
    size_t page_floats = (size_t)r->heads_per_group * 2 * P * d;
    return r->pool + page * page_floats + ((size_t)(slot * 2 + kv) * P + t % P) * d;
}

/* Double reference of one query against a list of key/value rows. */
static void ref_attend(const float *q, const float *const *ks,
                       const float *const *vs, int cnt, int d, double scale,
                       double *out)
{
    double *s = malloc(sizeof(double) * (cnt + 1));
    double mx = -INFINITY, z = 0.0;
    for (int t = 0; t < cnt; t++) {
        double dot = 0;
        for (int j = 0; j < d; j++)
            dot += (double)q[j] * ks[t][j];
        s[t] = dot * scale;
        mx = s[t] > mx ? s[t] : mx;
    }
    for (int j = 0; j < d; j++)
        out[j] = 0.0;
    for (int t = 0; t < cnt; t++) {
        s[t] = exp(s[t] - mx);
        z += s[t];
        for (int j = 0; j < d; j++)
            out[j] += s[t] * vs[t][j];
    }
    for (int j = 0; j < d; j++)
        out[j] /= z;
    free(s);
}

static void check_chunk(struct tg_backend *b, int Hkv, int H_p, int P, int G,
                        int n, int d, int max_hist, int zero_first)
{
    struct ragged g;
    ragged_init(&g, Hkv, H_p, P, d, max_hist, 0, zero_first);
    int Hq = Hkv * G;
    float *q = malloc(sizeof(float) * n * Hq * d), *k = malloc(sizeof(float) * n * Hkv * d);
    float *v = malloc(sizeof(float) * n * Hkv * d), *out = malloc(sizeof(float) * n * Hq * d);
    fill(q, (size_t)n * Hq * d, 1.5);
    fill(k, (size_t)n * Hkv * d, 1.5);
    fill(v, (size_t)n * Hkv * d, 1.0);
    float scale = 1.0f / sqrtf((float)d);
    assert_int_equal(tg_ops_cpu.attn_chunk(b, q, k, v, n, Hq, &g.r, scale, out), 0);
    const float **ks = malloc(sizeof(float *) * (max_hist + n));
    const float **vs = malloc(sizeof(float *) * (max_hist + n));
    double *ref = malloc(sizeof(double) * d);
    for (int i = 0; i < n; i++)
        for (int qh = 0; qh < Hq; qh++) {
            int h = qh / G, L = g.len[g.head_group[h]], c = 0;
            for (int t = 0; t < L; t++, c++) {
                ks[c] = row_at(&g, h, t, 0);
                vs[c] = row_at(&g, h, t, 1);
            }
            for (int t = 0; t <= i; t++, c++) {
                ks[c] = k + ((size_t)t * Hkv + h) * d;
                vs[c] = v + ((size_t)t * Hkv + h) * d;
            }
            const float *qi = q + ((size_t)i * Hq + qh) * d;
            ref_attend(qi, ks, vs, c, d, scale, ref);
            for (int j = 0; j < d; j++)
                near(out[((size_t)i * Hq + qh) * d + j], ref[j], 1e-4);
        }
    free(ks);
    free(vs);
    free(ref);
    free(q);
    free(k);
    free(v);
    free(out);
    ragged_free(&g);
}

static void test_attn_chunk(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int hps[] = {1, 2, 4}, ps[] = {1, 4, 16}, gs[] = {1, 2, 4};
    for (int a = 0; a < 3; a++)
        for (int c = 0; c < 3; c++)
            for (int e = 0; e < 3; e++) {
                check_chunk(b, 4, hps[a], ps[c], gs[e], 1 + irand(9), 8, 40, a == 1);
                check_chunk(b, 4, hps[a], ps[c], gs[e], 1, 16, 5, 0); /* single token */
            }
    /* Empty history everywhere, larger chunk crossing several key tiles. */
    check_chunk(b, 2, 2, 16, 2, 70, 32, 0, 1);
    /* Long history with a wide head, enough work to run the OpenMP team. */
    check_chunk(b, 4, 2, 16, 2, 12, 64, 300, 0);
    tg_backend_cpu_free(b);
}

static void test_attn_chunk_bad(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    struct ragged g;
    ragged_init(&g, 4, 2, 4, 8, 3, 0, 0);
    float q[3 * 8 * 8] = {0}, k[8 * 8 * 3] = {0}, out[3 * 8 * 8];
    /* Hq not a multiple of Hkv. */
    assert_int_equal(tg_ops_cpu.attn_chunk(b, q, k, k, 1, 6, &g.r, 1.0f, out), TG_EINVAL);
    assert_int_equal(tg_ops_cpu.attn_chunk(b, q, k, k, 1, 8, NULL, 1.0f, out), TG_EINVAL);
    g.head_slot[0] = 2; /* slot outside H_p */
    assert_int_equal(tg_ops_cpu.attn_chunk(b, q, k, k, 1, 8, &g.r, 1.0f, out), TG_EINVAL);
    ragged_free(&g);
    tg_backend_cpu_free(b);
}

static void test_attn_decode(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int cfg[][4] = {{1, 1, 1, 8}, {2, 4, 2, 16}, {4, 16, 4, 8}, {2, 16, 1, 64}};
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        int H_p = cfg[c][0], P = cfg[c][1], G = cfg[c][2], d = cfg[c][3];
        const int n_seq = 3, Hkv = 4, Hq = Hkv * G;
        struct ragged g[3];
        struct tg_kv_rows rows[3];
        for (int s = 0; s < n_seq; s++) {
            ragged_init(&g[s], Hkv, H_p, P, d, 50 * (s + 1), 0, 0);
            for (int q = 0; q < g[s].n_groups; q++)
                if (g[s].len[q] == 0)
                    g[s].len[q] = 1; /* rows hold the new token */
            rows[s] = g[s].r;
        }
        float *q = malloc(sizeof(float) * n_seq * Hq * d);
        float *out = malloc(sizeof(float) * n_seq * Hq * d);
        fill(q, (size_t)n_seq * Hq * d, 1.5);
        float scale = 1.0f / sqrtf((float)d);
        assert_int_equal(tg_ops_cpu.attn_decode(b, q, n_seq, Hq, rows, scale, out), 0);
        const float **ks = malloc(sizeof(float *) * 150), **vs = malloc(sizeof(float *) * 150);
        double *ref = malloc(sizeof(double) * d);
        for (int s = 0; s < n_seq; s++)
            for (int qh = 0; qh < Hq; qh++) {
                int h = qh / G, L = g[s].len[g[s].head_group[h]];
                for (int t = 0; t < L; t++) {
                    ks[t] = row_at(&g[s], h, t, 0);
                    vs[t] = row_at(&g[s], h, t, 1);
                }
                ref_attend(q + ((size_t)s * Hq + qh) * d, ks, vs, L, d, scale, ref);
                for (int j = 0; j < d; j++)
                    near(out[((size_t)s * Hq + qh) * d + j], ref[j], 1e-4);
            }
        /* An empty row is a caller bug (the new token must be there). */
        g[1].len[0] = 0;
        assert_int_equal(tg_ops_cpu.attn_decode(b, q, n_seq, Hq, rows, scale, out), TG_EINVAL);
        free(ks);
        free(vs);
        free(ref);
        free(q);
        free(out);
        for (int s = 0; s < n_seq; s++)
            ragged_free(&g[s]);
    }
    tg_backend_cpu_free(b);
}

/* ---- kv_append --------------------------------------------------------- */

static void test_kv_append(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int cfg[][3] = {{1, 1, 4}, {2, 4, 8}, {4, 16, 8}, {2, 3, 16}};
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        int H_p = cfg[c][0], P = cfg[c][1], d = cfg[c][2];
        const int Hkv = 4, n = 13;
        struct ragged g;
        ragged_init(&g, Hkv, H_p, P, d, 20, n, 1);
        float *k = malloc(sizeof(float) * n * Hkv * d), *v = malloc(sizeof(float) * n * Hkv * d);
        fill(k, (size_t)n * Hkv * d, 1.0);
        fill(v, (size_t)n * Hkv * d, 1.0);
        /* Per group a keep count; per head its own ascending subset. */
        int32_t *idx = malloc(sizeof(int32_t) * Hkv * n), keep[4];
        int gkeep[4];
        for (int q = 0; q < g.n_groups; q++)
            gkeep[q] = irand(n + 1);
        for (int h = 0; h < Hkv; h++) {
            keep[h] = gkeep[g.head_group[h]];
            int o = 0;
            for (int i = 0; i < n && o < keep[h]; i++)
                if (n - i <= keep[h] - o || urand() < 0.5)
                    idx[h * n + o++] = i;
            assert_int_equal(o, keep[h]);
        }
        int32_t before[4];
        memcpy(before, g.len, sizeof(int32_t) * g.n_groups);
        /* A copy of the old rows must survive the append untouched. */
        float *old = malloc(sizeof(float) * Hkv * 20 * 2 * d);
        for (int h = 0; h < Hkv; h++)
            for (int t = 0; t < before[g.head_group[h]]; t++)
                for (int kv = 0; kv < 2; kv++)
                    memcpy(old + (((size_t)h * 20 + t) * 2 + kv) * d, row_at(&g, h, t, kv),
                           sizeof(float) * d);
        assert_int_equal(tg_ops_cpu.kv_append(b, &g.r, k, v, n, idx, keep), 0);
        for (int h = 0; h < Hkv; h++) {
            int base = before[g.head_group[h]];
            for (int t = 0; t < base; t++)
                for (int kv = 0; kv < 2; kv++)
                    assert_memory_equal(old + (((size_t)h * 20 + t) * 2 + kv) * d,
                                        row_at(&g, h, t, kv), sizeof(float) * d);
            for (int t = 0; t < keep[h]; t++) {
                size_t so = ((size_t)idx[h * n + t] * Hkv + h) * d;
                assert_memory_equal(row_at(&g, h, base + t, 0), k + so, sizeof(float) * d);
                assert_memory_equal(row_at(&g, h, base + t, 1), v + so, sizeof(float) * d);
            }
        }
        /* Advance as the caller does, then append everything (idx NULL). */
        for (int q = 0; q < g.n_groups; q++)
            g.len[q] += gkeep[q];
        int32_t mark[4];
        memcpy(mark, g.len, sizeof(mark[0]) * g.n_groups);
        /* Shrink the chunk so every group still has room. */
        int room = n;
        for (int q = 0; q < g.n_groups; q++)
            room = g.cap - g.len[q] < room ? g.cap - g.len[q] : room;
        assert_int_equal(tg_ops_cpu.kv_append(b, &g.r, k, v, room, NULL, NULL), 0);
        for (int h = 0; h < Hkv; h++)
            for (int t = 0; t < room; t++) {
                size_t so = ((size_t)t * Hkv + h) * d;
                assert_memory_equal(row_at(&g, h, mark[g.head_group[h]] + t, 0), k + so,
                                    sizeof(float) * d);
                assert_memory_equal(row_at(&g, h, mark[g.head_group[h]] + t, 1), v + so,
                                    sizeof(float) * d);
            }
        free(old);
        free(idx);
        free(k);
        free(v);
        ragged_free(&g);
    }
    tg_backend_cpu_free(b);
}

static void test_kv_append_bad(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    struct ragged g;
    ragged_init(&g, 4, 2, 4, 8, 0, 8, 1);
    float k[4 * 4 * 8] = {0};
    int32_t idx[4 * 4] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    int32_t keep[4] = {2, 2, 2, 2};
    size_t pool_floats = (size_t)(2 * 2 + 3) * 2 * 2 * 4 * 8; /* 7 pages */
    float *snap = malloc(sizeof(float) * pool_floats);
    memcpy(snap, g.pool, sizeof(float) * pool_floats);
    /* Two heads of one group with different counts. */
    for (int h = 0; h < 4; h++)
        if (g.head_group[h] == 0 && g.head_slot[h] == 1)
            keep[h] = 3;
    assert_int_equal(tg_ops_cpu.kv_append(b, &g.r, k, k, 4, idx, keep), TG_EINVAL);
    for (int h = 0; h < 4; h++)
        keep[h] = 2;
    idx[4 * 3 + 1] = 4; /* index outside the chunk */
    assert_int_equal(tg_ops_cpu.kv_append(b, &g.r, k, k, 4, idx, keep), TG_EINVAL);
    idx[4 * 3 + 1] = 1;
    keep[0] = keep[1] = keep[2] = keep[3] = 5; /* more than n */
    assert_int_equal(tg_ops_cpu.kv_append(b, &g.r, k, k, 4, idx, keep), TG_EINVAL);
    assert_int_equal(tg_ops_cpu.kv_append(b, &g.r, k, k, 4, idx, NULL), TG_EINVAL);
    /* Rejected calls wrote nothing. */
    assert_memory_equal(snap, g.pool, sizeof(float) * pool_floats);
    free(snap);
    ragged_free(&g);
    tg_backend_cpu_free(b);
}

static void test_backend_lifecycle(void **st)
{
    (void)st;
    tg_backend_cpu_free(NULL);
    struct tg_backend *b = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &b), 0);
    assert_non_null(b);
    assert_string_equal(tg_ops_cpu.name, "cpu");
    tg_backend_cpu_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_lifecycle),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_silu),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_paths),
        cmocka_unit_test(test_embedding_bf16),
        cmocka_unit_test(test_bf16_after_sample),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attn_chunk),
        cmocka_unit_test(test_attn_chunk_bad),
        cmocka_unit_test(test_attn_decode),
        cmocka_unit_test(test_kv_append),
        cmocka_unit_test(test_kv_append_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
