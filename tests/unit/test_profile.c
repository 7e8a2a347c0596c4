/* test_profile.c — profile model: load/validate/save, build from retention
 * samples, clustering, the paper's ragged-paging example, and property
 * tests on random profiles (pf_profile.h, pf_build.h). */
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Deterministic generator (xorshift64*), so failures reproduce. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}

/* A profile with the given per-head budgets (L = 1) and grouping. */
static void make_profile(struct pf_profile *p, const double *budget, int H,
                         int hp, enum pf_grouping grouping)
{
    char err[256];
    assert_int_equal(pf_profile_init(p, "TestForCausalLM", "snapkv", 1, H, 64,
                                     hp, err, sizeof(err)),
                     0);
    for (int h = 0; h < H; h++) {
        p->mean[h] = budget[h];
        p->budget[h] = budget[h];
    }
    p->grouping = grouping;
    assert_int_equal(pf_layer_group(p->budget, H, hp, grouping, p->groups, err,
                                    sizeof(err)),
                     0);
    int rc = pf_profile_finish(p, err, sizeof(err));
    if (rc != 0)
        fail_msg("finish: %s", err);
}

static double group_budget_sum(const struct pf_profile *p)
{
    double s = 0.0;
    for (int l = 0; l < p->num_layers; l++)
        for (int g = 0; g < p->num_groups; g++)
            s += pf_profile_group_budget(p, l, g);
    return s;
}

/* ---- the paper's worked example ----------------------------------------- */

/* TANGRAM §Ragged Paging: eight heads of one layer with budgets
 * 1, 2, 5, 5, 6, 7, 9, 10 (in units of page slots) and H_p = 2. Clustered
 * groups are (1,2) (5,5) (6,7) (9,10), whose group budgets 2+5+7+10 = 24
 * slots of two-head pages; the per-head demand is 1+2+...+10 = 45 slots of
 * one-head pages; a monolithic layout makes every head as long as the
 * longest: 10 x 4 = 40 two-head slots (80 one-head slots). Budgets are
 * scaled by 1/16 (exact in binary) and tokens chosen so one slot is one
 * page of P = 100 tokens: 1600 tokens x k/16 = 100 k tokens. */
static const double paper_units[8] = {1, 2, 5, 5, 6, 7, 9, 10};

static void test_paper_example(void **state)
{
    (void)state;
    double b[8];
    /* Shuffled head order, so clustering has work to do and adjacent
     * grouping differs from it. */
    static const int order[8] = {6, 0, 3, 7, 1, 5, 2, 4};
    for (int i = 0; i < 8; i++)
        b[order[i]] = paper_units[i] / 16.0;
    struct pf_profile p;
    make_profile(&p, b, 8, 2, PF_GROUPING_CLUSTERED);
    static const double want_gb[4] = {2, 5, 7, 10};
    for (int g = 0; g < 4; g++) {
        assert_true(pf_profile_group_budget(&p, 0, g) == want_gb[g] / 16.0);
        const int *heads = pf_profile_group(&p, 0, g);
        /* Each group holds the sorted pair (2g, 2g+1) of the list above. */
        assert_int_equal(heads[0], order[2 * g]);
        assert_int_equal(heads[1], order[2 * g + 1]);
    }
    assert_true(group_budget_sum(&p) * 16.0 == 24.0);

    char err[256];
    struct kv_prompt_pages pg;
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, 1600, 1600, 100, err,
                                      sizeof(err)),
                     0);
    for (int g = 0; g < 4; g++) {
        assert_int_equal(pg.tokens[g], (int64_t)want_gb[g] * 100);
        assert_int_equal(pg.pages[g], (int64_t)want_gb[g]);
    }
    assert_int_equal(pg.total_pages, 24);
    assert_int_equal(pg.monolithic_pages, 40);
    kv_prompt_pages_free(&pg);

    /* Adjacent grouping of the same heads wastes more. */
    struct pf_profile adj;
    make_profile(&adj, b, 8, 2, PF_GROUPING_ADJACENT);
    assert_int_equal(kv_prompt_pages_compute(&pg, &adj, 1600, 1600, 100, err,
                                      sizeof(err)),
                     0);
    /* pairs (h0,h1)=(2,6) (h2,h3)=(9,5) (h4,h5)=(10,7) (h6,h7)=(1,5) */
    assert_int_equal(pg.total_pages, 6 + 9 + 10 + 5);
    kv_prompt_pages_free(&pg);
    pf_profile_free(&adj);

    /* Per-head paging (H_p = 1): exactly the 45 slots heads need. */
    assert_int_equal(pf_profile_regroup(&p, 1, PF_GROUPING_CLUSTERED, err,
                                        sizeof(err)),
                     0);
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, 1600, 1600, 100, err,
                                      sizeof(err)),
                     0);
    assert_int_equal(pg.total_pages, 45);
    assert_int_equal(pg.monolithic_pages, 80);
    kv_prompt_pages_free(&pg);
    pf_profile_free(&p);
}

