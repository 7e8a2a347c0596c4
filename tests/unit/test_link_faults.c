/* test_link_faults.c — the router's ZeroMQ link to the workers (rt_link)
 * when things go wrong, against the fake workers of tests/support/tt_link.h:
 * out-of-order answers, dead workers found by missed heartbeats while a
 * step is in flight, restarts (also faster than the deadline), refused
 * Hellos, garbage on the wire, Shutdown delivery, and the beat connection of
 * a busy or wedged worker. The normal round trips
 * are in test_link.c. */
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

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/link/rt_link.h"
#include "router/core/rt_sched.h"
#include "tests/support/tt_link.h"
#include "worker.pb-c.h"

static char err[256];

/* ---- tests ------------------------------------------------------------- */

static void test_out_of_order(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    e->fk[1].answer = TT_ANSWER_WRONG_ID;
    assert_false(tt_link_round_trip(e, 1));
    assert_non_null(strstr(e->res_error, "rank 1"));
    assert_non_null(strstr(e->res_error, "answered step 6, expected step 1"));
    assert_int_equal(e->n_dead, 1);
    assert_int_equal(e->dead_rank, 1);
    assert_false(rt_link_ready(&e->link));
    assert_true(TT_PUMP_UNTIL(e, e->fk[1].n_shutdown == 1, 2000));
    assert_false(e->fk[1].last_drain);
    /* Rank 0's answer to the abandoned step is dropped quietly, and an
     * unsolicited answer from rank 0 afterwards is itself out of order. */
    tt_link_pump(e, 30);
    assert_int_equal(e->n_result, 1);
    assert_true(rt_link_rank_alive(&e->link, 0));
    tt_fake_answer(&e->fk[0], e->fk[0].plan->plan);
    assert_true(TT_PUMP_UNTIL(e, e->n_dead == 2, 2000));
    assert_int_equal(e->dead_rank, 0);
    assert_non_null(strstr(e->link.last_error, "owes none"));
    assert_int_equal(e->n_result, 1);
    tt_link_env_free(e);
}

static void test_dead_and_restart(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    assert_true(tt_link_round_trip(e, 1));
    /* Rank 1 goes silent with a step in flight. */
    e->fk[1].silent = 1;
    struct tt_mini_step m;
    tt_mini_step_make(&m, 2);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    /* Found dead by the silence deadline, which a loaded machine may
     * delay (the pump, the fakes and the deadline share one thread): the
     * bound is only that it happens, within 10 s (a rank never found
     * dead would hold the step forever); the error below names it. */
    assert_true(TT_PUMP_UNTIL(e, e->n_dead == 1, 10000));
    assert_int_equal(e->dead_rank, 1);
    assert_int_equal(e->n_result, 2);
    assert_false(e->res_ok);
    assert_int_equal(e->res_step, 2);
    assert_non_null(strstr(e->res_error, "rank 1 died"));
    assert_false(rt_link_ready(&e->link));
    assert_true(rt_link_rank_alive(&e->link, 0));
    tt_mini_step_make(&m, 3);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_EAGAIN);
    /* Its heartbeats resume: not registered any more, told to go once. */
    e->fk[1].silent = 0;
    tt_link_pump(e, 60);
    assert_int_equal(e->n_dead, 1);
    assert_int_equal(e->fk[1].n_shutdown, 1);
    assert_false(rt_link_ready(&e->link));
    /* The supervisor's new worker says Hello: ready again. */
    tt_fake_close(&e->fk[1]);
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    assert_true(TT_PUMP_UNTIL(e, e->n_ready == 2, 2000));
    assert_true(rt_link_ready(&e->link));
    assert_true(tt_link_round_trip(e, 3));
    tt_mini_plan_check(&e->fk[1], 3);
    assert_int_equal(e->fk[1].n_shutdown, 0);
    assert_int_equal(e->link.n_deaths, 1);
    tt_link_env_free(e);
}

static void test_hello_while_alive(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    /* A worker restarted faster than the deadline: its new Hello on the
     * same routing id ends the old incarnation (step failed, on_dead) and
     * the new one is accepted without being told to shut down. */
    e->fk[0].answer = e->fk[1].answer = TT_ANSWER_NONE;
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->fk[1].n_plans == 1, 2000));
    tt_fake_hello(&e->fk[1], NULL);
    assert_true(TT_PUMP_UNTIL(e, e->n_ready == 2, 2000));
    assert_int_equal(e->n_dead, 1);
    assert_int_equal(e->dead_rank, 1);
    assert_int_equal(e->n_result, 1);
    assert_false(e->res_ok);
    assert_non_null(strstr(e->res_error, "restarted"));
    tt_link_pump(e, 30);
    assert_int_equal(e->fk[1].n_shutdown, 0);
    /* The new incarnation owes nothing for step 1; rank 0 still does, also
     * once step 2 is out, and its late answer to step 1 is dropped. */
    e->fk[1].answer = TT_ANSWER_OK;
    tt_mini_step_make(&m, 2);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_plans == 2, 2000));
    Tangram__Worker__V1__BatchPlan old = TANGRAM__WORKER__V1__BATCH_PLAN__INIT;
    old.step_id = 1;
    tt_fake_answer(&e->fk[0], &old);
    tt_link_pump(e, 30);
    assert_int_equal(e->n_result, 1);
    tt_fake_answer(&e->fk[0], e->fk[0].plan->plan);
    assert_true(TT_PUMP_UNTIL(e, e->n_result == 2, 2000));
    assert_true(e->res_ok);
    assert_int_equal(e->res_step, 2);
    e->fk[0].answer = TT_ANSWER_OK;
    assert_true(tt_link_round_trip(e, 3));
    assert_int_equal(e->n_dead, 1);
    tt_link_env_free(e);
}

