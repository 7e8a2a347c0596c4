/* rt_metrics_tier.c — the host tier's metrics (see rt_metrics_tier.h). */
#include "router/core/rt_metrics_tier.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

/* A restore moves a conversation's pages over PCIe (CUDA) or memcpy (CPU):
 * from a millisecond for a short chat to seconds for a long one on a busy
 * link. */
const double rt_metrics_tier_restore_bounds[] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0};
const int rt_metrics_tier_restore_n_bounds =
    (int)(sizeof(rt_metrics_tier_restore_bounds) /
          sizeof(rt_metrics_tier_restore_bounds[0]));

static const char *const drop_names[RT_METRICS_TIER_DROP_COUNT] = {
    [RT_METRICS_TIER_DROP_LRU] = "lru",
    [RT_METRICS_TIER_DROP_LOST] = "worker_lost",
};
static const char *const op_names[RT_METRICS_TIER_OP_COUNT] = {
    [RT_METRICS_TIER_OP_OFFLOAD] = "offload",
    [RT_METRICS_TIER_OP_RESTORE] = "restore",
};

void rt_metrics_tier_free(struct rt_metrics_tier *t)
{
    free(t->host_pages_used);
    free(t->host_pages_total);
    memset(t, 0, sizeof(*t));
}

/* The unlabelled counters and gauges. */
static const struct {
    const char *name, *help;
    enum rt_metrics_type type;
    size_t slot; /* offsetof the handle in struct rt_metrics_tier */
} singles[] = {
    {"tangram_kv_host_conversations",
     "Stored conversations held in the host tier.", RT_METRICS_GAUGE,
     offsetof(struct rt_metrics_tier, host_conversations)},
    {"tangram_kv_offloads_total",
     "Stored conversations moved from the device pool to the host tier "
     "instead of being dropped.",
     RT_METRICS_COUNTER, offsetof(struct rt_metrics_tier, offloads_total)},
    {"tangram_kv_restores_total",
     "Stored conversations copied back from the host tier for a returning "
     "turn instead of being prefilled again.",
     RT_METRICS_COUNTER, offsetof(struct rt_metrics_tier, restores_total)},
    {"tangram_kv_restored_bytes_total",
     "Bytes of KV the restores copied back to the devices, all ranks.",
     RT_METRICS_COUNTER,
     offsetof(struct rt_metrics_tier, restored_bytes_total)},
};

/* A family `name` of `type` with one label and a series per value. */
static int labelled(struct rt_metrics_registry *reg, const char *name,
                    const char *help, enum rt_metrics_type type,
                    const char *label, const char *const *values, int n,
                    struct rt_metrics_series **dst, char *err, size_t errlen)
{
    struct rt_metrics_family *f;
    int rc = rt_metrics_family_add(reg, name, help, type, 1, &label, NULL, 0,
                                   &f, err, errlen);
    for (int i = 0; rc == 0 && i < n; i++)
        rc = rt_metrics_series_add(f, &values[i], &dst[i], err, errlen);
    return rc;
}

int rt_metrics_tier_init(struct rt_metrics_tier *t,
                         struct rt_metrics_registry *reg, int n_ranks,
                         char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    if (n_ranks < 1 || n_ranks > RT_METRICS_MAX_RANKS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metrics: rank count %d out of range", n_ranks);
    t->n_ranks = n_ranks;
    t->host_pages_used = calloc((size_t)n_ranks, sizeof(*t->host_pages_used));
    t->host_pages_total =
        calloc((size_t)n_ranks, sizeof(*t->host_pages_total));
    char (*names)[16] = calloc((size_t)n_ranks, sizeof(*names));
    const char **vals = calloc((size_t)n_ranks, sizeof(*vals));
    int rc = 0;
    if (t->host_pages_used == NULL || t->host_pages_total == NULL ||
        names == NULL || vals == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "metrics: out of memory");
        goto out;
    }
    for (int r = 0; r < n_ranks; r++) {
        snprintf(names[r], sizeof(names[r]), "%d", r);
        vals[r] = names[r];
    }
    rc = labelled(reg, "tangram_kv_host_pages_used",
                  "Host-tier pages of the rank held by stored conversations "
                  "moved off the device.",
                  RT_METRICS_GAUGE, "rank", vals, n_ranks, t->host_pages_used,
                  err, errlen);
    if (rc == 0)
        rc = labelled(reg, "tangram_kv_host_pages_capacity",
                      "Pages of the rank's host tier (--kv-host-memory; 0: "
                      "no tier).",
                      RT_METRICS_GAUGE, "rank", vals, n_ranks,
                      t->host_pages_total, err, errlen);
    for (size_t i = 0; rc == 0 && i < sizeof(singles) / sizeof(singles[0]);
         i++)
        rc = rt_metrics_single_add(
            reg, singles[i].name, singles[i].help, singles[i].type, NULL, 0,
            (struct rt_metrics_series **)((char *)t + singles[i].slot), err,
            errlen);
    if (rc == 0)
        rc = labelled(reg, "tangram_kv_host_drops_total",
                      "Stored conversations that fell out of the host tier: "
                      "least recently used to make room, or lost with a "
                      "worker.",
                      RT_METRICS_COUNTER, "reason", drop_names,
                      RT_METRICS_TIER_DROP_COUNT, t->drops_total, err,
                      errlen);
    if (rc == 0)
        rc = labelled(reg, "tangram_kv_tier_failures_total",
                      "Host-tier copies a worker failed (the conversation is "
                      "prefilled again), by direction.",
                      RT_METRICS_COUNTER, "op", op_names,
                      RT_METRICS_TIER_OP_COUNT, t->failures_total, err,
                      errlen);
    if (rc == 0)
        rc = rt_metrics_single_add(
            reg, "tangram_kv_restore_seconds",
            "Histogram of the time from a restore's admission to every "
            "rank's copy done, in seconds (only its own request waits).",
            RT_METRICS_HISTOGRAM, rt_metrics_tier_restore_bounds,
            rt_metrics_tier_restore_n_bounds, &t->restore_seconds, err,
            errlen);
out:
    free(names);
    free(vals);
    if (rc != 0)
        rt_metrics_tier_free(t);
    return rc;
}

void rt_metrics_tier_follow(struct rt_metrics_series *s, double total)
{
    double d = total - rt_metrics_series_value(s);
    if (d > 0)
        rt_metrics_counter_add(s, d);
}
