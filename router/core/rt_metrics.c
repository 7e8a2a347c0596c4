/* rt_metrics.c — Prometheus registry and text exposition 0.0.4 (see
 * rt_metrics.h). */
#include "router/core/rt_metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* ---- names and text --------------------------------------------------- */

static const char *const hist_suffix[3] = {"_bucket", "_sum", "_count"};

/* Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names: the same without
 * ':' (Prometheus data model, "Metric names and labels"). */
static int valid_name(const char *s, int allow_colon)
{
    if (s == NULL || *s == '\0')
        return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 c == '_' || (allow_colon && c == ':') ||
                 (p != s && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

/* Well-formed UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing
 * above U+10FFFF. The exposition format is UTF-8 text. */
static int valid_utf8(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s;
        int n;
        uint32_t cp;
        if (c < 0x80) {
            s++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        for (int i = 1; i <= n; i++) {
            if ((s[i] & 0xC0) != 0x80)
                return 0; /* also stops at the terminator */
            cp = (cp << 6) | (s[i] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        s += n + 1;
    }
    return 1;
}

/* 1 when a == b followed by suffix. */
static int is_name_plus(const char *a, const char *b, const char *suffix)
{
    size_t lb = strlen(b);
    return strncmp(a, b, lb) == 0 && strcmp(a + lb, suffix) == 0;
}

/* Whether families named n1 and n2 would print a common name (family name
 * or sample name). No suffix of a histogram ends with another, so two
 * suffixed names can only meet when the bare names are equal. */
static int names_collide(const char *n1, int hist1, const char *n2, int hist2)
{
    if (strcmp(n1, n2) == 0)
        return 1;
    for (int i = 0; i < 3; i++) {
        if (hist2 && is_name_plus(n1, n2, hist_suffix[i]))
            return 1;
        if (hist1 && is_name_plus(n2, n1, hist_suffix[i]))
            return 1;
    }
    return 0;
}

int rt_metrics_format_double(double v, char *dst, size_t dstlen)
{
    if (isnan(v))
        return snprintf(dst, dstlen, "NaN");
    if (isinf(v))
        return snprintf(dst, dstlen, v > 0 ? "+Inf" : "-Inf");
    /* Every integer below 2^53 is exact in a double and "%.0f" prints it
     * without an exponent, which is how token counts should read. */
    if (v == floor(v) && fabs(v) < 9007199254740992.0)
        return snprintf(dst, dstlen, "%.0f", v);
    /* 17 significant digits always round-trip (IEEE 754 binary64); fewer
     * usually do and read better ("0.1", not "0.10000000000000001"). The
     * longest result, "-1.2345678901234567e-308", is 24 bytes. */
    char tmp[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    return snprintf(dst, dstlen, "%s", tmp);
}

/* ---- writing -------------------------------------------------------- */

static void w_double(struct tg_buf *w, double v)
{
    char tmp[40];
    int n = rt_metrics_format_double(v, tmp, sizeof(tmp));
    tg_buf_append(w, tmp, (size_t)n);
}

static void w_u64(struct tg_buf *w, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%" PRIu64, v);
    tg_buf_append(w, tmp, (size_t)n);
}

/* Appends s escaped for a label value (\ " newline) or, with
 * label = 0, for help text (\ newline), exposition format 0.0.4. */
static void w_escaped(struct tg_buf *w, const char *s, int label)
{
    const char *run = s;
    for (const char *p = s;; p++) {
        const char *esc = NULL;
        if (*p == '\\')
            esc = "\\\\";
        else if (*p == '\n')
            esc = "\\n";
        else if (*p == '"' && label)
            esc = "\\\"";
        else if (*p != '\0')
            continue;
        tg_buf_append(w, run, (size_t)(p - run));
        if (*p == '\0')
            return;
        tg_buf_puts(w, esc);
        run = p + 1;
    }
}

/* ---- registry --------------------------------------------------------- */

void rt_metrics_registry_init(struct rt_metrics_registry *reg)
{
    memset(reg, 0, sizeof(*reg));
}

static void series_free(struct rt_metrics_series *s)
{
    if (s == NULL)
        return;
    free(s->labels);
    free(s->buckets);
    free(s);
}

static void family_free(struct rt_metrics_family *f)
{
    if (f == NULL)
        return;
    for (int i = 0; i < f->n_series; i++)
        series_free(f->series[i]);
    free(f->series);
    if (f->bound_text != NULL)
        for (int i = 0; i < f->n_bounds; i++)
            free(f->bound_text[i]);
    free(f->bound_text);
    free(f->bounds);
    for (int i = 0; i < RT_METRICS_MAX_LABELS; i++)
        free(f->label_names[i]);
    free(f->help);
    free(f->name);
    free(f);
}

void rt_metrics_registry_free(struct rt_metrics_registry *reg)
{
    if (reg == NULL)
        return;
    for (int i = 0; i < reg->n_families; i++)
        family_free(reg->families[i]);
    free(reg->families);
    memset(reg, 0, sizeof(*reg));
}

struct rt_metrics_family *rt_metrics_family_find(
    const struct rt_metrics_registry *reg, const char *name)
{
    for (int i = 0; i < reg->n_families; i++)
        if (strcmp(reg->families[i]->name, name) == 0)
            return reg->families[i];
    return NULL;
}

static const char *type_name(enum rt_metrics_type t)
{
    switch (t) {
    case RT_METRICS_COUNTER: return "counter";
    case RT_METRICS_GAUGE: return "gauge";
    case RT_METRICS_HISTOGRAM: return "histogram";
    }
    return NULL;
}

/* Checks everything rt_metrics_family_add promises to reject as TG_EINVAL
 * or TG_EEXIST, before anything is allocated. */
static int family_check(const struct rt_metrics_registry *reg,
                        const char *name, const char *help,
                        enum rt_metrics_type type, int n_labels,
                        const char *const *label_names, const double *bounds,
                        int n_bounds, char *err, size_t errlen)
{
    if (!valid_name(name, 1))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: invalid metric name '%s'",
                          name ? name : "(null)");
    if (type_name(type) == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: %s: unknown type %d", name, (int)type);
    if (help != NULL && !valid_utf8(help))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: %s: help text is not valid UTF-8", name);
    if (n_labels < 0 || n_labels > RT_METRICS_MAX_LABELS ||
        (n_labels > 0 && label_names == NULL))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: %s: %d label names (0..%d allowed)", name,
                          n_labels, RT_METRICS_MAX_LABELS);
    for (int i = 0; i < n_labels; i++) {
        const char *ln = label_names[i];
        if (!valid_name(ln, 0) || strncmp(ln, "__", 2) == 0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "metrics: %s: invalid label name '%s'", name,
                              ln ? ln : "(null)");
        if (type == RT_METRICS_HISTOGRAM && strcmp(ln, "le") == 0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "metrics: %s: label 'le' is reserved for "
                              "histogram buckets", name);
        for (int j = 0; j < i; j++)
            if (strcmp(label_names[j], ln) == 0)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "metrics: %s: label '%s' given twice", name,
                                  ln);
    }
    if (type != RT_METRICS_HISTOGRAM && n_bounds != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: %s: only histograms take bounds", name);
    if (n_bounds < 0 || n_bounds > RT_METRICS_MAX_BOUNDS ||
        (n_bounds > 0 && bounds == NULL))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: %s: %d bounds (0..%d allowed)", name,
                          n_bounds, RT_METRICS_MAX_BOUNDS);
    for (int i = 0; i < n_bounds; i++) {
        if (!isfinite(bounds[i]))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "metrics: %s: bound %d is not finite (+Inf is "
                              "implicit)", name, i);
        if (i > 0 && !(bounds[i] > bounds[i - 1]))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "metrics: %s: bounds not strictly increasing "
                              "at %d (%g after %g)", name, i, bounds[i],
                              bounds[i - 1]);
    }
    for (int i = 0; i < reg->n_families; i++) {
        const struct rt_metrics_family *e = reg->families[i];
        if (names_collide(name, type == RT_METRICS_HISTOGRAM, e->name,
                          e->type == RT_METRICS_HISTOGRAM))
            return tg_err_set(err, errlen, TG_EEXIST,
                              "metrics: %s collides with registered metric "
                              "'%s'", name, e->name);
    }
    return 0;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p != NULL)
        memcpy(p, s, n);
    return p;
}

