/*
 * rt_openai_struct.c — the other ways clients ask for structured output
 * (rt_openai.h): vLLM's `structured_outputs` object (`json`, `regex`,
 * `choice`, `grammar`, `json_object`, `disable_any_whitespace`) and its
 * older top-level `guided_json`, `guided_regex`, `guided_choice`,
 * `guided_grammar`; llama.cpp server's `grammar` (GBNF) and `json_schema`;
 * SGLang's `regex`, `ebnf` and `json_schema` (a JSON text there). Each
 * becomes a spec of common/grammar/gm_spec.h, checked like
 * response_format (400 naming the member before queueing). A request
 * carries at most one constraint in all, response_format and a required
 * tool call included.
 *
 * And the whitespace of JSON constraints: compact by default (at most one
 * space after ':' and ','), the server's --structured-whitespace, or the
 * request's `structured_outputs.whitespace` ("compact", "none", "pretty",
 * "free") or vLLM's `structured_outputs.disable_any_whitespace` (none).
 */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_json.h"
#include "common/grammar/gm_spec.h"
#include "router/api/rt_openai_internal.h"

/* One spelling: the member (a dotted path for messages), and the kind. */
enum so_kind { SO_JSON, SO_JSON_OBJECT, SO_REGEX, SO_CHOICE, SO_GRAMMAR };

/* The spec of value v of kind k, checked; *out owned. */
static int so_spec(const char *param, enum so_kind k, const json_t *v,
                   char **out, struct rt_request_error *e)
{
    char *spec = NULL;
    size_t len = 0;
    int rc;
    switch (k) {
    case SO_JSON: {
        json_t *schema = NULL;
        if (json_is_string(v)) { /* SGLang and vLLM take JSON text too */
            json_error_t je;
            schema = json_loadb(json_string_value(v), json_string_length(v),
                                JSON_ALLOW_NUL, &je);
            if (schema == NULL)
                return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                                       "invalid_value", param,
                                       "'%s' is not JSON: %s", param, je.text);
        } else if (json_is_object(v) || json_is_boolean(v)) {
            schema = json_incref((json_t *)v);
        } else {
            return rt_openai__bad_type(e, param, "a JSON Schema object");
        }
        rc = gm_spec_json_schema(schema, &spec, &len);
        json_decref(schema);
        break;
    }
    case SO_JSON_OBJECT:
        if (!json_is_true(v))
            return json_is_boolean(v)
                       ? 0
                       : rt_openai__bad_type(e, param, "a boolean");
        rc = gm_spec_json(1, &spec, &len);
        break;
    case SO_REGEX:
        if (!json_is_string(v))
            return rt_openai__bad_type(e, param, "a string");
        rc = gm_spec_regex(json_string_value(v), json_string_length(v), &spec,
                           &len);
        break;
    case SO_GRAMMAR:
        if (!json_is_string(v))
            return rt_openai__bad_type(e, param, "a string");
        rc = gm_spec_grammar(json_string_value(v), json_string_length(v), &spec,
                             &len);
        break;
    case SO_CHOICE: {
        size_t n = json_array_size(v);
        if (!json_is_array(v) || n == 0)
            return rt_openai__bad_type(e, param,
                                       "a non-empty array of strings");
        const char **s = calloc(n, sizeof(*s));
        size_t *l = calloc(n, sizeof(*l));
        if (s == NULL || l == NULL) {
            free(s);
            free(l);
            return rt_openai__oom(e);
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(v, i);
            if (!json_is_string(x)) {
                free(s);
                free(l);
                return rt_openai__bad_type(e, param,
                                           "a non-empty array of strings");
            }
            s[i] = json_string_value(x);
            l[i] = json_string_length(x);
        }
        rc = gm_spec_choice(s, l, n, &spec, &len);
        free(s);
        free(l);
        break;
    }
    default: rc = TG_EINVAL;
    }
    if (rc == TG_ENOMEM)
        return rt_openai__oom(e);
    if (rc != 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", param,
                               "'%s' is not a valid constraint", param);
    return rt_openai__grammar_take(spec, len, param, out, e);
}

/* Records constraint (param, kind, value) when present: at most one. */
static int so_one(const char *param, enum so_kind k, const json_t *v,
                  const char **taken, char **grammar,
                  struct rt_request_error *e)
{
    if (v == NULL || json_is_null(v))
        return 0;
    if (k == SO_JSON_OBJECT && json_is_false(v))
        return 0;
    if (*taken != NULL || *grammar != NULL)
        return rt_openai__fail(
            e, TG_EUNSUPPORTED, RT_REQ_ERR_INVALID, "unsupported_value", param,
            "'%s' cannot be combined with %s%s%s: a request takes one output "
            "constraint",
            param, *taken != NULL ? "'" : "",
            *taken != NULL ? *taken : "'response_format'",
            *taken != NULL ? "'" : "");
    *taken = param;
    return so_spec(param, k, v, grammar, e);
}

