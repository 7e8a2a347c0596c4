/*
 * rt_toolcall.h — tool calls in model output: an incremental parser that
 * splits generated text into content and OpenAI tool calls, for the two
 * output formats the chat template module recognizes (ct_tool_format):
 *
 *   hermes       Qwen2.5 / Qwen3 / Hermes: every
 *                <tool_call>{"name": ..., "arguments": {...}}</tool_call>
 *                block is a call ("parameters" is accepted for
 *                "arguments"); text outside the blocks is content.
 *                Whitespace (space, tab, CR, LF) that touches a call is
 *                dropped: before a <tool_call>, right after a </tool_call>,
 *                and at the end of an output that made calls. A final
 *                block cut off without </tool_call> is a call only when its
 *                JSON is complete.
 *   llama3_json  Llama-3.x: the whole output (after optional whitespace and
 *                an optional <|python_tag|>) is one JSON object
 *                {"name": ..., "parameters": {...}} ("arguments" accepted),
 *                or several separated by ';'. Output that starts with
 *                anything else is plain content, streamed as it comes;
 *                output starting with '{' is held to the end.
 *
 * Malformed output is never an error: a block or object that does not parse
 * as a call (bad JSON, no "name", arguments not an object) is returned as
 * the content it was, byte for byte. Each call gets an id "call_" + 16 hex
 * digits derived from the parser's seed and its index, and its arguments
 * as the JSON text Python's json.dumps(arguments, ensure_ascii=False)
 * writes (what vLLM returns).
 *
 * The same state machine serves streaming and whole outputs: feeding the
 * text in any number of pieces yields, concatenated, the same content and
 * the same calls as feeding it at once (text that may start a tool call is
 * held back until it is decided). Pieces may split anywhere, even inside a
 * UTF-8 sequence.
 *
 * Thread: one parser per request; not shared.
 */
#ifndef RT_TOOLCALL_H
#define RT_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_buf.h"
#include "common/chat/ct_template.h"

struct rt_tool_call {
    char *id;        /* "call_<16 hex digits>" */
    char *name;      /* the function name */
    char *arguments; /* JSON text of the arguments object */
};

/* Parser state. Zeroed is not valid: use rt_tc_init. Fields are private. */
struct rt_tc_parser {
    enum ct_tool_format fmt;
    uint64_t seed;
    int state;
    bool after_call;  /* hermes: text since the last call touches it */
    char *buf;        /* held input */
    size_t n, cap;
    char *pre_ws;     /* hermes: whitespace before the open <tool_call> */
    size_t pre_n, pre_cap;
    char *out;        /* content released by the current feed */
    size_t out_n, out_cap;
    struct rt_tool_call *calls;
    size_t n_calls, cap_calls;
    size_t reported;  /* calls already returned in a delta */
};

/* What one feed released: content text and the calls completed. Pointers
 * stay valid until the next call on the parser. */
struct rt_tc_delta {
    const char *content;
    size_t content_len;
    const struct rt_tool_call *calls;
    size_t n_calls;
    size_t first_index; /* index of calls[0] among all calls of the output */
};

/* Prepares p for format fmt (CT_TOOLS_NONE passes all text through) with
 * `seed` for the call ids. */
void rt_tc_init(struct rt_tc_parser *p, enum ct_tool_format fmt,
                uint64_t seed);

/* Feeds len bytes of output. Fills *d with what is decided. Returns 0 or
 * TG_ENOMEM (the parser is then unusable). */
int rt_tc_feed(struct rt_tc_parser *p, const char *text, size_t len,
               struct rt_tc_delta *d);

/* Ends the output: everything held is decided and returned in *d. Returns
 * 0 or TG_ENOMEM. Feeding after finishing is not allowed. */
int rt_tc_finish(struct rt_tc_parser *p, struct rt_tc_delta *d);

/* Feeds len bytes and, when `last`, ends the output (rt_tc_feed, then
 * rt_tc_finish): the content the two released, one after the other, is
 * appended to *content (the caller's, freed with tg_buf_free), and
 * *first is the index of the first call they completed (rt_tc_calls
 * holds them all). Returns 0 or TG_ENOMEM. */
int rt_tc_take(struct rt_tc_parser *p, const char *text, size_t len, bool last,
               struct tg_buf *content, size_t *first);

/* All calls found so far, in order (borrowed). */
const struct rt_tool_call *rt_tc_calls(const struct rt_tc_parser *p,
                                       size_t *n);

/* Releases everything p holds; safe on a zeroed parser. */
void rt_tc_free(struct rt_tc_parser *p);

#endif /* RT_TOOLCALL_H */
