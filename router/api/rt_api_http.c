/* rt_api_http.c — the OpenAI-compatible HTTP front end of the router:
 * /v1/completions, /v1/chat/completions (SSE streaming), /v1/models and
 * /v1/models/{id}, /health and /metrics (GET and HEAD); /tokenize and
 * /detokenize are in rt_api_http_body.c.
 *
 * With an API key, every path but /health (and /metrics unless
 * --metrics-auth) needs "Authorization: Bearer <key>". The key is checked
 * by the HTTP server's head check, before any body byte is read and before
 * routing: a client without it gets 401 and a closed connection whatever
 * the path or method, so it can neither make the router buffer a body nor
 * learn the routes from 404/405.
 *
 * SSE streams apply backpressure (rt_req.blocked): while more than
 * SSE_HIGH_WATER bytes wait in the connection's send queue the request's
 * output stays in the request, and resumes once the queue drains to
 * SSE_LOW_WATER; a client that reads nothing for --http-send-timeout is
 * cut by the HTTP server, which aborts the request like a disconnect.
 *
 * n > 1 (docs/API.md "n"): the choices are n requests, the first
 * submitted as usual and the others made parallel samples of it right
 * after (rt_req_new_sample); a gen_group joins their output into one
 * response and ends it with the last choice.
 *
 * Large bodies are parsed on the thread pool (rt_api_http_body.c) and
 * large prompts rendered and tokenized there (rt_encode_job); the handler
 * returns at once and the answer follows when the job ends, so a huge
 * request never holds up /health, /metrics or another stream. A client
 * gone meanwhile cancels the job. Loop thread only. */
#include "router/api/rt_api_http_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"

static const char JSON[] = "application/json";

/* Send-queue bytes above which a stream's output is held, and below which
 * it resumes: a few hundred events, far below what a reading client ever
 * leaves queued. */
#define SSE_HIGH_WATER (256u * 1024u)
#define SSE_LOW_WATER (64u * 1024u)

/* Retry-After seconds: a full queue frees up within seconds; a worker
 * restart or a drain (another replica takes over) takes longer. */
#define RETRY_AFTER_QUEUE_FULL "1"
#define RETRY_AFTER_UNAVAILABLE "5"


void rt_api_http__send_error(struct rt_http_req *req,
                             const struct rt_request_error *e)
{
    char *body = NULL;
    size_t len = 0;
    if (rt_openai_format_error(e, &body, &len) != 0) {
        rt_http_respond_error(req, 500, NULL, "out of memory",
                              "internal_error");
        return;
    }
    if (e->kind == RT_REQ_ERR_BUSY)
        rt_http_resp_header(req, "Retry-After", RETRY_AFTER_QUEUE_FULL);
    else if (e->kind == RT_REQ_ERR_UNAVAILABLE)
        rt_http_resp_header(req, "Retry-After", RETRY_AFTER_UNAVAILABLE);
    rt_http_respond(req, rt_openai_http_status(e->kind), JSON, body, len);
    free(body);
}

void rt_api_http__send_owned(struct rt_http_req *req, int status, char *body,
                             size_t len, int rc)
{
    if (rc != 0) {
        struct rt_request_error e;
        rt_request_error_set(&e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        rt_api_http__send_error(req, &e);
        return;
    }
    rt_http_respond(req, status, JSON, body, len);
    free(body);
}

/* True when `h` is "Bearer <key>". */
static int key_matches(const char *key, const char *h)
{
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    const char *got = h + 7;
    size_t a = strlen(got), b = strlen(key);
    /* compare in time independent of where they differ */
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++)
        diff |= (unsigned)(got[i] ^ key[i]);
    return diff == 0;
}

/* The HTTP server's head check (see the top). */
static int head_check(const struct rt_http_req *req, void *ud,
                      struct rt_http_refusal *out)
{
    const struct tg_serve_opts *o = rt_server_opts(ud);
    const char *key = o->api_key;
    if (key == NULL || key[0] == '\0')
        return 0;
    if (strcmp(req->path, "/health") == 0 ||
        (strcmp(req->path, "/metrics") == 0 && !o->metrics_auth))
        return 0;
    if (key_matches(key, rt_http_req_header(req, "authorization")))
        return 0;
    out->status = rt_openai_http_status(RT_REQ_ERR_UNAUTHENTICATED);
    out->type = rt_openai_error_type(RT_REQ_ERR_UNAUTHENTICATED);
    out->code = "invalid_api_key";
    out->message = "missing or invalid API key (Authorization: Bearer ...)";
    out->header = "WWW-Authenticate: Bearer";
    return 1;
}

