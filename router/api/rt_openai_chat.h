/*
 * rt_openai_chat.h — the chat messages and tools of a request, parsed and
 * checked as the OpenAI API defines them: what both front ends (the HTTP
 * API's JSON and the gRPC API's chat, converted to the same JSON) take a
 * chat request's "messages", "tools" and "tool_choice" with.
 *
 * Errors fill *e (status, code, param naming the field, message). Pure
 * functions of their inputs; any thread.
 */
#ifndef RT_OPENAI_CHAT_H
#define RT_OPENAI_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "router/api/rt_openai.h"

/* The required, non-empty "messages" array into a malloc'd message array
 * the caller frees with rt_openai_chat_messages_free, and into *chat (a new
 * JSON array: the messages as the chat template sees them, rt_openai.h). */
int rt_openai_chat_parse_messages(const json_t *root, struct rt_message **out,
                                  size_t *n_out, json_t **chat,
                                  struct rt_request_error *e);

/* "tools" into *tools (a new reference to the validated array, NULL when
 * absent) and, when choice is non-NULL, "tool_choice" and
 * "parallel_tool_calls" (validated; the latter is not enforced). */
int rt_openai_chat_parse_tools(const json_t *root, json_t **tools,
                               enum rt_tool_choice *choice,
                               struct rt_request_error *e);

/* The constraint of tool_choice "required" or a named function
 * (rt_openai_format.c): one or more calls (exactly one of the named
 * function, or one of any tool when "parallel_tool_calls" is false) in
 * cfg->tool_format, each function's arguments valid against its
 * "parameters", as the spec text of common/grammar/gm_spec.h into
 * *grammar (checked with gm_spec_check). Nothing for "none", nor for
 * "auto" without a "strict": true tool; "auto" with one gets a triggered
 * spec: free text, each call held to the tools once its trigger appears
 * (docs/API.md). 400 naming the field when
 * the template has no tool-call format, *grammar is set already
 * (response_format), or a schema is refused. `tools` and root as
 * rt_openai_chat_parse_tools saw them. */
int rt_openai_tool_grammar(const struct rt_openai_cfg *cfg, const json_t *root,
                           const json_t *tools, enum rt_tool_choice choice,
                           char **grammar, struct rt_request_error *e);

/* Frees messages[0..n) and the array; NULL is fine. */
void rt_openai_chat_messages_free(struct rt_message *m, size_t n);

#endif /* RT_OPENAI_CHAT_H */
