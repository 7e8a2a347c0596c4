/* test_metrics_text.c — the text side of the router's Prometheus registry
 * (rt_metrics): counter and gauge updates, number formatting, the render
 * buffer, the tangram metric set and freeing zeroed objects. Rendered text
 * is read back by the validating reader in tests/support/tt_prom.h, which
 * is itself tested here on broken inputs so that it can really fail. The
 * registry's construction is tested in test_metrics.c. */
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

static void test_parser_rejects(void **state)
{
    (void)state;
    tt_prom_assert_valid("# TYPE a counter\na 1\n");
    tt_prom_assert_valid("# HELP h x\\\\y\\n\n# TYPE h histogram\n"
                 "h_bucket{k=\"v\",le=\"1\"} 0\nh_bucket{k=\"v\",le=\"+Inf\"} 2\n"
                 "h_sum{k=\"v\"} 3\nh_count{k=\"v\"} 2\n");
    tt_prom_assert_invalid("# TYPE a counter\na 1", "newline");
    tt_prom_assert_invalid("a 1\n", "no # TYPE");
    tt_prom_assert_invalid("# TYPE a counter\na -1\n", "negative");
    tt_prom_assert_invalid("# TYPE a gauge\na 1x\n", "bad value");
    tt_prom_assert_invalid("# TYPE a gauge\na{b=\"c\\t\"} 1\n", "bad escape");
    tt_prom_assert_invalid("# TYPE a gauge\na{b=\"c\",b=\"d\"} 1\n", "repeated");
    tt_prom_assert_invalid("# TYPE a gauge\na{b=\"c\"} 1\na{b=\"c\"} 2\n", "duplicate");
    tt_prom_assert_invalid("# TYPE a gauge\n# TYPE b gauge\na 1\n", "contiguous");
    tt_prom_assert_invalid("# TYPE a gauge\n# TYPE a gauge\n", "second # TYPE");
    tt_prom_assert_invalid("# TYPE a flux\n", "unknown type");
    tt_prom_assert_invalid("# HELP a \\x\n", "bad escape in help");
    tt_prom_assert_invalid("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                   "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
                   "below previous");
    tt_prom_assert_invalid("# TYPE h histogram\nh_bucket{le=\"2\"} 1\n"
                   "h_bucket{le=\"1\"} 1\n", "not above");
    tt_prom_assert_invalid("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\n"
                   "h_count 1\n", "lacks +Inf");
    tt_prom_assert_invalid("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\n"
                   "h_count 1\n", "!= _count");
    tt_prom_assert_invalid("# TYPE h histogram\nh_bucket 1\n", "without le");
    tt_prom_assert_invalid("# TYPE g gauge\ng{le=\"1\"} 1\n", "outside");
    tt_prom_assert_invalid("# TYPE g gauge\n\ng 1\n", "empty");
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
    char *text = tt_prom_render(&reg);
    assert_non_null(strstr(text, "c_total 4294967296005\n"));
    assert_non_null(strstr(text, "\ng NaN\n"));
    tt_prom_assert_valid(text);
    free(text);
    rt_metrics_gauge_set(g, -INFINITY);
    text = tt_prom_render(&reg);
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
    struct tg_buf b = {0};
    assert_int_equal(rt_metrics_render(&reg, &b, err, sizeof(err)), 0);
    assert_int_equal(b.len, 0);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    tg_buf_free(&b);

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
    assert_int_equal(tg_buf_puts(&b, "pre\n"), 0);
    assert_int_equal(rt_metrics_render(&reg, &b, err, sizeof(err)), 0);
    assert_true(b.len > 100 * 24 * 20);
    assert_int_equal(strlen(b.data), b.len);
    assert_true(b.cap > b.len);
    assert_memory_equal(b.data, "pre\n# HELP big B.\n", 18);
    tt_prom_assert_valid(b.data + 4);
    /* Reuse: reset and render again gives the same text. */
    char *first = strdup(b.data + 4);
    size_t cap = b.cap;
    tg_buf_reset(&b);
    assert_int_equal(rt_metrics_render(&reg, &b, err, sizeof(err)), 0);
    assert_string_equal(b.data, first);
    assert_int_equal(b.cap, cap); /* no growth the second time */
    free(first);
    tg_buf_free(&b);
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
        {"tangram_kv_pages_capacity", RT_METRICS_GAUGE, 0},
        {"tangram_kv_pages_cached", RT_METRICS_GAUGE, 0},
        {"tangram_kv_pages_released_total", RT_METRICS_COUNTER, 0},
        {"tangram_scheduler_step_seconds", RT_METRICS_HISTOGRAM, 16},
        {"tangram_cached_prompt_tokens_total", RT_METRICS_COUNTER, 0},
        {"tangram_request_success_total", RT_METRICS_COUNTER, 0},
        {"tangram_http_connections_open", RT_METRICS_GAUGE, 0},
        {"tangram_http_connections_evicted_total", RT_METRICS_COUNTER, 0},
        {"tangram_http_slow_readers_aborted_total", RT_METRICS_COUNTER, 0},
        {"tangram_http_connections_rejected_total", RT_METRICS_COUNTER, 0},
        {"tangram_http_requests_timed_out_total", RT_METRICS_COUNTER, 0},
        {"tangram_http_requests_refused_total", RT_METRICS_COUNTER, 0},
        {"tangram_grpc_connections", RT_METRICS_GAUGE, 0},
        {"tangram_grpc_receive_timeouts_total", RT_METRICS_COUNTER, 0},
        {"tangram_grpc_idle_closes_total", RT_METRICS_COUNTER, 0},
        {"tangram_grpc_deadline_exceeded_total", RT_METRICS_COUNTER, 0},
        {"tangram_grpc_refused_streams_total", RT_METRICS_COUNTER, 0},
        {"tangram_grpc_oversized_messages_total", RT_METRICS_COUNTER, 0},
        {"tangram_grpc_unauthenticated_total", RT_METRICS_COUNTER, 0},
        {"tangram_tokenize_jobs_in_flight", RT_METRICS_GAUGE, 0},
        {"tangram_http_slow_heads_evicted_total", RT_METRICS_COUNTER, 0},
        {"tangram_http_slow_bodies_evicted_total", RT_METRICS_COUNTER, 0},
        {"tangram_probe_reserve_connections_total", RT_METRICS_COUNTER, 0},
        {"tangram_grpc_connections_evicted_total", RT_METRICS_COUNTER, 0},
        {"tangram_grpc_connections_rejected_total", RT_METRICS_COUNTER, 0},
        {"tangram_accept_pauses_total", RT_METRICS_COUNTER, 0},
        {"tangram_request_body_memory_bytes", RT_METRICS_GAUGE, 0},
        {"tangram_request_body_memory_refused_total", RT_METRICS_COUNTER, 0},
        {"tangram_request_memory_bytes", RT_METRICS_GAUGE, 0},
        {"tangram_request_memory_waiting", RT_METRICS_GAUGE, 0},
        {"tangram_request_memory_refused_total", RT_METRICS_COUNTER, 0},
        {"tangram_step_seconds_total", RT_METRICS_COUNTER, 0},
        {"tangram_step_router_host_seconds_total", RT_METRICS_COUNTER, 0},
        {"tangram_step_worker_host_seconds_total", RT_METRICS_COUNTER, 0},
        {"tangram_grammar_requests_waiting", RT_METRICS_GAUGE, 0},
        {"tangram_grammar_prepares_pending", RT_METRICS_GAUGE, 0},
        {"tangram_grammar_prepares_total", RT_METRICS_COUNTER, 0},
        {"tangram_grammar_prepare_failures_total", RT_METRICS_COUNTER, 0},
        {"tangram_grammar_prepares_refused_total", RT_METRICS_COUNTER, 0},
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
        /* Prometheus naming (what promtool check metrics enforces): a
         * counter ends in _total, nothing else does. */
        size_t nl = strlen(want[i].name);
        int total = nl > 6 && strcmp(want[i].name + nl - 6, "_total") == 0;
        if (total != (want[i].type == RT_METRICS_COUNTER))
            fail_msg("%s: _total suffix on a %s", want[i].name,
                     total ? "non-counter" : "counter without it");
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
    rt_metrics_gauge_set(m.kv_pages_capacity[0], 64);
    rt_metrics_gauge_set(m.kv_pages_capacity[1], 64);
    rt_metrics_gauge_set(m.kv_pages_cached[1], 9);
    rt_metrics_counter_add(m.kv_pages_released[1], 5);
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
    rt_metrics_gauge_set(m.http_connections_open, 7);
    rt_metrics_counter_inc(
        m.http_requests_refused_total[RT_METRICS_HTTP_REFUSE_UNAUTH]);
    rt_metrics_counter_add(
        m.http_connections_rejected_total[RT_METRICS_HTTP_REJECT_PER_IP], 2);
    rt_metrics_counter_inc(
        m.http_requests_timed_out_total[RT_METRICS_HTTP_TIMEOUT_BODY]);
    rt_metrics_counter_inc(m.http_slow_readers_aborted_total);

    char *text = tt_prom_render(&m.reg);
    tt_prom_assert_valid(text);
    const char *lines[] = {
        "\ntangram_num_requests_running 3\n",
        "\ntangram_num_requests_waiting 1\n",
        "\ntangram_kv_cache_usage_perc 0.25\n",
        "\ntangram_kv_pages_reclaimed_ratio 0.375\n",
        "\ntangram_kv_pages_used{rank=\"0\"} 0\n",
        "\ntangram_kv_pages_used{rank=\"1\"} 17\n",
        "\ntangram_kv_pages_capacity{rank=\"1\"} 64\n",
        "\ntangram_kv_pages_cached{rank=\"0\"} 0\n",
        "\ntangram_kv_pages_cached{rank=\"1\"} 9\n",
        "\n# TYPE tangram_kv_pages_released_total counter\n",
        "\ntangram_kv_pages_released_total{rank=\"0\"} 0\n",
        "\ntangram_kv_pages_released_total{rank=\"1\"} 5\n",
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
        "\ntangram_http_connections_open 7\n",
        "\ntangram_http_connections_evicted_total 0\n",
        "\ntangram_http_slow_readers_aborted_total 1\n",
        "\ntangram_http_connections_rejected_total{reason=\"max_connections\"} 0\n"
        "tangram_http_connections_rejected_total{reason="
        "\"max_connections_per_ip\"} 2\n",
        "\ntangram_http_requests_timed_out_total{phase=\"header\"} 0\n"
        "tangram_http_requests_timed_out_total{phase=\"body\"} 1\n",
        "\ntangram_http_requests_refused_total{reason=\"unauthenticated\"} 1\n"
        "tangram_http_requests_refused_total{reason=\"malformed\"} 0\n"
        "tangram_http_requests_refused_total{reason=\"too_large\"} 0\n",
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
    text = tt_prom_render(&m.reg);
    tt_prom_assert_valid(text);
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
    assert_string_equal(RT_METRICS_CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parser_rejects),
        cmocka_unit_test(test_updates),
        cmocka_unit_test(test_format_double),
        cmocka_unit_test(test_render_buffer),
        cmocka_unit_test(test_tangram_set),
        cmocka_unit_test(test_free_zeroed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
