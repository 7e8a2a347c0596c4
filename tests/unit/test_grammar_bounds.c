/* test_grammar_bounds.c — the bounds on the engine's work: ambiguous
 * grammars and the matcher's budget (common/grammar/gm_matcher.h), and
 * the compile's time limit over every stage (gm_spec.h).
 *
 * The grammar under test is a tree: anyOf of two array schemas whose
 * items are the tree again (at most 2 items / at least 3): after each
 * "[" both alternatives are alive, so a matcher that kept one head per
 * stack would double its heads at every level of nesting (2^20 heads at
 * depth 20). With the graph-structured stack the work of a mask or an
 * accept stays flat with depth. Checked here:
 *   - the work of a mask and of an accept at depth 96 is within a small
 *     constant of depth 8's (counted in work units, not time: no clock);
 *   - the language is still exact: every prefix of random strings over
 *     "[],", and whole documents, are accepted exactly when an independent
 *     recognizer of nested arrays says so (both alternatives together
 *     allow any number of items);
 *   - the fast mask equals the brute-force oracle along a deep walk;
 *   - a call over its budget fails with TG_ETIMEDOUT and leaves the state
 *     as it was (masks, accepted count), and the next call under a
 *     sufficient budget goes on as if nothing happened.
 * The compile's limit (gm_limits.max_compile_s) counts from the spec's
 * parsing and holds in the stages that used to run unchecked: an 80,000
 * integer enum (a 40,000 one's IR took 9.7 s on this project's 2-core
 * box, quadratic, its automaton 1.5 s) and a oneOf of two 26,000-string
 * enums (the proof that they are exclusive compares every pair: over 10
 * s at 13,000) fail with TG_ETIMEDOUT soon after a 0.3 s limit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "tests/support/tt_grammar.h"

static const char TREE[] =
    "{\"type\":\"json_schema\",\"schema\":{\"anyOf\":["
    "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":2},"
    "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"minItems\":3}]}}";

static struct gm_vocab qwen;
static struct gm_grammar *tree;

static int setup(void **state)
{
    (void)state;
    char err[256];
    if (tt_grammar_vocab("qwen3", &qwen) != 0)
        return -1;
    if (gm_spec_compile(TREE, strlen(TREE), &qwen, NULL, &tree, err,
                        sizeof err) != 0) {
        fprintf(stderr, "compile: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    gm_grammar_unref(tree);
    gm_vocab_free(&qwen);
    return 0;
}

/* The independent recognizer: JSON arrays of arrays, no whitespace.
 * Returns 1 when s[0..n) is a prefix of such a document, and sets
 * *complete when it is a whole one. */
static int nested_prefix(const char *s, size_t n, int *complete)
{
    int depth = 0;
    enum { START, OPEN, VALUE, COMMA, DONE } st = START;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '[' && (st == START || st == OPEN || st == COMMA)) {
            depth++;
            st = OPEN;
        } else if (c == ']' && (st == OPEN || st == VALUE)) {
            depth--;
            st = depth == 0 ? DONE : VALUE;
        } else if (c == ',' && st == VALUE) {
            st = COMMA;
        } else {
            return 0;
        }
    }
    *complete = st == DONE;
    return 1;
}

static void test_nesting_work_is_flat(void **state)
{
    (void)state;
    size_t W = gm_vocab_mask_words(&qwen);
    uint32_t *mask = tt_xmalloc(W * sizeof(*mask));
    struct gm_matcher m;
    assert_int_equal(gm_matcher_init(&m, tree), 0);
    uint64_t mask8 = 0, acc8 = 0;
    for (int d = 1; d <= 96; d++) {
        assert_int_equal(gm_matcher_accept_bytes(&m, "[", 1), 0);
        uint64_t acc = gm_matcher_last_work(&m);
        assert_int_equal(gm_matcher_fill_mask(&m, mask, W), 0);
        uint64_t mw = gm_matcher_last_work(&m);
        if (d == 8) {
            mask8 = mw;
            acc8 = acc;
        }
        /* flat: a constant times depth 8's work (it was 2^(d-8) times) */
        if (d > 8) {
            if (mw > 4 * mask8 + 64)
                fail_msg("depth %d: mask work %llu, depth 8: %llu", d,
                         (unsigned long long)mw, (unsigned long long)mask8);
            if (acc > 4 * acc8 + 64)
                fail_msg("depth %d: accept work %llu, depth 8: %llu", d,
                         (unsigned long long)acc, (unsigned long long)acc8);
        }
    }
    /* closing all 96 levels ends the document */
    for (int d = 0; d < 96; d++)
        assert_int_equal(gm_matcher_accept_bytes(&m, "]", 1), 0);
    assert_true(gm_matcher_can_end(&m));
    gm_matcher_free(&m);
    free(mask);
}

