/* test_grpc.c — the router's gRPC server (rt_grpc) on real loopback
 * sockets. The server runs on a uv loop in a thread with demo methods
 * registered here; two kinds of clients drive it:
 * - a small nghttp2 client in this file (blocking socket) for what a real
 *   gRPC client never sends: wrong :method / content-type / te, compressed
 *   or bad flags, zero / two / truncated / oversized messages, huge
 *   headers, grpc-timeout deadlines (malformed too), plus a raw echo;
 * - Debian's python3-grpcio (the real client of DESIGN §7), through an
 *   embedded script using generic unary_unary / unary_stream calls with
 *   bytes in and out: round trips, streaming counts and trailers, flow
 *   control, status codes with non-ASCII messages, unknown method,
 *   RESOURCE_EXHAUSTED, client cancel reaching on_cancel, deadlines,
 *   20 concurrent streams on one connection, the health service, and
 *   garbage bytes closing only their own connection.
 * Pure helpers (timeout parsing, message encoding) and API misuse are
 * tested directly. Without python3-grpcio the program exits 77 (skipped)
 * after the other tests passed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "common/tg_err.h"
#include "router/rt_grpc.h"

/* ---- server fixture ------------------------------------------------------ */

#define MAX_KEPT 64

struct tick {
    uv_timer_t timer;
    struct rt_grpc_call *call;
    struct fx *fx;
    int left, sent;
};

struct fx {
    uv_loop_t loop;
    struct rt_grpc_server srv;
    uv_async_t stop;
    pthread_t thread;
    int port;
    atomic_int serving;       /* health of "tangram.v1.Generation" */
    atomic_int cancels;       /* on_cancel calls, any status */
    atomic_int cancel_deadline; /* ... with DEADLINE_EXCEEDED */
    atomic_int cancel_bad;    /* on_cancel with an unexpected status or
                                 a response call not failing */
    atomic_int slow_started;
    struct rt_grpc_call *kept[MAX_KEPT]; /* zombies-to-be (no on_cancel) */
    int n_kept;
    int zombie_rc_ok;         /* finishes of kept handles that gave
                                 TG_ECANCELED */
};

static void on_stop(uv_async_t *a)
{
    struct fx *fx = a->data;
    rt_grpc_server_close(&fx->srv, NULL, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_thread(void *arg)
{
    struct fx *fx = arg;
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* -- handlers (loop thread) -- */

static void h_echo(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    assert_int_equal(rt_grpc_call_reply(call, call->msg, call->msg_len), 0);
}

/* Request "N SIZE [CODE]": N messages of SIZE bytes (byte i of message k
 * is (k + i) & 255), then status CODE (default OK) with a message. */
static void h_stream(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    char req[64] = {0};
    memcpy(req, call->msg, call->msg_len < 63 ? call->msg_len : 63);
    int n = 0, size = 0, code = 0;
    if (sscanf(req, "%d %d %d", &n, &size, &code) < 2 || n < 0 || size < 0 ||
        size > (1 << 20)) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT, "bad request");
        return;
    }
    uint8_t *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < size; i++)
            buf[i] = (uint8_t)(k + i);
        assert_int_equal(rt_grpc_call_send(call, buf, (size_t)size), 0);
    }
    free(buf);
    assert_true(rt_grpc_call_pending_bytes(call) > 0 || n == 0);
    rt_grpc_call_finish(call, code, code ? "stream failed: ÿ 100%" : NULL);
}

static void tick_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_tick_cancel(struct rt_grpc_call *call, int status, void *ud)
{
    struct tick *t = ud;
    (void)call;
    atomic_fetch_add(&t->fx->cancels, 1);
    if (status != RT_GRPC_CANCELLED && status != RT_GRPC_DEADLINE_EXCEEDED)
        atomic_fetch_add(&t->fx->cancel_bad, 1);
    uv_close((uv_handle_t *)&t->timer, tick_closed);
}

static void on_tick(uv_timer_t *tm)
{
    struct tick *t = tm->data;
    char m[32];
    int n = snprintf(m, sizeof(m), "tick %d", t->sent);
    assert_int_equal(rt_grpc_call_send(t->call, m, (size_t)n), 0);
    t->sent++;
    if (--t->left == 0) {
        rt_grpc_call_finish(t->call, RT_GRPC_OK, NULL);
        uv_close((uv_handle_t *)&t->timer, tick_closed);
    }
}

/* Request "N": N messages "tick i", one per 2 ms from a timer, so the
 * data source runs dry between them (deferred, then resumed). */
