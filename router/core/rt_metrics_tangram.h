/*
 * rt_metrics_tangram.h — the tangram metric set (DESIGN.md §5 "Metrics"):
 * every metric the router exports, registered in one rt_metrics registry,
 * with vLLM's histogram buckets. Loop thread only, like the registry.
 */
#ifndef RT_METRICS_TANGRAM_H
#define RT_METRICS_TANGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "router/core/rt_metrics.h"

/* finished_reason label values of tangram_request_success_total, matching
 * the finish reasons of the client API (vLLM's "stop", "length", "abort",
 * plus "error" for requests failed by the server, e.g. a dead worker). */
enum rt_metrics_finish {
    RT_METRICS_FINISH_STOP,
    RT_METRICS_FINISH_LENGTH,
    RT_METRICS_FINISH_ABORT,
    RT_METRICS_FINISH_ERROR,
    RT_METRICS_FINISH_COUNT,
};

/* reason label values of tangram_http_connections_rejected_total and
 * tangram_grpc_connections_rejected_total. */
enum rt_metrics_http_reject {
    RT_METRICS_HTTP_REJECT_MAX,    /* "max_connections" */
    RT_METRICS_HTTP_REJECT_PER_IP, /* "max_connections_per_ip" */
    RT_METRICS_HTTP_REJECT_COUNT,
};

/* phase label values of tangram_http_requests_timed_out_total. */
enum rt_metrics_http_timeout {
    RT_METRICS_HTTP_TIMEOUT_HEADER,    /* "header" */
    RT_METRICS_HTTP_TIMEOUT_BODY,      /* "body" */
    RT_METRICS_HTTP_TIMEOUT_BODY_RATE, /* "body_rate" */
    RT_METRICS_HTTP_TIMEOUT_COUNT,
};

/* reason label values of tangram_http_requests_refused_total. */
enum rt_metrics_http_refuse {
    RT_METRICS_HTTP_REFUSE_UNAUTH,    /* "unauthenticated" */
    RT_METRICS_HTTP_REFUSE_MALFORMED, /* "malformed" */
    RT_METRICS_HTTP_REFUSE_TOO_LARGE, /* "too_large" */
    RT_METRICS_HTTP_REFUSE_BODY_MEMORY, /* "body_memory" */
    RT_METRICS_HTTP_REFUSE_COUNT,
};

/* api label values of tangram_accept_pauses_total. */
enum rt_metrics_api {
    RT_METRICS_API_HTTP, /* "http" */
    RT_METRICS_API_GRPC, /* "grpc" */
    RT_METRICS_API_COUNT,
};

/* Most ranks the tangram set accepts (per-rank page gauges). */
#define RT_METRICS_MAX_RANKS 1024

/* Every metric the router exports. Handles point into `reg`. Units: seconds
 * for latencies, tokens for token counters, pages for page gauges;
 * kv_cache_usage_perc and kv_pages_reclaimed_ratio are fractions in [0, 1]
 * (vLLM: "1 means 100 percent usage"). */
