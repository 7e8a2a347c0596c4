/*
 * tt_grpc.h — the loopback fixture of the rt_grpc tests (test_grpc.c with
 * its raw nghttp2 client, test_grpc_grpcio.c with python3-grpcio): a gRPC
 * server with demo methods running on a uv loop in its own thread.
 *
 * Demo methods registered by tt_grpc_fx_start_cfg() (handlers run on the
 * loop thread; messages are raw bytes):
 *   /test.Echo/Unary       unary: the request back
 *   /test.Echo/Stream      stream: request "N SIZE [CODE]" gives N messages
 *                          of SIZE bytes (byte i of message k is
 *                          (k + i) & 255), then status CODE (default OK)
 *   /test.Echo/Ticks       stream: request "N" gives "tick 0" .. "tick N-1",
 *                          one per 2 ms from a timer, with on_cancel
 *   /test.Echo/Fail        unary: INVALID_ARGUMENT with the request as
 *                          message
 *   /test.Echo/Slow        stream: never answers; on_cancel counts cancels
 *                          and deadlines and checks that responses fail
 *   /test.Echo/Keep        unary: keeps the handle without on_cancel
 *                          (a zombie once the client leaves)
 *   /test.Echo/Release     unary: finishes every kept handle, answers
 *                          "<TG_ECANCELED results>/<kept>"
 *   /test.Echo/Stats       unary: "cancels cancel_deadline cancel_bad
 *                          slow_started n_conns n_kept" and the count of
 *                          each rt_grpc event (enum order)
 *   /test.Echo/SetServing  unary: "1"/"0" sets the health of
 *                          tangram.v1.Generation
 *   /test.Echo/Empty       unary: finishes OK without a message
 *   /test.Echo/Twice       unary: tries a second message (refused), then OK
 *   /test.Echo/Bidi        bidi: each request message back as it comes;
 *                          "fail" ends the call with INVALID_ARGUMENT
 *                          "bidi failed"; the client's half-close ends it
 *                          OK
 *   /test.Secret/Unary     unary echo behind the admission check: needs
 *                          "authorization: Bearer s3cret" (else
 *                          UNAUTHENTICATED "no key" from the headers)
 * plus the health service ("" serving, tangram.v1.Generation as set, any
 * other name unknown) and server reflection over the router's embedded
 * descriptors (tg_api_descriptor_set, or a set of the test's). Every
 * rt_grpc event is counted.
 *
 * Test code only. Start and stop run on the test thread; a failed check
 * fails the running cmocka test.
 */
#ifndef TT_GRPC_H
#define TT_GRPC_H

#include <pthread.h>
#include <stdatomic.h>

#include "router/net/rt_grpc.h"

#define TT_GRPC_MAX_KEPT 64 /* handles /test.Echo/Keep holds at most */

struct tt_grpc_fx {
    uv_loop_t loop;
    struct rt_grpc_server srv;
    uv_async_t stop;
    pthread_t thread;
    int port;                   /* the listening port on 127.0.0.1 */
    atomic_int serving;         /* health of "tangram.v1.Generation" */
    atomic_int cancels;         /* on_cancel calls, any status */
    atomic_int cancel_deadline; /* ... with DEADLINE_EXCEEDED */
    atomic_int cancel_bad;      /* on_cancel with an unexpected status or
                                   a response call not failing */
    atomic_int slow_started;    /* /test.Echo/Slow calls begun */
    atomic_int events[RT_GRPC_EVENT_COUNT]; /* rt_grpc events seen */
    atomic_int admits;          /* admission checks of /test.Secret/ */
    struct rt_grpc_call *kept[TT_GRPC_MAX_KEPT]; /* zombies-to-be (no
                                                    on_cancel); loop thread */
    int n_kept;
    int zombie_rc_ok;           /* finishes of kept handles that gave
                                   TG_ECANCELED */
};

/* Zeroes fx, starts the server with `cfg` (NULL: defaults) and the demo
 * methods on an ephemeral port of 127.0.0.1, and runs its loop in a new
 * thread. Also checks that duplicate registrations and a second listen
 * are refused. The caller owns fx and stops it with tt_grpc_fx_stop(). */
void tt_grpc_fx_start_cfg(struct tt_grpc_fx *fx,
                          const struct rt_grpc_config *cfg);

/* tt_grpc_fx_start_cfg() with reflection serving the descriptor set
 * `set` (set_len bytes, a serialized FileDescriptorSet) instead. */
void tt_grpc_fx_start_set(struct tt_grpc_fx *fx,
                          const struct rt_grpc_config *cfg,
                          const uint8_t *set, size_t set_len);

/* tt_grpc_fx_start_cfg() with the default configuration. */
void tt_grpc_fx_start(struct tt_grpc_fx *fx);

/* Closes the server from its loop thread (calls in flight are
 * cancelled), joins the thread and frees the server and the loop; fx
 * itself stays the caller's. */
void tt_grpc_fx_stop(struct tt_grpc_fx *fx);

#endif /* TT_GRPC_H */
