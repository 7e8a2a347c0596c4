/*
 * rt_request.h — a generation request as the router's core takes it,
 * whatever protocol it came in by: what to generate (prompt text, prompt
 * ids, or chat messages and tools for the model's template), the sampler's
 * parameters (common/base/tg_sampling.h), the stop conditions and limits,
 * the number of choices and the identities (session, request, user); and
 * what flows back to the front end's sink: finish reasons, sampled tokens
 * with their log-probabilities, and the error a request fails with.
 *
 * The front ends (router/api/) parse their protocol into a struct
 * rt_request, check it (tg_sampling_check right after parsing), and keep
 * their response-formatting state on their side (the sink's request
 * state, rt_server.h). Nothing here parses or writes a protocol.
 *
 * Thread: plain data and functions on caller data; any thread, one object
 * per thread at a time.
 */
#ifndef RT_REQUEST_H
#define RT_REQUEST_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_sampling.h"
#include "common/chat/ct_chat.h"

/* ---- errors ------------------------------------------------------------ */

/* What went wrong, in no protocol's terms: each front end maps the kind
 * onto its own (HTTP status and OpenAI error type: rt_openai_http_status
 * and rt_openai_error_type, router/api/rt_openai.h; gRPC status codes:
 * router/api/rt_api_grpc.c). */
enum rt_req_err {
    RT_REQ_ERR_NONE = 0,        /* nothing recorded yet */
    RT_REQ_ERR_INVALID,         /* the request is malformed, out of range
                                   or refused as asked */
    RT_REQ_ERR_NOT_FOUND,       /* it names what is not served (a model) */
    RT_REQ_ERR_TOO_LARGE,       /* its body is over the size allowed */
    RT_REQ_ERR_UNAUTHENTICATED, /* no or a wrong API key */
    RT_REQ_ERR_BUSY,            /* too many requests wait: retry later */
    RT_REQ_ERR_UNAVAILABLE,     /* the server drains or its workers are
                                   not ready: retry later */
    RT_REQ_ERR_INTERNAL,        /* the server failed (out of memory, a
                                   worker error) */
};

/* The error a request fails with, as every front end reports it: its
 * kind, a code, the offending field and a message. `code` points to a
 * static string (NULL is none); param "" is none. */
struct rt_request_error {
    enum rt_req_err kind;
    const char *code;  /* "invalid_type", "model_not_found", ... or NULL */
    char param[128];   /* offending field path, "" when none */
    char message[384]; /* human-readable detail */
};

/* Fills *e with `kind`, `code` (static string or NULL), `param` (copied;
 * NULL = none) and the printf message (truncated to fit). Returns
 * nothing; e must be non-NULL. */
void rt_request_error_set(struct rt_request_error *e, enum rt_req_err kind,
                          const char *code, const char *param, const char *fmt,
                          ...) __attribute__((format(printf, 5, 6)));

/* rt_request_error_set with a va_list. */
void rt_request_error_vset(struct rt_request_error *e, enum rt_req_err kind,
                           const char *code, const char *param, const char *fmt,
                           va_list ap);

/* ---- the request ------------------------------------------------------- */

#define RT_REQUEST_MAX_ID_BYTES 256 /* session, request and user ids */

/* What a generation request asks beyond the sampler (whose parameters
 * are the request's struct tg_sampling): its length limits, stop
 * conditions and output options, with the defaults of OpenAI / vLLM. */
struct rt_gen_opts {
    int32_t max_tokens; /* >= 1; -1 = up to the context (chat default,
                            resolved by rt_request_fit); completions
                            default 16 as in the OpenAI API */
    int32_t min_tokens; /* vLLM: no EOS/stop before this many; default 0 */
    bool has_seed;      /* the client gave sampling.seed; else the server
                            draws one at submission */
    bool ignore_eos;    /* default false */
    bool skip_special_tokens;        /* default true */
    bool include_stop_str_in_output; /* default false */
    char **stop;                     /* n_stop malloc'd non-empty strings */
    size_t n_stop;                   /* the front ends bound the count */
    int32_t *stop_token_ids; /* n_stop_token_ids ids (malloc'd or NULL) */
    size_t n_stop_token_ids; /* likewise */
    int32_t logprobs;        /* -1 = none; else alternatives per token,
                                0 .. the front end's bound (the sampler's
                                n_top is the same number, 0 for none) */
    bool prompt_lp;          /* the prompt's log-probabilities (echo with
                                logprobs, vLLM's prompt_logprobs): every
                                prompt position after the first, computed
                                by the request's own chunked prefill (it
                                never adopts stored KV); default false */
    int32_t prompt_top;      /* with prompt_lp: alternatives per prompt
                                position, 0 .. RT_PROMPT_LPS_MAX_TOP */
    bool prompt_only;        /* the client's max_tokens 0 (with prompt_lp
                                or echo): the prompt is prefilled and the
                                one token its last chunk draws (max_tokens
                                is 1) is dropped, never delivered; the
                                request ends with "length" */
};

/* Alternatives per prompt position at most (the workers' bound). */
#define RT_PROMPT_LPS_MAX_TOP 20

