/*
 * rt_http_internal.h — what rt_http.c (connections, parsing, dispatch) and
 * rt_http_resp.c (responses) share. Not for use outside router/rt_http*.c.
 */
#ifndef RT_HTTP_INTERNAL_H
#define RT_HTTP_INTERNAL_H

#include <http_parser.h>

#include "router/rt_http.h"

enum {
    RQ_PARSING = 0, /* being received */
    RQ_HANDLER,     /* dispatched, no response bytes yet */
    RQ_STREAMING,   /* stream_begin sent the head */
};

enum { CB_NONE = 0, CB_URL, CB_FIELD, CB_VALUE };

enum { TM_NONE = 0, TM_IDLE, TM_REQUEST, TM_FLUSH, TM_LINGER };

/* Unparsed input kept while a request is in flight before reading pauses. */
#define PENDING_CAP (64u * 1024u)
#define READ_BUF 32768

struct rt_http_conn {
    struct rt_http_server *srv;
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shutdown_req;
    http_parser parser;
    struct rt_http_conn *prev, *next; /* srv->conns */
    struct rt_http_conn *next_resume; /* srv->resume */
    struct rt_http_req *cur;          /* parsing or in flight; at most one */
    char *pend;                       /* (pend_len) unparsed input from
                                         pend_off on */
    size_t pend_off, pend_len, pend_cap;
    size_t hdr_bytes;                 /* request line + header bytes so far */
    int error_status;                 /* set by a callback refusing input */
    int handles_open;                 /* tcp + timer until their close cbs */
    int closing;                      /* uv_close issued */
    int finishing;                    /* graceful shutdown under way */
    int want_close;                   /* close from the idle callback */
    int in_resume;
    int in_dispatch;
    int read_paused;
    int timer_mode;
    char rbuf[READ_BUF];
};

struct wreq {
    uv_write_t w;
    struct rt_http_conn *conn;
    size_t len;
    char data[];
};

/* Frees a request and everything it owns. NULL is a no-op. */
void rt__http_req_free(struct rt_http_req *req);

/* Queues the concatenation of up to three pieces as one write (copied). On
 * failure the connection is marked to close from the idle callback (never
 * inside the caller's stack) and TG_ENOMEM / TG_EIO is returned. */
int rt__http_write(struct rt_http_conn *conn, const char *a, size_t alen,
                   const char *b, size_t blen, const char *c, size_t clen);

/* Continues `conn` (next pipelined request, or a pending close) from the
 * server's idle callback. */
void rt__http_resume_later(struct rt_http_conn *conn);

/* Ends `conn` gracefully: flush, FIN, drain input for linger_ms, close. */
void rt__http_conn_finish(struct rt_http_conn *conn);

/* The JSON error body of the OpenAI API (malloc'ed; NULL on OOM). */
char *rt__http_error_json(int status, const char *type, const char *msg);

#endif /* RT_HTTP_INTERNAL_H */
