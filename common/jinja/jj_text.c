/* jj_text.c — UTF-8 and the Python str operations templates use
 * (jj_internal.h): whitespace as str.isspace() defines it, strip, case
 * mapping, replace, split, splitlines, find, count, slicing, and
 * markupsafe.escape. Semantics follow CPython 3.11's unicodeobject.c;
 * where Python applies a context-dependent or multi-character case mapping
 * (final sigma, U+00DF, ligatures, ...) that utf8proc's one-to-one mapping
 * cannot reproduce, the operation fails naming the character instead of
 * producing different text. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* ---- UTF-8 -------------------------------------------------------------- */

uint32_t jj_utf8_next(const char *s, size_t n, size_t *adv)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned char c = p[0];
    if (c < 0x80 || n < 2) {
        *adv = 1;
        return c;
    }
    if (c >= 0xC2 && c <= 0xDF && (p[1] & 0xC0) == 0x80) {
        *adv = 2;
        return ((uint32_t)(c & 0x1F) << 6) | (p[1] & 0x3F);
    }
    if (c >= 0xE0 && c <= 0xEF && n >= 3 && (p[1] & 0xC0) == 0x80 &&
        (p[2] & 0xC0) == 0x80) {
        uint32_t cp = ((uint32_t)(c & 0x0F) << 12) |
                      ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
        if (cp >= 0x800) {
            *adv = 3;
            return cp;
        }
    }
    if (c >= 0xF0 && c <= 0xF4 && n >= 4 && (p[1] & 0xC0) == 0x80 &&
        (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80) {
        uint32_t cp = ((uint32_t)(c & 0x07) << 18) |
                      ((uint32_t)(p[1] & 0x3F) << 12) |
                      ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
        if (cp >= 0x10000 && cp <= 0x10FFFF) {
            *adv = 4;
            return cp;
        }
    }
    *adv = 1;
    return c;
}

size_t jj_utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t jj_utf8_count(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t adv;
        if ((unsigned char)s[i] < 0x80)
            adv = 1;
        else
            jj_utf8_next(s + i, len - i, &adv);
        i += adv;
        n++;
    }
    return n;
}

size_t jj_utf8_offset(const struct jj_str *s, size_t cp)
{
    if (s->ascii)
        return cp < s->len ? cp : s->len;
    size_t i = 0;
    for (size_t k = 0; k < cp && i < s->len; k++) {
        size_t adv;
        jj_utf8_next(s->s + i, s->len - i, &adv);
        i += adv;
    }
    return i;
}

/* Python's str.isspace(): bidirectional class WS, B or S, or category Zs. */
bool jj_py_isspace(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- buffers ------------------------------------------------------------ */

int jj_buf_to_val(struct jj_ctx *c, int line, struct tg_buf *b,
                  struct jj_val *out)
{
    int rc = jj_make_str(c, line, tg_buf_str(b), b->len, out);
    tg_buf_free(b);
    return rc;
}

static int buf_cp(struct tg_buf *b, uint32_t cp)
{
    char tmp[4];
    return tg_buf_append(b, tmp, jj_utf8_put(cp, tmp));
}

/* ---- strip -------------------------------------------------------------- */

static bool in_chars(const struct jj_str *chars, uint32_t cp)
{
    for (size_t i = 0; i < chars->len;) {
        size_t adv;
        if (jj_utf8_next(chars->s + i, chars->len - i, &adv) == cp)
            return true;
        i += adv;
    }
    return false;
}

/* The bounds [*a, *b) of s[0..n) that the strip keeps: the characters of
 * `chars` (NULL: Python's whitespace) cut from the ends `how` names. */
static void strip_bounds(const char *s, size_t n, const struct jj_str *chars,
                         enum jj_strip how, size_t *pa, size_t *pb)
{
    size_t a = 0, b = n;
    if (how != JJ_STRIP_RIGHT) {
        while (a < b) {
            size_t adv;
            uint32_t cp = jj_utf8_next(s + a, b - a, &adv);
            if (chars ? !in_chars(chars, cp) : !jj_py_isspace(cp))
                break;
            a += adv;
        }
    }
    if (how != JJ_STRIP_LEFT) {
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80)
                p--;
            size_t adv;
            uint32_t cp = jj_utf8_next(s + p, b - p, &adv);
            if (adv != b - p ||
                (chars ? !in_chars(chars, cp) : !jj_py_isspace(cp)))
                break;
            b = p;
        }
    }
    *pa = a;
    *pb = b;
}

