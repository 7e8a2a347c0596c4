/* rt_api_http_resp_out.c — the answers of the Responses API (see
 * rt_api_http_resp.c): the Response object of a finished generation, the
 * Responses event stream, answers held until the stored response is
 * committed (--responses-db), and GET / DELETE /v1/responses/{id} and
 * GET .../input_items. Loop thread only. */
#include "router/api/rt_api_http_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/api/rt_api_cont.h"
#include "router/api/rt_responses.h"

static const char JSON[] = "application/json";

static void oom_error(struct rt_request_error *e)
{
    rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                         "out of memory");
}

static void not_found(struct rt_http_req *req, const char *id)
{
    struct rt_request_error e;
    rt_request_error_set(&e, RT_REQ_ERR_NOT_FOUND, "response_not_found", NULL,
                         "Response with id '%.80s' not found.", id);
    rt_api_http__send_error(req, &e);
}

/* ---- answers held until the store commits --------------------------------- */

struct pending {
    struct rt_http_req *req; /* NULL once the client is gone */
    char *body;              /* the JSON body, or the stream's last event */
    size_t len;
    int stream;
};

static void pending_gone(struct rt_http_req *req, void *ud)
{
    (void)req;
    ((struct pending *)ud)->req = NULL;
}

static void pending_send(struct pending *p)
{
    if (p->req != NULL) {
        rt_http_req_on_abort(p->req, NULL, NULL);
        if (p->stream) {
            rt_http_stream_write(p->req, p->body, p->len);
            rt_http_stream_end(p->req);
        } else {
            rt_http_respond(p->req, 200, JSON, p->body, p->len);
        }
    }
    free(p->body);
    free(p);
}

static void pending_done(void *ud, int rc)
{
    /* A failed commit is logged and counted by the store; the response
     * stays in memory and is answered. */
    (void)rc;
    pending_send(ud);
}

/* ---- the generation's end ------------------------------------------------------ */

/* The closing JSON of the output: the Response object. */
static json_t *response_object(struct rt_req *r, json_t *output,
                               enum rt_finish fin, const char *error,
                               struct rt_request_error *errbuf)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    struct rt_usage u = {r->n_prompt, r->n_out, r->cached_tokens};
    struct rt_responses_result res = {
        .id = st->id,
        .model = rt_server_info(r->srv)->model_name,
        .created = r->created,
        .status = fin == RT_FINISH_ERROR || fin == RT_FINISH_ABORT ? "failed"
                  : fin == RT_FINISH_LENGTH ? "incomplete"
                                            : "completed",
        .incomplete = fin == RT_FINISH_LENGTH ? "max_output_tokens" : NULL,
        .previous_id = st->rq.previous_id,
        .store = st->rq.store,
        .output = output,
        .usage = &u,
    };
    if (fin == RT_FINISH_ERROR) {
        rt_api_gen_error(errbuf, error);
        res.error = errbuf;
    } else if (fin == RT_FINISH_ABORT) {
        /* Cut by a drain (the server is shutting down). */
        rt_request_error_set(errbuf, RT_REQ_ERR_UNAVAILABLE, "aborted", NULL,
                             "the generation was cut short (the server is "
                             "shutting down)");
        res.error = errbuf;
    }
    return rt_responses_object(&st->rq, &res);
}

/* Stores the response `obj` with output items `output` of r (when the
 * request asked to): 0 (stored or not stored, answer now), TG_EAGAIN
 * (answer from `done`). */
static int store_response(struct rt_req *r, json_t *obj, json_t *output,
                          struct pending *p)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    if (!st->rq.store)
        return 0;
    return rt_api_cont_store(r, st->id, &st->scope, obj, st->history,
                             st->rq.input, output, pending_done, p);
}

/* Sends (now or once stored) `body` of r's end: the JSON answer or the
 * stream's last event. */
