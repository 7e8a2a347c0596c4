/*
 * test_cpu_sample.c — logprobs and the sampler of the CPU backend: greedy
 * ties, seeded reproducibility, top-k/top-p/min-p supports checked through
 * empirical frequencies on a small vocabulary (top-p over the renormalised
 * top-k survivors where that changes the kept set), penalties, raw
 * logprobs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "kernels/tg_ops.h"

static uint64_t rs = 0x51ed270b27a3c2f1ull;

static double urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1.0p-53;
}

static void near(double got, double want, double tol)
{
    double lim = tol * (fabs(want) > 1.0 ? fabs(want) : 1.0);
    if (!(fabs(got - want) <= lim)) {
        print_error("got %.9g want %.9g (tol %.3g)\n", got, want, tol);
        fail();
    }
}

/* A sampling value tg_sampling_check refuses reaching the sampler is a
 * caller's bug (the value is checked once where it enters): the sampler
 * stops the process (TG_ASSERT, abort) instead of answering. Tried in a
 * child, whose assertion message goes to stderr. */
static void sample_aborts(struct tg_backend *b, const struct tg_sampling *sp,
                          int vocab)
{
    float x[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int32_t tok;
        uint64_t rng = 1;
        (void)tg_ops_cpu.sample(b, x, vocab, sp, NULL, &rng, &tok, NULL, 0,
                                NULL, NULL);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT)
        fail_msg("the sampler answered a refused value (status %d)", st);
}

static struct tg_backend *be(void)
{
    struct tg_backend *b = NULL;
    assert_int_equal(tg_backend_cpu_new(2, &b), 0);
    return b;
}

static const struct tg_sampling plain = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                                         .min_p = 0.0f, .repetition_penalty = 1.0f};

static double ref_logprob(const float *x, int V, int t)
{
    double mx = -INFINITY, z = 0;
    for (int j = 0; j < V; j++)
        mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < V; j++)
        z += exp((double)x[j] - mx);
    return x[t] - mx - log(z);
}

static void test_logprobs(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int shapes[][2] = {{1, 1}, {3, 10}, {4, 50000}};
    for (int s = 0; s < 3; s++) {
        int n = shapes[s][0], V = shapes[s][1];
        float *x = malloc(sizeof(float) * n * V), *lp = malloc(sizeof(float) * n);
        int32_t *t = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n * V; i++)
            x[i] = (float)(urand() * 40 - 20);
        for (int i = 0; i < n; i++)
            t[i] = (int32_t)(urand() * V);
        assert_int_equal(tg_ops_cpu.logprobs(b, x, n, V, t, lp), 0);
        for (int i = 0; i < n; i++)
            near(lp[i], ref_logprob(x + (size_t)i * V, V, t[i]), 1e-5);
        t[0] = V;
        assert_int_equal(tg_ops_cpu.logprobs(b, x, n, V, t, lp), TG_EINVAL);
        free(x);
        free(lp);
        free(t);
    }
    tg_backend_cpu_free(b);
}

/* logprobs_top: the same values as logprobs, each target's rank (1 + the
 * ids strictly more likely; NaN never is) and the k most likely ids in
 * (logit desc, id asc) order with values equal to the target's own. */
static void test_logprobs_top(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    enum { N = 3, V = 9, K = 4 };
    const float x[N * V] = {
        0, 3,   1, 3, -2, 5, 1, 0, 2,  /* 5@5, 3@1, 3@3 (tie: id asc), 2@8 */
        1, 1,   1, 1, 1,  1, 1, 1, 1,  /* all tied */
        0, NAN, 4, 0, 0,  0, 0, 0, -1, /* NaN last, never above */
    };
    const int32_t t[N] = {3, 7, 2};
    float lp[N], lp1[N], tv[N * K];
    int32_t rank[N], ti[N * K];
    assert_int_equal(
        tg_ops_cpu.logprobs_top(b, x, N, V, t, K, lp, rank, ti, tv), 0);
    assert_int_equal(tg_ops_cpu.logprobs(b, x, N, V, t, lp1), 0);
    /* bit for bit (row 2's NaN makes its value NaN on both) */
    assert_memory_equal(lp, lp1, sizeof(lp));
    assert_int_equal(rank[0], 2); /* only id 5 is strictly above */
    assert_int_equal(rank[1], 1);
    assert_int_equal(rank[2], 1);
    const int32_t want[N][K] = {{5, 1, 3, 8}, {0, 1, 2, 3}, {2, 0, 3, 4}};
    for (int i = 0; i < N; i++)
        for (int k = 0; k < K; k++)
            assert_int_equal(ti[i * K + k], want[i][k]);
    assert_true(tv[0 * K + 2] == lp[0]); /* id 3, the target of row 0 */
    near(tv[0], ref_logprob(x, V, 5), 1e-5);
    /* k 0 leaves the alternatives alone; bad targets are refused */
    assert_int_equal(
        tg_ops_cpu.logprobs_top(b, x, N, V, t, 0, lp, rank, NULL, NULL), 0);
    const int32_t bad[N] = {0, V, 0};
    assert_int_equal(
        tg_ops_cpu.logprobs_top(b, x, N, V, bad, K, lp, rank, ti, tv),
        TG_EINVAL);
    tg_backend_cpu_free(b);
}

