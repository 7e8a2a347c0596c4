/* rt_api_grpc.c — the gRPC front end of the router: tangram.v1.Generation
 * (Generate, Tokenize, ModelInfo, Abort), grpc.health.v1.Health (Check,
 * Watch) and server reflection, over rt_grpc. Requests go through the same
 * core as HTTP (rt_server.c) and take the same limits (rt_openai.h).
 *
 * Authentication: with --api-key set, every call but the health service
 * needs "authorization: Bearer KEY"; it is checked from the headers
 * (rt_grpc admission), before any of the request body is read.
 *
 * Who owns a Generate request (for Abort and for the uniqueness of
 * request_id): with --api-key set, the key is the identity, and the daemon
 * has one key, so any caller presenting it owns every gRPC request. Without
 * a key, nobody is authenticated and the owner is the HTTP/2 connection
 * that started the request: Abort works from that connection only (a
 * grpcio channel keeps one connection, so a client aborting on the channel
 * it generates on is served). Requests of other owners are invisible:
 * Abort answers found=false and a reused request_id is accepted, exactly
 * as if they did not exist. Requests started over HTTP are not gRPC's to
 * abort.
 *
 * Conversations held by the server (GenerateRequest.previous_response_id
 * and store; rt_api_grpc_cont.c over rt_api_cont.h, which the Responses
 * API shares): a continuation is looked up in the caller's scope on the
 * loop and its prompt composed on the thread pool before its request is
 * created (a cancelled call cancels the job); a stored turn's final
 * message goes out once the turn is stored (with a database, committed).
 *
 * Prompts of Generate and Tokenize are tokenized on the thread pool
 * (rt_encode_job): the handler returns and the call goes on when the job
 * ends; a call cancelled meanwhile cancels the job.
 *
 * Loop thread only. */
#include "router/api/rt_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "router/api/rt_api_cont.h"
#include "router/api/rt_api_grpc_internal.h"
#include "router/net/rt_grpc_reflect.h"
#include "router/api/rt_openai_chat.h"
#include "tangram.pb-c.h"
#include "tg_api_descriptors.h"

/* Maps an error kind (rt_request.h) to a gRPC status code. */
static int grpc_status_of(enum rt_req_err kind)
{
    switch (kind) {
    case RT_REQ_ERR_INVALID:
    case RT_REQ_ERR_TOO_LARGE: return RT_GRPC_INVALID_ARGUMENT;
    case RT_REQ_ERR_UNAUTHENTICATED: return RT_GRPC_UNAUTHENTICATED;
    case RT_REQ_ERR_NOT_FOUND: return RT_GRPC_NOT_FOUND;
    case RT_REQ_ERR_BUSY: return RT_GRPC_RESOURCE_EXHAUSTED;
    case RT_REQ_ERR_UNAVAILABLE: return RT_GRPC_UNAVAILABLE;
    default:
        return RT_GRPC_INTERNAL;
    }
}

static int have_key(const struct rt_server *s)
{
    const char *key = rt_server_opts(s)->api_key;
    return key != NULL && key[0] != '\0';
}

/* rt_grpc admission: the API key, from the headers, before the body. */
static int admit(const struct rt_grpc_call *call, void *ud, char *msg,
                 size_t msglen)
{
    struct rt_server *s = ud;
    static const char health[] = "/grpc.health.v1.Health/";
    /* Probes (kubelet, load balancers) carry no key. */
    if (!have_key(s) || strncmp(call->path, health, sizeof(health) - 1) == 0)
        return RT_GRPC_OK;
    const char *key = rt_server_opts(s)->api_key;
    const char *h = rt_grpc_call_header(call, "authorization");
    if (h != NULL && strncasecmp(h, "Bearer ", 7) == 0) {
        /* Compare in time independent of where the strings differ, as the
         * HTTP front end does: strcmp would leak the matching prefix. */
        const char *got = h + 7;
        size_t a = strlen(got), b = strlen(key);
        unsigned diff = (unsigned)(a ^ b);
        for (size_t i = 0; i < a && i < b; i++)
            diff |= (unsigned)(got[i] ^ key[i]);
        if (diff == 0)
            return RT_GRPC_OK;
    }
    rt_metrics_counter_inc(rt_server_metrics(s)->grpc_unauthenticated_total);
    snprintf(msg, msglen,
             "missing or invalid API key (authorization: Bearer ...)");
    return RT_GRPC_UNAUTHENTICATED;
}

