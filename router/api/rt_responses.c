/* rt_responses.c — the Responses API's request read into a chat request,
 * items into chat messages, the Response object and stream events (see
 * rt_responses.h). */
#include "router/api/rt_responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_respstore.h"

static int fail(struct rt_request_error *e, int rc, const char *code,
                const char *param, const char *msg)
{
    rt_request_error_set(
        e, rc == TG_ENOMEM ? RT_REQ_ERR_INTERNAL : RT_REQ_ERR_INVALID, code,
        param, "%s", msg);
    return rc;
}

static int oom(struct rt_request_error *e)
{
    return fail(e, TG_ENOMEM, "internal_error", NULL, "out of memory");
}

/* Member `k` of o, NULL when absent or null. */
static json_t *member(const json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

static int bad_type(struct rt_request_error *e, const char *param,
                    const char *what)
{
    rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_type", param,
                         "'%s' must be %s", param, what);
    return TG_EFORMAT;
}

/* ---- items ----------------------------------------------------------------- */

/* A new item id "<prefix>_" + 32 hex digits set as item's "id" unless it
 * has one. */
static int give_id(json_t *item, const char *prefix)
{
    if (json_is_string(json_object_get(item, "id")))
        return 0;
    char id[RT_RESP_ID_MAX];
    if (rt_respstore_new_id(prefix, id) != 0)
        return TG_EIO;
    return json_object_set_new(item, "id", json_string(id)) == 0 ? 0
                                                                 : TG_ENOMEM;
}

/* Checks a message item's content (a string, or an array of input_text /
 * output_text parts) and returns it in parts form (new reference), or
 * NULL with *e. */
static json_t *content_parts(const json_t *c, const char *role,
                             const char *param, struct rt_request_error *e)
{
    char p[128];
    const char *part_type = strcmp(role, "assistant") == 0 ? "output_text"
                                                           : "input_text";
    if (json_is_string(c)) {
        json_t *part = json_pack("{s:s, s:O}", "type", part_type, "text", c);
        json_t *arr = json_array();
        if (part == NULL || arr == NULL || json_array_append_new(arr, part)) {
            json_decref(arr);
            oom(e);
            return NULL;
        }
        if (strcmp(part_type, "output_text") == 0)
            json_object_set_new(part, "annotations", json_array());
        return arr;
    }
    snprintf(p, sizeof(p), "%s.content", param);
    if (!json_is_array(c)) {
        bad_type(e, p, "a string or an array of content parts");
        return NULL;
    }
    size_t i;
    json_t *x;
    json_array_foreach(c, i, x)
    {
        snprintf(p, sizeof(p), "%s.content[%zu]", param, i);
        const char *t = json_string_value(member(x, "type"));
        if (!json_is_object(x) || t == NULL) {
            bad_type(e, p, "a content part object with a type");
            return NULL;
        }
        if (strcmp(t, "input_text") != 0 && strcmp(t, "output_text") != 0 &&
            strcmp(t, "text") != 0) {
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "unsupported_parameter",
                                 p,
                                 "content parts of type '%.60s' are not "
                                 "served (only input_text and output_text)",
                                 t);
            return NULL;
        }
        if (!json_is_string(member(x, "text"))) {
            snprintf(p, sizeof(p), "%s.content[%zu].text", param, i);
            bad_type(e, p, "a string");
            return NULL;
        }
    }
    return json_deep_copy(c);
}