static void finish(struct rt_req *r, json_t *obj, json_t *output, char *body,
                   size_t len, int stream)
{
    struct pending *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        free(body);
        if (stream) {
            rt_http_stream_end(r->client);
        } else {
            struct rt_request_error e;
            oom_error(&e);
            rt_api_http__send_error(r->client, &e);
        }
        return;
    }
    p->req = r->client;
    p->body = body;
    p->len = len;
    p->stream = stream;
    /* The client may leave while the commit runs. */
    rt_http_req_on_abort(p->req, pending_gone, p);
    if (obj == NULL || store_response(r, obj, output, p) != TG_EAGAIN)
        pending_send(p);
}

static json_t *answer_output(struct rt_req *r, const char *text, size_t len,
                             const char *status);

/* The items of r's whole output (non-streaming): its thought, then the
 * message and the calls. */
static json_t *whole_output(struct rt_req *r, const char *status)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    size_t len = 0;
    const char *text = rt_req_text(r, &len);
    json_t *thought;
    if (rt_responses_take_thought(st->think, st->rs_id, status, &text, &len,
                                  &thought) != 0)
        return NULL;
    return rt_responses_thought_first(thought,
                                      answer_output(r, text, len, status));
}

/* The output items of the answer `text` (after any thought): a message
 * and the tool calls parsed out of it. */
static json_t *answer_output(struct rt_req *r, const char *text, size_t len,
                             const char *status)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    if (a->tc == NULL)
        return rt_responses_output(st->msg_id, text, len, NULL, 0, status);
    struct tg_buf content = {0};
    struct rt_tc_delta d;
    int rc = rt_tc_feed(a->tc, text, len, &d);
    if (rc == 0)
        rc = tg_buf_append(&content, d.content, d.content_len);
    if (rc == 0 && (rc = rt_tc_finish(a->tc, &d)) == 0)
        rc = tg_buf_append(&content, d.content, d.content_len);
    json_t *out = NULL;
    if (rc == 0) {
        size_t n;
        const struct rt_tool_call *calls = rt_tc_calls(a->tc, &n);
        out = rt_responses_output(st->msg_id, tg_buf_str(&content), content.len,
                                  calls, n, status);
    }
    tg_buf_free(&content);
    return out;
}

static void json_deliver(struct rt_req *r, const char *text, size_t len,
                         const struct rt_token_logprob *lps, size_t n_lp,
                         enum rt_finish fin, const char *error)
{
    (void)text;
    (void)len;
    (void)lps;
    (void)n_lp;
    if (fin == RT_FINISH_NONE)
        return;
    if (fin == RT_FINISH_ERROR) {
        struct rt_request_error e;
        rt_api_gen_error(&e, error);
        rt_api_http__send_error(r->client, &e);
        return;
    }
    /* A response cut short is answered, not stored. */
    if (fin == RT_FINISH_ABORT)
        rt_api_http__resp_of(r)->rq.store = false;
    json_t *output = whole_output(r, fin == RT_FINISH_LENGTH ? "incomplete"
                                                             : "completed");
    struct rt_request_error eb;
    json_t *obj = output != NULL ? response_object(r, output, fin, NULL, &eb)
                                 : NULL;
    char *body = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;
    if (body == NULL) {
        json_decref(obj);
        json_decref(output);
        struct rt_request_error e;
        oom_error(&e);
        rt_api_http__send_error(r->client, &e);
        return;
    }
    finish(r, obj, output, body, strlen(body), 0);
    json_decref(obj);
    json_decref(output);
}

/* ---- streaming ----------------------------------------------------------------- */

/* Writes the event `type` with `data` (stolen); 0 or TG_ENOMEM. */
static int emit(struct rt_req *r, const char *type, json_t *data)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    char *buf = NULL;
    size_t n = 0;
    int rc = rt_responses_event(type, data, &st->seq, &buf, &n);
    if (rc == 0)
        rt_http_stream_write(r->client, buf, n);
    free(buf);
    return rc;
}

static json_t *message_item(const struct rt_api_http__resp *st,
                            const char *status, int with_text)
{
    json_t *m = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", st->msg_id,
                          "type", "message", "status", status, "role",
                          "assistant", "content");
    if (m != NULL && with_text)
        json_array_append_new(
            json_object_get(m, "content"),
            json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text",
                      tg_buf_str(&st->text), st->text.len, "annotations"));
    return m;
}