static void test_greedy(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    float x[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 3.0f};
    struct tg_sampling sp = plain;
    sp.temperature = 0.0f;
    int32_t tok = -1;
    float lp = 0;
    uint64_t rng = 42, rng0 = rng;
    assert_int_equal(tg_ops_cpu.sample(b, x, 6, &sp, NULL, &rng, &tok, &lp, 0, NULL, NULL), 0);
    assert_int_equal(tok, 1); /* ties to the lower id */
    near(lp, ref_logprob(x, 6, 1), 1e-6);
    assert_true(rng == rng0); /* greedy draws nothing */
    /* Greedy needs no generator. */
    assert_int_equal(tg_ops_cpu.sample(b, x, 6, &sp, NULL, NULL, &tok, NULL, 0, NULL, NULL), 0);
    assert_int_equal(tok, 1);
    /* top-k = 1 at temperature 1 is greedy too, ties included. */
    sp = plain;
    sp.top_k = 1;
    for (int r = 0; r < 50; r++) {
        assert_int_equal(tg_ops_cpu.sample(b, x, 6, &sp, NULL, &rng, &tok, NULL, 0, NULL, NULL),
                         0);
        assert_int_equal(tok, 1);
    }
    tg_backend_cpu_free(b);
}

static void test_seeded(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    enum { V = 100, N = 64 };
    float x[V];
    for (int j = 0; j < V; j++)
        x[j] = (float)(urand() * 4);
    struct tg_sampling sp = plain;
    sp.temperature = 0.8f;
    sp.top_p = 0.95f;
    int32_t a[N], c[N], d[N];
    uint64_t r1 = 7, r2 = 7, r3 = 8;
    for (int i = 0; i < N; i++) {
        float y[V];
        memcpy(y, x, sizeof(y));
        assert_int_equal(tg_ops_cpu.sample(b, y, V, &sp, NULL, &r1, &a[i], NULL, 0, NULL, NULL), 0);
        memcpy(y, x, sizeof(y));
        assert_int_equal(tg_ops_cpu.sample(b, y, V, &sp, NULL, &r2, &c[i], NULL, 0, NULL, NULL), 0);
        memcpy(y, x, sizeof(y));
        assert_int_equal(tg_ops_cpu.sample(b, y, V, &sp, NULL, &r3, &d[i], NULL, 0, NULL, NULL), 0);
    }
    assert_memory_equal(a, c, sizeof(a));
    assert_true(r1 == r2 && r1 != 7);
    assert_memory_not_equal(a, d, sizeof(a));
    tg_backend_cpu_free(b);
}

/* Draws `draws` tokens from logits x (copied each time) and returns the
 * frequencies in f[V]. */
static void freqs(struct tg_backend *b, const float *x, int V, const struct tg_sampling *sp,
                  uint64_t seed, int draws, double *f)
{
    float *y = malloc(sizeof(float) * V);
    for (int j = 0; j < V; j++)
        f[j] = 0;
    for (int i = 0; i < draws; i++) {
        int32_t tok = -1;
        memcpy(y, x, sizeof(float) * V);
        assert_int_equal(tg_ops_cpu.sample(b, y, V, sp, NULL, &seed, &tok, NULL, 0, NULL, NULL),
                         0);
        assert_true(tok >= 0 && tok < V);
        f[tok] += 1.0 / draws;
    }
    free(y);
}

