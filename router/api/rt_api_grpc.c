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
 * Prompts of Generate and Tokenize are tokenized on the thread pool
 * (rt_encode_job): the handler returns and the call goes on when the job
 * ends; a call cancelled meanwhile cancels the job.
 *
 * Loop thread only. */
#include "router/api/rt_api.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/json/tg_json.h"
#include "common/tok/tok_tokenizer.h"
#include "router/api/rt_api_grpc_internal.h"
#include "router/api/rt_fields.h"
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
};

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
    int ok = ids && tl && tlp && tops && topp && txt && tok_txt && tc_ok;
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
        uint8_t *buf = malloc(sz + 1);
        if (buf != NULL) {
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
        else
            rt_grpc_call_finish(c->call, RT_GRPC_OK, NULL);
        free(c);
        r->client = NULL;
    }
}

static const struct rt_sink gen_sink = {gen_deliver, rt_api_gen_release};

static void gen_cancelled(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    struct rt_req *r = ud;
    free(r->client);
    r->client = NULL;
    rt_req_cancel(r);
}

/* GenerateRequest -> rt_gen_request with the OpenAI defaults
 * (rt_api_grpc.h). */
int rt_api_grpc_convert(const struct rt_openai_cfg *cfg,
                        const Tangram__V1__GenerateRequest *q,
                        struct rt_gen_request *g, struct rt_request_error *e,
                        const struct rt_grpc_call *call)
{
    int forms = (q->prompt != NULL && q->prompt[0] != '\0') +
                (q->n_prompt_token_ids > 0) + (q->n_messages > 0);
    if (forms != 1) {
        rt_request_error_set(
            e, RT_REQ_ERR_INVALID, "invalid_value", "prompt",
            "give exactly one of prompt, prompt_token_ids and messages");
        return TG_EINVAL;
    }
    if (q->n_messages == 0 && (q->n_tools > 0 || (q->tool_choice && q->tool_choice[0]))) {
        rt_request_error_set(
            e, RT_REQ_ERR_INVALID, "invalid_value", "tools",
            "tools and tool_choice apply to chats (messages) only");
        return TG_EINVAL;
    }
    memset(g, 0, sizeof(*g));
    struct tg_sampling *sp = &g->q.sampling;
    struct rt_gen_opts *o = &g->q.opts;
    rt_gen_request_defaults(g);
    g->q.max_tokens_param = "sampling.max_tokens";
    /* response_format and structured_outputs as the OpenAI parser reads
     * them; so_root lives until the whitespace policy is applied */
    json_t *so_root = json_object();
    if (so_root == NULL)
        goto nomem;
    static const char *const texts[] = {"response_format",
                                        "structured_outputs"};
    for (int k = 0; k < 2; k++) {
        const char *t = k == 0 ? q->response_format : q->structured_outputs;
        if (t == NULL || t[0] == '\0')
            continue;
        json_error_t je;
        json_t *v = tg_json_loadb_wide(t, strlen(t), 0, &je);
        if (v == NULL) {
            json_decref(so_root);
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value",
                                 texts[k], "%s is not JSON: %s", texts[k],
                                 je.text);
            return TG_EINVAL;
        }
        if (json_object_set_new(so_root, texts[k], v) != 0) {
            json_decref(so_root);
            goto nomem;
        }
    }
    int ws = 0;
    {
        int rc = rt_openai_parse_response_format(so_root, &g->q.grammar, e);
        if (rc == 0)
            rc = rt_openai_parse_structured(so_root, &g->q.grammar, e);
        if (rc == 0)
            rc = rt_openai_structured_ws(cfg, so_root, &ws, e);
        json_decref(so_root);
        if (rc == 0 && q->n_messages == 0) /* no tools: applied now */
            rc = rt_openai_structured_apply_ws(ws, &g->q.grammar, e);
        if (rc != 0) {
            if (rc == TG_ENOMEM && e->kind == RT_REQ_ERR_NONE)
                goto nomem;
            return rc;
        }
    }
    g->model = strdup(cfg->served_model);
    if (g->model == NULL)
        goto nomem;
    if (q->n_messages > 0) {
        g->endpoint = RT_ENDPOINT_CHAT;
        g->q.is_chat = true;
        g->q.chat.add_generation_prompt = true;
        bool par = q->parallel_tool_calls;
        struct rt_tool_sel sel;
        int rc = rt_api_grpc__chat(q->messages, q->n_messages, q->tools,
                                   q->n_tools, &g->q.chat, e);
        if (rc == 0)
            rc = rt_api_grpc__tool_sel(
                q->tool_choice,
                q->parallel_tool_calls_opt_case ==
                        TANGRAM__V1__GENERATE_REQUEST__PARALLEL_TOOL_CALLS_OPT_PARALLEL_TOOL_CALLS
                    ? &par
                    : NULL,
                g->q.chat.tools, &sel, e);
        if (rc == 0)
            rc = rt_openai_tool_grammar(cfg, g->q.chat.tools, &sel,
                                        &g->q.grammar, &g->q.grammar_param, e);
        if (rc == 0)
            rc = rt_openai_structured_apply_ws(ws, &g->q.grammar, e);
        if (rc != 0)
            return rc;
        g->tool_choice = sel.choice;
    } else if (q->n_prompt_token_ids > 0) {
        g->endpoint = RT_ENDPOINT_COMPLETIONS;
        g->q.add_special_tokens = true;
        g->q.prompt_ids = malloc(q->n_prompt_token_ids * sizeof(int32_t));
        if (g->q.prompt_ids == NULL)
            goto nomem;
        for (size_t i = 0; i < q->n_prompt_token_ids; i++) {
            if (q->prompt_token_ids[i] > INT32_MAX) {
                rt_request_error_set(
                    e, RT_REQ_ERR_INVALID, "invalid_value", "prompt_token_ids",
                    "prompt_token_ids[%zu] is not a token id", i);
                return TG_EINVAL;
            }
            g->q.prompt_ids[i] = (int32_t)q->prompt_token_ids[i];
        }
        g->q.n_prompt_ids = q->n_prompt_token_ids;
    } else {
        g->endpoint = RT_ENDPOINT_COMPLETIONS;
        g->q.add_special_tokens = true;
        g->q.prompt = strdup(q->prompt);
        if (g->q.prompt == NULL)
            goto nomem;
        g->q.prompt_len = strlen(q->prompt);
    }
    /* The x-session-id metadata is checked like HTTP's X-Session-Id; the
     * session_id field wins. An empty session_id is proto3's "unset". */
    {
        int rc = rt_api_session(&g->q, q->session_id, "session_id",
                                rt_grpc_call_header(call, "x-session-id"),
                                rt_grpc_call_header_count(call, "x-session-id"),
                                "x-session-id", e);
        if (rc != 0)
            return rc;
    }
    if (q->request_id != NULL && q->request_id[0] != '\0' &&
        (g->q.request_id = strdup(q->request_id)) == NULL)
        goto nomem;
    if (q->prompt_logprobs_opt_case) {
        if (q->prompt_logprobs > RT_PROMPT_LPS_MAX_TOP) {
            rt_request_error_set(
                e, RT_REQ_ERR_INVALID, "invalid_value", "prompt_logprobs",
                "prompt_logprobs must be at most %d", RT_PROMPT_LPS_MAX_TOP);
            return TG_EINVAL;
        }
        o->prompt_lp = true;
        o->prompt_top = (int32_t)q->prompt_logprobs;
    }
    const Tangram__V1__SamplingParams *p = q->sampling;
    if (p == NULL)
        return rt_openai_check_sampling(sp, cfg->vocab_size, "sampling.", e);
