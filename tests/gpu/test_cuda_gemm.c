/* test_cuda_gemm.c — the cuBLASLt bf16 GEMM (kernels/cuda/gemm.h) against
 * the CPU reference tg_ops_cpu.gemm on the same bf16-rounded inputs:
 * shapes with m 1..512 and n, k up to 8192 (odd ones included, so rows are
 * misaligned), with and without bias, bf16 and fp32 output, offset
 * (element-aligned only) pointers; the shape cache (and a cached plan
 * reused with another bias vector); k == 0; bad arguments.
 *
 * Tolerance: the reference is fp32 with a different summation order, so
 * |y - ref| <= 2e-4 * S (+ |ref| / 128 for bf16 output, the rounding of
 * the result) with S = sum_k |x||w| + |bias| from a second CPU GEMM on the
 * absolute values. fp32 accumulation of exact bf16 products stays orders
 * of magnitude below that (about sqrt(k) * 2^-24 * S); a wrong index or
 * transpose gives errors near |y| ~ S / sqrt(k), a lost bias ~|bias|
 * (caught by the small-k cases). Skipped (77) without CUDA or a device. */
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
#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm.h"
#endif

#ifdef TANGRAM_CUDA
static char err[256];
static struct tt_xrng rng = {0x9e3779b97f4a7c15ull};

/* n random values in [-1, 1) rounded to bf16: bits to h, the same values
 * to f. */
static void rand_bf16(size_t n, uint16_t *h, float *f)
{
    for (size_t i = 0; i < n; i++) {
        h[i] = st_f32_to_bf16(tt_xrng_sym(&rng));
        f[i] = st_bf16_to_f32(h[i]);
    }
}

struct gcase {
    int m, n, k;
    int bias;   /* add a bias */
    int f32;    /* fp32 output (else bf16) */
    int offset; /* shift x, w, y (and bias) off their 256-byte alignment */
};

