/* gm_gbnf.c — GBNF text parsed into a tree, checked (every rule defined,
 * `root`, no left recursion) and written as grammar IR (gm_gbnf.h). */
#include "common/grammar/gm_gbnf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_regex.h"
#include "common/grammar/gm_regex_internal.h"
#include "common/base/tg_err.h"

enum { N_EMPTY = 0, N_LIT, N_SET, N_SEQ, N_ALT, N_REP, N_REF };

struct node {
    uint8_t kind;
    uint32_t min, max; /* N_REP */
    int32_t a, n;      /* see the kinds: LIT bytes a..a+n; SET set a;
                          SEQ/ALT kids a..a+n; REP child a; REF rule a */
    size_t pos;
};

struct rule {
    const char *name; /* into the text */
    size_t len;
    int32_t body; /* node, -1 until defined */
    size_t def_pos, use_pos;
    int32_t ir; /* IR rule */
    uint8_t nullable, mark;
};

struct gp {
    const unsigned char *s;
    size_t n, i;
    struct gm_ir *ir;
    struct node *node;
    size_t n_node, cap_node;
    int32_t *kid;
    size_t n_kid, cap_kid;
    uint8_t *lit;
    size_t n_lit, cap_lit;
    struct gm__cset *set;
    size_t n_set, cap_set;
    struct rule *rule;
    size_t n_rule, cap_rule;
    struct gm__kset names; /* (hash, hash, salt) -> rule */
    int depth;
    int rc;
    char *err;
    size_t errlen;
};

/* Line and column (1-based) of byte offset pos. */
static void line_col(const struct gp *g, size_t pos, size_t *line, size_t *col)
{
    *line = 1;
    size_t start = 0;
    for (size_t i = 0; i < pos && i < g->n; i++)
        if (g->s[i] == '\n') {
            (*line)++;
            start = i + 1;
        }
    *col = pos - start + 1;
}

static int gfail(struct gp *g, int code, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int gfail(struct gp *g, int code, size_t pos, const char *fmt, ...)
{
    if (g->rc != 0)
        return g->rc;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos == (size_t)-1) {
        g->rc = tg_err_set(g->err, g->errlen, code, "grammar: %s", msg);
    } else {
        size_t line, col;
        line_col(g, pos, &line, &col);
        g->rc = tg_err_set(g->err, g->errlen, code,
                           "grammar: %s at line %zu column %zu", msg, line,
                           col);
    }
    return g->rc;
}

static int oom(struct gp *g)
{
    return gfail(g, TG_ENOMEM, (size_t)-1, "out of memory");
}

static int32_t new_node(struct gp *g, uint8_t kind, size_t pos)
{
    if (TG_GROW(g->node, &g->cap_node, g->n_node + 1))
        return oom(g);
    g->node[g->n_node] = (struct node){.kind = kind, .pos = pos};
    return (int32_t)g->n_node++;
}

/* ---- lexing --------------------------------------------------------------- */

static void ws(struct gp *g)
{
    while (g->i < g->n) {
        unsigned char c = g->s[g->i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            g->i++;
        } else if (c == '#') {
            while (g->i < g->n && g->s[g->i] != '\n')
                g->i++;
        } else {
            break;
        }
    }
}

static int name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int hexv(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* One character of a literal or class at g->i (an escape or a UTF-8 code
 * point) into *cp; 0 or the error. */
static int one_char(struct gp *g, uint32_t *cp)
{
    size_t pos = g->i;
    if (g->i >= g->n)
        return gfail(g, TG_EFORMAT, pos, "unexpected end of the grammar");
    if (g->s[g->i] != '\\') {
        size_t k = gm__utf8_dec(g->s + g->i, g->n - g->i, cp);
        if (k == 0)
            return gfail(g, TG_EFORMAT, pos, "the grammar is not UTF-8");
        g->i += k;
        return 0;
    }
    if (++g->i >= g->n)
        return gfail(g, TG_EFORMAT, pos, "\\ at the end of the grammar");
    unsigned char e = g->s[g->i++];
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits > 0) {
        uint64_t v = 0;
        for (int k = 0; k < digits; k++) {
            int h = g->i < g->n ? hexv(g->s[g->i]) : -1;
            if (h < 0)
                return gfail(g, TG_EFORMAT, pos, "\\%c needs %d hex digits", e,
                             digits);
            v = v * 16 + (uint64_t)h;
            g->i++;
        }
        if (v > GM__CP_MAX)
            return gfail(g, TG_EFORMAT, pos, "code point above U+10FFFF");
        *cp = (uint32_t)v;
        return 0;
    }
    switch (e) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    default: break;
    }
    if (e < 0x80 && e > 0x20 && !name_char(e)) {
        *cp = e; /* \\ \" \[ \] and any other punctuation: itself */
        return 0;
    }
    if (e == '-') {
        *cp = e;
        return 0;
    }
    return gfail(g, TG_EFORMAT, pos, "unknown escape \\%c", e);
}

