/*
 * fuzz_grpc_msg.c — the protobuf messages a gRPC client sends the router,
 * decoded the way router/api/rt_api_grpc.c decodes them: tangram.v1
 * GenerateRequest (unpacked, then converted into the router's request by
 * rt_api_grpc_convert, whose sampling check (tg_sampling_check) runs, and
 * rt_request_fit), TokenizeRequest (unpacked, roles checked with
 * ct_role_from_name), AbortRequest, and grpc.health.v1
 * HealthCheckRequest. The framing around them (HTTP/2, the 5-byte gRPC
 * prefix) and the reflection service are fuzzed by fuzz_grpc.c; this
 * harness reaches the message decoding at full speed.
 *
 * Input layout:
 *   byte 0      the message type: & 3 = GenerateRequest, TokenizeRequest,
 *               AbortRequest, HealthCheckRequest; bit 2: the call carries
 *               an "x-session-id" header
 *   bytes 1..   the protobuf bytes (the gRPC message without its prefix)
 */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "health.pb-c.h"
#include "router/api/rt_api_grpc.h"
#include "router/api/rt_openai.h"
#include "tangram.pb-c.h"
#include "tests/fuzz/fz_util.h"

/* What rt_api_grpc_convert checks against. */
static const struct rt_openai_cfg cfg = {.served_model = "tiny",
                                         .vocab_size = 151936};

static void generate(const uint8_t *msg, size_t len, int session_header)
{
    Tangram__V1__GenerateRequest *q =
        tangram__v1__generate_request__unpack(NULL, len, msg);
    if (!q)
        return;
    static const struct rt_grpc_header hdrs[] = {
        {":path", "/tangram.v1.Generation/Generate"},
        {"x-session-id", "conversation-7"},
    };
    struct rt_grpc_call call;
    memset(&call, 0, sizeof(call));
    call.path = hdrs[0].value;
    call.headers = hdrs;
    call.n_headers = session_header ? 2 : 1;
    struct rt_gen_request g;
    struct rt_request_error e;
    memset(&g, 0, sizeof(g));
    int rc = rt_api_grpc_convert(&cfg, q, &g, &e, &call);
    tangram__v1__generate_request__free_unpacked(q, NULL);
    if (rc == 0) {
        if ((g.q.prompt != NULL) + (g.q.prompt_ids != NULL) +
                (g.q.chat.messages != NULL) !=
            1)
            fz_fail("a request needs exactly one prompt form");
        /* The prompt's token count as the router would find it: ids as
         * given, text at most one token per byte. */
        int64_t n = g.q.prompt_ids ? (int64_t)g.q.n_prompt_ids
                    : g.q.prompt   ? (int64_t)g.q.prompt_len
                                   : (int64_t)g.q.chat.n_messages * 4;
        if (rc == 0)
            rc = rt_request_fit(&g.q, 4096, n, &e);
    }
    if (rc != 0 && e.kind == RT_REQ_ERR_NONE)
        fz_fail("error %d without an HTTP error status", rc);
    rt_gen_request_free(&g);
}

static void tokenize(const uint8_t *msg, size_t len)
{
    Tangram__V1__TokenizeRequest *q =
        tangram__v1__tokenize_request__unpack(NULL, len, msg);
    if (!q)
        return;
    for (size_t i = 0; i < q->n_messages; i++) {
        enum ct_role role;
        if (ct_role_from_name(q->messages[i]->role ? q->messages[i]->role
                                                   : "",
                              &role) == 0 &&
            ct_role_name(role) == NULL)
            fz_fail("role without a name");
    }
    tangram__v1__tokenize_request__free_unpacked(q, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    switch (data[0] & 3) {
    case 0:
        generate(msg, len, (data[0] & 4) != 0);
        break;
    case 1:
        tokenize(msg, len);
        break;
    case 2: {
        Tangram__V1__AbortRequest *q =
            tangram__v1__abort_request__unpack(NULL, len, msg);
        if (q)
            tangram__v1__abort_request__free_unpacked(q, NULL);
        break;
    }
    default: {
        Grpc__Health__V1__HealthCheckRequest *q =
            grpc__health__v1__health_check_request__unpack(NULL, len, msg);
        if (q)
            grpc__health__v1__health_check_request__free_unpacked(q, NULL);
        break;
    }
    }
    return 0;
}
