/* test_kv_table_dev.c — the device block table: upload dense and padded
 * tables of random batches (growing the device buffers between uploads)
 * and check the lookup kernel against the CPU reference
 * kv_table_resolve_batch, out-of-range queries included. Skipped (77)
 * without CUDA or a device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/kv/kv_table.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include "kernels/cuda/kv_table_dev.h"
#endif

#ifdef TANGRAM_CUDA
static char err[256];
static struct tt_xrng rng = {0x853c49e6748fea9bull};

/* Random queries over the table, a quarter of them out of range, resolved
 * on the device and on the host; both must agree exactly. */
static void check_queries(const struct kv_table *t,
                          const struct tg_cuda_kv_table_dev *dt, int32_t n)
{
    int32_t *rows = malloc((size_t)n * sizeof(int32_t));
    int32_t *toks = malloc((size_t)n * sizeof(int32_t));
    int32_t *pg = malloc((size_t)n * sizeof(int32_t));
    int32_t *sl = malloc((size_t)n * sizeof(int32_t));
    int32_t *pg_ref = malloc((size_t)n * sizeof(int32_t));
    int32_t *sl_ref = malloc((size_t)n * sizeof(int32_t));
    assert_non_null(rows);
    assert_non_null(toks);
    assert_non_null(pg);
    assert_non_null(sl);
    assert_non_null(pg_ref);
    assert_non_null(sl_ref);
    for (int32_t i = 0; i < n; i++) {
        int32_t r = tt_xrng_int(&rng, 0, t->n_rows > 0 ? t->n_rows - 1 : 0);
        int32_t cap = t->n_rows > 0 ? t->npages[r] * t->page_size : 0;
        rows[i] = r;
        toks[i] = tt_xrng_int(&rng, 0, cap > 0 ? cap - 1 : 0);
        switch (tt_xrng_int64(&rng, 0, 7)) {
        case 0: rows[i] = -1 - tt_xrng_int(&rng, 0, 5); break;
        case 1: rows[i] = t->n_rows + tt_xrng_int(&rng, 0, 5); break;
        case 2: toks[i] = cap + tt_xrng_int(&rng, 0, 40); break;
        case 3: toks[i] = -1; break;
        default: break;
        }
    }
    kv_table_resolve_batch(t, n, rows, toks, pg_ref, sl_ref);
    assert_int_equal(
        tg_cuda_kv_table_dev_resolve_host(dt, n, rows, toks, pg, sl), 0);
    assert_memory_equal(pg, pg_ref, (size_t)n * sizeof(int32_t));
    assert_memory_equal(sl, sl_ref, (size_t)n * sizeof(int32_t));
    free(rows);
    free(toks);
    free(pg);
    free(sl);
    free(pg_ref);
    free(sl_ref);
}

