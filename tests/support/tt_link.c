/* tt_link.c — fake worker ranks and the rt_link fixture (see tt_link.h). */
#include "tests/support/tt_link.h"

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

#include <zmq.h>

#include "common/base/tg_err.h"

typedef Tangram__Worker__V1__WorkerMessage wmsg_t;

static char err[256];

/* ---- fake worker ------------------------------------------------------- */

uint64_t tt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void tt_fake_send(struct tt_fake *f, const wmsg_t *m)
{
    size_t n = tangram__worker__v1__worker_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    assert_non_null(buf);
    tangram__worker__v1__worker_message__pack(m, buf);
    assert_true(zmq_send(f->sock, buf, n, 0) == (int)n);
    free(buf);
}

void tt_fake_hello(struct tt_fake *f, const struct tt_hello_opts *o)
{
    Tangram__Worker__V1__LayoutSummary lay =
        TANGRAM__WORKER__V1__LAYOUT_SUMMARY__INIT;
    lay.num_layers = TT_LINK_L;
    lay.num_kv_heads = TT_LINK_G;
    lay.heads_per_group = 1;
    lay.groups_per_layer = TT_LINK_G;
    lay.page_size = 4;
    lay.head_dim = o && o->head_dim ? o->head_dim : 8;
    lay.vocab_size = TT_LINK_VOCAB;
    lay.per_head_lens = o && o->per_head;
    Tangram__Worker__V1__Hello h = TANGRAM__WORKER__V1__HELLO__INIT;
    h.version = 1;
    h.rank = o && o->hello_rank ? o->hello_rank : (uint32_t)f->rank;
    h.world_size = o && o->world_size ? o->world_size : 2;
    h.pid = (uint32_t)getpid();
    h.pages_total = o && o->pages_total ? o->pages_total : 64;
    h.layout = &lay;
    char id[64];
    snprintf(id, sizeof id, "fake-group-%d", (int)getpid());
    const char *cid = o && o->comm_id ? o->comm_id : id;
    if (h.rank == 0) {
        h.comm_id.data = (uint8_t *)cid;
        h.comm_id.len = strlen(cid);
    }
    h.comm_kind = (char *)"shm";
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HELLO;
    m.hello = &h;
    tt_fake_send(f, &m);
}

void tt_fake_open_id(struct tt_fake *f, void *zctx, const char *endpoint,
                     int rank, const char *id,
                     const struct tt_hello_opts *o)
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
    f->last_hb_ms = tt_now_ms();
    tt_fake_hello(f, o);
}

void tt_fake_open(struct tt_fake *f, void *zctx, const char *endpoint,
                  int rank, const struct tt_hello_opts *o)
{
    char id[32];
    snprintf(id, sizeof id, "rank-%d", rank);
    tt_fake_open_id(f, zctx, endpoint, rank, id, o);
}

void tt_fake_close(struct tt_fake *f)
{
    if (f->sock)
        zmq_close(f->sock);
    if (f->plan)
        tangram__worker__v1__worker_message__free_unpacked(f->plan, NULL);
    memset(f, 0, sizeof *f);
}

static void fake_heartbeat(struct tt_fake *f)
{
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = 1;
    hb.seq = ++f->hb_seq;
    hb.rank = f->rank;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    tt_fake_send(f, &m);
}

void tt_fake_grammar_ready(struct tt_fake *f, uint64_t id, int ok, int busy,
                           const char *error)
{
    Tangram__Worker__V1__GrammarReady gr =
        TANGRAM__WORKER__V1__GRAMMAR_READY__INIT;
    gr.id = id;
    gr.ok = ok != 0;
    gr.busy = busy != 0;
    gr.error = (char *)(error != NULL ? error : "");
    Tangram__Worker__V1__GrammarReady *grp = &gr;
    Tangram__Worker__V1__GrammarReport rep =
        TANGRAM__WORKER__V1__GRAMMAR_REPORT__INIT;
    rep.version = 1;
    rep.rank = (uint32_t)f->rank;
    rep.n_ready = 1;
    rep.ready = &grp;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_REPORT;
    m.grammar_report = &rep;
    tt_fake_send(f, &m);
}

