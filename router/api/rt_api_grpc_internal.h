/*
 * rt_api_grpc_internal.h — the conversion of a gRPC chat into the
 * conversation value (rt_api_grpc_chat.c), the prompt's log-probabilities of
 * a response (rt_api_grpc_plp.c) and the conversations a Generate stores
 * and continues (rt_api_grpc_cont.c), for the gRPC front end's files only.
 */
#ifndef RT_API_GRPC_INTERNAL_H
#define RT_API_GRPC_INTERNAL_H

#include <stdbool.h>

#include <jansson.h>

#include "common/base/tg_buf.h"
#include "common/chat/ct_chat.h"
#include "router/api/rt_api_grpc.h"
#include "router/core/rt_respstore.h"
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

/* A Generate's stored conversation (GenerateRequest.previous_response_id
 * and store; rt_api_cont.h): owned by the call's state, freed with it. */
struct rt_api_grpc_cont {
    bool store;                  /* this turn is stored */
    char *prev_id;               /* previous_response_id; NULL = none */
    char id[RT_RESP_ID_MAX];     /* the stored response's (store) */
    char msg_id[RT_RESP_ID_MAX]; /* its output items' */
    char rs_id[RT_RESP_ID_MAX];
    struct rt_resp_scope scope; /* the API key and the request's session */
    json_t *history;            /* the items before this turn (the
                                   continued response's), or NULL */
    json_t *input;              /* this turn's messages as items */
    json_t *tools;              /* the request's, Responses shape */
    struct tg_buf text;         /* the answer's text streamed so far (tool
                                   calls taken out), when stored */
};

/* The conversation fields of q, whose chat is converted into g already,
 * into *out: NULL when it neither stores nor continues (a plain Generate);
 * else its scope (the server's API key and g's session), this turn's
 * messages as items and the ids of what it stores. Returns 0, or with *e
 * TG_EINVAL (not a chat), TG_EUNSUPPORTED (the server holds no responses)
 * or TG_ENOMEM. Loop thread. */
int rt_api_grpc__cont_new(struct rt_server *s,
                          const Tangram__V1__GenerateRequest *q,
                          const struct rt_gen_request *g,
                          struct rt_api_grpc_cont **out,
                          struct rt_request_error *e);

/* Frees c; safe on NULL. */
void rt_api_grpc__cont_free(struct rt_api_grpc_cont *c);

/* Makes g (the chat of this turn's messages) the continuation of `prev`
 * (c->prev_id's entry, referenced by the caller and unchanged meanwhile):
 * rt_api_cont_compose, the stored ids kept while the tools are the same.
 * Returns 0 or an error with *e (params as the gRPC fields). Any thread
 * (a pool job). */
int rt_api_grpc__cont_compose(struct rt_server *s, struct rt_api_grpc_cont *c,
                              const struct rt_resp_entry *prev,
                              struct rt_gen_request *g,
                              struct rt_request_error *e);

/* Keeps len bytes of the answer's text streamed (c stored; else nothing).
 * Returns 0 or TG_ENOMEM. */
int rt_api_grpc__cont_text(struct rt_api_grpc_cont *c, const char *text,
                           size_t len);

/* Stores the finished turn r of c (stored, not failed or aborted): its
 * output items from the text kept and the tool calls parsed, a Response
 * object, the items and token ids (rt_api_cont_store). Returns 0 (answer
 * now), TG_EAGAIN (answer from done) or TG_ENOMEM (not stored). Loop
 * thread. */
int rt_api_grpc__cont_store(struct rt_req *r, struct rt_api_grpc_cont *c,
                            enum rt_finish fin, rt_respstore_done_fn done,
                            void *ud);

/* The final message m of a stored turn: with m->response_id set, sent and
 * `call` finished OK once the turn is stored (with a database, after its
 * commit; a call cancelled meanwhile is only dropped); not stored (out of
 * memory), sent without the id. Returns 0, or TG_ENOMEM with nothing sent
 * (the caller finishes the call). Loop thread. */
int rt_api_grpc__cont_finish(struct rt_req *r, struct rt_api_grpc_cont *c,
                             enum rt_finish fin, struct rt_grpc_call *call,
                             Tangram__V1__GenerateResponse *m);

#endif /* RT_API_GRPC_INTERNAL_H */
