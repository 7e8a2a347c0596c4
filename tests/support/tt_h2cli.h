/*
 * tt_h2cli.h — a small blocking HTTP/2 client on nghttp2 for the rt_grpc
 * tests (test_grpc.c, test_grpc_limits.c): it sends what a real gRPC
 * client never would (wrong headers, truncated or oversized messages,
 * streams left open) and records what the server answered on one stream:
 * :status, grpc-status, grpc-message, the DATA bytes and how the stream
 * closed.
 *
 * Test code only: blocking sockets on 127.0.0.1, failures end the running
 * cmocka test. One client per thread.
 */
#ifndef TT_H2CLI_H
#define TT_H2CLI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nghttp2/nghttp2.h>

/* One connection with one request stream of interest. */
struct tt_h2cli {
    int fd;
    nghttp2_session *s;
    int32_t sid;                 /* the stream of the last request */
    int http_status, grpc_status; /* -1 / 0 until received */
    char grpc_msg[512];          /* grpc-message as sent (percent-encoded) */
    uint8_t data[1 << 16];       /* (data_len) DATA bytes received */
    size_t data_len;
    int closed;                  /* the stream closed */
    uint32_t close_code;         /* its RST_STREAM code (0 = NO_ERROR) */
    const uint8_t *body;         /* (body_len) request bytes to send */
    size_t body_len, body_off;
    int body_eof;                /* END_STREAM after the body */
};

/* A header entry from two string literals. */
#define TT_H2_NV(n, v)                                                   \
    {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1,       \
     NGHTTP2_NV_FLAG_NONE}

/* Scratch headers filled by tt_h2cli_std_nv(); room for 8 entries. */
extern nghttp2_nv tt_h2cli_nv[8];

/* A connected TCP socket to 127.0.0.1:port. */
int tt_h2cli_connect(int port);

/* Starts one request with `nv` (n entries) and `body` (blen bytes, may be
 * NULL), END_STREAM after the body when `eof`, and runs it until the
 * stream closes or `ms` pass; the connection stays open. Returns 1 when
 * the stream closed. */
int tt_h2cli_open(struct tt_h2cli *c, int port, const nghttp2_nv *nv,
                  size_t n, const void *body, size_t blen, int eof, int ms);

/* Goes on running an open client until its stream (c->sid) closed, the
 * connection ended or `ms` passed; returns 1 when the stream closed. */
int tt_h2cli_pump(struct tt_h2cli *c, int ms);

/* Waits up to `ms` for the server to close the connection (reading and
 * dropping what comes); returns 1 when it did. */
int tt_h2cli_wait_eof(struct tt_h2cli *c, int ms);

/* Frees the session and closes the socket. */
void tt_h2cli_end(struct tt_h2cli *c);

/* tt_h2cli_open() + tt_h2cli_end(). */
int tt_h2cli_call(struct tt_h2cli *c, int port, const nghttp2_nv *nv,
                  size_t n, const void *body, size_t blen, int eof, int ms);

/* The body data source of tt_h2cli_open(): c->body from c->body_off, then
 * END_STREAM when c->body_eof, else deferred (nghttp2_session_resume_data
 * after changing c->body sends more). For requests submitted by hand. */
ssize_t tt_h2cli_body(nghttp2_session *s, int32_t sid, uint8_t *buf,
                      size_t len, uint32_t *flags, nghttp2_data_source *src,
                      void *ud);

/* Fills tt_h2cli_nv with the headers of a call to `path` (:method
 * `method`; content-type `ct` and te `te` unless NULL); returns the count.
 * The strings must outlive the request. */
size_t tt_h2cli_std_nv(const char *path, const char *ct, const char *te,
                       const char *method);

/* Writes one gRPC message (flag byte, big-endian length, `len` bytes of
 * `msg`) to `out`; returns len + 5. */
size_t tt_h2cli_frame(uint8_t *out, uint8_t flag, const char *msg,
                      size_t len);

#endif /* TT_H2CLI_H */
