/* tt_h2cli.c — the blocking nghttp2 test client of the rt_grpc tests (see
 * tt_h2cli.h). */
#include "tests/support/tt_h2cli.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static ssize_t h2_send(nghttp2_session *s, const uint8_t *d, size_t n,
                       int flags, void *ud)
{
    struct tt_h2cli *c = ud;
    (void)s;
    (void)flags;
    ssize_t w = send(c->fd, d, n, MSG_NOSIGNAL);
    return w < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : w;
}

static int h2_header(nghttp2_session *s, const nghttp2_frame *f,
                     const uint8_t *name, size_t nlen, const uint8_t *value,
                     size_t vlen, uint8_t flags, void *ud)
{
    struct tt_h2cli *c = ud;
    (void)s;
    (void)f;
    (void)flags;
    if (nlen == 7 && memcmp(name, ":status", 7) == 0)
        c->http_status = atoi((const char *)value);
    else if (nlen == 11 && memcmp(name, "grpc-status", 11) == 0)
        c->grpc_status = atoi((const char *)value);
    else if (nlen == 12 && memcmp(name, "grpc-message", 12) == 0)
        snprintf(c->grpc_msg, sizeof(c->grpc_msg), "%.*s", (int)vlen,
                 (const char *)value);
    return 0;
}

static int h2_data(nghttp2_session *s, uint8_t flags, int32_t sid,
                   const uint8_t *d, size_t n, void *ud)
{
    struct tt_h2cli *c = ud;
    (void)s;
    (void)flags;
    (void)sid;
    size_t k =
        n < sizeof(c->data) - c->data_len ? n : sizeof(c->data) - c->data_len;
    memcpy(c->data + c->data_len, d, k);
    c->data_len += k;
    return 0;
}

static int h2_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud)
{
    struct tt_h2cli *c = ud;
    (void)s;
    if (sid == c->sid) {
        c->closed = 1;
        c->close_code = code;
    }
    return 0;
}

ssize_t tt_h2cli_body(nghttp2_session *s, int32_t sid, uint8_t *buf,
                      size_t len, uint32_t *flags, nghttp2_data_source *src,
                      void *ud)
{
    struct tt_h2cli *c = ud;
    (void)s;
    (void)sid;
    (void)src;
    size_t n = c->body_len - c->body_off;
    if (n > len)
        n = len;
    if (n)
        memcpy(buf, c->body + c->body_off, n);
    c->body_off += n;
    if (c->body_off == c->body_len) {
        if (c->body_eof)
            *flags |= NGHTTP2_DATA_FLAG_EOF;
        else if (n == 0)
            return NGHTTP2_ERR_DEFERRED;
    }
    return (ssize_t)n;
}

int tt_h2cli_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

int tt_h2cli_open(struct tt_h2cli *c, int port, const nghttp2_nv *nv,
                  size_t n, const void *body, size_t blen, int eof, int ms)
{
    memset(c, 0, sizeof(*c));
    c->grpc_status = -1;
    c->fd = tt_h2cli_connect(port);
    c->body = body;
    c->body_len = blen;
    c->body_eof = eof;
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, h2_send);
    nghttp2_session_callbacks_set_on_header_callback(cb, h2_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_close);
    assert_int_equal(nghttp2_session_client_new(&c->s, cb, c), 0);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, NULL, 0);
    nghttp2_data_provider dp = {.source.ptr = NULL,
                                .read_callback = tt_h2cli_body};
    c->sid = nghttp2_submit_request(c->s, NULL, nv, n,
                                    (body || eof == 0) ? &dp : NULL, NULL);
    assert_true(c->sid > 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!c->closed) {
        assert_int_equal(nghttp2_session_send(c->s), 0);
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long el = (t1.tv_sec - t0.tv_sec) * 1000 +
                  (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (el >= ms)
            break;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, (int)(ms - el)) <= 0)
            continue;
        uint8_t buf[16384];
        ssize_t r = recv(c->fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break;
        if (nghttp2_session_mem_recv(c->s, buf, (size_t)r) < 0)
            break;
    }
    return c->closed;
}

int tt_h2cli_wait_eof(struct tt_h2cli *c, int ms)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    while (poll(&p, 1, ms) > 0) {
        uint8_t buf[4096];
        ssize_t r = recv(c->fd, buf, sizeof(buf), 0);
        if (r <= 0)
            return 1;
    }
    return 0;
}

int tt_h2cli_pump(struct tt_h2cli *c, int ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!c->closed) {
        if (nghttp2_session_send(c->s) != 0)
            break;
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long el = (t1.tv_sec - t0.tv_sec) * 1000 +
                  (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (el >= ms)
            break;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, (int)(ms - el)) <= 0)
            continue;
        uint8_t buf[16384];
        ssize_t r = recv(c->fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break;
        if (nghttp2_session_mem_recv(c->s, buf, (size_t)r) < 0)
            break;
    }
    return c->closed;
}

void tt_h2cli_end(struct tt_h2cli *c)
{
    nghttp2_session_del(c->s);
    close(c->fd);
}

int tt_h2cli_call(struct tt_h2cli *c, int port, const nghttp2_nv *nv,
                  size_t n, const void *body, size_t blen, int eof, int ms)
{
    int closed = tt_h2cli_open(c, port, nv, n, body, blen, eof, ms);
    tt_h2cli_end(c);
    return closed;
}

nghttp2_nv tt_h2cli_nv[8];

size_t tt_h2cli_std_nv(const char *path, const char *ct, const char *te,
                       const char *method)
{
    size_t n = 0;
    nghttp2_nv m = TT_H2_NV(":method", "POST");
    m.value = (uint8_t *)method;
    m.valuelen = strlen(method);
    tt_h2cli_nv[n++] = m;
    nghttp2_nv s = TT_H2_NV(":scheme", "http");
    tt_h2cli_nv[n++] = s;
    nghttp2_nv a = TT_H2_NV(":authority", "localhost");
    tt_h2cli_nv[n++] = a;
    nghttp2_nv p = TT_H2_NV(":path", "/");
    p.value = (uint8_t *)path;
    p.valuelen = strlen(path);
    tt_h2cli_nv[n++] = p;
    if (ct) {
        nghttp2_nv c = TT_H2_NV("content-type", "");
        c.value = (uint8_t *)ct;
        c.valuelen = strlen(ct);
        tt_h2cli_nv[n++] = c;
    }
    if (te) {
        nghttp2_nv t = TT_H2_NV("te", "");
        t.value = (uint8_t *)te;
        t.valuelen = strlen(te);
        tt_h2cli_nv[n++] = t;
    }
    return n;
}

size_t tt_h2cli_frame(uint8_t *out, uint8_t flag, const char *msg,
                      size_t len)
{
    out[0] = flag;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
    memcpy(out + 5, msg, len);
    return len + 5;
}
