/* gm_regex_parse.c — ECMA-262 patterns (u mode, with Annex B's literal
 * braces) parsed into the tree of gm_regex_internal.h. Recursive descent
 * over the pattern's code points; nesting is bounded. */
#include "common/grammar/gm_regex_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

struct ps {
    uint32_t *c; /* the pattern's code points */
    size_t n, i;
    struct gm__rx_pat *p;
    int depth;
    char *err;
    size_t errlen;
    int rc;
};

static int pfail(struct ps *s, int code, size_t pos, const char *what)
{
    if (s->rc == 0)
        s->rc = tg_err_set(s->err, s->errlen, code, "%s at position %zu", what,
                           pos);
    return s->rc;
}

static int oom(struct ps *s)
{
    if (s->rc == 0)
        s->rc = tg_err_set(s->err, s->errlen, TG_ENOMEM, "out of memory");
    return s->rc;
}

static int32_t node(struct ps *s, uint8_t kind, size_t pos)
{
    struct gm__rx_pat *p = s->p;
    if (TG_GROW(p->node, &p->cap_node, p->n_node + 1))
        return oom(s);
    struct gm__rxa *a = &p->node[p->n_node];
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->pos = (uint32_t)pos;
    a->look = kind == GM__RXA_LOOK;
    return (int32_t)p->n_node++;
}

/* A new empty set; its index. */
static int32_t new_set(struct ps *s)
{
    struct gm__rx_pat *p = s->p;
    if (TG_GROW(p->set, &p->cap_set, p->n_set + 1))
        return oom(s);
    memset(&p->set[p->n_set], 0, sizeof(*p->set));
    return (int32_t)p->n_set++;
}

static int32_t set_node(struct ps *s, int32_t set, size_t pos)
{
    int32_t n = node(s, GM__RXA_SET, pos);
    if (n >= 0)
        s->p->node[n].a = set;
    return n;
}

/* A node of kids kv[0..k) (SEQ or ALT; one kid: itself). */
static int32_t list_node(struct ps *s, uint8_t kind, const int32_t *kv,
                         size_t k, size_t pos)
{
    if (k == 1)
        return kv[0];
    struct gm__rx_pat *p = s->p;
    int32_t n = node(s, k == 0 ? GM__RXA_EMPTY : kind, pos);
    if (n < 0 || k == 0)
        return n;
    if (TG_GROW(p->kid, &p->cap_kid, p->n_kid + k))
        return oom(s);
    memcpy(p->kid + p->n_kid, kv, k * sizeof(*kv));
    p->node[n].a = (int32_t)p->n_kid;
    p->node[n].n = (int32_t)k;
    for (size_t i = 0; i < k; i++)
        p->node[n].look |= p->node[kv[i]].look;
    p->n_kid += k;
    return n;
}

static int at(struct ps *s, uint32_t ch)
{
    return s->i < s->n && s->c[s->i] == ch;
}

static int hexval(uint32_t ch)
{
    if (ch >= '0' && ch <= '9')
        return (int)(ch - '0');
    if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f')
        return (int)((ch | 0x20) - 'a' + 10);
    return -1;
}

/* k hex digits at s->i into *v; 0 or -1 (nothing consumed). */
static int hexn(struct ps *s, int k, uint32_t *v)
{
    if (s->i + (size_t)k > s->n)
        return -1;
    uint32_t x = 0;
    for (int j = 0; j < k; j++) {
        int h = hexval(s->c[s->i + (size_t)j]);
        if (h < 0)
            return -1;
        x = x * 16 + (uint32_t)h;
    }
    s->i += (size_t)k;
    *v = x;
    return 0;
}

/* After "\u": {H...} or HHHH (a high surrogate followed by "\uDC00"-style
 * low one is one code point). */
