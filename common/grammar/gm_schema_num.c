/* gm_schema_num.c — numbers of a JSON Schema: ranges (minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum) and multipleOf, written as digit
 * automata in the grammar IR (gm_schema_internal.h).
 *
 * A bounded number is generated in fixed point, -?I(\.F)?, I without
 * leading zeros; F has at most FRAC_DIGITS digits and I at most
 * INT_DIGITS when the range leaves it open, so every generated number is
 * a finite double (validators and JavaScript parse it so). The range is
 * exact over decimal strings: I and F are compared digit by digit with
 * the bound's digits (F padded with zeros), as in the usual construction
 * of a regular expression for a numeric range.
 *
 * Bounds come in as doubles (what a schema's number is for validators,
 * which compare doubles). An inclusive bound L is written as the shortest
 * decimal that reads back as L; any decimal x >= that text reads back as
 * a double >= L, since rounding to a double is monotone. An exclusive
 * bound L is replaced by the inclusive bound nextafter(L) toward the
 * range, for the same reason: a decimal just above L's text may still
 * read back as L itself. Integers take ceil/floor of the bounds instead
 * (exact: every double of that size is an integer).
 *
 * multipleOf (integers, or numbers with an integral multipleOf, which are
 * then generated as integers): the digits are read by a remainder
 * automaton modulo m, one rule per (digits left, remainder) and per
 * tight state of a boundary length, so m is capped (MOD_MAX). A
 * multipleOf whose inverse is an integer (0.5, 0.01) is every integer for
 * the integer type; for other numbers a non-integral multipleOf is
 * refused: validators divide in floating point and reject valid decimal
 * multiples (0.07 / 0.01 = 7.000000000000001).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_schema_internal.h"

#define INT_DIGITS GM_JSON_INT_DIGITS   /* an open side's integer digits */
#define FRAC_DIGITS GM_JSON_FRAC_DIGITS /* fraction digits */
#define MOD_MAX 100 /* largest multipleOf (states per digit) */
#define DEC_MAX 400 /* digits of a bound written in fixed point */

/* A non-negative decimal: integer digits (no leading zeros, "0" for zero)
 * and fraction digits (no trailing zeros, "" for none). */
struct dec {
    char i[DEC_MAX + 2];
    char f[DEC_MAX + 2];
};

/* The shortest %.*g text of v that reads back as v. */
static void shortest(double v, char *out, size_t cap)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(out, cap, "%.*g", p, v);
        if (strtod(out, NULL) == v)
            return;
    }
    snprintf(out, cap, "%.17g", v);
}

/* |v| (finite) as a fixed-point decimal, from its shortest text. */
static void dec_of(double v, struct dec *d)
{
    char t[64], mant[64];
    shortest(fabs(v), t, sizeof t);
    int e10 = 0;
    char *e = strpbrk(t, "eE");
    if (e != NULL) {
        e10 = atoi(e + 1);
        *e = '\0';
    }
    /* digits of the mantissa and where its point is */
    size_t n = 0;
    int point = -1;
    for (const char *p = t; *p; p++) {
        if (*p == '.')
            point = (int)n;
        else
            mant[n++] = *p;
    }
    mant[n] = '\0';
    if (point < 0)
        point = (int)n;
    point += e10; /* the point sits after `point` digits of mant */
    size_t ni = 0, nf = 0;
    for (int k = 0; k < point && ni < DEC_MAX; k++)
        d->i[ni++] = k < (int)n ? mant[k] : '0';
    for (int k = point < 0 ? point : point; k < (int)n && nf < DEC_MAX; k++)
        d->f[nf++] = k < 0 ? '0' : mant[k];
    d->i[ni] = '\0';
    d->f[nf] = '\0';
    /* normalise: no leading zeros, no trailing zeros */
    size_t lz = 0;
    while (d->i[lz] == '0')
        lz++;
    memmove(d->i, d->i + lz, ni - lz + 1);
    if (d->i[0] == '\0')
        strcpy(d->i, "0");
    while (nf > 0 && d->f[nf - 1] == '0')
        d->f[--nf] = '\0';
}

/* Digit-string arithmetic on integer parts (no leading zeros). */
static void dec_inc(char *s)
{
    size_t n = strlen(s);
    for (size_t k = n; k-- > 0;) {
        if (s[k] != '9') {
            s[k]++;
            return;
        }
        s[k] = '0';
    }
    memmove(s + 1, s, n + 1);
    s[0] = '1';
}

