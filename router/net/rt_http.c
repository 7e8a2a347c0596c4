/*
 * rt_http.c — HTTP/1.1 server on libuv + http-parser (see rt_http.h):
 * connections and their limits, timers, dispatch and the server; parsing
 * is in rt_http_parse.c, responses in rt_http_resp.c, the server object
 * (init, routes, listen, close) in rt_http_server.c.
 *
 * One connection serves one request at a time. Incoming bytes are appended
 * to the connection's pending buffer and fed to http-parser; the parser is
 * paused in on_message_complete so that exactly one request is parsed, then
 * that request is dispatched. Parsing resumes only when its response is
 * complete — inside the dispatch loop when the handler answered at once, or
 * from an idle callback when it answered later (so the next handler never
 * runs on the stack of the caller that finished the previous response).
 * Responses therefore leave in request order (RFC 9112 §9.3.2).
 *
 * Closing is graceful when the server decides to end the connection (an
 * error response, "Connection: close", an HTTP/1.0 stream): the response is
 * flushed, the write side is shut down (FIN), and input is read and thrown
 * away for linger_ms — closing with unread input would make the kernel send
 * a reset that can destroy the response before the client reads it (the
 * "lingering close" of RFC 9112 §9.6).
 *
 * One timer per connection, in one mode at a time (TM_* in
 * rt_http_internal.h): head deadline, body deadline, send progress,
 * flush, linger. The listener, the list of connections, the connection
 * limits and the idle deadline are the connection set's
 * (router/net/rt_conn.h): each connection tells it what it is doing — idle
 * (no request, or lingering), a head arriving (with its bytes so far), or
 * busy — and the set evicts, and closes them all with the server, through
 * rt_http__conn_ops; a connection is released to it when its handles are
 * closed.
 */
#include "router/net/rt_http_internal.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "common/base/tg_err.h"

/* ---- connection lists -------------------------------------------------- */

static void conn_close(struct rt_http_conn *conn);
static void conn_close_how(struct rt_http_conn *conn, int reset);
static void conn_state(struct rt_http_conn *conn, int state);
static void conn_process(struct rt_http_conn *conn);
static void conn_arm_timer(struct rt_http_conn *conn);
static void read_start(struct rt_http_conn *conn);

/* The peer list: half-closed connections with a request in flight, whose
 * socket is checked for a reset (rt_http.h, "Half-close"). */
static void on_peer_timer(uv_timer_t *t);

static void peers_add(struct rt_http_conn *conn)
{
    struct rt_http_server *srv = conn->srv;
    if (conn->in_peers)
        return;
    conn->in_peers = 1;
    conn->next_peer = srv->peers;
    srv->peers = conn;
    if (!uv_is_active((uv_handle_t *)&srv->peer_timer))
        uv_timer_start(&srv->peer_timer, on_peer_timer, 20, 250);
}

static void peers_remove(struct rt_http_conn *conn)
{
    if (!conn->in_peers)
        return;
    conn->in_peers = 0;
    for (struct rt_http_conn **pp = &conn->srv->peers; *pp;
         pp = &(*pp)->next_peer) {
        if (*pp == conn) {
            *pp = conn->next_peer;
            break;
        }
    }
}

/* True when the kernel has seen a reset on the socket (or cannot say): the
 * client closed entirely rather than half-closed. */
static int peer_reset(struct rt_http_conn *conn)
{
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&conn->base.tcp, &fd) != 0)
        return 1;
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return 1;
    return ti.tcpi_state == TCP_CLOSE;
}

static void on_peer_timer(uv_timer_t *t)
{
    struct rt_http_server *srv = t->data;
    struct rt_http_conn *c = srv->peers, *next;
    for (; c; c = next) {
        next = c->next_peer;
        if (c->closing || c->finishing || !c->cur) {
            peers_remove(c);
        } else if (peer_reset(c)) {
            peers_remove(c);
            conn_close(c); /* aborts the request */
        }
    }
    if (!srv->peers)
        uv_timer_stop(t);
}

/* ---- connection plumbing ---------------------------------------------- */

static void on_resume_idle(uv_idle_t *h);