static void h_ticks(struct rt_grpc_call *call, void *ud)
{
    struct fx *fx = ud;
    char req[32] = {0};
    memcpy(req, call->msg, call->msg_len < 31 ? call->msg_len : 31);
    int n = atoi(req);
    if (n <= 0) {
        rt_grpc_call_finish(call, RT_GRPC_OK, NULL);
        return;
    }
    struct tick *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    t->call = call;
    t->fx = fx;
    t->left = n;
    uv_timer_init(&fx->loop, &t->timer);
    t->timer.data = t;
    rt_grpc_call_on_cancel(call, on_tick_cancel, t);
    uv_timer_start(&t->timer, on_tick, 2, 2);
}

static void h_fail(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    char msg[512] = {0};
    memcpy(msg, call->msg, call->msg_len < 511 ? call->msg_len : 511);
    assert_int_equal(rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT, msg),
                     0);
}

static void on_slow_cancel(struct rt_grpc_call *call, int status, void *ud)
{
    struct fx *fx = ud;
    atomic_fetch_add(&fx->cancels, 1);
    if (status == RT_GRPC_DEADLINE_EXCEEDED)
        atomic_fetch_add(&fx->cancel_deadline, 1);
    else if (status != RT_GRPC_CANCELLED)
        atomic_fetch_add(&fx->cancel_bad, 1);
    /* Inside the callback every response call fails. */
    if (rt_grpc_call_send(call, "x", 1) != TG_ECANCELED ||
        rt_grpc_call_finish(call, RT_GRPC_OK, NULL) != TG_ECANCELED ||
        rt_grpc_call_pending_bytes(call) != 0)
        atomic_fetch_add(&fx->cancel_bad, 1);
}

/* Never answers: waits for a cancel or a deadline. */
static void h_slow(struct rt_grpc_call *call, void *ud)
{
    struct fx *fx = ud;
    atomic_fetch_add(&fx->slow_started, 1);
    rt_grpc_call_on_cancel(call, on_slow_cancel, fx);
}

/* Never answers and sets no cancel callback: becomes a zombie. */
static void h_keep(struct rt_grpc_call *call, void *ud)
{
    struct fx *fx = ud;
    if (fx->n_kept == MAX_KEPT) {
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "full");
        return;
    }
    fx->kept[fx->n_kept++] = call;
}

/* Finishes every kept handle; answers how many said TG_ECANCELED (all of
 * them should, their clients being gone). */
static void h_release(struct rt_grpc_call *call, void *ud)
{
    struct fx *fx = ud;
    int ok = 0, n = fx->n_kept;
    for (int i = 0; i < n; i++)
        ok += rt_grpc_call_finish(fx->kept[i], RT_GRPC_OK, NULL) ==
              TG_ECANCELED;
    fx->n_kept = 0;
    char m[64];
    int len = snprintf(m, sizeof(m), "%d/%d", ok, n);
    rt_grpc_call_reply(call, m, (size_t)len);
}

static void h_stats(struct rt_grpc_call *call, void *ud)
{
    struct fx *fx = ud;
    char m[160];
    int n = snprintf(m, sizeof(m), "%d %d %d %d %zu %d",
                     atomic_load(&fx->cancels),
                     atomic_load(&fx->cancel_deadline),
                     atomic_load(&fx->cancel_bad),
                     atomic_load(&fx->slow_started), fx->srv.n_conns,
                     fx->n_kept);
    rt_grpc_call_reply(call, m, (size_t)n);
}

static void h_set_serving(struct rt_grpc_call *call, void *ud)
{
    struct fx *fx = ud;
    atomic_store(&fx->serving, call->msg_len && call->msg[0] == '1');
    rt_grpc_call_reply(call, "", 0);
}

/* A unary handler that forgets its message: the client sees INTERNAL. */
static void h_empty(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    assert_int_equal(rt_grpc_call_finish(call, RT_GRPC_OK, NULL), 0);
}

/* A unary handler trying a second message (refused) then finishing. */
static void h_twice(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    assert_int_equal(rt_grpc_call_send(call, "one", 3), 0);
    assert_int_equal(rt_grpc_call_send(call, "two", 3), TG_EINVAL);
    assert_int_equal(rt_grpc_call_finish(call, 17, NULL), TG_EINVAL);
    assert_int_equal(rt_grpc_call_finish(call, RT_GRPC_OK, NULL), 0);
}

static int health_fn(const char *service, void *ud)
{
    struct fx *fx = ud;
    if (service[0] == '\0')
        return RT_GRPC_HEALTH_SERVING;
    if (strcmp(service, "tangram.v1.Generation") == 0)
        return atomic_load(&fx->serving) ? RT_GRPC_HEALTH_SERVING
                                         : RT_GRPC_HEALTH_NOT_SERVING;
    return RT_GRPC_HEALTH_UNKNOWN_SERVICE;
}

