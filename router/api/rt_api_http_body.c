/* rt_api_http_body.c — request bodies parsed off the loop thread, and the
 * /tokenize and /detokenize endpoints (see rt_api_http_internal.h).
 *
 * A body over RT_API_BODY_INLINE_BYTES is taken out of its request (with
 * its charge against the body budget, router/net/rt_conn.h) and handed to a
 * job on libuv's thread pool (rt_pool_job): for /v1/completions and
 * /v1/chat/completions the job parses it, and generation goes on on the
 * loop with the parsed request; for /tokenize it parses, renders and
 * tokenizes, and formats the whole answer; for /detokenize it parses,
 * checks, decodes and formats. So for a large request the loop thread
 * only moves bytes — reading the body, copying the answer into the
 * socket's write queue — and /health, /metrics and every stream go on
 * while eight megabytes of JSON are parsed and ten are written.
 *
 * What a job touches off the loop: its own body and outputs, and the
 * server's state that is immutable while serving (the model's name and
 * sizes the parsers check against, the tokenizer
 * and the chat template: see rt_server_encode.c). A client gone meanwhile
 * cancels the job (one that has not started never runs) and the result is
 * dropped; the body goes back to the budget when the job ends. Smaller
 * bodies take the same functions on the loop thread, except a generation
 * that may carry an output constraint (its text names response_format or
 * tools): checking a schema builds its automaton, which takes up to
 * seconds for a large one (DESIGN.md §4.11), so such a body is parsed by
 * a job whatever its size.
 *
 * Memory after parsing (router/core/rt_reqmem.h): a large body is first
 * scanned on the pool (rt_reqmem_json_scan: counts, no allocation) for an
 * estimate of what it becomes, which is taken from the request memory
 * budget before the body is parsed: a request costlier than the whole
 * budget gets 413, one that does not fit now waits for room in arrival
 * order, holding only its body. The charge is given back when the
 * /tokenize or /detokenize answer is made, or, for generation, once the
 * prompt is tokenized (rt_api_gen_started) or the request ends. The
 * parse job frees the JSON, the encode job a chat's messages
 * (rt_encode_job.free_messages): a large request's parsed form is never
 * freed on the loop. */
#include "router/api/rt_api_http_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai_chat.h"

enum body_kind { BODY_GENERATE, BODY_TOKENIZE, BODY_DETOKENIZE };

enum body_phase {
    PH_SCAN, /* on the pool: the estimate */
    PH_WAIT, /* waiting for room in the request memory budget */
    PH_WORK, /* on the pool: parse (and encode, format) */
};

struct body_job {
    struct rt_pool_job pool;     /* first: the job is the pool job */
    struct rt_server *s;
    struct rt_http_req *req;     /* NULL once the client is gone */
    struct rt_conn_body body;    /* taken from req */
    int kind;                    /* enum body_kind */
    enum rt_endpoint ep;         /* BODY_GENERATE: which endpoint */
    int phase;                   /* enum body_phase */
    struct rt_reqmem_waiter wait; /* cost: the estimate */
    size_t mem;                   /* bytes taken from the budget */
    int rc;                      /* outputs */
    struct rt_request_error e;
    struct rt_gen_request g;     /* BODY_GENERATE: the parsed request */
    char *out;                   /* otherwise: the answer's JSON */
    size_t out_len;
};

/* ---- the work, on any thread ------------------------------------------- */


static int parse_generate(struct rt_server *s, enum rt_endpoint ep,
                          const char *body, size_t len,
                          struct rt_gen_request *g, struct rt_request_error *e)
{
    struct rt_openai_cfg cfg = rt_api_openai_cfg(s);
    return ep == RT_ENDPOINT_CHAT
               ? rt_openai_parse_chat(&cfg, body, len, g, e)
               : rt_openai_parse_completion(&cfg, body, len, g, e);
}

/* /tokenize: the body to the answer. */
static int tokenize_body(struct rt_server *s, const char *body, size_t len,
                         char **out, size_t *out_len,
                         struct rt_request_error *e)
{
    struct rt_tokenize_request t;
    struct rt_openai_cfg cfg = rt_api_openai_cfg(s);
    int rc = rt_openai_parse_tokenize(&cfg, body, len, &t, e);
    if (rc != 0) {
        rt_tokenize_request_free(&t);
        return rc;
    }
    /* /tokenize counts any length: no context bound. */
    struct tok_ids ids = {0};
    if (t.chat.messages != NULL)
        rc = rt_server_encode_chat(s, &t.chat, t.add_special_tokens, &ids, e);
    else
        rc = rt_server_encode(s, t.prompt, t.prompt_len,
                              t.add_special_tokens, &ids, e);
    if (rc == 0) {
        rc = rt_openai_format_tokenize(
            ids.v, ids.n, rt_server_info(s)->max_model_len,
            t.return_token_strs ? rt_server_token_text : NULL, s, out, out_len);
        if (rc != 0)
            rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                                 "out of memory");
    }
    tok_ids_free(&ids);
    rt_tokenize_request_free(&t);
    return rc;
}

