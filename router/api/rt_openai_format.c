/*
 * rt_openai_format.c — structured outputs of a request (DESIGN.md §4.11):
 * OpenAI's `response_format` turned into the spec text of
 * common/grammar/gm_spec.h, checked with gm_spec_check before the request
 * is queued, so a schema the engine cannot serve is a 400 naming the
 * keyword or the limit, never a failure at the worker.
 *
 *   {"type": "text"}                       no constraint
 *   {"type": "json_object"}                any JSON object
 *   {"type": "json_schema", "json_schema": {"name", "description"?,
 *    "schema", "strict"?}}                 a document valid against schema
 *
 * `strict` false is served like true: the output is constrained either
 * way (OpenAI's non-strict mode only promises less). The schema is
 * required: a json_schema without one says nothing to enforce.
 *
 * Tool calls: tool_choice "required" or a named function constrains the
 * whole output to calls in the chat template's format (gm_tool.h), each
 * function's arguments valid against its "parameters".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_spec.h"
#include "common/grammar/gm_tool.h"
#include "router/api/rt_openai_chat.h"
#include "router/api/rt_openai_internal.h"

#define FORMAT_NAME_MAX 64 /* OpenAI: ^[a-zA-Z0-9_-]{1,64}$ */

/* Checks spec text (owned, NUL-terminated) and moves it into *out, or
 * frees it and fills *e (400 naming `param`). */
int rt_openai__grammar_take(char *spec, size_t len, const char *param,
                            char **out, struct rt_request_error *e)
{
    char msg[384]; /* rt_request_error.message */
    int rc = gm_spec_check(spec, len, NULL, msg, sizeof(msg));
    if (rc == TG_ENOMEM) {
        free(spec);
        return rt_openai__oom(e);
    }
    if (rc != 0) {
        free(spec);
        return rt_openai__fail(
            e, rc == TG_EUNSUPPORTED ? TG_EUNSUPPORTED : TG_EFORMAT,
            RT_REQ_ERR_INVALID,
            rc == TG_ETOOBIG        ? "schema_too_large"
            : rc == TG_EUNSUPPORTED ? "unsupported_schema"
                                    : "invalid_schema",
            param, "%s", msg);
    }
    free(*out);
    *out = spec;
    return 0;
}

static int parse_json_schema(const json_t *v, char **out,
                             struct rt_request_error *e)
{
    json_t *js = rt_openai__member(v, "json_schema");
    if (js == NULL)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter",
                               "response_format.json_schema",
                               "response_format of type 'json_schema' needs "
                               "a 'json_schema' object");
    if (!json_is_object(js))
        return rt_openai__bad_type(e, "response_format.json_schema",
                                   "an object");
    json_t *name = rt_openai__member(js, "name");
    if (name != NULL &&
        (!json_is_string(name) || json_string_length(name) > FORMAT_NAME_MAX))
        return rt_openai__bad_type(e, "response_format.json_schema.name",
                                   "a string of at most 64 characters");
    json_t *strict = rt_openai__member(js, "strict");
    if (strict != NULL && !json_is_boolean(strict))
        return rt_openai__bad_type(e, "response_format.json_schema.strict",
                                   "a boolean");
    json_t *schema = rt_openai__member(js, "schema");
    if (schema == NULL)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "missing_required_parameter",
                               "response_format.json_schema.schema",
                               "response_format.json_schema needs a 'schema' "
                               "(a JSON Schema object) to constrain the "
                               "output with");
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return rt_openai__bad_type(e, "response_format.json_schema.schema",
                                   "a JSON Schema (an object)");
    char *spec = NULL;
    size_t len = 0;
    int rc = gm_spec_json_schema(schema, &spec, &len);
    if (rc == TG_ENOMEM)
        return rt_openai__oom(e);
    if (rc != 0)
        return rt_openai__fail(
            e, TG_EFORMAT, RT_REQ_ERR_INVALID, "invalid_schema",
            "response_format.json_schema.schema",
            "the schema cannot be used (%s)", tg_strerror(rc));
    return rt_openai__grammar_take(
        spec, len, "response_format.json_schema.schema", out, e);
}

int rt_openai_parse_response_format(const json_t *root, char **out,
                                    struct rt_request_error *e)
{
    json_t *v = rt_openai__member(root, "response_format");
    if (v == NULL)
        return 0;
    if (!json_is_object(v))
        return rt_openai__bad_type(e, "response_format", "an object");
    json_t *t = json_object_get(v, "type");
    if (!json_is_string(t))
        return rt_openai__bad_type(e, "response_format.type", "a string");
    const char *ts = json_string_value(t);
    if (strcmp(ts, "text") == 0)
        return 0;
    if (strcmp(ts, "json_schema") == 0)
        return parse_json_schema(v, out, e);
    if (strcmp(ts, "json_object") == 0) {
        char *spec = NULL;
        size_t len = 0;
        if (gm_spec_json(1, &spec, &len) != 0)
            return rt_openai__oom(e);
        return rt_openai__grammar_take(spec, len, "response_format", out, e);
    }
    return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                           "unsupported_value", "response_format.type",
                           "response_format type '%.64s' is not supported: "
                           "use \"text\", \"json_object\" or \"json_schema\"",
                           ts);
}

/* The spec of calls of `tools` (those named `named` only, when set) in
 * cfg's format into *grammar. Required (!under_auto): every tool's
 * arguments by its parameters; one call for a named function or
 * parallel_tool_calls false, else any number. Under "auto": the
 * triggered spec of strict_auto, a non-strict tool's arguments any
 * object. */
