/*
 * ct_chat.h — a conversation as the chat template renders it, in no
 * protocol's terms: messages (role, text, the tool calls an assistant made,
 * the call a tool result answers), the tools offered, and the template's
 * options. The one value type of a chat across the router: its front ends
 * (router/api/: OpenAI JSON, gRPC messages, Responses items) build it and
 * check it, the core carries it to the template (ct_template_render_chat).
 *
 * What is JSON by nature stays JSON text here, unparsed: a tool call's
 * arguments, a tool's parameters schema, the chat-template keyword
 * arguments; the template renderer parses them. The front ends have
 * checked them already (each is a JSON object, or, for arguments, any text:
 * arguments that are not JSON reach the template as a string, as vLLM
 * passes them).
 *
 * Every string is valid UTF-8 without NUL bytes: the front ends check it
 * (rt_chat_check), and the renderer does not check it again.
 *
 * Ownership: every string and array of a struct ct_chat is malloc'd and
 * owned by it (ct_chat_free); the tools are shared, reference-counted
 * (ct_tools_ref / ct_tools_unref; the count is atomic, so requests on
 * different threads may share one list). Messages are plain values: a
 * caller may build a struct ct_chat of borrowed messages (not freed) to
 * render a variation of a conversation.
 *
 * Thread: plain data; the reference count is the only shared state.
 */
#ifndef CT_CHAT_H
#define CT_CHAT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

enum ct_role {
    CT_ROLE_SYSTEM = 0, /* "system"; "developer" is read as system (OpenAI
                           made it the new name of the system role) */
    CT_ROLE_USER,
    CT_ROLE_ASSISTANT,
    CT_ROLE_TOOL,
};

/* Returns "system", "user", "assistant" or "tool" (static). */
const char *ct_role_name(enum ct_role r);

/* The role named `s` ("system", "developer", "user", "assistant", "tool";
 * exact spelling) into *out. Returns 0 or TG_EFORMAT for any other name. */
int ct_role_from_name(const char *s, enum ct_role *out);

enum ct_tool_format {
    CT_TOOLS_NONE = 0,   /* no known tool-call output format */
    CT_TOOLS_HERMES,     /* <tool_call>\n{"name", "arguments"}\n</tool_call> */
    CT_TOOLS_LLAMA_JSON, /* the whole output is {"name", "parameters"} */
};

/* Returns "none", "hermes" or "llama3_json". */
const char *ct_tool_format_name(enum ct_tool_format f);

/* Recognizes the tool-call output format from template text. */
enum ct_tool_format ct_tool_format_detect(const char *text);

/* A call of a tool an assistant made. */
struct ct_tool_call {
    char *id;        /* non-empty */
    char *name;      /* the function's name, non-empty */
    char *arguments; /* as sent: the arguments object's JSON text (text
                        that is not JSON reaches the template as a
                        string) */
};

/* One message. */
struct ct_message {
    enum ct_role role;
    char *content;              /* never NULL ("" when content_null); text
                                parts joined by "\n" as vLLM does */
    bool content_null;          /* no content (an assistant message with tool
                                calls only): the template gets "", as vLLM
                                passes it */
    char *name;                 /* NULL = absent */
    char *reasoning_content;    /* assistant only; NULL = absent */
    char *tool_call_id;         /* tool role only (required there) */
    struct ct_tool_call *calls; /* assistant: (n_calls) */
    size_t n_calls;
};

/* A function the model may call. */
struct ct_tool {
    char *name;        /* [a-zA-Z0-9_-], 1 to 64 characters */
    char *description; /* NULL = absent */
    char *parameters;  /* JSON Schema object as JSON text; NULL = absent */
    bool strict;       /* "strict": true (constrained under "auto") */
    char *spec;        /* the tool as the template sees it: the JSON text
                          of {"type": "function", "function": {...}}, as
                          the client sent it where it sent JSON */
};

/* The tools of a request, shared by its parallel samples. */
struct ct_tools {
    atomic_int refs;
    size_t n;
    struct ct_tool *v; /* (n) */
};

/* A new list of n zeroed tools with one reference, or NULL (out of
 * memory). */
struct ct_tools *ct_tools_new(size_t n);

/* Takes a reference; returns t. NULL is fine. */
struct ct_tools *ct_tools_ref(struct ct_tools *t);

/* Drops a reference, freeing the list with the last one. NULL is fine. */
void ct_tools_unref(struct ct_tools *t);

/* The index of the tool named `name` in t, or -1 (also for t NULL). */
long ct_tools_find(const struct ct_tools *t, const char *name);

/* A conversation and the template's options. Zeroed is empty. */
struct ct_chat {
    struct ct_message *messages; /* (n_messages), owned */
    size_t n_messages;
    struct ct_tools *tools;      /* one reference, or NULL: no tools (the
                                    template gets None); n == 0 is an empty
                                    list given */
    bool add_generation_prompt;  /* OpenAI / vLLM default true */
    bool continue_final_message; /* exclusive with the above */
    char *kwargs;                /* chat_template_kwargs: a JSON object's
                                    text (extra template variables), owned;
                                    NULL = none */
};

/* Frees messages[0..n) and the array. NULL is fine. */
void ct_messages_free(struct ct_message *m, size_t n);

/* Frees what c owns and zeroes it. Safe on a zeroed chat. */
void ct_chat_free(struct ct_chat *c);

/* The bytes of text c holds (strings of its messages and tools, the
 * kwargs), counted up to `cap` and a little past it at most: what
 * rendering it reads, for choosing where to render it. */
size_t ct_chat_bytes(const struct ct_chat *c, size_t cap);

#endif /* CT_CHAT_H */
