/* test_evaluate_kl.c — gw_evaluate_run's KL(full || profile) is exact over
 * the whole vocabulary: for every scored assistant token of a two-turn
 * conversation (tiny qwen3 model, the qwen3 tokenizer's 151,936 ids, a
 * compressing profile, chunks of 48 (32 + 4 of them forced keys) so the
 * later tokens are scored over compressed KV), the value it reports equals KL computed here by brute
 * force from whole logits rows obtained another way: the prefix before
 * the token run through gw_engine_generate with the token forced, whose
 * raw logits row the engine leaves in the backend's host row (the path
 * decoding samples from, not the prompt log-probability blocks the
 * evaluation reads). Also: full KV's own KL is 0, the sums add up, and
 * the profile moves the distributions (some KL > 1e-4, so a KL over part
 * of the vocabulary, or a bound, would differ). The tiny model comes from
 * $TANGRAM_BIN/tangram-make-model (the test fails, naming it, when it is
 * not built). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_worker/engine/gw_engine.h"
#include "gpu_worker/engine/gw_evaluate.h"
#include "tests/support/tt_support.h"

#define PAGE 4
#define CHUNK 48
#define MAX_TOKENS 128 /* scored tokens recorded (the data has fewer) */

static char tmpdir[256];
static char model_dir[300];
static char profile_path[300];
static char data_path[300];
static char errbuf[1024];

