/* test_conn.c — the connection layer under the router's servers (rt_conn)
 * driven by a minimal owner of its own, on one thread: the set lists every
 * connection from its creation until the owner releases it, closing ones
 * included; closing the set asks the owner to close each of them and
 * completes only once the listener's handles are closed and the last
 * connection was released; a socket handed in after the close is refused;
 * the listener binds port 0 and admits a TCP client like an adopted
 * socket. */
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "common/base/tg_err.h"
#include "router/net/rt_conn.h"

/* The owner's connection: rt_conn first, as the servers embed it. */
struct own_conn {
    struct rt_conn base;
    int closing; /* uv_close issued */
    int asked;   /* times ops->close named it */
};

struct fx {
    uv_loop_t loop;
    struct rt_conn_set set;
    int created, started, refused, evicted, released;
    int set_closed;            /* on_closed runs */
    size_t open_at_set_closed; /* set.n_open when on_closed ran */
};

static void on_own_closed(uv_handle_t *h)
{
    struct own_conn *c = h->data;
    struct fx *f = c->base.home->ud;
    f->released++;
    rt_conn_release(&c->base);
    free(c);
}

static void own_close(struct own_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    rt_conn_leave(&c->base);
    uv_close((uv_handle_t *)&c->base.tcp, on_own_closed);
}

static struct rt_conn *op_create(struct rt_conn_set *set)
{
    struct fx *f = set->ud;
    struct own_conn *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    assert_int_equal(uv_tcp_init(&f->loop, &c->base.tcp), 0);
    c->base.tcp.data = c;
    f->created++;
    return &c->base;
}

static void op_start(struct rt_conn *c)
{
    struct fx *f = c->home->ud;
    f->started++;
    rt_conn_state_set(c, RT_CONN_IDLE);
}

static void op_refuse(struct rt_conn *c, int why)
{
    struct fx *f = c->home->ud;
    f->refused++;
    own_close((struct own_conn *)c);
}

static void op_evict(struct rt_conn *c, int why)
{
    struct fx *f = c->home->ud;
    f->evicted++;
    own_close((struct own_conn *)c);
}

static void op_close(struct rt_conn *c)
{
    struct own_conn *oc = (struct own_conn *)c;
    oc->asked++;
    own_close(oc);
}

static const struct rt_conn_ops ops = {
    .create = op_create,
    .start = op_start,
    .refuse = op_refuse,
    .evict = op_evict,
    .close = op_close,
};

static void on_set_closed(struct rt_conn_set *set)
{
    struct fx *f = set->ud;
    f->set_closed++;
    f->open_at_set_closed = set->n_open;
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    struct rt_conn_config cfg;
    rt_conn_config_default(&cfg);
    /* No idle deadline: its timer would keep uv_run(DEFAULT) waiting. */
    cfg.idle_timeout_ms = 0;
    rt_conn_set_init(&f->set, &f->loop, &cfg, &ops, f, "test");
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    rt_conn_set_close(&f->set, NULL);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&f->loop), 0);
    free(f);
    return 0;
}

/* A connected pair; the server end goes to the set. Returns the client
 * end. */
static int adopt_pair(struct fx *f)
{
    int sv[2];
    assert_int_equal(
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv),
        0);
    assert_int_equal(rt_conn_set_adopt(&f->set, sv[0]), 0);
    return sv[1];
}

static void test_close_waits_for_release(void **state)
{
    struct fx *f = *state;
    int cli[3];
    for (int i = 0; i < 3; i++)
        cli[i] = adopt_pair(f);
    assert_int_equal(f->started, 3);
    assert_int_equal(f->set.n_open, 3);
    assert_int_equal(f->set.n_live, 3);

    /* One closes on its own: out of the limits at once, still listed until
     * its handle closed. */
    struct own_conn *first = (struct own_conn *)f->set.open;
    own_close(first);
    assert_int_equal(f->set.n_live, 2);
    assert_int_equal(f->set.n_open, 3);

    rt_conn_set_close(&f->set, on_set_closed);
    /* Every listed connection was named, the closing one included. */
    int asked = 0;
    for (struct rt_conn *c = f->set.open; c; c = c->onext) {
        assert_int_equal(((struct own_conn *)c)->asked, 1);
        asked++;
    }
    assert_int_equal(asked, 3);
    assert_int_equal(f->set_closed, 0);
    /* A socket handed in now is refused and stays the caller's. */
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(rt_conn_set_adopt(&f->set, sv[0]), TG_EINVAL);
    close(sv[0]);
    close(sv[1]);

    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(f->released, 3);
    assert_int_equal(f->set_closed, 1);
    assert_int_equal(f->open_at_set_closed, 0);
    assert_null(f->set.open);
    for (int i = 0; i < 3; i++)
        close(cli[i]);
}

static void test_release_before_close(void **state)
{
    struct fx *f = *state;
    int cli = adopt_pair(f);
    own_close((struct own_conn *)f->set.open);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(f->released, 1);
    assert_int_equal(f->set.n_open, 0);
    assert_int_equal(f->set_closed, 0);
    close(cli);
    /* Nothing left to wait for: the close completes with the handles. */
    rt_conn_set_close(&f->set, on_set_closed);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(f->set_closed, 1);
}

static void test_listen_admits(void **state)
{
    struct fx *f = *state;
    char err[256];
    assert_int_equal(
        rt_conn_set_listen(&f->set, "127.0.0.1", 0, err, sizeof(err)), 0);
    assert_true(f->set.port > 0);
    assert_int_equal(
        rt_conn_set_listen(&f->set, "127.0.0.1", 0, err, sizeof(err)),
        TG_EINVAL);
    int cli = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(cli >= 0);
    struct sockaddr_in a4;
    memset(&a4, 0, sizeof(a4));
    a4.sin_family = AF_INET;
    a4.sin_port = htons((uint16_t)f->set.port);
    a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(cli, (struct sockaddr *)&a4, sizeof(a4)), 0);
    /* The accept happens on a loop turn after the connect; bounded by
     * turns, not time. */
    for (int i = 0; i < 1000 && f->started == 0; i++)
        uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(f->started, 1);
    assert_int_equal(f->set.n_open, 1);
    rt_conn_set_close(&f->set, on_set_closed);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(f->set_closed, 1);
    assert_int_equal(f->released, 1);
    close(cli);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_close_waits_for_release, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_release_before_close, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_listen_admits, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
