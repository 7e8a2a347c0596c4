/* test_http_stream.c — the router's HTTP/1.1 server (rt_http) over real
 * loopback sockets: SSE streaming and the end of requests. The server
 * fixture and the raw client live in tests/support/tt_http.{h,c};
 * plain requests and limits are in test_http.c.
 *
 * Covered: SSE streaming (chunked on HTTP/1.1, close-delimited on
 * HTTP/1.0) with a keep-alive follow-up, client disconnect mid-stream and
 * while waiting, by FIN and by RST (on_abort exactly once), a handler
 * without on_abort finishing after the client left (TG_ECANCELED), server
 * close with a stream in flight (aborted before close returns), and
 * init/listen errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "router/net/rt_http.h"
#include "tests/support/tt_http.h"

/* ---- tests ---------------------------------------------------------- */

static void test_sse(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /sse?n=4 HTTP/1.1\r\nHost: t\r\n\r\n");
    struct tt_http_resp r;
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    assert_true(tt_http_head_has(&r, "Content-Type: text/event-stream"));
    assert_true(tt_http_head_has(&r, "Cache-Control: no-cache"));
    assert_false(tt_http_head_has(&r, "Content-Length"));
    assert_string_equal(r.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\n"
                                "data: {\"i\":2}\n\ndata: {\"i\":3}\n\n"
                                "data: [DONE]\n\n");
    free(r.body);
    /* Keep-alive after a stream. */
    tt_http_cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_string_equal(r.body, "hello");
    free(r.body);
    tt_http_cli_close(&c);

    /* HTTP/1.0: no chunked coding, the close ends the body. */
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /sse?n=2 HTTP/1.0\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_false(r.chunked);
    assert_true(tt_http_head_has(&r, "Connection: close"));
    assert_string_equal(r.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\n"
                                "data: [DONE]\n\n");
    free(r.body);
    tt_http_cli_close(&c);
}

static int wait_atomic(atomic_int *v, int want)
{
    for (int i = 0; i < 200 && atomic_load(v) != want; i++)
        tt_http_sleep_ms(10);
    return atomic_load(v);
}

static void test_disconnect_mid_stream(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /forever HTTP/1.1\r\nHost: t\r\n\r\n");
    /* Wait for the head and a couple of events, then vanish. */
    while (!memmem(c.buf, c.len, "\"i\":1", 5))
        assert_int_equal(tt_http_cli_fill(&c), 0);
    tt_http_cli_close(&c);
    assert_int_equal(wait_atomic(&fx->aborts, 1), 1);
    int events = atomic_load(&fx->stream_events);
    tt_http_sleep_ms(100);
    assert_int_equal(atomic_load(&fx->aborts), 1);            /* once */
    assert_int_equal(atomic_load(&fx->stream_events), events); /* stopped */
    tt_http_expect_no_conns_left(fx);

    /* Disconnect while the answer is still being computed. */
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /delay?ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n");
    tt_http_sleep_ms(30);
    tt_http_cli_close(&c);
    assert_int_equal(wait_atomic(&fx->aborts, 2), 2);

    /* Reset (RST) instead of FIN. */
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /forever HTTP/1.1\r\nHost: t\r\n\r\n");
    while (!memmem(c.buf, c.len, "\"i\":0", 5))
        assert_int_equal(tt_http_cli_fill(&c), 0);
    struct linger lg = {1, 0};
    setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    tt_http_cli_close(&c);
    assert_int_equal(wait_atomic(&fx->aborts, 3), 3);
    tt_http_expect_no_conns_left(fx);
}

/* A handler without on_abort finishes after its client left: the call is
 * refused with TG_ECANCELED and frees the handle (ASan checks that). */
static void test_zombie(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /zombie HTTP/1.1\r\nHost: t\r\n\r\n");
    tt_http_sleep_ms(20);
    tt_http_cli_close(&c);
    assert_int_equal(wait_atomic(&fx->zombie_done, 1), 1);
    assert_int_equal(atomic_load(&fx->zombie_rc), TG_ECANCELED);
    assert_int_equal(atomic_load(&fx->aborts), 0);
}

/* Server close with requests in flight aborts them (before close returns);
 * init and listen errors; the loop driven from the test thread. */
static void closed_cb(void *ud)
{
    *(int *)ud += 1;
}

static void test_close_in_flight_and_errors(void **state)
{
    (void)state;
    char err[256];
    signal(SIGPIPE, SIG_IGN); /* as the router does */
    struct tt_http_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    struct rt_http_config cfg;
    rt_http_config_default(&cfg);
    cfg.max_header_bytes = 10;
    struct rt_http_server bad;
    assert_int_equal(
        rt_http_server_init(&bad, &fx->loop, &cfg, err, sizeof(err)),
        TG_EINVAL);
    assert_non_null(strstr(err, "max_header_bytes"));
    rt_http_server_free(&bad); /* safe after a failed init */
    struct rt_http_server zero;
    memset(&zero, 0, sizeof(zero));
    rt_http_server_free(&zero); /* and on a zeroed one */

    assert_int_equal(
        rt_http_server_init(&fx->srv, &fx->loop, NULL, err, sizeof(err)), 0);
    assert_int_equal(rt_http_server_listen(&fx->srv, "not-an-ip", 0, err,
                                           sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(rt_http_server_listen(&fx->srv, "127.0.0.1", 70000, err,
                                           sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(rt_http_route_add(&fx->srv, "GET", "/forever",
                                       tt_http_sse_handler, fx,
                                       err, sizeof(err)),
                     0);
    assert_int_equal(
        rt_http_server_listen(&fx->srv, "127.0.0.1", 0, err, sizeof(err)), 0);
    /* A second server cannot take the same port. */
    struct rt_http_server other;
    assert_int_equal(
        rt_http_server_init(&other, &fx->loop, NULL, err, sizeof(err)), 0);
    assert_int_equal(rt_http_server_listen(&other, "127.0.0.1",
                                           fx->srv.set.port, err, sizeof(err)),
                     TG_EIO);
    rt_http_server_close(&other, NULL, NULL);

    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a4 = {0};
    a4.sin_family = AF_INET;
    a4.sin_port = htons((uint16_t)fx->srv.set.port);
    a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a4, sizeof(a4)), 0);
    const char *q = "GET /forever HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(send(fd, q, strlen(q), 0), (ssize_t)strlen(q));
    for (int i = 0; i < 500 && atomic_load(&fx->stream_events) < 2; i++)
        uv_run(&fx->loop, UV_RUN_ONCE);
    assert_true(atomic_load(&fx->stream_events) >= 2);
    int closed = 0;
    rt_http_server_close(&fx->srv, closed_cb, &closed);
    assert_int_equal(atomic_load(&fx->aborts), 1); /* before close returns */
    rt_http_server_close(&fx->srv, closed_cb, &closed); /* twice: no-op */
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_int_equal(closed, 1);
    rt_http_server_free(&fx->srv);
    rt_http_server_free(&other);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    close(fd);
    free(fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sse, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_disconnect_mid_stream,
                                        tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_zombie, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test(test_close_in_flight_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
