/* test_worker.c — gw_worker_step driven by plans the way the router builds
 * them (pages from a local kv_pool / kv_seq reservation, deltas of each
 * row's new pages): chunked prefill + decode through plans gives the same
 * tokens and log-probabilities, bit for bit, as gw_engine_generate on the
 * same prompt, with full KV and with a compressing profile, greedy and
 * seeded sampling; bad plans (bad page id, wrong position, unknown slot,
 * out-of-order step id, bad sampling, short rows) give error results,
 * change nothing and leave the worker usable. The tiny model comes from
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
#include <unistd.h>

#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "gpu_worker/engine/gw_engine.h"
#include "gpu_worker/serve/gw_worker.h"
#include "tests/support/tt_plan.h"
#include "tests/support/tt_support.h"

#define PAGE 8
#define CHUNK 16
#define SLOTS 4
#define POOL 1024

static char tmpdir[256];
static char model_dir[300];
static char profile_path[300];
static char errbuf[512];

static int make_model(void **state)
{
    (void)state;
    if (tt_tmpdir_make("tg_test_worker.", tmpdir, sizeof(tmpdir)) != 0)
        return -1;
    snprintf(model_dir, sizeof(model_dir), "%s/m", tmpdir);
    const char *const args[] = {"--arch", "qwen3", "--hidden", "64",
        "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim",
        "16", "--ffn", "128", "--seed", "5", NULL};
    int rc = tt_make_model(model_dir, args);
    if (rc != 0)
        return -1;
    /* A compressing profile: head budgets below 1, one head per group. */
    const double b[4] = {0.5, 1.0, 0.25, 0.75};
    snprintf(profile_path, sizeof(profile_path), "%s/profile.json", tmpdir);
    return tt_write_profile(profile_path, "Qwen3ForCausalLM", 2, 2, 16, 1, b,
                            NULL, 0.6);
}

