/*
 * rt_http_server.c — the HTTP server object (see rt_http.h): configuration
 * defaults, init, routes, the head check, listening, close and free, and
 * the small buffer helpers the other rt_http*.c files share. Connections
 * live in rt_http.c.
 */
#include "router/net/rt_http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

void rt_http_config_default(struct rt_http_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_header_bytes = 16384;
    cfg->max_body_bytes = 8u << 20;
    cfg->idle_timeout_ms = 60000;
    cfg->header_timeout_ms = 10000;
    cfg->body_timeout_ms = 60000;
    cfg->min_body_rate = 16384;
    cfg->body_rate_window_ms = 5000;
    cfg->send_timeout_ms = 60000;
    cfg->linger_ms = 1000;
    cfg->max_connections = 4096;
    cfg->max_connections_per_ip = 256;
    cfg->probe_reserve = 16;
    cfg->probe_per_ip = 4;
    cfg->retry_after_s = 1;
    cfg->backlog = 511;
}

int rt_http__buf_append(char **buf, size_t *len, size_t *cap, const char *at,
                        size_t n)
{
    if (TG_GROW(*buf, cap, *len + n + 1))
        return TG_ENOMEM;
    memcpy(*buf + *len, at, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

void rt_http__req_free(struct rt_http_req *req)
{
    if (!req)
        return;
    free(req->hbuf);
    free(req->hoffs);
    free(req->hdrs);
    free(req->bbuf);
    rt_conn_budget_give(req->srv->cfg.body_budget, req->charged);
    free(req->rhdrs);
    free(req);
}

void rt_http__srv_handle_closed(struct rt_http_server *srv)
{
    srv->live_handles--;
    if (srv->closing && srv->live_handles == 0 && srv->on_closed) {
        rt_http_closed_fn cb = srv->on_closed;
        srv->on_closed = NULL;
        cb(srv->on_closed_ud);
    }
}

/* ---- server ------------------------------------------------------------ */

int rt_http_server_init(struct rt_http_server *srv, uv_loop_t *loop,
                        const struct rt_http_config *cfg, char *err,
                        size_t errlen)
{
    memset(srv, 0, sizeof(*srv));
    if (!loop)
        return tg_err_set(err, errlen, TG_EINVAL, "http: no loop");
    if (cfg)
        srv->cfg = *cfg;
    else
        rt_http_config_default(&srv->cfg);
    if (srv->cfg.max_header_bytes < 256 ||
        srv->cfg.max_header_bytes > (64u << 20))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: max_header_bytes %zu outside [256, 64 MiB]",
                          srv->cfg.max_header_bytes);
    if (srv->cfg.max_body_bytes > ((size_t)1 << 40))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: max_body_bytes %zu too large",
                          srv->cfg.max_body_bytes);
    if (srv->cfg.backlog <= 0)
        return tg_err_set(err, errlen, TG_EINVAL, "http: backlog %d <= 0",
                          srv->cfg.backlog);
    if (srv->cfg.body_rate_window_ms < 100)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: body_rate_window_ms %u < 100",
                          srv->cfg.body_rate_window_ms);
    srv->rbuf = malloc(RT_HTTP_READ_BUF);
    if (!srv->rbuf)
        return tg_err_set(err, errlen, TG_ENOMEM, "http: read buffer");
    srv->loop = loop;
    struct rt_conn_config cc = {
        .max_connections = srv->cfg.max_connections,
        .max_connections_per_ip = srv->cfg.max_connections_per_ip,
        .idle_timeout_ms = srv->cfg.idle_timeout_ms,
        .probe_reserve = srv->cfg.probe_reserve,
        .probe_per_ip = srv->cfg.probe_per_ip,
        .backlog = srv->cfg.backlog,
    };
    rt_conn_set_init(&srv->set, loop, &cc, &rt_http__conn_ops, srv, "HTTP");
    /* uv_idle_init and uv_timer_init cannot fail (they only link the
     * handle into the loop). */
    int rc = uv_idle_init(loop, &srv->resume_idle);
    TG_ASSERT(rc == 0);
    rc = uv_timer_init(loop, &srv->peer_timer);
    TG_ASSERT(rc == 0);
    srv->resume_idle.data = srv;
    srv->peer_timer.data = srv;
    srv->live_handles = 3;
    srv->initialized = 1;
    return 0;
}

