/* rt_server.c — the router's core: requests, the step loop, drain (see
 * rt_server.h). The front ends (rt_api.h) are registered by the router's
 * main; nothing here calls into them. */
#include "router/rt_server.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/kv/kv_layout.h"
#include "common/tg_err.h"
#include "common/tg_log.h"
#include "router/rt_metrics_info.h"

double rt_server_now(const struct rt_server *s)
{
    return (double)uv_hrtime() / 1e9 + 0.0 * (double)(s != NULL);
}

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Tells tangramd (over the notify pipe) a one-word state change. */
static void notify(struct rt_server *s, const char *line)
{
    if (s->opts->notify_fd < 0)
        return;
    char buf[256];
    int n = snprintf(buf, sizeof(buf), "%s\n", line);
    ssize_t w = write((int)s->opts->notify_fd, buf, (size_t)n);
    (void)w;
}

const char *rt_server_token_text(void *user, int32_t id, size_t *len)
{
    struct rt_server *s = user;
    const char *b = tok_id_bytes(&s->tok, id, len);
    if (b == NULL) {
        *len = 0;
        return "";
    }
    return b;
}

int rt_server_ready(const struct rt_server *s)
{
    return s->sched_ready && rt_link_ready(&s->link) && !s->draining;
}

/* ---- requests ----------------------------------------------------------- */

struct rt_req *rt_req_new(struct rt_server *s, const struct rt_sink *sink,
                          void *client)
{
    struct rt_req *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->srv = s;
    r->sink = sink;
    r->client = client;
    r->id = ++s->next_id;
    r->created = (int64_t)time(NULL);
    r->t_arrival = rt_server_now(s);
    r->next = s->reqs;
    s->reqs = r;
    s->n_reqs++;
    return r;
}

static void req_unlink(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    for (struct rt_req **p = &s->reqs; *p != NULL; p = &(*p)->next) {
        if (*p == r) {
            *p = r->next;
            s->n_reqs--;
            return;
        }
    }
}

void rt_req_drop(struct rt_req *r)
{
    req_unlink(r);
    rt_gen_request_free(&r->g);
    rt_text_free(&r->text);
    free(r->prompt);
    free(r->out_ids);
    free(r->out_lps);
    free(r->out_top_ids);
    free(r->out_top_lps);
    free(r->top_scratch);
    free(r->lp_scratch);
    if (r->tc != NULL) {
        rt_tc_free(r->tc);
        free(r->tc);
    }
    free(r);
}

static int is_stop_token(const struct rt_req *r, int32_t tok)
{
    const struct rt_server *s = r->srv;
    if (!r->g.sampling.ignore_eos) {
        for (int i = 0; i < s->mc.n_eos; i++)
            if (tok == s->mc.eos_token_ids[i])
                return 1;
        for (int i = 0; i < s->tok.n_eos; i++)
            if (tok == s->tok.eos_ids[i])
                return 1;
    }
    for (size_t i = 0; i < r->g.sampling.n_stop_token_ids; i++)
        if (tok == r->g.sampling.stop_token_ids[i])
            return 1;
    return 0;
}

/* Copies the client's token ids into r->prompt after checking them. */
static int take_prompt_ids(struct rt_req *r, struct rt_api_error *e)
{
    struct rt_server *s = r->srv;
    for (size_t i = 0; i < r->g.n_prompt_ids; i++)
        if (r->g.prompt_ids[i] < 0 || r->g.prompt_ids[i] >= s->mc.vocab_size) {
            rt_api_error_set(e, 400, "invalid_token", "prompt",
                             "token id %d at index %zu is outside the "
                             "vocabulary [0, %d)", r->g.prompt_ids[i], i,
                             s->mc.vocab_size);
            return TG_EINVAL;
        }
    r->prompt = malloc((r->g.n_prompt_ids + 1) * sizeof(int32_t));
    if (r->prompt == NULL) {
        rt_api_error_set(e, 500, "internal_error", NULL, "out of memory");
        return TG_ENOMEM;
    }
    memcpy(r->prompt, r->g.prompt_ids, r->g.n_prompt_ids * sizeof(int32_t));
    r->n_prompt = (int64_t)r->g.n_prompt_ids;
    return 0;
}

/* The most prompt tokens the context leaves r: max_model_len minus
 * max_tokens when the client gave it, else minus the one token that must
 * be generated. A prompt beyond it is refused whatever its exact length,
 * so encoding may stop there (tok_encode_max). */
static size_t prompt_bound(const struct rt_req *r)
{
    int64_t ctx = r->srv->max_model_len;
    if (ctx <= 0)
        return SIZE_MAX;
    int64_t gen = r->g.sampling.max_tokens > 0 ? r->g.sampling.max_tokens : 1;
    int64_t bound = ctx - gen;
    return bound < 0 ? 0 : (size_t)bound;
}

/* Fills j with r's prompt (text or chat). */
static void job_inputs(struct rt_req *r, struct rt_encode_job *j)
{
    j->owner = r;
    j->add_special = r->g.add_special_tokens;
    j->max_ids = prompt_bound(r);
    if (r->g.endpoint == RT_ENDPOINT_CHAT) {
        j->is_chat = 1;
        j->messages = r->g.chat_messages;
        j->tools = r->g.tool_choice == RT_TOOL_CHOICE_NONE ? NULL : r->g.tools;
        j->chat = r->g.chat;
    } else {
        j->text = r->g.prompt;
        j->len = r->g.prompt_len;
    }
}