static int remove_model(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

static void need_model(void)
{
    assert_true(model_dir[0] != '\0'); /* the group setup made it */
}

static void worker_open(struct gw_worker *w, const char *profile)
{
    struct gw_worker_opts o = {
        .model_dir = model_dir, .profile_path = profile, .heads_per_group = 1,
        .page_size = PAGE, .prefill_chunk = CHUNK, .kv_pages = POOL,
        .max_slots = SLOTS, .rank = 0, .world_size = 1, .n_threads = 1};
    int rc = gw_worker_init(w, &o, errbuf, sizeof(errbuf));
    if (rc != 0)
        fprintf(stderr, "gw_worker_init: %s\n", errbuf);
    assert_int_equal(rc, 0);
    /* The router's CommSetup with rank 0's group: one rank joins alone. */
    struct gw_hello_info h;
    gw_worker_hello(w, &h);
    struct gw_comm_setup cs = {.version = GW_PROTOCOL_VERSION,
                               .world_size = 1, .kind = "shm",
                               .id = h.comm_id, .id_len = h.comm_id_len};
    assert_int_equal(gw_worker_comm_join(w, &cs, errbuf, sizeof(errbuf)), 0);
}

/* ---- a tiny router: page accounting and plan building ------------------ */

/* Plans through tests/support/tt_plan, asserting where it reports full. */
static void plan_deltas(struct tt_plan *p, struct tt_req *r,
                        const struct kv_layout *kv)
{
    assert_int_equal(tt_plan_deltas(p, r, kv), 0);
}

static struct gw_entry *plan_entry(struct tt_plan *p, struct tt_req *r, int kind,
                               const int32_t *toks, int n, int sample,
                               const struct gw_gen_params *gp)
{
    struct gw_entry *e = tt_plan_entry(p, r, kind, toks, n, sample);
    assert_non_null(e);
    e->sampling = gp->sampling;
    return e;
}

static void req_init(struct tt_req *r, const struct kv_layout *kv,
                     uint32_t slot, const int32_t *prompt, int n_prompt)
{
    assert_int_equal(tt_req_init(r, kv, slot, prompt, n_prompt), 0);
}

static void check_same(const struct gw_gen_result *ref, const int32_t *tok,
                       const float *lp, const float *top, int n, int K,
                       int exact)
{
    assert_int_equal(ref->n_tokens, n);
    for (int t = 0; t < n; t++) {
        assert_int_equal(ref->tokens[t], tok[t]);
        if (exact)
            assert_memory_equal(&ref->lps[t], &lp[t], sizeof(float));
        else
            assert_float_equal(ref->lps[t], lp[t], 1e-4);
        for (int k = 0; k < K; k++) {
            float a = ref->top_lps[(size_t)t * K + k], b = top[(size_t)t * K + k];
            if (exact)
                assert_memory_equal(&a, &b, sizeof(float));
            else
                assert_float_equal(a, b, 1e-4);
        }
    }
}

/* Runs `nreq` requests through plans (prefill chunks, then batched decode
 * of every request each step) and compares each with gw_engine_generate. */
static void run_against_engine(const char *profile,
                               const struct gw_gen_params *gp, int nreq,
                               int exact)
{
    need_model();
    struct gw_worker w;
    worker_open(&w, profile);
    const struct kv_layout *kv = &w.layout;
    struct gw_engine_opts eo = {
        .model_dir = model_dir, .profile_path = profile, .heads_per_group = 1,
        .page_size = PAGE, .prefill_chunk = CHUNK, .max_context = 128,
        .n_threads = 1};
    struct gw_engine eng;
    assert_int_equal(gw_engine_init(&eng, &eo, errbuf, sizeof(errbuf)), 0);

    enum { NP0 = 37, NP1 = 20, T = 10, K = 3 };
    int32_t prompts[2][NP0];
    for (int i = 0; i < NP0; i++) {
        prompts[0][i] = (int32_t)((i * 7919 + 13) % 5000);
        prompts[1][i] = (int32_t)((i * 104729 + 401) % 7000);
    }
    const int np[2] = {NP0, NP1};
    struct gw_gen_result ref[2];
    for (int q = 0; q < nreq; q++)
        assert_int_equal(gw_engine_generate(&eng, prompts[q], np[q], gp,
                                            &ref[q], errbuf, sizeof(errbuf)),
                         0);

    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, w.be->n_pages, errbuf, sizeof(errbuf)), 0);
    struct tt_req r[2];
    int32_t out[2][T];
    float lps[2][T], tops[2][T * K];
    int got[2] = {0, 0};
    for (int q = 0; q < nreq; q++) {
        req_init(&r[q], kv, (uint32_t)(q * 2 + 1), prompts[q], np[q]);
        assert_int_equal(kv_seq_reserve_prompt(&r[q].seq, kv, &pool, 0, np[q],
                                               errbuf, sizeof(errbuf)), 0);
    }
    static struct tt_plan p;
    uint64_t step = 0;
    for (;;) {
        tt_plan_reset(&p, ++step);
        int any = 0;
        for (int q = 0; q < nreq; q++) {
            struct tt_req *rq = &r[q];
            if (rq->pos < rq->n_prompt) {
                int n = rq->n_prompt - (int)rq->pos;
                n = n < CHUNK ? n : CHUNK;
                int last = rq->pos + n == rq->n_prompt;
                plan_deltas(&p, rq, kv);
                plan_entry(&p, rq, GW_ENTRY_PREFILL,
                           rq->prompt + rq->pos, n, last, gp);
                assert_int_equal(kv_seq_commit(&rq->seq, kv, n, errbuf,
                                               sizeof(errbuf)), 0);
                rq->pos += n;
                any = 1;
            } else if (got[q] < gp->max_tokens) {
                assert_int_equal(kv_seq_reserve_decode(&rq->seq, kv, &pool, 1,
                                                       errbuf, sizeof(errbuf)),
                                 0);
                plan_deltas(&p, rq, kv);
                plan_entry(&p, rq, GW_ENTRY_DECODE,
                           &out[q][got[q] - 1], 1, 1, gp);
                rq->pos += 1;
                any = 1;
            }
        }
        if (!any)
            break;
        struct gw_result res;
        int rc = gw_worker_step(&w, &p.plan, &res);
        if (rc != 0)
            fprintf(stderr, "step %llu: %s\n", (unsigned long long)step,
                    res.error);
        assert_int_equal(rc, 0);
        assert_true(res.ok);
        assert_int_equal(res.step_id, step);
        for (size_t i = 0; i < res.n_tokens; i++) {
            const struct gw_token *s = &res.tokens[i];
            int q = s->slot == 1 ? 0 : 1;
            assert_int_equal(s->n_top, K);
            out[q][got[q]] = s->token;
            lps[q][got[q]] = s->logprob;
            memcpy(&tops[q][got[q] * K], s->top_lps, K * sizeof(float));
            for (int k = 0; k < K; k++)
                assert_int_equal(s->top_ids[k],
                                 ref[q].top_ids[(size_t)got[q] * K + k]);
            got[q]++;
        }
        int done = 1;
        for (int q = 0; q < nreq; q++)
            done &= got[q] == gp->max_tokens;
        if (done)
            break;
    }
    for (int q = 0; q < nreq; q++) {
        check_same(&ref[q], out[q], lps[q], tops[q], got[q], K, exact);
        gw_gen_result_free(&ref[q]);
        tt_req_free(&r[q], &pool);
    }
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    gw_engine_free(&eng);
    gw_worker_free(&w);
}