static int unicode_escape(struct ps *s, size_t pos, uint32_t *cp)
{
    if (at(s, '{')) {
        s->i++;
        uint32_t v = 0;
        size_t k = 0;
        while (s->i < s->n && hexval(s->c[s->i]) >= 0) {
            v = v * 16 + (uint32_t)hexval(s->c[s->i++]);
            if (v > GM__CP_MAX)
                return pfail(s, TG_EFORMAT, pos, "\\u{...} above U+10FFFF");
            k++;
        }
        if (k == 0 || !at(s, '}'))
            return pfail(s, TG_EFORMAT, pos, "malformed \\u{...} escape");
        s->i++;
        *cp = v;
        return 0;
    }
    uint32_t v;
    if (hexn(s, 4, &v) != 0)
        return pfail(s, TG_EFORMAT, pos, "malformed \\u escape");
    if (v >= 0xD800 && v <= 0xDBFF && s->i + 6 <= s->n && s->c[s->i] == '\\' &&
        s->c[s->i + 1] == 'u') {
        size_t save = s->i;
        uint32_t lo;
        s->i += 2;
        if (hexn(s, 4, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF)
            v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        else
            s->i = save;
    }
    *cp = v;
    return 0;
}

/* One escape after '\' (s->i past it), in a class or not: a code point
 * (*cp, *set = -1) or a set (*set). \b and \B outside classes are the
 * caller's. */
static int escape(struct ps *s, int in_class, uint32_t *cp, int32_t *set)
{
    size_t pos = s->i - 1;
    *set = -1;
    if (s->i >= s->n)
        return pfail(s, TG_EFORMAT, pos, "\\ at the end of the pattern");
    uint32_t e = s->c[s->i++];
    switch (e) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        *set = new_set(s);
        if (*set < 0)
            return s->rc;
        return gm__cset_class(&s->p->set[*set], (char)e) != 0 ? oom(s) : 0;
    case 't': *cp = 9; return 0;
    case 'n': *cp = 10; return 0;
    case 'v': *cp = 11; return 0;
    case 'f': *cp = 12; return 0;
    case 'r': *cp = 13; return 0;
    case 'b':
        if (in_class) {
            *cp = 8;
            return 0;
        }
        break;
    case '-': *cp = '-'; return 0;
    case '0':
        if (s->i < s->n && s->c[s->i] >= '0' && s->c[s->i] <= '9')
            return pfail(s, TG_EFORMAT, pos,
                         "octal escape \\0N (not allowed in Unicode "
                         "patterns)");
        *cp = 0;
        return 0;
    case 'c':
        if (s->i < s->n &&
            ((s->c[s->i] | 0x20) >= 'a' && (s->c[s->i] | 0x20) <= 'z')) {
            *cp = s->c[s->i++] % 32;
            return 0;
        }
        return pfail(s, TG_EFORMAT, pos, "\\c without a letter");
    case 'x':
        if (hexn(s, 2, cp) != 0)
            return pfail(s, TG_EFORMAT, pos, "malformed \\x escape");
        return 0;
    case 'u': return unicode_escape(s, pos, cp);
    case 'p':
    case 'P': {
        size_t b = s->i;
        if (!at(s, '{'))
            return pfail(s, TG_EFORMAT, pos, "\\p without {name}");
        while (s->i < s->n && s->c[s->i] != '}')
            s->i++;
        if (s->i >= s->n || s->i - b - 1 > 64)
            return pfail(s, TG_EFORMAT, pos, "malformed \\p{...}");
        char name[72];
        size_t k = 0;
        for (size_t j = b + 1; j < s->i; j++)
            name[k++] = s->c[j] < 0x80 ? (char)s->c[j] : '?';
        s->i++;
        *set = new_set(s);
        if (*set < 0)
            return s->rc;
        int rc = gm__cset_property(&s->p->set[*set], name, k, e == 'P');
        if (rc == TG_ENOMEM)
            return oom(s);
        if (rc != 0) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "Unicode property \\%c{%.*s} is not supported (only "
                     "General_Category values, Any, ASCII, Assigned)",
                     (char)e, (int)k, name);
            return pfail(s, TG_EUNSUPPORTED, pos, msg);
        }
        s->p->uses_prop = 1;
        return 0;
    }
    case 'k':
        if (at(s, '<'))
            return pfail(s, TG_EUNSUPPORTED, pos,
                         "back-reference \\k<name> (no finite automaton "
                         "can match it)");
        break;
    default: break;
    }
    if (e >= '1' && e <= '9') {
        char msg[96];
        snprintf(msg, sizeof msg,
                 "back-reference \\%c (no finite automaton can match it)",
                 (char)e);
        return pfail(s, in_class ? TG_EFORMAT : TG_EUNSUPPORTED, pos, msg);
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') ||
        (e >= '0' && e <= '9')) {
        char msg[64];
        snprintf(msg, sizeof msg, "unknown escape \\%c", (char)e);
        return pfail(s, TG_EFORMAT, pos, msg);
    }
    *cp = e; /* an escaped punctuation or non-ASCII character: itself */
    return 0;
}

