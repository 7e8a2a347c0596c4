/* test_http.c — the router's HTTP/1.1 server (rt_http) driven over real
 * loopback sockets: the server runs on a uv loop in a thread, the test
 * speaks raw HTTP with blocking sockets and parses the answers itself
 * (Content-Length, chunked and close-delimited bodies).
 *
 * Covered: GET, POST with a body, keep-alive, pipelining with responses
 * in order behind a slow (asynchronous) one, chunked uploads split over
 * many writes, 100-continue, 431/413/400/408 with a JSON error and a
 * graceful close, SSE streaming with a keep-alive follow-up, client
 * disconnect mid-stream and while waiting (on_abort exactly once), a
 * handler without on_abort finishing after the client left (TG_ECANCELED),
 * 404/405, prefix routes, HEAD, HTTP/1.0, the idle timeout, API misuse,
 * and that every connection's state is gone after the clients close. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/tg_err.h"
#include "router/rt_http.h"

/* ---- server fixture ------------------------------------------------------ */

struct fx {
    uv_loop_t loop;
    struct rt_http_server srv;
    uv_async_t stop;
    pthread_t thread;
    int port;
    atomic_int aborts;        /* on_abort calls */
    atomic_int stream_events; /* events written by /forever */
    atomic_int zombie_rc;     /* rt_http_respond() result of /zombie */
    atomic_int zombie_done;
    atomic_int misuse_ok;     /* /misuse checks passed */
};