static void fx_start_cfg(struct fx *fx, const struct rt_grpc_config *cfg)
{
    memset(fx, 0, sizeof(*fx));
    atomic_store(&fx->serving, 1);
    char err[256];
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    assert_int_equal(rt_grpc_server_init(&fx->srv, &fx->loop, cfg, err,
                                         sizeof(err)),
                     0);
    static const struct {
        const char *path;
        enum rt_grpc_kind kind;
        rt_grpc_handler_fn fn;
    } m[] = {
        {"/test.Echo/Unary", RT_GRPC_UNARY, h_echo},
        {"/test.Echo/Stream", RT_GRPC_SERVER_STREAM, h_stream},
        {"/test.Echo/Ticks", RT_GRPC_SERVER_STREAM, h_ticks},
        {"/test.Echo/Fail", RT_GRPC_UNARY, h_fail},
        {"/test.Echo/Slow", RT_GRPC_SERVER_STREAM, h_slow},
        {"/test.Echo/Keep", RT_GRPC_UNARY, h_keep},
        {"/test.Echo/Release", RT_GRPC_UNARY, h_release},
        {"/test.Echo/Stats", RT_GRPC_UNARY, h_stats},
        {"/test.Echo/SetServing", RT_GRPC_UNARY, h_set_serving},
        {"/test.Echo/Empty", RT_GRPC_UNARY, h_empty},
        {"/test.Echo/Twice", RT_GRPC_UNARY, h_twice},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        assert_int_equal(rt_grpc_method_add(&fx->srv, m[i].path, m[i].kind,
                                            m[i].fn, fx, err, sizeof(err)),
                         0);
    assert_int_equal(rt_grpc_method_add(&fx->srv, "/test.Echo/Unary",
                                        RT_GRPC_UNARY, h_echo, fx, err,
                                        sizeof(err)),
                     TG_EEXIST);
    assert_int_equal(
        rt_grpc_health_register(&fx->srv, health_fn, fx, err, sizeof(err)), 0);
    assert_int_equal(
        rt_grpc_health_register(&fx->srv, health_fn, fx, err, sizeof(err)),
        TG_EEXIST);
    assert_int_equal(rt_grpc_server_listen(&fx->srv, "127.0.0.1", 0, err,
                                           sizeof(err)),
                     0);
    assert_int_equal(rt_grpc_server_listen(&fx->srv, "127.0.0.1", 0, err,
                                           sizeof(err)),
                     TG_EINVAL);
    fx->port = fx->srv.port;
    assert_true(fx->port > 0);
    uv_async_init(&fx->loop, &fx->stop, on_stop);
    fx->stop.data = fx;
    assert_int_equal(pthread_create(&fx->thread, NULL, loop_thread, fx), 0);
}

static void fx_start(struct fx *fx)
{
    fx_start_cfg(fx, NULL);
}

static void fx_stop(struct fx *fx)
{
    uv_async_send(&fx->stop);
    pthread_join(fx->thread, NULL);
    /* Handles still kept by h_keep are zombies or cancelled now; the
     * server frees them. */
    rt_grpc_server_free(&fx->srv);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
}

/* ---- a minimal blocking nghttp2 client -------------------------------- */

struct cli {
    int fd;
    nghttp2_session *s;
    int32_t sid;
    int http_status, grpc_status;
    char grpc_msg[512];
    uint8_t data[1 << 16];
    size_t data_len;
    int closed;
    uint32_t close_code;
    const uint8_t *body;
    size_t body_len, body_off;
    int body_eof; /* END_STREAM after the body */
};

static ssize_t cli_send(nghttp2_session *s, const uint8_t *d, size_t n,
                        int flags, void *ud)
{
    struct cli *c = ud;
    (void)s;
    (void)flags;
    ssize_t w = send(c->fd, d, n, MSG_NOSIGNAL);
    return w < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : w;
}

static int cli_header(nghttp2_session *s, const nghttp2_frame *f,
                      const uint8_t *name, size_t nlen, const uint8_t *value,
                      size_t vlen, uint8_t flags, void *ud)
{
    struct cli *c = ud;
    (void)s;
    (void)f;
    (void)flags;
    if (nlen == 7 && memcmp(name, ":status", 7) == 0)
        c->http_status = atoi((const char *)value);
    else if (nlen == 11 && memcmp(name, "grpc-status", 11) == 0)
        c->grpc_status = atoi((const char *)value);
    else if (nlen == 12 && memcmp(name, "grpc-message", 12) == 0)
        snprintf(c->grpc_msg, sizeof(c->grpc_msg), "%.*s", (int)vlen,
                 (const char *)value);
    return 0;
}

static int cli_data(nghttp2_session *s, uint8_t flags, int32_t sid,
                    const uint8_t *d, size_t n, void *ud)
{
    struct cli *c = ud;
    (void)s;
    (void)flags;
    (void)sid;
    size_t k = n < sizeof(c->data) - c->data_len ? n
                                                 : sizeof(c->data) - c->data_len;
    memcpy(c->data + c->data_len, d, k);
    c->data_len += k;
    return 0;
}

static int cli_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud)
{
    struct cli *c = ud;
    (void)s;
    if (sid == c->sid) {
        c->closed = 1;
        c->close_code = code;
    }
    return 0;
}

