/*
 * rt_grpc_call.c — gRPC calls (see rt_grpc.h, rt_grpc_internal.h): request
 * headers, checks and admission, the 5-byte message framing (one message,
 * or a stream of them for bidirectional calls), responses and trailers,
 * cancellation, and the small encoders. Deadlines are in rt_grpc_timer.c.
 *
 * Wire format (gRPC PROTOCOL-HTTP2.md): a request is HEADERS (:method
 * POST, :path /Service/Method, content-type application/grpc[+proto],
 * te: trailers, optional grpc-timeout), then DATA carrying
 * Length-Prefixed-Messages (1 byte compressed flag, 4 bytes big-endian
 * length, the message). A response is HEADERS (:status 200, content-type),
 * DATA with messages, then trailing HEADERS with grpc-status and
 * grpc-message; or "trailers-only": one HEADERS frame with END_STREAM that
 * carries the status. A response always ends the stream; when the request
 * side is still open (an early error), the server then sends RST_STREAM
 * NO_ERROR so the client stops sending (RFC 9113 §8.1).
 */
#include "router/net/rt_grpc_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* ---- small encoders ---------------------------------------------------- */

static const char *const status_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *rt_grpc_status_name(int status)
{
    if (status < 0 || status > 16)
        return "UNKNOWN";
    return status_names[status];
}

int rt_grpc_timeout_parse(const char *value, uint64_t *ms)
{
    /* TimeoutValue is 1..8 ASCII digits; TimeoutUnit one of H M S m u n
     * (PROTOCOL-HTTP2.md). */
    if (!value)
        return TG_EFORMAT;
    uint64_t v = 0;
    size_t n = 0;
    while (value[n] >= '0' && value[n] <= '9') {
        if (n == 8)
            return TG_EFORMAT;
        v = v * 10 + (uint64_t)(value[n] - '0');
        n++;
    }
    if (n == 0 || value[n] == '\0' || value[n + 1] != '\0')
        return TG_EFORMAT;
    switch (value[n]) {
    case 'H': *ms = v * 3600000u; break;
    case 'M': *ms = v * 60000u; break;
    case 'S': *ms = v * 1000u; break;
    case 'm': *ms = v; break;
    case 'u': *ms = (v + 999u) / 1000u; break;
    case 'n': *ms = (v + 999999u) / 1000000u; break;
    default: return TG_EFORMAT;
    }
    return 0;
}

size_t rt_grpc_message_encode(const char *msg, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t need = 0, w = 0;
    for (const unsigned char *p = (const unsigned char *)(msg ? msg : "");
         *p; p++) {
        /* Percent-Encoded: bytes outside 0x20..0x7E and '%' itself
         * (PROTOCOL-HTTP2.md, "Status-Message"). */
        int esc = *p < 0x20 || *p > 0x7E || *p == '%';
        size_t k = esc ? 3 : 1;
        if (out && w == need && need + k < cap) {
            if (esc) {
                out[w++] = '%';
                out[w++] = hex[*p >> 4];
                out[w++] = hex[*p & 15];
            } else {
                out[w++] = (char)*p;
            }
        }
        need += k;
    }
    if (out && cap)
        out[w] = '\0';
    return need;
}

/* ---- lifetime ---------------------------------------------------------- */

/* What a bidi message costs the body budget. */
static size_t inmsg_charge(const struct rt_grpc_inmsg *m)
{
    return sizeof(*m) + m->len;
}

static void inmsg_free(struct rt_grpc_call *call, struct rt_grpc_inmsg *m)
{
    if (!m)
        return;
    rt_conn_budget_give(call->srv->cfg.body_budget, inmsg_charge(m));
    free(m);
}

/* Frees the unary message buffer and gives its charge back. */
static void mbuf_free(struct rt_grpc_call *call)
{
    free(call->mbuf);
    call->mbuf = NULL;
    rt_conn_budget_give(call->srv->cfg.body_budget, call->mcharged);
    call->mcharged = 0;
}

void rt_grpc__call_free(struct rt_grpc_call *call)
{
    if (!call)
        return;
    while (call->inq) {
        struct rt_grpc_inmsg *m = call->inq;
        call->inq = m->next;
        inmsg_free(call, m);
    }
    inmsg_free(call, call->in_cur);
    free(call->hbuf);
    free(call->hoffs);
    free(call->hdrs);
    mbuf_free(call);
    free(call->out);
    free(call->fin_msg);
    free(call);
}