int rt_metrics_family_add(struct rt_metrics_registry *reg, const char *name,
                          const char *help, enum rt_metrics_type type,
                          int n_labels, const char *const *label_names,
                          const double *bounds, int n_bounds,
                          struct rt_metrics_family **out, char *err,
                          size_t errlen)
{
    int rc = family_check(reg, name, help, type, n_labels, label_names,
                          bounds, n_bounds, err, errlen);
    if (rc != 0)
        return rc;

    struct rt_metrics_family *f = calloc(1, sizeof(*f));
    if (f == NULL)
        goto oom;
    f->type = type;
    f->n_labels = n_labels;
    f->n_bounds = n_bounds;
    f->name = dup_str(name);
    f->help = dup_str(help ? help : "");
    if (f->name == NULL || f->help == NULL)
        goto oom;
    for (int i = 0; i < n_labels; i++)
        if ((f->label_names[i] = dup_str(label_names[i])) == NULL)
            goto oom;
    if (n_bounds > 0) {
        f->bounds = malloc((size_t)n_bounds * sizeof(double));
        f->bound_text = calloc((size_t)n_bounds, sizeof(char *));
        if (f->bounds == NULL || f->bound_text == NULL)
            goto oom;
        memcpy(f->bounds, bounds, (size_t)n_bounds * sizeof(double));
        for (int i = 0; i < n_bounds; i++) {
            char tmp[40];
            rt_metrics_format_double(bounds[i], tmp, sizeof(tmp));
            if ((f->bound_text[i] = dup_str(tmp)) == NULL)
                goto oom;
        }
    }
    if (TG_GROW(reg->families, &reg->cap_families,
                (int64_t)reg->n_families + 1))
        goto oom;
    reg->families[reg->n_families++] = f;
    *out = f;
    return 0;

oom:
    family_free(f);
    return tg_err_set(err, errlen, TG_ENOMEM, "metrics: %s: out of memory",
                      name);
}

