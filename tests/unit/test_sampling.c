/*
 * test_sampling.c — common/base/tg_sampling: the one check of a sampling
 * value (every bound, NaN and infinities, the vocabulary's bounds on the
 * bias ids and the alternatives, the field it names) and the bias arrays'
 * copy and release.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/base/tg_err.h"
#include "common/base/tg_sampling.h"

#define VOCAB 100

/* Expects *s refused naming `field`, the message naming it too. */
static void refused(const struct tg_sampling *s, int32_t vocab,
                    const char *field)
{
    const char *f = NULL;
    char msg[256] = "";
    assert_int_equal(tg_sampling_check(s, vocab, &f, msg, sizeof(msg)),
                     TG_EINVAL);
    assert_non_null(f);
    assert_string_equal(f, field);
    if (strstr(msg, field) == NULL)
        fail_msg("message '%s' does not name '%s'", msg, field);
    /* Without the out-parameters: the same verdict. */
    assert_int_equal(tg_sampling_check(s, vocab, NULL, NULL, 0), TG_EINVAL);
}

static void accepted(const struct tg_sampling *s, int32_t vocab)
{
    char msg[256];
    int rc = tg_sampling_check(s, vocab, NULL, msg, sizeof(msg));
    if (rc != 0)
        fail_msg("refused: %s", msg);
}

static void test_off_and_defaults(void **state)
{
    (void)state;
    struct tg_sampling s = TG_SAMPLING_OFF;
    accepted(&s, VOCAB);
    accepted(&s, 0);
    assert_true(s.temperature == 0.0f && s.top_p == 1.0f &&
                s.repetition_penalty == 1.0f && s.n_top == 0 && s.n_bias == 0 &&
                s.seed == 0);
}

/* One float field: the values the check takes and the ones it refuses. */
struct float_case {
    const char *field;
    size_t off;
    float ok[6];
    size_t n_ok;
    float bad[6];
    size_t n_bad;
};

static void test_float_bounds(void **state)
{
    (void)state;
    const float inf = INFINITY, nan = NAN;
    const struct float_case c[] = {
        {"temperature",
         offsetof(struct tg_sampling, temperature),
         {0.0f, 1e-30f, 1.0f, 2.0f, 3.0e38f},
         5,
         {-1e-30f, -1.0f, inf, -inf, nan},
         5},
        {"top_p",
         offsetof(struct tg_sampling, top_p),
         {1e-38f, 0.5f, 1.0f},
         3,
         {0.0f, -0.0f, 1.0000001f, inf, nan, -0.5f},
         6},
        {"min_p",
         offsetof(struct tg_sampling, min_p),
         {0.0f, 0.5f, 1.0f},
         3,
         {-1e-30f, 1.0000001f, inf, nan},
         4},
        {"repetition_penalty",
         offsetof(struct tg_sampling, repetition_penalty),
         {1e-38f, 1.0f, 3.0e38f},
         3,
         {0.0f, -1.0f, inf, nan},
         4},
        {"presence_penalty",
         offsetof(struct tg_sampling, presence_penalty),
         {-3.0e38f, -2.0f, 0.0f, 2.0f, 3.0e38f},
         5,
         {inf, -inf, nan},
         3},
        {"frequency_penalty",
         offsetof(struct tg_sampling, frequency_penalty),
         {-3.0e38f, 0.0f, 3.0e38f},
         3,
         {inf, -inf, nan},
         3},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        for (size_t k = 0; k < c[i].n_ok; k++) {
            struct tg_sampling s = TG_SAMPLING_OFF;
            memcpy((char *)&s + c[i].off, &c[i].ok[k], sizeof(float));
            accepted(&s, VOCAB);
        }
        for (size_t k = 0; k < c[i].n_bad; k++) {
            struct tg_sampling s = TG_SAMPLING_OFF;
            memcpy((char *)&s + c[i].off, &c[i].bad[k], sizeof(float));
            refused(&s, VOCAB, c[i].field);
        }
    }
}

/* The first bad field is the one named (the order of the API's fields). */
static void test_first_bad_named(void **state)
{
    (void)state;
    struct tg_sampling s = TG_SAMPLING_OFF;
    s.top_p = 0.0f;
    s.repetition_penalty = INFINITY;
    refused(&s, VOCAB, "top_p");
    char msg[256];
    s.top_p = 1.0f;
    tg_sampling_check(&s, VOCAB, NULL, msg, sizeof(msg));
    assert_non_null(strstr(msg, "repetition_penalty inf"));
}

