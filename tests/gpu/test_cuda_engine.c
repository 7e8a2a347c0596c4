/* test_cuda_engine.c — in-process generation and calibration on the CUDA
 * backend (gw_engine over gw_backend_cuda, what `tangram-generate
 * --backend cuda` and `tangram-profile calibrate --backend cuda` run)
 * against the same engine on the CPU backend, on a tiny generated Qwen3
 * (head_dim 64, 2 query heads per KV head):
 *  - generation with full KV and with a compressing profile (2 heads per
 *    group): the prompt's log-probabilities (150 tokens in chunks of 64)
 *    within bf16 tolerance, the prompt tokens kept per row exactly the
 *    CPU's (the §4.3 counts), 12 teacher-forced decode steps' log-
 *    probabilities within tolerance, a greedy run of 12 tokens equal to
 *    the CPU's up to its first near-tie, and the pages back in the pool;
 *  - --dump-kept's positions refused off the CPU backend (TG_EUNSUPPORTED);
 *  - the prompt's whole logits rows (gw_gen_params.prompt_rows, what
 *    `tangram-profile evaluate --backend cuda` computes its exact KL
 *    from) on both backends: exactly the positions from prompt_rows_from
 *    on, in order, each row's log-softmax at the prompt token equal to the
 *    backend's own prompt log-probability there (the same row: float
 *    against double, 1e-3);
 *  - the calibration hooks: every layer's key scores of a 150-token chunk
 *    and its normed, unrotated queries, shown by the CUDA runtime from the
 *    device, within tolerance of what the CPU forward pass shows (scores
 *    relative to their largest, queries to their magnitude).
 * Tolerances: bf16 weights, activations and K/V against fp32 ones (about
 * 3 significant digits per rounding, tens of roundings deep) — the
 * tolerances of test_cuda_model.c's whole-model comparison.
 * Without a device (or a CUDA build) it reports skipped (77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "gpu_worker/engine/gw_engine.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"

#define CHUNK 64
#define PROMPT 150
#define STEPS 12

static char tmpdir[512];
static char q3_dir[600], q3_profile[640];

static int setup(void **state)
{
    (void)state;
    if (tt_tmpdir_make("tg_test_cuda_engine.", tmpdir, sizeof(tmpdir)) != 0)
        return -1;
    snprintf(q3_dir, sizeof(q3_dir), "%s/q3", tmpdir);
    const char *const q3[] = {"--arch", "qwen3", "--hidden", "256", "--layers",
        "2", "--heads", "8", "--kv-heads", "4", "--head-dim", "64", "--ffn",
        "384", "--seed", "21", NULL};
    if (tt_make_model(q3_dir, q3) != 0)
        return -1;
    const double b[8] = {0.9, 0.3, 0.6, 0.2, 0.5, 0.55, 1.0, 0.25};
    const int groups[8] = {3, 1, 2, 0, 3, 0, 1, 2};
    snprintf(q3_profile, sizeof(q3_profile), "%s/q3.json", tmpdir);
    return tt_write_profile(q3_profile, "Qwen3ForCausalLM", 2, 4, 64, 2, b,
                            groups, 0.5);
}

static int teardown(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

static void prompt_of(int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        ids[i] = 1000 + (int32_t)((i * 7919) % 50000);
}

static void engine_open(struct gw_engine *e, enum gw_backend_kind kind,
                        const char *profile, int64_t ctx,
                        const struct gw_engine_opts *hooks)
{
    char err[512] = "";
    struct gw_engine_opts eo = {.model_dir = q3_dir, .profile_path = profile,
                                .heads_per_group = 2, .page_size = 16,
                                .prefill_chunk = CHUNK, .max_context = ctx,
                                .backend = kind};
    if (hooks != NULL) {
        eo.prefill_chunk = hooks->prefill_chunk;
        eo.on_scores = hooks->on_scores;
        eo.on_scores_ud = hooks->on_scores_ud;
        eo.on_queries = hooks->on_queries;
        eo.on_queries_ud = hooks->on_queries_ud;
    }
    if (gw_engine_init(e, &eo, err, sizeof(err)) != 0)
        fail_msg("%s engine: %s", kind == GW_BACKEND_CUDA ? "cuda" : "cpu",
                 err);
}

static void generate(struct gw_engine *e, const int32_t *prompt,
                     const struct gw_gen_params *p, struct gw_gen_result *r)
{
    char err[512] = "";
    if (gw_engine_generate(e, prompt, PROMPT, p, r, err, sizeof(err)) != 0)
        fail_msg("generate: %s", err);
}

/* max |a - b| over n values (NaN in both counts as equal). */
static double max_diff(const float *a, const float *b, int n)
{
    double m = 0.0;
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i]))
            continue;
        double d = fabs((double)a[i] - (double)b[i]);
        m = d > m || isnan(d) ? d : m;
    }
    return m;
}

