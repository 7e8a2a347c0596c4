/* test_grpc_uploads.c — the router's gRPC server (rt_grpc) under slow
 * uploads and a full connection table, on loopback against the fixture
 * of tests/support/tt_grpc.{h,c}: request messages are charged to the body
 * budget as their bytes arrive, so one connection whose 64 streams
 * announce 4 MiB messages and send 4 bytes each holds 64 first buffers,
 * not 256 MiB, and a real call is served beside it; with every connection
 * busy a newcomer takes a place of the probe reserve, where the health
 * check is served and any other call ends UNAVAILABLE. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "common/base/tg_err.h"
#include "router/net/rt_grpc.h"
#include "tests/support/tt_grpc.h"
#include "tests/support/tt_h2cli.h"

#define N_STREAMS 64

/* One connection with many streams, each sending a message prefix that
 * announces 4 MiB and 4 bytes of it, then nothing. */
struct mcli {
    int fd;
    nghttp2_session *s;
    int sent[2 * N_STREAMS + 2]; /* by stream id: its bytes went out */
    int closed;                  /* streams closed by the server */
};

static int mcli_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud)
{
    struct mcli *m = ud;
    (void)s;
    (void)sid;
    (void)code;
    m->closed++;
    return 0;
}

static ssize_t mcli_send(nghttp2_session *s, const uint8_t *d, size_t n,
                         int flags, void *ud)
{
    struct mcli *m = ud;
    (void)s;
    (void)flags;
    ssize_t w = send(m->fd, d, n, MSG_NOSIGNAL);
    return w < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : w;
}

static const uint8_t g_part[9] = {0,   0x00, 0x40, 0x00, 0x00,
                                  'a', 'b',  'c',  'd'};

static ssize_t mcli_body(nghttp2_session *s, int32_t sid, uint8_t *buf,
                         size_t len, uint32_t *flags, nghttp2_data_source *src,
                         void *ud)
{
    struct mcli *m = ud;
    (void)s;
    (void)len;
    (void)flags;
    (void)src;
    if (sid <= 0 || sid >= (int32_t)(sizeof(m->sent) / sizeof(m->sent[0])) ||
        m->sent[sid])
        return NGHTTP2_ERR_DEFERRED; /* the rest never comes */
    m->sent[sid] = 1;
    memcpy(buf, g_part, sizeof(g_part));
    return (ssize_t)sizeof(g_part);
}

/* Runs the client's session for about `ms`. */
static void mcli_pump(struct mcli *m, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        nghttp2_session_send(m->s);
        struct pollfd p = {.fd = m->fd, .events = POLLIN};
        if (poll(&p, 1, 10) <= 0)
            continue;
        uint8_t buf[16384];
        ssize_t r = recv(m->fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break;
        assert_true(nghttp2_session_mem_recv(m->s, buf, (size_t)r) >= 0);
    }
}

static size_t budget_used(const struct rt_conn_budget *b)
{
    return *(const volatile size_t *)&b->used;
}