static int open_message(struct rt_req *r)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    if (st->msg_open)
        return 0;
    st->msg_open = 1;
    st->msg_index = st->out_index++;
    int rc = emit(r, "response.output_item.added",
                  json_pack("{s:i, s:o}", "output_index", st->msg_index, "item",
                            message_item(st, "in_progress", 0)));
    if (rc == 0)
        rc = emit(r, "response.content_part.added",
                  json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id",
                            st->msg_id, "output_index", st->msg_index,
                            "content_index", 0, "part", "type", "output_text",
                            "text", "", "annotations"));
    return rc;
}

static int close_message(struct rt_req *r, const char *status)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    if (st->msg_open != 1)
        return 0;
    st->msg_open = 2; /* done: later text would be a new item (none is) */
    int rc = emit(r, "response.output_text.done",
                  json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id",
                            st->msg_id, "output_index", st->msg_index,
                            "content_index", 0, "text", tg_buf_str(&st->text),
                            st->text.len, "logprobs"));
    if (rc == 0)
        rc = emit(r, "response.content_part.done",
                  json_pack("{s:s, s:i, s:i, s:{s:s, s:s%, s:[]}}", "item_id",
                            st->msg_id, "output_index", st->msg_index,
                            "content_index", 0, "part", "type", "output_text",
                            "text", tg_buf_str(&st->text), st->text.len,
                            "annotations"));
    if (rc == 0)
        rc = emit(r, "response.output_item.done",
                  json_pack("{s:i, s:o}", "output_index", st->msg_index, "item",
                            message_item(st, status, 1)));
    return rc;
}

static int text_delta(struct rt_req *r, const char *text, size_t len)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    if (len == 0)
        return 0;
    if (st->msg_open == 2) /* text after calls: kept with the message's */
        return tg_buf_append(&st->text, text, len);
    int rc = open_message(r);
    if (rc == 0)
        rc = tg_buf_append(&st->text, text, len);
    if (rc == 0)
        rc = emit(r, "response.output_text.delta",
                  json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id",
                            st->msg_id, "output_index", st->msg_index,
                            "content_index", 0, "delta", text, len,
                            "logprobs"));
    return rc;
}

static int call_items(struct rt_req *r, const struct rt_tool_call *calls,
                      size_t n)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    int rc = n > 0 ? close_message(r, "completed") : 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *one = rt_responses_output(NULL, NULL, 0, &calls[i], 1,
                                          "completed");
        json_t *item = json_array_get(one, 0);
        if (item == NULL) {
            json_decref(one);
            return TG_ENOMEM;
        }
        int idx = st->out_index++;
        const char *id = json_string_value(json_object_get(item, "id"));
        json_t *added = json_deep_copy(item);
        if (added != NULL) {
            json_object_set_new(added, "arguments", json_string(""));
            json_object_set_new(added, "status", json_string("in_progress"));
        }
        rc = emit(r, "response.output_item.added",
                  json_pack("{s:i, s:o}", "output_index", idx, "item", added));
        if (rc == 0)
            rc = emit(r, "response.function_call_arguments.delta",
                      json_pack("{s:s, s:i, s:s}", "item_id", id,
                                "output_index", idx, "delta",
                                calls[i].arguments));
        if (rc == 0)
            rc = emit(r, "response.function_call_arguments.done",
                      json_pack("{s:s, s:i, s:s}", "item_id", id,
                                "output_index", idx, "arguments",
                                calls[i].arguments));
        if (rc == 0)
            rc = emit(
                r, "response.output_item.done",
                json_pack("{s:i, s:O}", "output_index", idx, "item", item));
        if (rc == 0 && json_array_append(st->calls, item) != 0)
            rc = TG_ENOMEM;
        json_decref(one);
    }
    return rc;
}

/* ---- the thought of a thinking template, streamed ----------------------- */

static json_t *reasoning_item(const struct rt_api_http__resp *st,
                              const char *status)
{
    return rt_responses_reasoning_item(st->rs_id, tg_buf_str(&st->rtext),
                                       st->rtext.len, status);
}

