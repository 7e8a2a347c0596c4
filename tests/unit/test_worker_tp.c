/* test_worker_tp.c — tensor parallelism on the CPU backend: T forked
 * worker ranks (gw_worker_init with rank/world, then gw_worker_comm_join
 * with the CommSetup the router would send; each fed the same plans with
 * page ids from its own kv_seq reservations under its own rank layout,
 * built from pf_tp_assign + pf_profile_rank the way the router builds it)
 * sample, on rank 0, what one T = 1 worker (joined the same way) samples
 * on the same prompts: greedy tokens equal (unless the T = 1 top-2 margin
 * is below 1e-4) and log-probabilities within 1e-4, for a Qwen3 model with
 * a compressing profile whose groups permute the heads (T = 2), a tied
 * Qwen2 model (q/k/v bias) with full KV (T = 2) and a Qwen3 model with 3
 * KV heads (T = 3); the vocabulary divides by neither, so the
 * vocab-parallel head pads its last slice. Also: rank > 0 answers without
 * tokens, its Hello reports H/T heads and G/T groups and only rank 0's
 * names a group (after its pid); a peer that stops makes the step fail
 * with TG_ETIMEDOUT and marks the peers lost; the shard loader keeps
 * exactly the right rows and columns, the vocab slice of lm_head
 * included; bad shards, plans before the join and CommSetups that cannot
 * be joined are refused. Models come from $TANGRAM_BIN/tangram-make-model
 * (the test fails, naming it, when it is not built). Compute runs in forked children only
 * (no OpenMP or BLAS threads exist in the parent when it forks). */
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
#include <time.h>
#include <unistd.h>

#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/profile/pf_profile.h"
#include "common/profile/pf_split.h"
#include "common/base/tg_err.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/serve/gw_worker.h"
#include "tests/support/tt_plan.h"
#include "tests/support/tt_support.h"

#define PAGE 8
#define CHUNK 16
#define SLOTS 2
#define POOL 512
#define NREQ 2
#define NTOK 8 /* generated tokens per request */
#define K 3    /* logprobs per token */

static char tmpdir[256];
static char qwen3_dir[300], qwen2_dir[300], odd_dir[300], t3_dir[300];
static char profile_path[300];
static char errbuf[512];

/* In a forked child: report and leave without returning into cmocka. */
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
    if (tt_tmpdir_make("tg_test_worker_tp.", tmpdir, sizeof(tmpdir)) != 0)
        return -1;
    snprintf(qwen3_dir, sizeof(qwen3_dir), "%s/q3", tmpdir);
    snprintf(qwen2_dir, sizeof(qwen2_dir), "%s/q2", tmpdir);
    snprintf(odd_dir, sizeof(odd_dir), "%s/odd", tmpdir);
    snprintf(t3_dir, sizeof(t3_dir), "%s/t3", tmpdir);
    const struct {
        const char *dir, *arch, *ffn, *seed, *heads, *kv, *tie;
    } models[] = {
        {qwen3_dir, "qwen3", "128", "7", "8", "4", NULL},
        {qwen2_dir, "qwen2", "128", "9", "8", "4", "--tie"},
        {odd_dir, "qwen3", "99", "3", "8", "4", NULL}, /* F % 2 != 0 */
        {t3_dir, "qwen3", "96", "13", "6", "3", NULL}, /* for T = 3 */
    };
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
        const char *const args[] = {"--arch", models[i].arch, "--ffn",
            models[i].ffn, "--seed", models[i].seed, "--hidden", "64",
            "--layers", "2", "--heads", models[i].heads, "--kv-heads",
            models[i].kv, "--head-dim", "16", models[i].tie, NULL};
        int rc = tt_make_model(models[i].dir, args);
        if (rc != 0)
            return -1;
    }
    /* Compressing profile, 2 heads per group; the budget order permutes
     * the heads: layer 0 groups [[3,1],[2,0]], layer 1 [[3,0],[1,2]]. */
    const double b[8] = {0.9, 0.3, 0.6, 0.2, 0.5, 0.55, 1.0, 0.25};
    const int groups[8] = {3, 1, 2, 0, 3, 0, 1, 2};
    snprintf(profile_path, sizeof(profile_path), "%s/profile.json", tmpdir);
    return tt_write_profile(profile_path, "Qwen3ForCausalLM", 2, 4, 16, 2, b,
                            groups, 0.5);
}

