/* gm_pda.c — the grammar IR compiled into a pushdown automaton over bytes
 * (gm_internal.h): productivity and nullability of rules, Thompson
 * construction with continuations (a shared tail of the expression DAG is
 * emitted once), epsilon elimination, non-nullable call entries,
 * reachability, left-recursion check, dense transition rows, FIRST /
 * FOLLOW byte sets of rules and the shortest completion of every node. */
#include "common/grammar/gm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_hmap.h"

#define DENSE_MIN_EDGES 4   /* nodes with this many byte edges get a row */
#define DENSE_MAX_ROWS 8192 /* 8 MiB of rows at most */
#define INF_LEN (UINT32_MAX / 4)
#define EMIT_DEPTH_MAX 20000 /* nested expressions emitted (stack bound) */

enum { T_EPS = 0, T_BYTE, T_CALL };

struct tedge {
    int32_t from, to;
    uint32_t label; /* T_BYTE: class; T_CALL: rule */
    uint8_t kind;
};

struct memo_ent {
    int32_t e, k, node; /* e = -1: empty slot */
};

struct bld {
    const struct gm_ir *ir;
    size_t max_nodes;
    uint8_t *prod, *null;       /* (n_expr) */
    uint8_t *prod_r, *null_r;   /* (n_rule) */
    int32_t *t_rule;            /* (n_t) rule of each temporary node */
    uint8_t *t_final;
    int32_t n_t, cap_t;
    struct tedge *te;
    size_t n_te, cap_te;
    int32_t *t_start; /* (n_rule) start node of each rule's NFA */
    struct tg_hmap memo; /* struct memo_ent slots: (e, k) -> node */
    uint8_t (*cls)[32];
    size_t n_cls, cap_cls;
    struct tg_hmap cls_index; /* int32_t slots: index into cls, -1 empty */
    int depth; /* of emit's recursion */
    double deadline; /* gm__now() seconds, 0: none */
    int err;
    char *errbuf;
    size_t errlen;
};


static int bfail(struct bld *b, int code, const char *msg)
{
    if (b->err == 0) {
        b->err = code;
        tg_err_set(b->errbuf, b->errlen, code, "%s", msg);
    }
    return b->err;
}

/* ---- productivity and nullability -------------------------------------- */

/* One pass over the expressions in id order (operands come first; only
 * REF reads the rule values of the previous pass). */
static void eval_pass(struct bld *b)
{
    const struct gm_ir *ir = b->ir;
    for (size_t i = 0; i < ir->n_expr; i++) {
        const struct gm_expr *e = &ir->expr[i];
        uint8_t p = 0, n = 0;
        switch (e->kind) {
        case GM_EXPR_EMPTY:
            p = n = 1;
            break;
        case GM_EXPR_BYTES:
            p = 1;
            break;
        case GM_EXPR_CLASS: {
            const uint8_t *s = ir->cls[e->off];
            for (int k = 0; k < 32; k++)
                p |= s[k] != 0;
            break;
        }
        case GM_EXPR_SEQ:
            p = n = 1;
            for (uint32_t k = 0; k < e->n; k++) {
                p &= b->prod[ir->items[e->off + k]];
                n &= b->null[ir->items[e->off + k]];
            }
            break;
        case GM_EXPR_ALT:
            for (uint32_t k = 0; k < e->n; k++) {
                p |= b->prod[ir->items[e->off + k]];
                n |= b->null[ir->items[e->off + k]];
            }
            break;
        case GM_EXPR_REPEAT:
            p = e->min == 0 || b->prod[e->sub];
            n = e->min == 0 || b->null[e->sub];
            break;
        case GM_EXPR_REF:
            p = b->prod_r[e->off];
            n = b->null_r[e->off];
            break;
        }
        b->prod[i] = p;
        b->null[i] = n;
    }
}

static void analyse(struct bld *b)
{
    const struct gm_ir *ir = b->ir;
    for (;;) {
        eval_pass(b);
        int changed = 0;
        for (size_t r = 0; r < ir->n_rule; r++) {
            int32_t body = ir->rule[r].body;
            if (b->prod[body] != b->prod_r[r] || b->null[body] != b->null_r[r])
                changed = 1;
            b->prod_r[r] = b->prod[body];
            b->null_r[r] = b->null[body];
        }
        if (!changed)
            return;
    }
}

