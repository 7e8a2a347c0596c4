/* gm_spec.c — constraint specs: building their text, and compiling them
 * (gm_spec.h). */
#include "common/grammar/gm_spec.h"

#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_gbnf.h"
#include "common/grammar/gm_internal.h"
#include "common/grammar/gm_json.h"
#include "common/grammar/gm_regex.h"
#include "common/grammar/gm_schema.h"
#include "common/base/tg_err.h"

static int dump(json_t *doc, char **out, size_t *len)
{
    if (doc == NULL)
        return TG_ENOMEM;
    char *s = json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(17) |
                                  JSON_ENCODE_ANY);
    json_decref(doc);
    if (s == NULL)
        return TG_ENOMEM;
    *out = s;
    *len = strlen(s);
    return 0;
}

int gm_spec_json(int object_only, char **out, size_t *len)
{
    return dump(json_pack("{ss}", "type",
                          object_only ? "json_object" : "json_value"),
                out, len);
}

int gm_spec_whitespace(enum gm_ws ws, char **spec, size_t *len)
{
    json_t *doc = json_loadb(*spec, *len, JSON_ALLOW_NUL, NULL);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return TG_EINVAL;
    }
    if (ws == GM_WS_COMPACT)
        (void)json_object_del(doc, "whitespace"); /* absent: fine */
    else if (json_object_set_new(doc, "whitespace",
                                 json_string(gm_ws_name(ws))) != 0) {
        json_decref(doc);
        return TG_ENOMEM;
    }
    char *out = NULL;
    size_t n = 0;
    int rc = dump(doc, &out, &n); /* takes doc */
    if (rc != 0)
        return rc;
    free(*spec);
    *spec = out;
    *len = n;
    return 0;
}

int gm_spec_json_schema(const json_t *schema, char **out, size_t *len)
{
    if (schema == NULL)
        return TG_EINVAL;
    return dump(json_pack("{sssO}", "type", "json_schema", "schema",
                          (json_t *)schema),
                out, len);
}

int gm_spec_tools(const struct gm_tool_format *fmt,
                  const struct gm_tool_fn *fns, size_t n_fns,
                  unsigned min_calls, unsigned max_calls, char **out,
                  size_t *len)
{
    if (fmt == NULL || fns == NULL || n_fns == 0)
        return TG_EINVAL;
    json_t *tools = json_array();
    for (size_t i = 0; tools != NULL && i < n_fns; i++) {
        json_t *t = json_pack("{ss}", "name", fns[i].name ? fns[i].name : "");
        if (t == NULL) {
            json_decref(tools);
            return TG_EINVAL;
        }
        if (fns[i].parameters != NULL)
            json_object_set(t, "parameters", (json_t *)fns[i].parameters);
        json_array_append_new(tools, t);
    }
    if (tools == NULL)
        return TG_ENOMEM;
    json_t *f = json_pack("{ssssssss}", "begin", fmt->begin, "middle",
                          fmt->middle, "end", fmt->end, "sep", fmt->sep);
    if (f == NULL) {
        json_decref(tools);
        return TG_EINVAL;
    }
    return dump(json_pack("{sssosIsIso}", "type", "tool_calls", "format", f,
                          "min_calls", (json_int_t)min_calls, "max_calls",
                          (json_int_t)max_calls, "tools", tools),
                out, len);
}

int gm_spec_regex(const char *pattern, size_t plen, char **out, size_t *len)
{
    if (pattern == NULL || memchr(pattern, 0, plen) != NULL)
        return TG_EINVAL;
    json_t *p = json_stringn(pattern, plen);
    if (p == NULL)
        return TG_EINVAL;
    return dump(json_pack("{ssso}", "type", "regex", "pattern", p), out, len);
}

int gm_spec_choice(const char *const *choices, const size_t *lens, size_t n,
                   char **out, size_t *len)
{
    if (choices == NULL || n == 0)
        return TG_EINVAL;
    json_t *arr = json_array();
    for (size_t i = 0; arr != NULL && i < n; i++) {
        json_t *c = choices[i] != NULL && memchr(choices[i], 0, lens[i]) == NULL
                        ? json_stringn(choices[i], lens[i])
                        : NULL;
        if (c == NULL) {
            json_decref(arr);
            return TG_EINVAL;
        }
        json_array_append_new(arr, c);
    }
    if (arr == NULL)
        return TG_ENOMEM;
    return dump(json_pack("{ssso}", "type", "choice", "choices", arr), out,
                len);
}

