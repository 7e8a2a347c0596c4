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

/* Converts q, a tangram.v1.GenerateRequest unpacked from a client's bytes,
 * into *g (which must be zeroed) with the OpenAI defaults and the limits
 * of the HTTP API: exactly one prompt form, roles by name, ids
 * (session_id, or else call's "x-session-id" header) of at most
 * RT_OPENAI_MAX_ID_BYTES bytes of UTF-8, sampling ranges, stop strings and
 * stop token ids below s->mc.vocab_size. What the Generate method runs
 * first, and what the fuzzing harnesses feed untrusted requests. Reads
 * s->model_name and s->mc.vocab_size only. Returns 0, or TG_EINVAL /
 * TG_ENOMEM with *e filled; either way the caller frees *g
 * (rt_gen_request_free). Loop thread (any thread for a server object of
 * its own). */
int rt_api_grpc_convert(struct rt_server *s,
                        const Tangram__V1__GenerateRequest *q,
                        struct rt_gen_request *g, struct rt_api_error *e,
                        const struct rt_grpc_call *call);

#endif /* RT_API_H */
