/* test_sched_fork.c — parallel samples in the scheduler (OpenAI n > 1):
 * a group admitted once, the prompt's pages counted once plus one private
 * page per partly filled row per extra sample, fork entries planned with
 * the leader's last chunk, independent ends, abort of an unforked group,
 * whole-group preemption, submission errors, and the invariant check
 * (page owners) after every step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "router/core/rt_sched.h"
#include "tests/support/tt_sched.h"

static char err[256];

static int32_t find_entry(const struct rt_step *st, uint64_t id)
{
    for (int32_t i = 0; i < st->n_entries; i++)
        if (st->entries[i].id == id)
            return i;
    return -1;
}

/* Completes `st` with token 7 for every sampled entry, no stop. */
static void complete_all(struct rt_sched *s, struct rt_step *st)
{
    int32_t tok[64];
    for (int32_t i = 0; i < st->n_entries; i++)
        tok[i] = 7;
    assert_int_equal(rt_sched_complete(s, st, tok, NULL, err, sizeof(err)), 0);
    tt_sched_validate(s);
}

static void test_group_shares_prompt(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1); /* full KV: every row holds the prompt */
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 200, 8, 64, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    int32_t prompt[18];
    tt_sched_fill(prompt, 18, 3);
    /* 18 tokens, pages of 4: 5 pages per row, the last one half full; 4
     * rows. */
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 18, 3, NULL, err, sizeof(err)), 0);
    for (uint64_t k = 2; k <= 4; k++)
        assert_int_equal(tt_sched_submit_sample(&s, k, 1, prompt, 18,
                                                3 + (int)k, err, sizeof(err)),
                         0);
    struct rt_step st;
    rt_step_init(&st);
    /* Step 1: admission, first chunk of 8 tokens; the samples are forked
     * already (shares + 3 x 4 private pages) but get no entry yet. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 1);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, 5 * 4 + 3 * 4);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.running, 4);
    tt_sched_validate(&s);
    complete_all(&s, &st);
    /* Step 2: chunk 8..16; step 3: the last chunk and three forks. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 1);
    complete_all(&s, &st);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_entries, 4);
    int32_t lead = find_entry(&st, 1);
    assert_int_equal(st.entries[lead].kind, RT_STEP_PREFILL);
    assert_int_equal(st.entries[lead].sample, 1);
    for (uint64_t k = 2; k <= 4; k++) {
        int32_t i = find_entry(&st, k);
        assert_true(i > lead);
        const struct rt_step_entry *e = &st.entries[i];
        assert_int_equal(e->kind, RT_STEP_FORK);
        assert_int_equal(e->n, 0);
        assert_int_equal(e->pos, 18);
        assert_int_equal(e->fresh, 1);
        assert_int_equal(e->sample, 1);
        assert_int_equal(e->fork_from, st.entries[lead].slot);
        assert_true(e->row_lens_off >= 0);
        for (int32_t r = 0; r < 4; r++)
            assert_int_equal(st.row_lens[e->row_lens_off + r], 18);
        /* Deltas: all 5 pages of every row; the first 4 the leader's. */
        int64_t pages = 0;
        for (int64_t d = e->delta_begin; d < e->delta_end; d++)
            pages += st.deltas[d].n;
        assert_int_equal(pages, 20);
    }
    complete_all(&s, &st);
    /* Every sample decodes on its own, and ends at its own length: 3, 5,
     * 6 and 7 tokens. */
    int steps = 0;
    while (1) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
        if (st.n_entries == 0)
            break;
        for (int32_t i = 0; i < st.n_entries; i++)
            assert_int_equal(st.entries[i].kind, RT_STEP_DECODE);
        complete_all(&s, &st);
        steps++;
    }
    assert_int_equal(steps, 6); /* the longest: 7 tokens, 1 from the fork */
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cache_entries, 1); /* the leader's alone */
    /* What is left is the multi-turn store's (the leaders' prompts, kept
     * by content even without a session; never a sample's). */
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, pg.cached);
    rt_sched_drop_cache(&s);
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, 0);
    assert_int_equal(kv_pool_n_shared(&s.pools[0]), 0);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

