/*
 * bench_cuda_model.c — end-to-end throughput of the CUDA forward runtime
 * (gpu_worker/cuda/gw_cuda.h) with full KV against TANGRAM profiles of target
 * ratio 0.75, 0.5 and 0.25 on one model shape, every variant given the
 * SAME KV memory in bytes (issue: "throughput at 0.25 >= 2.6x full KV
 * under memory pressure", the paper's headline on A100; TANGRAM, Kim et
 * al.). Measured side by side in one run (DESIGN.md §7):
 *
 *   1. Prefill: chunked prefill (§4.3, chunks of 1024 tokens; the CUDA
 *      backend compresses chunks of at most 2048) of one 8K-token prompt of
 *      random ids, snapkv scoring for the profiles; tokens/s = prompt /
 *      summed chunk time, median over repetitions after one warm-up.
 *   2. Decode under memory pressure, per context length (8K and 32K): as
 *      many sequences as the pool holds, capped at 256. A sequence takes
 *      what §4.3 reserves for a context-token prompt (kv_turn_keep per
 *      (layer, group), common/kv/kv_budget.h) plus the pages its rows grow
 *      into over the run's decode steps, so sequences = floor(pool pages /
 *      pages per sequence). The batch then decodes one token per sequence
 *      per step with CUDA graphs on (the median step after two warm-up
 *      steps: the first runs eagerly and captures the bucket's graph) and
 *      again with graphs off (the runtime's eager path), logits copied to
 *      pinned host memory every step as a worker sampling on the host
 *      must. tokens/s = batch / step time.
 *
 * Context K/V: every sequence is reserved and committed through the page
 * accounting (kv_pool + kv_seq) exactly like a real prompt, and its row
 * lengths are set to the kept counts, but its K/V are not computed by a
 * real 8K..32K prefill of hundreds of sequences (minutes per variant):
 * after init the whole device pool is overwritten with random bf16 values
 * uniform in [-1, 1] (the magnitude of keys and values of this random
 * model), copied from a 16 MiB host block. Decode cost depends only on
 * how many keys each row holds, not on their values.
 *
 * Model: random weights built in host memory (tests/support/tt_model.h),
 * Llama-3.1-8B-shaped by default (hidden 4096, 32 layers, 32 query / 8 KV
 * heads, d 128, SwiGLU 14336, vocabulary 128256, untied); --shape 1b for
 * a Llama-3.2-1B shape (hidden 2048, 16 layers, 32 / 8 heads, d 64, SwiGLU
 * 8192, tied; with Llama-3.1's RoPE scaling, which costs the same).
 * The fp32 host copy of the 8B shape is 32 GB; it is freed once the last
 * runtime has uploaded its bf16 copy. Only one runtime lives at a time
 * (build, measure, free) so each gets the device's memory.
 *
 * Profiles: (layer, KV head) budgets from a log-normal spread scaled to the
 * target mean (the same draws for every target), clustered by budget into
 * groups of H_p heads; full KV uses the same H_p, so every variant's page
 * is the same size and the KV memory gives the same page count. Split map:
 * pf_split_map (Algorithm 1) with N_CTA from tg_cuda_decode_attn_n_cta.
 *
 * Checks (exit 1): every call's row lengths equal the page accounting,
 * logits are finite, timed graph steps really launched graphs and timed
 * eager steps ran eagerly. The full run also exits 1 when the 0.25 profile
 * does not decode faster than full KV at some context where both fit; the
 * 2.6x target is reported, not enforced (it depends on the device).
 *
 * Usage: bench-cuda-model [--quick] [--shape 8b|1b] [--kv-gib X]
 *        [--heads-per-group N] [--contexts N,N,..] [--prompt N]
 *        [--chunk N] [--steps N] [--max-seqs N] [--device N]
 *   --quick   a tiny shape, 32 MiB of KV, short contexts, 2 steps (ctest)
 * Without a CUDA build or device it prints "skipped: no CUDA device" and
 * exits 77 (skipped).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/profile/pf_profile.h"
#include "common/profile/pf_split.h"
#include "common/base/tg_err.h"
#include "gpu_worker/cuda/gw_cuda.h"
#include "gpu_worker/cpu/gw_forward.h"
#include "common/kv/kv_layout.h"
#include "gpu_worker/model/gw_model.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_model.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "common/model/st_safetensors.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/decode_attn.h"
#endif

#define PROG "bench-cuda-model"
#define MAX_CTX 8
#define MAX_STEPS 64
#define N_VARIANTS 4
#define WARM_STEPS 2 /* graphs: eager + capture, then the first launch */
#define BUDGET_SEED 0x243f6a8885a308d3ull