/* Runs one case on the device and checks every element against the CPU. */
static void run_case(struct tg_cuda_gemm *g, struct tg_backend *cpu,
                     const struct gcase *c)
{
    size_t m = (size_t)c->m, n = (size_t)c->n, k = (size_t)c->k;
    size_t ysz = c->f32 ? 4 : 2;
    size_t off = c->offset ? 1 : 0; /* elements */
    uint16_t *xh = malloc(m * k * 2), *wh = malloc(n * k * 2);
    float *xf = malloc(m * k * 4), *wf = malloc(n * k * 4);
    float *bf = malloc(n * 4), *ref = malloc(m * n * 4), *abs_ref =
                                                           malloc(m * n * 4);
    void *bh = malloc(n * 4), *yh = malloc(m * n * ysz);
    assert_non_null(xh);
    assert_non_null(wh);
    assert_non_null(xf);
    assert_non_null(wf);
    assert_non_null(bf);
    assert_non_null(ref);
    assert_non_null(abs_ref);
    assert_non_null(bh);
    assert_non_null(yh);
    rand_bf16(m * k, xh, xf);
    rand_bf16(n * k, wh, wf);
    for (size_t j = 0; j < n; j++) {
        if (c->f32) {
            bf[j] = tt_xrng_sym(&rng);
            ((float *)bh)[j] = bf[j];
        } else {
            ((uint16_t *)bh)[j] = st_f32_to_bf16(tt_xrng_sym(&rng));
            bf[j] = st_bf16_to_f32(((uint16_t *)bh)[j]);
        }
    }
    char *dx = tt_cuda_alloc((m * k + off) * 2);
    char *dw = tt_cuda_alloc((n * k + 3 * off) * 2);
    char *db = tt_cuda_alloc((n + off) * ysz);
    char *dy = tt_cuda_alloc((m * n + off) * ysz);
    char *px = dx + off * 2, *pw = dw + 3 * off * 2, *pb = db + off * ysz,
         *py = dy + off * ysz;
    tt_cuda_to_dev(px, xh, m * k * 2);
    tt_cuda_to_dev(pw, wh, n * k * 2);
    tt_cuda_to_dev(pb, bh, n * ysz);
    assert_int_equal(cudaMemset(dy, 0xff, (m * n + off) * ysz), cudaSuccess);
    int rc = tg_cuda_gemm_bf16(g, px, pw, c->bias ? pb : NULL, c->m, c->n,
                               c->k, py,
                               c->f32 ? TG_CUDA_GEMM_F32 : TG_CUDA_GEMM_BF16,
                               NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    tt_cuda_to_host(yh, py, m * n * ysz);

    assert_int_equal(tg_ops_cpu.gemm(cpu, xf, wf, c->bias ? bf : NULL, c->m,
                                     c->n, c->k, ref), 0);
    for (size_t i = 0; i < m * k; i++)
        xf[i] = fabsf(xf[i]);
    for (size_t i = 0; i < n * k; i++)
        wf[i] = fabsf(wf[i]);
    for (size_t j = 0; j < n; j++)
        bf[j] = fabsf(bf[j]);
    assert_int_equal(tg_ops_cpu.gemm(cpu, xf, wf, c->bias ? bf : NULL, c->m,
                                     c->n, c->k, abs_ref), 0);
    size_t bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < m * n; i++) {
        double y = c->f32 ? ((float *)yh)[i]
                          : st_bf16_to_f32(((uint16_t *)yh)[i]);
        double tol = 2e-4 * abs_ref[i] + 1e-6;
        if (!c->f32)
            tol += fabs(ref[i]) / 128.0;
        double e = fabs(y - ref[i]);
        if (!(e <= tol)) {
            if (bad < 5)
                fprintf(stderr, "m %d n %d k %d: y[%zu, %zu] = %g, ref %g "
                        "(tol %g)\n", c->m, c->n, c->k, i / n, i % n, y,
                        ref[i], tol);
            bad++;
        }
        if (abs_ref[i] > 0 && e / abs_ref[i] > worst)
            worst = e / abs_ref[i];
    }
    printf("gemm m %5d n %5d k %5d bias %d %s off %d: max |err|/S %.2e\n",
           c->m, c->n, c->k, c->bias, c->f32 ? "f32 " : "bf16", c->offset,
           worst);
    assert_int_equal(bad, 0);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(db);
    cudaFree(dy);
    free(xh);
    free(wh);
    free(xf);
    free(wf);
    free(bf);
    free(ref);
    free(abs_ref);
    free(bh);
    free(yh);
}

static void test_shapes(void **state)
{
    (void)state;
    static const struct gcase cases[] = {
        {1, 1, 1, 0, 1, 0},        {1, 1, 1, 1, 0, 0},
        {1, 8192, 8192, 0, 0, 0},  {2, 4097, 8191, 1, 1, 0},
        {7, 8191, 4096, 1, 0, 1},  {16, 4096, 4096, 0, 1, 0},
        {64, 1000, 999, 1, 1, 1},  {128, 8192, 1024, 0, 0, 0},
        {333, 513, 2049, 1, 0, 0}, {512, 512, 512, 0, 1, 1},
        {512, 4096, 1024, 1, 0, 0}, {511, 17, 8192, 0, 1, 0},
        {3, 6144, 4096, 1, 1, 0},  {256, 1, 4096, 1, 0, 1},
        {1, 128, 3, 0, 0, 1},      {100, 3000, 5, 1, 1, 0},
    };
    struct tg_cuda_gemm *g = NULL;
    assert_int_equal(tg_cuda_gemm_new(0, &g, err, sizeof(err)), 0);
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(g, cpu, &cases[i]);
    tg_backend_cpu_free(cpu);
    tg_cuda_gemm_free(g);
}

/* The same shape twice reuses the cached plan; another shape, another
 * dtype or a differently aligned pointer adds one. Results stay right
 * when a cached plan is reused with new pointers. */
