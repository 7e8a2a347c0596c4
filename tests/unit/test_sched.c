/* test_sched.c — the router's budget-reserving scheduler (rt_sched) and its
 * multi-turn cache (rt_prefix), directed tests: configuration and
 * submission errors (queue full, prompt too large), the life of one
 * request, prefix reuse with exact cached_prompt_tokens, LRU eviction
 * order, session-id hits, eviction before preemption, preemption by
 * recompute, aborts in every state and worker loss. The randomized
 * simulations are in test_sched_sim.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_budget.h"
#include "common/kv_pool.h"
#include "common/kv_seq.h"
#include "common/tg_err.h"
#include "router/rt_prefix.h"
#include "router/rt_sched.h"

static char err[256];

#define P 4  /* page size */
#define C 8  /* prefill chunk */

/* L = 2 layers x G = 2 groups; budgets mixed or all 1 (full KV). A window
 * of 2 and one sink keep the compression visible at these small sizes. */
static void make_layout(struct kv_layout *lay, int full)
{
    const double mixed[4] = {1.0, 0.5, 0.25, 0.75};
    const double ones[4] = {1.0, 1.0, 1.0, 1.0};
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    assert_int_equal(kv_layout_init(lay, 2, 2, 1, 4, P, C, &rule,
                                    full ? ones : mixed, err, sizeof(err)),
                     0);
}

static struct rt_sched_config make_cfg(const struct kv_layout *lay, int T,
                                       int32_t pages, int seqs, int batched,
                                       int queued)
{
    struct rt_sched_config cfg = {
        .layout = lay,
        .n_ranks = T,
        .pages_per_rank = pages,
        .max_num_seqs = seqs,
        .max_batched_tokens = batched,
        .max_queued = queued,
        .debug_track = 1,
    };
    return cfg;
}

static int submit(struct rt_sched *s, uint64_t id, const int32_t *prompt,
                  int64_t n, int32_t max_tokens, const char *session)
{
    struct rt_sched_request rq = {
        .id = id,
        .prompt = prompt,
        .n_prompt = n,
        .max_tokens = max_tokens,
        .session_id = session,
        .user = (void *)(uintptr_t)(id + 1000),
    };
    return rt_sched_submit(s, &rq, err, sizeof(err));
}

