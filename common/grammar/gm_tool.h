/*
 * gm_tool.h — grammars of tool calls in a chat template's own output
 * format: literal text around a JSON object naming the function, with
 * its arguments constrained by the function's `parameters` schema; one
 * or more calls (OpenAI tool_choice "required", a named function, or a
 * strict tool once its call has started).
 *
 * One call of function f is, byte for byte,
 *     begin  json_string(f.name)  middle  ARGS(f)  end
 * and calls are joined by `sep`. The formats the router's tool-call
 * parser reads (router/api/rt_toolcall.h) are:
 *   Hermes / Qwen:  begin  "<tool_call>\n{\"name\": "
 *                   middle ", \"arguments\": "
 *                   end    "}\n</tool_call>"      sep "\n"
 *   Llama-3 JSON:   begin  "{\"name\": "
 *                   middle ", \"parameters\": "
 *                   end    "}"                    sep "; "
 * (GM_TOOL_HERMES and GM_TOOL_LLAMA3_JSON below). ARGS is the schema of
 * `parameters` compiled by gm_schema.h (an absent schema: any JSON
 * object, as OpenAI treats a function without parameters). The names are
 * written as jansson writes a JSON string (UTF-8, minimal escapes).
 *
 * Constraining only once a call starts (strict tools with tool_choice
 * "auto", or after a thinking block): build the grammar as usual and feed
 * the matcher the text already generated up to the trigger
 * (gm_matcher_accept_bytes with `begin` or its start) when the trigger
 * appears in the output; the grammar then holds from there (gm_spec.h's
 * "triggered" spec carries the trigger; gpu_worker/gw_grammar.h serves it).
 *
 * Thread: as the IR written to.
 */
#ifndef GM_TOOL_H
#define GM_TOOL_H

#include <jansson.h>
#include <stddef.h>

#include "common/grammar/gm_schema.h"

struct gm_tool_format {
    const char *begin;  /* before the name's JSON string */
    const char *middle; /* between the name and the arguments */
    const char *end;    /* after the arguments */
    const char *sep;    /* between two calls */
};

extern const struct gm_tool_format GM_TOOL_HERMES;
extern const struct gm_tool_format GM_TOOL_LLAMA3_JSON;

struct gm_tool_fn {
    const char *name;         /* UTF-8, NUL-terminated */
    const json_t *parameters; /* a JSON Schema, or NULL: any object */
};

/* Adds to j->ir the rule of min_calls..max_calls calls (max_calls 0: no
 * bound; min_calls >= 1) of any of fns[0..n_fns) in format `fmt`, sets it
 * (with no surrounding whitespace) as the IR's start rule, and returns 0 or
 * a negative code with the message in err: the schema errors of
 * gm_schema_compile, prefixed with the function ("tool \"get_weather\"
 * parameters: unsupported keyword \"pattern\" at #/properties/zip"), or
 * TG_EINVAL for no functions, an empty or non-UTF-8 name, or min_calls
 * out of range. */
int gm_tool_compile(struct gm_json *j, const struct gm_tool_format *fmt,
                    const struct gm_tool_fn *fns, size_t n_fns,
                    unsigned min_calls, unsigned max_calls,
                    const struct gm_schema_opts *o, char *err, size_t errlen);

#endif /* GM_TOOL_H */
