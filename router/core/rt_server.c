/* rt_server.c — the router's core: requests, the step loop, drain (see
 * rt_server.h). The network servers and the front ends on them are the
 * app's (router/app/rt_app.h); nothing here calls into them, only the
 * hooks the app registered. */
#include "router/core/rt_server_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/kv/kv_layout.h"
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "common/base/tg_path.h"
#include "router/core/rt_metrics_info.h"

double rt_server_now(const struct rt_server *s)
{
    return (double)uv_hrtime() / 1e9 + 0.0 * (double)(s != NULL);
}

uint64_t rt_server__splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t rt_server_random(struct rt_server *s)
{
    return rt_server__splitmix(&s->rng);
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

void rt_server_set_respstore(struct rt_server *s, struct rt_respstore *st)
{
    s->respstore = st;
}

struct rt_respstore *rt_server_respstore(const struct rt_server *s)
{
    return s->respstore;
}

const int32_t *rt_req_prompt_ids(const struct rt_req *r)
{
    return r->core->prompt;
}

const int32_t *rt_req_out_ids(const struct rt_req *r)
{
    return r->core->out_ids;
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

int rt_server_draining(const struct rt_server *s)
{
    return s->draining;
}

const struct rt_server_info *rt_server_info(const struct rt_server *s)
{
    return &s->info;
}

const struct tg_serve_opts *rt_server_opts(const struct rt_server *s)
{
    return s->opts;
}

const struct tok_tokenizer *rt_server_tok(const struct rt_server *s)
{
    return &s->tok;
}

struct rt_metrics_tangram *rt_server_metrics(struct rt_server *s)
{
    return &s->metrics;
}

void rt_server_set_reqmem(struct rt_server *s, struct rt_reqmem *m)
{
    s->reqmem = m;
}

struct rt_reqmem *rt_server_reqmem(const struct rt_server *s)
{
    return s->reqmem;
}

int rt_server_exit_code(const struct rt_server *s)
{
    return s->exit_code;
}

const char *rt_server_link_endpoint(const struct rt_server *s)
{
    return s->link.endpoint;
}

int rt_server_stalled_rank(const struct rt_server *s, int64_t *ms)
{
    int64_t late = 2 * s->opts->worker_heartbeat_ms;
    for (int r = 0; r < (int)s->opts->tp; r++) {
        int64_t quiet = rt_link_rank_silence_ms(&s->link, r);
        if (quiet > late) {
            *ms = quiet;
            return r;
        }
    }
    return -1;
}

struct rt_req *
rt_server_find_req(struct rt_server *s,
                   int (*match)(const struct rt_req *r, void *ud), void *ud)
{
    for (struct rt_req *r = s->reqs; r != NULL; r = r->core->next)
        if (!r->core->done && match(r, ud))
            return r;
    return NULL;
}

static int is_stop_token(const struct rt_req *r, int32_t tok)
{
    const struct rt_server *s = r->srv;
    if (!r->q.opts.ignore_eos) {
        for (int i = 0; i < s->mc.n_eos; i++)
            if (tok == s->mc.eos_token_ids[i])
                return 1;
        for (int i = 0; i < s->tok.n_eos; i++)
            if (tok == s->tok.eos_ids[i])
                return 1;
    }
    for (size_t i = 0; i < r->q.opts.n_stop_token_ids; i++)
        if (tok == r->q.opts.stop_token_ids[i])
            return 1;
    return 0;
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
                                 now - r->core->t_arrival);
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
        if (r == NULL || r->core->done)
            continue;
        r->cached_tokens = ev->cached_prompt_tokens;
        enum rt_finish fin = finish_of(ev->finish);
        if (fin != RT_FINISH_NONE) {
            if (fin != RT_FINISH_STOP || !r->core->text.stopped)
                rt_text_finish(&r->core->text);
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
void rt_server__drain_check(struct rt_server *s)
{
    if (s->draining && !s->stopping && s->n_reqs == 0 && s->n_jobs == 0 &&
        !s->step_in_flight)
        uv_timer_start(&s->tick, tick_cb, 0, 1000);
}

void rt_server__jobs_changed(struct rt_server *s)
{
    rt_server__drain_check(s);
}

/* Frees requests that finished (after the step that referenced them). */
static void reap(struct rt_server *s)
{
    struct rt_req *r = s->reqs, *next;
    for (; r != NULL; r = next) {
        next = r->core->next;
        if (r->core->done && !r->core->in_step && !r->core->in_deliver &&
            r->core->job == NULL)
            rt_req_drop(r);
    }
    rt_server__drain_check(s);
}

void rt_req_cancel(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    if (r->core->job != NULL)
        rt_encode_job_cancel(r->core->job); /* r is freed when the job ends */
    if (r->core->done) {
        if (!r->core->in_step && r->core->job == NULL)
            rt_req_drop(r);
        rt_server__drain_check(s);
        return;
    }
    r->core->done = 1;
    /* A held request already left the scheduler and was counted. */
    if (r->core->submitted && !r->core->holding) {
        rt_sched_abort(&s->sched, r->id); /* frees its pages at once */
        observe_finish(s, r, RT_FINISH_ABORT);
    }
    if (!r->core->in_step && !r->core->in_deliver && r->core->job == NULL)
        rt_req_drop(r);
    rt_server__drain_check(s);
    rt_server__wake(s);
}

void rt_server__fail(struct rt_req *r, const char *why)
{
    struct rt_server *s = r->srv;
    if (r->core->done || r->core->holding)
        return;
    if (r->core->submitted)
        rt_sched_abort(&s->sched, r->id); /* frees its pages at once */
    rt_text_finish(&r->core->text);
    observe_finish(s, r, RT_FINISH_ERROR);
    rt_req_deliver(r, RT_FINISH_ERROR, why);
    if (r->core->done && !r->core->in_step && !r->core->in_deliver &&
        r->core->job == NULL)
        rt_req_drop(r);
    rt_server__drain_check(s);
    rt_server__wake(s);
}

void rt_req_abort(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    if (r->core->done || r->core->holding)
        return;
    if (r->core->submitted)
        rt_sched_abort(&s->sched, r->id);
    if (r->core->job != NULL)
        rt_encode_job_cancel(r->core->job); /* r is freed when the job ends */
    observe_finish(s, r, RT_FINISH_ABORT);
    rt_req_deliver(r, RT_FINISH_ABORT, NULL);
    if (!r->core->in_step && !r->core->in_deliver && r->core->job == NULL)
        rt_req_drop(r);
    rt_server__wake(s);
}

static void pump_cb(uv_idle_t *h);

void rt_server__wake(struct rt_server *s)
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
        rt_metrics_gauge_set(s->metrics.kv_pages_capacity[rk], (double)pg.total);
        rt_metrics_gauge_set(s->metrics.kv_pages_cached[rk], (double)pg.cached);
        double rel = (double)pg.released -
                     rt_metrics_series_value(s->metrics.kv_pages_released[rk]);
        if (rel > 0)
            rt_metrics_counter_add(s->metrics.kv_pages_released[rk], rel);
        used += (double)pg.used;
        total += (double)pg.total;
        mono += (double)pg.monolithic;
    }
    rt_server__tier_gauges(s);
    rt_server__grammar_gauges(s);
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
    double t0 = rt_server_now(s);
    char err[256];
    int rc = rt_sched_plan(&s->sched, &s->step, err, sizeof(err));
    if (rc != 0) {
        log_err("scheduler: %s", err);
        return;
    }
    handle_events(s, "the scheduler could not keep the request");
    rt_server__tier_send(s);
    reap(s);
    update_gauges(s);
    if (s->step.n_entries == 0)
        return;
    for (int32_t i = 0; i < s->step.n_entries; i++)
        ((struct rt_req *)s->step.entries[i].user)->core->in_step = 1;
    rc = rt_link_send_plan(&s->link, &s->step, err, sizeof(err));
    if (rc != 0) {
        log_err("cannot send step %llu: %s",
                (unsigned long long)s->step.step_id, err);
        rt_sched_fail_running(&s->sched, &s->step);
        for (int32_t i = 0; i < s->step.n_entries; i++)
            ((struct rt_req *)s->step.entries[i].user)->core->in_step = 0;
        handle_events(s, err);
        reap(s);
        return;
    }
    s->step_in_flight = 1;
    s->step_t0 = t0;
    s->step_plan_s = rt_server_now(s) - t0;
}

/* Rank 0's tokens came back (or the step failed). */
static void handle_result(struct rt_server *s, const struct rt_link_result *res)
{
    s->step_in_flight = 0;
    rt_metrics_histogram_observe(s->metrics.scheduler_step_seconds, res->step_seconds);
    /* Head lengths that do not fit the router's accounting make the result
     * malformed: the worker's KV and the router's disagree. */
    char herr[320];
    const char *error = res->error;
    if (res->ok && rt_sched_check_heads(&s->sched, &s->step, res->heads,
                                        res->n_heads, herr,
                                        sizeof(herr)) != 0)
        error = herr;
    if (!res->ok || error == herr) {
        log_err("step %llu failed: %s", (unsigned long long)res->step_id, error);
        rt_sched_fail_running(&s->sched, &s->step);
        for (int32_t i = 0; i < s->step.n_entries; i++)
            ((struct rt_req *)s->step.entries[i].user)->core->in_step = 0;
        handle_events(s, error);
        reap(s);
        update_gauges(s);
        rt_server__wake(s);
        return;
    }
    double now = rt_server_now(s);
    int32_t n = s->step.n_entries;
    /* A request the worker could not sample for fails alone: it leaves the
     * scheduler now (its pages freed, nothing stored), so complete skips
     * its entry, and every other request goes on. */
    for (int32_t i = 0; i < n; i++) {
        struct rt_req *r = s->step.entries[i].user;
        if (res->entries[i].error == NULL || r->core->done)
            continue;
        log_warn("request %s failed on the worker: %s", r->id_str,
                 res->entries[i].error);
        rt_sched_abort(&s->sched, r->id);
        rt_text_finish(&r->core->text);
        observe_finish(s, r, RT_FINISH_ERROR);
        rt_req_deliver(r, RT_FINISH_ERROR, res->entries[i].error);
    }
    /* Prompt log-probabilities of the step's chunks. */
    for (int32_t i = 0; i < n; i++) {
        struct rt_req *r = s->step.entries[i].user;
        if (res->entries[i].plp != NULL && !r->core->done)
            rt_server__plp_take(r, res->entries[i].plp);
    }
    uint8_t *stop = calloc((size_t)n + 1, 1);
    for (int32_t i = 0; i < n; i++) {
        const struct rt_step_entry *en = &s->step.entries[i];
        struct rt_req *r = en->user;
        r->core->in_step = 0;
        if (!en->sample || r->core->done || res->tokens[i] < 0)
            continue;
        if (r->q.opts.prompt_only)
            continue; /* max_tokens 0: the draw is dropped, max_tokens 1
                         ends it */
        const struct rt_link_token *lt = &res->entries[i];
        int32_t tok = res->tokens[i];
        if (r->n_out < r->core->cap_out) {
            r->core->out_ids[r->n_out] = tok;
            r->core->out_lps[r->n_out] = lt->logprob;
            for (int k = 0; k < r->core->n_top; k++) {
                int have = (size_t)k < lt->n_top;
                r->core->out_top_ids[(size_t)r->n_out * r->core->n_top + k] =
                    have ? (int32_t)lt->top_ids[k] : -1;
                r->core->out_top_lps[(size_t)r->n_out * r->core->n_top + k] =
                    have ? lt->top_logprobs[k] : -INFINITY;
            }
            r->n_out++;
        }
        if (r->n_out == 1) {
            r->core->t_first = now;
            rt_metrics_histogram_observe(s->metrics.time_to_first_token_seconds,
                                         now - r->core->t_arrival);
        } else {
            rt_metrics_histogram_observe(s->metrics.inter_token_latency_seconds,
                                         now - r->core->t_last);
        }
        r->core->t_last = now;
        rt_metrics_counter_inc(s->metrics.generation_tokens_total);
        int hit = 0;
        int eos = is_stop_token(r, tok);
        if (!eos || r->q.opts.include_stop_str_in_output)
            rt_text_push(&r->core->text, tok, &hit);
        if (r->n_out > r->q.opts.min_tokens || r->q.opts.min_tokens <= 0)
            stop[i] = (uint8_t)(eos || hit);
    }
    char err[256];
    int rc = rt_sched_complete_heads(&s->sched, &s->step, res->tokens, stop,
                                     res->heads, res->n_heads, err,
                                     sizeof(err));
    free(stop);
    if (rc != 0)
        log_err("scheduler complete: %s", err);
    handle_events(s, NULL);
    /* Requests still running get their new text as it becomes safe. */
    for (int32_t i = 0; i < n; i++) {
        struct rt_req *r = s->step.entries[i].user;
        if (!r->core->done)
            rt_req_deliver(r, RT_FINISH_NONE, NULL);
    }
    reap(s);
    update_gauges(s);
    rt_server__wake(s);
}

/* The step's time: its wall time, and the host work in it (the router's
 * plan and result handling, the busiest worker's report). */
static void on_result(void *ud, const struct rt_link_result *res)
{
    struct rt_server *s = ud;
    double t = rt_server_now(s);
    handle_result(s, res);
    double t1 = rt_server_now(s);
    struct rt_metrics_tangram *m = &s->metrics;
    rt_metrics_counter_add(m->step_seconds_total, t1 - s->step_t0);
    rt_metrics_counter_add(m->step_router_host_seconds_total,
                           s->step_plan_s + (t1 - t));
    if (res->host_seconds > 0)
        rt_metrics_counter_add(m->step_worker_host_seconds_total,
                               res->host_seconds);
}

static void on_dead(void *ud, int rank)
{
    struct rt_server *s = ud;
    char msg[64];
    snprintf(msg, sizeof(msg), "NOTREADY rank %d died", rank);
    log_err("worker rank %d is dead; running requests fail", rank);
    notify(s, msg);
    /* Its host tier died with it: those conversations are forgotten, and
     * requests waiting for a restore are prefilled from scratch. */
    if (s->sched_ready)
        rt_sched_tier_lost(&s->sched);
    /* A step in flight was already failed through on_result. Otherwise the
     * running requests' KV died with the worker: fail them now rather than
     * on the next step. */
    if (s->sched_ready && !s->step_in_flight) {
        rt_sched_fail_running(&s->sched, &s->step);
        handle_events(s, "a worker died");
        reap(s);
        update_gauges(s);
    }
    /* Rank 0 held the prepared grammars (the other ranks hold none). */
    if (rank == 0)
        rt_server__grammar_lost(s);
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
            .per_head = rt_link_per_head(&s->link),
            .host_pages_per_rank = rt_link_min_host_pages(&s->link),
            .trig = s->rank_trig_ptrs, /* NULL without trig */
        };
        if (rt_sched_init(&s->sched, &sc, err, sizeof(err)) != 0) {
            log_err("cannot start the scheduler: %s", err);
            s->exit_code = 1;
            return;
        }
        s->sched_ready = 1;
        rt_link_require_pages(&s->link, (uint32_t)sc.pages_per_rank);
        rt_link_require_host_pages(&s->link,
                                   (uint32_t)sc.host_pages_per_rank);
        if (sc.host_pages_per_rank > 0)
            log_info("host tier: %d pages per rank (%lld MiB)",
                     sc.host_pages_per_rank,
                     (long long)((int64_t)sc.host_pages_per_rank *
                                 rt_link_page_bytes(&s->link) >> 20));
        publish_cache_config(s, &sc);
        log_info("all %lld workers ready: %d pages per rank",
                 (long long)s->opts->tp, sc.pages_per_rank);
        /* Never advertise a context the pool cannot hold for one request:
         * such a request would be preempted and end without reaching its
         * own limit. */
        int64_t fit = rt_sched_max_tokens(&s->sched);
        if (fit < s->info.max_model_len) {
            log_warn("max_model_len %d capped to %lld: a KV pool of %d "
                     "pages per rank holds no more tokens of one request "
                     "(raise --kv-memory for the full context)",
                     s->info.max_model_len, (long long)fit, sc.pages_per_rank);
            s->info.max_model_len = (int32_t)fit;
        }
    } else {
        log_info("all workers are back; admitting again");
    }
    /* Grammars requests wait for, prepared on the (new) rank 0. */
    rt_server__grammar_flush(s);
    update_gauges(s);
    notify(s, "READY");
    rt_server__wake(s);
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
        next = r->core->next;
        if (r->core->holding) {
            /* Output held for a client that is not reading: drop it and
             * end the stream with the error. */
            r->core->holding = 0;
            r->core->no_hold = 1;
            rt_text_mark(&r->core->text, r->core->text.out.len);
            r->core->lp_sent = r->n_out;
            rt_req_deliver(r, RT_FINISH_ERROR, "the server shut down");
        } else if (!r->core->done) {
            if (r->core->submitted)
                rt_sched_abort(&s->sched, r->id);
            observe_finish(s, r, RT_FINISH_ERROR);
            r->core->no_hold = 1;
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
    if (s->hooks.close != NULL)
        s->hooks.close(s->hooks.ud);
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
    TG_TRY(tg_path_fmt(path, sizeof(path), err, errlen, "%s/config.json",
                       o->model));
    int rc = mc_model_config_load(&s->mc, path, err, errlen);
    if (rc != 0)
        return rc;
    TG_TRY(tg_path_fmt(path, sizeof(path), err, errlen, "%s/tokenizer.json",
                       o->model));
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
    char warn[768];
    rc = pf_profile_for_model(&s->profile, o->profile, &s->mc,
                              (int)o->heads_per_group, o->profile_force,
                              warn, sizeof(warn), err, errlen);
    if (rc != 0)
        return rc;
    if (warn[0] != '\0')
        log_warn("%s", warn);
    rc = build_rank_layouts(s, err, errlen);
    if (rc == 0)
        rc = rt_server__trig_init(s, err, errlen);
    if (rc != 0)
        return rc;
    int64_t ctx = s->mc.max_position_embeddings;
    if (s->mc.sliding_window > 0 && s->mc.sliding_window < ctx)
        ctx = s->mc.sliding_window;
    if (o->max_model_len > 0 && o->max_model_len < ctx)
        ctx = o->max_model_len;
    s->info.max_model_len = ctx > INT32_MAX ? INT32_MAX : (int32_t)ctx;
    /* The name clients must send: cut, it would refuse the whole one. */
    if (strlen(o->served_model_name) >= sizeof(s->model_name))
        return tg_err_set(err, errlen, TG_ETOOBIG,
                          "--served-model-name '%.64s...' is %zu bytes; at "
                          "most %zu are served",
                          o->served_model_name, strlen(o->served_model_name),
                          sizeof(s->model_name) - 1);
    snprintf(s->model_name, sizeof(s->model_name), "%s", o->served_model_name);
    s->info.model_name = s->model_name;
    s->info.vocab_size = s->mc.vocab_size;
    s->info.num_layers = s->mc.num_layers;
    s->info.num_kv_heads = s->mc.num_kv_heads;
    s->info.head_dim = s->mc.head_dim;
    s->info.page_size = s->layout.page_size;
    s->info.heads_per_group = s->layout.heads_per_group;
    s->info.tool_format = s->have_tmpl ? s->tmpl.tool_format : CT_TOOLS_NONE;
    s->info.chat = s->have_tmpl != 0;
    s->info.thinks = s->have_tmpl && s->tmpl.source != NULL &&
                     strstr(s->tmpl.source, "<think>") != NULL;
    return 0;
}

