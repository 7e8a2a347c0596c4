/* gm_regex.c — patterns compiled into a DFA (gm_regex_term.c,
 * gm_regex_dfa.c), intersected with a length range, and written as
 * grammar IR in the JSON or raw encoding (gm_regex.h). */
#include "common/grammar/gm_regex.h"
#include "common/grammar/gm_regex_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

#define INLINE_DEPTH_MAX 256 /* states written inside one another */

void gm_rx_opts_default(struct gm_rx_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->max_len = GM_REPEAT_INF;
    o->enc = GM_RX_JSON;
}

/* "pattern \"...\": " naming item i of n for messages. */
static void item_name(const struct gm_rx_item *it, char *buf, size_t cap)
{
    if (it->name != NULL) {
        snprintf(buf, cap, "%s", it->name);
        return;
    }
    const char *what = it->kind == GM_RX_LITERAL ? "text" : "pattern";
    if (it->len > 60)
        snprintf(buf, cap, "%s \"%.60s...\"", what, it->text);
    else
        snprintf(buf, cap, "%s \"%.*s\"", what, (int)it->len, it->text);
}

int gm__rx_compile(const struct gm_rx_item *items, size_t n,
                   uint32_t max_states, double deadline, struct gm__rx_dfa *d,
                   char *err, size_t errlen)
{
    memset(d, 0, sizeof(*d));
    struct gm__rx_pat *pats = calloc(n ? n : 1, sizeof(*pats));
    if (pats == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    int rc = 0, props = 0;
    char name[96], msg[256];
    for (size_t i = 0; i < n && rc == 0; i++) {
        pats[i].root = -1;
        if (items[i].kind == GM_RX_LITERAL)
            continue;
        rc = gm__rx_parse(&pats[i], items[i].text, items[i].len, msg,
                          sizeof msg);
        if (rc != 0) {
            item_name(&items[i], name, sizeof name);
            tg_err_set(err, errlen, rc, "%s: %s", name, msg);
        }
        props |= pats[i].uses_prop;
    }
    struct gm__rx rx;
    if (rc == 0 && gm__rx_init(&rx, props, max_states, deadline) != 0) {
        gm__rx_free(&rx);
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    if (rc == 0) {
        int32_t t = rx.top;
        size_t bad = n;
        for (size_t i = 0; i < n && t >= 0; i++) {
            int32_t x = items[i].kind == GM_RX_LITERAL
                            ? gm__rx_literal(&rx, items[i].text, items[i].len)
                            : gm__rx_pattern(&rx, &pats[i], items[i].kind);
            if (x >= 0 && items[i].negate)
                x = gm__rx_not(&rx, x);
            t = x < 0 ? x : gm__rx_and(&rx, t, x);
            if (t < 0)
                bad = i;
        }
        if (t < 0) {
            if (bad < n) {
                item_name(&items[bad], name, sizeof name);
                rc = tg_err_set(err, errlen, rx.err ? rx.err : t, "%s: %s",
                                name, rx.errmsg);
            } else {
                rc = tg_err_set(err, errlen, rx.err ? rx.err : t, "%s",
                                rx.errmsg);
            }
        } else if ((rc = gm__rx_dfa_build(&rx, t, d)) != 0) {
            if (n == 1) {
                item_name(&items[0], name, sizeof name);
                tg_err_set(err, errlen, rc, "%s: %s", name, rx.errmsg);
            } else {
                tg_err_set(err, errlen, rc, "%s", rx.errmsg);
            }
        } else if (d->n == 0) {
            if (n == 1) {
                item_name(&items[0], name, sizeof name);
                rc = tg_err_set(err, errlen, TG_EINVAL, "no string matches %s",
                                name);
            } else {
                rc = tg_err_set(err, errlen, TG_EINVAL,
                                "no string satisfies the %zu patterns "
                                "together",
                                n);
            }
        }
        gm__rx_free(&rx);
    }
    for (size_t i = 0; i < n; i++)
        gm__rx_pat_free(&pats[i]);
    free(pats);
    if (rc != 0)
        gm__rx_dfa_free(d);
    return rc;
}

int gm_regex_check(const char *pattern, size_t len, int kind, char *err,
                   size_t errlen)
{
    if (kind == GM_RX_LITERAL)
        return 0;
    struct gm__rx_pat p;
    char msg[256], name[96];
    struct gm_rx_item it = {.text = pattern, .len = len, .kind = (uint8_t)kind};
    item_name(&it, name, sizeof name);
    int rc = gm__rx_parse(&p, pattern, len, msg, sizeof msg);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "%s: %s", name, msg);
    struct gm__rx rx;
    rc = gm__rx_init(&rx, p.uses_prop, 0, 0);
    if (rc == 0 && gm__rx_pattern(&rx, &p, kind) < 0)
        rc = tg_err_set(err, errlen, rx.err, "%s: %s", name, rx.errmsg);
    else if (rc != 0)
        rc = tg_err_set(err, errlen, rc, "out of memory");
    gm__rx_free(&rx);
    gm__rx_pat_free(&p);
    return rc;
}

int gm_regex_test_many(const struct gm_rx_item *items, size_t n,
                       uint32_t min_len, uint32_t max_len, const char *const *s,
                       const size_t *len, size_t m, uint8_t *out, char *err,
                       size_t errlen)
{
    struct gm__rx_dfa d;
    int rc = gm__rx_compile(items, n, 0, 0, &d, err, errlen);
    if (rc == TG_EINVAL) { /* no string at all */
        memset(out, 0, m);
        return 0;
    }
    if (rc != 0)
        return rc;
    uint32_t *cp = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < m && rc == 0; i++) {
        const unsigned char *u = (const unsigned char *)s[i];
        size_t k = 0, ok = 1;
        if (TG_GROW(cp, &cap, len[i] + 1)) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            break;
        }
        for (size_t j = 0; j < len[i] && ok;) {
            size_t l = gm__utf8_dec(u + j, len[i] - j, &cp[k]);
            ok = l > 0;
            j += l;
            k += ok;
        }
        out[i] = ok && k >= min_len &&
                 (max_len == GM_REPEAT_INF || k <= max_len) &&
                 gm__rx_dfa_run(&d, cp, k);
    }
    free(cp);
    gm__rx_dfa_free(&d);
    return rc;
}

