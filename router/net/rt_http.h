/*
 * rt_http.h — the router's HTTP/1.1 server (DESIGN.md §2, §5): libuv TCP,
 * Debian's http-parser, a route table, and responses that may complete
 * later (streaming included).
 *
 * What it does:
 * - Keep-alive (HTTP/1.1 default, HTTP/1.0 with "Connection: keep-alive"),
 *   pipelining: requests on one connection are handled strictly one after
 *   another; bytes of later requests are buffered (up to 64 KiB, then
 *   reading pauses) and parsed once the response before them is complete,
 *   so responses always leave in request order.
 * - Request bodies with Content-Length or chunked transfer coding; the
 *   handler always sees the decoded body, NUL-terminated.
 *   "Expect: 100-continue" is answered with 100 Continue when the announced
 *   body fits (and the head check passed), with 413 at once when it does
 *   not.
 * - Strict HTTP/1.1 framing (RFC 9112), because a lenient parser behind a
 *   proxy that reads the same bytes differently is how requests are
 *   smuggled. Refused with 400 and a close: a line ending that is not CRLF
 *   (bare LF or bare CR) in the head, in chunk-size lines and in trailers;
 *   chunk data not followed by CRLF; a header line starting with
 *   whitespace (obs-fold, or whitespace before the first header); a field
 *   name that is not a token ("Host : x"); Content-Length and
 *   Transfer-Encoding together, two Content-Lengths, a malformed one;
 *   chunked applied twice or not last; Transfer-Encoding on HTTP/1.0; an
 *   HTTP/1.1 request without exactly one Host header, or two Host headers,
 *   or a Host value with characters a host cannot have. A transfer coding
 *   other than chunked gets 501; an HTTP major version other than 1 gets
 *   505 (1.x with x > 1 is served as 1.1, RFC 9110 §2.5). Trailer fields
 *   are checked and counted against max_header_bytes, then dropped.
 * - Limits (each answered with a complete JSON error in the OpenAI shape,
 *   "code" always a string (rt_http_status_code), then a graceful close:
 *   FIN after the response, unread input drained for up to linger_ms so
 *   the client is not reset before it reads the answer): request line +
 *   headers over max_header_bytes -> 431; body over max_body_bytes -> 413
 *   (known from Content-Length up front, from a chunk's announced size,
 *   or while chunks arrive); the body budget (below) full -> 503 with
 *   Retry-After; the head not complete within header_timeout_ms of its
 *   first byte, or the body not within body_timeout_ms of the end of the
 *   head -> 408; a malformed request -> 400. An idle keep-alive connection
 *   is closed quietly after idle_timeout_ms. A request refused before its
 *   body was read (head check, 413 announced, budget) whose body is over
 *   RT_HTTP_LINGER_BODY_MAX bytes or of unknown length (chunked) is not
 *   drained: reading stops, the answer and a FIN go out, and the socket
 *   closes as soon as they are written, so a refused client cannot make
 *   the server read (and throw away) what it keeps sending. A body must
 *   also keep arriving at min_body_rate bytes per second (checked every
 *   body_rate_window_ms, bytes waiting in the kernel counted): a slower
 *   one gets 408 and a close, so a trickling upload holds neither its
 *   connection nor its share of the body budget for the whole
 *   body_timeout_ms.
 * - Head check: rt_http_server_on_head() installs a callback that sees
 *   each request's head before any body byte is read (authentication);
 *   a refusal is answered at once and the connection closed, so an
 *   unauthenticated client can never make the server buffer a body.
 * - Body budget: with cfg.body_budget, a body's announced length (its
 *   Content-Length, or a chunk's size) must fit what the budget has free
 *   when announced, and every body buffer is charged to it before it is
 *   allocated, growing as the bytes arrive (rt_conn_body_grow), and given
 *   back when the request is freed or its body taken
 *   (rt_http_req_take_body, which moves the charge with it). A request
 *   whose body does not fit gets 503 (code "body_memory_full", Retry-After
 *   retry_after_s) before any of its body is read, or, when other bodies
 *   took the room while it arrived, as soon as it no longer fits.
 * - Connections (router/net/rt_conn.h, the set shared with the gRPC server):
 *   at most max_connections are open, at most max_connections_per_ip of
 *   one client address. A new connection at a limit takes the place of
 *   the oldest idle connection (keep-alive between requests, connected and
 *   silent, or lingering after a close), else of the slowest incomplete
 *   request head, else of the slowest incomplete body, each of which gets
 *   408; when every connection is busy (a request past its body) the new
 *   one takes a place of the probe reserve if there is one, where only the
 *   probe routes are served (rt_http_route_set_probe), anything else
 *   getting the 503 with Retry-After it would have had at once; otherwise
 *   it gets that 503 and is closed. Accepting pauses (never spins, never
 *   resets pending clients) while the process is out of descriptors.
 * - Slow readers: a connection whose queued response bytes make no
 *   progress for send_timeout_ms (the client stopped reading) is closed,
 *   which aborts its request. A streaming producer bounds what it queues
 *   with rt_http_req_pending_bytes() and rt_http_req_on_drain().
 * - Half-close: a client that shuts down its sending side after a complete
 *   request still gets its response(s) (RFC 9112 §9.6), then the
 *   connection closes. To tell that apart from a client that closed
 *   entirely, a request that has no response bytes yet is probed with an
 *   interim "100 Continue" (HTTP/1.1 only; clients must accept unsolicited
 *   1xx, RFC 9110 §15.2): a closed socket answers it with a reset, which
 *   aborts the request within about a quarter second.
 * - Routes: method + exact path (or a path prefix, when the route's path
 *   ends with '*'). HEAD is served by the GET route of the path when it
 *   has no HEAD route of its own (the same status and headers, no body;
 *   RFC 9110 §9.3.2). A known path with another method gets 405 with an
 *   Allow header; an unknown path gets 404.
 * - Responses: rt_http_respond() for a whole body with Content-Length, or
 *   rt_http_stream_begin()/write()/end() for streaming (SSE): chunked
 *   transfer coding on HTTP/1.1, close-delimited on HTTP/1.0.
 *
 * Request handles and aborts. The handler receives a `struct rt_http_req *`
 * that is also the response handle. It may respond inside the handler or
 * keep the handle and respond later from the loop thread. The handle stays
 * valid until the response is complete (rt_http_respond() returned, or
 * rt_http_stream_end() returned). If the client goes away first (EOF,
 * reset, write error, server close):
 * - with an abort callback set (rt_http_req_on_abort), it fires exactly
 *   once; the handle is freed when it returns and must not be used after.
 *   Inside the callback every response call returns TG_ECANCELED.
 * - without one, the handle becomes a detached "zombie": every response
 *   call returns TG_ECANCELED, and the final one (rt_http_respond or
 *   rt_http_stream_end) frees it. rt_http_server_free() frees zombies left.
 * EOF from the client while its request is in flight is a half-close, not
 * going away (see above); a reset or a failed write is.
 *
 * Threading: everything — handlers, callbacks and every rt_http_* call —
 * runs on the thread of the server's uv loop. Library code: never prints.
 * The process must ignore SIGPIPE (libuv writes with write(2), and a
 * client that is gone must give EPIPE, not kill the process).
 *
 * Implementation: rt_http.c (connections, limits, dispatch),
 * rt_http_parse.c (parser callbacks and the strictness checks),
 * rt_http_resp.c (responses) and rt_http_server.c (init, routes, listen,
 * close), sharing rt_http_internal.h.
 */