static struct gw_gen_params greedy_params(void)
{
    struct gw_gen_params gp = {.max_tokens = 10,
                               .ignore_eos = 1,
                               .sampling = {.temperature = 0.0f,
                                            .top_p = 1.0f,
                                            .repetition_penalty = 1.0f,
                                            .n_top = 3}};
    return gp;
}

static void test_greedy_full_kv(void **state)
{
    (void)state;
    struct gw_gen_params gp = greedy_params();
    run_against_engine(NULL, &gp, 1, 1);
}

static void test_greedy_profile(void **state)
{
    (void)state;
    struct gw_gen_params gp = greedy_params();
    run_against_engine(profile_path, &gp, 1, 1);
}

static void test_seeded_sampling_penalties(void **state)
{
    (void)state;
    struct gw_gen_params gp = greedy_params();
    gp.sampling.temperature = 0.9f;
    gp.sampling.top_k = 50;
    gp.sampling.top_p = 0.95f;
    gp.sampling.repetition_penalty = 1.3f;
    gp.sampling.presence_penalty = 0.5f;
    gp.sampling.frequency_penalty = 0.25f;
    gp.sampling.seed = 1234;
    run_against_engine(profile_path, &gp, 1, 1);
}

static void test_two_requests_batched(void **state)
{
    (void)state;
    struct gw_gen_params gp = greedy_params();
    run_against_engine(profile_path, &gp, 2, 0);
}

/* ---- parallel samples (fork entries) ------------------------------------ */

/* Request A (slot 1) prefills a 37-token prompt; with its last chunk a fork
 * entry starts B (slot 3) from it: B's rows share A's full pages (the
 * router's kv_seq_fork) and hold private copies of the partly filled last
 * pages. Both then decode in one batch. Each must equal the in-process
 * engine run alone with its own seed: the copied pages, the copied token
 * history (penalties) and the copied logits row are all exercised. */
static void run_fork(const char *profile, const struct gw_gen_params *gp,
                     uint64_t seed_b)
{
    need_model();
    struct gw_worker w;
    worker_open(&w, profile);
    const struct kv_layout *kv = &w.layout;
    struct gw_engine_opts eo = {
        .model_dir = model_dir, .profile_path = profile, .heads_per_group = 1,
        .page_size = PAGE, .prefill_chunk = CHUNK, .max_context = 128,
        .n_threads = 1};
    struct gw_engine eng;
    assert_int_equal(gw_engine_init(&eng, &eo, errbuf, sizeof(errbuf)), 0);
    enum { NP = 37, T = 10, K = 3 };
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++)
        prompt[i] = (int32_t)((i * 7919 + 13) % 5000);
    struct gw_gen_params gpb = *gp;
    gpb.sampling.seed = seed_b;
    struct gw_gen_result ref[2];
    assert_int_equal(gw_engine_generate(&eng, prompt, NP, gp, &ref[0], errbuf,
                                        sizeof(errbuf)), 0);
    assert_int_equal(gw_engine_generate(&eng, prompt, NP, &gpb, &ref[1],
                                        errbuf, sizeof(errbuf)), 0);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, w.be->n_pages, errbuf,
                                  sizeof(errbuf)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, errbuf, sizeof(errbuf)), 0);
    struct tt_req r[2];
    req_init(&r[0], kv, 1, prompt, NP);
    req_init(&r[1], kv, 3, prompt, NP);
    assert_int_equal(kv_seq_reserve_prompt(&r[0].seq, kv, &pool, 0, NP, errbuf,
                                           sizeof(errbuf)), 0);
    int64_t priv = 0;
    assert_int_equal(kv_seq_fork(&r[1].seq, &r[0].seq, kv, &pool, &priv,
                                 errbuf, sizeof(errbuf)), 0);
    assert_true(priv > 0); /* some row ends inside a page */
    int32_t row_lens[64];
    assert_true(w.rows <= 64);
    for (int i = 0; i < w.rows; i++)
        row_lens[i] = r[1].seq.filled[i];
    const struct gw_gen_params *gps[2] = {gp, &gpb};
    int32_t out[2][T];
    float lps[2][T], tops[2][T * K];
    int got[2] = {0, 0};
    static struct tt_plan p;
    uint64_t step = 0;
    while (got[0] < T || got[1] < T) {
        tt_plan_reset(&p, ++step);
        struct tt_req *a = &r[0], *b = &r[1];
        if (a->pos < NP) {
            int n = NP - (int)a->pos < CHUNK ? NP - (int)a->pos : CHUNK;
            int last = a->pos + n == NP;
            plan_deltas(&p, a, kv);
            plan_entry(&p, a, GW_ENTRY_PREFILL, prompt + a->pos, n, last, gp)
                ->last_chunk = last;
            assert_int_equal(kv_seq_commit(&a->seq, kv, n, errbuf,
                                           sizeof(errbuf)), 0);
            a->pos += n;
            if (last) {
                b->pos = NP;
                plan_deltas(&p, b, kv);
                struct gw_entry *e = plan_entry(&p, b, GW_ENTRY_FORK, prompt,
                                                0, 1, &gpb);
                e->fork_from = a->slot;
                e->row_lens = (const uint32_t *)row_lens;
                e->n_row_lens = (size_t)w.rows;
            }
        } else {
            for (int q = 0; q < 2; q++) {
                if (got[q] >= T)
                    continue;
                assert_int_equal(kv_seq_reserve_decode(&r[q].seq, kv, &pool,
                                                       1, errbuf,
                                                       sizeof(errbuf)), 0);
                plan_deltas(&p, &r[q], kv);
                plan_entry(&p, &r[q], GW_ENTRY_DECODE, &out[q][got[q] - 1], 1,
                           1, gps[q]);
                r[q].pos += 1;
            }
        }
        struct gw_result res;
        int rc = gw_worker_step(&w, &p.plan, &res);
        if (rc != 0)
            fprintf(stderr, "step %llu: %s\n", (unsigned long long)step,
                    res.error);
        assert_int_equal(rc, 0);
        for (size_t i = 0; i < res.n_tokens; i++) {
            const struct gw_token *t = &res.tokens[i];
            int q = t->slot == 1 ? 0 : 1;
            out[q][got[q]] = t->token;
            lps[q][got[q]] = t->logprob;
            memcpy(&tops[q][got[q] * K], t->top_lps, K * sizeof(float));
            got[q]++;
        }
    }
    for (int q = 0; q < 2; q++) {
        check_same(&ref[q], out[q], lps[q], tops[q], got[q], K, 0);
        gw_gen_result_free(&ref[q]);
    }
    /* Release in either order returns every page. */
    tt_req_free(&r[0], &pool);
    assert_true(kv_pool_n_used(&pool) > 0);
    tt_req_free(&r[1], &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    gw_engine_free(&eng);
    gw_worker_free(&w);
}

