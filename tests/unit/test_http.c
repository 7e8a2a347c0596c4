/* test_http.c — the router's HTTP/1.1 server (rt_http) driven over real
 * loopback sockets: requests and limits. The server fixture (demo routes,
 * loop thread) and the raw client live in tests/support/tt_http.{h,c};
 * SSE streaming, client aborts and server close are in
 * test_http_stream.c.
 *
 * Covered: GET, POST with a body, keep-alive, pipelining with responses
 * in order behind a slow (asynchronous) one, chunked uploads split over
 * many writes, 100-continue, 431/413/400/408 with a JSON error and a
 * graceful close, the idle timeout, 404/405, prefix routes, HEAD,
 * HTTP/1.0, API misuse, and that every connection's state is gone after
 * the clients close. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "router/net/rt_http.h"
#include "tests/support/tt_http.h"

/* ---- tests ---------------------------------------------------------- */

static void test_get(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_resp r;
    tt_http_one_shot(fx, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello");
    assert_true(tt_http_head_has(&r, "\r\nContent-Length: 5\r\n"));
    assert_true(tt_http_head_has(&r, "\r\nContent-Type: text/plain\r\n"));
    assert_true(tt_http_head_has(&r, "\r\nX-Hello: 1\r\n"));
    assert_false(tt_http_head_has(&r, "Connection: close"));
    free(r.body);

    /* HEAD: the same head, no body bytes. */
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\n"
                          "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    char *end;
    while (!(end = memmem(c.buf, c.len, "\r\n\r\n", 4)))
        assert_int_equal(tt_http_cli_fill(&c), 0);
    assert_non_null(memmem(c.buf, (size_t)(end - c.buf), "Content-Length: 5",
                           17));
    tt_http_cli_consume(&c, (size_t)(end - c.buf) + 4);
    /* The next one follows at once. */
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_string_equal(r.body, "hello");
    free(r.body);
    tt_http_cli_close(&c);
    tt_http_expect_no_conns_left(fx);
}

static void test_post_body(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_resp r;
    tt_http_one_shot(fx,
             "POST /echo HTTP/1.1\r\nHost: t\r\n"
             "X-Test: abc\r\nContent-Length: 11\r\n\r\n"
             "hello world",
             &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello world");
    assert_true(tt_http_head_has(&r, "\r\nX-Test-Echo: abc\r\n"));
    free(r.body);

    /* A 512 KiB body arriving in many reads. */
    size_t n = 512 * 1024;
    char *big = malloc(n + 128);
    int hl = sprintf(big, "PUT /echo HTTP/1.1\r\nHost: t\r\n"
                          "Content-Length: %zu\r\n\r\n",
                     n);
    for (size_t i = 0; i < n; i++)
        big[hl + (int)i] = (char)('a' + i % 26);
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_send(&c, big, (size_t)hl + n);
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, n);
    assert_memory_equal(r.body, big + hl, n);
    free(r.body);
    free(big);
    tt_http_cli_close(&c);
}

static void test_keep_alive(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    for (int i = 0; i < 3; i++) {
        struct tt_http_resp r;
        char req[128];
        snprintf(req, sizeof(req),
                 "POST /echo HTTP/1.1\r\nHost: t\r\n"
                 "Content-Length: 2\r\n\r\nr%d", i);
        tt_http_cli_sends(&c, req);
        assert_int_equal(tt_http_cli_response(&c, &r), 0);
        assert_int_equal(r.status, 200);
        assert_int_equal(r.body[1], '0' + i);
        free(r.body);
    }
    /* Three requests, one connection: /stats sees it plus its own. */
    struct tt_http_resp r;
    tt_http_one_shot(fx, "GET /stats HTTP/1.1\r\nHost: t\r\n\r\n", &r);
    assert_string_equal(r.body, "2");
    free(r.body);
    /* "Connection: close" ends it after the answer. */
    tt_http_cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: t\r\n"
                          "Connection: close\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_true(tt_http_head_has(&r, "Connection: close"));
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);
    tt_http_expect_no_conns_left(fx);
}

static void test_pipelining(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    /* The slow one first: answers must still come back in order. */
    tt_http_cli_sends(&c, "GET /delay?ms=60&tag=first HTTP/1.1\r\nHost: t\r\n"
                          "\r\n"
                  "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"
                  "POST /echo HTTP/1.1\r\nHost: t\r\n"
                  "Content-Length: 3\r\n\r\nabc"
                  "GET /delay?ms=10&tag=last HTTP/1.1\r\nHost: t\r\n\r\n");
    const char *want[] = {"first", "hello", "abc", "last"};
    for (int i = 0; i < 4; i++) {
        struct tt_http_resp r;
        assert_int_equal(tt_http_cli_response(&c, &r), 0);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, want[i]);
        free(r.body);
    }
    tt_http_cli_close(&c);
}