static int reasoning_delta(struct rt_req *r, const char *t, size_t n)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    int rc = 0;
    if (st->rs_open == 0) {
        st->rs_open = 1;
        st->rs_index = st->out_index++;
        json_t *item = rt_responses_reasoning_item(st->rs_id, "", 0,
                                                   "in_progress");
        if (item != NULL)
            json_array_clear(json_object_get(item, "content"));
        rc = emit(r, "response.output_item.added",
                  json_pack("{s:i, s:o}", "output_index", st->rs_index, "item",
                            item));
        if (rc == 0)
            rc = emit(r, "response.content_part.added",
                      json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id",
                                st->rs_id, "output_index", st->rs_index,
                                "content_index", 0, "part", "type",
                                "reasoning_text", "text", ""));
    }
    if (rc == 0 && n > 0 && (rc = tg_buf_append(&st->rtext, t, n)) == 0)
        rc = emit(r, "response.reasoning_text.delta",
                  json_pack("{s:s, s:i, s:i, s:s%}", "item_id", st->rs_id,
                            "output_index", st->rs_index, "content_index", 0,
                            "delta", t, n));
    return rc;
}

static int reasoning_done(struct rt_req *r, const char *status)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    if (st->rs_open != 1)
        return 0;
    st->rs_open = 2;
    /* The template's newlines before the closing tag are not the thought's
     * (the whole output's split drops them alike). */
    while (st->rtext.len > 0 && st->rtext.data[st->rtext.len - 1] == '\n')
        st->rtext.len--;
    int rc = emit(r, "response.reasoning_text.done",
                  json_pack("{s:s, s:i, s:i, s:s%}", "item_id", st->rs_id,
                            "output_index", st->rs_index, "content_index", 0,
                            "text", tg_buf_str(&st->rtext), st->rtext.len));
    if (rc == 0)
        rc = emit(r, "response.content_part.done",
                  json_pack("{s:s, s:i, s:i, s:{s:s, s:s%}}", "item_id",
                            st->rs_id, "output_index", st->rs_index,
                            "content_index", 0, "part", "type",
                            "reasoning_text", "text", tg_buf_str(&st->rtext),
                            st->rtext.len));
    if (rc == 0)
        rc = emit(r, "response.output_item.done",
                  json_pack("{s:i, s:o}", "output_index", st->rs_index, "item",
                            reasoning_item(st, status)));
    return rc;
}

/* Bytes of the longest suffix of t[0, n) that is a proper prefix of tag. */
static size_t partial_tag(const char *t, size_t n, const char *tag)
{
    size_t k = strlen(tag) - 1;
    for (k = k < n ? k : n; k > 0; k--)
        if (memcmp(t + n - k, tag, k) == 0)
            return k;
    return 0;
}

/* Splits the stream's output as rt_responses_split_think splits a whole
 * one: the thought goes out as reasoning events, the answer into *ans
 * (appended). At the end (`fin`) what is held is decided. */
static int think_feed(struct rt_req *r, const char *t, size_t n, int fin,
                      struct tg_buf *ans)
{
    static const char OPEN[] = "<think>", CLOSE[] = "</think>";
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    int rc = tg_buf_append(&st->pend, t, n);
    while (rc == 0 && st->pend.len > 0) {
        const char *p = tg_buf_str(&st->pend);
        size_t len = st->pend.len, used = len;
        if (st->think_state == 0) {
            size_t i = 0;
            while (i < len && (p[i] == ' ' || p[i] == '\n' || p[i] == '\r' ||
                               p[i] == '\t'))
                i++;
            size_t k = len - i < sizeof(OPEN) - 1 ? len - i : sizeof(OPEN) - 1;
            if (memcmp(p + i, OPEN, k) != 0) {
                st->think_state = 2; /* no thought: all of it is answer */
                continue;
            }
            if (k < sizeof(OPEN) - 1) { /* "<thi": wait for more */
                if (!fin)
                    break;
                st->think_state = 2;
                continue;
            }
            st->think_state = 1;
            st->strip_nl = 1;
            used = i + sizeof(OPEN) - 1;
        } else if (st->think_state == 1) {
            const char *c = memmem(p, len, CLOSE, sizeof(CLOSE) - 1);
            size_t keep = c != NULL || fin ? 0 : partial_tag(p, len, CLOSE);
            size_t upto = c != NULL ? (size_t)(c - p) : len - keep;
            size_t skip = 0;
            while (st->strip_nl && skip < upto && p[skip] == '\n')
                skip++;
            if (skip < upto)
                st->strip_nl = 0;
            rc = reasoning_delta(r, p + skip, upto - skip);
            if (c != NULL) {
                st->think_state = 2;
                st->strip_nl = 1;
                used = upto + sizeof(CLOSE) - 1;
            } else {
                used = upto;
                if (used == 0)
                    break;
            }
        } else {
            size_t skip = 0;
            while (st->strip_nl && skip < len &&
                   (p[skip] == '\n' || p[skip] == '\r'))
                skip++;
            if (skip < len)
                st->strip_nl = 0;
            rc = tg_buf_append(ans, p + skip, len - skip);
        }
        memmove(st->pend.data, st->pend.data + used, len - used);
        st->pend.len = len - used;
    }
    if (rc == 0 && (fin || st->think_state == 2))
        rc = reasoning_done(
            r, fin ? (fin == RT_FINISH_LENGTH ? "incomplete" : "completed")
                   : "completed");
    return rc;
}