static void test_language_exact(void **state)
{
    (void)state;
    static const char alphabet[] = "[],";
    struct tt_xrng r = {2026};
    char s[40];
    int complete_seen = 0;
    for (int trial = 0; trial < 3000; trial++) {
        /* biased toward "[" early so some strings nest deeply */
        size_t n = 1 + tt_xrng_next(&r) % (sizeof(s) - 1);
        for (size_t i = 0; i < n; i++) {
            uint64_t x = tt_xrng_next(&r) % 8;
            s[i] = x < 4 ? '[' : alphabet[1 + (x & 1)];
        }
        struct gm_matcher m;
        assert_int_equal(gm_matcher_init(&m, tree), 0);
        for (size_t i = 0; i < n; i++) {
            int complete = 0;
            int want = nested_prefix(s, i + 1, &complete);
            int rc = gm_matcher_accept_bytes(&m, s + i, 1);
            if (rc != (want ? 0 : TG_EINVAL))
                fail_msg("\"%.*s\": byte %zu: rc %d, recognizer %d", (int)n, s,
                         i, rc, want);
            if (!want)
                break;
            if (gm_matcher_can_end(&m) != complete)
                fail_msg("\"%.*s\": may end %d, recognizer %d", (int)(i + 1), s,
                         gm_matcher_can_end(&m), complete);
            complete_seen += complete;
        }
        gm_matcher_free(&m);
    }
    assert_true(complete_seen > 0);
}

static void test_deep_walk_matches_oracle(void **state)
{
    (void)state;
    size_t W = gm_vocab_mask_words(&qwen);
    uint32_t *a = tt_xmalloc(W * sizeof(*a)), *b = tt_xmalloc(W * sizeof(*b));
    char diff[1024];
    struct gm_matcher m;
    assert_int_equal(gm_matcher_init(&m, tree), 0);
    /* down 24 levels, some items, back up: "[[...[[],[[]],[]]...]]" */
    static const char *const steps[] = {"[[[[", "[[[[", "[[[[", "[[[[",
                                        "[[[[", "[[[[", "[]",   ",[[]]",
                                        ",[]",  "]]]]", "],[",  "]]]]"};
    for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
        assert_int_equal(gm_matcher_fill_mask(&m, a, W), 0);
        assert_int_equal(gm_matcher_fill_mask_naive(&m, b, W), 0);
        if (tt_mask_diff(&qwen, a, b, W, diff, sizeof diff) != 0)
            fail_msg("before \"%s\": %s", steps[k], diff);
        assert_int_equal(
            gm_matcher_accept_bytes(&m, steps[k], strlen(steps[k])), 0);
    }
    gm_matcher_free(&m);
    free(a);
    free(b);
}

