/* test_link.c — the router's ZeroMQ link to the workers (rt_link): fake
 * workers written here (DEALER sockets with routing id "rank-<r>",
 * serviced between non-blocking turns of the router's uv loop on the same
 * thread) check Hello and readiness, plan round trips with per-rank page
 * deltas and row lengths (hand-made steps and real scheduler steps),
 * propagation of a rank's error, out-of-order answers, dead workers found
 * by missed heartbeats while a step is in flight, restarts, refused
 * Hellos, garbage on the wire and Shutdown delivery. Timeouts are small
 * (heartbeat 15 ms, deadline 120 ms) so everything runs in a few seconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>
#include <zmq.h>

#include "common/kv_seq.h"
#include "common/tg_err.h"
#include "common/tg_log.h"
#include "router/rt_link.h"
#include "router/rt_sched.h"
#include "worker.pb-c.h"

typedef Tangram__Worker__V1__WorkerMessage wmsg_t;

#define HB_MS 15
#define DEAD_MS 120
#define L 2
#define G 2
#define VOCAB 1000

static char err[256];

/* ---- fake worker ------------------------------------------------------- */

enum answer {
    ANSWER_OK,
    ANSWER_FAIL,        /* ok = false, "boom" */
    ANSWER_WRONG_ID,    /* step id + 5 */
    ANSWER_NONE,        /* the test answers by hand */
    ANSWER_EXTRA,       /* rank 0: a token for every entry, sampled or not */
    ANSWER_VOCAB,       /* rank 0: token ids outside the vocabulary */
};

struct fake {
    void *sock;
    int rank;
    int silent;             /* no heartbeats, no answers */
    enum answer answer;
    int n_hb, n_plans, n_shutdown, last_drain;
    char last_reason[256];
    wmsg_t *plan;           /* last plan received (owned) */
    uint64_t hb_seq;
    uint64_t last_hb_ms;
};

struct hello_opts {
    uint32_t world_size, head_dim, pages_total, hello_rank;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void fake_send(struct fake *f, const wmsg_t *m)
{
    size_t n = tangram__worker__v1__worker_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    assert_non_null(buf);
    tangram__worker__v1__worker_message__pack(m, buf);
    assert_true(zmq_send(f->sock, buf, n, 0) == (int)n);
    free(buf);
}

static void fake_hello(struct fake *f, const struct hello_opts *o)
{
    Tangram__Worker__V1__LayoutSummary lay =
        TANGRAM__WORKER__V1__LAYOUT_SUMMARY__INIT;
    lay.num_layers = L;
    lay.num_kv_heads = G;
    lay.heads_per_group = 1;
    lay.groups_per_layer = G;
    lay.page_size = 4;
    lay.head_dim = o && o->head_dim ? o->head_dim : 8;
    lay.vocab_size = VOCAB;
    Tangram__Worker__V1__Hello h = TANGRAM__WORKER__V1__HELLO__INIT;
    h.version = 1;
    h.rank = o && o->hello_rank ? o->hello_rank : (uint32_t)f->rank;
    h.world_size = o && o->world_size ? o->world_size : 2;
    h.pid = (uint32_t)getpid();
    h.pages_total = o && o->pages_total ? o->pages_total : 64;
    h.layout = &lay;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HELLO;
    m.hello = &h;
    fake_send(f, &m);
}

static void fake_open_id(struct fake *f, void *zctx, const char *endpoint,
                         int rank, const char *id,
                         const struct hello_opts *o)
{
    memset(f, 0, sizeof *f);
    f->rank = rank;
    f->sock = zmq_socket(zctx, ZMQ_DEALER);
    assert_non_null(f->sock);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(f->sock, ZMQ_LINGER, &zero, sizeof zero),
                     0);
    assert_int_equal(zmq_setsockopt(f->sock, ZMQ_ROUTING_ID, id, strlen(id)),
                     0);
    assert_int_equal(zmq_connect(f->sock, endpoint), 0);
    f->last_hb_ms = now_ms();
    fake_hello(f, o);
}

static void fake_open(struct fake *f, void *zctx, const char *endpoint,
                      int rank, const struct hello_opts *o)
{
    char id[32];
    snprintf(id, sizeof id, "rank-%d", rank);
    fake_open_id(f, zctx, endpoint, rank, id, o);
}

static void fake_close(struct fake *f)
{
    if (f->sock)
        zmq_close(f->sock);
    if (f->plan)
        tangram__worker__v1__worker_message__free_unpacked(f->plan, NULL);
    memset(f, 0, sizeof *f);
}

static void fake_heartbeat(struct fake *f)
{
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = 1;
    hb.seq = ++f->hb_seq;
    hb.rank = f->rank;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    fake_send(f, &m);
}

/* Answers `plan`: rank 0 samples token 100 + slot for every entry with
 * sample set, with two alternatives. */
static void fake_answer(struct fake *f, const Tangram__Worker__V1__BatchPlan *p)
{
    Tangram__Worker__V1__StepResult sr = TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    sr.version = 1;
    sr.step_id = p->step_id + (f->answer == ANSWER_WRONG_ID ? 5 : 0);
    sr.rank = (uint32_t)f->rank;
    sr.ok = f->answer != ANSWER_FAIL;
    sr.error = (char *)(f->answer == ANSWER_FAIL ? "boom" : "");
    sr.step_seconds = 0.01 * (f->rank + 1);
    Tangram__Worker__V1__SampledToken st[16], *stp[16];
    uint32_t top_ids[16][2];
    float top_lp[16][2];
    size_t n = 0;
    for (size_t i = 0; f->rank == 0 && i < p->n_entries && n < 16; i++) {
        if (!p->entries[i]->sample && f->answer != ANSWER_EXTRA)
            continue;
        tangram__worker__v1__sampled_token__init(&st[n]);
        st[n].slot = p->entries[i]->slot;
        st[n].token_id = 100 + p->entries[i]->slot;
        if (f->answer == ANSWER_VOCAB)
            st[n].token_id = VOCAB;
        st[n].logprob = -0.25f;
        top_ids[n][0] = st[n].token_id;
        top_ids[n][1] = 7;
        top_lp[n][0] = -0.25f;
        top_lp[n][1] = -2.0f;
        st[n].n_top_ids = st[n].n_top_logprobs = 2;
        st[n].top_ids = top_ids[n];
        st[n].top_logprobs = top_lp[n];
        stp[n] = &st[n];
        n++;
    }
    sr.n_sampled = n;
    sr.sampled = stp;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT;
    m.result = &sr;
    fake_send(f, &m);
}

