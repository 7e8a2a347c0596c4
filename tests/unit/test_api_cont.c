/* test_api_cont.c — the pure parts of the conversations both front ends
 * hold (router/api/rt_api_cont.h):
 *   - a chat's messages as Responses items (what a gRPC turn stores): a
 *     system and a user message with input_text parts, an assistant's
 *     thought as a reasoning item before its function_call items, tool
 *     results as function_call_output items, an assistant answer with an
 *     output_text part, each with an id of its kind; read back by the
 *     Responses API's rt_responses_messages and the chat parser, they are
 *     the same conversation (what a re-render of a gRPC history renders);
 *   - tools in the Responses shape (what the stored Response object lists
 *     and a continuation compares);
 *   - whether a continuation keeps the stored ids: the same instructions
 *     and tools, none being none. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "router/api/rt_api_cont.h"
#include "router/api/rt_openai_chat.h"
#include "router/api/rt_responses.h"

static void test_items_round_trip(void **state)
{
    (void)state;
    struct ct_tool_call calls[2] = {
        {.id = "call_1", .name = "get", .arguments = "{\"k\":1}"},
        {.id = "call_2", .name = "put", .arguments = "{}"},
    };
    struct ct_message m[] = {
        {.role = CT_ROLE_SYSTEM, .content = "Be brief."},
        {.role = CT_ROLE_USER, .content = "Hi"},
        {.role = CT_ROLE_ASSISTANT,
         .content = "",
         .content_null = true,
         .reasoning_content = "hmm",
         .calls = calls,
         .n_calls = 2},
        {.role = CT_ROLE_TOOL, .content = "one", .tool_call_id = "call_1"},
        {.role = CT_ROLE_TOOL, .content = "two", .tool_call_id = "call_2"},
        {.role = CT_ROLE_ASSISTANT, .content = "done"},
    };
    size_t n = sizeof(m) / sizeof(m[0]);
    json_t *items = json_array();
    assert_int_equal(rt_api_cont_items(m, n, items), 0);
    static const char *const types[] = {"message",
                                        "message",
                                        "reasoning",
                                        "function_call",
                                        "function_call",
                                        "function_call_output",
                                        "function_call_output",
                                        "message"};
    static const char *const prefixes[] = {"msg_", "msg_", "rs_",  "fc_",
                                           "fc_",  "fco_", "fco_", "msg_"};
    assert_int_equal(json_array_size(items), 8);
    for (size_t i = 0; i < 8; i++) {
        json_t *it = json_array_get(items, i);
        assert_string_equal(json_string_value(json_object_get(it, "type")),
                            types[i]);
        const char *id = json_string_value(json_object_get(it, "id"));
        assert_non_null(id);
        assert_int_equal(strncmp(id, prefixes[i], strlen(prefixes[i])), 0);
        assert_int_equal(strlen(id), strlen(prefixes[i]) + 32);
    }
    json_t *sys = json_array_get(items, 0);
    assert_string_equal(json_string_value(json_object_get(sys, "role")),
                        "system");
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(sys, "content"), 0), "type")),
        "input_text");
    json_t *ans = json_array_get(items, 7);
    assert_string_equal(rt_responses_item_text(ans), "done");
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(ans, "content"), 0), "type")),
        "output_text");

    /* Back through the Responses API's reading and the chat parser. */
    json_t *root = json_object(), *msgs = json_array();
    json_object_set(root, "messages", msgs);
    struct rt_request_error e;
    assert_int_equal(rt_responses_messages(items, "input", msgs, &e), 0);
    struct ct_chat c = {0};
    assert_int_equal(rt_openai_chat_parse_messages(root, &c, &e), 0);
    assert_int_equal(c.n_messages, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(c.messages[i].role, m[i].role);
        assert_string_equal(c.messages[i].content, m[i].content);
        assert_int_equal(c.messages[i].n_calls, m[i].n_calls);
        for (size_t k = 0; k < m[i].n_calls; k++) {
            assert_string_equal(c.messages[i].calls[k].id, calls[k].id);
            assert_string_equal(c.messages[i].calls[k].name, calls[k].name);
            assert_string_equal(c.messages[i].calls[k].arguments,
                                calls[k].arguments);
        }
        if (m[i].tool_call_id != NULL)
            assert_string_equal(c.messages[i].tool_call_id, m[i].tool_call_id);
    }
    assert_string_equal(c.messages[2].reasoning_content, "hmm");
    ct_chat_free(&c);
    json_decref(msgs);
    json_decref(root);
    json_decref(items);
}

static void test_tools(void **state)
{
    (void)state;
    json_t *none = rt_api_cont_tools(NULL);
    assert_true(json_is_array(none) && json_array_size(none) == 0);
    json_decref(none);
    struct ct_tools *t = ct_tools_new(2);
    t->v[0].name = strdup("get");
    t->v[0].description = strdup("Gets it.");
    t->v[0].parameters = strdup("{\"type\":\"object\"}");
    t->v[0].strict = true;
    t->v[1].name = strdup("put");
    json_t *a = rt_api_cont_tools(t);
    json_error_t je;
    json_t *want = json_loads(
        "[{\"type\":\"function\",\"name\":\"get\",\"description\":\"Gets "
        "it.\",\"parameters\":{\"type\":\"object\"},\"strict\":true},"
        "{\"type\":\"function\",\"name\":\"put\"}]",
        0, &je);
    assert_non_null(want);
    assert_true(json_equal(a, want));
    json_decref(a);
    json_decref(want);
    ct_tools_unref(t);
}

static void test_same_top(void **state)
{
    (void)state;
    struct rt_api_cont_prev p = {.tools = json_array()};
    json_t *instr = json_string("Be brief."), *empty = json_array();
    json_t *tools = json_pack("[{s:s, s:s}]", "type", "function", "name", "f");
    assert_true(rt_api_cont_same_top(&p, NULL, NULL));
    assert_true(rt_api_cont_same_top(&p, NULL, empty));
    assert_false(rt_api_cont_same_top(&p, instr, NULL));
    assert_false(rt_api_cont_same_top(&p, NULL, tools));
    p.instructions = json_incref(instr);
    json_decref(p.tools);
    p.tools = json_incref(tools);
    assert_true(rt_api_cont_same_top(&p, instr, tools));
    assert_false(rt_api_cont_same_top(&p, NULL, tools));
    assert_false(rt_api_cont_same_top(&p, instr, NULL));
    json_t *other = json_string("Be long.");
    assert_false(rt_api_cont_same_top(&p, other, tools));
    json_decref(other);
    rt_api_cont_prev_free(&p);
    json_decref(instr);
    json_decref(empty);
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_items_round_trip),
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_same_top),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
