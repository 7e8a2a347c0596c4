/* test_gw_callwatch.c — the trigger watch of a triggered constraint
 * (gpu_worker/serve/gw_callwatch.h):
 *   - a trigger inside one token, after text in the same token, and with
 *     bytes after it: the bytes handed out start at its first byte;
 *   - a trigger split over several tokens, one byte per token, and a
 *     near miss that must not match;
 *   - reset forgets a pending partial trigger;
 *   - anchored: whitespace first is fine, any other first byte makes the
 *     output free for good, a trigger later in the text does not count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/base/tg_err.h"
#include "gpu_worker/serve/gw_callwatch.h"

static int feed(struct gw_callwatch *w, const char *s, const char **call,
                size_t *n)
{
    const uint8_t *c = NULL;
    int rc = gw_callwatch_feed(w, (const uint8_t *)s, strlen(s), &c, n);
    *call = (const char *)c;
    return rc;
}

static void expect_call(struct gw_callwatch *w, const char *tok,
                        const char *want)
{
    const char *call;
    size_t n;
    assert_int_equal(feed(w, tok, &call, &n), 1);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(call, want, n);
}

static void expect_none(struct gw_callwatch *w, const char *tok)
{
    const char *call;
    size_t n;
    assert_int_equal(feed(w, tok, &call, &n), 0);
    assert_null(call);
}

static void test_one_token(void **state)
{
    (void)state;
    struct gw_callwatch w;
    assert_int_equal(gw_callwatch_init(&w, "<tool_call>", 11, 0), 0);
    expect_none(&w, "Let me check.");
    expect_call(&w, "<tool_call>", "<tool_call>");
    gw_callwatch_reset(&w);
    expect_call(&w, " ok<tool_call>\n{", "<tool_call>\n{");
    gw_callwatch_free(&w);
    assert_int_equal(gw_callwatch_init(&w, "", 0, 0), TG_EINVAL);
    gw_callwatch_free(&w);
}

static void test_split(void **state)
{
    (void)state;
    struct gw_callwatch w;
    assert_int_equal(gw_callwatch_init(&w, "<tool_call>", 11, 0), 0);
    expect_none(&w, "text <to");
    expect_none(&w, "ol_c");
    expect_call(&w, "all>\n{\"", "<tool_call>\n{\"");
    gw_callwatch_reset(&w);
    const char *t = "<tool_call>";
    char one[2] = {0, 0};
    for (int i = 0; i < 10; i++) {
        one[0] = t[i];
        expect_none(&w, one);
    }
    expect_call(&w, ">", "<tool_call>");
    gw_callwatch_reset(&w);
    expect_none(&w, "<tool_cal");
    expect_none(&w, "l <tool_call"); /* a near miss, then a start */
    expect_call(&w, ">", "<tool_call>");
    /* reset forgets a partial trigger */
    gw_callwatch_reset(&w);
    expect_none(&w, "<tool_");
    gw_callwatch_reset(&w);
    expect_none(&w, "call>");
    gw_callwatch_free(&w);
}

static void test_anchored(void **state)
{
    (void)state;
    struct gw_callwatch w;
    assert_int_equal(gw_callwatch_init(&w, "{", 1, 1), 0);
    expect_none(&w, " \n");
    expect_call(&w, "\t{\"name\"", "{\"name\"");
    expect_none(&w, "{"); /* once: the constraint holds from there */
    gw_callwatch_free(&w);
    assert_int_equal(gw_callwatch_init(&w, "{", 1, 1), 0);
    expect_none(&w, "Sure");
    expect_none(&w, " {\"name\""); /* not at the start: free text */
    gw_callwatch_free(&w);
    assert_int_equal(gw_callwatch_init(&w, "<a>", 3, 1), 0);
    expect_none(&w, " <");
    expect_call(&w, "a>x", "<a>x");
    gw_callwatch_free(&w);
    assert_int_equal(gw_callwatch_init(&w, "<a>", 3, 1), 0);
    expect_none(&w, "<");
    expect_none(&w, "b<a>");
    gw_callwatch_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_token),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_anchored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