/* One input item (at param) checked and normalized, appended to out. */
static int take_item(const json_t *x, const char *param, json_t *out,
                     struct rt_request_error *e)
{
    char p[128];
    if (!json_is_object(x))
        return bad_type(e, param, "an item object");
    const char *t = json_string_value(member(x, "type"));
    if (member(x, "type") != NULL && t == NULL) {
        snprintf(p, sizeof(p), "%s.type", param);
        return bad_type(e, p, "a string");
    }
    json_t *it = NULL;
    const char *prefix = "msg";
    if (t == NULL || strcmp(t, "message") == 0) {
        const char *role = json_string_value(member(x, "role"));
        snprintf(p, sizeof(p), "%s.role", param);
        if (role == NULL)
            return bad_type(e, p,
                            "'user', 'system', 'developer' or "
                            "'assistant'");
        if (strcmp(role, "user") != 0 && strcmp(role, "system") != 0 &&
            strcmp(role, "developer") != 0 && strcmp(role, "assistant") != 0) {
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", p,
                                 "'%.40s' is not a role of a message item "
                                 "(user, system, developer, assistant)",
                                 role);
            return TG_EFORMAT;
        }
        json_t *c = member(x, "content");
        if (c == NULL) {
            snprintf(p, sizeof(p), "%s.content", param);
            return bad_type(e, p, "a string or an array of content parts");
        }
        json_t *parts = content_parts(c, role, param, e);
        if (parts == NULL)
            return e->kind == RT_REQ_ERR_INTERNAL ? TG_ENOMEM : TG_EFORMAT;
        it = json_pack("{s:s, s:s, s:o}", "type", "message", "role", role,
                       "content", parts);
        if (it != NULL && json_is_string(json_object_get(x, "id")))
            json_object_set(it, "id", json_object_get(x, "id"));
        if (it != NULL)
            json_object_set_new(it, "status", json_string("completed"));
    } else if (strcmp(t, "function_call") == 0) {
        static const char *const keys[] = {"call_id", "name", "arguments"};
        for (int k = 0; k < 3; k++)
            if (!json_is_string(member(x, keys[k]))) {
                snprintf(p, sizeof(p), "%s.%s", param, keys[k]);
                return bad_type(e, p, "a string");
            }
        it = json_deep_copy(x);
        prefix = "fc";
        if (it != NULL && member(it, "status") == NULL)
            json_object_set_new(it, "status", json_string("completed"));
    } else if (strcmp(t, "function_call_output") == 0) {
        snprintf(p, sizeof(p), "%s.call_id", param);
        if (!json_is_string(member(x, "call_id")))
            return bad_type(e, p, "a string");
        json_t *o = member(x, "output");
        snprintf(p, sizeof(p), "%s.output", param);
        if (!json_is_string(o))
            return bad_type(e, p, "a string");
        it = json_deep_copy(x);
        prefix = "fco";
        if (it != NULL && member(it, "status") == NULL)
            json_object_set_new(it, "status", json_string("completed"));
    } else if (strcmp(t, "reasoning") == 0) {
        /* An earlier turn's reasoning, sent back: the next assistant
         * message's reasoning_content (rt_responses_messages). */
        it = json_deep_copy(x);
        prefix = "rs";
        if (it != NULL && member(it, "status") == NULL)
            json_object_set_new(it, "status", json_string("completed"));
    } else if (strcmp(t, "item_reference") == 0) {
        /* Resolved by the front end against the stored responses. */
        snprintf(p, sizeof(p), "%s.id", param);
        if (!json_is_string(member(x, "id")))
            return bad_type(e, p, "a string");
        it = json_pack("{s:s, s:O}", "type", "item_reference", "id",
                       member(x, "id"));
        if (it == NULL || json_array_append_new(out, it) != 0)
            return oom(e);
        return 0;
    } else {
        snprintf(p, sizeof(p), "%s.type", param);
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "unsupported_parameter", p,
                             "input items of type '%.60s' are not served "
                             "(message, function_call, function_call_output, "
                             "reasoning, item_reference)",
                             t);
        return TG_EUNSUPPORTED;
    }
    if (it == NULL || json_array_append_new(out, it) != 0)
        return oom(e);
    if (give_id(it, prefix) != 0)
        return oom(e);
    return 0;
}

static int read_input(const json_t *v, json_t **out, struct rt_request_error *e)
{
    json_t *items = json_array();
    if (items == NULL)
        return oom(e);
    *out = items;
    if (json_is_string(v)) {
        json_t *m = json_pack("{s:s, s:O}", "role", "user", "content", v);
        int rc = m != NULL ? take_item(m, "input", items, e) : oom(e);
        json_decref(m);
        return rc;
    }
    if (!json_is_array(v))
        return bad_type(e, "input", "a string or an array of items");
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x)
    {
        char p[64];
        snprintf(p, sizeof(p), "input[%zu]", i);
        int rc = take_item(x, p, items, e);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The text of a message item's parts, joined with "\n" (malloc'd). */
