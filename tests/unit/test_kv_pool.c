/* test_kv_pool.c — the per-rank page pool (kv_pool) and one request's
 * page accounting (kv_seq): worked reservation examples, all-or-nothing
 * failures, decode growth, truncation, release, and a randomized property
 * test with the pool's double-free tracking on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_kv.h"

static char err[256];

/* ---- pool ------------------------------------------------------------ */

static void test_pool_pop_push_order(void **state)
{
    (void)state;
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 10, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    int32_t a[4];
    assert_int_equal(kv_pool_pop(&pool, 4, a), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(a[i], i); /* first pops are 0, 1, 2, ... */
    assert_int_equal(kv_pool_n_used(&pool), 4);
    assert_int_equal(kv_pool_n_free(&pool), 6);
    assert_int_equal(kv_pool_high_water(&pool), 4);

    /* One pop of n equals n pops of one. */
    struct kv_pool p2;
    assert_int_equal(kv_pool_init(&p2, 10, err, sizeof(err)), 0);
    for (int i = 0; i < 4; i++) {
        int32_t id;
        assert_int_equal(kv_pool_pop(&p2, 1, &id), 0);
        assert_int_equal(id, a[i]);
    }
    /* Pushing ids[0..n) at once equals pushing them one by one from the
     * back: the stacks end identical. */
    int32_t back[3] = {2, 0, 3};
    assert_int_equal(kv_pool_push(&pool, 3, back), 0);
    for (int i = 2; i >= 0; i--)
        assert_int_equal(kv_pool_push(&p2, 1, &back[i]), 0);
    assert_int_equal(pool.n_free, p2.n_free);
    assert_memory_equal(pool.stack + (pool.n_total - pool.n_free),
                        p2.stack + (p2.n_total - p2.n_free),
                        (size_t)pool.n_free * sizeof(int32_t));
    /* LIFO: the pushed ids come back first, in push order. */
    int32_t b[3];
    assert_int_equal(kv_pool_pop(&pool, 3, b), 0);
    assert_memory_equal(b, back, sizeof(back));
    assert_int_equal(kv_pool_high_water(&pool), 4);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    kv_pool_free(&pool);
    kv_pool_free(&p2);
}

static void test_pool_enospc_unchanged(void **state)
{
    (void)state;
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 8, err, sizeof(err)), 0);
    int32_t ids[9];
    assert_int_equal(kv_pool_pop(&pool, 5, ids), 0);
    int32_t before[8];
    memcpy(before, pool.stack, sizeof(before));
    int32_t sentinel[9];
    memset(sentinel, 0x5a, sizeof(sentinel));
    memcpy(ids, sentinel, sizeof(ids));
    assert_int_equal(kv_pool_pop(&pool, 4, ids), TG_ENOSPC);
    assert_memory_equal(ids, sentinel, sizeof(ids)); /* out untouched */
    assert_null(kv_pool_pop_view(&pool, 4));
    assert_null(kv_pool_pop_view(&pool, -1));
    assert_int_equal(kv_pool_pop(&pool, -1, ids), TG_EINVAL);
    assert_int_equal(kv_pool_n_free(&pool), 3);
    assert_memory_equal(before, pool.stack, sizeof(before));
    /* Zero pages always succeed. */
    assert_int_equal(kv_pool_pop(&pool, 0, ids), 0);
    assert_non_null(kv_pool_pop_view(&pool, 0));
    assert_int_equal(kv_pool_n_free(&pool), 3);
    /* The view is the popped ids. */
    const int32_t *v = kv_pool_pop_view(&pool, 3);
    assert_non_null(v);
    assert_int_equal(v[0], 5);
    assert_int_equal(v[2], 7);
    assert_int_equal(kv_pool_n_free(&pool), 0);
    assert_int_equal(kv_pool_pop(&pool, 1, ids), TG_ENOSPC);
    kv_pool_free(&pool);
}

