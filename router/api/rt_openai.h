/*
 * rt_openai.h — the OpenAI-compatible HTTP API as pure functions: parsing and
 * validation of request bodies into plain C structs, and formatting of the
 * response bodies and SSE frames. No I/O, no globals, no tokenizer: the
 * router's HTTP layer feeds bodies in and writes the strings out.
 *
 * Requests (DESIGN.md §5, shapes of the OpenAI API reference and vLLM's
 * protocol extensions):
 *   POST /v1/completions       rt_openai_parse_completion
 *   POST /v1/chat/completions  rt_openai_parse_chat
 *   POST /tokenize             rt_openai_parse_tokenize
 *   POST /detokenize           rt_openai_parse_detokenize
 * Unknown fields are ignored, as OpenAI does; JSON null means "absent" for
 * every optional field; a key given twice takes its last value (as Python's
 * json module does); "\u0000" inside strings is rejected as malformed.
 * Integer fields accept numbers without a fraction (1.0), as pydantic does
 * for vLLM. Known fields whose values this server cannot honour (best_of
 * other than n, echo with logprobs, suffix, tool_choice "required" or a
 * named function, the deprecated functions / function_call,
 * prompt_logprobs, non-text content parts, custom chat templates,
 * non-text response_format)
 * are rejected with 400 instead of being silently dropped, so a client
 * never gets output it did not ask for.
 *
 * Chat messages are validated (OpenAI shapes: roles, content strings or text
 * parts, assistant tool_calls {id, type "function", function {name,
 * arguments}}, tool messages with tool_call_id) into the request's
 * conversation (q.chat, common/chat/ct_chat.h; rt_openai_chat.h): roles as
 * sent ("developer" becomes "system"), text parts joined with "\n" into one
 * string (vLLM's rule for templates that take strings), content null
 * (allowed only for an assistant message with tool calls) as "" as vLLM
 * passes it, tool-call arguments as their text (the template renderer
 * parses them into the object, as vLLM does, since Hugging Face templates
 * expect an object; a string that is not JSON stays a string), and each
 * optional member (name, reasoning_content, tool_calls, tool_call_id)
 * present only when given. Tools are validated ({"type": "function",
 * "function": {"name", "description"?, "parameters"? object}}, at most
 * RT_OPENAI_MAX_TOOLS) and passed to the template as sent.
 *
 * Every failure fills a struct rt_request_error: its kind (RT_REQ_ERR_INVALID
 * for bad input, NOT_FOUND an unknown model, TOO_LARGE a body too large,
 * INTERNAL out of memory; HTTP's status and OpenAI's error type follow
 * from it, rt_openai_http_status / rt_openai_error_type), the code, `param` naming the offending field as a path
 * ("messages[2].content[0].text", "stream_options.include_usage"), and a
 * message for humans. rt_openai_format_error renders it as
 * {"error": {"message", "type", "param", "code"}}.
 *
 * Limits chosen here (OpenAI allows 4 stop strings, vLLM any number; we take
 * a documented middle ground that keeps the stop matcher cheap):
 *   RT_OPENAI_MAX_STOP stop strings of at most RT_OPENAI_MAX_STOP_BYTES
 *   bytes each, RT_OPENAI_MAX_STOP_TOKEN_IDS stop token ids, and at most
 *   RT_OPENAI_MAX_LOGPROBS alternatives per token (OpenAI's and vLLM's
 *   default max_logprobs, 20).
 *
 * Thread: every function works on caller data only; any thread, one object
 * per thread at a time.
 */
#ifndef RT_OPENAI_H
#define RT_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/base/tg_sampling.h"
#include "router/api/rt_toolcall.h"
#include "router/core/rt_request.h"