/* s - 1 for s > 0. */
static void dec_dec(char *s)
{
    size_t n = strlen(s);
    for (size_t k = n; k-- > 0;) {
        if (s[k] != '0') {
            s[k]--;
            break;
        }
        s[k] = '9';
    }
    if (s[0] == '0' && s[1] != '\0')
        memmove(s, s + 1, n);
}

static int dec_cmp(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na != nb)
        return na < nb ? -1 : 1;
    int c = strcmp(a, b);
    return c < 0 ? -1 : c > 0;
}

/* ---- integer digit strings in a range ---------------------------------- */

/* One digit in [lo, hi]. */
static int32_t dclass(struct gm_ir *ir, int lo, int hi)
{
    return gm_ir_range(ir, (unsigned)('0' + lo), (unsigned)('0' + hi));
}

/* Digit strings of exactly len(lo) = len(hi) digits in [lo, hi] (both
 * of that length; leading zeros allowed here: the caller places this
 * after a first digit). */
static int32_t same_len(struct gm_ir *ir, const char *lo, const char *hi)
{
    size_t n = strlen(lo);
    if (n == 0)
        return gm_ir_empty(ir);
    if (strspn(lo, "0") == n && strspn(hi, "9") == n) /* every string */
        return gm_ir_repeat(ir, dclass(ir, 0, 9), (uint32_t)n, (uint32_t)n);
    int a = lo[0] - '0', b = hi[0] - '0';
    if (a == b)
        return gm_ir_seq2(ir, dclass(ir, a, a), same_len(ir, lo + 1, hi + 1));
    /* a < b: a then >= rest of lo; (a, b) then anything; b then <= rest
     * of hi */
    char nines[DEC_MAX + 1], zeros[DEC_MAX + 1];
    memset(nines, '9', n - 1);
    nines[n - 1] = '\0';
    memset(zeros, '0', n - 1);
    zeros[n - 1] = '\0';
    int32_t alts[3];
    size_t k = 0;
    alts[k++] = gm_ir_seq2(ir, dclass(ir, a, a), same_len(ir, lo + 1, nines));
    if (b - a > 1)
        alts[k++] = gm_ir_seq2(ir, dclass(ir, a + 1, b - 1),
                               gm_ir_repeat(ir, dclass(ir, 0, 9),
                                            (uint32_t)n - 1, (uint32_t)n - 1));
    alts[k++] = gm_ir_seq2(ir, dclass(ir, b, b), same_len(ir, zeros, hi + 1));
    return gm_ir_alt(ir, alts, k);
}

/* Integers in [lo, hi] as digit strings without leading zeros; hi NULL:
 * no upper bound but max(INT_DIGITS, len(lo)) digits. */
static int32_t int_range(struct gm_ir *ir, const char *lo, const char *hi)
{
    size_t nlo = strlen(lo);
    size_t nhi = hi != NULL ? strlen(hi)
                            : (nlo > INT_DIGITS ? nlo : INT_DIGITS);
    if (hi != NULL && dec_cmp(lo, hi) > 0)
        return gm_ir_alt(ir, NULL, 0);
    char a[DEC_MAX + 2], b[DEC_MAX + 2];
    if (nlo == nhi) {
        if (hi != NULL)
            strcpy(b, hi);
        else {
            memset(b, '9', nhi);
            b[nhi] = '\0';
        }
        return same_len(ir, lo, b);
    }
    int32_t alts[3];
    size_t k = 0;
    /* len(lo) digits from lo; the lengths in between, any; len(hi) digits
     * up to hi */
    memset(b, '9', nlo);
    b[nlo] = '\0';
    alts[k++] = same_len(ir, lo, b);
    if (nhi - nlo >= 2)
        alts[k++] = gm_ir_seq2(ir, dclass(ir, 1, 9),
                               gm_ir_repeat(ir, dclass(ir, 0, 9), (uint32_t)nlo,
                                            (uint32_t)nhi - 2));
    memset(a, '0', nhi);
    a[0] = '1';
    a[nhi] = '\0';
    if (hi != NULL)
        strcpy(b, hi);
    else {
        memset(b, '9', nhi);
        b[nhi] = '\0';
    }
    alts[k++] = same_len(ir, a, b);
    return gm_ir_alt(ir, alts, k);
}

