/* test_link.c — the router's ZeroMQ link to the workers (rt_link) in
 * normal operation, against the fake workers of tests/support/tt_link.h:
 * configuration errors, Hello and readiness, plan round trips with per-rank
 * page deltas and row lengths (hand-made steps and real scheduler steps)
 * and propagation of a rank's error; the structured outputs' side channel
 * (GrammarCommand to rank 0 only, GrammarReport back to on_grammar, a
 * report from another rank a protocol fault). Faults (out-of-order answers, dead
 * workers, restarts, refused Hellos, garbage, Shutdown) are in
 * test_link_faults.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>
#include <zmq.h>

#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/link/rt_link.h"
#include "router/core/rt_sched.h"
#include "tests/support/tt_link.h"
#include "tests/support/tt_sched.h"
#include "worker.pb-c.h"

static char err[256];

/* ---- tests ------------------------------------------------------------- */



static void test_config_errors(void **state)
{
    (void)state;
    struct rt_link zero;
    memset(&zero, 0, sizeof zero);
    rt_link_close(&zero); /* safe on a zeroed link */
    assert_false(rt_link_ready(&zero));
    assert_int_equal(rt_link_shutdown(&zero, 0, NULL), TG_EINVAL);
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&zero, &m.s, err, sizeof err), TG_EINVAL);

    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    struct tt_link_env dummy = {0};
    struct rt_link link;
    struct rt_link_config c = tt_link_cfg(&dummy, 0);
    c.endpoint = "ipc:///tmp/tg-link-never.sock";
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    assert_non_null(strstr(err, "world_size"));
    rt_link_close(&link); /* safe after a failed init */
    c = tt_link_cfg(&dummy, 2);
    c.on_result = NULL;
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    c = tt_link_cfg(&dummy, 2);
    c.endpoint = "inproc://x";
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    assert_non_null(strstr(err, "ipc://"));
    c = tt_link_cfg(&dummy, 2);
    c.endpoint = "tcp://127.0.0.1:*";
    c.dead_ms = TT_LINK_HB_MS;
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    c = tt_link_cfg(&dummy, 2);
    c.layout.head_dim = 0;
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    c = tt_link_cfg(&dummy, 2);
    c.endpoint = "ipc:///nonexistent-dir-tg/x.sock";
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EIO);
    assert_non_null(strstr(err, "bind"));
    rt_link_close(&link);

    char ep[256];
    assert_int_equal(rt_link_default_endpoint("/run/x", ep, sizeof ep, err,
                                              sizeof err), 0);
    assert_string_equal(ep, "ipc:///run/x/router.sock");
    assert_int_equal(rt_link_default_endpoint(NULL, ep, sizeof ep, err,
                                              sizeof err), 0);
    assert_string_equal(ep, "ipc:///run/tangram/router.sock");
    char longdir[200];
    memset(longdir, 'a', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = '\0';
    assert_int_equal(rt_link_default_endpoint(longdir, ep, sizeof ep, err,
                                              sizeof err), TG_ETOOBIG);
    assert_int_equal(rt_link_default_endpoint("/r", ep, 10, err, sizeof err),
                     TG_ETOOBIG);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_hello_ready(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_new(2, NULL);
    assert_false(rt_link_ready(&e->link));
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_EAGAIN);
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    assert_true(TT_PUMP_UNTIL(e, rt_link_rank_alive(&e->link, 0), 2000));
    assert_false(rt_link_ready(&e->link));
    assert_int_equal(e->n_ready, 0);
    assert_int_equal(rt_link_min_pages(&e->link), 64);
    struct tt_hello_opts big = {.pages_total = 80};
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, &big);
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_int_equal(e->n_ready, 1);
    assert_int_equal(rt_link_min_pages(&e->link), 64);
    assert_false(rt_link_rank_alive(&e->link, 2));
    assert_false(rt_link_rank_alive(&e->link, -1));
    /* Heartbeats flow: the Hello ack plus several timer beats, and live
     * fakes are never declared dead. */
    tt_link_pump(e, 3 * TT_LINK_DEAD_MS);
    assert_true(e->fk[0].n_hb >= 5);
    assert_true(e->fk[1].n_hb >= 5);
    assert_int_equal(e->n_dead, 0);
    assert_true(rt_link_ready(&e->link));
    assert_int_equal(e->fk[0].n_shutdown + e->fk[1].n_shutdown, 0);
    /* Once the pools are sized, a smaller restarted worker is refused. */
    assert_int_equal(rt_link_require_pages(&e->link, 70), 0);
    assert_int_equal(rt_link_require_pages(&e->link, 10), 0); /* no lower */
    tt_fake_close(&e->fk[0]);
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "pages_total 64, the router "
                                                 "counts 70"));
    assert_int_equal(e->n_dead, 1); /* the old incarnation ended */
    assert_false(rt_link_ready(&e->link));
    assert_int_equal(rt_link_min_pages(&e->link), 80);
    tt_link_env_free(e);
}