/* rt_grpc events into /metrics. */
static void on_event(int event, void *ud)
{
    struct rt_metrics_tangram *m = rt_server_metrics(ud);
    switch (event) {
    case RT_GRPC_EVENT_CONN_OPEN:
        rt_metrics_gauge_add(m->grpc_connections, 1);
        break;
    case RT_GRPC_EVENT_CONN_CLOSE:
        rt_metrics_gauge_add(m->grpc_connections, -1);
        break;
    case RT_GRPC_EVENT_IDLE_CLOSE:
        rt_metrics_counter_inc(m->grpc_idle_closes_total);
        break;
    case RT_GRPC_EVENT_RECV_TIMEOUT:
        rt_metrics_counter_inc(m->grpc_receive_timeouts_total);
        break;
    case RT_GRPC_EVENT_DEADLINE:
        rt_metrics_counter_inc(m->grpc_deadline_exceeded_total);
        break;
    case RT_GRPC_EVENT_REFUSED_STREAM:
        rt_metrics_counter_inc(m->grpc_refused_streams_total);
        break;
    case RT_GRPC_EVENT_TOO_LARGE:
        rt_metrics_counter_inc(m->grpc_oversized_messages_total);
        break;
    default:
        break;
    }
}

/* Per-call state of a Generate stream. */
struct gen_client {
    struct rt_grpc_call *call;
    int32_t tok_sent; /* tokens already streamed */
    uint64_t conn_id; /* the connection that started it (its owner when
                         no API key is set; see the top) */
    struct rt_api_grpc_cont *cont; /* a stored or continued conversation
                                      (owned), or NULL */
};

static void gen_client_free(struct gen_client *c)
{
    if (c != NULL)
        rt_api_grpc__cont_free(c->cont);
    free(c);
}

static const struct rt_sink gen_sink;

/* What owned_req looks for. */
struct owner {
    const char *id;
    uint64_t conn_id; /* 0: any connection (an API key is set) */
};

static int owned_by(const struct rt_req *r, void *ud)
{
    const struct owner *o = ud;
    const struct gen_client *c = r->client;
    return r->sink == &gen_sink && c != NULL && strcmp(r->id_str, o->id) == 0 &&
           (o->conn_id == 0 || c->conn_id == o->conn_id);
}

/* The live gRPC request with client id `id` that `call`'s caller owns
 * (see the top), or NULL. */
static struct rt_req *owned_req(struct rt_server *s,
                                const struct rt_grpc_call *call,
                                const char *id)
{
    struct owner o = {id, have_key(s) ? 0 : call->conn_id};
    return rt_server_find_req(s, owned_by, &o);
}

static Tangram__V1__FinishReason reason_of(enum rt_finish f)
{
    switch (f) {
    case RT_FINISH_STOP:
        return TANGRAM__V1__FINISH_REASON__FINISH_REASON_STOP;
    case RT_FINISH_LENGTH:
        return TANGRAM__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    case RT_FINISH_ABORT:
        return TANGRAM__V1__FINISH_REASON__FINISH_REASON_ABORT;
    case RT_FINISH_ERROR:
        return TANGRAM__V1__FINISH_REASON__FINISH_REASON_ERROR;
    case RT_FINISH_TOOL_CALLS:
        return TANGRAM__V1__FINISH_REASON__FINISH_REASON_TOOL_CALLS;
    default:
        return TANGRAM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED;
    }
}

/* Runs the tool-call parser over this delivery's text: *text / *len become
 * the content it releases (in *own, malloc'd), [*first, *n_calls) of
 * rt_tc_calls the calls completed, and a STOP with calls becomes
 * TOOL_CALLS. Returns 0 or TG_ENOMEM. */
static int tool_delta(struct rt_req *r, const char **text, size_t *len,
                      enum rt_finish *fin, char **own, size_t *first,
                      size_t *n_calls)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    struct tg_buf content = {0};
    int rc = rt_tc_take(a->tc, *text, *len, *fin != RT_FINISH_NONE, &content,
                        first);
    size_t n;
    char *buf = rc == 0 ? tg_buf_steal(&content, &n) : NULL;
    tg_buf_free(&content);
    if (buf == NULL)
        return rc != 0 ? rc : TG_ENOMEM;
    size_t total;
    rt_tc_calls(a->tc, &total);
    *n_calls = total;
    if (*fin == RT_FINISH_STOP && total > 0)
        *fin = RT_FINISH_TOOL_CALLS;
    *own = buf;
    *text = buf;
    *len = n;
    return 0;
}

