/* jj_expr.c — expression evaluation (jj_internal.h): literals, names,
 * Python's operators on int / float / str / list (int is limited to 64 bits;
 * an overflow is an error, never a wrapped number), comparisons chained as
 * in Python, `in`, `and` / `or` returning an operand, inline if, slices
 * and calls. Attribute and item access are in jj_access.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"

int jj_undef_error(struct jj_ctx *c, int line, struct jj_val u)
{
    const char *name = u.u.un.name != NULL ? u.u.un.name->s : NULL;
    if (u.u.un.msg != NULL && name != NULL)
        return jj_fail(c, line, TG_EINVAL, "UndefinedError: %s: '%s'",
                       u.u.un.msg, name);
    if (u.u.un.msg != NULL)
        return jj_fail(c, line, TG_EINVAL, "UndefinedError: %s",
                       u.u.un.msg);
    if (u.u.un.obj != NULL && name != NULL)
        return jj_fail(c, line, TG_EINVAL,
                       "UndefinedError: '%s' has no attribute '%s'",
                       u.u.un.obj, name);
    if (name != NULL)
        return jj_fail(c, line, TG_EINVAL, "UndefinedError: '%s' is undefined",
                       name);
    if (u.u.un.obj != NULL)
        return jj_fail(c, line, TG_EINVAL,
                       "UndefinedError: '%s' has no such item", u.u.un.obj);
    return jj_fail(c, line, TG_EINVAL, "UndefinedError: value is undefined");
}

/* ---- numbers --------------------------------------------------------------- */

static bool is_num(struct jj_val v)
{
    return jj_is_intlike(v) || v.t == JJ_FLOAT;
}
static double as_float(struct jj_val v)
{
    return v.t == JJ_FLOAT ? v.u.f : (double)jj_as_int(v);
}

static int overflow(struct jj_ctx *c, int line)
{
    return jj_fail(c, line, TG_EUNSUPPORTED,
                   "unsupported: integer result beyond 64 bits");
}

static int type_error(struct jj_ctx *c, int line, const char *op,
                      struct jj_val a, struct jj_val b)
{
    return jj_fail(c, line, TG_EINVAL,
                   "TypeError: unsupported operand type(s) for %s: '%s' and "
                   "'%s'",
                   op, jj_type_name(a), jj_type_name(b));
}

static int zero_div(struct jj_ctx *c, int line, const char *what)
{
    return jj_fail(c, line, TG_EINVAL, "ZeroDivisionError: %s", what);
}

/* Python float floor division (floatobject.c float_floor_div). */
static double py_floordiv(double vx, double wx)
{
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod != 0.0) {
        if ((wx < 0) != (mod < 0))
            div -= 1.0;
    }
    double floordiv;
    if (div != 0.0) {
        floordiv = floor(div);
        if (div - floordiv > 0.5)
            floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, vx / wx);
    }
    return floordiv;
}

static double py_fmod(double vx, double wx)
{
    double mod = fmod(vx, wx);
    if (mod != 0.0) {
        if ((wx < 0) != (mod < 0))
            mod += wx;
    } else {
        mod = copysign(0.0, wx);
    }
    return mod;
}

static int repeat(struct jj_ctx *c, int line, struct jj_val seq, int64_t k,
                  struct jj_val *out)
{
    if (k < 0)
        k = 0;
    if (seq.t == JJ_STR) {
        const struct jj_str *s = seq.u.s;
        if (s->len > 0 && (uint64_t)k > c->lim.max_output / s->len)
            return jj_fail(c, line, TG_ETOOBIG,
                           "a string repeated %lld times exceeds the output "
                           "limit of %zu bytes",
                           (long long)k, c->lim.max_output);
        struct tg_buf b = {0};
        for (int64_t i = 0; i < k; i++)
            if (tg_buf_append(&b, s->s, s->len)) {
                tg_buf_free(&b);
                return jj_oom(c, line);
            }
        int rc = jj_buf_to_val(c, line, &b, out);
        if (rc == 0)
            out->u.s->markup = s->markup;
        return rc;
    }
    const struct jj_list *l = seq.u.l;
    if (l->n > 0 && (uint64_t)k > c->lim.max_output / (l->n * 8))
        return jj_fail(c, line, TG_ETOOBIG, "a list repeated %lld times is "
                                            "too large",
                       (long long)k);
    struct jj_list *r = jj_list_new(l->n * (size_t)k, l->seq);
    if (r == NULL)
        return jj_oom(c, line);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < l->n; j++) {
            jj_ref(l->v[j]);
            r->v[r->n++] = l->v[j];
        }
    *out = jj_list_val(r);
    return 0;
}

