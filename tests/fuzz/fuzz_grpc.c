/*
 * fuzz_grpc.c — the router's gRPC server (router/net/rt_grpc*.c) on what an
 * untrusted HTTP/2 client sends: request headers (the checks of :method,
 * content-type, te, grpc-timeout, admission), the 5-byte length-prefixed
 * message framing split across DATA frames (compressed flag, sizes over
 * the limit, several messages, missing END_STREAM), unary, server-stream
 * and bidirectional calls, answers that complete later, and the services
 * that parse protobuf from the client inside rt_grpc: grpc.health.v1
 * (Check, Watch) and server reflection (v1, v1alpha) over the router's
 * own descriptors. tangram.v1 requests are unpacked and converted as
 * rt_api_grpc.c does (rt_api_grpc_convert) and answered.
 *
 * The real server runs on a libuv loop in this thread; the server end of
 * a socketpair is adopted as a connection (rt_grpc_server_adopt, the same
 * code path as an accepted TCP socket). The harness encodes the client's
 * side itself (connection preface, SETTINGS, HEADERS through nghttp2's
 * HPACK encoder, DATA frames), so the fuzzer's bytes land in the gRPC
 * layer rather than in HTTP/2 framing it cannot get right by chance.
 * Input layout:
 *   byte 0   bits 0-3: the method (table below); bit 4: raw mode, the
 *            rest of the input goes verbatim after the preface (HTTP/2
 *            frames of the fuzzer's own); bit 5: no END_STREAM (the
 *            request stays open); bit 6: the same request again on a
 *            second stream; bit 7: "authorization: Bearer deny" (the
 *            admission check refuses it)
 *   byte 1   bits 0-1: content-type application/grpc, application/
 *            grpc+proto, application/json, none; bit 2: no "te:
 *            trailers"; bit 3: grpc-timeout "5S"; bit 4: :method GET;
 *            bit 5: a malformed grpc-timeout; bits 6-7: the body goes in
 *            1, 2, 3 or 7 DATA frames
 *   bytes 2.. the request body: gRPC messages with their 5-byte prefixes
 * When the server goes quiet the client closes; every input must end with
 * the connection closed and no call handle left.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "router/api/rt_api_grpc.h"
#include "router/net/rt_grpc.h"
#include "router/net/rt_grpc_reflect.h"
#include "tangram.pb-c.h"
#include "tests/fuzz/fz_util.h"
#include "tg_api_descriptors.h"

static uv_loop_t loop;
static struct rt_grpc_server srv;
/* Smaller than two largest messages, so that refusals for the budget are
 * fuzzed too; nothing may stay charged once a connection is gone. */
static struct rt_conn_budget budget = {.limit = 98304};
/* What rt_api_grpc_convert checks against. */
static const struct rt_openai_cfg api_cfg = {.served_model = "tiny",
                                             .vocab_size = 151936};
static int client_fd = -1;

static const char *const methods[16] = {
    "/tangram.v1.Generation/Generate",
    "/tangram.v1.Generation/Tokenize",
    "/tangram.v1.Generation/Abort",
    "/tangram.v1.Generation/ModelInfo",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/fuzz.Echo/Bidi",
    "/fuzz.Echo/Unary",
    "/fuzz.Echo/Stream",
    "/fuzz.Echo/Later",
    "/nope.Service/Method",
    "x",
    "/tangram.v1.Generation/Generate",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
};

/* ---- handlers ----------------------------------------------------------- */

static void reply(struct rt_grpc_call *call, const ProtobufCMessage *m)
{
    size_t sz = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(sz + 1);
    if (!buf) {
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "oom");
        return;
    }
    protobuf_c_message_pack(m, buf);
    rt_grpc_call_reply(call, buf, sz);
    free(buf);
}