int gm_regex_test(const struct gm_rx_item *items, size_t n, uint32_t min_len,
                  uint32_t max_len, const char *s, size_t len, char *err,
                  size_t errlen)
{
    uint8_t out = 0;
    int rc = gm_regex_test_many(items, n, min_len, max_len, &s, &len, 1, &out,
                                err, errlen);
    return rc != 0 ? rc : out;
}

/* ---- the product with a length counter ------------------------------------ */

/* The DFA of the strings of d with lo..hi code points (hi GM_REPEAT_INF:
 * none), dead states removed; n == 0 when there is none. */
static int length_product(const struct gm__rx_dfa *d, uint32_t lo, uint32_t hi,
                          double deadline, struct gm__rx_dfa *o, char *err,
                          size_t errlen)
{
    memset(o, 0, sizeof(*o));
    uint32_t cap = hi != GM_REPEAT_INF ? hi : lo; /* counts kept apart */
    struct gm__kset ks;
    int32_t *st = NULL; /* (state, count) pairs */
    size_t n_st = 0, cap_st = 0, cap_acc = 0, cap_t0 = 0, cap_tr = 0;
    int rc = gm__kset_init(&ks);
    int32_t v;
    if (rc != 0 || gm__kset_put(&ks, d->start, 0, 0, 0, &v) < 0 ||
        TG_GROW(st, &cap_st, 2)) {
        rc = TG_ENOMEM;
        goto out;
    }
    st[0] = d->start;
    st[1] = 0;
    n_st = 1;
    for (size_t i = 0; i < n_st; i++) {
        int32_t s = st[2 * i];
        uint32_t c = (uint32_t)st[2 * i + 1];
        if ((i & 1023) == 1023 && deadline > 0 && gm__now() > deadline) {
            rc = tg_err_set(err, errlen, TG_ETIMEDOUT,
                            "grammar compile took longer than its time "
                            "limit");
            goto out;
        }
        if (TG_GROW(o->accept, &cap_acc, i + 1) ||
            TG_GROW(o->t0, &cap_t0, i + 2)) {
            rc = TG_ENOMEM;
            goto out;
        }
        o->accept[i] = d->accept[s] && c >= lo;
        o->t0[i] = o->n_tr;
        uint32_t nc = c + 1;
        if (hi == GM_REPEAT_INF && nc > cap)
            nc = cap;
        if (hi != GM_REPEAT_INF && nc > hi) {
            o->t0[i + 1] = o->n_tr;
            continue;
        }
        for (size_t k = d->t0[s]; k < d->t0[s + 1]; k++) {
            int r = gm__kset_put(&ks, d->tr[k].to, (int32_t)nc, 0,
                                 (int32_t)n_st, &v);
            if (r < 0 || TG_GROW(o->tr, &cap_tr, o->n_tr + 1)) {
                rc = TG_ENOMEM;
                goto out;
            }
            if (r == 1) {
                if (n_st >= GM_REGEX_MAX_PRODUCT) {
                    rc = tg_err_set(err, errlen, TG_ETOOBIG,
                                    "the pattern with a length of %u..%u "
                                    "needs more than %u automaton states "
                                    "(the limit of a pattern with lengths)",
                                    lo, hi, GM_REGEX_MAX_PRODUCT);
                    goto out;
                }
                if (TG_GROW(st, &cap_st, 2 * n_st + 2)) {
                    rc = TG_ENOMEM;
                    goto out;
                }
                st[2 * n_st] = d->tr[k].to;
                st[2 * n_st + 1] = (int32_t)nc;
                n_st++;
            }
            o->tr[o->n_tr] = d->tr[k];
            o->tr[o->n_tr++].to = v;
        }
        o->t0[i + 1] = o->n_tr;
    }
    o->n = (int32_t)n_st;
    o->start = 0;
    rc = gm__rx_dfa_prune(o);
out:
    if (rc == TG_ENOMEM)
        tg_err_set(err, errlen, rc, "out of memory");
    if (rc != 0)
        gm__rx_dfa_free(o);
    gm__kset_free(&ks);
    free(st);
    return rc;
}

