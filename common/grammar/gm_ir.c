/* gm_ir.c — the grammar IR builder and printer (gm_ir.h). */
#include "common/grammar/gm_ir.h"
#include "common/grammar/gm_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_err.h"

void gm_ir_init(struct gm_ir *ir, size_t max_exprs)
{
    memset(ir, 0, sizeof(*ir));
    ir->root = -1;
    ir->max_exprs = max_exprs;
}

void gm_ir_set_deadline(struct gm_ir *ir, double deadline)
{
    ir->deadline = deadline > 0 ? deadline : 0;
}

int gm_ir_late(struct gm_ir *ir)
{
    if (ir->err == TG_ETIMEDOUT)
        return 1;
    if (ir->deadline <= 0 || gm__now() <= ir->deadline)
        return 0;
    gm_ir_fail(ir, TG_ETIMEDOUT,
               "grammar compile took longer than its time limit");
    return 1;
}

void gm_ir_free(struct gm_ir *ir)
{
    for (size_t i = 0; i < ir->n_rule; i++)
        free(ir->rule[i].name);
    free(ir->rule);
    free(ir->expr);
    free(ir->items);
    free(ir->bytes);
    free(ir->cls);
    memset(ir, 0, sizeof(*ir));
    ir->root = -1;
}

int gm_ir_error(const struct gm_ir *ir, char *err, size_t errlen)
{
    if (ir->err != 0 && err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", ir->errmsg);
    return ir->err;
}

int gm_ir_fail(struct gm_ir *ir, int code, const char *fmt, ...)
{
    if (ir->err == 0) {
        ir->err = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ir->errmsg, sizeof ir->errmsg, fmt, ap);
        va_end(ap);
    }
    return ir->err;
}

static int32_t oom(struct gm_ir *ir)
{
    return gm_ir_fail(ir, TG_ENOMEM, "grammar IR: out of memory");
}

/* Appends one expression; checks the size limit. */
static int32_t push(struct gm_ir *ir, const struct gm_expr *e, size_t extra)
{
    if (ir->err != 0)
        return ir->err;
    if (ir->max_exprs != 0 &&
        ir->n_expr + ir->n_items + extra + 1 > ir->max_exprs)
        return gm_ir_fail(ir, TG_ETOOBIG,
                          "grammar has more than %zu expressions",
                          ir->max_exprs);
    if (ir->n_expr >= INT32_MAX - 1)
        return gm_ir_fail(ir, TG_ETOOBIG, "grammar too large");
    if ((ir->n_expr & 1023) == 1023 && gm_ir_late(ir))
        return ir->err;
    if (tg_grow((void **)&ir->expr, &ir->cap_expr, ir->n_expr + 1,
                sizeof(*ir->expr)))
        return oom(ir);
    ir->expr[ir->n_expr] = *e;
    return (int32_t)ir->n_expr++;
}

int32_t gm_ir_rule(struct gm_ir *ir, const char *name)
{
    if (ir->err != 0)
        return ir->err;
    if (ir->n_rule >= INT32_MAX - 1)
        return gm_ir_fail(ir, TG_ETOOBIG, "too many rules");
    if (tg_grow((void **)&ir->rule, &ir->cap_rule, ir->n_rule + 1,
                sizeof(*ir->rule)))
        return oom(ir);
    char *nm = strdup(name != NULL ? name : "rule");
    if (nm == NULL)
        return oom(ir);
    ir->rule[ir->n_rule].name = nm;
    ir->rule[ir->n_rule].body = -1;
    return (int32_t)ir->n_rule++;
}

static int bad_expr(struct gm_ir *ir, int32_t e)
{
    if (e < 0)
        return ir->err != 0 ? ir->err : e;
    if ((size_t)e >= ir->n_expr)
        return gm_ir_fail(ir, TG_EINVAL, "grammar IR: no expression %d",
                          (int)e);
    return 0;
}