int rt_openai_parse_structured(const json_t *root, char **grammar,
                               struct rt_request_error *e)
{
    const char *taken = NULL;
    int rc = 0;
    const json_t *so = rt_openai__member(root, "structured_outputs");
    if (so != NULL && !json_is_object(so) && !json_is_null(so))
        return rt_openai__bad_type(e, "structured_outputs", "an object");
    if (json_is_object(so)) {
        static const char *const refused[] = {"whitespace_pattern",
                                              "structural_tag"};
        for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
            if (json_object_get(so, refused[i]) != NULL)
                return rt_openai__unsupported(
                    e, "structured_outputs",
                    "structured_outputs.whitespace_pattern and "
                    "structural_tag are not supported (whitespace takes "
                    "'compact', 'none', 'pretty' or 'free')");
        static const struct {
            const char *key, *param;
            enum so_kind k;
        } so_keys[] = {
            {"json", "structured_outputs.json", SO_JSON},
            {"regex", "structured_outputs.regex", SO_REGEX},
            {"choice", "structured_outputs.choice", SO_CHOICE},
            {"grammar", "structured_outputs.grammar", SO_GRAMMAR},
            {"json_object", "structured_outputs.json_object", SO_JSON_OBJECT},
        };
        for (size_t i = 0; rc == 0 && i < sizeof so_keys / sizeof *so_keys; i++)
            rc = so_one(so_keys[i].param, so_keys[i].k,
                        json_object_get(so, so_keys[i].key), &taken, grammar,
                        e);
    }
    static const struct {
        const char *key;
        enum so_kind k;
    } top[] = {
        {"guided_json", SO_JSON},     {"guided_regex", SO_REGEX},
        {"guided_choice", SO_CHOICE}, {"guided_grammar", SO_GRAMMAR},
        {"grammar", SO_GRAMMAR},      {"ebnf", SO_GRAMMAR},
        {"regex", SO_REGEX},          {"json_schema", SO_JSON},
    };
    for (size_t i = 0; rc == 0 && i < sizeof top / sizeof *top; i++)
        rc = so_one(top[i].key, top[i].k, rt_openai__member(root, top[i].key),
                    &taken, grammar, e);
    if (rc == 0 && rt_openai__member(root, "guided_whitespace_pattern") != NULL)
        return rt_openai__unsupported(e, "guided_whitespace_pattern",
                                      "guided_whitespace_pattern is not "
                                      "supported; structured_outputs."
                                      "whitespace takes 'compact', 'none', "
                                      "'pretty' or 'free'");
    return rc;
}

int rt_openai_structured_ws(const struct rt_openai_cfg *cfg, const json_t *root,
                            int *ws, struct rt_request_error *e)
{
    enum gm_ws w = (enum gm_ws)cfg->ws;
    const json_t *so = rt_openai__member(root, "structured_outputs");
    const json_t *wv = json_is_object(so) ? json_object_get(so, "whitespace")
                                          : NULL;
    const json_t *none = json_is_object(so)
                             ? json_object_get(so, "disable_any_whitespace")
                             : NULL;
    if (wv != NULL && gm_ws_parse(json_string_value(wv), &w) != 0)
        return rt_openai__fail(e, TG_EFORMAT, RT_REQ_ERR_INVALID,
                               "invalid_value", "structured_outputs.whitespace",
                               "'structured_outputs.whitespace' must be "
                               "'compact', 'none', 'pretty' or 'free'");
    if (none != NULL && !json_is_boolean(none))
        return rt_openai__bad_type(
            e, "structured_outputs.disable_any_whitespace", "a boolean");
    if (json_is_true(none))
        w = GM_WS_NONE;
    *ws = (int)w;
    return 0;
}

int rt_openai_structured_apply_ws(int ws, char **grammar,
                                  struct rt_request_error *e)
{
    if (*grammar == NULL || ws == GM_WS_COMPACT)
        return 0;
    size_t len = strlen(*grammar);
    int rc = gm_spec_whitespace((enum gm_ws)ws, grammar, &len);
    return rc == TG_ENOMEM ? rt_openai__oom(e) : 0;
}

int rt_openai_structured_whitespace(const struct rt_openai_cfg *cfg,
                                    const json_t *root, char **grammar,
                                    struct rt_request_error *e)
{
    int ws = 0;
    int rc = rt_openai_structured_ws(cfg, root, &ws, e);
    return rc != 0 ? rc : rt_openai_structured_apply_ws(ws, grammar, e);
}
