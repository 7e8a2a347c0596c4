/* gm_tool.c — tool-call grammars in a template's output format
 * (gm_tool.h). */
#include "common/grammar/gm_tool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

const struct gm_tool_format GM_TOOL_HERMES = {
    .begin = "<tool_call>\n{\"name\": ",
    .middle = ", \"arguments\": ",
    .end = "}\n</tool_call>",
    .sep = "\n",
};

const struct gm_tool_format GM_TOOL_LLAMA3_JSON = {
    .begin = "{\"name\": ",
    .middle = ", \"parameters\": ",
    .end = "}",
    .sep = "; ",
};

/* The JSON string of fn's name (new, free it) and the expression of its
 * arguments into *args; NULL on failure (the IR's error, or err). */
static char *tool_parts(struct gm_json *j, const struct gm_tool_fn *fn,
                        const struct gm_schema_opts *o, int32_t *args,
                        char *err, size_t errlen)
{
    struct gm_ir *ir = j->ir;
    if (fn->name == NULL || fn->name[0] == '\0') {
        gm_ir_fail(ir, TG_EINVAL, "a tool has an empty name");
        return NULL;
    }
    json_t *nm = json_string(fn->name);
    if (nm == NULL) {
        gm_ir_fail(ir, TG_EINVAL, "tool name is not UTF-8");
        return NULL;
    }
    char *lit = json_dumps(nm, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(nm);
    if (lit == NULL) {
        gm_ir_fail(ir, TG_ENOMEM, "out of memory");
        return NULL;
    }
    int32_t r;
    if (fn->parameters == NULL) {
        r = gm_json_object(j);
    } else {
        char detail[256];
        int rc = gm_schema_compile(j, fn->parameters, o, &r, detail,
                                   sizeof detail);
        if (rc != 0) {
            snprintf(err, errlen, "tool \"%.64s\" parameters: %s", fn->name,
                     detail);
            free(lit);
            return NULL;
        }
    }
    /* middle ARGS: what follows the name */
    *args = gm_ir_ref(ir, r);
    return lit;
}

int gm_tool_compile(struct gm_json *j, const struct gm_tool_format *fmt,
                    const struct gm_tool_fn *fns, size_t n_fns,
                    unsigned min_calls, unsigned max_calls,
                    const struct gm_schema_opts *o, char *err, size_t errlen)
{
    struct gm_ir *ir = j->ir;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (n_fns == 0 || min_calls < 1 ||
        (max_calls != 0 && max_calls < min_calls) ||
        min_calls > GM_REPEAT_MAX || max_calls > GM_REPEAT_MAX) {
        gm_ir_fail(ir, TG_EINVAL,
                   n_fns == 0 ? "no tools to call"
                              : "tool call count out of range");
        return gm_ir_error(ir, err, errlen);
    }
    /* begin (name_i middle ARGS_i | ...) end, the names as a trie */
    char **names = calloc(n_fns, sizeof(*names));
    size_t *len = calloc(n_fns, sizeof(*len));
    int32_t *cont = calloc(n_fns, sizeof(*cont));
    int rc = 0;
    if (names == NULL || len == NULL || cont == NULL)
        rc = gm_ir_fail(ir, TG_ENOMEM, "out of memory");
    int32_t middle = gm_ir_str(ir, fmt->middle);
    for (size_t i = 0; i < n_fns && rc == 0; i++) {
        int32_t args;
        names[i] = tool_parts(j, &fns[i], o, &args, err, errlen);
        if (names[i] == NULL) {
            rc = ir->err != 0 ? ir->err : TG_EINVAL;
            break;
        }
        len[i] = strlen(names[i]);
        cont[i] = gm_ir_seq2(ir, middle, args);
    }
    int32_t which = rc == 0 ? gm_ir_literals(ir, (const char *const *)names,
                                             len, cont, n_fns)
                            : rc;
    for (size_t i = 0; names != NULL && i < n_fns; i++)
        free(names[i]);
    free(names);
    free(len);
    free(cont);
    if (rc != 0) {
        if (err != NULL && errlen > 0 && err[0] == '\0')
            gm_ir_error(ir, err, errlen);
        return rc;
    }
    int32_t call = gm_ir_rule(ir, "tool-call");
    gm_ir_rule_define(ir, call,
                      gm_ir_seq(ir,
                                (int32_t[]){gm_ir_str(ir, fmt->begin), which,
                                            gm_ir_str(ir, fmt->end)},
                                3));
    int32_t c = gm_ir_ref(ir, call);
    int32_t more = gm_ir_repeat(
        ir, gm_ir_seq2(ir, gm_ir_str(ir, fmt->sep), c), min_calls - 1,
        max_calls == 0 ? GM_REPEAT_INF : max_calls - 1);
    int32_t root = gm_ir_rule(ir, "tool-calls");
    gm_ir_rule_define(ir, root, gm_ir_seq2(ir, c, more));
    rc = gm_ir_root_set(ir, root);
    return rc != 0 ? gm_ir_error(ir, err, errlen) : 0;
}