static void fill(int32_t *t, int64_t n, int32_t base)
{
    for (int64_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

static void validate(struct rt_sched *s)
{
    int rc = rt_sched_validate(s, err, sizeof(err));
    if (rc != 0)
        fail_msg("validate: %s", err);
}

/* Plans and completes steps, sampling token 7000 + step for every entry,
 * until request `id` has ended or `max_steps` passed; returns the final
 * event's finish reason (RT_SCHED_END_NONE if it did not end). */
static enum rt_sched_end run_until_done(struct rt_sched *s, struct rt_step *st,
                                     uint64_t id, int max_steps,
                                     struct rt_sched_event *last)
{
    int32_t toks[64];
    for (int k = 0; k < max_steps; k++) {
        assert_int_equal(rt_sched_plan(s, st, err, sizeof(err)), 0);
        validate(s);
        for (int32_t i = 0; i < st->n_events; i++)
            if (st->events[i].id == id) {
                if (last != NULL)
                    *last = st->events[i];
                return st->events[i].finish; /* ended while planning */
            }
        for (int32_t i = 0; i < st->n_entries; i++)
            toks[i] = 7000 + k;
        assert_int_equal(rt_sched_complete(s, st, toks, NULL, err,
                                           sizeof(err)), 0);
        validate(s);
        for (int32_t i = 0; i < st->n_events; i++)
            if (st->events[i].id == id &&
                st->events[i].finish != RT_SCHED_END_NONE) {
                if (last != NULL)
                    *last = st->events[i];
                return st->events[i].finish;
            }
    }
    return RT_SCHED_END_NONE;
}

/* ---- tensor-parallel ranks with their own layouts --------------------- */

/* Sum of the pages a step sends to `rank` for entry `e`. */
static int64_t delta_pages(const struct rt_step *st, int32_t e, int rank)
{
    int64_t n = 0;
    for (int64_t i = st->entries[e].delta_begin; i < st->entries[e].delta_end;
         i++)
        if (st->deltas[i].rank == rank)
            n += st->deltas[i].n;
    return n;
}

static void test_rank_layouts(void **state)
{
    (void)state;
    /* Rank 0 serves full-KV groups, rank 1 compressed ones (what
     * pf_profile_rank gives two ranks of a skewed profile). */
    struct kv_layout full, mixed, other;
    make_layout(&full, 1);
    make_layout(&mixed, 0);
    const struct kv_layout *lays[2] = {&full, &mixed};
    int32_t prompt[40];
    fill(prompt, 40, 100);
    int64_t need_full = 0, need_mixed = 0;
    assert_int_equal(kv_seq_prompt_pages(NULL, &full, 0, 22, &need_full, err,
                                         sizeof(err)), 0);
    assert_int_equal(kv_seq_prompt_pages(NULL, &mixed, 0, 22, &need_mixed,
                                         err, sizeof(err)), 0);
    assert_true(need_full > need_mixed);

    /* Layouts must agree on everything but the budgets. */
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(NULL, 2, 64, 4, 16, 8);
    cfg.layouts = lays;
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    const double b6[6] = {1, 1, 1, 1, 1, 1};
    assert_int_equal(kv_layout_init(&other, 2, 3, 1, 4, P, C, &rule, b6, err,
                                    sizeof(err)), 0);
    const struct kv_layout *bad[2] = {&full, &other};
    cfg.layouts = bad;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "rank 1"));
    const struct kv_layout *missing[2] = {&full, NULL};
    cfg.layouts = missing;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    kv_layout_free(&other);

    /* A prompt is too big when it does not fit the fullest rank's pool,
     * even if the other rank would hold it. */
    cfg = make_cfg(NULL, 2, (int32_t)need_full - 1, 4, 16, 8);
    cfg.layouts = lays;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    assert_int_equal(submit(&s, 1, prompt, 22, 2, NULL), TG_ETOOBIG);
    assert_non_null(strstr(err, "rank 0"));
    rt_sched_free(&s);

    cfg = make_cfg(NULL, 2, 64, 4, 16, 8);
    cfg.layouts = lays;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    assert_int_equal(submit(&s, 1, prompt, 22, 3, "conv"), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    validate(&s);
    assert_int_equal(st.n_entries, 1);
    /* Each rank reserves and is sent its own layout's pages. */
    assert_int_equal(rt_sched_req_seq(&s, 1, 0)->used_pages, need_full);
    assert_int_equal(rt_sched_req_seq(&s, 1, 1)->used_pages, need_mixed);
    assert_int_equal(delta_pages(&st, 0, 0), need_full);
    assert_int_equal(delta_pages(&st, 0, 1), need_mixed);
    struct rt_sched_pages pg0, pg1;
    rt_sched_rank_pages(&s, 0, &pg0);
    rt_sched_rank_pages(&s, 1, &pg1);
    assert_int_equal(pg0.used, need_full);
    assert_int_equal(pg1.used, need_mixed);
    int32_t toks[8] = {0};
    assert_int_equal(rt_sched_complete(&s, &st, toks, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(run_until_done(&s, &st, 1, 20, NULL), RT_SCHED_END_LENGTH);
    validate(&s);
    /* Stored for reuse; a prompt diverging after 16 tokens rewinds the
     * entry on each rank with that rank's layout. */
    rt_sched_rank_pages(&s, 0, &pg0);
    rt_sched_rank_pages(&s, 1, &pg1);
    assert_true(pg0.cached > pg1.cached && pg1.cached > 0);
    int32_t p2[30];
    memcpy(p2, prompt, 16 * sizeof(int32_t));
    fill(p2 + 16, 14, 900);
    assert_int_equal(submit(&s, 2, p2, 30, 2, "conv"), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    validate(&s);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 2, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 16);
    int64_t f2 = 0, m2 = 0;
    assert_int_equal(kv_seq_prompt_pages(NULL, &full, 0, 16, &f2, err,
                                         sizeof(err)), 0);
    assert_true(rt_sched_req_seq(&s, 2, 0)->used_pages >= f2);
    assert_int_equal(kv_seq_prompt_pages(NULL, &mixed, 0, 16, &m2, err,
                                         sizeof(err)), 0);
    assert_true(rt_sched_req_seq(&s, 2, 1)->used_pages >= m2);
    assert_true(rt_sched_req_seq(&s, 2, 0)->used_pages >
                rt_sched_req_seq(&s, 2, 1)->used_pages);
    assert_int_equal(rt_sched_complete(&s, &st, toks, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(run_until_done(&s, &st, 2, 20, NULL), RT_SCHED_END_LENGTH);
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&full);
    kv_layout_free(&mixed);
}

/* ---- configuration and submission ------------------------------------ */

static void test_config_invalid(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 1, 64, 4, C - 1, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "max_batched_tokens"));
    rt_sched_free(&s); /* zeroed on failure: free is safe */
    cfg = make_cfg(&lay, 0, 64, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    cfg = make_cfg(&lay, 1, 0, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    cfg = make_cfg(&lay, 1, 64, 0, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    cfg = make_cfg(&lay, 1, 64, 4, 16, 0);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    cfg.layout = NULL;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_sched_init(&s, NULL, err, sizeof(err)), TG_EINVAL);
    kv_layout_free(&lay);
}

static void test_submit_errors(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 1);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 2, 32, 2, 16, 3);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    int32_t prompt[64];
    fill(prompt, 64, 1);

    assert_int_equal(submit(&s, 1, prompt, 0, 4, NULL), TG_EINVAL);
    assert_int_equal(submit(&s, 1, NULL, 4, 4, NULL), TG_EINVAL);
    assert_int_equal(submit(&s, 1, prompt, 4, 0, NULL), TG_EINVAL);
    assert_int_equal(rt_sched_submit(&s, NULL, err, sizeof(err)), TG_EINVAL);
    prompt[2] = -5;
    assert_int_equal(submit(&s, 1, prompt, 4, 4, NULL), TG_EINVAL);
    prompt[2] = 3;
    /* Full KV, 4 rows: 32 tokens = 8 pages a row = 32 pages, exactly the
     * pool; 33 tokens can never fit. */
    assert_int_equal(submit(&s, 1, prompt, 33, 4, NULL), TG_ETOOBIG);
    assert_non_null(strstr(err, "pages"));
    assert_int_equal(submit(&s, 1, prompt, 32, 4, NULL), 0);
    assert_int_equal(submit(&s, 1, prompt, 4, 4, NULL), TG_EEXIST);
    assert_int_equal(submit(&s, 2, prompt, 4, 4, NULL), 0);
    assert_int_equal(submit(&s, 3, prompt, 4, 4, NULL), 0);
    /* max_queued = 3 waiting: the fourth is refused (HTTP 429). */
    assert_int_equal(submit(&s, 4, prompt, 4, 4, NULL), TG_EBUSY);
    struct rt_sched_stats st;
    rt_sched_get_stats(&s, &st);
    assert_int_equal(st.waiting, 3);
    assert_int_equal(st.running, 0);

    /* Admission drains the queue (request 1 takes the whole pool, so only
     * it runs), and the queue accepts again. */
    struct rt_step step;
    rt_step_init(&step);
    assert_int_equal(rt_sched_plan(&s, &step, err, sizeof(err)), 0);
    assert_int_equal(step.n_entries, 1);
    assert_int_equal(step.entries[0].id, 1);
    assert_int_equal(submit(&s, 4, prompt, 4, 4, NULL), 0);
    assert_int_equal(submit(&s, 5, prompt, 4, 4, NULL), TG_EBUSY);
    /* A second plan while the step is outstanding is refused. */
    struct rt_step other;
    rt_step_init(&other);
    assert_int_equal(rt_sched_plan(&s, &other, err, sizeof(err)), TG_EBUSY);
    /* Completing the wrong step is refused without change. */
    assert_int_equal(rt_sched_complete(&s, &other, NULL, NULL, err,
                                       sizeof(err)), 0); /* empty: no-op */
    other.n_entries = 1;
    other.step_id = step.step_id + 7;
    assert_int_equal(rt_sched_complete(&s, &other, NULL, NULL, err,
                                       sizeof(err)), TG_EINVAL);
    other.n_entries = 0;
    rt_step_free(&other);
    validate(&s);
    rt_step_free(&step);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* ---- one request from admission to the cache ------------------------- */

static void test_single_request_life(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 2, 64, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    int32_t prompt[20];
    fill(prompt, 20, 100);
    assert_int_equal(submit(&s, 42, prompt, 20, 3, NULL), 0);
    struct rt_step st;
    rt_step_init(&st);

    /* Chunks of exactly C = 8 from the turn start: 8, 8, 4. */
    const int64_t pos[3] = {0, 8, 16}, len[3] = {8, 8, 4};
    int64_t expect_pages = 0;
    assert_int_equal(kv_seq_prompt_pages(NULL, &lay, 0, 20, &expect_pages,
                                         err, sizeof(err)), 0);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
        assert_int_equal(st.n_entries, 1);
        const struct rt_step_entry *e = &st.entries[0];
        assert_int_equal(e->id, 42);
        assert_ptr_equal(e->user, (void *)(uintptr_t)1042);
        assert_int_equal(e->kind, RT_STEP_PREFILL);
        assert_int_equal(e->slot, 0);
        assert_int_equal(e->fresh, k == 0);
        assert_int_equal(e->pos, pos[k]);
        assert_int_equal(e->n, len[k]);
        assert_int_equal(e->tokens[0], 100 + pos[k]);
        assert_int_equal(e->sample, k == 2);
        assert_int_equal(st.n_tokens, len[k]);
        /* The whole prompt reservation is sent with the first chunk. */
        int64_t ids = 0;
        for (int64_t d = e->delta_begin; d < e->delta_end; d++)
            ids += st.deltas[d].n;
        assert_int_equal(ids, k == 0 ? 2 * expect_pages : 0);
        struct rt_sched_pages rp;
        rt_sched_rank_pages(&s, 1, &rp);
        assert_int_equal(rp.used, expect_pages);
        assert_true(rp.monolithic >= rp.used);
        int32_t tok = 900;
        assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err,
                                           sizeof(err)), 0);
        assert_int_equal(st.n_events, k == 2 ? 1 : 0);
        validate(&s);
    }
    assert_int_equal(st.events[0].token, 900);
    assert_int_equal(st.events[0].finish, RT_SCHED_END_NONE);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 42, &info), 0);
    assert_int_equal(info.state, RT_SCHED_DECODING);
    assert_int_equal(info.completion_tokens, 1);

    /* Two decode steps feed back the sampled tokens. */
    for (int k = 0; k < 2; k++) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
        assert_int_equal(st.n_entries, 1);
        assert_int_equal(st.entries[0].kind, RT_STEP_DECODE);
        assert_int_equal(st.entries[0].pos, 20 + k);
        assert_int_equal(st.entries[0].n, 1);
        assert_int_equal(st.entries[0].tokens[0], 900 + k);
        assert_int_equal(st.entries[0].fresh, 0);
        int32_t tok = 901 + k;
        assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err,
                                           sizeof(err)), 0);
        validate(&s);
    }
    assert_int_equal(st.n_events, 1);
    assert_int_equal(st.events[0].finish, RT_SCHED_END_LENGTH);
    assert_int_equal(st.events[0].completion_tokens, 3);
    assert_int_equal(st.events[0].prompt_tokens, 20);
    assert_int_equal(st.events[0].cached_prompt_tokens, 0);
    assert_int_equal(rt_sched_req_info(&s, 42, &info), TG_ENOTFOUND);
    assert_int_equal(rt_sched_abort(&s, 42), TG_ENOTFOUND);

    /* Its KV stays stored: 22 positions (the last token was never fed). */
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cache_entries, 1);
    assert_int_equal(stats.running, 0);
    struct rt_sched_pages rp;
    rt_sched_rank_pages(&s, 0, &rp);
    assert_true(rp.used > 0);
    assert_int_equal(rp.used, rp.cached);
    /* The next plan reports slot 0 as vacated. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 0);
    assert_int_equal(st.n_released, 1);
    assert_int_equal(st.released[0], 0);
    rt_sched_drop_cache(&s);
    rt_sched_rank_pages(&s, 0, &rp);
    assert_int_equal(rp.used, 0);
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* Generation far beyond the initial token array (grown while planning);
 * a huge max_tokens is accepted without reserving anything for it. */
