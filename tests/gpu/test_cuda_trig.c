/* test_cuda_trig.c — decode-time compression on the device
 * (kernels/cuda/trig.h) against the CPU pieces of gpu_worker/model/gw_trig.c:
 *  - scores of many items in one launch (several rows, layers, heads, G
 *    up to 8, d 64 / 128, regions crossing pages, positions up to 40K so
 *    the angles are large) against gw_trig_score, to fp32 rounding of a
 *    d-element dot product;
 *  - compaction of many items in one launch (dense, sparse, all kept,
 *    none kept, survivors whose destination is an earlier survivor's
 *    source, regions longer than a staging chunk) against
 *    gw_trig_compact_head over the same pool, bit for bit over the whole
 *    pool (so a write anywhere else is caught);
 *  - faults (a row out of range, a region past the row's pages, survivors
 *    not ascending): the item is skipped, the flag set, the others done;
 *  - argument errors, which need no device: they run even without one,
 *    then the program reports skipped (77).
 * Built without CUDA: skipped (77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"
#include "gpu_worker/model/gw_trig.h"
#include "kernels/tg_ops.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/trig.h"

static struct tt_xrng rng = {0x7417a11e5eedull};

/* A pool of rows: n_rows rows of H_p heads, row r owning npg[r] pages
 * (a random permutation of the pool's ids). */
struct world {
    int Hp, P, d, n_rows;
    int64_t n_pages;
    int32_t *indptr, *indices, *npg;
    uint16_t *pool; /* bf16 bits */
};

static size_t pool_elems(const struct world *w)
{
    return (size_t)w->n_pages * (size_t)w->Hp * 2 * (size_t)w->P * (size_t)w->d;
}

static void world_make(struct world *w, int Hp, int P, int d, int n_rows,
                       int max_tokens)
{
    memset(w, 0, sizeof(*w));
    w->Hp = Hp;
    w->P = P;
    w->d = d;
    w->n_rows = n_rows;
    w->indptr = tt_xmalloc((size_t)(n_rows + 1) * sizeof(int32_t));
    w->npg = tt_xmalloc((size_t)n_rows * sizeof(int32_t));
    w->indptr[0] = 0;
    for (int r = 0; r < n_rows; r++) {
        w->npg[r] = (max_tokens + P - 1) / P;
        w->indptr[r + 1] = w->indptr[r] + w->npg[r];
    }
    w->n_pages = w->indptr[n_rows] + 2;
    w->indices = tt_xmalloc((size_t)w->indptr[n_rows] * sizeof(int32_t));
    int32_t *perm = tt_xmalloc((size_t)w->n_pages * sizeof(int32_t));
    tt_xrng_perm(&rng, perm, w->n_pages);
    memcpy(w->indices, perm, (size_t)w->indptr[n_rows] * sizeof(int32_t));
    free(perm);
    size_t np = pool_elems(w);
    w->pool = tt_xmalloc(np * sizeof(uint16_t));
    tt_fill_bf16(&rng, w->pool, NULL, np, -2.0f, 2.0f);
}

static void world_free(struct world *w)
{
    free(w->indptr);
    free(w->indices);
    free(w->npg);
    free(w->pool);
}

/* The CPU view of one row: every head of the row as head h = slot (one
 * group), lengths = the row's capacity. fp is the float copy of the pool. */
static struct tg_kv_rows row_view(const struct world *w, float *fp, int row,
                                  const int32_t **gp, int32_t *glen,
                                  int32_t *hg, int32_t *hs)
{
    gp[0] = w->indices + w->indptr[row];
    glen[0] = w->npg[row] * w->P;
    for (int h = 0; h < w->Hp; h++) {
        hg[h] = 0;
        hs[h] = h;
    }
    struct tg_kv_rows v = {
        .pool = fp, .heads_per_group = w->Hp, .page_size = w->P,
        .head_dim = w->d, .n_kv_heads = w->Hp, .head_group = hg,
        .head_slot = hs, .group_pages = gp, .group_len = glen,
    };
    return v;
}

