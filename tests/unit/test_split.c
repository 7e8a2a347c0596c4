/* test_split.c — split map (paper Algorithm 1), TP assignment and page
 * reservation (pf_split.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_prompt.h"
#include "common/profile/pf_build.h"
#include "common/profile/pf_profile.h"
#include "common/profile/pf_split.h"
#include "common/base/tg_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0xD1B54A32D192ED03ull;
static double rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}

/* One layer of H heads with these budgets, grouped by `grouping`. */
static void make_layer(struct pf_profile *p, int L, const double *budget,
                       int H, int hp, enum pf_grouping grouping)
{
    char err[256];
    assert_int_equal(pf_profile_init(p, "T", "snapkv", L, H, 64, hp, err,
                                     sizeof(err)),
                     0);
    for (size_t i = 0; i < (size_t)L * (size_t)H; i++)
        p->budget[i] = budget[i];
    assert_int_equal(pf_profile_regroup(p, hp, grouping, err, sizeof(err)), 0);
}

/* ---- Algorithm 1 on hand-computed cases --------------------------------- */

static void test_split_paper_budgets(void **state)
{
    (void)state;
    /* Budgets k/16 for k = 1 2 5 5 6 7 9 10 (exact in binary), H_p = 2:
     * groups (1,2) (5,5) (6,7) (9,10) -> Phi = 3, 10, 13, 19 sixteenths,
     * Omega = 45/16.
     * N_CTA = 9:  tau = 5/16,  Phi/tau = 0.6 2 2.6 3.8  -> 1 2 3 4
     * N_CTA = 18: tau = 5/32,  Phi/tau = 1.2 4 5.2 7.6  -> 1 4 5 8
     * N_CTA = 1:  Phi/tau = 0.07 .. 0.42                -> 1 1 1 1 */
    static const double k[8] = {10, 1, 5, 9, 2, 7, 5, 6};
    double b[8];
    for (int h = 0; h < 8; h++)
        b[h] = k[h] / 16.0;
    struct pf_profile p;
    make_layer(&p, 1, b, 8, 2, PF_GROUPING_CLUSTERED);
    int s[4];
    char err[256];
    assert_int_equal(pf_split_map(&p, 9, s, err, sizeof(err)), 0);
    static const int w9[4] = {1, 2, 3, 4};
    assert_memory_equal(s, w9, sizeof(w9));
    assert_int_equal(pf_split_map(&p, 18, s, err, sizeof(err)), 0);
    static const int w18[4] = {1, 4, 5, 8};
    assert_memory_equal(s, w18, sizeof(w18));
    assert_int_equal(pf_split_map(&p, 1, s, err, sizeof(err)), 0);
    static const int w1[4] = {1, 1, 1, 1};
    assert_memory_equal(s, w1, sizeof(w1));
    assert_int_equal(pf_split_map(&p, 0, s, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "n_cta"));
    assert_int_equal(pf_split_map(&p, -4, s, err, sizeof(err)), TG_EINVAL);
    pf_profile_free(&p);
}

