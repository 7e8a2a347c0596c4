/*
 * rt_api_grpc.h — the gRPC front end's request conversion: a
 * tangram.v1.GenerateRequest (proto/tangram.proto) into the parsed request
 * both front ends hand to the core (rt_openai.h's struct rt_gen_request),
 * with the HTTP API's defaults, limits and sampling check
 * (rt_api_grpc_convert.c). rt_api_grpc.c serves Generate with it; the fuzzing harnesses feed it requests
 * unpacked from untrusted bytes.
 */
#ifndef RT_API_GRPC_H
#define RT_API_GRPC_H

#include "router/api/rt_openai.h"
#include "router/core/rt_server.h"
#include "router/net/rt_grpc.h"
#include "tangram.pb-c.h"

/* Converts q into *g (which must be zeroed) with the OpenAI defaults and the
 * limits of the HTTP API: exactly one prompt form, roles by name, ids
 * (session_id, or else call's "x-session-id" header, which is refused
 * when empty or given twice even beside session_id) of at most
 * RT_OPENAI_MAX_ID_BYTES bytes of UTF-8, sampling ranges (the table of
 * rt_fields.h, as the HTTP API's), stop strings and
 * stop token ids below cfg->vocab_size; response_format and a
 * tool_choice that requires calls into q.grammar (checked with cfg's
 * tool-call format and whitespace policy). previous_response_id and
 * store are not read here: the front end's (rt_api_grpc_cont.c, over
 * rt_api_cont.h) once the request is converted. Returns 0, or TG_EINVAL /
 * TG_ERANGE / TG_ENOMEM with *e filled; either way the caller frees *g
 * (rt_gen_request_free). Any thread. */
int rt_api_grpc_convert(const struct rt_openai_cfg *cfg,
                        const Tangram__V1__GenerateRequest *q,
                        struct rt_gen_request *g, struct rt_request_error *e,
                        const struct rt_grpc_call *call);

#endif /* RT_API_GRPC_H */