/* ---- parallel samples (n > 1) ------------------------------------------ */

/* The most choices of one answer: n samples, or a batch's prompts. */
#define GROUP_MAX                                                \
    (RT_OPENAI_MAX_BATCH > RT_OPENAI_MAX_N ? RT_OPENAI_MAX_BATCH \
                                           : RT_OPENAI_MAX_N)

/* The n choices of one request (docs/API.md "n"): n rt_reqs with one
 * client. Every member is listed in m[] until its final delivery reaches
 * its sink (or the group cancels it), never after, since the server frees
 * a finished request after its step. The HTTP response ends with the last
 * choice: one body with every choice (non-streaming), or the usage chunk
 * and [DONE] (streaming). A choice that fails fails the request: its error
 * goes out as the response and the other choices are cancelled. */
struct gen_group {
    struct rt_http_req *req;
    int busy;                      /* inside group_drained: freed after */
    int dead;                      /* freed while busy */
    struct rt_req *m[GROUP_MAX];
    char *bodies[GROUP_MAX]; /* non-streaming: each choice's body */
    size_t blens[GROUP_MAX];
    int32_t n, n_open;        /* choices; not yet finished */
    int64_t done_tokens;      /* completion tokens of finished ones */
    int64_t n_prompt, cached; /* n > 1: the shared prompt, counted once */
    int batch;                /* a batch of prompts: each choice its own */
    int64_t done_prompt, done_cached; /* batch: of the finished ones */
};

static void group_free(struct gen_group *g)
{
    if (g == NULL)
        return;
    if (g->busy) {
        g->dead = 1;
        return;
    }
    for (int32_t i = 0; i < g->n; i++)
        free(g->bodies[i]);
    free(g);
}

static struct rt_usage usage_of(const struct rt_req *r)
{
    const struct gen_group *g = r->group;
    if (g == NULL) {
        struct rt_usage u = {r->n_prompt, r->n_out, r->cached_tokens};
        return u;
    }
    struct rt_usage u = {g->n_prompt, g->done_tokens,
                         g->m[0] != NULL ? g->m[0]->cached_tokens : g->cached};
    if (g->batch) {
        u.prompt_tokens = g->done_prompt;
        u.cached_tokens = g->done_cached;
    }
    for (int32_t i = 0; i < g->n; i++) {
        if (g->m[i] == NULL)
            continue;
        u.completion_tokens += g->m[i]->n_out;
        if (g->batch) {
            u.prompt_tokens += g->m[i]->n_prompt;
            u.cached_tokens += g->m[i]->cached_tokens;
        }
    }
    return u;
}

/* r's final delivery: it leaves the group. Returns 1 when it was the last
 * choice (the caller ends the response and frees the group). */
static int group_leave(struct gen_group *g, struct rt_req *r)
{
    int32_t k = rt_api_gen_of(r)->slot;
    if (g->m[k] == r) {
        if (k == 0)
            g->cached = r->cached_tokens;
        g->m[k] = NULL;
        g->done_tokens += r->n_out;
        g->done_prompt += r->n_prompt;
        g->done_cached += r->cached_tokens;
        g->n_open--;
    }
    return g->n_open == 0;
}

/* Cancels every choice still open (a failed choice, or the client gone);
 * their pages return to the pools at once. */
static void group_cancel(struct gen_group *g)
{
    for (int32_t i = 0; i < g->n; i++) {
        struct rt_req *q = g->m[i];
        if (q == NULL)
            continue;
        g->m[i] = NULL;
        g->n_open--;
        rt_req_cancel(q);
    }
}

/* ---- generation sinks ---------------------------------------------------- */

static void stream_write_owned(struct rt_http_req *req, char *buf, size_t len, int rc)
{
    if (rc == 0)
        rt_http_stream_write(req, buf, len);
    free(buf);
}

/* A stream frame of content (with logprobs) and one of tool calls, each
 * written when it has something. */
static int sse_tool_frames(struct rt_req *r, const struct rt_tc_delta *d,
                           const struct rt_token_logprob *lps, size_t n_lp,
                           const struct rt_usage *u)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    struct rt_http_req *req = r->client;
    char *buf = NULL;
    size_t n = 0;
    int rc = 0;
    if (d->content_len > 0 || n_lp > 0) {
        rc = rt_openai_sse_delta(&a->ctx, d->content, d->content_len, lps, n_lp,
                                 RT_FINISH_NONE, u, &buf, &n);
        stream_write_owned(req, buf, n, rc);
    }
    if (rc == 0 && d->n_calls > 0) {
        buf = NULL;
        rc = rt_openai_sse_tool_calls(&a->ctx, d->calls, d->n_calls,
                                      d->first_index, NULL, 0, u, &buf, &n);
        stream_write_owned(req, buf, n, rc);
    }
    return rc;
}

