/* rt_server_limits.c — the HTTP and gRPC servers' limits from the serving
 * options (--http-*, --grpc-*), filled by rt_server_init before either
 * server exists. The open-file limit is raised here for
 * --http-max-connections, or the connection cap lowered to what the
 * process may open, with a log line either way. Loop thread. */
#include "router/rt_server.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <sys/resource.h>

#include "common/tg_log.h"

/* Descriptors kept free beside the HTTP connections (gRPC clients, the
 * worker link, pidfds, logs), at most. */
#define FD_RESERVE 1024

static uint32_t to_ms(double seconds)
{
    double ms = seconds * 1000.0 + 0.5;
    return ms >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

/* Raises the open-file limit to what hc->max_connections needs (the soft
 * limit up to the hard one), or lowers max_connections to fit. */
static void fit_fd_limit(struct rt_http_config *hc)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t need = (rlim_t)hc->max_connections + FD_RESERVE;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return;
    rlim_t old = rl.rlim_cur;
    struct rlimit want = rl;
    want.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : rl.rlim_max;
    if (want.rlim_cur > old && setrlimit(RLIMIT_NOFILE, &want) == 0) {
        rl = want;
        log_info("raised the open-file limit from %llu to %llu for "
                 "--http-max-connections %" PRIu32,
                 (unsigned long long)old, (unsigned long long)rl.rlim_cur,
                 hc->max_connections);
    }
    if (rl.rlim_cur >= need)
        return;
    rlim_t reserve = rl.rlim_cur / 4 < FD_RESERVE ? rl.rlim_cur / 4
                                                  : FD_RESERVE;
    rlim_t fit = rl.rlim_cur > reserve + 16 ? rl.rlim_cur - reserve : 16;
    log_warn("the open-file limit %llu (hard %llu) is too low for "
             "--http-max-connections %" PRIu32 "; serving at most %llu "
             "connections (raise LimitNOFILE / ulimit -n)",
             (unsigned long long)rl.rlim_cur,
             (unsigned long long)rl.rlim_max, hc->max_connections,
             (unsigned long long)fit);
    hc->max_connections = (uint32_t)fit;
}

void rt_server__http_limits(const struct tg_serve_opts *o,
                            struct rt_http_config *hc)
{
    rt_http_config_default(hc);
    hc->max_body_bytes = (size_t)o->http_max_body;
    hc->header_timeout_ms = to_ms(o->http_header_timeout);
    hc->body_timeout_ms = to_ms(o->http_body_timeout);
    hc->idle_timeout_ms = to_ms(o->http_idle_timeout);
    hc->send_timeout_ms = to_ms(o->http_send_timeout);
    hc->max_connections = (uint32_t)o->http_max_connections;
    hc->max_connections_per_ip = (uint32_t)o->http_max_connections_per_ip;
    fit_fd_limit(hc);
}

void rt_server__grpc_limits(const struct tg_serve_opts *o,
                            struct rt_grpc_config *gc)
{
    rt_grpc_config_default(gc);
    gc->recv_timeout_ms = (uint32_t)ceil(o->grpc_recv_timeout * 1000.0);
    gc->idle_timeout_ms = (uint32_t)ceil(o->grpc_idle_timeout * 1000.0);
    gc->max_concurrent_streams = (uint32_t)o->grpc_max_streams;
    gc->max_message_bytes = (size_t)o->grpc_max_message;
}
