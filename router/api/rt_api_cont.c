/* rt_api_cont.c — conversations held by the server, shared by the HTTP
 * Responses API and the gRPC API (see rt_api_cont.h). */
#include "router/api/rt_api_cont.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/api/rt_api.h"
#include "router/api/rt_openai_chat.h"
#include "router/api/rt_responses.h"

static int oom(struct rt_request_error *e)
{
    rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                         "out of memory");
    return TG_ENOMEM;
}

void rt_api_cont_scope(struct rt_server *s, const char *session,
                       struct rt_resp_scope *out)
{
    rt_respstore_scope(rt_server_respstore(s), rt_server_opts(s)->api_key,
                       session, out);
}

int rt_api_cont_available(struct rt_server *s, struct rt_request_error *e)
{
    if (rt_server_respstore(s) != NULL)
        return 0;
    rt_request_error_set(e, RT_REQ_ERR_UNAVAILABLE, "unavailable", NULL,
                         "this server holds no responses");
    return TG_EUNSUPPORTED;
}

int rt_api_cont_lookup(struct rt_server *s, const char *id,
                       const struct rt_resp_scope *scope, const char *param,
                       struct rt_resp_entry **out, struct rt_request_error *e)
{
    *out = NULL;
    if (rt_respstore_get(rt_server_respstore(s), id, scope, out) == 0)
        return 0;
    rt_request_error_set(e, RT_REQ_ERR_NOT_FOUND, "previous_response_not_found",
                         param, "Previous response with id '%.80s' not found.",
                         id);
    return TG_ENOTFOUND;
}

int rt_api_cont_read(const struct rt_resp_entry *p,
                     struct rt_api_cont_prev *out, struct rt_request_error *e)
{
    memset(out, 0, sizeof(*out));
    json_error_t je;
    json_t *items = json_loads(p->items, 0, &je);
    json_t *resp = json_loads(p->response, 0, &je);
    if (!json_is_array(items) || !json_is_object(resp)) {
        json_decref(items);
        json_decref(resp);
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error",
                             "previous_response_id",
                             "the stored response is unreadable");
        return TG_EINTERNAL;
    }
    /* The history of the next turn: the conversation's input items and
     * the previous response's output. */
    json_t *instr = json_object_get(resp, "instructions");
    json_t *tools = json_object_get(resp, "tools");
    out->history = items;
    out->instructions = json_is_string(instr) ? json_incref(instr) : NULL;
    out->tools = json_is_array(tools) ? json_incref(tools) : json_array();
    int rc = out->tools != NULL &&
                     json_array_extend(items,
                                       json_object_get(resp, "output")) == 0
                 ? 0
                 : oom(e);
    json_decref(resp);
    if (rc != 0)
        rt_api_cont_prev_free(out);
    return rc;
}

void rt_api_cont_prev_free(struct rt_api_cont_prev *p)
{
    json_decref(p->history);
    json_decref(p->instructions);
    json_decref(p->tools);
    memset(p, 0, sizeof(*p));
}

bool rt_api_cont_same_top(const struct rt_api_cont_prev *p,
                          const json_t *instructions, const json_t *tools)
{
    bool same_instr = instructions != NULL
                          ? p->instructions != NULL &&
                                json_equal(p->instructions, instructions)
                          : p->instructions == NULL;
    size_t n = tools != NULL ? json_array_size(tools) : 0;
    bool same_tools = n == 0 ? json_array_size(p->tools) == 0
                             : json_equal(p->tools, tools);
    return same_instr && same_tools;
}

/* Markers of the anchor turn the new messages are rendered after. */
#define ANCHOR_USER "tangram-anchor-user-turn"
#define ANCHOR_ASSISTANT "tangram-anchor-assistant-turn"

/* The prompt of a continuation: the previous conversation's ids `prev`,
 * the closing of its assistant turn (what the template writes after an
 * assistant message, less what the model generated of it: its end token)
 * and the rendering of the new messages with the generation prompt: g's
 * chat, whose first message is the instructions when `has_sys`. Both are
 * cut out of renderings of a constant anchor conversation (a user and an
 * assistant turn) with and without the new messages, so the work is
 * bounded by the new input, not the history. Returns 0 with the ids in
 * g->q.prompt_ids (the chat messages dropped), TG_EAGAIN when the
 * template does not render the anchor's turn the same way in both (the
 * caller re-renders the history), or an error with *e. */
