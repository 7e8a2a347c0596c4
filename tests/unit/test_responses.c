/* test_responses.c — the Responses API's pure functions
 * (router/api/rt_responses.h):
 *   - a string input is one user message item with an input_text part and
 *     an id; items keep their shape; instructions, max_output_tokens,
 *     tools (Responses shape to chat shape), tool_choice, text.format
 *     (json_schema to response_format) and pass-through sampling fields
 *     land in the chat body; store defaults to true;
 *   - refusals name the field: wrong types, unknown roles, item and part
 *     types not served, non-function tools, top_logprobs / include /
 *     background, metadata over its limits, another model (404), a body
 *     over the limit (413);
 *   - items to chat messages: consecutive function_call items become one
 *     assistant message with their tool_calls, outputs tool messages;
 *   - the chat request parses (rt_openai_parse_chat) with the renamed
 *     fields named as the Responses API names them;
 *   - output items, the Response object (usage with cached_tokens,
 *     incomplete_details, echoed fields) and an event's framing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_responses.h"

static struct rt_openai_cfg cfg(void)
{
    struct rt_openai_cfg c = {0};
    c.served_model = "m";
    c.max_model_len = 4096;
    c.vocab_size = 1000;
    c.max_body_bytes = 1 << 20;
    c.tool_format = CT_TOOLS_HERMES; /* what a required call is held to */
    return c;
}

static int parse(const char *body, struct rt_responses_request *r,
                 struct rt_request_error *e)
{
    struct rt_openai_cfg c = cfg();
    memset(e, 0, sizeof(*e));
    return rt_responses_parse(&c, body, strlen(body), r, e);
}

static void test_string_input(void **state)
{
    (void)state;
    struct rt_responses_request r;
    struct rt_request_error e;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"hi\",\"top_k\":5,"
                           "\"instructions\":\"be brief\","
                           "\"max_output_tokens\":7,\"temperature\":0.5}",
                           &r, &e),
                     0);
    assert_true(r.store);
    assert_false(r.stream);
    assert_int_equal(json_array_size(r.input), 1);
    json_t *it = json_array_get(r.input, 0);
    assert_string_equal(json_string_value(json_object_get(it, "type")),
                        "message");
    assert_string_equal(json_string_value(json_object_get(it, "role")), "user");
    assert_string_equal(rt_responses_item_text(it), "hi");
    assert_memory_equal(json_string_value(json_object_get(it, "id")), "msg_",
                        4);
    assert_string_equal(json_string_value(r.instructions), "be brief");
    /* Passed through, renamed, or kept out of the chat body. */
    assert_int_equal(json_integer_value(json_object_get(r.chat, "top_k")), 5);
    assert_int_equal(
        json_integer_value(json_object_get(r.chat, "max_completion_tokens")),
        7);
    assert_null(json_object_get(r.chat, "input"));
    assert_null(json_object_get(r.chat, "instructions"));
    assert_null(json_object_get(r.chat, "max_output_tokens"));
    assert_true(json_real_value(json_object_get(r.echo, "temperature")) == 0.5);
    rt_responses_request_free(&r);
}

static const char TOOLS_BODY[] =
    "{\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":["
    "{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\","
    "\"text\":\"b\"}]},"
    "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\","
    "\"arguments\":\"{\\\"x\\\":1}\"},"
    "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"f\","
    "\"arguments\":\"{}\"},"
    "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"one\"},"
    "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":\"two\"}],"
    "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{"
    "\"type\":\"object\"},\"strict\":false}],"
    "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
    "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"s\","
    "\"schema\":{\"type\":\"object\"}}},\"store\":false,\"stream\":true}";

static void test_items_tools_format(void **state)
{
    (void)state;
    struct rt_responses_request r;
    struct rt_request_error e;
    assert_int_equal(parse(TOOLS_BODY, &r, &e), 0);
    assert_false(r.store);
    assert_true(r.stream);
    assert_null(json_object_get(r.chat, "stream"));
    json_t *t = json_array_get(json_object_get(r.chat, "tools"), 0);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(t, "function"), "name")),
                        "f");
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_object_get(r.chat, "tool_choice"), "function"),
            "name")),
        "f");
    json_t *rf = json_object_get(r.chat, "response_format");
    assert_string_equal(json_string_value(json_object_get(rf, "type")),
                        "json_schema");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(rf, "json_schema"), "name")),
                        "s");

    json_t *msgs = json_array();
    assert_int_equal(rt_responses_messages(r.input, "input", msgs, &e), 0);
    /* user, one assistant with both calls, two tool messages */
    assert_int_equal(json_array_size(msgs), 4);
    json_t *u = json_array_get(msgs, 0), *a = json_array_get(msgs, 1);
    assert_string_equal(json_string_value(json_object_get(u, "content")),
                        "a\nb");
    assert_string_equal(json_string_value(json_object_get(a, "role")),
                        "assistant");
    assert_int_equal(json_array_size(json_object_get(a, "tool_calls")), 2);
    json_t *tm = json_array_get(msgs, 3);
    assert_string_equal(json_string_value(json_object_get(tm, "role")), "tool");
    assert_string_equal(json_string_value(json_object_get(tm, "tool_call_id")),
                        "c2");

    /* The chat API's rules hold, with the Responses names: a format and a
     * required call do not go together. */
    struct rt_openai_cfg c = cfg();
    struct rt_gen_request g;
    assert_int_not_equal(rt_responses_chat(&c, &r, msgs, &g, &e), 0);
    assert_string_equal(e.param, "text.format");
    /* Without the format, the chat request they mean parses. */
    json_object_del(r.chat, "response_format");
    int rc = rt_responses_chat(&c, &r, msgs, &g, &e);
    if (rc != 0)
        fail_msg("chat: %s (%s)", e.message, e.param);
    assert_int_equal(g.tool_choice, RT_TOOL_CHOICE_FUNCTION);
    assert_non_null(g.q.grammar); /* the named function's arguments */
    rt_gen_request_free(&g);
    json_decref(msgs);
    rt_responses_request_free(&r);
}

