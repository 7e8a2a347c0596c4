/* rt_app_limits.c — the HTTP and gRPC servers' limits from the serving
 * options (--http-*, --grpc-*, --max-body-memory), filled by rt_app_init
 * before either server exists, and their counters copied into the core's
 * metrics before a scrape. The open-file limit is raised here for
 * the two connection caps together, or both caps lowered to what the
 * process may open, with a log line either way. Loop thread. */
#include "router/app/rt_app.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"

/* Descriptors kept free beside the HTTP and gRPC connections (the worker
 * link, pidfds, logs, the thread pool), at most. */
#define FD_RESERVE 1024

static uint32_t to_ms(double seconds)
{
    double ms = seconds * 1000.0 + 0.5;
    return ms >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

/* Raises the open-file limit to what both connection caps need (the soft
 * limit up to the hard one), or lowers the caps to fit, in proportion. */
static void fit_fd_limit(struct rt_http_config *hc, struct rt_grpc_config *gc)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    uint64_t conns = (uint64_t)hc->max_connections + gc->max_connections;
    rlim_t need = (rlim_t)conns + FD_RESERVE;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return;
    rlim_t old = rl.rlim_cur;
    struct rlimit want = rl;
    want.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : rl.rlim_max;
    if (want.rlim_cur > old && setrlimit(RLIMIT_NOFILE, &want) == 0) {
        rl = want;
        log_info("raised the open-file limit from %llu to %llu for "
                 "--http-max-connections %" PRIu32
                 " and --grpc-max-connections %" PRIu32,
                 (unsigned long long)old, (unsigned long long)rl.rlim_cur,
                 hc->max_connections, gc->max_connections);
    }
    if (rl.rlim_cur >= need)
        return;
    rlim_t reserve = rl.rlim_cur / 4 < FD_RESERVE ? rl.rlim_cur / 4
                                                  : FD_RESERVE;
    uint64_t fit = rl.rlim_cur > reserve + 32 ? rl.rlim_cur - reserve : 32;
    uint64_t h = fit * hc->max_connections / conns;
    if (h < 16)
        h = 16;
    uint64_t g = fit > h + 16 ? fit - h : 16;
    log_warn("the open-file limit %llu (hard %llu) is too low for "
             "--http-max-connections %" PRIu32
             " and --grpc-max-connections %" PRIu32
             "; serving at most %llu HTTP and %llu gRPC connections (raise "
             "LimitNOFILE / ulimit -n)",
             (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
             hc->max_connections, gc->max_connections, (unsigned long long)h,
             (unsigned long long)g);
    hc->max_connections = (uint32_t)h;
    gc->max_connections = (uint32_t)g;
}

int rt_app_net_limits(const struct tg_serve_opts *o,
                      struct rt_conn_budget *budget, struct rt_http_config *hc,
                      struct rt_grpc_config *gc, char *err, size_t errlen)
{
    if (o->max_body_memory < o->http_max_body ||
        o->max_body_memory < o->grpc_max_message)
        return tg_err_set(
            err, errlen, TG_EINVAL,
            "--max-body-memory %" PRIu64 " is below "
            "--http-max-body %" PRIu64 " or --grpc-max-message %" PRIu64
            ": one request of the largest size could never "
            "be taken",
            o->max_body_memory, o->http_max_body, o->grpc_max_message);
    memset(budget, 0, sizeof(*budget));
    budget->limit = (size_t)o->max_body_memory;

    rt_http_config_default(hc);
    hc->max_body_bytes = (size_t)o->http_max_body;
    hc->header_timeout_ms = to_ms(o->http_header_timeout);
    hc->body_timeout_ms = to_ms(o->http_body_timeout);
    hc->min_body_rate = o->http_min_body_rate > UINT32_MAX
                            ? UINT32_MAX
                            : (uint32_t)o->http_min_body_rate;
    hc->idle_timeout_ms = to_ms(o->http_idle_timeout);
    hc->send_timeout_ms = to_ms(o->http_send_timeout);
    hc->max_connections = (uint32_t)o->http_max_connections;
    hc->max_connections_per_ip = (uint32_t)o->http_max_connections_per_ip;
    hc->body_budget = budget;

    rt_grpc_config_default(gc);
    gc->recv_timeout_ms = (uint32_t)ceil(o->grpc_recv_timeout * 1000.0);
    gc->idle_timeout_ms = (uint32_t)ceil(o->grpc_idle_timeout * 1000.0);
    gc->max_concurrent_streams = (uint32_t)o->grpc_max_streams;
    gc->max_message_bytes = (size_t)o->grpc_max_message;
    gc->max_connections = (uint32_t)o->grpc_max_connections;
    gc->max_connections_per_ip = (uint32_t)o->grpc_max_connections_per_ip;
    gc->body_budget = budget;

    fit_fd_limit(hc, gc);
    return 0;
}

/* Makes counter `c` equal the monotonic total `total`. */
static void follow(struct rt_metrics_series *c, uint64_t total)
{
    double d = (double)total - rt_metrics_series_value(c);
    if (d > 0)
        rt_metrics_counter_add(c, d);
}

void rt_app_net_metrics(struct rt_app *a)
{
    const struct rt_http_stats *st = &a->http.stats;
    const struct rt_conn_stats *hs = &a->http.set.stats;
    const struct rt_conn_stats *gs = &a->grpc.set.stats;
    struct rt_metrics_tangram *m = rt_server_metrics(a->srv);
    rt_metrics_gauge_set(m->http_connections_open, (double)a->http.set.n_live);
    follow(m->http_connections_evicted_total,
           hs->evicted_idle + hs->evicted_head + hs->evicted_body);
    follow(m->http_slow_heads_evicted_total, hs->evicted_head);
    follow(m->http_slow_bodies_evicted_total, hs->evicted_body);
    follow(m->probe_reserve_connections_total[RT_METRICS_API_HTTP],
           hs->probe_admitted);
    follow(m->probe_reserve_connections_total[RT_METRICS_API_GRPC],
           gs->probe_admitted);
    follow(m->http_slow_readers_aborted_total, st->slow_readers);
    follow(m->http_connections_rejected_total[RT_METRICS_HTTP_REJECT_MAX],
           hs->rejected_max);
    follow(m->http_connections_rejected_total[RT_METRICS_HTTP_REJECT_PER_IP],
           hs->rejected_per_ip);
    follow(m->http_requests_timed_out_total[RT_METRICS_HTTP_TIMEOUT_HEADER],
           st->timeout_header);
    follow(m->http_requests_timed_out_total[RT_METRICS_HTTP_TIMEOUT_BODY],
           st->timeout_body);
    follow(m->http_requests_timed_out_total[RT_METRICS_HTTP_TIMEOUT_BODY_RATE],
           st->slow_bodies);
    /* The head check refuses for the API key only. */
    follow(m->http_requests_refused_total[RT_METRICS_HTTP_REFUSE_UNAUTH],
           st->refused_head);
    follow(m->http_requests_refused_total[RT_METRICS_HTTP_REFUSE_MALFORMED],
           st->malformed);
    follow(m->http_requests_refused_total[RT_METRICS_HTTP_REFUSE_TOO_LARGE],
           st->too_large);
    follow(m->http_requests_refused_total[RT_METRICS_HTTP_REFUSE_BODY_MEMORY],
           st->refused_budget);
    follow(m->grpc_connections_evicted_total, gs->evicted_idle);
    follow(m->grpc_connections_rejected_total[RT_METRICS_HTTP_REJECT_MAX],
           gs->rejected_max);
    follow(m->grpc_connections_rejected_total[RT_METRICS_HTTP_REJECT_PER_IP],
           gs->rejected_per_ip);
    follow(m->accept_pauses_total[RT_METRICS_API_HTTP], hs->accept_pauses);
    follow(m->accept_pauses_total[RT_METRICS_API_GRPC], gs->accept_pauses);
    rt_metrics_gauge_set(m->request_body_memory_bytes,
                         (double)a->body_budget.used);
    follow(m->request_body_memory_refused_total, a->body_budget.refused);
    rt_metrics_gauge_set(m->request_memory_bytes, (double)a->reqmem.used);
    rt_metrics_gauge_set(m->request_memory_waiting,
                         (double)a->reqmem.n_waiting);
    follow(m->request_memory_refused_total, a->reqmem.refused);
}