static void on_stop(uv_async_t *a)
{
    struct fx *fx = a->data;
    rt_http_server_close(&fx->srv, NULL, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_thread(void *arg)
{
    struct fx *fx = arg;
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* -- handlers (loop thread) -- */

static void h_hello(struct rt_http_req *req, void *ud)
{
    (void)ud;
    assert_int_equal(rt_http_resp_header(req, "X-Hello", "1"), 0);
    assert_int_equal(rt_http_respond(req, 200, "text/plain", "hello", 5), 0);
}

static void h_echo(struct rt_http_req *req, void *ud)
{
    (void)ud;
    const char *t = rt_http_req_header(req, "x-test"); /* case-insensitive */
    if (t)
        rt_http_resp_header(req, "X-Test-Echo", t);
    assert_int_equal(req->body[req->body_len], '\0');
    rt_http_respond(req, 200, "application/octet-stream", req->body,
                    req->body_len);
}

static void h_stats(struct rt_http_req *req, void *ud)
{
    (void)ud;
    char b[64];
    int n = snprintf(b, sizeof(b), "%zu", req->srv->n_conns);
    rt_http_respond(req, 200, "text/plain", b, (size_t)n);
}

static void h_prefix(struct rt_http_req *req, void *ud)
{
    (void)ud;
    char b[256];
    int n = snprintf(b, sizeof(b), "%s?%s", req->path, req->query);
    rt_http_respond(req, 200, "text/plain", b, (size_t)n);
}

/* A response that completes later from a timer: /delay?ms=N&tag=T. */
struct delayed {
    uv_timer_t timer;
    struct rt_http_req *req;
    struct fx *fx;
    char tag[64];
    int events, max_events;
    int zombie;
};

static void free_delayed(uv_handle_t *h)
{
    free(h->data);
}

static void delayed_abort(struct rt_http_req *req, void *ud)
{
    struct delayed *d = ud;
    assert_ptr_equal(d->req, req);
    /* Inside the abort callback every response call is refused. */
    assert_int_equal(rt_http_respond(req, 200, NULL, NULL, 0), TG_ECANCELED);
    atomic_fetch_add(&d->fx->aborts, 1);
    d->req = NULL;
    uv_timer_stop(&d->timer);
    uv_close((uv_handle_t *)&d->timer, free_delayed);
}

static void delay_fire(uv_timer_t *t)
{
    struct delayed *d = t->data;
    int rc = rt_http_respond(d->req, 200, "text/plain", d->tag,
                             strlen(d->tag));
    if (d->zombie) {
        atomic_store(&d->fx->zombie_rc, rc);
        atomic_store(&d->fx->zombie_done, 1);
    }
    uv_close((uv_handle_t *)t, free_delayed);
}

static int query_int(const char *q, const char *key, int def)
{
    const char *p = strstr(q, key);
    return p ? atoi(p + strlen(key)) : def;
}

static struct delayed *delayed_new(struct rt_http_req *req, struct fx *fx)
{
    struct delayed *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    d->req = req;
    d->fx = fx;
    const char *t = strstr(req->query, "tag=");
    snprintf(d->tag, sizeof(d->tag), "%s", t ? t + 4 : "");
    char *amp = strchr(d->tag, '&');
    if (amp)
        *amp = '\0';
    uv_timer_init(req->srv->loop, &d->timer);
    d->timer.data = d;
    return d;
}

static void h_delay(struct rt_http_req *req, void *ud)
{
    struct delayed *d = delayed_new(req, ud);
    rt_http_req_on_abort(req, delayed_abort, d);
    uv_timer_start(&d->timer, delay_fire,
                   (uint64_t)query_int(req->query, "ms=", 30), 0);
}

/* No abort callback: the handle turns into a zombie if the client leaves. */
static void h_zombie(struct rt_http_req *req, void *ud)
{
    struct delayed *d = delayed_new(req, ud);
    d->zombie = 1;
    uv_timer_start(&d->timer, delay_fire, 150, 0);
}

/* SSE: /sse?n=N sends N events then [DONE]; /forever never ends. */
static void sse_fire(uv_timer_t *t)
{
    struct delayed *d = t->data;
    char ev[64];
    if (d->max_events < 0 || d->events < d->max_events) {
        int n = snprintf(ev, sizeof(ev), "data: {\"i\":%d}\n\n", d->events);
        int rc = rt_http_stream_write(d->req, ev, (size_t)n);
        assert_int_equal(rc, 0);
        d->events++;
        if (d->max_events < 0)
            atomic_fetch_add(&d->fx->stream_events, 1);
        return;
    }
    assert_int_equal(rt_http_stream_write(d->req, "data: [DONE]\n\n", 14), 0);
    assert_int_equal(rt_http_stream_end(d->req), 0);
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, free_delayed);
}

static void h_sse(struct rt_http_req *req, void *ud)
{
    struct delayed *d = delayed_new(req, ud);
    d->max_events = strcmp(req->path, "/forever") == 0
                        ? -1
                        : query_int(req->query, "n=", 5);
    rt_http_req_on_abort(req, delayed_abort, d);
    assert_int_equal(rt_http_resp_header(req, "Cache-Control", "no-cache"), 0);
    assert_int_equal(rt_http_stream_begin(req, 200, "text/event-stream"), 0);
    /* Headers can no longer change once the head is out. */
    assert_int_equal(rt_http_resp_header(req, "X-Late", "1"), TG_EINVAL);
    assert_int_equal(rt_http_stream_begin(req, 200, "text/plain"), TG_EINVAL);
    assert_int_equal(rt_http_respond(req, 200, NULL, NULL, 0), TG_EINVAL);
    uv_timer_start(&d->timer, sse_fire, 5, 5);
}

/* Wrong calls are refused without side effects, then a good answer. */
static void h_misuse(struct rt_http_req *req, void *ud)
{
    struct fx *fx = ud;
    int ok = 1;
    ok &= rt_http_stream_write(req, "x", 1) == TG_EINVAL; /* not streaming */
    ok &= rt_http_stream_end(req) == TG_EINVAL;
    ok &= rt_http_respond(req, 99, NULL, NULL, 0) == TG_EINVAL;
    ok &= rt_http_respond(req, 600, NULL, NULL, 0) == TG_EINVAL;
    ok &= rt_http_respond(req, 204, NULL, "x", 1) == TG_EINVAL;
    ok &= rt_http_respond(req, 200, "text/plain\r\nX-Evil: 1", "x", 1) ==
          TG_EINVAL;
    ok &= rt_http_stream_begin(req, 200, "a\nb") == TG_EINVAL;
    ok &= rt_http_resp_header(req, "Content-Length", "3") == TG_EINVAL;
    ok &= rt_http_resp_header(req, "transfer-encoding", "x") == TG_EINVAL;
    ok &= rt_http_resp_header(req, "X-Bad", "a\r\nInjected: 1") == TG_EINVAL;
    ok &= rt_http_resp_header(req, "X:Bad", "a") == TG_EINVAL;
    ok &= rt_http_resp_header(req, "", "a") == TG_EINVAL;
    atomic_store(&fx->misuse_ok, ok);
    rt_http_respond(req, 204, NULL, NULL, 0);
}

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    char err[256];
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    struct rt_http_config cfg;
    rt_http_config_default(&cfg);
    cfg.max_header_bytes = 4096;
    cfg.max_body_bytes = 1 << 20;
    cfg.idle_timeout_ms = 1500;
    cfg.request_timeout_ms = 1000;
    cfg.linger_ms = 200;
    assert_int_equal(rt_http_server_init(&fx->srv, &fx->loop, &cfg, err,
                                         sizeof(err)),
                     0);
    static const struct {
        const char *m, *p;
        rt_http_handler_fn h;
    } routes[] = {
        {"GET", "/hello", h_hello},     {"HEAD", "/hello", h_hello},
        {"POST", "/echo", h_echo},      {"PUT", "/echo", h_echo},
        {"GET", "/stats", h_stats},     {"GET", "/delay", h_delay},
        {"GET", "/zombie", h_zombie},   {"GET", "/sse", h_sse},
        {"GET", "/forever", h_sse},     {"GET", "/v1/models/*", h_prefix},
        {"GET", "/misuse", h_misuse},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        assert_int_equal(rt_http_route_add(&fx->srv, routes[i].m,
                                           routes[i].p, routes[i].h, fx, err,
                                           sizeof(err)),
                         0);
    assert_int_equal(rt_http_route_add(&fx->srv, "GET", "nope", h_hello, fx,
                                       err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(
        rt_http_server_listen(&fx->srv, "127.0.0.1", 0, err, sizeof(err)), 0);
    assert_int_equal(
        rt_http_server_listen(&fx->srv, "127.0.0.1", 0, err, sizeof(err)),
        TG_EINVAL); /* twice */
    fx->port = fx->srv.port;
    assert_true(fx->port > 0);
    uv_async_init(&fx->loop, &fx->stop, on_stop);
    fx->stop.data = fx;
    assert_int_equal(pthread_create(&fx->thread, NULL, loop_thread, fx), 0);
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    uv_async_send(&fx->stop);
    pthread_join(fx->thread, NULL);
    rt_http_server_free(&fx->srv);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    free(fx);
    return 0;
}

/* ---- client helpers ------------------------------------------------ */

struct cli {
    int fd;
    char *buf;
    size_t len, cap;
    int eof;
};

struct resp {
    int status;
    char head[4096];
    char *body;
    size_t body_len;
    int chunked;
};

static void cli_open(struct cli *c, int port)
{
    memset(c, 0, sizeof(*c));
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c->fd >= 0);
    struct timeval tv = {5, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&a, sizeof(a)), 0);
    c->cap = 1 << 16;
    c->buf = malloc(c->cap);
    assert_non_null(c->buf);
}

static void cli_close(struct cli *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
}

static void cli_send(struct cli *c, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        assert_true(w > 0);
        s += w;
        n -= (size_t)w;
    }
}

static void cli_sends(struct cli *c, const char *s)
{
    cli_send(c, s, strlen(s));
}

/* Reads more bytes; returns 0, or -1 at EOF / error / timeout. */
static int cli_fill(struct cli *c)
{
    if (c->len + 4096 > c->cap) {
        c->cap *= 2;
        c->buf = realloc(c->buf, c->cap);
        assert_non_null(c->buf);
    }
    ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (r <= 0) {
        c->eof = 1;
        return -1;
    }
    c->len += (size_t)r;
    return 0;
}

static void cli_consume(struct cli *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

/* Reads one response (1xx interim responses are returned too). Returns 0
 * or -1 when the connection ended before a whole response arrived. The
 * caller frees r->body. */
static int cli_response(struct cli *c, struct resp *r)
{
    memset(r, 0, sizeof(*r));
    char *end;
    while (!(end = memmem(c->buf, c->len, "\r\n\r\n", 4)))
        if (cli_fill(c) < 0)
            return -1;
    size_t hl = (size_t)(end - c->buf) + 4;
    assert_true(hl < sizeof(r->head));
    memcpy(r->head, c->buf, hl);
    r->head[hl] = '\0';
    cli_consume(c, hl);
    assert_int_equal(strncmp(r->head, "HTTP/1.1 ", 9), 0);
    r->status = atoi(r->head + 9);
    r->body = malloc(1);
    if (r->status < 200 || r->status == 204 || r->status == 304)
        return 0;
    const char *cl = strcasestr(r->head, "\r\nContent-Length:");
    r->chunked = strcasestr(r->head, "\r\nTransfer-Encoding: chunked") != NULL;
    if (cl) {
        size_t n = strtoul(cl + 17, NULL, 10);
        while (c->len < n)
            if (cli_fill(c) < 0)
                return -1;
        r->body = realloc(r->body, n + 1);
        memcpy(r->body, c->buf, n);
        r->body[n] = '\0';
        r->body_len = n;
        cli_consume(c, n);
    } else if (r->chunked) {
        for (;;) {
            char *crlf;
            while (!(crlf = memmem(c->buf, c->len, "\r\n", 2)))
                if (cli_fill(c) < 0)
                    return -1;
            size_t n = strtoul(c->buf, NULL, 16);
            size_t off = (size_t)(crlf - c->buf) + 2;
            while (c->len < off + n + 2)
                if (cli_fill(c) < 0)
                    return -1;
            assert_memory_equal(c->buf + off + n, "\r\n", 2);
            r->body = realloc(r->body, r->body_len + n + 1);
            memcpy(r->body + r->body_len, c->buf + off, n);
            r->body_len += n;
            r->body[r->body_len] = '\0';
            cli_consume(c, off + n + 2);
            if (n == 0)
                break;
        }
    } else {
        while (cli_fill(c) == 0) /* close-delimited */
            ;
        r->body = realloc(r->body, c->len + 1);
        memcpy(r->body, c->buf, c->len);
        r->body[c->len] = '\0';
        r->body_len = c->len;
        cli_consume(c, c->len);
    }
    return 0;
}

/* True when the server closed the connection (EOF within the timeout). */
static int cli_closed(struct cli *c)
{
    while (!c->eof)
        cli_fill(c);
    return c->eof;
}

static int head_has(const struct resp *r, const char *line)
{
    return strcasestr(r->head, line) != NULL;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One request on a fresh connection. */
static void one_shot(struct fx *fx, const char *raw, struct resp *r)
{
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, raw);
    assert_int_equal(cli_response(&c, r), 0);
    cli_close(&c);
}

/* Polls /stats until only the polling connection itself is open. */
static void expect_no_conns_left(struct fx *fx)
{
    for (int i = 0; i < 100; i++) {
        struct resp r;
        one_shot(fx, "GET /stats HTTP/1.1\r\nConnection: close\r\n\r\n", &r);
        int n = atoi(r.body);
        free(r.body);
        if (n == 1)
            return;
        sleep_ms(20);
    }
    fail_msg("connections still open");
}

/* ---- tests ---------------------------------------------------------- */

static void test_get(void **state)
{
    struct fx *fx = *state;
    struct resp r;
    one_shot(fx, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello");
    assert_true(head_has(&r, "\r\nContent-Length: 5\r\n"));
    assert_true(head_has(&r, "\r\nContent-Type: text/plain\r\n"));
    assert_true(head_has(&r, "\r\nX-Hello: 1\r\n"));
    assert_false(head_has(&r, "Connection: close"));
    free(r.body);

    /* HEAD: the same head, no body bytes. */
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "HEAD /hello HTTP/1.1\r\n\r\nGET /hello HTTP/1.1\r\n\r\n");
    char *end;
    while (!(end = memmem(c.buf, c.len, "\r\n\r\n", 4)))
        assert_int_equal(cli_fill(&c), 0);
    assert_non_null(memmem(c.buf, (size_t)(end - c.buf), "Content-Length: 5",
                           17));
    cli_consume(&c, (size_t)(end - c.buf) + 4);
    assert_int_equal(cli_response(&c, &r), 0); /* next one follows at once */
    assert_string_equal(r.body, "hello");
    free(r.body);
    cli_close(&c);
    expect_no_conns_left(fx);
}

static void test_post_body(void **state)
{
    struct fx *fx = *state;
    struct resp r;
    one_shot(fx,
             "POST /echo HTTP/1.1\r\nX-Test: abc\r\nContent-Length: 11\r\n\r\n"
             "hello world",
             &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello world");
    assert_true(head_has(&r, "\r\nX-Test-Echo: abc\r\n"));
    free(r.body);

    /* A 512 KiB body arriving in many reads. */
    size_t n = 512 * 1024;
    char *big = malloc(n + 128);
    int hl = sprintf(big, "PUT /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n",
                     n);
    for (size_t i = 0; i < n; i++)
        big[hl + (int)i] = (char)('a' + i % 26);
    struct cli c;
    cli_open(&c, fx->port);
    cli_send(&c, big, (size_t)hl + n);
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, n);
    assert_memory_equal(r.body, big + hl, n);
    free(r.body);
    free(big);
    cli_close(&c);
}

static void test_keep_alive(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    for (int i = 0; i < 3; i++) {
        struct resp r;
        char req[128];
        snprintf(req, sizeof(req),
                 "POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nr%d", i);
        cli_sends(&c, req);
        assert_int_equal(cli_response(&c, &r), 0);
        assert_int_equal(r.status, 200);
        assert_int_equal(r.body[1], '0' + i);
        free(r.body);
    }
    /* Three requests, one connection: /stats sees it plus its own. */
    struct resp r;
    one_shot(fx, "GET /stats HTTP/1.1\r\n\r\n", &r);
    assert_string_equal(r.body, "2");
    free(r.body);
    /* "Connection: close" ends it after the answer. */
    cli_sends(&c, "GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_true(head_has(&r, "Connection: close"));
    free(r.body);
    assert_true(cli_closed(&c));
    cli_close(&c);
    expect_no_conns_left(fx);
}

static void test_pipelining(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    /* The slow one first: answers must still come back in order. */
    cli_sends(&c, "GET /delay?ms=60&tag=first HTTP/1.1\r\n\r\n"
                  "GET /hello HTTP/1.1\r\n\r\n"
                  "POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                  "GET /delay?ms=10&tag=last HTTP/1.1\r\n\r\n");
    const char *want[] = {"first", "hello", "abc", "last"};
    for (int i = 0; i < 4; i++) {
        struct resp r;
        assert_int_equal(cli_response(&c, &r), 0);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, want[i]);
        free(r.body);
    }
    cli_close(&c);
}

static void test_chunked_upload(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    /* Chunks split at awkward places, with an extension and a trailer. */
    const char *parts[] = {
        "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "3\r\nhel\r", "\n6;ext=1\r\nlo wor\r\n", "2\r\nld\r\n0\r\n",
        "X-Trailer: t\r\n\r\n"};
    for (size_t i = 0; i < 5; i++) {
        cli_sends(&c, parts[i]);
        sleep_ms(5);
    }
    struct resp r;
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello world");
    free(r.body);
    /* The connection stays usable. */
    cli_sends(&c, "GET /hello HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_string_equal(r.body, "hello");
    free(r.body);
    cli_close(&c);
}

static void test_expect_continue(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "POST /echo HTTP/1.1\r\nContent-Length: 4\r\n"
                  "Expect: 100-continue\r\n\r\n");
    struct resp r;
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 100);
    free(r.body);
    cli_sends(&c, "data");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "data");
    free(r.body);
    /* Too large: 413 at once, no 100. */
    cli_sends(&c, "POST /echo HTTP/1.1\r\nContent-Length: 99999999\r\n"
                  "Expect: 100-continue\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 413);
    free(r.body);
    assert_true(cli_closed(&c));
    cli_close(&c);
}

/* An error answer is complete JSON, says close, and the server closes. */
static void expect_error_close(struct fx *fx, const char *raw, int status)
{
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, raw);
    struct resp r;
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, status);
    assert_true(head_has(&r, "Connection: close"));
    assert_true(head_has(&r, "Content-Type: application/json"));
    char code[32];
    snprintf(code, sizeof(code), "\"code\":%d}}", status);
    assert_non_null(strstr(r.body, code));
    assert_non_null(strstr(r.body, "{\"error\":{\"message\":"));
    assert_non_null(strstr(r.body, "\"param\":null"));
    free(r.body);
    assert_true(cli_closed(&c));
    cli_close(&c);
}

