/* rt_server_req.c — a request's life before the step loop takes it:
 * creation and release, the prompt's tokens (checked ids, or the text
 * rendered and tokenized on libuv's thread pool when it is big, with the
 * early context bound), the cache scope, and the submission to the
 * scheduler; resuming a request its client held back (see rt_server.h).
 * Loop thread, except the encode job's work function. */
#include "router/core/rt_server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"

struct rt_req *rt_req_new(struct rt_server *s, const struct rt_sink *sink,
                          void *client)
{
    struct rt_req_full *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    struct rt_req *r = &f->pub;
    r->core = &f->core;
    r->srv = s;
    r->sink = sink;
    r->client = client;
    r->id = ++s->next_id;
    r->created = (int64_t)time(NULL);
    r->core->t_arrival = rt_server_now(s);
    r->core->next = s->reqs;
    s->reqs = r;
    s->n_reqs++;
    return r;
}

static void req_unlink(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    for (struct rt_req **p = &s->reqs; *p != NULL; p = &(*p)->core->next) {
        if (*p == r) {
            *p = r->core->next;
            s->n_reqs--;
            return;
        }
    }
}

void rt_req_drop(struct rt_req *r)
{
    req_unlink(r);
    rt_server__grammar_put(r); /* whatever ended it */
    if (r->sink != NULL && r->sink->release != NULL)
        r->sink->release(r);
    rt_request_free(&r->q);
    rt_text_free(&r->core->text);
    free(r->core->prompt);
    free(r->core->out_ids);
    free(r->core->out_lps);
    free(r->core->out_top_ids);
    free(r->core->out_top_lps);
    free(r->core->top_scratch);
    free(r->core->lp_scratch);
    rt_server__plp_free(r);
    free(r);
}

/* Copies the client's token ids into r->core->prompt after checking them. */
static int take_prompt_ids(struct rt_req *r, struct rt_request_error *e)
{
    struct rt_server *s = r->srv;
    for (size_t i = 0; i < r->q.n_prompt_ids; i++)
        if (r->q.prompt_ids[i] < 0 || r->q.prompt_ids[i] >= s->mc.vocab_size) {
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_token",
                                 "prompt",
                                 "token id %d at index %zu is outside the "
                                 "vocabulary [0, %d)",
                                 r->q.prompt_ids[i], i, s->mc.vocab_size);
            return TG_EINVAL;
        }
    r->core->prompt = malloc((r->q.n_prompt_ids + 1) * sizeof(int32_t));
    if (r->core->prompt == NULL) {
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return TG_ENOMEM;
    }
    memcpy(r->core->prompt, r->q.prompt_ids,
           r->q.n_prompt_ids * sizeof(int32_t));
    r->n_prompt = (int64_t)r->q.n_prompt_ids;
    return 0;
}

/* The most prompt tokens the context leaves r: max_model_len minus
 * max_tokens when the client gave it, else minus the one token that must
 * be generated. A prompt beyond it is refused whatever its exact length,
 * so encoding may stop there (tok_encode_max). */
static size_t prompt_bound(const struct rt_req *r)
{
    int64_t ctx = r->srv->info.max_model_len;
    if (ctx <= 0)
        return SIZE_MAX;
    int64_t gen = r->q.opts.max_tokens > 0 ? r->q.opts.max_tokens : 1;
    int64_t bound = ctx - gen;
    return bound < 0 ? 0 : (size_t)bound;
}

/* Fills j with r's prompt (text or chat). */
static void job_inputs(struct rt_req *r, struct rt_encode_job *j)
{
    j->owner = r;
    j->add_special = r->q.add_special_tokens;
    j->max_ids = prompt_bound(r);
    if (r->q.is_chat) {
        j->is_chat = 1;
        j->chat = r->q.chat;
    } else {
        j->text = r->q.prompt;
        j->len = r->q.prompt_len;
    }
}

/* The context error of a prompt that tok_encode_max stopped. */
static void over_context(struct rt_req *r, struct rt_request_error *e)
{
    rt_request_error_set(e, RT_REQ_ERR_INVALID, "context_length_exceeded",
                         r->q.is_chat ? "messages" : "prompt",
                         "the prompt has more than %zu tokens; this model's "
                         "context is %d tokens, which must also hold %s",
                         prompt_bound(r), (int)r->srv->info.max_model_len,
                         r->q.opts.max_tokens > 0
                             ? "max_tokens"
                             : "at least one generated token");
}

