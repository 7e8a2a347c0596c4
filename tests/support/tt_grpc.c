/* tt_grpc.c — the rt_grpc loopback fixture shared by test_grpc.c and
 * test_grpc_grpcio.c (see tt_grpc.h). */
#include "tests/support/tt_grpc.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/net/rt_grpc_reflect.h"
#include "tg_api_descriptors.h"

/* A /test.Echo/Ticks call in progress. */
struct tick {
    uv_timer_t timer;
    struct rt_grpc_call *call;
    struct tt_grpc_fx *fx;
    int left, sent;
};

static void on_stop(uv_async_t *a)
{
    struct tt_grpc_fx *fx = a->data;
    rt_grpc_server_close(&fx->srv, NULL, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_thread(void *arg)
{
    struct tt_grpc_fx *fx = arg;
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* -- handlers (loop thread) -- */

static void h_echo(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    assert_int_equal(rt_grpc_call_reply(call, call->msg, call->msg_len), 0);
}

/* Request "N SIZE [CODE]": N messages of SIZE bytes (byte i of message k
 * is (k + i) & 255), then status CODE (default OK) with a message. */
static void h_stream(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    char req[64] = {0};
    memcpy(req, call->msg, call->msg_len < 63 ? call->msg_len : 63);
    int n = 0, size = 0, code = 0;
    if (sscanf(req, "%d %d %d", &n, &size, &code) < 2 || n < 0 || size < 0 ||
        size > (1 << 20)) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT, "bad request");
        return;
    }
    uint8_t *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < size; i++)
            buf[i] = (uint8_t)(k + i);
        assert_int_equal(rt_grpc_call_send(call, buf, (size_t)size), 0);
    }
    free(buf);
    assert_true(rt_grpc_call_pending_bytes(call) > 0 || n == 0);
    rt_grpc_call_finish(call, code, code ? "stream failed: ÿ 100%" : NULL);
}

static void tick_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_tick_cancel(struct rt_grpc_call *call, int status, void *ud)
{
    struct tick *t = ud;
    (void)call;
    atomic_fetch_add(&t->fx->cancels, 1);
    if (status != RT_GRPC_CANCELLED && status != RT_GRPC_DEADLINE_EXCEEDED)
        atomic_fetch_add(&t->fx->cancel_bad, 1);
    uv_close((uv_handle_t *)&t->timer, tick_closed);
}

static void on_tick(uv_timer_t *tm)
{
    struct tick *t = tm->data;
    char m[32];
    int n = snprintf(m, sizeof(m), "tick %d", t->sent);
    assert_int_equal(rt_grpc_call_send(t->call, m, (size_t)n), 0);
    t->sent++;
    if (--t->left == 0) {
        rt_grpc_call_finish(t->call, RT_GRPC_OK, NULL);
        uv_close((uv_handle_t *)&t->timer, tick_closed);
    }
}

/* Request "N": N messages "tick i", one per 2 ms from a timer, so the
 * data source runs dry between them (deferred, then resumed). */
static void h_ticks(struct rt_grpc_call *call, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    char req[32] = {0};
    memcpy(req, call->msg, call->msg_len < 31 ? call->msg_len : 31);
    int n = atoi(req);
    if (n <= 0) {
        rt_grpc_call_finish(call, RT_GRPC_OK, NULL);
        return;
    }
    struct tick *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    t->call = call;
    t->fx = fx;
    t->left = n;
    uv_timer_init(&fx->loop, &t->timer);
    t->timer.data = t;
    rt_grpc_call_on_cancel(call, on_tick_cancel, t);
    uv_timer_start(&t->timer, on_tick, 2, 2);
}

static void h_fail(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    char msg[512] = {0};
    memcpy(msg, call->msg, call->msg_len < 511 ? call->msg_len : 511);
    assert_int_equal(rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT, msg),
                     0);
}

static void on_slow_cancel(struct rt_grpc_call *call, int status, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    atomic_fetch_add(&fx->cancels, 1);
    if (status == RT_GRPC_DEADLINE_EXCEEDED)
        atomic_fetch_add(&fx->cancel_deadline, 1);
    else if (status != RT_GRPC_CANCELLED)
        atomic_fetch_add(&fx->cancel_bad, 1);
    /* Inside the callback every response call fails. */
    if (rt_grpc_call_send(call, "x", 1) != TG_ECANCELED ||
        rt_grpc_call_finish(call, RT_GRPC_OK, NULL) != TG_ECANCELED ||
        rt_grpc_call_pending_bytes(call) != 0)
        atomic_fetch_add(&fx->cancel_bad, 1);
}

