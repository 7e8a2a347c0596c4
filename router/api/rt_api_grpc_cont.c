/* rt_api_grpc_cont.c — the conversations a gRPC Generate stores and
 * continues (GenerateRequest.previous_response_id and store), over the
 * continuation both front ends share (rt_api_cont.h): the request's fields
 * read, its stored conversation composed into its prompt, and the
 * finished turn stored with a Response object, so that the Responses API
 * retrieves, lists and continues it too. See rt_api_grpc_internal.h. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_err.h"
#include "router/api/rt_api.h"
#include "router/api/rt_api_cont.h"
#include "router/api/rt_api_grpc_internal.h"
#include "router/api/rt_responses.h"

static int oom(struct rt_request_error *e)
{
    rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                         "out of memory");
    return TG_ENOMEM;
}

void rt_api_grpc__cont_free(struct rt_api_grpc_cont *c)
{
    if (c == NULL)
        return;
    free(c->prev_id);
    json_decref(c->history);
    json_decref(c->input);
    json_decref(c->tools);
    tg_buf_free(&c->text);
    free(c);
}

int rt_api_grpc__cont_new(struct rt_server *s,
                          const Tangram__V1__GenerateRequest *q,
                          const struct rt_gen_request *g,
                          struct rt_api_grpc_cont **out,
                          struct rt_request_error *e)
{
    *out = NULL;
    bool prev = q->previous_response_id != NULL &&
                q->previous_response_id[0] != '\0';
    bool store = q->store_opt_case ==
                         TANGRAM__V1__GENERATE_REQUEST__STORE_OPT_STORE
                     ? (bool)q->store
                     : prev;
    if (!prev && !store)
        return 0;
    if (!g->q.is_chat) {
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value",
                             prev ? "previous_response_id" : "store",
                             "previous_response_id and store apply to chats "
                             "(messages) only");
        return TG_EINVAL;
    }
    int rc = rt_api_cont_available(s, e);
    if (rc != 0)
        return rc;
    struct rt_api_grpc_cont *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return oom(e);
    c->store = store;
    rt_api_cont_scope(s, g->q.session_id, &c->scope);
    /* This turn's messages as items, before a continuation's prompt
     * replaces them with token ids; the tools as the Response object
     * lists them (and as a continuation compares them). */
    int bad = (c->input = json_array()) == NULL ||
              (c->tools = rt_api_cont_tools(g->q.chat.tools)) == NULL ||
              (prev && (c->prev_id = strdup(q->previous_response_id)) == NULL);
    if (!bad && store)
        bad = rt_api_cont_items(g->q.chat.messages, g->q.chat.n_messages,
                                c->input) != 0 ||
              rt_respstore_new_id("resp", c->id) != 0 ||
              rt_respstore_new_id("msg", c->msg_id) != 0 ||
              rt_respstore_new_id("rs", c->rs_id) != 0;
    if (bad) {
        rt_api_grpc__cont_free(c);
        return oom(e);
    }
    *out = c;
    return 0;
}

int rt_api_grpc__cont_compose(struct rt_server *s, struct rt_api_grpc_cont *c,
                              const struct rt_resp_entry *prev,
                              struct rt_gen_request *g,
                              struct rt_request_error *e)
{
    struct rt_api_cont_prev hist;
    int rc = rt_api_cont_read(prev, &hist, e);
    if (rc != 0)
        return rc;
    c->history = json_incref(hist.history);
    /* A gRPC chat has no instructions: its messages, a system message
     * included, are the conversation's. The stored ids continue while
     * the tools stay the same. */
    rc = rt_api_cont_compose(s, prev, &hist, false,
                             rt_api_cont_same_top(&hist, NULL, c->tools),
                             c->id[0] != '\0' ? c->id : c->prev_id, g, e);
    rt_api_cont_prev_free(&hist);
    if (rc != 0 && strcmp(e->param, "input") == 0)
        snprintf(e->param, sizeof(e->param), "messages");
    return rc;
}

int rt_api_grpc__cont_text(struct rt_api_grpc_cont *c, const char *text,
                           size_t len)
{
    return c != NULL && c->store ? tg_buf_append(&c->text, text, len) : 0;
}

/* The output items of r's answer: its thought (a thinking template's),
 * the message and the tool calls. */
