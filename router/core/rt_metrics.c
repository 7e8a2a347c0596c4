/* rt_metrics.c — Prometheus registry, text exposition 0.0.4 and the
 * tangram metric set (see rt_metrics.h). */
#include "router/core/rt_metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

/* ---- bucket bounds ---------------------------------------------------- */

/* Bucket bounds copied from vLLM's PrometheusStatLogger
 * (vllm/v1/metrics/loggers.py): histogram_time_to_first_token,
 * histogram_time_per_output_token (which vLLM's
 * vllm:inter_token_latency_seconds shares) and request_latency_buckets
 * (vllm:e2e_request_latency_seconds). Same numbers, so dashboards and SLO
 * queries written for vLLM (le="0.1", ...) work on tangram unchanged. */
const double rt_metrics_ttft_bounds[] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
};
const int rt_metrics_ttft_n_bounds =
    (int)(sizeof(rt_metrics_ttft_bounds) / sizeof(rt_metrics_ttft_bounds[0]));

const double rt_metrics_itl_bounds[] = {
    0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4,  0.5,
    0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0,
};
const int rt_metrics_itl_n_bounds =
    (int)(sizeof(rt_metrics_itl_bounds) / sizeof(rt_metrics_itl_bounds[0]));

const double rt_metrics_e2e_bounds[] = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
};
const int rt_metrics_e2e_n_bounds =
    (int)(sizeof(rt_metrics_e2e_bounds) / sizeof(rt_metrics_e2e_bounds[0]));

/* Ours (vLLM has no per-step histogram): 1-2.5-5 steps per decade from
 * 100 us, where a tiny CPU decode step lands, to 10 s, a long prefill
 * chunk of a big model on a slow backend. */
const double rt_metrics_step_bounds[] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0,
};
const int rt_metrics_step_n_bounds =
    (int)(sizeof(rt_metrics_step_bounds) / sizeof(rt_metrics_step_bounds[0]));

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

/* ---- buffer ----------------------------------------------------------- */

void rt_metrics_buf_free(struct rt_metrics_buf *buf)
{
    if (buf == NULL)
        return;
    free(buf->data);
    memset(buf, 0, sizeof(*buf));
}

/* An append cursor over a caller's buffer: the first failed growth sets
 * `failed` and later appends do nothing, so render checks once at the end. */
struct writer {
    struct rt_metrics_buf *b;
    int failed;
};