/* str + str with markupsafe's rule: a Markup operand escapes the other. */
static int str_add(struct jj_ctx *c, int line, struct jj_str *a,
                   struct jj_str *b, struct jj_val *out)
{
    struct jj_val ea = {0}, eb = {0};
    int rc = 0;
    bool markup = a->markup || b->markup;
    if (a->markup && !b->markup)
        rc = jj_text_escape(c, line, b, &eb);
    else if (b->markup && !a->markup)
        rc = jj_text_escape(c, line, a, &ea);
    if (rc)
        return rc;
    const struct jj_str *x = ea.t == JJ_STR ? ea.u.s : a;
    const struct jj_str *y = eb.t == JJ_STR ? eb.u.s : b;
    if (x->len + y->len > c->lim.max_output) {
        rc = jj_fail(c, line, TG_ETOOBIG,
                     "a string of %zu bytes exceeds the output limit of %zu "
                     "bytes",
                     x->len + y->len, c->lim.max_output);
    } else {
        struct jj_str *r = malloc(sizeof(*r) + x->len + y->len + 1);
        if (r == NULL) {
            rc = jj_oom(c, line);
        } else {
            r->h.rc = 1;
            r->h.type = JJ_STR;
            r->h.immortal = 0;
            r->markup = markup;
            r->len = x->len + y->len;
            memcpy(r->s, x->s, x->len);
            memcpy(r->s + x->len, y->s, y->len);
            r->s[r->len] = '\0';
            r->ascii = x->ascii && y->ascii;
            r->ncp = x->ncp + y->ncp;
            *out = jj_str_val(r);
        }
    }
    jj_unref(ea);
    jj_unref(eb);
    return rc;
}

static bool contains(struct jj_ctx *c, int line, struct jj_val x,
                     struct jj_val seq, int *rc)
{
    *rc = 0;
    switch (seq.t) {
    case JJ_STR:
        if (x.t != JJ_STR) {
            *rc = jj_fail(c, line, TG_EINVAL,
                          "TypeError: 'in <string>' requires string as left "
                          "operand, not %s",
                          jj_type_name(x));
            return false;
        }
        return x.u.s->len == 0 ||
               memmem(seq.u.s->s, seq.u.s->len, x.u.s->s, x.u.s->len) != NULL;
    case JJ_LIST:
        for (size_t i = 0; i < seq.u.l->n; i++)
            if (jj_equal(x, seq.u.l->v[i]))
                return true;
        return false;
    case JJ_DICT:
        if (!jj_hashable(x)) {
            *rc = jj_fail(c, line, TG_EINVAL, "TypeError: unhashable type: "
                                              "'%s'",
                          jj_type_name(x));
            return false;
        }
        return jj_dict_get(seq.u.d, x) != NULL;
    case JJ_ITER: {
        struct jj_iter *it = seq.u.it;
        while (it->pos < it->items->n)
            if (jj_equal(x, it->items->v[it->pos++]))
                return true;
        return false;
    }
    case JJ_UNDEF:
        return false;
    default:
        *rc = jj_fail(c, line, TG_EINVAL,
                      "TypeError: argument of type '%s' is not iterable",
                      jj_type_name(seq));
        return false;
    }
}