int gm_spec_grammar(const char *gbnf, size_t glen, char **out, size_t *len)
{
    if (gbnf == NULL || memchr(gbnf, 0, glen) != NULL)
        return TG_EINVAL;
    json_t *g = json_stringn(gbnf, glen);
    if (g == NULL)
        return TG_EINVAL;
    return dump(json_pack("{ssso}", "type", "grammar", "gbnf", g), out, len);
}

int gm_spec_triggered(const char *trigger, int anchored, const char *inner,
                      size_t inner_len, char **out, size_t *len)
{
    if (trigger == NULL || trigger[0] == '\0' || inner == NULL)
        return TG_EINVAL;
    json_t *in = json_loadb(inner, inner_len, JSON_ALLOW_NUL, NULL);
    if (in == NULL)
        return TG_EINVAL;
    return dump(json_pack("{sssssbso}", "type", "triggered", "trigger", trigger,
                          "anchored", anchored, "spec", in),
                out, len);
}

int gm_spec_trigger(const char *spec, size_t len, char **trigger, int *anchored)
{
    *trigger = NULL;
    *anchored = 0;
    json_t *doc = json_loadb(spec, len, JSON_ALLOW_NUL, NULL);
    if (doc == NULL)
        return TG_EFORMAT;
    int rc = 0;
    const char *type = json_string_value(json_object_get(doc, "type"));
    if (type != NULL && strcmp(type, "triggered") == 0) {
        const char *t = json_string_value(json_object_get(doc, "trigger"));
        *anchored = json_is_true(json_object_get(doc, "anchored"));
        *trigger = t != NULL ? strdup(t) : NULL;
        rc = t == NULL ? TG_EFORMAT : *trigger == NULL ? TG_ENOMEM : 0;
    }
    json_decref(doc);
    return rc;
}

#define BAD_FORMAT                                                          \
    "spec: \"format\" must be \"hermes\", \"llama3_json\" or an object of " \
    "begin, middle, end and sep strings"

/* The format of a tool_calls spec: a name or an object of four strings. */
static int read_format(const json_t *f, struct gm_tool_format *fmt)
{
    if (json_is_string(f)) {
        if (strcmp(json_string_value(f), "hermes") == 0)
            *fmt = GM_TOOL_HERMES;
        else if (strcmp(json_string_value(f), "llama3_json") == 0)
            *fmt = GM_TOOL_LLAMA3_JSON;
        else
            return TG_EFORMAT;
        return 0;
    }
    const char *k[4] = {"begin", "middle", "end", "sep"};
    const char *v[4];
    for (int i = 0; i < 4; i++) {
        const json_t *x = json_object_get(f, k[i]);
        if (!json_is_string(x))
            return TG_EFORMAT;
        v[i] = json_string_value(x);
    }
    *fmt = (struct gm_tool_format){
        .begin = v[0], .middle = v[1], .end = v[2], .sep = v[3]};
    return 0;
}

static int tools_ir(struct gm_json *j, const json_t *doc,
                    const struct gm_schema_opts *so, char *err, size_t errlen)
{
    struct gm_tool_format fmt;
    if (read_format(json_object_get(doc, "format"), &fmt) != 0)
        return tg_err_set(err, errlen, TG_EFORMAT, "%s", BAD_FORMAT);
    const json_t *mn = json_object_get(doc, "min_calls");
    const json_t *mx = json_object_get(doc, "max_calls");
    const json_t *tools = json_object_get(doc, "tools");
    if ((mn != NULL && !json_is_integer(mn)) ||
        (mx != NULL && !json_is_integer(mx)) || !json_is_array(tools))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "spec: tool_calls needs a \"tools\" array and "
                          "integer call counts");
    json_int_t lo = mn != NULL ? json_integer_value(mn) : 1;
    json_int_t hi = mx != NULL ? json_integer_value(mx) : 0;
    if (lo < 1 || lo > GM_REPEAT_MAX || hi < 0 || hi > GM_REPEAT_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "spec: call counts out of range");
    size_t n = json_array_size(tools);
    struct gm_tool_fn *fns = calloc(n ? n : 1, sizeof(*fns));
    if (fns == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *nm = json_object_get(t, "name");
        if (!json_is_string(nm)) {
            free(fns);
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "spec: tools[%zu] has no \"name\" string", i);
        }
        fns[i].name = json_string_value(nm);
        fns[i].parameters = json_object_get(t, "parameters");
    }
    int rc = gm_tool_compile(j, &fmt, fns, n, (unsigned)lo, (unsigned)hi, so,
                             err, errlen);
    free(fns);
    return rc;
}

