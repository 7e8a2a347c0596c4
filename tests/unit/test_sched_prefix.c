/* test_sched_prefix.c — the router scheduler's multi-turn cache
 * (rt_prefix, through rt_sched and directly): prefix reuse with exact
 * cached_prompt_tokens, partial reuse, the cache's own lookups and
 * replacement, LRU eviction order, session-id hits and scope isolation. The rest of the
 * scheduler is tested in test_sched.c; the shared fixture is
 * tests/support/tt_sched.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "router/core/rt_prefix.h"
#include "router/core/rt_sched.h"
#include "tests/support/tt_sched.h"

static char err[256];

/* ---- multi-turn reuse ------------------------------------------------ */

static void test_prefix_reuse(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 96, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t turn[40];
    tt_sched_fill(turn, 40, 500);
    assert_int_equal(tt_sched_submit(&s, 1, turn, 20, 2, NULL, err,
                                     sizeof(err)), 0);
    struct rt_sched_event ev;
    assert_int_equal(tt_sched_run_until_done(&s, &st, 1, 20, &ev),
                     RT_SCHED_END_LENGTH);
    /* Tokens sampled: 7002 (last chunk, step 2), 7003 (decode). */
    turn[20] = 7002;
    turn[21] = 7003;
    tt_sched_fill(turn + 22, 5, 600);

    /* The whole history re-sent: 21 positions are stored (prompt + the
     * first sampled token), only 27 - 21 = 6 are prefilled. */
    assert_int_equal(tt_sched_submit(&s, 2, turn, 27, 1, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 1);
    const struct rt_step_entry *e = &st.entries[0];
    assert_int_equal(e->fresh, 1);
    assert_int_equal(e->pos, 21);
    assert_int_equal(e->n, 6);
    assert_int_equal(e->sample, 1);
    assert_int_equal(e->tokens[0], 7003);
    /* The fresh slot gets every page: the history's and the new turn's. */
    for (int r = 0; r < 2; r++) {
        const struct kv_seq *q = rt_sched_req_seq(&s, 2, r);
        assert_non_null(q);
        assert_int_equal(q->turn_start, 21);
        assert_int_equal(q->turn_len, 6);
        int64_t ids = 0;
        for (int64_t d = e->delta_begin; d < e->delta_end; d++)
            if (st.deltas[d].rank == r)
                ids += st.deltas[d].n;
        assert_int_equal(ids, q->used_pages);
    }
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 2, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 21);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cached_prompt_tokens, 21);
    assert_int_equal(stats.cache_entries, 0); /* taken over, not shared */
    int32_t tok = 1;
    assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err,
                                       sizeof(err)), 0);
    assert_int_equal(st.n_events, 1);
    assert_int_equal(st.events[0].finish, RT_SCHED_END_LENGTH);
    assert_int_equal(st.events[0].cached_prompt_tokens, 21);
    assert_int_equal(st.events[0].prompt_tokens, 27);
    tt_sched_validate(&s);

    /* Stored now: 27 positions with chunk boundaries 8, 16, 20 (first
     * turn) and 27. A prompt equal to the stored sequence must prefill at
     * least one token: the entry is rewound to the last boundary before
     * that (20). A prompt diverging at index 3 reuses nothing. */
    assert_int_equal(tt_sched_submit(&s, 3, turn, 27, 1, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.entries[0].pos, 20);
    assert_int_equal(rt_sched_req_info(&s, 3, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 20);
    assert_int_equal(st.entries[0].n, 7); /* one chunk: done in this step */
    assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err,
                                       sizeof(err)), 0);
    assert_int_equal(st.n_events, 1);
    assert_int_equal(st.events[0].finish, RT_SCHED_END_LENGTH);
    int32_t other[30];
    memcpy(other, turn, sizeof(other));
    other[3] = 4242;
    assert_int_equal(tt_sched_submit(&s, 4, other, 30, 1, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.entries[0].pos, 0);
    assert_int_equal(rt_sched_req_info(&s, 4, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 0);
    assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err,
                                       sizeof(err)), 0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s); /* frees stored entries' pages too */
    kv_layout_free(&lay);
}