static int setup(void **state)
{
    (void)state;
    if (tt_tmpdir_make("tg_test_evaluate_kl.", tmpdir, sizeof(tmpdir)) != 0)
        return -1;
    tt_path(model_dir, sizeof(model_dir), "%s/m", tmpdir);
    const char *const args[] = {
        "--arch",  "qwen3", "--hidden",   "64", "--layers",   "2",
        "--heads", "4",     "--kv-heads", "2",  "--head-dim", "16",
        "--ffn",   "128",   "--seed",     "3",  NULL};
    if (tt_make_model(model_dir, args) != 0)
        return -1;
    const double b[4] = {0.25, 0.5, 0.3, 0.75};
    tt_path(profile_path, sizeof(profile_path), "%s/profile.json", tmpdir);
    if (tt_write_profile(profile_path, "Qwen3ForCausalLM", 2, 2, 16, 1, b, NULL,
                         0.45) != 0)
        return -1;
    tt_path(data_path, sizeof(data_path), "%s/conv.jsonl", tmpdir);
    FILE *f = fopen(data_path, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "{\"messages\": ["
               "{\"role\": \"user\", \"content\": \"the cat sat on a mat "
               "and then went to see the old dog who lived near the "
               "river bank with many friends from town, and the dog "
               "told the cat a long story about the river and the "
               "town and the mat and the friends who lived there "
               "many years ago when the river was young\"},"
               "{\"role\": \"assistant\", \"content\": \"the dog was "
               "glad\"},"
               "{\"role\": \"user\", \"content\": \"what did they do "
               "next by the bank\"},"
               "{\"role\": \"assistant\", \"content\": \"they sat with "
               "friends from town\"}]}\n");
    return fclose(f) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

/* One scored token as the evaluation reported it. */
struct seen {
    int profile, q;
    int32_t *ids; /* (q + 1) the turn's ids through the token */
    double kl;
};

struct log {
    struct seen t[MAX_TOKENS];
    int n;
};

static void on_token(void *ud, int profile, const int32_t *ids, int q,
                     double kl)
{
    struct log *l = ud;
    assert_true(l->n < MAX_TOKENS);
    struct seen *s = &l->t[l->n++];
    s->profile = profile;
    s->q = q;
    s->kl = kl;
    s->ids = malloc(((size_t)q + 1) * sizeof(int32_t));
    assert_non_null(s->ids);
    memcpy(s->ids, ids, ((size_t)q + 1) * sizeof(int32_t));
}

/* The raw logits row that predicts ids[q] from ids[0, q), through e's
 * forced decode path, into row (V floats). */
static void row_of(struct gw_engine *e, const int32_t *ids, int q, float *row)
{
    struct gw_gen_params gp = {.max_tokens = 1,
                               .sampling = TG_SAMPLING_OFF,
                               .forced_ids = ids + q,
                               .n_forced = 1};
    struct gw_gen_result r;
    if (gw_engine_generate(e, ids, q, &gp, &r, errbuf, sizeof(errbuf)) != 0)
        fail_msg("prefix of %d tokens: %s", q, errbuf);
    size_t V = (size_t)e->model.vocab;
    memcpy(row, e->bk->logits + (size_t)e->step.row[0] * V, V * sizeof(float));
    gw_gen_result_free(&r);
}

/* KL(softmax(f) || softmax(g)) by the textbook formula, long double. */
static double brute_kl(const float *f, const float *g, int V)
{
    long double mf = f[0], mg = g[0], sf = 0, sg = 0, kl = 0;
    for (int i = 1; i < V; i++) {
        mf = f[i] > mf ? f[i] : mf;
        mg = g[i] > mg ? g[i] : mg;
    }
    for (int i = 0; i < V; i++) {
        sf += expl((long double)f[i] - mf);
        sg += expl((long double)g[i] - mg);
    }
    for (int i = 0; i < V; i++) {
        long double p = expl((long double)f[i] - mf) / sf;
        long double q = expl((long double)g[i] - mg) / sg;
        if (p > 0)
            kl += p * logl(p / q);
    }
    return (double)kl;
}

/* (The engine holds pointers into itself: it is built in place.) */
static void engine(struct gw_engine *e, const char *profile, int64_t ctx)
{
    struct gw_engine_opts eo = {.model_dir = model_dir,
                                .profile_path = profile,
                                .heads_per_group = 1,
                                .page_size = PAGE,
                                .prefill_chunk = CHUNK,
                                .max_context = ctx,
                                .n_threads = 1};
    assert_int_equal(gw_engine_init(e, &eo, errbuf, sizeof(errbuf)), 0);
}

static void test_kl_exact(void **state)
{
    (void)state;
    struct log lg = {.n = 0};
    const char *profiles[] = {profile_path};
    struct gw_eval_opts o = {.model_dir = model_dir,
                             .data_path = data_path,
                             .profiles = profiles,
                             .n_profiles = 1,
                             .prefill_chunk = CHUNK,
                             .page_size = PAGE,
                             .heads_per_group = 1,
                             .n_threads = 1,
                             .continuation = 0,
                             .max_tokens = 4096,
                             .tmp_dir = tmpdir,
                             .on_token = on_token,
                             .on_token_ud = &lg};
    struct gw_eval_result res;
    int rc = gw_evaluate_run(&o, &res, errbuf, sizeof(errbuf));
    if (rc != 0)
        fail_msg("gw_evaluate_run: %s", errbuf);
    assert_int_equal(res.n_profiles, 2);
    assert_int_equal(res.profiles[1].n_turn, 2);
    assert_int_equal(res.profiles[1].all.tokens, lg.n);
    assert_true(lg.n >= 8);
    assert_true(res.profiles[0].all.kl == 0.0);
    assert_int_equal(res.row_bytes, (int64_t)lg.n * (int64_t)res.vocab * 4);

    int64_t ctx = 0;
    for (int i = 0; i < lg.n; i++)
        ctx = lg.t[i].q + 1 > ctx ? lg.t[i].q + 1 : ctx;
    struct gw_engine full, comp;
    engine(&full, "none", ctx);
    engine(&comp, profile_path, ctx);
    int V = full.model.vocab;
    assert_int_equal(V, res.vocab);
    float *f = malloc((size_t)V * sizeof(float));
    float *g = malloc((size_t)V * sizeof(float));
    assert_non_null(f);
    assert_non_null(g);
    double sum = 0, most = 0;
    for (int i = 0; i < lg.n; i++) {
        const struct seen *s = &lg.t[i];
        assert_int_equal(s->profile, 1);
        row_of(&full, s->ids, s->q, f);
        row_of(&comp, s->ids, s->q, g);
        double want = brute_kl(f, g, V);
        /* The two paths compute the same rows with different GEMM row
         * counts (a chunk's block against one row): float rounding, far
         * below the KL values compared. */
        double tol = 1e-6 + 1e-4 * want;
        if (fabs(s->kl - want) > tol)
            fail_msg("token at %d: KL %.9g reported, %.9g by brute force", s->q,
                     s->kl, want);
        sum += s->kl;
        most = s->kl > most ? s->kl : most;
    }
    assert_true(fabs(sum - res.profiles[1].all.kl) <= 1e-9 * (1 + sum));
    assert_true(most > 1e-4); /* the profile moves the distributions */
    free(f);
    free(g);
    gw_engine_free(&full);
    gw_engine_free(&comp);
    for (int i = 0; i < lg.n; i++)
        free(lg.t[i].ids);
    gw_eval_result_free(&res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kl_exact),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
