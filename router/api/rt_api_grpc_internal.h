/*
 * rt_api_grpc_internal.h — the conversion of a gRPC chat into the
 * conversation value (rt_api_grpc_chat.c) and the prompt's log-probabilities of
 * a response (rt_api_grpc_plp.c), for the gRPC front end's files only.
 */
#ifndef RT_API_GRPC_INTERNAL_H
#define RT_API_GRPC_INTERNAL_H

#include <stdbool.h>

#include "common/chat/ct_chat.h"
#include "router/api/rt_api_grpc.h"
#include "router/api/rt_openai_chat.h"

/* The conversation of a chat from its protobuf form into *out (zeroed by
 * the caller; freed by it with ct_chat_free whatever the result): proto3's
 * empty strings are absent fields, an assistant message with calls and no
 * text has no content; checked by rt_chat_check and rt_chat_check_tools
 * as the HTTP API's are. Returns 0, or TG_EFORMAT / TG_ENOMEM with *e
 * filled (RT_REQ_ERR_INVALID naming the field, e.g. parameters_json that
 * is not JSON; RT_REQ_ERR_INTERNAL). Any thread. */
int rt_api_grpc__chat(Tangram__V1__ChatMessage *const *msgs, size_t n,
                      Tangram__V1__Tool *const *tools, size_t n_tools,
                      struct ct_chat *out, struct rt_request_error *e);

/* tool_choice ("" or "auto", "none", "required", or the name of one of
 * `tools` to call) and parallel_tool_calls (NULL: unset, true) into *sel;
 * sel->name borrows `choice`. Returns 0 or TG_EFORMAT with *e filled. */
int rt_api_grpc__tool_sel(const char *choice, const bool *parallel,
                          const struct ct_tools *tools, struct rt_tool_sel *sel,
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
