/* test_worker_tier.c — a worker's host tier (gpu_worker/serve/gw_host_tier.h,
 * DESIGN.md §4.10) on the CPU backend: a conversation's pages offloaded
 * and restored into other pages give its next turn, adopted like any
 * stored conversation, exactly the tokens and log-probabilities (bit for
 * bit) of the same conversation adopted from its original pages; ops are
 * reported in submission order through the eventfd, refused ones (page
 * out of range, lengths that differ, a worker without a tier) fail alone;
 * the Hello announces the tier's pages; a tier that cannot fit the host
 * is refused at start. The tiny model comes from
 * $TANGRAM_BIN/tangram-make-model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "gpu_worker/serve/gw_host_tier.h"
#include "gpu_worker/serve/gw_worker.h"
#include "tests/support/tt_plan.h"
#include "tests/support/tt_support.h"

#define PAGE 8
#define CHUNK 16
#define POOL 256
#define HOST 64

static char tmpdir[256];
static char model_dir[300];
static char profile_path[300];
static char errbuf[512];

static int make_model(void **state)
{
    (void)state;
    if (tt_tmpdir_make("tg_test_wtier.", tmpdir, sizeof(tmpdir)) != 0)
        return -1;
    snprintf(model_dir, sizeof(model_dir), "%s/m", tmpdir);
    const char *const args[] = {"--arch", "qwen3", "--hidden", "64",
        "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim",
        "16", "--ffn", "128", "--seed", "9", NULL};
    if (tt_make_model(model_dir, args) != 0)
        return -1;
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

/* A joined worker with `host_pages` host pages (0: no tier). */
static void worker_open(struct gw_worker *w, int64_t host_pages)
{
    assert_true(model_dir[0] != '\0');
    struct gw_worker_opts o = {
        .model_dir = model_dir, .profile_path = profile_path,
        .heads_per_group = 1, .page_size = PAGE, .prefill_chunk = CHUNK,
        .kv_pages = POOL, .max_slots = 4, .rank = 0, .world_size = 1,
        .n_threads = 1};
    /* a page: H_p 1 x K,V x P x d fp32 */
    o.kv_host_memory = (uint64_t)host_pages * 1 * 2 * PAGE * 16 * 4;
    int rc = gw_worker_init(w, &o, errbuf, sizeof(errbuf));
    if (rc != 0)
        fprintf(stderr, "gw_worker_init: %s\n", errbuf);
    assert_int_equal(rc, 0);
    struct gw_hello_info h;
    gw_worker_hello(w, &h);
    assert_int_equal(h.host_pages_total, host_pages);
    struct gw_comm_setup cs = {.version = GW_PROTOCOL_VERSION,
                               .world_size = 1, .kind = "shm",
                               .id = h.comm_id, .id_len = h.comm_id_len};
    assert_int_equal(gw_worker_comm_join(w, &cs, errbuf, sizeof(errbuf)), 0);
}

static void run(struct gw_worker *w, struct tt_plan *p, struct gw_result *res)
{
    int rc = gw_worker_step(w, &p->plan, res);
    if (rc != 0)
        fprintf(stderr, "step: %s\n", res->error);
    assert_int_equal(rc, 0);
}

/* Prefills prompt[0 .. n) in r's slot and decodes `dec` tokens, greedy;
 * the sampled tokens go to out. */
static void first_turn(struct gw_worker *w, struct kv_pool *pool,
                       struct tt_req *r, uint64_t *step, int dec,
                       int32_t *out)
{
    const struct kv_layout *kv = &w->layout;
    static struct tt_plan p;
    assert_int_equal(kv_seq_reserve_prompt(&r->seq, kv, pool, 0, r->n_prompt,
                                           errbuf, sizeof(errbuf)), 0);
    int got = 0;
    while (r->pos < r->n_prompt || got < dec) {
        tt_plan_reset(&p, ++*step);
        if (r->pos < r->n_prompt) {
            int n = r->n_prompt - (int)r->pos;
            n = n < CHUNK ? n : CHUNK;
            assert_int_equal(tt_plan_deltas(&p, r, kv), 0);
            assert_non_null(tt_plan_entry(&p, r, GW_ENTRY_PREFILL,
                                          r->prompt + r->pos, n,
                                          r->pos + n == r->n_prompt));
            assert_int_equal(kv_seq_commit(&r->seq, kv, n, errbuf,
                                           sizeof(errbuf)), 0);
            r->pos += n;
        } else {
            assert_int_equal(kv_seq_reserve_decode(&r->seq, kv, pool, 1,
                                                   errbuf, sizeof(errbuf)),
                             0);
            assert_int_equal(tt_plan_deltas(&p, r, kv), 0);
            assert_non_null(tt_plan_entry(&p, r, GW_ENTRY_DECODE,
                                          &out[got - 1], 1, 1));
            r->pos += 1;
        }
        p.plan.n_entries = 1;
        struct gw_result res;
        run(w, &p, &res);
        if (res.n_tokens == 1)
            out[got++] = res.tokens[0].token;
    }
}