static void sse_deliver(struct rt_req *r, const char *text, size_t len,
                        const struct rt_token_logprob *lps, size_t n_lp,
                        enum rt_finish fin, const char *error)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    struct rt_http_req *req = r->client;
    char *buf = NULL;
    size_t n = 0;
    struct rt_usage u = usage_of(r);
    struct gen_group *g = r->group;
    if (fin == RT_FINISH_ERROR) {
        struct rt_request_error e;
        rt_api_gen_error(&e, error);
        stream_write_owned(req, buf, n, rt_openai_sse_error(&e, &buf, &n));
        if (g != NULL) {
            /* One failed choice fails the request. */
            group_leave(g, r);
            group_cancel(g);
            group_free(g);
            g = NULL;
        }
    } else if (a->tc != NULL) {
        /* tool calls: text that may start a call is held back until it is
         * decided; calls go out as tool_calls deltas */
        struct rt_tc_delta d;
        int rc = rt_tc_feed(a->tc, text, len, &d);
        if (rc == 0)
            rc = sse_tool_frames(r, &d, lps, n_lp, &u);
        if (rc == 0 && fin != RT_FINISH_NONE &&
            (rc = rt_tc_finish(a->tc, &d)) == 0)
            rc = sse_tool_frames(r, &d, NULL, 0, &u);
        if (rc != 0) {
            struct rt_request_error e;
            rt_request_error_set(&e, RT_REQ_ERR_INTERNAL, "internal_error",
                                 NULL, "out of memory");
            buf = NULL;
            stream_write_owned(req, buf, n, rt_openai_sse_error(&e, &buf, &n));
            fin = fin == RT_FINISH_NONE ? RT_FINISH_ERROR : fin;
        } else if (fin != RT_FINISH_NONE) {
            size_t n_calls;
            rt_tc_calls(a->tc, &n_calls);
            enum rt_finish f = fin == RT_FINISH_STOP && n_calls > 0
                                   ? RT_FINISH_TOOL_CALLS
                                   : fin;
            buf = NULL;
            rc = rt_openai_sse_delta(&a->ctx, "", 0, NULL, 0, f, &u, &buf, &n);
            stream_write_owned(req, buf, n, rc);
        }
    } else {
        int rc = rt_openai_sse_delta(&a->ctx, text, len, lps, n_lp, fin, &u,
                                     &buf, &n);
        stream_write_owned(req, buf, n, rc);
    }
    if (fin == RT_FINISH_NONE)
        return;
    if (g != NULL) {
        if (!group_leave(g, r))
            return; /* other choices still stream */
        u = usage_of(r);
        group_free(g);
    }
    if (a->g.include_usage) {
        buf = NULL;
        stream_write_owned(req, buf, n,
                           rt_openai_sse_usage(&a->ctx, &u, &buf, &n));
    }
    rt_http_stream_write(req, RT_OPENAI_SSE_DONE, strlen(RT_OPENAI_SSE_DONE));
    rt_http_stream_end(req);
}

/* The non-streaming chat body of a request with tool calls. */
static int tool_response(struct rt_req *r, const struct rt_token_logprob *lps,
                         size_t n_all, enum rt_finish fin,
                         const struct rt_usage *u, char **body, size_t *blen)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    struct tg_buf content = {0};
    size_t tlen, first;
    const char *text = rt_req_text(r, &tlen);
    int rc = rt_tc_take(a->tc, text, tlen, true, &content, &first);
    if (rc == 0) {
        size_t n_calls, clen = content.len;
        const struct rt_tool_call *calls = rt_tc_calls(a->tc, &n_calls);
        if (fin == RT_FINISH_STOP && n_calls > 0)
            fin = RT_FINISH_TOOL_CALLS;
        rc = rt_openai_format_chat_response(
            &a->ctx, clen == 0 && n_calls > 0 ? NULL : tg_buf_str(&content),
            clen, calls, n_calls, lps, n_all, fin, u, body, blen);
    }
    tg_buf_free(&content);
    return rc;
}

