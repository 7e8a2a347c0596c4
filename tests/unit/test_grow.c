/* test_grow.c — the growable-array helper (common/base/tg_grow.h): doubling
 * from the minimum, an exact need, a capacity already large enough, byte
 * sizes that overflow size_t (or the signed capacity types) refused before
 * any allocation, and a failed allocation that leaves the array intact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* An allocation far beyond the address space must fail with NULL, not
 * abort the test: ASan's default is to report it as an error. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

static void test_doubling(void **state)
{
    (void)state;
    int32_t *v = NULL;
    size_t cap = 0;
    assert_int_equal(TG_GROW(v, &cap, 1), 0);
    assert_non_null(v);
    assert_int_equal(cap, TG_GROW_MIN);
    for (int32_t i = 0; i < TG_GROW_MIN; i++)
        v[i] = i;
    /* Already room: nothing moves. */
    int32_t *same = v;
    assert_int_equal(TG_GROW(v, &cap, TG_GROW_MIN), 0);
    assert_ptr_equal(v, same);
    assert_int_equal(cap, TG_GROW_MIN);
    /* One more doubles; the contents survive. */
    assert_int_equal(TG_GROW(v, &cap, TG_GROW_MIN + 1), 0);
    assert_int_equal(cap, 2 * TG_GROW_MIN);
    for (int32_t i = 0; i < TG_GROW_MIN; i++)
        assert_int_equal(v[i], i);
    /* A need far above doubles until it is covered (a power-of-two
     * multiple of the minimum). */
    assert_int_equal(TG_GROW(v, &cap, 1000), 0);
    assert_int_equal(cap, 1024);
    /* Appending one at a time reallocates O(log n) times. */
    int moves = 0;
    for (size_t n = cap; n < 100000; n++) {
        size_t before = cap;
        assert_int_equal(TG_GROW(v, &cap, n + 1), 0);
        moves += cap != before;
        v[n] = (int32_t)n;
    }
    assert_int_equal(moves, 7); /* 1024 -> 131072 */
    assert_int_equal(v[99999], 99999);
    free(v);
}

static void test_exact_need(void **state)
{
    (void)state;
    /* A first need above the minimum doubles from it until covered. */
    char *b = NULL;
    size_t cap = 0;
    assert_int_equal(TG_GROW(b, &cap, 100), 0);
    assert_int_equal(cap, 128);
    /* A need equal to the capacity is met: no reallocation. */
    char *same = b;
    assert_int_equal(TG_GROW(b, &cap, 128), 0);
    assert_ptr_equal(b, same);
    assert_int_equal(cap, 128);
    free(b);
    b = NULL;
    cap = 0;
    /* Zero needs nothing: no allocation. */
    assert_int_equal(TG_GROW(b, &cap, 0), 0);
    assert_null(b);
    assert_int_equal(cap, 0);
    /* A caller's odd capacity doubles from where it is. */
    b = malloc(3);
    assert_non_null(b);
    cap = 3;
    assert_int_equal(TG_GROW(b, &cap, 4), 0);
    assert_int_equal(cap, 6);
    free(b);
}

static void test_signed_caps(void **state)
{
    (void)state;
    double *d = NULL;
    int64_t cap64 = 0;
    assert_int_equal(TG_GROW(d, &cap64, 17), 0);
    assert_int_equal(cap64, 32);
    assert_int_equal(TG_GROW(d, &cap64, -1), TG_EINVAL);
    assert_int_equal(cap64, 32);
    free(d);
    uint8_t *u = NULL;
    int32_t cap32 = 0;
    assert_int_equal(TG_GROW(u, &cap32, 5), 0);
    assert_int_equal(cap32, TG_GROW_MIN);
    /* Beyond the int32 range is refused before any allocation. */
    uint8_t *keep = u;
    assert_int_equal(TG_GROW(u, &cap32, (int64_t)INT32_MAX + 1), TG_ENOMEM);
    assert_ptr_equal(u, keep);
    assert_int_equal(cap32, TG_GROW_MIN);
    free(u);
}

static void test_overflow_refused(void **state)
{
    (void)state;
    uint64_t *v = NULL;
    size_t cap = 0;
    assert_int_equal(TG_GROW(v, &cap, 4), 0);
    v[3] = 42;
    uint64_t *keep = v;
    /* need * 8 overflows size_t. */
    assert_int_equal(TG_GROW(v, &cap, SIZE_MAX / 4), TG_ENOMEM);
    assert_ptr_equal(v, keep);
    assert_int_equal(cap, TG_GROW_MIN);
    assert_int_equal(v[3], 42);
    assert_int_equal(tg_grow((void **)&v, &cap, SIZE_MAX, 1), TG_ENOMEM);
    assert_int_equal(cap, TG_GROW_MIN);
    /* A zero element size is a caller's mistake, not an allocation. */
    assert_int_equal(tg_grow((void **)&v, &cap, 100, 0), TG_EINVAL);
    assert_int_equal(cap, TG_GROW_MIN);
    free(v);
}

static void test_failure_keeps_array(void **state)
{
    (void)state;
    uint64_t *v = NULL;
    size_t cap = 0;
    assert_int_equal(TG_GROW(v, &cap, 20), 0);
    for (int i = 0; i < 20; i++)
        v[i] = (uint64_t)i * 3;
    uint64_t *keep = v;
    size_t keep_cap = cap;
    /* Fits size_t (2^61 bytes) but no address space: realloc fails. */
    assert_int_equal(TG_GROW(v, &cap, (size_t)1 << 58), TG_ENOMEM);
    assert_ptr_equal(v, keep);
    assert_int_equal(cap, keep_cap);
    for (int i = 0; i < 20; i++)
        assert_int_equal(v[i], (uint64_t)i * 3);
    /* Still usable afterwards. */
    assert_int_equal(TG_GROW(v, &cap, 100), 0);
    assert_int_equal(v[19], 57);
    free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doubling),
        cmocka_unit_test(test_exact_need),
        cmocka_unit_test(test_signed_caps),
        cmocka_unit_test(test_overflow_refused),
        cmocka_unit_test(test_failure_keeps_array),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
