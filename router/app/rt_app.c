/* rt_app.c — the router put together (see rt_app.h): the core, the HTTP
 * and gRPC servers, the front ends, and the hooks through which the core
 * closes the servers and refreshes their metrics. */
#include "router/app/rt_app.h"

#include <stdlib.h>
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
    struct rt_app *a = ud;
    rt_app_net_metrics(ud);
    if (rt_server_respstore(a->srv) != NULL)
        rt_respstore_expire(rt_server_respstore(a->srv));
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

/* The store's database work as jobs of the core's thread pool. */
struct resp_job {
    struct rt_pool_job pool; /* first */
    void (*run)(void *arg), (*done)(void *arg);
    void *arg;
};

static void resp_job_run(struct rt_pool_job *p)
{
    struct resp_job *j = (struct resp_job *)p;
    j->run(j->arg);
}

static void resp_job_done(struct rt_pool_job *p, int ran)
{
    struct resp_job *j = (struct resp_job *)p;
    /* A job skipped (a drain cut it) still ends: the batch runs here. */
    if (!ran)
        j->run(j->arg);
    j->done(j->arg);
    free(j);
}

static int resp_submit(void *ud, void (*run)(void *), void (*done)(void *),
                       void *arg)
{
    struct rt_app *a = ud;
    struct resp_job *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return -1;
    j->pool.run = resp_job_run;
    j->pool.done = resp_job_done;
    j->run = run;
    j->done = done;
    j->arg = arg;
    char err[128];
    if (rt_pool_job_start(a->srv, &j->pool, err, sizeof(err)) != 0) {
        free(j);
        return -1;
    }
    return 0;
}

static int resp_init(struct rt_app *a, const struct tg_serve_opts *o, char *err,
                     size_t errlen)
{
    struct rt_respstore_config c = {
        .max_entries = o->responses_max_entries,
        .max_bytes = o->responses_max_bytes,
        .ttl_s = (int64_t)o->responses_ttl,
        .db_path = o->responses_db,
    };
    struct rt_respstore_runner runner = {resp_submit, a};
    int rc = rt_respstore_init(&a->resp, &c, &rt_server_metrics(a->srv)->reg,
                               &runner, err, errlen);
    if (rc == 0)
        rt_server_set_respstore(a->srv, &a->resp);
    return rc;
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

    if ((rc = resp_init(a, o, err, errlen)) != 0) {
        discard(a);
        return rc;
    }

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
    /* After the core: its drain waited for the store's jobs; what is
     * still pending is written here. */
    rt_respstore_free(&a->resp);
    rt_http_server_free(&a->http);
    rt_grpc_server_free(&a->grpc);
}