static ssize_t cli_body(nghttp2_session *s, int32_t sid, uint8_t *buf,
                        size_t len, uint32_t *flags, nghttp2_data_source *src,
                        void *ud)
{
    struct cli *c = ud;
    (void)s;
    (void)sid;
    (void)src;
    size_t n = c->body_len - c->body_off;
    if (n > len)
        n = len;
    memcpy(buf, c->body + c->body_off, n);
    c->body_off += n;
    if (c->body_off == c->body_len) {
        if (c->body_eof)
            *flags |= NGHTTP2_DATA_FLAG_EOF;
        else if (n == 0)
            return NGHTTP2_ERR_DEFERRED;
    }
    return (ssize_t)n;
}

static int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Starts one request with `nv` (n entries) and `body`, END_STREAM after
 * the body when `eof`, and runs it until the stream closes or `ms` pass;
 * the connection stays open. Returns 1 when the stream closed. */
static int cli_open(struct cli *c, int port, const nghttp2_nv *nv, size_t n,
                    const void *body, size_t blen, int eof, int ms)
{
    memset(c, 0, sizeof(*c));
    c->grpc_status = -1;
    c->fd = tcp_connect(port);
    c->body = body;
    c->body_len = blen;
    c->body_eof = eof;
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, cli_send);
    nghttp2_session_callbacks_set_on_header_callback(cb, cli_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, cli_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, cli_close);
    assert_int_equal(nghttp2_session_client_new(&c->s, cb, c), 0);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, NULL, 0);
    nghttp2_data_provider dp = {.source.ptr = NULL, .read_callback = cli_body};
    c->sid = nghttp2_submit_request(c->s, NULL, nv, n,
                                    (body || eof == 0) ? &dp : NULL, NULL);
    assert_true(c->sid > 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!c->closed) {
        assert_int_equal(nghttp2_session_send(c->s), 0);
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long el = (t1.tv_sec - t0.tv_sec) * 1000 +
                  (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (el >= ms)
            break;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, (int)(ms - el)) <= 0)
            continue;
        uint8_t buf[16384];
        ssize_t r = recv(c->fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break;
        if (nghttp2_session_mem_recv(c->s, buf, (size_t)r) < 0)
            break;
    }
    return c->closed;
}

/* Waits up to `ms` for the server to close the connection; returns 1 when
 * it did (EOF or reset). */
static int cli_wait_eof(struct cli *c, int ms)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    while (poll(&p, 1, ms) > 0) {
        uint8_t buf[4096];
        ssize_t r = recv(c->fd, buf, sizeof(buf), 0);
        if (r <= 0)
            return 1;
    }
    return 0;
}

static void cli_end(struct cli *c)
{
    nghttp2_session_del(c->s);
    close(c->fd);
}

/* cli_open() + cli_end(). */
static int cli_call(struct cli *c, int port, const nghttp2_nv *nv, size_t n,
                    const void *body, size_t blen, int eof, int ms)
{
    int closed = cli_open(c, port, nv, n, body, blen, eof, ms);
    cli_end(c);
    return closed;
}

#define MKNV(n, v)                                                       \
    {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1,       \
     NGHTTP2_NV_FLAG_NONE}

static nghttp2_nv g_nv[8];

/* The headers of a well-formed call to `path` (static storage). */
static size_t std_nv(const char *path, const char *ct, const char *te,
                     const char *method)
{
    size_t n = 0;
    nghttp2_nv m = MKNV(":method", "POST");
    m.value = (uint8_t *)method;
    m.valuelen = strlen(method);
    g_nv[n++] = m;
    nghttp2_nv s = MKNV(":scheme", "http");
    g_nv[n++] = s;
    nghttp2_nv a = MKNV(":authority", "localhost");
    g_nv[n++] = a;
    nghttp2_nv p = MKNV(":path", "/");
    p.value = (uint8_t *)path;
    p.valuelen = strlen(path);
    g_nv[n++] = p;
    if (ct) {
        nghttp2_nv c = MKNV("content-type", "");
        c.value = (uint8_t *)ct;
        c.valuelen = strlen(ct);
        g_nv[n++] = c;
    }
    if (te) {
        nghttp2_nv t = MKNV("te", "");
        t.value = (uint8_t *)te;
        t.valuelen = strlen(te);
        g_nv[n++] = t;
    }
    return n;
}

