/* test_http_uploads.c — the router's HTTP/1.1 server (rt_http) under slow
 * or idle uploads and a full connection table, over real loopback sockets
 * (fixture in tests/support/tt_http.{h,c}).
 *
 * Covered: request bodies are charged to the body budget as their bytes
 * arrive, not when announced, so eight clients that announce large bodies
 * and send a few bytes hold a few buffers' worth and a real upload is
 * served beside them, while a body that stops fitting as it grows gets
 * 503 body_memory_full; a body under the minimum upload rate gets 408 after
 * a window, one above it is served; at max_connections the slowest
 * incomplete body gives way (408) when no connection is idle and no head
 * is arriving; with every connection busy a newcomer takes a place of the
 * probe reserve, where the probe routes are served and anything else gets
 * the 503 the cap would have given, and a silent connection there gives
 * way to a probe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "router/net/rt_http.h"
#include "tests/support/tt_http.h"

#define H "Host: t\r\n"

/* Nothing here tests the idle or head timeouts: long enough that a loaded
 * machine's delays between the steps (ctest -j4 on 2 cores, ASan) never
 * reach them. */
#define PATIENT_MS 60000

static struct rt_conn_budget g_budget;

/* Connections the server has taken (accepted, refused, or admitted to the
 * probe reserve): counters of its own thread, read as they stand. */
static uint64_t taken(struct tt_http_fx *fx)
{
    const volatile struct rt_conn_stats *st = &fx->srv.set.stats;
    return st->accepted + st->rejected_max + st->rejected_per_ip +
           st->probe_admitted;
}

/* Opens a connection and waits until the server has taken it, by its
 * counters rather than a sleep. */
static void open_taken(struct tt_http_fx *fx, struct tt_http_cli *c)
{
    uint64_t before = taken(fx);
    tt_http_cli_open(c, fx->port);
    for (int i = 0; i < 2000 && taken(fx) == before; i++)
        tt_http_sleep_ms(5);
    assert_true(taken(fx) > before);
}

/* Polls a /counters value until it equals `want` (about 10 s at most, for
 * a loaded machine); returns the last value. */
static long wait_counter(struct tt_http_fx *fx, const char *name, long want)
{
    long v = tt_http_counter(fx, name);
    for (int i = 0; i < 500 && v != want; i++) {
        tt_http_sleep_ms(20);
        v = tt_http_counter(fx, name);
    }
    return v;
}

