/* rt_toolcall.c — the tool-call output parser (rt_toolcall.h). The formats
 * follow what the templates teach the models (Qwen's and Hermes'
 * <tool_call> blocks, Llama-3.x's JSON answer) and what vLLM's hermes and
 * llama3_json parsers accept. */
#include "router/api/rt_toolcall.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_template.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

#define OPEN_TAG "<tool_call>"
#define CLOSE_TAG "</tool_call>"
#define PY_TAG "<|python_tag|>"

enum {
    ST_TEXT = 0, /* hermes: outside a block; llama: plain text */
    ST_CALL,     /* hermes: inside <tool_call> */
    ST_DECIDE,   /* llama: before the first non-space character */
    ST_JSON,     /* llama: a JSON answer, held to the end */
    ST_DONE,
};

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int put(char **p, size_t *n, size_t *cap, const char *s, size_t k)
{
    if (k == 0)
        return 0;
    if (TG_GROW(*p, cap, *n + k + 1))
        return TG_ENOMEM;
    memcpy(*p + *n, s, k);
    *n += k;
    (*p)[*n] = '\0';
    return 0;
}

static int release(struct rt_tc_parser *p, const char *s, size_t k)
{
    return put(&p->out, &p->out_n, &p->out_cap, s, k);
}

/* Drops the first k bytes of the held buffer. */
static void consume(struct rt_tc_parser *p, size_t k)
{
    if (k == 0)
        return;
    memmove(p->buf, p->buf + k, p->n - k);
    p->n -= k;
}

void rt_tc_init(struct rt_tc_parser *p, enum ct_tool_format fmt,
                uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    p->fmt = fmt;
    p->seed = seed;
    p->state = fmt == CT_TOOLS_LLAMA_JSON ? ST_DECIDE : ST_TEXT;
}

void rt_tc_free(struct rt_tc_parser *p)
{
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->buf);
    free(p->pre_ws);
    free(p->out);
    memset(p, 0, sizeof(*p));
}

int rt_tc_take(struct rt_tc_parser *p, const char *text, size_t len, bool last,
               struct tg_buf *content, size_t *first)
{
    struct rt_tc_delta d;
    int rc = rt_tc_feed(p, text, len, &d);
    if (rc != 0)
        return rc;
    *first = d.first_index;
    if (tg_buf_append(content, d.content != NULL ? d.content : "",
                      d.content_len) != 0)
        return TG_ENOMEM;
    if (!last)
        return 0;
    if ((rc = rt_tc_finish(p, &d)) != 0)
        return rc;
    return tg_buf_append(content, d.content != NULL ? d.content : "",
                         d.content_len);
}

const struct rt_tool_call *rt_tc_calls(const struct rt_tc_parser *p,
                                       size_t *n)
{
    *n = p->n_calls;
    return p->calls;
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A JSON object as a call: {"name": str, "arguments"|"parameters": obj}.
 * Returns 1 and appends the call, 0 when it is not one, or TG_ENOMEM. */
static int add_call(struct rt_tc_parser *p, json_t *o)
{
    if (!json_is_object(o))
        return 0;
    json_t *name = json_object_get(o, "name");
    json_t *args = json_object_get(o, "arguments");
    if (args == NULL)
        args = json_object_get(o, "parameters");
    if (!json_is_string(name) || json_string_length(name) == 0 ||
        strlen(json_string_value(name)) != json_string_length(name) ||
        !json_is_object(args))
        return 0;
    if (TG_GROW(p->calls, &p->cap_calls, p->n_calls + 1))
        return TG_ENOMEM;
    struct rt_tool_call *c = &p->calls[p->n_calls];
    memset(c, 0, sizeof(*c));
    char id[32];
    snprintf(id, sizeof id, "call_%016llx",
             (unsigned long long)mix(p->seed ^ mix(p->n_calls + 1)));
    size_t alen;
    c->id = strdup(id);
    c->name = strdup(json_string_value(name));
    if (c->id == NULL || c->name == NULL ||
        jj_json_dumps_py(args, false, &c->arguments, &alen) != 0) {
        free(c->id);
        free(c->name);
        free(c->arguments);
        return TG_ENOMEM;
    }
    p->n_calls++;
    return 1;
}

/* A <tool_call> body: trimmed JSON of one call. 1 call, 0 not, or error. */
static int body_call(struct rt_tc_parser *p, const char *s, size_t n)
{
    size_t a = 0, b = n;
    while (a < b && is_ws(s[a]))
        a++;
    while (b > a && is_ws(s[b - 1]))
        b--;
    if (a == b)
        return 0;
    json_error_t je;
    json_t *o = json_loadb(s + a, b - a, 0, &je);
    if (o == NULL)
        return 0;
    int rc = add_call(p, o);
    json_decref(o);
    return rc;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = (n < t - 1 ? n : t - 1); k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0)
            return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    return n >= t ? memmem(s, n, tag, t) : NULL;
}