int gm_ir_rule_define(struct gm_ir *ir, int32_t rule, int32_t body)
{
    int rc = bad_expr(ir, body);
    if (rc != 0)
        return rc;
    if (rule < 0)
        return ir->err != 0 ? ir->err : rule;
    if ((size_t)rule >= ir->n_rule)
        return gm_ir_fail(ir, TG_EINVAL, "grammar IR: no rule %d",
                          (int)rule);
    if (ir->rule[rule].body >= 0)
        return gm_ir_fail(ir, TG_EINVAL, "grammar IR: rule %s defined twice",
                          ir->rule[rule].name);
    ir->rule[rule].body = body;
    return ir->err;
}

int gm_ir_root_set(struct gm_ir *ir, int32_t rule)
{
    if (ir->err != 0)
        return ir->err;
    if (rule < 0 || (size_t)rule >= ir->n_rule)
        return gm_ir_fail(ir, TG_EINVAL, "grammar IR: no start rule");
    for (size_t i = 0; i < ir->n_rule; i++)
        if (ir->rule[i].body < 0)
            return gm_ir_fail(ir, TG_EINVAL,
                              "grammar IR: rule %s is never defined",
                              ir->rule[i].name);
    for (size_t i = 0; i < ir->n_expr; i++)
        if (ir->expr[i].kind == GM_EXPR_REF && ir->expr[i].off >= ir->n_rule)
            return gm_ir_fail(ir, TG_EINVAL, "grammar IR: bad rule id");
    ir->root = rule;
    return 0;
}

int32_t gm_ir_empty(struct gm_ir *ir)
{
    struct gm_expr e = {.kind = GM_EXPR_EMPTY};
    return push(ir, &e, 0);
}

int32_t gm_ir_bytes(struct gm_ir *ir, const void *s, size_t n)
{
    if (ir->err != 0)
        return ir->err;
    if (n == 0)
        return gm_ir_empty(ir);
    if (n > UINT32_MAX / 2 || ir->n_bytes + n > UINT32_MAX / 2)
        return gm_ir_fail(ir, TG_ETOOBIG, "grammar literal too large");
    if (tg_grow((void **)&ir->bytes, &ir->cap_bytes, ir->n_bytes + n, 1))
        return oom(ir);
    struct gm_expr e = {.kind = GM_EXPR_BYTES,
                        .off = (uint32_t)ir->n_bytes,
                        .n = (uint32_t)n};
    int32_t id = push(ir, &e, n / 8);
    if (id < 0)
        return id;
    memcpy(ir->bytes + ir->n_bytes, s, n);
    ir->n_bytes += n;
    return id;
}

int32_t gm_ir_str(struct gm_ir *ir, const char *s)
{
    return gm_ir_bytes(ir, s, strlen(s));
}

int32_t gm_ir_class(struct gm_ir *ir, const uint8_t set[32])
{
    if (ir->err != 0)
        return ir->err;
    if (tg_grow((void **)&ir->cls, &ir->cap_cls, ir->n_cls + 1,
                sizeof(*ir->cls)))
        return oom(ir);
    struct gm_expr e = {.kind = GM_EXPR_CLASS, .off = (uint32_t)ir->n_cls};
    int32_t id = push(ir, &e, 0);
    if (id < 0)
        return id;
    memcpy(ir->cls[ir->n_cls++], set, 32);
    return id;
}

int32_t gm_ir_range(struct gm_ir *ir, unsigned lo, unsigned hi)
{
    uint8_t set[32] = {0};
    for (unsigned b = lo; b <= hi && b < 256; b++)
        set[b >> 3] |= (uint8_t)(1u << (b & 7));
    return gm_ir_class(ir, set);
}

int32_t gm_ir_chars(struct gm_ir *ir, const char *chars)
{
    uint8_t set[32] = {0};
    for (const unsigned char *p = (const unsigned char *)chars; *p; p++)
        set[*p >> 3] |= (uint8_t)(1u << (*p & 7));
    return gm_ir_class(ir, set);
}

