/* test_cuda_decode_attn.c — split-map decode attention (kernels/cuda/
 * decode_attn.h) against the CPU reference tg_ops_cpu.attn_decode on the
 * same bf16-rounded data: random ragged rows (>= 1 token each), H_p 1/2/4,
 * d 64/128, G 1/4/5/8/16, P 16 (and an odd P), shuffled page ids, a
 * two-layer table read at layer 1, split maps with S in 1..8 including
 * splits beyond a row's page count (whose partials must be neutral:
 * m = -inf, l = 0), the no-split and uniform maps, bf16 and fp32 output
 * (checked per row relative to the row's largest value), P = 1, H_p = 16,
 * G = 2, and one capture of the entry into a CUDA graph whose replay must
 * match the eager run bit for bit.
 *
 * In a CUDA build the host-side checks (argument validation, split-map
 * validation, the uniform heuristic) run first on any machine; the device
 * tests then need a GPU, else the program exits 77 (skipped). Without
 * CUDA it exits 77 at once. */
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
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/decode_attn.h"
#include "kernels/tg_ops.h"
#endif

#ifdef TANGRAM_CUDA
static char err[256];
static struct tt_xrng rng = {0x9e3779b97f4a7c15ull};

/* ---- host-only checks (no device needed) ---- */

static void test_uniform_splits(void **state)
{
    (void)state;
    int s[8];
    /* Enough CTAs without splitting: 1. */
    assert_int_equal(tg_cuda_decode_uniform_splits(64, 4, 100000, 16, 200, s),
                     1);
    /* One CTA, 1000 pages, 100 slots: e(S) = S/100 peaks at S = 100; the
     * smallest S with e >= 0.85 that changes ceil(1000/S) is 91 (84..90
     * all leave 12 pages per split). */
    assert_int_equal(tg_cuda_decode_uniform_splits(1, 1, 16000, 16, 100, s),
                     91);
    /* Capped by the pages of the longest row. */
    assert_int_equal(tg_cuda_decode_uniform_splits(1, 2, 40, 16, 132, s), 3);
    assert_int_equal(s[0], 3);
    assert_int_equal(s[1], 3);
    /* Capped at 128 and by the slot count. */
    int r = tg_cuda_decode_uniform_splits(1, 1, 1 << 24, 16, 1000, s);
    assert_true(r >= 1 && r <= 128);
    r = tg_cuda_decode_uniform_splits(2, 8, 1 << 20, 16, 132, s);
    assert_true(r >= 1 && r <= 132);
    for (int g = 1; g < 8; g++)
        assert_int_equal(s[g], s[0]);
    assert_int_equal(tg_cuda_decode_uniform_splits(0, 1, 10, 16, 10, s),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_decode_uniform_splits(1, 1, 0, 16, 10, s),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_decode_uniform_splits(1, 1, 10, 0, 10, s),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_decode_uniform_splits(1, 1, 10, 16, 0, s),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_decode_uniform_splits(1, 1, 10, 16, 10, NULL),
                     TG_EINVAL);
}