static int tools_spec(const struct rt_openai_cfg *cfg,
                      const struct ct_tools *tools, const char *named,
                      bool parallel, bool under_auto, char **grammar,
                      struct rt_request_error *e)
{
    size_t n = tools->n, m = 0;
    struct gm_tool_fn *fns = calloc(n > 0 ? n : 1, sizeof(*fns));
    json_t **params = calloc(n > 0 ? n : 1, sizeof(*params));
    int rc = fns != NULL && params != NULL ? 0 : TG_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const struct ct_tool *t = &tools->v[i];
        if (named != NULL && strcmp(t->name, named) != 0)
            continue;
        fns[m].name = t->name;
        if ((!under_auto || t->strict) && t->parameters != NULL) {
            json_error_t je;
            params[m] = json_loads(t->parameters, 0, &je);
            if (params[m] == NULL)
                rc = json_error_code(&je) == json_error_out_of_memory
                         ? TG_ENOMEM
                         : TG_EFORMAT;
            fns[m].parameters = params[m];
        }
        m++;
    }
    bool hermes = cfg->tool_format == CT_TOOLS_HERMES;
    /* A named function is called once, as OpenAI does; "required" allows
     * as many calls as parallel_tool_calls does. Under "auto", Hermes has
     * one call per trigger (the text between calls is free), Llama-3
     * JSON's calls run to the end, separated by "; ". */
    unsigned max_calls = named != NULL || !parallel || (under_auto && hermes)
                             ? 1
                             : 0;
    char *inner = NULL, *spec = NULL;
    size_t ilen = 0, len = 0;
    if (rc == 0)
        rc = gm_spec_tools(hermes ? &GM_TOOL_HERMES : &GM_TOOL_LLAMA3_JSON, fns,
                           m, 1, max_calls, &inner, &ilen);
    for (size_t i = 0; params != NULL && i < m; i++)
        json_decref(params[i]);
    free(params);
    free(fns);
    if (rc == 0 && under_auto) {
        rc = gm_spec_triggered(hermes ? "<tool_call>" : "{", !hermes, inner,
                               ilen, &spec, &len);
        free(inner);
    } else if (rc == 0) {
        spec = inner;
        len = ilen;
    }
    if (rc == TG_ENOMEM)
        return rt_openai__oom(e);
    if (rc != 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", "tools",
                               "the tools cannot be used as a constraint "
                               "(%s)",
                               tg_strerror(rc));
    return rt_openai__grammar_take(spec, len, "tools", grammar, e);
}

/* Under tool_choice "auto" with at least one "strict": true tool: the
 * output is free text, and each call the model starts is held to the
 * tools (a strict tool's arguments to its parameters, another tool's to
 * any JSON object) by a triggered spec (gm_spec.h): Hermes' "<tool_call>"
 * starts one call, after which the text is free again; in the Llama-3
 * JSON format an answer whose first non-space byte is "{" is calls to
 * its end (rt_toolcall reads nothing else as calls). No strict tool:
 * unconstrained, as before. */
static int strict_auto(const struct rt_openai_cfg *cfg,
                       const struct ct_tools *tools, bool parallel,
                       char **grammar, struct rt_request_error *e)
{
    size_t n = tools->n, strict = n;
    for (size_t i = 0; i < n && strict == n; i++)
        if (tools->v[i].strict)
            strict = i;
    if (strict == n)
        return 0;
    char p[64];
    snprintf(p, sizeof(p), "tools[%zu].function.strict", strict);
    if (cfg->tool_format == CT_TOOLS_NONE)
        return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                               "unsupported_value", p,
                               "'strict': true tools need the model's chat "
                               "template to write a tool-call format this "
                               "server knows (Hermes <tool_call> or Llama-3 "
                               "JSON); this one writes neither");
    if (*grammar != NULL)
        return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                               "unsupported_value", "response_format",
                               "'response_format' cannot be combined with "
                               "'strict': true tools under tool_choice "
                               "\"auto\": the format would hold the whole "
                               "output, so no call could be made");
    return tools_spec(cfg, tools, NULL, parallel, true, grammar, e);
}

int rt_openai_tool_grammar(const struct rt_openai_cfg *cfg,
                           const struct ct_tools *tools,
                           const struct rt_tool_sel *sel, char **grammar,
                           const char **param, struct rt_request_error *e)
{
    size_t n = tools != NULL ? tools->n : 0;
    char *before = *grammar;
    int rc;
    if (sel->choice == RT_TOOL_CHOICE_AUTO && n > 0) {
        rc = strict_auto(cfg, tools, sel->parallel, grammar, e);
    } else if (sel->choice != RT_TOOL_CHOICE_REQUIRED &&
               sel->choice != RT_TOOL_CHOICE_FUNCTION) {
        return 0;
    } else if (n == 0) {
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", "tool_choice",
                               "'tool_choice' requires a tool call, but the "
                               "request has no 'tools'");
    } else if (*grammar != NULL) {
        return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                               "unsupported_value", "response_format",
                               "'response_format' cannot be combined with a "
                               "'tool_choice' that requires a tool call: the "
                               "output is the call");
    } else if (cfg->tool_format == CT_TOOLS_NONE) {
        return rt_openai__fail(e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID,
                               "unsupported_value", "tool_choice",
                               "the model's chat template writes no "
                               "tool-call format this server knows (Hermes "
                               "<tool_call> or Llama-3 JSON), so a call "
                               "cannot be required");
    } else {
        rc = tools_spec(cfg, tools,
                        sel->choice == RT_TOOL_CHOICE_FUNCTION ? sel->name
                                                               : NULL,
                        sel->parallel, false, grammar, e);
    }
    if (rc == 0 && *grammar != before && param != NULL)
        *param = "tools";
    return rc;
}