/* ---- build -------------------------------------------------------------- */

static void retention_init(struct pf_retention *r, int S, int L, int H)
{
    memset(r, 0, sizeof(*r));
    r->architecture = strdup("TestForCausalLM");
    r->method = strdup("snapkv");
    r->num_layers = L;
    r->num_kv_heads = H;
    r->head_dim = 64;
    r->samples = S;
    r->target_ratio = 0.25;
    r->ratio = calloc((size_t)S * (size_t)L * (size_t)H, sizeof(double));
    assert_non_null(r->ratio);
}

static void test_build_hand(void **state)
{
    (void)state;
    /* S = 4, L = 1, H = 4, hand-computed statistics:
     *  h0: .1 .2 .3 .4 -> mean .25, pstd sqrt(.0125)
     *  h1: .5 x4       -> mean .5, std 0 -> budget .5
     *  h2: .9 1 1 .9   -> mean .95, std .05 -> 1.05 clamped to 1
     *  h3: 0 x4        -> budget 1/1024 (floor) */
    static const double v[4][4] = {
        {0.1, 0.5, 0.9, 0.0}, {0.2, 0.5, 1.0, 0.0},
        {0.3, 0.5, 1.0, 0.0}, {0.4, 0.5, 0.9, 0.0}};
    struct pf_retention r;
    retention_init(&r, 4, 1, 4);
    for (int s = 0; s < 4; s++)
        for (int h = 0; h < 4; h++)
            r.ratio[s * 4 + h] = v[s][h];
    struct pf_profile p;
    char err[256];
    assert_int_equal(pf_profile_build(&p, &r, 2.0, 2, PF_GROUPING_CLUSTERED,
                                      err, sizeof(err)),
                     0);
    assert_true(fabs(p.mean[0] - 0.25) < 1e-15);
    assert_true(fabs(p.std[0] - sqrt(0.0125)) < 1e-15);
    assert_true(fabs(p.budget[0] - (0.25 + 2.0 * sqrt(0.0125))) < 1e-15);
    assert_true(p.mean[1] == 0.5 && p.std[1] == 0.0 && p.budget[1] == 0.5);
    assert_true(fabs(p.std[2] - 0.05) < 1e-15);
    assert_true(p.budget[2] == 1.0);
    assert_true(p.budget[3] == PF_BUDGET_MIN);
    /* clustered: (1/1024 h3, .47 h0), (.5 h1, 1 h2) */
    static const int want[4] = {3, 0, 1, 2};
    assert_memory_equal(p.groups, want, sizeof(want));
    assert_true(pf_profile_group_budget(&p, 0, 0) == p.budget[0]);
    assert_true(pf_profile_group_budget(&p, 0, 1) == 1.0);
    assert_int_equal(p.samples, 4);
    assert_true(p.alpha == 2.0 && p.target_ratio == 0.25);
    assert_string_equal(p.method, "snapkv");
    pf_profile_free(&p);

    assert_int_equal(pf_profile_build(&p, &r, 0.0, 2, PF_GROUPING_ADJACENT,
                                      err, sizeof(err)),
                     0);
    static const int adj[4] = {0, 1, 2, 3};
    assert_memory_equal(p.groups, adj, sizeof(adj));
    assert_true(p.budget[2] == 0.95 || fabs(p.budget[2] - 0.95) < 1e-15);
    pf_profile_free(&p);

    /* H_p must divide H; alpha must be >= 0. */
    assert_int_equal(pf_profile_build(&p, &r, 2.0, 3, PF_GROUPING_CLUSTERED,
                                      err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, "heads_per_group"));
    assert_int_equal(pf_profile_build(&p, &r, -1.0, 2, PF_GROUPING_CLUSTERED,
                                      err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, "alpha"));
    pf_retention_free(&r);
}

