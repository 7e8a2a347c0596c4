/* rt_openai_tok.c — vLLM's /tokenize and /detokenize: request parsing and
 * response bodies (rt_openai.h). Shapes follow vLLM's TokenizeRequest
 * (completion and chat forms), TokenizeResponse, DetokenizeRequest and
 * DetokenizeResponse. */
#include "router/api/rt_openai.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai_internal.h"

/* The text form, unlike /v1/completions, accepts an empty prompt: vLLM
 * tokenizes "" (to the special tokens alone), which is a fair question to
 * ask a tokenizer. */
static int parse_tokenize_prompt(const json_t *root,
                                 struct rt_tokenize_request *r,
                                 struct rt_request_error *e)
{
    json_t *v = rt_openai__member(root, "prompt");
    if (v == NULL)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter", "prompt",
                               "either 'prompt' or 'messages' is required");
    if (!json_is_string(v))
        return rt_openai__bad_type(e, "prompt", "a string");
    r->prompt_len = json_string_length(v);
    r->prompt = strndup(json_string_value(v), r->prompt_len);
    return r->prompt != NULL ? 0 : rt_openai__oom(e);
}

int rt_openai_parse_tokenize(const struct rt_openai_cfg *cfg, const char *body,
                             size_t len, struct rt_tokenize_request *out,
                             struct rt_request_error *e)
{
    memset(out, 0, sizeof(*out));
    json_t *root;
    int rc = rt_openai__load_body(cfg, body, len, &root, e);
    if (rc)
        return rc;
    if ((rc = rt_openai__parse_model(cfg, root, &out->model, e)))
        goto fail;
    if (rt_openai__member(root, "messages") != NULL) {
        /* Chat form: the template adds the special tokens, so vLLM's
         * default for add_special_tokens is false here. */
        out->add_special_tokens = false;
        if ((rc = rt_openai_chat_parse_messages(root, &out->chat, e)) ||
            (rc = rt_openai_chat_parse_tools(root, &out->chat, NULL, e)) ||
            (rc = rt_openai__parse_chat_opts(root, &out->chat, e)))
            goto fail;
    } else {
        out->add_special_tokens = true;
        if ((rc = parse_tokenize_prompt(root, out, e)))
            goto fail;
    }
    if ((rc = rt_openai__get_bool(root, "add_special_tokens",
                                  "add_special_tokens",
                                  &out->add_special_tokens, e)) ||
        (rc =
             rt_openai__get_bool(root, "return_token_strs", "return_token_strs",
                                 &out->return_token_strs, e)))
        goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    rt_tokenize_request_free(out);
    return rc;
}

void rt_tokenize_request_free(struct rt_tokenize_request *r)
{
    free(r->model);
    free(r->prompt);
    ct_chat_free(&r->chat);
    memset(r, 0, sizeof(*r));
}

int rt_openai_parse_detokenize(const struct rt_openai_cfg *cfg,
                               const char *body, size_t len,
                               struct rt_detokenize_request *out,
                               struct rt_request_error *e)
{
    memset(out, 0, sizeof(*out));
    json_t *root;
    int rc = rt_openai__load_body(cfg, body, len, &root, e);
    if (rc)
        return rc;
    if ((rc = rt_openai__parse_model(cfg, root, &out->model, e)))
        goto fail;
    json_t *v = rt_openai__member(root, "tokens");
    if (v == NULL) {
        rc = rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                             "missing_required_parameter", "tokens",
                             "'tokens' is required");
        goto fail;
    }
    if (!json_is_array(v)) {
        rc = rt_openai__bad_type(e, "tokens", "an array of token ids");
        goto fail;
    }
    if ((rc = rt_openai__read_ids(cfg, v, "tokens", 0, &out->tokens,
                                  &out->n_tokens, e)))
        goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    rt_detokenize_request_free(out);
    return rc;
}

void rt_detokenize_request_free(struct rt_detokenize_request *r)
{
    free(r->model);
    free(r->tokens);
    memset(r, 0, sizeof(*r));
}

int rt_openai_format_tokenize(const int32_t *ids, size_t n,
                              int32_t max_model_len,
                              rt_token_text_fn token_text, void *user,
                              char **out, size_t *out_len)
{
    json_t *doc = json_object();
    json_t *tokens = json_array();
    json_t *strs = token_text != NULL ? json_array() : NULL;
    int bad =
        doc == NULL || tokens == NULL || (token_text != NULL && strs == NULL);
    for (size_t i = 0; !bad && i < n; i++) {
        bad |= json_array_append_new(tokens, json_integer(ids[i]));
        if (strs != NULL) {
            size_t len = 0;
            const char *s = token_text(user, ids[i], &len);
            bad |= json_array_append_new(
                strs, rt_openai__string_lossy(s != NULL ? s : "",
                                              s != NULL ? len : 0, NULL));
        }
    }
    bad |= json_object_set_new(doc, "count", json_integer((json_int_t)n));
    bad |=
        json_object_set_new(doc, "max_model_len", json_integer(max_model_len));
    bad |= json_object_set_new(doc, "tokens", tokens);
    if (token_text != NULL)
        bad |= json_object_set_new(doc, "token_strs", strs);
    if (bad) {
        json_decref(doc);
        *out = NULL;
        return TG_ENOMEM;
    }
    return rt_openai__dump(doc, "", "", out, out_len);
}

int rt_openai_format_detokenize(const char *text, size_t len, char **out,
                                size_t *out_len)
{
    json_t *doc = json_object();
    if (json_object_set_new(doc, "prompt",
                            rt_openai__string_lossy(text, len, NULL))) {
        json_decref(doc);
        *out = NULL;
        return TG_ENOMEM;
    }
    return rt_openai__dump(doc, "", "", out, out_len);
}
