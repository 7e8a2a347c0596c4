/* test_grpc.c — the router's gRPC server (rt_grpc): pure helpers
 * (timeout parsing, message encoding), configuration and API misuse, and
 * the server on real loopback sockets (fixture with demo methods in
 * tests/support/tt_grpc.{h,c}) driven by the small nghttp2 client of
 * tests/support/tt_h2cli.{h,c} for what a real gRPC client never sends:
 * wrong :method / content-type / te, compressed or bad flags, zero / two /
 * truncated / oversized messages, huge headers, grpc-timeout deadlines
 * (malformed too), a client vanishing mid-call, plus a raw echo; then the
 * idle timeout and server close with a call in flight. The limits and
 * streaming kinds added for hardening are in test_grpc_limits.c; the
 * checks with Debian's python3-grpcio client in test_grpc_grpcio.c. */
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
#include "router/net/rt_grpc.h"
#include "tests/support/tt_grpc.h"
#include "tests/support/tt_h2cli.h"

/* ---- tests ------------------------------------------------------------- */

static void test_timeout_parse(void **state)
{
    (void)state;
    uint64_t ms = 0;
    assert_int_equal(rt_grpc_timeout_parse("1H", &ms), 0);
    assert_int_equal(ms, 3600000);
    assert_int_equal(rt_grpc_timeout_parse("2M", &ms), 0);
    assert_int_equal(ms, 120000);
    assert_int_equal(rt_grpc_timeout_parse("3S", &ms), 0);
    assert_int_equal(ms, 3000);
    assert_int_equal(rt_grpc_timeout_parse("250m", &ms), 0);
    assert_int_equal(ms, 250);
    assert_int_equal(rt_grpc_timeout_parse("1500u", &ms), 0);
    assert_int_equal(ms, 2); /* rounded up */
    assert_int_equal(rt_grpc_timeout_parse("1n", &ms), 0);
    assert_int_equal(ms, 1);
    assert_int_equal(rt_grpc_timeout_parse("0m", &ms), 0);
    assert_int_equal(ms, 0);
    assert_int_equal(rt_grpc_timeout_parse("99999999H", &ms), 0);
    assert_int_equal(ms, 99999999ull * 3600000ull);
    const char *bad[] = {"", "m", "123456789m", "10", "10x", "10mm",
                         "-1m", " 1m", "1.5S", "1 m"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(rt_grpc_timeout_parse(bad[i], &ms), TG_EFORMAT);
    assert_int_equal(rt_grpc_timeout_parse(NULL, &ms), TG_EFORMAT);
}

static void test_message_encode(void **state)
{
    (void)state;
    char out[64];
    assert_int_equal(rt_grpc_message_encode("plain text", out, sizeof(out)),
                     10);
    assert_string_equal(out, "plain text");
    /* '%', control bytes and UTF-8 bytes are escaped. */
    assert_int_equal(rt_grpc_message_encode("100% ü\n", out, sizeof(out)),
                     16);
    assert_string_equal(out, "100%25 %C3%BC%0A");
    assert_int_equal(rt_grpc_message_encode("~\x7f", out, sizeof(out)), 4);
    assert_string_equal(out, "~%7F");
    /* Truncation never splits an escape; the full length is returned. */
    assert_int_equal(rt_grpc_message_encode("ab%", out, 4), 5);
    assert_string_equal(out, "ab");
    assert_int_equal(rt_grpc_message_encode("abc", out, 1), 3);
    assert_string_equal(out, "");
    assert_int_equal(rt_grpc_message_encode(NULL, out, sizeof(out)), 0);
    assert_string_equal(out, "");
    assert_int_equal(rt_grpc_message_encode("x", NULL, 0), 1);
    assert_string_equal(rt_grpc_status_name(0), "OK");
    assert_string_equal(rt_grpc_status_name(8), "RESOURCE_EXHAUSTED");
    assert_string_equal(rt_grpc_status_name(16), "UNAUTHENTICATED");
    assert_string_equal(rt_grpc_status_name(17), "UNKNOWN");
    assert_string_equal(rt_grpc_status_name(-1), "UNKNOWN");
}

static void dummy_handler(struct rt_grpc_call *call, void *ud)
{
    (void)call;
    (void)ud;
}

static void test_config_and_misuse(void **state)
{
    (void)state;
    uv_loop_t loop;
    struct rt_grpc_server srv;
    struct rt_grpc_config cfg;
    char err[256];
    assert_int_equal(uv_loop_init(&loop), 0);
    rt_grpc_config_default(&cfg);
    assert_int_equal(cfg.max_message_bytes, 4u << 20);
    cfg.max_message_bytes = 8;
    assert_int_equal(rt_grpc_server_init(&srv, &loop, &cfg, err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, "max_message_bytes"));
    rt_grpc_server_free(&srv);
    rt_grpc_config_default(&cfg);
    cfg.window_bytes = 100;
    assert_int_equal(rt_grpc_server_init(&srv, &loop, &cfg, err, sizeof(err)),
                     TG_EINVAL);
    rt_grpc_server_free(&srv);
    rt_grpc_config_default(&cfg);
    cfg.max_concurrent_streams = 0;
    assert_int_equal(rt_grpc_server_init(&srv, &loop, &cfg, err, sizeof(err)),
                     TG_EINVAL);
    rt_grpc_server_free(&srv);
    rt_grpc_config_default(&cfg);
    assert_int_equal(cfg.recv_timeout_ms, 30000);
    cfg.recv_timeout_ms = 0;
    assert_int_equal(rt_grpc_server_init(&srv, &loop, &cfg, err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, "recv_timeout_ms"));
    rt_grpc_server_free(&srv);

    assert_int_equal(rt_grpc_server_init(&srv, &loop, NULL, err, sizeof(err)),
                     0);
    const char *bad[] = {"", "x/y", "/", "/svc", "/svc/", "//m", "/a/b/c"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(rt_grpc_method_add(&srv, bad[i], RT_GRPC_UNARY,
                                            dummy_handler, NULL, err,
                                            sizeof(err)),
                         TG_EINVAL);
    assert_int_equal(rt_grpc_method_add(&srv, "/a.B/C", RT_GRPC_UNARY, NULL,
                                        NULL, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(rt_grpc_method_add(&srv, "/a.B/C", (enum rt_grpc_kind)7,
                                        dummy_handler, NULL, err, sizeof(err)),
                     TG_EINVAL);
    /* Many methods: the table grows. */
    for (int i = 0; i < 40; i++) {
        char p[32];
        snprintf(p, sizeof(p), "/a.B/M%d", i);
        assert_int_equal(rt_grpc_method_add(&srv, p, RT_GRPC_UNARY,
                                            dummy_handler, NULL, err,
                                            sizeof(err)),
                         0);
    }
    assert_int_equal(rt_grpc_health_register(&srv, NULL, NULL, err,
                                              sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(rt_grpc_server_listen(&srv, "not-an-ip", 0, err,
                                           sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(rt_grpc_server_listen(&srv, "127.0.0.1", 70000, err,
                                           sizeof(err)),
                     TG_EINVAL);
    rt_grpc_server_close(&srv, NULL, NULL);
    rt_grpc_server_close(&srv, NULL, NULL); /* no-op */
    assert_int_equal(rt_grpc_server_listen(&srv, "127.0.0.1", 0, err,
                                           sizeof(err)),
                     TG_EINVAL);
    uv_run(&loop, UV_RUN_DEFAULT);
    rt_grpc_server_free(&srv);
    assert_int_equal(uv_loop_close(&loop), 0);

    /* free on a zeroed server */
    memset(&srv, 0, sizeof(srv));
    rt_grpc_server_free(&srv);
}

static void test_raw_protocol(void **state)
{
    (void)state;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start(fx);
    struct tt_h2cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    uint8_t *buf = malloc(1 << 16);
    assert_non_null(buf);
    size_t n, blen;

    /* A well-formed echo. */
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc+proto",
                        "trailers", "POST");
    blen = tt_h2cli_frame(buf, 0, "hello", 5);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->http_status, 200);
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, 10);
    assert_memory_equal(c->data, "\0\0\0\0\5hello", 10);

    /* Empty message echoes as an empty message. */
    blen = tt_h2cli_frame(buf, 0, "", 0);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, 5);

    /* Wrong content-type -> 415. */
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/json", "trailers",
                        "POST");
    blen = tt_h2cli_frame(buf, 0, "hello", 5);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->http_status, 415);
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "content-type"));
    n = tt_h2cli_std_nv("/test.Echo/Unary", NULL, "trailers", "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->http_status, 415);

    /* GET -> 405. */
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc", "trailers",
                        "GET");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, NULL, 0, 1, 3000));
    assert_int_equal(c->http_status, 405);
    assert_int_equal(c->grpc_status, RT_GRPC_UNIMPLEMENTED);

    /* No te: trailers. */
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc", NULL, "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->http_status, 200);
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "te: trailers"));

    /* Unknown method, trailers-only. */
    n = tt_h2cli_std_nv("/test.Echo/Nope", "application/grpc", "trailers",
                        "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_UNIMPLEMENTED);
    assert_int_equal(c->data_len, 0);
    assert_non_null(strstr(c->grpc_msg, "/test.Echo/Nope"));

    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc", "trailers",
                        "POST");
    /* Compressed flag. */
    blen = tt_h2cli_frame(buf, 1, "hello", 5);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_UNIMPLEMENTED);
    assert_string_equal(c->grpc_msg, "compression not supported");
    /* A flag that is neither 0 nor 1. */
    blen = tt_h2cli_frame(buf, 2, "hello", 5);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    /* Two messages. */
    blen = tt_h2cli_frame(buf, 0, "a", 1);
    blen += tt_h2cli_frame(buf + blen, 0, "b", 1);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "exactly one"));
    /* No message at all. */
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, NULL, 0, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    /* Truncated message. */
    blen = tt_h2cli_frame(buf, 0, "hello", 5) - 2;
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "inside a message"));
    /* Prefix announcing 5 MiB, the stream left open: answered at once,
     * then RST_STREAM NO_ERROR stops the upload. */
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = 0x50;
    buf[3] = 0;
    buf[4] = 0;
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, 5, 0, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(c->grpc_msg, "exceeds the limit"));
    assert_int_equal(c->close_code, NGHTTP2_NO_ERROR);

    /* Unary handler misuse is refused; the call still completes. */
    n = tt_h2cli_std_nv("/test.Echo/Twice", "application/grpc", "trailers",
                        "POST");
    blen = tt_h2cli_frame(buf, 0, "x", 1);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, 8);
    /* A unary handler that finishes OK without a message. */
    n = tt_h2cli_std_nv("/test.Echo/Empty", "application/grpc", "trailers",
                        "POST");
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INTERNAL);
    assert_int_equal(c->data_len, 0);
    assert_non_null(strstr(c->grpc_msg, "without a response message"));

    /* Headers over the limit. */
    n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc", "trailers",
                        "POST");
    char *big = malloc(17000);
    assert_non_null(big);
    memset(big, 'a', 16999);
    big[16999] = '\0';
    nghttp2_nv bh = TT_H2_NV("x-big", "");
    bh.value = (uint8_t *)big;
    bh.valuelen = 16999;
    tt_h2cli_nv[n++] = bh;
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_RESOURCE_EXHAUSTED);
    free(big);

    /* Deadlines from grpc-timeout: the server answers DEADLINE_EXCEEDED
     * and fires on_cancel with that status. */
    n = tt_h2cli_std_nv("/test.Echo/Slow", "application/grpc", "trailers",
                        "POST");
    nghttp2_nv to = TT_H2_NV("grpc-timeout", "150m");
    tt_h2cli_nv[n++] = to;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1,
                              15000));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long el = (t1.tv_sec - t0.tv_sec) * 1000 +
              (t1.tv_nsec - t0.tv_nsec) / 1000000;
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    /* Its own 150 ms deadline: not before (less 10 ms of clock rounding);
     * the upper bound is the call's 15 s limit above (a deadline never
     * applied leaves the slow call unanswered), which a loaded machine's
     * delay does not come near. */
    assert_true(el >= 140);
    assert_int_equal(atomic_load(&fx->cancel_deadline), 1);
    /* A deadline that passes before the request is complete. */
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, 3, 0, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(atomic_load(&fx->cancel_deadline), 1); /* no handler */
    /* Malformed grpc-timeout. */
    nghttp2_nv bad = TT_H2_NV("grpc-timeout", "soon");
    tt_h2cli_nv[n - 1] = bad;
    assert_true(tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "grpc-timeout"));

    /* A client that vanishes mid-call: on_cancel with CANCELLED. */
    int before = atomic_load(&fx->cancels);
    n = tt_h2cli_std_nv("/test.Echo/Slow", "application/grpc", "trailers",
                        "POST");
    tt_h2cli_call(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 200);
    for (int i = 0; i < 200 && atomic_load(&fx->cancels) == before; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&fx->cancels), before + 1);
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);

    free(buf);
    free(c);
    tt_grpc_fx_stop(fx);
    free(fx);
}