static int remove_models(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

static void need_models(void)
{
    assert_true(qwen3_dir[0] != '\0'); /* the group setup made it */
}

static void comm_name(char *out, size_t len)
{
    static unsigned serial;
    snprintf(out, len, "/tangram-test-tp-%d-%u", (int)getpid(), serial++);
}

/* Joins `w` as the router's CommSetup would make it: the group `comm`
 * (rank 0's Hello names it in the daemon), kind "shm", world `world`. */
static int join(struct gw_worker *w, const char *comm, int world)
{
    struct gw_comm_setup cs = {.version = GW_PROTOCOL_VERSION,
                               .world_size = (uint32_t)world, .kind = "shm"};
    if (comm != NULL) {
        cs.id = (const uint8_t *)comm;
        cs.id_len = strlen(comm);
    }
    return gw_worker_comm_join(w, &cs, errbuf, sizeof(errbuf));
}

/* ---- the router's view of one rank: its layout, built independently --- */

/* Builds rank `rank`'s page layout from the profile file (or full KV with
 * H_p = hpg) exactly as contract point 1 says. */
static void rank_layout(struct kv_layout *kv, const char *model_dir,
                        const char *profile, int hpg, int rank, int world)
{
    struct mc_model_config cfg;
    CHECK(mc_model_config_load(&cfg, model_dir, errbuf, sizeof(errbuf)) == 0);
    struct pf_profile whole, mine;
    if (profile == NULL)
        CHECK(pf_profile_init_full(&whole, cfg.num_layers, cfg.num_kv_heads,
                                   cfg.head_dim,
                                   pf_full_heads_per_group(cfg.num_kv_heads, hpg),
                                   errbuf, sizeof(errbuf)) == 0);
    else
        CHECK(pf_profile_load(&whole, profile, errbuf, sizeof(errbuf)) == 0);
    struct pf_tp_plan plan;
    CHECK(pf_tp_assign(&plan, &whole, world, errbuf, sizeof(errbuf)) == 0);
    int *gh = malloc((size_t)cfg.num_layers * (size_t)plan.heads_per_rank * sizeof(int));
    CHECK(gh != NULL);
    CHECK(pf_profile_rank(&mine, gh, &whole, &plan, rank, errbuf, sizeof(errbuf)) == 0);
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    CHECK(kv_layout_init(kv, mine.num_layers, mine.num_groups, mine.heads_per_group,
                         mine.head_dim, PAGE, CHUNK, &rule, mine.group_budget,
                         errbuf, sizeof(errbuf)) == 0);
    free(gh);
    pf_profile_free(&mine);
    pf_tp_free(&plan);
    pf_profile_free(&whole);
}

/* ---- plans ------------------------------------------------------------- */

/* Plans through tests/support/tt_plan (ranks are forked: CHECK, not
 * cmocka asserts), greedy with K top logprobs. */
static void plan_deltas(struct tt_plan *p, struct tt_req *r,
                        const struct kv_layout *kv)
{
    CHECK(tt_plan_deltas(p, r, kv) == 0);
}

static void plan_entry(struct tt_plan *p, struct tt_req *r, int kind,
                       const int32_t *toks, int n, int sample)
{
    struct gw_entry *e = tt_plan_entry(p, r, kind, toks, n, sample);
    CHECK(e != NULL);
    e->sampling.n_top = K;
}

/* What rank 0 (or the T = 1 worker) sampled. */
struct gen {
    int32_t tok[NREQ][NTOK];
    float lp[NREQ][NTOK];
    float top[NREQ][NTOK][K];
    int got[NREQ];
    uint32_t hello_heads, hello_groups, hello_world;
};

/* One rank of a run: worker + its own page accounting, the same plans on
 * every rank (tokens fed back are rank 0's; other ranks read them from
 * `feed`, filled by the T = 1 reference run — both are the same tokens
 * exactly when the test passes, and a mismatch shows up in rank 0's
 * report). Writes struct gen to fd on rank 0. */
static void run_rank(const char *model_dir, const char *profile, int rank,
                     int world, const char *comm, const struct gen *feed,
                     int fd)
{
    struct gw_worker w;
    struct gw_worker_opts o = {
        .model_dir = model_dir, .profile_path = profile, .heads_per_group = 1,
        .page_size = PAGE, .prefill_chunk = CHUNK, .kv_pages = POOL,
        .max_slots = SLOTS, .rank = rank, .world_size = world,
        .comm_timeout_ms = 5000, .n_threads = 1};
    CHECK(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)) == 0);
    /* rank 0 named a group after its pid; one rank joins its own name */
    char prefix[64], own[128] = "";
    snprintf(prefix, sizeof(prefix), "/tangram-%d-", (int)getpid());
    struct gw_hello_info h;
    gw_worker_hello(&w, &h);
    if (h.comm_id_len > 0 && h.comm_id_len < sizeof(own))
        memcpy(own, h.comm_id, h.comm_id_len);
    CHECK(rank == 0 ? strncmp(own, prefix, strlen(prefix)) == 0
                    : own[0] == '\0');
    CHECK(join(&w, world > 1 ? comm : own, world) == 0);
    CHECK(w.joined);
    struct kv_layout kv;
    rank_layout(&kv, model_dir, profile, 1, rank, world);
    /* the router's layout and the worker's agree */
    CHECK(kv.n_groups == w.layout.n_groups);
    CHECK(kv.heads_per_group == w.layout.heads_per_group);
    for (int i = 0; i < kv.n_layers * kv.n_groups; i++)
        CHECK(kv.group_budget[i] == w.layout.group_budget[i]);

    static struct gen out;
    memset(&out, 0, sizeof(out));
    out.hello_heads = (uint32_t)h.num_kv_heads;
    out.hello_groups = (uint32_t)h.groups_per_layer;
    out.hello_world = (uint32_t)h.world_size;

    int32_t prompts[NREQ][40];
    const int np[NREQ] = {37, 21};
    for (int i = 0; i < 40; i++) {
        prompts[0][i] = (int32_t)((i * 7919 + 13) % 5000);
        prompts[1][i] = (int32_t)((i * 104729 + 401) % 7000);
    }
    struct kv_pool pool;
    CHECK(kv_pool_init(&pool, w.be->n_pages, errbuf, sizeof(errbuf)) == 0);
    struct tt_req r[NREQ];
    for (int q = 0; q < NREQ; q++) {
        memset(&r[q], 0, sizeof(r[q]));
        CHECK(kv_seq_init(&r[q].seq, &kv, errbuf, sizeof(errbuf)) == 0);
        r[q].sent = calloc((size_t)(kv.n_layers * kv.n_groups), sizeof(int32_t));
        CHECK(r[q].sent != NULL);
        r[q].slot = (uint32_t)q;
        r[q].prompt = prompts[q];
        r[q].n_prompt = np[q];
        r[q].fresh = 1;
        CHECK(kv_seq_reserve_prompt(&r[q].seq, &kv, &pool, 0, np[q], errbuf,
                                    sizeof(errbuf)) == 0);
    }
    static struct tt_plan p;
    int fed[NREQ] = {0, 0};
    for (uint64_t step = 1;; step++) {
        tt_plan_reset(&p, step);
        for (int q = 0; q < NREQ; q++) {
            struct tt_req *rq = &r[q];
            if (rq->pos < rq->n_prompt) {
                int n = rq->n_prompt - (int)rq->pos;
                n = n < CHUNK ? n : CHUNK;
                plan_deltas(&p, rq, &kv);
                plan_entry(&p, rq, GW_ENTRY_PREFILL,
                           rq->prompt + rq->pos, n, rq->pos + n == rq->n_prompt);
                CHECK(kv_seq_commit(&rq->seq, &kv, n, errbuf, sizeof(errbuf)) == 0);
                rq->pos += n;
            } else if (fed[q] + 1 < NTOK) {
                CHECK(kv_seq_reserve_decode(&rq->seq, &kv, &pool, 1, errbuf,
                                            sizeof(errbuf)) == 0);
                plan_deltas(&p, rq, &kv);
                const int32_t *t = feed != NULL ? &feed->tok[q][fed[q]]
                                                : &out.tok[q][fed[q]];
                plan_entry(&p, rq, GW_ENTRY_DECODE,
                           t, 1, 1);
                fed[q]++;
                rq->pos += 1;
            }
        }
        if (p.plan.n_entries == 0)
            break;
        struct gw_result res;
        int rc = gw_worker_step(&w, &p.plan, &res);
        if (rc != 0)
            snprintf(errbuf, sizeof(errbuf), "rank %d step %llu: %s", rank,
                     (unsigned long long)step, res.error);
        CHECK(rc == 0 && res.ok);
        CHECK(res.rank == rank);
        if (rank != 0)
            CHECK(res.n_tokens == 0);
        for (size_t i = 0; i < res.n_tokens; i++) {
            const struct gw_token *s = &res.tokens[i];
            int q = (int)s->slot;
            CHECK(q >= 0 && q < NREQ && out.got[q] < NTOK && s->n_top == K);
            out.tok[q][out.got[q]] = s->token;
            out.lp[q][out.got[q]] = s->logprob;
            for (int k = 0; k < K; k++)
                out.top[q][out.got[q]][k] = s->top_lps[k];
            out.got[q]++;
        }
    }
    for (int q = 0; q < NREQ; q++) {
        kv_seq_free(&r[q].seq, &pool);
        free(r[q].sent);
    }
    CHECK(kv_pool_n_used(&pool) == 0);
    kv_pool_free(&pool);
    kv_layout_free(&kv);
    gw_worker_free(&w);
    if (fd >= 0)
        CHECK(write(fd, &out, sizeof(out)) == (ssize_t)sizeof(out));
}

