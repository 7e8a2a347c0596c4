/* jj_filter.c — Jinja's builtin filters (jinja2/filters.py of 3.1;
 * jj_internal.h) with the sandbox's and transformers' variations: tojson
 * is json.dumps(x, ensure_ascii=False, indent=None, separators=None,
 * sort_keys=False) with those parameters in that order. The filters over
 * sequences are in jj_filter_seq.c, the tests in jj_test.c. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_filter_internal.h"
#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"

enum {
    F_ABS = 0, F_ATTR, F_CAPITALIZE, F_CENTER, F_DEFAULT, F_DICTSORT,
    F_ESCAPE, F_FIRST, F_FLOAT, F_FORCEESCAPE, F_INDENT, F_INT, F_ITEMS,
    F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT,
    F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT,
    F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM,
    F_UNIQUE, F_UPPER,
};

struct named {
    const char *name;
    int id;
};

static const struct named FILTERS[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"capitalize", F_CAPITALIZE},
    {"center", F_CENTER}, {"count", F_LENGTH}, {"d", F_DEFAULT},
    {"default", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"e", F_ESCAPE},
    {"escape", F_ESCAPE}, {"first", F_FIRST}, {"float", F_FLOAT},
    {"forceescape", F_FORCEESCAPE}, {"indent", F_INDENT}, {"int", F_INT},
    {"items", F_ITEMS}, {"join", F_JOIN}, {"last", F_LAST},
    {"length", F_LENGTH}, {"list", F_LIST}, {"lower", F_LOWER},
    {"map", F_MAP}, {"max", F_MAX}, {"min", F_MIN}, {"reject", F_REJECT},
    {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE},
    {"reverse", F_REVERSE}, {"round", F_ROUND}, {"safe", F_SAFE},
    {"select", F_SELECT}, {"selectattr", F_SELECTATTR}, {"sort", F_SORT},
    {"string", F_STRING}, {"sum", F_SUM}, {"title", F_TITLE},
    {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"unique", F_UNIQUE},
    {"upper", F_UPPER},
    /* known to Jinja, not implemented here */
    {"batch", -1}, {"filesizeformat", -1}, {"format", -1}, {"groupby", -1},
    {"pprint", -1}, {"random", -1}, {"slice", -1}, {"striptags", -1},
    {"truncate", -1}, {"urlencode", -1}, {"urlize", -1}, {"wordcount", -1},
    {"wordwrap", -1}, {"xmlattr", -1},
};

static int find_named(const struct named *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return t[i].id;
    return -2;
}

int jj_filter_id(const char *name)
{
    return find_named(FILTERS, sizeof FILTERS / sizeof FILTERS[0], name);
}


/* ---- helpers --------------------------------------------------------------------- */

static int soft_str(struct jj_ctx *c, int line, struct jj_val v,
                    struct jj_val *out)
{
    return jj_to_str(c, line, v, out);
}


/* An iterator value over list l (stolen). */


/* make_attrgetter: "a.b.0" walks items with getitem; a non-None default
 * replaces Undefined results. */

/* ignore_case: strings compare lowercased unless case_sensitive. */

/* Stable merge sort of idx[0..n) by keys (descending when rev). */

/* Sorts items by keys into a new list (keys consumed). */

/* Python int(str, base); false when it is not an integer literal. */
static bool parse_py_int(const char *s, size_t len, int base, int64_t *out,
                         bool *overflowed)
{
    size_t a = 0, b = len;
    *overflowed = false;
    while (a < b) {
        size_t adv;
        uint32_t cp = jj_utf8_next(s + a, b - a, &adv);
        if (!jj_py_isspace(cp))
            break;
        a += adv;
    }
    while (b > a) {
        size_t p = b - 1;
        while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80)
            p--;
        size_t adv;
        uint32_t cp = jj_utf8_next(s + p, b - p, &adv);
        if (!jj_py_isspace(cp))
            break;
        b = p;
    }
    bool neg = false;
    if (a < b && (s[a] == '+' || s[a] == '-'))
        neg = s[a++] == '-';
    if (a + 1 < b && s[a] == '0') {
        char p = (char)(s[a + 1] | 0x20);
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb != 0 && (base == 0 || base == pb)) {
            base = pb;
            a += 2;
            if (a < b && s[a] == '_')
                a++;
        }
    }
    if (base == 0)
        base = 10;
    if (a >= b)
        return false;
    int64_t v = 0;
    bool prev_us = true;
    for (size_t i = a; i < b; i++) {
        char ch = s[i];
        if (ch == '_') {
            if (prev_us)
                return false;
            prev_us = true;
            continue;
        }
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'z' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'Z' ? ch - 'A' + 10
                                         : 99;
        if (d >= base)
            return false;
        prev_us = false;
        if (__builtin_mul_overflow(v, (int64_t)base, &v) ||
            __builtin_add_overflow(v, (int64_t)d, &v))
            *overflowed = true;
    }
    if (prev_us)
        return false;
    *out = neg ? -v : v;
    return true;
}

