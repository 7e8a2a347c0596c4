/* test_cuda_device.c — the device probe works, or the test reports skipped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "common/base/tg_err.h"
#include "tests/support/tt_cuda.h"
#ifdef TANGRAM_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

static void test_query(void **state)
{
    (void)state;
#ifdef TANGRAM_CUDA
    struct tg_cuda_device_info info;
    assert_int_equal(tg_cuda_device_query(0, &info), 0);
    assert_true(info.sm_count > 0);
    assert_true(info.cc_major >= 8);
    assert_int_equal(tg_cuda_device_query(-1, &info), TG_EINVAL);
#endif
}

int main(void)
{
#ifdef TANGRAM_CUDA
    if (!tt_cuda_have_device("no CUDA device: skipped"))
        return 77;
#else
    return tt_cuda_skip("built without CUDA");
#endif
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_query)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
