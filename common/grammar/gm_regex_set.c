/* gm_regex_set.c — code point sets of the regular expressions: ranges,
 * ECMA-262's classes, Unicode General Categories (utf8proc), UTF-8
 * decoding (gm_regex_internal.h). */
#include "common/grammar/gm_regex_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/base/tg_err.h"

void gm__cset_free(struct gm__cset *s)
{
    free(s->r);
    memset(s, 0, sizeof(*s));
}

int gm__cset_add(struct gm__cset *s, uint32_t lo, uint32_t hi)
{
    if (lo > hi)
        return 0;
    if (TG_GROW(s->r, &s->cap, s->n + 1))
        return TG_ENOMEM;
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
    return 0;
}

static int by_lo(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

void gm__cset_norm(struct gm__cset *s)
{
    if (s->n < 2)
        return;
    qsort(s->r, s->n, sizeof(*s->r), by_lo);
    size_t m = 0;
    for (size_t i = 1; i < s->n; i++) {
        if ((uint64_t)s->r[i][0] <= (uint64_t)s->r[m][1] + 1) {
            if (s->r[i][1] > s->r[m][1])
                s->r[m][1] = s->r[i][1];
        } else {
            s->r[++m][0] = s->r[i][0];
            s->r[m][1] = s->r[i][1];
        }
    }
    s->n = m + 1;
}

int gm__cset_union(struct gm__cset *s, const struct gm__cset *a)
{
    for (size_t i = 0; i < a->n; i++)
        if (gm__cset_add(s, a->r[i][0], a->r[i][1]) != 0)
            return TG_ENOMEM;
    gm__cset_norm(s);
    return 0;
}

int gm__cset_invert(struct gm__cset *s)
{
    struct gm__cset o = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i][0] > next && gm__cset_add(&o, next, s->r[i][0] - 1) != 0)
            goto oom;
        next = s->r[i][1] + 1;
    }
    if (next <= GM__CP_MAX && gm__cset_add(&o, next, GM__CP_MAX) != 0)
        goto oom;
    gm__cset_free(s);
    *s = o;
    return 0;
oom:
    gm__cset_free(&o);
    return TG_ENOMEM;
}

int gm__cset_and(struct gm__cset *s, const struct gm__cset *a)
{
    struct gm__cset o = {0};
    size_t i = 0, j = 0;
    while (i < s->n && j < a->n) {
        uint32_t lo = s->r[i][0] > a->r[j][0] ? s->r[i][0] : a->r[j][0];
        uint32_t hi = s->r[i][1] < a->r[j][1] ? s->r[i][1] : a->r[j][1];
        if (lo <= hi && gm__cset_add(&o, lo, hi) != 0) {
            gm__cset_free(&o);
            return TG_ENOMEM;
        }
        if (s->r[i][1] < a->r[j][1])
            i++;
        else
            j++;
    }
    gm__cset_free(s);
    *s = o;
    return 0;
}