static void test_header_too_large(void **state)
{
    struct fx *fx = *state;
    size_t n = 8192;
    char *raw = malloc(n + 128);
    assert_non_null(raw);
    int k = sprintf(raw, "GET /hello HTTP/1.1\r\nX-Big: ");
    memset(raw + k, 'x', n);
    strcpy(raw + k + n, "\r\n\r\n");
    expect_error_close(fx, raw, 431);
    /* Many small headers add up too. */
    k = sprintf(raw, "GET /hello HTTP/1.1\r\n");
    for (int i = 0; i < 700; i++) /* ~6 KB in 10-byte lines */
        k += sprintf(raw + k, "H%d: v\r\n", i);
    strcpy(raw + k, "\r\n");
    expect_error_close(fx, raw, 431);
    /* So does a long target. */
    k = sprintf(raw, "GET /hello?");
    memset(raw + k, 'q', 5000);
    strcpy(raw + k + 5000, " HTTP/1.1\r\n\r\n");
    expect_error_close(fx, raw, 431);
    free(raw);
    /* Just under the limit is fine. */
    raw = malloc(4096);
    k = sprintf(raw, "GET /hello HTTP/1.1\r\nX-Big: ");
    memset(raw + k, 'y', 3000);
    strcpy(raw + k + 3000, "\r\n\r\n");
    struct resp r;
    one_shot(fx, raw, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    free(raw);
}

static void test_body_too_large(void **state)
{
    struct fx *fx = *state;
    /* Announced: refused before the body is sent. */
    expect_error_close(
        fx, "POST /echo HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n", 413);
    /* Chunked: refused once the decoded size passes the limit, while the
     * client is still sending (the lingering close keeps the answer). */
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    char *chunk = malloc(70000);
    int k = sprintf(chunk, "10000\r\n");
    memset(chunk + k, 'z', 0x10000);
    memcpy(chunk + k + 0x10000, "\r\n", 2);
    for (int i = 0; i < 20; i++) {
        ssize_t w = send(c.fd, chunk, (size_t)k + 0x10000 + 2, MSG_NOSIGNAL);
        if (w < 0)
            break; /* the server already answered and shut down */
    }
    struct resp r;
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 413);
    free(r.body);
    free(chunk);
    cli_close(&c);
    /* Exactly at the limit is fine. */
    size_t n = 1 << 20;
    char *big = malloc(n + 128);
    k = sprintf(big, "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", n);
    memset(big + k, 'b', n);
    cli_open(&c, fx->port);
    cli_send(&c, big, (size_t)k + n);
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, n);
    free(r.body);
    free(big);
    cli_close(&c);
}