static char *parts_text(const json_t *parts)
{
    size_t n = 1, i;
    json_t *x;
    json_array_foreach(parts, i, x)
        n += json_string_length(json_object_get(x, "text")) + 1;
    char *s = malloc(n), *w = s;
    if (s == NULL)
        return NULL;
    json_array_foreach(parts, i, x)
    {
        const char *t = json_string_value(json_object_get(x, "text"));
        size_t k = json_string_length(json_object_get(x, "text"));
        if (i > 0)
            *w++ = '\n';
        if (t != NULL)
            memcpy(w, t, k);
        w += k;
    }
    *w = '\0';
    return s;
}

const char *rt_responses_item_text(const json_t *item)
{
    const json_t *parts = json_object_get(item, "content");
    const char *t = json_string_value(
        json_object_get(json_array_get(parts, 0), "text"));
    return t != NULL ? t : "";
}

/* The text of a reasoning item (its reasoning_text parts, else its
 * summary) as m's reasoning_content. */
static int set_thought(json_t *m, const json_t *item)
{
    const json_t *parts = json_object_get(item, "content");
    if (json_array_size(parts) == 0)
        parts = json_object_get(item, "summary");
    char *text = parts_text(parts);
    if (text == NULL)
        return TG_ENOMEM;
    int rc = text[0] != '\0' ? json_object_set_new(m, "reasoning_content",
                                                   json_string(text))
                             : 0;
    free(text);
    return rc != 0 ? TG_ENOMEM : 0;
}

int rt_responses_messages(const json_t *items, const char *param,
                          json_t *messages, struct rt_request_error *e)
{
    json_t *calls_msg = NULL;     /* the assistant message of the current run
                                 of function_call items */
    const json_t *thought = NULL; /* a reasoning item for the next
                                     assistant message */
    size_t i;
    json_t *x;
    json_array_foreach(items, i, x)
    {
        const char *t = json_string_value(json_object_get(x, "type"));
        json_t *m = NULL;
        if (t != NULL && strcmp(t, "reasoning") == 0) {
            thought = x;
            calls_msg = NULL;
            continue;
        }
        if (t != NULL && strcmp(t, "function_call") == 0) {
            json_t *args = json_object_get(x, "arguments");
            json_t *call = json_pack(
                "{s:O, s:s, s:{s:O, s:O}}", "id", json_object_get(x, "call_id"),
                "type", "function", "function", "name",
                json_object_get(x, "name"), "arguments", args);
            if (call == NULL)
                return oom(e);
            if (calls_msg == NULL) {
                calls_msg = json_pack("{s:s, s:s, s:[]}", "role", "assistant",
                                      "content", "", "tool_calls");
                if (calls_msg == NULL ||
                    json_array_append_new(messages, calls_msg) != 0) {
                    json_decref(call);
                    return oom(e);
                }
                if (thought != NULL && set_thought(calls_msg, thought) != 0) {
                    json_decref(call);
                    return oom(e);
                }
                thought = NULL;
            }
            if (json_array_append_new(json_object_get(calls_msg, "tool_calls"),
                                      call) != 0)
                return oom(e);
            continue;
        }
        calls_msg = NULL;
        if (t != NULL && strcmp(t, "function_call_output") == 0) {
            m = json_pack("{s:s, s:O, s:O}", "role", "tool", "tool_call_id",
                          json_object_get(x, "call_id"), "content",
                          json_object_get(x, "output"));
        } else if (t != NULL && strcmp(t, "message") == 0) {
            char *text = parts_text(json_object_get(x, "content"));
            if (text != NULL)
                m = json_pack("{s:O, s:s}", "role", json_object_get(x, "role"),
                              "content", text);
            free(text);
            const char *role = json_string_value(json_object_get(x, "role"));
            if (m != NULL && thought != NULL && role != NULL &&
                strcmp(role, "assistant") == 0) {
                if (set_thought(m, thought) != 0) {
                    json_decref(m);
                    return oom(e);
                }
                thought = NULL;
            }
        } else {
            char p[64];
            snprintf(p, sizeof(p), "%s[%zu]", param, i);
            return fail(e, TG_EFORMAT, "invalid_value", p,
                        "an item of an unknown type");
        }
        if (m == NULL || json_array_append_new(messages, m) != 0)
            return oom(e);
    }
    return 0;
}

