/* test_sched_admit.c — the scheduler's admission checks (rt_sched.c,
 * admit_front) at their exact boundaries, each isolated so that one
 * miscounted term fails one test:
 *  - slots: a group of parallel samples needs 1 + n_sibs slots; with
 *    max_num_seqs 4 and three running requests an n = 2 group waits, and
 *    is admitted once two slots are free;
 *  - pages of the samples: the prompt's pages plus one private page per
 *    row per extra sample, exactly: admitted when the pool holds exactly
 *    that, left waiting (with the stored entries it cannot use left alone)
 *    one page short;
 *  - a reused prefix: its pages are neither free nor evictable, and the
 *    new turn needs only the pages beyond it: admitted at the exact fit,
 *    waiting one page short (the stored entry it cannot use left alone);
 *  - decode-time compression: a group reserves the decode bound once per
 *    sample (1 + n_sibs), and the running requests' headroom stays out of
 *    what a newcomer may take; each at the exact fit and one page short,
 *    with the newcomer's own bound small enough that only the isolated
 *    term decides.
 * Fixture: tests/support/tt_sched.h (L 2 x G 2 rows, P 4, C 8). The page
 * figures in the comments follow from it and are asserted where they are
 * observable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_trig.h"
#include "common/base/tg_err.h"
#include "router/core/rt_sched.h"
#include "tests/support/tt_sched.h"

static char err[256];

static enum rt_sched_state state_of(struct rt_sched *s, uint64_t id)
{
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(s, id, &info), 0);
    return info.state;
}

static int running(enum rt_sched_state st)
{
    return st == RT_SCHED_PREFILLING || st == RT_SCHED_DECODING;
}

/* Completes `st` with token 7 for every entry, then validates. */
static void complete_all(struct rt_sched *s, struct rt_step *st)
{
    int32_t tok[64];
    assert_true(st->n_entries <= 64);
    for (int32_t i = 0; i < st->n_entries; i++)
        tok[i] = 7;
    assert_int_equal(rt_sched_complete(s, st, tok, NULL, err, sizeof err), 0);
    tt_sched_validate(s);
}

/* Plans and completes steps until nothing is left to run (at most
 * max_steps); every request must end by length. Returns the ends seen. */
static int drain(struct rt_sched *s, struct rt_step *st, int max_steps)
{
    int ended = 0;
    for (int k = 0; k < max_steps; k++) {
        assert_int_equal(rt_sched_plan(s, st, err, sizeof err), 0);
        tt_sched_validate(s);
        for (int32_t i = 0; i < st->n_events; i++) {
            assert_int_equal(st->events[i].finish, RT_SCHED_END_LENGTH);
            ended++;
        }
        if (st->n_entries == 0)
            return ended;
        complete_all(s, st);
        for (int32_t i = 0; i < st->n_events; i++) {
            if (st->events[i].finish == RT_SCHED_END_NONE)
                continue;
            assert_int_equal(st->events[i].finish, RT_SCHED_END_LENGTH);
            ended++;
        }
    }
    fail_msg("still running after %d steps", max_steps);
    return ended;
}

/* ---- slots -------------------------------------------------------------- */

static void test_samples_wait_for_slots(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 1);
    struct rt_sched s;
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 200, 4, 64, 8);
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof err), 0);
    int32_t p[4][6];
    for (int i = 0; i < 4; i++)
        tt_sched_fill(p[i], 6, 100 * (i + 1));
    /* Three requests take three of the four slots; request 1 ends after
     * its second token. */
    for (uint64_t id = 1; id <= 3; id++)
        assert_int_equal(tt_sched_submit(&s, id, p[id - 1], 6,
                                         id == 1 ? 2 : 40, NULL, err,
                                         sizeof err), 0);
    struct rt_step st;
    rt_step_init(&st);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    assert_int_equal(st.n_entries, 3);
    complete_all(&s, &st);
    /* An n = 2 group: it needs two slots, one is free: it waits. */
    assert_int_equal(tt_sched_submit(&s, 4, p[3], 6, 3, NULL, err,
                                     sizeof err), 0);
    assert_int_equal(tt_sched_submit_sample(&s, 5, 4, p[3], 6, 3, err,
                                            sizeof err), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    tt_sched_validate(&s);
    assert_int_equal(st.n_entries, 3); /* the three decodes only */
    assert_int_equal(state_of(&s, 4), RT_SCHED_WAITING);
    assert_int_equal(state_of(&s, 5), RT_SCHED_WAITING);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.running, 3);
    complete_all(&s, &st); /* request 1 ends: two slots free */
    /* Now the group fits exactly: leader and sample run, every slot
     * distinct and below max_num_seqs. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    tt_sched_validate(&s);
    assert_true(running(state_of(&s, 4)));
    assert_true(running(state_of(&s, 5)));
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.running, 4);
    int used[4] = {0};
    for (int32_t i = 0; i < st.n_entries; i++) {
        int32_t slot = st.entries[i].slot;
        assert_true(slot >= 0 && slot < 4);
        assert_int_equal(used[slot], 0);
        used[slot] = 1;
    }
    complete_all(&s, &st);
    assert_int_equal(drain(&s, &st, 100), 4); /* 2, 3, 4 and 5 */
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* ---- pages of parallel samples ------------------------------------------ */