static void test_supports(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const double p[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    float x[5];
    for (int j = 0; j < 5; j++)
        x[j] = (float)log(p[j]) + 3.0f;
    double f[5];
    const int N = 20000;
    const double tol = 0.02;
    struct tg_sampling sp = plain;

    /* Plain: the distribution itself. */
    freqs(b, x, 5, &sp, 1, N, f);
    for (int j = 0; j < 5; j++)
        near(f[j], p[j], tol);

    /* Temperature 0.5: p^2 renormalised. */
    sp.temperature = 0.5f;
    freqs(b, x, 5, &sp, 2, N, f);
    double z2 = 0;
    for (int j = 0; j < 5; j++)
        z2 += p[j] * p[j];
    for (int j = 0; j < 5; j++)
        near(f[j], p[j] * p[j] / z2, tol);

    /* top-k 2: {0, 1} renormalised. */
    sp = plain;
    sp.top_k = 2;
    freqs(b, x, 5, &sp, 3, N, f);
    near(f[0], 0.4 / 0.7, tol);
    near(f[1], 0.3 / 0.7, tol);
    assert_true(f[2] == 0 && f[3] == 0 && f[4] == 0);

    /* top-p 0.8: cumulative 0.4, 0.7, 0.85 -> {0, 1, 2}. */
    sp = plain;
    sp.top_p = 0.8f;
    freqs(b, x, 5, &sp, 4, N, f);
    near(f[0], 0.4 / 0.85, tol);
    near(f[1], 0.3 / 0.85, tol);
    near(f[2], 0.15 / 0.85, tol);
    assert_true(f[3] == 0 && f[4] == 0);

    /* top-p tiny: always at least the top token. */
    sp.top_p = 1e-6f;
    freqs(b, x, 5, &sp, 5, 200, f);
    assert_true(f[1] == 0 && f[2] == 0 && f[3] == 0 && f[4] == 0);

    /* min-p 0.3: keep p >= 0.12 -> {0, 1, 2}. */
    sp = plain;
    sp.min_p = 0.3f;
    freqs(b, x, 5, &sp, 6, N, f);
    near(f[0], 0.4 / 0.85, tol);
    near(f[1], 0.3 / 0.85, tol);
    near(f[2], 0.15 / 0.85, tol);
    assert_true(f[3] == 0 && f[4] == 0);

    /* top-k 4 then top-p 0.75 (over the renormalised 0.95 mass: 0.421,
     * 0.737, 0.895 -> {0, 1, 2}) then min-p 0.45 (keeps p >= 0.18 of
     * the original scale -> {0, 1}). */
    sp = plain;
    sp.top_k = 4;
    sp.top_p = 0.75f;
    sp.min_p = 0.45f;
    freqs(b, x, 5, &sp, 7, N, f);
    near(f[0], 0.4 / 0.7, tol);
    near(f[1], 0.3 / 0.7, tol);
    assert_true(f[2] == 0 && f[3] == 0 && f[4] == 0);
    tg_backend_cpu_free(b);
}

/* top-p after top-k measures its nucleus over the top-k survivors,
 * renormalised (vLLM's order: the probabilities top-p sees are the
 * softmax of the logits top-k left). Each case keeps fewer tokens than a
 * nucleus measured over the whole vocabulary would: p = {0.4, 0.3, 0.15,
 * 0.1, 0.05}. */
static void test_top_k_then_top_p(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const double p[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    float x[5];
    for (int j = 0; j < 5; j++)
        x[j] = (float)log(p[j]) - 1.0f;
    double f[5];
    const int N = 20000;
    const double tol = 0.02;
    struct tg_sampling sp = plain;

    /* k 2, p 0.5: {0.571, 0.429} -> {0} alone (over the vocabulary 0.4 <
     * 0.5 would keep {0, 1}). */
    sp.top_k = 2;
    sp.top_p = 0.5f;
    freqs(b, x, 5, &sp, 11, 2000, f);
    assert_true(f[0] > 0 && f[1] == 0 && f[2] == 0 && f[3] == 0 &&
                f[4] == 0);

    /* k 3, p 0.8: {0.471, 0.353, 0.176}, cumulative 0.471, 0.824 ->
     * {0, 1} (over the vocabulary: 0.4, 0.7, 0.85 -> {0, 1, 2}). */
    sp.top_k = 3;
    sp.top_p = 0.8f;
    freqs(b, x, 5, &sp, 12, N, f);
    near(f[0], 0.4 / 0.7, tol);
    near(f[1], 0.3 / 0.7, tol);
    assert_true(f[2] == 0 && f[3] == 0 && f[4] == 0);

    /* Temperature first: 0.5 squares p; over the top 3, {0.16, 0.09,
     * 0.0225} / 0.2725 = {0.587, 0.330, 0.083}, p 0.9 -> {0, 1} (over the
     * vocabulary's 0.285: 0.561, 0.877, 0.956 -> {0, 1, 2}). */
    sp.temperature = 0.5f;
    sp.top_p = 0.9f;
    freqs(b, x, 5, &sp, 13, N, f);
    near(f[0], 0.16 / 0.25, tol);
    near(f[1], 0.09 / 0.25, tol);
    assert_true(f[2] == 0 && f[3] == 0 && f[4] == 0);
    tg_backend_cpu_free(b);
}

static int greedy_with(struct tg_backend *b, const float *x0, int V,
                       const struct tg_sampling *sp, const struct tg_sample_history *h)
{
    float y[16];
    memcpy(y, x0, sizeof(float) * V);
    int32_t tok = -1;
    assert_int_equal(tg_ops_cpu.sample(b, y, V, sp, h, NULL, &tok, NULL, 0, NULL, NULL), 0);
    return tok;
}

static void test_penalties(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const float x[4] = {2.0f, 1.9f, -1.0f, -1.05f};
    struct tg_sampling sp = plain;
    sp.temperature = 0.0f;
    int32_t p0[3] = {0, 0, 0}, p2[1] = {2}, o00[2] = {0, 0};
    struct tg_sample_history h = {.prompt = p0, .n_prompt = 1};
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 0);
    /* Repetition 1.1 on a positive logit divides: 2/1.1 = 1.82 < 1.9. */
    sp.repetition_penalty = 1.1f;
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 1);
    /* Applied once per id: three copies of id 0 with 1.04 give 1.923. */
    sp.repetition_penalty = 1.04f;
    h.n_prompt = 3;
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 0);
    /* A negative logit is multiplied: -1 * 1.1 < -1.05. */
    const float neg[2] = {-1.0f, -1.05f};
    sp.repetition_penalty = 1.1f;
    h.prompt = p2;
    h.n_prompt = 1;
    p2[0] = 0;
    assert_int_equal(greedy_with(b, neg, 2, &sp, &h), 1);
    /* The repetition penalty also covers output ids. */
    h = (struct tg_sample_history){.output = o00, .n_output = 1};
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 1);
    /* Frequency: 2 - 2*0.06 = 1.88 < 1.9; with one occurrence 1.94 wins. */
    sp = plain;
    sp.temperature = 0.0f;
    sp.frequency_penalty = 0.06f;
    h.n_output = 2;
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 1);
    h.n_output = 1;
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 0);
    /* Presence counts once: 2 - 0.15 = 1.85 < 1.9 for one or two copies,
     * and never applies to prompt-only ids. */
    sp.frequency_penalty = 0.0f;
    sp.presence_penalty = 0.15f;
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 1);
    sp.presence_penalty = 0.09f;
    h.n_output = 2;
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 0);
    h = (struct tg_sample_history){.prompt = p0, .n_prompt = 3};
    sp.presence_penalty = 5.0f;
    sp.frequency_penalty = 5.0f;
    assert_int_equal(greedy_with(b, x, 4, &sp, &h), 0);
    /* The count tables are clean for the next call. */
    sp = plain;
    sp.temperature = 0.0f;
    assert_int_equal(greedy_with(b, x, 4, &sp, NULL), 0);
    /* Out-of-vocabulary history ids are rejected. */
    int32_t bad[1] = {4};
    h = (struct tg_sample_history){.output = bad, .n_output = 1};
    assert_int_equal(tg_ops_cpu.sample(b, (float[4]){0}, 4, &sp, &h, NULL,
                                       &(int32_t){0}, NULL, 0, NULL, NULL), TG_EINVAL);
    tg_backend_cpu_free(b);
}

