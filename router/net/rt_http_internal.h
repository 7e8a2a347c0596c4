/*
 * rt_http_internal.h — what rt_http.c (connections, limits, dispatch),
 * rt_http_parse.c (parser callbacks, strictness checks), rt_http_resp.c
 * (responses) and rt_http_server.c (the server object) share. Not for use
 * outside router/rt_http*.c.
 */
#ifndef RT_HTTP_INTERNAL_H
#define RT_HTTP_INTERNAL_H

#include <http_parser.h>

#include "router/net/rt_http.h"

enum {
    RQ_PARSING = 0, /* being received */
    RQ_HANDLER,     /* dispatched, no response bytes yet */
    RQ_STREAMING,   /* stream_begin sent the head */
};

enum { CB_NONE = 0, CB_URL, CB_FIELD, CB_VALUE };

enum {
    TM_NONE = 0,
    TM_HEAD,   /* head arriving: header_timeout_ms from its first byte */
    TM_BODY,   /* body arriving: body_timeout_ms from the end of the head */
    TM_SEND,   /* response bytes unacknowledged: send_timeout_ms without
                  the client acknowledging any (checked 4 times a period) */
    TM_FLUSH,  /* final response flushing before the FIN: same bound */
    TM_LINGER, /* after the FIN: input drained for linger_ms */
};

/* Unparsed input kept while a request is in flight before reading pauses. */
#define PENDING_CAP (64u * 1024u)

struct rt_http_conn {
    struct rt_conn base;              /* the socket and its place in the
                                         server's connection set (first) */
    struct rt_http_server *srv;
    uv_timer_t timer;
    uv_shutdown_t shutdown_req;
    http_parser parser;
    struct rt_http_conn *next_resume;           /* srv->resume */
    struct rt_http_conn *next_peer;             /* srv->peers */
    struct rt_http_req *cur;          /* parsing or in flight; at most one */
    char *pend;                       /* (pend_len) unparsed input from
                                         pend_off on */
    size_t pend_off, pend_len, pend_cap;
    size_t hdr_bytes;                 /* request line + header (and
                                         trailer) bytes so far */
    int error_status;                 /* set by a callback refusing input */
    const char *error_msg;            /* its message (static), or NULL */
    const char *error_code;           /* its "code" (static), or NULL for
                                         the status's */
    struct rt_http_refusal refusal;   /* the head check's, when it refused */
    /* Framing check of the bytes the parser consumes outside bodies
     * (rt_http_parse.c): the head, chunk-size lines, the CRLF after chunk
     * data, trailers. */
    const char *scan_at;              /* next unchecked byte of the buffer
                                         being parsed; NULL outside it */
    uint64_t chunk_left;              /* data bytes of the current chunk */
    int crlf_need;                    /* 2, 1: CR, LF due after chunk data */
    int prev_cr;                      /* the last framing byte was CR */
    int prev_nonempty;                /* the line before was not empty */
    size_t line_len;                  /* bytes of the current line so far */
    /* Send progress (TM_SEND, TM_FLUSH): bytes the client acknowledged,
     * as submitted - libuv's queue - the kernel's unacknowledged ones. */
    uint64_t submitted;               /* bytes handed to uv_write */
    uint64_t acked_mark;              /* acknowledged at the last progress */
    uint64_t progress_at;             /* uv_now() of the last progress, ms */
    int handles_open;                 /* tcp + timer until their close cbs */
    int closing;                      /* uv_close issued */
    int finishing;                    /* graceful shutdown under way */
    int want_close;                   /* close from the idle callback */
    int in_resume;
    int in_dispatch;
    int read_paused;
    int timer_mode;
    uint64_t body_deadline;           /* uv_now() the body must be complete
                                         by (TM_BODY); 0 = none */
    uint64_t win_at;                  /* start of the body's current rate
                                         window, uv_now() ms */
    uint64_t win_bytes;               /* body bytes received or waiting at
                                         win_at */
    int no_linger;                    /* close once the answer is out,
                                         without draining: a refused
                                         request whose unread body is
                                         large or of unknown length */
    int peer_eof;                     /* the client half-closed */
    int in_peers;                     /* on srv->peers */
};

struct wreq {
    uv_write_t w;
    struct rt_http_conn *conn;
    size_t len;
    char data[];
};

/* The server's side of its connection set (rt_http.c): how connections
 * are made, started, refused, evicted and closed with the server. */
extern const struct rt_conn_ops rt_http__conn_ops;

/* Closes a connection at once, aborting its request (rt_http.c). */
void rt_http__conn_close(struct rt_http_conn *conn);

/* One server handle finished closing; the last one of a closing server
 * calls on_closed (rt_http_server.c). */
void rt_http__srv_handle_closed(struct rt_http_server *srv);

/* The parser callbacks (rt_http_parse.c). */
extern const http_parser_settings rt_http__parser_settings;

/* Feeds data[0..len) to the connection's parser and checks the framing of
 * what it consumed. Returns the bytes consumed and sets *e to the
 * parser's errno (HPE_PAUSED: one request is complete). When a check
 * refused the input, conn->error_status is set (and *e is not HPE_OK
 * unless the refusal came after the parser finished). */
size_t rt_http__parse(struct rt_http_conn *conn, const char *data,
                      size_t len, enum http_errno *e);

/* True when a probe route serves req (its method, or GET for HEAD, and
 * path): what a connection of the probe reserve may ask (rt_http.c). */
int rt_http__probe_route(const struct rt_http_server *srv,
                         const struct rt_http_req *req);

/* Frees a request and everything it owns. NULL is a no-op. */
void rt_http__req_free(struct rt_http_req *req);

/* Appends n bytes to a growable NUL-terminated buffer. Returns 0 or
 * TG_ENOMEM. */
int rt_http__buf_append(char **buf, size_t *len, size_t *cap, const char *at,
                        size_t n);

/* Queues the concatenation of up to three pieces as one write (copied). On
 * failure the connection is marked to close from the idle callback (never
 * inside the caller's stack) and TG_ENOMEM / TG_EIO is returned. */
int rt_http__write(struct rt_http_conn *conn, const char *a, size_t alen,
                   const char *b, size_t blen, const char *c, size_t clen);

/* Continues `conn` (next pipelined request, or a pending close) from the
 * server's idle callback. */
void rt_http__resume_later(struct rt_http_conn *conn);

/* Ends `conn` gracefully: flush, FIN, drain input for linger_ms, close. */
void rt_http__conn_finish(struct rt_http_conn *conn);

/* True when the response being written is the connection's last one: the
 * client half-closed and sent nothing more after this request. */
int rt_http__conn_last(const struct rt_http_conn *conn);

/* The JSON error body of the OpenAI API (malloc'ed; NULL on OOM): "code"
 * is the string `code`, or when NULL the one rt_http_status_code() gives
 * the status. */
char *rt_http__error_json(int status, const char *type, const char *msg,
                          const char *code);

/* A whole error response (head and OpenAI-shaped body of `type` NULL as
 * in rt_http__error_json, "Connection: close", Retry-After: retry_after_s
 * when nonzero, `extra` header line without CRLF or NULL) in
 * buf[0..cap); returns its length (the message is cut to 300 bytes; with
 * cap >= 2048 it always fits), or 0 when it does not fit. For answers
 * written outside a handler: parse failures, refusals at accept,
 * evictions. */
size_t rt_http__error_response(char *buf, size_t cap, int status,
                               const char *type, const char *msg,
                               const char *code, unsigned retry_after_s,
                               const char *extra);

#endif /* RT_HTTP_INTERNAL_H */