/* Python float(str); false when not a float literal. */
static bool parse_py_float(const char *s, size_t len, double *out)
{
    char buf[512];
    size_t a = 0, b = len, k = 0;
    while (a < b && jj_py_isspace((unsigned char)s[a]))
        a++;
    while (b > a && jj_py_isspace((unsigned char)s[b - 1]))
        b--;
    if (b - a >= sizeof buf)
        return false;
    size_t i = a;
    if (i < b && (s[i] == '+' || s[i] == '-'))
        buf[k++] = s[i++];
    const char *words[] = {"inf", "infinity", "nan"};
    for (int w = 0; w < 3; w++) {
        size_t wl = strlen(words[w]);
        if (b - i == wl && strncasecmp(s + i, words[w], wl) == 0) {
            memcpy(buf + k, words[w], wl);
            buf[k + wl] = '\0';
            *out = strtod(buf, NULL);
            return true;
        }
    }
    bool digits = false, prev_digit = false;
    int part = 0; /* 0 int, 1 frac, 2 exp */
    for (; i < b; i++) {
        char ch = s[i];
        if (ch >= '0' && ch <= '9') {
            buf[k++] = ch;
            digits = true;
            prev_digit = true;
        } else if (ch == '_') {
            if (!prev_digit || i + 1 >= b || s[i + 1] < '0' || s[i + 1] > '9')
                return false;
            prev_digit = false;
        } else if (ch == '.' && part == 0) {
            buf[k++] = ch;
            part = 1;
            prev_digit = false;
        } else if ((ch == 'e' || ch == 'E') && part < 2 && digits) {
            buf[k++] = 'e';
            part = 2;
            prev_digit = false;
            digits = false;
            if (i + 1 < b && (s[i + 1] == '+' || s[i + 1] == '-'))
                buf[k++] = s[++i];
        } else {
            return false;
        }
    }
    if (!digits)
        return false;
    buf[k] = '\0';
    *out = strtod(buf, NULL);
    return true;
}

/* Runs test `name` on v with extra args (select / reject and friends). */

/* select / reject / selectattr / rejectattr. */


static int do_tojson(struct jj_ctx *c, int line, struct jj_val v,
                     const struct jj_val *args, size_t nargs,
                     const char *const *kwnames, const struct jj_val *kwvals,
                     size_t nkw, struct jj_val *out)
{
    int rc;
    BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    struct jj_json_opts o = {0};
    o.ensure_ascii = hv[0] && jj_truthy(p[0]);
    o.sort_keys = hv[3] && jj_truthy(p[3]);
    char spaces[256];
    if (hv[1] && p[1].t != JJ_NONE) {
        o.indent_set = true;
        if (p[1].t == JJ_STR) {
            o.indent = p[1].u.s->s;
            o.indent_len = p[1].u.s->len;
        } else if (jj_is_intlike(p[1])) {
            int64_t k = jj_as_int(p[1]);
            if (k > (int64_t)sizeof spaces)
                return jj_fail(c, line, TG_EUNSUPPORTED,
                               "unsupported: tojson indent above %zu",
                               sizeof spaces);
            o.indent_len = k > 0 ? (size_t)k : 0;
            memset(spaces, ' ', o.indent_len);
            o.indent = spaces;
        } else {
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: can't multiply sequence by "
                           "non-int of type '%s'",
                           jj_type_name(p[1]));
        }
    }
    o.item_sep = o.indent_set ? "," : ", ";
    o.key_sep = ": ";
    if (hv[2] && p[2].t != JJ_NONE) {
        if (p[2].t != JJ_LIST || p[2].u.l->n != 2 ||
            p[2].u.l->v[0].t != JJ_STR || p[2].u.l->v[1].t != JJ_STR)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: tojson separators must be a pair of "
                           "strings");
        o.item_sep = p[2].u.l->v[0].u.s->s;
        o.key_sep = p[2].u.l->v[1].u.s->s;
        o.item_sep_len = p[2].u.l->v[0].u.s->len;
        o.key_sep_len = p[2].u.l->v[1].u.s->len;
    } else {
        o.item_sep_len = strlen(o.item_sep);
        o.key_sep_len = strlen(o.key_sep);
    }
    struct tg_buf b = {0};
    rc = jj_json_dumps(c, line, v, &o, &b);
    if (rc) {
        tg_buf_free(&b);
        return rc;
    }
    return jj_buf_to_val(c, line, &b, out);
}

