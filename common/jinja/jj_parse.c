/* jj_parse.c — tokens to AST (jj_internal.h): the parser's token helpers,
 * the statements of jinja2 3.1's parser (jinja2/parser.py: for, if, set,
 * macro, filter blocks, print, loop controls, transformers' generation tag)
 * and jj_template_parse. Expressions are in jj_parse_expr.c, the frame
 * analysis and the arena in jj_frame.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_internal.h"
#include "common/jinja/jj_parse_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"


int jj__p_nvec_push(struct nvec *v, struct jj_node *x)
{
    if (TG_GROW(v->v, &v->cap, v->n + 1))
        return TG_ENOMEM;
    v->v[v->n++] = x;
    return 0;
}

/* Moves the vector into the arena (NULL-terminated); frees the vector. */
struct jj_node **jj__p_nvec_done(struct parser *P, struct nvec *v,
                                  size_t *n)
{
    struct jj_node **p = jj__arena_alloc(P->arena, (v->n + 1) * sizeof(*p));
    if (p != NULL && v->n > 0)
        memcpy(p, v->v, v->n * sizeof(*p));
    *n = v->n;
    free(v->v);
    memset(v, 0, sizeof(*v));
    return p;
}

int jj__p_pfail(struct parser *P, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

int jj__p_pfail(struct parser *P, int line, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tg_err_set(P->err, P->errlen, code, "chat template line %d: %s",
                      line, msg);
}

int jj__p_poom(struct parser *P)
{
    return tg_err_set(P->err, P->errlen, TG_ENOMEM,
                      "out of memory while parsing the chat template");
}

struct jj_token *jj__p_cur(struct parser *P) { return &P->t[P->i]; }
struct jj_token *jj__p_look(struct parser *P)
{
    return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i];
}
void jj__p_advance(struct parser *P)
{
    if (P->t[P->i].type != JJ_T_EOF)
        P->i++;
}

bool jj__p_is_name(const struct jj_token *t, const char *name)
{
    return t->type == JJ_T_NAME && strcmp(t->s, name) == 0;
}
bool jj__p_is_op(const struct jj_token *t, uint8_t op)
{
    return t->type == JJ_T_OP && t->op == op;
}

static const char *op_text(uint8_t op)
{
    static const char *const names[] = {
        "", "+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")",
        "{", "}", "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",",
        ";"};
    return op < sizeof names / sizeof names[0] ? names[op] : "?";
}

/* Describes token t for error messages, as Jinja's describe_token does. */
static void describe(const struct jj_token *t, char *buf, size_t cap)
{
    switch (t->type) {
    case JJ_T_EOF: snprintf(buf, cap, "end of template"); break;
    case JJ_T_DATA: snprintf(buf, cap, "template data"); break;
    case JJ_T_VAR_BEGIN: snprintf(buf, cap, "begin of print statement"); break;
    case JJ_T_VAR_END: snprintf(buf, cap, "end of print statement"); break;
    case JJ_T_BLOCK_BEGIN: snprintf(buf, cap, "begin of statement block"); break;
    case JJ_T_BLOCK_END: snprintf(buf, cap, "end of statement block"); break;
    case JJ_T_NAME: snprintf(buf, cap, "'%.60s'", t->s); break;
    case JJ_T_STRING: snprintf(buf, cap, "string"); break;
    case JJ_T_INT: snprintf(buf, cap, "integer"); break;
    case JJ_T_FLOAT: snprintf(buf, cap, "float"); break;
    case JJ_T_OP: snprintf(buf, cap, "'%s'", op_text(t->op)); break;
    default: snprintf(buf, cap, "token"); break;
    }
}

int jj__p_unexpected(struct parser *P, const char *wanted)
{
    char got[80];
    describe(jj__p_cur(P), got, sizeof got);
    if (wanted != NULL)
        return jj__p_pfail(P, jj__p_cur(P)->line, TG_EFORMAT, "expected %s, got %s",
                     wanted, got);
    return jj__p_pfail(P, jj__p_cur(P)->line, TG_EFORMAT, "unexpected %s", got);
}