/* A full-KV scheduler of one rank with a pool of `pages` (8 slots, 64
 * tokens a step) and an empty step. */
static void full_kv_sched(struct kv_layout *lay, struct rt_sched *s,
                          struct rt_step *st, int32_t pages)
{
    tt_sched_layout(lay, 1);
    struct rt_sched_config cfg = tt_sched_cfg(lay, 1, pages, 8, 64, 8);
    assert_int_equal(rt_sched_init(s, &cfg, err, sizeof err), 0);
    rt_step_init(st);
}

/* Full KV, pool of `pages`: a finished request leaves a stored entry of 8
 * pages (7 positions, 2 pages per row); then request 2 (6 tokens: 8
 * pages) and a group of a leader with an 18-token prompt (5 pages per
 * row, 20) and one sample (a private copy of each row's half-full last
 * page: 4) arrive together. The group needs 20 + 4 pages of the free
 * ones plus the stored entry's: 8 + 8 + 16 free = 32 fit exactly. Returns
 * whether the group ran in the first step, and checks that a group left
 * waiting evicted nothing (it could not have used the entry's pages). */
static int group_admitted(int32_t pages)
{
    struct kv_layout lay;
    struct rt_sched s;
    struct rt_step st;
    full_kv_sched(&lay, &s, &st, pages);
    int32_t e[8], a[6], g[18];
    tt_sched_fill(e, 6, 100);
    tt_sched_fill(a, 6, 200);
    tt_sched_fill(g, 18, 300);
    tt_sched_finish_turn(&s, &st, 1, e, 6, NULL);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.cached, 8);
    assert_int_equal(tt_sched_submit(&s, 2, a, 6, 2, NULL, err, sizeof err),
                     0);
    assert_int_equal(tt_sched_submit(&s, 3, g, 18, 3, NULL, err, sizeof err),
                     0);
    assert_int_equal(tt_sched_submit_sample(&s, 4, 3, g, 18, 3, err,
                                            sizeof err), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    tt_sched_validate(&s);
    assert_true(running(state_of(&s, 2)));
    int admitted = running(state_of(&s, 3));
    assert_int_equal(running(state_of(&s, 4)), admitted);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    rt_sched_rank_pages(&s, 0, &pg);
    if (admitted) {
        /* Exactly full: the stored entry made room. */
        assert_int_equal(pg.used, pages);
        assert_int_equal(stats.cache_entries, 0);
    } else {
        assert_int_equal(stats.cache_entries, 1);
        assert_int_equal(pg.cached, 8);
    }
    complete_all(&s, &st);
    assert_int_equal(drain(&s, &st, 200), 3); /* every request is served */
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
    return admitted;
}

static void test_sample_pages_exact(void **state)
{
    (void)state;
    assert_true(group_admitted(32));
    assert_false(group_admitted(31));
}

/* ---- a reused prefix ---------------------------------------------------- */

/* Full KV, pool of `pages`. Stored: conversation m (turn 1: a 6-token
 * prompt and 2 sampled tokens, 7 positions: 8 pages) and an unrelated
 * entry z (8 pages). Request r (6 tokens, 8 pages, 2 to generate) runs.
 * Turn 2 re-sends m's 8 tokens plus 10 new ones: 18 tokens, 5 pages per
 * row, of which m holds 2: it needs 12 more, which the free pages and z's
 * may give, never m's own. Exact fit: 8 + 8 + 8 + 4 free = 28. Returns
 * whether turn 2 ran in r's step (then reusing m's 7 positions), and
 * checks that a turn left waiting evicted nothing. */