/* A triggered spec's grammar is its inner tool_calls spec's, from the
 * start of the calls; the trigger must be a non-empty prefix of the
 * format's `begin`, so that the bytes from the trigger on are a prefix of
 * a call the grammar accepts. */
static int triggered_ir(struct gm_json *j, const json_t *doc,
                        const struct gm_schema_opts *so, char *err,
                        size_t errlen)
{
    const json_t *tr = json_object_get(doc, "trigger");
    const json_t *an = json_object_get(doc, "anchored");
    const json_t *in = json_object_get(doc, "spec");
    const char *it = json_string_value(json_object_get(in, "type"));
    if (!json_is_string(tr) || json_string_length(tr) == 0 ||
        (an != NULL && !json_is_boolean(an)) || it == NULL ||
        strcmp(it, "tool_calls") != 0)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "spec: triggered needs a non-empty \"trigger\" "
                          "string, an optional \"anchored\" boolean and a "
                          "tool_calls \"spec\"");
    struct gm_tool_format fmt;
    if (read_format(json_object_get(in, "format"), &fmt) != 0)
        return tg_err_set(err, errlen, TG_EFORMAT, "%s", BAD_FORMAT);
    size_t n = json_string_length(tr);
    if (strlen(fmt.begin) < n || memcmp(fmt.begin, json_string_value(tr), n))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "spec: the trigger must be a prefix of the "
                          "format's call opening \"%.40s\"",
                          fmt.begin);
    return tools_ir(j, in, so, err, errlen);
}

/* The whole output matches the pattern (fullmatch), as raw UTF-8. */
static int regex_ir(struct gm_ir *ir, const json_t *doc, char *err,
                    size_t errlen)
{
    const json_t *p = json_object_get(doc, "pattern");
    if (!json_is_string(p))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "spec: regex needs a \"pattern\" string");
    struct gm_rx_item it = {.text = json_string_value(p),
                            .len = json_string_length(p),
                            .kind = GM_RX_FULL};
    struct gm_rx_opts o;
    gm_rx_opts_default(&o);
    o.enc = GM_RX_RAW;
    int32_t e = gm_regex_expr(ir, &it, 1, &o, err, errlen);
    if (e < 0)
        return e;
    int32_t r = gm_ir_rule(ir, "output");
    int rc = gm_ir_rule_define(ir, r, e);
    return rc != 0 ? rc : gm_ir_root_set(ir, r);
}

/* Exactly one of the strings. */
static int choice_ir(struct gm_ir *ir, const json_t *doc, char *err,
                     size_t errlen)
{
    const json_t *c = json_object_get(doc, "choices");
    size_t n = json_array_size(c);
    int ok = json_is_array(c) && n > 0;
    for (size_t i = 0; ok && i < n; i++)
        ok = json_is_string(json_array_get(c, i));
    if (!ok)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "spec: choice needs a non-empty \"choices\" array "
                          "of strings");
    const char **s = malloc(n * sizeof(*s));
    size_t *l = malloc(n * sizeof(*l));
    if (s == NULL || l == NULL) {
        free(s);
        free(l);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        s[i] = json_string_value(json_array_get(c, i));
        l[i] = json_string_length(json_array_get(c, i));
    }
    int32_t e = gm_ir_literals(ir, s, l, NULL, n);
    free(s);
    free(l);
    int32_t r = gm_ir_rule(ir, "output");
    int rc = gm_ir_rule_define(ir, r, e);
    return rc != 0 ? rc : gm_ir_root_set(ir, r);
}

static int grammar_ir(struct gm_ir *ir, const json_t *doc, char *err,
                      size_t errlen)
{
    const json_t *g = json_object_get(doc, "gbnf");
    if (!json_is_string(g))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "spec: grammar needs a \"gbnf\" string");
    int32_t root = gm_gbnf_compile(ir, json_string_value(g),
                                   json_string_length(g), err, errlen);
    return root < 0 ? root : gm_ir_root_set(ir, root);
}