/* The context error of a prompt that tok_encode_max stopped. */
static void over_context(struct rt_req *r, struct rt_api_error *e)
{
    rt_api_error_set(e, 400, "context_length_exceeded",
                     r->g.endpoint == RT_ENDPOINT_CHAT ? "messages" : "prompt",
                     "the prompt has more than %zu tokens; this model's "
                     "context is %d tokens, which must also hold %s",
                     prompt_bound(r), (int)r->srv->max_model_len,
                     r->g.sampling.max_tokens > 0 ? "max_tokens"
                                                  : "at least one generated token");
}

static int submit_tokenized(struct rt_req *r, struct rt_api_error *e);
static void drain_check(struct rt_server *s);

/* A request's encode job ended (loop thread). */
static void req_job_done(struct rt_encode_job *j)
{
    struct rt_req *r = j->owner;
    struct rt_server *s = r->srv;
    r->job = NULL;
    struct tok_ids ids = j->ids;
    int rc = j->rc;
    struct rt_api_error e = j->e;
    free(j);
    if (r->done) {
        /* Cancelled or aborted meanwhile: the result is dropped. */
        tok_ids_free(&ids);
        if (!r->in_step && !r->in_deliver && !r->holding)
            rt_req_drop(r);
        drain_check(s);
        return;
    }
    if (rc == 0) {
        r->prompt = ids.v;
        r->n_prompt = (int64_t)ids.n;
        rc = submit_tokenized(r, &e);
    } else {
        tok_ids_free(&ids);
        if (rc == TG_ERANGE)
            over_context(r, &e);
    }
    r->on_submitted(r, rc, &e);
}

/* Tokenizes the prompt of r->g into r->prompt, or starts a job for it
 * (TG_EAGAIN). */
static int tokenize(struct rt_req *r, struct rt_api_error *e)
{
    struct rt_server *s = r->srv;
    if (r->g.prompt_ids != NULL)
        return take_prompt_ids(r, e);
    struct rt_encode_job *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        rt_api_error_set(e, 500, "internal_error", NULL, "out of memory");
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
        r->prompt = j->ids.v;
        r->n_prompt = (int64_t)j->ids.n;
        free(j);
        return 0;
    }
    j->done = req_job_done;
    if (rt_encode_job_start(s, j) != 0) {
        *e = j->e;
        free(j);
        return TG_EINTERNAL;
    }
    r->job = j;
    return TG_EAGAIN;
}

static void wake(struct rt_server *s);

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
    if (r->g.session_id != NULL) {
        conv = r->g.session_id;
        kind = 's';
    } else if (r->g.user != NULL) {
        conv = r->g.user;
        kind = 'u';
    }
    uint64_t h = 0xcbf29ce484222325ULL ^ s->scope_key;
    h = scope_mix(h, key, strlen(key) + 1);
    h = scope_mix(h, &kind, 1);
    h = scope_mix(h, conv, strlen(conv));
    return splitmix(&h);
}

int rt_req_submit(struct rt_req *r, struct rt_api_error *e)
{
    struct rt_server *s = r->srv;
    if (s->draining) {
        rt_api_error_set(e, 503, "server_draining", NULL,
                         "the server is shutting down");
        return TG_EBUSY;
    }
    if (!rt_server_ready(s)) {
        rt_api_error_set(e, 503, "not_ready", NULL,
                         "the workers are not ready; retry later");
        return TG_EBUSY;
    }
    int rc = rt_sampling_check_converted(&r->g.sampling, e);
    if (rc != 0)
        return rc;
    rc = tokenize(r, e);
    if (rc != 0)
        return rc;
    return submit_tokenized(r, e);
}