/* ---- the epsilon-NFA ----------------------------------------------------- */

/* The byte-set index: a slot is an index into b->cls; a lookup's key is
 * the builder and the 32-byte set sought; the map's ctx is the builder. */
struct cls_key {
    const struct bld *b;
    const uint8_t *s;
};

static inline int cls_probe(const void *slot, const void *key)
{
    int32_t i = *(const int32_t *)slot;
    const struct cls_key *k = key;
    if (i < 0)
        return TG_HMAP_EMPTY;
    return memcmp(k->b->cls[i], k->s, 32) == 0 ? TG_HMAP_HIT : TG_HMAP_MISS;
}

static int cls_empty(const void *slot)
{
    return *(const int32_t *)slot < 0;
}

static uint64_t cls_slot_hash(const void *slot, void *ctx)
{
    const struct bld *b = ctx;
    return tg_hash_bytes(b->cls[*(const int32_t *)slot], 32);
}

static const struct tg_hmap_type cls_type = {
    .esize = sizeof(int32_t),
    .empty_byte = 0xff,
    .probe = cls_probe,
    .is_empty = cls_empty,
    .hash = cls_slot_hash,
};

/* The index of byte set s in b->cls, added when new. */
static int64_t cls_intern(struct bld *b, const uint8_t *s)
{
    /* Room for a new set first: a claimed slot is never left empty. */
    if (tg_grow((void **)&b->cls, &b->cap_cls, b->n_cls + 1, sizeof(*b->cls)))
        return TG_ENOMEM;
    struct cls_key k = {b, s};
    int added = 0;
    int32_t *slot = tg_hmap_put(&b->cls_index, &cls_type, tg_hash_bytes(s, 32),
                                &k, &added);
    if (slot == NULL)
        return TG_ENOMEM;
    if (!added)
        return *slot;
    memcpy(b->cls[b->n_cls], s, 32);
    *slot = (int32_t)b->n_cls;
    return (int64_t)b->n_cls++;
}

static const char LATE[] = "grammar compile took longer than its time limit";

/* 1 when past the deadline (read on every call: callers call it every
 * few thousand steps). */
static int past(double deadline)
{
    return deadline > 0 && gm__now() > deadline;
}

static int32_t new_node(struct bld *b, int32_t rule)
{
    if ((size_t)b->n_t >= b->max_nodes * 4 + 64) {
        bfail(b, TG_ETOOBIG, "grammar automaton over the node limit");
        return -1;
    }
    if ((b->n_t & 4095) == 4095 && past(b->deadline)) {
        bfail(b, TG_ETIMEDOUT, LATE);
        return -1;
    }
    /* Two arrays, one capacity: cap_t moves once both have grown. */
    int32_t cap_rule = b->cap_t, cap_final = b->cap_t;
    if (TG_GROW(b->t_rule, &cap_rule, (int64_t)b->n_t + 1) ||
        TG_GROW(b->t_final, &cap_final, (int64_t)b->n_t + 1)) {
        bfail(b, TG_ENOMEM, "out of memory");
        return -1;
    }
    b->cap_t = cap_rule;
    b->t_rule[b->n_t] = rule;
    b->t_final[b->n_t] = 0;
    return b->n_t++;
}

static int add_edge(struct bld *b, int32_t from, uint8_t kind,
                    uint32_t label, int32_t to)
{
    if (tg_grow((void **)&b->te, &b->cap_te, b->n_te + 1, sizeof(*b->te)))
        return bfail(b, TG_ENOMEM, "out of memory");
    b->te[b->n_te++] =
        (struct tedge){.from = from, .to = to, .label = label, .kind = kind};
    return 0;
}

static uint64_t memo_hash(int32_t e, int32_t k)
{
    return ((uint64_t)(uint32_t)e << 32 | (uint32_t)k) *
               0x9E3779B97F4A7C15ull >>
           20;
}

static inline int memo_probe(const void *slot, const void *key)
{
    const struct memo_ent *m = slot;
    const int32_t *ek = key; /* e, k */
    if (m->e < 0)
        return TG_HMAP_EMPTY;
    return m->e == ek[0] && m->k == ek[1] ? TG_HMAP_HIT : TG_HMAP_MISS;
}

static int memo_empty(const void *slot)
{
    return ((const struct memo_ent *)slot)->e < 0;
}