/* ---- fraction digits in a range ----------------------------------------- */

/* Digit strings d_i.. (from position i) such that 0.d lies between 0.lo
 * and 0.hi (padded with zeros), given that the digits before i equal
 * lo's (lt) / hi's (ht); at most FRAC_DIGITS digits in all; may be empty
 * when `empty_ok` and the constraints allow it. */
static int32_t frac_tail(struct gm_ir *ir, const char *lo, const char *hi,
                         size_t i, int lt, int ht, int empty_ok)
{
    size_t nlo = lo != NULL ? strlen(lo) : 0;
    size_t nhi = hi != NULL ? strlen(hi) : 0;
    if (lt && i >= nlo)
        lt = 0; /* lo's remaining digits are zeros: any digit is >= */
    int can_end = empty_ok && !lt; /* ending: zeros follow; <= hi always */
    if (i >= FRAC_DIGITS)
        return can_end ? gm_ir_empty(ir) : gm_ir_alt(ir, NULL, 0);
    if (!lt && !ht) {
        uint32_t left = (uint32_t)(FRAC_DIGITS - i);
        return gm_ir_repeat(ir, dclass(ir, 0, 9), empty_ok ? 0 : 1, left);
    }
    int low = lt ? lo[i] - '0' : 0;
    int high = ht ? (i < nhi ? hi[i] - '0' : 0) : 9;
    int32_t alts[4];
    size_t k = 0;
    if (can_end)
        alts[k++] = gm_ir_empty(ir);
    if (low <= high) {
        /* the tight digits, and the free ones between them */
        if (lt && ht && low == high) {
            alts[k++] = gm_ir_seq2(ir, dclass(ir, low, low),
                                   frac_tail(ir, lo, hi, i + 1, 1, 1, 1));
        } else {
            int a = low, b = high;
            if (lt) {
                alts[k++] = gm_ir_seq2(ir, dclass(ir, low, low),
                                       frac_tail(ir, lo, hi, i + 1, 1, 0, 1));
                a = low + 1;
            }
            if (ht) {
                alts[k++] = gm_ir_seq2(ir, dclass(ir, high, high),
                                       frac_tail(ir, lo, hi, i + 1, 0, 1, 1));
                b = high - 1;
            }
            if (a <= b)
                alts[k++] = gm_ir_seq2(ir, dclass(ir, a, b),
                                       frac_tail(ir, lo, hi, i + 1, 0, 0, 1));
        }
    }
    return gm_ir_alt(ir, alts, k);
}

/* The optional fraction "(\.[0-9]+)?" with 0.F in [0.lo, 0.hi] (NULL: no
 * bound on that side; lo "" is 0, hi "" is 0 as well). */
static int32_t frac_part(struct gm_ir *ir, const char *lo, const char *hi)
{
    int lt = lo != NULL && lo[0] != '\0';
    int ht = hi != NULL;
    int32_t dot = gm_ir_seq2(ir, gm_ir_str(ir, "."),
                             frac_tail(ir, lo, hi, 0, lt, ht, 0));
    return lt ? dot : gm_ir_opt(ir, dot);
}

/* ---- non-negative decimals in a range ----------------------------------- */

/* Non-negative fixed-point numbers x with lo <= x <= hi (hi NULL: none). */
static int32_t pos_range(struct gm_ir *ir, const struct dec *lo,
                         const struct dec *hi)
{
    int32_t alts[3];
    size_t k = 0;
    if (hi != NULL && strcmp(lo->i, hi->i) == 0) {
        return gm_ir_seq2(ir, gm_ir_str(ir, lo->i),
                          frac_part(ir, lo->f, hi->f));
    }
    if (hi != NULL && dec_cmp(lo->i, hi->i) > 0)
        return gm_ir_alt(ir, NULL, 0);
    alts[k++] = gm_ir_seq2(ir, gm_ir_str(ir, lo->i),
                           frac_part(ir, lo->f, NULL));
    char a[DEC_MAX + 2], b[DEC_MAX + 2];
    strcpy(a, lo->i);
    dec_inc(a);
    if (hi == NULL) {
        alts[k++] = gm_ir_seq2(ir, int_range(ir, a, NULL),
                               frac_part(ir, NULL, NULL));
    } else {
        strcpy(b, hi->i);
        dec_dec(b);
        if (dec_cmp(a, b) <= 0)
            alts[k++] = gm_ir_seq2(ir, int_range(ir, a, b),
                                   frac_part(ir, NULL, NULL));
        alts[k++] = gm_ir_seq2(ir, gm_ir_str(ir, hi->i),
                               frac_part(ir, "", hi->f));
    }
    return gm_ir_alt(ir, alts, k);
}

