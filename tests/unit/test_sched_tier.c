/* test_sched_tier.c — the scheduler's host tier of stored conversations
 * (DESIGN.md §4.10, router/core/rt_sched_tier.c) and the cache directory under
 * it (rt_prefix host entries): an entry the device pool would evict moves
 * to the host (offload op, device pages back only once every rank
 * reported), a returning conversation is restored (device pages reserved
 * at admission, no entry before the copy is done, then a fresh entry
 * adopting the whole history: only the suffix is prefilled), the host tier
 * is LRU, scopes still isolate, rewinds work on host entries, failed and
 * lost copies fall back to a full prefill, decode waits for pages being
 * copied out, and every state passes rt_sched_validate; the cache as the
 * directory (rt_prefix host entries) and kv_seq_move_pages directly. The
 * fixture is tests/support/tt_sched.h. */
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

/* Reports every op handed out so far as done on every rank (a fast
 * worker). Returns how many ops ended. */
static int report_all(struct rt_sched *s, int ok)
{
    struct rt_tier_op *const *ops;
    (void)rt_sched_tier_take(s, 0.0, &ops);
    int ended = 0;
    while (s->n_tier_ops > 0) {
        uint64_t id = s->tier_ops[0]->id;
        for (int r = 0; r < s->cfg.n_ranks; r++) {
            int rc = rt_sched_tier_done(s, r, id, ok, NULL);
            assert_true(rc == 0 || rc == 1);
            ended += rc == 1;
        }
    }
    tt_sched_validate(s);
    return ended;
}

/* One plan and complete (tokens 7000 + k), validating; returns the step's
 * entry count. The caller reports tier ops. */
static int32_t one_step(struct rt_sched *s, struct rt_step *st, int k)
{
    int32_t toks[64];
    assert_int_equal(rt_sched_plan(s, st, err, sizeof(err)), 0);
    tt_sched_validate(s);
    int32_t n = st->n_entries;
    for (int32_t i = 0; i < n; i++)
        toks[i] = 7000 + k;
    assert_int_equal(rt_sched_complete(s, st, toks, NULL, err, sizeof(err)),
                     0);
    tt_sched_validate(s);
    return n;
}

/* Runs request id to its end with every tier op reported at once after
 * each plan; returns its last event. */
static struct rt_sched_event run_done(struct rt_sched *s, struct rt_step *st,
                                      uint64_t id)
{
    for (int k = 0; k < 60; k++) {
        int32_t toks[64];
        assert_int_equal(rt_sched_plan(s, st, err, sizeof(err)), 0);
        tt_sched_validate(s);
        for (int32_t i = 0; i < st->n_entries; i++)
            toks[i] = 7000 + k;
        assert_int_equal(rt_sched_complete(s, st, toks, NULL, err,
                                           sizeof(err)), 0);
        for (int32_t i = 0; i < st->n_events; i++)
            if (st->events[i].id == id &&
                st->events[i].finish != RT_SCHED_END_NONE)
                return st->events[i];
        report_all(s, 1);
    }
    fail_msg("request %llu did not end", (unsigned long long)id);
    struct rt_sched_event none = {0};
    return none;
}

/* Pages a fresh prompt of n tokens takes on one rank. */
static int64_t prompt_pages(const struct kv_layout *lay, int64_t n)
{
    int64_t p = 0;
    assert_int_equal(kv_seq_prompt_pages(NULL, lay, 0, n, &p, err,
                                         sizeof(err)), 0);
    return p;
}

/* Plans (completing any step with tokens 7100 + k, reporting every op
 * except request id's restore at once) until request `id` is admitted.
 * Returns the id of its restore op still in flight, or 0. */
static uint64_t admit_req(struct rt_sched *s, struct rt_step *st, uint64_t id)
{
    for (int k = 0; k < 20; k++) {
        int32_t toks[64];
        assert_int_equal(rt_sched_plan(s, st, err, sizeof(err)), 0);
        tt_sched_validate(s);
        struct rt_tier_op *const *ops;
        (void)rt_sched_tier_take(s, (double)k, &ops);
        uint64_t mine = 0;
        for (int32_t i = 0; i < s->n_tier_ops; i++) {
            const struct rt_tier_op *op = s->tier_ops[i];
            if (op->kind == RT_TIER_RESTORE && op->req == id)
                mine = op->id;
        }
        for (int32_t i = 0; i < s->n_tier_ops;) {
            uint64_t oid = s->tier_ops[i]->id;
            if (oid == mine) {
                i++;
                continue;
            }
            for (int r = 0; r < s->cfg.n_ranks; r++)
                assert_true(rt_sched_tier_done(s, r, oid, 1, NULL) >= 0);
        }
        if (st->n_entries > 0) {
            for (int32_t i = 0; i < st->n_entries; i++)
                toks[i] = 7100 + k;
            assert_int_equal(rt_sched_complete(s, st, toks, NULL, err,
                                               sizeof(err)), 0);
        }
        tt_sched_validate(s);
        struct rt_sched_req_info info;
        assert_int_equal(rt_sched_req_info(s, id, &info), 0);
        if (info.state != RT_SCHED_WAITING)
            return mine;
    }
    fail_msg("request %llu was not admitted", (unsigned long long)id);
    return 0;
}