void rt_http__resume_later(struct rt_http_conn *conn)
{
    struct rt_http_server *srv = conn->srv;
    /* A closing server closes every connection itself. */
    if (conn->in_resume || conn->closing || srv->closing)
        return;
    conn->in_resume = 1;
    conn->next_resume = srv->resume;
    srv->resume = conn;
    uv_idle_start(&srv->resume_idle, on_resume_idle);
}

static void on_resume_idle(uv_idle_t *h)
{
    struct rt_http_server *srv = h->data;
    while (srv->resume) {
        struct rt_http_conn *c = srv->resume;
        srv->resume = c->next_resume;
        c->in_resume = 0;
        if (c->want_close)
            conn_close(c);
        else
            conn_process(c);
    }
    uv_idle_stop(h);
}

static size_t queued(const struct rt_http_conn *conn)
{
    return uv_stream_get_write_queue_size((const uv_stream_t *)&conn->base.tcp);
}

/* Bytes in the kernel's send queue not yet acknowledged by the client
 * (TIOCOUTQ, Linux: unsent plus unacknowledged); 0 when it cannot say. */
static size_t kernel_unacked(const struct rt_http_conn *conn)
{
    uv_os_fd_t fd;
    int n = 0;
    if (uv_fileno((const uv_handle_t *)&conn->base.tcp, &fd) != 0 ||
        ioctl(fd, TIOCOUTQ, &n) != 0 || n < 0)
        return 0;
    return (size_t)n;
}

static void timer_set(struct rt_http_conn *conn, int mode, uint32_t ms);

/* The period at which send progress is checked: a quarter of the
 * deadline, so a stall is caught within 1.25 deadlines. */
static uint32_t send_period(const struct rt_http_conn *conn)
{
    uint32_t t = conn->srv->cfg.send_timeout_ms;
    if (t == 0)
        return 0;
    return t / 4 > 50 ? t / 4 : 50;
}

/* Starts watching send progress in `mode` (TM_SEND or TM_FLUSH). The
 * kernel's own buffers hold megabytes, so "the client reads nothing" is
 * judged by what it acknowledges, not by what libuv still queues. */
static void send_watch(struct rt_http_conn *conn, int mode)
{
    uint64_t kernel_in = conn->submitted - queued(conn);
    conn->acked_mark = kernel_in - kernel_unacked(conn);
    conn->progress_at = uv_now(conn->srv->loop);
    timer_set(conn, mode, send_period(conn));
}

/* A send-progress check (timer in TM_SEND or TM_FLUSH). Returns 1 when the
 * client made no progress for send_timeout_ms (the caller closes). */
static int send_check(struct rt_http_conn *conn, int mode)
{
    size_t unacked = kernel_unacked(conn), q = queued(conn);
    uint64_t acked = conn->submitted - q - unacked;
    uint64_t now = uv_now(conn->srv->loop);
    if (mode == TM_SEND && q == 0 && unacked == 0)
        return 0; /* all delivered: the next write watches again */
    if (acked != conn->acked_mark) {
        conn->acked_mark = acked;
        conn->progress_at = now;
    } else if (now - conn->progress_at >= conn->srv->cfg.send_timeout_ms) {
        return 1;
    }
    timer_set(conn, mode, send_period(conn));
    return 0;
}

static void on_write(uv_write_t *w, int status)
{
    struct wreq *wr = (struct wreq *)w;
    struct rt_http_conn *conn = wr->conn;
    free(wr);
    if (conn->closing)
        return;
    if (status < 0) {
        conn_close(conn);
        return;
    }
    struct rt_http_req *req = conn->cur;
    if (req && req->on_drain && queued(conn) <= req->drain_low) {
        rt_http_drain_fn fn = req->on_drain;
        req->on_drain = NULL;
        fn(req, req->drain_ud);
    }
}