void jj_py_strip(const char *s, size_t n, size_t *a, size_t *b)
{
    strip_bounds(s, n, NULL, JJ_STRIP_BOTH, a, b);
}

int jj_text_strip(struct jj_ctx *c, int line, struct jj_str *s,
                  const struct jj_str *chars, enum jj_strip how,
                  struct jj_val *out)
{
    size_t a, b;
    strip_bounds(s->s, s->len, chars, how, &a, &b);
    if (a == 0 && b == s->len) {
        out->t = JJ_STR;
        out->u.s = s;
        jj_ref(*out);
        return 0;
    }
    int rc = jj_make_str(c, line, s->s + a, b - a, out);
    if (rc == 0)
        out->u.s->markup = s->markup;
    return rc;
}

/* ---- case mapping --------------------------------------------------------- */

/* Code points whose Python upper / title mapping is several characters
 * (SpecialCasing.txt, unconditional entries). */
static bool special_upper(uint32_t cp)
{
    return cp == 0xDF || cp == 0x149 || cp == 0x1F0 || cp == 0x390 ||
           cp == 0x3B0 || cp == 0x587 || (cp >= 0x1E96 && cp <= 0x1E9A) ||
           cp == 0x1F50 || cp == 0x1F52 || cp == 0x1F54 || cp == 0x1F56 ||
           (cp >= 0x1F80 && cp <= 0x1FAF) || (cp >= 0x1FB2 && cp <= 0x1FB4) ||
           cp == 0x1FB6 || cp == 0x1FB7 || cp == 0x1FBC ||
           (cp >= 0x1FC2 && cp <= 0x1FC4) || cp == 0x1FC6 || cp == 0x1FC7 ||
           cp == 0x1FCC || cp == 0x1FD2 || cp == 0x1FD3 || cp == 0x1FD6 ||
           cp == 0x1FD7 || (cp >= 0x1FE2 && cp <= 0x1FE4) || cp == 0x1FE6 ||
           cp == 0x1FE7 || (cp >= 0x1FF2 && cp <= 0x1FF4) || cp == 0x1FF6 ||
           cp == 0x1FF7 || cp == 0x1FFC || (cp >= 0xFB00 && cp <= 0xFB06) ||
           (cp >= 0xFB13 && cp <= 0xFB17);
}

/* U+0130 lowercases to two characters; U+03A3 depends on its context. */
static bool special_lower(uint32_t cp)
{
    return cp == 0x130 || cp == 0x3A3;
}

static bool is_cased(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL ||
           k == UTF8PROC_CATEGORY_LT;
}

static int case_fail(struct jj_ctx *c, int line, uint32_t cp)
{
    return jj_fail(c, line, TG_EUNSUPPORTED,
                   "unsupported: Python's case mapping of U+%04X is "
                   "several characters or depends on context",
                   (unsigned)cp);
}

static int map_lower(struct jj_ctx *c, int line, uint32_t cp, uint32_t *o)
{
    if (cp < 0x80) {
        *o = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
        return 0;
    }
    if (special_lower(cp))
        return case_fail(c, line, cp);
    *o = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
    return 0;
}

static int map_upper(struct jj_ctx *c, int line, uint32_t cp, uint32_t *o)
{
    if (cp < 0x80) {
        *o = cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
        return 0;
    }
    if (special_upper(cp))
        return case_fail(c, line, cp);
    *o = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp);
    return 0;
}

static int map_title(struct jj_ctx *c, int line, uint32_t cp, uint32_t *o)
{
    if (cp < 0x80)
        return map_upper(c, line, cp, o);
    if (special_upper(cp))
        return case_fail(c, line, cp);
    *o = (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp);
    return 0;
}