/* /detokenize: the body to the answer. */
static int detokenize_body(struct rt_server *s, const char *body, size_t len,
                           char **out, size_t *out_len,
                           struct rt_request_error *e)
{
    struct rt_detokenize_request d;
    memset(&d, 0, sizeof(d));
    struct rt_openai_cfg cfg = rt_api_openai_cfg(s);
    int rc = rt_openai_parse_detokenize(&cfg, body, len, &d, e);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < d.n_tokens; i++) {
        if (d.tokens[i] < 0 ||
            d.tokens[i] >= tok_vocab_size(rt_server_tok(s))) {
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_token",
                                 "tokens",
                                 "token id %d at index %zu is outside the "
                                 "vocabulary",
                                 d.tokens[i], i);
            rt_detokenize_request_free(&d);
            return TG_EINVAL;
        }
    }
    struct tg_buf text = {0};
    char err[256];
    rc = tok_decode(rt_server_tok(s), d.tokens, d.n_tokens, 0, &text, err,
                    sizeof(err));
    rt_detokenize_request_free(&d);
    if (rc != 0) {
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_token", "tokens",
                             "%s", err);
    } else {
        rc = rt_openai_format_detokenize(tg_buf_str(&text), text.len, out,
                                         out_len);
        if (rc != 0)
            rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                                 "out of memory");
    }
    tg_buf_free(&text);
    return rc;
}

/* ---- jobs ---------------------------------------------------------------- */

static void body_run(struct rt_pool_job *p)
{
    struct body_job *j = (struct body_job *)p;
    const char *b = j->body.data;
    size_t n = j->body.len;
    if (j->phase == PH_SCAN) {
        struct rt_reqmem_json scan;
        rt_reqmem_json_scan(b, n, &scan);
        j->wait.cost = rt_reqmem_json_estimate(&scan);
        return;
    }
    if (j->kind == BODY_GENERATE) {
        j->rc = parse_generate(j->s, j->ep, b, n, &j->g, &j->e);
    } else if (j->kind == BODY_TOKENIZE)
        j->rc = tokenize_body(j->s, b, n, &j->out, &j->out_len, &j->e);
    else
        j->rc = detokenize_body(j->s, b, n, &j->out, &j->out_len, &j->e);
}

static void body_job_free(struct body_job *j);
static void body_work(struct body_job *j);

/* The estimate is in: the request takes its room, waits for it, or is
 * refused. */
static void body_scanned(struct body_job *j)
{
    struct rt_reqmem *m = rt_server_reqmem(j->s);
    int rc = m != NULL ? rt_reqmem_wait(m, &j->wait) : 0;
    if (rc == TG_EAGAIN) {
        j->phase = PH_WAIT;
        return;
    }
    if (rc == TG_ETOOBIG) {
        struct rt_request_error e;
        rt_request_error_set(
            &e, RT_REQ_ERR_TOO_LARGE, "request_too_large", NULL,
            "the request would take up to %zu MiB of memory once parsed, "
            "rendered and tokenized, more than the server's budget for "
            "requests being prepared (--max-request-memory %zu MiB): send "
            "fewer JSON values or a shorter prompt",
            j->wait.cost >> 20, m->limit >> 20);
        rt_http_req_on_abort(j->req, NULL, NULL);
        rt_api_http__send_error(j->req, &e);
        body_job_free(j);
        return;
    }
    j->mem = m != NULL ? j->wait.cost : 0;
    body_work(j);
}

/* Room was made for a waiting request. */
static void body_go(struct rt_reqmem_waiter *w)
{
    struct body_job *j = (struct body_job *)((char *)w -
                                             offsetof(struct body_job, wait));
    j->mem = w->cost;
    body_work(j);
}

/* Gives the job's charge back (once). */
static void body_mem_give(struct body_job *j)
{
    rt_api_gen_mem_give(j->s, j->mem);
    j->mem = 0;
}

static void body_job_free(struct body_job *j)
{
    struct rt_reqmem *m = rt_server_reqmem(j->s);
    if (j->phase == PH_WAIT && m != NULL)
        rt_reqmem_cancel(m, &j->wait);
    body_mem_give(j);
    rt_conn_body_free(&j->body);
    rt_gen_request_free(&j->g);
    free(j->out);
    free(j);
}

