/* test_grpc_limits.c — the limits of the router's gRPC server (rt_grpc)
 * and its streaming kinds, on loopback against the fixture of
 * tests/support/tt_grpc.{h,c}, driven by the nghttp2 client of
 * tests/support/tt_h2cli.{h,c}: a stream whose request never comes
 * (receive deadline, for unary and bidi streams); a connection kept open
 * by such streams, or by a client that keeps opening them (idle limit);
 * streams over SETTINGS_MAX_CONCURRENT_STREAMS (refused); admission from
 * the headers before any body and before the method lookup; connection
 * caps (an idle connection gives way, a busy set refuses with GOAWAY);
 * the request body budget; a grpc-timeout passed before dispatch;
 * bidi streams (echo, errors, oversized messages); the graceful close (a
 * Watch stream gets NOT_SERVING and UNAVAILABLE, a running stream
 * UNAVAILABLE); reflection over a descriptor set with imports (transitive
 * closure, extensions, a set lacking an import refused). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "common/base/tg_err.h"
#include "proto/descriptor_index.pb-c.h"
#include "proto/reflection.pb-c.h"
#include "router/net/rt_grpc.h"
#include "router/net/rt_grpc_reflect.h"
#include "tests/support/tt_grpc.h"
#include "tests/support/tt_h2cli.h"

/* Loops until `pred(fx)` holds or ~3 s pass; returns the last result. */
static int wait_count(atomic_int *v, int want)
{
    for (int i = 0; i < 300 && atomic_load(v) < want; i++)
        usleep(10000);
    return atomic_load(v);
}

/* The receive deadline: a stream whose request never completes gets
 * DEADLINE_EXCEEDED and a reset, for unary/server-stream calls (headers
 * alone, or part of a message) and for bidi calls (no next message); a
 * complete request is not affected. */
static void test_recv_timeout(void **state)
{
    (void)state;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.recv_timeout_ms = 200;
    cfg.idle_timeout_ms = 0;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);
    struct tt_h2cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    uint8_t buf[64];

    size_t n = tt_h2cli_std_nv("/test.Echo/Slow", "application/grpc",
                               "trailers", "POST");
    /* Headers, no body, stream left open. */
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, NULL, 0, 0, 5000));
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    assert_non_null(strstr(c->grpc_msg, "receive timeout"));
    assert_int_equal(c->close_code, NGHTTP2_NO_ERROR);
    /* Three bytes of a message prefix, then nothing. */
    size_t blen = tt_h2cli_frame(buf, 0, "hello", 5);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, 3, 0, 5000));
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(atomic_load(&fx->slow_started), 0); /* no handler ran */
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_RECV_TIMEOUT]), 2);
    /* A bidi stream with no message: its handler ran, and loses the call
     * with DEADLINE_EXCEEDED. */
    n = tt_h2cli_std_nv("/test.Echo/Bidi", "application/grpc", "trailers",
                        "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, NULL, 0, 0, 5000));
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    assert_non_null(strstr(c->grpc_msg, "no request message"));
    assert_int_equal(wait_count(&fx->cancel_deadline, 1), 1);
    /* A bidi stream that sent one message and then went quiet: the echo,
     * then the deadline. */
    blen = tt_h2cli_frame(buf, 0, "hi", 2);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 0, 5000));
    assert_int_equal(c->data_len, 7);
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_RECV_TIMEOUT]), 4);
    /* A complete request is answered as usual. */
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc", "trailers",
                        "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 5000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_RECV_TIMEOUT]), 4);
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);
    free(c);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* The idle limit counts a connection whose streams only wait for their
 * requests as idle: it is closed although a stream is open, and although
 * its client keeps opening such streams. */
