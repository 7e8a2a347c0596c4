/* test_sched_trig.c — decode-time compression in common/kv and the
 * scheduler (rt_sched.h, "Decode-time compression"; DESIGN.md §4.9): the
 * caps and decode bound of kv_trig, kv_seq_compact_heads, the submit-time
 * bound check, admission keeping the running requests' headroom, and the
 * trigger reports (a report off a trigger step or off the cap rule is a
 * protocol error with nothing changed; a good one gives pages back and the
 * worker's row is cut by the next delta). Fixture: tests/support/tt_sched.h
 * with head maps (tt_sched_head_layout, tt_sched_trig_caps). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_seq.h"
#include "common/kv/kv_trig.h"
#include "common/base/tg_err.h"
#include "router/core/rt_sched.h"
#include "tests/support/tt_sched.h"

static char err[256];

static void test_caps_common(void **state)
{
    (void)state;
    double b[4] = {1.0, 0.5, 0.25, 0.25}; /* mean 0.5 */
    int32_t cap[4];
    assert_int_equal(kv_trig_caps_mean(b, 4, 0.5, 100, 32, 0, cap), 0);
    assert_int_equal(cap[0], 200);
    assert_int_equal(cap[1], 100);
    assert_int_equal(cap[2], 50);
    assert_int_equal(kv_trig_caps_mean(b, 4, 0.5, 40, 32, 0, cap), 0);
    assert_int_equal(cap[2], 36); /* F = 4 + 32 */
    assert_int_equal(kv_trig_caps_mean(b, 4, 0.5, 35, 32, 0, cap), TG_EINVAL);
    struct kv_trig_opts o = {1, 11, 0, 4, 8};
    assert_int_equal(kv_trig_opts_check(&o, err, sizeof err), TG_EINVAL);
    assert_non_null(strstr(err, "--decode-budget"));
    o.budget = 12;
    o.every = 0;
    assert_int_equal(kv_trig_opts_check(&o, err, sizeof err), TG_EINVAL);
    assert_non_null(strstr(err, "--decode-every"));
    struct kv_trig t;
    tt_sched_trig_caps(&t);
    assert_int_equal(kv_trig_row_bound(&t, 1, 1, 100), 9);
    assert_int_equal(kv_trig_row_bound(&t, 1, 1, 7), 7);
    assert_int_equal(kv_trig_decode_pages(&t, 4, 100), 4 * 3);
    assert_int_equal(kv_trig_head_after(&t, 0, 0, 10, 18), 15);
    assert_int_equal(kv_trig_head_after(&t, 0, 0, 10, 14), 14);
    kv_trig_free(&t);
    kv_trig_free(&t); /* safe twice */
}

static int complete(struct rt_sched *s, struct rt_step *st,
                    const struct rt_step_heads *h, int32_t n)
{
    int32_t tok[16];
    for (int i = 0; i < 16; i++)
        tok[i] = 500;
    return rt_sched_complete_heads(s, st, tok, NULL, h, n, err, sizeof err);
}

static void test_submit_and_headroom(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_head_layout(&lay);
    struct kv_trig t;
    tt_sched_trig_caps(&t);
    const struct kv_trig *tp[1] = {&t};
    /* The prompt of 16 takes 4 + 2 + 2 + 3 = 11 pages; the decode bound
     * 4 rows x ceil(9 / 4) = 12 more. */
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 14, 4, 64, 8);
    cfg.per_head = 1;
    cfg.trig = tp;
    struct rt_sched s;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof err), 0);
    assert_true(rt_sched_max_tokens(&s) == INT64_MAX);
    int32_t p[16];
    tt_sched_fill(p, 16, 10);
    assert_int_equal(tt_sched_submit(&s, 1, p, 16, 1000, NULL, err,
                                     sizeof err), TG_ETOOBIG);
    assert_non_null(strstr(err, "compressed decode"));
    rt_sched_free(&s);
    /* Without per-head lengths trig is refused. */
    cfg.per_head = 0;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof err), TG_EINVAL);
    /* A pool of 30: the first fits (23), the second waits for the first's
     * headroom (30 - 11 - 12 = 7 < 23) although 19 pages are free. */
    cfg = tt_sched_cfg(&lay, 1, 30, 4, 64, 8);
    cfg.per_head = 1;
    cfg.trig = tp;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof err), 0);
    assert_int_equal(tt_sched_submit(&s, 1, p, 16, 1000, NULL, err,
                                     sizeof err), 0);
    assert_int_equal(tt_sched_submit(&s, 2, p, 16, 1000, NULL, err,
                                     sizeof err), 0);
    struct rt_step st;
    rt_step_init(&st);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    assert_int_equal(st.n_entries, 1);
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&s, 2, &info), 0);
    assert_int_equal(info.state, RT_SCHED_WAITING);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.used, 11);
    assert_int_equal(complete(&s, &st, NULL, 0), 0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_trig_free(&t);
    kv_layout_free(&lay);
}