static int32_t list(struct gm_ir *ir, uint8_t kind, const int32_t *items,
                    size_t n)
{
    if (ir->err != 0)
        return ir->err;
    for (size_t i = 0; i < n; i++) {
        int rc = bad_expr(ir, items[i]);
        if (rc != 0)
            return rc;
    }
    if (n == 0 && kind == GM_EXPR_SEQ)
        return gm_ir_empty(ir);
    if (n == 1)
        return items[0];
    if (n > UINT32_MAX / 2 || ir->n_items + n > INT32_MAX)
        return gm_ir_fail(ir, TG_ETOOBIG, "grammar too large");
    if (tg_grow((void **)&ir->items, &ir->cap_items, ir->n_items + n,
                sizeof(*ir->items)))
        return oom(ir);
    struct gm_expr e = {.kind = kind,
                        .off = (uint32_t)ir->n_items,
                        .n = (uint32_t)n};
    int32_t id = push(ir, &e, n);
    if (id < 0)
        return id;
    if (n > 0)
        memcpy(ir->items + ir->n_items, items, n * sizeof(*items));
    ir->n_items += n;
    return id;
}

int32_t gm_ir_seq(struct gm_ir *ir, const int32_t *items, size_t n)
{
    return list(ir, GM_EXPR_SEQ, items, n);
}

int32_t gm_ir_alt(struct gm_ir *ir, const int32_t *items, size_t n)
{
    return list(ir, GM_EXPR_ALT, items, n);
}

int32_t gm_ir_seq2(struct gm_ir *ir, int32_t a, int32_t b)
{
    int32_t v[2] = {a, b};
    return gm_ir_seq(ir, v, 2);
}

int32_t gm_ir_alt2(struct gm_ir *ir, int32_t a, int32_t b)
{
    int32_t v[2] = {a, b};
    return gm_ir_alt(ir, v, 2);
}

int32_t gm_ir_repeat(struct gm_ir *ir, int32_t sub, uint32_t min,
                     uint32_t max)
{
    int rc = bad_expr(ir, sub);
    if (rc != 0)
        return rc;
    if (min > GM_REPEAT_MAX || (max != GM_REPEAT_INF && max > GM_REPEAT_MAX))
        return gm_ir_fail(ir, TG_ERANGE,
                          "repetition count over the limit %u",
                          GM_REPEAT_MAX);
    if (min > max)
        return gm_ir_fail(ir, TG_ERANGE,
                          "repetition with min %u > max %u", min, max);
    if (min == 1 && max == 1)
        return sub;
    if (max == 0)
        return gm_ir_empty(ir);
    struct gm_expr e = {
        .kind = GM_EXPR_REPEAT, .sub = sub, .min = min, .max = max};
    return push(ir, &e, 0);
}

int32_t gm_ir_opt(struct gm_ir *ir, int32_t sub)
{
    return gm_ir_repeat(ir, sub, 0, 1);
}

int32_t gm_ir_ref(struct gm_ir *ir, int32_t rule)
{
    if (rule < 0)
        return ir->err != 0 ? ir->err : rule;
    if ((size_t)rule >= ir->n_rule)
        return gm_ir_fail(ir, TG_EINVAL, "grammar IR: no rule %d",
                          (int)rule);
    struct gm_expr e = {.kind = GM_EXPR_REF, .off = (uint32_t)rule};
    return push(ir, &e, 0);
}

/* ---- literal tries ------------------------------------------------------ */

struct lits {
    struct gm_ir *ir;
    const char *const *s;
    const size_t *len;
    const int32_t *cont;
    size_t *ix; /* literal indices, sorted by bytes */
};

/* qsort has no context argument: the comparator reads this. */
static _Thread_local const struct lits *sort_l;