int jj__p_expect_op(struct parser *P, uint8_t op)
{
    if (!jj__p_is_op(jj__p_cur(P), op)) {
        char want[16];
        snprintf(want, sizeof want, "'%s'", op_text(op));
        return jj__p_unexpected(P, want);
    }
    jj__p_advance(P);
    return 0;
}

int jj__p_expect_type(struct parser *P, uint8_t type, const char *what)
{
    if (jj__p_cur(P)->type != type)
        return jj__p_unexpected(P, what);
    jj__p_advance(P);
    return 0;
}

int jj__p_expect_name(struct parser *P, const char *name)
{
    if (!jj__p_is_name(jj__p_cur(P), name)) {
        char want[64];
        snprintf(want, sizeof want, "'%s'", name);
        return jj__p_unexpected(P, want);
    }
    jj__p_advance(P);
    return 0;
}

struct jj_node *jj__p_node(struct parser *P, uint8_t type, int line)
{
    struct jj_node *n = jj__arena_alloc(P->arena, sizeof(*n));
    if (n != NULL) {
        n->type = type;
        n->line = line;
        n->fid = -1;
    }
    return n;
}

/* Registers an immortal object owned by the template. */
static int keep(struct parser *P, struct jj_obj *o)
{
    struct jj_template *t = P->tmpl;
    if (TG_GROW(t->consts, &t->cap_consts, t->n_consts + 1))
        return TG_ENOMEM;
    o->immortal = 1;
    t->consts[t->n_consts++] = o;
    return 0;
}

struct jj_str *jj__p_const_str(struct parser *P, const char *s, size_t len)
{
    struct jj_str *js = jj_str_new(s, len);
    if (js == NULL || keep(P, &js->h) != 0) {
        free(js);
        return NULL;
    }
    return js;
}

void jj__p_note_unsupported(struct parser *P, int line, const char *what,
                             const char *name)
{
    if (P->tmpl->unsupported[0] == '\0')
        snprintf(P->tmpl->unsupported, sizeof P->tmpl->unsupported,
                 "line %d: %s '%s'", line, what, name);
}

int jj__p_enter(struct parser *P)
{
    if (++P->depth > JJ_MAX_PARSE_DEPTH)
        return jj__p_pfail(P, jj__p_cur(P)->line, TG_ETOOBIG,
                     "the template nests more than %d levels",
                     JJ_MAX_PARSE_DEPTH);
    return 0;
}


/* ---- statements --------------------------------------------------------- */

static int subparse(struct parser *P, const char *const *end_names,
                    struct nvec *body);

/* Parses a block body up to one of end_names (left as the current token).
 * `what` names the tags for the end-of-template error. */
static int parse_statements(struct parser *P, const char *const *end_names,
                            bool drop_needle, struct jj_node ***body,
                            size_t *n_body)
{
    if (jj__p_is_op(jj__p_cur(P), JJ_TO_COLON))
        jj__p_advance(P);
    int rc = jj__p_expect_type(P, JJ_T_BLOCK_END, "end of statement block");
    if (rc)
        return rc;
    struct nvec v = {0};
    if ((rc = subparse(P, end_names, &v))) {
        free(v.v);
        return rc;
    }
    if (jj__p_cur(P)->type == JJ_T_EOF) {
        free(v.v);
        char want[160] = "";
        for (size_t k = 0; end_names[k] != NULL; k++) {
            size_t l = strlen(want);
            snprintf(want + l, sizeof want - l, "%s'%s'", k ? " or " : "",
                     end_names[k]);
        }
        return jj__p_pfail(P, jj__p_cur(P)->line, TG_EFORMAT,
                     "Unexpected end of template. Jinja was looking for the "
                     "following tags: %s",
                     want);
    }
    if (drop_needle)
        jj__p_advance(P);
    *body = jj__p_nvec_done(P, &v, n_body);
    return *body != NULL ? 0 : jj__p_poom(P);
}

