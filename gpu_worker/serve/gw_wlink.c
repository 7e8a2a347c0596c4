/* gw_wlink.c — a worker's ZeroMQ link to the router (see gw_wlink.h). */
#if __has_include("worker.pb-c.h")
/* The generated protocol header lives in the build tree; a library target
 * without tg_proto's include directory compiles this file to nothing. */
#include "gpu_worker/serve/gw_wlink.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/base/tg_log.h"

void gw_wlink_close(struct gw_wlink *l)
{
    gw_beat_stop(&l->beat); /* before the context terminates */
    if (l->sock != NULL)
        zmq_close(l->sock);
    if (l->ctx != NULL)
        zmq_ctx_term(l->ctx);
    free(l->endpoint);
    free(l->buf);
    free(l->entries);
    free(l->deltas);
    free(l->tok);
    free(l->tok_ptrs);
    free(l->serr);
    free(l->serr_ptrs);
    free(l->heads);
    free(l->heads_ptrs);
    free(l->head_vals);
    free(l->plp);
    free(l->plp_ptrs);
    free(l->plp_u32);
    free(l->top_ids);
    memset(l, 0, sizeof(*l));
}

/* ---- protobuf <-> the plain step of gw_plan.h -------------------------- */

/* An entry's sampling as the worker's value: WorkerSampling's fields and
 * the entry's seed; greedy when the message has none. The bias arrays are
 * borrowed from the message, like the tokens; unequal lengths become
 * n_bias -1, which the plan check refuses (tg_sampling_check). */
static struct tg_sampling
decode_sampling(const Tangram__Worker__V1__PlanEntry *e)
{
    struct tg_sampling o = TG_SAMPLING_OFF;
    o.seed = e->seed;
    const Tangram__Worker__V1__WorkerSampling *ws = e->sampling;
    if (ws == NULL)
        return o;
    o.temperature = ws->temperature;
    o.top_p = ws->top_p;
    o.top_k = ws->top_k;
    o.min_p = ws->min_p;
    o.presence_penalty = ws->presence_penalty;
    o.frequency_penalty = ws->frequency_penalty;
    o.repetition_penalty = ws->repetition_penalty;
    o.n_top = ws->n_top > INT32_MAX ? INT32_MAX : (int32_t)ws->n_top;
    o.bias_ids = ws->bias_ids;
    o.bias_vals = ws->bias_vals;
    o.n_bias = ws->n_bias_ids != ws->n_bias_vals || ws->n_bias_ids > INT32_MAX
                   ? -1
                   : (int32_t)ws->n_bias_ids;
    return o;
}