#ifndef RT_HTTP_H
#define RT_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "router/net/rt_conn.h"

/* Bytes of the read buffer the connections of one server share. */
#define RT_HTTP_READ_BUF 65536

/* A refused request's unread body is drained (lingering close) only up to
 * this many bytes; beyond, or of unknown length, the socket is closed
 * once the answer is written. */
#define RT_HTTP_LINGER_BODY_MAX 65536

struct rt_http_req;
struct rt_http_conn;

/* Called once per complete request on the loop thread. `ud` is the route's
 * user data. The handler must eventually finish the response through the
 * handle (now or later) unless the request is aborted first. */
typedef void (*rt_http_handler_fn)(struct rt_http_req *req, void *ud);

/* Called once when the client of an unfinished request goes away; `ud` is
 * the value given to rt_http_req_on_abort(). The handle is freed after it
 * returns. */
typedef void (*rt_http_abort_fn)(struct rt_http_req *req, void *ud);

/* Called once by rt_http_server_close() when every handle is closed. */
typedef void (*rt_http_closed_fn)(void *ud);

/* Called once, from the loop, when the bytes queued on the request's
 * connection fell to the low mark given to rt_http_req_on_drain(). */
typedef void (*rt_http_drain_fn)(struct rt_http_req *req, void *ud);

