/* jj_eval.c — statement execution, scopes, loops, macro calls, limits and
 * the render entry point (jj_template.h, jj_internal.h).
 *
 * Scoping follows what jinja2 3.1's compiled code does: the template's top
 * level is one scope; every iteration of a for loop, every macro call and
 * every block body (set block, filter block, {% generation %}) runs in a
 * fresh child scope, so `set` inside them is local; `if` creates no scope.
 * Names a frame assigns before reading (the frame analysis of jj_parse.c)
 * start out undefined in that frame instead of falling through to the
 * template variables, as Jinja's "missing" does. Macros see the top-level
 * scope as it is when they are called, never the caller's loop variables. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

#define JJ_BREAK 1
#define JJ_CONTINUE 2

struct jj_var {
    const char *name;
    struct jj_val v;
};

struct jj_scope {
    struct jj_scope *parent;
    struct jj_var *v;
    size_t n, cap;
    struct jj_var small[6];
};

struct jj_vars {
    char **names;
    json_t **vals;
    size_t n, cap;
};

/* The template variables converted for one render. */
struct render_vars {
    const char **names;
    struct jj_val *vals;
    size_t n;
};

/* ---- failures and limits ------------------------------------------------- */

int jj_fail(struct jj_ctx *c, int line, int code, const char *fmt, ...)
{
    if (c->code != 0)
        return c->code;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->code = code;
    c->line = line;
    if (line > 0)
        tg_err_set(c->err, c->errlen, code, "chat template line %d: %s", line,
                   msg);
    else
        tg_err_set(c->err, c->errlen, code, "chat template: %s", msg);
    return code;
}

int jj_oom(struct jj_ctx *c, int line)
{
    return jj_fail(c, line, TG_ENOMEM, "out of memory while rendering");
}

int jj_step(struct jj_ctx *c, int line)
{
    if (++c->steps > c->lim.max_steps)
        return jj_fail(c, line, TG_ETOOBIG,
                       "rendering exceeded the limit of %llu steps "
                       "(max_steps)",
                       (unsigned long long)c->lim.max_steps);
    return 0;
}

/* ---- scopes ---------------------------------------------------------------- */

static void scope_init(struct jj_scope *s, struct jj_scope *parent)
{
    s->parent = parent;
    s->v = s->small;
    s->n = 0;
    s->cap = sizeof s->small / sizeof s->small[0];
}

static void scope_free(struct jj_scope *s)
{
    for (size_t i = 0; i < s->n; i++)
        jj_unref(s->v[i].v);
    if (s->v != s->small)
        free(s->v);
    s->n = 0;
}

static struct jj_var *scope_find(struct jj_scope *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i].name, name) == 0)
            return &s->v[i];
    return NULL;
}

/* Binds name in scope s; steals v. */
static int scope_set(struct jj_ctx *c, int line, struct jj_scope *s,
                     const char *name, struct jj_val v)
{
    struct jj_var *x = scope_find(s, name);
    if (x != NULL) {
        jj_unref(x->v);
        x->v = v;
        return 0;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap * 2;
        struct jj_var *p;
        if (s->v == s->small) {
            p = malloc(cap * sizeof(*p));
            if (p != NULL)
                memcpy(p, s->small, s->n * sizeof(*p));
        } else {
            p = realloc(s->v, cap * sizeof(*p));
        }
        if (p == NULL) {
            jj_unref(v);
            return jj_oom(c, line);
        }
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n].name = name;
    s->v[s->n].v = v;
    s->n++;
    return 0;
}

/* Binds a frame's "missing" names to Undefined. */
static int scope_missing(struct jj_ctx *c, int line, struct jj_scope *s,
                         const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct jj_str *nm = jj_str_cstr(names[i]);
        if (nm == NULL)
            return jj_oom(c, line);
        struct jj_val u = jj_undef_named(nm, NULL);
        jj_unref(jj_str_val(nm));
        int rc = scope_set(c, line, s, names[i], u);
        if (rc)
            return rc;
    }
    return 0;
}