static void test_split_half_ties(void **state)
{
    (void)state;
    char err[256];
    int s[4];
    /* Phi/tau = 2.5 and 1.5 exactly: half away from zero gives 3 and 2
     * (round-half-even would give 2 and 2). */
    static const double b2[2] = {0.625, 0.375};
    static const int g2[2] = {0, 1};
    assert_int_equal(pf_split_layer(b2, 2, g2, 1, 4, s, err, sizeof(err)), 0);
    assert_int_equal(s[0], 3);
    assert_int_equal(s[1], 2);
    /* H_p = 2: budgets .5 .75 .25 .5 cluster into (h2, h0) (h3, h1) with
     * Phi = .75, 1.25; Omega = 2, N_CTA = 4 -> tau = .5 -> 1.5, 2.5. */
    static const double b4[4] = {0.5, 0.75, 0.25, 0.5};
    struct pf_profile p;
    make_layer(&p, 1, b4, 4, 2, PF_GROUPING_CLUSTERED);
    static const int wg[4] = {2, 0, 3, 1};
    assert_memory_equal(p.groups, wg, sizeof(wg));
    assert_int_equal(pf_split_map(&p, 4, s, err, sizeof(err)), 0);
    assert_int_equal(s[0], 2);
    assert_int_equal(s[1], 3);
    pf_profile_free(&p);
    /* Phi/tau = 0.5 rounds to 1; a tiny group still gets one CTA. */
    static const double b3[4] = {1.0 / 1024.0, 1.0, 1.0, 1.0};
    static const int g4[4] = {0, 1, 2, 3};
    assert_int_equal(pf_split_layer(b3, 4, g4, 1, 2, s, err, sizeof(err)), 0);
    for (int g = 0; g < 4; g++)
        assert_int_equal(s[g], 1);
    static const double bh[2] = {0.25, 0.75};
    assert_int_equal(pf_split_layer(bh, 2, g2, 1, 2, s, err, sizeof(err)), 0);
    assert_int_equal(s[0], 1); /* 0.5 -> 1 */
    assert_int_equal(s[1], 2); /* 1.5 -> 2 */
    /* Bad arguments. */
    assert_int_equal(pf_split_layer(b2, 2, g2, 1, 0, s, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(pf_split_layer(b2, 2, g2, 3, 4, s, err, sizeof(err)),
                     TG_EINVAL);
}

static void test_split_random(void **state)
{
    (void)state;
    char err[256];
    for (int it = 0; it < 200; it++) {
        int hp = 1 << (int)(rnd() * 3), G = 1 + (int)(rnd() * 8);
        int H = hp * G, L = 1 + (int)(rnd() * 3);
        double *b = malloc((size_t)L * H * sizeof(double));
        for (int i = 0; i < L * H; i++)
            b[i] = fmax(PF_BUDGET_MIN, rnd());
        struct pf_profile p;
        make_layer(&p, L, b, H, hp, PF_GROUPING_CLUSTERED);
        int n_cta = 1 + (int)(rnd() * 300);
        int *s = malloc((size_t)L * G * sizeof(int));
        assert_int_equal(pf_split_map(&p, n_cta, s, err, sizeof(err)), 0);
        for (int l = 0; l < L; l++) {
            int sum = 0;
            double omega = 0.0;
            for (int h = 0; h < H; h++)
                omega += b[l * H + h];
            for (int g = 0; g < G; g++) {
                int v = s[l * G + g];
                assert_true(v >= 1);
                assert_true(v <= n_cta);
                /* Within half a CTA of the exact share, or clamped to 1. */
                double share = 0.0;
                const int *heads = pf_profile_group(&p, l, g);
                for (int j = 0; j < hp; j++)
                    share += b[l * H + heads[j]];
                share = share / (omega / n_cta);
                assert_true(fabs(v - share) <= 0.5 + 1e-9 || v == 1);
                sum += v;
            }
            /* Rounding moves the total by at most G/2 plus clamps. */
            assert_true(sum <= n_cta + G);
            assert_true(sum >= n_cta - (G + 1) / 2);
        }
        free(s);
        free(b);
        pf_profile_free(&p);
    }
}

/* ---- tensor parallelism ------------------------------------------------- */

static void test_tp_snake(void **state)
{
    (void)state;
    /* 16 heads, H_p = 2, budgets h / 16 ascending with h: groups in order
     * (0,1) (2,3) ... (14,15). T = 4 deals 0 1 2 3 | 3 2 1 0 (reversed). */
    double b[16];
    for (int h = 0; h < 16; h++)
        b[h] = (h + 1) / 16.0;
    struct pf_profile p;
    make_layer(&p, 1, b, 16, 2, PF_GROUPING_CLUSTERED);
    struct pf_tp_plan plan;
    char err[256];
    assert_int_equal(pf_tp_assign(&plan, &p, 4, err, sizeof(err)), 0);
    static const int wg[4][2] = {{0, 7}, {1, 6}, {2, 5}, {3, 4}};
    static const int wh[4][4] = {
        {0, 1, 14, 15}, {2, 3, 12, 13}, {4, 5, 10, 11}, {6, 7, 8, 9}};
    for (int r = 0; r < 4; r++) {
        assert_memory_equal(pf_tp_groups(&plan, r, 0), wg[r], sizeof(wg[r]));
        assert_memory_equal(pf_tp_heads(&plan, r, 0), wh[r], sizeof(wh[r]));
        /* Sums (1+2+15+16)/16 = (3+4+13+14)/16 = ... = 34/16: balanced. */
        assert_true(plan.rank_budget[r] == 34.0 / 16.0);
    }
    pf_tp_free(&plan);
    /* T = 2 over 8 groups: 0 1 | 1 0 | 0 1 | 1 0. */
    assert_int_equal(pf_tp_assign(&plan, &p, 2, err, sizeof(err)), 0);
    static const int w2[2][4] = {{0, 3, 4, 7}, {1, 2, 5, 6}};
    assert_memory_equal(pf_tp_groups(&plan, 0, 0), w2[0], sizeof(w2[0]));
    assert_memory_equal(pf_tp_groups(&plan, 1, 0), w2[1], sizeof(w2[1]));
    pf_tp_free(&plan);
    /* T = 1 gets everything. */
    assert_int_equal(pf_tp_assign(&plan, &p, 1, err, sizeof(err)), 0);
    for (int h = 0; h < 16; h++)
        assert_int_equal(pf_tp_heads(&plan, 0, 0)[h], h);
    pf_tp_free(&plan);
    /* 8 groups cannot be dealt to 3 ranks. */
    assert_int_equal(pf_tp_assign(&plan, &p, 3, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "8 head groups"));
    assert_non_null(strstr(err, "3 ranks"));
    assert_null(plan.heads);
    assert_int_equal(pf_tp_assign(&plan, &p, 0, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(pf_tp_assign(&plan, &p, 16, err, sizeof(err)), TG_EINVAL);
    pf_tp_free(&plan);
    pf_profile_free(&p);
}

static void test_tp_random(void **state)
{
    (void)state;
    char err[256];
    for (int it = 0; it < 300; it++) {
        int T = 1 << (int)(rnd() * 3);              /* 1, 2, 4 */
        int hp = 1 << (int)(rnd() * 3);             /* 1, 2, 4 */
        int G = T * (1 + (int)(rnd() * 4));
        int H = G * hp, L = 1 + (int)(rnd() * 3);
        double *b = malloc((size_t)L * H * sizeof(double));
        for (int i = 0; i < L * H; i++)
            b[i] = fmax(PF_BUDGET_MIN, rnd() * rnd());
        struct pf_profile p;
        make_layer(&p, L, b, H, hp, PF_GROUPING_CLUSTERED);
        struct pf_tp_plan plan;
        assert_int_equal(pf_tp_assign(&plan, &p, T, err, sizeof(err)), 0);
        assert_int_equal(plan.heads_per_rank, H / T);
        int *owner = malloc((size_t)H * sizeof(int));
        double *rr = calloc((size_t)T, sizeof(double));
        for (int l = 0; l < L; l++) {
            for (int h = 0; h < H; h++)
                owner[h] = -1;
            double snake_lo = INFINITY, snake_hi = -INFINITY;
            for (int r = 0; r < T; r++) {
                const int *hd = pf_tp_heads(&plan, r, l);
                double sum = 0.0;
                for (int j = 0; j < H / T; j++) {
                    assert_true(hd[j] >= 0 && hd[j] < H);
                    assert_int_equal(owner[hd[j]], -1); /* exactly once */
                    owner[hd[j]] = r;
                    if (j > 0)
                        assert_true(hd[j - 1] < hd[j]);
                    sum += b[l * H + hd[j]];
                }
                assert_true(fabs(sum - plan.rank_budget[r * L + l]) < 1e-12);
                snake_lo = fmin(snake_lo, sum);
                snake_hi = fmax(snake_hi, sum);
                /* the rank's groups hold exactly its heads */
                const int *gr = pf_tp_groups(&plan, r, l);
                for (int k = 0; k < G / T; k++) {
                    const int *heads = pf_profile_group(&p, l, gr[k]);
                    for (int j = 0; j < hp; j++)
                        assert_int_equal(owner[heads[j]], r);
                }
            }
            for (int h = 0; h < H; h++)
                assert_true(owner[h] >= 0);
            /* Plain round-robin over the same (clustered) groups. */
            for (int r = 0; r < T; r++)
                rr[r] = 0.0;
            for (int g = 0; g < G; g++) {
                const int *heads = pf_profile_group(&p, l, g);
                for (int j = 0; j < hp; j++)
                    rr[g % T] += b[l * H + heads[j]];
            }
            double rr_lo = INFINITY, rr_hi = -INFINITY;
            for (int r = 0; r < T; r++) {
                rr_lo = fmin(rr_lo, rr[r]);
                rr_hi = fmax(rr_hi, rr[r]);
            }
            assert_true(snake_hi - snake_lo <= rr_hi - rr_lo + 1e-12);
        }
        free(rr);
        free(owner);
        free(b);
        pf_tp_free(&plan);
        pf_profile_free(&p);
    }
}

/* ---- page reservation --------------------------------------------------- */

static void test_pages_exact(void **state)
{
    (void)state;
    /* Two layers, four heads, H_p = 2. */
    static const double b[8] = {0.1, 0.3, 0.2, 0.05, 1.0, 0.5, 0.5, 0.25};
    struct pf_profile p;
    make_layer(&p, 2, b, 4, 2, PF_GROUPING_CLUSTERED);
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    static const int64_t Ns[] = {0, 3, 36, 37, 100, 511, 512, 513, 1500, 4096};
    char err[256];
    for (size_t t = 0; t < sizeof(Ns) / sizeof(Ns[0]); t++) {
        struct kv_prompt_pages pg;
        assert_int_equal(kv_prompt_pages_compute(&pg, &p, Ns[t], 512, 16, err,
                                          sizeof(err)),
                         0);
        int64_t total = 0, mx = 0;
        for (int i = 0; i < 4; i++) {
            int64_t want = kv_turn_keep(0, Ns[t], 512, p.group_budget[i], &rule);
            assert_int_equal(pg.tokens[i], want);
            assert_int_equal(pg.pages[i], (want + 15) / 16);
            total += pg.pages[i];
            mx = want > mx ? want : mx;
        }
        assert_int_equal(pg.total_pages, total);
        assert_int_equal(pg.monolithic_pages, (mx + 15) / 16 * 4);
        kv_prompt_pages_free(&pg);
    }
    /* By hand, N = 1000, chunks 512 + 488, layer 0 groups (h3 .05, h0 .1)
     * -> b = .1: chunk 1 max(ceil(51.2), 32 + 4 sinks) = 52, chunk 2
     * max(ceil(48.8), 32) = 49 -> 101 tokens, 7 pages of 16. */
    struct kv_prompt_pages pg;
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, 1000, 512, 16, err, sizeof(err)),
                     0);
    assert_int_equal(pg.tokens[0], 101);
    assert_int_equal(pg.pages[0], 7);
    assert_int_equal(pg.tokens[2], 500);  /* layer 1, group (h3 .25, h1 .5) */
    assert_int_equal(pg.tokens[3], 1000); /* layer 1, group (h2 .5, h0 1) */
    kv_prompt_pages_free(&pg);
    /* Tokens = 0: nothing reserved. */
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, 0, 512, 16, err, sizeof(err)), 0);
    assert_int_equal(pg.total_pages, 0);
    assert_int_equal(pg.monolithic_pages, 0);
    kv_prompt_pages_free(&pg);
    /* Bad arguments. */
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, -1, 512, 16, err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, "tokens"));
    assert_null(pg.tokens);
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, 10, 0, 16, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, 10, 512, 0, err, sizeof(err)),
                     TG_EINVAL);
    pf_profile_free(&p);
}