/* Ends a block whose body is buf[0..body): a call, or its raw text. */
static int close_block(struct rt_tc_parser *p, size_t body, bool closed)
{
    int rc = body_call(p, p->buf, body);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        p->after_call = true;
    } else {
        /* not a call: it stays the text it was */
        if (release(p, p->pre_ws, p->pre_n) ||
            release(p, OPEN_TAG, strlen(OPEN_TAG)) ||
            release(p, p->buf, body) ||
            (closed && release(p, CLOSE_TAG, strlen(CLOSE_TAG))))
            return TG_ENOMEM;
        p->after_call = false;
    }
    p->pre_n = 0;
    return 0;
}

static int hermes(struct rt_tc_parser *p, bool final)
{
    for (;;) {
        if (p->state == ST_CALL) {
            const char *e = find(p->buf, p->n, CLOSE_TAG);
            if (e == NULL) {
                if (!final)
                    return 0;
                int rc = close_block(p, p->n, false);
                p->n = 0;
                p->state = ST_TEXT;
                return rc;
            }
            size_t body = (size_t)(e - p->buf);
            int rc = close_block(p, body, true);
            if (rc)
                return rc;
            consume(p, body + strlen(CLOSE_TAG));
            p->state = ST_TEXT;
            continue;
        }
        /* ST_TEXT */
        if (p->after_call) {
            /* whitespace right after a call is dropped */
            size_t k = 0;
            while (k < p->n && is_ws(p->buf[k]))
                k++;
            consume(p, k);
            if (p->n == 0)
                return 0;
            p->after_call = false;
        }
        const char *t = find(p->buf, p->n, OPEN_TAG);
        if (t != NULL) {
            size_t k = (size_t)(t - p->buf), w = k;
            while (w > 0 && is_ws(p->buf[w - 1]))
                w--;
            p->pre_n = 0;
            if (release(p, p->buf, w) ||
                put(&p->pre_ws, &p->pre_n, &p->pre_cap, p->buf + w, k - w))
                return TG_ENOMEM;
            consume(p, k + strlen(OPEN_TAG));
            p->state = ST_CALL;
            p->after_call = false;
            continue;
        }
        if (final) {
            size_t end = p->n;
            if (p->n_calls > 0)
                while (end > 0 && is_ws(p->buf[end - 1]))
                    end--;
            if (release(p, p->buf, end))
                return TG_ENOMEM;
            p->n = 0;
            return 0;
        }
        size_t hold = p->n - partial_tag(p->buf, p->n, OPEN_TAG);
        while (hold > 0 && is_ws(p->buf[hold - 1]))
            hold--;
        if (release(p, p->buf, hold))
            return TG_ENOMEM;
        consume(p, hold);
        return 0;
    }
}