static void gen_deliver(struct rt_req *r, const char *text, size_t len,
                        const struct rt_token_logprob *lps, size_t n_lp,
                        enum rt_finish fin, const char *error)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    (void)lps;
    (void)n_lp;
    struct gen_client *c = r->client;
    struct rt_server *s = r->srv;
    char *tc_text = NULL;
    size_t first_call = 0, end_call = 0;
    int tc_ok = a->tc == NULL || fin == RT_FINISH_ERROR ||
                tool_delta(r, &text, &len, &fin, &tc_text, &first_call,
                           &end_call) == 0;
    Tangram__V1__ToolCall *pcalls = NULL, **pcallp = NULL;
    if (tc_ok && end_call > first_call) {
        size_t k = end_call - first_call, total;
        const struct rt_tool_call *all = rt_tc_calls(a->tc, &total);
        pcalls = calloc(k, sizeof(*pcalls));
        pcallp = calloc(k, sizeof(*pcallp));
        tc_ok = pcalls != NULL && pcallp != NULL;
        for (size_t i = 0; tc_ok && i < k; i++) {
            tangram__v1__tool_call__init(&pcalls[i]);
            pcalls[i].id = all[first_call + i].id;
            pcalls[i].name = all[first_call + i].name;
            pcalls[i].arguments = all[first_call + i].arguments;
            pcallp[i] = &pcalls[i];
        }
    }
    Tangram__V1__GenerateResponse m = TANGRAM__V1__GENERATE_RESPONSE__INIT;
    Tangram__V1__Usage u = TANGRAM__V1__USAGE__INIT;
    struct rt_api_grpc_plp pb = {0};
    int32_t n_new = r->n_out - c->tok_sent;
    size_t n_top = (size_t)r->q.sampling.n_top;
    uint32_t *ids = malloc(((size_t)n_new + 1) * sizeof(uint32_t));
    Tangram__V1__TokenLogprob *tl = calloc((size_t)n_new + 1, sizeof(*tl));
    Tangram__V1__TokenLogprob **tlp = calloc((size_t)n_new + 1, sizeof(*tlp));
    Tangram__V1__TopLogprob *tops = calloc((size_t)n_new * n_top + 1,
                                           sizeof(*tops));
    Tangram__V1__TopLogprob **topp = calloc((size_t)n_new * n_top + 1,
                                            sizeof(*topp));
    char *txt = malloc(len + 1);
    char **tok_txt = calloc((size_t)n_new * (n_top + 1) + 1, sizeof(char *));
    int ok = ids && tl && tlp && tops && topp && txt && tok_txt && tc_ok &&
             rt_api_grpc__cont_text(c->cont, text, len) == 0;
    /* A stored turn's final message goes out once it is stored. */
    int stored = c->cont != NULL && c->cont->store &&
                 (fin == RT_FINISH_STOP || fin == RT_FINISH_LENGTH ||
                  fin == RT_FINISH_TOOL_CALLS);
    size_t n_txt = 0;
    if (ok) {
        memcpy(txt, text, len);
        txt[len] = '\0';
        if (pcallp != NULL) {
            m.n_tool_calls = end_call - first_call;
            m.tool_calls = pcallp;
        }
        int want_lps = n_top > 0 || r->q.opts.logprobs >= 0;
        for (int32_t i = 0; i < n_new; i++) {
            struct rt_token_logprob t;
            rt_req_token_logprob(r, c->tok_sent + i, &t);
            ids[i] = (uint32_t)t.id;
            if (!want_lps)
                continue;
            tangram__v1__token_logprob__init(&tl[i]);
            tl[i].token_id = (uint32_t)t.id;
            tl[i].logprob = t.logprob;
            size_t bl;
            const char *b = rt_server_token_text(s, t.id, &bl);
            tok_txt[n_txt] = strndup(b, bl);
            tl[i].text = tok_txt[n_txt] ? tok_txt[n_txt] : "";
            n_txt++;
            tl[i].n_top = t.n_top;
            tl[i].top = topp + (size_t)i * n_top;
            for (size_t k = 0; k < t.n_top; k++) {
                Tangram__V1__TopLogprob *tp = &tops[(size_t)i * n_top + k];
                tangram__v1__top_logprob__init(tp);
                tp->token_id = (uint32_t)t.top[k].id;
                tp->logprob = t.top[k].logprob;
                b = rt_server_token_text(s, t.top[k].id, &bl);
                tok_txt[n_txt] = strndup(b, bl);
                tp->text = tok_txt[n_txt] ? tok_txt[n_txt] : "";
                n_txt++;
                tl[i].top[k] = tp;
            }
            tlp[i] = &tl[i];
        }
        m.n_token_ids = (size_t)n_new;
        m.token_ids = ids;
        m.text = txt;
        m.request_id = r->id_str;
        if (want_lps) {
            m.n_logprobs = (size_t)n_new;
            m.logprobs = tlp;
        }
        m.finish_reason = reason_of(fin);
        if (fin != RT_FINISH_NONE && rt_req_prompt_lps(r, NULL) != NULL &&
            rt_api_grpc__plp(r, &m, &pb) != 0)
            ok = 0;
        if (fin != RT_FINISH_NONE) {
            u.prompt_tokens = (uint32_t)r->n_prompt;
            u.completion_tokens = (uint32_t)r->n_out;
            u.cached_prompt_tokens = (uint32_t)r->cached_tokens;
            m.usage = &u;
        }
        size_t sz = tangram__v1__generate_response__get_packed_size(&m);
        uint8_t *buf = stored ? NULL : malloc(sz + 1);
        if (stored) {
            if (rt_api_grpc__cont_finish(r, c->cont, fin, c->call, &m) != 0)
                ok = 0;
        } else if (buf != NULL) {
            tangram__v1__generate_response__pack(&m, buf);
            rt_grpc_call_send(c->call, buf, sz);
            free(buf);
        } else {
            ok = 0;
        }
        c->tok_sent = r->n_out;
    }
    rt_api_grpc__plp_free(&pb);
    for (size_t i = 0; i < n_txt; i++)
        free(tok_txt[i]);
    free(tok_txt);
    free(ids);
    free(tl);
    free(tlp);
    free(tops);
    free(topp);
    free(txt);
    free(tc_text);
    free(pcalls);
    free(pcallp);
    if (fin != RT_FINISH_NONE || !ok) {
        if (!ok)
            rt_grpc_call_finish(c->call, RT_GRPC_INTERNAL, "out of memory");
        else if (fin == RT_FINISH_ERROR) {
            struct rt_request_error e;
            rt_api_gen_error(&e, error);
            rt_grpc_call_finish(c->call, grpc_status_of(e.kind), e.message);
        } else if (fin == RT_FINISH_ABORT)
            rt_grpc_call_finish(c->call, RT_GRPC_CANCELLED, "aborted");
        else if (!stored) /* else finished by rt_api_grpc__cont_finish */
            rt_grpc_call_finish(c->call, RT_GRPC_OK, NULL);
        gen_client_free(c);
        r->client = NULL;
    }
}