/* Many chunks take the closed form; it must equal kv_turn_keep. */
static void test_pages_many_chunks(void **state)
{
    (void)state;
    static const double b[4] = {0.013, 0.5, 0.77, 1.0 / 1024.0};
    struct pf_profile p;
    make_layer(&p, 1, b, 4, 1, PF_GROUPING_ADJACENT);
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    static const int64_t cases[][2] = {
        {200000, 1}, {200003, 2}, {300001, 3}, {400000, 5}, {262147, 4}};
    char err[256];
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        struct kv_prompt_pages pg;
        assert_int_equal(kv_prompt_pages_compute(&pg, &p, cases[t][0], cases[t][1], 16,
                                          err, sizeof(err)),
                         0);
        for (int g = 0; g < 4; g++)
            assert_int_equal(pg.tokens[g],
                             kv_turn_keep(0, cases[t][0], cases[t][1], b[g],
                                          &rule));
        kv_prompt_pages_free(&pg);
    }
    pf_profile_free(&p);
}

/* Beyond KV_PROMPT_LOOP_CHUNKS (65,536) chunks kv_prompt_pages_compute uses
 * a closed form; it must equal the per-chunk loop (kv_turn_keep) where
 * compression shows: chunks longer than the forced window of 32, so a chunk keeps
 * max(ceil(b n), 32) < n; the first chunk's 4 sinks on top (36); a last
 * chunk shorter or longer than the window. One case by hand: chunk 40,
 * 70,000 full chunks + 17 tokens, b 0.013 (ceil(0.52) = 1 < forced):
 * 36 + 69,999 x 32 + 17 = 2,240,021. */
