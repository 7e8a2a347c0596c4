/*
 * test_kv_seq_heads.c — per-head lengths of kv_seq (common/kv/kv_seq.h,
 * "per-head lengths"): enabling them, the predicted commit and decode
 * keeping every head in step, kv_seq_commit_heads (rows = longest heads,
 * the unused reservation back at once, a report that does not fit changes
 * nothing), kv_seq_rewind_heads restoring a boundary, the refusals of the
 * row-only calls, and release / free.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"

static char err[256];

/* L = 1, two groups (budgets 0.5 and 1) of H_p = 2 heads, P = 4, C = 16,
 * forced window 2 and one sink. The groups interleave the heads (head 0
 * and 2 in group 0, 1 and 3 in group 1), so the head -> row map matters. */
static void layout(struct kv_layout *lo)
{
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    double b[2] = {0.5, 1.0};
    assert_int_equal(kv_layout_init(lo, 1, 2, 2, 8, 4, 16, &rule, b, err,
                                    sizeof(err)), 0);
    lo->n_kv_heads = 4;
    lo->head_group = malloc(4 * sizeof(int32_t));
    lo->head_slot = malloc(4 * sizeof(int32_t));
    assert_non_null(lo->head_group);
    assert_non_null(lo->head_slot);
    int32_t hg[4] = {0, 1, 0, 1}, hs[4] = {0, 0, 1, 1};
    memcpy(lo->head_group, hg, sizeof hg);
    memcpy(lo->head_slot, hs, sizeof hs);
}

static void test_row_max(void **state)
{
    (void)state;
    struct kv_layout lo;
    layout(&lo);
    int32_t heads[4] = {3, 9, 7, 2}, rows[2];
    kv_heads_row_max(&lo, heads, rows);
    assert_int_equal(rows[0], 7); /* heads 0, 2 */
    assert_int_equal(rows[1], 9); /* heads 1, 3 */
    kv_layout_free(&lo);
}