static void test_pool_double_free_detected(void **state)
{
    (void)state;
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 100, err, sizeof(err)), 0);
    int32_t ids[10];
    assert_int_equal(kv_pool_pop(&pool, 10, ids), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);

    /* More than are in use: rejected even without tracking. */
    int32_t many[11] = {0};
    assert_int_equal(kv_pool_push(&pool, 11, many), TG_EINVAL);
    assert_int_equal(kv_pool_push(&pool, -1, many), TG_EINVAL);

    int32_t free_id[1] = {50}; /* never taken */
    assert_int_equal(kv_pool_push(&pool, 1, free_id), TG_EINVAL);
    int32_t out_of_range[2] = {3, 100};
    assert_int_equal(kv_pool_push(&pool, 2, out_of_range), TG_EINVAL);
    int32_t neg[1] = {-1};
    assert_int_equal(kv_pool_push(&pool, 1, neg), TG_EINVAL);
    int32_t dup[3] = {1, 2, 1}; /* repeated within one push */
    assert_int_equal(kv_pool_push(&pool, 3, dup), TG_EINVAL);
    /* Rejections changed nothing: the pages are still taken. */
    assert_int_equal(kv_pool_n_used(&pool), 10);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);

    assert_int_equal(kv_pool_push(&pool, 4, ids), 0);
    assert_int_equal(kv_pool_push(&pool, 1, &ids[2]), TG_EINVAL); /* again */
    assert_int_equal(kv_pool_push(&pool, 6, ids + 4), 0);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    kv_pool_free(&pool);
}

static void test_pool_validate_catches_corruption(void **state)
{
    (void)state;
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 16, err, sizeof(err)), 0);
    /* Without tracking, a double free slips through push ... */
    int32_t ids[2];
    assert_int_equal(kv_pool_pop(&pool, 2, ids), 0);
    int32_t twice[2] = {ids[0], ids[0]};
    assert_int_equal(kv_pool_push(&pool, 2, twice), 0);
    /* ... and validate finds it. */
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), TG_EINTERNAL);
    assert_non_null(strstr(err, "free twice"));
    pool.stack[pool.n_total - 1] = 99;
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), TG_EINTERNAL);
    kv_pool_free(&pool);
}

static void test_pool_zeroed_and_edge(void **state)
{
    (void)state;
    struct kv_pool pool;
    memset(&pool, 0, sizeof(pool));
    kv_pool_free(&pool);
    kv_pool_free(&pool);
    assert_int_equal(kv_pool_init(&pool, -1, err, sizeof(err)), TG_EINVAL);
    kv_pool_free(&pool);
    assert_int_equal(kv_pool_init(&pool, 0, err, sizeof(err)), 0);
    int32_t id;
    assert_int_equal(kv_pool_pop(&pool, 1, &id), TG_ENOSPC);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    assert_true(kv_pool_reclaimed_ratio(&pool) == 0.0);
    kv_pool_free(&pool);
}

/* ---- seq: worked example --------------------------------------------- */

/* L = 2, G = 2, P = 16, C = 512, snapkv rule (window 32, 4 sinks).
 * budgets: (0,0) 0.25  (0,1) 0.05  (1,0) 1.0  (1,1) 0.5 */
static void make_layout(struct kv_layout *lo)
{
    const double b[4] = {0.25, 0.05, 1.0, 0.5};
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    assert_int_equal(kv_layout_init(lo, 2, 2, 4, 128, 16, 512, &rule, b, err,
                                    sizeof(err)), 0);
}