static void test_idle_open_stream(void **state)
{
    (void)state;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.idle_timeout_ms = 200;
    cfg.recv_timeout_ms = 60000;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);
    struct tt_h2cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    size_t n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc",
                               "trailers", "POST");
    tt_h2cli_open(c, fx->port, tt_h2cli_nv, n, NULL, 0, 0, 5000);
    assert_true(tt_h2cli_wait_eof(c, 3000));
    tt_h2cli_end(c);
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_IDLE_CLOSE]), 1);
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_RECV_TIMEOUT]), 0);
    free(c);
    tt_grpc_fx_stop(fx);
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_CONN_OPEN]),
                     atomic_load(&fx->events[RT_GRPC_EVENT_CONN_CLOSE]));
    free(fx);

    /* A client that keeps opening streams that never send their request:
     * the answers to those (receive timeouts) are not activity, so the
     * connection still ends at the idle limit. */
    cfg.idle_timeout_ms = 400;
    cfg.recv_timeout_ms = 100;
    fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);
    c = calloc(1, sizeof(*c));
    assert_non_null(c);
    assert_true(tt_h2cli_open(c, fx->port, tt_h2cli_nv, n, NULL, 0, 0, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    int rounds = 1, ended = 0;
    for (; rounds < 100 && !ended; rounds++) {
        c->closed = 0;
        nghttp2_data_provider dp = {.source.ptr = NULL,
                                    .read_callback = tt_h2cli_body};
        c->sid = nghttp2_submit_request(c->s, NULL, tt_h2cli_nv, n, &dp, NULL);
        /* After GOAWAY the client library refuses new streams. */
        ended = c->sid < 0 || !tt_h2cli_pump(c, 3000);
    }
    assert_true(ended);
    assert_true(rounds > 2);
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_IDLE_CLOSE]), 1);
    tt_h2cli_end(c);
    free(c);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* ---- several streams on one connection ---------------------------------- */

struct mcli {
    int fd;
    nghttp2_session *s;
    uint32_t code[8];   /* close code by (stream id - 1) / 2 */
    int closed[8];
};