int jj_lookup(struct jj_ctx *c, struct jj_scope *sc, const struct jj_node *n,
              struct jj_val *out)
{
    const char *name = n->sval;
    for (struct jj_scope *s = sc; s != NULL; s = s->parent) {
        struct jj_var *x = scope_find(s, name);
        if (x != NULL) {
            jj_ref(x->v);
            *out = x->v;
            return 0;
        }
    }
    const struct render_vars *rv = c->rvars;
    for (size_t i = 0; rv != NULL && i < rv->n; i++)
        if (strcmp(rv->names[i], name) == 0) {
            jj_ref(rv->vals[i]);
            *out = rv->vals[i];
            return 0;
        }
    if (jj_global_lookup(name, out))
        return 0;
    *out = jj_undef_named(n->sname, NULL);
    return 0;
}

/* ---- output ------------------------------------------------------------------ */

static int emit(struct jj_ctx *c, int line, const char *s, size_t n)
{
    c->total_out += n;
    if (c->total_out > c->lim.max_output)
        return jj_fail(c, line, TG_ETOOBIG,
                       "the rendered prompt exceeds the output limit of %zu "
                       "bytes (max_output)",
                       c->lim.max_output);
    if (tg_buf_append(&c->out, s, n) != 0)
        return jj_oom(c, line);
    return 0;
}

static int emit_val(struct jj_ctx *c, int line, struct jj_val v)
{
    if (v.t == JJ_STR)
        return emit(c, line, v.u.s->s, v.u.s->len);
    struct tg_buf b = {0};
    int rc = jj_pystr(c, line, v, false, &b);
    if (rc == 0)
        rc = emit(c, line, tg_buf_str(&b), b.len);
    tg_buf_free(&b);
    return rc;
}

struct capture {
    struct tg_buf out;
};

static void capture_begin(struct jj_ctx *c, struct capture *save)
{
    save->out = c->out;
    memset(&c->out, 0, sizeof(c->out));
}

/* Ends a capture: *out (when non-NULL and rc == 0) gets the captured text
 * as a string value; the outer buffer is restored. Captured bytes stay
 * counted in total_out, which bounds all the work spent producing text. */
static int capture_end(struct jj_ctx *c, int line, struct capture *save,
                       int rc, struct jj_val *out)
{
    if (rc == 0 && out != NULL)
        rc = jj_make_str(c, line, tg_buf_str(&c->out), c->out.len, out);
    tg_buf_free(&c->out);
    c->out = save->out;
    return rc;
}

/* ---- assignment ----------------------------------------------------------------- */

static int assign(struct jj_ctx *c, struct jj_scope *sc,
                  const struct jj_node *t, struct jj_val v)
{
    if (t->type == JJ_N_NAME)
        return scope_set(c, t->line, sc, t->sval, v);
    if (t->type == JJ_N_NSREF) {
        struct jj_node tmp = *t;
        tmp.type = JJ_N_NAME;
        struct jj_val ns;
        int rc = jj_lookup(c, sc, &tmp, &ns);
        if (rc) {
            jj_unref(v);
            return rc;
        }
        if (ns.t != JJ_NS) {
            jj_unref(ns);
            jj_unref(v);
            return jj_fail(c, t->line, TG_EINVAL,
                           "Cannot assign attribute on non-namespace object");
        }
        jj_ref(jj_str_val(t->sname));
        rc = jj_dict_set(ns.u.ns->attrs, jj_str_val(t->sname), v);
        jj_unref(ns);
        return rc ? jj_oom(c, t->line) : 0;
    }
    /* tuple unpacking */
    struct jj_list *items;
    int rc = jj_iterate(c, t->line, v, &items);
    jj_unref(v);
    if (rc)
        return rc;
    if (items->n != t->n_kids) {
        size_t got = items->n;
        jj_unref(jj_list_val(items));
        if (got > t->n_kids)
            return jj_fail(c, t->line, TG_EINVAL,
                           "ValueError: too many values to unpack "
                           "(expected %zu)",
                           t->n_kids);
        return jj_fail(c, t->line, TG_EINVAL,
                       "ValueError: not enough values to unpack (expected "
                       "%zu, got %zu)",
                       t->n_kids, got);
    }
    for (size_t i = 0; i < t->n_kids && rc == 0; i++) {
        jj_ref(items->v[i]);
        rc = assign(c, sc, t->kids[i], items->v[i]);
    }
    jj_unref(jj_list_val(items));
    return rc;
}

