/* test_tp_logits.c — the vocab-parallel LM head (Megatron-LM's
 * vocab-parallel output layer, Shoeybi et al. 2019) through gw_forward:
 * T forked ranks, each with its model shard (gw_rank_load), its own
 * page accounting and a shared-memory comm (gw_comm.h), run the same
 * prefill chunks (with prompt logprobs) of two sequences and then decode
 * both as one batch; rank 0's logits after each prompt and its decode
 * logits (2, V) per step match T = 1 within 1e-5 of each row's largest
 * |logit| (at least 1), its prompt logprobs within 1e-5 relative (at
 * least 1e-5 absolute), and its greedy
 * tokens are the same. The tokenizer's vocabulary (151669) divides
 * by neither 2 nor 3, so the last rank's slice is padded. An untied Qwen3
 * (12 query / 6 KV heads) runs with T = 2 and 3, a tied Qwen2 (q/k/v bias,
 * 6 / 3 heads) with T = 3. Also: ranks > 0 that pass NULL outputs still
 * take part, rank 0 without an output buffer is refused, and a vocab slice
 * computation for V < T. Models come from $TANGRAM_BIN/tangram-make-model
 * (the test fails, naming it, when it is not built). Compute runs in forked children only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "gpu_worker/cpu/gw_comm.h"
#include "gpu_worker/model/gw_rank.h"
#include "gpu_worker/cpu/gw_forward.h"
#include "common/kv/kv_layout.h"
#include "tests/support/tt_support.h"

#define PAGE 8
#define CHUNK 16
#define POOL 256
#define NSEQ 2
#define STEPS 3      /* decode steps */
#define MAXP 40      /* longest prompt */
#define TOL 1e-5

static char tmpdir[256];
static char untied_dir[300], tied_dir[300];
static char errbuf[512];

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__,    \
                    __LINE__, #cond, errbuf);                              \
            _exit(1);                                                      \
        }                                                                  \
    } while (0)

static int make_models(void **state)
{
    (void)state;
    if (tt_tmpdir_make("tg_test_tp_logits.", tmpdir, sizeof(tmpdir)) != 0)
        return -1;
    snprintf(untied_dir, sizeof(untied_dir), "%s/untied", tmpdir);
    snprintf(tied_dir, sizeof(tied_dir), "%s/tied", tmpdir);
    const char *const a[] = {"--arch", "qwen3", "--hidden", "64", "--layers",
        "2", "--heads", "12", "--kv-heads", "6", "--head-dim", "16", "--ffn",
        "96", "--seed", "21", NULL};
    const char *const b[] = {"--arch", "qwen2", "--hidden", "64", "--layers",
        "2", "--heads", "6", "--kv-heads", "3", "--head-dim", "16", "--ffn",
        "96", "--seed", "22", "--tie", NULL};
    int rc = tt_make_model(untied_dir, a);
    if (rc != 0 || tt_make_model(tied_dir, b) != 0)
        return -1;
    return 0;
}