/* The non-streaming completions body with the echoed prompt in front. */
static int echo_response(struct rt_req *r, const struct rt_token_logprob *lps,
                         size_t n_all, enum rt_finish fin,
                         const struct rt_usage *u, char **body, size_t *blen)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    size_t on, en = a->g.echo_len;
    const char *out = rt_req_text(r, &on);
    char *all = malloc(en + on + 1);
    if (all == NULL)
        return TG_ENOMEM;
    memcpy(all, a->g.echo_text, en);
    if (on > 0)
        memcpy(all + en, out, on);
    all[en + on] = '\0';
    int rc = rt_openai_format_response(&a->ctx, all, en + on, lps, n_all, fin,
                                       u, body, blen);
    free(all);
    return rc;
}

/* A choice's non-streaming body (rc: its formatting); the last one sends
 * every choice in one body, as OpenAI does. */
static void group_body(struct gen_group *g, struct rt_req *r, int rc,
                       char *body, size_t blen)
{
    struct rt_http_req *req = g->req;
    if (rc != 0) {
        group_leave(g, r);
        group_cancel(g);
        group_free(g);
        rt_api_http__send_owned(req, 200, NULL, 0, rc); /* the 500 */
        return;
    }
    g->bodies[rt_api_gen_of(r)->slot] = body;
    g->blens[rt_api_gen_of(r)->slot] = blen;
    if (!group_leave(g, r))
        return;
    struct rt_usage u = usage_of(r);
    char *all = NULL;
    size_t alen = 0;
    rc = rt_openai_merge_choices((const char *const *)g->bodies,
                                 (size_t)g->n, &u, &all, &alen);
    group_free(g);
    rt_api_http__send_owned(req, 200, all, alen, rc);
}

static void json_deliver(struct rt_req *r, const char *text, size_t len,
                         const struct rt_token_logprob *lps, size_t n_lp,
                         enum rt_finish fin, const char *error)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    (void)text;
    (void)len;
    (void)lps;
    (void)n_lp;
    if (fin == RT_FINISH_NONE)
        return;
    struct rt_http_req *req = r->client;
    struct gen_group *g = r->group;
    if (fin == RT_FINISH_ERROR) {
        struct rt_request_error e;
        rt_api_gen_error(&e, error);
        if (g != NULL) {
            /* One failed choice fails the request. */
            group_leave(g, r);
            group_cancel(g);
            group_free(g);
        }
        rt_api_http__send_error(req, &e);
        return;
    }
    /* The whole output: every token's logprobs from the start. */
    size_t n_all = a->ctx.logprobs ? (size_t)r->n_out : 0;
    const struct rt_token_logprob *all = n_all ? rt_req_logprobs(r) : NULL;
    struct rt_usage u = usage_of(r);
    char *body = NULL;
    size_t blen = 0, olen;
    const char *out = rt_req_text(r, &olen);
    int rc = a->tc != NULL ? tool_response(r, all, n_all, fin, &u, &body, &blen)
             : a->g.echo_text != NULL
                 ? echo_response(r, all, n_all, fin, &u, &body, &blen)
                 : rt_openai_format_response(&a->ctx, out, olen, all, n_all,
                                             fin, &u, &body, &blen);
    if (g != NULL)
        group_body(g, r, rc, body, blen);
    else
        rt_api_http__send_owned(req, 200, body, blen, rc);
}

static void sse_drained(struct rt_http_req *req, void *ud)
{
    (void)req;
    rt_req_resume(ud);
}

/* The client of a stream with several choices drained: every open
 * choice resumes (one of them may end the response). */
static void group_drained(struct rt_http_req *req, void *ud)
{
    (void)req;
    struct gen_group *g = ud;
    g->busy = 1;
    for (int32_t i = 0; i < g->n; i++)
        if (g->m[i] != NULL)
            rt_req_resume(g->m[i]);
    g->busy = 0;
    if (g->dead)
        group_free(g);
}

static int sse_blocked(struct rt_req *r)
{
    struct rt_http_req *req = r->client;
    if (rt_http_req_pending_bytes(req) <= SSE_HIGH_WATER)
        return 0;
    /* Not armed (the client is gone): write on, the abort follows. */
    if (r->group != NULL)
        return rt_http_req_on_drain(req, SSE_LOW_WATER, group_drained,
                                    r->group) == 0;
    return rt_http_req_on_drain(req, SSE_LOW_WATER, sse_drained, r) == 0;
}

static const struct rt_sink sse_sink = {sse_deliver, rt_api_gen_release};
static const struct rt_sink json_sink = {json_deliver, rt_api_gen_release};

static void on_client_gone(struct rt_http_req *req, void *ud)
{
    (void)req;
    struct rt_req *r = ud;
    rt_req_cancel(r);
}

/* The client of a request with several choices is gone: every open
 * choice is cancelled (their pages, shared or not, return at once). */
