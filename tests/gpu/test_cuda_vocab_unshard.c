/* test_cuda_vocab_unshard.c — the vocab-parallel logits reorder on the
 * device (kernels/cuda/vocab_unshard.h) against the host rule of
 * gw_cuda.c: out[i, r*Vp + j] = gathered[r, i, j], padding columns
 * dropped, for several (T, rows, Vp, V) including V == T * Vp, a last
 * rank holding nothing, and one row. Argument errors run without a
 * device; the rest reports skipped (77) there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/vocab_unshard.h"

static void test_bad_arguments(void **state)
{
    (void)state;
    float a[4] = {0}, b[4] = {0};
    assert_int_equal(tg_cuda_vocab_unshard(a, 0, 1, 2, 2, b, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_vocab_unshard(a, 2, -1, 2, 2, b, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_vocab_unshard(a, 2, 1, 0, 2, b, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_vocab_unshard(a, 2, 1, 2, 5, b, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_vocab_unshard(NULL, 2, 1, 2, 3, b, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_vocab_unshard(a, 2, 1, 2, 3, NULL, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_vocab_unshard(a, 2, 1, 2, 3, a + 1, NULL), TG_EINVAL);
    assert_int_equal(tg_cuda_vocab_unshard(a, 2, 70000, 40000, 70000, b, NULL),
                     TG_EINVAL);
    /* no rows: nothing queued, pointers not needed */
    assert_int_equal(tg_cuda_vocab_unshard(NULL, 2, 0, 2, 3, NULL, NULL), 0);
}

static void check_case(int T, int rows, int Vp, int V)
{
    size_t gn = (size_t)T * rows * Vp, on = (size_t)rows * V;
    float *g = malloc(gn * sizeof(float)), *want = malloc(on * sizeof(float));
    float *got = malloc(on * sizeof(float));
    assert_non_null(g);
    assert_non_null(want);
    assert_non_null(got);
    for (size_t e = 0; e < gn; e++)
        g[e] = (float)e * 0.5f - 3.0f;
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < V; c++)
            want[(size_t)i * V + c] =
                g[((size_t)(c / Vp) * rows + i) * Vp + (size_t)(c % Vp)];
    float *dg = tt_cuda_upload(g, gn * sizeof(float));
    float *dout = tt_cuda_alloc((on + 1) * sizeof(float));
    /* a guard element after out must stay untouched */
    float guard = 12345.0f;
    tt_cuda_to_dev(dout + on, &guard, sizeof(float));
    assert_int_equal(tg_cuda_vocab_unshard(dg, T, rows, Vp, V, dout, NULL), 0);
    tt_cuda_sync_to_host(got, dout, on * sizeof(float));
    float after = 0;
    tt_cuda_to_host(&after, dout + on, sizeof(float));
    assert_memory_equal(got, want, on * sizeof(float));
    assert_true(after == guard);
    cudaFree(dg);
    cudaFree(dout);
    free(g);
    free(want);
    free(got);
}

static void test_reorder(void **state)
{
    (void)state;
    check_case(1, 3, 11, 11);   /* one rank: a copy */
    check_case(2, 4, 8, 16);    /* V == T * Vp */
    check_case(3, 5, 7, 19);    /* padded last rank */
    check_case(4, 1, 2, 5);     /* ranks 3 holds nothing (5 = 2+2+1) */
    check_case(8, 33, 19000, 151669); /* Qwen-sized vocabulary */
}
#endif

int main(void)
{
#ifndef TANGRAM_CUDA
    return tt_cuda_skip("built without CUDA");
#else
    const struct CMUnitTest args[] = {cmocka_unit_test(test_bad_arguments)};
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reorder)};
    return tt_cuda_run_tests("args", args, TT_COUNT(args),
                             "skipped: no CUDA device", "tests", tests,
                             TT_COUNT(tests));
#endif
}