#define RT_OPENAI_MAX_STOP 16
#define RT_OPENAI_MAX_STOP_BYTES 1024
#define RT_OPENAI_MAX_STOP_TOKEN_IDS 256
#define RT_OPENAI_MAX_LOGPROBS 20
#define RT_OPENAI_MAX_ID_BYTES \
    RT_REQUEST_MAX_ID_BYTES        /* session_id,
                                                      request_id, user */
#define RT_OPENAI_MAX_TOOLS 128    /* OpenAI's limit on tools per request */
#define RT_OPENAI_MAX_LOGIT_BIAS 1024 /* logit_bias entries per request */
#define RT_OPENAI_MAX_N 16         /* choices (parallel samples) per request:
                                      n in [1, 16] (docs/API.md "n") */
#define RT_OPENAI_MAX_BATCH \
    64 /* prompts of one completions request
                                      (docs/API.md "Batches of prompts") */

/* The frame that ends every stream. */
#define RT_OPENAI_SSE_DONE "data: [DONE]\n\n"

/* ---- errors ------------------------------------------------------------ */

/* The error type (struct rt_request_error, rt_request_error_set) is the core's
 * (router/core/rt_request.h): core and front ends fill the same one. */

/* Checks an identifier that does not come in a JSON body (the
 * X-Session-Id header, gRPC request_id / session_id): 1 to
 * RT_OPENAI_MAX_ID_BYTES bytes of valid UTF-8, as the body's own id
 * fields are. Returns 0, or TG_EFORMAT / TG_EINVAL with *e filled (400
 * invalid_value naming `param`). Any thread. */
int rt_openai_check_id(const char *v, size_t n, const char *param,
                       struct rt_request_error *e);

/* ---- requests ---------------------------------------------------------- */

enum rt_endpoint {
    RT_ENDPOINT_COMPLETIONS = 0, /* /v1/completions */
    RT_ENDPOINT_CHAT,            /* /v1/chat/completions */
};

/* tool_choice: "auto" (the default with tools) lets the model call tools;
 * "none" renders the prompt without tools and returns text only;
 * "required" and a named function ({"type": "function", "function":
 * {"name"}}) constrain the output to tool calls (of that function) in the
 * template's format; under "auto", "strict": true tools constrain each
 * call once it starts (rt_openai_tool_grammar). */
enum rt_tool_choice {
    RT_TOOL_CHOICE_AUTO = 0,
    RT_TOOL_CHOICE_NONE,
    RT_TOOL_CHOICE_REQUIRED,
    RT_TOOL_CHOICE_FUNCTION,
};

/* A parsed generation request of either endpoint: the core's request
 * (q: exactly one of q.prompt, q.prompt_ids (completions) or
 * q.chat's messages (chat) set) and what only this API needs to answer it.
 * Zeroed is empty; everything is owned by the struct and freed by
 * rt_gen_request_free. */
struct rt_gen_request {
    enum rt_endpoint endpoint;
    char *model; /* the served name (the default when omitted) */
    enum rt_tool_choice tool_choice;
    bool stream;
    bool include_usage;       /* stream_options.include_usage */
    bool continuous_usage;    /* stream_options.continuous_usage_stats
                                 (vLLM): usage in every chunk */
    bool echo;                /* completions "echo": the output starts with
                                 the prompt */
    char *echo_text;          /* the prompt text to echo, filled by the front
                                 end (the text as sent, or the prompt ids
                                 decoded); owned, NULL = none */
    size_t echo_len;          /* bytes of echo_text */
    /* Prompt log-probabilities (rt_openai_logprobs.c; q.opts.prompt_lp
     * and prompt_top, the larger of the two, ask the core for them):
     * echo_top, completions echo with logprobs k: the logprobs object
     * starts with the prompt's positions, k alternatives each; top,
     * vLLM's "prompt_logprobs": k. -1: not asked. */
    int32_t echo_top;
    int32_t prompt_top;
    /* A completions batch ("prompt": [p0, p1, ...], lm-evaluation-
     * harness's shape): q holds p0, batch[i] the prompt (text or ids) of
     * p(i + 1) in its prompt fields only; each is answered as a choice of
     * its own (index i + 1), in one response. NULL / 0: one prompt. */
    struct rt_request *batch;
    size_t n_batch;
    /* The core's request: q.n choices, 1..RT_OPENAI_MAX_N (parsed; 0 in
     * a request built elsewhere means 1); q.add_special_tokens completions
     * default true, chat false; q.sampling checked
     * (rt_openai_check_sampling) by the parse, temperature 1 and the rest
     * off by default; q.max_tokens_param "max_tokens" /
     * "max_completion_tokens"; q.session_id the "session_id" field
     * (tangram), q.request_id vLLM's "request_id". */
    struct rt_request q;
};

