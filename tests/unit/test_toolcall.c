/* test_toolcall.c — rt_toolcall: Hermes <tool_call> blocks and Llama-3
 * JSON answers parsed out of model output. Well-formed calls, several
 * calls, text before / between / after calls, malformed JSON and non-call
 * objects kept as content byte for byte, output cut off by max_tokens,
 * <|python_tag|>, the arguments as Python's json.dumps writes them, call
 * ids, plain text untouched, and the streaming property: feeding the text
 * split at every byte boundary (and byte by byte) gives the same content
 * and calls as feeding it whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/tg_err.h"
#include "router/api/rt_toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The result of parsing one output: content and "name|arguments" lines. */
struct result {
    char content[4096];
    size_t content_len;
    char calls[4096];
    size_t n_calls;
    size_t last_index; /* first_index + n of the last non-empty delta */
};

static void absorb(struct result *r, const struct rt_tc_delta *d)
{
    assert_true(r->content_len + d->content_len < sizeof r->content);
    memcpy(r->content + r->content_len, d->content, d->content_len);
    r->content_len += d->content_len;
    r->content[r->content_len] = '\0';
    if (d->n_calls > 0)
        assert_int_equal(d->first_index, r->n_calls); /* in order */
    for (size_t i = 0; i < d->n_calls; i++) {
        size_t l = strlen(r->calls);
        snprintf(r->calls + l, sizeof r->calls - l, "%s%s|%s",
                 r->n_calls ? "\n" : "", d->calls[i].name,
                 d->calls[i].arguments);
        assert_non_null(strstr(d->calls[i].id, "call_"));
        assert_int_equal(strlen(d->calls[i].id), 21);
        r->n_calls++;
    }
}

/* Feeds text in pieces cut at the offsets cuts[0..n) (ascending). */
static void run(enum ct_tool_format fmt, const char *text, const size_t *cuts,
                size_t n_cuts, struct result *r)
{
    memset(r, 0, sizeof(*r));
    struct rt_tc_parser p;
    rt_tc_init(&p, fmt, 42);
    struct rt_tc_delta d;
    size_t at = 0, len = strlen(text);
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        assert_int_equal(rt_tc_feed(&p, text + at, end - at, &d), 0);
        absorb(r, &d);
        at = end;
    }
    assert_int_equal(rt_tc_finish(&p, &d), 0);
    absorb(r, &d);
    size_t total;
    rt_tc_calls(&p, &total);
    assert_int_equal(total, r->n_calls);
    rt_tc_free(&p);
    rt_tc_free(&p); /* safe twice */
}

/* Whole, byte by byte, and split once at every offset: all equal. */
static void check(enum ct_tool_format fmt, const char *text,
                  const char *want_content, const char *want_calls)
{
    struct result whole, piece;
    run(fmt, text, NULL, 0, &whole);
    assert_string_equal(whole.content, want_content);
    assert_string_equal(whole.calls, want_calls);
    size_t len = strlen(text);
    size_t *all = malloc((len + 1) * sizeof(*all));
    assert_non_null(all);
    for (size_t i = 0; i < len; i++)
        all[i] = i;
    run(fmt, text, all, len, &piece);
    assert_string_equal(piece.content, want_content);
    assert_string_equal(piece.calls, want_calls);
    for (size_t cut = 0; cut <= len; cut++) {
        run(fmt, text, &cut, 1, &piece);
        if (strcmp(piece.content, want_content) != 0 ||
            strcmp(piece.calls, want_calls) != 0)
            fail_msg("split at %zu of %s: content %s calls %s", cut, text,
                     piece.content, piece.calls);
    }
    /* two cuts everywhere for short inputs */
    for (size_t a = 0; len <= 80 && a <= len; a++)
        for (size_t b = a; b <= len; b++) {
            size_t cuts[2] = {a, b};
            run(fmt, text, cuts, 2, &piece);
            assert_string_equal(piece.content, want_content);
            assert_string_equal(piece.calls, want_calls);
        }
    free(all);
}

static void test_hermes_calls(void **state)
{
    (void)state;
    const enum ct_tool_format H = CT_TOOLS_HERMES;
    check(H,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
          "{\"city\": \"Paris\"}}\n</tool_call>",
          "", "get_weather|{\"city\": \"Paris\"}");
    /* several calls; whitespace between them dropped */
    check(H,
          "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
          "<tool_call>\n{\"name\":\"b\",\"arguments\":{\"x\":[1,2.5,true,"
          "null],\"y\":\"é\\n\"}}\n</tool_call>\n",
          "", "a|{}\nb|{\"x\": [1, 2.5, true, null], \"y\": \"é\\n\"}");
    /* text before and after: kept, whitespace touching the calls dropped */
    check(H,
          "Let me check.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
          "{\"q\": 1}}\n</tool_call>\n\nDone.  ",
          "Let me check.Done.", "f|{\"q\": 1}");
    /* "parameters" is accepted for "arguments" */
    check(H, "<tool_call>{\"parameters\": {}, \"name\": \"p\"}</tool_call>",
          "", "p|{}");
    /* floats keep Python's repr */
    check(H,
          "<tool_call>{\"name\": \"n\", \"arguments\": {\"v\": 0.1, \"w\": "
          "1e21, \"z\": -0.0}}</tool_call>",
          "", "n|{\"v\": 0.1, \"w\": 1e+21, \"z\": -0.0}");
}

