/*
 * bench_cpu_linear.c — the CPU backend's linear layers (the gemm and
 * gemm_bf16 ops, y = x W^T) on the shapes of a decode step, side by side:
 *
 *   1. Streaming kernels (cpu_gemv.c) against the BLAS path (sgemm over
 *      per-thread column slices) for m = 1 .. 64 rows of x, fp32 and bf16
 *      weights, W 3072 x 1024 (Qwen3-0.6B's gate/up). This is the
 *      measurement behind TG_CPU_GEMV_ROWS.
 *   2. The streaming kernels at every ISA level the machine has
 *      (generic C, AVX2+FMA, AVX-512), m = 1 and 8.
 *   3. Every linear layer of a Qwen3-0.6B decode step at m = 1 (q, k/v, o,
 *      gate/up, down, the tied LM head), fp32 and bf16, beside three
 *      references on the same copies of W: the old path (one cblas_sgemm
 *      over all of W with OpenBLAS's own threads, what gemm did before the
 *      streaming kernels), OpenBLAS's cblas_sgemv (the peer for m = 1) and
 *      the read limit (a plain sum over the same fp32 bytes on the same
 *      threads: the memory bandwidth one call can use). Printed ratios:
 *      ours / old and ours / sgemv as speedups, ours / limit as the
 *      fraction of the bandwidth reached, bf16 as a speedup over ours in
 *      fp32. The OpenBLAS references alternate with each other in a block
 *      after ours (their threads spin after a call, which would slow a
 *      variant run next).
 *
 * Weights come from DRAM as in a real decode step: each call takes the next
 * of a set of copies of W larger than the last-level cache. The variants of
 * a row alternate call by call (A B A B ...) so machine load hits them
 * alike; each cell is the median of the calls, with the spread
 * (max - min) / median. GB/s counts the weight bytes one call reads.
 *
 * Every result is first checked against a float64 product (relative error
 * of each output within 1e-4 of the row's scale); a mismatch exits 1.
 *
 * Usage: bench-cpu-linear [--quick] [--threads N] [--reps R]
 *   --quick    tiny shapes, few calls (the ctest smoke run)
 *   --threads  OpenMP threads of the backend (default: OpenMP's)
 *   --reps     calls per variant and cell (default 40)
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/tg_ops.h"

#define PROG "bench-cpu-linear"
#define MAX_REPS 1000

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 0x9E3779B97F4A7C15ull;

static double urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1.0p-53;
}

static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (p == NULL) {
        fprintf(stderr, PROG ": out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void print_load(const char *what)
{
    double la[3];
    if (getloadavg(la, 3) == 3)
        printf("%s: %.2f %.2f %.2f\n", what, la[0], la[1], la[2]);
}

/* A set of copies of one W (fp32 and bf16), together larger than the
 * last-level cache, and an x of up to 64 rows. */
struct wset {
    int n, k, copies;
    float **f;
    uint16_t **h;
    float *x, *y;
};

static void wset_init(struct wset *s, int n, int k, size_t min_bytes)
{
    s->n = n;
    s->k = k;
    size_t bytes = (size_t)n * (size_t)k * 2; /* bf16: the smaller set */
    s->copies = (int)((min_bytes + bytes - 1) / bytes);
    if (s->copies < 1)
        s->copies = 1;
    s->f = calloc((size_t)s->copies, sizeof(*s->f));
    s->h = calloc((size_t)s->copies, sizeof(*s->h));
    if (s->f == NULL || s->h == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    size_t nk = (size_t)n * (size_t)k;
    for (int c = 0; c < s->copies; c++) {
        s->f[c] = xmalloc(nk * sizeof(float));
        s->h[c] = xmalloc(nk * sizeof(uint16_t));
        for (size_t i = 0; i < nk; i++) {
            s->f[c][i] = (float)(urand() * 2.0 - 1.0) * 0.05f;
            s->h[c][i] = to_bf16(s->f[c][i]);
        }
    }
    s->x = xmalloc(64 * (size_t)k * sizeof(float));
    s->y = xmalloc(64 * (size_t)n * sizeof(float));
    for (size_t i = 0; i < 64 * (size_t)k; i++)
        s->x[i] = (float)(urand() * 2.0 - 1.0);
}

static void wset_free(struct wset *s)
{
    for (int c = 0; c < s->copies; c++) {
        free(s->f[c]);
        free(s->h[c]);
    }
    free(s->f);
    free(s->h);
    free(s->x);
    free(s->y);
}

/* What a variant runs. */
enum kind {
    K_OPS = 0, /* the backend's gemm / gemm_bf16 */
    K_OLD,     /* one cblas_sgemm over all of W, OpenBLAS threaded */
    K_SGEMV,   /* cblas_sgemv (m = 1), OpenBLAS threaded */
    K_READ,    /* a plain sum over W's fp32 bytes: the bandwidth limit */
};

static int n_threads; /* the backend's threads, OpenBLAS's for K_OLD/K_SGEMV */
static volatile float sink;

/* Sixteen independent sums per thread, so the loop is bound by the loads
 * and not by the latency of one chain of additions. */
static void read_all(const float *w, size_t len)
{
    float total = 0.0f;
#pragma omp parallel num_threads(n_threads) reduction(+ : total)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        size_t a = len * (size_t)t / (size_t)T;
        size_t z = len * (size_t)(t + 1) / (size_t)T;
        float acc[16] = {0};
        size_t i = a;
        for (; i + 16 <= z; i += 16) {
#pragma omp simd
            for (int l = 0; l < 16; l++)
                acc[l] += w[i + (size_t)l];
        }
        for (; i < z; i++)
            acc[0] += w[i];
        for (int l = 0; l < 16; l++)
            total += acc[l];
    }
    sink = total;
}