static void maybe_free(struct rt_grpc_call *call)
{
    if (call->conn || call->user_holds || call->pinned)
        return;
    if (call->is_zombie) {
        struct rt_grpc_server *srv = call->srv;
        if (call->prev)
            call->prev->next = call->next;
        else
            srv->zombies = call->next;
        if (call->next)
            call->next->prev = call->prev;
    }
    rt_grpc__call_free(call);
}

struct rt_grpc_call *rt_grpc__call_new(struct rt_grpc_conn *conn,
                                       int32_t stream_id)
{
    struct rt_grpc_call *call = calloc(1, sizeof(*call));
    if (!call)
        return NULL;
    call->conn = conn;
    call->conn_id = conn->id;
    call->srv = conn->srv;
    call->stream_id = stream_id;
    conn->base.used = 1; /* no longer a fresh connection (rt_conn.h) */
    call->path = "";
    call->next = conn->calls;
    if (conn->calls)
        conn->calls->prev = call;
    conn->calls = call;
    conn->n_calls++;
    /* The whole request, headers included, has recv_timeout_ms. */
    call->recv_deadline_ms = uv_now(call->srv->loop) +
                             call->srv->cfg.recv_timeout_ms;
    rt_grpc__deadline_arm(call->srv, call->recv_deadline_ms);
    return call;
}

/* Takes the handle away from the handler: the cancel callback runs (and
 * the handle is released), or the handle turns into a zombie. The call
 * stays allocated until the caller lets go (maybe_free). */
static void cancel_user(struct rt_grpc_call *call, int status)
{
    call->canceled = 1;
    call->srv->n_cancels++;
    if (call->on_cancel) {
        call->pinned++;
        call->in_cancel = 1;
        call->on_cancel(call, status, call->cancel_ud);
        call->in_cancel = 0;
        call->user_holds = 0;
        call->pinned--;
    }
}

int rt_grpc__call_in_progress(const struct rt_grpc_call *call)
{
    return call->state == CS_DISPATCHED && call->user_holds &&
           !call->canceled && !call->finishing;
}

void rt_grpc__call_stream_gone(struct rt_grpc_call *call)
{
    struct rt_grpc_conn *conn = call->conn;
    if (conn) {
        if (call->prev)
            call->prev->next = call->next;
        else
            conn->calls = call->next;
        if (call->next)
            call->next->prev = call->prev;
        call->prev = call->next = NULL;
        if (call->on_ready) {
            /* Reset by the client before its handler ran or its input
             * was delivered. */
            for (struct rt_grpc_call **pp = &conn->ready; *pp;
                 pp = &(*pp)->next_ready) {
                if (*pp == call) {
                    *pp = call->next_ready;
                    break;
                }
            }
            conn->ready_tail = NULL;
            for (struct rt_grpc_call *c = conn->ready; c; c = c->next_ready)
                conn->ready_tail = c;
            call->on_ready = 0;
            call->next_ready = NULL;
        }
        if (call->state == CS_READY)
            call->state = CS_REJECTED;
        conn->n_calls--;
        call->conn = NULL;
    }
    if (call->user_holds && !call->canceled)
        cancel_user(call, RT_GRPC_CANCELLED);
    if (call->user_holds && !call->is_zombie) {
        struct rt_grpc_server *srv = call->srv;
        call->is_zombie = 1;
        call->prev = NULL;
        call->next = srv->zombies;
        if (srv->zombies)
            srv->zombies->prev = call;
        srv->zombies = call;
    }
    maybe_free(call);
}

/* ---- responses --------------------------------------------------------- */

#define NV(n, v)                                                         \
    {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v),           \
     NGHTTP2_NV_FLAG_NONE}