static uint64_t memo_slot_hash(const void *slot, void *ctx)
{
    (void)ctx;
    const struct memo_ent *m = slot;
    return memo_hash(m->e, m->k);
}

static const struct tg_hmap_type memo_type = {
    .esize = sizeof(struct memo_ent),
    .empty_byte = 0xff,
    .probe = memo_probe,
    .is_empty = memo_empty,
    .hash = memo_slot_hash,
};

static int32_t memo_get(const struct bld *b, int32_t e, int32_t k)
{
    const int32_t key[2] = {e, k};
    const struct memo_ent *m = tg_hmap_find(&b->memo, &memo_type,
                                            memo_hash(e, k), key);
    return m != NULL ? m->node : -1;
}

static void memo_put(struct bld *b, int32_t e, int32_t k, int32_t node)
{
    const int32_t key[2] = {e, k};
    struct memo_ent *m = tg_hmap_put(&b->memo, &memo_type, memo_hash(e, k), key,
                                     NULL);
    if (m != NULL) /* out of memory: the memo only saves nodes */
        *m = (struct memo_ent){.e = e, .k = k, .node = node};
}

static int32_t emit(struct bld *b, int32_t e, int32_t k, int32_t rule);

/* A node that either enters `sub`, continuing at `cont` (at the node
 * itself when cont < 0: a loop), or skips to k. */
static int32_t skippable(struct bld *b, int32_t sub, int32_t cont, int32_t k,
                         int32_t rule)
{
    int32_t n = new_node(b, rule);
    if (n < 0)
        return -1;
    int32_t body = emit(b, sub, cont < 0 ? n : cont, rule);
    if (body < 0)
        return -1;
    add_edge(b, n, T_EPS, 0, body);
    add_edge(b, n, T_EPS, 0, k);
    return n;
}

/* Emits expression e continuing to node k inside `rule`; returns its start
 * node, or -1 (an error is in b->err; an unproductive e never gets here). */
static int32_t emit(struct bld *b, int32_t e, int32_t k, int32_t rule)
{
    const struct gm_ir *ir = b->ir;
    const struct gm_expr *x = &ir->expr[e];
    if (b->err)
        return -1;
    if (x->kind == GM_EXPR_EMPTY)
        return k;
    int32_t got = memo_get(b, e, k);
    if (got >= 0)
        return got;
    if (b->depth >= EMIT_DEPTH_MAX) {
        bfail(b, TG_ETOOBIG, "grammar nested too deeply (more than 20000 "
                             "levels of expressions)");
        return -1;
    }
    b->depth++;
    int32_t s = -1;
    switch (x->kind) {
    case GM_EXPR_BYTES: {
        s = k;
        for (uint32_t i = x->n; i-- > 0 && !b->err;) {
            uint8_t set[32] = {0};
            uint8_t c = ir->bytes[x->off + i];
            set[c >> 3] = (uint8_t)(1u << (c & 7));
            int64_t cl = cls_intern(b, set);
            int32_t n = new_node(b, rule);
            if (cl < 0 || n < 0)
                return bfail(b, TG_ENOMEM, "out of memory"), -1;
            add_edge(b, n, T_BYTE, (uint32_t)cl, s);
            s = n;
        }
        break;
    }
    case GM_EXPR_CLASS: {
        int64_t cl = cls_intern(b, ir->cls[x->off]);
        s = new_node(b, rule);
        if (cl < 0)
            return bfail(b, TG_ENOMEM, "out of memory"), -1;
        if (s >= 0)
            add_edge(b, s, T_BYTE, (uint32_t)cl, k);
        break;
    }
    case GM_EXPR_SEQ:
        s = k;
        for (uint32_t i = x->n; i-- > 0 && s >= 0;)
            s = emit(b, ir->items[x->off + i], s, rule);
        break;
    case GM_EXPR_ALT: {
        int32_t only = -1, n_ok = 0;
        for (uint32_t i = 0; i < x->n; i++)
            if (b->prod[ir->items[x->off + i]]) {
                only = ir->items[x->off + i];
                n_ok++;
            }
        if (n_ok == 1) {
            s = emit(b, only, k, rule);
            break;
        }
        s = new_node(b, rule);
        for (uint32_t i = 0; i < x->n && s >= 0; i++) {
            int32_t it = ir->items[x->off + i];
            if (!b->prod[it])
                continue;
            int32_t t = emit(b, it, k, rule);
            if (t < 0)
                return -1;
            add_edge(b, s, T_EPS, 0, t);
        }
        break;
    }
    case GM_EXPR_REPEAT: {
        int32_t sub = x->sub;
        if (!b->prod[sub]) {
            s = k; /* min == 0 here (the repeat is productive) */
            break;
        }
        /* the optional part: a loop, or max - min nested options */
        int32_t tail = k;
        if (x->max == GM_REPEAT_INF)
            tail = skippable(b, sub, -1, k, rule);
        else
            for (uint32_t i = x->min; i < x->max && tail >= 0; i++)
                tail = skippable(b, sub, tail, k, rule);
        for (uint32_t i = 0; i < x->min && tail >= 0; i++)
            tail = emit(b, sub, tail, rule);
        s = tail;
        break;
    }
    case GM_EXPR_REF:
        s = new_node(b, rule);
        if (s >= 0) {
            add_edge(b, s, T_CALL, x->off, k);
            if (b->null_r[x->off])
                add_edge(b, s, T_EPS, 0, k);
        }
        break;
    }
    b->depth--;
    if (s >= 0 && !b->err)
        memo_put(b, e, k, s);
    return b->err ? -1 : s;
}