/* The rest of rt_req_submit once r->prompt holds the ids. */
static int submit_tokenized(struct rt_req *r, struct rt_api_error *e)
{
    struct rt_server *s = r->srv;
    /* The state may have changed while the prompt was encoded. */
    if (s->draining) {
        rt_api_error_set(e, 503, "server_draining", NULL,
                         "the server is shutting down");
        return TG_EBUSY;
    }
    if (!rt_server_ready(s)) {
        rt_api_error_set(e, 503, "not_ready", NULL,
                         "the workers are not ready; retry later");
        return TG_EBUSY;
    }
    int rc = rt_gen_request_fit(&r->g, s->max_model_len, r->n_prompt, e);
    if (rc != 0)
        return rc;
    const struct rt_sampling *sp = &r->g.sampling;
    rc = rt_text_init(&r->text, &s->tok, (const char *const *)sp->stop,
                      (int)sp->n_stop);
    if (rc != 0) {
        rt_api_error_set(e, 500, "internal_error", NULL, "out of memory");
        return rc;
    }
    r->n_top = sp->logprobs > 0 ? sp->logprobs : 0;
    r->cap_out = sp->max_tokens;
    r->out_ids = malloc((size_t)r->cap_out * sizeof(int32_t));
    r->out_lps = malloc((size_t)r->cap_out * sizeof(float));
    r->lp_scratch = calloc((size_t)r->cap_out, sizeof(*r->lp_scratch));
    r->out_top_ids = malloc(((size_t)r->cap_out * r->n_top + 1) * sizeof(int32_t));
    r->out_top_lps = malloc(((size_t)r->cap_out * r->n_top + 1) * sizeof(float));
    r->top_scratch = calloc((size_t)r->cap_out * r->n_top + 1, sizeof(*r->top_scratch));
    if (!r->out_ids || !r->out_lps || !r->lp_scratch || !r->out_top_ids ||
        !r->out_top_lps || !r->top_scratch) {
        rt_api_error_set(e, 500, "internal_error", NULL, "out of memory");
        return TG_ENOMEM;
    }
    r->seed = sp->has_seed ? (uint64_t)sp->seed : splitmix(&s->rng);
    /* Tool calls are parsed out of the output when the template told the
     * model how to write them and the request offered tools. */
    if (r->g.endpoint == RT_ENDPOINT_CHAT && r->g.tools != NULL &&
        json_array_size(r->g.tools) > 0 &&
        r->g.tool_choice == RT_TOOL_CHOICE_AUTO &&
        s->tmpl.tool_format != CT_TOOLS_NONE) {
        r->tc = malloc(sizeof(*r->tc));
        if (r->tc == NULL) {
            rt_api_error_set(e, 500, "internal_error", NULL, "out of memory");
            return TG_ENOMEM;
        }
        rt_tc_init(r->tc, s->tmpl.tool_format, splitmix(&s->rng));
    }
    rt_openai_make_id(r->id_str, sizeof(r->id_str), r->g.endpoint, splitmix(&s->rng));
    r->ctx.endpoint = r->g.endpoint;
    r->ctx.id = r->id_str;
    r->ctx.model = s->model_name;
    r->ctx.created = r->created;
    r->ctx.logprobs = sp->logprobs >= 0;
    r->ctx.token_text = rt_server_token_text;
    r->ctx.token_user = s;
    r->ctx.include_usage = r->g.include_usage;
    r->ctx.continuous_usage = r->g.continuous_usage;

    /* What the workers draw with: the values rt_sampling_check_converted
     * passed, in the single precision they take. */
    struct rt_sched_request sr = {
        .id = r->id,
        .request_id = r->id_str,
        .sampling = {
            .temperature = (float)sp->temperature,
            .top_p = (float)sp->top_p,
            .top_k = sp->top_k,
            .min_p = (float)sp->min_p,
            .presence_penalty = (float)sp->presence_penalty,
            .frequency_penalty = (float)sp->frequency_penalty,
            .repetition_penalty = (float)sp->repetition_penalty,
            .logprobs = (uint32_t)r->n_top,
            .seed = r->seed,
            .bias_ids = sp->bias_ids,
            .bias_vals = sp->bias_vals,
            .n_bias = (uint32_t)sp->n_bias,
        },
        .prompt = r->prompt,
        .n_prompt = r->n_prompt,
        .max_tokens = sp->max_tokens,
        .session_id = r->g.session_id,
        .cache_scope = cache_scope(r),
        .user = r,
    };
    char err[256];
    rc = rt_sched_submit(&s->sched, &sr, err, sizeof(err));
    if (rc == TG_EBUSY) {
        rt_api_error_set(e, 429, "queue_full", NULL,
                         "too many requests are waiting (--max-queued %lld)",
                         (long long)s->opts->max_queued);
        return rc;
    }
    if (rc == TG_ETOOBIG) {
        rt_api_error_set(e, 400, "context_length_exceeded", "prompt",
                         "the prompt needs more KV pages than a worker holds: %s",
                         err);
        return rc;
    }
    if (rc != 0) {
        rt_api_error_set(e, 500, "internal_error", NULL, "%s", err);
        return rc;
    }
    r->submitted = 1;
    rt_metrics_counter_add(s->metrics.prompt_tokens_total, (double)r->n_prompt);
    wake(s);
    return 0;
}

void rt_req_resume(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    if (r->done)
        return;
    if (r->holding) {
        r->holding = 0;
        rt_req_deliver(r, (enum rt_finish)r->held_fin,
                       r->held_error[0] ? r->held_error : NULL);
    } else {
        rt_req_deliver(r, RT_FINISH_NONE, NULL);
    }
    if (r->done && !r->in_step && !r->in_deliver && r->job == NULL) {
        rt_req_drop(r);
        drain_check(s);
    }
}

static enum rt_finish finish_of(enum rt_sched_end e)
{
    switch (e) {
    case RT_SCHED_END_STOP:
        return RT_FINISH_STOP;
    case RT_SCHED_END_LENGTH:
        return RT_FINISH_LENGTH;
    case RT_SCHED_END_ABORT:
        return RT_FINISH_ABORT;
    case RT_SCHED_END_ERROR:
    case RT_SCHED_END_KV:
        return RT_FINISH_ERROR;
    default:
        return RT_FINISH_NONE;
    }
}

static void observe_finish(struct rt_server *s, struct rt_req *r, enum rt_finish fin)
{
    double now = rt_server_now(s);
    rt_metrics_histogram_observe(s->metrics.e2e_request_latency_seconds,
                                 now - r->t_arrival);
    enum rt_metrics_finish mf = fin == RT_FINISH_STOP     ? RT_METRICS_FINISH_STOP
                                : fin == RT_FINISH_LENGTH ? RT_METRICS_FINISH_LENGTH
                                : fin == RT_FINISH_ABORT  ? RT_METRICS_FINISH_ABORT
                                                          : RT_METRICS_FINISH_ERROR;
    rt_metrics_counter_inc(s->metrics.request_success_total[mf]);
}