int gm__cset_has(const struct gm__cset *s, uint32_t c)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < s->r[mid][0])
            hi = mid;
        else if (c > s->r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

int gm__cset_copy(struct gm__cset *dst, const struct gm__cset *src)
{
    memset(dst, 0, sizeof(*dst));
    for (size_t i = 0; i < src->n; i++)
        if (gm__cset_add(dst, src->r[i][0], src->r[i][1]) != 0) {
            gm__cset_free(dst);
            return TG_ENOMEM;
        }
    return 0;
}

/* ECMA-262 WhiteSpace (tab, VT, FF, space, NBSP, ZWNBSP, Zs) and
 * LineTerminator (LF, CR, LS, PS); Zs as of Unicode 13. */
static const uint32_t space_ranges[][2] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
    {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

int gm__cset_class(struct gm__cset *s, char which)
{
    struct gm__cset t = {0};
    int rc = 0;
    switch (which | 0x20) {
    case 'd': rc = gm__cset_add(&t, '0', '9'); break;
    case 'w':
        rc = gm__cset_add(&t, '0', '9') | gm__cset_add(&t, 'A', 'Z') |
             gm__cset_add(&t, '_', '_') | gm__cset_add(&t, 'a', 'z');
        break;
    case 's':
        for (size_t i = 0; i < sizeof space_ranges / sizeof *space_ranges; i++)
            rc |= gm__cset_add(&t, space_ranges[i][0], space_ranges[i][1]);
        break;
    default: /* '.': all but \n \r U+2028 U+2029 */
        rc = gm__cset_add(&t, 0, 0x09) | gm__cset_add(&t, 0x0B, 0x0C) |
             gm__cset_add(&t, 0x0E, 0x2027) |
             gm__cset_add(&t, 0x202A, GM__CP_MAX);
        break;
    }
    gm__cset_norm(&t);
    if (rc == 0 && which != '.' && which >= 'A' && which <= 'Z')
        rc = gm__cset_invert(&t);
    if (rc == 0)
        rc = gm__cset_union(s, &t);
    gm__cset_free(&t);
    return rc != 0 ? TG_ENOMEM : 0;
}

/* ---- Unicode General Categories ----------------------------------------- */

#define N_CAT 30 /* utf8proc's categories, CN = 0 .. CO = 29 */

static struct gm__cset cat_set[N_CAT];
static int cat_err;
static pthread_once_t cat_once = PTHREAD_ONCE_INIT;

static void cat_build(void)
{
    uint32_t start = 0;
    int cur = utf8proc_category(0);
    for (uint32_t c = 1; c <= GM__CP_MAX + 1; c++) {
        int k = c <= GM__CP_MAX ? (int)utf8proc_category((utf8proc_int32_t)c)
                                : -1;
        if (k == cur)
            continue;
        if (cur >= 0 && cur < N_CAT &&
            gm__cset_add(&cat_set[cur], start, c - 1) != 0)
            cat_err = TG_ENOMEM;
        start = c;
        cur = k;
    }
}

/* Category bits by utf8proc number. */
#define C(x) (1u << UTF8PROC_CATEGORY_##x)
#define CAT_L (C(LU) | C(LL) | C(LT) | C(LM) | C(LO))
#define CAT_M (C(MN) | C(MC) | C(ME))
#define CAT_N (C(ND) | C(NL) | C(NO))
#define CAT_P (C(PC) | C(PD) | C(PS) | C(PE) | C(PI) | C(PF) | C(PO))
#define CAT_S (C(SM) | C(SC) | C(SK) | C(SO))
#define CAT_Z (C(ZS) | C(ZL) | C(ZP))
#define CAT_C (C(CC) | C(CF) | C(CS) | C(CO) | C(CN))

static const struct {
    const char *name;
    uint32_t bits;
} props[] = {
    {"L", CAT_L},
    {"Letter", CAT_L},
    {"LC", C(LU) | C(LL) | C(LT)},
    {"Cased_Letter", C(LU) | C(LL) | C(LT)},
    {"Lu", C(LU)},
    {"Uppercase_Letter", C(LU)},
    {"Ll", C(LL)},
    {"Lowercase_Letter", C(LL)},
    {"Lt", C(LT)},
    {"Titlecase_Letter", C(LT)},
    {"Lm", C(LM)},
    {"Modifier_Letter", C(LM)},
    {"Lo", C(LO)},
    {"Other_Letter", C(LO)},
    {"M", CAT_M},
    {"Mark", CAT_M},
    {"Combining_Mark", CAT_M},
    {"Mn", C(MN)},
    {"Nonspacing_Mark", C(MN)},
    {"Mc", C(MC)},
    {"Spacing_Mark", C(MC)},
    {"Me", C(ME)},
    {"Enclosing_Mark", C(ME)},
    {"N", CAT_N},
    {"Number", CAT_N},
    {"Nd", C(ND)},
    {"Decimal_Number", C(ND)},
    {"digit", C(ND)},
    {"Nl", C(NL)},
    {"Letter_Number", C(NL)},
    {"No", C(NO)},
    {"Other_Number", C(NO)},
    {"P", CAT_P},
    {"Punctuation", CAT_P},
    {"punct", CAT_P},
    {"Pc", C(PC)},
    {"Connector_Punctuation", C(PC)},
    {"Pd", C(PD)},
    {"Dash_Punctuation", C(PD)},
    {"Ps", C(PS)},
    {"Open_Punctuation", C(PS)},
    {"Pe", C(PE)},
    {"Close_Punctuation", C(PE)},
    {"Pi", C(PI)},
    {"Initial_Punctuation", C(PI)},
    {"Pf", C(PF)},
    {"Final_Punctuation", C(PF)},
    {"Po", C(PO)},
    {"Other_Punctuation", C(PO)},
    {"S", CAT_S},
    {"Symbol", CAT_S},
    {"Sm", C(SM)},
    {"Math_Symbol", C(SM)},
    {"Sc", C(SC)},
    {"Currency_Symbol", C(SC)},
    {"Sk", C(SK)},
    {"Modifier_Symbol", C(SK)},
    {"So", C(SO)},
    {"Other_Symbol", C(SO)},
    {"Z", CAT_Z},
    {"Separator", CAT_Z},
    {"Zs", C(ZS)},
    {"Space_Separator", C(ZS)},
    {"Zl", C(ZL)},
    {"Line_Separator", C(ZL)},
    {"Zp", C(ZP)},
    {"Paragraph_Separator", C(ZP)},
    {"C", CAT_C},
    {"Other", CAT_C},
    {"Cc", C(CC)},
    {"Control", C(CC)},
    {"cntrl", C(CC)},
    {"Cf", C(CF)},
    {"Format", C(CF)},
    {"Cs", C(CS)},
    {"Surrogate", C(CS)},
    {"Co", C(CO)},
    {"Private_Use", C(CO)},
    {"Cn", C(CN)},
    {"Unassigned", C(CN)},
    {"Any", 0xFFFFFFFFu},
    {"Assigned", ~C(CN)},
};

static int eq(const char *a, size_t n, const char *b)
{
    return strlen(b) == n && memcmp(a, b, n) == 0;
}

int gm__cset_property(struct gm__cset *s, const char *name, size_t n, int neg)
{
    if (n > 3 && memcmp(name, "gc=", 3) == 0) {
        name += 3;
        n -= 3;
    } else if (n > 17 && memcmp(name, "General_Category=", 17) == 0) {
        name += 17;
        n -= 17;
    }
    struct gm__cset t = {0};
    int rc = 0;
    if (eq(name, n, "ASCII")) {
        rc = gm__cset_add(&t, 0, 0x7F);
    } else {
        uint32_t bits = 0;
        for (size_t i = 0; i < sizeof props / sizeof *props && !bits; i++)
            if (eq(name, n, props[i].name))
                bits = props[i].bits;
        if (bits == 0)
            return TG_ENOTFOUND;
        pthread_once(&cat_once, cat_build);
        if (cat_err != 0)
            return TG_ENOMEM;
        for (int k = 0; k < N_CAT && rc == 0; k++)
            if (bits & (1u << k))
                rc = gm__cset_union(&t, &cat_set[k]);
    }
    if (rc == 0 && neg)
        rc = gm__cset_invert(&t);
    if (rc == 0)
        rc = gm__cset_union(s, &t);
    gm__cset_free(&t);
    return rc;
}

int gm__cset_assigned(struct gm__cset *s)
{
    return gm__cset_property(s, "Assigned", 8, 0);
}

size_t gm__utf8_dec(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t k;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 2;
        v = c & 0x1F;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        v = c & 0x0F;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        v = c & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    if (n < k)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > GM__CP_MAX || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return k;
}