static int turn_admitted(int32_t pages)
{
    struct kv_layout lay;
    struct rt_sched s;
    struct rt_step st;
    full_kv_sched(&lay, &s, &st, pages);
    int32_t m[18], z[8], r[6];
    tt_sched_fill(m, 6, 100);
    tt_sched_fill(z, 6, 200);
    tt_sched_fill(r, 6, 300);
    tt_sched_finish_turn(&s, &st, 1, m, 6, "conv");
    tt_sched_finish_turn(&s, &st, 2, z, 6, NULL);
    tt_sched_fill(m + 8, 10, 400);
    struct rt_sched_stats stats;
    rt_sched_get_stats(&s, &stats);
    assert_int_equal(stats.cache_entries, 2);
    assert_int_equal(tt_sched_submit(&s, 3, r, 6, 2, NULL, err, sizeof err),
                     0);
    assert_int_equal(tt_sched_submit(&s, 4, m, 18, 2, "conv", err,
                                     sizeof err), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    tt_sched_validate(&s);
    assert_true(running(state_of(&s, 3)));
    int admitted = running(state_of(&s, 4));
    rt_sched_get_stats(&s, &stats);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    if (admitted) {
        struct rt_sched_req_info info;
        assert_int_equal(rt_sched_req_info(&s, 4, &info), 0);
        assert_int_equal(info.cached_prompt_tokens, 7);
        assert_int_equal(pg.used, pages); /* z made room, exactly */
        assert_int_equal(stats.cache_entries, 0);
    } else {
        assert_int_equal(stats.cache_entries, 2);
        assert_int_equal(pg.cached, 16);
    }
    complete_all(&s, &st);
    assert_int_equal(drain(&s, &st, 200), 2);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
    return admitted;
}

static void test_reused_prefix_pages_exact(void **state)
{
    (void)state;
    assert_true(turn_admitted(28));
    assert_false(turn_admitted(27));
}

/* ---- decode-time compression -------------------------------------------- */

/* Per-head layout with trig caps (tt_sched_trig_caps), pool of `pages`:
 * request 1 (16 tokens: 11 pages, decode bound 12) runs; then request 2
 * (16 tokens, max_tokens `max2`), with `sample` a parallel sample of it.
 * Returns whether request 2 ran in request 1's step. */
static int trig_admitted(int32_t pages, int32_t max2, int sample)
{
    struct kv_layout lay;
    tt_sched_head_layout(&lay);
    struct kv_trig t;
    tt_sched_trig_caps(&t);
    const struct kv_trig *tp[1] = {&t};
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, pages, 4, 64, 8);
    cfg.per_head = 1;
    cfg.trig = tp;
    struct rt_sched s;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof err), 0);
    int32_t p1[16], p2[16];
    tt_sched_fill(p1, 16, 10);
    tt_sched_fill(p2, 16, 40);
    assert_int_equal(tt_sched_submit(&s, 1, p1, 16, 12, NULL, err,
                                     sizeof err), 0);
    assert_int_equal(tt_sched_submit(&s, 2, p2, 16, max2, NULL, err,
                                     sizeof err), 0);
    if (sample)
        assert_int_equal(tt_sched_submit_sample(&s, 3, 2, p2, 16, max2, err,
                                                sizeof err), 0);
    struct rt_step st;
    rt_step_init(&st);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    tt_sched_validate(&s);
    assert_true(running(state_of(&s, 1)));
    int admitted = running(state_of(&s, 2));
    if (sample)
        assert_int_equal(running(state_of(&s, 3)), admitted);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    if (!admitted)
        assert_int_equal(pg.used, 11);
    complete_all(&s, &st);
    assert_int_equal(drain(&s, &st, 200), 2 + sample);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_trig_free(&t);
    kv_layout_free(&lay);
    return admitted;
}

/* A group of two reserves two decode bounds: 11 prompt pages + 4 (a
 * private page per row for the sample) + 2 x 12, beside request 1's 11
 * pages and 12 of headroom: 62 fit exactly. Counting one bound (50) would
 * admit it one page short. */
static void test_trig_group_bound(void **state)
{
    (void)state;
    assert_true(trig_admitted(62, 20, 1));
    assert_false(trig_admitted(61, 20, 1));
}

/* Request 2 asks for 3 tokens: its own bound is 4 pages (a page per row),
 * so 11 + 4 = 15 pages would fit beside request 1's 11 in a pool of 26;
 * request 1's headroom of 12 makes it 11 + 15 + 12 = 38. */
static void test_trig_headroom_isolated(void **state)
{
    (void)state;
    assert_true(trig_admitted(38, 3, 0));
    assert_false(trig_admitted(37, 3, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_samples_wait_for_slots),
        cmocka_unit_test(test_sample_pages_exact),
        cmocka_unit_test(test_reused_prefix_pages_exact),
        cmocka_unit_test(test_trig_group_bound),
        cmocka_unit_test(test_trig_headroom_isolated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