static int remove_models(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

/* What rank 0 reports, sizes from V. */
struct report {
    size_t V;
    float *last;   /* (NSEQ, V) logits after each prompt */
    float *dec;    /* (STEPS, NSEQ, V) decode logits */
    float *lp;     /* (NSEQ, MAXP) prompt logprobs, [0] unused */
    int32_t *tok;  /* (STEPS + 1, NSEQ) greedy tokens: after the prompt,
                      then after each decode step */
};

static size_t report_floats(size_t V)
{
    return NSEQ * V + STEPS * NSEQ * V + NSEQ * MAXP + (STEPS + 1) * NSEQ;
}

static void report_map(struct report *r, float *buf, size_t V)
{
    r->V = V;
    r->last = buf;
    r->dec = r->last + NSEQ * V;
    r->lp = r->dec + STEPS * NSEQ * V;
    r->tok = (int32_t *)(r->lp + NSEQ * MAXP);
}

static int32_t argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

static void refresh(const struct kv_layout *kv, const struct kv_seq *s,
                    const int32_t **pages)
{
    for (int l = 0; l < kv->n_layers; l++)
        for (int g = 0; g < kv->n_groups; g++) {
            int32_t n;
            pages[l * kv->n_groups + g] = kv_seq_row_ids(s, kv, l, g, &n);
        }
}

/* One rank: prompts, prompt logprobs, STEPS decode steps; decode tokens
 * are `feed`'s (the T = 1 run) when given, else its own argmax. Rank 0
 * writes the report to fd. */
static void run_rank(const char *dir, int rank, int world, const char *comm,
                     const int32_t *feed, int fd)
{
    struct gw_rank_opts ro = {.model_dir = dir,
                              .heads_per_group = 1,
                              .page_size = PAGE,
                              .prefill_chunk = CHUNK,
                              .rank = rank,
                              .world_size = world};
    struct gw_model m;
    struct pf_profile prof;
    struct kv_layout lay;
    enum tg_score_method method;
    CHECK(gw_rank_load(&m, &prof, &lay, &method, &ro, errbuf, sizeof(errbuf)) ==
          0);
    int first, count, vp;
    gw_model_vocab_slice(&m, &first, &count, &vp);
    CHECK(vp == (m.vocab + world - 1) / world && first == rank * vp);
    CHECK(count == (m.vocab - first < vp ? m.vocab - first : vp));
    struct gw_comm c;
    CHECK(gw_comm_init(&c, world > 1 ? comm : NULL, rank, world,
                       (size_t)CHUNK * (size_t)m.hidden, 5000, errbuf,
                       sizeof(errbuf)) == 0);
    struct tg_backend *be;
    CHECK(tg_backend_cpu_new(1, &be) == 0);
    struct gw_forward_opts fo = {.method = method, .max_tokens = CHUNK,
                                 .comm = &c};
    struct gw_runtime rt;
    CHECK(gw_runtime_init(&rt, &m, &lay, &tg_ops_cpu, be, POOL, &fo, errbuf,
                          sizeof(errbuf)) == 0);
    const struct kv_layout *kv = &lay;
    int rows = kv->n_layers * kv->n_groups;
    struct kv_pool pool;
    CHECK(kv_pool_init(&pool, POOL, errbuf, sizeof(errbuf)) == 0);

    size_t V = (size_t)m.vocab;
    float *buf = rank == 0 ? calloc(report_floats(V), sizeof(float)) : NULL;
    struct report r = {0};
    if (rank == 0)
        report_map(&r, buf, V);
    CHECK(rank != 0 || buf != NULL);
    const int np[NSEQ] = {37, 21};
    int32_t prompt[NSEQ][MAXP];
    for (int i = 0; i < MAXP; i++) {
        prompt[0][i] = (int32_t)((i * 7919 + 13) % 151000);
        prompt[1][i] = (int32_t)((i * 104729 + 401) % 151600);
    }
    struct kv_seq ks[NSEQ];
    struct gw_seq gs[NSEQ];
    int32_t *len[NSEQ];
    const int32_t **pages[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        memset(&ks[s], 0, sizeof(ks[s]));
        len[s] = calloc((size_t)rows, sizeof(int32_t));
        pages[s] = calloc((size_t)rows, sizeof(*pages[s]));
        CHECK(len[s] != NULL && pages[s] != NULL);
        CHECK(kv_seq_init(&ks[s], kv, errbuf, sizeof(errbuf)) == 0);
        CHECK(kv_seq_reserve_prompt(&ks[s], kv, &pool, 0, np[s], errbuf,
                                    sizeof(errbuf)) == 0);
        refresh(kv, &ks[s], pages[s]);
        gs[s] = (struct gw_seq){.pos = 0, .len = len[s], .pages = pages[s],
                                .n_pages = ks[s].n_pages};
        for (int off = 0; off < np[s]; off += CHUNK) {
            int n = np[s] - off < CHUNK ? np[s] - off : CHUNK;
            int last = off + n == np[s];
            int32_t tgt[CHUNK];
            for (int i = 0; i < n; i++)
                tgt[i] = off + i + 1 < np[s] ? prompt[s][off + i + 1] : -1;
            /* ranks > 0 pass no outputs, only the same decisions */
            struct gw_prefill_out po = {
                .want_logits = last,
                .last_logits = rank == 0 && last ? r.last + (size_t)s * V : NULL,
                .lp_targets = tgt,
                .lp = rank == 0 ? r.lp + (size_t)s * MAXP + off + 1 : NULL,
            };
            CHECK(gw_forward_prefill(&rt, &gs[s], prompt[s] + off, n, &po,
                                     errbuf, sizeof(errbuf)) == 0);
            CHECK(kv_seq_commit(&ks[s], kv, n, errbuf, sizeof(errbuf)) == 0);
        }
        if (rank == 0)
            r.tok[s] = argmax(r.last + (size_t)s * V, V);
    }
    for (int t = 0; t < STEPS; t++) {
        struct gw_seq *ptr[NSEQ];
        int32_t ids[NSEQ];
        for (int s = 0; s < NSEQ; s++) {
            CHECK(kv_seq_reserve_decode(&ks[s], kv, &pool, 1, errbuf,
                                        sizeof(errbuf)) == 0);
            refresh(kv, &ks[s], pages[s]);
            gs[s].n_pages = ks[s].n_pages;
            ptr[s] = &gs[s];
            ids[s] = feed != NULL ? feed[t * NSEQ + s] : r.tok[t * NSEQ + s];
        }
        CHECK(gw_forward_decode(&rt, ptr, ids, NSEQ, 1,
                                rank == 0 ? r.dec + (size_t)t * NSEQ * V : NULL,
                                errbuf, sizeof(errbuf)) == 0);
        for (int s = 0; rank == 0 && s < NSEQ; s++)
            r.tok[(t + 1) * NSEQ + s] =
                argmax(r.dec + ((size_t)t * NSEQ + (size_t)s) * V, V);
    }
    if (rank == 0) {
        /* No output buffer on rank 0 is refused before any collective
         * (the peers are done: this must not wait for them). */
        struct gw_seq *ptr[1] = {&gs[0]};
        int32_t one = 1;
        CHECK(gw_forward_decode(&rt, ptr, &one, 1, 1, NULL, errbuf,
                                sizeof(errbuf)) == TG_EINVAL);
        size_t bytes = report_floats(V) * sizeof(float);
        CHECK(write(fd, buf, bytes) == (ssize_t)bytes);
    }
    for (int s = 0; s < NSEQ; s++) {
        kv_seq_free(&ks[s], &pool);
        free(len[s]);
        free(pages[s]);
    }
    free(buf);
    kv_pool_free(&pool);
    gw_runtime_free(&rt);
    tg_backend_cpu_free(be);
    gw_comm_free(&c);
    kv_layout_free(&lay);
    pf_profile_free(&prof);
    gw_model_free(&m);
}

/* Runs T ranks; returns rank 0's report in a malloc'd buffer. */
static float *run_group(const char *dir, int world, const int32_t *feed,
                        size_t V)
{
    char comm[128];
    static unsigned serial;
    snprintf(comm, sizeof(comm), "/tangram-test-lg-%d-%u", (int)getpid(),
             serial++);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid[3];
    for (int r = 0; r < world; r++) {
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) {
            close(fds[0]);
            run_rank(dir, r, world, comm, feed, r == 0 ? fds[1] : -1);
            _exit(0);
        }
    }
    close(fds[1]);
    size_t want = report_floats(V) * sizeof(float), got = 0;
    float *buf = malloc(want);
    assert_non_null(buf);
    while (got < want) {
        ssize_t n = read(fds[0], (char *)buf + got, want - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fds[0]);
    for (int r = 0; r < world; r++) {
        int st;
        assert_int_equal(waitpid(pid[r], &st, 0), pid[r]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    assert_int_equal(got, want);
    return buf;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* Largest difference of rows of V logits, each relative to the row's
 * largest |logit| (at least 1): fp32 sums in another order (the
 * all-reduced partials) move every logit by a few ulps of the row's
 * scale, and a tied head with N(0, 1) embeddings has logits near 40. */
static double max_rel_rows(const float *a, const float *b, size_t rows,
                           size_t V)
{
    double worst = 0.0;
    for (size_t r = 0; r < rows; r++) {
        double scale = 1.0;
        for (size_t i = 0; i < V; i++)
            scale = fabs((double)b[r * V + i]) > scale ? fabs((double)b[r * V + i])
                                                       : scale;
        double d = max_diff(a + r * V, b + r * V, V) / scale;
        worst = d > worst ? d : worst;
    }
    return worst;
}

static void compare(const char *dir, const int *worlds, int n_worlds)
{
    struct mc_model_config cfg;
    assert_int_equal(mc_model_config_load(&cfg, dir, errbuf, sizeof(errbuf)), 0);
    size_t V = (size_t)cfg.vocab_size;
    float *ref_buf = run_group(dir, 1, NULL, V);
    struct report ref;
    report_map(&ref, ref_buf, V);
    for (int w = 0; w < n_worlds; w++) {
        int T = worlds[w];
        assert_int_not_equal(V % (size_t)T, 0); /* the last slice is padded */
        float *buf = run_group(dir, T, ref.tok, V);
        struct report got;
        report_map(&got, buf, V);
        double a_last = max_diff(got.last, ref.last, NSEQ * V);
        double a_dec = max_diff(got.dec, ref.dec, STEPS * NSEQ * V);
        double d_last = max_rel_rows(got.last, ref.last, NSEQ, V);
        double d_dec = max_rel_rows(got.dec, ref.dec, STEPS * NSEQ, V);
        double d_lp = 0.0;
        for (size_t i = 0; i < NSEQ * MAXP; i++) {
            /* log-probabilities of about -40 carry the logits' scale */
            double b = fabs((double)ref.lp[i]);
            double d = fabs((double)got.lp[i] - (double)ref.lp[i]) /
                       (b > 1.0 ? b : 1.0);
            d_lp = d > d_lp ? d : d_lp;
        }
        printf("  T = %d vs T = 1: largest logit difference %.3g / %.3g "
               "(prompt / decode; relative to the row's largest logit %.3g "
               "/ %.3g); prompt logprobs %.3g (relative)\n", T, a_last,
               a_dec, d_last, d_dec, d_lp);
        assert_true(d_last <= TOL);
        assert_true(d_dec <= TOL);
        assert_true(d_lp <= TOL);
        for (int i = 0; i < (STEPS + 1) * NSEQ; i++)
            assert_int_equal(got.tok[i], ref.tok[i]);
        /* every column is a real logit: nothing of the padding leaked */
        for (size_t i = 0; i < NSEQ * V; i++)
            assert_true(isfinite(got.last[i]));
        free(buf);
    }
    free(ref_buf);
}

static void test_untied_t2_t3(void **state)
{
    (void)state;
    const int worlds[] = {2, 3};
    compare(untied_dir, worlds, 2);
}

static void test_tied_t3(void **state)
{
    (void)state;
    const int worlds[] = {3};
    compare(tied_dir, worlds, 1);
}

/* The slice arithmetic at the edges (hand-filled models, no weights). */
static void test_vocab_slice(void **state)
{
    (void)state;
    struct gw_model m;
    memset(&m, 0, sizeof(m));
    int f, n, p;
    m.vocab = 10; /* zeroed world: one rank */
    gw_model_vocab_slice(&m, &f, &n, &p);
    assert_true(f == 0 && n == 10 && p == 10);
    m.world = 3;
    m.rank = 2; /* Vp = 4: rows 8, 9 and two padded columns */
    gw_model_vocab_slice(&m, &f, &n, &p);
    assert_true(f == 8 && n == 2 && p == 4);
    m.vocab = 2;
    m.rank = 2; /* V < T: the last rank holds nothing */
    gw_model_vocab_slice(&m, &f, &n, &p);
    assert_true(p == 1 && n == 0 && f == 2);
    m.rank = 1;
    gw_model_vocab_slice(&m, &f, &n, &p);
    assert_true(f == 1 && n == 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_untied_t2_t3),
        cmocka_unit_test(test_tied_t3),
        cmocka_unit_test(test_vocab_slice),
    };
    return cmocka_run_group_tests(tests, make_models, remove_models);
}
