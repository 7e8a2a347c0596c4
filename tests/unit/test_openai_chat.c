/* test_openai_chat.c — the chat side of the OpenAI request parser
 * (router/api/rt_openai.h, rt_openai_chat.h): messages of every role and
 * content form, tools and tool_choice (auto, none, required, a named
 * function, strict tools under auto) with the output constraint they
 * build (the grammar spec text, common/grammar/gm_spec.h), and tools on
 * /tokenize. The rest of request parsing is tested in test_openai.c. */
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
#include "common/chat/ct_template.h"
#include "router/api/rt_openai.h"

/* What a template sees of a conversation: `expr` (e.g. "messages") as
 * transformers' tojson writes it, rendered by the renderer the server uses
 * (ct_template_render_chat). Caller frees. */
static char *view(const struct ct_chat *c, const char *expr)
{
    char src[128], err[256];
    snprintf(src, sizeof(src), "{{ %s | tojson }}", expr);
    struct ct_template t = {0};
    assert_int_equal(
        ct_template_load_text(&t, src, strlen(src), NULL, err, sizeof(err)), 0);
    char *out = NULL;
    size_t len = 0;
    int rc = ct_template_render_chat(&t, c, &out, &len, err, sizeof(err));
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    ct_template_free(&t);
    return out;
}