static void group_gone(struct rt_http_req *req, void *ud)
{
    (void)req;
    struct gen_group *g = ud;
    group_cancel(g);
    group_free(g);
}

/* n > 1: the other choices join the submitted request r (its scheduler
 * entry still waits, so they share its prompt's pages). Returns 0, or
 * fills *e and returns nonzero with r and the samples cancelled. */
static int group_start(struct rt_req *r, struct rt_request_error *e)
{
    int32_t n = r->q.n;
    if (n <= 1)
        return 0;
    struct gen_group *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        rt_http_req_on_abort(r->client, NULL, NULL);
        rt_req_cancel(r);
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return TG_ENOMEM;
    }
    g->req = r->client;
    g->n = n;
    g->n_open = 1;
    g->m[0] = r;
    g->n_prompt = r->n_prompt;
    r->group = g;
    rt_http_req_on_abort(g->req, group_gone, g);
    for (int32_t i = 1; i < n; i++) {
        struct rt_req *q = rt_req_new_sample(r, i, e);
        if (q != NULL && rt_api_gen_attach_sample(q, r, e) != 0) {
            rt_req_cancel(q);
            q = NULL;
        }
        if (q == NULL) {
            rt_http_req_on_abort(g->req, NULL, NULL);
            group_cancel(g);
            group_free(g);
            return TG_EINVAL;
        }
        g->m[i] = q;
        g->n_open++;
    }
    return 0;
}

/* completions "echo": the prompt's text, which the output then starts
 * with (OpenAI; vLLM decodes a prompt sent as token ids). */
static int echo_prepare(struct rt_server *s, struct rt_req *r,
                        struct rt_request_error *e)
{
    struct rt_gen_request *g = &rt_api_gen_of(r)->g;
    const struct rt_request *q = &r->q;
    if (!g->echo)
        return 0;
    if (q->prompt != NULL) {
        g->echo_text = malloc(q->prompt_len + 1);
        if (g->echo_text == NULL)
            goto oom;
        memcpy(g->echo_text, q->prompt, q->prompt_len);
        g->echo_text[q->prompt_len] = '\0';
        g->echo_len = q->prompt_len;
        return 0;
    }
    struct tg_buf text = {0};
    char err[256];
    int rc = tok_decode(rt_server_tok(s), q->prompt_ids, q->n_prompt_ids, 0,
                        &text, err, sizeof(err));
    if (rc != 0) {
        tg_buf_free(&text);
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_token", "prompt",
                             "%s", err);
        return rc;
    }
    g->echo_text = malloc(text.len + 1);
    if (g->echo_text != NULL) {
        memcpy(g->echo_text, tg_buf_str(&text), text.len);
        g->echo_text[text.len] = '\0';
        g->echo_len = text.len;
    }
    tg_buf_free(&text);
    if (g->echo_text != NULL)
        return 0;
oom:
    rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                         "out of memory");
    return TG_ENOMEM;
}

/* The request is with the scheduler: its other choices join it, then
 * answer as a stream or wait. */
static void generate_begin(struct rt_req *r)
{
    struct rt_http_req *req = r->client;
    struct rt_request_error e;
    if (group_start(r, &e) != 0) {
        rt_api_http__send_error(req, &e);
        return;
    }
    if (!rt_api_gen_of(r)->g.stream)
        return;
    struct gen_group *g = r->group;
    int32_t n = g != NULL ? g->n : 1;
    for (int32_t i = 0; i < n; i++) {
        struct rt_req *q = g != NULL ? g->m[i] : r;
        q->sink = &sse_sink;
        q->blocked = sse_blocked;
    }
    rt_http_resp_header(req, "Cache-Control", "no-cache");
    rt_http_stream_begin(req, 200, "text/event-stream");
    /* Each choice opens with its role (chat) or its echoed prompt (as
     * vLLM does), in index order. */
    for (int32_t i = 0; i < n; i++) {
        struct rt_req *q = g != NULL ? g->m[i] : r;
        struct rt_api_gen *a = rt_api_gen_of(q);
        char *buf = NULL;
        size_t len = 0;
        if (a->g.endpoint == RT_ENDPOINT_CHAT) {
            stream_write_owned(req, buf, len,
                               rt_openai_sse_role(&a->ctx, &buf, &len));
        } else if (a->g.echo_text != NULL) {
            struct rt_usage u = usage_of(q);
            stream_write_owned(
                req, buf, len,
                rt_openai_sse_delta(&a->ctx, a->g.echo_text, a->g.echo_len,
                                    NULL, 0, RT_FINISH_NONE, &u, &buf, &len));
        }
    }
}