/* ---- the request ------------------------------------------------------------- */

/* Fields of the Responses body that mean something else (or nothing) in
 * the chat body: handled here, not passed through. */
static const char *const own_fields[] = {"input",
                                         "instructions",
                                         "max_output_tokens",
                                         "tools",
                                         "tool_choice",
                                         "text",
                                         "store",
                                         "previous_response_id",
                                         "metadata",
                                         "reasoning",
                                         "stream",
                                         "include",
                                         "truncation",
                                         "background",
                                         "stream_options",
                                         "messages",
                                         "prompt",
                                         "response_format",
                                         "max_tokens",
                                         "max_completion_tokens",
                                         "n",
                                         "service_tier",
                                         "prompt_cache_key",
                                         "safety_identifier",
                                         "top_logprobs",
                                         "conversation"};

static int is_own(const char *k)
{
    for (size_t i = 0; i < sizeof(own_fields) / sizeof(own_fields[0]); i++)
        if (strcmp(k, own_fields[i]) == 0)
            return 1;
    return 0;
}

/* tools: Responses function tools to chat tools (added to chat). */
static int read_tools(const json_t *v, json_t *chat, struct rt_request_error *e)
{
    if (!json_is_array(v))
        return bad_type(e, "tools", "an array of tools");
    json_t *out = json_array();
    if (out == NULL || json_object_set_new(chat, "tools", out) != 0)
        return oom(e);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x)
    {
        char p[64];
        snprintf(p, sizeof(p), "tools[%zu]", i);
        const char *t = json_string_value(member(x, "type"));
        if (!json_is_object(x) || t == NULL)
            return bad_type(e, p, "a tool object with a type");
        if (strcmp(t, "function") != 0) {
            rt_request_error_set(e, RT_REQ_ERR_INVALID, "unsupported_parameter",
                                 p,
                                 "tools of type '%.60s' are not served (only "
                                 "function tools)",
                                 t);
            return TG_EUNSUPPORTED;
        }
        if (!json_is_string(member(x, "name"))) {
            snprintf(p, sizeof(p), "tools[%zu].name", i);
            return bad_type(e, p, "a string");
        }
        json_t *f = json_object();
        json_t *tool = json_pack("{s:s, s:o}", "type", "function", "function",
                                 f);
        if (f == NULL || tool == NULL || json_array_append_new(out, tool))
            return oom(e);
        static const char *const keys[] = {"name", "description", "parameters",
                                           "strict"};
        for (int k = 0; k < 4; k++)
            if (member(x, keys[k]) != NULL &&
                json_object_set(f, keys[k], member(x, keys[k])) != 0)
                return oom(e);
    }
    return 0;
}

static int read_tool_choice(json_t *v, json_t *chat, struct rt_request_error *e)
{
    json_t *c = NULL;
    if (json_is_string(v)) {
        c = json_incref(v);
    } else if (json_is_object(v) && json_is_string(member(v, "type")) &&
               strcmp(json_string_value(member(v, "type")), "function") == 0) {
        if (!json_is_string(member(v, "name")))
            return bad_type(e, "tool_choice.name", "a string");
        c = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
                      member(v, "name"));
    } else {
        return bad_type(e, "tool_choice",
                        "'auto', 'none', 'required' or {\"type\": "
                        "\"function\", \"name\"}");
    }
    if (c == NULL || json_object_set_new(chat, "tool_choice", c) != 0)
        return oom(e);
    return 0;
}

