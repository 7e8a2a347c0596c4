/*
 * rt_http_parse.c — request parsing for the HTTP/1.1 server (see rt_http.h):
 * the http-parser callbacks that collect a request, and the checks that
 * make the server strict where Debian's http-parser 2.9 is lenient.
 *
 * The shared library is built without HTTP_PARSER_STRICT, so it accepts a
 * bare LF (or any byte after a CR) as a line end, chunk data followed by
 * anything instead of CRLF, obs-fold continuation lines, whitespace
 * between a field name and its colon, any "HTTP/d.d" version, and no Host.
 * A front proxy that frames the same bytes differently lets a client
 * smuggle a second request past it (RFC 9112 §11.2), so every such message
 * is refused here (400 and close) instead:
 *
 * - Framing bytes: everything the parser consumes outside body data — the
 *   request line and headers, chunk-size lines, the CRLF after chunk data,
 *   trailers — is checked as it is consumed: every line ends in CRLF
 *   (RFC 9112 §2.2), chunk data is followed by exactly CRLF (§7.1), and no
 *   line after a non-empty one starts with SP or HTAB (obs-fold §5.2, or
 *   whitespace before the first header §2.2). The body callback tells the
 *   data apart: the bytes before each piece of data are framing.
 * - The head, once complete: version 1.x (else 505), field names are
 *   tokens (§5.1: no whitespace before the colon), exactly one Host on
 *   HTTP/1.1 and at most one otherwise, with a value a host can have
 *   (§3.2), and Transfer-Encoding only on HTTP/1.1 and only "chunked"
 *   exactly once, last (§6.1; another coding gets 501). Content-Length
 *   with Transfer-Encoding, and a repeated or malformed Content-Length,
 *   are refused by the parser itself.
 * - Chunk sizes are checked against max_body_bytes when announced, so a
 *   huge chunk is refused before any of it is read.
 */
#include "router/net/rt_http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

static struct rt_http_conn *pconn(http_parser *p)
{
    return p->data;
}

/* Refuses the input being parsed with `status`, a static message and
 * "code" (NULL: the status's). */
static int refuse_code(struct rt_http_conn *conn, int status,
                       const char *msg, const char *code)
{
    if (conn->error_status == 0) {
        conn->error_status = status;
        conn->error_msg = msg;
        conn->error_code = code;
    }
    return -1;
}

static int refuse(struct rt_http_conn *conn, int status, const char *msg)
{
    return refuse_code(conn, status, msg, NULL);
}

/* The body budget cannot hold more: 503 before any of the body is read. */
static int refuse_budget(struct rt_http_conn *conn)
{
    return refuse_code(conn, 503,
                       "the server holds as many request bodies as its "
                       "memory budget allows (--max-body-memory); retry "
                       "shortly",
                       "body_memory_full");
}

/* Makes room for `want` body bytes (plus the NUL) in req->bbuf, growing
 * it as rt_conn_body_grow says (the bytes arrive; the body's announced
 * length, when known, caps it) and charging what it allocates to the body
 * budget first. Returns 0 or -1 after refusing (503 budget, 500 out of
 * memory). */
static int body_reserve(struct rt_http_conn *conn, struct rt_http_req *req,
                        size_t want)
{
    if (want + 1 <= req->bcap)
        return 0;
    size_t total = req->body_total ? req->body_total + 1 : 0;
    size_t need = rt_conn_body_grow(req->bcap, want + 1, total,
                                    conn->srv->cfg.max_body_bytes + 1);
    struct rt_conn_budget *b = conn->srv->cfg.body_budget;
    if (rt_conn_budget_take(b, need - req->bcap) != 0)
        return refuse_budget(conn);
    char *p = realloc(req->bbuf, need);
    if (!p) {
        rt_conn_budget_give(b, need - req->bcap);
        return refuse(conn, 500, NULL);
    }
    req->charged += need - req->bcap;
    p[req->blen] = '\0'; /* the body so far stays a string (empty too) */
    req->bbuf = p;
    req->bcap = need;
    return 0;
}

/* ---- framing bytes ---------------------------------------------------- */

/* Checks framing bytes p[0..end) in stream order (see the top). Returns 0,
 * or -1 after refusing the input. */
