/* test_kv_fork.c — shared pages: reference counts in the page pool
 * (kv_pool_ref, pushes of shared pages, counters, double-free tracking)
 * and kv_seq_fork (full pages shared, partial last pages private, release
 * in either order, decode and a next turn never touching a shared page,
 * all-or-nothing failures). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"

static char err[256];

static void check_pool(const struct kv_pool *pool)
{
    int rc = kv_pool_validate(pool, err, sizeof(err));
    if (rc != 0)
        fail_msg("pool invalid: %s", err);
}

/* ---- pool ------------------------------------------------------------ */

static void test_pool_ref_counts(void **state)
{
    (void)state;
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 8, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    int32_t a[4];
    assert_int_equal(kv_pool_pop(&pool, 4, a), 0); /* 0 1 2 3 */
    assert_int_equal(kv_pool_owners(&pool, 2), 1);
    assert_int_equal(kv_pool_owners(&pool, 5), 0); /* free (tracking on) */

    /* Two more owners of pages 1 and 2, one more of page 3. */
    int32_t shared[2] = {1, 2};
    assert_int_equal(kv_pool_ref(&pool, 2, shared), 0);
    assert_int_equal(kv_pool_ref(&pool, 2, shared), 0);
    assert_int_equal(kv_pool_ref(&pool, 1, &a[3]), 0);
    assert_int_equal(kv_pool_owners(&pool, 1), 3);
    assert_int_equal(kv_pool_owners(&pool, 3), 2);
    assert_int_equal(kv_pool_n_shared(&pool), 3);
    /* Counters count distinct pages. */
    assert_int_equal(kv_pool_n_used(&pool), 4);
    assert_int_equal(kv_pool_n_free(&pool), 4);
    assert_int_equal(kv_pool_high_water(&pool), 4);
    check_pool(&pool);

    /* The first owner gives all four back: only page 0 is free again. */
    assert_int_equal(kv_pool_push(&pool, 4, a), 0);
    assert_int_equal(kv_pool_n_used(&pool), 3);
    assert_int_equal(kv_pool_owners(&pool, 0), 0);
    assert_int_equal(kv_pool_owners(&pool, 1), 2);
    assert_int_equal(kv_pool_owners(&pool, 3), 1);
    assert_int_equal(kv_pool_n_shared(&pool), 2);
    check_pool(&pool);
    /* The free stack got only page 0, on top. */
    int32_t top;
    assert_int_equal(kv_pool_pop(&pool, 1, &top), 0);
    assert_int_equal(top, 0);
    assert_int_equal(kv_pool_push(&pool, 1, &top), 0);

    /* Second owner of 1, 2, 3: page 3 goes; the stack order equals a
     * plain push of just the freed ids. */
    int32_t b[3] = {1, 3, 2};
    assert_int_equal(kv_pool_push(&pool, 3, b), 0);
    assert_int_equal(kv_pool_n_used(&pool), 2);
    assert_int_equal(kv_pool_n_shared(&pool), 0);
    assert_int_equal(pool.stack[pool.n_total - pool.n_free], 3);
    check_pool(&pool);
    /* No page is shared any more: the single-copy path again, and the
     * last owner of 1 and 2 frees them. */
    assert_int_equal(kv_pool_push(&pool, 2, shared), 0);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    /* One more push of a page just freed is a double free. */
    assert_int_equal(kv_pool_push(&pool, 1, &shared[0]), TG_EINVAL);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    check_pool(&pool);
    kv_pool_free(&pool);
}