static void test_plan_round_trip(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    /* An entry without sampling parameters or with row lengths past the
     * step's aborts the send: nothing leaves. */
    m.ent[1].sampling = NULL;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err),
                     TG_EINVAL);
    assert_non_null(strstr(err, "sampling"));
    tt_mini_step_make(&m, 1);
    m.s.n_row_lens = TT_LINK_L * TT_LINK_G; /* one rank's, for two */
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err),
                     TG_EINVAL);
    assert_non_null(strstr(err, "row lengths"));
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_in_flight(&e->link), 0);
    /* Bad steps are refused up front. */
    m.del[1].row = TT_LINK_L * TT_LINK_G;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_EINVAL);
    tt_mini_step_make(&m, 1);
    m.ent[1].slot = 2;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_EINVAL);
    tt_mini_step_make(&m, 1);
    m.t1[0] = -1;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_EINVAL);
    tt_mini_step_make(&m, 1);
    m.s.n_ids = 5;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_EINVAL);
    tt_link_pump(e, 20);
    assert_int_equal(e->fk[0].n_plans + e->fk[1].n_plans, 0);

    /* Hold the answers to see the step in flight. */
    e->fk[0].answer = e->fk[1].answer = TT_ANSWER_NONE;
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_int_equal(rt_link_in_flight(&e->link), 1);
    struct tt_mini_step m2;
    tt_mini_step_make(&m2, 2);
    assert_int_equal(rt_link_send_plan(&e->link, &m2.s, err, sizeof err), TG_EBUSY);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_plans && e->fk[1].n_plans, 2000));
    tt_mini_plan_check(&e->fk[0], 1);
    tt_mini_plan_check(&e->fk[1], 1);
    /* Rank 1 alone does not complete the step. */
    tt_fake_answer(&e->fk[1], e->fk[1].plan->plan);
    tt_link_pump(e, 30);
    assert_int_equal(e->n_result, 0);
    tt_fake_answer(&e->fk[0], e->fk[0].plan->plan);
    assert_true(TT_PUMP_UNTIL(e, e->n_result == 1, 2000));
    assert_true(e->res_ok);
    assert_string_equal(e->res_error, "");
    assert_int_equal(e->res_step, 1);
    assert_int_equal(e->res_n, 3);
    assert_int_equal(e->res_tokens[0], 102);
    assert_int_equal(e->res_tokens[1], 100);
    assert_int_equal(e->res_tokens[2], -1);
    assert_int_equal(e->res_top0, 2);
    assert_int_equal(e->res_top_id1, 7);
    assert_float_equal(e->res_seconds, 0.02, 1e-12);
    assert_int_equal(rt_link_in_flight(&e->link), 0);

    /* Step ids must grow. */
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_EINVAL);
    /* Answered automatically from now on. */
    e->fk[0].answer = e->fk[1].answer = TT_ANSWER_OK;
    assert_true(tt_link_round_trip(e, 2));
    assert_true(tt_link_round_trip(e, 7)); /* gaps in ids are fine */
    tt_mini_plan_check(&e->fk[1], 7);
    assert_int_equal(e->n_dead, 0);
    assert_int_equal(e->link.n_results, 3);
    tt_link_env_free(e);
}

