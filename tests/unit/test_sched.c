/* test_sched.c — the router's budget-reserving scheduler (rt_sched),
 * directed tests: tensor-parallel ranks with their own layouts,
 * configuration and submission errors (queue full, prompt too large), the
 * life of one request, eviction before preemption, preemption by
 * recompute, aborts in every state and worker loss. The multi-turn cache
 * (rt_prefix) is tested in test_sched_prefix.c, the randomized
 * simulations in test_sched_sim.c; the shared fixture is
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
#include "router/core/rt_sched.h"
#include "tests/support/tt_sched.h"

static char err[256];

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
    tt_sched_layout(&full, 1);
    tt_sched_layout(&mixed, 0);
    const struct kv_layout *lays[2] = {&full, &mixed};
    int32_t prompt[40];
    tt_sched_fill(prompt, 40, 100);
    int64_t need_full = 0, need_mixed = 0;
    assert_int_equal(kv_seq_prompt_pages(NULL, &full, 0, 22, &need_full, err,
                                         sizeof(err)), 0);
    assert_int_equal(kv_seq_prompt_pages(NULL, &mixed, 0, 22, &need_mixed,
                                         err, sizeof(err)), 0);
    assert_true(need_full > need_mixed);

    /* Layouts must agree on everything but the budgets. */
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(NULL, 2, 64, 4, 16, 8);
    cfg.layouts = lays;
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    const double b6[6] = {1, 1, 1, 1, 1, 1};
    assert_int_equal(kv_layout_init(&other, 2, 3, 1, 4, TT_SCHED_PAGE,
                                    TT_SCHED_CHUNK, &rule, b6, err,
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
    cfg = tt_sched_cfg(NULL, 2, (int32_t)need_full - 1, 4, 16, 8);
    cfg.layouts = lays;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 22, 2, NULL, err,
                                     sizeof(err)), TG_ETOOBIG);
    assert_non_null(strstr(err, "rank 0"));
    rt_sched_free(&s);

    cfg = tt_sched_cfg(NULL, 2, 64, 4, 16, 8);
    cfg.layouts = lays;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 22, 3, "conv", err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    tt_sched_validate(&s);
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
    assert_int_equal(tt_sched_run_until_done(&s, &st, 1, 20, NULL),
                     RT_SCHED_END_LENGTH);
    tt_sched_validate(&s);
    /* Stored for reuse; a prompt diverging after 16 tokens rewinds the
     * entry on each rank with that rank's layout. */
    rt_sched_rank_pages(&s, 0, &pg0);
    rt_sched_rank_pages(&s, 1, &pg1);
    assert_true(pg0.cached > pg1.cached && pg1.cached > 0);
    int32_t p2[30];
    memcpy(p2, prompt, 16 * sizeof(int32_t));
    tt_sched_fill(p2 + 16, 14, 900);
    assert_int_equal(tt_sched_submit(&s, 2, p2, 30, 2, "conv", err,
                                     sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    tt_sched_validate(&s);
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
    assert_int_equal(tt_sched_run_until_done(&s, &st, 2, 20, NULL),
                     RT_SCHED_END_LENGTH);
    tt_sched_validate(&s);
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
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 64, 4,
                                              TT_SCHED_CHUNK - 1, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "max_batched_tokens"));
    rt_sched_free(&s); /* zeroed on failure: free is safe */
    cfg = tt_sched_cfg(&lay, 0, 64, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    cfg = tt_sched_cfg(&lay, 1, 0, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    cfg = tt_sched_cfg(&lay, 1, 64, 0, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), TG_EINVAL);
    cfg = tt_sched_cfg(&lay, 1, 64, 4, 16, 0);
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
    tt_sched_layout(&lay, 1);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 32, 2, 16, 3);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    int32_t prompt[64];
    tt_sched_fill(prompt, 64, 1);

    assert_int_equal(tt_sched_submit(&s, 1, prompt, 0, 4, NULL, err,
                                     sizeof(err)), TG_EINVAL);
    assert_int_equal(tt_sched_submit(&s, 1, NULL, 4, 4, NULL, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 4, 0, NULL, err,
                                     sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_sched_submit(&s, NULL, err, sizeof(err)), TG_EINVAL);
    prompt[2] = -5;
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 4, 4, NULL, err,
                                     sizeof(err)), TG_EINVAL);
    prompt[2] = 3;
    /* Full KV, 4 rows: 32 tokens = 8 pages a row = 32 pages, exactly the
     * pool; 33 tokens can never fit. */
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 33, 4, NULL, err,
                                     sizeof(err)), TG_ETOOBIG);
    assert_non_null(strstr(err, "pages"));
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 32, 4, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 4, 4, NULL, err,
                                     sizeof(err)), TG_EEXIST);
    assert_int_equal(tt_sched_submit(&s, 2, prompt, 4, 4, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(tt_sched_submit(&s, 3, prompt, 4, 4, NULL, err,
                                     sizeof(err)), 0);
    /* max_queued = 3 waiting: the fourth is refused (HTTP 429). */
    assert_int_equal(tt_sched_submit(&s, 4, prompt, 4, 4, NULL, err,
                                     sizeof(err)), TG_EBUSY);
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
    assert_int_equal(tt_sched_submit(&s, 4, prompt, 4, 4, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(tt_sched_submit(&s, 5, prompt, 4, 4, NULL, err,
                                     sizeof(err)), TG_EBUSY);
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
    tt_sched_validate(&s);
    rt_step_free(&step);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* ---- one request from admission to the cache ------------------------- */

/* The scheduler borrows a request's logit bias: the plan's entry carries
 * the caller's arrays themselves, not a copy (the router's request owns
 * them for as long as the scheduler holds the request). */
static void test_bias_borrowed(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 64, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    int32_t prompt[4];
    tt_sched_fill(prompt, 4, 100);
    static const int32_t ids[2] = {5, 9};
    static const float vals[2] = {1.5f, -2.0f};
    struct rt_sched_request rq = {
        .id = 1,
        .request_id = "bias",
        .sampling = TG_SAMPLING_OFF,
        .prompt = prompt,
        .n_prompt = 4,
        .max_tokens = 2,
    };
    rq.sampling.bias_ids = ids;
    rq.sampling.bias_vals = vals;
    rq.sampling.n_bias = 2;
    assert_int_equal(rt_sched_submit(&s, &rq, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 1);
    const struct tg_sampling *sp = st.entries[0].sampling;
    assert_int_equal(sp->n_bias, 2);
    assert_ptr_equal(sp->bias_ids, ids);
    assert_ptr_equal(sp->bias_vals, vals);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_single_request_life(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 64, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    int32_t prompt[20];
    tt_sched_fill(prompt, 20, 100);
    assert_int_equal(tt_sched_submit(&s, 42, prompt, 20, 3, NULL, err,
                                     sizeof(err)), 0);
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
        tt_sched_validate(&s);
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
        tt_sched_validate(&s);
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
    tt_sched_validate(&s);
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
    tt_sched_layout(&lay, 1);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 256, 2, 16, 4);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t p0 = 17;
    assert_int_equal(tt_sched_submit(&s, 5, &p0, 1, INT32_MAX - 1, NULL, err,
                                     sizeof(err)), 0);
    assert_int_equal(tt_sched_submit(&s, 6, &p0, 2, INT32_MAX - 1, NULL, err,
                                     sizeof(err)), TG_ETOOBIG);
    assert_int_equal(rt_sched_abort(&s, 5), 0);
    assert_int_equal(tt_sched_submit(&s, 1, &p0, 1, 200, NULL, err,
                                     sizeof(err)), 0);
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
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* ---- preemption, abort, worker loss ---------------------------------- */

static void test_preemption_by_recompute(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1);
    struct rt_sched s;
    /* 4 rows; 32 pages = 8 pages a row = 32 positions per row in total. */
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 32, 4, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[8], b[8];
    tt_sched_fill(a, 8, 10);
    tt_sched_fill(b, 8, 20);
    assert_int_equal(tt_sched_submit(&s, 1, a, 8, 20, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(tt_sched_submit(&s, 2, b, 8, 20, NULL, err, sizeof(err)),
                     0);
    int32_t tok[4];
    int64_t gen_b = 0;
    int preempted_seen = 0;
    for (int k = 0; k < 60 && !preempted_seen; k++) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
        tt_sched_validate(&s);
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
    assert_int_equal(tt_sched_run_until_done(&s, &st, 1, 100, &ev),
                     RT_SCHED_END_LENGTH);
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
    assert_int_equal(tt_sched_run_until_done(&s, &st, 2, 100, &ev),
                     RT_SCHED_END_LENGTH);
    assert_int_equal(ev.completion_tokens, 20);
    rt_sched_drop_cache(&s);
    struct rt_sched_pages rp;
    rt_sched_rank_pages(&s, 1, &rp);
    assert_int_equal(rp.used, 0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* Under page pressure stored entries go before running work does. */
static void test_evict_before_preempt(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 32, 4, 16, 4);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[20], b[16];
    tt_sched_fill(a, 15, 1);
    tt_sched_fill(b, 16, 500);
    tt_sched_finish_turn(&s, &st, 1, a, 15,
                         NULL); /* stores 16 positions: 16 pages */
    /* 16 tokens take the other 16 pages; the first decode (position 16)
     * needs 4 more: the stored entry must go, not the request. */
    assert_int_equal(tt_sched_submit(&s, 2, b, 16, 3, NULL, err, sizeof(err)),
                     0);
    struct rt_sched_event ev;
    assert_int_equal(tt_sched_run_until_done(&s, &st, 2, 20, &ev),
                     RT_SCHED_END_LENGTH);
    assert_int_equal(ev.completion_tokens, 3);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.preemptions, 0);
    assert_int_equal(stats.cache_evictions, 1);
    assert_int_equal(stats.cache_entries, 1); /* request 2's own KV now */
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* A request alone that outgrows the whole pool while decoding is
 * preempted, cannot be admitted again and ends with RT_SCHED_END_KV, never
 * LENGTH: it did not reach its max_tokens (the router reports an error). */
static void test_outgrown_pool_ends_with_kv(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1);
    struct rt_sched s;
    /* 16 pages = 16 positions per row: a 14-token prompt fits, 17
     * positions never do. */
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 16, 2, 16, 4);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t a[14];
    tt_sched_fill(a, 14, 1);
    /* The pool holds 16 positions for one request: that is the context
     * the router advertises (it clamps max_model_len to it). */
    assert_int_equal(rt_sched_max_tokens(&s), 16);
    assert_int_equal(tt_sched_submit(&s, 1, a, 14, 100, NULL, err, sizeof(err)),
                     0);
    struct rt_sched_event ev;
    /* The KV cache ended it, not max_tokens: never reported as length. */
    assert_int_equal(tt_sched_run_until_done(&s, &st, 1, 50, &ev),
                     RT_SCHED_END_KV);
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
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_abort_and_stop(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 64, 3, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t t[20];
    tt_sched_fill(t, 20, 1);
    assert_int_equal(tt_sched_submit(&s, 1, t, 4, 10, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(tt_sched_submit(&s, 2, t, 20, 10, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(tt_sched_submit(&s, 3, t, 4, 10, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(tt_sched_submit(&s, 4, t, 4, 10, NULL, err, sizeof(err)),
                     0);
    /* Budget 16: 1's prompt (4), 2's first chunk (8), 3's prompt (4). */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 3);
    assert_int_equal(st.n_tokens, 16);
    /* Abort a waiting request and a planned one before the results. */
    assert_int_equal(rt_sched_abort(&s, 4), 0);
    assert_int_equal(rt_sched_abort(&s, 2), 0);
    tt_sched_validate(&s);
    /* Id 2 comes back as a new request before the old step completes:
     * the stale entry must not touch it. */
    assert_int_equal(tt_sched_submit(&s, 2, t, 6, 10, NULL, err, sizeof(err)),
                     0);
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
    tt_sched_validate(&s);
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
    tt_sched_validate(&s);
    /* The aborted entry may come back without a token (-1: the worker
     * failed that request alone); the step completes for the others. */
    int aborted_entry = 0;
    for (int32_t i = 0; i < st.n_entries; i++) {
        tok[i] = st.entries[i].id == 3 ? -1 : 5;
        aborted_entry += st.entries[i].id == 3;
    }
    assert_int_equal(aborted_entry, 1);
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
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_fail_running(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 2, 64, 2, 16, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t t[8];
    tt_sched_fill(t, 8, 3);
    tt_sched_finish_turn(&s, &st, 9, t, 5, NULL); /* leaves a stored entry */
    assert_int_equal(tt_sched_submit(&s, 1, t, 4, 10, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(tt_sched_submit(&s, 2, t, 4, 10, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(tt_sched_submit(&s, 3, t, 4, 10, NULL, err, sizeof(err)),
                     0);
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
    assert_int_equal(tt_sched_run_until_done(&s, &st, 3, 30, &ev),
                     RT_SCHED_END_LENGTH);
    tt_sched_validate(&s);
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
        cmocka_unit_test(test_preemption_by_recompute),
        cmocka_unit_test(test_evict_before_preempt),
        cmocka_unit_test(test_outgrown_pool_ends_with_kv),
        cmocka_unit_test(test_abort_and_stop),
        cmocka_unit_test(test_fail_running),
        cmocka_unit_test(test_rank_layouts),
        cmocka_unit_test(test_bias_borrowed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