void tt_fake_comm_ready(struct tt_fake *f, int ok, const char *error)
{
    Tangram__Worker__V1__CommReady cr = TANGRAM__WORKER__V1__COMM_READY__INIT;
    cr.version = 1;
    cr.rank = (uint32_t)f->rank;
    cr.ok = ok != 0;
    cr.error = (char *)error;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_READY;
    m.comm_ready = &cr;
    tt_fake_send(f, &m);
}

/* Answers `plan`: rank 0 samples token 100 + slot for every entry with
 * sample set, with two alternatives. */
void tt_fake_answer(struct tt_fake *f, const Tangram__Worker__V1__BatchPlan *p)
{
    Tangram__Worker__V1__StepResult sr = TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    sr.version = 1;
    sr.step_id = p->step_id + (f->answer == TT_ANSWER_WRONG_ID ? 5 : 0);
    sr.rank = (uint32_t)f->rank;
    sr.ok = f->answer != TT_ANSWER_FAIL;
    sr.error = (char *)(f->answer == TT_ANSWER_FAIL ? "boom" : "");
    sr.step_seconds = 0.01 * (f->rank + 1);
    Tangram__Worker__V1__SampledToken st[16], *stp[16];
    uint32_t top_ids[16][2];
    float top_lp[16][2];
    size_t n = 0;
    Tangram__Worker__V1__SlotError se = TANGRAM__WORKER__V1__SLOT_ERROR__INIT,
                                   *sep = &se;
    int want_se = f->rank == 0 && (f->answer == TT_ANSWER_SLOT_ERROR ||
                                   f->answer == TT_ANSWER_SLOT_TWICE);
    for (size_t i = 0; f->rank == 0 && i < p->n_entries && n < 16; i++) {
        if (!p->entries[i]->sample && f->answer != TT_ANSWER_EXTRA)
            continue;
        if (want_se && sr.n_slot_errors == 0) {
            se.slot = p->entries[i]->slot;
            se.error = (char *)"bad top_p";
            sr.n_slot_errors = 1;
            sr.slot_errors = &sep;
            if (f->answer == TT_ANSWER_SLOT_ERROR)
                continue;
        }
        tangram__worker__v1__sampled_token__init(&st[n]);
        st[n].slot = p->entries[i]->slot;
        st[n].token_id = 100 + p->entries[i]->slot;
        if (f->answer == TT_ANSWER_VOCAB)
            st[n].token_id = TT_LINK_VOCAB;
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
    Tangram__Worker__V1__SlotHeadLens hl[16], *hlp[16];
    uint32_t hv[16][TT_LINK_HEADS];
    if (f->answer == TT_ANSWER_HEADS || f->answer == TT_ANSWER_HEADS_COUNT ||
        f->answer == TT_ANSWER_HEADS_SLOT) {
        size_t nh = 0;
        for (size_t i = 0; i < p->n_entries && nh < 16; i++) {
            if (p->entries[i]->kind !=
                TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL)
                continue;
            tangram__worker__v1__slot_head_lens__init(&hl[nh]);
            uint32_t slot = p->entries[i]->slot;
            hl[nh].slot = f->answer == TT_ANSWER_HEADS_SLOT ? 9 : slot;
            for (int k = 0; k < TT_LINK_HEADS; k++)
                hv[nh][k] = 100u * (uint32_t)f->rank + slot * 10u + (uint32_t)k;
            hl[nh].n_head_lens = TT_LINK_HEADS -
                                 (f->answer == TT_ANSWER_HEADS_COUNT ? 1 : 0);
            hl[nh].head_lens = hv[nh];
            hlp[nh] = &hl[nh];
            nh++;
        }
        sr.n_head_lens = nh;
        sr.head_lens = hlp;
    }
    /* Prompt log-probabilities of the entries that asked (small chunks:
     * at most 8 values of at most 4 alternatives each). */
    Tangram__Worker__V1__PromptLogprobs pl[16], *plp[16];
    float plv[16][8], pltl[16][32];
    uint32_t plr[16][8], plti[16][32];
    size_t npl = 0;
    for (size_t i = 0;
         f->rank == 0 && f->answer >= TT_ANSWER_PLP &&
         f->answer != TT_ANSWER_PLP_NONE && i < p->n_entries && npl < 16;
         i++) {
        const Tangram__Worker__V1__PlanEntry *pe = p->entries[i];
        if (!pe->prompt_logprobs)
            continue;
        size_t nv = pe->n_token_ids - (pe->next_token_opt_case ? 0 : 1);
        size_t k = pe->prompt_top;
        if (f->answer == TT_ANSWER_PLP_SHORT)
            nv--;
        assert_true(nv <= 8 && k <= 4);
        tangram__worker__v1__prompt_logprobs__init(&pl[npl]);
        pl[npl].slot = pe->slot;
        pl[npl].first_pos = pe->start_pos + 1;
        for (size_t v = 0; v < nv; v++) {
            plv[npl][v] = -0.5f - (float)(pe->start_pos + 1 + v);
            plr[npl][v] = 1 + pe->start_pos + 1 + (uint32_t)v;
            for (size_t t = 0; t < k; t++) {
                plti[npl][v * k + t] = 10 + (uint32_t)t;
                pltl[npl][v * k + t] = -1.0f - (float)t;
            }
        }
        pl[npl].n_logprobs = pl[npl].n_ranks = nv;
        pl[npl].logprobs = plv[npl];
        pl[npl].ranks = plr[npl];
        pl[npl].n_top = (uint32_t)k;
        pl[npl].n_top_ids = pl[npl].n_top_logprobs = nv * k;
        pl[npl].top_ids = plti[npl];
        pl[npl].top_logprobs = pltl[npl];
        plp[npl] = &pl[npl];
        npl++;
    }
    sr.n_prompt_logprobs = npl;
    sr.prompt_logprobs = npl > 0 ? plp : NULL;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = 1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT;
    m.result = &sr;
    tt_fake_send(f, &m);
}

void tt_fake_service(struct tt_fake *f)
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
            if (!f->silent && f->answer != TT_ANSWER_NONE)
                tt_fake_answer(f, m->plan);
            if (f->plan)
                tangram__worker__v1__worker_message__free_unpacked(f->plan,
                                                                   NULL);
            f->plan = m;
            continue; /* kept */
        case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_SETUP: {
            const Tangram__Worker__V1__CommSetup *cs = m->comm_setup;
            f->n_setup++;
            snprintf(f->setup_id, sizeof f->setup_id, "%.*s",
                     (int)(cs->comm_id.len < 63 ? cs->comm_id.len : 63),
                     cs->comm_id.len ? (const char *)cs->comm_id.data : "");
            snprintf(f->setup_kind, sizeof f->setup_kind, "%s",
                     cs->comm_kind);
            f->setup_world = cs->world_size;
            if (!f->silent && f->comm != TT_COMM_NONE)
                tt_fake_comm_ready(f, f->comm == TT_COMM_OK,
                                   f->comm == TT_COMM_OK ? "" : "no group");
            break;
        }
        case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_COMMAND: {
            const Tangram__Worker__V1__GrammarCommand *gc = m->grammar_command;
            assert_int_equal(gc->version, 1);
            f->n_gcmd++;
            f->n_gprep = f->n_grel = 0;
            for (size_t i = 0; i < gc->n_prepare && i < 8; i++) {
                f->gprep_id[i] = gc->prepare[i]->id;
                snprintf(f->gprep_spec[i], sizeof f->gprep_spec[i], "%s",
                         gc->prepare[i]->spec);
                f->n_gprep++;
            }
            for (size_t i = 0; i < gc->n_release && i < 8; i++)
                f->grel[f->n_grel++] = gc->release[i];
            break;
        }
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
    uint64_t t = tt_now_ms();
    if (!f->silent && t - f->last_hb_ms >= 5) {
        fake_heartbeat(f);
        f->last_hb_ms = t;
    }
}

