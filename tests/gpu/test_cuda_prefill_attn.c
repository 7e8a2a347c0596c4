/* test_cuda_prefill_attn.c — prefill-chunk attention on tensor cores
 * (kernels/cuda/prefill_attn.h) against the CPU reference
 * tg_ops_cpu.attn_chunk on the same bf16-rounded q/k/v/pool, with the CPU
 * history view (struct tg_kv_rows) built from the same CSR arrays the
 * device reads.
 *
 * Shapes: d 64/128; G 1/3/4/5/8/16 (5 and 3 split tokens across the
 * 64-row tiles); H_p 1/2/4; P 1/5/16; n 1/17/64/77/130/200; history
 * profiles: none, ragged (groups of 0 tokens, exactly one page, a partial
 * last page, random), single-page groups, long rows (many 64-key tiles,
 * the last partial), rows at and around the 64-key tile size; and
 * per-head lengths (head_lens: a group's heads reading different counts).
 * Page ids are a shuffled subset of a pool with unused pages, and indptr
 * leaves gaps between rows.
 *
 * Tolerance: the output is bf16 and P is rounded to bf16 before the PV
 * product, so the check is, per output row (token, query head),
 * max |gpu - cpu| <= 2e-2 * max |cpu| of that row, with every element
 * finite. A guard region after the output (pre-filled with NaN
 * bits) must stay untouched, which catches writes of padded rows.
 *
 * In a CUDA build the argument checks run first on any machine; the device
 * tests need a GPU, else the program exits 77 (skipped). Without CUDA it
 * exits 77 at once. */
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
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "common/model/st_safetensors.h"
#include "kernels/cuda/prefill_attn.h"
#include "kernels/tg_ops.h"
#endif

#ifdef TANGRAM_CUDA
static char err[256];
static struct tt_xrng rng = {0x853c49e6748fea9bull};

/* ---- host-only checks (no device needed) ---- */

/* Arguments every check must reject before touching the device (the
 * pointers are host dummies that a launch would fault on). */