static void test_commit_heads(void **state)
{
    (void)state;
    struct kv_layout lo;
    layout(&lo);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 64, err, sizeof(err)), 0);
    struct kv_seq seq;
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);
    assert_null(seq.head_len);
    assert_int_equal(kv_seq_heads_enable(&seq, &lo, err, sizeof(err)), 0);
    assert_int_equal(seq.n_heads, 4);
    assert_int_equal(kv_seq_heads_enable(&seq, &lo, err, sizeof(err)), 0);
    /* 32 tokens = two chunks: group 0 keeps 8 + 8, group 1 16 + 16. */
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 32, err,
                                           sizeof(err)), 0);
    assert_int_equal(seq.used_pages, 4 + 8);
    /* First chunk: group 0's heads keep 3 and 1 (row 3), group 1's 5 and
     * 2 (row 5): the reservation of the chunk shrinks to what the longest
     * head kept, as kv_seq_commit_kept would with rows {3, 5}. */
    int32_t after[4] = {3, 5, 1, 2};
    int64_t freed = -1;
    assert_int_equal(kv_seq_commit_heads(&seq, &lo, &pool, 16, after, 4,
                                         &freed, err, sizeof(err)), 0);
    assert_int_equal(seq.filled[0], 3);
    assert_int_equal(seq.filled[1], 5);
    assert_int_equal(seq.tokens[0], 11);
    assert_int_equal(seq.tokens[1], 21);
    assert_int_equal(freed, 3);
    assert_int_equal(seq.used_pages, 9);
    assert_int_equal(kv_pool_n_used(&pool), 9);
    assert_memory_equal(seq.head_len, after, sizeof after);

    /* Reports that do not fit change nothing: a head over its row's keep
     * (group 0 may add 8), a head that shrank, the wrong count, and a
     * commit off a chunk boundary. */
    int32_t over[4] = {3 + 9, 5, 1, 2}, shrank[4] = {3, 4, 1, 2};
    assert_int_equal(kv_seq_heads_fit(&seq, &lo, 16, over, 4, err,
                                      sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "layer 0 head 0"));
    assert_int_equal(kv_seq_commit_heads(&seq, &lo, &pool, 16, over, 4,
                                         &freed, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(kv_seq_commit_heads(&seq, &lo, &pool, 16, shrank, 4,
                                         &freed, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(kv_seq_commit_heads(&seq, &lo, &pool, 16, after, 3,
                                         &freed, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(kv_seq_commit_heads(&seq, &lo, &pool, 5, after, 4,
                                         &freed, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(seq.committed, 16);
    assert_int_equal(seq.used_pages, 9);
    assert_memory_equal(seq.head_len, after, sizeof after);
    /* The row-only calls refuse a seq with heads. */
    int32_t rows[2] = {11, 21};
    assert_int_equal(kv_seq_commit_kept(&seq, &lo, &pool, 16, rows, &freed,
                                        err, sizeof(err)), TG_EINVAL);

    /* A predicted chunk (no report): every head adds its row's keep. */
    assert_int_equal(kv_seq_commit(&seq, &lo, 16, err, sizeof(err)), 0);
    int32_t want[4] = {11, 21, 9, 18};
    assert_memory_equal(seq.head_len, want, sizeof want);
    assert_int_equal(seq.filled[0], 11);
    assert_int_equal(seq.filled[1], 21);
    /* Decode: one more token in every head. */
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 2, err,
                                           sizeof(err)), 0);
    int32_t dec[4] = {13, 23, 11, 20};
    assert_memory_equal(seq.head_len, dec, sizeof dec);

    /* Rewind to the first boundary: heads and rows as they were there. */
    assert_int_equal(kv_seq_rewind(&seq, &lo, &pool, 16, rows, err,
                                   sizeof(err)), TG_EINVAL);
    int32_t brows[2] = {3, 5}, bad_rows[2] = {3, 4};
    assert_int_equal(kv_seq_rewind_heads(&seq, &lo, &pool, 16, bad_rows, after,
                                         err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "longest head"));
    assert_int_equal(kv_seq_rewind_heads(&seq, &lo, &pool, 16, brows, NULL,
                                         err, sizeof(err)), TG_EINVAL);
    assert_memory_equal(seq.head_len, dec, sizeof dec);
    assert_int_equal(kv_seq_rewind_heads(&seq, &lo, &pool, 16, brows, after,
                                         err, sizeof(err)), 0);
    assert_memory_equal(seq.head_len, after, sizeof after);
    assert_int_equal(seq.pos, 16);
    assert_int_equal(seq.used_pages, kv_pages_for(3, 4) + kv_pages_for(5, 4));
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);

    /* Release zeroes the heads (kept for the next request); free frees. */
    assert_int_equal(kv_seq_release(&seq, &pool), 0);
    assert_non_null(seq.head_len);
    for (int h = 0; h < 4; h++)
        assert_int_equal(seq.head_len[h], 0);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_seq_free(&seq, &pool);
    assert_null(seq.head_len);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

/* A layout without head maps cannot keep heads; a seq without heads
 * rewinds through kv_seq_rewind_heads as through kv_seq_rewind. */
static void test_without_heads(void **state)
{
    (void)state;
    struct kv_layout lo;
    layout(&lo);
    struct kv_layout bare;
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    double b[2] = {0.5, 1.0};
    assert_int_equal(kv_layout_init(&bare, 1, 2, 2, 8, 4, 16, &rule, b, err,
                                    sizeof(err)), 0);
    struct kv_seq seq;
    assert_int_equal(kv_seq_init(&seq, &bare, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_heads_enable(&seq, &bare, err, sizeof(err)),
                     TG_EINVAL);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 64, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 16, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_seq_commit(&seq, &lo, 16, err, sizeof(err)), 0);
    int32_t heads[4] = {8, 16, 8, 16};
    int64_t freed;
    assert_int_equal(kv_seq_commit_heads(&seq, &lo, &pool, 1, heads, 4,
                                         &freed, err, sizeof(err)),
                     TG_EINVAL);
    int32_t rows[2] = {8, 16};
    assert_int_equal(kv_seq_rewind_heads(&seq, &lo, &pool, 16, rows, heads,
                                         err, sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_rewind_heads(&seq, &lo, &pool, 16, rows, NULL,
                                         err, sizeof(err)), 0);
    kv_seq_free(&seq, &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    kv_layout_free(&bare);
    kv_layout_free(&lo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_max),
        cmocka_unit_test(test_commit_heads),
        cmocka_unit_test(test_without_heads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