static int put_utf8(struct gp *g, uint32_t c)
{
    uint8_t b[4];
    size_t k;
    if (c < 0x80) {
        b[0] = (uint8_t)c;
        k = 1;
    } else if (c < 0x800) {
        b[0] = (uint8_t)(0xC0 | (c >> 6));
        b[1] = (uint8_t)(0x80 | (c & 0x3F));
        k = 2;
    } else if (c < 0x10000) {
        b[0] = (uint8_t)(0xE0 | (c >> 12));
        b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (c & 0x3F));
        k = 3;
    } else {
        b[0] = (uint8_t)(0xF0 | (c >> 18));
        b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
        b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        b[3] = (uint8_t)(0x80 | (c & 0x3F));
        k = 4;
    }
    if (TG_GROW(g->lit, &g->cap_lit, g->n_lit + k))
        return oom(g);
    memcpy(g->lit + g->n_lit, b, k);
    g->n_lit += k;
    return 0;
}

/* ---- rules by name ----------------------------------------------------------- */

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001B3ull;
    return h;
}

/* The rule named s[0..n), added (undefined) when new. */
static int32_t rule_of(struct gp *g, const char *s, size_t n, size_t pos)
{
    uint64_t h = name_hash(s, n);
    for (int32_t salt = 0;; salt++) {
        int32_t v;
        int r = gm__kset_put(&g->names, (int32_t)h, (int32_t)(h >> 32), salt,
                             (int32_t)g->n_rule, &v);
        if (r < 0)
            return oom(g);
        if (r == 0) {
            if (g->rule[v].len == n && memcmp(g->rule[v].name, s, n) == 0)
                return v;
            continue; /* another name with this hash */
        }
        if (g->n_rule >= GM_GBNF_MAX_RULES)
            return gfail(g, TG_ETOOBIG, pos, "more than %d rules",
                         GM_GBNF_MAX_RULES);
        if (TG_GROW(g->rule, &g->cap_rule, g->n_rule + 1))
            return oom(g);
        g->rule[g->n_rule] = (struct rule){
            .name = s, .len = n, .body = -1, .use_pos = pos, .ir = -1};
        return (int32_t)g->n_rule++;
    }
}

/* ---- parsing -------------------------------------------------------------------- */

static int32_t alternation(struct gp *g);

static int32_t literal(struct gp *g)
{
    size_t pos = g->i++;
    size_t off = g->n_lit;
    while (g->i < g->n && g->s[g->i] != '"') {
        uint32_t c;
        if (one_char(g, &c) != 0)
            return g->rc;
        if (c >= 0xD800 && c <= 0xDFFF)
            return gfail(g, TG_EFORMAT, pos,
                         "a surrogate code point cannot be written in UTF-8");
        if (put_utf8(g, c) != 0)
            return g->rc;
    }
    if (g->i >= g->n)
        return gfail(g, TG_EFORMAT, pos, "unterminated string");
    g->i++;
    int32_t x = new_node(g, N_LIT, pos);
    if (x >= 0) {
        g->node[x].a = (int32_t)off;
        g->node[x].n = (int32_t)(g->n_lit - off);
    }
    return x;
}

