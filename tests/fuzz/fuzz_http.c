/*
 * fuzz_http.c — the router's HTTP/1.1 server (router/net/rt_http*.c) on bytes
 * from an untrusted client: request line and header parsing, the strict
 * framing checks against request smuggling (rt_http_parse.c), chunked and
 * Content-Length bodies, trailers, limits (431, 413), the head check,
 * pipelining behind a response that completes later, routing (404, 405),
 * error answers and the graceful close.
 *
 * The real connection state machine runs on a libuv loop in this thread;
 * the server end of a socketpair is adopted as a connection
 * (rt_http_server_adopt, the same code path as an accepted TCP socket) and
 * the harness writes the input to the other end. Input layout:
 *   byte 0      how the bytes are delivered: 0 = in one write, n > 0 = in
 *               writes of n bytes, each read by the server before the
 *               next (so framing state crosses read boundaries)
 *   bytes 1..   the client's bytes
 * After the input the client half-closes and reads until the server
 * closes; every input must end with the connection closed and every
 * request freed (a connection left open is reported as a hang).
 *
 * Routes: GET/HEAD /hello, POST/PUT /echo (the body back), GET /stream
 * (a chunked response in three writes), GET /later (answered from a timer
 * on a later loop iteration, with an abort callback), GET under
 * /v1/models/ (a prefix route). The head check refuses a request carrying
 * "X-Deny" with 401. Limits: 2048 header bytes, 16 KiB body.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "router/net/rt_http.h"
#include "router/net/rt_http.h"
#include "tests/fuzz/fz_util.h"

static uv_loop_t loop;
static struct rt_http_server srv;
/* Smaller than the largest body, so that refusals for the budget (503)
 * are fuzzed too; nothing may stay charged once a connection is gone. */
static struct rt_conn_budget budget = {.limit = 8192};
static int client_fd = -1;

static void h_hello(struct rt_http_req *req, void *ud)
{
    (void)ud;
    rt_http_resp_header(req, "X-Hello", "1");
    rt_http_respond(req, 200, "text/plain", "hello", 5);
}

static void h_echo(struct rt_http_req *req, void *ud)
{
    (void)ud;
    if (req->body[req->body_len] != '\0')
        fz_fail("request body is not NUL-terminated");
    const char *t = rt_http_req_header(req, "x-test");
    if (t)
        rt_http_resp_header(req, "X-Test-Echo", t);
    rt_http_respond(req, 200, "application/octet-stream", req->body,
                    req->body_len);
}

static void h_stream(struct rt_http_req *req, void *ud)
{
    (void)ud;
    if (rt_http_stream_begin(req, 200, "text/event-stream") != 0)
        return;
    rt_http_stream_write(req, "data: 1\n\n", 9);
    rt_http_stream_write(req, "data: 2\n\n", 9);
    rt_http_stream_end(req);
}

static void h_prefix(struct rt_http_req *req, void *ud)
{
    (void)ud;
    char b[512];
    int n = snprintf(b, sizeof(b), "%s?%s", req->path, req->query);
    rt_http_respond(req, 200, "text/plain", b,
                    n < (int)sizeof(b) ? (size_t)n : sizeof(b) - 1);
}

/* /later: the answer comes from a timer, so the request is in flight
 * while pipelined bytes behind it arrive. */
struct later {
    uv_timer_t timer;
    struct rt_http_req *req;
};

static void later_free(uv_handle_t *h)
{
    free(h->data);
}

static void later_fire(uv_timer_t *t)
{
    struct later *l = t->data;
    rt_http_respond(l->req, 200, "text/plain", "later", 5);
    uv_close((uv_handle_t *)t, later_free);
}

static void later_abort(struct rt_http_req *req, void *ud)
{
    (void)req;
    struct later *l = ud;
    uv_timer_stop(&l->timer);
    uv_close((uv_handle_t *)&l->timer, later_free);
}

