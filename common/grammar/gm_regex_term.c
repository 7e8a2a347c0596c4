/* gm_regex_term.c — regular expressions with intersection, complement and
 * zero-width assertions as hash-consed terms, normalised by the
 * similarity rules of Owens, Reppy and Turon (2009) so that a pattern has
 * finitely many derivatives; the derivatives themselves; a pattern's tree
 * turned into a term, lookaheads included (gm_regex_internal.h). */
#include "common/grammar/gm_regex_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

#define LOOK_UNROLL_MAX 16 /* bounded repetitions holding a lookahead */
#define DERIV_DEPTH_MAX 20000

/* Nullability masks of the assertions (bit p * 3 + q). */
#define NULL_BOL 0x007u /* p = start */
#define NULL_EOL 0x049u /* q = end */
#define NULL_WB 0x0AAu  /* word(p) != word(q) */

static int32_t rfail(struct gm__rx *rx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int32_t rfail(struct gm__rx *rx, int code, const char *fmt, ...)
{
    if (rx->err == 0) {
        rx->err = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rx->errmsg, sizeof rx->errmsg, fmt, ap);
        va_end(ap);
    }
    return rx->err;
}

static int32_t roomfail(struct gm__rx *rx)
{
    return rfail(rx, TG_ENOMEM, "out of memory");
}

/* The term (kind, a, b), made once. */
static int32_t mk(struct gm__rx *rx, uint8_t kind, int32_t a, int32_t b,
                  uint16_t null)
{
    if (rx->err != 0)
        return rx->err;
    int32_t v;
    int rc = gm__kset_put(&rx->cons, kind, a, b, (int32_t)rx->n_t, &v);
    if (rc < 0)
        return roomfail(rx);
    if (rc == 0)
        return v;
    if (TG_GROW(rx->t, &rx->cap_t, rx->n_t + 1))
        return roomfail(rx);
    rx->t[rx->n_t] = (struct gm__rxt){
        .kind = kind, .null = (uint16_t)(null & GM__NULL_ALL), .a = a, .b = b};
    return (int32_t)rx->n_t++;
}

static uint64_t set_hash(const struct gm__cset *s, uint64_t h)
{
    for (size_t i = 0; i < s->n; i++) {
        h = (h ^ s->r[i][0]) * 0x100000001B3ull;
        h = (h ^ s->r[i][1]) * 0x100000001B3ull;
    }
    return h;
}

static int same_set(const struct gm__cset *a, const struct gm__cset *b)
{
    return a->n == b->n &&
           (a->n == 0 || memcmp(a->r, b->r, a->n * sizeof(*a->r)) == 0);
}

/* The index of a set equal to *s ∩ alpha (s is consumed: freed or kept). */
static int32_t intern_set(struct gm__rx *rx, struct gm__cset *s)
{
    gm__cset_norm(s);
    if (rx->alpha.n > 0 && gm__cset_and(s, &rx->alpha) != 0) {
        gm__cset_free(s);
        return roomfail(rx);
    }
    uint64_t h = set_hash(s, 1469598103934665603ull);
    int32_t v;
    int rc = gm__kset_put(&rx->setk, (int32_t)h, (int32_t)(h >> 32),
                          (int32_t)s->n, (int32_t)rx->n_set, &v);
    if (rc < 0) {
        gm__cset_free(s);
        return roomfail(rx);
    }
    if (rc == 0 && same_set(&rx->set[v], s)) {
        gm__cset_free(s);
        return v;
    }
    /* new, or a hash collision (kept apart: only sharing is lost) */
    if (TG_GROW(rx->set, &rx->cap_set, rx->n_set + 1)) {
        gm__cset_free(s);
        return roomfail(rx);
    }
    rx->set[rx->n_set] = *s;
    memset(s, 0, sizeof(*s));
    return (int32_t)rx->n_set++;
}

static int32_t term_set(struct gm__rx *rx, int32_t set)
{
    if (set < 0)
        return set;
    if (rx->set[set].n == 0)
        return 0; /* NONE */
    return mk(rx, GM__RXT_SET, set, 0, 0);
}

