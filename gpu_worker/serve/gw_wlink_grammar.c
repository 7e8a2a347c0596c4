/* gw_wlink_grammar.c — structured outputs' prepares on a worker's link
 * (DESIGN.md §4.11, proto/worker.proto GrammarCommand / GrammarReport):
 * the router's prepares pinned on rank 0's compile pool, its releases
 * unpinned, the outcomes reported between steps (see gw_wlink.h). Main
 * thread. */
#if __has_include("worker.pb-c.h")
/* The generated protocol header lives in the build tree; a library target
 * without tg_proto's include directory compiles this file to nothing. */
#include "gpu_worker/serve/gw_wlink.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"

#define REPORT_MAX 32 /* outcomes per GrammarReport */

/* Sends r[0 .. n) in one GrammarReport; 0 or the send's code. */
static int send_report(struct gw_wlink *l, const struct gw_gready *r, size_t n)
{
    Tangram__Worker__V1__GrammarReady d[REPORT_MAX], *dp[REPORT_MAX];
    for (size_t i = 0; i < n; i++) {
        tangram__worker__v1__grammar_ready__init(&d[i]);
        d[i].id = r[i].id;
        d[i].ok = r[i].ok;
        d[i].busy = r[i].busy;
        d[i].error = (char *)r[i].error;
        dp[i] = &d[i];
    }
    Tangram__Worker__V1__GrammarReport gr =
        TANGRAM__WORKER__V1__GRAMMAR_REPORT__INIT;
    gr.version = GW_PROTOCOL_VERSION;
    gr.rank = (uint32_t)l->rank;
    gr.n_ready = n;
    gr.ready = dp;
    GwWorkerMessage m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_REPORT;
    m.grammar_report = &gr;
    char err[256];
    int rc = gw_wlink_send(l, &m, err, sizeof(err));
    if (rc != 0)
        log_err("%s", err);
    return rc;
}

int gw_wlink__grammar_flush(struct gw_wlink *l, struct gw_worker *w)
{
    if (w->rank != 0)
        return -1;
    /* Static: 32 reasons of up to 384 bytes are too much for the stack of
     * a loop turn, and one thread owns the link. */
    static struct gw_gready r[REPORT_MAX];
    size_t n;
    while ((n = gw_grammar_take_ready(&w->gram, r, REPORT_MAX)) > 0) {
        for (size_t i = 0; i < n; i++)
            if (!r[i].ok)
                log_info("output constraint prepare %llu failed: %s",
                         (unsigned long long)r[i].id, r[i].error);
        if (send_report(l, r, n) != 0)
            return GW_WLINK_EXIT_ERROR;
        if (n < REPORT_MAX)
            break;
    }
    return -1;
}

int gw_wlink__grammar_command(struct gw_wlink *l, struct gw_worker *w,
                              const Tangram__Worker__V1__GrammarCommand *cmd)
{
    (void)l;
    if (cmd->version != GW_PROTOCOL_VERSION) {
        log_err("GrammarCommand of protocol version %u, this worker speaks %u",
                cmd->version, GW_PROTOCOL_VERSION);
        return GW_WLINK_EXIT_PROTOCOL;
    }
    if (w->rank != 0) {
        log_warn("ignoring a GrammarCommand on rank %d (rank 0 samples)",
                 w->rank);
        return -1;
    }
    for (size_t i = 0; i < cmd->n_prepare; i++) {
        const Tangram__Worker__V1__GrammarPrepare *p = cmd->prepare[i];
        if (p == NULL)
            continue;
        const char *spec = p->spec != NULL ? p->spec : "";
        gw_grammar_pin(&w->gram, p->id, spec, strlen(spec));
    }
    for (size_t i = 0; i < cmd->n_release; i++)
        gw_grammar_unpin(&w->gram, cmd->release[i]);
    log_debug("%zu output constraints to prepare, %zu released (%zu held)",
              cmd->n_prepare, cmd->n_release, gw_grammar_pins(&w->gram));
    return -1;
}

#endif