static void test_long_generation(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 1);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 1, 256, 2, 16, 4);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t p0 = 17;
    assert_int_equal(submit(&s, 5, &p0, 1, INT32_MAX - 1, NULL), 0);
    assert_int_equal(submit(&s, 6, &p0, 2, INT32_MAX - 1, NULL), TG_ETOOBIG);
    assert_int_equal(rt_sched_abort(&s, 5), 0);
    assert_int_equal(submit(&s, 1, &p0, 1, 200, NULL), 0);
    int32_t prev = p0;
    for (int k = 0; k < 200; k++) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
        assert_int_equal(st.n_entries, 1);
        assert_int_equal(st.entries[0].pos, k);
        assert_int_equal(st.entries[0].tokens[0], prev);
        prev = 100 + k;
        assert_int_equal(rt_sched_complete(&s, &st, &prev, NULL, err,
                                           sizeof(err)), 0);
        assert_int_equal(st.n_events, 1);
        assert_int_equal(st.events[0].completion_tokens, k + 1);
        assert_int_equal(st.events[0].finish,
                         k == 199 ? RT_SCHED_END_LENGTH : RT_SCHED_END_NONE);
    }
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* ---- multi-turn reuse ------------------------------------------------ */

static void test_prefix_reuse(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 2, 96, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t turn[40];
    fill(turn, 40, 500);
    assert_int_equal(submit(&s, 1, turn, 20, 2, NULL), 0);
    struct rt_sched_event ev;
    assert_int_equal(run_until_done(&s, &st, 1, 20, &ev), RT_SCHED_END_LENGTH);
    /* Tokens sampled: 7002 (last chunk, step 2), 7003 (decode). */
    turn[20] = 7002;
    turn[21] = 7003;
    fill(turn + 22, 5, 600);

    /* The whole history re-sent: 21 positions are stored (prompt + the
     * first sampled token), only 27 - 21 = 6 are prefilled. */
    assert_int_equal(submit(&s, 2, turn, 27, 1, NULL), 0);
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
    validate(&s);

    /* Stored now: 27 positions with chunk boundaries 8, 16, 20 (first
     * turn) and 27. A prompt equal to the stored sequence must prefill at
     * least one token: the entry is rewound to the last boundary before
     * that (20). A prompt diverging at index 3 reuses nothing. */
    assert_int_equal(submit(&s, 3, turn, 27, 1, NULL), 0);
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
    assert_int_equal(submit(&s, 4, other, 30, 1, NULL), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.entries[0].pos, 0);
    assert_int_equal(rt_sched_req_info(&s, 4, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 0);
    assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err,
                                       sizeof(err)), 0);
    validate(&s);
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
    make_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 2, 96, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t turn[40];
    fill(turn, 40, 500);
    assert_int_equal(submit(&s, 1, turn, 20, 9, NULL), 0);
    assert_int_equal(run_until_done(&s, &st, 1, 40, NULL), RT_SCHED_END_LENGTH);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cache_entries, 1);
    struct rt_sched_pages before;
    rt_sched_rank_pages(&s, 0, &before);
    int64_t cached_pages = before.used;

    /* Same 20-token prompt, then text the model never generated. */
    fill(turn + 20, 7, 900);
    assert_int_equal(submit(&s, 2, turn, 27, 1, NULL), 0);
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
    validate(&s);
    int32_t tok = 1;
    assert_int_equal(rt_sched_complete(&s, &st, &tok, NULL, err, sizeof(err)), 0);
    validate(&s);
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
    make_layout(&lay, 1);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 256, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    struct rt_prefix pc;
    assert_int_equal(rt_prefix_init(&pc, 0, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_prefix_init(&pc, 1, err, sizeof(err)), 0);
    int32_t toks[64];
    fill(toks, 64, 10);
    struct kv_seq q;

    /* A: 8 tokens, session "s1"; B: 16 tokens (extends A); C: 24 tokens,
     * other content. */
    make_seq(&q, &lay, &pool, 8);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 7, NULL, &q, err,
                                      sizeof(err)), TG_EINVAL); /* 8 != 7 */
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 8, "s1", &q, err,
                                      sizeof(err)), 0);
    assert_int_equal(q.n_rows, 0); /* moved out */
    make_seq(&q, &lay, &pool, 16);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 16, NULL, &q, err,
                                      sizeof(err)), 0);
    int32_t ctoks[24];
    fill(ctoks, 24, 5000);
    make_seq(&q, &lay, &pool, 24);
    assert_int_equal(rt_prefix_insert(&pc, &pool, ctoks, 24, "s2", &q, err,
                                      sizeof(err)), 0);
    assert_int_equal(pc.n_entries, 3);
    assert_int_equal(rt_prefix_pages(&pc, 0), kv_pool_n_used(&pool));

    struct rt_prefix_entry *m = NULL;
    /* Longest proper prefix wins. */
    assert_int_equal(rt_prefix_match(&pc, toks, 20, NULL, &m), 0);
    assert_non_null(m);
    assert_int_equal(m->n_tokens, 16);
    /* The session selects its own entry even though B is longer. */
    assert_int_equal(rt_prefix_match(&pc, toks, 20, "s1", &m), 0);
    assert_int_equal(m->n_tokens, 8);
    /* A session whose entry is not a prefix falls back to the longest. */
    assert_int_equal(rt_prefix_match(&pc, toks, 20, "s2", &m), 0);
    assert_int_equal(m->n_tokens, 16);
    /* Exactly the stored length is not a proper prefix. */
    assert_int_equal(rt_prefix_match(&pc, toks, 16, NULL, &m), 0);
    assert_int_equal(m->n_tokens, 8);
    assert_int_equal(rt_prefix_match(&pc, toks, 8, NULL, &m), 0);
    assert_null(m);
    int32_t bad[20];
    memcpy(bad, toks, sizeof(bad));
    bad[5] = 1;
    assert_int_equal(rt_prefix_match(&pc, bad, 20, NULL, &m), 0);
    assert_null(m);

    /* LRU: oldest first (A), never the kept one. */
    assert_int_equal(pc.oldest->n_tokens, 8);
    assert_int_equal(rt_prefix_evict_lru(&pc, &pool, pc.oldest), 1);
    assert_int_equal(pc.n_entries, 2);
    assert_int_equal(pc.oldest->n_tokens, 8); /* A kept, B evicted */
    assert_int_equal(pc.oldest->newer->n_tokens, 24);
    assert_int_equal(rt_prefix_evict_lru(&pc, &pool, NULL), 1); /* A */
    assert_int_equal(pc.n_entries, 1);
    assert_int_equal(pc.oldest->n_tokens, 24);
    assert_int_equal(rt_prefix_evict_lru(&pc, &pool, pc.oldest), 0);
    assert_int_equal(rt_prefix_pages(&pc, 0), kv_pool_n_used(&pool));

    /* The same session replaces its entry; the same tokens too. */
    make_seq(&q, &lay, &pool, 12);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 12, "s2", &q, err,
                                      sizeof(err)), 0);
    assert_int_equal(pc.n_entries, 1);
    assert_int_equal(pc.newest->n_tokens, 12);
    make_seq(&q, &lay, &pool, 12);
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 12, NULL, &q, err,
                                      sizeof(err)), 0);
    assert_int_equal(pc.n_entries, 1);
    assert_null(pc.newest->session);
    assert_int_equal(rt_prefix_pages(&pc, 0), kv_pool_n_used(&pool));

    /* Take moves the seq out with its pages. */
    assert_int_equal(rt_prefix_match(&pc, toks, 30, NULL, &m), 0);
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
    assert_int_equal(rt_prefix_insert(&pc, &pool, toks, 5, "x", &q, err,
                                      sizeof(err)), 0);
    rt_prefix_free(&pc, &pool); /* returns the pages */
    assert_int_equal(kv_pool_n_used(&pool), 0);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lay);
}

