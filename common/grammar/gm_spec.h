/*
 * gm_spec.h — a request's constraint as one value: a small JSON document
 * (the "spec") that both the router and the workers compile the same way.
 * Its compact text is the key of the compile cache (gm_cache.h) and what
 * travels from the router to the worker, once per request.
 *
 *   {"type": "json_value"}                       any JSON value
 *   {"type": "json_object"}                      any JSON object
 *                                                (OpenAI json_object)
 *   {"type": "json_schema", "schema": {...}}     a JSON Schema (gm_schema.h)
 *   {"type": "tool_calls", "format": F, "min_calls": 1, "max_calls": 0,
 *    "tools": [{"name": "f", "parameters": {...}}, ...]}
 *                                                calls in a template's
 *                                                format (gm_tool.h); F is
 *                                                "hermes", "llama3_json" or
 *                                                {"begin", "middle", "end",
 *                                                "sep"}; max_calls 0: any
 *   {"type": "triggered", "trigger": T, "anchored": false,
 *    "spec": {"type": "tool_calls", ...}}
 *                                                free text until T appears
 *                                                in the output, then the
 *                                                calls grammar from T's
 *                                                first byte (T a non-empty
 *                                                prefix of the format's
 *                                                begin); see below
 *   {"type": "regex", "pattern": P}              the whole output matches
 *                                                the regular expression P
 *                                                (gm_regex.h's dialect,
 *                                                anchored at both ends as
 *                                                vLLM's and Outlines'
 *                                                fullmatch), raw UTF-8
 *   {"type": "choice", "choices": ["a", ...]}    exactly one of the
 *                                                strings (non-empty list)
 *   {"type": "grammar", "gbnf": G}               the language of the GBNF
 *                                                grammar G from its rule
 *                                                root (gm_gbnf.h)
 * The output of regex, choice and grammar is exactly that text: no
 * whitespace is added around it.
 * A triggered spec compiles to its inner spec's grammar (the cache key
 * still is the whole text); what is free and when the matcher starts is
 * the server's slot state machine (gpu_worker/gw_grammar.h), which reads
 * the trigger with gm_spec_trigger. Not anchored: the output is free text
 * wherever T is absent; at each occurrence of T a matcher starts on T's
 * bytes, and once it is complete (nothing but EOS may follow) the output
 * is free again, so the inner spec allows one call per trigger (Hermes'
 * `<tool_call>` blocks with text between them). Anchored: T counts only
 * as the output's first bytes after whitespace; when it is there the
 * grammar holds to the end of the output, otherwise the whole output is
 * free (the Llama-3 JSON format, where an answer is either calls or
 * text: T is "{").
 * Every kind takes an optional "whitespace": "compact" (the default: at
 * most one space after ':' and ','), "none", "pretty" or "free" (gm_json.h,
 * enum gm_ws; the wide policies bounded by gm_limits.ws_indent) for the
 * JSON it generates (tool calls' arguments included); the format's own
 * text of tool calls is exact. Strings in a spec may hold U+0000.
 *
 * Errors: TG_EFORMAT names what is malformed in the spec; the schema and
 * tool errors of gm_schema.h / gm_tool.h; TG_ETOOBIG when the text is over
 * gm_limits.max_spec_bytes. Threads: any; the functions share nothing.
 */
#ifndef GM_SPEC_H
#define GM_SPEC_H

#include <jansson.h>
#include <stddef.h>

#include "common/grammar/gm_grammar.h"
#include "common/grammar/gm_ir.h"
#include "common/grammar/gm_json.h"
#include "common/grammar/gm_tool.h"

/* Each writes a new spec text (NUL-terminated, caller frees) to *out and
 * its length to *len; returns 0, TG_EINVAL (a bad argument) or
 * TG_ENOMEM. `schema` and parameters are copied. */
int gm_spec_json(int object_only, char **out, size_t *len);
int gm_spec_json_schema(const json_t *schema, char **out, size_t *len);
int gm_spec_tools(const struct gm_tool_format *fmt,
                  const struct gm_tool_fn *fns, size_t n_fns,
                  unsigned min_calls, unsigned max_calls, char **out,
                  size_t *len);

/* Rewrites spec text *spec (*len bytes, owned by the caller, replaced on
 * success) with the whitespace policy `ws` (GM_WS_COMPACT drops the
 * field: the default). Returns 0, TG_EINVAL (not a JSON spec) or
 * TG_ENOMEM (*spec unchanged). */
int gm_spec_whitespace(enum gm_ws ws, char **spec, size_t *len);

/* Specs of the other kinds: a regex of plen bytes (copied; UTF-8), n
 * choices (choices[i] of lens[i] bytes, UTF-8, n > 0), a GBNF grammar of
 * glen bytes. Same returns (TG_EINVAL: NULL, no choices, or text that is
 * not UTF-8 or holds a NUL byte). The pattern and grammar are checked by
 * gm_spec_check, not here. */
int gm_spec_regex(const char *pattern, size_t plen, char **out, size_t *len);
int gm_spec_choice(const char *const *choices, const size_t *lens, size_t n,
                   char **out, size_t *len);
int gm_spec_grammar(const char *gbnf, size_t glen, char **out, size_t *len);

/* The triggered spec of trigger (non-empty, copied) and the tool_calls
 * spec text [inner, inner + inner_len); anchored as described above.
 * Same returns (TG_EINVAL: no trigger, or inner is not JSON). */
int gm_spec_triggered(const char *trigger, int anchored, const char *inner,
                      size_t inner_len, char **out, size_t *len);

/* The trigger of spec text [spec, spec + len): *trigger a new string
 * (caller frees) and *anchored when the spec is of type "triggered", else
 * *trigger NULL. Returns 0, TG_EFORMAT (not JSON, or a triggered spec
 * without a trigger string) or TG_ENOMEM. Checks nothing else: the
 * compile does. */
int gm_spec_trigger(const char *spec, size_t len, char **trigger,
                    int *anchored);

/* Writes the IR of spec text [spec, spec + len) into ir (zeroed or freed;
 * gm_ir_free it either way). `lim` NULL: defaults. Returns 0 or a code
 * with the message in err. */
int gm_spec_to_ir(const char *spec, size_t len, const struct gm_limits *lim,
                  struct gm_ir *ir, char *err, size_t errlen);

/* Everything a compile checks that does not need a vocabulary (the spec,
 * the schema, the automaton's limits, that some document exists): what a
 * router calls to answer 400 before queueing. Milliseconds. */
int gm_spec_check(const char *spec, size_t len, const struct gm_limits *lim,
                  char *err, size_t errlen);

/* gm_spec_to_ir then gm_grammar_compile_ir for vocabulary v. */
int gm_spec_compile(const char *spec, size_t len, const struct gm_vocab *v,
                    const struct gm_limits *lim, struct gm_grammar **out,
                    char *err, size_t errlen);

#endif /* GM_SPEC_H */
