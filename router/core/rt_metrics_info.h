/*
 * rt_metrics_info.h — tangram_cache_config_info, the info metric that
 * describes the KV page pool to outside schedulers.
 *
 * An info metric is a gauge whose value is always 1 and whose labels carry
 * the facts (the Prometheus convention for `*_info` families, as vLLM's
 * vllm:cache_config_info). The Gateway API Inference Extension's endpoint
 * picker reads the labels `block_size` (tokens per KV block) and
 * `num_gpu_blocks` (blocks in the device cache) of the metric it is told
 * with --cache-info-metric to size its approximate prefix-cache index
 * (docs/proposals/003-model-server-protocol of that project). The series
 * therefore carries those two names next to tangram's own:
 *
 *   tangram_cache_config_info{page_size="P", num_pages="N", num_ranks="T",
 *       heads_per_group="H_p", block_size="P", num_gpu_blocks="B"} 1
 *
 *   page_size       tokens per page (DESIGN.md §4.5), the same on every rank
 *   num_pages       pages in ONE rank's pool (every rank has the same count;
 *                   tangram_kv_pages_capacity{rank} has them per rank)
 *   num_ranks       tensor-parallel ranks T
 *   heads_per_group H_p, KV heads sharing a page
 *   block_size      = page_size, under the name the picker reads
 *   num_gpu_blocks  token blocks of block_size tokens the pool holds for
 *                   prompts at the profile's budgets: a page holds P tokens
 *                   of one (layer, group) row, and a prompt block of P
 *                   tokens needs b[l][g] of a page in row (l, g), so a rank
 *                   holds floor(num_pages / sum over rows of b) blocks; the
 *                   smallest over the ranks. With full KV (every b = 1) this
 *                   is num_pages / (L * G). It is an estimate: decode tokens
 *                   are not compressed, and gvote/trig keep fewer.
 *
 * The series exists once the workers have sized their pools (the first
 * time every rank is ready); the pool does not change afterwards.
 *
 * Thread: the router's loop thread, like the rest of the registry.
 */
#ifndef RT_METRICS_INFO_H
#define RT_METRICS_INFO_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "router/core/rt_metrics_tangram.h"

/* The metric's name. */
#define RT_METRICS_CACHE_CONFIG_INFO "tangram_cache_config_info"

/* What the info series says (see the top of this file for each field). */
struct rt_metrics_cache_config {
    int32_t page_size;       /* tokens per page, >= 1 */
    int64_t num_pages;       /* pages per rank, >= 1 */
    int32_t num_ranks;       /* >= 1 */
    int32_t heads_per_group; /* >= 1 */
    int64_t num_gpu_blocks;  /* >= 0 */
};

/* Returns the prompt-token blocks of page_size tokens that a pool of
 * `pages_per_rank` pages holds on every one of the n_ranks ranks: the
 * smallest over r of floor(pages_per_rank / sum of layouts[r]'s group
 * budgets over its L * G rows). layouts[r] is rank r's layout (all of
 * layouts[0] when n_ranks is 1). Returns 0 for bad arguments. Any thread. */
int64_t rt_metrics_pool_token_blocks(const struct kv_layout *const *layouts,
                                     int n_ranks, int64_t pages_per_rank);

/* Registers tangram_cache_config_info in m's registry with one series of
 * value 1 carrying c's labels. Call once, when the pool is sized. Returns
 * 0, TG_EINVAL (a field out of range), TG_EEXIST (already registered) or
 * TG_ENOMEM, with the detail in err; on failure nothing is rendered for
 * the metric (after TG_ENOMEM its family may stay registered, empty). The family is owned by m->reg. Loop thread. */
int rt_metrics_tangram_set_cache_config(struct rt_metrics_tangram *m,
                                        const struct rt_metrics_cache_config *c,
                                        char *err, size_t errlen);

#endif /* RT_METRICS_INFO_H */