static void test_pages_closed_form(void **state)
{
    (void)state;
    static const double b[5] = {0.013, 0.5, 0.77, 1.0 / 1024.0, 1.0};
    struct pf_profile p;
    make_layer(&p, 1, b, 5, 1, PF_GROUPING_ADJACENT);
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    static const int64_t chunks[] = {33, 40, 64, 100, 512};
    static const int64_t tails[] = {0, 1, 17, 31, 33, 99};
    char err[256];
    int compressed = 0;
    for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++)
        for (size_t t = 0; t < sizeof(tails) / sizeof(tails[0]); t++) {
            int64_t C = chunks[c];
            int64_t n = C * (65536 + 3 * (int64_t)t) + tails[t] % C;
            struct kv_prompt_pages pg;
            assert_int_equal(kv_prompt_pages_compute(&pg, &p, n, C, 16, err,
                                              sizeof(err)), 0);
            for (int g = 0; g < 5; g++) {
                int64_t want = kv_turn_keep(
                    0, n, C, pf_profile_group_budget(&p, 0, g), &rule);
                if (pg.tokens[g] != want)
                    fail_msg("chunk %lld, %lld tokens, budget %g: closed "
                             "form %lld, chunk loop %lld", (long long)C,
                             (long long)n, b[g], (long long)pg.tokens[g],
                             (long long)want);
                assert_int_equal(pg.pages[g], (want + 15) / 16);
                compressed += want < n;
            }
            kv_prompt_pages_free(&pg);
        }
    assert_true(compressed > 0);
    struct kv_prompt_pages pg;
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, 40 * 70000 + 17, 40, 16, err,
                                      sizeof(err)), 0);
    assert_int_equal(pg.tokens[0], 2240021);
    kv_prompt_pages_free(&pg);
    pf_profile_free(&p);
}