int rt_http__write(struct rt_http_conn *conn, const char *a, size_t alen,
                   const char *b, size_t blen, const char *c, size_t clen)
{
    size_t n = alen + blen + clen;
    if (n == 0)
        return 0;
    /* uv_buf_t lengths are unsigned int. */
    struct wreq *wr = n <= UINT32_MAX ? malloc(sizeof(*wr) + n) : NULL;
    int rc = TG_ENOMEM;
    if (wr) {
        wr->conn = conn;
        wr->len = n;
        if (alen)
            memcpy(wr->data, a, alen);
        if (blen)
            memcpy(wr->data + alen, b, blen);
        if (clen)
            memcpy(wr->data + alen + blen, c, clen);
        uv_buf_t buf = uv_buf_init(wr->data, (unsigned)n);
        if (uv_write(&wr->w, (uv_stream_t *)&conn->base.tcp, &buf, 1, on_write) ==
            0) {
            conn->submitted += n;
            /* A response in flight must be read within the deadline. */
            if (conn->timer_mode == TM_NONE && conn->cur &&
                conn->cur->state != RQ_PARSING)
                send_watch(conn, TM_SEND);
            return 0;
        }
        free(wr);
        rc = TG_EIO;
    }
    conn->want_close = 1;
    rt_http__resume_later(conn);
    return rc;
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    struct rt_http_conn *conn = h->data;
    if (--conn->handles_open > 0)
        return;
    free(conn->pend);
    rt_conn_release(&conn->base);
    free(conn);
}

/* Takes the current request away from the connection: a request still
 * being received is just freed; one in flight is aborted (callback) or
 * detached (zombie). */
static void conn_drop_cur(struct rt_http_conn *conn)
{
    struct rt_http_req *req = conn->cur;
    conn->cur = NULL;
    if (!req)
        return;
    req->on_drain = NULL;
    if (req->state == RQ_PARSING) {
        rt_http__req_free(req);
        return;
    }
    req->conn = NULL;
    if (req->on_abort) {
        req->in_abort = 1;
        req->on_abort(req, req->abort_ud);
        rt_http__req_free(req);
    } else {
        req->next_zombie = req->srv->zombies;
        req->srv->zombies = req;
    }
}

/* Closes the connection; with `reset` (and no FIN sent yet) by a reset,
 * which also discards what the kernel still holds for the client. */
static void conn_close_how(struct rt_http_conn *conn, int reset)
{
    if (conn->closing)
        return;
    conn->closing = 1;
    rt_conn_leave(&conn->base);
    peers_remove(conn);
    if (conn->in_resume) {
        struct rt_http_server *srv = conn->srv;
        for (struct rt_http_conn **pp = &srv->resume; *pp;
             pp = &(*pp)->next_resume) {
            if (*pp == conn) {
                *pp = conn->next_resume;
                break;
            }
        }
        conn->in_resume = 0;
    }
    conn_drop_cur(conn);
    uv_read_stop((uv_stream_t *)&conn->base.tcp);
    uv_close((uv_handle_t *)&conn->timer, on_conn_handle_closed);
    /* libuv forbids a reset after uv_shutdown. */
    if (!reset || conn->finishing ||
        uv_tcp_close_reset(&conn->base.tcp, on_conn_handle_closed) != 0)
        uv_close((uv_handle_t *)&conn->base.tcp, on_conn_handle_closed);
}

static void conn_close(struct rt_http_conn *conn)
{
    conn_close_how(conn, 0);
}

void rt_http__conn_close(struct rt_http_conn *conn)
{
    conn_close(conn);
}

/* Bytes the client sent that the server has not parsed yet: waiting in
 * the kernel (FIONREAD) or in the pending buffer. */
static uint64_t unparsed_bytes(const struct rt_http_conn *conn)
{
    uv_os_fd_t fd;
    int n = 0;
    if (uv_fileno((const uv_handle_t *)&conn->base.tcp, &fd) != 0 ||
        ioctl(fd, FIONREAD, &n) != 0 || n < 0)
        n = 0;
    return (uint64_t)n + (conn->pend_len - conn->pend_off);
}

/* The next body check (TM_BODY): the end of the current rate window or
 * the body deadline, whichever comes first; none when neither applies. */
static void body_arm(struct rt_http_conn *conn)
{
    const struct rt_http_config *cfg = &conn->srv->cfg;
    uint64_t now = uv_now(conn->srv->loop), due = 0;
    if (cfg->min_body_rate)
        due = conn->win_at + cfg->body_rate_window_ms;
    if (conn->body_deadline && (!due || conn->body_deadline < due))
        due = conn->body_deadline;
    if (!due) {
        timer_set(conn, TM_NONE, 0);
        return;
    }
    timer_set(conn, TM_BODY, due > now ? (uint32_t)(due - now) : 1);
}

