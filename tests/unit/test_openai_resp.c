/* test_openai_resp.c — response formatting of the OpenAI API module
 * (router/api/rt_openai.h): the exact JSON of completion and chat responses,
 * logprobs in both shapes, SSE framing of streams (role chunk, deltas,
 * finish chunk, usage chunk, [DONE]), errors, /v1/models, /tokenize and
 * /detokenize bodies, tool calls in chat responses and stream deltas, and
 * U+FFFD substitution of ill-formed UTF-8. Every
 * output is parsed back with jansson and compared field by field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_api.h"
#include "router/api/rt_openai.h"

/* Token texts for the tests: id 1 "Hello", 2 " w\xC3\xB6rld" (an o-umlaut,
 * 7 bytes / 6 code points), 3 "\xE2\x82" (half of the euro sign), 4 NULL
 * (unknown). */
static const char *tok_text(void *user, int32_t id, size_t *len)
{
    int *calls = user;
    (*calls)++;
    static const char *t[] = {"", "Hello", " w\xC3\xB6rld", "\xE2\x82"};
    if (id < 1 || id > 3)
        return NULL;
    *len = strlen(t[id]);
    return t[id];
}

static json_t *load(const char *s, size_t n)
{
    json_error_t je;
    json_t *j = json_loadb(s, n, 0, &je);
    if (j == NULL)
        print_error("bad JSON (%s): %.*s\n", je.text, (int)n, s);
    assert_non_null(j);
    return j;
}

/* Checks "data: <json>\n\n" with no other newline, returns the JSON. */
static json_t *load_sse(const char *s, size_t n)
{
    assert_true(n > 8);
    assert_memory_equal(s, "data: ", 6);
    assert_memory_equal(s + n - 2, "\n\n", 2);
    assert_null(memchr(s, '\n', n - 2));
    assert_int_equal(strlen(s), n);
    return load(s + 6, n - 8);
}

static const char *jstr(const json_t *o, const char *path)
{
    json_t *v = json_object_get(o, path);
    assert_true(json_is_string(v));
    return json_string_value(v);
}