static void test_fork_greedy(void **state)
{
    (void)state;
    struct gw_gen_params gp = greedy_params();
    run_fork(profile_path, &gp, 0);
}

static void test_fork_seeded_penalties(void **state)
{
    (void)state;
    struct gw_gen_params gp = greedy_params();
    gp.sampling.temperature = 0.9f;
    gp.sampling.top_k = 50;
    gp.sampling.top_p = 0.95f;
    gp.sampling.repetition_penalty = 1.3f;
    gp.sampling.presence_penalty = 0.5f;
    gp.sampling.seed = 1234;
    run_fork(profile_path, &gp, 1235);
}

/* ---- bad plans ---------------------------------------------------------- */

/* One valid fresh prefill of 5 tokens into slot 0, at step `step`. */
static void good_plan(struct tt_plan *p, struct tt_req *r, const struct kv_layout *kv,
                      uint64_t step, const struct gw_gen_params *gp)
{
    tt_plan_reset(p, step);
    plan_deltas(p, r, kv);
    plan_entry(p, r, GW_ENTRY_PREFILL,
               r->prompt, r->n_prompt, 1, gp);
}

static void expect_error(struct gw_worker *w, const struct gw_plan *bp,
                         const char *needle)
{
    struct gw_result res;
    int rc = gw_worker_step(w, bp, &res);
    if (rc == 0)
        fail_msg("a plan that should fail with '%s' ran", needle);
    assert_false(res.ok);
    assert_int_equal(res.n_tokens, 0);
    assert_int_equal(res.step_id, bp->step_id);
    if (strstr(res.error, needle) == NULL)
        fail_msg("error '%s' lacks '%s'", res.error, needle);
}

static void test_bad_plans(void **state)
{
    (void)state;
    need_model();
    struct gw_worker w;
    worker_open(&w, NULL);
    const struct kv_layout *kv = &w.layout;
    struct gw_gen_params gp = greedy_params();
    const int32_t prompt[5] = {11, 22, 33, 44, 55};
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, w.be->n_pages, errbuf, sizeof(errbuf)), 0);
    struct tt_req r;
    req_init(&r, kv, 0, prompt, 5);
    assert_int_equal(kv_seq_reserve_prompt(&r.seq, kv, &pool, 0, 5, errbuf,
                                           sizeof(errbuf)), 0);
    static struct tt_plan p;
    int32_t *sent0 = calloc((size_t)w.rows, sizeof(int32_t));
    assert_non_null(sent0);