/* The next turn (turn2[0 .. n2), then `dec` decode tokens) of stored
 * request r adopted in `slot` afresh, as the router hands a stored
 * conversation to a new request: every page in deltas, the rows' lengths
 * in row_lens. Tokens and log-probabilities go to tok / lp. */
static void next_turn(struct gw_worker *w, struct kv_pool *pool,
                      struct tt_req *r, uint32_t slot, uint32_t free_slot,
                      uint64_t *step, const int32_t *turn2, int n2, int dec,
                      int32_t *tok, float *lp)
{
    const struct kv_layout *kv = &w->layout;
    static struct tt_plan p;
    uint32_t rows[64];
    int R = kv->n_layers * kv->n_groups;
    assert_true(R <= 64);
    for (int i = 0; i < R; i++)
        rows[i] = (uint32_t)r->seq.filled[i];
    memset(r->sent, 0, (size_t)R * sizeof(int32_t));
    r->slot = slot;
    r->fresh = 1;
    assert_int_equal(kv_seq_reserve_prompt(&r->seq, kv, pool, r->pos, n2,
                                           errbuf, sizeof(errbuf)), 0);
    tt_plan_reset(&p, ++*step);
    p.frees[0] = free_slot;
    p.plan.n_frees = 1;
    assert_int_equal(tt_plan_deltas(&p, r, kv), 0);
    struct gw_entry *e = tt_plan_entry(&p, r, GW_ENTRY_PREFILL, turn2, n2, 1);
    assert_non_null(e);
    e->row_lens = rows;
    e->n_row_lens = (size_t)R;
    e->sampling.n_top = 2;
    p.plan.n_entries = 1;
    assert_int_equal(kv_seq_commit(&r->seq, kv, n2, errbuf, sizeof(errbuf)),
                     0);
    r->pos += n2;
    struct gw_result res;
    run(w, &p, &res);
    assert_int_equal(res.n_tokens, 1);
    tok[0] = res.tokens[0].token;
    lp[0] = res.tokens[0].logprob;
    for (int k = 1; k <= dec; k++) {
        tt_plan_reset(&p, ++*step);
        assert_int_equal(kv_seq_reserve_decode(&r->seq, kv, pool, 1, errbuf,
                                               sizeof(errbuf)), 0);
        assert_int_equal(tt_plan_deltas(&p, r, kv), 0);
        e = tt_plan_entry(&p, r, GW_ENTRY_DECODE, &tok[k - 1], 1, 1);
        assert_non_null(e);
        p.plan.n_entries = 1;
        r->pos += 1;
        run(w, &p, &res);
        assert_int_equal(res.n_tokens, 1);
        tok[k] = res.tokens[0].token;
        lp[k] = res.tokens[0].logprob;
    }
}

/* Waits for the tier to finish everything, then takes the reports. */
static size_t settle(struct gw_worker *w, struct gw_tier_done *d, size_t cap)
{
    gw_host_tier_drain(&w->tier);
    struct pollfd pf = {.fd = gw_host_tier_fd(&w->tier), .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 0), 1); /* the eventfd says so */
    size_t n = gw_host_tier_take(&w->tier, d, cap);
    assert_int_equal(poll(&pf, 1, 0), 0); /* and is quiet once taken */
    return n;
}

enum { NP = 37, DEC = 3, N2 = 11, DEC2 = 6 };

/* Two requests X (slot 0) and Y (slot 2) with the same prompt (the same
 * KV in different pages), their first turns done, and the next turn both
 * will get; Y's pages then go to the host pool's ids (its device ids in
 * dev_old, still taken). */