static void test_top_k_any(void **state)
{
    (void)state;
    /* top_k <= 0 is off, any k above is a filter (k >= vocab keeps all). */
    const int32_t ks[] = {INT32_MIN, -1, 0, 1, VOCAB, INT32_MAX};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        struct tg_sampling s = TG_SAMPLING_OFF;
        s.top_k = ks[i];
        accepted(&s, VOCAB);
    }
}

static void test_n_top_bounds(void **state)
{
    (void)state;
    struct tg_sampling s = TG_SAMPLING_OFF;
    s.n_top = TG_SAMPLING_MAX_TOP;
    accepted(&s, VOCAB);
    accepted(&s, 0); /* no vocabulary: the sampler's bound alone */
    s.n_top = TG_SAMPLING_MAX_TOP + 1;
    refused(&s, VOCAB, "logprobs");
    refused(&s, 0, "logprobs");
    s.n_top = -1;
    refused(&s, VOCAB, "logprobs");
    /* A vocabulary smaller than the bound bounds it. */
    s.n_top = 8;
    accepted(&s, 8);
    refused(&s, 7, "logprobs");
    char msg[256];
    s.n_top = 1000;
    tg_sampling_check(&s, VOCAB, NULL, msg, sizeof(msg));
    assert_non_null(strstr(msg, "1000 logprobs"));
}

static void test_bias_bounds(void **state)
{
    (void)state;
    int32_t ids[3] = {0, 5, VOCAB - 1};
    float vals[3] = {-100.0f, 0.0f, 100.0f};
    struct tg_sampling s = TG_SAMPLING_OFF;
    s.bias_ids = ids;
    s.bias_vals = vals;
    s.n_bias = 3;
    accepted(&s, VOCAB);
    accepted(&s, 0);
    /* An id at the vocabulary's size; without a vocabulary it passes. */
    ids[2] = VOCAB;
    refused(&s, VOCAB, "logit_bias");
    accepted(&s, 0);
    ids[2] = VOCAB - 1;
    /* Negative, repeated and descending ids. */
    ids[0] = -1;
    refused(&s, 0, "logit_bias");
    ids[0] = 5;
    refused(&s, VOCAB, "logit_bias");
    ids[0] = 6;
    refused(&s, VOCAB, "logit_bias");
    ids[0] = 0;
    /* Non-finite values. */
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < 3; i++) {
        vals[1] = bad[i];
        refused(&s, VOCAB, "logit_bias");
    }
    vals[1] = 0.0f;
    accepted(&s, VOCAB);
    /* Counts: negative, more than the vocabulary, arrays missing. */
    s.n_bias = -1;
    refused(&s, VOCAB, "logit_bias");
    s.n_bias = 3;
    refused(&s, 2, "logit_bias");
    s.bias_vals = NULL;
    refused(&s, VOCAB, "logit_bias");
    s.bias_vals = vals;
    s.bias_ids = NULL;
    refused(&s, VOCAB, "logit_bias");
    /* None: the arrays may be NULL. */
    s.n_bias = 0;
    s.bias_vals = NULL;
    accepted(&s, VOCAB);
}

static void test_bias_copy_free(void **state)
{
    (void)state;
    const int32_t ids[2] = {3, 9};
    const float vals[2] = {1.5f, -2.0f};
    struct tg_sampling src = TG_SAMPLING_OFF, dst = TG_SAMPLING_OFF;
    src.bias_ids = ids;
    src.bias_vals = vals;
    src.n_bias = 2;
    dst.temperature = 0.5f;
    assert_int_equal(tg_sampling_bias_copy(&dst, &src), 0);
    assert_int_equal(dst.n_bias, 2);
    assert_ptr_not_equal(dst.bias_ids, ids);
    assert_int_equal(dst.bias_ids[1], 9);
    assert_true(dst.bias_vals[0] == 1.5f);
    assert_true(dst.temperature == 0.5f); /* the rest untouched */
    tg_sampling_bias_free(&dst);
    assert_int_equal(dst.n_bias, 0);
    assert_null(dst.bias_ids);
    assert_null(dst.bias_vals);
    tg_sampling_bias_free(&dst); /* safe on an empty bias */
    src.n_bias = 0;
    assert_int_equal(tg_sampling_bias_copy(&dst, &src), 0);
    assert_null(dst.bias_ids);
    assert_int_equal(dst.n_bias, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_and_defaults),
        cmocka_unit_test(test_float_bounds),
        cmocka_unit_test(test_first_bad_named),
        cmocka_unit_test(test_top_k_any),
        cmocka_unit_test(test_n_top_bounds),
        cmocka_unit_test(test_bias_bounds),
        cmocka_unit_test(test_bias_copy_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