/* text.format to the chat API's response_format (added to chat). */
static int read_text(const json_t *v, json_t *chat, json_t **echo,
                     struct rt_request_error *e)
{
    if (!json_is_object(v))
        return bad_type(e, "text", "an object");
    json_t *f = member(v, "format");
    if (f == NULL) {
        *echo = json_pack("{s:{s:s}}", "format", "type", "text");
        return *echo != NULL ? 0 : oom(e);
    }
    const char *t = json_string_value(member(f, "type"));
    if (!json_is_object(f) || t == NULL)
        return bad_type(e, "text.format", "a format object with a type");
    json_t *rf = NULL;
    if (strcmp(t, "text") == 0) {
        rf = NULL;
    } else if (strcmp(t, "json_object") == 0) {
        rf = json_pack("{s:s}", "type", "json_object");
    } else if (strcmp(t, "json_schema") == 0) {
        json_t *js = json_object();
        rf = json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js);
        static const char *const keys[] = {"name", "schema", "strict",
                                           "description"};
        for (int k = 0; rf != NULL && k < 4; k++)
            if (member(f, keys[k]) != NULL)
                json_object_set(js, keys[k], member(f, keys[k]));
    } else {
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value",
                             "text.format.type",
                             "'%.60s' is not a text format (text, "
                             "json_object, json_schema)",
                             t);
        return TG_EFORMAT;
    }
    if (strcmp(t, "text") != 0 &&
        (rf == NULL || json_object_set_new(chat, "response_format", rf) != 0))
        return oom(e);
    *echo = json_pack("{s:O}", "format", f);
    return *echo != NULL ? 0 : oom(e);
}

static int read_metadata(json_t *v, struct rt_request_error *e)
{
    if (!json_is_object(v))
        return bad_type(e, "metadata", "an object of strings");
    if (json_object_size(v) > RT_RESPONSES_MAX_METADATA)
        return fail(e, TG_EFORMAT, "invalid_value", "metadata",
                    "metadata has more than 16 keys");
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x)
    {
        if (!json_is_string(x) ||
            json_string_length(x) > RT_RESPONSES_MAX_META_VAL ||
            strlen(k) > RT_RESPONSES_MAX_META_KEY)
            return fail(e, TG_EFORMAT, "invalid_value", "metadata",
                        "metadata values must be strings of at most 512 "
                        "bytes, keys at most 64 bytes");
    }
    return 0;
}