int gw_wlink_decode_plan(struct gw_wlink *l,
                         const Tangram__Worker__V1__BatchPlan *bp,
                         struct gw_plan *out)
{
    memset(out, 0, sizeof(*out));
    if (tg_grow((void **)&l->entries, &l->cap_entries, bp->n_entries,
                sizeof(*l->entries)) != 0 ||
        tg_grow((void **)&l->deltas, &l->cap_deltas, bp->n_page_deltas,
                sizeof(*l->deltas)) != 0)
        return TG_ENOMEM;
    static const Tangram__Worker__V1__PlanEntry empty_entry =
        TANGRAM__WORKER__V1__PLAN_ENTRY__INIT;
    static const Tangram__Worker__V1__PageDelta empty_delta =
        TANGRAM__WORKER__V1__PAGE_DELTA__INIT;
    for (size_t i = 0; i < bp->n_entries; i++) {
        const Tangram__Worker__V1__PlanEntry *e =
            bp->entries[i] != NULL ? bp->entries[i] : &empty_entry;
        struct gw_entry *o = &l->entries[i];
        memset(o, 0, sizeof(*o));
        o->slot = e->slot;
        o->request_id = e->request_id != NULL ? e->request_id : "";
        o->kind = e->kind == TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL
                      ? GW_ENTRY_PREFILL
                  : e->kind == TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE
                      ? GW_ENTRY_DECODE
                  : e->kind == TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_FORK
                      ? GW_ENTRY_FORK
                      : (enum gw_entry_kind)0; /* refused by the worker */
        o->tokens = e->token_ids;
        o->n_tokens = e->n_token_ids;
        o->start_pos = e->start_pos;
        o->sampling = decode_sampling(e);
        o->sample = e->sample;
        o->last_chunk = e->last_chunk;
        o->num_prompt_tokens = e->num_prompt_tokens;
        o->fresh = e->fresh;
        o->row_lens = e->row_lens;
        o->n_row_lens = e->n_row_lens;
        o->head_lens = e->head_lens;
        o->n_head_lens = e->n_head_lens;
        o->fork_from = e->fork_from;
        o->grammar = e->grammar != NULL && e->grammar[0] != '\0' ? e->grammar
                                                                 : NULL;
        o->grammar_len = o->grammar != NULL ? strlen(o->grammar) : 0;
        o->grammar_tokens = e->grammar_tokens;
        o->n_grammar_tokens = e->n_grammar_tokens;
        o->grammar_pin = e->grammar_prepare;
        o->prompt_lp = e->prompt_logprobs;
        o->prompt_top = e->prompt_top > INT32_MAX ? INT32_MAX
                                                  : (int32_t)e->prompt_top;
        o->lp_next =
            e->next_token_opt_case ==
                    TANGRAM__WORKER__V1__PLAN_ENTRY__NEXT_TOKEN_OPT_NEXT_TOKEN
                ? (e->next_token > INT32_MAX ? INT32_MAX
                                             : (int32_t)e->next_token)
                : -1;
    }
    for (size_t i = 0; i < bp->n_page_deltas; i++) {
        const Tangram__Worker__V1__PageDelta *d =
            bp->page_deltas[i] != NULL ? bp->page_deltas[i] : &empty_delta;
        l->deltas[i] = (struct gw_delta){
            .slot = d->slot, .layer = d->layer, .group = d->group,
            .page_ids = d->page_ids, .n_page_ids = d->n_page_ids,
            .has_truncate =
                d->truncate_to_opt_case ==
                TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT_TRUNCATE_TO,
            .truncate_to = d->truncate_to};
    }
    out->version = bp->version;
    out->step_id = bp->step_id;
    out->entries = l->entries;
    out->n_entries = bp->n_entries;
    out->deltas = l->deltas;
    out->n_deltas = bp->n_page_deltas;
    out->frees = bp->frees;
    out->n_frees = bp->n_frees;
    return 0;
}