int jj_binop(struct jj_ctx *c, int line, int op, struct jj_val a,
             struct jj_val b, struct jj_val *out)
{
    int rc;
    if (op == JJ_OP_EQ || op == JJ_OP_NE) {
        bool eq = jj_equal(a, b);
        *out = jj_bool(op == JJ_OP_EQ ? eq : !eq);
        return 0;
    }
    if (op == JJ_OP_IN || op == JJ_OP_NOTIN) {
        bool in = contains(c, line, a, b, &rc);
        if (rc)
            return rc;
        *out = jj_bool(op == JJ_OP_IN ? in : !in);
        return 0;
    }
    if (op >= JJ_OP_LT && op <= JJ_OP_GE) {
        bool r;
        if ((rc = jj_order(c, line, op, a, b, &r)))
            return rc;
        *out = jj_bool(r);
        return 0;
    }
    if (a.t == JJ_UNDEF)
        return jj_undef_error(c, line, a);
    if (b.t == JJ_UNDEF)
        return jj_undef_error(c, line, b);
    static const char *const sym[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    const char *os = op <= JJ_OP_POW ? sym[op] : "?";
    if (jj_is_intlike(a) && jj_is_intlike(b) && op != JJ_OP_DIV) {
        int64_t x = jj_as_int(a), y = jj_as_int(b), r;
        switch (op) {
        case JJ_OP_ADD:
            if (__builtin_add_overflow(x, y, &r))
                return overflow(c, line);
            break;
        case JJ_OP_SUB:
            if (__builtin_sub_overflow(x, y, &r))
                return overflow(c, line);
            break;
        case JJ_OP_MUL:
            if (__builtin_mul_overflow(x, y, &r))
                return overflow(c, line);
            break;
        case JJ_OP_FLOORDIV:
        case JJ_OP_MOD:
            if (y == 0)
                return zero_div(c, line, op == JJ_OP_MOD
                                             ? "integer modulo by zero"
                                             : "integer division or modulo "
                                               "by zero");
            if (x == INT64_MIN && y == -1)
                return overflow(c, line);
            r = op == JJ_OP_FLOORDIV ? x / y : x % y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) {
                if (op == JJ_OP_FLOORDIV)
                    r -= 1;
                else
                    r += y;
            }
            break;
        case JJ_OP_POW: {
            if (y < 0) {
                if (x == 0)
                    return zero_div(c, line, "0.0 cannot be raised to a "
                                             "negative power");
                *out = jj_float(pow((double)x, (double)y));
                return 0;
            }
            int64_t base = x;
            uint64_t e = (uint64_t)y;
            r = 1;
            while (e != 0) {
                if ((e & 1) && __builtin_mul_overflow(r, base, &r))
                    return overflow(c, line);
                e >>= 1;
                if (e != 0 && __builtin_mul_overflow(base, base, &base))
                    return overflow(c, line);
            }
            break;
        }
        default:
            return type_error(c, line, os, a, b);
        }
        *out = jj_int(r);
        return 0;
    }
    if (is_num(a) && is_num(b)) {
        if (op == JJ_OP_DIV && jj_is_intlike(a) && jj_is_intlike(b) &&
            (llabs(jj_as_int(a)) > (1LL << 53) || llabs(jj_as_int(b)) > (1LL << 53)))
            return jj_fail(c, line, TG_EUNSUPPORTED,
                           "unsupported: true division of integers beyond "
                           "2**53");
        double x = as_float(a), y = as_float(b), r;
        switch (op) {
        case JJ_OP_ADD: r = x + y; break;
        case JJ_OP_SUB: r = x - y; break;
        case JJ_OP_MUL: r = x * y; break;
        case JJ_OP_DIV:
            if (y == 0.0)
                return zero_div(c, line, jj_is_intlike(b) && jj_is_intlike(a)
                                             ? "division by zero"
                                             : "float division by zero");
            r = x / y;
            break;
        case JJ_OP_FLOORDIV:
            if (y == 0.0)
                return zero_div(c, line, "float floor division by zero");
            r = py_floordiv(x, y);
            break;
        case JJ_OP_MOD:
            if (y == 0.0)
                return zero_div(c, line, "float modulo");
            r = py_fmod(x, y);
            break;
        case JJ_OP_POW:
            if (x == 0.0 && y < 0)
                return zero_div(c, line, "0.0 cannot be raised to a negative "
                                         "power");
            if (x < 0 && y != floor(y))
                return jj_fail(c, line, TG_EUNSUPPORTED,
                               "unsupported: a complex power");
            r = pow(x, y);
            if (isinf(r) && !isinf(x) && !isinf(y))
                return jj_fail(c, line, TG_EINVAL,
                               "OverflowError: (34, 'Numerical result out of "
                               "range')");
            break;
        default:
            return type_error(c, line, os, a, b);
        }
        *out = jj_float(r);
        return 0;
    }
    if (op == JJ_OP_ADD && a.t == JJ_STR && b.t == JJ_STR)
        return str_add(c, line, a.u.s, b.u.s, out);
    if (op == JJ_OP_ADD && a.t == JJ_LIST && b.t == JJ_LIST &&
        a.u.l->seq == b.u.l->seq &&
        (a.u.l->seq == JJ_SEQ_LIST || a.u.l->seq == JJ_SEQ_TUPLE)) {
        const struct jj_list *x = a.u.l, *y = b.u.l;
        struct jj_list *r = jj_list_new(x->n + y->n, x->seq);
        if (r == NULL)
            return jj_oom(c, line);
        for (size_t i = 0; i < x->n; i++) {
            jj_ref(x->v[i]);
            r->v[r->n++] = x->v[i];
        }
        for (size_t i = 0; i < y->n; i++) {
            jj_ref(y->v[i]);
            r->v[r->n++] = y->v[i];
        }
        *out = jj_list_val(r);
        return 0;
    }
    if (op == JJ_OP_MUL) {
        bool seq_a = a.t == JJ_STR ||
                     (a.t == JJ_LIST && (a.u.l->seq == JJ_SEQ_LIST ||
                                         a.u.l->seq == JJ_SEQ_TUPLE));
        bool seq_b = b.t == JJ_STR ||
                     (b.t == JJ_LIST && (b.u.l->seq == JJ_SEQ_LIST ||
                                         b.u.l->seq == JJ_SEQ_TUPLE));
        if (seq_a && jj_is_intlike(b))
            return repeat(c, line, a, jj_as_int(b), out);
        if (seq_b && jj_is_intlike(a))
            return repeat(c, line, b, jj_as_int(a), out);
    }
    if (op == JJ_OP_MOD && a.t == JJ_STR)
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: printf-style string formatting (%%)");
    return type_error(c, line, os, a, b);
}