/* ---- epsilon elimination and the final automaton ------------------------ */

static int by_from(const void *a, const void *c)
{
    const struct tedge *x = a, *y = c;
    if (x->from != y->from)
        return x->from < y->from ? -1 : 1;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    if (x->label != y->label)
        return x->label < y->label ? -1 : 1;
    return x->to < y->to ? -1 : x->to > y->to;
}

/* Epsilon-free edges of one node: collected from its epsilon closure. */
struct closed {
    struct tedge *e; /* kind BYTE / CALL, from = the node */
    size_t n, cap;
    uint8_t final;
};

struct eps {
    const struct tedge *te;
    size_t *first; /* (n_t + 1) CSR over te sorted by from */
    int32_t *stamp;
    int32_t *stack;
};

static int close_node(struct bld *b, struct eps *x, int32_t u,
                      struct closed *out)
{
    out->n = 0;
    out->final = 0;
    size_t sp = 0;
    x->stack[sp++] = u;
    x->stamp[u] = u;
    while (sp > 0) {
        int32_t w = x->stack[--sp];
        out->final |= b->t_final[w];
        for (size_t i = x->first[w]; i < x->first[w + 1]; i++) {
            const struct tedge *t = &x->te[i];
            if (t->kind == T_EPS) {
                if (x->stamp[t->to] != u) {
                    x->stamp[t->to] = u;
                    x->stack[sp++] = t->to;
                }
                continue;
            }
            if (tg_grow((void **)&out->e, &out->cap, out->n + 1,
                        sizeof(*out->e)))
                return TG_ENOMEM;
            out->e[out->n] = *t;
            out->e[out->n++].from = u;
        }
    }
    if (out->n > 1) {
        qsort(out->e, out->n, sizeof(*out->e), by_from);
        size_t m = 1;
        for (size_t i = 1; i < out->n; i++)
            if (by_from(&out->e[i], &out->e[m - 1]) != 0)
                out->e[m++] = out->e[i];
        out->n = m;
    }
    return 0;
}

static int is_set(const uint8_t *s, unsigned c)
{
    return (s[c >> 3] >> (c & 7)) & 1;
}

/* Rows for byte-deterministic nodes with many edges. */
static int build_dense(struct gm__pda *p)
{
    size_t rows = 0;
    for (int32_t u = 0; u < p->n_node; u++) {
        p->node[u].dense = -1;
        if (p->node[u].ne >= DENSE_MIN_EDGES && rows < DENSE_MAX_ROWS)
            rows++;
    }
    if (rows == 0)
        return 0;
    p->dense = malloc(rows * 256 * sizeof(*p->dense));
    if (p->dense == NULL)
        return TG_ENOMEM;
    size_t r = 0;
    for (int32_t u = 0; u < p->n_node && r < rows; u++) {
        struct gm__node *n = &p->node[u];
        if (n->ne < DENSE_MIN_EDGES)
            continue;
        int32_t *row = p->dense + r * 256;
        for (int c = 0; c < 256; c++)
            row[c] = -1;
        int ok = 1;
        for (uint32_t i = 0; i < n->ne && ok; i++) {
            const struct gm__edge *e = &p->edge[n->e0 + i];
            for (unsigned c = 0; c < 256; c++)
                if (is_set(p->cls[e->cls], c)) {
                    if (row[c] >= 0 && row[c] != e->to)
                        ok = 0;
                    row[c] = e->to;
                }
        }
        if (ok)
            n->dense = (int32_t)r++;
    }
    p->n_dense = r;
    return 0;
}

