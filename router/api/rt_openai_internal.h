/*
 * rt_openai_internal.h — internals shared by the rt_openai_*.c files (request
 * parsing helpers defined in rt_openai_req.c). Not for other modules: the
 * public API is rt_openai.h.
 *
 * Conventions of the helpers: they return 0 or a negative TG_E* code and, on
 * failure, fill *e (status, code, param naming the field, message). Optional
 * getters treat a missing member and JSON null alike and then leave *out
 * untouched.
 */
#ifndef RT_OPENAI_INTERNAL_H
#define RT_OPENAI_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "router/api/rt_openai.h"
#include "router/api/rt_openai_chat.h"

/* Fills *e (kind, code, param, message) and returns rc unchanged, so
 * failures read `return rt_openai__fail(...)`. */
int rt_openai__fail(struct rt_request_error *e, int rc, enum rt_req_err kind,
                    const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* 500 "out of memory"; returns TG_ENOMEM. */
int rt_openai__oom(struct rt_request_error *e);

/* 400 invalid_type "'param' must be <what>"; returns TG_EFORMAT. */
int rt_openai__bad_type(struct rt_request_error *e, const char *param,
                        const char *what);

/* Returns member `key` of obj (borrowed), or NULL when absent or null. */
json_t *rt_openai__member(const json_t *obj, const char *key);

/* 400 unsupported_parameter "'param': what"; returns TG_EUNSUPPORTED. */
int rt_openai__unsupported(struct rt_request_error *e, const char *param,
                           const char *what);

/* Optional string member copied into *out (malloc'd, replacing *out);
 * max_bytes 0 = no limit. */
int rt_openai__get_str(const json_t *obj, const char *key, const char *param,
                       size_t max_bytes, char **out,
                       struct rt_request_error *e);

/* Optional boolean member. */
int rt_openai__get_bool(const json_t *obj, const char *key, const char *param,
                        bool *out, struct rt_request_error *e);

/* Checks spec text (owned, NUL-terminated, len bytes) with gm_spec_check
 * and moves it into *out (freeing what *out held), or frees it and fills
 * *e: 400 naming `param` with the engine's message. */
int rt_openai__grammar_take(char *spec, size_t len, const char *param,
                            char **out, struct rt_request_error *e);

/* Parses a body into a JSON object (*root, new reference): 413 over
 * cfg->max_body_bytes, 400 for empty, malformed or non-object bodies. */
int rt_openai__load_body(const struct rt_openai_cfg *cfg, const char *body,
                         size_t len, json_t **root, struct rt_request_error *e);

/* The optional "model" member checked against cfg->served_model (404 when
 * different); *out gets a malloc'd copy of the served name. */
int rt_openai__parse_model(const struct rt_openai_cfg *cfg, const json_t *root,
                           char **out, struct rt_request_error *e);

/* Array `arr` (path `param`) of token ids in [0, vocab_size) into a malloc'd
 * array (*out NULL when empty); max_n 0 = no length limit. */
int rt_openai__read_ids(const struct rt_openai_cfg *cfg, const json_t *arr,
                        const char *param, size_t max_n, int32_t **out,
                        size_t *n_out, struct rt_request_error *e);

/* add_generation_prompt, continue_final_message, chat_template_kwargs
 * (its JSON text in c->kwargs) into c. */
int rt_openai__parse_chat_opts(const json_t *root, struct ct_chat *c,
                               struct rt_request_error *e);

/* Appends to *dst a JSON string of src[0..len) with every maximal ill-formed
 * UTF-8 subsequence replaced by U+FFFD (Rust's from_utf8_lossy rule, which
 * Hugging Face decoding follows). Returns a new JSON string or NULL (out of
 * memory); *n_cp (when non-NULL) gets the number of code points. */
json_t *rt_openai__string_lossy(const char *src, size_t len, int64_t *n_cp);

/* Dumps `doc` compactly into a malloc'd string, wrapped as
 * "<prefix><json><suffix>" (prefix/suffix may be ""), and decrefs doc.
 * Returns 0 or TG_ENOMEM (doc NULL counts as out of memory). */
int rt_openai__dump(json_t *doc, const char *prefix, const char *suffix,
                    char **out, size_t *out_len);

/* Optional integer member in [lo, hi] (numbers without a fraction
 * accepted); *present (may be NULL) says whether it was given. */
int rt_openai__get_int(const json_t *obj, const char *key, const char *param,
                       int64_t lo, int64_t hi, int64_t *out, bool *present,
                       struct rt_request_error *e);

/* rt_openai_logprobs.c: prompt log-probabilities and batches.
 *   zero_max_ok      1 when the request may send max_tokens 0 (echo on
 *                    completions, or prompt_logprobs): the prompt is
 *                    scored and nothing generated.
 *   parse_prompt_lp  after the sampling and stream fields: echo with
 *                    logprobs and prompt_logprobs into r->echo_top,
 *                    r->prompt_top and q.opts (prompt_lp, prompt_top,
 *                    max_tokens 0 as prompt_only), the combinations
 *                    refused (n > 1, stream, a batch with n > 1 or
 *                    stream).
 *   prompt_value     one prompt (a string or an array of token ids) at
 *                    `param` into q's prompt fields. */
int rt_openai__zero_max_ok(const json_t *root, const struct rt_gen_request *r);
int rt_openai__parse_prompt_lp(const json_t *root, struct rt_gen_request *r,
                               bool max_zero, struct rt_request_error *e);
int rt_openai__prompt_value(const struct rt_openai_cfg *cfg, const json_t *v,
                            const char *param, struct rt_request *q,
                            struct rt_request_error *e);

/* rt_openai_logprobs.c, for rt_openai_resp.c: the prompt's positions at
 * the front of a completions logprobs object (c->echo_top >= 0; arrays
 * of its four members, c->text_offset advanced), and vLLM's
 * "prompt_logprobs" value (c->prompt_top >= 0). *bad set on failure. */
void rt_openai__echo_entries(struct rt_resp_ctx *c, json_t *off, json_t *lps,
                             json_t *toks, json_t *tops, int *bad);
json_t *rt_openai__prompt_logprobs(const struct rt_resp_ctx *c);

/* rt_openai_resp.c, for rt_openai_logprobs.c: a logprob as JSON (-9999.0
 * for -inf and NaN, as vLLM writes them) and the token text of `id`
 * through c's callback ("" when none). */
json_t *rt_openai__logprob_json(float lp);
const char *rt_openai__token_bytes(const struct rt_resp_ctx *c, int32_t id,
                                   size_t *len);

#endif /* RT_OPENAI_INTERNAL_H */
