#include "tests/support/tt_openai.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

const struct rt_openai_cfg tt_openai_cfg = {
    .served_model = "tiny",
    .max_model_len = 128,
    .vocab_size = 1000,
    .max_body_bytes = 4096,
};

int tt_openai_parse(enum tt_ep ep, const char *body, size_t len,
                    struct rt_request_error *e)
{
    const struct rt_openai_cfg *cfg = &tt_openai_cfg;
    int rc;
    if (ep == TT_EP_COMPLETION || ep == TT_EP_CHAT) {
        struct rt_gen_request r;
        rc = ep == TT_EP_COMPLETION
                 ? rt_openai_parse_completion(cfg, body, len, &r, e)
                 : rt_openai_parse_chat(cfg, body, len, &r, e);
        if (rc != 0) {
            /* A failed parse leaves the request empty. */
            assert_null(r.model);
            assert_null(r.q.chat.messages);
            assert_null(r.q.prompt);
            assert_null(r.q.opts.stop);
        }
        rt_gen_request_free(&r);
    } else if (ep == TT_EP_TOKENIZE) {
        struct rt_tokenize_request r;
        rc = rt_openai_parse_tokenize(cfg, body, len, &r, e);
        rt_tokenize_request_free(&r);
    } else {
        struct rt_detokenize_request r;
        rc = rt_openai_parse_detokenize(cfg, body, len, &r, e);
        rt_detokenize_request_free(&r);
    }
    return rc;
}