/* The body of the current request starts arriving: its deadline and the
 * first window of its minimum rate start now. */
static void body_watch(struct rt_http_conn *conn)
{
    uint64_t now = uv_now(conn->srv->loop);
    uint32_t t = conn->srv->cfg.body_timeout_ms;
    conn->body_deadline = t ? now + t : 0;
    conn->win_at = now;
    conn->win_bytes = conn->cur->blen + unparsed_bytes(conn);
    body_arm(conn);
}

/* A window of the minimum body rate ended at `now`: true when the client
 * sent less than min_body_rate per second over it (or than the rest of its
 * body, when less was left); else the next window starts. */
static int body_too_slow(struct rt_http_conn *conn, uint64_t now)
{
    const struct rt_http_config *cfg = &conn->srv->cfg;
    const struct rt_http_req *req = conn->cur;
    uint64_t win = now - conn->win_at;
    if (!cfg->min_body_rate || win < cfg->body_rate_window_ms)
        return 0;
    uint64_t have = req->blen + unparsed_bytes(conn);
    uint64_t got = have > conn->win_bytes ? have - conn->win_bytes : 0;
    uint64_t need = (uint64_t)cfg->min_body_rate * win / 1000;
    if (req->body_total) {
        uint64_t left = req->body_total > conn->win_bytes
                            ? req->body_total - conn->win_bytes
                            : 0;
        if (need > left)
            need = left;
    }
    if (got < need)
        return 1;
    conn->win_at = now;
    conn->win_bytes = have;
    return 0;
}

static void on_timer(uv_timer_t *t)
{
    struct rt_http_conn *conn = t->data;
    struct rt_http_server *srv = conn->srv;
    int mode = conn->timer_mode;
    conn->timer_mode = TM_NONE;
    struct rt_http_req *req = conn->cur;
    switch (mode) {
    case TM_HEAD:
    case TM_BODY:
        /* The client started a request and did not finish it in time. */
        if (req && req->state == RQ_PARSING) {
            uint64_t now = uv_now(srv->loop);
            if (mode == TM_HEAD) {
                srv->stats.timeout_header++;
                conn->error_msg = "request head not received in time";
            } else if (conn->body_deadline && now >= conn->body_deadline) {
                srv->stats.timeout_body++;
                conn->error_msg = "request body not received in time";
            } else if (body_too_slow(conn, now)) {
                srv->stats.slow_bodies++;
                conn->error_msg = "request body too slow: it arrives under "
                                  "the server's minimum upload rate";
            } else {
                body_arm(conn);
                return;
            }
            conn->error_status = 408;
            conn_process(conn); /* no input: goes straight to the error */
            return;
        }
        break;
    case TM_SEND:
    case TM_FLUSH:
        if (!send_check(conn, mode))
            return;
        /* The client acknowledged nothing for send_timeout_ms: it stopped
         * reading. Closing aborts its request (pages freed upstream); the
         * reset drops what the kernel still buffers for it at once rather
         * than after minutes of zero-window probes. */
        srv->stats.slow_readers++;
        conn_close_how(conn, 1);
        return;
    default:
        break;
    }
    conn_close(conn);
}

static void timer_set(struct rt_http_conn *conn, int mode, uint32_t ms)
{
    if (mode == TM_NONE || ms == 0) {
        uv_timer_stop(&conn->timer);
        conn->timer_mode = TM_NONE;
        return;
    }
    conn->timer_mode = mode;
    uv_timer_start(&conn->timer, on_timer, ms, 0);
}

static void on_shutdown(uv_shutdown_t *sr, int status)
{
    struct rt_http_conn *conn = sr->data;
    if (conn->closing)
        return;
    /* After the client's own FIN there is no input left to drain; a
     * refused request's large body is not drained at all. */
    if (status < 0 || conn->srv->cfg.linger_ms == 0 || conn->peer_eof ||
        conn->no_linger) {
        conn_close(conn);
        return;
    }
    /* The answer is out: lingering only drains, so it may give way. */
    conn_state(conn, RT_CONN_IDLE);
    timer_set(conn, TM_LINGER, conn->srv->cfg.linger_ms);
}

