/* rt_sched_map.c — the scheduler's map from request id to request: a
 * tg_hmap of request pointers, sized at init for every request the
 * scheduler can hold (so a put never fails). One thread, the scheduler's. */
#include <stdint.h>

#include "common/base/tg_err.h"
#include "common/base/tg_hmap.h"
#include "router/core/rt_sched_internal.h"

static inline int req_probe(const void *slot, const void *key)
{
    const struct rt_sched_req *q = *(struct rt_sched_req *const *)slot;
    if (q == NULL)
        return TG_HMAP_EMPTY;
    return q->id == *(const uint64_t *)key ? TG_HMAP_HIT : TG_HMAP_MISS;
}

static int req_empty(const void *slot)
{
    return *(struct rt_sched_req *const *)slot == NULL;
}

static uint64_t req_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return tg_hash_u64((*(struct rt_sched_req *const *)slot)->id);
}

static const struct tg_hmap_type req_type = {
    .esize = sizeof(struct rt_sched_req *),
    .empty_byte = 0,
    .probe = req_probe,
    .is_empty = req_empty,
    .hash = req_hash,
};

int rt_sched__map_init(struct rt_sched *s, int64_t live)
{
    return tg_hmap_init(&s->map, &req_type, NULL, (size_t)live);
}

struct rt_sched_req *rt_sched__find(const struct rt_sched *s, uint64_t id)
{
    struct rt_sched_req **slot = tg_hmap_find(&s->map, &req_type,
                                              tg_hash_u64(id), &id);
    return slot != NULL ? *slot : NULL;
}

void rt_sched__map_put(struct rt_sched *s, struct rt_sched_req *req)
{
    int added = 0;
    struct rt_sched_req **slot = tg_hmap_put(
        &s->map, &req_type, tg_hash_u64(req->id), &req->id, &added);
    /* Sized for every live request: never grows, never fails. */
    TG_ASSERT(slot != NULL && added);
    *slot = req;
}

void rt_sched__map_del(struct rt_sched *s, uint64_t id)
{
    struct rt_sched_req **slot = tg_hmap_find(&s->map, &req_type,
                                              tg_hash_u64(id), &id);
    TG_ASSERT(slot != NULL);
    tg_hmap_del(&s->map, &req_type, slot);
}