static void test_trigger_reports(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_head_layout(&lay);
    struct kv_trig t;
    tt_sched_trig_caps(&t);
    const struct kv_trig *tp[1] = {&t};
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 64, 4, 64, 8);
    cfg.per_head = 1;
    cfg.trig = tp;
    struct rt_sched s;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof err), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t p[16];
    tt_sched_fill(p, 16, 10);
    assert_int_equal(tt_sched_submit(&s, 1, p, 16, 40, "c", err, sizeof err),
                     0);
    /* Two prefill chunks, then decode. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
        assert_int_equal(st.entries[0].kind, RT_STEP_PREFILL);
        assert_int_equal(complete(&s, &st, NULL, 0), 0);
    }
    const struct kv_seq *q = rt_sched_req_seq(&s, 1, 0);
    int32_t start[4];
    memcpy(start, q->head_len, sizeof start);
    int32_t after[4];
    for (int k = 1; k <= 8; k++) {
        assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
        assert_int_equal(st.entries[0].kind, RT_STEP_DECODE);
        q = rt_sched_req_seq(&s, 1, 0);
        memcpy(after, q->head_len, sizeof after);
        struct rt_step_heads h = {.entry = 0, .rank = 0, .head_lens = after,
                                  .n = 4};
        if (k < 4) {
            /* Not a trigger step: any report is a protocol error. */
            assert_int_equal(complete(&s, &st, &h, 1), TG_EPROTO);
            assert_non_null(strstr(err, "compacts nothing"));
            assert_int_equal(complete(&s, &st, NULL, 0), 0);
            continue;
        }
        if (k == 4) {
            /* Regions of 4 <= cap 5: the report is the heads as they are. */
            assert_int_equal(complete(&s, &st, &h, 1), 0);
            continue;
        }
        if (k < 8) {
            assert_int_equal(complete(&s, &st, NULL, 0), 0);
            continue;
        }
        /* Regions of 8 > 5: each head keeps dstart + 5. A report off the
         * rule is refused with nothing changed. */
        for (int i = 0; i < 4; i++)
            after[i] = start[i] + 6;
        assert_int_equal(complete(&s, &st, &h, 1), TG_EPROTO);
        assert_non_null(strstr(err, "its cap leaves"));
        assert_int_equal(rt_sched_req_seq(&s, 1, 0)->head_len[0],
                         start[0] + 8);
        struct rt_sched_pages before;
        rt_sched_rank_pages(&s, 0, &before);
        for (int i = 0; i < 4; i++)
            after[i] = start[i] + 5;
        assert_int_equal(complete(&s, &st, &h, 1), 0);
        struct rt_sched_pages pg;
        rt_sched_rank_pages(&s, 0, &pg);
        assert_true(pg.released > before.released);
        assert_int_equal(pg.used, before.used - (pg.released -
                                                 before.released));
        q = rt_sched_req_seq(&s, 1, 0);
        assert_int_equal(q->head_len[2], start[2] + 5);
        tt_sched_validate(&s);
    }
    /* The next entry cuts the rows that gave pages back. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    int cuts = 0;
    for (int64_t i = 0; i < st.n_deltas; i++)
        cuts += st.deltas[i].has_truncate;
    assert_true(cuts > 0);
    assert_int_equal(complete(&s, &st, NULL, 0), 0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_trig_free(&t);
    kv_layout_free(&lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caps_common),
        cmocka_unit_test(test_submit_and_headroom),
        cmocka_unit_test(test_trigger_reports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