struct bopts {
    int quick;
    const char *shape_name;
    struct tt_shape sh;
    int H_p;
    double kv_gib;
    int ctx[MAX_CTX], n_ctx;
    int prompt, chunk, steps, prefill_reps, max_seqs, device;
};

static const struct tt_shape shape_8b = {MC_ARCH_LLAMA, 32, 4096, 32, 8, 128,
                                         14336, 128256, 0};
static const struct tt_shape shape_1b = {MC_ARCH_LLAMA, 16, 2048, 32, 8, 64,
                                         8192, 128256, 1};
static const struct tt_shape shape_tiny = {MC_ARCH_LLAMA, 2, 256, 8, 4, 64,
                                           512, 1024, 0};

static void usage(void)
{
    fprintf(stderr, "usage: " PROG " [--quick] [--shape 8b|1b] [--kv-gib X] "
            "[--heads-per-group N] [--contexts N,N,..] [--prompt N] "
            "[--chunk N] [--steps N] [--max-seqs N] [--device N]\n");
}

/* Reads the integer after flag argv[*i] into *out within [lo, hi].
 * Returns 1 when argv[*i] is `flag` (and advances *i), 0 when it is
 * another flag, -1 on a missing or bad value. */
static int arg_int(int argc, char **argv, int *i, const char *flag, long lo,
                   long hi, int *out)
{
    if (strcmp(argv[*i], flag) != 0)
        return 0;
    if (*i + 1 >= argc)
        return -1;
    char *end = NULL;
    long v = strtol(argv[*i + 1], &end, 10);
    if (end == argv[*i + 1] || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s wants an integer in [%ld, %ld], got '%s'\n",
                flag, lo, hi, argv[*i + 1]);
        return -1;
    }
    *out = (int)v;
    (*i)++;
    return 1;
}

/* Parses "8192,32768" into o->ctx. Returns 0 or -1. */
static int parse_contexts(struct bopts *o, const char *s)
{
    o->n_ctx = 0;
    while (*s != '\0') {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > (1L << 24) || o->n_ctx == MAX_CTX ||
            (*end != ',' && *end != '\0'))
            return -1;
        o->ctx[o->n_ctx++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return o->n_ctx > 0 ? 0 : -1;
}

/* Fills *o from argv: defaults of the full or quick run, then the flags.
 * Returns 0, or 2 on bad usage (message printed). */
static int parse_args(struct bopts *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0)
            o->quick = 1;
    o->shape_name = o->quick ? "tiny" : "8b";
    o->sh = o->quick ? shape_tiny : shape_8b;
    o->H_p = 2;
    o->kv_gib = o->quick ? 1.0 / 32 : 16.0;
    if (o->quick) {
        o->ctx[0] = 512;
        o->ctx[1] = 2048;
    } else {
        o->ctx[0] = 8192;
        o->ctx[1] = 32768;
    }
    o->n_ctx = 2;
    o->prompt = o->quick ? 1024 : 8192;
    o->chunk = o->quick ? 256 : 1024;
    o->steps = o->quick ? 2 : 10;
    o->prefill_reps = o->quick ? 1 : 3;
    o->max_seqs = 256;
    o->device = 0;
    for (int i = 1; i < argc; i++) {
        int r = 0;
        if (strcmp(argv[i], "--quick") == 0)
            continue;
        if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
            const char *s = argv[++i];
            if (strcmp(s, "8b") == 0) {
                o->sh = shape_8b;
                o->shape_name = "8b";
            } else if (strcmp(s, "1b") == 0) {
                o->sh = shape_1b;
                o->shape_name = "1b";
            } else {
                fprintf(stderr, PROG ": --shape is 8b or 1b, got '%s'\n", s);
                return 2;
            }
            continue;
        }
        if (strcmp(argv[i], "--kv-gib") == 0 && i + 1 < argc) {
            char *end = NULL;
            o->kv_gib = strtod(argv[++i], &end);
            if (end == argv[i] || *end != '\0' || !(o->kv_gib > 0) ||
                o->kv_gib > 4096) {
                fprintf(stderr, PROG ": --kv-gib wants a size in GiB in "
                        "(0, 4096], got '%s'\n", argv[i]);
                return 2;
            }
            continue;
        }
        if (strcmp(argv[i], "--contexts") == 0 && i + 1 < argc) {
            if (parse_contexts(o, argv[++i]) != 0) {
                fprintf(stderr, PROG ": --contexts wants up to %d lengths "
                        "like 8192,32768, got '%s'\n", MAX_CTX, argv[i]);
                return 2;
            }
            continue;
        }
        if ((r = arg_int(argc, argv, &i, "--heads-per-group", 1, 16, &o->H_p)) ||
            (r = arg_int(argc, argv, &i, "--prompt", 1, 1 << 20, &o->prompt)) ||
            (r = arg_int(argc, argv, &i, "--chunk", 1, 2048, &o->chunk)) ||
            (r = arg_int(argc, argv, &i, "--steps", 1, MAX_STEPS, &o->steps)) ||
            (r = arg_int(argc, argv, &i, "--max-seqs", 1, 4096, &o->max_seqs)) ||
            (r = arg_int(argc, argv, &i, "--device", 0, 1024, &o->device))) {
            if (r < 0) {
                usage();
                return 2;
            }
            continue;
        }
        usage();
        return 2;
    }
    if (o->sh.Hkv % o->H_p != 0) {
        fprintf(stderr, PROG ": --heads-per-group %d does not divide the %d "
                "KV heads\n", o->H_p, o->sh.Hkv);
        return 2;
    }
    return 0;
}