/* Bytes that can come first from node u: its edges, and the first bytes
 * of the rules it calls (entries only, from first_r). */
static void first_of(const struct gm__pda *p, int32_t u,
                     const uint8_t (*first_r)[32], uint8_t *out)
{
    const struct gm__node *n = &p->node[u];
    for (uint32_t i = 0; i < n->ne; i++)
        for (int k = 0; k < 32; k++)
            out[k] |= p->cls[p->edge[n->e0 + i].cls][k];
    for (uint32_t i = 0; i < n->nc; i++)
        for (int k = 0; k < 32; k++)
            out[k] |= first_r[p->call[n->c0 + i].rule][k];
}

static int build_follow(struct gm__pda *p, double deadline)
{
    uint8_t(*first_r)[32] = calloc((size_t)p->n_rule, 32);
    p->follow = calloc((size_t)p->n_rule, 32);
    if (first_r == NULL || p->follow == NULL) {
        free(first_r);
        return TG_ENOMEM;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        if (past(deadline)) {
            free(first_r);
            return TG_ETIMEDOUT;
        }
        for (int32_t r = 0; r < p->n_rule; r++) {
            if (p->rule_entry[r] < 0)
                continue;
            uint8_t f[32];
            memcpy(f, first_r[r], 32);
            first_of(p, p->rule_entry[r], (const uint8_t(*)[32])first_r, f);
            if (memcmp(f, first_r[r], 32) != 0) {
                memcpy(first_r[r], f, 32);
                changed = 1;
            }
        }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        if (past(deadline)) {
            free(first_r);
            return TG_ETIMEDOUT;
        }
        for (size_t i = 0; i < p->n_call; i++) {
            const struct gm__call *c = &p->call[i];
            uint8_t f[32];
            memcpy(f, p->follow[c->rule], 32);
            first_of(p, c->ret, (const uint8_t(*)[32])first_r, f);
            if (p->node[c->ret].final)
                for (int k = 0; k < 32; k++)
                    f[k] |= p->follow[p->node[c->ret].rule][k];
            if (memcmp(f, p->follow[c->rule], 32) != 0) {
                memcpy(p->follow[c->rule], f, 32);
                changed = 1;
            }
        }
    }
    free(first_r);
    return 0;
}

static int build_minfin(struct gm__pda *p, double deadline)
{
    p->minfin = malloc((size_t)p->n_node * sizeof(*p->minfin));
    if (p->minfin == NULL)
        return TG_ENOMEM;
    for (int32_t u = 0; u < p->n_node; u++)
        p->minfin[u] = p->node[u].final ? 0 : INF_LEN;
    for (int changed = 1; changed;) {
        changed = 0;
        if (past(deadline))
            return TG_ETIMEDOUT;
        for (int32_t u = p->n_node; u-- > 0;) {
            const struct gm__node *n = &p->node[u];
            uint32_t best = p->minfin[u];
            for (uint32_t i = 0; i < n->ne; i++) {
                uint32_t v = 1 + p->minfin[p->edge[n->e0 + i].to];
                if (v < best)
                    best = v;
            }
            for (uint32_t i = 0; i < n->nc; i++) {
                const struct gm__call *c = &p->call[n->c0 + i];
                uint32_t v = p->minfin[c->entry] + p->minfin[c->ret];
                if (v < best)
                    best = v;
            }
            if (best < p->minfin[u]) {
                p->minfin[u] = best;
                changed = 1;
            }
        }
    }
    return 0;
}