static void fake_service(struct fake *f)
{
    if (!f->sock)
        return;
    for (;;) {
        uint8_t buf[65536];
        int n = zmq_recv(f->sock, buf, sizeof buf, ZMQ_DONTWAIT);
        if (n < 0)
            break;
        assert_true(n <= (int)sizeof buf);
        wmsg_t *m =
            tangram__worker__v1__worker_message__unpack(NULL, (size_t)n, buf);
        assert_non_null(m);
        assert_int_equal(m->version, 1);
        switch (m->body_case) {
        case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT:
            assert_int_equal(m->heartbeat->rank, -1);
            f->n_hb++;
            break;
        case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN:
            f->n_plans++;
            if (!f->silent && f->answer != ANSWER_NONE)
                fake_answer(f, m->plan);
            if (f->plan)
                tangram__worker__v1__worker_message__free_unpacked(f->plan,
                                                                   NULL);
            f->plan = m;
            continue; /* kept */
        case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN:
            f->n_shutdown++;
            f->last_drain = m->shutdown->drain;
            snprintf(f->last_reason, sizeof f->last_reason, "%s",
                     m->shutdown->reason);
            break;
        default:
            fail_msg("unexpected message %d", (int)m->body_case);
        }
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
    }
    uint64_t t = now_ms();
    if (!f->silent && t - f->last_hb_ms >= 5) {
        fake_heartbeat(f);
        f->last_hb_ms = t;
    }
}

/* ---- router side ------------------------------------------------------- */

struct env {
    uv_loop_t loop;
    struct rt_link link;
    void *zctx;
    char endpoint[256];
    struct fake fk[3];
    int n_fakes;
    /* callback records */
    int n_result, n_ready, n_dead, dead_rank;
    uint64_t res_step;
    int res_ok;
    char res_error[512];
    int32_t res_tokens[16];
    int32_t res_n;
    size_t res_top0;
    uint32_t res_top_id1;
    double res_seconds;
    uint64_t t_dead;
};

static void on_result(void *ud, const struct rt_link_result *r)
{
    struct env *e = ud;
    e->n_result++;
    e->res_step = r->step_id;
    e->res_ok = r->ok;
    snprintf(e->res_error, sizeof e->res_error, "%s", r->error);
    e->res_n = r->n_entries;
    for (int32_t i = 0; i < r->n_entries && i < 16; i++) {
        e->res_tokens[i] = r->tokens[i];
        assert_int_equal(r->entries[i].token, r->tokens[i]);
    }
    e->res_top0 = r->n_entries ? r->entries[0].n_top : 0;
    e->res_top_id1 = e->res_top0 >= 2 ? r->entries[0].top_ids[1] : 0;
    e->res_seconds = r->step_seconds;
}

static void on_dead(void *ud, int rank)
{
    struct env *e = ud;
    /* The step in flight is completed before on_dead. */
    assert_int_equal(rt_link_in_flight(&e->link), 0);
    e->n_dead++;
    e->dead_rank = rank;
    e->t_dead = now_ms();
}

static void on_ready(void *ud)
{
    struct env *e = ud;
    assert_true(rt_link_ready(&e->link));
    e->n_ready++;
}

static struct rt_link_config base_cfg(struct env *e, int T)
{
    struct rt_link_config c = {
        .world_size = T,
        .layout = {.num_layers = L, .groups_per_layer = G,
                   .heads_per_group = 1, .page_size = 4, .head_dim = 8,
                   .pages_total = 64, .vocab_size = VOCAB},
        .heartbeat_ms = HB_MS,
        .dead_ms = DEAD_MS,
        .linger_ms = 50,
        .on_result = on_result,
        .on_dead = on_dead,
        .on_ready = on_ready,
        .ud = e,
    };
    return c;
}

static struct env *env_new(int T, const char *endpoint)
{
    static int counter;
    struct env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    assert_int_equal(uv_loop_init(&e->loop), 0);
    if (endpoint)
        snprintf(e->endpoint, sizeof e->endpoint, "%s", endpoint);
    else
        snprintf(e->endpoint, sizeof e->endpoint,
                 "ipc:///tmp/tg-link-test-%d-%d.sock", (int)getpid(),
                 ++counter);
    struct rt_link_config c = base_cfg(e, T);
    c.endpoint = e->endpoint;
    assert_int_equal(rt_link_init(&e->link, &e->loop, &c, err, sizeof err),
                     0);
    /* Fakes connect to the bound endpoint (a tcp wildcard resolved). */
    snprintf(e->endpoint, sizeof e->endpoint, "%s", e->link.endpoint);
    e->zctx = zmq_ctx_new();
    assert_non_null(e->zctx);
    return e;
}

