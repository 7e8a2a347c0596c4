/*
 * rt_link_grammar.c — structured outputs' prepares on the router's link
 * (DESIGN.md §4.11, proto/worker.proto GrammarCommand / GrammarReport):
 * the grammars to prepare and the ids to release out to rank 0, its
 * reports back to on_grammar. See rt_link.h.
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

int rt_link_send_grammar(struct rt_link *link, const struct rt_link_gprep *prep,
                         size_t n_prep, const uint64_t *release,
                         size_t n_release, char *err, size_t errlen)
{
    if (!link || !link->initialized || link->closed)
        return tg_err_set(err, errlen, TG_EINVAL, "link not open");
    if (n_prep == 0 && n_release == 0)
        return 0;
    if (!link->ready || link->shut)
        return tg_err_set(err, errlen, TG_EAGAIN, "not every rank is ready");
    Tangram__Worker__V1__GrammarPrepare *gp = n_prep > 0
                                                  ? calloc(n_prep, sizeof *gp)
                                                  : NULL;
    Tangram__Worker__V1__GrammarPrepare **gpp = n_prep > 0 ? calloc(n_prep,
                                                                    sizeof *gpp)
                                                           : NULL;
    if (n_prep > 0 && (gp == NULL || gpp == NULL)) {
        free(gp);
        free(gpp);
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "no memory for %zu grammar prepares", n_prep);
    }
    for (size_t i = 0; i < n_prep; i++) {
        tangram__worker__v1__grammar_prepare__init(&gp[i]);
        gp[i].id = prep[i].id;
        gp[i].spec = (char *)(uintptr_t)prep[i].spec; /* read by the pack */
        gpp[i] = &gp[i];
    }
    Tangram__Worker__V1__GrammarCommand cmd =
        TANGRAM__WORKER__V1__GRAMMAR_COMMAND__INIT;
    cmd.version = PROTO_V1;
    cmd.n_prepare = n_prep;
    cmd.prepare = gpp;
    cmd.n_release = n_release;
    cmd.release = (uint64_t *)(uintptr_t)release;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = PROTO_V1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_GRAMMAR_COMMAND;
    m.grammar_command = &cmd;
    struct rt_link_rank *k = &link->ranks[0];
    char e[128];
    if (rt_link__send_rank(link, 0, &m, e, sizeof e) < 0) {
        snprintf(k->kill_reason, sizeof k->kill_reason,
                 "grammar command not delivered: %s", e);
        k->kill_pending = 1;
    }
    free(gp);
    free(gpp);
    rt_link__kick(link);
    return 0;
}

void rt_link__on_grammar_report(struct rt_link *link, int rank,
                                const Tangram__Worker__V1__GrammarReport *gr)
{
    if (rt_link__check_from(link, rank, "GrammarReport", gr->version,
                            gr->rank) != 0)
        return;
    if (rank != 0) {
        rt_link__declare_dead(link, rank,
                              "a GrammarReport from a rank "
                              "other than 0");
        return;
    }
    if (gr->n_ready == 0 || link->cfg.on_grammar == NULL)
        return;
    struct rt_link_gready *r = calloc(gr->n_ready, sizeof *r);
    if (r == NULL) {
        /* Requests would wait for these prepares forever: losing the
         * worker (they are prepared again) is the bounded way out. */
        rt_link__declare_dead(link, rank, "no memory for a grammar report");
        return;
    }
    for (size_t i = 0; i < gr->n_ready; i++) {
        const Tangram__Worker__V1__GrammarReady *x = gr->ready[i];
        if (x == NULL) {
            free(r);
            rt_link__declare_dead(link, rank, "an empty GrammarReady");
            return;
        }
        r[i] = (struct rt_link_gready){.id = x->id,
                                       .ok = x->ok != 0,
                                       .busy = x->busy != 0,
                                       .error = x->error != NULL ? x->error
                                                                 : ""};
    }
    link->cfg.on_grammar(link->cfg.ud, r, gr->n_ready);
    free(r);
}