/* Forks one child per rank; reads rank 0's report into *rank0. */
static void run_group(const char *model_dir, const char *profile, int world,
                      const struct gen *feed, struct gen *rank0)
{
    char comm[128];
    comm_name(comm, sizeof(comm));
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid[3];
    for (int r = 0; r < world; r++) {
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) {
            close(fds[0]);
            run_rank(model_dir, profile, r, world, world > 1 ? comm : NULL,
                     feed, r == 0 ? fds[1] : -1);
            _exit(0);
        }
    }
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof(*rank0)) {
        ssize_t n = read(fds[0], (char *)rank0 + got, sizeof(*rank0) - got);
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
    assert_int_equal(got, sizeof(*rank0));
}

static void compare_tp(const char *model_dir, const char *profile,
                       unsigned heads, unsigned groups_t1, int world)
{
    need_models();
    static struct gen ref, tp;
    run_group(model_dir, profile, 1, NULL, &ref);
    assert_int_equal(ref.hello_world, 1);
    assert_int_equal(ref.hello_heads, heads);
    assert_int_equal(ref.hello_groups, groups_t1);
    run_group(model_dir, profile, world, &ref, &tp);
    assert_int_equal(tp.hello_world, world);
    assert_int_equal(tp.hello_heads, heads / (unsigned)world);
    assert_int_equal(tp.hello_groups, groups_t1 / (unsigned)world);
    double worst = 0.0;
    for (int q = 0; q < NREQ; q++) {
        assert_int_equal(ref.got[q], NTOK);
        assert_int_equal(tp.got[q], NTOK);
        for (int t = 0; t < NTOK; t++) {
            double margin = (double)ref.top[q][t][0] - (double)ref.top[q][t][1];
            if (tp.tok[q][t] != ref.tok[q][t]) {
                /* only a near tie may flip; later tokens then differ in
                 * context, so stop comparing this request */
                assert_true(margin < 1e-4);
                break;
            }
            double d = fabs((double)tp.lp[q][t] - (double)ref.lp[q][t]);
            worst = d > worst ? d : worst;
            assert_true(d <= 1e-4);
            for (int k = 0; k < K; k++)
                assert_true(fabs((double)tp.top[q][t][k] - (double)ref.top[q][t][k]) <= 1e-4);
        }
    }
    printf("  T = %d vs T = 1: largest logprob difference %.3g\n", world,
           worst);
}