static void env_free(struct env *e)
{
    for (int i = 0; i < 3; i++)
        fake_close(&e->fk[i]);
    zmq_ctx_term(e->zctx);
    rt_link_close(&e->link);
    assert_int_equal(uv_run(&e->loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(e->link.n_handles, 0);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    free(e);
}

/* Runs the loop and services the fakes until `cond` holds or `ms` pass;
 * evaluates to the final value of cond. */
#define PUMP_UNTIL(e, cond, ms)                                         \
    ({                                                                  \
        uint64_t t_end_ = now_ms() + (ms);                              \
        while (!(cond) && now_ms() < t_end_) {                          \
            uv_run(&(e)->loop, UV_RUN_NOWAIT);                          \
            for (int i_ = 0; i_ < 3; i_++)                              \
                fake_service(&(e)->fk[i_]);                             \
            usleep(500);                                                \
        }                                                               \
        (cond);                                                         \
    })

static void pump_for(struct env *e, int ms)
{
    PUMP_UNTIL(e, 0, ms);
}

static struct env *env_ready(int T)
{
    struct env *e = env_new(T, NULL);
    for (int r = 0; r < T; r++)
        fake_open(&e->fk[r], e->zctx, e->endpoint, r, NULL);
    assert_true(PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_int_equal(e->n_ready, 1);
    return e;
}

/* ---- a hand-made step -------------------------------------------------- */

struct mini_step {
    struct rt_step s;
    struct rt_step_entry ent[3];
    struct rt_step_delta del[4];
    int32_t ids[6];
    int32_t released[1];
    int32_t t0[3], t1[1], t2[2];
};

/* Entry 0: prefill, fresh slot 2 adopting stored KV at pos 4, last chunk;
 * entry 1: decode of slot 0; entry 2: first chunk of fresh slot 1.
 * Rank 0 gets deltas (e0, row 3: 11 12) and (e1, row 2: 13); rank 1 gets
 * (e0, row 1: 21) and (e2, row 0: 22 23). Slot 5 is freed. */
static void mini_step_make(struct mini_step *m, uint64_t step_id)
{
    memset(m, 0, sizeof *m);
    m->t0[0] = 5; m->t0[1] = 6; m->t0[2] = 7;
    m->t1[0] = 9;
    m->t2[0] = 3; m->t2[1] = 4;
    m->ent[0] = (struct rt_step_entry){.id = 1, .slot = 2, .fresh = 1,
        .kind = RT_STEP_PREFILL, .pos = 4, .n = 3, .tokens = m->t0,
        .sample = 1};
    m->ent[1] = (struct rt_step_entry){.id = 2, .slot = 0,
        .kind = RT_STEP_DECODE, .pos = 10, .n = 1, .tokens = m->t1,
        .sample = 1};
    m->ent[2] = (struct rt_step_entry){.id = 3, .slot = 1, .fresh = 1,
        .kind = RT_STEP_PREFILL, .pos = 0, .n = 2, .tokens = m->t2};
    const int32_t ids[6] = {11, 12, 21, 22, 23, 13};
    memcpy(m->ids, ids, sizeof ids);
    m->del[0] = (struct rt_step_delta){.entry = 0, .rank = 0, .row = 3,
        .first = 0, .n = 2, .off = 0};
    m->del[1] = (struct rt_step_delta){.entry = 0, .rank = 1, .row = 1,
        .first = 0, .n = 1, .off = 2};
    m->del[2] = (struct rt_step_delta){.entry = 2, .rank = 1, .row = 0,
        .first = 0, .n = 2, .off = 3};
    m->del[3] = (struct rt_step_delta){.entry = 1, .rank = 0, .row = 2,
        .first = 3, .n = 1, .off = 5};
    m->released[0] = 5;
    m->s.step_id = step_id;
    m->s.n_entries = 3;
    m->s.entries = m->ent;
    m->s.n_deltas = 4;
    m->s.deltas = m->del;
    m->s.n_ids = 6;
    m->s.delta_ids = m->ids;
    m->s.n_released = 1;
    m->s.released = m->released;
}

static const uint32_t adopted_rows[L * G] = {4, 3, 2, 1};

static int entry_cb(void *ud, const struct rt_step_entry *e,
                    struct rt_link_entry_info *out, char *errbuf,
                    size_t errlen)
{
    (void)ud;
    (void)errbuf;
    (void)errlen;
    static char ids[8][16];
    assert_float_equal(out->top_p, 1.0f, 0);
    snprintf(ids[e->slot & 7], sizeof ids[0], "req-%d", e->slot);
    out->request_id = ids[e->slot & 7];
    out->temperature = 0.5f * (float)e->slot;
    out->top_k = 40;
    out->logprobs = 2;
    out->seed = 1000u + (uint64_t)e->slot;
    out->num_prompt_tokens = 7;
    if (e->fresh && e->pos > 0) {
        out->row_lens = adopted_rows;
        out->n_row_lens = L * G;
    }
    return 0;
}

static int failing_cb(void *ud, const struct rt_step_entry *e,
                      struct rt_link_entry_info *out, char *errbuf,
                      size_t errlen)
{
    (void)ud;
    (void)e;
    (void)out;
    return tg_err_set(errbuf, errlen, TG_EINVAL, "no such request");
}

/* Checks the plan rank `r` received for mini_step_make(step_id). */
static void check_mini_plan(const struct fake *f, uint64_t step_id)
{
    assert_non_null(f->plan);
    const Tangram__Worker__V1__BatchPlan *p = f->plan->plan;
    assert_int_equal(p->version, 1);
    assert_int_equal(p->step_id, step_id);
    assert_int_equal(p->n_entries, 3);
    const Tangram__Worker__V1__PlanEntry *e0 = p->entries[0], *e1 =
        p->entries[1], *e2 = p->entries[2];
    assert_int_equal(e0->slot, 2);
    assert_string_equal(e0->request_id, "req-2");
    assert_int_equal(e0->kind,
                     TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL);
    assert_int_equal(e0->n_token_ids, 3);
    assert_int_equal(e0->token_ids[2], 7);
    assert_int_equal(e0->start_pos, 4);
    assert_true(e0->sample && e0->last_chunk && e0->fresh);
    assert_int_equal(e0->seed, 1002);
    assert_int_equal(e0->num_prompt_tokens, 7);
    assert_non_null(e0->sampling);
    assert_float_equal(e0->sampling->temperature, 1.0f, 0);
    assert_float_equal(e0->sampling->top_p, 1.0f, 0);
    assert_float_equal(e0->sampling->repetition_penalty, 1.0f, 0);
    assert_int_equal(e0->sampling->top_k, 40);
    assert_int_equal(e0->sampling->logprobs, 2);
    assert_int_equal(e0->n_row_lens, L * G);
    assert_memory_equal(e0->row_lens, adopted_rows, sizeof adopted_rows);
    assert_int_equal(e1->kind,
                     TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE);
    assert_true(e1->sample && !e1->last_chunk && !e1->fresh);
    assert_int_equal(e1->start_pos, 10);
    assert_int_equal(e1->token_ids[0], 9);
    assert_int_equal(e1->n_row_lens, 0);
    assert_true(!e2->sample && !e2->last_chunk && e2->fresh);
    assert_int_equal(e2->n_row_lens, 0); /* fresh at pos 0 adopts nothing */
    assert_int_equal(p->n_frees, 1);
    assert_int_equal(p->frees[0], 5);
    assert_int_equal(p->n_page_deltas, 2);
    const Tangram__Worker__V1__PageDelta *a = p->page_deltas[0], *b =
        p->page_deltas[1];
    assert_int_equal(a->truncate_to_opt_case,
                     TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT__NOT_SET);
    if (f->rank == 0) {
        /* row 3 = layer 1 group 1 of slot 2; row 2 = layer 1 group 0 */
        assert_int_equal(a->slot, 2);
        assert_int_equal(a->layer, 1);
        assert_int_equal(a->group, 1);
        assert_int_equal(a->n_page_ids, 2);
        assert_int_equal(a->page_ids[0], 11);
        assert_int_equal(a->page_ids[1], 12);
        assert_int_equal(b->slot, 0);
        assert_int_equal(b->layer, 1);
        assert_int_equal(b->group, 0);
        assert_int_equal(b->n_page_ids, 1);
        assert_int_equal(b->page_ids[0], 13);
    } else {
        assert_int_equal(a->slot, 2);
        assert_int_equal(a->layer, 0);
        assert_int_equal(a->group, 1);
        assert_int_equal(a->n_page_ids, 1);
        assert_int_equal(a->page_ids[0], 21);
        assert_int_equal(b->slot, 1);
        assert_int_equal(b->layer, 0);
        assert_int_equal(b->group, 0);
        assert_int_equal(b->n_page_ids, 2);
        assert_int_equal(b->page_ids[1], 23);
    }
}

/* Sends mini step `id` and waits for its result; returns on_result's ok. */
static int round_trip(struct env *e, uint64_t id)
{
    struct mini_step m;
    mini_step_make(&m, id);
    int before = e->n_result;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), 0);
    assert_true(PUMP_UNTIL(e, e->n_result > before, 2000));
    assert_int_equal(e->n_result, before + 1);
    assert_int_equal(e->res_step, id);
    return e->res_ok;
}

/* ---- tests ------------------------------------------------------------- */

static void test_config_errors(void **state)
{
    (void)state;
    struct rt_link zero;
    memset(&zero, 0, sizeof zero);
    rt_link_close(&zero); /* safe on a zeroed link */
    assert_false(rt_link_ready(&zero));
    assert_int_equal(rt_link_shutdown(&zero, 0, NULL), TG_EINVAL);
    struct mini_step m;
    mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&zero, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EINVAL);

    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    struct env dummy = {0};
    struct rt_link link;
    struct rt_link_config c = base_cfg(&dummy, 0);
    c.endpoint = "ipc:///tmp/tg-link-never.sock";
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    assert_non_null(strstr(err, "world_size"));
    rt_link_close(&link); /* safe after a failed init */
    c = base_cfg(&dummy, 2);
    c.on_result = NULL;
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    c = base_cfg(&dummy, 2);
    c.endpoint = "inproc://x";
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    assert_non_null(strstr(err, "ipc://"));
    c = base_cfg(&dummy, 2);
    c.endpoint = "tcp://127.0.0.1:*";
    c.dead_ms = HB_MS;
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    c = base_cfg(&dummy, 2);
    c.layout.head_dim = 0;
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EINVAL);
    c = base_cfg(&dummy, 2);
    c.endpoint = "ipc:///nonexistent-dir-tg/x.sock";
    assert_int_equal(rt_link_init(&link, &loop, &c, err, sizeof err),
                     TG_EIO);
    assert_non_null(strstr(err, "bind"));
    rt_link_close(&link);

    char ep[256];
    assert_int_equal(rt_link_default_endpoint("/run/x", ep, sizeof ep, err,
                                              sizeof err), 0);
    assert_string_equal(ep, "ipc:///run/x/router.sock");
    assert_int_equal(rt_link_default_endpoint(NULL, ep, sizeof ep, err,
                                              sizeof err), 0);
    assert_string_equal(ep, "ipc:///run/tangram/router.sock");
    char longdir[200];
    memset(longdir, 'a', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = '\0';
    assert_int_equal(rt_link_default_endpoint(longdir, ep, sizeof ep, err,
                                              sizeof err), TG_ETOOBIG);
    assert_int_equal(rt_link_default_endpoint("/r", ep, 10, err, sizeof err),
                     TG_ETOOBIG);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_hello_ready(void **state)
{
    (void)state;
    struct env *e = env_new(2, NULL);
    assert_false(rt_link_ready(&e->link));
    struct mini_step m;
    mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EAGAIN);
    fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    assert_true(PUMP_UNTIL(e, rt_link_rank_alive(&e->link, 0), 2000));
    assert_false(rt_link_ready(&e->link));
    assert_int_equal(e->n_ready, 0);
    assert_int_equal(rt_link_min_pages(&e->link), 64);
    struct hello_opts big = {.pages_total = 80};
    fake_open(&e->fk[1], e->zctx, e->endpoint, 1, &big);
    assert_true(PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_int_equal(e->n_ready, 1);
    assert_int_equal(rt_link_min_pages(&e->link), 64);
    assert_false(rt_link_rank_alive(&e->link, 2));
    assert_false(rt_link_rank_alive(&e->link, -1));
    /* Heartbeats flow: the Hello ack plus several timer beats, and live
     * fakes are never declared dead. */
    pump_for(e, 3 * DEAD_MS);
    assert_true(e->fk[0].n_hb >= 5);
    assert_true(e->fk[1].n_hb >= 5);
    assert_int_equal(e->n_dead, 0);
    assert_true(rt_link_ready(&e->link));
    assert_int_equal(e->fk[0].n_shutdown + e->fk[1].n_shutdown, 0);
    /* Once the pools are sized, a smaller restarted worker is refused. */
    assert_int_equal(rt_link_require_pages(&e->link, 70), 0);
    assert_int_equal(rt_link_require_pages(&e->link, 10), 0); /* no lower */
    fake_close(&e->fk[0]);
    fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "pages_total 64, the router "
                                                 "counts 70"));
    assert_int_equal(e->n_dead, 1); /* the old incarnation ended */
    assert_false(rt_link_ready(&e->link));
    assert_int_equal(rt_link_min_pages(&e->link), 80);
    env_free(e);
}