/* The fewest and the most code points of an accepted string (*longest
 * GM_REPEAT_INF when there is a cycle: every state is live). 0 or
 * TG_ENOMEM. */
static int length_span(const struct gm__rx_dfa *d, uint32_t *shortest,
                       uint32_t *longest)
{
    size_t n = (size_t)d->n;
    uint32_t *dist = malloc(n * sizeof(*dist)), *lng = calloc(n, sizeof(*lng));
    int32_t *q = malloc(2 * n * sizeof(*q));
    uint8_t *color = calloc(n, 1);
    if (dist == NULL || lng == NULL || q == NULL || color == NULL) {
        free(dist);
        free(lng);
        free(q);
        free(color);
        return TG_ENOMEM;
    }
    for (size_t s = 0; s < n; s++)
        dist[s] = UINT32_MAX;
    size_t qh = 0, qt = 0;
    dist[d->start] = 0;
    q[qt++] = d->start;
    *shortest = UINT32_MAX;
    while (qh < qt) {
        int32_t s = q[qh++];
        if (d->accept[s] && dist[s] < *shortest)
            *shortest = dist[s];
        for (size_t k = d->t0[s]; k < d->t0[s + 1]; k++)
            if (dist[d->tr[k].to] == UINT32_MAX) {
                dist[d->tr[k].to] = dist[s] + 1;
                q[qt++] = d->tr[k].to;
            }
    }
    /* longest: depth-first, post-order; a back edge is a cycle */
    size_t sp = 0;
    int cyclic = 0;
    q[sp++] = d->start;
    q[sp++] = 0;
    color[d->start] = 1;
    while (sp > 0 && !cyclic) {
        int32_t s = q[sp - 2];
        size_t k = d->t0[s] + (size_t)q[sp - 1]++;
        if (k < d->t0[s + 1]) {
            int32_t to = d->tr[k].to;
            if (color[to] == 1) {
                cyclic = 1;
            } else if (color[to] == 0) {
                color[to] = 1;
                q[sp++] = to;
                q[sp++] = 0;
            }
            continue;
        }
        uint32_t best = 0;
        for (k = d->t0[s]; k < d->t0[s + 1]; k++)
            if (lng[d->tr[k].to] + 1 > best)
                best = lng[d->tr[k].to] + 1;
        lng[s] = best;
        color[s] = 2;
        sp -= 2;
    }
    *longest = cyclic ? GM_REPEAT_INF : lng[d->start];
    free(dist);
    free(lng);
    free(q);
    free(color);
    return 0;
}

/* ---- the automaton written as IR ------------------------------------------- */

