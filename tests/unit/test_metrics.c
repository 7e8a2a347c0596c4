/* test_metrics.c — the router's Prometheus registry (rt_metrics): exact
 * text for a small registry, cumulative buckets, escaping, label sets,
 * registration errors, number formatting, and the tangram metric set. Every
 * rendered text is also read back by a small validating parser of the text
 * exposition format 0.0.4 written here (grammar of every line, TYPE before
 * samples, families contiguous, no duplicate series, histogram buckets
 * increasing in le and count and ending with +Inf == _count); the parser
 * is itself tested on broken inputs so that it can really fail. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"
#include "router/rt_metrics.h"

static char err[256];

/* ---- a validating parser of exposition format 0.0.4 -------------------- */

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
    if (p->n_seen == p->cap_seen) {
        p->cap_seen = p->cap_seen ? 2 * p->cap_seen : 256;
        p->seen = realloc(p->seen, (size_t)p->cap_seen * sizeof(char *));
        assert_non_null(p->seen);
    }
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

static struct pv pv_state;

static void assert_valid(const char *text)
{
    if (pv_validate(&pv_state, text) != 0)
        fail_msg("invalid exposition text: %s\n%s", pv_state.why, text);
}

static void assert_invalid(const char *text, const char *why_part)
{
    assert_int_equal(pv_validate(&pv_state, text), -1);
    if (strstr(pv_state.why, why_part) == NULL)
        fail_msg("expected '%s' in '%s'", why_part, pv_state.why);
}

/* Renders reg into a fresh string (caller frees). */
static char *render(const struct rt_metrics_registry *reg)
{
    struct rt_metrics_buf b = {0};
    assert_int_equal(rt_metrics_render(reg, &b, err, sizeof(err)), 0);
    assert_non_null(b.data);
    assert_int_equal(strlen(b.data), b.len);
    return b.data;
}

/* ---- tests ------------------------------------------------------------- */

static void test_parser_rejects(void **state)
{
    (void)state;
    assert_valid("# TYPE a counter\na 1\n");
    assert_valid("# HELP h x\\\\y\\n\n# TYPE h histogram\n"
                 "h_bucket{k=\"v\",le=\"1\"} 0\nh_bucket{k=\"v\",le=\"+Inf\"} 2\n"
                 "h_sum{k=\"v\"} 3\nh_count{k=\"v\"} 2\n");
    assert_invalid("# TYPE a counter\na 1", "newline");
    assert_invalid("a 1\n", "no # TYPE");
    assert_invalid("# TYPE a counter\na -1\n", "negative");
    assert_invalid("# TYPE a gauge\na 1x\n", "bad value");
    assert_invalid("# TYPE a gauge\na{b=\"c\\t\"} 1\n", "bad escape");
    assert_invalid("# TYPE a gauge\na{b=\"c\",b=\"d\"} 1\n", "repeated");
    assert_invalid("# TYPE a gauge\na{b=\"c\"} 1\na{b=\"c\"} 2\n", "duplicate");
    assert_invalid("# TYPE a gauge\n# TYPE b gauge\na 1\n", "contiguous");
    assert_invalid("# TYPE a gauge\n# TYPE a gauge\n", "second # TYPE");
    assert_invalid("# TYPE a flux\n", "unknown type");
    assert_invalid("# HELP a \\x\n", "bad escape in help");
    assert_invalid("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                   "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
                   "below previous");
    assert_invalid("# TYPE h histogram\nh_bucket{le=\"2\"} 1\n"
                   "h_bucket{le=\"1\"} 1\n", "not above");
    assert_invalid("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\n"
                   "h_count 1\n", "lacks +Inf");
    assert_invalid("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\n"
                   "h_count 1\n", "!= _count");
    assert_invalid("# TYPE h histogram\nh_bucket 1\n", "without le");
    assert_invalid("# TYPE g gauge\ng{le=\"1\"} 1\n", "outside");
    assert_invalid("# TYPE g gauge\n\ng 1\n", "empty");
}

