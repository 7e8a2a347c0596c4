/*
 * rt_http_resp.c — the response side of the HTTP server (see rt_http.h):
 * whole responses with Content-Length, streams with chunked coding (or
 * close-delimited on HTTP/1.0), OpenAI-shaped error bodies, and the rules
 * for handles whose client went away (abort callback or zombie).
 */
#include "router/net/rt_http_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_err.h"

const char *rt_http_status_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

static int has_crlf(const char *s)
{
    return strpbrk(s, "\r\n") != NULL;
}

const char *rt_http_status_code(int status)
{
    switch (status) {
    case 400: return "malformed_request";
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 408: return "request_timeout";
    case 413: return "request_too_large";
    case 431: return "headers_too_large";
    case 500: return "internal_error";
    case 501: return "not_implemented";
    case 503: return "service_unavailable";
    case 505: return "http_version_not_supported";
    default: return "http_error";
    }
}

/* The JSON error body of the OpenAI API; malloc'ed, NULL on OOM. */
char *rt_http__error_json(int status, const char *type, const char *msg,
                          const char *code)
{
    if (!type)
        type = status < 500 ? "invalid_request_error" : "server_error";
    json_t *doc = json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message",
                            msg ? msg : rt_http_status_reason(status), "type",
                            type, "param", "code",
                            code ? code : rt_http_status_code(status));
    if (!doc)
        return NULL;
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return s;
}