/* Applies the scheduler's events of the last plan/complete. */
static void handle_events(struct rt_server *s, const char *error)
{
    for (int32_t i = 0; i < s->step.n_events; i++) {
        const struct rt_sched_event *ev = &s->step.events[i];
        struct rt_req *r = ev->user;
        if (r == NULL || r->done)
            continue;
        r->cached_tokens = ev->cached_prompt_tokens;
        enum rt_finish fin = finish_of(ev->finish);
        if (fin != RT_FINISH_NONE) {
            if (fin != RT_FINISH_STOP || !r->text.stopped)
                rt_text_finish(&r->text);
            observe_finish(s, r, fin);
        }
        const char *why = error ? error : "the request failed";
        if (ev->finish == RT_SCHED_END_KV)
            why = "kv_cache_exhausted: the sequence outgrew the KV cache "
                  "(preempted and too long to fit the whole page pool "
                  "again); retry with a shorter prompt or max_tokens";
        rt_req_deliver(r, fin, fin == RT_FINISH_ERROR ? why : NULL);
    }
}

static void tick_cb(uv_timer_t *t);

/* A drain whose last request just ended stops at the next loop turn rather
 * than at the next 1 s tick (tick_cb does the stopping, outside the link's
 * and the front ends' callbacks). */
static void drain_check(struct rt_server *s)
{
    if (s->draining && !s->stopping && s->n_reqs == 0 && s->n_jobs == 0 &&
        !s->step_in_flight)
        uv_timer_start(&s->tick, tick_cb, 0, 1000);
}

void rt_server__jobs_changed(struct rt_server *s)
{
    drain_check(s);
}

/* Frees requests that finished (after the step that referenced them). */
static void reap(struct rt_server *s)
{
    struct rt_req *r = s->reqs, *next;
    for (; r != NULL; r = next) {
        next = r->next;
        if (r->done && !r->in_step && !r->in_deliver && r->job == NULL)
            rt_req_drop(r);
    }
    drain_check(s);
}

void rt_req_cancel(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    if (r->job != NULL)
        rt_encode_job_cancel(r->job); /* r is freed when the job ends */
    if (r->done) {
        if (!r->in_step && r->job == NULL)
            rt_req_drop(r);
        drain_check(s);
        return;
    }
    r->done = 1;
    /* A held request already left the scheduler and was counted. */
    if (r->submitted && !r->holding) {
        rt_sched_abort(&s->sched, r->id); /* frees its pages at once */
        observe_finish(s, r, RT_FINISH_ABORT);
    }
    if (!r->in_step && !r->in_deliver && r->job == NULL)
        rt_req_drop(r);
    drain_check(s);
    wake(s);
}

void rt_req_abort(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    if (r->done || r->holding)
        return;
    if (r->submitted)
        rt_sched_abort(&s->sched, r->id);
    if (r->job != NULL)
        rt_encode_job_cancel(r->job); /* r is freed when the job ends */
    observe_finish(s, r, RT_FINISH_ABORT);
    rt_req_deliver(r, RT_FINISH_ABORT, NULL);
    if (!r->in_step && !r->in_deliver && r->job == NULL)
        rt_req_drop(r);
    wake(s);
}

static void pump_cb(uv_idle_t *h);

static void wake(struct rt_server *s)
{
    if (!s->pump_on && !s->stopping) {
        uv_idle_start(&s->pump, pump_cb);
        s->pump_on = 1;
    }
}

static void update_gauges(struct rt_server *s)
{
    struct rt_sched_stats st;
    rt_sched_get_stats(&s->sched, &st);
    rt_metrics_gauge_set(s->metrics.num_requests_running, (double)st.running);
    rt_metrics_gauge_set(s->metrics.num_requests_waiting, (double)st.waiting);
    /* The scheduler keeps monotonic totals; counters follow them. */
    double cached = (double)st.cached_prompt_tokens -
                    rt_metrics_series_value(s->metrics.cached_prompt_tokens_total);
    if (cached > 0)
        rt_metrics_counter_add(s->metrics.cached_prompt_tokens_total, cached);
    double pre = (double)st.preemptions -
                 rt_metrics_series_value(s->metrics.num_preemptions_total);
    if (pre > 0)
        rt_metrics_counter_add(s->metrics.num_preemptions_total, pre);
    double used = 0, total = 0, mono = 0;
    for (int rk = 0; rk < s->metrics.n_ranks; rk++) {
        struct rt_sched_pages pg;
        rt_sched_rank_pages(&s->sched, rk, &pg);
        rt_metrics_gauge_set(s->metrics.kv_pages_used[rk], (double)pg.used);
        rt_metrics_gauge_set(s->metrics.kv_pages_total[rk], (double)pg.total);
        rt_metrics_gauge_set(s->metrics.kv_pages_cached[rk], (double)pg.cached);
        used += (double)pg.used;
        total += (double)pg.total;
        mono += (double)pg.monolithic;
    }
    rt_metrics_gauge_set(s->metrics.kv_cache_usage_perc, total > 0 ? used / total : 0);
    rt_metrics_gauge_set(s->metrics.kv_pages_reclaimed_ratio,
                         mono > 0 ? 1.0 - used / mono : 0);
}