static json_int_t jint(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static void check_usage(const json_t *u, int p, int c, int cached)
{
    assert_true(json_is_object(u));
    assert_int_equal(jint(u, "prompt_tokens"), p);
    assert_int_equal(jint(u, "completion_tokens"), c);
    assert_int_equal(jint(u, "total_tokens"), p + c);
    assert_int_equal(
        jint(json_object_get(u, "prompt_tokens_details"), "cached_tokens"),
        cached);
}

static void test_completion_response(void **state)
{
    (void)state;
    char id[40];
    rt_openai_make_id(id, sizeof(id), RT_ENDPOINT_COMPLETIONS,
                      0xabcdef0123456789ull);
    assert_string_equal(id, "cmpl-abcdef0123456789");
    struct rt_resp_ctx c = {.endpoint = RT_ENDPOINT_COMPLETIONS,
                            .id = id,
                            .model = "tiny",
                            .created = 1700000000};
    struct rt_usage u = {
        .prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 2};
    char *out;
    size_t n;
    assert_int_equal(rt_openai_format_response(&c, "Hi \"there\"\n", 11, NULL,
                                               0, RT_FINISH_LENGTH, &u, &out,
                                               &n),
                     0);
    json_t *j = load(out, n);
    assert_string_equal(jstr(j, "id"), id);
    assert_string_equal(jstr(j, "object"), "text_completion");
    assert_int_equal(jint(j, "created"), 1700000000);
    assert_string_equal(jstr(j, "model"), "tiny");
    json_t *ch = json_object_get(j, "choices");
    assert_int_equal(json_array_size(ch), 1);
    json_t *c0 = json_array_get(ch, 0);
    assert_int_equal(jint(c0, "index"), 0);
    assert_string_equal(jstr(c0, "text"), "Hi \"there\"\n");
    assert_true(json_is_null(json_object_get(c0, "logprobs")));
    assert_string_equal(jstr(c0, "finish_reason"), "length");
    check_usage(json_object_get(j, "usage"), 5, 3, 2);
    json_decref(j);
    free(out);
}

static void test_completion_logprobs(void **state)
{
    (void)state;
    int calls = 0;
    struct rt_resp_ctx c = {.endpoint = RT_ENDPOINT_COMPLETIONS,
                            .id = "cmpl-1",
                            .model = "tiny",
                            .logprobs = true,
                            .token_text = tok_text,
                            .token_user = &calls};
    struct rt_top_logprob top[2] = {{2, -0.25f}, {1, -INFINITY}};
    struct rt_token_logprob lp[3] = {
        {1, -0.5f, NULL, 0}, {2, -0.25f, top, 2}, {3, -1.0f, NULL, 0}};
    char *out;
    size_t n;
    assert_int_equal(rt_openai_format_response(&c, "x", 1, lp, 3,
                                               RT_FINISH_STOP, NULL, &out, &n),
                     0);
    assert_true(calls >= 5);
    json_t *j = load(out, n);
    assert_true(json_is_null(json_object_get(j, "usage")));
    json_t *l = json_object_get(
        json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *toks = json_object_get(l, "tokens");
    assert_int_equal(json_array_size(toks), 3);
    assert_string_equal(json_string_value(json_array_get(toks, 0)), "Hello");
    assert_string_equal(json_string_value(json_array_get(toks, 1)),
                        " w\xC3\xB6rld");
    /* Half a character becomes U+FFFD. */
    assert_string_equal(json_string_value(json_array_get(toks, 2)),
                        "\xEF\xBF\xBD");
    json_t *tl = json_object_get(l, "token_logprobs");
    assert_true(fabs(json_real_value(json_array_get(tl, 0)) + 0.5) < 1e-6);
    json_t *off = json_object_get(l, "text_offset");
    /* Offsets in code points: 0, 5 ("Hello"), 11 (+ " wörld"). */
    assert_int_equal(json_integer_value(json_array_get(off, 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(off, 1)), 5);
    assert_int_equal(json_integer_value(json_array_get(off, 2)), 11);
    assert_int_equal(c.text_offset, 12);
    json_t *tops = json_object_get(l, "top_logprobs");
    assert_true(json_is_null(json_array_get(tops, 0)));
    json_t *t1 = json_array_get(tops, 1);
    assert_int_equal(json_object_size(t1), 2);
    assert_true(fabs(json_real_value(json_object_get(t1, " w\xC3\xB6rld")) +
                     0.25) < 1e-6);
    /* -inf is written as -9999.0 (JSON has no infinities). */
    assert_true(json_real_value(json_object_get(t1, "Hello")) == -9999.0);
    json_decref(j);
    free(out);

    /* Logprobs without a token_text callback is a caller error. */
    c.token_text = NULL;
    assert_int_equal(rt_openai_format_response(&c, "x", 1, lp, 3,
                                               RT_FINISH_STOP, NULL, &out, &n),
                     TG_EINVAL);
    assert_null(out);
}

static void test_chat_response_logprobs(void **state)
{
    (void)state;
    int calls = 0;
    struct rt_resp_ctx c = {.endpoint = RT_ENDPOINT_CHAT,
                            .id = "chatcmpl-7",
                            .model = "tiny",
                            .created = 42,
                            .logprobs = true,
                            .token_text = tok_text,
                            .token_user = &calls};
    struct rt_top_logprob top[2] = {{3, -0.1f}, {4, NAN}};
    struct rt_token_logprob lp[1] = {{3, -0.1f, top, 2}};
    struct rt_usage u = {7, 1, 0};
    char *out;
    size_t n;
    assert_int_equal(rt_openai_format_response(&c, "\xE2\x82", 2, lp, 1,
                                               RT_FINISH_ABORT, &u, &out, &n),
                     0);
    json_t *j = load(out, n);
    assert_string_equal(jstr(j, "object"), "chat.completion");
    assert_string_equal(jstr(j, "id"), "chatcmpl-7");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    assert_string_equal(jstr(msg, "role"), "assistant");
    assert_string_equal(jstr(msg, "content"), "\xEF\xBF\xBD");
    assert_string_equal(jstr(c0, "finish_reason"), "abort");
    json_t *content =
        json_object_get(json_object_get(c0, "logprobs"), "content");
    assert_int_equal(json_array_size(content), 1);
    json_t *e0 = json_array_get(content, 0);
    assert_string_equal(jstr(e0, "token"), "\xEF\xBF\xBD");
    assert_true(fabs(json_real_value(json_object_get(e0, "logprob")) + 0.1) <
                1e-6);
    json_t *bytes = json_object_get(e0, "bytes");
    assert_int_equal(json_array_size(bytes), 2);
    assert_int_equal(json_integer_value(json_array_get(bytes, 0)), 0xE2);
    assert_int_equal(json_integer_value(json_array_get(bytes, 1)), 0x82);
    json_t *tops = json_object_get(e0, "top_logprobs");
    assert_int_equal(json_array_size(tops), 2);
    json_t *t1 = json_array_get(tops, 1);
    assert_string_equal(jstr(t1, "token"), ""); /* unknown id */
    assert_int_equal(json_array_size(json_object_get(t1, "bytes")), 0);
    assert_true(json_real_value(json_object_get(t1, "logprob")) == -9999.0);
    assert_null(json_object_get(t1, "top_logprobs"));
    check_usage(json_object_get(j, "usage"), 7, 1, 0);
    json_decref(j);
    free(out);
}

static void test_chat_tool_calls(void **state)
{
    (void)state;
    struct rt_resp_ctx c = {.endpoint = RT_ENDPOINT_CHAT,
                            .id = "chatcmpl-t",
                            .model = "tiny",
                            .created = 5};
    struct rt_tool_call calls[2] = {
        {"call_1", "get_weather", "{\"city\": \"Paris\"}"},
        {"call_2", "now", "{}"}};
    struct rt_usage u = {9, 4, 0};
    char *out;
    size_t n;
    /* content null next to the calls, finish_reason tool_calls */
    assert_int_equal(rt_openai_format_chat_response(&c, NULL, 0, calls, 2,
                                                    NULL, 0,
                                                    RT_FINISH_TOOL_CALLS, &u,
                                                    &out, &n),
                     0);
    json_t *j = load(out, n);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(jstr(c0, "finish_reason"), "tool_calls");
    json_t *tc = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(tc), 2);
    json_t *t0 = json_array_get(tc, 0);
    assert_string_equal(jstr(t0, "id"), "call_1");
    assert_string_equal(jstr(t0, "type"), "function");
    assert_null(json_object_get(t0, "index"));
    json_t *f0 = json_object_get(t0, "function");
    assert_string_equal(jstr(f0, "name"), "get_weather");
    assert_string_equal(jstr(f0, "arguments"), "{\"city\": \"Paris\"}");
    json_decref(j);
    free(out);
    /* content and no calls: no tool_calls member */
    assert_int_equal(rt_openai_format_chat_response(&c, "hi", 2, NULL, 0,
                                                    NULL, 0, RT_FINISH_STOP,
                                                    &u, &out, &n),
                     0);
    j = load(out, n);
    msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                          "message");
    assert_string_equal(jstr(msg, "content"), "hi");
    assert_null(json_object_get(msg, "tool_calls"));
    json_decref(j);
    free(out);
    /* a stream delta of calls numbered from first_index */
    assert_int_equal(rt_openai_sse_tool_calls(&c, calls + 1, 1, 1, NULL, 0,
                                              &u, &out, &n),
                     0);
    j = load_sse(out, n);
    assert_string_equal(jstr(j, "object"), "chat.completion.chunk");
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_true(json_is_null(json_object_get(c0, "finish_reason")));
    json_t *d = json_object_get(c0, "delta");
    assert_int_equal(json_object_size(d), 1);
    t0 = json_array_get(json_object_get(d, "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(t0, "index")), 1);
    assert_string_equal(jstr(t0, "id"), "call_2");
    assert_string_equal(jstr(json_object_get(t0, "function"), "arguments"),
                        "{}");
    json_decref(j);
    free(out);
    /* the closing chunk's finish reason */
    assert_int_equal(rt_openai_sse_delta(&c, "", 0, NULL, 0,
                                         RT_FINISH_TOOL_CALLS, &u, &out, &n),
                     0);
    j = load_sse(out, n);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(jstr(c0, "finish_reason"), "tool_calls");
    json_decref(j);
    free(out);
    assert_string_equal(rt_finish_name(RT_FINISH_TOOL_CALLS), "tool_calls");
    /* chat-only formatters refuse a completions context */
    struct rt_resp_ctx cc = {.endpoint = RT_ENDPOINT_COMPLETIONS};
    assert_int_equal(rt_openai_format_chat_response(&cc, "x", 1, NULL, 0, NULL,
                                                    0, RT_FINISH_STOP, NULL,
                                                    &out, &n),
                     TG_EINVAL);
    assert_int_equal(rt_openai_sse_tool_calls(&cc, calls, 1, 0, NULL, 0, NULL,
                                              &out, &n),
                     TG_EINVAL);
}

static void test_chat_stream(void **state)
{
    (void)state;
    struct rt_resp_ctx c = {.endpoint = RT_ENDPOINT_CHAT,
                            .id = "chatcmpl-s",
                            .model = "tiny",
                            .created = 9,
                            .include_usage = true};
    char *out;
    size_t n;
    /* 1. the role chunk */
    assert_int_equal(rt_openai_sse_role(&c, &out, &n), 0);
    json_t *j = load_sse(out, n);
    assert_string_equal(jstr(j, "object"), "chat.completion.chunk");
    assert_string_equal(jstr(j, "id"), "chatcmpl-s");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *d = json_object_get(c0, "delta");
    assert_string_equal(jstr(d, "role"), "assistant");
    assert_string_equal(jstr(d, "content"), "");
    assert_true(json_is_null(json_object_get(c0, "finish_reason")));
    assert_true(json_is_null(json_object_get(j, "usage")));
    json_decref(j);
    free(out);

    /* 2. a text delta with a newline stays one SSE line */
    assert_int_equal(rt_openai_sse_delta(&c, "a\nb", 3, NULL, 0, RT_FINISH_NONE,
                                         NULL, &out, &n),
                     0);
    j = load_sse(out, n);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    d = json_object_get(c0, "delta");
    assert_string_equal(jstr(d, "content"), "a\nb");
    assert_null(json_object_get(d, "role"));
    assert_true(json_is_null(json_object_get(c0, "logprobs")));
    assert_true(json_is_null(json_object_get(c0, "finish_reason")));
    json_t *u = json_object_get(j, "usage");
    assert_non_null(u);
    assert_true(json_is_null(u)); /* OpenAI: usage null until the end */
    json_decref(j);
    free(out);

    /* 3. the closing chunk: empty delta, finish_reason */
    assert_int_equal(rt_openai_sse_delta(&c, NULL, 0, NULL, 0, RT_FINISH_STOP,
                                         NULL, &out, &n),
                     0);
    j = load_sse(out, n);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(c0, "delta")), 0);
    assert_string_equal(jstr(c0, "finish_reason"), "stop");
    json_decref(j);
    free(out);

    /* 4. the usage chunk: no choices */
    struct rt_usage us = {10, 4, 8};
    assert_int_equal(rt_openai_sse_usage(&c, &us, &out, &n), 0);
    j = load_sse(out, n);
    assert_true(json_is_array(json_object_get(j, "choices")));
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    check_usage(json_object_get(j, "usage"), 10, 4, 8);
    json_decref(j);
    free(out);

    assert_string_equal(RT_OPENAI_SSE_DONE, "data: [DONE]\n\n");

    /* Without include_usage chunks carry no usage member at all. */
    c.include_usage = false;
    assert_int_equal(rt_openai_sse_delta(&c, "x", 1, NULL, 0, RT_FINISH_NONE,
                                         NULL, &out, &n),
                     0);
    j = load_sse(out, n);
    assert_null(json_object_get(j, "usage"));
    json_decref(j);
    free(out);
}

static void test_completion_stream(void **state)
{
    (void)state;
    int calls = 0;
    struct rt_resp_ctx c = {.endpoint = RT_ENDPOINT_COMPLETIONS,
                            .id = "cmpl-s",
                            .model = "tiny",
                            .created = 1,
                            .continuous_usage = true,
                            .logprobs = true,
                            .token_text = tok_text,
                            .token_user = &calls};
    char *out;
    size_t n;
    assert_int_equal(rt_openai_sse_role(&c, &out, &n), TG_EINVAL);
    struct rt_token_logprob a = {1, -0.5f, NULL, 0}, b = {2, -1.5f, NULL, 0};
    struct rt_usage u = {3, 1, 0};
    assert_int_equal(rt_openai_sse_delta(&c, "Hello", 5, &a, 1, RT_FINISH_NONE,
                                         &u, &out, &n),
                     0);
    json_t *j = load_sse(out, n);
    assert_string_equal(jstr(j, "object"), "text_completion");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(jstr(c0, "text"), "Hello");
    json_t *off =
        json_object_get(json_object_get(c0, "logprobs"), "text_offset");
    assert_int_equal(json_integer_value(json_array_get(off, 0)), 0);
    check_usage(json_object_get(j, "usage"), 3, 1, 0);
    json_decref(j);
    free(out);

    /* The offset continues from the previous chunk. */
    u.completion_tokens = 2;
    assert_int_equal(rt_openai_sse_delta(&c, " w\xC3\xB6rld", 7, &b, 1,
                                         RT_FINISH_LENGTH, &u, &out, &n),
                     0);
    j = load_sse(out, n);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    off = json_object_get(json_object_get(c0, "logprobs"), "text_offset");
    assert_int_equal(json_integer_value(json_array_get(off, 0)), 5);
    assert_string_equal(jstr(c0, "finish_reason"), "length");
    check_usage(json_object_get(j, "usage"), 3, 2, 0);
    json_decref(j);
    free(out);

    /* A chunk without tokens has logprobs null; no usage given -> null. */
    assert_int_equal(
        rt_openai_sse_delta(&c, "", 0, NULL, 0, RT_FINISH_NONE, NULL, &out, &n),
        0);
    j = load_sse(out, n);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(jstr(c0, "text"), "");
    assert_true(json_is_null(json_object_get(c0, "logprobs")));
    assert_true(json_is_null(json_object_get(j, "usage")));
    json_decref(j);
    free(out);
}

static void test_errors(void **state)
{
    (void)state;
    struct rt_request_error e;
    rt_request_error_set(&e, RT_REQ_ERR_BUSY, "queue_full", NULL,
                         "queue is full (%d)", 64);
    assert_string_equal(rt_openai_error_type(e.kind), "rate_limit_error");
    char *out;
    size_t n;
    assert_int_equal(rt_openai_format_error(&e, &out, &n), 0);
    json_t *j = load(out, n);
    json_t *o = json_object_get(j, "error");
    assert_string_equal(jstr(o, "message"), "queue is full (64)");
    assert_string_equal(jstr(o, "type"), "rate_limit_error");
    assert_true(json_is_null(json_object_get(o, "param")));
    assert_string_equal(jstr(o, "code"), "queue_full");
    json_decref(j);
    free(out);

    /* A generation's failure, classed by the core's message prefix. */
    rt_api_gen_error(&e, "kv_cache_exhausted: the sequence outgrew it");
    assert_int_equal(rt_openai_http_status(e.kind), 503);
    assert_string_equal(e.code, "kv_cache_exhausted");
    assert_string_equal(e.message, "the sequence outgrew it");
    rt_api_gen_error(&e, "output_constraint_too_complex: too ambiguous");
    assert_int_equal(rt_openai_http_status(e.kind), 400);
    assert_string_equal(rt_openai_error_type(e.kind), "invalid_request_error");
    assert_string_equal(e.code, "output_constraint_too_complex");
    assert_string_equal(e.message, "too ambiguous");
    rt_api_gen_error(&e, "NaN logits");
    assert_int_equal(rt_openai_http_status(e.kind), 500);
    assert_string_equal(e.code, "generation_failed");
    rt_api_gen_error(&e, NULL);
    assert_int_equal(rt_openai_http_status(e.kind), 500);

    /* A parse error round-trips with param and code. */
    static const struct rt_openai_cfg cfg = {.served_model = "tiny"};
    const char *b = "{\"prompt\":\"x\",\"top_p\":2}";
    struct rt_gen_request r;
    assert_int_equal(rt_openai_parse_completion(&cfg, b, strlen(b), &r, &e),
                     TG_ERANGE);
    assert_int_equal(rt_openai_sse_error(&e, &out, &n), 0);
    j = load_sse(out, n);
    o = json_object_get(j, "error");
    assert_string_equal(jstr(o, "param"), "top_p");
    assert_string_equal(jstr(o, "type"), "invalid_request_error");
    assert_string_equal(jstr(o, "code"), "invalid_value");
    assert_non_null(strstr(jstr(o, "message"), "top_p"));
    json_decref(j);
    free(out);

    rt_request_error_set(&e, RT_REQ_ERR_UNAVAILABLE, NULL, "", "draining");
    assert_string_equal(rt_openai_error_type(e.kind), "server_error");
    assert_int_equal(rt_openai_format_error(&e, &out, &n), 0);
    j = load(out, n);
    assert_true(
        json_is_null(json_object_get(json_object_get(j, "error"), "code")));
    json_decref(j);
    free(out);
    assert_string_equal(rt_openai_error_type(RT_REQ_ERR_UNAUTHENTICATED),
                        "authentication_error");
    assert_string_equal(rt_openai_error_type(RT_REQ_ERR_NOT_FOUND),
                        "invalid_request_error");
    assert_string_equal(rt_openai_error_type(RT_REQ_ERR_TOO_LARGE),
                        "invalid_request_error");
    /* Every kind's HTTP status. */
    static const int want[] = {
        [RT_REQ_ERR_NONE] = 500,
        [RT_REQ_ERR_INVALID] = 400,
        [RT_REQ_ERR_NOT_FOUND] = 404,
        [RT_REQ_ERR_TOO_LARGE] = 413,
        [RT_REQ_ERR_UNAUTHENTICATED] = 401,
        [RT_REQ_ERR_BUSY] = 429,
        [RT_REQ_ERR_UNAVAILABLE] = 503,
        [RT_REQ_ERR_INTERNAL] = 500,
    };
    for (int k = 0; k <= RT_REQ_ERR_INTERNAL; k++)
        assert_int_equal(rt_openai_http_status((enum rt_req_err)k), want[k]);
    assert_null(rt_finish_name(RT_FINISH_NONE));
    assert_string_equal(rt_finish_name(RT_FINISH_ERROR), "error");
}

static void test_models_tokenize_bodies(void **state)
{
    (void)state;
    char *out;
    size_t n;
    assert_int_equal(rt_openai_format_models("tiny", 123, 4096, &out, &n), 0);
    json_t *j = load(out, n);
    assert_string_equal(jstr(j, "object"), "list");
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 1);
    assert_string_equal(jstr(m, "id"), "tiny");
    assert_string_equal(jstr(m, "object"), "model");
    assert_int_equal(jint(m, "created"), 123);
    assert_string_equal(jstr(m, "owned_by"), "tangram");
    assert_int_equal(jint(m, "max_model_len"), 4096);
    json_decref(j);
    free(out);

    int32_t ids[3] = {1, 2, 3};
    assert_int_equal(
        rt_openai_format_tokenize(ids, 3, 128, NULL, NULL, &out, &n), 0);
    j = load(out, n);
    assert_int_equal(jint(j, "count"), 3);
    assert_int_equal(jint(j, "max_model_len"), 128);
    assert_int_equal(json_array_size(json_object_get(j, "tokens")), 3);
    assert_int_equal(
        json_integer_value(json_array_get(json_object_get(j, "tokens"), 2)), 3);
    assert_null(json_object_get(j, "token_strs"));
    json_decref(j);
    free(out);

    int calls = 0;
    assert_int_equal(
        rt_openai_format_tokenize(ids, 3, 128, tok_text, &calls, &out, &n), 0);
    j = load(out, n);
    json_t *strs = json_object_get(j, "token_strs");
    assert_int_equal(json_array_size(strs), 3);
    assert_string_equal(json_string_value(json_array_get(strs, 0)), "Hello");
    assert_string_equal(json_string_value(json_array_get(strs, 2)),
                        "\xEF\xBF\xBD");
    json_decref(j);
    free(out);

    assert_int_equal(
        rt_openai_format_tokenize(NULL, 0, 128, NULL, NULL, &out, &n), 0);
    j = load(out, n);
    assert_int_equal(jint(j, "count"), 0);
    json_decref(j);
    free(out);
}