static bool can_assign(const struct jj_node *n)
{
    if (n->type == JJ_N_NAME)
        return true;
    if (n->type != JJ_N_TUPLE)
        return false;
    for (size_t i = 0; i < n->n_kids; i++)
        if (!can_assign(n->kids[i]))
            return false;
    return true;
}

static int parse_assign_target(struct parser *P, bool with_tuple,
                               bool name_only, const char *extra_end,
                               bool with_namespace, struct jj_node **out)
{
    struct jj_node *t;
    int line = jj__p_cur(P)->line;
    int rc;
    if (with_namespace && jj__p_is_op(jj__p_look(P), JJ_TO_DOT)) {
        if (jj__p_cur(P)->type != JJ_T_NAME)
            return jj__p_unexpected(P, "name");
        const char *ns = jj__p_cur(P)->s;
        jj__p_advance(P);
        jj__p_advance(P);
        if (jj__p_cur(P)->type != JJ_T_NAME)
            return jj__p_unexpected(P, "name");
        t = jj__p_node(P, JJ_N_NSREF, line);
        if (t == NULL)
            return jj__p_poom(P);
        t->sval = ns;
        t->sval2 = jj__p_cur(P)->s;
        t->sname = jj__p_const_str(P, jj__p_cur(P)->s, jj__p_cur(P)->len);
        if (t->sname == NULL)
            return jj__p_poom(P);
        jj__p_advance(P);
        *out = t;
        return 0;
    }
    if (name_only) {
        if (jj__p_cur(P)->type != JJ_T_NAME)
            return jj__p_unexpected(P, "name");
        t = jj__p_node(P, JJ_N_NAME, line);
        if (t == NULL)
            return jj__p_poom(P);
        t->sval = jj__p_cur(P)->s;
        t->sname = jj__p_const_str(P, jj__p_cur(P)->s, jj__p_cur(P)->len);
        if (t->sname == NULL)
            return jj__p_poom(P);
        jj__p_advance(P);
    } else if (with_tuple) {
        if ((rc = jj__parse_tuple(P, TUPLE_SIMPLE, extra_end, false, &t)))
            return rc;
    } else if ((rc = jj__parse_primary(P, &t))) {
        return rc;
    }
    if (!can_assign(t))
        return jj__p_pfail(P, line, TG_EFORMAT, "can't assign to '%s'",
                     t->type == JJ_N_CONST ? "const" : "expression");
    *out = t;
    return 0;
}

/* Jinja refuses to bind the special name `loop` in a loop. */
static int check_loop_target(struct parser *P, const struct jj_node *t)
{
    if (t->type == JJ_N_NAME && strcmp(t->sval, "loop") == 0)
        return jj__p_pfail(P, t->line, TG_EFORMAT,
                           "Can't assign to special loop variable in "
                           "for-loop target");
    for (size_t i = 0; t->type == JJ_N_TUPLE && i < t->n_kids; i++)
        if (check_loop_target(P, t->kids[i]))
            return TG_EFORMAT;
    return 0;
}