/* ---- constructors ------------------------------------------------------ */

static int32_t cat(struct gm__rx *rx, int32_t a, int32_t b)
{
    if (a < 0 || b < 0)
        return rx->err != 0 ? rx->err : (a < 0 ? a : b);
    if (a == 0 || b == 0)
        return 0;
    if (a == 1)
        return b;
    if (b == 1)
        return a;
    if (rx->t[a].kind == GM__RXT_CAT) {
        int32_t x = rx->t[a].a, y = rx->t[a].b;
        return cat(rx, x, cat(rx, y, b));
    }
    return mk(rx, GM__RXT_CAT, a, b, rx->t[a].null & rx->t[b].null);
}

/* Scratch stack of term ids (nested users pop back to their base). */
static int push(struct gm__rx *rx, int32_t **v, size_t *n, size_t *cap,
                int32_t x)
{
    (void)rx;
    if (TG_GROW(*v, cap, *n + 1))
        return TG_ENOMEM;
    (*v)[(*n)++] = x;
    return 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* OR (kind GM__RXT_OR) or AND of ops[0..n), each possibly a chain of its
 * kind: flattened, sorted, duplicates dropped, identities removed, then
 * rebuilt as a right-nested chain. */
static int32_t combine(struct gm__rx *rx, uint8_t kind, const int32_t *ops,
                       size_t n)
{
    int32_t *v = NULL;
    size_t nv = 0, cap = 0;
    int32_t unit = kind == GM__RXT_OR ? 0 : rx->top;   /* identity */
    int32_t absorb = kind == GM__RXT_OR ? rx->top : 0; /* annihilator */
    for (size_t i = 0; i < n; i++) {
        int32_t x = ops[i];
        if (x < 0) {
            free(v);
            return rx->err != 0 ? rx->err : x;
        }
        while (x >= 0) {
            int32_t item = x;
            x = -1;
            if (rx->t[item].kind == kind) {
                x = rx->t[item].b;
                item = rx->t[item].a;
            }
            if (item == absorb) {
                free(v);
                return absorb;
            }
            if (item != unit && push(rx, &v, &nv, &cap, item) != 0) {
                free(v);
                return roomfail(rx);
            }
        }
    }
    if (nv == 0) {
        free(v);
        return unit;
    }
    qsort(v, nv, sizeof(*v), cmp_i32);
    size_t m = 1;
    for (size_t i = 1; i < nv; i++)
        if (v[i] != v[m - 1])
            v[m++] = v[i];
    int32_t r = v[m - 1];
    for (size_t i = m - 1; i-- > 0 && r >= 0;) {
        uint16_t nl = kind == GM__RXT_OR ? rx->t[v[i]].null | rx->t[r].null
                                         : rx->t[v[i]].null & rx->t[r].null;
        r = mk(rx, kind, v[i], r, nl);
    }
    free(v);
    return r;
}

static int32_t or2(struct gm__rx *rx, int32_t a, int32_t b)
{
    if (a == b || b == 0)
        return a;
    if (a == 0)
        return b;
    int32_t v[2] = {a, b};
    return combine(rx, GM__RXT_OR, v, 2);
}

int32_t gm__rx_and(struct gm__rx *rx, int32_t a, int32_t b)
{
    if (a == b)
        return a;
    int32_t v[2] = {a, b};
    return combine(rx, GM__RXT_AND, v, 2);
}

int32_t gm__rx_not(struct gm__rx *rx, int32_t a)
{
    if (a < 0)
        return a;
    if (a == 0)
        return rx->top;
    if (a == rx->top)
        return 0;
    if (rx->t[a].kind == GM__RXT_NOT)
        return rx->t[a].a;
    return mk(rx, GM__RXT_NOT, a, 0, (uint16_t)(~rx->t[a].null));
}

static int32_t rep(struct gm__rx *rx, int32_t a, uint32_t m, uint32_t mx)
{
    if (a < 0)
        return a;
    if (mx == 0 || a == 1)
        return 1;
    if (a == 0)
        return m == 0 ? 1 : 0;
    if (m == 1 && mx == 1)
        return a;
    if (rx->t[a].null == GM__NULL_ALL)
        m = 0; /* an empty iteration matches anywhere: min is moot */
    if (rx->t[a].kind == GM__RXT_REP) {
        const uint32_t *b = rx->rp[rx->t[a].b];
        if (b[0] == 0 && b[1] == GM_REPEAT_INF)
            return a; /* (x*){m,M} = x* */
    }
    int32_t v;
    int rc = gm__kset_put(&rx->rpk, (int32_t)m, (int32_t)mx, 0,
                          (int32_t)rx->n_rp, &v);
    if (rc < 0)
        return roomfail(rx);
    if (rc == 1) {
        if (TG_GROW(rx->rp, &rx->cap_rp, rx->n_rp + 1))
            return roomfail(rx);
        rx->rp[rx->n_rp][0] = m;
        rx->rp[rx->n_rp][1] = mx;
        rx->n_rp++;
    }
    return mk(rx, GM__RXT_REP, a, v, m == 0 ? GM__NULL_ALL : rx->t[a].null);
}

int gm__rx_init(struct gm__rx *rx, int alpha_assigned, uint32_t max_states,
                double deadline)
{
    memset(rx, 0, sizeof(*rx));
    rx->max_states = max_states ? max_states : GM_REGEX_MAX_STATES;
    rx->deadline = deadline;
    if (gm__kset_init(&rx->cons) != 0 || gm__kset_init(&rx->setk) != 0 ||
        gm__kset_init(&rx->rpk) != 0 || gm__kset_init(&rx->memo) != 0)
        return TG_ENOMEM;
    int rc = alpha_assigned ? gm__cset_assigned(&rx->alpha)
                            : gm__cset_add(&rx->alpha, 0, GM__CP_MAX);
    struct gm__cset sur = {0};
    if (rc != 0 || gm__cset_add(&sur, 0xD800, 0xDFFF) != 0 ||
        gm__cset_invert(&sur) != 0 || gm__cset_and(&rx->alpha, &sur) != 0) {
        gm__cset_free(&sur);
        return TG_ENOMEM;
    }
    gm__cset_free(&sur);
    /* term 0: no string, 1: the empty string */
    if (mk(rx, GM__RXT_NONE, 0, 0, 0) != 0 ||
        mk(rx, GM__RXT_EPS, 0, 0, GM__NULL_ALL) != 1)
        return TG_ENOMEM;
    struct gm__cset all = {0};
    if (gm__cset_copy(&all, &rx->alpha) != 0)
        return TG_ENOMEM;
    rx->all = intern_set(rx, &all);
    int32_t any = term_set(rx, rx->all);
    rx->top = rep(rx, any, 0, GM_REPEAT_INF);
    return rx->top < 0 ? TG_ENOMEM : 0;
}

void gm__rx_free(struct gm__rx *rx)
{
    for (size_t i = 0; i < rx->n_set; i++)
        gm__cset_free(&rx->set[i]);
    free(rx->set);
    free(rx->t);
    free(rx->rp);
    gm__kset_free(&rx->cons);
    gm__kset_free(&rx->setk);
    gm__kset_free(&rx->rpk);
    gm__kset_free(&rx->memo);
    gm__cset_free(&rx->alpha);
    memset(rx, 0, sizeof(*rx));
}

/* ---- derivatives ---------------------------------------------------------- */

static int is_word(uint32_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
           (c >= 'a' && c <= 'z') || c == '_';
}

/* The derivative of t by code point c after context p. */
int32_t gm__rx_deriv(struct gm__rx *rx, int32_t t, int p, uint32_t c)
{
    if (t < 0 || rx->err != 0)
        return rx->err != 0 ? rx->err : t;
    const struct gm__rxt x = rx->t[t];
    switch (x.kind) {
    case GM__RXT_NONE:
    case GM__RXT_EPS:
    case GM__RXT_BOL:
    case GM__RXT_EOL:
    case GM__RXT_WB:
    case GM__RXT_NWB: return 0;
    case GM__RXT_SET: return gm__cset_has(&rx->set[x.a], c) ? 1 : 0;
    default: break;
    }
    int32_t got;
    int rc = gm__kset_put(&rx->memo, t, p, (int32_t)c, -1, &got);
    if (rc < 0)
        return roomfail(rx);
    if (rc == 0 && got >= 0)
        return got;
    if (++rx->depth > DERIV_DEPTH_MAX) {
        rx->depth--;
        return rfail(rx, TG_ETOOBIG,
                     "pattern nested too deeply to match (more than %d "
                     "levels)",
                     DERIV_DEPTH_MAX);
    }
    int bit = p * 3 + (is_word(c) ? GM__Q_WORD : GM__Q_OTHER);
    int32_t r = 0;
    switch (x.kind) {
    case GM__RXT_CAT:
        r = cat(rx, gm__rx_deriv(rx, x.a, p, c), x.b);
        if ((rx->t[x.a].null >> bit) & 1)
            r = or2(rx, r, gm__rx_deriv(rx, x.b, p, c));
        break;
    case GM__RXT_OR:
    case GM__RXT_AND: {
        int32_t *v = NULL;
        size_t nv = 0, cap = 0;
        for (int32_t y = t; y >= 0 && r >= 0;) {
            int32_t item = y;
            y = -1;
            if (rx->t[item].kind == x.kind) {
                y = rx->t[item].b;
                item = rx->t[item].a;
            }
            int32_t d = gm__rx_deriv(rx, item, p, c);
            if (d < 0 || push(rx, &v, &nv, &cap, d) != 0)
                r = d < 0 ? d : roomfail(rx);
        }
        if (r >= 0)
            r = combine(rx, x.kind, v, nv);
        free(v);
        break;
    }
    case GM__RXT_NOT: r = gm__rx_not(rx, gm__rx_deriv(rx, x.a, p, c)); break;
    case GM__RXT_REP: {
        uint32_t m = rx->rp[x.b][0], mx = rx->rp[x.b][1];
        uint32_t m1 = m > 0 ? m - 1 : 0;
        uint32_t mx1 = mx == GM_REPEAT_INF ? mx : mx - 1;
        r = cat(rx, gm__rx_deriv(rx, x.a, p, c), rep(rx, x.a, m1, mx1));
        /* an empty first iteration (possible here only through an
         * assertion) leaves the rest of the count to match c */
        if (m > 0 && ((rx->t[x.a].null >> bit) & 1))
            r = or2(rx, r, gm__rx_deriv(rx, rep(rx, x.a, m1, mx1), p, c));
        break;
    }
    default: break;
    }
    rx->depth--;
    if (r >= 0) {
        /* the key was added above (the table may have grown since) */
        uint32_t h = gm__key_hash(t, p, (int32_t)c) & rx->memo.mask;
        while (!(rx->memo.key[h][0] == t && rx->memo.key[h][1] == p &&
                 rx->memo.key[h][2] == (int32_t)c))
            h = (h + 1) & rx->memo.mask;
        rx->memo.key[h][3] = r;
    }
    return r;
}

/* ---- a pattern's tree as a term ---------------------------------------------- */

struct conv {
    struct gm__rx *rx;
    const struct gm__rx_pat *p;
    int32_t *set_of; /* pattern set -> interned set, -1 until used */
};

/* The strings that match node `n` followed by what continuation `k`
 * matches (k describes the rest of the input, to its end). A lookahead
 * constrains that rest: (?=A) k = (A·Σ*) ∩ k. */
static int32_t conv(struct conv *cv, int32_t n, int32_t k)
{
    struct gm__rx *rx = cv->rx;
    const struct gm__rxa *a = &cv->p->node[n];
    if (k < 0 || rx->err != 0)
        return rx->err != 0 ? rx->err : k;
    switch (a->kind) {
    case GM__RXA_EMPTY: return k;
    case GM__RXA_SET: {
        if (cv->set_of[a->a] < 0) {
            struct gm__cset s;
            if (gm__cset_copy(&s, &cv->p->set[a->a]) != 0)
                return roomfail(rx);
            cv->set_of[a->a] = intern_set(rx, &s);
        }
        return cat(rx, term_set(rx, cv->set_of[a->a]), k);
    }
    case GM__RXA_SEQ:
        for (int32_t i = a->n; i-- > 0 && k >= 0;)
            k = conv(cv, cv->p->kid[a->a + i], k);
        return k;
    case GM__RXA_ALT: {
        int32_t r = 0;
        for (int32_t i = 0; i < a->n && r >= 0; i++)
            r = or2(rx, r, conv(cv, cv->p->kid[a->a + i], k));
        return r;
    }
    case GM__RXA_REP: {
        if (!a->look)
            return cat(rx, rep(rx, conv(cv, a->a, 1), a->min, a->max), k);
        if (a->max == GM_REPEAT_INF || a->max > LOOK_UNROLL_MAX)
            return rfail(rx, TG_EUNSUPPORTED,
                         "a lookahead inside a repetition (unbounded or "
                         "above %d) at position %u is not supported",
                         LOOK_UNROLL_MAX, a->pos);
        /* u(j): j iterations done; then between min - j and max - j more,
         * then k */
        int32_t u = k;
        for (uint32_t j = a->max; j-- > 0 && u >= 0;) {
            int32_t more = conv(cv, a->a, u);
            u = j >= a->min ? or2(rx, k, more) : more;
        }
        return u;
    }
    case GM__RXA_BOL: return cat(rx, mk(rx, GM__RXT_BOL, 0, 0, NULL_BOL), k);
    case GM__RXA_EOL: return cat(rx, mk(rx, GM__RXT_EOL, 0, 0, NULL_EOL), k);
    case GM__RXA_WB: return cat(rx, mk(rx, GM__RXT_WB, 0, 0, NULL_WB), k);
    case GM__RXA_NWB:
        return cat(rx, mk(rx, GM__RXT_NWB, 0, 0, GM__NULL_ALL & ~NULL_WB), k);
    case GM__RXA_LOOK: {
        int32_t la = conv(cv, a->a, rx->top);
        if (a->neg)
            la = gm__rx_not(rx, la);
        return gm__rx_and(rx, la, k);
    }
    }
    return rfail(rx, TG_EINTERNAL, "bad pattern node");
}

int32_t gm__rx_pattern(struct gm__rx *rx, const struct gm__rx_pat *p, int kind)
{
    struct conv cv = {.rx = rx, .p = p};
    cv.set_of = malloc((p->n_set ? p->n_set : 1) * sizeof(*cv.set_of));
    if (cv.set_of == NULL)
        return roomfail(rx);
    for (size_t i = 0; i < p->n_set; i++)
        cv.set_of[i] = -1;
    if (p->uses_wb)
        rx->wb = 1;
    int32_t r;
    if (kind == GM_RX_FULL)
        r = conv(&cv, p->root, 1);
    else
        r = cat(rx, rx->top, conv(&cv, p->root, rx->top));
    free(cv.set_of);
    return r;
}

int32_t gm__rx_literal(struct gm__rx *rx, const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    int32_t *cps = malloc((len ? len : 1) * sizeof(*cps));
    size_t n = 0;
    if (cps == NULL)
        return roomfail(rx);
    for (size_t i = 0; i < len;) {
        uint32_t c;
        size_t k = gm__utf8_dec(u + i, len - i, &c);
        if (k == 0) {
            free(cps);
            return rfail(rx, TG_EFORMAT, "text is not UTF-8 (byte %zu)", i);
        }
        cps[n++] = (int32_t)c;
        i += k;
    }
    int32_t r = 1;
    for (size_t i = n; i-- > 0 && r >= 0;) {
        struct gm__cset one = {0};
        if (gm__cset_add(&one, (uint32_t)cps[i], (uint32_t)cps[i]) != 0) {
            r = roomfail(rx);
            break;
        }
        r = cat(rx, term_set(rx, intern_set(rx, &one)), r);
    }
    free(cps);
    return r;
}