/* U+FFFD substitution of maximal subparts, case by case. */
static void test_utf8_lossy(void **state)
{
    (void)state;
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"plain", "plain"},
        {"h\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", "h\xC3\xA9 \xE2\x82\xAC "
                                                    "\xF0\x9F\x98\x80"},
        {"\xC0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"}, /* overlong */
        {"a\xE2\x82", "a\xEF\xBF\xBD"},           /* truncated */
        {"\xF0\x9F\x98"
         "A",
         "\xEF\xBF\xBD"
         "A"}, /* one subpart */
        {"\xED\xA0\x80",
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate */
        {"\xF4\x90\x80\x80",
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* > U+10FFFF */
        {"\x80x\xFF", "\xEF\xBF\xBDx\xEF\xBF\xBD"},
        {"\xE0\xA0\x80", "\xE0\xA0\x80"}, /* U+0800, the first 3-byte */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *out;
        size_t n;
        assert_int_equal(rt_openai_format_detokenize(
                             cases[i].in, strlen(cases[i].in), &out, &n),
                         0);
        json_t *j = load(out, n);
        assert_string_equal(jstr(j, "prompt"), cases[i].want);
        json_decref(j);
        free(out);
    }
}

/* n > 1: each choice formatted with its own index, the bodies joined in
 * order with the request's usage; streamed frames carry their index. */