static void test_split_map_rejects(void **state)
{
    (void)state;
    struct tg_cuda_split_map m;
    int bad[4] = {1, 2, 0, 3};
    assert_int_equal(tg_cuda_split_map_init(&m, bad, 2, 2, err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, "S[1][0]"));
    assert_null(m.offsets);
    assert_null(m.total);
    int neg[2] = {-1, 1};
    assert_int_equal(tg_cuda_split_map_init(&m, neg, 1, 2, err, sizeof(err)),
                     TG_EINVAL);
    int huge[2] = {1 << 20, 1};
    assert_int_equal(tg_cuda_split_map_init(&m, huge, 1, 2, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_split_map_init(&m, NULL, 1, 2, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_split_map_init(&m, bad, 0, 2, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_split_map_init(NULL, bad, 1, 2, err,
                                            sizeof(err)), TG_EINVAL);
    tg_cuda_split_map_free(&m); /* zeroed: safe */
    tg_cuda_split_map_free(NULL);
    assert_int_equal(tg_cuda_decode_attn_ws_bytes(3, 8, 128, 1), 0);
    assert_int_equal(tg_cuda_decode_attn_ws_bytes(3, 8, 128, 4),
                     (size_t)3 * 8 * 4 * 130 * sizeof(float));

    struct tg_cuda_kv_table_dev dt;
    tg_cuda_kv_table_dev_init(&dt);
    struct tg_cuda_kv_csr csr;
    assert_int_equal(tg_cuda_decode_csr_layer(&csr, &dt, 2, 2, 0, err,
                                              sizeof(err)), TG_EINVAL);
    int32_t dummy[8];
    dt.indptr = dummy; /* pretend an upload of 12 rows */
    dt.n_rows = 12;
    assert_int_equal(tg_cuda_decode_csr_layer(&csr, &dt, 2, 2, 2, err,
                                              sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_cuda_decode_csr_layer(&csr, &dt, 5, 2, 0, err,
                                              sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_cuda_decode_csr_layer(&csr, &dt, 3, 2, 1, err,
                                              sizeof(err)), 0);
    assert_int_equal(csr.row_stride, 6);
    assert_int_equal(csr.row_offset, 2);
    assert_int_equal(csr.n_rows, 12);
}

/* Arguments that every check must reject before touching the device (the
 * pointers are host dummies that a launch would fault on). */
static void test_bad_arguments(void **state)
{
    (void)state;
    static uint16_t buf[64] __attribute__((aligned(16)));
    static int32_t ibuf[64];
    static float fbuf[64];
    int32_t total = 4, mx = 3;
    struct tg_cuda_split_map sm = {ibuf, &total, &mx, 1, 2};
    struct tg_cuda_decode_attn_args ok = {
        .q = buf, .pool = buf, .n_seq = 2, .n_q_heads = 16, .n_kv_heads = 4,
        .n_groups = 2, .heads_per_group = 2, .page_size = 16, .head_dim = 128,
        .head_group = ibuf, .head_slot = ibuf,
        .table = {ibuf, ibuf, ibuf, 4, 2, 0},
        .splits = &sm, .layer = 0, .scale = 0.1f, .ws = fbuf,
        .ws_bytes = (size_t)1 << 40, .out = fbuf,
        .out_dtype = TG_CUDA_DECODE_OUT_F32, .stream = NULL};
    struct tg_cuda_decode_attn_args a;

    assert_int_equal(tg_cuda_decode_attn(NULL, err, sizeof(err)), TG_EINVAL);
#define REJECT(field, value)                                               \
    do {                                                                   \
        a = ok;                                                            \
        a.field = value;                                                   \
        assert_int_equal(tg_cuda_decode_attn(&a, err, sizeof(err)),        \
                         TG_EINVAL);                                       \
    } while (0)
    REJECT(n_seq, -1);
    REJECT(head_dim, 96);
    REJECT(head_dim, 256);
    REJECT(n_q_heads, 18);     /* not a multiple of Hkv */
    REJECT(n_q_heads, 4 * 17); /* G = 17 */
    REJECT(n_kv_heads, 0);
    REJECT(n_groups, 3);       /* 3 x 2 != 4 */
    REJECT(heads_per_group, 17);
    REJECT(page_size, 0);
    REJECT(scale, NAN);
    REJECT(out_dtype, (enum tg_cuda_decode_out_dtype)7);
    REJECT(layer, 1);
    REJECT(layer, -1);
    REJECT(splits, NULL);
    REJECT(q, NULL);
    REJECT(pool, NULL);
    REJECT(pool, buf + 1);     /* misaligned */
    REJECT(head_group, NULL);
    REJECT(head_slot, NULL);
    REJECT(table.indptr, NULL);
    REJECT(table.lens, NULL);
    REJECT(out, NULL);
    REJECT(table.n_rows, 3);   /* 2 sequences x 2 groups need 4 rows */
    REJECT(table.row_stride, 1);
    REJECT(table.row_offset, 1);
    REJECT(ws, NULL);          /* max split 3 needs a workspace */
    REJECT(ws_bytes, 100);
    a = ok;
    a.ws_bytes = tg_cuda_decode_attn_ws_bytes(2, 16, 128, 3) - 1;
    assert_int_equal(tg_cuda_decode_attn(&a, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "workspace"));
    sm.n_groups = 4;
    a = ok;
    assert_int_equal(tg_cuda_decode_attn(&a, err, sizeof(err)), TG_EINVAL);
    sm.n_groups = 2;
    /* An empty batch is fine and launches nothing. */
    a = ok;
    a.n_seq = 0;
    a.q = NULL;
    assert_int_equal(tg_cuda_decode_attn(&a, err, sizeof(err)), 0);
#undef REJECT
}

/* ---- device tests ---- */

struct dcase {
    int hp, d, g, page, n_groups, n_seq;
    int max_len;      /* lens drawn in 1..max_len (plus fixed edge values) */
    int split_max;    /* S[g] drawn in 1..split_max */
    int per_head;     /* heads hold their own counts (1..their row's) */
};

/* One random problem checked against the CPU for three split maps
 * (random, none, uniform) and both output dtypes. */
static void run_case(const struct dcase *c)
{
    const int Hp = c->hp, d = c->d, G = c->g, P = c->page;
    const int NG = c->n_groups, Hkv = NG * Hp, Hq = Hkv * G, NS = c->n_seq;
    const int L = 2, layer = 1; /* rows of layer 0 exist but are not read */
    const int rows = NS * L * NG;
    const float scale = 1.0f / sqrtf((float)d);

    int32_t *lens = malloc((size_t)rows * sizeof(int32_t));
    int32_t *indptr = malloc((size_t)(rows + 1) * sizeof(int32_t));
    assert_non_null(lens);
    assert_non_null(indptr);
    static const int edge[] = {1, 2, 15, 16, 17, 32, 33};
    int64_t n_pages = 0;
    indptr[0] = 0;
    for (int r = 0; r < rows; r++) {
        int e = tt_xrng_int(&rng, 0, 9);
        /* max_len 1: every row one token (the edge values would not be) */
        lens[r] = c->max_len == 1 ? 1
                  : e < 7         ? edge[e]
                                  : tt_xrng_int(&rng, 1, c->max_len);
        int np = (lens[r] + P - 1) / P;
        int slack = tt_xrng_int(&rng, 0, 2); /* padded-table gaps, never read */
        indptr[r + 1] = indptr[r] + np + slack;
        n_pages += np + slack;
    }
    /* Shuffled page ids: a random permutation of the pool. */
    int32_t *indices = malloc((size_t)n_pages * sizeof(int32_t));
    assert_non_null(indices);
    tt_xrng_perm(&rng, indices, n_pages);
    /* Heads to (group, slot) by a random permutation. */
    int32_t *hg = tt_xmalloc((size_t)Hkv * sizeof(int32_t));
    int32_t *hs = tt_xmalloc((size_t)Hkv * sizeof(int32_t));
    tt_heads_gather(&rng, Hkv, Hp, hg, hs);
    /* bf16 data and its exact fp32 image for the CPU. */
    const size_t pool_n = (size_t)n_pages * Hp * 2 * P * d;
    const size_t q_n = (size_t)NS * Hq * d;
    uint16_t *pool16 = malloc(pool_n * sizeof(uint16_t));
    float *pool32 = malloc(pool_n * sizeof(float));
    uint16_t *q16 = malloc(q_n * sizeof(uint16_t));
    float *q32 = malloc(q_n * sizeof(float));
    assert_non_null(pool16);
    assert_non_null(pool32);
    assert_non_null(q16);
    assert_non_null(q32);
    tt_fill_bf16(&rng, pool16, pool32, pool_n, -1.0f, 1.0f);
    tt_fill_bf16(&rng, q16, q32, q_n, -3.0f, 3.0f);

    /* Per-head lengths (L * Hkv per sequence, as the worker keeps them):
     * each head of a row holds 1..the row's tokens, one head exactly the
     * row's (a row is as long as its longest head). */
    int32_t *hl = NULL;
    if (c->per_head) {
        hl = tt_xmalloc((size_t)NS * L * Hkv * sizeof(int32_t));
        for (int s = 0; s < NS; s++)
            for (int l = 0; l < L; l++) {
                for (int h = 0; h < Hkv; h++)
                    hl[(s * L + l) * Hkv + h] =
                        tt_xrng_int(&rng, 1, lens[(s * L + l) * NG + hg[h]]);
                for (int g = 0; g < NG; g++)
                    for (int h = 0; h < Hkv; h++)
                        if (hg[h] == g) {
                            hl[(s * L + l) * Hkv + h] = lens[(s * L + l) * NG + g];
                            break;
                        }
            }
    }

    /* CPU reference over layer 1's rows. */
    struct tg_kv_rows *kr = calloc((size_t)NS, sizeof(*kr));
    const int32_t **gp = calloc((size_t)NS * NG, sizeof(*gp));
    int32_t *gl = malloc((size_t)NS * NG * sizeof(int32_t));
    float *ref = malloc(q_n * sizeof(float));
    assert_non_null(kr);
    assert_non_null(gp);
    assert_non_null(gl);
    assert_non_null(ref);
    for (int s = 0; s < NS; s++) {
        for (int g = 0; g < NG; g++) {
            int r = (s * L + layer) * NG + g;
            gp[s * NG + g] = indices + indptr[r];
            gl[s * NG + g] = lens[r];
        }
        kr[s] = (struct tg_kv_rows){
            .pool = pool32, .heads_per_group = Hp, .page_size = P,
            .head_dim = d, .n_kv_heads = Hkv, .head_group = hg,
            .head_slot = hs, .group_pages = gp + s * NG,
            .group_len = gl + s * NG,
            .head_len = hl != NULL ? hl + (s * L + layer) * Hkv : NULL};
    }
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(1, &cpu), 0);
    assert_int_equal(tg_ops_cpu.attn_decode(cpu, q32, NS, Hq, kr, scale, ref),
                     0);
    tg_backend_cpu_free(cpu);

    /* Device copies. */
    uint16_t *d_pool = tt_cuda_upload(pool16, pool_n * sizeof(uint16_t));
    uint16_t *d_q = tt_cuda_upload(q16, q_n * sizeof(uint16_t));
    int32_t *d_indptr =
        tt_cuda_upload(indptr, (size_t)(rows + 1) * sizeof(int32_t));
    int32_t *d_indices =
        tt_cuda_upload(indices, (size_t)n_pages * sizeof(int32_t));
    int32_t *d_lens = tt_cuda_upload(lens, (size_t)rows * sizeof(int32_t));
    int32_t *d_hg = tt_cuda_upload(hg, (size_t)Hkv * sizeof(int32_t));
    int32_t *d_hs = tt_cuda_upload(hs, (size_t)Hkv * sizeof(int32_t));
    int32_t *d_hl = hl != NULL ? tt_cuda_upload(hl, (size_t)NS * L * Hkv *
                                                        sizeof(int32_t))
                               : NULL;
    float *out32 = malloc(q_n * sizeof(float));
    uint16_t *out16 = malloc(q_n * sizeof(uint16_t));
    assert_non_null(out32);
    assert_non_null(out16);
    void *d_out = NULL;
    assert_int_equal(cudaMalloc(&d_out, q_n * sizeof(float)), cudaSuccess);

    int split[2 * 64];
    for (int variant = 0; variant < 3; variant++) {
        /* Layer 0 of the map gets junk so the layer index matters. */
        for (int g = 0; g < NG; g++)
            split[g] = tt_xrng_int(&rng, 1, 8);
        int *s1 = split + NG;
        if (variant == 0) {
            for (int g = 0; g < NG; g++)
                s1[g] = tt_xrng_int(&rng, 1, c->split_max);
        } else if (variant == 1) {
            for (int g = 0; g < NG; g++)
                s1[g] = 1;
        } else {
            int maxlen = 1;
            for (int r = 0; r < rows; r++)
                maxlen = lens[r] > maxlen ? lens[r] : maxlen;
            assert_true(tg_cuda_decode_uniform_splits(NS, NG, maxlen, P, 132,
                                                      s1) >= 1);
        }
        struct tg_cuda_split_map sm;
        assert_int_equal(tg_cuda_split_map_init(&sm, split, L, NG, err,
                                                sizeof(err)), 0);
        int max_s = sm.max[layer];
        size_t ws_bytes = tg_cuda_decode_attn_ws_bytes(NS, Hq, d, max_s);
        float *d_ws = NULL;
        if (ws_bytes > 0)
            assert_int_equal(cudaMalloc((void **)&d_ws, ws_bytes), cudaSuccess);
        struct tg_cuda_decode_attn_args a = {
            .q = d_q, .pool = d_pool, .n_seq = NS, .n_q_heads = Hq,
            .n_kv_heads = Hkv, .n_groups = NG, .heads_per_group = Hp,
            .page_size = P, .head_dim = d, .head_group = d_hg,
            .head_slot = d_hs,
            .table = {d_indptr, d_indices, d_lens, rows, L * NG, layer * NG,
                      d_hl, L * Hkv, layer * Hkv},
            .splits = &sm, .layer = layer, .scale = scale, .ws = d_ws,
            .ws_bytes = ws_bytes, .out = d_out,
            .out_dtype = TG_CUDA_DECODE_OUT_F32, .stream = NULL};
        for (int dt = 0; dt < 2; dt++) {
            a.out_dtype = dt == 0 ? TG_CUDA_DECODE_OUT_F32
                                  : TG_CUDA_DECODE_OUT_BF16;
            assert_int_equal(cudaMemset(d_out, 0xff, q_n * sizeof(float)),
                             cudaSuccess);
            int rc = tg_cuda_decode_attn(&a, err, sizeof(err));
            if (rc != 0)
                fail_msg("decode_attn: %s", err);
            assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
            if (dt == 0) {
                assert_int_equal(cudaMemcpy(out32, d_out, q_n * sizeof(float),
                                            cudaMemcpyDeviceToHost),
                                 cudaSuccess);
            } else {
                assert_int_equal(cudaMemcpy(out16, d_out,
                                            q_n * sizeof(uint16_t),
                                            cudaMemcpyDeviceToHost),
                                 cudaSuccess);
                for (size_t i = 0; i < q_n; i++)
                    out32[i] = st_bf16_to_f32(out16[i]);
            }
            /* Per (sequence, query head) row, relative to the row's largest
             * |ref|: outputs of long rows are small (~1/sqrt(len)), so an
             * absolute bound would let a token lost or doubled at a split
             * boundary through (one token of 300 moves the row by ~7e-4).
             * f32: fp32 rounding only; bf16: plus the output rounding
             * (<= 2^-9 relative). */
            const double rel = dt == 0 ? 1e-3 : 5e-3;
            for (size_t row = 0; row < (size_t)NS * Hq; row++) {
                double rmax = 0.0, worst = 0.0;
                for (int e = 0; e < d; e++)
                    rmax = fmax(rmax, fabs((double)ref[row * d + e]));
                for (int e = 0; e < d; e++) {
                    double x = fabs((double)out32[row * d + e] -
                                    (double)ref[row * d + e]);
                    if (!(x <= worst)) /* also catches NaN */
                        worst = isnan(x) ? INFINITY : x;
                }
                double tol = rel * rmax + 1e-6;
                if (!(worst <= tol))
                    fail_msg("Hp %d d %d G %d P %d groups %d seqs %d map %d "
                             "out %s: row %zu (seq %zu, head %zu) max |err| "
                             "%g > %g (row max %g)", Hp, d, G, P, NG, NS,
                             variant, dt == 0 ? "f32" : "bf16", row,
                             row / (size_t)Hq, row % (size_t)Hq, worst, tol,
                             rmax);
            }
        }
        /* The entry is on the decode step path, which is captured into a
         * CUDA graph: it must capture (no allocation, synchronisation or
         * host read of device data) and replay to the same bits. */
        if (variant == 0) {
            cudaStream_t cs = NULL;
            cudaGraph_t graph = NULL;
            cudaGraphExec_t exec = NULL;
            assert_int_equal(cudaStreamCreateWithFlags(&cs,
                                                       cudaStreamNonBlocking),
                             cudaSuccess);
            a.out_dtype = TG_CUDA_DECODE_OUT_F32;
            a.stream = cs;
            /* On cs: a non-blocking stream is not ordered after the
             * legacy default stream. */
            assert_int_equal(cudaMemsetAsync(d_out, 0xff, q_n * sizeof(float),
                                             cs),
                             cudaSuccess);
            assert_int_equal(cudaStreamBeginCapture(
                                 cs, cudaStreamCaptureModeThreadLocal),
                             cudaSuccess);
            int rc = tg_cuda_decode_attn(&a, err, sizeof(err));
            assert_int_equal(cudaStreamEndCapture(cs, &graph), cudaSuccess);
            if (rc != 0)
                fail_msg("decode_attn under capture: %s", err);
            assert_int_equal(cudaGraphInstantiate(&exec, graph, 0),
                             cudaSuccess);
            assert_int_equal(cudaGraphLaunch(exec, cs), cudaSuccess);
            assert_int_equal(cudaStreamSynchronize(cs), cudaSuccess);
            float *gout = malloc(q_n * sizeof(float));
            assert_non_null(gout);
            assert_int_equal(cudaMemcpy(gout, d_out, q_n * sizeof(float),
                                        cudaMemcpyDeviceToHost),
                             cudaSuccess);
            /* out32 holds the eager f32 run only after dt == 0; redo it. */
            a.stream = NULL;
            assert_int_equal(tg_cuda_decode_attn(&a, err, sizeof(err)), 0);
            assert_int_equal(cudaMemcpy(out32, d_out, q_n * sizeof(float),
                                        cudaMemcpyDeviceToHost),
                             cudaSuccess);
            assert_memory_equal(gout, out32, q_n * sizeof(float));
            free(gout);
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
            cudaStreamDestroy(cs);
        }
        /* Empty splits leave the neutral partial. */
        if (ws_bytes > 0) {
            float *ws = malloc(ws_bytes);
            assert_non_null(ws);
            assert_int_equal(cudaMemcpy(ws, d_ws, ws_bytes,
                                        cudaMemcpyDeviceToHost), cudaSuccess);
            for (int s = 0; s < NS; s++) {
                for (int h = 0; h < Hkv; h++) {
                    int g = hg[h], S = s1[g];
                    int64_t np = (lens[(s * L + layer) * NG + g] + P - 1) / P;
                    if (S == 1)
                        continue;
                    for (int sp = 0; sp < S; sp++) {
                        if ((int64_t)sp * np / S != (int64_t)(sp + 1) * np / S)
                            continue;
                        for (int gi = 0; gi < G; gi++) {
                            size_t qh = (size_t)s * Hq + (size_t)h * G + gi;
                            const float *w =
                                ws + (qh * max_s + sp) * (size_t)(d + 2);
                            assert_true(isinf(w[d]) && w[d] < 0.0f);
                            assert_true(w[d + 1] == 0.0f);
                            assert_true(w[0] == 0.0f);
                        }
                    }
                }
            }
            free(ws);
        }
        cudaFree(d_ws);
        tg_cuda_split_map_free(&sm);
    }

    cudaFree(d_out);
    cudaFree(d_pool);
    cudaFree(d_q);
    cudaFree(d_indptr);
    cudaFree(d_indices);
    cudaFree(d_lens);
    cudaFree(d_hg);
    cudaFree(d_hs);
    if (d_hl != NULL)
        cudaFree(d_hl);
    free(hl);
    free(out32);
    free(out16);
    free(kr);
    free(gp);
    free(gl);
    free(ref);
    free(pool16);
    free(pool32);
    free(q16);
    free(q32);
    free(hg);
    free(hs);
    free(lens);
    free(indptr);
    free(indices);
}

static void test_matches_cpu(void **state)
{
    (void)state;
    static const int hps[] = {1, 2, 4}, ds[] = {64, 128}, gs[] = {1, 4, 8};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 3; c++) {
                struct dcase k = {hps[a], ds[b], gs[c], 16,
                                  tt_xrng_int(&rng, 1, 3),
                                  tt_xrng_int(&rng, 1, 4), 300, 8, 0};
                run_case(&k);
                /* Heads of a group holding different counts. */
                k.per_head = 1;
                run_case(&k);
            }
}

static void test_odd_shapes(void **state)
{
    (void)state;
    /* Non-power-of-two G, the largest G, an odd page size, long rows with
     * many splits, a single sequence of single-token rows. */
    const struct dcase cases[] = {
        {2, 128, 5, 16, 2, 3, 200, 8, 0},
        {1, 64, 16, 16, 3, 2, 200, 8, 0},
        {4, 128, 16, 16, 2, 1, 100, 4, 0},
        {2, 64, 4, 5, 3, 3, 120, 8, 1},
        {4, 128, 8, 16, 2, 2, 3000, 8, 0},
        {1, 128, 4, 16, 4, 1, 1, 8, 0},
        /* P = 1 (a split boundary after every token), H_p = 16 (the
         * largest group), G = 2 (the GM = 2 instances), many sequences. */
        {2, 64, 2, 1, 2, 3, 70, 8, 1},
        {16, 64, 1, 16, 1, 2, 100, 4, 0},
        {16, 128, 2, 16, 2, 2, 300, 8, 1},
        {1, 128, 2, 7, 3, 9, 150, 8, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i]);
}

static void test_n_cta(void **state)
{
    (void)state;
    struct tg_cuda_device_info info;
    assert_int_equal(tg_cuda_device_query(0, &info), 0);
    int n = 0;
    assert_int_equal(tg_cuda_decode_attn_n_cta(4, 128, &n), 0);
    assert_true(n >= info.sm_count);
    assert_int_equal(n % info.sm_count, 0);
    assert_int_equal(tg_cuda_decode_attn_n_cta(4, 96, &n), TG_EINVAL);
    assert_int_equal(tg_cuda_decode_attn_n_cta(0, 128, &n), TG_EINVAL);
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    const struct CMUnitTest host_tests[] = {
        cmocka_unit_test(test_uniform_splits),
        cmocka_unit_test(test_split_map_rejects),
        cmocka_unit_test(test_bad_arguments),
    };
    const struct CMUnitTest dev_tests[] = {
        cmocka_unit_test(test_n_cta),
        cmocka_unit_test(test_matches_cpu),
        cmocka_unit_test(test_odd_shapes),
    };
    return tt_cuda_run_tests("host", host_tests, TT_COUNT(host_tests),
                             "no CUDA device: device tests skipped",
                             "device", dev_tests, TT_COUNT(dev_tests));
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