/* pf_profile_rank: every head served by exactly one rank, each rank's
 * groups keep their budgets, local heads follow the deal order. */
static void test_profile_rank(void **state)
{
    (void)state;
    char err[256];
    for (int it = 0; it < 100; it++) {
        int T = 1 << (int)(rnd() * 3);
        int hp = 1 << (int)(rnd() * 3);
        int G = T * (1 + (int)(rnd() * 3));
        int H = G * hp, L = 1 + (int)(rnd() * 3);
        double *b = malloc((size_t)L * H * sizeof(double));
        for (int i = 0; i < L * H; i++)
            b[i] = fmax(PF_BUDGET_MIN, rnd());
        struct pf_profile p;
        make_layer(&p, L, b, H, hp, PF_GROUPING_CLUSTERED);
        struct pf_tp_plan plan;
        assert_int_equal(pf_tp_assign(&plan, &p, T, err, sizeof(err)), 0);
        int Hr = H / T, Gr = G / T;
        int *seen = calloc((size_t)L * H, sizeof(int));
        int *gh = malloc((size_t)L * Hr * sizeof(int));
        for (int r = 0; r < T; r++) {
            struct pf_profile q;
            assert_int_equal(pf_profile_rank(&q, gh, &p, &plan, r, err, sizeof(err)), 0);
            assert_int_equal(q.num_kv_heads, Hr);
            assert_int_equal(q.num_groups, Gr);
            assert_int_equal(pf_profile_validate(&q, err, sizeof(err)), 0);
            for (int l = 0; l < L; l++) {
                const int *gr = pf_tp_groups(&plan, r, l);
                for (int j = 0; j < Gr; j++) {
                    /* the local group j is the global group gr[j] */
                    assert_true(pf_profile_group_budget(&q, l, j) ==
                                pf_profile_group_budget(&p, l, gr[j]));
                    const int *lh = pf_profile_group(&q, l, j);
                    const int *g = pf_profile_group(&p, l, gr[j]);
                    for (int k = 0; k < hp; k++) {
                        assert_int_equal(lh[k], j * hp + k);
                        assert_int_equal(gh[l * Hr + lh[k]], g[k]);
                        assert_true(q.budget[(size_t)l * Hr + (size_t)lh[k]] ==
                                    p.budget[(size_t)l * H + (size_t)g[k]]);
                        seen[l * H + g[k]]++;
                    }
                }
            }
            pf_profile_free(&q);
        }
        for (int i = 0; i < L * H; i++)
            assert_int_equal(seen[i], 1);
        free(seen);
        free(gh);
        free(b);
        pf_tp_free(&plan);
        pf_profile_free(&p);
    }
    struct pf_profile p, q;
    double b1[4] = {0.5, 0.25, 0.75, 1.0};
    make_layer(&p, 1, b1, 4, 2, PF_GROUPING_CLUSTERED);
    struct pf_tp_plan plan;
    assert_int_equal(pf_tp_assign(&plan, &p, 2, err, sizeof(err)), 0);
    int gh[2];
    assert_int_equal(pf_profile_rank(&q, gh, &p, &plan, 2, err, sizeof(err)), TG_EINVAL);
    pf_tp_free(&plan);
    pf_profile_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_paper_budgets),
        cmocka_unit_test(test_split_half_ties),
        cmocka_unit_test(test_split_random),
        cmocka_unit_test(test_tp_snake),
        cmocka_unit_test(test_tp_random),
        cmocka_unit_test(test_profile_rank),
        cmocka_unit_test(test_pages_exact),
        cmocka_unit_test(test_pages_many_chunks),
        cmocka_unit_test(test_pages_closed_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
