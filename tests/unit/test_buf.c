/* test_buf.c — the byte buffer (common/base/tg_buf.h): a zeroed buffer is
 * empty and reads as ""; appends of bytes (NULs included), characters,
 * strings and printf text of any length (far beyond any scratch size)
 * keep the text terminated; reserve keeps data in place; truncate and
 * reset; steal hands over the string and zeroes the buffer ("" for an
 * empty one); and a failure (a size that cannot be allocated) is sticky:
 * later appends do nothing, the text before it stays whole, steal gives
 * NULL, reset clears it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_err.h"

/* An allocation far beyond the address space must fail with NULL, not
 * abort the test: ASan's default is to report it as an error. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

static void test_zeroed(void **state)
{
    (void)state;
    struct tg_buf b = {0};
    assert_string_equal(tg_buf_str(&b), "");
    assert_int_equal(b.len, 0);
    assert_false(tg_buf_failed(&b));
    /* Appending nothing still gives a terminated string. */
    assert_int_equal(tg_buf_append(&b, "", 0), 0);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    tg_buf_free(&b);
    tg_buf_free(&b); /* twice is fine */
    assert_null(b.data);
}

static void test_appends(void **state)
{
    (void)state;
    struct tg_buf b = {0};
    assert_int_equal(tg_buf_puts(&b, "abc"), 0);
    assert_int_equal(tg_buf_putc(&b, '-'), 0);
    assert_int_equal(tg_buf_append(&b, "x\0y", 3), 0);
    assert_int_equal(tg_buf_printf(&b, "[%d %s]", 42, "z"), 0);
    assert_int_equal(b.len, 4 + 3 + 6);
    assert_memory_equal(b.data, "abc-x\0y[42 z]", b.len + 1);
    assert_true(b.cap > b.len);
    /* Many small appends, one at a time through every growth. */
    struct tg_buf c = {0};
    for (int i = 0; i < 100000; i++) {
        assert_int_equal(tg_buf_putc(&c, (char)('a' + i % 26)), 0);
        assert_int_equal(c.data[c.len], '\0');
    }
    assert_int_equal(c.len, 100000);
    for (int i = 0; i < 100000; i++)
        assert_int_equal(c.data[i], 'a' + i % 26);
    tg_buf_free(&c);
    tg_buf_free(&b);
}

static void test_printf_long(void **state)
{
    (void)state;
    /* Longer than any scratch buffer and than the spare room, at the
     * start and after text. */
    char *big = malloc(20001);
    assert_non_null(big);
    memset(big, 'q', 20000);
    big[20000] = '\0';
    struct tg_buf b = {0};
    assert_int_equal(tg_buf_printf(&b, "<%s>", big), 0);
    assert_int_equal(b.len, 20002);
    assert_int_equal(b.data[0], '<');
    assert_int_equal(b.data[20001], '>');
    assert_int_equal(b.data[20002], '\0');
    assert_int_equal(tg_buf_printf(&b, "%s|%s", big, big), 0);
    assert_int_equal(b.len, 20002 + 40001);
    assert_int_equal(b.data[20002 + 20000], '|');
    assert_int_equal(strlen(b.data), b.len);
    /* An empty format appends nothing. */
    size_t len = b.len;
    assert_int_equal(tg_buf_printf(&b, "%s", ""), 0);
    assert_int_equal(b.len, len);
    tg_buf_free(&b);
    free(big);
}

static void test_reserve_truncate_reset(void **state)
{
    (void)state;
    struct tg_buf b = {0};
    assert_int_equal(tg_buf_reserve(&b, 1000), 0);
    assert_string_equal(b.data, "");
    char *at = b.data;
    for (int i = 0; i < 1000; i++)
        tg_buf_putc(&b, 'k');
    assert_ptr_equal(b.data, at); /* the reservation held */
    tg_buf_truncate(&b, 3);
    assert_string_equal(b.data, "kkk");
    tg_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    assert_ptr_equal(b.data, at); /* storage kept */
    tg_buf_free(&b);
}

static void test_steal(void **state)
{
    (void)state;
    struct tg_buf b = {0};
    size_t len = 99;
    char *s = tg_buf_steal(&b, &len);
    assert_non_null(s);
    assert_string_equal(s, "");
    assert_int_equal(len, 0);
    free(s);
    tg_buf_printf(&b, "%s=%d", "k", 7);
    s = tg_buf_steal(&b, &len);
    assert_string_equal(s, "k=7");
    assert_int_equal(len, 3);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
    free(s);
    /* The buffer is usable again. */
    tg_buf_puts(&b, "again");
    s = tg_buf_steal(&b, NULL);
    assert_string_equal(s, "again");
    free(s);
}

static void test_failure_is_sticky(void **state)
{
    (void)state;
    struct tg_buf b = {0};
    tg_buf_puts(&b, "head");
    /* An overflowing size, then one that cannot be allocated. */
    assert_int_equal(tg_buf_reserve(&b, SIZE_MAX - 2), TG_ENOMEM);
    assert_true(tg_buf_failed(&b));
    assert_string_equal(b.data, "head");
    struct tg_buf c = {0};
    tg_buf_puts(&c, "head");
    volatile size_t huge = SIZE_MAX / 4; /* unknown to the compiler */
    assert_int_equal(tg_buf_append(&c, "x", huge), TG_ENOMEM);
    assert_true(tg_buf_failed(&c));
    assert_string_equal(c.data, "head");
    /* Nothing appends after a failure: no text with a hole in it. */
    assert_int_equal(tg_buf_puts(&c, "tail"), TG_ENOMEM);
    assert_int_equal(tg_buf_putc(&c, 't'), TG_ENOMEM);
    assert_int_equal(tg_buf_printf(&c, "%d", 1), TG_ENOMEM);
    assert_int_equal(tg_buf_reserve(&c, 1), TG_ENOMEM);
    assert_string_equal(c.data, "head");
    assert_int_equal(c.len, 4);
    /* Steal refuses the failed text and frees it. */
    size_t len = 5;
    assert_null(tg_buf_steal(&c, &len));
    assert_int_equal(len, 0);
    assert_null(c.data);
    assert_false(tg_buf_failed(&c));
    /* Reset clears the failure. */
    tg_buf_reset(&b);
    assert_int_equal(tg_buf_puts(&b, "ok"), 0);
    assert_string_equal(b.data, "ok");
    tg_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zeroed),
        cmocka_unit_test(test_appends),
        cmocka_unit_test(test_printf_long),
        cmocka_unit_test(test_reserve_truncate_reset),
        cmocka_unit_test(test_steal),
        cmocka_unit_test(test_failure_is_sticky),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