static void test_plan_round_trip(void **state)
{
    (void)state;
    struct env *e = env_ready(2);
    struct mini_step m;
    mini_step_make(&m, 1);
    /* The callback's failure aborts the send: nothing leaves. */
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, failing_cb, NULL,
                                       err, sizeof err), TG_EINVAL);
    assert_string_equal(err, "no such request");
    assert_int_equal(rt_link_in_flight(&e->link), 0);
    /* Bad steps are refused up front. */
    m.del[1].row = L * G;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EINVAL);
    mini_step_make(&m, 1);
    m.ent[1].slot = 2;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EINVAL);
    mini_step_make(&m, 1);
    m.t1[0] = -1;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EINVAL);
    mini_step_make(&m, 1);
    m.s.n_ids = 5;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EINVAL);
    pump_for(e, 20);
    assert_int_equal(e->fk[0].n_plans + e->fk[1].n_plans, 0);

    /* Hold the answers to see the step in flight. */
    e->fk[0].answer = e->fk[1].answer = ANSWER_NONE;
    mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), 0);
    assert_int_equal(rt_link_in_flight(&e->link), 1);
    struct mini_step m2;
    mini_step_make(&m2, 2);
    assert_int_equal(rt_link_send_plan(&e->link, &m2.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EBUSY);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_plans && e->fk[1].n_plans, 2000));
    check_mini_plan(&e->fk[0], 1);
    check_mini_plan(&e->fk[1], 1);
    /* Rank 1 alone does not complete the step. */
    fake_answer(&e->fk[1], e->fk[1].plan->plan);
    pump_for(e, 30);
    assert_int_equal(e->n_result, 0);
    fake_answer(&e->fk[0], e->fk[0].plan->plan);
    assert_true(PUMP_UNTIL(e, e->n_result == 1, 2000));
    assert_true(e->res_ok);
    assert_string_equal(e->res_error, "");
    assert_int_equal(e->res_step, 1);
    assert_int_equal(e->res_n, 3);
    assert_int_equal(e->res_tokens[0], 102);
    assert_int_equal(e->res_tokens[1], 100);
    assert_int_equal(e->res_tokens[2], -1);
    assert_int_equal(e->res_top0, 2);
    assert_int_equal(e->res_top_id1, 7);
    assert_float_equal(e->res_seconds, 0.02, 1e-12);
    assert_int_equal(rt_link_in_flight(&e->link), 0);

    /* Step ids must grow. */
    mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EINVAL);
    /* Answered automatically from now on. */
    e->fk[0].answer = e->fk[1].answer = ANSWER_OK;
    assert_true(round_trip(e, 2));
    assert_true(round_trip(e, 7)); /* gaps in ids are fine */
    check_mini_plan(&e->fk[1], 7);
    assert_int_equal(e->n_dead, 0);
    assert_int_equal(e->link.n_results, 3);
    env_free(e);
}