static int scan_framing(struct rt_http_conn *conn, const char *p,
                        const char *end)
{
    for (; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (conn->crlf_need == 2) {
            if (c != '\r')
                return refuse(conn, 400, "chunk data not followed by CRLF");
            conn->crlf_need = 1;
            continue;
        }
        if (conn->crlf_need == 1) {
            if (c != '\n')
                return refuse(conn, 400, "chunk data not followed by CRLF");
            conn->crlf_need = 0;
            conn->line_len = 0;
            conn->prev_nonempty = 0;
            continue;
        }
        if (conn->prev_cr) {
            if (c != '\n')
                return refuse(conn, 400, "CR not followed by LF");
            conn->prev_cr = 0;
            conn->prev_nonempty = conn->line_len > 0;
            conn->line_len = 0;
            continue;
        }
        if (c == '\r') {
            conn->prev_cr = 1;
            continue;
        }
        if (c == '\n')
            return refuse(conn, 400, "line ending is a bare LF, not CRLF");
        if (conn->line_len == 0 && conn->prev_nonempty &&
            (c == ' ' || c == '\t'))
            return refuse(conn, 400,
                          "header line starts with whitespace (obs-fold "
                          "line folding is not accepted)");
        conn->line_len++;
    }
    return 0;
}

size_t rt_http__parse(struct rt_http_conn *conn, const char *data,
                      size_t len, enum http_errno *e)
{
    conn->scan_at = data;
    size_t n = http_parser_execute(&conn->parser, &rt_http__parser_settings,
                                   data, len);
    *e = HTTP_PARSER_ERRNO(&conn->parser);
    if ((*e == HPE_OK || *e == HPE_PAUSED) && conn->error_status == 0)
        scan_framing(conn, conn->scan_at, data + n);
    conn->scan_at = NULL;
    /* A request the parser completed in this call but a check refused
     * (its framing, scanned only now) is never dispatched: it goes back
     * to "being received", which dropping it frees, instead of becoming
     * a zombie that lives until the server closes. */
    if (conn->error_status && conn->cur && conn->cur->state == RQ_HANDLER)
        conn->cur->state = RQ_PARSING;
    return n;
}

/* ---- collecting the request ------------------------------------------- */

/* Counts request-line, header and trailer bytes against the limit. */
static int hdr_account(struct rt_http_conn *conn, size_t n)
{
    conn->hdr_bytes += n;
    if (conn->hdr_bytes > conn->srv->cfg.max_header_bytes)
        return refuse(conn, 431, NULL);
    return 0;
}

static int on_message_begin(http_parser *p)
{
    struct rt_http_conn *conn = pconn(p);
    TG_ASSERT(conn->cur == NULL);
    struct rt_http_req *req = calloc(1, sizeof(*req));
    if (!req)
        return refuse(conn, 500, NULL);
    req->conn = conn;
    req->srv = conn->srv;
    req->state = RQ_PARSING;
    conn->cur = req;
    conn->base.used = 1; /* no longer a fresh connection (rt_conn.h) */
    conn->hdr_bytes = 0;
    conn->chunk_left = 0;
    return 0;
}

/* Terminates the string being collected in hbuf (url, name or value). */
static int hbuf_terminate(struct rt_http_req *req)
{
    return rt_http__buf_append(&req->hbuf, &req->hlen, &req->hcap, "", 1);
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    if (hdr_account(conn, n) < 0)
        return -1;
    req->last_cb = CB_URL;
    req->url_len += n;
    if (rt_http__buf_append(&req->hbuf, &req->hlen, &req->hcap, at, n) < 0)
        return refuse(conn, 500, NULL);
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    /* A new header also costs its ": " and CRLF. */
    if (hdr_account(conn, n + (req->last_cb != CB_FIELD ? 4 : 0)) < 0)
        return -1;
    if (req->head_done) {
        /* A trailer: counted, checked for framing, then dropped (RFC 9110
         * §6.5.1 lets a recipient discard trailers; hbuf must not move
         * under the header pointers the handler will read). */
        req->last_cb = CB_FIELD;
        return 0;
    }
    if (req->last_cb != CB_FIELD) {
        /* A new header: close the previous string, record the name. */
        if (hbuf_terminate(req) < 0)
            return refuse(conn, 500, NULL);
        /* hoffs holds (name, value) pairs: cap_hdrs counts pairs. */
        if (tg_grow((void **)&req->hoffs, &req->cap_hdrs, req->n_hdrs + 1,
                    2 * sizeof(*req->hoffs)))
            return refuse(conn, 500, NULL);
        req->hoffs[2 * req->n_hdrs] = req->hlen;
        req->hoffs[2 * req->n_hdrs + 1] = req->hlen; /* empty value */
        req->n_hdrs++;
        req->last_cb = CB_FIELD;
    }
    if (rt_http__buf_append(&req->hbuf, &req->hlen, &req->hcap, at, n) < 0)
        return refuse(conn, 500, NULL);
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    if (hdr_account(conn, n) < 0)
        return -1;
    if (req->head_done) {
        req->last_cb = CB_VALUE;
        return 0;
    }
    if (req->last_cb != CB_VALUE) {
        if (hbuf_terminate(req) < 0)
            return refuse(conn, 500, NULL);
        req->hoffs[2 * (req->n_hdrs - 1) + 1] = req->hlen;
        req->last_cb = CB_VALUE;
    }
    if (rt_http__buf_append(&req->hbuf, &req->hlen, &req->hcap, at, n) < 0)
        return refuse(conn, 500, NULL);
    return 0;
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
        rc = rt_http__buf_append(&req->hbuf, &req->hlen, &req->hcap, tmp,
                                 plen + 1);
    *query_off = req->hlen;
    if (rc == 0)
        rc = rt_http__buf_append(&req->hbuf, &req->hlen, &req->hcap,
                                 tmp + plen + 1, qlen);
    free(tmp);
    return rc < 0 ? -2 : 0;
}

