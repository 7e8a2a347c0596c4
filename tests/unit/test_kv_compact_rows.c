/*
 * test_kv_compact_rows.c — kv_seq_compact_rows, the decode-phase shrink of
 * decode-time compression (DESIGN.md §4.9): pages freed = pages no longer
 * filled, a bad shrink changes nothing, decode continues on the shortened
 * rows (a row takes a page exactly when its last page is full again), the
 * pool's accounting stays exact, and the release returns everything.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"

static char err[256];

/* L = 2, two groups (budgets 0.5 and 1), P = 4, C = 16. */
static void layout(struct kv_layout *lo)
{
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    double b[4] = {0.5, 1.0, 1.0, 0.5};
    assert_int_equal(kv_layout_init(lo, 2, 2, 1, 8, 4, 16, &rule, b, err,
                                    sizeof(err)), 0);
}

static int64_t filled_pages(const struct kv_seq *s)
{
    int64_t n = 0;
    for (int r = 0; r < s->n_rows; r++)
        n += kv_pages_for(s->filled[r], s->page_size);
    return n;
}

static void test_compact_releases_unfilled(void **state)
{
    (void)state;
    struct kv_layout lo;
    layout(&lo);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 200, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    struct kv_seq seq;
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 16, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_seq_commit(&seq, &lo, 16, err, sizeof(err)), 0);
    int32_t prompt[4];
    memcpy(prompt, seq.filled, sizeof(prompt));
    /* Not while a prefill is pending. */
    int64_t freed = -1;
    for (int i = 0; i < 37; i++)
        assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 1, err,
                                               sizeof(err)), 0);
    assert_int_equal(seq.used_pages, filled_pages(&seq));
    /* Rows shrink by different amounts (one not at all). */
    int32_t after[4] = {prompt[0] + 10, prompt[1] + 37, prompt[2] + 3,
                        prompt[3] + 12};
    int64_t before = seq.used_pages;
    assert_int_equal(kv_seq_compact_rows(&seq, &lo, &pool, after, &freed, err,
                                         sizeof(err)), 0);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(seq.filled[r], after[r]);
        assert_int_equal(seq.tokens[r], after[r]);
        assert_int_equal(seq.n_pages[r], kv_pages_for(after[r], 4));
    }
    assert_int_equal(freed, before - filled_pages(&seq));
    assert_true(freed > 0);
    assert_int_equal(seq.used_pages, filled_pages(&seq));
    assert_int_equal(kv_pool_n_used(&pool), seq.used_pages);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    assert_int_equal(seq.max_tokens, prompt[1] + 37);
    /* Growing back or shrinking below zero: nothing changes. */
    int32_t grow[4] = {after[0] + 1, after[1], after[2], after[3]};
    assert_int_equal(kv_seq_compact_rows(&seq, &lo, &pool, grow, &freed, err,
                                         sizeof(err)), TG_EINVAL);
    int32_t neg[4] = {after[0], after[1], -1, after[3]};
    assert_int_equal(kv_seq_compact_rows(&seq, &lo, &pool, neg, &freed, err,
                                         sizeof(err)), TG_EINVAL);
    assert_int_equal(seq.filled[0], after[0]);
    assert_int_equal(kv_pool_n_used(&pool), seq.used_pages);
    /* Decode continues: a row takes a page exactly when its last is full. */
    for (int i = 0; i < 9; i++) {
        assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 1, err,
                                               sizeof(err)), 0);
        assert_int_equal(seq.used_pages, filled_pages(&seq));
    }
    /* The longest row shrinks: max_tokens and mono follow. */
    int32_t all[4];
    for (int r = 0; r < 4; r++)
        all[r] = prompt[r];
    assert_int_equal(kv_seq_compact_rows(&seq, &lo, &pool, all, &freed, err,
                                         sizeof(err)), 0);
    int32_t m = 0;
    for (int r = 0; r < 4; r++)
        m = all[r] > m ? all[r] : m;
    assert_int_equal(seq.max_tokens, m);
    assert_int_equal(seq.mono_pages, kv_pages_for(m, 4) * 4);
    assert_int_equal(kv_pool_n_used(&pool), seq.used_pages);
    assert_int_equal(kv_seq_release(&seq, &pool), 0);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    kv_seq_free(&seq, &pool);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

static void test_compact_refused_mid_prefill(void **state)
{
    (void)state;
    struct kv_layout lo;
    layout(&lo);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 200, err, sizeof(err)), 0);
    struct kv_seq seq;
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 32, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_seq_commit(&seq, &lo, 16, err, sizeof(err)), 0);
    int32_t same[4];
    memcpy(same, seq.filled, sizeof(same));
    int64_t freed;
    assert_int_equal(kv_seq_compact_rows(&seq, &lo, &pool, same, &freed, err,
                                         sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_compact_rows(&seq, &lo, &pool, NULL, &freed, err,
                                         sizeof(err)), TG_EINVAL);
    kv_seq_free(&seq, &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compact_releases_unfilled),
        cmocka_unit_test(test_compact_refused_mid_prefill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