static int32_t char_class(struct gp *g)
{
    size_t pos = g->i++;
    int neg = g->i < g->n && g->s[g->i] == '^';
    if (neg)
        g->i++;
    if (TG_GROW(g->set, &g->cap_set, g->n_set + 1))
        return oom(g);
    struct gm__cset *cs = &g->set[g->n_set];
    memset(cs, 0, sizeof(*cs));
    int32_t idx = (int32_t)g->n_set++;
    while (g->i < g->n && g->s[g->i] != ']') {
        size_t cpos = g->i;
        uint32_t lo, hi;
        if (one_char(g, &lo) != 0)
            return g->rc;
        hi = lo;
        if (g->i + 1 < g->n && g->s[g->i] == '-' && g->s[g->i + 1] != ']') {
            g->i++;
            if (one_char(g, &hi) != 0)
                return g->rc;
            if (hi < lo)
                return gfail(g, TG_EFORMAT, cpos, "class range out of order");
        }
        if (gm__cset_add(&g->set[idx], lo, hi) != 0)
            return oom(g);
    }
    if (g->i >= g->n)
        return gfail(g, TG_EFORMAT, pos, "unterminated character class");
    g->i++;
    gm__cset_norm(&g->set[idx]);
    if (neg && gm__cset_invert(&g->set[idx]) != 0)
        return oom(g);
    int32_t x = new_node(g, N_SET, pos);
    if (x >= 0)
        g->node[x].a = idx;
    return x;
}

/* Digits at g->i; -1 when none. Capped above GM_REPEAT_MAX. */
static int64_t number(struct gp *g)
{
    int64_t v = -1;
    while (g->i < g->n && g->s[g->i] >= '0' && g->s[g->i] <= '9') {
        v = (v < 0 ? 0 : v * 10) + (g->s[g->i++] - '0');
        if (v > (int64_t)GM_REPEAT_MAX + 1)
            v = (int64_t)GM_REPEAT_MAX + 1;
    }
    return v;
}

/* A quantifier at g->i applied to x; returns the new node, x (none), or
 * the error. */
static int32_t quantified(struct gp *g, int32_t x)
{
    size_t pos = g->i;
    unsigned char c = g->s[g->i];
    uint32_t mn, mx;
    if (c == '*' || c == '+' || c == '?') {
        g->i++;
        mn = c == '+';
        mx = c == '?' ? 1 : GM_REPEAT_INF;
    } else if (c == '{') {
        g->i++;
        ws(g);
        int64_t a = number(g), b;
        if (a < 0)
            return gfail(g, TG_EFORMAT, pos, "expecting a count after {");
        ws(g);
        if (g->i < g->n && g->s[g->i] == '}') {
            b = a;
        } else if (g->i < g->n && g->s[g->i] == ',') {
            g->i++;
            ws(g);
            b = number(g);
            ws(g);
            if (g->i >= g->n || g->s[g->i] != '}')
                return gfail(g, TG_EFORMAT, pos, "expecting } of {m,n}");
        } else {
            return gfail(g, TG_EFORMAT, pos, "expecting , or } in {m,n}");
        }
        g->i++;
        if (a > GM_REPEAT_MAX || b > GM_REPEAT_MAX)
            return gfail(g, TG_ETOOBIG, pos,
                         "repetition count over the limit %u", GM_REPEAT_MAX);
        if (b >= 0 && b < a)
            return gfail(g, TG_EFORMAT, pos, "repetition {m,n} with n < m");
        mn = (uint32_t)a;
        mx = b < 0 ? GM_REPEAT_INF : (uint32_t)b;
    } else {
        return x;
    }
    int32_t r = new_node(g, N_REP, pos);
    if (r >= 0) {
        g->node[r].a = x;
        g->node[r].min = mn;
        g->node[r].max = mx;
    }
    return r;
}

/* 1 when a rule definition "name ::=" starts at g->i. */
static int at_definition(struct gp *g)
{
    size_t save = g->i;
    while (g->i < g->n && name_char(g->s[g->i]))
        g->i++;
    int name = g->i > save;
    ws(g);
    int r = name && g->i + 3 <= g->n && memcmp(g->s + g->i, "::=", 3) == 0;
    g->i = save;
    return r;
}

