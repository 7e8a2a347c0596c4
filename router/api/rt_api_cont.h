/*
 * rt_api_cont.h — conversations held by the server, as both front ends
 * serve them: the Responses API's previous_response_id and store
 * (rt_api_http_resp.c) and the gRPC API's GenerateRequest fields of the
 * same names (rt_api_grpc_cont.c). The store is the core's
 * (router/core/rt_respstore.h); this is what a front end does with it:
 *
 * - lookup: the stored response named by previous_response_id in the
 *   caller's scope (the API key and the session, rt_respstore_scope);
 *   another scope's, or an unknown, evicted or deleted id, is 404
 *   previous_response_not_found, never the content;
 * - the stored turn read back (rt_api_cont_read): the conversation's items
 *   and output, the next turn's history, and the instructions and tools the
 *   template rendered at the top of its prompt;
 * - the continuation's prompt (rt_api_cont_compose): the stored token ids,
 *   the closing of the previous assistant turn and the rendering of the new
 *   messages alone, cut out of renderings of a constant anchor conversation
 *   (so the multi-turn KV cache holds the previous turn's KV for exactly
 *   that prefix, whatever the template would make of the earlier turns);
 *   or, with --responses-rerender, when the instructions or tools changed,
 *   or when the template renders the anchor's turn differently by
 *   position, the whole history rendered again as chat messages (what
 *   transformers does; docs/API.md records the choice);
 * - a chat's messages as Responses items (rt_api_cont_items), so a gRPC
 *   conversation is stored in the shape the Responses API lists and
 *   re-renders: either front end continues the other's;
 * - the finished turn stored (rt_api_cont_store): its Response object,
 *   the conversation's items and the token ids of its prompt and output.
 *
 * Threads: as each function says; the composition runs on a pool job (it
 * renders the template), reading an entry the loop keeps referenced.
 */
#ifndef RT_API_CONT_H
#define RT_API_CONT_H

#include <jansson.h>
#include <stdbool.h>

#include "common/chat/ct_chat.h"
#include "router/api/rt_openai.h"
#include "router/core/rt_respstore.h"
#include "router/core/rt_server.h"

/* The caller's scope: the server's API key and the session `session`
 * (NULL: none) into *out. Loop thread; the server holds a store. */
void rt_api_cont_scope(struct rt_server *s, const char *session,
                       struct rt_resp_scope *out);

/* 0 when s holds stored responses, else TG_EUNSUPPORTED with *e (503
 * unavailable: "this server holds no responses"). */
int rt_api_cont_available(struct rt_server *s, struct rt_request_error *e);

/* The stored response `id` of `scope`, with a reference, into *out (give
 * it back with rt_respstore_unref). Returns 0, or TG_ENOTFOUND with *e:
 * 404 previous_response_not_found naming `param`. Loop thread. */
int rt_api_cont_lookup(struct rt_server *s, const char *id,
                       const struct rt_resp_scope *scope, const char *param,
                       struct rt_resp_entry **out, struct rt_request_error *e);

/* A stored turn read back: what the next one needs. Owned references. */
struct rt_api_cont_prev {
    json_t *history;      /* the conversation's input items, then the
                             response's output (array): the items before
                             the next turn's input */
    json_t *instructions; /* the stored turn's (string), or NULL */
    json_t *tools;        /* the stored turn's, Responses shape (array) */
};

/* Reads entry p (referenced by the caller, unchanged meanwhile) into *out
 * (zeroed first). Returns 0, TG_EINTERNAL (an unreadable entry) or
 * TG_ENOMEM, with *e. Any thread. */
int rt_api_cont_read(const struct rt_resp_entry *p,
                     struct rt_api_cont_prev *out, struct rt_request_error *e);

/* Frees what p owns; safe on a zeroed one. */
void rt_api_cont_prev_free(struct rt_api_cont_prev *p);

/* Whether a continuation with these instructions (string or NULL) and
 * tools (array, Responses shape, or NULL: none) renders the same top of
 * the prompt as the stored turn: then its token ids may be continued. */
bool rt_api_cont_same_top(const struct rt_api_cont_prev *p,
                          const json_t *instructions, const json_t *tools);

/* Makes the chat request *g (this turn's messages, after the
 * instructions' system message when `has_sys`) the continuation of the
 * stored `prev` (its entry; `hist` read from it): with `keep_ids` (the top
 * is the same and --responses-rerender is off) and a template that closes
 * the anchor's turn alike, g's prompt becomes token ids (the messages
 * dropped: g->q.prompt_ids); else hist's history is inserted as chat
 * messages before this turn's (after the system message). `what` names
 * the request in the log. Returns 0 or an error with *e (a template that
 * cannot render it: 400 naming "input"; TG_ENOMEM). Any thread (a pool
 * job: it renders and tokenizes). */
int rt_api_cont_compose(struct rt_server *s, const struct rt_resp_entry *prev,
                        const struct rt_api_cont_prev *hist, bool has_sys,
                        bool keep_ids, const char *what,
                        struct rt_gen_request *g, struct rt_request_error *e);

/* Appends messages m[0..n) as Responses items to `items` (array): a
 * system, user or assistant message as a message item (input_text parts;
 * output_text for the assistant), an assistant's reasoning_content as a
 * reasoning item before it and its calls as function_call items, a tool
 * result as a function_call_output item; each with a fresh id. A message's
 * `name` has no item field and is not kept. Returns 0 or TG_ENOMEM /
 * TG_EIO (no random ids). Any thread. */
int rt_api_cont_items(const struct ct_message *m, size_t n, json_t *items);

/* Tools in the Responses shape ({type "function", name, description?,
 * parameters?, strict?}; a new array; NULL tools: an empty one), or NULL
 * when out of memory. */
json_t *rt_api_cont_tools(const struct ct_tools *t);

/* Stores the finished request r as response `id` of `scope`: the Response
 * object `obj`, the conversation's items (`history` then `input`, either
 * NULL: none), the ids of `output`'s items (which a later item_reference
 * may name) and r's prompt and output token ids. Returns 0 (stored or, out
 * of memory, not stored and logged: answer now), TG_EAGAIN (answer from
 * done(ud, rc) once the database committed it). Loop thread. */
int rt_api_cont_store(struct rt_req *r, const char *id,
                      const struct rt_resp_scope *scope, const json_t *obj,
                      const json_t *history, const json_t *input,
                      const json_t *output, rt_respstore_done_fn done,
                      void *ud);

#endif /* RT_API_CONT_H */
