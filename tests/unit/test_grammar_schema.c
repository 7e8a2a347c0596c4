/* test_grammar_schema.c — JSON Schema and tool calls compiled into
 * grammars (common/grammar/gm_schema.h, gm_tool.h, gm_spec.h,
 * gm_cache.h): every keyword outside the subset refused naming it and its
 * JSON pointer, malformed and unsatisfiable schemas, the limits, oneOf
 * exclusivity, the corpus tests/grammar/schemas.json byte by byte (its
 * valid documents accepted, its invalid and refused ones rejected),
 * tool-call text in the Hermes and Llama-3 formats, specs, and the
 * compile cache under concurrent use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_cache.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_grammar.h"

static const char *const pieces[] = {"\":", "\",\"", "{\"", "\"}", "true",
                                     "null", "<tool_call>", "\n"};
static struct gm_vocab vocab;

static int setup(void **state)
{
    (void)state;
    return tt_grammar_byte_vocab(&vocab, pieces, TT_COUNT(pieces));
}

static int teardown(void **state)
{
    (void)state;
    gm_vocab_free(&vocab);
    return 0;
}

/* Compiles schema text; returns the code, the message in err. */
static int try_schema(const char *schema_text, struct gm_grammar **g,
                      char *err, size_t errlen)
{
    json_error_t je;
    json_t *s = json_loads(schema_text, JSON_DECODE_ANY, &je);
    if (s == NULL)
        fail_msg("test schema does not parse: %s: %s", schema_text, je.text);
    char *spec;
    size_t len;
    assert_int_equal(gm_spec_json_schema(s, &spec, &len), 0);
    json_decref(s);
    *g = NULL;
    int rc = gm_spec_compile(spec, len, &vocab, NULL, g, err, errlen);
    /* the check without a vocabulary agrees */
    char err2[512];
    int rc2 = gm_spec_check(spec, len, NULL, err2, sizeof err2);
    assert_int_equal(rc, rc2);
    if (rc != 0)
        assert_string_equal(err, err2);
    free(spec);
    return rc;
}

static void refused(const char *schema, int code, const char *msg)
{
    struct gm_grammar *g;
    char err[512] = "";
    int rc = try_schema(schema, &g, err, sizeof err);
    if (rc != code || strstr(err, msg) == NULL)
        fail_msg("%s: got %s \"%s\", want %s \"%s\"", schema, tg_err_name(rc),
                 err, tg_err_name(code), msg);
    assert_null(g);
}

static struct gm_grammar *compiled(const char *schema)
{
    struct gm_grammar *g;
    char err[512] = "";
    if (try_schema(schema, &g, err, sizeof err) != 0)
        fail_msg("%s: %s", schema, err);
    return g;
}

static int accepts(struct gm_grammar *g, const char *text)
{
    struct gm_matcher m;
    assert_int_equal(gm_matcher_init(&m, g), 0);
    int rc = gm_matcher_accept_bytes(&m, text, strlen(text));
    int ok = rc == 0 && gm_matcher_can_end(&m);
    gm_matcher_free(&m);
    return ok;
}

static void test_unsupported_keywords(void **state)
{
    (void)state;
    refused("{\"type\":\"array\",\"items\":{\"type\":\"number\","
            "\"$dynamicRef\":\"#x\"}}",
            TG_EUNSUPPORTED, "\"$dynamicRef\" at #/items");
    static const char *const kws[] = {"$dynamicRef", "$recursiveRef",
                                      "nullable", "requried"};
    for (size_t i = 0; i < TT_COUNT(kws); i++) {
        char schema[256], msg[128];
        snprintf(schema, sizeof schema,
                 "{\"$defs\":{\"d\":{\"%s\":[]}},\"properties\":{\"a\":{\"$ref\":"
                 "\"#/$defs/d\"}}}",
                 kws[i]);
        snprintf(msg, sizeof msg, "unsupported keyword \"%s\" at #/$defs/d",
                 kws[i]);
        refused(schema, TG_EUNSUPPORTED, msg);
    }
    refused("{\"$ref\":\"http://example.com/s.json\"}", TG_EUNSUPPORTED,
            "only references inside the document");
    refused("{\"$ref\":\"#anchor\"}", TG_EFORMAT, "no \"$anchor\" \"anchor\"");
    refused("{\"enum\":[\"a\"],\"minItems\":3}", TG_EUNSUPPORTED,
            "\"enum\" alongside \"minItems\"");
}