/* Builds a stored-sequence seq set (T = 1) of n committed positions. */
/* A new turn that keeps the prompt but not the generated answer (a client
 * that re-tokenizes the answer differently, or a template that drops
 * reasoning) still reuses the prompt's KV: the stored entry is rewound to
 * its turn boundary and the answer's tail pages go back to the pools. */
static void test_prefix_partial_reuse(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 96, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t turn[40];
    tt_sched_fill(turn, 40, 500);
    assert_int_equal(tt_sched_submit(&s, 1, turn, 20, 9, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(tt_sched_run_until_done(&s, &st, 1, 40, NULL),
                     RT_SCHED_END_LENGTH);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cache_entries, 1);
    struct rt_sched_pages before;
    rt_sched_rank_pages(&s, 0, &before);
    int64_t cached_pages = before.used;

    /* Same 20-token prompt, then text the model never generated. */
    tt_sched_fill(turn + 20, 7, 900);
    assert_int_equal(tt_sched_submit(&s, 2, turn, 27, 1, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 1);
    const struct rt_step_entry *e = &st.entries[0];
    assert_int_equal(e->fresh, 1);
    assert_int_equal(e->pos, 20);
    assert_int_equal(e->n, 7);
    assert_int_equal(e->tokens[0], 900);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 2, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 20);
    for (int r = 0; r < 2; r++) {
        const struct kv_seq *q = rt_sched_req_seq(&s, 2, r);
        assert_non_null(q);
        assert_int_equal(q->turn_start, 20);
        /* The fresh slot gets exactly the pages the request holds. */
        int64_t ids = 0;
        for (int64_t d = e->delta_begin; d < e->delta_end; d++)
            if (st.deltas[d].rank == r)
                ids += st.deltas[d].n;
        assert_int_equal(ids, q->used_pages);
    }
    /* The answer's tail went back: the rewound history holds fewer pages
     * than the stored entry did (rank 0's request seq, history part). */
    const struct kv_seq *q0 = rt_sched_req_seq(&s, 2, 0);
    int64_t hist_pages = 0;
    for (int32_t r = 0; r < q0->n_rows; r++)
        hist_pages += (q0->filled[r] + lay.page_size - 1) / lay.page_size;
    assert_true(hist_pages < cached_pages);
    tt_sched_validate(&s);
    int32_t tok = 1;
    assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err, sizeof(err)),
                     0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void make_seq(struct kv_seq *q, const struct kv_layout *lay,
                     struct kv_pool *pool, int64_t n)
{
    assert_int_equal(kv_seq_init(q, lay, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(q, lay, pool, 0, n, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_seq_commit(q, lay, n, err, sizeof(err)), 0);
}

static void test_prefix_cache_unit(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 256, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    struct rt_prefix pc;
    assert_int_equal(rt_prefix_init(&pc, 0, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_prefix_init(&pc, 1, err, sizeof(err)), 0);
    int32_t toks[64];
    tt_sched_fill(toks, 64, 10);
    struct kv_seq q;

    /* A: 8 tokens, session "s1"; B: 16 tokens (extends A); C: 24 tokens,
     * other content. */
    make_seq(&q, &lay, &pool, 8);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 7, 0, NULL, &q, err,
                                      sizeof(err)), TG_EINVAL); /* 8 != 7 */
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 8, 0, "s1", &q, err,
                                      sizeof(err)), 0);
    assert_int_equal(q.n_rows, 0); /* moved out */
    make_seq(&q, &lay, &pool, 16);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 16, 0, NULL, &q, err,
                                      sizeof(err)), 0);
    int32_t ctoks[24];
    tt_sched_fill(ctoks, 24, 5000);
    make_seq(&q, &lay, &pool, 24);
    assert_int_equal(rt_prefix_insert(&pc, &pool, ctoks, 24, 0, "s2", &q, err,
                                      sizeof(err)), 0);
    assert_int_equal(pc.n_entries, 3);
    assert_int_equal(rt_prefix_pages(&pc, 0), kv_pool_n_used(&pool));

    struct rt_prefix_entry *m = NULL;
    /* Longest proper prefix wins. */
    assert_int_equal(rt_prefix_match(&pc, toks, 20, 0, NULL, &m), 0);
    assert_non_null(m);
    assert_int_equal(m->n_tokens, 16);
    /* The session selects its own entry even though B is longer. */
    assert_int_equal(rt_prefix_match(&pc, toks, 20, 0, "s1", &m), 0);
    assert_int_equal(m->n_tokens, 8);
    /* A session whose entry is not a prefix falls back to the longest. */
    assert_int_equal(rt_prefix_match(&pc, toks, 20, 0, "s2", &m), 0);
    assert_int_equal(m->n_tokens, 16);
    /* Exactly the stored length is not a proper prefix. */
    assert_int_equal(rt_prefix_match(&pc, toks, 16, 0, NULL, &m), 0);
    assert_int_equal(m->n_tokens, 8);
    assert_int_equal(rt_prefix_match(&pc, toks, 8, 0, NULL, &m), 0);
    assert_null(m);
    int32_t bad[20];
    memcpy(bad, toks, sizeof(bad));
    bad[5] = 1;
    assert_int_equal(rt_prefix_match(&pc, bad, 20, 0, NULL, &m), 0);
    assert_null(m);

    /* LRU: oldest first (A), never the kept one. */
    assert_int_equal(rt_prefix_oldest(&pc)->n_tokens, 8);
    assert_int_equal(rt_prefix_evict_lru(&pc, &pool, rt_prefix_oldest(&pc)), 1);
    assert_int_equal(pc.n_entries, 2);
    assert_int_equal(rt_prefix_oldest(&pc)->n_tokens,
                     8); /* A kept, B evicted */
    assert_int_equal(rt_prefix_newer(rt_prefix_oldest(&pc))->n_tokens, 24);
    assert_int_equal(rt_prefix_evict_lru(&pc, &pool, NULL), 1); /* A */
    assert_int_equal(pc.n_entries, 1);
    assert_int_equal(rt_prefix_oldest(&pc)->n_tokens, 24);
    assert_int_equal(rt_prefix_evict_lru(&pc, &pool, rt_prefix_oldest(&pc)), 0);
    assert_int_equal(rt_prefix_pages(&pc, 0), kv_pool_n_used(&pool));

    /* The same session replaces its entry; the same tokens too. */
    make_seq(&q, &lay, &pool, 12);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 12, 0, "s2", &q, err,
                                      sizeof(err)), 0);
    assert_int_equal(pc.n_entries, 1);
    assert_int_equal(rt_prefix_newest(&pc)->n_tokens, 12);
    make_seq(&q, &lay, &pool, 12);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 12, 0, NULL, &q, err,
                                      sizeof(err)), 0);
    assert_int_equal(pc.n_entries, 1);
    assert_null(rt_prefix_newest(&pc)->session);
    assert_int_equal(rt_prefix_pages(&pc, 0), kv_pool_n_used(&pool));

    /* Take moves the seq out with its pages. */
    assert_int_equal(rt_prefix_match(&pc, toks, 30, 0, NULL, &m), 0);
    assert_non_null(m);
    struct kv_seq got;
    memset(&got, 0, sizeof(got));
    rt_prefix_take(&pc, m, &got);
    assert_int_equal(pc.n_entries, 0);
    assert_int_equal(got.pos, 12);
    assert_int_equal(got.used_pages, kv_pool_n_used(&pool));
    assert_int_equal(rt_prefix_pages(&pc, 0), 0);
    kv_seq_free(&got, &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);

    make_seq(&q, &lay, &pool, 5);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 5, 0, "x", &q, err,
                                      sizeof(err)), 0);
    rt_prefix_free(&pc, &pool); /* returns the pages */
    assert_int_equal(kv_pool_n_used(&pool), 0);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lay);
}