/* Jinja's title filter splits on runs of [-\s({\[<]. */
static bool jtitle_sep(uint32_t cp)
{
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' ||
           jj_py_isspace(cp);
}

int jj_text_case(struct jj_ctx *c, int line, struct jj_str *s,
                 enum jj_case how, struct jj_val *out)
{
    struct tg_buf b = {0};
    bool prev_cased = false, first = true, prev_sep = true;
    int rc = 0;
    for (size_t i = 0; i < s->len && rc == 0;) {
        size_t adv;
        uint32_t cp = jj_utf8_next(s->s + i, s->len - i, &adv), o = cp;
        i += adv;
        switch (how) {
        case JJ_CASE_LOWER:
            rc = map_lower(c, line, cp, &o);
            break;
        case JJ_CASE_UPPER:
            rc = map_upper(c, line, cp, &o);
            break;
        case JJ_CASE_TITLE:
            rc = prev_cased ? map_lower(c, line, cp, &o)
                            : map_title(c, line, cp, &o);
            prev_cased = is_cased(cp);
            break;
        case JJ_CASE_CAPITALIZE:
            rc = first ? map_title(c, line, cp, &o)
                       : map_lower(c, line, cp, &o);
            break;
        case JJ_CASE_SWAP: {
            utf8proc_category_t k =
                cp < 0x80 ? 0 : utf8proc_category((utf8proc_int32_t)cp);
            if ((cp >= 'A' && cp <= 'Z') || k == UTF8PROC_CATEGORY_LU)
                rc = map_lower(c, line, cp, &o);
            else if ((cp >= 'a' && cp <= 'z') || k == UTF8PROC_CATEGORY_LL)
                rc = map_upper(c, line, cp, &o);
            break;
        }
        case JJ_CASE_JTITLE: {
            bool sep = jtitle_sep(cp);
            if (sep)
                o = cp;
            else if (prev_sep)
                rc = map_upper(c, line, cp, &o);
            else
                rc = map_lower(c, line, cp, &o);
            prev_sep = sep;
            break;
        }
        }
        first = false;
        if (rc == 0 && buf_cp(&b, o))
            rc = jj_oom(c, line);
    }
    if (rc != 0) {
        tg_buf_free(&b);
        return rc;
    }
    rc = jj_buf_to_val(c, line, &b, out);
    if (rc == 0)
        out->u.s->markup = s->markup;
    return rc;
}

/* ---- replace / find / count ------------------------------------------- */

static const char *find_bytes(const char *h, size_t hn, const char *n,
                              size_t nn)
{
    if (nn == 0)
        return h;
    if (nn > hn)
        return NULL;
    return memmem(h, hn, n, nn);
}

int jj_text_replace(struct jj_ctx *c, int line, struct jj_str *s,
                    struct jj_str *old, struct jj_str *new_, int64_t count,
                    struct jj_val *out)
{
    struct tg_buf b = {0};
    int64_t done = 0;
    if (old->len == 0) {
        /* Python inserts `new` before every character and at the end */
        size_t i = 0;
        for (;;) {
            if (count < 0 || done < count) {
                if (tg_buf_append(&b, new_->s, new_->len))
                    goto oom;
                done++;
            } else {
                if (tg_buf_append(&b, s->s + i, s->len - i))
                    goto oom;
                break;
            }
            if (i >= s->len)
                break;
            size_t adv;
            jj_utf8_next(s->s + i, s->len - i, &adv);
            if (tg_buf_append(&b, s->s + i, adv))
                goto oom;
            i += adv;
            if (b.len > c->lim.max_output)
                break;
        }
    } else {
        size_t i = 0;
        while (i <= s->len) {
            const char *p = (count < 0 || done < count)
                                ? find_bytes(s->s + i, s->len - i, old->s,
                                             old->len)
                                : NULL;
            if (p == NULL) {
                if (tg_buf_append(&b, s->s + i, s->len - i))
                    goto oom;
                break;
            }
            size_t at = (size_t)(p - s->s);
            if (tg_buf_append(&b, s->s + i, at - i) ||
                tg_buf_append(&b, new_->s, new_->len))
                goto oom;
            i = at + old->len;
            done++;
            if (b.len > c->lim.max_output)
                break;
        }
    }
    return jj_buf_to_val(c, line, &b, out);
oom:
    tg_buf_free(&b);
    return jj_oom(c, line);
}

