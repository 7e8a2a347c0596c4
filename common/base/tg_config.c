/* tg_config.c — declarative configuration table: table checks, defaults,
 * TANGRAM_* env and flags (tg_config.h). --help and the JSON dump are in
 * tg_config_help.c. */
#include "common/base/tg_config.h"
#include "common/base/tg_config_internal.h"
#include "common/base/tg_err.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ENV_PREFIX "TANGRAM_"
#define NAME_MAX_LEN 64  /* longest flag name a table may use */

/* Where a value came from, for error messages: "--tp", "TANGRAM_TP" or
 * "default of --tp". */
struct origin {
    char text[NAME_MAX_LEN + 32];
};

static void *field_ptr(void *dst, const struct tg_config_entry *e)
{
    return (char *)dst + e->offset;
}

const struct tg_config__type_info tg_config__types[] = {
    {"bool", NULL, sizeof(bool)},
    {"int", "N", sizeof(int64_t)},
    {"double", "X", sizeof(double)},
    {"string", "STR", sizeof(char *)},
    {"size", "BYTES", sizeof(uint64_t)},
    {"size|frac", "BYTES|FRAC", sizeof(struct tg_config_amount)},
    {"enum", NULL, sizeof(int)},
};

static bool has_range(const struct tg_config_entry *e)
{
    return e->max > e->min;
}

int tg_config_env_name(const struct tg_config_entry *e, char *buf, size_t len)
{
    size_t pre = strlen(ENV_PREFIX), nl = strlen(e->name);
    if (len < pre + nl + 1)
        return TG_ETOOBIG;
    memcpy(buf, ENV_PREFIX, pre);
    for (size_t i = 0; i < nl; i++) {
        char c = e->name[i];
        buf[pre + i] = c == '-' ? '_' : (char)toupper((unsigned char)c);
    }
    buf[pre + nl] = '\0';
    return 0;
}

/* ---- value formatting (help text and error messages) ------------------ */

/* Writes v as bytes with the largest IEC unit that divides it exactly
 * ("8GiB", "1536KiB", "1000"). */
static void format_bytes(uint64_t v, char *buf, size_t len)
{
    static const char *const units[] = {"PiB", "TiB", "GiB", "MiB", "KiB"};
    if (v != 0) {
        for (int i = 0; i < 5; i++) {
            uint64_t u = (uint64_t)1 << (10 * (5 - i));
            if (v % u == 0) {
                snprintf(buf, len, "%llu%s", (unsigned long long)(v / u),
                         units[i]);
                return;
            }
        }
    }
    snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* Shortest "%.*g" text of x that reads back to x, so a bound such as
 * 1.0000001 is not shown rounded to "1" (17 significant digits always
 * suffice for an IEEE double; infinity prints as "inf"). */
static void format_shortest(double x, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

/* Formats a range bound of an entry of type t. */
static void format_bound(enum tg_config_type t, double x, char *buf,
                         size_t len)
{
    if ((t == TG_CONFIG_SIZE || t == TG_CONFIG_SIZE_FRAC) && x >= 0 &&
        x < 18446744073709551616.0 && x == floor(x))
        format_bytes((uint64_t)x, buf, len);
    else if (t == TG_CONFIG_INT && fabs(x) < 9.2e18 && x == floor(x))
        snprintf(buf, len, "%lld", (long long)x);
    else
        format_shortest(x, buf, len);
}

void tg_config__format_range(const struct tg_config_entry *e, char *buf,
                             size_t len)
{
    char lo[48], hi[48];
    buf[0] = '\0';
    format_bound(e->type, e->min, lo, sizeof lo);
    format_bound(e->type, e->max, hi, sizeof hi);
    switch (e->type) {
    case TG_CONFIG_INT:
    case TG_CONFIG_DOUBLE:
    case TG_CONFIG_SIZE:
        if (has_range(e))
            snprintf(buf, len, "[%s, %s]", lo, hi);
        break;
    case TG_CONFIG_SIZE_FRAC:
        if (has_range(e))
            snprintf(buf, len, "(0, 1] or [%s, %s]", lo, hi);
        else
            snprintf(buf, len, "(0, 1] or bytes");
        break;
    case TG_CONFIG_ENUM: {
        size_t off = 0;
        for (size_t i = 0; e->choices != NULL && e->choices[i] != NULL &&
                           off < len;
             i++) {
            int w = snprintf(buf + off, len - off, "%s%s", i ? "|" : "",
                             e->choices[i]);
            if (w < 0)
                break;
            off += (size_t)w;
        }
        break;
    }
    case TG_CONFIG_BOOL:
    case TG_CONFIG_STRING:
        break;
    }
}

/* ---- value parsing ---------------------------------------------------- */

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return TG_EFORMAT;
}

static int parse_int(const char *s, int64_t *out)
{
    if (s[0] == '\0' || isspace((unsigned char)s[0]))
        return TG_EFORMAT;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0')
        return TG_EFORMAT;
    if (errno == ERANGE)
        return TG_ERANGE;
    *out = (int64_t)v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    if (s[0] == '\0' || isspace((unsigned char)s[0]))
        return TG_EFORMAT;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || isnan(v))
        return TG_EFORMAT;
    if (isinf(v) || errno == ERANGE) {
        /* strtod also reports ERANGE on underflow to (near) zero; that is a
         * fine value, only overflow and explicit "inf" are errors. */
        if (isinf(v) || fabs(v) > 1.0)
            return TG_ERANGE;
    }
    *out = v;
    return 0;
}