int gm_spec_to_ir(const char *spec, size_t len, const struct gm_limits *lim,
                  struct gm_ir *ir, char *err, size_t errlen)
{
    struct gm_limits dl;
    if (lim == NULL) {
        gm_limits_default(&dl);
        lim = &dl;
    }
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    gm_ir_init(ir, lim->max_exprs);
    /* the compile's time limit counts from here: parsing, the IR, the
     * automaton and the caches all run under it */
    gm_ir_set_deadline(
        ir, lim->max_compile_s > 0 ? gm__now() + lim->max_compile_s : 0);
    if (lim->max_spec_bytes != 0 && len > lim->max_spec_bytes)
        return tg_err_set(err, errlen, TG_ETOOBIG,
                          "structured output spec of %zu bytes is over the "
                          "limit of %zu",
                          len, lim->max_spec_bytes);
    json_error_t je;
    json_t *doc = json_loadb(spec, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
                             &je);
    if (doc == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT, "spec: %s", je.text);
    const char *type = json_string_value(json_object_get(doc, "type"));
    const json_t *wsv = json_object_get(doc, "whitespace");
    enum gm_ws ws = GM_WS_COMPACT;
    if (wsv != NULL && gm_ws_parse(json_string_value(wsv), &ws) != 0) {
        json_decref(doc);
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "spec: \"whitespace\" must be \"compact\", "
                          "\"none\", \"pretty\" or \"free\"");
    }
    struct gm_json j;
    gm_json_init(&j, ir, ws, lim->ws_indent);
    struct gm_schema_opts so = {.max_depth = lim->max_depth,
                                .max_count = lim->max_count};
    int rc;
    if (type == NULL) {
        rc = tg_err_set(err, errlen, TG_EFORMAT, "spec: no \"type\"");
    } else if (strcmp(type, "json_value") == 0) {
        rc = gm_json_document(&j, gm_json_value(&j));
    } else if (strcmp(type, "json_object") == 0) {
        rc = gm_json_document(&j, gm_json_object(&j));
    } else if (strcmp(type, "json_schema") == 0) {
        const json_t *schema = json_object_get(doc, "schema");
        int32_t r = -1;
        rc = schema == NULL ? tg_err_set(err, errlen, TG_EFORMAT,
                                         "spec: json_schema without \"schema\"")
                            : gm_schema_compile(&j, schema, &so, &r, err, errlen);
        if (rc == 0)
            rc = gm_json_document(&j, r);
    } else if (strcmp(type, "tool_calls") == 0) {
        rc = tools_ir(&j, doc, &so, err, errlen);
    } else if (strcmp(type, "triggered") == 0) {
        rc = triggered_ir(&j, doc, &so, err, errlen);
    } else if (strcmp(type, "regex") == 0) {
        rc = regex_ir(ir, doc, err, errlen);
    } else if (strcmp(type, "choice") == 0) {
        rc = choice_ir(ir, doc, err, errlen);
    } else if (strcmp(type, "grammar") == 0) {
        rc = grammar_ir(ir, doc, err, errlen);
    } else {
        rc = tg_err_set(err, errlen, TG_EFORMAT, "spec: unknown type \"%.40s\"",
                        type);
    }
    if (rc != 0 && err != NULL && errlen > 0 && err[0] == '\0')
        gm_ir_error(ir, err, errlen);
    json_decref(doc);
    return rc;
}

int gm_spec_check(const char *spec, size_t len, const struct gm_limits *lim,
                  char *err, size_t errlen)
{
    struct gm_limits dl;
    if (lim == NULL) {
        gm_limits_default(&dl);
        lim = &dl;
    }
    struct gm_ir ir;
    int rc = gm_spec_to_ir(spec, len, lim, &ir, err, errlen);
    if (rc == 0) {
        struct gm__pda p;
        rc = gm__pda_build(&p, &ir, lim->max_nodes, ir.deadline, err, errlen);
        gm__pda_free(&p);
    }
    gm_ir_free(&ir);
    return rc;
}

int gm_spec_compile(const char *spec, size_t len, const struct gm_vocab *v,
                    const struct gm_limits *lim, struct gm_grammar **out,
                    char *err, size_t errlen)
{
    double t0 = gm__now();
    struct gm_ir ir;
    *out = NULL;
    int rc = gm_spec_to_ir(spec, len, lim, &ir, err, errlen);
    double t1 = gm__now();
    if (rc == 0)
        rc = gm__grammar_compile(&ir, v, lim, ir.deadline, out, err, errlen);
    if (rc == 0)
        (*out)->stats.t_ir_s = t1 - t0;
    gm_ir_free(&ir);
    return rc;
}
