/* rt_api_grpc_chat.c — a gRPC chat (tangram.v1 ChatMessage and Tool) as
 * the conversation value (common/chat/ct_chat.h), checked by the same
 * rt_chat_check as the HTTP API's, the tool_choice it asks, and what such
 * a request costs the request memory budget. See rt_api_grpc_internal.h. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/json/tg_json.h"
#include "router/api/rt_api_grpc_internal.h"
#include "router/api/rt_openai_chat.h"
#include "router/core/rt_reqmem.h"

static int oom(struct rt_request_error *e)
{
    rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                         "out of memory");
    return TG_ENOMEM;
}

/* A copy of v, or NULL for NULL or "" (absent in proto3); *bad set when
 * out of memory. */
static char *opt_str(const char *v, int *bad)
{
    if (v == NULL || v[0] == '\0')
        return NULL;
    char *s = strdup(v);
    *bad |= s == NULL;
    return s;
}

static int read_message(const Tangram__V1__ChatMessage *m, size_t i,
                        struct ct_message *out, struct rt_request_error *e)
{
    if (ct_role_from_name(m->role != NULL ? m->role : "", &out->role) != 0) {
        char p[64];
        snprintf(p, sizeof(p), "messages[%zu].role", i);
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", p,
                             "'%s' must be one of system, developer, user, "
                             "assistant, tool; got '%.64s'",
                             p, m->role != NULL ? m->role : "");
        return TG_EFORMAT;
    }
    int bad = 0;
    const char *content = m->content != NULL ? m->content : "";
    /* an assistant's calls with no text: no content (null, as OpenAI's) */
    out->content_null = m->n_tool_calls > 0 && content[0] == '\0';
    out->content = strdup(content);
    bad |= out->content == NULL;
    out->name = opt_str(m->name, &bad);
    if (out->role == CT_ROLE_ASSISTANT)
        out->reasoning_content = opt_str(m->reasoning_content, &bad);
    if (out->role == CT_ROLE_TOOL)
        out->tool_call_id = opt_str(m->tool_call_id, &bad);
    if (m->n_tool_calls > 0 &&
        (out->calls = calloc(m->n_tool_calls, sizeof(*out->calls))) == NULL)
        return oom(e);
    for (size_t k = 0; k < m->n_tool_calls; k++) {
        const Tangram__V1__ToolCall *c = m->tool_calls[k];
        struct ct_tool_call *t = &out->calls[k];
        out->n_calls = k + 1;
        t->id = strdup(c->id != NULL ? c->id : "");
        t->name = strdup(c->name != NULL ? c->name : "");
        t->arguments = strdup(c->arguments != NULL ? c->arguments : "");
        bad |= t->id == NULL || t->name == NULL || t->arguments == NULL;
    }
    return bad ? oom(e) : 0;
}

/* One Tool's fields into *t: name, description, and parameters_json as
 * compact JSON text (parsed here: 400 naming it when it is not a JSON
 * object). The
 * spec is built once the tools are checked (tool_spec). */
static int read_tool(const Tangram__V1__Tool *x, size_t k, struct ct_tool *t,
                     struct rt_request_error *e)
{
    int bad = 0;
    t->name = strdup(x->name != NULL ? x->name : "");
    t->description = opt_str(x->description, &bad);
    bad |= t->name == NULL;
    const char *pj = x->parameters_json;
    if (!bad && pj != NULL && pj[0] != '\0') {
        json_error_t je;
        json_t *params = tg_json_loadb_wide(pj, strlen(pj), 0, &je);
        if (params == NULL) {
            char p[64];
            snprintf(p, sizeof(p), "tools[%zu].parameters_json", k);
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", p,
                                 "'%s' is not JSON: %s", p, je.text);
            return TG_EFORMAT;
        }
        if (!json_is_object(params)) {
            json_decref(params);
            char p[64];
            snprintf(p, sizeof(p), "tools[%zu].parameters_json", k);
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", p,
                                 "'%s' must be a JSON Schema object", p);
            return TG_EFORMAT;
        }
        bad |= (t->parameters = json_dumps(params, JSON_COMPACT)) == NULL;
        json_decref(params);
    }
    return bad ? oom(e) : 0;
}

/* t's spec as the OpenAI API writes a tool: {"type": "function",
 * "function": {"name", "description"?, "parameters"?}}. t is checked
 * (rt_chat_check_tools: UTF-8, parameters a JSON object). */
static int tool_spec(struct ct_tool *t, struct rt_request_error *e)
{
    json_error_t je;
    json_t *params = t->parameters != NULL ? json_loads(t->parameters, 0, &je)
                                           : NULL;
    json_t *fn = json_object(), *spec = json_object();
    int bad = (t->parameters != NULL && params == NULL) || fn == NULL ||
              spec == NULL ||
              json_object_set_new(spec, "type", json_string("function")) ||
              json_object_set_new(fn, "name", json_string(t->name)) ||
              (t->description != NULL &&
               json_object_set_new(fn, "description",
                                   json_string(t->description))) ||
              (params != NULL && json_object_set(fn, "parameters", params)) ||
              json_object_set(spec, "function", fn) ||
              (t->spec = json_dumps(spec, JSON_COMPACT)) == NULL;
    json_decref(params);
    json_decref(fn);
    json_decref(spec);
    return bad ? oom(e) : 0;
}

int rt_api_grpc__chat(Tangram__V1__ChatMessage *const *msgs, size_t n,
                      Tangram__V1__Tool *const *tools, size_t n_tools,
                      struct ct_chat *out, struct rt_request_error *e)
{
    int rc = 0;
    if (n > 0 && (out->messages = calloc(n, sizeof(*out->messages))) == NULL)
        return oom(e);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        out->n_messages = i + 1;
        rc = read_message(msgs[i], i, &out->messages[i], e);
    }
    if (rc == 0 && n_tools > 0 && (out->tools = ct_tools_new(n_tools)) == NULL)
        rc = oom(e);
    for (size_t k = 0; rc == 0 && k < n_tools; k++)
        rc = read_tool(tools[k], k, &out->tools->v[k], e);
    if (rc == 0)
        rc = rt_chat_check(out, e);
    if (rc == 0)
        rc = rt_chat_check_tools(out->tools, e);
    for (size_t k = 0; rc == 0 && k < n_tools; k++)
        rc = tool_spec(&out->tools->v[k], e);
    return rc;
}

int rt_api_grpc__tool_sel(const char *choice, const bool *parallel,
                          const struct ct_tools *tools, struct rt_tool_sel *sel,
                          struct rt_request_error *e)
{
    *sel = (struct rt_tool_sel){.choice = RT_TOOL_CHOICE_AUTO,
                                .parallel = parallel != NULL ? *parallel
                                                             : true};
    if (choice == NULL || choice[0] == '\0' || strcmp(choice, "auto") == 0)
        return 0;
    if (strcmp(choice, "none") == 0) {
        sel->choice = RT_TOOL_CHOICE_NONE;
    } else if (strcmp(choice, "required") == 0) {
        sel->choice = RT_TOOL_CHOICE_REQUIRED;
    } else if (ct_tools_find(tools, choice) >= 0) {
        /* any other string names the one function to call */
        sel->choice = RT_TOOL_CHOICE_FUNCTION;
        sel->name = choice;
    } else {
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value",
                             "tool_choice",
                             "'tool_choice' names the function '%.64s', "
                             "which is not among 'tools'",
                             choice);
        return TG_EFORMAT;
    }
    return 0;
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