static int mcli_close(nghttp2_session *s, int32_t sid, uint32_t code,
                      void *ud)
{
    struct mcli *m = ud;
    (void)s;
    int k = (sid - 1) / 2;
    if (k >= 0 && k < 8) {
        m->closed[k] = 1;
        m->code[k] = code;
    }
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

static const uint8_t g_one[] = {0, 0, 0, 0, 1, 'x'};

static ssize_t mcli_body(nghttp2_session *s, int32_t sid, uint8_t *buf,
                         size_t len, uint32_t *flags, nghttp2_data_source *src,
                         void *ud)
{
    (void)s;
    (void)sid;
    (void)ud;
    (void)len;
    memcpy(buf, g_one, sizeof(g_one));
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    (void)src;
    return (ssize_t)sizeof(g_one);
}

/* SETTINGS_MAX_CONCURRENT_STREAMS: a client that ignores it (it sends its
 * third stream before reading the server's SETTINGS) gets that stream
 * refused; the first two run. */
static void test_max_streams(void **state)
{
    (void)state;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.max_concurrent_streams = 2;
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
    nghttp2_option *opt;
    nghttp2_option_new(&opt);
    nghttp2_option_set_peer_max_concurrent_streams(opt, 100);
    assert_int_equal(nghttp2_session_client_new2(&m.s, cb, &m, opt), 0);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(m.s, NGHTTP2_FLAG_NONE, NULL, 0);
    size_t n = tt_h2cli_std_nv("/test.Echo/Slow", "application/grpc",
                               "trailers", "POST");
    nghttp2_data_provider dp = {.source.ptr = NULL,
                                .read_callback = mcli_body};
    for (int i = 0; i < 3; i++)
        assert_int_equal(nghttp2_submit_request(m.s, NULL, tt_h2cli_nv, n, &dp,
                                                NULL),
                         2 * i + 1);
    assert_int_equal(nghttp2_session_send(m.s), 0);
    for (int i = 0; i < 300 && !m.closed[2]; i++) {
        struct pollfd p = {.fd = m.fd, .events = POLLIN};
        if (poll(&p, 1, 10) <= 0)
            continue;
        uint8_t buf[16384];
        ssize_t r = recv(m.fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break;
        assert_true(nghttp2_session_mem_recv(m.s, buf, (size_t)r) >= 0);
        nghttp2_session_send(m.s);
    }
    assert_true(m.closed[2]);
    assert_int_equal(m.code[2], NGHTTP2_REFUSED_STREAM);
    assert_false(m.closed[0] || m.closed[1]);
    assert_int_equal(wait_count(&fx->slow_started, 2), 2);
    assert_int_equal(
        atomic_load(&fx->events[RT_GRPC_EVENT_REFUSED_STREAM]), 1);
    nghttp2_session_del(m.s);
    close(m.fd);
    assert_int_equal(wait_count(&fx->cancels, 2), 2);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* Admission runs on the headers: a caller without the key is answered
 * while its body has not even started; with the key the call goes on.
 * Other paths are not checked. A grpc-timeout already passed when the
 * handler would run gets DEADLINE_EXCEEDED without the handler. */
static void test_admission_and_early_deadline(void **state)
{
    (void)state;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start(fx);
    struct tt_h2cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    uint8_t buf[64];
    size_t blen = tt_h2cli_frame(buf, 0, "hello", 5);
    size_t n = tt_h2cli_std_nv("/test.Secret/Unary", "application/grpc",
                               "trailers", "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, NULL, 0, 0, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_UNAUTHENTICATED);
    assert_string_equal(c->grpc_msg, "no key");
    assert_int_equal(c->close_code, NGHTTP2_NO_ERROR);
    nghttp2_nv key = TT_H2_NV("authorization", "Bearer s3cret");
    tt_h2cli_nv[n++] = key;
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, blen);
    assert_int_equal(atomic_load(&fx->admits), 2);
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc", "trailers",
                        "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(atomic_load(&fx->admits), 2);
    /* Admission comes before the method lookup: without the key an
     * unknown method is refused like a real one, so methods cannot be
     * enumerated; with the key it is unknown. */
    n = tt_h2cli_std_nv("/test.Secret/Nope", "application/grpc", "trailers",
                        "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, NULL, 0, 0, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_UNAUTHENTICATED);
    assert_string_equal(c->grpc_msg, "no key");
    tt_h2cli_nv[n++] = key;
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_UNIMPLEMENTED);
    assert_int_equal(atomic_load(&fx->admits), 4);

    n = tt_h2cli_std_nv("/test.Echo/Slow", "application/grpc", "trailers",
                        "POST");
    nghttp2_nv to = TT_H2_NV("grpc-timeout", "0m");
    tt_h2cli_nv[n++] = to;
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(atomic_load(&fx->slow_started), 0);
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_DEADLINE]), 1);
    free(c);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* Reads what a refused connection gets: the server's SETTINGS, a GOAWAY
 * ENHANCE_YOUR_CALM naming the connection limit, then the end. */
static void expect_goaway_refusal(int fd)
{
    uint8_t b[256];
    size_t got = 0;
    for (int i = 0; i < 300 && got < sizeof(b); i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10) <= 0)
            continue;
        ssize_t r = recv(fd, b + got, sizeof(b) - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    assert_true(got >= 9 + 17);
    assert_int_equal(b[3], NGHTTP2_SETTINGS);
    assert_int_equal(b[12], NGHTTP2_GOAWAY);
    assert_int_equal(b[25], NGHTTP2_ENHANCE_YOUR_CALM);
    assert_memory_equal(b + 26, "connection limit", 16);
}

/* Connection caps (router/net/rt_conn.h): at max_connections a silent
 * connection (idle: no call in progress) gives way to a new one with
 * GOAWAY; when every connection has a call in a handler the newcomer is
 * refused (SETTINGS + GOAWAY ENHANCE_YOUR_CALM) and closed. */
static void test_conn_cap(void **state)
{
    (void)state;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.max_connections = 3;
    cfg.max_connections_per_ip = 0;
    cfg.probe_reserve = 0; /* the cap alone; test_probe_reserve: with it */
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);
    struct tt_h2cli *c = calloc(4, sizeof(*c));
    assert_non_null(c);
    int silent[4];
    for (int i = 0; i < 4; i++) {
        silent[i] = tt_h2cli_connect(fx->port);
        usleep(30000);
    }
    /* The fourth took the place of the first, which got GOAWAY and EOF. */
    c[0].fd = silent[0];
    assert_true(tt_h2cli_wait_eof(&c[0], 3000));
    for (int i = 0; i < 4; i++)
        close(silent[i]);
    for (int i = 0; i < 300 && fx->srv.set.n_live > 0; i++)
        usleep(10000);
    assert_true(fx->srv.set.stats.evicted_idle >= 1);
    /* Three calls in their handlers: nothing can give way. */
    size_t n = tt_h2cli_std_nv("/test.Echo/Slow", "application/grpc",
                               "trailers", "POST");
    uint8_t buf[64];
    size_t blen = tt_h2cli_frame(buf, 0, "x", 1);
    for (int i = 0; i < 3; i++)
        assert_false(tt_h2cli_open(&c[i], fx->port, tt_h2cli_nv, n, buf,
                                   blen, 1, 200));
    assert_int_equal(wait_count(&fx->slow_started, 3), 3);
    int fd = tt_h2cli_connect(fx->port);
    expect_goaway_refusal(fd);
    close(fd);
    assert_int_equal(fx->srv.set.stats.rejected_max, 1);
    for (int i = 0; i < 3; i++)
        tt_h2cli_end(&c[i]);
    assert_int_equal(wait_count(&fx->cancels, 3), 3);
    free(c);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* The body budget: a message is charged as its bytes arrive; one whose
 * announced length does not fit ends its call with UNAVAILABLE, and the
 * charge of a message comes back when its handler returned. */
static void test_body_budget(void **state)
{
    (void)state;
    static struct rt_conn_budget budget;
    memset(&budget, 0, sizeof(budget));
    budget.limit = 96 << 10;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.max_message_bytes = 64 << 10;
    cfg.body_budget = &budget;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);
    struct tt_h2cli *c = calloc(2, sizeof(*c));
    assert_non_null(c);
    size_t n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc",
                               "trailers", "POST");
    /* A 60 KiB message of which the prefix and 40 KiB come: held, its
     * buffer grown (doubling) to the announced 60 KiB. */
    static uint8_t part[5 + (40 << 10)] = {0, 0, 0, 0xF0, 0x00};
    assert_false(tt_h2cli_open(&c[0], fx->port, tt_h2cli_nv, n, part,
                               sizeof(part), 0, 200));
    for (int i = 0; i < 300 && budget.used != 60 << 10; i++)
        usleep(10000);
    assert_int_equal(budget.used, 60 << 10);
    /* A second one of 60 KiB does not fit in 96 KiB. */
    assert_true(tt_h2cli_call(&c[1], fx->port, tt_h2cli_nv, n, part,
                              sizeof(part), 0, 3000));
    assert_int_equal(c[1].grpc_status, RT_GRPC_UNAVAILABLE);
    assert_non_null(strstr(c[1].grpc_msg, "memory budget"));
    assert_int_equal(budget.refused, 1);
    assert_int_equal(
        atomic_load(&fx->events[RT_GRPC_EVENT_BUDGET]), 1);
    /* The held one leaves: its charge comes back; a small call is served
     * and keeps nothing once its handler returned. */
    tt_h2cli_end(&c[0]);
    for (int i = 0; i < 300 && budget.used != 0; i++)
        usleep(10000);
    assert_int_equal(budget.used, 0);
    uint8_t buf[64];
    size_t blen = tt_h2cli_frame(buf, 0, "hello", 5);
    assert_true(tt_h2cli_call(&c[1], fx->port, tt_h2cli_nv, n, buf, blen, 1,
                              3000));
    assert_int_equal(c[1].grpc_status, 0);
    assert_int_equal(c[1].data_len, blen);
    assert_int_equal(budget.used, 0);
    assert_true(budget.peak >= 60 << 10);
    free(c);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* Bidirectional streams on the wire: several messages in, each echoed,
 * OK at the half-close; an error after some messages; a message over the
 * limit; a stream ending inside a message. */