/* Ties: equal budgets go by head index, and heads whose samples are
 * permutations of each other get identical statistics. */
static void test_build_ties(void **state)
{
    (void)state;
    enum { S = 7, H = 4 };
    static const double col[S] = {0.1, 0.7, 0.33, 0.9, 0.05, 0.61, 0.2};
    struct pf_retention r;
    retention_init(&r, S, 1, H);
    for (int s = 0; s < S; s++) {
        r.ratio[s * H + 0] = 0.8;             /* highest budget */
        r.ratio[s * H + 1] = col[s];          /* same multiset ... */
        r.ratio[s * H + 2] = col[S - 1 - s];  /* ... reversed */
        r.ratio[s * H + 3] = col[(s + 3) % S]; /* ... rotated */
    }
    struct pf_profile p;
    char err[256];
    assert_int_equal(pf_profile_build(&p, &r, 1.0, 1, PF_GROUPING_CLUSTERED,
                                      err, sizeof(err)),
                     0);
    assert_true(p.mean[1] == p.mean[2] && p.mean[1] == p.mean[3]);
    assert_true(p.std[1] == p.std[2] && p.std[1] == p.std[3]);
    static const int want[4] = {1, 2, 3, 0};
    assert_memory_equal(p.groups, want, sizeof(want));
    pf_profile_free(&p);
    pf_retention_free(&r);
}

/* ---- full profile, save/load ------------------------------------------- */

static void test_full_profile(void **state)
{
    (void)state;
    struct pf_profile p;
    char err[256];
    assert_int_equal(pf_profile_init_full(&p, 2, 8, 64, 4, err, sizeof(err)), 0);
    assert_int_equal(p.num_groups, 2);
    for (int i = 0; i < 16; i++) {
        assert_true(p.budget[i] == 1.0);
        assert_int_equal(p.groups[i], i % 8);
    }
    struct kv_prompt_pages pg;
    assert_int_equal(kv_prompt_pages_compute(&pg, &p, 1000, 512, 16, err, sizeof(err)),
                     0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pg.tokens[i], 1000);
    assert_int_equal(pg.total_pages, 4 * 63);
    assert_int_equal(pg.total_pages, pg.monolithic_pages);
    kv_prompt_pages_free(&pg);
    pf_profile_free(&p);
    pf_profile_free(&p); /* safe twice */
    assert_int_equal(pf_profile_init_full(&p, 2, 8, 64, 3, err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, "heads_per_group"));
    assert_null(p.budget);
}

static void random_build(struct pf_profile *p, int S, int L, int H, int hp,
                         enum pf_grouping grouping)
{
    struct pf_retention r;
    retention_init(&r, S, L, H);
    for (size_t i = 0; i < (size_t)S * (size_t)L * (size_t)H; i++)
        r.ratio[i] = rnd() * rnd();
    char err[256];
    int rc = pf_profile_build(p, &r, 2.0, hp, grouping, err, sizeof(err));
    if (rc != 0)
        fail_msg("build: %s", err);
    pf_retention_free(&r);
}