static void h_later(struct rt_http_req *req, void *ud)
{
    (void)ud;
    struct later *l = calloc(1, sizeof(*l));
    if (!l) {
        rt_http_respond_error(req, 500, NULL, "out of memory", NULL);
        return;
    }
    l->req = req;
    uv_timer_init(&loop, &l->timer);
    l->timer.data = l;
    rt_http_req_on_abort(req, later_abort, l);
    uv_timer_start(&l->timer, later_fire, 0, 0);
}

static int on_head(const struct rt_http_req *req, void *ud,
                   struct rt_http_refusal *r)
{
    (void)ud;
    if (!rt_http_req_header(req, "x-deny"))
        return 0;
    r->status = 401;
    r->type = "authentication_error";
    r->code = "invalid_api_key";
    r->message = "denied";
    r->header = "WWW-Authenticate: Bearer";
    return -1;
}

static void setup(void)
{
    char err[256];
    /* libuv writes with write(2): a client that is gone gives EPIPE. */
    signal(SIGPIPE, SIG_IGN);
    if (uv_loop_init(&loop) != 0)
        fz_fail("uv_loop_init");
    struct rt_http_config cfg;
    rt_http_config_default(&cfg);
    cfg.max_header_bytes = 2048;
    cfg.max_body_bytes = 16384;
    /* No deadline may fire while an input runs: each input ends by the
     * client's half-close, never by a timer. */
    cfg.idle_timeout_ms = 600000;
    cfg.header_timeout_ms = 600000;
    cfg.body_timeout_ms = 600000;
    cfg.send_timeout_ms = 600000;
    cfg.linger_ms = 600000;
    cfg.body_budget = &budget;
    if (rt_http_server_init(&srv, &loop, &cfg, err, sizeof(err)) != 0)
        fz_fail("rt_http_server_init: %s", err);
    rt_http_server_on_head(&srv, on_head, NULL);
    static const struct {
        const char *m, *p;
        rt_http_handler_fn h;
    } routes[] = {
        {"GET", "/hello", h_hello},   {"HEAD", "/hello", h_hello},
        {"POST", "/echo", h_echo},    {"PUT", "/echo", h_echo},
        {"GET", "/stream", h_stream}, {"GET", "/later", h_later},
        {"GET", "/v1/models/*", h_prefix},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (rt_http_route_add(&srv, routes[i].m, routes[i].p, routes[i].h,
                              NULL, err, sizeof(err)) != 0)
            fz_fail("rt_http_route_add: %s", err);
}

/* One round of the server's loop, then whatever it wrote is read. */
static int client_eof;

static void pump(void *ud)
{
    (void)ud;
    uv_run(&loop, UV_RUN_NOWAIT);
    fz_drain(client_fd, &client_eof);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    if (size < 1)
        return 0;
    size_t step = data[0] ? data[0] : size;
    data++;
    size--;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                   sv) != 0)
        fz_fail("socketpair");
    if (rt_http_server_adopt(&srv, sv[0]) != 0)
        fz_fail("rt_http_server_adopt");
    client_fd = sv[1];
    client_eof = 0;
    for (size_t off = 0; off < size && !client_eof; off += step) {
        size_t n = size - off < step ? size - off : step;
        if (fz_write_all(client_fd, data + off, n, pump, NULL) != 0)
            break;
        pump(NULL);
    }
    shutdown(client_fd, SHUT_WR);
    /* Every input ends with the server closing the connection: a
     * complete request is answered, anything else refused or dropped. */
    long rounds = 0;
    while (srv.set.n_open > 0) {
        pump(NULL);
        if (++rounds > 1000000)
            fz_fail("the connection did not close after the client's "
                    "half-close (hang)");
    }
    close(client_fd);
    client_fd = -1;
    if (srv.zombies)
        fz_fail("a request handle was left behind");
    if (budget.used != 0)
        fz_fail("%zu body bytes still charged to the budget after the "
                "connection closed", budget.used);
    return 0;
}