static void test_choices(void **state)
{
    (void)state;
    int calls = 0;
    struct rt_resp_ctx c = {.endpoint = RT_ENDPOINT_CHAT,
                            .id = "chatcmpl-n",
                            .model = "tiny",
                            .created = 7,
                            .logprobs = true,
                            .token_text = tok_text,
                            .token_user = &calls};
    struct rt_usage u1 = {.prompt_tokens = 4, .completion_tokens = 1};
    struct rt_top_logprob top = {1, -0.5f};
    struct rt_token_logprob lp = {1, -0.25f, &top, 1};
    struct rt_tool_call call = {.id = "call_1", .name = "f",
                                .arguments = "{\"a\":1}"};
    char *b[3];
    size_t bl[3];
    c.index = 0;
    assert_int_equal(rt_openai_format_chat_response(&c, "Hello", 5, NULL, 0,
                                                    &lp, 1, RT_FINISH_LENGTH,
                                                    &u1, &b[0], &bl[0]),
                     0);
    c.index = 1;
    assert_int_equal(rt_openai_format_chat_response(&c, NULL, 0, &call, 1,
                                                    NULL, 0,
                                                    RT_FINISH_TOOL_CALLS, &u1,
                                                    &b[1], &bl[1]),
                     0);
    c.index = 2;
    assert_int_equal(rt_openai_format_chat_response(&c, "", 0, NULL, 0, NULL,
                                                    0, RT_FINISH_STOP, NULL,
                                                    &b[2], &bl[2]),
                     0);
    struct rt_usage u = {.prompt_tokens = 4, .completion_tokens = 9,
                         .cached_tokens = 2};
    char *out;
    size_t n;
    assert_int_equal(rt_openai_merge_choices((const char *const *)b, 3, &u,
                                             &out, &n),
                     0);
    assert_int_equal(strlen(out), n);
    json_t *j = load(out, n);
    assert_string_equal(jstr(j, "id"), "chatcmpl-n");
    assert_string_equal(jstr(j, "object"), "chat.completion");
    assert_int_equal(jint(j, "created"), 7);
    json_t *ch = json_object_get(j, "choices");
    assert_int_equal(json_array_size(ch), 3);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(jint(json_array_get(ch, i), "index"), (int)i);
    json_t *m0 = json_object_get(json_array_get(ch, 0), "message");
    assert_string_equal(jstr(m0, "content"), "Hello");
    assert_string_equal(jstr(json_array_get(ch, 0), "finish_reason"),
                        "length");
    json_t *lps = json_object_get(json_array_get(ch, 0), "logprobs");
    json_t *e0 = json_array_get(json_object_get(lps, "content"), 0);
    assert_true(json_real_value(json_object_get(e0, "logprob")) == -0.25);
    json_t *m1 = json_object_get(json_array_get(ch, 1), "message");
    assert_true(json_is_null(json_object_get(m1, "content")));
    json_t *tc = json_array_get(json_object_get(m1, "tool_calls"), 0);
    assert_string_equal(jstr(tc, "id"), "call_1");
    assert_string_equal(jstr(json_array_get(ch, 1), "finish_reason"),
                        "tool_calls");
    assert_string_equal(jstr(json_array_get(ch, 2), "finish_reason"), "stop");
    /* Usage is the request's: the prompt once, every choice's tokens. */
    check_usage(json_object_get(j, "usage"), 4, 9, 2);
    json_decref(j);
    free(out);
    /* Not a response body: refused. */
    const char *bad[2] = {b[0], "{\"choices\":1}"};
    assert_int_equal(rt_openai_merge_choices(bad, 2, &u, &out, &n),
                     TG_EFORMAT);
    assert_null(out);
    const char *garbage[1] = {"{"};
    assert_int_equal(rt_openai_merge_choices(garbage, 1, &u, &out, &n),
                     TG_EFORMAT);
    assert_int_equal(rt_openai_merge_choices(garbage, 0, &u, &out, &n),
                     TG_EFORMAT);
    for (int i = 0; i < 3; i++)
        free(b[i]);
    /* Stream frames: role, delta and the tool-call delta of choice 2. */
    c.index = 2;
    assert_int_equal(rt_openai_sse_role(&c, &out, &n), 0);
    j = load_sse(out, n);
    assert_int_equal(jint(json_array_get(json_object_get(j, "choices"), 0),
                          "index"),
                     2);
    json_decref(j);
    free(out);
    c.logprobs = false;
    assert_int_equal(rt_openai_sse_delta(&c, "x", 1, NULL, 0,
                                         RT_FINISH_STOP, NULL, &out, &n),
                     0);
    j = load_sse(out, n);
    json_t *c2 = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(jint(c2, "index"), 2);
    assert_string_equal(jstr(c2, "finish_reason"), "stop");
    json_decref(j);
    free(out);
    assert_int_equal(rt_openai_sse_tool_calls(&c, &call, 1, 0, NULL, 0, NULL,
                                              &out, &n),
                     0);
    j = load_sse(out, n);
    assert_int_equal(jint(json_array_get(json_object_get(j, "choices"), 0),
                          "index"),
                     2);
    json_decref(j);
    free(out);
    /* Completions too. */
    struct rt_resp_ctx cc = {.endpoint = RT_ENDPOINT_COMPLETIONS,
                             .id = "cmpl-n",
                             .model = "tiny",
                             .index = 5};
    assert_int_equal(rt_openai_sse_delta(&cc, "y", 1, NULL, 0, RT_FINISH_NONE,
                                         NULL, &out, &n),
                     0);
    j = load_sse(out, n);
    c2 = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(jint(c2, "index"), 5);
    assert_string_equal(jstr(c2, "text"), "y");
    json_decref(j);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_response),
        cmocka_unit_test(test_choices),
        cmocka_unit_test(test_completion_logprobs),
        cmocka_unit_test(test_chat_response_logprobs),
        cmocka_unit_test(test_chat_tool_calls),
        cmocka_unit_test(test_chat_stream),
        cmocka_unit_test(test_completion_stream),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_models_tokenize_bodies),
        cmocka_unit_test(test_utf8_lossy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