#define RESET_REQ()                                                  \
    do {                                                             \
        memset(r.sent, 0, (size_t)w.rows * sizeof(int32_t));         \
        r.fresh = 1;                                                 \
        r.pos = 0;                                                   \
    } while (0)

    /* bad page id */
    good_plan(&p, &r, kv, 1, &gp);
    p.ids[0] = (uint32_t)w.be->n_pages; /* the first delta's first id */
    expect_error(&w, &p.plan, "page id");
    /* unknown layer */
    RESET_REQ();
    good_plan(&p, &r, kv, 1, &gp);
    p.d[0].layer = 99;
    expect_error(&w, &p.plan, "outside");
    /* unknown slot: out of range, and never assigned */
    RESET_REQ();
    good_plan(&p, &r, kv, 1, &gp);
    p.e[0].slot = SLOTS + 3;
    expect_error(&w, &p.plan, "unknown slot");
    RESET_REQ();
    good_plan(&p, &r, kv, 1, &gp);
    p.e[0].fresh = 0;
    expect_error(&w, &p.plan, "not assigned");
    /* a row without its pages */
    RESET_REQ();
    good_plan(&p, &r, kv, 1, &gp);
    p.plan.n_deltas = 0;
    expect_error(&w, &p.plan, "pages");
    /* token outside the vocabulary, bad version */
    RESET_REQ();
    good_plan(&p, &r, kv, 1, &gp);
    p.tok[0][2] = (uint32_t)w.model.vocab;
    expect_error(&w, &p.plan, "vocabulary");
    RESET_REQ();
    good_plan(&p, &r, kv, 1, &gp);
    p.plan.version = 7;
    expect_error(&w, &p.plan, "version");

    /* After all of that the worker takes the plan and samples. */
    RESET_REQ();
    good_plan(&p, &r, kv, 1, &gp);
    struct gw_result res;
    assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
    assert_true(res.ok);
    assert_int_equal(res.n_tokens, 1);
    uint32_t tok = res.tokens[0].token;
    assert_int_equal(kv_seq_commit(&r.seq, kv, 5, errbuf, sizeof(errbuf)), 0);
    r.pos = 5;

    /* out-of-order step id (the same id again) */
    assert_int_equal(kv_seq_reserve_decode(&r.seq, kv, &pool, 1, errbuf,
                                           sizeof(errbuf)), 0);
    tt_plan_reset(&p, 1);
    plan_deltas(&p, &r, kv);
    int32_t t32 = (int32_t)tok;
    plan_entry(&p, &r, GW_ENTRY_DECODE, &t32,
               1, 1, &gp);
    expect_error(&w, &p.plan, "step id");
    /* wrong position */
    p.plan.step_id = 2;
    p.e[0].start_pos = 4;
    expect_error(&w, &p.plan, "position");
    /* truncate past the row */
    p.e[0].start_pos = 5;
    assert_int_equal(p.plan.n_deltas, 0); /* 6 tokens fit the page */
    memset(&p.d[0], 0, sizeof(p.d[0]));
    p.d[0].has_truncate = 1;
    p.d[0].truncate_to = 1000;
    p.plan.n_deltas = 1;
    expect_error(&w, &p.plan, "truncate_to");
    /* cutting the page the row still uses */
    p.d[0].truncate_to = 0;
    expect_error(&w, &p.plan, "pages");
    p.plan.n_deltas = 0;
    /* two entries for one slot */
    p.e[1] = p.e[0];
    p.plan.n_entries = 2;
    expect_error(&w, &p.plan, "already has");
    p.plan.n_entries = 1;
    /* the fixed plan runs, then a free makes the slot unknown again */
    assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
    assert_int_equal(res.n_tokens, 1);
    tt_plan_reset(&p, 3);
    p.frees[0] = 0;
    p.plan.n_frees = 1;
    r.pos = 6;
    plan_entry(&p, &r, GW_ENTRY_DECODE, &t32,
               1, 1, &gp);
    expect_error(&w, &p.plan, "not assigned");
    p.plan.n_entries = 0;
    assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
    assert_int_equal(res.n_tokens, 0);
    /* Hello */
    struct gw_hello_info h;
    gw_worker_hello(&w, &h);
    assert_int_equal(h.pages_total, POOL);
    assert_int_equal(h.num_layers, 2);
    assert_int_equal(h.groups_per_layer, 2);
    assert_int_equal(h.page_size, PAGE);
    assert_string_equal(h.profile, "none");
    assert_string_equal(h.backend, "cpu");
    assert_string_equal(h.comm_kind, "shm");
    assert_true(h.comm_id_len > 0); /* rank 0 names its group */
    assert_int_equal(h.page_bytes, 1 * 2 * PAGE * 16 * 4);