static const struct rt_sink gen_sink = {gen_deliver, rt_api_gen_release};

static void gen_cancelled(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    struct rt_req *r = ud;
    gen_client_free(r->client);
    r->client = NULL;
    rt_req_cancel(r);
}

/* The prompt was tokenized off the loop (rt_req.on_submitted). */
static void gen_submitted(struct rt_req *r, int rc, struct rt_request_error *e)
{
    struct gen_client *c = r->client;
    if (rc != 0) {
        struct rt_grpc_call *call = c->call;
        rt_req_drop(r);
        gen_client_free(c);
        rt_grpc_call_finish(call, grpc_status_of(e->kind), e->message);
        return;
    }
    if (rt_api_gen_started(r, e) != 0) {
        struct rt_grpc_call *call = c->call;
        gen_cancelled(call, 0, r);
        rt_grpc_call_finish(call, grpc_status_of(e->kind), e->message);
        return;
    }
    if (r->q.request_id != NULL)
        snprintf(r->id_str, sizeof(r->id_str), "%s", r->q.request_id);
}

/* A large request takes its estimated cost from the request memory
 * budget (router/core/rt_reqmem.h) into *mem before it is converted:
 * returns 1, or 0 after ending the call (RESOURCE_EXHAUSTED when it could
 * never fit, UNAVAILABLE to retry when there is no room now). */