/* [...] after '[' (s->i past it). */
static int32_t char_class(struct ps *s)
{
    size_t pos = s->i - 1;
    int neg = at(s, '^');
    if (neg)
        s->i++;
    int32_t set = new_set(s);
    if (set < 0)
        return s->rc;
    for (;;) {
        if (s->i >= s->n)
            return pfail(s, TG_EFORMAT, pos, "missing ] of the class opened");
        if (at(s, ']')) {
            s->i++;
            break;
        }
        uint32_t lo = 0, hi;
        int32_t a_set = -1, b_set = -1;
        size_t apos = s->i;
        uint32_t ch = s->c[s->i++];
        if (ch == '\\') {
            if (escape(s, 1, &lo, &a_set) != 0)
                return s->rc;
        } else {
            lo = ch;
        }
        if (at(s, '-') && s->i + 1 < s->n && s->c[s->i + 1] != ']') {
            s->i++;
            ch = s->c[s->i++];
            if (ch == '\\') {
                if (escape(s, 1, &hi, &b_set) != 0)
                    return s->rc;
            } else {
                hi = ch;
            }
            if (a_set >= 0 || b_set >= 0)
                return pfail(s, TG_EFORMAT, apos,
                             "a class escape (\\d, \\w, ...) as the end of "
                             "a range");
            if (lo > hi)
                return pfail(s, TG_EFORMAT, apos, "range out of order");
        } else {
            hi = lo;
        }
        struct gm__cset *dst = &s->p->set[set];
        int rc = a_set >= 0 ? gm__cset_union(dst, &s->p->set[a_set])
                            : gm__cset_add(dst, lo, hi);
        if (rc != 0)
            return oom(s);
    }
    struct gm__cset *dst = &s->p->set[set];
    gm__cset_norm(dst);
    if (neg && gm__cset_invert(dst) != 0)
        return oom(s);
    return set_node(s, set, pos);
}

/* Digits at s->i as a count (capped above GM_REPEAT_MAX); -1: none. */
static int64_t count(struct ps *s)
{
    int64_t v = -1;
    while (s->i < s->n && s->c[s->i] >= '0' && s->c[s->i] <= '9') {
        int64_t d = (int64_t)(s->c[s->i++] - '0');
        v = v < 0 ? d : v * 10 + d;
        if (v > (int64_t)GM_REPEAT_MAX + 1)
            v = (int64_t)GM_REPEAT_MAX + 1;
    }
    return v;
}

/* A quantifier at s->i: 1 (consumed, *mn and *mx set), 0 (none here) or
 * the error code. */
static int quantifier(struct ps *s, uint32_t *mn, uint32_t *mx)
{
    if (s->i >= s->n)
        return 0;
    uint32_t ch = s->c[s->i];
    size_t pos = s->i;
    if (ch == '*' || ch == '+' || ch == '?') {
        s->i++;
        *mn = ch == '+';
        *mx = ch == '?' ? 1 : GM_REPEAT_INF;
    } else if (ch == '{') {
        s->i++;
        int64_t a = count(s), b;
        if (a < 0) {
            s->i = pos;
            return 0;
        }
        if (at(s, '}')) {
            b = a;
        } else if (at(s, ',')) {
            s->i++;
            b = count(s);
        } else {
            s->i = pos;
            return 0;
        }
        if (!at(s, '}')) {
            s->i = pos;
            return 0;
        }
        s->i++;
        if (a > GM_REPEAT_MAX || b > GM_REPEAT_MAX)
            return pfail(s, TG_ETOOBIG, pos,
                         "repetition count over the limit 65536");
        if (b >= 0 && b < a)
            return pfail(s, TG_EFORMAT, pos, "repetition {m,n} with n below m");
        *mn = (uint32_t)a;
        *mx = b < 0 ? GM_REPEAT_INF : (uint32_t)b;
    } else {
        return 0;
    }
    if (at(s, '?')) /* lazy: the same strings */
        s->i++;
    return 1;
}