/* Splits "1.5GiB" into its numeric span [s, *num_end) and unit multiplier.
 * *had_unit tells whether any unit letters were present. */
static int split_size(const char *s, const char **num_end, uint64_t *mult,
                      bool *had_unit, bool *has_frac)
{
    const char *q = s;
    if (!(isdigit((unsigned char)q[0]) ||
          (q[0] == '.' && isdigit((unsigned char)q[1]))))
        return TG_EFORMAT;
    while (isdigit((unsigned char)*q))
        q++;
    *has_frac = false;
    if (*q == '.') {
        *has_frac = true;
        q++;
        while (isdigit((unsigned char)*q))
            q++;
    }
    *num_end = q;
    *mult = 1;
    *had_unit = *q != '\0';
    if (*q == '\0')
        return 0;
    static const char units[] = "bkmgt"; /* index = power of the base */
    const char *u = strchr(units, tolower((unsigned char)*q));
    if (u == NULL)
        return TG_EFORMAT;
    int power = (int)(u - units);
    q++;
    if (power > 0) { /* else a lone "B" */
        uint64_t base = 1000;
        if (*q == 'i' || *q == 'I') {
            base = 1024;
            q++;
        }
        if (*q == 'b' || *q == 'B')
            q++;
        for (int i = 0; i < power; i++)
            *mult *= base;
    }
    return *q == '\0' ? 0 : TG_EFORMAT;
}

static int parse_size(const char *s, uint64_t *out, bool *had_unit)
{
    const char *num_end;
    uint64_t mult;
    bool frac;
    int rc = split_size(s, &num_end, &mult, had_unit, &frac);
    if (rc != 0)
        return rc;
    char num[64];
    size_t nl = (size_t)(num_end - s);
    if (nl >= sizeof num)
        return TG_ERANGE;
    memcpy(num, s, nl);
    num[nl] = '\0';
    if (!frac) {
        errno = 0;
        unsigned long long v = strtoull(num, NULL, 10);
        if (errno == ERANGE || (mult > 1 && v > UINT64_MAX / mult))
            return TG_ERANGE;
        *out = (uint64_t)v * mult;
        return 0;
    }
    /* Fractional sizes ("1.5GiB") are computed in double and rounded down
     * to whole bytes. */
    double d = strtod(num, NULL) * (double)mult;
    if (!(d < 18446744073709551616.0))
        return TG_ERANGE;
    *out = (uint64_t)d;
    return 0;
}

/* Error text of the SIZE_FRAC syntax, shared by the messages below. */
#define SIZE_FRAC_HINT \
    "a fraction in (0, 1] (\"0.9\" or \"90%%\") or bytes with a unit (\"8GiB\")"