/* What the parser validates against. */
struct rt_openai_cfg {
    const char *served_model; /* the model name of this server (required) */
    int32_t max_model_len;    /* context in tokens; 0 = not checked */
    int32_t vocab_size;       /* token ids must be below it; 0 = unchecked */
    size_t max_body_bytes;    /* larger bodies get 413; 0 = unlimited */
    enum ct_tool_format tool_format; /* the chat template's tool-call
                                        format: what tool_choice
                                        "required" constrains output to */
    int ws; /* JSON constraints' whitespace policy by default (enum gm_ws
               of common/grammar/gm_json.h; 0: compact) */
};

/* Parses and validates a /v1/completions body of `len` bytes into *out
 * (which the call first zeroes). Returns 0; or fills *e and returns
 * TG_EFORMAT (400), TG_EUNSUPPORTED (400, a feature this server lacks),
 * TG_ENOTFOUND (404, unknown model), TG_ETOOBIG (413) or TG_ENOMEM (500),
 * leaving *out empty. On success the caller owns *out and frees it with
 * rt_gen_request_free. Any thread. */
int rt_openai_parse_completion(const struct rt_openai_cfg *cfg,
                               const char *body, size_t len,
                               struct rt_gen_request *out,
                               struct rt_request_error *e);

/* Same for a /v1/chat/completions body (same codes and ownership). */
int rt_openai_parse_chat(const struct rt_openai_cfg *cfg, const char *body,
                         size_t len, struct rt_gen_request *out,
                         struct rt_request_error *e);

/* Sets the sampling and options of *r to the API's defaults, the one
 * place they are written (both front ends start from them): temperature
 * 1, top_p 1, top_k and min_p off, penalties off (repetition 1), special
 * tokens skipped, no logprobs, max_tokens -1 (up to the context;
 * completions then set OpenAI's 16). Owns nothing yet: call on a zeroed
 * or freed request. */
void rt_gen_request_defaults(struct rt_gen_request *r);

/* Checks the sampling of a parsed request (tg_sampling_check against the
 * vocabulary, 0 = unchecked): a value that passed the API's range checks
 * as a double can become 0 or infinity in single precision (top_p 1e-300,
 * repetition_penalty 1e308). Returns 0, or TG_EINVAL with *e filled (400
 * invalid_value naming `prefix` + the parameter and the value). Both
 * front ends call it right after parsing. Any thread. */
int rt_openai_check_sampling(const struct tg_sampling *sp, int32_t vocab,
                             const char *prefix, struct rt_request_error *e);

/* Releases everything r owns and zeroes it. Safe on a zeroed request. */
void rt_gen_request_free(struct rt_gen_request *r);

/* The optional "response_format" member of root into *grammar: the spec
 * text of its constraint (common/grammar/gm_spec.h, malloc'd, replacing
 * *grammar; left as it was for "text"), checked with gm_spec_check: 400
 * naming the keyword or limit when the engine cannot serve it, with
 * `param` under "response_format". Both front ends (the gRPC API's
 * response_format is the same JSON). Any thread (rt_openai_format.c). */
int rt_openai_parse_response_format(const json_t *root, char **grammar,
                                    struct rt_request_error *e);

