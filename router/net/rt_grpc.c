/*
 * rt_grpc.c — gRPC server on libuv + nghttp2 (see rt_grpc.h):
 * the server, connections and the nghttp2 callbacks; calls, framing and
 * responses are in rt_grpc_call.c (re-entrancy rules in
 * rt_grpc_internal.h).
 *
 * Each connection owns one nghttp2 server session fed through the memory
 * API: bytes read go to nghttp2_session_mem_recv(), bytes it wants to send
 * come from nghttp2_session_mem_send() and are copied into uv_write()
 * requests. Writing stops while more than WRITE_HIGH bytes wait in the
 * socket's queue and resumes when writes complete, so a client that does
 * not read holds at most that much plus what flow control lets through.
 * The connection ends when nghttp2 wants neither to read nor to write
 * (GOAWAY exchanged, fatal protocol error) or the client goes away; input
 * that is not HTTP/2 makes nghttp2_session_mem_recv() fail (bad client
 * magic), which closes that connection only.
 *
 * Server close is graceful: every call still open gets a final status,
 * each connection a GOAWAY, and a connection closes once nghttp2 has
 * nothing left to say (its streams closed) or close_linger_ms passed. The
 * server's own handles (flush idle, timers) stay open until the
 * connection set closed, after the last connection was released to it
 * (router/net/rt_conn.h), because writing those last responses needs
 * them.
 */
#include "router/net/rt_grpc_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

#define WRITE_HIGH (256u * 1024u)

void rt_grpc_config_default(struct rt_grpc_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_message_bytes = 4u << 20;
    cfg->max_concurrent_streams = 100;
    cfg->window_bytes = 1u << 20;
    cfg->max_header_bytes = 16384;
    cfg->idle_timeout_ms = 300000;
    cfg->recv_timeout_ms = 30000;
    cfg->close_linger_ms = 1000;
    cfg->backlog = 511;
    cfg->max_connections = 1024;
    cfg->max_connections_per_ip = 64;
    cfg->probe_reserve = 16;
    cfg->probe_per_ip = 4;
}

/* ---- connections ------------------------------------------------------- */

static void conn_flush(struct rt_grpc_conn *conn);

void rt_grpc__event(struct rt_grpc_server *srv, int event)
{
    if (srv->on_event)
        srv->on_event(event, srv->event_ud);
}

void rt_grpc__conn_touch(struct rt_grpc_conn *conn)
{
    rt_conn_touch(&conn->base);
}

/* Tells the connection set whether a call of the connection is in a
 * handler's hands (busy) or not (idle). */
static void conn_recheck(struct rt_grpc_conn *conn)
{
    int busy = 0;
    for (struct rt_grpc_call *k = conn->calls; k && !busy; k = k->next)
        busy = rt_grpc__call_in_progress(k);
    rt_conn_state_set(&conn->base, busy ? RT_CONN_BUSY : RT_CONN_IDLE);
}

void rt_grpc__ready_push(struct rt_grpc_call *call)
{
    struct rt_grpc_conn *conn = call->conn;
    if (call->on_ready || !conn || conn->closing)
        return;
    call->on_ready = 1;
    call->next_ready = NULL;
    if (conn->ready_tail)
        conn->ready_tail->next_ready = call;
    else
        conn->ready = call;
    conn->ready_tail = call;
}

static void ready_clear(struct rt_grpc_conn *conn)
{
    for (struct rt_grpc_call *c = conn->ready, *n; c; c = n) {
        n = c->next_ready;
        c->on_ready = 0;
        c->next_ready = NULL;
    }
    conn->ready = conn->ready_tail = NULL;
}

static void srv_handle_closed(struct rt_grpc_server *srv)
{
    srv->live_handles--;
    if (srv->closing && srv->live_handles == 0 && srv->on_closed) {
        rt_grpc_closed_fn cb = srv->on_closed;
        srv->on_closed = NULL;
        cb(srv->on_closed_ud);
    }
}