static void test_chunked_upload(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    /* Chunks split at awkward places, with an extension and a trailer. */
    const char *parts[] = {
        "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
        "3\r\nhel\r", "\n6;ext=1\r\nlo wor\r\n", "2\r\nld\r\n0\r\n",
        "X-Trailer: t\r\n\r\n"};
    for (size_t i = 0; i < 5; i++) {
        tt_http_cli_sends(&c, parts[i]);
        tt_http_sleep_ms(5);
    }
    struct tt_http_resp r;
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello world");
    free(r.body);
    /* The connection stays usable. */
    tt_http_cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_string_equal(r.body, "hello");
    free(r.body);
    tt_http_cli_close(&c);
}

static void test_expect_continue(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\n"
                          "Content-Length: 4\r\n"
                  "Expect: 100-continue\r\n\r\n");
    struct tt_http_resp r;
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 100);
    free(r.body);
    tt_http_cli_sends(&c, "data");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "data");
    free(r.body);
    /* Too large: 413 at once, no 100. */
    tt_http_cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\n"
                          "Content-Length: 99999999\r\n"
                  "Expect: 100-continue\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 413);
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);
}

/* An error answer is complete JSON, says close, and the server closes. */
static void expect_error_close(struct tt_http_fx *fx, const char *raw,
                               int status)
{
    tt_http_expect_error_close(fx, raw, status);
}

static void test_header_too_large(void **state)
{
    struct tt_http_fx *fx = *state;
    size_t n = 8192;
    char *raw = malloc(n + 128);
    assert_non_null(raw);
    int k = sprintf(raw, "GET /hello HTTP/1.1\r\nHost: t\r\nX-Big: ");
    memset(raw + k, 'x', n);
    strcpy(raw + k + n, "\r\n\r\n");
    expect_error_close(fx, raw, 431);
    /* Many small headers add up too. */
    k = sprintf(raw, "GET /hello HTTP/1.1\r\nHost: t\r\n");
    for (int i = 0; i < 700; i++) /* ~6 KB in 10-byte lines */
        k += sprintf(raw + k, "H%d: v\r\n", i);
    strcpy(raw + k, "\r\n");
    expect_error_close(fx, raw, 431);
    /* So does a long target. */
    k = sprintf(raw, "GET /hello?");
    memset(raw + k, 'q', 5000);
    strcpy(raw + k + 5000, " HTTP/1.1\r\nHost: t\r\n\r\n");
    expect_error_close(fx, raw, 431);
    free(raw);
    /* Just under the limit is fine. */
    raw = malloc(4096);
    k = sprintf(raw, "GET /hello HTTP/1.1\r\nHost: t\r\nX-Big: ");
    memset(raw + k, 'y', 3000);
    strcpy(raw + k + 3000, "\r\n\r\n");
    struct tt_http_resp r;
    tt_http_one_shot(fx, raw, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    free(raw);
}

static void test_body_too_large(void **state)
{
    struct tt_http_fx *fx = *state;
    /* Announced: refused before the body is sent. */
    expect_error_close(
        fx, "POST /echo HTTP/1.1\r\nHost: t\r\n"
            "Content-Length: 2000000\r\n\r\n", 413);
    /* Chunked: refused once the decoded size passes the limit, while the
     * client is still sending (the lingering close keeps the answer). */
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(
        &c, "POST /echo HTTP/1.1\r\nHost: t\r\n"
            "Transfer-Encoding: chunked\r\n\r\n");
    char *chunk = malloc(70000);
    int k = sprintf(chunk, "10000\r\n");
    memset(chunk + k, 'z', 0x10000);
    memcpy(chunk + k + 0x10000, "\r\n", 2);
    for (int i = 0; i < 20; i++) {
        ssize_t w = send(c.fd, chunk, (size_t)k + 0x10000 + 2, MSG_NOSIGNAL);
        if (w < 0)
            break; /* the server already answered and shut down */
    }
    struct tt_http_resp r;
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 413);
    free(r.body);
    free(chunk);
    tt_http_cli_close(&c);
    /* Exactly at the limit is fine. */
    size_t n = 1 << 20;
    char *big = malloc(n + 128);
    k = sprintf(big, "POST /echo HTTP/1.1\r\nHost: t\r\n"
                     "Content-Length: %zu\r\n\r\n", n);
    memset(big + k, 'b', n);
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_send(&c, big, (size_t)k + n);
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, n);
    free(r.body);
    free(big);
    tt_http_cli_close(&c);
}

static void test_malformed(void **state)
{
    struct tt_http_fx *fx = *state;
    expect_error_close(fx, "GARBAGE\r\n\r\n", 400);
    expect_error_close(fx, "\x01\x02\x03 / HTTP/1.1\r\nHost: t\r\n\r\n", 400);
    expect_error_close(fx, "GET /hello HTTP/9.9x\r\n\r\n", 400);
    expect_error_close(fx, "GET /hello HTTP/1.1\r\nHost: t\r\n"
                           "Bad Header\r\n\r\n", 400);
    expect_error_close(
        fx, "POST /echo HTTP/1.1\r\nHost: t\r\n"
            "Content-Length: abc\r\n\r\n", 400);
    expect_error_close(fx,
                       "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n"
                       "Content-Length: 2\r\n\r\nab",
                       400);
    expect_error_close(fx,
                       "POST /echo HTTP/1.1\r\nHost: t\r\n"
                       "Transfer-Encoding: chunked\r\n"
                       "\r\nzz\r\n",
                       400);
    /* A good request before a bad one is still answered. */
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: t\r\n"
                          "\r\nNOT HTTP AT ALL\r\n\r\n");
    struct tt_http_resp r;
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 400);
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);
    tt_http_expect_no_conns_left(fx);
}