static void test_layout_mismatch(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_new(2, NULL);
    struct tt_hello_opts bad_dim = {.head_dim = 16};
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &bad_dim);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "head_dim 16, expected 8"));
    assert_int_equal(e->link.n_refused, 1);
    assert_non_null(strstr(e->link.last_error, "rank 0 refused"));
    assert_false(rt_link_rank_alive(&e->link, 0));
    /* Its heartbeats get no second Shutdown. */
    tt_link_pump(e, 40);
    assert_int_equal(e->fk[0].n_shutdown, 1);
    tt_fake_close(&e->fk[0]);

    struct tt_hello_opts few_pages = {.pages_total = 63};
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &few_pages);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "pages_total 63"));
    tt_fake_close(&e->fk[0]);

    struct tt_hello_opts world = {.world_size = 4};
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &world);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "world_size 4"));
    tt_fake_close(&e->fk[0]);

    struct tt_hello_opts other_rank = {.hello_rank = 1};
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &other_rank);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "says rank 1"));
    tt_fake_close(&e->fk[0]);

    /* A routing id outside the world, and one that is no rank at all. */
    tt_fake_open_id(&e->fk[2], e->zctx, e->endpoint, 7, "rank-7", NULL);
    assert_true(TT_PUMP_UNTIL(e, e->fk[2].n_shutdown == 1, 2000));
    assert_string_equal(e->fk[2].last_reason, "unknown rank");
    tt_fake_close(&e->fk[2]);
    tt_fake_open_id(&e->fk[2], e->zctx, e->endpoint, 0, "rank-00", NULL);
    assert_true(TT_PUMP_UNTIL(e, e->fk[2].n_shutdown == 1, 2000));
    tt_fake_close(&e->fk[2]);
    assert_int_equal(e->link.n_refused, 6);
    assert_int_equal(e->n_ready, 0);
    assert_int_equal(e->n_dead, 0);

    /* Correct workers are still accepted. */
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_true(tt_link_round_trip(e, 1));
    tt_link_env_free(e);
}

static void test_garbage(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    const char junk[] = "\xff\xff\xff\xff not protobuf";
    assert_true(zmq_send(e->fk[1].sock, junk, sizeof junk, 0) > 0);
    assert_true(TT_PUMP_UNTIL(e, e->n_dead == 1, 2000));
    assert_int_equal(e->dead_rank, 1);
    assert_non_null(strstr(e->link.last_error, "unparsable"));
    assert_true(TT_PUMP_UNTIL(e, e->fk[1].n_shutdown == 1, 2000));
    /* Another protocol version kills too. */
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    Tangram__Worker__V1__WorkerMessage m =
        TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 2;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    tt_fake_send(&e->fk[0], &m);
    assert_true(TT_PUMP_UNTIL(e, e->n_dead == 2, 2000));
    assert_non_null(strstr(e->link.last_error, "version 2"));
    tt_link_env_free(e);
}

static void test_shutdown(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_new(2, "tcp://127.0.0.1:*");
    assert_non_null(strstr(e->endpoint, "tcp://127.0.0.1:"));
    assert_null(strchr(e->endpoint, '*'));
    for (int r = 0; r < 2; r++)
        tt_fake_open(&e->fk[r], e->zctx, e->endpoint, r, NULL);
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_true(tt_link_round_trip(e, 1));
    assert_int_equal(rt_link_shutdown(&e->link, 1, "maintenance"), 0);
    assert_false(rt_link_ready(&e->link));
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown && e->fk[1].n_shutdown,
                              2000));
    for (int r = 0; r < 2; r++) {
        assert_int_equal(e->fk[r].n_shutdown, 1);
        assert_true(e->fk[r].last_drain);
        assert_string_equal(e->fk[r].last_reason, "maintenance");
    }
    struct tt_mini_step m;
    tt_mini_step_make(&m, 2);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_ECANCELED);
    /* Workers leaving on our Shutdown are not deaths. */
    e->fk[0].silent = e->fk[1].silent = 1;
    int hb0 = e->fk[0].n_hb;
    tt_link_pump(e, 2 * TT_LINK_DEAD_MS);
    assert_int_equal(e->n_dead, 0);
    assert_int_equal(e->fk[0].n_hb, hb0); /* no heartbeats after shutdown */
    /* A Hello after shutdown is refused. */
    tt_fake_hello(&e->fk[0], NULL);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 2, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "shutting down"));
    tt_link_env_free(e);
}