static void sse_deliver(struct rt_req *r, const char *text, size_t len,
                        const struct rt_token_logprob *lps, size_t n_lp,
                        enum rt_finish fin, const char *error)
{
    (void)lps;
    (void)n_lp;
    struct rt_api_gen *a = rt_api_gen_of(r);
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    int rc = 0;
    struct tg_buf ans = {0};
    if (st->think && fin != RT_FINISH_ERROR) {
        rc = think_feed(r, text, len, (int)fin, &ans);
        text = tg_buf_str(&ans);
        len = ans.len;
    }
    if (rc == 0 && fin != RT_FINISH_ERROR) {
        if (a->tc != NULL) {
            struct rt_tc_delta d;
            rc = rt_tc_feed(a->tc, text, len, &d);
            if (rc == 0)
                rc = text_delta(r, d.content, d.content_len);
            if (rc == 0)
                rc = call_items(r, d.calls, d.n_calls);
            if (rc == 0 && fin != RT_FINISH_NONE &&
                (rc = rt_tc_finish(a->tc, &d)) == 0) {
                rc = text_delta(r, d.content, d.content_len);
                if (rc == 0)
                    rc = call_items(r, d.calls, d.n_calls);
            }
        } else {
            rc = text_delta(r, text, len);
        }
    }
    tg_buf_free(&ans);
    if (rc != 0 && fin == RT_FINISH_NONE) {
        fin = RT_FINISH_ERROR;
        error = "out of memory";
        rt_req_cancel(r);
    }
    if (fin == RT_FINISH_NONE)
        return;
    const char *status = fin == RT_FINISH_LENGTH ? "incomplete" : "completed";
    /* An output without text or calls still has its (empty) message. */
    if (fin != RT_FINISH_ERROR && st->msg_open == 0 &&
        json_array_size(st->calls) == 0)
        open_message(r);
    close_message(r, status);
    json_t *output = json_array();
    if (output != NULL && st->rs_open != 0)
        json_array_append_new(output, reasoning_item(st, status));
    if (output != NULL && st->msg_open != 0 &&
        (st->text.len > 0 || json_array_size(st->calls) == 0))
        json_array_append_new(output, message_item(st, status, 1));
    if (output != NULL)
        json_array_extend(output, st->calls);
    struct rt_request_error eb;
    json_t *obj = output != NULL ? response_object(r, output, fin, error, &eb)
                                 : NULL;
    const char *type = fin == RT_FINISH_ERROR || fin == RT_FINISH_ABORT
                           ? "response.failed"
                       : fin == RT_FINISH_LENGTH ? "response.incomplete"
                                                 : "response.completed";
    char *buf = NULL;
    size_t n = 0;
    if (obj == NULL ||
        rt_responses_event(type, json_pack("{s:O}", "response", obj), &st->seq,
                           &buf, &n) != 0) {
        json_decref(obj);
        json_decref(output);
        rt_http_stream_end(r->client);
        return;
    }
    /* A failed or cut response is not stored. */
    if (fin == RT_FINISH_ERROR || fin == RT_FINISH_ABORT)
        st->rq.store = false;
    finish(r, obj, output, buf, n, 1);
    json_decref(obj);
    json_decref(output);
}