static int parse_for(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    jj__p_advance(P);
    struct jj_node *n = jj__p_node(P, JJ_N_FOR, line);
    if (n == NULL)
        return jj__p_poom(P);
    int rc;
    if ((rc = parse_assign_target(P, true, false, "in", false, &n->a)) ||
        (rc = check_loop_target(P, n->a)) ||
        (rc = jj__p_expect_name(P, "in")) ||
        (rc = jj__parse_tuple(P, TUPLE_NO_COND, "recursive", false, &n->b)))
        return rc;
    if (jj__p_is_name(jj__p_cur(P), "if")) {
        jj__p_advance(P);
        if ((rc = jj__parse_expression(P, true, &n->c)))
            return rc;
    }
    if (jj__p_is_name(jj__p_cur(P), "recursive"))
        return jj__p_pfail(P, jj__p_cur(P)->line, TG_EUNSUPPORTED,
                     "unsupported: recursive for loops");
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    P->in_loop++;
    P->in_frame++;
    rc = parse_statements(P, ends, false, &n->body, &n->n_body);
    P->in_loop--;
    P->in_frame--;
    if (rc)
        return rc;
    bool has_else = jj__p_is_name(jj__p_cur(P), "else");
    jj__p_advance(P);
    if (has_else) {
        if ((rc = parse_statements(P, endfor, true, &n->els, &n->n_els)))
            return rc;
    }
    *out = n;
    return 0;
}

static int parse_if(struct parser *P, struct jj_node **out)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    struct jj_node *top = jj__p_node(P, JJ_N_IF, jj__p_cur(P)->line);
    if (top == NULL)
        return jj__p_poom(P);
    jj__p_advance(P);
    struct nvec elifs = {0};
    struct jj_node *n = top;
    int rc;
    for (;;) {
        if ((rc = jj__parse_tuple(P, TUPLE_NO_COND, NULL, false, &n->a)) ||
            (rc = parse_statements(P, ends, false, &n->body, &n->n_body)))
            goto fail;
        struct jj_token *t = jj__p_cur(P);
        jj__p_advance(P);
        if (jj__p_is_name(t, "elif")) {
            n = jj__p_node(P, JJ_N_IF, t->line);
            if (n == NULL || jj__p_nvec_push(&elifs, n)) {
                rc = jj__p_poom(P);
                goto fail;
            }
            continue;
        }
        if (jj__p_is_name(t, "else") &&
            (rc = parse_statements(P, endif, true, &top->els, &top->n_els)))
            goto fail;
        break;
    }
    top->kids = jj__p_nvec_done(P, &elifs, &top->n_kids);
    if (top->kids == NULL)
        return jj__p_poom(P);
    *out = top;
    return 0;
fail:
    free(elifs.v);
    return rc;
}

static int parse_set(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    jj__p_advance(P);
    struct jj_node *target;
    int rc = parse_assign_target(P, true, false, NULL, true, &target);
    if (rc == 0 && P->in_loop > 0)
        rc = check_loop_target(P, target);
    if (rc)
        return rc;
    if (jj__p_is_op(jj__p_cur(P), JJ_TO_ASSIGN)) {
        jj__p_advance(P);
        struct jj_node *n = jj__p_node(P, JJ_N_SET, line);
        if (n == NULL)
            return jj__p_poom(P);
        n->a = target;
        if ((rc = jj__parse_tuple(P, TUPLE_FULL, NULL, false, &n->b)))
            return rc;
        *out = n;
        return 0;
    }
    struct jj_node *n = jj__p_node(P, JJ_N_SET_BLOCK, line);
    if (n == NULL)
        return jj__p_poom(P);
    n->a = target;
    if (jj__p_is_op(jj__p_cur(P), JJ_TO_PIPE)) {
        struct jj_node *chain = NULL;
        if ((rc = jj__parse_filter(P, &chain, false)))
            return rc;
        n->c = chain;
    }
    static const char *const ends[] = {"endset", NULL};
    if ((rc = parse_statements(P, ends, true, &n->body, &n->n_body)))
        return rc;
    *out = n;
    return 0;
}