/* Renders `k="v",...` with escaped values into a new string (NULL when out
 * of memory). */
static char *render_labels(const struct rt_metrics_family *f,
                           const char *const *values)
{
    struct tg_buf b = {0}, *w = &b;
    for (int i = 0; i < f->n_labels; i++) {
        if (i > 0)
            tg_buf_puts(w, ",");
        tg_buf_puts(w, f->label_names[i]);
        tg_buf_puts(w, "=\"");
        w_escaped(w, values[i], 1);
        tg_buf_puts(w, "\"");
    }
    if (tg_buf_failed(&b)) {
        tg_buf_free(&b);
        return NULL;
    }
    /* Keep only what is used: series labels live for the whole run. */
    char *s = dup_str(tg_buf_str(&b));
    tg_buf_free(&b);
    return s;
}

int rt_metrics_series_add(struct rt_metrics_family *family,
                          const char *const *values,
                          struct rt_metrics_series **out, char *err,
                          size_t errlen)
{
    const char *fn = family->name;
    if (family->n_labels > 0 && values == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: %s: %d label values needed, got none", fn,
                          family->n_labels);
    for (int i = 0; i < family->n_labels; i++) {
        if (values[i] == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "metrics: %s: value of label '%s' is NULL", fn,
                              family->label_names[i]);
        if (!valid_utf8(values[i]))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "metrics: %s: value of label '%s' is not valid "
                              "UTF-8", fn, family->label_names[i]);
    }

    struct rt_metrics_series *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto oom;
    s->family = family;
    if ((s->labels = render_labels(family, values)) == NULL)
        goto oom;
    /* Equal escaped text <=> equal values: the names are the family's and
     * escaping is injective. */
    for (int i = 0; i < family->n_series; i++)
        if (strcmp(family->series[i]->labels, s->labels) == 0) {
            int rc = tg_err_set(err, errlen, TG_EEXIST,
                                "metrics: %s{%s} is already registered", fn,
                                s->labels);
            series_free(s);
            return rc;
        }
    if (family->type == RT_METRICS_HISTOGRAM) {
        s->buckets = calloc((size_t)family->n_bounds + 1, sizeof(uint64_t));
        if (s->buckets == NULL)
            goto oom;
    }
    if (TG_GROW(family->series, &family->cap_series,
                (int64_t)family->n_series + 1))
        goto oom;
    family->series[family->n_series++] = s;
    *out = s;
    return 0;

oom:
    series_free(s);
    return tg_err_set(err, errlen, TG_ENOMEM, "metrics: %s: out of memory",
                      fn);
}

int rt_metrics_single_add(struct rt_metrics_registry *reg, const char *name,
                          const char *help, enum rt_metrics_type type,
                          const double *bounds, int n_bounds,
                          struct rt_metrics_series **out, char *err,
                          size_t errlen)
{
    struct rt_metrics_family *f;
    int rc = rt_metrics_family_add(reg, name, help, type, 0, NULL, bounds,
                                   n_bounds, &f, err, errlen);
    if (rc != 0)
        return rc;
    rc = rt_metrics_series_add(f, NULL, out, err, errlen);
    if (rc != 0) {
        /* Undo the registration so failure leaves the registry unchanged. */
        reg->n_families--;
        family_free(f);
    }
    return rc;
}

/* ---- updates ---------------------------------------------------------- */

int rt_metrics_counter_add(struct rt_metrics_series *s, double v)
{
    TG_ASSERT(s->family->type == RT_METRICS_COUNTER);
    if (!(v >= 0.0) || isinf(v))
        return TG_EINVAL;
    s->value += v;
    return 0;
}

void rt_metrics_counter_inc(struct rt_metrics_series *s)
{
    TG_ASSERT(s->family->type == RT_METRICS_COUNTER);
    s->value += 1.0;
}