/* ---- integers modulo m ------------------------------------------------ */

struct modb {
    struct gm_ir *ir;
    uint32_t m;
    int32_t digit[10];  /* the class of each digit, made once */
    int32_t *free_rule; /* (INT_DIGITS + 1) * m: k digits left, rem r */
};

/* Digit strings of exactly k digits that take remainder r to 0 (mod m):
 * one rule per (k, r), shared. */
static int32_t mod_free(struct modb *mb, uint32_t k, uint32_t r)
{
    struct gm_ir *ir = mb->ir;
    int32_t *slot = &mb->free_rule[(size_t)k * mb->m + r];
    if (*slot >= 0)
        return gm_ir_ref(ir, *slot);
    if (k == 0)
        return r == 0 ? gm_ir_empty(ir) : gm_ir_alt(ir, NULL, 0);
    int32_t rule = gm_ir_rule(ir, "multiple");
    if (rule < 0)
        return rule;
    *slot = rule;
    int32_t alts[10];
    size_t n = 0;
    for (int d = 0; d < 10; d++) {
        uint32_t r2 = (uint32_t)((r * 10u + (uint32_t)d) % mb->m);
        alts[n++] = gm_ir_seq2(ir, mb->digit[d], mod_free(mb, k - 1, r2));
    }
    int rc = gm_ir_rule_define(ir, rule, gm_ir_alt(ir, alts, n));
    return rc != 0 ? rc : gm_ir_ref(ir, rule);
}

/* Digit strings d_i.. of the same length as lo and hi (equal lengths),
 * between them as tight flags say, taking remainder r to 0. */
static int32_t mod_tight(struct modb *mb, const char *lo, const char *hi,
                         size_t i, int lt, int ht, uint32_t r)
{
    struct gm_ir *ir = mb->ir;
    size_t n = strlen(lo);
    if (i == n)
        return r == 0 ? gm_ir_empty(ir) : gm_ir_alt(ir, NULL, 0);
    if (!lt && !ht)
        return mod_free(mb, (uint32_t)(n - i), r);
    int low = lt ? lo[i] - '0' : 0, high = ht ? hi[i] - '0' : 9;
    int32_t alts[10];
    size_t k = 0;
    for (int d = low; d <= high; d++) {
        uint32_t r2 = (uint32_t)((r * 10u + (uint32_t)d) % mb->m);
        alts[k++] = gm_ir_seq2(
            ir, dclass(ir, d, d),
            mod_tight(mb, lo, hi, i + 1, lt && d == low, ht && d == high, r2));
    }
    return gm_ir_alt(ir, alts, k);
}

/* Multiples of m in [lo, hi] (hi NULL: INT_DIGITS digits at most); both
 * of at most INT_DIGITS digits (the caller clamps). */
static int32_t mod_range(struct modb *mb, const char *lo, const char *hi)
{
    struct gm_ir *ir = mb->ir;
    size_t nlo = strlen(lo), nhi = hi != NULL ? strlen(hi) : INT_DIGITS;
    if ((hi != NULL && dec_cmp(lo, hi) > 0) || nlo > nhi)
        return gm_ir_alt(ir, NULL, 0);
    int32_t alts[INT_DIGITS + 2];
    size_t k = 0;
    for (size_t d = nlo; d <= nhi; d++) {
        char a[INT_DIGITS + 2], b[INT_DIGITS + 2];
        int tl = d == nlo, th = hi != NULL && d == nhi;
        if (!tl && !th) {
            /* a first digit 1-9, then any d - 1 digits of the remainder */
            int32_t first[9];
            for (int f = 1; f <= 9; f++)
                first[f - 1] = gm_ir_seq2(
                    ir, dclass(ir, f, f),
                    mod_free(mb, (uint32_t)d - 1, (uint32_t)f % mb->m));
            alts[k++] = gm_ir_alt(ir, first, 9);
            continue;
        }
        if (tl)
            strcpy(a, lo);
        else {
            memset(a, '0', d);
            a[0] = '1';
            a[d] = '\0';
        }
        if (th)
            strcpy(b, hi);
        else {
            memset(b, '9', d);
            b[d] = '\0';
        }
        alts[k++] = mod_tight(mb, a, b, 0, 1, 1, 0);
    }
    return gm_ir_alt(ir, alts, k);
}