static void on_flush_idle(uv_idle_t *h)
{
    struct rt_grpc_server *srv = h->data;
    while (srv->flush) {
        struct rt_grpc_conn *c = srv->flush;
        srv->flush = c->next_flush;
        c->in_flush = 0;
        conn_flush(c);
    }
    uv_idle_stop(h);
}

void rt_grpc__conn_flush_later(struct rt_grpc_conn *conn)
{
    struct rt_grpc_server *srv = conn->srv;
    if (conn->in_flush || conn->closing)
        return;
    conn->in_flush = 1;
    conn->next_flush = srv->flush;
    srv->flush = conn;
    uv_idle_start(&srv->flush_idle, on_flush_idle);
}

static void on_srv_handle_closed(uv_handle_t *h)
{
    srv_handle_closed(h->data);
}

/* Closes the server's own handles once no connection needs them. */
static void srv_close_handles(struct rt_grpc_server *srv)
{
    if (srv->handles_closing)
        return;
    srv->handles_closing = 1;
    uv_close((uv_handle_t *)&srv->flush_idle, on_srv_handle_closed);
    uv_close((uv_handle_t *)&srv->deadline_timer, on_srv_handle_closed);
    uv_close((uv_handle_t *)&srv->health_timer, on_srv_handle_closed);
}

/* The set closed and every connection was released. */
static void on_set_closed(struct rt_conn_set *set)
{
    srv_close_handles(set->ud);
    srv_handle_closed(set->ud);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    struct rt_grpc_conn *conn = h->data;
    if (--conn->handles_open > 0)
        return;
    struct rt_grpc_server *srv = conn->srv;
    nghttp2_session_del(conn->ng);
    conn->ng = NULL;
    rt_grpc__event(srv, RT_GRPC_EVENT_CONN_CLOSE);
    rt_conn_release(&conn->base);
    free(conn);
}

void rt_grpc__conn_close(struct rt_grpc_conn *conn)
{
    if (conn->closing)
        return;
    conn->closing = 1;
    rt_conn_leave(&conn->base);
    struct rt_grpc_server *srv = conn->srv;
    if (conn->in_flush) {
        for (struct rt_grpc_conn **pp = &srv->flush; *pp;
             pp = &(*pp)->next_flush) {
            if (*pp == conn) {
                *pp = conn->next_flush;
                break;
            }
        }
        conn->in_flush = 0;
    }
    ready_clear(conn);
    /* Each call leaves the list before its cancel callback runs, so user
     * code in the callback sees consistent lists. */
    while (conn->calls) {
        struct rt_grpc_call *call = conn->calls;
        if (conn->ng)
            nghttp2_session_set_stream_user_data(conn->ng, call->stream_id,
                                                 NULL);
        rt_grpc__call_stream_gone(call);
    }
    uv_read_stop((uv_stream_t *)&conn->base.tcp);
    uv_close((uv_handle_t *)&conn->linger, on_conn_handle_closed);
    uv_close((uv_handle_t *)&conn->base.tcp, on_conn_handle_closed);
}

static void on_shutdown(uv_shutdown_t *sr, int status)
{
    (void)status;
    rt_grpc__conn_close(sr->data);
}

/* Ends the connection after the queued writes. */
static void conn_finish(struct rt_grpc_conn *conn)
{
    if (conn->closing || conn->finishing)
        return;
    conn->finishing = 1;
    conn->shutdown_req.data = conn;
    if (uv_shutdown(&conn->shutdown_req, (uv_stream_t *)&conn->base.tcp,
                    on_shutdown) < 0)
        rt_grpc__conn_close(conn);
}

struct wreq {
    uv_write_t w;
    struct rt_grpc_conn *conn;
    char data[];
};

static void on_write(uv_write_t *w, int status)
{
    struct wreq *wr = (struct wreq *)w;
    struct rt_grpc_conn *conn = wr->conn;
    free(wr);
    if (conn->closing)
        return;
    if (status < 0) {
        rt_grpc__conn_close(conn);
        return;
    }
    if (conn->write_blocked &&
        uv_stream_get_write_queue_size((uv_stream_t *)&conn->base.tcp) <
            WRITE_HIGH / 2) {
        conn->write_blocked = 0;
        conn_flush(conn);
    }
}