static void run_generate(const char *profile, double tol)
{
    int32_t prompt[PROMPT];
    prompt_of(prompt, PROMPT);
    struct gw_engine cpu, gpu;
    engine_open(&cpu, GW_BACKEND_CPU, profile, PROMPT + STEPS, NULL);
    engine_open(&gpu, GW_BACKEND_CUDA, profile, PROMPT + STEPS, NULL);
    int L = cpu.layout.n_layers, G = cpu.layout.n_groups;

    /* greedy, with the prompt's log-probabilities */
    struct gw_gen_params gp = {
        .max_tokens = STEPS,
        .prompt_logprobs = 1,
        .ignore_eos = 1,
        .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f, .n_top = 2}};
    struct gw_gen_result rc, rg;
    generate(&cpu, prompt, &gp, &rc);
    generate(&gpu, prompt, &gp, &rg);
    double d = max_diff(rc.prompt_lp + 1, rg.prompt_lp + 1, PROMPT - 1);
    print_message("prompt logprobs: max |cuda - cpu| = %.4f (tol %.2f)\n", d,
                  tol);
    assert_true(d <= tol);
    assert_memory_equal(rc.kept, rg.kept, (size_t)L * G * sizeof(int32_t));
    int agree = 0;
    for (int t = 0; t < STEPS && rc.tokens[t] == rg.tokens[t]; t++)
        agree++;
    if (agree < STEPS) {
        /* they may part only where the CPU's top two were within tol */
        double gap = (double)rc.top_lps[(size_t)agree * 2] -
                     (double)rc.top_lps[(size_t)agree * 2 + 1];
        print_message("greedy parts at step %d (cpu top-2 gap %.4f)\n",
                      agree, gap);
        assert_true(gap <= 2 * tol);
    }
    assert_int_equal(rg.pages_used, rc.pages_used);

    /* teacher-forced over the CPU's tokens: every decode step compared */
    struct gw_gen_params fp = gp;
    fp.forced_ids = rc.tokens;
    fp.n_forced = STEPS;
    fp.prompt_logprobs = 0;
    struct gw_gen_result fc, fg;
    generate(&cpu, prompt, &fp, &fc);
    generate(&gpu, prompt, &fp, &fg);
    d = max_diff(fc.forced_lps, fg.forced_lps, STEPS);
    print_message("forced logprobs: max |cuda - cpu| = %.4f\n", d);
    assert_true(d <= tol);
    assert_int_equal(gpu.pool.n_free, gpu.pool.n_total);

    /* kept positions are recorded by the CPU forward pass only */
    struct gw_gen_params kp = {.max_tokens = 1, .dump_kept = 1,
                               .sampling = TG_SAMPLING_OFF};
    struct gw_gen_result rk;
    char err[512] = "";
    assert_int_equal(gw_engine_generate(&gpu, prompt, PROMPT, &kp, &rk, err,
                                        sizeof(err)),
                     TG_EUNSUPPORTED);
    assert_non_null(strstr(err, "--backend cpu"));
    gw_gen_result_free(&rk);
    gw_gen_result_free(&rc);
    gw_gen_result_free(&rg);
    gw_gen_result_free(&fc);
    gw_gen_result_free(&fg);
    gw_engine_free(&cpu);
    gw_engine_free(&gpu);
}

static void test_generate_full(void **state)
{
    (void)state;
    run_generate(NULL, 0.05);
}

static void test_generate_profile(void **state)
{
    (void)state;
    run_generate(q3_profile, 0.1);
}

/* What the hooks saw: per layer the scores (Hkv, n) and queries (n, Hq,
 * d) of the one chunk. */
struct seen {
    float *scores[2];
    float *q[2];
    int n, hkv, hq, d;
};

static void on_scores(void *ud, int layer, const float *s, int n, int hkv)
{
    struct seen *w = ud;
    w->n = n;
    w->hkv = hkv;
    w->scores[layer] = malloc((size_t)hkv * n * sizeof(float));
    memcpy(w->scores[layer], s, (size_t)hkv * n * sizeof(float));
}

static void on_queries(void *ud, int layer, const float *q, int n, int hq,
                       int d)
{
    struct seen *w = ud;
    w->hq = hq;
    w->d = d;
    w->q[layer] = malloc((size_t)n * hq * d * sizeof(float));
    memcpy(w->q[layer], q, (size_t)n * hq * d * sizeof(float));
}

static void run_hooks(enum gw_backend_kind kind, struct seen *w)
{
    int32_t prompt[PROMPT];
    prompt_of(prompt, PROMPT);
    struct gw_engine_opts hooks = {.prefill_chunk = PROMPT,
                                   .on_scores = on_scores,
                                   .on_scores_ud = w,
                                   .on_queries = on_queries,
                                   .on_queries_ud = w};
    struct gw_engine e;
    engine_open(&e, kind, NULL, PROMPT, &hooks);
    struct gw_gen_params gp = {.max_tokens = 0, .ignore_eos = 1};
    struct gw_gen_result r;
    generate(&e, prompt, &gp, &r);
    gw_gen_result_free(&r);
    gw_engine_free(&e);
}