/* ---- the keywords ------------------------------------------------------- */

struct bounds {
    int has_lo, has_hi;
    double lo, hi; /* inclusive, after exclusive ones were moved */
};

/* Reads minimum/maximum and the exclusive forms (numbers; draft-04's
 * boolean exclusiveMinimum/Maximum too). Returns 0 or a code. */
static int32_t read_bounds(struct gm__sc *c, const json_t *s, struct bounds *b)
{
    memset(b, 0, sizeof(*b));
    static const char *const names[4] = {"minimum", "exclusiveMinimum",
                                         "maximum", "exclusiveMaximum"};
    const json_t *v[4];
    for (int k = 0; k < 4; k++) {
        v[k] = json_object_get(s, names[k]);
        if (v[k] != NULL && !json_is_number(v[k]) &&
            !(k % 2 == 1 && json_is_boolean(v[k])))
            return gm__schema_fail(c, TG_EFORMAT, "malformed \"%s\"", names[k]);
        if (json_is_number(v[k]) && !isfinite(json_number_value(v[k])))
            return gm__schema_fail(c, TG_EFORMAT, "\"%s\" is not finite",
                                   names[k]);
    }
    for (int side = 0; side < 2; side++) {
        const json_t *inc = v[2 * side], *exc = v[2 * side + 1];
        double best = side == 0 ? -INFINITY : INFINITY;
        int have = 0;
        if (json_is_number(inc)) {
            best = json_number_value(inc);
            have = 1;
        }
        if (json_is_number(exc)) {
            double e = json_number_value(exc);
            e = nextafter(e, side == 0 ? INFINITY : -INFINITY);
            if (!have || (side == 0 ? e > best : e < best))
                best = e;
            have = 1;
        } else if (json_is_true(exc) && json_is_number(inc)) {
            best = nextafter(best, side == 0 ? INFINITY : -INFINITY);
        }
        if (side == 0) {
            b->has_lo = have;
            b->lo = best;
        } else {
            b->has_hi = have;
            b->hi = best;
        }
    }
    return 0;
}

/* An integral double as its decimal digits (no sign). */
static void int_digits(double v, char *out, size_t cap)
{
    snprintf(out, cap, "%.0f", fabs(v));
}

/* The integers in [lo, hi] (as doubles, ±INFINITY for none), multiples
 * of m (0: any). */
static int32_t int_expr(struct gm__sc *c, double lo, double hi, uint32_t m)
{
    struct gm_ir *ir = c->ir;
    lo = ceil(lo);
    hi = floor(hi);
    if (lo > hi)
        return gm__schema_fail(c, TG_EINVAL,
                               "no integer lies in the range: no document "
                               "satisfies it");
    struct modb mb = {.ir = ir, .m = m};
    for (int d = 0; d < 10; d++)
        mb.digit[d] = dclass(ir, d, d);
    if (m > 1) {
        size_t n = (size_t)(INT_DIGITS + 1) * m;
        mb.free_rule = malloc(n * sizeof(*mb.free_rule));
        if (mb.free_rule == NULL)
            return gm_ir_fail(ir, TG_ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++)
            mb.free_rule[i] = -1;
    }
    if (m > 1) {
        /* the remainder automaton reads at most INT_DIGITS digits: a
         * bound beyond that is no bound for what it generates */
        double cap = 1e18 - 1;
        if (lo < -cap || hi > cap) {
            if (lo < -cap)
                lo = -INFINITY;
            if (hi > cap)
                hi = INFINITY;
        }
        if ((isfinite(lo) && lo > cap) || (isfinite(hi) && hi < -cap)) {
            free(mb.free_rule);
            return gm__schema_fail(c, TG_EUNSUPPORTED,
                                   "\"multipleOf\" with a range beyond %d "
                                   "digits is not supported",
                                   INT_DIGITS);
        }
    }
    char a[DEC_MAX + 2], b[DEC_MAX + 2];
    int32_t alts[2];
    size_t k = 0;
    /* non-negative part [max(lo, 0), hi] */
    if (hi >= 0) {
        int_digits(lo > 0 ? lo : 0, a, sizeof a);
        if (isfinite(hi))
            int_digits(hi, b, sizeof b);
        alts[k++] = m > 1 ? mod_range(&mb, a, isfinite(hi) ? b : NULL)
                          : int_range(ir, a, isfinite(hi) ? b : NULL);
    }
    /* negative part: "-" y, y in [max(-hi, 1), -lo] */
    if (lo < 0) {
        int_digits(hi < -1 ? -hi : 1, a, sizeof a);
        if (isfinite(lo))
            int_digits(-lo, b, sizeof b);
        int32_t y = m > 1 ? mod_range(&mb, a, isfinite(lo) ? b : NULL)
                          : int_range(ir, a, isfinite(lo) ? b : NULL);
        alts[k++] = gm_ir_seq2(ir, gm_ir_str(ir, "-"), y);
    }
    free(mb.free_rule);
    return gm_ir_alt(ir, alts, k);
}

