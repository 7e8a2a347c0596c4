/* tt_http.c — the rt_http loopback fixture and raw client shared by
 * test_http.c and test_http_stream.c (see tt_http.h). */
#include "tests/support/tt_http.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* ---- server ------------------------------------------------------------- */
static void on_stop(uv_async_t *a)
{
    struct tt_http_fx *fx = a->data;
    rt_http_server_close(&fx->srv, NULL, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_thread(void *arg)
{
    struct tt_http_fx *fx = arg;
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
    int n = snprintf(b, sizeof(b), "%zu", req->srv->set.n_open);
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
    struct tt_http_fx *fx;
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

static struct delayed *delayed_new(struct rt_http_req *req,
                                   struct tt_http_fx *fx)
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

void tt_http_sse_handler(struct rt_http_req *req, void *ud)
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
    struct tt_http_fx *fx = ud;
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

/* Counters of the server, read on the loop thread: "name=value" lines. */
static void h_counters(struct rt_http_req *req, void *ud)
{
    struct tt_http_fx *fx = ud;
    const struct rt_http_stats *st = &req->srv->stats;
    const struct rt_conn_stats *cs = &req->srv->set.stats;
    const struct rt_conn_budget *bb = req->srv->cfg.body_budget;
    char b[1024];
    int n = snprintf(
        b, sizeof(b),
        "live=%zu\naccepted=%llu\nrejected_max=%llu\n"
        "rejected_per_ip=%llu\nevicted=%llu\n"
        "evicted_head=%llu\nevicted_body=%llu\n"
        "probe_admitted=%llu\nprobes_served=%llu\n"
        "slow_bodies=%llu\nbudget_used=%zu\n"
        "accept_pauses=%llu\n"
        "timeout_header=%llu\ntimeout_body=%llu\n"
        "malformed=%llu\ntoo_large=%llu\nrefused_head=%llu\n"
        "refused_budget=%llu\n"
        "slow_readers=%llu\nhalf_closed=%llu\n"
        "max_pending=%d\n",
        req->srv->set.n_live, (unsigned long long)cs->accepted,
        (unsigned long long)cs->rejected_max,
        (unsigned long long)cs->rejected_per_ip,
        (unsigned long long)(cs->evicted_idle + cs->evicted_head +
                             cs->evicted_body),
        (unsigned long long)cs->evicted_head,
        (unsigned long long)cs->evicted_body,
        (unsigned long long)cs->probe_admitted,
        (unsigned long long)st->probes_served,
        (unsigned long long)st->slow_bodies, bb ? bb->used : (size_t)0,
        (unsigned long long)cs->accept_pauses,
        (unsigned long long)st->timeout_header,
        (unsigned long long)st->timeout_body, (unsigned long long)st->malformed,
        (unsigned long long)st->too_large, (unsigned long long)st->refused_head,
        (unsigned long long)st->refused_budget,
        (unsigned long long)st->slow_readers,
        (unsigned long long)st->half_closed, atomic_load(&fx->max_pending));
    rt_http_respond(req, 200, "text/plain", b, (size_t)n);
}

/* /flood?kb=N: N KiB in 16 KiB chunks, as fast as the client reads: the
 * producer stops above 64 KiB queued and resumes from on_drain at 16 KiB
 * (the backpressure pattern of the SSE front end). */
struct flood {
    struct rt_http_req *req;
    struct tt_http_fx *fx;
    size_t left;
};

enum { FLOOD_CHUNK = 16384, FLOOD_HIGH = 65536, FLOOD_LOW = 16384 };

static void flood_abort(struct rt_http_req *req, void *ud)
{
    (void)req;
    struct flood *f = ud;
    atomic_fetch_add(&f->fx->aborts, 1);
    free(f);
}

static void flood_pump(struct rt_http_req *req, void *ud)
{
    struct flood *f = ud;
    static char chunk[FLOOD_CHUNK];
    if (chunk[0] == '\0')
        memset(chunk, 'f', sizeof(chunk));
    for (;;) {
        size_t q = rt_http_req_pending_bytes(req);
        if ((int)q > atomic_load(&f->fx->max_pending))
            atomic_store(&f->fx->max_pending, (int)q);
        if (f->left == 0) {
            assert_int_equal(rt_http_stream_end(req), 0);
            free(f);
            return;
        }
        if (q > FLOOD_HIGH) {
            int rc = rt_http_req_on_drain(req, FLOOD_LOW, flood_pump, f);
            if (rc == 0)
                return;
            assert_int_equal(rc, TG_EAGAIN);
        }
        size_t n = f->left < FLOOD_CHUNK ? f->left : FLOOD_CHUNK;
        assert_int_equal(rt_http_stream_write(req, chunk, n), 0);
        f->left -= n;
    }
}

static void h_flood(struct rt_http_req *req, void *ud)
{
    struct flood *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->req = req;
    f->fx = ud;
    f->left = (size_t)query_int(req->query, "kb=", 64) * 1024;
    rt_http_req_on_abort(req, flood_abort, f);
    /* Nothing queued yet: there is nothing to wait for. */
    assert_int_equal(rt_http_req_on_drain(req, 0, flood_pump, f), TG_EAGAIN);
    assert_int_equal(rt_http_stream_begin(req, 200, "application/octet-stream"),
                     0);
    flood_pump(req, f);
}

/* The head check of tt_http_fx_start(with_auth): everything but /hello
 * needs "Authorization: Bearer k". */
static int auth_head(const struct rt_http_req *req, void *ud,
                     struct rt_http_refusal *out)
{
    (void)ud;
    if (strcmp(req->path, "/hello") == 0)
        return 0;
    const char *a = rt_http_req_header(req, "authorization");
    if (a && strcmp(a, "Bearer k") == 0)
        return 0;
    out->status = 401;
    out->type = "authentication_error";
    out->code = "invalid_api_key";
    out->message = "missing or invalid API key";
    out->header = "WWW-Authenticate: Bearer";
    return 1;
}

void tt_http_fx_test_config(struct rt_http_config *cfg)
{
    rt_http_config_default(cfg);
    cfg->max_header_bytes = 4096;
    cfg->max_body_bytes = 1 << 20;
    cfg->idle_timeout_ms = 1500;
    cfg->header_timeout_ms = 1000;
    cfg->body_timeout_ms = 1000;
    cfg->send_timeout_ms = 1000;
    cfg->linger_ms = 200;
}

struct tt_http_fx *tt_http_fx_start(const struct rt_http_config *cfg,
                                    int with_auth)
{
    struct tt_http_fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    char err[256];
    /* As in the router: libuv writes with write(2), so a client that is
     * gone must give EPIPE, not kill the process. */
    signal(SIGPIPE, SIG_IGN);
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    assert_int_equal(rt_http_server_init(&fx->srv, &fx->loop, cfg, err,
                                         sizeof(err)),
                     0);
    if (with_auth)
        rt_http_server_on_head(&fx->srv, auth_head, fx);
    static const struct {
        const char *m, *p;
        rt_http_handler_fn h;
    } routes[] = {
        {"GET", "/hello", h_hello},     {"HEAD", "/hello", h_hello},
        {"POST", "/echo", h_echo},      {"PUT", "/echo", h_echo},
        {"GET", "/stats", h_stats},     {"GET", "/delay", h_delay},
        {"GET", "/zombie", h_zombie},   {"GET", "/sse", tt_http_sse_handler},
        {"GET", "/forever", tt_http_sse_handler},
        {"GET", "/v1/models/*", h_prefix},
        {"GET", "/misuse", h_misuse},   {"GET", "/counters", h_counters},
        {"GET", "/flood", h_flood},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        assert_int_equal(rt_http_route_add(&fx->srv, routes[i].m,
                                           routes[i].p, routes[i].h, fx, err,
                                           sizeof(err)),
                         0);
    assert_int_equal(rt_http_route_add(&fx->srv, "GET", "nope", h_hello, fx,
                                       err, sizeof(err)),
                     TG_EINVAL);
    /* What a connection of the probe reserve is served. */
    assert_int_equal(rt_http_route_set_probe(&fx->srv, "/hello"), 0);
    assert_int_equal(rt_http_route_set_probe(&fx->srv, "/counters"), 0);
    assert_int_equal(rt_http_route_set_probe(&fx->srv, "/nope"), TG_ENOTFOUND);
    assert_int_equal(
        rt_http_server_listen(&fx->srv, "127.0.0.1", 0, err, sizeof(err)), 0);
    assert_int_equal(
        rt_http_server_listen(&fx->srv, "127.0.0.1", 0, err, sizeof(err)),
        TG_EINVAL); /* twice */
    fx->port = fx->srv.set.port;
    assert_true(fx->port > 0);
    uv_async_init(&fx->loop, &fx->stop, on_stop);
    fx->stop.data = fx;
    assert_int_equal(pthread_create(&fx->thread, NULL, loop_thread, fx), 0);
    return fx;
}

int tt_http_fx_setup(void **state)
{
    struct rt_http_config cfg;
    tt_http_fx_test_config(&cfg);
    *state = tt_http_fx_start(&cfg, 0);
    return 0;
}

int tt_http_fx_teardown(void **state)
{
    struct tt_http_fx *fx = *state;
    uv_async_send(&fx->stop);
    pthread_join(fx->thread, NULL);
    rt_http_server_free(&fx->srv);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    free(fx);
    return 0;
}

/* ---- raw client --------------------------------------------------------- */

void tt_http_cli_open(struct tt_http_cli *c, int port)
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

void tt_http_cli_close(struct tt_http_cli *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
}

void tt_http_cli_send(struct tt_http_cli *c, const char *s, size_t n)
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

void tt_http_cli_sends(struct tt_http_cli *c, const char *s)
{
    tt_http_cli_send(c, s, strlen(s));
}

/* Reads more bytes; returns 0, or -1 at EOF / error / timeout. */
int tt_http_cli_fill(struct tt_http_cli *c)
{
    assert_int_equal(TG_GROW(c->buf, &c->cap, c->len + 4096), 0);
    ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (r <= 0) {
        c->eof = 1;
        return -1;
    }
    c->len += (size_t)r;
    return 0;
}

void tt_http_cli_consume(struct tt_http_cli *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

/* Reads one response (1xx interim responses are returned too). Returns 0
 * or -1 when the connection ended before a whole response arrived. The
 * caller frees r->body. */
int tt_http_cli_response(struct tt_http_cli *c, struct tt_http_resp *r)
{
    memset(r, 0, sizeof(*r));
    char *end;
    while (!(end = memmem(c->buf, c->len, "\r\n\r\n", 4)))
        if (tt_http_cli_fill(c) < 0)
            return -1;
    size_t hl = (size_t)(end - c->buf) + 4;
    assert_true(hl < sizeof(r->head));
    memcpy(r->head, c->buf, hl);
    r->head[hl] = '\0';
    tt_http_cli_consume(c, hl);
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
            if (tt_http_cli_fill(c) < 0)
                return -1;
        r->body = realloc(r->body, n + 1);
        memcpy(r->body, c->buf, n);
        r->body[n] = '\0';
        r->body_len = n;
        tt_http_cli_consume(c, n);
    } else if (r->chunked) {
        for (;;) {
            char *crlf;
            while (!(crlf = memmem(c->buf, c->len, "\r\n", 2)))
                if (tt_http_cli_fill(c) < 0)
                    return -1;
            size_t n = strtoul(c->buf, NULL, 16);
            size_t off = (size_t)(crlf - c->buf) + 2;
            while (c->len < off + n + 2)
                if (tt_http_cli_fill(c) < 0)
                    return -1;
            assert_memory_equal(c->buf + off + n, "\r\n", 2);
            r->body = realloc(r->body, r->body_len + n + 1);
            memcpy(r->body + r->body_len, c->buf + off, n);
            r->body_len += n;
            r->body[r->body_len] = '\0';
            tt_http_cli_consume(c, off + n + 2);
            if (n == 0)
                break;
        }
    } else {
        while (tt_http_cli_fill(c) == 0) /* close-delimited */
            ;
        r->body = realloc(r->body, c->len + 1);
        memcpy(r->body, c->buf, c->len);
        r->body[c->len] = '\0';
        r->body_len = c->len;
        tt_http_cli_consume(c, c->len);
    }
    return 0;
}

/* True when the server closed the connection (EOF within the timeout). */
int tt_http_cli_closed(struct tt_http_cli *c)
{
    while (!c->eof)
        tt_http_cli_fill(c);
    return c->eof;
}

int tt_http_head_has(const struct tt_http_resp *r, const char *line)
{
    return strcasestr(r->head, line) != NULL;
}

void tt_http_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One request on a fresh connection. */
void tt_http_one_shot(struct tt_http_fx *fx, const char *raw,
                      struct tt_http_resp *r)
{
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, raw);
    assert_int_equal(tt_http_cli_response(&c, r), 0);
    tt_http_cli_close(&c);
}

/* Polls /stats until only the polling connection itself is open. */
void tt_http_expect_no_conns_left(struct tt_http_fx *fx)
{
    for (int i = 0; i < 100; i++) {
        struct tt_http_resp r;
        tt_http_one_shot(fx,
                         "GET /stats HTTP/1.1\r\nHost: t\r\n"
                         "Authorization: Bearer k\r\nConnection: close\r\n\r\n",
                         &r);
        int n = atoi(r.body);
        free(r.body);
        if (n == 1)
            return;
        tt_http_sleep_ms(20);
    }
    fail_msg("connections still open");
}

void tt_http_expect_error_close(struct tt_http_fx *fx, const char *raw,
                                int status)
{
    struct tt_http_cli c;
    tt_http_cli_open(&c, fx->port);
    tt_http_cli_sends(&c, raw);
    struct tt_http_resp r;
    if (tt_http_cli_response(&c, &r) != 0)
        fail_msg("no response to: %s", raw);
    if (r.status != status)
        fail_msg("status %d, want %d, for: %s", r.status, status, raw);
    assert_true(tt_http_head_has(&r, "Connection: close"));
    assert_true(tt_http_head_has(&r, "Content-Type: application/json"));
    /* "code" is always a string: the status's, or one the server or a
     * head check chose. */
    char code[64];
    snprintf(code, sizeof(code), "\"code\":\"%s\"}}",
             rt_http_status_code(status));
    if (!strstr(r.body, code))
        assert_non_null(strstr(r.body, "\"code\":\""));
    assert_null(strstr(r.body, "\"code\":null"));
    assert_non_null(strstr(r.body, "{\"error\":{\"message\":"));
    assert_non_null(strstr(r.body, "\"param\":null"));
    free(r.body);
    assert_true(tt_http_cli_closed(&c));
    tt_http_cli_close(&c);
}

long tt_http_counter(struct tt_http_fx *fx, const char *name)
{
    struct tt_http_resp r;
    tt_http_one_shot(fx,
                     "GET /counters HTTP/1.1\r\nHost: t\r\n"
                     "Authorization: Bearer k\r\nConnection: close\r\n\r\n",
                     &r);
    assert_int_equal(r.status, 200);
    char key[64];
    snprintf(key, sizeof(key), "%s=", name);
    const char *p = strstr(r.body, key);
    if (!p)
        fail_msg("no counter %s in %s", name, r.body);
    long v = strtol(p + strlen(key), NULL, 10);
    free(r.body);
    return v;
}