static void test_bidi(void **state)
{
    (void)state;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.max_message_bytes = 1024;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);
    struct tt_h2cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    uint8_t *buf = calloc(1, 4096);
    assert_non_null(buf);
    size_t n = tt_h2cli_std_nv("/test.Echo/Bidi", "application/grpc",
                               "trailers", "POST");
    size_t blen = tt_h2cli_frame(buf, 0, "a", 1);
    blen += tt_h2cli_frame(buf + blen, 0, "bb", 2);
    blen += tt_h2cli_frame(buf + blen, 0, "", 0);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, blen);
    assert_memory_equal(c->data, buf, blen);
    /* No message at all: just OK. */
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, NULL, 0, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, 0);
    /* "fail" after one echo; the rest is not read. */
    blen = tt_h2cli_frame(buf, 0, "one", 3);
    blen += tt_h2cli_frame(buf + blen, 0, "fail", 4);
    blen += tt_h2cli_frame(buf + blen, 0, "never", 5);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_string_equal(c->grpc_msg, "bidi failed");
    assert_int_equal(c->data_len, 8);
    /* Over the message limit, arriving with the first message: refused
     * before the handler ran. */
    char big[2000];
    memset(big, 'z', sizeof(big));
    blen = tt_h2cli_frame(buf, 0, "ok", 2);
    blen += tt_h2cli_frame(buf + blen, 0, big, sizeof(big));
    int before = atomic_load(&fx->cancels);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(c->grpc_msg, "exceeds the limit"));
    assert_int_equal(atomic_load(&fx->cancels), before);
    /* ... and later, once the handler holds the call: it loses the call
     * (cancel callback), the client gets RESOURCE_EXHAUSTED. */
    blen = tt_h2cli_frame(buf, 0, "ok", 2);
    assert_false(tt_h2cli_open(c, fx->port, tt_h2cli_nv, n, buf, blen, 0, 300));
    assert_int_equal(c->data_len, blen);
    blen = tt_h2cli_frame(buf, 0, big, sizeof(big));
    c->body = buf;
    c->body_len = blen;
    c->body_off = 0;
    assert_int_equal(nghttp2_session_resume_data(c->s, c->sid), 0);
    assert_true(tt_h2cli_pump(c, 3000));
    tt_h2cli_end(c);
    assert_int_equal(c->grpc_status, RT_GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(wait_count(&fx->cancels, before + 1), before + 1);
    assert_int_equal(atomic_load(&fx->events[RT_GRPC_EVENT_TOO_LARGE]), 2);
    /* The stream ends inside a message. */
    blen = tt_h2cli_frame(buf, 0, "hello", 5) - 2;
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "inside a message"));
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);
    free(buf);
    free(c);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* Server close is graceful: a Watch stream gets its last state
 * (NOT_SERVING) and ends with UNAVAILABLE; a running stream ends with
 * UNAVAILABLE (its cancel callback ran); both reach the client before the
 * connection closes. */
