/* test_grammar_mask.c — token masks over the real Qwen3 (151,669 ids) and
 * Llama-3 vocabularies (common/grammar/gm_matcher.h). For every schema of
 * tests/grammar/schemas.json, for any JSON value / object and for tool
 * calls in both template formats: a random walk under the mask (random
 * logits, tests/support/tt_grammar.h) where the fast mask equals the
 * brute-force oracle's at every step, every drawn token is accepted, no
 * special token is ever allowed and EOS only where the document may end.
 * Also: Qwen's non-special added token "<tool_call>" is allowed by its
 * bytes, a mask row wider than the vocabulary (the model's logits) gets
 * zeros, and rolling back restores earlier masks exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_grammar.h"

#if defined(__SANITIZE_ADDRESS__)
/* ASan + UBSan at -O0 make the oracle about 20 times slower: the sanitizer
 * build checks memory on shorter walks over every 5th schema. */
#define STEPS 4
#define SCHEMA_STRIDE 5
#else
#define STEPS 24 /* per walk: each step runs the ~30 ms oracle */
#define SCHEMA_STRIDE 1
#endif

static struct gm_vocab qwen, llama;

static int setup(void **state)
{
    (void)state;
    return tt_grammar_vocab("qwen3", &qwen) != 0 ||
                   tt_grammar_vocab("llama3", &llama) != 0
               ? -1
               : 0;
}

static int teardown(void **state)
{
    (void)state;
    gm_vocab_free(&qwen);
    gm_vocab_free(&llama);
    return 0;
}

static struct gm_grammar *compile(const struct gm_vocab *v, const char *spec,
                                  size_t len)
{
    struct gm_grammar *g = NULL;
    char err[512];
    if (gm_spec_compile(spec, len, v, NULL, &g, err, sizeof err) != 0)
        fail_msg("%.200s: %s", spec, err);
    return g;
}

static int bit(const uint32_t *m, int32_t id)
{
    return (m[id >> 5] >> (id & 31)) & 1;
}

/* Walks up to `steps` tokens (stopping at EOS), comparing with the oracle
 * at every step. Returns the steps taken. */
static int walk(const struct gm_vocab *v, struct gm_grammar *g,
                const char *name, uint64_t seed, double bias, int steps)
{
    size_t W = gm_vocab_mask_words(v);
    uint32_t *a = tt_xmalloc(W * sizeof(*a));
    uint32_t *b = tt_xmalloc(W * sizeof(*b));
    struct tt_gsampler s;
    struct tt_xrng r = {seed};
    struct gm_matcher m;
    char diff[1024];
    assert_int_equal(tt_gsampler_init(&s, v), 0);
    assert_int_equal(gm_matcher_init(&m, g), 0);
    int i = 0;
    for (; i < steps; i++) {
        assert_int_equal(gm_matcher_fill_mask(&m, a, W), 0);
        assert_int_equal(gm_matcher_fill_mask_naive(&m, b, W), 0);
        if (tt_mask_diff(v, a, b, W, diff, sizeof diff) != 0)
            fail_msg("%s, step %d: %s", name, i, diff);
        for (int32_t id = 0; id < v->n_ids; id++)
            if (bit(a, id) && v->kind[id] != GM_TOK_NORMAL &&
                !(v->kind[id] == GM_TOK_EOS && gm_matcher_can_end(&m)))
                fail_msg("%s, step %d: id %d allowed", name, i, (int)id);
        int32_t id = tt_gsampler_pick(&s, a, bias, &r);
        assert_true(id >= 0);
        assert_int_equal(gm_matcher_accept_token(&m, id), 0);
        if (v->kind[id] == GM_TOK_EOS)
            break;
    }
    gm_matcher_free(&m);
    tt_gsampler_free(&s);
    free(a);
    free(b);
    return i;
}

static void test_corpus_walks_qwen3(void **state)
{
    (void)state;
    json_t *doc = tt_grammar_corpus();
    assert_non_null(doc);
    size_t i;
    const json_t *e;
    json_array_foreach(json_object_get(doc, "schemas"), i, e)
    {
        if (i % SCHEMA_STRIDE != 0)
            continue;
        size_t len;
        char *spec = tt_grammar_spec(json_object_get(e, "schema"), &len);
        struct gm_grammar *g = compile(&qwen, spec, len);
        walk(&qwen, g, json_string_value(json_object_get(e, "name")), 7 + i,
             4.0, STEPS);
        gm_grammar_unref(g);
        free(spec);
    }
    json_decref(doc);
}

static void test_free_json_both_vocabularies(void **state)
{
    (void)state;
    const struct gm_vocab *vs[2] = {&qwen, &llama};
    for (int k = 0; k < 2; k++)
        for (int obj = 0; obj < 2; obj++) {
            char *spec;
            size_t len;
            assert_int_equal(gm_spec_json(obj, &spec, &len), 0);
            struct gm_grammar *g = compile(vs[k], spec, len);
            walk(vs[k], g, spec, 100 + (uint64_t)(2 * k + obj), 0.0, STEPS);
            walk(vs[k], g, spec, 200 + (uint64_t)(2 * k + obj), 4.0, STEPS);
            gm_grammar_unref(g);
            free(spec);
        }
}