static void test_cache(void **state)
{
    (void)state;
    struct tg_cuda_gemm *g = NULL;
    assert_int_equal(tg_cuda_gemm_new(1 << 20, &g, err, sizeof(err)), 0);
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    assert_int_equal(tg_cuda_gemm_cached(g), 0);
    struct gcase c = {8, 256, 128, 1, 0, 0};
    run_case(g, cpu, &c);
    assert_int_equal(tg_cuda_gemm_cached(g), 1);
    run_case(g, cpu, &c);
    assert_int_equal(tg_cuda_gemm_cached(g), 1);
    c.f32 = 1;
    run_case(g, cpu, &c);
    assert_int_equal(tg_cuda_gemm_cached(g), 2);
    c.offset = 1;
    run_case(g, cpu, &c);
    assert_int_equal(tg_cuda_gemm_cached(g), 3);
    /* Enough shapes to make the table grow and rehash. */
    for (int m = 1; m <= 80; m++) {
        struct gcase d = {m, 64, 32, m % 2, m % 3 == 0, 0};
        run_case(g, cpu, &d);
    }
    assert_true(tg_cuda_gemm_cached(g) >= 80);
    size_t before = tg_cuda_gemm_cached(g);
    struct gcase d = {40, 64, 32, 0, 0, 0};
    run_case(g, cpu, &d);
    assert_int_equal(tg_cuda_gemm_cached(g), before);
    tg_backend_cpu_free(cpu);
    tg_cuda_gemm_free(g);
}

/* A cached plan reused with another (fused, 256-byte aligned) bias vector
 * adds that vector, not the one the plan was built with: both buffers stay
 * allocated, so a stale epilogue pointer would still read valid memory and
 * only the values tell. y2 - y1 must equal b2 - b1 column by column. */
