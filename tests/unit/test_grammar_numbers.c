/* test_grammar_numbers.c — numbers of a JSON Schema
 * (common/grammar/gm_schema_num.c): minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum (numbers, and draft-04's booleans), multipleOf, the
 * integer and number types, and the digit bounds that keep every
 * generated number a finite double.
 *
 * The oracle is independent of the engine: a candidate number text is
 * valid when strtod reads it as a double that satisfies every keyword as
 * a validator compares doubles (and, for integers, has no fraction or
 * exponent: what the engine generates; a multiple is checked on the
 * exact integer). For random schemas and candidates near and far from
 * the bounds, every text the grammar accepts must be valid (soundness),
 * and every valid text in the generated form (no exponent, no leading
 * zeros, at most 18 integer and 17 fraction digits) that is not within
 * one part in 10^12 of a bound must be accepted (completeness away from
 * the rounding edge). Plus the fixed cases the issue names: zod's
 * z.int() bounds of +-(2^53 - 1), positive(), exclusive bounds next to
 * their text, and 8e705 never generated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "tests/support/tt_grammar.h"

static const char *const pieces[] = {"12", "00", "-1", ".5", "e+"};
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
    json_t *s = json_loads(schema, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (s == NULL)
        fail_msg("bad test schema %s", schema);
    char *spec;
    size_t len;
    assert_int_equal(gm_spec_json_schema(s, &spec, &len), 0);
    json_decref(s);
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

struct rule {
    int integer;        /* type integer (else number) */
    int has_lo, has_hi; /* bounds present */
    double lo, hi;      /* their values */
    int lo_ex, hi_ex;   /* exclusive */
    int draft4;         /* exclusive as booleans */
    long long mult;     /* multipleOf (integer), 0: none */
};

static void schema_text(const struct rule *r, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "{\"type\":\"%s\"",
                                r->integer ? "integer" : "number");
    if (r->has_lo) {
        if (r->lo_ex && !r->draft4)
            n += (size_t)snprintf(out + n, cap - n,
                                  ",\"exclusiveMinimum\":%.17g", r->lo);
        else
            n += (size_t)snprintf(out + n, cap - n, ",\"minimum\":%.17g%s",
                                  r->lo,
                                  r->lo_ex ? ",\"exclusiveMinimum\":true" : "");
    }
    if (r->has_hi) {
        if (r->hi_ex && !r->draft4)
            n += (size_t)snprintf(out + n, cap - n,
                                  ",\"exclusiveMaximum\":%.17g", r->hi);
        else
            n += (size_t)snprintf(out + n, cap - n, ",\"maximum\":%.17g%s",
                                  r->hi,
                                  r->hi_ex ? ",\"exclusiveMaximum\":true" : "");
    }
    if (r->mult > 0)
        n += (size_t)snprintf(out + n, cap - n, ",\"multipleOf\":%lld",
                              r->mult);
    snprintf(out + n, cap - n, "}");
}

/* Whether text (a JSON number) is valid against r, as a validator sees
 * it; *edge set when it lies within 1e-12 (relative) of a bound. */
static int valid(const struct rule *r, const char *text, int *edge)
{
    double v = strtod(text, NULL);
    *edge = 0;
    if (!isfinite(v))
        return 0;
    int is_int_text = strpbrk(text, ".eE") == NULL;
    if (r->integer && !is_int_text)
        return 0; /* the engine writes integers as integers */
    if (r->has_lo) {
        if (r->lo_ex ? !(v > r->lo) : !(v >= r->lo))
            return 0;
        *edge |= fabs(v - r->lo) <= 1e-12 * fmax(1.0, fabs(r->lo));
    }
    if (r->has_hi) {
        if (r->hi_ex ? !(v < r->hi) : !(v <= r->hi))
            return 0;
        *edge |= fabs(v - r->hi) <= 1e-12 * fmax(1.0, fabs(r->hi));
    }
    if (r->mult > 0) {
        if (!is_int_text)
            return 0;
        long long x = strtoll(text, NULL, 10);
        if (x % r->mult != 0)
            return 0;
    }
    return 1;
}

/* The generated form: no exponent, no leading zeros, digit bounds. */
static int generated_form(const char *t)
{
    const char *p = t + (*t == '-');
    if (strpbrk(p, "eE+-") != NULL)
        return 0;
    size_t ni = strcspn(p, ".");
    if (ni == 0 || ni > 18 || (ni > 1 && p[0] == '0'))
        return 0;
    if (p[ni] == '.') {
        size_t nf = strlen(p + ni + 1);
        if (nf == 0 || nf > 17)
            return 0;
    }
    return 1;
}

/* Candidates around x: the integers and decimals next to it, its shortest
 * text, and a few offsets. */
