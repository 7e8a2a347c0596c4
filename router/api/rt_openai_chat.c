/* rt_openai_chat.c — the chat parts of OpenAI requests (rt_openai_chat.h):
 * messages and tools read from JSON into the conversation value
 * (common/chat/ct_chat.h), the check every front end runs on it,
 * tool_choice and the chat-template options. Shapes follow the OpenAI API
 * reference and vLLM's protocol.py; each rule says where it deviates. */
#include "router/api/rt_openai_chat.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "router/api/rt_openai.h"
#include "router/api/rt_openai_internal.h"

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

static int parse_role(const json_t *v, const char *param, enum ct_role *out,
                      struct rt_request_error *e)
{
    if (v == NULL || json_is_null(v))
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter", param,
                               "'%s' is required", param);
    if (!json_is_string(v))
        return rt_openai__bad_type(e, param, "a string");
    const char *s = json_string_value(v);
    if (ct_role_from_name(s, out) != 0)
        return rt_openai__fail(
            e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_value", param,
            "'%s' must be one of system, developer, user, assistant, "
            "tool; got '%.64s'",
            param, s);
    return 0;
}

/* A malloc'd copy of a JSON string, or the JSON text of any other value
 * (compact, keys in their order); NULL out of memory. */
static char *text_of(const json_t *v)
{
    if (json_is_string(v))
        return strndup(json_string_value(v), json_string_length(v));
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* An assistant message's tool_calls: [{"id", "type": "function",
 * "function": {"name", "arguments"}}] into m->calls. */
static int parse_tool_calls(const json_t *v, size_t i, struct ct_message *m,
                            struct rt_request_error *e)
{
    char p[160];
    snprintf(p, sizeof(p), "messages[%zu].tool_calls", i);
    if (!json_is_array(v))
        return rt_openai__bad_type(e, p, "an array of tool calls");
    size_t n = json_array_size(v);
    if ((m->calls = calloc(n, sizeof(*m->calls))) == NULL)
        return rt_openai__oom(e);
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
        int rc = 0;
        if (!json_is_object(c)) {
            rc = rt_openai__bad_type(e, p, "an object");
        } else if (!json_is_string(id)) {
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
        } else if (!json_is_string(name)) {
            snprintf(p + strlen(p), sizeof(p) - strlen(p), ".function.name");
            rc = rt_openai__bad_type(e, p, "a non-empty string");
        } else if (!json_is_string(args) && !json_is_object(args)) {
            snprintf(p + strlen(p), sizeof(p) - strlen(p),
                     ".function.arguments");
            rc = rt_openai__bad_type(e, p, "a JSON string");
        }
        if (rc != 0)
            return rc;
        struct ct_tool_call *t = &m->calls[k];
        m->n_calls = k + 1;
        if ((t->id = text_of(id)) == NULL ||
            (t->name = text_of(name)) == NULL ||
            (t->arguments = text_of(args)) == NULL)
            return rt_openai__oom(e);
    }
    return 0;
}

static int parse_message(const json_t *m, size_t i, struct ct_message *out,
                         struct rt_request_error *e)
{
    char p[128];
    snprintf(p, sizeof(p), "messages[%zu]", i);
    if (!json_is_object(m))
        return rt_openai__bad_type(e, p, "an object");
    int rc;
    snprintf(p, sizeof(p), "messages[%zu].role", i);
    if ((rc = parse_role(json_object_get(m, "role"), p, &out->role, e)))
        return rc;
    snprintf(p, sizeof(p), "messages[%zu].function_call", i);
    if (rt_openai__member(m, "function_call") != NULL)
        return rt_openai__unsupported(
            e, p, "the deprecated function_call is not supported; use "
                  "tool_calls");
    json_t *tc = rt_openai__member(m, "tool_calls");
    if (tc != NULL && !(json_is_array(tc) && json_array_size(tc) == 0) &&
        (rc = parse_tool_calls(tc, i, out, e)))
        return rc;
    snprintf(p, sizeof(p), "messages[%zu].content", i);
    json_t *content = json_object_get(m, "content");
    if (content == NULL || json_is_null(content)) {
        /* as vLLM: the template gets "" (Qwen3's template, for one, cannot
         * take None); rt_chat_check allows it only beside tool calls */
        out->content_null = true;
        if ((out->content = strdup("")) == NULL)
            return rt_openai__oom(e);
    } else if ((rc = parse_content(content, p, &out->content, e))) {
        return rc;
    }
    snprintf(p, sizeof(p), "messages[%zu].name", i);
    if ((rc = rt_openai__get_str(m, "name", p, 0, &out->name, e)))
        return rc;
    if (out->role == CT_ROLE_ASSISTANT) {
        snprintf(p, sizeof(p), "messages[%zu].reasoning_content", i);
        if ((rc = rt_openai__get_str(m, "reasoning_content", p, 0,
                                     &out->reasoning_content, e)))
            return rc;
    }
    if (out->role == CT_ROLE_TOOL) {
        snprintf(p, sizeof(p), "messages[%zu].tool_call_id", i);
        if ((rc = rt_openai__get_str(m, "tool_call_id", p, 0,
                                     &out->tool_call_id, e)))
            return rc;
    }
    return 0;
}