static void test_calibration_hooks(void **state)
{
    (void)state;
    struct seen c = {0}, g = {0};
    run_hooks(GW_BACKEND_CPU, &c);
    run_hooks(GW_BACKEND_CUDA, &g);
    assert_int_equal(g.n, PROMPT);
    assert_int_equal(g.hkv, c.hkv);
    assert_int_equal(g.hq, c.hq);
    for (int l = 0; l < 2; l++) {
        assert_non_null(g.scores[l]);
        assert_non_null(g.q[l]);
        size_t ns = (size_t)c.hkv * PROMPT, nq = (size_t)PROMPT * c.hq * c.d;
        double top = 0.0, ds = 0.0, qmag = 0.0, dq = 0.0;
        for (size_t i = 0; i < ns; i++) {
            top = fabs(c.scores[l][i]) > top ? fabs(c.scores[l][i]) : top;
            double x = fabs((double)c.scores[l][i] - g.scores[l][i]);
            ds = x > ds ? x : ds;
        }
        for (size_t i = 0; i < nq; i++) {
            qmag += fabs(c.q[l][i]) / (double)nq;
            double x = fabs((double)c.q[l][i] - g.q[l][i]);
            dq = x > dq ? x : dq;
        }
        print_message("layer %d: scores max diff %.3g of %.3g, queries max "
                      "diff %.3g (mean |q| %.3g)\n", l, ds, top, dq, qmag);
        assert_true(ds <= 0.05 * top);
        assert_true(dq <= 0.05 * qmag + 0.02);
        free(c.scores[l]);
        free(g.scores[l]);
        free(c.q[l]);
        free(g.q[l]);
    }
}

/* What the prompt_rows callback saw. */
struct rows_seen {
    const int32_t *prompt;
    int n, next_pos, bad_order;
    float lp[PROMPT]; /* log-softmax of the row at the prompt's token */
};

static void on_rows(void *ud, int64_t pos, const float *row, int V)
{
    struct rows_seen *w = ud;
    if (pos != w->next_pos || pos >= PROMPT) {
        w->bad_order = 1;
        return;
    }
    w->next_pos++;
    w->n++;
    float mx = row[0];
    for (int i = 1; i < V; i++)
        mx = row[i] > mx ? row[i] : mx;
    double s = 0;
    for (int i = 0; i < V; i++)
        s += exp((double)row[i] - (double)mx);
    w->lp[pos] = (float)((double)row[w->prompt[pos]] - (double)mx - log(s));
}

static void run_rows(enum gw_backend_kind kind)
{
    enum { FROM = 70 }; /* the first chunk's rows are not asked for */
    int32_t prompt[PROMPT];
    prompt_of(prompt, PROMPT);
    struct gw_engine e;
    engine_open(&e, kind, q3_profile, PROMPT, NULL);
    struct rows_seen w = {.prompt = prompt, .next_pos = FROM};
    struct gw_gen_params gp = {.max_tokens = 0,
                               .sampling = TG_SAMPLING_OFF,
                               .prompt_logprobs = 1,
                               .prompt_rows = on_rows,
                               .prompt_rows_ud = &w,
                               .prompt_rows_from = FROM};
    struct gw_gen_result r;
    generate(&e, prompt, &gp, &r);
    assert_false(w.bad_order);
    assert_int_equal(w.n, PROMPT - FROM);
    double d = max_diff(w.lp + FROM, r.prompt_lp + FROM, PROMPT - FROM);
    print_message("%s rows: max |row lp - prompt lp| = %.2g\n",
                  kind == GW_BACKEND_CUDA ? "cuda" : "cpu", d);
    assert_true(d <= 1e-3);
    gw_gen_result_free(&r);
    gw_engine_free(&e);
}

static void test_prompt_rows(void **state)
{
    (void)state;
    run_rows(GW_BACKEND_CPU);
    run_rows(GW_BACKEND_CUDA);
}

int main(void)
{
#ifdef TANGRAM_CUDA
    const struct CMUnitTest dev[] = {
        cmocka_unit_test(test_generate_full),
        cmocka_unit_test(test_generate_profile),
        cmocka_unit_test(test_calibration_hooks),
        cmocka_unit_test(test_prompt_rows),
    };
    if (!tt_cuda_have_device("no CUDA device: skipped"))
        return 77;
    return cmocka_run_group_tests_name("cuda_engine", dev, setup, teardown);
#else
    (void)test_generate_full;
    (void)test_generate_profile;
    (void)test_calibration_hooks;
    (void)test_prompt_rows;
    (void)setup;
    (void)teardown;
    printf("built without CUDA: skipped\n");
    return 77;
#endif
}
