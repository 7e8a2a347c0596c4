/* test_beat.c — a worker's heartbeat thread (gpu_worker/serve/gw_beat.h) against
 * a ZMQ_ROUTER in the test: beats arrive on routing id "beat-<rank>" with
 * the process's pid while the thread that owns the progress marks does
 * something else (here: sleeps); they carry the step in flight and how
 * long no progress was marked, which falls back once a mark is made; none
 * come after the stop; bad arguments are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/base/tg_err.h"
#include "gpu_worker/serve/gw_beat.h"
#include "worker.pb-c.h"

static char errbuf[256];

/* The next beat within ms, or NULL; checks the routing id. */
static Tangram__Worker__V1__Heartbeat *next_beat(void *sock, int ms,
                                                 Tangram__Worker__V1__WorkerMessage **own)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, ms) <= 0)
        return NULL;
    char id[32];
    int n = zmq_recv(sock, id, sizeof(id), 0);
    assert_int_equal(n, 6);
    assert_memory_equal(id, "beat-3", 6);
    zmq_msg_t m;
    zmq_msg_init(&m);
    assert_true(zmq_msg_recv(&m, sock, 0) >= 0);
    *own = tangram__worker__v1__worker_message__unpack(NULL, zmq_msg_size(&m),
                                                       zmq_msg_data(&m));
    zmq_msg_close(&m);
    assert_non_null(*own);
    assert_int_equal((*own)->body_case,
                     TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT);
    return (*own)->heartbeat;
}

static void test_beats(void **state)
{
    (void)state;
    char ep[128];
    snprintf(ep, sizeof(ep), "ipc:///tmp/tg-test-beat-%d.sock", (int)getpid());
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(router, ep), 0);

    struct gw_progress p;
    gw_progress_init(&p);
    struct gw_beat b;
    assert_int_equal(gw_beat_start(&b, ctx, ep, 3, 20, &p, errbuf,
                                   sizeof(errbuf)), 0);
    Tangram__Worker__V1__WorkerMessage *m = NULL;
    Tangram__Worker__V1__Heartbeat *hb = next_beat(router, 2000, &m);
    assert_non_null(hb);
    assert_int_equal(hb->rank, 3);
    assert_int_equal(hb->pid, (uint32_t)getpid());
    assert_int_equal(hb->step_id, 0);
    uint64_t seq = hb->seq;
    tangram__worker__v1__worker_message__free_unpacked(m, NULL);

    /* A step starts and its thread makes no mark for 300 ms: beats keep
     * coming, saying so. */
    gw_progress_step(&p, 42);
    usleep(300 * 1000);
    int saw_stall = 0, beats = 0;
    while ((hb = next_beat(router, 200, &m)) != NULL) {
        assert_true(hb->seq > seq);
        seq = hb->seq;
        beats++;
        if (hb->step_id == 42 && hb->stalled_ms >= 250)
            saw_stall = 1;
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
        if (saw_stall)
            break;
    }
    assert_true(saw_stall);
    assert_true(beats >= 2); /* the socket's queue holds a few at most */
    /* A mark: the next beats report little stall again. */
    gw_progress_mark(&p);
    int fresh = 0;
    for (int i = 0; i < 20 && !fresh; i++) {
        hb = next_beat(router, 200, &m);
        assert_non_null(hb);
        fresh = hb->step_id == 42 && hb->stalled_ms < 200;
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
    }
    assert_true(fresh);
    gw_progress_step(&p, 0);
    assert_int_equal(gw_progress_stalled_ms(&p, gw_progress_now_ms() - 5000),
                     0);

    gw_beat_stop(&b);
    assert_true(b.n_sent >= 5);
    gw_beat_stop(&b); /* twice is safe */
    while ((hb = next_beat(router, 50, &m)) != NULL) /* what was queued */
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
    assert_null(next_beat(router, 150, &m));

    zmq_close(router);
    zmq_ctx_term(ctx);
    unlink(ep + 6);
}

static void test_bad_args(void **state)
{
    (void)state;
    struct gw_progress p;
    gw_progress_init(&p);
    struct gw_beat b;
    void *ctx = zmq_ctx_new();
    assert_int_equal(gw_beat_start(&b, ctx, "ipc:///tmp/x", 0, 0, &p, errbuf,
                                   sizeof(errbuf)), TG_EINVAL);
    gw_beat_stop(&b); /* safe after a failed start */
    assert_int_equal(gw_beat_start(&b, ctx, "nonsense://x", 0, 10, &p,
                                   errbuf, sizeof(errbuf)), TG_EIO);
    assert_non_null(strstr(errbuf, "nonsense://x"));
    gw_beat_stop(&b);
    struct gw_beat z;
    memset(&z, 0, sizeof(z));
    gw_beat_stop(&z); /* safe on a zeroed beat */
    gw_progress_mark(NULL);
    gw_progress_step(NULL, 1);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_beats),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