static void body_done(struct rt_pool_job *p, int ran)
{
    struct body_job *j = (struct body_job *)p;
    struct rt_http_req *req = j->req;
    if (req != NULL && ran && j->phase == PH_SCAN) {
        body_scanned(j);
        return;
    }
    rt_conn_body_free(&j->body);
    if (req != NULL) {
        rt_http_req_on_abort(req, NULL, NULL);
        if (!ran) {
            j->rc = TG_ECANCELED;
            rt_request_error_set(&j->e, RT_REQ_ERR_UNAVAILABLE,
                                 "server_draining", NULL,
                                 "the request was cancelled before its body "
                                 "was read");
        }
        if (j->kind == BODY_GENERATE) {
            size_t mem = j->mem;
            j->mem = 0; /* the request holds it now */
            rt_api_http__generate_parsed(j->s, req, j->rc, &j->g, &j->e, mem);
        } else if (j->rc != 0) {
            rt_api_http__send_error(req, &j->e);
        } else {
            rt_api_http__send_owned(req, 200, j->out, j->out_len, 0);
            j->out = NULL;
        }
    }
    body_job_free(j);
}

static void body_gone(struct rt_http_req *req, void *ud)
{
    (void)req;
    struct body_job *j = ud;
    j->req = NULL;
    if (j->phase == PH_WAIT) {
        body_job_free(j); /* on no thread: nothing else will */
        return;
    }
    rt_pool_job_cancel(&j->pool);
}

/* Starts the job's work on the pool (its room taken). */
static void body_work(struct body_job *j)
{
    char err[160];
    j->phase = PH_WORK;
    if (rt_pool_job_start(j->s, &j->pool, err, sizeof(err)) != 0) {
        struct rt_request_error e;
        rt_request_error_set(&e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "%s", err);
        rt_http_req_on_abort(j->req, NULL, NULL);
        rt_api_http__send_error(j->req, &e);
        body_job_free(j);
    }
}

/* Takes req's body to a job of `kind`; its answer follows from
 * body_done. */
static void body_job_start(struct rt_server *s, struct rt_http_req *req,
                           int kind, enum rt_endpoint ep)
{
    struct rt_request_error e;
    char err[160];
    struct body_job *j = calloc(1, sizeof(*j));
    if (j == NULL || rt_http_req_take_body(req, &j->body) != 0) {
        free(j);
        rt_request_error_set(&e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        rt_api_http__send_error(req, &e);
        return;
    }
    j->s = s;
    j->req = req;
    j->kind = kind;
    j->ep = ep;
    j->phase = PH_SCAN;
    j->wait.go = body_go;
    j->pool.run = body_run;
    j->pool.done = body_done;
    if (rt_pool_job_start(s, &j->pool, err, sizeof(err)) != 0) {
        rt_conn_body_free(&j->body);
        free(j);
        rt_request_error_set(&e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "%s", err);
        rt_api_http__send_error(req, &e);
        return;
    }
    rt_http_req_on_abort(req, body_gone, j);
}

/* ---- entry points -------------------------------------------------------- */

/* True when a generation body may carry an output constraint: its bytes
 * hold "response_format" or "tools" (a prompt that merely says so costs
 * only a job). */
static int may_constrain(const char *body, size_t len)
{
    if (body == NULL)
        return 0;
    return memmem(body, len, "\"response_format\"", 17) != NULL ||
           memmem(body, len, "\"tools\"", 7) != NULL;
}

void rt_api_http__generate(struct rt_server *s, struct rt_http_req *req,
                           enum rt_endpoint ep)
{
    if (req->body_len > RT_API_BODY_INLINE_BYTES ||
        may_constrain(req->body, req->body_len)) {
        body_job_start(s, req, BODY_GENERATE, ep);
        return;
    }
    struct rt_gen_request g;
    struct rt_request_error e;
    int rc = parse_generate(s, ep, req->body, req->body_len, &g, &e);
    rt_api_http__generate_parsed(s, req, rc, &g, &e, 0);
}

/* /tokenize and /detokenize answered inline (small bodies) or by a job. */
static void answer(struct rt_http_req *req, struct rt_server *s, int kind)
{
    if (req->body_len > RT_API_BODY_INLINE_BYTES) {
        body_job_start(s, req, kind, RT_ENDPOINT_COMPLETIONS);
        return;
    }
    char *out = NULL;
    size_t n = 0;
    struct rt_request_error e;
    int rc = kind == BODY_TOKENIZE
                 ? tokenize_body(s, req->body, req->body_len, &out, &n, &e)
                 : detokenize_body(s, req->body, req->body_len, &out, &n, &e);
    if (rc != 0)
        rt_api_http__send_error(req, &e);
    else
        rt_api_http__send_owned(req, 200, out, n, 0);
}

void rt_api_http__tokenize(struct rt_http_req *req, void *ud)
{
    answer(req, ud, BODY_TOKENIZE);
}

void rt_api_http__detokenize(struct rt_http_req *req, void *ud)
{
    answer(req, ud, BODY_DETOKENIZE);
}