static void test_seq_worked_example(void **state)
{
    (void)state;
    struct kv_layout lo;
    make_layout(&lo);
    assert_int_equal(kv_layout_page_elems(&lo), 4 * 2 * 16 * 128);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 1000, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    struct kv_seq seq;
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);

    /* A 1000-token prompt from position 0: chunks of 512 and 488.
     * b = 0.25: chunk 1 keeps max(ceil(128), 32 + 4 sinks) = 128, chunk 2
     *           max(ceil(122), 32) = 122 -> 250 tokens, 16 pages.
     * b = 0.05: max(ceil(25.6), 36) = 36, max(ceil(24.4), 32) = 32
     *           -> 68 tokens, 5 pages.
     * b = 1:    1000 tokens, 63 pages.
     * b = 0.5:  256 + 244 = 500 tokens, 32 pages.                       */
    int64_t need = -1;
    assert_int_equal(kv_seq_prompt_pages(NULL, &lo, 0, 1000, &need, err,
                                         sizeof(err)), 0);
    assert_int_equal(need, 16 + 5 + 63 + 32);
    assert_int_equal(kv_seq_prompt_pages(&seq, &lo, 0, 1000, &need, err,
                                         sizeof(err)), 0);
    assert_int_equal(need, 116);
    assert_int_equal(kv_pool_n_used(&pool), 0); /* pure */

    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 1000, err,
                                           sizeof(err)), 0);
    const int32_t tok[4] = {250, 68, 1000, 500};
    const int32_t pages[4] = {16, 5, 63, 32};
    for (int r = 0; r < 4; r++) {
        assert_int_equal(seq.tokens[r], tok[r]);
        assert_int_equal(seq.n_pages[r], pages[r]);
        assert_int_equal(seq.filled[r], 0);
    }
    assert_int_equal(seq.used_pages, 116);
    assert_int_equal(kv_pool_n_used(&pool), 116);
    /* Row by row in pool order: row (0,0) got ids 0..15, row (0,1) 16..20. */
    int32_t n;
    const int32_t *ids = kv_seq_row_ids(&seq, &lo, 0, 1, &n);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 16);
    assert_int_equal(ids[4], 20);
    /* Monolithic: every row as long as the longest (1000 tokens = 63
     * pages) for all 4 (layer, group) rows. */
    assert_int_equal(seq.mono_pages, 63 * 4);
    assert_int_equal(pool.mono_pages, 63 * 4);
    assert_true(fabs(kv_pool_reclaimed_ratio(&pool) - (1.0 - 116.0 / 252.0)) <
                1e-12);

    /* Decode before the prefill is written is refused. */
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 1, err,
                                           sizeof(err)), TG_EINVAL);
    /* Commit chunk 1, then chunk 2; a commit off the chunk grid fails. */
    assert_int_equal(kv_seq_commit(&seq, &lo, 100, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(kv_seq_commit(&seq, &lo, 512, err, sizeof(err)), 0);
    assert_int_equal(seq.filled[0], 128);
    assert_int_equal(seq.filled[1], 36);
    assert_int_equal(seq.filled[2], 512);
    assert_int_equal(seq.filled[3], 256);
    assert_int_equal(kv_seq_commit(&seq, &lo, 489, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(kv_seq_commit(&seq, &lo, 488, err, sizeof(err)), 0);
    assert_memory_equal(seq.filled, seq.tokens, sizeof(tok));
    assert_int_equal(kv_seq_commit(&seq, &lo, 1, err, sizeof(err)),
                     TG_EINVAL);

    /* Decode: free slots in the last pages are 6, 12, 8, 12. Tokens 1..6
     * take nothing, token 7 takes a page for row (0,0), token 9 one for
     * row (1,0). */
    for (int t = 1; t <= 6; t++) {
        assert_int_equal(kv_seq_decode_pages(&seq, &lo, 1, &need), 0);
        assert_int_equal(need, 0);
        assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 1, err,
                                               sizeof(err)), 0);
    }
    assert_int_equal(kv_pool_n_used(&pool), 116);
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 1, err,
                                           sizeof(err)), 0);
    assert_int_equal(seq.n_pages[0], 17);
    assert_int_equal(kv_pool_n_used(&pool), 117);
    assert_int_equal(kv_seq_decode_pages(&seq, &lo, 2, &need), 0);
    assert_int_equal(need, 1);
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 2, err,
                                           sizeof(err)), 0);
    assert_int_equal(seq.n_pages[2], 64);
    assert_int_equal(seq.tokens[2], 1009);
    assert_int_equal(seq.filled[2], 1009);
    assert_int_equal(seq.pos, 1009);
    assert_int_equal(seq.mono_pages, 64 * 4);

    /* Second turn of 300 tokens at 1009 (history stays, turn appended):
     * one chunk, no sinks, forced 32. b = 0.25 keeps 75: 259 + 75 = 334
     * tokens, 21 pages (had 17). b = 0.05 keeps max(15, 32) = 32: 77 + 32
     * = 109, 7 pages (had 5). b = 1: 1309, 82 pages (had 64). b = 0.5:
     * 150: 509 + 150 = 659, 42 pages (had 32). */
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 1000, 300, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_prompt_pages(&seq, &lo, 1009, 300, &need, err,
                                         sizeof(err)), 0);
    assert_int_equal(need, 4 + 2 + 18 + 10);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 1009, 300, err,
                                           sizeof(err)), 0);
    const int32_t tok2[4] = {334, 109, 1309, 659};
    assert_memory_equal(seq.tokens, tok2, sizeof(tok2));
    assert_int_equal(seq.used_pages, 118 + 34);
    assert_int_equal(kv_pool_n_used(&pool), 152);
    /* A new turn before this one is committed is refused. */
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 1309, 10, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_commit(&seq, &lo, 300, err, sizeof(err)), 0);
    assert_memory_equal(seq.filled, seq.tokens, sizeof(tok2));

    kv_seq_free(&seq, &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    assert_int_equal(pool.mono_pages, 0);
    assert_int_equal(kv_pool_high_water(&pool), 152);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

static void test_seq_enospc_unchanged(void **state)
{
    (void)state;
    struct kv_layout lo;
    make_layout(&lo);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 120, err, sizeof(err)), 0);
    struct kv_seq seq;
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 1000, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_seq_commit(&seq, &lo, 1000, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_n_free(&pool), 4);

    struct kv_seq other;
    assert_int_equal(kv_seq_init(&other, &lo, err, sizeof(err)), 0);
    int32_t stack[120];
    memcpy(stack, pool.stack, sizeof(stack));
    int64_t mono = pool.mono_pages;
    /* 116 pages needed, 4 free. */
    assert_int_equal(kv_seq_reserve_prompt(&other, &lo, &pool, 0, 1000, err,
                                           sizeof(err)), TG_ENOSPC);
    assert_int_equal(tt_kv_seq_reserve_prompt_plain(&other, &lo, &pool, 0, 1000,
                                                    err, sizeof(err)),
                     TG_ENOSPC);
    assert_int_equal(other.used_pages, 0);
    assert_int_equal(other.tokens[2], 0);
    assert_int_equal(other.pos, 0);
    /* Decode of 40 tokens needs 3 + 2 + 2 + 2 = 9 pages, 4 free. */
    int32_t tokens[4];
    memcpy(tokens, seq.tokens, sizeof(tokens));
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 40, err,
                                           sizeof(err)), TG_ENOSPC);
    assert_int_equal(
        tt_kv_seq_reserve_decode_plain(&seq, &lo, &pool, 40, err, sizeof(err)),
        TG_ENOSPC);
    assert_memory_equal(tokens, seq.tokens, sizeof(tokens));
    assert_int_equal(seq.used_pages, 116);
    assert_int_equal(pool.n_free, 4);
    assert_int_equal(pool.mono_pages, mono);
    assert_memory_equal(stack, pool.stack, sizeof(stack));
    /* What does fit still works, down to an empty pool. */
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 10, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_pool_n_free(&pool), 2);

    kv_seq_free(&other, &pool);
    kv_seq_free(&seq, &pool);
    assert_int_equal(kv_pool_n_free(&pool), 120);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

