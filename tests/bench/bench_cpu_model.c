/*
 * bench_cpu_model.c — end-to-end CPU backend throughput of a Qwen3-shaped
 * model, full KV against a TANGRAM profile of target ratio 0.25, measured
 * side by side in one run (DESIGN.md §7):
 *
 *   1. Chunked prefill (C = 512, §4.3) of a 1K and an 8K prompt: tokens/s,
 *      the fraction of keys kept and the pages reserved.
 *   2. Decode at 1K, 8K and 32K tokens of context, batch 1 and 8: ms per
 *      decode step, tokens/s, kept fraction, pages and KV bytes per
 *      sequence. The two variants' steps alternate, so machine load hits
 *      both alike. The context is reserved through the page accounting
 *      exactly as a real prompt's (kv_seq_reserve_prompt + kv_seq_commit)
 *      but its K/V are random values written into the runtime's pool
 *      instead of a real 32K prefill, which would take far too long on the
 *      CPU; decode cost depends only on how many keys each row holds.
 *
 * The model (random weights, built in memory, no files) has ~100M
 * parameters: hidden 768, 12 layers, 12 query heads, 4 KV heads of
 * dimension 64 (H_p = 2, so 2 groups per layer), SwiGLU 2048, vocabulary
 * 32000, tied embeddings, q/k RMSNorm. The 0.25 profile gives every
 * (layer, KV head) a budget drawn from a skewed (log-normal) distribution
 * whose mean is 0.25, clustered by budget into groups of H_p (§4.2). The
 * model, the budgets and the profile come from tests/support/tt_model.h,
 * shared with bench_cuda_model.c.
 *
 * Every prefill chunk and decode step checks that the rows' physical fill
 * equals the page accounting and that the logits are finite; a failed check
 * exits 1. The full run also exits 1 when decode at the longest context is
 * not faster with the profile than with full KV.
 *
 * Usage: bench-cpu-model [--quick] [--threads N] [--long-prefill-layers N]
 *   --quick                 tiny model and short contexts (the ctest run)
 *   --threads N             OpenMP threads of the backend (default: OpenMP's)
 *   --long-prefill-layers N layers of the model used for the 8K prefill row
 *                           (default 2 of 12: a 12-layer 8K prefill takes
 *                           minutes on 2 cores); the output says so
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/model/mc_model_config.h"
#include "common/profile/pf_profile.h"
#include "gpu_worker/cpu/gw_forward.h"
#include "common/kv/kv_layout.h"
#include "gpu_worker/model/gw_model.h"
#include "kernels/tg_ops.h"
#include "tests/support/tt_model.h"

#define PROG "bench-cpu-model"
#define MAX_BATCH 8
#define MAX_STEPS 16
#define MAX_CTX 4
#define TARGET_RATIO 0.25

/* ---- small helpers ------------------------------------------------------ */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The one random stream of the run (weights, budgets, ids, pool K/V), drawn
 * in a fixed order so every run builds the same model and profile. */
static struct tt_rng rng = {TT_RNG_SEED};

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n == 0 ? 1 : n, size);
    if (p == NULL) {
        fprintf(stderr, PROG ": out of memory (%zu x %zu bytes)\n", n, size);
        exit(1);
    }
    return p;
}

