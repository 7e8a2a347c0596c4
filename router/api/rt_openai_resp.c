/* rt_openai_resp.c — response bodies and SSE frames of the OpenAI API
 * (rt_openai.h): completions, chat completions, streaming chunks, usage,
 * logprobs, errors and the model list. Shapes follow the OpenAI API
 * reference; "abort" as a finish reason and continuous usage are vLLM's. */
#include "router/api/rt_openai.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai_internal.h"

/* Compact output (SSE needs one line per event: compact JSON has no raw
 * newline, strings escape theirs) and 9 significant digits, enough to
 * round-trip the float logprobs. */
#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

/* ---- UTF-8 --------------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 when ill-formed;
 * then *bad gets the length of the maximal subpart to replace by one U+FFFD
 * (Unicode §3.9 "U+FFFD substitution of maximal subparts", the rule of
 * Rust's String::from_utf8_lossy). Ranges from Unicode Table 3-7. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned char b = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t k = 1; k <= need; k++) {
        /* Only the second byte has the narrowed range. */
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (k >= n || s[k] < l || s[k] > h) {
            *bad = k;
            return 0;
        }
    }
    return need + 1;
}

json_t *rt_openai__string_lossy(const char *src, size_t len, int64_t *n_cp)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t i = 0, cp = 0, n_bad = 0, bad;
    while (i < len) {
        size_t k = utf8_seq(s + i, len - i, &bad);
        if (k == 0) {
            n_bad++;
            i += bad;
        } else {
            i += k;
        }
        cp++;
    }
    if (n_cp != NULL)
        *n_cp = (int64_t)cp;
    if (n_bad == 0)
        return json_stringn(len > 0 ? src : "", len);
    /* Each replaced subpart (>= 1 byte) becomes 3 bytes of U+FFFD. */
    char *buf = malloc(len + 2 * n_bad + 1);
    if (buf == NULL)
        return NULL;
    size_t o = 0;
    for (i = 0; i < len;) {
        size_t k = utf8_seq(s + i, len - i, &bad);
        if (k == 0) {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += bad;
        } else {
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
        }
    }
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j;
}

int rt_openai__dump(json_t *doc, const char *prefix, const char *suffix,
                    char **out, size_t *out_len)
{
    *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (doc == NULL)
        return TG_ENOMEM;
    size_t n = json_dumpb(doc, NULL, 0, DUMP_FLAGS);
    size_t pl = strlen(prefix), sl = strlen(suffix);
    char *buf = n > 0 ? malloc(pl + n + sl + 1) : NULL;
    if (buf == NULL || json_dumpb(doc, buf + pl, n, DUMP_FLAGS) != n) {
        free(buf);
        json_decref(doc);
        return TG_ENOMEM;
    }
    json_decref(doc);
    memcpy(buf, prefix, pl);
    memcpy(buf + pl + n, suffix, sl);
    buf[pl + n + sl] = '\0';
    *out = buf;
    if (out_len != NULL)
        *out_len = pl + n + sl;
    return 0;
}

/* ---- small builders ------------------------------------------------------ */

/* Sets obj[key] = v (stealing v); records failure in *bad. */
static void put(json_t *obj, const char *key, json_t *v, int *bad)
{
    if (json_object_set_new(obj, key, v) != 0)
        *bad = 1;
}

static void push(json_t *arr, json_t *v, int *bad)
{
    if (json_array_append_new(arr, v) != 0)
        *bad = 1;
}

/* JSON has no infinities: vLLM writes max(logprob, -9999.0); NaN goes the
 * same way. */
static json_t *logprob_value(float lp)
{
    double v = lp;
    if (isnan(v) || v < -9999.0)
        v = -9999.0;
    else if (v > 0.0)
        v = 0.0; /* +inf or rounding noise: no probability exceeds 1 */
    return json_real(v);
}

const char *rt_finish_name(enum rt_finish f)
{
    switch (f) {
    case RT_FINISH_STOP:
        return "stop";
    case RT_FINISH_LENGTH:
        return "length";
    case RT_FINISH_ABORT:
        return "abort";
    case RT_FINISH_ERROR:
        return "error";
    case RT_FINISH_TOOL_CALLS:
        return "tool_calls";
    case RT_FINISH_NONE:
        break;
    }
    return NULL;
}

static json_t *finish_value(enum rt_finish f)
{
    const char *s = rt_finish_name(f);
    return s != NULL ? json_string(s) : json_null();
}