/* Sends one Heartbeat on a beat connection (as a worker's heartbeat
 * thread does). */
static void send_beat(void *sock, int rank, uint32_t pid, uint64_t step,
                      uint32_t stalled_ms)
{
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = 1;
    hb.rank = rank;
    hb.pid = pid;
    hb.step_id = step;
    hb.stalled_ms = stalled_ms;
    Tangram__Worker__V1__WorkerMessage m =
        TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    uint8_t buf[128];
    size_t n = tangram__worker__v1__worker_message__pack(&m, buf);
    assert_int_equal(zmq_send(sock, buf, n, 0), (int)n);
}

/* Runs the loop for ms while `sock` beats every 5 ms. */
static void pump_beating(struct tt_link_env *e, void *sock, int rank,
                         uint32_t pid, uint64_t step, uint32_t stalled,
                         int ms)
{
    uint64_t end = tt_now_ms() + (uint64_t)ms, next = 0;
    while (tt_now_ms() < end) {
        if (tt_now_ms() >= next) {
            send_beat(sock, rank, pid, step, stalled);
            next = tt_now_ms() + 5;
        }
        uv_run(&e->loop, UV_RUN_NOWAIT);
        for (int i = 0; i < 3; i++)
            tt_fake_service(&e->fk[i]);
        usleep(500);
    }
}

static void *beat_socket(struct tt_link_env *e, int rank)
{
    void *s = zmq_socket(e->zctx, ZMQ_DEALER);
    assert_non_null(s);
    char id[16];
    int n = snprintf(id, sizeof id, "beat-%d", rank);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_ROUTING_ID, id, (size_t)n), 0);
    assert_int_equal(zmq_connect(s, e->endpoint), 0);
    return s;
}

/* A worker busy in a long step: its main connection is silent for many
 * deadlines, its heartbeat thread's connection keeps it alive; beats of
 * another process (pid) do not; a beat that reports no progress for longer
 * than the stall deadline kills it, naming the step. */
static void test_beat_connection(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    void *beat = beat_socket(e, 1);
    e->fk[1].silent = 1; /* no heartbeats, no answer on "rank-1" */
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    pump_beating(e, beat, 1, (uint32_t)getpid(), 1, 3, 4 * TT_LINK_DEAD_MS);
    assert_int_equal(e->n_dead, 0);
    assert_true(rt_link_rank_alive(&e->link, 1));
    assert_true(rt_link_rank_silence_ms(&e->link, 1) < TT_LINK_DEAD_MS);
    assert_int_equal(e->n_result, 0); /* the step is still running */
    /* The step ends: its answer completes it. */
    e->fk[1].silent = 0;
    tt_fake_answer(&e->fk[1], e->fk[1].plan->plan);
    assert_true(TT_PUMP_UNTIL(e, e->n_result == 1, 2000));
    assert_true(e->res_ok);

    /* (The fakes' Hellos carry the test's pid.) Beats of another
     * incarnation (pid) are ignored: the silent rank is
     * found dead at the deadline. */
    e->fk[1].silent = 1;
    tt_mini_step_make(&m, 2);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    pump_beating(e, beat, 1, 4242, 2, 3, 4 * TT_LINK_DEAD_MS);
    assert_int_equal(e->n_dead, 1);
    assert_int_equal(e->dead_rank, 1);
    assert_non_null(strstr(e->res_error, "no message for"));
    /* Told to go on its main connection. */
    assert_true(TT_PUMP_UNTIL(e, e->fk[1].n_shutdown == 1, 2000));
    zmq_close(beat); /* before the fixture's context ends */
    tt_link_env_free(e);

    /* A wedged compute thread: beats go on, stalled_ms passes the stall
     * deadline. */
    e = tt_link_env_ready(2);
    beat = beat_socket(e, 0);
    e->fk[0].silent = 1;
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    pump_beating(e, beat, 0, (uint32_t)getpid(), 1, TT_LINK_STALL_MS,
                 2 * TT_LINK_DEAD_MS);
    assert_int_equal(e->n_dead, 0); /* at the deadline, not past it */
    pump_beating(e, beat, 0, (uint32_t)getpid(), 1, TT_LINK_STALL_MS + 1,
                 50);
    assert_int_equal(e->n_dead, 1);
    assert_int_equal(e->dead_rank, 0);
    assert_int_equal(e->n_result, 1);
    assert_false(e->res_ok);
    assert_non_null(strstr(e->res_error, "rank 0 died: no progress for"));
    assert_non_null(strstr(e->res_error, "in step 1"));
    assert_non_null(strstr(e->res_error, "wedged"));
    /* Nothing is ever sent to a beat connection. */
    assert_int_equal(zmq_recv(beat, err, sizeof err, ZMQ_DONTWAIT), -1);
    zmq_close(beat);
    tt_link_env_free(e);
}

int main(void)
{
    tg_log_init("router", -1, TG_LOG_ERR, TG_LOG_TEXT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_dead_and_restart),
        cmocka_unit_test(test_hello_while_alive),
        cmocka_unit_test(test_layout_mismatch),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_shutdown),
        cmocka_unit_test(test_beat_connection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
