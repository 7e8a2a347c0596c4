/*
 * rt_http.c — HTTP/1.1 server on libuv + http-parser (see rt_http.h):
 * connections, parsing and dispatch; responses are in rt_http_resp.c.
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
 */
#include "router/rt_http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/tg_err.h"

void rt_http_config_default(struct rt_http_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_header_bytes = 16384;
    cfg->max_body_bytes = 8u << 20;
    cfg->idle_timeout_ms = 60000;
    cfg->request_timeout_ms = 30000;
    cfg->linger_ms = 1000;
    cfg->backlog = 511;
}

/* Appends bytes to a growable buffer with room for a terminating NUL. */
static int buf_append(char **buf, size_t *len, size_t *cap, const char *at,
                      size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *p = realloc(*buf, c);
        if (!p)
            return TG_ENOMEM;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, at, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

void rt__http_req_free(struct rt_http_req *req)
{
    if (!req)
        return;
    free(req->hbuf);
    free(req->hoffs);
    free(req->hdrs);
    free(req->bbuf);
    free(req->rhdrs);
    free(req);
}

/* ---- connection plumbing ---------------------------------------------- */

static void conn_close(struct rt_http_conn *conn);
static void conn_process(struct rt_http_conn *conn);
static void conn_arm_timer(struct rt_http_conn *conn);
static void read_start(struct rt_http_conn *conn);

static void srv_handle_closed(struct rt_http_server *srv)
{
    srv->live_handles--;
    if (srv->closing && srv->live_handles == 0 && srv->on_closed) {
        rt_http_closed_fn cb = srv->on_closed;
        srv->on_closed = NULL;
        cb(srv->on_closed_ud);
    }
}

static void on_resume_idle(uv_idle_t *h);

void rt__http_resume_later(struct rt_http_conn *conn)
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

static void on_write(uv_write_t *w, int status)
{
    struct wreq *wr = (struct wreq *)w;
    struct rt_http_conn *conn = wr->conn;
    free(wr);
    if (status < 0 && !conn->closing)
        conn_close(conn);
}

int rt__http_write(struct rt_http_conn *conn, const char *a, size_t alen,
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
        if (uv_write(&wr->w, (uv_stream_t *)&conn->tcp, &buf, 1, on_write) ==
            0)
            return 0;
        free(wr);
        rc = TG_EIO;
    }
    conn->want_close = 1;
    rt__http_resume_later(conn);
    return rc;
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    struct rt_http_conn *conn = h->data;
    if (--conn->handles_open > 0)
        return;
    struct rt_http_server *srv = conn->srv;
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        srv->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
    srv->n_conns--;
    free(conn->pend);
    free(conn);
    srv_handle_closed(srv);
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
    if (req->state == RQ_PARSING) {
        rt__http_req_free(req);
        return;
    }
    req->conn = NULL;
    if (req->on_abort) {
        req->in_abort = 1;
        req->on_abort(req, req->abort_ud);
        rt__http_req_free(req);
    } else {
        req->next_zombie = req->srv->zombies;
        req->srv->zombies = req;
    }
}

static void conn_close(struct rt_http_conn *conn)
{
    if (conn->closing)
        return;
    conn->closing = 1;
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
    uv_read_stop((uv_stream_t *)&conn->tcp);
    uv_close((uv_handle_t *)&conn->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&conn->tcp, on_conn_handle_closed);
}