int64_t jj_text_find(const struct jj_str *s, const struct jj_str *sub,
                     bool right)
{
    const char *p = NULL;
    if (!right) {
        p = find_bytes(s->s, s->len, sub->s, sub->len);
    } else if (sub->len <= s->len) {
        for (size_t i = s->len - sub->len + 1; i-- > 0;)
            if (memcmp(s->s + i, sub->s, sub->len) == 0) {
                p = s->s + i;
                break;
            }
    }
    if (p == NULL)
        return -1;
    return (int64_t)jj_utf8_count(s->s, (size_t)(p - s->s));
}

int64_t jj_text_count(const struct jj_str *s, const struct jj_str *sub)
{
    if (sub->len == 0)
        return (int64_t)s->ncp + 1;
    int64_t n = 0;
    for (size_t i = 0; i + sub->len <= s->len;) {
        const char *p = find_bytes(s->s + i, s->len - i, sub->s, sub->len);
        if (p == NULL)
            break;
        n++;
        i = (size_t)(p - s->s) + sub->len;
    }
    return n;
}

/* ---- split -------------------------------------------------------------- */

static int push_piece(struct jj_ctx *c, int line, struct jj_list *l,
                      const char *s, size_t n)
{
    struct jj_val v;
    int rc = jj_make_str(c, line, s, n, &v);
    if (rc)
        return rc;
    if (jj_list_push(l, v)) {
        jj_unref(v);
        return jj_oom(c, line);
    }
    return 0;
}

/* Code point boundaries of s: offsets of each code point plus the end. */
static size_t *cp_offsets(const struct jj_str *s)
{
    size_t *off = malloc((s->ncp + 1) * sizeof(*off));
    if (off == NULL)
        return NULL;
    size_t i = 0, k = 0;
    while (i < s->len) {
        off[k++] = i;
        size_t adv;
        jj_utf8_next(s->s + i, s->len - i, &adv);
        i += adv;
    }
    off[k] = s->len;
    return off;
}

static void list_reverse(struct jj_list *l)
{
    for (size_t i = 0, j = l->n; i + 1 < j; i++, j--) {
        struct jj_val t = l->v[i];
        l->v[i] = l->v[j - 1];
        l->v[j - 1] = t;
    }
}

int jj_text_split(struct jj_ctx *c, int line, struct jj_str *s,
                  struct jj_str *sep, int64_t maxsplit, bool right,
                  struct jj_val *out)
{
    if (sep != NULL && sep->len == 0)
        return jj_fail(c, line, TG_EINVAL, "ValueError: empty separator");
    struct jj_list *l = jj_list_new(0, JJ_SEQ_LIST);
    if (l == NULL)
        return jj_oom(c, line);
    int rc = 0;
    int64_t splits = 0;
    if (sep == NULL) {
        size_t *off = cp_offsets(s);
        if (off == NULL) {
            jj_unref(jj_list_val(l));
            return jj_oom(c, line);
        }
        size_t n = s->ncp;
#define SP(k) jj_py_isspace(jj_utf8_next(s->s + off[k], s->len - off[k], &adv))
        size_t adv;
        if (!right) {
            size_t i = 0;
            while (rc == 0) {
                while (i < n && SP(i))
                    i++;
                if (i >= n)
                    break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    size_t e = n;
                    rc = push_piece(c, line, l, s->s + off[i],
                                    off[e] - off[i]);
                    break;
                }
                size_t j = i;
                while (j < n && !SP(j))
                    j++;
                rc = push_piece(c, line, l, s->s + off[i], off[j] - off[i]);
                splits++;
                i = j;
            }
        } else {
            size_t i = n;
            while (rc == 0) {
                while (i > 0 && SP(i - 1))
                    i--;
                if (i == 0)
                    break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    rc = push_piece(c, line, l, s->s, off[i]);
                    break;
                }
                size_t j = i;
                while (j > 0 && !SP(j - 1))
                    j--;
                rc = push_piece(c, line, l, s->s + off[j], off[i] - off[j]);
                splits++;
                i = j;
            }
            list_reverse(l);
        }
