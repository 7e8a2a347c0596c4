/* jj_frame.c — the parse arena, and the frame analysis of
 * jinja2/idtracking.py (jj_internal.h): for the top level, every loop body,
 * macro body and block body it finds the names whose first reference in the
 * frame is an assignment with no reference in an enclosing frame; Jinja
 * starts those out undefined in the frame instead of reading them from the
 * template variables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_internal.h"
#include "common/jinja/jj_parse_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* ---- arena -------------------------------------------------------------- */

struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    _Alignas(16) char mem[];
};

struct arena {
    struct arena_chunk *head;
};

void *jj__arena_new(void)
{
    return calloc(1, sizeof(struct arena));
}

void *jj__arena_alloc(void *ap, size_t n)
{
    struct arena *a = ap;
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    struct arena_chunk *c = a->head;
    if (c == NULL || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof(*c) + cap);
        if (c == NULL)
            return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->mem + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *jj__arena_strndup(void *a, const char *s, size_t n)
{
    char *p = jj__arena_alloc(a, n + 1);
    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

void jj__arena_free(void *ap)
{
    struct arena *a = ap;
    if (a == NULL)
        return;
    for (struct arena_chunk *c = a->head, *nx; c != NULL; c = nx) {
        nx = c->next;
        free(c);
    }
    free(a);
}

/* ---- frame analysis (jinja2/idtracking.py) ------------------------------ */

enum { LOAD_RESOLVE = 1, LOAD_UNDEF, LOAD_ALIAS, LOAD_PARAM };

struct sym {
    const char *name;
    uint8_t load;
    bool stored;
};

struct symtab {
    struct sym *v;
    size_t n, cap;
    const struct symtab *parent;
    bool oom;
};

static struct sym *sym_find(const struct symtab *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->v[i].name, name) == 0)
            return &t->v[i];
    return NULL;
}

static bool has_ref(const struct symtab *t, const char *name)
{
    for (; t != NULL; t = t->parent)
        if (sym_find(t, name) != NULL)
            return true;
    return false;
}

static struct sym *sym_add(struct symtab *t, const char *name, uint8_t load)
{
    if (TG_GROW(t->v, &t->cap, t->n + 1)) {
        t->oom = true;
        return NULL;
    }
    struct sym *s = &t->v[t->n++];
    s->name = name;
    s->load = load;
    s->stored = false;
    return s;
}

static void sym_load(struct symtab *t, const char *name)
{
    if (!has_ref(t, name))
        sym_add(t, name, LOAD_RESOLVE);
}

static void sym_store(struct symtab *t, const char *name)
{
    struct sym *s = sym_find(t, name);
    if (s == NULL)
        s = sym_add(t, name,
                    has_ref(t->parent, name) ? LOAD_ALIAS : LOAD_UNDEF);
    if (s != NULL)
        s->stored = true;
}

static void sym_param(struct symtab *t, const char *name)
{
    struct sym *s = sym_find(t, name);
    if (s == NULL)
        s = sym_add(t, name, LOAD_PARAM);
    else
        s->load = LOAD_PARAM;
    if (s != NULL)
        s->stored = true;
}

static void visit_expr(struct symtab *t, const struct jj_node *n)
{
    if (n == NULL)
        return;
    if (n->type == JJ_N_NAME) {
        sym_load(t, n->sval);
        return;
    }
    visit_expr(t, n->a);
    visit_expr(t, n->b);
    visit_expr(t, n->c);
    for (size_t i = 0; i < n->n_kids; i++)
        visit_expr(t, n->kids[i]);
    for (size_t i = 0; i < n->n_kids2; i++)
        visit_expr(t, n->kids2[i]);
    for (size_t i = 0; i < n->n_kw; i++)
        visit_expr(t, n->kwvals[i]);
}

static void visit_target(struct symtab *t, const struct jj_node *n)
{
    if (n->type == JJ_N_NAME)
        sym_store(t, n->sval);
    else if (n->type == JJ_N_NSREF)
        sym_load(t, n->sval);
    else
        for (size_t i = 0; i < n->n_kids; i++)
            visit_target(t, n->kids[i]);
}