static void on_timer(uv_timer_t *t)
{
    struct rt_http_conn *conn = t->data;
    int mode = conn->timer_mode;
    conn->timer_mode = TM_NONE;
    if (mode == TM_REQUEST) {
        /* The client started a request and did not finish it in time. */
        struct rt_http_req *req = conn->cur;
        if (req && req->state == RQ_PARSING) {
            conn->error_status = 408;
            conn_process(conn); /* no input: goes straight to the error */
            return;
        }
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
    if (status < 0 || conn->srv->cfg.linger_ms == 0) {
        conn_close(conn);
        return;
    }
    timer_set(conn, TM_LINGER, conn->srv->cfg.linger_ms);
}

/* Ends the connection gracefully after the queued writes (see top). */
void rt__http_conn_finish(struct rt_http_conn *conn)
{
    if (conn->closing || conn->finishing)
        return;
    conn->finishing = 1;
    conn_drop_cur(conn);
    conn->shutdown_req.data = conn;
    if (uv_shutdown(&conn->shutdown_req, (uv_stream_t *)&conn->tcp,
                    on_shutdown) < 0) {
        conn->want_close = 1;
        rt__http_resume_later(conn);
        return;
    }
    /* Bound the flush: a client that never reads must not pin us. */
    timer_set(conn, TM_FLUSH, conn->srv->cfg.request_timeout_ms);
    if (conn->read_paused) {
        conn->read_paused = 0;
        conn->pend_off = conn->pend_len = 0;
        /* Reading again drains the client's input during the linger. */
        read_start(conn);
    }
}

/* Answers a request that failed to parse and ends the connection. */
static void conn_fail(struct rt_http_conn *conn, int status, const char *msg)
{
    char *body = rt__http_error_json(status, NULL, msg);
    const char *b = body ? body : "{}";
    char head[256];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, rt_http_status_reason(status), strlen(b));
    rt__http_write(conn, head, (size_t)n, b, strlen(b), NULL, 0);
    free(body);
    rt__http_conn_finish(conn);
}

/* ---- parser callbacks -------------------------------------------------- */

static struct rt_http_conn *pconn(http_parser *p)
{
    return p->data;
}

/* Counts request-line and header bytes against the limit. */
static int hdr_account(struct rt_http_conn *conn, size_t n)
{
    conn->hdr_bytes += n;
    if (conn->hdr_bytes > conn->srv->cfg.max_header_bytes) {
        conn->error_status = 431;
        return -1;
    }
    return 0;
}

static int on_message_begin(http_parser *p)
{
    struct rt_http_conn *conn = pconn(p);
    TG_ASSERT(conn->cur == NULL);
    struct rt_http_req *req = calloc(1, sizeof(*req));
    if (!req) {
        conn->error_status = 500;
        return -1;
    }
    req->conn = conn;
    req->srv = conn->srv;
    req->state = RQ_PARSING;
    conn->cur = req;
    conn->hdr_bytes = 0;
    return 0;
}

/* Terminates the string being collected in hbuf (url, name or value). */
static int hbuf_terminate(struct rt_http_req *req)
{
    return buf_append(&req->hbuf, &req->hlen, &req->hcap, "", 1);
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    if (hdr_account(conn, n) < 0)
        return -1;
    req->last_cb = CB_URL;
    req->url_len += n;
    if (buf_append(&req->hbuf, &req->hlen, &req->hcap, at, n) < 0) {
        conn->error_status = 500;
        return -1;
    }
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    /* A new header also costs its ": " and CRLF. */
    if (hdr_account(conn, n + (req->last_cb != CB_FIELD ? 4 : 0)) < 0)
        return -1;
    if (req->last_cb != CB_FIELD) {
        /* A new header: close the previous string, record the name. */
        if (hbuf_terminate(req) < 0)
            goto oom;
        if (req->n_hdrs == req->cap_hdrs) {
            size_t c = req->cap_hdrs ? 2 * req->cap_hdrs : 16;
            size_t *o = realloc(req->hoffs, 2 * c * sizeof(*o));
            if (!o)
                goto oom;
            req->hoffs = o;
            req->cap_hdrs = c;
        }
        req->hoffs[2 * req->n_hdrs] = req->hlen;
        req->hoffs[2 * req->n_hdrs + 1] = req->hlen; /* empty value */
        req->n_hdrs++;
        req->last_cb = CB_FIELD;
    }
    if (buf_append(&req->hbuf, &req->hlen, &req->hcap, at, n) < 0)
        goto oom;
    return 0;
oom:
    conn->error_status = 500;
    return -1;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    if (hdr_account(conn, n) < 0)
        return -1;
    if (req->last_cb != CB_VALUE) {
        if (hbuf_terminate(req) < 0)
            goto oom;
        req->hoffs[2 * (req->n_hdrs - 1) + 1] = req->hlen;
        req->last_cb = CB_VALUE;
    }
    if (buf_append(&req->hbuf, &req->hlen, &req->hcap, at, n) < 0)
        goto oom;
    return 0;
oom:
    conn->error_status = 500;
    return -1;
}