/* $ref resolution (draft 2020-12): against the resource its schema sits
 * in, pointers percent-decoded before ~ escapes, anchors, and resources
 * named by their $id. Two false accepts the old resolver gave: a $ref
 * under an embedded $id went to the root's $defs, and "#/$defs/~%30"
 * went to the key "~0" instead of "~". */
static void test_refs(void **state)
{
    (void)state;
    struct gm_grammar *g = compiled(
        "{\"$defs\":{\"x\":{\"type\":\"integer\"}},\"properties\":{\"a\":{"
        "\"$id\":\"http://example.com/inner\",\"$defs\":{\"x\":{\"type\":"
        "\"string\"}},\"$ref\":\"#/$defs/x\"}},\"required\":[\"a\"],"
        "\"additionalProperties\":false}");
    assert_false(accepts(g, "{\"a\":1}"));
    assert_true(accepts(g, "{\"a\":\"s\"}"));
    gm_grammar_unref(g);
    g = compiled("{\"$defs\":{\"~0\":{\"type\":\"integer\"},\"~\":{\"type\":"
                 "\"string\"}},\"$ref\":\"#/$defs/~%30\"}");
    assert_false(accepts(g, "1"));
    assert_true(accepts(g, "\"1\""));
    gm_grammar_unref(g);
    g = compiled("{\"$defs\":{\"a/b\":{\"type\":\"boolean\"}},"
                 "\"$ref\":\"#/$defs/a~1b\"}");
    assert_true(accepts(g, "true"));
    assert_false(accepts(g, "1"));
    gm_grammar_unref(g);
    /* an anchor, in its resource only */
    g = compiled("{\"$defs\":{\"n\":{\"$anchor\":\"num\",\"type\":"
                 "\"number\"}},\"$ref\":\"#num\"}");
    assert_true(accepts(g, "2.5"));
    assert_false(accepts(g, "\"x\""));
    gm_grammar_unref(g);
    /* a resource named by its $id, relative to the root's base URI */
    g = compiled("{\"$id\":\"http://example.com/root.json\",\"$defs\":{"
                 "\"b\":{\"$id\":\"bool.json\",\"type\":\"boolean\"}},"
                 "\"properties\":{\"v\":{\"$ref\":\"bool.json\"}},"
                 "\"required\":[\"v\"]}");
    assert_true(accepts(g, "{\"v\":false}"));
    assert_false(accepts(g, "{\"v\":0}"));
    gm_grammar_unref(g);
    g = compiled("{\"$id\":\"http://example.com/a/b/root.json\",\"items\":{"
                 "\"$ref\":\"../c/s.json#/$defs/i\"},\"$defs\":{\"s\":{\"$id\":"
                 "\"http://example.com/a/c/s.json\",\"$defs\":{\"i\":{\"type\":"
                 "\"integer\"}}}}}");
    assert_true(accepts(g, "[1,2]"));
    assert_false(accepts(g, "[1.5]"));
    gm_grammar_unref(g);
    /* "$id" inside an enum value is no identifier */
    g = compiled("{\"$defs\":{\"e\":{\"enum\":[{\"$id\":\"x.json\"}]}},"
                 "\"anyOf\":[{\"$ref\":\"#/$defs/e\"},{\"type\":\"null\"}]}");
    assert_true(accepts(g, "{\"$id\":\"x.json\"}"));
    assert_true(accepts(g, "null"));
    gm_grammar_unref(g);
    refused("{\"$ref\":\"x.json\"}", TG_EUNSUPPORTED,
            "not a resource of this schema");
}

