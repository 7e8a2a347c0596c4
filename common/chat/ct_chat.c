/* ct_chat.c — the conversation value (ct_chat.h). */
#include "common/chat/ct_chat.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

const char *ct_tool_format_name(enum ct_tool_format f)
{
    switch (f) {
    case CT_TOOLS_HERMES: return "hermes";
    case CT_TOOLS_LLAMA_JSON: return "llama3_json";
    default: return "none";
    }
}

enum ct_tool_format ct_tool_format_detect(const char *text)
{
    if (text == NULL)
        return CT_TOOLS_NONE;
    if (strstr(text, "<tool_call>") != NULL)
        return CT_TOOLS_HERMES;
    if (strstr(text, "<|start_header_id|>") != NULL &&
        strstr(text, "\"parameters\"") != NULL)
        return CT_TOOLS_LLAMA_JSON;
    return CT_TOOLS_NONE;
}

const char *ct_role_name(enum ct_role r)
{
    switch (r) {
    case CT_ROLE_SYSTEM: return "system";
    case CT_ROLE_USER: return "user";
    case CT_ROLE_ASSISTANT: return "assistant";
    case CT_ROLE_TOOL: return "tool";
    }
    return "user";
}

int ct_role_from_name(const char *s, enum ct_role *out)
{
    static const struct {
        const char *name;
        enum ct_role role;
    } roles[] = {
        {"system", CT_ROLE_SYSTEM}, {"developer", CT_ROLE_SYSTEM},
        {"user", CT_ROLE_USER},     {"assistant", CT_ROLE_ASSISTANT},
        {"tool", CT_ROLE_TOOL},
    };
    for (size_t i = 0; s != NULL && i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(s, roles[i].name) == 0) {
            *out = roles[i].role;
            return 0;
        }
    return TG_EFORMAT;
}

struct ct_tools *ct_tools_new(size_t n)
{
    struct ct_tools *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    if (n > 0 && (t->v = calloc(n, sizeof(*t->v))) == NULL) {
        free(t);
        return NULL;
    }
    t->n = n;
    atomic_init(&t->refs, 1);
    return t;
}

struct ct_tools *ct_tools_ref(struct ct_tools *t)
{
    if (t != NULL)
        atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
    return t;
}

void ct_tools_unref(struct ct_tools *t)
{
    if (t == NULL ||
        atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->v[i].name);
        free(t->v[i].description);
        free(t->v[i].parameters);
        free(t->v[i].spec);
    }
    free(t->v);
    free(t);
}

long ct_tools_find(const struct ct_tools *t, const char *name)
{
    for (size_t i = 0; t != NULL && name != NULL && i < t->n; i++)
        if (t->v[i].name != NULL && strcmp(t->v[i].name, name) == 0)
            return (long)i;
    return -1;
}

void ct_messages_free(struct ct_message *m, size_t n)
{
    for (size_t i = 0; m != NULL && i < n; i++) {
        free(m[i].content);
        free(m[i].name);
        free(m[i].reasoning_content);
        free(m[i].tool_call_id);
        for (size_t k = 0; k < m[i].n_calls; k++) {
            free(m[i].calls[k].id);
            free(m[i].calls[k].name);
            free(m[i].calls[k].arguments);
        }
        free(m[i].calls);
    }
    free(m);
}

void ct_chat_free(struct ct_chat *c)
{
    ct_messages_free(c->messages, c->n_messages);
    ct_tools_unref(c->tools);
    free(c->kwargs);
    memset(c, 0, sizeof(*c));
}

static size_t len0(const char *s)
{
    return s != NULL ? strlen(s) : 0;
}

size_t ct_chat_bytes(const struct ct_chat *c, size_t cap)
{
    size_t n = len0(c->kwargs);
    for (size_t i = 0; i < c->n_messages && n <= cap; i++) {
        const struct ct_message *m = &c->messages[i];
        n += len0(m->content) + len0(m->name) + len0(m->reasoning_content) +
             len0(m->tool_call_id);
        for (size_t k = 0; k < m->n_calls && n <= cap; k++)
            n += len0(m->calls[k].id) + len0(m->calls[k].name) +
                 len0(m->calls[k].arguments);
    }
    for (size_t i = 0; c->tools != NULL && i < c->tools->n && n <= cap; i++)
        n += len0(c->tools->v[i].spec);
    return n;
}