static int parse_size_frac(const struct tg_config_entry *e, const char *s,
                           struct tg_config_amount *out, const char *who,
                           char *err, size_t errlen)
{
    size_t len = strlen(s);
    if (len > 1 && s[len - 1] == '%') {
        char num[64];
        double pct;
        snprintf(num, sizeof num, "%.*s", (int)(len - 1), s);
        if (len - 1 >= sizeof num ||
            (!isdigit((unsigned char)num[0]) && num[0] != '.') ||
            parse_double(num, &pct) != 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: '%s' is not " SIZE_FRAC_HINT, who, s);
        if (!(pct > 0 && pct <= 100))
            return tg_err_set(err, errlen, TG_ERANGE,
                              "%s: %s is out of range (0%%, 100%%]", who, s);
        *out = (struct tg_config_amount){.is_fraction = true,
                                         .fraction = pct / 100.0};
        return 0;
    }
    uint64_t bytes;
    bool had_unit;
    int rc = parse_size(s, &bytes, &had_unit);
    if (rc == TG_EFORMAT)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: '%s' is not " SIZE_FRAC_HINT, who, s);
    if (rc == TG_ERANGE)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "%s: '%s' is too many bytes", who, s);
    bool all_digits = strspn(s, "0123456789") == len;
    if (had_unit || (all_digits && bytes > 1)) {
        if (has_range(e) && ((double)bytes < e->min || (double)bytes > e->max)) {
            char lo[48], hi[48];
            format_bound(e->type, e->min, lo, sizeof lo);
            format_bound(e->type, e->max, hi, sizeof hi);
            return tg_err_set(err, errlen, TG_ERANGE,
                              "%s: %s is out of range [%s, %s] bytes%s", who,
                              s, lo, hi,
                              had_unit ? "" : " (a plain number above 1 "
                                              "counts as bytes; a fraction "
                                              "is in (0, 1])");
        }
        *out = (struct tg_config_amount){.is_fraction = false, .bytes = bytes};
        return 0;
    }
    double f = strtod(s, NULL);
    if (!(f > 0 && f <= 1))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "%s: %s is out of range: a plain number is a "
                          "fraction in (0, 1]; give bytes with a unit "
                          "(\"8GiB\")", who, s);
    *out = (struct tg_config_amount){.is_fraction = true, .fraction = f};
    return 0;
}

static int range_error(const struct tg_config_entry *e, const char *who,
                       const char *s, char *err, size_t errlen)
{
    char lo[48], hi[48];
    if (!has_range(e))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "%s: %s is out of range (does not fit in 64 bits)",
                          who, s);
    format_bound(e->type, e->min, lo, sizeof lo);
    format_bound(e->type, e->max, hi, sizeof hi);
    return tg_err_set(err, errlen, TG_ERANGE, "%s: %s is out of range [%s, %s]",
                      who, s, lo, hi);
}

/* The common tail of the numeric types: rc is the parser's code, x the
 * parsed value, what the expected syntax ("an integer"). */
static int check_number(const struct tg_config_entry *e, int rc, double x,
                        const char *what, const char *who, const char *s,
                        char *err, size_t errlen)
{
    if (rc == TG_EFORMAT)
        return tg_err_set(err, errlen, rc, "%s: '%s' is not %s", who, s, what);
    if (rc != 0 || (has_range(e) && (x < e->min || x > e->max)))
        return range_error(e, who, s, err, errlen);
    return 0;
}

/* Parses `s` as the value of entry e and stores it in dst. `who` names the
 * source for messages. On failure dst is left unchanged. */