/* Moves what nghttp2 wants to send into the socket's write queue. */
static void conn_flush(struct rt_grpc_conn *conn)
{
    if (conn->closing || conn->finishing)
        return;
    if (conn->in_ng) {
        rt_grpc__conn_flush_later(conn);
        return;
    }
    /* Every change of a call's state ends in a flush: the place to tell
     * the connection set. */
    conn_recheck(conn);
    for (;;) {
        if (uv_stream_get_write_queue_size((uv_stream_t *)&conn->base.tcp) >=
            WRITE_HIGH) {
            conn->write_blocked = 1;
            return;
        }
        const uint8_t *data;
        conn->in_ng++;
        ssize_t n = nghttp2_session_mem_send(conn->ng, &data);
        conn->in_ng--;
        if (conn->closing)
            return;
        if (n < 0) {
            rt_grpc__conn_close(conn);
            return;
        }
        if (n == 0)
            break;
        struct wreq *wr = malloc(sizeof(*wr) + (size_t)n);
        if (!wr) {
            rt_grpc__conn_close(conn);
            return;
        }
        wr->conn = conn;
        memcpy(wr->data, data, (size_t)n);
        uv_buf_t buf = uv_buf_init(wr->data, (unsigned)n);
        if (uv_write(&wr->w, (uv_stream_t *)&conn->base.tcp, &buf, 1,
                     on_write) < 0) {
            free(wr);
            rt_grpc__conn_close(conn);
            return;
        }
    }
    if (!nghttp2_session_want_read(conn->ng) &&
        !nghttp2_session_want_write(conn->ng))
        conn_finish(conn);
}

/* Runs the handlers of calls that completed during the last read, and
 * delivers the input of bidirectional calls. */