/* A generation request. Exactly one of prompt, prompt_ids and chat's
 * messages is set. Zeroed is empty; everything is owned by the struct and
 * freed by rt_request_free. */
struct rt_request {
    bool is_chat;        /* the prompt is `chat`, rendered by the model's
                            template */
    int32_t n;           /* choices, >= 1 (0 means 1) */
    char *prompt;        /* text form; NUL-terminated */
    size_t prompt_len;   /* bytes */
    int32_t *prompt_ids; /* token form: (n_prompt_ids) */
    size_t n_prompt_ids;
    struct ct_chat chat;         /* chat: the conversation, its tools and the
                            template's options (common/chat/ct_chat.h),
                            checked by the front end; the messages are
                            dropped once rendered */
    bool add_special_tokens;     /* the tokenizer's special tokens around the
                                 prompt */
    struct tg_sampling sampling; /* checked by the front end; bias arrays
                                    owned */
    struct rt_gen_opts opts;
    const char *max_tokens_param; /* static: the field that set max_tokens,
                                     named by the errors of rt_request_fit */
    char *user;                   /* NULL = absent */
    char *session_id;             /* multi-turn key; NULL = absent */
    char *request_id;             /* the client's id; NULL = absent */
    char *grammar;                /* structured outputs (DESIGN.md §4.11): the
                                 constraint's spec text (common/grammar/
                                 gm_spec.h), checked by the front end
                                 (gm_spec_check); the workers compile it.
                                 Owned; NULL = unconstrained */
    const char *grammar_param;    /* static: the field the constraint came
                                     from ("tools", "response_format", ...),
                                     named when the workers refuse it;
                                     NULL = "response_format" */
};

/* Checks q against the context once its prompt has been tokenized to
 * n_prompt_tokens: the prompt must be non-empty and shorter than
 * max_model_len, and prompt + max_tokens must fit ("context_length_
 * exceeded"). Resolves max_tokens -1 to the room left. max_model_len <= 0
 * only rejects an empty prompt. Returns 0, or TG_EFORMAT / TG_ETOOBIG /
 * TG_ERANGE with *e filled (RT_REQ_ERR_INVALID). Any thread. */
int rt_request_fit(struct rt_request *q, int32_t max_model_len,
                   int64_t n_prompt_tokens, struct rt_request_error *e);

/* Fills *out (overwritten) with what one more parallel sample of `src`
 * needs once src's prompt is tokenized and its max_tokens resolved: is_chat,
 * add_special_tokens, sampling (logit bias copied), options (stop strings
 * and ids copied), max_tokens_param, the chat's options and tools (a
 * reference; not its kwargs), user,
 * request_id and the grammar (each choice is constrained on its own); no
 * prompt, messages or session (a sample is never stored
 * for multi-turn reuse), and n = 1. Returns 0 or TG_ENOMEM (*out then
 * empty). The caller frees *out with rt_request_free. Any thread. */
int rt_request_copy_sample(const struct rt_request *src,
                           struct rt_request *out);

/* Releases everything q owns and zeroes it. Safe on a zeroed request. */
void rt_request_free(struct rt_request *q);

/* ---- what flows back ---------------------------------------------------- */

/* How a request ended (the sink's `fin`). */
enum rt_finish {
    RT_FINISH_NONE = 0,   /* still generating: finish_reason null */
    RT_FINISH_STOP,       /* "stop": EOS, stop string or stop token */
    RT_FINISH_LENGTH,     /* "length": max_tokens or the context */
    RT_FINISH_ABORT,      /* "abort" (vLLM): cancelled */
    RT_FINISH_ERROR,      /* "error": the request failed mid-way */
    RT_FINISH_TOOL_CALLS, /* "tool_calls": stopped after calling tools */
};

/* One alternative at a position. Logprobs are natural-log probabilities;
 * -inf (and anything below) is written as -9999.0, as vLLM does, since JSON
 * has no infinities. */
struct rt_top_logprob {
    int32_t id;
    float logprob;
};

/* The sampled token at one position and its alternatives (in the order
 * they are to be listed; the caller decides whether the sampled token is
 * among them). */
struct rt_token_logprob {
    int32_t id;
    float logprob;
    const struct rt_top_logprob *top; /* (n_top) */
    size_t n_top;
};

/* The prompt log-probabilities of a request that asked (rt_gen_opts.
 * prompt_lp): for each prompt position p in 1 .. n - 1, the natural-log
 * probability of token p given tokens 0 .. p - 1 as the request's chunked
 * prefill computed it (the compressed KV of its earlier chunks, DESIGN.md
 * §4.3), the rank of token p (1 + the ids more likely) and the k most
 * likely ids there. Filled as the chunks complete, in position order;
 * complete when have == n - 1, which is before the first generated token
 * is delivered. Memory: n * (8 + 8 k) bytes, allocated at submission. */
struct rt_prompt_lps {
    int64_t n;        /* prompt tokens */
    int32_t k;        /* alternatives per position */
    int64_t have;     /* positions 1 .. have are filled */
    float *lp;        /* (n) [0] unused */
    int32_t *rank;    /* (n) [0] unused */
    int32_t *top_ids; /* (n, k) most likely first */
    float *top_lps;   /* (n, k) */
};

#endif /* RT_REQUEST_H */
