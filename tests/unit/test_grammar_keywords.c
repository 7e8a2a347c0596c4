/* test_grammar_keywords.c — the array, object and combining keywords of
 * JSON Schema 2020-12 that zod, the OpenAI helpers and LangChain emit
 * (common/grammar/gm_schema_arr.c, gm_schema_obj.c, gm_schema_merge.c):
 * prefixItems and items false (z.tuple), draft 2019-09's items array,
 * contains with minContains/maxContains, additionalProperties as a
 * schema (z.record) with keys that never repeat a listed property,
 * minProperties/maxProperties, propertyNames, allOf by merging
 * (z.intersection), and keywords beside $ref/anyOf/oneOf. Each case's
 * documents are checked byte by byte: the valid ones accepted, the
 * invalid ones rejected (what a validator says of them is written next
 * to each). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "tests/support/tt_grammar.h"

static const char *const pieces[] = {"\":", "\",\"", "{\"", "\"}", "true"};
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

static int compile(const char *schema, struct gm_grammar **g, char *err,
                   size_t errlen)
{
    json_t *s = json_loads(schema, JSON_DECODE_ANY, NULL);
    if (s == NULL)
        fail_msg("bad test schema %s", schema);
    char *spec;
    size_t len;
    assert_int_equal(gm_spec_json_schema(s, &spec, &len), 0);
    json_decref(s);
    *g = NULL;
    int rc = gm_spec_compile(spec, len, &vocab, NULL, g, err, errlen);
    free(spec);
    return rc;
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

/* A schema and documents: "+doc" must be accepted, "-doc" rejected. */
static void check(const char *schema, const char *const *docs, size_t n)
{
    struct gm_grammar *g;
    char err[512];
    if (compile(schema, &g, err, sizeof err) != 0)
        fail_msg("%s: %s", schema, err);
    for (size_t i = 0; i < n; i++) {
        int want = docs[i][0] == '+';
        if (accepts(g, docs[i] + 1) != want)
            fail_msg("%s: %s %s", schema, docs[i] + 1,
                     want ? "rejected" : "accepted");
    }
    gm_grammar_unref(g);
}

static void refused(const char *schema, int code, const char *msg)
{
    struct gm_grammar *g;
    char err[512] = "";
    int rc = compile(schema, &g, err, sizeof err);
    if (rc != code || strstr(err, msg) == NULL)
        fail_msg("%s: got %s \"%s\", want %s \"%s\"", schema, tg_err_name(rc),
                 err, tg_err_name(code), msg);
}

#define CHECK(schema, ...)                             \
    do {                                               \
        static const char *const d_[] = {__VA_ARGS__}; \
        check(schema, d_, TT_COUNT(d_));               \
    } while (0)

static void test_arrays(void **state)
{
    (void)state;
    /* z.tuple([z.string(), z.number()]): prefixItems, items false */
    CHECK(
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":"
        "\"number\"}],\"items\":false,\"minItems\":2}",
        "+[\"a\",1]", "+[\"a\", 1.5]", "-[\"a\"]", "-[1,\"a\"]", "-[\"a\",1,2]",
        "-[]");
    /* a tuple with a rest */
    /* tuples are generated whole (zod's tuple() wants every position) */
    CHECK("{\"prefixItems\":[{\"type\":\"boolean\"}],\"items\":{\"type\":"
          "\"null\"}}",
          "-[]", "+[true]", "+[false,null,null]", "-[null]", "-[true,true]");
    /* draft 2019-09: items as an array, additionalItems */
    CHECK("{\"items\":[{\"type\":\"integer\"}],\"additionalItems\":false}",
          "-[]", "+[3]", "-[3,4]", "-[\"x\"]");
    /* maxItems below the prefix: the prefix is cut */
    CHECK("{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"integer\"}],"
          "\"maxItems\":1}",
          "+[1]", "+[]", "-[1,2]");
    /* contains: at least two strings among integers; a maximum needs
     * the other elements proven never to match */
    CHECK("{\"items\":{\"type\":[\"string\",\"integer\"]},\"contains\":{"
          "\"type\":\"string\"},\"minContains\":2}",
          "+[\"a\",\"b\"]", "+[\"a\",\"b\",3]", "-[\"a\"]", "-[]", "-[1,2]");
    CHECK("{\"items\":{\"type\":\"integer\"},\"prefixItems\":[{\"type\":"
          "\"integer\"}],\"contains\":{\"type\":\"string\"},\"minContains\":0,"
          "\"maxContains\":0}",
          "+[1,2]", "+[1]", "-[\"a\"]");
    refused("{\"contains\":{\"type\":\"string\"},\"maxContains\":1}",
            TG_EUNSUPPORTED, "maxContains");
    refused("{\"type\":\"array\",\"uniqueItems\":true}", TG_EUNSUPPORTED,
            "uniqueItems");
    CHECK("{\"type\":\"array\",\"uniqueItems\":true,\"maxItems\":1}", "+[]",
          "+[1]", "-[1,1]");
    refused("{\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", TG_EINVAL,
            "no document satisfies it");
}