static int32_t alternation(struct ps *s);

/* (...) after '(' (s->i past it). */
static int32_t group(struct ps *s)
{
    size_t pos = s->i - 1;
    int look = 0, neg = 0;
    if (at(s, '?')) {
        s->i++;
        uint32_t k = s->i < s->n ? s->c[s->i] : 0;
        if (k == ':') {
            s->i++;
        } else if (k == '=' || k == '!') {
            s->i++;
            look = 1;
            neg = k == '!';
        } else if (k == '<' && s->i + 1 < s->n &&
                   (s->c[s->i + 1] == '=' || s->c[s->i + 1] == '!')) {
            return pfail(s, TG_EUNSUPPORTED, pos,
                         "lookbehind (?<= or (?<! is not supported");
        } else if (k == '<' ||
                   (k == 'P' && s->i + 1 < s->n && s->c[s->i + 1] == '<')) {
            s->i += k == 'P' ? 2 : 1;
            size_t b = s->i;
            while (s->i < s->n && s->c[s->i] != '>' && s->c[s->i] != ')')
                s->i++;
            if (!at(s, '>') || s->i == b)
                return pfail(s, TG_EFORMAT, pos, "malformed group name");
            s->i++;
        } else if (k == 'P' && s->i + 1 < s->n && s->c[s->i + 1] == '=') {
            return pfail(s, TG_EUNSUPPORTED, pos,
                         "back-reference (?P=name) (no finite automaton "
                         "can match it)");
        } else {
            return pfail(s, TG_EFORMAT, pos,
                         "unknown group syntax (?... (inline flags are not "
                         "part of ECMA-262)");
        }
    }
    if (++s->depth > GM_REGEX_MAX_NESTING)
        return pfail(s, TG_ETOOBIG, pos, "groups nested more than 200 deep");
    int32_t body = alternation(s);
    s->depth--;
    if (body < 0)
        return body;
    if (!at(s, ')'))
        return pfail(s, TG_EFORMAT, pos, "missing ) of the group opened");
    s->i++;
    if (!look)
        return body;
    int32_t n = node(s, GM__RXA_LOOK, pos);
    if (n >= 0) {
        s->p->node[n].a = body;
        s->p->node[n].neg = (uint8_t)neg;
    }
    return n;
}

/* One term: an assertion, or an atom with its quantifier. */
static int32_t term(struct ps *s)
{
    size_t pos = s->i;
    uint32_t ch = s->c[s->i++];
    int32_t a = -1;
    int assertion = 0;
    switch (ch) {
    case '^':
        a = node(s, GM__RXA_BOL, pos);
        assertion = 1;
        break;
    case '$':
        a = node(s, GM__RXA_EOL, pos);
        assertion = 1;
        break;
    case '(':
        a = group(s);
        assertion = a >= 0 && s->p->node[a].kind == GM__RXA_LOOK;
        break;
    case '[': a = char_class(s); break;
    case '.': {
        int32_t set = new_set(s);
        if (set < 0)
            return s->rc;
        if (gm__cset_class(&s->p->set[set], '.') != 0)
            return oom(s);
        a = set_node(s, set, pos);
        break;
    }
    case '*':
    case '+':
    case '?':
        return pfail(s, TG_EFORMAT, pos, "quantifier with nothing to repeat");
    case '{': {
        uint32_t mn, mx;
        s->i = pos;
        int q = quantifier(s, &mn, &mx);
        if (q != 0)
            return q < 0 ? q
                         : pfail(s, TG_EFORMAT, pos,
                                 "quantifier with nothing to repeat");
        s->i = pos + 1;
    }
        /* a literal '{' */
        __attribute__((fallthrough));
    default: {
        uint32_t cp = ch;
        int32_t set = -1;
        if (ch == '\\') {
            if (at(s, 'b') || at(s, 'B')) {
                a = node(s, at(s, 'b') ? GM__RXA_WB : GM__RXA_NWB, pos);
                s->i++;
                s->p->uses_wb = 1;
                assertion = 1;
                break;
            }
            if (escape(s, 0, &cp, &set) != 0)
                return s->rc;
        }
        if (set < 0) {
            set = new_set(s);
            if (set < 0 || gm__cset_add(&s->p->set[set], cp, cp) != 0)
                return oom(s);
        }
        a = set_node(s, set, pos);
        break;
    }
    }
    if (a < 0)
        return s->rc != 0 ? s->rc : a;
    uint32_t mn, mx;
    size_t qpos = s->i;
    int q = quantifier(s, &mn, &mx);
    if (q < 0)
        return q;
    if (q == 0)
        return a;
    if (assertion)
        return pfail(s, TG_EFORMAT, qpos, "quantifier after an assertion");
    int32_t r = node(s, GM__RXA_REP, qpos);
    if (r < 0)
        return r;
    struct gm__rxa *x = &s->p->node[r];
    x->a = a;
    x->min = mn;
    x->max = mx;
    x->look = s->p->node[a].look;
    size_t save = s->i;
    uint32_t mn2, mx2;
    if (quantifier(s, &mn2, &mx2) > 0)
        return pfail(s, TG_EFORMAT, save, "quantifier with nothing to repeat");
    return s->rc != 0 ? s->rc : r;
}

