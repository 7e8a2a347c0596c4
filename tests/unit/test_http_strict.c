/* test_http_strict.c — the router's HTTP/1.1 server (rt_http) refusing
 * what a lenient parser would accept, over real loopback sockets (fixture
 * in tests/support/tt_http.{h,c}).
 *
 * Covered: every framing that lets a request be smuggled past a proxy
 * (bare LF or CR line ends, chunk data without CRLF, obs-fold and leading
 * whitespace, "Host : x", HTTP versions other than 1.x, Content-Length with
 * Transfer-Encoding, two Content-Lengths, unknown or repeated transfer
 * codings, Transfer-Encoding on HTTP/1.0, bad header names, a missing,
 * doubled or malformed Host, oversized and malformed chunk sizes, bad
 * trailers) gets 400 (501, 505, 413) and a close; the well-formed
 * neighbours of each case still work; trailers are dropped safely; a
 * half-closed client gets its answers; the head check refuses before any
 * body byte is read, before 404/405, and without 100 Continue. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/base/tg_err.h"
#include "router/net/rt_http.h"
#include "tests/support/tt_http.h"

#define H "Host: t\r\n"

static void expect_status(struct tt_http_fx *fx, const char *raw, int status,
                          const char *body)
{
    struct tt_http_resp r;
    tt_http_one_shot(fx, raw, &r);
    if (r.status != status)
        fail_msg("status %d, want %d, for: %s", r.status, status, raw);
    if (body)
        assert_string_equal(r.body, body);
    free(r.body);
}

/* Line endings and line folding: bare LF, bare CR, obs-fold, whitespace
 * before the first header, chunk data not followed by CRLF. */
static void test_line_framing(void **state)
{
    struct tt_http_fx *fx = *state;
    static const char *const bad[] = {
        "GET /hello HTTP/1.1\nHost: t\n\n",
        "GET /hello HTTP/1.1\r\nHost: t\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: t\nX-A: b\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: t\r\nX-A: b\rX-C: d\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: t\r\nX-A: b\r\n c\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: t\r\nX-A: b\r\n\tc\r\n\r\n",
        "GET /hello HTTP/1.1\r\n Host: t\r\n\r\n",
        /* chunk data followed by something else than CRLF */
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
        "3\r\nabcXX0\r\n\r\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\n0\r\n\r\n",
        /* bare LF in a chunk-size line (inside an extension) */
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
        "3;a\nb\r\nabc\r\n0\r\n\r\n",
        /* bare LF or folding in the trailer section */
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\r\n0\r\n\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\r\n0\r\nX-T: a\r\n b\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        tt_http_expect_error_close(fx, bad[i], 400);
    /* The well-formed neighbours. */
    expect_status(fx, "\r\nGET /hello HTTP/1.1\r\nHost: t\r\n\r\n", 200,
                  "hello");
    expect_status(fx,
                  "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n"
                  "\r\n3;a=b\r\nabc\r\n1\r\nd\r\n0\r\nX-T: a\r\n\r\n",
                  200, "abcd");
    /* The chunk's CRLF split over two reads is still checked. */
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "POST /echo HTTP/1.1\r\n" H
                          "Transfer-Encoding: chunked\r\n\r\n2\r\nab");
    tt_http_sleep_ms(20);
    tt_http_cli_sends(&c, "\r");
    tt_http_sleep_ms(20);
    tt_http_cli_sends(&c, "X0\r\n\r\n");
    struct tt_http_resp r;
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "CRLF"));
    free(r.body);
    tt_http_cli_close(&c);
    assert_true(tt_http_counter(fx, "malformed") >= 13);
    tt_http_expect_no_conns_left(fx);
}