/* obj[a:b:c] */
static int getslice(struct jj_ctx *c, struct jj_scope *sc,
                    const struct jj_node *n, struct jj_val obj,
                    struct jj_val *out)
{
    const struct jj_node *s = n->b;
    struct jj_val parts[3] = {jj_none(), jj_none(), jj_none()};
    const struct jj_node *pn[3] = {s->a, s->b, s->c};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++)
        if (pn[i] != NULL)
            rc = jj_eval(c, sc, pn[i], &parts[i]);
    bool ok = true;
    for (int i = 0; i < 3; i++)
        if (parts[i].t != JJ_NONE && !jj_is_intlike(parts[i]))
            ok = false;
    bool seq = obj.t == JJ_STR ||
               (obj.t == JJ_LIST && (obj.u.l->seq == JJ_SEQ_LIST ||
                                     obj.u.l->seq == JJ_SEQ_TUPLE ||
                                     obj.u.l->seq == JJ_SEQ_RANGE));
    if (rc == 0 && obj.t == JJ_UNDEF)
        rc = jj_undef_error(c, n->line, obj);
    if (rc == 0 && (!ok || !seq)) {
        /* Python raises TypeError, which the sandbox turns into Undefined */
        *out = jj_undef_msg("the slice could not be applied");
    } else if (rc == 0) {
        int64_t step = parts[2].t == JJ_NONE ? 1 : jj_as_int(parts[2]);
        if (step == 0) {
            rc = jj_fail(c, n->line, TG_EINVAL,
                         "ValueError: slice step cannot be zero");
        } else {
            int64_t len = obj.t == JJ_STR ? (int64_t)obj.u.s->ncp
                                          : (int64_t)obj.u.l->n;
            int64_t start = parts[0].t != JJ_NONE ? jj_as_int(parts[0])
                            : step < 0            ? INT64_MAX
                                                  : 0;
            int64_t stop = parts[1].t != JJ_NONE ? jj_as_int(parts[1])
                           : step < 0            ? INT64_MIN
                                                 : INT64_MAX;
            if (start == INT64_MAX && step < 0)
                start = len - 1;
            if (stop == INT64_MIN && step < 0)
                stop = -len - 1;
            if (stop == INT64_MAX)
                stop = len;
            if (obj.t == JJ_STR) {
                rc = jj_text_slice(c, n->line, obj.u.s, start, stop, step,
                                   out);
                if (rc == 0)
                    out->u.s->markup = obj.u.s->markup;
            } else {
                /* PySlice_AdjustIndices */
                if (start < 0) {
                    start += len;
                    if (start < 0)
                        start = step < 0 ? -1 : 0;
                } else if (start >= len) {
                    start = step < 0 ? len - 1 : len;
                }
                if (stop < 0) {
                    stop += len;
                    if (stop < 0)
                        stop = step < 0 ? -1 : 0;
                } else if (stop >= len) {
                    stop = step < 0 ? len - 1 : len;
                }
                int64_t k = 0;
                if (step < 0 ? stop < start : start < stop)
                    k = step < 0 ? (start - stop - 1) / (-step) + 1
                                 : (stop - start - 1) / step + 1;
                const struct jj_list *l = obj.u.l;
                struct jj_list *r = jj_list_new((size_t)k, l->seq);
                if (r == NULL) {
                    rc = jj_oom(c, n->line);
                } else {
                    for (int64_t i = 0; i < k; i++) {
                        struct jj_val x = l->v[start + i * step];
                        jj_ref(x);
                        r->v[r->n++] = x;
                    }
                    if (l->seq == JJ_SEQ_RANGE) {
                        r->r_step = l->r_step * step;
                        r->r_start = l->r_start + start * l->r_step;
                        r->r_stop = r->r_start + k * r->r_step;
                    }
                    *out = jj_list_val(r);
                }
            }
        }
    }
    for (int i = 0; i < 3; i++)
        jj_unref(parts[i]);
    return rc;
}

