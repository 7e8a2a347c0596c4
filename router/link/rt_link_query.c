/*
 * rt_link_query.c — the read-only questions the server asks the router's
 * worker link (readiness, a rank's state and silence, the pool every rank
 * can hold, the step in flight), and the one setting it may raise later
 * (the pages every rank must offer). Loop thread, as all of rt_link.
 */
#include <stdint.h>

#include "common/base/tg_err.h"
#include "router/link/rt_link.h"
#include "router/link/rt_link_internal.h"

int rt_link_ready(const struct rt_link *link)
{
    return link && link->initialized && !link->closed && !link->shut &&
           link->ready;
}

int rt_link_rank_joined(const struct rt_link *link, int rank)
{
    return rt_link_rank_alive(link, rank) && link->ranks[rank].comm_ready;
}

int rt_link_rank_alive(const struct rt_link *link, int rank)
{
    if (!link || !link->initialized || link->closed || rank < 0 ||
        rank >= link->cfg.world_size)
        return 0;
    return link->ranks[rank].state == RANK_ALIVE;
}

int64_t rt_link_rank_silence_ms(const struct rt_link *link, int rank)
{
    if (!rt_link_rank_alive(link, rank))
        return -1;
    uint64_t now = uv_now(link->loop), last = link->ranks[rank].last_seen;
    return now > last ? (int64_t)(now - last) : 0;
}

int32_t rt_link_min_pages(const struct rt_link *link)
{
    if (!link || !link->initialized || link->closed)
        return 0;
    uint32_t min = 0;
    for (int r = 0; r < link->cfg.world_size; r++) {
        const struct rt_link_rank *k = &link->ranks[r];
        if (k->state == RANK_ALIVE && (!min || k->pages_total < min))
            min = k->pages_total;
    }
    return min > INT32_MAX ? INT32_MAX : (int32_t)min;
}

int rt_link_require_pages(struct rt_link *link, uint32_t pages)
{
    if (!link || !link->initialized || link->closed)
        return TG_EINVAL;
    if (pages > link->cfg.layout.pages_total)
        link->cfg.layout.pages_total = pages;
    return 0;
}

int rt_link_per_head(const struct rt_link *link)
{
    return link && link->per_head == 1;
}

uint64_t rt_link_in_flight(const struct rt_link *link)
{
    return link && link->initialized && !link->closed ? link->inflight : 0;
}