/* Header fields, Host and the version. */
static void test_head_rules(void **state)
{
    struct tt_http_fx *fx = *state;
    static const char *const bad[] = {
        "GET /hello HTTP/1.1\r\nHost : t\r\n\r\n",
        "GET /hello HTTP/1.1\r\n" H "X-A : b\r\n\r\n",
        "GET /hello HTTP/1.1\r\n" H "X(A: b\r\n\r\n",
        "GET /hello HTTP/1.1\r\n" H "X\"A: b\r\n\r\n",
        "GET /hello HTTP/1.1\r\n" H "X-A: b\x01\r\n\r\n",
        "GET /hello HTTP/1.1\r\n" H ": b\r\n\r\n",
        "GET /hello HTTP/1.1\r\n\r\n",                 /* no Host */
        "GET /hello HTTP/1.1\r\n" H "Host: u\r\n\r\n", /* two */
        "GET /hello HTTP/1.1\r\nHost: a b\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: a/b\r\n\r\n",
        "GET /hello HTTP/1.0\r\n" H H "\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        tt_http_expect_error_close(fx, bad[i], 400);
    tt_http_expect_error_close(fx, "GET /hello HTTP/9.9\r\n" H "\r\n", 505);
    tt_http_expect_error_close(fx, "GET /hello HTTP/2.0\r\n" H "\r\n", 505);
    tt_http_expect_error_close(fx, "GET /hello HTTP/0.9\r\n" H "\r\n", 505);
    /* Fine: HTTP/1.0 without Host, an empty Host, an IPv6 literal with a
     * port, a higher 1.x minor version served as 1.1. */
    expect_status(fx, "GET /hello HTTP/1.0\r\n\r\n", 200, "hello");
    expect_status(fx, "GET /hello HTTP/1.1\r\nHost:\r\n\r\n", 200, "hello");
    expect_status(fx, "GET /hello HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n", 200,
                  "hello");
    expect_status(fx, "GET /hello HTTP/1.2\r\n" H "Connection: close\r\n\r\n",
                  200, "hello");
}

/* Body framing: Content-Length and Transfer-Encoding. */
static void test_body_framing(void **state)
{
    struct tt_http_fx *fx = *state;
    static const char *const bad[] = {
        "POST /echo HTTP/1.1\r\n" H "Content-Length: 3\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n"
        "Content-Length: 3\r\n\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\n" H "Content-Length: 3\r\n"
        "Content-Length: 3\r\n\r\nabc",
        "POST /echo HTTP/1.1\r\n" H "Content-Length: 3, 3\r\n\r\nabc",
        "POST /echo HTTP/1.1\r\n" H "Content-Length: +3\r\n\r\nabc",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked, chunked\r\n"
        "\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked;x=1\r\n\r\n"
        "0\r\n\r\n",
        "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        /* chunk sizes: overflow, not hex, nothing */
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
        "fffffffffffffffffff\r\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
        "zz\r\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n"
        "\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        tt_http_expect_error_close(fx, bad[i], 400);
    static const char *const unsupported[] = {
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: gzip\r\n\r\nabc",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: gzip, chunked\r\n\r\n"
        "0\r\n\r\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: identity\r\n\r\n",
        "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: xchunked\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++)
        tt_http_expect_error_close(fx, unsupported[i], 501);
    /* A chunk announced over the body limit: 413 before any of it. */
    tt_http_expect_error_close(fx,
                               "POST /echo HTTP/1.1\r\n" H
                               "Transfer-Encoding: chunked\r\n\r\n10000000\r\n",
                               413);
    /* Fine: chunked in any case. */
    expect_status(fx,
                  "POST /echo HTTP/1.1\r\n" H "Transfer-Encoding: Chunked\r\n"
                  "\r\n2\r\nok\r\n0\r\n\r\n",
                  200, "ok");
    assert_true(tt_http_counter(fx, "too_large") >= 1);
}

/* Trailers are read and dropped; the handler's header pointers stay
 * valid while many trailer bytes arrive (ASan checks the reads). */
static void test_trailers(void **state)
{
    struct tt_http_fx *fx = *state;
    char raw[4096];
    int k = snprintf(raw, sizeof(raw),
                     "POST /echo HTTP/1.1\r\n" H "X-Test: head\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n");
    for (int i = 0; i < 40; i++)
        k += snprintf(raw + k, sizeof(raw) - (size_t)k,
                      "X-Trailer-%02d: %s\r\n", i,
                      "trailer value long enough to move a buffer");
    snprintf(raw + k, sizeof(raw) - (size_t)k, "\r\n");
    struct tt_http_resp r;
    tt_http_one_shot(fx, raw, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hi");
    assert_true(tt_http_head_has(&r, "\r\nX-Test-Echo: head\r\n"));
    free(r.body);
    /* Trailers count against the header limit (4096 in the fixture). */
    char *big = malloc(8192);
    k = sprintf(big, "POST /echo HTTP/1.1\r\n" H
                     "Transfer-Encoding: chunked\r\n\r\n0\r\nX-Big: ");
    memset(big + k, 't', 5000);
    strcpy(big + k + 5000, "\r\n\r\n");
    tt_http_expect_error_close(fx, big, 431);
    free(big);
}

/* shutdown(SHUT_WR) after whole requests: every answer still comes, then
 * the server closes. */
static void test_half_close(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    struct tt_http_resp r;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /hello HTTP/1.1\r\n" H "\r\n");
    assert_int_equal(shutdown(c.fd, SHUT_WR), 0);
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello");
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);

    /* An answer still being computed: an interim 100 first (the probe
     * that tells a half-close from a close), then the answer. */
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /delay?ms=100&tag=late HTTP/1.1\r\n" H "\r\n");
    tt_http_sleep_ms(20);
    assert_int_equal(shutdown(c.fd, SHUT_WR), 0);
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 100);
    free(r.body);
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "late");
    assert_true(tt_http_head_has(&r, "Connection: close"));
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);

    /* Pipelined requests, then the FIN: all of them answered in order. */
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /delay?ms=30&tag=a HTTP/1.1\r\n" H "\r\n"
                          "POST /echo HTTP/1.1\r\n" H "Content-Length: 1\r\n"
                          "\r\nb"
                          "GET /sse?n=1 HTTP/1.1\r\n" H "\r\n");
    assert_int_equal(shutdown(c.fd, SHUT_WR), 0);
    const char *want[] = {"a", "b", "data: {\"i\":0}\n\ndata: [DONE]\n\n"};
    for (int i = 0; i < 3; i++) {
        do {
            assert_int_equal(tt_http_cli_response(&c, &r), 0);
            if (r.status == 100)
                free(r.body);
        } while (r.status == 100);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, want[i]);
        free(r.body);
    }
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);
    /* A half-close in the middle of a request: nothing to answer. */
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "POST /echo HTTP/1.1\r\n" H "Content-Length: 9\r\n"
                          "\r\nabc");
    assert_int_equal(shutdown(c.fd, SHUT_WR), 0);
    assert_true(tt_http_cli_closed(&c));
    assert_int_equal(c.len, 0);
    tt_http_cli_close(&c);
    assert_true(tt_http_counter(fx, "half_closed") >= 2);
    assert_int_equal(atomic_load(&fx->aborts), 0);
    tt_http_expect_no_conns_left(fx);
}

