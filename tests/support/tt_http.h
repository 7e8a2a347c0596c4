/*
 * tt_http.h — the loopback fixture of the rt_http tests (test_http.c,
 * test_http_stream.c): an HTTP/1.1 server with demo routes running on a uv
 * loop in its own thread, and a raw blocking-socket client that parses
 * answers itself (Content-Length, chunked and close-delimited bodies).
 *
 * Demo routes registered by tt_http_fx_setup() (handlers run on the loop
 * thread and check their own API calls with cmocka asserts):
 *   GET/HEAD /hello        "hello" with X-Hello: 1
 *   POST/PUT /echo         the body back, X-Test echoed as X-Test-Echo
 *   GET /stats             the number of open connections
 *   GET /delay?ms=N&tag=T  T after N ms (default 30), with an abort callback
 *   GET /zombie            answers after 150 ms without an abort callback;
 *                          the rt_http_respond() result lands in zombie_rc
 *   GET /sse?n=N           N SSE events (default 5), then [DONE]
 *   GET /forever           SSE events every 5 ms until the client leaves
 *   GET /v1/models/<any>   "<path>?<query>"
 *   GET /misuse            wrong API calls (result in misuse_ok), then 204
 *   GET /counters          the server's rt_http_stats (and live connections,
 *                          the set's evictions and probe places, the body
 *                          budget's bytes in use, max_pending) as
 *                          "name=value" lines
 * GET and HEAD /hello and GET /counters are the probe routes (served on a
 * connection of the probe reserve).
 *   GET /flood?kb=N        N KiB (default 64) streamed with backpressure:
 *                          writes stop above 64 KiB queued and resume from
 *                          rt_http_req_on_drain at 16 KiB; the largest
 *                          queue seen lands in max_pending
 * Server limits (tt_http_fx_test_config): 4096 header bytes, 1 MiB body,
 * idle timeout 1500 ms, header, body and send timeouts 1000 ms, linger
 * 200 ms. With auth (tt_http_fx_start), every path but /hello needs
 * "Authorization: Bearer k" (a head check answering 401).
 *
 * Test code only. Client calls run on the test thread; a failed check
 * fails the running cmocka test.
 */
#ifndef TT_HTTP_H
#define TT_HTTP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "router/net/rt_http.h"

struct tt_http_fx {
    uv_loop_t loop;
    struct rt_http_server srv;
    uv_async_t stop;
    pthread_t thread;
    int port;                 /* the listening port on 127.0.0.1 */
    atomic_int aborts;        /* on_abort calls */
    atomic_int stream_events; /* events written by /forever */
    atomic_int zombie_rc;     /* rt_http_respond() result of /zombie */
    atomic_int zombie_done;
    atomic_int misuse_ok;     /* /misuse checks passed */
    atomic_int max_pending;   /* largest queue /flood saw, bytes */
};

/* A raw client connection with its receive buffer. */
struct tt_http_cli {
    int fd;
    char *buf;       /* received, not yet consumed bytes */
    size_t len, cap; /* bytes in buf, its capacity */
    int eof;         /* the server closed (or the read timed out) */
};

/* One parsed response. */
struct tt_http_resp {
    int status;
    char head[4096]; /* status line and headers, NUL-terminated */
    char *body;      /* NUL-terminated; the caller frees it */
    size_t body_len;
    int chunked;     /* the body came with Transfer-Encoding: chunked */
};

/* The fixture's limits (see the top) over rt_http_config_default(). */
void tt_http_fx_test_config(struct rt_http_config *cfg);

/* Allocates a fixture and starts the server with `cfg`, the demo routes
 * and, when with_auth, the head check, on an ephemeral port and its loop
 * thread. Stop it with tt_http_fx_teardown(&fx). */
struct tt_http_fx *tt_http_fx_start(const struct rt_http_config *cfg,
                                    int with_auth);

/* cmocka setup: tt_http_fx_start(test config, no auth) into *state.
 * Returns 0 (a failure fails the test). */
int tt_http_fx_setup(void **state);

/* cmocka teardown: closes the server from its loop thread, joins the
 * thread, frees the server and the fixture. Returns 0. */
int tt_http_fx_teardown(void **state);

/* The SSE handler of /sse and /forever, for tests that register it on a
 * server of their own; ud must be a struct tt_http_fx (its aborts and
 * stream_events counters are updated). Loop thread only. */
void tt_http_sse_handler(struct rt_http_req *req, void *ud);

/* Connects c to 127.0.0.1:port (5 s receive timeout). Release it with
 * tt_http_cli_close(). */
void tt_http_cli_open(struct tt_http_cli *c, int port);

/* Closes the socket and frees the buffer; safe to call twice. */
void tt_http_cli_close(struct tt_http_cli *c);

/* Sends all n bytes of s (or the NUL-terminated s for _sends). */
void tt_http_cli_send(struct tt_http_cli *c, const char *s, size_t n);
void tt_http_cli_sends(struct tt_http_cli *c, const char *s);

/* Reads more bytes into the buffer; returns 0, or -1 at EOF / error /
 * timeout (and sets c->eof). */
int tt_http_cli_fill(struct tt_http_cli *c);

/* Drops the first n buffered bytes. */
void tt_http_cli_consume(struct tt_http_cli *c, size_t n);

/* Reads one response (1xx interim responses are returned too). Returns 0
 * or -1 when the connection ended before a whole response arrived. The
 * caller frees r->body. */
int tt_http_cli_response(struct tt_http_cli *c, struct tt_http_resp *r);

/* Returns 1 when the server closed the connection (EOF within the
 * receive timeout), reading and keeping any bytes before it. */
int tt_http_cli_closed(struct tt_http_cli *c);

/* Returns 1 when the response head contains `line` (case-insensitive). */
int tt_http_head_has(const struct tt_http_resp *r, const char *line);

/* Sleeps ms milliseconds. */
void tt_http_sleep_ms(int ms);

/* Sends one raw request on a fresh connection and reads its answer into
 * r (the caller frees r->body). */
void tt_http_one_shot(struct tt_http_fx *fx, const char *raw,
                      struct tt_http_resp *r);

/* Polls /stats until only the polling connection itself is open; fails
 * the test after about 2 s. */
void tt_http_expect_no_conns_left(struct tt_http_fx *fx);

/* Sends raw on a fresh connection and checks the answer: `status`, a
 * complete JSON error in the OpenAI shape ("code" a string),
 * "Connection: close", and the server closing the connection. */
void tt_http_expect_error_close(struct tt_http_fx *fx, const char *raw,
                                int status);

/* The value of one /counters line (see above), fetched on a fresh
 * connection. */
long tt_http_counter(struct tt_http_fx *fx, const char *name);

#endif /* TT_HTTP_H */