static int32_t primary(struct gp *g)
{
    size_t pos = g->i;
    unsigned char c = g->s[g->i];
    if (c == '"')
        return literal(g);
    if (c == '[')
        return char_class(g);
    if (c == '.') {
        g->i++;
        if (TG_GROW(g->set, &g->cap_set, g->n_set + 1))
            return oom(g);
        memset(&g->set[g->n_set], 0, sizeof(*g->set));
        if (gm__cset_add(&g->set[g->n_set], 0, GM__CP_MAX) != 0)
            return oom(g);
        int32_t x = new_node(g, N_SET, pos);
        if (x >= 0)
            g->node[x].a = (int32_t)g->n_set++;
        return x;
    }
    if (c == '(') {
        g->i++;
        if (++g->depth > GM_GBNF_MAX_NESTING)
            return gfail(g, TG_ETOOBIG, pos,
                         "parentheses nested more than %d deep",
                         GM_GBNF_MAX_NESTING);
        int32_t x = alternation(g);
        g->depth--;
        if (x < 0)
            return x;
        ws(g);
        if (g->i >= g->n || g->s[g->i] != ')')
            return gfail(g, TG_EFORMAT, pos, "missing ) of the group opened");
        g->i++;
        return x;
    }
    if (name_char(c)) {
        size_t b = g->i;
        while (g->i < g->n && name_char(g->s[g->i]))
            g->i++;
        int32_t r = rule_of(g, (const char *)g->s + b, g->i - b, b);
        if (r < 0)
            return r;
        int32_t x = new_node(g, N_REF, pos);
        if (x >= 0)
            g->node[x].a = r;
        return x;
    }
    if (c >= 0x20 && c < 0x7F)
        return gfail(g, TG_EFORMAT, pos, "unexpected '%c'", c);
    return gfail(g, TG_EFORMAT, pos, "unexpected byte 0x%02x", c);
}

struct ids {
    int32_t *v;
    size_t n, cap;
};

/* A list node from l (one item: itself). */
static int32_t list(struct gp *g, uint8_t kind, struct ids *l, size_t pos)
{
    if (l->n == 1) {
        int32_t x = l->v[0];
        free(l->v);
        return x;
    }
    int32_t x = new_node(g, l->n == 0 ? N_EMPTY : kind, pos);
    if (x >= 0 && l->n > 0) {
        if (TG_GROW(g->kid, &g->cap_kid, g->n_kid + l->n)) {
            free(l->v);
            return oom(g);
        }
        memcpy(g->kid + g->n_kid, l->v, l->n * sizeof(*l->v));
        g->node[x].a = (int32_t)g->n_kid;
        g->node[x].n = (int32_t)l->n;
        g->n_kid += l->n;
    }
    free(l->v);
    return x;
}

static int32_t sequence(struct gp *g)
{
    struct ids l = {0};
    size_t pos = g->i;
    for (;;) {
        ws(g);
        if (g->i >= g->n || g->s[g->i] == '|' || g->s[g->i] == ')' ||
            at_definition(g))
            break;
        int32_t x = primary(g);
        for (int k = 0; x >= 0; k++) {
            ws(g);
            if (g->i >= g->n)
                break;
            if (k == 4) {
                free(l.v);
                return gfail(g, TG_EFORMAT, g->i,
                             "more than 4 quantifiers in a row");
            }
            int32_t q = quantified(g, x);
            if (q == x || q < 0) {
                x = q;
                break;
            }
            x = q;
        }
        if (x < 0 || TG_GROW(l.v, &l.cap, l.n + 1)) {
            free(l.v);
            return x < 0 ? x : oom(g);
        }
        l.v[l.n++] = x;
    }
    return list(g, N_SEQ, &l, pos);
}

static int32_t alternation(struct gp *g)
{
    struct ids l = {0};
    size_t pos = g->i;
    for (;;) {
        int32_t x = sequence(g);
        if (x < 0 || TG_GROW(l.v, &l.cap, l.n + 1)) {
            free(l.v);
            return x < 0 ? x : oom(g);
        }
        l.v[l.n++] = x;
        ws(g);
        if (g->i >= g->n || g->s[g->i] != '|')
            break;
        g->i++;
    }
    return list(g, N_ALT, &l, pos);
}

static int parse(struct gp *g)
{
    ws(g);
    while (g->i < g->n && g->rc == 0) {
        size_t pos = g->i;
        while (g->i < g->n && name_char(g->s[g->i]))
            g->i++;
        if (g->i == pos)
            return gfail(g, TG_EFORMAT, pos, "expecting a rule name");
        int32_t r = rule_of(g, (const char *)g->s + pos, g->i - pos, pos);
        if (r < 0)
            return r;
        ws(g);
        if (g->i + 3 > g->n || memcmp(g->s + g->i, "::=", 3) != 0)
            return gfail(g, TG_EFORMAT, g->i,
                         "expecting ::= after the rule name");
        g->i += 3;
        if (g->rule[r].body >= 0)
            return gfail(g, TG_EINVAL, pos, "rule %.*s is defined twice",
                         (int)g->rule[r].len, g->rule[r].name);
        int32_t body = alternation(g);
        if (body < 0)
            return body;
        g->rule[r].body = body;
        g->rule[r].def_pos = pos;
        ws(g);
        if (g->i < g->n && g->s[g->i] == ')')
            return gfail(g, TG_EFORMAT, g->i, "unmatched )");
    }
    return g->rc;
}