static void test_seq_truncate_row(void **state)
{
    (void)state;
    struct kv_layout lo;
    make_layout(&lo);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 200, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    struct kv_seq seq;
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 1000, err,
                                           sizeof(err)), 0);
    /* Not while the prefill is pending. */
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 1, 0, 630, err,
                                         sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_commit(&seq, &lo, 1000, err, sizeof(err)), 0);
    int32_t n;
    const int32_t *ids = kv_seq_row_ids(&seq, &lo, 1, 0, &n);
    assert_int_equal(n, 63);
    int32_t tail0 = ids[40];
    /* GVote kept 630 of the 1000 reserved tokens of row (1,0): pages 40..62
     * go back; they are the next ids the pool hands out. */
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 1, 0, 630, err,
                                         sizeof(err)), 0);
    assert_int_equal(seq.n_pages[2], 40);
    assert_int_equal(seq.tokens[2], 630);
    assert_int_equal(seq.used_pages, 116 - 23);
    assert_int_equal(kv_pool_n_used(&pool), 93);
    int32_t id;
    assert_int_equal(kv_pool_pop(&pool, 1, &id), 0);
    assert_int_equal(id, tail0);
    assert_int_equal(kv_pool_push(&pool, 1, &id), 0);
    /* The longest row is now (1,1) with 500 tokens = 32 pages. */
    assert_int_equal(seq.max_tokens, 630);
    assert_int_equal(seq.mono_pages, 40 * 4);
    assert_int_equal(pool.mono_pages, 40 * 4);
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 1, 0, 100, err,
                                         sizeof(err)), 0);
    assert_int_equal(seq.max_tokens, 500);
    assert_int_equal(seq.mono_pages, 32 * 4);
    /* Same page count: nothing released, tokens shrink. */
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 0, 0, 241, err,
                                         sizeof(err)), 0);
    assert_int_equal(seq.n_pages[0], 16);
    /* Bad rows and growing are refused. */
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 2, 0, 0, err,
                                         sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 0, -1, 0, err,
                                         sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 0, 1, 69, err,
                                         sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 0, 1, -1, err,
                                         sizeof(err)), TG_EINVAL);
    /* Truncating to zero empties the row; filled is clipped. */
    assert_int_equal(seq.filled[1], 68);
    assert_int_equal(seq.filled[0], 241);
    assert_int_equal(kv_seq_truncate_row(&seq, &lo, &pool, 0, 1, 0, err,
                                         sizeof(err)), 0);
    assert_int_equal(seq.n_pages[1], 0);
    assert_int_equal(seq.filled[1], 0);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_release(&seq, &pool), 0);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    assert_int_equal(pool.mono_pages, 0);
    /* A released seq is reusable from position 0. */
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 16, err,
                                           sizeof(err)), 0);
    assert_int_equal(seq.used_pages, 4);
    kv_seq_free(&seq, &pool);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