struct dev {
    uint16_t *pool;
    int32_t *indptr, *indices, *fault, *src;
    struct tg_cuda_trig_item *items;
    float *score, *re, *im, *abs, *inv_freq;
};

static struct tg_cuda_trig_pages pages_of(const struct world *w,
                                          const struct dev *dv)
{
    struct tg_cuda_trig_pages pg = {
        .pool = dv->pool, .n_pages = w->n_pages, .heads_per_group = w->Hp,
        .page_size = w->P, .head_dim = w->d, .indptr = dv->indptr,
        .indices = dv->indices, .n_rows = w->n_rows,
    };
    return pg;
}

static void dev_world(struct dev *dv, const struct world *w)
{
    memset(dv, 0, sizeof(*dv));
    dv->pool = tt_cuda_upload(w->pool, pool_elems(w) * 2);
    dv->indptr = tt_cuda_upload(w->indptr, (size_t)(w->n_rows + 1) * 4);
    dv->indices = tt_cuda_upload(w->indices, (size_t)w->indptr[w->n_rows] * 4);
    dv->fault = tt_cuda_alloc(4);
    int32_t zero = 0;
    tt_cuda_to_dev(dv->fault, &zero, 4);
}

static void dev_free(struct dev *dv)
{
    void *p[] = {dv->pool, dv->indptr, dv->indices, dv->fault, dv->src,
                 dv->items, dv->score, dv->re, dv->im, dv->abs, dv->inv_freq};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
        if (p[i] != NULL)
            cudaFree(p[i]);
}

static int fault_read(const struct dev *dv)
{
    int32_t f = 0;
    tt_cuda_to_host(&f, dv->fault, 4);
    return f;
}

/* ---- scores ------------------------------------------------------------- */