static void h_generate(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    Tangram__V1__GenerateRequest *q =
        tangram__v1__generate_request__unpack(NULL, call->msg_len, call->msg);
    if (!q) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "cannot parse tangram.v1.GenerateRequest");
        return;
    }
    struct rt_gen_request g;
    struct rt_request_error e;
    memset(&g, 0, sizeof(g));
    int rc = rt_api_grpc_convert(&api_cfg, q, &g, &e, call);
    tangram__v1__generate_request__free_unpacked(q, NULL);
    if (rc != 0) {
        rt_gen_request_free(&g);
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT, e.message);
        return;
    }
    Tangram__V1__GenerateResponse m = TANGRAM__V1__GENERATE_RESPONSE__INIT;
    m.text = g.q.prompt ? g.q.prompt : (char *)"";
    m.request_id = g.q.request_id ? g.q.request_id : (char *)"";
    m.finish_reason = TANGRAM__V1__FINISH_REASON__FINISH_REASON_STOP;
    size_t sz = tangram__v1__generate_response__get_packed_size(&m);
    uint8_t *buf = malloc(sz + 1);
    if (buf) {
        tangram__v1__generate_response__pack(&m, buf);
        rt_grpc_call_send(call, buf, sz);
        free(buf);
    }
    rt_gen_request_free(&g);
    rt_grpc_call_finish(call, RT_GRPC_OK, NULL);
}

static void h_tokenize(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    Tangram__V1__TokenizeRequest *q =
        tangram__v1__tokenize_request__unpack(NULL, call->msg_len, call->msg);
    if (!q) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "cannot parse tangram.v1.TokenizeRequest");
        return;
    }
    enum ct_role role;
    for (size_t i = 0; i < q->n_messages; i++) {
        if (ct_role_from_name(q->messages[i]->role ? q->messages[i]->role
                                                   : "",
                              &role) != 0) {
            tangram__v1__tokenize_request__free_unpacked(q, NULL);
            rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT, "role");
            return;
        }
    }
    Tangram__V1__TokenizeResponse m = TANGRAM__V1__TOKENIZE_RESPONSE__INIT;
    m.count = q->text ? (uint32_t)strlen(q->text) : 0;
    m.max_model_len = 4096;
    tangram__v1__tokenize_request__free_unpacked(q, NULL);
    reply(call, &m.base);
}

static void h_abort(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    Tangram__V1__AbortRequest *q =
        tangram__v1__abort_request__unpack(NULL, call->msg_len, call->msg);
    if (!q) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT,
                            "cannot parse tangram.v1.AbortRequest");
        return;
    }
    tangram__v1__abort_request__free_unpacked(q, NULL);
    Tangram__V1__AbortResponse m = TANGRAM__V1__ABORT_RESPONSE__INIT;
    reply(call, &m.base);
}

static void h_model_info(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    Tangram__V1__ModelInfoResponse m = TANGRAM__V1__MODEL_INFO_RESPONSE__INIT;
    m.model = (char *)"tiny";
    m.backend = (char *)"cpu";
    m.profile = (char *)"none";
    reply(call, &m.base);
}

static void bidi_msg(struct rt_grpc_call *call, const uint8_t *msg,
                     size_t len, void *ud)
{
    (void)ud;
    if (!msg) {
        rt_grpc_call_finish(call, RT_GRPC_OK, NULL);
        return;
    }
    if (len == 4 && memcmp(msg, "fail", 4) == 0) {
        rt_grpc_call_finish(call, RT_GRPC_INVALID_ARGUMENT, "bidi failed");
        return;
    }
    rt_grpc_call_send(call, msg, len);
}

static void bidi_cancel(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    (void)ud;
}

static void h_bidi(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    rt_grpc_call_on_cancel(call, bidi_cancel, NULL);
    rt_grpc_call_on_message(call, bidi_msg, NULL);
}

static void h_unary(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    rt_grpc_call_reply(call, call->msg, call->msg_len);
}

static void h_stream(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    for (int i = 0; i < 3; i++)
        rt_grpc_call_send(call, call->msg, call->msg_len);
    rt_grpc_call_finish(call, call->msg_len == 1 ? call->msg[0] % 17 : 0,
                        "done \xff\n%");
}

/* /fuzz.Echo/Later: answered from a timer on a later loop iteration. */
struct later {
    uv_timer_t timer;
    struct rt_grpc_call *call;
};

static void later_free(uv_handle_t *h)
{
    free(h->data);
}

static void later_fire(uv_timer_t *t)
{
    struct later *l = t->data;
    rt_grpc_call_reply(l->call, "later", 5);
    uv_close((uv_handle_t *)t, later_free);
}

static void later_cancel(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    struct later *l = ud;
    uv_timer_stop(&l->timer);
    uv_close((uv_handle_t *)&l->timer, later_free);
}

static void h_later(struct rt_grpc_call *call, void *ud)
{
    (void)ud;
    struct later *l = calloc(1, sizeof(*l));
    if (!l) {
        rt_grpc_call_finish(call, RT_GRPC_RESOURCE_EXHAUSTED, "oom");
        return;
    }
    l->call = call;
    uv_timer_init(&loop, &l->timer);
    l->timer.data = l;
    rt_grpc_call_on_cancel(call, later_cancel, l);
    uv_timer_start(&l->timer, later_fire, 0, 0);
}