static void test_bad_arguments(void **state)
{
    (void)state;
    static uint16_t buf[64] __attribute__((aligned(16)));
    static int32_t ibuf[64];
    struct tg_cuda_prefill_attn_args ok = {
        .q = buf, .k = buf, .v = buf, .n = 5, .n_q_heads = 12,
        .n_kv_heads = 4, .head_dim = 128, .pool = buf, .heads_per_group = 2,
        .page_size = 16, .n_groups = 2, .head_group = ibuf,
        .head_slot = ibuf, .indptr = ibuf, .indices = ibuf, .lens = ibuf,
        .scale = 0.088f, .out = buf, .stream = NULL};
    struct tg_cuda_prefill_attn_args a;

    assert_int_equal(tg_cuda_prefill_attn(NULL, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_cuda_prefill_attn(NULL, NULL, 0), TG_EINVAL);
#define REJECT(field, value)                                               \
    do {                                                                   \
        a = ok;                                                            \
        a.field = value;                                                   \
        err[0] = '\0';                                                     \
        assert_int_equal(tg_cuda_prefill_attn(&a, err, sizeof(err)),       \
                         TG_EINVAL);                                       \
        assert_true(strlen(err) > 0);                                      \
    } while (0)
    REJECT(n, -1);
    REJECT(n, 65536);
    REJECT(head_dim, 96);
    assert_non_null(strstr(err, "head_dim 96"));
    REJECT(head_dim, 256);
    REJECT(head_dim, 0);
    REJECT(n_q_heads, 13);     /* G = 3 wanted, Hq not a multiple of Hkv */
    assert_non_null(strstr(err, "Hq 13"));
    REJECT(n_q_heads, 4 * 17); /* G = 17 */
    REJECT(n_q_heads, 0);
    REJECT(n_kv_heads, 0);
    REJECT(n_kv_heads, -4);
    REJECT(n_groups, 3);       /* 3 x 2 != 4 */
    REJECT(n_groups, 0);
    REJECT(heads_per_group, 17);
    REJECT(heads_per_group, 0);
    REJECT(page_size, 0);
    REJECT(page_size, -16);
    REJECT(scale, NAN);
    REJECT(scale, INFINITY);
    REJECT(q, NULL);
    REJECT(k, NULL);
    REJECT(v, NULL);
    REJECT(pool, NULL);
    REJECT(head_group, NULL);
    REJECT(head_slot, NULL);
    REJECT(indptr, NULL);
    REJECT(indices, NULL);
    REJECT(lens, NULL);
    REJECT(out, NULL);
    assert_non_null(strstr(err, "NULL"));
    REJECT(q, buf + 1);        /* misaligned: 16-byte loads */
    assert_non_null(strstr(err, "aligned"));
    REJECT(k, buf + 4);
    REJECT(v, buf + 2);
    REJECT(pool, buf + 1);
    REJECT(out, buf + 3);
#undef REJECT
    /* Shape errors win over n == 0; an empty chunk with valid shapes
     * queues nothing, so even NULL device pointers are fine. */
    a = ok;
    a.n = 0;
    a.head_dim = 96;
    assert_int_equal(tg_cuda_prefill_attn(&a, err, sizeof(err)), TG_EINVAL);
    a = ok;
    a.n = 0;
    a.q = a.k = a.v = a.pool = NULL;
    a.out = NULL;
    assert_int_equal(tg_cuda_prefill_attn(&a, err, sizeof(err)), 0);
    /* Supported edge values pass the checks (n = 0 keeps the device out). */
    a.n_q_heads = 64; /* G = 16 */
    a.head_dim = 64;
    assert_int_equal(tg_cuda_prefill_attn(&a, err, sizeof(err)), 0);
    a.heads_per_group = 1;
    a.n_groups = 4;
    a.page_size = 1;
    assert_int_equal(tg_cuda_prefill_attn(&a, err, sizeof(err)), 0);
}

/* ---- device tests ---- */

enum hist_mode {
    HIST_NONE = 0,   /* every group empty */
    HIST_RAGGED = 1, /* 0 tokens, exactly one page, partial last page, random */
    HIST_SINGLE = 2, /* one page or less per group */
    HIST_LONG = 3,   /* random lengths in hist_max/2 .. hist_max */
    HIST_TILES = 4,  /* 64, 128, 65, 63 tokens: at and around the key tile */
};

struct pcase {
    int hp, d, g, page, n_groups, n;
    enum hist_mode mode;
    int hist_max;   /* longest history row (HIST_RAGGED / HIST_LONG) */
    int use_stream; /* run on a created stream instead of the default */
    int per_head;   /* heads of a group hold different counts (head_lens):
                       each head's random count in 0 .. its row's, with
                       the row's longest head at the row's length */
};

static void run_case(const struct pcase *c)
{
    const int Hp = c->hp, d = c->d, G = c->g, P = c->page, n = c->n;
    const int NG = c->n_groups, Hkv = NG * Hp, Hq = Hkv * G;
    const float scale = 1.0f / sqrtf((float)d);

    /* History lengths per group. */
    int32_t *lens = malloc((size_t)NG * sizeof(int32_t));
    int32_t *indptr = malloc((size_t)(NG + 1) * sizeof(int32_t));
    assert_non_null(lens);
    assert_non_null(indptr);
    const int shift = tt_xrng_int(&rng, 0, 3);
    for (int g = 0; g < NG; g++) {
        switch (c->mode) {
        case HIST_NONE:
            lens[g] = 0;
            break;
        case HIST_RAGGED: {
            int e = (g + shift) % 4;
            lens[g] = e == 0 ? 0
                      : e == 1 ? P
                      : e == 2 ? 2 * P +
                                     (P > 1 ? tt_xrng_int(&rng, 1, P - 1) : 1)
                               : tt_xrng_int(&rng, 0, c->hist_max);
            break;
        }
        case HIST_SINGLE:
            lens[g] = tt_xrng_int(&rng, 1, P);
            break;
        case HIST_LONG:
            lens[g] = tt_xrng_int(&rng, c->hist_max / 2, c->hist_max);
            break;
        default: {
            static const int at_tile[4] = {64, 128, 65, 63};
            lens[g] = at_tile[g % 4];
            break;
        }
        }
    }
    /* Pages: a shuffled pool with unused pages; rows take ids in turn and
     * indptr leaves gaps (slack slots the kernel must never read). */
    int64_t need = 0;
    for (int g = 0; g < NG; g++)
        need += (lens[g] + P - 1) / P;
    const int64_t n_pages = need + tt_xrng_int(&rng, 1, 6);
    int32_t *perm = malloc((size_t)n_pages * sizeof(int32_t));
    int32_t *indices = malloc((size_t)(need + 3 * NG + 1) * sizeof(int32_t));
    assert_non_null(perm);
    assert_non_null(indices);
    tt_xrng_perm(&rng, perm, n_pages);
    int64_t used = 0;
    indptr[0] = 0;
    for (int g = 0; g < NG; g++) {
        int np = (lens[g] + P - 1) / P, slack = tt_xrng_int(&rng, 0, 3);
        for (int i = 0; i < np; i++)
            indices[indptr[g] + i] = perm[used++];
        for (int i = 0; i < slack; i++) /* out-of-pool ids: must stay unread */
            indices[indptr[g] + np + i] = INT32_MAX;
        indptr[g + 1] = indptr[g] + np + slack;
    }
    const int32_t n_slots = indptr[NG] > 0 ? indptr[NG] : 1;
    if (indptr[NG] == 0)
        indices[0] = INT32_MAX;
    /* KV heads to (group, slot) by a random permutation. */
    int32_t *hg = tt_xmalloc((size_t)Hkv * sizeof(int32_t));
    int32_t *hs = tt_xmalloc((size_t)Hkv * sizeof(int32_t));
    tt_heads_gather(&rng, Hkv, Hp, hg, hs);
    /* Per-head counts: one head of each group keeps the row's length (a
     * row is as long as its longest head), the others any count up to it. */
    int32_t *hl = NULL;
    if (c->per_head) {
        hl = tt_xmalloc((size_t)Hkv * sizeof(int32_t));
        for (int h = 0; h < Hkv; h++)
            hl[h] = tt_xrng_int(&rng, 0, lens[hg[h]]);
        for (int g = 0; g < NG; g++)
            for (int h = 0; h < Hkv; h++)
                if (hg[h] == g) {
                    hl[h] = lens[g];
                    break;
                }
    }

    const size_t pool_n = (size_t)n_pages * Hp * 2 * P * d;
    const size_t q_n = (size_t)n * Hq * d, kv_n = (size_t)n * Hkv * d;
    uint16_t *pool16 = malloc(pool_n * sizeof(uint16_t));
    float *pool32 = malloc(pool_n * sizeof(float));
    uint16_t *q16 = malloc(q_n * sizeof(uint16_t));
    float *q32 = malloc(q_n * sizeof(float));
    uint16_t *k16 = malloc(kv_n * sizeof(uint16_t));
    float *k32 = malloc(kv_n * sizeof(float));
    uint16_t *v16 = malloc(kv_n * sizeof(uint16_t));
    float *v32 = malloc(kv_n * sizeof(float));
    assert_true(pool16 && pool32 && q16 && q32 && k16 && k32 && v16 && v32);
    tt_fill_bf16(&rng, pool16, pool32, pool_n, -1.0f, 1.0f);
    tt_fill_bf16(&rng, q16, q32, q_n, -3.0f, 3.0f);
    tt_fill_bf16(&rng, k16, k32, kv_n, -1.0f, 1.0f);
    tt_fill_bf16(&rng, v16, v32, kv_n, -1.0f, 1.0f);

    /* CPU reference on the same CSR data. */
    const int32_t **gp = calloc((size_t)NG, sizeof(*gp));
    float *ref = malloc(q_n * sizeof(float));
    assert_non_null(gp);
    assert_non_null(ref);
    for (int g = 0; g < NG; g++)
        gp[g] = indices + indptr[g];
    struct tg_kv_rows kr = {
        .pool = pool32, .heads_per_group = Hp, .page_size = P,
        .head_dim = d, .n_kv_heads = Hkv, .head_group = hg,
        .head_slot = hs, .group_pages = gp, .group_len = lens,
        .head_len = hl};
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    assert_int_equal(tg_ops_cpu.attn_chunk(cpu, q32, k32, v32, n, Hq, &kr,
                                           scale, ref), 0);
    tg_backend_cpu_free(cpu);

    /* Device copies; the output has a NaN-filled guard tail. */
    const size_t guard = 4096;
    uint16_t *d_pool = tt_cuda_upload(pool16, pool_n * sizeof(uint16_t));
    uint16_t *d_q = tt_cuda_upload(q16, q_n * sizeof(uint16_t));
    uint16_t *d_k = tt_cuda_upload(k16, kv_n * sizeof(uint16_t));
    uint16_t *d_v = tt_cuda_upload(v16, kv_n * sizeof(uint16_t));
    int32_t *d_indptr = tt_cuda_upload(indptr, (size_t)NG * sizeof(int32_t));
    int32_t *d_indices =
        tt_cuda_upload(indices, (size_t)n_slots * sizeof(int32_t));
    int32_t *d_lens = tt_cuda_upload(lens, (size_t)NG * sizeof(int32_t));
    int32_t *d_hg = tt_cuda_upload(hg, (size_t)Hkv * sizeof(int32_t));
    int32_t *d_hs = tt_cuda_upload(hs, (size_t)Hkv * sizeof(int32_t));
    int32_t *d_hl = hl != NULL
                        ? tt_cuda_upload(hl, (size_t)Hkv * sizeof(int32_t))
                        : NULL;
    uint16_t *d_out = NULL;
    const size_t out_bytes = (q_n + guard) * sizeof(uint16_t);
    assert_int_equal(cudaMalloc((void **)&d_out, out_bytes), cudaSuccess);
    assert_int_equal(cudaMemset(d_out, 0xff, out_bytes), cudaSuccess);
    cudaStream_t st = NULL;
    if (c->use_stream)
        assert_int_equal(cudaStreamCreate(&st), cudaSuccess);

    struct tg_cuda_prefill_attn_args a = {
        .q = d_q, .k = d_k, .v = d_v, .n = n, .n_q_heads = Hq,
        .n_kv_heads = Hkv, .head_dim = d, .pool = d_pool,
        .heads_per_group = Hp, .page_size = P, .n_groups = NG,
        .head_group = d_hg, .head_slot = d_hs, .indptr = d_indptr,
        .indices = d_indices, .lens = d_lens, .head_lens = d_hl,
        .scale = scale, .out = d_out, .stream = st};
    int rc = tg_cuda_prefill_attn(&a, err, sizeof(err));
    if (rc != 0)
        fail_msg("prefill_attn: %s", err);
    if (st != NULL)
        assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    uint16_t *out16 = malloc(q_n * sizeof(uint16_t) + guard * sizeof(uint16_t));
    assert_non_null(out16);
    assert_int_equal(cudaMemcpy(out16, d_out, out_bytes,
                                cudaMemcpyDeviceToHost), cudaSuccess);

    /* Per output row (token, query head): max |gpu - cpu| <= 2e-2 x the
     * row's max |cpu|. A bound relative to the whole output's max would let
     * errors in rows with small outputs (long histories average many value
     * rows) go unseen; an fp32 emulation of the kernel's rounding (bf16 P
     * per 64-key tile, bf16 output) stays below 6e-3 of the row max. */
    double worst = 0.0, worst_tol = 0.0;
    size_t worst_i = 0;
    int failed = 0; /* the first row over its bound is reported */
    for (size_t row = 0; row < (size_t)n * Hq; row++) {
        double row_max = 0.0, row_err = 0.0;
        size_t row_i = row * (size_t)d;
        for (size_t e = 0; e < (size_t)d; e++) {
            size_t i = row * (size_t)d + e;
            double gv = (double)st_bf16_to_f32(out16[i]);
            double er = isfinite(gv) ? fabs(gv - (double)ref[i]) : INFINITY;
            row_max = fmax(row_max, fabs((double)ref[i]));
            if (er > row_err) {
                row_err = er;
                row_i = i;
            }
        }
        const double tol = 2e-2 * row_max;
        if (!failed && !(row_err <= tol)) {
            failed = 1;
            worst = row_err;
            worst_tol = tol;
            worst_i = row_i;
        }
    }
    for (size_t i = 0; i < guard; i++)
        if (out16[q_n + i] != 0xffffu)
            fail_msg("Hp %d d %d G %d P %d n %d: guard element %zu written",
                     Hp, d, G, P, n, i);
    if (failed) {
        size_t row = worst_i / (size_t)d;
        fail_msg("Hp %d d %d G %d P %d groups %d n %d hist mode %d: |err| "
                 "%g > %g (2e-2 x the row's max |out|) at token %zu head %zu "
                 "elem %zu: gpu %g cpu %g", Hp, d, G, P, NG, n, (int)c->mode,
                 worst, worst_tol, row / (size_t)Hq, row % (size_t)Hq,
                 worst_i % (size_t)d, (double)st_bf16_to_f32(out16[worst_i]),
                 (double)ref[worst_i]);
    }

    if (st != NULL)
        cudaStreamDestroy(st);
    cudaFree(d_out);
    cudaFree(d_pool);
    cudaFree(d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_indptr);
    cudaFree(d_indices);
    cudaFree(d_lens);
    cudaFree(d_hg);
    cudaFree(d_hs);
    cudaFree(d_hl);
    free(hl);
    free(out16);
    free(gp);
    free(ref);
    free(pool16);
    free(pool32);
    free(q16);
    free(q32);
    free(k16);
    free(k32);
    free(v16);
    free(v32);
    free(hg);
    free(hs);
    free(perm);
    free(indices);
    free(lens);
    free(indptr);
}

/* The sweep of the brief: d x G x H_p, with n, P and the history profile
 * rotating so each value meets several others. */
static void test_matches_cpu(void **state)
{
    (void)state;
    static const int ds[] = {64, 128}, gs[] = {1, 4, 8}, hps[] = {1, 2, 4};
    static const int ns[] = {1, 17, 64, 200}, pages[] = {16, 1};
    static const enum hist_mode modes[] = {HIST_NONE, HIST_RAGGED,
                                           HIST_SINGLE, HIST_RAGGED};
    int idx = 0;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++, idx++) {
                int P = pages[(idx / 4) % 2];
                struct pcase k = {hps[c], ds[a], gs[b], P,
                                  hps[c] == 4 ? tt_xrng_int(&rng, 1, 2)
                                              : tt_xrng_int(&rng, 1, 4),
                                  ns[idx % 4], modes[(idx + idx / 4) % 4],
                                  P == 1 ? 70 : 300, idx % 5 == 0, 0};
                run_case(&k);
            }
}