static void test_messages_charged_as_they_arrive(void **state)
{
    (void)state;
    static struct rt_conn_budget budget;
    memset(&budget, 0, sizeof(budget));
    budget.limit = 8u << 20;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.body_budget = &budget;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);

    struct mcli m;
    memset(&m, 0, sizeof(m));
    m.fd = tt_h2cli_connect(fx->port);
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, mcli_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, mcli_close);
    assert_int_equal(nghttp2_session_client_new(&m.s, cb, &m), 0);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(m.s, NGHTTP2_FLAG_NONE, NULL, 0);
    size_t n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc",
                               "trailers", "POST");
    /* 64 streams announce 4 MiB each (32 times the 8 MiB budget). */
    nghttp2_data_provider dp = {.source.ptr = NULL, .read_callback = mcli_body};
    for (int i = 0; i < N_STREAMS; i++)
        assert_true(
            nghttp2_submit_request(m.s, NULL, tt_h2cli_nv, n, &dp, NULL) > 0);
    size_t want = (size_t)N_STREAMS * RT_CONN_BODY_STEP;
    for (int i = 0; i < 300 && budget_used(&budget) < want; i++)
        mcli_pump(&m, 20);
    /* Each holds its first buffer: what arrived, rounded up. */
    assert_int_equal(budget_used(&budget), want);
    assert_int_equal(m.closed, 0);
    assert_int_equal(budget.refused, 0);

    /* A real 1 MiB call on another connection is served beside them. */
    struct tt_h2cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    size_t len = 1u << 20;
    uint8_t *msg = malloc(len + 5);
    char *payload = malloc(len);
    assert_true(msg && payload);
    memset(payload, 'm', len);
    size_t blen = tt_h2cli_frame(msg, 0, payload, len);
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc", "trailers",
                        "POST");
    assert_true(
        tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, msg, blen, 1, 10000));
    assert_int_equal(c->grpc_status, RT_GRPC_OK);
    free(msg);
    free(payload);
    free(c);
    assert_int_equal(m.closed, 0);

    /* The slow streams leave: everything comes back. */
    nghttp2_session_del(m.s);
    close(m.fd);
    for (int i = 0; i < 500 && budget_used(&budget) != 0; i++)
        usleep(10000);
    assert_int_equal(budget_used(&budget), 0);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* Connection caps with the probe reserve: three calls in their handlers
 * fill the table; a health check on a new connection is served, any other
 * call there ends UNAVAILABLE (counted as the cap's refusal). */
static void test_probe_reserve(void **state)
{
    (void)state;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.max_connections = 3;
    cfg.max_connections_per_ip = 0;
    cfg.probe_reserve = 2;
    cfg.probe_per_ip = 0; /* every client here is 127.0.0.1 */
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);
    struct tt_h2cli *c = calloc(5, sizeof(*c));
    assert_non_null(c);
    size_t n = tt_h2cli_std_nv("/test.Echo/Slow", "application/grpc",
                               "trailers", "POST");
    uint8_t buf[64];
    size_t blen = tt_h2cli_frame(buf, 0, "x", 1);
    for (int i = 0; i < 3; i++)
        assert_false(
            tt_h2cli_open(&c[i], fx->port, tt_h2cli_nv, n, buf, blen, 1, 200));
    for (int i = 0; i < 300 && atomic_load(&fx->slow_started) < 3; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&fx->slow_started), 3);
    /* The health check a probe makes: HealthCheckRequest{} answered
     * HealthCheckResponse{status: SERVING} (field 1, varint 1). */
    n = tt_h2cli_std_nv(RT_GRPC_PROBE_METHOD, "application/grpc", "trailers",
                        "POST");
    blen = tt_h2cli_frame(buf, 0, "", 0);
    assert_true(
        tt_h2cli_call(&c[3], fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c[3].grpc_status, RT_GRPC_OK);
    static const uint8_t serving[7] = {0, 0, 0, 0, 2, 0x08, 0x01};
    assert_int_equal(c[3].data_len, sizeof(serving));
    assert_memory_equal(c[3].data, serving, sizeof(serving));
    /* Anything else on such a connection: UNAVAILABLE. */
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc", "trailers",
                        "POST");
    blen = tt_h2cli_frame(buf, 0, "hi", 2);
    assert_true(
        tt_h2cli_call(&c[4], fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c[4].grpc_status, RT_GRPC_UNAVAILABLE);
    assert_non_null(strstr(c[4].grpc_msg, "health"));
    assert_true(fx->srv.set.stats.probe_admitted >= 2);
    assert_int_equal(fx->srv.set.stats.rejected_max, 1);
    for (int i = 0; i < 3; i++)
        tt_h2cli_end(&c[i]);
    for (int i = 0; i < 300 && atomic_load(&fx->cancels) < 3; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&fx->cancels), 3);
    free(c);
    tt_grpc_fx_stop(fx);
    free(fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages_charged_as_they_arrive),
        cmocka_unit_test(test_probe_reserve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