static void test_close_graceful(void **state)
{
    (void)state;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start(fx);
    struct tt_h2cli *w = calloc(1, sizeof(*w));
    struct tt_h2cli *t = calloc(1, sizeof(*t));
    assert_non_null(w);
    assert_non_null(t);
    uint8_t buf[64];
    size_t n = tt_h2cli_std_nv("/grpc.health.v1.Health/Watch",
                               "application/grpc", "trailers", "POST");
    size_t blen =
        tt_h2cli_frame(buf, 0, "", 0); /* HealthCheckRequest{service: ""} */
    assert_false(tt_h2cli_open(w, fx->port, tt_h2cli_nv, n, buf, blen, 1, 300));
    static const uint8_t serving[] = {0, 0, 0, 0, 2, 0x08, 0x01};
    static const uint8_t not_serving[] = {0, 0, 0, 0, 2, 0x08, 0x02};
    assert_int_equal(w->data_len, sizeof(serving));
    assert_memory_equal(w->data, serving, sizeof(serving));
    n = tt_h2cli_std_nv("/test.Echo/Ticks", "application/grpc", "trailers",
                        "POST");
    blen = tt_h2cli_frame(buf, 0, "1000000", 7);
    assert_false(tt_h2cli_open(t, fx->port, tt_h2cli_nv, n, buf, blen, 1, 100));
    assert_true(t->data_len > 0);
    tt_grpc_fx_stop(fx);
    assert_true(tt_h2cli_pump(w, 3000));
    assert_int_equal(w->data_len, 2 * sizeof(serving));
    assert_memory_equal(w->data + sizeof(serving), not_serving,
                        sizeof(not_serving));
    assert_int_equal(w->grpc_status, RT_GRPC_UNAVAILABLE);
    assert_string_equal(w->grpc_msg, "the server is shutting down");
    assert_true(tt_h2cli_pump(t, 3000));
    assert_int_equal(t->grpc_status, RT_GRPC_UNAVAILABLE);
    assert_true(tt_h2cli_wait_eof(w, 3000));
    assert_true(tt_h2cli_wait_eof(t, 3000));
    assert_int_equal(atomic_load(&fx->cancels), 1); /* the Ticks call */
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);
    tt_h2cli_end(w);
    tt_h2cli_end(t);
    free(w);
    free(t);
    free(fx);
}