int rt_responses_parse(const struct rt_openai_cfg *cfg, const char *body,
                       size_t len, struct rt_responses_request *out,
                       struct rt_request_error *e)
{
    memset(out, 0, sizeof(*out));
    out->store = true;
    if (cfg->max_body_bytes > 0 && len > cfg->max_body_bytes) {
        rt_request_error_set(e, RT_REQ_ERR_TOO_LARGE, "request_too_large", NULL,
                             "request body of %zu bytes exceeds the limit of "
                             "%zu bytes",
                             len, cfg->max_body_bytes);
        return TG_ETOOBIG;
    }
    json_error_t je;
    json_t *root = body != NULL && len > 0 ? json_loadb(body, len, 0, &je)
                                           : NULL;
    if (root == NULL || !json_is_object(root)) {
        json_decref(root);
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_json", NULL,
                             "the request body must be a JSON object");
        return TG_EFORMAT;
    }
    int rc = 0;
    json_t *v = member(root, "model");
    if (v != NULL && (!json_is_string(v) ||
                      strcmp(json_string_value(v), cfg->served_model) != 0)) {
        rt_request_error_set(
            e, RT_REQ_ERR_NOT_FOUND, "model_not_found", "model",
            "The model '%.100s' does not exist; this server "
            "serves '%.100s'",
            json_is_string(v) ? json_string_value(v) : "?", cfg->served_model);
        rc = TG_ENOTFOUND;
        goto done;
    }
    out->chat = json_object();
    out->echo = json_object();
    if (out->chat == NULL || out->echo == NULL) {
        rc = oom(e);
        goto done;
    }
    /* Everything the chat API reads the same way passes through. */
    const char *k;
    json_object_foreach(root, k, v)
    {
        if (!is_own(k) && json_object_set(out->chat, k, v) != 0) {
            rc = oom(e);
            goto done;
        }
    }
    if ((v = member(root, "input")) == NULL) {
        rc = bad_type(e, "input", "a string or an array of items");
        goto done;
    }
    if ((rc = read_input(v, &out->input, e)) != 0)
        goto done;
    if ((v = member(root, "instructions")) != NULL) {
        if (!json_is_string(v)) {
            rc = bad_type(e, "instructions", "a string");
            goto done;
        }
        out->instructions = json_incref(v);
    }
    if ((v = member(root, "max_output_tokens")) != NULL &&
        json_object_set(out->chat, "max_completion_tokens", v) != 0) {
        rc = oom(e);
        goto done;
    }
    if ((v = member(root, "tools")) != NULL) {
        if ((rc = read_tools(v, out->chat, e)) != 0)
            goto done;
        out->tools = json_incref(v);
    }
    if ((v = member(root, "tool_choice")) != NULL) {
        if ((rc = read_tool_choice(v, out->chat, e)) != 0)
            goto done;
        out->tool_choice = json_incref(v);
    }
    v = member(root, "text");
    if (v == NULL) {
        out->text = json_pack("{s:{s:s}}", "format", "type", "text");
    } else if ((rc = read_text(v, out->chat, &out->text, e)) != 0) {
        goto done;
    }
    if ((v = member(root, "store")) != NULL) {
        if (!json_is_boolean(v)) {
            rc = bad_type(e, "store", "a boolean");
            goto done;
        }
        out->store = json_is_true(v);
    }
    if ((v = member(root, "stream")) != NULL) {
        if (!json_is_boolean(v)) {
            rc = bad_type(e, "stream", "a boolean");
            goto done;
        }
        out->stream = json_is_true(v);
    }
    if ((v = member(root, "previous_response_id")) != NULL) {
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            json_string_length(v) >= RT_RESP_ID_MAX) {
            rc = bad_type(e, "previous_response_id", "a response id");
            goto done;
        }
        if ((out->previous_id = strdup(json_string_value(v))) == NULL) {
            rc = oom(e);
            goto done;
        }
    }
    if ((v = member(root, "metadata")) != NULL) {
        if ((rc = read_metadata(v, e)) != 0)
            goto done;
        out->metadata = json_incref(v);
    }
    /* What would change the answer and is not served is refused, never
     * dropped: logprobs, background runs, extra output to include. */
    if ((v = member(root, "top_logprobs")) != NULL &&
        !(json_is_integer(v) && json_integer_value(v) == 0)) {
        rc = fail(e, TG_EUNSUPPORTED, "unsupported_parameter", "top_logprobs",
                  "'top_logprobs' is not served by /v1/responses (use "
                  "/v1/chat/completions with logprobs)");
        goto done;
    }
    if ((v = member(root, "background")) != NULL && !json_is_false(v)) {
        rc = fail(e, TG_EUNSUPPORTED, "unsupported_parameter", "background",
                  "background responses are not served");
        goto done;
    }
    if ((v = member(root, "include")) != NULL &&
        (!json_is_array(v) || json_array_size(v) > 0)) {
        rc = fail(e, TG_EUNSUPPORTED, "unsupported_parameter", "include",
                  "'include' is not served (no extra output to include)");
        goto done;
    }
    if ((v = member(root, "conversation")) != NULL) {
        rc = fail(e, TG_EUNSUPPORTED, "unsupported_parameter", "conversation",
                  "conversations objects are not served; use "
                  "previous_response_id");
        goto done;
    }
    if ((v = member(root, "reasoning")) != NULL && !json_is_object(v)) {
        rc = bad_type(e, "reasoning", "an object");
        goto done;
    }
    static const char *const echoed[] = {
        "temperature",         "top_p", "max_output_tokens",
        "parallel_tool_calls", "user",  "reasoning"};
    for (size_t i = 0; i < sizeof(echoed) / sizeof(echoed[0]); i++)
        if ((v = member(root, echoed[i])) != NULL)
            json_object_set(out->echo, echoed[i], v);
    if (out->text == NULL)
        rc = oom(e);
done:
    json_decref(root);
    if (rc != 0)
        rt_responses_request_free(out);
    return rc;
}

void rt_responses_request_free(struct rt_responses_request *r)
{
    free(r->previous_id);
    json_decref(r->input);
    json_decref(r->instructions);
    json_decref(r->metadata);
    json_decref(r->tools);
    json_decref(r->tool_choice);
    json_decref(r->text);
    json_decref(r->echo);
    json_decref(r->chat);
    memset(r, 0, sizeof(*r));
}