static size_t frame(uint8_t *out, uint8_t flag, const char *msg, size_t len)
{
    out[0] = flag;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
    memcpy(out + 5, msg, len);
    return len + 5;
}

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
    struct fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    fx_start(fx);
    struct cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    uint8_t *buf = malloc(1 << 16);
    assert_non_null(buf);
    size_t n, blen;

    /* A well-formed echo. */
    n = std_nv("/test.Echo/Unary", "application/grpc+proto", "trailers",
               "POST");
    blen = frame(buf, 0, "hello", 5);
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->http_status, 200);
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, 10);
    assert_memory_equal(c->data, "\0\0\0\0\5hello", 10);

    /* Empty message echoes as an empty message. */
    blen = frame(buf, 0, "", 0);
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, 5);

    /* Wrong content-type -> 415. */
    n = std_nv("/test.Echo/Unary", "application/json", "trailers", "POST");
    blen = frame(buf, 0, "hello", 5);
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->http_status, 415);
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "content-type"));
    n = std_nv("/test.Echo/Unary", NULL, "trailers", "POST");
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->http_status, 415);

    /* GET -> 405. */
    n = std_nv("/test.Echo/Unary", "application/grpc", "trailers", "GET");
    assert_true(cli_call(c, fx->port, g_nv, n, NULL, 0, 1, 3000));
    assert_int_equal(c->http_status, 405);
    assert_int_equal(c->grpc_status, RT_GRPC_UNIMPLEMENTED);

    /* No te: trailers. */
    n = std_nv("/test.Echo/Unary", "application/grpc", NULL, "POST");
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->http_status, 200);
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "te: trailers"));

    /* Unknown method, trailers-only. */
    n = std_nv("/test.Echo/Nope", "application/grpc", "trailers", "POST");
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_UNIMPLEMENTED);
    assert_int_equal(c->data_len, 0);
    assert_non_null(strstr(c->grpc_msg, "/test.Echo/Nope"));

    n = std_nv("/test.Echo/Unary", "application/grpc", "trailers", "POST");
    /* Compressed flag. */
    blen = frame(buf, 1, "hello", 5);
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_UNIMPLEMENTED);
    assert_string_equal(c->grpc_msg, "compression not supported");
    /* A flag that is neither 0 nor 1. */
    blen = frame(buf, 2, "hello", 5);
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    /* Two messages. */
    blen = frame(buf, 0, "a", 1);
    blen += frame(buf + blen, 0, "b", 1);
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "exactly one"));
    /* No message at all. */
    assert_true(cli_call(c, fx->port, g_nv, n, NULL, 0, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    /* Truncated message. */
    blen = frame(buf, 0, "hello", 5) - 2;
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "inside a message"));
    /* Prefix announcing 5 MiB, the stream left open: answered at once,
     * then RST_STREAM NO_ERROR stops the upload. */
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = 0x50;
    buf[3] = 0;
    buf[4] = 0;
    assert_true(cli_call(c, fx->port, g_nv, n, buf, 5, 0, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(c->grpc_msg, "exceeds the limit"));
    assert_int_equal(c->close_code, NGHTTP2_NO_ERROR);

    /* Unary handler misuse is refused; the call still completes. */
    n = std_nv("/test.Echo/Twice", "application/grpc", "trailers", "POST");
    blen = frame(buf, 0, "x", 1);
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_int_equal(c->data_len, 8);
    /* A unary handler that finishes OK without a message. */
    n = std_nv("/test.Echo/Empty", "application/grpc", "trailers", "POST");
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INTERNAL);
    assert_int_equal(c->data_len, 0);
    assert_non_null(strstr(c->grpc_msg, "without a response message"));

    /* Headers over the limit. */
    n = std_nv("/test.Echo/Unary", "application/grpc", "trailers", "POST");
    char *big = malloc(17000);
    assert_non_null(big);
    memset(big, 'a', 16999);
    big[16999] = '\0';
    nghttp2_nv bh = MKNV("x-big", "");
    bh.value = (uint8_t *)big;
    bh.valuelen = 16999;
    g_nv[n++] = bh;
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_RESOURCE_EXHAUSTED);
    free(big);

    /* Deadlines from grpc-timeout: the server answers DEADLINE_EXCEEDED
     * and fires on_cancel with that status. */
    n = std_nv("/test.Echo/Slow", "application/grpc", "trailers", "POST");
    nghttp2_nv to = MKNV("grpc-timeout", "150m");
    g_nv[n++] = to;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long el = (t1.tv_sec - t0.tv_sec) * 1000 +
              (t1.tv_nsec - t0.tv_nsec) / 1000000;
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    assert_true(el >= 140 && el < 2000);
    assert_int_equal(atomic_load(&fx->cancel_deadline), 1);
    /* A deadline that passes before the request is complete. */
    assert_true(cli_call(c, fx->port, g_nv, n, buf, 3, 0, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(atomic_load(&fx->cancel_deadline), 1); /* no handler */
    /* Malformed grpc-timeout. */
    nghttp2_nv bad = MKNV("grpc-timeout", "soon");
    g_nv[n - 1] = bad;
    assert_true(cli_call(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, RT_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(c->grpc_msg, "grpc-timeout"));

    /* A client that vanishes mid-call: on_cancel with CANCELLED. */
    int before = atomic_load(&fx->cancels);
    n = std_nv("/test.Echo/Slow", "application/grpc", "trailers", "POST");
    cli_call(c, fx->port, g_nv, n, buf, blen, 1, 200);
    for (int i = 0; i < 200 && atomic_load(&fx->cancels) == before; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&fx->cancels), before + 1);
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);

    free(buf);
    free(c);
    fx_stop(fx);
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
    struct fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    fx_start_cfg(fx, &cfg);
    struct cli *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    uint8_t buf[64];
    size_t n = std_nv("/test.Echo/Unary", "application/grpc", "trailers",
                      "POST");
    size_t blen = frame(buf, 0, "hi", 2);
    assert_true(cli_open(c, fx->port, g_nv, n, buf, blen, 1, 3000));
    assert_int_equal(c->grpc_status, 0);
    assert_true(cli_wait_eof(c, 3000)); /* idle close */
    cli_end(c);

    n = std_nv("/test.Echo/Slow", "application/grpc", "trailers", "POST");
    assert_false(cli_open(c, fx->port, g_nv, n, buf, blen, 1, 300));
    assert_false(cli_wait_eof(c, 100)); /* a call is open: no idle close */
    assert_int_equal(atomic_load(&fx->slow_started), 1);
    assert_int_equal(atomic_load(&fx->cancels), 0);
    fx_stop(fx); /* cancels the call */
    assert_int_equal(atomic_load(&fx->cancels), 1);
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);
    assert_true(cli_wait_eof(c, 3000));
    cli_end(c);
    free(c);
    free(fx);
}