/* One turn of the step loop: plan and send when nothing is in flight. */
static void pump_cb(uv_idle_t *h)
{
    struct rt_server *s = h->data;
    uv_idle_stop(&s->pump);
    s->pump_on = 0;
    if (s->step_in_flight || !s->sched_ready || !rt_link_ready(&s->link))
        return;
    char err[256];
    int rc = rt_sched_plan(&s->sched, &s->step, err, sizeof(err));
    if (rc != 0) {
        log_err("scheduler: %s", err);
        return;
    }
    handle_events(s, "the scheduler could not keep the request");
    reap(s);
    update_gauges(s);
    if (s->step.n_entries == 0)
        return;
    for (int32_t i = 0; i < s->step.n_entries; i++)
        ((struct rt_req *)s->step.entries[i].user)->in_step = 1;
    rc = rt_link_send_plan(&s->link, &s->step, err, sizeof(err));
    if (rc != 0) {
        log_err("cannot send step %llu: %s",
                (unsigned long long)s->step.step_id, err);
        rt_sched_fail_running(&s->sched, &s->step);
        for (int32_t i = 0; i < s->step.n_entries; i++)
            ((struct rt_req *)s->step.entries[i].user)->in_step = 0;
        handle_events(s, err);
        reap(s);
        return;
    }
    s->step_in_flight = 1;
}

/* Rank 0's tokens came back (or the step failed). */
static void on_result(void *ud, const struct rt_link_result *res)
{
    struct rt_server *s = ud;
    s->step_in_flight = 0;
    rt_metrics_histogram_observe(s->metrics.scheduler_step_seconds, res->step_seconds);
    if (!res->ok) {
        log_err("step %llu failed: %s", (unsigned long long)res->step_id, res->error);
        rt_sched_fail_running(&s->sched, &s->step);
        for (int32_t i = 0; i < s->step.n_entries; i++)
            ((struct rt_req *)s->step.entries[i].user)->in_step = 0;
        handle_events(s, res->error);
        reap(s);
        update_gauges(s);
        wake(s);
        return;
    }
    double now = rt_server_now(s);
    int32_t n = s->step.n_entries;
    /* A request the worker could not sample for fails alone: it leaves the
     * scheduler now (its pages freed, nothing stored), so complete skips
     * its entry, and every other request goes on. */
    for (int32_t i = 0; i < n; i++) {
        struct rt_req *r = s->step.entries[i].user;
        if (res->entries[i].error == NULL || r->done)
            continue;
        log_warn("request %s failed on the worker: %s", r->id_str,
                 res->entries[i].error);
        rt_sched_abort(&s->sched, r->id);
        rt_text_finish(&r->text);
        observe_finish(s, r, RT_FINISH_ERROR);
        rt_req_deliver(r, RT_FINISH_ERROR, res->entries[i].error);
    }
    uint8_t *stop = calloc((size_t)n + 1, 1);
    for (int32_t i = 0; i < n; i++) {
        const struct rt_step_entry *en = &s->step.entries[i];
        struct rt_req *r = en->user;
        r->in_step = 0;
        if (!en->sample || r->done || res->tokens[i] < 0)
            continue;
        const struct rt_link_token *lt = &res->entries[i];
        int32_t tok = res->tokens[i];
        if (r->n_out < r->cap_out) {
            r->out_ids[r->n_out] = tok;
            r->out_lps[r->n_out] = lt->logprob;
            for (int k = 0; k < r->n_top; k++) {
                int have = (size_t)k < lt->n_top;
                r->out_top_ids[(size_t)r->n_out * r->n_top + k] =
                    have ? (int32_t)lt->top_ids[k] : -1;
                r->out_top_lps[(size_t)r->n_out * r->n_top + k] =
                    have ? lt->top_logprobs[k] : -INFINITY;
            }
            r->n_out++;
        }
        if (r->n_out == 1) {
            r->t_first = now;
            rt_metrics_histogram_observe(s->metrics.time_to_first_token_seconds,
                                         now - r->t_arrival);
        } else {
            rt_metrics_histogram_observe(s->metrics.inter_token_latency_seconds,
                                         now - r->t_last);
        }
        r->t_last = now;
        rt_metrics_counter_inc(s->metrics.generation_tokens_total);
        int hit = 0;
        int eos = is_stop_token(r, tok);
        if (!eos || r->g.sampling.include_stop_str_in_output)
            rt_text_push(&r->text, tok, &hit);
        if (r->n_out > r->g.sampling.min_tokens || r->g.sampling.min_tokens <= 0)
            stop[i] = (uint8_t)(eos || hit);
    }
    char err[256];
    int rc = rt_sched_complete(&s->sched, &s->step, res->tokens, stop, err, sizeof(err));
    free(stop);
    if (rc != 0)
        log_err("scheduler complete: %s", err);
    handle_events(s, NULL);
    /* Requests still running get their new text as it becomes safe. */
    for (int32_t i = 0; i < n; i++) {
        struct rt_req *r = s->step.entries[i].user;
        if (!r->done)
            rt_req_deliver(r, RT_FINISH_NONE, NULL);
    }
    reap(s);
    update_gauges(s);
    wake(s);
}

static void on_dead(void *ud, int rank)
{
    struct rt_server *s = ud;
    char msg[64];
    snprintf(msg, sizeof(msg), "NOTREADY rank %d died", rank);
    log_err("worker rank %d is dead; running requests fail", rank);
    notify(s, msg);
    /* A step in flight was already failed through on_result. Otherwise the
     * running requests' KV died with the worker: fail them now rather than
     * on the next step. */
    if (s->sched_ready && !s->step_in_flight) {
        rt_sched_fail_running(&s->sched, &s->step);
        handle_events(s, "a worker died");
        reap(s);
        update_gauges(s);
    }
}

/* tangram_cache_config_info, once the pools are sized (rt_metrics_info.h).
 * A failure costs only the metric, so it is logged and serving goes on. */