static void test_upload_and_resolve(void **state)
{
    (void)state;
    struct tg_cuda_kv_table_dev dt;
    tg_cuda_kv_table_dev_init(&dt);
    struct kv_table t;
    assert_int_equal(kv_table_init(&t, 0, 0, err, sizeof(err)), 0);
    for (int iter = 0; iter < 6; iter++) {
        int L = tt_xrng_int(&rng, 1, 16), G = tt_xrng_int(&rng, 1, 8),
            P = tt_xrng_int(&rng, 1, 32);
        double *b = malloc((size_t)(L * G) * sizeof(double));
        assert_non_null(b);
        for (int r = 0; r < L * G; r++)
            b[r] = (double)tt_xrng_int64(&rng, 10, 1000) / 1000.0;
        struct kv_forced_rule rule = kv_forced_rule_snapkv();
        struct kv_layout lo;
        assert_int_equal(kv_layout_init(&lo, L, G, 2, 64, P, 512, &rule, b,
                                        err, sizeof(err)), 0);
        free(b);
        /* Batches grow with iter so the device buffers must grow. */
        int n = 1 + iter * 20;
        struct kv_pool pool;
        assert_int_equal(kv_pool_init(&pool, 1 << 23, err, sizeof(err)), 0);
        struct kv_seq *seqs = calloc((size_t)n, sizeof(*seqs));
        const struct kv_seq **batch = calloc((size_t)n, sizeof(*batch));
        assert_non_null(seqs);
        assert_non_null(batch);
        for (int s = 0; s < n; s++) {
            assert_int_equal(kv_seq_init(&seqs[s], &lo, err, sizeof(err)), 0);
            batch[s] = tt_xrng_int64(&rng, 0, 5) == 0 ? NULL : &seqs[s];
            assert_int_equal(kv_seq_reserve_prompt(&seqs[s], &lo, &pool, 0,
                                                   tt_xrng_int64(&rng, 0, 4000),
                                                   err, sizeof(err)), 0);
        }
        if (iter % 2 == 0)
            assert_int_equal(kv_table_build(&t, &lo, batch, n, err,
                                            sizeof(err)), 0);
        else
            assert_int_equal(kv_table_build_padded(&t, &lo, batch, n, 3, err,
                                                   sizeof(err)), 0);
        assert_int_equal(tg_cuda_kv_table_dev_upload(&dt, &t, NULL), 0);
        assert_int_equal(dt.n_rows, t.n_rows);
        assert_true(dt.cap_slots >= t.n_slots);
        check_queries(&t, &dt, 5000);
        for (int s = 0; s < n; s++)
            kv_seq_free(&seqs[s], &pool);
        free(seqs);
        free(batch);
        kv_pool_free(&pool);
        kv_layout_free(&lo);
    }
    kv_table_free(&t);
    tg_cuda_kv_table_dev_free(&dt);
    tg_cuda_kv_table_dev_free(&dt); /* zeroed: safe again */
}

static void test_bad_arguments(void **state)
{
    (void)state;
    struct tg_cuda_kv_table_dev dt;
    tg_cuda_kv_table_dev_init(&dt);
    int32_t q = 0, out = 0;
    /* Nothing uploaded yet. */
    assert_int_equal(
        tg_cuda_kv_table_dev_resolve(&dt, 1, &q, &q, &out, &out, NULL),
        TG_EINVAL);
    assert_int_equal(
        tg_cuda_kv_table_dev_resolve(&dt, -1, &q, &q, &out, &out, NULL),
        TG_EINVAL);
    assert_int_equal(
        tg_cuda_kv_table_dev_resolve(&dt, 0, NULL, NULL, NULL, NULL, NULL), 0);
    assert_int_equal(tg_cuda_kv_table_dev_upload(&dt, NULL, NULL), TG_EINVAL);
    assert_int_equal(
        tg_cuda_kv_table_dev_resolve_host(&dt, 1, NULL, &q, &out, &out),
        TG_EINVAL);
    /* An empty table uploads, and every query on it is out of range. */
    struct kv_table t;
    assert_int_equal(kv_table_init(&t, 0, 0, err, sizeof(err)), 0);
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    double b = 0.5;
    struct kv_layout lo;
    assert_int_equal(kv_layout_init(&lo, 1, 1, 1, 8, 16, 64, &rule, &b, err,
                                    sizeof(err)), 0);
    assert_int_equal(kv_table_build(&t, &lo, NULL, 0, err, sizeof(err)), 0);
    assert_int_equal(tg_cuda_kv_table_dev_upload(&dt, &t, NULL), 0);
    int32_t page = 7, slot = 7;
    assert_int_equal(
        tg_cuda_kv_table_dev_resolve_host(&dt, 1, &q, &q, &page, &slot), 0);
    assert_int_equal(page, -1);
    assert_int_equal(slot, -1);
    kv_layout_free(&lo);
    kv_table_free(&t);
    tg_cuda_kv_table_dev_free(&dt);
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    if (!tt_cuda_have_device("no CUDA device: skipped"))
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_and_resolve),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