size_t rt_http__error_response(char *buf, size_t cap, int status,
                               const char *type, const char *msg,
                               const char *code, unsigned retry_after_s,
                               const char *extra)
{
    char m[301];
    snprintf(m, sizeof(m), "%s", msg ? msg : rt_http_status_reason(status));
    char *body = rt_http__error_json(status, type, m, code);
    const char *b = body ? body
                         : "{\"error\":{\"message\":\"out of memory\","
                           "\"type\":\"server_error\",\"param\":null,"
                           "\"code\":\"internal_error\"}}";
    char ra[48] = "";
    if (retry_after_s)
        snprintf(ra, sizeof(ra), "Retry-After: %u\r\n", retry_after_s);
    int n = snprintf(buf, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n%s%s%sConnection: close\r\n"
                     "\r\n%s",
                     status, rt_http_status_reason(status), strlen(b), ra,
                     extra ? extra : "", extra ? "\r\n" : "", b);
    free(body);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

static void zombie_remove(struct rt_http_server *srv, struct rt_http_req *req)
{
    for (struct rt_http_req **pp = &srv->zombies; *pp;
         pp = &(*pp)->next_zombie) {
        if (*pp == req) {
            *pp = req->next_zombie;
            return;
        }
    }
}

/* Releases a detached request on its final call (zombie only). */
static int detached_final(struct rt_http_req *req)
{
    if (!req->in_abort) {
        zombie_remove(req->srv, req);
        rt_http__req_free(req);
    }
    return TG_ECANCELED;
}

/* ---- responses ---------------------------------------------------------- */

/* Common checks of a response call; returns 0 when the request is attached
 * and in one of the states allowed by `mask` (bit per RQ_*). */
static int req_check(struct rt_http_req *req, unsigned mask)
{
    if (!req->conn)
        return TG_ECANCELED;
    if (!(mask & (1u << req->state)))
        return TG_EINVAL;
    if (req->conn->want_close)
        return TG_ECANCELED;
    return 0;
}

/* req_check for a call that ends the response (state `state`): a request
 * cancelled meanwhile is finished here, detached (released) or attached to
 * a connection that failed (its handle freed), and TG_ECANCELED returned. */
static int final_check(struct rt_http_req *req, int state)
{
    int rc = req_check(req, 1u << state);
    if (rc != TG_ECANCELED)
        return rc;
    if (!req->conn)
        return detached_final(req);
    req->conn->cur = NULL;
    rt_http__req_free(req);
    return TG_ECANCELED;
}

/* The response is complete: free the handle, then keep the connection
 * going (next pipelined request) or end it. */
static void req_complete(struct rt_http_req *req, int keep)
{
    struct rt_http_conn *conn = req->conn;
    TG_ASSERT(conn && conn->cur == req);
    conn->cur = NULL;
    rt_http__req_free(req);
    if (!keep)
        rt_http__conn_finish(conn);
    else if (!conn->in_dispatch)
        rt_http__resume_later(conn);
}

static int write_head(struct rt_http_req *req, int status,
                      const char *content_type, int streaming,
                      size_t content_len, int keep, const char *body,
                      size_t body_len)
{
    struct tg_buf h = {0};
    tg_buf_printf(&h, "HTTP/1.1 %d %s\r\n", status,
                  rt_http_status_reason(status));
    if (content_type)
        tg_buf_printf(&h, "Content-Type: %s\r\n", content_type);
    if (streaming) {
        if (req->http_minor >= 1 || req->http_major > 1)
            tg_buf_puts(&h, "Transfer-Encoding: chunked\r\n");
    } else if (status != 204 && status != 304) {
        tg_buf_printf(&h, "Content-Length: %zu\r\n", content_len);
    }
    if (!keep)
        tg_buf_puts(&h, "Connection: close\r\n");
    else if (req->http_major == 1 && req->http_minor == 0)
        tg_buf_puts(&h, "Connection: keep-alive\r\n");
    if (req->rhdrs)
        tg_buf_append(&h, req->rhdrs, req->rhlen);
    tg_buf_puts(&h, "\r\n");
    int rc;
    if (!tg_buf_failed(&h)) {
        rc = rt_http__write(req->conn, h.data, h.len, body, body_len, NULL, 0);
    } else {
        rc = TG_ENOMEM;
        req->conn->want_close = 1;
        rt_http__resume_later(req->conn);
    }
    tg_buf_free(&h);
    return rc;
}

static int is_reserved_header(const char *name)
{
    return strcasecmp(name, "Content-Length") == 0 ||
           strcasecmp(name, "Transfer-Encoding") == 0 ||
           strcasecmp(name, "Connection") == 0;
}

int rt_http_resp_header(struct rt_http_req *req, const char *name,
                        const char *value)
{
    int rc = req_check(req, 1u << RQ_HANDLER);
    if (rc < 0)
        return rc;
    if (!name || !*name || !value || has_crlf(name) || strchr(name, ':') ||
        has_crlf(value) || is_reserved_header(name))
        return TG_EINVAL;
    size_t nl = strlen(name), vl = strlen(value);
    char *p = realloc(req->rhdrs, req->rhlen + nl + vl + 5);
    if (!p)
        return TG_ENOMEM;
    memcpy(p + req->rhlen, name, nl);
    memcpy(p + req->rhlen + nl, ": ", 2);
    memcpy(p + req->rhlen + nl + 2, value, vl);
    memcpy(p + req->rhlen + nl + 2 + vl, "\r\n", 3); /* with the NUL */
    req->rhdrs = p;
    req->rhlen += nl + vl + 4;
    return 0;
}

const char *rt_http_req_header(const struct rt_http_req *req,
                               const char *name)
{
    for (size_t i = 0; i < req->n_headers; i++)
        if (strcasecmp(req->headers[i].name, name) == 0)
            return req->headers[i].value;
    return NULL;
}

size_t rt_http_req_header_count(const struct rt_http_req *req, const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < req->n_headers; i++)
        n += strcasecmp(req->headers[i].name, name) == 0;
    return n;
}

void rt_http_req_on_abort(struct rt_http_req *req, rt_http_abort_fn fn,
                          void *ud)
{
    if (!req->conn)
        return;
    req->on_abort = fn;
    req->abort_ud = ud;
}

int rt_http_respond(struct rt_http_req *req, int status,
                    const char *content_type, const char *body, size_t len)
{
    int rc = final_check(req, RQ_HANDLER);
    if (rc < 0)
        return rc;
    if (status < 200 || status > 599 ||
        ((status == 204 || status == 304) && len > 0) || (len && !body) ||
        (content_type && has_crlf(content_type)))
        return TG_EINVAL;
    struct rt_http_conn *conn = req->conn;
    int keep = req->keep_alive && !conn->srv->closing &&
               !rt_http__conn_last(conn);
    rc = write_head(req, status, content_type, 0, len, keep,
                    req->is_head ? NULL : body, req->is_head ? 0 : len);
    if (rc < 0) {
        conn->cur = NULL;
        rt_http__req_free(req);
        return rc;
    }
    req_complete(req, keep);
    return 0;
}