static void publish_cache_config(struct rt_server *s,
                                 const struct rt_sched_config *sc)
{
    const struct kv_layout *one = &s->layout;
    const struct kv_layout *const *lays =
        sc->layouts != NULL ? sc->layouts : &one;
    struct rt_metrics_cache_config cc = {
        .page_size = s->layout.page_size,
        .num_pages = sc->pages_per_rank,
        .num_ranks = sc->n_ranks,
        .heads_per_group = s->layout.heads_per_group,
        .num_gpu_blocks = rt_metrics_pool_token_blocks(lays, sc->n_ranks,
                                                       sc->pages_per_rank),
    };
    char err[256];
    if (rt_metrics_tangram_set_cache_config(&s->metrics, &cc, err,
                                            sizeof(err)) != 0)
        log_warn("%s", err);
}

static void on_ready(void *ud)
{
    struct rt_server *s = ud;
    if (!s->sched_ready) {
        char err[256];
        struct rt_sched_config sc = {
            .layout = &s->layout,
            .layouts = s->rank_layout_ptrs,
            .n_ranks = (int)s->opts->tp,
            .pages_per_rank = rt_link_min_pages(&s->link),
            .max_num_seqs = (int)s->opts->max_num_seqs,
            .max_batched_tokens = (int)s->opts->max_batched_tokens,
            .max_queued = (int)s->opts->max_queued,
        };
        if (rt_sched_init(&s->sched, &sc, err, sizeof(err)) != 0) {
            log_err("cannot start the scheduler: %s", err);
            s->exit_code = 1;
            return;
        }
        s->sched_ready = 1;
        rt_link_require_pages(&s->link, (uint32_t)sc.pages_per_rank);
        publish_cache_config(s, &sc);
        log_info("all %lld workers ready: %d pages per rank",
                 (long long)s->opts->tp, sc.pages_per_rank);
        /* Never advertise a context the pool cannot hold for one request:
         * such a request would be preempted and end without reaching its
         * own limit. */
        int64_t fit = rt_sched_max_tokens(&s->sched);
        if (fit < s->max_model_len) {
            log_warn("max_model_len %d capped to %lld: a KV pool of %d "
                     "pages per rank holds no more tokens of one request "
                     "(raise --kv-memory for the full context)",
                     s->max_model_len, (long long)fit, sc.pages_per_rank);
            s->max_model_len = (int32_t)fit;
            s->api_cfg.max_model_len = s->max_model_len;
        }
    } else {
        log_info("all workers are back; admitting again");
    }
    update_gauges(s);
    notify(s, "READY");
    wake(s);
}

/* ---- drain and signals --------------------------------------------------- */

static void stop_all(struct rt_server *s);

static void begin_drain(struct rt_server *s);

/* tangramd never writes to the pipe: readable means it closed. */
static void notify_cb(uv_poll_t *h, int status, int events)
{
    (void)events;
    struct rt_server *s = h->data;
    char buf[64];
    ssize_t n = status < 0 ? 0 : read((int)s->opts->notify_fd, buf, sizeof(buf));
    if (n > 0)
        return;
    uv_poll_stop(&s->notify_poll);
    if (!s->draining) {
        log_warn("tangramd is gone (notify pipe closed): draining and exiting");
        begin_drain(s);
    }
}

static void tick_cb(uv_timer_t *t)
{
    struct rt_server *s = t->data;
    if (s->exit_code != 0 && !s->stopping) {
        stop_all(s); /* a fatal condition seen inside a callback */
        return;
    }
    notify(s, "WATCHDOG");
    if (s->draining && s->n_reqs == 0 && s->n_jobs == 0 && !s->step_in_flight)
        stop_all(s);
}

static void drain_timeout_cb(uv_timer_t *t)
{
    struct rt_server *s = t->data;
    log_warn("drain: %d requests still running after --shutdown-timeout; "
             "cutting them", s->n_reqs);
    /* Prompts still waiting for a tokenizer thread are not started; the
     * running ones end on their own and the stop waits for them. */
    rt_server__cancel_jobs(s);
    struct rt_req *r = s->reqs, *next;
    for (; r != NULL; r = next) {
        next = r->next;
        if (r->holding) {
            /* Output held for a client that is not reading: drop it and
             * end the stream with the error. */
            r->holding = 0;
            r->no_hold = 1;
            rt_text_mark(&r->text, r->text.out.n);
            r->lp_sent = r->n_out;
            rt_req_deliver(r, RT_FINISH_ERROR, "the server shut down");
        } else if (!r->done) {
            if (r->submitted)
                rt_sched_abort(&s->sched, r->id);
            observe_finish(s, r, RT_FINISH_ERROR);
            r->no_hold = 1;
            rt_req_deliver(r, RT_FINISH_ERROR, "the server shut down");
        }
    }
    reap(s);
    if (!s->step_in_flight && s->n_jobs == 0)
        stop_all(s);
}

static void begin_drain(struct rt_server *s)
{
    if (s->draining) {
        log_warn("second signal: stopping now");
        s->exit_code = 1;
        drain_timeout_cb(&s->drain_timer);
        stop_all(s);
        return;
    }
    s->draining = 1;
    log_info("draining: %d requests in flight, at most %.1f s",
             s->n_reqs, s->opts->shutdown_timeout);
    notify(s, "NOTREADY draining");
    uv_timer_start(&s->drain_timer, drain_timeout_cb,
                   (uint64_t)(s->opts->shutdown_timeout * 1000.0), 0);
    if (s->n_reqs == 0 && s->n_jobs == 0 && !s->step_in_flight)
        stop_all(s);
}

