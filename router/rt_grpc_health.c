/*
 * rt_grpc_health.c — grpc.health.v1.Health on rt_grpc (see rt_grpc.h and
 * proto/health.proto; protocol from the gRPC repository's
 * doc/health-checking.md): Check answers SERVING / NOT_SERVING from the
 * caller's callback, or 5 NOT_FOUND for a service the callback does not
 * know; Watch is answered UNIMPLEMENTED (probes only use Check).
 */
#include "router/rt_grpc.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/tg_err.h"
#include "proto/health.pb-c.h"

struct health {
    rt_grpc_health_fn fn;
    void *ud;
};

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
    int st = h->fn(svc, h->ud);
    if (st != RT_GRPC_HEALTH_SERVING && st != RT_GRPC_HEALTH_NOT_SERVING) {
        char msg[200];
        snprintf(msg, sizeof(msg), "unknown service '%.150s'", svc);
        grpc__health__v1__health_check_request__free_unpacked(req, NULL);
        rt_grpc_call_finish(call, RT_GRPC_NOT_FOUND, msg);
        return;
    }
    grpc__health__v1__health_check_request__free_unpacked(req, NULL);
    Grpc__Health__V1__HealthCheckResponse resp =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = st == RT_GRPC_HEALTH_SERVING
                      ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    uint8_t buf[16]; /* one enum field: at most 1 + 10 bytes */
    size_t n = grpc__health__v1__health_check_response__pack(&resp, buf);
    rt_grpc_call_reply(call, buf, n);
}

static void h_watch(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    rt_grpc_call_finish(call, RT_GRPC_UNIMPLEMENTED,
                        "grpc.health.v1.Health/Watch is not supported; "
                        "use Check");
}

int rt_grpc_health_register(struct rt_grpc_server *srv, rt_grpc_health_fn fn,
                            void *ud, char *err, size_t errlen)
{
    if (!fn)
        return tg_err_set(err, errlen, TG_EINVAL, "NULL health callback");
    if (srv->health)
        return tg_err_set(err, errlen, TG_EEXIST,
                          "health service registered already");
    struct health *h = malloc(sizeof(*h));
    if (!h)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    h->fn = fn;
    h->ud = ud;
    int rc = rt_grpc_method_add(srv, "/grpc.health.v1.Health/Check",
                                RT_GRPC_UNARY, h_check, h, err, errlen);
    if (rc == 0)
        rc = rt_grpc_method_add(srv, "/grpc.health.v1.Health/Watch",
                                RT_GRPC_SERVER_STREAM, h_watch, h, err,
                                errlen);
    /* Even on failure Check may be in the table, pointing at `h`: the
     * server owns `h` from here on (freed by rt_grpc_server_free). */
    srv->health = h;
    return rc;
}