/* ---- calls -------------------------------------------------------------------- */

int jj_call(struct jj_ctx *c, int line, struct jj_val callee,
            const struct jj_val *args, size_t nargs,
            const char *const *kwnames, const struct jj_val *kwvals,
            size_t nkw, struct jj_val *out)
{
    int rc = jj_step(c, line);
    if (rc)
        return rc;
    if (callee.t == JJ_UNDEF)
        return jj_undef_error(c, line, callee);
    if (callee.t != JJ_FUNC) {
        if (callee.t == JJ_LOOP)
            return jj_fail(c, line, TG_EUNSUPPORTED,
                           "unsupported: recursive loop() calls");
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: '%s' object is not callable",
                       jj_type_name(callee));
    }
    const struct jj_func *fn = callee.u.fn;
    switch (fn->kind) {
    case JJ_FN_MACRO:
        return jj_call_macro(c, line, fn, args, nargs, kwnames, kwvals, nkw,
                             out);
    case JJ_FN_GLOBAL:
        return jj_global_call(c, line, fn, args, nargs, kwnames, kwvals, nkw,
                              out);
    default:
        return jj_method_call(c, line, fn, args, nargs, kwnames, kwvals, nkw,
                              out);
    }
}

/* Evaluates n's positional and keyword argument nodes into arrays. */
struct argv {
    struct jj_val small[8];
    struct jj_val *v;
    size_t n;
};

static int eval_args(struct jj_ctx *c, struct jj_scope *sc,
                     const struct jj_node *n, struct argv *a)
{
    size_t total = n->n_kids + n->n_kw;
    a->v = total <= 8 ? a->small : malloc(total * sizeof(*a->v));
    a->n = 0;
    if (a->v == NULL)
        return jj_oom(c, n->line);
    for (size_t i = 0; i < n->n_kids; i++) {
        int rc = jj_eval(c, sc, n->kids[i], &a->v[a->n]);
        if (rc)
            return rc;
        a->n++;
    }
    for (size_t i = 0; i < n->n_kw; i++) {
        int rc = jj_eval(c, sc, n->kwvals[i], &a->v[a->n]);
        if (rc)
            return rc;
        a->n++;
    }
    return 0;
}