static int set_value(const struct tg_config_entry *e, void *dst, const char *s,
                     const char *who, char *err, size_t errlen)
{
    void *f = field_ptr(dst, e);
    int rc;
    switch (e->type) {
    case TG_CONFIG_BOOL: {
        bool b;
        if (parse_bool(s, &b) != 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: '%s' is not a boolean (true|false|1|0|"
                              "yes|no|on|off)", who, s);
        *(bool *)f = b;
        return 0;
    }
    case TG_CONFIG_INT: {
        int64_t v = 0;
        rc = parse_int(s, &v); /* before reading v below */
        rc = check_number(e, rc, (double)v, "an integer", who, s, err,
                          errlen);
        if (rc == 0)
            *(int64_t *)f = v;
        return rc;
    }
    case TG_CONFIG_DOUBLE: {
        double v = 0;
        rc = parse_double(s, &v);
        rc = check_number(e, rc, v, "a number", who, s, err, errlen);
        if (rc == 0)
            *(double *)f = v;
        return rc;
    }
    case TG_CONFIG_STRING: {
        char *copy = strdup(s);
        if (copy == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "%s: out of memory",
                              who);
        char **p = f;
        free(*p);
        *p = copy;
        return 0;
    }
    case TG_CONFIG_SIZE: {
        uint64_t v = 0;
        bool had_unit;
        rc = parse_size(s, &v, &had_unit);
        rc = check_number(e, rc, (double)v, "a size (bytes, optionally with a unit K M G T or "
                          "Ki Mi Gi Ti)", who, s, err, errlen);
        if (rc == 0)
            *(uint64_t *)f = v;
        return rc;
    }
    case TG_CONFIG_SIZE_FRAC: {
        struct tg_config_amount a;
        rc = parse_size_frac(e, s, &a, who, err, errlen);
        if (rc != 0)
            return rc;
        *(struct tg_config_amount *)f = a;
        return 0;
    }
    case TG_CONFIG_ENUM: {
        for (size_t i = 0; e->choices[i] != NULL; i++) {
            if (strcasecmp(s, e->choices[i]) == 0) {
                *(int *)f = (int)i;
                return 0;
            }
        }
        char list[256];
        tg_config__format_range(e, list, sizeof list);
        return tg_err_set(err, errlen, TG_EINVAL, "%s: '%s' is not one of %s",
                          who, s, list);
    }
    }
    return tg_err_set(err, errlen, TG_EINVAL, "%s: unknown type %d", who,
                      (int)e->type);
}

/* Zeroes the field of e (freeing a string). */
static void clear_value(const struct tg_config_entry *e, void *dst)
{
    void *f = field_ptr(dst, e);
    if (e->type == TG_CONFIG_STRING)
        free(*(char **)f);
    /* zero is a NULL pointer for strings */
    memset(f, 0, tg_config__types[e->type].size);
}

/* ---- table checks and lookup ------------------------------------------ */

static int check_table(const struct tg_config_entry *table, size_t n,
                       char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        const struct tg_config_entry *e = &table[i];
        const char *nm = e->name;
        if (nm == NULL || nm[0] == '\0' || strlen(nm) > NAME_MAX_LEN ||
            nm[0] == '-' || strspn(nm, "abcdefghijklmnopqrstuvwxyz0123456789-")
                                != strlen(nm))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "config table entry %zu: bad name '%s'", i,
                              nm != NULL ? nm : "(null)");
        if (strcmp(nm, "help") == 0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "config table: 'help' is reserved");
        if ((unsigned)e->type > (unsigned)TG_CONFIG_ENUM)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "config table: --%s has unknown type %d", nm,
                              (int)e->type);
        if (e->type == TG_CONFIG_ENUM &&
            (e->choices == NULL || e->choices[0] == NULL))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "config table: enum --%s has no choices", nm);
        for (size_t j = 0; j < i; j++)
            if (strcmp(table[j].name, nm) == 0)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "config table: --%s listed twice", nm);
        char c = e->short_flag;
        if (c == 0)
            continue;
        if (!isalnum((unsigned char)c) || c == 'h')
            return tg_err_set(err, errlen, TG_EINVAL,
                              "config table: --%s has a bad short flag",
                              nm);
        for (size_t j = 0; j < i; j++)
            if (table[j].short_flag == c)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "config table: -%c given to --%s and --%s",
                                  c, table[j].name, nm);
    }
    return 0;
}

static const struct tg_config_entry *
find_short(const struct tg_config_entry *table, size_t n, char c)
{
    for (size_t i = 0; c != 0 && i < n; i++)
        if (table[i].short_flag == c)
            return &table[i];
    return NULL;
}

static const struct tg_config_entry *
find_entry(const struct tg_config_entry *table, size_t n, const char *name,
           size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(table[i].name) == len &&
            memcmp(table[i].name, name, len) == 0)
            return &table[i];
    return NULL;
}