static void conn_dispatch(struct rt_grpc_conn *conn)
{
    while (!conn->closing && conn->ready) {
        struct rt_grpc_call *call = conn->ready;
        conn->ready = call->next_ready;
        if (!conn->ready)
            conn->ready_tail = NULL;
        call->next_ready = NULL;
        call->on_ready = 0;
        rt_grpc__call_dispatch(call);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct rt_grpc_conn *conn = h->data;
    *buf = uv_buf_init(conn->rbuf, sizeof(conn->rbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct rt_grpc_conn *conn = s->data;
    (void)buf;
    if (conn->closing || nread == 0)
        return;
    if (nread < 0) {
        /* EOF or error: the client is gone; calls in flight are
         * cancelled (an HTTP/2 client never half-closes the TCP
         * connection while it expects answers). */
        rt_grpc__conn_close(conn);
        return;
    }
    conn->in_ng++;
    ssize_t rv = nghttp2_session_mem_recv(conn->ng, (const uint8_t *)conn->rbuf,
                                          (size_t)nread);
    conn->in_ng--;
    if (conn->closing)
        return;
    if (rv < 0) {
        /* Not HTTP/2 at all (bad preface) or a fatal session error. */
        rt_grpc__conn_close(conn);
        return;
    }
    conn_dispatch(conn);
    conn_flush(conn);
}

/* ---- nghttp2 callbacks ------------------------------------------------ */

static struct rt_grpc_call *stream_call(struct rt_grpc_conn *conn,
                                        int32_t sid)
{
    return nghttp2_session_get_stream_user_data(conn->ng, sid);
}

static int cb_begin_headers(nghttp2_session *s, const nghttp2_frame *frame,
                            void *ud)
{
    struct rt_grpc_conn *conn = ud;
    (void)s;
    if (conn->closing)
        return 0;
    if (frame->hd.type != NGHTTP2_HEADERS ||
        frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct rt_grpc_call *call = rt_grpc__call_new(conn, frame->hd.stream_id);
    if (!call)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* resets the stream */
    nghttp2_session_set_stream_user_data(conn->ng, frame->hd.stream_id,
                                         call);
    return 0;
}

static int cb_header(nghttp2_session *s, const nghttp2_frame *frame,
                     const uint8_t *name, size_t nlen, const uint8_t *value,
                     size_t vlen, uint8_t flags, void *ud)
{
    struct rt_grpc_conn *conn = ud;
    (void)s;
    (void)flags;
    if (conn->closing || frame->hd.type != NGHTTP2_HEADERS ||
        frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* request trailers carry nothing gRPC needs */
    struct rt_grpc_call *call = stream_call(conn, frame->hd.stream_id);
    if (call)
        rt_grpc__call_header(call, name, nlen, value, vlen);
    return 0;
}

static int cb_frame_recv(nghttp2_session *s, const nghttp2_frame *frame,
                         void *ud)
{
    struct rt_grpc_conn *conn = ud;
    (void)s;
    if (conn->closing)
        return 0;
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    struct rt_grpc_call *call = stream_call(conn, frame->hd.stream_id);
    if (!call)
        return 0;
    if (frame->hd.type == NGHTTP2_HEADERS &&
        frame->headers.cat == NGHTTP2_HCAT_REQUEST)
        rt_grpc__call_headers_done(call);
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
        rt_grpc__call_end_stream(call);
    return 0;
}

static int cb_data_chunk(nghttp2_session *s, uint8_t flags, int32_t sid,
                         const uint8_t *data, size_t len, void *ud)
{
    struct rt_grpc_conn *conn = ud;
    (void)s;
    (void)flags;
    if (conn->closing)
        return 0;
    struct rt_grpc_call *call = stream_call(conn, sid);
    if (call)
        rt_grpc__call_data(call, data, len);
    return 0;
}

static int cb_frame_send(nghttp2_session *s, const nghttp2_frame *frame,
                         void *ud)
{
    struct rt_grpc_conn *conn = ud;
    (void)s;
    if (conn->closing || frame->hd.stream_id == 0)
        return 0;
    /* nghttp2 refuses streams over SETTINGS_MAX_CONCURRENT_STREAMS itself,
     * before any callback of ours saw them. */
    if (frame->hd.type == NGHTTP2_RST_STREAM &&
        frame->rst_stream.error_code == NGHTTP2_REFUSED_STREAM)
        rt_grpc__event(conn->srv, RT_GRPC_EVENT_REFUSED_STREAM);
    struct rt_grpc_call *call = stream_call(conn, frame->hd.stream_id);
    /* Response data of a call a handler took is activity (idle limit). */
    if (call && call->state == CS_DISPATCHED &&
        (frame->hd.type == NGHTTP2_DATA || frame->hd.type == NGHTTP2_HEADERS))
        rt_grpc__conn_touch(conn);
    if (call)
        rt_grpc__call_frame_sent(call, frame);
    return 0;
}

static int cb_stream_close(nghttp2_session *s, int32_t sid,
                           uint32_t error_code, void *ud)
{
    struct rt_grpc_conn *conn = ud;
    (void)s;
    (void)error_code;
    if (conn->closing)
        return 0;
    struct rt_grpc_call *call = stream_call(conn, sid);
    if (!call)
        return 0;
    nghttp2_session_set_stream_user_data(conn->ng, sid, NULL);
    rt_grpc__call_stream_gone(call);
    return 0;
}

/* ---- accepting --------------------------------------------------------- */

static int conn_session_new(struct rt_grpc_conn *conn)
{
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return TG_ENOMEM;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs,
                                                            cb_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, cb_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, cb_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs,
                                                              cb_data_chunk);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, cb_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs,
                                                           cb_stream_close);
    int rv = nghttp2_session_server_new(&conn->ng, cbs, conn);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0)
        return TG_ENOMEM;
    const struct rt_grpc_config *cfg = &conn->srv->cfg;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, cfg->max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, cfg->window_bytes},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
         (uint32_t)(cfg->max_header_bytes + 4096)},
    };
    if (nghttp2_submit_settings(conn->ng, NGHTTP2_FLAG_NONE, iv,
                                sizeof(iv) / sizeof(iv[0])) != 0)
        return TG_ENOMEM;
    /* The connection window is not a setting (RFC 9113 §6.9.2). */
    if (nghttp2_session_set_local_window_size(conn->ng, NGHTTP2_FLAG_NONE, 0,
                                              (int32_t)cfg->window_bytes) != 0)
        return TG_ENOMEM;
    return 0;
}

