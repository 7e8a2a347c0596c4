/* test_metrics.c — the router's Prometheus registry (rt_metrics): exact
 * text for a small registry, cumulative buckets, escaping, label sets and
 * registration errors. Every rendered text is also read back by the
 * validating reader of the exposition format in tests/support/tt_prom.h.
 * Updates, number formatting, the render buffer, the tangram metric set
 * and the reader's own rejections are in test_metrics_text.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_metrics_tangram.h"
#include "tests/support/tt_prom.h"

static char err[256];

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

    char *text = tt_prom_render(&reg);
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
    tt_prom_assert_valid(text);
    free(text);

    /* A labelled family with no series yet prints its header only. */
    struct rt_metrics_family *empty;
    assert_int_equal(rt_metrics_family_add(&reg, "app_empty", "E.",
                                           RT_METRICS_GAUGE, 1, &code, NULL, 0,
                                           &empty, err, sizeof(err)), 0);
    assert_ptr_equal(rt_metrics_family_find(&reg, "app_empty"), empty);
    assert_null(rt_metrics_family_find(&reg, "app_nope"));
    text = tt_prom_render(&reg);
    const char *tail = "# HELP app_empty E.\n# TYPE app_empty gauge\n";
    assert_string_equal(text + strlen(text) - strlen(tail), tail);
    tt_prom_assert_valid(text);
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
    char *text = tt_prom_render(&reg);
    assert_non_null(strstr(text, "h_bucket{le=\"1\"} 4\n"
                                 "h_bucket{le=\"2\"} 6\n"
                                 "h_bucket{le=\"3\"} 8\n"
                                 "h_bucket{le=\"+Inf\"} 11\n"
                                 "h_sum NaN\n" /* -Inf + Inf */
                                 "h_count 11\n"));
    tt_prom_assert_valid(text);
    free(text);

    /* A histogram without finite bounds has only the +Inf bucket. */
    struct rt_metrics_series *h0;
    assert_int_equal(rt_metrics_single_add(&reg, "h0", "", RT_METRICS_HISTOGRAM,
                                           NULL, 0, &h0, err, sizeof(err)), 0);
    assert_int_equal(rt_metrics_histogram_observe(h0, 7.25), 0);
    assert_int_equal(rt_metrics_histogram_cumulative(h0, 0), 1);
    text = tt_prom_render(&reg);
    assert_non_null(strstr(text, "# TYPE h0 histogram\n"
                                 "h0_bucket{le=\"+Inf\"} 1\n"
                                 "h0_sum 7.25\nh0_count 1\n"));
    tt_prom_assert_valid(text);
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
    text = tt_prom_render(&reg);
    tt_prom_assert_valid(text);
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
    char *text = tt_prom_render(&reg);
    assert_string_equal(text,
                        "# HELP esc line1\\nline2 \\\\ back \"q\"\n"
                        "# TYPE esc gauge\n"
                        "esc{path=\"a\\\\b\\\"c\\nd\"} 1\n"
                        "esc{path=\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"} 0\n"
                        "esc{path=\"\"} 0\n");
    tt_prom_assert_valid(text);
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

    char *text = tt_prom_render(&reg);
    assert_string_equal(text, "# HELP pages P.\n# TYPE pages gauge\n"
                              "pages{rank=\"0\",kind=\"used\"} 0\n"
                              "pages{rank=\"0\",kind=\"free\"} 10\n"
                              "pages{rank=\"1\",kind=\"used\"} 20\n"
                              "pages{rank=\"1\",kind=\"free\"} 25\n");
    tt_prom_assert_valid(text);
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
    const char *nine[9] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    assert_int_equal(rt_metrics_family_add(&reg, "g", "", RT_METRICS_GAUGE, 9,
                                           nine, NULL, 0, &g, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_metrics_family_add(&reg, "g", "", RT_METRICS_GAUGE, -1,
                                           NULL, NULL, 0, &g, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(rt_metrics_family_add(&reg, "g", "", RT_METRICS_GAUGE, 1,
                                           NULL, NULL, 0, &g, err,
                                           sizeof(err)), TG_EINVAL);
    /* "le" is an ordinary label outside histograms; eight labels is the max. */
    assert_int_equal(rt_metrics_family_add(&reg, "gle", "", RT_METRICS_GAUGE,
                                           1, &le, NULL, 0, &g, err,
                                           sizeof(err)), 0);
    assert_int_equal(rt_metrics_family_add(&reg, "g8", "", RT_METRICS_GAUGE, 8,
                                           nine, NULL, 0, &g, err,
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
    char *text = tt_prom_render(&reg);
    tt_prom_assert_valid(text);
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
    text = tt_prom_render(&reg);
    tt_prom_assert_valid(text);
    assert_non_null(strstr(text, "\ngrow_39_total 39\n"));
    free(text);
    rt_metrics_registry_free(&reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_small_registry),
        cmocka_unit_test(test_cumulative_buckets),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_label_sets),
        cmocka_unit_test(test_registration_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