/* The numbers in [lo, hi] (doubles, ±INFINITY for none) in fixed point. */
static int32_t num_expr(struct gm__sc *c, double lo, double hi)
{
    struct gm_ir *ir = c->ir;
    if (lo > hi)
        return gm__schema_fail(c, TG_EINVAL,
                               "the range is empty: no document satisfies it");
    struct dec *d = malloc(2 * sizeof(*d));
    if (d == NULL)
        return gm_ir_fail(ir, TG_ENOMEM, "out of memory");
    int32_t alts[2];
    size_t k = 0;
    if (hi >= 0) {
        dec_of(lo > 0 ? lo : 0, &d[0]);
        if (isfinite(hi))
            dec_of(hi, &d[1]);
        alts[k++] = pos_range(ir, &d[0], isfinite(hi) ? &d[1] : NULL);
    }
    if (lo < 0) {
        /* "-" y with y in [max(-hi, 0), -lo]: "-0" is 0, in range when
         * hi >= 0 */
        dec_of(hi < 0 ? -hi : 0, &d[0]);
        if (isfinite(lo))
            dec_of(-lo, &d[1]);
        alts[k++] = gm_ir_seq2(
            ir, gm_ir_str(ir, "-"),
            pos_range(ir, &d[0], isfinite(lo) ? &d[1] : NULL));
    }
    free(d);
    return gm_ir_alt(ir, alts, k);
}

int32_t gm__schema_number(struct gm__sc *c, const json_t *s, unsigned types)
{
    struct bounds b;
    int32_t rc = read_bounds(c, s, &b);
    if (rc < 0)
        return rc;
    const json_t *mo = json_object_get(s, "multipleOf");
    uint32_t m = 0;
    int integral = (types & GM__T_FRAC) == 0;
    if (mo != NULL) {
        double mv = json_is_number(mo) ? json_number_value(mo) : 0;
        if (!(mv > 0) || !isfinite(mv))
            return gm__schema_fail(c, TG_EFORMAT,
                                   "\"multipleOf\" must be a number above 0");
        double inv = 1.0 / mv;
        if (mv == floor(mv) && mv <= MOD_MAX) {
            m = (uint32_t)mv;
            integral = 1; /* a multiple of an integer is an integer */
        } else if (mv == floor(mv)) {
            return gm__schema_fail(c, TG_ETOOBIG,
                                   "\"multipleOf\" %.17g is over the limit %d",
                                   mv, MOD_MAX);
        } else if (integral && inv == floor(inv)) {
            m = 0; /* every integer is a multiple of 1/k */
        } else {
            return gm__schema_fail(
                c, TG_EUNSUPPORTED,
                "\"multipleOf\" %.17g is not supported for %s (only an "
                "integer, or 1/k for integers: validators divide in "
                "floating point)",
                mv, integral ? "integers" : "numbers");
        }
    }
    if (!b.has_lo && !b.has_hi && m <= 1)
        return gm_ir_ref(c->ir, integral ? gm_json_integer(c->j)
                                         : gm_json_number(c->j));
    double lo = b.has_lo ? b.lo : -INFINITY, hi = b.has_hi ? b.hi : INFINITY;
    /* an open side is bounded by the digit counts */
    if (integral)
        return int_expr(c, lo, hi, m);
    return num_expr(c, lo, hi);
}