/* Splits the target into path and query (appended to hbuf as two more
 * strings) and returns their offsets; -1 when the target is malformed. */
static int split_target(struct rt_http_req *req, int is_connect,
                        size_t *path_off, size_t *query_off)
{
    const char *url = req->hbuf;
    size_t ulen = req->url_len;
    const char *path = "/", *query = "";
    size_t plen = 1, qlen = 0;
    struct http_parser_url u;
    if (ulen == 1 && url[0] == '*') {
        path = "*"; /* OPTIONS * (asterisk-form) */
    } else {
        http_parser_url_init(&u);
        if (http_parser_parse_url(url, ulen, is_connect, &u) != 0)
            return -1;
        if (u.field_set & (1 << UF_PATH)) {
            path = url + u.field_data[UF_PATH].off;
            plen = u.field_data[UF_PATH].len;
        }
        if (u.field_set & (1 << UF_QUERY)) {
            query = url + u.field_data[UF_QUERY].off;
            qlen = u.field_data[UF_QUERY].len;
        }
    }
    /* Copy out before appending: the append may move hbuf. */
    char *tmp = malloc(plen + qlen + 2);
    if (!tmp)
        return -2;
    memcpy(tmp, path, plen);
    tmp[plen] = '\0';
    memcpy(tmp + plen + 1, query, qlen);
    tmp[plen + 1 + qlen] = '\0';
    int rc = hbuf_terminate(req);
    *path_off = req->hlen;
    if (rc == 0)
        rc = buf_append(&req->hbuf, &req->hlen, &req->hcap, tmp, plen + 1);
    *query_off = req->hlen;
    if (rc == 0)
        rc = buf_append(&req->hbuf, &req->hlen, &req->hcap, tmp + plen + 1,
                        qlen);
    free(tmp);
    return rc < 0 ? -2 : 0;
}

static int on_headers_complete(http_parser *p)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    const struct rt_http_config *cfg = &conn->srv->cfg;
    size_t path_off, query_off;
    int rc = split_target(req, p->method == HTTP_CONNECT, &path_off,
                          &query_off);
    if (rc < 0) {
        conn->error_status = rc == -1 ? 400 : 500;
        return -1;
    }
    if (req->n_hdrs) {
        req->hdrs = malloc(req->n_hdrs * sizeof(*req->hdrs));
        if (!req->hdrs) {
            conn->error_status = 500;
            return -1;
        }
    }
    /* hbuf does not move from here on: pointers are stable. */
    for (size_t i = 0; i < req->n_hdrs; i++) {
        req->hdrs[i].name = req->hbuf + req->hoffs[2 * i];
        req->hdrs[i].value = req->hbuf + req->hoffs[2 * i + 1];
    }
    req->headers = req->hdrs;
    req->n_headers = req->n_hdrs;
    req->path = req->hbuf + path_off;
    req->query = req->hbuf + query_off;
    req->method = http_method_str((enum http_method)p->method);
    req->is_head = p->method == HTTP_HEAD;
    req->http_major = p->http_major;
    req->http_minor = p->http_minor;
    /* Upgrades (h2c, websocket) are not served here: answer and close. */
    req->keep_alive = http_should_keep_alive(p) && !p->upgrade;

    int chunked = (p->flags & F_CHUNKED) != 0;
    if (!chunked && p->content_length != ULLONG_MAX &&
        p->content_length > cfg->max_body_bytes) {
        conn->error_status = 413;
        return -1;
    }
    const char *expect = rt_http_req_header(req, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0 &&
        p->http_major == 1 && p->http_minor >= 1) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        rt__http_write(conn, cont, sizeof(cont) - 1, NULL, 0, NULL, 0);
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    if (req->blen + n > conn->srv->cfg.max_body_bytes) {
        conn->error_status = 413;
        return -1;
    }
    if (buf_append(&req->bbuf, &req->blen, &req->bcap, at, n) < 0) {
        conn->error_status = 500;
        return -1;
    }
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    req->body = req->bbuf ? req->bbuf : "";
    req->body_len = req->blen;
    req->state = RQ_HANDLER;
    /* One request at a time: stop here, dispatch, resume after it. */
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- dispatch ---------------------------------------------------------- */