static int do_indent(struct jj_ctx *c, int line, struct jj_val v,
                     const struct jj_val *args, size_t nargs,
                     const char *const *kwnames, const struct jj_val *kwvals,
                     size_t nkw, struct jj_val *out)
{
    int rc;
    BIND("indent", "width", "first", "blank");
    struct tg_buf ind = {0};
    if (hv[0] && p[0].t == JJ_STR) {
        rc = tg_buf_append(&ind, p[0].u.s->s, p[0].u.s->len);
    } else {
        int64_t w = hv[0] ? (jj_is_intlike(p[0]) ? jj_as_int(p[0]) : -1) : 4;
        if (hv[0] && !jj_is_intlike(p[0]))
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: can't multiply sequence by non-int");
        if (w > 4096)
            return jj_fail(c, line, TG_EUNSUPPORTED,
                           "unsupported: indent width above 4096");
        rc = 0;
        for (int64_t i = 0; i < w && rc == 0; i++)
            rc = tg_buf_putc(&ind, ' ');
    }
    if (rc)
        return jj_oom(c, line);
    bool first = hv[1] && jj_truthy(p[1]);
    bool blank = hv[2] && jj_truthy(p[2]);
    struct jj_val s, withnl, lines;
    if ((rc = soft_str(c, line, v, &s))) {
        tg_buf_free(&ind);
        return rc;
    }
    if (s.u.s->markup) {
        jj_unref(s);
        tg_buf_free(&ind);
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: indent of a Markup string");
    }
    /* s += "\n" then splitlines (the quirk Jinja relies on) */
    struct tg_buf t = {0};
    if (tg_buf_append(&t, s.u.s->s, s.u.s->len) || tg_buf_putc(&t, '\n')) {
        jj_unref(s);
        tg_buf_free(&ind);
        tg_buf_free(&t);
        return jj_oom(c, line);
    }
    jj_unref(s);
    if ((rc = jj_buf_to_val(c, line, &t, &withnl))) {
        tg_buf_free(&ind);
        return rc;
    }
    rc = jj_text_splitlines(c, line, withnl.u.s, false, &lines);
    jj_unref(withnl);
    if (rc) {
        tg_buf_free(&ind);
        return rc;
    }
    struct tg_buf r = {0};
    const struct jj_list *l = lines.u.l;
    int bad = 0;
    if (first)
        bad |= tg_buf_append(&r, tg_buf_str(&ind), ind.len);
    for (size_t i = 0; i < l->n; i++) {
        const struct jj_str *ln = l->v[i].u.s;
        if (i > 0) {
            bad |= tg_buf_putc(&r, '\n');
            if (blank || ln->len > 0)
                bad |= tg_buf_append(&r, tg_buf_str(&ind), ind.len);
        }
        bad |= tg_buf_append(&r, ln->s, ln->len);
    }
    jj_unref(lines);
    tg_buf_free(&ind);
    if (bad) {
        tg_buf_free(&r);
        return jj_oom(c, line);
    }
    return jj_buf_to_val(c, line, &r, out);
}