/* Edit distance between a[0..la) and b[0..lb) (both at most
 * NAME_MAX_LEN + 3 long) counting insertions, deletions, substitutions and
 * swaps of adjacent characters as one edit each: the "optimal string
 * alignment" variant of Damerau-Levenshtein, so "--cuont" finds "--count". */
static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb)
{
    size_t rows[3][NAME_MAX_LEN + 4];
    size_t *pp = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            size_t m = sub < del ? sub : del;
            m = m < ins ? m : ins;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] &&
                a[i - 2] == b[j - 1] && pp[j - 2] + 1 < m)
                m = pp[j - 2] + 1;
            cur[j] = m;
        }
        size_t *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb];
}

/* Writes the closest flag name to name[0..len) into out ("" when nothing is
 * close): edit distance at most max(1, min(3, len/3)), else a known name
 * that contains the given one (at least 3 characters). */
static void suggest(const struct tg_config_entry *table, size_t n,
                    const char *name, size_t len, char *out, size_t outlen)
{
    out[0] = '\0';
    if (len > NAME_MAX_LEN)
        return;
    size_t best = (size_t)-1, limit = len / 3;
    if (limit > 3)
        limit = 3;
    if (limit < 1)
        limit = 1;
    for (size_t i = 0; i < n; i++) {
        char cand[NAME_MAX_LEN + 4];
        for (int neg = 0; neg < 2; neg++) {
            if (neg && table[i].type != TG_CONFIG_BOOL)
                continue;
            snprintf(cand, sizeof cand, "%s%s", neg ? "no-" : "",
                     table[i].name);
            size_t d = edit_distance(name, len, cand, strlen(cand));
            if (d <= limit && d < best) {
                best = d;
                snprintf(out, outlen, "%s", cand);
            }
        }
    }
    if (out[0] != '\0' || len < 3)
        return;
    for (size_t i = 0; i < n; i++) {
        if (memmem(table[i].name, strlen(table[i].name), name, len) != NULL) {
            snprintf(out, outlen, "%s", table[i].name);
            return;
        }
    }
}

static int unknown_flag(const struct tg_config_entry *table, size_t n,
                        const char *name, size_t len, char *err,
                        size_t errlen)
{
    /* Only the name is echoed: a mistyped --api-kye=VALUE must not put the
     * value into logs. */
    char s[NAME_MAX_LEN + 4];
    int nl = len > 200 ? 200 : (int)len;
    suggest(table, n, name, len, s, sizeof s);
    return tg_err_set(err, errlen, TG_EINVAL, "unknown flag '--%.*s' (%s%s%s)",
                      nl, name, s[0] ? "did you mean --" : "see --help", s,
                      s[0] ? "?" : "");
}

/* ---- parsing ---------------------------------------------------------- */

/* True when argv holds --help or -h before "--", skipping the values of
 * flags that take a separate value argument (as apply_flag would take them:
 * never an argument starting with "--"). */
static bool wants_help(const struct tg_config_entry *table, size_t n,
                       int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            return false;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return true;
        const struct tg_config_entry *e = NULL;
        if (strncmp(a, "--", 2) == 0 && strchr(a, '=') == NULL)
            e = find_entry(table, n, a + 2, strlen(a + 2));
        else if (a[0] == '-' && a[1] != '-' && a[1] != '\0' && a[2] == '\0')
            e = find_short(table, n, a[1]); /* "-o" without its value */
        if (e != NULL && e->type != TG_CONFIG_BOOL && i + 1 < argc &&
            strncmp(argv[i + 1], "--", 2) != 0)
            i++;
    }
    return false;
}

static const char *env_lookup(char **envp, const char *key)
{
    if (envp == NULL)
        return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; envp[i] != NULL; i++)
        if (strncmp(envp[i], key, kl) == 0 && envp[i][kl] == '=')
            return envp[i] + kl + 1;
    return NULL;
}