static void test_raw_logprobs(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    enum { V = 1000 };
    float x[V], x0[V];
    for (int j = 0; j < V; j++)
        x0[j] = (float)(urand() * 10 - 5);
    x0[17] = x0[400] = 9.0f; /* tie at the top */
    x0[3] = 8.5f;
    struct tg_sampling sp = plain;
    sp.temperature = 0.3f;
    sp.repetition_penalty = 2.0f;
    sp.frequency_penalty = 1.0f;
    int32_t out[2] = {17, 3};
    struct tg_sample_history h = {.output = out, .n_output = 2};
    int32_t tok, ids[5];
    float lp, lps[5];
    uint64_t rng = 99;
    memcpy(x, x0, sizeof(x));
    assert_int_equal(tg_ops_cpu.sample(b, x, V, &sp, &h, &rng, &tok, &lp, 5, ids, lps), 0);
    near(lp, ref_logprob(x0, V, tok), 1e-5);
    assert_int_equal(ids[0], 17);
    assert_int_equal(ids[1], 400);
    assert_int_equal(ids[2], 3);
    for (int t = 0; t < 5; t++) {
        near(lps[t], ref_logprob(x0, V, ids[t]), 1e-5);
        if (t > 0)
            assert_true(lps[t] <= lps[t - 1]);
    }
    /* Full vocabulary of top logprobs. */
    float small[3] = {1, 3, 2};
    int32_t ids3[3];
    float lps3[3];
    sp = plain;
    assert_int_equal(tg_ops_cpu.sample(b, small, 3, &sp, NULL, &rng, &tok, NULL, 3, ids3,
                                       lps3), 0);
    assert_int_equal(ids3[0], 1);
    assert_int_equal(ids3[1], 2);
    assert_int_equal(ids3[2], 0);
    near(exp(lps3[0]) + exp(lps3[1]) + exp(lps3[2]), 1.0, 1e-6);
    tg_backend_cpu_free(b);
}