static ssize_t data_read(nghttp2_session *s, int32_t sid, uint8_t *buf,
                         size_t length, uint32_t *flags,
                         nghttp2_data_source *src, void *ud)
{
    struct rt_grpc_call *call = src->ptr;
    (void)ud;
    size_t avail = call->out_len - call->out_off;
    size_t n = avail < length ? avail : length;
    if (n) {
        memcpy(buf, call->out + call->out_off, n);
        call->out_off += n;
        if (call->out_off == call->out_len)
            call->out_off = call->out_len = 0;
    }
    if (call->out_len == call->out_off) {
        if (!call->finishing) {
            if (n)
                return (ssize_t)n;
            call->deferred = 1;
            return NGHTTP2_ERR_DEFERRED;
        }
        /* All messages out: end the DATA part, status goes in trailers. */
        char st[16];
        snprintf(st, sizeof(st), "%d", call->fin_status);
        nghttp2_nv tr[2] = {NV("grpc-status", st), {0}};
        size_t ntr = 1;
        if (call->fin_msg && call->fin_msg[0]) {
            nghttp2_nv m = NV("grpc-message", call->fin_msg);
            tr[ntr++] = m;
        }
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        if (nghttp2_submit_trailer(s, sid, tr, ntr) != 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    return (ssize_t)n;
}

static int submit_headers(struct rt_grpc_call *call, int http_status,
                          int trailers_only)
{
    char hs[8], st[16];
    snprintf(hs, sizeof(hs), "%d", http_status);
    snprintf(st, sizeof(st), "%d", call->fin_status);
    nghttp2_nv nva[5] = {
        NV(":status", hs),
        NV("content-type", "application/grpc"),
        NV("grpc-accept-encoding", "identity"),
    };
    size_t n = 3;
    if (trailers_only) {
        nghttp2_nv s = NV("grpc-status", st);
        nva[n++] = s;
        if (call->fin_msg && call->fin_msg[0]) {
            nghttp2_nv m = NV("grpc-message", call->fin_msg);
            nva[n++] = m;
        }
        call->headers_sent = 1;
        return nghttp2_submit_response(call->conn->ng, call->stream_id, nva,
                                       n, NULL);
    }
    nghttp2_data_provider dp;
    dp.source.ptr = call;
    dp.read_callback = data_read;
    call->headers_sent = 1;
    return nghttp2_submit_response(call->conn->ng, call->stream_id, nva, n,
                                   &dp);
}

/* Sets the final status and lets the response end (after queued
 * messages). The stream must still exist. */
static int server_finish(struct rt_grpc_call *call, int status,
                         const char *message, int http_status)
{
    struct rt_grpc_conn *conn = call->conn;
    call->finishing = 1;
    call->fin_status = status;
    /* Only calls a handler took count as activity of the connection:
     * answering streams that never got that far (refused, timed out) must
     * not keep a connection open forever. */
    if (call->state == CS_DISPATCHED)
        rt_grpc__conn_touch(conn);
    free(call->fin_msg);
    call->fin_msg = NULL;
    if (message && message[0]) {
        size_t need = rt_grpc_message_encode(message, NULL, 0);
        call->fin_msg = malloc(need + 1);
        if (call->fin_msg)
            rt_grpc_message_encode(message, call->fin_msg, need + 1);
    }
    int rv = 0;
    if (!call->headers_sent) {
        rv = submit_headers(call, http_status, 1);
    } else if (call->deferred) {
        call->deferred = 0;
        rv = nghttp2_session_resume_data(conn->ng, call->stream_id);
    }
    if (rv != 0)
        nghttp2_submit_rst_stream(conn->ng, NGHTTP2_FLAG_NONE,
                                  call->stream_id, NGHTTP2_INTERNAL_ERROR);
    rt_grpc__conn_flush_later(conn);
    return rv != 0 ? TG_ENOMEM : 0;
}

void rt_grpc__call_reject(struct rt_grpc_call *call, int status,
                          int http_status, const char *message)
{
    call->state = CS_REJECTED;
    mbuf_free(call);
    call->msg = NULL;
    call->mlen = call->mwant = call->mcap = 0;
    inmsg_free(call, call->in_cur);
    call->in_cur = NULL;
    server_finish(call, status, message, http_status);
}

void rt_grpc__call_fail(struct rt_grpc_call *call, int cancel_status,
                        int status, const char *message)
{
    if (call->state != CS_DISPATCHED) {
        if (!call->finishing && call->conn && !call->conn->closing)
            rt_grpc__call_reject(call, status, 200, message);
        return;
    }
    call->pinned++;
    if (call->user_holds && !call->canceled)
        cancel_user(call, cancel_status);
    /* The cancel callback may have closed this connection. */
    if (call->conn && !call->conn->closing && !call->finishing)
        server_finish(call, status, message, 200);
    call->pinned--;
    maybe_free(call);
}

void rt_grpc__call_frame_sent(struct rt_grpc_call *call,
                              const nghttp2_frame *frame)
{
    /* Our side ended while the client is still sending: tell it to stop
     * (RFC 9113 §8.1) instead of reading the rest. */
    if (frame->hd.type == NGHTTP2_HEADERS &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) && !call->req_ended)
        nghttp2_submit_rst_stream(call->conn->ng, NGHTTP2_FLAG_NONE,
                                  call->stream_id, NGHTTP2_NO_ERROR);
}

/* ---- request ----------------------------------------------------------- */

void rt_grpc__call_header(struct rt_grpc_call *call, const uint8_t *name,
                          size_t nlen, const uint8_t *value, size_t vlen)
{
    if (call->state != CS_RECV || call->hdr_overflow)
        return;
    size_t max = call->srv->cfg.max_header_bytes;
    if (call->hlen + nlen + vlen + 2 > max) {
        call->hdr_overflow = 1;
        return;
    }
    /* hoffs holds (name, value) pairs: cap_hdrs counts pairs. */
    if (tg_grow((void **)&call->hoffs, &call->cap_hdrs, call->n_hdrs + 1,
                2 * sizeof(*call->hoffs))) {
        call->hdr_overflow = 1;
        return;
    }
    size_t need = call->hlen + nlen + vlen + 2;
    if (need > call->hcap) {
        /* Grown as needed (strings are kept as offsets until the block
         * ends): a stream still waiting for its request holds what its
         * headers take, not max_header_bytes. */
        size_t cap = call->hcap ? call->hcap : 512;
        while (cap < need)
            cap *= 2;
        if (cap > max)
            cap = max;
        char *b = realloc(call->hbuf, cap);
        if (!b) {
            call->hdr_overflow = 1;
            return;
        }
        call->hbuf = b;
        call->hcap = cap;
    }
    /* nghttp2 hands out names and values that may contain NUL only when
     * they are invalid, which it rejects before this callback. */
    call->hoffs[2 * call->n_hdrs] = call->hlen;
    memcpy(call->hbuf + call->hlen, name, nlen);
    call->hlen += nlen;
    call->hbuf[call->hlen++] = '\0';
    call->hoffs[2 * call->n_hdrs + 1] = call->hlen;
    memcpy(call->hbuf + call->hlen, value, vlen);
    call->hlen += vlen;
    call->hbuf[call->hlen++] = '\0';
    call->n_hdrs++;
}

static int content_type_ok(const char *ct)
{
    static const char base[] = "application/grpc";
    if (!ct || strncasecmp(ct, base, sizeof(base) - 1) != 0)
        return 0;
    const char *r = ct + sizeof(base) - 1;
    if (*r == '\0' || *r == ';')
        return 1;
    return strncasecmp(r, "+proto", 6) == 0 && (r[6] == '\0' || r[6] == ';');
}

void rt_grpc__call_headers_done(struct rt_grpc_call *call)
{
    if (call->state != CS_RECV)
        return;
    struct rt_grpc_server *srv = call->srv;
    char msg[256];
    call->headers_done = 1;
    if (call->hdr_overflow) {
        snprintf(msg, sizeof(msg), "request headers exceed %zu bytes",
                 srv->cfg.max_header_bytes);
        rt_grpc__call_reject(call, RT_GRPC_RESOURCE_EXHAUSTED, 200, msg);
        return;
    }
    if (call->n_hdrs) {
        call->hdrs = malloc(call->n_hdrs * sizeof(*call->hdrs));
        if (!call->hdrs) {
            rt_grpc__call_reject(call, RT_GRPC_RESOURCE_EXHAUSTED, 200,
                                 "out of memory");
            return;
        }
        for (size_t i = 0; i < call->n_hdrs; i++) {
            call->hdrs[i].name = call->hbuf + call->hoffs[2 * i];
            call->hdrs[i].value = call->hbuf + call->hoffs[2 * i + 1];
        }
    }
    call->headers = call->hdrs;
    call->n_headers = call->n_hdrs;
    const char *path = rt_grpc_call_header(call, ":path");
    const char *method = rt_grpc_call_header(call, ":method");
    if (path)
        call->path = path;
    if (!method || strcmp(method, "POST") != 0) {
        rt_grpc__call_reject(call, RT_GRPC_UNIMPLEMENTED, 405,
                             "gRPC requires POST");
        return;
    }
    if (!content_type_ok(rt_grpc_call_header(call, "content-type"))) {
        rt_grpc__call_reject(call, RT_GRPC_INVALID_ARGUMENT, 415,
                             "content-type must be application/grpc or "
                             "application/grpc+proto");
        return;
    }
    const char *te = rt_grpc_call_header(call, "te");
    if (!te || strcasecmp(te, "trailers") != 0) {
        rt_grpc__call_reject(call, RT_GRPC_INVALID_ARGUMENT, 200,
                             "missing header 'te: trailers'");
        return;
    }
    const char *to = rt_grpc_call_header(call, "grpc-timeout");
    uint64_t deadline = 0;
    if (to) {
        uint64_t ms;
        if (rt_grpc_timeout_parse(to, &ms) != 0) {
            snprintf(msg, sizeof(msg), "malformed grpc-timeout '%.64s'", to);
            rt_grpc__call_reject(call, RT_GRPC_INVALID_ARGUMENT, 200, msg);
            return;
        }
        uint64_t when = uv_now(srv->loop) + ms;
        deadline = when ? when : 1;
    }
    if (srv->closing) {
        rt_grpc__call_reject(call, RT_GRPC_UNAVAILABLE, 200,
                             "the server is shutting down");
        return;
    }
    /* A connection holding a place of the probe reserve (rt_conn.h) is
     * served health checks only; anything else gets what the connection
     * caps would have answered. */
    if (call->conn->base.probe &&
        strcmp(call->path, RT_GRPC_PROBE_METHOD) != 0) {
        rt_conn_probe_refused(&call->conn->base);
        rt_grpc__call_reject(call, RT_GRPC_UNAVAILABLE, 200,
                             "the server is at its connection limit; this "
                             "connection serves health checks only");
        return;
    }
    /* Admission before the method lookup: a refused client gets the same
     * answer for a real method and an unknown one. */
    if (srv->admit) {
        msg[0] = '\0';
        int st = srv->admit(call, srv->admit_ud, msg, sizeof(msg));
        if (st != RT_GRPC_OK) {
            rt_grpc__call_reject(call,
                                 st >= 0 && st <= 16 ? st : RT_GRPC_INTERNAL,
                                 200, msg[0] ? msg : "refused");
            return;
        }
    }
    for (size_t i = 0; i < srv->n_methods; i++) {
        if (strcmp(srv->methods[i].path, call->path) == 0) {
            call->handler = srv->methods[i].handler;
            call->handler_ud = srv->methods[i].ud;
            call->kind = srv->methods[i].kind;
            break;
        }
    }
    if (!call->handler) {
        snprintf(msg, sizeof(msg), "unknown method %.120s", call->path);
        rt_grpc__call_reject(call, RT_GRPC_UNIMPLEMENTED, 200, msg);
        return;
    }
    call->deadline_ms = deadline;
    if (deadline)
        rt_grpc__deadline_arm(srv, deadline);
    if (call->kind == RT_GRPC_BIDI_STREAM) {
        /* The handler runs now; each message must then arrive within
         * recv_timeout_ms of the one before. */
        call->state = CS_READY;
        call->recv_deadline_ms = uv_now(srv->loop) + srv->cfg.recv_timeout_ms;
        rt_grpc__deadline_arm(srv, call->recv_deadline_ms);
        rt_grpc__ready_push(call);
    }
}

/* Still taking request bytes: before dispatch, or a bidi call whose input
 * is open and which nobody is ending. */
static int receiving(const struct rt_grpc_call *call)
{
    if (call->state == CS_RECV)
        return 1;
    return call->kind == RT_GRPC_BIDI_STREAM && !call->req_ended &&
           !call->finishing && !call->canceled &&
           (call->state == CS_READY || call->state == CS_DISPATCHED);
}

/* A complete message of a bidi call: queued for delivery after the
 * current read. */
static void bidi_message_done(struct rt_grpc_call *call)
{
    struct rt_grpc_server *srv = call->srv;
    struct rt_grpc_inmsg *m = call->in_cur;
    call->in_cur = NULL;
    call->prefix_got = 0;
    m->next = NULL;
    if (call->inq_tail)
        call->inq_tail->next = m;
    else
        call->inq = m;
    call->inq_tail = m;
    call->inq_bytes += m->len;
    call->n_msgs++;
    if (call->inq_bytes > 2 * srv->cfg.max_message_bytes) {
        rt_grpc__call_fail(call, RT_GRPC_CANCELLED, RT_GRPC_RESOURCE_EXHAUSTED,
                           "too many request messages waiting to be read");
        return;
    }
    call->recv_deadline_ms = uv_now(srv->loop) + srv->cfg.recv_timeout_ms;
    rt_grpc__deadline_arm(srv, call->recv_deadline_ms);
    rt_grpc__ready_push(call);
}

/* Bytes allocated (and charged) for the message being assembled with room
 * for `cap` payload bytes: a bidi message with its queue header, a unary
 * one at least one byte. */
static size_t msg_alloc_size(const struct rt_grpc_call *call, size_t cap)
{
    if (call->kind == RT_GRPC_BIDI_STREAM && call->state != CS_RECV)
        return sizeof(struct rt_grpc_inmsg) + cap;
    return cap ? cap : 1;
}

static void budget_full(struct rt_grpc_call *call)
{
    rt_grpc__event(call->srv, RT_GRPC_EVENT_BUDGET);
    rt_grpc__call_fail(call, RT_GRPC_CANCELLED, RT_GRPC_UNAVAILABLE,
                       "the server holds as many request messages as "
                       "its memory budget allows (--max-body-memory); "
                       "retry shortly");
}

/* Makes room for `want` payload bytes of the message being assembled,
 * growing its buffer as the bytes arrive (rt_conn_body_grow; the announced
 * length caps it) and charging the budget before allocating. Returns 0, or
 * -1 when the call was answered with an error. */
static int msg_room(struct rt_grpc_call *call, size_t want)
{
    int bidi = call->kind == RT_GRPC_BIDI_STREAM && call->state != CS_RECV;
    int have = bidi ? call->in_cur != NULL : call->mbuf != NULL;
    if (have && want <= call->mcap)
        return 0;
    size_t cap = call->mwant
                     ? rt_conn_body_grow(call->mcap, want, call->mwant, 0)
                     : 0;
    size_t was = have ? msg_alloc_size(call, call->mcap) : 0;
    size_t now = msg_alloc_size(call, cap);
    struct rt_conn_budget *b = call->srv->cfg.body_budget;
    if (rt_conn_budget_take(b, now - was) != 0) {
        budget_full(call);
        return -1;
    }
    void *p = realloc(bidi ? (void *)call->in_cur : (void *)call->mbuf, now);
    if (!p) {
        rt_conn_budget_give(b, now - was);
        rt_grpc__call_fail(call, RT_GRPC_CANCELLED, RT_GRPC_RESOURCE_EXHAUSTED,
                           "out of memory for the request message");
        return -1;
    }
    if (bidi) {
        call->in_cur = p;
        call->in_cur->len = cap; /* its charge (inmsg_charge) */
    } else {
        call->mbuf = p;
        call->mcharged = now;
    }
    call->mcap = cap;
    return 0;
}

/* A message prefix is complete: checks it and makes room for the payload.
 * Returns 0, or -1 when the call was answered with an error. */
static int message_begin(struct rt_grpc_call *call)
{
    char msg[160];
    const uint8_t *p = call->prefix;
    uint32_t n = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 8 | (uint32_t)p[4];
    int bidi = call->kind == RT_GRPC_BIDI_STREAM && call->state != CS_RECV;
    if (p[0] == 1) {
        rt_grpc__call_fail(call, RT_GRPC_CANCELLED, RT_GRPC_UNIMPLEMENTED,
                           "compression not supported");
        return -1;
    }
    if (p[0] != 0) {
        snprintf(msg, sizeof(msg), "bad message flag %u (expected 0)", p[0]);
        rt_grpc__call_fail(call, RT_GRPC_CANCELLED, RT_GRPC_INVALID_ARGUMENT,
                           msg);
        return -1;
    }
    if (!bidi && call->n_msgs >= 1) {
        rt_grpc__call_reject(call, RT_GRPC_INVALID_ARGUMENT, 200,
                             "expected exactly one request message, got more");
        return -1;
    }
    if (n > call->srv->cfg.max_message_bytes) {
        snprintf(msg, sizeof(msg),
                 "request message of %u bytes exceeds the limit of %zu bytes",
                 n, call->srv->cfg.max_message_bytes);
        rt_grpc__event(call->srv, RT_GRPC_EVENT_TOO_LARGE);
        rt_grpc__call_fail(call, RT_GRPC_CANCELLED,
                           RT_GRPC_RESOURCE_EXHAUSTED, msg);
        return -1;
    }
    /* The announced length must fit what the budget has free now; the
     * message is charged as it arrives (rt_conn.h, "Budget"). */
    if (!rt_conn_budget_fits(call->srv->cfg.body_budget,
                             msg_alloc_size(call, n))) {
        budget_full(call);
        return -1;
    }
    call->mwant = n;
    call->mlen = 0;
    call->mcap = 0;
    return msg_room(call, 0);
}

void rt_grpc__call_data(struct rt_grpc_call *call, const uint8_t *data,
                        size_t len)
{
    while (len && receiving(call)) {
        if (call->prefix_got < 5) {
            size_t k = 5 - call->prefix_got;
            if (k > len)
                k = len;
            memcpy(call->prefix + call->prefix_got, data, k);
            call->prefix_got += k;
            data += k;
            len -= k;
            if (call->prefix_got < 5)
                return;
            if (message_begin(call) != 0)
                return;
        }
        size_t k = call->mwant - call->mlen;
        if (k > len)
            k = len;
        if (msg_room(call, call->mlen + k) != 0)
            return;
        uint8_t *dst = call->in_cur ? call->in_cur->data : call->mbuf;
        memcpy(dst + call->mlen, data, k);
        call->mlen += k;
        data += k;
        len -= k;
        if (call->mlen == call->mwant) {
            if (call->in_cur) {
                bidi_message_done(call);
            } else {
                call->n_msgs++;
                call->prefix_got = 0;
            }
        }
    }
}

void rt_grpc__call_end_stream(struct rt_grpc_call *call)
{
    call->req_ended = 1;
    call->recv_deadline_ms = 0;
    if (call->kind == RT_GRPC_BIDI_STREAM &&
        (call->state == CS_READY || call->state == CS_DISPATCHED)) {
        if (call->finishing || call->canceled)
            return;
        if (call->prefix_got) {
            rt_grpc__call_fail(call, RT_GRPC_CANCELLED,
                               RT_GRPC_INVALID_ARGUMENT,
                               "request stream ended inside a message");
            return;
        }
        call->eos_pending = 1;
        rt_grpc__ready_push(call);
        return;
    }
    if (call->state != CS_RECV)
        return;
    if (call->prefix_got) {
        rt_grpc__call_reject(call, RT_GRPC_INVALID_ARGUMENT, 200,
                             "request stream ended inside a message");
        return;
    }
    if (call->n_msgs != 1) {
        rt_grpc__call_reject(call, RT_GRPC_INVALID_ARGUMENT, 200,
                             "expected exactly one request message, got none");
        return;
    }
    call->msg = call->mwant ? call->mbuf : NULL;
    call->msg_len = call->mwant;
    call->state = CS_READY;
    rt_grpc__ready_push(call);
}

/* Hands a bidi call its queued messages, then the end of its input, while
 * its handler holds it. The call is pinned by the caller. */
static void deliver_input(struct rt_grpc_call *call)
{
    while (call->inq && call->on_message && rt_grpc__call_in_progress(call)) {
        struct rt_grpc_inmsg *m = call->inq;
        call->inq = m->next;
        if (!call->inq)
            call->inq_tail = NULL;
        call->inq_bytes -= m->len;
        call->on_message(call, m->data, m->len, call->message_ud);
        inmsg_free(call, m);
    }
    if (call->eos_pending && !call->inq && call->on_message &&
        rt_grpc__call_in_progress(call)) {
        call->eos_pending = 0;
        call->on_message(call, NULL, 0, call->message_ud);
    }
}

void rt_grpc__call_dispatch(struct rt_grpc_call *call)
{
    struct rt_grpc_server *srv = call->srv;
    if (call->state == CS_READY) {
        if (srv->closing) {
            rt_grpc__call_reject(call, RT_GRPC_UNAVAILABLE, 200,
                                 "the server is shutting down");
            return;
        }
        if (call->deadline_ms && uv_now(srv->loop) >= call->deadline_ms) {
            rt_grpc__event(srv, RT_GRPC_EVENT_DEADLINE);
            rt_grpc__call_reject(call, RT_GRPC_DEADLINE_EXCEEDED, 200,
                                 "deadline exceeded");
            return;
        }
        call->state = CS_DISPATCHED;
        call->user_holds = 1;
        srv->n_calls++;
        rt_grpc__conn_touch(call->conn);
        call->pinned++;
        call->handler(call, call->handler_ud);
        /* The message was the handler's to read during the call. */
        call->msg = NULL;
        call->msg_len = 0;
        mbuf_free(call);
    } else if (call->state == CS_DISPATCHED &&
               call->kind == RT_GRPC_BIDI_STREAM) {
        call->pinned++;
    } else {
        return;
    }
    if (call->kind == RT_GRPC_BIDI_STREAM)
        deliver_input(call);
    call->pinned--;
    maybe_free(call);
}

/* ---- public call API ---------------------------------------------------- */

const char *rt_grpc_call_header(const struct rt_grpc_call *call,
                                const char *name)
{
    for (size_t i = 0; i < call->n_headers; i++)
        if (strcasecmp(call->headers[i].name, name) == 0)
            return call->headers[i].value;
    return NULL;
}

size_t rt_grpc_call_header_count(const struct rt_grpc_call *call,
                                 const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < call->n_headers; i++)
        n += strcasecmp(call->headers[i].name, name) == 0;
    return n;
}