static int mem_take(struct rt_server *s, struct rt_grpc_call *call,
                    const char *prompt, size_t n_ids,
                    Tangram__V1__ChatMessage *const *msgs, size_t n,
                    Tangram__V1__Tool *const *tools, size_t n_tools,
                    size_t *mem)
{
    *mem = 0;
    struct rt_reqmem *m = rt_server_reqmem(s);
    if (m == NULL || call->msg_len <= RT_ENCODE_INLINE_BYTES)
        return 1;
    size_t cost = rt_api_grpc__mem_estimate(call->msg_len, prompt, n_ids, msgs,
                                            n, tools, n_tools);
    int rc = rt_reqmem_take(m, cost);
    if (rc == 0) {
        *mem = cost;
        return 1;
    }
    char msg[320];
    if (rc == TG_ETOOBIG)
        snprintf(msg, sizeof(msg),
                 "the request would take up to %zu MiB of memory once "
                 "converted, rendered and tokenized, more than the server's "
                 "budget for requests being prepared (--max-request-memory "
                 "%zu MiB)",
                 cost >> 20, m->limit >> 20);
    else
        snprintf(msg, sizeof(msg),
                 "the server is preparing as many large requests as its "
                 "memory budget allows (--max-request-memory); retry "
                 "shortly");
    rt_grpc_call_finish(call,
                        rc == TG_ETOOBIG ? RT_GRPC_RESOURCE_EXHAUSTED
                                         : RT_GRPC_UNAVAILABLE,
                        msg);
    return 0;
}

/* A Generate between its conversion and its submission: a continuation
 * composes its prompt on the thread pool meanwhile (it reads the stored
 * conversation and renders the template); the call cancelled cancels it. */
struct gen_start {
    struct rt_pool_job pool; /* first */
    struct rt_server *s;
    struct rt_grpc_call *call; /* NULL once the call was cancelled */
    struct rt_gen_request g;
    struct rt_api_grpc_cont *cont;
    struct rt_resp_entry *prev; /* referenced while the job runs */
    size_t mem;                 /* bytes of the request memory budget */
    struct rt_request_error e;
    int rc;
};

static void gen_start_free(struct gen_start *st)
{
    rt_api_gen_mem_give(st->s, st->mem);
    rt_gen_request_free(&st->g);
    rt_api_grpc__cont_free(st->cont);
    if (st->prev != NULL)
        rt_respstore_unref(rt_server_respstore(st->s), st->prev);
    free(st);
}

/* Creates and submits the request of st (freed here) when rc is 0, else
 * ends the call with st->e. */
static void gen_go(struct gen_start *st, int rc)
{
    struct rt_server *s = st->s;
    struct rt_grpc_call *call = st->call;
    struct rt_request_error e = st->e;
    /* Checked again after a continuation's job: the id may have been
     * taken meanwhile. */
    if (rc == 0 && st->g.q.request_id != NULL &&
        owned_req(s, call, st->g.q.request_id) != NULL) {
        gen_start_free(st);
        rt_grpc_call_finish(call, RT_GRPC_ALREADY_EXISTS,
                            "a running request has this request_id");
        return;
    }
    struct gen_client *c = rc == 0 ? calloc(1, sizeof(*c)) : NULL;
    struct rt_req *r = c ? rt_req_new(s, &gen_sink, c) : NULL;
    if (r == NULL) {
        free(c);
        gen_start_free(st);
        if (rc == 0)
            rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED,
                                "out of memory");
        else
            rt_grpc_call_finish(call, grpc_status_of(e.kind), e.message);
        return;
    }
    c->call = call;
    c->conn_id = call->conn_id;
    c->cont = st->cont;
    st->cont = NULL;
    rc = rt_api_gen_attach(r, &st->g, &e);
    /* The request holds its charge until its prompt is tokenized. */
    if (rc == 0) {
        rt_api_gen_of(r)->mem = st->mem;
        st->mem = 0;
    }
    gen_start_free(st);
    r->on_submitted = gen_submitted;
    /* rt_openai_check_id() kept it within id_str; named at once, so that the id
     * is taken (and Abort finds it) while the prompt is tokenized. */
    if (rc == 0 && r->q.request_id != NULL)
        snprintf(r->id_str, sizeof(r->id_str), "%s", r->q.request_id);
    if (rc == 0)
        rc = rt_req_submit(r, &e);
    if (rc != 0 && rc != TG_EAGAIN) {
        rt_req_drop(r);
        gen_client_free(c);
        rt_grpc_call_finish(call, grpc_status_of(e.kind), e.message);
        return;
    }
    if (rc == 0 && rt_api_gen_started(r, &e) != 0) {
        gen_cancelled(call, 0, r);
        rt_grpc_call_finish(call, grpc_status_of(e.kind), e.message);
        return;
    }
    if (rc == 0 && r->q.request_id != NULL)
        snprintf(r->id_str, sizeof(r->id_str), "%s", r->q.request_id);
    rt_grpc_call_on_cancel(call, gen_cancelled, r);
}

