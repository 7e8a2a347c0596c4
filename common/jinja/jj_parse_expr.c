/* jj_parse_expr.c — expressions of jinja2 3.1's parser (parse_tuple down to
 * parse_primary, filters, tests, calls, subscripts and slices), rule for
 * rule, into AST nodes (jj_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_internal.h"
#include "common/jinja/jj_parse_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* ---- expressions -------------------------------------------------------- */

static int parse_unary(struct parser *P, bool with_filter,
                       struct jj_node **out);
static int parse_postfix(struct parser *P, struct jj_node **n);

/* Extra tuple-end rules are names ("in", "recursive") or none. */
static bool tuple_end(struct parser *P, const char *extra)
{
    struct jj_token *t = jj__p_cur(P);
    if (t->type == JJ_T_VAR_END || t->type == JJ_T_BLOCK_END ||
        jj__p_is_op(t, JJ_TO_RPAREN))
        return true;
    return extra != NULL && jj__p_is_name(t, extra);
}

int jj__parse_tuple(struct parser *P, enum tuple_mode mode,
                       const char *extra_end, bool explicit_parens,
                       struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    struct nvec args = {0};
    bool is_tuple = false;
    int rc = 0;
    for (;;) {
        if (args.n > 0 && (rc = jj__p_expect_op(P, JJ_TO_COMMA)))
            goto fail;
        if (tuple_end(P, extra_end))
            break;
        struct jj_node *e = NULL;
        if (mode == TUPLE_SIMPLE)
            rc = jj__parse_primary(P, &e);
        else
            rc = jj__parse_expression(P, mode == TUPLE_FULL, &e);
        if (rc || (rc = jj__p_nvec_push(&args, e)))
            goto fail;
        if (jj__p_is_op(jj__p_cur(P), JJ_TO_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n > 0) {
            *out = args.v[0];
            free(args.v);
            return 0;
        }
        if (!explicit_parens) {
            free(args.v);
            return jj__p_unexpected(P, "an expression");
        }
    }
    struct jj_node *t = jj__p_node(P, JJ_N_TUPLE, line);
    if (t == NULL || (t->kids = jj__p_nvec_done(P, &args, &t->n_kids)) == NULL) {
        free(args.v);
        return jj__p_poom(P);
    }
    *out = t;
    return 0;
fail:
    free(args.v);
    return rc;
}

static int parse_list(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    int rc = jj__p_expect_op(P, JJ_TO_LBRACKET);
    if (rc)
        return rc;
    struct nvec items = {0};
    while (!jj__p_is_op(jj__p_cur(P), JJ_TO_RBRACKET)) {
        if (items.n > 0 && (rc = jj__p_expect_op(P, JJ_TO_COMMA)))
            goto fail;
        if (jj__p_is_op(jj__p_cur(P), JJ_TO_RBRACKET))
            break;
        struct jj_node *e = NULL;
        if ((rc = jj__parse_expression(P, true, &e)) ||
            (rc = jj__p_nvec_push(&items, e)))
            goto fail;
    }
    if ((rc = jj__p_expect_op(P, JJ_TO_RBRACKET)))
        goto fail;
    struct jj_node *n = jj__p_node(P, JJ_N_LIST, line);
    if (n == NULL || (n->kids = jj__p_nvec_done(P, &items, &n->n_kids)) == NULL) {
        free(items.v);
        return jj__p_poom(P);
    }
    *out = n;
    return 0;
fail:
    free(items.v);
    return rc;
}

static int parse_dict(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    int rc = jj__p_expect_op(P, JJ_TO_LBRACE);
    if (rc)
        return rc;
    struct nvec keys = {0}, vals = {0};
    while (!jj__p_is_op(jj__p_cur(P), JJ_TO_RBRACE)) {
        if (keys.n > 0 && (rc = jj__p_expect_op(P, JJ_TO_COMMA)))
            goto fail;
        if (jj__p_is_op(jj__p_cur(P), JJ_TO_RBRACE))
            break;
        struct jj_node *k = NULL, *v = NULL;
        if ((rc = jj__parse_expression(P, true, &k)) ||
            (rc = jj__p_expect_op(P, JJ_TO_COLON)) ||
            (rc = jj__parse_expression(P, true, &v)) ||
            (rc = jj__p_nvec_push(&keys, k)) || (rc = jj__p_nvec_push(&vals, v)))
            goto fail;
    }
    if ((rc = jj__p_expect_op(P, JJ_TO_RBRACE)))
        goto fail;
    struct jj_node *n = jj__p_node(P, JJ_N_DICT, line);
    if (n == NULL || (n->kids = jj__p_nvec_done(P, &keys, &n->n_kids)) == NULL ||
        (n->kids2 = jj__p_nvec_done(P, &vals, &n->n_kids2)) == NULL) {
        free(keys.v);
        free(vals.v);
        return jj__p_poom(P);
    }
    *out = n;
    return 0;
fail:
    free(keys.v);
    free(vals.v);
    return rc;
}

static int make_const(struct parser *P, int line, struct jj_val v,
                      struct jj_node **out)
{
    struct jj_node *n = jj__p_node(P, JJ_N_CONST, line);
    if (n == NULL)
        return jj__p_poom(P);
    n->cval = v;
    *out = n;
    return 0;
}

int jj__parse_primary(struct parser *P, struct jj_node **out)
{
    int rc = jj__p_enter(P);
    if (rc)
        return rc;
    struct jj_token *t = jj__p_cur(P);
    int line = t->line;
    if (t->type == JJ_T_NAME) {
        const char *s = t->s;
        jj__p_advance(P);
        if (!strcmp(s, "true") || !strcmp(s, "True"))
            rc = make_const(P, line, jj_bool(1), out);
        else if (!strcmp(s, "false") || !strcmp(s, "False"))
            rc = make_const(P, line, jj_bool(0), out);
        else if (!strcmp(s, "none") || !strcmp(s, "None"))
            rc = make_const(P, line, jj_none(), out);
        else {
            struct jj_node *n = jj__p_node(P, JJ_N_NAME, line);
            if (n == NULL)
                return jj__p_poom(P);
            n->sval = s;
            n->sname = jj__p_const_str(P, s, strlen(s));
            if (n->sname == NULL)
                return jj__p_poom(P);
            *out = n;
        }
    } else if (t->type == JJ_T_STRING) {
        /* adjacent string literals concatenate */
        size_t total = 0, k = P->i;
        while (P->t[k].type == JJ_T_STRING)
            total += P->t[k++].len;
        char *buf = malloc(total + 1);
        if (buf == NULL)
            return jj__p_poom(P);
        size_t o = 0;
        while (jj__p_cur(P)->type == JJ_T_STRING) {
            memcpy(buf + o, jj__p_cur(P)->s, jj__p_cur(P)->len);
            o += jj__p_cur(P)->len;
            jj__p_advance(P);
        }
        struct jj_str *js = jj__p_const_str(P, buf, o);
        free(buf);
        if (js == NULL)
            return jj__p_poom(P);
        struct jj_val v = {.t = JJ_STR};
        v.u.s = js;
        rc = make_const(P, line, v, out);
    } else if (t->type == JJ_T_INT) {
        jj__p_advance(P);
        rc = make_const(P, line, jj_int(t->i), out);
    } else if (t->type == JJ_T_FLOAT) {
        jj__p_advance(P);
        rc = make_const(P, line, jj_float(t->f), out);
    } else if (jj__p_is_op(t, JJ_TO_LPAREN)) {
        jj__p_advance(P);
        if ((rc = jj__parse_tuple(P, TUPLE_FULL, NULL, true, out)) == 0)
            rc = jj__p_expect_op(P, JJ_TO_RPAREN);
    } else if (jj__p_is_op(t, JJ_TO_LBRACKET)) {
        rc = parse_list(P, out);
    } else if (jj__p_is_op(t, JJ_TO_LBRACE)) {
        rc = parse_dict(P, out);
    } else {
        rc = jj__p_unexpected(P, NULL);
    }
    P->depth--;
    return rc;
}

/* Call arguments "(a, b, k=v)" into n->kids / kwnames / kwvals. */
static int parse_call_args(struct parser *P, struct jj_node *n)
{
    int rc = jj__p_expect_op(P, JJ_TO_LPAREN);
    if (rc)
        return rc;
    struct nvec args = {0}, kwv = {0};
    const char **kwn = NULL;
    size_t nkw = 0, capkw = 0;
    bool require_comma = false;
    while (!jj__p_is_op(jj__p_cur(P), JJ_TO_RPAREN)) {
        if (require_comma) {
            if ((rc = jj__p_expect_op(P, JJ_TO_COMMA)))
                goto fail;
            if (jj__p_is_op(jj__p_cur(P), JJ_TO_RPAREN))
                break;
        }
        if (jj__p_is_op(jj__p_cur(P), JJ_TO_MUL) || jj__p_is_op(jj__p_cur(P), JJ_TO_POW)) {
            rc = jj__p_pfail(P, jj__p_cur(P)->line, TG_EUNSUPPORTED,
                       "unsupported: *args / **kwargs in a call");
            goto fail;
        }
        struct jj_node *e = NULL;
        if (jj__p_cur(P)->type == JJ_T_NAME && jj__p_is_op(jj__p_look(P), JJ_TO_ASSIGN)) {
            const char *key = jj__p_cur(P)->s;
            jj__p_advance(P);
            jj__p_advance(P);
            if ((rc = jj__parse_expression(P, true, &e)))
                goto fail;
            if (TG_GROW(kwn, &capkw, nkw + 1)) {
                rc = jj__p_poom(P);
                goto fail;
            }
            kwn[nkw++] = key;
            if ((rc = jj__p_nvec_push(&kwv, e)))
                goto fail;
        } else {
            if (nkw > 0) {
                rc = jj__p_pfail(P, jj__p_cur(P)->line, TG_EFORMAT,
                           "Invalid argument syntax");
                goto fail;
            }
            if ((rc = jj__parse_expression(P, true, &e)) ||
                (rc = jj__p_nvec_push(&args, e)))
                goto fail;
        }
        require_comma = true;
    }
    if ((rc = jj__p_expect_op(P, JJ_TO_RPAREN)))
        goto fail;
    n->kids = jj__p_nvec_done(P, &args, &n->n_kids);
    size_t nv;
    n->kwvals = jj__p_nvec_done(P, &kwv, &nv);
    n->n_kw = nkw;
    n->kwnames = jj__arena_alloc(P->arena, (nkw + 1) * sizeof(char *));
    if (n->kids == NULL || n->kwvals == NULL || n->kwnames == NULL) {
        free(kwn);
        return jj__p_poom(P);
    }
    if (nkw > 0)
        memcpy(n->kwnames, kwn, nkw * sizeof(char *));
    free(kwn);
    return 0;
fail:
    free(args.v);
    free(kwv.v);
    free(kwn);
    return rc;
}

static int parse_call(struct parser *P, struct jj_node **n)
{
    struct jj_node *c = jj__p_node(P, JJ_N_CALL, jj__p_cur(P)->line);
    if (c == NULL)
        return jj__p_poom(P);
    c->a = *n;
    int rc = parse_call_args(P, c);
    if (rc == 0)
        *n = c;
    return rc;
}

static int parse_subscribed(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    struct jj_node *args[3] = {NULL, NULL, NULL};
    int rc;
    if (jj__p_is_op(jj__p_cur(P), JJ_TO_COLON)) {
        jj__p_advance(P);
    } else {
        struct jj_node *e = NULL;
        if ((rc = jj__parse_expression(P, true, &e)))
            return rc;
        if (!jj__p_is_op(jj__p_cur(P), JJ_TO_COLON)) {
            *out = e;
            return 0;
        }
        jj__p_advance(P);
        args[0] = e;
    }
    if (!jj__p_is_op(jj__p_cur(P), JJ_TO_COLON) && !jj__p_is_op(jj__p_cur(P), JJ_TO_RBRACKET) &&
        !jj__p_is_op(jj__p_cur(P), JJ_TO_COMMA)) {
        if ((rc = jj__parse_expression(P, true, &args[1])))
            return rc;
    }
    if (jj__p_is_op(jj__p_cur(P), JJ_TO_COLON)) {
        jj__p_advance(P);
        if (!jj__p_is_op(jj__p_cur(P), JJ_TO_RBRACKET) && !jj__p_is_op(jj__p_cur(P), JJ_TO_COMMA)) {
            if ((rc = jj__parse_expression(P, true, &args[2])))
                return rc;
        }
    }
    struct jj_node *s = jj__p_node(P, JJ_N_SLICE, line);
    if (s == NULL)
        return jj__p_poom(P);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    *out = s;
    return 0;
}

static int parse_subscript(struct parser *P, struct jj_node **n)
{
    struct jj_token *t = jj__p_cur(P);
    int line = t->line;
    jj__p_advance(P);
    if (t->op == JJ_TO_DOT) {
        struct jj_token *a = jj__p_cur(P);
        jj__p_advance(P);
        if (a->type == JJ_T_NAME) {
            struct jj_node *g = jj__p_node(P, JJ_N_GETATTR, line);
            if (g == NULL)
                return jj__p_poom(P);
            g->a = *n;
            g->sval = a->s;
            g->sname = jj__p_const_str(P, a->s, a->len);
            if (g->sname == NULL)
                return jj__p_poom(P);
            *n = g;
            return 0;
        }
        if (a->type != JJ_T_INT) {
            P->i--;
            return jj__p_unexpected(P, "name or number");
        }
        struct jj_node *k = NULL, *g = jj__p_node(P, JJ_N_GETITEM, line);
        if (g == NULL || make_const(P, line, jj_int(a->i), &k))
            return jj__p_poom(P);
        g->a = *n;
        g->b = k;
        *n = g;
        return 0;
    }
    /* '[' */
    struct nvec args = {0};
    int rc;
    while (!jj__p_is_op(jj__p_cur(P), JJ_TO_RBRACKET)) {
        if (args.n > 0 && (rc = jj__p_expect_op(P, JJ_TO_COMMA)))
            goto fail;
        struct jj_node *e = NULL;
        if ((rc = parse_subscribed(P, &e)) || (rc = jj__p_nvec_push(&args, e)))
            goto fail;
    }
    if ((rc = jj__p_expect_op(P, JJ_TO_RBRACKET)))
        goto fail;
    struct jj_node *g = jj__p_node(P, JJ_N_GETITEM, line);
    if (g == NULL)
        goto oom;
    g->a = *n;
    if (args.n == 1) {
        g->b = args.v[0];
        free(args.v);
    } else {
        struct jj_node *tp = jj__p_node(P, JJ_N_TUPLE, line);
        if (tp == NULL || (tp->kids = jj__p_nvec_done(P, &args, &tp->n_kids)) ==
                              NULL)
            goto oom;
        g->b = tp;
    }
    *n = g;
    return 0;
oom:
    free(args.v);
    return jj__p_poom(P);
fail:
    free(args.v);
    return rc;
}

static int parse_postfix(struct parser *P, struct jj_node **n)
{
    for (;;) {
        struct jj_token *t = jj__p_cur(P);
        int rc;
        if (jj__p_is_op(t, JJ_TO_DOT) || jj__p_is_op(t, JJ_TO_LBRACKET))
            rc = parse_subscript(P, n);
        else if (jj__p_is_op(t, JJ_TO_LPAREN))
            rc = parse_call(P, n);
        else
            return 0;
        if (rc)
            return rc;
    }
}

/* A dotted filter or test name into the arena. */
static int parse_dotted_name(struct parser *P, const char **out)
{
    if (jj__p_cur(P)->type != JJ_T_NAME)
        return jj__p_unexpected(P, "name");
    /* No filter or test has a longer name: one that does not fit is
     * refused whole, never looked up cut. */
    char buf[256];
    size_t l = 0;
    bool fits = true;
    for (bool first = true;; first = false) {
        if (!first) {
            jj__p_advance(P); /* the dot */
            if (jj__p_cur(P)->type != JJ_T_NAME)
                return jj__p_unexpected(P, "name");
        }
        int k = snprintf(buf + l, sizeof buf - l, "%s%s", first ? "" : ".",
                         jj__p_cur(P)->s);
        fits = fits && k >= 0 && (size_t)k < sizeof buf - l;
        l = fits ? l + (size_t)k : l;
        jj__p_advance(P);
        if (!jj__p_is_op(jj__p_cur(P), JJ_TO_DOT))
            break;
    }
    if (!fits)
        return jj__p_pfail(P, jj__p_cur(P)->line, TG_ETOOBIG,
                           "a filter or test name longer than %zu bytes",
                           sizeof buf - 1);
    *out = jj__arena_strndup(P->arena, buf, strlen(buf));
    return *out != NULL ? 0 : jj__p_poom(P);
}

int jj__parse_filter(struct parser *P, struct jj_node **n,
                        bool start_inline)
{
    while (jj__p_is_op(jj__p_cur(P), JJ_TO_PIPE) || start_inline) {
        if (!start_inline)
            jj__p_advance(P);
        int line = jj__p_cur(P)->line;
        const char *name;
        int rc = parse_dotted_name(P, &name);
        if (rc)
            return rc;
        struct jj_node *f = jj__p_node(P, JJ_N_FILTER, line);
        if (f == NULL)
            return jj__p_poom(P);
        f->a = *n;
        f->sval = name;
        f->fid = jj_filter_id(name);
        if (f->fid == -2)
            return jj__p_pfail(P, line, TG_EFORMAT, "No filter named '%s'.", name);
        if (f->fid == -1)
            jj__p_note_unsupported(P, line, "filter", name);
        if (jj__p_is_op(jj__p_cur(P), JJ_TO_LPAREN)) {
            if ((rc = parse_call_args(P, f)))
                return rc;
        } else {
            f->kids = jj__arena_alloc(P->arena, sizeof(*f->kids));
            f->kwvals = jj__arena_alloc(P->arena, sizeof(*f->kwvals));
            f->kwnames = jj__arena_alloc(P->arena, sizeof(*f->kwnames));
            if (!f->kids || !f->kwvals || !f->kwnames)
                return jj__p_poom(P);
        }
        *n = f;
        start_inline = false;
    }
    return 0;
}

static int parse_test(struct parser *P, struct jj_node **n)
{
    int line = jj__p_cur(P)->line;
    jj__p_advance(P); /* 'is' */
    bool negated = false;
    if (jj__p_is_name(jj__p_cur(P), "not")) {
        jj__p_advance(P);
        negated = true;
    }
    const char *name;
    int rc = parse_dotted_name(P, &name);
    if (rc)
        return rc;
    struct jj_node *t = jj__p_node(P, JJ_N_TEST, line);
    if (t == NULL)
        return jj__p_poom(P);
    t->a = *n;
    t->sval = name;
    t->fid = jj_test_id(name);
    if (t->fid == -2)
        return jj__p_pfail(P, line, TG_EFORMAT, "No test named '%s'.", name);
    if (t->fid == -1)
        jj__p_note_unsupported(P, line, "test", name);
    struct jj_token *c = jj__p_cur(P);
    if (jj__p_is_op(c, JJ_TO_LPAREN)) {
        if ((rc = parse_call_args(P, t)))
            return rc;
    } else {
        t->kids = jj__arena_alloc(P->arena, 2 * sizeof(*t->kids));
        t->kwvals = jj__arena_alloc(P->arena, sizeof(*t->kwvals));
        t->kwnames = jj__arena_alloc(P->arena, sizeof(*t->kwnames));
        if (!t->kids || !t->kwvals || !t->kwnames)
            return jj__p_poom(P);
        bool arg_start = c->type == JJ_T_NAME || c->type == JJ_T_STRING ||
                         c->type == JJ_T_INT || c->type == JJ_T_FLOAT ||
                         jj__p_is_op(c, JJ_TO_LPAREN) || jj__p_is_op(c, JJ_TO_LBRACKET) ||
                         jj__p_is_op(c, JJ_TO_LBRACE);
        if (arg_start && !jj__p_is_name(c, "else") && !jj__p_is_name(c, "or") &&
            !jj__p_is_name(c, "and")) {
            if (jj__p_is_name(c, "is"))
                return jj__p_pfail(P, c->line, TG_EFORMAT,
                             "You cannot chain multiple tests with is");
            struct jj_node *arg;
            if ((rc = jj__parse_primary(P, &arg)) || (rc = parse_postfix(P, &arg)))
                return rc;
            t->kids[0] = arg;
            t->n_kids = 1;
        }
    }
    if (negated) {
        struct jj_node *nt = jj__p_node(P, JJ_N_NOT, line);
        if (nt == NULL)
            return jj__p_poom(P);
        nt->a = t;
        t = nt;
    }
    *n = t;
    return 0;
}

static int parse_filter_expr(struct parser *P, struct jj_node **n)
{
    for (;;) {
        int rc;
        if (jj__p_is_op(jj__p_cur(P), JJ_TO_PIPE))
            rc = jj__parse_filter(P, n, false);
        else if (jj__p_is_name(jj__p_cur(P), "is"))
            rc = parse_test(P, n);
        else if (jj__p_is_op(jj__p_cur(P), JJ_TO_LPAREN))
            rc = parse_call(P, n);
        else
            return 0;
        if (rc)
            return rc;
    }
}

static int parse_unary(struct parser *P, bool with_filter,
                       struct jj_node **out)
{
    int rc = jj__p_enter(P);
    if (rc)
        return rc;
    struct jj_token *t = jj__p_cur(P);
    struct jj_node *n;
    if (jj__p_is_op(t, JJ_TO_SUB) || jj__p_is_op(t, JJ_TO_ADD)) {
        jj__p_advance(P);
        struct jj_node *x;
        if ((rc = parse_unary(P, false, &x)))
            goto out;
        n = jj__p_node(P, t->op == JJ_TO_SUB ? JJ_N_NEG : JJ_N_POS, t->line);
        if (n == NULL) {
            rc = jj__p_poom(P);
            goto out;
        }
        n->a = x;
    } else if ((rc = jj__parse_primary(P, &n))) {
        goto out;
    }
    if ((rc = parse_postfix(P, &n)))
        goto out;
    if (with_filter && (rc = parse_filter_expr(P, &n)))
        goto out;
    *out = n;
out:
    P->depth--;
    return rc;
}

static int binop_node(struct parser *P, int line, uint8_t type, uint8_t op,
                      struct jj_node *a, struct jj_node *b,
                      struct jj_node **out)
{
    struct jj_node *n = jj__p_node(P, type, line);
    if (n == NULL)
        return jj__p_poom(P);
    n->op = op;
    n->a = a;
    n->b = b;
    *out = n;
    return 0;
}

static int parse_pow(struct parser *P, struct jj_node **out)
{
    int rc = parse_unary(P, true, out);
    while (rc == 0 && jj__p_is_op(jj__p_cur(P), JJ_TO_POW)) {
        int line = jj__p_cur(P)->line;
        jj__p_advance(P);
        struct jj_node *r = NULL;
        if ((rc = parse_unary(P, true, &r)) == 0)
            rc = binop_node(P, line, JJ_N_BINOP, JJ_OP_POW, *out, r, out);
    }
    return rc;
}

static int parse_math2(struct parser *P, struct jj_node **out)
{
    int rc = parse_pow(P, out);
    for (;;) {
        if (rc)
            return rc;
        struct jj_token *t = jj__p_cur(P);
        uint8_t op = jj__p_is_op(t, JJ_TO_MUL)        ? JJ_OP_MUL
                     : jj__p_is_op(t, JJ_TO_DIV)      ? JJ_OP_DIV
                     : jj__p_is_op(t, JJ_TO_FLOORDIV) ? JJ_OP_FLOORDIV
                     : jj__p_is_op(t, JJ_TO_MOD)      ? JJ_OP_MOD
                                                : 0;
        if (op == 0)
            return 0;
        jj__p_advance(P);
        struct jj_node *r = NULL;
        if ((rc = parse_pow(P, &r)) == 0)
            rc = binop_node(P, t->line, JJ_N_BINOP, op, *out, r, out);
    }
}

static int parse_concat(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    struct jj_node *first;
    int rc = parse_math2(P, &first);
    if (rc || !jj__p_is_op(jj__p_cur(P), JJ_TO_TILDE)) {
        *out = first;
        return rc;
    }
    struct nvec args = {0};
    if ((rc = jj__p_nvec_push(&args, first)))
        return jj__p_poom(P);
    while (jj__p_is_op(jj__p_cur(P), JJ_TO_TILDE)) {
        jj__p_advance(P);
        struct jj_node *e = NULL;
        if ((rc = parse_math2(P, &e)) || (rc = jj__p_nvec_push(&args, e))) {
            free(args.v);
            return rc;
        }
    }
    struct jj_node *n = jj__p_node(P, JJ_N_CONCAT, line);
    if (n == NULL || (n->kids = jj__p_nvec_done(P, &args, &n->n_kids)) == NULL) {
        free(args.v);
        return jj__p_poom(P);
    }
    *out = n;
    return 0;
}

static int parse_math1(struct parser *P, struct jj_node **out)
{
    int rc = parse_concat(P, out);
    for (;;) {
        if (rc)
            return rc;
        struct jj_token *t = jj__p_cur(P);
        uint8_t op = jj__p_is_op(t, JJ_TO_ADD)   ? JJ_OP_ADD
                     : jj__p_is_op(t, JJ_TO_SUB) ? JJ_OP_SUB
                                           : 0;
        if (op == 0)
            return 0;
        jj__p_advance(P);
        struct jj_node *r = NULL;
        if ((rc = parse_concat(P, &r)) == 0)
            rc = binop_node(P, t->line, JJ_N_BINOP, op, *out, r, out);
    }
}

static int parse_compare(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    struct jj_node *expr;
    int rc = parse_math1(P, &expr);
    if (rc)
        return rc;
    struct nvec operands = {0};
    uint8_t ops[64];
    size_t nops = 0;
    for (;;) {
        struct jj_token *t = jj__p_cur(P);
        uint8_t op = 0;
        if (t->type == JJ_T_OP) {
            op = t->op == JJ_TO_EQ     ? JJ_OP_EQ
                 : t->op == JJ_TO_NE   ? JJ_OP_NE
                 : t->op == JJ_TO_LT   ? JJ_OP_LT
                 : t->op == JJ_TO_LTEQ ? JJ_OP_LE
                 : t->op == JJ_TO_GT   ? JJ_OP_GT
                 : t->op == JJ_TO_GTEQ ? JJ_OP_GE
                                       : 0;
            if (op)
                jj__p_advance(P);
        } else if (jj__p_is_name(t, "in")) {
            op = JJ_OP_IN;
            jj__p_advance(P);
        } else if (jj__p_is_name(t, "not") && jj__p_is_name(jj__p_look(P), "in")) {
            op = JJ_OP_NOTIN;
            jj__p_advance(P);
            jj__p_advance(P);
        }
        if (op == 0)
            break;
        if (nops == sizeof ops) {
            free(operands.v);
            return jj__p_pfail(P, line, TG_ETOOBIG, "comparison chain too long");
        }
        struct jj_node *e = NULL;
        if ((rc = parse_math1(P, &e)) || (rc = jj__p_nvec_push(&operands, e))) {
            free(operands.v);
            return rc;
        }
        ops[nops++] = op;
    }
    if (nops == 0) {
        *out = expr;
        return 0;
    }
    struct jj_node *n = jj__p_node(P, JJ_N_COMPARE, line);
    if (n == NULL ||
        (n->kids = jj__p_nvec_done(P, &operands, &n->n_kids)) == NULL ||
        (n->ops = jj__arena_alloc(P->arena, nops)) == NULL) {
        free(operands.v);
        return jj__p_poom(P);
    }
    memcpy(n->ops, ops, nops);
    n->a = expr;
    *out = n;
    return 0;
}

static int parse_not(struct parser *P, struct jj_node **out)
{
    if (jj__p_is_name(jj__p_cur(P), "not")) {
        int line = jj__p_cur(P)->line;
        jj__p_advance(P);
        int rc = jj__p_enter(P);
        struct jj_node *x = NULL;
        if (rc == 0)
            rc = parse_not(P, &x);
        P->depth--;
        if (rc)
            return rc;
        struct jj_node *n = jj__p_node(P, JJ_N_NOT, line);
        if (n == NULL)
            return jj__p_poom(P);
        n->a = x;
        *out = n;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_and(struct parser *P, struct jj_node **out)
{
    int rc = parse_not(P, out);
    while (rc == 0 && jj__p_is_name(jj__p_cur(P), "and")) {
        int line = jj__p_cur(P)->line;
        jj__p_advance(P);
        struct jj_node *r = NULL;
        if ((rc = parse_not(P, &r)) == 0)
            rc = binop_node(P, line, JJ_N_AND, 0, *out, r, out);
    }
    return rc;
}

static int parse_or(struct parser *P, struct jj_node **out)
{
    int rc = parse_and(P, out);
    while (rc == 0 && jj__p_is_name(jj__p_cur(P), "or")) {
        int line = jj__p_cur(P)->line;
        jj__p_advance(P);
        struct jj_node *r = NULL;
        if ((rc = parse_and(P, &r)) == 0)
            rc = binop_node(P, line, JJ_N_OR, 0, *out, r, out);
    }
    return rc;
}

static int parse_condexpr(struct parser *P, struct jj_node **out)
{
    int rc = jj__p_enter(P);
    if (rc == 0)
        rc = parse_or(P, out);
    while (rc == 0 && jj__p_is_name(jj__p_cur(P), "if")) {
        int line = jj__p_cur(P)->line;
        jj__p_advance(P);
        struct jj_node *test, *els = NULL;
        if ((rc = parse_or(P, &test)))
            break;
        if (jj__p_is_name(jj__p_cur(P), "else")) {
            jj__p_advance(P);
            if ((rc = parse_condexpr(P, &els)))
                break;
        }
        struct jj_node *n = jj__p_node(P, JJ_N_COND, line);
        if (n == NULL) {
            rc = jj__p_poom(P);
            break;
        }
        n->a = test;
        n->b = *out;
        n->c = els;
        *out = n;
    }
    P->depth--;
    return rc;
}

int jj__parse_expression(struct parser *P, bool with_condexpr,
                            struct jj_node **out)
{
    return with_condexpr ? parse_condexpr(P, out) : parse_or(P, out);
}

