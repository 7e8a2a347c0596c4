/*
 * rt_api_grpc_internal.h — the conversion of a gRPC chat into the HTTP
 * API's JSON (rt_api_grpc_chat.c), for the gRPC front end's files only.
 */
#ifndef RT_API_GRPC_INTERNAL_H
#define RT_API_GRPC_INTERNAL_H

#include <jansson.h>

#include "router/api/rt_api_grpc.h"

/* The OpenAI JSON of a chat (messages, tools, tool_choice) from its
 * protobuf form, so that it goes through the HTTP API's validation and
 * normalization (rt_openai_chat.c). Returns a new object, or NULL with *e
 * filled (400 for a string that is not UTF-8 or parameters_json that is
 * not JSON, 500 out of memory). Any thread. */
json_t *rt_api_grpc__chat_json(Tangram__V1__ChatMessage *const *msgs, size_t n,
                               Tangram__V1__Tool *const *tools, size_t n_tools,
                               const char *tool_choice,
                               struct rt_request_error *e);

/* What a gRPC request of `msg_len` bytes with this prompt text, these
 * prompt ids and this chat may cost from its conversion to its tokens,
 * bytes: the request memory estimate (router/core/rt_reqmem.h) of the
 * JSON it becomes, plus its unpacked protobuf form. Any thread. */
size_t rt_api_grpc__mem_estimate(size_t msg_len, const char *prompt,
                                 size_t n_ids,
                                 Tangram__V1__ChatMessage *const *msgs,
                                 size_t n, Tangram__V1__Tool *const *tools,
                                 size_t n_tools);

#endif /* RT_API_GRPC_INTERNAL_H */