/* ---- head checks ------------------------------------------------------ */

/* tchar of RFC 9110 §5.6.2. */
static int is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9'))
        return 1;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int is_token(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s; s++)
        if (!is_tchar((unsigned char)*s))
            return 0;
    return 1;
}

/* A Host value: uri-host [ ":" port ] of RFC 3986 — reg-name characters
 * (unreserved, pct-encoded, sub-delims), an IP literal in brackets, and
 * the port's digits; empty is allowed (RFC 9112 §3.2). */
static int host_value_ok(const char *v)
{
    for (; *v; v++) {
        unsigned char c = (unsigned char)*v;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            (c >= '0' && c <= '9'))
            continue;
        if (!strchr("-._~%!$&'()*+,;=:[]", c))
            return 0;
    }
    return 1;
}

/* The Transfer-Encoding rules of RFC 9112 §6.1 over every
 * Transfer-Encoding line of the request. Returns 0, or -1 after refusing. */
static int check_transfer_encoding(struct rt_http_conn *conn,
                                   const struct rt_http_req *req)
{
    int n_te = 0, n_chunked = 0, last_chunked = 0;
    for (size_t i = 0; i < req->n_hdrs; i++) {
        if (strcasecmp(req->hdrs[i].name, "Transfer-Encoding") != 0)
            continue;
        n_te++;
        /* A comma-separated list; empty elements are ignored (§5.6.1). */
        const char *s = req->hdrs[i].value;
        while (*s) {
            while (*s == ' ' || *s == '\t' || *s == ',')
                s++;
            if (!*s)
                break;
            const char *b = s;
            while (*s && *s != ',')
                s++;
            const char *e = s;
            while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
                e--;
            size_t n = (size_t)(e - b);
            if (n == 7 && strncasecmp(b, "chunked", 7) == 0) {
                n_chunked++;
                last_chunked = 1;
            } else if (memchr(b, ';', n) != NULL &&
                       strncasecmp(b, "chunked", 7) == 0) {
                return refuse(conn, 400,
                              "the chunked transfer coding takes no "
                              "parameters");
            } else {
                return refuse(conn, 501,
                              "transfer codings other than chunked are not "
                              "supported");
            }
        }
    }
    if (n_te == 0)
        return 0;
    if (req->http_major == 1 && req->http_minor == 0)
        return refuse(conn, 400,
                      "Transfer-Encoding in an HTTP/1.0 request");
    if (n_chunked != 1 || !last_chunked)
        return refuse(conn, 400,
                      "Transfer-Encoding must name chunked exactly once");
    if (!(conn->parser.flags & F_CHUNKED))
        return refuse(conn, 400, "malformed Transfer-Encoding");
    return 0;
}

/* The checks of the whole head (see the top). Returns 0 or -1 after
 * refusing. */
static int check_head(struct rt_http_conn *conn, const struct rt_http_req *req)
{
    if (req->http_major != 1)
        return refuse(conn, 505, "only HTTP/1.0 and HTTP/1.1 are served");
    int n_host = 0;
    for (size_t i = 0; i < req->n_hdrs; i++) {
        if (!is_token(req->hdrs[i].name))
            return refuse(conn, 400,
                          "a header field name is not a token (whitespace "
                          "before the colon?)");
        if (strcasecmp(req->hdrs[i].name, "Host") == 0) {
            n_host++;
            if (!host_value_ok(req->hdrs[i].value))
                return refuse(conn, 400, "invalid Host header");
        }
    }
    if (n_host > 1)
        return refuse(conn, 400, "more than one Host header");
    if (n_host == 0 && req->http_minor >= 1)
        return refuse(conn, 400, "HTTP/1.1 request without a Host header");
    return check_transfer_encoding(conn, req);
}

