/*
 * rt_api_grpc_internal.h — the conversion of a tangram.v1.GenerateRequest
 * into the router's request (rt_api_grpc.c) and of a gRPC chat into the
 * HTTP API's JSON (rt_api_grpc_chat.c), declared for the gRPC front end's
 * files and the fuzzing harness (tests/fuzz/fuzz_grpc_msg.c) that feeds
 * them requests unpacked from untrusted bytes. Not for other modules.
 */
#ifndef RT_API_GRPC_INTERNAL_H
#define RT_API_GRPC_INTERNAL_H

#include <jansson.h>

#include "router/core/rt_server.h"
#include "router/net/rt_grpc.h"
#include "tangram.pb-c.h"

/* Converts q into *g (which must be zeroed) with the OpenAI defaults and the
 * limits of the HTTP API: exactly one prompt form, roles by name, ids
 * (session_id, or else call's "x-session-id" header) of at most
 * RT_OPENAI_MAX_ID_BYTES bytes of UTF-8, sampling ranges, stop strings and
 * stop token ids below s->mc.vocab_size. Reads s->model_name and
 * s->mc.vocab_size only. Returns 0, or TG_EINVAL / TG_ENOMEM with *e
 * filled; either way the caller frees *g (rt_gen_request_free). Loop
 * thread (any thread for a server object of its own). */
int rt_api_grpc__convert(struct rt_server *s,
                         const Tangram__V1__GenerateRequest *q,
                         struct rt_gen_request *g, struct rt_api_error *e,
                         const struct rt_grpc_call *call);

/* The OpenAI JSON of a chat (messages, tools, tool_choice) from its
 * protobuf form, so that it goes through the HTTP API's validation and
 * normalization (rt_openai_chat.c). Returns a new object, or NULL with *e
 * filled (400 for a string that is not UTF-8 or parameters_json that is
 * not JSON, 500 out of memory). Any thread. */
json_t *rt_api_grpc__chat_json(Tangram__V1__ChatMessage *const *msgs,
                               size_t n, Tangram__V1__Tool *const *tools,
                               size_t n_tools, const char *tool_choice,
                               struct rt_api_error *e);

#endif /* RT_API_GRPC_INTERNAL_H */