/* What a head check answers instead of serving a request. The strings
 * must outlive the call (static text). */
struct rt_http_refusal {
    int status;                  /* 400..599 */
    const char *type;            /* OpenAI error type; NULL: the default of
                                    rt_http_respond_error() */
    const char *message;         /* NULL: the reason phrase */
    const char *code;            /* the error's "code" string; NULL: the
                                    status's (rt_http_status_code) */
    const char *header;          /* one extra response header line without
                                    CRLF ("WWW-Authenticate: Bearer"), or
                                    NULL */
};

/* Called once per request when its head is complete and valid, before any
 * body byte is read: method, path, query, version and headers of `req`
 * are set; body is not. Returns 0 to go on (read the body, dispatch), or
 * nonzero after filling *out to refuse: the server then answers out->status
 * with a JSON error, closes the connection, and never reads the body. It
 * must not call any rt_http_* function on `req`. */
typedef int (*rt_http_head_fn)(const struct rt_http_req *req, void *ud,
                               struct rt_http_refusal *out);

struct rt_http_config {
    size_t max_header_bytes;     /* request line + header bytes (trailers
                                    included); over -> 431 (default 16384,
                                    min 256; http-parser's own 80 KiB cap
                                    applies above that) */
    size_t max_body_bytes;       /* decoded body bytes; over -> 413
                                    (default 8 MiB) */
    uint32_t idle_timeout_ms;    /* keep-alive idle close, also for a new
                                    connection that sends nothing (default
                                    60000; 0 = never) */
    uint32_t header_timeout_ms;  /* first byte of a request to the end of
                                    its head; over -> 408 (default 10000;
                                    0 = never) */
    uint32_t body_timeout_ms;    /* end of the head to the end of the body;
                                    over -> 408 (default 60000; 0 = never) */
    uint32_t min_body_rate;      /* bytes per second a body must arrive at,
                                    in every window of body_rate_window_ms
                                    from the end of its head (the rest of
                                    the body when less is left); slower ->
                                    408 (default 16384; 0 = no minimum) */
    uint32_t body_rate_window_ms; /* that window (default 5000, at least
                                     100) */
    uint32_t send_timeout_ms;    /* queued response bytes that make no
                                    progress this long: the client stopped
                                    reading, the connection is closed and
                                    its request aborted. Also bounds the
                                    flush of a final response (default
                                    60000; 0 = never) */
    uint32_t linger_ms;          /* input drain after a final response before
                                    the socket closes (default 1000, 0 = close
                                    at once) */
    uint32_t max_connections;    /* open connections (default 4096; 0 = no
                                    limit) */
    uint32_t max_connections_per_ip; /* open connections of one client
                                    address (default 256; 0 = no limit) */
    uint32_t probe_reserve;          /* connections beyond both caps that serve
                                        only the probe routes
                                        (rt_http_route_set_probe), for
                                        health checks under any load (default
                                        16; 0 = none) */
    uint32_t probe_per_ip;           /* of them, at most this many of one
                                        client address (default 4; 0 = no
                                        limit) */
    uint32_t retry_after_s;      /* Retry-After of the 503 that refuses a
                                    connection over the limit or a body
                                    over the budget (default 1) */
    int backlog;                 /* listen(2) backlog (default 511) */
    struct rt_conn_budget *body_budget; /* the account request bodies are
                                    charged to (shared with other servers;
                                    must outlive this one); NULL: none */
};

/* Counters of the server since init, for metrics (the connection counts
 * are the set's: srv->set.stats). Readable by callers. */