static json_t *usage_json(const struct rt_usage *u)
{
    if (u == NULL)
        return json_null();
    json_t *o = json_object(), *d = json_object();
    int bad = 0;
    put(d, "cached_tokens", json_integer(u->cached_tokens), &bad);
    put(o, "prompt_tokens", json_integer(u->prompt_tokens), &bad);
    put(o, "completion_tokens", json_integer(u->completion_tokens), &bad);
    put(o, "total_tokens",
        json_integer(u->prompt_tokens + u->completion_tokens), &bad);
    put(o, "prompt_tokens_details", d, &bad);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The token text of `id` through the callback (NULL = ""). */
static const char *token_bytes(const struct rt_resp_ctx *c, int32_t id,
                               size_t *len)
{
    *len = 0;
    const char *s = c->token_text(c->token_user, id, len);
    if (s == NULL) {
        *len = 0;
        return "";
    }
    return s;
}

/* Completions shape: {"text_offset", "token_logprobs", "tokens",
 * "top_logprobs"}; text_offset counts code points of the output so far
 * (vLLM counts Python str length) and is advanced in c. */
static json_t *completion_logprobs(struct rt_resp_ctx *c,
                                   const struct rt_token_logprob *lp, size_t n)
{
    json_t *o = json_object(), *off = json_array(), *lps = json_array(),
           *toks = json_array(), *tops = json_array();
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        size_t len;
        const char *s = token_bytes(c, lp[i].id, &len);
        int64_t cp = 0;
        push(toks, rt_openai__string_lossy(s, len, &cp), &bad);
        push(off, json_integer(c->text_offset), &bad);
        c->text_offset += cp;
        push(lps, logprob_value(lp[i].logprob), &bad);
        if (lp[i].n_top == 0) {
            push(tops, json_null(), &bad);
            continue;
        }
        json_t *d = json_object();
        for (size_t k = 0; k < lp[i].n_top && !bad; k++) {
            const char *ts = token_bytes(c, lp[i].top[k].id, &len);
            json_t *key = rt_openai__string_lossy(ts, len, NULL);
            if (key == NULL) {
                bad = 1;
                break;
            }
            /* Keys may hold U+0000 only if the token text does; jansson
             * keys are C strings, so such a key is cut there. */
            put(d, json_string_value(key), logprob_value(lp[i].top[k].logprob),
                &bad);
            json_decref(key);
        }
        push(tops, d, &bad);
    }
    put(o, "text_offset", off, &bad);
    put(o, "token_logprobs", lps, &bad);
    put(o, "tokens", toks, &bad);
    put(o, "top_logprobs", tops, &bad);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* One chat logprob entry: {"token", "logprob", "bytes"} (+ top_logprobs). */
static json_t *chat_entry(const struct rt_resp_ctx *c, int32_t id, float lp,
                          int *bad)
{
    size_t len;
    const char *s = token_bytes(c, id, &len);
    json_t *o = json_object(), *bytes = json_array();
    put(o, "token", rt_openai__string_lossy(s, len, NULL), bad);
    put(o, "logprob", logprob_value(lp), bad);
    for (size_t i = 0; i < len && !*bad; i++)
        push(bytes, json_integer((unsigned char)s[i]), bad);
    put(o, "bytes", bytes, bad);
    return o;
}

/* Chat shape: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}. */
static json_t *chat_logprobs(const struct rt_resp_ctx *c,
                             const struct rt_token_logprob *lp, size_t n)
{
    json_t *o = json_object(), *content = json_array();
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        json_t *e = chat_entry(c, lp[i].id, lp[i].logprob, &bad);
        json_t *tops = json_array();
        for (size_t k = 0; k < lp[i].n_top && !bad; k++)
            push(tops,
                 chat_entry(c, lp[i].top[k].id, lp[i].top[k].logprob, &bad),
                 &bad);
        put(e, "top_logprobs", tops, &bad);
        push(content, e, &bad);
    }
    put(o, "content", content, &bad);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *logprobs_value(struct rt_resp_ctx *c,
                              const struct rt_token_logprob *lp, size_t n,
                              bool null_when_empty)
{
    if (!c->logprobs || (null_when_empty && n == 0))
        return json_null();
    return c->endpoint == RT_ENDPOINT_CHAT ? chat_logprobs(c, lp, n)
                                           : completion_logprobs(c, lp, n);
}

/* The envelope shared by every response: id, object, created, model. */
static json_t *envelope(const struct rt_resp_ctx *c, bool chunk, int *bad)
{
    const char *object;
    if (c->endpoint == RT_ENDPOINT_CHAT)
        object = chunk ? "chat.completion.chunk" : "chat.completion";
    else
        object = "text_completion"; /* chunks too, as OpenAI streams them */
    json_t *o = json_object();
    put(o, "id", json_string(c->id != NULL ? c->id : ""), bad);
    put(o, "object", json_string(object), bad);
    put(o, "created", json_integer(c->created), bad);
    put(o, "model", json_string(c->model != NULL ? c->model : ""), bad);
    return o;
}

/* ---- public formatters -----------------------------------------------------
 */

void rt_openai_make_id(char *buf, size_t cap, enum rt_endpoint ep, uint64_t r)
{
    snprintf(buf, cap, "%s-%016" PRIx64,
             ep == RT_ENDPOINT_CHAT ? "chatcmpl" : "cmpl", r);
}

/* The tool_calls array of a message or delta (index only in deltas). */
static json_t *tool_calls_json(const struct rt_tool_call *calls, size_t n,
                               size_t first_index, bool with_index, int *bad)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n && !*bad; i++) {
        json_t *o = json_object(), *f = json_object();
        if (with_index)
            put(o, "index", json_integer((json_int_t)(first_index + i)), bad);
        put(o, "id", json_string(calls[i].id), bad);
        put(o, "type", json_string("function"), bad);
        put(f, "name", json_string(calls[i].name), bad);
        put(f, "arguments", json_string(calls[i].arguments), bad);
        put(o, "function", f, bad);
        push(arr, o, bad);
    }
    if (arr == NULL)
        *bad = 1;
    return arr;
}

