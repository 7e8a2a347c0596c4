/* rt_openai_chat.c — the chat parts of OpenAI requests (rt_openai.h):
 * messages (as C structs and as the JSON the chat template renders), tools,
 * tool_choice and the chat-template options. Shapes follow the OpenAI API
 * reference and vLLM's protocol.py; each rule says where it deviates. */
#include "router/api/rt_openai.h"
#include "router/api/rt_openai_chat.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai_internal.h"

void rt_openai_chat_messages_free(struct rt_message *m, size_t n)
{
    for (size_t i = 0; m != NULL && i < n; i++) {
        free(m[i].content);
        free(m[i].name);
        free(m[i].reasoning_content);
        free(m[i].tool_call_id);
    }
    free(m);
}

/* Content: a string, or an array of {"type": "text", "text": ...} parts
 * joined with "\n" (vLLM's rule for text parts). */
static int parse_content(const json_t *v, const char *param, char **out,
                         struct rt_request_error *e)
{
    if (json_is_string(v)) {
        *out = strndup(json_string_value(v), json_string_length(v));
        return *out != NULL ? 0 : rt_openai__oom(e);
    }
    if (!json_is_array(v))
        return rt_openai__bad_type(e, param,
                                   "a string or an array of content parts");
    size_t n = json_array_size(v), total = 1;
    char p[128];
    for (size_t j = 0; j < n; j++) {
        json_t *part = json_array_get(v, j);
        if (!json_is_object(part)) {
            snprintf(p, sizeof(p), "%.96s[%zu]", param, j);
            return rt_openai__bad_type(e, p, "an object");
        }
        json_t *t = json_object_get(part, "type");
        snprintf(p, sizeof(p), "%.96s[%zu].type", param, j);
        if (!json_is_string(t))
            return rt_openai__bad_type(e, p, "a string");
        if (strcmp(json_string_value(t), "text") != 0)
            return rt_openai__fail(
                e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                "unsupported_content_type", p,
                "content part type '%.64s' is not supported; "
                "only 'text' is",
                json_string_value(t));
        json_t *text = json_object_get(part, "text");
        snprintf(p, sizeof(p), "%.96s[%zu].text", param, j);
        if (!json_is_string(text))
            return rt_openai__bad_type(e, p, "a string");
        total += json_string_length(text) + 1;
    }
    char *s = malloc(total);
    if (s == NULL)
        return rt_openai__oom(e);
    size_t off = 0;
    for (size_t j = 0; j < n; j++) {
        json_t *text = json_object_get(json_array_get(v, j), "text");
        if (j > 0)
            s[off++] = '\n';
        size_t len = json_string_length(text);
        memcpy(s + off, json_string_value(text), len);
        off += len;
    }
    s[off] = '\0';
    *out = s;
    return 0;
}

static int parse_role(const json_t *v, const char *param, enum rt_role *out,
                      struct rt_request_error *e)
{
    if (v == NULL || json_is_null(v))
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter", param,
                               "'%s' is required", param);
    if (!json_is_string(v))
        return rt_openai__bad_type(e, param, "a string");
    const char *s = json_string_value(v);
    if (rt_role_from_name(s, out) != 0)
        return rt_openai__fail(
            e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_value", param,
            "'%s' must be one of system, developer, user, assistant, "
            "tool; got '%.64s'",
            param, s);
    return 0;
}

/* Sets obj[key] = v (stealing v); a failure is out of memory. */
static int set_new(json_t *obj, const char *key, json_t *v,
                   struct rt_request_error *e)
{
    if (v == NULL || json_object_set_new(obj, key, v) != 0)
        return rt_openai__oom(e);
    return 0;
}

/* An assistant message's tool_calls: [{"id", "type": "function",
 * "function": {"name", "arguments"}}] into *out (normalized: type
 * "function", arguments parsed from a JSON string). */