/* Never answers: waits for a cancel or a deadline. */
static void h_slow(struct rt_grpc_call *call, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    atomic_fetch_add(&fx->slow_started, 1);
    rt_grpc_call_on_cancel(call, on_slow_cancel, fx);
}

/* Never answers and sets no cancel callback: becomes a zombie. */
static void h_keep(struct rt_grpc_call *call, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    if (fx->n_kept == TT_GRPC_MAX_KEPT) {
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "full");
        return;
    }
    fx->kept[fx->n_kept++] = call;
}

/* Finishes every kept handle; answers how many said TG_ECANCELED (all of
 * them should, their clients being gone). */
static void h_release(struct rt_grpc_call *call, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    int ok = 0, n = fx->n_kept;
    for (int i = 0; i < n; i++)
        ok += rt_grpc_call_finish(fx->kept[i], RT_GRPC_OK, NULL) ==
              TG_ECANCELED;
    fx->n_kept = 0;
    char m[64];
    int len = snprintf(m, sizeof(m), "%d/%d", ok, n);
    rt_grpc_call_reply(call, m, (size_t)len);
}

static void h_stats(struct rt_grpc_call *call, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    char m[256];
    int n = snprintf(
        m, sizeof(m), "%d %d %d %d %zu %d", atomic_load(&fx->cancels),
        atomic_load(&fx->cancel_deadline), atomic_load(&fx->cancel_bad),
        atomic_load(&fx->slow_started), fx->srv.set.n_open, fx->n_kept);
    for (int e = 0; e < RT_GRPC_EVENT_COUNT; e++)
        n += snprintf(m + n, sizeof(m) - (size_t)n, " %d",
                      atomic_load(&fx->events[e]));
    rt_grpc_call_reply(call, m, (size_t)n);
}

static void h_set_serving(struct rt_grpc_call *call, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    atomic_store(&fx->serving, call->msg_len && call->msg[0] == '1');
    rt_grpc_call_reply(call, "", 0);
}

/* A unary handler that forgets its message: the client sees INTERNAL. */
static void h_empty(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    assert_int_equal(rt_grpc_call_finish(call, RT_GRPC_OK, NULL), 0);
}

/* A unary handler trying a second message (refused) then finishing. */
static void h_twice(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    assert_int_equal(rt_grpc_call_send(call, "one", 3), 0);
    assert_int_equal(rt_grpc_call_send(call, "two", 3), TG_EINVAL);
    assert_int_equal(rt_grpc_call_finish(call, 17, NULL), TG_EINVAL);
    assert_int_equal(rt_grpc_call_finish(call, RT_GRPC_OK, NULL), 0);
}

static void on_bidi_message(struct rt_grpc_call *call, const uint8_t *msg,
                            size_t len, void *ud)
{
    (void)ud;
    if (!msg) {
        assert_int_equal(rt_grpc_call_finish(call, RT_GRPC_OK, NULL), 0);
        return;
    }
    if (len == 4 && memcmp(msg, "fail", 4) == 0) {
        assert_int_equal(rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                                             "bidi failed"),
                         0);
        return;
    }
    assert_int_equal(rt_grpc_call_send(call, msg, len), 0);
}

static void on_bidi_cancel(struct rt_grpc_call *call, int status, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    (void)call;
    atomic_fetch_add(&fx->cancels, 1);
    if (status == RT_GRPC_DEADLINE_EXCEEDED)
        atomic_fetch_add(&fx->cancel_deadline, 1);
    else if (status != RT_GRPC_CANCELLED)
        atomic_fetch_add(&fx->cancel_bad, 1);
}

/* Bidi echo: no message yet when this runs. */
static void h_bidi(struct rt_grpc_call *call, void *ud)
{
    assert_null(call->msg);
    rt_grpc_call_on_cancel(call, on_bidi_cancel, ud);
    rt_grpc_call_on_message(call, on_bidi_message, ud);
}

static int admit_fn(const struct rt_grpc_call *call, void *ud, char *msg,
                    size_t msglen)
{
    struct tt_grpc_fx *fx = ud;
    if (strncmp(call->path, "/test.Secret/", 13) != 0)
        return RT_GRPC_OK;
    atomic_fetch_add(&fx->admits, 1);
    const char *h = rt_grpc_call_header(call, "authorization");
    if (h && strcmp(h, "Bearer s3cret") == 0)
        return RT_GRPC_OK;
    snprintf(msg, msglen, "no key");
    return RT_GRPC_UNAUTHENTICATED;
}

static void event_fn(int event, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    assert_true(event >= 0 && event < RT_GRPC_EVENT_COUNT);
    atomic_fetch_add(&fx->events[event], 1);
}

