/* jj_test.c — Jinja's builtin tests (jinja2/tests.py of 3.1) and the
 * Python-style argument binding shared by filters, tests and methods
 * (jj_internal.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_filter_internal.h"
#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"

struct named {
    const char *name;
    int id;
};

enum {
    T_DEFINED = 0, T_UNDEFINED, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE,
    T_INTEGER, T_FLOAT, T_NUMBER, T_STRING, T_MAPPING, T_SEQUENCE,
    T_ITERABLE, T_CALLABLE, T_SAMEAS, T_ESCAPED, T_IN, T_LOWER, T_UPPER,
    T_DIVISIBLEBY, T_EVEN, T_ODD, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE,
    T_FILTER, T_TEST,
};

static const struct named TESTS[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE},
    {"boolean", T_BOOLEAN}, {"false", T_FALSE}, {"true", T_TRUE},
    {"integer", T_INTEGER}, {"float", T_FLOAT}, {"number", T_NUMBER},
    {"string", T_STRING}, {"mapping", T_MAPPING},
    {"sequence", T_SEQUENCE}, {"iterable", T_ITERABLE},
    {"callable", T_CALLABLE}, {"sameas", T_SAMEAS},
    {"escaped", T_ESCAPED}, {"in", T_IN}, {"lower", T_LOWER},
    {"upper", T_UPPER}, {"divisibleby", T_DIVISIBLEBY}, {"even", T_EVEN},
    {"odd", T_ODD}, {"eq", T_EQ}, {"equalto", T_EQ}, {"==", T_EQ},
    {"ne", T_NE}, {"!=", T_NE}, {"lt", T_LT}, {"lessthan", T_LT},
    {"<", T_LT}, {"le", T_LE}, {"<=", T_LE}, {"gt", T_GT},
    {"greaterthan", T_GT}, {">", T_GT}, {"ge", T_GE}, {">=", T_GE},
    {"filter", T_FILTER}, {"test", T_TEST},
};

static int find_named(const struct named *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return t[i].id;
    return -2;
}

int jj_test_id(const char *name)
{
    return find_named(TESTS, sizeof TESTS / sizeof TESTS[0], name);
}

/* ---- argument binding ------------------------------------------------------ */

int jj_bind_args(struct jj_ctx *c, int line, const char *fname,
                 const char *const *params, size_t nparams,
                 const struct jj_val *args, size_t nargs,
                 const char *const *kwnames, const struct jj_val *kwvals,
                 size_t nkw, struct jj_val *out, bool *have)
{
    for (size_t i = 0; i < nparams; i++) {
        have[i] = false;
        out[i] = jj_undef();
    }
    if (nargs > nparams)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: %s() takes at most %zu argument(s) (%zu "
                       "given)",
                       fname, nparams, nargs);
    for (size_t i = 0; i < nargs; i++) {
        out[i] = args[i];
        have[i] = true;
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < nparams && strcmp(params[i], kwnames[k]) != 0)
            i++;
        if (i == nparams)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: %s() got an unexpected keyword "
                           "argument '%s'",
                           fname, kwnames[k]);
        if (have[i])
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: %s() got multiple values for argument "
                           "'%s'",
                           fname, kwnames[k]);
        out[i] = kwvals[k];
        have[i] = true;
    }
    return 0;
}


/* ---- tests --------------------------------------------------------------------- */