/* Left recursion: rule r calls r' at its entry (before any byte). */
static int check_left(const struct gm__pda *p, double deadline, char *err,
                      size_t errlen)
{
    int32_t n = p->n_rule;
    uint8_t *color = calloc((size_t)n, 1);
    int32_t *stack = malloc(((size_t)n + 1) * 2 * sizeof(*stack));
    if (color == NULL || stack == NULL) {
        free(color);
        free(stack);
        return TG_ENOMEM;
    }
    int rc = 0;
    for (int32_t r0 = 0; r0 < n && rc == 0; r0++) {
        if ((r0 & 255) == 255 && past(deadline)) {
            rc = tg_err_set(err, errlen, TG_ETIMEDOUT, LATE);
            break;
        }
        if (color[r0] != 0 || p->rule_entry[r0] < 0)
            continue;
        /* stack of (rule, next call index) */
        size_t sp = 0;
        stack[sp++] = r0;
        stack[sp++] = 0;
        color[r0] = 1;
        while (sp > 0 && rc == 0) {
            int32_t r = stack[sp - 2];
            const struct gm__node *e = &p->node[p->rule_entry[r]];
            int32_t i = stack[sp - 1]++;
            if ((uint32_t)i >= e->nc) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            int32_t c = p->call[e->c0 + (uint32_t)i].rule;
            if (color[c] == 1) {
                rc = tg_err_set(err, errlen, TG_EINVAL,
                                "grammar rule %s is left-recursive (it can "
                                "reach itself without consuming a byte)",
                                p->rule_name[c]);
            } else if (color[c] == 0) {
                color[c] = 1;
                stack[sp++] = c;
                stack[sp++] = 0;
            }
        }
    }
    free(color);
    free(stack);
    return rc;
}

void gm__pda_free(struct gm__pda *p)
{
    if (p->rule_name != NULL)
        for (int32_t r = 0; r < p->n_rule; r++)
            free(p->rule_name[r]);
    free(p->rule_name);
    free(p->node);
    free(p->edge);
    free(p->call);
    free(p->cls);
    free(p->dense);
    free(p->rule_entry);
    free(p->follow);
    free(p->minfin);
    free(p->sig);
    free(p->sig_donor);
    free(p->sig_skip);
    memset(p, 0, sizeof(*p));
}

static void bld_free(struct bld *b)
{
    free(b->prod);
    free(b->null);
    free(b->prod_r);
    free(b->null_r);
    free(b->t_rule);
    free(b->t_final);
    free(b->te);
    free(b->t_start);
    tg_hmap_free(&b->memo);
    free(b->cls);
    tg_hmap_free(&b->cls_index);
}

/* Builds the final automaton from the epsilon-NFA: closures, entries,
 * reachable nodes renumbered in BFS order. Temporary ids: 0 .. nt-1 the
 * NFA's nodes, nt + r the non-final entry copy of rule r's start. */
