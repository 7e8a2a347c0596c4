/* rt_metrics_info.c — tangram_cache_config_info (see rt_metrics_info.h). */
#include "router/core/rt_metrics_info.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "common/base/tg_err.h"

int64_t rt_metrics_pool_token_blocks(const struct kv_layout *const *layouts,
                                     int n_ranks, int64_t pages_per_rank)
{
    if (layouts == NULL || n_ranks < 1 || pages_per_rank < 1)
        return 0;
    int64_t best = -1;
    for (int r = 0; r < n_ranks; r++) {
        const struct kv_layout *l = layouts[r];
        if (l == NULL || l->group_budget == NULL)
            return 0;
        /* Pages one block of page_size prompt tokens takes, summed over
         * the rank's rows: b[l][g] of a page in each (layout §4.3). */
        double per_block = 0;
        int64_t rows = (int64_t)l->n_layers * l->n_groups;
        for (int64_t i = 0; i < rows; i++)
            per_block += l->group_budget[i];
        if (!(per_block > 0))
            return 0;
        double blocks = floor((double)pages_per_rank / per_block);
        int64_t b = blocks > (double)INT64_MAX / 2 ? INT64_MAX / 2
                                                   : (int64_t)blocks;
        if (best < 0 || b < best)
            best = b;
    }
    return best < 0 ? 0 : best;
}

int rt_metrics_tangram_set_cache_config(struct rt_metrics_tangram *m,
                                        const struct rt_metrics_cache_config *c,
                                        char *err, size_t errlen)
{
    if (m == NULL || c == NULL || c->page_size < 1 || c->num_pages < 1 ||
        c->num_ranks < 1 || c->heads_per_group < 1 || c->num_gpu_blocks < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: cache config out of range");
    if (rt_metrics_family_find(&m->reg, RT_METRICS_CACHE_CONFIG_INFO) != NULL)
        return tg_err_set(err, errlen, TG_EEXIST,
                          "metrics: %s is registered already",
                          RT_METRICS_CACHE_CONFIG_INFO);
    static const char *const names[] = {
        "page_size", "num_pages", "num_ranks", "heads_per_group",
        "block_size", "num_gpu_blocks",
    };
    enum { N_LABELS = (int)(sizeof(names) / sizeof(names[0])) };
    char text[N_LABELS][24];
    snprintf(text[0], sizeof(text[0]), "%" PRId32, c->page_size);
    snprintf(text[1], sizeof(text[1]), "%" PRId64, c->num_pages);
    snprintf(text[2], sizeof(text[2]), "%" PRId32, c->num_ranks);
    snprintf(text[3], sizeof(text[3]), "%" PRId32, c->heads_per_group);
    snprintf(text[4], sizeof(text[4]), "%" PRId32, c->page_size);
    snprintf(text[5], sizeof(text[5]), "%" PRId64, c->num_gpu_blocks);
    const char *values[N_LABELS];
    for (int i = 0; i < N_LABELS; i++)
        values[i] = text[i];

    _Static_assert(N_LABELS <= RT_METRICS_MAX_LABELS,
                   "tangram_cache_config_info has more labels than a family takes");
    struct rt_metrics_family *f;
    int rc = rt_metrics_family_add(
        &m->reg, RT_METRICS_CACHE_CONFIG_INFO,
        "KV page pool configuration (value 1; the labels carry it). "
        "block_size and num_gpu_blocks repeat page_size and the pool's "
        "capacity in prompt blocks under the names inference gateways read.",
        RT_METRICS_GAUGE, N_LABELS, names, NULL, 0, &f, err, errlen);
    if (rc != 0)
        return rc;
    struct rt_metrics_series *s;
    rc = rt_metrics_series_add(f, values, &s, err, errlen);
    if (rc != 0)
        return rc; /* out of memory: the family stays, with no series */
    rt_metrics_gauge_set(s, 1);
    return 0;
}