static void run_scores(int Hp, int P, int d, int G, int L, int n_rows,
                       int n_items)
{
    const int half = d / 2, Hq = Hp * G, max_tok = 5 * P + 7;
    struct world w;
    world_make(&w, Hp, P, d, n_rows, max_tok);
    size_t ns = (size_t)L * Hq * half;
    float *re = tt_xmalloc(ns * 4), *im = tt_xmalloc(ns * 4),
          *ab = tt_xmalloc(ns * 4), *inv = tt_xmalloc((size_t)half * 4);
    for (size_t i = 0; i < ns; i++) {
        re[i] = tt_xrng_float(&rng, -1.0f, 1.0f);
        im[i] = tt_xrng_float(&rng, -1.0f, 1.0f);
        ab[i] = sqrtf(re[i] * re[i] + im[i] * im[i]) +
                tt_xrng_float(&rng, 0.0f, 0.5f);
    }
    for (int f = 0; f < half; f++)
        inv[f] = (float)pow(10000.0, -2.0 * f / d);
    struct tg_cuda_trig_item *it = tt_xmalloc((size_t)n_items * sizeof(*it));
    int32_t total = 0;
    for (int i = 0; i < n_items; i++) {
        it[i].row = tt_xrng_int(&rng, 0, n_rows - 1);
        it[i].head = tt_xrng_int(&rng, 0, Hp - 1);
        it[i].slot = it[i].head; /* one group per row in this world */
        it[i].layer = tt_xrng_int(&rng, 0, L - 1);
        it[i].first = tt_xrng_int(&rng, 0, 2 * P);
        it[i].n = tt_xrng_int(&rng, 0, max_tok - it[i].first);
        it[i].off = total;
        it[i].n_keep = 0;
        it[i].t = tt_xrng_int64(&rng, it[i].first + it[i].n, 40000);
        total += it[i].n;
    }
    struct dev dv;
    dev_world(&dv, &w);
    dv.items = tt_cuda_upload(it, (size_t)n_items * sizeof(*it));
    dv.score = tt_cuda_alloc((size_t)(total > 0 ? total : 1) * 4);
    dv.re = tt_cuda_upload(re, ns * 4);
    dv.im = tt_cuda_upload(im, ns * 4);
    dv.abs = tt_cuda_upload(ab, ns * 4);
    dv.inv_freq = tt_cuda_upload(inv, (size_t)half * 4);
    struct tg_cuda_trig_score_args a = {
        .pg = pages_of(&w, &dv), .items = dv.items, .n_items = n_items,
        .n_q_per_kv = G, .n_q_heads = Hq, .n_layers = L, .re = dv.re,
        .im = dv.im, .abs = dv.abs, .inv_freq = dv.inv_freq,
        .score = dv.score, .fault = dv.fault,
    };
    char err[256] = "";
    assert_int_equal(tg_cuda_trig_score(&a, err, sizeof(err)), 0);
    float *gs = tt_xmalloc((size_t)(total > 0 ? total : 1) * 4);
    tt_cuda_to_host(gs, dv.score, (size_t)total * 4);
    assert_int_equal(fault_read(&dv), 0);

    float *k = tt_xmalloc((size_t)d * 4);
    struct gw_trig_qstat *qs = tt_xmalloc((size_t)G * sizeof(*qs));
    for (int i = 0; i < n_items; i++) {
        for (int g = 0; g < G; g++) {
            size_t o = ((size_t)it[i].layer * Hq + (size_t)(it[i].head * G + g)) *
                       (size_t)half;
            qs[g].re = re + o;
            qs[g].im = im + o;
            qs[g].abs = ab + o;
        }
        for (int j = 0; j < it[i].n; j++) {
            int t = it[i].first + j;
            int32_t page = w.indices[w.indptr[it[i].row] + t / P];
            size_t base = (((size_t)page * Hp + (size_t)it[i].slot) * 2 *
                           (size_t)P + (size_t)(t % P)) * (size_t)d;
            for (int x = 0; x < d; x++)
                k[x] = st_bf16_to_f32(w.pool[base + x]);
            double want = gw_trig_score(qs, G, k, d, inv, it[i].t);
            /* The device sums d/2 fp32 terms kx U + ky V + A |k|; its error
             * is a small multiple of fp32 epsilon times the sum of the
             * terms' magnitudes (mag, built here in double). */
            double mag = 0.0;
            for (int f = 0; f < half; f++) {
                double u = 0, v = 0, an = 0;
                for (int g = 0; g < G; g++) {
                    double a0 = qs[g].re[f], b0 = qs[g].im[f];
                    an += fabs((double)qs[g].abs[f] - sqrt(a0 * a0 + b0 * b0));
                    u += (fabs(a0) + fabs(b0)) * GW_TRIG_N_OFFSETS;
                    v = u;
                }
                double kx = k[f], ky = k[f + half];
                mag += fabs(kx) * u + fabs(ky) * v +
                       GW_TRIG_N_OFFSETS * an * sqrt(kx * kx + ky * ky);
            }
            mag /= (double)G * GW_TRIG_N_OFFSETS * sqrt((double)d);
            double tol = 1e-5 * mag + 1e-7;
            if (fabs((double)gs[it[i].off + j] - want) > tol)
                fail_msg("item %d key %d: device %.9g, host %.9g (tol %.3g)",
                         i, j, (double)gs[it[i].off + j], want, tol);
        }
    }
    free(k);
    free(qs);
    free(gs);
    free(it);
    free(re);
    free(im);
    free(ab);
    free(inv);
    dev_free(&dv);
    world_free(&w);
}

static void test_score_vs_cpu(void **state)
{
    (void)state;
    run_scores(1, 16, 64, 1, 1, 1, 1);
    run_scores(2, 16, 128, 4, 3, 5, 40);
    run_scores(4, 7, 64, 8, 2, 9, 100);
    run_scores(8, 32, 128, 2, 4, 3, 64);
}

/* ---- survivor choice ---------------------------------------------------- */

/* Scores with many ties (a few distinct values), NaNs, negative zeros and
 * infinities, against gw_trig_select on the same values. */
