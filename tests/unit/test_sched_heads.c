/* test_sched_heads.c — the scheduler with per-head lengths (rt_sched.h,
 * "Per-head lengths"; an adaptive method such as gvote): a reported chunk
 * commits through kv_seq_commit_heads, its unused reservation is counted
 * in rt_sched_pages.released and the worker's row is cut by the request's
 * next delta; reports that do not fit are protocol errors with nothing
 * changed; an unreported chunk is the predicted one; a stored conversation
 * is adopted with its heads, and a rewind restores the heads of its
 * boundary. Fixture: tests/support/tt_sched.h with head maps added. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "router/core/rt_sched.h"
#include "tests/support/tt_sched.h"

static char err[256];

/* Completes the outstanding step with token 500 for every sampled entry
 * and the given reports. */
static int complete(struct rt_sched *s, struct rt_step *st,
                    const struct rt_step_heads *h, int32_t n)
{
    int32_t tok[16];
    for (int i = 0; i < 16; i++)
        tok[i] = 500;
    return rt_sched_complete_heads(s, st, tok, NULL, h, n, err, sizeof err);
}

static void test_commit_and_cut(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_head_layout(&lay);
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 64, 4, 64, 8);
    cfg.per_head = 1;
    struct rt_sched s;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof err), 0);
    struct rt_step st;
    rt_step_init(&st);
    int32_t p[32];
    tt_sched_fill(p, 32, 10);
    assert_int_equal(tt_sched_submit(&s, 1, p, 16, 3, "conv", err,
                                     sizeof err), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    assert_int_equal(st.n_entries, 1);
    assert_int_equal(st.n_heads, 4);
    const struct kv_seq *q = rt_sched_req_seq(&s, 1, 0);
    assert_non_null(q->head_len);
    /* Chunk 1 keeps at most 8, 4, 3 and 6 in rows 0 .. 3 (reserved for
     * both chunks: 16, 8, 6, 12 tokens; 4, 2, 2, 3 pages). */
    assert_int_equal(q->n_pages[3], 3);
    /* Reports that do not fit: a head over its reservation, the wrong
     * count, an entry that does not exist. Nothing changes. */
    int32_t over[4] = {8, 5, 3, 1}, good[4] = {8, 2, 3, 1};
    struct rt_step_heads h = {.entry = 0, .rank = 0, .head_lens = over,
                              .n = 4};
    assert_int_equal(complete(&s, &st, &h, 1), TG_EPROTO);
    assert_non_null(strstr(err, "rank 0, slot 0 (request req-1)"));
    h.head_lens = good;
    h.n = 3;
    assert_int_equal(rt_sched_check_heads(&s, &st, &h, 1, err, sizeof err),
                     TG_EPROTO);
    h.n = 4;
    h.entry = 1;
    assert_int_equal(rt_sched_check_heads(&s, &st, &h, 1, err, sizeof err),
                     TG_EPROTO);
    struct rt_step_heads twice[2] = {{.entry = 0, .head_lens = good, .n = 4},
                                     {.entry = 0, .head_lens = good, .n = 4}};
    assert_int_equal(rt_sched_check_heads(&s, &st, twice, 2, err, sizeof err),
                     TG_EPROTO);
    assert_non_null(strstr(err, "twice"));
    assert_int_equal(q->committed, 0);
    /* Head 3 (row 3) kept 1 of 6: its reservation 12 -> 7 tokens, one of
     * three pages back. */
    h.entry = 0;
    assert_int_equal(complete(&s, &st, &h, 1), 0);
    q = rt_sched_req_seq(&s, 1, 0);
    assert_int_equal(q->filled[3], 1);
    assert_int_equal(q->tokens[3], 7);
    assert_int_equal(q->n_pages[3], 2);
    assert_memory_equal(q->head_len, good, sizeof good);
    struct rt_sched_pages pg;
    rt_sched_rank_pages(&s, 0, &pg);
    assert_int_equal(pg.released, 1);
    tt_sched_validate(&s);

    /* The next chunk's entry cuts the worker's row 3 to 2 pages first. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    assert_int_equal(st.n_entries, 1);
    int cuts = 0;
    for (int64_t i = 0; i < st.n_deltas; i++) {
        const struct rt_step_delta *d = &st.deltas[i];
        if (d->has_truncate) {
            cuts++;
            assert_int_equal(d->row, 3);
            assert_int_equal(d->truncate_to, 2);
            assert_int_equal(d->first, 2);
            assert_int_equal(d->n, 0);
        }
    }
    assert_int_equal(cuts, 1);
    /* No report: the predicted chunk (every head adds its row's keep; the
     * second chunk at position 8 keeps 8, 4, 2, 6 with no sink in it). */
    assert_int_equal(complete(&s, &st, NULL, 0), 0);
    q = rt_sched_req_seq(&s, 1, 0);
    int32_t two[4] = {16, 6, 5, 7};
    assert_memory_equal(q->head_len, two, sizeof two);
    /* A decode entry cannot carry a report. */
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    assert_int_equal(st.entries[0].kind, RT_STEP_DECODE);
    h.head_lens = two;
    assert_int_equal(complete(&s, &st, &h, 1), TG_EPROTO);
    assert_non_null(strstr(err, "decode"));
    assert_int_equal(complete(&s, &st, NULL, 0), 0);
    assert_int_equal(tt_sched_run_until_done(&s, &st, 1, 10, NULL),
                     RT_SCHED_END_LENGTH);
    tt_sched_validate(&s);

    /* The conversation goes on: the stored KV is adopted with its heads
     * (16 prompt + 2 fed back decode tokens in every head). */
    int32_t held[4] = {18, 8, 7, 9};
    int32_t t2[32];
    memcpy(t2, p, 16 * sizeof(int32_t));
    t2[16] = t2[17] = t2[18] = 500;
    tt_sched_fill(t2 + 19, 5, 900);
    assert_int_equal(tt_sched_submit(&s, 2, t2, 24, 1, "conv", err,
                                     sizeof err), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    assert_int_equal(st.entries[0].pos, 18);
    assert_true(st.entries[0].has_head_lens);
    assert_memory_equal(st.head_lens + st.entries[0].head_lens_off, held,
                        sizeof held);
    assert_int_equal(complete(&s, &st, NULL, 0), 0);
    tt_sched_validate(&s);

    /* A prompt that leaves the conversation after 10 tokens rewinds it to
     * its boundary at 8: heads {8, 2, 3, 1}, as reported then. */
    int32_t t3[32];
    memcpy(t3, p, 10 * sizeof(int32_t));
    tt_sched_fill(t3 + 10, 6, 3000);
    assert_int_equal(tt_sched_submit(&s, 3, t3, 16, 1, "conv", err,
                                     sizeof err), 0);
    assert_int_equal(rt_sched_plan(&s, &st, err, sizeof err), 0);
    assert_int_equal(st.entries[0].id, 3);
    assert_int_equal(st.entries[0].pos, 8);
    assert_true(st.entries[0].has_head_lens);
    assert_memory_equal(st.head_lens + st.entries[0].head_lens_off, good,
                        sizeof good);
    int32_t rows[4] = {8, 2, 3, 1};
    assert_memory_equal(st.row_lens + st.entries[0].row_lens_off, rows,
                        sizeof rows);
    assert_int_equal(complete(&s, &st, NULL, 0), 0);
    tt_sched_validate(&s);
    rt_step_free(&st);
    rt_sched_free(&s);
    kv_layout_free(&lay);
}

/* per_head needs head maps on every rank's layout. */
static void test_needs_head_maps(void **state)
{
    (void)state;
    struct kv_layout lay;
    tt_sched_layout(&lay, 0);
    struct rt_sched_config cfg = tt_sched_cfg(&lay, 1, 64, 4, 64, 8);
    cfg.per_head = 1;
    struct rt_sched s;
    assert_int_equal(rt_sched_init(&s, &cfg, err, sizeof err), TG_EINVAL);
    assert_non_null(strstr(err, "head maps"));
    kv_layout_free(&lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_and_cut),
        cmocka_unit_test(test_needs_head_maps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
