/* rt_metrics_tangram.c — the tangram metric set (rt_metrics_tangram.h). */
#include "router/core/rt_metrics_tangram.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

/* ---- bucket bounds ---------------------------------------------------- */

/* Bucket bounds copied from vLLM's PrometheusStatLogger
 * (vllm/v1/metrics/loggers.py): histogram_time_to_first_token,
 * histogram_time_per_output_token (which vLLM's
 * vllm:inter_token_latency_seconds shares) and request_latency_buckets
 * (vllm:e2e_request_latency_seconds). Same numbers, so dashboards and SLO
 * queries written for vLLM (le="0.1", ...) work on tangram unchanged. */
const double rt_metrics_ttft_bounds[] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
};
const int rt_metrics_ttft_n_bounds =
    (int)(sizeof(rt_metrics_ttft_bounds) / sizeof(rt_metrics_ttft_bounds[0]));

const double rt_metrics_itl_bounds[] = {
    0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4,  0.5,
    0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0,
};
const int rt_metrics_itl_n_bounds =
    (int)(sizeof(rt_metrics_itl_bounds) / sizeof(rt_metrics_itl_bounds[0]));

const double rt_metrics_e2e_bounds[] = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
};
const int rt_metrics_e2e_n_bounds =
    (int)(sizeof(rt_metrics_e2e_bounds) / sizeof(rt_metrics_e2e_bounds[0]));

/* Ours (vLLM has no per-step histogram): 1-2.5-5 steps per decade from
 * 100 us, where a tiny CPU decode step lands, to 10 s, a long prefill
 * chunk of a big model on a slow backend. */
const double rt_metrics_step_bounds[] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0,
};
const int rt_metrics_step_n_bounds =
    (int)(sizeof(rt_metrics_step_bounds) / sizeof(rt_metrics_step_bounds[0]));

static const char *const finish_names[RT_METRICS_FINISH_COUNT] = {
    [RT_METRICS_FINISH_STOP] = "stop",
    [RT_METRICS_FINISH_LENGTH] = "length",
    [RT_METRICS_FINISH_ABORT] = "abort",
    [RT_METRICS_FINISH_ERROR] = "error",
};

const char *rt_metrics_finish_name(enum rt_metrics_finish r)
{
    if ((int)r < 0 || r >= RT_METRICS_FINISH_COUNT)
        return NULL;
    return finish_names[r];
}

void rt_metrics_tangram_free(struct rt_metrics_tangram *m)
{
    if (m == NULL)
        return;
    rt_metrics_registry_free(&m->reg);
    free(m->kv_pages_used);
    free(m->kv_pages_capacity);
    free(m->kv_pages_cached);
    free(m->kv_pages_released);
    memset(m, 0, sizeof(*m));
}

/* One unlabelled metric of the set. */
struct single_def {
    const char *name;
    const char *help;
    enum rt_metrics_type type;
    const double *bounds;
    const int *n_bounds;
    size_t slot; /* offsetof the handle in struct rt_metrics_tangram */
};

#define SLOT(field) offsetof(struct rt_metrics_tangram, field)

/* Names mirror vLLM's (vllm: prefix -> tangram_, DESIGN.md §5); help texts
 * are ours. */