static void test_hermes_fallbacks(void **state)
{
    (void)state;
    const enum ct_tool_format H = CT_TOOLS_HERMES;
    /* plain text passes through untouched, trailing whitespace included */
    check(H, "Hello <b>world</b> <tool>  \n", "Hello <b>world</b> <tool>  \n",
          "");
    check(H, "a < b and <tool_ca", "a < b and <tool_ca", "");
    /* malformed JSON: the block stays content, byte for byte */
    check(H, "x <tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> y",
          "x <tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> y",
          "");
    /* not a call: no name, arguments not an object */
    check(H, "<tool_call>{\"arguments\": {}}</tool_call>",
          "<tool_call>{\"arguments\": {}}</tool_call>", "");
    check(H, "<tool_call>{\"name\": \"f\", \"arguments\": \"x\"}</tool_call>",
          "<tool_call>{\"name\": \"f\", \"arguments\": \"x\"}</tool_call>", "");
    check(H, "<tool_call>[1]</tool_call>", "<tool_call>[1]</tool_call>", "");
    /* a bad block between good ones */
    check(H,
          "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n"
          "<tool_call>oops</tool_call>\n"
          "<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>",
          "<tool_call>oops</tool_call>", "a|{}\nb|{}");
    /* cut off by max_tokens inside the JSON: the text, not a call */
    check(H, "ok <tool_call>\n{\"name\": \"f\", \"argu",
          "ok <tool_call>\n{\"name\": \"f\", \"argu", "");
    /* cut off after complete JSON but before </tool_call>: a call */
    check(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", "",
          "f|{}");
    check(H, "<tool_call>", "<tool_call>", "");
    check(H, "", "", "");
}

static void test_llama_json(void **state)
{
    (void)state;
    const enum ct_tool_format L = CT_TOOLS_LLAMA_JSON;
    check(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
          "", "get_weather|{\"city\": \"Rome\"}");
    check(L,
          "  <|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": "
          "\"b\", \"arguments\": {\"k\": [1]}}\n",
          "", "a|{}\nb|{\"k\": [1]}");
    /* text that does not start with '{' is content, streamed as it is */
    check(L, "The answer is {\"name\": 1}.", "The answer is {\"name\": 1}.",
          "");
    check(L, "  \n", "  \n", "");
    check(L, "<|python_tag|>", "<|python_tag|>", "");
    check(L, "<|pyth", "<|pyth", "");
    /* JSON that is not a call, or is cut off, stays content */
    check(L, "{\"answer\": 42}", "{\"answer\": 42}", "");
    check(L, "{\"name\": \"f\", \"parameters\": {\"x\": ",
          "{\"name\": \"f\", \"parameters\": {\"x\": ", "");
    check(L, "{\"name\": \"f\", \"parameters\": {}} trailing",
          "{\"name\": \"f\", \"parameters\": {}} trailing", "");
}

static void test_passthrough_and_ids(void **state)
{
    (void)state;
    check(CT_TOOLS_NONE, "<tool_call>{\"name\":\"f\",\"arguments\":{}}"
                         "</tool_call>",
          "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", "");
    /* ids: distinct per call, stable for a seed, different across seeds */
    const char *text = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>"
                       "<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>";
    struct rt_tc_parser p, q;
    struct rt_tc_delta d;
    rt_tc_init(&p, CT_TOOLS_HERMES, 7);
    rt_tc_init(&q, CT_TOOLS_HERMES, 8);
    assert_int_equal(rt_tc_feed(&p, text, strlen(text), &d), 0);
    assert_int_equal(d.n_calls, 2);
    assert_int_equal(d.first_index, 0);
    assert_string_not_equal(d.calls[0].id, d.calls[1].id);
    char first[32];
    snprintf(first, sizeof first, "%s", d.calls[0].id);
    assert_int_equal(rt_tc_feed(&q, text, strlen(text), &d), 0);
    assert_string_not_equal(first, d.calls[0].id); /* another seed */
    size_t n;
    rt_tc_calls(&p, &n);
    assert_int_equal(n, 2);
    assert_int_equal(rt_tc_finish(&p, &d), 0);
    assert_int_equal(d.n_calls, 0);
    assert_int_equal(d.content_len, 0);
    /* feeding after the end is refused */
    assert_int_equal(rt_tc_feed(&p, "x", 1, &d), TG_EINVAL);
    rt_tc_free(&p);
    rt_tc_free(&q);
    /* the same seed gives the same ids */
    rt_tc_init(&p, CT_TOOLS_HERMES, 7);
    assert_int_equal(rt_tc_feed(&p, text, strlen(text), &d), 0);
    assert_string_equal(d.calls[0].id, first);
    rt_tc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes_calls),
        cmocka_unit_test(test_hermes_fallbacks),
        cmocka_unit_test(test_llama_json),
        cmocka_unit_test(test_passthrough_and_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