static void test_budget_fails_and_keeps_state(void **state)
{
    (void)state;
    size_t W = gm_vocab_mask_words(&qwen);
    uint32_t *before = tt_xmalloc(W * sizeof(*before));
    uint32_t *after = tt_xmalloc(W * sizeof(*after));
    struct gm_matcher m;
    assert_int_equal(gm_matcher_init(&m, tree), 0);
    assert_int_equal(gm_matcher_accept_bytes(&m, "[[[[", 4), 0);
    assert_int_equal(gm_matcher_fill_mask(&m, before, W), 0);
    uint64_t need = gm_matcher_last_work(&m);
    assert_true(need > 2);
    /* a budget below what the mask takes */
    gm_matcher_set_budget(&m, need - 1, 0);
    assert_int_equal(gm_matcher_fill_mask(&m, after, W), TG_ETIMEDOUT);
    /* and below what an accept takes */
    gm_matcher_set_budget(&m, 1, 0);
    assert_int_equal(gm_matcher_accept_bytes(&m, "[],[", 4), TG_ETIMEDOUT);
    assert_int_equal(gm_matcher_n_accepted(&m), 1);
    /* the state is as it was: same mask, and it goes on */
    gm_matcher_set_budget(&m, GM_MATCHER_WORK_DEFAULT, 0);
    assert_int_equal(gm_matcher_fill_mask(&m, after, W), 0);
    assert_memory_equal(before, after, W * sizeof(*after));
    assert_int_equal(gm_matcher_accept_bytes(&m, "[],[", 4), 0);
    assert_int_equal(gm_matcher_accept_bytes(&m, "]]]]]", 5), 0);
    assert_true(gm_matcher_can_end(&m));
    /* a time budget already spent: the deadline is read every 4,096
     * units, so give the call more than that to do (a deep document in
     * one call) */
    gm_matcher_reset(&m);
    gm_matcher_set_budget(&m, 0, 1e-9);
    char deep[4000];
    memset(deep, '[', sizeof deep);
    assert_int_equal(gm_matcher_accept_bytes(&m, deep, sizeof deep),
                     TG_ETIMEDOUT);
    assert_int_equal(gm_matcher_n_accepted(&m), 0);
    gm_matcher_set_budget(&m, 0, 0);
    assert_int_equal(gm_matcher_accept_bytes(&m, deep, sizeof deep), 0);
    gm_matcher_free(&m);
    free(before);
    free(after);
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A spec text of a big enum schema: `kind` 0 the integers 0..n-1, 1 a
 * oneOf of two enums of n strings each ("a0".. and "b0"..). */
static char *big_enum(int kind, int n)
{
    size_t cap = (size_t)n * 24 + 256, len = 0;
    char *s = tt_xmalloc(cap);
    len += (size_t)snprintf(s, cap, "{\"type\":\"json_schema\",\"schema\":");
    if (kind == 0) {
        len += (size_t)snprintf(s + len, cap - len, "{\"enum\":[");
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(s + len, cap - len, "%s%d", i ? "," : "",
                                    i);
        len += (size_t)snprintf(s + len, cap - len, "]}}");
    } else {
        len += (size_t)snprintf(s + len, cap - len, "{\"oneOf\":[");
        for (int b = 0; b < 2; b++) {
            len += (size_t)snprintf(s + len, cap - len, "%s{\"enum\":[",
                                    b ? "," : "");
            for (int i = 0; i < n; i++)
                len += (size_t)snprintf(s + len, cap - len, "%s\"%c%d\"",
                                        i ? "," : "", 'a' + b, i);
            len += (size_t)snprintf(s + len, cap - len, "]}");
        }
        len += (size_t)snprintf(s + len, cap - len, "]}}");
    }
    return s;
}

static void test_compile_limit_holds(void **state)
{
    (void)state;
    /* The bound: the 0.3 s limit plus 10 s, for the stretch between two
     * reads of the clock on a loaded 2-core machine. Before the limit
     * covered their stages the cases took ~40 s idle there (each is
     * quadratic, at twice the size that took ~10 s); idle, they now stop
     * within ~0.4 s of the start. The spec bound is raised to fit them. */
    const double limit = 0.3, slack = 10.0;
    struct gm_limits lim;
    gm_limits_default(&lim);
    lim.max_compile_s = limit;
    lim.max_spec_bytes = (size_t)1 << 20;
    for (int kind = 0; kind < 2; kind++) {
        char *spec = big_enum(kind, kind == 0 ? 80000 : 26000);
        struct gm_grammar *g = NULL;
        char err[256];
        double t0 = mono_s();
        int rc = gm_spec_compile(spec, strlen(spec), &qwen, &lim, &g, err,
                                 sizeof err);
        double took = mono_s() - t0;
        if (rc != TG_ETIMEDOUT)
            fail_msg("case %d: rc %d (%s) after %.2f s", kind, rc,
                     rc ? err : "compiled", took);
        assert_non_null(strstr(err, "time limit"));
        if (took > limit + slack)
            fail_msg("case %d: stopped after %.2f s, limit %.1f s", kind, took,
                     limit);
        /* the router's check stops as well */
        t0 = mono_s();
        rc = gm_spec_check(spec, strlen(spec), &lim, err, sizeof err);
        took = mono_s() - t0;
        if (rc != TG_ETIMEDOUT || took > limit + slack)
            fail_msg("case %d: check rc %d after %.2f s", kind, rc, took);
        free(spec);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nesting_work_is_flat),
        cmocka_unit_test(test_language_exact),
        cmocka_unit_test(test_deep_walk_matches_oracle),
        cmocka_unit_test(test_budget_fails_and_keeps_state),
        cmocka_unit_test(test_compile_limit_holds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