int rt_openai_chat_parse_messages(const json_t *root, struct ct_chat *c,
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
    struct ct_message *m = n > 0 ? calloc(n, sizeof(*m)) : NULL;
    if (n > 0 && m == NULL)
        return rt_openai__oom(e);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = parse_message(json_array_get(v, i), i, &m[i], e);
    struct ct_chat tmp = {.messages = m, .n_messages = n};
    if (rc == 0)
        rc = rt_chat_check(&tmp, e);
    if (rc != 0) {
        ct_messages_free(m, n);
        return rc;
    }
    ct_messages_free(c->messages, c->n_messages);
    c->messages = m;
    c->n_messages = n;
    return 0;
}

/* ---- the check of a conversation ----------------------------------------- */

/* s (NULL = absent) as UTF-8 of at most max bytes (0 = any) and, when
 * `nonempty`, at least one; param names the field. */
static int check_str(const char *s, size_t max, bool nonempty,
                     const char *param, struct rt_request_error *e)
{
    if (s == NULL)
        return 0;
    size_t n = strlen(s), bad = 0;
    if (nonempty && n == 0)
        return rt_openai__bad_type(e, param, "a non-empty string");
    if (max > 0 && n > max)
        return rt_openai__fail(e, TG_ERANGE, RT_REQ_ERR_INVALID,
                               "invalid_value", param,
                               "'%s' is longer than %zu bytes", param, max);
    if (!tok_utf8_valid(s, n, &bad))
        return rt_openai__fail(
            e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_value", param,
            "'%s' is not valid UTF-8 (byte %zu)", param, bad);
    return 0;
}

static int check_message(const struct ct_message *m, size_t i,
                         struct rt_request_error *e)
{
    char p[160];
    int rc;
    if (m->n_calls > 0 && m->role != CT_ROLE_ASSISTANT) {
        snprintf(p, sizeof(p), "messages[%zu].tool_calls", i);
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", p,
                               "only assistant messages carry tool_calls");
    }
    snprintf(p, sizeof(p), "messages[%zu].content", i);
    if (m->content_null && m->n_calls == 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter", p,
                               "'%s' is required", p);
    if ((rc = check_str(m->content, 0, false, p, e)))
        return rc;
    snprintf(p, sizeof(p), "messages[%zu].name", i);
    if ((rc = check_str(m->name, RT_OPENAI_MAX_ID_BYTES, false, p, e)))
        return rc;
    snprintf(p, sizeof(p), "messages[%zu].reasoning_content", i);
    if ((rc = check_str(m->reasoning_content, 0, false, p, e)))
        return rc;
    snprintf(p, sizeof(p), "messages[%zu].tool_call_id", i);
    if (m->role == CT_ROLE_TOOL && m->tool_call_id == NULL)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter", p,
                               "'%s' is required for a tool message", p);
    if ((rc = check_str(m->tool_call_id, RT_OPENAI_MAX_ID_BYTES, false, p, e)))
        return rc;
    for (size_t k = 0; k < m->n_calls; k++) {
        const struct ct_tool_call *c = &m->calls[k];
        snprintf(p, sizeof(p), "messages[%zu].tool_calls[%zu].id", i, k);
        if ((rc = check_str(c->id != NULL ? c->id : "", RT_OPENAI_MAX_ID_BYTES,
                            true, p, e)))
            return rc;
        snprintf(p, sizeof(p), "messages[%zu].tool_calls[%zu].function.name", i,
                 k);
        if ((rc = check_str(c->name != NULL ? c->name : "", 0, true, p, e)))
            return rc;
        snprintf(p, sizeof(p),
                 "messages[%zu].tool_calls[%zu].function.arguments", i, k);
        if ((rc = check_str(c->arguments != NULL ? c->arguments : "", 0, false,
                            p, e)))
            return rc;
    }
    return 0;
}