static int do_round(struct jj_ctx *c, int line, struct jj_val v,
                    const struct jj_val *args, size_t nargs,
                    const char *const *kwnames, const struct jj_val *kwvals,
                    size_t nkw, struct jj_val *out)
{
    int rc;
    BIND("round", "precision", "method");
    int64_t prec = hv[0] ? (jj_is_intlike(p[0]) ? jj_as_int(p[0]) : -999) : 0;
    const char *method = hv[1] && p[1].t == JJ_STR ? p[1].u.s->s : "common";
    if (hv[1] && p[1].t != JJ_STR)
        return jj_fail(c, line, TG_EINVAL,
                       "FilterArgumentError: method must be common, ceil or "
                       "floor");
    if (strcmp(method, "common") && strcmp(method, "ceil") &&
        strcmp(method, "floor"))
        return jj_fail(c, line, TG_EINVAL,
                       "FilterArgumentError: method must be common, ceil or "
                       "floor");
    if (prec == -999 || prec < 0 || prec > 300)
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: round precision other than 0..300");
    if (v.t == JJ_UNDEF)
        return jj_undef_error(c, line, v);
    if (!jj_is_intlike(v) && v.t != JJ_FLOAT)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: type %s doesn't define __round__ method",
                       jj_type_name(v));
    if (!strcmp(method, "common")) {
        if (jj_is_intlike(v)) {
            *out = jj_int(jj_as_int(v));
            return 0;
        }
        if (!isfinite(v.u.f)) {
            *out = v;
            return 0;
        }
        char buf[512];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, v.u.f);
        *out = jj_float(strtod(buf, NULL));
        return 0;
    }
    double scale = pow(10.0, (double)prec);
    double x = (jj_is_intlike(v) ? (double)jj_as_int(v) : v.u.f) * scale;
    if (!isfinite(x))
        return jj_fail(c, line, TG_EINVAL,
                       "OverflowError: cannot convert float infinity to "
                       "integer");
    double r = !strcmp(method, "ceil") ? ceil(x) : floor(x);
    *out = jj_float(r / scale);
    return 0;
}

/* first / last. */








static int do_center(struct jj_ctx *c, int line, struct jj_val v,
                     const struct jj_val *args, size_t nargs,
                     const char *const *kwnames, const struct jj_val *kwvals,
                     size_t nkw, struct jj_val *out)
{
    int rc;
    BIND("center", "width");
    int64_t width = hv[0] ? (jj_is_intlike(p[0]) ? jj_as_int(p[0]) : -1) : 80;
    if (hv[0] && !jj_is_intlike(p[0]))
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: integer argument expected");
    if (width > (int64_t)c->lim.max_output)
        return jj_fail(c, line, TG_ETOOBIG, "center width too large");
    struct jj_val s;
    if ((rc = soft_str(c, line, v, &s)))
        return rc;
    int64_t n = (int64_t)s.u.s->ncp;
    if (width <= n) {
        *out = s;
        return 0;
    }
    int64_t marg = width - n;
    int64_t left = marg / 2 + (marg & width & 1);
    struct tg_buf b = {0};
    int bad = 0;
    for (int64_t i = 0; i < left; i++)
        bad |= tg_buf_putc(&b, ' ');
    bad |= tg_buf_append(&b, s.u.s->s, s.u.s->len);
    for (int64_t i = 0; i < marg - left; i++)
        bad |= tg_buf_putc(&b, ' ');
    jj_unref(s);
    if (bad) {
        tg_buf_free(&b);
        return jj_oom(c, line);
    }
    return jj_buf_to_val(c, line, &b, out);
}