struct rt_metrics_tangram {
    struct rt_metrics_registry reg;
    int n_ranks;
    /* gauges */
    struct rt_metrics_series *num_requests_running;
    struct rt_metrics_series *num_requests_waiting;
    struct rt_metrics_series *tokenize_jobs_in_flight;
    struct rt_metrics_series *kv_cache_usage_perc;
    struct rt_metrics_series *kv_pages_reclaimed_ratio;
    struct rt_metrics_series **kv_pages_used;  /* (n_ranks) {rank="r"} */
    struct rt_metrics_series **kv_pages_capacity; /* (n_ranks) {rank="r"} */
    struct rt_metrics_series **kv_pages_cached; /* (n_ranks) {rank="r"} */
    struct rt_metrics_series **kv_pages_released; /* (n_ranks) {rank="r"}
                                                     counter */
    /* histograms (seconds) */
    struct rt_metrics_series *time_to_first_token_seconds;
    struct rt_metrics_series *inter_token_latency_seconds;
    struct rt_metrics_series *e2e_request_latency_seconds;
    struct rt_metrics_series *scheduler_step_seconds;
    /* counters */
    struct rt_metrics_series *prompt_tokens_total;
    struct rt_metrics_series *generation_tokens_total;
    struct rt_metrics_series *cached_prompt_tokens_total;
    struct rt_metrics_series *num_preemptions_total;
    struct rt_metrics_series
        *request_success_total[RT_METRICS_FINISH_COUNT]; /* {finished_reason} */
    /* the HTTP front end (the router copies its counters in before each
     * scrape) */
    struct rt_metrics_series *http_connections_open;          /* gauge */
    struct rt_metrics_series *http_connections_evicted_total;
    struct rt_metrics_series *http_slow_heads_evicted_total;
    struct rt_metrics_series *http_slow_bodies_evicted_total;
    struct rt_metrics_series *http_slow_readers_aborted_total;
    struct rt_metrics_series
        *http_connections_rejected_total[RT_METRICS_HTTP_REJECT_COUNT];
    struct rt_metrics_series
        *http_requests_timed_out_total[RT_METRICS_HTTP_TIMEOUT_COUNT];
    struct rt_metrics_series
        *http_requests_refused_total[RT_METRICS_HTTP_REFUSE_COUNT];
    /* the gRPC front end (router/net/rt_grpc.h): open connections (gauge), and
     * counters of what its limits refused or ended */
    struct rt_metrics_series *grpc_connections;
    struct rt_metrics_series *grpc_receive_timeouts_total;
    struct rt_metrics_series *grpc_idle_closes_total;
    struct rt_metrics_series *grpc_deadline_exceeded_total;
    struct rt_metrics_series *grpc_refused_streams_total;
    struct rt_metrics_series *grpc_oversized_messages_total;
    struct rt_metrics_series *grpc_unauthenticated_total;
    struct rt_metrics_series *grpc_connections_evicted_total;
    struct rt_metrics_series
        *grpc_connections_rejected_total[RT_METRICS_HTTP_REJECT_COUNT];
    /* both front ends: accepting paused for want of descriptors {api},
     * and the request body budget (router/net/rt_conn.h) */
    struct rt_metrics_series *accept_pauses_total[RT_METRICS_API_COUNT];
    struct rt_metrics_series
        *probe_reserve_connections_total[RT_METRICS_API_COUNT];
    struct rt_metrics_series *request_body_memory_bytes;      /* gauge */
    struct rt_metrics_series *request_body_memory_refused_total;
    /* the request memory budget (router/core/rt_reqmem.h) */
    struct rt_metrics_series *request_memory_bytes;   /* gauge */
    struct rt_metrics_series *request_memory_waiting; /* gauge */
    struct rt_metrics_series *request_memory_refused_total;
    /* counters of the step loop's time (seconds): wall time of the steps
     * and its host work on the router and on the workers */
    struct rt_metrics_series *step_seconds_total;
    struct rt_metrics_series *step_router_host_seconds_total;
    struct rt_metrics_series *step_worker_host_seconds_total;
    /* structured outputs' grammars prepared on rank 0 (§4.11): requests
     * waiting for theirs (gauge), prepares outstanding (gauge), prepares
     * sent, failed and refused (counters) */
    struct rt_metrics_series *grammar_requests_waiting;
    struct rt_metrics_series *grammar_prepares_pending;
    struct rt_metrics_series *grammar_prepares_total;
    struct rt_metrics_series *grammar_prepare_failures_total;
    struct rt_metrics_series *grammar_prepares_refused_total;
};

/* vLLM's bucket bounds (seconds), exported for tests and documentation. */
extern const double rt_metrics_ttft_bounds[];
extern const int rt_metrics_ttft_n_bounds;
extern const double rt_metrics_itl_bounds[];
extern const int rt_metrics_itl_n_bounds;
extern const double rt_metrics_e2e_bounds[];
extern const int rt_metrics_e2e_n_bounds;
extern const double rt_metrics_step_bounds[];
extern const int rt_metrics_step_n_bounds;

/* Registers the whole tangram set for ranks 0..n_ranks-1 (n_ranks in
 * [1, RT_METRICS_MAX_RANKS]); all values start at zero. Returns 0,
 * TG_EINVAL or TG_ENOMEM; on failure `m` is zeroed and safe to free. */
int rt_metrics_tangram_init(struct rt_metrics_tangram *m, int n_ranks,
                            char *err, size_t errlen);

/* Releases the set. Safe on a zeroed or failed-init set; leaves it zeroed. */
void rt_metrics_tangram_free(struct rt_metrics_tangram *m);

/* Returns the finished_reason label text of `r` ("stop", "length",
 * "abort", "error"), or NULL when r is out of range. */
const char *rt_metrics_finish_name(enum rt_metrics_finish r);

#endif /* RT_METRICS_TANGRAM_H */