static void argv_free(struct argv *a)
{
    for (size_t i = 0; i < a->n; i++)
        jj_unref(a->v[i]);
    if (a->v != a->small)
        free(a->v);
}

/* ---- evaluation ----------------------------------------------------------------- */

static int eval_seq(struct jj_ctx *c, struct jj_scope *sc,
                    const struct jj_node *n, uint8_t seq, struct jj_val *out)
{
    struct jj_list *l = jj_list_new(n->n_kids, seq);
    if (l == NULL)
        return jj_oom(c, n->line);
    for (size_t i = 0; i < n->n_kids; i++) {
        int rc = jj_eval(c, sc, n->kids[i], &l->v[l->n]);
        if (rc) {
            jj_unref(jj_list_val(l));
            return rc;
        }
        l->n++;
    }
    *out = jj_list_val(l);
    return 0;
}

static int eval_dict(struct jj_ctx *c, struct jj_scope *sc,
                     const struct jj_node *n, struct jj_val *out)
{
    struct jj_dict *d = jj_dict_new(n->n_kids);
    if (d == NULL)
        return jj_oom(c, n->line);
    for (size_t i = 0; i < n->n_kids; i++) {
        struct jj_val k, v;
        int rc = jj_eval(c, sc, n->kids[i], &k);
        if (rc == 0 && !jj_hashable(k)) {
            rc = jj_fail(c, n->line, TG_EINVAL,
                         "TypeError: unhashable type: '%s'", jj_type_name(k));
            jj_unref(k);
        }
        if (rc == 0 && (rc = jj_eval(c, sc, n->kids2[i], &v)) != 0)
            jj_unref(k);
        if (rc == 0 && jj_dict_set(d, k, v) != 0) {
            jj_unref(k);
            jj_unref(v);
            rc = jj_oom(c, n->line);
        }
        if (rc) {
            jj_unref(jj_dict_val(d));
            return rc;
        }
    }
    *out = jj_dict_val(d);
    return 0;
}

static int eval_compare(struct jj_ctx *c, struct jj_scope *sc,
                        const struct jj_node *n, struct jj_val *out)
{
    struct jj_val left;
    int rc = jj_eval(c, sc, n->a, &left);
    if (rc)
        return rc;
    bool result = true;
    for (size_t i = 0; i < n->n_kids && result; i++) {
        struct jj_val right, r;
        if ((rc = jj_eval(c, sc, n->kids[i], &right)))
            break;
        rc = jj_binop(c, n->line, n->ops[i], left, right, &r);
        jj_unref(left);
        left = right;
        if (rc)
            break;
        result = r.u.b != 0;
    }
    jj_unref(left);
    if (rc)
        return rc;
    *out = jj_bool(result);
    return 0;
}

static int eval_concat(struct jj_ctx *c, struct jj_scope *sc,
                       const struct jj_node *n, struct jj_val *out)
{
    struct tg_buf b = {0};
    for (size_t i = 0; i < n->n_kids; i++) {
        struct jj_val v;
        int rc = jj_eval(c, sc, n->kids[i], &v);
        if (rc == 0)
            rc = jj_pystr(c, n->line, v, false, &b);
        if (rc == 0)
            jj_unref(v);
        if (rc == 0 && b.len > c->lim.max_output)
            rc = jj_fail(c, n->line, TG_ETOOBIG,
                         "a string exceeds the output limit of %zu bytes",
                         c->lim.max_output);
        if (rc) {
            tg_buf_free(&b);
            return rc;
        }
    }
    return jj_buf_to_val(c, n->line, &b, out);
}