static int auth_setup(void **state)
{
    struct rt_http_config cfg;
    tt_http_fx_test_config(&cfg);
    *state = tt_http_fx_start(&cfg, 1);
    return 0;
}

/* The head check: 401 before any body byte is read, before routing
 * (no 404/405 that would map the routes), without a 100 Continue. */
static void test_head_check(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    struct tt_http_resp r;
    /* A body announced at the limit and never sent: the answer comes at
     * once instead of waiting for it. */
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "POST /echo HTTP/1.1\r\n" H
                          "Content-Length: 1048576\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 401);
    assert_true(tt_http_head_has(&r, "\r\nWWW-Authenticate: Bearer\r\n"));
    assert_true(tt_http_head_has(&r, "Connection: close"));
    assert_non_null(strstr(r.body, "\"type\":\"authentication_error\""));
    assert_non_null(strstr(r.body, "\"code\":\"invalid_api_key\""));
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);
    /* Expect: 100-continue gets no 100, only the 401. */
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "POST /echo HTTP/1.1\r\n" H "Content-Length: 4\r\n"
                          "Expect: 100-continue\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 401);
    free(r.body);
    tt_http_cli_close(&c);
    /* Unknown path, wrong method: 401 too, not 404 / 405. */
    tt_http_expect_error_close(fx, "GET /no/such/path HTTP/1.1\r\n" H "\r\n",
                               401);
    tt_http_expect_error_close(fx, "DELETE /echo HTTP/1.1\r\n" H "\r\n", 401);
    tt_http_expect_error_close(fx, "GET /echo HTTP/1.1\r\n" H
                                   "Authorization: Bearer nope\r\n\r\n", 401);
    /* With the key: the routes as usual; /hello is open. */
    expect_status(fx, "GET /no/such/path HTTP/1.1\r\n" H
                      "Authorization: Bearer k\r\n\r\n", 404, NULL);
    expect_status(fx, "DELETE /echo HTTP/1.1\r\n" H
                      "Authorization: Bearer k\r\n\r\n", 405, NULL);
    expect_status(fx, "POST /echo HTTP/1.1\r\n" H "Authorization: Bearer k\r\n"
                      "Content-Length: 2\r\n\r\nok", 200, "ok");
    expect_status(fx, "GET /hello HTTP/1.1\r\n" H "\r\n", 200, "hello");
    /* A malformed head is refused as malformed, checks first. */
    tt_http_expect_error_close(fx, "GET /echo HTTP/1.1\r\n\r\n", 400);
    assert_int_equal(tt_http_counter(fx, "refused_head"), 5);
}

/* Many unauthenticated clients pushing bodies: each is answered and
 * closed; nothing of their bodies is kept (the connections are gone). */
static void test_head_check_flood(void **state)
{
    struct tt_http_fx *fx = *state;
    enum { N = 32 };
    struct tt_http_cli c[N];
    char *junk = calloc(1, 256 * 1024);
    for (int i = 0; i < N; i++) {
        tt_http_cli_open(&c[i], fx->port);
        tt_http_cli_sends(&c[i], "POST /echo HTTP/1.1\r\n" H
                                 "Content-Length: 1048576\r\n\r\n");
        /* The server answers and lingers; sending may fail after that. */
        send(c[i].fd, junk, 256 * 1024, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    for (int i = 0; i < N; i++) {
        struct tt_http_resp r;
        assert_int_equal(tt_http_cli_response(&c[i], &r), 0);
        assert_int_equal(r.status, 401);
        free(r.body);
        tt_http_cli_close(&c[i]);
    }
    free(junk);
    tt_http_expect_no_conns_left(fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_line_framing, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_head_rules, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_body_framing, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_trailers, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_half_close, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_head_check, auth_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_head_check_flood, auth_setup,
                                        tt_http_fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