int gw_wlink_encode_result(struct gw_wlink *l, const struct gw_result *r,
                           Tangram__Worker__V1__StepResult *out)
{
    Tangram__Worker__V1__StepResult init =
        TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    *out = init;
    size_t K = GW_WORKER_MAX_LOGPROBS, cap = l->cap_tok, scap = l->cap_serr;
    size_t hcap = l->cap_heads, hbuf = 0;
    for (size_t i = 0; i < r->n_head_lens; i++)
        hbuf += r->head_lens[i].n;
    if (tg_grow((void **)&l->heads, &l->cap_heads, r->n_head_lens,
                sizeof(*l->heads)) ||
        tg_grow((void **)&l->heads_ptrs, &hcap, r->n_head_lens,
                sizeof(*l->heads_ptrs)) ||
        tg_grow((void **)&l->head_vals, &l->cap_head_vals, hbuf,
                sizeof(*l->head_vals)) ||
        tg_grow((void **)&l->tok, &l->cap_tok, r->n_tokens, sizeof(*l->tok)) ||
        tg_grow((void **)&l->tok_ptrs, &cap, r->n_tokens,
                sizeof(*l->tok_ptrs)) ||
        tg_grow((void **)&l->serr, &l->cap_serr, r->n_slot_errors,
                sizeof(*l->serr)) ||
        tg_grow((void **)&l->serr_ptrs, &scap, r->n_slot_errors,
                sizeof(*l->serr_ptrs)))
        return TG_ENOMEM;
    size_t tcap = l->top_ids != NULL ? l->cap_tok * K : 0;
    if (r->n_tokens * K > tcap) {
        uint32_t *t = realloc(l->top_ids, l->cap_tok * K * sizeof(uint32_t));
        if (t == NULL)
            return TG_ENOMEM;
        l->top_ids = t;
    }
    for (size_t i = 0; i < r->n_tokens; i++) {
        const struct gw_token *t = &r->tokens[i];
        Tangram__Worker__V1__SampledToken *o = &l->tok[i];
        tangram__worker__v1__sampled_token__init(o);
        o->slot = t->slot;
        o->token_id = (uint32_t)t->token;
        o->logprob = t->logprob;
        uint32_t *ids = l->top_ids + i * K;
        for (int k = 0; k < t->n_top; k++)
            ids[k] = (uint32_t)t->top_ids[k];
        o->n_top_ids = o->n_top_logprobs = (size_t)t->n_top;
        o->top_ids = t->n_top > 0 ? ids : NULL;
        o->top_logprobs = t->n_top > 0 ? (float *)t->top_lps : NULL;
        l->tok_ptrs[i] = o;
    }
    for (size_t i = 0; i < r->n_slot_errors; i++) {
        tangram__worker__v1__slot_error__init(&l->serr[i]);
        l->serr[i].slot = r->slot_errors[i].slot;
        l->serr[i].error = (char *)r->slot_errors[i].error;
        l->serr_ptrs[i] = &l->serr[i];
    }
    uint32_t *hv = l->head_vals;
    for (size_t i = 0; i < r->n_head_lens; i++) {
        const struct gw_head_lens *h = &r->head_lens[i];
        Tangram__Worker__V1__SlotHeadLens *o = &l->heads[i];
        tangram__worker__v1__slot_head_lens__init(o);
        o->slot = h->slot;
        for (size_t k = 0; k < h->n; k++) /* lengths are >= 0 */
            hv[k] = (uint32_t)h->lens[k];
        o->n_head_lens = h->n;
        o->head_lens = h->n > 0 ? hv : NULL;
        hv += h->n;
        l->heads_ptrs[i] = o;
    }
    out->n_head_lens = r->n_head_lens;
    out->head_lens = r->n_head_lens > 0 ? l->heads_ptrs : NULL;
    if (gw_wlink__encode_plps(l, r, out) != 0)
        return TG_ENOMEM;
    out->version = GW_PROTOCOL_VERSION;
    out->step_id = r->step_id;
    out->rank = (uint32_t)r->rank;
    out->ok = r->ok;
    out->error = (char *)(r->error != NULL ? r->error : "");
    out->n_sampled = r->n_tokens;
    out->sampled = r->n_tokens > 0 ? l->tok_ptrs : NULL;
    out->n_slot_errors = r->n_slot_errors;
    out->slot_errors = r->n_slot_errors > 0 ? l->serr_ptrs : NULL;
    out->step_seconds = r->step_seconds;
    return 0;
}