/* Idle connections close after idle_timeout_ms (GOAWAY, then EOF), but
 * not while a call is open; closing the server cancels calls in flight. */
static void test_idle_and_close(void **state)
{
    (void)state;
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.idle_timeout_ms = 100;
    struct tt_grpc_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    tt_grpc_fx_start_cfg(fx, &cfg);
    struct tt_h2cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    uint8_t buf[64];
    size_t n = tt_h2cli_std_nv("/test.Echo/Unary", "application/grpc",
                               "trailers", "POST");
    size_t blen = tt_h2cli_frame(buf, 0, "hi", 2);
    assert_true(tt_h2cli_open(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_true(tt_h2cli_wait_eof(c, 3000)); /* idle close */
    tt_h2cli_end(c);

    n = tt_h2cli_std_nv("/test.Echo/Slow", "application/grpc", "trailers",
                        "POST");
    assert_false(tt_h2cli_open(c, fx->port, tt_h2cli_nv, n, buf, blen, 1, 300));
    assert_false(tt_h2cli_wait_eof(c, 100)); /* a call is open: no idle close */
    assert_int_equal(atomic_load(&fx->slow_started), 1);
    assert_int_equal(atomic_load(&fx->cancels), 0);
    tt_grpc_fx_stop(fx); /* cancels the call */
    assert_int_equal(atomic_load(&fx->cancels), 1);
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);
    assert_true(tt_h2cli_wait_eof(c, 3000));
    tt_h2cli_end(c);
    free(c);
    free(fx);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout_parse),
        cmocka_unit_test(test_message_encode),
        cmocka_unit_test(test_config_and_misuse),
        cmocka_unit_test(test_raw_protocol),
        cmocka_unit_test(test_idle_and_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