static void test_objects(void **state)
{
    (void)state;
    /* z.record(z.string(), z.number()): any other key, number values */
    CHECK("{\"type\":\"object\",\"propertyNames\":{\"type\":\"string\"},"
          "\"additionalProperties\":{\"type\":\"number\"}}",
          "+{}", "+{\"x\":1}", "+{\"x\":1,\"y\":2.5}", "-{\"x\":\"s\"}");
    /* listed properties keep their schema: another member never takes a
     * listed name, in any spelling */
    CHECK("{\"properties\":{\"a\":{\"type\":\"string\"}},"
          "\"additionalProperties\":{\"type\":\"integer\"}}",
          "+{\"a\":\"s\"}", "+{\"b\":1}", "+{\"a\":\"s\",\"ab\":2}",
          "+{\"a\":\"s\",\"b\":2}", "-{\"a\":1}", "-{\"a\":\"s\",\"a\":3}",
          "-{\"\\u0061\":3}", "-{\"b\":\"s\"}");
    /* a required name not in properties takes additionalProperties */
    CHECK("{\"required\":[\"id\"],\"additionalProperties\":{\"type\":"
          "\"boolean\"}}",
          "+{\"id\":true}", "-{\"id\":1}", "-{}");
    /* counts: at least one listed member, at most two in all */
    CHECK("{\"properties\":{\"a\":{},\"b\":{},\"c\":{}},\"minProperties\":1,"
          "\"maxProperties\":2}",
          "+{\"a\":1}", "+{\"a\":1,\"c\":2}", "-{}",
          "-{\"a\":1,\"b\":2,\"c\":3}");
    CHECK("{\"properties\":{\"a\":{}},\"additionalProperties\":{},"
          "\"maxProperties\":2}",
          "+{\"a\":1,\"x\":2}", "+{\"x\":1,\"y\":2}",
          "-{\"a\":1,\"x\":2,\"y\":3}");
    refused("{\"properties\":{\"a\":{}},\"minProperties\":2}", TG_EUNSUPPORTED,
            "minProperties");
    /* propertyNames: an optional listed name it refuses is left out, a
     * required one is unsatisfiable; other keys from its enum */
    CHECK("{\"properties\":{\"a\":{},\"bbbb\":{}},\"propertyNames\":{"
          "\"maxLength\":3}}",
          "+{\"a\":1}", "-{\"bbbb\":1}");
    refused("{\"required\":[\"long\"],\"propertyNames\":{\"maxLength\":3}}",
            TG_EINVAL, "propertyNames");
    /* keys from an enum: each once, all of them (zod's record over an
     * enum) */
    CHECK("{\"propertyNames\":{\"enum\":[\"x\",\"y\"]},"
          "\"additionalProperties\":{\"type\":\"null\"}}",
          "-{\"x\":null}", "+{\"x\":null,\"y\":null}", "-{\"z\":null}",
          "-{\"x\":null,\"x\":null}");
    CHECK("{\"propertyNames\":{\"minLength\":2,\"maxLength\":3},"
          "\"additionalProperties\":{\"type\":\"null\"}}",
          "+{\"ab\":null}", "+{\"abc\":null}", "-{\"a\":null}",
          "-{\"abcd\":null}");
    /* keys by pattern: propertyNames, patternProperties (a key two
     * patterns match is not generated), additionalProperties for the
     * rest */
    CHECK("{\"propertyNames\":{\"pattern\":\"^a\"},"
          "\"additionalProperties\":{\"type\":\"null\"}}",
          "+{\"ab\":null}", "-{\"b\":null}");
    CHECK("{\"patternProperties\":{\"^x_\":{\"type\":\"integer\"},\"^y_\":{"
          "\"type\":\"string\"}},\"additionalProperties\":false}",
          "+{}", "+{\"x_1\":1}", "+{\"y_a\":\"s\",\"x_b\":2}",
          "-{\"x_1\":\"s\"}", "-{\"z\":1}");
    CHECK("{\"properties\":{\"x_id\":{\"minimum\":10}},\"patternProperties\":{"
          "\"^x_\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":"
          "\"boolean\"}}",
          "+{\"x_id\":11}", "-{\"x_id\":11.5}", "-{\"x_id\":3}", "+{\"x_q\":4}",
          "+{\"other\":true}", "-{\"other\":4}", "-{\"x_q\":true}");
    CHECK("{\"required\":[\"x_r\"],\"patternProperties\":{\"^x_\":{\"type\":"
          "\"null\"}},\"additionalProperties\":false}",
          "+{\"x_r\":null}", "-{\"x_r\":1}", "-{}");
}