static void test_bias_pointer_switch(void **state)
{
    (void)state;
    const int m = 4, n = 64, k = 32;
    struct tg_cuda_gemm *g = NULL;
    assert_int_equal(tg_cuda_gemm_new(1 << 20, &g, err, sizeof(err)), 0);
    uint16_t xh[4 * 32], wh[64 * 32];
    float xf[4 * 32], wf[64 * 32], b1[64], b2[64], y1[4 * 64], y2[4 * 64];
    rand_bf16((size_t)m * k, xh, xf);
    rand_bf16((size_t)n * k, wh, wf);
    for (int j = 0; j < n; j++) {
        b1[j] = tt_xrng_sym(&rng);
        b2[j] = b1[j] + 1.0f + (float)j; /* differs by >= 1 everywhere */
    }
    void *dx = tt_cuda_alloc(sizeof(xh)), *dw = tt_cuda_alloc(sizeof(wh));
    void *db1 = tt_cuda_alloc(sizeof(b1)), *db2 = tt_cuda_alloc(sizeof(b2));
    void *dy = tt_cuda_alloc(sizeof(y1));
    tt_cuda_to_dev(dx, xh, sizeof(xh));
    tt_cuda_to_dev(dw, wh, sizeof(wh));
    tt_cuda_to_dev(db1, b1, sizeof(b1));
    tt_cuda_to_dev(db2, b2, sizeof(b2));
    assert_int_equal(tg_cuda_gemm_bf16(g, dx, dw, db1, m, n, k, dy,
                                       TG_CUDA_GEMM_F32, NULL), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    tt_cuda_to_host(y1, dy, sizeof(y1));
    assert_int_equal(tg_cuda_gemm_bf16(g, dx, dw, db2, m, n, k, dy,
                                       TG_CUDA_GEMM_F32, NULL), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    tt_cuda_to_host(y2, dy, sizeof(y2));
    assert_int_equal(tg_cuda_gemm_cached(g), 1); /* one plan, reused */
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double d = (double)y2[i * n + j] - y1[i * n + j];
            double want = (double)b2[j] - b1[j];
            if (!(fabs(d - want) <= 1e-4 * (1.0 + fabs(want))))
                fail_msg("row %d col %d: y2 - y1 = %g, bias step %g", i, j, d,
                         want);
        }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(db1);
    cudaFree(db2);
    cudaFree(dy);
    tg_cuda_gemm_free(g);
}

static void test_edges_and_bad_arguments(void **state)
{
    (void)state;
    struct tg_cuda_gemm *g = NULL;
    assert_int_equal(tg_cuda_gemm_new(0, NULL, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_cuda_gemm_new(0, &g, err, sizeof(err)), 0);
    char *buf = tt_cuda_alloc(4096);
    void *x = buf, *w = buf + 1024, *y = buf + 2048, *b = buf + 3072;
    assert_int_equal(tg_cuda_gemm_bf16(NULL, x, w, NULL, 1, 1, 1, y,
                                       TG_CUDA_GEMM_BF16, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_gemm_bf16(g, x, w, NULL, -1, 1, 1, y,
                                       TG_CUDA_GEMM_BF16, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_gemm_bf16(g, x, w, NULL, 1, 1, -1, y,
                                       TG_CUDA_GEMM_BF16, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_gemm_bf16(g, x, w, NULL, 1, 1, 1, y,
                                       (enum tg_cuda_gemm_dtype)7, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_gemm_bf16(g, NULL, w, NULL, 1, 1, 1, y,
                                       TG_CUDA_GEMM_BF16, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_gemm_bf16(g, x, w, NULL, 1, 1, 1, NULL,
                                       TG_CUDA_GEMM_BF16, NULL), TG_EINVAL);
    /* Odd byte addresses are not even element-aligned. */
    assert_int_equal(tg_cuda_gemm_bf16(g, buf + 1, w, NULL, 1, 1, 1, y,
                                       TG_CUDA_GEMM_BF16, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_gemm_bf16(g, x, w, NULL, 1, 1, 1, buf + 2050,
                                       TG_CUDA_GEMM_F32, NULL), TG_EINVAL);
    /* Empty outputs are no-ops, even with NULL inputs. */
    assert_int_equal(tg_cuda_gemm_bf16(g, NULL, NULL, NULL, 0, 5, 5, NULL,
                                       TG_CUDA_GEMM_BF16, NULL), 0);
    assert_int_equal(tg_cuda_gemm_bf16(g, NULL, NULL, NULL, 5, 0, 5, NULL,
                                       TG_CUDA_GEMM_BF16, NULL), 0);
    /* k == 0: y = bias (fp32), or 0 (bf16). */
    float bias[3] = {1.5f, -2.0f, 0.25f};
    tt_cuda_to_dev(b, bias, sizeof(bias));
    assert_int_equal(tg_cuda_gemm_bf16(g, NULL, NULL, b, 2, 3, 0, y,
                                       TG_CUDA_GEMM_F32, NULL), 0);
    float out[6];
    tt_cuda_to_host(out, y, sizeof(out));
    for (int i = 0; i < 6; i++)
        assert_true(out[i] == bias[i % 3]);
    assert_int_equal(tg_cuda_gemm_bf16(g, NULL, NULL, NULL, 2, 3, 0, y,
                                       TG_CUDA_GEMM_BF16, NULL), 0);
    uint16_t o16[6];
    tt_cuda_to_host(o16, y, sizeof(o16));
    for (int i = 0; i < 6; i++)
        assert_int_equal(o16[i], 0);
    assert_int_equal(tg_cuda_gemm_cached(g), 0); /* none of these planned */
    cudaFree(buf);
    tg_cuda_gemm_free(g);
    tg_cuda_gemm_free(NULL);
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    if (!tt_cuda_have_device("no CUDA device: skipped"))
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_bias_pointer_switch),
        cmocka_unit_test(test_edges_and_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
