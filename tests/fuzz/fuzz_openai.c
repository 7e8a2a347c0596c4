/*
 * fuzz_openai.c — the OpenAI request converter of the router
 * (router/api/rt_openai_req.c) on untrusted request bodies:
 * rt_openai_parse_completion, rt_openai_parse_chat,
 * rt_openai_parse_tokenize and rt_openai_parse_detokenize, then what the
 * router does with a request that parsed (its sampling checked by the parse):
 * rt_request_fit with a fuzzed prompt length, rt_gen_request_free
 * (and the tokenize / detokenize frees). The error of a refused body is
 * rendered with rt_openai_format_error, as the HTTP front end does.
 *
 * Input layout:
 *   byte 0      endpoint: & 3 = completions, chat, tokenize, detokenize
 *   bytes 1..8  little-endian int64: the prompt's token count given to
 *               rt_request_fit (any value, negative and huge included)
 *   bytes 9..   the request body (JSON)
 * Limits as the router's: a 4096-token context, a 151936-token
 * vocabulary, 1 MiB bodies.
 */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai.h"
#include "tests/fuzz/fz_util.h"

static void check_error(int rc, const struct rt_request_error *e)
{
    if (rc == 0)
        return;
    if (e->kind == RT_REQ_ERR_NONE)
        fz_fail("error %d without an error kind", rc);
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
    if (size < 9)
        return 0;
    int mode = data[0] & 3;
    int64_t n_prompt;
    memcpy(&n_prompt, data + 1, sizeof(n_prompt));
    const char *body = (const char *)data + 9;
    size_t len = size - 9;
    const struct rt_openai_cfg cfg = {.served_model = "tiny",
                                      .max_model_len = 4096,
                                      .vocab_size = 151936,
                                      .max_body_bytes = 1u << 20};
    struct rt_request_error e;
    memset(&e, 0, sizeof(e));
    int rc;
    if (mode <= 1) {
        struct rt_gen_request g;
        rc = mode == 0 ? rt_openai_parse_completion(&cfg, body, len, &g, &e)
                       : rt_openai_parse_chat(&cfg, body, len, &g, &e);
        check_error(rc, &e);
        if (rc == 0) {
            if ((g.q.prompt != NULL) + (g.q.prompt_ids != NULL) +
                    (g.q.chat.messages != NULL) !=
                1)
                fz_fail("a request needs exactly one prompt form");
            rc = rt_request_fit(&g.q, cfg.max_model_len, n_prompt, &e);
            check_error(rc, &e);
            if (rc == 0 && (g.q.opts.max_tokens < 1 ||
                            n_prompt + g.q.opts.max_tokens > cfg.max_model_len))
                fz_fail("fit accepted %d tokens after a %lld-token prompt",
                        (int)g.q.opts.max_tokens, (long long)n_prompt);
        }
        rt_gen_request_free(&g);
        rt_gen_request_free(&g); /* safe on a freed (zeroed) request */
    } else if (mode == 2) {
        struct rt_tokenize_request t;
        rc = rt_openai_parse_tokenize(&cfg, body, len, &t, &e);
        check_error(rc, &e);
        rt_tokenize_request_free(&t);
    } else {
        struct rt_detokenize_request d;
        rc = rt_openai_parse_detokenize(&cfg, body, len, &d, &e);
        check_error(rc, &e);
        if (rc == 0)
            for (size_t i = 0; i < d.n_tokens; i++)
                if (d.tokens[i] < 0 || d.tokens[i] >= cfg.vocab_size)
                    fz_fail("detokenize accepted token id %d",
                            (int)d.tokens[i]);
        rt_detokenize_request_free(&d);
    }
    return 0;
}