static void test_grammar_channel(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_new(2, NULL);
    const struct rt_link_gprep prep[2] = {{.id = 5, .spec = "{\"a\":1}"},
                                          {.id = 6, .spec = "{}"}};
    const uint64_t rel[1] = {3};
    /* Not before the group is ready. */
    assert_int_equal(
        rt_link_send_grammar(&e->link, prep, 2, rel, 1, err, sizeof err),
        TG_EAGAIN);
    for (int r = 0; r < 2; r++)
        tt_fake_open(&e->fk[r], e->zctx, e->endpoint, r, NULL);
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_int_equal(
        rt_link_send_grammar(&e->link, NULL, 0, NULL, 0, err, sizeof err),
        0); /* nothing to send */
    assert_int_equal(
        rt_link_send_grammar(&e->link, prep, 2, rel, 1, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_gcmd == 1, 2000));
    assert_int_equal(e->fk[0].n_gprep, 2);
    assert_true(e->fk[0].gprep_id[0] == 5 && e->fk[0].gprep_id[1] == 6);
    assert_string_equal(e->fk[0].gprep_spec[0], "{\"a\":1}");
    assert_int_equal(e->fk[0].n_grel, 1);
    assert_true(e->fk[0].grel[0] == 3);
    /* Sent while a step is in flight too; rank 1 never gets one. */
    e->fk[0].answer = e->fk[1].answer = TT_ANSWER_NONE;
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_int_equal(
        rt_link_send_grammar(&e->link, NULL, 0, rel, 1, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_gcmd == 2, 2000));
    assert_int_equal(e->fk[0].n_gprep, 0);
    assert_int_equal(e->fk[1].n_gcmd, 0);
    /* Rank 0's answers reach on_grammar, in order. */
    tt_fake_grammar_ready(&e->fk[0], 6, 1, 0, NULL);
    tt_fake_grammar_ready(&e->fk[0], 5, 0, 1, "queue full");
    assert_true(TT_PUMP_UNTIL(e, e->n_gready == 2, 2000));
    assert_true(e->gready[0].id == 6 && e->gready[0].ok);
    assert_string_equal(e->gready[0].error, "");
    assert_true(e->gready[1].id == 5 && !e->gready[1].ok && e->gready[1].busy);
    assert_string_equal(e->gready[1].error, "queue full");
    assert_int_equal(e->n_dead, 0);
    /* A report from rank 1 breaks the protocol: rank 1 is dead. */
    tt_fake_grammar_ready(&e->fk[1], 7, 1, 0, NULL);
    assert_true(TT_PUMP_UNTIL(e, e->n_dead >= 1, 2000));
    assert_int_equal(e->n_gready, 2);
    tt_link_env_free(e);
}