/* ---- checks ------------------------------------------------------------------ */

static int nullable(const struct gp *g, int32_t x)
{
    const struct node *e = &g->node[x];
    switch (e->kind) {
    case N_EMPTY: return 1;
    case N_LIT: return e->n == 0;
    case N_SET: return 0;
    case N_SEQ:
        for (int32_t i = 0; i < e->n; i++)
            if (!nullable(g, g->kid[e->a + i]))
                return 0;
        return 1;
    case N_ALT:
        for (int32_t i = 0; i < e->n; i++)
            if (nullable(g, g->kid[e->a + i]))
                return 1;
        return 0;
    case N_REP: return e->min == 0 || nullable(g, e->a);
    default: return g->rule[e->a].nullable;
    }
}

/* Calls the rules x may enter before reading a character. */
static void first_calls(const struct gp *g, int32_t x,
                        void (*f)(void *, int32_t), void *ctx)
{
    const struct node *e = &g->node[x];
    switch (e->kind) {
    case N_SEQ:
        for (int32_t i = 0; i < e->n; i++) {
            first_calls(g, g->kid[e->a + i], f, ctx);
            if (!nullable(g, g->kid[e->a + i]))
                break;
        }
        break;
    case N_ALT:
        for (int32_t i = 0; i < e->n; i++)
            first_calls(g, g->kid[e->a + i], f, ctx);
        break;
    case N_REP:
        if (e->max > 0)
            first_calls(g, e->a, f, ctx);
        break;
    case N_REF: f(ctx, e->a); break;
    default: break;
    }
}

struct edges {
    int32_t *v;
    size_t n, cap;
    int err;
};

static void add_edge(void *ctx, int32_t r)
{
    struct edges *e = ctx;
    if (TG_GROW(e->v, &e->cap, e->n + 1)) {
        e->err = 1;
        return;
    }
    e->v[e->n++] = r;
}

/* Refuses left recursion naming the cycle (the automaton compiler would
 * refuse it too, without the cycle). */
static int check_left(struct gp *g)
{
    size_t nr = g->n_rule;
    /* nullability: a fixed point over the rules */
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t r = 0; r < nr; r++)
            if (!g->rule[r].nullable && nullable(g, g->rule[r].body)) {
                g->rule[r].nullable = 1;
                changed = 1;
            }
    }
    /* the left-call graph in CSR */
    size_t *off = calloc(nr + 1, sizeof(*off));
    struct edges all = {0};
    if (off == NULL)
        return oom(g);
    for (size_t r = 0; r < nr && !all.err; r++) {
        off[r] = all.n;
        first_calls(g, g->rule[r].body, add_edge, &all);
    }
    off[nr] = all.n;
    int32_t *stk = malloc((2 * nr + 2) * sizeof(*stk));
    if (all.err || stk == NULL) {
        free(off);
        free(all.v);
        free(stk);
        return oom(g);
    }
    int rc = 0;
    for (size_t r0 = 0; r0 < nr && rc == 0; r0++) {
        if (g->rule[r0].mark != 0)
            continue;
        size_t sp = 0;
        stk[sp++] = (int32_t)r0;
        stk[sp++] = 0;
        g->rule[r0].mark = 1;
        while (sp > 0 && rc == 0) {
            int32_t r = stk[sp - 2];
            size_t i = off[r] + (size_t)stk[sp - 1]++;
            if (i >= off[r + 1]) {
                g->rule[r].mark = 2;
                sp -= 2;
                continue;
            }
            int32_t c = all.v[i];
            if (g->rule[c].mark == 0) {
                g->rule[c].mark = 1;
                stk[sp++] = c;
                stk[sp++] = 0;
            } else if (g->rule[c].mark == 1) {
                /* the cycle: from c's entry on the stack to the top */
                char path[160];
                size_t k = 0, at = 0;
                while (stk[at] != c)
                    at += 2;
                for (size_t j = at; j < sp && k < sizeof path - 8; j += 2) {
                    const struct rule *x = &g->rule[stk[j]];
                    k += (size_t)snprintf(path + k, sizeof path - k, "%.*s -> ",
                                          (int)(x->len > 40 ? 40 : x->len),
                                          x->name);
                }
                if (k < sizeof path)
                    snprintf(path + k, sizeof path - k, "%.*s",
                             (int)(g->rule[c].len > 40 ? 40 : g->rule[c].len),
                             g->rule[c].name);
                rc = gfail(g, TG_EINVAL, g->rule[c].def_pos,
                           "rule %.*s is left-recursive (%s reads no "
                           "character before it recurses; write the "
                           "repetition with * or +)",
                           (int)(g->rule[c].len > 40 ? 40 : g->rule[c].len),
                           g->rule[c].name, path);
            }
        }
    }
    free(off);
    free(all.v);
    free(stk);
    return rc;
}