static void test_rank_error(void **state)
{
    (void)state;
    struct env *e = env_ready(2);
    e->fk[1].answer = ANSWER_FAIL;
    assert_false(round_trip(e, 1));
    assert_non_null(strstr(e->res_error, "rank 1: boom"));
    assert_int_equal(e->res_tokens[0], -1); /* no tokens on failure */
    assert_int_equal(e->n_dead, 0);
    assert_true(rt_link_ready(&e->link));
    e->fk[1].answer = ANSWER_OK;
    assert_true(round_trip(e, 2));
    /* Rank 0's tokens must match the sampled entries one to one. */
    e->fk[0].answer = ANSWER_EXTRA;
    assert_false(round_trip(e, 3));
    assert_non_null(strstr(e->res_error, "slot 1, which was not to be "
                                         "sampled"));
    assert_int_equal(e->res_tokens[0], -1);
    e->fk[0].answer = ANSWER_VOCAB;
    assert_false(round_trip(e, 4));
    assert_non_null(strstr(e->res_error, "outside the vocabulary"));
    assert_int_equal(e->n_dead, 0);
    e->fk[0].answer = ANSWER_OK;
    assert_true(round_trip(e, 5));
    env_free(e);
}

static void test_out_of_order(void **state)
{
    (void)state;
    struct env *e = env_ready(2);
    e->fk[1].answer = ANSWER_WRONG_ID;
    assert_false(round_trip(e, 1));
    assert_non_null(strstr(e->res_error, "rank 1"));
    assert_non_null(strstr(e->res_error, "answered step 6, expected step 1"));
    assert_int_equal(e->n_dead, 1);
    assert_int_equal(e->dead_rank, 1);
    assert_false(rt_link_ready(&e->link));
    assert_true(PUMP_UNTIL(e, e->fk[1].n_shutdown == 1, 2000));
    assert_false(e->fk[1].last_drain);
    /* Rank 0's answer to the abandoned step is dropped quietly, and an
     * unsolicited answer from rank 0 afterwards is itself out of order. */
    pump_for(e, 30);
    assert_int_equal(e->n_result, 1);
    assert_true(rt_link_rank_alive(&e->link, 0));
    fake_answer(&e->fk[0], e->fk[0].plan->plan);
    assert_true(PUMP_UNTIL(e, e->n_dead == 2, 2000));
    assert_int_equal(e->dead_rank, 0);
    assert_non_null(strstr(e->link.last_error, "owes none"));
    assert_int_equal(e->n_result, 1);
    env_free(e);
}