/* A growable list of node ids. */
struct ids {
    int32_t *v;
    size_t n, cap;
};

static int32_t sequence(struct ps *s)
{
    size_t pos = s->i;
    struct ids l = {0};
    while (s->i < s->n && s->c[s->i] != '|' && s->c[s->i] != ')') {
        int32_t t = term(s);
        if (t < 0 || TG_GROW(l.v, &l.cap, l.n + 1)) {
            free(l.v);
            return t < 0 ? t : oom(s);
        }
        l.v[l.n++] = t;
    }
    int32_t r = list_node(s, GM__RXA_SEQ, l.v, l.n, pos);
    free(l.v);
    return r;
}

static int32_t alternation(struct ps *s)
{
    size_t pos = s->i;
    struct ids l = {0};
    for (;;) {
        int32_t t = sequence(s);
        if (t < 0 || TG_GROW(l.v, &l.cap, l.n + 1)) {
            free(l.v);
            return t < 0 ? t : oom(s);
        }
        l.v[l.n++] = t;
        if (!at(s, '|'))
            break;
        s->i++;
    }
    int32_t r = list_node(s, GM__RXA_ALT, l.v, l.n, pos);
    free(l.v);
    return r;
}

int gm__rx_parse(struct gm__rx_pat *p, const char *pat, size_t len, char *err,
                 size_t errlen)
{
    memset(p, 0, sizeof(*p));
    p->root = -1;
    if (len > GM_REGEX_MAX_PATTERN)
        return tg_err_set(err, errlen, TG_ETOOBIG,
                          "pattern of %zu bytes is over the limit of %u", len,
                          GM_REGEX_MAX_PATTERN);
    struct ps s = {.p = p, .err = err, .errlen = errlen};
    s.c = malloc((len ? len : 1) * sizeof(*s.c));
    if (s.c == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    const unsigned char *u = (const unsigned char *)pat;
    for (size_t i = 0; i < len;) {
        size_t k = gm__utf8_dec(u + i, len - i, &s.c[s.n]);
        if (k == 0) {
            free(s.c);
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "pattern is not UTF-8 (byte %zu)", i);
        }
        i += k;
        s.n++;
    }
    int32_t r = alternation(&s);
    if (r >= 0 && s.i < s.n) /* stopped at a ')' */
        r = pfail(&s, TG_EFORMAT, s.i, "unmatched )");
    free(s.c);
    if (r < 0) {
        gm__rx_pat_free(p);
        return s.rc != 0 ? s.rc : r;
    }
    p->root = r;
    return 0;
}

void gm__rx_pat_free(struct gm__rx_pat *p)
{
    for (size_t i = 0; i < p->n_set; i++)
        gm__cset_free(&p->set[i]);
    free(p->set);
    free(p->node);
    free(p->kid);
    memset(p, 0, sizeof(*p));
    p->root = -1;
}