struct rt_http_stats {
    uint64_t timeout_header;     /* 408: head not complete in time */
    uint64_t timeout_body;       /* 408: body not complete in time */
    uint64_t slow_bodies;        /* 408: body under min_body_rate */
    uint64_t malformed;          /* 400 / 501 / 505 from parsing */
    uint64_t too_large;          /* 413 / 431 */
    uint64_t refused_head;       /* refused by the head check */
    uint64_t refused_budget;     /* 503: the body budget was full */
    uint64_t probes_served;      /* requests served on a connection of the
                                    probe reserve */
    uint64_t slow_readers;       /* closed by send_timeout_ms */
    uint64_t half_closed;        /* requests still in flight when their
                                    client half-closed */
};

/* One request header, both strings NUL-terminated, name as sent. */
struct rt_http_header {
    const char *name;
    const char *value;
};

struct rt_http_route {
    char *method;                /* "GET", "POST" ... (owned copy) */
    char *path;                  /* exact path, or prefix + '*' (owned copy) */
    size_t prefix_len;           /* bytes before '*'; 0 for exact routes */
    int probe;                   /* served on a probe reserve connection */
    rt_http_handler_fn handler;
    void *ud;
};

/* The server. The caller owns the storage; fields are private to rt_http.c
 * except where a comment says a caller may read them. */
struct rt_http_server {
    uv_loop_t *loop;
    struct rt_http_config cfg;
    struct rt_conn_set set;      /* the listener and the connections with
                                    their limits; readable: set.port (bound
                                    after listen), set.n_live (what
                                    max_connections counts), set.n_open
                                    (closing ones included), set.stats
                                    (accepted, refused, evicted) */
    uv_idle_t resume_idle;       /* resumes connections whose async response
                                    completed, outside the caller's stack */
    uv_timer_t peer_timer;       /* checks half-closed clients (see top) */
    struct rt_http_route *routes;/* (n_routes) */
    size_t n_routes, cap_routes;
    struct rt_http_conn *resume; /* singly linked list to resume */
    struct rt_http_conn *peers;  /* half-closed with a request in flight */
    struct rt_http_req *zombies; /* detached requests (see above) */
    rt_http_head_fn on_head;
    void *on_head_ud;
    char *rbuf;                  /* (RT_HTTP_READ_BUF) read buffer shared by
                                    every connection: input is copied out
                                    (or dropped) in the read callback */
    uint64_t n_requests;         /* readable: requests dispatched so far */
    struct rt_http_stats stats;  /* readable */
    int live_handles, closing, initialized;
    rt_http_closed_fn on_closed;
    void *on_closed_ud;
};

/* A request, also its response handle. The public fields are read-only
 * and valid while the handle is; the rest is private to rt_http.c. */
struct rt_http_req {
    const char *method;          /* "GET", "POST" ... (static string) */
    const char *path;            /* path of the target, without the query,
                                    not percent-decoded */
    const char *query;           /* after '?', "" when none */
    int http_major, http_minor;
    const struct rt_http_header *headers; /* (n_headers) in arrival order */
    size_t n_headers;
    const char *body;            /* (body_len) decoded, NUL-terminated */
    size_t body_len;

    /* private */
    struct rt_http_conn *conn;   /* NULL once detached */
    struct rt_http_server *srv;
    struct rt_http_req *next_zombie;
    char *hbuf;                  /* url and header strings, NUL-separated */
    size_t hlen, hcap;
    size_t *hoffs;               /* (2 * cap_hdrs) name/value offsets in hbuf */
    struct rt_http_header *hdrs; /* (n_hdrs), built when headers end */
    size_t n_hdrs, cap_hdrs;
    char *bbuf;                  /* body bytes + NUL */
    size_t blen, bcap;
    size_t body_total;           /* announced length (Content-Length);
                                    0 = none or chunked */
    size_t charged;              /* bytes of bbuf charged to the budget */
    char *rhdrs;                 /* extra response header lines */
    size_t rhlen;
    rt_http_abort_fn on_abort;
    void *abort_ud;
    int state;                   /* RQ_* in rt_http.c */
    int keep_alive;              /* client allows keep-alive */
    int in_abort;
    int is_head;                 /* HEAD: send no body bytes */
    size_t url_len;              /* bytes of the target at hbuf[0] */
    int last_cb;                 /* parser callback seen last (CB_* in .c) */
    int head_done;               /* headers complete: later fields are
                                    trailers */
    rt_http_drain_fn on_drain;   /* armed by rt_http_req_on_drain */
    void *drain_ud;
    size_t drain_low;
};