static void test_pool_ref_errors(void **state)
{
    (void)state;
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 6, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    int32_t a[3];
    assert_int_equal(kv_pool_pop(&pool, 3, a), 0);
    /* A free page, an id out of range, a negative count: refused, and
     * nothing changes (the good ids before them gain nothing). */
    int32_t bad1[2] = {0, 4};
    int32_t bad2[2] = {1, 6};
    assert_int_equal(kv_pool_ref(&pool, 2, bad1), TG_EINVAL);
    assert_int_equal(kv_pool_ref(&pool, 2, bad2), TG_EINVAL);
    assert_int_equal(kv_pool_ref(&pool, -1, a), TG_EINVAL);
    assert_int_equal(kv_pool_owners(&pool, 0), 1);
    assert_int_equal(kv_pool_owners(&pool, 1), 1);
    assert_int_equal(kv_pool_n_shared(&pool), 0);
    assert_int_equal(kv_pool_ref(&pool, 0, NULL), 0);

    /* Sharing on: a push with a repeated id or a free id is refused as a
     * whole, references included. */
    assert_int_equal(kv_pool_ref(&pool, 1, &a[0]), 0); /* page 0: 2 */
    int32_t rep[3] = {0, 1, 1};
    assert_int_equal(kv_pool_push(&pool, 3, rep), TG_EINVAL);
    int32_t with_free[2] = {0, 5};
    assert_int_equal(kv_pool_push(&pool, 2, with_free), TG_EINVAL);
    assert_int_equal(kv_pool_owners(&pool, 0), 2);
    assert_int_equal(kv_pool_owners(&pool, 1), 1);
    check_pool(&pool);
    assert_int_equal(kv_pool_push(&pool, 3, a), 0);
    assert_int_equal(kv_pool_push(&pool, 1, &a[0]), 0);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    /* A page shared twice and pushed three times: the third is a double
     * free. */
    int32_t p;
    assert_int_equal(kv_pool_pop(&pool, 1, &p), 0);
    assert_int_equal(kv_pool_ref(&pool, 1, &p), 0);
    assert_int_equal(kv_pool_push(&pool, 1, &p), 0);
    assert_int_equal(kv_pool_push(&pool, 1, &p), 0);
    assert_int_equal(kv_pool_push(&pool, 1, &p), TG_EINVAL);
    check_pool(&pool);

    /* validate catches references held by a free page. */
    pool.refs[p] = 1;
    pool.n_shared = 1;
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), TG_EINTERNAL);
    pool.refs[p] = 0;
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), TG_EINTERNAL);
    pool.n_shared = 0;
    check_pool(&pool);
    kv_pool_free(&pool);
    kv_pool_free(&pool); /* safe twice */
}

/* Without tracking, sharing still keeps the counters exact over many
 * random owners. */
static void test_pool_ref_random(void **state)
{
    (void)state;
    enum { N = 64, OWN = 8 };
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, N, err, sizeof(err)), 0);
    int32_t owners[N] = {0};
    int32_t held[OWN][N];
    int32_t n_held[OWN] = {0};
    srand(7);
    for (int it = 0; it < 4000; it++) {
        int o = rand() % OWN;
        int op = rand() % 3;
        if (op == 0 && kv_pool_n_free(&pool) > 0) {
            int32_t id;
            assert_int_equal(kv_pool_pop(&pool, 1, &id), 0);
            assert_int_equal(owners[id], 0);
            owners[id] = 1;
            held[o][n_held[o]++] = id;
        } else if (op == 1) {
            /* o takes a share of a page some other owner holds that o
             * does not. */
            int from = rand() % OWN;
            if (n_held[from] == 0)
                continue;
            int32_t id = held[from][rand() % n_held[from]];
            int has = 0;
            for (int k = 0; k < n_held[o]; k++)
                has |= held[o][k] == id;
            if (has)
                continue;
            assert_int_equal(kv_pool_ref(&pool, 1, &id), 0);
            owners[id]++;
            held[o][n_held[o]++] = id;
        } else if (n_held[o] > 0) {
            assert_int_equal(kv_pool_push(&pool, n_held[o], held[o]), 0);
            for (int k = 0; k < n_held[o]; k++)
                owners[held[o][k]]--;
            n_held[o] = 0;
        }
        int32_t used = 0, shared = 0;
        for (int id = 0; id < N; id++) {
            used += owners[id] > 0;
            shared += owners[id] > 1;
        }
        assert_int_equal(kv_pool_n_used(&pool), used);
        assert_int_equal(kv_pool_n_shared(&pool), shared);
    }
    check_pool(&pool);
    kv_pool_free(&pool);
}

/* ---- fork ------------------------------------------------------------ */