int jj_eval(struct jj_ctx *c, struct jj_scope *sc, const struct jj_node *n,
            struct jj_val *out)
{
    int rc = jj_step(c, n->line);
    if (rc)
        return rc;
    struct jj_val a, b;
    switch (n->type) {
    case JJ_N_CONST:
        *out = n->cval;
        jj_ref(*out);
        return 0;
    case JJ_N_NAME:
        return jj_lookup(c, sc, n, out);
    case JJ_N_GETATTR:
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        rc = jj_getattr(c, n->line, a, n->sname, out);
        jj_unref(a);
        return rc;
    case JJ_N_GETITEM:
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        if (n->b->type == JJ_N_SLICE) {
            rc = getslice(c, sc, n, a, out);
        } else if ((rc = jj_eval(c, sc, n->b, &b)) == 0) {
            rc = jj_getitem(c, n->line, a, b, out);
            jj_unref(b);
        }
        jj_unref(a);
        return rc;
    case JJ_N_CALL: {
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        struct argv av;
        if ((rc = eval_args(c, sc, n, &av)) == 0)
            rc = jj_call(c, n->line, a, av.v, n->n_kids, n->kwnames,
                         av.v + n->n_kids, n->n_kw, out);
        argv_free(&av);
        jj_unref(a);
        return rc;
    }
    case JJ_N_FILTER: {
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        struct argv av;
        if ((rc = eval_args(c, sc, n, &av)) == 0)
            rc = jj_apply_filter(c, sc, n->line, n->fid, n->sval, a, av.v,
                                 n->n_kids, n->kwnames, av.v + n->n_kids,
                                 n->n_kw, out);
        argv_free(&av);
        jj_unref(a);
        return rc;
    }
    case JJ_N_TEST: {
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        struct argv av;
        bool r = false;
        if ((rc = eval_args(c, sc, n, &av)) == 0)
            rc = jj_apply_test(c, sc, n->line, n->fid, n->sval, a, av.v,
                               n->n_kids, n->kwnames, av.v + n->n_kids,
                               n->n_kw, &r);
        argv_free(&av);
        jj_unref(a);
        if (rc == 0)
            *out = jj_bool(r);
        return rc;
    }
    case JJ_N_NOT:
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        *out = jj_bool(!jj_truthy(a));
        jj_unref(a);
        return 0;
    case JJ_N_NEG:
    case JJ_N_POS:
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        if (a.t == JJ_UNDEF) {
            rc = jj_undef_error(c, n->line, a);
        } else if (jj_is_intlike(a)) {
            int64_t x = jj_as_int(a);
            if (n->type == JJ_N_NEG && x == INT64_MIN)
                rc = overflow(c, n->line);
            else
                *out = jj_int(n->type == JJ_N_NEG ? -x : x);
        } else if (a.t == JJ_FLOAT) {
            *out = jj_float(n->type == JJ_N_NEG ? -a.u.f : a.u.f);
        } else {
            rc = jj_fail(c, n->line, TG_EINVAL,
                         "TypeError: bad operand type for unary %c: '%s'",
                         n->type == JJ_N_NEG ? '-' : '+', jj_type_name(a));
        }
        jj_unref(a);
        return rc;
    case JJ_N_BINOP:
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        if ((rc = jj_eval(c, sc, n->b, &b)) == 0) {
            rc = jj_binop(c, n->line, n->op, a, b, out);
            jj_unref(b);
        }
        jj_unref(a);
        return rc;
    case JJ_N_AND:
    case JJ_N_OR:
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        if (jj_truthy(a) == (n->type == JJ_N_OR)) {
            *out = a;
            return 0;
        }
        jj_unref(a);
        return jj_eval(c, sc, n->b, out);
    case JJ_N_CONCAT:
        return eval_concat(c, sc, n, out);
    case JJ_N_COMPARE:
        return eval_compare(c, sc, n, out);
    case JJ_N_COND:
        if ((rc = jj_eval(c, sc, n->a, &a)))
            return rc;
        bool yes = jj_truthy(a);
        jj_unref(a);
        if (yes)
            return jj_eval(c, sc, n->b, out);
        if (n->c != NULL)
            return jj_eval(c, sc, n->c, out);
        *out = jj_undef_msg("the inline if-expression evaluated to false and "
                            "no else section was defined");
        return 0;
    case JJ_N_LIST:
        return eval_seq(c, sc, n, JJ_SEQ_LIST, out);
    case JJ_N_TUPLE:
        return eval_seq(c, sc, n, JJ_SEQ_TUPLE, out);
    case JJ_N_DICT:
        return eval_dict(c, sc, n, out);
    default:
        return jj_fail(c, n->line, TG_EINTERNAL, "cannot evaluate node %d",
                       n->type);
    }
}