void rt_grpc_call_on_message(struct rt_grpc_call *call, rt_grpc_message_fn fn,
                             void *ud)
{
    call->on_message = fn;
    call->message_ud = ud;
}

void rt_grpc_call_on_cancel(struct rt_grpc_call *call, rt_grpc_cancel_fn fn,
                            void *ud)
{
    call->on_cancel = fn;
    call->cancel_ud = ud;
}

int rt_grpc_call_send(struct rt_grpc_call *call, const void *msg, size_t len)
{
    if (call->canceled || !call->conn || call->conn->closing)
        return TG_ECANCELED;
    if (call->finishing || len > UINT32_MAX ||
        (call->kind == RT_GRPC_UNARY && call->n_sent >= 1))
        return TG_EINVAL;
    size_t need = call->out_len + 5 + len;
    if (need > call->out_cap) {
        /* Reclaim what nghttp2 already took before growing. */
        if (call->out_off) {
            memmove(call->out, call->out + call->out_off,
                    call->out_len - call->out_off);
            call->out_len -= call->out_off;
            call->out_off = 0;
            need = call->out_len + 5 + len;
        }
        if (TG_GROW(call->out, &call->out_cap, need))
            return TG_ENOMEM;
    }
    uint8_t *w = call->out + call->out_len;
    w[0] = 0; /* not compressed */
    w[1] = (uint8_t)(len >> 24);
    w[2] = (uint8_t)(len >> 16);
    w[3] = (uint8_t)(len >> 8);
    w[4] = (uint8_t)len;
    if (len)
        memcpy(w + 5, msg, len);
    call->out_len += 5 + len;
    call->n_sent++;
    int rv = 0;
    if (!call->headers_sent) {
        rv = submit_headers(call, 200, 0);
    } else if (call->deferred) {
        call->deferred = 0;
        rv = nghttp2_session_resume_data(call->conn->ng, call->stream_id);
    }
    if (rv != 0) {
        call->finishing = 1;
        nghttp2_submit_rst_stream(call->conn->ng, NGHTTP2_FLAG_NONE,
                                  call->stream_id, NGHTTP2_INTERNAL_ERROR);
    }
    rt_grpc__conn_flush_later(call->conn);
    return rv != 0 ? TG_ENOMEM : 0;
}