static void run_select(int n_items, int max_n, int window, int distinct)
{
    struct tg_cuda_trig_item *it = tt_xmalloc((size_t)n_items * sizeof(*it));
    int32_t total = 0;
    for (int i = 0; i < n_items; i++) {
        memset(&it[i], 0, sizeof(it[i]));
        it[i].n = tt_xrng_int(&rng, window, max_n);
        it[i].n_keep = tt_xrng_int(&rng, window, it[i].n);
        if (i % 5 == 0)
            it[i].n_keep = window;   /* nothing chosen by score */
        if (i % 7 == 0)
            it[i].n_keep = it[i].n;  /* everything kept */
        it[i].off = total;
        total += it[i].n;
    }
    float *sc = tt_xmalloc((size_t)(total > 0 ? total : 1) * 4);
    for (int32_t j = 0; j < total; j++) {
        int r = tt_xrng_int(&rng, 0, 99);
        sc[j] = r == 0   ? NAN
                : r == 1 ? -INFINITY
                : r == 2 ? INFINITY
                : r == 3 ? -0.0f
                : distinct > 0
                    ? (float)tt_xrng_int(&rng, -distinct, distinct) * 0.5f
                    : tt_xrng_float(&rng, -10.0f, 10.0f);
    }
    struct tg_cuda_trig_item *d_it =
        tt_cuda_upload(it, (size_t)(n_items > 0 ? n_items : 1) * sizeof(*it));
    float *d_sc = tt_cuda_upload(sc, (size_t)(total > 0 ? total : 1) * 4);
    int32_t *d_src = tt_cuda_alloc((size_t)(total > 0 ? total : 1) * 4);
    int32_t *d_fault = tt_cuda_alloc(4);
    int32_t zero = 0;
    tt_cuda_to_dev(d_fault, &zero, 4);
    struct tg_cuda_trig_select_args a = {
        .items = d_it, .n_items = n_items, .window = window, .score = d_sc,
        .src = d_src, .fault = d_fault,
    };
    char err[256] = "";
    assert_int_equal(tg_cuda_trig_select(&a, err, sizeof(err)), 0);
    int32_t *src = tt_xmalloc((size_t)(total > 0 ? total : 1) * 4);
    tt_cuda_to_host(src, d_src, (size_t)total * 4);
    int32_t f = -1;
    tt_cuda_to_host(&f, d_fault, 4);
    assert_int_equal(f, 0);
    double *dsc = tt_xmalloc((size_t)max_n * sizeof(double));
    uint8_t *keep = tt_xmalloc((size_t)max_n);
    for (int i = 0; i < n_items; i++) {
        for (int j = 0; j < it[i].n; j++)
            dsc[j] = (double)sc[it[i].off + j];
        assert_int_equal(gw_trig_select(dsc, it[i].n, it[i].n_keep, window,
                                        keep), 0);
        int m = 0;
        for (int j = 0; j < it[i].n; j++)
            if (keep[j]) {
                if (src[it[i].off + m] != j)
                    fail_msg("item %d (n %d keep %d window %d): survivor %d "
                             "is slot %d on the device, %d on the host", i,
                             it[i].n, it[i].n_keep, window, m,
                             src[it[i].off + m], j);
                m++;
            }
        assert_int_equal(m, it[i].n_keep);
    }
    free(dsc);
    free(keep);
    free(src);
    free(sc);
    free(it);
    cudaFree(d_it);
    cudaFree(d_sc);
    cudaFree(d_src);
    cudaFree(d_fault);
}

static void test_select_vs_cpu(void **state)
{
    (void)state;
    run_select(1, 1, 0, 0);
    run_select(50, 300, 8, 3);      /* heavy ties */
    run_select(40, 2200, 32, 0);    /* default-sized regions */
    run_select(6, 17000, 32, 50);   /* caps far above one CTA's tile */
    run_select(30, 64, 0, 1);       /* no window, three values */
}

/* ---- compaction --------------------------------------------------------- */

enum pattern { PAT_RANDOM, PAT_ALL, PAT_NONE, PAT_SHIFT1, PAT_SPARSE, PAT_N };