static void test_rank_error(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    e->fk[1].answer = TT_ANSWER_FAIL;
    assert_false(tt_link_round_trip(e, 1));
    assert_non_null(strstr(e->res_error, "rank 1: boom"));
    assert_int_equal(e->res_tokens[0], -1); /* no tokens on failure */
    assert_int_equal(e->n_dead, 0);
    assert_true(rt_link_ready(&e->link));
    e->fk[1].answer = TT_ANSWER_OK;
    assert_true(tt_link_round_trip(e, 2));
    /* Rank 0's tokens must match the sampled entries one to one. */
    e->fk[0].answer = TT_ANSWER_EXTRA;
    assert_false(tt_link_round_trip(e, 3));
    assert_non_null(strstr(e->res_error, "slot 1, which was not to be "
                                         "sampled"));
    assert_int_equal(e->res_tokens[0], -1);
    e->fk[0].answer = TT_ANSWER_VOCAB;
    assert_false(tt_link_round_trip(e, 4));
    assert_non_null(strstr(e->res_error, "outside the vocabulary"));
    assert_int_equal(e->n_dead, 0);
    e->fk[0].answer = TT_ANSWER_OK;
    assert_true(tt_link_round_trip(e, 5));
    /* A slot error fails that entry alone: the step is ok, the entry has
     * no token and carries the worker's text, the others have theirs. */
    e->fk[0].answer = TT_ANSWER_SLOT_ERROR;
    assert_true(tt_link_round_trip(e, 6));
    int errs = 0, toks = 0;
    for (int32_t i = 0; i < e->res_n; i++) {
        if (e->res_entry_error[i][0]) {
            assert_string_equal(e->res_entry_error[i], "bad top_p");
            assert_int_equal(e->res_tokens[i], -1);
            errs++;
        } else if (e->res_tokens[i] >= 0) {
            toks++;
        }
    }
    assert_int_equal(errs, 1);
    assert_true(toks >= 1);
    /* A token and a slot error for one entry is a broken answer. */
    e->fk[0].answer = TT_ANSWER_SLOT_TWICE;
    assert_false(tt_link_round_trip(e, 7));
    assert_non_null(strstr(e->res_error, "answered twice"));
    for (int32_t i = 0; i < e->res_n; i++)
        assert_string_equal(e->res_entry_error[i], "");
    e->fk[0].answer = TT_ANSWER_OK;
    assert_true(tt_link_round_trip(e, 8));
    assert_int_equal(e->n_dead, 0);
    tt_link_env_free(e);
}

/* Prompt log-probabilities: what an entry asks reaches the workers
 * (prompt_logprobs, prompt_top, next_token), rank 0's records come back
 * by entry, and a record of the wrong shape, or a missing one, fails the
 * step. */
static void test_prompt_logprobs(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    e->fk[0].answer = e->fk[1].answer = TT_ANSWER_PLP;
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    /* entry 0: prefill of 3 at 4 with the next prompt token; entry 2:
     * prefill of 2 at 0, the prompt's end (no next token) */
    m.ent[0].prompt_lp = 1;
    m.ent[0].prompt_top = 2;
    m.ent[0].lp_next = 55;
    m.ent[2].prompt_lp = 1;
    m.ent[2].prompt_top = 0;
    m.ent[2].lp_next = -1;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->n_result == 1, 2000));
    assert_true(e->res_ok);
    const Tangram__Worker__V1__PlanEntry *pe = e->fk[1].plan->plan->entries[0];
    assert_true(pe->prompt_logprobs);
    assert_int_equal(pe->prompt_top, 2);
    assert_int_equal(
        pe->next_token_opt_case,
        TANGRAM__WORKER__V1__PLAN_ENTRY__NEXT_TOKEN_OPT_NEXT_TOKEN);
    assert_int_equal(pe->next_token, 55);
    assert_int_equal(e->res_plp_first[0], 5);
    assert_int_equal(e->res_plp_n[0], 3);
    assert_float_equal(e->res_plp_lp_last[0], -7.5f, 0);
    assert_int_equal(e->res_plp_top_last[0], 11);
    assert_int_equal(e->res_plp_first[1], -1); /* did not ask */
    assert_int_equal(e->res_plp_first[2], 1);
    assert_int_equal(e->res_plp_n[2], 1);
    /* A bad entry is refused before anything leaves. */
    tt_mini_step_make(&m, 2);
    m.ent[1].prompt_lp = 1; /* a decode entry */
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err),
                     TG_EINVAL);
    m.ent[1].prompt_lp = 0;
    m.ent[0].prompt_lp = 1;
    m.ent[0].prompt_top = 21;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err),
                     TG_EINVAL);
    /* A record of the wrong shape, or none, fails the step. */
    e->fk[0].answer = TT_ANSWER_PLP_SHORT;
    tt_mini_step_make(&m, 3);
    m.ent[0].prompt_lp = 1;
    m.ent[0].lp_next = 55;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->n_result == 2, 2000));
    assert_false(e->res_ok);
    assert_non_null(strstr(e->res_error, "wrong shape"));
    assert_int_equal(e->res_plp_first[0], -1);
    e->fk[0].answer = TT_ANSWER_PLP_NONE;
    tt_mini_step_make(&m, 4);
    m.ent[0].prompt_lp = 1;
    m.ent[0].lp_next = -1;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->n_result == 3, 2000));
    assert_false(e->res_ok);
    assert_non_null(strstr(e->res_error, "of 1 chunks"));
    e->fk[0].answer = TT_ANSWER_OK;
    assert_true(tt_link_round_trip(e, 5));
    assert_int_equal(e->n_dead, 0);
    tt_link_env_free(e);
}