/* The grpcio client script; argv[1] is the port. Prints "FAIL: ..." and
 * exits 1 on the first failed check. */
static const char py_client[] =
    "import sys, time, socket, threading\n"
    "import concurrent.futures as cf\n"
    "import grpc\n"
    "port = int(sys.argv[1])\n"
    "addr = '127.0.0.1:%d' % port\n"
    "ch = grpc.insecure_channel(addr, options=[\n"
    "    ('grpc.max_receive_message_length', 8 << 20),\n"
    "    ('grpc.max_send_message_length', 8 << 20)])\n"
    "def uu(m): return ch.unary_unary(m)\n"
    "def us(m): return ch.unary_stream(m)\n"
    "def check(c, what):\n"
    "    if not c:\n"
    "        print('FAIL:', what, flush=True); sys.exit(1)\n"
    "def code_of(fn):\n"
    "    try:\n"
    "        fn(); return (grpc.StatusCode.OK, '')\n"
    "    except grpc.RpcError as e:\n"
    "        return (e.code(), e.details())\n"
    "def stats():\n"
    "    return [int(x) for x in uu('/test.Echo/Stats')(b'', timeout=5).split()]\n"
    "# unary round trip, trailing metadata\n"
    "r, call = uu('/test.Echo/Unary').with_call(b'\\x00hello\\xff', timeout=5)\n"
    "check(r == b'\\x00hello\\xff', 'echo')\n"
    "check(call.code() == grpc.StatusCode.OK, 'echo code')\n"
    "check(uu('/test.Echo/Unary')(b'', timeout=5) == b'', 'empty echo')\n"
    "big = bytes(range(256)) * 4096\n"
    "check(uu('/test.Echo/Unary')(big, timeout=10) == big, 'echo 1 MiB')\n"
    "lim = b'z' * (4 << 20)\n"
    "check(uu('/test.Echo/Unary')(lim, timeout=20) == lim, 'echo at limit')\n"
    "# server streaming: count, content, flow control past the window\n"
    "msgs = list(us('/test.Echo/Stream')(b'300 4096', timeout=20))\n"
    "check(len(msgs) == 300, 'stream count %d' % len(msgs))\n"
    "check(all(len(m) == 4096 and m[0] == k % 256 and m[1] == (k + 1) % 256\n"
    "          for k, m in enumerate(msgs)), 'stream content')\n"
    "check(list(us('/test.Echo/Stream')(b'0 0', timeout=5)) == [], 'empty stream')\n"
    "it = us('/test.Echo/Ticks')(b'25', timeout=10)\n"
    "got = [m for m in it]\n"
    "check(got == [b'tick %d' % i for i in range(25)], 'ticks')\n"
    "check(it.code() == grpc.StatusCode.OK, 'ticks code')\n"
    "# a stream that ends with an error after its messages\n"
    "it = us('/test.Echo/Stream')(b'3 10 9', timeout=5)\n"
    "got = []\n"
    "try:\n"
    "    for m in it: got.append(m)\n"
    "    check(False, 'stream error not raised')\n"
    "except grpc.RpcError as e:\n"
    "    check(len(got) == 3, 'messages before error')\n"
    "    check(e.code() == grpc.StatusCode.FAILED_PRECONDITION, 'stream err code')\n"
    "    check(e.details() == 'stream failed: \\u00ff 100%', 'stream err msg %r' % e.details())\n"
    "# status codes with non-ASCII messages (percent-encoded on the wire)\n"
    "msg = 'bad input: \\u00fcn\\u00efc\\u00f6d\\u00e9 100% \\u2713 done'\n"
    "c, d = code_of(lambda: uu('/test.Echo/Fail')(msg.encode(), timeout=5))\n"
    "check(c == grpc.StatusCode.INVALID_ARGUMENT, 'fail code %s' % c)\n"
    "check(d == msg, 'fail message %r' % d)\n"
    "c, d = code_of(lambda: uu('/test.Echo/Nope')(b'x', timeout=5))\n"
    "check(c == grpc.StatusCode.UNIMPLEMENTED, 'unknown method %s' % c)\n"
    "check('/test.Echo/Nope' in d, 'unknown method msg')\n"
    "c, d = code_of(lambda: uu('/nope.Svc/X')(b'x', timeout=5))\n"
    "check(c == grpc.StatusCode.UNIMPLEMENTED, 'unknown service')\n"
    "c, d = code_of(lambda: uu('/test.Echo/Unary')(b'y' * (5 << 20), timeout=20))\n"
    "check(c == grpc.StatusCode.RESOURCE_EXHAUSTED, 'oversized %s %s' % (c, d))\n"
    "c, d = code_of(lambda: uu('/test.Echo/Unary')(b'y' * ((4 << 20) + 1), timeout=20))\n"
    "check(c == grpc.StatusCode.RESOURCE_EXHAUSTED, 'limit + 1')\n"
    "check(uu('/test.Echo/Unary')(b'still ok', timeout=5) == b'still ok', 'after errors')\n"
    "# client cancel reaches the server's on_cancel\n"
    "s0 = stats()\n"
    "f = uu('/test.Echo/Slow').future(b'x')\n"
    "for i in range(200):\n"
    "    if stats()[3] > s0[3]: break\n"
    "    time.sleep(0.01)\n"
    "f.cancel()\n"
    "for i in range(200):\n"
    "    s1 = stats()\n"
    "    if s1[0] > s0[0]: break\n"
    "    time.sleep(0.01)\n"
    "check(s1[0] == s0[0] + 1 and s1[1] == s0[1], 'cancel counted %s %s' % (s0, s1))\n"
    "# cancel of a stream in the middle\n"
    "it = us('/test.Echo/Ticks')(b'100000', timeout=30)\n"
    "check(next(it) == b'tick 0', 'first tick')\n"
    "it.cancel()\n"
    "for i in range(200):\n"
    "    s2 = stats()\n"
    "    if s2[0] > s1[0]: break\n"
    "    time.sleep(0.01)\n"
    "check(s2[0] == s1[0] + 1, 'stream cancel counted')\n"
    "# deadlines\n"
    "t0 = time.time()\n"
    "c, d = code_of(lambda: uu('/test.Echo/Slow')(b'x', timeout=0.3))\n"
    "check(c == grpc.StatusCode.DEADLINE_EXCEEDED, 'deadline %s' % c)\n"
    "check(time.time() - t0 < 3, 'deadline took long')\n"
    "for i in range(200):\n"
    "    s3 = stats()\n"
    "    if s3[0] > s2[0]: break\n"
    "    time.sleep(0.01)\n"
    "check(s3[0] == s2[0] + 1, 'deadline cancel counted')\n"
    "# a handle without on_cancel turns into a zombie\n"
    "f = uu('/test.Echo/Keep').future(b'k')\n"
    "for i in range(200):\n"
    "    if stats()[5] == 1: break\n"
    "    time.sleep(0.01)\n"
    "f.cancel()\n"
    "time.sleep(0.2)\n"
    "check(uu('/test.Echo/Release')(b'', timeout=5) == b'1/1', 'zombie finish')\n"
    "# 20 concurrent streams on one connection\n"
    "def one(i):\n"
    "    n = 10 + i\n"
    "    got = list(us('/test.Echo/Ticks')(str(n).encode(), timeout=30))\n"
    "    return got == [b'tick %d' % k for k in range(n)]\n"
    "with cf.ThreadPoolExecutor(20) as ex:\n"
    "    res = list(ex.map(one, range(20)))\n"
    "check(all(res), 'concurrent streams %s' % res)\n"
    "# health\n"
    "def hreq(s):\n"
    "    b = s.encode()\n"
    "    return (b'\\x0a' + bytes([len(b)]) + b) if b else b''\n"
    "hc = uu('/grpc.health.v1.Health/Check')\n"
    "check(hc(hreq(''), timeout=5) == b'\\x08\\x01', 'health overall')\n"
    "check(hc(hreq('tangram.v1.Generation'), timeout=5) == b'\\x08\\x01', 'serving')\n"
    "uu('/test.Echo/SetServing')(b'0', timeout=5)\n"
    "check(hc(hreq('tangram.v1.Generation'), timeout=5) == b'\\x08\\x02', 'not serving')\n"
    "uu('/test.Echo/SetServing')(b'1', timeout=5)\n"
    "c, d = code_of(lambda: hc(hreq('no.such.Service'), timeout=5))\n"
    "check(c == grpc.StatusCode.NOT_FOUND, 'health unknown %s' % c)\n"
    "c, d = code_of(lambda: hc(b'\\xff\\xff\\xff', timeout=5))\n"
    "check(c == grpc.StatusCode.INVALID_ARGUMENT, 'health garbage %s' % c)\n"
    "it = us('/grpc.health.v1.Health/Watch')(hreq(''), timeout=5)\n"
    "c, d = code_of(lambda: list(it))\n"
    "check(c == grpc.StatusCode.UNIMPLEMENTED, 'watch %s' % c)\n"
    "# garbage on a socket closes that connection only\n"
    "it = us('/test.Echo/Ticks')(b'60', timeout=30)\n"
    "check(next(it) == b'tick 0', 'tick before garbage')\n"
    "sk = socket.create_connection(('127.0.0.1', port))\n"
    "sk.settimeout(5)\n"
    "sk.sendall(b'GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n' + bytes(range(256)) * 8)\n"
    "closed = False\n"
    "try:\n"
    "    while True:\n"
    "        b = sk.recv(4096)\n"
    "        if not b: closed = True; break\n"
    "except ConnectionResetError:\n"
    "    closed = True\n"
    "check(closed, 'garbage connection closed')\n"
    "sk.close()\n"
    "rest = list(it)\n"
    "check(len(rest) == 59 and it.code() == grpc.StatusCode.OK, 'stream survived garbage')\n"
    "check(uu('/test.Echo/Unary')(b'after', timeout=5) == b'after', 'echo after garbage')\n"
    "s4 = stats()\n"
    "check(s4[2] == 0, 'bad cancel statuses %s' % s4)\n"
    "ch.close()\n"
    "print('ok', flush=True)\n";