static int candidates(double x, struct tt_xrng *rng, char out[][64], int n)
{
    int k = 0;
    double offs[] = {0, 1, -1, 0.5, -0.5, 1e-3, -1e-3, 2, -2, 7, -7, 100};
    for (size_t i = 0; i < TT_COUNT(offs) && k < n; i++) {
        double y = x + offs[i];
        if (fabs(y) < 1e17) {
            snprintf(out[k++], 64, "%.0f", y);
            if (k < n)
                snprintf(out[k++], 64, "%.3f", y);
        }
    }
    while (k < n) {
        double y = x + tt_xrng_float(rng, -50, 50);
        snprintf(out[k++], 64, tt_xrng_int(rng, 0, 1) ? "%.0f" : "%.4f", y);
    }
    return k;
}

static void check_rule(const struct rule *r, struct tt_xrng *rng)
{
    char schema[512], err[512];
    schema_text(r, schema, sizeof schema);
    struct gm_grammar *g = NULL;
    int rc = compile(schema, &g, err, sizeof err);
    if (rc != 0) {
        /* only an empty range may be refused */
        if (rc != TG_EINVAL)
            fail_msg("%s: %s", schema, err);
        return;
    }
    char cand[64][64];
    int n = 0;
    if (r->has_lo)
        n += candidates(r->lo, rng, cand + n, 24);
    if (r->has_hi)
        n += candidates(r->hi, rng, cand + n, 24);
    n += candidates(tt_xrng_float(rng, -1000, 1000), rng, cand + n, 16);
    for (int i = 0; i < n; i++) {
        /* "-0" and "-0.000" are fine numbers; normalise "%.0f" output */
        int edge = 0;
        int want = valid(r, cand[i], &edge);
        int got = accepts(g, cand[i]);
        if (got && !want)
            fail_msg("%s accepts %s", schema, cand[i]);
        if (want && !got && !edge && generated_form(cand[i]) &&
            strcmp(cand[i], "-0") != 0)
            fail_msg("%s rejects %s", schema, cand[i]);
    }
    gm_grammar_unref(g);
}

static void test_random_ranges(void **state)
{
    (void)state;
    struct tt_xrng rng = {20261206};
    static const double scale[] = {1, 10, 1000, 1e6, 0.01};
    for (int t = 0; t < 300; t++) {
        struct rule r = {0};
        r.integer = tt_xrng_int(&rng, 0, 1);
        double sc = scale[tt_xrng_int(&rng, 0, 4)];
        r.has_lo = tt_xrng_int(&rng, 0, 3) != 0;
        r.has_hi = tt_xrng_int(&rng, 0, 3) != 0;
        r.lo = round(tt_xrng_float(&rng, -100, 100) * sc * 1000) / 1000;
        r.hi = r.lo +
               fabs(round(tt_xrng_float(&rng, 0, 200) * sc * 1000) / 1000);
        r.lo_ex = tt_xrng_int(&rng, 0, 2) == 0;
        r.hi_ex = tt_xrng_int(&rng, 0, 2) == 0;
        r.draft4 = tt_xrng_int(&rng, 0, 3) == 0;
        if (r.integer && tt_xrng_int(&rng, 0, 2) == 0)
            r.mult = tt_xrng_int(&rng, 2, 37);
        check_rule(&r, &rng);
    }
}

