/* gw_wlink_tier.c — the host tier's messages on a worker's link
 * (DESIGN.md §4.10, proto/worker.proto TierCommand / TierReport): the
 * router's copy ops into the worker's tier, finished ops back in order
 * (see gw_wlink.h). Main thread. */
#if __has_include("worker.pb-c.h")
/* The generated protocol header lives in the build tree; a library target
 * without tg_proto's include directory compiles this file to nothing. */
#include "gpu_worker/serve/gw_wlink.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"

#define REPORT_MAX 64 /* finished ops per TierReport */

/* Sends done[0 .. n) in one TierReport; 0 or the send's code. */
static int send_report(struct gw_wlink *l, const struct gw_tier_done *done,
                       size_t n)
{
    Tangram__Worker__V1__TierDone d[REPORT_MAX], *dp[REPORT_MAX];
    for (size_t i = 0; i < n; i++) {
        tangram__worker__v1__tier_done__init(&d[i]);
        d[i].id = done[i].id;
        d[i].ok = done[i].ok;
        d[i].error = (char *)done[i].error;
        dp[i] = &d[i];
    }
    Tangram__Worker__V1__TierReport tr =
        TANGRAM__WORKER__V1__TIER_REPORT__INIT;
    tr.version = GW_PROTOCOL_VERSION;
    tr.rank = (uint32_t)l->rank;
    tr.n_done = n;
    tr.done = dp;
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_TIER_REPORT;
    m.tier_report = &tr;
    char err[256];
    int rc = gw_wlink_send(l, &m, err, sizeof(err));
    if (rc != 0)
        log_err("%s", err);
    return rc;
}

int gw_wlink__tier_flush(struct gw_wlink *l, struct gw_worker *w)
{
    struct gw_tier_done done[REPORT_MAX];
    size_t n;
    while ((n = gw_host_tier_take(&w->tier, done, REPORT_MAX)) > 0) {
        for (size_t i = 0; i < n; i++)
            if (!done[i].ok)
                log_warn("host tier op %llu failed: %s",
                         (unsigned long long)done[i].id, done[i].error);
        if (send_report(l, done, n) != 0)
            return GW_WLINK_EXIT_ERROR;
    }
    return -1;
}

int gw_wlink__tier_command(struct gw_wlink *l, struct gw_worker *w,
                           const Tangram__Worker__V1__TierCommand *cmd)
{
    if (cmd->version != GW_PROTOCOL_VERSION) {
        log_err("TierCommand of protocol version %u, this worker speaks %u",
                cmd->version, GW_PROTOCOL_VERSION);
        return GW_WLINK_EXIT_PROTOCOL;
    }
    for (size_t i = 0; i < cmd->n_ops; i++) {
        const Tangram__Worker__V1__TierOp *op = cmd->ops[i];
        if (op == NULL)
            continue;
        int kind = op->kind;
        int to_host = kind == TANGRAM__WORKER__V1__TIER_KIND__TIER_KIND_OFFLOAD;
        int rc = kind == TANGRAM__WORKER__V1__TIER_KIND__TIER_KIND_OFFLOAD ||
                         kind == TANGRAM__WORKER__V1__TIER_KIND__TIER_KIND_RESTORE
                     ? gw_host_tier_submit(&w->tier, op->id, to_host,
                                           op->device_pages,
                                           op->n_device_pages,
                                           op->host_pages, op->n_host_pages)
                     : TG_EINVAL;
        if (rc == 0)
            continue;
        /* Not queued: the router still gets its answer, now. */
        struct gw_tier_done d = {.id = op->id, .ok = 0};
        snprintf(d.error, sizeof(d.error), "%s",
                 rc == TG_EINVAL ? "unknown tier op kind"
                                 : "out of memory queueing the copy");
        if (send_report(l, &d, 1) != 0)
            return GW_WLINK_EXIT_ERROR;
    }
    log_debug("%zu host tier ops queued", cmd->n_ops);
    return -1;
}

#endif