/* A run of code points that all continue with expression `leaf`. */
struct seg {
    uint32_t lo, hi;
    int32_t leaf;
};

struct em {
    struct gm_ir *ir;
    const struct gm__rx_dfa *a;
    int enc;
    int32_t cont; /* [80-BF] */
    int32_t empty;
    struct gm__kset tails; /* (leaf, k) -> tail() */
};

/* One byte set per leaf: the alternatives of one trie level. */
struct groups {
    struct {
        int32_t leaf;
        uint8_t set[32];
    } * g;
    size_t n, cap;
};

static int group_add(struct groups *gs, int32_t leaf, unsigned byte)
{
    size_t i = 0;
    while (i < gs->n && gs->g[i].leaf != leaf)
        i++;
    if (i == gs->n) {
        if (TG_GROW(gs->g, &gs->cap, gs->n + 1))
            return TG_ENOMEM;
        gs->g[i].leaf = leaf;
        memset(gs->g[i].set, 0, 32);
        gs->n++;
    }
    gs->g[i].set[byte >> 3] |= (uint8_t)(1u << (byte & 7));
    return 0;
}

/* A growable list of alternatives. */
struct alts {
    int32_t *v;
    size_t n, cap;
};

static int alts_add(struct alts *l, int32_t e)
{
    if (TG_GROW(l->v, &l->cap, l->n + 1))
        return TG_ENOMEM;
    l->v[l->n++] = e;
    return 0;
}

static int32_t em_oom(struct em *e)
{
    return gm_ir_fail(e->ir, TG_ENOMEM, "grammar IR: out of memory");
}

/* `leaf` after k continuation bytes: cont, then `leaf` after k - 1 of
 * them, made once per (leaf, k), so the lead bytes of every length share
 * their tails (the automaton compiler shares an expression's nodes). */
static int32_t tail(struct em *e, int k, int32_t leaf)
{
    if (k == 0 || leaf < 0)
        return leaf;
    int32_t v;
    int r = gm__kset_put(&e->tails, leaf, k, 0, -1, &v);
    if (r < 0)
        return em_oom(e);
    if (r == 0)
        return v;
    int32_t x = gm_ir_seq2(e->ir, e->cont, tail(e, k - 1, leaf));
    gm__kset_put(&e->tails, leaf, k, 0, x, &v);
    /* the key is there: store its value */
    uint32_t h = gm__key_hash(leaf, k, 0) & e->tails.mask;
    while (!(e->tails.key[h][0] == leaf && e->tails.key[h][1] == k &&
             e->tails.key[h][2] == 0))
        h = (h + 1) & e->tails.mask;
    e->tails.key[h][3] = x;
    return x;
}

/* The UTF-8 trie of segs[0..n) (sorted, inside one level's range) at a
 * level where byte b in [blo, bhi] stands for code points
 * base + (b - blo) * blk .. + blk - 1, followed by k more bytes: its
 * alternatives are appended to out. */
static int level(struct em *e, const struct seg *segs, size_t n, uint32_t base,
                 uint32_t blk, unsigned blo, unsigned bhi, int k,
                 struct alts *out)
{
    struct gm_ir *ir = e->ir;
    struct groups gs = {0};
    int rc = 0;
    size_t j = 0;
    for (unsigned b = blo; b <= bhi && rc == 0 && j < n; b++) {
        uint32_t lo = base + (b - blo) * blk, hi = lo + blk - 1;
        while (j < n && segs[j].hi < lo)
            j++;
        if (j >= n || segs[j].lo > hi)
            continue;
        if (segs[j].lo <= lo && segs[j].hi >= hi) {
            rc = group_add(&gs, segs[j].leaf, b);
            continue;
        }
        /* mixed: the segments clipped to this block, one level down */
        size_t m = 0;
        while (j + m < n && segs[j + m].lo <= hi)
            m++;
        struct seg *sub = malloc(m * sizeof(*sub));
        if (sub == NULL) {
            rc = TG_ENOMEM;
            break;
        }
        for (size_t i = 0; i < m; i++) {
            sub[i] = segs[j + i];
            if (sub[i].lo < lo)
                sub[i].lo = lo;
            if (sub[i].hi > hi)
                sub[i].hi = hi;
        }
        struct alts down = {0};
        rc = level(e, sub, m, lo, blk / 64, 0x80, 0xBF, k - 1, &down);
        free(sub);
        if (rc == 0) {
            uint8_t one = (uint8_t)b;
            rc = alts_add(out, gm_ir_seq2(ir, gm_ir_bytes(ir, &one, 1),
                                          gm_ir_alt(ir, down.v, down.n)));
        }
        free(down.v);
    }
    for (size_t i = 0; i < gs.n && rc == 0; i++)
        rc = alts_add(out, gm_ir_seq2(ir, gm_ir_class(ir, gs.g[i].set),
                                      tail(e, k, gs.g[i].leaf)));
    free(gs.g);
    return rc;
}

