/* jj_pystr.c — Python's text forms of values (jj_internal.h): str() and
 * repr() as CPython 3.11 prints them (float repr is the shortest string
 * that round-trips, switching to exponent form below 1e-4 and from 1e16;
 * string repr picks its quotes and escapes as unicode_repr does), and
 * json.dumps with transformers' tojson arguments (ensure_ascii, indent,
 * separators, sort_keys) as Lib/json/encoder.py formats. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"

/* ---- float repr ------------------------------------------------------------ */

/* Splits "%.*e" output into digits (no dot) and the decimal exponent. */
static void split_e(const char *t, char *digits, size_t *nd, int *exp10)
{
    size_t k = 0;
    const char *p = t;
    if (*p == '-')
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[k++] = *p;
    digits[k] = '\0';
    *nd = k;
    *exp10 = *p == 'e' ? atoi(p + 1) : 0;
}

/* Adds delta (+1 / -1) to the decimal digit string, keeping its length;
 * returns false on carry out or borrow out. */
static bool bump(char *d, size_t n, int delta)
{
    for (size_t i = n; i-- > 0;) {
        int v = d[i] - '0' + delta;
        if (v >= 0 && v <= 9) {
            d[i] = (char)('0' + v);
            return !(i == 0 && v == 0);
        }
        d[i] = delta > 0 ? '0' : '9';
    }
    return false;
}

static bool round_trips(const char *digits, size_t nd, int exp10, bool neg,
                        double f)
{
    char t[64];
    snprintf(t, sizeof t, "%s%c.%se%d", neg ? "-" : "", digits[0],
             nd > 1 ? digits + 1 : "0", exp10);
    return strtod(t, NULL) == f;
}

void jj_float_repr(double f, char *buf, size_t cap)
{
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f > 0 ? "inf" : "-inf");
        return;
    }
    if (f == 0.0) {
        snprintf(buf, cap, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    bool neg = f < 0;
    char digits[40];
    size_t nd = 0;
    int exp10 = 0;
    for (int prec = 1; prec <= 17; prec++) {
        char t[64];
        snprintf(t, sizeof t, "%.*e", prec - 1, f);
        split_e(t, digits, &nd, &exp10);
        if (strtod(t, NULL) == f)
            break;
        /* next to a power of two the rounding interval is asymmetric: a
         * neighbouring decimal of the same length may round-trip */
        char alt[40];
        bool found = false;
        for (int delta = -1; delta <= 1 && !found; delta += 2) {
            memcpy(alt, digits, nd + 1);
            if (bump(alt, nd, delta) && round_trips(alt, nd, exp10, neg, f)) {
                memcpy(digits, alt, nd + 1);
                found = true;
            }
        }
        if (found)
            break;
    }
    while (nd > 1 && digits[nd - 1] == '0')
        digits[--nd] = '\0';
    int decpt = exp10 + 1;
    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (decpt > 16 || decpt < -3) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, nd - 1);
            o += nd - 1;
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d",
                              exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (decpt <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -decpt; i++)
            out[o++] = '0';
        memcpy(out + o, digits, nd);
        o += nd;
    } else if ((size_t)decpt >= nd) {
        memcpy(out + o, digits, nd);
        o += nd;
        for (size_t i = nd; i < (size_t)decpt; i++)
            out[o++] = '0';
        out[o++] = '.';
        out[o++] = '0';
    } else {
        memcpy(out + o, digits, (size_t)decpt);
        o += (size_t)decpt;
        out[o++] = '.';
        memcpy(out + o, digits + decpt, nd - (size_t)decpt);
        o += nd - (size_t)decpt;
    }
    out[o] = '\0';
    snprintf(buf, cap, "%s", out);
}

/* ---- str / repr ------------------------------------------------------------ */

