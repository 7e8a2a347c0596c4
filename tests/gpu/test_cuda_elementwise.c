/* test_cuda_elementwise.c — the CUDA elementwise ops (kernels/cuda/
 * elementwise.h) against the CPU reference ops of kernels/tg_ops.h on the
 * same inputs: bf16 <-> fp32 conversion (bit-exact against
 * st_f32_to_bf16 / st_bf16_to_f32, every bf16 pattern and the rounding
 * corner cases), embedding (exact, invalid ids give zero rows), RMSNorm
 * with and without the fused residual add (the updated residual stream
 * bit-exact), NeoX RoPE with and without the fused per-head norm (strided
 * rows; columns outside the heads untouched), SiLU-mul (dense, fused
 * gate_up layout, in place), over every dtype combination and random
 * shapes: hidden 1..8192 with odd sizes, heads 1..64, d 64/128/256 (and
 * tiny d). Tolerances: bf16 outputs rel 1e-2 / abs 1e-2 against the fp32
 * reference; fp32 outputs 1e-5..1e-4 (only summation order and the last
 * ulp of libm functions differ). Bad arguments give TG_EINVAL.
 * Skipped (77) without CUDA or without a device. */
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
#include "kernels/tg_ops.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/elementwise.h"
#endif

#ifdef TANGRAM_CUDA
static struct tg_backend *cpu;
static struct tt_xrng rng = {0x9e3779b97f4a7c15ull};

static size_t dsize(enum tg_cuda_elementwise_dtype dt)
{
    return dt == TG_CUDA_ELEMENTWISE_F32 ? 4 : 2;
}

static const char *dname(enum tg_cuda_elementwise_dtype dt)
{
    return dt == TG_CUDA_ELEMENTWISE_F32 ? "f32" : "bf16";
}

/* Random values in [lo, hi], already representable in dt, so the device
 * and the reference see the same inputs. */
static float *rand_vals(size_t len, float lo, float hi,
                        enum tg_cuda_elementwise_dtype dt)
{
    float *a = tt_xmalloc(len * sizeof(float));
    for (size_t i = 0; i < len; i++) {
        float v = tt_xrng_float(&rng, lo, hi);
        a[i] = dt == TG_CUDA_ELEMENTWISE_BF16 ? tt_bf16_round(v) : v;
    }
    return a;
}

/* Copies host floats to a new device buffer stored as dt. */
static void *dev_from(const float *h, size_t len,
                      enum tg_cuda_elementwise_dtype dt)
{
    if (dt == TG_CUDA_ELEMENTWISE_F32)
        return tt_cuda_upload(h, len * 4);
    uint16_t *t = tt_xmalloc(len * 2);
    for (size_t i = 0; i < len; i++)
        t[i] = st_f32_to_bf16(h[i]);
    void *d = tt_cuda_upload(t, len * 2);
    free(t);
    return d;
}

/* Copies a device buffer of len dt elements back as floats (after waiting
 * for the device, so kernel errors surface here). */
static float *host_from(const void *d, size_t len,
                        enum tg_cuda_elementwise_dtype dt)
{
    float *h = tt_xmalloc(len * sizeof(float));
    if (dt == TG_CUDA_ELEMENTWISE_F32) {
        tt_cuda_sync_to_host(h, d, len * 4);
        return h;
    }
    uint16_t *t = tt_xmalloc(len * 2);
    tt_cuda_sync_to_host(t, d, len * 2);
    for (size_t i = 0; i < len; i++)
        h[i] = st_bf16_to_f32(t[i]);
    free(t);
    return h;
}

/* |got - ref| <= abs + rel * |ref| for every element (NaN fails). */
static void expect_close(const float *got, const float *ref, size_t len,
                         double abs_tol, double rel_tol, const char *what)
{
    for (size_t i = 0; i < len; i++) {
        double diff = fabs((double)got[i] - (double)ref[i]);
        if (!(diff <= abs_tol + rel_tol * fabs((double)ref[i]))) {
            print_error("%s: element %zu: got %.9g, want %.9g\n", what, i,
                        (double)got[i], (double)ref[i]);
            fail();
        }
    }
}

static void expect_equal(const float *got, const float *ref, size_t len,
                         const char *what)
{
    expect_close(got, ref, len, 0.0, 0.0, what);
}