/* The leaf of code point c in segs, or -1. */
static int32_t leaf_of(const struct seg *segs, size_t n, uint32_t c)
{
    size_t a = 0, z = n;
    while (a < z) {
        size_t mid = (a + z) / 2;
        if (c > segs[mid].hi)
            a = mid + 1;
        else
            z = mid;
    }
    return a < n && segs[a].lo <= c ? segs[a].leaf : -1;
}

/* The escapes JSON needs: `"` `\` and the control characters. */
static int escapes(struct em *e, const struct seg *segs, size_t n,
                   struct alts *out)
{
    static const struct {
        uint8_t cp;
        char ch;
    } short_esc[] = {{0x22, '"'}, {0x5C, '\\'}, {8, 'b'}, {9, 't'},
                     {10, 'n'},   {12, 'f'},    {13, 'r'}};
    struct gm_ir *ir = e->ir;
    struct groups gs = {0};
    struct alts in = {0};
    int rc = 0;
    for (size_t i = 0; i < sizeof short_esc / sizeof *short_esc && rc == 0;
         i++) {
        int32_t leaf = leaf_of(segs, n, short_esc[i].cp);
        if (leaf >= 0)
            rc = group_add(&gs, leaf, (uint8_t)short_esc[i].ch);
    }
    for (size_t i = 0; i < gs.n && rc == 0; i++)
        rc = alts_add(
            &in, gm_ir_seq2(ir, gm_ir_class(ir, gs.g[i].set), gs.g[i].leaf));
    /* \u00XX of the other control characters, hex digits of either case */
    struct alts u = {0};
    for (unsigned d1 = 0; d1 < 2 && rc == 0; d1++) {
        gs.n = 0;
        for (unsigned v = 0; v < 16 && rc == 0; v++) {
            uint32_t c = d1 * 16 + v;
            if (c == 8 || c == 9 || c == 10 || c == 12 || c == 13)
                continue;
            int32_t leaf = leaf_of(segs, n, c);
            if (leaf < 0)
                continue;
            rc = group_add(&gs, leaf, v < 10 ? '0' + v : 'a' + v - 10);
            if (rc == 0 && v >= 10)
                rc = group_add(&gs, leaf, 'A' + v - 10);
        }
        if (gs.n == 0 || rc != 0)
            continue;
        struct alts last = {0};
        for (size_t i = 0; i < gs.n && rc == 0; i++)
            rc = alts_add(&last, gm_ir_seq2(ir, gm_ir_class(ir, gs.g[i].set),
                                            gs.g[i].leaf));
        uint8_t dig = (uint8_t)('0' + d1);
        if (rc == 0)
            rc = alts_add(&u, gm_ir_seq2(ir, gm_ir_bytes(ir, &dig, 1),
                                         gm_ir_alt(ir, last.v, last.n)));
        free(last.v);
    }
    if (rc == 0 && u.n > 0)
        rc = alts_add(
            &in, gm_ir_seq2(ir, gm_ir_str(ir, "u00"), gm_ir_alt(ir, u.v, u.n)));
    if (rc == 0 && in.n > 0)
        rc = alts_add(out, gm_ir_seq2(ir, gm_ir_str(ir, "\\"),
                                      gm_ir_alt(ir, in.v, in.n)));
    free(u.v);
    free(in.v);
    free(gs.g);
    return rc;
}

/* 1 when code point c is written as an escape in the JSON encoding. */
static int json_escaped(uint32_t c)
{
    return c < 0x20 || c == 0x22 || c == 0x5C;
}

/* The byte trie of segs[0..n) (sorted, disjoint), each continuing with
 * its leaf; alternatives appended to out. */