int rt_api_http__started(struct rt_req *r, int rc, struct rt_request_error *e)
{
    struct rt_http_req *req = r->client;
    if (rc != 0) {
        rt_req_drop(r);
        rt_api_http__send_error(req, e);
        return rc;
    }
    if ((rc = rt_api_gen_started(r, e)) != 0) {
        rt_req_cancel(r);
        rt_api_http__send_error(req, e);
    }
    return rc;
}

/* The prompt was tokenized off the loop (rt_req.on_submitted). */
static void generate_submitted(struct rt_req *r, int rc,
                               struct rt_request_error *e)
{
    if (rt_api_http__started(r, rc, e) == 0)
        generate_begin(r);
}

/* ---- batches of prompts (completions) ---------------------------------- */

/* A batch's member: g's answer options and the prompt of p (moved out of
 * p); no session (a batch is no conversation). */
static int batch_member(const struct rt_gen_request *g, struct rt_request *p,
                        struct rt_gen_request *out, struct rt_request_error *e)
{
    memset(out, 0, sizeof(*out));
    out->endpoint = g->endpoint;
    out->tool_choice = g->tool_choice;
    out->stream = g->stream;
    out->include_usage = g->include_usage;
    out->continuous_usage = g->continuous_usage;
    out->echo = g->echo;
    out->echo_top = g->echo_top;
    out->prompt_top = g->prompt_top;
    if ((g->model != NULL && (out->model = strdup(g->model)) == NULL) ||
        rt_request_copy_sample(&g->q, &out->q) != 0) {
        rt_gen_request_free(out);
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return TG_ENOMEM;
    }
    out->q.prompt = p->prompt;
    out->q.prompt_len = p->prompt_len;
    out->q.prompt_ids = p->prompt_ids;
    out->q.n_prompt_ids = p->n_prompt_ids;
    p->prompt = NULL;
    p->prompt_ids = NULL;
    return 0;
}

/* One prompt of a batch fails (rc, *e), so the request does: the others
 * are cancelled and the error answers. r is dropped (not submitted) or
 * cancelled (submitted). */
static void batch_fail(struct gen_group *g, struct rt_req *r, int submitted,
                       const struct rt_request_error *e)
{
    struct rt_http_req *req = g->req;
    group_leave(g, r);
    if (submitted)
        rt_req_cancel(r);
    else
        rt_req_drop(r);
    rt_http_req_on_abort(req, NULL, NULL);
    group_cancel(g);
    group_free(g);
    rt_api_http__send_error(req, e);
}

/* A batch member's prompt was tokenized off the loop. */
static void batch_submitted(struct rt_req *r, int rc,
                            struct rt_request_error *e)
{
    if (rc != 0)
        batch_fail(r->group, r, 0, e);
    else if (rt_api_gen_started(r, e) != 0)
        batch_fail(r->group, r, 1, e);
}

/* A completions request with several prompts (rt_gen_request.batch, moved
 * in as g): one core request per prompt, each tokenized and scheduled on
 * its own, answered together as the choices of one body (index i for
 * prompt i), usage summed; the first failure fails the request. The body's
 * memory charge rides with the first prompt. Loop thread. */