/* Per-head lengths: the Hello's flag is the group's (a rank that differs
 * is refused), a fresh entry's head lengths and a row cut reach each rank
 * as its own, and every rank's head-length reports come back by entry,
 * while a report for a slot without an entry, with the wrong count, or
 * from a worker that keeps none fails the step. */
static void test_head_lens(void **state)
{
    (void)state;
    /* Whole rows: a report is a broken answer. */
    struct tt_link_env *e = tt_link_env_ready(2);
    assert_false(rt_link_per_head(&e->link));
    e->fk[0].answer = e->fk[1].answer = TT_ANSWER_HEADS;
    assert_false(tt_link_round_trip(e, 1));
    assert_non_null(strstr(e->res_error, "keeps none"));
    assert_int_equal(e->res_n_heads, 0);
    tt_link_env_free(e);

    e = tt_link_env_new(2, NULL);
    struct tt_hello_opts ph = {.per_head = 1};
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &ph);
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, &ph);
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_true(rt_link_per_head(&e->link));

    /* The plan: entry 0 adopts KV with each rank's head lengths, and
     * rank 0's row 3 is cut to one page before its ids. */
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    for (int k = 0; k < 2 * TT_LINK_HEADS; k++)
        m.head_lens[k] = 50 + k;
    m.s.n_heads = TT_LINK_HEADS;
    m.s.head_lens = m.head_lens;
    m.s.n_head_lens = 2 * TT_LINK_HEADS;
    m.ent[0].has_head_lens = 1;
    m.ent[2].has_head_lens = 1; /* without row lengths: refused */
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err),
                     TG_EINVAL);
    assert_non_null(strstr(err, "head lengths"));
    m.ent[2].has_head_lens = 0;
    m.del[0].has_truncate = 1;
    m.del[0].truncate_to = 1;
    e->fk[0].answer = e->fk[1].answer = TT_ANSWER_HEADS;
    int before = e->n_result;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->n_result > before, 2000));
    assert_true(e->res_ok);
    for (int r = 0; r < 2; r++) {
        const Tangram__Worker__V1__BatchPlan *p = e->fk[r].plan->plan;
        const Tangram__Worker__V1__PlanEntry *e0 = p->entries[0];
        assert_int_equal(e0->n_head_lens, TT_LINK_HEADS);
        for (int k = 0; k < TT_LINK_HEADS; k++)
            assert_int_equal(e0->head_lens[k], 50 + r * TT_LINK_HEADS + k);
        assert_int_equal(p->entries[1]->n_head_lens, 0);
        assert_int_equal(p->entries[2]->n_head_lens, 0);
        const Tangram__Worker__V1__PageDelta *a = p->page_deltas[0];
        if (r == 0) {
            assert_int_equal(a->truncate_to_opt_case,
                TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT_TRUNCATE_TO);
            assert_int_equal(a->truncate_to, 1);
            assert_int_equal(a->n_page_ids, 2);
        } else {
            assert_int_equal(a->truncate_to_opt_case,
                TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT__NOT_SET);
        }
    }
    /* Two prefill entries (slots 2 and 1) on two ranks. */
    assert_int_equal(e->res_n_heads, 4);
    assert_int_equal(e->res_heads_rank_mask, 3);
    assert_int_equal(e->res_heads_sum, 1064);

    e->fk[1].answer = TT_ANSWER_HEADS_COUNT;
    assert_false(tt_link_round_trip(e, 2));
    assert_non_null(strstr(e->res_error, "rank 1: 3 head lengths"));
    assert_int_equal(e->res_n_heads, 0);
    e->fk[1].answer = TT_ANSWER_HEADS_SLOT;
    assert_false(tt_link_round_trip(e, 3));
    assert_non_null(strstr(e->res_error, "slot 9, which has no entry"));
    e->fk[1].answer = TT_ANSWER_HEADS;
    assert_true(tt_link_round_trip(e, 4));
    assert_int_equal(e->res_n_heads, 4);
    assert_int_equal(e->n_dead, 0);

    /* A restarted rank keeping whole rows does not fit the group. */
    tt_fake_close(&e->fk[1]);
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    assert_true(TT_PUMP_UNTIL(e, e->fk[1].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[1].last_reason,
                           "per_head_lens 0, the group's is 1"));
    tt_link_env_free(e);
}