/* ---- reflection over a set with imports --------------------------------- */

/* The oneof cases of reflection requests and responses, shorter. */
#define REQ_(x)                                                            \
    GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_##x
#define RESP_(x)                                                           \
    GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_##x

/* Packs one descriptor_index File into a malloc'd buffer. */
static ProtobufCBinaryData pack_file(const Tangram__Descidx__File *f)
{
    ProtobufCBinaryData b;
    b.len = tangram__descidx__file__get_packed_size(f);
    b.data = malloc(b.len + 1);
    assert_non_null(b.data);
    tangram__descidx__file__pack(f, b.data);
    return b;
}

/* A FileDescriptorSet (malloc'd, *len bytes): a.proto declares pa.M;
 * b.proto imports it and declares pb.N and the extension pb.tag = 100 of
 * pa.M; c.proto imports b.proto and declares service pc.S with method Go.
 * Without `with_a`, a.proto is left out (a broken set). */
static uint8_t *make_set(int with_a, size_t *len)
{
    Tangram__Descidx__Message m = TANGRAM__DESCIDX__MESSAGE__INIT;
    Tangram__Descidx__Message n = TANGRAM__DESCIDX__MESSAGE__INIT;
    Tangram__Descidx__Field ext = TANGRAM__DESCIDX__FIELD__INIT;
    Tangram__Descidx__Method go = TANGRAM__DESCIDX__METHOD__INIT;
    Tangram__Descidx__Service svc = TANGRAM__DESCIDX__SERVICE__INIT;
    Tangram__Descidx__File fa = TANGRAM__DESCIDX__FILE__INIT;
    Tangram__Descidx__File fb = TANGRAM__DESCIDX__FILE__INIT;
    Tangram__Descidx__File fc = TANGRAM__DESCIDX__FILE__INIT;
    m.name = "M";
    n.name = "N";
    ext.name = "tag";
    ext.extendee = ".pa.M";
    ext.has_number = 1;
    ext.number = 100;
    go.name = "Go";
    svc.name = "S";
    Tangram__Descidx__Method *gos[] = {&go};
    svc.n_method = 1;
    svc.method = gos;
    Tangram__Descidx__Message *ma[] = {&m}, *mb[] = {&n};
    Tangram__Descidx__Field *exts[] = {&ext};
    Tangram__Descidx__Service *svcs[] = {&svc};
    char *dep_a[] = {"a.proto"}, *dep_b[] = {"b.proto"};
    fa.name = "a.proto";
    fa.package = "pa";
    fa.n_message_type = 1;
    fa.message_type = ma;
    fb.name = "b.proto";
    fb.package = "pb";
    fb.n_dependency = 1;
    fb.dependency = dep_a;
    fb.n_message_type = 1;
    fb.message_type = mb;
    fb.n_extension = 1;
    fb.extension = exts;
    fc.name = "c.proto";
    fc.package = "pc";
    fc.n_dependency = 1;
    fc.dependency = dep_b;
    fc.n_service = 1;
    fc.service = svcs;
    ProtobufCBinaryData files[3];
    size_t nf = 0;
    if (with_a)
        files[nf++] = pack_file(&fa);
    files[nf++] = pack_file(&fb);
    files[nf++] = pack_file(&fc);
    Tangram__Descidx__FileSet set = TANGRAM__DESCIDX__FILE_SET__INIT;
    set.n_file = nf;
    set.file = files;
    *len = tangram__descidx__file_set__get_packed_size(&set);
    uint8_t *out = malloc(*len + 1);
    assert_non_null(out);
    tangram__descidx__file_set__pack(&set, out);
    for (size_t i = 0; i < nf; i++)
        free(files[i].data);
    return out;
}