static void test_sample_bad(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    float x[3] = {0, 1, 2};
    int32_t tok, ids[4];
    float lps[4];
    uint64_t rng = 1;
    struct tg_sampling sp = plain;
    assert_int_equal(tg_ops_cpu.sample(b, x, 3, &sp, NULL, &rng, &tok, NULL, 4, ids, lps),
                     TG_EINVAL);
    assert_int_equal(tg_ops_cpu.sample(b, x, 3, &sp, NULL, NULL, &tok, NULL, 0, NULL, NULL),
                     TG_EINVAL); /* sampling needs a generator */
    /* Values out of range are no input here: they stop the process. */
    sp.temperature = -1.0f;
    sample_aborts(b, &sp, 3);
    sp = plain;
    sp.top_p = 0.0f;
    sample_aborts(b, &sp, 3);
    sp = plain;
    sp.min_p = 1.5f;
    sample_aborts(b, &sp, 3);
    sp = plain;
    sp.repetition_penalty = 0.0f;
    sample_aborts(b, &sp, 3);
    assert_int_equal(tg_ops_cpu.sample(b, x, 0, &plain, NULL, &rng, &tok, NULL, 0, NULL, NULL),
                     TG_EINVAL);
    tg_backend_cpu_free(b);
}

/* OpenAI logit_bias: added to the logits before the draw (with the
 * penalties), so +100 forces a token and -100 bans the argmax; the
 * reported log-probability stays that of the raw logits; bad entries,
 * which the boundary check refuses, stop the sampler. */