const struct rt_sink rt_api_http__resp_json_sink = {json_deliver,
                                                    rt_api_gen_release};
const struct rt_sink rt_api_http__resp_sse_sink = {sse_deliver,
                                                   rt_api_gen_release};

/* The stream's first events, once the request is with the scheduler. */
void rt_api_http__resp_stream_begin(struct rt_req *r)
{
    struct rt_api_http__resp *st = rt_api_http__resp_of(r);
    struct rt_http_req *req = r->client;
    rt_http_resp_header(req, "Cache-Control", "no-cache");
    rt_http_stream_begin(req, 200, "text/event-stream");
    json_t *output = json_array();
    struct rt_responses_result res = {
        .id = st->id,
        .model = rt_server_info(r->srv)->model_name,
        .created = r->created,
        .status = "in_progress",
        .previous_id = st->rq.previous_id,
        .store = st->rq.store,
        .output = output,
    };
    json_t *obj = output != NULL ? rt_responses_object(&st->rq, &res) : NULL;
    json_decref(output);
    if (obj == NULL)
        return;
    emit(r, "response.created", json_pack("{s:O}", "response", obj));
    emit(r, "response.in_progress", json_pack("{s:O}", "response", obj));
    json_decref(obj);
}

/* ---- GET / DELETE /v1/responses/{id}[/input_items] ----------------------------- */

/* The id of the path (after /v1/responses/) into id; *items set when it
 * ends with /input_items. Returns 0 or -1 (not a response path). */
static int path_id(const char *path, char *id, size_t cap, int *items)
{
    static const char prefix[] = "/v1/responses/";
    static const char sfx[] = "/input_items";
    const char *p = path + sizeof(prefix) - 1;
    size_t n = strlen(p);
    *items = 0;
    if (n > sizeof(sfx) - 1 && strcmp(p + n - (sizeof(sfx) - 1), sfx) == 0) {
        n -= sizeof(sfx) - 1;
        *items = 1;
    }
    if (n == 0 || n >= cap || memchr(p, '/', n) != NULL)
        return -1;
    memcpy(id, p, n);
    id[n] = '\0';
    return 0;
}

/* A query parameter's value (at most cap - 1 bytes) into out; 0 or -1. */
static int query_get(const char *q, const char *name, char *out, size_t cap)
{
    size_t k = strlen(name);
    for (const char *p = q; p != NULL && *p != '\0';) {
        const char *amp = strchr(p, '&');
        size_t n = amp != NULL ? (size_t)(amp - p) : strlen(p);
        if (n > k && strncmp(p, name, k) == 0 && p[k] == '=') {
            size_t v = n - k - 1;
            if (v >= cap)
                return -1;
            memcpy(out, p + k + 1, v);
            out[v] = '\0';
            return 0;
        }
        p = amp != NULL ? amp + 1 : NULL;
    }
    return -1;
}

/* GET .../input_items: the conversation's items of the stored response,
 * a page of `limit` (1..100, default 20) in `order` (desc by default, as
 * OpenAI lists them) after the item `after`. */