int jj_apply_test(struct jj_ctx *c, struct jj_scope *sc, int line, int tid,
                  const char *name, struct jj_val v,
                  const struct jj_val *args, size_t nargs,
                  const char *const *kwnames, const struct jj_val *kwvals,
                  size_t nkw, bool *res)
{
    (void)sc;
    int rc = jj_step(c, line);
    if (rc)
        return rc;
    if (tid < 0)
        return jj_fail(c, line, TG_EUNSUPPORTED, "unsupported test '%s'",
                       name);
    struct jj_val r, other[1];
    bool have_other[1];
    static const char *const other_name[] = {"other"};
    bool takes_arg = tid == T_SAMEAS || tid == T_IN || tid == T_DIVISIBLEBY ||
                     tid == T_EQ || tid == T_NE || tid == T_LT ||
                     tid == T_LE || tid == T_GT || tid == T_GE;
    if ((rc = jj_bind_args(c, line, name, other_name, takes_arg ? 1 : 0, args,
                           nargs, kwnames, kwvals, nkw, other, have_other)))
        return rc;
    if (takes_arg && !have_other[0])
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: test '%s' missing an argument", name);
    args = other;
    switch (tid) {
    case T_DEFINED:
        *res = v.t != JJ_UNDEF;
        return 0;
    case T_UNDEFINED:
        *res = v.t == JJ_UNDEF;
        return 0;
    case T_NONE:
        *res = v.t == JJ_NONE;
        return 0;
    case T_BOOLEAN:
        *res = v.t == JJ_BOOL;
        return 0;
    case T_FALSE:
        *res = v.t == JJ_BOOL && !v.u.b;
        return 0;
    case T_TRUE:
        *res = v.t == JJ_BOOL && v.u.b;
        return 0;
    case T_INTEGER:
        *res = v.t == JJ_INT;
        return 0;
    case T_FLOAT:
        *res = v.t == JJ_FLOAT;
        return 0;
    case T_NUMBER:
        *res = v.t == JJ_INT || v.t == JJ_FLOAT || v.t == JJ_BOOL;
        return 0;
    case T_STRING:
        *res = v.t == JJ_STR;
        return 0;
    case T_MAPPING:
        *res = v.t == JJ_DICT;
        return 0;
    case T_SEQUENCE:
        *res = v.t == JJ_STR || v.t == JJ_DICT || v.t == JJ_UNDEF ||
               (v.t == JJ_LIST && v.u.l->seq != JJ_SEQ_ITEMS &&
                v.u.l->seq != JJ_SEQ_KEYS && v.u.l->seq != JJ_SEQ_VALUES);
        return 0;
    case T_ITERABLE:
        *res = v.t == JJ_STR || v.t == JJ_LIST || v.t == JJ_DICT ||
               v.t == JJ_ITER || v.t == JJ_UNDEF || v.t == JJ_LOOP;
        return 0;
    case T_CALLABLE:
        *res = v.t == JJ_FUNC || v.t == JJ_UNDEF || v.t == JJ_LOOP;
        return 0;
    case T_ESCAPED:
        *res = v.t == JJ_STR && v.u.s->markup;
        return 0;
    case T_LOWER:
    case T_UPPER: {
        struct jj_val s;
        if ((rc = jj_to_str(c, line, v, &s)))
            return rc;
        rc = jj_text_is(s.u.s, tid == T_LOWER ? "islower" : "isupper", res);
        jj_unref(s);
        return rc ? jj_fail(c, line, rc, "unsupported: %s test", name) : 0;
    }
    case T_EVEN:
    case T_ODD:
        if ((rc = jj_binop(c, line, JJ_OP_MOD, v, jj_int(2), &r)))
            return rc;
        *res = jj_equal(r, jj_int(tid == T_ODD ? 1 : 0));
        return 0;
    case T_DIVISIBLEBY:
        if ((rc = jj_binop(c, line, JJ_OP_MOD, v, args[0], &r)))
            return rc;
        *res = jj_equal(r, jj_int(0));
        return 0;
    case T_FILTER:
        *res = v.t == JJ_STR && jj_filter_id(v.u.s->s) != -2;
        return 0;
    case T_TEST:
        *res = v.t == JJ_STR && jj_test_id(v.u.s->s) != -2;
        return 0;
    case T_SAMEAS:
        if ((v.t == JJ_NONE || v.t == JJ_BOOL) && v.t == args[0].t) {
            *res = v.t == JJ_NONE || v.u.b == args[0].u.b;
            return 0;
        }
        if (v.t == JJ_LIST || v.t == JJ_DICT || v.t == JJ_NS ||
            v.t == JJ_FUNC || v.t == JJ_ITER || v.t == JJ_LOOP) {
            *res = args[0].t == v.t && args[0].u.o == v.u.o;
            return 0;
        }
        if (v.t != args[0].t && !(v.t == JJ_UNDEF || args[0].t == JJ_UNDEF)) {
            *res = false;
            return 0;
        }
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: the sameas test on a %s (Python object "
                       "identity)",
                       jj_type_name(v));
    case T_IN: {
        if ((rc = jj_binop(c, line, JJ_OP_IN, v, args[0], &r)))
            return rc;
        *res = r.u.b != 0;
        return 0;
    }
    case T_EQ:
    case T_NE:
    case T_LT:
    case T_LE:
    case T_GT:
    case T_GE: {
        int op = tid == T_EQ   ? JJ_OP_EQ
                 : tid == T_NE ? JJ_OP_NE
                 : tid == T_LT ? JJ_OP_LT
                 : tid == T_LE ? JJ_OP_LE
                 : tid == T_GT ? JJ_OP_GT
                               : JJ_OP_GE;
        if ((rc = jj_binop(c, line, op, v, args[0], &r)))
            return rc;
        *res = r.u.b != 0;
        return 0;
    }
    default:
        return jj_fail(c, line, TG_EUNSUPPORTED, "unsupported test '%s'",
                       name);
    }
}