#ifdef TANGRAM_CUDA

#define CK(expr) TT_CUDA_CK(PROG, expr)

static const double targets[N_VARIANTS] = {1.0, 0.75, 0.5, 0.25};
static const char *const names[N_VARIANTS] = {"full", "0.75", "0.5", "0.25"};

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
        fprintf(stderr, PROG ": %s failed (%s): %s\n", what, tg_err_name(rc),
                err);
        exit(1);
    }
}

/* ---- one variant: profile, layout, page accounting, runtime ------------ */

struct variant {
    const char *name;
    double target;
    struct pf_profile prof;
    struct kv_layout lay;
    struct kv_pool pool;   /* the page accounting of the runtime's pool */
    struct gw_cuda cu;
    int *splits;           /* (L, G) split map S[l][g] */
    int rows;              /* L * G */
    int max_split;
};

/* Profile (budgets NULL: full KV), layout with chunks of o->chunk tokens
 * and the split map for n_cta. No device memory yet. */
static void variant_layout(struct variant *v, const struct bopts *o,
                           const char *name, double target,
                           const double *budgets, int n_cta)
{
    char err[256] = "";
    memset(v, 0, sizeof(*v));
    v->name = name;
    v->target = target;
    const struct tt_shape *s = &o->sh;
    check(tt_profile_from_budgets(&v->prof, "LlamaForCausalLM", s->L, s->Hkv,
                                  s->d, o->H_p, budgets, target, err,
                                  sizeof(err)), "profile", err);
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    check(kv_layout_from_profile(&v->lay, &v->prof, KV_PAGE_SIZE_DEFAULT,
                                 o->chunk, &rule, err, sizeof(err)),
          "layout", err);
    v->rows = s->L * v->lay.n_groups;
    v->splits = xcalloc((size_t)v->rows, sizeof(int));
    check(pf_split_map(&v->prof, n_cta, v->splits, err, sizeof(err)),
          "split map", err);
    v->max_split = 1;
    for (int i = 0; i < v->rows; i++)
        v->max_split = v->splits[i] > v->max_split ? v->splits[i] : v->max_split;
}

/* Pages one sequence holds after a ctx-token prompt and n_dec decode
 * tokens: per (layer, group) what §4.3 keeps of the prompt in chunks of C
 * (kv_turn_keep) plus the decode tokens, in pages of P. */
static int64_t seq_pages(const struct kv_layout *kv, int64_t ctx, int64_t n_dec)
{
    int64_t pages = 0;
    for (int r = 0; r < kv->n_layers * kv->n_groups; r++) {
        int64_t t = kv_turn_keep(0, ctx, kv->prefill_chunk,
                                 kv->group_budget[r], &kv->rule);
        pages += kv_pages_for(t + n_dec, kv->page_size);
    }
    return pages;
}

static double mean_group_budget(const struct variant *v)
{
    double s = 0;
    for (int i = 0; i < v->rows; i++)
        s += v->lay.group_budget[i];
    return s / v->rows;
}

/* Overwrites the whole device pool (the scratch page included) with random
 * bf16 values uniform in [-1, 1], repeating one 16 MiB host block. */
static void pool_fill_random(struct variant *v, struct tt_rng *r)
{
    size_t elems = ((size_t)v->cu.n_pages + 1) *
                   (size_t)kv_layout_page_elems(&v->lay);
    size_t blk = (size_t)8 << 20;
    blk = blk < elems ? blk : elems;
    uint16_t *h = xcalloc(blk, sizeof(uint16_t));
    for (size_t i = 0; i < blk; i++)
        h[i] = st_f32_to_bf16((float)(tt_rng_uniform(r) * 2.0 - 1.0));
    for (size_t off = 0; off < elems; off += blk) {
        size_t n = elems - off < blk ? elems - off : blk;
        CK(cudaMemcpy(v->cu.pool + off, h, n * sizeof(uint16_t),
                      cudaMemcpyHostToDevice));
    }
    /* A pageable copy may return before its DMA lands, and the runtime's
     * stream does not wait for the legacy stream: finish it here. */
    CK(cudaDeviceSynchronize());
    free(h);
}