/* ---- statements ------------------------------------------------------------------ */

static int exec_stmts(struct jj_ctx *c, struct jj_scope *sc,
                      struct jj_node *const *body, size_t n);

/* Applies a filter chain whose innermost node has a == NULL to v. */
static int apply_chain(struct jj_ctx *c, struct jj_scope *sc,
                       const struct jj_node *f, struct jj_val v,
                       struct jj_val *out)
{
    struct jj_val in = v;
    if (f->a != NULL) {
        int rc = apply_chain(c, sc, f->a, v, &in);
        if (rc)
            return rc;
    }
    struct jj_node tmp = *f;
    struct jj_node cst = {.type = JJ_N_CONST, .line = f->line, .cval = in};
    tmp.a = &cst;
    int rc = jj_eval(c, sc, &tmp, out);
    if (f->a != NULL)
        jj_unref(in);
    return rc;
}

/* Renders body in a child scope with the frame's missing names and
 * returns the text as a new string. */
static int render_block(struct jj_ctx *c, struct jj_scope *sc,
                        const struct jj_node *n, struct jj_val *out)
{
    struct jj_scope inner;
    scope_init(&inner, sc);
    struct capture save;
    capture_begin(c, &save);
    int rc = scope_missing(c, n->line, &inner, n->missing, n->n_missing);
    if (rc == 0)
        rc = exec_stmts(c, &inner, n->body, n->n_body);
    if (rc == JJ_BREAK || rc == JJ_CONTINUE)
        rc = jj_fail(c, n->line, TG_EUNSUPPORTED,
                     "unsupported: break or continue inside a block tag");
    rc = capture_end(c, n->line, &save, rc, out);
    scope_free(&inner);
    return rc;
}