/* ---- the connection set's side ---------------------------------------- */

static struct rt_grpc_conn *conn_of(struct rt_conn *c)
{
    return (struct rt_grpc_conn *)c;
}

/* A connection of srv with its handles initialised, linked into srv. */
static struct rt_conn *set_create(struct rt_conn_set *set)
{
    struct rt_grpc_server *srv = set->ud;
    struct rt_grpc_conn *conn = calloc(1, sizeof(*conn));
    if (!conn)
        return NULL;
    conn->srv = srv;
    uv_tcp_init(srv->loop, &conn->base.tcp);
    uv_timer_init(srv->loop, &conn->linger);
    conn->base.tcp.data = conn;
    conn->linger.data = conn;
    conn->handles_open = 2;
    conn->id = ++srv->next_conn_id;
    rt_grpc__event(srv, RT_GRPC_EVENT_CONN_OPEN);
    return &conn->base;
}

/* Starts the HTTP/2 session of an admitted connection, and reading. */
static void set_start(struct rt_conn *c)
{
    struct rt_grpc_conn *conn = conn_of(c);
    if (conn_session_new(conn) != 0) {
        rt_grpc__conn_close(conn);
        return;
    }
    rt_conn_state_set(&conn->base, RT_CONN_IDLE);
    uv_tcp_nodelay(&conn->base.tcp, 1);
    if (uv_read_start((uv_stream_t *)&conn->base.tcp, on_alloc, on_read) !=
        0) {
        rt_grpc__conn_close(conn);
        return;
    }
    conn_flush(conn); /* our SETTINGS */
}

/* The server's connection preface (an empty SETTINGS frame) and a GOAWAY
 * ENHANCE_YOUR_CALM with last stream 0 and `debug` (RFC 9113 §4.1, §6.5,
 * §6.8), written without a session: a refused client learns why, sees
 * UNAVAILABLE and backs off. */
static void refuse_goaway(struct rt_grpc_conn *conn, const char *debug)
{
    uint8_t b[9 + 9 + 8 + 64];
    size_t dl = strlen(debug);
    if (dl > 64)
        dl = 64;
    size_t gl = 8 + dl;
    memset(b, 0, sizeof(b));
    b[3] = NGHTTP2_SETTINGS;
    b[9] = (uint8_t)(gl >> 16);
    b[10] = (uint8_t)(gl >> 8);
    b[11] = (uint8_t)gl;
    b[12] = NGHTTP2_GOAWAY;
    b[25] = NGHTTP2_ENHANCE_YOUR_CALM; /* last stream id 0, then the code */
    memcpy(b + 26, debug, dl);
    uv_buf_t buf = uv_buf_init((char *)b, (unsigned)(26 + dl));
    uv_try_write((uv_stream_t *)&conn->base.tcp, &buf, 1);
}

static void set_refuse(struct rt_conn *c, int why)
{
    struct rt_grpc_conn *conn = conn_of(c);
    if (why == RT_CONN_REFUSE_MAX)
        refuse_goaway(conn, "connection limit");
    else if (why == RT_CONN_REFUSE_PER_IP)
        refuse_goaway(conn, "connection limit of this address");
    rt_grpc__conn_close(conn);
}

static void on_linger(uv_timer_t *t)
{
    rt_grpc__conn_close(t->data);
}

