/*
 * rt_link_comm.c — the communicator hand-off of the router's worker link
 * (see "Communicator" in rt_link.h): rank 0's group id goes to every rank
 * in a CommSetup once all ranks said Hello, and the link is ready once
 * every rank answered CommReady ok.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/base/tg_log.h"
#include "router/link/rt_link.h"
#include "router/link/rt_link_internal.h"

/* Sends the CommSetup of rank 0's group to `rank`; a failed send kills
 * the rank from the loop (as a failed plan send does). */
static void send_comm_setup(struct rt_link *link, int rank)
{
    struct rt_link_rank *k = &link->ranks[rank];
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    Tangram__Worker__V1__CommSetup cs = TANGRAM__WORKER__V1__COMM_SETUP__INIT;
    cs.version = PROTO_V1;
    cs.comm_id.data = link->comm_id;
    cs.comm_id.len = link->comm_id_len;
    cs.comm_kind = link->comm_kind;
    cs.world_size = (uint32_t)link->cfg.world_size;
    m.version = PROTO_V1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_COMM_SETUP;
    m.comm_setup = &cs;
    k->setup_sent = 1;
    k->setup_at = uv_now(link->loop);
    char e[128];
    if (rt_link__send_rank(link, rank, &m, e, sizeof e) < 0) {
        k->kill_pending = 1;
        snprintf(k->kill_reason, sizeof k->kill_reason,
                 "CommSetup not delivered: %s", e);
        rt_link__kick(link);
    }
}

/* Once every rank is alive, hands rank 0's group id to each rank that has
 * not had it in this incarnation; once every rank joined, the link is
 * ready. The link may be closed when this returns (on_ready). */
void rt_link__advance_group(struct rt_link *link)
{
    for (int r = 0; r < link->cfg.world_size; r++)
        if (link->ranks[r].state != RANK_ALIVE)
            return;
    int all = 1;
    for (int r = 0; r < link->cfg.world_size; r++) {
        struct rt_link_rank *k = &link->ranks[r];
        if (!k->setup_sent && !link->shut)
            send_comm_setup(link, r);
        all &= k->comm_ready;
    }
    if (all && !link->ready && !link->shut) {
        link->ready = 1;
        log_info("link: all %d ranks ready", link->cfg.world_size);
        if (link->cfg.on_ready)
            link->cfg.on_ready(link->cfg.ud);
    }
}

void rt_link__on_comm_ready(struct rt_link *link, int rank,
                          const Tangram__Worker__V1__CommReady *cr)
{
    struct rt_link_rank *k = &link->ranks[rank];
    char why[320];
    if (rt_link__check_from(link, rank, "CommReady", cr->version,
                            cr->rank) != 0)
        return;
    if (!k->setup_sent || k->comm_ready) {
        rt_link__declare_dead(link, rank,
                              "CommReady without a pending CommSetup");
        return;
    }
    if (!cr->ok) {
        snprintf(why, sizeof why, "joining the communicator group failed: %s",
                 cr->error && cr->error[0] ? cr->error : "no reason given");
        rt_link__declare_dead(link, rank, why);
        return;
    }
    k->comm_ready = 1;
    log_info("link: rank %d joined its communicator group", rank);
    rt_link__advance_group(link);
}