static int exec_for(struct jj_ctx *c, struct jj_scope *sc,
                    const struct jj_node *n)
{
    struct jj_val seq;
    int rc = jj_eval(c, sc, n->b, &seq);
    if (rc)
        return rc;
    struct jj_list *items;
    rc = jj_iterate(c, n->line, seq, &items);
    jj_unref(seq);
    if (rc)
        return rc;
    if (n->c != NULL) {
        /* {% for x in y if cond %}: loop.* counts only kept items */
        struct jj_list *kept = jj_list_new(items->n, JJ_SEQ_LIST);
        if (kept == NULL) {
            jj_unref(jj_list_val(items));
            return jj_oom(c, n->line);
        }
        for (size_t i = 0; i < items->n && rc == 0; i++) {
            struct jj_scope it;
            scope_init(&it, sc);
            struct jj_val t;
            if ((rc = jj_step(c, n->line)) == 0 &&
                (rc = scope_missing(c, n->line, &it, n->missing,
                                    n->n_missing)) == 0) {
                jj_ref(items->v[i]);
                if ((rc = assign(c, &it, n->a, items->v[i])) == 0 &&
                    (rc = jj_eval(c, &it, n->c, &t)) == 0) {
                    if (jj_truthy(t)) {
                        jj_ref(items->v[i]);
                        kept->v[kept->n++] = items->v[i];
                    }
                    jj_unref(t);
                }
            }
            scope_free(&it);
        }
        jj_unref(jj_list_val(items));
        items = kept;
        if (rc) {
            jj_unref(jj_list_val(items));
            return rc;
        }
    }
    if (items->n == 0) {
        jj_unref(jj_list_val(items));
        if (n->n_els == 0)
            return 0;
        struct jj_scope inner;
        scope_init(&inner, sc);
        rc = scope_missing(c, n->line, &inner, n->missing_els,
                           n->n_missing_els);
        if (rc == 0)
            rc = exec_stmts(c, &inner, n->els, n->n_els);
        scope_free(&inner);
        return rc;
    }
    struct jj_loop *lp = calloc(1, sizeof(*lp));
    if (lp == NULL) {
        jj_unref(jj_list_val(items));
        return jj_oom(c, n->line);
    }
    lp->h.rc = 1;
    lp->h.type = JJ_LOOP;
    lp->items = items;
    lp->depth = 1; /* loop.depth counts recursive loop() levels only */
    struct jj_val lv = {.t = JJ_LOOP};
    lv.u.lp = lp;
    for (size_t i = 0; i < items->n; i++) {
        if ((rc = jj_step(c, n->line)))
            break;
        lp->i = i;
        struct jj_scope it;
        scope_init(&it, sc);
        if ((rc = scope_missing(c, n->line, &it, n->missing, n->n_missing))) {
            scope_free(&it);
            break;
        }
        jj_ref(items->v[i]);
        if ((rc = assign(c, &it, n->a, items->v[i])) == 0) {
            jj_ref(lv);
            rc = scope_set(c, n->line, &it, "loop", lv);
        }
        if (rc) {
            scope_free(&it);
            break;
        }
        rc = exec_stmts(c, &it, n->body, n->n_body);
        scope_free(&it);
        if (rc == JJ_BREAK) {
            rc = 0;
            break;
        }
        if (rc == JJ_CONTINUE)
            rc = 0;
        if (rc)
            break;
    }
    jj_unref(lv);
    return rc;
}

static int exec_stmt(struct jj_ctx *c, struct jj_scope *sc,
                     const struct jj_node *n)
{
    int rc = jj_step(c, n->line);
    if (rc)
        return rc;
    struct jj_val v;
    switch (n->type) {
    case JJ_N_DATA:
        return emit(c, n->line, n->cval.u.s->s, n->cval.u.s->len);
    case JJ_N_OUTPUT:
        if ((rc = jj_eval(c, sc, n->a, &v)))
            return rc;
        rc = emit_val(c, n->line, v);
        jj_unref(v);
        return rc;
    case JJ_N_IF:
        if ((rc = jj_eval(c, sc, n->a, &v)))
            return rc;
        bool yes = jj_truthy(v);
        jj_unref(v);
        if (yes)
            return exec_stmts(c, sc, n->body, n->n_body);
        for (size_t i = 0; i < n->n_kids; i++) {
            const struct jj_node *e = n->kids[i];
            if ((rc = jj_eval(c, sc, e->a, &v)))
                return rc;
            yes = jj_truthy(v);
            jj_unref(v);
            if (yes)
                return exec_stmts(c, sc, e->body, e->n_body);
        }
        return exec_stmts(c, sc, n->els, n->n_els);
    case JJ_N_FOR:
        return exec_for(c, sc, n);
    case JJ_N_SET:
        if ((rc = jj_eval(c, sc, n->b, &v)))
            return rc;
        return assign(c, sc, n->a, v);
    case JJ_N_SET_BLOCK:
        if ((rc = render_block(c, sc, n, &v)))
            return rc;
        if (n->c != NULL) {
            struct jj_val f;
            rc = apply_chain(c, sc, n->c, v, &f);
            jj_unref(v);
            if (rc)
                return rc;
            v = f;
        }
        return assign(c, sc, n->a, v);
    case JJ_N_FILTER_BLOCK: {
        if ((rc = render_block(c, sc, n, &v)))
            return rc;
        struct jj_val f;
        rc = apply_chain(c, sc, n->c, v, &f);
        jj_unref(v);
        if (rc)
            return rc;
        rc = emit_val(c, n->line, f);
        jj_unref(f);
        return rc;
    }
    case JJ_N_SCOPE_BLOCK:
        if ((rc = render_block(c, sc, n, &v)))
            return rc;
        c->total_out -= v.u.s->len; /* counted when captured */
        rc = emit(c, n->line, v.u.s->s, v.u.s->len);
        jj_unref(v);
        return rc;
    case JJ_N_MACRO: {
        struct jj_func *fn = calloc(1, sizeof(*fn));
        if (fn == NULL)
            return jj_oom(c, n->line);
        fn->h.rc = 1;
        fn->h.type = JJ_FUNC;
        fn->kind = JJ_FN_MACRO;
        fn->name = n->sval;
        fn->macro = n;
        struct jj_val fv = {.t = JJ_FUNC};
        fv.u.fn = fn;
        return scope_set(c, n->line, sc, n->sval, fv);
    }
    case JJ_N_BREAK:
        return JJ_BREAK;
    case JJ_N_CONTINUE:
        return JJ_CONTINUE;
    default:
        return jj_fail(c, n->line, TG_EINTERNAL, "unknown statement");
    }
}