/* Does the subtree reference variable `name`? */
static bool uses_name(const struct jj_node *n, const char *name)
{
    if (n == NULL)
        return false;
    if (n->type == JJ_N_NAME && strcmp(n->sval, name) == 0)
        return true;
    if (uses_name(n->a, name) || uses_name(n->b, name) ||
        uses_name(n->c, name))
        return true;
    for (size_t i = 0; i < n->n_body; i++)
        if (uses_name(n->body[i], name))
            return true;
    for (size_t i = 0; i < n->n_els; i++)
        if (uses_name(n->els[i], name))
            return true;
    for (size_t i = 0; i < n->n_kids; i++)
        if (uses_name(n->kids[i], name))
            return true;
    for (size_t i = 0; i < n->n_kids2; i++)
        if (uses_name(n->kids2[i], name))
            return true;
    for (size_t i = 0; i < n->n_kw; i++)
        if (uses_name(n->kwvals[i], name))
            return true;
    return false;
}

static int parse_macro(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    if (P->in_frame > 0)
        return jj__p_pfail(P, line, TG_EUNSUPPORTED,
                     "unsupported: a macro defined inside a loop or macro");
    jj__p_advance(P);
    struct jj_node *n = jj__p_node(P, JJ_N_MACRO, line);
    if (n == NULL)
        return jj__p_poom(P);
    if (jj__p_cur(P)->type != JJ_T_NAME)
        return jj__p_unexpected(P, "name");
    n->sval = jj__p_cur(P)->s;
    jj__p_advance(P);
    int rc = jj__p_expect_op(P, JJ_TO_LPAREN);
    if (rc)
        return rc;
    struct nvec params = {0}, defs = {0};
    while (!jj__p_is_op(jj__p_cur(P), JJ_TO_RPAREN)) {
        if (params.n > 0 && (rc = jj__p_expect_op(P, JJ_TO_COMMA)))
            goto fail;
        struct jj_node *p;
        if ((rc = parse_assign_target(P, false, true, NULL, false, &p)))
            goto fail;
        struct jj_node *d = NULL;
        if (jj__p_is_op(jj__p_cur(P), JJ_TO_ASSIGN)) {
            jj__p_advance(P);
            if ((rc = jj__parse_expression(P, true, &d)))
                goto fail;
        } else if (defs.n > 0) {
            rc = jj__p_pfail(P, p->line, TG_EFORMAT,
                       "non-default argument follows default argument");
            goto fail;
        }
        if ((rc = jj__p_nvec_push(&params, p)))
            goto fail;
        if (d != NULL && (rc = jj__p_nvec_push(&defs, d)))
            goto fail;
    }
    jj__p_advance(P);
    n->kids = jj__p_nvec_done(P, &params, &n->n_kids);
    n->kids2 = jj__p_nvec_done(P, &defs, &n->n_kids2);
    if (n->kids == NULL || n->kids2 == NULL)
        return jj__p_poom(P);
    static const char *const ends[] = {"endmacro", NULL};
    P->in_frame++;
    rc = parse_statements(P, ends, true, &n->body, &n->n_body);
    P->in_frame--;
    if (rc)
        return rc;
    for (size_t i = 0; i < n->n_body; i++) {
        if (uses_name(n->body[i], "varargs"))
            n->flag |= JJ_MACRO_VARARGS;
        if (uses_name(n->body[i], "kwargs"))
            n->flag |= JJ_MACRO_KWARGS;
    }
    *out = n;
    return 0;
fail:
    free(params.v);
    free(defs.v);
    return rc;
}

static int parse_statement(struct parser *P, struct jj_node **out);

static int parse_filter_block(struct parser *P, struct jj_node **out)
{
    int line = jj__p_cur(P)->line;
    jj__p_advance(P);
    struct jj_node *n = jj__p_node(P, JJ_N_FILTER_BLOCK, line);
    if (n == NULL)
        return jj__p_poom(P);
    struct jj_node *chain = NULL;
    int rc = jj__parse_filter(P, &chain, true);
    if (rc)
        return rc;
    n->c = chain;
    static const char *const ends[] = {"endfilter", NULL};
    if ((rc = parse_statements(P, ends, true, &n->body, &n->n_body)))
        return rc;
    *out = n;
    return 0;
}