static void set_evict(struct rt_conn *c, int why)
{
    struct rt_grpc_conn *conn = conn_of(c);
    if (why == RT_CONN_EVICT_NO_FD || !conn->ng) {
        rt_grpc__conn_close(conn);
        return;
    }
    if (why == RT_CONN_EVICT_IDLE_TIMEOUT)
        rt_grpc__event(conn->srv, RT_GRPC_EVENT_IDLE_CLOSE);
    /* A graceful end: GOAWAY, then the connection closes once it is sent
     * (conn_flush), or at the linger bound when the client does not
     * read. */
    nghttp2_session_terminate_session(conn->ng, NGHTTP2_NO_ERROR);
    uv_timer_start(&conn->linger, on_linger, conn->srv->cfg.close_linger_ms,
                   0);
    conn_flush(conn);
}

static void conn_drain(struct rt_grpc_conn *conn);

/* The server closes: every call gets its final status, then GOAWAY. */
static void set_close(struct rt_conn *c)
{
    conn_drain(conn_of(c));
}

static const struct rt_conn_ops conn_ops = {
    .create = set_create,
    .start = set_start,
    .refuse = set_refuse,
    .evict = set_evict,
    .close = set_close,
};

int rt_grpc_server_adopt(struct rt_grpc_server *srv, int fd)
{
    return srv->initialized ? rt_conn_set_adopt(&srv->set, fd) : TG_EINVAL;
}

/* ---- server ------------------------------------------------------------ */

int rt_grpc_server_init(struct rt_grpc_server *srv, uv_loop_t *loop,
                        const struct rt_grpc_config *cfg, char *err,
                        size_t errlen)
{
    memset(srv, 0, sizeof(*srv));
    if (cfg)
        srv->cfg = *cfg;
    else
        rt_grpc_config_default(&srv->cfg);
    const struct rt_grpc_config *c = &srv->cfg;
    if (c->max_message_bytes < 16 || c->max_message_bytes > UINT32_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "max_message_bytes %zu out of range 16..2^32-1",
                          c->max_message_bytes);
    if (c->max_concurrent_streams < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "max_concurrent_streams must be at least 1");
    if (c->window_bytes < 65535 || c->window_bytes > INT32_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "window_bytes %u out of range 65535..2^31-1",
                          c->window_bytes);
    if (c->max_header_bytes < 256 || c->max_header_bytes > (1u << 20))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "max_header_bytes %zu out of range 256..1 MiB",
                          c->max_header_bytes);
    if (c->recv_timeout_ms < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "recv_timeout_ms must be at least 1");
    if (c->backlog <= 0)
        srv->cfg.backlog = 511;
    srv->loop = loop;
    struct rt_conn_config cc = {
        .max_connections = c->max_connections,
        .max_connections_per_ip = c->max_connections_per_ip,
        .idle_timeout_ms = c->idle_timeout_ms,
        .probe_reserve = c->probe_reserve,
        .probe_per_ip = c->probe_per_ip,
        .backlog = srv->cfg.backlog,
    };
    rt_conn_set_init(&srv->set, loop, &cc, &conn_ops, srv, "gRPC");
    uv_idle_init(loop, &srv->flush_idle);
    uv_timer_init(loop, &srv->deadline_timer);
    uv_timer_init(loop, &srv->health_timer);
    srv->flush_idle.data = srv;
    srv->deadline_timer.data = srv;
    srv->health_timer.data = srv;
    srv->live_handles = 4;
    srv->initialized = 1;
    return 0;
}

int rt_grpc_method_add(struct rt_grpc_server *srv, const char *path,
                       enum rt_grpc_kind kind, rt_grpc_handler_fn handler,
                       void *ud, char *err, size_t errlen)
{
    const char *slash = path && path[0] == '/' ? strchr(path + 1, '/') : NULL;
    if (!slash || slash == path + 1 || slash[1] == '\0' ||
        strchr(slash + 1, '/'))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "method path '%s' is not /service/method",
                          path ? path : "(null)");
    if (kind != RT_GRPC_UNARY && kind != RT_GRPC_SERVER_STREAM &&
        kind != RT_GRPC_BIDI_STREAM)
        return tg_err_set(err, errlen, TG_EINVAL, "unknown method kind %d",
                          (int)kind);
    if (!handler)
        return tg_err_set(err, errlen, TG_EINVAL, "NULL handler for %s",
                          path);
    for (size_t i = 0; i < srv->n_methods; i++)
        if (strcmp(srv->methods[i].path, path) == 0)
            return tg_err_set(err, errlen, TG_EEXIST,
                              "method %s added twice", path);
    if (TG_GROW(srv->methods, &srv->cap_methods, srv->n_methods + 1))
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    char *p = strdup(path);
    if (!p)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    struct rt_grpc_method *m = &srv->methods[srv->n_methods++];
    m->path = p;
    m->kind = kind;
    m->handler = handler;
    m->ud = ud;
    return 0;
}