static int parse_tool_calls(const json_t *v, size_t i, json_t **out,
                            size_t *n_out, struct rt_request_error *e)
{
    char p[160];
    snprintf(p, sizeof(p), "messages[%zu].tool_calls", i);
    if (!json_is_array(v))
        return rt_openai__bad_type(e, p, "an array of tool calls");
    json_t *arr = json_array();
    if (arr == NULL)
        return rt_openai__oom(e);
    int rc = 0;
    size_t k;
    json_t *c;
    json_array_foreach(v, k, c)
    {
        snprintf(p, sizeof(p), "messages[%zu].tool_calls[%zu]", i, k);
        json_t *id = json_object_get(c, "id");
        json_t *type = json_object_get(c, "type");
        json_t *fn = json_object_get(c, "function");
        json_t *name = json_object_get(fn, "name");
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_object(c)) {
            rc = rt_openai__bad_type(e, p, "an object");
        } else if (!json_is_string(id) || json_string_length(id) == 0 ||
                   json_string_length(id) > RT_OPENAI_MAX_ID_BYTES) {
            snprintf(p + strlen(p), sizeof(p) - strlen(p), ".id");
            rc = rt_openai__bad_type(e, p, "a non-empty string");
        } else if (type != NULL && !json_is_null(type) &&
                   !(json_is_string(type) &&
                     strcmp(json_string_value(type), "function") == 0)) {
            snprintf(p + strlen(p), sizeof(p) - strlen(p), ".type");
            rc = rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                 "invalid_value", p,
                                 "'%s' must be \"function\"", p);
        } else if (!json_is_object(fn)) {
            snprintf(p + strlen(p), sizeof(p) - strlen(p), ".function");
            rc = rt_openai__bad_type(e, p, "an object");
        } else if (!json_is_string(name) || json_string_length(name) == 0) {
            snprintf(p + strlen(p), sizeof(p) - strlen(p), ".function.name");
            rc = rt_openai__bad_type(e, p, "a non-empty string");
        } else if (!json_is_string(args) && !json_is_object(args)) {
            snprintf(p + strlen(p), sizeof(p) - strlen(p),
                     ".function.arguments");
            rc = rt_openai__bad_type(e, p, "a JSON string");
        }
        if (rc)
            break;
        /* arguments: the object a JSON string holds (vLLM), else as sent */
        json_t *a = NULL;
        if (json_is_string(args)) {
            json_error_t je;
            a = json_loadb(json_string_value(args), json_string_length(args),
                           JSON_DECODE_ANY, &je);
        }
        if (a == NULL)
            a = json_incref(args);
        json_t *nf = json_object(), *nc = json_object();
        if (nf == NULL || nc == NULL) {
            json_decref(a);
            json_decref(nf);
            json_decref(nc);
            rc = rt_openai__oom(e);
            break;
        }
        if ((rc = set_new(nf, "name", json_incref(name), e)) ||
            (rc = set_new(nf, "arguments", a, e)) ||
            (rc = set_new(nc, "id", json_incref(id), e)) ||
            (rc = set_new(nc, "type", json_string("function"), e)) ||
            (rc = set_new(nc, "function", nf, e)) ||
            json_array_append_new(arr, nc) != 0) {
            if (rc == 0)
                rc = rt_openai__oom(e);
            break;
        }
    }
    if (rc) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    *n_out = json_array_size(arr);
    return 0;
}

static int parse_message(const json_t *m, size_t i, struct rt_message *out,
                         json_t *jm, struct rt_request_error *e)
{
    char p[128];
    snprintf(p, sizeof(p), "messages[%zu]", i);
    if (!json_is_object(m))
        return rt_openai__bad_type(e, p, "an object");
    int rc;
    snprintf(p, sizeof(p), "messages[%zu].role", i);
    if ((rc = parse_role(json_object_get(m, "role"), p, &out->role, e)))
        return rc;
    if ((rc = set_new(jm, "role", json_string(rt_role_name(out->role)), e)))
        return rc;
    snprintf(p, sizeof(p), "messages[%zu].function_call", i);
    if (rt_openai__member(m, "function_call") != NULL)
        return rt_openai__unsupported(
            e, p, "the deprecated function_call is not supported; use "
                  "tool_calls");
    json_t *tc = rt_openai__member(m, "tool_calls");
    json_t *calls = NULL;
    if (tc != NULL && !(json_is_array(tc) && json_array_size(tc) == 0)) {
        snprintf(p, sizeof(p), "messages[%zu].tool_calls", i);
        if (out->role != RT_ROLE_ASSISTANT)
            return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                   "invalid_value", p,
                                   "only assistant messages carry "
                                   "tool_calls");
        if ((rc = parse_tool_calls(tc, i, &calls, &out->n_tool_calls, e)))
            return rc;
    }
    snprintf(p, sizeof(p), "messages[%zu].content", i);
    json_t *content = json_object_get(m, "content");
    if (content == NULL || json_is_null(content)) {
        if (calls == NULL) {
            json_decref(calls);
            return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                   "missing_required_parameter", p,
                                   "'%s' is required", p);
        }
        /* as vLLM: the template gets "" (Qwen3's template, for one, cannot
         * take None) */
        out->content_null = true;
        out->content = strdup("");
        if (out->content == NULL ||
            (rc = set_new(jm, "content", json_string(""), e))) {
            json_decref(calls);
            return out->content == NULL ? rt_openai__oom(e) : rc;
        }
    } else if ((rc = parse_content(content, p, &out->content, e)) ||
               (rc = set_new(jm, "content", json_string(out->content), e))) {
        json_decref(calls);
        return rc;
    }
    snprintf(p, sizeof(p), "messages[%zu].name", i);
    if ((rc = rt_openai__get_str(m, "name", p, RT_OPENAI_MAX_ID_BYTES,
                                 &out->name, e)) ||
        (out->name != NULL &&
         (rc = set_new(jm, "name", json_string(out->name), e)))) {
        json_decref(calls);
        return rc;
    }
    if (out->role == RT_ROLE_ASSISTANT) {
        snprintf(p, sizeof(p), "messages[%zu].reasoning_content", i);
        if ((rc = rt_openai__get_str(m, "reasoning_content", p, 0,
                                     &out->reasoning_content, e)) ||
            (out->reasoning_content != NULL &&
             (rc = set_new(jm, "reasoning_content",
                           json_string(out->reasoning_content), e)))) {
            json_decref(calls);
            return rc;
        }
    }
    if (calls != NULL && (rc = set_new(jm, "tool_calls", calls, e)))
        return rc;
    if (out->role == RT_ROLE_TOOL) {
        snprintf(p, sizeof(p), "messages[%zu].tool_call_id", i);
        if ((rc = rt_openai__get_str(m, "tool_call_id", p,
                                     RT_OPENAI_MAX_ID_BYTES,
                                     &out->tool_call_id, e)))
            return rc;
        if (out->tool_call_id == NULL)
            return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                   "missing_required_parameter", p,
                                   "'%s' is required for a tool message", p);
        if ((rc = set_new(jm, "tool_call_id", json_string(out->tool_call_id),
                          e)))
            return rc;
    }
    return 0;
}