static void test_exact_small_registry(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_metrics_family *req, *lat2;
    struct rt_metrics_series *ok, *bad, *temp, *lat, *l2;
    const char *code = "code";
    assert_int_equal(rt_metrics_family_add(&reg, "app_requests_total",
                                           "Requests served.",
                                           RT_METRICS_COUNTER, 1, &code, NULL,
                                           0, &req, err, sizeof(err)), 0);
    const char *v200 = "200", *v500 = "500";
    assert_int_equal(rt_metrics_series_add(req, &v200, &ok, err, sizeof(err)),
                     0);
    assert_int_equal(rt_metrics_series_add(req, &v500, &bad, err, sizeof(err)),
                     0);
    assert_int_equal(rt_metrics_single_add(&reg, "app_temp", NULL,
                                           RT_METRICS_GAUGE, NULL, 0, &temp,
                                           err, sizeof(err)), 0);
    const double b[2] = {0.1, 1.0};
    assert_int_equal(rt_metrics_single_add(&reg, "app_latency_seconds",
                                           "Latency.", RT_METRICS_HISTOGRAM, b,
                                           2, &lat, err, sizeof(err)), 0);
    const char *ln2[2] = {"model", "rank"};
    assert_int_equal(rt_metrics_family_add(&reg, "ns:step_seconds", "Step.",
                                           RT_METRICS_HISTOGRAM, 2, ln2, b, 1,
                                           &lat2, err, sizeof(err)), 0);
    const char *lv2[2] = {"tiny", "0"};
    assert_int_equal(rt_metrics_series_add(lat2, lv2, &l2, err, sizeof(err)),
                     0);

    rt_metrics_counter_inc(ok);
    assert_int_equal(rt_metrics_counter_add(ok, 2), 0);
    assert_int_equal(rt_metrics_counter_add(bad, 1.5), 0);
    rt_metrics_gauge_set(temp, -2.5);
    const double obs[4] = {0.05, 0.1, 0.5, 2};
    for (int i = 0; i < 4; i++)
        assert_int_equal(rt_metrics_histogram_observe(lat, obs[i]), 0);
    assert_int_equal(rt_metrics_histogram_observe(l2, 0.25), 0);

    char *text = render(&reg);
    const char *want =
        "# HELP app_requests_total Requests served.\n"
        "# TYPE app_requests_total counter\n"
        "app_requests_total{code=\"200\"} 3\n"
        "app_requests_total{code=\"500\"} 1.5\n"
        "# TYPE app_temp gauge\n"
        "app_temp -2.5\n"
        "# HELP app_latency_seconds Latency.\n"
        "# TYPE app_latency_seconds histogram\n"
        "app_latency_seconds_bucket{le=\"0.1\"} 2\n"
        "app_latency_seconds_bucket{le=\"1\"} 3\n"
        "app_latency_seconds_bucket{le=\"+Inf\"} 4\n"
        "app_latency_seconds_sum 2.65\n"
        "app_latency_seconds_count 4\n"
        "# HELP ns:step_seconds Step.\n"
        "# TYPE ns:step_seconds histogram\n"
        "ns:step_seconds_bucket{model=\"tiny\",rank=\"0\",le=\"0.1\"} 0\n"
        "ns:step_seconds_bucket{model=\"tiny\",rank=\"0\",le=\"+Inf\"} 1\n"
        "ns:step_seconds_sum{model=\"tiny\",rank=\"0\"} 0.25\n"
        "ns:step_seconds_count{model=\"tiny\",rank=\"0\"} 1\n";
    assert_string_equal(text, want);
    assert_valid(text);
    free(text);

    /* A labelled family with no series yet prints its header only. */
    struct rt_metrics_family *empty;
    assert_int_equal(rt_metrics_family_add(&reg, "app_empty", "E.",
                                           RT_METRICS_GAUGE, 1, &code, NULL, 0,
                                           &empty, err, sizeof(err)), 0);
    assert_ptr_equal(rt_metrics_family_find(&reg, "app_empty"), empty);
    assert_null(rt_metrics_family_find(&reg, "app_nope"));
    text = render(&reg);
    const char *tail = "# HELP app_empty E.\n# TYPE app_empty gauge\n";
    assert_string_equal(text + strlen(text) - strlen(tail), tail);
    assert_valid(text);
    free(text);
    rt_metrics_registry_free(&reg);
    assert_int_equal(reg.n_families, 0);
    assert_null(reg.families);
}