static void list_items(struct rt_http_req *req, const struct rt_resp_entry *en)
{
    struct rt_request_error e;
    char v[RT_RESP_ID_MAX];
    long limit = 20;
    int asc = 0;
    if (query_get(req->query, "limit", v, sizeof(v)) == 0) {
        char *end;
        limit = strtol(v, &end, 10);
        if (*end != '\0' || limit < 1 || limit > 100) {
            rt_request_error_set(&e, RT_REQ_ERR_INVALID, "invalid_value",
                                 "limit",
                                 "'limit' must be an integer from 1 to 100");
            rt_api_http__send_error(req, &e);
            return;
        }
    }
    if (query_get(req->query, "order", v, sizeof(v)) == 0) {
        if (strcmp(v, "asc") != 0 && strcmp(v, "desc") != 0) {
            rt_request_error_set(&e, RT_REQ_ERR_INVALID, "invalid_value",
                                 "order", "'order' must be 'asc' or 'desc'");
            rt_api_http__send_error(req, &e);
            return;
        }
        asc = strcmp(v, "asc") == 0;
    }
    char after[RT_RESP_ID_MAX] = "";
    int has_after = query_get(req->query, "after", after, sizeof(after)) == 0;
    json_error_t je;
    json_t *items = json_loads(en->items, 0, &je);
    json_t *data = json_array();
    size_t n = json_array_size(items), start = 0;
    if (has_after) {
        start = n;
        for (size_t i = 0; i < n; i++) {
            size_t k = asc ? i : n - 1 - i;
            const char *id = json_string_value(
                json_object_get(json_array_get(items, k), "id"));
            if (id != NULL && strcmp(id, after) == 0) {
                start = i + 1;
                break;
            }
        }
    }
    size_t i = start;
    for (; data != NULL && i < n && json_array_size(data) < (size_t)limit; i++)
        json_array_append(data, json_array_get(items, asc ? i : n - 1 - i));
    json_t *first = json_object_get(json_array_get(data, 0), "id");
    json_t *last = json_object_get(
        json_array_get(data, json_array_size(data) - 1), "id");
    json_t *o = data != NULL
                    ? json_pack("{s:s, s:O, s:O, s:O, s:b}", "object", "list",
                                "data", data, "first_id",
                                first != NULL ? first : json_null(), "last_id",
                                last != NULL ? last : json_null(), "has_more",
                                i < n)
                    : NULL;
    char *body = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    json_decref(data);
    json_decref(items);
    rt_api_http__send_owned(req, 200, body, body != NULL ? strlen(body) : 0,
                            body != NULL ? 0 : TG_ENOMEM);
}

void rt_api_http__responses_get(struct rt_http_req *req, void *ud)
{
    struct rt_server *s = ud;
    char id[RT_RESP_ID_MAX];
    int items;
    if (rt_server_respstore(s) == NULL ||
        path_id(req->path, id, sizeof(id), &items) != 0) {
        not_found(req, req->path + strlen("/v1/responses/"));
        return;
    }
    struct rt_resp_scope sc;
    rt_api_http__resp_scope(s, req, NULL, &sc);
    struct rt_resp_entry *en;
    if (rt_respstore_get(rt_server_respstore(s), id, &sc, &en) != 0) {
        not_found(req, id);
        return;
    }
    if (items)
        list_items(req, en);
    else
        rt_http_respond(req, 200, JSON, en->response, strlen(en->response));
    rt_respstore_unref(rt_server_respstore(s), en);
}

void rt_api_http__responses_delete(struct rt_http_req *req, void *ud)
{
    struct rt_server *s = ud;
    char id[RT_RESP_ID_MAX];
    int items;
    if (rt_server_respstore(s) == NULL ||
        path_id(req->path, id, sizeof(id), &items) != 0 || items) {
        not_found(req, req->path + strlen("/v1/responses/"));
        return;
    }
    struct rt_resp_scope sc;
    rt_api_http__resp_scope(s, req, NULL, &sc);
    json_t *o = json_pack("{s:s, s:s, s:b}", "id", id, "object", "response",
                          "deleted", 1);
    char *body = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    struct pending *p = body != NULL ? calloc(1, sizeof(*p)) : NULL;
    if (p == NULL) {
        free(body);
        rt_api_http__send_owned(req, 200, NULL, 0, TG_ENOMEM);
        return;
    }
    p->req = req;
    p->body = body;
    p->len = strlen(body);
    /* Set before the delete: its commit may end before it returns. */
    rt_http_req_on_abort(req, pending_gone, p);
    int rc = rt_respstore_delete(rt_server_respstore(s), id, &sc, pending_done,
                                 p);
    if (rc == TG_ENOTFOUND) {
        rt_http_req_on_abort(req, NULL, NULL);
        free(body);
        free(p);
        not_found(req, id);
        return;
    }
    if (rc != TG_EAGAIN)
        pending_send(p); /* else answered once the delete is committed */
}
