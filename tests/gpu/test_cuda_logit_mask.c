/* test_cuda_logit_mask.c — structured outputs' token masks on the device
 * (kernels/cuda/logit_mask.h) against the CPU op (tg_ops_cpu.logits_mask):
 *   - a mixed batch (some rows masked, others not) over vocabularies of
 *     1, 31, 32, 33, 1000 and 151669 ids (Qwen3): every logit equals the
 *     CPU's bit for bit, rows without a mask are untouched;
 *   - what the samplers then see: the device's greedy tokens, top-5
 *     logprobs and seeded draws (temperature 1, 64 seeds per row) name only
 *     allowed ids, and greedy and the top-5 equal the CPU sampler's over
 *     the CPU-masked row;
 *   - bad arguments are refused without a device.
 * Skipped (77) without CUDA or a device (the argument checks still run). */
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

#include "kernels/cuda/logit_mask.h"
#include "kernels/cuda/sample.h"

#define ROWS 6
#define TOP 5

static struct tt_xrng rng = {0x9e3779b97f4a7c15ull};

static int masked_row(int i)
{
    return i % 3 != 1;
} /* rows 1, 4: none */

/* Row i's mask: a different density per row (every id, about half, about
 * one in 64, exactly one id). */
static void make_mask(uint32_t *m, int words, int V, int i)
{
    memset(m, 0, (size_t)words * 4);
    for (int j = 0; j < V; j++) {
        uint64_t r = tt_xrng_next(&rng);
        int on = i == 0   ? 1
                 : i == 2 ? (int)(r & 1)
                 : i == 3 ? (r % 64) == 0
                          : 0;
        if (on)
            m[j >> 5] |= 1u << (j & 31);
    }
    if (i == 5 || i == 3)
        m[(V - 1) >> 5] |= 1u << ((V - 1) & 31); /* at least one */
}

static int allowed(const uint32_t *m, int32_t id)
{
    return (m[id >> 5] >> (id & 31)) & 1u;
}

