/* rt_server_tier.c — the router core's side of the host tier of stored
 * conversations (DESIGN.md §4.10): the scheduler's copy ops out to the
 * workers after each plan, the workers' reports back into the scheduler,
 * and the tier's metrics (see rt_server.h). Loop thread. */
#include <stdio.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/core/rt_server_internal.h"

void rt_server__tier_send(struct rt_server *s)
{
    struct rt_tier_op *const *ops;
    int32_t n = rt_sched_tier_take(&s->sched, rt_server_now(s), &ops);
    if (n == 0)
        return;
    char err[256];
    if (rt_link_send_tier(&s->link, ops, n, err, sizeof(err)) == 0)
        return;
    /* Nothing went out: the ops fail here, as a worker would fail them
     * (an offload's entry is dropped, a restore's request prefills). */
    log_err("cannot send %d host-tier ops: %s", (int)n, err);
    uint64_t first = ops[0]->id;
    for (uint64_t id = first; id < first + (uint64_t)n; id++)
        for (int r = 0; r < s->sched.cfg.n_ranks; r++)
            (void)rt_sched_tier_done(&s->sched, r, id, 0, NULL);
    rt_server__wake(s);
}

void rt_server__on_tier(void *ud, int rank,
                        const struct rt_link_tier_done *done, size_t n)
{
    struct rt_server *s = ud;
    if (!s->sched_ready)
        return;
    double now = rt_server_now(s);
    for (size_t i = 0; i < n; i++) {
        const struct rt_link_tier_done *d = &done[i];
        if (!d->ok)
            log_warn("rank %d: host-tier op %llu failed: %s", rank,
                     (unsigned long long)d->id, d->error);
        struct rt_tier_event ev;
        int rc = rt_sched_tier_done(&s->sched, rank, d->id, d->ok, &ev);
        if (rc == TG_EPROTO)
            log_err("rank %d reported host-tier op %llu twice or out of "
                    "turn; ignored", rank, (unsigned long long)d->id);
        else if (rc == TG_ENOTFOUND)
            log_debug("rank %d: report of forgotten host-tier op %llu", rank,
                      (unsigned long long)d->id);
        if (rc == 1 && ev.kind == RT_TIER_RESTORE && ev.ok)
            rt_metrics_histogram_observe(s->tier_metrics.restore_seconds,
                                         now - ev.issued);
    }
    rt_server__tier_gauges(s);
    rt_server__wake(s);
}

void rt_server__tier_gauges(struct rt_server *s)
{
    struct rt_metrics_tier *m = &s->tier_metrics;
    struct rt_sched_tier_stats ts;
    rt_sched_get_tier(&s->sched, &ts);
    for (int r = 0; r < m->n_ranks; r++) {
        struct rt_sched_pages pg;
        rt_sched_rank_pages(&s->sched, r, &pg);
        rt_metrics_gauge_set(m->host_pages_used[r], (double)pg.host_used);
        rt_metrics_gauge_set(m->host_pages_total[r], (double)pg.host_total);
    }
    rt_metrics_gauge_set(m->host_conversations, (double)ts.host_entries);
    rt_metrics_tier_follow(m->offloads_total, (double)ts.offloads);
    rt_metrics_tier_follow(m->restores_total, (double)ts.restores);
    rt_metrics_tier_follow(m->restored_bytes_total,
                           (double)ts.restored_pages *
                               (double)rt_link_page_bytes(&s->link));
    rt_metrics_tier_follow(m->drops_total[RT_METRICS_TIER_DROP_LRU],
                           (double)ts.drops_lru);
    rt_metrics_tier_follow(m->drops_total[RT_METRICS_TIER_DROP_LOST],
                           (double)ts.drops_lost);
    rt_metrics_tier_follow(m->failures_total[RT_METRICS_TIER_OP_OFFLOAD],
                           (double)ts.offload_failures);
    rt_metrics_tier_follow(m->failures_total[RT_METRICS_TIER_OP_RESTORE],
                           (double)ts.restore_failures);
}