static void test_request_timeout(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    /* And nothing more. */
    tt_http_cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: ");
    struct tt_http_resp r;
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 408);
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);
}

static void test_idle_timeout(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    struct tt_http_resp r;
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    free(r.body);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(tt_http_cli_closed(&c)); /* quietly, no bytes */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(c.len, 0);
    double s = (double)(t1.tv_sec - t0.tv_sec) +
               (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    /* idle_timeout_ms = 1500: closed by that timer, not before it (less
     * the time the response took), and later only by a loaded machine's
     * delay, with 10 s of slack; a connection never closed fails in
     * tt_http_cli_closed. */
    assert_true(s > 1.0 && s < 1.5 + 10.0);
    tt_http_cli_close(&c);
}

static void test_routes(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    struct tt_http_resp r;
    tt_http_cli_sends(&c, "GET /nothing-here HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "\"code\":\"not_found\""));
    assert_non_null(strstr(r.body, "\"type\":\"invalid_request_error\""));
    free(r.body);
    /* 404/405 keep the connection. */
    tt_http_cli_sends(&c, "DELETE /echo HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 405);
    assert_true(tt_http_head_has(&r, "\r\nAllow: POST, PUT\r\n"));
    assert_non_null(strstr(r.body, "\"code\":\"method_not_allowed\""));
    free(r.body);
    tt_http_cli_sends(&c, "POST /hello HTTP/1.1\r\nHost: t\r\n"
                          "Content-Length: 1\r\n\r\nx");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 405);
    assert_true(tt_http_head_has(&r, "\r\nAllow: GET, HEAD\r\n"));
    free(r.body);
    /* A GET route serves HEAD too (no HEAD route of its own): the same
     * head with its Content-Length, no body; Allow names HEAD. */
    tt_http_cli_sends(&c, "HEAD /stats HTTP/1.1\r\nHost: t\r\n\r\n"
                          "PUT /stats HTTP/1.1\r\nHost: t\r\n"
                          "Content-Length: 0\r\n\r\n");
    char *end;
    while (!(end = memmem(c.buf, c.len, "\r\n\r\n", 4)))
        assert_int_equal(tt_http_cli_fill(&c), 0);
    assert_true(memcmp(c.buf, "HTTP/1.1 200 OK\r\n", 17) == 0);
    assert_non_null(memmem(c.buf, (size_t)(end - c.buf), "Content-Length: ",
                           16));
    tt_http_cli_consume(&c, (size_t)(end - c.buf) + 4);
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 405);
    assert_true(tt_http_head_has(&r, "\r\nAllow: GET, HEAD\r\n"));
    free(r.body);
    /* Prefix route; path and query split; absolute-form target. */
    tt_http_cli_sends(&c, "GET /v1/models/tiny%20one?x=1&y=2 HTTP/1.1\r\n"
                          "Host: t\r\n"
                          "\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "/v1/models/tiny%20one?x=1&y=2");
    free(r.body);
    tt_http_cli_sends(&c, "GET http://h:1/v1/models/a HTTP/1.1\r\nHost: t\r\n"
                          "\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_string_equal(r.body, "/v1/models/a?");
    free(r.body);
    /* Not the prefix. */
    tt_http_cli_sends(&c, "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 404);
    free(r.body);
    /* Misused API calls are refused, the good answer still goes out. */
    tt_http_cli_sends(&c, "GET /misuse HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_int_equal(r.status, 204);
    assert_false(tt_http_head_has(&r, "Content-Length"));
    assert_false(tt_http_head_has(&r, "Injected"));
    free(r.body);
    assert_int_equal(atomic_load(&fx->misuse_ok), 1);
    tt_http_cli_close(&c);
}

/* HTTP/1.0 without keep-alive closes; with it, stays open. */
static void test_http10(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    struct tt_http_resp r;
    tt_http_cli_sends(&c,
                      "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_true(tt_http_head_has(&r, "Connection: keep-alive"));
    free(r.body);
    tt_http_cli_sends(&c, "GET /hello HTTP/1.0\r\n\r\n");
    assert_int_equal(tt_http_cli_response(&c, &r), 0);
    assert_string_equal(r.body, "hello");
    assert_true(tt_http_head_has(&r, "Connection: close"));
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_get, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_post_body, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_keep_alive, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_pipelining, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_chunked_upload, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_expect_continue, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_header_too_large, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_malformed, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_request_timeout, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_idle_timeout, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_routes, tt_http_fx_setup,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_http10, tt_http_fx_setup,
                                        tt_http_fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
