/* test_openai_struct.c — the other spellings of structured output
 * (router/api/rt_openai_struct.c): vLLM's structured_outputs and guided_*
 * members, llama.cpp's grammar and json_schema, SGLang's regex, ebnf and
 * json_schema text, each turned into the right spec; one constraint per
 * request; the whitespace policy from the server's default and the
 * request; refusals naming the member. */
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
#include "router/api/rt_openai.h"

static const struct rt_openai_cfg CFG = {
    .served_model = "tiny",
    .max_model_len = 4096,
    .vocab_size = 1000,
};

/* The chat body {"model": "tiny", "messages": [...], <extra>} parsed with
 * cfg; returns the code, the spec (owned) in *spec. */
static int parse(const struct rt_openai_cfg *cfg, const char *extra,
                 char **spec, struct rt_request_error *e)
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}]%s%s}",
             extra[0] ? "," : "", extra);
    struct rt_gen_request r;
    int rc = rt_openai_parse_chat(cfg, body, strlen(body), &r, e);
    *spec = NULL;
    if (rc == 0) {
        *spec = r.q.grammar != NULL ? strdup(r.q.grammar) : NULL;
        rt_gen_request_free(&r);
    }
    return rc;
}

/* The spec's member k as a string ("" when absent). */
static const char *spec_str(const char *spec, const char *k, char *out,
                            size_t cap)
{
    json_t *j = json_loads(spec, 0, NULL);
    const char *v = json_string_value(json_object_get(j, k));
    snprintf(out, cap, "%s", v != NULL ? v : "");
    json_decref(j);
    return out;
}

static void expect_kind(const char *extra, const char *type)
{
    struct rt_request_error e;
    char *spec;
    char buf[64];
    int rc = parse(&CFG, extra, &spec, &e);
    if (rc != 0 || spec == NULL)
        fail_msg("%s: rc %d: %s", extra, rc, e.message);
    if (strcmp(spec_str(spec, "type", buf, sizeof buf), type) != 0)
        fail_msg("%s: spec %s, want type %s", extra, spec, type);
    free(spec);
}

static void expect_refused(const char *extra, const char *param,
                           const char *words)
{
    struct rt_request_error e;
    char *spec;
    int rc = parse(&CFG, extra, &spec, &e);
    if (rc == 0)
        fail_msg("%s: accepted", extra);
    assert_int_equal(rt_openai_http_status(e.kind), 400);
    if (strcmp(e.param, param) != 0 || strstr(e.message, words) == NULL)
        fail_msg("%s: param \"%s\", message \"%s\"; want \"%s\" and \"%s\"",
                 extra, e.param, e.message, param, words);
}

static void test_spellings(void **state)
{
    (void)state;
    expect_kind("\"structured_outputs\":{\"json\":{\"type\":\"object\"}}",
                "json_schema");
    expect_kind("\"structured_outputs\":{\"regex\":\"[a-z]+\"}", "regex");
    expect_kind("\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]}",
                "choice");
    expect_kind("\"structured_outputs\":{\"grammar\":\"root ::= \\\"a\\\"+\"}",
                "grammar");
    expect_kind("\"structured_outputs\":{\"json_object\":true}", "json_object");
    expect_kind("\"guided_json\":{\"type\":\"integer\"}", "json_schema");
    expect_kind("\"guided_json\":\"{\\\"type\\\":\\\"integer\\\"}\"",
                "json_schema");
    expect_kind("\"guided_regex\":\"\\\\d+\"", "regex");
    expect_kind("\"guided_choice\":[\"a\"]", "choice");
    expect_kind("\"guided_grammar\":\"root ::= [0-9]\"", "grammar");
    expect_kind("\"grammar\":\"root ::= \\\"x\\\"\"", "grammar");
    expect_kind("\"ebnf\":\"root ::= \\\"x\\\"\"", "grammar");
    expect_kind("\"regex\":\"x|y\"", "regex");
    expect_kind("\"json_schema\":\"{\\\"enum\\\":[1,2]}\"", "json_schema");
    expect_kind("\"json_schema\":{\"enum\":[1,2]}", "json_schema");
    /* false / null members mean none */
    struct rt_request_error e;
    char *spec;
    assert_int_equal(parse(&CFG,
                           "\"structured_outputs\":{\"json_object\":false}",
                           &spec, &e),
                     0);
    assert_null(spec);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refused("\"guided_regex\":\"(a\"", "guided_regex", "");
    expect_refused("\"structured_outputs\":{\"grammar\":\"start ::= [a\"}",
                   "structured_outputs.grammar", "");
    expect_refused("\"structured_outputs\":{\"choice\":[]}",
                   "structured_outputs.choice", "non-empty array");
    expect_refused(
        "\"guided_json\":{\"type\":\"string\"},\"guided_regex\":\"a\"",
        "guided_regex", "'guided_json'");
    expect_refused("\"response_format\":{\"type\":\"json_object\"},"
                   "\"guided_choice\":[\"a\"]",
                   "guided_choice", "'response_format'");
    expect_refused("\"structured_outputs\":{\"json\":{},\"regex\":\"a\"}",
                   "structured_outputs.regex", "one output constraint");
    expect_refused("\"guided_whitespace_pattern\":\" *\"",
                   "guided_whitespace_pattern", "not supported");
    expect_refused("\"structured_outputs\":{\"json_object\":true,"
                   "\"whitespace\":\"wide\"}",
                   "structured_outputs.whitespace", "'compact'");
    expect_refused("\"structured_outputs\":3", "structured_outputs",
                   "an object");
}

static void test_whitespace(void **state)
{
    (void)state;
    struct rt_request_error e;
    char *spec;
    char buf[64];
    /* compact: no field (the engine's default) */
    assert_int_equal(parse(&CFG, "\"guided_json\":{}", &spec, &e), 0);
    assert_string_equal(spec_str(spec, "whitespace", buf, sizeof buf), "");
    free(spec);
    /* the request's choice */
    assert_int_equal(parse(&CFG,
                           "\"response_format\":{\"type\":\"json_object\"},"
                           "\"structured_outputs\":{\"whitespace\":\"pretty\"}",
                           &spec, &e),
                     0);
    assert_string_equal(spec_str(spec, "whitespace", buf, sizeof buf),
                        "pretty");
    free(spec);
    assert_int_equal(parse(&CFG,
                           "\"structured_outputs\":{\"json\":{},"
                           "\"disable_any_whitespace\":true}",
                           &spec, &e),
                     0);
    assert_string_equal(spec_str(spec, "whitespace", buf, sizeof buf), "none");
    free(spec);
    /* the server's default, and a request that overrides it */
    struct rt_openai_cfg cfg = CFG;
    cfg.ws = 3; /* free */
    assert_int_equal(parse(&cfg, "\"guided_json\":{}", &spec, &e), 0);
    assert_string_equal(spec_str(spec, "whitespace", buf, sizeof buf), "free");
    free(spec);
    assert_int_equal(parse(&cfg,
                           "\"guided_json\":{},\"structured_outputs\":{"
                           "\"whitespace\":\"compact\"}",
                           &spec, &e),
                     0);
    assert_string_equal(spec_str(spec, "whitespace", buf, sizeof buf), "");
    free(spec);
    /* no constraint: nothing to write */
    assert_int_equal(parse(&cfg, "", &spec, &e), 0);
    assert_null(spec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spellings),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_whitespace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