/* The device pages conversation A (a 20-token prompt, 2 tokens out) holds
 * once stored, on one rank. */
static int64_t stored_pages(const struct kv_layout *lay)
{
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(lay, 1, 256, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[32];
    tt_sched_fill(a, 32, 500);
    tt_sched_finish_turn(&s, &st, 1, a, 20, NULL);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    rt_step_free(&st);
    rt_sched_free(&s);
    return pg.cached;
}

/* The smallest prompt that does not fit beside what rank 0's pool holds
 * now (stored entries included), but does fit the pool: admitting it
 * has to move stored entries out. */
static int64_t crowding_prompt(const struct rt_sched *s,
                               const struct kv_layout *lay)
{
    struct rt_sched_pages pg;
    rt_sched_rank_pages(s, 0, &pg);
    int64_t n = 1;
    while (prompt_pages(lay, n) <= pg.total - pg.used)
        n++;
    assert_true(prompt_pages(lay, n) <= pg.total);
    return n;
}

/* A pool of room for two stored conversations of `tokens` tokens and a
 * few pages more. */
static int32_t pool_for(const struct kv_layout *lay, int64_t tokens,
                        int64_t slack)
{
    return (int32_t)(2 * (prompt_pages(lay, tokens) + slack) + 4);
}

/* The scheduler of most tests: T = 2 ranks of `pages` device pages and
 * `host` host pages, 4 slots, 16 tokens a step. */
static void init_sched(struct rt_sched *s, const struct kv_layout *lay,
                       int32_t pages, int32_t host)
{
    struct rt_sched_config cfg = tt_sched_cfg(lay, 2, pages, 4, 16, 8);
    cfg.host_pages_per_rank = host;
    assert_int_equal(rt_sched_init(s, &cfg, err, sizeof(err)), 0);
}

/* Conversation A (20 tokens, stored as 21) fills part of the pool; a
 * prompt B too big for what is left makes A's entry move to the host: an
 * offload op holds A's device pages, B waits (no entry) until every rank
 * reported the copy, then runs. A's next turn restores it: the request
 * takes its slot, gets no entry until the restore is reported, then a
 * fresh entry at the stored length whose deltas hand over exactly the
 * restored pages plus the new turn's, with cached tokens = 21. */
static void test_tier_offload_restore(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    const int32_t pool = pool_for(&lay, 21, 2);
    struct rt_sched s;
    init_sched(&s, &lay, pool, 64);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[64];
    tt_sched_fill(a, 64, 500);
    tt_sched_finish_turn(&s, &st, 1, a, 20, "conv-a");
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    int64_t stored = pg.cached;
    assert_true(stored > 0);
    assert_int_equal(pg.host_total, 64);
    assert_int_equal(pg.host_used, 0);

    /* B: the smallest prompt that does not fit beside A. */
    int64_t nb = crowding_prompt(&s, &lay);
    int32_t b[256];
    tt_sched_fill(b, 256, 3000);
    assert_int_equal(tt_sched_submit(&s, 2, b, nb, 1, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    tt_sched_validate(&s);
    assert_int_equal(st.n_entries, 0); /* B waits for the copy */
    struct rt_tier_op *const *ops;
    assert_int_equal(rt_sched_tier_take(&s, 1.5, &ops), 1);
    const struct rt_tier_op *op = ops[0];
    assert_int_equal(op->kind, RT_TIER_OFFLOAD);
    assert_int_equal(op->off[1] - op->off[0], stored);
    uint64_t off_id = op->id;
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.cached, 0);
    assert_int_equal(pg.host_used, stored);
    assert_int_equal(pg.offloading, stored);
    assert_int_equal(pg.used, stored); /* still held by the copy */
    struct rt_sched_tier_stats ts;
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.offloads, 1);
    assert_int_equal(ts.host_entries, 1);
    assert_int_equal(ts.ops_in_flight, 1);
    /* Nothing more is evicted or planned while the pages are coming. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 0);
    assert_int_equal(rt_sched_tier_take(&s, 2.0, &ops), 0);
    /* Rank 0 alone is not enough. */
    struct rt_tier_event ev;
    assert_int_equal(rt_sched_tier_done(&s, 0, off_id, 1, &ev), 0);
    assert_int_equal(rt_sched_tier_done(&s, 0, off_id, 1, &ev), TG_EPROTO);
    assert_int_equal(rt_sched_tier_done(&s, 2, off_id, 1, &ev), TG_EPROTO);
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.offloading, stored);
    assert_int_equal(rt_sched_tier_done(&s, 1, off_id, 1, &ev), 1);
    assert_int_equal(ev.kind, RT_TIER_OFFLOAD);
    assert_int_equal(ev.ok, 1);
    assert_true(ev.issued == 1.5);
    assert_int_equal(ev.pages, 2 * stored);
    assert_int_equal(rt_sched_tier_done(&s, 1, off_id, 1, &ev), TG_ENOTFOUND);
    tt_sched_validate(&s);
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, 0);
    assert_int_equal(pg.offloading, 0);
    struct rt_sched_event last = run_done(&s, &st, 2);
    assert_int_equal(last.finish, RT_SCHED_END_LENGTH);
    assert_int_equal(last.cached_prompt_tokens, 0);

    /* A's next turn: the stored 22 tokens plus 4 new ones. */
    tt_sched_fill(a + 22, 4, 800);
    assert_int_equal(tt_sched_submit(&s, 3, a, 26, 1, "conv-a", err,
                                     sizeof(err)), 0);
    uint64_t res_id = admit_req(&s, &st, 3);
    assert_int_not_equal(res_id, 0);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 3, &info), 0);
    assert_int_equal(info.state, RT_SCHED_PREFILLING);
    assert_int_equal(info.restoring, 1);
    assert_int_equal(info.cached_prompt_tokens, 21);
    assert_int_equal(s.n_tier_ops, 1);
    op = s.tier_ops[0];
    assert_int_equal(op->id, res_id);
    assert_int_equal(op->kind, RT_TIER_RESTORE);
    assert_int_equal(op->off[1] - op->off[0], stored);
    int32_t restored[2][64];
    for (int r = 0; r < 2; r++)
        memcpy(restored[r], op->dev + op->off[r],
               (size_t)stored * sizeof(int32_t));
    /* A's host pages went back at issue: what the host holds is B's. */
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.host_used, rt_prefix_host_pages(&s.cache, 0));
    for (const struct rt_prefix_entry *x = rt_prefix_newest(&s.cache);
         x != NULL; x = rt_prefix_older(x))
        assert_int_not_equal(x->tokens[0], a[0]);
    /* Until both ranks report, the request gets no entry. */
    assert_int_equal(rt_sched_tier_done(&s, 1, res_id, 1, &ev), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 0);
    assert_int_equal(rt_sched_tier_done(&s, 0, res_id, 1, &ev), 1);
    assert_int_equal(ev.kind, RT_TIER_RESTORE);
    assert_int_equal(ev.pages, 2 * stored);
    tt_sched_validate(&s);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    tt_sched_validate(&s);
    assert_int_equal(st.n_entries, 1);
    const struct rt_step_entry *e = &st.entries[0];
    assert_int_equal(e->fresh, 1);
    assert_int_equal(e->pos, 21);
    assert_int_equal(e->n, 5);
    assert_true(e->row_lens_off >= 0);
    /* The deltas start with the restored pages, row by row in the same
     * order as the op listed them. */
    for (int r = 0; r < 2; r++) {
        const struct kv_seq *q = rt_sched_req_seq(&s, 3, r);
        int64_t k = 0;
        for (int64_t d = e->delta_begin; d < e->delta_end; d++) {
            const struct rt_step_delta *dl = &st.deltas[d];
            if (dl->rank != r)
                continue;
            for (int32_t j = 0; j < dl->n; j++) {
                int32_t id = st.delta_ids[dl->off + j];
                /* a row's first pages are its history's */
                if (j < q->n_pages[dl->row] &&
                    k < stored && id == restored[r][k])
                    k++;
            }
        }
        assert_int_equal(k, stored);
        for (int32_t w = 0; w < q->n_rows; w++)
            assert_int_equal(st.row_lens[e->row_lens_off + r * q->n_rows + w],
                             q->filled[w]);
    }
    int32_t tok = 9;
    assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(st.n_events, 1);
    assert_int_equal(st.events[0].cached_prompt_tokens, 21);
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.restores, 1);
    assert_int_equal(ts.restored_pages, 2 * stored);
    assert_true(ts.host_entries <= 1); /* B's, when it made room */
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* Without a tier (0 host pages) the same pressure drops the entry, as
 * before: no op, B admitted in the same plan, A's next turn reuses
 * nothing. */
