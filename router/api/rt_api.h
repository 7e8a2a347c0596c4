/*
 * rt_api.h — the router's front ends: the OpenAI-compatible HTTP API
 * (rt_api_http.c) and the gRPC service (rt_api_grpc.c). Each adds its
 * routes or services to an HTTP or gRPC server (router/net/) and serves
 * them through the core's requests (rt_req_new, rt_req_submit ...). The
 * app (router/app/rt_app.h) registers them on the servers it made,
 * before they listen, so the server core never calls into a front end.
 */
#ifndef RT_API_H
#define RT_API_H

#include <stddef.h>

#include "router/api/rt_openai.h"
#include "router/api/rt_toolcall.h"
#include "router/core/rt_server.h"
#include "router/net/rt_grpc.h"
#include "router/net/rt_http.h"
#include "tangram.pb-c.h"

/* Adds the HTTP routes (POST /v1/completions, /v1/chat/completions,
 * /tokenize, /detokenize; GET and HEAD /v1/models, /v1/models/{id},
 * /health, /metrics) and the API-key head check to `http`, served by
 * the core `s` (both outlive the server's use of them). Returns 0 or a
 * TG_E* code with detail in err. Loop thread. */
int rt_api_http_register(struct rt_server *s, struct rt_http_server *http,
                         char *err, size_t errlen);

/* Adds the gRPC methods of tangram.v1.Generation (Generate, Tokenize,
 * ModelInfo, Abort), the grpc.health.v1 service and server reflection to
 * `grpc`, served by the core `s`. Returns 0 or a TG_E* code with detail
 * in err. Loop thread. */
int rt_api_grpc_register(struct rt_server *s, struct rt_grpc_server *grpc,
                         char *err, size_t errlen);

/* What the OpenAI parsers check a request against: the server's model,
 * its context (capped once when the workers' pools turn out smaller), the
 * vocabulary, the HTTP body limit and the chat template's tool-call format
 * (what a required tool call is constrained to). Loop thread, or a pool
 * job that the loop keeps the server alive for. */
struct rt_openai_cfg rt_api_openai_cfg(const struct rt_server *s);

/* A generation request on the front end's side (rt_req.fe): the parsed
 * request's part only this API needs (its core part, g.q, moved into
 * rt_req.q), the response's formatting state and the tool-call parser of
 * the model's output. Both front ends answer through it; it lives as long
 * as the rt_req (freed by rt_api_gen_release, the sinks' release). */
struct rt_api_gen {
    struct rt_gen_request g; /* g.q empty */
    struct rt_resp_ctx ctx;  /* filled by rt_api_gen_started */
    struct rt_tc_parser *tc; /* a chat offering tools to a model whose
                                   template names their format; NULL = the
                                   output is plain text */
    void *ext;               /* a front end's own state of the request
                                (the Responses API's), freed by
                                ext_free at release; NULL = none */
    void (*ext_free)(void *ext);
    size_t mem;              /* bytes of the request memory budget
                                (router/core/rt_reqmem.h) it holds until
                                its prompt is tokenized: given back by
                                rt_api_gen_started or _release */
    int32_t slot;            /* its choice's index in the answer: a
                                parallel sample's r->choice, a batch
                                member's prompt index, else 0 */
};

/* r's front-end state (NULL before rt_api_gen_attach). */
static inline struct rt_api_gen *rt_api_gen_of(const struct rt_req *r)
{
    return (struct rt_api_gen *)r->fe;
}

/* Hands the parsed request *g to r (new, not yet submitted): g->q
 * becomes r->q (a chat with tool_choice "none" gives the template no
 * tools), the rest r's front-end state, and r->id_str a fresh id
 * ("cmpl-" / "chatcmpl-" + 16 random hex digits). *g is left empty
 * either way. Returns 0, or TG_ENOMEM with *e filled (500). Loop thread. */
int rt_api_gen_attach(struct rt_req *r, struct rt_gen_request *g,
                      struct rt_request_error *e);

/* The same for parallel sample q of `leader` (rt_req_new_sample): a
 * front-end state with a copy of leader's (endpoint, model, stream and
 * usage options, tool_choice, echo text), then rt_api_gen_started.
 * Returns 0, or TG_ENOMEM with *e filled. Loop thread. */
int rt_api_gen_attach_sample(struct rt_req *q, const struct rt_req *leader,
                             struct rt_request_error *e);

/* After r's submission succeeded: the response context (id, model,
 * created, logprobs, usage options, the choice's index) and, for a chat
 * offering tools whose format the model's template names, the tool-call
 * parser. Returns 0, or TG_ENOMEM with *e filled. Loop thread. */
int rt_api_gen_started(struct rt_req *r, struct rt_request_error *e);

/* The multi-turn session of a request into q->session_id (rt_request.h),
 * shared by the front ends: a session_id the request already holds (the
 * JSON body's, checked by its parser) wins, then `field` (the gRPC
 * field; NULL or "" is unset; named field_param), then the header's value
 * `hdr` (the first of n_hdr headers of that name; named hdr_param). The
 * header is checked either way: more than one, or a value that is not an
 * id (rt_openai_check_id), is refused, since which conversation the
 * client meant is not known (a proxy that appends its own, or a client
 * bug) and guessing would share one's cache with the other's. Returns 0,
 * TG_EINVAL or TG_ENOMEM with *e filled. Any thread. */
int rt_api_session(struct rt_request *q, const char *field,
                   const char *field_param, const char *hdr, size_t n_hdr,
                   const char *hdr_param, struct rt_request_error *e);

/* The API error of a generation that failed with the core's message
 * `error` (NULL: none given), by its prefix: "kv_cache_exhausted: " (the
 * sequence outgrew the KV cache: the replica's capacity is at fault) is
 * 503 kv_cache_exhausted; "output_constraint_too_complex: " (the worker
 * could not follow the request's schema within its per-token budget:
 * the same schema fails again) is 400 invalid_request_error
 * output_constraint_too_complex; anything else 500 generation_failed.
 * The prefix is dropped from the message. */
void rt_api_gen_error(struct rt_request_error *e, const char *error);

/* Frees r's front-end state (the sinks' `release`). Safe without one. */
void rt_api_gen_release(struct rt_req *r);

/* Gives `mem` bytes back to s's request memory budget (none: no-op). Loop
 * thread. */
void rt_api_gen_mem_give(struct rt_server *s, size_t mem);

#endif /* RT_API_H */