#undef SP
        free(off);
    } else if (!right) {
        size_t i = 0;
        for (;;) {
            const char *p = (maxsplit < 0 || splits < maxsplit)
                                ? find_bytes(s->s + i, s->len - i, sep->s,
                                             sep->len)
                                : NULL;
            if (p == NULL) {
                rc = push_piece(c, line, l, s->s + i, s->len - i);
                break;
            }
            size_t at = (size_t)(p - s->s);
            if ((rc = push_piece(c, line, l, s->s + i, at - i)))
                break;
            i = at + sep->len;
            splits++;
        }
    } else {
        size_t end = s->len;
        for (;;) {
            const char *p = NULL;
            if ((maxsplit < 0 || splits < maxsplit) && sep->len <= end)
                for (size_t k = end - sep->len + 1; k-- > 0;)
                    if (memcmp(s->s + k, sep->s, sep->len) == 0) {
                        p = s->s + k;
                        break;
                    }
            if (p == NULL) {
                rc = push_piece(c, line, l, s->s, end);
                break;
            }
            size_t at = (size_t)(p - s->s);
            if ((rc = push_piece(c, line, l, p + sep->len,
                                 end - at - sep->len)))
                break;
            end = at;
            splits++;
        }
        list_reverse(l);
    }
    if (rc) {
        jj_unref(jj_list_val(l));
        return rc;
    }
    *out = jj_list_val(l);
    return 0;
}

static bool line_break(uint32_t cp)
{
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C ||
           cp == 0x1C || cp == 0x1D || cp == 0x1E || cp == 0x85 ||
           cp == 0x2028 || cp == 0x2029;
}

int jj_text_splitlines(struct jj_ctx *c, int line, struct jj_str *s,
                       bool keepends, struct jj_val *out)
{
    struct jj_list *l = jj_list_new(0, JJ_SEQ_LIST);
    if (l == NULL)
        return jj_oom(c, line);
    int rc = 0;
    size_t start = 0, i = 0;
    while (i < s->len && rc == 0) {
        size_t adv;
        uint32_t cp = jj_utf8_next(s->s + i, s->len - i, &adv);
        if (!line_break(cp)) {
            i += adv;
            continue;
        }
        size_t eol = i + adv;
        if (cp == '\r' && eol < s->len && s->s[eol] == '\n')
            eol++;
        rc = push_piece(c, line, l, s->s + start,
                        (keepends ? eol : i) - start);
        start = i = eol;
    }
    if (rc == 0 && start < s->len)
        rc = push_piece(c, line, l, s->s + start, s->len - start);
    if (rc) {
        jj_unref(jj_list_val(l));
        return rc;
    }
    *out = jj_list_val(l);
    return 0;
}

/* ---- predicates ---------------------------------------------------------- */