static int template_delta(struct rt_server *s, const struct rt_resp_entry *prev,
                          bool has_sys, struct rt_gen_request *g,
                          struct rt_request_error *e)
{
    if (!rt_server_info(s)->chat)
        return TG_EAGAIN;
    const struct ct_chat *c = &g->q.chat;
    size_t k = has_sys && c->n_messages > 0 ? 1 : 0;
    /* [instructions?, anchor user, anchor assistant, new messages...]:
     * the messages are borrowed, never freed from here */
    struct ct_message *m = calloc(c->n_messages + 2, sizeof(*m));
    if (m == NULL)
        return oom(e);
    if (k == 1)
        m[0] = c->messages[0];
    m[k] = (struct ct_message){.role = CT_ROLE_USER, .content = ANCHOR_USER};
    m[k + 1] = (struct ct_message){.role = CT_ROLE_ASSISTANT,
                                   .content = ANCHOR_ASSISTANT};
    memcpy(m + k + 2, c->messages + k, (c->n_messages - k) * sizeof(*m));
    struct ct_chat full = *c, anchor = *c;
    full.messages = m;
    full.n_messages = c->n_messages + 2;
    full.add_generation_prompt = true;
    full.continue_final_message = false;
    anchor.messages = m;
    anchor.n_messages = k + 2;
    anchor.add_generation_prompt = false;
    anchor.continue_final_message = false;
    char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    int rc = rt_server_render_chat(s, &full, &a, &alen, e);
    if (rc == 0)
        rc = rt_server_render_chat(s, &anchor, &b, &blen, e);
    free(m);
    if (rc != 0) {
        free(a);
        free(b);
        if (strcmp(e->param, "messages") == 0)
            snprintf(e->param, sizeof(e->param), "input");
        return rc;
    }
    const size_t mk = strlen(ANCHOR_ASSISTANT);
    const char *pa = strstr(a, ANCHOR_ASSISTANT),
               *pb = strstr(b, ANCHOR_ASSISTANT);
    const char *tail = pb != NULL ? pb + mk : NULL; /* the turn's closing */
    size_t tlen = tail != NULL ? blen - (size_t)(tail - b) : 0;
    if (pa == NULL || tail == NULL || strncmp(pa + mk, tail, tlen) != 0) {
        free(a);
        free(b);
        return TG_EAGAIN;
    }
    const char *delta = pa + mk + tlen;
    /* What of the closing the model generated: its last token (the end
     * token the template writes, when it stopped there). */
    size_t skip = 0;
    if (prev->n_tokens > 0) {
        size_t n = 0;
        const char *last = rt_server_token_text(
            s, prev->tokens[prev->n_tokens - 1], &n);
        if (n > 0 && n <= tlen && memcmp(tail, last, n) == 0)
            skip = n;
    }
    struct tg_buf text = {0};
    int ok = tg_buf_append(&text, tail + skip, tlen - skip) == 0 &&
             tg_buf_append(&text, delta, alen - (size_t)(delta - a)) == 0;
    free(a);
    free(b);
    if (!ok) {
        tg_buf_free(&text);
        return oom(e);
    }
    struct tok_ids ids = {0};
    rc = rt_server_encode(s, tg_buf_str(&text), text.len, 0, &ids, e);
    tg_buf_free(&text);
    if (rc != 0) {
        tok_ids_free(&ids);
        return rc;
    }
    size_t n = (size_t)prev->n_tokens + ids.n;
    int32_t *p = malloc(n * sizeof(int32_t) + 1);
    if (p == NULL) {
        tok_ids_free(&ids);
        return oom(e);
    }
    memcpy(p, prev->tokens, (size_t)prev->n_tokens * sizeof(int32_t));
    memcpy(p + prev->n_tokens, ids.v, ids.n * sizeof(int32_t));
    tok_ids_free(&ids);
    ct_messages_free(g->q.chat.messages, g->q.chat.n_messages);
    g->q.chat.messages = NULL;
    g->q.chat.n_messages = 0;
    g->q.is_chat = false;
    g->q.prompt_ids = p;
    g->q.n_prompt_ids = n;
    return 0;
}

