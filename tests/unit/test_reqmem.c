/* test_reqmem.c — the request memory budget (router/core/rt_reqmem): takes
 * and refusals, waiters started in arrival order as room comes back (one
 * that gave up skipped, a go that gives back starting the next from the
 * same loop), and the estimate of a JSON body: counted without parsing,
 * escapes and UTF-8 resolved for the whitespace runs, growing with what
 * costs memory (values, containers, string bytes, the longest word) and
 * not with what does not (a long prompt of short words). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_reqmem.h"

struct waiter {
    struct rt_reqmem_waiter w;
    struct rt_reqmem *m;
    int ran;       /* order in which go ran (0 = not yet) */
    int give_back; /* go gives its bytes back at once */
};

static int g_order;

static void go(struct rt_reqmem_waiter *w)
{
    struct waiter *x = (struct waiter *)w;
    x->ran = ++g_order;
    if (x->give_back)
        rt_reqmem_give(x->m, w->cost);
}

static void test_take_wait_give(void **state)
{
    (void)state;
    struct rt_reqmem m;
    rt_reqmem_init(&m, 100);
    g_order = 0;
    assert_int_equal(rt_reqmem_take(&m, 60), 0);
    assert_int_equal(rt_reqmem_take(&m, 101), TG_ETOOBIG);
    assert_int_equal(rt_reqmem_take(&m, 50), TG_EAGAIN);
    assert_int_equal(m.refused, 2);
    struct waiter a = {{.cost = 50, .go = go}, &m, 0, 0};
    struct waiter b = {{.cost = 60, .go = go}, &m, 0, 1};
    struct waiter c = {{.cost = 40, .go = go}, &m, 0, 0};
    struct waiter d = {{.cost = 10, .go = go}, &m, 0, 0};
    assert_int_equal(rt_reqmem_wait(&m, &a.w), TG_EAGAIN);
    assert_int_equal(rt_reqmem_wait(&m, &b.w), TG_EAGAIN);
    assert_int_equal(rt_reqmem_wait(&m, &c.w), TG_EAGAIN);
    /* d's 10 would fit now, but the others came first. */
    assert_int_equal(rt_reqmem_wait(&m, &d.w), TG_EAGAIN);
    assert_int_equal(m.n_waiting, 4);
    /* A non-waiting caller does not overtake them either. */
    assert_int_equal(rt_reqmem_take(&m, 5), TG_EAGAIN);
    rt_reqmem_cancel(&m, &c.w);
    assert_int_equal(m.n_waiting, 3);
    /* 60 back: a (50) starts, b (60) would not fit beside it. */
    rt_reqmem_give(&m, 60);
    assert_int_equal(a.ran, 1);
    assert_int_equal(b.ran, 0);
    assert_int_equal(m.used, 50);
    /* a's 50 back: b starts and gives its 30 back at once, and d starts
     * from the same loop; c, which gave up, never does. */
    rt_reqmem_give(&m, 50);
    assert_int_equal(b.ran, 2);
    assert_int_equal(d.ran, 3);
    assert_int_equal(c.ran, 0);
    assert_int_equal(m.used, 10);
    assert_int_equal(m.n_waiting, 0);
    assert_int_equal(m.peak, 60);
    rt_reqmem_give(&m, 10);
    assert_int_equal(m.used, 0);
    /* Room now and nobody waiting: taken at once, go not called. */
    struct waiter e = {{.cost = 100, .go = go}, &m, 0, 0};
    assert_int_equal(rt_reqmem_wait(&m, &e.w), 0);
    assert_int_equal(e.ran, 0);
    struct waiter f = {{.cost = 101, .go = go}, &m, 0, 0};
    assert_int_equal(rt_reqmem_wait(&m, &f.w), TG_ETOOBIG);
    rt_reqmem_give(&m, 100);
}

static size_t estimate(const char *s, struct rt_reqmem_json *j)
{
    rt_reqmem_json_scan(s, strlen(s), j);
    return rt_reqmem_json_estimate(j);
}

static void test_scan(void **state)
{
    (void)state;
    struct rt_reqmem_json j;
    estimate("{\"a\": [1, -2.5e3, true, null, \"x\\\"y\"], \"b\": {}}", &j);
    assert_int_equal(j.objects, 2);
    assert_int_equal(j.arrays, 1);
    assert_int_equal(j.members, 2);
    /* The two objects, the array, four scalars, three strings (keys). */
    assert_int_equal(j.values, 2 + 1 + 4 + 3);
    assert_int_equal(j.string_bytes, 1 + 1 + 3);
    /* Runs inside strings, escapes and UTF-8 resolved: "\n" and U+3000
     * are whitespace, "\u00e9" and U+00E9 are not; a string's runs end
     * with it. */
    estimate("[\"ab\\ncd\\u3000\\u3000 x\", \"\\u00e9\\u00e9\xc3\xa9\"]", &j);
    assert_int_equal(j.ws_run, 3 + 3 + 1);
    assert_int_equal(j.word_run, 6);
    assert_int_equal(j.string_bytes, 2 + 1 + 2 + 6 + 1 + 1 + 6);
    /* Text that is not JSON gives the same runs. */
    struct rt_reqmem_json k;
    memset(&k, 0, sizeof(k));
    rt_reqmem_json_string(&k, "ab\ncd\xe3\x80\x80 x\"\"", 12);
    assert_int_equal(k.values, 1);
    assert_int_equal(k.ws_run, 4);
    assert_int_equal(k.word_run, 3);
}

/* A body of `n` copies of `unit` between `head` and `tail`. */
static char *repeat(const char *head, const char *unit, size_t n,
                    const char *tail)
{
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * n + tl + 1);
    assert_non_null(s);
    memcpy(s, head, hl);
    for (size_t i = 0; i < n; i++)
        memcpy(s + hl + i * ul, unit, ul);
    memcpy(s + hl + ul * n, tail, tl + 1);
    return s;
}

static void test_estimate(void **state)
{
    (void)state;
    struct rt_reqmem_json j;
    enum { N = 100000 };
    /* 8 bytes a message, hundreds of bytes once parsed and rendered. */
    char *chat = repeat("{\"messages\": [", "{\"a\":1},", N, "{}]}");
    size_t e_chat = estimate(chat, &j);
    assert_true(e_chat > 100u * strlen(chat));
    /* The same bytes as one prompt of short words: a few bytes each. */
    char *text = repeat("{\"prompt\": \"", "abc def ", N, "\"}");
    size_t e_text = estimate(text, &j);
    assert_true(j.word_run == 6 && j.ws_run == 1); /* "prompt" */
    assert_true(e_text < 32u * strlen(text));
    /* One word of the same length: BPE's scratch for all of it. */
    char *word = repeat("{\"prompt\": \"", "abcdefgh", N, "\"}");
    size_t e_word = estimate(word, &j);
    assert_int_equal(j.word_run, 8u * N);
    assert_true(e_word >= e_text + (size_t)RT_REQMEM_PER_WORD_BYTE * 7 * N);
    /* Integers: each a value. */
    char *ints = repeat("{\"prompt\": [", "1,", N, "1]}");
    size_t e_ints = estimate(ints, &j);
    assert_int_equal(j.values, 2 + N + 1 + 1);
    assert_true(e_ints >= (size_t)RT_REQMEM_PER_VALUE * N);
    free(chat);
    free(text);
    free(word);
    free(ints);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_take_wait_give),
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_estimate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