static void test_strings(void **state)
{
    (void)state;
    /* pattern, format (a known one enforced, an unknown one an
     * annotation), lengths, and enum values filtered by them */
    CHECK("{\"type\":\"string\",\"pattern\":\"^[0-9]{3}-[0-9]{4}$\"}",
          "+\"555-1234\"", "-\"5551234\"", "-\"555-12345\"");
    CHECK("{\"type\":\"string\",\"format\":\"uuid\"}",
          "+\"123e4567-e89b-12d3-a456-426614174000\"", "-\"123e4567\"");
    CHECK("{\"type\":\"string\",\"format\":\"no-such-format\"}", "+\"x\"");
    CHECK("{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"^2024-\"}",
          "+\"2024-02-29\"", "-\"2023-02-28\"", "-\"2024-02-30\"");
    CHECK("{\"enum\":[\"apple\",\"kiwi\",\"banana\",3],\"maxLength\":5,"
          "\"pattern\":\"a\"}",
          "+\"apple\"", "-\"kiwi\"", "-\"banana\"", "+3");
    /* two patterns under allOf: both */
    CHECK("{\"allOf\":[{\"pattern\":\"^a\"},{\"pattern\":\"b$\"}],\"type\":"
          "\"string\"}",
          "+\"axb\"", "-\"ax\"", "-\"xb\"");
    /* zod's .email() pattern, lookaheads and all */
    CHECK(
        "{\"type\":\"string\",\"format\":\"email\",\"pattern\":"
        "\"^(?!\\\\.)(?!.*\\\\.\\\\.)([A-Za-z0-9_'+\\\\-\\\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9]"
        "[A-Za-z0-9\\\\-]*\\\\.)+[A-Za-z]{2,}$\"}",
        "+\"a.b@example.com\"", "-\".a@example.com\"", "-\"a..b@example.com\"",
        "-\"a@b\"");
}

static void test_allof(void **state)
{
    (void)state;
    /* z.intersection(A, B): properties and required merge */
    CHECK(
        "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
        "\"string\"}},\"required\":[\"a\"]},{\"type\":\"object\","
        "\"properties\":{\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"]}]}",
        "+{\"a\":\"s\",\"b\":1}", "-{\"a\":\"s\"}", "-{\"b\":1}");
    /* the same property in both: both schemas */
    CHECK("{\"allOf\":[{\"properties\":{\"n\":{\"type\":\"number\",\"minimum\":"
          "0}},\"required\":[\"n\"]},{\"properties\":{\"n\":{\"type\":"
          "\"integer\",\"maximum\":10}}}]}",
          "+{\"n\":5}", "-{\"n\":5.5}", "-{\"n\":11}", "-{\"n\":-1}");
    /* a part that closes its properties keeps them closed */
    CHECK("{\"allOf\":[{\"properties\":{\"a\":{}},\"additionalProperties\":"
          "false},{\"properties\":{\"b\":{}}}]}",
          "+{\"a\":1}", "+{}", "-{\"b\":1}");
    refused("{\"allOf\":[{\"properties\":{\"a\":{}},\"additionalProperties\":"
            "false},{\"required\":[\"b\"]}]}",
            TG_EINVAL, "no document satisfies it");
    /* contradictions: no document */
    refused("{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}",
            TG_EINVAL, "no document");
    /* an anyOf distributes */
    CHECK(
        "{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"a\",\"b\"]}},"
        "\"required\":[\"k\"],\"anyOf\":[{\"properties\":{\"k\":{\"const\":"
        "\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]},{"
        "\"properties\":{\"k\":{\"const\":\"b\"}}}]}",
        "+{\"k\":\"a\",\"x\":1}", "+{\"k\":\"b\"}", "-{\"k\":\"a\"}",
        "-{\"k\":\"c\"}");
    /* a oneOf with siblings, its alternatives exclusive as written */
    CHECK(
        "{\"oneOf\":[{\"properties\":{\"t\":{\"const\":1}},\"required\":"
        "[\"t\"]},{\"properties\":{\"t\":{\"const\":2}},\"required\":[\"t\"]}],"
        "\"properties\":{\"t\":{\"type\":\"integer\"}}}",
        "+{\"t\":1}", "+{\"t\":2}", "-{\"t\":3}");
    /* $ref with siblings (2020-12: an implicit allOf) */
    CHECK("{\"$defs\":{\"s\":{\"type\":\"string\"}},\"$ref\":\"#/$defs/s\","
          "\"maxLength\":2}",
          "+\"ab\"", "-\"abc\"", "-1");
    /* numeric keywords tighten; multipleOf integers take their lcm */
    CHECK("{\"allOf\":[{\"type\":\"integer\",\"minimum\":0,\"multipleOf\":4},"
          "{\"maximum\":30,\"multipleOf\":6}]}",
          "+0", "+12", "+24", "-18", "-36", "-8");
    /* a $ref cycle through allOf */
    refused("{\"$defs\":{\"a\":{\"allOf\":[{\"$ref\":\"#/$defs/a\"}]}},"
            "\"$ref\":\"#/$defs/a\"}",
            TG_EUNSUPPORTED, "nested deeper");
    /* two formats cannot be one string schema */
    refused("{\"allOf\":[{\"format\":\"date\"},{\"format\":\"uuid\"}]}",
            TG_EUNSUPPORTED, "format");
}

