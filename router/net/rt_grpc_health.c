/*
 * rt_grpc_health.c — grpc.health.v1.Health on rt_grpc (see rt_grpc.h and
 * proto/health.proto; protocol from the gRPC repository's
 * doc/health-checking.md).
 *
 * Check answers SERVING / NOT_SERVING from the caller's callback, or
 * 5 NOT_FOUND for a service the callback does not know.
 *
 * Watch sends the current state at once and then each change. The state
 * lives in the caller (the router's readiness: workers ready, not
 * draining), which has no single place where it changes, so open Watch
 * streams re-read it through the callback every RT_GRPC_HEALTH_POLL_MS on
 * the server's health timer; the timer runs only while a Watch stream is
 * open. Per the protocol an unknown service is reported as
 * SERVICE_UNKNOWN inside the stream, which stays open (the service may
 * appear later). At server close every stream gets its final state
 * (NOT_SERVING) and ends with UNAVAILABLE, before the connections are
 * drained, so the last message reaches the client.
 */
#include "router/net/rt_grpc_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "proto/health.pb-c.h"

/* A client that does not read its Watch stream: beyond this many queued
 * bytes (some ten thousand state changes) the stream ends. */
#define WATCH_MAX_PENDING (64u * 1024u)

struct watcher {
    struct rt_grpc_call *call;
    struct health *h;
    char *service;
    int last;                    /* HealthCheckResponse.ServingStatus sent */
    struct watcher *prev, *next;
};

struct health {
    rt_grpc_health_fn fn;
    void *ud;
    struct rt_grpc_server *srv;
    struct watcher *watchers;    /* doubly linked */
};

/* HealthCheckResponse.ServingStatus values, shorter. */
#define ST_(x) GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__##x

/* The state of `svc` as a HealthCheckResponse.ServingStatus value. */
static int status_of(const struct health *h, const char *svc)
{
    int st = h->fn(svc, h->ud);
    if (st == RT_GRPC_HEALTH_SERVING)
        return ST_(SERVING);
    if (st == RT_GRPC_HEALTH_NOT_SERVING)
        return ST_(NOT_SERVING);
    return ST_(SERVICE_UNKNOWN);
}

/* Packs a HealthCheckResponse with `status` into buf (16 bytes suffice:
 * one enum field is at most 1 + 10 bytes); returns its length. */
static size_t pack_status(int status, uint8_t *buf)
{
    Grpc__Health__V1__HealthCheckResponse resp =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    return grpc__health__v1__health_check_response__pack(&resp, buf);
}

static void h_check(struct rt_grpc_call *call, void *ud)
{
    struct health *h = ud;
    Grpc__Health__V1__HealthCheckRequest *req =
        grpc__health__v1__health_check_request__unpack(NULL, call->msg_len,
                                                       call->msg);
    if (!req) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "malformed grpc.health.v1.HealthCheckRequest");
        return;
    }
    const char *svc = req->service ? req->service : "";
    int st = status_of(h, svc);
    if (st == ST_(SERVICE_UNKNOWN)) {
        char msg[200];
        snprintf(msg, sizeof(msg), "unknown service '%.150s'", svc);
        grpc__health__v1__health_check_request__free_unpacked(req, NULL);
        rt_grpc_call_finish(call, RT_GRPC_NOT_FOUND, msg);
        return;
    }
    grpc__health__v1__health_check_request__free_unpacked(req, NULL);
    uint8_t buf[16];
    size_t n = pack_status(st, buf);
    rt_grpc_call_reply(call, buf, n);
}

/* ---- Watch --------------------------------------------------------------- */

static void watcher_unlink(struct watcher *w)
{
    struct health *h = w->h;
    if (w->prev)
        w->prev->next = w->next;
    else
        h->watchers = w->next;
    if (w->next)
        w->next->prev = w->prev;
    if (!h->watchers && !h->srv->handles_closing)
        uv_timer_stop(&h->srv->health_timer);
    free(w->service);
    free(w);
}