static int health_fn(const char *service, void *ud)
{
    struct tt_grpc_fx *fx = ud;
    if (service[0] == '\0')
        return RT_GRPC_HEALTH_SERVING;
    if (strcmp(service, "tangram.v1.Generation") == 0)
        return atomic_load(&fx->serving) ? RT_GRPC_HEALTH_SERVING
                                         : RT_GRPC_HEALTH_NOT_SERVING;
    return RT_GRPC_HEALTH_UNKNOWN_SERVICE;
}

void tt_grpc_fx_start_cfg(struct tt_grpc_fx *fx,
                          const struct rt_grpc_config *cfg)
{
    tt_grpc_fx_start_set(fx, cfg, tg_api_descriptor_set,
                         tg_api_descriptor_set_len);
}

void tt_grpc_fx_start_set(struct tt_grpc_fx *fx,
                          const struct rt_grpc_config *cfg,
                          const uint8_t *set, size_t set_len)
{
    memset(fx, 0, sizeof(*fx));
    atomic_store(&fx->serving, 1);
    char err[256];
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    assert_int_equal(rt_grpc_server_init(&fx->srv, &fx->loop, cfg, err,
                                         sizeof(err)),
                     0);
    static const struct {
        const char *path;
        enum rt_grpc_kind kind;
        rt_grpc_handler_fn fn;
    } m[] = {
        {"/test.Echo/Unary", RT_GRPC_UNARY, h_echo},
        {"/test.Echo/Stream", RT_GRPC_SERVER_STREAM, h_stream},
        {"/test.Echo/Ticks", RT_GRPC_SERVER_STREAM, h_ticks},
        {"/test.Echo/Fail", RT_GRPC_UNARY, h_fail},
        {"/test.Echo/Slow", RT_GRPC_SERVER_STREAM, h_slow},
        {"/test.Echo/Keep", RT_GRPC_UNARY, h_keep},
        {"/test.Echo/Release", RT_GRPC_UNARY, h_release},
        {"/test.Echo/Stats", RT_GRPC_UNARY, h_stats},
        {"/test.Echo/SetServing", RT_GRPC_UNARY, h_set_serving},
        {"/test.Echo/Empty", RT_GRPC_UNARY, h_empty},
        {"/test.Echo/Twice", RT_GRPC_UNARY, h_twice},
        {"/test.Echo/Bidi", RT_GRPC_BIDI_STREAM, h_bidi},
        {"/test.Secret/Unary", RT_GRPC_UNARY, h_echo},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        assert_int_equal(rt_grpc_method_add(&fx->srv, m[i].path, m[i].kind,
                                            m[i].fn, fx, err, sizeof(err)),
                         0);
    assert_int_equal(rt_grpc_method_add(&fx->srv, "/test.Echo/Unary",
                                        RT_GRPC_UNARY, h_echo, fx, err,
                                        sizeof(err)),
                     TG_EEXIST);
    assert_int_equal(
        rt_grpc_health_register(&fx->srv, health_fn, fx, err, sizeof(err)), 0);
    assert_int_equal(
        rt_grpc_health_register(&fx->srv, health_fn, fx, err, sizeof(err)),
        TG_EEXIST);
    assert_int_equal(rt_grpc_reflect_register(&fx->srv, set, set_len, err,
                                              sizeof(err)),
                     0);
    assert_int_equal(rt_grpc_reflect_register(&fx->srv, set, set_len, err,
                                              sizeof(err)),
                     TG_EEXIST);
    rt_grpc_server_on_admit(&fx->srv, admit_fn, fx);
    rt_grpc_server_on_event(&fx->srv, event_fn, fx);
    assert_int_equal(rt_grpc_server_listen(&fx->srv, "127.0.0.1", 0, err,
                                           sizeof(err)),
                     0);
    assert_int_equal(rt_grpc_server_listen(&fx->srv, "127.0.0.1", 0, err,
                                           sizeof(err)),
                     TG_EINVAL);
    fx->port = fx->srv.set.port;
    assert_true(fx->port > 0);
    uv_async_init(&fx->loop, &fx->stop, on_stop);
    fx->stop.data = fx;
    assert_int_equal(pthread_create(&fx->thread, NULL, loop_thread, fx), 0);
}

void tt_grpc_fx_start(struct tt_grpc_fx *fx)
{
    tt_grpc_fx_start_cfg(fx, NULL);
}

void tt_grpc_fx_stop(struct tt_grpc_fx *fx)
{
    uv_async_send(&fx->stop);
    pthread_join(fx->thread, NULL);
    /* Handles still kept by h_keep are zombies or cancelled now; the
     * server frees them. */
    rt_grpc_server_free(&fx->srv);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
}
