/*
 * bench_cpu_attn.c — CPU backend throughput, measured side by side:
 *
 *   1. Decode attention over ragged pages (shuffled page ids, per-group
 *      lengths from TANGRAM-like budgets) against the same rows laid out
 *      contiguously (one page per group row, so every head's K and V are
 *      single contiguous runs). Reported as GB/s of K/V read and the ratio.
 *   2. GEMM through the op (x W^T + bias, model-like shapes) against the
 *      OpenBLAS peak measured here on a square NoTrans x Trans problem.
 *
 * Usage: bench-cpu-attn [--quick] [--threads N]
 *   --quick    tiny shapes, one repetition (the ctest smoke run)
 *   --threads  OpenMP threads of the backend (default: OpenMP's default)
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/tg_ops.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 88172645463325252ull;

static double urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1.0p-53;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "bench-cpu-attn: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(urand() * 2.0 - 1.0);
}

/* One sequence's rows at one layer, with its own page table. */
struct seq_rows {
    int32_t *head_group, *head_slot, *len;
    int32_t **pages;
    const int32_t **cpages;
};

struct decode_cfg {
    int n_seq, Hkv, G, d, H_p, P, ctx;
};

/* One layout of the decode problem: rows, pool and queries. */
struct decode_set {
    const struct decode_cfg *c;
    int n_groups;
    struct seq_rows *sr;
    struct tg_kv_rows *rows;
    float *pool, *q, *out;
    double kv_bytes; /* K/V bytes one call reads */
};

/* Builds the rows of cfg c, ragged (shuffled P-token pages) or contiguous
 * (one page per group row). */