int rt_openai_chat_parse_messages(const json_t *root, struct rt_message **out,
                                  size_t *n_out, json_t **chat,
                                  struct rt_request_error *e)
{
    json_t *v = rt_openai__member(root, "messages");
    if (v == NULL)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter", "messages",
                               "'messages' is required");
    if (!json_is_array(v))
        return rt_openai__bad_type(e, "messages", "an array of messages");
    size_t n = json_array_size(v);
    if (n == 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", "messages",
                               "'messages' must contain at least one message");
    struct rt_message *m = calloc(n, sizeof(*m));
    json_t *arr = json_array();
    if (m == NULL || arr == NULL) {
        free(m);
        json_decref(arr);
        return rt_openai__oom(e);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *jm = json_object();
        int rc = jm != NULL ? parse_message(json_array_get(v, i), i, &m[i],
                                            jm, e)
                            : rt_openai__oom(e);
        if (rc == 0 && json_array_append_new(arr, jm) != 0)
            rc = rt_openai__oom(e);
        else if (rc != 0)
            json_decref(jm);
        if (rc) {
            rt_openai_chat_messages_free(m, n);
            json_decref(arr);
            return rc;
        }
    }
    *out = m;
    *n_out = n;
    *chat = arr;
    return 0;
}

/* OpenAI's rule for function names: [a-zA-Z0-9_-], 1 to 64 characters. */
static bool valid_function_name(const char *s, size_t n)
{
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* tool_choice {"type": "function", "function": {"name": f}} naming one of
 * the tools (OpenAI's shape). */
static int check_named_choice(const json_t *c, const json_t *tools,
                              struct rt_request_error *e)
{
    json_t *type = json_object_get(c, "type");
    if (!json_is_string(type) ||
        strcmp(json_string_value(type), "function") != 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", "tool_choice.type",
                               "'tool_choice.type' must be \"function\"");
    json_t *fn = json_object_get(c, "function");
    json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
    if (!json_is_string(name))
        return rt_openai__bad_type(e, "tool_choice.function.name", "a string");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        json_t *tn = json_object_get(json_object_get(t, "function"), "name");
        if (json_equal(tn, name))
            return 0;
    }
    return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_value",
                           "tool_choice.function.name",
                           "'tool_choice' names the function '%.64s', which "
                           "is not among 'tools'",
                           json_string_value(name));
}