/* L = 2, G = 2: budgets 0.25, 0.05, 1, 0.5 (test_kv_pool's example). */
static void make_layout(struct kv_layout *lo)
{
    double b[4] = {0.25, 0.05, 1.0, 0.5};
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    assert_int_equal(kv_layout_init(lo, 2, 2, 4, 128, 16, 512, &rule, b, err,
                                    sizeof(err)),
                     0);
}

struct fork_env {
    struct kv_layout lo;
    struct kv_pool pool;
    struct kv_seq src, dst;
};

/* src holds a committed 1000-token prompt: rows of 250, 68, 1000 and 500
 * tokens, 16 + 5 + 63 + 32 = 116 pages, every last page partial. */
static void env_init(struct fork_env *e, int32_t pages)
{
    make_layout(&e->lo);
    assert_int_equal(kv_pool_init(&e->pool, pages, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&e->pool, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_init(&e->src, &e->lo, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_init(&e->dst, &e->lo, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&e->src, &e->lo, &e->pool, 0, 1000,
                                           err, sizeof(err)),
                     0);
}

static void env_free(struct fork_env *e)
{
    kv_seq_free(&e->src, &e->pool);
    kv_seq_free(&e->dst, &e->pool);
    assert_int_equal(kv_pool_n_used(&e->pool), 0);
    check_pool(&e->pool);
    kv_pool_free(&e->pool);
    kv_layout_free(&e->lo);
}

static int row_has(const struct kv_seq *q, int32_t r, int32_t id)
{
    for (int32_t k = 0; k < q->n_pages[r]; k++)
        if (q->ids[q->off[r] + k] == id)
            return 1;
    return 0;
}

static void test_fork_shares_full_pages(void **state)
{
    (void)state;
    struct fork_env e;
    env_init(&e, 1000);
    const int32_t tok[4] = {250, 68, 1000, 500};
    assert_int_equal(kv_seq_fork_pages(&e.src), 4);
    int64_t priv = -1;
    /* Forked before the turn runs (the router's order), committed later. */
    assert_int_equal(kv_seq_fork(&e.dst, &e.src, &e.lo, &e.pool, &priv, err,
                                 sizeof(err)),
                     0);
    assert_int_equal(priv, 4);
    assert_int_equal(kv_pool_n_used(&e.pool), 116 + 4);
    assert_int_equal(kv_pool_n_shared(&e.pool), 116 - 4);
    for (int32_t r = 0; r < 4; r++) {
        int32_t n = e.src.n_pages[r];
        assert_int_equal(e.dst.n_pages[r], n);
        assert_int_equal(e.dst.tokens[r], tok[r]);
        assert_int_equal(e.dst.filled[r], tok[r]);
        /* Full pages: the same ids, two owners; the last page private. */
        assert_memory_equal(e.dst.ids + e.dst.off[r], e.src.ids + e.src.off[r],
                            (size_t)(n - 1) * sizeof(int32_t));
        for (int32_t k = 0; k < n - 1; k++)
            assert_int_equal(kv_pool_owners(&e.pool, e.src.ids[e.src.off[r] + k]),
                             2);
        int32_t mine = e.dst.ids[e.dst.off[r] + n - 1];
        int32_t theirs = e.src.ids[e.src.off[r] + n - 1];
        assert_int_not_equal(mine, theirs);
        assert_int_equal(kv_pool_owners(&e.pool, mine), 1);
        assert_int_equal(kv_pool_owners(&e.pool, theirs), 1);
        assert_false(row_has(&e.src, r, mine));
    }
    assert_int_equal(e.dst.pos, 1000);
    assert_int_equal(e.dst.committed, e.dst.turn_len);
    assert_int_equal(e.dst.used_pages, 116);
    check_pool(&e.pool);

    /* Both decode: every append lands in a private page (the private
     * last page until it fills, then pages taken for one owner). */
    assert_int_equal(kv_seq_commit(&e.src, &e.lo, 1000, err, sizeof(err)), 0);
    for (int t = 0; t < 40; t++) {
        assert_int_equal(kv_seq_reserve_decode(&e.src, &e.lo, &e.pool, 1, err,
                                               sizeof(err)),
                         0);
        assert_int_equal(kv_seq_reserve_decode(&e.dst, &e.lo, &e.pool, 1, err,
                                               sizeof(err)),
                         0);
        for (int32_t r = 0; r < 4; r++) {
            /* The page that receives token `filled - 1`. */
            int32_t at = (e.dst.filled[r] - 1) / 16;
            assert_int_equal(
                kv_pool_owners(&e.pool, e.dst.ids[e.dst.off[r] + at]), 1);
            at = (e.src.filled[r] - 1) / 16;
            assert_int_equal(
                kv_pool_owners(&e.pool, e.src.ids[e.src.off[r] + at]), 1);
        }
    }
    check_pool(&e.pool);
    /* The fork released first: its shares and private pages go, src
     * keeps every page it had (one owner again). */
    int64_t src_pages = e.src.used_pages;
    assert_int_equal(kv_seq_release(&e.dst, &e.pool), 0);
    assert_int_equal(kv_pool_n_used(&e.pool), src_pages);
    assert_int_equal(kv_pool_n_shared(&e.pool), 0);
    check_pool(&e.pool);
    env_free(&e);
}

static void test_fork_release_source_first(void **state)
{
    (void)state;
    struct fork_env e;
    env_init(&e, 1000);
    assert_int_equal(kv_seq_commit(&e.src, &e.lo, 1000, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_fork(&e.dst, &e.src, &e.lo, &e.pool, NULL, err,
                                 sizeof(err)),
                     0);
    /* The source goes first: its private last pages are freed, the shared
     * pages stay with the fork alone. */
    assert_int_equal(kv_seq_release(&e.src, &e.pool), 0);
    assert_int_equal(kv_pool_n_used(&e.pool), 116);
    assert_int_equal(kv_pool_n_shared(&e.pool), 0);
    for (int32_t r = 0; r < 4; r++)
        for (int32_t k = 0; k < e.dst.n_pages[r]; k++)
            assert_int_equal(
                kv_pool_owners(&e.pool, e.dst.ids[e.dst.off[r] + k]), 1);
    check_pool(&e.pool);
    /* The fork takes a next turn (multi-turn reuse of a kept choice):
     * it appends past what it holds, nothing shared left to touch. */
    assert_int_equal(kv_seq_reserve_prompt(&e.dst, &e.lo, &e.pool, 1000, 100,
                                           err, sizeof(err)),
                     0);
    assert_int_equal(kv_seq_commit(&e.dst, &e.lo, 100, err, sizeof(err)), 0);
    check_pool(&e.pool);
    env_free(&e);
}

/* The multi-turn store keeps the source's conversation (rewound to the
 * prompt) while a fork still decodes: the kept pages stay shared, the
 * store's next turn writes only into its own last page or new pages, and
 * releasing both in either order returns everything. */
static void test_fork_store_keeps_source(void **state)
{
    (void)state;
    struct fork_env e;
    env_init(&e, 1000);
    assert_int_equal(kv_seq_commit(&e.src, &e.lo, 1000, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_fork(&e.dst, &e.src, &e.lo, &e.pool, NULL, err,
                                 sizeof(err)),
                     0);
    int32_t row_tokens[4];
    memcpy(row_tokens, e.src.tokens, sizeof(row_tokens));
    for (int t = 0; t < 20; t++)
        assert_int_equal(kv_seq_reserve_decode(&e.src, &e.lo, &e.pool, 1, err,
                                               sizeof(err)),
                         0);
    /* Rewind to the turn boundary (the answer is not kept). */
    assert_int_equal(kv_seq_rewind(&e.src, &e.lo, &e.pool, 1000, row_tokens,
                                   err, sizeof(err)),
                     0);
    check_pool(&e.pool);
    /* Every row's last page is the source's own private page. */
    for (int32_t r = 0; r < 4; r++) {
        int32_t last = e.src.ids[e.src.off[r] + e.src.n_pages[r] - 1];
        assert_int_equal(kv_pool_owners(&e.pool, last), 1);
    }
    /* Next turn of the stored conversation. */
    assert_int_equal(kv_seq_reserve_prompt(&e.src, &e.lo, &e.pool, 1000, 300,
                                           err, sizeof(err)),
                     0);
    for (int32_t r = 0; r < 4; r++)
        for (int32_t k = row_tokens[r] / 16; k < e.src.n_pages[r]; k++)
            assert_int_equal(
                kv_pool_owners(&e.pool, e.src.ids[e.src.off[r] + k]), 1);
    assert_int_equal(kv_seq_release(&e.src, &e.pool), 0);
    assert_int_equal(kv_pool_n_used(&e.pool), 116);
    check_pool(&e.pool);
    env_free(&e);
}

static void test_fork_all_or_nothing(void **state)
{
    (void)state;
    struct fork_env e;
    env_init(&e, 119); /* 116 taken, 3 free: one short */
    assert_int_equal(kv_seq_fork(&e.dst, &e.src, &e.lo, &e.pool, NULL, err,
                                 sizeof(err)),
                     TG_ENOSPC);
    assert_int_equal(e.dst.used_pages, 0);
    assert_int_equal(kv_pool_n_used(&e.pool), 116);
    assert_int_equal(kv_pool_n_shared(&e.pool), 0);
    check_pool(&e.pool);
    /* A destination holding pages, or the source itself, is refused. */
    assert_int_equal(kv_seq_fork(&e.src, &e.src, &e.lo, &e.pool, NULL, err,
                                 sizeof(err)),
                     TG_EINVAL);
    struct kv_layout other;
    double b[2] = {1.0, 1.0};
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    assert_int_equal(kv_layout_init(&other, 1, 2, 4, 128, 16, 512, &rule, b,
                                    err, sizeof(err)),
                     0);
    assert_int_equal(kv_seq_fork(&e.dst, &e.src, &other, &e.pool, NULL, err,
                                 sizeof(err)),
                     TG_EINVAL);
    kv_layout_free(&other);
    check_pool(&e.pool);
    env_free(&e);
}

/* A row ending exactly on a page boundary shares every page and takes no
 * private page. */
static void test_fork_page_aligned(void **state)
{
    (void)state;
    struct kv_layout lo;
    double b[2] = {1.0, 1.0};
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    assert_int_equal(kv_layout_init(&lo, 1, 2, 4, 128, 16, 512, &rule, b, err,
                                    sizeof(err)),
                     0);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 64, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    struct kv_seq a, c[3];
    assert_int_equal(kv_seq_init(&a, &lo, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&a, &lo, &pool, 0, 64, err,
                                           sizeof(err)),
                     0);
    assert_int_equal(kv_seq_fork_pages(&a), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kv_seq_init(&c[i], &lo, err, sizeof(err)), 0);
        assert_int_equal(kv_seq_fork(&c[i], &a, &lo, &pool, NULL, err,
                                     sizeof(err)),
                         0);
    }
    assert_int_equal(kv_pool_n_used(&pool), 8);
    assert_int_equal(kv_pool_owners(&pool, a.ids[0]), 4);
    assert_int_equal(kv_seq_commit(&a, &lo, 64, err, sizeof(err)), 0);
    /* The first decode token of each takes a page of its own. */
    assert_int_equal(kv_seq_reserve_decode(&c[1], &lo, &pool, 1, err,
                                           sizeof(err)),
                     0);
    assert_int_equal(kv_pool_n_used(&pool), 10);
    kv_seq_free(&c[1], &pool);
    kv_seq_free(&a, &pool);
    assert_int_equal(kv_pool_n_used(&pool), 8);
    kv_seq_free(&c[2], &pool);
    kv_seq_free(&c[0], &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    check_pool(&pool);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_ref_counts),
        cmocka_unit_test(test_pool_ref_errors),
        cmocka_unit_test(test_pool_ref_random),
        cmocka_unit_test(test_fork_shares_full_pages),
        cmocka_unit_test(test_fork_release_source_first),
        cmocka_unit_test(test_fork_store_keeps_source),
        cmocka_unit_test(test_fork_all_or_nothing),
        cmocka_unit_test(test_fork_page_aligned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
