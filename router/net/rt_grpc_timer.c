/*
 * rt_grpc_timer.c — the deadlines of gRPC calls (see rt_grpc.h,
 * rt_grpc_internal.h): the client's grpc-timeout and the server's receive
 * deadline, both served by one timer of the server (srv->deadline_timer)
 * armed for the earliest of them.
 *
 * - grpc-timeout (call->deadline_ms) runs from the request headers until
 *   the call ends; when it passes, the handler loses the call (cancel
 *   callback with RT_GRPC_DEADLINE_EXCEEDED) and the client gets
 *   4 DEADLINE_EXCEEDED.
 * - The receive deadline (call->recv_deadline_ms) runs while the server
 *   waits for request bytes: from the first HEADERS frame until END_STREAM
 *   for unary and server-streaming calls, and from the headers or the last
 *   message until the next one for bidirectional calls. A stream that
 *   misses it gets 4 DEADLINE_EXCEEDED and is reset; a header block left
 *   unfinished closes its connection (no HTTP/2 frame may come between the
 *   pieces of a header block, so the connection is stuck anyway).
 */
#include "router/net/rt_grpc_internal.h"

#include <stdio.h>

/* grpc-timeout still matters: before dispatch, or while the handler
 * holds the call. */
static int deadline_live(const struct rt_grpc_call *call)
{
    if (!call->deadline_ms || call->finishing)
        return 0;
    return call->state == CS_RECV || call->state == CS_READY ||
           rt_grpc__call_in_progress(call);
}

/* The server still waits for request bytes of this call. */
static int recv_live(const struct rt_grpc_call *call)
{
    if (!call->recv_deadline_ms || call->req_ended || call->finishing ||
        call->canceled)
        return 0;
    if (call->state == CS_RECV)
        return 1;
    return call->kind == RT_GRPC_BIDI_STREAM &&
           (call->state == CS_READY || call->state == CS_DISPATCHED);
}

/* The earliest live deadline of a call, 0 when none. */
static uint64_t next_expiry(const struct rt_grpc_call *call)
{
    uint64_t t = deadline_live(call) ? call->deadline_ms : 0;
    if (recv_live(call) && (!t || call->recv_deadline_ms < t))
        t = call->recv_deadline_ms;
    return t;
}

void rt_grpc__deadline_arm(struct rt_grpc_server *srv, uint64_t when)
{
    if (srv->closing || (srv->deadline_armed && srv->deadline_armed <= when))
        return;
    uint64_t now = uv_now(srv->loop);
    srv->deadline_armed = when;
    uv_timer_start(&srv->deadline_timer, rt_grpc__deadline_fire,
                   when > now ? when - now : 0, 0);
}

/* Ends a call at its deadline (at `now`); user code may run (cancel
 * callback). */
static void expire(struct rt_grpc_call *call, uint64_t now)
{
    struct rt_grpc_server *srv = call->srv;
    if (deadline_live(call) && call->deadline_ms <= now) {
        call->deadline_ms = 0;
        rt_grpc__event(srv, RT_GRPC_EVENT_DEADLINE);
        rt_grpc__call_fail(call, RT_GRPC_DEADLINE_EXCEEDED,
                           RT_GRPC_DEADLINE_EXCEEDED, "deadline exceeded");
        return;
    }
    call->recv_deadline_ms = 0;
    rt_grpc__event(srv, RT_GRPC_EVENT_RECV_TIMEOUT);
    if (!call->headers_done) {
        rt_grpc__conn_close(call->conn);
        return;
    }
    char msg[160];
    if (call->kind == RT_GRPC_BIDI_STREAM && call->state != CS_RECV)
        snprintf(msg, sizeof(msg),
                 "no request message for %u ms (server receive timeout)",
                 srv->cfg.recv_timeout_ms);
    else
        snprintf(msg, sizeof(msg),
                 "the request did not arrive within %u ms of its headers "
                 "(server receive timeout)",
                 srv->cfg.recv_timeout_ms);
    rt_grpc__call_fail(call, RT_GRPC_DEADLINE_EXCEEDED,
                       RT_GRPC_DEADLINE_EXCEEDED, msg);
}

void rt_grpc__deadline_fire(uv_timer_t *t)
{
    struct rt_grpc_server *srv = t->data;
    srv->deadline_armed = 0;
    if (srv->closing)
        return;
    uint64_t now = uv_now(srv->loop);
    /* Connections leave the set's list (set.open) only in their close
     * callbacks, so the outer walk is safe whatever user code does. A
     * cancel callback may change a connection's call list, so its scan
     * restarts after each expiry; an expired call has no live deadline
     * left, so this ends. */
    for (struct rt_conn *b = srv->set.open; b && !srv->closing; b = b->onext) {
        struct rt_grpc_conn *c = (struct rt_grpc_conn *)b;
        int again = 1;
        while (again && !c->closing && !c->draining) {
            again = 0;
            for (struct rt_grpc_call *k = c->calls; k; k = k->next) {
                uint64_t e = next_expiry(k);
                if (e && e <= now) {
                    expire(k, now);
                    again = 1;
                    break;
                }
            }
        }
    }
    if (srv->closing)
        return;
    uint64_t next = 0;
    for (struct rt_conn *b = srv->set.open; b; b = b->onext) {
        const struct rt_grpc_conn *c = (const struct rt_grpc_conn *)b;
        if (c->closing || c->draining)
            continue;
        for (struct rt_grpc_call *k = c->calls; k; k = k->next) {
            uint64_t e = next_expiry(k);
            if (e && (!next || e < next))
                next = e;
        }
    }
    if (next)
        rt_grpc__deadline_arm(srv, next);
}