int rt_responses_chat(const struct rt_openai_cfg *cfg,
                      const struct rt_responses_request *r, json_t *messages,
                      struct rt_gen_request *g, struct rt_request_error *e)
{
    json_t *chat = json_copy(r->chat);
    if (chat == NULL || json_object_set(chat, "messages", messages) != 0) {
        json_decref(chat);
        return oom(e);
    }
    char *body = json_dumps(chat, JSON_COMPACT);
    json_decref(chat);
    if (body == NULL)
        return oom(e);
    /* The body limit was checked on the Responses body; the chat body of
     * a long stored conversation may be longer. */
    struct rt_openai_cfg c = *cfg;
    c.max_body_bytes = 0;
    int rc = rt_openai_parse_chat(&c, body, strlen(body), g, e);
    free(body);
    if (rc != 0) {
        /* The chat API's names of the fields that were renamed. */
        if (strncmp(e->param, "messages", 8) == 0)
            snprintf(e->param, sizeof(e->param), "input");
        else if (strcmp(e->param, "max_completion_tokens") == 0)
            snprintf(e->param, sizeof(e->param), "max_output_tokens");
        else if (strncmp(e->param, "response_format", 15) == 0)
            snprintf(e->param, sizeof(e->param), "text.format");
    }
    return rc;
}

/* ---- the answer ---------------------------------------------------------------- */