static int parse_statement(struct parser *P, struct jj_node **out)
{
    struct jj_token *t = jj__p_cur(P);
    if (t->type != JJ_T_NAME)
        return jj__p_pfail(P, t->line, TG_EFORMAT, "tag name expected");
    const char *name = t->s;
    int rc = jj__p_enter(P);
    if (rc)
        return rc;
    if (!strcmp(name, "for")) {
        rc = parse_for(P, out);
    } else if (!strcmp(name, "if")) {
        rc = parse_if(P, out);
    } else if (!strcmp(name, "set")) {
        rc = parse_set(P, out);
    } else if (!strcmp(name, "macro")) {
        rc = parse_macro(P, out);
    } else if (!strcmp(name, "filter")) {
        rc = parse_filter_block(P, out);
    } else if (!strcmp(name, "print")) {
        /* {% print a, b %} prints each expression: a concatenation */
        jj__p_advance(P);
        struct jj_node *n = jj__p_node(P, JJ_N_OUTPUT, t->line);
        struct jj_node *cat = jj__p_node(P, JJ_N_CONCAT, t->line);
        struct nvec items = {0};
        if (n == NULL || cat == NULL)
            rc = jj__p_poom(P);
        while (rc == 0 && jj__p_cur(P)->type != JJ_T_BLOCK_END) {
            struct jj_node *e = NULL;
            if (items.n > 0 && (rc = jj__p_expect_op(P, JJ_TO_COMMA)))
                break;
            if ((rc = jj__parse_expression(P, true, &e)) == 0)
                rc = jj__p_nvec_push(&items, e);
        }
        if (rc == 0 && (cat->kids = jj__p_nvec_done(P, &items, &cat->n_kids)) == NULL)
            rc = jj__p_poom(P);
        if (rc == 0) {
            n->a = cat;
            *out = n;
        }
        free(items.v);
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        if (P->in_loop == 0)
            rc = jj__p_pfail(P, t->line, TG_EFORMAT, "'%s' outside of a loop",
                       name);
        else {
            jj__p_advance(P);
            *out = jj__p_node(P, name[0] == 'b' ? JJ_N_BREAK : JJ_N_CONTINUE,
                        t->line);
            rc = *out != NULL ? 0 : jj__p_poom(P);
        }
    } else if (!strcmp(name, "generation")) {
        /* transformers' AssistantTracker: the body renders as it is */
        jj__p_advance(P);
        struct jj_node *n = jj__p_node(P, JJ_N_SCOPE_BLOCK, t->line);
        static const char *const ends[] = {"endgeneration", NULL};
        if (n == NULL)
            rc = jj__p_poom(P);
        else if ((rc = parse_statements(P, ends, true, &n->body,
                                        &n->n_body)) == 0)
            *out = n;
    } else if (!strcmp(name, "extends") || !strcmp(name, "block") ||
               !strcmp(name, "include") || !strcmp(name, "import") ||
               !strcmp(name, "from") || !strcmp(name, "with") ||
               !strcmp(name, "autoescape") || !strcmp(name, "call")) {
        rc = jj__p_pfail(P, t->line, TG_EUNSUPPORTED, "unsupported tag '%s'", name);
    } else {
        rc = jj__p_pfail(P, t->line, TG_EFORMAT, "Encountered unknown tag '%s'.",
                   name);
    }
    P->depth--;
    return rc;
}

