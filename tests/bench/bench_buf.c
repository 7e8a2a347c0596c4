/*
 * bench_buf.c — the shared byte buffer (common/base/tg_buf.h) against the
 * hand-written string builders it replaced, side by side in one run:
 *
 *   pieces  small appends of 1..40 bytes, as the Jinja renderer emits
 *           template text and values (common/jinja: its output buffer and
 *           jj_buf, an out-of-line append that grew through tg_grow on
 *           every call);
 *   chars   one character at a time, as the Python repr and JSON writers
 *           escape strings (jj_buf_putc);
 *   format  printf-formatted lines, as the metrics exposition and the
 *           grammar printer write them (a scratch snprintf, then a copy);
 *   heads   a short text built and handed over per request, as HTTP
 *           response heads are (printf of each line into a growing
 *           buffer, vsnprintf run twice to size it).
 *
 *   bench-buf [--quick]
 *
 * The hand-written builders are reproduced here as they were. Each cell
 * is the best of R runs (R = 5; --quick: 1, less text); prints ns per
 * operation of each and the ratio ours / hand, and fails unless both
 * built the same bytes. Wall-clock ratios on a shared machine are noisy:
 * compare instruction counts (valgrind --tool=callgrind, the *_hand /
 * *_ours functions) for figures.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_grow.h"

#define NOINLINE __attribute__((noinline))

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t fnv(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h ^ n;
}

/* ---- the hand-written builders ---------------------------------------- */

/* The Jinja engine's buffer: every append an out-of-line call. */
struct hbuf {
    char *p;
    size_t n, cap;
};

static NOINLINE int hbuf_reserve(struct hbuf *b, size_t more)
{
    size_t need = b->n + more + 1;
    if (need < b->n)
        return -1;
    return TG_GROW(b->p, &b->cap, need);
}

static NOINLINE int hbuf_put(struct hbuf *b, const char *s, size_t n)
{
    if (hbuf_reserve(b, n))
        return -1;
    if (n > 0)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

static NOINLINE int hbuf_putc(struct hbuf *b, char ch)
{
    return hbuf_put(b, &ch, 1);
}

/* The printf builders: format into a scratch, then copy (metrics, the
 * grammar printer), or size with vsnprintf(NULL) first (HTTP heads). */
static NOINLINE int hbuf_printf_scratch(struct hbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof tmp)
        return -1;
    return hbuf_put(b, tmp, (size_t)k);
}

static NOINLINE int hbuf_printf_twice(struct hbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || hbuf_reserve(b, (size_t)n) < 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
    return 0;
}

/* ---- the workloads ---------------------------------------------------- */

static const char TEXT[] =
    "<|im_start|>system\nYou are a helpful assistant that answers in "
    "JSON.<|im_end|>\n<|im_start|>user\nWhat is the weather in Paris "
    "today, and should I take an umbrella?<|im_end|>\n";

static NOINLINE uint64_t pieces_hand(size_t total)
{
    struct hbuf b = {0};
    size_t off = 0, len = 1;
    while (b.n < total) {
        if (hbuf_put(&b, TEXT + off, len) != 0)
            exit(1);
        off = (off + 7) % (sizeof TEXT - 41);
        len = len % 40 + 1;
    }
    uint64_t h = fnv(b.p, b.n);
    free(b.p);
    return h;
}

static NOINLINE uint64_t pieces_ours(size_t total)
{
    struct tg_buf b = {0};
    size_t off = 0, len = 1;
    while (b.len < total) {
        if (tg_buf_append(&b, TEXT + off, len) != 0)
            exit(1);
        off = (off + 7) % (sizeof TEXT - 41);
        len = len % 40 + 1;
    }
    uint64_t h = fnv(b.data, b.len);
    tg_buf_free(&b);
    return h;
}

static NOINLINE uint64_t chars_hand(size_t total)
{
    struct hbuf b = {0};
    for (size_t i = 0; i < total; i++) {
        char c = TEXT[i % (sizeof TEXT - 1)];
        if (c == '\n' ? hbuf_put(&b, "\\n", 2) : hbuf_putc(&b, c))
            exit(1);
    }
    uint64_t h = fnv(b.p, b.n);
    free(b.p);
    return h;
}