int rt_server_init(struct rt_server **out, uv_loop_t *loop,
                   const struct tg_serve_opts *o, char *err, size_t errlen)
{
    *out = NULL;
    struct rt_server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "cannot allocate the router's core");
    s->loop = loop;
    s->opts = o;
    s->rng = uv_hrtime() ^ ((uint64_t)getpid() << 32);
    if (getrandom(&s->scope_key, sizeof(s->scope_key), 0) !=
        (ssize_t)sizeof(s->scope_key))
        s->scope_key = rt_server__splitmix(&s->rng);
    s->info.started = (int64_t)time(NULL);
    rt_step_init(&s->step);
    rt_gpreps_init(&s->gpreps, (int32_t)o->max_grammar_compiles,
                   RT_SERVER_GRAMMAR_KEEP);
    int rc = load_model_side(s, err, errlen);
    if (rc != 0)
        goto fail;
    rc = rt_metrics_tangram_init(&s->metrics, (int)o->tp, err, errlen);
    if (rc == 0)
        rc = rt_metrics_tier_init(&s->tier_metrics, &s->metrics.reg,
                                  (int)o->tp, err, errlen);
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
        .stall_ms = (uint32_t)o->worker_stall_ms,
        /* T > 1: one all-reduce group; a death ends every rank (the
         * supervisor restarts them together with a new comm id). */
        .shared_fate = o->tp > 1,
        .on_result = on_result,
        .on_dead = on_dead,
        .on_ready = on_ready,
        .on_tier = rt_server__on_tier,
        .on_grammar = rt_server__on_grammar,
        .ud = s,
    };
    rc = rt_link_init(&s->link, loop, &lc, err, errlen);
    if (rc != 0)
        goto fail;
    *out = s;
    return 0;