static void gen_start_run(struct rt_pool_job *p)
{
    struct gen_start *st = (struct gen_start *)p;
    st->rc = rt_api_grpc__cont_compose(st->s, st->cont, st->prev, &st->g,
                                       &st->e);
}

static void gen_start_done(struct rt_pool_job *p, int ran)
{
    struct gen_start *st = (struct gen_start *)p;
    rt_respstore_unref(rt_server_respstore(st->s), st->prev);
    st->prev = NULL;
    if (st->call == NULL) { /* the call was cancelled */
        gen_start_free(st);
        return;
    }
    int rc = ran ? st->rc : TG_EINTERNAL;
    if (!ran)
        rt_request_error_set(&st->e, RT_REQ_ERR_UNAVAILABLE, "server_draining",
                             NULL, "the server is shutting down");
    gen_go(st, rc);
}

static void gen_start_cancelled(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    struct gen_start *st = ud;
    st->call = NULL;
    rt_pool_job_cancel(&st->pool);
}

/* A continuation: the stored response looked up in the caller's scope,
 * then its prompt composed on the thread pool. Returns 0 (gen_go
 * follows from the job) or an error with st->e. */
static int gen_continue(struct gen_start *st)
{
    int rc = rt_api_cont_lookup(st->s, st->cont->prev_id, &st->cont->scope,
                                "previous_response_id", &st->prev, &st->e);
    if (rc != 0)
        return rc;
    char err[128];
    st->pool.run = gen_start_run;
    st->pool.done = gen_start_done;
    if (rt_pool_job_start(st->s, &st->pool, err, sizeof(err)) != 0) {
        rt_request_error_set(&st->e, RT_REQ_ERR_INTERNAL, "internal_error",
                             NULL, "%s", err);
        return TG_EINTERNAL;
    }
    rt_grpc_call_on_cancel(st->call, gen_start_cancelled, st);
    return 0;
}

static void h_generate(struct rt_grpc_call *call, void *ud)
{
    struct rt_server *s = ud;
    Tangram__V1__GenerateRequest *q =
        tangram__v1__generate_request__unpack(NULL, call->msg_len, call->msg);
    if (q == NULL) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "cannot parse tangram.v1.GenerateRequest");
        return;
    }
    /* Abort finds requests by id, so a client id must name one running
     * request of its owner (tangram.proto: "unique among the caller's
     * running requests"); the id is stored whole, so it is checked
     * first. */
    if (q->request_id != NULL && q->request_id[0] != '\0') {
        struct rt_request_error ie;
        const char *why = NULL;
        int st = RT_GRPC_OK;
        if (rt_openai_check_id(q->request_id, strlen(q->request_id), "request_id",
                               &ie) != 0) {
            st = RT_GRPC_INVALID_ARGUMENT;
            why = ie.message;
        } else if (owned_req(s, call, q->request_id) != NULL) {
            st = RT_GRPC_ALREADY_EXISTS;
            why = "a running request has this request_id";
        }
        if (why != NULL) {
            tangram__v1__generate_request__free_unpacked(q, NULL);
            rt_grpc_call_finish(call, st, why);
            return;
        }
    }
    size_t mem = 0;
    if (!mem_take(s, call, q->prompt, q->n_prompt_token_ids, q->messages,
                  q->n_messages, q->tools, q->n_tools, &mem)) {
        tangram__v1__generate_request__free_unpacked(q, NULL);
        return;
    }
    struct gen_start *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        rt_api_gen_mem_give(s, mem);
        tangram__v1__generate_request__free_unpacked(q, NULL);
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st->s = s;
    st->call = call;
    st->mem = mem;
    struct rt_openai_cfg cfg = rt_api_openai_cfg(s);
    int rc = rt_api_grpc_convert(&cfg, q, &st->g, &st->e, call);
    if (rc == 0)
        rc = rt_api_grpc__cont_new(s, q, &st->g, &st->cont, &st->e);
    tangram__v1__generate_request__free_unpacked(q, NULL);
    if (rc == 0 && st->cont != NULL && st->cont->prev_id != NULL) {
        rc = gen_continue(st);
        if (rc == 0)
            return;
    }
    gen_go(st, rc);
}

