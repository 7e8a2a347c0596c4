/* test_gw_mem.c — the worker's start-up memory plan (gw_mem.h) and the
 * CUDA decode-graph batch buckets (gw_cuda_buckets / gw_cuda_bucket_of,
 * pure host code present in every build). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/base/tg_err.h"
#include "gpu_worker/cuda/gw_cuda.h"
#include "gpu_worker/cuda/gw_mem.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

static const struct gw_mem_need need80 = {
    .weights = 16 * GIB, .activations = 2 * GIB, .reserve = 1 * GIB,
    .page_bytes = 64 * 1024,
};

static void test_fraction_of_what_is_left(void **state)
{
    (void)state;
    struct tg_config_amount f = {.is_fraction = true, .fraction = 0.5};
    struct gw_mem_plan p;
    char err[512] = "";
    assert_int_equal(gw_mem_plan(&p, &need80, 0, &f, 79 * GIB, 80 * GIB,
                                 "GPU 0", err, sizeof(err)), 0);
    /* (79 - 19) GiB left, half of it in 64 KiB pages */
    assert_int_equal(p.pages, (int64_t)(30 * GIB / (64 * 1024)));
    assert_true(p.pool_bytes == (uint64_t)p.pages * 64 * 1024);
    assert_true(p.total_bytes == 19 * GIB + p.pool_bytes);
    assert_true(p.free_after == 30 * GIB);
    f.fraction = 1.0;
    assert_int_equal(gw_mem_plan(&p, &need80, 0, &f, 79 * GIB, 80 * GIB,
                                 "GPU 0", err, sizeof(err)), 0);
    assert_true(p.free_after < 64 * 1024);
}

static void test_bytes_and_pages(void **state)
{
    (void)state;
    struct tg_config_amount b = {.is_fraction = false, .bytes = 10 * GIB + 5};
    struct gw_mem_plan p;
    char err[512] = "";
    assert_int_equal(gw_mem_plan(&p, &need80, 0, &b, 79 * GIB, 80 * GIB, NULL,
                                 err, sizeof(err)), 0);
    assert_int_equal(p.pages, (int64_t)(10 * GIB / (64 * 1024)));
    /* kv_pages overrides kv_memory */
    assert_int_equal(gw_mem_plan(&p, &need80, 123, &b, 79 * GIB, 80 * GIB,
                                 NULL, err, sizeof(err)), 0);
    assert_int_equal(p.pages, 123);
    assert_true(p.pool_bytes == 123 * 64 * 1024);
}

static void test_model_does_not_fit(void **state)
{
    (void)state;
    struct tg_config_amount f = {.is_fraction = true, .fraction = 0.9};
    struct gw_mem_plan p;
    char err[512] = "";
    assert_int_equal(gw_mem_plan(&p, &need80, 0, &f, 18 * GIB, 24 * GIB,
                                 "GPU 3 (NVIDIA A10)", err, sizeof(err)),
                     TG_ENOMEM);
    /* the message names the device and every term in MiB */
    assert_non_null(strstr(err, "GPU 3 (NVIDIA A10)"));
    assert_non_null(strstr(err, "weights 16384.0 MiB"));
    assert_non_null(strstr(err, "activations 2048.0 MiB"));
    assert_non_null(strstr(err, "reserve 1024.0 MiB"));
    assert_non_null(strstr(err, "18432.0 MiB of 24576.0 MiB"));
    assert_non_null(strstr(err, "--tp"));
    assert_int_equal(p.pages, 0);
}

static void test_pool_does_not_fit(void **state)
{
    (void)state;
    struct tg_config_amount b = {.is_fraction = false, .bytes = 70 * GIB};
    struct gw_mem_plan p;
    char err[512] = "";
    assert_int_equal(gw_mem_plan(&p, &need80, 0, &b, 79 * GIB, 80 * GIB,
                                 "GPU 0", err, sizeof(err)), TG_ENOMEM);
    assert_non_null(strstr(err, "--kv-memory asks for 1146880 pages"));
    assert_non_null(strstr(err, "71680.0 MiB"));
    assert_non_null(strstr(err, "only 61440.0 MiB"));
    assert_non_null(strstr(err, "at most 983040 pages fit"));
    assert_int_equal(gw_mem_plan(&p, &need80, 2000000, &b, 79 * GIB,
                                 80 * GIB, "GPU 0", err, sizeof(err)),
                     TG_ENOMEM);
    assert_non_null(strstr(err, "--kv-pages"));
}