static void test_malformed(void **state)
{
    struct fx *fx = *state;
    expect_error_close(fx, "GARBAGE\r\n\r\n", 400);
    expect_error_close(fx, "\x01\x02\x03 / HTTP/1.1\r\n\r\n", 400);
    expect_error_close(fx, "GET /hello HTTP/9.9x\r\n\r\n", 400);
    expect_error_close(fx, "GET /hello HTTP/1.1\r\nBad Header\r\n\r\n", 400);
    expect_error_close(
        fx, "POST /echo HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400);
    expect_error_close(fx,
                       "POST /echo HTTP/1.1\r\nContent-Length: 1\r\n"
                       "Content-Length: 2\r\n\r\nab",
                       400);
    expect_error_close(fx,
                       "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                       "\r\nzz\r\n",
                       400);
    /* A good request before a bad one is still answered. */
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /hello HTTP/1.1\r\n\r\nNOT HTTP AT ALL\r\n\r\n");
    struct resp r;
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 400);
    free(r.body);
    assert_true(cli_closed(&c));
    cli_close(&c);
    expect_no_conns_left(fx);
}

static void test_request_timeout(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /hello HTTP/1.1\r\nX-Slow: "); /* and nothing more */
    struct resp r;
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 408);
    free(r.body);
    assert_true(cli_closed(&c));
    cli_close(&c);
}