void rt_metrics_gauge_set(struct rt_metrics_series *s, double v)
{
    TG_ASSERT(s->family->type == RT_METRICS_GAUGE);
    s->value = v;
}

void rt_metrics_gauge_add(struct rt_metrics_series *s, double v)
{
    TG_ASSERT(s->family->type == RT_METRICS_GAUGE);
    s->value += v;
}

int rt_metrics_histogram_observe(struct rt_metrics_series *s, double v)
{
    const struct rt_metrics_family *f = s->family;
    TG_ASSERT(f->type == RT_METRICS_HISTOGRAM);
    if (isnan(v))
        return TG_EINVAL;
    /* First bound >= v (buckets are "less than or equal"). */
    int lo = 0, hi = f->n_bounds;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (f->bounds[mid] >= v)
            hi = mid;
        else
            lo = mid + 1;
    }
    s->buckets[lo]++;
    s->sum += v;
    s->count++;
    return 0;
}

double rt_metrics_series_value(const struct rt_metrics_series *s)
{
    return s->value;
}

uint64_t rt_metrics_histogram_cumulative(const struct rt_metrics_series *s,
                                         int i)
{
    TG_ASSERT(s->family->type == RT_METRICS_HISTOGRAM);
    TG_ASSERT(i >= 0 && i <= s->family->n_bounds);
    uint64_t c = 0;
    for (int k = 0; k <= i; k++)
        c += s->buckets[k];
    return c;
}

/* ---- rendering -------------------------------------------------------- */

/* <name><suffix>{<labels>[,<extra>]} — braces only when there are labels. */
static void w_series_name(struct tg_buf *w, const struct rt_metrics_family *f,
                          const char *suffix, const struct rt_metrics_series *s,
                          const char *le)
{
    tg_buf_puts(w, f->name);
    tg_buf_puts(w, suffix);
    int has = s->labels[0] != '\0';
    if (!has && le == NULL)
        return;
    tg_buf_puts(w, "{");
    tg_buf_puts(w, s->labels);
    if (le != NULL) {
        tg_buf_puts(w, has ? ",le=\"" : "le=\"");
        tg_buf_puts(w, le);
        tg_buf_puts(w, "\"");
    }
    tg_buf_puts(w, "}");
}

static void render_histogram(struct tg_buf *w,
                             const struct rt_metrics_family *f,
                             const struct rt_metrics_series *s)
{
    uint64_t cum = 0;
    for (int i = 0; i <= f->n_bounds; i++) {
        cum += s->buckets[i];
        w_series_name(w, f, "_bucket", s,
                      i < f->n_bounds ? f->bound_text[i] : "+Inf");
        tg_buf_puts(w, " ");
        w_u64(w, cum);
        tg_buf_puts(w, "\n");
    }
    w_series_name(w, f, "_sum", s, NULL);
    tg_buf_puts(w, " ");
    w_double(w, s->sum);
    tg_buf_puts(w, "\n");
    w_series_name(w, f, "_count", s, NULL);
    tg_buf_puts(w, " ");
    w_u64(w, s->count);
    tg_buf_puts(w, "\n");
}

int rt_metrics_render(const struct rt_metrics_registry *reg, struct tg_buf *out,
                      char *err, size_t errlen)
{
    size_t len0 = out->len;
    int failed0 = tg_buf_failed(out);
    struct tg_buf *w = out;
    tg_buf_reserve(w, 0); /* an empty registry still leaves a terminated
                             buffer */
    for (int i = 0; i < reg->n_families && !tg_buf_failed(w); i++) {
        const struct rt_metrics_family *f = reg->families[i];
        if (f->help[0] != '\0') {
            tg_buf_puts(w, "# HELP ");
            tg_buf_puts(w, f->name);
            tg_buf_puts(w, " ");
            w_escaped(w, f->help, 0);
            tg_buf_puts(w, "\n");
        }
        tg_buf_puts(w, "# TYPE ");
        tg_buf_puts(w, f->name);
        tg_buf_puts(w, " ");
        tg_buf_puts(w, type_name(f->type));
        tg_buf_puts(w, "\n");
        for (int k = 0; k < f->n_series; k++) {
            const struct rt_metrics_series *s = f->series[k];
            if (f->type == RT_METRICS_HISTOGRAM) {
                render_histogram(w, f, s);
            } else {
                w_series_name(w, f, "", s, NULL);
                tg_buf_puts(w, " ");
                w_double(w, s->value);
                tg_buf_puts(w, "\n");
            }
        }
    }
    if (tg_buf_failed(w)) {
        /* All or nothing: the buffer as it was. */
        tg_buf_truncate(out, len0);
        out->failed = failed0;
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "metrics: out of memory rendering %d families",
                          reg->n_families);
    }
    return 0;
}