static void test_tier_off_drops(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    const int32_t pool = pool_for(&lay, 21, 2);
    struct rt_sched s;
    init_sched(&s, &lay, pool, 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[64];
    tt_sched_fill(a, 64, 500);
    tt_sched_finish_turn(&s, &st, 1, a, 20, "conv-a");
    int64_t nb = crowding_prompt(&s, &lay);
    int32_t b[256];
    tt_sched_fill(b, 256, 3000);
    assert_int_equal(tt_sched_submit(&s, 2, b, nb, 1, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 1);
    struct rt_tier_op *const *ops;
    assert_int_equal(rt_sched_tier_take(&s, 0, &ops), 0);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.host_total, 0);
    int32_t tok = 1;
    assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err, sizeof(err)),
                     0);
    tt_sched_fill(a + 22, 4, 800);
    assert_int_equal(tt_sched_submit(&s, 3, a, 26, 1, "conv-a", err,
                                     sizeof(err)), 0);
    struct rt_sched_event last = run_done(&s, &st, 3);
    assert_int_equal(last.cached_prompt_tokens, 0);
    struct rt_sched_tier_stats ts;
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.offloads, 0);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* The host tier is LRU: with room for one conversation only, offloading
 * the second drops the first (drops_lru), whose next turn then reuses
 * nothing while the second's is restored. */