struct bad {
    const char *body;
    int status;
    const char *param;
};

static const struct bad BAD[] = {
    {"{}", 400, "input"},
    {"{\"input\":3}", 400, "input"},
    {"{\"input\":\"x\",\"model\":\"other\"}", 404, "model"},
    {"{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400,
     "input[0].role"},
    {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
     "\"image_url\":\"u\"}]}]}",
     400, "input[0].content[0]"},
    {"{\"input\":[{\"type\":\"computer_call\"}]}", 400, "input[0].type"},
    {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":1,"
     "\"arguments\":\"{}\"}]}",
     400, "input[0].name"},
    {"{\"input\":[{\"type\":\"item_reference\"}]}", 400, "input[0].id"},
    {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", 400,
     "tools[0]"},
    {"{\"input\":\"x\",\"tool_choice\":5}", 400, "tool_choice"},
    {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", 400,
     "text.format.type"},
    {"{\"input\":\"x\",\"store\":\"yes\"}", 400, "store"},
    {"{\"input\":\"x\",\"previous_response_id\":\"\"}", 400,
     "previous_response_id"},
    {"{\"input\":\"x\",\"metadata\":{\"k\":1}}", 400, "metadata"},
    {"{\"input\":\"x\",\"top_logprobs\":2}", 400, "top_logprobs"},
    {"{\"input\":\"x\",\"include\":[\"reasoning.encrypted_content\"]}", 400,
     "include"},
    {"{\"input\":\"x\",\"background\":true}", 400, "background"},
    {"[1]", 400, ""},
};

static void test_refusals(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(BAD) / sizeof(BAD[0]); i++) {
        struct rt_responses_request r;
        struct rt_request_error e;
        int rc = parse(BAD[i].body, &r, &e);
        if (rc == 0 || rt_openai_http_status(e.kind) != BAD[i].status ||
            strcmp(e.param, BAD[i].param) != 0)
            fail_msg("case %zu %s: rc %d status %d param '%s' (%s)", i,
                     BAD[i].body, rc, rt_openai_http_status(e.kind), e.param,
                     e.message);
        assert_null(r.input);
        assert_null(r.chat);
    }
    /* Over the body limit: 413 before parsing. */
    struct rt_openai_cfg c = cfg();
    c.max_body_bytes = 8;
    struct rt_responses_request r;
    struct rt_request_error e;
    assert_int_equal(rt_responses_parse(&c, "{\"input\":\"xx\"}", 14, &r, &e),
                     TG_ETOOBIG);
    assert_int_equal(rt_openai_http_status(e.kind), 413);
    /* Renamed fields are named as sent: max_output_tokens. */
    assert_int_equal(
        parse("{\"input\":\"x\",\"max_output_tokens\":-1}", &r, &e), 0);
    json_t *msgs = json_array();
    rt_responses_messages(r.input, "input", msgs, &e);
    struct rt_gen_request g;
    c = cfg();
    assert_int_not_equal(rt_responses_chat(&c, &r, msgs, &g, &e), 0);
    assert_string_equal(e.param, "max_output_tokens");
    json_decref(msgs);
    rt_responses_request_free(&r);
}

