/*
 * test_kv_commit_kept.c — kv_seq_commit_kept (gvote's page return, DESIGN.md
 * §4.8 step 5) and the per-head row lengths of the CPU ops (tg_kv_rows
 * head_len): pages held equal the pages the rows fill plus the reservation
 * of the remaining chunks; a bad commit changes nothing; per-head appends
 * and attention read each head's own length.
 */
#include <math.h>
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
#include "kernels/tg_ops.h"

static char err[256];

/* L = 1, two groups (budgets 0.5 and 1), P = 4, C = 16, snapkv rule with
 * window 2 and 1 sink so budgets decide. */
static void layout(struct kv_layout *lo)
{
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    double b[2] = {0.5, 1.0};
    assert_int_equal(kv_layout_init(lo, 1, 2, 1, 8, 4, 16, &rule, b, err,
                                    sizeof(err)), 0);
}

static void test_commit_kept_releases_tail(void **state)
{
    (void)state;
    struct kv_layout lo;
    layout(&lo);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 64, err, sizeof(err)), 0);
    struct kv_seq seq;
    assert_int_equal(kv_seq_init(&seq, &lo, err, sizeof(err)), 0);
    /* 32 tokens = two chunks: row 0 keeps 8 + 8, row 1 keeps 16 + 16. */
    assert_int_equal(kv_seq_reserve_prompt(&seq, &lo, &pool, 0, 32, err,
                                           sizeof(err)), 0);
    assert_int_equal(seq.tokens[0], 16);
    assert_int_equal(seq.tokens[1], 32);
    assert_int_equal(seq.used_pages, 4 + 8);
    int64_t freed = -1;
    /* First chunk: row 0 fills 3 of 8, row 1 fills 5 of 16. */
    int32_t after[2] = {3, 5};
    assert_int_equal(kv_seq_commit_kept(&seq, &lo, &pool, 16, after, &freed,
                                        err, sizeof(err)), 0);
    /* Row 0: 3 + 8 still reserved = 11 tokens, 3 pages (one back); row 1:
     * 5 + 16 = 21 tokens, 6 pages (two back). */
    assert_int_equal(seq.tokens[0], 11);
    assert_int_equal(seq.tokens[1], 21);
    assert_int_equal(seq.n_pages[0], 3);
    assert_int_equal(seq.n_pages[1], 6);
    assert_int_equal(freed, 3);
    assert_int_equal(seq.used_pages, 9);
    assert_int_equal(kv_pool_n_used(&pool), 9);
    /* Out of range (more than the chunk's keep): nothing changes. */
    int32_t bad[2] = {3 + 9, 5};
    assert_int_equal(kv_seq_commit_kept(&seq, &lo, &pool, 16, bad, &freed,
                                        err, sizeof(err)), TG_EINVAL);
    int32_t shrink[2] = {2, 5};
    assert_int_equal(kv_seq_commit_kept(&seq, &lo, &pool, 16, shrink, &freed,
                                        err, sizeof(err)), TG_EINVAL);
    assert_int_equal(seq.used_pages, 9);
    assert_int_equal(seq.committed, 16);
    /* Second chunk: row 0 keeps all 8 (11), row 1 keeps 1 (6). */
    int32_t last[2] = {11, 6};
    assert_int_equal(kv_seq_commit_kept(&seq, &lo, &pool, 16, last, &freed,
                                        err, sizeof(err)), 0);
    assert_int_equal(freed, 4);
    assert_int_equal(seq.n_pages[0], 3);
    assert_int_equal(seq.n_pages[1], 2);
    /* Pages held = pages the rows fill. */
    assert_int_equal(seq.used_pages,
                     kv_pages_for(11, 4) + kv_pages_for(6, 4));
    assert_int_equal(seq.max_tokens, 11);
    /* Decode takes pages as rows fill, from the shrunken rows. */
    assert_int_equal(kv_seq_reserve_decode(&seq, &lo, &pool, 3, err,
                                           sizeof(err)), 0);
    assert_int_equal(seq.tokens[0], 14);
    assert_int_equal(seq.n_pages[0], 4);
    assert_int_equal(seq.n_pages[1], 3);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    kv_seq_free(&seq, &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

/* Two heads in one group (H_p = 2) with lengths 1 and 3: appends land at
 * each head's own end, attention of head 0 sees one key only. */
static void test_head_len_ops(void **state)
{
    (void)state;
    struct tg_backend *be;
    assert_int_equal(tg_backend_cpu_new(1, &be), 0);
    enum { P = 4, D = 2, HP = 2 };
    float pool[2 * HP * 2 * P * D];
    memset(pool, 0, sizeof(pool));
    int32_t page0[2] = {0, 1};
    const int32_t *gp[1] = {page0};
    int32_t hg[2] = {0, 0}, hs[2] = {0, 1};
    int32_t glen[1] = {3}, hlen[2] = {1, 3};
    struct tg_kv_rows r = {.pool = pool, .heads_per_group = HP,
                           .page_size = P, .head_dim = D, .n_kv_heads = 2,
                           .head_group = hg, .head_slot = hs,
                           .group_pages = gp, .group_len = glen,
                           .head_len = hlen};
    /* Different counts per head in one group are allowed with head_len. */
    float k[2 * 2 * D] = {1, 0, 0, 1, 2, 0, 0, 2}; /* (n=2, Hkv=2, d) */
    int32_t idx[4] = {0, 1, 1, 0};
    int32_t keep[2] = {2, 1};
    assert_int_equal(tg_ops_cpu.kv_append(be, &r, k, k, 2, idx, keep), 0);
    /* head 0 (slot 0) wrote rows 1, 2 of page 0; head 1 wrote row 3. */
    const float *s0 = pool;                  /* slot 0 K */
    const float *s1 = pool + 2 * P * D;      /* slot 1 K */
    assert_true(s0[1 * D] == 1.0f && s0[2 * D] == 2.0f);
    assert_true(s1[3 * D + 1] == 2.0f);
    /* Without head_len the counts must match. */
    r.head_len = NULL;
    assert_int_equal(tg_ops_cpu.kv_append(be, &r, k, k, 2, idx, keep),
                     TG_EINVAL);
    /* Attention reads head_len[h] keys: a head of length 1 returns its
     * only value whatever the query. */
    hlen[0] = 1;
    r.head_len = hlen;
    s0 = pool;
    float *v0 = pool + P * D; /* slot 0 V, row 0 */
    v0[0] = 7.0f;
    v0[1] = -3.0f;
    pool[0] = 0.5f;
    float q[2 * D] = {1, 1, 1, 1};
    float out[2 * D];
    assert_int_equal(tg_ops_cpu.attn_decode(be, q, 1, 2, &r, 1.0f, out), 0);
    assert_true(fabsf(out[0] - 7.0f) < 1e-6f && fabsf(out[1] + 3.0f) < 1e-6f);
    /* A head longer than its group is rejected. */
    hlen[1] = 4;
    assert_int_equal(tg_ops_cpu.attn_decode(be, q, 1, 2, &r, 1.0f, out),
                     TG_EINVAL);
    tg_backend_cpu_free(be);
}

static void test_decode_bound(void **state)
{
    (void)state;
    /* max_tokens 32768, caps up to 2048 + beta 128: 2176 tokens. */
    assert_int_equal(kv_decode_bound(32768, 2048, 128), 2176);
    assert_int_equal(kv_decode_bound(100, 2048, 128), 100);
    assert_int_equal(kv_pages_for(kv_decode_bound(32768, 2048, 128), 16), 136);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_kept_releases_tail),
        cmocka_unit_test(test_head_len_ops),
        cmocka_unit_test(test_decode_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