/* Parses buf[from..n) as JSON call objects separated by whitespace and
 * ';'. Returns 1 (all calls), 0 (not), or TG_ENOMEM. */
static int llama_calls(struct rt_tc_parser *p, size_t from)
{
    size_t i = from, start_calls = p->n_calls;
    int found = 0;
    while (i < p->n) {
        json_error_t je;
        json_t *o = json_loadb(p->buf + i, p->n - i, JSON_DISABLE_EOF_CHECK,
                               &je);
        if (o == NULL)
            goto undo;
        int rc = add_call(p, o);
        json_decref(o);
        if (rc < 0)
            return rc;
        if (rc == 0)
            goto undo;
        found++;
        i += (size_t)je.position;
        while (i < p->n && (is_ws(p->buf[i]) || p->buf[i] == ';'))
            i++;
    }
    return found > 0;
undo:
    while (p->n_calls > start_calls) {
        struct rt_tool_call *c = &p->calls[--p->n_calls];
        free(c->id);
        free(c->name);
        free(c->arguments);
    }
    return 0;
}

static int llama(struct rt_tc_parser *p, bool final)
{
    if (p->state == ST_TEXT) {
        int rc = release(p, p->buf, p->n);
        p->n = 0;
        return rc;
    }
    if (p->state == ST_DECIDE) {
        size_t i = 0;
        while (i < p->n && is_ws(p->buf[i]))
            i++;
        size_t tl = strlen(PY_TAG);
        if (i < p->n && p->n - i < tl &&
            memcmp(p->buf + i, PY_TAG, p->n - i) == 0 && !final)
            return 0; /* may be <|python_tag|> */
        if (p->n - i >= tl && memcmp(p->buf + i, PY_TAG, tl) == 0) {
            i += tl;
            while (i < p->n && is_ws(p->buf[i]))
                i++;
        }
        if (i >= p->n) {
            if (!final)
                return 0;
            int rc = release(p, p->buf, p->n);
            p->n = 0;
            return rc;
        }
        if (p->buf[i] != '{') {
            p->state = ST_TEXT;
            return llama(p, final);
        }
        p->state = ST_JSON;
    }
    if (!final)
        return 0;
    /* ST_JSON at the end */
    size_t i = 0;
    while (i < p->n && p->buf[i] != '{')
        i++;
    int rc = llama_calls(p, i);
    if (rc < 0)
        return rc;
    if (rc == 0 && release(p, p->buf, p->n))
        return TG_ENOMEM;
    p->n = 0;
    return 0;
}

static void delta_of(struct rt_tc_parser *p, struct rt_tc_delta *d)
{
    d->content = p->out != NULL ? p->out : "";
    d->content_len = p->out_n;
    d->calls = p->calls + p->reported;
    d->n_calls = p->n_calls - p->reported;
    d->first_index = p->reported;
    p->reported = p->n_calls;
}

static int step(struct rt_tc_parser *p, const char *text, size_t len,
                bool final, struct rt_tc_delta *d)
{
    p->out_n = 0;
    if (p->out != NULL)
        p->out[0] = '\0';
    int rc = 0;
    if (p->state == ST_DONE) {
        rc = TG_EINVAL;
    } else if (p->fmt == CT_TOOLS_NONE) {
        rc = release(p, text, len);
    } else if (put(&p->buf, &p->n, &p->cap, text, len)) {
        rc = TG_ENOMEM;
    } else {
        rc = p->fmt == CT_TOOLS_HERMES ? hermes(p, final) : llama(p, final);
    }
    if (final && rc == 0)
        p->state = ST_DONE;
    delta_of(p, d);
    return rc;
}

int rt_tc_feed(struct rt_tc_parser *p, const char *text, size_t len,
               struct rt_tc_delta *d)
{
    return step(p, text, len, false, d);
}

int rt_tc_finish(struct rt_tc_parser *p, struct rt_tc_delta *d)
{
    return step(p, "", 0, true, d);
}
