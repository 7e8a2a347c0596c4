/*
 * rt_responses.h — the OpenAI Responses API (POST /v1/responses) as pure
 * functions: a request body read into the chat-completions request it
 * means (so the chat path parses, renders, constrains and generates it:
 * one engine for both APIs), the items of a conversation turned into chat
 * messages, and the Response object and stream events written. No I/O,
 * no store, no tokenizer: the front ends hold the conversations
 * (router/core/rt_respstore.h) and drive them (rt_api_http_resp.c, and
 * rt_api_cont.h, which the gRPC API shares).
 *
 * The request (docs/API.md "Responses"): model; input (a string: one user
 * message; or items: {"type": "message"} (or no type) with role user,
 * system, developer or assistant and content a string or parts
 * input_text / output_text; function_call {call_id, name, arguments};
 * function_call_output {call_id, output}; reasoning {content
 * [reasoning_text] or summary}, an earlier turn's thought, given to the
 * next assistant message as reasoning_content; item_reference {id}, an output
 * item of a stored response, which the front end resolves); instructions (a system message
 * before the input); max_output_tokens; temperature, top_p and the
 * sampling extensions the chat API takes (top_k, min_p, seed,
 * repetition_penalty ..., passed through as sent); tools (function tools
 * {type "function", name, description, parameters, strict}); tool_choice
 * ("auto", "none", "required", {type "function", name});
 * parallel_tool_calls; text.format (text, json_object, json_schema {name,
 * schema, strict}: the chat API's response_format); stream; store
 * (default true); previous_response_id; metadata (at most 16 string
 * values); user; reasoning (accepted; its effort is not used). Other
 * item types (images, files) are a 400 naming the item;
 * so are top_logprobs, background, a non-empty include and conversation,
 * which would change the answer and are not served.
 *
 * Items are kept in their Responses shape (the input items listing and a
 * later re-render read them back): a string input becomes one user message
 * item with an input_text part, and every item gets an id.
 *
 * Thread: caller data only; any thread.
 */
#ifndef RT_RESPONSES_H
#define RT_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "router/api/rt_openai.h"
#include "router/api/rt_toolcall.h"

#define RT_RESPONSES_MAX_METADATA 16  /* OpenAI's limits on metadata: keys, */
#define RT_RESPONSES_MAX_META_KEY 64  /* key bytes, */
#define RT_RESPONSES_MAX_META_VAL 512 /* value bytes */

/* A parsed POST /v1/responses body. Zeroed is empty; every member is
 * owned (json_t: one reference) and freed by rt_responses_request_free. */
struct rt_responses_request {
    char *previous_id; /* previous_response_id; NULL = none */
    bool store;        /* default true */
    bool stream;
    json_t *input;        /* the new input items (array, Responses shape,
                            each with an "id") */
    json_t *instructions; /* string or NULL */
    json_t *metadata;     /* object of strings or NULL */
    json_t *tools;        /* as sent (array) or NULL */
    json_t *tool_choice;  /* as sent or NULL */
    json_t *text;         /* {"format": {...}} as the response echoes it */
    json_t *echo;         /* the request's fields the Response echoes:
                            temperature, top_p, max_output_tokens,
                            parallel_tool_calls, user, reasoning */
    json_t *chat;         /* the chat-completions body it means, without
                            "messages" (and without "stream": the front
                            end streams itself) */
};

/* Parses and checks a body of `len` bytes (cfg: the body limit and the
 * served model) into *out (zeroed first). Returns 0, or fills *e and
 * returns TG_EFORMAT / TG_EUNSUPPORTED (400 naming the field),
 * TG_ENOTFOUND (404 model), TG_ETOOBIG (413) or TG_ENOMEM (500), *out
 * left empty. Item ids are drawn with getrandom (rt_respstore_new_id). */
int rt_responses_parse(const struct rt_openai_cfg *cfg, const char *body,
                       size_t len, struct rt_responses_request *out,
                       struct rt_request_error *e);

/* Releases everything r owns and zeroes it. Safe on a zeroed request. */
void rt_responses_request_free(struct rt_responses_request *r);