static void test_tier_host_lru(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    int64_t stored = stored_pages(&lay);
    /* Two stored conversations and a few pages: a third evicts one. */
    const int32_t pool = (int32_t)(2 * stored + 4);
    struct rt_sched s;
    init_sched(&s, &lay, pool, (int32_t)(stored + 1));
    struct rt_step st;
    rt_step_init(&st);
    int32_t t[4][64];
    const char *sess[4] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) {
        tt_sched_fill(t[i], 64, 500 + 1000 * i);
        assert_int_equal(tt_sched_submit(&s, (uint64_t)i + 1, t[i], 20, 2,
                                         sess[i], err, sizeof(err)), 0);
        struct rt_sched_event last = run_done(&s, &st, (uint64_t)i + 1);
        assert_int_equal(last.finish, RT_SCHED_END_LENGTH);
        report_all(&s, 1);
    }
    struct rt_sched_tier_stats ts;
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.offloads, 2);  /* a, then b */
    assert_int_equal(ts.drops_lru, 1); /* a, for b */
    assert_int_equal(ts.host_entries, 1);
    /* b: restored; a: gone from both tiers. The histories are the
     * prompts plus run_done's first sample (7000 + 2: 3 chunks). b goes
     * first: a's full prefill moves c out, which drops b. */
    for (int i = 1; i >= 0; i--) {
        t[i][20] = 7002;
        tt_sched_fill(t[i] + 21, 4, 9000);
        assert_int_equal(tt_sched_submit(&s, 10 + (uint64_t)i, t[i], 25, 1,
                                         sess[i], err, sizeof(err)), 0);
        struct rt_sched_event last = run_done(&s, &st, 10 + (uint64_t)i);
        assert_int_equal(last.cached_prompt_tokens, i == 0 ? 0 : 21);
    }
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.restores, 1);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* Host entries keep their scope: another scope's identical prompt gets
 * no restore and no cached tokens; the owner's does. */