int rt_chat_check(const struct ct_chat *c, struct rt_request_error *e)
{
    if (c->n_messages == 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", "messages",
                               "'messages' must contain at least one message");
    for (size_t i = 0; i < c->n_messages; i++) {
        int rc = check_message(&c->messages[i], i, e);
        if (rc != 0)
            return rc;
    }
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

int rt_chat_check_tools(const struct ct_tools *t, struct rt_request_error *e)
{
    if (t == NULL)
        return 0;
    if (t->n > RT_OPENAI_MAX_TOOLS)
        return rt_openai__fail(e, TG_ERANGE, RT_REQ_ERR_INVALID,
                               "invalid_value", "tools",
                               "'tools' has %zu entries; at most %d are "
                               "allowed",
                               t->n, RT_OPENAI_MAX_TOOLS);
    char p[96];
    for (size_t i = 0; i < t->n; i++) {
        const struct ct_tool *x = &t->v[i];
        snprintf(p, sizeof(p), "tools[%zu].function.name", i);
        if (x->name == NULL || !valid_function_name(x->name, strlen(x->name)))
            return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                   "invalid_value", p,
                                   "'%s' must be 1 to 64 characters of "
                                   "a-z, A-Z, 0-9, _ and -",
                                   p);
        snprintf(p, sizeof(p), "tools[%zu].function.description", i);
        int rc = check_str(x->description, 0, false, p, e);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* tool_choice {"type": "function", "function": {"name": f}} naming one of
 * the tools (OpenAI's shape) into sel. */
static int named_choice(const json_t *c, const struct ct_tools *tools,
                        struct rt_tool_sel *sel, struct rt_request_error *e)
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
    if (ct_tools_find(tools, json_string_value(name)) < 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", "tool_choice.function.name",
                               "'tool_choice' names the function '%.64s', "
                               "which is not among 'tools'",
                               json_string_value(name));
    sel->choice = RT_TOOL_CHOICE_FUNCTION;
    sel->name = json_string_value(name);
    return 0;
}

/* One tool object (shape checked) into *t. */
static int read_tool(const json_t *x, size_t i, struct ct_tool *t,
                     struct rt_request_error *e)
{
    char p[96];
    snprintf(p, sizeof(p), "tools[%zu]", i);
    if (!json_is_object(x))
        return rt_openai__bad_type(e, p, "an object");
    json_t *type = json_object_get(x, "type");
    snprintf(p, sizeof(p), "tools[%zu].type", i);
    if (!json_is_string(type) ||
        strcmp(json_string_value(type), "function") != 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", p, "'%s' must be \"function\"",
                               p);
    json_t *fn = json_object_get(x, "function");
    snprintf(p, sizeof(p), "tools[%zu].function", i);
    if (!json_is_object(fn))
        return rt_openai__bad_type(e, p, "an object");
    json_t *name = json_object_get(fn, "name");
    snprintf(p, sizeof(p), "tools[%zu].function.name", i);
    if (!json_is_string(name))
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
    t->strict = json_is_true(strict);
    if ((t->name = text_of(name)) == NULL ||
        (d != NULL && (t->description = text_of(d)) == NULL) ||
        (params != NULL && (t->parameters = text_of(params)) == NULL) ||
        (t->spec = text_of(x)) == NULL)
        return rt_openai__oom(e);
    return 0;
}

int rt_openai_chat_parse_tools(const json_t *root, struct ct_chat *c,
                               struct rt_tool_sel *sel,
                               struct rt_request_error *e)
{
    if (sel != NULL)
        *sel = (struct rt_tool_sel){.choice = RT_TOOL_CHOICE_AUTO,
                                    .parallel = true};
    json_t *v = rt_openai__member(root, "tools");
    struct ct_tools *tools = NULL;
    int rc = 0;
    if (v != NULL) {
        if (!json_is_array(v))
            return rt_openai__bad_type(e, "tools", "an array");
        size_t n = json_array_size(v);
        if (n > RT_OPENAI_MAX_TOOLS)
            return rt_openai__fail(e, TG_ERANGE, RT_REQ_ERR_INVALID,
                                   "invalid_value", "tools",
                                   "'tools' has %zu entries; at most %d are "
                                   "allowed",
                                   n, RT_OPENAI_MAX_TOOLS);
        if ((tools = ct_tools_new(n)) == NULL)
            return rt_openai__oom(e);
        for (size_t i = 0; rc == 0 && i < n; i++)
            rc = read_tool(json_array_get(v, i), i, &tools->v[i], e);
        if (rc == 0)
            rc = rt_chat_check_tools(tools, e);
    }
    json_t *ch = sel != NULL ? rt_openai__member(root, "tool_choice") : NULL;
    if (rc == 0 && ch != NULL) {
        const char *cs = json_string_value(ch);
        if (cs != NULL && strcmp(cs, "auto") == 0)
            sel->choice = RT_TOOL_CHOICE_AUTO;
        else if (cs != NULL && strcmp(cs, "none") == 0)
            sel->choice = RT_TOOL_CHOICE_NONE;
        else if (cs != NULL && strcmp(cs, "required") == 0)
            sel->choice = RT_TOOL_CHOICE_REQUIRED;
        else if (json_is_object(ch))
            rc = named_choice(ch, tools, sel, e);
        else
            rc = rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                 "invalid_value", "tool_choice",
                                 "'tool_choice' must be \"auto\", "
                                 "\"none\", \"required\" or a function");
    }
    if (rc == 0 && sel != NULL)
        rc = rt_openai__get_bool(root, "parallel_tool_calls",
                                 "parallel_tool_calls", &sel->parallel, e);
    if (rc != 0) {
        ct_tools_unref(tools);
        return rc;
    }
    ct_tools_unref(c->tools);
    c->tools = tools;
    return 0;
}

/* Template options shared by chat and chat-form tokenize (vLLM names). */
int rt_openai__parse_chat_opts(const json_t *root, struct ct_chat *c,
                               struct rt_request_error *e)
{
    int rc;
    c->add_generation_prompt = true;
    c->continue_final_message = false;
    free(c->kwargs);
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
    if ((c->kwargs = json_dumps(kw, JSON_COMPACT)) == NULL)
        return rt_openai__oom(e);
    return 0;
}