static int path_matches(const struct rt_http_route *r, const char *path)
{
    if (r->prefix_len)
        return strncmp(path, r->path, r->prefix_len) == 0;
    return strcmp(path, r->path) == 0;
}

static void dispatch(struct rt_http_conn *conn)
{
    struct rt_http_server *srv = conn->srv;
    struct rt_http_req *req = conn->cur;
    srv->n_requests++;
    const struct rt_http_route *hit = NULL;
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
        path_known = 1;
        if (!strstr(allow, r->method) &&
            alen + strlen(r->method) + 3 < sizeof(allow))
            alen += (size_t)snprintf(allow + alen, sizeof(allow) - alen,
                                     "%s%s", alen ? ", " : "", r->method);
    }
    conn->in_dispatch = 1;
    if (hit) {
        hit->handler(req, hit->ud);
    } else if (path_known) {
        rt_http_resp_header(req, "Allow", allow);
        char msg[160];
        snprintf(msg, sizeof(msg), "method %s not allowed for this path",
                 req->method);
        rt_http_respond_error(req, 405, NULL, msg);
    } else {
        rt_http_respond_error(req, 404, NULL, "no such route");
    }
    conn->in_dispatch = 0;
}

static const char *parse_error_message(int status, enum http_errno e)
{
    switch (status) {
    case 408: return "request not received in time";
    case 413: return "request body too large";
    case 431: return "request headers too large";
    case 500: return "out of memory";
    default: return http_errno_description(e);
    }
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
            n = http_parser_execute(&conn->parser, &parser_settings,
                                    conn->pend + conn->pend_off, avail);
            conn->pend_off += n;
            e = HTTP_PARSER_ERRNO(&conn->parser);
            if (e == HPE_PAUSED) {
                http_parser_pause(&conn->parser, 0);
                dispatch(conn);
                continue;
            }
        }
        if (conn->error_status || e != HPE_OK || n < avail) {
            int status = conn->error_status;
            if (!status)
                status = e == HPE_HEADER_OVERFLOW ? 431 : 400;
            conn_fail(conn, status, parse_error_message(status, e));
            return;
        }
    }
    if (conn->closing || conn->finishing)
        return;
    /* Compact the pending buffer; resume reading when there is room. */
    if (conn->pend_off == conn->pend_len) {
        conn->pend_off = conn->pend_len = 0;
    } else if (conn->pend_off > 0) {
        memmove(conn->pend, conn->pend + conn->pend_off,
                conn->pend_len - conn->pend_off);
        conn->pend_len -= conn->pend_off;
        conn->pend_off = 0;
    }
    if (conn->read_paused && conn->pend_len < PENDING_CAP) {
        conn->read_paused = 0;
        read_start(conn);
    }
    conn_arm_timer(conn);
}