static int grpcio_available(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) {
            dup2(dn, 1);
            dup2(dn, 2);
        }
        execl("/usr/bin/python3", "python3", "-c", "import grpc", (char *)0);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int g_have_grpcio = -1;

static void test_python_grpcio(void **state)
{
    (void)state;
    if (!g_have_grpcio) {
        skip();
        return;
    }
    struct fx *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    fx_start(fx);
    char port[16];
    snprintf(port, sizeof(port), "%d", fx->port);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/usr/bin/python3", "python3", "-c", py_client, port,
              (char *)0);
        _exit(127);
    }
    int st = 0, waited = 0;
    for (int i = 0; i < 1200; i++) { /* 120 s at most */
        if (waitpid(pid, &st, WNOHANG) == pid) {
            waited = 1;
            break;
        }
        usleep(100000);
    }
    if (!waited) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    assert_true(waited);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    /* Every connection of the client is gone once it exited. */
    for (int i = 0; i < 300 && fx->srv.n_conns; i++)
        usleep(10000);
    assert_int_equal(fx->srv.n_conns, 0);
    assert_int_equal(atomic_load(&fx->cancel_bad), 0);
    fx_stop(fx);
    free(fx);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    g_have_grpcio = grpcio_available();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout_parse),
        cmocka_unit_test(test_message_encode),
        cmocka_unit_test(test_config_and_misuse),
        cmocka_unit_test(test_raw_protocol),
        cmocka_unit_test(test_idle_and_close),
        cmocka_unit_test(test_python_grpcio),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed)
        return failed;
    if (!g_have_grpcio) {
        fprintf(stderr, "test_grpc: python3-grpcio missing, gRPC client "
                        "checks skipped\n");
        return 77;
    }
    return 0;
}