static int admit(const struct rt_grpc_call *call, void *ud, char *msg,
                 size_t msglen)
{
    (void)ud;
    const char *h = rt_grpc_call_header(call, "authorization");
    if (h && strcmp(h, "Bearer deny") == 0) {
        snprintf(msg, msglen, "denied");
        return RT_GRPC_UNAUTHENTICATED;
    }
    return RT_GRPC_OK;
}

static int health(const char *service, void *ud)
{
    (void)ud;
    if (service[0] == '\0')
        return RT_GRPC_HEALTH_SERVING;
    return strcmp(service, "tangram.v1.Generation") == 0
               ? RT_GRPC_HEALTH_NOT_SERVING
               : RT_GRPC_HEALTH_UNKNOWN_SERVICE;
}

static void setup(void)
{
    char err[256];
    signal(SIGPIPE, SIG_IGN);
    if (uv_loop_init(&loop) != 0)
        fz_fail("uv_loop_init");
    struct rt_grpc_config cfg;
    rt_grpc_config_default(&cfg);
    cfg.max_message_bytes = 65536;
    cfg.max_header_bytes = 4096;
    cfg.max_concurrent_streams = 4;
    cfg.body_budget = &budget;
    if (rt_grpc_server_init(&srv, &loop, &cfg, err, sizeof(err)) != 0)
        fz_fail("rt_grpc_server_init: %s", err);
    static const struct {
        const char *path;
        enum rt_grpc_kind kind;
        rt_grpc_handler_fn fn;
    } m[] = {
        {"/tangram.v1.Generation/Generate", RT_GRPC_SERVER_STREAM, h_generate},
        {"/tangram.v1.Generation/Tokenize", RT_GRPC_UNARY, h_tokenize},
        {"/tangram.v1.Generation/Abort", RT_GRPC_UNARY, h_abort},
        {"/tangram.v1.Generation/ModelInfo", RT_GRPC_UNARY, h_model_info},
        {"/fuzz.Echo/Bidi", RT_GRPC_BIDI_STREAM, h_bidi},
        {"/fuzz.Echo/Unary", RT_GRPC_UNARY, h_unary},
        {"/fuzz.Echo/Stream", RT_GRPC_SERVER_STREAM, h_stream},
        {"/fuzz.Echo/Later", RT_GRPC_UNARY, h_later},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        if (rt_grpc_method_add(&srv, m[i].path, m[i].kind, m[i].fn, NULL, err,
                               sizeof(err)) != 0)
            fz_fail("rt_grpc_method_add: %s", err);
    rt_grpc_server_on_admit(&srv, admit, NULL);
    if (rt_grpc_health_register(&srv, health, NULL, err, sizeof(err)) != 0 ||
        rt_grpc_reflect_register(&srv, tg_api_descriptor_set,
                                 tg_api_descriptor_set_len, err,
                                 sizeof(err)) != 0)
        fz_fail("register: %s", err);
}

/* ---- the client's bytes ------------------------------------------------- */

struct out {
    uint8_t *p;
    size_t n, cap;
};

static void out_put(struct out *o, const void *p, size_t n)
{
    if (TG_GROW(o->p, &o->cap, o->n + n))
        fz_fail("out of memory");
    memcpy(o->p + o->n, p, n);
    o->n += n;
}

/* One HTTP/2 frame header (RFC 9113 §4.1) and its payload. */
static void frame(struct out *o, uint8_t type, uint8_t flags, uint32_t sid,
                  const void *payload, size_t n)
{
    uint8_t h[9] = {(uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n,
                    type,
                    flags,
                    (uint8_t)(sid >> 24),
                    (uint8_t)(sid >> 16),
                    (uint8_t)(sid >> 8),
                    (uint8_t)sid};
    out_put(o, h, 9);
    if (n)
        out_put(o, payload, n);
}

#define NV(n, v)                                                            \
    {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v),              \
     NGHTTP2_NV_FLAG_NONE}

static void request(struct out *o, nghttp2_hd_deflater *hd, uint32_t sid,
                    uint8_t f0, uint8_t f1, const uint8_t *body, size_t n)
{
    static const char *const ctypes[3] = {
        "application/grpc", "application/grpc+proto", "application/json"};
    nghttp2_nv nv[10];
    size_t k = 0;
    nv[k++] = (nghttp2_nv)NV(":method", (f1 & 16) ? "GET" : "POST");
    nv[k++] = (nghttp2_nv)NV(":scheme", "http");
    nv[k++] = (nghttp2_nv)NV(":path", methods[f0 & 15]);
    nv[k++] = (nghttp2_nv)NV(":authority", "fuzz");
    if ((f1 & 3) != 3)
        nv[k++] = (nghttp2_nv)NV("content-type", ctypes[f1 & 3]);
    if (!(f1 & 4))
        nv[k++] = (nghttp2_nv)NV("te", "trailers");
    if (f1 & 8)
        nv[k++] = (nghttp2_nv)NV("grpc-timeout", "5S");
    if (f1 & 32)
        nv[k++] = (nghttp2_nv)NV("grpc-timeout", "123456789n");
    if (f0 & 128)
        nv[k++] = (nghttp2_nv)NV("authorization", "Bearer deny");
    uint8_t hb[4096];
    ssize_t hl = nghttp2_hd_deflate_hd(hd, hb, sizeof(hb), nv, k);
    if (hl < 0)
        fz_fail("nghttp2_hd_deflate_hd: %s", nghttp2_strerror((int)hl));
    int eos = !(f0 & 32);
    frame(o, NGHTTP2_HEADERS,
          NGHTTP2_FLAG_END_HEADERS | (n == 0 && eos ? NGHTTP2_FLAG_END_STREAM
                                                    : 0),
          sid, hb, (size_t)hl);
    static const int splits[4] = {1, 2, 3, 7};
    size_t parts = (size_t)splits[f1 >> 6];
    size_t piece = n / parts + 1;
    for (size_t off = 0; off < n; off += piece) {
        size_t m = n - off < piece ? n - off : piece;
        int last = off + m == n;
        frame(o, NGHTTP2_DATA, last && eos ? NGHTTP2_FLAG_END_STREAM : 0, sid,
              body + off, m);
    }
}

/* ---- driving ------------------------------------------------------------ */

static int client_eof;

static size_t pump(void)
{
    uv_run(&loop, UV_RUN_NOWAIT);
    return fz_drain(client_fd, &client_eof);
}

static void pump_cb(void *ud)
{
    (void)ud;
    pump();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    if (size < 2)
        return 0;
    uint8_t f0 = data[0], f1 = data[1];
    const uint8_t *body = data + 2;
    size_t n = size - 2;
    static const char preface[] = NGHTTP2_CLIENT_MAGIC;
    struct out o = {0};
    out_put(&o, preface, sizeof(preface) - 1);
    frame(&o, NGHTTP2_SETTINGS, 0, 0, NULL, 0);
    if (f0 & 16) {
        out_put(&o, body, n);
    } else {
        nghttp2_hd_deflater *hd;
        if (nghttp2_hd_deflate_new(&hd, 4096) != 0)
            fz_fail("nghttp2_hd_deflate_new");
        request(&o, hd, 1, f0, f1, body, n);
        if (f0 & 64)
            request(&o, hd, 3, f0, f1, body, n);
        nghttp2_hd_deflate_del(hd);
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                   sv) != 0)
        fz_fail("socketpair");
    if (rt_grpc_server_adopt(&srv, sv[0]) != 0)
        fz_fail("rt_grpc_server_adopt");
    client_fd = sv[1];
    client_eof = 0;
    fz_write_all(client_fd, o.p, o.n, pump_cb, NULL);
    free(o.p);
    /* Until the server has nothing more to say (the calls that finish
     * finished; the rest wait for input that never comes). */
    int quiet = 0;
    long rounds = 0;
    while (!client_eof && quiet < 8) {
        quiet = pump() > 0 ? 0 : quiet + 1;
        if (++rounds > 1000000)
            fz_fail("the server kept writing (hang)");
    }
    close(client_fd);
    client_fd = -1;
    rounds = 0;
    while (srv.set.n_open > 0) {
        uv_run(&loop, UV_RUN_NOWAIT);
        if (++rounds > 1000000)
            fz_fail("the connection did not close after the client left "
                    "(hang)");
    }
    if (srv.zombies)
        fz_fail("a call handle was left behind");
    if (budget.used != 0)
        fz_fail("%zu message bytes still charged to the budget after the "
                "connection closed", budget.used);
    return 0;
}