static void test_object_and_event(void **state)
{
    (void)state;
    struct rt_responses_request r;
    struct rt_request_error e;
    assert_int_equal(parse("{\"input\":\"hi\",\"metadata\":{\"k\":\"v\"},"
                           "\"max_output_tokens\":3}",
                           &r, &e),
                     0);
    struct rt_tool_call call = {"call_0123456789abcdef", "f", "{\"a\":1}"};
    json_t *out = rt_responses_output("msg_1", "hey", 3, &call, 1,
                                      "incomplete");
    assert_int_equal(json_array_size(out), 2);
    json_t *fc = json_array_get(out, 1);
    assert_string_equal(json_string_value(json_object_get(fc, "id")),
                        "fc_0123456789abcdef");
    assert_string_equal(json_string_value(json_object_get(fc, "call_id")),
                        call.id);
    /* Calls alone: no message item. */
    json_t *only = rt_responses_output("msg_1", "", 0, &call, 1, "completed");
    assert_int_equal(json_array_size(only), 1);
    json_decref(only);

    struct rt_usage u = {10, 3, 4};
    struct rt_responses_result res = {.id = "resp_x",
                                      .model = "m",
                                      .created = 5,
                                      .status = "incomplete",
                                      .incomplete = "max_output_tokens",
                                      .store = true,
                                      .output = out,
                                      .usage = &u};
    json_t *o = rt_responses_object(&r, &res);
    assert_non_null(o);
    char *txt = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(strstr(txt, "\"input_tokens_details\":{\"cached_tokens\""
                                ":4}"));
    assert_non_null(strstr(txt, "\"total_tokens\":13"));
    assert_non_null(strstr(txt, "\"incomplete_details\":{\"reason\":"
                                "\"max_output_tokens\"}"));
    assert_non_null(strstr(txt, "\"metadata\":{\"k\":\"v\"}"));
    assert_non_null(strstr(txt, "\"max_output_tokens\":3"));
    assert_non_null(strstr(txt, "\"previous_response_id\":null"));
    free(txt);

    int64_t seq = 7;
    char *ev = NULL;
    size_t n = 0;
    assert_int_equal(rt_responses_event("response.completed",
                                        json_pack("{s:O}", "response", o), &seq,
                                        &ev, &n),
                     0);
    assert_int_equal(seq, 8);
    assert_int_equal(n, strlen(ev));
    assert_memory_equal(ev, "event: response.completed\ndata: {", 33);
    assert_non_null(strstr(ev, "\"sequence_number\":7"));
    assert_memory_equal(ev + n - 2, "\n\n", 2);
    free(ev);
    json_decref(o);
    json_decref(out);
    rt_responses_request_free(&r);
}

static void test_think(void **state)
{
    (void)state;
    size_t ro, rl, co;
    static const char A[] = "\n<think>\nweigh it\n</think>\n\nanswer";
    assert_int_equal(rt_responses_split_think(A, strlen(A), &ro, &rl, &co), 1);
    assert_int_equal(rl, 8);
    assert_memory_equal(A + ro, "weigh it", 8);
    assert_string_equal(A + co, "answer");
    /* The generation prompt opened it: the output closes it. */
    static const char B[] = "inside</think>out";
    assert_int_equal(rt_responses_split_think(B, strlen(B), &ro, &rl, &co), 1);
    assert_int_equal(ro, 0);
    assert_int_equal(rl, 6);
    assert_string_equal(B + co, "out");
    /* Cut before its end: all thought, no answer. */
    static const char C[] = "<think>still";
    assert_int_equal(rt_responses_split_think(C, strlen(C), &ro, &rl, &co), 1);
    assert_memory_equal(C + ro, "still", rl);
    assert_int_equal(co, strlen(C));
    /* None. */
    static const char D[] = "plain <think> later";
    assert_int_equal(rt_responses_split_think(D, strlen(D), &ro, &rl, &co), 0);
    assert_int_equal(co, 0);
    /* A reasoning item sent back is the next assistant message's
     * reasoning_content. */
    struct rt_responses_request r;
    struct rt_request_error e;
    assert_int_equal(
        parse("{\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
              "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{"
              "\"type\":\"reasoning_text\",\"text\":\"hm\"}]},"
              "{\"role\":\"assistant\",\"content\":\"a\"}]}",
              &r, &e),
        0);
    json_t *msgs = json_array();
    assert_int_equal(rt_responses_messages(r.input, "input", msgs, &e), 0);
    assert_int_equal(json_array_size(msgs), 2);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(msgs, 1), "reasoning_content")),
                        "hm");
    json_decref(msgs);
    rt_responses_request_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_string_input),
        cmocka_unit_test(test_items_tools_format),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_object_and_event),
        cmocka_unit_test(test_think),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