/* Survivors of a region of n slots, ascending; returns their count. */
static int make_survivors(int pattern, int n, int32_t *src)
{
    int m = 0;
    for (int j = 0; j < n; j++) {
        int keep;
        switch (pattern) {
        case PAT_ALL: keep = 1; break;
        case PAT_NONE: keep = 0; break;
        case PAT_SHIFT1: keep = j > 0; break; /* dst i = src of i - 1 */
        case PAT_SPARSE: keep = tt_xrng_int(&rng, 0, 9) == 0; break;
        default: keep = tt_xrng_int(&rng, 0, 1); break;
        }
        if (keep)
            src[m++] = j;
    }
    return m;
}

static void run_compact(int Hp, int P, int d, int n_rows, int max_tok)
{
    struct world w;
    world_make(&w, Hp, P, d, n_rows, max_tok);
    /* One item per (row, head), some rows left alone. */
    int cap_items = n_rows * Hp;
    struct tg_cuda_trig_item *it = tt_xmalloc((size_t)cap_items * sizeof(*it));
    int32_t *src = tt_xmalloc((size_t)cap_items * (size_t)max_tok * 4);
    uint8_t *keep = tt_xmalloc((size_t)max_tok);
    int n_items = 0, total = 0;
    for (int r = 0; r < n_rows; r++)
        for (int h = 0; h < Hp; h++) {
            if (tt_xrng_int(&rng, 0, 4) == 0)
                continue;
            struct tg_cuda_trig_item *x = &it[n_items++];
            x->row = r;
            x->head = h;
            x->slot = h;
            x->layer = 0;
            x->first = tt_xrng_int(&rng, 0, max_tok / 3);
            x->n = tt_xrng_int(&rng, 0, max_tok - x->first);
            x->off = total;
            x->n_keep = make_survivors(tt_xrng_int(&rng, 0, PAT_N - 1), x->n,
                                       src + total);
            x->t = 0;
            total += x->n_keep;
        }
    struct dev dv;
    dev_world(&dv, &w);
    dv.items = tt_cuda_upload(it, (size_t)(n_items > 0 ? n_items : 1) * sizeof(*it));
    dv.src = tt_cuda_upload(src, (size_t)(total > 0 ? total : 1) * 4);
    struct tg_cuda_trig_compact_args a = {
        .pg = pages_of(&w, &dv), .items = dv.items, .n_items = n_items,
        .src = dv.src, .fault = dv.fault,
    };
    char err[256] = "";
    assert_int_equal(tg_cuda_trig_compact(&a, err, sizeof(err)), 0);
    size_t np = pool_elems(&w);
    uint16_t *gpool = tt_xmalloc(np * 2);
    tt_cuda_to_host(gpool, dv.pool, np * 2);
    assert_int_equal(fault_read(&dv), 0);

    /* The CPU reference over a float copy of the same pool. */
    float *fp = tt_xmalloc(np * sizeof(float));
    for (size_t i = 0; i < np; i++)
        fp[i] = st_bf16_to_f32(w.pool[i]);
    float *scratch = tt_xmalloc((size_t)2 * max_tok * d * sizeof(float));
    const int32_t *gp[1];
    int32_t glen[1], hg[16], hs[16];
    for (int i = 0; i < n_items; i++) {
        struct tg_kv_rows v = row_view(&w, fp, it[i].row, gp, glen, hg, hs);
        memset(keep, 0, (size_t)max_tok);
        for (int j = 0; j < it[i].n_keep; j++)
            keep[src[it[i].off + j]] = 1;
        assert_int_equal(gw_trig_compact_head(&v, it[i].head, it[i].first,
                                              it[i].n, keep, scratch),
                         it[i].n_keep);
    }
    for (size_t i = 0; i < np; i++)
        if (gpool[i] != st_f32_to_bf16(fp[i]))
            fail_msg("pool element %zu: device %04x, host %04x (H_p %d P %d "
                     "d %d)", i, gpool[i], st_f32_to_bf16(fp[i]), Hp, P, d);
    free(scratch);
    free(fp);
    free(gpool);
    free(keep);
    free(src);
    free(it);
    dev_free(&dv);
    world_free(&w);
}