/* Stops the program on a failed call: rc != 0 prints what failed. */
static void check(int rc, const char *what, const char *err)
{
    if (rc != 0) {
        fprintf(stderr, PROG ": %s failed (%d): %s\n", what, rc, err);
        exit(1);
    }
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

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* The machine's 1/5/15-minute load: on a shared box it explains noise. */
static void print_load(const char *what)
{
    double la[3];
    if (getloadavg(la, 3) == 3)
        printf("%s: %.2f %.2f %.2f\n", what, la[0], la[1], la[2]);
}

/* ---- the two KV variants ------------------------------------------------ */

/* One way of keeping KV for one model: profile, layout, page accounting
 * pool and forward runtime (with its physical pool). */
struct variant {
    const char *name;
    const struct gw_model *model; /* borrowed */
    struct pf_profile prof;
    struct kv_layout lay;
    struct kv_pool pool;
    struct gw_runtime rt;
    int rows;              /* L * groups */
    size_t page_floats;    /* H_p * 2 * P * d */
};

/* budgets == NULL: full KV. Otherwise (L, Hkv) head budgets, clustered
 * into groups of H_p. The pool gets n_pages pages of random K/V. */
static void variant_init(struct variant *v, const char *name,
                         const struct gw_model *m, int H_p,
                         const double *budgets, int32_t n_pages,
                         struct tg_backend *be)
{
    char err[256] = "";
    memset(v, 0, sizeof(*v));
    v->name = name;
    v->model = m;
    int L = m->n_layers, H = m->n_kv_heads;
    check(tt_profile_from_budgets(&v->prof, "Qwen3ForCausalLM", L, H,
                                  m->head_dim, H_p, budgets, TARGET_RATIO, err,
                                  sizeof(err)), "profile", err);
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    check(kv_layout_from_profile(&v->lay, &v->prof, KV_PAGE_SIZE_DEFAULT,
                                 KV_PREFILL_CHUNK_DEFAULT, &rule, err,
                                 sizeof(err)), "layout", err);
    v->rows = L * v->lay.n_groups;
    v->page_floats = (size_t)kv_layout_page_elems(&v->lay);
    check(kv_pool_init(&v->pool, n_pages, err, sizeof(err)), "page pool", err);
    struct gw_forward_opts fo = {
        .method = TG_SCORE_SNAPKV,
        .max_tokens = KV_PREFILL_CHUNK_DEFAULT,
    };
    check(gw_runtime_init(&v->rt, m, &v->lay, &tg_ops_cpu, be, n_pages, &fo,
                          err, sizeof(err)), "runtime", err);
    /* Synthetic K/V for decode contexts: post-RoPE keys of a q/k-normed
     * model have entries of magnitude ~1. */
    tt_fill_uniform(&rng, v->rt.pool, (size_t)n_pages * v->page_floats, 1.0);
}

static void variant_free(struct variant *v)
{
    gw_runtime_free(&v->rt);
    kv_pool_free(&v->pool);
    kv_layout_free(&v->lay);
    pf_profile_free(&v->prof);
    memset(v, 0, sizeof(*v));
}

/* Pages one sequence of a `ctx`-token prompt plus `decode` decode tokens
 * needs under budgets (full when NULL), before a layout exists: the same
 * §4.3 math the accounting applies, plus one spare page per row. */
static int64_t seq_pages_bound(const struct gw_model *m, int H_p,
                               const double *budgets, int64_t ctx,
                               int64_t decode)
{
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    int H = m->n_kv_heads, G = H / H_p;
    int64_t pages = 0;
    for (int l = 0; l < m->n_layers; l++) {
        double *sorted = xcalloc((size_t)H, sizeof(double));
        for (int h = 0; h < H; h++)
            sorted[h] = budgets ? budgets[l * H + h] : 1.0;
        qsort(sorted, (size_t)H, sizeof(double), cmp_double);
        for (int g = 0; g < G; g++) {
            double b = sorted[g * H_p + H_p - 1]; /* clustered group max */
            int64_t t = kv_turn_keep(0, ctx, KV_PREFILL_CHUNK_DEFAULT, b, &rule);
            pages += kv_pages_for(t + decode, KV_PAGE_SIZE_DEFAULT) + 1;
        }
        free(sorted);
    }
    return pages;
}

/* ---- one sequence's pages as the forward pass sees them ------------------ */

struct bseq {
    struct kv_seq kv;
    int32_t *len;          /* (rows) physical fill, advanced by the forward */
    const int32_t **pages; /* (rows) views of kv's page ids */
    struct gw_seq gs;
};

/* Re-points the views after a reservation (the id slab may move). */
static void bseq_refresh(struct bseq *s, const struct variant *v)
{
    const struct kv_layout *kv = &v->lay;
    for (int l = 0; l < kv->n_layers; l++)
        for (int g = 0; g < kv->n_groups; g++) {
            int32_t n;
            s->pages[l * kv->n_groups + g] = kv_seq_row_ids(&s->kv, kv, l, g, &n);
        }
    s->gs.pages = s->pages;
    s->gs.n_pages = s->kv.n_pages;
    s->gs.len = s->len;
}

/* The physical fill must equal what the accounting says was written. */
static void bseq_check_fill(const struct bseq *s, const struct variant *v,
                            const char *where)
{
    for (int r = 0; r < v->rows; r++)
        if (s->len[r] != s->kv.filled[r]) {
            fprintf(stderr, PROG ": %s (%s): row %d holds %d tokens, the "
                    "accounting says %d\n", where, v->name, r, s->len[r],
                    s->kv.filled[r]);
            exit(1);
        }
}

/* Reserves a `n`-token prompt at position 0 for a fresh sequence. */
static void bseq_init(struct bseq *s, struct variant *v, int64_t n)
{
    char err[256] = "";
    memset(s, 0, sizeof(*s));
    check(kv_seq_init(&s->kv, &v->lay, err, sizeof(err)), "kv_seq_init", err);
    check(kv_seq_reserve_prompt(&s->kv, &v->lay, &v->pool, 0, n, err,
                                sizeof(err)), "prompt reservation", err);
    s->len = xcalloc((size_t)v->rows, sizeof(int32_t));
    s->pages = xcalloc((size_t)v->rows, sizeof(*s->pages));
    bseq_refresh(s, v);
}

static void bseq_free(struct bseq *s, struct variant *v)
{
    kv_seq_free(&s->kv, &v->pool);
    free(s->len);
    free(s->pages);
    memset(s, 0, sizeof(*s));
}

/* Kept keys over what full KV would hold, over all rows. */
static double bseq_kept(const struct bseq *s, const struct variant *v,
                        int64_t ctx)
{
    double sum = 0;
    for (int r = 0; r < v->rows; r++)
        sum += s->kv.filled[r];
    return sum / ((double)v->rows * (double)ctx);
}

/* ---- prefill ------------------------------------------------------------ */

struct prefill_res {
    double sec;
    double kept;
    int64_t pages;
};

/* One prefill chunk of `m` tokens at offset `off`; returns its seconds. */
static double prefill_chunk(struct variant *v, struct bseq *s,
                            const int32_t *ids, int off, int m, int last,
                            float *logits)
{
    char err[256] = "";
    struct gw_prefill_out po = {.want_logits = last,
                                .last_logits = last ? logits : NULL};
    double t0 = now();
    check(gw_forward_prefill(&v->rt, &s->gs, ids + off, m, &po, err,
                             sizeof(err)), "prefill chunk", err);
    double dt = now() - t0;
    check(kv_seq_commit(&s->kv, &v->lay, m, err, sizeof(err)), "commit", err);
    bseq_check_fill(s, v, "prefill");
    if (last && !all_finite(logits, (size_t)v->model->vocab)) {
        fprintf(stderr, PROG ": prefill (%s) produced non-finite logits\n",
                v->name);
        exit(1);
    }
    return dt;
}

/* Chunked prefill (§4.3) of ids[0..n) on a fresh sequence of each variant,
 * the two variants' chunks alternating so that load changes on a shared
 * machine hit both alike. */
static void run_prefill_pair(struct variant *vf, struct variant *vq,
                             const int32_t *ids, int n, float *logits,
                             struct prefill_res *rf, struct prefill_res *rq)
{
    const int C = vf->lay.prefill_chunk;
    struct bseq sf, sq;
    bseq_init(&sf, vf, n);
    bseq_init(&sq, vq, n);
    rf->sec = rq->sec = 0;
    for (int off = 0; off < n; off += C) {
        int m = n - off < C ? n - off : C;
        rf->sec += prefill_chunk(vf, &sf, ids, off, m, off + m == n, logits);
        rq->sec += prefill_chunk(vq, &sq, ids, off, m, off + m == n, logits);
    }
    rf->kept = bseq_kept(&sf, vf, n);
    rq->kept = bseq_kept(&sq, vq, n);
    rf->pages = sf.kv.used_pages;
    rq->pages = sq.kv.used_pages;
    if (rf->kept != 1.0) {
        fprintf(stderr, PROG ": full KV kept %.4f of the prompt\n", rf->kept);
        exit(1);
    }
    bseq_free(&sf, vf);
    bseq_free(&sq, vq);
}

/* ---- decode ------------------------------------------------------------- */

struct decode_set {
    int batch;
    struct bseq s[MAX_BATCH];
    struct gw_seq *ptr[MAX_BATCH];
};

/* `batch` sequences of `ctx` tokens each: pages reserved and committed as a
 * real prompt's, K/V taken from the pool's random contents. */
static void decode_setup(struct decode_set *ds, struct variant *v, int64_t ctx,
                         int batch)
{
    char err[256] = "";
    ds->batch = batch;
    for (int b = 0; b < batch; b++) {
        struct bseq *s = &ds->s[b];
        bseq_init(s, v, ctx);
        check(kv_seq_commit(&s->kv, &v->lay, ctx, err, sizeof(err)),
              "commit", err);
        memcpy(s->len, s->kv.filled, (size_t)v->rows * sizeof(int32_t));
        s->gs.pos = ctx;
        ds->ptr[b] = &s->gs;
    }
}

/* One decode step of the whole batch; returns the seconds of the forward
 * pass (the page accounting runs outside the timed region). */
static double decode_step(struct decode_set *ds, struct variant *v,
                          float *logits)
{
    char err[256] = "";
    int32_t ids[MAX_BATCH];
    for (int b = 0; b < ds->batch; b++) {
        struct bseq *s = &ds->s[b];
        check(kv_seq_reserve_decode(&s->kv, &v->lay, &v->pool, 1, err,
                                    sizeof(err)), "decode reservation", err);
        bseq_refresh(s, v);
        ids[b] = (int32_t)(tt_rng_uniform(&rng) * v->model->vocab);
    }
    double t0 = now();
    check(gw_forward_decode(&v->rt, ds->ptr, ids, ds->batch, 1, logits, err,
                            sizeof(err)), "decode step", err);
    double dt = now() - t0;
    for (int b = 0; b < ds->batch; b++)
        bseq_check_fill(&ds->s[b], v, "decode");
    if (!all_finite(logits, (size_t)ds->batch * (size_t)v->model->vocab)) {
        fprintf(stderr, PROG ": decode (%s) produced non-finite logits\n",
                v->name);
        exit(1);
    }
    return dt;
}

static void decode_free(struct decode_set *ds, struct variant *v)
{
    for (int b = 0; b < ds->batch; b++)
        bseq_free(&ds->s[b], v);
    ds->batch = 0;
}

/* ---- the plan ----------------------------------------------------------- */

struct plan {
    struct tt_shape sh;
    int H_p;                         /* heads per page */
    int prefill_short, prefill_long; /* prompt tokens */
    int long_layers;                 /* layers of the long prefill row */
    int dec_ctx[MAX_CTX];
    int n_dec_ctx;
    int batch8_max_ctx; /* batch 8 only up to this context (memory) */
    int steps, warm;    /* timed and untimed decode steps per row */
};

static const struct plan plan_full = {
    .sh = {MC_ARCH_QWEN3, 12, 768, 12, 4, 64, 2048, 32000, 1}, .H_p = 2,
    .prefill_short = 1024, .prefill_long = 8192, .long_layers = 2,
    .dec_ctx = {1024, 8192, 32768}, .n_dec_ctx = 3,
    .batch8_max_ctx = 8192, .steps = 10, .warm = 2,
};

static const struct plan plan_quick = {
    .sh = {MC_ARCH_QWEN3, 2, 64, 8, 4, 16, 128, 512, 1}, .H_p = 2,
    .prefill_short = 512, .prefill_long = 1536, .long_layers = 1,
    .dec_ctx = {256, 1024, 4096}, .n_dec_ctx = 3,
    .batch8_max_ctx = 1024, .steps = 3, .warm = 1,
};

static int32_t *random_ids(int n, int vocab)
{
    int32_t *ids = xcalloc((size_t)n, sizeof(int32_t));
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(tt_rng_uniform(&rng) * vocab);
    return ids;
}

/* Prints one prefill row, full and profile side by side. */
static void print_prefill_row(int n, int layers, int L, const char *note,
                              const struct prefill_res *f,
                              const struct prefill_res *q)
{
    printf("%7d %3d/%-3d | %10.1f %7.2f | %10.1f %7.2f | %6.3f | %8.4f | "
           "%8lld %8lld%s\n",
           n, layers, L, n / f->sec, f->sec, n / q->sec, q->sec,
           q->sec / f->sec, q->kept, (long long)f->pages, (long long)q->pages,
           note);
}

/* Prefill rows: the short prompt on the whole model, the long one on the
 * first long_layers layers. */
static void bench_prefill(const struct plan *pl, struct gw_model *m,
                          const double *budgets, struct variant *full,
                          struct variant *prof, struct tg_backend *be,
                          float *logits)
{
    printf("\n== prefill: chunked, C = %d tokens, snapkv scoring for the "
           "profile; tokens/s = prompt / summed chunk time; full and 0.25 chunks "
           "alternating ==\n",
           KV_PREFILL_CHUNK_DEFAULT);
    printf("ratio = 0.25 time / full time; kept = stored keys / full keys "
           "(full keeps 1); pg = pages reserved for the sequence\n");
    printf("%7s %7s | %10s %7s | %10s %7s | %6s | %8s | %8s %8s\n", "prompt",
           "layers", "full tok/s", "sec", "0.25 tok/s", "sec", "ratio",
           "kept .25", "pg full", "pg .25");
    int32_t *ids = random_ids(pl->prefill_long, m->vocab);

    struct prefill_res f, q;
    run_prefill_pair(full, prof, ids, pl->prefill_short, logits, &f, &q);
    print_prefill_row(pl->prefill_short, m->n_layers, m->n_layers, "", &f, &q);
    fflush(stdout);

    /* The long row uses the first long_layers layers of the same weights
     * (a shallow copy of the model) and the same budgets of those layers. */
    int Lp = pl->long_layers < m->n_layers ? pl->long_layers : m->n_layers;
    struct gw_model mp = *m;
    mp.n_layers = Lp;
    mp.cfg.num_layers = Lp;
    int H_p = pl->H_p;
    int32_t pf = (int32_t)seq_pages_bound(&mp, H_p, NULL, pl->prefill_long, 0);
    int32_t pq = (int32_t)seq_pages_bound(&mp, H_p, budgets, pl->prefill_long, 0);
    struct variant lf, lq;
    variant_init(&lf, "full", &mp, H_p, NULL, pf, be);
    variant_init(&lq, "0.25", &mp, H_p, budgets, pq, be);
    run_prefill_pair(&lf, &lq, ids, pl->prefill_long, logits, &f, &q);
    print_prefill_row(pl->prefill_long, Lp, m->n_layers,
                      Lp < m->n_layers ? "  (*)" : "", &f, &q);
    if (Lp < m->n_layers)
        printf("(*) this row runs only the first %d of the %d layers (same "
               "shapes and weights) to fit the time budget; tokens/s is of "
               "that %d-layer model\n", Lp, m->n_layers, Lp);
    variant_free(&lf);
    variant_free(&lq);
    free(ids);
}

struct decode_row {
    int ctx, batch;
    double ms_full, ms_prof;
    double kept;
    int64_t pages_full, pages_prof; /* per sequence, after setup */
};

/* One decode row: both variants set up, then their steps alternate. */
static void bench_decode_row(const struct plan *pl, struct variant *full,
                             struct variant *prof, int ctx, int batch,
                             float *logits, struct decode_row *row)
{
    static struct decode_set df, dq;
    double tf[MAX_STEPS], tq[MAX_STEPS];
    decode_setup(&df, full, ctx, batch);
    decode_setup(&dq, prof, ctx, batch);
    row->ctx = ctx;
    row->batch = batch;
    row->kept = bseq_kept(&dq.s[0], prof, ctx);
    row->pages_full = df.s[0].kv.used_pages;
    row->pages_prof = dq.s[0].kv.used_pages;
    if (bseq_kept(&df.s[0], full, ctx) != 1.0) {
        fprintf(stderr, PROG ": full KV keeps %.4f of the keys\n",
                bseq_kept(&df.s[0], full, ctx));
        exit(1);
    }
    for (int i = 0; i < pl->warm + pl->steps; i++) {
        double a = decode_step(&df, full, logits);
        double b = decode_step(&dq, prof, logits);
        if (i >= pl->warm) {
            tf[i - pl->warm] = a;
            tq[i - pl->warm] = b;
        }
    }
    row->ms_full = 1e3 * median(tf, pl->steps);
    row->ms_prof = 1e3 * median(tq, pl->steps);
    decode_free(&df, full);
    decode_free(&dq, prof);
}

int main(int argc, char **argv)
{
    int quick = 0, threads = 0, long_layers = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--long-prefill-layers") == 0 && i + 1 < argc) {
            long_layers = atoi(argv[++i]);
            if (long_layers < 1) {
                fprintf(stderr, PROG ": --long-prefill-layers must be >= 1\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: " PROG " [--quick] [--threads N] "
                    "[--long-prefill-layers N]\n");
            return 2;
        }
    }
    struct plan pl = quick ? plan_quick : plan_full;
    if (long_layers > 0)
        pl.long_layers = long_layers;
    const struct tt_shape *sh = &pl.sh;
    const int H_p = pl.H_p;
    double t_start = now();

    struct tg_backend *be = NULL;
    if (tg_backend_cpu_new(threads, &be) != 0) {
        fprintf(stderr, PROG ": cannot create the CPU backend\n");
        return 1;
    }
    struct gw_model model;
    char err[256] = "";
    check(tt_model_init_random(&model, sh, &rng, err, sizeof(err)),
          "random model", err);
    double *budgets = xcalloc((size_t)sh->L * (size_t)sh->Hkv, sizeof(double));
    check(tt_skewed_budgets(&rng, budgets, sh->L * sh->Hkv, TARGET_RATIO),
          "skewed budgets", "bad size or target");
    double bsum = 0, bmin = 1, bmax = 0;
    for (int i = 0; i < sh->L * sh->Hkv; i++) {
        bsum += budgets[i];
        bmin = fmin(bmin, budgets[i]);
        bmax = fmax(bmax, budgets[i]);
    }

    print_load("load average at the start");
    size_t params = tt_model_param_count(sh);
    if (threads > 0)
        printf(PROG ": CPU backend, %s mode, %d threads\n",
               quick ? "quick" : "full", threads);
    else
        printf(PROG ": CPU backend, %s mode, OpenMP default threads\n",
               quick ? "quick" : "full");
    printf("model: Qwen3-shaped, random weights: hidden %d, layers %d, q heads "
           "%d, kv heads %d, head_dim %d, ffn %d, vocab %d, tied embeddings, "
           "q/k norm\n", sh->hidden, sh->L, sh->Hq, sh->Hkv, sh->d, sh->ffn,
           sh->vocab);
    printf("parameters: %zu (%.1f MB fp32)\n", params, params * 4.0 / 1e6);
    printf("KV paging: P = %d tokens, H_p = %d heads per page (%d groups per "
           "layer), page = %zu bytes\n", KV_PAGE_SIZE_DEFAULT, H_p,
           sh->Hkv / H_p,
           (size_t)H_p * 2 * KV_PAGE_SIZE_DEFAULT * (size_t)sh->d * 4);
    printf("profile 0.25: %d head budgets, log-normal spread, mean %.4f "
           "(min %.4f, max %.4f), clustered groups, snapkv forced keys "
           "(window %d, sinks %d)\n", sh->L * sh->Hkv,
           bsum / (sh->L * sh->Hkv), bmin, bmax, KV_SNAPKV_WINDOW,
           KV_SINK_TOKENS);

    /* Pools of the 12-layer variants: the largest of the short prefill and
     * every decode row (batch included). */
    int steps_all = pl.warm + pl.steps;
    int64_t need_f = seq_pages_bound(&model, H_p, NULL, pl.prefill_short, 0);
    int64_t need_q = seq_pages_bound(&model, H_p, budgets, pl.prefill_short, 0);
    for (int c = 0; c < pl.n_dec_ctx; c++) {
        int b = pl.dec_ctx[c] <= pl.batch8_max_ctx ? MAX_BATCH : 1;
        int64_t f = b * seq_pages_bound(&model, H_p, NULL, pl.dec_ctx[c], steps_all);
        int64_t q = b * seq_pages_bound(&model, H_p, budgets, pl.dec_ctx[c], steps_all);
        need_f = f > need_f ? f : need_f;
        need_q = q > need_q ? q : need_q;
    }
    if (need_f > INT32_MAX) {
        fprintf(stderr, PROG ": %lld pages do not fit a pool\n", (long long)need_f);
        return 1;
    }
    struct variant full, prof;
    variant_init(&full, "full", &model, H_p, NULL, (int32_t)need_f, be);
    variant_init(&prof, "0.25", &model, H_p, budgets, (int32_t)need_q, be);
    double gsum = 0;
    for (int i = 0; i < prof.rows; i++)
        gsum += prof.lay.group_budget[i];
    printf("profile 0.25: mean group budget %.4f (a group keeps the max of "
           "its %d heads' budgets)\n", gsum / prof.rows, H_p);
    printf("KV pools: full %lld pages (%.1f MB), 0.25 %lld pages (%.1f MB)\n",
           (long long)need_f, need_f * full.page_floats * 4.0 / 1e6,
           (long long)need_q, need_q * prof.page_floats * 4.0 / 1e6);
    float *logits = xcalloc((size_t)MAX_BATCH * (size_t)sh->vocab, sizeof(float));

    bench_prefill(&pl, &model, budgets, &full, &prof, be, logits);

    printf("\n== decode: one token per sequence per step; context K/V "
           "reserved through kv_seq like a real prompt but filled "
           "synthetically (random K/V written into the pool, no real "
           "prefill); median of %d steps after %d warm-up, full and 0.25 "
           "steps alternating ==\n", pl.steps, pl.warm);
    printf("ratio = 0.25 ms / full ms; kept = stored keys / full keys "
           "(full keeps 1); pg = pages per sequence\n");
    printf("%7s %5s | %9s %9s | %9s %9s | %6s | %8s | %8s %8s | %13s %13s\n",
           "context", "batch", "full ms", "tok/s", "0.25 ms", "tok/s",
           "ratio", "kept .25", "pg full", "pg .25", "KV/seq full B",
           "KV/seq .25 B");
    struct decode_row rows[2 * MAX_CTX];
    int n_rows = 0;
    for (int c = 0; c < pl.n_dec_ctx; c++) {
        for (int bi = 0; bi < 2; bi++) {
            int batch = bi == 0 ? 1 : MAX_BATCH;
            if (batch > 1 && pl.dec_ctx[c] > pl.batch8_max_ctx)
                continue;
            struct decode_row *r = &rows[n_rows++];
            bench_decode_row(&pl, &full, &prof, pl.dec_ctx[c], batch, logits, r);
            double page_b = (double)full.page_floats * 4.0;
            printf("%7d %5d | %9.2f %9.1f | %9.2f %9.1f | %6.3f | %8.4f | "
                   "%8lld %8lld | %13.0f %13.0f\n",
                   r->ctx, r->batch, r->ms_full, 1e3 * batch / r->ms_full,
                   r->ms_prof, 1e3 * batch / r->ms_prof,
                   r->ms_prof / r->ms_full, r->kept, (long long)r->pages_full,
                   (long long)r->pages_prof, r->pages_full * page_b,
                   r->pages_prof * page_b);
            fflush(stdout);
        }
    }
    printf("(pages and KV bytes are per sequence at the start of the decode "
           "row; batch 8 is skipped above %d tokens of context to bound the "
           "pool's memory)\n", pl.batch8_max_ctx);

    /* Decode-step time must fall with the kept fraction: at the longest
     * context (batch 1) attention over the cache dominates the step. */
    const struct decode_row *last = NULL;
    for (int i = 0; i < n_rows; i++)
        if (rows[i].batch == 1)
            last = &rows[i];
    if (last == NULL) {
        fprintf(stderr, PROG ": no batch-1 decode row\n");
        return 1;
    }
    int ok = last->ms_prof < last->ms_full;
    printf("\ndecode-step time at %d tokens, batch 1: 0.25 / full = %.3f at "
           "kept fraction %.4f -> %s\n", last->ctx,
           last->ms_prof / last->ms_full, last->kept,
           ok ? "falls with the kept fraction" : "DOES NOT FALL");
    printf("total wall time %.1f s; ", now() - t_start);
    print_load("load average at the end");

    free(logits);
    variant_free(&full);
    variant_free(&prof);
    free(budgets);
    gw_model_free(&model);
    tg_backend_cpu_free(be);
    /* Timing is noisy on a shared machine, so the quick (ctest) run only
     * fails on broken checks, never on the speed verdict. */
    return ok || quick ? 0 : 1;
}