static void one_vocab(int V)
{
    int words = (V + 31) / 32;
    size_t nx = (size_t)ROWS * (size_t)V;
    float *x = malloc(nx * sizeof(float)), *ref = malloc(nx * sizeof(float));
    float *got = malloc(nx * sizeof(float));
    uint32_t *mask = calloc((size_t)ROWS * words, 4);
    assert_true(x && ref && got && mask);
    for (size_t j = 0; j < nx; j++)
        x[j] = 4.0f * tt_xrng_sym(&rng);
    memcpy(ref, x, nx * sizeof(float));
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(0, &cpu), 0);
    int32_t rows[ROWS];
    uint32_t *packed = calloc((size_t)ROWS * words, 4);
    assert_non_null(packed);
    int n = 0;
    for (int i = 0; i < ROWS; i++) {
        make_mask(mask + (size_t)i * words, words, V, i);
        if (!masked_row(i))
            continue;
        assert_int_equal(tg_ops_cpu.logits_mask(cpu, ref + (size_t)i * V, V,
                                                mask + (size_t)i * words),
                         0);
        rows[n] = i;
        memcpy(packed + (size_t)n * words, mask + (size_t)i * words,
               (size_t)words * 4);
        n++;
    }
    float *dx = tt_cuda_upload(x, nx * sizeof(float));
    int32_t *drows = tt_cuda_upload(rows, (size_t)n * sizeof(int32_t));
    uint32_t *dm = tt_cuda_upload(packed, (size_t)n * words * 4);
    assert_int_equal(tg_cuda_logit_mask_apply(dx, V, drows, dm, words, n, NULL),
                     0);
    tt_cuda_sync_to_host(got, dx, nx * sizeof(float));
    assert_memory_equal(got, ref, nx * sizeof(float));

    /* The samplers over the masked rows. */
    int k = TOP < V ? TOP : V;
    int32_t *dk = tt_cuda_alloc(ROWS * sizeof(int32_t));
    int32_t *dtop = tt_cuda_alloc((size_t)ROWS * k * sizeof(int32_t));
    float *dtlp = tt_cuda_alloc((size_t)ROWS * k * sizeof(float));
    int32_t greedy[ROWS], top[ROWS * TOP];
    float tlp[ROWS * TOP];
    assert_int_equal(tg_cuda_argmax(dx, ROWS, V, dk, NULL), 0);
    assert_int_equal(tg_cuda_topk_logprobs(dx, ROWS, V, k, dtop, dtlp, NULL),
                     0);
    tt_cuda_sync_to_host(greedy, dk, ROWS * sizeof(int32_t));
    tt_cuda_sync_to_host(top, dtop, (size_t)ROWS * k * sizeof(int32_t));
    tt_cuda_sync_to_host(tlp, dtlp, (size_t)ROWS * k * sizeof(float));
    const struct tg_sampling greedy_sp = TG_SAMPLING_OFF;
    for (int i = 0; i < ROWS; i++) {
        const uint32_t *m = mask + (size_t)i * words;
        int32_t tok = -1, cid[TOP];
        float lp, clp[TOP];
        float *row = malloc((size_t)V * sizeof(float));
        assert_non_null(row);
        memcpy(row, ref + (size_t)i * V, (size_t)V * sizeof(float));
        assert_int_equal(tg_ops_cpu.sample(cpu, row, V, &greedy_sp, NULL, NULL,
                                           &tok, &lp, k, cid, clp),
                         0);
        free(row);
        assert_int_equal(greedy[i], tok);
        if (masked_row(i))
            assert_true(allowed(m, greedy[i]));
        for (int t = 0; t < k; t++) {
            /* Allowed alternatives agree; masked ones have no probability
             * on either side. */
            if (isinf(clp[t])) {
                assert_true(isinf(tlp[i * k + t]) || tlp[i * k + t] < -1e30f);
                continue;
            }
            assert_int_equal(top[i * k + t], cid[t]);
            assert_true(fabsf(tlp[i * k + t] - clp[t]) <= 1e-4f);
            if (masked_row(i))
                assert_true(allowed(m, cid[t]));
        }
    }
    /* Seeded draws at temperature 1: only allowed ids. */
    struct tg_cuda_sampler *s = NULL;
    char err[256];
    assert_int_equal(tg_cuda_sampler_new(V, ROWS, &s, err, sizeof(err)), 0);
    struct tg_cuda_sample_params p[ROWS];
    for (int seed = 0; seed < 64; seed++) {
        for (int i = 0; i < ROWS; i++)
            p[i] = (struct tg_cuda_sample_params){.temperature = 1.0f,
                                                  .top_k = 0,
                                                  .top_p = 1.0f,
                                                  .min_p = 0.0f,
                                                  .seed = (uint64_t)seed,
                                                  .step = (uint64_t)i};
        assert_int_equal(tg_cuda_sample(s, dx, ROWS, V, p, dk, NULL, NULL), 0);
        tt_cuda_sync_to_host(greedy, dk, ROWS * sizeof(int32_t));
        for (int i = 0; i < ROWS; i++)
            if (masked_row(i))
                assert_true(allowed(mask + (size_t)i * words, greedy[i]));
    }
    tg_cuda_sampler_free(s);
    cudaFree(dx);
    cudaFree(drows);
    cudaFree(dm);
    cudaFree(dk);
    cudaFree(dtop);
    cudaFree(dtlp);
    tg_backend_cpu_free(cpu);
    free(x);
    free(ref);
    free(got);
    free(mask);
    free(packed);
}

static void test_mixed_batch_vs_cpu(void **state)
{
    (void)state;
    const int vocabs[] = {1, 31, 32, 33, 1000, 151669};
    for (size_t v = 0; v < sizeof(vocabs) / sizeof(vocabs[0]); v++)
        one_vocab(vocabs[v]);
}

/* Refused before any launch: no device needed. */
static void test_bad_arguments(void **state)
{
    (void)state;
    float f = 0.0f;
    int32_t r = 0;
    uint32_t m = 1;
    assert_int_equal(tg_cuda_logit_mask_apply(&f, 0, &r, &m, 1, 1, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_logit_mask_apply(&f, 64, &r, &m, 1, 1, NULL),
                     TG_EINVAL); /* 64 ids need 2 words */
    assert_int_equal(tg_cuda_logit_mask_apply(&f, 1, &r, &m, 1, -1, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_logit_mask_apply(NULL, 1, &r, &m, 1, 1, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_logit_mask_apply(&f, 1, NULL, &m, 1, 1, NULL),
                     TG_EINVAL);
    assert_int_equal(tg_cuda_logit_mask_apply(NULL, 1, NULL, NULL, 1, 0, NULL),
                     0); /* nothing to do */
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    const struct CMUnitTest host[] = {
        cmocka_unit_test(test_bad_arguments),
    };
    const struct CMUnitTest dev[] = {
        cmocka_unit_test(test_mixed_batch_vs_cpu),
    };
    return tt_cuda_run_tests("logit_mask_args", host, 1,
                             "no CUDA device: skipped", "logit_mask", dev, 1);
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