static bool py_printable(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 0x20 && cp < 0x7f;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static int str_repr(const struct jj_str *s, struct tg_buf *b)
{
    bool has_sq = memchr(s->s, '\'', s->len) != NULL;
    bool has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    int rc = tg_buf_putc(b, q);
    for (size_t i = 0; i < s->len && rc == 0;) {
        size_t adv;
        uint32_t cp = jj_utf8_next(s->s + i, s->len - i, &adv);
        if (cp == (uint32_t)q || cp == '\\') {
            rc = tg_buf_putc(b, '\\') || tg_buf_putc(b, (char)cp);
        } else if (cp == '\t') {
            rc = tg_buf_append(b, "\\t", 2);
        } else if (cp == '\n') {
            rc = tg_buf_append(b, "\\n", 2);
        } else if (cp == '\r') {
            rc = tg_buf_append(b, "\\r", 2);
        } else if (cp < 0x20 || cp == 0x7f) {
            rc = tg_buf_printf(b, "\\x%02x", cp);
        } else if (cp < 0x7f || py_printable(cp)) {
            rc = tg_buf_append(b, s->s + i, adv);
        } else if (cp <= 0xff) {
            rc = tg_buf_printf(b, "\\x%02x", cp);
        } else if (cp <= 0xffff) {
            rc = tg_buf_printf(b, "\\u%04x", cp);
        } else {
            rc = tg_buf_printf(b, "\\U%08x", cp);
        }
        i += adv;
    }
    if (rc == 0)
        rc = tg_buf_putc(b, q);
    return rc ? TG_ENOMEM : 0;
}

static int seq_repr(struct jj_ctx *c, int line, const struct jj_list *l,
                    struct tg_buf *b)
{
    static const char *const prefix[] = {"[", "(", "dict_items([",
                                         "dict_keys([", "dict_values([",
                                         ""};
    static const char *const suffix[] = {"]", ")", "])", "])", "])", ""};
    int rc;
    if (l->seq == JJ_SEQ_RANGE) {
        if (l->r_step == 1)
            rc = tg_buf_printf(b, "range(%lld, %lld)", (long long)l->r_start,
                               (long long)l->r_stop);
        else
            rc = tg_buf_printf(b, "range(%lld, %lld, %lld)",
                               (long long)l->r_start, (long long)l->r_stop,
                               (long long)l->r_step);
        return rc ? jj_oom(c, line) : 0;
    }
    if (tg_buf_append(b, prefix[l->seq], strlen(prefix[l->seq])))
        return jj_oom(c, line);
    for (size_t i = 0; i < l->n; i++) {
        if (i > 0 && tg_buf_append(b, ", ", 2))
            return jj_oom(c, line);
        if ((rc = jj_pystr(c, line, l->v[i], true, b)))
            return rc;
        if (b->len > c->lim.max_output)
            return jj_fail(c, line, TG_ETOOBIG,
                           "a value's text exceeds the output limit of %zu "
                           "bytes",
                           c->lim.max_output);
    }
    if (l->seq == JJ_SEQ_TUPLE && l->n == 1 && tg_buf_putc(b, ','))
        return jj_oom(c, line);
    if (tg_buf_append(b, suffix[l->seq], strlen(suffix[l->seq])))
        return jj_oom(c, line);
    return 0;
}

static int dict_repr(struct jj_ctx *c, int line, const struct jj_dict *d,
                     struct tg_buf *b)
{
    if (tg_buf_putc(b, '{'))
        return jj_oom(c, line);
    for (size_t i = 0; i < d->n; i++) {
        int rc;
        if (i > 0 && tg_buf_append(b, ", ", 2))
            return jj_oom(c, line);
        if ((rc = jj_pystr(c, line, d->k[i], true, b)))
            return rc;
        if (tg_buf_append(b, ": ", 2))
            return jj_oom(c, line);
        if ((rc = jj_pystr(c, line, d->v[i], true, b)))
            return rc;
        if (b->len > c->lim.max_output)
            return jj_fail(c, line, TG_ETOOBIG,
                           "a value's text exceeds the output limit of %zu "
                           "bytes",
                           c->lim.max_output);
    }
    if (tg_buf_putc(b, '}'))
        return jj_oom(c, line);
    return 0;
}

int jj_pystr(struct jj_ctx *c, int line, struct jj_val v, bool repr,
             struct tg_buf *b)
{
    int rc = 0;
    char tmp[64];
    switch (v.t) {
    case JJ_UNDEF:
        if (repr)
            rc = tg_buf_append(b, "Undefined", 9);
        break;
    case JJ_NONE: rc = tg_buf_append(b, "None", 4); break;
    case JJ_BOOL:
        rc = v.u.b ? tg_buf_append(b, "True", 4) : tg_buf_append(b, "False", 5);
        break;
    case JJ_INT: rc = tg_buf_printf(b, "%lld", (long long)v.u.i); break;
    case JJ_FLOAT:
        jj_float_repr(v.u.f, tmp, sizeof tmp);
        rc = tg_buf_append(b, tmp, strlen(tmp));
        break;
    case JJ_STR:
        if (!repr) {
            rc = tg_buf_append(b, v.u.s->s, v.u.s->len);
        } else if (v.u.s->markup) {
            rc = tg_buf_append(b, "Markup(", 7) || str_repr(v.u.s, b) ||
                 tg_buf_putc(b, ')');
        } else {
            rc = str_repr(v.u.s, b);
        }
        break;
    case JJ_LIST:
        return seq_repr(c, line, v.u.l, b);
    case JJ_DICT:
        return dict_repr(c, line, v.u.d, b);
    case JJ_NS:
        if (tg_buf_append(b, "<Namespace ", 11))
            return jj_oom(c, line);
        if ((rc = dict_repr(c, line, v.u.ns->attrs, b)))
            return rc;
        rc = tg_buf_putc(b, '>');
        break;
    case JJ_FUNC:
        if (v.u.fn->kind == JJ_FN_MACRO) {
            rc = tg_buf_printf(b, "<Macro '%s'>", v.u.fn->name);
            break;
        }
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: printing the function '%s' (Python "
                       "prints its memory address)",
                       v.u.fn->name);
    case JJ_LOOP:
        rc = tg_buf_printf(b, "<LoopContext %zu/%zu>", v.u.lp->i + 1,
                           v.u.lp->items->n);
        break;
    default:
        return jj_fail(c, line, TG_EUNSUPPORTED,
                       "unsupported: printing a %s object (Python prints "
                       "its memory address)",
                       jj_type_name(v));
    }
    return rc ? jj_oom(c, line) : 0;
}

int jj_to_str(struct jj_ctx *c, int line, struct jj_val v, struct jj_val *out)
{
    if (v.t == JJ_STR) {
        jj_ref(v);
        *out = v;
        return 0;
    }
    struct tg_buf b = {0};
    int rc = jj_pystr(c, line, v, false, &b);
    if (rc) {
        tg_buf_free(&b);
        return rc;
    }
    return jj_buf_to_val(c, line, &b, out);
}

/* ---- json.dumps -------------------------------------------------------------- */

static int jstr(const struct jj_str *s, bool ascii, struct tg_buf *b)
{
    int rc = tg_buf_putc(b, '"');
    for (size_t i = 0; i < s->len && rc == 0;) {
        size_t adv;
        uint32_t cp = jj_utf8_next(s->s + i, s->len - i, &adv);
        switch (cp) {
        case '"': rc = tg_buf_append(b, "\\\"", 2); break;
        case '\\': rc = tg_buf_append(b, "\\\\", 2); break;
        case '\n': rc = tg_buf_append(b, "\\n", 2); break;
        case '\r': rc = tg_buf_append(b, "\\r", 2); break;
        case '\t': rc = tg_buf_append(b, "\\t", 2); break;
        case '\b': rc = tg_buf_append(b, "\\b", 2); break;
        case '\f': rc = tg_buf_append(b, "\\f", 2); break;
        default:
            if (cp < 0x20 || (ascii && cp >= 0x7f)) {
                if (cp > 0xffff) {
                    uint32_t v = cp - 0x10000;
                    rc = tg_buf_printf(b, "\\u%04x\\u%04x", 0xd800 | (v >> 10),
                                       0xdc00 | (v & 0x3ff));
                } else {
                    rc = tg_buf_printf(b, "\\u%04x", cp);
                }
            } else {
                rc = tg_buf_append(b, s->s + i, adv);
            }
            break;
        }
        i += adv;
    }
    if (rc == 0)
        rc = tg_buf_putc(b, '"');
    return rc;
}

static int json_float(double f, struct tg_buf *b)
{
    if (isnan(f))
        return tg_buf_append(b, "NaN", 3);
    if (isinf(f))
        return f > 0 ? tg_buf_append(b, "Infinity", 8)
                     : tg_buf_append(b, "-Infinity", 9);
    char tmp[64];
    jj_float_repr(f, tmp, sizeof tmp);
    return tg_buf_append(b, tmp, strlen(tmp));
}

static int newline_indent(const struct jj_json_opts *o, int level,
                          struct tg_buf *b)
{
    if (tg_buf_putc(b, '\n'))
        return TG_ENOMEM;
    for (int i = 0; i < level; i++)
        if (tg_buf_append(b, o->indent, o->indent_len))
            return TG_ENOMEM;
    return 0;
}

static int dumps(struct jj_ctx *c, int line, struct jj_val v,
                 const struct jj_json_opts *o, int level, struct tg_buf *b);

/* A dict key as json.dumps converts it. */
static int json_key(struct jj_ctx *c, int line, struct jj_val k,
                    const struct jj_json_opts *o, struct tg_buf *b)
{
    switch (k.t) {
    case JJ_STR:
        return jstr(k.u.s, o->ensure_ascii, b) ? jj_oom(c, line) : 0;
    case JJ_BOOL:
        return tg_buf_append(b, k.u.b ? "\"true\"" : "\"false\"", k.u.b ? 6 : 7)
                   ? jj_oom(c, line)
                   : 0;
    case JJ_NONE: return tg_buf_append(b, "\"null\"", 6) ? jj_oom(c, line) : 0;
    case JJ_INT:
        return tg_buf_printf(b, "\"%lld\"", (long long)k.u.i) ? jj_oom(c, line)
                                                              : 0;
    case JJ_FLOAT:
        if (tg_buf_putc(b, '"') || json_float(k.u.f, b) || tg_buf_putc(b, '"'))
            return jj_oom(c, line);
        return 0;
    default:
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: keys must be str, int, float, bool or "
                       "None, not %s",
                       jj_type_name(k));
    }
}

