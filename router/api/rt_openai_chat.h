/*
 * rt_openai_chat.h — the chat of a request (common/chat/ct_chat.h): its
 * messages, tools and template options read from OpenAI JSON, and the one
 * check of a conversation that every front end (the HTTP API's JSON, the
 * gRPC API's messages, the Responses API's items) runs before the core
 * takes it; the constraint a tool_choice asks for.
 *
 * Errors fill *e (kind, code, param naming the field, message). Pure
 * functions of their inputs; any thread.
 */
#ifndef RT_OPENAI_CHAT_H
#define RT_OPENAI_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/chat/ct_chat.h"
#include "router/api/rt_openai.h"

/* The required, non-empty "messages" array of root into c->messages (the
 * JSON shapes checked here: roles, content strings or text parts, assistant
 * tool_calls {id, type "function", function {name, arguments}}, tool
 * messages' tool_call_id; then rt_chat_check). Arguments given as an
 * object rather than OpenAI's JSON string are kept as their JSON text. */
int rt_openai_chat_parse_messages(const json_t *root, struct ct_chat *c,
                                  struct rt_request_error *e);

/* What a request's tool_choice and parallel_tool_calls ask. */
struct rt_tool_sel {
    enum rt_tool_choice choice;
    const char *name; /* RT_TOOL_CHOICE_FUNCTION: the function (borrowed
                         from the request: valid while it is) */
    bool parallel;    /* parallel_tool_calls, default true */
};

/* "tools" of root into c->tools (NULL when absent; each tool's spec is the
 * object as sent, as JSON text), then rt_chat_check_tools; when sel is
 * non-NULL, "tool_choice" (a named function must be among the tools) and
 * "parallel_tool_calls" into *sel. */
int rt_openai_chat_parse_tools(const json_t *root, struct ct_chat *c,
                               struct rt_tool_sel *sel,
                               struct rt_request_error *e);

/* Checks a conversation however it was read: at least one message; a
 * tool_calls list only on an assistant message, each call with an id of 1
 * to RT_OPENAI_MAX_ID_BYTES bytes and a non-empty name; content present
 * unless the assistant made calls; a name of at most RT_OPENAI_MAX_ID_BYTES
 * bytes; a tool message with a tool_call_id of 1 to RT_OPENAI_MAX_ID_BYTES
 * bytes; every string valid UTF-8 (a JSON body's are; protobuf-c does not
 * check). Params name the field as "messages[i].tool_calls[k].id". */
int rt_chat_check(const struct ct_chat *c, struct rt_request_error *e);

/* Checks the tools: at most RT_OPENAI_MAX_TOOLS, each name 1 to 64
 * characters of [a-zA-Z0-9_-] (OpenAI's rule), the description valid
 * UTF-8. That parameters is a JSON object the readers check, which parse
 * it anyway. */
int rt_chat_check_tools(const struct ct_tools *t, struct rt_request_error *e);

/* The constraint of tool_choice "required" or a named function
 * (rt_openai_format.c): one or more calls (exactly one of the named
 * function, or one of any tool when parallel_tool_calls is false) in
 * cfg->tool_format, each function's arguments valid against its
 * parameters, as the spec text of common/grammar/gm_spec.h into *grammar
 * (checked with gm_spec_check; *param then "tools"). Nothing for "none",
 * nor for "auto" without a strict tool; "auto" with one gets a triggered
 * spec: free text, each call held to the tools once its trigger appears
 * (docs/API.md). 400 naming the field when the template has no tool-call
 * format, *grammar is set already (response_format), or a schema is
 * refused. */
int rt_openai_tool_grammar(const struct rt_openai_cfg *cfg,
                           const struct ct_tools *tools,
                           const struct rt_tool_sel *sel, char **grammar,
                           const char **param, struct rt_request_error *e);

#endif /* RT_OPENAI_CHAT_H */