/* ---- router side ------------------------------------------------------- */

static void on_result(void *ud, const struct rt_link_result *r)
{
    struct tt_link_env *e = ud;
    e->n_result++;
    e->res_step = r->step_id;
    e->res_ok = r->ok;
    snprintf(e->res_error, sizeof e->res_error, "%s", r->error);
    e->res_n = r->n_entries;
    for (int32_t i = 0; i < r->n_entries && i < 16; i++) {
        e->res_tokens[i] = r->tokens[i];
        snprintf(e->res_entry_error[i], sizeof e->res_entry_error[i], "%s",
                 r->entries[i].error ? r->entries[i].error : "");
        assert_int_equal(r->entries[i].token, r->tokens[i]);
        const struct rt_link_plp *pl = r->entries[i].plp;
        e->res_plp_first[i] = pl != NULL ? pl->first_pos : -1;
        e->res_plp_n[i] = pl != NULL ? (int64_t)pl->n : 0;
        e->res_plp_lp_last[i] = pl != NULL && pl->n > 0
                                    ? pl->logprobs[pl->n - 1]
                                    : 0.0f;
        e->res_plp_top_last[i] = pl != NULL && pl->n > 0 && pl->n_top > 0
                                     ? pl->top_ids[pl->n * pl->n_top - 1]
                                     : 0;
    }
    e->res_top0 = r->n_entries ? r->entries[0].n_top : 0;
    e->res_top_id1 = e->res_top0 >= 2 ? r->entries[0].top_ids[1] : 0;
    e->res_seconds = r->step_seconds;
    e->res_n_heads = r->n_heads;
    e->res_heads_sum = 0;
    e->res_heads_rank_mask = 0;
    for (int32_t k = 0; k < r->n_heads; k++) {
        const struct rt_step_heads *h = &r->heads[k];
        assert_true(h->entry >= 0 && h->entry < r->n_entries);
        e->res_heads_rank_mask |= 1 << h->rank;
        for (int64_t v = 0; v < h->n; v++)
            e->res_heads_sum += h->head_lens[v];
    }
}

