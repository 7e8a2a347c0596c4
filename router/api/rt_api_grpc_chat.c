/* rt_api_grpc_chat.c — a gRPC chat (tangram.v1 ChatMessage and Tool) as
 * the OpenAI JSON the HTTP API validates, so both front ends share one
 * validation and normalization of messages, tools and tool_choice
 * (rt_openai_chat.c), and what such a request costs the request memory
 * budget. See rt_api_grpc_internal.h. */
#include <jansson.h>
#include <stdbool.h>
#include <string.h>

#include "common/json/tg_json.h"
#include "common/tok/tok_tokenizer.h"
#include "router/api/rt_api_grpc_internal.h"
#include "router/core/rt_reqmem.h"

/* Building rt_api_grpc__chat_json's document: the first failure wins and is kept in
 * *e (400 for a string that is not UTF-8, which protobuf-c does not check,
 * 500 out of memory); every later step is skipped. */
struct chat_build {
    struct rt_request_error *e;
    int failed;
};

static void build_fail_oom(struct chat_build *b)
{
    if (!b->failed)
        rt_request_error_set(b->e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
    b->failed = 1;
}

/* A new JSON string of v (NULL = ""), or NULL with the failure recorded;
 * `what` and `i` name the field in the message. */
static json_t *build_str(struct chat_build *b, const char *v,
                         const char *what, size_t i)
{
    if (b->failed)
        return NULL;
    if (v == NULL)
        v = "";
    size_t n = strlen(v), bad = 0;
    if (!tok_utf8_valid(v, n, &bad)) {
        rt_request_error_set(
            b->e, RT_REQ_ERR_INVALID, "invalid_value", "messages",
            "%s[%zu] is not valid UTF-8 (byte %zu)", what, i, bad);
        b->failed = 1;
        return NULL;
    }
    json_t *j = json_stringn(v, n);
    if (j == NULL)
        build_fail_oom(b);
    return j;
}

/* obj[key] = v, stealing v (NULL: a failure already recorded). */
static void build_set(struct chat_build *b, json_t *obj, const char *key,
                      json_t *v)
{
    if (v == NULL || b->failed) {
        json_decref(v);
        return;
    }
    if (json_object_set_new(obj, key, v) != 0)
        build_fail_oom(b);
}

/* Appends v to arr, stealing v. */
static void build_append(struct chat_build *b, json_t *arr, json_t *v)
{
    if (v == NULL || b->failed) {
        json_decref(v);
        return;
    }
    if (json_array_append_new(arr, v) != 0)
        build_fail_oom(b);
}

static json_t *build_new(struct chat_build *b, json_t *v)
{
    if (v == NULL)
        build_fail_oom(b);
    return v;
}

json_t *rt_api_grpc__chat_json(Tangram__V1__ChatMessage *const *msgs, size_t n,
                               Tangram__V1__Tool *const *tools, size_t n_tools,
                               const char *tool_choice,
                               struct rt_request_error *e)
{
    struct chat_build b = {.e = e};
    json_t *root = build_new(&b, json_object());
    json_t *arr = root ? build_new(&b, json_array()) : NULL;
    if (root != NULL)
        build_set(&b, root, "messages", arr);
    for (size_t i = 0; !b.failed && i < n; i++) {
        const Tangram__V1__ChatMessage *m = msgs[i];
        json_t *o = build_new(&b, json_object());
        build_append(&b, arr, o);
        if (b.failed)
            break;
        build_set(&b, o, "role", build_str(&b, m->role, "messages.role", i));
        bool null_content = m->n_tool_calls > 0 &&
                            (m->content == NULL || m->content[0] == '\0');
        build_set(&b, o, "content",
                  null_content ? build_new(&b, json_null())
                               : build_str(&b, m->content, "messages.content", i));
        if (m->name != NULL && m->name[0] != '\0')
            build_set(&b, o, "name", build_str(&b, m->name, "messages.name", i));
        if (m->reasoning_content != NULL && m->reasoning_content[0] != '\0')
            build_set(&b, o, "reasoning_content",
                      build_str(&b, m->reasoning_content,
                                "messages.reasoning_content", i));
        if (m->tool_call_id != NULL && m->tool_call_id[0] != '\0')
            build_set(&b, o, "tool_call_id",
                      build_str(&b, m->tool_call_id, "messages.tool_call_id", i));
        if (m->n_tool_calls == 0)
            continue;
        json_t *calls = build_new(&b, json_array());
        build_set(&b, o, "tool_calls", calls);
        for (size_t k = 0; !b.failed && k < m->n_tool_calls; k++) {
            const Tangram__V1__ToolCall *c = m->tool_calls[k];
            json_t *f = build_new(&b, json_object());
            json_t *jc = build_new(&b, json_object());
            build_append(&b, calls, jc);
            if (b.failed) {
                json_decref(f);
                break;
            }
            build_set(&b, f, "name",
                      build_str(&b, c->name, "messages.tool_calls.name", i));
            build_set(&b, f, "arguments",
                      build_str(&b, c->arguments,
                                "messages.tool_calls.arguments", i));
            build_set(&b, jc, "id",
                      build_str(&b, c->id, "messages.tool_calls.id", i));
            build_set(&b, jc, "type", build_new(&b, json_string("function")));
            build_set(&b, jc, "function", f);
        }
    }
    if (!b.failed && n_tools > 0) {
        json_t *ta = build_new(&b, json_array());
        build_set(&b, root, "tools", ta);
        for (size_t k = 0; !b.failed && k < n_tools; k++) {
            const Tangram__V1__Tool *t = tools[k];
            json_t *f = build_new(&b, json_object());
            json_t *jt = build_new(&b, json_object());
            build_append(&b, ta, jt);
            if (b.failed) {
                json_decref(f);
                break;
            }
            build_set(&b, jt, "type", build_new(&b, json_string("function")));
            build_set(&b, f, "name", build_str(&b, t->name, "tools.name", k));
            if (t->description != NULL && t->description[0] != '\0')
                build_set(&b, f, "description",
                          build_str(&b, t->description, "tools.description", k));
            if (!b.failed && t->parameters_json != NULL &&
                t->parameters_json[0] != '\0') {
                json_error_t je;
                json_t *p = tg_json_loadb_wide(
                    t->parameters_json, strlen(t->parameters_json), 0, &je);
                if (p == NULL) {
                    rt_request_error_set(
                        e, RT_REQ_ERR_INVALID, "invalid_value", "tools",
                        "tools[%zu].parameters_json is not JSON: %s", k,
                        je.text);
                    b.failed = 1;
                }
                build_set(&b, f, "parameters", p);
            }
            build_set(&b, jt, "function", f);
        }
    }
    if (tool_choice != NULL && tool_choice[0] != '\0' &&
        (strcmp(tool_choice, "auto") == 0 || strcmp(tool_choice, "none") == 0 ||
         strcmp(tool_choice, "required") == 0)) {
        build_set(&b, root, "tool_choice",
                  build_str(&b, tool_choice, "tool_choice", 0));
    } else if (tool_choice != NULL && tool_choice[0] != '\0') {
        /* Any other string names the one function to call, OpenAI's
         * {"type": "function", "function": {"name"}}. */
        json_t *c = build_new(&b, json_object());
        json_t *f = build_new(&b, json_object());
        build_set(&b, f, "name", build_str(&b, tool_choice, "tool_choice", 0));
        build_set(&b, c, "type", build_str(&b, "function", "tool_choice", 0));
        build_set(&b, c, "function", f);
        build_set(&b, root, "tool_choice", c);
    }
    if (b.failed) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* ---- the request memory estimate ---------------------------------------- */

static void cost_str(struct rt_reqmem_json *j, const char *s)
{
    if (s != NULL && s[0] != '\0') {
        rt_reqmem_json_string(j, s, strlen(s));
        j->members++;
    }
}

/* A string that is JSON text: the string, and what parsing it makes. */
static void cost_json_text(struct rt_reqmem_json *j, const char *s)
{
    if (s == NULL || s[0] == '\0')
        return;
    struct rt_reqmem_json k;
    rt_reqmem_json_scan(s, strlen(s), &k);
    rt_reqmem_json_add(j, &k);
    cost_str(j, s);
}

size_t rt_api_grpc__mem_estimate(size_t msg_len, const char *prompt,
                                 size_t n_ids,
                                 Tangram__V1__ChatMessage *const *msgs,
                                 size_t n, Tangram__V1__Tool *const *tools,
                                 size_t n_tools)
{
    struct rt_reqmem_json j;
    memset(&j, 0, sizeof(j));
    j.objects = 1;
    j.values = 1 + n_ids;
    j.arrays = 2;
    cost_str(&j, prompt);
    for (size_t i = 0; i < n; i++) {
        const Tangram__V1__ChatMessage *m = msgs[i];
        j.objects++;
        j.values++;
        cost_str(&j, m->role);
        cost_str(&j, m->content);
        cost_str(&j, m->name);
        cost_str(&j, m->reasoning_content);
        cost_str(&j, m->tool_call_id);
        j.arrays += m->n_tool_calls > 0;
        for (size_t k = 0; k < m->n_tool_calls; k++) {
            const Tangram__V1__ToolCall *c = m->tool_calls[k];
            j.objects += 2;
            j.values += 2;
            j.members += 3;
            cost_str(&j, c->id);
            cost_str(&j, c->name);
            cost_json_text(&j, c->arguments);
        }
    }
    for (size_t i = 0; i < n_tools; i++) {
        const Tangram__V1__Tool *t = tools[i];
        j.objects += 2;
        j.values += 2;
        j.members += 2;
        cost_str(&j, t->name);
        cost_str(&j, t->description);
        cost_json_text(&j, t->parameters_json);
    }
    /* The unpacked message: its strings and one struct for each part. */
    size_t protobuf = msg_len + 64 * (1 + n + n_tools);
    size_t e = rt_reqmem_json_estimate(&j);
    return e > SIZE_MAX - protobuf ? SIZE_MAX : e + protobuf;
}