/* Appends one framed ServerReflectionRequest to buf at *off. */
static void put_request(uint8_t *buf, size_t *off,
                        const Grpc__Reflection__V1__ServerReflectionRequest *q)
{
    size_t n =
        grpc__reflection__v1__server_reflection_request__get_packed_size(q);
    buf[*off] = 0;
    buf[*off + 1] = (uint8_t)(n >> 24);
    buf[*off + 2] = (uint8_t)(n >> 16);
    buf[*off + 3] = (uint8_t)(n >> 8);
    buf[*off + 4] = (uint8_t)n;
    grpc__reflection__v1__server_reflection_request__pack(q, buf + *off + 5);
    *off += 5 + n;
}

/* The file names of a file_descriptor_response, comma-separated. */
static void file_names(const Grpc__Reflection__V1__ServerReflectionResponse *r,
                       char *out, size_t cap)
{
    out[0] = '\0';
    assert_int_equal(r->message_response_case, RESP_(FILE_DESCRIPTOR_RESPONSE));
    const Grpc__Reflection__V1__FileDescriptorResponse *f =
        r->file_descriptor_response;
    for (size_t i = 0; i < f->n_file_descriptor_proto; i++) {
        Tangram__Descidx__File *p = tangram__descidx__file__unpack(
            NULL, f->file_descriptor_proto[i].len,
            f->file_descriptor_proto[i].data);
        assert_non_null(p);
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s%s", i ? "," : "", p->name);
        tangram__descidx__file__free_unpacked(p, NULL);
    }
}

/* Reflection answers with the transitive imports of a file (the file
 * first), finds extensions, and refuses a set that lacks an import. */
