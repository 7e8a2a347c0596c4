/*
 * rt_grpc_internal.h — what rt_grpc.c (connections, nghttp2 glue, close),
 * rt_grpc_call.c (calls, framing, responses), rt_grpc_timer.c (deadlines),
 * rt_grpc_health.c and rt_grpc_reflect.c share. Not for other modules.
 *
 * Lifetime of a call: created when a stream's request HEADERS begin and
 * linked on its connection (call->conn). It is freed once both the stream
 * is gone (call->conn == NULL: nghttp2 closed it, or the connection went
 * away) and nobody holds the handle (call->user_holds == 0: never
 * dispatched, finished by the handler, or taken by the cancel callback).
 * A handle still held after its stream is gone sits on srv->zombies.
 * While the server delivers to a call (handler, message callback) it is
 * pinned (call->pinned) and not freed until unpinned.
 *
 * Re-entrancy: nghttp2 must not be re-entered from its own callbacks, and
 * a connection may be closed by user code running inside one (a cancel
 * callback). So: handlers run after nghttp2_session_mem_recv() returned
 * (conn->ready queue); output produced while nghttp2 is running is flushed
 * afterwards (conn->in_ng, the server's flush list); a closed connection
 * keeps its nghttp2 session until its uv handles are closed, and every
 * nghttp2 callback returns at once when conn->closing is set.
 */
#ifndef RT_GRPC_INTERNAL_H
#define RT_GRPC_INTERNAL_H

#include <nghttp2/nghttp2.h>

#include "router/net/rt_grpc.h"

/* call->state */
enum {
    CS_RECV = 0,       /* receiving headers / message */
    CS_REJECTED = 1,   /* answered by the server before dispatch */
    CS_READY = 2,      /* complete, queued for dispatch */
    CS_DISPATCHED = 3, /* handed to the handler */
};

/* A bidirectional call's request message waiting for delivery. */
struct rt_grpc_inmsg {
    struct rt_grpc_inmsg *next;
    size_t len;
    uint8_t data[];              /* (len) the message without its prefix */
};

struct rt_grpc_conn {
    struct rt_conn base;         /* the socket and its place in the
                                    server's connection set (first member;
                                    base.tcp.data also set) */
    uv_timer_t linger;           /* the bound of a closing connection's
                                    last writes (server close, eviction) */
    uv_shutdown_t shutdown_req;
    struct rt_grpc_server *srv;
    struct rt_grpc_conn *next_flush;  /* srv->flush */
    nghttp2_session *ng;
    struct rt_grpc_call *calls;  /* doubly linked: streams with state */
    struct rt_grpc_call *ready, *ready_tail; /* to dispatch, or bidi calls
                                    with input to deliver */
    size_t n_calls;
    uint64_t id;                 /* srv->next_conn_id at accept */
    int handles_open;
    int in_ng;                   /* nghttp2 is on the stack */
    int in_flush;                /* on srv->flush */
    int closing, finishing;
    int draining;                /* server close: GOAWAY sent, lingering */
    int write_blocked;           /* flush stopped on a full write queue */
    char rbuf[65536];            /* read buffer (uv alloc callback) */
};

/* rt_grpc.c */
/* Sends what nghttp2 has queued now when safe, else from the loop. */
void rt_grpc__conn_flush_later(struct rt_grpc_conn *conn);
/* Closes the connection at once, cancelling its calls. */
void rt_grpc__conn_close(struct rt_grpc_conn *conn);
/* A response frame of a call a handler took went out, or such a call
 * finished: an idle connection's idle clock restarts. */
void rt_grpc__conn_touch(struct rt_grpc_conn *conn);
/* Reports an event through srv->on_event. */
void rt_grpc__event(struct rt_grpc_server *srv, int event);
/* Appends `call` to its connection's ready queue (once). */
void rt_grpc__ready_push(struct rt_grpc_call *call);

/* rt_grpc_call.c */
struct rt_grpc_call *rt_grpc__call_new(struct rt_grpc_conn *conn,
                                       int32_t stream_id);
void rt_grpc__call_header(struct rt_grpc_call *call, const uint8_t *name,
                          size_t nlen, const uint8_t *value, size_t vlen);
void rt_grpc__call_headers_done(struct rt_grpc_call *call);
void rt_grpc__call_data(struct rt_grpc_call *call, const uint8_t *data,
                        size_t len);
void rt_grpc__call_end_stream(struct rt_grpc_call *call);
/* Runs the handler of a CS_READY call and delivers the queued input of a
 * bidi call (top of the loop's stack). */
void rt_grpc__call_dispatch(struct rt_grpc_call *call);
/* Answers a call the handler never saw (state CS_RECV or CS_READY) with
 * `status`; the stream must still exist. */
void rt_grpc__call_reject(struct rt_grpc_call *call, int status,
                          int http_status, const char *message);
/* Takes a dispatched call away from its handler (cancel callback with
 * `cancel_status`) and ends it with `status` and `message`; a call not
 * dispatched yet is rejected instead. */
void rt_grpc__call_fail(struct rt_grpc_call *call, int cancel_status,
                        int status, const char *message);
/* True while a dispatched call is held by its handler and not ending. */
int rt_grpc__call_in_progress(const struct rt_grpc_call *call);
/* The stream is gone (nghttp2 closed it, or the connection is closing):
 * unlinks the call from its connection, cancels a held handle, frees. */
void rt_grpc__call_stream_gone(struct rt_grpc_call *call);
/* After a frame of `call` was sent. */
void rt_grpc__call_frame_sent(struct rt_grpc_call *call,
                              const nghttp2_frame *frame);
/* Frees a zombie handle (server free). */
void rt_grpc__call_free(struct rt_grpc_call *call);

/* rt_grpc_timer.c */
/* Arms srv->deadline_timer for `when` (uv_now() ms) unless it fires
 * earlier already. */
void rt_grpc__deadline_arm(struct rt_grpc_server *srv, uint64_t when);
/* Deadline timer callback (srv->deadline_timer). */
void rt_grpc__deadline_fire(uv_timer_t *t);

/* rt_grpc_health.c */
/* Server close: final state to each Watch stream, which then ends. */
void rt_grpc__health_close(struct rt_grpc_server *srv);
/* Frees the health state (srv->health); safe on NULL. */
void rt_grpc__health_free(void *health);

/* rt_grpc_reflect.c */
/* Frees the reflection state (srv->reflection); safe on NULL. */
void rt_grpc__reflect_free(void *reflection);

#endif /* RT_GRPC_INTERNAL_H */