static int on_headers_complete(http_parser *p)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    struct rt_http_server *srv = conn->srv;
    size_t path_off, query_off;
    int rc = split_target(req, p->method == HTTP_CONNECT, &path_off,
                          &query_off);
    if (rc < 0)
        return refuse(conn, rc == -1 ? 400 : 500,
                      rc == -1 ? "malformed request target" : NULL);
    if (req->n_hdrs) {
        req->hdrs = malloc(req->n_hdrs * sizeof(*req->hdrs));
        if (!req->hdrs)
            return refuse(conn, 500, NULL);
    }
    /* hbuf does not move from here on: pointers are stable. */
    for (size_t i = 0; i < req->n_hdrs; i++) {
        req->hdrs[i].name = req->hbuf + req->hoffs[2 * i];
        req->hdrs[i].value = req->hbuf + req->hoffs[2 * i + 1];
    }
    req->head_done = 1;
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
    if (check_head(conn, req) < 0)
        return -1;
    /* A connection that holds a place of the probe reserve serves a
     * probe and nothing else, then closes; anything else gets the answer
     * the connection caps would have given. */
    if (conn->base.probe) {
        req->keep_alive = 0;
        if (!rt_http__probe_route(srv, req)) {
            int per_ip = conn->base.probe == RT_CONN_REFUSE_PER_IP ||
                         conn->base.probe == -RT_CONN_REFUSE_PER_IP;
            rt_conn_probe_refused(&conn->base);
            return refuse_code(conn, 503,
                               per_ip ? "too many connections from this "
                                        "address"
                                      : "the server is at its connection "
                                        "limit",
                               per_ip ? "connection_limit_per_address"
                                      : "connection_limit");
        }
    }

    /* The head check runs before any body byte is read or announced
     * (100 Continue): a refused client never gets to send a body. */
    if (srv->on_head) {
        struct rt_http_refusal r = {0};
        if (srv->on_head(req, srv->on_head_ud, &r) != 0) {
            if (r.status < 400 || r.status > 599)
                r.status = 403;
            conn->refusal = r;
            srv->stats.refused_head++;
            return refuse(conn, r.status, r.message);
        }
    }
    int chunked = (p->flags & F_CHUNKED) != 0;
    if (!chunked && p->content_length != ULLONG_MAX &&
        p->content_length > srv->cfg.max_body_bytes)
        return refuse(conn, 413, NULL);
    /* A known length must fit what the budget has free now; it is charged
     * as it arrives (rt_conn.h, "Budget"). */
    if (!chunked && p->content_length != ULLONG_MAX && p->content_length > 0) {
        req->body_total = (size_t)p->content_length;
        if (!rt_conn_budget_fits(srv->cfg.body_budget, req->body_total + 1))
            return refuse_budget(conn);
    }
    const char *expect = rt_http_req_header(req, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0 &&
        req->http_minor >= 1) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        rt_http__write(conn, cont, sizeof(cont) - 1, NULL, 0, NULL, 0);
    }
    return 0;
}

static int on_chunk_header(http_parser *p)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    /* content_length holds the announced chunk size here. */
    size_t max = conn->srv->cfg.max_body_bytes;
    if (p->content_length > max - req->blen)
        return refuse(conn, 413, NULL);
    conn->chunk_left = p->content_length;
    /* The chunk must fit what the budget has free now; it is charged as
     * it arrives. */
    size_t grow = req->blen + (size_t)p->content_length + 1;
    if (grow > req->bcap &&
        !rt_conn_budget_fits(conn->srv->cfg.body_budget, grow - req->bcap))
        return refuse_budget(conn);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct rt_http_conn *conn = pconn(p);
    struct rt_http_req *req = conn->cur;
    /* Everything the parser consumed before this data was framing. */
    if (conn->scan_at) {
        if (scan_framing(conn, conn->scan_at, at) < 0)
            return -1;
        conn->scan_at = at + n;
    }
    if (p->flags & F_CHUNKED) {
        if (n > conn->chunk_left)
            return refuse(conn, 400, "chunk longer than its size");
        conn->chunk_left -= n;
        if (conn->chunk_left == 0 && n > 0)
            conn->crlf_need = 2;
    }
    if (req->blen + n > conn->srv->cfg.max_body_bytes)
        return refuse(conn, 413, NULL);
    if (body_reserve(conn, req, req->blen + n) < 0)
        return -1;
    memcpy(req->bbuf + req->blen, at, n);
    req->blen += n;
    req->bbuf[req->blen] = '\0';
    conn->base.bytes = req->blen;
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

const http_parser_settings rt_http__parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_chunk_header = on_chunk_header,
    .on_message_complete = on_message_complete,
};