/* One call of variant (kind, bf16, rows) on copy c of s: m rows of x. */
static double call(struct tg_backend *b, struct wset *s, int c, int m, int bf16,
                   int gemv_rows, enum kind kind)
{
    if (tg_backend_cpu_set_gemv_rows(b, gemv_rows) != 0) {
        fprintf(stderr, PROG ": bad gemv rows %d\n", gemv_rows);
        exit(1);
    }
    if (kind == K_OLD || kind == K_SGEMV)
        openblas_set_num_threads(n_threads);
    int rc = 0;
    double t0 = now();
    switch (kind) {
    case K_OPS:
        rc = bf16
                 ? tg_ops_cpu.gemm_bf16(b, s->x, s->h[c], NULL, m, s->n, s->k,
                                        s->y)
                 : tg_ops_cpu.gemm(b, s->x, s->f[c], NULL, m, s->n, s->k, s->y);
        break;
    case K_OLD:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, s->n, s->k,
                    1.0f, s->x, s->k, s->f[c], s->k, 0.0f, s->y, s->n);
        break;
    case K_SGEMV:
        cblas_sgemv(CblasRowMajor, CblasNoTrans, s->n, s->k, 1.0f, s->f[c],
                    s->k, s->x, 1, 0.0f, s->y, 1);
        break;
    case K_READ: read_all(s->f[c], (size_t)s->n * (size_t)s->k); break;
    }
    double t = now() - t0;
    /* The backend's ops run OpenBLAS single-threaded (tg_backend_cpu_new). */
    openblas_set_num_threads(1);
    if (rc != 0) {
        fprintf(stderr, PROG ": gemm failed (%d)\n", rc);
        exit(1);
    }
    return t;
}

/* Checks s->y (m rows, after a call on copy c) against float64. */
static void verify(const struct wset *s, int c, int m, int bf16,
                   const char *what)
{
    for (int i = 0; i < m; i++) {
        const float *xr = s->x + (size_t)i * (size_t)s->k;
        for (int j = 0; j < s->n; j++) {
            double acc = 0.0, mag = 0.0;
            for (int q = 0; q < s->k; q++) {
                size_t at = (size_t)j * (size_t)s->k + (size_t)q;
                double w = bf16 ? from_bf16(s->h[c][at]) : s->f[c][at];
                acc += (double)xr[q] * w;
                mag += fabs((double)xr[q] * w);
            }
            double got = s->y[(size_t)i * (size_t)s->n + (size_t)j];
            if (!(fabs(got - acc) <= 1e-4 * mag + 1e-30)) {
                fprintf(stderr, PROG ": %s: y[%d][%d] = %.9g, float64 %.9g\n",
                        what, i, j, got, acc);
                exit(1);
            }
        }
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and spread ((max - min) / median) of t[0..n). */
static double median(double *t, int n, double *spread)
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    double med = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    *spread = (t[n - 1] - t[0]) / med;
    return med;
}

struct variant {
    int bf16, gemv_rows, isa;
    enum kind kind;
};

/* Runs the variants of one cell alternately, reps calls each, on
 * successive copies of W; writes each median time and spread. */
static void measure(struct tg_backend *b, struct wset *s, int m,
                    const struct variant *v, int nv, int reps, double *med,
                    double *spread)
{
    static double t[8][MAX_REPS];
    int c = 0;
    for (int i = 0; i < nv; i++) { /* warm-up and check, one call each */
        tg_backend_cpu_set_isa(b, (enum tg_cpu_isa)v[i].isa);
        call(b, s, 0, m, v[i].bf16, v[i].gemv_rows, v[i].kind);
        if (v[i].kind != K_READ)
            verify(s, 0, m, v[i].bf16, "warm-up");
    }
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < nv; i++) {
            tg_backend_cpu_set_isa(b, (enum tg_cpu_isa)v[i].isa);
            t[i][r] = call(b, s, c, m, v[i].bf16, v[i].gemv_rows, v[i].kind);
            c = (c + 1) % s->copies;
        }
    }
    for (int i = 0; i < nv; i++)
        med[i] = median(t[i], reps, &spread[i]);
    tg_backend_cpu_set_isa(b, tg_cpu_isa_detect());
    tg_backend_cpu_set_gemv_rows(b, TG_CPU_GEMV_ROWS);
}