static void test_malformed_and_unsatisfiable(void **state)
{
    (void)state;
    refused("{\"type\":5}", TG_EFORMAT, "malformed \"type\" at #");
    refused("{\"type\":\"text\"}", TG_EFORMAT, "malformed \"type\"");
    refused("{\"type\":\"string\",\"minLength\":-1}", TG_EFORMAT,
            "malformed \"minLength\"");
    refused("{\"required\":[1]}", TG_EFORMAT, "malformed \"required\"");
    refused("{\"anyOf\":[]}", TG_EFORMAT, "malformed \"anyOf\"");
    refused("{\"properties\":{\"a\":5}}", TG_EFORMAT,
            "a schema must be an object or a boolean at #/properties/a");
    refused("{\"$ref\":\"#/$defs/missing\"}", TG_EFORMAT, "does not resolve");
    refused("5", TG_EFORMAT, "a schema must be");
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", TG_EINVAL,
            "\"maxItems\" 2 is below \"minItems\" 3");
    refused("{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", TG_EINVAL,
            "below \"minLength\"");
    refused("{\"enum\":[]}", TG_EINVAL, "no value of \"enum\"");
    refused("{\"type\":\"string\",\"enum\":[1,2]}", TG_EINVAL,
            "no value of \"enum\"");
    refused("{\"type\":\"object\",\"required\":[\"x\"],"
            "\"additionalProperties\":false}",
            TG_EINVAL, "required property \"x\" is not in \"properties\"");
    refused("false", TG_EINVAL, "no document satisfies");
    refused("{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":"
            "[\"a\"]}",
            TG_EINVAL, "no document satisfies");
    refused("{\"$ref\":\"#\"}", TG_EINVAL, "no document satisfies");
    refused("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", TG_EINVAL,
            "left-recursive");
    refused("{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#\"}},"
            "\"required\":[\"next\"]}",
            TG_EINVAL, "no document satisfies");
    /* an optional property nothing satisfies is left out */
    struct gm_grammar *g = compiled(
        "{\"type\":\"object\",\"properties\":{\"a\":false,\"b\":{\"type\":"
        "\"null\"}}}");
    assert_true(accepts(g, "{\"b\":null}"));
    assert_false(accepts(g, "{\"a\":null}"));
    gm_grammar_unref(g);
}

static void test_limits(void **state)
{
    (void)state;
    char schema[8192] = "";
    size_t n = 0;
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(schema + n, sizeof schema - n,
                              "{\"type\":\"array\",\"items\":");
    n += (size_t)snprintf(schema + n, sizeof schema - n, "{}");
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(schema + n, sizeof schema - n, "}");
    refused(schema, TG_ETOOBIG, "nested deeper than 32 levels");
    refused("{\"type\":\"string\",\"minLength\":5000}", TG_ETOOBIG,
            "\"minLength\" 5000 is over the limit 1024");
    refused("{\"type\":\"array\",\"minItems\":2000}", TG_ETOOBIG,
            "\"minItems\" 2000 is over the limit 1024");
    /* a maxLength over the cap generates at most the cap */
    struct gm_grammar *g = compiled("{\"type\":\"string\",\"maxLength\":5000}");
    char *text = malloc(1100);
    text[0] = '"';
    memset(text + 1, 'x', 1024);
    strcpy(text + 1025, "\"");
    assert_true(accepts(g, text));
    strcpy(text + 1025, "x\""); /* 1025 characters */
    assert_false(accepts(g, text));
    free(text);
    gm_grammar_unref(g);
}

