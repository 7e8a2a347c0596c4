/* test_link_comm.c — the communicator hand-off of the router's worker link
 * (rt_link.h "Communicator") against the fake workers of
 * tests/support/tt_link.h: CommSetup goes out only once every rank said
 * Hello, to every rank (rank 0 included) with rank 0's id, kind and the
 * world size; the link is ready only once every rank answered CommReady
 * ok (Hellos alone are not enough); CommReady ok = false, one that was
 * not asked for, one with the wrong rank, or none in time is a rank
 * failure (Shutdown, on_dead; with shared fate the whole group); a rank 0
 * without a group id is refused when T > 1 and accepted with T = 1; the
 * restarted group is set up again with the new rank 0's id. */
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

#include "common/base/tg_err.h"
#include "router/link/rt_link.h"
#include "tests/support/tt_link.h"

static char err[256];

static void own_group(char *out, size_t n)
{
    snprintf(out, n, "fake-group-%d", (int)getpid());
}

static void test_ready_needs_comm_ready(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_new(2, NULL);
    /* rank 1 first: it waits, without a CommSetup, for rank 0 */
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    e->fk[1].comm = TT_COMM_NONE;
    assert_true(TT_PUMP_UNTIL(e, rt_link_rank_alive(&e->link, 1), 2000));
    tt_link_pump(e, 40);
    assert_int_equal(e->fk[1].n_setup, 0);
    assert_true(e->fk[1].n_hb >= 1);
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    e->fk[0].comm = TT_COMM_NONE;
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_setup == 1 &&
                                     e->fk[1].n_setup == 1, 2000));
    char id[64];
    own_group(id, sizeof id);
    for (int r = 0; r < 2; r++) {
        assert_string_equal(e->fk[r].setup_id, id);
        assert_string_equal(e->fk[r].setup_kind, "shm");
        assert_int_equal(e->fk[r].setup_world, 2);
    }
    /* Every rank said Hello, none joined: not ready, no plan goes out. */
    tt_link_pump(e, 40);
    assert_true(rt_link_rank_alive(&e->link, 0) &&
                rt_link_rank_alive(&e->link, 1));
    assert_false(rt_link_ready(&e->link));
    assert_false(rt_link_rank_joined(&e->link, 0));
    assert_int_equal(e->n_ready, 0);
    struct tt_mini_step m;
    tt_mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), TG_EAGAIN);
    /* One joined is not enough either. */
    tt_fake_comm_ready(&e->fk[0], 1, "");
    assert_true(TT_PUMP_UNTIL(e, rt_link_rank_joined(&e->link, 0), 2000));
    tt_link_pump(e, 20);
    assert_false(rt_link_ready(&e->link));
    assert_int_equal(e->n_ready, 0);
    tt_fake_comm_ready(&e->fk[1], 1, "");
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_int_equal(e->n_ready, 1);
    assert_true(tt_link_round_trip(e, 1));
    /* Nothing is sent twice to a joined incarnation. */
    tt_link_pump(e, 30);
    assert_int_equal(e->fk[0].n_setup + e->fk[1].n_setup, 2);
    assert_int_equal(e->n_dead, 0);
    tt_link_env_free(e);
}

static void test_comm_ready_false(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_new(2, NULL);
    e->link.cfg.shared_fate = 1; /* a tensor-parallel group */
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    e->fk[1].comm = TT_COMM_FAIL;
    assert_true(TT_PUMP_UNTIL(e, e->n_dead == 2, 2000));
    assert_false(rt_link_ready(&e->link));
    assert_int_equal(e->n_ready, 0);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 1 &&
                                     e->fk[1].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[1].last_reason,
                           "joining the communicator group failed: no group"));
    assert_non_null(strstr(e->fk[0].last_reason, "tensor-parallel group"));
    /* The supervisor's new group: a new rank 0 id goes to both. */
    tt_fake_close(&e->fk[0]);
    tt_fake_close(&e->fk[1]);
    struct tt_hello_opts o0 = {.comm_id = "/tangram-2-new"};
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &o0);
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_int_equal(e->n_ready, 1);
    assert_string_equal(e->fk[0].setup_id, "/tangram-2-new");
    assert_string_equal(e->fk[1].setup_id, "/tangram-2-new");
    assert_true(tt_link_round_trip(e, 1));
    tt_link_env_free(e);
}