static int submit_tokenized(struct rt_req *r, struct rt_request_error *e);

/* A request's encode job ended (loop thread). */
static void req_job_done(struct rt_encode_job *j)
{
    struct rt_req *r = j->owner;
    struct rt_server *s = r->srv;
    r->core->job = NULL;
    struct tok_ids ids = j->ids;
    int rc = j->rc;
    struct rt_request_error e = j->e;
    free(j);
    if (r->core->done) {
        /* Cancelled or aborted meanwhile: the result is dropped. */
        tok_ids_free(&ids);
        if (!r->core->in_step && !r->core->in_deliver && !r->core->holding)
            rt_req_drop(r);
        rt_server__drain_check(s);
        return;
    }
    if (rc == 0) {
        r->core->prompt = ids.v;
        r->n_prompt = (int64_t)ids.n;
        rc = submit_tokenized(r, &e);
        if (rc == TG_EAGAIN)
            return; /* waits for its grammar: told when it is ready */
    } else {
        tok_ids_free(&ids);
        if (rc == TG_ERANGE)
            over_context(r, &e);
    }
    r->on_submitted(r, rc, &e);
}

/* Tokenizes the prompt of r->q into r->core->prompt, or starts a job for it
 * (TG_EAGAIN). */
static int tokenize(struct rt_req *r, struct rt_request_error *e)
{
    struct rt_server *s = r->srv;
    if (r->q.prompt_ids != NULL)
        return take_prompt_ids(r, e);
    struct rt_encode_job *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return TG_ENOMEM;
    }
    job_inputs(r, j);
    if (r->on_submitted == NULL || rt_encode_job_small(j)) {
        /* Small prompts, and synchronous callers: the same work, here. */
        rt_encode_job_run(s, j);
        int rc = j->rc;
        if (rc != 0) {
            tok_ids_free(&j->ids);
            if (rc == TG_ERANGE)
                over_context(r, e);
            else
                *e = j->e;
            free(j);
            return rc;
        }
        r->core->prompt = j->ids.v;
        r->n_prompt = (int64_t)j->ids.n;
        free(j);
        return 0;
    }
    j->done = req_job_done;
    /* Nothing needs a chat's messages once they are rendered: the job
     * frees them where it renders them, off the loop. */
    if (j->is_chat) {
        j->free_messages = 1;
        r->q.chat.messages = NULL;
        r->q.chat.n_messages = 0;
    }
    if (rt_encode_job_start(s, j) != 0) {
        if (j->free_messages) {
            r->q.chat.messages = j->chat.messages;
            r->q.chat.n_messages = j->chat.n_messages;
        }
        *e = j->e;
        free(j);
        return TG_EINTERNAL;
    }
    r->core->job = j;
    return TG_EAGAIN;
}


static uint64_t scope_mix(uint64_t h, const char *p, size_t n)
{
    /* FNV-1a over the bytes, keyed by the starting value. */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 0x100000001b3ULL;
    return h;
}

/* The multi-turn cache scope of a request (rt_prefix.h): a keyed hash of
 * who is calling and which conversation it names. Who: the API key the
 * request was authenticated with (the daemon has one, --api-key, so today
 * it separates nothing, but a server with several keys keeps their caches
 * apart by it). Which conversation: the session id (X-Session-Id, the
 * body's session_id, gRPC session_id), else the OpenAI `user` field, else
 * none: requests that name neither share one scope per key, as every
 * request did before scopes existed. The hash is keyed by a random
 * per-process value and finished with splitmix64, so nobody outside can
 * aim a session id at another scope. */
static uint64_t cache_scope(const struct rt_req *r)
{
    const struct rt_server *s = r->srv;
    const char *key = s->opts->api_key != NULL ? s->opts->api_key : "";
    const char *conv = "";
    char kind = '-';
    if (r->q.session_id != NULL) {
        conv = r->q.session_id;
        kind = 's';
    } else if (r->q.user != NULL) {
        conv = r->q.user;
        kind = 'u';
    }
    uint64_t h = 0xcbf29ce484222325ULL ^ s->scope_key;
    h = scope_mix(h, key, strlen(key) + 1);
    h = scope_mix(h, &kind, 1);
    h = scope_mix(h, conv, strlen(conv));
    return rt_server__splitmix(&h);
}

/* 1 with *e set when s takes no request now (draining, or the workers not
 * ready), else 0. */