static int exec_stmts(struct jj_ctx *c, struct jj_scope *sc,
                      struct jj_node *const *body, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = exec_stmt(c, sc, body[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- macros ---------------------------------------------------------------------- */

int jj_call_macro(struct jj_ctx *c, int line, const struct jj_func *fn,
                  const struct jj_val *args, size_t nargs,
                  const char *const *kwnames, const struct jj_val *kwvals,
                  size_t nkw, struct jj_val *out)
{
    const struct jj_node *m = fn->macro;
    size_t np = m->n_kids, nd = m->n_kids2;
    if (nargs > np && !(m->flag & JJ_MACRO_VARARGS))
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: macro '%s' takes not more than %zu "
                       "argument(s)",
                       m->sval, np);
    if (c->depth >= c->lim.max_depth)
        return jj_fail(c, line, TG_ETOOBIG,
                       "macro calls nested deeper than %d (max_depth)",
                       c->lim.max_depth);
    bool *used = calloc(nkw + 1, sizeof(*used));
    if (used == NULL)
        return jj_oom(c, line);
    struct jj_scope sc;
    scope_init(&sc, c->root);
    int rc = scope_missing(c, line, &sc, m->missing, m->n_missing);
    for (size_t i = 0; i < np && rc == 0; i++) {
        const struct jj_node *p = m->kids[i];
        struct jj_val v;
        bool have = false;
        if (i < nargs) {
            v = args[i];
            jj_ref(v);
            have = true;
        } else {
            for (size_t k = 0; k < nkw; k++)
                if (!used[k] && strcmp(kwnames[k], p->sval) == 0) {
                    used[k] = true;
                    v = kwvals[k];
                    jj_ref(v);
                    have = true;
                    break;
                }
        }
        if (!have && i >= np - nd) {
            rc = jj_eval(c, &sc, m->kids2[i - (np - nd)], &v);
            have = rc == 0;
        } else if (!have) {
            v = jj_undef_msg("parameter was not provided");
            v.u.un.name = p->sname;
            have = true;
        }
        if (rc == 0)
            rc = scope_set(c, line, &sc, p->sval, v);
    }
    if (rc == 0 && (m->flag & JJ_MACRO_VARARGS)) {
        struct jj_list *va = jj_list_new(0, JJ_SEQ_TUPLE);
        for (size_t i = np; va != NULL && i < nargs; i++) {
            jj_ref(args[i]);
            if (jj_list_push(va, args[i]))
                jj_unref(args[i]);
        }
        rc = va == NULL ? jj_oom(c, line)
                        : scope_set(c, line, &sc, "varargs", jj_list_val(va));
    }
    size_t extra = 0;
    for (size_t k = 0; k < nkw; k++)
        extra += !used[k];
    if (rc == 0 && (m->flag & JJ_MACRO_KWARGS)) {
        struct jj_dict *kw = jj_dict_new(0);
        for (size_t k = 0; kw != NULL && k < nkw && rc == 0; k++) {
            if (used[k])
                continue;
            struct jj_val key;
            if ((rc = jj_make_str(c, line, kwnames[k], strlen(kwnames[k]),
                                  &key)))
                break;
            jj_ref(kwvals[k]);
            if (jj_dict_set(kw, key, kwvals[k]))
                rc = jj_oom(c, line);
        }
        if (kw == NULL)
            rc = jj_oom(c, line);
        else if (rc == 0)
            rc = scope_set(c, line, &sc, "kwargs", jj_dict_val(kw));
        else
            jj_unref(jj_dict_val(kw));
    } else if (rc == 0 && extra > 0) {
        for (size_t k = 0; k < nkw; k++)
            if (!used[k]) {
                rc = jj_fail(c, line, TG_EINVAL,
                             "TypeError: macro '%s' takes no keyword "
                             "argument '%s'",
                             m->sval, kwnames[k]);
                break;
            }
    }
    free(used);
    if (rc == 0) {
        struct capture save;
        capture_begin(c, &save);
        c->depth++;
        rc = exec_stmts(c, &sc, m->body, m->n_body);
        c->depth--;
        if (rc == JJ_BREAK || rc == JJ_CONTINUE)
            rc = jj_fail(c, line, TG_EINTERNAL, "break outside a loop");
        rc = capture_end(c, line, &save, rc, out);
    }
    scope_free(&sc);
    return rc;
}

/* ---- variables ----------------------------------------------------------------------- */

struct jj_vars *jj_vars_new(void)
{
    return calloc(1, sizeof(struct jj_vars));
}

void jj_vars_free(struct jj_vars *v)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < v->n; i++) {
        free(v->names[i]);
        json_decref(v->vals[i]);
    }
    free(v->names);
    free(v->vals);
    free(v);
}