/* Fills `cfg` with the defaults listed in struct rt_http_config. */
void rt_http_config_default(struct rt_http_config *cfg);

/* Initialises `srv` on `loop` with a copy of `cfg` (NULL = defaults).
 * Returns 0, TG_EINVAL (a limit out of range; detail in err) or
 * TG_ENOMEM. On failure `srv` is safe to pass to rt_http_server_free().
 * Loop thread. */
int rt_http_server_init(struct rt_http_server *srv, uv_loop_t *loop,
                        const struct rt_http_config *cfg, char *err,
                        size_t errlen);

/* Installs the head check (see rt_http_head_fn; NULL removes it), run for
 * every request after this call. Loop thread. */
void rt_http_server_on_head(struct rt_http_server *srv, rt_http_head_fn fn,
                            void *ud);

/* Adds a route: requests whose method equals `method` and whose path
 * equals `path` (or starts with it minus a trailing '*') go to `handler`
 * with `ud`. The first matching route wins. Strings are copied. Returns 0,
 * TG_EINVAL (empty method, path not starting with '/') or TG_ENOMEM.
 * Call before or after listening, on the loop thread. */
int rt_http_route_add(struct rt_http_server *srv, const char *method,
                      const char *path, rt_http_handler_fn handler, void *ud,
                      char *err, size_t errlen);

/* Marks every route of exactly `path` (GET and HEAD, say) as a probe: a
 * connection in the probe reserve (rt_conn.h) is served these and nothing
 * else. Returns 0, or TG_ENOTFOUND when no route has that path. Loop
 * thread. */
int rt_http_route_set_probe(struct rt_http_server *srv, const char *path);

/* Binds `host` (IPv4 or IPv6 literal) and `port` (0 = any free port; read
 * the result in srv->set.port) and starts accepting (rt_conn_set_listen).
 * Returns 0, TG_EINVAL (bad address, already listening, closing) or TG_EIO
 * (bind/listen failed, detail in err). Loop thread. */
int rt_http_server_listen(struct rt_http_server *srv, const char *host,
                          int port, char *err, size_t errlen);

/* Serves `fd`, a connected stream socket, as if the listener had accepted
 * it: the same limits, parser, timers and responses (rt_conn_set_adopt).
 * For a caller that accepts or pairs sockets itself (socket activation,
 * a socketpair in a test or fuzzing harness). Returns 0 (the server owns
 * fd and closes it with the connection), TG_EINVAL (not initialised, or
 * closing), TG_ENOMEM or TG_EIO (libuv refused the descriptor; fd stays
 * the caller's). Loop thread. */
int rt_http_server_adopt(struct rt_http_server *srv, int fd);

/* Stops accepting and closes every connection, aborting requests in flight
 * (their abort callbacks run before this returns). `on_closed(ud)` (may be
 * NULL) is called from the loop once every handle is closed; run the loop
 * until then before rt_http_server_free(). Calling it twice is a no-op.
 * Loop thread. */
void rt_http_server_close(struct rt_http_server *srv,
                          rt_http_closed_fn on_closed, void *ud);

/* Frees the routes and any zombie requests. Safe on a zeroed or
 * failed-init server, and after rt_http_server_close() completed; the
 * server must not have open handles otherwise (a broken invariant). */
void rt_http_server_free(struct rt_http_server *srv);

/* Returns the value of the first request header named `name`
 * (ASCII case-insensitive), or NULL. Valid while the handle is. */
const char *rt_http_req_header(const struct rt_http_req *req,
                               const char *name);

/* The number of request headers named `name` (ASCII case-insensitive). */
size_t rt_http_req_header_count(const struct rt_http_req *req,
                                const char *name);

/* Registers the abort callback of `req` (replacing a previous one). Set it
 * before returning from the handler when responding later. */
void rt_http_req_on_abort(struct rt_http_req *req, rt_http_abort_fn fn,
                          void *ud);

/* Adds a response header line "name: value" to the response not started
 * yet. Returns 0, TG_EINVAL (empty name, CR/LF or ':' in name, CR/LF in
 * value, response already started, or one of the headers the server
 * writes itself: Content-Length, Transfer-Encoding, Connection) or
 * TG_ECANCELED (the client is gone). */