static NOINLINE uint64_t chars_ours(size_t total)
{
    struct tg_buf b = {0};
    for (size_t i = 0; i < total; i++) {
        char c = TEXT[i % (sizeof TEXT - 1)];
        if (c == '\n' ? tg_buf_append(&b, "\\n", 2) : tg_buf_putc(&b, c))
            exit(1);
    }
    uint64_t h = fnv(b.data, b.len);
    tg_buf_free(&b);
    return h;
}

static NOINLINE uint64_t format_hand(size_t lines)
{
    struct hbuf b = {0};
    for (size_t i = 0; i < lines; i++)
        if (hbuf_printf_scratch(&b, "vllm:num_requests{model=\"m%zu\"} %g\n",
                                i % 7, (double)i * 0.25) != 0)
            exit(1);
    uint64_t h = fnv(b.p, b.n);
    free(b.p);
    return h;
}

static NOINLINE uint64_t format_ours(size_t lines)
{
    struct tg_buf b = {0};
    for (size_t i = 0; i < lines; i++)
        if (tg_buf_printf(&b, "vllm:num_requests{model=\"m%zu\"} %g\n", i % 7,
                          (double)i * 0.25) != 0)
            exit(1);
    uint64_t h = fnv(b.data, b.len);
    tg_buf_free(&b);
    return h;
}

static NOINLINE uint64_t heads_hand(size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        struct hbuf b = {0};
        hbuf_printf_twice(&b, "HTTP/1.1 %d %s\r\n", 200, "OK");
        hbuf_printf_twice(&b, "Content-Type: %s\r\n", "application/json");
        hbuf_printf_twice(&b, "Content-Length: %zu\r\n", i * 13);
        hbuf_put(&b, "X-Request-Id: abc\r\n", 19);
        hbuf_put(&b, "\r\n", 2);
        h += fnv(b.p, b.n);
        free(b.p);
    }
    return h;
}

static NOINLINE uint64_t heads_ours(size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        struct tg_buf b = {0};
        tg_buf_printf(&b, "HTTP/1.1 %d %s\r\n", 200, "OK");
        tg_buf_printf(&b, "Content-Type: %s\r\n", "application/json");
        tg_buf_printf(&b, "Content-Length: %zu\r\n", i * 13);
        tg_buf_append(&b, "X-Request-Id: abc\r\n", 19);
        tg_buf_append(&b, "\r\n", 2);
        if (tg_buf_failed(&b))
            exit(1);
        h += fnv(b.data, b.len);
        tg_buf_free(&b);
    }
    return h;
}

struct cell {
    const char *name;
    double hand, ours, ops;
    uint64_t sum_hand, sum_ours;
};

static void run(struct cell *c, const char *name, uint64_t (*hand)(size_t),
                uint64_t (*ours)(size_t), size_t n, double ops, int reps)
{
    c->name = name;
    c->ops = ops;
    c->hand = c->ours = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        c->sum_hand = hand(n);
        double t1 = now();
        c->sum_ours = ours(n);
        double t2 = now();
        c->hand = t1 - t0 < c->hand ? t1 - t0 : c->hand;
        c->ours = t2 - t1 < c->ours ? t2 - t1 : c->ours;
    }
}

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr, "usage: bench-buf [--quick]\n");
            return 2;
        }
    }
    int reps = quick ? 1 : 5;
    size_t bytes = quick ? 1000000 : 50000000;
    size_t lines = quick ? 20000 : 1000000;
    size_t heads = quick ? 20000 : 1000000;
    struct cell cells[4];
    /* pieces average 20.5 bytes */
    run(&cells[0], "pieces", pieces_hand, pieces_ours, bytes,
        (double)bytes / 20.5, reps);
    run(&cells[1], "chars", chars_hand, chars_ours, bytes, (double)bytes, reps);
    run(&cells[2], "format", format_hand, format_ours, lines, (double)lines,
        reps);
    run(&cells[3], "heads", heads_hand, heads_ours, heads, (double)heads, reps);
    printf("%-7s %12s %12s %10s\n", "case", "hand ns/op", "ours ns/op",
           "ours/hand");
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        const struct cell *c = &cells[i];
        printf("%-7s %12.2f %12.2f %10.3f\n", c->name, 1e9 * c->hand / c->ops,
               1e9 * c->ours / c->ops, c->ours / c->hand);
        if (c->sum_hand != c->sum_ours) {
            fprintf(stderr, "bench-buf: %s: the texts differ\n", c->name);
            bad = 1;
        }
    }
    return bad;
}