json_t *rt_responses_output(const char *msg_id, const char *text, size_t len,
                            const struct rt_tool_call *calls, size_t n,
                            const char *status)
{
    json_t *out = json_array();
    if (out == NULL)
        return NULL;
    if (len > 0 || n == 0) {
        json_t *t = json_stringn(text != NULL ? text : "", len);
        json_t *m = json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:o, s:[]}]}",
                              "id", msg_id, "type", "message", "status", status,
                              "role", "assistant", "content", "type",
                              "output_text", "text",
                              t != NULL ? t : json_string(""), "annotations");
        if (m == NULL || json_array_append_new(out, m) != 0) {
            json_decref(out);
            return NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        char id[RT_RESP_ID_MAX];
        /* The item id follows the call id's random part. */
        const char *tail = strchr(calls[i].id, '_');
        snprintf(id, sizeof(id), "fc_%.40s",
                 tail != NULL ? tail + 1 : calls[i].id);
        json_t *f = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id,
                              "type", "function_call", "status", "completed",
                              "call_id", calls[i].id, "name", calls[i].name,
                              "arguments", calls[i].arguments);
        if (f == NULL || json_array_append_new(out, f) != 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

json_t *rt_responses_object(const struct rt_responses_request *r,
                            const struct rt_responses_result *res)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:O, s:b, s:n, s:n}", "id",
                          res->id, "object", "response", "created_at",
                          (json_int_t)res->created, "status", res->status,
                          "model", res->model, "output", res->output, "store",
                          res->store, "error", "incomplete_details");
    if (o == NULL)
        return NULL;
    int bad = 0;
    if (res->error != NULL)
        bad |= json_object_set_new(o, "error",
                                   json_pack("{s:s, s:s}", "code",
                                             res->error->code != NULL
                                                 ? res->error->code
                                                 : "server_error",
                                             "message", res->error->message));
    if (res->incomplete != NULL)
        bad |= json_object_set_new(
            o, "incomplete_details",
            json_pack("{s:s}", "reason", res->incomplete));
    bad |= json_object_set_new(
        o, "instructions",
        r->instructions != NULL ? json_incref(r->instructions) : json_null());
    bad |= json_object_set_new(
        o, "previous_response_id",
        res->previous_id != NULL ? json_string(res->previous_id) : json_null());
    bad |= json_object_set_new(o, "metadata",
                               r->metadata != NULL ? json_incref(r->metadata)
                                                   : json_object());
    bad |= json_object_set_new(
        o, "tools", r->tools != NULL ? json_incref(r->tools) : json_array());
    bad |= json_object_set_new(o, "tool_choice",
                               r->tool_choice != NULL
                                   ? json_incref(r->tool_choice)
                                   : json_string("auto"));
    bad |= json_object_set(o, "text", r->text);
    bad |= json_object_set_new(o, "parallel_tool_calls", json_true());
    bad |= json_object_set_new(o, "temperature", json_real(1.0));
    bad |= json_object_set_new(o, "top_p", json_real(1.0));
    bad |= json_object_set_new(o, "max_output_tokens", json_null());
    bad |= json_object_set_new(o, "reasoning", json_null());
    bad |= json_object_set_new(o, "truncation", json_string("disabled"));
    bad |= json_object_set_new(o, "user", json_null());
    /* What the request set overrides the defaults above. */
    bad |= json_object_update(o, r->echo);
    /* The output's text, as the SDKs' output_text convenience reads it. */
    if (res->usage != NULL) {
        const struct rt_usage *u = res->usage;
        bad |= json_object_set_new(
            o, "usage",
            json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens",
                      (json_int_t)u->prompt_tokens, "input_tokens_details",
                      "cached_tokens", (json_int_t)u->cached_tokens,
                      "output_tokens", (json_int_t)u->completion_tokens,
                      "output_tokens_details", "reasoning_tokens",
                      (json_int_t)0, "total_tokens",
                      (json_int_t)(u->prompt_tokens + u->completion_tokens)));
    } else {
        bad |= json_object_set_new(o, "usage", json_null());
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int rt_responses_event(const char *type, json_t *data, int64_t *seq, char **out,
                       size_t *out_len)
{
    if (data == NULL)
        return TG_ENOMEM;
    json_t *ev = json_pack("{s:s, s:I}", "type", type, "sequence_number",
                           (json_int_t)*seq);
    if (ev == NULL || json_object_update(ev, data) != 0) {
        json_decref(ev);
        json_decref(data);
        return TG_ENOMEM;
    }
    json_decref(data);
    char *js = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    if (js == NULL)
        return TG_ENOMEM;
    size_t n = strlen(type) + strlen(js) + 32;
    *out = malloc(n);
    if (*out == NULL) {
        free(js);
        return TG_ENOMEM;
    }
    *out_len = (size_t)snprintf(*out, n, "event: %s\ndata: %s\n\n", type, js);
    free(js);
    (*seq)++;
    return 0;
}

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"

int rt_responses_split_think(const char *t, size_t n, size_t *r_off,
                             size_t *r_len, size_t *c_off)
{
    size_t i = 0;
    while (i < n &&
           (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t'))
        i++;
    const size_t ol = sizeof(THINK_OPEN) - 1, cl = sizeof(THINK_CLOSE) - 1;
    const char *close = NULL;
    size_t start = 0;
    if (n - i >= ol && memcmp(t + i, THINK_OPEN, ol) == 0) {
        start = i + ol;
    } else {
        /* A generation prompt that opened the section itself: the output
         * starts inside it and closes it. */
        close = memmem(t, n, THINK_CLOSE, cl);
        if (close == NULL) {
            *r_off = *r_len = 0;
            *c_off = 0;
            return 0;
        }
    }
    if (close == NULL)
        close = memmem(t + start, n - start, THINK_CLOSE, cl);
    size_t end = close != NULL ? (size_t)(close - t) : n;
    size_t c = close != NULL ? end + cl : n;
    while (c < n && (t[c] == '\n' || t[c] == '\r'))
        c++;
    /* The template's newlines around the thought are not part of it. */
    while (start < end && t[start] == '\n')
        start++;
    while (end > start && t[end - 1] == '\n')
        end--;
    *r_off = start;
    *r_len = end - start;
    *c_off = c;
    return 1;
}

json_t *rt_responses_reasoning_item(const char *id, const char *text,
                                    size_t len, const char *status)
{
    json_t *t = json_stringn(text != NULL ? text : "", len);
    if (t == NULL)
        return NULL;
    return json_pack("{s:s, s:s, s:s, s:[], s:[{s:s, s:o}]}", "id", id, "type",
                     "reasoning", "status", status, "summary", "content",
                     "type", "reasoning_text", "text", t);
}

int rt_responses_take_thought(bool thinks, const char *rs_id,
                              const char *status, const char **text,
                              size_t *len, json_t **thought)
{
    size_t r_off, r_len, c_off;
    *thought = NULL;
    if (!thinks ||
        !rt_responses_split_think(*text, *len, &r_off, &r_len, &c_off))
        return 0;
    *thought = rt_responses_reasoning_item(rs_id, *text + r_off, r_len, status);
    if (*thought == NULL)
        return TG_ENOMEM;
    *text += c_off;
    *len -= c_off;
    return 0;
}

json_t *rt_responses_thought_first(json_t *thought, json_t *out)
{
    if (out != NULL && thought != NULL &&
        json_array_insert(out, 0, thought) != 0) {
        json_decref(out);
        out = NULL;
    }
    json_decref(thought);
    return out;
}