static int dumps_dict(struct jj_ctx *c, int line, const struct jj_dict *d,
                      const struct jj_json_opts *o, int level, struct tg_buf *b)
{
    if (d->n == 0)
        return tg_buf_append(b, "{}", 2) ? jj_oom(c, line) : 0;
    size_t *order = malloc(d->n * sizeof(*order));
    if (order == NULL)
        return jj_oom(c, line);
    for (size_t i = 0; i < d->n; i++)
        order[i] = i;
    int rc = 0;
    if (o->sort_keys) {
        /* insertion sort by key (stable; dicts in templates are small) */
        for (size_t i = 1; i < d->n && rc == 0; i++) {
            size_t x = order[i], j = i;
            while (j > 0) {
                int r;
                if ((rc = jj_cmp3(c, line, d->k[order[j - 1]], d->k[x], &r)))
                    break;
                if (r <= 0)
                    break;
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
    }
    if (rc == 0 && tg_buf_putc(b, '{'))
        rc = jj_oom(c, line);
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        size_t k = order[i];
        if (i > 0 && tg_buf_append(b, o->item_sep, o->item_sep_len)) {
            rc = jj_oom(c, line);
            break;
        }
        if (o->indent_set && newline_indent(o, level + 1, b)) {
            rc = jj_oom(c, line);
            break;
        }
        if ((rc = json_key(c, line, d->k[k], o, b)))
            break;
        if (tg_buf_append(b, o->key_sep, o->key_sep_len)) {
            rc = jj_oom(c, line);
            break;
        }
        rc = dumps(c, line, d->v[k], o, level + 1, b);
    }
    free(order);
    if (rc)
        return rc;
    if (o->indent_set && newline_indent(o, level, b))
        return jj_oom(c, line);
    return tg_buf_putc(b, '}') ? jj_oom(c, line) : 0;
}

static int dumps(struct jj_ctx *c, int line, struct jj_val v,
                 const struct jj_json_opts *o, int level, struct tg_buf *b)
{
    int rc;
    if ((rc = jj_step(c, line)))
        return rc;
    if (b->len > c->lim.max_output)
        return jj_fail(c, line, TG_ETOOBIG,
                       "tojson output exceeds the output limit of %zu bytes",
                       c->lim.max_output);
    if (level > 1000)
        return jj_fail(c, line, TG_ETOOBIG, "tojson: value nested too deeply");
    switch (v.t) {
    case JJ_NONE: rc = tg_buf_append(b, "null", 4); break;
    case JJ_BOOL:
        rc = v.u.b ? tg_buf_append(b, "true", 4) : tg_buf_append(b, "false", 5);
        break;
    case JJ_INT: rc = tg_buf_printf(b, "%lld", (long long)v.u.i); break;
    case JJ_FLOAT:
        rc = json_float(v.u.f, b);
        break;
    case JJ_STR:
        rc = jstr(v.u.s, o->ensure_ascii, b);
        break;
    case JJ_DICT:
        return dumps_dict(c, line, v.u.d, o, level, b);
    case JJ_LIST: {
        const struct jj_list *l = v.u.l;
        if (l->seq != JJ_SEQ_LIST && l->seq != JJ_SEQ_TUPLE)
            break;
        if (l->n == 0)
            return tg_buf_append(b, "[]", 2) ? jj_oom(c, line) : 0;
        if (tg_buf_putc(b, '['))
            return jj_oom(c, line);
        for (size_t i = 0; i < l->n; i++) {
            if (i > 0 && tg_buf_append(b, o->item_sep, o->item_sep_len))
                return jj_oom(c, line);
            if (o->indent_set && newline_indent(o, level + 1, b))
                return jj_oom(c, line);
            if ((rc = dumps(c, line, l->v[i], o, level + 1, b)))
                return rc;
        }
        if (o->indent_set && newline_indent(o, level, b))
            return jj_oom(c, line);
        return tg_buf_putc(b, ']') ? jj_oom(c, line) : 0;
    }
    case JJ_UNDEF:
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: Object of type Undefined is not JSON "
                       "serializable");
    default:
        break;
    }
    if (v.t == JJ_LIST || v.t == JJ_NS || v.t == JJ_FUNC || v.t == JJ_ITER ||
        v.t == JJ_LOOP)
        return jj_fail(c, line, TG_EINVAL,
                       "TypeError: Object of type %s is not JSON "
                       "serializable",
                       jj_type_name(v));
    return rc ? jj_oom(c, line) : 0;
}

int jj_json_dumps(struct jj_ctx *c, int line, struct jj_val v,
                  const struct jj_json_opts *o, struct tg_buf *b)
{
    return dumps(c, line, v, o, 0, b);
}