int rt_http_resp_header(struct rt_http_req *req, const char *name,
                        const char *value);

/* Sends a whole response: status line, Content-Type (omitted when
 * `content_type` is NULL), Content-Length, Connection, added headers, and
 * `body` (copied; may be NULL when len is 0). The handle is freed before
 * this returns, whatever the result. Returns 0, TG_EINVAL (status outside
 * 200..599, a body with 204/304, CR/LF in content_type, response already
 * started — the handle is then NOT freed), TG_ECANCELED (client gone) or TG_ENOMEM / TG_EIO (the connection
 * is closed). */
int rt_http_respond(struct rt_http_req *req, int status,
                    const char *content_type, const char *body, size_t len);

/* rt_http_respond() with the JSON error body of the OpenAI API:
 * {"error":{"message":msg,"type":type,"param":null,"code":code}}.
 * `type` NULL means "invalid_request_error" below 500, else
 * "server_error"; `code` NULL means rt_http_status_code(status). Same
 * returns and ownership as rt_http_respond(). */
int rt_http_respond_error(struct rt_http_req *req, int status,
                          const char *type, const char *msg,
                          const char *code);

/* Moves the request's body out of the handle into *out (with its charge
 * against the body budget), for work that outlives the handle or runs
 * off the loop; the handle's body becomes "" (length 0), and a body taken
 * twice is "" the second time. Returns 0, or TG_ECANCELED (the client is
 * gone) or TG_ENOMEM, with *out zeroed. Free *out with
 * rt_conn_body_free() on the loop thread. */
int rt_http_req_take_body(struct rt_http_req *req, struct rt_conn_body *out);

/* Starts a streaming response: status line, Content-Type, added headers,
 * and "Transfer-Encoding: chunked" (HTTP/1.1) or "Connection: close"
 * (HTTP/1.0, close-delimited). Returns 0, TG_EINVAL (status outside
 * 200..599 or 204/304, CR/LF in content_type, already started),
 * TG_ECANCELED or TG_EIO. The handle stays valid. */
int rt_http_stream_begin(struct rt_http_req *req, int status,
                         const char *content_type);

/* Queues `len` bytes of body (copied; len 0 is a no-op) as one chunk.
 * Returns 0, TG_EINVAL (not streaming), TG_ECANCELED (client gone) or
 * TG_ENOMEM / TG_EIO (the connection will be closed from the loop, which
 * then runs the abort path; the handle stays valid until then). */
int rt_http_stream_write(struct rt_http_req *req, const void *data,
                         size_t len);

/* Ends a streaming response (the last chunk, or closing the connection on
 * HTTP/1.0). The handle is freed before this returns, except on TG_EINVAL
 * (not streaming). Returns 0, TG_EINVAL, TG_ECANCELED or TG_EIO. */
int rt_http_stream_end(struct rt_http_req *req);

/* Bytes queued on the connection but not yet written to the socket (0 when
 * the client is gone); lets a streaming producer apply backpressure. */
size_t rt_http_req_pending_bytes(const struct rt_http_req *req);

/* Arms `fn(req, ud)` to be called once, from the loop (never inside a
 * response call), when the bytes queued on req's connection fall to `low`
 * or below; replaces one armed before. It is not called once the handle is
 * gone (final response, abort). Returns 0, TG_EAGAIN when no more than
 * `low` bytes are queued now (nothing armed: just write), or TG_ECANCELED
 * (the client is gone). */
int rt_http_req_on_drain(struct rt_http_req *req, size_t low,
                         rt_http_drain_fn fn, void *ud);

/* Returns the standard reason phrase of `status` ("OK", "Not Found" ...),
 * or "Unknown" for codes it does not know. Thread-safe. */
const char *rt_http_status_reason(int status);

/* Returns the error "code" string the server gives an error of `status`
 * when nobody names one: "malformed_request" (400), "unauthorized" (401),
 * "not_found" (404), "method_not_allowed" (405), "request_timeout" (408),
 * "request_too_large" (413), "headers_too_large" (431),
 * "internal_error" (500), "not_implemented" (501),
 * "service_unavailable" (503), "http_version_not_supported" (505),
 * "http_error" for others. Static; thread-safe. */
const char *rt_http_status_code(int status);

#endif /* RT_HTTP_H */