static int trie(struct em *e, const struct seg *segs, size_t n,
                struct alts *out)
{
    static const struct {
        uint32_t lo, hi, blk;
        unsigned blo, bhi;
        int k;
    } lv[4] = {{0, 0x7F, 1, 0x00, 0x7F, 0},
               {0x80, 0x7FF, 64, 0xC0, 0xDF, 1},
               {0x800, 0xFFFF, 4096, 0xE0, 0xEF, 2},
               {0x10000, 0x10FFFF, 0x40000, 0xF0, 0xF7, 3}};
    /* split at the encoding's boundaries (and around JSON's escapes) */
    struct seg *lit = malloc((3 * n + 8) * sizeof(*lit));
    if (lit == NULL)
        return TG_ENOMEM;
    int rc = 0;
    if (e->enc == GM_RX_JSON)
        rc = escapes(e, segs, n, out);
    for (int l = 0; l < 4 && rc == 0; l++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t lo = segs[i].lo > lv[l].lo ? segs[i].lo : lv[l].lo;
            uint32_t hi = segs[i].hi < lv[l].hi ? segs[i].hi : lv[l].hi;
            for (uint32_t c = lo; c <= hi && e->enc == GM_RX_JSON && l == 0;) {
                /* ASCII: cut out the escaped code points */
                uint32_t z = c;
                while (z <= hi && !json_escaped(z))
                    z++;
                if (z > c)
                    lit[m++] = (struct seg){c, z - 1, segs[i].leaf};
                while (z <= hi && json_escaped(z))
                    z++;
                c = z;
            }
            if (lo <= hi && !(e->enc == GM_RX_JSON && l == 0))
                lit[m++] = (struct seg){lo, hi, segs[i].leaf};
        }
        if (m > 0)
            rc = level(e, lit, m, 0, lv[l].blk, lv[l].blo, lv[l].bhi, lv[l].k,
                       out);
    }
    free(lit);
    return rc;
}