static void visit_stmts(struct symtab *t, struct jj_node *const *body,
                        size_t n);

static bool symtab_copy(struct symtab *dst, const struct symtab *src)
{
    *dst = *src;
    dst->v = NULL;
    dst->cap = dst->n = 0;
    if (src->n == 0)
        return true;
    dst->v = malloc(src->n * sizeof(*dst->v));
    if (dst->v == NULL)
        return false;
    memcpy(dst->v, src->v, src->n * sizeof(*dst->v));
    dst->n = dst->cap = src->n;
    return true;
}

/* Symbols.branch_update: merges the branch tables into t (later branches
 * overwrite load kinds, as dict.update does); a name stored in some but not
 * all branches then loads from the enclosing frame (alias) or from the
 * context (resolve). */
static void branch_update(struct symtab *t, struct symtab *br, size_t nbr)
{
    size_t orig_n = t->n;
    struct { const char *name; size_t count; } *cnt = NULL;
    size_t n_cnt = 0, cap_cnt = 0;
    for (size_t b = 0; b < nbr; b++) {
        for (size_t i = 0; i < br[b].n; i++) {
            const struct sym *s = &br[b].v[i];
            if (!s->stored)
                continue;
            bool orig = false;
            for (size_t k = 0; k < orig_n; k++)
                if (t->v[k].stored && strcmp(t->v[k].name, s->name) == 0)
                    orig = true;
            if (orig)
                continue;
            size_t k = 0;
            while (k < n_cnt && strcmp(cnt[k].name, s->name) != 0)
                k++;
            if (k == n_cnt) {
                if (TG_GROW(cnt, &cap_cnt, n_cnt + 1)) {
                    t->oom = true;
                    free(cnt);
                    return;
                }
                cnt[n_cnt].name = s->name;
                cnt[n_cnt++].count = 0;
            }
            cnt[k].count++;
        }
    }
    for (size_t b = 0; b < nbr; b++) {
        for (size_t i = 0; i < br[b].n; i++) {
            const struct sym *s = &br[b].v[i];
            struct sym *m = sym_find(t, s->name);
            if (m == NULL) {
                m = sym_add(t, s->name, s->load);
                if (m == NULL)
                    break;
                m->stored = s->stored;
            } else {
                m->load = s->load;
                m->stored |= s->stored;
            }
        }
    }
    for (size_t k = 0; k < n_cnt; k++) {
        if (cnt[k].count == nbr)
            continue;
        struct sym *m = sym_find(t, cnt[k].name);
        if (m != NULL)
            m->load = has_ref(t->parent, m->name) ? LOAD_ALIAS : LOAD_RESOLVE;
    }
    free(cnt);
}

static void visit_if(struct symtab *t, const struct jj_node *n)
{
    visit_expr(t, n->a);
    struct symtab br[3];
    for (int b = 0; b < 3; b++)
        if (!symtab_copy(&br[b], t)) {
            for (int k = 0; k < b; k++)
                free(br[k].v);
            t->oom = true;
            return;
        }
    visit_stmts(&br[0], n->body, n->n_body);
    for (size_t i = 0; i < n->n_kids; i++) /* elif nodes */
        visit_if(&br[1], n->kids[i]);
    visit_stmts(&br[2], n->els, n->n_els);
    t->oom |= br[0].oom || br[1].oom || br[2].oom;
    branch_update(t, br, 3);
    for (int b = 0; b < 3; b++)
        free(br[b].v);
}

/* An elif node as Jinja sees it: If(test, body) without further elifs; its
 * else part is empty. */
static void visit_stmts(struct symtab *t, struct jj_node *const *body,
                        size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct jj_node *s = body[i];
        switch (s->type) {
        case JJ_N_OUTPUT:
            visit_expr(t, s->a);
            break;
        case JJ_N_IF:
            visit_if(t, s);
            break;
        case JJ_N_FOR:
            visit_expr(t, s->b);
            break;
        case JJ_N_SET:
            visit_expr(t, s->b);
            visit_target(t, s->a);
            break;
        case JJ_N_SET_BLOCK:
            visit_target(t, s->a);
            break;
        case JJ_N_MACRO:
            sym_store(t, s->sval);
            break;
        case JJ_N_FILTER_BLOCK:
            visit_expr(t, s->c);
            break;
        default:
            break;
        }
    }
}