int rt_http_respond_error(struct rt_http_req *req, int status,
                          const char *type, const char *msg, const char *code)
{
    char *body = rt_http__error_json(status, type, msg, code);
    if (!body) {
        static const char fallback[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":"
            "\"server_error\",\"param\":null,\"code\":\"internal_error\"}}";
        return rt_http_respond(req, status, "application/json", fallback,
                               sizeof(fallback) - 1);
    }
    int rc = rt_http_respond(req, status, "application/json", body,
                             strlen(body));
    free(body);
    return rc;
}

int rt_http_req_take_body(struct rt_http_req *req, struct rt_conn_body *out)
{
    memset(out, 0, sizeof(*out));
    if (!req->conn)
        return TG_ECANCELED;
    if (req->bbuf) {
        out->data = req->bbuf;
        out->len = req->blen;
    } else {
        out->data = strdup("");
        if (!out->data)
            return TG_ENOMEM;
    }
    out->charged = req->charged;
    out->budget = req->srv->cfg.body_budget;
    req->bbuf = NULL;
    req->blen = req->bcap = req->charged = 0;
    req->body = "";
    req->body_len = 0;
    return 0;
}

int rt_http_stream_begin(struct rt_http_req *req, int status,
                         const char *content_type)
{
    int rc = req_check(req, 1u << RQ_HANDLER);
    if (rc < 0)
        return rc;
    if (status < 200 || status > 599 || status == 204 || status == 304 ||
        (content_type && has_crlf(content_type)))
        return TG_EINVAL;
    int http10 = req->http_major == 1 && req->http_minor == 0;
    /* HTTP/1.0 has no chunked coding: the body ends when we close. */
    int keep = req->keep_alive && !http10 && !req->conn->srv->closing &&
               !rt_http__conn_last(req->conn);
    rc = write_head(req, status, content_type, 1, 0, keep, NULL, 0);
    if (rc < 0)
        return rc;
    req->keep_alive = keep;
    req->state = RQ_STREAMING;
    return 0;
}

int rt_http_stream_write(struct rt_http_req *req, const void *data,
                         size_t len)
{
    int rc = req_check(req, 1u << RQ_STREAMING);
    if (rc < 0)
        return rc;
    if (len == 0 || req->is_head)
        return 0;
    if (!data)
        return TG_EINVAL;
    if (req->http_major == 1 && req->http_minor == 0)
        return rt_http__write(req->conn, data, len, NULL, 0, NULL, 0);
    char size_line[24];
    int n = snprintf(size_line, sizeof(size_line), "%zx\r\n", len);
    return rt_http__write(req->conn, size_line, (size_t)n, data, len, "\r\n",
                          2);
}

int rt_http_stream_end(struct rt_http_req *req)
{
    int rc = final_check(req, RQ_STREAMING);
    if (rc < 0)
        return rc;
    int http10 = req->http_major == 1 && req->http_minor == 0;
    if (!http10 && !req->is_head) {
        static const char last[] = "0\r\n\r\n";
        rc = rt_http__write(req->conn, last, sizeof(last) - 1, NULL, 0, NULL,
                         0);
        if (rc < 0) {
            req->conn->cur = NULL;
            rt_http__req_free(req);
            return rc;
        }
    }
    req_complete(req, req->keep_alive && !req->conn->srv->closing &&
                          !rt_http__conn_last(req->conn));
    return 0;
}

size_t rt_http_req_pending_bytes(const struct rt_http_req *req)
{
    if (!req->conn)
        return 0;
    return uv_stream_get_write_queue_size((const uv_stream_t *)&req->conn->base.tcp);
}

int rt_http_req_on_drain(struct rt_http_req *req, size_t low,
                         rt_http_drain_fn fn, void *ud)
{
    if (!req->conn || req->conn->want_close || req->conn->closing)
        return TG_ECANCELED;
    req->on_drain = NULL;
    if (rt_http_req_pending_bytes(req) <= low)
        return TG_EAGAIN;
    /* The write callbacks of rt_http.c call it as the queue drains. */
    req->on_drain = fn;
    req->drain_ud = ud;
    req->drain_low = low;
    return 0;
}