/* ---- with the real scheduler ------------------------------------------ */

struct sched_fix {
    struct kv_layout lay;
    struct rt_sched s;
    struct rt_step step;
};

/* Checks that rank r's plan carries exactly the scheduler's deltas of rank
 * r, and row lengths equal to the rank's filled counts for a fresh entry
 * at pos > 0. */
static void check_sched_plan(const struct tt_fake *fk, struct sched_fix *f)
{
    const Tangram__Worker__V1__BatchPlan *p = fk->plan->plan;
    assert_int_equal(p->step_id, f->step.step_id);
    assert_int_equal(p->n_entries, (size_t)f->step.n_entries);
    size_t k = 0;
    for (int64_t i = 0; i < f->step.n_deltas; i++) {
        const struct rt_step_delta *d = &f->step.deltas[i];
        if (d->rank != fk->rank)
            continue;
        assert_true(k < p->n_page_deltas);
        const Tangram__Worker__V1__PageDelta *pd = p->page_deltas[k++];
        assert_int_equal(pd->slot, f->step.entries[d->entry].slot);
        assert_int_equal(pd->layer * TT_LINK_G + pd->group, d->row);
        assert_int_equal(pd->n_page_ids, d->n);
        for (int32_t j = 0; j < d->n; j++)
            assert_int_equal(pd->page_ids[j], f->step.delta_ids[d->off + j]);
    }
    assert_int_equal(k, p->n_page_deltas);
    for (int32_t i = 0; i < f->step.n_entries; i++) {
        const struct rt_step_entry *se = &f->step.entries[i];
        const Tangram__Worker__V1__PlanEntry *pe = p->entries[i];
        assert_int_equal(pe->slot, se->slot);
        assert_int_equal(pe->start_pos, se->pos);
        /* the step carries the request's own parameters, set at submit */
        char rid[32];
        snprintf(rid, sizeof rid, "req-%llu", (unsigned long long)se->id);
        assert_string_equal(pe->request_id, rid);
        assert_int_equal(pe->seed, 7000u + se->id);
        assert_int_equal(pe->sampling->top_k, (int32_t)se->id);
        assert_int_equal(pe->sampling->n_top, se->id % 3);
        assert_float_equal(pe->sampling->temperature,
                           0.25f * (float)(se->id % 4), 0);
        struct rt_sched_req_info info;
        assert_int_equal(rt_sched_req_info(&f->s, se->id, &info), 0);
        assert_int_equal(pe->num_prompt_tokens, info.prompt_tokens);
        if (se->fresh && se->pos > 0) {
            const struct kv_seq *q = rt_sched_req_seq(&f->s, se->id,
                                                      fk->rank);
            assert_non_null(q);
            assert_int_equal(pe->n_row_lens, TT_LINK_L * TT_LINK_G);
            for (int r = 0; r < TT_LINK_L * TT_LINK_G; r++)
                assert_int_equal(pe->row_lens[r], q->filled[r]);
        } else {
            assert_int_equal(pe->n_row_lens, 0);
        }
    }
}