#define RANGE(cond, field, ...)                                          \
    do {                                                                 \
        if (!(cond)) {                                                   \
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", \
                                 "sampling." field, __VA_ARGS__);        \
            return TG_EINVAL;                                            \
        }                                                                \
    } while (0)
    /* The whole-number fields from the table the HTTP API parses from
     * too (rt_fields.h). */
    int64_t lo, hi;
    int rc;
    if (p->max_tokens_opt_case) {
        /* 0 scores the prompt alone (one draw, dropped) */
        rt_int_field_range(RT_INT_FIELD_MAX_TOKENS, 0, &lo, &hi);
        if ((rc = rt_int_check(p->max_tokens, o->prompt_lp ? 0 : lo, hi, NULL,
                               "sampling.max_tokens", e)))
            return rc;
        o->max_tokens = p->max_tokens > 0 ? (int32_t)p->max_tokens : 1;
        o->prompt_only = p->max_tokens == 0;
    }
    if (p->min_tokens_opt_case) {
        rt_int_field_range(RT_INT_FIELD_MIN_TOKENS, 0, &lo, &hi);
        if ((rc = rt_int_check(p->min_tokens, lo, hi, NULL,
                               "sampling.min_tokens", e)))
            return rc;
        o->min_tokens = (int32_t)p->min_tokens;
        if ((rc = rt_min_tokens_check(
                 o->min_tokens, p->max_tokens_opt_case ? o->max_tokens : 0,
                 "sampling.min_tokens", "sampling.max_tokens", e)))
            return rc;
    }
    if (p->top_k_opt_case) {
        rt_int_field_range(RT_INT_FIELD_TOP_K, 0, &lo, &hi);
        if ((rc = rt_int_check(p->top_k, lo, hi, NULL, "sampling.top_k", e)))
            return rc;
        sp->top_k = p->top_k > 0 ? p->top_k : 0;
    }
    rt_int_field_range(RT_INT_FIELD_LOGPROBS, 0, &lo, &hi);
    if ((rc = rt_int_check(p->logprobs, lo, hi, NULL, "sampling.logprobs",
                           e)) ||
        (rc = rt_int_count_check(RT_INT_FIELD_STOP, p->n_stop, "sampling.stop",
                                 e)) ||
        (rc = rt_int_count_check(RT_INT_FIELD_STOP_TOKEN_IDS,
                                 p->n_stop_token_ids, "sampling.stop_token_ids",
                                 e)))
        return rc;
    /* The numeric sampling fields, ranges and all, from the table the
     * HTTP API parses from too (rt_fields.h). presence_penalty and
     * frequency_penalty are plain proto3 doubles: 0 when not sent. */
    const struct {
        enum rt_field f;
        bool sent;
        double x;
    } nums[] = {
        {RT_FIELD_TEMPERATURE, p->temperature_opt_case != 0, p->temperature},
        {RT_FIELD_TOP_P, p->top_p_opt_case != 0, p->top_p},
        {RT_FIELD_MIN_P, p->min_p_opt_case != 0, p->min_p},
        {RT_FIELD_PRESENCE_PENALTY, true, p->presence_penalty},
        {RT_FIELD_FREQUENCY_PENALTY, true, p->frequency_penalty},
        {RT_FIELD_REPETITION_PENALTY, p->repetition_penalty_opt_case != 0,
         p->repetition_penalty},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        if (!nums[i].sent)
            continue;
        rc = rt_field_check(nums[i].f, nums[i].x, "sampling.", e);
        if (rc != 0)
            return rc;
        *rt_field_of(nums[i].f, sp) = (float)nums[i].x;
    }
    if (p->seed_opt_case) {
        o->has_seed = true;
        sp->seed = (uint64_t)p->seed;
    }
    o->ignore_eos = p->ignore_eos;
    o->logprobs = p->logprobs > 0 ? (int32_t)p->logprobs : -1;
    sp->n_top = o->logprobs > 0 ? o->logprobs : 0;
    if (p->n_stop > 0) {
        o->stop = calloc(p->n_stop, sizeof(char *));
        if (o->stop == NULL)
            goto nomem;
        for (size_t i = 0; i < p->n_stop; i++) {
            RANGE(p->stop[i] != NULL && p->stop[i][0] != '\0', "stop",
                  "stop[%zu] is empty", i);
            RANGE(strlen(p->stop[i]) <= RT_OPENAI_MAX_STOP_BYTES, "stop",
                  "stop[%zu] is longer than %d bytes", i,
                  RT_OPENAI_MAX_STOP_BYTES);
            if ((o->stop[i] = strdup(p->stop[i])) == NULL)
                goto nomem;
            o->n_stop = i + 1;
        }
    }
    if (p->n_stop_token_ids > 0) {
        o->stop_token_ids = malloc(p->n_stop_token_ids * sizeof(int32_t));
        if (o->stop_token_ids == NULL)
            goto nomem;
        for (size_t i = 0; i < p->n_stop_token_ids; i++) {
            RANGE(p->stop_token_ids[i] < (uint32_t)cfg->vocab_size,
                  "stop_token_ids",
                  "stop_token_ids[%zu] = %u is not a token id (valid: "
                  "0..%d)",
                  i, p->stop_token_ids[i], cfg->vocab_size - 1);
            o->stop_token_ids[i] = (int32_t)p->stop_token_ids[i];
        }
        o->n_stop_token_ids = p->n_stop_token_ids;
    }
#undef RANGE
    return rt_openai_check_sampling(sp, cfg->vocab_size, "sampling.", e);
nomem:
    rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                         "out of memory");
    return TG_ENOMEM;
}