static const struct single_def single_defs[] = {
    {"tangram_num_requests_running",
     "Number of requests in the running batch (prefilling or decoding).",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(num_requests_running)},
    {"tangram_num_requests_waiting", "Number of requests queued for admission.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(num_requests_waiting)},
    {"tangram_tokenize_jobs_in_flight",
     "Request jobs on the router's thread pool, queued or running: large "
     "bodies parsed, prompts rendered and tokenized, /tokenize answers "
     "formatted.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(tokenize_jobs_in_flight)},
    {"tangram_kv_cache_usage_perc",
     "Fraction of KV-cache pages in use over all ranks (1 = full).",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(kv_cache_usage_perc)},
    {"tangram_kv_pages_reclaimed_ratio",
     "Fraction of the pages an all-heads (monolithic) layout would hold for "
     "the live requests that ragged per-head paging saves.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(kv_pages_reclaimed_ratio)},
    {"tangram_prompt_tokens_total", "Number of prompt tokens received.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(prompt_tokens_total)},
    {"tangram_generation_tokens_total", "Number of tokens generated.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(generation_tokens_total)},
    {"tangram_cached_prompt_tokens_total",
     "Number of prompt tokens served from stored multi-turn KV instead of "
     "being prefilled.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(cached_prompt_tokens_total)},
    {"tangram_num_preemptions_total",
     "Number of requests preempted (to be recomputed) because a page pool "
     "ran dry.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(num_preemptions_total)},
    {"tangram_time_to_first_token_seconds",
     "Histogram of time from arrival to first token, in seconds.",
     RT_METRICS_HISTOGRAM, rt_metrics_ttft_bounds, &rt_metrics_ttft_n_bounds,
     SLOT(time_to_first_token_seconds)},
    {"tangram_inter_token_latency_seconds",
     "Histogram of time between consecutive output tokens, in seconds.",
     RT_METRICS_HISTOGRAM, rt_metrics_itl_bounds, &rt_metrics_itl_n_bounds,
     SLOT(inter_token_latency_seconds)},
    {"tangram_e2e_request_latency_seconds",
     "Histogram of time from arrival to completion, in seconds.",
     RT_METRICS_HISTOGRAM, rt_metrics_e2e_bounds, &rt_metrics_e2e_n_bounds,
     SLOT(e2e_request_latency_seconds)},
    {"tangram_http_connections_open",
     "Open HTTP connections (closing ones excluded).", RT_METRICS_GAUGE, NULL,
     NULL, SLOT(http_connections_open)},
    {"tangram_http_connections_evicted_total",
     "HTTP connections closed to make room for a new one at "
     "--http-max-connections or --http-max-connections-per-ip: idle ones "
     "first, then the slowest incomplete request heads, then the slowest "
     "incomplete request bodies.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(http_connections_evicted_total)},
    {"tangram_http_slow_heads_evicted_total",
     "HTTP connections in the middle of a request head closed (408) to "
     "make room for a new one because nothing was idle; the slowest head "
     "goes first.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(http_slow_heads_evicted_total)},
    {"tangram_http_slow_bodies_evicted_total",
     "HTTP connections in the middle of a request body closed (408) to "
     "make room for a new one because nothing was idle and no head was "
     "arriving; the slowest body goes first.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(http_slow_bodies_evicted_total)},
    {"tangram_http_slow_readers_aborted_total",
     "HTTP connections cut because the client read none of its response "
     "for --http-send-timeout; their requests were aborted.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(http_slow_readers_aborted_total)},
    {"tangram_scheduler_step_seconds",
     "Histogram of scheduler step time (plan sent to result received), in "
     "seconds.",
     RT_METRICS_HISTOGRAM, rt_metrics_step_bounds, &rt_metrics_step_n_bounds,
     SLOT(scheduler_step_seconds)},
    {"tangram_grpc_connections", "Open gRPC (HTTP/2) connections.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(grpc_connections)},
    {"tangram_grpc_receive_timeouts_total",
     "gRPC streams reset because the request did not arrive within "
     "--grpc-recv-timeout (and header blocks left unfinished).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_receive_timeouts_total)},
    {"tangram_grpc_idle_closes_total",
     "gRPC connections closed after --grpc-idle-timeout without a call in "
     "progress.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_idle_closes_total)},
    {"tangram_grpc_deadline_exceeded_total",
     "gRPC calls ended by the client's deadline (grpc-timeout).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_deadline_exceeded_total)},
    {"tangram_grpc_refused_streams_total",
     "gRPC streams refused over --grpc-max-streams on their connection.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_refused_streams_total)},
    {"tangram_grpc_oversized_messages_total",
     "gRPC request messages refused over --grpc-max-message.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_oversized_messages_total)},
    {"tangram_grpc_unauthenticated_total",
     "gRPC calls refused for a missing or wrong API key.", RT_METRICS_COUNTER,
     NULL, NULL, SLOT(grpc_unauthenticated_total)},
    {"tangram_grpc_connections_evicted_total",
     "Idle gRPC connections closed (GOAWAY) to make room for a new one at "
     "--grpc-max-connections or --grpc-max-connections-per-ip.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_connections_evicted_total)},
    {"tangram_request_body_memory_bytes",
     "Request body bytes (HTTP bodies, gRPC messages) the router holds, "
     "counted against --max-body-memory.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(request_body_memory_bytes)},
    {"tangram_request_body_memory_refused_total",
     "Requests refused (HTTP 503, gRPC UNAVAILABLE) because their body "
     "did not fit in --max-body-memory.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(request_body_memory_refused_total)},
    {"tangram_request_memory_bytes",
     "Bytes of --max-request-memory taken by large requests between their "
     "parse and their tokens (an estimate of their parsed JSON, rendered "
     "chat and tokenizer scratch, taken before they are parsed).",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(request_memory_bytes)},
    {"tangram_request_memory_waiting",
     "HTTP requests whose body waits for room in --max-request-memory "
     "before it is parsed.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(request_memory_waiting)},
    {"tangram_request_memory_refused_total",
     "Requests refused by --max-request-memory: more than the whole "
     "budget (HTTP 413), or no room for a gRPC call (UNAVAILABLE).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(request_memory_refused_total)},
    {"tangram_step_seconds_total",
     "Wall time of the scheduler's steps, from forming the plan to its "
     "result handled, in seconds.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(step_seconds_total)},
    {"tangram_step_router_host_seconds_total",
     "Router host work of the steps, in seconds: forming and encoding the "
     "plan, handling the result (tokens, text, streaming).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(step_router_host_seconds_total)},
    {"tangram_step_worker_host_seconds_total",
     "Worker host work of the steps (per step the most of any rank), in "
     "seconds: a step's time on the worker outside the backend's calls "
     "(plan decode and validation, slot and block-table bookkeeping, result "
     "encode).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(step_worker_host_seconds_total)},
    {"tangram_grammar_requests_waiting",
     "Requests with an output constraint waiting, outside the scheduler, "
     "for worker rank 0 to have their grammar ready.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(grammar_requests_waiting)},
    {"tangram_grammar_prepares_pending",
     "Grammars asked of worker rank 0 and not ready yet (compiling or "
     "queued): at most --max-grammar-compiles.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(grammar_prepares_pending)},
    {"tangram_grammar_prepares_total",
     "Grammars asked of worker rank 0 to prepare (output constraints not "
     "held ready already).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grammar_prepares_total)},
    {"tangram_grammar_prepare_failures_total",
     "Grammar prepares rank 0 answered failed (the request got 400, or 429 "
     "when its compile queue was full).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grammar_prepare_failures_total)},
    {"tangram_grammar_prepares_refused_total",
     "Requests refused with 429 grammar_queue_full because "
     "--max-grammar-compiles grammars were pending.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grammar_prepares_refused_total)},
};

/* One labelled counter family of the set: one series per value of its
 * label, handles in the array at `slot`. */
struct labelled_def {
    const char *name;
    const char *help;
    const char *label;
    const char *const *values; /* (n) */
    int n;
    size_t slot;               /* offsetof the handle array */
};

static const char *const http_reject_names[RT_METRICS_HTTP_REJECT_COUNT] = {
    [RT_METRICS_HTTP_REJECT_MAX] = "max_connections",
    [RT_METRICS_HTTP_REJECT_PER_IP] = "max_connections_per_ip",
};
static const char *const http_timeout_names[RT_METRICS_HTTP_TIMEOUT_COUNT] = {
    [RT_METRICS_HTTP_TIMEOUT_HEADER] = "header",
    [RT_METRICS_HTTP_TIMEOUT_BODY] = "body",
    [RT_METRICS_HTTP_TIMEOUT_BODY_RATE] = "body_rate",
};
static const char *const http_refuse_names[RT_METRICS_HTTP_REFUSE_COUNT] = {
    [RT_METRICS_HTTP_REFUSE_UNAUTH] = "unauthenticated",
    [RT_METRICS_HTTP_REFUSE_MALFORMED] = "malformed",
    [RT_METRICS_HTTP_REFUSE_TOO_LARGE] = "too_large",
    [RT_METRICS_HTTP_REFUSE_BODY_MEMORY] = "body_memory",
};
static const char *const api_names[RT_METRICS_API_COUNT] = {
    [RT_METRICS_API_HTTP] = "http",
    [RT_METRICS_API_GRPC] = "grpc",
};

static const struct labelled_def labelled_defs[] = {
    {"tangram_http_connections_rejected_total",
     "New HTTP connections refused (503) at a connection limit, by limit.",
     "reason", http_reject_names, RT_METRICS_HTTP_REJECT_COUNT,
     SLOT(http_connections_rejected_total)},
    {"tangram_http_requests_timed_out_total",
     "HTTP requests answered 408 because their head or body did not "
     "arrive in time, or their body arrived under --http-min-body-rate "
     "(body_rate), by phase.",
     "phase", http_timeout_names, RT_METRICS_HTTP_TIMEOUT_COUNT,
     SLOT(http_requests_timed_out_total)},
    {"tangram_http_requests_refused_total",
     "HTTP requests refused before their body was read: without a valid "
     "API key (401), malformed (400, 501, 505), too large (413, 431) or "
     "over the body memory budget (503).",
     "reason", http_refuse_names, RT_METRICS_HTTP_REFUSE_COUNT,
     SLOT(http_requests_refused_total)},
    {"tangram_grpc_connections_rejected_total",
     "New gRPC connections refused (GOAWAY) at a connection limit, by "
     "limit.",
     "reason", http_reject_names, RT_METRICS_HTTP_REJECT_COUNT,
     SLOT(grpc_connections_rejected_total)},
    {"tangram_accept_pauses_total",
     "Times accepting new connections paused because the process ran out "
     "of file descriptors (or memory), by API.",
     "api", api_names, RT_METRICS_API_COUNT, SLOT(accept_pauses_total)},
    {"tangram_probe_reserve_connections_total",
     "New connections that arrived while every connection was busy and "
     "took a place of the probe reserve, where only health checks (HTTP "
     "/health and /metrics, gRPC Health/Check) are served, by API.",
     "api", api_names, RT_METRICS_API_COUNT,
     SLOT(probe_reserve_connections_total)},
};

/* The labelled counter families of the front ends (connections,
 * requests). */
static int add_net_families(struct rt_metrics_tangram *m, char *err,
                            size_t errlen)
{
    int rc = 0;
    for (size_t i = 0;
         rc == 0 && i < sizeof(labelled_defs) / sizeof(labelled_defs[0]);
         i++) {
        const struct labelled_def *d = &labelled_defs[i];
        struct rt_metrics_series **dst =
            (struct rt_metrics_series **)((char *)m + d->slot);
        struct rt_metrics_family *f;
        rc = rt_metrics_family_add(&m->reg, d->name, d->help,
                                   RT_METRICS_COUNTER, 1, &d->label, NULL, 0,
                                   &f, err, errlen);
        for (int k = 0; rc == 0 && k < d->n; k++)
            rc = rt_metrics_series_add(f, &d->values[k], &dst[k], err,
                                       errlen);
    }
    return rc;
}

/* Registers family `name` with label "rank" and one series of `type` per
 * rank. */
static int add_rank_series(struct rt_metrics_tangram *m, const char *name,
                           const char *help, enum rt_metrics_type type,
                           struct rt_metrics_series **dst, char *err,
                           size_t errlen)
{
    const char *label = "rank";
    struct rt_metrics_family *f;
    int rc = rt_metrics_family_add(&m->reg, name, help, type, 1,
                                   &label, NULL, 0, &f, err, errlen);
    for (int r = 0; rc == 0 && r < m->n_ranks; r++) {
        char v[16];
        snprintf(v, sizeof(v), "%d", r);
        const char *vp = v;
        rc = rt_metrics_series_add(f, &vp, &dst[r], err, errlen);
    }
    return rc;
}

int rt_metrics_tangram_init(struct rt_metrics_tangram *m, int n_ranks,
                            char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    if (n_ranks < 1 || n_ranks > RT_METRICS_MAX_RANKS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: rank count %d out of range [1, %d]",
                          n_ranks, RT_METRICS_MAX_RANKS);
    m->n_ranks = n_ranks;
    int rc;
    m->kv_pages_used = calloc((size_t)n_ranks, sizeof(*m->kv_pages_used));
    m->kv_pages_capacity =
        calloc((size_t)n_ranks, sizeof(*m->kv_pages_capacity));
    m->kv_pages_cached = calloc((size_t)n_ranks, sizeof(*m->kv_pages_cached));
    m->kv_pages_released =
        calloc((size_t)n_ranks, sizeof(*m->kv_pages_released));
    if (m->kv_pages_used == NULL || m->kv_pages_capacity == NULL ||
        m->kv_pages_cached == NULL || m->kv_pages_released == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "metrics: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < sizeof(single_defs) / sizeof(single_defs[0]);
         i++) {
        const struct single_def *d = &single_defs[i];
        struct rt_metrics_series **slot =
            (struct rt_metrics_series **)((char *)m + d->slot);
        rc = rt_metrics_single_add(&m->reg, d->name, d->help, d->type,
                                   d->bounds, d->n_bounds ? *d->n_bounds : 0,
                                   slot, err, errlen);
        if (rc != 0)
            goto fail;
    }
    rc = add_rank_series(m, "tangram_kv_pages_used",
                         "KV pages in use in the rank's pool.",
                         RT_METRICS_GAUGE, m->kv_pages_used, err, errlen);
    if (rc != 0)
        goto fail;
    rc = add_rank_series(m, "tangram_kv_pages_capacity",
                         "KV pages in the rank's pool.", RT_METRICS_GAUGE,
                         m->kv_pages_capacity, err, errlen);
    if (rc != 0)
        goto fail;
    /* With nothing running or waiting, used == cached on every rank: any
     * difference is a leaked page (the soak test checks it). */
    rc = add_rank_series(m, "tangram_kv_pages_cached",
                         "KV pages of the rank's pool held by stored "
                         "multi-turn entries (part of kv_pages_used).",
                         RT_METRICS_GAUGE, m->kv_pages_cached, err, errlen);
    if (rc != 0)
        goto fail;
    rc = add_rank_series(m, "tangram_kv_pages_released_total",
                         "KV pages an adaptive method (gvote) gave back to "
                         "the rank's pool right after a prefill chunk kept "
                         "less than its reservation.",
                         RT_METRICS_COUNTER, m->kv_pages_released, err,
                         errlen);
    if (rc != 0)
        goto fail;

    const char *label = "finished_reason";
    struct rt_metrics_family *f;
    rc = rt_metrics_family_add(&m->reg, "tangram_request_success_total",
                               "Number of finished requests by finish "
                               "reason.",
                               RT_METRICS_COUNTER, 1, &label, NULL, 0, &f,
                               err, errlen);
    for (int r = 0; rc == 0 && r < RT_METRICS_FINISH_COUNT; r++)
        rc = rt_metrics_series_add(f, &finish_names[r],
                                   &m->request_success_total[r], err, errlen);
    if (rc == 0)
        rc = add_net_families(m, err, errlen);
    if (rc != 0)
        goto fail;
    return 0;

fail:
    rt_metrics_tangram_free(m);
    return rc;
}
