/* test_metrics_info.c — tangram_cache_config_info (rt_metrics_info): the
 * pool's capacity in prompt blocks from the rank layouts' budgets, the
 * rendered series (value 1, every label, valid exposition text read back
 * by tests/support/tt_prom.h), and its refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_layout.h"
#include "common/base/tg_err.h"
#include "router/core/rt_metrics_info.h"
#include "tests/support/tt_prom.h"

static char err[256];

static void layout(struct kv_layout *lo, int L, int G, const double *b)
{
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    assert_int_equal(kv_layout_init(lo, L, G, 2, 8, 16, 64, &rule, b, err,
                                    sizeof(err)), 0);
}

static void test_token_blocks(void **state)
{
    (void)state;
    struct kv_layout full, half, mixed;
    const double ones[4] = {1, 1, 1, 1};
    const double halves[4] = {0.5, 0.5, 0.5, 0.5};
    const double mix[4] = {1, 0.25, 0.5, 0.25}; /* sum 2 */
    layout(&full, 2, 2, ones);
    layout(&half, 2, 2, halves);
    layout(&mixed, 2, 2, mix);

    /* Full KV: a block of P tokens takes one page in each of L*G rows. */
    const struct kv_layout *one[1] = {&full};
    assert_int_equal(rt_metrics_pool_token_blocks(one, 1, 100), 25);
    assert_int_equal(rt_metrics_pool_token_blocks(one, 1, 103), 25);
    /* Half budgets hold twice as many; mixed ones by their sum. */
    const struct kv_layout *h[1] = {&half};
    assert_int_equal(rt_metrics_pool_token_blocks(h, 1, 100), 50);
    const struct kv_layout *mx[1] = {&mixed};
    assert_int_equal(rt_metrics_pool_token_blocks(mx, 1, 101), 50);
    /* Tensor parallel: the rank that fills first bounds the pool. */
    const struct kv_layout *two[2] = {&half, &full};
    assert_int_equal(rt_metrics_pool_token_blocks(two, 2, 100), 25);
    /* Bad arguments give 0, never a guess. */
    assert_int_equal(rt_metrics_pool_token_blocks(NULL, 1, 100), 0);
    assert_int_equal(rt_metrics_pool_token_blocks(one, 0, 100), 0);
    assert_int_equal(rt_metrics_pool_token_blocks(one, 1, 0), 0);
    const struct kv_layout *none[1] = {NULL};
    assert_int_equal(rt_metrics_pool_token_blocks(none, 1, 100), 0);
    kv_layout_free(&full);
    kv_layout_free(&half);
    kv_layout_free(&mixed);
}

static void test_rendered(void **state)
{
    (void)state;
    struct rt_metrics_tangram m;
    assert_int_equal(rt_metrics_tangram_init(&m, 2, err, sizeof(err)), 0);
    int before = m.reg.n_families;
    /* Absent until the pool is sized. */
    char *text = tt_prom_render(&m.reg);
    assert_null(strstr(text, RT_METRICS_CACHE_CONFIG_INFO));
    free(text);

    struct rt_metrics_cache_config c = {
        .page_size = 16, .num_pages = 4096, .num_ranks = 2,
        .heads_per_group = 4, .num_gpu_blocks = 1234,
    };
    assert_int_equal(rt_metrics_tangram_set_cache_config(&m, &c, err,
                                                         sizeof(err)), 0);
    assert_int_equal(m.reg.n_families, before + 1);
    text = tt_prom_render(&m.reg);
    tt_prom_assert_valid(text);
    assert_non_null(strstr(text, "# TYPE tangram_cache_config_info gauge\n"));
    const char *want =
        "tangram_cache_config_info{page_size=\"16\",num_pages=\"4096\","
        "num_ranks=\"2\",heads_per_group=\"4\",block_size=\"16\","
        "num_gpu_blocks=\"1234\"} 1\n";
    if (strstr(text, want) == NULL)
        fail_msg("series missing from:\n%s", text);
    free(text);

    /* Once only: the pool does not change after it is sized. */
    assert_int_equal(rt_metrics_tangram_set_cache_config(&m, &c, err,
                                                         sizeof(err)),
                     TG_EEXIST);
    assert_int_equal(m.reg.n_families, before + 1);
    rt_metrics_tangram_free(&m);
}

static void test_refused(void **state)
{
    (void)state;
    struct rt_metrics_tangram m;
    assert_int_equal(rt_metrics_tangram_init(&m, 1, err, sizeof(err)), 0);
    int before = m.reg.n_families;
    const struct rt_metrics_cache_config good = {
        .page_size = 16, .num_pages = 8, .num_ranks = 1,
        .heads_per_group = 1, .num_gpu_blocks = 0,
    };
    struct rt_metrics_cache_config c = good;
    c.page_size = 0;
    assert_int_equal(rt_metrics_tangram_set_cache_config(&m, &c, err,
                                                         sizeof(err)),
                     TG_EINVAL);
    c = good;
    c.num_pages = 0;
    assert_int_equal(rt_metrics_tangram_set_cache_config(&m, &c, err,
                                                         sizeof(err)),
                     TG_EINVAL);
    c = good;
    c.num_gpu_blocks = -1;
    assert_int_equal(rt_metrics_tangram_set_cache_config(&m, &c, err,
                                                         sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(rt_metrics_tangram_set_cache_config(&m, NULL, err,
                                                         sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(m.reg.n_families, before);
    assert_int_equal(rt_metrics_tangram_set_cache_config(&m, &good, err,
                                                         sizeof(err)), 0);
    rt_metrics_tangram_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_blocks),
        cmocka_unit_test(test_rendered),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