static void on_dead(void *ud, int rank)
{
    struct tt_link_env *e = ud;
    /* The step in flight is completed before on_dead. */
    assert_int_equal(rt_link_in_flight(&e->link), 0);
    e->n_dead++;
    e->dead_rank = rank;
    e->t_dead = tt_now_ms();
}

static void on_grammar(void *ud, const struct rt_link_gready *r, size_t n)
{
    struct tt_link_env *e = ud;
    for (size_t i = 0; i < n; i++, e->n_gready++) {
        if (e->n_gready >= 8)
            continue;
        e->gready[e->n_gready].id = r[i].id;
        e->gready[e->n_gready].ok = r[i].ok;
        e->gready[e->n_gready].busy = r[i].busy;
        snprintf(e->gready[e->n_gready].error,
                 sizeof e->gready[e->n_gready].error, "%s", r[i].error);
    }
}

static void on_ready(void *ud)
{
    struct tt_link_env *e = ud;
    assert_true(rt_link_ready(&e->link));
    e->n_ready++;
}

struct rt_link_config tt_link_cfg(struct tt_link_env *e, int T)
{
    struct rt_link_config c = {
        .world_size = T,
        .layout = {.num_layers = TT_LINK_L, .groups_per_layer = TT_LINK_G,
                   .heads_per_group = 1, .page_size = 4, .head_dim = 8,
                   .pages_total = 64, .vocab_size = TT_LINK_VOCAB},
        .heartbeat_ms = TT_LINK_HB_MS,
        .dead_ms = TT_LINK_DEAD_MS,
        .stall_ms = TT_LINK_STALL_MS,
        .linger_ms = 50,
        .on_result = on_result,
        .on_dead = on_dead,
        .on_ready = on_ready,
        .on_grammar = on_grammar,
        .ud = e,
    };
    return c;
}

struct tt_link_env *tt_link_env_new(int T, const char *endpoint)
{
    static int counter;
    struct tt_link_env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    assert_int_equal(uv_loop_init(&e->loop), 0);
    if (endpoint)
        snprintf(e->endpoint, sizeof e->endpoint, "%s", endpoint);
    else
        snprintf(e->endpoint, sizeof e->endpoint,
                 "ipc:///tmp/tg-link-test-%d-%d.sock", (int)getpid(),
                 ++counter);
    struct rt_link_config c = tt_link_cfg(e, T);
    c.endpoint = e->endpoint;
    assert_int_equal(rt_link_init(&e->link, &e->loop, &c, err, sizeof err),
                     0);
    /* Fakes connect to the bound endpoint (a tcp wildcard resolved). */
    snprintf(e->endpoint, sizeof e->endpoint, "%s", e->link.endpoint);
    e->zctx = zmq_ctx_new();
    assert_non_null(e->zctx);
    return e;
}

