/* tt_prom.c — validating reader of the Prometheus text exposition format
 * 0.0.4 (see tt_prom.h). The rules follow the format's documentation
 * (prometheus.io/docs/instrumenting/exposition_formats). */
#include "tests/support/tt_prom.h"

#include "common/base/tg_grow.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/core/rt_metrics.h"

#define PV_MAX 512

struct pv_family {
    char name[128];
    char type[16];
    int has_help;
    int has_type;
};

struct pv_hist {
    char key[640]; /* family name + '\x01' + labels other than le */
    int n_buckets;
    double last_le;
    double last_count;
    int has_inf;
    double inf_count;
    int has_sum;
    int has_count;
    double count;
};

struct pv {
    struct pv_family fam[PV_MAX];
    int n_fam;
    int cur; /* family whose samples are being read, -1 before any */
    struct pv_hist hist[PV_MAX];
    int n_hist;
    char **seen; /* (n_seen) full series names, for duplicates */
    int n_seen;
    int cap_seen;
    char why[256];
};

static int pv_fail(struct pv *p, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int pv_fail(struct pv *p, int line, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(p->why, sizeof(p->why), "line %d: %s", line, msg);
    return -1;
}

/* Length of a name at s ([a-zA-Z_:][a-zA-Z0-9_:]*, no ':' for labels). */
static size_t pv_name_len(const char *s, int colon)
{
    size_t n = 0;
    for (;; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (colon && c == ':') || (n > 0 && c >= '0' && c <= '9')))
            return n;
    }
}