static const struct rt_openai_cfg CFG = {
    .served_model = "tiny",
    .max_model_len = 128,
    .vocab_size = 1000,
    .max_body_bytes = 4096,
};

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_tool_grammar(void **state)
{
    (void)state;
    struct rt_openai_cfg cfg = CFG;
    cfg.tool_format = CT_TOOLS_HERMES;
    cfg.max_body_bytes = 0;
    struct rt_gen_request r;
    struct rt_request_error e;
#define TOOLS                                                   \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":" \
    "\"f\",\"parameters\":{\"type\":\"object\"}}},{\"type\":"   \
    "\"function\",\"function\":{\"name\":\"g\"}}]"
    const char *b1 = "{" MSG "," TOOLS ",\"tool_choice\":\"required\"}";
    assert_int_equal(rt_openai_parse_chat(&cfg, b1, strlen(b1), &r, &e), 0);
    assert_int_equal(r.tool_choice, RT_TOOL_CHOICE_REQUIRED);
    assert_non_null(r.q.grammar);
    assert_non_null(strstr(r.q.grammar, "\"tool_calls\""));
    assert_non_null(strstr(r.q.grammar, "\"g\""));
    assert_non_null(strstr(r.q.grammar, "\"max_calls\":0"));
    rt_gen_request_free(&r);
    const char *b2 = "{" MSG "," TOOLS ",\"parallel_tool_calls\":false,"
                     "\"tool_choice\":{\"type\":\"function\",\"function\":"
                     "{\"name\":\"f\"}}}";
    assert_int_equal(rt_openai_parse_chat(&cfg, b2, strlen(b2), &r, &e), 0);
    assert_int_equal(r.tool_choice, RT_TOOL_CHOICE_FUNCTION);
    assert_non_null(r.q.grammar);
    assert_null(strstr(r.q.grammar, "\"g\""));
    assert_non_null(strstr(r.q.grammar, "\"max_calls\":1"));
    rt_gen_request_free(&r);
    const char *b3 = "{" MSG "," TOOLS ",\"tool_choice\":\"required\","
                     "\"response_format\":{\"type\":\"json_object\"}}";
    assert_int_equal(rt_openai_parse_chat(&cfg, b3, strlen(b3), &r, &e),
                     TG_EUNSUPPORTED);
    assert_string_equal(e.param, "response_format");
    /* Under "auto" (the default) with a strict tool: a triggered spec,
     * the strict tool's arguments held to its parameters, the other's to
     * any object; no strict tool or "none": unconstrained. */
#define STRICT                                                              \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","       \
    "\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":{"  \
    "\"x\":{\"type\":\"integer\"}}}}},{\"type\":\"function\",\"function\":" \
    "{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"properties\":{"  \
    "\"y\":{\"type\":\"string\"}}}}}]"
    const char *b4 = "{" MSG "," STRICT "}";
    assert_int_equal(rt_openai_parse_chat(&cfg, b4, strlen(b4), &r, &e), 0);
    assert_non_null(r.q.grammar);
    assert_non_null(strstr(r.q.grammar, "\"type\":\"triggered\""));
    assert_non_null(strstr(r.q.grammar, "\"trigger\":\"<tool_call>\""));
    assert_non_null(strstr(r.q.grammar, "\"anchored\":false"));
    assert_non_null(strstr(r.q.grammar, "\"max_calls\":1"));
    assert_non_null(strstr(r.q.grammar, "\"x\""));
    assert_null(strstr(r.q.grammar, "\"y\"")); /* g is not strict */
    rt_gen_request_free(&r);
    const char *b5 = "{" MSG "," STRICT ",\"tool_choice\":\"none\"}";
    assert_int_equal(rt_openai_parse_chat(&cfg, b5, strlen(b5), &r, &e), 0);
    assert_null(r.q.grammar);
    rt_gen_request_free(&r);
    const char *b6 = "{" MSG "," TOOLS "}";
    assert_int_equal(rt_openai_parse_chat(&cfg, b6, strlen(b6), &r, &e), 0);
    assert_null(r.q.grammar);
    rt_gen_request_free(&r);
    const char *b7 = "{" MSG "," STRICT
                     ",\"response_format\":{\"type\":\"json_object\"}}";
    assert_int_equal(rt_openai_parse_chat(&cfg, b7, strlen(b7), &r, &e),
                     TG_EUNSUPPORTED);
    assert_string_equal(e.param, "response_format");
    cfg.tool_format = CT_TOOLS_LLAMA_JSON;
    assert_int_equal(rt_openai_parse_chat(&cfg, b4, strlen(b4), &r, &e), 0);
    assert_non_null(strstr(r.q.grammar, "\"trigger\":\"{\""));
    assert_non_null(strstr(r.q.grammar, "\"anchored\":true"));
    assert_non_null(strstr(r.q.grammar, "\"max_calls\":0"));
    rt_gen_request_free(&r);
#undef STRICT
#undef TOOLS
}

static void test_chat_messages(void **state)
{
    (void)state;
    const char *b =
        "{\"model\":\"tiny\",\"messages\":["
        "{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"developer\",\"content\":\"dev\"},"
        "{\"role\":\"user\",\"name\":\"ann\",\"content\":[{\"type\":\"text\","
        "\"text\":\"part one\"},{\"type\":\"text\",\"text\":\"part two\"}]},"
        "{\"role\":\"assistant\",\"content\":\"ok\",\"reasoning_content\":"
        "\"hmm\",\"tool_calls\":[]},"
        "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"call_1\"},"
        "{\"role\":\"user\",\"content\":[]}],"
        "\"max_tokens\":50,\"max_completion_tokens\":20,\"logprobs\":true,"
        "\"top_logprobs\":3,\"tools\":[],\"tool_choice\":\"none\","
        "\"chat_template_kwargs\":{\"enable_thinking\":false,\"other\":1}}";
    struct rt_gen_request r;
    struct rt_request_error e;
    int rc = rt_openai_parse_chat(&CFG, b, strlen(b), &r, &e);
    if (rc)
        print_error("%s (param %s)\n", e.message, e.param);
    assert_int_equal(rc, 0);
    assert_int_equal(r.endpoint, RT_ENDPOINT_CHAT);
    assert_int_equal(r.q.chat.n_messages, 6);
    assert_int_equal(r.q.chat.messages[0].role, CT_ROLE_SYSTEM);
    assert_int_equal(r.q.chat.messages[1].role, CT_ROLE_SYSTEM);
    assert_string_equal(ct_role_name(r.q.chat.messages[1].role), "system");
    assert_int_equal(r.q.chat.messages[2].role, CT_ROLE_USER);
    assert_string_equal(r.q.chat.messages[2].name, "ann");
    assert_string_equal(r.q.chat.messages[2].content, "part one\npart two");
    assert_int_equal(r.q.chat.messages[3].role, CT_ROLE_ASSISTANT);
    assert_string_equal(r.q.chat.messages[3].reasoning_content, "hmm");
    assert_int_equal(r.q.chat.messages[4].role, CT_ROLE_TOOL);
    assert_string_equal(r.q.chat.messages[4].tool_call_id, "call_1");
    assert_string_equal(r.q.chat.messages[5].content, "");
    assert_null(r.q.chat.messages[0].name);
    assert_int_equal(r.q.opts.max_tokens, 20);
    assert_string_equal(r.q.max_tokens_param, "max_completion_tokens");
    assert_int_equal(r.q.opts.logprobs, 3);
    assert_true(r.q.chat.add_generation_prompt);
    assert_false(r.q.chat.continue_final_message);
    assert_string_equal(r.q.chat.kwargs,
                        "{\"enable_thinking\":false,\"other\":1}");
    assert_int_equal(r.tool_choice, RT_TOOL_CHOICE_NONE);
    assert_non_null(r.q.chat.tools);
    assert_int_equal(r.q.chat.tools->n, 0);
    assert_false(r.q.add_special_tokens);
    /* the template's view: developer is system, parts joined, an empty
     * tool_calls list dropped, optional members only when given; the
     * kwargs are variables of their own */
    char *v = view(&r.q.chat, "messages");
    assert_string_equal(
        v, "[{\"role\": \"system\", \"content\": \"be brief\"}, "
           "{\"role\": \"system\", \"content\": \"dev\"}, "
           "{\"role\": \"user\", \"content\": \"part one\\npart two\", "
           "\"name\": \"ann\"}, "
           "{\"role\": \"assistant\", \"content\": \"ok\", "
           "\"reasoning_content\": \"hmm\"}, "
           "{\"role\": \"tool\", \"content\": \"42\", \"tool_call_id\": "
           "\"call_1\"}, "
           "{\"role\": \"user\", \"content\": \"\"}]");
    free(v);
    v = view(&r.q.chat, "[enable_thinking, other, tools]");
    assert_string_equal(v, "[false, 1, []]");
    free(v);
    rt_gen_request_free(&r);

    const char *b2 = "{" MSG ",\"logprobs\":true,\"add_generation_prompt\":"
                     "false,\"continue_final_message\":true,"
                     "\"chat_template_kwargs\":{\"enable_thinking\":true}}";
    assert_int_equal(rt_openai_parse_chat(&CFG, b2, strlen(b2), &r, &e), 0);
    assert_int_equal(r.q.opts.max_tokens, -1); /* chat default */
    assert_int_equal(r.q.opts.logprobs, 0);
    assert_false(r.q.chat.add_generation_prompt);
    assert_true(r.q.chat.continue_final_message);
    assert_string_equal(r.q.chat.kwargs, "{\"enable_thinking\":true}");
    rt_gen_request_free(&r);

    const char *b3 = "{" MSG ",\"top_logprobs\":0,\"max_tokens\":7}";
    assert_int_equal(rt_openai_parse_chat(&CFG, b3, strlen(b3), &r, &e), 0);
    assert_int_equal(r.q.opts.logprobs, -1);
    assert_int_equal(r.q.opts.max_tokens, 7);
    assert_string_equal(r.q.max_tokens_param, "max_tokens");
    assert_null(r.q.chat.kwargs);
    assert_null(r.q.chat.tools);
    assert_int_equal(r.tool_choice, RT_TOOL_CHOICE_AUTO);
    rt_gen_request_free(&r);
}

static void test_chat_tools(void **state)
{
    (void)state;
    const char *b =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
        "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{"
        "\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": "
        "\\\"Paris\\\"}\"}},"
        "{\"id\":\"call_2\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"not json\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":"
        "\"21C\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"description\":\"Weather.\",\"parameters\":"
        "{\"type\":\"object\"},\"strict\":false}}],"
        "\"tool_choice\":\"auto\",\"parallel_tool_calls\":false}";
    struct rt_gen_request r;
    struct rt_request_error e;
    int rc = rt_openai_parse_chat(&CFG, b, strlen(b), &r, &e);
    if (rc)
        print_error("%s (param %s)\n", e.message, e.param);
    assert_int_equal(rc, 0);
    assert_true(r.q.chat.messages[1].content_null);
    assert_string_equal(r.q.chat.messages[1].content, "");
    assert_int_equal(r.q.chat.messages[1].n_calls, 2);
    assert_int_equal(r.tool_choice, RT_TOOL_CHOICE_AUTO);
    assert_int_equal(r.q.chat.tools->n, 1);
    assert_string_equal(r.q.chat.tools->v[0].name, "get_weather");
    assert_string_equal(r.q.chat.tools->v[0].description, "Weather.");
    assert_string_equal(r.q.chat.tools->v[0].parameters,
                        "{\"type\":\"object\"}");
    assert_false(r.q.chat.tools->v[0].strict);
    /* arguments parsed from their JSON string; a non-JSON string stays */
    char *v = view(&r.q.chat, "messages[1]");
    assert_string_equal(
        v, "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
           "{\"id\": \"call_1\", \"type\": \"function\", \"function\": {"
           "\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}, "
           "{\"id\": \"call_2\", \"type\": \"function\", \"function\": {"
           "\"name\": \"f\", \"arguments\": \"not json\"}}]}");
    free(v);
    /* the tools as sent */
    v = view(&r.q.chat, "tools");
    assert_string_equal(
        v, "[{\"type\": \"function\", \"function\": {\"name\": "
           "\"get_weather\", \"description\": \"Weather.\", \"parameters\": "
           "{\"type\": \"object\"}, \"strict\": false}}]");
    free(v);
    rt_gen_request_free(&r);

    /* /tokenize takes tools too */
    struct rt_tokenize_request t;
    const char *b2 = "{" MSG ",\"tools\":[{\"type\":\"function\","
                     "\"function\":{\"name\":\"f\"}}]}";
    assert_int_equal(rt_openai_parse_tokenize(&CFG, b2, strlen(b2), &t, &e), 0);
    assert_int_equal(t.chat.tools->n, 1);
    assert_int_equal(t.chat.n_messages, 1);
    rt_tokenize_request_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tool_grammar),
        cmocka_unit_test(test_chat_messages),
        cmocka_unit_test(test_chat_tools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