void rt_http_server_on_head(struct rt_http_server *srv, rt_http_head_fn fn,
                            void *ud)
{
    srv->on_head = fn;
    srv->on_head_ud = ud;
}

int rt_http_route_add(struct rt_http_server *srv, const char *method,
                      const char *path, rt_http_handler_fn handler, void *ud,
                      char *err, size_t errlen)
{
    if (!method || !*method || !path || path[0] != '/' || !handler)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: route needs a method, a path starting "
                          "with '/' and a handler");
    if (TG_GROW(srv->routes, &srv->cap_routes, srv->n_routes + 1))
        return tg_err_set(err, errlen, TG_ENOMEM, "http: routes");
    struct rt_http_route *r = &srv->routes[srv->n_routes];
    r->method = strdup(method);
    r->path = strdup(path);
    if (!r->method || !r->path) {
        free(r->method);
        free(r->path);
        return tg_err_set(err, errlen, TG_ENOMEM, "http: routes");
    }
    size_t plen = strlen(path);
    r->prefix_len = path[plen - 1] == '*' ? plen - 1 : 0;
    r->probe = 0;
    r->handler = handler;
    r->ud = ud;
    srv->n_routes++;
    return 0;
}

int rt_http_route_set_probe(struct rt_http_server *srv, const char *path)
{
    int found = 0;
    for (size_t i = 0; i < srv->n_routes; i++) {
        if (strcmp(srv->routes[i].path, path) == 0) {
            srv->routes[i].probe = 1;
            found = 1;
        }
    }
    return found ? 0 : TG_ENOTFOUND;
}

int rt_http_server_listen(struct rt_http_server *srv, const char *host,
                          int port, char *err, size_t errlen)
{
    if (!srv->initialized)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "http: server not ready to listen");
    return rt_conn_set_listen(&srv->set, host, port, err, errlen);
}

int rt_http_server_adopt(struct rt_http_server *srv, int fd)
{
    return srv->initialized ? rt_conn_set_adopt(&srv->set, fd) : TG_EINVAL;
}

static void on_srv_handle_closed(uv_handle_t *h)
{
    rt_http__srv_handle_closed(h->data);
}

static void on_set_closed(struct rt_conn_set *set)
{
    rt_http__srv_handle_closed(set->ud);
}

void rt_http_server_close(struct rt_http_server *srv,
                          rt_http_closed_fn on_closed, void *ud)
{
    if (!srv->initialized || srv->closing)
        return;
    srv->closing = 1;
    srv->on_closed = on_closed;
    srv->on_closed_ud = ud;
    uv_close((uv_handle_t *)&srv->resume_idle, on_srv_handle_closed);
    uv_close((uv_handle_t *)&srv->peer_timer, on_srv_handle_closed);
    srv->resume = NULL;
    /* Closes every connection too (rt_http__conn_ops.close). */
    rt_conn_set_close(&srv->set, on_set_closed);
}

void rt_http_server_free(struct rt_http_server *srv)
{
    if (srv->initialized)
        TG_ASSERT(srv->closing && srv->live_handles == 0);
    for (size_t i = 0; i < srv->n_routes; i++) {
        free(srv->routes[i].method);
        free(srv->routes[i].path);
    }
    free(srv->routes);
    while (srv->zombies) {
        struct rt_http_req *z = srv->zombies;
        srv->zombies = z->next_zombie;
        rt_http__req_free(z);
    }
    free(srv->rbuf);
    memset(srv, 0, sizeof(*srv));
}