void tt_link_env_free(struct tt_link_env *e)
{
    for (int i = 0; i < 3; i++)
        tt_fake_close(&e->fk[i]);
    zmq_ctx_term(e->zctx);
    rt_link_close(&e->link);
    assert_int_equal(uv_run(&e->loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(e->link.n_handles, 0);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    free(e);
}

void tt_link_pump(struct tt_link_env *e, int ms)
{
    TT_PUMP_UNTIL(e, 0, ms);
}

struct tt_link_env *tt_link_env_ready(int T)
{
    struct tt_link_env *e = tt_link_env_new(T, NULL);
    for (int r = 0; r < T; r++)
        tt_fake_open(&e->fk[r], e->zctx, e->endpoint, r, NULL);
    assert_true(TT_PUMP_UNTIL(e, rt_link_ready(&e->link), 2000));
    assert_int_equal(e->n_ready, 1);
    return e;
}

/* ---- a hand-made step -------------------------------------------------- */

/* Entry 0: prefill, fresh slot 2 adopting stored KV at pos 4, last chunk;
 * entry 1: decode of slot 0; entry 2: first chunk of fresh slot 1.
 * Rank 0 gets deltas (e0, row 3: 11 12) and (e1, row 2: 13); rank 1 gets
 * (e0, row 1: 21) and (e2, row 0: 22 23). Slot 5 is freed. */
void tt_mini_step_make(struct tt_mini_step *m, uint64_t step_id)
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
    /* Request "req-<slot>", temperature slot / 2, top-k 40, two
     * alternatives, seed 1000 + slot, a 7-token client prompt; entry 0
     * adopts stored KV whose rows hold 4, 3, 2, 1 tokens on every rank. */
    for (int i = 0; i < 3; i++) {
        snprintf(m->rid[i], sizeof m->rid[i], "req-%d", m->ent[i].slot);
        m->smp[i] = (struct tg_sampling){
            .temperature = 0.5f * (float)m->ent[i].slot,
            .top_p = 1.0f,
            .top_k = 40,
            .repetition_penalty = 1.0f,
            .n_top = 2,
            .seed = 1000u + (uint64_t)m->ent[i].slot};
        m->ent[i].request_id = m->rid[i];
        m->ent[i].sampling = &m->smp[i];
        m->ent[i].num_prompt = 7;
        m->ent[i].row_lens_off = -1;
    }
    for (int r = 0; r < 3; r++)
        for (int w = 0; w < TT_LINK_L * TT_LINK_G; w++)
            m->row_lens[r * TT_LINK_L * TT_LINK_G + w] = 4 - w;
    m->ent[0].row_lens_off = 0;
    m->s.n_row_lens = 3 * TT_LINK_L * TT_LINK_G;
    m->s.row_lens = m->row_lens;
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

/* Checks the plan rank `r` received for tt_mini_step_make(step_id). */
void tt_mini_plan_check(const struct tt_fake *f, uint64_t step_id)
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
    assert_int_equal(e0->sampling->n_top, 2);
    assert_int_equal(e0->n_row_lens, TT_LINK_L * TT_LINK_G);
    for (int w = 0; w < TT_LINK_L * TT_LINK_G; w++)
        assert_int_equal(e0->row_lens[w], 4 - w);
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
int tt_link_round_trip(struct tt_link_env *e, uint64_t id)
{
    struct tt_mini_step m;
    tt_mini_step_make(&m, id);
    int before = e->n_result;
    assert_int_equal(rt_link_send_plan(&e->link, &m.s, err, sizeof err), 0);
    assert_true(TT_PUMP_UNTIL(e, e->n_result > before, 2000));
    assert_int_equal(e->n_result, before + 1);
    assert_int_equal(e->res_step, id);
    return e->res_ok;
}