static void reply(struct rt_grpc_call *call, const ProtobufCMessage *m)
{
    size_t sz = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(sz + 1);
    if (buf == NULL) {
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    protobuf_c_message_pack(m, buf);
    rt_grpc_call_reply(call, buf, sz);
    free(buf);
}

/* A Tokenize call while its prompt is encoded on the thread pool. */
struct tok_call {
    struct rt_encode_job job;
    struct ct_chat chat; /* the job's conversation (owned) */
    char *text;
    struct rt_grpc_call *call;    /* NULL once the call is cancelled */
    struct rt_server *s;
    size_t mem; /* bytes of the request memory budget */
};

static void tok_call_free(struct tok_call *tc)
{
    rt_api_gen_mem_give(tc->s, tc->mem);
    tok_ids_free(&tc->job.ids);
    ct_chat_free(&tc->chat);
    free(tc->text);
    free(tc);
}

static void tok_call_cancelled(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    struct tok_call *tc = ud;
    tc->call = NULL;
    rt_encode_job_cancel(&tc->job);
}

static void tok_call_done(struct rt_encode_job *j)
{
    struct tok_call *tc = j->owner;
    struct rt_grpc_call *call = tc->call;
    if (call != NULL && j->rc != 0) {
        rt_grpc_call_finish(call, grpc_status_of(j->e.kind), j->e.message);
    } else if (call != NULL) {
        Tangram__V1__TokenizeResponse m = TANGRAM__V1__TOKENIZE_RESPONSE__INIT;
        m.n_token_ids = j->ids.n;
        m.token_ids = (uint32_t *)j->ids.v; /* ids are >= 0 */
        m.count = (uint32_t)j->ids.n;
        m.max_model_len = (uint32_t)rt_server_info(tc->s)->max_model_len;
        reply(call, &m.base);
    }
    tok_call_free(tc);
}

static void h_tokenize(struct rt_grpc_call *call, void *ud)
{
    struct rt_server *s = ud;
    Tangram__V1__TokenizeRequest *q =
        tangram__v1__tokenize_request__unpack(NULL, call->msg_len, call->msg);
    if (q == NULL) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "cannot parse tangram.v1.TokenizeRequest");
        return;
    }
    struct rt_request_error e;
    size_t mem = 0;
    if (!mem_take(s, call, q->text, 0, q->messages, q->n_messages, q->tools,
                  q->n_tools, &mem)) {
        tangram__v1__tokenize_request__free_unpacked(q, NULL);
        return;
    }
    struct tok_call *tc = calloc(1, sizeof(*tc));
    if (tc == NULL) {
        rt_api_gen_mem_give(s, mem);
        tangram__v1__tokenize_request__free_unpacked(q, NULL);
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    tc->s = s;
    tc->mem = mem;
    struct rt_encode_job *j = &tc->job;
    int rc = 0;
    int chat = q->n_messages > 0;
    if (chat && q->text != NULL && q->text[0] != '\0') {
        rc = TG_EINVAL;
        rt_request_error_set(&e, RT_REQ_ERR_INVALID, "invalid_value", "text",
                             "give either text or messages");
    } else if (chat) {
        j->is_chat = 1;
        j->add_special = q->add_special_tokens_opt_case ? q->add_special_tokens
                                                        : 0;
        rc = rt_api_grpc__chat(q->messages, q->n_messages, q->tools, q->n_tools,
                               &tc->chat, &e);
        j->chat = tc->chat;
        j->chat.add_generation_prompt = q->add_generation_prompt_opt_case
                                            ? (bool)q->add_generation_prompt
                                            : true;
    } else {
        j->add_special = q->add_special_tokens_opt_case ? q->add_special_tokens : 1;
        tc->text = strdup(q->text ? q->text : "");
        if (tc->text == NULL) {
            rc = TG_ENOMEM;
            rt_request_error_set(&e, RT_REQ_ERR_INTERNAL, "internal_error",
                                 NULL, "out of memory");
        }
        j->text = tc->text;
        j->len = tc->text ? strlen(tc->text) : 0;
    }
    tangram__v1__tokenize_request__free_unpacked(q, NULL);
    j->owner = tc;
    j->done = tok_call_done;
    j->max_ids = SIZE_MAX;
    tc->call = call;
    tc->s = s;
    if (rc == 0 && rt_encode_job_small(j)) {
        rt_encode_job_run(s, j);
        tok_call_done(j);
        return;
    }
    if (rc == 0 && rt_encode_job_start(s, j) != 0) {
        rc = TG_EINTERNAL;
        e = j->e;
    }
    if (rc != 0) {
        tok_call_free(tc);
        rt_grpc_call_finish(call, grpc_status_of(e.kind), e.message);
        return;
    }
    rt_grpc_call_on_cancel(call, tok_call_cancelled, tc);
}