static void test_compact_vs_cpu(void **state)
{
    (void)state;
    run_compact(1, 16, 64, 1, 40);
    run_compact(2, 16, 128, 6, 300);  /* regions over many chunks */
    run_compact(4, 5, 64, 8, 97);     /* odd page size */
    run_compact(8, 32, 256, 3, 200);  /* largest d */
    run_compact(16, 1, 64, 2, 70);    /* one token per page */
}

static void test_compact_faults(void **state)
{
    (void)state;
    const int Hp = 2, P = 8, d = 64, max_tok = 64;
    for (int kind = 0; kind < 3; kind++) {
        struct world w;
        world_make(&w, Hp, P, d, 3, max_tok);
        struct tg_cuda_trig_item it[2] = {
            {.row = 0, .head = 0, .slot = 0, .first = 4, .n = 20, .off = 0,
             .n_keep = 3},
            {.row = 1, .head = 1, .slot = 1, .first = 0, .n = 30, .off = 3,
             .n_keep = 2},
        };
        int32_t src[5] = {1, 5, 9, 2, 29};
        if (kind == 0)
            it[1].row = 3;                 /* row out of range */
        else if (kind == 1)
            it[1].n = max_tok + 1;         /* region past the row's pages */
        else
            src[4] = 2;                    /* survivors not ascending */
        struct dev dv;
        dev_world(&dv, &w);
        dv.items = tt_cuda_upload(it, sizeof(it));
        dv.src = tt_cuda_upload(src, sizeof(src));
        struct tg_cuda_trig_compact_args a = {
            .pg = pages_of(&w, &dv), .items = dv.items, .n_items = 2,
            .src = dv.src, .fault = dv.fault,
        };
        char err[256] = "";
        assert_int_equal(tg_cuda_trig_compact(&a, err, sizeof(err)), 0);
        size_t np = pool_elems(&w);
        uint16_t *gpool = tt_xmalloc(np * 2);
        tt_cuda_to_host(gpool, dv.pool, np * 2);
        assert_int_equal(fault_read(&dv), 1);
        /* The good item ran; the bad one left the pool alone. */
        float *fp = tt_xmalloc(np * sizeof(float));
        for (size_t i = 0; i < np; i++)
            fp[i] = st_bf16_to_f32(w.pool[i]);
        float *scratch = tt_xmalloc((size_t)2 * max_tok * d * sizeof(float));
        const int32_t *gp[1];
        int32_t glen[1], hg[2], hs[2];
        uint8_t keep[64] = {0};
        for (int j = 0; j < 3; j++)
            keep[src[j]] = 1;
        struct tg_kv_rows v = row_view(&w, fp, 0, gp, glen, hg, hs);
        assert_int_equal(gw_trig_compact_head(&v, 0, 4, 20, keep, scratch), 3);
        for (size_t i = 0; i < np; i++)
            if (gpool[i] != st_f32_to_bf16(fp[i]))
                fail_msg("fault kind %d: pool element %zu differs", kind, i);
        free(scratch);
        free(fp);
        free(gpool);
        dev_free(&dv);
        world_free(&w);
    }
}