static int by_bytes(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    const struct lits *l = sort_l;
    size_t n = l->len[x] < l->len[y] ? l->len[x] : l->len[y];
    int c = n > 0 ? memcmp(l->s[x], l->s[y], n) : 0;
    if (c != 0)
        return c;
    if (l->len[x] != l->len[y])
        return l->len[x] < l->len[y] ? -1 : 1;
    return x < y ? -1 : x > y; /* a repeat after its first */
}

/* The trie of the sorted literals ix[lo..hi), which share their first d
 * bytes: the rest of their common prefix, then one branch per next byte
 * (or the continuation of the one that ends there). */
static int32_t lit_trie(struct lits *l, size_t lo, size_t hi, size_t d,
                        int depth)
{
    struct gm_ir *ir = l->ir;
    if (depth > 4096)
        return gm_ir_fail(ir, TG_ETOOBIG,
                          "alternative literals nested too deeply");
    const char *s0 = l->s[l->ix[lo]];
    size_t e = d;
    while (e < l->len[l->ix[lo]]) {
        size_t k = lo + 1;
        while (k < hi && l->len[l->ix[k]] > e && l->s[l->ix[k]][e] == s0[e])
            k++;
        if (k < hi)
            break;
        e++;
    }
    int32_t pre = gm_ir_bytes(ir, s0 + d, e - d);
    size_t n_alt = 0, cap = 8;
    int32_t *alt = malloc(cap * sizeof(*alt));
    if (alt == NULL)
        return gm_ir_fail(ir, TG_ENOMEM, "grammar IR: out of memory");
    size_t k = lo;
    if (l->len[l->ix[k]] == e) { /* ends here (its repeats too) */
        int32_t c = l->cont != NULL ? l->cont[l->ix[k]] : gm_ir_empty(ir);
        alt[n_alt++] = c;
        while (k < hi && l->len[l->ix[k]] == e)
            k++;
    }
    while (k < hi && ir->err == 0) {
        uint8_t c = (uint8_t)l->s[l->ix[k]][e];
        size_t j = k;
        while (j < hi && (uint8_t)l->s[l->ix[j]][e] == c)
            j++;
        if (TG_GROW(alt, &cap, n_alt + 1)) {
            free(alt);
            return gm_ir_fail(ir, TG_ENOMEM, "grammar IR: out of memory");
        }
        alt[n_alt++] = lit_trie(l, k, j, e, depth + 1);
        k = j;
    }
    int32_t r = gm_ir_seq2(ir, pre, gm_ir_alt(ir, alt, n_alt));
    free(alt);
    return r;
}

int32_t gm_ir_literals(struct gm_ir *ir, const char *const *s,
                       const size_t *len, const int32_t *cont, size_t n)
{
    if (ir->err != 0)
        return ir->err;
    for (size_t i = 0; cont != NULL && i < n; i++) {
        int rc = bad_expr(ir, cont[i]);
        if (rc != 0)
            return rc;
    }
    if (n == 0)
        return gm_ir_alt(ir, NULL, 0);
    struct lits l = {.ir = ir, .s = s, .len = len, .cont = cont};
    l.ix = malloc(n * sizeof(*l.ix));
    if (l.ix == NULL)
        return gm_ir_fail(ir, TG_ENOMEM, "grammar IR: out of memory");
    for (size_t i = 0; i < n; i++)
        l.ix[i] = i;
    sort_l = &l;
    qsort(l.ix, n, sizeof(*l.ix), by_bytes);
    sort_l = NULL;
    int32_t r = lit_trie(&l, 0, n, 0, 0);
    free(l.ix);
    return r;
}

/* ---- printing ---------------------------------------------------------- */

/* One byte inside "..." or [...]: printable ASCII as itself (with the
 * notation's own characters escaped), anything else as \xHH. */
