/* test_text.c — incremental text, stop strings and hold-back (rt_text). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "router/core/rt_text.h"
#include "tests/support/tt_support.h"

static struct tok_tokenizer tok;

static int setup(void **state)
{
    (void)state;
    char path[4096];
    tt_data_path("tokenizers/qwen3/tokenizer.json", path, sizeof(path));
    char err[512];
    int rc = tok_tokenizer_load(&tok, path, err, sizeof(err));
    if (rc != 0)
        fprintf(stderr, "test_text: %s: %s\n", path, err);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    tok_tokenizer_free(&tok);
    return 0;
}

static void encode(const char *s, struct tok_ids *ids)
{
    ids->n = 0;
    assert_int_equal(tok_encode(&tok, NULL, s, strlen(s), 0, ids, NULL, 0), 0);
}

/* Streams `text` token by token; collects what a client would receive. */
static void stream(const char *text, const char *const *stops, int n_stops,
                   char *got, size_t cap, int *hit_at)
{
    struct tok_ids ids = {0};
    struct rt_text t;
    encode(text, &ids);
    assert_int_equal(rt_text_init(&t, &tok, stops, n_stops), 0);
    size_t n = 0;
    *hit_at = -1;
    for (size_t i = 0; i < ids.n; i++) {
        int hit;
        assert_int_equal(rt_text_push(&t, ids.v[i], &hit), 0);
        size_t ready = rt_text_ready(&t, 0);
        /* a released byte is never taken back */
        assert_true(ready >= t.emitted);
        memcpy(got + n, t.out.data + t.emitted, ready - t.emitted);
        n += ready - t.emitted;
        rt_text_mark(&t, ready);
        if (hit) {
            *hit_at = (int)i;
            break;
        }
    }
    assert_int_equal(rt_text_finish(&t), 0);
    size_t ready = rt_text_ready(&t, 1);
    memcpy(got + n, t.out.data + t.emitted, ready - t.emitted);
    n += ready - t.emitted;
    assert_true(n < cap);
    got[n] = '\0';
    rt_text_free(&t);
    tok_ids_free(&ids);
}

static void test_no_stop_roundtrip(void **state)
{
    (void)state;
    char got[512];
    int hit;
    const char *s = "Héllo wörld, 你好世界! 🙂 tabs\tand\nnewlines";
    stream(s, NULL, 0, got, sizeof(got), &hit);
    assert_string_equal(got, s);
    assert_int_equal(hit, -1);
}

static void test_stop_cuts_text(void **state)
{
    (void)state;
    char got[512];
    int hit;
    const char *stops[] = {"STOP", "never"};
    stream("Hello world. STOP here and more", stops, 2, got, sizeof(got), &hit);
    assert_string_equal(got, "Hello world. ");
    assert_true(hit >= 0);
}

static void test_stop_inside_token(void **state)
{
    (void)state;
    char got[512];
    int hit;
    /* "lo w" spans tokens "Hello" and " world": the match starts mid-token. */
    const char *stops[] = {"lo w"};
    stream("Hello world", stops, 1, got, sizeof(got), &hit);
    assert_string_equal(got, "Hel");
}

static void test_holdback_never_leaks_prefix(void **state)
{
    (void)state;
    struct tok_ids ids = {0};
    struct rt_text t;
    const char *stops[] = {"world peace"};
    encode("hello world of tomorrow", &ids);
    assert_int_equal(rt_text_init(&t, &tok, stops, 1), 0);
    for (size_t i = 0; i < ids.n; i++) {
        int hit;
        assert_int_equal(rt_text_push(&t, ids.v[i], &hit), 0);
        assert_int_equal(hit, 0);
        size_t ready = rt_text_ready(&t, 0);
        /* right after " world" the tail "world" must be held back */
        if (t.out.len >= 11 && memcmp(t.out.data, "hello world", 11) == 0 &&
            t.out.len == 11)
            assert_int_equal(ready, 6); /* "hello " */
        rt_text_mark(&t, ready);
    }
    assert_int_equal(rt_text_ready(&t, 1), strlen("hello world of tomorrow"));
    rt_text_free(&t);
    tok_ids_free(&ids);
}

static void test_split_utf8(void **state)
{
    (void)state;
    struct rt_text t;
    assert_int_equal(rt_text_init(&t, &tok, NULL, 0), 0);
    /* Byte-level tokens of one 4-byte emoji: nothing may come out before
     * the sequence is complete. */
    const char *emoji = "\xF0\x9F\x99\x82";
    int32_t ids4[4];
    for (int i = 0; i < 4; i++) {
        int32_t id = -1;
        /* find the single-byte token of emoji[i] */
        for (int32_t v = 0; v < tok_vocab_size(&tok) && id < 0; v++) {
            size_t n;
            const char *bytes = tok_id_bytes(&tok, v, &n);
            if (bytes != NULL && n == 1 && (unsigned char)bytes[0] == (unsigned char)emoji[i])
                id = v;
        }
        assert_true(id >= 0);
        ids4[i] = id;
    }
    for (int i = 0; i < 4; i++) {
        int hit;
        assert_int_equal(rt_text_push(&t, ids4[i], &hit), 0);
        assert_int_equal(t.out.len, i < 3 ? 0u : 4u);
    }
    assert_memory_equal(t.out.data, emoji, 4);
    rt_text_free(&t);
}

static void test_bad_input(void **state)
{
    (void)state;
    struct rt_text t;
    const char *stops[] = {""};
    assert_int_equal(rt_text_init(&t, &tok, stops, 1), TG_EINVAL);
    rt_text_free(&t); /* safe after a failed init */
    struct rt_text z = {0};
    rt_text_free(&z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_stop_roundtrip),
        cmocka_unit_test(test_stop_cuts_text),
        cmocka_unit_test(test_stop_inside_token),
        cmocka_unit_test(test_holdback_never_leaks_prefix),
        cmocka_unit_test(test_split_utf8),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