static void test_tp2_qwen3_profile(void **state)
{
    (void)state;
    compare_tp(qwen3_dir, profile_path, 4, 2, 2);
}

static void test_tp2_qwen2_tied_full_kv(void **state)
{
    (void)state;
    compare_tp(qwen2_dir, NULL, 4, 4, 2);
}

static void test_tp3_qwen3_full_kv(void **state)
{
    (void)state;
    compare_tp(t3_dir, NULL, 3, 3, 3);
}

/* ---- a peer that stops ------------------------------------------------- */

static void test_peer_lost(void **state)
{
    (void)state;
    need_models();
    char comm[128];
    comm_name(comm, sizeof(comm));
    pid_t peer = fork();
    assert_true(peer >= 0);
    if (peer == 0) {
        /* rank 1 joins, loads, then never runs a plan */
        struct gw_worker w;
        struct gw_worker_opts o = {
            .model_dir = qwen3_dir, .heads_per_group = 1, .page_size = PAGE,
            .prefill_chunk = CHUNK, .kv_pages = 64, .max_slots = SLOTS,
            .rank = 1, .world_size = 2, .comm_timeout_ms = 3000,
            .n_threads = 1};
        CHECK(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)) == 0);
        CHECK(join(&w, comm, 2) == 0);
        sleep(60); /* beyond every bound below; killed at the end */
        _exit(0); /* stuck, then gone without a word */
    }
    pid_t r0 = fork();
    assert_true(r0 >= 0);
    if (r0 == 0) {
        static volatile sig_atomic_t lost;
        struct gw_worker w;
        struct gw_worker_opts o = {
            .model_dir = qwen3_dir, .heads_per_group = 1, .page_size = PAGE,
            .prefill_chunk = CHUNK, .kv_pages = 64, .max_slots = SLOTS,
            .rank = 0, .world_size = 2, .comm_timeout_ms = 3000,
            .peer_lost_flag = &lost, .n_threads = 1};
        CHECK(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)) == 0);
        /* The join may wait for the peer's load; the step after it
         * gives up after the same 3 s while the peer is stuck. */
        CHECK(join(&w, comm, 2) == 0);
        struct kv_layout kv;
        rank_layout(&kv, qwen3_dir, NULL, 1, 0, 2);
        struct kv_pool pool;
        CHECK(kv_pool_init(&pool, w.be->n_pages, errbuf, sizeof(errbuf)) == 0);
        int32_t prompt[5] = {1, 2, 3, 4, 5};
        struct tt_req rq = {.slot = 0, .prompt = prompt, .n_prompt = 5, .fresh = 1};
        CHECK(kv_seq_init(&rq.seq, &kv, errbuf, sizeof(errbuf)) == 0);
        rq.sent = calloc((size_t)(kv.n_layers * kv.n_groups), sizeof(int32_t));
        CHECK(kv_seq_reserve_prompt(&rq.seq, &kv, &pool, 0, 5, errbuf,
                                    sizeof(errbuf)) == 0);
        static struct tt_plan p;
        tt_plan_reset(&p, 1);
        plan_deltas(&p, &rq, &kv);
        plan_entry(&p, &rq, GW_ENTRY_PREFILL,
                   prompt, 5, 1);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        struct gw_result res;
        int rc = gw_worker_step(&w, &p.plan, &res);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        snprintf(errbuf, sizeof(errbuf), "rc %d, %.2f s, '%s'", rc, dt, res.error);
        CHECK(rc == TG_ETIMEDOUT && !res.ok && res.n_tokens == 0);
        CHECK(strstr(res.error, "all-reduce") != NULL);
        /* Its own 3 s timeout: not before (timers do not fire early),
         * and later only by a loaded machine's delay (10 s of slack),
         * far from the stuck peer's 60 s life. */
        CHECK(dt >= 2.7 && dt < 3.0 + 10.0);
        CHECK(w.peers_lost == 1 && lost == 1);
        /* the next (valid) plan fails at once: the group is gone */
        tt_plan_reset(&p, 2);
        memset(rq.sent, 0, (size_t)(kv.n_layers * kv.n_groups) * sizeof(int32_t));
        rq.fresh = 1;
        plan_deltas(&p, &rq, &kv);
        plan_entry(&p, &rq, GW_ENTRY_PREFILL,
                   prompt, 5, 1);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = gw_worker_step(&w, &p.plan, &res);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        snprintf(errbuf, sizeof(errbuf), "rc %d, %.2f s, '%s'", rc, dt, res.error);
        /* At once: not another wait of the 3 s timeout. */
        CHECK(rc == TG_ETIMEDOUT && !res.ok && dt < 3.0);
        kv_seq_free(&rq.seq, &pool);
        free(rq.sent);
        kv_pool_free(&pool);
        kv_layout_free(&kv);
        gw_worker_free(&w);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(r0, &st, 0), r0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    kill(peer, SIGKILL);
    assert_int_equal(waitpid(peer, &st, 0), peer);
}