static void test_logit_bias(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int V = 8;
    const float x[8] = {0.5f, 3.0f, 1.0f, -2.0f, 0.0f, 2.5f, -1.0f, 1.5f};
    float row[8];
    int32_t tok;
    float lp;
    struct tg_sampling sp = TG_SAMPLING_OFF; /* greedy */
    int32_t ids[2] = {3, 1};
    float vals[2] = {100.0f, 0.0f};
    sp.bias_ids = ids;
    sp.bias_vals = vals;
    sp.n_bias = 1;
    memcpy(row, x, sizeof(row));
    assert_int_equal(tg_ops_cpu.sample(b, row, V, &sp, NULL, NULL, &tok, &lp, 0,
                                       NULL, NULL), 0);
    assert_int_equal(tok, 3);
    near(lp, ref_logprob(x, V, 3), 1e-6); /* raw, not biased */

    /* Ban the argmax (id 1): the runner-up (id 5) wins. */
    ids[0] = 1;
    vals[0] = -100.0f;
    memcpy(row, x, sizeof(row));
    assert_int_equal(tg_ops_cpu.sample(b, row, V, &sp, NULL, NULL, &tok, &lp, 0,
                                       NULL, NULL), 0);
    assert_int_equal(tok, 5);

    /* Sampling at temperature 1 with a +100 bias: always that token. */
    struct tg_sampling hot = plain;
    hot.bias_ids = ids;
    hot.bias_vals = vals;
    hot.n_bias = 1;
    ids[0] = 6;
    vals[0] = 100.0f;
    uint64_t rng = 7;
    for (int i = 0; i < 200; i++) {
        memcpy(row, x, sizeof(row));
        assert_int_equal(tg_ops_cpu.sample(b, row, V, &hot, NULL, &rng, &tok,
                                           &lp, 0, NULL, NULL), 0);
        assert_int_equal(tok, 6);
    }
    /* A zero bias changes nothing. */
    ids[0] = 3;
    vals[0] = 0.0f;
    memcpy(row, x, sizeof(row));
    assert_int_equal(tg_ops_cpu.sample(b, row, V, &sp, NULL, NULL, &tok, &lp, 0,
                                       NULL, NULL), 0);
    assert_int_equal(tok, 1);

    /* A bias the boundary check refuses (an id outside the vocabulary, a
     * non-finite value, missing arrays, a negative count) stops the
     * process here. */
    ids[0] = V;
    sample_aborts(b, &sp, V);
    ids[0] = -1;
    sample_aborts(b, &sp, V);
    ids[0] = 2;
    vals[0] = NAN;
    sample_aborts(b, &sp, V);
    vals[0] = 1.0f;
    sp.bias_vals = NULL;
    sample_aborts(b, &sp, V);
    sp.bias_vals = vals;
    sp.n_bias = -1;
    sample_aborts(b, &sp, V);
    tg_backend_cpu_free(b);
}

/* logits_mask: masked ids become -inf, the others keep their value bit
 * for bit; the draws that follow (greedy, seeded at temperature 1, top
 * alternatives) name only allowed ids and their probabilities are those of
 * the allowed ids renormalised. */
static void test_logits_mask(void **st)
{
    (void)st;
    struct tg_backend *b = be();
    const int V = 1000;
    float x[1000], y[1000];
    uint32_t m[(1000 + 31) / 32] = {0};
    for (int j = 0; j < V; j++)
        x[j] = (float)(6.0 * urand() - 3.0);
    for (int j = 0; j < V; j += 7)
        m[j >> 5] |= 1u << (j & 31);
    memcpy(y, x, sizeof(x));
    assert_int_equal(tg_ops_cpu.logits_mask(b, y, V, m), 0);
    double z = 0.0, mx = -INFINITY;
    for (int j = 0; j < V; j++) {
        if (j % 7 == 0) {
            assert_true(y[j] == x[j]);
            mx = x[j] > mx ? x[j] : mx;
        } else
            assert_true(isinf(y[j]) && y[j] < 0.0f);
    }
    for (int j = 0; j < V; j += 7)
        z += exp(x[j] - mx);
    struct tg_sampling sp = TG_SAMPLING_OFF;
    int32_t tok, ids[5];
    float lp, lps[5];
    float w[1000];
    memcpy(w, y, sizeof(y));
    assert_int_equal(
        tg_ops_cpu.sample(b, w, V, &sp, NULL, NULL, &tok, &lp, 5, ids, lps), 0);
    assert_int_equal(tok % 7, 0);
    near(lp, x[tok] - mx - log(z), 1e-5);
    for (int t = 0; t < 5; t++)
        assert_int_equal(ids[t] % 7, 0);
    sp.temperature = 1.0f;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        uint64_t r = seed;
        memcpy(w, y, sizeof(y));
        assert_int_equal(
            tg_ops_cpu.sample(b, w, V, &sp, NULL, &r, &tok, &lp, 0, NULL, NULL),
            0);
        assert_int_equal(tok % 7, 0);
    }
    assert_int_equal(tg_ops_cpu.logits_mask(b, NULL, V, m), TG_EINVAL);
    assert_int_equal(tg_ops_cpu.logits_mask(b, y, 0, m), TG_EINVAL);
    assert_int_equal(tg_ops_cpu.logits_mask(b, y, V, NULL), TG_EINVAL);
    tg_backend_cpu_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seeded),
        cmocka_unit_test(test_supports),
        cmocka_unit_test(test_top_k_then_top_p),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_raw_logprobs),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_logprobs_top),
        cmocka_unit_test(test_logits_mask),
        cmocka_unit_test(test_sample_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