static void decode_setup(struct decode_set *ds, const struct decode_cfg *c,
                         int contiguous)
{
    const int n_groups = c->Hkv / c->H_p, Hq = c->Hkv * c->G;
    /* Group budgets spread from 0.1 to 1 of the context (ragged rows). */
    int *glen = xmalloc(sizeof(int) * (size_t)n_groups);
    for (int g = 0; g < n_groups; g++) {
        double frac = n_groups > 1 ? 0.1 + 0.9 * g / (n_groups - 1) : 1.0;
        glen[g] = (int)(frac * c->ctx);
        if (glen[g] < 1)
            glen[g] = 1;
    }
    int P = contiguous ? c->ctx : c->P;
    int per_group = (c->ctx + P - 1) / P;
    int n_pages = c->n_seq * n_groups * per_group;
    size_t page_floats = (size_t)c->H_p * 2 * (size_t)P * (size_t)c->d;
    float *pool = xmalloc(sizeof(float) * page_floats * (size_t)n_pages);
    fill(pool, page_floats * (size_t)n_pages);
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    if (!contiguous)
        for (int i = n_pages - 1; i > 0; i--) {
            int j = (int)(urand() * (i + 1));
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    struct seq_rows *sr = xmalloc(sizeof(*sr) * (size_t)c->n_seq);
    struct tg_kv_rows *rows = xmalloc(sizeof(*rows) * (size_t)c->n_seq);
    int next = 0;
    double kv_bytes = 0;
    for (int s = 0; s < c->n_seq; s++) {
        sr[s].head_group = xmalloc(sizeof(int32_t) * (size_t)c->Hkv);
        sr[s].head_slot = xmalloc(sizeof(int32_t) * (size_t)c->Hkv);
        sr[s].len = xmalloc(sizeof(int32_t) * (size_t)n_groups);
        sr[s].pages = xmalloc(sizeof(int32_t *) * (size_t)n_groups);
        sr[s].cpages = xmalloc(sizeof(int32_t *) * (size_t)n_groups);
        for (int h = 0; h < c->Hkv; h++) {
            sr[s].head_group[h] = h / c->H_p;
            sr[s].head_slot[h] = h % c->H_p;
        }
        for (int g = 0; g < n_groups; g++) {
            sr[s].len[g] = glen[g];
            sr[s].pages[g] = xmalloc(sizeof(int32_t) * (size_t)per_group);
            for (int p = 0; p < per_group; p++)
                sr[s].pages[g][p] = perm[next++];
            sr[s].cpages[g] = sr[s].pages[g];
            kv_bytes += (double)glen[g] * c->H_p * c->d * 2 * sizeof(float);
        }
        rows[s] = (struct tg_kv_rows){
            .pool = pool, .heads_per_group = c->H_p, .page_size = P, .head_dim = c->d,
            .n_kv_heads = c->Hkv, .head_group = sr[s].head_group,
            .head_slot = sr[s].head_slot, .group_pages = sr[s].cpages,
            .group_len = sr[s].len};
    }
    size_t qn = (size_t)c->n_seq * (size_t)Hq * (size_t)c->d;
    float *q = xmalloc(sizeof(float) * qn), *out = xmalloc(sizeof(float) * qn);
    fill(q, qn);
    ds->c = c;
    ds->n_groups = n_groups;
    ds->sr = sr;
    ds->rows = rows;
    ds->pool = pool;
    ds->q = q;
    ds->out = out;
    ds->kv_bytes = kv_bytes;
    free(perm);
    free(glen);
}

/* Seconds of one decode-attention call over the set. */
static double decode_time(struct tg_backend *b, const struct decode_set *ds)
{
    const struct decode_cfg *c = ds->c;
    float scale = 1.0f / sqrtf((float)c->d);
    double t0 = now();
    int rc = tg_ops_cpu.attn_decode(b, ds->q, c->n_seq, c->Hkv * c->G, ds->rows,
                                    scale, ds->out);
    double dt = now() - t0;
    if (rc != 0) {
        fprintf(stderr, "bench-cpu-attn: attn_decode failed (%d)\n", rc);
        exit(1);
    }
    return dt;
}

static void decode_free(struct decode_set *ds)
{
    for (int s = 0; s < ds->c->n_seq; s++) {
        for (int g = 0; g < ds->n_groups; g++)
            free(ds->sr[s].pages[g]);
        free(ds->sr[s].pages);
        free(ds->sr[s].cpages);
        free(ds->sr[s].len);
        free(ds->sr[s].head_group);
        free(ds->sr[s].head_slot);
    }
    free(ds->sr);
    free(ds->rows);
    free(ds->q);
    free(ds->out);
    free(ds->pool);
}

/* Best seconds of `reps` calls of y = x W^T (+ bias) through the op, or of
 * a bare cblas_sgemm when raw is set. */
static double run_gemm(struct tg_backend *b, int m, int n, int k, int bias,
                       int raw, int reps)
{
    float *x = xmalloc(sizeof(float) * (size_t)m * k);
    float *w = xmalloc(sizeof(float) * (size_t)n * k);
    float *bv = xmalloc(sizeof(float) * (size_t)n);
    float *y = xmalloc(sizeof(float) * (size_t)m * n);
    fill(x, (size_t)m * k);
    fill(w, (size_t)n * k);
    fill(bv, (size_t)n);
    double best = INFINITY;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now();
        if (raw) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k,
                        w, k, 0.0f, y, n);
        } else if (tg_ops_cpu.gemm(b, x, w, bias ? bv : NULL, m, n, k, y) != 0) {
            fprintf(stderr, "bench-cpu-attn: gemm failed\n");
            exit(1);
        }
        double dt = now() - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    free(x);
    free(w);
    free(bv);
    free(y);
    return best;
}