/* The device runtime over n_pages pages for decode batches up to
 * max_seqs, and the accounting pool of the same pages. */
static void variant_runtime(struct variant *v, const struct bopts *o,
                            const struct gw_model *m, int32_t n_pages,
                            int max_seqs, struct tt_rng *r)
{
    char err[512] = "";
    check(kv_pool_init(&v->pool, n_pages, err, sizeof(err)), "page pool", err);
    struct gw_cuda_opts co = {
        .device = o->device,
        .method = TG_SCORE_SNAPKV,
        .max_chunk = o->chunk,
        .max_seqs = max_seqs,
        .kv_pages = n_pages,
        .graphs = 1,
        .splits = v->splits,
    };
    check(gw_cuda_init(&v->cu, m, &v->lay, &co, err, sizeof(err)),
          "gw_cuda_init", err);
    if (v->cu.n_pages != n_pages) {
        fprintf(stderr, PROG ": runtime has %d pages, asked for %d\n",
                v->cu.n_pages, n_pages);
        exit(1);
    }
    pool_fill_random(v, r);
}

static void variant_free(struct variant *v)
{
    gw_cuda_free(&v->cu);
    kv_pool_free(&v->pool);
    free(v->splits);
    kv_layout_free(&v->lay);
    pf_profile_free(&v->prof);
    memset(v, 0, sizeof(*v));
}

/* ---- one sequence's pages as the runtime sees them ---------------------- */

struct bseq {
    struct kv_seq kv;      /* the router's accounting (pool reservations) */
    struct kv_seq w;       /* the worker's mirror of it (page ids handed
                              over, fill advanced by the runtime), which
                              the device block table is built from */
    const int32_t **pages; /* (rows) views of w's page ids */
    struct gw_seq gs;
};

/* Hands the worker's mirror the pages a reservation added and re-points
 * the views (the id slab may move), as the worker applies page deltas. */
static void bseq_refresh(struct bseq *s, const struct variant *v)
{
    for (int r = 0; r < v->rows; r++) {
        int32_t have = s->w.n_pages[r], np = s->kv.n_pages[r];
        if (np > have &&
            kv_seq_row_append(&s->w, r, s->kv.ids + s->kv.off[r] + have,
                              np - have) != 0) {
            fprintf(stderr, PROG ": out of memory for the page mirror\n");
            exit(1);
        }
        s->pages[r] = s->w.ids + s->w.off[r];
    }
    s->gs.pages = s->pages;
    s->gs.n_pages = s->w.n_pages;
    s->gs.len = s->w.filled;
    s->gs.kv = &s->w;
}

/* Reserves an n-token prompt at position 0 for a fresh sequence, and
 * checks the reservation against the §4.3 math of seq_pages. */
static void bseq_init(struct bseq *s, struct variant *v, int64_t n)
{
    char err[256] = "";
    memset(s, 0, sizeof(*s));
    check(kv_seq_init(&s->kv, &v->lay, err, sizeof(err)), "kv_seq_init", err);
    check(kv_seq_reserve_prompt(&s->kv, &v->lay, &v->pool, 0, n, err,
                                sizeof(err)), "prompt reservation", err);
    if (s->kv.used_pages != seq_pages(&v->lay, n, 0)) {
        fprintf(stderr, PROG ": %s: a %lld-token prompt took %lld pages, the "
                "reservation math says %lld\n", v->name, (long long)n,
                (long long)s->kv.used_pages,
                (long long)seq_pages(&v->lay, n, 0));
        exit(1);
    }
    check(kv_seq_init(&s->w, &v->lay, err, sizeof(err)), "kv_seq_init", err);
    s->pages = xcalloc((size_t)v->rows, sizeof(*s->pages));
    bseq_refresh(s, v);
}

static void bseq_free(struct bseq *s, struct variant *v)
{
    kv_seq_free(&s->kv, &v->pool);
    kv_seq_clear(&s->w); /* a mirror: its ids are the pool's via kv */
    kv_seq_free(&s->w, NULL);
    free(s->pages);
    memset(s, 0, sizeof(*s));
}

/* The device fill must equal what the accounting says was written. */
static void bseq_check_fill(const struct bseq *s, const struct variant *v,
                            const char *where)
{
    for (int r = 0; r < v->rows; r++)
        if (s->w.filled[r] != s->kv.filled[r]) {
            fprintf(stderr, PROG ": %s (%s): row %d holds %d tokens, the "
                    "accounting says %d\n", where, v->name, r, s->w.filled[r],
                    s->kv.filled[r]);
            exit(1);
        }
}

/* ---- prefill ------------------------------------------------------------ */