static void put_byte(struct tg_buf *b, unsigned c, int in_class)
{
    if (c == '\n')
        tg_buf_puts(b, "\\n");
    else if (c == '\t')
        tg_buf_puts(b, "\\t");
    else if (c == '\r')
        tg_buf_puts(b, "\\r");
    else if (c == '\\' || (!in_class && c == '"') ||
             (in_class && (c == ']' || c == '-' || c == '^'))) {
        tg_buf_putc(b, '\\');
        tg_buf_putc(b, (char)c);
    } else if (c >= 0x20 && c < 0x7f)
        tg_buf_putc(b, (char)c);
    else
        tg_buf_printf(b, "\\x%02X", c);
}

static int has(const uint8_t *set, unsigned c)
{
    return (set[c >> 3] >> (c & 7)) & 1;
}

static void put_expr(struct tg_buf *b, const struct gm_ir *ir, int32_t id,
                     int depth);

static void put_list(struct tg_buf *b, const struct gm_ir *ir,
                     const struct gm_expr *e, int depth, const char *sep)
{
    tg_buf_puts(b, "( ");
    for (uint32_t i = 0; i < e->n; i++) {
        if (i > 0)
            tg_buf_append(b, sep, strlen(sep));
        put_expr(b, ir, ir->items[e->off + i], depth + 1);
    }
    tg_buf_puts(b, " )");
}

static void put_expr(struct tg_buf *b, const struct gm_ir *ir, int32_t id,
                     int depth)
{
    const struct gm_expr *e = &ir->expr[id];
    if (depth > 64) {
        tg_buf_puts(b, "...");
        return;
    }
    switch (e->kind) {
    case GM_EXPR_EMPTY: tg_buf_puts(b, "\"\""); break;
    case GM_EXPR_BYTES:
        tg_buf_putc(b, '"');
        for (uint32_t i = 0; i < e->n; i++)
            put_byte(b, ir->bytes[e->off + i], 0);
        tg_buf_putc(b, '"');
        break;
    case GM_EXPR_CLASS: {
        const uint8_t *set = ir->cls[e->off];
        tg_buf_puts(b, "[");
        for (unsigned c = 0; c < 256;) {
            if (!has(set, c)) {
                c++;
                continue;
            }
            unsigned d = c;
            while (d + 1 < 256 && has(set, d + 1))
                d++;
            put_byte(b, c, 1);
            if (d > c + 1)
                tg_buf_puts(b, "-");
            if (d > c)
                put_byte(b, d, 1);
            c = d + 1;
        }
        tg_buf_puts(b, "]");
        break;
    }
    case GM_EXPR_SEQ:
        put_list(b, ir, e, depth, " ");
        break;
    case GM_EXPR_ALT:
        if (e->n == 0)
            tg_buf_puts(b, "[]");
        else
            put_list(b, ir, e, depth, " | ");
        break;
    case GM_EXPR_REPEAT:
        tg_buf_puts(b, "( ");
        put_expr(b, ir, e->sub, depth + 1);
        tg_buf_puts(b, " )");
        if (e->max == GM_REPEAT_INF)
            tg_buf_printf(b, "{%u,}", e->min);
        else
            tg_buf_printf(b, "{%u,%u}", e->min, e->max);
        break;
    case GM_EXPR_REF:
        tg_buf_append(b, ir->rule[e->off].name, strlen(ir->rule[e->off].name));
        break;
    }
}

static void put_rule(struct tg_buf *b, const struct gm_ir *ir, size_t r)
{
    const char *nm = ir->rule[r].name;
    tg_buf_append(b, nm, strlen(nm));
    tg_buf_puts(b, " ::= ");
    if (ir->rule[r].body >= 0)
        put_expr(b, ir, ir->rule[r].body, 0);
    tg_buf_puts(b, "\n");
}

int gm_ir_format(const struct gm_ir *ir, char **out, size_t *len)
{
    struct tg_buf b = {0};
    if (ir->root >= 0)
        put_rule(&b, ir, (size_t)ir->root);
    for (size_t r = 0; r < ir->n_rule; r++)
        if ((int32_t)r != ir->root)
            put_rule(&b, ir, r);
    *out = tg_buf_steal(&b, len);
    return *out != NULL ? 0 : TG_ENOMEM;
}