/* True when the server has sent nothing on c yet (nor closed it). */
static int no_answer(struct tt_http_cli *c)
{
    char b;
    ssize_t n = recv(c->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

static void send_body_bytes(struct tt_http_cli *c, size_t n)
{
    char *b = malloc(n);
    assert_non_null(b);
    memset(b, 'x', n);
    tt_http_cli_send(c, b, n);
    free(b);
}

/* Sends up to n body bytes, stopping when the server closed or reset the
 * connection (a refused upload). */
static void send_until_refused(struct tt_http_cli *c, size_t n)
{
    static const char b[16384] = {0};
    while (n > 0) {
        size_t k = n < sizeof(b) ? n : sizeof(b);
        ssize_t w = send(c->fd, b, k, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        n -= (size_t)w;
    }
}

static void post_head(struct tt_http_cli *c, size_t len)
{
    char head[128];
    snprintf(head, sizeof(head),
             "POST /echo HTTP/1.1\r\n" H "Content-Length: %zu\r\n\r\n", len);
    tt_http_cli_sends(c, head);
}

/* ---- the budget as bytes arrive ----------------------------------------- */

static int setup_budget(void **state)
{
    struct rt_http_config cfg;
    tt_http_fx_test_config(&cfg);
    memset(&g_budget, 0, sizeof(g_budget));
    g_budget.limit = 3u << 19; /* 1.5 MiB */
    cfg.body_budget = &g_budget;
    cfg.idle_timeout_ms = PATIENT_MS;
    cfg.body_timeout_ms = PATIENT_MS;
    cfg.min_body_rate = 0; /* the budget alone */
    *state = tt_http_fx_start(&cfg, 0);
    return 0;
}

static void test_budget_as_bytes_arrive(void **state)
{
    struct tt_http_fx *fx = *state;
    enum { N = 8, LEN = 1000000 };
    struct tt_http_cli c[N];
    /* Eight bodies of ~1 MB announced (5 times the 1.5 MiB budget), 100
     * bytes of each sent: each holds its first buffer, no more. */
    for (int i = 0; i < N; i++) {
        open_taken(fx, &c[i]);
        post_head(&c[i], LEN);
        send_body_bytes(&c[i], 100);
    }
    long used = wait_counter(fx, "budget_used", (long)N * RT_CONN_BODY_STEP);
    assert_int_equal(used, (long)N * RT_CONN_BODY_STEP);
    for (int i = 0; i < N; i++)
        assert_true(no_answer(&c[i]));
    /* A real upload beside them is served whole. */
    struct tt_http_cli u;
    struct tt_http_resp r;
    open_taken(fx, &u);
    post_head(&u, 300000);
    send_body_bytes(&u, 300000);
    assert_int_equal(tt_http_cli_response(&u, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 300000);
    free(r.body);
    tt_http_cli_close(&u);
    /* Two of them send all but their last byte: the first fits (its
     * buffer doubles up to the announced length); the second no longer
     * does halfway and gets 503 with Retry-After, then the close. */
    send_body_bytes(&c[0], LEN - 101);
    long full = (long)(N - 1) * RT_CONN_BODY_STEP + LEN + 1;
    assert_int_equal(wait_counter(fx, "budget_used", full), full);
    assert_true(no_answer(&c[0]));
    send_until_refused(&c[1], LEN - 101);
    assert_int_equal(tt_http_cli_response(&c[1], &r), 0);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "body_memory_full"));
    assert_true(tt_http_head_has(&r, "\r\nRetry-After: 1\r\n"));
    free(r.body);
    assert_true(tt_http_cli_closed(&c[1]));
    /* The first completes; everything comes back when they leave. */
    send_body_bytes(&c[0], 1);
    assert_int_equal(tt_http_cli_response(&c[0], &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, LEN);
    free(r.body);
    for (int i = 0; i < N; i++)
        tt_http_cli_close(&c[i]);
    assert_int_equal(wait_counter(fx, "budget_used", 0), 0);
    assert_int_equal(tt_http_counter(fx, "refused_budget"), 1);
}

/* ---- the minimum upload rate ------------------------------------------- */

static int setup_rate(void **state)
{
    struct rt_http_config cfg;
    tt_http_fx_test_config(&cfg);
    cfg.idle_timeout_ms = PATIENT_MS;
    /* The body deadline is far: a 408 within the 5 s the client waits
     * for an answer can only be the rate's. */
    cfg.body_timeout_ms = 20000;
    cfg.min_body_rate = 100;
    cfg.body_rate_window_ms = 1000;
    *state = tt_http_fx_start(&cfg, 0);
    return 0;
}

static void test_min_body_rate(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli slow, good;
    struct tt_http_resp r;
    /* 10 bytes of 10,000, then nothing: under 100 bytes per second. */
    open_taken(fx, &slow);
    post_head(&slow, 10000);
    send_body_bytes(&slow, 10);
    /* 8,000 bytes in four pieces 300 ms apart: every 1 s window sees
     * thousands of bytes, twenty times the minimum, unless this thread is
     * starved for a whole window. */
    open_taken(fx, &good);
    post_head(&good, 8000);
    for (int i = 0; i < 4; i++) {
        send_body_bytes(&good, 2000);
        if (i < 3)
            tt_http_sleep_ms(300);
    }
    assert_int_equal(tt_http_cli_response(&good, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 8000);
    free(r.body);
    assert_int_equal(tt_http_cli_response(&slow, &r), 0);
    assert_int_equal(r.status, 408);
    assert_non_null(strstr(r.body, "too slow"));
    free(r.body);
    assert_true(tt_http_cli_closed(&slow));
    tt_http_cli_close(&slow);
    tt_http_cli_close(&good);
    assert_int_equal(tt_http_counter(fx, "slow_bodies"), 1);
    assert_int_equal(tt_http_counter(fx, "timeout_body"), 0);
}

/* ---- the table full of uploads ----------------------------------------- */

static int setup_max4(void **state)
{
    struct rt_http_config cfg;
    tt_http_fx_test_config(&cfg);
    cfg.idle_timeout_ms = PATIENT_MS;
    cfg.body_timeout_ms = PATIENT_MS;
    cfg.min_body_rate = 0; /* the cap alone */
    cfg.max_connections = 4;
    cfg.probe_reserve = 0;
    *state = tt_http_fx_start(&cfg, 0);
    return 0;
}

static void test_slow_bodies_give_way(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c[5];
    struct tt_http_resp r;
    /* Four uploads under way fill the table: c[3] sent the most, the
     * others the same, older ones first. */
    for (int i = 0; i < 4; i++) {
        open_taken(fx, &c[i]);
        post_head(&c[i], 1000);
        send_body_bytes(&c[i], i == 3 ? 500 : 10);
    }
    tt_http_sleep_ms(30);
    /* A new client is served: the slowest body (fewest bytes per ms since
     * its head: c[0]) gave way with 408. */
    open_taken(fx, &c[4]);
    tt_http_cli_sends(&c[4], "GET /hello HTTP/1.1\r\n" H "\r\n");
    assert_int_equal(tt_http_cli_response(&c[4], &r), 0);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(tt_http_cli_response(&c[0], &r), 0);
    assert_int_equal(r.status, 408);
    assert_non_null(strstr(r.body, "body too slow"));
    free(r.body);
    assert_true(tt_http_cli_closed(&c[0]));
    for (int i = 1; i < 4; i++)
        assert_true(no_answer(&c[i]));
    /* The counters' connection takes c[4]'s place (idle), not a body's. */
    assert_int_equal(tt_http_counter(fx, "evicted_body"), 1);
    assert_int_equal(tt_http_counter(fx, "rejected_max"), 0);
    /* The others still complete. */
    send_body_bytes(&c[3], 500);
    assert_int_equal(tt_http_cli_response(&c[3], &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 1000);
    free(r.body);
    for (int i = 0; i < 5; i++)
        tt_http_cli_close(&c[i]);
}

/* ---- the probe reserve --------------------------------------------------- */

static int setup_reserve(void **state)
{
    struct rt_http_config cfg;
    tt_http_fx_test_config(&cfg);
    cfg.idle_timeout_ms = PATIENT_MS;
    cfg.header_timeout_ms = PATIENT_MS;
    cfg.max_connections = 4;
    cfg.probe_reserve = 2;
    cfg.probe_per_ip = 0; /* every client here is 127.0.0.1 */
    *state = tt_http_fx_start(&cfg, 0);
    return 0;
}

static void test_probe_reserve(void **state)
{
    struct tt_http_fx *fx = *state;
    struct tt_http_cli c[4], p, s[2];
    struct tt_http_resp r;
    /* Four requests in their handlers: none can give way. */
    for (int i = 0; i < 4; i++) {
        open_taken(fx, &c[i]);
        tt_http_cli_sends(&c[i], "GET /delay?ms=30000 HTTP/1.1\r\n" H "\r\n");
    }
    tt_http_sleep_ms(30);
    /* A probe is served on a place of the reserve, then closed. */
    open_taken(fx, &p);
    tt_http_cli_sends(&p, "GET /hello HTTP/1.1\r\n" H "\r\n");
    assert_int_equal(tt_http_cli_response(&p, &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(tt_http_head_has(&r, "Connection: close"));
    free(r.body);
    assert_true(tt_http_cli_closed(&p));
    tt_http_cli_close(&p);
    /* Anything else there gets the cap's 503 with Retry-After. */
    open_taken(fx, &p);
    tt_http_cli_sends(&p, "POST /echo HTTP/1.1\r\n" H
                          "Content-Length: 2\r\n\r\nhi");
    assert_int_equal(tt_http_cli_response(&p, &r), 0);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "connection_limit"));
    assert_true(tt_http_head_has(&r, "\r\nRetry-After: 1\r\n"));
    free(r.body);
    tt_http_cli_close(&p);
    /* Two silent connections fill the reserve; a probe takes the place of
     * the older one. */
    open_taken(fx, &s[0]);
    open_taken(fx, &s[1]);
    open_taken(fx, &p);
    tt_http_cli_sends(&p, "GET /hello HTTP/1.1\r\n" H "\r\n");
    assert_int_equal(tt_http_cli_response(&p, &r), 0);
    assert_int_equal(r.status, 200);
    free(r.body);
    tt_http_cli_close(&p);
    assert_true(tt_http_cli_closed(&s[0]));
    assert_true(no_answer(&s[1]));
    /* /counters is a probe route too: it answers while the table is
     * full. */
    assert_int_equal(tt_http_counter(fx, "rejected_max"), 1);
    assert_true(tt_http_counter(fx, "probes_served") >= 3);
    for (int i = 0; i < 4; i++)
        assert_true(no_answer(&c[i]));
    for (int i = 0; i < 4; i++)
        tt_http_cli_close(&c[i]);
    for (int i = 0; i < 500 && atomic_load(&fx->aborts) < 4; i++)
        tt_http_sleep_ms(20);
    assert_int_equal(atomic_load(&fx->aborts), 4);
    tt_http_cli_close(&s[0]);
    tt_http_cli_close(&s[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_budget_as_bytes_arrive,
                                        setup_budget, tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_min_body_rate, setup_rate,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_slow_bodies_give_way, setup_max4,
                                        tt_http_fx_teardown),
        cmocka_unit_test_setup_teardown(test_probe_reserve, setup_reserve,
                                        tt_http_fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