static void test_save_load_roundtrip(void **state)
{
    (void)state;
    struct pf_profile p, q;
    random_build(&p, 9, 3, 8, 2, PF_GROUPING_CLUSTERED);
    char path[] = "/tmp/tg_test_profile_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char err[256];
    assert_int_equal(pf_profile_save(&p, path, err, sizeof(err)), 0);
    int rc = pf_profile_load(&q, path, err, sizeof(err));
    if (rc != 0)
        fail_msg("load: %s", err);
    unlink(path);
    assert_int_equal(q.num_layers, 3);
    assert_int_equal(q.num_kv_heads, 8);
    assert_int_equal(q.heads_per_group, 2);
    assert_int_equal(q.samples, 9);
    assert_int_equal(q.grouping, PF_GROUPING_CLUSTERED);
    assert_string_equal(q.architecture, p.architecture);
    assert_string_equal(q.method, "snapkv");
    /* Doubles are written with 17 digits: bit-exact round trip. */
    assert_memory_equal(q.mean, p.mean, 24 * sizeof(double));
    assert_memory_equal(q.std, p.std, 24 * sizeof(double));
    assert_memory_equal(q.budget, p.budget, 24 * sizeof(double));
    assert_memory_equal(q.groups, p.groups, 24 * sizeof(int));
    assert_memory_equal(q.group_budget, p.group_budget, 12 * sizeof(double));
    pf_profile_free(&q);
    pf_profile_free(&p);

    assert_int_equal(pf_profile_load(&q, "/nonexistent/profile.json", err,
                                     sizeof(err)),
                     TG_ENOENT);
}

/* ---- malformed profiles -------------------------------------------------- */

/* Mutates a copy of a valid document; the load error must name the field. */
struct bad_case {
    const char *path;  /* JSON pointer-ish: "a.b" or "layers.1.budget.0" */
    const char *json;  /* replacement value, NULL = delete the member */
    const char *want;  /* substring of the error message */
};

static json_t *walk(json_t *doc, const char *path, char *last, size_t n)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    char *save = NULL, *tok = strtok_r(buf, ".", &save);
    json_t *cur = doc;
    for (;;) {
        char *next = strtok_r(NULL, ".", &save);
        if (next == NULL) {
            snprintf(last, n, "%s", tok);
            return cur;
        }
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok))
                                 : json_object_get(cur, tok);
        assert_non_null(cur);
        tok = next;
    }
}