static void test_oneof_exclusive(void **state)
{
    (void)state;
    static const char *const ok[] = {
        "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}",
        "{\"oneOf\":[{\"const\":1},{\"const\":2},{\"type\":\"string\"}]}",
        ("{\"oneOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"string\","
         "\"minLength\":3}]}"),
        ("{\"oneOf\":[{\"type\":\"array\",\"maxItems\":1},{\"type\":\"array\","
         "\"minItems\":2}]}"),
        ("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"}},"
         "\"required\":[\"k\"]},{\"type\":\"object\",\"properties\":{\"k\":{"
         "\"enum\":[\"b\",\"c\"]}},\"required\":[\"k\"]}]}"),
        ("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":"
         "[\"a\"],\"additionalProperties\":false},{\"type\":\"object\","
         "\"properties\":{\"b\":{}},\"required\":[\"b\"],"
         "\"additionalProperties\":false}]}"),
        ("{\"oneOf\":[{\"$ref\":\"#/$defs/x\"},{\"type\":\"null\"}],\"$defs\":{\"x\":"
         "{\"type\":\"boolean\"}}}"),
    };
    for (size_t i = 0; i < TT_COUNT(ok); i++)
        gm_grammar_unref(compiled(ok[i]));
    static const char *const overlap[] = {
        "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}",
        "{\"oneOf\":[{\"type\":\"string\"},{}]}",
        ("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
         "\"string\"}}},{\"type\":\"object\",\"properties\":{\"b\":{\"type\":"
         "\"string\"}}}]}"),
        ("{\"oneOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":"
         "\"string\",\"minLength\":3}]}"),
        "{\"oneOf\":[{\"enum\":[1,\"a\"]},{\"type\":\"string\"}]}",
    };
    for (size_t i = 0; i < TT_COUNT(overlap); i++)
        refused(overlap[i], TG_EUNSUPPORTED, "use \"anyOf\" for overlap");
}

/* The corpus: each valid document accepted byte by byte, each invalid
 * and refused one rejected (the documents are pretty-printed: the specs
 * take the pretty whitespace policy); and each valid document written in
 * compact JSON accepted under the default, compact policy. */
static void test_corpus_documents(void **state)
{
    (void)state;
    json_t *doc = tt_grammar_corpus();
    assert_non_null(doc);
    const json_t *list = json_object_get(doc, "schemas");
    assert_true(json_array_size(list) >= 30);
    size_t i;
    const json_t *e;
    json_array_foreach(list, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        size_t len;
        char *spec = tt_grammar_spec(json_object_get(e, "schema"), &len);
        struct gm_grammar *g = NULL, *gc = NULL;
        char err[512];
        if (gm_spec_compile(spec, len, &vocab, NULL, &gc, err, sizeof err) != 0)
            fail_msg("%s: %s", name, err);
        assert_int_equal(gm_spec_whitespace(GM_WS_PRETTY, &spec, &len), 0);
        if (gm_spec_compile(spec, len, &vocab, NULL, &g, err, sizeof err) != 0)
            fail_msg("%s: %s", name, err);
        free(spec);
        size_t k0;
        const json_t *d0;
        json_array_foreach(json_object_get(e, "valid"), k0, d0)
        {
            json_t *v = json_loads(json_string_value(d0), JSON_DECODE_ANY,
                                   NULL);
            char *c = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            if (c == NULL || !accepts(gc, c))
                fail_msg("%s: valid document %zu in compact form [%s] "
                         "rejected",
                         name, k0, c ? c : "?");
            free(c);
            json_decref(v);
        }
        gm_grammar_unref(gc);
        static const char *const lists[] = {"valid", "invalid", "refused"};
        for (int l = 0; l < 3; l++) {
            size_t k;
            const json_t *d;
            json_array_foreach(json_object_get(e, lists[l]), k, d)
            {
                int got = accepts(g, json_string_value(d));
                if (got != (l == 0))
                    fail_msg("%s: %s document %zu [%s] %s", name, lists[l], k,
                             json_string_value(d),
                             got ? "accepted" : "rejected");
            }
        }
        gm_grammar_unref(g);
    }
    json_decref(doc);
}