/* The other spellings of an output constraint in root (vLLM's
 * structured_outputs {json, regex, choice, grammar, json_object} and
 * guided_json / guided_regex / guided_choice / guided_grammar; llama.cpp's
 * grammar and json_schema; SGLang's regex, ebnf and json_schema) into
 * *grammar, checked as response_format is. At most one constraint per
 * request: a second one (response_format counts, when *grammar is set
 * already) is a 400 naming both. Any thread (rt_openai_struct.c). */
int rt_openai_parse_structured(const json_t *root, char **grammar,
                               struct rt_request_error *e);

/* The whitespace policy of *grammar's JSON (cfg->ws, or the request's
 * structured_outputs.whitespace / disable_any_whitespace) written into
 * its spec. Call after every constraint is parsed (tools included). */
int rt_openai_structured_whitespace(const struct rt_openai_cfg *cfg,
                                    const json_t *root, char **grammar,
                                    struct rt_request_error *e);

/* Its two halves: the policy the request asks for (*ws, an enum gm_ws),
 * and writing a policy into *grammar's spec (nothing for compact). */
int rt_openai_structured_ws(const struct rt_openai_cfg *cfg, const json_t *root,
                            int *ws, struct rt_request_error *e);
int rt_openai_structured_apply_ws(int ws, char **grammar,
                                  struct rt_request_error *e);

/* /tokenize (vLLM): {"model", "prompt", "add_special_tokens"} or
 * {"model", "messages", "tools", "add_generation_prompt",
 * "continue_final_message", "add_special_tokens", "chat_template_kwargs"},
 * plus "return_token_strs". Owned as in rt_gen_request. */
struct rt_tokenize_request {
    char *model;
    char *prompt;                /* text form (may be ""); NULL in chat form */
    size_t prompt_len;
    struct ct_chat chat;         /* chat form: the conversation (its
                                    messages set), tools and options */
    bool add_special_tokens;     /* text form default true, chat false */
    bool return_token_strs;      /* default false */
};

/* Parses a /tokenize body into *out (zeroed first). Codes, errors and
 * ownership as rt_openai_parse_completion; free with
 * rt_tokenize_request_free. */
int rt_openai_parse_tokenize(const struct rt_openai_cfg *cfg, const char *body,
                             size_t len, struct rt_tokenize_request *out,
                             struct rt_request_error *e);

/* Releases everything r owns and zeroes it. Safe on a zeroed request. */
void rt_tokenize_request_free(struct rt_tokenize_request *r);

/* /detokenize (vLLM): {"model", "tokens": [ids]}. */
struct rt_detokenize_request {
    char *model;
    int32_t *tokens; /* (n_tokens), malloc'd or NULL when empty */
    size_t n_tokens;
};

/* Parses a /detokenize body (same contract as rt_openai_parse_tokenize). */
int rt_openai_parse_detokenize(const struct rt_openai_cfg *cfg,
                               const char *body, size_t len,
                               struct rt_detokenize_request *out,
                               struct rt_request_error *e);

/* Releases everything r owns and zeroes it. Safe on a zeroed request. */
void rt_detokenize_request_free(struct rt_detokenize_request *r);

/* ---- responses ------------------------------------------------------- */

/* Returns the finish_reason string of f, or NULL for RT_FINISH_NONE. */
const char *rt_finish_name(enum rt_finish f);

struct rt_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t cached_tokens; /* prompt tokens served from stored KV */
};

/* Returns the bytes of token `id` as the tokenizer decodes it alone and
 * stores their count in *len; NULL when unknown (written as ""). The bytes
 * need not be valid UTF-8 (a token can hold part of a character): strings
 * get U+FFFD for ill-formed sequences, the chat "bytes" field the raw
 * bytes. They must stay valid until the next call of the callback. */
typedef const char *(*rt_token_text_fn)(void *user, int32_t id, size_t *len);

