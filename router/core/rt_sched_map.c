/* rt_sched_map.c — the scheduler's map from request id to request: open
 * addressing with linear probing and backward-shift deletion, sized at
 * init for every request the scheduler can hold (so a put never fails).
 * One thread, the scheduler's. */
#include <stdint.h>

#include "common/base/tg_err.h"
#include "router/core/rt_sched_internal.h"

static uint64_t mix64(uint64_t x)
{
    /* splitmix64 finaliser (Steele, Lea, Flood 2014). */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int64_t map_slot(const struct rt_sched *s, uint64_t id)
{
    int64_t mask = s->map_cap - 1;
    int64_t i = (int64_t)(mix64(id) & (uint64_t)mask);
    while (s->map[i] != NULL && s->map[i]->id != id)
        i = (i + 1) & mask;
    return i;
}

struct rt_sched_req *rt_sched__find(const struct rt_sched *s, uint64_t id)
{
    return s->map[map_slot(s, id)];
}

void rt_sched__map_put(struct rt_sched *s, struct rt_sched_req *req)
{
    int64_t i = map_slot(s, req->id);
    TG_ASSERT(s->map[i] == NULL); /* sized for every live request */
    s->map[i] = req;
}

void rt_sched__map_del(struct rt_sched *s, uint64_t id)
{
    int64_t mask = s->map_cap - 1;
    int64_t i = map_slot(s, id);
    TG_ASSERT(s->map[i] != NULL);
    s->map[i] = NULL;
    /* Pull later members of the probe run back over the hole when their
     * home slot does not lie cyclically in (hole, j]. */
    for (int64_t j = (i + 1) & mask; s->map[j] != NULL; j = (j + 1) & mask) {
        int64_t home = (int64_t)(mix64(s->map[j]->id) & (uint64_t)mask);
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            s->map[i] = s->map[j];
            s->map[j] = NULL;
            i = j;
        }
    }
}