struct prefill_res {
    double sec;    /* median seconds of the whole prompt */
    double kept;   /* stored keys / prompt keys over all rows */
    int64_t pages; /* pages the prompt reserved */
};

/* Chunked prefill of ids[0..n) on a fresh sequence; returns the summed
 * seconds of the chunk calls (each synchronises its stream). */
static double prefill_once(struct variant *v, const int32_t *ids, int n,
                           int chunk, float *logits, struct prefill_res *res)
{
    char err[512] = "";
    struct bseq s;
    bseq_init(&s, v, n);
    double sec = 0;
    for (int off = 0; off < n; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        int last = off + m == n;
        struct gw_prefill_out po = {.want_logits = last,
                                    .last_logits = last ? logits : NULL};
        double t0 = tt_now_s();
        check(gw_cuda_prefill(&v->cu, &s.gs, ids + off, m, &po, err,
                              sizeof(err)), "prefill chunk", err);
        sec += tt_now_s() - t0;
        check(kv_seq_commit(&s.kv, &v->lay, m, err, sizeof(err)),
              "commit", err);
        bseq_check_fill(&s, v, "prefill");
    }
    if (!tt_all_finite(logits, (size_t)v->cu.model->vocab)) {
        fprintf(stderr, PROG ": prefill (%s) produced non-finite logits\n",
                v->name);
        exit(1);
    }
    double sum = 0;
    for (int r = 0; r < v->rows; r++)
        sum += s.kv.filled[r];
    res->kept = sum / ((double)v->rows * (double)n);
    res->pages = s.kv.used_pages;
    bseq_free(&s, v);
    return sec;
}

static void bench_prefill(struct variant *v, const struct bopts *o,
                          const int32_t *ids, float *logits,
                          struct prefill_res *res)
{
    double t[MAX_STEPS];
    prefill_once(v, ids, o->prompt, o->chunk, logits, res); /* warm-up */
    for (int i = 0; i < o->prefill_reps; i++)
        t[i] = prefill_once(v, ids, o->prompt, o->chunk, logits, res);
    res->sec = tt_median(t, o->prefill_reps);
}

/* ---- decode under memory pressure --------------------------------------- */

struct decode_res {
    int64_t pages_per_seq; /* prompt reservation + decode growth */
    int64_t fit;           /* floor(pool pages / pages_per_seq) */
    int batch;             /* min(fit, --max-seqs) */
    double ms_graph;       /* median step, CUDA graphs on */
    double ms_eager;       /* median step, graphs off */
};

/* Decode steps a sequence runs in one context row: graphs on, then off. */
static int decode_steps_total(const struct bopts *o)
{
    return 2 * (WARM_STEPS + o->steps);
}

/* warm + steps decode steps of the batch with graphs on or off; returns
 * the median milliseconds of the timed steps. The page accounting
 * (kv_seq_reserve_decode) runs outside the timed region. */
static double decode_phase(struct variant *v, const struct bopts *o,
                           struct bseq *S, struct gw_seq **ptr, int B,
                           int graphs, struct tt_rng *r, int32_t *ids,
                           float *logits)
{
    char err[512] = "";
    double t[MAX_STEPS];
    /* gw_cuda_decode reads opts.graphs on every call: off = the eager path
     * of the same runtime (no second weight upload). */
    v->cu.opts.graphs = graphs;
    int64_t g0 = 0, e0 = 0;
    for (int i = 0; i < WARM_STEPS + o->steps; i++) {
        for (int b = 0; b < B; b++) {
            check(kv_seq_reserve_decode(&S[b].kv, &v->lay, &v->pool, 1,
                                        err, sizeof(err)),
                  "decode reservation", err);
            bseq_refresh(&S[b], v);
            ids[b] = (int32_t)(tt_rng_uniform(r) * v->cu.model->vocab);
        }
        if (i == WARM_STEPS) {
            g0 = v->cu.graph_launches;
            e0 = v->cu.eager_steps;
        }
        double t0 = tt_now_s();
        check(gw_cuda_decode(&v->cu, ptr, ids, B, 1, logits, err, sizeof(err)),
              "decode step", err);
        double dt = tt_now_s() - t0;
        if (i >= WARM_STEPS)
            t[i - WARM_STEPS] = dt;
        for (int b = 0; b < B; b++)
            bseq_check_fill(&S[b], v, "decode");
        if (!tt_all_finite(logits, (size_t)B * (size_t)v->cu.model->vocab)) {
            fprintf(stderr, PROG ": decode (%s) produced non-finite logits\n",
                    v->name);
            exit(1);
        }
    }
    int64_t launched = v->cu.graph_launches - g0, eager = v->cu.eager_steps - e0;
    if (graphs && launched != o->steps) {
        fprintf(stderr, PROG ": %s: %lld of %d timed steps of batch %d ran as "
                "CUDA graphs (%s)\n", v->name, (long long)launched, o->steps, B,
                v->cu.graph_error[0] ? v->cu.graph_error : "no capture error");
        exit(1);
    }
    if (!graphs && eager != o->steps) {
        fprintf(stderr, PROG ": %s: graphs off, but only %lld of %d timed "
                "steps ran eagerly\n", v->name, (long long)eager, o->steps);
        exit(1);
    }
    v->cu.opts.graphs = 1;
    return 1e3 * tt_median(t, o->steps);
}