static void test_tool_calls(void **state)
{
    (void)state;
    json_t *p = json_loads(
        "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\","
        "\"maxLength\":12},\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]}},"
        "\"required\":[\"location\"],\"additionalProperties\":false}",
        0, NULL);
    struct gm_tool_fn fns[2] = {{"get_weather", p}, {"get_time", NULL}};
    char *spec;
    size_t len;
    /* Hermes with Qwen3: "<tool_call>" is one non-special added token */
    assert_int_equal(gm_spec_tools(&GM_TOOL_HERMES, fns, 2, 1, 2, &spec, &len),
                     0);
    struct gm_grammar *g = compile(&qwen, spec, len);
    free(spec);
    int32_t tc = -1, im_end = -1;
    for (int32_t id = 0; id < qwen.n_ids; id++) {
        size_t n;
        const uint8_t *b = gm_vocab_token(&qwen, id, &n);
        if (b != NULL && n == 11 && memcmp(b, "<tool_call>", 11) == 0)
            tc = id;
    }
    for (int i = 0; i < qwen.n_eos; i++)
        im_end = qwen.eos[i];
    assert_true(tc >= 0 && im_end >= 0);
    struct gm_matcher m;
    size_t W = gm_vocab_mask_words(&qwen);
    uint32_t *mask = tt_xmalloc((W + 8) * sizeof(*mask));
    gm_matcher_init(&m, g);
    /* a logits row wider than the vocabulary: the extra words are 0 */
    memset(mask, 0xff, (W + 8) * sizeof(*mask));
    assert_int_equal(gm_matcher_fill_mask(&m, mask, W + 8), 0);
    assert_true(bit(mask, tc));
    assert_false(bit(mask, im_end));
    for (size_t w = W; w < W + 8; w++)
        assert_int_equal(mask[w], 0);
    gm_matcher_free(&m);
    free(mask);
    walk(&qwen, g, "hermes", 300, 4.0, 3 * STEPS);
    gm_grammar_unref(g);

    assert_int_equal(
        gm_spec_tools(&GM_TOOL_LLAMA3_JSON, fns, 2, 1, 0, &spec, &len), 0);
    g = compile(&llama, spec, len);
    free(spec);
    walk(&llama, g, "llama3_json", 301, 4.0, 3 * STEPS);
    gm_grammar_unref(g);
    json_decref(p);
}

static void test_rollback_restores_masks(void **state)
{
    (void)state;
    char *spec;
    size_t len;
    json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                           "\"array\",\"items\":{\"type\":\"string\"}}}}",
                           0, NULL);
    assert_int_equal(gm_spec_json_schema(s, &spec, &len), 0);
    struct gm_grammar *g = compile(&qwen, spec, len);
    size_t W = gm_vocab_mask_words(&qwen);
    enum { N = 12 };
    uint32_t *masks = tt_xmalloc(N * W * sizeof(*masks));
    uint32_t *now = tt_xmalloc(W * sizeof(*now));
    struct tt_gsampler smp;
    struct tt_xrng r = {42};
    struct gm_matcher m, c;
    tt_gsampler_init(&smp, &qwen);
    gm_matcher_init(&m, g);
    int n = 0;
    for (; n < N; n++) {
        gm_matcher_fill_mask(&m, masks + (size_t)n * W, W);
        int32_t id = tt_gsampler_pick(&smp, masks + (size_t)n * W, 1.0, &r);
        if (qwen.kind[id] == GM_TOK_EOS)
            break;
        assert_int_equal(gm_matcher_accept_token(&m, id), 0);
    }
    assert_int_equal(gm_matcher_copy(&c, &m), 0);
    for (int k = n - 1; k >= 0; k--) {
        assert_int_equal(gm_matcher_rollback(&m, 1), 0);
        gm_matcher_fill_mask(&m, now, W);
        assert_memory_equal(now, masks + (size_t)k * W, W * sizeof(*now));
    }
    /* the copy kept its own history */
    assert_int_equal(gm_matcher_n_accepted(&c), (size_t)n);
    assert_int_equal(gm_matcher_rollback(&c, (size_t)n), 0);
    gm_matcher_fill_mask(&c, now, W);
    assert_memory_equal(now, masks, W * sizeof(*now));
    gm_matcher_free(&m);
    gm_matcher_free(&c);
    tt_gsampler_free(&smp);
    free(masks);
    free(now);
    free(spec);
    json_decref(s);
    gm_grammar_unref(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_walks_qwen3),
        cmocka_unit_test(test_free_json_both_vocabularies),
        cmocka_unit_test(test_tool_calls),
        cmocka_unit_test(test_rollback_restores_masks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