static void test_cumulative_buckets(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_metrics_series *h;
    const double b[3] = {1, 2, 3};
    assert_int_equal(rt_metrics_single_add(&reg, "h", "H.",
                                           RT_METRICS_HISTOGRAM, b, 3, &h, err,
                                           sizeof(err)), 0);
    /* value -> first bucket with bound >= value (le is inclusive) */
    const double obs[] = {-INFINITY, -5, 0, 1, 1.0000001, 2, 2.5, 3, 3.5, 100,
                          INFINITY};
    const uint64_t want[4] = {4, 6, 8, 11}; /* cumulative le=1,2,3,+Inf */
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        assert_int_equal(rt_metrics_histogram_observe(h, obs[i]), 0);
    assert_int_equal(rt_metrics_histogram_observe(h, NAN), TG_EINVAL);
    for (int i = 0; i < 4; i++)
        assert_int_equal(rt_metrics_histogram_cumulative(h, i), want[i]);
    assert_int_equal(h->count, 11);
    char *text = render(&reg);
    assert_non_null(strstr(text, "h_bucket{le=\"1\"} 4\n"
                                 "h_bucket{le=\"2\"} 6\n"
                                 "h_bucket{le=\"3\"} 8\n"
                                 "h_bucket{le=\"+Inf\"} 11\n"
                                 "h_sum NaN\n" /* -Inf + Inf */
                                 "h_count 11\n"));
    assert_valid(text);
    free(text);

    /* A histogram without finite bounds has only the +Inf bucket. */
    struct rt_metrics_series *h0;
    assert_int_equal(rt_metrics_single_add(&reg, "h0", "", RT_METRICS_HISTOGRAM,
                                           NULL, 0, &h0, err, sizeof(err)), 0);
    assert_int_equal(rt_metrics_histogram_observe(h0, 7.25), 0);
    assert_int_equal(rt_metrics_histogram_cumulative(h0, 0), 1);
    text = render(&reg);
    assert_non_null(strstr(text, "# TYPE h0 histogram\n"
                                 "h0_bucket{le=\"+Inf\"} 1\n"
                                 "h0_sum 7.25\nh0_count 1\n"));
    assert_valid(text);
    free(text);

    /* Many random observations: every bucket count matches a direct
     * count, and the rendered text validates. */
    struct rt_metrics_series *hr;
    assert_int_equal(rt_metrics_single_add(&reg, "hr", "R.",
                                           RT_METRICS_HISTOGRAM,
                                           rt_metrics_ttft_bounds,
                                           rt_metrics_ttft_n_bounds, &hr, err,
                                           sizeof(err)), 0);
    srand(7);
    double vals[2000];
    for (int i = 0; i < 2000; i++) {
        vals[i] = exp((double)rand() / RAND_MAX * 18.0 - 9.0);
        if (i % 97 == 0) /* exact bounds too */
            vals[i] = rt_metrics_ttft_bounds[i % rt_metrics_ttft_n_bounds];
        assert_int_equal(rt_metrics_histogram_observe(hr, vals[i]), 0);
    }
    for (int k = 0; k <= rt_metrics_ttft_n_bounds; k++) {
        uint64_t c = 0;
        for (int i = 0; i < 2000; i++)
            c += k == rt_metrics_ttft_n_bounds ||
                 vals[i] <= rt_metrics_ttft_bounds[k];
        assert_int_equal(rt_metrics_histogram_cumulative(hr, k), c);
    }
    text = render(&reg);
    assert_valid(text);
    free(text);
    rt_metrics_registry_free(&reg);
}

static void test_escaping(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_metrics_family *f;
    struct rt_metrics_series *s1, *s2, *s3;
    const char *ln = "path";
    assert_int_equal(rt_metrics_family_add(&reg, "esc",
                                           "line1\nline2 \\ back \"q\"",
                                           RT_METRICS_GAUGE, 1, &ln, NULL, 0,
                                           &f, err, sizeof(err)), 0);
    const char *v1 = "a\\b\"c\nd";
    const char *v2 = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"; /* é € 😀 */
    const char *v3 = "";
    assert_int_equal(rt_metrics_series_add(f, &v1, &s1, err, sizeof(err)), 0);
    assert_int_equal(rt_metrics_series_add(f, &v2, &s2, err, sizeof(err)), 0);
    assert_int_equal(rt_metrics_series_add(f, &v3, &s3, err, sizeof(err)), 0);
    rt_metrics_gauge_set(s1, 1);
    char *text = render(&reg);
    assert_string_equal(text,
                        "# HELP esc line1\\nline2 \\\\ back \"q\"\n"
                        "# TYPE esc gauge\n"
                        "esc{path=\"a\\\\b\\\"c\\nd\"} 1\n"
                        "esc{path=\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"} 0\n"
                        "esc{path=\"\"} 0\n");
    assert_valid(text);
    free(text);

    /* Values that differ only in what gets escaped stay distinct. */
    const char *v4 = "a\\\\b\"c\nd", *v5 = "a\\b\"c\\nd";
    struct rt_metrics_series *s4, *s5;
    assert_int_equal(rt_metrics_series_add(f, &v4, &s4, err, sizeof(err)), 0);
    assert_int_equal(rt_metrics_series_add(f, &v5, &s5, err, sizeof(err)), 0);

    /* Malformed UTF-8 is refused in label values and help text. */
    const char *bad[] = {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82",
                         "\xf4\x90\x80\x80", "ok\x80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct rt_metrics_series *s;
        assert_int_equal(rt_metrics_series_add(f, &bad[i], &s, err,
                                               sizeof(err)), TG_EINVAL);
        assert_non_null(strstr(err, "UTF-8"));
        struct rt_metrics_family *g;
        assert_int_equal(rt_metrics_family_add(&reg, "esc_help", bad[i],
                                               RT_METRICS_GAUGE, 0, NULL, NULL,
                                               0, &g, err, sizeof(err)),
                         TG_EINVAL);
    }
    assert_int_equal(f->n_series, 5);
    assert_int_equal(reg.n_families, 1);
    rt_metrics_registry_free(&reg);
}