/* Inserts the history's chat messages into g's chat at position k. */
static int insert_history(const json_t *history, size_t k,
                          struct rt_gen_request *g, struct rt_request_error *e)
{
    json_t *root = json_object(), *msgs = json_array();
    if (root == NULL || msgs == NULL ||
        json_object_set(root, "messages", msgs) != 0) {
        json_decref(root);
        json_decref(msgs);
        return oom(e);
    }
    int rc = rt_responses_messages(history, "previous_response_id", msgs, e);
    struct ct_chat h = {0};
    if (rc == 0 && json_array_size(msgs) > 0)
        rc = rt_openai_chat_parse_messages(root, &h, e);
    json_decref(msgs);
    json_decref(root);
    if (rc != 0 || h.n_messages == 0) {
        ct_chat_free(&h);
        if (rc != 0)
            snprintf(e->param, sizeof(e->param), "previous_response_id");
        return rc;
    }
    struct ct_chat *c = &g->q.chat;
    size_t n = c->n_messages + h.n_messages;
    struct ct_message *m = calloc(n, sizeof(*m));
    if (m == NULL) {
        ct_chat_free(&h);
        return oom(e);
    }
    k = k < c->n_messages ? k : c->n_messages;
    memcpy(m, c->messages, k * sizeof(*m));
    memcpy(m + k, h.messages, h.n_messages * sizeof(*m));
    memcpy(m + k + h.n_messages, c->messages + k,
           (c->n_messages - k) * sizeof(*m));
    free(c->messages);
    c->messages = m;
    c->n_messages = n;
    /* the messages moved: h keeps only what it owns besides them */
    free(h.messages);
    h.messages = NULL;
    h.n_messages = 0;
    ct_chat_free(&h);
    return 0;
}

int rt_api_cont_compose(struct rt_server *s, const struct rt_resp_entry *prev,
                        const struct rt_api_cont_prev *hist, bool has_sys,
                        bool keep_ids, const char *what,
                        struct rt_gen_request *g, struct rt_request_error *e)
{
    if (keep_ids && !rt_server_opts(s)->responses_rerender) {
        int rc = template_delta(s, prev, has_sys, g, e);
        if (rc != TG_EAGAIN)
            return rc;
        /* The template does not close a turn alike everywhere: the
         * history is rendered again. */
        log_info("%s: the chat template's turns differ by position; "
                 "previous_response_id re-renders the history",
                 what);
    }
    size_t k = has_sys && g->q.chat.n_messages > 0 ? 1 : 0;
    return insert_history(hist->history, k, g, e);
}

/* ---- a chat as Responses items -------------------------------------------- */

/* Appends `it` (stolen) with a fresh id of `prefix`; 0 or an error. */
static int add_item(json_t *items, json_t *it, const char *prefix)
{
    char id[RT_RESP_ID_MAX];
    if (it == NULL)
        return TG_ENOMEM;
    int rc = rt_respstore_new_id(prefix, id);
    if (rc == 0 && json_object_set_new(it, "id", json_string(id)) != 0)
        rc = TG_ENOMEM;
    if (rc == 0 &&
        json_object_set_new(it, "status", json_string("completed")) != 0)
        rc = TG_ENOMEM;
    if (rc != 0) {
        json_decref(it);
        return rc;
    }
    return json_array_append_new(items, it) != 0 ? TG_ENOMEM : 0;
}