/* One context row: `batch` sequences of ctx committed tokens each (pages
 * reserved as real prompts, K/V the pool's random contents), decoded with
 * graphs on and off. */
static void bench_decode(struct variant *v, const struct bopts *o, int ctx,
                         struct decode_res *d, struct tt_rng *r, int32_t *ids,
                         float *logits)
{
    char err[256] = "";
    d->ms_graph = d->ms_eager = 0;
    if (d->batch < 1)
        return;
    int B = d->batch;
    struct bseq *S = xcalloc((size_t)B, sizeof(*S));
    struct gw_seq **ptr = xcalloc((size_t)B, sizeof(*ptr));
    for (int b = 0; b < B; b++) {
        bseq_init(&S[b], v, ctx);
        check(kv_seq_commit(&S[b].kv, &v->lay, ctx, err, sizeof(err)),
              "commit", err);
        memcpy(S[b].w.filled, S[b].kv.filled,
               (size_t)v->rows * sizeof(int32_t));
        S[b].gs.pos = ctx;
        ptr[b] = &S[b].gs;
    }
    d->ms_graph = decode_phase(v, o, S, ptr, B, 1, r, ids, logits);
    d->ms_eager = decode_phase(v, o, S, ptr, B, 0, r, ids, logits);
    for (int b = 0; b < B; b++)
        bseq_free(&S[b], v);
    free(S);
    free(ptr);
}

/* ---- the run ------------------------------------------------------------ */

struct result {
    double mean_budget;       /* mean group budget */
    double init_sec;
    struct prefill_res pre;
    struct decode_res dec[MAX_CTX];
};

static void print_header(const struct bopts *o, int argc, char **argv,
                         const struct tg_cuda_device_info *info, int n_cta,
                         int32_t n_pages, size_t page_bytes)
{
    const struct tt_shape *s = &o->sh;
    printf(PROG ": command line:");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\nGPU %d: %s, %d SMs, sm_%d%d, %.1f GiB\n", o->device, info->name,
           info->sm_count, info->cc_major, info->cc_minor,
           (double)info->total_mem / (1u << 30));
    size_t params = tt_model_param_count(s);
    printf("model: Llama-shaped (%s), random weights: hidden %d, layers %d, "
           "q heads %d, kv heads %d, head_dim %d, ffn %d, vocab %d, %s "
           "embeddings; %.2f B parameters (%.1f GB bf16 on the device)\n",
           o->shape_name, s->hidden, s->L, s->Hq, s->Hkv, s->d, s->ffn,
           s->vocab, s->tied ? "tied" : "untied", params / 1e9,
           params * 2.0 / 1e9);
    printf("KV memory: %.3f GiB for every variant = %d pages of %zu bytes "
           "(H_p %d, P %d, bf16; %zu bytes of KV per token of full KV)\n",
           o->kv_gib, n_pages, page_bytes, o->H_p, KV_PAGE_SIZE_DEFAULT,
           (size_t)s->L * s->Hkv * 2 * s->d * 2);
    printf("split map: N_CTA = %d (tg_cuda_decode_attn_n_cta, G %d, d %d); "
           "prefill chunk %d tokens; snapkv forced keys (window %d, sinks %d)\n",
           n_cta, s->Hq / s->Hkv, s->d, o->chunk, KV_SNAPKV_WINDOW,
           KV_SINK_TOKENS);
}