/* Runs request `id` (prompt t[0 .. n)) alone with max_tokens 2 to its end
 * and writes the two sampled tokens to t[n], t[n + 1]: run_until_done
 * samples 7000 + step, the prefill takes ceil(n / C) steps and the decode
 * one more. Its stored sequence is then t[0 .. n + 1). */
static void finish_turn(struct rt_sched *s, struct rt_step *st, uint64_t id,
                        int32_t *t, int64_t n, const char *session)
{
    assert_int_equal(submit(s, id, t, n, 2, session), 0);
    struct rt_sched_event ev;
    assert_int_equal(run_until_done(s, st, id, 20, &ev), RT_SCHED_END_LENGTH);
    int32_t steps = (int32_t)((n + C - 1) / C);
    t[n] = 7000 + steps - 1;
    t[n + 1] = 7000 + steps;
}

static void test_lru_eviction_order(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 1); /* full KV: pages = 4 rows x ceil(tokens / 4) */
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 1, 64, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[32], b[32], c[32], big[24];
    fill(a, 15, 100);
    fill(b, 15, 200);
    fill(c, 15, 300);
    fill(big, 24, 400);
    /* Each stores 16 positions = 16 pages: 48 of 64 used. */
    finish_turn(&s, &st, 1, a, 15, NULL);
    finish_turn(&s, &st, 2, b, 15, NULL);
    finish_turn(&s, &st, 3, c, 15, NULL);
    struct rt_sched_pages rp;
    rt_sched_rank_pages(&s, 0, &rp);
    assert_int_equal(rp.cached, 48);
    /* 24 tokens need 24 pages, 16 are free: exactly the oldest (A) goes. */
    assert_int_equal(submit(&s, 9, big, 24, 4, NULL), 0);
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
    validate(&s);

    /* C's next turn reuses its 16 positions, A's finds nothing. */
    for (int i = 16; i < 20; i++)
        a[i] = c[i] = 77;
    assert_int_equal(submit(&s, 10, c, 20, 1, NULL), 0);
    assert_int_equal(submit(&s, 11, a, 20, 1, NULL), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 2);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 10, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 16);
    assert_int_equal(rt_sched_req_info(&s, 11, &info), 0);
    assert_int_equal(info.cached_prompt_tokens, 0);
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err,
                                       sizeof(err)), 0);
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_session_hit(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 2, 128, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    /* An anonymous conversation stores u[0 .. 31); session "chat-1"
     * stores u[0 .. 10) (its 9-token prompt plus its first sampled token,
     * 7001, which u[9] was chosen to equal). */
    int32_t u[40], cp[16];
    fill(u, 40, 50);
    u[9] = 7001;
    finish_turn(&s, &st, 2, u, 30, NULL);
    memcpy(cp, u, 9 * sizeof(int32_t));
    finish_turn(&s, &st, 1, cp, 9, "chat-1");
    assert_memory_equal(cp, u, 10 * sizeof(int32_t));
    fill(u + 31, 5, 8000);
    /* Both stored sequences are proper prefixes of u[0 .. 36): the
     * session selects its own entry, an anonymous request the longest. */
    assert_int_equal(submit(&s, 3, u, 36, 1, "chat-1"), 0);
    assert_int_equal(submit(&s, 4, u, 36, 1, NULL), 0);
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
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* ---- preemption, abort, worker loss ---------------------------------- */

static void test_preemption_by_recompute(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 1);
    struct rt_sched s;
    /* 4 rows; 32 pages = 8 pages a row = 32 positions per row in total. */
    struct rt_sched_config cfg = make_cfg(&lay, 2, 32, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[8], b[8];
    fill(a, 8, 10);
    fill(b, 8, 20);
    assert_int_equal(submit(&s, 1, a, 8, 20, NULL), 0);
    assert_int_equal(submit(&s, 2, b, 8, 20, NULL), 0);
    int32_t tok[4];
    int64_t gen_b = 0;
    int preempted_seen = 0;
    for (int k = 0; k < 60 && !preempted_seen; k++) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
        validate(&s);
        struct rt_sched_stats stats;
        rt_sched_get_stats(&s, &stats);
        if (stats.preemptions > 0) {
            /* B (newest) went back to the queue front; A kept going. */
            struct rt_sched_req_info info;
            assert_int_equal(rt_sched_req_info(&s, 2, &info), 0);
            assert_int_equal(info.state, RT_SCHED_WAITING);
            assert_int_equal(info.slot, -1);
            assert_int_equal(info.completion_tokens, gen_b);
            assert_int_equal(info.n_tokens, 8 + gen_b);
            assert_null(rt_sched_req_seq(&s, 2, 0));
            assert_int_equal(st.n_released, 1);
            assert_int_equal(st.released[0], 1);
            assert_int_equal(st.n_entries, 1);
            assert_int_equal(st.entries[0].id, 1);
            preempted_seen = 1;
        }
        for (int32_t i = 0; i < st.n_entries; i++) {
            tok[i] = 3000 + k;
            if (st.entries[i].id == 2 && st.entries[i].sample)
                gen_b++;
        }
        assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err,
                                           sizeof(err)), 0);
    }
    assert_true(preempted_seen);
    /* A finishes (20 tokens); B is readmitted with prompt + generated as
     * one turn and continues to its 20 tokens. */
    struct rt_sched_event ev;
    assert_int_equal(run_until_done(&s, &st, 1, 100, &ev), RT_SCHED_END_LENGTH);
    assert_int_equal(ev.completion_tokens, 20);
    rt_sched_drop_cache(&s); /* A's stored KV would otherwise be evicted */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 1);
    assert_int_equal(st.entries[0].id, 2);
    assert_int_equal(st.entries[0].fresh, 1);
    assert_int_equal(st.entries[0].pos, 0);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 2, &info), 0);
    assert_int_equal(info.turn_start, 0);
    assert_int_equal(info.n_tokens, 8 + gen_b);
    assert_int_equal(rt_sched_req_seq(&s, 2, 0)->turn_len, 8 + gen_b);
    /* The generated tokens are part of the recomputed prefill. */
    assert_int_equal(st.entries[0].tokens[8], 3000); /* sampled at step 0 */
    for (int32_t i = 0; i < st.n_entries; i++)
        tok[i] = 1;
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err,
                                       sizeof(err)), 0);
    assert_int_equal(run_until_done(&s, &st, 2, 100, &ev), RT_SCHED_END_LENGTH);
    assert_int_equal(ev.completion_tokens, 20);
    rt_sched_drop_cache(&s);
    struct rt_sched_pages rp;
    rt_sched_rank_pages(&s, 1, &rp);
    assert_int_equal(rp.used, 0);
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* Under page pressure stored entries go before running work does. */
static void test_evict_before_preempt(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 1);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 1, 32, 4, 16, 4);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[20], b[16];
    fill(a, 15, 1);
    fill(b, 16, 500);
    finish_turn(&s, &st, 1, a, 15, NULL); /* stores 16 positions: 16 pages */
    /* 16 tokens take the other 16 pages; the first decode (position 16)
     * needs 4 more: the stored entry must go, not the request. */
    assert_int_equal(submit(&s, 2, b, 16, 3, NULL), 0);
    struct rt_sched_event ev;
    assert_int_equal(run_until_done(&s, &st, 2, 20, &ev), RT_SCHED_END_LENGTH);
    assert_int_equal(ev.completion_tokens, 3);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.preemptions, 0);
    assert_int_equal(stats.cache_evictions, 1);
    assert_int_equal(stats.cache_entries, 1); /* request 2's own KV now */
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_outgrown_pool_ends_with_length(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 1);
    struct rt_sched s;
    /* 16 pages = 16 positions per row: a 14-token prompt fits, 17
     * positions never do. */
    struct rt_sched_config cfg = make_cfg(&lay, 1, 16, 2, 16, 4);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[14];
    fill(a, 14, 1);
    assert_int_equal(submit(&s, 1, a, 14, 100, NULL), 0);
    struct rt_sched_event ev;
    assert_int_equal(run_until_done(&s, &st, 1, 50, &ev), RT_SCHED_END_LENGTH);
    /* Positions 0..15 fill the pool: 3 tokens generated (14, 15 fed), the
     * 17th position cannot exist. */
    assert_int_equal(ev.completion_tokens, 3);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.preemptions, 1);
    assert_int_equal(stats.running + stats.waiting, 0);
    struct rt_sched_pages rp;
    rt_sched_rank_pages(&s, 0, &rp);
    assert_int_equal(rp.used, 0);
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_abort_and_stop(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 2, 64, 3, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t t[20];
    fill(t, 20, 1);
    assert_int_equal(submit(&s, 1, t, 4, 10, NULL), 0);
    assert_int_equal(submit(&s, 2, t, 20, 10, NULL), 0);
    assert_int_equal(submit(&s, 3, t, 4, 10, NULL), 0);
    assert_int_equal(submit(&s, 4, t, 4, 10, NULL), 0);
    /* Budget 16: 1's prompt (4), 2's first chunk (8), 3's prompt (4). */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 3);
    assert_int_equal(st.n_tokens, 16);
    /* Abort a waiting request and a planned one before the results. */
    assert_int_equal(rt_sched_abort(&s, 4), 0);
    assert_int_equal(rt_sched_abort(&s, 2), 0);
    validate(&s);
    /* Id 2 comes back as a new request before the old step completes:
     * the stale entry must not touch it. */
    assert_int_equal(submit(&s, 2, t, 6, 10, NULL), 0);
    int32_t tok[3] = {11, 12, 13};
    uint8_t stop[3] = {1, 0, 0}; /* 1 stops at once */
    assert_int_equal(rt_sched_complete(&s, &st, tok, stop, err, sizeof(err)),
                     0);
    assert_int_equal(st.n_events, 2);
    assert_int_equal(st.events[0].id, 1);
    assert_int_equal(st.events[0].finish, RT_SCHED_END_STOP);
    assert_int_equal(st.events[0].token, 11);
    assert_int_equal(st.events[1].id, 3);
    assert_int_equal(st.events[1].finish, RT_SCHED_END_NONE);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 2, &info), 0);
    assert_int_equal(info.state, RT_SCHED_WAITING);
    assert_int_equal(info.completion_tokens, 0);
    validate(&s);
    /* Both vacated slots are reported; the new 2 gets one of them fresh. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_released, 2);
    int found = 0;
    for (int32_t i = 0; i < st.n_entries; i++)
        if (st.entries[i].id == 2) {
            found = 1;
            assert_int_equal(st.entries[i].fresh, 1);
            /* 1 finished with prompt t[0 .. 4) stored: a prefix of 2's. */
            assert_int_equal(st.entries[i].pos, 4);
        }
    assert_true(found);
    /* Abort a decoding request mid-step: its pages go at once. */
    assert_int_equal(rt_sched_abort(&s, 3), 0);
    assert_int_equal(rt_sched_abort(&s, 3), TG_ENOTFOUND);
    validate(&s);
    for (int32_t i = 0; i < st.n_entries; i++)
        tok[i] = 5;
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(st.n_events, 1);
    assert_int_equal(st.events[0].id, 2);
    /* A negative sampled token is refused without change. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    tok[0] = -1;
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(rt_sched_complete(&s, &st, NULL, NULL, err,
                                       sizeof(err)), TG_EINVAL);
    tok[0] = 6;
    assert_int_equal(rt_sched_complete(&s, &st, tok, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(rt_sched_abort(&s, 2), 0);
    rt_sched_drop_cache(&s);
    struct rt_sched_pages rp;
    for (int r = 0; r < 2; r++) {
        rt_sched_rank_pages(&s, r, &rp);
        assert_int_equal(rp.used, 0);
        assert_int_equal(rp.monolithic, 0);
    }
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_fail_running(void **state)
{
    (void)state;
    struct kv_layout lay;
    make_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = make_cfg(&lay, 2, 64, 2, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t t[8];
    fill(t, 8, 3);
    finish_turn(&s, &st, 9, t, 5, NULL); /* leaves a stored entry */
    assert_int_equal(submit(&s, 1, t, 4, 10, NULL), 0);
    assert_int_equal(submit(&s, 2, t, 4, 10, NULL), 0);
    assert_int_equal(submit(&s, 3, t, 4, 10, NULL), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 2); /* max_num_seqs = 2 */
    /* The worker died with the step outstanding. */
    assert_int_equal(rt_sched_fail_running(&s, &st), 0);
    assert_int_equal(st.n_events, 2);
    for (int32_t i = 0; i < 2; i++)
        assert_int_equal(st.events[i].finish, RT_SCHED_END_ERROR);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.running, 0);
    assert_int_equal(stats.waiting, 1);
    assert_int_equal(stats.cache_entries, 0);
    struct rt_sched_pages rp;
    rt_sched_rank_pages(&s, 0, &rp);
    assert_int_equal(rp.used, 0);
    /* Service resumes: the waiting request runs. */
    struct rt_sched_event ev;
    assert_int_equal(run_until_done(&s, &st, 3, 30, &ev), RT_SCHED_END_LENGTH);
    validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_invalid),
        cmocka_unit_test(test_submit_errors),
        cmocka_unit_test(test_single_request_life),
        cmocka_unit_test(test_long_generation),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_prefix_partial_reuse),
        cmocka_unit_test(test_prefix_cache_unit),
        cmocka_unit_test(test_lru_eviction_order),
        cmocka_unit_test(test_session_hit),
        cmocka_unit_test(test_preemption_by_recompute),
        cmocka_unit_test(test_evict_before_preempt),
        cmocka_unit_test(test_outgrown_pool_ends_with_length),
        cmocka_unit_test(test_abort_and_stop),
        cmocka_unit_test(test_fail_running),
        cmocka_unit_test(test_rank_layouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