static void test_edge_shapes(void **state)
{
    (void)state;
    const struct pcase cases[] = {
        /* hp d g P groups n mode hist_max stream per_head */
        {1, 128, 16, 16, 2, 70, HIST_RAGGED, 200, 0, 0}, /* largest G */
        {2, 64, 16, 1, 2, 33, HIST_RAGGED, 70, 0, 0},    /* largest G, d 64 */
        {2, 64, 5, 16, 2, 77, HIST_RAGGED, 150, 0, 0},   /* tokens split tiles */
        {2, 128, 3, 5, 2, 50, HIST_LONG, 180, 1, 0},     /* odd G, odd P */
        {2, 128, 4, 16, 2, 33, HIST_LONG, 2000, 0, 0},   /* many history tiles */
        {1, 64, 1, 16, 1, 1, HIST_NONE, 0, 0, 0},        /* one query, no keys */
        {1, 64, 1, 16, 1, 1, HIST_LONG, 130, 0, 0},      /* one query, history */
        {4, 64, 1, 16, 1, 130, HIST_NONE, 0, 1, 0},      /* causal only, 3 tiles */
        {2, 128, 8, 1, 2, 64, HIST_SINGLE, 1, 0, 0},     /* P = 1, one token */
        {1, 128, 2, 16, 4, 200, HIST_TILES, 0, 0, 0},    /* lens at tile size */
        {2, 64, 4, 5, 2, 64, HIST_TILES, 0, 0, 0},
        {4, 128, 8, 16, 2, 17, HIST_LONG, 64, 1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i]);
}