static void test_dead_and_restart(void **state)
{
    (void)state;
    struct env *e = env_ready(2);
    assert_true(round_trip(e, 1));
    /* Rank 1 goes silent with a step in flight. */
    e->fk[1].silent = 1;
    struct mini_step m;
    mini_step_make(&m, 2);
    uint64_t t0 = now_ms();
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), 0);
    assert_true(PUMP_UNTIL(e, e->n_dead == 1, 3000));
    uint64_t took = e->t_dead - t0;
    assert_true(took <= DEAD_MS + 3 * HB_MS + 200);
    assert_int_equal(e->dead_rank, 1);
    assert_int_equal(e->n_result, 2);
    assert_false(e->res_ok);
    assert_int_equal(e->res_step, 2);
    assert_non_null(strstr(e->res_error, "rank 1 died"));
    assert_false(rt_link_ready(&e->link));
    assert_true(rt_link_rank_alive(&e->link, 0));
    mini_step_make(&m, 3);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_EAGAIN);
    /* Its heartbeats resume: not registered any more, told to go once. */
    e->fk[1].silent = 0;
    pump_for(e, 60);
    assert_int_equal(e->n_dead, 1);
    assert_int_equal(e->fk[1].n_shutdown, 1);
    assert_false(rt_link_ready(&e->link));
    /* The supervisor's new worker says Hello: ready again. */
    fake_close(&e->fk[1]);
    fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    assert_true(PUMP_UNTIL(e, e->n_ready == 2, 2000));
    assert_true(rt_link_ready(&e->link));
    assert_true(round_trip(e, 3));
    check_mini_plan(&e->fk[1], 3);
    assert_int_equal(e->fk[1].n_shutdown, 0);
    assert_int_equal(e->link.n_deaths, 1);
    env_free(e);
}

static void test_hello_while_alive(void **state)
{
    (void)state;
    struct env *e = env_ready(2);
    /* A worker restarted faster than the deadline: its new Hello on the
     * same routing id ends the old incarnation (step failed, on_dead) and
     * the new one is accepted without being told to shut down. */
    e->fk[0].answer = e->fk[1].answer = ANSWER_NONE;
    struct mini_step m;
    mini_step_make(&m, 1);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), 0);
    assert_true(PUMP_UNTIL(e, e->fk[1].n_plans == 1, 2000));
    fake_hello(&e->fk[1], NULL);
    assert_true(PUMP_UNTIL(e, e->n_ready == 2, 2000));
    assert_int_equal(e->n_dead, 1);
    assert_int_equal(e->dead_rank, 1);
    assert_int_equal(e->n_result, 1);
    assert_false(e->res_ok);
    assert_non_null(strstr(e->res_error, "restarted"));
    pump_for(e, 30);
    assert_int_equal(e->fk[1].n_shutdown, 0);
    /* The new incarnation owes nothing for step 1; rank 0 still does, also
     * once step 2 is out, and its late answer to step 1 is dropped. */
    e->fk[1].answer = ANSWER_OK;
    mini_step_make(&m, 2);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), 0);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_plans == 2, 2000));
    Tangram__Worker__V1__BatchPlan old = TANGRAM__WORKER__V1__BATCH_PLAN__INIT;
    old.step_id = 1;
    fake_answer(&e->fk[0], &old);
    pump_for(e, 30);
    assert_int_equal(e->n_result, 1);
    fake_answer(&e->fk[0], e->fk[0].plan->plan);
    assert_true(PUMP_UNTIL(e, e->n_result == 2, 2000));
    assert_true(e->res_ok);
    assert_int_equal(e->res_step, 2);
    e->fk[0].answer = ANSWER_OK;
    assert_true(round_trip(e, 3));
    assert_int_equal(e->n_dead, 1);
    env_free(e);
}