/* The prompt was tokenized off the loop (rt_req.on_submitted). */
static void gen_submitted(struct rt_req *r, int rc, struct rt_request_error *e)
{
    struct gen_client *c = r->client;
    if (rc != 0) {
        struct rt_grpc_call *call = c->call;
        rt_req_drop(r);
        free(c);
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
    struct gen_client *c = calloc(1, sizeof(*c));
    struct rt_req *r = c ? rt_req_new(s, &gen_sink, c) : NULL;
    struct rt_request_error e;
    if (r == NULL) {
        free(c);
        rt_api_gen_mem_give(s, mem);
        tangram__v1__generate_request__free_unpacked(q, NULL);
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    c->call = call;
    c->conn_id = call->conn_id;
    struct rt_gen_request g;
    memset(&g, 0, sizeof(g));
    struct rt_openai_cfg cfg = rt_api_openai_cfg(s);
    int rc = rt_api_grpc_convert(&cfg, q, &g, &e, call);
    tangram__v1__generate_request__free_unpacked(q, NULL);
    if (rc == 0)
        rc = rt_api_gen_attach(r, &g, &e);
    else
        rt_gen_request_free(&g);
    /* The request holds its charge until its prompt is tokenized. */
    if (rc == 0)
        rt_api_gen_of(r)->mem = mem;
    else
        rt_api_gen_mem_give(s, mem);
    r->on_submitted = gen_submitted;
    /* rt_openai_check_id() kept it within id_str; named at once, so that the id
     * is taken (and Abort finds it) while the prompt is tokenized. */
    if (rc == 0 && r->q.request_id != NULL)
        snprintf(r->id_str, sizeof(r->id_str), "%s", r->q.request_id);
    if (rc == 0)
        rc = rt_req_submit(r, &e);
    if (rc != 0 && rc != TG_EAGAIN) {
        rt_req_drop(r);
        free(c);
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