static void print_tables(const struct bopts *o, const struct variant *vs,
                         const struct result *res)
{
    const struct result *f = &res[0];
    printf("\n== prefill: one %d-token prompt in chunks of %d, median of %d "
           "after a warm-up ==\n", o->prompt, o->chunk, o->prefill_reps);
    printf("%-7s %8s | %11s %8s | %7s | %8s %7s\n", "variant", "mean b_g",
           "tok/s", "sec", "vs full", "kept", "pages");
    for (int i = 0; i < N_VARIANTS; i++) {
        const struct result *r = &res[i];
        printf("%-7s %8.4f | %11.1f %8.3f | %6.3fx | %8.4f %7lld\n",
               vs[i].name, r->mean_budget, o->prompt / r->pre.sec, r->pre.sec,
               f->pre.sec / r->pre.sec, r->pre.kept, (long long)r->pre.pages);
    }
    for (int c = 0; c < o->n_ctx; c++) {
        printf("\n== decode at %d tokens of context: as many sequences as the "
               "pool holds (cap %d), median of %d steps ==\n", o->ctx[c],
               o->max_seqs, o->steps);
        printf("%-7s %9s %6s %5s | %9s %10s %7s | %9s %7s\n", "variant",
               "pg/seq", "fit", "batch", "ms/step", "tok/s", "vs full",
               "eager ms", "graphs");
        double ftps = f->dec[c].batch > 0 ? 1e3 * f->dec[c].batch /
                                                f->dec[c].ms_graph : 0;
        for (int i = 0; i < N_VARIANTS; i++) {
            const struct decode_res *d = &res[i].dec[c];
            if (d->batch < 1) {
                printf("%-7s %9lld %6lld %5d | does not fit: one sequence "
                       "needs more pages than the pool\n", vs[i].name,
                       (long long)d->pages_per_seq, (long long)d->fit, 0);
                continue;
            }
            double tps = 1e3 * d->batch / d->ms_graph;
            char vs_full[16] = "n/a";
            if (ftps > 0)
                snprintf(vs_full, sizeof(vs_full), "%.3fx", tps / ftps);
            printf("%-7s %9lld %6lld %5d | %9.3f %10.1f %7s | %9.3f %6.3fx\n",
                   vs[i].name, (long long)d->pages_per_seq, (long long)d->fit,
                   d->batch, d->ms_graph, tps, vs_full, d->ms_eager,
                   d->ms_eager / d->ms_graph);
        }
    }
    printf("\n(pg/seq: pages one sequence reserves for the context plus its "
           "%d decode steps; fit = pool pages / pg/seq; tok/s = batch / step "
           "time with CUDA graphs; graphs = eager ms / graph ms at the same "
           "batch; context K/V are random values, see the top of "
           "bench_cuda_model.c)\n", decode_steps_total(o));
}

/* The 0.25 vs full decode verdict per context; returns 0 when 0.25 is
 * faster wherever both fit. */
static int print_verdict(const struct bopts *o, const struct result *res)
{
    int ok = 1;
    const struct result *f = &res[0], *q = &res[N_VARIANTS - 1];
    for (int c = 0; c < o->n_ctx; c++) {
        if (f->dec[c].batch < 1 || q->dec[c].batch < 1) {
            printf("decode at %d tokens: full KV or 0.25 does not fit; no "
                   "ratio\n", o->ctx[c]);
            continue;
        }
        double ratio = (q->dec[c].batch / q->dec[c].ms_graph) /
                       (f->dec[c].batch / f->dec[c].ms_graph);
        printf("decode at %d tokens: 0.25 / full KV throughput = %.2fx "
               "(target >= 2.6x, the paper's A100 headline): %s\n", o->ctx[c],
               ratio, ratio >= 2.6 ? "met" : "below the target");
        ok &= ratio > 1.0;
    }
    printf("prefill of %d tokens: 0.25 / full KV throughput = %.2fx\n",
           o->prompt, f->pre.sec / q->pre.sec);
    return ok ? 0 : 1;
}