static void test_tool_calls(void **state)
{
    (void)state;
    json_t *params = json_loads(
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
        "\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"],"
        "\"additionalProperties\":false}",
        0, NULL);
    struct gm_tool_fn fns[] = {{"get_weather", params}, {"ping\"q", NULL}};
    char *spec;
    size_t len;
    struct gm_grammar *g;
    char err[512];
    assert_int_equal(gm_spec_tools(&GM_TOOL_HERMES, fns, 2, 1, 0, &spec, &len),
                     0);
    assert_int_equal(gm_spec_compile(spec, len, &vocab, NULL, &g, err,
                                     sizeof err),
                     0);
    free(spec);
    const char *one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                      "{\"city\": \"Oslo\"}}\n</tool_call>";
    assert_true(accepts(g, one));
    char two[512];
    snprintf(two, sizeof two,
             "%s\n<tool_call>\n{\"name\": \"ping\\\"q\", \"arguments\": "
             "{\"any\": [1]}}\n</tool_call>",
             one);
    assert_true(accepts(g, two));
    assert_false(accepts(g, "<tool_call>\n{\"name\": \"other\", \"arguments\": "
                            "{}}\n</tool_call>"));
    assert_false(accepts(g, "<tool_call>\n{\"name\": \"get_weather\", "
                            "\"arguments\": {\"days\": 1}}\n</tool_call>"));
    assert_false(accepts(g, "Sure! <tool_call>"));
    assert_false(accepts(g, ""));
    /* a trigger already generated: the rest is constrained from there */
    struct gm_matcher m;
    gm_matcher_init(&m, g);
    assert_int_equal(gm_matcher_accept_bytes(&m, "<tool_call>\n", 12), 0);
    assert_int_equal(gm_matcher_accept_bytes(&m, "{\"name\": \"x", 11),
                     TG_EINVAL);
    gm_matcher_free(&m);
    gm_grammar_unref(g);

    assert_int_equal(
        gm_spec_tools(&GM_TOOL_LLAMA3_JSON, fns, 1, 1, 2, &spec, &len), 0);
    assert_int_equal(gm_spec_compile(spec, len, &vocab, NULL, &g, err,
                                     sizeof err),
                     0);
    free(spec);
    const char *l1 = "{\"name\": \"get_weather\", \"parameters\": {\"city\": "
                     "\"A\", \"days\": 2}}";
    assert_true(accepts(g, l1));
    snprintf(two, sizeof two, "%s; %s", l1, l1);
    assert_true(accepts(g, two));
    snprintf(two, sizeof two, "%s; %s; %s", l1, l1, l1);
    assert_false(accepts(g, two)); /* max_calls 2 */
    gm_grammar_unref(g);

    /* errors name the tool */
    json_t *bad = json_loads("{\"type\":\"object\",\"properties\":{\"x\":{"
                             "\"nullable\":true}}}",
                             0, NULL);
    struct gm_tool_fn badfn = {"f", bad};
    assert_int_equal(gm_spec_tools(&GM_TOOL_HERMES, &badfn, 1, 1, 1, &spec,
                                   &len),
                     0);
    assert_int_equal(gm_spec_compile(spec, len, &vocab, NULL, &g, err,
                                     sizeof err),
                     TG_EUNSUPPORTED);
    assert_string_equal(err, "tool \"f\" parameters: unsupported keyword "
                             "\"nullable\" at #/properties/x");
    free(spec);
    json_decref(bad);
    json_decref(params);
}

/* A triggered spec: its grammar is the inner calls' grammar (one call
 * here), and gm_spec_trigger reads the trigger back. */