int jj_text_is(const struct jj_str *s, const char *what, bool *res)
{
    bool any_cased = false;
    *res = s->len > 0;
    for (size_t i = 0; i < s->len; ) {
        size_t adv;
        uint32_t cp = jj_utf8_next(s->s + i, s->len - i, &adv);
        i += adv;
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        bool letter = k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL ||
                      k == UTF8PROC_CATEGORY_LT || k == UTF8PROC_CATEGORY_LM ||
                      k == UTF8PROC_CATEGORY_LO;
        bool number = k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL ||
                      k == UTF8PROC_CATEGORY_NO;
        if (!strcmp(what, "isdigit") || !strcmp(what, "isdecimal")) {
            if (k == UTF8PROC_CATEGORY_NO && cp >= 0x80)
                return TG_EUNSUPPORTED;
            if (k != UTF8PROC_CATEGORY_ND)
                *res = false;
        } else if (!strcmp(what, "isnumeric")) {
            if (!number)
                *res = false;
        } else if (!strcmp(what, "isalpha")) {
            if (!letter)
                *res = false;
        } else if (!strcmp(what, "isalnum")) {
            if (!letter && !number)
                *res = false;
        } else if (!strcmp(what, "isspace")) {
            if (!jj_py_isspace(cp))
                *res = false;
        } else if (!strcmp(what, "islower")) {
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT)
                *res = false;
            else if (k == UTF8PROC_CATEGORY_LL)
                any_cased = true;
        } else if (!strcmp(what, "isupper")) {
            if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT)
                *res = false;
            else if (k == UTF8PROC_CATEGORY_LU)
                any_cased = true;
        } else {
            return TG_EINVAL;
        }
    }
    if (!strcmp(what, "islower") || !strcmp(what, "isupper"))
        *res = *res && any_cased;
    return 0;
}

/* ---- slicing ------------------------------------------------------------ */

/* Python's PySlice_AdjustIndices for a sequence of n items. */
static int64_t slice_len(int64_t n, int64_t *start, int64_t *stop,
                         int64_t step)
{
    if (*start < 0) {
        *start += n;
        if (*start < 0)
            *start = step < 0 ? -1 : 0;
    } else if (*start >= n) {
        *start = step < 0 ? n - 1 : n;
    }
    if (*stop < 0) {
        *stop += n;
        if (*stop < 0)
            *stop = step < 0 ? -1 : 0;
    } else if (*stop >= n) {
        *stop = step < 0 ? n - 1 : n;
    }
    if (step < 0) {
        if (*stop < *start)
            return (*start - *stop - 1) / (-step) + 1;
    } else if (*start < *stop) {
        return (*stop - *start - 1) / step + 1;
    }
    return 0;
}

int jj_text_slice(struct jj_ctx *c, int line, struct jj_str *s, int64_t start,
                  int64_t stop, int64_t step, struct jj_val *out)
{
    int64_t n = (int64_t)s->ncp;
    int64_t k = slice_len(n, &start, &stop, step);
    if (s->ascii) {
        if (step == 1)
            return jj_make_str(c, line, s->s + start, (size_t)k, out);
        char *tmp = malloc((size_t)k + 1);
        if (tmp == NULL)
            return jj_oom(c, line);
        for (int64_t i = 0; i < k; i++)
            tmp[i] = s->s[start + i * step];
        int rc = jj_make_str(c, line, tmp, (size_t)k, out);
        free(tmp);
        return rc;
    }
    size_t *off = cp_offsets(s);
    if (off == NULL)
        return jj_oom(c, line);
    struct tg_buf b = {0};
    int rc = 0;
    for (int64_t i = 0; i < k && rc == 0; i++) {
        int64_t p = start + i * step;
        if (tg_buf_append(&b, s->s + off[p], off[p + 1] - off[p]))
            rc = jj_oom(c, line);
    }
    free(off);
    if (rc) {
        tg_buf_free(&b);
        return rc;
    }
    return jj_buf_to_val(c, line, &b, out);
}

/* ---- escape --------------------------------------------------------------- */

int jj_text_escape(struct jj_ctx *c, int line, struct jj_str *s,
                   struct jj_val *out)
{
    struct tg_buf b = {0};
    for (size_t i = 0; i < s->len; i++) {
        const char *rep = NULL;
        switch (s->s[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '\'': rep = "&#39;"; break;
        case '"': rep = "&#34;"; break;
        default: break;
        }
        if (rep != NULL ? tg_buf_append(&b, rep, strlen(rep))
                        : tg_buf_putc(&b, s->s[i])) {
            tg_buf_free(&b);
            return jj_oom(c, line);
        }
    }
    int rc = jj_buf_to_val(c, line, &b, out);
    if (rc == 0)
        out->u.s->markup = 1;
    return rc;
}