static int finish(struct bld *b, struct gm__pda *p)
{
    const struct gm_ir *ir = b->ir;
    int32_t nt = b->n_t;
    int32_t n_all = nt + (int32_t)ir->n_rule;
    int rc = 0;
    if (b->n_te > 1) /* none: a grammar of the empty string alone */
        qsort(b->te, b->n_te, sizeof(*b->te), by_from);
    struct eps x = {.te = b->te};
    x.first = calloc((size_t)nt + 1, sizeof(*x.first));
    x.stamp = malloc((size_t)nt * sizeof(*x.stamp));
    x.stack = malloc(((size_t)nt + 1) * sizeof(*x.stack));
    /* per temporary id: its closed edges c_edges[c_first .. c_last) */
    size_t *c_first = calloc((size_t)n_all, sizeof(*c_first));
    size_t *c_last = calloc((size_t)n_all, sizeof(*c_last));
    uint8_t *c_final = calloc((size_t)n_all, 1);
    int32_t *entry = malloc((ir->n_rule ? ir->n_rule : 1) * sizeof(*entry));
    int32_t *map = malloc((size_t)n_all * sizeof(*map));
    int32_t *queue = malloc((size_t)n_all * sizeof(*queue));
    struct tedge *c_edges = NULL;
    size_t n_ce = 0, cap_ce = 0;
    struct closed cl = {0};
    if (x.first == NULL || x.stamp == NULL || x.stack == NULL ||
        c_first == NULL || c_last == NULL || c_final == NULL ||
        entry == NULL || map == NULL || queue == NULL) {
        rc = TG_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < b->n_te; i++)
        x.first[b->te[i].from + 1]++;
    for (int32_t u = 0; u < nt; u++)
        x.first[u + 1] += x.first[u];
    for (int32_t u = 0; u < nt; u++)
        x.stamp[u] = -1;
    for (int32_t u = 0; u < nt && rc == 0; u++) {
        if ((u & 4095) == 4095 && past(b->deadline)) {
            rc = tg_err_set(b->errbuf, b->errlen, TG_ETIMEDOUT, LATE);
            goto out;
        }
        rc = close_node(b, &x, u, &cl);
        if (rc == 0 && n_ce + cl.n > b->max_nodes * 16)
            rc = tg_err_set(b->errbuf, b->errlen, TG_ETOOBIG,
                            "grammar automaton over the edge limit");
        if (rc == 0 &&
            tg_grow((void **)&c_edges, &cap_ce, n_ce + cl.n, sizeof(*c_edges)))
            rc = TG_ENOMEM;
        if (rc != 0)
            goto out;
        c_first[u] = n_ce;
        if (cl.n > 0)
            memcpy(c_edges + n_ce, cl.e, cl.n * sizeof(*cl.e));
        n_ce += cl.n;
        c_last[u] = n_ce;
        c_final[u] = cl.final;
    }
    /* A nullable rule is entered through a copy of its start that is not
     * final, so every call consumes a byte (the call site has its own
     * bypass edge). */
    for (size_t r = 0; r < ir->n_rule; r++) {
        int32_t s = b->t_start[r];
        int32_t id = nt + (int32_t)r;
        entry[r] = s;
        if (s < 0 || !c_final[s])
            continue;
        size_t k = c_last[s] - c_first[s];
        if (tg_grow((void **)&c_edges, &cap_ce, n_ce + k, sizeof(*c_edges))) {
            rc = TG_ENOMEM;
            goto out;
        }
        if (k > 0)
            memcpy(c_edges + n_ce, c_edges + c_first[s], k * sizeof(*c_edges));
        c_first[id] = n_ce;
        n_ce += k;
        c_last[id] = n_ce;
        entry[r] = id;
    }
    /* BFS from the root's start over byte targets, call entries, rets */
    for (int32_t u = 0; u < n_all; u++)
        map[u] = -1;
    int32_t head = 0, tail = 0;
    int32_t root_start = b->t_start[ir->root];
    map[root_start] = tail;
    queue[tail++] = root_start;
    size_t n_edge = 0, n_call = 0;
    while (head < tail) {
        int32_t u = queue[head++];
        for (size_t i = c_first[u]; i < c_last[u]; i++) {
            const struct tedge *t = &c_edges[i];
            int32_t vs[2] = {t->to, -1};
            if (t->kind == T_CALL) {
                vs[1] = entry[t->label];
                n_call++;
            } else {
                n_edge++;
            }
            for (int k = 0; k < 2; k++)
                if (vs[k] >= 0 && map[vs[k]] < 0) {
                    map[vs[k]] = tail;
                    queue[tail++] = vs[k];
                }
        }
    }
    if ((size_t)tail > b->max_nodes) {
        rc = tg_err_set(b->errbuf, b->errlen, TG_ETOOBIG,
                        "grammar automaton has %d nodes, over the limit %zu",
                        (int)tail, b->max_nodes);
        goto out;
    }
    p->n_node = tail;
    p->n_rule = (int32_t)ir->n_rule;
    p->root_rule = ir->root;
    p->node = calloc((size_t)tail, sizeof(*p->node));
    p->edge = malloc((n_edge ? n_edge : 1) * sizeof(*p->edge));
    p->call = malloc((n_call ? n_call : 1) * sizeof(*p->call));
    p->rule_entry = malloc((size_t)p->n_rule * sizeof(*p->rule_entry));
    p->rule_name = calloc((size_t)p->n_rule, sizeof(*p->rule_name));
    p->cls = malloc((b->n_cls ? b->n_cls : 1) * 32);
    if (p->node == NULL || p->edge == NULL || p->call == NULL ||
        p->rule_entry == NULL || p->rule_name == NULL || p->cls == NULL) {
        rc = TG_ENOMEM;
        goto out;
    }
    if (b->n_cls > 0) /* none: a grammar of the empty string alone */
        memcpy(p->cls, b->cls, b->n_cls * 32);
    p->n_cls = b->n_cls;
    for (int32_t r = 0; r < p->n_rule; r++) {
        p->rule_name[r] = strdup(ir->rule[r].name);
        if (p->rule_name[r] == NULL) {
            rc = TG_ENOMEM;
            goto out;
        }
        p->rule_entry[r] =
            entry[r] >= 0 && map[entry[r]] >= 0 ? map[entry[r]] : -1;
    }
    p->start = map[root_start];
    for (int32_t i = 0; i < tail; i++) {
        int32_t u = queue[i];
        struct gm__node *n = &p->node[i];
        n->rule = u < nt ? b->t_rule[u] : u - nt;
        n->final = c_final[u];
        n->e0 = (uint32_t)p->n_edge;
        n->c0 = (uint32_t)p->n_call;
        for (size_t k = c_first[u]; k < c_last[u]; k++) {
            const struct tedge *t = &c_edges[k];
            if (t->kind == T_BYTE)
                p->edge[p->n_edge++] =
                    (struct gm__edge){.to = map[t->to], .cls = t->label};
            else
                p->call[p->n_call++] =
                    (struct gm__call){.rule = (int32_t)t->label,
                                      .entry = map[entry[t->label]],
                                      .ret = map[t->to]};
        }
        n->ne = (uint32_t)p->n_edge - n->e0;
        n->nc = (uint32_t)p->n_call - n->c0;
        n->simple = n->nc == 0 && !n->final;
    }
out:
    free(x.first);
    free(x.stamp);
    free(x.stack);
    free(c_first);
    free(c_last);
    free(c_final);
    free(entry);
    free(map);
    free(queue);
    free(c_edges);
    free(cl.e);
    if (rc == TG_ENOMEM)
        tg_err_set(b->errbuf, b->errlen, rc, "grammar: out of memory");
    return rc;
}