static void test_triggered_spec(void **state)
{
    (void)state;
    json_t *params = json_loads(
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"],\"additionalProperties\":false}",
        0, NULL);
    struct gm_tool_fn fns[] = {{"get_weather", params}, {"ping", NULL}};
    char *inner, *spec, *trig;
    size_t ilen, len;
    int anchored = 7;
    assert_int_equal(
        gm_spec_tools(&GM_TOOL_HERMES, fns, 2, 1, 1, &inner, &ilen), 0);
    assert_int_equal(gm_spec_trigger(inner, ilen, &trig, &anchored), 0);
    assert_null(trig); /* not triggered */
    assert_int_equal(anchored, 0);
    assert_int_equal(
        gm_spec_triggered("<tool_call>", 0, inner, ilen, &spec, &len), 0);
    assert_int_equal(gm_spec_trigger(spec, len, &trig, &anchored), 0);
    assert_string_equal(trig, "<tool_call>");
    assert_int_equal(anchored, 0);
    free(trig);
    char err[512];
    assert_int_equal(gm_spec_check(spec, len, NULL, err, sizeof err), 0);
    struct gm_grammar *g;
    assert_int_equal(
        gm_spec_compile(spec, len, &vocab, NULL, &g, err, sizeof err), 0);
    const char *one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                      "{\"city\": \"Oslo\"}}\n</tool_call>";
    assert_true(accepts(g, one));
    assert_false(accepts(g, "<tool_call>\n{\"name\": \"get_weather\", "
                            "\"arguments\": {}}\n</tool_call>"));
    assert_false(accepts(g, "Hi <tool_call>")); /* text is the server's */
    gm_grammar_unref(g);
    free(spec);
    assert_int_equal(gm_spec_triggered("", 0, inner, ilen, &spec, &len),
                     TG_EINVAL);
    free(inner);
    assert_int_equal(
        gm_spec_tools(&GM_TOOL_LLAMA3_JSON, fns, 2, 1, 0, &inner, &ilen), 0);
    assert_int_equal(gm_spec_triggered("{", 1, inner, ilen, &spec, &len), 0);
    assert_int_equal(gm_spec_trigger(spec, len, &trig, &anchored), 0);
    assert_string_equal(trig, "{");
    assert_int_equal(anchored, 1);
    free(trig);
    assert_int_equal(gm_spec_check(spec, len, NULL, err, sizeof err), 0);
    free(spec);
    free(inner);
    json_decref(params);
}

static void test_spec_errors(void **state)
{
    (void)state;
    char err[512];
    static const struct {
        const char *spec;
        int code;
        const char *msg;
    } cases[] = {
        {"not json", TG_EFORMAT, "spec:"},
        {"{}", TG_EFORMAT, "no \"type\""},
        {"{\"type\":\"lark\"}", TG_EFORMAT, "unknown type \"lark\""},
        {"{\"type\":\"json_schema\"}", TG_EFORMAT, "without \"schema\""},
        {"{\"type\":\"tool_calls\",\"format\":\"xml\",\"tools\":[]}",
         TG_EFORMAT, "\"format\" must be"},
        {"{\"type\":\"tool_calls\",\"format\":\"hermes\",\"tools\":[]}",
         TG_EINVAL, "no tools"},
        {"{\"type\":\"tool_calls\",\"format\":\"hermes\",\"min_calls\":0,"
         "\"tools\":[{\"name\":\"a\"}]}",
         TG_EINVAL, "call counts"},
        {"{\"type\":\"tool_calls\",\"format\":\"hermes\",\"tools\":[{\"name\":"
         "\"\"}]}",
         TG_EINVAL, "empty name"},
        {"{\"type\":\"tool_calls\",\"format\":\"hermes\",\"tools\":[{}]}",
         TG_EFORMAT, "no \"name\""},
        {"{\"type\":\"triggered\",\"trigger\":\"\",\"spec\":{\"type\":"
         "\"tool_calls\",\"format\":\"hermes\",\"tools\":[{\"name\":\"a\"}]}}",
         TG_EFORMAT, "non-empty \"trigger\""},
        {"{\"type\":\"triggered\",\"trigger\":\"<t>\",\"spec\":{\"type\":"
         "\"json_object\"}}",
         TG_EFORMAT, "tool_calls \"spec\""},
        {"{\"type\":\"triggered\",\"trigger\":\"<tool_call>x\",\"spec\":"
         "{\"type\":\"tool_calls\",\"format\":\"hermes\",\"tools\":[{"
         "\"name\":\"a\"}]}}",
         TG_EINVAL, "prefix of the format's call opening"},
    };
    for (size_t i = 0; i < TT_COUNT(cases); i++) {
        int rc = gm_spec_check(cases[i].spec, strlen(cases[i].spec), NULL, err,
                               sizeof err);
        if (rc != cases[i].code || strstr(err, cases[i].msg) == NULL)
            fail_msg("%s: got %s \"%s\"", cases[i].spec, tg_err_name(rc), err);
    }
}