static void test_lru_eviction_order(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1); /* full KV: pages = 4 rows x ceil(tokens / 4) */
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 64, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[32], b[32], c[32], big[24];
    tt_sched_fill(a, 15, 100);
    tt_sched_fill(b, 15, 200);
    tt_sched_fill(c, 15, 300);
    tt_sched_fill(big, 24, 400);
    /* Each stores 16 positions = 16 pages: 48 of 64 used. */
    tt_sched_finish_turn(&s, &st, 1, a, 15, NULL);
    tt_sched_finish_turn(&s, &st, 2, b, 15, NULL);
    tt_sched_finish_turn(&s, &st, 3, c, 15, NULL);
    struct rt_sched_pages rp;
    rt_sched_rank_pages(&s, 0, &rp);
    assert_int_equal(rp.cached, 48);
    /* 24 tokens need 24 pages, 16 are free: exactly the oldest (A) goes. */
    assert_int_equal(tt_sched_submit(&s, 9, big, 24, 4, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cache_entries, 2);
    assert_int_equal(stats.cache_evictions, 1);
    assert_int_equal(stats.running, 1);
    int32_t tok[4] = {0, 0, 0, 0};
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err,
                                       sizeof(err)), 0);
    assert_int_equal(rt_sched_abort(&s, 9), 0);
    tt_sched_validate(&s);

    /* C's next turn reuses its 16 positions, A's finds nothing. */
    for (int i = 16; i < 20; i++)
        a[i] = c[i] = 77;
    assert_int_equal(tt_sched_submit(&s, 10, c, 20, 1, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(tt_sched_submit(&s, 11, a, 20, 1, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 2);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 10, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 16);
    assert_int_equal(rt_sched_req_info(&s, 11, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 0);
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err,
                                       sizeof(err)), 0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_session_hit(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 128, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    /* An anonymous conversation stores u[0 .. 31); session "chat-1"
     * stores u[0 .. 10) (its 9-token prompt plus its first sampled token,
     * 7001, which u[9] was chosen to equal). */
    int32_t u[40], cp[16];
    tt_sched_fill(u, 40, 50);
    u[9] = 7001;
    tt_sched_finish_turn(&s, &st, 2, u, 30, NULL);
    memcpy(cp, u, 9 * sizeof(int32_t));
    tt_sched_finish_turn(&s, &st, 1, cp, 9, "chat-1");
    assert_memory_equal(cp, u, 10 * sizeof(int32_t));
    tt_sched_fill(u + 31, 5, 8000);
    /* Both stored sequences are proper prefixes of u[0 .. 36): the
     * session selects its own entry, an anonymous request the longest. */
    assert_int_equal(tt_sched_submit(&s, 3, u, 36, 1, "chat-1", err,
                                     sizeof(err)), 0);
    assert_int_equal(tt_sched_submit(&s, 4, u, 36, 1, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 2);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 3, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 10);
    assert_int_equal(st.entries[0].pos, 10);
    assert_int_equal(rt_sched_req_info(&s, 4, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 31);
    assert_int_equal(st.entries[1].pos, 31);
    assert_int_equal(st.entries[1].n, 5);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cached_prompt_tokens, 41);
    assert_int_equal(stats.cache_entries, 0);
    int32_t tok[4] = {1, 1, 1, 1};
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err,
                                       sizeof(err)), 0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* Scopes isolate clients: another scope neither sees an entry (no match,
 * no rewind), nor replaces it by storing the same tokens or session id;
 * the owner's scope still hits afterwards. */
static void test_prefix_scopes(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 256, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    struct rt_prefix pc;
    assert_int_equal(rt_prefix_init(&pc, 1, err, sizeof(err)), 0);
    int32_t toks[64];
    tt_sched_fill(toks, 64, 10);
    const uint64_t A = 0x1111, B = 0x2222;
    struct kv_seq q;
    struct rt_prefix_entry *m = NULL;

    make_seq(&q, &lay, &pool, 16);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 16, A, "conv", &q,
                                      err, sizeof(err)), 0);
    /* B guesses the prefix, with and without A's session id. */
    assert_int_equal(rt_prefix_match(&pc, toks, 40, B, NULL, &m), 0);
    assert_null(m);
    assert_int_equal(rt_prefix_match(&pc, toks, 40, B, "conv", &m), 0);
    assert_null(m);
    const struct kv_layout *lays[1] = {&lay};
    assert_int_equal(rt_prefix_match_rewind(&pc, &pool, lays, toks, 12, B,
                                            "conv", &m), 0);
    assert_null(m);
    /* B stores the very same tokens and session: a second entry, A's
     * stays. */
    make_seq(&q, &lay, &pool, 16);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 16, B, "conv", &q,
                                      err, sizeof(err)), 0);
    assert_int_equal(pc.n_entries, 2);
    assert_int_equal(rt_prefix_match(&pc, toks, 40, A, NULL, &m), 0);
    assert_non_null(m);
    assert_true(m->scope == A);
    assert_int_equal(m->n_tokens, 16);
    assert_int_equal(rt_prefix_match(&pc, toks, 40, B, NULL, &m), 0);
    assert_non_null(m);
    assert_true(m->scope == B);
    /* A third scope still sees nothing. */
    assert_int_equal(rt_prefix_match(&pc, toks, 40, 0, NULL, &m), 0);
    assert_null(m);
    /* Within A, a newer turn replaces A's own entry only. */
    make_seq(&q, &lay, &pool, 20);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 20, A, "conv", &q,
                                      err, sizeof(err)), 0);
    assert_int_equal(pc.n_entries, 2);
    assert_int_equal(rt_prefix_match(&pc, toks, 40, B, NULL, &m), 0);
    assert_int_equal(m->n_tokens, 16);
    assert_int_equal(rt_prefix_pages(&pc, 0), kv_pool_n_used(&pool));
    rt_prefix_free(&pc, &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lay);
}