/* Identity and options of one response (non-streaming or a stream). */
struct rt_resp_ctx {
    enum rt_endpoint endpoint;
    const char *id;     /* "cmpl-..." / "chatcmpl-..." (rt_openai_make_id) */
    const char *model;  /* served model name */
    int64_t created;    /* unix time, seconds */
    bool logprobs;      /* the request asked for logprobs: write the
                           logprobs object (else null) */
    rt_token_text_fn token_text; /* required when logprobs */
    void *token_user;
    bool include_usage;    /* stream: usage null in chunks, final usage chunk */
    bool continuous_usage; /* stream: usage in every chunk (vLLM) */
    int64_t text_offset;   /* completions logprobs: code points of output text
                              before the next token; advanced by the
                              formatters, so a stream continues it */
    int32_t index;         /* the choice's "index" (0 unless n > 1) */
    /* Prompt log-probabilities (rt_openai_logprobs.c): the request's
     * values (NULL: none) over its prompt ids; echo_top >= 0 puts the
     * prompt's positions first in a completions logprobs object, with
     * that many alternatives; prompt_top >= 0 writes vLLM's
     * "prompt_logprobs" (the choice's on completions, the response's on
     * chat) with that many. */
    const struct rt_prompt_lps *plp;
    const int32_t *prompt_ids;
    int32_t echo_top;
    int32_t prompt_top;
};

/* Writes "<prefix>-<16 hex digits of r>" into buf (cap >= 32 bytes is
 * enough) with prefix "cmpl" or "chatcmpl" by endpoint. The caller supplies
 * the random bits, keeping this module free of I/O. */
void rt_openai_make_id(char *buf, size_t cap, enum rt_endpoint ep,
                       uint64_t r);

/* Formats the non-streaming response body: one choice with the whole
 * `text` (len bytes; ill-formed UTF-8 becomes U+FFFD), the logprobs of its
 * n_lp tokens (when c->logprobs), finish reason `fin` and usage `u`
 * (NULL writes "usage": null).
 * On success *out is a malloc'd NUL-terminated string of *out_len bytes the
 * caller frees. Returns 0, TG_EINVAL (logprobs without a token_text
 * callback) or TG_ENOMEM. */
int rt_openai_format_response(struct rt_resp_ctx *c, const char *text,
                              size_t len, const struct rt_token_logprob *lp,
                              size_t n_lp, enum rt_finish fin,
                              const struct rt_usage *u, char **out,
                              size_t *out_len);

/* Formats the non-streaming chat response whose message has `content`
 * (len bytes; NULL writes "content": null) and the tool calls calls[0..n)
 * ("tool_calls" omitted when n is 0). Otherwise as
 * rt_openai_format_response (same ownership and codes). */
int rt_openai_format_chat_response(struct rt_resp_ctx *c, const char *content,
                                   size_t len,
                                   const struct rt_tool_call *calls, size_t n,
                                   const struct rt_token_logprob *lp,
                                   size_t n_lp, enum rt_finish fin,
                                   const struct rt_usage *u, char **out,
                                   size_t *out_len);

/* Formats a chat stream frame whose delta carries the tool calls
 * calls[0..n), numbered from first_index: {"tool_calls": [{"index", "id",
 * "type": "function", "function": {"name", "arguments"}}]}, with the
 * logprobs of n_lp tokens and finish_reason null. Same ownership and codes
 * (a completions ctx gives TG_EINVAL). */
int rt_openai_sse_tool_calls(struct rt_resp_ctx *c,
                             const struct rt_tool_call *calls, size_t n,
                             size_t first_index,
                             const struct rt_token_logprob *lp, size_t n_lp,
                             const struct rt_usage *u, char **out,
                             size_t *out_len);

/* Formats the first frame of a chat stream: delta {"role": "assistant",
 * "content": ""}. Ownership and codes as rt_openai_format_response (a
 * completions ctx gives TG_EINVAL). */
