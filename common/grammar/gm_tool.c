/* gm_tool.c — tool-call grammars in a template's output format
 * (gm_tool.h). */
#include "common/grammar/gm_tool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"

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

/* begin "name" middle ARGS end, for one function. */
static int32_t call_expr(struct gm_json *j, const struct gm_tool_format *fmt,
                         const struct gm_tool_fn *fn,
                         const struct gm_schema_opts *o, char *err,
                         size_t errlen)
{
    struct gm_ir *ir = j->ir;
    if (fn->name == NULL || fn->name[0] == '\0')
        return gm_ir_fail(ir, TG_EINVAL, "a tool has an empty name");
    json_t *nm = json_string(fn->name);
    if (nm == NULL)
        return gm_ir_fail(ir, TG_EINVAL, "tool name is not UTF-8");
    char *lit = json_dumps(nm, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(nm);
    if (lit == NULL)
        return gm_ir_fail(ir, TG_ENOMEM, "out of memory");
    int32_t name = gm_ir_str(ir, lit);
    free(lit);
    int32_t args;
    if (fn->parameters == NULL) {
        args = gm_json_object(j);
    } else {
        char detail[256];
        int rc = gm_schema_compile(j, fn->parameters, o, &args, detail,
                                   sizeof detail);
        if (rc != 0) {
            snprintf(err, errlen, "tool \"%.64s\" parameters: %s", fn->name,
                     detail);
            return rc;
        }
    }
    return gm_ir_seq(ir,
                     (int32_t[]){gm_ir_str(ir, fmt->begin), name,
                                 gm_ir_str(ir, fmt->middle),
                                 gm_ir_ref(ir, args), gm_ir_str(ir, fmt->end)},
                     5);
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
    int32_t *alts = malloc(n_fns * sizeof(*alts));
    if (alts == NULL) {
        gm_ir_fail(ir, TG_ENOMEM, "out of memory");
        return gm_ir_error(ir, err, errlen);
    }
    int rc = 0;
    for (size_t i = 0; i < n_fns && rc == 0; i++) {
        alts[i] = call_expr(j, fmt, &fns[i], o, err, errlen);
        if (alts[i] < 0)
            rc = alts[i];
    }
    if (rc != 0) {
        free(alts);
        if (err != NULL && errlen > 0 && err[0] == '\0')
            gm_ir_error(ir, err, errlen);
        return rc;
    }
    int32_t call = gm_ir_rule(ir, "tool-call");
    gm_ir_rule_define(ir, call, gm_ir_alt(ir, alts, n_fns));
    free(alts);
    int32_t c = gm_ir_ref(ir, call);
    int32_t more = gm_ir_repeat(
        ir, gm_ir_seq2(ir, gm_ir_str(ir, fmt->sep), c), min_calls - 1,
        max_calls == 0 ? GM_REPEAT_INF : max_calls - 1);
    int32_t root = gm_ir_rule(ir, "tool-calls");
    gm_ir_rule_define(ir, root, gm_ir_seq2(ir, c, more));
    rc = gm_ir_root_set(ir, root);
    return rc != 0 ? gm_ir_error(ir, err, errlen) : 0;
}
