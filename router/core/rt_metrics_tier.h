/*
 * rt_metrics_tier.h — the metrics of the host tier of stored
 * conversations (DESIGN.md §4.10), registered into the router's registry
 * (rt_metrics_tangram.reg) next to the tangram set:
 *
 *   tangram_kv_host_pages_used{rank}     gauge: host-tier pages held by
 *                                        stored conversations
 *   tangram_kv_host_pages_capacity{rank}    gauge: pages of the rank's tier
 *                                        (0: no tier)
 *   tangram_kv_host_conversations        gauge: stored conversations in
 *                                        the host tier
 *   tangram_kv_offloads_total            counter: conversations moved from
 *                                        the device pool to the host
 *   tangram_kv_restores_total            counter: conversations copied back
 *                                        (every rank done)
 *   tangram_kv_restored_bytes_total      counter: bytes those restores
 *                                        copied to the devices, all ranks
 *   tangram_kv_host_drops_total{reason}  counter: conversations that fell
 *                                        out of the host tier: "lru" (room
 *                                        for a newer one), "worker_lost"
 *                                        (the tier died with a worker)
 *   tangram_kv_tier_failures_total{op}   counter: copies a worker failed,
 *                                        op "offload" or "restore" (the
 *                                        conversation is prefilled again)
 *   tangram_kv_restore_seconds           histogram: restore issued to
 *                                        every rank's copy done
 *
 * The device pages of tangram_kv_cache_usage_perc (what a gateway reads)
 * stay device pages only. Loop thread, like the registry.
 */
#ifndef RT_METRICS_TIER_H
#define RT_METRICS_TIER_H

#include <stddef.h>

#include "router/core/rt_metrics_tangram.h"

enum rt_metrics_tier_drop {
    RT_METRICS_TIER_DROP_LRU,    /* "lru" */
    RT_METRICS_TIER_DROP_LOST,   /* "worker_lost" */
    RT_METRICS_TIER_DROP_COUNT,
};

enum rt_metrics_tier_op {
    RT_METRICS_TIER_OP_OFFLOAD,  /* "offload" */
    RT_METRICS_TIER_OP_RESTORE,  /* "restore" */
    RT_METRICS_TIER_OP_COUNT,
};

struct rt_metrics_tier {
    int n_ranks;
    struct rt_metrics_series **host_pages_used;  /* (n_ranks) gauges */
    struct rt_metrics_series **host_pages_total; /* (n_ranks) gauges */
    struct rt_metrics_series *host_conversations; /* gauge */
    struct rt_metrics_series *offloads_total;
    struct rt_metrics_series *restores_total;
    struct rt_metrics_series *restored_bytes_total;
    struct rt_metrics_series *drops_total[RT_METRICS_TIER_DROP_COUNT];
    struct rt_metrics_series *failures_total[RT_METRICS_TIER_OP_COUNT];
    struct rt_metrics_series *restore_seconds;   /* histogram */
};

/* Restore latency bounds (seconds), exported for tests and docs. */
extern const double rt_metrics_tier_restore_bounds[];
extern const int rt_metrics_tier_restore_n_bounds;

/* Registers the families above into `reg` for ranks 0 .. n_ranks-1 (all
 * zero). Returns 0, TG_EINVAL or TG_ENOMEM; on failure *t is zeroed (the
 * families registered so far stay in reg, which frees them). */
int rt_metrics_tier_init(struct rt_metrics_tier *t,
                         struct rt_metrics_registry *reg, int n_ranks,
                         char *err, size_t errlen);

/* Frees t's arrays (the series belong to the registry). Safe on a zeroed
 * one. */
void rt_metrics_tier_free(struct rt_metrics_tier *t);

/* Sets counter s to `total` when that is above its value (the scheduler
 * keeps monotonic totals; the counter follows them). */
void rt_metrics_tier_follow(struct rt_metrics_series *s, double total);

#endif /* RT_METRICS_TIER_H */
