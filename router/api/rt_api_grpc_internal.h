/*
 * rt_api_grpc_internal.h — the conversion of a gRPC chat into the HTTP
 * API's JSON (rt_api_grpc_chat.c) and the prompt's log-probabilities of
 * a response (rt_api_grpc_plp.c), for the gRPC front end's files only.
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

/* The prompt's log-probabilities of a finished request (r->plp) as
 * GenerateResponse.prompt_logprobs (rt_api_grpc_plp.c): the arrays live
 * in *b until rt_api_grpc__plp_free, after the message is packed. Returns
 * 0 or TG_ENOMEM. Loop thread. */
struct rt_req;
struct rt_api_grpc_plp {
    Tangram__V1__PromptLogprob *v, **vp;
    Tangram__V1__TopLogprob *top, **topp;
    char **txt;
    size_t n_txt;
};
int rt_api_grpc__plp(const struct rt_req *r, Tangram__V1__GenerateResponse *m,
                     struct rt_api_grpc_plp *b);
void rt_api_grpc__plp_free(struct rt_api_grpc_plp *b);

#endif /* RT_API_GRPC_INTERNAL_H */