static void test_comm_ready_timeout(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_new(2, NULL);
    e->link.cfg.comm_setup_ms = 60;
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    tt_fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    e->fk[1].comm = TT_COMM_NONE; /* heartbeats go on, no CommReady */
    uint64_t t0 = tt_now_ms();
    /* Dead on its own 60 ms timer: never before it (timers do not fire
     * early). Nothing else here could kill the rank (its heartbeats go
     * on), so the upper bound is only that it happens: 10 s, which a
     * loaded 2-core machine under ctest -j4 and ASan does not reach,
     * where a tighter bound measured its scheduling instead. */
    assert_true(TT_PUMP_UNTIL(e, e->n_dead == 1, 10000));
    uint64_t took = e->t_dead - t0;
    assert_true(took >= 60);
    assert_int_equal(e->dead_rank, 1);
    assert_non_null(strstr(e->link.last_error,
                           "no CommReady within 60 ms of its CommSetup"));
    assert_false(rt_link_ready(&e->link));
    assert_int_equal(e->n_ready, 0);
    /* Its late answer is a stray's: told to go, nothing else. */
    tt_fake_comm_ready(&e->fk[1], 1, "");
    tt_link_pump(e, 40);
    assert_false(rt_link_ready(&e->link));
    assert_int_equal(e->n_dead, 1);
    tt_link_env_free(e);
}

static void test_unexpected_comm_ready(void **state)
{
    (void)state;
    struct tt_link_env *e = tt_link_env_ready(2);
    /* A second CommReady: the rank is out of step. */
    tt_fake_comm_ready(&e->fk[1], 1, "");
    assert_true(TT_PUMP_UNTIL(e, e->n_dead == 1, 2000));
    assert_int_equal(e->dead_rank, 1);
    assert_non_null(strstr(e->link.last_error, "without a pending CommSetup"));
    /* A CommReady naming another rank is a protocol error too. */
    Tangram__Worker__V1__CommReady cr = TANGRAM__WORKER__V1__COMM_READY__INIT;
    cr.version = 1;
    cr.rank = 1;
    cr.ok = 1;
    cr.error = (char *)"";
    Tangram__Worker__V1__WorkerMessage msg =
        TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    msg.version = 1;
    msg.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_READY;
    msg.comm_ready = &cr;
    tt_fake_send(&e->fk[0], &msg);
    assert_true(TT_PUMP_UNTIL(e, e->n_dead == 2, 2000));
    assert_int_equal(e->dead_rank, 0);
    assert_non_null(strstr(e->link.last_error, "CommReady with version 1 "
                                               "and rank 1"));
    tt_link_env_free(e);
}

static void test_rank0_group_id(void **state)
{
    (void)state;
    /* T > 1: rank 0 must name a group. */
    struct tt_link_env *e = tt_link_env_new(2, NULL);
    struct tt_hello_opts none = {.comm_id = ""};
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &none);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "names no communicator"));
    assert_int_equal(e->link.n_refused, 1);
    /* Oversized ids are refused too. */
    char big[RT_LINK_COMM_ID_MAX + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    struct tt_hello_opts huge = {.comm_id = big};
    tt_fake_close(&e->fk[0]);
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &huge);
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "comm_id of 257 bytes"));
    tt_link_env_free(e);

    /* T = 1: an empty id goes out as is, and one rank still has to join. */
    e = tt_link_env_new(1, NULL);
    struct tt_hello_opts one = {.comm_id = "", .world_size = 1};
    tt_fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &one);
    e->fk[0].comm = TT_COMM_NONE;
    assert_true(TT_PUMP_UNTIL(e, e->fk[0].n_setup == 1, 2000));
    assert_string_equal(e->fk[0].setup_id, "");
    assert_int_equal(e->fk[0].setup_world, 1);
    assert_false(rt_link_ready(&e->link));
    tt_fake_comm_ready(&e->fk[0], 1, "");
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_int_equal(e->n_ready, 1);
    tt_link_env_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_needs_comm_ready),
        cmocka_unit_test(test_comm_ready_false),
        cmocka_unit_test(test_comm_ready_timeout),
        cmocka_unit_test(test_unexpected_comm_ready),
        cmocka_unit_test(test_rank0_group_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