static int run(const struct bopts *o, int argc, char **argv)
{
    char err[256] = "";
    double t_start = tt_now_s();
    CK(cudaSetDevice(o->device));
    struct tg_cuda_device_info info;
    check(tg_cuda_device_query(o->device, &info), "device query", "");
    const struct tt_shape *s = &o->sh;
    int n_cta = 0;
    check(tg_cuda_decode_attn_n_cta(s->Hq / s->Hkv, s->d, &n_cta),
          "tg_cuda_decode_attn_n_cta", "unsupported G or d");
    size_t page_bytes = (size_t)o->H_p * 2 * KV_PAGE_SIZE_DEFAULT *
                        (size_t)s->d * 2;
    double pages_d = floor(o->kv_gib * (double)(1u << 30) / (double)page_bytes);
    if (pages_d < 1 || pages_d > INT32_MAX) {
        fprintf(stderr, PROG ": --kv-gib %.3f gives %.0f pages of %zu bytes\n",
                o->kv_gib, pages_d, page_bytes);
        return 1;
    }
    int32_t n_pages = (int32_t)pages_d;
    print_header(o, argc, argv, &info, n_cta, n_pages, page_bytes);
    fflush(stdout);

    struct tt_rng rng;
    tt_rng_init(&rng, TT_RNG_SEED);
    struct gw_model model;
    double t0 = tt_now_s();
    check(tt_model_init_random(&model, s, &rng, err, sizeof(err)),
          "random model", err);
    printf("host model built in %.1f s (%.1f GB fp32)\n", tt_now_s() - t0,
           model.slab_bytes / 1e9);

    int n_heads = s->L * s->Hkv;
    double *budgets = xcalloc((size_t)n_heads, sizeof(double));
    int32_t *prompt = xcalloc((size_t)o->prompt, sizeof(int32_t));
    for (int i = 0; i < o->prompt; i++)
        prompt[i] = (int32_t)(tt_rng_uniform(&rng) * s->vocab);
    int32_t *ids = xcalloc((size_t)o->max_seqs, sizeof(int32_t));
    float *logits = NULL;
    CK(cudaMallocHost((void **)&logits,
                      (size_t)o->max_seqs * (size_t)s->vocab * sizeof(float)));

    struct variant vs[N_VARIANTS];
    struct result res[N_VARIANTS];
    memset(res, 0, sizeof(res));
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        struct variant *v = &vs[vi];
        struct result *r = &res[vi];
        if (targets[vi] < 1.0) {
            /* the same log-normal draws for every target */
            struct tt_rng br;
            tt_rng_init(&br, BUDGET_SEED);
            check(tt_skewed_budgets(&br, budgets, n_heads, targets[vi]),
                  "skewed budgets", "bad size or target");
        }
        variant_layout(v, o, names[vi], targets[vi],
                       targets[vi] < 1.0 ? budgets : NULL, n_cta);
        r->mean_budget = mean_group_budget(v);
        int max_batch = 1;
        int64_t n_dec = decode_steps_total(o);
        for (int c = 0; c < o->n_ctx; c++) {
            struct decode_res *d = &r->dec[c];
            d->pages_per_seq = seq_pages(&v->lay, o->ctx[c], n_dec);
            d->fit = n_pages / d->pages_per_seq;
            d->batch = (int)(d->fit < o->max_seqs ? d->fit : o->max_seqs);
            max_batch = d->batch > max_batch ? d->batch : max_batch;
        }
        if (seq_pages(&v->lay, o->prompt, 0) > n_pages) {
            fprintf(stderr, PROG ": the %d-token prompt does not fit %d "
                    "pages; raise --kv-gib\n", o->prompt, n_pages);
            return 1;
        }
        t0 = tt_now_s();
        variant_runtime(v, o, &model, n_pages, max_batch, &rng);
        r->init_sec = tt_now_s() - t0;
        if (vi == N_VARIANTS - 1)
            tt_model_drop_weights(&model); /* every runtime has uploaded */
        printf("%-5s: mean group budget %.4f, max split %d, runtime init "
               "%.1f s (decode buckets up to %d)\n", v->name, r->mean_budget,
               v->max_split, r->init_sec, max_batch);
        fflush(stdout);
        bench_prefill(v, o, prompt, logits, &r->pre);
        printf("%-5s: prefill %.1f tok/s\n", v->name, o->prompt / r->pre.sec);
        fflush(stdout);
        for (int c = 0; c < o->n_ctx; c++) {
            struct decode_res *d = &r->dec[c];
            bench_decode(v, o, o->ctx[c], d, &rng, ids, logits);
            if (d->batch > 0)
                printf("%-5s: decode at %d tokens, batch %d: %.3f ms/step "
                       "(%.1f tok/s), eager %.3f ms\n", v->name, o->ctx[c],
                       d->batch, d->ms_graph, 1e3 * d->batch / d->ms_graph,
                       d->ms_eager);
            fflush(stdout);
        }
        /* keep the layout for the tables, release the device and pool */
        gw_cuda_free(&v->cu);
        kv_pool_free(&v->pool);
    }
    print_tables(o, vs, res);
    printf("\n");
    int bad = print_verdict(o, res);
    printf("total wall time %.1f s\n", tt_now_s() - t_start);
    for (int vi = 0; vi < N_VARIANTS; vi++)
        variant_free(&vs[vi]);
    cudaFreeHost(logits);
    free(ids);
    free(prompt);
    free(budgets);
    gw_model_free(&model);
    /* Timing depends on the device and its load, so the quick (ctest) run
     * only fails on broken checks. */
    return o->quick ? 0 : bad;
}

#endif /* TANGRAM_CUDA */

int main(int argc, char **argv)
{
    struct bopts o;
    int rc = parse_args(&o, argc, argv);
    if (rc != 0)
        return rc;
#ifdef TANGRAM_CUDA
    int n = 0;
    if (!tt_cuda_have_device(NULL))
        return tt_cuda_skip("no CUDA device");
    if (tg_cuda_device_count(&n) != 0 || n < 1) {
        fprintf(stderr, PROG ": the device count failed\n");
        return 1;
    }
    if (o.device >= n) {
        fprintf(stderr, PROG ": --device %d, but %d device(s) present\n",
                o.device, n);
        return 2;
    }
    return run(&o, argc, argv);
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