static void test_reflect_imports(void **state)
{
    (void)state;
    char err[256];
    size_t len;
    uint8_t *set = make_set(0, &len);
    uv_loop_t loop;
    struct rt_grpc_server srv;
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(rt_grpc_server_init(&srv, &loop, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(rt_grpc_reflect_register(&srv, set, len, err,
                                              sizeof(err)),
                     TG_EFORMAT);
    assert_non_null(strstr(err, "b.proto imports a.proto"));
    free(set);
    static const uint8_t garbage[] = {0x0a, 0x05, 0x01};
    assert_int_equal(rt_grpc_reflect_register(&srv, garbage, sizeof(garbage),
                                              err, sizeof(err)),
                     TG_EFORMAT);
    rt_grpc_server_close(&srv, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    rt_grpc_server_free(&srv);
    assert_int_equal(uv_loop_close(&loop), 0);

    set = make_set(1, &len);
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_set(fx, NULL, set, len);
    free(set); /* copied by the server */
    uint8_t *buf = malloc(4096);
    assert_non_null(buf);
    size_t off = 0;
    Grpc__Reflection__V1__ServerReflectionRequest q =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
    Grpc__Reflection__V1__ExtensionRequest x =
        GRPC__REFLECTION__V1__EXTENSION_REQUEST__INIT;
#define ASK(kind, field, value)                                            \
    q.message_request_case = REQ_(kind);                                   \
    q.field = value;                                                       \
    put_request(buf, &off, &q)
    ASK(FILE_CONTAINING_SYMBOL, file_containing_symbol, "pc.S.Go");
    ASK(FILE_CONTAINING_SYMBOL, file_containing_symbol, ".pb.tag");
    ASK(FILE_BY_FILENAME, file_by_filename, "a.proto");
    x.containing_type = "pa.M";
    x.extension_number = 100;
    ASK(FILE_CONTAINING_EXTENSION, file_containing_extension, &x);
    ASK(ALL_EXTENSION_NUMBERS_OF_TYPE, all_extension_numbers_of_type, "pa.M");
    ASK(ALL_EXTENSION_NUMBERS_OF_TYPE, all_extension_numbers_of_type, "pc.S");
#undef ASK
    struct tt_h2cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    size_t n = tt_h2cli_std_nv("/grpc.reflection.v1.ServerReflection/"
                      "ServerReflectionInfo",
                      "application/grpc", "trailers", "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, off, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    Grpc__Reflection__V1__ServerReflectionResponse *r[6];
    size_t at = 0;
    for (int i = 0; i < 6; i++) {
        assert_true(at + 5 <= c->data_len);
        size_t ml = (size_t)c->data[at + 1] << 24 |
                    (size_t)c->data[at + 2] << 16 |
                    (size_t)c->data[at + 3] << 8 | c->data[at + 4];
        r[i] = grpc__reflection__v1__server_reflection_response__unpack(
            NULL, ml, c->data + at + 5);
        assert_non_null(r[i]);
        at += 5 + ml;
    }
    assert_int_equal(at, c->data_len);
    char names[128];
    file_names(r[0], names, sizeof(names));
    assert_string_equal(names, "c.proto,b.proto,a.proto");
    file_names(r[1], names, sizeof(names));
    assert_string_equal(names, "b.proto,a.proto");
    file_names(r[2], names, sizeof(names));
    assert_string_equal(names, "a.proto");
    file_names(r[3], names, sizeof(names));
    assert_string_equal(names, "b.proto,a.proto");
    assert_int_equal(r[4]->message_response_case,
                     RESP_(ALL_EXTENSION_NUMBERS_RESPONSE));
    assert_string_equal(r[4]->all_extension_numbers_response->base_type_name,
                        "pa.M");
    assert_int_equal(r[4]->all_extension_numbers_response->n_extension_number,
                     1);
    assert_int_equal(r[4]->all_extension_numbers_response->extension_number[0],
                     100);
    /* A service is no message type. */
    assert_int_equal(r[5]->message_response_case, RESP_(ERROR_RESPONSE));
    assert_int_equal(r[5]->error_response->error_code, RT_GRPC_NOT_FOUND);
    for (int i = 0; i < 6; i++)
        grpc__reflection__v1__server_reflection_response__free_unpacked(r[i],
                                                                       NULL);
    free(c);
    free(buf);
    tt_grpc_fx_stop(fx);
    free(fx);
}
int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recv_timeout),
        cmocka_unit_test(test_idle_open_stream),
        cmocka_unit_test(test_max_streams),
        cmocka_unit_test(test_admission_and_early_deadline),
        cmocka_unit_test(test_conn_cap),
        cmocka_unit_test(test_body_budget),
        cmocka_unit_test(test_bidi),
        cmocka_unit_test(test_close_graceful),
        cmocka_unit_test(test_reflect_imports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
