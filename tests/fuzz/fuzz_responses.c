/*
 * fuzz_responses.c — the Responses API's request reader of the router
 * (router/api/rt_responses.c) on untrusted bodies: rt_responses_parse,
 * then what the front end does with a body that parsed: its items into
 * chat messages (rt_responses_messages) and the chat request they mean
 * (rt_responses_chat, through rt_openai_parse_chat); the error of a
 * refused body rendered as the HTTP front end does. Also the split of a
 * thinking template's output (rt_responses_split_think) on the same bytes.
 *
 * Input: the request body (JSON). Limits as the router's: a 4096-token
 * context, a 151936-token vocabulary, 1 MiB bodies, Hermes tool calls.
 */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_responses.h"
#include "tests/fuzz/fz_util.h"

static void check_error(int rc, const struct rt_request_error *e)
{
    if (rc == 0)
        return;
    int status = rt_openai_http_status(e->kind);
    if (status < 400 || status > 599 || e->kind == RT_REQ_ERR_NONE)
        fz_fail("error %d without an HTTP error status (%d)", rc, status);
    if (memchr(e->param, '\0', sizeof(e->param)) == NULL ||
        memchr(e->message, '\0', sizeof(e->message)) == NULL)
        fz_fail("unterminated error text");
    char *out = NULL;
    size_t len = 0;
    if (rt_openai_format_error(e, &out, &len) == 0 && strlen(out) != len)
        fz_fail("formatted error length");
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    size_t ro, rl, co;
    if (rt_responses_split_think(body, size, &ro, &rl, &co) &&
        (ro > size || rl > size - ro || co > size || ro + rl > co))
        fz_fail("think split out of bounds");
    const struct rt_openai_cfg cfg = {.served_model = "tiny",
                                      .max_model_len = 4096,
                                      .vocab_size = 151936,
                                      .max_body_bytes = 1u << 20,
                                      .tool_format = CT_TOOLS_HERMES};
    struct rt_responses_request r;
    struct rt_request_error e;
    memset(&e, 0, sizeof(e));
    int rc = rt_responses_parse(&cfg, body, size, &r, &e);
    check_error(rc, &e);
    if (rc != 0) {
        if (r.input != NULL || r.chat != NULL)
            fz_fail("a refused body left a request behind");
        return 0;
    }
    if (!json_is_array(r.input) || !json_is_object(r.chat) || r.text == NULL)
        fz_fail("a parsed request without input, chat body or text");
    json_t *msgs = json_array();
    if (msgs == NULL)
        fz_fail("out of memory");
    rc = rt_responses_messages(r.input, "input", msgs, &e);
    check_error(rc, &e);
    if (rc == 0) {
        struct rt_gen_request g;
        rc = rt_responses_chat(&cfg, &r, msgs, &g, &e);
        check_error(rc, &e);
        if (rc == 0 && g.q.chat.messages == NULL)
            fz_fail("a chat request without messages");
        rt_gen_request_free(&g);
    }
    json_decref(msgs);
    rt_responses_request_free(&r);
    rt_responses_request_free(&r); /* safe on a freed (zeroed) request */
    return 0;
}