static void test_malformed_profiles(void **state)
{
    (void)state;
    static const struct bad_case cases[] = {
        {"format", "\"tangram-retention\"", "format: expected \"tangram-profile\""},
        {"format", NULL, "format: missing"},
        {"version", "2", "version: unsupported version 2"},
        {"version", "\"1\"", "version: expected an integer"},
        {"model", "[]", "model: expected an object"},
        {"model.architecture", "5", "model.architecture: expected a string"},
        {"model.num_layers", "\"3\"", "model.num_layers: expected an integer"},
        {"model.num_layers", "0", "model.num_layers"},
        {"model.num_kv_heads", "-8", "model.num_kv_heads"},
        {"model.head_dim", NULL, "model.head_dim: missing"},
        {"method", NULL, "method: missing"},
        {"method", "\"\"", "method: empty"},
        {"target_ratio", "1.5", "target_ratio"},
        {"target_ratio", "0", "target_ratio"},
        {"alpha", "\"two\"", "alpha: expected a number"},
        {"alpha", "-1", "alpha"},
        {"samples", "-1", "samples"},
        {"samples", "2.5", "samples: expected an integer"},
        {"heads_per_group", "3", "heads_per_group: 3 does not divide"},
        {"heads_per_group", "0", "heads_per_group"},
        {"heads_per_group", "16", "heads_per_group"},
        {"grouping", "\"random\"", "grouping: expected \"clustered\""},
        {"grouping", "1", "grouping: expected a string"},
        {"layers", "{}", "layers: expected an array"},
        {"layers.2", NULL, "layers: expected 3 elements, found 2"},
        {"layers.1", "[]", "layers[1]: expected an object"},
        {"layers.2.mean", "[0.5]", "layers[2].mean: expected 8 elements"},
        {"layers.0.mean.2", "-0.1", "layers[0].mean[2]"},
        {"layers.0.std.3", "\"a\"", "layers[0].std[3]: expected a number"},
        {"layers.1.std", NULL, "layers[1].std: missing"},
        {"layers.1.budget.0", "0", "layers[1].budget[0]"},
        {"layers.1.budget.0", "1.5", "layers[1].budget[0]"},
        {"layers.1.budget.7", "null", "layers[1].budget[7]: expected a number"},
        {"layers.0.groups", "[[0,1],[2,3],[4,5]]", "layers[0].groups: expected 4"},
        {"layers.0.groups.1", "7", "layers[0].groups[1]: expected an array"},
        {"layers.0.groups.0", "[0,1,2]", "layers[0].groups[0]: expected 2 heads"},
        {"layers.0.groups.0.1", "99", "layers[0].groups[0][1]: head 99 is out"},
        {"layers.0.groups.0.1", "-1", "layers[0].groups[0][1]"},
        {"layers.0.groups.0.0", "1.0", "layers[0].groups[0][0]: expected an integer"},
        {"layers.2.groups", "[[0,1],[2,3],[4,5],[5,7]]",
         "layers[2].groups: head 5 appears twice"},
    };
    struct pf_profile good;
    random_build(&good, 5, 3, 8, 2, PF_GROUPING_CLUSTERED);
    char err[256];
    json_t *doc;
    assert_int_equal(pf_profile_to_json(&good, &doc, err, sizeof(err)), 0);
    struct pf_profile p;
    assert_int_equal(pf_profile_from_json(&p, doc, err, sizeof(err)), 0);
    pf_profile_free(&p);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *copy = json_deep_copy(doc);
        char key[64];
        json_t *parent = walk(copy, cases[i].path, key, sizeof(key));
        if (cases[i].json == NULL) {
            if (json_is_array(parent))
                json_array_remove(parent, (size_t)atoi(key));
            else
                json_object_del(parent, key);
        } else {
            json_error_t je;
            json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, &je);
            assert_non_null(v);
            if (json_is_array(parent))
                json_array_set_new(parent, (size_t)atoi(key), v);
            else
                json_object_set_new(parent, key, v);
        }
        err[0] = '\0';
        int rc = pf_profile_from_json(&p, copy, err, sizeof(err));
        json_decref(copy);
        if (rc == 0)
            fail_msg("case %zu (%s) loaded", i, cases[i].path);
        if (strstr(err, cases[i].want) == NULL)
            fail_msg("case %zu (%s): error '%s' lacks '%s'", i, cases[i].path,
                     err, cases[i].want);
        assert_null(p.budget); /* left freed */
    }
    /* "grouping" may be absent (DESIGN.md §4.2 example). */
    json_object_del(doc, "grouping");
    assert_int_equal(pf_profile_from_json(&p, doc, err, sizeof(err)), 0);
    pf_profile_free(&p);
    json_t *arr = json_array();
    assert_int_equal(pf_profile_from_json(&p, arr, err, sizeof(err)), TG_EFORMAT);
    assert_non_null(strstr(err, "(root)"));
    json_decref(arr);
    json_decref(doc);
    pf_profile_free(&good);
}