int jj_apply_filter(struct jj_ctx *c, struct jj_scope *sc, int line, int fid,
                    const char *name, struct jj_val v,
                    const struct jj_val *args, size_t nargs,
                    const char *const *kwnames, const struct jj_val *kwvals,
                    size_t nkw, struct jj_val *out)
{
    int rc = jj_step(c, line);
    if (rc)
        return rc;
    if (fid < 0)
        return jj_fail(c, line, TG_EUNSUPPORTED, "unsupported filter '%s'",
                       name);
    struct jj_val s;
    switch (fid) {
    case F_ABS: {
        NOARGS("abs");
        if (v.t == JJ_UNDEF)
            return jj_undef_error(c, line, v);
        if (jj_is_intlike(v)) {
            int64_t x = jj_as_int(v);
            if (x == INT64_MIN)
                return jj_fail(c, line, TG_EUNSUPPORTED,
                               "unsupported: integer result beyond 64 bits");
            *out = jj_int(x < 0 ? -x : x);
            return 0;
        }
        if (v.t == JJ_FLOAT) {
            *out = jj_float(fabs(v.u.f));
            return 0;
        }
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: bad operand type for abs(): '%s'",
                       jj_type_name(v));
    }
    case F_ATTR: {
        BIND("attr", "name");
        if (!hv[0])
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: attr() missing 'name'");
        struct jj_val nm;
        if ((rc = soft_str(c, line, p[0], &nm)))
            return rc;
        if (v.t == JJ_DICT || v.t == JJ_STR || v.t == JJ_LIST) {
            rc = jj_method_lookup(c, line, v, nm.u.s, out);
            if (rc == 0)
                *out = jj_undef_named(nm.u.s, jj_type_name(v));
            rc = rc < 0 ? rc : 0;
        } else if (v.t == JJ_NS || v.t == JJ_LOOP) {
            rc = jj_getattr(c, line, v, nm.u.s, out);
        } else if (v.t == JJ_UNDEF) {
            rc = jj_undef_error(c, line, v);
        } else {
            *out = jj_undef_named(nm.u.s, jj_type_name(v));
        }
        jj_unref(nm);
        return rc;
    }
    case F_CAPITALIZE:
    case F_LOWER:
    case F_UPPER:
    case F_TITLE: {
        NOARGS(name);
        if ((rc = soft_str(c, line, v, &s)))
            return rc;
        if (s.u.s->markup && fid != F_LOWER && fid != F_UPPER) {
            jj_unref(s);
            return jj_fail(c, line, TG_EUNSUPPORTED,
                           "unsupported: %s of a Markup string", name);
        }
        rc = jj_text_case(c, line, s.u.s,
                          fid == F_CAPITALIZE ? JJ_CASE_CAPITALIZE
                          : fid == F_LOWER    ? JJ_CASE_LOWER
                          : fid == F_UPPER    ? JJ_CASE_UPPER
                                              : JJ_CASE_JTITLE,
                          out);
        jj_unref(s);
        return rc;
    }
    case F_CENTER:
        return do_center(c, line, v, args, nargs, kwnames, kwvals, nkw, out);
    case F_DEFAULT: {
        BIND("default", "default_value", "boolean");
        bool use = v.t == JJ_UNDEF || (hv[1] && jj_truthy(p[1]) &&
                                       !jj_truthy(v));
        if (use) {
            if (hv[0]) {
                *out = p[0];
                jj_ref(*out);
                return 0;
            }
            return jj_make_str(c, line, "", 0, out);
        }
        *out = v;
        jj_ref(v);
        return 0;
    }
    case F_DICTSORT:
        return jj__f_do_dictsort(c, line, v, args, nargs, kwnames, kwvals, nkw,
                           out);
    case F_ESCAPE:
    case F_FORCEESCAPE: {
        NOARGS(name);
        if (fid == F_ESCAPE && v.t == JJ_STR && v.u.s->markup) {
            *out = v;
            jj_ref(v);
            return 0;
        }
        if ((rc = soft_str(c, line, v, &s)))
            return rc;
        rc = jj_text_escape(c, line, s.u.s, out);
        jj_unref(s);
        return rc;
    }
    case F_FIRST:
    case F_LAST: {
        NOARGS(name);
        return jj__f_do_first_last(c, line, v, fid == F_LAST, out);
    }
    case F_FLOAT: {
        BIND("float", "default");
        struct jj_val dflt = hv[0] ? p[0] : jj_float(0.0);
        double f;
        if (v.t == JJ_UNDEF)
            return jj_undef_error(c, line, v);
        if (v.t == JJ_FLOAT) {
            *out = v;
            return 0;
        }
        if (jj_is_intlike(v)) {
            *out = jj_float((double)jj_as_int(v));
            return 0;
        }
        if (v.t == JJ_STR && parse_py_float(v.u.s->s, v.u.s->len, &f)) {
            *out = jj_float(f);
            return 0;
        }
        *out = dflt;
        jj_ref(dflt);
        return 0;
    }
    case F_INDENT:
        return do_indent(c, line, v, args, nargs, kwnames, kwvals, nkw, out);
    case F_INT: {
        BIND("int", "default", "base");
        struct jj_val dflt = hv[0] ? p[0] : jj_int(0);
        int64_t base = hv[1] ? (jj_is_intlike(p[1]) ? jj_as_int(p[1]) : -1) : 10;
        if (v.t == JJ_UNDEF)
            return jj_undef_error(c, line, v);
        if (jj_is_intlike(v)) {
            *out = jj_int(jj_as_int(v));
            return 0;
        }
        if (v.t == JJ_FLOAT) {
            if (isnan(v.u.f)) {
                jj_ref(dflt);
                *out = dflt;
                return 0;
            }
            if (isinf(v.u.f))
                return jj_fail(c, line, TG_EINVAL,
                               "OverflowError: cannot convert float infinity "
                               "to integer");
            if (fabs(v.u.f) >= 9.2e18)
                return jj_fail(c, line, TG_EUNSUPPORTED,
                               "unsupported: integer result beyond 64 bits");
            *out = jj_int((int64_t)v.u.f);
            return 0;
        }
        if (v.t == JJ_STR) {
            int64_t i;
            bool ovf;
            if (base >= 2 && base <= 36 &&
                parse_py_int(v.u.s->s, v.u.s->len, (int)base, &i, &ovf)) {
                if (ovf)
                    return jj_fail(c, line, TG_EUNSUPPORTED,
                                   "unsupported: integer beyond 64 bits");
                *out = jj_int(i);
                return 0;
            }
            if (base == 0 &&
                parse_py_int(v.u.s->s, v.u.s->len, 0, &i, &ovf) && !ovf) {
                *out = jj_int(i);
                return 0;
            }
            double f;
            if (parse_py_float(v.u.s->s, v.u.s->len, &f) && isfinite(f)) {
                if (fabs(f) >= 9.2e18)
                    return jj_fail(c, line, TG_EUNSUPPORTED,
                                   "unsupported: integer beyond 64 bits");
                *out = jj_int((int64_t)f);
                return 0;
            }
        }
        jj_ref(dflt);
        *out = dflt;
        return 0;
    }
    case F_ITEMS: {
        NOARGS("items");
        struct jj_list *l = jj_list_new(v.t == JJ_DICT ? v.u.d->n : 0,
                                        JJ_SEQ_LIST);
        if (l == NULL)
            return jj_oom(c, line);
        if (v.t == JJ_DICT) {
            for (size_t i = 0; i < v.u.d->n; i++) {
                struct jj_list *t = jj_list_new(2, JJ_SEQ_TUPLE);
                if (t == NULL) {
                    jj_unref(jj_list_val(l));
                    return jj_oom(c, line);
                }
                jj_ref(v.u.d->k[i]);
                jj_ref(v.u.d->v[i]);
                t->v[0] = v.u.d->k[i];
                t->v[1] = v.u.d->v[i];
                t->n = 2;
                l->v[l->n++] = jj_list_val(t);
            }
        } else if (v.t != JJ_UNDEF) {
            jj_unref(jj_list_val(l));
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: Can only get item pairs from a "
                           "mapping.");
        }
        return jj__f_make_iter(c, line, l, out);
    }
    case F_JOIN:
        return jj__f_do_join(c, line, v, args, nargs, kwnames, kwvals, nkw, out);
    case F_LENGTH: {
        NOARGS(name);
        int64_t n;
        if ((rc = jj_len(c, line, v, &n)))
            return rc;
        *out = jj_int(n);
        return 0;
    }
    case F_LIST: {
        NOARGS("list");
        struct jj_list *items;
        if ((rc = jj_iterate(c, line, v, &items)))
            return rc;
        struct jj_list *r = jj_list_new(items->n, JJ_SEQ_LIST);
        if (r == NULL) {
            jj_unref(jj_list_val(items));
            return jj_oom(c, line);
        }
        for (size_t i = 0; i < items->n; i++) {
            jj_ref(items->v[i]);
            r->v[r->n++] = items->v[i];
        }
        jj_unref(jj_list_val(items));
        *out = jj_list_val(r);
        return 0;
    }
    case F_MAP:
        return jj__f_do_map(c, sc, line, v, args, nargs, kwnames, kwvals, nkw, out);
    case F_MAX:
    case F_MIN:
        return jj__f_do_minmax(c, line, v, fid == F_MAX, args, nargs, kwnames,
                         kwvals, nkw, out);
    case F_REJECT:
    case F_SELECT:
    case F_REJECTATTR:
    case F_SELECTATTR:
        return jj__f_select_reject(c, sc, line, v, args, nargs, kwnames, kwvals,
                             nkw, fid == F_REJECTATTR || fid == F_SELECTATTR,
                             fid == F_SELECT || fid == F_SELECTATTR, out);
    case F_REPLACE: {
        BIND("replace", "old", "new", "count");
        if (!hv[0] || !hv[1])
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: replace() missing required arguments");
        struct jj_val old, nw;
        int64_t count = hv[2] && p[2].t != JJ_NONE
                            ? (jj_is_intlike(p[2]) ? jj_as_int(p[2]) : -2)
                            : -1;
        if (count == -2)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: replace() count must be an integer");
        if ((rc = jj_to_str(c, line, v, &s)))
            return rc;
        if (s.u.s->markup) {
            jj_unref(s);
            return jj_fail(c, line, TG_EUNSUPPORTED,
                           "unsupported: replace on a Markup string");
        }
        if ((rc = jj_to_str(c, line, p[0], &old))) {
            jj_unref(s);
            return rc;
        }
        if ((rc = jj_to_str(c, line, p[1], &nw)) == 0) {
            rc = jj_text_replace(c, line, s.u.s, old.u.s, nw.u.s, count, out);
            jj_unref(nw);
        }
        jj_unref(old);
        jj_unref(s);
        return rc;
    }
    case F_REVERSE: {
        NOARGS("reverse");
        return jj__f_do_reverse(c, line, v, out);
    }
    case F_ROUND:
        return do_round(c, line, v, args, nargs, kwnames, kwvals, nkw, out);
    case F_SAFE: {
        NOARGS("safe");
        if ((rc = soft_str(c, line, v, &s)))
            return rc;
        if (s.u.s->markup) {
            *out = s;
            return 0;
        }
        rc = jj_make_str(c, line, s.u.s->s, s.u.s->len, out);
        if (rc == 0)
            out->u.s->markup = 1;
        jj_unref(s);
        return rc;
    }
    case F_SORT:
        return jj__f_do_sort(c, line, v, args, nargs, kwnames, kwvals, nkw, out);
    case F_STRING: {
        NOARGS("string");
        return soft_str(c, line, v, out);
    }
    case F_SUM:
        return jj__f_do_sum(c, line, v, args, nargs, kwnames, kwvals, nkw, out);
    case F_TOJSON:
        return do_tojson(c, line, v, args, nargs, kwnames, kwvals, nkw, out);
    case F_TRIM: {
        BIND("trim", "chars");
        if (hv[0] && p[0].t != JJ_NONE && p[0].t != JJ_STR)
            return jj_fail(c, line, TG_EINVAL,
                           "TypeError: strip arg must be None or str");
        if ((rc = soft_str(c, line, v, &s)))
            return rc;
        rc = jj_text_strip(c, line, s.u.s,
                           hv[0] && p[0].t == JJ_STR ? p[0].u.s : NULL,
                           JJ_STRIP_BOTH, out);
        jj_unref(s);
        return rc;
    }
    case F_UNIQUE:
        return jj__f_do_unique(c, line, v, args, nargs, kwnames, kwvals, nkw, out);
    default:
        return jj_fail(c, line, TG_EUNSUPPORTED, "unsupported filter '%s'",
                       name);
    }
}