/* Ends the connection gracefully after the queued writes (see top). */
void rt_http__conn_finish(struct rt_http_conn *conn)
{
    if (conn->closing || conn->finishing)
        return;
    conn->finishing = 1;
    /* An answer already handed to the kernel only waits for its FIN: the
     * connection may give way like an idle one (closing it still delivers
     * what the kernel holds). When thousands of slow uploads are answered
     * 408 at once, the table is not all busy for that moment. */
    conn_state(conn, queued(conn) == 0 ? RT_CONN_IDLE : RT_CONN_BUSY);
    peers_remove(conn);
    conn_drop_cur(conn);
    conn->shutdown_req.data = conn;
    if (uv_shutdown(&conn->shutdown_req, (uv_stream_t *)&conn->base.tcp,
                    on_shutdown) < 0) {
        conn->want_close = 1;
        rt_http__resume_later(conn);
        return;
    }
    /* Bound the flush: a client that never reads must not pin us. */
    send_watch(conn, TM_FLUSH);
    if (conn->no_linger) {
        /* Nothing more is read: what the client keeps sending stays in
         * the kernel until the close. */
        uv_read_stop((uv_stream_t *)&conn->base.tcp);
        conn->read_paused = 1;
    } else if (conn->read_paused && !conn->peer_eof) {
        conn->read_paused = 0;
        conn->pend_off = conn->pend_len = 0;
        /* Reading again drains the client's input during the linger. */
        read_start(conn);
    }
}

int rt_http__conn_last(const struct rt_http_conn *conn)
{
    return conn->peer_eof && conn->pend_off >= conn->pend_len;
}

static const char *default_message(int status, enum http_errno e)
{
    switch (status) {
    case 408: return "request not received in time";
    case 413: return "request body too large";
    case 431: return "request headers too large";
    case 500: return "out of memory";
    default: return http_errno_description(e);
    }
}

/* True when the request being received still has a body to come that is
 * large or of unknown length (see RT_HTTP_LINGER_BODY_MAX). */
static int unread_body_large(const struct rt_http_conn *conn)
{
    const struct rt_http_req *req = conn->cur;
    if (!req || req->state != RQ_PARSING || !req->head_done)
        return 0;
    if (conn->parser.flags & F_CHUNKED)
        return 1;
    /* content_length counts down what the body still owes. */
    return conn->parser.content_length != ULLONG_MAX &&
           conn->parser.content_length > RT_HTTP_LINGER_BODY_MAX;
}

/* Answers a request that failed to parse (or was refused by the head
 * check) and ends the connection. */
static void conn_fail(struct rt_http_conn *conn, int status, enum http_errno e)
{
    struct rt_http_server *srv = conn->srv;
    const struct rt_http_refusal *rf = &conn->refusal;
    int refused = rf->status == status && status != 0;
    if (!refused) {
        if (status == 413 || status == 431)
            srv->stats.too_large++;
        else if (status == 400 || status == 501 || status == 505)
            srv->stats.malformed++;
        else if (status == 503 && !conn->base.probe)
            srv->stats.refused_budget++;
    }
    const char *msg = conn->error_msg ? conn->error_msg
                                      : default_message(status, e);
    char resp[4096];
    size_t n = rt_http__error_response(
        resp, sizeof(resp), status, refused ? rf->type : NULL, msg,
        refused ? rf->code : conn->error_code,
        status == 503 ? srv->cfg.retry_after_s : 0,
        refused ? rf->header : NULL);
    conn->no_linger = unread_body_large(conn);
    rt_http__write(conn, resp, n, NULL, 0, NULL, 0);
    rt_http__conn_finish(conn);
}

/* ---- dispatch ---------------------------------------------------------- */

static int path_matches(const struct rt_http_route *r, const char *path)
{
    if (r->prefix_len)
        return strncmp(path, r->path, r->prefix_len) == 0;
    return strcmp(path, r->path) == 0;
}