static void test_malformed_files(void **state)
{
    (void)state;
    char path[] = "/tmp/tg_test_bad_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char text[] = "{\"format\": \"tangram-profile\", \"version\": 1,";
    assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
    close(fd);
    struct pf_profile p;
    struct pf_retention r;
    char err[256];
    assert_int_equal(pf_profile_load(&p, path, err, sizeof(err)), TG_EFORMAT);
    assert_non_null(strstr(err, "line"));
    assert_int_equal(pf_retention_load(&r, path, err, sizeof(err)), TG_EFORMAT);
    unlink(path);
}

static void test_malformed_retention(void **state)
{
    (void)state;
    static const char *const docs[][2] = {
        {"{\"format\":\"x\",\"version\":1}", "format"},
        {"{\"format\":\"tangram-retention\",\"version\":3}", "version"},
        {"{\"format\":\"tangram-retention\",\"version\":1,\"model\":{\"architecture\":\"A\","
         "\"num_layers\":1,\"num_kv_heads\":2,\"head_dim\":4},\"method\":\"snapkv\","
         "\"target_ratio\":0.5,\"samples\":[]}", "samples: 0 samples"},
        {"{\"format\":\"tangram-retention\",\"version\":1,\"model\":{\"architecture\":\"A\","
         "\"num_layers\":1,\"num_kv_heads\":2,\"head_dim\":4},\"method\":\"snapkv\","
         "\"target_ratio\":0.5,\"samples\":[[[0.1,0.2]],[[0.1,0.2],[0.3,0.4]]]}",
         "samples[1]: expected 1 layers"},
        {"{\"format\":\"tangram-retention\",\"version\":1,\"model\":{\"architecture\":\"A\","
         "\"num_layers\":1,\"num_kv_heads\":2,\"head_dim\":4},\"method\":\"snapkv\","
         "\"target_ratio\":0.5,\"samples\":[[[0.1,1.5]]]}", "samples[0][0][1]"},
        {"{\"format\":\"tangram-retention\",\"version\":1,\"model\":{\"architecture\":\"A\","
         "\"num_layers\":1,\"num_kv_heads\":2,\"head_dim\":4},\"method\":\"snapkv\","
         "\"target_ratio\":0.5,\"samples\":[[[0.1]]]}", "samples[0][0]: expected 2"},
        {"{\"format\":\"tangram-retention\",\"version\":1,\"model\":{\"architecture\":\"A\","
         "\"num_layers\":1,\"num_kv_heads\":2,\"head_dim\":4},\"method\":\"snapkv\","
         "\"target_ratio\":0.5,\"samples\":[7]}", "samples[0]: expected an array"},
        {"{\"format\":\"tangram-retention\",\"version\":1,\"model\":{\"architecture\":\"A\","
         "\"num_layers\":1,\"num_kv_heads\":2},\"method\":\"snapkv\","
         "\"target_ratio\":0.5,\"samples\":[]}", "model.head_dim"},
        {"{\"format\":\"tangram-retention\",\"version\":1,\"model\":{\"architecture\":\"A\","
         "\"num_layers\":1,\"num_kv_heads\":2,\"head_dim\":4},\"method\":\"snapkv\","
         "\"target_ratio\":-0.5,\"samples\":[]}", "target_ratio"},
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        json_error_t je;
        json_t *doc = json_loads(docs[i][0], 0, &je);
        assert_non_null(doc);
        struct pf_retention r;
        char err[256] = "";
        int rc = pf_retention_from_json(&r, doc, err, sizeof(err));
        json_decref(doc);
        if (rc == 0 || strstr(err, docs[i][1]) == NULL)
            fail_msg("retention case %zu: rc %d, error '%s' lacks '%s'", i, rc,
                     err, docs[i][1]);
        assert_null(r.ratio);
    }
}

/* ---- properties on random profiles -------------------------------------- */

static void test_random_properties(void **state)
{
    (void)state;
    static const int Hs[] = {1, 2, 4, 8, 12, 16, 32};
    static const int64_t Ns[] = {0, 1, 5, 37, 512, 513, 1000, 4099};
    char err[256];
    for (int it = 0; it < 300; it++) {
        int H = Hs[it % 7];
        int divisors[32], nd = 0;
        for (int k = 1; k <= H; k++)
            if (H % k == 0)
                divisors[nd++] = k;
        int hp = divisors[(int)(rnd() * nd) % nd];
        int L = 1 + (int)(rnd() * 3);
        int S = 1 + (int)(rnd() * 12);
        struct pf_profile c, a;
        uint64_t seed = rng_state;
        random_build(&c, S, L, H, hp, PF_GROUPING_CLUSTERED);
        rng_state = seed; /* same samples */
        random_build(&a, S, L, H, hp, PF_GROUPING_ADJACENT);
        assert_memory_equal(c.budget, a.budget, (size_t)L * H * sizeof(double));
        /* Every head in exactly one group; budgets in range; group budget
         * is the max of its members. */
        assert_int_equal(pf_profile_validate(&c, err, sizeof(err)), 0);
        assert_int_equal(pf_profile_validate(&a, err, sizeof(err)), 0);
        for (int l = 0; l < L; l++) {
            /* clustered groups are budget-sorted */
            for (int g = 0; g + 1 < c.num_groups; g++)
                assert_true(pf_profile_group_budget(&c, l, g) <=
                            pf_profile_group_budget(&c, l, g + 1));
        }
        /* Clustering never allocates more than adjacent. */
        assert_true(group_budget_sum(&c) <= group_budget_sum(&a) + 1e-12);
        int64_t N = Ns[it % 8];
        int64_t chunk = (it % 3 == 0) ? 512 : 1 + (int64_t)(rnd() * 700);
        int64_t P = 1 + (int64_t)(rnd() * 32);
        struct kv_prompt_pages pc, pa;
        assert_int_equal(kv_prompt_pages_compute(&pc, &c, N, chunk, P, err, sizeof(err)), 0);
        assert_int_equal(kv_prompt_pages_compute(&pa, &a, N, chunk, P, err, sizeof(err)), 0);
        assert_true(pc.total_pages <= pa.total_pages);
        assert_true(pc.total_pages <= pc.monolithic_pages);
        assert_int_equal(pc.monolithic_pages, pa.monolithic_pages);
        /* Reservation >= what compression keeps for every member head, and
         * >= the ceil-based lower bound ceil(B * N). */
        struct kv_forced_rule rule = kv_forced_rule_snapkv();
        for (int l = 0; l < L; l++) {
            for (int g = 0; g < c.num_groups; g++) {
                size_t i = (size_t)l * (size_t)c.num_groups + (size_t)g;
                const int *heads = pf_profile_group(&c, l, g);
                for (int j = 0; j < hp; j++) {
                    double b = c.budget[(size_t)l * H + (size_t)heads[j]];
                    int64_t keep = kv_turn_keep(0, N, chunk, b, &rule);
                    assert_true(pc.tokens[i] >= keep);
                    assert_true(keep >= (int64_t)ceil(b * (double)N));
                }
                assert_true(pc.tokens[i] <= N);
                assert_true(pc.pages[i] * P >= pc.tokens[i]);
                assert_true((pc.pages[i] - 1) * P < pc.tokens[i] ||
                            pc.tokens[i] == 0);
            }
        }
        kv_prompt_pages_free(&pc);
        kv_prompt_pages_free(&pa);
        pf_profile_free(&c);
        pf_profile_free(&a);
    }
}

static void test_regroup(void **state)
{
    (void)state;
    struct pf_profile p;
    random_build(&p, 6, 2, 8, 2, PF_GROUPING_ADJACENT);
    char err[256];
    double before = group_budget_sum(&p);
    assert_int_equal(pf_profile_regroup(&p, 4, PF_GROUPING_CLUSTERED, err,
                                        sizeof(err)),
                     0);
    assert_int_equal(p.num_groups, 2);
    assert_int_equal(pf_profile_validate(&p, err, sizeof(err)), 0);
    assert_int_equal(pf_profile_regroup(&p, 3, PF_GROUPING_CLUSTERED, err,
                                        sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(p.heads_per_group, 4); /* unchanged on failure */
    assert_int_equal(pf_profile_regroup(&p, 2, PF_GROUPING_CLUSTERED, err,
                                        sizeof(err)),
                     0);
    assert_true(group_budget_sum(&p) <= before + 1e-12);
    pf_profile_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paper_example),
        cmocka_unit_test(test_build_hand),
        cmocka_unit_test(test_build_ties),
        cmocka_unit_test(test_full_profile),
        cmocka_unit_test(test_save_load_roundtrip),
        cmocka_unit_test(test_malformed_profiles),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_malformed_retention),
        cmocka_unit_test(test_random_properties),
        cmocka_unit_test(test_regroup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