static void test_fixed_cases(void **state)
{
    (void)state;
    char err[512];
    struct gm_grammar *g;
    /* zod's z.int(): +-(2^53 - 1), the most common number schema */
    assert_int_equal(compile("{\"type\":\"integer\",\"minimum\":"
                             "-9007199254740991,\"maximum\":9007199254740991}",
                             &g, err, sizeof err),
                     0);
    assert_true(accepts(g, "0"));
    assert_true(accepts(g, "-42"));
    assert_true(accepts(g, "9007199254740991"));
    assert_false(accepts(g, "9007199254740992"));
    assert_true(accepts(g, "-9007199254740991"));
    assert_false(accepts(g, "-9007199254740992"));
    assert_false(accepts(g, "1.5"));
    gm_grammar_unref(g);
    /* zod's positive(): exclusiveMinimum 0 */
    assert_int_equal(compile("{\"type\":\"number\",\"exclusiveMinimum\":0}", &g,
                             err, sizeof err),
                     0);
    assert_false(accepts(g, "0"));
    assert_false(accepts(g, "0.0"));
    assert_false(accepts(g, "-1"));
    assert_true(accepts(g, "0.5"));
    assert_true(accepts(g, "0.00000000000000001"));   /* 1e-17 */
    assert_false(accepts(g, "0.000000000000000001")); /* 18 digits */
    assert_true(accepts(g, "123456789012345678.25"));
    gm_grammar_unref(g);
    /* an exclusive bound next to its own text: 0.1 is not above 0.1 */
    assert_int_equal(compile("{\"type\":\"number\",\"exclusiveMinimum\":0.1,"
                             "\"maximum\":0.2}",
                             &g, err, sizeof err),
                     0);
    assert_false(accepts(g, "0.1"));
    assert_false(accepts(g, "0.10000000000000001")); /* reads as 0.1 */
    assert_true(accepts(g, "0.10000000000000002"));
    assert_true(accepts(g, "0.2"));
    assert_true(accepts(g, "0.2000"));
    assert_false(accepts(g, "0.2001"));
    gm_grammar_unref(g);
    /* numbers are finite doubles: no 8e705, no 400-digit integers */
    assert_int_equal(compile("{\"type\":\"number\"}", &g, err, sizeof err), 0);
    assert_true(accepts(g, "8e70"));
    assert_false(accepts(g, "8e705"));
    assert_false(accepts(g, "1234567890123456789")); /* 19 digits */
    gm_grammar_unref(g);
    /* multipleOf: integers by a remainder automaton; 0.5 is every
     * integer; a non-integral multipleOf of numbers is refused */
    assert_int_equal(compile("{\"type\":\"integer\",\"multipleOf\":7,"
                             "\"minimum\":-20,\"maximum\":50}",
                             &g, err, sizeof err),
                     0);
    assert_true(accepts(g, "-14"));
    assert_true(accepts(g, "49"));
    assert_true(accepts(g, "0"));
    assert_false(accepts(g, "50"));
    assert_false(accepts(g, "-21"));
    gm_grammar_unref(g);
    assert_int_equal(compile("{\"type\":\"integer\",\"multipleOf\":0.5}", &g,
                             err, sizeof err),
                     0);
    assert_true(accepts(g, "3"));
    gm_grammar_unref(g);
    assert_int_equal(compile("{\"type\":\"number\",\"multipleOf\":0.01}", &g,
                             err, sizeof err),
                     TG_EUNSUPPORTED);
    assert_non_null(strstr(err, "multipleOf"));
    /* an empty range */
    assert_int_equal(compile("{\"type\":\"integer\",\"minimum\":1.5,"
                             "\"maximum\":1.9}",
                             &g, err, sizeof err),
                     TG_EINVAL);
    /* keywords without a type: a number */
    assert_int_equal(compile("{\"minimum\":5}", &g, err, sizeof err), 0);
    assert_true(accepts(g, "5.5"));
    assert_false(accepts(g, "4"));
    assert_false(accepts(g, "\"x\""));
    gm_grammar_unref(g);
    /* decimal counts are valid JSON Schema */
    assert_int_equal(
        compile("{\"type\":\"string\",\"maxLength\":2.0}", &g, err, sizeof err),
        0);
    assert_true(accepts(g, "\"ab\""));
    assert_false(accepts(g, "\"abc\""));
    gm_grammar_unref(g);
    assert_int_equal(
        compile("{\"type\":\"string\",\"maxLength\":2.5}", &g, err, sizeof err),
        TG_EFORMAT);
}

/* enum/const reals are written as the shortest text that reads back as
 * their double (jansson's 17 digits made {"const": 3.14} reject "3.14");
 * a schema may hold U+0000. */
static void test_enum_reals_and_nul(void **state)
{
    (void)state;
    char err[512];
    struct gm_grammar *g;
    assert_int_equal(compile("{\"const\":3.14}", &g, err, sizeof err), 0);
    assert_true(accepts(g, "3.14"));
    assert_false(accepts(g, "3.1400000000000001"));
    gm_grammar_unref(g);
    assert_int_equal(
        compile("{\"enum\":[0.1,1.1,2.5e-7,1e3,[0.5]]}", &g, err, sizeof err),
        0);
    assert_true(accepts(g, "0.1"));
    assert_true(accepts(g, "1.1"));
    assert_true(accepts(g, "2.5e-7"));
    assert_true(accepts(g, "1000"));
    assert_true(accepts(g, "[0.5]"));
    assert_false(accepts(g, "0.10000000000000001"));
    gm_grammar_unref(g);
    assert_int_equal(compile("{\"type\":\"object\",\"properties\":{"
                             "\"a\":{\"const\":\"x\\u0000\"}},"
                             "\"required\":[\"a\"]}",
                             &g, err, sizeof err),
                     0);
    assert_true(accepts(g, "{\"a\":\"x\\u0000\"}"));
    gm_grammar_unref(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_cases),
        cmocka_unit_test(test_random_ranges),
        cmocka_unit_test(test_enum_reals_and_nul),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