/* Sends `status` to the watcher. Returns 0, or -1 when the stream ended
 * (the watcher is freed then). */
static int watcher_send(struct watcher *w, int status)
{
    uint8_t buf[16];
    size_t n = pack_status(status, buf);
    if (rt_grpc_call_pending_bytes(w->call) > WATCH_MAX_PENDING) {
        rt_grpc_call_finish(w->call, RT_GRPC_RESOURCE_EXHAUSTED,
                            "the client does not read its Watch stream");
        watcher_unlink(w);
        return -1;
    }
    if (rt_grpc_call_send(w->call, buf, n) != 0) {
        rt_grpc_call_finish(w->call, RT_GRPC_INTERNAL,
                            "could not queue a health update");
        watcher_unlink(w);
        return -1;
    }
    w->last = status;
    return 0;
}

static void on_health_timer(uv_timer_t *t)
{
    struct rt_grpc_server *srv = t->data;
    struct health *h = srv->health;
    for (struct watcher *w = h->watchers, *next; w; w = next) {
        next = w->next;
        int st = status_of(h, w->service);
        if (st != w->last)
            watcher_send(w, st);
    }
}

static void watch_cancelled(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    watcher_unlink(ud);
}

static void h_watch(struct rt_grpc_call *call, void *ud)
{
    struct health *h = ud;
    Grpc__Health__V1__HealthCheckRequest *req =
        grpc__health__v1__health_check_request__unpack(NULL, call->msg_len,
                                                       call->msg);
    if (!req) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "malformed grpc.health.v1.HealthCheckRequest");
        return;
    }
    struct watcher *w = calloc(1, sizeof(*w));
    if (w)
        w->service = strdup(req->service ? req->service : "");
    grpc__health__v1__health_check_request__free_unpacked(req, NULL);
    if (!w || !w->service) {
        if (w)
            free(w);
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    w->call = call;
    w->h = h;
    w->next = h->watchers;
    if (h->watchers)
        h->watchers->prev = w;
    else
        uv_timer_start(&h->srv->health_timer, on_health_timer,
                       RT_GRPC_HEALTH_POLL_MS, RT_GRPC_HEALTH_POLL_MS);
    h->watchers = w;
    rt_grpc_call_on_cancel(call, watch_cancelled, w);
    watcher_send(w, status_of(h, w->service));
}

void rt_grpc__health_close(struct rt_grpc_server *srv)
{
    struct health *h = srv->health;
    while (h->watchers) {
        struct watcher *w = h->watchers;
        /* The server stops serving every service it knows. */
        if (w->last != ST_(SERVICE_UNKNOWN) && w->last != ST_(NOT_SERVING) &&
            watcher_send(w, ST_(NOT_SERVING)) != 0)
            continue; /* ended and unlinked */
        rt_grpc_call_finish(w->call, RT_GRPC_UNAVAILABLE,
                            "the server is shutting down");
        watcher_unlink(w);
    }
}

void rt_grpc__health_free(void *health)
{
    free(health);
}

int rt_grpc_health_register(struct rt_grpc_server *srv, rt_grpc_health_fn fn,
                            void *ud, char *err, size_t errlen)
{
    if (!fn)
        return tg_err_set(err, errlen, TG_EINVAL, "NULL health callback");
    if (srv->health)
        return tg_err_set(err, errlen, TG_EEXIST,
                          "health service registered already");
    struct health *h = calloc(1, sizeof(*h));
    if (!h)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    h->fn = fn;
    h->ud = ud;
    h->srv = srv;
    int rc = rt_grpc_method_add(srv, RT_GRPC_PROBE_METHOD, RT_GRPC_UNARY,
                                h_check, h, err, errlen);
    if (rc == 0)
        rc = rt_grpc_method_add(srv, "/grpc.health.v1.Health/Watch",
                                RT_GRPC_SERVER_STREAM, h_watch, h, err,
                                errlen);
    /* Even on failure Check may be in the table, pointing at `h`: the
     * server owns `h` from here on (freed by rt_grpc_server_free). */
    srv->health = h;
    return rc;
}