static void test_layout_and_seq_invalid(void **state)
{
    (void)state;
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    struct kv_layout lo;
    double b[4] = {0.5, 0.5, 0.5, 0.5};
    assert_int_equal(kv_layout_init(&lo, 0, 2, 1, 8, 16, 512, &rule, b, err,
                                    sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_layout_init(&lo, 2, 2, 1, 8, 0, 512, &rule, b, err,
                                    sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_layout_init(&lo, 2, 2, 1, 8, 16, 0, &rule, b, err,
                                    sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_layout_init(&lo, 2, 2, 1, 8, 16, 512, NULL, b, err,
                                    sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_layout_init(&lo, 2, 2, 1, 8, 16, 512, &rule, NULL,
                                    err, sizeof(err)), TG_EINVAL);
    b[3] = 0.0;
    assert_int_equal(kv_layout_init(&lo, 2, 2, 1, 8, 16, 512, &rule, b, err,
                                    sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "layer 1 group 1"));
    b[3] = 1.5;
    assert_int_equal(kv_layout_init(&lo, 2, 2, 1, 8, 16, 512, &rule, b, err,
                                    sizeof(err)), TG_EINVAL);
    b[3] = NAN;
    assert_int_equal(kv_layout_init(&lo, 2, 2, 1, 8, 16, 512, &rule, b, err,
                                    sizeof(err)), TG_EINVAL);
    kv_layout_free(&lo); /* zeroed after failure */

    /* Zeroed objects free safely, with or without a pool. */
    struct kv_seq seq;
    memset(&seq, 0, sizeof(seq));
    kv_seq_free(&seq, NULL);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 64, err, sizeof(err)), 0);
    kv_seq_free(&seq, &pool);
    assert_int_equal(kv_seq_release(&seq, &pool), 0);
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), TG_EINVAL);

    /* A seq used with another layout, and bad turns. */
    b[3] = 0.5;
    assert_int_equal(kv_layout_init(&lo, 2, 2, 1, 8, 16, 512, &rule, b, err,
                                    sizeof(err)), 0);
    struct kv_layout lo2;
    assert_int_equal(kv_layout_init(&lo2, 1, 2, 1, 8, 16, 512, &rule, b, err,
                                    sizeof(err)), 0);
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);
    int64_t need;
    assert_int_equal(kv_seq_prompt_pages(&seq, &lo2, 0, 10, &need, err,
                                         sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo2, &pool, 0, 10, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, -1, 10, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, -10, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 0, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_decode_pages(&seq, &lo2, 1, &need), TG_EINVAL);
    /* An empty turn is fine and takes nothing; so is decode on it. */
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 0, err,
                                           sizeof(err)), 0);
    assert_int_equal(seq.used_pages, 0);
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 1, err,
                                           sizeof(err)), 0);
    assert_int_equal(seq.used_pages, 4);
    /* Pages held but no pool: release refuses instead of leaking. */
    assert_int_equal(kv_seq_release(&seq, NULL), TG_EINVAL);
    assert_int_equal(seq.used_pages, 4);
    kv_seq_free(&seq, &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
    kv_layout_free(&lo2);
}