int rt_http__probe_route(const struct rt_http_server *srv,
                         const struct rt_http_req *req)
{
    for (size_t i = 0; i < srv->n_routes; i++) {
        const struct rt_http_route *r = &srv->routes[i];
        if (r->probe && path_matches(r, req->path) &&
            (strcmp(r->method, req->method) == 0 ||
             (req->is_head && strcmp(r->method, "GET") == 0)))
            return 1;
    }
    return 0;
}

/* Adds `method` to the Allow list (once). */
static void allow_add(char *allow, size_t cap, size_t *alen,
                      const char *method)
{
    size_t n = strlen(method);
    for (const char *p = allow; (p = strstr(p, method)) != NULL; p += n)
        if ((p == allow || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return;
    if (*alen + n + 3 < cap)
        *alen += (size_t)snprintf(allow + *alen, cap - *alen, "%s%s",
                                  *alen ? ", " : "", method);
}

static void dispatch(struct rt_http_conn *conn)
{
    struct rt_http_server *srv = conn->srv;
    struct rt_http_req *req = conn->cur;
    srv->n_requests++;
    const struct rt_http_route *hit = NULL, *get = NULL;
    int path_known = 0;
    char allow[128] = "";
    size_t alen = 0;
    for (size_t i = 0; i < srv->n_routes; i++) {
        const struct rt_http_route *r = &srv->routes[i];
        if (!path_matches(r, req->path))
            continue;
        if (strcmp(r->method, req->method) == 0) {
            hit = r;
            break;
        }
        if (!get && strcmp(r->method, "GET") == 0)
            get = r;
        path_known = 1;
        allow_add(allow, sizeof(allow), &alen, r->method);
        if (strcmp(r->method, "GET") == 0)
            allow_add(allow, sizeof(allow), &alen, "HEAD");
    }
    /* HEAD without a route of its own: the GET route's answer without
     * its body (rt_http_respond leaves it out for HEAD). */
    if (!hit && get && req->is_head)
        hit = get;
    conn->in_dispatch = 1;
    if (conn->base.probe)
        srv->stats.probes_served++;
    if (hit) {
        hit->handler(req, hit->ud);
    } else if (path_known) {
        rt_http_resp_header(req, "Allow", allow);
        char msg[160];
        snprintf(msg, sizeof(msg), "method %s not allowed for this path",
                 req->method);
        rt_http_respond_error(req, 405, NULL, msg, NULL);
    } else {
        rt_http_respond_error(req, 404, NULL, "no such route", NULL);
    }
    conn->in_dispatch = 0;
}

static void conn_process(struct rt_http_conn *conn)
{
    while (!conn->closing && !conn->finishing && !conn->want_close &&
           (!conn->cur || conn->cur->state == RQ_PARSING)) {
        size_t avail = conn->pend_len - conn->pend_off;
        enum http_errno e = HPE_OK;
        size_t n = 0;
        if (conn->error_status == 0) {
            if (avail == 0)
                break;
            n = rt_http__parse(conn, conn->pend + conn->pend_off, avail, &e);
            conn->pend_off += n;
            if (conn->error_status == 0 && e == HPE_PAUSED) {
                http_parser_pause(&conn->parser, 0);
                dispatch(conn);
                continue;
            }
        }
        if (conn->error_status || e != HPE_OK || n < avail) {
            int status = conn->error_status;
            if (!status)
                status = e == HPE_HEADER_OVERFLOW ? 431 : 400;
            conn_fail(conn, status, e);
            return;
        }
    }
    if (conn->closing || conn->finishing)
        return;
    /* A half-closed client whose requests are all answered: done. A
     * request it started but never finished cannot complete. */
    if (conn->peer_eof && !conn->want_close &&
        (!conn->cur || conn->cur->state == RQ_PARSING)) {
        rt_http__conn_finish(conn);
        return;
    }
    /* Compact the pending buffer; resume reading when there is room. */
    if (conn->pend_off == conn->pend_len) {
        conn->pend_off = conn->pend_len = 0;
    } else if (conn->pend_off > 0) {
        memmove(conn->pend, conn->pend + conn->pend_off,
                conn->pend_len - conn->pend_off);
        conn->pend_len -= conn->pend_off;
        conn->pend_off = 0;
    }
    if (conn->read_paused && conn->pend_len < PENDING_CAP &&
        !conn->peer_eof) {
        conn->read_paused = 0;
        read_start(conn);
    }
    conn_arm_timer(conn);
}

static void conn_state(struct rt_http_conn *conn, int state)
{
    rt_conn_state_set(&conn->base, state);
}

/* Tells the connection set what the connection is doing, and arms the
 * connection's timer for it. */
static void conn_arm_timer(struct rt_http_conn *conn)
{
    const struct rt_http_config *cfg = &conn->srv->cfg;
    struct rt_http_req *req = conn->cur;
    if (conn->closing || conn->finishing)
        return;
    if (!req) {
        /* The set's idle deadline applies; bytes that start no request
         * (stray CRLFs) do not restart it. */
        conn_state(conn, RT_CONN_IDLE);
        if (conn->timer_mode == TM_HEAD || conn->timer_mode == TM_BODY)
            timer_set(conn, TM_NONE, 0);
        return;
    }
    if (req->state == RQ_PARSING) {
        if (req->head_done) {
            conn_state(conn, RT_CONN_BODY);
            conn->base.bytes = req->blen;
            if (conn->timer_mode != TM_BODY)
                body_watch(conn);
        } else {
            conn_state(conn, RT_CONN_HEAD);
            conn->base.bytes = conn->hdr_bytes;
            if (conn->timer_mode != TM_HEAD)
                timer_set(conn, TM_HEAD, cfg->header_timeout_ms);
        }
        return;
    }
    conn_state(conn, RT_CONN_BUSY);
    if (conn->timer_mode != TM_SEND) {
        /* The handler's time is its own; only a send that makes no
         * progress is bounded. */
        if (queued(conn) > 0 || kernel_unacked(conn) > 0)
            send_watch(conn, TM_SEND);
        else
            timer_set(conn, TM_NONE, 0);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct rt_http_conn *conn = h->data;
    *buf = uv_buf_init(conn->srv->rbuf, RT_HTTP_READ_BUF);
}

/* The client shut down its sending side (rt_http.h, "Half-close"). */
static void on_peer_eof(struct rt_http_conn *conn)
{
    struct rt_http_req *req = conn->cur;
    conn->peer_eof = 1;
    uv_read_stop((uv_stream_t *)&conn->base.tcp);
    conn->read_paused = 0;
    if (!req || req->state == RQ_PARSING) {
        /* Nothing complete to answer. */
        conn_close(conn);
        return;
    }
    conn->srv->stats.half_closed++;
    /* Probe: a socket closed entirely answers this with a reset. */
    if (req->state == RQ_HANDLER && req->http_major == 1 &&
        req->http_minor >= 1) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (rt_http__write(conn, cont, sizeof(cont) - 1, NULL, 0, NULL, 0) < 0)
            return;
    }
    peers_add(conn);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct rt_http_conn *conn = s->data;
    if (nread < 0) {
        /* A reset or an error, or the end of a lingering drain: gone. */
        if (nread != UV_EOF || conn->finishing || conn->closing)
            conn_close(conn);
        else
            on_peer_eof(conn);
        return;
    }
    if (nread == 0 || conn->closing || conn->finishing)
        return; /* finishing: lingering, input is thrown away */
    if (rt_http__buf_append(&conn->pend, &conn->pend_len, &conn->pend_cap,
                            buf->base, (size_t)nread) < 0) {
        conn_close(conn);
        return;
    }
    if (conn->cur && conn->cur->state != RQ_PARSING) {
        /* Pipelined input behind a request in flight: keep it for later,
         * and stop reading when too much piles up. */
        if (conn->pend_len - conn->pend_off >= PENDING_CAP) {
            uv_read_stop(s);
            conn->read_paused = 1;
        }
        return;
    }
    conn_process(conn);
}

static void read_start(struct rt_http_conn *conn)
{
    if (uv_read_start((uv_stream_t *)&conn->base.tcp, on_alloc, on_read) < 0)
        conn_close(conn);
}

/* ---- the connection set's side --------------------------------------- */

static struct rt_http_conn *conn_of(struct rt_conn *c)
{
    return (struct rt_http_conn *)c;
}

static struct rt_conn *set_create(struct rt_conn_set *set)
{
    struct rt_http_server *srv = set->ud;
    struct rt_http_conn *conn = calloc(1, sizeof(*conn));
    if (!conn)
        return NULL;
    if (uv_tcp_init(srv->loop, &conn->base.tcp) < 0) {
        free(conn);
        return NULL;
    }
    conn->srv = srv;
    uv_timer_init(srv->loop, &conn->timer);
    conn->base.tcp.data = conn;
    conn->timer.data = conn;
    conn->handles_open = 2;
    http_parser_init(&conn->parser, HTTP_REQUEST);
    conn->parser.data = conn;
    return &conn->base;
}

/* A new connection whose client sent bytes before it was accepted is not
 * idle: under a flood of connections the set makes room by closing idle
 * ones first, and one whose request waits unread in the kernel (read at
 * the next poll) would look idle until then, so a probe accepted first in
 * a burst gave way to the rest of the burst. It counts as a head arriving
 * with those bytes, which makes it the fastest head of all. */
static void note_pending(struct rt_http_conn *conn)
{
    uv_os_fd_t fd;
    int n = 0;
    if (conn->closing || conn->cur ||
        uv_fileno((const uv_handle_t *)&conn->base.tcp, &fd) != 0 ||
        ioctl(fd, FIONREAD, &n) != 0 || n <= 0)
        return;
    conn_state(conn, RT_CONN_HEAD);
    conn->base.bytes = (uint64_t)n;
}

static void set_start(struct rt_conn *c)
{
    struct rt_http_conn *conn = conn_of(c);
    uv_tcp_nodelay(&conn->base.tcp, 1);
    read_start(conn);
    if (!conn->closing)
        conn_arm_timer(conn);
    note_pending(conn);
}

/* Writes a whole error response without a request, if the socket takes
 * it at once: a flood of connections costs one write and one close each,
 * never a read or a wait. */
static void try_answer(struct rt_http_conn *conn, int status, const char *msg,
                       const char *code, unsigned retry_after_s)
{
    char resp[2048];
    size_t n = rt_http__error_response(resp, sizeof(resp), status, NULL, msg,
                                       code, retry_after_s, NULL);
    uv_buf_t b = uv_buf_init(resp, (unsigned)n);
    if (n)
        uv_try_write((uv_stream_t *)&conn->base.tcp, &b, 1);
}

static void set_refuse(struct rt_conn *c, int why)
{
    struct rt_http_conn *conn = conn_of(c);
    unsigned ra = conn->srv->cfg.retry_after_s;
    if (why == RT_CONN_REFUSE_MAX)
        try_answer(conn, 503, "the server is at its connection limit",
                   "connection_limit", ra);
    else if (why == RT_CONN_REFUSE_PER_IP)
        try_answer(conn, 503, "too many connections from this address",
                   "connection_limit_per_address", ra);
    conn_close(conn);
}

static void set_evict(struct rt_conn *c, int why)
{
    struct rt_http_conn *conn = conn_of(c);
    /* An idle connection holds a descriptor and nothing else, and its
     * client reconnects at need; a head that trickled slowest while the
     * table is full is told why. */
    if (why == RT_CONN_EVICT_HEAD)
        try_answer(conn, 408,
                   "request head too slow: the server needed the "
                   "connection for another client",
                   "request_timeout", 0);
    else if (why == RT_CONN_EVICT_BODY)
        try_answer(conn, 408,
                   "request body too slow: the server needed the "
                   "connection for another client",
                   "request_timeout", 0);
    conn_close(conn);
}

/* The server closes: every connection at once, its request aborted. */
static void set_close(struct rt_conn *c)
{
    struct rt_http_conn *conn = conn_of(c);
    conn->in_resume = 0;
    rt_http__conn_close(conn);
}

const struct rt_conn_ops rt_http__conn_ops = {
    .create = set_create,
    .start = set_start,
    .refuse = set_refuse,
    .evict = set_evict,
    .close = set_close,
};
