/*
 * rt_api_http_internal.h — what the HTTP front end's files share:
 * rt_api_http.c (routes, generation, health, metrics) and
 * rt_api_http_body.c (request bodies parsed off the loop, /tokenize,
 * /detokenize). Not for other modules. Loop thread only.
 */
#ifndef RT_API_HTTP_INTERNAL_H
#define RT_API_HTTP_INTERNAL_H

#include "router/api/rt_api.h"

/* Request bodies of more bytes than this are parsed — and /tokenize and
 * /detokenize answered — on the thread pool, not the loop thread: the
 * same bound as prompts encoded inline (a body this small has strings no
 * larger), so a megabyte of JSON never holds up /health, /metrics or a
 * stream. */
#define RT_API_BODY_INLINE_BYTES RT_ENCODE_INLINE_BYTES

/* Answers req with the OpenAI error *e (Retry-After on 429 and 503). */
void rt_api_http__send_error(struct rt_http_req *req,
                             const struct rt_request_error *e);

/* Answers req with `status` and the JSON `body` (owned, freed here), or
 * with a 500 when rc != 0. */
void rt_api_http__send_owned(struct rt_http_req *req, int status, char *body,
                             size_t len, int rc);

/* Generation goes on with a parsed request (rt_api_http.c): rc 0 and *g
 * (moved out, *g left empty), or rc != 0 and the error *e (*g freed). */
void rt_api_http__generate_parsed(struct rt_server *s, struct rt_http_req *req,
                                  int rc, struct rt_gen_request *g,
                                  struct rt_request_error *e, size_t mem);

/* Parses the completions or chat body of req — on the loop when it is
 * small, else on the thread pool — then calls
 * rt_api_http__generate_parsed on the loop; a client gone meanwhile
 * cancels the job (rt_api_http_body.c). */
void rt_api_http__generate(struct rt_server *s, struct rt_http_req *req,
                           enum rt_endpoint ep);

/* Route handlers of rt_api_http_body.c; ud is the server. */
void rt_api_http__tokenize(struct rt_http_req *req, void *ud);
void rt_api_http__detokenize(struct rt_http_req *req, void *ud);

/* The Responses API (rt_api_http_resp.c): POST /v1/responses, GET
 * /v1/responses/{id} and .../input_items, DELETE /v1/responses/{id};
 * ud is the server. */
void rt_api_http__responses(struct rt_http_req *req, void *ud);
void rt_api_http__responses_get(struct rt_http_req *req, void *ud);
void rt_api_http__responses_delete(struct rt_http_req *req, void *ud);

#endif /* RT_API_HTTP_INTERNAL_H */