int rt_grpc_server_listen(struct rt_grpc_server *srv, const char *host,
                          int port, char *err, size_t errlen)
{
    if (!srv->initialized)
        return tg_err_set(err, errlen, TG_EINVAL, "gRPC: not initialised");
    return rt_conn_set_listen(&srv->set, host, port, err, errlen);
}

void rt_grpc_server_on_admit(struct rt_grpc_server *srv, rt_grpc_admit_fn fn,
                             void *ud)
{
    srv->admit = fn;
    srv->admit_ud = ud;
}

void rt_grpc_server_on_event(struct rt_grpc_server *srv, rt_grpc_event_fn fn,
                             void *ud)
{
    srv->on_event = fn;
    srv->event_ud = ud;
}

/* Server close, one connection: every call gets a final status, then
 * GOAWAY; the connection closes once nghttp2 is done (conn_flush) or at
 * the linger limit. */
static void conn_drain(struct rt_grpc_conn *conn)
{
    static const char bye[] = "the server is shutting down";
    if (conn->closing || conn->draining)
        return;
    conn->draining = 1;
    ready_clear(conn);
    /* A failed call stays linked but no longer matches, and a cancel
     * callback may change the list: rescan from the start after each. */
    int again = 1;
    while (again && !conn->closing) {
        again = 0;
        for (struct rt_grpc_call *k = conn->calls; k; k = k->next) {
            int waiting = k->headers_done && !k->finishing &&
                          (k->state == CS_RECV || k->state == CS_READY);
            if (waiting || rt_grpc__call_in_progress(k)) {
                rt_grpc__call_fail(k, RT_GRPC_CANCELLED,
                                   RT_GRPC_UNAVAILABLE, bye);
                again = 1;
                break;
            }
        }
    }
    if (conn->closing)
        return;
    nghttp2_submit_goaway(conn->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(conn->ng),
                          NGHTTP2_NO_ERROR, NULL, 0);
    uv_timer_stop(&conn->linger);
    uv_timer_start(&conn->linger, on_linger, conn->srv->cfg.close_linger_ms,
                   0);
    conn_flush(conn);
}

void rt_grpc_server_close(struct rt_grpc_server *srv,
                          rt_grpc_closed_fn on_closed, void *ud)
{
    if (!srv->initialized || srv->closing)
        return;
    srv->closing = 1;
    srv->on_closed = on_closed;
    srv->on_closed_ud = ud;
    /* Watch streams first, so their last state goes out with the rest. */
    if (srv->health)
        rt_grpc__health_close(srv);
    /* Drains every connection too (conn_ops.close); the server's own
     * handles close once the last connection was released
     * (on_set_closed). */
    rt_conn_set_close(&srv->set, on_set_closed);
}

void rt_grpc_server_free(struct rt_grpc_server *srv)
{
    if (srv->initialized)
        TG_ASSERT(srv->live_handles == 0);
    while (srv->zombies) {
        struct rt_grpc_call *z = srv->zombies;
        srv->zombies = z->next;
        rt_grpc__call_free(z);
    }
    for (size_t i = 0; i < srv->n_methods; i++)
        free(srv->methods[i].path);
    free(srv->methods);
    rt_grpc__health_free(srv->health);
    rt_grpc__reflect_free(srv->reflection);
    memset(srv, 0, sizeof(*srv));
}