static void test_bad_inputs(void **state)
{
    (void)state;
    struct gw_mem_plan p;
    char err[512] = "";
    struct tg_config_amount f = {.is_fraction = true, .fraction = 1.5};
    assert_int_equal(gw_mem_plan(&p, &need80, 0, &f, 79 * GIB, 80 * GIB,
                                 NULL, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "outside (0, 1]"));
    f.fraction = 0.0;
    assert_int_equal(gw_mem_plan(&p, &need80, 0, &f, 79 * GIB, 80 * GIB,
                                 NULL, err, sizeof(err)), TG_EINVAL);
    struct tg_config_amount tiny = {.is_fraction = false, .bytes = 1000};
    assert_int_equal(gw_mem_plan(&p, &need80, 0, &tiny, 79 * GIB, 80 * GIB,
                                 NULL, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "0 pages"));
    struct gw_mem_need zero = need80;
    zero.page_bytes = 0;
    assert_int_equal(gw_mem_plan(&p, &zero, 10, NULL, 79 * GIB, 80 * GIB,
                                 NULL, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(gw_mem_plan(&p, &need80, 0, NULL, 79 * GIB, 80 * GIB,
                                 NULL, err, sizeof(err)), TG_EINVAL);
    struct gw_mem_need wrap = need80;
    wrap.activations = UINT64_MAX - 4 * GIB;
    assert_int_equal(gw_mem_plan(&p, &wrap, 10, NULL, 79 * GIB, 80 * GIB,
                                 NULL, err, sizeof(err)), TG_EINVAL);
}

static void test_buckets(void **state)
{
    (void)state;
    int b[GW_CUDA_MAX_BUCKETS];
    int n = gw_cuda_buckets(256, b, GW_CUDA_MAX_BUCKETS);
    const int want[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192,
                        224, 256};
    assert_int_equal(n, (int)(sizeof(want) / sizeof(want[0])));
    for (int i = 0; i < n; i++)
        assert_int_equal(b[i], want[i]);
    /* the largest batch is always a bucket, never padded past it */
    n = gw_cuda_buckets(20, b, GW_CUDA_MAX_BUCKETS);
    assert_int_equal(n, 6);
    assert_int_equal(b[n - 1], 20);
    assert_int_equal(b[n - 2], 16);
    n = gw_cuda_buckets(1, b, GW_CUDA_MAX_BUCKETS);
    assert_int_equal(n, 1);
    assert_int_equal(b[0], 1);
    n = gw_cuda_buckets(100, b, 4); /* capped: the last one is max_seqs */
    assert_int_equal(n, 4);
    assert_int_equal(b[3], 100);
    n = gw_cuda_buckets(4096, b, GW_CUDA_MAX_BUCKETS);
    assert_int_equal(n, GW_CUDA_MAX_BUCKETS);
    assert_int_equal(b[n - 1], 4096);
    for (int i = 1; i < n; i++)
        assert_true(b[i] > b[i - 1]);

    n = gw_cuda_buckets(256, b, GW_CUDA_MAX_BUCKETS);
    assert_int_equal(gw_cuda_bucket_of(b, n, 0), -1);
    assert_int_equal(b[gw_cuda_bucket_of(b, n, 1)], 1);
    assert_int_equal(b[gw_cuda_bucket_of(b, n, 3)], 4);
    assert_int_equal(b[gw_cuda_bucket_of(b, n, 17)], 24);
    assert_int_equal(b[gw_cuda_bucket_of(b, n, 65)], 96);
    assert_int_equal(b[gw_cuda_bucket_of(b, n, 256)], 256);
    assert_int_equal(gw_cuda_bucket_of(b, n, 257), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fraction_of_what_is_left),
        cmocka_unit_test(test_bytes_and_pages),
        cmocka_unit_test(test_model_does_not_fit),
        cmocka_unit_test(test_pool_does_not_fit),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_buckets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