static void signal_cb(uv_signal_t *h, int sig)
{
    (void)sig;
    begin_drain(h->data);
}

static void close_cb(uv_handle_t *h)
{
    (void)h;
}

static void stop_all(struct rt_server *s)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    notify(s, "DRAINED");
    rt_link_shutdown(&s->link, 0, "router stopping");
    rt_http_server_close(&s->http, NULL, NULL);
    rt_grpc_server_close(&s->grpc, NULL, NULL);
    rt_link_close(&s->link);
    uv_timer_stop(&s->tick);
    uv_timer_stop(&s->drain_timer);
    uv_idle_stop(&s->pump);
    uv_close((uv_handle_t *)&s->tick, close_cb);
    uv_close((uv_handle_t *)&s->drain_timer, close_cb);
    uv_close((uv_handle_t *)&s->pump, close_cb);
    uv_close((uv_handle_t *)&s->sig_term, close_cb);
    uv_close((uv_handle_t *)&s->sig_int, close_cb);
    if (s->notify_watch)
        uv_close((uv_handle_t *)&s->notify_poll, close_cb);
}

/* ---- init / free ----------------------------------------------------------- */

/* The page accounting of each tensor-parallel rank, built by the same
 * function as the worker of that rank builds its pool (kv_layout_for_rank:
 * the snake assignment of the profile's groups to T ranks, DESIGN.md §4.7,
 * then the rank's own profile). With T = 1 this is the profile itself. */
static int build_rank_layouts(struct rt_server *s, char *err, size_t errlen)
{
    const struct tg_serve_opts *o = s->opts;
    const int T = (int)o->tp;
    s->rank_layouts = calloc((size_t)T, sizeof(s->rank_layouts[0]));
    s->rank_layout_ptrs = calloc((size_t)T, sizeof(s->rank_layout_ptrs[0]));
    if (s->rank_layouts == NULL || s->rank_layout_ptrs == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "cannot allocate %d rank layouts", T);
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    int rc = 0;
    for (int r = 0; r < T && rc == 0; r++) {
        rc = kv_layout_for_rank(&s->rank_layouts[r], NULL, NULL, &s->profile,
                                T, r, (int)o->page_size,
                                (int)o->prefill_chunk, &rule, err, errlen);
        s->rank_layout_ptrs[r] = &s->rank_layouts[r];
    }
    if (rc == 0)
        rc = kv_layout_for_rank(&s->layout, NULL, NULL, &s->profile, T, 0,
                                (int)o->page_size, (int)o->prefill_chunk,
                                &rule, err, errlen);
    if (rc == 0 && T > 1)
        log_info("tensor parallel over %d ranks: %d KV heads and %d groups "
                 "per layer each", T, s->layout.n_kv_heads,
                 s->layout.n_groups);
    return rc;
}

static int load_model_side(struct rt_server *s, char *err, size_t errlen)
{
    const struct tg_serve_opts *o = s->opts;
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", o->model);
    int rc = mc_model_config_load(&s->mc, path, err, errlen);
    if (rc != 0)
        return rc;
    snprintf(path, sizeof(path), "%s/tokenizer.json", o->model);
    rc = tok_tokenizer_load(&s->tok, path, err, errlen);
    if (rc != 0)
        return rc;
    /* The model's own chat template; a template the engine cannot compile
     * disables chat (400 naming the reason), not the whole server. */
    if (ct_template_load_dir(&s->tmpl, o->model, s->tmpl_error,
                             sizeof(s->tmpl_error)) == 0) {
        s->have_tmpl = 1;
        log_info("chat template %s (tool calls: %s)", s->tmpl.path,
                 ct_tool_format_name(s->tmpl.tool_format));
        const char *u = jj_template_unsupported(s->tmpl.tmpl);
        if (u[0] != '\0')
            log_warn("chat template %s uses a construct this server cannot "
                     "render (%s); requests that reach it fail with 400",
                     s->tmpl.path, u);
    } else {
        log_warn("chat completions disabled: %s", s->tmpl_error);
    }
    /* tangramd forwards "--profile=none" for full KV; "none" and "" both
     * mean no profile, as for the worker. */
    rc = pf_profile_for_model(&s->profile, o->profile, s->mc.num_layers,
                              s->mc.num_kv_heads, s->mc.head_dim,
                              (int)o->heads_per_group, err, errlen);
    if (rc != 0)
        return rc;
    rc = build_rank_layouts(s, err, errlen);
    if (rc != 0)
        return rc;
    int64_t ctx = s->mc.max_position_embeddings;
    if (s->mc.sliding_window > 0 && s->mc.sliding_window < ctx)
        ctx = s->mc.sliding_window;
    if (o->max_model_len > 0 && o->max_model_len < ctx)
        ctx = o->max_model_len;
    s->max_model_len = ctx > INT32_MAX ? INT32_MAX : (int32_t)ctx;
    snprintf(s->model_name, sizeof(s->model_name), "%s", o->served_model_name);
    return 0;
}