static void test_idle_timeout(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /hello HTTP/1.1\r\n\r\n");
    struct resp r;
    assert_int_equal(cli_response(&c, &r), 0);
    free(r.body);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(cli_closed(&c)); /* quietly, no bytes */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(c.len, 0);
    double s = (double)(t1.tv_sec - t0.tv_sec) +
               (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_true(s > 1.0 && s < 4.0); /* idle_timeout_ms = 1500 */
    cli_close(&c);
}

static void test_sse(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /sse?n=4 HTTP/1.1\r\n\r\n");
    struct resp r;
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    assert_true(head_has(&r, "Content-Type: text/event-stream"));
    assert_true(head_has(&r, "Cache-Control: no-cache"));
    assert_false(head_has(&r, "Content-Length"));
    assert_string_equal(r.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\n"
                                "data: {\"i\":2}\n\ndata: {\"i\":3}\n\n"
                                "data: [DONE]\n\n");
    free(r.body);
    /* Keep-alive after a stream. */
    cli_sends(&c, "GET /hello HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_string_equal(r.body, "hello");
    free(r.body);
    cli_close(&c);

    /* HTTP/1.0: no chunked coding, the close ends the body. */
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /sse?n=2 HTTP/1.0\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_false(r.chunked);
    assert_true(head_has(&r, "Connection: close"));
    assert_string_equal(r.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\n"
                                "data: [DONE]\n\n");
    free(r.body);
    cli_close(&c);
}

static int wait_atomic(atomic_int *v, int want)
{
    for (int i = 0; i < 200 && atomic_load(v) != want; i++)
        sleep_ms(10);
    return atomic_load(v);
}

static void test_disconnect_mid_stream(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /forever HTTP/1.1\r\n\r\n");
    /* Wait for the head and a couple of events, then vanish. */
    while (!memmem(c.buf, c.len, "\"i\":1", 5))
        assert_int_equal(cli_fill(&c), 0);
    cli_close(&c);
    assert_int_equal(wait_atomic(&fx->aborts, 1), 1);
    int events = atomic_load(&fx->stream_events);
    sleep_ms(100);
    assert_int_equal(atomic_load(&fx->aborts), 1);            /* once */
    assert_int_equal(atomic_load(&fx->stream_events), events); /* stopped */
    expect_no_conns_left(fx);

    /* Disconnect while the answer is still being computed. */
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /delay?ms=5000 HTTP/1.1\r\n\r\n");
    sleep_ms(30);
    cli_close(&c);
    assert_int_equal(wait_atomic(&fx->aborts, 2), 2);

    /* Reset (RST) instead of FIN. */
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /forever HTTP/1.1\r\n\r\n");
    while (!memmem(c.buf, c.len, "\"i\":0", 5))
        assert_int_equal(cli_fill(&c), 0);
    struct linger lg = {1, 0};
    setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    cli_close(&c);
    assert_int_equal(wait_atomic(&fx->aborts, 3), 3);
    expect_no_conns_left(fx);
}

/* A handler without on_abort finishes after its client left: the call is
 * refused with TG_ECANCELED and frees the handle (ASan checks that). */
static void test_zombie(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    cli_sends(&c, "GET /zombie HTTP/1.1\r\n\r\n");
    sleep_ms(20);
    cli_close(&c);
    assert_int_equal(wait_atomic(&fx->zombie_done, 1), 1);
    assert_int_equal(atomic_load(&fx->zombie_rc), TG_ECANCELED);
    assert_int_equal(atomic_load(&fx->aborts), 0);
}

static void test_routes(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    struct resp r;
    cli_sends(&c, "GET /nothing-here HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "\"code\":404"));
    assert_non_null(strstr(r.body, "\"type\":\"invalid_request_error\""));
    free(r.body);
    /* 404/405 keep the connection. */
    cli_sends(&c, "DELETE /echo HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 405);
    assert_true(head_has(&r, "\r\nAllow: POST, PUT\r\n"));
    assert_non_null(strstr(r.body, "\"code\":405"));
    free(r.body);
    cli_sends(&c, "POST /hello HTTP/1.1\r\nContent-Length: 1\r\n\r\nx");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 405);
    assert_true(head_has(&r, "\r\nAllow: GET, HEAD\r\n"));
    free(r.body);
    /* Prefix route; path and query split; absolute-form target. */
    cli_sends(&c, "GET /v1/models/tiny%20one?x=1&y=2 HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "/v1/models/tiny%20one?x=1&y=2");
    free(r.body);
    cli_sends(&c, "GET http://h:1/v1/models/a HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_string_equal(r.body, "/v1/models/a?");
    free(r.body);
    cli_sends(&c, "GET /v1/models HTTP/1.1\r\n\r\n"); /* not the prefix */
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 404);
    free(r.body);
    /* Misused API calls are refused, the good answer still goes out. */
    cli_sends(&c, "GET /misuse HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_int_equal(r.status, 204);
    assert_false(head_has(&r, "Content-Length"));
    assert_false(head_has(&r, "Injected"));
    free(r.body);
    assert_int_equal(atomic_load(&fx->misuse_ok), 1);
    cli_close(&c);
}

/* HTTP/1.0 without keep-alive closes; with it, stays open. */
static void test_http10(void **state)
{
    struct fx *fx = *state;
    struct cli c;
    cli_open(&c, fx->port);
    struct resp r;
    cli_sends(&c, "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_true(head_has(&r, "Connection: keep-alive"));
    free(r.body);
    cli_sends(&c, "GET /hello HTTP/1.0\r\n\r\n");
    assert_int_equal(cli_response(&c, &r), 0);
    assert_string_equal(r.body, "hello");
    assert_true(head_has(&r, "Connection: close"));
    free(r.body);
    assert_true(cli_closed(&c));
    cli_close(&c);
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
    struct fx *fx = calloc(1, sizeof(*fx));
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
    assert_int_equal(rt_http_route_add(&fx->srv, "GET", "/forever", h_sse, fx,
                                       err, sizeof(err)),
                     0);
    assert_int_equal(
        rt_http_server_listen(&fx->srv, "127.0.0.1", 0, err, sizeof(err)), 0);
    /* A second server cannot take the same port. */
    struct rt_http_server other;
    assert_int_equal(
        rt_http_server_init(&other, &fx->loop, NULL, err, sizeof(err)), 0);
    assert_int_equal(rt_http_server_listen(&other, "127.0.0.1", fx->srv.port,
                                           err, sizeof(err)),
                     TG_EIO);
    rt_http_server_close(&other, NULL, NULL);

    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a4 = {0};
    a4.sin_family = AF_INET;
    a4.sin_port = htons((uint16_t)fx->srv.port);
    a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a4, sizeof(a4)), 0);
    const char *q = "GET /forever HTTP/1.1\r\n\r\n";
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
        cmocka_unit_test_setup_teardown(test_get, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_post_body, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_keep_alive, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_pipelining, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_chunked_upload, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_expect_continue, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_header_too_large, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_malformed, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_request_timeout, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_idle_timeout, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_sse, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_disconnect_mid_stream, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_zombie, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_routes, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_http10, fx_setup, fx_teardown),
        cmocka_unit_test(test_close_in_flight_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