int rt_openai_chat_parse_tools(const json_t *root, json_t **tools,
                               enum rt_tool_choice *choice,
                               struct rt_request_error *e)
{
    *tools = NULL;
    if (choice != NULL)
        *choice = RT_TOOL_CHOICE_AUTO;
    json_t *v = rt_openai__member(root, "tools");
    char p[96];
    if (v != NULL) {
        if (!json_is_array(v))
            return rt_openai__bad_type(e, "tools", "an array");
        if (json_array_size(v) > RT_OPENAI_MAX_TOOLS)
            return rt_openai__fail(e, TG_ERANGE, RT_REQ_ERR_INVALID,
                                   "invalid_value", "tools",
                                   "'tools' has %zu entries; at most %d are "
                                   "allowed",
                                   json_array_size(v), RT_OPENAI_MAX_TOOLS);
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t)
        {
            snprintf(p, sizeof(p), "tools[%zu]", i);
            if (!json_is_object(t))
                return rt_openai__bad_type(e, p, "an object");
            json_t *type = json_object_get(t, "type");
            snprintf(p, sizeof(p), "tools[%zu].type", i);
            if (!json_is_string(type) ||
                strcmp(json_string_value(type), "function") != 0)
                return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                       "invalid_value", p,
                                       "'%s' must be \"function\"", p);
            json_t *fn = json_object_get(t, "function");
            snprintf(p, sizeof(p), "tools[%zu].function", i);
            if (!json_is_object(fn))
                return rt_openai__bad_type(e, p, "an object");
            json_t *name = json_object_get(fn, "name");
            snprintf(p, sizeof(p), "tools[%zu].function.name", i);
            if (!json_is_string(name) ||
                !valid_function_name(json_string_value(name),
                                     json_string_length(name)))
                return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                       "invalid_value", p,
                                       "'%s' must be 1 to 64 characters of "
                                       "a-z, A-Z, 0-9, _ and -",
                                       p);
            json_t *d = rt_openai__member(fn, "description");
            snprintf(p, sizeof(p), "tools[%zu].function.description", i);
            if (d != NULL && !json_is_string(d))
                return rt_openai__bad_type(e, p, "a string");
            json_t *params = rt_openai__member(fn, "parameters");
            snprintf(p, sizeof(p), "tools[%zu].function.parameters", i);
            if (params != NULL && !json_is_object(params))
                return rt_openai__bad_type(e, p, "a JSON Schema object");
            json_t *strict = rt_openai__member(fn, "strict");
            snprintf(p, sizeof(p), "tools[%zu].function.strict", i);
            if (strict != NULL && !json_is_boolean(strict))
                return rt_openai__bad_type(e, p, "a boolean");
        }
    }
    if (choice != NULL) {
        json_t *c = rt_openai__member(root, "tool_choice");
        if (c != NULL) {
            if (json_is_string(c) &&
                strcmp(json_string_value(c), "auto") == 0) {
                *choice = RT_TOOL_CHOICE_AUTO;
            } else if (json_is_string(c) &&
                       strcmp(json_string_value(c), "none") == 0) {
                *choice = RT_TOOL_CHOICE_NONE;
            } else if (json_is_string(c) &&
                       strcmp(json_string_value(c), "required") == 0) {
                *choice = RT_TOOL_CHOICE_REQUIRED;
            } else if (json_is_object(c)) {
                int rc = check_named_choice(c, v, e);
                if (rc != 0)
                    return rc;
                *choice = RT_TOOL_CHOICE_FUNCTION;
            } else {
                return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                       "invalid_value", "tool_choice",
                                       "'tool_choice' must be \"auto\", "
                                       "\"none\", \"required\" or a "
                                       "function");
            }
        }
        int rc;
        bool par = true;
        if ((rc = rt_openai__get_bool(root, "parallel_tool_calls",
                                      "parallel_tool_calls", &par, e)))
            return rc;
    }
    if (v != NULL)
        *tools = json_incref(v);
    return 0;
}

/* Template options shared by chat and chat-form tokenize (vLLM names). */
int rt_openai__parse_chat_opts(const json_t *root, struct rt_chat_opts *c,
                               struct rt_request_error *e)
{
    int rc;
    c->add_generation_prompt = true;
    c->continue_final_message = false;
    c->kwargs = NULL;
    if ((rc = rt_openai__get_bool(root, "add_generation_prompt",
                                  "add_generation_prompt",
                                  &c->add_generation_prompt, e)) ||
        (rc = rt_openai__get_bool(root, "continue_final_message",
                                  "continue_final_message",
                                  &c->continue_final_message, e)))
        return rc;
    if (c->add_generation_prompt && c->continue_final_message)
        return rt_openai__fail(
            e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_value",
            "continue_final_message",
            "'continue_final_message' and 'add_generation_prompt' "
            "cannot both be true");
    json_t *kw = rt_openai__member(root, "chat_template_kwargs");
    if (kw == NULL)
        return 0;
    if (!json_is_object(kw))
        return rt_openai__bad_type(e, "chat_template_kwargs", "an object");
    json_t *th = rt_openai__member(kw, "enable_thinking");
    if (th != NULL && !json_is_boolean(th))
        return rt_openai__bad_type(e, "chat_template_kwargs.enable_thinking",
                                   "a boolean");
    static const char *const reserved[] = {"messages", "tools", "documents",
                                           "add_generation_prompt"};
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (json_object_get(kw, reserved[i]) != NULL) {
            char p[96];
            snprintf(p, sizeof(p), "chat_template_kwargs.%s", reserved[i]);
            return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                   "invalid_value", p,
                                   "'%s' is set by the request itself, not "
                                   "by chat_template_kwargs",
                                   p);
        }
    c->kwargs = json_incref(kw);
    return 0;
}