int rt_openai_sse_role(const struct rt_resp_ctx *c, char **out,
                       size_t *out_len);

/* Formats one stream frame "data: {...}\n\n": the text delta (len bytes,
 * may be 0), the logprobs of its n_lp tokens, and finish reason `fin`
 * (RT_FINISH_NONE while streaming; a chat delta without text is {}).
 * `u` is the usage so far, written only with c->continuous_usage; with
 * c->include_usage alone the chunk carries "usage": null as OpenAI does.
 * Advances c->text_offset. Ownership and codes as rt_openai_format_response. */
int rt_openai_sse_delta(struct rt_resp_ctx *c, const char *text, size_t len,
                        const struct rt_token_logprob *lp, size_t n_lp,
                        enum rt_finish fin, const struct rt_usage *u,
                        char **out, size_t *out_len);

/* Formats the usage frame sent after the final chunk when include_usage is
 * set: empty choices and the usage object. Same ownership and codes. */
int rt_openai_sse_usage(const struct rt_resp_ctx *c, const struct rt_usage *u,
                        char **out, size_t *out_len);

/* Joins the non-streaming bodies of the n choices of one request (each
 * formatted by rt_openai_format_response / rt_openai_format_chat_response
 * with its own ctx.index, in the order given) into one body: the first
 * body's envelope, the choices of all of them in order, and usage `u`
 * (NULL: null). Same ownership; 0, TG_EFORMAT (a body that is not such a
 * response) or TG_ENOMEM. */
int rt_openai_merge_choices(const char *const *bodies, size_t n,
                            const struct rt_usage *u, char **out,
                            size_t *out_len);

/* The HTTP status of an error kind: 400 invalid, 404 not found, 413 too
 * large, 401 unauthenticated, 429 busy, 503 unavailable, 500 internal
 * (and anything else). Pure. */
int rt_openai_http_status(enum rt_req_err kind);

/* OpenAI's error type of a kind: "invalid_request_error" (invalid, not
 * found, too large), "authentication_error", "rate_limit_error" (busy),
 * "server_error" (unavailable, internal, anything else). Static. */
const char *rt_openai_error_type(enum rt_req_err kind);

/* Formats the body {"error": {...}} of e. Same ownership; 0 or TG_ENOMEM. */
int rt_openai_format_error(const struct rt_request_error *e, char **out,
                           size_t *out_len);

/* Formats an error inside a stream, "data: {"error": {...}}\n\n" (what
 * vLLM sends before [DONE] when a request fails mid-stream). */
int rt_openai_sse_error(const struct rt_request_error *e, char **out,
                        size_t *out_len);

/* Formats the /v1/models/{id} body: the model object of the served model
 * (id, object "model", created, owned_by, root, parent, max_model_len).
 * Same ownership; 0 or TG_ENOMEM. */
int rt_openai_format_model(const char *model, int64_t created,
                           int32_t max_model_len, char **out,
                           size_t *out_len);

/* Formats the /v1/models body: a list of the one served model (the
 * object of rt_openai_format_model). Same ownership; 0 or TG_ENOMEM. */
int rt_openai_format_models(const char *model, int64_t created,
                            int32_t max_model_len, char **out,
                            size_t *out_len);

/* Formats the /tokenize body {"count", "max_model_len", "tokens"} and, when
 * token_text is non-NULL, "token_strs" (vLLM's return_token_strs). Same
 * ownership; 0 or TG_ENOMEM. */
int rt_openai_format_tokenize(const int32_t *ids, size_t n,
                              int32_t max_model_len,
                              rt_token_text_fn token_text, void *user,
                              char **out, size_t *out_len);

/* Formats the /detokenize body {"prompt": text} (len bytes, ill-formed
 * UTF-8 becomes U+FFFD). Same ownership; 0 or TG_ENOMEM. */
int rt_openai_format_detokenize(const char *text, size_t len, char **out,
                                size_t *out_len);

#endif /* RT_OPENAI_H */
