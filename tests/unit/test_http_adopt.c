/* test_http_adopt.c — the router's HTTP/1.1 server (rt_http) driven
 * through a socketpair adopted as a connection (rt_http_server_adopt, the
 * seam of the fuzzing harness tests/fuzz/fuzz_http.c), on one thread.
 *
 * Covered: an adopted connection is served like an accepted one; a
 * request the parser completes but the framing check refuses afterwards
 * (bare LF line ends, found by fuzz_http) is answered 400 and freed with
 * its connection instead of lingering as a detached handle until the
 * server closes (it used to: every such request leaked until shutdown);
 * every input of the fuzzing corpus tests/fuzz/corpus/http replays the
 * way the harness feeds it and ends with the connection closed and no
 * request handle left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "router/net/rt_http.h"
#include "tests/support/tt_support.h"
#include "router/net/rt_http.h"

struct fx {
    uv_loop_t loop;
    struct rt_http_server srv;
    int cli;
    char *got; /* what the client received */
    size_t got_len, got_cap;
    int eof;
};

static void h_hello(struct rt_http_req *req, void *ud)
{
    (void)ud;
    rt_http_respond(req, 200, "text/plain", "hello", 5);
}

static void h_echo(struct rt_http_req *req, void *ud)
{
    (void)ud;
    /* The handler always sees a NUL-terminated body, an empty one too
     * (corpus/http/repro-empty-chunked-body-nul). */
    assert_int_equal(req->body[req->body_len], '\0');
    rt_http_respond(req, 200, "text/plain", req->body, req->body_len);
}

static int setup(void **state)
{
    signal(SIGPIPE, SIG_IGN);
    struct fx *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    struct rt_http_config cfg;
    rt_http_config_default(&cfg);
    cfg.max_header_bytes = 2048;
    cfg.max_body_bytes = 16384;
    char err[256];
    assert_int_equal(rt_http_server_init(&f->srv, &f->loop, &cfg, err,
                                         sizeof(err)),
                     0);
    assert_int_equal(rt_http_route_add(&f->srv, "GET", "/hello", h_hello,
                                       NULL, err, sizeof(err)),
                     0);
    assert_int_equal(rt_http_route_add(&f->srv, "POST", "/echo", h_echo,
                                       NULL, err, sizeof(err)),
                     0);
    *state = f;
    return 0;
}

static void on_closed(void *ud)
{
    *(int *)ud = 1;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    int closed = 0;
    rt_http_server_close(&f->srv, on_closed, &closed);
    while (!closed)
        uv_run(&f->loop, UV_RUN_ONCE);
    rt_http_server_free(&f->srv);
    assert_int_equal(uv_loop_close(&f->loop), 0);
    free(f->got);
    free(f);
    return 0;
}

/* One loop round, then what the server wrote is read. */
static void pump(struct fx *f)
{
    uv_run(&f->loop, UV_RUN_NOWAIT);
    for (;;) {
        if (f->got_len + 4096 > f->got_cap) {
            f->got_cap = f->got_cap ? 2 * f->got_cap : 65536;
            f->got = realloc(f->got, f->got_cap + 1);
            assert_non_null(f->got);
        }
        ssize_t r = read(f->cli, f->got + f->got_len, 4096);
        if (r > 0) {
            f->got_len += (size_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EINTR))
            f->eof = 1;
        break;
    }
    if (f->got)
        f->got[f->got_len] = '\0';
}

/* Feeds raw (n bytes) in writes of `step` bytes (0: one write), then
 * half-closes and runs until the server closed the connection. */
static void drive(struct fx *f, const char *raw, size_t n, size_t step)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX,
                                SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                                sv),
                     0);
    assert_int_equal(rt_http_server_adopt(&f->srv, sv[0]), 0);
    f->cli = sv[1];
    f->got_len = 0;
    f->eof = 0;
    if (step == 0)
        step = n ? n : 1;
    for (size_t off = 0; off < n && !f->eof; off += step) {
        size_t m = n - off < step ? n - off : step;
        size_t done = 0;
        int spins = 0;
        while (done < m) {
            ssize_t w = send(f->cli, raw + off + done, m - done, MSG_NOSIGNAL);
            if (w > 0) {
                done += (size_t)w;
                continue;
            }
            if (w < 0 && errno != EAGAIN && errno != EINTR)
                break;
            assert_true(++spins < 100000);
            pump(f);
        }
        if (done < m)
            break;
        pump(f);
    }
    shutdown(f->cli, SHUT_WR);
    for (int i = 0; f->srv.set.n_open > 0; i++) {
        assert_true(i < 1000000);
        pump(f);
    }
    pump(f);
    close(f->cli);
    f->cli = -1;
}

static void test_adopted_serves(void **state)
{
    struct fx *f = *state;
    static const char req[] = "POST /echo HTTP/1.1\r\nHost: t\r\n"
                              "Content-Length: 3\r\n\r\nabc";
    drive(f, req, sizeof(req) - 1, 0);
    assert_non_null(strstr(f->got, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(f->got, "\r\n\r\nabc"));
    assert_null(f->srv.zombies);
}

/* The reproducer of fuzz_http: the parser completes the request (it
 * takes a bare LF), the framing check refuses it afterwards. */
static void test_framing_refusal_frees_request(void **state)
{
    struct fx *f = *state;
    static const char *const raw[] = {
        "GET /hello HTTP/1.1\nHost: t\n\n",
        "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"
        "GET /hello HTTP/1.1\nHost: t\n\n",
        "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\n\r\nx",
    };
    for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
        drive(f, raw[i], strlen(raw[i]), 0);
        assert_non_null(strstr(f->got, "HTTP/1.1 400 Bad Request\r\n"));
        assert_non_null(strstr(f->got, "bare LF"));
        /* Nothing is left for rt_http_server_free to find. */
        assert_null(f->srv.zombies);
    }
}

/* Every input of the fuzzing corpus, as fuzz_http feeds it: byte 0 is
 * the write size (0: one write), the rest the client's bytes. */
static void test_fuzz_corpus_replays(void **state)
{
    struct fx *f = *state;
    const char *src = getenv("TANGRAM_SOURCE");
    assert_non_null(src);
    char dir[4096];
    tt_path(dir, sizeof(dir), "%s/tests/fuzz/corpus/http", src);
    DIR *d = opendir(dir);
    if (!d)
        fail_msg("cannot open %s", dir);
    int n_files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[8192];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        FILE *fp = fopen(path, "rb");
        assert_non_null(fp);
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof(buf), fp);
        fclose(fp);
        if (n == 0)
            continue;
        drive(f, buf + 1, n - 1, (unsigned char)buf[0]);
        if (f->srv.zombies)
            fail_msg("%s left a request handle behind", e->d_name);
        n_files++;
    }
    closedir(d);
    assert_true(n_files >= 30);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adopted_serves),
        cmocka_unit_test(test_framing_refusal_frees_request),
        cmocka_unit_test(test_fuzz_corpus_replays),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
