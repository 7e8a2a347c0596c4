/*
 * rt_link_tier.c — the host tier's messages on the router's link
 * (DESIGN.md §4.10, proto/worker.proto TierCommand / TierReport): the
 * scheduler's copy ops out to every rank, each with its own pages, and
 * the ranks' reports back to on_tier. See rt_link.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "router/link/rt_link.h"
#include "router/link/rt_link_internal.h"
#include "worker.pb-c.h"

int32_t rt_link_min_host_pages(const struct rt_link *link)
{
    if (!link || !link->initialized || link->closed)
        return 0;
    int any = 0;
    uint32_t min = 0;
    for (int r = 0; r < link->cfg.world_size; r++) {
        const struct rt_link_rank *k = &link->ranks[r];
        if (k->state != RANK_ALIVE)
            continue;
        if (!any || k->host_pages < min)
            min = k->host_pages;
        any = 1;
    }
    return min > INT32_MAX ? INT32_MAX : (int32_t)min;
}

int rt_link_require_host_pages(struct rt_link *link, uint32_t pages)
{
    if (!link || !link->initialized || link->closed)
        return TG_EINVAL;
    if (pages > link->cfg.layout.host_pages_total)
        link->cfg.layout.host_pages_total = pages;
    return 0;
}

int64_t rt_link_page_bytes(const struct rt_link *link)
{
    /* Kept from rank 0's last Hello: every incarnation has the layout the
     * router checked. */
    if (!link || !link->initialized || link->closed)
        return 0;
    return link->ranks[0].page_bytes > INT64_MAX
               ? 0
               : (int64_t)link->ranks[0].page_bytes;
}

int rt_link__check_from(struct rt_link *link, int rank, const char *what,
                        uint32_t version, uint32_t msg_rank)
{
    if (version == PROTO_V1 && msg_rank == (uint32_t)rank)
        return 0;
    char why[160];
    snprintf(why, sizeof why, "%s with version %" PRIu32 " and rank %" PRIu32,
             what, version, msg_rank);
    rt_link__declare_dead(link, rank, why);
    return -1;
}

int rt_link_send_tier(struct rt_link *link, struct rt_tier_op *const *ops,
                      int32_t n, char *err, size_t errlen)
{
    if (!link || !link->initialized || link->closed)
        return tg_err_set(err, errlen, TG_EINVAL, "link not open");
    if (n <= 0)
        return 0;
    if (!link->ready || link->shut)
        return tg_err_set(err, errlen, TG_EAGAIN, "not every rank is ready");
    const int T = link->cfg.world_size;
    Tangram__Worker__V1__TierOp *to = calloc((size_t)n, sizeof *to);
    Tangram__Worker__V1__TierOp **top = calloc((size_t)n, sizeof *top);
    if (to == NULL || top == NULL) {
        free(to);
        free(top);
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "no memory for %d tier ops", (int)n);
    }
    Tangram__Worker__V1__TierCommand cmd =
        TANGRAM__WORKER__V1__TIER_COMMAND__INIT;
    cmd.version = PROTO_V1;
    cmd.n_ops = (size_t)n;
    cmd.ops = top;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = PROTO_V1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_TIER_COMMAND;
    m.tier_command = &cmd;
    for (int r = 0; r < T; r++) {
        for (int32_t i = 0; i < n; i++) {
            const struct rt_tier_op *op = ops[i];
            Tangram__Worker__V1__TierOp *o = &to[i];
            tangram__worker__v1__tier_op__init(o);
            o->id = op->id;
            o->kind = op->kind == RT_TIER_OFFLOAD
                          ? TANGRAM__WORKER__V1__TIER_KIND__TIER_KIND_OFFLOAD
                          : TANGRAM__WORKER__V1__TIER_KIND__TIER_KIND_RESTORE;
            size_t np = (size_t)(op->off[r + 1] - op->off[r]);
            /* Page ids are >= 0: int32 and uint32 views of one buffer,
             * read only during the pack. */
            o->n_device_pages = o->n_host_pages = np;
            o->device_pages = (uint32_t *)(uintptr_t)(op->dev + op->off[r]);
            o->host_pages = (uint32_t *)(uintptr_t)(op->host + op->off[r]);
            top[i] = o;
        }
        struct rt_link_rank *k = &link->ranks[r];
        char e[128];
        if (rt_link__send_rank(link, r, &m, e, sizeof e) < 0) {
            snprintf(k->kill_reason, sizeof k->kill_reason,
                     "tier command not delivered: %s", e);
            k->kill_pending = 1;
        }
    }
    free(to);
    free(top);
    rt_link__kick(link);
    return 0;
}

void rt_link__on_tier_report(struct rt_link *link, int rank,
                             const Tangram__Worker__V1__TierReport *tr)
{
    if (rt_link__check_from(link, rank, "TierReport", tr->version,
                            tr->rank) != 0)
        return;
    if (tr->n_done == 0 || link->cfg.on_tier == NULL)
        return;
    struct rt_link_tier_done *d = calloc(tr->n_done, sizeof *d);
    if (d == NULL) {
        /* The ops stay in flight: their pages are held until the worker
         * is lost. Losing it now is the bounded way out. */
        rt_link__declare_dead(link, rank, "no memory for a tier report");
        return;
    }
    for (size_t i = 0; i < tr->n_done; i++) {
        const Tangram__Worker__V1__TierDone *x = tr->done[i];
        if (x == NULL) {
            free(d);
            rt_link__declare_dead(link, rank, "an empty TierDone");
            return;
        }
        d[i] = (struct rt_link_tier_done){
            .id = x->id, .ok = x->ok != 0,
            .error = x->error != NULL ? x->error : ""};
    }
    link->cfg.on_tier(link->cfg.ud, rank, d, tr->n_done);
    free(d);
}
