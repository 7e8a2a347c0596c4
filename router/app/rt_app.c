/* rt_app.c — the router put together (see rt_app.h): the core, the HTTP
 * and gRPC servers, the front ends, and the hooks through which the core
 * closes the servers and refreshes their metrics. */
#include "router/app/rt_app.h"

#include <string.h>

#include "common/base/tg_log.h"
#include "router/api/rt_api.h"

static void hook_close(void *ud)
{
    struct rt_app *a = ud;
    rt_http_server_close(&a->http, NULL, NULL);
    rt_grpc_server_close(&a->grpc, NULL, NULL);
}

static void hook_scrape(void *ud)
{
    rt_app_net_metrics(ud);
}

/* Closes both servers, lets the core close its handles and run the loop
 * until every close finished, then frees everything. */
static void discard(struct rt_app *a)
{
    hook_close(a);
    rt_server_discard(a->srv);
    a->srv = NULL;
    rt_app_free(a);
}

int rt_app_init(struct rt_app *a, uv_loop_t *loop,
                const struct tg_serve_opts *o, char *err, size_t errlen)
{
    memset(a, 0, sizeof(*a));
    int rc = rt_server_init(&a->srv, loop, o, err, errlen);
    if (rc != 0)
        return rc; /* the core released itself; nothing else is open */
    struct rt_server_hooks hooks = {
        .close = hook_close, .scrape = hook_scrape, .ud = a};
    rt_server_set_hooks(a->srv, &hooks);
    rt_reqmem_init(&a->reqmem, (size_t)o->max_request_memory);
    rt_server_set_reqmem(a->srv, &a->reqmem);

    struct rt_http_config hc;
    struct rt_grpc_config gc;
    rc = rt_app_net_limits(o, &a->body_budget, &hc, &gc, err, errlen);
    if (rc == 0)
        rc = rt_http_server_init(&a->http, loop, &hc, err, errlen);
    if (rc == 0)
        rc = rt_grpc_server_init(&a->grpc, loop, &gc, err, errlen);
    if (rc == 0)
        rc = rt_api_http_register(a->srv, &a->http, err, errlen);
    if (rc == 0)
        rc = rt_api_grpc_register(a->srv, &a->grpc, err, errlen);
    if (rc != 0)
        discard(a);
    return rc;
}

int rt_app_listen(struct rt_app *a, char *err, size_t errlen)
{
    const struct tg_serve_opts *o = rt_server_opts(a->srv);
    int rc = rt_http_server_listen(&a->http, o->host, (int)o->http_port, err,
                                   errlen);
    if (rc == 0)
        rc = rt_grpc_server_listen(&a->grpc, o->host, (int)o->grpc_port, err,
                                   errlen);
    if (rc != 0) {
        discard(a);
        return rc;
    }
    rt_server_start(a->srv);
    log_info(
        "serving %s: HTTP %s:%lld, gRPC %s:%lld, workers at %s, context %d",
        rt_server_info(a->srv)->model_name, o->host, (long long)o->http_port,
        o->host, (long long)o->grpc_port, rt_server_link_endpoint(a->srv),
        rt_server_info(a->srv)->max_model_len);
    return 0;
}

int rt_app_exit_code(const struct rt_app *a)
{
    return rt_server_exit_code(a->srv);
}

void rt_app_free(struct rt_app *a)
{
    /* The core first: its requests may still name connections of the
     * servers, which are freed only after them. */
    rt_server_free(a->srv);
    a->srv = NULL;
    rt_http_server_free(&a->http);
    rt_grpc_server_free(&a->grpc);
}