/* The tolerance of a result stored as dt: bf16 rounding dominates. */
static double tol_of(enum tg_cuda_elementwise_dtype dt, double f32_tol)
{
    return dt == TG_CUDA_ELEMENTWISE_BF16 ? 1e-2 : f32_tol;
}

/* ------------------------------------------------------------ conversion */

static void test_convert(void **state)
{
    (void)state;
    /* bf16 -> f32 over all 65536 patterns: exact (NaN stays NaN). */
    size_t n = 65536;
    uint16_t *bits = malloc(n * 2);
    float *out = malloc(n * 4);
    assert_non_null(bits);
    assert_non_null(out);
    for (size_t i = 0; i < n; i++)
        bits[i] = (uint16_t)i;
    uint16_t *dbits = tt_cuda_alloc(n * 2);
    float *dout = tt_cuda_alloc(n * 4);
    assert_int_equal(cudaMemcpy(dbits, bits, n * 2, cudaMemcpyHostToDevice),
                     cudaSuccess);
    assert_int_equal(tg_cuda_elementwise_bf16_to_f32(dbits, dout, n, NULL), 0);
    assert_int_equal(cudaMemcpy(out, dout, n * 4, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (size_t i = 0; i < n; i++) {
        float want = st_bf16_to_f32((uint16_t)i);
        if (isnan(want))
            assert_true(isnan(out[i]));
        else
            assert_memory_equal(&out[i], &want, 4);
    }
    cudaFree(dbits);
    cudaFree(dout);
    free(bits);
    free(out);

    /* f32 -> bf16: rounding corners, then random values at odd lengths,
     * bit-exact against st_f32_to_bf16. */
    static const uint32_t corners[] = {
        0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, /* tie, even */
        0x3f818000u, /* tie, odd */ 0x3f808001u, 0x3f807fffu,
        0x7f7fffffu, /* FLT_MAX: overflows to inf */ 0x7f7f7fffu,
        0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, /* sNaN */
        0x00000001u, /* smallest denormal */ 0x00400000u, 0x80008000u,
        0x007fffffu, 0x00800000u,
    };
    const size_t lens[] = {1, 2, 7, 1000, 65537, 1000003};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        size_t len = lens[li];
        float *in = malloc(len * 4);
        uint16_t *got = malloc(len * 2);
        assert_non_null(in);
        assert_non_null(got);
        for (size_t i = 0; i < len; i++) {
            uint32_t u = (uint32_t)tt_xrng_next(&rng);
            if (i < sizeof(corners) / sizeof(corners[0]))
                u = corners[i];
            memcpy(&in[i], &u, 4);
        }
        float *din = tt_cuda_alloc(len * 4);
        uint16_t *dgot = tt_cuda_alloc(len * 2);
        assert_int_equal(cudaMemcpy(din, in, len * 4, cudaMemcpyHostToDevice),
                         cudaSuccess);
        assert_int_equal(tg_cuda_elementwise_f32_to_bf16(din, dgot, len, NULL),
                         0);
        assert_int_equal(cudaMemcpy(got, dgot, len * 2,
                                    cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t i = 0; i < len; i++) {
            uint16_t want = st_f32_to_bf16(in[i]);
            if (isnan(in[i])) {
                assert_true(isnan(st_bf16_to_f32(got[i])));
            } else if (got[i] != want) {
                print_error("f32->bf16 of %a: got 0x%04x want 0x%04x\n",
                            (double)in[i], got[i], want);
                fail();
            }
        }
        cudaFree(din);
        cudaFree(dgot);
        free(in);
        free(got);
    }
}

/* ------------------------------------------------------------- embedding */

static void check_embedding(int vocab, int hidden, int n,
                            enum tg_cuda_elementwise_dtype odt)
{
    float *table = rand_vals((size_t)vocab * hidden, -2.0f, 2.0f,
                             TG_CUDA_ELEMENTWISE_BF16);
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *ids_ok = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    assert_non_null(ids);
    assert_non_null(ids_ok);
    for (int i = 0; i < n; i++) {
        ids[i] = tt_xrng_int(&rng, 0, vocab - 1);
        int k = tt_xrng_int(&rng, 0, 9);
        if (k == 0)
            ids[i] = vocab + tt_xrng_int(&rng, 0, 3); /* invalid: zero row */
        else if (k == 1)
            ids[i] = -1 - tt_xrng_int(&rng, 0, 3);
        ids_ok[i] = ids[i] >= 0 && ids[i] < vocab ? ids[i] : 0;
    }
    size_t olen = (size_t)n * hidden;
    float *ref = malloc((olen > 0 ? olen : 1) * sizeof(float));
    assert_non_null(ref);
    assert_int_equal(tg_ops_cpu.embedding(cpu, table, vocab, hidden, ids_ok,
                                          n, ref), 0);
    for (int i = 0; i < n; i++)
        if (ids[i] != ids_ok[i] || ids[i] < 0)
            memset(ref + (size_t)i * hidden, 0, (size_t)hidden * 4);

    void *dtable =
        dev_from(table, (size_t)vocab * hidden, TG_CUDA_ELEMENTWISE_BF16);
    int32_t *dids = tt_cuda_alloc((size_t)(n > 0 ? n : 1) * 4);
    if (n > 0)
        assert_int_equal(cudaMemcpy(dids, ids, (size_t)n * 4,
                                    cudaMemcpyHostToDevice), cudaSuccess);
    void *dout = tt_cuda_alloc(olen * dsize(odt));
    assert_int_equal(tg_cuda_elementwise_embedding(dtable, vocab, hidden, dids,
                                                   n, dout, odt, NULL),
                     0);
    float *got = host_from(dout, olen, odt);
    /* A pure copy of bf16 values: exact in either output type. */
    expect_equal(got, ref, olen, "embedding");
    cudaFree(dtable);
    cudaFree(dids);
    cudaFree(dout);
    free(table);
    free(ids);
    free(ids_ok);
    free(ref);
    free(got);
}

static void test_embedding(void **state)
{
    (void)state;
    const int hiddens[] = {1, 3, 64, 1001, 4096, 8192};
    for (int o = 0; o < 2; o++) {
        enum tg_cuda_elementwise_dtype odt =
            o ? TG_CUDA_ELEMENTWISE_BF16 : TG_CUDA_ELEMENTWISE_F32;
        for (size_t k = 0; k < sizeof(hiddens) / sizeof(hiddens[0]); k++)
            check_embedding(tt_xrng_int(&rng, 1, 300), hiddens[k],
                            tt_xrng_int(&rng, 1, 40), odt);
        check_embedding(tt_xrng_int(&rng, 1, 50), tt_xrng_int(&rng, 1, 8192),
                        tt_xrng_int(&rng, 1, 40), odt);
        check_embedding(1, 7, 5, odt);
        check_embedding(10, 7, 0, odt);
    }
}

/* --------------------------------------------------------------- rmsnorm */

static void check_rmsnorm(int n, int dim, int with_res,
                          enum tg_cuda_elementwise_dtype xdt,
                          enum tg_cuda_elementwise_dtype rdt,
                          enum tg_cuda_elementwise_dtype odt, int in_place,
                          cudaStream_t stream)
{
    size_t len = (size_t)n * dim;
    float eps = 1e-6f;
    float *x = rand_vals(len, -3.0f, 3.0f, xdt);
    float *r = with_res ? rand_vals(len, -3.0f, 3.0f, rdt) : NULL;
    float *w = rand_vals((size_t)dim, -1.5f, 1.5f, TG_CUDA_ELEMENTWISE_BF16);
    /* Reference: the add rounded to x's type, then the fp32 CPU norm. */
    float *xref = malloc((len > 0 ? len : 1) * sizeof(float));
    float *ref = malloc((len > 0 ? len : 1) * sizeof(float));
    assert_non_null(xref);
    assert_non_null(ref);
    memcpy(xref, x, len * sizeof(float));
    if (with_res) {
        assert_int_equal(tg_ops_cpu.add(cpu, xref, r, len), 0);
        if (xdt == TG_CUDA_ELEMENTWISE_BF16)
            for (size_t i = 0; i < len; i++)
                xref[i] = tt_bf16_round(xref[i]);
    }
    assert_int_equal(tg_ops_cpu.rmsnorm(cpu, xref, w, n, dim, eps, ref), 0);

    void *dx = dev_from(x, len, xdt);
    void *dr = with_res ? dev_from(r, len, rdt) : NULL;
    void *dw = dev_from(w, (size_t)dim, TG_CUDA_ELEMENTWISE_BF16);
    void *dout = in_place ? dx : tt_cuda_alloc(len * dsize(odt));
    assert_int_equal(tg_cuda_elementwise_rmsnorm(dx, xdt, dr, rdt, dw, n, dim,
                                                 eps, dout, odt, stream),
                     0);
    char what[128];
    snprintf(what, sizeof(what), "rmsnorm n=%d dim=%d res=%d x=%s r=%s o=%s%s",
             n, dim, with_res, dname(xdt), dname(rdt), dname(odt),
             in_place ? " in place" : "");
    if (with_res) {
        /* The residual stream is written exactly as an unfused add. */
        float *gx = host_from(dx, len, xdt);
        expect_equal(gx, xref, len, what);
        free(gx);
    }
    float *got = host_from(dout, len, odt);
    expect_close(got, ref, len, tol_of(odt, 1e-5), tol_of(odt, 1e-4), what);
    cudaFree(dx);
    cudaFree(dr);
    cudaFree(dw);
    if (!in_place)
        cudaFree(dout);
    free(x);
    free(r);
    free(w);
    free(xref);
    free(ref);
    free(got);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    const int dims[] = {1, 2, 31, 33, 127, 1000, 1025, 4095, 4096, 5120, 8192};
    for (int c = 0; c < 8; c++) {
        enum tg_cuda_elementwise_dtype xdt =
            (c & 1) ? TG_CUDA_ELEMENTWISE_BF16 : TG_CUDA_ELEMENTWISE_F32;
        enum tg_cuda_elementwise_dtype rdt =
            (c & 2) ? TG_CUDA_ELEMENTWISE_BF16 : TG_CUDA_ELEMENTWISE_F32;
        enum tg_cuda_elementwise_dtype odt =
            (c & 4) ? TG_CUDA_ELEMENTWISE_BF16 : TG_CUDA_ELEMENTWISE_F32;
        for (size_t k = 0; k < sizeof(dims) / sizeof(dims[0]); k++) {
            check_rmsnorm(tt_xrng_int(&rng, 1, 9), dims[k], 1, xdt, rdt, odt,
                          0, NULL);
            if ((c & 2) == 0) /* without a residual rdt does not matter */
                check_rmsnorm(tt_xrng_int(&rng, 1, 9), dims[k], 0, xdt, rdt,
                              odt, 0, NULL);
        }
        check_rmsnorm(tt_xrng_int(&rng, 1, 40), tt_xrng_int(&rng, 1, 8192), 1,
                      xdt, rdt, odt, 0, NULL);
    }
    /* In place (out == x) without a residual, and on a created stream. */
    check_rmsnorm(7, 4096, 0, TG_CUDA_ELEMENTWISE_BF16,
                  TG_CUDA_ELEMENTWISE_BF16, TG_CUDA_ELEMENTWISE_BF16, 1, NULL);
    check_rmsnorm(5, 333, 0, TG_CUDA_ELEMENTWISE_F32, TG_CUDA_ELEMENTWISE_F32,
                  TG_CUDA_ELEMENTWISE_F32, 1, NULL);
    cudaStream_t st;
    assert_int_equal(cudaStreamCreate(&st), cudaSuccess);
    check_rmsnorm(64, 8192, 1, TG_CUDA_ELEMENTWISE_F32,
                  TG_CUDA_ELEMENTWISE_BF16, TG_CUDA_ELEMENTWISE_BF16, 0, st);
    assert_int_equal(cudaStreamDestroy(st), cudaSuccess);
    check_rmsnorm(0, 128, 1, TG_CUDA_ELEMENTWISE_F32, TG_CUDA_ELEMENTWISE_F32,
                  TG_CUDA_ELEMENTWISE_F32, 0, NULL);
}

/* ------------------------------------------------------------------ rope */

static void check_rope(int n, int heads, int d, int64_t stride, int with_norm,
                       enum tg_cuda_elementwise_dtype dt)
{
    size_t len = (size_t)n * (size_t)stride, hd = (size_t)heads * d;
    float eps = 1e-6f;
    float *x = rand_vals(len, -2.0f, 2.0f, dt);
    float *w = with_norm
                   ? rand_vals((size_t)d, 0.2f, 1.8f, TG_CUDA_ELEMENTWISE_BF16)
                   : NULL;
    int32_t *pos = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    float *inv_freq = malloc((size_t)(d / 2) * sizeof(float));
    assert_non_null(pos);
    assert_non_null(inv_freq);
    for (int i = 0; i < n; i++)
        pos[i] = i == 0 ? 0 : tt_xrng_int(&rng, 0, 131071);
    /* HF default RoPE: inv_freq[j] = theta^(-2j/d), theta = 1e6 (Qwen3). */
    for (int j = 0; j < d / 2; j++)
        inv_freq[j] = (float)(1.0 / pow(1e6, 2.0 * j / d));
    /* Reference on a dense copy of the head columns. */
    float *ref = malloc((n * hd > 0 ? n * hd : 1) * sizeof(float));
    assert_non_null(ref);
    for (int i = 0; i < n; i++)
        memcpy(ref + (size_t)i * hd, x + (size_t)i * stride, hd * 4);
    if (with_norm)
        assert_int_equal(tg_ops_cpu.rmsnorm(cpu, ref, w, n * heads, d, eps,
                                            ref), 0);
    assert_int_equal(tg_ops_cpu.rope(cpu, ref, n, heads, d, pos, inv_freq), 0);

    void *dx = dev_from(x, len, dt);
    void *dw =
        with_norm ? dev_from(w, (size_t)d, TG_CUDA_ELEMENTWISE_BF16) : NULL;
    int32_t *dpos = tt_cuda_alloc((size_t)(n > 0 ? n : 1) * 4);
    float *dinv = tt_cuda_alloc((size_t)(d / 2) * 4);
    if (n > 0)
        assert_int_equal(cudaMemcpy(dpos, pos, (size_t)n * 4,
                                    cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dinv, inv_freq, (size_t)(d / 2) * 4,
                                cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(tg_cuda_elementwise_rope(dx, dt, n, heads, d, stride, dpos,
                                              dinv, dw, eps, NULL),
                     0);
    float *got = host_from(dx, len, dt);
    char what[128];
    snprintf(what, sizeof(what), "rope n=%d heads=%d d=%d stride=%lld norm=%d %s",
             n, heads, d, (long long)stride, with_norm, dname(dt));
    float *g = malloc((n * hd > 0 ? n * hd : 1) * sizeof(float));
    assert_non_null(g);
    for (int i = 0; i < n; i++) {
        memcpy(g + (size_t)i * hd, got + (size_t)i * stride, hd * 4);
        /* Columns past the heads (other parts of a fused QKV row) are
         * untouched. */
        expect_equal(got + (size_t)i * stride + hd, x + (size_t)i * stride + hd,
                     (size_t)stride - hd, what);
    }
    expect_close(g, ref, (size_t)n * hd, tol_of(dt, with_norm ? 1e-4 : 2e-5),
                 tol_of(dt, with_norm ? 1e-4 : 1e-5), what);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dpos);
    cudaFree(dinv);
    free(x);
    free(w);
    free(pos);
    free(inv_freq);
    free(ref);
    free(got);
    free(g);
}

static void test_rope(void **state)
{
    (void)state;
    const int ds[] = {64, 128, 256};
    for (int c = 0; c < 4; c++) {
        enum tg_cuda_elementwise_dtype dt =
            (c & 1) ? TG_CUDA_ELEMENTWISE_BF16 : TG_CUDA_ELEMENTWISE_F32;
        int norm = (c & 2) != 0;
        for (size_t k = 0; k < sizeof(ds) / sizeof(ds[0]); k++) {
            int d = ds[k];
            int heads = tt_xrng_int(&rng, 1, 64);
            check_rope(tt_xrng_int(&rng, 1, 12), heads, d, (int64_t)heads * d,
                       norm, dt);
            /* q inside a fused QKV row: k and v columns follow. */
            int kv = tt_xrng_int(&rng, 1, 8);
            check_rope(tt_xrng_int(&rng, 1, 12), heads, d,
                       (int64_t)(heads + 2 * kv) * d, norm, dt);
            check_rope(1, 64, d, 64 * d + tt_xrng_int(&rng, 1, 5), norm, dt);
            check_rope(tt_xrng_int(&rng, 1, 4), 1, d, d, norm, dt);
        }
        /* Tiny and odd-half head sizes: lanes without a pair. */
        check_rope(3, 5, 2, 10, norm, dt);
        check_rope(4, 3, 6, 19, norm, dt);
        check_rope(2, 7, 34, 7 * 34, norm, dt);
        check_rope(0, 4, 64, 256, norm, dt);
    }
}

/* -------------------------------------------------------------- silu_mul */

static void check_silu(int n, int width, int fused, int64_t ld_out,
                       enum tg_cuda_elementwise_dtype idt,
                       enum tg_cuda_elementwise_dtype odt, int in_place)
{
    int64_t ld_in = fused ? 2 * (int64_t)width : width;
    size_t in_len = (size_t)n * (size_t)ld_in;
    size_t out_len = (size_t)n * (size_t)ld_out;
    size_t dense = (size_t)n * width;
    /* Gate values far into both tails so exp over/underflow is covered. */
    float *gate = rand_vals(in_len, -30.0f, 30.0f, idt);
    float *up = fused ? gate : rand_vals(in_len, -2.0f, 2.0f, idt);
    float *gd = malloc((dense > 0 ? dense : 1) * sizeof(float));
    float *ud = malloc((dense > 0 ? dense : 1) * sizeof(float));
    float *ref = malloc((dense > 0 ? dense : 1) * sizeof(float));
    assert_non_null(gd);
    assert_non_null(ud);
    assert_non_null(ref);
    for (int i = 0; i < n; i++) {
        memcpy(gd + (size_t)i * width, gate + (size_t)i * ld_in,
               (size_t)width * 4);
        memcpy(ud + (size_t)i * width,
               up + (size_t)i * ld_in + (fused ? width : 0), (size_t)width * 4);
    }
    assert_int_equal(tg_ops_cpu.silu_mul(cpu, gd, ud, dense, ref), 0);

    void *dg = dev_from(gate, in_len, idt);
    void *du = fused ? NULL : dev_from(up, in_len, idt);
    const char *dgate = dg;
    const void *dup = fused ? (const void *)(dgate + (size_t)width * dsize(idt))
                            : du;
    void *dout = in_place ? dg : tt_cuda_alloc(out_len * dsize(odt));
    assert_int_equal(tg_cuda_elementwise_silu_mul(dg, dup, idt, n, width, ld_in,
                                                  dout, odt, ld_out, NULL),
                     0);
    float *got = host_from(dout, out_len, odt);
    float *g = malloc((dense > 0 ? dense : 1) * sizeof(float));
    assert_non_null(g);
    for (int i = 0; i < n; i++)
        memcpy(g + (size_t)i * width, got + (size_t)i * ld_out,
               (size_t)width * 4);
    char what[128];
    snprintf(what, sizeof(what), "silu_mul n=%d w=%d fused=%d ld_out=%lld %s->%s%s",
             n, width, fused, (long long)ld_out, dname(idt), dname(odt),
             in_place ? " in place" : "");
    expect_close(g, ref, dense, tol_of(odt, 1e-6), tol_of(odt, 1e-5), what);
    cudaFree(dg);
    cudaFree(du);
    if (!in_place)
        cudaFree(dout);
    free(gate);
    if (!fused)
        free(up);
    free(gd);
    free(ud);
    free(ref);
    free(got);
    free(g);
}

static void test_silu_mul(void **state)
{
    (void)state;
    const int widths[] = {1, 3, 127, 1000, 4097, 14336};
    for (int c = 0; c < 4; c++) {
        enum tg_cuda_elementwise_dtype idt =
            (c & 1) ? TG_CUDA_ELEMENTWISE_BF16 : TG_CUDA_ELEMENTWISE_F32;
        enum tg_cuda_elementwise_dtype odt =
            (c & 2) ? TG_CUDA_ELEMENTWISE_BF16 : TG_CUDA_ELEMENTWISE_F32;
        for (size_t k = 0; k < sizeof(widths) / sizeof(widths[0]); k++) {
            int w = widths[k];
            check_silu(tt_xrng_int(&rng, 1, 9), w, 0, w, idt, odt, 0);
            check_silu(tt_xrng_int(&rng, 1, 9), w, 1,
                       w + tt_xrng_int(&rng, 0, 3), idt, odt, 0);
        }
        check_silu(tt_xrng_int(&rng, 1, 40), tt_xrng_int(&rng, 1, 8192),
                   tt_xrng_int(&rng, 0, 1), 8192, idt, odt, 0);
        check_silu(0, 64, 0, 64, idt, odt, 0);
    }
    /* In place over the gate half of a fused gate_up output. */
    check_silu(6, 1000, 1, 2000, TG_CUDA_ELEMENTWISE_BF16,
               TG_CUDA_ELEMENTWISE_BF16, 1);
    check_silu(3, 77, 0, 77, TG_CUDA_ELEMENTWISE_F32, TG_CUDA_ELEMENTWISE_F32,
               1);
}

/* ---------------------------------------------------------- bad arguments */

/* Every entry validates its arguments before any CUDA call, so this test
 * uses host memory and also runs (and must pass) without a device; none of
 * the calls below may reach a launch. */
static int have_device;

static void test_bad_arguments(void **state)
{
    (void)state;
    static _Alignas(64) char buf[1 << 14];
    float *f = (float *)buf;
    uint16_t *h = (uint16_t *)buf;
    int32_t *ids = (int32_t *)buf;
    const enum tg_cuda_elementwise_dtype bad =
        (enum tg_cuda_elementwise_dtype)7;
    const enum tg_cuda_elementwise_dtype F = TG_CUDA_ELEMENTWISE_F32,
                                         B = TG_CUDA_ELEMENTWISE_BF16;

    /* embedding */
    assert_int_equal(
        tg_cuda_elementwise_embedding(NULL, 4, 4, ids, 1, f, F, NULL),
        TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_embedding(h, 0, 4, ids, 1, f, F, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_embedding(h, 4, 0, ids, 1, f, F, NULL),
                     TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_embedding(h, 4, 4, ids, -1, f, F, NULL), TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_embedding(h, 4, 4, ids, 1, f, bad, NULL),
        TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_embedding(h, 4, 4, NULL, 1, f, F, NULL), TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_embedding(h, 4, 4, ids, 1, buf + 2, F, NULL),
        TG_EINVAL); /* misaligned f32 */
    assert_int_equal(
        tg_cuda_elementwise_embedding(h, 4, 4, ids, 0, NULL, F, NULL), 0);

    /* rmsnorm */
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, NULL, F, h, 1, 0, 1e-6f,
                                                 f + 64, F, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, NULL, F, h, -1, 8, 1e-6f,
                                                 f + 64, F, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, NULL, F, h, 1, 8, -1.0f,
                                                 f + 64, F, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, NULL, F, h, 1, 8, NAN,
                                                 f + 64, F, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, bad, NULL, F, h, 1, 8,
                                                 1e-6f, f + 64, F, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, f + 32, bad, h, 1, 8,
                                                 1e-6f, f + 64, F, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, NULL, F, NULL, 1, 8,
                                                 1e-6f, f + 64, F, NULL),
                     TG_EINVAL);
    /* With a residual, out must not overwrite x or the residual. */
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, f + 32, F, h, 1, 8,
                                                 1e-6f, f, F, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, f + 32, F, h, 1, 8,
                                                 1e-6f, f + 32, F, NULL),
                     TG_EINVAL);
    /* In place needs the same dtype. */
    assert_int_equal(
        tg_cuda_elementwise_rmsnorm(f, F, NULL, F, h, 1, 8, 1e-6f, f, B, NULL),
        TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, F, NULL, bad, h, 0, 8,
                                                 1e-6f, NULL, F, NULL),
                     0); /* no rows; unused res dtype */

    /* rope */
    float *inv = f + 1024;
    assert_int_equal(tg_cuda_elementwise_rope(f, F, 1, 2, 7, 14, ids, inv, NULL,
                                              1e-6f, NULL),
                     TG_EINVAL); /* odd d */
    assert_int_equal(tg_cuda_elementwise_rope(f, F, 1, 2, 0, 14, ids, inv, NULL,
                                              1e-6f, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rope(f, F, 1, 0, 8, 14, ids, inv, NULL,
                                              1e-6f, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rope(f, F, 1, 2, 8, 15, ids, inv, NULL,
                                              1e-6f, NULL),
                     TG_EINVAL); /* stride < heads * d */
    assert_int_equal(tg_cuda_elementwise_rope(f, F, -1, 2, 8, 16, ids, inv,
                                              NULL, 1e-6f, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rope(f, bad, 1, 2, 8, 16, ids, inv,
                                              NULL, 1e-6f, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rope(f, F, 1, 2, 8, 16, NULL, inv,
                                              NULL, 1e-6f, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rope(f, F, 1, 2, 8, 16, ids, NULL,
                                              NULL, 1e-6f, NULL),
                     TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_rope(f, F, 1, 2, 8, 16, ids, inv, h, -1.0f, NULL),
        TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rope(f, F, 1, 2, 8, 16, ids,
                                              (float *)(buf + 2), NULL, 1e-6f,
                                              NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_rope(NULL, F, 0, 2, 8, 16, NULL, NULL,
                                              NULL, 1e-6f, NULL),
                     0);

    /* silu_mul */
    assert_int_equal(
        tg_cuda_elementwise_silu_mul(f, f + 8, F, 1, 8, 7, f + 64, F, 8, NULL),
        TG_EINVAL); /* ld_in < width */
    assert_int_equal(
        tg_cuda_elementwise_silu_mul(f, f + 8, F, 1, 8, 8, f + 64, F, 7, NULL),
        TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_silu_mul(f, f + 8, F, -1, 8, 8, f + 64, F, 8, NULL),
        TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_silu_mul(f, f + 8, bad, 1, 8, 8,
                                                  f + 64, F, 8, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_silu_mul(NULL, f + 8, F, 1, 8, 8,
                                                  f + 64, F, 8, NULL),
                     TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_silu_mul(f, f + 8, F, 1, 8, 16, f, B, 16, NULL),
        TG_EINVAL); /* in place, other dtype */
    assert_int_equal(
        tg_cuda_elementwise_silu_mul(f, f + 8, F, 1, 8, 16, f, F, 8, NULL),
        TG_EINVAL); /* in place, other stride */
    assert_int_equal(
        tg_cuda_elementwise_silu_mul(NULL, NULL, F, 4, 0, 0, NULL, F, 0, NULL),
        0);

    /* conversion */
    assert_int_equal(tg_cuda_elementwise_f32_to_bf16(NULL, h, 4, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_f32_to_bf16(f, NULL, 4, NULL),
                     TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_f32_to_bf16((float *)(buf + 2), h, 4, NULL),
        TG_EINVAL);
    assert_int_equal(
        tg_cuda_elementwise_bf16_to_f32(h, (float *)(buf + 2), 4, NULL),
        TG_EINVAL);
    assert_int_equal(tg_cuda_elementwise_bf16_to_f32(NULL, NULL, 0, NULL), 0);

    /* Nothing above launched a kernel that could fail. */
    if (have_device)
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

/* Without a device a well-formed call fails cleanly with TG_EDEVICE (the
 * CI case: the CUDA build on a machine without a driver). Only run when
 * there is no device, since the buffers are host memory. */
static void test_no_device(void **state)
{
    (void)state;
    static _Alignas(64) char buf[1 << 12];
    float *f = (float *)buf;
    uint16_t *h = (uint16_t *)buf;
    int32_t *ids = (int32_t *)buf;
    assert_int_equal(tg_cuda_elementwise_rmsnorm(f, TG_CUDA_ELEMENTWISE_F32,
                                                 NULL, TG_CUDA_ELEMENTWISE_F32,
                                                 h, 2, 8, 1e-6f, f + 64,
                                                 TG_CUDA_ELEMENTWISE_F32, NULL),
                     TG_EDEVICE);
    assert_int_equal(tg_cuda_elementwise_embedding(
                         h, 4, 8, ids, 2, f, TG_CUDA_ELEMENTWISE_BF16, NULL),
                     TG_EDEVICE);
    assert_int_equal(tg_cuda_elementwise_f32_to_bf16(f, h + 512, 16, NULL),
                     TG_EDEVICE);
}

static int setup(void **state)
{
    (void)state;
    return tg_backend_cpu_new(2, &cpu) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tg_backend_cpu_free(cpu);
    cpu = NULL;
    return 0;
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    have_device = tt_cuda_have_device(NULL);
    if (!have_device) {
        const struct CMUnitTest host_tests[] = {
            cmocka_unit_test(test_bad_arguments),
            cmocka_unit_test(test_no_device),
        };
        if (cmocka_run_group_tests_name("host-only", host_tests, NULL, NULL))
            return 1;
        printf("no CUDA device: device tests skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