static void conn_arm_timer(struct rt_http_conn *conn)
{
    const struct rt_http_config *cfg = &conn->srv->cfg;
    if (conn->closing || conn->finishing)
        return;
    if (!conn->cur) {
        timer_set(conn, TM_IDLE, cfg->idle_timeout_ms);
    } else if (conn->cur->state == RQ_PARSING) {
        if (conn->timer_mode != TM_REQUEST)
            timer_set(conn, TM_REQUEST, cfg->request_timeout_ms);
    } else {
        timer_set(conn, TM_NONE, 0); /* the handler's time is its own */
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct rt_http_conn *conn = h->data;
    *buf = uv_buf_init(conn->rbuf, sizeof(conn->rbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct rt_http_conn *conn = s->data;
    if (nread < 0) {
        /* EOF or error: the client is gone (see rt_http.h). */
        conn_close(conn);
        return;
    }
    if (nread == 0 || conn->closing || conn->finishing)
        return; /* finishing: lingering, input is thrown away */
    if (buf_append(&conn->pend, &conn->pend_len, &conn->pend_cap, buf->base,
                   (size_t)nread) < 0) {
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
    if (uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read) < 0)
        conn_close(conn);
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

static void on_connection(uv_stream_t *l, int status)
{
    struct rt_http_server *srv = l->data;
    if (status < 0 || srv->closing)
        return;
    struct rt_http_conn *conn = calloc(1, sizeof(*conn));
    if (!conn) {
        /* Accept and drop, so the backlog does not spin. */
        uv_tcp_t *tmp = malloc(sizeof(*tmp));
        if (tmp && uv_tcp_init(srv->loop, tmp) == 0) {
            uv_accept(l, (uv_stream_t *)tmp);
            uv_close((uv_handle_t *)tmp, free_handle);
        } else {
            free(tmp);
        }
        return;
    }
    conn->srv = srv;
    if (uv_tcp_init(srv->loop, &conn->tcp) < 0) {
        free(conn);
        return;
    }
    uv_timer_init(srv->loop, &conn->timer);
    conn->tcp.data = conn;
    conn->timer.data = conn;
    conn->handles_open = 2;
    http_parser_init(&conn->parser, HTTP_REQUEST);
    conn->parser.data = conn;
    conn->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = conn;
    srv->conns = conn;
    srv->n_conns++;
    srv->live_handles++;
    if (uv_accept(l, (uv_stream_t *)&conn->tcp) < 0) {
        conn_close(conn);
        return;
    }
    uv_tcp_nodelay(&conn->tcp, 1);
    read_start(conn);
    if (!conn->closing)
        conn_arm_timer(conn);
}

/* ---- server ------------------------------------------------------------ */

int rt_http_server_init(struct rt_http_server *srv, uv_loop_t *loop,
                        const struct rt_http_config *cfg, char *err,
                        size_t errlen)
{
    memset(srv, 0, sizeof(*srv));
    if (!loop)
        return tg_err_set(err, errlen, TG_EINVAL, "http: no loop");
    if (cfg)
        srv->cfg = *cfg;
    else
        rt_http_config_default(&srv->cfg);
    if (srv->cfg.max_header_bytes < 256 ||
        srv->cfg.max_header_bytes > (64u << 20))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: max_header_bytes %zu outside [256, 64 MiB]",
                          srv->cfg.max_header_bytes);
    if (srv->cfg.max_body_bytes > ((size_t)1 << 40))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: max_body_bytes %zu too large",
                          srv->cfg.max_body_bytes);
    if (srv->cfg.backlog <= 0)
        return tg_err_set(err, errlen, TG_EINVAL, "http: backlog %d <= 0",
                          srv->cfg.backlog);
    srv->loop = loop;
    int rc = uv_tcp_init(loop, &srv->listener);
    if (rc < 0)
        return tg_err_set(err, errlen, TG_EIO, "http: uv_tcp_init: %s",
                          uv_strerror(rc));
    /* uv_idle_init cannot fail (it only links the handle into the loop). */
    rc = uv_idle_init(loop, &srv->resume_idle);
    TG_ASSERT(rc == 0);
    srv->listener.data = srv;
    srv->resume_idle.data = srv;
    srv->live_handles = 2;
    srv->initialized = 1;
    return 0;
}

int rt_http_route_add(struct rt_http_server *srv, const char *method,
                      const char *path, rt_http_handler_fn handler, void *ud,
                      char *err, size_t errlen)
{
    if (!method || !*method || !path || path[0] != '/' || !handler)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: route needs a method, a path starting "
                          "with '/' and a handler");
    if (srv->n_routes == srv->cap_routes) {
        size_t c = srv->cap_routes ? 2 * srv->cap_routes : 16;
        struct rt_http_route *r = realloc(srv->routes, c * sizeof(*r));
        if (!r)
            return tg_err_set(err, errlen, TG_ENOMEM, "http: routes");
        srv->routes = r;
        srv->cap_routes = c;
    }
    struct rt_http_route *r = &srv->routes[srv->n_routes];
    r->method = strdup(method);
    r->path = strdup(path);
    if (!r->method || !r->path) {
        free(r->method);
        free(r->path);
        return tg_err_set(err, errlen, TG_ENOMEM, "http: routes");
    }
    size_t plen = strlen(path);
    r->prefix_len = path[plen - 1] == '*' ? plen - 1 : 0;
    r->handler = handler;
    r->ud = ud;
    srv->n_routes++;
    return 0;
}

int rt_http_server_listen(struct rt_http_server *srv, const char *host,
                          int port, char *err, size_t errlen)
{
    if (!srv->initialized || srv->listening || srv->closing)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: server not ready to listen");
    if (port < 0 || port > 65535)
        return tg_err_set(err, errlen, TG_EINVAL, "http: bad port %d", port);
    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: '%s' is not an IP address", host);
    int rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&srv->listener, srv->cfg.backlog,
                       on_connection);
    if (rc < 0)
        return tg_err_set(err, errlen, TG_EIO, "http: listen on %s:%d: %s",
                          host, port, uv_strerror(rc));
    struct sockaddr_storage got;
    int len = sizeof(got);
    rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&got, &len);
    if (rc < 0)
        return tg_err_set(err, errlen, TG_EIO, "http: getsockname: %s",
                          uv_strerror(rc));
    srv->port = got.ss_family == AF_INET6
                    ? ntohs(((struct sockaddr_in6 *)&got)->sin6_port)
                    : ntohs(((struct sockaddr_in *)&got)->sin_port);
    srv->listening = 1;
    return 0;
}