static void test_tier_scopes(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    const int32_t pool = pool_for(&lay, 21, 2);
    struct rt_sched s;
    init_sched(&s, &lay, pool, 64);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[64];
    tt_sched_fill(a, 64, 500);
    struct rt_sched_request rq = {
        .id = 1, .request_id = "r1",
        .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
        .prompt = a, .n_prompt = 20, .max_tokens = 2, .cache_scope = 77,
        .user = (void *)(uintptr_t)1001};
    assert_int_equal(rt_sched_submit(&s, &rq, err, sizeof(err)), 0);
    run_done(&s, &st, 1);
    /* Move it to the host: a big prompt of scope 5. */
    int64_t nb = crowding_prompt(&s, &lay);
    int32_t b[256];
    tt_sched_fill(b, 256, 3000);
    rq.id = 2;
    rq.prompt = b;
    rq.n_prompt = nb;
    rq.max_tokens = 1;
    rq.cache_scope = 5;
    assert_int_equal(rt_sched_submit(&s, &rq, err, sizeof(err)), 0);
    run_done(&s, &st, 2);
    report_all(&s, 1);
    struct rt_sched_tier_stats ts;
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.host_entries, 1);
    /* a's history (its last sample is 7000 + steps of run_done) from
     * another scope: no restore. */
    int32_t again[64];
    memcpy(again, a, sizeof(again));
    again[20] = 7002; /* run_done's first sample: 3 chunks */
    struct rt_sched_req_info info;
    rq.id = 3;
    rq.prompt = again;
    rq.n_prompt = 24;
    rq.cache_scope = 6;
    assert_int_equal(rt_sched_submit(&s, &rq, err, sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    struct rt_tier_op *const *ops;
    int32_t nops = rt_sched_tier_take(&s, 0, &ops);
    for (int32_t i = 0; i < nops; i++)
        assert_int_not_equal(ops[i]->kind, RT_TIER_RESTORE);
    assert_int_equal(rt_sched_req_info(&s, 3, &info), 0);
    assert_int_equal(info.restoring, 0);
    assert_int_equal(info.cached_prompt_tokens, 0);
    /* The owner's scope restores it. */
    if (st.n_entries > 0) {
        int32_t toks[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        assert_int_equal(rt_sched_complete(&s, &st, toks, NULL, err,
                                           sizeof(err)), 0);
    }
    assert_int_equal(rt_sched_abort(&s, 3), 0);
    report_all(&s, 1);
    rq.id = 4;
    rq.cache_scope = 77;
    assert_int_equal(rt_sched_submit(&s, &rq, err, sizeof(err)), 0);
    assert_int_not_equal(admit_req(&s, &st, 4), 0);
    assert_int_equal(rt_sched_req_info(&s, 4, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 21);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* A prompt sharing only the first turn of a host entry rewinds it in the
 * host tier (its tail host pages back at once) and restores the rest. */
static void test_tier_rewind_host_entry(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    const int32_t pool = pool_for(&lay, 40, 4);
    struct rt_sched s;
    init_sched(&s, &lay, pool, 128);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[96];
    tt_sched_fill(a, 96, 500);
    tt_sched_finish_turn(&s, &st, 1, a, 20, "a");
    /* Second turn: 22 stored + 10, then stored as 33 (bounds 8, 16, 20,
     * 28, 32). */
    tt_sched_fill(a + 22, 10, 900);
    tt_sched_submit(&s, 2, a, 32, 2, "a", err, sizeof(err));
    run_done(&s, &st, 2);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    int64_t full = pg.cached;
    int64_t nb = crowding_prompt(&s, &lay);
    int32_t b[512];
    tt_sched_fill(b, 512, 3000);
    tt_sched_submit(&s, 3, b, nb, 1, NULL, err, sizeof(err));
    run_done(&s, &st, 3);
    report_all(&s, 1);
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.host_used, full);
    /* Same session, first turn and a different answer: the entry is
     * rewound to 20 on the host, then restored. */
    int32_t c[96];
    memcpy(c, a, 20 * sizeof(int32_t));
    tt_sched_fill(c + 20, 10, 4000);
    tt_sched_submit(&s, 4, c, 30, 1, "a", err, sizeof(err));
    uint64_t res_id = admit_req(&s, &st, 4);
    assert_int_not_equal(res_id, 0);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 4, &info), 0);
    assert_int_equal(info.restoring, 1);
    assert_int_equal(info.cached_prompt_tokens, 20);
    const struct rt_tier_op *op = s.tier_ops[0];
    assert_int_equal(op->id, res_id);
    /* Rewound on the host first: fewer pages come back than it held. */
    assert_true(op->off[1] - op->off[0] < full);
    report_all(&s, 1);
    struct rt_sched_event last = run_done(&s, &st, 4);
    assert_int_equal(last.cached_prompt_tokens, 20);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* Puts conversation A on the host with its offload still in flight (op
 * id in *off_id) and returns the pool size; A's history is a[0 .. 22). */
static int32_t a_on_host(struct rt_sched *s, struct rt_step *st,
                         const struct kv_layout *lay, int32_t *a,
                         uint64_t *off_id)
{
    const int32_t pool = pool_for(lay, 21, 2);
    init_sched(s, lay, pool, 64);
    tt_sched_fill(a, 64, 500);
    tt_sched_finish_turn(s, st, 1, a, 20, "conv-a");
    int64_t nb = crowding_prompt(s, lay);
    static int32_t b[256];
    tt_sched_fill(b, 256, 3000);
    assert_int_equal(tt_sched_submit(s, 2, b, nb, 1, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(s, st, err, sizeof(err)), 0);
    struct rt_tier_op *const *ops;
    assert_int_equal(rt_sched_tier_take(s, 0, &ops), 1);
    *off_id = ops[0]->id;
    return pool;
}

/* A restore taken from an entry whose offload is still in flight follows
 * that offload: when the offload fails, the restore fails too and its
 * request is prefilled from scratch (no cached tokens); a failed offload
 * of an entry still in the cache drops it. */
static void test_tier_failures(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[64];
    uint64_t off_id;
    a_on_host(&s, &st, &lay, a, &off_id);
    /* A's next turn arrives before the copy out finished. */
    tt_sched_fill(a + 22, 4, 800);
    assert_int_equal(tt_sched_submit(&s, 3, a, 26, 1, "conv-a", err,
                                     sizeof(err)), 0);
    /* B (queued first) waits for the offload's pages; A behind it. Report
     * the offload failed on rank 1. */
    assert_int_equal(rt_sched_tier_done(&s, 0, off_id, 1, NULL), 0);
    struct rt_tier_event ev;
    assert_int_equal(rt_sched_tier_done(&s, 1, off_id, 0, &ev), 1);
    assert_int_equal(ev.ok, 0);
    tt_sched_validate(&s);
    struct rt_sched_tier_stats ts;
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.offload_failures, 1);
    assert_int_equal(ts.host_entries, 0); /* dropped: its copy is bad */
    struct rt_sched_event last = run_done(&s, &st, 3);
    assert_int_equal(last.cached_prompt_tokens, 0);
    rt_step_free(&st);
    rt_sched_free(&s);

    /* The restore follows the failed offload. */
    rt_step_init(&st);
    a_on_host(&s, &st, &lay, a, &off_id);
    /* Let B run once the offload's pages... B needs them: report rank 0
     * only, so they stay held; abort B so A's next turn is admitted. */
    assert_int_equal(rt_sched_abort(&s, 2), 0);
    tt_sched_fill(a + 22, 4, 800);
    assert_int_equal(tt_sched_submit(&s, 3, a, 26, 1, "conv-a", err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    tt_sched_validate(&s);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 3, &info), 0);
    assert_int_equal(info.restoring, 1);
    struct rt_tier_op *const *ops;
    assert_int_equal(rt_sched_tier_take(&s, 0, &ops), 1);
    uint64_t res_id = ops[0]->id;
    assert_int_equal(ops[0]->after, off_id);
    assert_int_equal(rt_sched_tier_done(&s, 0, off_id, 0, NULL), 0);
    assert_int_equal(rt_sched_tier_done(&s, 1, off_id, 1, NULL), 1);
    /* The restore's copies succeed on the workers, but its source was
     * bad: it fails, and the request goes back to the queue. */
    assert_int_equal(rt_sched_tier_done(&s, 0, res_id, 1, NULL), 0);
    assert_int_equal(rt_sched_tier_done(&s, 1, res_id, 1, &ev), 1);
    assert_int_equal(ev.ok, 0);
    tt_sched_validate(&s);
    assert_int_equal(rt_sched_req_info(&s, 3, &info), 0);
    assert_int_equal(info.state, RT_SCHED_WAITING);
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.restore_failures, 1);
    last = run_done(&s, &st, 3);
    assert_int_equal(last.finish, RT_SCHED_END_LENGTH);
    assert_int_equal(last.cached_prompt_tokens, 0);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* A lost worker takes its tier along: host entries are dropped
 * (drops_lost), every op ends with its device pages back, a request
 * waiting for its restore is requeued and prefilled from scratch, and
 * reports of the old ops are ignored. */
static void test_tier_lost(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[64];
    uint64_t off_id;
    a_on_host(&s, &st, &lay, a, &off_id);
    assert_int_equal(rt_sched_abort(&s, 2), 0);
    tt_sched_fill(a + 22, 4, 800);
    assert_int_equal(tt_sched_submit(&s, 3, a, 26, 1, "conv-a", err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    struct rt_tier_op *const *ops;
    assert_int_equal(rt_sched_tier_take(&s, 0, &ops), 1);
    uint64_t res_id = ops[0]->id;
    /* The worker dies: the step failure path first, then the tier. */
    assert_int_equal(rt_sched_fail_running(&s, &st), 0);
    assert_int_equal(st.n_events, 0); /* the restoring request stays */
    rt_sched_tier_lost(&s);
    tt_sched_validate(&s);
    struct rt_sched_pages pg;
    for (int r = 0; r < 2; r++) {
        rt_sched_rank_pages(&s, r, &pg);
        assert_int_equal(pg.used, 0);
        assert_int_equal(pg.host_used, 0);
        assert_int_equal(pg.offloading, 0);
    }
    struct rt_sched_tier_stats ts;
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.drops_lost, 0); /* A was taken by the restore */
    assert_int_equal(ts.ops_in_flight, 0);
    assert_int_equal(rt_sched_tier_done(&s, 0, res_id, 1, NULL),
                     TG_ENOTFOUND);
    assert_int_equal(rt_sched_tier_done(&s, 0, off_id, 1, NULL),
                     TG_ENOTFOUND);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 3, &info), 0);
    assert_int_equal(info.state, RT_SCHED_WAITING);
    struct rt_sched_event last = run_done(&s, &st, 3);
    assert_int_equal(last.finish, RT_SCHED_END_LENGTH);
    assert_int_equal(last.cached_prompt_tokens, 0);
    rt_step_free(&st);
    rt_sched_free(&s);

    /* Host entries at the time of the loss are counted as lost. */
    rt_step_init(&st);
    a_on_host(&s, &st, &lay, a, &off_id);
    report_all(&s, 1);
    rt_sched_tier_lost(&s);
    rt_sched_get_tier(&s, &ts);
    assert_int_equal(ts.drops_lost, 1);
    assert_int_equal(ts.host_entries, 0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* Decode growth that finds the pool short while an offload is copying out
 * skips the token for a step instead of preempting or evicting more. */
static void test_tier_decode_waits(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1); /* full KV: every row grows alike */
    struct rt_sched s;
    /* A stored (20 + 1 tokens: 6 pages a row); B's 8-token prompt with
     * room for exactly its prompt pages. */
    const int32_t pool = 4 * 6 + 4 * 2;
    init_sched(&s, &lay, pool, 64);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[64], b[64];
    tt_sched_fill(a, 64, 500);
    tt_sched_fill(b, 64, 1500);
    tt_sched_finish_turn(&s, &st, 1, a, 20, "a");
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.cached, 24);
    assert_int_equal(tt_sched_submit(&s, 2, b, 8, 4, NULL, err, sizeof(err)),
                     0);
    /* Prefill (8 tokens, 2 pages a row) fits; its first decode token
     * (position 8) needs a third page in every row. */
    assert_int_equal(one_step(&s, &st, 0), 1);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    tt_sched_validate(&s);
    assert_int_equal(st.n_entries, 0); /* waits for A's copy */
    struct rt_tier_op *const *ops;
    assert_int_equal(rt_sched_tier_take(&s, 0, &ops), 1);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.preemptions, 0);
    report_all(&s, 1);
    assert_int_equal(one_step(&s, &st, 1), 1);
    struct rt_sched_event last = run_done(&s, &st, 2);
    assert_int_equal(last.finish, RT_SCHED_END_LENGTH);
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.preemptions, 0);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* kv_seq_move_pages: all or nothing, ids in slab order, monolithic count
 * moved, the old ids still taken until given back. */