/* Through the scheduler: a request of another scope with a stored prompt
 * as its prefix reuses nothing (cached 0) and the owner still hits. */
static void test_sched_scopes(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 128, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t u[48];
    tt_sched_fill(u, 48, 50);
    /* Scope 0 (the fixture's) stores u[0 .. 31). */
    tt_sched_finish_turn(&s, &st, 1, u, 30, NULL);
    tt_sched_fill(u + 31, 5, 8000);
    int32_t cp[48];
    memcpy(cp, u, sizeof(cp));
    struct rt_sched_request other = {
        .id = 2, .prompt = cp, .n_prompt = 36, .max_tokens = 1,
        .cache_scope = 77, .user = NULL,
        .sampling = {.temperature = 0, .top_p = 1, .repetition_penalty = 1},
    };
    assert_int_equal(rt_sched_submit(&s, &other, err, sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 2, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 0);
    assert_int_equal(st.entries[0].pos, 0);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cache_entries, 1); /* untouched */
    tt_sched_validate(&s);
    int32_t tok1 = 1;
    assert_int_equal(rt_sched_complete(&s, &st, &tok1, NULL, err,
                                       sizeof(err)), 0);
    /* The owner's scope still hits its 31 tokens. */
    assert_int_equal(tt_sched_submit(&s, 3, u, 36, 1, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(rt_sched_req_info(&s, 3, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 31);
    int32_t tok[2] = {1, 1};
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err, sizeof(err)),
                     0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_prefix_partial_reuse),
        cmocka_unit_test(test_prefix_cache_unit),
        cmocka_unit_test(test_lru_eviction_order),
        cmocka_unit_test(test_session_hit),
        cmocka_unit_test(test_prefix_scopes),
        cmocka_unit_test(test_sched_scopes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