static void batch_start(struct rt_server *s, struct rt_http_req *req,
                        struct rt_gen_request *g0, size_t mem)
{
    struct rt_request_error e;
    size_t n = g0->n_batch + 1, made = 0;
    struct gen_group *g = calloc(1, sizeof(*g));
    struct rt_gen_request *parts = calloc(n, sizeof(*parts));
    int rc = g != NULL && parts != NULL ? 0 : TG_ENOMEM;
    if (rc != 0)
        rt_request_error_set(&e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
    for (size_t i = 1; rc == 0 && i < n; i++)
        rc = batch_member(g0, &g0->batch[i - 1], &parts[i], &e);
    for (size_t i = 0; i < g0->n_batch; i++)
        rt_request_free(&g0->batch[i]);
    free(g0->batch);
    g0->batch = NULL;
    g0->n_batch = 0;
    if (rc != 0) {
        for (size_t i = 1; parts != NULL && i < n; i++)
            rt_gen_request_free(&parts[i]);
        free(parts);
        free(g);
        rt_gen_request_free(g0);
        rt_api_gen_mem_give(s, mem);
        rt_api_http__send_error(req, &e);
        return;
    }
    parts[0] = *g0;
    memset(g0, 0, sizeof(*g0));
    free(parts[0].q.session_id); /* a batch is no conversation */
    parts[0].q.session_id = NULL;
    g->req = req;
    g->n = (int32_t)n;
    g->batch = 1;
    rt_http_req_on_abort(req, group_gone, g);
    for (; made < n; made++) {
        struct rt_req *r = rt_req_new(s, &json_sink, req);
        if (r == NULL) {
            rt_request_error_set(&e, RT_REQ_ERR_INTERNAL, "internal_error",
                                 NULL, "out of memory");
            break;
        }
        if (rt_api_gen_attach(r, &parts[made], &e) != 0) {
            rt_req_drop(r);
            break;
        }
        struct rt_api_gen *a = rt_api_gen_of(r);
        a->slot = (int32_t)made;
        if (made == 0) {
            a->mem = mem; /* given back once its prompt is tokenized */
            mem = 0;
        }
        r->group = g;
        r->on_submitted = batch_submitted;
        g->m[made] = r;
        g->n_open++;
        rc = echo_prepare(s, r, &e);
        if (rc == 0)
            rc = rt_req_submit(r, &e);
        if (rc == TG_EAGAIN)
            continue;
        int submitted = rc == 0;
        if (rc == 0)
            rc = rt_api_gen_started(r, &e);
        if (rc != 0) {
            for (size_t i = made + 1; i < n; i++)
                rt_gen_request_free(&parts[i]);
            free(parts);
            rt_api_gen_mem_give(s, mem);
            batch_fail(g, r, submitted, &e);
            return;
        }
    }
    if (made < n) { /* out of memory making a member */
        for (size_t i = made; i < n; i++)
            rt_gen_request_free(&parts[i]);
        free(parts);
        rt_api_gen_mem_give(s, mem);
        rt_http_req_on_abort(req, NULL, NULL);
        group_cancel(g);
        group_free(g);
        rt_api_http__send_error(req, &e);
        return;
    }
    free(parts);
}

void rt_api_http__generate_parsed(struct rt_server *s, struct rt_http_req *req,
                                  int rc, struct rt_gen_request *g,
                                  struct rt_request_error *e, size_t mem)
{
    /* The body is parsed: its bytes go back to the budget now, not when
     * the answer ends. */
    struct rt_conn_body body;
    if (rt_http_req_take_body(req, &body) == 0)
        rt_conn_body_free(&body);
    if (rc == 0)
        rc = rt_api_session(
            &g->q, NULL, NULL, rt_http_req_header(req, "x-session-id"),
            rt_http_req_header_count(req, "x-session-id"), "X-Session-Id", e);
    if (rc == 0 && g->n_batch > 0) {
        batch_start(s, req, g, mem);
        return;
    }
    struct rt_req *r = rc == 0 ? rt_req_new(s, &json_sink, req) : NULL;
    if (rc == 0 && r == NULL) {
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        rc = TG_ENOMEM;
    }
    if (rc != 0) {
        rt_gen_request_free(g);
        rt_api_gen_mem_give(s, mem);
        rt_api_http__send_error(req, e);
        return;
    }
    rc = rt_api_gen_attach(r, g, e);
    /* The request holds its charge until its prompt is tokenized. */
    if (rc == 0)
        rt_api_gen_of(r)->mem = mem;
    else
        rt_api_gen_mem_give(s, mem);
    r->on_submitted = generate_submitted;
    if (rc == 0)
        rc = rt_server_check_n(s, r->q.n, e);
    if (rc == 0)
        rc = echo_prepare(s, r, e);
    if (rc == 0)
        rc = rt_req_submit(r, e);
    if (rc != TG_EAGAIN && rt_api_http__started(r, rc, e) != 0)
        return;
    /* A client gone while its prompt is tokenized cancels it too. */
    rt_http_req_on_abort(req, on_client_gone, r);
    if (rc == 0)
        generate_begin(r);
}

static void h_completions(struct rt_http_req *req, void *ud)
{
    rt_api_http__generate(ud, req, RT_ENDPOINT_COMPLETIONS);
}

static void h_chat(struct rt_http_req *req, void *ud)
{
    rt_api_http__generate(ud, req, RT_ENDPOINT_CHAT);
}

static void h_models(struct rt_http_req *req, void *ud)
{
    const struct rt_server_info *m = rt_server_info(ud);
    char *body = NULL;
    size_t len = 0;
    int rc = rt_openai_format_models(m->model_name, m->started,
                                     m->max_model_len, &body, &len);
    rt_api_http__send_owned(req, 200, body, len, rc);
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes the path segment `in` into out[0..cap) (RFC 3986
 * §2.1); returns 0, or -1 when it is malformed or does not fit. */
static int path_decode(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (; *in; in++) {
        char c = *in;
        if (c == '%') {
            int hi = hex_value(in[1]), lo = hi < 0 ? -1 : hex_value(in[2]);
            if (lo < 0)
                return -1;
            c = (char)(hi * 16 + lo);
            in += 2;
        }
        if (n + 1 >= cap)
            return -1;
        out[n++] = c;
    }
    out[n] = '\0';
    return 0;
}

/* GET /v1/models/{id}: the served model's object (the OpenAI client's
 * models.retrieve), 404 model_not_found for any other id. */
static void h_model(struct rt_http_req *req, void *ud)
{
    static const char prefix[] = "/v1/models/";
    const struct rt_server_info *m = rt_server_info(ud);
    char id[512];
    if (path_decode(req->path + sizeof(prefix) - 1, id, sizeof(id)) != 0 ||
        strcmp(id, m->model_name) != 0) {
        struct rt_request_error e;
        rt_request_error_set(&e, RT_REQ_ERR_NOT_FOUND, "model_not_found",
                             "model", "The model '%.200s' does not exist",
                             req->path + sizeof(prefix) - 1);
        rt_api_http__send_error(req, &e);
        return;
    }
    char *body = NULL;
    size_t len = 0;
    int rc = rt_openai_format_model(m->model_name, m->started, m->max_model_len,
                                    &body, &len);
    rt_api_http__send_owned(req, 200, body, len, rc);
}

static void h_health(struct rt_http_req *req, void *ud)
{
    struct rt_server *s = ud;
    if (!rt_server_ready(s)) {
        const char *why = rt_server_draining(s) ? "{\"status\":\"draining\"}"
                                                : "{\"status\":\"starting\"}";
        rt_http_respond(req, 503, JSON, why, strlen(why));
        return;
    }
    int64_t ms = 0;
    int rank = rt_server_stalled_rank(s, &ms);
    if (rank >= 0) {
        char body[256];
        int n = snprintf(body, sizeof(body),
                         "{\"status\":\"stalled\",\"reason\":\"worker rank %d "
                         "sent nothing for %" PRId64 " ms (heartbeat every "
                         "%lld ms)\"}",
                         rank, ms,
                         (long long)rt_server_opts(s)->worker_heartbeat_ms);
        rt_http_respond(req, 503, JSON, body, (size_t)n);
        return;
    }
    rt_http_respond(req, 200, JSON, "{\"status\":\"ok\"}", 15);
}

static void h_metrics(struct rt_http_req *req, void *ud)
{
    struct rt_server *s = ud;
    rt_server_scrape(s);
    struct tg_buf buf = {0};
    char err[128];
    if (rt_metrics_render(&rt_server_metrics(s)->reg, &buf, err, sizeof(err)) !=
        0) {
        rt_http_respond_error(req, 500, NULL, "metrics unavailable: out of memory",
                              "internal_error");
    } else {
        rt_http_respond(req, 200, RT_METRICS_CONTENT_TYPE, buf.data, buf.len);
    }
    tg_buf_free(&buf);
}

int rt_api_http_register(struct rt_server *s, struct rt_http_server *http,
                         char *err, size_t errlen)
{
    static const struct {
        const char *method, *path;
        rt_http_handler_fn fn;
    } routes[] = {
        {"POST", "/v1/completions", h_completions},
        {"POST", "/v1/chat/completions", h_chat},
        {"POST", "/v1/responses", rt_api_http__responses},
        {"GET", "/v1/responses/*", rt_api_http__responses_get},
        {"DELETE", "/v1/responses/*", rt_api_http__responses_delete},
        {"GET", "/v1/models", h_models},
        {"GET", "/v1/models/*", h_model},
        {"POST", "/tokenize", rt_api_http__tokenize},
        {"POST", "/detokenize", rt_api_http__detokenize},
        {"GET", "/health", h_health},
        {"GET", "/metrics", h_metrics},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        int rc = rt_http_route_add(http, routes[i].method, routes[i].path,
                                   routes[i].fn, s, err, errlen);
        if (rc != 0)
            return rc;
    }
    /* Load balancers and Kubernetes probe /health and scrapers /metrics:
     * both are served on the probe reserve, so they answer while every
     * connection of the table is busy (router/net/rt_conn.h). */
    if (rt_http_route_set_probe(http, "/health") != 0 ||
        rt_http_route_set_probe(http, "/metrics") != 0)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "http: no /health or /metrics route");
    rt_http_server_on_head(http, head_check, s);
    return 0;
}
