/*
 * bench_kv_table.c — control-plane cost of ragged paging, side by side in
 * one run (DESIGN.md §4.3, §4.5):
 *   (a) block-table build for a batch: kv_table_build (OpenMP over rows,
 *       one memcpy per (layer, group) row) vs the plain reference build
 *       (tests/support/tt_kv.h: serial, per-page append); the OpenMP build
 *       is also timed on one thread;
 *   (b) prompt reservation of every request of the batch: one pool pop per
 *       request vs one pop per page;
 *   (c) one decode step: append a token to every request (pages for rows
 *       whose last page fills), then bring the table up to date: refresh
 *       of a padded table in place (the per-step path), dense OpenMP
 *       rebuild, or plain reservation + plain rebuild.
 * Shapes come from the Hugging Face configs in
 * $TANGRAM_DATA/configs (Llama-3.1-8B: 32 layers x 8 KV heads,
 * Qwen3-32B: 64 x 8, d = 128); requests hold 32K-token prompts under a
 * skewed synthetic profile of mean budget 0.25; H_p in {1, 2, 4, 8}.
 *
 * usage: bench-kv-table [--quick] [--model M] [--hp N] [--reqs N]
 *   --quick   one small shape (CI smoke run, well under a second)
 *   --model / --hp / --reqs   run only the matching rows of the full grid
 * Prints one row per (model, H_p, requests) with per-step times in
 * microseconds and plain/ours ratios, and checks that every path gives the
 * same table (hash of the dense builds; refreshed rows against the dense
 * table) and that the refresh never fell back to a rebuild.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/kv/kv_table.h"
#include "common/base/tg_err.h"
#include "common/json/tg_json.h"
#include "tests/support/tt_kv.h"
#include "tests/support/tt_support.h"

#define CONTEXT 32768
#define PAGE 16
#define CHUNK 512

struct shape {
    const char *name;
    const char *config; /* file under data/configs of the project */
    int n_layers, n_kv_heads, head_dim;
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static double uniform(void)
{
    /* xorshift64* (Vigna 2016), 53-bit mantissa. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * 0x1.0p-53;
}

/* Reads L, H, d from the model's config.json; head_dim falls back to
 * hidden_size / num_attention_heads (Llama configs omit it). */
static int load_shape(struct shape *s, const char *dir, char *err,
                      size_t errlen)
{
    char path[1024];
    tt_path(path, sizeof(path), "%s/configs/%s", dir, s->config);
    json_t *doc = NULL;
    int rc = tg_json_load_file(path, &doc, err, errlen);
    if (rc != 0)
        return rc;
    int64_t L, H, d = 0, hidden, heads;
    rc = tg_json_get_int(doc, "num_hidden_layers", "", 1, 1024, &L, err,
                         errlen);
    if (rc == 0)
        rc = tg_json_get_int(doc, "num_key_value_heads", "", 1, 1024, &H, err,
                             errlen);
    if (rc == 0 && json_object_get(doc, "head_dim") != NULL)
        rc = tg_json_get_int(doc, "head_dim", "", 1, 4096, &d, err, errlen);
    if (rc == 0 && d == 0) {
        rc = tg_json_get_int(doc, "hidden_size", "", 1, 1 << 20, &hidden, err,
                             errlen);
        if (rc == 0)
            rc = tg_json_get_int(doc, "num_attention_heads", "", 1, 4096,
                                 &heads, err, errlen);
        if (rc == 0)
            d = hidden / heads;
    }
    json_decref(doc);
    if (rc == 0) {
        s->n_layers = (int)L;
        s->n_kv_heads = (int)H;
        s->head_dim = (int)d;
    }
    return rc;
}

/* Skewed synthetic profile: per-head budget u^3 with u uniform on [0, 1)
 * (E[u^3] = 1/4, most heads small, a few near 1, like measured retention),
 * clipped to [1/1024, 1] as in §4.2. Heads are clustered per layer as in
 * §4.2 (sort by budget, H_p consecutive heads) and a group keeps its
 * members' max. Returns the (L, G) group budgets and the head-level mean. */
static double *make_budgets(int L, int H, int hp, double *mean_head)
{
    int G = H / hp;
    double *gb = malloc((size_t)L * G * sizeof(double));
    double *hb = malloc((size_t)H * sizeof(double));
    if (gb == NULL || hb == NULL) {
        free(gb);
        free(hb);
        return NULL;
    }
    double sum = 0;
    for (int l = 0; l < L; l++) {
        for (int h = 0; h < H; h++) {
            double u = uniform();
            hb[h] = fmax(1.0 / 1024, fmin(1.0, u * u * u));
            sum += hb[h];
        }
        /* Insertion sort: H is 8 here. */
        for (int i = 1; i < H; i++)
            for (int j = i; j > 0 && hb[j] < hb[j - 1]; j--) {
                double t = hb[j];
                hb[j] = hb[j - 1];
                hb[j - 1] = t;
            }
        for (int g = 0; g < G; g++)
            gb[l * G + g] = hb[g * hp + hp - 1];
    }
    *mean_head = sum / ((double)L * H);
    free(hb);
    return gb;
}

/* FNV-1a over a dense table's arrays, to compare builds without a second
 * copy. */
static uint64_t arrays_hash(const int32_t *indptr, const int32_t *indices,
                            const int32_t *rowlens, int64_t n_rows, int64_t nnz)
{
    uint64_t h = 1469598103934665603ull;
    const int32_t *arrs[3] = {indptr, indices, rowlens};
    int64_t lens[3] = {n_rows + 1, nnz, n_rows};
    for (int a = 0; a < 3; a++)
        for (int64_t i = 0; i < lens[a]; i++) {
            h ^= (uint32_t)arrs[a][i];
            h *= 1099511628211ull;
        }
    return h;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define MAX_REPS 15

struct result {
    double build_vec, build_vec1, build_plain, build_padded;
    double resv_vec, resv_plain;
    double dec_refresh, dec_full, dec_plain;
    double nnz, reclaimed, mean_budget;
    int64_t refresh_rebuilds;
    int same;
};

#define SLACK 8 /* spare slots per row of the padded table */

static int fail(const char *what, int rc, const char *err)
{
    fprintf(stderr, "bench-kv-table: %s: %s (%s)\n", what, tg_strerror(rc),
            err);
    return 1;
}

static int run_case(const struct shape *sh, int hp, int n_req, int reps,
                    struct result *res)
{
    char err[256] = "";
    int L = sh->n_layers, H = sh->n_kv_heads, G = H / hp;
    struct kv_layout lo;
    struct kv_pool pool;
    struct kv_table table, padded;
    struct tt_csr plain;
    struct kv_seq *seqs = NULL;
    const struct kv_seq **batch = NULL;
    memset(&lo, 0, sizeof(lo));
    memset(&pool, 0, sizeof(pool));
    memset(&table, 0, sizeof(table));
    memset(&padded, 0, sizeof(padded));
    memset(&plain, 0, sizeof(plain));
    int status = 1, rc;
    /* The same profile for every batch size of a (model, H_p). */
    rng_state = 0x2545f4914f6cdd1dull ^ ((uint64_t)L << 32) ^ (uint64_t)hp;
    double *gb = make_budgets(L, H, hp, &res->mean_budget);
    if (gb == NULL)
        return fail("budgets", TG_ENOMEM, "");
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    rc = kv_layout_init(&lo, L, G, hp, sh->head_dim, PAGE, CHUNK, &rule, gb,
                        err, sizeof(err));
    free(gb);
    if (rc != 0)
        return fail("layout", rc, err);
    int64_t per_req;
    rc = kv_seq_prompt_pages(NULL, &lo, 0, CONTEXT, &per_req, err, sizeof(err));
    if (rc != 0) {
        fail("prompt pages", rc, err);
        goto out;
    }
    /* Prompt pages plus room for the decode steps (at most one page per
     * row per 16 tokens, plus one for a row that is exactly full). */
    int64_t rows_per = (int64_t)L * G;
    if ((int64_t)n_req * per_req > 50000000 && reps > 3)
        reps = 3; /* the largest cases take seconds per repetition */
    /* Decode adds 3 * (reps + 1) tokens (three variants, one warm-up). */
    int64_t total =
        (int64_t)n_req * (per_req + rows_per * (3 * (reps + 1) / PAGE + 2));
    if (total > INT32_MAX) {
        fprintf(stderr, "bench-kv-table: pool of %lld pages too large\n",
                (long long)total);
        goto out;
    }
    rc = kv_pool_init(&pool, (int32_t)total, err, sizeof(err));
    if (rc == 0)
        rc = kv_table_init(&table, 0, 0, err, sizeof(err));
    if (rc == 0)
        rc = kv_table_init(&padded, 0, 0, err, sizeof(err));
    if (rc != 0) {
        fail("pool/table", rc, err);
        goto out;
    }
    seqs = calloc((size_t)n_req, sizeof(*seqs));
    batch = calloc((size_t)n_req, sizeof(*batch));
    if (seqs == NULL || batch == NULL) {
        fail("seqs", TG_ENOMEM, "");
        goto out;
    }
    for (int s = 0; s < n_req; s++) {
        if ((rc = kv_seq_init(&seqs[s], &lo, err, sizeof(err))) != 0) {
            fail("seq", rc, err);
            goto out;
        }
        batch[s] = &seqs[s];
    }

    /* (b) reservation, alternating plain and vectorized; every round but
     * the last vectorized one releases the requests again (not timed). */
    double tv[MAX_REPS], tp[MAX_REPS], t1[MAX_REPS];
    for (int k = 0; k < reps; k++) {
        for (int variant = 1; variant >= 0; variant--) {
            double t0 = now_us();
            for (int s = 0; s < n_req; s++) {
                rc = variant == 0
                         ? kv_seq_reserve_prompt(&seqs[s], &lo, &pool, 0,
                                                 CONTEXT, err, sizeof(err))
                         : tt_kv_seq_reserve_prompt_plain(&seqs[s], &lo, &pool,
                                                          0, CONTEXT, err,
                                                          sizeof(err));
                if (rc != 0) {
                    fail("reserve", rc, err);
                    goto out;
                }
            }
            (variant == 0 ? tv : tp)[k] = now_us() - t0;
            if (k == reps - 1 && variant == 0)
                break; /* keep the last reservation */
            for (int s = 0; s < n_req; s++)
                kv_seq_release(&seqs[s], &pool);
        }
    }
    res->resv_vec = median(tv, reps) / n_req;
    res->resv_plain = median(tp, reps) / n_req;
    for (int s = 0; s < n_req; s++)
        if ((rc = kv_seq_commit(&seqs[s], &lo, CONTEXT, err, sizeof(err))) != 0) {
            fail("commit", rc, err);
            goto out;
        }
    res->reclaimed = kv_pool_reclaimed_ratio(&pool);

    /* (a) build: OpenMP (all threads, then one), then plain; the first
     * build of each also sizes the buffers (not timed). */
    uint64_t hv = 0, hpl = 0;
    int nthreads = omp_get_max_threads();
    for (int k = -1; k < reps; k++) {
        double t0 = now_us();
        rc = kv_table_build(&table, &lo, batch, n_req, err, sizeof(err));
        double t_vec = now_us() - t0;
        if (rc != 0) {
            fail("build", rc, err);
            goto out;
        }
        if (k < 0)
            hv = arrays_hash(table.indptr, table.indices, table.lens,
                             table.n_rows, table.nnz);
        omp_set_num_threads(1);
        t0 = now_us();
        rc = kv_table_build(&table, &lo, batch, n_req, err, sizeof(err));
        double t_one = now_us() - t0;
        omp_set_num_threads(nthreads);
        t0 = now_us();
        if (rc == 0)
            rc = tt_csr_build(&plain, &lo, batch, n_req, err, sizeof(err));
        double t_plain = now_us() - t0;
        if (rc != 0) {
            fail("build", rc, err);
            goto out;
        }
        if (k < 0) {
            hpl = arrays_hash(plain.indptr, plain.indices, plain.lens,
                              plain.n_rows, plain.nnz);
            continue;
        }
        tv[k] = t_vec;
        t1[k] = t_one;
        tp[k] = t_plain;
    }
    res->build_vec = median(tv, reps);
    res->build_vec1 = median(t1, reps);
    res->build_plain = median(tp, reps);
    res->nnz = (double)table.nnz;
    res->same = hv == hpl;

    /* The padded table for the incremental path: its build is the cost
     * paid on a batch change that does not fit (amortised over at least
     * (SLACK - 1) * P + 1 decode steps otherwise). */
    for (int k = 0; k < reps; k++) {
        double t0 = now_us();
        rc = kv_table_build_padded(&padded, &lo, batch, n_req, SLACK, err,
                                   sizeof(err));
        tv[k] = now_us() - t0;
        if (rc != 0) {
            fail("padded build", rc, err);
            goto out;
        }
    }
    res->build_padded = median(tv, reps);

    /* (c) decode step: one token for every request, then the table:
     * refreshed in place (padded), rebuilt dense, or the plain way. Each
     * variant runs its steps back to back, as a server would, so one
     * variant's 100 MB rebuilds do not flush the caches of another. */
    int64_t builds0 = padded.n_builds;
    for (int variant = 0; variant < 3; variant++) {
        /* k = -1 warms up (steady state is what a serving loop sees; the
         * first step after 100 MB of other traffic pays cold TLBs). */
        for (int k = -1; k < reps; k++) {
            double t0 = now_us();
            for (int s = 0; s < n_req; s++) {
                rc = variant < 2
                         ? kv_seq_reserve_decode(&seqs[s], &lo, &pool, 1, err,
                                                 sizeof(err))
                         : tt_kv_seq_reserve_decode_plain(&seqs[s], &lo, &pool,
                                                          1, err, sizeof(err));
                if (rc != 0) {
                    fail("decode", rc, err);
                    goto out;
                }
            }
            if (variant == 0)
                rc = kv_table_refresh(&padded, &lo, batch, n_req, err,
                                      sizeof(err));
            else if (variant == 1)
                rc = kv_table_build(&table, &lo, batch, n_req, err,
                                    sizeof(err));
            else
                rc = tt_csr_build(&plain, &lo, batch, n_req, err, sizeof(err));
            if (rc != 0) {
                fail("decode build", rc, err);
                goto out;
            }
            double dt = now_us() - t0;
            if (k < 0)
                continue;
            if (variant == 0)
                tv[k] = dt;
            else if (variant == 1)
                t1[k] = dt;
            else
                tp[k] = dt;
        }
    }
    res->dec_refresh = median(tv, reps);
    res->dec_full = median(t1, reps);
    res->dec_plain = median(tp, reps);
    res->refresh_rebuilds = padded.n_builds - builds0;
    /* The refreshed table must hold what a fresh build holds, and that
     * what the plain path built last (untimed). */
    if (kv_table_build(&table, &lo, batch, n_req, err, sizeof(err)) != 0 ||
        arrays_hash(table.indptr, table.indices, table.lens, table.n_rows,
                    table.nnz) != arrays_hash(plain.indptr, plain.indices,
                                              plain.lens, plain.n_rows,
                                              plain.nnz))
        res->same = 0;
    if (kv_table_refresh(&padded, &lo, batch, n_req, err, sizeof(err)) != 0 ||
        padded.nnz != table.nnz ||
        memcmp(padded.lens, table.lens,
               (size_t)table.n_rows * sizeof(int32_t)) != 0 ||
        memcmp(padded.npages, table.npages,
               (size_t)table.n_rows * sizeof(int32_t)) != 0)
        res->same = 0;
    for (int32_t r = 0; r < table.n_rows && res->same; r += 997)
        if (memcmp(padded.indices + padded.indptr[r],
                   table.indices + table.indptr[r],
                   (size_t)table.npages[r] * sizeof(int32_t)) != 0)
            res->same = 0;
    status = 0;
out:
    if (seqs != NULL)
        for (int s = 0; s < n_req; s++)
            kv_seq_free(&seqs[s], &pool);
    if (status == 0 && kv_pool_n_used(&pool) != 0) {
        fprintf(stderr, "bench-kv-table: %d pages leaked\n",
                (int)kv_pool_n_used(&pool));
        status = 1;
    }
    free(seqs);
    free(batch);
    kv_table_free(&table);
    kv_table_free(&padded);
    tt_csr_free(&plain);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
    return status;
}

int main(int argc, char **argv)
{
    int quick = 0, only_hp = 0, only_reqs = 0;
    const char *only_model = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            only_model = argv[++i];
        } else if (strcmp(argv[i], "--hp") == 0 && i + 1 < argc) {
            only_hp = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--reqs") == 0 && i + 1 < argc) {
            only_reqs = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench-kv-table [--quick] [--model "
                            "Llama-3.1-8B|Qwen3-32B] [--hp N] [--reqs N]\n");
            return 2;
        }
    }
    struct shape shapes[2] = {
        {"Llama-3.1-8B", "meta-llama--Llama-3.1-8B-Instruct_config.json", 32,
         8, 128},
        {"Qwen3-32B", "Qwen--Qwen3-32B_config.json", 64, 8, 128},
    };
    const char *dir = getenv("TANGRAM_DATA");
    for (int i = 0; i < 2; i++) {
        char err[256] = "";
        int rc = dir != NULL ? load_shape(&shapes[i], dir, err, sizeof(err))
                             : TG_ENOENT;
        if (rc != 0)
            /* The shapes above are those configs' values (hard-coded
             * fallback so the benchmark runs without the shared folder). */
            printf("# %s: config not read (%s), using L=%d H=%d d=%d\n",
                   shapes[i].name, dir != NULL ? err : "TANGRAM_DATA unset",
                   shapes[i].n_layers, shapes[i].n_kv_heads,
                   shapes[i].head_dim);
    }
    const int hps[4] = {1, 2, 4, 8};
    const int reqs[3] = {64, 256, 1024};
    int n_shapes = quick ? 1 : 2, n_hp = quick ? 2 : 4, n_reqs = quick ? 1 : 3;
    int reps = quick ? 2 : 7;

    printf("# bench-kv-table: context %d tokens, P=%d, C=%d, snapkv rule, "
           "%d OpenMP threads, %d reps (median)\n",
           CONTEXT, PAGE, CHUNK, omp_get_max_threads(), reps);
    printf("# times in microseconds (median); x = plain / ours.\n"
           "# build: dense CSR of the whole batch (all threads, 1 thread, "
           "plain per-page loop); padded: build with %d spare slots per row\n"
           "# reserve: 32K-token prompt, per request (one pool pop vs one "
           "pop per page)\n"
           "# decode: 1 token for every request + table update: refresh of "
           "the padded table / dense rebuild / plain reserve + plain build\n",
           SLACK);
    printf("%-12s %3s %2s %4s %7s %6s %5s | %8s %8s %8s %5s %8s | %7s %7s "
           "%5s | %7s %8s %8s %6s %5s | %s\n",
           "model", "H_p", "G", "reqs", "rows", "pagesM", "saved", "build",
           "build1T", "plain", "x", "padded", "reserve", "plain", "x",
           "refresh", "dense", "plain", "x", "xdns", "same");
    int status = 0;
    for (int si = 0; si < n_shapes; si++)
        for (int hi = 0; hi < n_hp; hi++) {
            int hp = quick ? (hi == 0 ? 1 : 8) : hps[hi];
            if (shapes[si].n_kv_heads % hp != 0 ||
                (only_model && strcmp(only_model, shapes[si].name) != 0) ||
                (only_hp && only_hp != hp))
                continue;
            for (int ri = 0; ri < n_reqs; ri++) {
                int n_req = quick ? 16 : reqs[ri];
                if (only_reqs && only_reqs != n_req)
                    continue;
                struct result r;
                memset(&r, 0, sizeof(r));
                if (run_case(&shapes[si], hp, n_req, reps, &r) != 0) {
                    status = 1;
                    continue;
                }
                int G = shapes[si].n_kv_heads / hp;
                printf("%-12s %3d %2d %4d %7d %6.2f %4.1f%% | %8.1f %8.1f "
                       "%8.1f %5.2f %8.1f | %7.1f %7.1f %5.1f | %7.1f %8.1f "
                       "%8.1f %6.1f %5.2f | %s\n",
                       shapes[si].name, hp, G, n_req,
                       n_req * shapes[si].n_layers * G, r.nnz / 1e6,
                       100.0 * r.reclaimed, r.build_vec, r.build_vec1,
                       r.build_plain, r.build_plain / r.build_vec,
                       r.build_padded, r.resv_vec, r.resv_plain,
                       r.resv_plain / r.resv_vec, r.dec_refresh, r.dec_full,
                       r.dec_plain, r.dec_plain / r.dec_refresh,
                       r.dec_plain / r.dec_full,
                       r.same && r.refresh_rebuilds == 0 ? "yes" : "NO");
                fflush(stdout);
                if (!r.same)
                    status = 1;
            }
        }
    return status;
}
