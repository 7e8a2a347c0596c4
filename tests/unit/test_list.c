/* test_list.c — the intrusive list (common/base/tg_list.h): a zeroed list
 * is empty, both ends and insertion before a node keep the order, removal
 * anywhere (first, last, middle, only node) relinks the neighbours and
 * resets the node, the LRU move, iteration that unlinks as it goes, and a
 * random sequence of operations checked against an array model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/base/tg_list.h"

struct item {
    int id;
    struct tg_list_node link;
};

/* The ids of l front to back into out; checks the back-to-front walk
 * gives the same in reverse. Returns the count. */
static int ids_of(const struct tg_list *l, int *out, int max)
{
    assert_int_equal(tg_list_check(l, (size_t)max), 0);
    int n = 0;
    struct tg_list_node *x;
    TG_LIST_FOREACH(x, l)
    {
        assert_true(n < max);
        out[n++] = TG_LIST_ENTRY(x, struct item, link)->id;
    }
    int k = n;
    TG_LIST_FOREACH_REV(x, l)
    {
        assert_int_equal(TG_LIST_ENTRY(x, struct item, link)->id, out[--k]);
    }
    assert_int_equal(k, 0);
    assert_int_equal(tg_list_count(l), (size_t)n);
    return n;
}

static void expect(const struct tg_list *l, const int *want, int n)
{
    int got[64];
    assert_int_equal(ids_of(l, got, 64), n);
    if (n > 0)
        assert_memory_equal(got, want, (size_t)n * sizeof(int));
}

static void test_zeroed_is_empty(void **state)
{
    (void)state;
    struct tg_list l;
    memset(&l, 0, sizeof(l));
    assert_true(tg_list_empty(&l));
    assert_null(tg_list_pop_front(&l));
    assert_null(TG_LIST_FIRST(&l, struct item, link));
    assert_null(TG_LIST_LAST(&l, struct item, link));
    expect(&l, NULL, 0);
}

static void test_order_and_remove(void **state)
{
    (void)state;
    struct item it[6];
    struct tg_list l = {0};
    for (int i = 0; i < 6; i++)
        it[i] = (struct item){.id = i};
    tg_list_push_back(&l, &it[1].link);
    tg_list_push_back(&l, &it[2].link);
    tg_list_push_front(&l, &it[0].link);
    tg_list_insert_before(&l, &it[2].link, &it[3].link);
    tg_list_insert_before(&l, NULL, &it[4].link);
    tg_list_insert_before(&l, &it[0].link, &it[5].link);
    expect(&l, (const int[]){5, 0, 1, 3, 2, 4}, 6);
    assert_ptr_equal(TG_LIST_FIRST(&l, struct item, link), &it[5]);
    assert_ptr_equal(TG_LIST_LAST(&l, struct item, link), &it[4]);

    tg_list_remove(&l, &it[1].link); /* middle */
    assert_null(it[1].link.prev);
    assert_null(it[1].link.next);
    expect(&l, (const int[]){5, 0, 3, 2, 4}, 5);
    tg_list_remove(&l, &it[5].link); /* first */
    expect(&l, (const int[]){0, 3, 2, 4}, 4);
    tg_list_remove(&l, &it[4].link); /* last */
    expect(&l, (const int[]){0, 3, 2}, 3);
    assert_ptr_equal(tg_list_pop_front(&l), &it[0].link);
    assert_ptr_equal(tg_list_pop_front(&l), &it[3].link);
    tg_list_remove(&l, &it[2].link); /* the only node */
    assert_true(tg_list_empty(&l));
    assert_null(l.last);
    expect(&l, NULL, 0);
}

static void test_move_front(void **state)
{
    (void)state;
    struct item it[4];
    struct tg_list l = {0};
    for (int i = 0; i < 4; i++) {
        it[i] = (struct item){.id = i};
        tg_list_push_back(&l, &it[i].link);
    }
    tg_list_move_front(&l, &it[2].link);
    expect(&l, (const int[]){2, 0, 1, 3}, 4);
    tg_list_move_front(&l, &it[2].link); /* already first */
    expect(&l, (const int[]){2, 0, 1, 3}, 4);
    tg_list_move_front(&l, &it[3].link); /* the last */
    expect(&l, (const int[]){3, 2, 0, 1}, 4);
}

static void test_foreach_safe_unlinks(void **state)
{
    (void)state;
    struct item it[8];
    struct tg_list l = {0};
    for (int i = 0; i < 8; i++) {
        it[i] = (struct item){.id = i};
        tg_list_push_back(&l, &it[i].link);
    }
    struct tg_list_node *x, *tmp;
    TG_LIST_FOREACH_SAFE(x, tmp, &l)
    {
        struct item *e = TG_LIST_ENTRY(x, struct item, link);
        if (e->id % 2 == 0) {
            tg_list_remove(&l, x);
            memset(e, 0xA5, sizeof(*e)); /* as if freed */
        }
    }
    expect(&l, (const int[]){1, 3, 5, 7}, 4);
}

/* A list may move with its struct: nodes never point at the list. */
static void test_list_moves(void **state)
{
    (void)state;
    struct item it[3];
    struct tg_list a = {0};
    for (int i = 0; i < 3; i++) {
        it[i] = (struct item){.id = i};
        tg_list_push_back(&a, &it[i].link);
    }
    struct tg_list b = a;
    memset(&a, 0, sizeof(a));
    tg_list_remove(&b, &it[0].link);
    expect(&b, (const int[]){1, 2}, 2);
}

static uint64_t rng = 0x853C49E6748FEA9Bull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void test_random_against_model(void **state)
{
    (void)state;
    enum { N = 48 };
    struct item it[N];
    int model[N], n = 0;
    int linked[N] = {0};
    struct tg_list l = {0};
    for (int i = 0; i < N; i++)
        it[i] = (struct item){.id = i};
    for (int step = 0; step < 20000; step++) {
        int i = (int)rnd(N);
        int op = (int)rnd(4);
        if (!linked[i]) {
            if (op == 0 || n == 0) {
                tg_list_push_back(&l, &it[i].link);
                model[n++] = i;
            } else if (op == 1) {
                tg_list_push_front(&l, &it[i].link);
                memmove(model + 1, model, (size_t)n * sizeof(int));
                model[0] = i;
                n++;
            } else {
                int at = (int)rnd((uint32_t)n);
                tg_list_insert_before(&l, &it[model[at]].link, &it[i].link);
                memmove(model + at + 1, model + at,
                        (size_t)(n - at) * sizeof(int));
                model[at] = i;
                n++;
            }
            linked[i] = 1;
        } else {
            int at = 0;
            while (model[at] != i)
                at++;
            memmove(model + at, model + at + 1,
                    (size_t)(n - at - 1) * sizeof(int));
            n--;
            if (op == 3) {
                tg_list_move_front(&l, &it[i].link);
                memmove(model + 1, model, (size_t)n * sizeof(int));
                model[0] = i;
                n++;
            } else {
                tg_list_remove(&l, &it[i].link);
                linked[i] = 0;
            }
        }
        expect(&l, model, n);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zeroed_is_empty),
        cmocka_unit_test(test_order_and_remove),
        cmocka_unit_test(test_move_front),
        cmocka_unit_test(test_foreach_safe_unlinks),
        cmocka_unit_test(test_list_moves),
        cmocka_unit_test(test_random_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