static int subparse(struct parser *P, const char *const *end_names,
                    struct nvec *body)
{
    int rc;
    for (;;) {
        struct jj_token *t = jj__p_cur(P);
        if (t->type == JJ_T_EOF)
            return 0;
        struct jj_node *n = NULL;
        if (t->type == JJ_T_DATA) {
            n = jj__p_node(P, JJ_N_DATA, t->line);
            if (n == NULL)
                return jj__p_poom(P);
            struct jj_str *s = jj__p_const_str(P, t->s, t->len);
            if (s == NULL)
                return jj__p_poom(P);
            n->cval.t = JJ_STR;
            n->cval.u.s = s;
            jj__p_advance(P);
        } else if (t->type == JJ_T_VAR_BEGIN) {
            jj__p_advance(P);
            n = jj__p_node(P, JJ_N_OUTPUT, t->line);
            if (n == NULL)
                return jj__p_poom(P);
            if ((rc = jj__parse_tuple(P, TUPLE_FULL, NULL, false, &n->a)) ||
                (rc = jj__p_expect_type(P, JJ_T_VAR_END, "end of print statement")))
                return rc;
        } else if (t->type == JJ_T_BLOCK_BEGIN) {
            jj__p_advance(P);
            if (end_names != NULL)
                for (size_t k = 0; end_names[k] != NULL; k++)
                    if (jj__p_is_name(jj__p_cur(P), end_names[k]))
                        return 0;
            if ((rc = parse_statement(P, &n)) ||
                (rc = jj__p_expect_type(P, JJ_T_BLOCK_END,
                                  "end of statement block")))
                return rc;
        } else {
            return jj__p_unexpected(P, NULL);
        }
        if ((rc = jj__p_nvec_push(body, n)))
            return jj__p_poom(P);
    }
}

/* ---- entry -------------------------------------------------------------- */

static bool valid_utf8(const char *s, size_t n, int *bad_line)
{
    int line = 1;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            line += c == '\n';
            i++;
            continue;
        }
        size_t adv;
        uint32_t cp = jj_utf8_next(s + i, n - i, &adv);
        size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (c < 0xC2 || c > 0xF4 || adv != want ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
            *bad_line = line;
            return false;
        }
        i += adv;
    }
    return true;
}

int jj_template_parse(const char *src, size_t len, struct jj_template **out,
                      char *err, size_t errlen)
{
    *out = NULL;
    if (len > JJ_MAX_TEMPLATE_BYTES)
        return tg_err_set(err, errlen, TG_ETOOBIG,
                          "chat template of %zu bytes exceeds the limit of "
                          "%u bytes",
                          len, JJ_MAX_TEMPLATE_BYTES);
    int bad_line = 0;
    if (!valid_utf8(src, len, &bad_line))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "chat template line %d: invalid UTF-8", bad_line);
    struct jj_template *t = calloc(1, sizeof(*t));
    if (t == NULL || (t->arena = jj__arena_new()) == NULL) {
        free(t);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    struct jj_token *toks = NULL;
    size_t n_toks = 0;
    int rc = jj__lex(t->arena, src, len, &toks, &n_toks, err, errlen);
    if (rc != 0) {
        jj_template_free(t);
        return rc;
    }
    struct parser P = {.t = toks, .n = n_toks, .arena = t->arena, .tmpl = t,
                       .err = err, .errlen = errlen};
    struct nvec body = {0};
    struct jj_node *root = jj__p_node(&P, JJ_N_SCOPE_BLOCK, 1);
    if (root == NULL)
        rc = jj__p_poom(&P);
    if (rc == 0)
        rc = subparse(&P, NULL, &body);
    if (rc == 0 && jj__p_cur(&P)->type != JJ_T_EOF)
        rc = jj__p_unexpected(&P, NULL);
    if (rc == 0) {
        root->body = jj__p_nvec_done(&P, &body, &root->n_body);
        if (root->body == NULL)
            rc = jj__p_poom(&P);
    } else {
        free(body.v);
    }
    if (rc == 0)
        rc = jj__analyze_frames(&P, root);
    if (rc != 0) {
        jj_template_free(t);
        return rc;
    }
    t->root = root;
    *out = t;
    return 0;
}

void jj_template_free(struct jj_template *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->n_consts; i++)
        free(t->consts[i]);
    free(t->consts);
    jj__arena_free(t->arena);
    free(t);
}

const char *jj_template_unsupported(const struct jj_template *t)
{
    return t->unsupported;
}