/* The whole response; content NULL writes null (chat with tool calls). */
static int format_response(struct rt_resp_ctx *c, const char *text,
                           size_t len, bool null_content,
                           const struct rt_tool_call *calls, size_t n_calls,
                           const struct rt_token_logprob *lp, size_t n_lp,
                           enum rt_finish fin, const struct rt_usage *u,
                           char **out, size_t *out_len)
{
    *out = NULL;
    if (c->logprobs && c->token_text == NULL)
        return TG_EINVAL;
    int bad = 0;
    json_t *doc = envelope(c, false, &bad);
    json_t *choice = json_object();
    put(choice, "index", json_integer(c->index), &bad);
    json_t *t = null_content ? json_null()
                             : rt_openai__string_lossy(text != NULL ? text : "",
                                                       text != NULL ? len : 0,
                                                       NULL);
    if (c->endpoint == RT_ENDPOINT_CHAT) {
        json_t *msg = json_object();
        put(msg, "role", json_string("assistant"), &bad);
        put(msg, "content", t, &bad);
        if (n_calls > 0)
            put(msg, "tool_calls",
                tool_calls_json(calls, n_calls, 0, false, &bad), &bad);
        put(choice, "message", msg, &bad);
    } else {
        put(choice, "text", t, &bad);
    }
    put(choice, "logprobs", logprobs_value(c, lp, n_lp, false), &bad);
    put(choice, "finish_reason", finish_value(fin), &bad);
    json_t *choices = json_array();
    push(choices, choice, &bad);
    put(doc, "choices", choices, &bad);
    put(doc, "usage", usage_json(u), &bad);
    if (bad) {
        json_decref(doc);
        return TG_ENOMEM;
    }
    return rt_openai__dump(doc, "", "", out, out_len);
}

int rt_openai_format_response(struct rt_resp_ctx *c, const char *text,
                              size_t len, const struct rt_token_logprob *lp,
                              size_t n_lp, enum rt_finish fin,
                              const struct rt_usage *u, char **out,
                              size_t *out_len)
{
    return format_response(c, text, len, false, NULL, 0, lp, n_lp, fin, u,
                           out, out_len);
}

int rt_openai_format_chat_response(struct rt_resp_ctx *c, const char *content,
                                   size_t len,
                                   const struct rt_tool_call *calls, size_t n,
                                   const struct rt_token_logprob *lp,
                                   size_t n_lp, enum rt_finish fin,
                                   const struct rt_usage *u, char **out,
                                   size_t *out_len)
{
    if (c->endpoint != RT_ENDPOINT_CHAT) {
        *out = NULL;
        return TG_EINVAL;
    }
    return format_response(c, content, len, content == NULL, calls, n, lp,
                           n_lp, fin, u, out, out_len);
}

/* Ends a streamed chunk: `choice` as its only choice, the usage its
 * options ask for (u with continuous_usage, else null when usage was
 * asked for at all; u may be NULL), then the SSE frame in *out. `bad`: a
 * put or push of the caller's failed. Frees doc either way. */