/* ---- seq: randomized properties -------------------------------------- */

static uint64_t rng_state;

static uint64_t rng(void)
{
    /* xorshift64* (Vigna, "An experimental exploration of Marsaglia's
     * xorshift generators", 2016). */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static int64_t rnd(int64_t lo, int64_t hi) /* [lo, hi] */
{
    return lo + (int64_t)(rng() % (uint64_t)(hi - lo + 1));
}

#define NSEQ 5

/* Two pools and two sets of seqs driven in lockstep, one with the
 * vectorized calls and one with the plain per-page calls; after every
 * operation the states must be identical and consistent. */
static void check_consistent(const struct kv_layout *lo, struct kv_pool *pool,
                             struct kv_seq *seqs, const int64_t (*expect)[64])
{
    int64_t used = 0, mono = 0;
    int32_t rows = lo->n_layers * lo->n_groups;
    for (int s = 0; s < NSEQ; s++) {
        int64_t sum = 0;
        int32_t mx = 0;
        for (int32_t r = 0; r < rows; r++) {
            assert_int_equal(seqs[s].tokens[r], expect[s][r]);
            assert_int_equal(seqs[s].n_pages[r],
                             kv_pages_for(seqs[s].tokens[r], lo->page_size));
            assert_true(seqs[s].filled[r] <= seqs[s].tokens[r]);
            assert_true(seqs[s].n_pages[r] <= seqs[s].cap[r]);
            sum += seqs[s].n_pages[r];
            mx = seqs[s].tokens[r] > mx ? seqs[s].tokens[r] : mx;
        }
        assert_int_equal(seqs[s].used_pages, sum);
        assert_int_equal(seqs[s].max_tokens, mx);
        assert_int_equal(seqs[s].mono_pages,
                         kv_pages_for(mx, lo->page_size) * rows);
        used += sum;
        mono += seqs[s].mono_pages;
    }
    assert_int_equal(kv_pool_n_used(pool), used);
    assert_int_equal(pool->mono_pages, mono);
    assert_int_equal(kv_pool_validate(pool, err, sizeof(err)), 0);
}

static void same_state(const struct kv_seq *a, const struct kv_seq *b,
                       const struct kv_pool *pa, const struct kv_pool *pb)
{
    assert_int_equal(pa->n_free, pb->n_free);
    assert_memory_equal(pa->stack, pb->stack,
                        (size_t)pa->n_total * sizeof(int32_t));
    for (int s = 0; s < NSEQ; s++) {
        assert_int_equal(a[s].n_rows, b[s].n_rows);
        for (int32_t r = 0; r < a[s].n_rows; r++) {
            assert_int_equal(a[s].n_pages[r], b[s].n_pages[r]);
            assert_int_equal(a[s].filled[r], b[s].filled[r]);
            assert_memory_equal(a[s].ids + a[s].off[r], b[s].ids + b[s].off[r],
                                (size_t)a[s].n_pages[r] * sizeof(int32_t));
        }
    }
}

static void test_seq_random_properties(void **state)
{
    (void)state;
    rng_state = 0x9e3779b97f4a7c15ull;
    for (int iter = 0; iter < 40; iter++) {
        int L = (int)rnd(1, 4), G = (int)rnd(1, 4);
        int P = (int)(const int[]){1, 3, 16, 16, 32}[rnd(0, 4)];
        int C = (int)rnd(1, 600);
        struct kv_forced_rule rule = {(int)rnd(0, 40), (int)rnd(0, 6)};
        double b[16];
        for (int r = 0; r < L * G; r++)
            b[r] = rnd(0, 4) == 0 ? 1.0 : (double)rnd(1, 1000) / 1000.0;
        struct kv_layout lo;
        assert_int_equal(kv_layout_init(&lo, L, G, 2, 8, P, C, &rule, b, err,
                                        sizeof(err)), 0);
        int32_t total = (int32_t)rnd(50, 20000);
        struct kv_pool pv, pp;
        assert_int_equal(kv_pool_init(&pv, total, err, sizeof(err)), 0);
        assert_int_equal(kv_pool_init(&pp, total, err, sizeof(err)), 0);
        assert_int_equal(kv_pool_debug_track(&pv, err, sizeof(err)), 0);
        assert_int_equal(kv_pool_debug_track(&pp, err, sizeof(err)), 0);
        struct kv_seq sv[NSEQ], sp[NSEQ];
        int64_t expect[NSEQ][64];
        memset(expect, 0, sizeof(expect));
        for (int s = 0; s < NSEQ; s++) {
            assert_int_equal(kv_seq_init(&sv[s], &lo, err, sizeof(err)), 0);
            assert_int_equal(kv_seq_init(&sp[s], &lo, err, sizeof(err)), 0);
        }
        for (int op = 0; op < 60; op++) {
            int s = (int)rnd(0, NSEQ - 1);
            struct kv_seq *a = &sv[s], *c = &sp[s];
            int kind = (int)rnd(0, 9);
            int32_t free_before = pv.n_free;
            if (a->committed < a->turn_len) {
                /* Finish the turn's prefill chunk by chunk or at once. */
                int64_t left = a->turn_len - a->committed;
                int64_t n = rnd(0, 1) ? left : (C < left ? C : left);
                assert_int_equal(kv_seq_commit(a, &lo, n, err, sizeof(err)), 0);
                assert_int_equal(kv_seq_commit(c, &lo, n, err, sizeof(err)), 0);
                if (a->committed == a->turn_len)
                    for (int r = 0; r < L * G; r++)
                        assert_int_equal(a->filled[r], a->tokens[r]);
            } else if (kind <= 3) {
                int64_t start = a->pos + rnd(0, 3);
                int64_t n_new = rnd(0, 3000);
                int64_t need;
                assert_int_equal(kv_seq_prompt_pages(a, &lo, start, n_new,
                                                     &need, err, sizeof(err)),
                                 0);
                int rc = kv_seq_reserve_prompt(a, &lo, &pv, start, n_new, err,
                                               sizeof(err));
                int rc2 = tt_kv_seq_reserve_prompt_plain(
                    c, &lo, &pp, start, n_new, err, sizeof(err));
                assert_int_equal(rc, rc2);
                if (rc == 0) {
                    assert_int_equal(free_before - pv.n_free, need);
                    for (int r = 0; r < L * G; r++)
                        expect[s][r] += kv_turn_keep(start, n_new, C, b[r],
                                                     &rule);
                } else {
                    assert_int_equal(rc, TG_ENOSPC);
                    assert_true(need > free_before);
                    assert_int_equal(pv.n_free, free_before);
                }
            } else if (kind <= 6) {
                int64_t n = rnd(0, 3) == 0 ? rnd(2, 40) : 1;
                int64_t need;
                assert_int_equal(kv_seq_decode_pages(a, &lo, n, &need), 0);
                /* With one token, exactly the rows whose last page is full
                 * (or that have no page) take one. */
                if (n == 1) {
                    int64_t full = 0;
                    for (int r = 0; r < L * G; r++)
                        full += a->tokens[r] % P == 0;
                    assert_int_equal(need, full);
                }
                int rc = kv_seq_reserve_decode(a, &lo, &pv, n, err,
                                               sizeof(err));
                int rc2 = tt_kv_seq_reserve_decode_plain(c, &lo, &pp, n, err,
                                                         sizeof(err));
                assert_int_equal(rc, rc2);
                if (rc == 0) {
                    assert_int_equal(free_before - pv.n_free, need);
                    for (int r = 0; r < L * G; r++)
                        expect[s][r] += n;
                } else {
                    assert_int_equal(rc, TG_ENOSPC);
                    assert_int_equal(pv.n_free, free_before);
                }
            } else if (kind <= 8) {
                int l = (int)rnd(0, L - 1), g = (int)rnd(0, G - 1);
                int r = l * G + g;
                int64_t t = rnd(0, expect[s][r]);
                assert_int_equal(kv_seq_truncate_row(a, &lo, &pv, l, g, t, err,
                                                     sizeof(err)), 0);
                assert_int_equal(kv_seq_truncate_row(c, &lo, &pp, l, g, t, err,
                                                     sizeof(err)), 0);
                assert_int_equal(pv.n_free - free_before,
                                 kv_pages_for(expect[s][r], P) -
                                     kv_pages_for(t, P));
                expect[s][r] = t;
            } else {
                int64_t held = a->used_pages;
                assert_int_equal(kv_seq_release(a, &pv), 0);
                assert_int_equal(kv_seq_release(c, &pp), 0);
                assert_int_equal(pv.n_free - free_before, held);
                memset(expect[s], 0, sizeof(expect[s]));
            }
            check_consistent(&lo, &pv, sv, (const int64_t(*)[64])expect);
            same_state(sv, sp, &pv, &pp);
        }
        /* Pages freed = pages taken: the pools end full. */
        for (int s = 0; s < NSEQ; s++) {
            kv_seq_free(&sv[s], &pv);
            kv_seq_free(&sp[s], &pp);
        }
        assert_int_equal(kv_pool_n_free(&pv), total);
        assert_int_equal(kv_pool_n_free(&pp), total);
        assert_int_equal(pv.mono_pages, 0);
        assert_int_equal(kv_pool_validate(&pv, err, sizeof(err)), 0);
        kv_pool_free(&pv);
        kv_pool_free(&pp);
        kv_layout_free(&lo);
    }
}

/* The closed-form turn count inside kv_seq must equal kv_turn_keep for
 * every position, length, chunk, budget and rule; checked through the
 * reservation of a fresh one-row seq. */
static void test_turn_keep_matches_budget_math(void **state)
{
    (void)state;
    rng_state = 12345;
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 1 << 20, err, sizeof(err)), 0);
    for (int iter = 0; iter < 3000; iter++) {
        struct kv_forced_rule rule = {(int)rnd(0, 64), (int)rnd(0, 9)};
        double b = rnd(0, 5) == 0 ? 1.0 : (double)rnd(1, 100000) / 100000.0;
        int C = (int)rnd(1, 700);
        struct kv_layout lo;
        assert_int_equal(kv_layout_init(&lo, 1, 1, 1, 1, 1, C, &rule, &b, err,
                                        sizeof(err)), 0);
        struct kv_seq seq;
        assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);
        int64_t start = rnd(0, 2) == 0 ? rnd(0, 10) : rnd(0, 100000);
        int64_t n = rnd(0, 5000);
        assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, start, n, err,
                                               sizeof(err)), 0);
        int64_t want = kv_turn_keep(start, n, C, b, &rule);
        assert_int_equal(seq.tokens[0], want);
        /* Reservation holds at least what compression keeps (P = 1 here:
         * exactly). */
        assert_int_equal(seq.n_pages[0], want);
        kv_seq_free(&seq, &pool);
        kv_layout_free(&lo);
    }
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_pop_push_order),
        cmocka_unit_test(test_pool_enospc_unchanged),
        cmocka_unit_test(test_pool_double_free_detected),
        cmocka_unit_test(test_pool_validate_catches_corruption),
        cmocka_unit_test(test_pool_zeroed_and_edge),
        cmocka_unit_test(test_seq_worked_example),
        cmocka_unit_test(test_seq_enospc_unchanged),
        cmocka_unit_test(test_seq_truncate_row),
        cmocka_unit_test(test_layout_and_seq_invalid),
        cmocka_unit_test(test_seq_random_properties),
        cmocka_unit_test(test_turn_keep_matches_budget_math),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