int rt_server_init(struct rt_server *s, uv_loop_t *loop,
                   const struct tg_serve_opts *o, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    s->loop = loop;
    s->opts = o;
    s->rng = uv_hrtime() ^ ((uint64_t)getpid() << 32);
    if (getrandom(&s->scope_key, sizeof(s->scope_key), 0) !=
        (ssize_t)sizeof(s->scope_key))
        s->scope_key = splitmix(&s->rng);
    s->started = (int64_t)time(NULL);
    rt_step_init(&s->step);
    int rc = load_model_side(s, err, errlen);
    if (rc != 0)
        goto fail;
    s->api_cfg.served_model = s->model_name;
    s->api_cfg.max_model_len = s->max_model_len;
    s->api_cfg.vocab_size = s->mc.vocab_size;
    s->api_cfg.max_body_bytes = (size_t)o->http_max_body;
    rc = rt_metrics_tangram_init(&s->metrics, (int)o->tp, err, errlen);
    if (rc != 0)
        goto fail;

    struct rt_link_config lc = {
        .endpoint = o->ipc_endpoint,
        .world_size = (int)o->tp,
        .layout = {
            .num_layers = (uint32_t)s->layout.n_layers,
            .groups_per_layer = (uint32_t)s->layout.n_groups,
            .heads_per_group = (uint32_t)s->layout.heads_per_group,
            .page_size = (uint32_t)s->layout.page_size,
            .head_dim = (uint32_t)s->layout.head_dim,
            .pages_total = 1,
            .vocab_size = (uint32_t)s->mc.vocab_size,
        },
        .heartbeat_ms = (uint32_t)o->worker_heartbeat_ms,
        /* T > 1: one all-reduce group; a death ends every rank (the
         * supervisor restarts them together with a new comm id). */
        .shared_fate = o->tp > 1,
        .on_result = on_result,
        .on_dead = on_dead,
        .on_ready = on_ready,
        .ud = s,
    };
    rc = rt_link_init(&s->link, loop, &lc, err, errlen);
    if (rc != 0)
        goto fail;

    struct rt_http_config hc;
    rt_server__http_limits(o, &hc);
    rc = rt_http_server_init(&s->http, loop, &hc, err, errlen);
    if (rc != 0)
        goto fail;
    struct rt_grpc_config gc;
    rt_server__grpc_limits(o, &gc);
    rc = rt_grpc_server_init(&s->grpc, loop, &gc, err, errlen);
    if (rc != 0)
        goto fail;
    return 0;
fail:
    rt_server_discard(s);
    return rc;
}

int rt_server_listen(struct rt_server *s, char *err, size_t errlen)
{
    const struct tg_serve_opts *o = s->opts;
    uv_loop_t *loop = s->loop;
    int rc = rt_http_server_listen(&s->http, o->host, (int)o->http_port, err,
                                   errlen);
    if (rc == 0)
        rc = rt_grpc_server_listen(&s->grpc, o->host, (int)o->grpc_port, err,
                                   errlen);
    if (rc != 0) {
        rt_server_discard(s);
        return rc;
    }

    uv_idle_init(loop, &s->pump);
    s->pump.data = s;
    uv_timer_init(loop, &s->tick);
    s->tick.data = s;
    uv_timer_start(&s->tick, tick_cb, 1000, 1000);
    uv_timer_init(loop, &s->drain_timer);
    s->drain_timer.data = s;
    uv_signal_init(loop, &s->sig_term);
    s->sig_term.data = s;
    uv_signal_start(&s->sig_term, signal_cb, SIGTERM);
    if (o->notify_fd >= 0 && uv_poll_init(loop, &s->notify_poll, (int)o->notify_fd) == 0) {
        s->notify_poll.data = s;
        s->notify_watch = 1;
        uv_poll_start(&s->notify_poll, UV_READABLE | UV_DISCONNECT, notify_cb);
    }
    uv_signal_init(loop, &s->sig_int);
    s->sig_int.data = s;
    uv_signal_start(&s->sig_int, signal_cb, SIGINT);
    log_info("serving %s: HTTP %s:%lld, gRPC %s:%lld, workers at %s, context %d",
             s->model_name, o->host, (long long)o->http_port, o->host,
             (long long)o->grpc_port, s->link.endpoint, s->max_model_len);
    return 0;
}

void rt_server_discard(struct rt_server *s)
{
    /* Nothing has run yet: close what was opened and let the loop finish
     * those closes (the servers are freed only with their handles closed),
     * so a port in use is an error message, never an assertion. */
    rt_http_server_close(&s->http, NULL, NULL);
    rt_grpc_server_close(&s->grpc, NULL, NULL);
    rt_link_close(&s->link);
    s->stopping = 1;
    uv_run(s->loop, UV_RUN_DEFAULT);
    rt_server_free(s);
}

void rt_server_free(struct rt_server *s)
{
    if (!s->stopping)
        rt_link_close(&s->link);
    while (s->reqs != NULL)
        rt_req_drop(s->reqs);
    if (s->sched_ready)
        rt_sched_free(&s->sched);
    rt_step_free(&s->step);
    rt_http_server_free(&s->http);
    rt_grpc_server_free(&s->grpc);
    rt_metrics_tangram_free(&s->metrics);
    kv_layout_free(&s->layout);
    for (int64_t r = 0; s->rank_layouts != NULL && r < s->opts->tp; r++)
        kv_layout_free(&s->rank_layouts[r]);
    free(s->rank_layouts);
    free(s->rank_layout_ptrs);
    s->rank_layouts = NULL;
    s->rank_layout_ptrs = NULL;
    pf_profile_free(&s->profile);
    tok_tokenizer_free(&s->tok);
    ct_template_free(&s->tmpl);
    s->have_tmpl = 0;
    s->sched_ready = 0;
}