/* A float as Prometheus' Go ParseFloat reads our output. */
static int pv_float(const char *s, size_t n, double *out)
{
    char tmp[64];
    if (n == 0 || n >= sizeof(tmp))
        return -1;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    if (strcmp(tmp, "+Inf") == 0 || strcmp(tmp, "Inf") == 0) {
        *out = INFINITY;
        return 0;
    }
    if (strcmp(tmp, "-Inf") == 0) {
        *out = -INFINITY;
        return 0;
    }
    if (strcmp(tmp, "NaN") == 0) {
        *out = NAN;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789.eE+-", tmp[i]))
            return -1;
    char *end;
    *out = strtod(tmp, &end);
    return *end == '\0' ? 0 : -1;
}

static int pv_find_family(const struct pv *p, const char *name, size_t n)
{
    for (int i = 0; i < p->n_fam; i++)
        if (strlen(p->fam[i].name) == n && memcmp(p->fam[i].name, name, n) == 0)
            return i;
    return -1;
}

/* Which family a sample name belongs to, and its histogram suffix. */
static int pv_owner(const struct pv *p, const char *name, size_t n,
                    const char **suffix)
{
    *suffix = "";
    int f = pv_find_family(p, name, n);
    if (f >= 0 && strcmp(p->fam[f].type, "histogram") != 0)
        return f;
    static const char *const sfx[3] = {"_bucket", "_sum", "_count"};
    for (int k = 0; k < 3; k++) {
        size_t ls = strlen(sfx[k]);
        if (n > ls && memcmp(name + n - ls, sfx[k], ls) == 0) {
            f = pv_find_family(p, name, n - ls);
            if (f >= 0 && strcmp(p->fam[f].type, "histogram") == 0) {
                *suffix = sfx[k];
                return f;
            }
        }
    }
    return -1;
}

static struct pv_hist *pv_hist_get(struct pv *p, const char *key)
{
    for (int i = 0; i < p->n_hist; i++)
        if (strcmp(p->hist[i].key, key) == 0)
            return &p->hist[i];
    if (p->n_hist == PV_MAX)
        return NULL;
    struct pv_hist *h = &p->hist[p->n_hist++];
    memset(h, 0, sizeof(*h));
    snprintf(h->key, sizeof(h->key), "%s", key);
    h->last_le = -INFINITY;
    return h;
}

/* Parses `{k="v",...}` at *s; appends non-le labels to key, le to *le. */
static int pv_labels(struct pv *p, int ln, const char **s, char *key,
                     size_t keylen, int *has_le, double *le)
{
    const char *q = *s + 1;
    char names[8][64];
    int n_names = 0;
    *has_le = 0;
    while (*q != '}') {
        size_t n = pv_name_len(q, 0);
        if (n == 0 || n >= 64)
            return pv_fail(p, ln, "bad label name");
        for (int i = 0; i < n_names; i++)
            if (strlen(names[i]) == n && memcmp(names[i], q, n) == 0)
                return pv_fail(p, ln, "label repeated");
        if (n_names == 8)
            return pv_fail(p, ln, "too many labels");
        memcpy(names[n_names], q, n);
        names[n_names++][n] = '\0';
        int is_le = n == 2 && memcmp(q, "le", 2) == 0;
        const char *lname = q;
        q += n;
        if (q[0] != '=' || q[1] != '"')
            return pv_fail(p, ln, "expected =\" after label name");
        q += 2;
        const char *v = q;
        while (*q != '"') {
            if (*q == '\0' || *q == '\n')
                return pv_fail(p, ln, "unterminated label value");
            if (*q == '\\') {
                if (q[1] != '\\' && q[1] != '"' && q[1] != 'n')
                    return pv_fail(p, ln, "bad escape in label value");
                q++;
            }
            q++;
        }
        if (is_le) {
            if (pv_float(v, (size_t)(q - v), le) != 0)
                return pv_fail(p, ln, "le is not a float");
            *has_le = 1;
        } else {
            size_t kl = strlen(key);
            snprintf(key + kl, keylen - kl, "%.*s=%.*s;", (int)n, lname,
                     (int)(q - v), v);
        }
        q++;
        if (*q == ',')
            q++;
        else if (*q != '}')
            return pv_fail(p, ln, "expected , or } after label");
    }
    *s = q + 1;
    return 0;
}

static int pv_sample(struct pv *p, int ln, const char *s)
{
    size_t n = pv_name_len(s, 1);
    if (n == 0)
        return pv_fail(p, ln, "bad metric name");
    const char *suffix;
    int f = pv_owner(p, s, n, &suffix);
    if (f < 0)
        return pv_fail(p, ln, "sample '%.*s' has no # TYPE before it", (int)n,
                       s);
    if (f != p->cur)
        return pv_fail(p, ln, "samples of '%s' are not contiguous",
                       p->fam[f].name);
    char full[1024];
    snprintf(full, sizeof(full), "%.*s", (int)n, s);
    char key[640];
    snprintf(key, sizeof(key), "%s\x01", p->fam[f].name);
    const char *q = s + n;
    int has_le = 0;
    double le = 0;
    if (*q == '{') {
        const char *l0 = q;
        if (pv_labels(p, ln, &q, key, sizeof(key), &has_le, &le) != 0)
            return -1;
        size_t fl = strlen(full);
        snprintf(full + fl, sizeof(full) - fl, "%.*s", (int)(q - l0), l0);
    }
    if (*q != ' ')
        return pv_fail(p, ln, "expected a space before the value");
    q++;
    const char *v = q;
    while (*q != '\0' && *q != ' ')
        q++;
    double val;
    if (pv_float(v, (size_t)(q - v), &val) != 0)
        return pv_fail(p, ln, "bad value '%.*s'", (int)(q - v), v);
    if (*q == ' ') { /* optional timestamp: an integer */
        q++;
        if (*q == '\0')
            return pv_fail(p, ln, "empty timestamp");
        for (const char *t = (*q == '-') ? q + 1 : q; *t; t++)
            if (*t < '0' || *t > '9')
                return pv_fail(p, ln, "bad timestamp");
    }
    for (int i = 0; i < p->n_seen; i++)
        if (strcmp(p->seen[i], full) == 0)
            return pv_fail(p, ln, "duplicate series %s", full);
    assert_int_equal(TG_GROW(p->seen, &p->cap_seen, p->n_seen + 1), 0);
    p->seen[p->n_seen++] = strdup(full);

    const char *type = p->fam[f].type;
    if (strcmp(type, "counter") == 0 && (isnan(val) || val < 0))
        return pv_fail(p, ln, "counter value %g is negative or NaN", val);
    if (strcmp(type, "histogram") != 0) {
        if (has_le)
            return pv_fail(p, ln, "le label outside a histogram bucket");
        return 0;
    }
    struct pv_hist *h = pv_hist_get(p, key);
    if (h == NULL)
        return pv_fail(p, ln, "too many histogram series");
    if (strcmp(suffix, "_bucket") == 0) {
        if (!has_le)
            return pv_fail(p, ln, "bucket without le");
        if (h->has_inf || h->has_sum || h->has_count)
            return pv_fail(p, ln, "bucket after +Inf, _sum or _count");
        if (!(le > h->last_le))
            return pv_fail(p, ln, "le %g not above previous %g", le,
                           h->last_le);
        if (!(val >= h->last_count) || val != floor(val))
            return pv_fail(p, ln, "bucket count %g below previous %g or "
                           "not an integer", val, h->last_count);
        h->last_le = le;
        h->last_count = val;
        h->n_buckets++;
        if (isinf(le) && le > 0) {
            h->has_inf = 1;
            h->inf_count = val;
        }
    } else {
        if (has_le)
            return pv_fail(p, ln, "le on %s", suffix);
        if (strcmp(suffix, "_sum") == 0) {
            if (h->has_sum)
                return pv_fail(p, ln, "second _sum");
            h->has_sum = 1;
        } else {
            if (h->has_count)
                return pv_fail(p, ln, "second _count");
            h->has_count = 1;
            h->count = val;
        }
    }
    return 0;
}

static int pv_comment(struct pv *p, int ln, const char *s)
{
    int help = strncmp(s, "# HELP ", 7) == 0;
    int type = strncmp(s, "# TYPE ", 7) == 0;
    if (!help && !type)
        return 0; /* a plain comment */
    const char *q = s + 7;
    size_t n = pv_name_len(q, 1);
    if (n == 0 || n >= 128)
        return pv_fail(p, ln, "bad name in # HELP/# TYPE");
    int f = pv_find_family(p, q, n);
    if (f < 0) {
        if (p->n_fam == PV_MAX)
            return pv_fail(p, ln, "too many families");
        f = p->n_fam++;
        memset(&p->fam[f], 0, sizeof(p->fam[f]));
        memcpy(p->fam[f].name, q, n);
    } else if (f != p->cur) {
        return pv_fail(p, ln, "family '%s' is not contiguous",
                       p->fam[f].name);
    }
    p->cur = f;
    q += n;
    if (*q != ' ')
        return pv_fail(p, ln, "expected a space after the name");
    q++;
    if (help) {
        if (p->fam[f].has_help)
            return pv_fail(p, ln, "second # HELP");
        if (p->fam[f].has_type)
            return pv_fail(p, ln, "# HELP after # TYPE (we print it first)");
        for (; *q; q++)
            if (*q == '\\' && (q[1] != '\\' && q[1] != 'n'))
                return pv_fail(p, ln, "bad escape in help");
            else if (*q == '\\')
                q++;
        p->fam[f].has_help = 1;
        return 0;
    }
    if (p->fam[f].has_type)
        return pv_fail(p, ln, "second # TYPE");
    if (strcmp(q, "counter") && strcmp(q, "gauge") && strcmp(q, "histogram") &&
        strcmp(q, "summary") && strcmp(q, "untyped"))
        return pv_fail(p, ln, "unknown type '%s'", q);
    snprintf(p->fam[f].type, sizeof(p->fam[f].type), "%s", q);
    p->fam[f].has_type = 1;
    return 0;
}

static void pv_clear(struct pv *p)
{
    for (int i = 0; i < p->n_seen; i++)
        free(p->seen[i]);
    free(p->seen);
    p->seen = NULL;
    p->n_seen = p->cap_seen = 0;
}

/* Validates `text`; returns 0, or -1 with the reason in p->why. */
static int pv_validate(struct pv *p, const char *text)
{
    memset(p, 0, sizeof(*p));
    p->cur = -1;
    size_t len = strlen(text);
    if (len > 0 && text[len - 1] != '\n')
        return pv_fail(p, 0, "text does not end with a newline");
    char line[4096];
    int ln = 0, rc = 0;
    for (const char *s = text; *s && rc == 0;) {
        const char *e = strchr(s, '\n');
        size_t n = (size_t)(e - s);
        ln++;
        if (n == 0 || n >= sizeof(line)) {
            rc = pv_fail(p, ln, "empty or overlong line");
            break;
        }
        memcpy(line, s, n);
        line[n] = '\0';
        rc = line[0] == '#' ? pv_comment(p, ln, line) : pv_sample(p, ln, line);
        s = e + 1;
    }
    for (int i = 0; i < p->n_hist && rc == 0; i++) {
        const struct pv_hist *h = &p->hist[i];
        if (!h->has_inf || !h->has_sum || !h->has_count)
            rc = pv_fail(p, ln, "histogram series %s lacks +Inf, _sum or "
                         "_count", h->key);
        else if (h->inf_count != h->count)
            rc = pv_fail(p, ln, "+Inf bucket %g != _count %g", h->inf_count,
                         h->count);
    }
    pv_clear(p);
    return rc;
}

/* The reader's state: large (hundreds of KiB), so static, not on a stack. */
static struct pv pv_state;

int tt_prom_validate(const char *text, char *why, size_t cap)
{
    int rc = pv_validate(&pv_state, text);
    if (why != NULL && cap > 0)
        snprintf(why, cap, "%s", rc == 0 ? "" : pv_state.why);
    return rc;
}

void tt_prom_assert_valid(const char *text)
{
    if (pv_validate(&pv_state, text) != 0)
        fail_msg("invalid exposition text: %s\n%s", pv_state.why, text);
}

void tt_prom_assert_invalid(const char *text, const char *why_part)
{
    assert_int_equal(pv_validate(&pv_state, text), -1);
    if (strstr(pv_state.why, why_part) == NULL)
        fail_msg("expected '%s' in '%s'", why_part, pv_state.why);
}

char *tt_prom_render(const struct rt_metrics_registry *reg)
{
    char err[256];
    struct tg_buf b = {0};
    assert_int_equal(rt_metrics_render(reg, &b, err, sizeof(err)), 0);
    assert_non_null(b.data);
    assert_int_equal(strlen(b.data), b.len);
    return tg_buf_steal(&b, NULL);
}