#undef RESET_REQ
    free(sent0);
    tt_req_free(&r, &pool);
    kv_pool_free(&pool);
    gw_worker_free(&w);
}

/* A request whose sampling parameters the sampler cannot use fails alone:
 * in a batch of three, the poisoned one gets a SlotError naming its slot
 * while the step stays ok, the other two are sampled exactly as in a plan
 * without it, and all three slots took their tokens (the poisoned one can
 * then be freed and its slot reused). */
static void test_slot_error_alone(void **state)
{
    (void)state;
    need_model();
    const struct {
        float top_p, rep, temp;
        uint32_t logprobs;
        const char *needle;
    } poison[] = {{0.0f, 1.0f, 0.0f, 0, "top_p 0"},
                  {1.0f, INFINITY, 0.0f, 0, "repetition_penalty inf"},
                  {1.0f, 1.0f, NAN, 0, "temperature nan"},
                  {1.0f, 1.0f, 0.0f, 1000, "1000 logprobs"}};
    struct gw_gen_params gp = greedy_params();
    const int32_t prompts[3][4] = {{11, 22, 33, 44}, {5, 6, 7, 8},
                                   {99, 98, 97, 96}};
    /* The reference: the same three prefills, all with good parameters. */
    uint32_t want[3];
    for (int round = -1; round < (int)(sizeof(poison) / sizeof(poison[0]));
         round++) {
        struct gw_worker w;
        worker_open(&w, NULL);
        const struct kv_layout *kv = &w.layout;
        struct kv_pool pool;
        assert_int_equal(kv_pool_init(&pool, w.be->n_pages, errbuf, sizeof(errbuf)),
                         0);
        struct tt_req r[3];
        static struct tt_plan p;
        tt_plan_reset(&p, 1);
        for (int q = 0; q < 3; q++) {
            req_init(&r[q], kv, (uint32_t)q, prompts[q], 4);
            assert_int_equal(kv_seq_reserve_prompt(&r[q].seq, kv, &pool, 0, 4,
                                                   errbuf, sizeof(errbuf)),
                             0);
            plan_deltas(&p, &r[q], kv);
            plan_entry(&p, &r[q],
                       GW_ENTRY_PREFILL,
                       prompts[q], 4, 1, &gp);
        }
        if (round >= 0) { /* poison the middle request */
            p.e[1].sampling.top_p = poison[round].top_p;
            p.e[1].sampling.repetition_penalty = poison[round].rep;
            p.e[1].sampling.temperature = poison[round].temp;
            p.e[1].sampling.n_top = (int)poison[round].logprobs;
        }
        struct gw_result res;
        assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
        assert_true(res.ok);
        if (round < 0) {
            assert_int_equal(res.n_tokens, 3);
            assert_int_equal(res.n_slot_errors, 0);
            for (int q = 0; q < 3; q++)
                want[q] = res.tokens[q].token;
        } else {
            assert_int_equal(res.n_tokens, 2);
            assert_int_equal(res.n_slot_errors, 1);
            assert_int_equal(res.slot_errors[0].slot, 1);
            if (strstr(res.slot_errors[0].error, poison[round].needle) ==
                NULL)
                fail_msg("slot error '%s' lacks '%s'",
                         res.slot_errors[0].error, poison[round].needle);
            assert_int_equal(res.tokens[0].slot, 0);
            assert_int_equal(res.tokens[0].token, want[0]);
            assert_int_equal(res.tokens[1].slot, 2);
            assert_int_equal(res.tokens[1].token, want[2]);
        }
        /* Every slot took its chunk, the poisoned one too. */
        for (int q = 0; q < 3; q++)
            assert_int_equal(w.step.slots[q].pos, 4);
        /* The router frees the failed request's slot; a fresh request
         * takes it over in the next step. */
        tt_plan_reset(&p, 2);
        p.frees[0] = 1;
        p.plan.n_frees = 1;
        tt_req_free(&r[1], &pool);
        req_init(&r[1], kv, 1, prompts[1], 4);
        assert_int_equal(kv_seq_reserve_prompt(&r[1].seq, kv, &pool, 0, 4,
                                               errbuf, sizeof(errbuf)),
                         0);
        plan_deltas(&p, &r[1], kv);
        plan_entry(&p, &r[1],
                   GW_ENTRY_PREFILL,
                   prompts[1], 4, 1, &gp);
        assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
        assert_int_equal(res.n_tokens, 1);
        assert_int_equal(res.n_slot_errors, 0);
        assert_int_equal(res.tokens[0].token, want[1]);
        for (int q = 0; q < 3; q++)
            tt_req_free(&r[q], &pool);
        assert_int_equal(kv_pool_n_used(&pool), 0);
        kv_pool_free(&pool);
        gw_worker_free(&w);
    }
}