fail:
    rt_server_discard(s);
    return rc;
}

void rt_server_set_hooks(struct rt_server *s, const struct rt_server_hooks *h)
{
    s->hooks = *h;
}

void rt_server_scrape(struct rt_server *s)
{
    if (s->hooks.scrape != NULL)
        s->hooks.scrape(s->hooks.ud);
}

void rt_server_start(struct rt_server *s)
{
    const struct tg_serve_opts *o = s->opts;
    uv_loop_t *loop = s->loop;
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
}

void rt_server_discard(struct rt_server *s)
{
    /* Nothing has run yet: close what was opened and let the loop finish
     * those closes (the app's servers, closed by the app before, are freed
     * only with their handles closed), so a port in use is an error
     * message, never an assertion. */
    rt_link_close(&s->link);
    s->stopping = 1;
    uv_run(s->loop, UV_RUN_DEFAULT);
    rt_server_free(s);
}

void rt_server_free(struct rt_server *s)
{
    if (s == NULL)
        return;
    if (!s->stopping)
        rt_link_close(&s->link);
    while (s->reqs != NULL)
        rt_req_drop(s->reqs);
    rt_gpreps_free(&s->gpreps);
    if (s->sched_ready)
        rt_sched_free(&s->sched);
    rt_step_free(&s->step);
    rt_metrics_tier_free(&s->tier_metrics);
    rt_metrics_tangram_free(&s->metrics);
    kv_layout_free(&s->layout);
    for (int64_t r = 0; s->rank_layouts != NULL && r < s->opts->tp; r++)
        kv_layout_free(&s->rank_layouts[r]);
    free(s->rank_layouts);
    free(s->rank_layout_ptrs);
    rt_server__trig_free(s);
    s->rank_layouts = NULL;
    s->rank_layout_ptrs = NULL;
    pf_profile_free(&s->profile);
    tok_tokenizer_free(&s->tok);
    ct_template_free(&s->tmpl);
    free(s);
}