static int refusing(const struct rt_server *s, struct rt_request_error *e)
{
    if (s->draining) {
        rt_request_error_set(e, RT_REQ_ERR_UNAVAILABLE, "server_draining", NULL,
                             "the server is shutting down");
        return 1;
    }
    if (!rt_server_ready(s)) {
        rt_request_error_set(e, RT_REQ_ERR_UNAVAILABLE, "not_ready", NULL,
                             "the workers are not ready; retry later");
        return 1;
    }
    return 0;
}

int rt_req_submit(struct rt_req *r, struct rt_request_error *e)
{
    struct rt_server *s = r->srv;
    if (refusing(s, e))
        return TG_EBUSY;
    int rc = tokenize(r, e);
    if (rc != 0)
        return rc;
    return submit_tokenized(r, e);
}

/* The rest of rt_req_submit once r->core->prompt holds the ids. */
static int submit_tokenized(struct rt_req *r, struct rt_request_error *e)
{
    struct rt_server *s = r->srv;
    /* The state may have changed while the prompt was encoded. */
    if (refusing(s, e))
        return TG_EBUSY;
    int rc = rt_request_fit(&r->q, s->info.max_model_len, r->n_prompt, e);
    if (rc != 0)
        return rc;
    const struct rt_gen_opts *sp = &r->q.opts;
    rc = rt_text_init(&r->core->text, &s->tok, (const char *const *)sp->stop,
                      (int)sp->n_stop);
    if (rc != 0) {
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return rc;
    }
    r->core->n_top = r->q.sampling.n_top;
    r->core->cap_out = sp->max_tokens;
    r->core->out_ids = malloc((size_t)r->core->cap_out * sizeof(int32_t));
    r->core->out_lps = malloc((size_t)r->core->cap_out * sizeof(float));
    r->core->lp_scratch = calloc((size_t)r->core->cap_out,
                                 sizeof(*r->core->lp_scratch));
    r->core->out_top_ids = malloc(
        ((size_t)r->core->cap_out * r->core->n_top + 1) * sizeof(int32_t));
    r->core->out_top_lps = malloc(
        ((size_t)r->core->cap_out * r->core->n_top + 1) * sizeof(float));
    r->core->top_scratch = calloc((size_t)r->core->cap_out * r->core->n_top + 1,
                                  sizeof(*r->core->top_scratch));
    if (!r->core->out_ids || !r->core->out_lps || !r->core->lp_scratch ||
        !r->core->out_top_ids || !r->core->out_top_lps ||
        !r->core->top_scratch) {
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return TG_ENOMEM;
    }
    if ((rc = rt_server__plp_alloc(r, e)) != 0)
        return rc;
    if (r->core->fork_of == 0) /* a sample's seed is set by rt_req_new_sample */
        r->q.sampling.seed = sp->has_seed ? r->q.sampling.seed
                                          : rt_server__splitmix(&s->rng);
    /* A constrained request goes on only once rank 0 holds its grammar
     * (TG_EAGAIN: it waits outside the scheduler, rt_server_grammar.c). */
    rc = rt_server__grammar_hold(r, e);
    if (rc != 0)
        return rc;
    return rt_server__sched_submit(r, e);
}

int rt_server__sched_submit(struct rt_req *r, struct rt_request_error *e)
{
    struct rt_server *s = r->srv;
    const struct rt_gen_opts *sp = &r->q.opts;
    int rc;
    /* What the workers draw with: the value the front end checked (its
     * trust boundary; here it is an invariant), its seed resolved at the
     * submission. The scheduler borrows the bias arrays: r outlives its
     * time in the scheduler (r is freed only once done, and every end
     * goes through the scheduler's end event or rt_sched_abort). */
    TG_ASSERT(tg_sampling_check(&r->q.sampling, s->info.vocab_size, NULL, NULL,
                                0) == 0);
    struct rt_sched_request sr = {
        .id = r->id,
        .request_id = r->id_str,
        .sampling = r->q.sampling,
        .prompt = r->core->prompt,
        .n_prompt = r->n_prompt,
        .max_tokens = sp->max_tokens,
        .session_id = r->q.session_id,
        .grammar = r->q.grammar,
        .grammar_prepare = r->core->gprep != NULL ? r->core->gprep->id : 0,
        .cache_scope = cache_scope(r),
        .user = r,
        .fork_of = r->core->fork_of,
        .prompt_lp = r->q.opts.prompt_lp,
        .prompt_top = r->q.opts.prompt_top,
    };
    char err[256];
    rc = rt_sched_submit(&s->sched, &sr, err, sizeof(err));
    if (rc == TG_EBUSY) {
        rt_request_error_set(
            e, RT_REQ_ERR_BUSY, "queue_full", NULL,
            "too many requests are waiting (--max-queued %lld)",
            (long long)s->opts->max_queued);
        return rc;
    }
    if (rc == TG_ETOOBIG && r->core->fork_of != 0) {
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", "n",
                             "'n' = %d parallel samples do not fit: %s",
                             (int)r->choice + 1, err);
        return rc;
    }
    if (rc == TG_ETOOBIG) {
        rt_request_error_set(
            e, RT_REQ_ERR_INVALID, "context_length_exceeded", "prompt",
            "the prompt needs more KV pages than a worker holds: %s", err);
        return rc;
    }
    if (rc != 0) {
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "%s", err);
        return rc;
    }
    r->core->submitted = 1;
    if (r->core->fork_of == 0 &&
        !r->core->counted) /* a shared prompt counts once */
        rt_metrics_counter_add(s->metrics.prompt_tokens_total,
                               (double)r->n_prompt);
    r->core->counted = 1;
    rt_server__wake(s);
    return 0;
}