static json_t *output_items(struct rt_req *r, struct rt_api_grpc_cont *c,
                            const char *status)
{
    const char *text = tg_buf_str(&c->text);
    size_t len = c->text.len;
    json_t *thought;
    if (rt_responses_take_thought(rt_server_info(r->srv)->thinks, c->rs_id,
                                  status, &text, &len, &thought) != 0)
        return NULL;
    struct rt_api_gen *a = rt_api_gen_of(r);
    size_t n = 0;
    const struct rt_tool_call *calls = a->tc != NULL ? rt_tc_calls(a->tc, &n)
                                                     : NULL;
    return rt_responses_thought_first(
        thought, rt_responses_output(c->msg_id, text, len, calls, n, status));
}

int rt_api_grpc__cont_store(struct rt_req *r, struct rt_api_grpc_cont *c,
                            enum rt_finish fin, rt_respstore_done_fn done,
                            void *ud)
{
    if (c == NULL || !c->store)
        return 0;
    const char *status = fin == RT_FINISH_LENGTH ? "incomplete" : "completed";
    struct rt_usage u = {r->n_prompt, r->n_out, r->cached_tokens};
    /* The Response object the Responses API returns for it: no
     * instructions, the tools, the request's max_tokens. */
    struct rt_responses_request rq = {
        .previous_id = c->prev_id,
        .store = true,
        .tools = c->tools,
        .text = json_pack("{s:{s:s}}", "format", "type", "text"),
        .echo = json_pack("{s:I}", "max_output_tokens",
                          (json_int_t)r->q.opts.max_tokens),
    };
    struct rt_responses_result res = {
        .id = c->id,
        .model = rt_server_info(r->srv)->model_name,
        .created = r->created,
        .status = status,
        .incomplete = fin == RT_FINISH_LENGTH ? "max_output_tokens" : NULL,
        .previous_id = c->prev_id,
        .store = true,
        .output = output_items(r, c, status),
        .usage = &u,
    };
    json_t *obj = rq.text != NULL && rq.echo != NULL && res.output != NULL
                      ? rt_responses_object(&rq, &res)
                      : NULL;
    int rc = obj != NULL
                 ? rt_api_cont_store(r, c->id, &c->scope, obj, c->history,
                                     c->input, res.output, done, ud)
                 : TG_ENOMEM;
    json_decref(obj);
    json_decref(res.output);
    json_decref(rq.text);
    json_decref(rq.echo);
    return rc;
}

/* ---- the final message, held until the store committed ------------------- */

struct held {
    struct rt_grpc_call *call; /* NULL once the call was cancelled */
    uint8_t *buf;              /* the packed final message */
    size_t len;
};

static void held_cancelled(struct rt_grpc_call *call, int status, void *ud)
{
    (void)call;
    (void)status;
    ((struct held *)ud)->call = NULL;
}

static void held_send(struct held *p)
{
    if (p->call != NULL) {
        rt_grpc_call_send(p->call, p->buf, p->len);
        rt_grpc_call_finish(p->call, RT_GRPC_OK, NULL);
    }
    free(p->buf);
    free(p);
}

static void held_done(void *ud, int rc)
{
    /* A failed commit is logged and counted by the store; the response
     * stays in memory and is answered. */
    (void)rc;
    held_send(ud);
}

/* Packs m into p's buffer; 0 or TG_ENOMEM. */
static int held_pack(struct held *p, const Tangram__V1__GenerateResponse *m)
{
    free(p->buf);
    p->len = tangram__v1__generate_response__get_packed_size(m);
    p->buf = malloc(p->len + 1);
    if (p->buf == NULL)
        return TG_ENOMEM;
    tangram__v1__generate_response__pack(m, p->buf);
    return 0;
}

int rt_api_grpc__cont_finish(struct rt_req *r, struct rt_api_grpc_cont *c,
                             enum rt_finish fin, struct rt_grpc_call *call,
                             Tangram__V1__GenerateResponse *m)
{
    struct held *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return TG_ENOMEM;
    p->call = call;
    m->response_id = c->id;
    if (held_pack(p, m) != 0) {
        free(p);
        return TG_ENOMEM;
    }
    /* The call may end while the commit runs (the request's own cancel
     * callback is done with: this is its last delivery). */
    rt_grpc_call_on_cancel(call, held_cancelled, p);
    int rc = rt_api_grpc__cont_store(r, c, fin, held_done, p);
    if (rc == TG_EAGAIN)
        return 0; /* held_done sends it (perhaps already did) */
    if (rc != 0) {
        /* Not stored (out of memory): no id to continue. */
        m->response_id = "";
        if (held_pack(p, m) != 0) {
            free(p);
            return TG_ENOMEM;
        }
    }
    held_send(p);
    return 0;
}