/* Per-head lengths (adaptive budgets, compacted decode regions): every
 * head reads only its own first head_lens[h] tokens, against the CPU
 * reference's tg_kv_rows.head_len. */
static void test_per_head_lengths(void **state)
{
    (void)state;
    const struct pcase cases[] = {
        /* hp d g P groups n mode hist_max stream per_head */
        {2, 128, 4, 16, 2, 33, HIST_LONG, 300, 0, 1},
        {4, 64, 2, 16, 2, 64, HIST_RAGGED, 200, 1, 1},
        {2, 128, 8, 5, 2, 17, HIST_TILES, 0, 0, 1},
        {1, 128, 4, 16, 4, 130, HIST_LONG, 2000, 0, 1}, /* H_p 1: rows */
        {4, 128, 1, 1, 1, 70, HIST_LONG, 90, 0, 1},     /* P = 1 */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i]);
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    const struct CMUnitTest host_tests[] = {
        cmocka_unit_test(test_bad_arguments),
    };
    const struct CMUnitTest dev_tests[] = {
        cmocka_unit_test(test_matches_cpu),
        cmocka_unit_test(test_edge_shapes),
        cmocka_unit_test(test_per_head_lengths),
    };
    return tt_cuda_run_tests("host", host_tests, TT_COUNT(host_tests),
                             "no CUDA device: device tests skipped",
                             "device", dev_tests, TT_COUNT(dev_tests));
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