static void w_reserve(struct writer *w, size_t extra)
{
    struct rt_metrics_buf *b = w->b;
    if (w->failed)
        return;
    if (extra > SIZE_MAX / 2 - b->len) {
        w->failed = 1;
        return;
    }
    size_t need = b->len + extra + 1;
    if (need > b->cap) {
        size_t cap = b->cap < 4096 ? 4096 : b->cap;
        while (cap < need)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (p == NULL) {
            w->failed = 1;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    /* Terminated even when nothing gets appended (fresh storage, or a
     * reused buffer the caller reset with len = 0). */
    b->data[b->len] = '\0';
}

static void w_mem(struct writer *w, const char *s, size_t n)
{
    w_reserve(w, n);
    if (w->failed)
        return;
    memcpy(w->b->data + w->b->len, s, n);
    w->b->len += n;
    w->b->data[w->b->len] = '\0';
}

static void w_str(struct writer *w, const char *s) { w_mem(w, s, strlen(s)); }

static void w_double(struct writer *w, double v)
{
    char tmp[40];
    int n = rt_metrics_format_double(v, tmp, sizeof(tmp));
    w_mem(w, tmp, (size_t)n);
}

static void w_u64(struct writer *w, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%" PRIu64, v);
    w_mem(w, tmp, (size_t)n);
}

/* Appends s escaped for a label value (\ " newline) or, with
 * label = 0, for help text (\ newline), exposition format 0.0.4. */
static void w_escaped(struct writer *w, const char *s, int label)
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
        w_mem(w, run, (size_t)(p - run));
        if (*p == '\0')
            return;
        w_str(w, esc);
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
    if (reg->n_families == reg->cap_families) {
        int cap = reg->cap_families ? 2 * reg->cap_families : 16;
        struct rt_metrics_family **p =
            realloc(reg->families, (size_t)cap * sizeof(*p));
        if (p == NULL)
            goto oom;
        reg->families = p;
        reg->cap_families = cap;
    }
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
    struct rt_metrics_buf b = {0};
    struct writer w = {&b, 0};
    w_reserve(&w, 0); /* so a family without labels still gets "" */
    for (int i = 0; i < f->n_labels; i++) {
        if (i > 0)
            w_str(&w, ",");
        w_str(&w, f->label_names[i]);
        w_str(&w, "=\"");
        w_escaped(&w, values[i], 1);
        w_str(&w, "\"");
    }
    if (w.failed) {
        rt_metrics_buf_free(&b);
        return NULL;
    }
    /* Keep only what is used: series labels live for the whole run. */
    char *s = dup_str(b.data);
    rt_metrics_buf_free(&b);
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
    if (family->n_series == family->cap_series) {
        int cap = family->cap_series ? 2 * family->cap_series : 4;
        struct rt_metrics_series **p =
            realloc(family->series, (size_t)cap * sizeof(*p));
        if (p == NULL)
            goto oom;
        family->series = p;
        family->cap_series = cap;
    }
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
static void w_series_name(struct writer *w, const struct rt_metrics_family *f,
                          const char *suffix,
                          const struct rt_metrics_series *s, const char *le)
{
    w_str(w, f->name);
    w_str(w, suffix);
    int has = s->labels[0] != '\0';
    if (!has && le == NULL)
        return;
    w_str(w, "{");
    w_str(w, s->labels);
    if (le != NULL) {
        w_str(w, has ? ",le=\"" : "le=\"");
        w_str(w, le);
        w_str(w, "\"");
    }
    w_str(w, "}");
}

static void render_histogram(struct writer *w,
                             const struct rt_metrics_family *f,
                             const struct rt_metrics_series *s)
{
    uint64_t cum = 0;
    for (int i = 0; i <= f->n_bounds; i++) {
        cum += s->buckets[i];
        w_series_name(w, f, "_bucket", s,
                      i < f->n_bounds ? f->bound_text[i] : "+Inf");
        w_str(w, " ");
        w_u64(w, cum);
        w_str(w, "\n");
    }
    w_series_name(w, f, "_sum", s, NULL);
    w_str(w, " ");
    w_double(w, s->sum);
    w_str(w, "\n");
    w_series_name(w, f, "_count", s, NULL);
    w_str(w, " ");
    w_u64(w, s->count);
    w_str(w, "\n");
}

int rt_metrics_render(const struct rt_metrics_registry *reg,
                      struct rt_metrics_buf *out, char *err, size_t errlen)
{
    size_t len0 = out->len;
    struct writer w = {out, 0};
    w_reserve(&w, 0); /* an empty registry still leaves a terminated buffer */
    for (int i = 0; i < reg->n_families && !w.failed; i++) {
        const struct rt_metrics_family *f = reg->families[i];
        if (f->help[0] != '\0') {
            w_str(&w, "# HELP ");
            w_str(&w, f->name);
            w_str(&w, " ");
            w_escaped(&w, f->help, 0);
            w_str(&w, "\n");
        }
        w_str(&w, "# TYPE ");
        w_str(&w, f->name);
        w_str(&w, " ");
        w_str(&w, type_name(f->type));
        w_str(&w, "\n");
        for (int k = 0; k < f->n_series; k++) {
            const struct rt_metrics_series *s = f->series[k];
            if (f->type == RT_METRICS_HISTOGRAM) {
                render_histogram(&w, f, s);
            } else {
                w_series_name(&w, f, "", s, NULL);
                w_str(&w, " ");
                w_double(&w, s->value);
                w_str(&w, "\n");
            }
        }
    }
    if (w.failed) {
        out->len = len0;
        if (out->data != NULL)
            out->data[len0] = '\0';
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "metrics: out of memory rendering %d families",
                          reg->n_families);
    }
    return 0;
}

/* ---- the tangram metric set ------------------------------------------- */

static const char *const finish_names[RT_METRICS_FINISH_COUNT] = {
    [RT_METRICS_FINISH_STOP] = "stop",
    [RT_METRICS_FINISH_LENGTH] = "length",
    [RT_METRICS_FINISH_ABORT] = "abort",
    [RT_METRICS_FINISH_ERROR] = "error",
};

const char *rt_metrics_finish_name(enum rt_metrics_finish r)
{
    if ((int)r < 0 || r >= RT_METRICS_FINISH_COUNT)
        return NULL;
    return finish_names[r];
}

void rt_metrics_tangram_free(struct rt_metrics_tangram *m)
{
    if (m == NULL)
        return;
    rt_metrics_registry_free(&m->reg);
    free(m->kv_pages_used);
    free(m->kv_pages_capacity);
    free(m->kv_pages_cached);
    free(m->kv_pages_released);
    memset(m, 0, sizeof(*m));
}

/* One unlabelled metric of the set. */
struct single_def {
    const char *name;
    const char *help;
    enum rt_metrics_type type;
    const double *bounds;
    const int *n_bounds;
    size_t slot; /* offsetof the handle in struct rt_metrics_tangram */
};

#define SLOT(field) offsetof(struct rt_metrics_tangram, field)

/* Names mirror vLLM's (vllm: prefix -> tangram_, DESIGN.md §5); help texts
 * are ours. */
static const struct single_def single_defs[] = {
    {"tangram_num_requests_running",
     "Number of requests in the running batch (prefilling or decoding).",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(num_requests_running)},
    {"tangram_num_requests_waiting",
     "Number of requests queued for admission.", RT_METRICS_GAUGE, NULL, NULL,
     SLOT(num_requests_waiting)},
    {"tangram_tokenize_jobs_in_flight",
     "Request jobs on the router's thread pool, queued or running: large "
     "bodies parsed, prompts rendered and tokenized, /tokenize answers "
     "formatted.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(tokenize_jobs_in_flight)},
    {"tangram_kv_cache_usage_perc",
     "Fraction of KV-cache pages in use over all ranks (1 = full).",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(kv_cache_usage_perc)},
    {"tangram_kv_pages_reclaimed_ratio",
     "Fraction of the pages an all-heads (monolithic) layout would hold for "
     "the live requests that ragged per-head paging saves.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(kv_pages_reclaimed_ratio)},
    {"tangram_prompt_tokens_total", "Number of prompt tokens received.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(prompt_tokens_total)},
    {"tangram_generation_tokens_total", "Number of tokens generated.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(generation_tokens_total)},
    {"tangram_cached_prompt_tokens_total",
     "Number of prompt tokens served from stored multi-turn KV instead of "
     "being prefilled.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(cached_prompt_tokens_total)},
    {"tangram_num_preemptions_total",
     "Number of requests preempted (to be recomputed) because a page pool "
     "ran dry.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(num_preemptions_total)},
    {"tangram_time_to_first_token_seconds",
     "Histogram of time from arrival to first token, in seconds.",
     RT_METRICS_HISTOGRAM, rt_metrics_ttft_bounds, &rt_metrics_ttft_n_bounds,
     SLOT(time_to_first_token_seconds)},
    {"tangram_inter_token_latency_seconds",
     "Histogram of time between consecutive output tokens, in seconds.",
     RT_METRICS_HISTOGRAM, rt_metrics_itl_bounds, &rt_metrics_itl_n_bounds,
     SLOT(inter_token_latency_seconds)},
    {"tangram_e2e_request_latency_seconds",
     "Histogram of time from arrival to completion, in seconds.",
     RT_METRICS_HISTOGRAM, rt_metrics_e2e_bounds, &rt_metrics_e2e_n_bounds,
     SLOT(e2e_request_latency_seconds)},
    {"tangram_http_connections_open",
     "Open HTTP connections (closing ones excluded).", RT_METRICS_GAUGE,
     NULL, NULL, SLOT(http_connections_open)},
    {"tangram_http_connections_evicted_total",
     "HTTP connections closed to make room for a new one at "
     "--http-max-connections or --http-max-connections-per-ip: idle ones "
     "first, then the slowest incomplete request heads.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(http_connections_evicted_total)},
    {"tangram_http_slow_heads_evicted_total",
     "HTTP connections in the middle of a request head closed (408) to "
     "make room for a new one because nothing was idle; the slowest head "
     "goes first.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(http_slow_heads_evicted_total)},
    {"tangram_http_slow_readers_aborted_total",
     "HTTP connections cut because the client read none of its response "
     "for --http-send-timeout; their requests were aborted.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(http_slow_readers_aborted_total)},
    {"tangram_scheduler_step_seconds",
     "Histogram of scheduler step time (plan sent to result received), in "
     "seconds.",
     RT_METRICS_HISTOGRAM, rt_metrics_step_bounds, &rt_metrics_step_n_bounds,
     SLOT(scheduler_step_seconds)},
    {"tangram_grpc_connections", "Open gRPC (HTTP/2) connections.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(grpc_connections)},
    {"tangram_grpc_receive_timeouts_total",
     "gRPC streams reset because the request did not arrive within "
     "--grpc-recv-timeout (and header blocks left unfinished).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_receive_timeouts_total)},
    {"tangram_grpc_idle_closes_total",
     "gRPC connections closed after --grpc-idle-timeout without a call in "
     "progress.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_idle_closes_total)},
    {"tangram_grpc_deadline_exceeded_total",
     "gRPC calls ended by the client's deadline (grpc-timeout).",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_deadline_exceeded_total)},
    {"tangram_grpc_refused_streams_total",
     "gRPC streams refused over --grpc-max-streams on their connection.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_refused_streams_total)},
    {"tangram_grpc_oversized_messages_total",
     "gRPC request messages refused over --grpc-max-message.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_oversized_messages_total)},
    {"tangram_grpc_unauthenticated_total",
     "gRPC calls refused for a missing or wrong API key.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_unauthenticated_total)},
    {"tangram_grpc_connections_evicted_total",
     "Idle gRPC connections closed (GOAWAY) to make room for a new one at "
     "--grpc-max-connections or --grpc-max-connections-per-ip.",
     RT_METRICS_COUNTER, NULL, NULL, SLOT(grpc_connections_evicted_total)},
    {"tangram_request_body_memory_bytes",
     "Request body bytes (HTTP bodies, gRPC messages) the router holds, "
     "counted against --max-body-memory.",
     RT_METRICS_GAUGE, NULL, NULL, SLOT(request_body_memory_bytes)},
    {"tangram_request_body_memory_refused_total",
     "Requests refused (HTTP 503, gRPC UNAVAILABLE) because their body "
     "did not fit in --max-body-memory.",
     RT_METRICS_COUNTER, NULL, NULL,
     SLOT(request_body_memory_refused_total)},
};

/* One labelled counter family of the set: one series per value of its
 * label, handles in the array at `slot`. */
struct labelled_def {
    const char *name;
    const char *help;
    const char *label;
    const char *const *values; /* (n) */
    int n;
    size_t slot;               /* offsetof the handle array */
};

static const char *const http_reject_names[RT_METRICS_HTTP_REJECT_COUNT] = {
    [RT_METRICS_HTTP_REJECT_MAX] = "max_connections",
    [RT_METRICS_HTTP_REJECT_PER_IP] = "max_connections_per_ip",
};
static const char *const http_timeout_names[RT_METRICS_HTTP_TIMEOUT_COUNT] = {
    [RT_METRICS_HTTP_TIMEOUT_HEADER] = "header",
    [RT_METRICS_HTTP_TIMEOUT_BODY] = "body",
};
static const char *const http_refuse_names[RT_METRICS_HTTP_REFUSE_COUNT] = {
    [RT_METRICS_HTTP_REFUSE_UNAUTH] = "unauthenticated",
    [RT_METRICS_HTTP_REFUSE_MALFORMED] = "malformed",
    [RT_METRICS_HTTP_REFUSE_TOO_LARGE] = "too_large",
    [RT_METRICS_HTTP_REFUSE_BODY_MEMORY] = "body_memory",
};
static const char *const api_names[RT_METRICS_API_COUNT] = {
    [RT_METRICS_API_HTTP] = "http",
    [RT_METRICS_API_GRPC] = "grpc",
};

static const struct labelled_def labelled_defs[] = {
    {"tangram_http_connections_rejected_total",
     "New HTTP connections refused (503) at a connection limit, by limit.",
     "reason", http_reject_names, RT_METRICS_HTTP_REJECT_COUNT,
     SLOT(http_connections_rejected_total)},
    {"tangram_http_requests_timed_out_total",
     "HTTP requests answered 408 because their head or body did not "
     "arrive in time, by phase.",
     "phase", http_timeout_names, RT_METRICS_HTTP_TIMEOUT_COUNT,
     SLOT(http_requests_timed_out_total)},
    {"tangram_http_requests_refused_total",
     "HTTP requests refused before their body was read: without a valid "
     "API key (401), malformed (400, 501, 505), too large (413, 431) or "
     "over the body memory budget (503).",
     "reason", http_refuse_names, RT_METRICS_HTTP_REFUSE_COUNT,
     SLOT(http_requests_refused_total)},
    {"tangram_grpc_connections_rejected_total",
     "New gRPC connections refused (GOAWAY) at a connection limit, by "
     "limit.",
     "reason", http_reject_names, RT_METRICS_HTTP_REJECT_COUNT,
     SLOT(grpc_connections_rejected_total)},
    {"tangram_accept_pauses_total",
     "Times accepting new connections paused because the process ran out "
     "of file descriptors (or memory), by API.",
     "api", api_names, RT_METRICS_API_COUNT, SLOT(accept_pauses_total)},
};

/* The labelled counter families of the front ends (connections,
 * requests). */
static int add_net_families(struct rt_metrics_tangram *m, char *err,
                            size_t errlen)
{
    int rc = 0;
    for (size_t i = 0;
         rc == 0 && i < sizeof(labelled_defs) / sizeof(labelled_defs[0]);
         i++) {
        const struct labelled_def *d = &labelled_defs[i];
        struct rt_metrics_series **dst =
            (struct rt_metrics_series **)((char *)m + d->slot);
        struct rt_metrics_family *f;
        rc = rt_metrics_family_add(&m->reg, d->name, d->help,
                                   RT_METRICS_COUNTER, 1, &d->label, NULL, 0,
                                   &f, err, errlen);
        for (int k = 0; rc == 0 && k < d->n; k++)
            rc = rt_metrics_series_add(f, &d->values[k], &dst[k], err,
                                       errlen);
    }
    return rc;
}

/* Registers family `name` with label "rank" and one series of `type` per
 * rank. */
static int add_rank_series(struct rt_metrics_tangram *m, const char *name,
                           const char *help, enum rt_metrics_type type,
                           struct rt_metrics_series **dst, char *err,
                           size_t errlen)
{
    const char *label = "rank";
    struct rt_metrics_family *f;
    int rc = rt_metrics_family_add(&m->reg, name, help, type, 1,
                                   &label, NULL, 0, &f, err, errlen);
    for (int r = 0; rc == 0 && r < m->n_ranks; r++) {
        char v[16];
        snprintf(v, sizeof(v), "%d", r);
        const char *vp = v;
        rc = rt_metrics_series_add(f, &vp, &dst[r], err, errlen);
    }
    return rc;
}

int rt_metrics_tangram_init(struct rt_metrics_tangram *m, int n_ranks,
                            char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    if (n_ranks < 1 || n_ranks > RT_METRICS_MAX_RANKS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: rank count %d out of range [1, %d]",
                          n_ranks, RT_METRICS_MAX_RANKS);
    m->n_ranks = n_ranks;
    int rc;
    m->kv_pages_used = calloc((size_t)n_ranks, sizeof(*m->kv_pages_used));
    m->kv_pages_capacity =
        calloc((size_t)n_ranks, sizeof(*m->kv_pages_capacity));
    m->kv_pages_cached = calloc((size_t)n_ranks, sizeof(*m->kv_pages_cached));
    m->kv_pages_released =
        calloc((size_t)n_ranks, sizeof(*m->kv_pages_released));
    if (m->kv_pages_used == NULL || m->kv_pages_capacity == NULL ||
        m->kv_pages_cached == NULL || m->kv_pages_released == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "metrics: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < sizeof(single_defs) / sizeof(single_defs[0]);
         i++) {
        const struct single_def *d = &single_defs[i];
        struct rt_metrics_series **slot =
            (struct rt_metrics_series **)((char *)m + d->slot);
        rc = rt_metrics_single_add(&m->reg, d->name, d->help, d->type,
                                   d->bounds, d->n_bounds ? *d->n_bounds : 0,
                                   slot, err, errlen);
        if (rc != 0)
            goto fail;
    }
    rc = add_rank_series(m, "tangram_kv_pages_used",
                         "KV pages in use in the rank's pool.",
                         RT_METRICS_GAUGE, m->kv_pages_used, err, errlen);
    if (rc != 0)
        goto fail;
    rc = add_rank_series(m, "tangram_kv_pages_capacity",
                         "KV pages in the rank's pool.", RT_METRICS_GAUGE,
                         m->kv_pages_capacity, err, errlen);
    if (rc != 0)
        goto fail;
    /* With nothing running or waiting, used == cached on every rank: any
     * difference is a leaked page (the soak test checks it). */
    rc = add_rank_series(m, "tangram_kv_pages_cached",
                         "KV pages of the rank's pool held by stored "
                         "multi-turn entries (part of kv_pages_used).",
                         RT_METRICS_GAUGE, m->kv_pages_cached, err, errlen);
    if (rc != 0)
        goto fail;
    rc = add_rank_series(m, "tangram_kv_pages_released_total",
                         "KV pages an adaptive method (gvote) gave back to "
                         "the rank's pool right after a prefill chunk kept "
                         "less than its reservation.",
                         RT_METRICS_COUNTER, m->kv_pages_released, err,
                         errlen);
    if (rc != 0)
        goto fail;

    const char *label = "finished_reason";
    struct rt_metrics_family *f;
    rc = rt_metrics_family_add(&m->reg, "tangram_request_success_total",
                               "Number of finished requests by finish "
                               "reason.",
                               RT_METRICS_COUNTER, 1, &label, NULL, 0, &f,
                               err, errlen);
    for (int r = 0; rc == 0 && r < RT_METRICS_FINISH_COUNT; r++)
        rc = rt_metrics_series_add(f, &finish_names[r],
                                   &m->request_success_total[r], err, errlen);
    if (rc == 0)
        rc = add_net_families(m, err, errlen);
    if (rc != 0)
        goto fail;
    return 0;

fail:
    rt_metrics_tangram_free(m);
    return rc;
}