int rt_grpc_call_finish(struct rt_grpc_call *call, int status,
                        const char *message)
{
    if (status < 0 || status > 16)
        return TG_EINVAL;
    if (call->in_cancel)
        return TG_ECANCELED;
    if (call->canceled || !call->conn || call->conn->closing ||
        call->finishing) {
        call->user_holds = 0;
        maybe_free(call);
        return TG_ECANCELED;
    }
    if (call->kind == RT_GRPC_UNARY && status == RT_GRPC_OK &&
        call->n_sent == 0) {
        status = RT_GRPC_INTERNAL;
        message = "unary handler finished without a response message";
    }
    call->user_holds = 0;
    /* The stream is still open here, so the call lives on until nghttp2
     * closes it after the trailers. */
    return server_finish(call, status, message, 200);
}

int rt_grpc_call_reply(struct rt_grpc_call *call, const void *msg,
                       size_t len)
{
    int rc = rt_grpc_call_send(call, msg, len);
    if (rc == 0)
        return rt_grpc_call_finish(call, RT_GRPC_OK, NULL);
    if (call->in_cancel)
        return rc;
    /* Also releases a cancelled handle (then returns TG_ECANCELED). */
    rt_grpc_call_finish(call, RT_GRPC_INTERNAL,
                        "could not queue the response message");
    return rc;
}

size_t rt_grpc_call_pending_bytes(const struct rt_grpc_call *call)
{
    if (call->canceled || !call->conn)
        return 0;
    return call->out_len - call->out_off;
}