/* Writes the automaton: see gm_regex.h. Returns the start's expression. */
static int32_t emit(struct em *e)
{
    const struct gm__rx_dfa *a = e->a;
    struct gm_ir *ir = e->ir;
    size_t n = (size_t)a->n;
    uint8_t *color = calloc(n, 1), *head = calloc(n, 1);
    int32_t *post = malloc(n * sizeof(*post));
    int32_t *stk = malloc(2 * n * sizeof(*stk));
    int32_t *rule = malloc(n * sizeof(*rule));
    int32_t *expr = malloc(n * sizeof(*expr));
    int32_t *depth = calloc(n, sizeof(*depth));
    struct seg *segs = NULL, *loop = NULL;
    size_t cap_segs = 0, cap_loop = 0;
    int32_t result = -1;
    if (!color || !head || !post || !stk || !rule || !expr || !depth) {
        result = em_oom(e);
        goto out;
    }
    /* depth-first: the targets of back edges close cycles: rules */
    size_t np = 0, sp = 0;
    stk[sp++] = a->start;
    stk[sp++] = 0;
    color[a->start] = 1;
    while (sp > 0) {
        int32_t s = stk[sp - 2];
        size_t i = a->t0[s] + (size_t)stk[sp - 1]++;
        if (i < a->t0[s + 1]) {
            int32_t to = a->tr[i].to;
            if (to == s)
                continue;
            if (color[to] == 1)
                head[to] = 1;
            else if (color[to] == 0) {
                color[to] = 1;
                stk[sp++] = to;
                stk[sp++] = 0;
            }
            continue;
        }
        color[s] = 2;
        post[np++] = s;
        sp -= 2;
    }
    /* each state written inline belongs to one rule: one reached inline
     * from two (the start's expression counts as one) becomes a rule of
     * its own, so no state is written twice. Reverse post-order is a
     * topological order of the edges that are not back edges. */
    for (size_t s = 0; s < n; s++)
        depth[s] = -1; /* owner: a root state, or -2 for several */
    for (size_t i = np; i-- > 0;) {
        int32_t s = post[i];
        if (depth[s] == -2)
            head[s] = 1;
        if (head[s] || s == a->start)
            depth[s] = s;
        for (size_t k = a->t0[s]; k < a->t0[s + 1]; k++) {
            int32_t to = a->tr[k].to;
            if (to == s || head[to])
                continue;
            if (depth[to] == -1)
                depth[to] = depth[s];
            else if (depth[to] != depth[s])
                depth[to] = -2;
        }
    }
    /* a long chain of states is cut into rules, so no expression nests
     * deeper than INLINE_DEPTH_MAX states */
    for (size_t s = 0; s < n; s++)
        depth[s] = 0;
    for (size_t i = 0; i < np; i++) {
        int32_t s = post[i], dmax = 0;
        for (size_t k = a->t0[s]; k < a->t0[s + 1]; k++) {
            int32_t to = a->tr[k].to;
            if (to != s && !head[to] && depth[to] > dmax)
                dmax = depth[to];
        }
        depth[s] = dmax + 1;
        if (depth[s] > INLINE_DEPTH_MAX) {
            head[s] = 1;
            depth[s] = 0;
        }
    }
    for (size_t s = 0; s < n; s++) {
        rule[s] = head[s] ? gm_ir_rule(ir, "pattern-state") : -1;
        expr[s] = head[s] ? gm_ir_ref(ir, rule[s]) : -1;
    }
    e->cont = gm_ir_range(ir, 0x80, 0xBF);
    e->empty = gm_ir_empty(ir);
    if (gm__kset_init(&e->tails) != 0)
        goto oom;
    for (size_t i = 0; i < np && ir->err == 0; i++) {
        int32_t s = post[i];
        size_t ns = 0, nl = 0;
        for (size_t k = a->t0[s]; k < a->t0[s + 1]; k++) {
            const struct gm__rx_tr *t = &a->tr[k];
            if (t->to == s) {
                if (TG_GROW(loop, &cap_loop, nl + 1))
                    goto oom;
                loop[nl++] = (struct seg){t->lo, t->hi, e->empty};
            } else {
                if (TG_GROW(segs, &cap_segs, ns + 1))
                    goto oom;
                segs[ns++] = (struct seg){t->lo, t->hi, expr[t->to]};
            }
        }
        struct alts body = {0};
        int rc = a->accept[s] ? alts_add(&body, e->empty) : 0;
        if (rc == 0)
            rc = trie(e, segs, ns, &body);
        int32_t x = gm_ir_alt(ir, body.v, body.n);
        free(body.v);
        if (rc == 0 && nl > 0) {
            struct alts l = {0};
            rc = trie(e, loop, nl, &l);
            x = gm_ir_seq2(
                ir, gm_ir_repeat(ir, gm_ir_alt(ir, l.v, l.n), 0, GM_REPEAT_INF),
                x);
            free(l.v);
        }
        if (rc != 0)
            goto oom;
        if (head[s])
            gm_ir_rule_define(ir, rule[s], x);
        else
            expr[s] = x;
    }
    if (ir->err != 0) {
        result = ir->err;
        goto out;
    }
    result = expr[a->start]; /* a reference when it is a rule */
    goto out;
oom:
    result = em_oom(e);
out:
    free(color);
    free(head);
    free(post);
    free(stk);
    free(rule);
    free(expr);
    free(depth);
    free(segs);
    free(loop);
    gm__kset_free(&e->tails);
    return result;
}

int32_t gm__rx_set_expr(struct gm_ir *ir, const struct gm__cset *s, int enc)
{
    struct em e = {.ir = ir, .enc = enc};
    e.cont = gm_ir_range(ir, 0x80, 0xBF);
    e.empty = gm_ir_empty(ir);
    struct seg *segs = malloc((2 * s->n + 1) * sizeof(*segs));
    if (segs == NULL || gm__kset_init(&e.tails) != 0) {
        free(segs);
        return em_oom(&e);
    }
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0], hi = s->r[i][1];
        if (hi > GM__CP_MAX)
            hi = GM__CP_MAX;
        /* no surrogates: split around them */
        if (lo < 0xD800 && hi >= 0xD800) {
            segs[n++] = (struct seg){lo, 0xD7FF, e.empty};
            lo = 0xE000;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            lo = 0xE000;
        }
        if (lo <= hi)
            segs[n++] = (struct seg){lo, hi, e.empty};
    }
    struct alts out = {0};
    int rc = trie(&e, segs, n, &out);
    int32_t r = rc != 0 ? em_oom(&e) : gm_ir_alt(ir, out.v, out.n);
    free(out.v);
    free(segs);
    gm__kset_free(&e.tails);
    return r;
}