static int sse_chunk_end(const struct rt_resp_ctx *c, json_t *doc,
                         json_t *choice, const struct rt_usage *u, int bad,
                         char **out, size_t *out_len)
{
    json_t *choices = json_array();
    push(choices, choice, &bad);
    put(doc, "choices", choices, &bad);
    if (c->continuous_usage && u != NULL)
        put(doc, "usage", usage_json(u), &bad);
    else if (c->include_usage || c->continuous_usage)
        put(doc, "usage", json_null(), &bad);
    if (bad) {
        json_decref(doc);
        return TG_ENOMEM;
    }
    return rt_openai__dump(doc, "data: ", "\n\n", out, out_len);
}

int rt_openai_sse_tool_calls(struct rt_resp_ctx *c,
                             const struct rt_tool_call *calls, size_t n,
                             size_t first_index,
                             const struct rt_token_logprob *lp, size_t n_lp,
                             const struct rt_usage *u, char **out,
                             size_t *out_len)
{
    *out = NULL;
    if (c->endpoint != RT_ENDPOINT_CHAT ||
        (c->logprobs && c->token_text == NULL))
        return TG_EINVAL;
    int bad = 0;
    json_t *doc = envelope(c, true, &bad);
    json_t *choice = json_object(), *delta = json_object();
    put(choice, "index", json_integer(c->index), &bad);
    put(delta, "tool_calls", tool_calls_json(calls, n, first_index, true, &bad),
        &bad);
    put(choice, "delta", delta, &bad);
    put(choice, "logprobs", logprobs_value(c, lp, n_lp, true), &bad);
    put(choice, "finish_reason", json_null(), &bad);
    return sse_chunk_end(c, doc, choice, u, bad, out, out_len);
}

int rt_openai_sse_role(const struct rt_resp_ctx *c, char **out, size_t *out_len)
{
    *out = NULL;
    if (c->endpoint != RT_ENDPOINT_CHAT)
        return TG_EINVAL;
    int bad = 0;
    json_t *doc = envelope(c, true, &bad);
    json_t *choice = json_object(), *delta = json_object();
    put(delta, "role", json_string("assistant"), &bad);
    put(delta, "content", json_string(""), &bad);
    put(choice, "index", json_integer(c->index), &bad);
    put(choice, "delta", delta, &bad);
    put(choice, "logprobs", json_null(), &bad);
    put(choice, "finish_reason", json_null(), &bad);
    return sse_chunk_end(c, doc, choice, NULL, bad, out, out_len);
}

int rt_openai_sse_delta(struct rt_resp_ctx *c, const char *text, size_t len,
                        const struct rt_token_logprob *lp, size_t n_lp,
                        enum rt_finish fin, const struct rt_usage *u,
                        char **out, size_t *out_len)
{
    *out = NULL;
    if (c->logprobs && c->token_text == NULL)
        return TG_EINVAL;
    if (text == NULL)
        len = 0;
    int bad = 0;
    json_t *doc = envelope(c, true, &bad);
    json_t *choice = json_object();
    put(choice, "index", json_integer(c->index), &bad);
    json_t *t = rt_openai__string_lossy(len > 0 ? text : "", len, NULL);
    if (c->endpoint == RT_ENDPOINT_CHAT) {
        json_t *delta = json_object();
        if (len > 0 || fin == RT_FINISH_NONE)
            put(delta, "content", t, &bad);
        else
            json_decref(t); /* the closing chunk's delta is {} */
        put(choice, "delta", delta, &bad);
    } else {
        put(choice, "text", t, &bad);
    }
    put(choice, "logprobs", logprobs_value(c, lp, n_lp, true), &bad);
    put(choice, "finish_reason", finish_value(fin), &bad);
    return sse_chunk_end(c, doc, choice, u, bad, out, out_len);
}

int rt_openai_sse_usage(const struct rt_resp_ctx *c, const struct rt_usage *u,
                        char **out, size_t *out_len)
{
    *out = NULL;
    int bad = 0;
    json_t *doc = envelope(c, true, &bad);
    put(doc, "choices", json_array(), &bad);
    put(doc, "usage", usage_json(u), &bad);
    if (bad) {
        json_decref(doc);
        return TG_ENOMEM;
    }
    return rt_openai__dump(doc, "data: ", "\n\n", out, out_len);
}