int gw_wlink_open(struct gw_wlink *l, const char *endpoint, int rank,
                  char *err, size_t errlen)
{
    memset(l, 0, sizeof(*l));
    l->rank = rank;
    for (int i = 0; i < GW_WLINK_EXTRA_FDS; i++)
        l->extra_fd[i] = -1;
    gw_progress_init(&l->progress);
    int rc;
    l->endpoint = strdup(endpoint != NULL ? endpoint : "");
    if (l->endpoint == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    l->ctx = zmq_ctx_new();
    if (l->ctx == NULL) {
        rc = tg_err_set(err, errlen, TG_EIO, "zmq_ctx_new: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    l->sock = zmq_socket(l->ctx, ZMQ_DEALER);
    if (l->sock == NULL) {
        rc = tg_err_set(err, errlen, TG_EIO, "zmq_socket: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    char id[32];
    int n = snprintf(id, sizeof(id), "rank-%d", rank);
    int linger = 0;
    if (zmq_setsockopt(l->sock, ZMQ_ROUTING_ID, id, (size_t)n) != 0 ||
        zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "zmq_setsockopt: %s",
                        zmq_strerror(errno));
        goto fail;
    }
    if (zmq_connect(l->sock, endpoint) != 0) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "cannot connect to router endpoint '%s': %s "
                        "(expected ipc:///path or tcp://host:port)",
                        endpoint, zmq_strerror(errno));
        goto fail;
    }
    return 0;
fail:
    gw_wlink_close(l);
    return rc;
}

int gw_wlink_send(struct gw_wlink *l, GwWorkerMessage *m, char *err,
                  size_t errlen)
{
    m->version = GW_PROTOCOL_VERSION;
    size_t n = tangram__worker__v1__worker_message__get_packed_size(m);
    if (n > l->buf_cap) {
        uint8_t *b = realloc(l->buf, n);
        if (b == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM,
                              "out of memory for a %zu-byte message", n);
        l->buf = b;
        l->buf_cap = n;
    }
    tangram__worker__v1__worker_message__pack(m, l->buf);
    if (zmq_send(l->sock, l->buf, n, 0) != (int)n)
        return tg_err_set(err, errlen, TG_EIO, "zmq_send: %s",
                          zmq_strerror(errno));
    return 0;
}

void gw_wlink_msg_free(GwWorkerMessage *m)
{
    if (m != NULL)
        tangram__worker__v1__worker_message__free_unpacked(m, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int gw_wlink_recv(struct gw_wlink *l, int timeout_ms, GwWorkerMessage **out,
                  char *err, size_t errlen)
{
    *out = NULL;
    zmq_pollitem_t it[1 + GW_WLINK_EXTRA_FDS] = {
        {.socket = l->sock, .events = ZMQ_POLLIN}};
    int n_it = 1;
    for (int i = 0; i < GW_WLINK_EXTRA_FDS; i++)
        if (l->extra_fd[i] >= 0)
            it[n_it++] = (zmq_pollitem_t){
                .socket = NULL, .fd = l->extra_fd[i], .events = ZMQ_POLLIN};
    int r = zmq_poll(it, n_it, timeout_ms);
    if (r < 0 && errno == EINTR)
        return TG_EAGAIN; /* a signal: the caller checks its stop flag */
    if (r < 0)
        return tg_err_set(err, errlen, TG_EIO, "zmq_poll: %s",
                          zmq_strerror(errno));
    if (r == 0 || !(it[0].revents & ZMQ_POLLIN))
        return TG_EAGAIN; /* nothing, or only the extra fd */
    /* Keep the last frame of a multipart message: the payload. */
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    for (;;) {
        if (zmq_msg_recv(&msg, l->sock, 0) < 0) {
            int e = errno;
            zmq_msg_close(&msg);
            return tg_err_set(err, errlen, TG_EIO, "zmq_msg_recv: %s",
                              zmq_strerror(e));
        }
        if (!zmq_msg_more(&msg))
            break;
    }
    l->rx_s = now_s();
    size_t n = zmq_msg_size(&msg);
    *out = tangram__worker__v1__worker_message__unpack(
        NULL, n, (const uint8_t *)zmq_msg_data(&msg));
    zmq_msg_close(&msg);
    if (*out == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "a %zu-byte message is not a WorkerMessage", n);
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int send_heartbeat(struct gw_wlink *l, char *err, size_t errlen)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    Tangram__Worker__V1__Heartbeat hb = TANGRAM__WORKER__V1__HEARTBEAT__INIT;
    hb.version = GW_PROTOCOL_VERSION;
    hb.seq = ++l->hb_seq;
    hb.time_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    hb.rank = l->rank;
    hb.pid = (uint32_t)getpid();
    hb.step_id = 0; /* the main thread beats between steps only */
    int64_t stalled = gw_progress_stalled_ms(&l->progress, now_ms());
    hb.stalled_ms = stalled > UINT32_MAX ? UINT32_MAX : (uint32_t)stalled;
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    return gw_wlink_send(l, &m, err, errlen);
}

static int send_result(struct gw_wlink *l,
                       Tangram__Worker__V1__StepResult *res, char *err,
                       size_t errlen)
{
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_RESULT;
    m.result = res;
    return gw_wlink_send(l, &m, err, errlen);
}

/* Answers a plan whose envelope or body has the wrong version. */
static int reject_plan(struct gw_wlink *l,
                       const Tangram__Worker__V1__BatchPlan *p,
                       uint32_t version, char *err, size_t errlen)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "protocol version %u, this worker speaks %u",
             version, GW_PROTOCOL_VERSION);
    Tangram__Worker__V1__StepResult res =
        TANGRAM__WORKER__V1__STEP_RESULT__INIT;
    res.version = GW_PROTOCOL_VERSION;
    res.step_id = p->step_id;
    res.rank = (uint32_t)l->rank;
    res.ok = 0;
    res.error = msg;
    return send_result(l, &res, err, errlen);
}

/* Joins the group of a CommSetup and answers CommReady. Returns -1 to
 * keep serving, else the exit status. */
static int on_comm_setup(struct gw_wlink *l, struct gw_worker *w,
                         const Tangram__Worker__V1__CommSetup *setup)
{
    char why[512] = "", err[256];
    struct gw_comm_setup cs = {
        .version = setup->version, .world_size = setup->world_size,
        .kind = setup->comm_kind != NULL ? setup->comm_kind : "",
        .id = setup->comm_id.data, .id_len = setup->comm_id.len};
    int rc = gw_worker_comm_join(w, &cs, why, sizeof(why));
    Tangram__Worker__V1__CommReady cr = TANGRAM__WORKER__V1__COMM_READY__INIT;
    cr.version = GW_PROTOCOL_VERSION;
    cr.rank = (uint32_t)l->rank;
    cr.ok = rc == 0;
    cr.error = rc == 0 ? (char *)"" : why;
    /* A shared-memory group is named by text; an NCCL id is bytes. */
    int text = strcmp(cs.kind, "shm") == 0 && cs.id != NULL &&
               cs.id_len < 128 && memchr(cs.id, '\0', cs.id_len) == NULL;
    if (rc == 0 && w->world_size > 1 && text)
        log_info("joined the communicator group (%.*s, world size %d)",
                 (int)cs.id_len, (const char *)cs.id, w->world_size);
    else if (rc == 0)
        log_info("joined the communicator group (%s, world size %d)",
                 w->world_size > 1 ? cs.kind : "one rank", w->world_size);
    else
        log_err("cannot join the communicator group: %s", why);
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_READY;
    m.comm_ready = &cr;
    if (gw_wlink_send(l, &m, err, sizeof(err)) != 0) {
        log_err("%s", err);
        return GW_WLINK_EXIT_ERROR;
    }
    /* A rank that cannot join is useless to its group: leave, so the
     * supervisor restarts the group (the router saw the reason). */
    return rc == 0 ? -1 : GW_WLINK_EXIT_COMM;
}

/* Handles one message from the router. Returns -1 to keep serving, else
 * the exit status. */
static int handle(struct gw_wlink *l, struct gw_worker *w, GwWorkerMessage *m)
{
    char err[256];
    int rc;
    const Tangram__Worker__V1__BatchPlan *plan =
        m->body_case == TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN ? m->plan
                                                                       : NULL;
    uint32_t version = m->version;
    if (version == GW_PROTOCOL_VERSION && plan != NULL)
        version = plan->version;
    if (version != GW_PROTOCOL_VERSION) {
        log_err("message with protocol version %u (body %d), this worker "
                "speaks %u", version, (int)m->body_case, GW_PROTOCOL_VERSION);
        if (plan == NULL)
            return GW_WLINK_EXIT_PROTOCOL;
        rc = reject_plan(l, plan, version, err, sizeof(err));
        if (rc != 0) {
            log_err("%s", err);
            return GW_WLINK_EXIT_ERROR;
        }
        return -1;
    }
    switch (m->body_case) {
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN: {
        struct gw_plan gp;
        struct gw_result gr;
        Tangram__Worker__V1__StepResult res;
        if (gw_wlink_decode_plan(l, plan, &gp) != 0) {
            log_err("step %llu: out of memory decoding the plan",
                    (unsigned long long)plan->step_id);
            return GW_WLINK_EXIT_ERROR;
        }
        gw_progress_step(&l->progress, plan->step_id);
        rc = gw_worker_step(w, &gp, &gr);
        gw_progress_step(&l->progress, 0);
        if (rc != 0)
            log_err("step %llu: %s", (unsigned long long)plan->step_id,
                    gr.error);
        else
            log_debug("step %llu: %zu entries, %zu sampled, %.3f ms",
                      (unsigned long long)plan->step_id, plan->n_entries,
                      gr.n_tokens, gr.step_seconds * 1e3);
        /* Copies that finished during the step are reported before its
         * result, so the router's next plan already sees them; so are
         * grammars that became ready meanwhile. */
        int ts = gw_wlink__tier_flush(l, w);
        if (ts < 0)
            ts = gw_wlink__grammar_flush(l, w);
        if (ts >= 0)
            return ts;
        if (gw_wlink_encode_result(l, &gr, &res) != 0) {
            log_err("step %llu: out of memory encoding the result",
                    (unsigned long long)plan->step_id);
            return GW_WLINK_EXIT_ERROR;
        }
        /* Host work of the step on this rank: from the plan's arrival
         * (before its unpacking) to the result encoded, less the
         * backend's calls. */
        res.host_seconds = now_s() - l->rx_s - gr.backend_seconds;
        if (send_result(l, &res, err, sizeof(err)) != 0) {
            log_err("%s", err);
            return GW_WLINK_EXIT_ERROR;
        }
        /* The next step's token masks while the router plans it. */
        gw_worker_after_step(w);
        return -1;
    }
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_SHUTDOWN:
        log_info("shutdown from the router (%s%s)",
                 m->shutdown->reason != NULL ? m->shutdown->reason : "",
                 m->shutdown->drain ? ", drain" : "");
        return GW_WLINK_EXIT_OK;
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HEARTBEAT:
        log_debug("router heartbeat %llu",
                  (unsigned long long)m->heartbeat->seq);
        return -1;
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_SETUP:
        return on_comm_setup(l, w, m->comm_setup);
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_TIER_COMMAND:
        return gw_wlink__tier_command(l, w, m->tier_command);
    case TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_COMMAND:
        return gw_wlink__grammar_command(l, w, m->grammar_command);
    default:
        log_warn("ignoring a message of body %d from the router",
                 (int)m->body_case);
        return -1;
    }
}

static int serve_loop(struct gw_wlink *l, struct gw_worker *w,
                      const struct gw_wlink_opts *o);

int gw_wlink_serve(struct gw_wlink *l, struct gw_worker *w,
                   const struct gw_wlink_opts *o)
{
    w->progress = &l->progress;
    int status = serve_loop(l, w, o);
    gw_beat_stop(&l->beat);
    w->progress = NULL;
    return status;
}

static int serve_loop(struct gw_wlink *l, struct gw_worker *w,
                      const struct gw_wlink_opts *o)
{
    char err[256];
    int hb = o->heartbeat_ms > 0 ? o->heartbeat_ms : 1000;
    int64_t timeout = o->router_timeout_ms > 0 ? o->router_timeout_ms
                                               : 10 * (int64_t)hb;
    if (o->router_timeout_ms <= 0 && timeout < GW_WLINK_ROUTER_TIMEOUT_MIN_MS)
        timeout = GW_WLINK_ROUTER_TIMEOUT_MIN_MS;
    struct gw_hello_info hi;
    gw_worker_hello(w, &hi);
    Tangram__Worker__V1__LayoutSummary lay =
        TANGRAM__WORKER__V1__LAYOUT_SUMMARY__INIT;
    lay.num_layers = (uint32_t)hi.num_layers;
    lay.num_kv_heads = (uint32_t)hi.num_kv_heads;
    lay.heads_per_group = (uint32_t)hi.heads_per_group;
    lay.groups_per_layer = (uint32_t)hi.groups_per_layer;
    lay.page_size = (uint32_t)hi.page_size;
    lay.head_dim = (uint32_t)hi.head_dim;
    lay.page_bytes = (uint64_t)hi.page_bytes;
    lay.profile = (char *)hi.profile;
    lay.backend = (char *)hi.backend;
    lay.model = (char *)hi.model;
    lay.max_model_len = (uint32_t)hi.max_model_len;
    lay.vocab_size = (uint32_t)hi.vocab_size;
    lay.per_head_lens = hi.per_head_lens != 0;
    Tangram__Worker__V1__Hello hello = TANGRAM__WORKER__V1__HELLO__INIT;
    hello.version = GW_PROTOCOL_VERSION;
    hello.rank = (uint32_t)hi.rank;
    hello.world_size = (uint32_t)hi.world_size;
    hello.pid = (uint32_t)getpid();
    hello.pages_total = (uint32_t)hi.pages_total;
    hello.host_pages_total = (uint32_t)hi.host_pages_total;
    hello.layout = &lay;
    hello.comm_kind = (char *)hi.comm_kind;
    hello.comm_id.data = (uint8_t *)hi.comm_id;
    hello.comm_id.len = hi.comm_id_len;
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_HELLO;
    m.hello = &hello;
    if (gw_wlink_send(l, &m, err, sizeof(err)) != 0) {
        log_err("%s", err);
        return GW_WLINK_EXIT_ERROR;
    }
    log_info("hello sent: %u pages of %llu bytes, %d slots, %s backend%s%.*s",
             hello.pages_total, (unsigned long long)lay.page_bytes,
             w->max_slots, hi.backend,
             hi.comm_id_len > 0 && hi.comm_id_len < 100 &&
                     hi.comm_kind[0] == 's'
                 ? ", comm group "
                 : "",
             hi.comm_id_len > 0 && hi.comm_id_len < 100 &&
                     hi.comm_kind[0] == 's'
                 ? (int)hi.comm_id_len
                 : 0,
             hi.comm_id != NULL ? (const char *)hi.comm_id : "");
    /* From here on the router knows this process: beats flow whatever the
     * main thread does. */
    gw_progress_init(&l->progress);
    if (gw_beat_start(&l->beat, l->ctx, l->endpoint, l->rank, hb,
                      &l->progress, err, sizeof(err)) != 0) {
        log_err("%s", err);
        return GW_WLINK_EXIT_ERROR;
    }
    int64_t last_rx = now_ms(), next_hb = last_rx + hb;
    int64_t setup_ms = o->comm_setup_timeout_ms > 0
                           ? o->comm_setup_timeout_ms
                           : GW_WLINK_SETUP_TIMEOUT_MS_DEFAULT;
    int64_t setup_by = last_rx + setup_ms;
    l->extra_fd[0] = gw_host_tier_fd(&w->tier);
    l->extra_fd[1] = gw_grammar_fd(&w->gram); /* -1 but on rank 0 */
    /* Silence counts once the router has spoken: before that it may still
     * be starting (loading its tokenizer), which the CommSetup deadline
     * bounds. */
    int heard = 0;
    for (;;) {
        if (o->stop != NULL && *o->stop) {
            log_info("stop requested");
            return GW_WLINK_EXIT_OK;
        }
        int ts = gw_wlink__tier_flush(l, w);
        if (ts < 0)
            ts = gw_wlink__grammar_flush(l, w);
        if (ts >= 0)
            return ts;
        gw_progress_mark(&l->progress);
        int64_t now = now_ms();
        if (!w->joined && now >= setup_by) {
            log_err("no CommSetup from the router within %lld ms of the "
                    "Hello (are all %d ranks up?); exiting",
                    (long long)setup_ms, w->world_size);
            return GW_WLINK_EXIT_COMM;
        }
        if (heard && now - last_rx >= timeout) {
            log_err("no message from the router for %lld ms; exiting",
                    (long long)(now - last_rx));
            return GW_WLINK_EXIT_TIMEOUT;
        }
        if (now >= next_hb) {
            if (send_heartbeat(l, err, sizeof(err)) != 0) {
                log_err("%s", err);
                return GW_WLINK_EXIT_ERROR;
            }
            next_hb = now + hb;
        }
        int64_t wait = next_hb - now;
        if (heard && last_rx + timeout - now < wait)
            wait = last_rx + timeout - now;
        if (!w->joined && setup_by - now < wait)
            wait = setup_by - now;
        if (wait < 0)
            wait = 0;
        GwWorkerMessage *in;
        int rc = gw_wlink_recv(l, (int)wait, &in, err, sizeof(err));
        if (rc == TG_EAGAIN)
            continue;
        if (rc == TG_EIO) {
            log_err("%s", err);
            return GW_WLINK_EXIT_ERROR;
        }
        last_rx = now_ms();
        heard = 1;
        if (rc == TG_EFORMAT) {
            log_err("unparsable message from the router: %s", err);
            return GW_WLINK_EXIT_PROTOCOL;
        }
        int status = handle(l, w, in);
        gw_wlink_msg_free(in);
        if (status >= 0)
            return status;
        /* The router's silence counts while we listen: whatever it sent
         * during a long step is waiting in the socket. */
        last_rx = now_ms();
    }
}

#endif