static void h_model_info(struct rt_grpc_call *call, void *ud)
{
    struct rt_server *s = ud;
    Tangram__V1__ModelInfoResponse m = TANGRAM__V1__MODEL_INFO_RESPONSE__INIT;
    const struct rt_server_info *info = rt_server_info(s);
    const struct tg_serve_opts *o = rt_server_opts(s);
    m.model = (char *)info->model_name;
    m.max_model_len = (uint32_t)info->max_model_len;
    m.vocab_size = (uint32_t)info->vocab_size;
    m.num_layers = (uint32_t)info->num_layers;
    m.num_kv_heads = (uint32_t)info->num_kv_heads;
    m.head_dim = (uint32_t)info->head_dim;
    m.page_size = (uint32_t)info->page_size;
    m.heads_per_group = (uint32_t)info->heads_per_group;
    m.profile = o->profile ? o->profile : "none";
    m.tensor_parallel = (uint32_t)o->tp;
    m.backend = o->backend == TG_SERVE_BACKEND_CUDA ? "cuda" : "cpu";
    reply(call, &m.base);
}

static void h_abort(struct rt_grpc_call *call, void *ud)
{
    struct rt_server *s = ud;
    Tangram__V1__AbortRequest *q =
        tangram__v1__abort_request__unpack(NULL, call->msg_len, call->msg);
    if (q == NULL) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "cannot parse tangram.v1.AbortRequest");
        return;
    }
    Tangram__V1__AbortResponse m = TANGRAM__V1__ABORT_RESPONSE__INIT;
    struct rt_request_error e;
    if (q->request_id != NULL && q->request_id[0] != '\0' &&
        rt_openai_check_id(q->request_id, strlen(q->request_id),
                           "request_id", &e) != 0) {
        tangram__v1__abort_request__free_unpacked(q, NULL);
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT, e.message);
        return;
    }
    /* Only the owner's requests count (see the top): others get the
     * answer an unknown id gets. */
    struct rt_req *r = q->request_id != NULL && q->request_id[0] != '\0'
                           ? owned_req(s, call, q->request_id)
                           : NULL;
    if (r != NULL) {
        rt_req_abort(r);
        m.found = 1;
    }
    tangram__v1__abort_request__free_unpacked(q, NULL);
    reply(call, &m.base);
}

static int health(const char *service, void *ud)
{
    struct rt_server *s = ud;
    if (service[0] != '\0' && strcmp(service, "tangram.v1.Generation") != 0)
        return RT_GRPC_HEALTH_UNKNOWN_SERVICE;
    return rt_server_ready(s) ? RT_GRPC_HEALTH_SERVING : RT_GRPC_HEALTH_NOT_SERVING;
}

int rt_api_grpc_register(struct rt_server *s, struct rt_grpc_server *grpc,
                         char *err, size_t errlen)
{
    static const struct {
        const char *path;
        enum rt_grpc_kind kind;
        rt_grpc_handler_fn fn;
    } methods[] = {
        {"/tangram.v1.Generation/Generate", RT_GRPC_SERVER_STREAM, h_generate},
        {"/tangram.v1.Generation/Tokenize", RT_GRPC_UNARY, h_tokenize},
        {"/tangram.v1.Generation/ModelInfo", RT_GRPC_UNARY, h_model_info},
        {"/tangram.v1.Generation/Abort", RT_GRPC_UNARY, h_abort},
    };
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        int rc = rt_grpc_method_add(grpc, methods[i].path, methods[i].kind,
                                    methods[i].fn, s, err, errlen);
        if (rc != 0)
            return rc;
    }
    rt_grpc_server_on_admit(grpc, admit, s);
    rt_grpc_server_on_event(grpc, on_event, s);
    int rc = rt_grpc_health_register(grpc, health, s, err, errlen);
    if (rc == 0)
        rc = rt_grpc_reflect_register(grpc, tg_api_descriptor_set,
                                      tg_api_descriptor_set_len, err, errlen);
    return rc;
}