void jj_vars_unset(struct jj_vars *v, const char *name)
{
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->names[i], name) == 0) {
            free(v->names[i]);
            json_decref(v->vals[i]);
            memmove(v->names + i, v->names + i + 1,
                    (v->n - i - 1) * sizeof(*v->names));
            memmove(v->vals + i, v->vals + i + 1,
                    (v->n - i - 1) * sizeof(*v->vals));
            v->n--;
            return;
        }
}

int jj_vars_set_json(struct jj_vars *v, const char *name, json_t *value)
{
    if (value == NULL)
        return TG_ENOMEM;
    jj_vars_unset(v, name);
    /* Names and values share one capacity: it moves once both have grown. */
    size_t cap_n = v->cap, cap_v = v->cap;
    if (TG_GROW(v->names, &cap_n, v->n + 1) ||
        TG_GROW(v->vals, &cap_v, v->n + 1))
        return TG_ENOMEM;
    v->cap = cap_n;
    char *nm = strdup(name);
    if (nm == NULL)
        return TG_ENOMEM;
    v->names[v->n] = nm;
    v->vals[v->n] = json_incref(value);
    v->n++;
    return 0;
}

int jj_vars_set_str(struct jj_vars *v, const char *name, const char *s)
{
    json_t *j = json_string(s);
    if (j == NULL)
        return TG_ENOMEM;
    int rc = jj_vars_set_json(v, name, j);
    json_decref(j);
    return rc;
}

int jj_vars_set_bool(struct jj_vars *v, const char *name, bool b)
{
    json_t *j = json_boolean(b);
    int rc = jj_vars_set_json(v, name, j);
    json_decref(j);
    return rc;
}

/* ---- render --------------------------------------------------------------------------- */