static int apply_defaults(const struct tg_config_entry *table, size_t n,
                          void *dst, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        const struct tg_config_entry *e = &table[i];
        clear_value(e, dst);
        if (e->def == NULL)
            continue;
        struct origin o;
        snprintf(o.text, sizeof o.text, "config table: default of --%s",
                 e->name);
        int rc = set_value(e, dst, e->def, o.text, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int apply_env(const struct tg_config_entry *table, size_t n, void *dst,
                     char **envp, bool *set, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        struct origin o;
        /* Names are checked to be short, so this cannot fail. */
        TG_ASSERT(tg_config_env_name(&table[i], o.text, sizeof o.text) == 0);
        const char *v = env_lookup(envp, o.text);
        if (v == NULL)
            continue;
        int rc = set_value(&table[i], dst, v, o.text, err, errlen);
        if (rc != 0)
            return rc;
        set[i] = true;
    }
    return 0;
}

static int add_positional(struct tg_config_cli *cli, int idx, char **argv,
                          char *err, size_t errlen)
{
    if (cli == NULL || cli->positional == NULL || cli->positional_cap == 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "unexpected argument '%s' (options are --name "
                          "value; see --help)", argv[idx]);
    if (cli->npositional >= cli->positional_cap)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "too many arguments at '%s' (at most %zu)",
                          argv[idx], cli->positional_cap);
    cli->positional[cli->npositional++] = idx;
    return 0;
}

/* Sets e from the argument after argv[*i] and advances *i past it; `who`
 * names the flag as given. */