/* ---- the shard loader -------------------------------------------------- */

/* An fp32 host matrix of a model loaded with GW_WEIGHTS_F32. */
#define F(p) ((const float *)(p))

static void test_shard_slices(void **state)
{
    (void)state;
    need_models();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct gw_model whole, sh[2];
        /* fp32 host weights on both sides, compared as floats. */
        const struct gw_shard one = {
            .rank = 0, .world = 1, .weights = GW_WEIGHTS_F32};
        CHECK(gw_model_load_shard(&whole, qwen2_dir, &one, errbuf,
                                  sizeof(errbuf)) == 0);
        const int H = 4, Hl = 2, G = 2, d = 16, hid = 64, F = 128, Fl = 64;
        /* layer 0: rank 0 holds heads 3, 1; rank 1 heads 0, 2; layer 1
         * rank 0: 2, 0; rank 1: 1, 3 */
        const int heads[2][4] = {{3, 1, 2, 0}, {0, 2, 1, 3}};
        for (int r = 0; r < 2; r++) {
            struct gw_shard s = {.rank = r,
                                 .world = 2,
                                 .kv_heads = heads[r],
                                 .weights = GW_WEIGHTS_F32};
            CHECK(gw_model_load_shard(&sh[r], qwen2_dir, &s, errbuf,
                                      sizeof(errbuf)) == 0);
            const struct gw_model *m = &sh[r];
            CHECK(m->n_kv_heads == Hl && m->n_q_heads == Hl * G && m->ffn == Fl);
            /* vocab-parallel head: rank r holds rows [r*Vp, ..) of the
             * tied embedding, which stays whole */
            int vf, vn, vp;
            gw_model_vocab_slice(m, &vf, &vn, &vp);
            CHECK(vp == (whole.vocab + 1) / 2 && vf == r * vp);
            CHECK(vn == (r == 0 ? vp : whole.vocab - vp));
            CHECK(F(m->lm_head) == F(m->embed) + (size_t)vf * hid);
            CHECK(memcmp(m->embed, whole.embed,
                         (size_t)whole.vocab * hid * sizeof(float)) == 0);
            for (int l = 0; l < 2; l++) {
                const struct gw_layer *a = &whole.layers[l], *b = &m->layers[l];
                CHECK(memcmp(a->attn_norm, b->attn_norm, hid * sizeof(float)) == 0);
                for (int i = 0; i < Hl; i++) {
                    int g = heads[r][l * Hl + i];
                    CHECK(memcmp(F(a->wk) + (size_t)g * d * hid,
                                 F(b->wk) + (size_t)i * d * hid,
                                 (size_t)d * hid * sizeof(float)) == 0);
                    CHECK(memcmp(a->bv + (size_t)g * d, b->bv + (size_t)i * d,
                                 d * sizeof(float)) == 0);
                    for (int j = 0; j < G; j++) {
                        int gq = g * G + j, lq = i * G + j;
                        CHECK(memcmp(F(a->wq) + (size_t)gq * d * hid,
                                     F(b->wq) + (size_t)lq * d * hid,
                                     (size_t)d * hid * sizeof(float)) == 0);
                        CHECK(memcmp(a->bq + (size_t)gq * d, b->bq + (size_t)lq * d,
                                     d * sizeof(float)) == 0);
                        for (int row = 0; row < hid; row++)
                            CHECK(memcmp(F(a->wo) + (size_t)row * H * G * d +
                                             (size_t)gq * d,
                                         F(b->wo) + (size_t)row * Hl * G * d +
                                             (size_t)lq * d,
                                         d * sizeof(float)) == 0);
                    }
                }
                CHECK(memcmp(F(a->w_gate) + (size_t)r * Fl * hid, b->w_gate,
                             (size_t)Fl * hid * sizeof(float)) == 0);
                CHECK(memcmp(F(a->w_up) + (size_t)r * Fl * hid, b->w_up,
                             (size_t)Fl * hid * sizeof(float)) == 0);
                for (int row = 0; row < hid; row++)
                    CHECK(
                        memcmp(F(a->w_down) + (size_t)row * F + (size_t)r * Fl,
                               F(b->w_down) + (size_t)row * Fl,
                               Fl * sizeof(float)) == 0);
            }
            gw_model_free(&sh[r]);
        }
        gw_model_free(&whole);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---- refusals (no compute) ---------------------------------------------- */

static void test_refusals(void **state)
{
    (void)state;
    need_models();
    struct gw_model m;
    const int dup[4] = {0, 0, 1, 2};
    struct gw_shard s = {.rank = 0, .world = 2, .kv_heads = dup};
    assert_int_equal(gw_model_load_shard(&m, qwen3_dir, &s, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "each once"));
    const int out_of_range[4] = {0, 4, 1, 2};
    s.kv_heads = out_of_range;
    assert_int_equal(gw_model_load_shard(&m, qwen3_dir, &s, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    const int ok[4] = {0, 1, 2, 3};
    s.kv_heads = ok;
    assert_int_equal(gw_model_load_shard(&m, odd_dir, &s, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "intermediate size 99"));
    s.world = 3;
    assert_int_equal(gw_model_load_shard(&m, qwen3_dir, &s, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    s.world = 2;
    s.kv_heads = NULL;
    assert_int_equal(gw_model_load_shard(&m, qwen3_dir, &s, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    s.rank = 2;
    s.kv_heads = ok;
    assert_int_equal(gw_model_load_shard(&m, qwen3_dir, &s, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    gw_model_free(&m);

    /* The worker side of the CommSetup (no compute: a child loads the
     * model so the parent never starts OpenMP threads before forking). */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct gw_worker w;
        struct gw_worker_opts o = {
            .model_dir = qwen3_dir, .heads_per_group = 1, .page_size = PAGE,
            .prefill_chunk = CHUNK, .kv_pages = 64, .max_slots = 2,
            .rank = 1, .world_size = 2, .comm_timeout_ms = 200,
            .n_threads = 1};
        CHECK(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)) == 0);
        struct gw_hello_info h;
        gw_worker_hello(&w, &h);
        /* only rank 0 names the group */
        CHECK(!w.joined && h.comm_id_len == 0 &&
              strcmp(h.comm_kind, "shm") == 0);
        /* a plan before the join */
        static struct tt_plan p;
        tt_plan_reset(&p, 1);
        struct gw_result res;
        CHECK(gw_worker_step(&w, &p.plan, &res) == TG_EPROTO && !res.ok);
        CHECK(strstr(res.error, "CommSetup") != NULL);
        /* setups this rank cannot join */
        CHECK(join(&w, "/tangram-test-x", 3) == TG_EINVAL);
        CHECK(strstr(errbuf, "world size 3") != NULL);
        CHECK(join(&w, NULL, 2) == TG_EINVAL);
        CHECK(join(&w, "/a/b", 2) == TG_EINVAL);
        struct gw_comm_setup cs = {.version = GW_PROTOCOL_VERSION,
                                   .world_size = 2, .kind = "nccl",
                                   .id = (const uint8_t *)"/x", .id_len = 2};
        CHECK(gw_worker_comm_join(&w, &cs, errbuf, sizeof(errbuf)) ==
              TG_EUNSUPPORTED);
        cs.kind = "shm";
        cs.version = 7;
        CHECK(gw_worker_comm_join(&w, &cs, errbuf, sizeof(errbuf)) ==
              TG_EPROTO);
        uint8_t nul[4] = {'/', 'a', 0, 'b'};
        cs.version = GW_PROTOCOL_VERSION;
        cs.id = nul;
        cs.id_len = 4;
        CHECK(gw_worker_comm_join(&w, &cs, errbuf, sizeof(errbuf)) ==
              TG_EINVAL);
        /* a lone rank 1 never finds its group; it stays unjoined */
        char comm[128];
        comm_name(comm, sizeof(comm));
        CHECK(join(&w, comm, 2) == TG_ETIMEDOUT && !w.joined);
        gw_worker_free(&w);

        /* one rank joins anything, once */
        o.rank = 0;
        o.world_size = 1;
        CHECK(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)) == 0);
        cs.kind = "";
        cs.id_len = 0;
        cs.world_size = 1;
        CHECK(gw_worker_comm_join(&w, &cs, errbuf, sizeof(errbuf)) == 0);
        CHECK(w.joined);
        CHECK(gw_worker_comm_join(&w, &cs, errbuf, sizeof(errbuf)) ==
              TG_EPROTO);
        gw_worker_free(&w);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2_qwen3_profile),
        cmocka_unit_test(test_tp2_qwen2_tied_full_kv),
        cmocka_unit_test(test_tp3_qwen3_full_kv),
        cmocka_unit_test(test_peer_lost),
        cmocka_unit_test(test_shard_slices),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, make_models, remove_models);
}