int jj_render(const struct jj_template *t, const struct jj_vars *vars,
              const struct jj_render_opts *opt, char **out, size_t *out_len,
              char *err, size_t errlen)
{
    *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    struct jj_ctx c = {.tmpl = t, .err = err, .errlen = errlen};
    if (opt != NULL)
        c.lim = opt->limits;
    if (c.lim.max_output == 0)
        c.lim.max_output = JJ_DEFAULT_MAX_OUTPUT;
    if (c.lim.max_steps == 0)
        c.lim.max_steps = JJ_DEFAULT_MAX_STEPS;
    if (c.lim.max_depth <= 0)
        c.lim.max_depth = JJ_DEFAULT_MAX_DEPTH;
    if (opt != NULL && opt->now != NULL) {
        c.now = *opt->now;
    } else {
        time_t now = time(NULL);
        localtime_r(&now, &c.now);
    }
    struct render_vars rv = {0};
    int rc = 0;
    if (vars != NULL && vars->n > 0) {
        rv.names = calloc(vars->n, sizeof(*rv.names));
        rv.vals = calloc(vars->n, sizeof(*rv.vals));
        if (rv.names == NULL || rv.vals == NULL)
            rc = jj_oom(&c, 0);
        for (size_t i = 0; rc == 0 && i < vars->n; i++) {
            rv.names[i] = vars->names[i];
            if ((rc = jj_from_json(&c, vars->vals[i], &rv.vals[i])) == 0)
                rv.n++;
        }
    }
    c.rvars = &rv;
    struct jj_scope root;
    scope_init(&root, NULL);
    c.root = &root;
    if (rc == 0)
        rc = scope_missing(&c, 1, &root, t->root->missing,
                           t->root->n_missing);
    if (rc == 0)
        rc = exec_stmts(&c, &root, t->root->body, t->root->n_body);
    if (rc == JJ_BREAK || rc == JJ_CONTINUE)
        rc = jj_fail(&c, 0, TG_EINTERNAL, "break outside a loop");
    scope_free(&root);
    for (size_t i = 0; i < rv.n; i++)
        jj_unref(rv.vals[i]);
    free(rv.names);
    free(rv.vals);
    /* namespaces may reference each other: clear them all, then free */
    for (struct jj_ns *ns = c.all_ns; ns != NULL; ns = ns->next_all) {
        struct jj_dict *a = ns->attrs;
        ns->attrs = NULL;
        if (a != NULL)
            jj_unref(jj_dict_val(a));
    }
    for (struct jj_ns *ns = c.all_ns, *nx; ns != NULL; ns = nx) {
        nx = ns->next_all;
        free(ns);
    }
    if (rc != 0) {
        tg_buf_free(&c.out);
        if (c.code == 0)
            tg_err_set(err, errlen, rc, "chat template: render failed");
        return rc < 0 ? rc : TG_EINTERNAL;
    }
    size_t n = 0;
    *out = tg_buf_steal(&c.out, &n);
    if (*out == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    if (out_len != NULL)
        *out_len = n;
    return 0;
}

int jj_json_dumps_py(const json_t *v, bool ensure_ascii, char **out,
                     size_t *len)
{
    *out = NULL;
    struct jj_ctx c = {.lim = {.max_output = JJ_DEFAULT_MAX_OUTPUT,
                               .max_steps = JJ_DEFAULT_MAX_STEPS,
                               .max_depth = JJ_DEFAULT_MAX_DEPTH}};
    char err[128];
    c.err = err;
    c.errlen = sizeof err;
    struct jj_val val;
    int rc = jj_from_json(&c, v, &val);
    if (rc != 0)
        return rc;
    struct jj_json_opts o = {.ensure_ascii = ensure_ascii,
                             .item_sep = ", ",
                             .item_sep_len = 2,
                             .key_sep = ": ",
                             .key_sep_len = 2};
    struct tg_buf b = {0};
    rc = jj_json_dumps(&c, 0, val, &o, &b);
    jj_unref(val);
    if (rc != 0) {
        tg_buf_free(&b);
        return rc;
    }
    *out = tg_buf_steal(&b, len);
    return *out != NULL ? 0 : TG_ENOMEM;
}