static void test_layout_mismatch(void **state)
{
    (void)state;
    struct env *e = env_new(2, NULL);
    struct hello_opts bad_dim = {.head_dim = 16};
    fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &bad_dim);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "head_dim 16, expected 8"));
    assert_int_equal(e->link.n_refused, 1);
    assert_non_null(strstr(e->link.last_error, "rank 0 refused"));
    assert_false(rt_link_rank_alive(&e->link, 0));
    /* Its heartbeats get no second Shutdown. */
    pump_for(e, 40);
    assert_int_equal(e->fk[0].n_shutdown, 1);
    fake_close(&e->fk[0]);

    struct hello_opts few_pages = {.pages_total = 63};
    fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &few_pages);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "pages_total 63"));
    fake_close(&e->fk[0]);

    struct hello_opts world = {.world_size = 4};
    fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &world);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "world_size 4"));
    fake_close(&e->fk[0]);

    struct hello_opts other_rank = {.hello_rank = 1};
    fake_open(&e->fk[0], e->zctx, e->endpoint, 0, &other_rank);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_shutdown == 1, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "says rank 1"));
    fake_close(&e->fk[0]);

    /* A routing id outside the world, and one that is no rank at all. */
    fake_open_id(&e->fk[2], e->zctx, e->endpoint, 7, "rank-7", NULL);
    assert_true(PUMP_UNTIL(e, e->fk[2].n_shutdown == 1, 2000));
    assert_string_equal(e->fk[2].last_reason, "unknown rank");
    fake_close(&e->fk[2]);
    fake_open_id(&e->fk[2], e->zctx, e->endpoint, 0, "rank-00", NULL);
    assert_true(PUMP_UNTIL(e, e->fk[2].n_shutdown == 1, 2000));
    fake_close(&e->fk[2]);
    assert_int_equal(e->link.n_refused, 6);
    assert_int_equal(e->n_ready, 0);
    assert_int_equal(e->n_dead, 0);

    /* Correct workers are still accepted. */
    fake_open(&e->fk[0], e->zctx, e->endpoint, 0, NULL);
    fake_open(&e->fk[1], e->zctx, e->endpoint, 1, NULL);
    assert_true(PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_true(round_trip(e, 1));
    env_free(e);
}

static void test_garbage(void **state)
{
    (void)state;
    struct env *e = env_ready(2);
    const char junk[] = "\xff\xff\xff\xff not protobuf";
    assert_true(zmq_send(e->fk[1].sock, junk, sizeof junk, 0) > 0);
    assert_true(PUMP_UNTIL(e, e->n_dead == 1, 2000));
    assert_int_equal(e->dead_rank, 1);
    assert_non_null(strstr(e->link.last_error, "unparsable"));
    assert_true(PUMP_UNTIL(e, e->fk[1].n_shutdown == 1, 2000));
    /* Another protocol version kills too. */
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 2;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    fake_send(&e->fk[0], &m);
    assert_true(PUMP_UNTIL(e, e->n_dead == 2, 2000));
    assert_non_null(strstr(e->link.last_error, "version 2"));
    env_free(e);
}

static void test_shutdown(void **state)
{
    (void)state;
    struct env *e = env_new(2, "tcp://127.0.0.1:*");
    assert_non_null(strstr(e->endpoint, "tcp://127.0.0.1:"));
    assert_null(strchr(e->endpoint, '*'));
    for (int r = 0; r < 2; r++)
        fake_open(&e->fk[r], e->zctx, e->endpoint, r, NULL);
    assert_true(PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_true(round_trip(e, 1));
    assert_int_equal(rt_link_shutdown(&e->link, 1, "maintenance"), 0);
    assert_false(rt_link_ready(&e->link));
    assert_true(PUMP_UNTIL(e, e->fk[0].n_shutdown && e->fk[1].n_shutdown,
                           2000));
    for (int r = 0; r < 2; r++) {
        assert_int_equal(e->fk[r].n_shutdown, 1);
        assert_true(e->fk[r].last_drain);
        assert_string_equal(e->fk[r].last_reason, "maintenance");
    }
    struct mini_step m;
    mini_step_make(&m, 2);
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, NULL, entry_cb, NULL,
                                       err, sizeof err), TG_ECANCELED);
    /* Workers leaving on our Shutdown are not deaths. */
    e->fk[0].silent = e->fk[1].silent = 1;
    int hb0 = e->fk[0].n_hb;
    pump_for(e, 2 * DEAD_MS);
    assert_int_equal(e->n_dead, 0);
    assert_int_equal(e->fk[0].n_hb, hb0); /* no heartbeats after shutdown */
    /* A Hello after shutdown is refused. */
    fake_hello(&e->fk[0], NULL);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_shutdown == 2, 2000));
    assert_non_null(strstr(e->fk[0].last_reason, "shutting down"));
    env_free(e);
}

/* ---- with the real scheduler ------------------------------------------ */

struct sched_fix {
    struct kv_layout lay;
    struct rt_sched s;
    struct rt_step step;
};

static int sched_entry_cb(void *ud, const struct rt_step_entry *e,
                          struct rt_link_entry_info *out, char *errbuf,
                          size_t errlen)
{
    (void)errbuf;
    (void)errlen;
    struct sched_fix *f = ud;
    struct rt_sched_req_info info;
    assert_int_equal(rt_sched_req_info(&f->s, e->id, &info), 0);
    out->num_prompt_tokens = (uint32_t)info.prompt_tokens;
    out->seed = e->id;
    return 0;
}

/* Checks that rank r's plan carries exactly the scheduler's deltas of rank
 * r, and row lengths equal to the rank's filled counts for a fresh entry
 * at pos > 0. */