int gm__pda_build(struct gm__pda *p, const struct gm_ir *ir, size_t max_nodes,
                  double deadline, char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    if (ir->root < 0)
        return tg_err_set(err, errlen, TG_EINVAL, "grammar has no start rule");
    struct bld b;
    memset(&b, 0, sizeof b);
    b.ir = ir;
    b.max_nodes = max_nodes ? max_nodes : GM_LIMIT_NODES;
    b.deadline = deadline;
    b.errbuf = err;
    b.errlen = errlen;
    size_t ne = ir->n_expr ? ir->n_expr : 1, nr = ir->n_rule ? ir->n_rule : 1;
    b.prod = calloc(ne, 1);
    b.null = calloc(ne, 1);
    b.prod_r = calloc(nr, 1);
    b.null_r = calloc(nr, 1);
    b.t_start = malloc(nr * sizeof(*b.t_start));
    int rc = 0;
    if (b.prod == NULL || b.null == NULL || b.prod_r == NULL ||
        b.null_r == NULL || b.t_start == NULL ||
        tg_hmap_init(&b.memo, &memo_type, NULL, 512) != 0 ||
        tg_hmap_init(&b.cls_index, &cls_type, &b, 128) != 0) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "grammar: out of memory");
        goto out;
    }
    analyse(&b);
    if (!b.prod_r[ir->root]) {
        rc = tg_err_set(err, errlen, TG_EINVAL,
                        "no document satisfies the grammar");
        goto out;
    }
    for (size_t r = 0; r < ir->n_rule && !b.err; r++) {
        b.t_start[r] = -1;
        if (!b.prod_r[r])
            continue;
        int32_t fin = new_node(&b, (int32_t)r);
        if (fin < 0)
            break;
        b.t_final[fin] = 1;
        b.t_start[r] = emit(&b, ir->rule[r].body, fin, (int32_t)r);
    }
    if (b.err) {
        rc = b.err;
        goto out;
    }
    rc = finish(&b, p);
    if (rc == 0)
        rc = check_left(p, deadline, err, errlen);
    if (rc == 0 && (rc = build_dense(p)) == 0 &&
        (rc = build_follow(p, deadline)) == 0)
        rc = build_minfin(p, deadline);
    if (rc == TG_ETIMEDOUT)
        tg_err_set(err, errlen, rc, LATE);
    else if (rc == TG_ENOMEM)
        tg_err_set(err, errlen, rc, "grammar: out of memory");
out:
    bld_free(&b);
    if (rc != 0)
        gm__pda_free(p);
    return rc;
}