static void test_group_abort_and_preempt(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0); /* mixed budgets */
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 120, 8, 64, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    int32_t prompt[30];
    tt_sched_fill(prompt, 30, 5);
    struct rt_step st;
    rt_step_init(&st);

    /* Aborting the leader before the fork ends the whole group. */
    assert_int_equal(tt_sched_submit(&s, 1, prompt, 30, 4, NULL, err, sizeof(err)), 0);
    assert_int_equal(tt_sched_submit_sample(&s, 2, 1, prompt, 30, 4,
                                            err, sizeof(err)), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
    tt_sched_validate(&s);
    assert_int_equal(rt_sched_abort(&s, 1), 0);
    assert_int_equal(rt_sched_abort(&s, 2), TG_ENOTFOUND);
    complete_all(&s, &st);
    struct rt_sched_pages pg;
    /* What is left is the multi-turn store's (the leaders' prompts, kept
     * by content even without a session; never a sample's). */
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, pg.cached);
    rt_sched_drop_cache(&s);
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, 0);

    /* Aborting one sample before the fork leaves the others. */
    assert_int_equal(tt_sched_submit(&s, 3, prompt, 30, 2, NULL, err, sizeof(err)), 0);
    assert_int_equal(tt_sched_submit_sample(&s, 4, 3, prompt, 30, 2,
                                            err, sizeof(err)), 0);
    assert_int_equal(tt_sched_submit_sample(&s, 5, 3, prompt, 30, 2,
                                            err, sizeof(err)), 0);
    assert_int_equal(rt_sched_abort(&s, 4), 0);
    tt_sched_validate(&s);
    int forks = 0;
    while (1) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
        if (st.n_entries == 0)
            break;
        for (int32_t i = 0; i < st.n_entries; i++) {
            forks += st.entries[i].kind == RT_STEP_FORK;
            assert_int_not_equal(st.entries[i].id, 4);
        }
        complete_all(&s, &st);
    }
    assert_int_equal(forks, 1);
    /* What is left is the multi-turn store's (the leaders' prompts, kept
     * by content even without a session; never a sample's). */
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, pg.cached);
    rt_sched_drop_cache(&s);
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, 0);

    /* A sample whose request is gone is refused, as is one with another
     * prompt, a session, or more samples than slots. */
    assert_int_equal(tt_sched_submit_sample(&s, 6, 99, prompt, 30, 2,
                                            err, sizeof(err)), TG_EINVAL);
    assert_int_equal(tt_sched_submit(&s, 7, prompt, 30, 2, NULL, err, sizeof(err)), 0);
    int32_t other[30];
    tt_sched_fill(other, 30, 6);
    assert_int_equal(tt_sched_submit_sample(&s, 8, 7, other, 30, 2,
                                            err, sizeof(err)), TG_EINVAL);
    for (uint64_t k = 9; k < 16; k++)
        assert_int_equal(tt_sched_submit_sample(&s, k, 7, prompt, 30, 2,
                                                err, sizeof(err)), 0);
    assert_int_equal(tt_sched_submit_sample(&s, 16, 7, prompt, 30, 2,
                                            err, sizeof(err)), TG_ETOOBIG);
    assert_int_equal(rt_sched_abort(&s, 7), 0);
    tt_sched_validate(&s);
    rt_sched_get_stats(&s, &(struct rt_sched_stats){0});
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* A pool too small for everyone: decoding requests preempt the newest,
 * an unforked group goes back whole and later runs to its end; the
 * invariants hold after every step and every page comes back. */
static void test_group_preempted_whole(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 60, 8, 8, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof(err)), 0);
    int32_t p1[6], p2[30];
    tt_sched_fill(p1, 6, 1);
    tt_sched_fill(p2, 30, 2);
    /* A long decoder first, then a group with a long prompt. */
    assert_int_equal(tt_sched_submit(&s, 1, p1, 6, 40, NULL, err, sizeof(err)), 0);
    assert_int_equal(tt_sched_submit(&s, 2, p2, 30, 3, NULL, err, sizeof(err)), 0);
    assert_int_equal(tt_sched_submit_sample(&s, 3, 2, p2, 30, 3,
                                            err, sizeof(err)), 0);
    struct rt_step st;
    rt_step_init(&st);
    int ended = 0, forks = 0;
    for (int it = 0; it < 400 && ended < 3; it++) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof(err)), 0);
        tt_sched_validate(&s);
        for (int32_t i = 0; i < st.n_events; i++)
            ended += st.events[i].finish != RT_SCHED_END_NONE;
        if (st.n_entries == 0)
            continue;
        for (int32_t i = 0; i < st.n_entries; i++)
            forks += st.entries[i].kind == RT_STEP_FORK;
        complete_all(&s, &st);
        for (int32_t i = 0; i < st.n_events; i++)
            ended += st.events[i].finish != RT_SCHED_END_NONE;
    }
    assert_int_equal(ended, 3);
    assert_true(forks >= 1);
    struct rt_sched_pages pg;
    /* What is left is the multi-turn store's (the leaders' prompts, kept
     * by content even without a session; never a sample's). */
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, pg.cached);
    rt_sched_drop_cache(&s);
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, 0);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_shares_prompt),
        cmocka_unit_test(test_group_abort_and_preempt),
        cmocka_unit_test(test_group_preempted_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