/* ---- IR ---------------------------------------------------------------------- */

static int32_t emit(struct gp *g, int32_t x)
{
    struct gm_ir *ir = g->ir;
    const struct node *e = &g->node[x];
    switch (e->kind) {
    case N_EMPTY: return gm_ir_empty(ir);
    case N_LIT: /* "" before any other literal: lit is still NULL */
        return gm_ir_bytes(ir, e->n > 0 ? g->lit + e->a : (const uint8_t *)"",
                           (size_t)e->n);
    case N_SET: return gm__rx_set_expr(ir, &g->set[e->a], GM_RX_RAW);
    case N_SEQ:
    case N_ALT: {
        int32_t *v = malloc((size_t)e->n * sizeof(*v));
        if (v == NULL)
            return gm_ir_fail(ir, TG_ENOMEM, "grammar IR: out of memory");
        int32_t r = 0;
        for (int32_t i = 0; i < e->n && r >= 0; i++)
            r = v[i] = emit(g, g->kid[e->a + i]);
        if (r >= 0)
            r = e->kind == N_SEQ ? gm_ir_seq(ir, v, (size_t)e->n)
                                 : gm_ir_alt(ir, v, (size_t)e->n);
        free(v);
        return r;
    }
    case N_REP: return gm_ir_repeat(ir, emit(g, e->a), e->min, e->max);
    default: return gm_ir_ref(ir, g->rule[e->a].ir);
    }
}

int32_t gm_gbnf_compile(struct gm_ir *ir, const char *text, size_t len,
                        char *err, size_t errlen)
{
    if (ir->err != 0)
        return gm_ir_error(ir, err, errlen);
    char msg[300] = "";
    struct gp g = {.s = (const unsigned char *)text,
                   .n = len,
                   .ir = ir,
                   .err = msg,
                   .errlen = sizeof msg};
    if (gm__kset_init(&g.names) != 0)
        oom(&g);
    else
        parse(&g);
    int32_t root = -1;
    for (size_t r = 0; r < g.n_rule && g.rc == 0; r++) {
        if (g.rule[r].body < 0)
            gfail(&g, TG_EINVAL, g.rule[r].use_pos,
                  "rule %.*s is used but never defined",
                  (int)(g.rule[r].len > 60 ? 60 : g.rule[r].len),
                  g.rule[r].name);
        if (g.rule[r].len == 4 && memcmp(g.rule[r].name, "root", 4) == 0)
            root = (int32_t)r;
    }
    if (g.rc == 0 && root < 0)
        gfail(&g, TG_EINVAL, (size_t)-1, "no rule named root (the start)");
    if (g.rc == 0)
        check_left(&g);
    for (size_t r = 0; r < g.n_rule && g.rc == 0; r++) {
        char name[128];
        snprintf(name, sizeof name, "%.*s",
                 (int)(g.rule[r].len > 100 ? 100 : g.rule[r].len),
                 g.rule[r].name);
        g.rule[r].ir = gm_ir_rule(ir, name);
    }
    for (size_t r = 0; r < g.n_rule && g.rc == 0 && ir->err == 0; r++) {
        if (gm_ir_late(ir))
            break;
        gm_ir_rule_define(ir, g.rule[r].ir, emit(&g, g.rule[r].body));
    }
    int32_t result;
    if (g.rc != 0) {
        gm_ir_fail(ir, g.rc, "%s", msg);
        result = tg_err_set(err, errlen, g.rc, "%s", msg);
    } else if (ir->err != 0) {
        result = gm_ir_error(ir, err, errlen);
    } else {
        result = g.rule[root].ir;
    }
    for (size_t i = 0; i < g.n_set; i++)
        gm__cset_free(&g.set[i]);
    free(g.set);
    free(g.node);
    free(g.kid);
    free(g.lit);
    free(g.rule);
    gm__kset_free(&g.names);
    return result;
}