/* gw_seq.epoch (the CUDA decode table cache's key): a slot's epoch
 * changes when its page lists are replaced or cut (fresh entry,
 * truncate_to, free) and stays when pages are only appended. */
/* In-process generation's arguments are its trust boundary, as the plan
 * check is a worker's: a sampling value the one check refuses is
 * TG_EINVAL naming the parameter before anything runs (the samplers
 * behind it only assert). A run without draws (max_tokens 0, as
 * calibration's) and a teacher-forced run (greedy draws listing the
 * alternatives) draw with no filter of the request's, so those are not
 * held against it. */
static void test_engine_sampling_checked(void **state)
{
    (void)state;
    need_model();
    struct gw_engine_opts eo = {.model_dir = model_dir,
                                .heads_per_group = 1,
                                .page_size = PAGE,
                                .prefill_chunk = CHUNK,
                                .max_context = 128,
                                .n_threads = 1};
    struct gw_engine eng;
    assert_int_equal(gw_engine_init(&eng, &eo, errbuf, sizeof(errbuf)), 0);
    const int32_t prompt[4] = {11, 22, 33, 44};
    const struct {
        float top_p, temp;
        int32_t n_top;
        const char *field;
    } bad[] = {{0.0f, 1.0f, 0, "top_p"},
               {1.0f, NAN, 0, "temperature"},
               {1.0f, 0.0f, 1000, "logprobs"}};
    struct gw_gen_result res;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct gw_gen_params gp = greedy_params();
        gp.max_tokens = 2;
        gp.sampling.top_p = bad[i].top_p;
        gp.sampling.temperature = bad[i].temp;
        gp.sampling.n_top = bad[i].n_top;
        assert_int_equal(gw_engine_generate(&eng, prompt, 4, &gp, &res, errbuf,
                                            sizeof(errbuf)),
                         TG_EINVAL);
        if (strstr(errbuf, bad[i].field) == NULL)
            fail_msg("'%s' does not name %s", errbuf, bad[i].field);
        gw_gen_result_free(&res);
    }
    struct gw_gen_params gp = greedy_params();
    gp.max_tokens = 0;
    gp.sampling.top_p = 0.0f; /* no draw uses it */
    assert_int_equal(
        gw_engine_generate(&eng, prompt, 4, &gp, &res, errbuf, sizeof(errbuf)),
        0);
    assert_int_equal(res.n_tokens, 0);
    gw_gen_result_free(&res);
    const int32_t forced[2] = {5, 6};
    gp.max_tokens = 2;
    gp.forced_ids = forced;
    gp.n_forced = 2;
    assert_int_equal(
        gw_engine_generate(&eng, prompt, 4, &gp, &res, errbuf, sizeof(errbuf)),
        0);
    assert_int_equal(res.n_tokens, 2);
    assert_int_equal(res.tokens[0], 5);
    assert_int_equal(res.tokens[1], 6);
    gw_gen_result_free(&res);
    gw_engine_free(&eng);
}