static void visit_params(struct symtab *t, const struct jj_node *target)
{
    if (target->type == JJ_N_NAME)
        sym_param(t, target->sval);
    else
        for (size_t i = 0; i < target->n_kids; i++)
            visit_params(t, target->kids[i]);
}

static int analyze_frame(struct parser *P, struct jj_node *frame,
                         const struct symtab *parent);

/* Stores the LOAD_UNDEF names of t in frame->missing and analyzes the
 * frames nested in body. */
static int finish_frame(struct parser *P, struct jj_node *frame,
                        struct symtab *t, struct jj_node *const *body,
                        size_t n_body)
{
    if (t->oom)
        return jj__p_poom(P);
    size_t k = 0;
    for (size_t i = 0; i < t->n; i++)
        k += t->v[i].load == LOAD_UNDEF;
    frame->missing = jj__arena_alloc(P->arena, (k + 1) * sizeof(char *));
    if (frame->missing == NULL)
        return jj__p_poom(P);
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].load == LOAD_UNDEF)
            frame->missing[frame->n_missing++] = t->v[i].name;
    /* nested frames see this frame's symbols as their parent */
    int rc = 0;
    struct jj_node *stack[JJ_MAX_PARSE_DEPTH + 8];
    size_t sp = 0;
    for (size_t i = n_body; i-- > 0;)
        if (sp < sizeof stack / sizeof stack[0])
            stack[sp++] = body[i];
    while (sp > 0 && rc == 0) {
        struct jj_node *s = stack[--sp];
        if (s->type == JJ_N_FOR || s->type == JJ_N_MACRO ||
            s->type == JJ_N_SET_BLOCK || s->type == JJ_N_FILTER_BLOCK ||
            s->type == JJ_N_SCOPE_BLOCK) {
            rc = analyze_frame(P, s, t);
            continue;
        }
        if (s->type != JJ_N_IF)
            continue;
        /* if bodies stay in this frame */
        struct jj_node *const *lists[3] = {s->body, s->els, s->kids};
        size_t counts[3] = {s->n_body, s->n_els, s->n_kids};
        for (int l = 0; l < 3; l++)
            for (size_t i = counts[l]; i-- > 0;)
                if (sp < sizeof stack / sizeof stack[0])
                    stack[sp++] = lists[l][i];
    }
    return rc;
}

static int analyze_frame(struct parser *P, struct jj_node *frame,
                         const struct symtab *parent)
{
    struct symtab t = {.parent = parent};
    int rc;
    if (frame->type == JJ_N_FOR) {
        visit_params(&t, frame->a);
        visit_stmts(&t, frame->body, frame->n_body);
        rc = finish_frame(P, frame, &t, frame->body, frame->n_body);
        if (rc == 0 && frame->n_els > 0) {
            /* the else block is a frame of its own */
            struct symtab e = {.parent = parent};
            visit_stmts(&e, frame->els, frame->n_els);
            struct jj_node tmp = *frame;
            tmp.missing = NULL;
            tmp.n_missing = 0;
            rc = finish_frame(P, &tmp, &e, frame->els, frame->n_els);
            frame->missing_els = tmp.missing;
            frame->n_missing_els = tmp.n_missing;
            free(e.v);
        }
    } else if (frame->type == JJ_N_MACRO) {
        for (size_t i = 0; i < frame->n_kids; i++)
            sym_param(&t, frame->kids[i]->sval);
        sym_param(&t, "varargs");
        sym_param(&t, "kwargs");
        sym_param(&t, "caller");
        visit_stmts(&t, frame->body, frame->n_body);
        rc = finish_frame(P, frame, &t, frame->body, frame->n_body);
    } else {
        visit_stmts(&t, frame->body, frame->n_body);
        rc = finish_frame(P, frame, &t, frame->body, frame->n_body);
    }
    free(t.v);
    return rc;
}


int jj__analyze_frames(struct parser *P, struct jj_node *root)
{
    return analyze_frame(P, root, NULL);
}