struct pair {
    struct kv_pool pool, hpool;
    struct tt_req x, y;
    int32_t prompt[NP], turn2[N2];
    int32_t dev_old[POOL], host_ids[POOL];
    int64_t n;        /* Y's pages */
    uint64_t step;
};

static void pair_open(struct gw_worker *w, struct pair *p)
{
    memset(p, 0, sizeof(*p));
    const struct kv_layout *kv = &w->layout;
    assert_int_equal(kv_pool_init(&p->pool, POOL, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(kv_pool_init(&p->hpool, HOST, errbuf, sizeof(errbuf)),
                     0);
    for (int i = 0; i < NP; i++)
        p->prompt[i] = (int32_t)((i * 7919 + 13) % 5000);
    assert_int_equal(tt_req_init(&p->x, kv, 0, p->prompt, NP), 0);
    assert_int_equal(tt_req_init(&p->y, kv, 2, p->prompt, NP), 0);
    int32_t ox[DEC], oy[DEC];
    first_turn(w, &p->pool, &p->x, &p->step, DEC, ox);
    first_turn(w, &p->pool, &p->y, &p->step, DEC, oy);
    assert_memory_equal(ox, oy, sizeof(ox));
    /* The history the next turn re-sends: its last token is the last
     * sample, not yet fed. */
    p->turn2[0] = oy[DEC - 1];
    for (int i = 1; i < N2; i++)
        p->turn2[i] = (int32_t)((i * 104729 + 401) % 7000);
    p->n = p->y.seq.used_pages;
    assert_int_equal(kv_seq_move_pages(&p->y.seq, &p->pool, &p->hpool,
                                       p->dev_old, p->host_ids, errbuf,
                                       sizeof(errbuf)), 0);
}

/* The next turns of X (adopted in slot 1 from its own pages) and Y (in
 * slot 3 from the pages it holds now), into tx/lx and ty/ly. */
static void pair_next(struct gw_worker *w, struct pair *p, int32_t *tx,
                      float *lx, int32_t *ty, float *ly)
{
    next_turn(w, &p->pool, &p->x, 1, 0, &p->step, p->turn2, N2, DEC2, tx, lx);
    next_turn(w, &p->pool, &p->y, 3, 2, &p->step, p->turn2, N2, DEC2, ty, ly);
}

static void pair_close(struct pair *p)
{
    assert_int_equal(kv_pool_push(&p->pool, (int32_t)p->n, p->dev_old), 0);
    tt_req_free(&p->x, &p->pool);
    tt_req_free(&p->y, &p->pool);
    assert_int_equal(kv_pool_n_used(&p->pool), 0);
    kv_pool_free(&p->pool);
    kv_pool_free(&p->hpool);
}

/* X is adopted from its own pages; Y is offloaded, restored into other
 * pages and adopted from those. Their next turns must agree bit for bit. */
static void test_restore_bit_exact(void **state)
{
    (void)state;
    struct gw_worker w;
    worker_open(&w, HOST);
    static struct pair p;
    pair_open(&w, &p);
    const uint32_t *old = (const uint32_t *)p.dev_old;
    const uint32_t *host = (const uint32_t *)p.host_ids;
    size_t n = (size_t)p.n;
    assert_int_equal(gw_host_tier_submit(&w.tier, 1, 1, old, n, host, n), 0);
    struct gw_tier_done d[4];
    assert_int_equal(settle(&w, d, 4), 1);
    assert_true(d[0].id == 1 && d[0].ok);
    int32_t dev_new[POOL];
    assert_int_equal(kv_seq_move_pages(&p.y.seq, &p.hpool, &p.pool,
                                       p.host_ids, dev_new, errbuf,
                                       sizeof(errbuf)), 0);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            assert_int_not_equal(dev_new[i], p.dev_old[j]);
    assert_int_equal(gw_host_tier_submit(&w.tier, 2, 0,
                                         (const uint32_t *)dev_new, n, host,
                                         n), 0);
    assert_int_equal(settle(&w, d, 4), 1);
    assert_true(d[0].id == 2 && d[0].ok);
    assert_true(w.tier.n_copied == 2 * p.n);
    int32_t tx[DEC2 + 1], ty[DEC2 + 1];
    float lx[DEC2 + 1], ly[DEC2 + 1];
    pair_next(&w, &p, tx, lx, ty, ly);
    assert_memory_equal(tx, ty, sizeof(tx));
    assert_memory_equal(lx, ly, sizeof(lx));
    pair_close(&p);
    gw_worker_free(&w);
}

/* Without the copies Y's new pages are not its history: the same
 * adoption gives other outputs. This is what makes the test above able
 * to fail. */
static void test_restore_needed(void **state)
{
    (void)state;
    struct gw_worker w;
    worker_open(&w, HOST);
    static struct pair p;
    pair_open(&w, &p);
    assert_int_equal(kv_seq_move_pages(&p.y.seq, &p.hpool, &p.pool,
                                       p.host_ids, NULL, errbuf,
                                       sizeof(errbuf)), 0);
    int32_t tx[DEC2 + 1], ty[DEC2 + 1];
    float lx[DEC2 + 1], ly[DEC2 + 1];
    pair_next(&w, &p, tx, lx, ty, ly);
    assert_true(memcmp(lx, ly, sizeof(lx)) != 0);
    pair_close(&p);
    gw_worker_free(&w);
}

/* Refused ops fail alone and keep their place in the reports. */
static void test_refusals(void **state)
{
    (void)state;
    struct gw_worker w;
    worker_open(&w, HOST);
    uint32_t dev[2] = {3, 4}, host[2] = {0, 1}, bad_dev[1] = {POOL},
             bad_host[1] = {HOST};
    assert_int_equal(gw_host_tier_submit(&w.tier, 10, 1, dev, 2, host, 2), 0);
    assert_int_equal(gw_host_tier_submit(&w.tier, 11, 1, bad_dev, 1, host, 1),
                     0);
    assert_int_equal(gw_host_tier_submit(&w.tier, 12, 0, dev, 1, bad_host, 1),
                     0);
    assert_int_equal(gw_host_tier_submit(&w.tier, 13, 0, dev, 2, host, 1), 0);
    assert_int_equal(gw_host_tier_submit(&w.tier, 14, 0, dev, 2, host, 2), 0);
    struct gw_tier_done d[8];
    assert_int_equal(settle(&w, d, 8), 5);
    const int ok[5] = {1, 0, 0, 0, 1};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(d[i].id, 10 + (uint64_t)i);
        assert_int_equal(d[i].ok, ok[i]);
        assert_int_equal(d[i].error[0] != '\0', !ok[i]);
    }
    /* take() in pieces: the eventfd stays readable while some wait. */
    assert_int_equal(gw_host_tier_submit(&w.tier, 20, 1, dev, 2, host, 2), 0);
    assert_int_equal(gw_host_tier_submit(&w.tier, 21, 1, dev, 2, host, 2), 0);
    gw_host_tier_drain(&w.tier);
    assert_int_equal(gw_host_tier_take(&w.tier, d, 1), 1);
    struct pollfd pf = {.fd = gw_host_tier_fd(&w.tier), .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 0), 1);
    assert_int_equal(gw_host_tier_take(&w.tier, d, 8), 1);
    assert_int_equal(d[0].id, 21);
    gw_worker_free(&w);

    /* No tier: every op is refused, still reported. */
    worker_open(&w, 0);
    assert_int_equal(gw_host_tier_submit(&w.tier, 30, 1, dev, 2, host, 2), 0);
    assert_int_equal(gw_host_tier_take(&w.tier, d, 8), 1);
    assert_int_equal(d[0].ok, 0);
    assert_non_null(strstr(d[0].error, "no host tier"));
    gw_worker_free(&w);
}

/* A tier the host cannot hold is refused at start, naming the flag. */
static void test_too_big(void **state)
{
    (void)state;
    struct gw_worker w;
    struct gw_worker_opts o = {
        .model_dir = model_dir, .profile_path = profile_path,
        .heads_per_group = 1, .page_size = PAGE, .prefill_chunk = CHUNK,
        .kv_pages = POOL, .max_slots = 4, .rank = 0, .world_size = 1,
        .n_threads = 1, .kv_host_memory = (uint64_t)1 << 40};
    assert_int_equal(gw_worker_init(&w, &o, errbuf, sizeof(errbuf)),
                     TG_ENOMEM);
    assert_non_null(strstr(errbuf, "--kv-host-memory"));
    gw_worker_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restore_bit_exact),
        cmocka_unit_test(test_restore_needed),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_too_big),
    };
    return cmocka_run_group_tests(tests, make_model, remove_model);
}