int rt_openai_merge_choices(const char *const *bodies, size_t n,
                            const struct rt_usage *u, char **out,
                            size_t *out_len)
{
    *out = NULL;
    if (n == 0)
        return TG_EFORMAT;
    json_t *doc = NULL, *all = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_error_t je;
        json_t *d = json_loads(bodies[i], 0, &je);
        json_t *ch = d != NULL ? json_object_get(d, "choices") : NULL;
        if (!json_is_array(ch)) {
            rc = d == NULL && strstr(je.text, "memory") ? TG_ENOMEM
                                                         : TG_EFORMAT;
        } else if (i == 0) {
            doc = json_incref(d);
            all = ch;
        } else if (json_array_extend(all, ch) != 0) {
            rc = TG_ENOMEM;
        }
        json_decref(d);
    }
    int bad = rc != 0;
    if (rc == 0)
        put(doc, "usage", usage_json(u), &bad);
    if (bad) {
        json_decref(doc);
        return rc != 0 ? rc : TG_ENOMEM;
    }
    return rt_openai__dump(doc, "", "", out, out_len);
}

int rt_openai_http_status(enum rt_req_err kind)
{
    switch (kind) {
    case RT_REQ_ERR_INVALID: return 400;
    case RT_REQ_ERR_NOT_FOUND: return 404;
    case RT_REQ_ERR_TOO_LARGE: return 413;
    case RT_REQ_ERR_UNAUTHENTICATED: return 401;
    case RT_REQ_ERR_BUSY: return 429;
    case RT_REQ_ERR_UNAVAILABLE: return 503;
    default: return 500;
    }
}

const char *rt_openai_error_type(enum rt_req_err kind)
{
    switch (kind) {
    case RT_REQ_ERR_INVALID:
    case RT_REQ_ERR_NOT_FOUND:
    case RT_REQ_ERR_TOO_LARGE: return "invalid_request_error";
    case RT_REQ_ERR_UNAUTHENTICATED: return "authentication_error";
    case RT_REQ_ERR_BUSY: return "rate_limit_error";
    default: return "server_error";
    }
}

static json_t *error_doc(const struct rt_request_error *e)
{
    int bad = 0;
    json_t *doc = json_object(), *o = json_object();
    put(o, "message",
        rt_openai__string_lossy(e->message, strlen(e->message), NULL), &bad);
    put(o, "type", json_string(rt_openai_error_type(e->kind)), &bad);
    put(o, "param",
        e->param[0] != '\0'
            ? rt_openai__string_lossy(e->param, strlen(e->param), NULL)
            : json_null(),
        &bad);
    put(o, "code", e->code != NULL ? json_string(e->code) : json_null(), &bad);
    put(doc, "error", o, &bad);
    if (bad) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

int rt_openai_format_error(const struct rt_request_error *e, char **out,
                           size_t *out_len)
{
    return rt_openai__dump(error_doc(e), "", "", out, out_len);
}

int rt_openai_sse_error(const struct rt_request_error *e, char **out,
                        size_t *out_len)
{
    return rt_openai__dump(error_doc(e), "data: ", "\n\n", out, out_len);
}

/* The model object of /v1/models and /v1/models/{id}. */
static json_t *model_doc(const char *model, int64_t created,
                         int32_t max_model_len, int *bad)
{
    json_t *m = json_object();
    put(m, "id", json_string(model), bad);
    put(m, "object", json_string("model"), bad);
    put(m, "created", json_integer(created), bad);
    put(m, "owned_by", json_string("tangram"), bad);
    put(m, "root", json_string(model), bad);
    put(m, "parent", json_null(), bad);
    put(m, "max_model_len", json_integer(max_model_len), bad);
    return m;
}

int rt_openai_format_model(const char *model, int64_t created,
                           int32_t max_model_len, char **out, size_t *out_len)
{
    int bad = 0;
    json_t *m = model_doc(model, created, max_model_len, &bad);
    if (bad || m == NULL) {
        json_decref(m);
        *out = NULL;
        return TG_ENOMEM;
    }
    return rt_openai__dump(m, "", "", out, out_len);
}

int rt_openai_format_models(const char *model, int64_t created,
                            int32_t max_model_len, char **out, size_t *out_len)
{
    int bad = 0;
    json_t *doc = json_object(), *data = json_array();
    push(data, model_doc(model, created, max_model_len, &bad), &bad);
    put(doc, "object", json_string("list"), &bad);
    put(doc, "data", data, &bad);
    if (bad) {
        json_decref(doc);
        *out = NULL;
        return TG_ENOMEM;
    }
    return rt_openai__dump(doc, "", "", out, out_len);
}