static void sched_step(struct tt_link_env *e, struct sched_fix *f,
                       int expect_fresh)
{
    assert_int_equal(rt_sched_plan(&f->s, &f->step, err, sizeof err), 0);
    assert_true(f->step.n_entries >= 1);
    int fresh_adopt = 0;
    for (int32_t i = 0; i < f->step.n_entries; i++)
        fresh_adopt |= f->step.entries[i].fresh && f->step.entries[i].pos > 0;
    assert_int_equal(fresh_adopt, expect_fresh);
    int before = e->n_result, p0 = e->fk[0].n_plans, p1 = e->fk[1].n_plans;
    e->fk[0].answer = e->fk[1].answer = TT_ANSWER_NONE;
    assert_int_equal(rt_link_send_plan(&e->link, &f->step, err, sizeof err),
                     0);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_plans > p0 && e->fk[1].n_plans > p1,
                              2000));
    check_sched_plan(&e->fk[0], f);
    check_sched_plan(&e->fk[1], f);
    tt_fake_answer(&e->fk[0], e->fk[0].plan->plan);
    tt_fake_answer(&e->fk[1], e->fk[1].plan->plan);
    assert_true(TT_PUMP_UNTIL(e, e->n_result > before, 2000));
    assert_true(e->res_ok);
    /* on_result's token array is what rt_sched_complete takes. */
    assert_int_equal(rt_sched_complete(&f->s, &f->step, e->res_tokens, NULL,
                                       err, sizeof err), 0);
    assert_int_equal(rt_sched_validate(&f->s, err, sizeof err), 0);
}

static void test_with_scheduler(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    struct sched_fix *f = calloc(1, sizeof *f);
    assert_non_null(f);
    const double budget[TT_LINK_L * TT_LINK_G] = {1.0, 0.5, 0.25, 0.75};
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    assert_int_equal(kv_layout_init(&f->lay, TT_LINK_L, TT_LINK_G, 1, 8, 4, 8,
                                    &rule, budget, err, sizeof err), 0);
    struct rt_sched_config sc = {.layout = &f->lay, .n_ranks = 2,
        .pages_per_rank = 64, .max_num_seqs = 4, .max_batched_tokens = 64,
        .max_queued = 8, .debug_track = 1};
    assert_int_equal(rt_sched_init(&f->s, &sc, err, sizeof err), 0);
    rt_step_init(&f->step);

    /* Turn 1: 12 tokens (two chunks), 2 generated tokens, stored. */
    int32_t prompt[24];
    for (int i = 0; i < 24; i++)
        prompt[i] = 10 + i;
    assert_int_equal(tt_sched_submit(&f->s, 1, prompt, 12, 2, "conv", err,
                                     sizeof err), 0);
    sched_step(e, f, 0); /* chunk 1 */
    sched_step(e, f, 0); /* chunk 2, samples */
    sched_step(e, f, 0); /* decode, ends on max_tokens */
    /* Turn 2 re-sends the history (prompt + its tokens) plus new text: the
     * stored KV is adopted by a fresh slot at pos > 0. */
    int32_t turn2[24];
    memcpy(turn2, prompt, 12 * sizeof *turn2);
    turn2[12] = 100 + 0; /* the fakes sample 100 + slot; slot 0 */
    turn2[13] = 100 + 0;
    for (int i = 14; i < 20; i++)
        turn2[i] = 50 + i;
    assert_int_equal(tt_sched_submit(&f->s, 2, turn2, 20, 1, "conv", err,
                                     sizeof err), 0);
    sched_step(e, f, 1);
    struct rt_sched_stats st;
    rt_sched_get_stats(&f->s, &st);
    assert_true(st.cached_prompt_tokens > 0);

    rt_step_free(&f->step);
    rt_sched_free(&f->s);
    kv_layout_free(&f->lay);
    free(f);
    tt_link_env_free(e);
}

int main(void)
{
    tg_log_init("router", -1, TG_LOG_ERR, TG_LOG_TEXT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_hello_ready),
        cmocka_unit_test(test_plan_round_trip),
        cmocka_unit_test(test_grammar_channel),
        cmocka_unit_test(test_rank_error),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_head_lens),
        cmocka_unit_test(test_with_scheduler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