static int take_next_value(const struct tg_config_entry *e, void *dst,
                           int argc, char **argv, int *i, const char *who,
                           char *err, size_t errlen)
{
    if (*i + 1 >= argc)
        return tg_err_set(err, errlen, TG_EINVAL, "%s: missing value", who);
    const char *v = argv[*i + 1];
    /* A value that looks like a flag is almost always a forgotten value;
     * such values can still be passed as --name=--value. */
    if (strncmp(v, "--", 2) == 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: missing value (next argument is '%s'; use "
                          "--%s=VALUE for a value starting with --)",
                          who, v, e->name);
    (*i)++;
    return set_value(e, dst, v, who, err, errlen);
}

/* Applies argv[i] (and possibly argv[i + 1]); advances *i past what it
 * consumed. */
static int apply_flag(const struct tg_config_entry *table, size_t n,
                      void *dst, int argc, char **argv, int *i, bool *set,
                      char *err, size_t errlen)
{
    const char *a = argv[*i];
    const char *name = a + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    bool negated = false;
    if (len == 4 && memcmp(name, "help", 4) == 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--help does not take a value");
    const struct tg_config_entry *e = find_entry(table, n, name, len);
    if (e == NULL && len > 3 && memcmp(name, "no-", 3) == 0) {
        e = find_entry(table, n, name + 3, len - 3);
        if (e != NULL && e->type == TG_CONFIG_BOOL)
            negated = true;
        else
            e = NULL;
    }
    if (e == NULL)
        return unknown_flag(table, n, name, len, err, errlen);
    struct origin o;
    snprintf(o.text, sizeof o.text, "--%s", e->name);
    set[e - table] = true;
    if (negated) {
        if (eq != NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--no-%s does not take a value", e->name);
        *(bool *)field_ptr(dst, e) = false;
        return 0;
    }
    if (eq != NULL)
        return set_value(e, dst, eq + 1, o.text, err, errlen);
    if (e->type == TG_CONFIG_BOOL) {
        *(bool *)field_ptr(dst, e) = true;
        return 0;
    }
    return take_next_value(e, dst, argc, argv, i, o.text, err, errlen);
}

/* Applies "-c", "-cVALUE" or "-c VALUE" (argv[*i]) for the entry whose
 * short_flag is c. */
static int apply_short(const struct tg_config_entry *table, size_t n,
                       void *dst, int argc, char **argv, int *i, bool *set,
                       char *err, size_t errlen)
{
    const char *a = argv[*i];
    const struct tg_config_entry *e = find_short(table, n, a[1]);
    if (e == NULL) {
        char s[NAME_MAX_LEN + 4];
        suggest(table, n, a + 1, strlen(a + 1), s, sizeof s);
        return tg_err_set(err, errlen, TG_EINVAL,
                          "unknown option '%s' (%s%s%s)", a,
                          s[0] ? "did you mean --" : "flags are --name; "
                                                     "see --help",
                          s, s[0] ? "?" : "");
    }
    struct origin o;
    snprintf(o.text, sizeof o.text, "-%c (--%s)", a[1], e->name);
    set[e - table] = true;
    if (e->type == TG_CONFIG_BOOL) {
        if (a[2] != '\0')
            return tg_err_set(err, errlen, TG_EINVAL,
                              "%s does not take a value", o.text);
        *(bool *)field_ptr(dst, e) = true;
        return 0;
    }
    if (a[2] != '\0')
        return set_value(e, dst, a + 2, o.text, err, errlen);
    return take_next_value(e, dst, argc, argv, i, o.text, err, errlen);
}

static int apply_argv(const struct tg_config_entry *table, size_t n,
                      void *dst, struct tg_config_cli *cli, int argc,
                      char **argv, bool *set, char *err, size_t errlen)
{
    bool only_positional = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc;
        if (!only_positional && strcmp(a, "--") == 0) {
            only_positional = true;
            continue;
        }
        if (only_positional || a[0] != '-' || a[1] == '\0') {
            rc = add_positional(cli, i, argv, err, errlen);
        } else if (a[1] != '-') {
            rc = apply_short(table, n, dst, argc, argv, &i, set, err,
                             errlen);
        } else {
            rc = apply_flag(table, n, dst, argc, argv, &i, set, err, errlen);
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int check_required(const struct tg_config_entry *table, size_t n,
                          const void *dst, const bool *set, bool no_env,
                          char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        const struct tg_config_entry *e = &table[i];
        if (!(e->flags & TG_CONFIG_REQUIRED))
            continue;
        char env[NAME_MAX_LEN + 16];
        TG_ASSERT(tg_config_env_name(e, env, sizeof env) == 0);
        char alias[8] = "";
        if (e->short_flag != 0)
            snprintf(alias, sizeof alias, "-%c, ", e->short_flag);
        if (!set[i] && e->def == NULL && no_env)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "missing required %s--%s", alias, e->name);
        if (!set[i] && e->def == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "missing required %s--%s (or environment "
                              "variable %s)", alias, e->name, env);
        if (e->type == TG_CONFIG_STRING) {
            const char *s = *(char *const *)((const char *)dst + e->offset);
            if ((s == NULL || s[0] == '\0') && no_env)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "--%s must not be empty", e->name);
            if (s == NULL || s[0] == '\0')
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "--%s (%s) must not be empty", e->name,
                                  env);
        }
    }
    return 0;
}

int tg_config_parse_cli(const struct tg_config_entry *table, size_t n,
                        void *dst, struct tg_config_cli *cli, int argc,
                        char **argv, char **envp, char *err, size_t errlen)
{
    bool no_env = cli != NULL && cli->no_env;
    if (cli != NULL)
        cli->npositional = 0;
    if (no_env)
        envp = NULL;
    int rc = check_table(table, n, err, errlen);
    if (rc != 0)
        return rc;
    rc = apply_defaults(table, n, dst, err, errlen);
    if (rc != 0)
        return rc;
    if (wants_help(table, n, argc, argv)) {
        if (cli != NULL && cli->help_out != NULL) {
            rc = tg_config__help(table, n, cli->usage, !no_env,
                                 cli->help_out);
            if (rc != 0)
                return tg_err_set(err, errlen, rc, "writing --help failed");
        }
        return tg_err_set(err, errlen, TG_EDONE, "help requested");
    }
    bool *set = calloc(n != 0 ? n : 1, sizeof *set);
    if (set == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    rc = apply_env(table, n, dst, envp, set, err, errlen);
    if (rc == 0)
        rc = apply_argv(table, n, dst, cli, argc, argv, set, err, errlen);
    if (rc == 0)
        rc = check_required(table, n, dst, set, no_env, err, errlen);
    free(set);
    return rc;
}

int tg_config_parse(const struct tg_config_entry *table, size_t n, void *dst,
                    int argc, char **argv, char **envp, char *err,
                    size_t errlen)
{
    return tg_config_parse_cli(table, n, dst, NULL, argc, argv, envp, err,
                               errlen);
}

void tg_config_free(const struct tg_config_entry *table, size_t n, void *dst)
{
    if (dst == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        if (table[i].type != TG_CONFIG_STRING)
            continue;
        char **p = field_ptr(dst, &table[i]);
        free(*p);
        *p = NULL;
    }
}