static void on_srv_handle_closed(uv_handle_t *h)
{
    srv_handle_closed(h->data);
}

void rt_http_server_close(struct rt_http_server *srv,
                          rt_http_closed_fn on_closed, void *ud)
{
    if (!srv->initialized || srv->closing)
        return;
    srv->closing = 1;
    srv->on_closed = on_closed;
    srv->on_closed_ud = ud;
    uv_close((uv_handle_t *)&srv->listener, on_srv_handle_closed);
    uv_close((uv_handle_t *)&srv->resume_idle, on_srv_handle_closed);
    srv->resume = NULL;
    for (struct rt_http_conn *c = srv->conns; c; c = c->next) {
        c->in_resume = 0;
        conn_close(c);
    }
}

void rt_http_server_free(struct rt_http_server *srv)
{
    if (srv->initialized)
        TG_ASSERT(srv->closing && srv->live_handles == 0);
    for (size_t i = 0; i < srv->n_routes; i++) {
        free(srv->routes[i].method);
        free(srv->routes[i].path);
    }
    free(srv->routes);
    while (srv->zombies) {
        struct rt_http_req *z = srv->zombies;
        srv->zombies = z->next_zombie;
        rt__http_req_free(z);
    }
    memset(srv, 0, sizeof(*srv));
}