static void check_sched_plan(const struct fake *fk, struct sched_fix *f)
{
    const Tangram__Worker__V1__BatchPlan *p = fk->plan->plan;
    assert_int_equal(p->step_id, f->step.step_id);
    assert_int_equal(p->n_entries, (size_t)f->step.n_entries);
    size_t k = 0;
    for (int64_t i = 0; i < f->step.n_deltas; i++) {
        const struct rt_step_delta *d = &f->step.deltas[i];
        if (d->rank != fk->rank)
            continue;
        assert_true(k < p->n_page_deltas);
        const Tangram__Worker__V1__PageDelta *pd = p->page_deltas[k++];
        assert_int_equal(pd->slot, f->step.entries[d->entry].slot);
        assert_int_equal(pd->layer * G + pd->group, d->row);
        assert_int_equal(pd->n_page_ids, d->n);
        for (int32_t j = 0; j < d->n; j++)
            assert_int_equal(pd->page_ids[j], f->step.delta_ids[d->off + j]);
    }
    assert_int_equal(k, p->n_page_deltas);
    for (int32_t i = 0; i < f->step.n_entries; i++) {
        const struct rt_step_entry *se = &f->step.entries[i];
        const Tangram__Worker__V1__PlanEntry *pe = p->entries[i];
        assert_int_equal(pe->slot, se->slot);
        assert_int_equal(pe->start_pos, se->pos);
        if (se->fresh && se->pos > 0) {
            const struct kv_seq *q = rt_sched_req_seq(&f->s, se->id,
                                                      fk->rank);
            assert_non_null(q);
            assert_int_equal(pe->n_row_lens, L * G);
            for (int r = 0; r < L * G; r++)
                assert_int_equal(pe->row_lens[r], q->filled[r]);
        } else {
            assert_int_equal(pe->n_row_lens, 0);
        }
    }
}

static void sched_step(struct env *e, struct sched_fix *f, int expect_fresh)
{
    assert_int_equal(rt_sched_plan(&f->s, &f->step, err, sizeof err), 0);
    assert_true(f->step.n_entries >= 1);
    int fresh_adopt = 0;
    for (int32_t i = 0; i < f->step.n_entries; i++)
        fresh_adopt |= f->step.entries[i].fresh && f->step.entries[i].pos > 0;
    assert_int_equal(fresh_adopt, expect_fresh);
    int before = e->n_result, p0 = e->fk[0].n_plans, p1 = e->fk[1].n_plans;
    e->fk[0].answer = e->fk[1].answer = ANSWER_NONE;
    assert_int_equal(rt_link_send_plan(&e->link, &f->step, &f->s,
                                       sched_entry_cb, f, err, sizeof err),
                     0);
    assert_true(PUMP_UNTIL(e, e->fk[0].n_plans > p0 && e->fk[1].n_plans > p1,
                           2000));
    check_sched_plan(&e->fk[0], f);
    check_sched_plan(&e->fk[1], f);
    fake_answer(&e->fk[0], e->fk[0].plan->plan);
    fake_answer(&e->fk[1], e->fk[1].plan->plan);
    assert_true(PUMP_UNTIL(e, e->n_result > before, 2000));
    assert_true(e->res_ok);
    /* on_result's token array is what rt_sched_complete takes. */
    assert_int_equal(rt_sched_complete(&f->s, &f->step, e->res_tokens, NULL,
                                       err, sizeof err), 0);
    assert_int_equal(rt_sched_validate(&f->s, err, sizeof err), 0);
}

static void test_with_scheduler(void **state)
{
    (void)state;
    struct env *e = env_ready(2);
    struct sched_fix *f = calloc(1, sizeof *f);
    assert_non_null(f);
    const double budget[L * G] = {1.0, 0.5, 0.25, 0.75};
    struct kv_forced_rule rule = {.window = 2, .n_sink = 1};
    assert_int_equal(kv_layout_init(&f->lay, L, G, 1, 8, 4, 8, &rule, budget,
                                    err, sizeof err), 0);
    struct rt_sched_config sc = {.layout = &f->lay, .n_ranks = 2,
        .pages_per_rank = 64, .max_num_seqs = 4, .max_batched_tokens = 64,
        .max_queued = 8, .debug_track = 1};
    assert_int_equal(rt_sched_init(&f->s, &sc, err, sizeof err), 0);
    rt_step_init(&f->step);

    /* Turn 1: 12 tokens (two chunks), 2 generated tokens, stored. */
    int32_t prompt[24];
    for (int i = 0; i < 24; i++)
        prompt[i] = 10 + i;
    struct rt_sched_request rq = {.id = 1, .prompt = prompt, .n_prompt = 12,
        .max_tokens = 2, .session_id = "conv"};
    assert_int_equal(rt_sched_submit(&f->s, &rq, err, sizeof err), 0);
    sched_step(e, f, 0); /* chunk 1 */
    sched_step(e, f, 0); /* chunk 2, samples */
    sched_step(e, f, 0); /* decode, ends on max_tokens */
    /* Turn 2 re-sends the history (prompt + its tokens) plus new text: the
     * stored KV is adopted by a fresh slot at pos > 0. */
    int32_t turn2[24];
    memcpy(turn2, prompt, 12 * sizeof *turn2);
    turn2[12] = 100 + 0; /* the fakes sample 100 + slot; slot 0 */
    turn2[13] = 100 + 0;
    for (int i = 14; i < 20; i++)
        turn2[i] = 50 + i;
    struct rt_sched_request rq2 = {.id = 2, .prompt = turn2, .n_prompt = 20,
        .max_tokens = 1, .session_id = "conv"};
    assert_int_equal(rt_sched_submit(&f->s, &rq2, err, sizeof err), 0);
    sched_step(e, f, 1);
    struct rt_sched_stats st;
    rt_sched_get_stats(&f->s, &st);
    assert_true(st.cached_prompt_tokens > 0);

    rt_step_free(&f->step);
    rt_sched_free(&f->s);
    kv_layout_free(&f->lay);
    free(f);
    env_free(e);
}

int main(void)
{
    tg_log_init("router", -1, TG_LOG_ERR, TG_LOG_TEXT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_hello_ready),
        cmocka_unit_test(test_plan_round_trip),
        cmocka_unit_test(test_rank_error),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_dead_and_restart),
        cmocka_unit_test(test_hello_while_alive),
        cmocka_unit_test(test_layout_mismatch),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_shutdown),
        cmocka_unit_test(test_with_scheduler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