/* Appends to the JSON array `messages` the chat messages of the items
 * `items` (Responses shape, as rt_responses_parse keeps them): a message
 * item as a message of its role with its parts' texts joined; consecutive
 * function_call items as one assistant message with their tool_calls; a
 * function_call_output as a tool message. `param` names the array in
 * errors ("input"). Returns 0, or TG_EFORMAT / TG_ENOMEM with *e. */
int rt_responses_messages(const json_t *items, const char *param,
                          json_t *messages, struct rt_request_error *e);

/* Parses the chat request that `r` means with the chat messages
 * `messages` (borrowed) through rt_openai_parse_chat into *g (the same
 * codes and errors; a param names the chat field). */
int rt_responses_chat(const struct rt_openai_cfg *cfg,
                      const struct rt_responses_request *r, json_t *messages,
                      struct rt_gen_request *g, struct rt_request_error *e);

/* The outcome of a generation, as the Response object reports it. */
struct rt_responses_result {
    const char *id; /* "resp_..." */
    const char *model;
    int64_t created;        /* unix seconds */
    const char *status;     /* "completed", "incomplete", "failed",
                               "in_progress" */
    const char *incomplete; /* "max_output_tokens" or NULL */
    const struct rt_request_error *error; /* status "failed"; else NULL */
    const char *previous_id;              /* NULL = none */
    bool store;
    json_t *output;               /* the output items (array, borrowed) */
    const struct rt_usage *usage; /* NULL: usage null */
};

/* The output items of `text` (len bytes; a message item with one
 * output_text part, id "msg_" + `msg_id`, left out when there is no text
 * and there are calls) and the calls calls[0..n) (function_call items, id
 * "fc_..." from the call's id), in a new array; NULL when out of memory.
 * `status` is the items' ("completed", "incomplete"). */
json_t *rt_responses_output(const char *msg_id, const char *text, size_t len,
                            const struct rt_tool_call *calls, size_t n,
                            const char *status);

/* The Response object of `res` with the echoed fields of `r` (a new
 * reference; NULL when out of memory). */
json_t *rt_responses_object(const struct rt_responses_request *r,
                            const struct rt_responses_result *res);

/* One stream event: "event: <type>\ndata: <json>\n\n" of `data` (stolen:
 * "type" and "sequence_number" set here from `type` and *seq, which is
 * then advanced) into a malloc'd *out. Returns 0 or TG_ENOMEM. */
int rt_responses_event(const char *type, json_t *data, int64_t *seq, char **out,
                       size_t *out_len);

/* A thinking template's output `t` (n bytes) split into its reasoning and
 * its answer: returns 1 when it holds a think section (starting with
 * "<think>" after whitespace, or closed by "</think>" when the generation
 * prompt opened it), with the thought at t[*r_off, +*r_len) (the newlines
 * around it dropped; to the end when it was cut before "</think>") and the
 * answer from *c_off; 0 when it has none (*c_off 0). */
int rt_responses_split_think(const char *t, size_t n, size_t *r_off,
                             size_t *r_len, size_t *c_off);

/* The thought of a whole answer: when `thinks` (the model's template writes
 * <think>) and *text (*len bytes) holds a think section
 * (rt_responses_split_think), *thought is its reasoning item `rs_id` (a new
 * reference) and *text / *len are advanced to the answer after it; else
 * *thought is NULL and the text stays. Returns 0 or TG_ENOMEM. */
int rt_responses_take_thought(bool thinks, const char *rs_id,
                              const char *status, const char **text,
                              size_t *len, json_t **thought);

/* `out` (the answer's output items) with `thought` (NULL: none) first;
 * both stolen. NULL when out is NULL or out of memory. */
json_t *rt_responses_thought_first(json_t *thought, json_t *out);

/* A reasoning output item {id, type "reasoning", status, summary [],
 * content [{type "reasoning_text", text}]} (a new reference; NULL when out
 * of memory). */
json_t *rt_responses_reasoning_item(const char *id, const char *text,
                                    size_t len, const char *status);

/* The output text of the message item `item` (its output_text parts
 * joined), or "" (borrowed from item). */
const char *rt_responses_item_text(const json_t *item);

#endif /* RT_RESPONSES_H */
