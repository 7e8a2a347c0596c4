/*
 * rt_app.h — the router put together: the server core (router/core/
 * rt_server.h), the network servers that exist (HTTP/1.1 on --http-port,
 * gRPC on --grpc-port, router/net/) with the body budget they share
 * (--max-body-memory), and the front ends registered on them
 * (router/api/rt_api.h). The core knows neither server: the app registers
 * its hooks there (rt_server_hooks: close the servers when a drain ends,
 * copy their counters into the metrics before a scrape).
 *
 * Lifecycle: rt_app_init, rt_app_listen, run the loop until it is empty,
 * rt_app_free. Everything here runs on the loop thread.
 */
#ifndef RT_APP_H
#define RT_APP_H

#include <stddef.h>
#include <uv.h>

#include "common/base/tg_serve_opts.h"
#include "router/core/rt_server.h"
#include "router/net/rt_conn.h"
#include "router/net/rt_grpc.h"
#include "router/net/rt_http.h"

struct rt_app {
    struct rt_server *srv;             /* the core; its hooks' ud is the app */
    struct rt_conn_budget body_budget; /* request bodies held by both
                                   servers (--max-body-memory) */
    struct rt_reqmem reqmem;           /* what large requests become until their
                                          prompt is tokenized, both front ends
                                          (--max-request-memory;
                                          rt_server_set_reqmem) */
    struct rt_respstore resp;          /* stored responses (--responses-*;
                                          rt_server_set_respstore) */
    struct rt_http_server http;
    struct rt_grpc_server grpc;
};

/* Sets up the core (rt_server_init), both servers with their limits from
 * `o` (rt_app_net_limits), the HTTP and gRPC front ends on them and the
 * core's hooks; nothing listens yet. Returns 0 or an error with detail in
 * err; on failure everything is released, running `loop` until the handles
 * opened so far are closed, and rt_app_free is still safe. `o` must
 * outlive the app; `a` must not move after this call. */
int rt_app_init(struct rt_app *a, uv_loop_t *loop,
                const struct tg_serve_opts *o, char *err, size_t errlen);

/* Binds --host:--http-port and --host:--grpc-port and starts the core
 * (rt_server_start). Call once, after rt_app_init succeeded. Returns 0 or
 * an error with detail in err (a port in use names the address); on
 * failure everything is released as by a failed rt_app_init. */
int rt_app_listen(struct rt_app *a, char *err, size_t errlen);

/* The process's exit status once the loop ran out: 0 after a clean
 * drain, 1 when the core stopped on a fatal condition or a second signal
 * cut the drain. */
int rt_app_exit_code(const struct rt_app *a);

/* Frees what is left; safe on a zeroed app and after a failure. Run the
 * loop until it is empty afterwards so that handles close. */
void rt_app_free(struct rt_app *a);

/* The HTTP and gRPC servers' limits from the options, both charging the
 * body budget *budget (initialised here from --max-body-memory), with the
 * open-file limit fitted to both connection caps (rt_app_limits.c).
 * Returns 0 or TG_EINVAL (a budget below one request of the largest size)
 * with the reason in err. */
int rt_app_net_limits(const struct tg_serve_opts *o,
                      struct rt_conn_budget *budget, struct rt_http_config *hc,
                      struct rt_grpc_config *gc, char *err, size_t errlen);

/* Copies the connection and body-budget counters of both servers into the
 * core's metrics (the core's scrape hook; rt_app_limits.c). */
void rt_app_net_metrics(struct rt_app *a);

#endif /* RT_APP_H */