static void test_kv_seq_move(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct kv_pool dev, host;
    assert_int_equal(kv_pool_init(&dev, 64, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_init(&host, 8, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&dev, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&host, err, sizeof(err)), 0);
    struct kv_seq q;
    assert_int_equal(kv_seq_init(&q, &lay, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_reserve_prompt(&q, &lay, &dev, 0, 20, err,
                                           sizeof(err)), 0);
    int32_t old[64], nw[64];
    /* Pending prefill: refused. */
    assert_int_equal(kv_seq_move_pages(&q, &dev, &host, old, nw, err,
                                       sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_seq_commit(&q, &lay, 20, err, sizeof(err)), 0);
    int64_t n = q.used_pages;
    assert_true(n > 8);
    /* Too few host pages: nothing changes. */
    uint64_t epoch = q.epoch;
    assert_int_equal(kv_seq_move_pages(&q, &dev, &host, old, nw, err,
                                       sizeof(err)), TG_ENOSPC);
    assert_int_equal(q.epoch, epoch);
    assert_int_equal(kv_pool_n_free(&host), 8);
    kv_pool_free(&host);
    assert_int_equal(kv_pool_init(&host, 64, err, sizeof(err)), 0);
    int32_t before[64];
    int64_t k = 0;
    for (int32_t r = 0; r < q.n_rows; r++)
        for (int32_t j = 0; j < q.n_pages[r]; j++)
            before[k++] = q.ids[q.off[r] + j];
    int64_t mono = dev.mono_pages;
    assert_int_equal(kv_seq_move_pages(&q, &dev, &host, old, nw, err,
                                       sizeof(err)), 0);
    assert_int_not_equal(q.epoch, epoch);
    assert_memory_equal(old, before, (size_t)n * sizeof(int32_t));
    k = 0;
    for (int32_t r = 0; r < q.n_rows; r++)
        for (int32_t j = 0; j < q.n_pages[r]; j++)
            assert_int_equal(q.ids[q.off[r] + j], nw[k++]);
    assert_int_equal(kv_pool_n_used(&host), n);
    assert_int_equal(kv_pool_n_used(&dev), n); /* old ids still taken */
    assert_int_equal(host.mono_pages, mono);
    assert_int_equal(dev.mono_pages, 0);
    assert_int_equal(kv_pool_push(&dev, (int32_t)n, old), 0);
    kv_seq_free(&q, &host);
    assert_int_equal(kv_pool_n_used(&host), 0);
    assert_int_equal(kv_pool_validate(&dev, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_validate(&host, err, sizeof(err)), 0);
    kv_pool_free(&dev);
    kv_pool_free(&host);
    kv_layout_free(&lay);
}

/* The cache as the tier's directory (rt_prefix, T = 1): host entries
 * keep their LRU place and match like device ones, device eviction skips
 * them, host eviction takes only them (never the one kept), and every
 * count follows; a rewind of a host entry gives its tail to the host
 * pool. */
static void test_prefix_directory(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct kv_pool dev, host;
    assert_int_equal(kv_pool_init(&dev, 128, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_init(&host, 128, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&dev, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&host, err, sizeof(err)), 0);
    struct rt_prefix pc;
    assert_int_equal(rt_prefix_init(&pc, 1, err, sizeof(err)), 0);
    assert_int_equal(rt_prefix_tier_init(&pc, &host, err, sizeof(err)), 0);
    int32_t toks[3][32];
    struct rt_prefix_bounds bounds[3] = {{0}};
    for (int i = 0; i < 3; i++) {
        tt_sched_fill(toks[i], 32, 100 * (i + 1));
        struct kv_seq q;
        assert_int_equal(kv_seq_init(&q, &lay, err, sizeof(err)), 0);
        assert_int_equal(kv_seq_reserve_prompt(&q, &lay, &dev, 0, 20, err,
                                               sizeof(err)), 0);
        const int64_t at[3] = {8, 16, 20}; /* the chunks' ends */
        for (int k = 0; k < 3; k++) {
            assert_int_equal(kv_seq_commit(&q, &lay, at[k] - q.committed,
                                           err, sizeof(err)), 0);
            assert_int_equal(rt_prefix_bounds_push(&bounds[i], at[k], &q, 1),
                             0);
        }
        assert_int_equal(rt_prefix_insert_bounds(&pc, &dev, toks[i], 20, 0,
                                                 NULL, &q, &bounds[i], err,
                                                 sizeof(err)), 0);
    }
    struct rt_prefix_entry *a = rt_prefix_oldest(&pc);
    int64_t a_pages = a->seqs[0].used_pages;
    int32_t old[64];
    assert_int_equal(kv_seq_move_pages(&a->seqs[0], &dev, &host, old, NULL,
                                       err, sizeof(err)), 0);
    assert_int_equal(kv_pool_push(&dev, (int32_t)a_pages, old), 0);
    int64_t dev_pages = rt_prefix_pages(&pc, 0);
    rt_prefix_set_on_host(&pc, a);
    assert_int_equal(rt_prefix_pages(&pc, 0), dev_pages - a_pages);
    assert_int_equal(rt_prefix_host_pages(&pc, 0), a_pages);
    assert_int_equal(pc.n_host_entries, 1);
    assert_ptr_equal(rt_prefix_oldest(&pc), a); /* its LRU place stays */
    /* Device eviction skips the host entry. */
    struct rt_prefix_entry *b = rt_prefix_newer(a);
    assert_ptr_equal(rt_prefix_oldest_device(&pc, NULL), b);
    assert_ptr_equal(rt_prefix_oldest_device(&pc, b), rt_prefix_newer(b));
    assert_int_equal(rt_prefix_evict_lru(&pc, &dev, NULL), 1);
    assert_int_equal(pc.n_entries, 2);
    assert_ptr_equal(rt_prefix_oldest(&pc), a);
    /* A host entry matches like a device one. */
    int32_t prompt[32];
    memcpy(prompt, toks[0], sizeof(prompt));
    struct rt_prefix_entry *m = NULL;
    assert_int_equal(rt_prefix_match(&pc, prompt, 25, 0, NULL, &m), 0);
    assert_ptr_equal(m, a);
    /* Partial reuse rewinds it on the host: the tail to the host pool. */
    prompt[17] = 9999;
    const struct kv_layout *lays[1] = {&lay};
    assert_int_equal(rt_prefix_match_rewind(&pc, &dev, lays, prompt, 25, 0,
                                            NULL, &m), 0);
    assert_ptr_equal(m, a);
    assert_int_equal(a->n_tokens, 16);
    assert_true(a->seqs[0].used_pages < a_pages);
    assert_int_equal(kv_pool_n_used(&host), a->seqs[0].used_pages);
    assert_int_equal(rt_prefix_host_pages(&pc, 0), a->seqs[0].used_pages);
    /* Host eviction: never the kept one, only host entries. */
    assert_int_equal(rt_prefix_evict_host_lru(&pc, a), 0);
    assert_int_equal(rt_prefix_evict_host_lru(&pc, NULL), 1);
    assert_int_equal(pc.n_host_evictions, 1);
    assert_int_equal(pc.n_host_entries, 0);
    assert_int_equal(kv_pool_n_used(&host), 0);
    assert_int_equal(rt_prefix_evict_host_lru(&pc, NULL), 0);
    assert_int_equal(rt_prefix_clear_host(&pc), 0);
    assert_int_equal(pc.n_entries, 1); /* c, on the device */
    rt_prefix_free(&pc, &dev);
    assert_int_equal(kv_pool_n_used(&dev), 0);
    assert_int_equal(kv_pool_validate(&dev, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_validate(&host, err, sizeof(err)), 0);
    kv_pool_free(&dev);
    kv_pool_free(&host);
    kv_layout_free(&lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tier_offload_restore),
        cmocka_unit_test(test_tier_off_drops),
        cmocka_unit_test(test_tier_host_lru),
        cmocka_unit_test(test_tier_scopes),
        cmocka_unit_test(test_tier_rewind_host_entry),
        cmocka_unit_test(test_tier_failures),
        cmocka_unit_test(test_tier_lost),
        cmocka_unit_test(test_tier_decode_waits),
        cmocka_unit_test(test_kv_seq_move),
        cmocka_unit_test(test_prefix_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
