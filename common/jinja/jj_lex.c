/* jj_lex.c — the Jinja lexer (jj_internal.h). It reproduces jinja2 3.1's
 * lexer (jinja2/lexer.py) for the configuration transformers uses:
 * delimiters {% %} {{ }} {# #}, trim_blocks (one newline after a block or
 * comment tag is removed), lstrip_blocks (spaces and tabs between a line
 * start and a block or comment tag are removed, unless the tag opens with
 * '+'), '-' whitespace control on either side, keep_trailing_newline off
 * (one final newline of the source is dropped) and every newline sequence
 * normalized to "\n". Token values follow lexer.py's `wrap`: strings are
 * decoded with Python's unicode-escape rules, integers accept 0b/0o/0x and
 * '_' separators, floats are read as Python float literals. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

struct lexer {
    void *arena;
    const char *s;
    size_t n, pos;
    int line;
    bool line_starting; /* the previous match ended with a newline */
    struct jj_token *toks;
    size_t n_toks, cap;
    char bal[JJ_MAX_PARSE_DEPTH]; /* open brackets inside a tag */
    int nbal;
    char *err;
    size_t errlen;
};

static int lex_fail(struct lexer *L, int line, int code, const char *msg,
                    const char *arg)
{
    if (arg != NULL)
        return tg_err_set(L->err, L->errlen, code,
                          "chat template line %d: %s%s", line, msg, arg);
    return tg_err_set(L->err, L->errlen, code, "chat template line %d: %s",
                      line, msg);
}

static struct jj_token *push(struct lexer *L, uint8_t type, int line)
{
    if (TG_GROW(L->toks, &L->cap, L->n_toks + 1))
        return NULL;
    struct jj_token *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->line = line;
    return t;
}