/* not (generated from the rest, proven never to match it), if/then/else
 * (an else that cannot be proven is left out), unevaluated* (what the
 * merged schema evaluates), dependentRequired/dependentSchemas. */
static void test_conditionals(void **state)
{
    (void)state;
    CHECK("{\"type\":\"string\",\"not\":{\"type\":\"integer\"}}", "+\"a\"",
          "-1");
    refused("{\"type\":\"integer\",\"not\":{\"const\":3}}", TG_EUNSUPPORTED,
            "\"not\"");
    CHECK(
        "{\"properties\":{\"k\":{\"enum\":[\"a\",\"b\"]}},\"required\":[\"k\"],"
        "\"if\":{\"properties\":{\"k\":{\"const\":\"a\"}},\"required\":[\"k\"]},"
        "\"then\":{\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":"
        "[\"x\"]}}",
        "+{\"k\":\"a\",\"x\":1}", "-{\"k\":\"a\"}", "-{\"k\":\"b\"}");
    CHECK("{\"if\":{\"type\":\"string\"},\"then\":{\"maxLength\":2},\"else\":{"
          "\"type\":\"integer\"}}",
          "+\"ab\"", "-\"abc\"", "+7", "-true");
    CHECK("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}}],"
          "\"properties\":{\"b\":{}},\"unevaluatedProperties\":false}",
          "+{\"a\":1,\"b\":2}", "+{}", "-{\"a\":\"s\"}", "-{\"c\":1}");
    CHECK(
        "{\"prefixItems\":[{\"type\":\"string\"}],\"unevaluatedItems\":false}",
        "+[\"x\"]", "-[\"x\",\"y\"]");
    CHECK("{\"items\":[{\"type\":\"string\"}],\"unevaluatedItems\":false}",
          "+[\"x\"]", "-[\"x\",\"y\"]");
    CHECK("{\"properties\":{\"a\":{},\"b\":{}},\"dependentRequired\":{\"a\":"
          "[\"b\"]}}",
          "+{\"b\":1}", "-{\"a\":1}");
    CHECK("{\"properties\":{\"a\":{},\"b\":{}},\"required\":[\"a\"],"
          "\"dependentRequired\":{\"a\":[\"b\"]}}",
          "+{\"a\":1,\"b\":2}", "-{\"a\":1}");
    CHECK("{\"properties\":{\"a\":{}},\"required\":[\"a\"],"
          "\"dependentSchemas\":{\"a\":{\"properties\":{\"b\":{\"type\":"
          "\"null\"}},\"required\":[\"b\"]}}}",
          "+{\"a\":1,\"b\":null}", "-{\"a\":1}", "-{\"a\":1,\"b\":2}");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arrays),       cmocka_unit_test(test_objects),
        cmocka_unit_test(test_strings),      cmocka_unit_test(test_allof),
        cmocka_unit_test(test_conditionals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