static void test_label_sets(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_metrics_family *f;
    const char *names[2] = {"rank", "kind"};
    assert_int_equal(rt_metrics_family_add(&reg, "pages", "P.",
                                           RT_METRICS_GAUGE, 2, names, NULL, 0,
                                           &f, err, sizeof(err)), 0);
    struct rt_metrics_series *s[4];
    const char *vals[4][2] = {{"0", "used"}, {"0", "free"}, {"1", "used"},
                              {"1", "free"}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(rt_metrics_series_add(f, vals[i], &s[i], err,
                                               sizeof(err)), 0);
        rt_metrics_gauge_set(s[i], 10 * i);
    }
    rt_metrics_gauge_add(s[3], -5);
    assert_true(rt_metrics_series_value(s[3]) == 25.0);
    struct rt_metrics_series *dup;
    assert_int_equal(rt_metrics_series_add(f, vals[2], &dup, err, sizeof(err)),
                     TG_EEXIST);
    assert_non_null(strstr(err, "rank=\"1\",kind=\"used\""));
    assert_int_equal(rt_metrics_series_add(f, NULL, &dup, err, sizeof(err)),
                     TG_EINVAL);
    const char *half[2] = {"2", NULL};
    assert_int_equal(rt_metrics_series_add(f, half, &dup, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(f->n_series, 4);

    char *text = render(&reg);
    assert_string_equal(text, "# HELP pages P.\n# TYPE pages gauge\n"
                              "pages{rank=\"0\",kind=\"used\"} 0\n"
                              "pages{rank=\"0\",kind=\"free\"} 10\n"
                              "pages{rank=\"1\",kind=\"used\"} 20\n"
                              "pages{rank=\"1\",kind=\"free\"} 25\n");
    assert_valid(text);
    free(text);

    /* An unlabelled family holds exactly one series. */
    struct rt_metrics_series *one;
    assert_int_equal(rt_metrics_single_add(&reg, "one", "O.", RT_METRICS_GAUGE,
                                           NULL, 0, &one, err, sizeof(err)), 0);
    assert_int_equal(rt_metrics_series_add(one->family, NULL, &dup, err,
                                           sizeof(err)), TG_EEXIST);

    /* Bad label names. */
    struct rt_metrics_family *g;
    const char *badnames[] = {"", "1a", "a-b", "__x", "a:b", "a b", NULL};
    for (size_t i = 0; i < sizeof(badnames) / sizeof(badnames[0]); i++)
        assert_int_equal(rt_metrics_family_add(&reg, "g", "", RT_METRICS_GAUGE,
                                               1, &badnames[i], NULL, 0, &g,
                                               err, sizeof(err)), TG_EINVAL);
    const char *le = "le";
    assert_int_equal(rt_metrics_family_add(&reg, "hle", "",
                                           RT_METRICS_HISTOGRAM, 1, &le, NULL,
                                           0, &g, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "reserved"));
    const char *twice[2] = {"a", "a"};
    assert_int_equal(rt_metrics_family_add(&reg, "g", "", RT_METRICS_GAUGE, 2,
                                           twice, NULL, 0, &g, err,
                                           sizeof(err)), TG_EINVAL);
    const char *five[5] = {"a", "b", "c", "d", "e"};
    assert_int_equal(rt_metrics_family_add(&reg, "g", "", RT_METRICS_GAUGE, 5,
                                           five, NULL, 0, &g, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_metrics_family_add(&reg, "g", "", RT_METRICS_GAUGE, -1,
                                           NULL, NULL, 0, &g, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_metrics_family_add(&reg, "g", "", RT_METRICS_GAUGE, 1,
                                           NULL, NULL, 0, &g, err,
                                           sizeof(err)), TG_EINVAL);
    /* "le" is an ordinary label outside histograms; four labels is the max. */
    assert_int_equal(rt_metrics_family_add(&reg, "gle", "", RT_METRICS_GAUGE,
                                           1, &le, NULL, 0, &g, err,
                                           sizeof(err)), 0);
    assert_int_equal(rt_metrics_family_add(&reg, "g4", "", RT_METRICS_GAUGE, 4,
                                           five, NULL, 0, &g, err,
                                           sizeof(err)), 0);
    assert_int_equal(reg.n_families, 4);
    rt_metrics_registry_free(&reg);
}

static void test_registration_errors(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_metrics_series *s;
    struct rt_metrics_family *f;
    const char *badnames[] = {"", "1abc", "a b", "a-b", "a.b", "é", NULL};
    for (size_t i = 0; i < sizeof(badnames) / sizeof(badnames[0]); i++) {
        assert_int_equal(rt_metrics_single_add(&reg, badnames[i], "",
                                               RT_METRICS_COUNTER, NULL, 0, &s,
                                               err, sizeof(err)), TG_EINVAL);
        assert_non_null(strstr(err, "invalid metric name"));
    }
    assert_int_equal(rt_metrics_single_add(&reg, "x", "", (enum rt_metrics_type)7,
                                           NULL, 0, &s, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(rt_metrics_single_add(&reg, ":ns:x_1", "",
                                           RT_METRICS_COUNTER, NULL, 0, &s, err,
                                           sizeof(err)), 0);
    /* Duplicates, including the sample names a histogram adds. */
    assert_int_equal(rt_metrics_single_add(&reg, ":ns:x_1", "",
                                           RT_METRICS_GAUGE, NULL, 0, &s, err,
                                           sizeof(err)), TG_EEXIST);
    const double b[2] = {1, 2};
    assert_int_equal(rt_metrics_single_add(&reg, "lat", "",
                                           RT_METRICS_HISTOGRAM, b, 2, &s, err,
                                           sizeof(err)), 0);
    const char *clash[] = {"lat", "lat_bucket", "lat_sum", "lat_count"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(rt_metrics_single_add(&reg, clash[i], "",
                                               RT_METRICS_COUNTER, NULL, 0, &s,
                                               err, sizeof(err)), TG_EEXIST);
    assert_int_equal(rt_metrics_single_add(&reg, "lat_total", "",
                                           RT_METRICS_COUNTER, NULL, 0, &s, err,
                                           sizeof(err)), 0);
    assert_int_equal(rt_metrics_single_add(&reg, "q_count", "",
                                           RT_METRICS_GAUGE, NULL, 0, &s, err,
                                           sizeof(err)), 0);
    assert_int_equal(rt_metrics_single_add(&reg, "q", "", RT_METRICS_HISTOGRAM,
                                           b, 2, &s, err, sizeof(err)),
                     TG_EEXIST);
    assert_non_null(strstr(err, "q_count"));
    assert_int_equal(rt_metrics_single_add(&reg, "q", "", RT_METRICS_GAUGE,
                                           NULL, 0, &s, err, sizeof(err)), 0);

    /* Bounds. */
    const double unsorted[3] = {1, 3, 2}, equal[2] = {1, 1},
                 withnan[2] = {1, NAN}, withinf[2] = {1, INFINITY};
    const double *bad[4] = {unsorted, equal, withnan, withinf};
    const int nb[4] = {3, 2, 2, 2};
    for (int i = 0; i < 4; i++)
        assert_int_equal(rt_metrics_single_add(&reg, "hb", "",
                                               RT_METRICS_HISTOGRAM, bad[i],
                                               nb[i], &s, err, sizeof(err)),
                         TG_EINVAL);
    assert_int_equal(rt_metrics_single_add(&reg, "hb", "", RT_METRICS_GAUGE, b,
                                           2, &s, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_metrics_single_add(&reg, "hb", "",
                                           RT_METRICS_HISTOGRAM, b, -1, &s, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_metrics_single_add(&reg, "hb", "",
                                           RT_METRICS_HISTOGRAM, NULL, 2, &s,
                                           err, sizeof(err)), TG_EINVAL);
    double many[RT_METRICS_MAX_BOUNDS + 1];
    for (int i = 0; i <= RT_METRICS_MAX_BOUNDS; i++)
        many[i] = i;
    assert_int_equal(rt_metrics_single_add(&reg, "hb", "",
                                           RT_METRICS_HISTOGRAM, many,
                                           RT_METRICS_MAX_BOUNDS + 1, &s, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_metrics_family_add(&reg, "hb", "",
                                           RT_METRICS_HISTOGRAM, 0, NULL, many,
                                           RT_METRICS_MAX_BOUNDS, &f, err,
                                           sizeof(err)), 0);
    /* Negative bounds are fine (e.g. a signed error histogram). */
    const double neg[3] = {-1, -0.5, 0};
    assert_int_equal(rt_metrics_single_add(&reg, "hneg", "",
                                           RT_METRICS_HISTOGRAM, neg, 3, &s,
                                           err, sizeof(err)), 0);
    assert_int_equal(reg.n_families, 7);
    char *text = render(&reg);
    assert_valid(text);
    assert_non_null(strstr(text, "hneg_bucket{le=\"-0.5\"} 0\n"));
    free(text);

    /* Many families and series: handles stay valid as arrays grow. */
    struct rt_metrics_series *hs[40];
    for (int i = 0; i < 40; i++) {
        char name[32];
        snprintf(name, sizeof(name), "grow_%d_total", i);
        assert_int_equal(rt_metrics_single_add(&reg, name, "G.",
                                               RT_METRICS_COUNTER, NULL, 0,
                                               &hs[i], err, sizeof(err)), 0);
        assert_int_equal(rt_metrics_counter_add(hs[i], i), 0);
    }
    for (int i = 0; i < 40; i++)
        assert_true(rt_metrics_series_value(hs[i]) == i);
    text = render(&reg);
    assert_valid(text);
    assert_non_null(strstr(text, "\ngrow_39_total 39\n"));
    free(text);
    rt_metrics_registry_free(&reg);
}

static void test_updates(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    struct rt_metrics_series *c, *g;
    assert_int_equal(rt_metrics_single_add(&reg, "c_total", "C.",
                                           RT_METRICS_COUNTER, NULL, 0, &c, err,
                                           sizeof(err)), 0);
    assert_int_equal(rt_metrics_single_add(&reg, "g", "G.", RT_METRICS_GAUGE,
                                           NULL, 0, &g, err, sizeof(err)), 0);
    assert_int_equal(rt_metrics_counter_add(c, 5), 0);
    assert_int_equal(rt_metrics_counter_add(c, 0), 0);
    assert_int_equal(rt_metrics_counter_add(c, -1), TG_EINVAL);
    assert_int_equal(rt_metrics_counter_add(c, NAN), TG_EINVAL);
    assert_int_equal(rt_metrics_counter_add(c, INFINITY), TG_EINVAL);
    assert_true(rt_metrics_series_value(c) == 5.0);
    /* Token counters stay exact integers far beyond 2^32. */
    assert_int_equal(rt_metrics_counter_add(c, 4294967296.0 * 1000), 0);
    rt_metrics_gauge_set(g, NAN);
    char *text = render(&reg);
    assert_non_null(strstr(text, "c_total 4294967296005\n"));
    assert_non_null(strstr(text, "\ng NaN\n"));
    assert_valid(text);
    free(text);
    rt_metrics_gauge_set(g, -INFINITY);
    text = render(&reg);
    assert_non_null(strstr(text, "\ng -Inf\n"));
    free(text);
    rt_metrics_gauge_set(g, 0.75);
    rt_metrics_gauge_add(g, 0.5);
    assert_true(rt_metrics_series_value(g) == 1.25);
    rt_metrics_registry_free(&reg);
}

static void test_format_double(void **state)
{
    (void)state;
    struct {
        double v;
        const char *s;
    } cases[] = {
        {0, "0"},          {-0.0, "-0"},          {1, "1"},
        {-42, "-42"},      {0.1, "0.1"},          {2.5, "2.5"},
        {2560, "2560"},    {0.001, "0.001"},      {1e-300, "1e-300"},
        {1e21, "1e+21"},   {123456.789, "123456.789"},
        {1.0 / 3.0, "0.3333333333333333"},
        {9007199254740991.0, "9007199254740991"},
        {9007199254740992.0, "9007199254740992"},
        {0.1 + 0.2, "0.30000000000000004"},
        {INFINITY, "+Inf"}, {-INFINITY, "-Inf"},   {NAN, "NaN"},
    };
    char buf[40];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int n = rt_metrics_format_double(cases[i].v, buf, sizeof(buf));
        assert_int_equal(n, (int)strlen(buf));
        assert_string_equal(buf, cases[i].s);
    }
    /* Every finite double reads back exactly. */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double v;
        memcpy(&v, &x, sizeof(v));
        if (!isfinite(v))
            continue;
        int n = rt_metrics_format_double(v, buf, sizeof(buf));
        assert_true(n > 0 && n < 32);
        assert_true(strtod(buf, NULL) == v);
    }
}

static void test_render_buffer(void **state)
{
    (void)state;
    struct rt_metrics_registry reg;
    rt_metrics_registry_init(&reg);
    /* Empty registry: nothing appended, buffer still terminated. */
    struct rt_metrics_buf b = {0};
    assert_int_equal(rt_metrics_render(&reg, &b, err, sizeof(err)), 0);
    assert_int_equal(b.len, 0);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    rt_metrics_buf_free(&b);
    assert_null(b.data);
    rt_metrics_buf_free(&b); /* twice is fine */

    /* Appends after existing text, growing a tiny buffer. */
    struct rt_metrics_family *f;
    const char *ln = "i";
    assert_int_equal(rt_metrics_family_add(&reg, "big", "B.",
                                           RT_METRICS_HISTOGRAM, 1, &ln,
                                           rt_metrics_e2e_bounds,
                                           rt_metrics_e2e_n_bounds, &f, err,
                                           sizeof(err)), 0);
    for (int i = 0; i < 100; i++) {
        char v[16];
        snprintf(v, sizeof(v), "%d", i);
        const char *vp = v;
        struct rt_metrics_series *s;
        assert_int_equal(rt_metrics_series_add(f, &vp, &s, err, sizeof(err)),
                         0);
        assert_int_equal(rt_metrics_histogram_observe(s, i * 10.0), 0);
    }
    b.cap = 8;
    b.data = malloc(b.cap);
    memcpy(b.data, "pre\n", 5);
    b.len = 4;
    assert_int_equal(rt_metrics_render(&reg, &b, err, sizeof(err)), 0);
    assert_true(b.len > 100 * 24 * 20);
    assert_int_equal(strlen(b.data), b.len);
    assert_true(b.cap > b.len);
    assert_memory_equal(b.data, "pre\n# HELP big B.\n", 18);
    assert_valid(b.data + 4);
    /* Reuse: len = 0 and render again gives the same text. */
    char *first = strdup(b.data + 4);
    size_t cap = b.cap;
    b.len = 0;
    assert_int_equal(rt_metrics_render(&reg, &b, err, sizeof(err)), 0);
    assert_string_equal(b.data, first);
    assert_int_equal(b.cap, cap); /* no growth the second time */
    free(first);
    rt_metrics_buf_free(&b);
    rt_metrics_registry_free(&reg);
}

static void test_tangram_set(void **state)
{
    (void)state;
    struct rt_metrics_tangram m;
    assert_int_equal(rt_metrics_tangram_init(&m, 0, err, sizeof(err)),
                     TG_EINVAL);
    rt_metrics_tangram_free(&m);
    assert_int_equal(rt_metrics_tangram_init(&m, RT_METRICS_MAX_RANKS + 1, err,
                                             sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_metrics_tangram_init(&m, 2, err, sizeof(err)), 0);

    struct {
        const char *name;
        enum rt_metrics_type type;
        int n_bounds;
    } want[] = {
        {"tangram_num_requests_running", RT_METRICS_GAUGE, 0},
        {"tangram_num_requests_waiting", RT_METRICS_GAUGE, 0},
        {"tangram_kv_cache_usage_perc", RT_METRICS_GAUGE, 0},
        {"tangram_time_to_first_token_seconds", RT_METRICS_HISTOGRAM, 22},
        {"tangram_inter_token_latency_seconds", RT_METRICS_HISTOGRAM, 19},
        {"tangram_e2e_request_latency_seconds", RT_METRICS_HISTOGRAM, 21},
        {"tangram_prompt_tokens_total", RT_METRICS_COUNTER, 0},
        {"tangram_generation_tokens_total", RT_METRICS_COUNTER, 0},
        {"tangram_num_preemptions_total", RT_METRICS_COUNTER, 0},
        {"tangram_kv_pages_reclaimed_ratio", RT_METRICS_GAUGE, 0},
        {"tangram_kv_pages_used", RT_METRICS_GAUGE, 0},
        {"tangram_kv_pages_total", RT_METRICS_GAUGE, 0},
        {"tangram_scheduler_step_seconds", RT_METRICS_HISTOGRAM, 16},
        {"tangram_cached_prompt_tokens_total", RT_METRICS_COUNTER, 0},
        {"tangram_request_success_total", RT_METRICS_COUNTER, 0},
    };
    int n_want = (int)(sizeof(want) / sizeof(want[0]));
    assert_int_equal(m.reg.n_families, n_want);
    for (int i = 0; i < n_want; i++) {
        struct rt_metrics_family *f = rt_metrics_family_find(&m.reg,
                                                             want[i].name);
        if (f == NULL)
            fail_msg("missing %s", want[i].name);
        assert_int_equal(f->type, want[i].type);
        assert_int_equal(f->n_bounds, want[i].n_bounds);
        assert_true(f->help[0] != '\0');
    }
    /* vLLM's TTFT bounds, first and last, and the shared ITL/TPOT ones. */
    assert_true(rt_metrics_ttft_bounds[0] == 0.001);
    assert_true(rt_metrics_ttft_bounds[21] == 2560.0);
    assert_true(rt_metrics_itl_bounds[0] == 0.01);
    assert_true(rt_metrics_itl_bounds[18] == 80.0);
    assert_true(rt_metrics_e2e_bounds[0] == 0.3);
    assert_true(rt_metrics_e2e_bounds[20] == 7680.0);

    rt_metrics_gauge_set(m.num_requests_running, 3);
    rt_metrics_gauge_set(m.num_requests_waiting, 1);
    rt_metrics_gauge_set(m.kv_cache_usage_perc, 0.25);
    rt_metrics_gauge_set(m.kv_pages_reclaimed_ratio, 0.375);
    rt_metrics_gauge_set(m.kv_pages_used[1], 17);
    rt_metrics_gauge_set(m.kv_pages_total[0], 64);
    rt_metrics_gauge_set(m.kv_pages_total[1], 64);
    assert_int_equal(rt_metrics_histogram_observe(m.time_to_first_token_seconds,
                                                  0.1), 0);
    assert_int_equal(rt_metrics_histogram_observe(m.inter_token_latency_seconds,
                                                  0.02), 0);
    assert_int_equal(rt_metrics_histogram_observe(m.e2e_request_latency_seconds,
                                                  12), 0);
    assert_int_equal(rt_metrics_histogram_observe(m.scheduler_step_seconds,
                                                  0.0003), 0);
    assert_int_equal(rt_metrics_counter_add(m.prompt_tokens_total, 120), 0);
    assert_int_equal(rt_metrics_counter_add(m.generation_tokens_total, 16), 0);
    assert_int_equal(rt_metrics_counter_add(m.cached_prompt_tokens_total, 96),
                     0);
    rt_metrics_counter_inc(m.num_preemptions_total);
    rt_metrics_counter_inc(m.request_success_total[RT_METRICS_FINISH_LENGTH]);

    char *text = render(&m.reg);
    assert_valid(text);
    const char *lines[] = {
        "\ntangram_num_requests_running 3\n",
        "\ntangram_num_requests_waiting 1\n",
        "\ntangram_kv_cache_usage_perc 0.25\n",
        "\ntangram_kv_pages_reclaimed_ratio 0.375\n",
        "\ntangram_kv_pages_used{rank=\"0\"} 0\n",
        "\ntangram_kv_pages_used{rank=\"1\"} 17\n",
        "\ntangram_kv_pages_total{rank=\"1\"} 64\n",
        "\ntangram_time_to_first_token_seconds_bucket{le=\"0.08\"} 0\n"
        "tangram_time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n",
        "\ntangram_time_to_first_token_seconds_bucket{le=\"2560\"} 1\n"
        "tangram_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"
        "tangram_time_to_first_token_seconds_sum 0.1\n"
        "tangram_time_to_first_token_seconds_count 1\n",
        "\ntangram_inter_token_latency_seconds_bucket{le=\"0.025\"} 1\n",
        "\ntangram_e2e_request_latency_seconds_bucket{le=\"10\"} 0\n"
        "tangram_e2e_request_latency_seconds_bucket{le=\"15\"} 1\n",
        "\ntangram_scheduler_step_seconds_bucket{le=\"0.00025\"} 0\n"
        "tangram_scheduler_step_seconds_bucket{le=\"0.0005\"} 1\n",
        "\ntangram_prompt_tokens_total 120\n",
        "\ntangram_generation_tokens_total 16\n",
        "\ntangram_cached_prompt_tokens_total 96\n",
        "\ntangram_num_preemptions_total 1\n",
        "\n# TYPE tangram_request_success_total counter\n"
        "tangram_request_success_total{finished_reason=\"stop\"} 0\n"
        "tangram_request_success_total{finished_reason=\"length\"} 1\n"
        "tangram_request_success_total{finished_reason=\"abort\"} 0\n"
        "tangram_request_success_total{finished_reason=\"error\"} 0\n",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        if (strstr(text, lines[i]) == NULL)
            fail_msg("missing:%s", lines[i]);
    free(text);

    assert_string_equal(rt_metrics_finish_name(RT_METRICS_FINISH_STOP), "stop");
    assert_string_equal(rt_metrics_finish_name(RT_METRICS_FINISH_ERROR),
                        "error");
    assert_null(rt_metrics_finish_name(RT_METRICS_FINISH_COUNT));
    assert_null(rt_metrics_finish_name((enum rt_metrics_finish)-1));
    rt_metrics_tangram_free(&m);
    rt_metrics_tangram_free(&m); /* zeroed: safe again */

    /* Many ranks: one gauge per rank, text still valid. */
    assert_int_equal(rt_metrics_tangram_init(&m, 64, err, sizeof(err)), 0);
    rt_metrics_gauge_set(m.kv_pages_used[63], 5);
    text = render(&m.reg);
    assert_valid(text);
    assert_non_null(strstr(text, "tangram_kv_pages_used{rank=\"63\"} 5\n"));
    free(text);
    rt_metrics_tangram_free(&m);
}

static void test_free_zeroed(void **state)
{
    (void)state;
    struct rt_metrics_registry reg = {0};
    rt_metrics_registry_free(&reg);
    rt_metrics_registry_free(NULL);
    struct rt_metrics_tangram m;
    memset(&m, 0, sizeof(m));
    rt_metrics_tangram_free(&m);
    rt_metrics_tangram_free(NULL);
    rt_metrics_buf_free(NULL);
    assert_string_equal(RT_METRICS_CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parser_rejects),
        cmocka_unit_test(test_exact_small_registry),
        cmocka_unit_test(test_cumulative_buckets),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_label_sets),
        cmocka_unit_test(test_registration_errors),
        cmocka_unit_test(test_updates),
        cmocka_unit_test(test_format_double),
        cmocka_unit_test(test_render_buffer),
        cmocka_unit_test(test_tangram_set),
        cmocka_unit_test(test_free_zeroed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