int rt_api_cont_items(const struct ct_message *m, size_t n, json_t *items)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const struct ct_message *x = &m[i];
        if (x->role == CT_ROLE_TOOL) {
            rc = add_item(
                items,
                json_pack("{s:s, s:s, s:s}", "type", "function_call_output",
                          "call_id",
                          x->tool_call_id != NULL ? x->tool_call_id : "",
                          "output", x->content),
                "fco");
            continue;
        }
        bool asst = x->role == CT_ROLE_ASSISTANT;
        if (asst && x->reasoning_content != NULL)
            rc = add_item(items,
                          json_pack("{s:s, s:[], s:[{s:s, s:s}]}", "type",
                                    "reasoning", "summary", "content", "type",
                                    "reasoning_text", "text",
                                    x->reasoning_content),
                          "rs");
        if (rc == 0 && !(asst && x->content_null))
            rc = add_item(
                items,
                asst
                    ? json_pack("{s:s, s:s, s:[{s:s, s:s, s:[]}]}", "type",
                                "message", "role", "assistant", "content",
                                "type", "output_text", "text", x->content,
                                "annotations")
                    : json_pack("{s:s, s:s, s:[{s:s, s:s}]}", "type", "message",
                                "role", ct_role_name(x->role), "content",
                                "type", "input_text", "text", x->content),
                "msg");
        for (size_t k = 0; rc == 0 && k < x->n_calls; k++)
            rc = add_item(items,
                          json_pack("{s:s, s:s, s:s, s:s}", "type",
                                    "function_call", "call_id", x->calls[k].id,
                                    "name", x->calls[k].name, "arguments",
                                    x->calls[k].arguments),
                          "fc");
    }
    return rc;
}

json_t *rt_api_cont_tools(const struct ct_tools *t)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && t != NULL && i < t->n; i++) {
        const struct ct_tool *x = &t->v[i];
        json_t *o = json_pack("{s:s, s:s}", "type", "function", "name",
                              x->name);
        int bad = o == NULL;
        if (!bad && x->description != NULL)
            bad |= json_object_set_new(o, "description",
                                       json_string(x->description)) != 0;
        if (!bad && x->parameters != NULL) {
            json_error_t je;
            json_t *p = json_loads(x->parameters, 0, &je);
            bad |= p == NULL || json_object_set_new(o, "parameters", p) != 0;
        }
        if (!bad && x->strict)
            bad |= json_object_set_new(o, "strict", json_true()) != 0;
        if (bad || json_array_append_new(a, o) != 0) {
            if (!bad)
                o = NULL; /* taken by the failed append */
            json_decref(o);
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* ---- storing a finished turn ---------------------------------------------- */

int rt_api_cont_store(struct rt_req *r, const char *id,
                      const struct rt_resp_scope *scope, const json_t *obj,
                      const json_t *history, const json_t *input,
                      const json_t *output, rt_respstore_done_fn done, void *ud)
{
    struct rt_respstore *store = rt_server_respstore(r->srv);
    if (store == NULL)
        return 0;
    struct rt_resp_entry *e = calloc(1, sizeof(*e));
    /* The input items of the conversation (what input_items lists); the
     * output is the Response object's, added by the next turn. */
    json_t *items = history != NULL ? json_copy((json_t *)history)
                                    : json_array();
    int ok = e != NULL && items != NULL &&
             (input == NULL || json_array_extend(items, (json_t *)input) == 0);
    if (ok) {
        snprintf(e->id, sizeof(e->id), "%s", id);
        e->scope = *scope;
        e->created = r->created;
        e->n_tokens = r->n_prompt + r->n_out;
        e->tokens = malloc((size_t)e->n_tokens * sizeof(int32_t) + 1);
        e->response = json_dumps(obj, JSON_COMPACT);
        e->items = json_dumps(items, JSON_COMPACT);
        e->n_item_ids = json_array_size(output);
        e->item_ids = calloc(e->n_item_ids + 1, sizeof(char *));
        ok = e->tokens != NULL && e->response != NULL && e->items != NULL &&
             e->item_ids != NULL;
    }
    for (size_t i = 0; ok && i < e->n_item_ids; i++) {
        const char *iid = json_string_value(
            json_object_get(json_array_get(output, i), "id"));
        ok = (e->item_ids[i] = strdup(iid != NULL ? iid : "")) != NULL;
    }
    json_decref(items);
    if (!ok) {
        if (e != NULL)
            rt_resp_entry_free(e, 1);
        log_err("response %s not stored: out of memory", id);
        return 0;
    }
    memcpy(e->tokens, rt_req_prompt_ids(r),
           (size_t)r->n_prompt * sizeof(int32_t));
    memcpy(e->tokens + r->n_prompt, rt_req_out_ids(r),
           (size_t)r->n_out * sizeof(int32_t));
    int rc = rt_respstore_put(store, e, done, ud);
    return rc == TG_EAGAIN ? TG_EAGAIN : 0;
}