int32_t gm_regex_expr(struct gm_ir *ir, const struct gm_rx_item *items,
                      size_t n, const struct gm_rx_opts *o, char *err,
                      size_t errlen)
{
    struct gm_rx_opts dflt;
    if (o == NULL) {
        gm_rx_opts_default(&dflt);
        o = &dflt;
    }
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (ir->err != 0)
        return gm_ir_error(ir, err, errlen);
    if (gm_ir_late(ir))
        return gm_ir_error(ir, err, errlen);
    if (o->max_len != GM_REPEAT_INF && o->min_len > o->max_len)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "minimum length %u above the maximum %u: no "
                          "string has it",
                          o->min_len, o->max_len);
    struct gm__rx_dfa d, p;
    int rc = gm__rx_compile(items, n, o->max_states, ir->deadline, &d, err,
                            errlen);
    if (rc == TG_ETIMEDOUT) {
        gm_ir_late(ir);
        return gm_ir_error(ir, err, errlen);
    }
    if (rc != 0)
        return rc;
    const struct gm__rx_dfa *a = &d;
    /* bounds every string of the DFA meets anyway are dropped */
    uint32_t lo = o->min_len, hi = o->max_len, shortest, longest;
    if (length_span(&d, &shortest, &longest) != 0) {
        gm__rx_dfa_free(&d);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    if (lo <= shortest)
        lo = 0;
    if (hi != GM_REPEAT_INF && longest != GM_REPEAT_INF && longest <= hi)
        hi = GM_REPEAT_INF;
    if (lo > 0 || hi != GM_REPEAT_INF) {
        /* a product over its limit: fewer lengths (shorter strings, all
         * valid) until it fits */
        int lowered = 0;
        while ((rc = length_product(&d, lo, hi, ir->deadline, &p, err,
                                    errlen)) == TG_ETOOBIG &&
               hi != GM_REPEAT_INF && hi > lo) {
            hi = lo + (hi - lo) / 2;
            lowered = 1;
        }
        if (rc == 0 && p.n == 0 && lowered) {
            gm__rx_dfa_free(&d);
            return tg_err_set(err, errlen, TG_ETOOBIG,
                              "the pattern with a length of %u..%u needs "
                              "more than %u automaton states (the limit of "
                              "a pattern with lengths)",
                              o->min_len, o->max_len, GM_REGEX_MAX_PRODUCT);
        }
        gm__rx_dfa_free(&d);
        if (rc == TG_ETIMEDOUT) {
            gm_ir_late(ir);
            return gm_ir_error(ir, err, errlen);
        }
        if (rc != 0)
            return rc;
        if (p.n == 0) {
            if (o->max_len == GM_REPEAT_INF)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "no string of at least %u characters "
                                  "matches",
                                  o->min_len);
            return tg_err_set(err, errlen, TG_EINVAL,
                              "no string of %u to %u characters matches",
                              o->min_len, o->max_len);
        }
        a = &p;
    }
    struct em e = {.ir = ir, .a = a, .enc = o->enc};
    int32_t r = emit(&e);
    gm__rx_dfa_free((struct gm__rx_dfa *)a);
    if (r < 0)
        gm_ir_error(ir, err, errlen);
    return r;
}

int32_t gm_regex_json_string_items(struct gm_ir *ir,
                                   const struct gm_rx_item *items, size_t n,
                                   uint32_t min_len, uint32_t max_len,
                                   char *err, size_t errlen)
{
    struct gm_rx_opts o;
    gm_rx_opts_default(&o);
    o.min_len = min_len;
    o.max_len = max_len;
    int32_t c = gm_regex_expr(ir, items, n, &o, err, errlen);
    if (c < 0)
        return c;
    int32_t r = gm_ir_rule(ir, "pattern");
    int32_t q = gm_ir_str(ir, "\"");
    int rc = gm_ir_rule_define(ir, r, gm_ir_seq(ir, (int32_t[]){q, c, q}, 3));
    if (rc != 0) {
        gm_ir_error(ir, err, errlen);
        return rc;
    }
    return r;
}

int32_t gm_regex_json_string(struct gm_ir *ir, const char *pattern, size_t len,
                             uint32_t min_len, uint32_t max_len, char *err,
                             size_t errlen)
{
    struct gm_rx_item it = {.text = pattern, .len = len, .kind = GM_RX_SEARCH};
    return gm_regex_json_string_items(ir, &it, 1, min_len, max_len, err,
                                      errlen);
}