static void test_slot_epochs(void **state)
{
    (void)state;
    need_model();
    struct gw_worker w;
    worker_open(&w, NULL);
    const struct kv_layout *kv = &w.layout;
    struct gw_gen_params gp = greedy_params();
    const int32_t prompt[5] = {11, 22, 33, 44, 55};
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, w.be->n_pages, errbuf, sizeof(errbuf)), 0);
    struct tt_req r;
    req_init(&r, kv, 0, prompt, 5);
    assert_int_equal(kv_seq_reserve_prompt(&r.seq, kv, &pool, 0, 5, errbuf,
                                           sizeof(errbuf)), 0);
    static struct tt_plan p;
    struct gw_result res;
    good_plan(&p, &r, kv, 1, &gp);
    assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
    uint64_t e1 = w.step.slots[0].kv.epoch;
    assert_true(e1 != 0);
    assert_true(w.step.seqs[0].kv ==
                &w.step.slots[0].kv); /* the forward view's */

    /* appending a page to row 0 keeps the epoch */
    int32_t extra = -1;
    assert_int_equal(kv_pool_pop(&pool, 1, &extra), 0);
    tt_plan_reset(&p, 2);
    memset(&p.d[0], 0, sizeof(p.d[0]));
    p.d[0].slot = 0;
    p.ids[0] = (uint32_t)extra;
    p.d[0].page_ids = p.ids;
    p.d[0].n_page_ids = 1;
    p.plan.n_deltas = 1;
    assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
    assert_true(w.step.slots[0].kv.epoch == e1);
    int32_t n0 = w.step.slots[0].kv.n_pages[0];

    /* cutting row 0 back changes it */
    tt_plan_reset(&p, 3);
    memset(&p.d[0], 0, sizeof(p.d[0]));
    p.d[0].slot = 0;
    p.d[0].has_truncate = 1;
    p.d[0].truncate_to = (uint32_t)(n0 - 1);
    p.plan.n_deltas = 1;
    assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
    uint64_t e2 = w.step.slots[0].kv.epoch;
    assert_true(e2 != e1);

    /* freeing the slot changes it again, and a fresh start once more */
    tt_plan_reset(&p, 4);
    p.frees[0] = 0;
    p.plan.n_frees = 1;
    assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
    uint64_t e3 = w.step.slots[0].kv.epoch;
    assert_true(e3 != e2 && e3 != e1);
    memset(r.sent, 0, (size_t)w.rows * sizeof(int32_t));
    r.fresh = 1;
    r.pos = 0;
    good_plan(&p, &r, kv, 5, &gp);
    assert_int_equal(gw_worker_step(&w, &p.plan, &res), 0);
    assert_true(w.step.slots[0].kv.epoch != e3 &&
                w.step.slots[0].kv.epoch != e2 &&
                w.step.slots[0].kv.epoch != e1);

    tt_req_free(&r, &pool);
    kv_pool_free(&pool);
    gw_worker_free(&w);
}

/* --cpu-weights reaches the model: f32 and bf16 whatever the checkpoint
 * holds. */
static void test_weights_format(void **state)
{
    (void)state;
    need_model();
    const enum gw_weights fmt[2] = {GW_WEIGHTS_F32, GW_WEIGHTS_BF16};
    const enum tg_wtype want[2] = {TG_WTYPE_F32, TG_WTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        struct gw_worker w;
        struct gw_worker_opts o = {.model_dir = model_dir,
                                   .heads_per_group = 1,
                                   .page_size = PAGE,
                                   .prefill_chunk = CHUNK,
                                   .kv_pages = POOL,
                                   .max_slots = SLOTS,
                                   .rank = 0,
                                   .world_size = 1,
                                   .n_threads = 1,
                                   .weights = fmt[i]};
        assert_int_equal(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)), 0);
        assert_int_equal(w.model.wtype, want[i]);
        gw_worker_free(&w);
    }
}

static void test_init_refusals(void **state)
{
    (void)state;
    need_model();
    struct gw_worker w;
    struct gw_worker_opts o = {
        .model_dir = model_dir, .heads_per_group = 1, .page_size = PAGE,
        .prefill_chunk = CHUNK, .kv_pages = 64, .max_slots = 2, .rank = 2,
        .world_size = 2};
    assert_int_equal(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "--rank 2"));
    o.rank = 0;
    o.world_size = 1;
    o.backend = GW_BACKEND_CUDA;
    /* no CUDA in the build, or no device, or (with one) head_dim 16 */
    int rc = gw_worker_init(&w, &o, errbuf, sizeof(errbuf));
    assert_true(rc == TG_EUNSUPPORTED || rc == TG_ENODEV);
    assert_non_null(strstr(errbuf, "cuda"));
    o.backend = GW_BACKEND_CPU;
    o.kv_pages = 0;
    o.kv_memory.bytes = 100; /* less than one page */
    assert_int_equal(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)), TG_EINVAL);
    o.kv_memory.bytes = 1 << 20;
    assert_int_equal(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(w.be->n_pages, (1 << 20) / (2 * PAGE * 16 * 4));
    gw_worker_free(&w);
    o.model_dir = "/nonexistent/model";
    assert_int_not_equal(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)), 0);
    gw_worker_free(&w); /* safe on the freed worker */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_full_kv),
        cmocka_unit_test(test_greedy_profile),
        cmocka_unit_test(test_seeded_sampling_penalties),
        cmocka_unit_test(test_fork_greedy),
        cmocka_unit_test(test_fork_seeded_penalties),
        cmocka_unit_test(test_two_requests_batched),
        cmocka_unit_test(test_bad_plans),
        cmocka_unit_test(test_slot_error_alone),
        cmocka_unit_test(test_engine_sampling_checked),
        cmocka_unit_test(test_slot_epochs),
        cmocka_unit_test(test_weights_format),
        cmocka_unit_test(test_init_refusals),
    };
    return cmocka_run_group_tests(tests, make_model, remove_model);
}