static int count_nl(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* Length of the Python-whitespace code point at s[i], or 0. */
static size_t space_at(const char *s, size_t n, size_t i)
{
    if (i >= n)
        return 0;
    unsigned char ch = (unsigned char)s[i];
    if (ch < 0x80)
        return jj_py_isspace(ch) ? 1 : 0;
    size_t adv;
    uint32_t cp = jj_utf8_next(s + i, n - i, &adv);
    return jj_py_isspace(cp) ? adv : 0;
}

/* Skips Python whitespace (\s*) from i. */
static size_t skip_space(const char *s, size_t n, size_t i)
{
    size_t k;
    while ((k = space_at(s, n, i)) > 0)
        i += k;
    return i;
}

static bool starts(const struct lexer *L, size_t i, const char *lit)
{
    size_t k = strlen(lit);
    return i + k <= L->n && memcmp(L->s + i, lit, k) == 0;
}

/* Emits text s[a, b) as DATA after Jinja's OptionalLStrip: sign '-' strips
 * all trailing whitespace; otherwise, with lstrip_blocks and a block or
 * comment tag (not a variable), spaces and tabs after the last newline (or
 * from the start when the previous match ended a line) are dropped. */
static int emit_text(struct lexer *L, size_t a, size_t b, char sign,
                     bool lstrip)
{
    int line = L->line;
    size_t end = b;
    if (sign == '-') {
        while (end > a) {
            /* step back one code point */
            size_t p = end - 1;
            while (p > a && ((unsigned char)L->s[p] & 0xC0) == 0x80)
                p--;
            if (space_at(L->s, end, p) != end - p)
                break;
            end = p;
        }
    } else if (sign != '+' && lstrip) {
        size_t l_pos = a;
        for (size_t i = b; i > a; i--)
            if (L->s[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if (l_pos > a || L->line_starting) {
            bool only = true;
            for (size_t i = l_pos; i < b; i++)
                if (L->s[i] != ' ' && L->s[i] != '\t') {
                    only = false;
                    break;
                }
            if (only)
                end = l_pos;
        }
    }
    L->line += count_nl(L->s + a, b - a);
    if (end > a) {
        struct jj_token *t = push(L, JJ_T_DATA, line);
        if (t == NULL)
            return TG_ENOMEM;
        t->s = L->s + a; /* the normalized source lives in the arena */
        t->len = end - a;
    }
    return 0;
}

/* ---- literals ----------------------------------------------------------- */

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* (\d+_)*\d+ at i: returns the end or i when no match. */
static size_t match_digits(const char *s, size_t n, size_t i)
{
    size_t j = i;
    if (j >= n || !is_digit(s[j]))
        return i;
    while (j < n && is_digit(s[j]))
        j++;
    while (j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) {
        j++;
        while (j < n && is_digit(s[j]))
            j++;
    }
    return j;
}

/* Jinja's float_re at i (not right after a '.'): returns the end or i. */
static size_t match_float(const char *s, size_t n, size_t i)
{
    if (i > 0 && s[i - 1] == '.')
        return i;
    size_t j = match_digits(s, n, i);
    if (j == i)
        return i;
    /* alternative 1: (\.D)? e[+-]?D */
    size_t k = j;
    if (k < n && s[k] == '.') {
        size_t f = match_digits(s, n, k + 1);
        if (f > k + 1)
            k = f;
    }
    for (int pass = 0; pass < 2; pass++) {
        size_t e = pass == 0 ? k : j;
        if (e < n && (s[e] == 'e' || s[e] == 'E')) {
            size_t x = e + 1;
            if (x < n && (s[x] == '+' || s[x] == '-'))
                x++;
            size_t d = match_digits(s, n, x);
            if (d > x)
                return d;
        }
        if (k == j)
            break;
    }
    /* alternative 2: \.D */
    if (j < n && s[j] == '.') {
        size_t f = match_digits(s, n, j + 1);
        if (f > j + 1)
            return f;
    }
    return i;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Jinja's integer_re at i: returns the end or i; *base gets 2/8/16/10. */
static size_t match_int(const char *s, size_t n, size_t i, int *base)
{
    if (i >= n || !is_digit(s[i]))
        return i;
    if (s[i] == '0' && i + 1 < n) {
        char b = (char)(s[i + 1] | 0x20);
        int want = b == 'b' ? 2 : b == 'o' ? 8 : b == 'x' ? 16 : 0;
        if (want) {
            size_t j = i + 2;
            size_t last = j;
            for (;;) {
                size_t k = j;
                if (k < n && s[k] == '_')
                    k++;
                int v = k < n ? hexval(s[k]) : -1;
                if (v < 0 || v >= want)
                    break;
                j = k + 1;
                last = j;
            }
            if (last > i + 2) {
                *base = want;
                return last;
            }
        }
    }
    *base = 10;
    size_t j = i + 1;
    if (s[i] == '0') {
        for (;;) {
            size_t k = j;
            if (k < n && s[k] == '_')
                k++;
            if (k < n && s[k] == '0')
                j = k + 1;
            else
                break;
        }
        return j;
    }
    for (;;) {
        size_t k = j;
        if (k < n && s[k] == '_')
            k++;
        if (k < n && is_digit(s[k]))
            j = k + 1;
        else
            break;
    }
    return j;
}

/* Decodes a string literal body s[a, b) with Python's unicode-escape rules
 * (what Jinja applies after encoding non-ASCII text with backslashreplace,
 * so a backslash before a non-ASCII character sees that escape's text). */
static int decode_string(struct lexer *L, int line, size_t a, size_t b,
                         struct jj_token *t)
{
    char *out = jj__arena_alloc(L->arena, (b - a) * 4 + 1);
    if (out == NULL)
        return TG_ENOMEM;
    size_t o = 0;
    const char *s = L->s;
    for (size_t i = a; i < b;) {
        if (s[i] != '\\') {
            out[o++] = s[i++];
            continue;
        }
        if (i + 1 >= b) {
            return lex_fail(L, line, TG_EFORMAT,
                            "\\ at end of string", NULL);
        }
        char e = s[i + 1];
        if ((unsigned char)e >= 0x80) {
            /* backslashreplace turned the character into \xNN, \uNNNN or
             * \UNNNNNNNN; this backslash escapes that backslash */
            size_t adv;
            uint32_t cp = jj_utf8_next(s + i + 1, b - i - 1, &adv);
            char tmp[16];
            int k = cp <= 0xff     ? snprintf(tmp, sizeof tmp, "x%02x", cp)
                    : cp <= 0xffff ? snprintf(tmp, sizeof tmp, "u%04x", cp)
                                   : snprintf(tmp, sizeof tmp, "U%08x", cp);
            out[o++] = '\\';
            memcpy(out + o, tmp, (size_t)k);
            o += (size_t)k;
            i += 1 + adv;
            continue;
        }
        i += 2;
        uint32_t cp;
        switch (e) {
        case '\n':
            continue; /* line continuation */
        case '\\':
        case '\'':
        case '"':
            out[o++] = e;
            continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'v': out[o++] = '\v'; continue;
        case 'x':
        case 'u':
        case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            cp = 0;
            for (int k = 0; k < digits; k++) {
                int v = i < b ? hexval(s[i]) : -1;
                if (v < 0)
                    return lex_fail(L, line, TG_EFORMAT,
                                    "truncated \\x, \\u or \\U escape in a "
                                    "string",
                                    NULL);
                cp = cp * 16 + (uint32_t)v;
                i++;
            }
            if (cp > 0x10FFFF)
                return lex_fail(L, line, TG_EFORMAT,
                                "illegal Unicode character in a string",
                                NULL);
            if (cp >= 0xD800 && cp <= 0xDFFF)
                return lex_fail(L, line, TG_EUNSUPPORTED,
                                "unsupported: a surrogate escape in a string",
                                NULL);
            o += jj_utf8_put(cp, out + o);
            continue;
        }
        case 'N':
            return lex_fail(L, line, TG_EUNSUPPORTED,
                            "unsupported: \\N{...} escape in a string", NULL);
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < b && s[i] >= '0' && s[i] <= '7';
                     k++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                o += jj_utf8_put(cp, out + o);
                continue;
            }
            out[o++] = '\\'; /* unknown escapes keep the backslash */
            out[o++] = e;
            continue;
        }
    }
    out[o] = '\0';
    t->s = out;
    t->len = o;
    return 0;
}

struct op_entry {
    const char *s;
    uint8_t op;
};
static const struct op_entry OPS2[] = {
    {"//", JJ_TO_FLOORDIV}, {"**", JJ_TO_POW}, {"==", JJ_TO_EQ},
    {"!=", JJ_TO_NE},       {">=", JJ_TO_GTEQ}, {"<=", JJ_TO_LTEQ},
};
static const struct op_entry OPS1[] = {
    {"+", JJ_TO_ADD},      {"-", JJ_TO_SUB},      {"/", JJ_TO_DIV},
    {"*", JJ_TO_MUL},      {"%", JJ_TO_MOD},      {"~", JJ_TO_TILDE},
    {"[", JJ_TO_LBRACKET}, {"]", JJ_TO_RBRACKET}, {"(", JJ_TO_LPAREN},
    {")", JJ_TO_RPAREN},   {"{", JJ_TO_LBRACE},   {"}", JJ_TO_RBRACE},
    {">", JJ_TO_GT},       {"<", JJ_TO_LT},       {"=", JJ_TO_ASSIGN},
    {".", JJ_TO_DOT},      {":", JJ_TO_COLON},    {"|", JJ_TO_PIPE},
    {",", JJ_TO_COMMA},    {";", JJ_TO_SEMICOLON},
};

/* One token inside {% %} or {{ }}. */
static int lex_tag_token(struct lexer *L)
{
    const char *s = L->s;
    size_t n = L->n, i = L->pos;
    int line = L->line;
    size_t k = space_at(s, n, i);
    if (k > 0) {
        size_t j = skip_space(s, n, i);
        L->line += count_nl(s + i, j - i);
        L->pos = j;
        return 0;
    }
    size_t j = match_float(s, n, i);
    if (j > i) {
        char buf[128];
        size_t m = 0;
        for (size_t q = i; q < j && m + 1 < sizeof buf; q++)
            if (s[q] != '_')
                buf[m++] = s[q];
        buf[m] = '\0';
        struct jj_token *t = push(L, JJ_T_FLOAT, line);
        if (t == NULL)
            return TG_ENOMEM;
        t->f = strtod(buf, NULL);
        L->pos = j;
        return 0;
    }
    int base = 10;
    j = match_int(s, n, i, &base);
    if (j > i) {
        int64_t v = 0;
        size_t q = base == 10 ? i : i + 2;
        for (; q < j; q++) {
            if (s[q] == '_')
                continue;
            int d = hexval(s[q]);
            if (__builtin_mul_overflow(v, (int64_t)base, &v) ||
                __builtin_add_overflow(v, (int64_t)d, &v))
                return lex_fail(L, line, TG_EUNSUPPORTED,
                                "unsupported: integer literal beyond 64 "
                                "bits",
                                NULL);
        }
        struct jj_token *t = push(L, JJ_T_INT, line);
        if (t == NULL)
            return TG_ENOMEM;
        t->i = v;
        L->pos = j;
        return 0;
    }
    char ch = s[i];
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
        j = i + 1;
        while (j < n && ((s[j] >= 'a' && s[j] <= 'z') ||
                         (s[j] >= 'A' && s[j] <= 'Z') || is_digit(s[j]) ||
                         s[j] == '_'))
            j++;
        if (j < n && (unsigned char)s[j] >= 0x80 && space_at(s, n, j) == 0)
            return lex_fail(L, line, TG_EUNSUPPORTED,
                            "unsupported: non-ASCII character in a name",
                            NULL);
        struct jj_token *t = push(L, JJ_T_NAME, line);
        if (t == NULL)
            return TG_ENOMEM;
        t->s = jj__arena_strndup(L->arena, s + i, j - i);
        if (t->s == NULL)
            return TG_ENOMEM;
        t->len = j - i;
        L->pos = j;
        return 0;
    }
    if (ch == '\'' || ch == '"') {
        j = i + 1;
        while (j < n && s[j] != ch) {
            if (s[j] == '\\' && j + 1 < n)
                j++;
            j++;
        }
        if (j >= n)
            return lex_fail(L, line, TG_EFORMAT,
                            "unexpected char ", ch == '"' ? "'\"'" : "\"'\"");
        struct jj_token *t = push(L, JJ_T_STRING, line);
        if (t == NULL)
            return TG_ENOMEM;
        int rc = decode_string(L, line, i + 1, j, t);
        if (rc != 0)
            return rc;
        L->line += count_nl(s + i, j + 1 - i);
        L->pos = j + 1;
        return 0;
    }
    uint8_t op = 0;
    size_t len = 0;
    for (size_t q = 0; q < sizeof OPS2 / sizeof OPS2[0]; q++)
        if (starts(L, i, OPS2[q].s)) {
            op = OPS2[q].op;
            len = 2;
            break;
        }
    for (size_t q = 0; op == 0 && q < sizeof OPS1 / sizeof OPS1[0]; q++)
        if (s[i] == OPS1[q].s[0]) {
            op = OPS1[q].op;
            len = 1;
        }
    if (op == 0 && (unsigned char)ch >= 0x80)
        return lex_fail(L, line, TG_EUNSUPPORTED,
                        "unsupported: non-ASCII character in a tag", NULL);
    if (op == 0) {
        char what[16];
        size_t adv;
        jj_utf8_next(s + i, n - i, &adv);
        snprintf(what, sizeof what, "'%.*s'", (int)adv, s + i);
        return lex_fail(L, line, TG_EFORMAT, "unexpected char ", what);
    }
    if (op == JJ_TO_LBRACE || op == JJ_TO_LPAREN || op == JJ_TO_LBRACKET) {
        if (L->nbal >= JJ_MAX_PARSE_DEPTH)
            return lex_fail(L, line, TG_ETOOBIG,
                            "brackets nested too deeply", NULL);
        L->bal[L->nbal++] = op == JJ_TO_LBRACE     ? '}'
                            : op == JJ_TO_LPAREN ? ')'
                                                 : ']';
    } else if (op == JJ_TO_RBRACE || op == JJ_TO_RPAREN ||
               op == JJ_TO_RBRACKET) {
        if (L->nbal == 0) {
            char what[8];
            snprintf(what, sizeof what, "'%c'", ch);
            return lex_fail(L, line, TG_EFORMAT, "unexpected ", what);
        }
        char want = L->bal[--L->nbal];
        if (want != ch) {
            char what[32];
            snprintf(what, sizeof what, "'%c', expected '%c'", ch, want);
            return lex_fail(L, line, TG_EFORMAT, "unexpected ", what);
        }
    }
    struct jj_token *t = push(L, JJ_T_OP, line);
    if (t == NULL)
        return TG_ENOMEM;
    t->op = op;
    L->pos = i + len;
    return 0;
}

/* Inside {% %} (block) or {{ }} (variable) until the closing tag. */
static int lex_tag(struct lexer *L, bool block)
{
    for (;;) {
        if (L->pos >= L->n)
            return lex_fail(L, L->line, TG_EFORMAT,
                            block ? "unexpected end of template, expected "
                                    "'%}'"
                                  : "unexpected end of template, expected "
                                    "'}}'",
                            NULL);
        size_t i = L->pos, end = 0;
        if (L->nbal == 0) {
            const char *close = block ? "%}" : "}}";
            if (block && L->s[i] == '+' && starts(L, i + 1, close)) {
                end = i + 3;
            } else if (L->s[i] == '-' && starts(L, i + 1, close)) {
                end = skip_space(L->s, L->n, i + 3);
            } else if (starts(L, i, close)) {
                end = i + 2;
                if (block && end < L->n && L->s[end] == '\n')
                    end++; /* trim_blocks */
            }
        }
        if (end > 0) {
            if (push(L, block ? JJ_T_BLOCK_END : JJ_T_VAR_END, L->line) ==
                NULL)
                return TG_ENOMEM;
            L->line += count_nl(L->s + i, end - i);
            L->line_starting = L->s[end - 1] == '\n';
            L->pos = end;
            return 0;
        }
        int rc = lex_tag_token(L);
        if (rc != 0)
            return rc;
    }
}

/* {% raw %} ... {% endraw %}: `i` is at the opening "{%". Returns 1 when
 * the raw block was consumed, 0 when this is not a raw tag. */
static int lex_raw(struct lexer *L, size_t text_start, size_t i, int *rc)
{
    size_t j = i + 2;
    char sign = 0;
    if (j < L->n && (L->s[j] == '-' || L->s[j] == '+'))
        sign = L->s[j++];
    j = skip_space(L->s, L->n, j);
    if (!starts(L, j, "raw"))
        return 0;
    j = skip_space(L->s, L->n, j + 3);
    size_t open_end;
    if (L->s[j] == '-' && starts(L, j + 1, "%}"))
        open_end = skip_space(L->s, L->n, j + 3);
    else if (starts(L, j, "%}"))
        open_end = j + 2;
    else
        return 0;
    *rc = emit_text(L, text_start, i, sign, true);
    if (*rc != 0)
        return 1;
    int open_line = L->line;
    L->line += count_nl(L->s + i, open_end - i);
    L->line_starting = L->s[open_end - 1] == '\n';
    /* find {%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?) */
    for (size_t p = open_end; p + 1 < L->n; p++) {
        if (L->s[p] != '{' || L->s[p + 1] != '%')
            continue;
        size_t q = p + 2;
        char esign = 0;
        if (q < L->n && (L->s[q] == '-' || L->s[q] == '+'))
            esign = L->s[q++];
        q = skip_space(L->s, L->n, q);
        if (!starts(L, q, "endraw"))
            continue;
        q = skip_space(L->s, L->n, q + 6);
        size_t close;
        if (L->s[q] == '+' && starts(L, q + 1, "%}"))
            close = q + 3;
        else if (L->s[q] == '-' && starts(L, q + 1, "%}"))
            close = skip_space(L->s, L->n, q + 3);
        else if (starts(L, q, "%}")) {
            close = q + 2;
            if (close < L->n && L->s[close] == '\n')
                close++;
        } else
            continue;
        *rc = emit_text(L, open_end, p, esign, true);
        if (*rc != 0)
            return 1;
        L->line += count_nl(L->s + p, close - p);
        L->line_starting = L->s[close - 1] == '\n';
        L->pos = close;
        return 1;
    }
    *rc = lex_fail(L, open_line, TG_EFORMAT, "Missing end of raw directive",
                   NULL);
    return 1;
}

/* `body` is where the comment text starts (after "{#" and its sign). */
static int lex_comment(struct lexer *L, size_t i, size_t body)
{
    int line = L->line;
    for (size_t p = body; p + 1 < L->n; p++) {
        if (L->s[p] != '#' || L->s[p + 1] != '}')
            continue;
        size_t end;
        if (p > body && L->s[p - 1] == '+') {
            end = p + 2;
        } else if (p > body && L->s[p - 1] == '-') {
            end = skip_space(L->s, L->n, p + 2);
        } else {
            end = p + 2;
            if (end < L->n && L->s[end] == '\n')
                end++;
        }
        L->line += count_nl(L->s + i, end - i);
        L->line_starting = L->s[end - 1] == '\n';
        L->pos = end;
        return 0;
    }
    return lex_fail(L, line, TG_EFORMAT, "Missing end of comment tag", NULL);
}

int jj__lex(void *arena, const char *src, size_t len, struct jj_token **toks,
            size_t *n_toks, char *err, size_t errlen)
{
    struct lexer L = {.arena = arena, .line = 1, .line_starting = true,
                      .err = err, .errlen = errlen};
    /* Normalize newlines and drop one trailing newline (lexer.tokeniter). */
    char *norm = jj__arena_alloc(arena, len + 1);
    if (norm == NULL)
        return TG_ENOMEM;
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[m++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            norm[m++] = src[i];
        }
    }
    if (m > 0 && norm[m - 1] == '\n')
        m--;
    norm[m] = '\0';
    L.s = norm;
    L.n = m;
    int rc = 0;
    while (L.pos < L.n && rc == 0) {
        /* the earliest "{{", "{%" or "{#" */
        size_t i = L.pos, tag = L.n;
        while (i + 1 < L.n) {
            const char *p = memchr(L.s + i, '{', L.n - i - 1);
            if (p == NULL)
                break;
            size_t at = (size_t)(p - L.s);
            char nx = L.s[at + 1];
            if (nx == '{' || nx == '%' || nx == '#') {
                tag = at;
                break;
            }
            i = at + 1;
        }
        if (tag == L.n) {
            rc = emit_text(&L, L.pos, L.n, 0, false);
            L.pos = L.n;
            break;
        }
        char kind = L.s[tag + 1];
        char sign = 0;
        if (tag + 2 < L.n && (L.s[tag + 2] == '-' || L.s[tag + 2] == '+'))
            sign = L.s[tag + 2];
        if (kind == '%' && lex_raw(&L, L.pos, tag, &rc))
            continue;
        rc = emit_text(&L, L.pos, tag, sign, kind != '{');
        if (rc != 0)
            break;
        L.line_starting = false;
        size_t after = tag + 2 + (sign != 0);
        if (kind == '#') {
            rc = lex_comment(&L, tag, after);
            continue;
        }
        if (push(&L, kind == '%' ? JJ_T_BLOCK_BEGIN : JJ_T_VAR_BEGIN,
                 L.line) == NULL) {
            rc = TG_ENOMEM;
            break;
        }
        L.pos = after;
        L.nbal = 0;
        rc = lex_tag(&L, kind == '%');
    }
    if (rc == 0 && push(&L, JJ_T_EOF, L.line) == NULL)
        rc = TG_ENOMEM;
    if (rc == TG_ENOMEM)
        tg_err_set(err, errlen, rc, "out of memory while parsing the chat "
                                    "template");
    if (rc != 0) {
        free(L.toks);
        return rc;
    }
    /* hand the token array to the arena's lifetime */
    struct jj_token *t = jj__arena_alloc(arena, L.n_toks * sizeof(*t));
    if (t == NULL) {
        free(L.toks);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    memcpy(t, L.toks, L.n_toks * sizeof(*t));
    free(L.toks);
    *toks = t;
    *n_toks = L.n_toks;
    return 0;
}