static double gbps(const struct wset *s, int bf16, double t)
{
    return (double)s->n * (double)s->k * (bf16 ? 2.0 : 4.0) / t / 1e9;
}

int main(int argc, char **argv)
{
    int quick = 0, threads = 0, reps = 40;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
            if (threads < 1) {
                fprintf(stderr, PROG ": --threads needs a positive count\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > MAX_REPS) {
                fprintf(stderr, PROG ": --reps needs 1 .. %d\n", MAX_REPS);
                return 2;
            }
        } else {
            fprintf(stderr,
                    "usage: " PROG " [--quick] [--threads N] [--reps R]\n");
            return 2;
        }
    }
    if (quick)
        reps = 3;
    n_threads = threads > 0 ? threads : omp_get_max_threads();
    struct tg_backend *b = NULL;
    if (tg_backend_cpu_new(threads, &b) != 0) {
        fprintf(stderr, PROG ": cannot create the CPU backend\n");
        return 1;
    }
    enum tg_cpu_isa top = tg_cpu_isa_detect();
    print_load("load average at the start");
    printf(PROG ": ISA level %s, %d threads, %d calls per cell, variants "
                "alternating; median GB/s of weights (spread = (max - min) / "
                "median)\n",
           tg_cpu_isa_name(top), n_threads, reps);
    /* Four times a 32 MiB last-level cache: every call reads DRAM. */
    size_t dram = quick ? 1 : (size_t)128 << 20;

    /* 1. streaming kernels vs the BLAS path, by m. */
    int n1 = quick ? 96 : 3072, k1 = quick ? 72 : 1024;
    struct wset s1;
    wset_init(&s1, n1, k1, dram);
    printf("\n== 1. W %d x %d: streaming kernels (gemv) vs the BLAS path "
           "(sgemm, column slices per thread) ==\n",
           n1, k1);
    printf("%4s | %9s %9s %6s | %9s %9s %6s | %s\n", "m", "f32 gemv",
           "f32 blas", "ratio", "bf16 gemv", "bf16 blas", "ratio",
           "spreads (f32 g/b, bf16 g/b)");
    const int ms[] = {1, 2, 4, 8, 16, 32, 64};
    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
        int m = ms[mi];
        const struct variant v[4] = {{0, TG_CPU_GEMV_ROWS_MAX, (int)top, K_OPS},
                                     {0, 0, (int)top, K_OPS},
                                     {1, TG_CPU_GEMV_ROWS_MAX, (int)top, K_OPS},
                                     {1, 0, (int)top, K_OPS}};
        double med[4], sp[4];
        measure(b, &s1, m, v, 4, reps, med, sp);
        printf("%4d | %9.2f %9.2f %6.2f | %9.2f %9.2f %6.2f | %.2f %.2f %.2f "
               "%.2f\n",
               m, gbps(&s1, 0, med[0]), gbps(&s1, 0, med[1]), med[1] / med[0],
               gbps(&s1, 1, med[2]), gbps(&s1, 1, med[3]), med[3] / med[2],
               sp[0], sp[1], sp[2], sp[3]);
    }
    printf("(ratio = BLAS time / gemv time: above 1 the streaming kernels "
           "are faster; gemm uses them up to m = %d)\n",
           TG_CPU_GEMV_ROWS);

    /* 2. ISA levels. */
    printf("\n== 2. streaming kernels by ISA level, W %d x %d ==\n", n1, k1);
    printf("%4s %5s |", "m", "dtype");
    for (int l = 0; l <= (int)top; l++)
        printf(" %9s", tg_cpu_isa_name((enum tg_cpu_isa)l));
    printf(" | spreads\n");
    for (int mi = 0; mi < 2; mi++) {
        int m = mi == 0 ? 1 : 8;
        for (int bf16 = 0; bf16 < 2; bf16++) {
            struct variant v[3];
            for (int l = 0; l <= (int)top; l++)
                v[l] = (struct variant){bf16, TG_CPU_GEMV_ROWS_MAX, l, K_OPS};
            double med[3], sp[3];
            measure(b, &s1, m, v, (int)top + 1, reps, med, sp);
            printf("%4d %5s |", m, bf16 ? "bf16" : "f32");
            for (int l = 0; l <= (int)top; l++)
                printf(" %9.2f", gbps(&s1, bf16, med[l]));
            printf(" |");
            for (int l = 0; l <= (int)top; l++)
                printf(" %.2f", sp[l]);
            printf("\n");
        }
    }
    wset_free(&s1);

    /* 3. a Qwen3-0.6B decode step's linear layers, m = 1, beside the old
     * path, OpenBLAS's sgemv and the read limit. */
    printf("\n== 3. Qwen3-0.6B decode step at m = 1 (hidden 1024, 16/8 heads "
           "x 128, ffn 3072, vocab 151669): GB/s of weights ==\n");
    printf("%-9s %13s | %6s %6s %6s %6s %6s | %7s %7s %7s %7s %7s | %s\n",
           "layer", "n x k", "f32", "old", "sgemv", "limit", "bf16", "vs old",
           "vs gemv", "f32/lim", "bf16 x", "bf16/l",
           "spreads (f32 old sgemv limit bf16)");
    const struct {
        const char *name;
        int n, k;
    } shapes[] = {{"q_proj", 2048, 1024}, {"k/v_proj", 1024, 1024},
                  {"o_proj", 1024, 2048}, {"gate/up", 3072, 1024},
                  {"down", 1024, 3072},   {"lm_head", 151669, 1024}};
    int nshapes = quick ? 1 : (int)(sizeof(shapes) / sizeof(shapes[0]));
    double sum_t[5] = {0};
    for (int i = 0; i < nshapes; i++) {
        struct wset s;
        int n = quick ? 40 : shapes[i].n, k = quick ? 33 : shapes[i].k;
        wset_init(&s, n, k, dram);
        /* Ours and the read limit alternate; then the two OpenBLAS
         * references alternate in a block of their own: OpenBLAS's
         * threads spin for a while after each threaded call and would slow
         * whatever ran next on the same cores. */
        const struct variant v[3] = {{0, TG_CPU_GEMV_ROWS, (int)top, K_OPS},
                                     {0, TG_CPU_GEMV_ROWS, (int)top, K_READ},
                                     {1, TG_CPU_GEMV_ROWS, (int)top, K_OPS}};
        const struct variant vb[2] = {{0, TG_CPU_GEMV_ROWS, (int)top, K_OLD},
                                      {0, TG_CPU_GEMV_ROWS, (int)top, K_SGEMV}};
        double m3[3], s3[3], m2[2], s2[2];
        measure(b, &s, 1, v, 3, reps, m3, s3);
        measure(b, &s, 1, vb, 2, reps, m2, s2);
        /* f32, old, sgemv, read limit, bf16 */
        double med[5] = {m3[0], m2[0], m2[1], m3[1], m3[2]};
        double sp[5] = {s3[0], s2[0], s2[1], s3[1], s3[2]};
        /* Per decode step: q, k, v, o, gate, up, down per layer (28
         * layers), the LM head once. */
        int per_step = i == 1 ? 2 * 28 : i == 3 ? 2 * 28 : i == 5 ? 1 : 28;
        for (int q = 0; q < 5; q++)
            sum_t[q] += per_step * med[q];
        char nk[32];
        snprintf(nk, sizeof(nk), "%d x %d", n, k);
        printf("%-9s %13s | %6.2f %6.2f %6.2f %6.2f %6.2f | %7.2f %7.2f "
               "%7.2f %7.2f %7.2f | %.2f %.2f %.2f %.2f %.2f\n",
               shapes[i].name, nk, gbps(&s, 0, med[0]), gbps(&s, 0, med[1]),
               gbps(&s, 0, med[2]), gbps(&s, 0, med[3]), gbps(&s, 1, med[4]),
               med[1] / med[0], med[2] / med[0], med[3] / med[0],
               med[0] / med[4], med[3] / 2.0 / med[4], sp[0], sp[1], sp[2],
               sp[3], sp[4]);
        wset_free(&s);
    }
    printf("(vs old, vs sgemv: their time / ours, above 1 ours is faster; "
           "f32/lim: the read limit's time / ours, the fraction of the "
           "bandwidth reached; bf16 x: f32 time / bf16 time; bf16/l: half "
           "the read limit's time / bf16 time)\n");
    if (!quick)
        printf("one decode step's linear layers (28 layers of q, k, v, o, "
               "gate, up, down and the LM head), ms: ours f32 %.1f, old %.1f, "
               "sgemv %.1f, read limit %.1f, ours bf16 %.1f\n",
               1e3 * sum_t[0], 1e3 * sum_t[1], 1e3 * sum_t[2], 1e3 * sum_t[3],
               1e3 * sum_t[4]);
    print_load("load average at the end");
    tg_backend_cpu_free(b);
    return 0;
}
