/*
 * rt_api.h — the router's front ends: the OpenAI-compatible HTTP API
 * (rt_api_http.c) and the gRPC service (rt_api_grpc.c). Each adds its
 * routes or services to the server's HTTP or gRPC server (s->http,
 * s->grpc) and serves them through rt_server's requests (rt_req_new,
 * rt_req_submit ...). The router's main registers them between
 * rt_server_init and rt_server_listen (router/core/rt_server.h), so the server
 * core never calls into a front end.
 */
#ifndef RT_API_H
#define RT_API_H

#include <stddef.h>

#include "router/core/rt_server.h"

/* Adds the HTTP routes (POST /v1/completions, /v1/chat/completions,
 * /tokenize, /detokenize; GET and HEAD /v1/models, /v1/models/{id},
 * /health, /metrics) to s->http. Returns 0 or a TG_E* code with detail
 * in err. Loop thread. */
int rt_api_http_register(struct rt_server *s, char *err, size_t errlen);

/* Adds the gRPC methods of tangram.v1.Generation (Generate, Tokenize,
 * ModelInfo, Abort) and the grpc.health.v1 check to s->grpc.
 * Returns 0 or a TG_E* code with detail in err. Loop thread. */
int rt_api_grpc_register(struct rt_server *s, char *err, size_t errlen);

#endif /* RT_API_H */