int rt_server_check_n(const struct rt_server *s, int32_t n,
                      struct rt_request_error *e)
{
    if (n <= 1)
        return 0;
    if (n > s->opts->max_num_seqs) {
        rt_request_error_set(
            e, RT_REQ_ERR_INVALID, "unsupported_value", "n",
            "'n' = %d exceeds --max-num-seqs %lld: the choices "
            "of one request run side by side",
            (int)n, (long long)s->opts->max_num_seqs);
        return TG_EUNSUPPORTED;
    }
    /* The method the workers score with: --method, else the profile's
     * (gpu_worker/gw_engine.c reads them in that order). */
    const char *m = s->opts->method != NULL && s->opts->method[0] != '\0'
                        ? s->opts->method
                        : s->profile.method;
    if (m != NULL && strcmp(m, "gvote") == 0) {
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "unsupported_value", "n",
                             "'n' = %d is not supported with --method gvote: "
                             "its rows shrink by what the worker keeps after "
                             "each prefill chunk, and the samples share the "
                             "prompt's pages as reserved; send n requests "
                             "instead",
                             (int)n);
        return TG_EUNSUPPORTED;
    }
    return 0;
}

struct rt_req *rt_req_new_sample(struct rt_req *leader, int32_t index,
                                 struct rt_request_error *e)
{
    struct rt_server *s = leader->srv;
    struct rt_req *r = rt_req_new(s, leader->sink, leader->client);
    if (r == NULL || rt_request_copy_sample(&leader->q, &r->q) != 0 ||
        (r->core->prompt = malloc(((size_t)leader->n_prompt + 1) *
                                  sizeof(int32_t))) == NULL) {
        if (r != NULL)
            rt_req_drop(r);
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return NULL;
    }
    memcpy(r->core->prompt, leader->core->prompt,
           (size_t)leader->n_prompt * sizeof(int32_t));
    r->n_prompt = leader->n_prompt;
    r->blocked = leader->blocked;
    r->group = leader->group;
    r->choice = index;
    r->core->fork_of = leader->id;
    /* vLLM's rule for the choices of a seeded request: choice i draws
     * with seed + i; without a seed, leader's seed was random. */
    r->q.sampling.seed = leader->q.sampling.seed + (uint64_t)index;
    r->created = leader->created;
    memcpy(r->id_str, leader->id_str, sizeof(r->id_str));
    if (leader->core->gprep != NULL) { /* the leader's grammar, ready */
        r->core->gprep = leader->core->gprep;
        rt_gpreps_ref(r->core->gprep);
    }
    if (submit_tokenized(r, e) != 0) {
        rt_req_drop(r);
        return NULL;
    }
    return r;
}

void rt_req_resume(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    if (r->core->done)
        return;
    if (r->core->holding) {
        r->core->holding = 0;
        rt_req_deliver(r, (enum rt_finish)r->core->held_fin,
                       r->core->held_error[0] ? r->core->held_error : NULL);
    } else {
        rt_req_deliver(r, RT_FINISH_NONE, NULL);
    }
    if (r->core->done && !r->core->in_step && !r->core->in_deliver &&
        r->core->job == NULL) {
        rt_req_drop(r);
        rt_server__drain_check(s);
    }
}