struct cache_job {
    struct gm_cache *c;
    int seed;
    int failures;
    struct gm_grammar *got[8];
};

static const char *const cache_specs[] = {
    "{\"type\":\"json_value\"}",
    "{\"type\":\"json_object\"}",
    "{\"type\":\"json_schema\",\"schema\":{\"type\":\"string\",\"maxLength\":9}}",
    "{\"type\":\"json_schema\",\"schema\":{\"nullable\":true}}",
};

static void *cache_thread(void *arg)
{
    struct cache_job *j = arg;
    for (int k = 0; k < 8; k++) {
        int i = (j->seed + k) % (int)TT_COUNT(cache_specs);
        char err[256];
        struct gm_grammar *g = NULL;
        int rc = gm_cache_get(j->c, cache_specs[i], strlen(cache_specs[i]), &g,
                              err, sizeof err);
        if (i == 3) {
            if (rc != TG_EUNSUPPORTED || strstr(err, "nullable") == NULL)
                j->failures++;
        } else if (rc != 0) {
            j->failures++;
        } else {
            /* the grammar works */
            struct gm_matcher m;
            if (gm_matcher_init(&m, g) != 0 ||
                gm_matcher_accept_bytes(&m, "\"ab", 3) != (i == 1 ? TG_EINVAL : 0))
                j->failures++;
            gm_matcher_free(&m);
        }
        j->got[k] = g;
    }
    return NULL;
}

static void test_cache_threads(void **state)
{
    (void)state;
    struct gm_cache c;
    assert_int_equal(gm_cache_init(&c, &vocab, NULL, 16, 0), 0);
    pthread_t t[6];
    struct cache_job jobs[6];
    for (int i = 0; i < 6; i++) {
        jobs[i] = (struct cache_job){.c = &c, .seed = i};
        assert_int_equal(pthread_create(&t[i], NULL, cache_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    struct gm_cache_stats st;
    gm_cache_stats(&c, &st);
    /* each spec compiled once, whoever asked first */
    assert_int_equal(st.misses, TT_COUNT(cache_specs));
    assert_int_equal(st.hits + st.waits + st.misses, 6 * 8);
    assert_int_equal(st.failures, 1);
    assert_int_equal(st.entries, TT_COUNT(cache_specs));
    struct gm_grammar *first[4] = {0};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(jobs[i].failures, 0);
        for (int k = 0; k < 8; k++) {
            int s = (jobs[i].seed + k) % (int)TT_COUNT(cache_specs);
            if (first[s] == NULL)
                first[s] = jobs[i].got[k];
            assert_ptr_equal(jobs[i].got[k], first[s]); /* one grammar */
        }
    }
    /* eviction: a cache of two entries keeps the two used last */
    struct gm_cache small;
    assert_int_equal(gm_cache_init(&small, &vocab, NULL, 2, 0), 0);
    struct gm_grammar *g;
    char err[256];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(gm_cache_get(&small, cache_specs[i],
                                      strlen(cache_specs[i]), &g, err,
                                      sizeof err),
                         0);
        gm_grammar_unref(g);
    }
    gm_cache_stats(&small, &st);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.evictions, 1);
    gm_cache_free(&small);
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 8; k++)
            gm_grammar_unref(jobs[i].got[k]);
    gm_cache_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unsupported_keywords),
        cmocka_unit_test(test_malformed_and_unsatisfiable),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_oneof_exclusive),
        cmocka_unit_test(test_corpus_documents),
        cmocka_unit_test(test_refs),
        cmocka_unit_test(test_tool_calls),
        cmocka_unit_test(test_triggered_spec),
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_cache_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