/* ---- argument errors (no device needed) --------------------------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    uint16_t *fb = (uint16_t *)(uintptr_t)0x1000;
    int32_t *fi = (int32_t *)(uintptr_t)0x3000;
    float *ff = (float *)(uintptr_t)0x5000;
    struct tg_cuda_trig_item *fit = (struct tg_cuda_trig_item *)(uintptr_t)0x7000;
    struct tg_cuda_trig_pages pg = {
        .pool = fb, .n_pages = 10, .heads_per_group = 2, .page_size = 16,
        .head_dim = 128, .indptr = fi, .indices = fi, .n_rows = 4,
    };
    struct tg_cuda_trig_score_args s = {
        .pg = pg, .items = fit, .n_items = 3, .n_q_per_kv = 4,
        .n_q_heads = 8, .n_layers = 2, .re = ff, .im = ff, .abs = ff,
        .inv_freq = ff, .score = ff,
    };
    struct tg_cuda_trig_compact_args c = {
        .pg = pg, .items = fit, .n_items = 3, .src = fi,
    };
    char err[256];
    struct tg_cuda_trig_score_args bs;
    struct tg_cuda_trig_compact_args bc;
#define EXPECT_S(args)                                                      \
    do {                                                                    \
        err[0] = '\0';                                                      \
        assert_int_equal(tg_cuda_trig_score((args), err, sizeof(err)),     \
                         TG_EINVAL);                                        \
        assert_true(strlen(err) > 0);                                       \
    } while (0)
#define EXPECT_C(args)                                                      \
    do {                                                                    \
        err[0] = '\0';                                                      \
        assert_int_equal(tg_cuda_trig_compact((args), err, sizeof(err)),   \
                         TG_EINVAL);                                        \
        assert_true(strlen(err) > 0);                                       \
    } while (0)
    EXPECT_S(NULL);
    bs = s; bs.n_items = -1; EXPECT_S(&bs);
    bs = s; bs.pg.pool = NULL; EXPECT_S(&bs);
    bs = s; bs.pg.head_dim = 7; EXPECT_S(&bs);
    bs = s; bs.pg.head_dim = 258; EXPECT_S(&bs);
    bs = s; bs.pg.page_size = 0; EXPECT_S(&bs);
    bs = s; bs.pg.heads_per_group = 0; EXPECT_S(&bs);
    bs = s; bs.pg.n_rows = 0; EXPECT_S(&bs);
    bs = s; bs.re = NULL; EXPECT_S(&bs);
    bs = s; bs.score = NULL; EXPECT_S(&bs);
    bs = s; bs.inv_freq = NULL; EXPECT_S(&bs);
    bs = s; bs.n_q_per_kv = 17; EXPECT_S(&bs);
    bs = s; bs.n_layers = 0; EXPECT_S(&bs);
    EXPECT_C(NULL);
    bc = c; bc.n_items = -1; EXPECT_C(&bc);
    bc = c; bc.src = NULL; EXPECT_C(&bc);
    bc = c; bc.items = NULL; EXPECT_C(&bc);
    bc = c; bc.pg.indices = NULL; EXPECT_C(&bc);
#undef EXPECT_S
#undef EXPECT_C
    struct tg_cuda_trig_select_args sel = {
        .items = fit, .n_items = 3, .window = 4, .score = ff, .src = fi,
    };
    struct tg_cuda_trig_select_args bl;
    bl = sel; bl.window = -1;
    assert_int_equal(tg_cuda_trig_select(&bl, err, sizeof(err)), TG_EINVAL);
    bl = sel; bl.score = NULL;
    assert_int_equal(tg_cuda_trig_select(&bl, err, sizeof(err)), TG_EINVAL);
    bl = sel; bl.src = NULL;
    assert_int_equal(tg_cuda_trig_select(&bl, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_cuda_trig_select(NULL, err, sizeof(err)), TG_EINVAL);
    bl = sel; bl.n_items = 0; bl.items = NULL;
    assert_int_equal(tg_cuda_trig_select(&bl, NULL, 0), 0);
    /* Empty batches are valid and queue nothing. */
    bs = s;
    bs.n_items = 0;
    bs.items = NULL;
    assert_int_equal(tg_cuda_trig_score(&bs, NULL, 0), 0);
    bc = c;
    bc.n_items = 0;
    bc.items = NULL;
    assert_int_equal(tg_cuda_trig_compact(&bc, NULL, 0), 0);
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    const struct CMUnitTest host_tests[] = {
        cmocka_unit_test(test_bad_arguments),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_score_vs_cpu),
        cmocka_unit_test(test_select_vs_cpu),
        cmocka_unit_test(test_compact_vs_cpu),
        cmocka_unit_test(test_compact_faults),
    };
    return tt_cuda_run_tests("cuda_trig_host", host_tests,
                             sizeof(host_tests) / sizeof(host_tests[0]),
                             "no CUDA device: skipped", "cuda_trig", tests,
                             sizeof(tests) / sizeof(tests[0]));
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