int main(int argc, char **argv)
{
    int quick = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
            if (threads < 1) {
                fprintf(stderr, "bench-cpu-attn: --threads needs a positive count\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench-cpu-attn [--quick] [--threads N]\n");
            return 2;
        }
    }
    struct tg_backend *b = NULL;
    if (tg_backend_cpu_new(threads, &b) != 0) {
        fprintf(stderr, "bench-cpu-attn: cannot create the CPU backend\n");
        return 1;
    }
    int reps = quick ? 1 : 5;

    printf("# decode attention over ragged pages vs contiguous rows\n");
    printf("%-34s %10s %10s %10s %8s\n", "shape", "MB K/V", "paged GB/s",
           "contig GB/s", "ratio");
    const struct decode_cfg dq[] = {{2, 4, 2, 32, 2, 16, 64}};
    const struct decode_cfg df[] = {
        {8, 8, 4, 128, 4, 16, 2048},
        {16, 8, 4, 128, 2, 16, 1024},
        {4, 8, 1, 128, 4, 16, 4096},
    };
    const struct decode_cfg *dc = quick ? dq : df;
    int ndc = quick ? 1 : (int)(sizeof(df) / sizeof(df[0]));
    for (int i = 0; i < ndc; i++) {
        /* Both layouts live side by side and alternate, so load from other
         * processes hits them alike; best of reps each, after a warm-up. */
        struct decode_set paged, contig;
        decode_setup(&paged, &dc[i], 0);
        decode_setup(&contig, &dc[i], 1);
        double tp = INFINITY, tc = INFINITY;
        for (int r = 0; r < 2 * reps + 1; r++) {
            double a = decode_time(b, &paged), c2 = decode_time(b, &contig);
            if (r > 0) {
                tp = a < tp ? a : tp;
                tc = c2 < tc ? c2 : tc;
            }
        }
        double bytes = paged.kv_bytes, bytes2 = contig.kv_bytes;
        decode_free(&paged);
        decode_free(&contig);
        char shape[64];
        snprintf(shape, sizeof(shape), "seq=%d Hkv=%d G=%d d=%d Hp=%d ctx=%d",
                 dc[i].n_seq, dc[i].Hkv, dc[i].G, dc[i].d, dc[i].H_p, dc[i].ctx);
        printf("%-34s %10.1f %10.2f %10.2f %8.3f\n", shape, bytes / 1e6,
               bytes / tp / 1e9, bytes2 / tc / 1e9, tc / tp);
    }

    printf("\n# GEMM y = x W^T through the op vs the OpenBLAS peak\n");
    int pk = quick ? 128 : 1024;
    double tpk = run_gemm(b, pk, pk, pk, 0, 1, reps);
    double peak = 2.0 * pk * pk * pk / tpk / 1e9;
    printf("OpenBLAS peak (sgemm %dx%dx%d NoTrans/Trans): %.1f GFLOP/s\n", pk, pk, pk,
           peak);
    printf("%-28s %10s %10s\n", "m x n x k (+bias)", "GFLOP/s", "of peak");
    const int gq[][4] = {{1, 64, 64, 1}, {16, 64, 64, 0}};
    const int gf[][4] = {
        {1, 4096, 1024, 0},   /* decode GEMV: memory-bound */
        {16, 3072, 1024, 1},  /* small decode batch, q/k/v with bias */
        {256, 2048, 2048, 0}, /* prefill chunk */
        {512, 1024, 2816, 0}, /* prefill chunk, MLP down */
    };
    const int(*gs)[4] = quick ? gq : gf;
    int ngs = quick ? 2 : (int)(sizeof(gf) / sizeof(gf[0]));
    for (int i = 0; i < ngs; i++) {
        int m = gs[i][0], n = gs[i][1], k = gs[i][2], bias = gs[i][3];
        double t = run_gemm(b, m, n, k, bias, 0, reps);
        double gf_s = 2.0 * m * n * k / t / 1e9;
        char shape[64];
        snprintf(shape, sizeof(shape), "%d x %d x %d%s", m, n, k, bias ? " +b" : "");
        printf("%-28s %10.1f %9.1f%%\n", shape, gf_s, 100.0 * gf_s / peak);
    }
    tg_backend_cpu_free(b);
    return 0;
}
