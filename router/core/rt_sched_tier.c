/* rt_sched_tier.c — the scheduler's host tier of stored conversations
 * (DESIGN.md §4.10): offload instead of drop, restore instead of
 * recompute, the copy ops in flight and the workers' reports (see the
 * host-tier paragraph of rt_sched.h). The router owns the directory: which
 * entry is on the device or on the host and which pages are whose; the
 * workers own the bytes. One thread: the router loop. */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "router/core/rt_sched.h"
#include "router/core/rt_sched_internal.h"

int rt_sched__tier_init(struct rt_sched *s, char *err, size_t errlen)
{
    const int T = s->cfg.n_ranks;
    s->tier_next = 1;
    if (s->cfg.host_pages_per_rank < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: %d host pages per rank",
                          (int)s->cfg.host_pages_per_rank);
    if (s->cfg.host_pages_per_rank == 0)
        return 0;
    s->host_pools = calloc((size_t)T, sizeof(struct kv_pool));
    s->tier_pending = calloc((size_t)T, sizeof(int64_t));
    if (s->host_pools == NULL || s->tier_pending == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "rt_sched: cannot allocate the host tier");
    for (int r = 0; r < T; r++) {
        int rc = kv_pool_init(&s->host_pools[r], s->cfg.host_pages_per_rank,
                              err, errlen);
        if (rc == 0 && s->cfg.debug_track)
            rc = kv_pool_debug_track(&s->host_pools[r], err, errlen);
        if (rc != 0)
            return rc;
    }
    return rt_prefix_tier_init(&s->cache, s->host_pools, err, errlen);
}

static void op_free(struct rt_tier_op *op)
{
    if (op == NULL)
        return;
    free(op->reported);
    free(op->off);
    free(op->dev);
    free(op->host);
    free(op);
}

void rt_sched__tier_free(struct rt_sched *s)
{
    for (int32_t i = 0; i < s->n_tier_ops; i++)
        op_free(s->tier_ops[i]);
    free(s->tier_ops);
    s->tier_ops = NULL;
    s->n_tier_ops = s->cap_tier_ops = s->tier_unsent = 0;
    if (s->host_pools != NULL)
        for (int r = 0; r < s->cfg.n_ranks; r++)
            kv_pool_free(&s->host_pools[r]);
    free(s->host_pools);
    free(s->tier_pending);
    s->host_pools = NULL;
    s->tier_pending = NULL;
}

int64_t rt_sched__tier_pending(const struct rt_sched *s, int rank)
{
    return s->tier_pending != NULL ? s->tier_pending[rank] : 0;
}

/* A new op for every page of seqs[0 .. T) (not yet in the list; room for
 * it there is made), or NULL without memory. */
static struct rt_tier_op *op_new(struct rt_sched *s, enum rt_tier_kind kind,
                                 const struct kv_seq *seqs)
{
    const int T = s->cfg.n_ranks;
    if (tg_grow_i32((void **)&s->tier_ops, &s->cap_tier_ops,
                    (int64_t)s->n_tier_ops + 1, sizeof(s->tier_ops[0])) != 0)
        return NULL;
    struct rt_tier_op *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return NULL;
    op->off = malloc(((size_t)T + 1) * sizeof(int64_t));
    op->reported = calloc((size_t)T, 1);
    if (op->off == NULL || op->reported == NULL) {
        op_free(op);
        return NULL;
    }
    op->off[0] = 0;
    for (int r = 0; r < T; r++)
        op->off[r + 1] = op->off[r] + seqs[r].used_pages;
    size_t n = op->off[T] > 0 ? (size_t)op->off[T] : 1;
    op->dev = malloc(n * sizeof(int32_t));
    op->host = malloc(n * sizeof(int32_t));
    if (op->dev == NULL || op->host == NULL) {
        op_free(op);
        return NULL;
    }
    op->kind = kind;
    op->pending = T;
    return op;
}

/* Appends op (room made by op_new) as the newest, unsent op. */
static void op_push(struct rt_sched *s, struct rt_tier_op *op)
{
    op->id = s->tier_next++;
    s->tier_ops[s->n_tier_ops++] = op;
    s->tier_unsent++;
}

static int32_t op_pages(const struct rt_tier_op *op, int rank)
{
    return (int32_t)(op->off[rank + 1] - op->off[rank]);
}

/* Moves device entry e to the host tier, making room there by dropping the
 * least recent host entries other than `keep` (the entry an admission is
 * about to restore). 0, or TG_ENOSPC (it cannot fit: drop it instead) or
 * TG_ENOMEM, with e still on the device. */
static int offload(struct rt_sched *s, struct rt_prefix_entry *e,
                   const struct rt_prefix_entry *keep)
{
    const int T = s->cfg.n_ranks;
    for (int r = 0; r < T; r++)
        if (e->seqs[r].used_pages > kv_pool_n_total(&s->host_pools[r]))
            return TG_ENOSPC;
    struct rt_tier_op *op = op_new(s, RT_TIER_OFFLOAD, e->seqs);
    if (op == NULL)
        return TG_ENOMEM;
    for (int r = 0; r < T; r++)
        while (e->seqs[r].used_pages > kv_pool_n_free(&s->host_pools[r]))
            /* Entries still being copied out may go too: a later op never
             * overtakes their copies on a worker. */
            if (!rt_prefix_evict_host_lru(&s->cache, keep)) {
                op_free(op);
                return TG_ENOSPC; /* held by `keep` */
            }
    for (int r = 0; r < T; r++) {
        int rc = kv_seq_move_pages(&e->seqs[r], &s->pools[r],
                                   &s->host_pools[r], op->dev + op->off[r],
                                   op->host + op->off[r], NULL, 0);
        TG_ASSERT(rc == 0); /* a stored seq is committed; room was made */
        s->tier_pending[r] += op_pages(op, r);
    }
    rt_prefix_set_on_host(&s->cache, e);
    op_push(s, op);
    e->offload_op = op->id;
    s->tier_stats.offloads++;
    return 0;
}

int rt_sched__tier_evict(struct rt_sched *s,
                         const struct rt_prefix_entry *keep)
{
    struct rt_prefix_entry *e = rt_prefix_oldest_device(&s->cache, keep);
    if (e == NULL)
        return 0;
    if (s->host_pools == NULL || offload(s, e, keep) != 0)
        rt_prefix_drop(&s->cache, s->pools, e);
    return 1;
}

int rt_sched__make_room(struct rt_sched *s, int rank, int64_t need,
                        const struct rt_prefix_entry *keep)
{
    while (need > kv_pool_n_free(&s->pools[rank])) {
        if (need <= kv_pool_n_free(&s->pools[rank]) +
                        rt_sched__tier_pending(s, rank))
            return TG_EAGAIN;
        if (!rt_sched__tier_evict(s, keep))
            return TG_EAGAIN;
    }
    return 0;
}

int rt_sched__tier_decode_waits(const struct rt_sched *s,
                                const struct rt_sched_req *req)
{
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        int64_t need = 0;
        (void)kv_seq_decode_pages(&req->seqs[r], s->lay[r], 1, &need);
        if (need > kv_pool_n_free(&s->pools[r]) + rt_sched__tier_pending(s, r))
            return 0;
    }
    return 1;
}

int rt_sched__tier_restore(struct rt_sched *s, struct rt_sched_req *req,
                           struct rt_prefix_entry *m)
{
    const int T = s->cfg.n_ranks;
    TG_ASSERT(m->on_host && s->host_pools != NULL);
    struct rt_tier_op *op = op_new(s, RT_TIER_RESTORE, m->seqs);
    if (op == NULL)
        return TG_ENOMEM;
    op->after = m->offload_op;
    rt_prefix_take_bounds(&s->cache, m, req->seqs, &req->bounds);
    for (int r = 0; r < T; r++) {
        int32_t n = op_pages(op, r);
        int32_t *dev = op->dev + op->off[r], *host = op->host + op->off[r];
        int rc = kv_seq_move_pages(&req->seqs[r], &s->host_pools[r],
                                   &s->pools[r], host, dev, NULL, 0);
        TG_ASSERT(rc == 0); /* the caller made room */
        /* The op holds the pages it writes until every rank copied them
         * in, whatever becomes of the request meanwhile. */
        rc = kv_pool_ref(&s->pools[r], n, dev);
        TG_ASSERT(rc == 0);
        /* The host pages are free at once: a worker runs its ops in
         * order, so no later op's copy into them overtakes this read. */
        rc = kv_pool_push(&s->host_pools[r], n, host);
        TG_ASSERT(rc == 0);
    }
    op->req = req->id;
    op_push(s, op);
    req->restoring = op->id;
    return 0;
}

int32_t rt_sched_tier_take(struct rt_sched *s, double now,
                           struct rt_tier_op *const **ops)
{
    int32_t n = s->tier_unsent, first = s->n_tier_ops - n;
    for (int32_t i = first; i < s->n_tier_ops; i++)
        s->tier_ops[i]->issued = now;
    s->tier_unsent = 0;
    *ops = n > 0 ? s->tier_ops + first
                 : NULL; /* tier_ops NULL: no arithmetic */
    return n;
}

static void op_remove(struct rt_sched *s, int32_t i)
{
    op_free(s->tier_ops[i]);
    memmove(&s->tier_ops[i], &s->tier_ops[i + 1],
            (size_t)(s->n_tier_ops - i - 1) * sizeof(s->tier_ops[0]));
    s->n_tier_ops--;
    if (s->tier_unsent > s->n_tier_ops)
        s->tier_unsent = s->n_tier_ops;
}

/* The op's ownership of its device pages ends: an offload's go back to
 * the pools (their entry is on the host), a restore's stay with whoever
 * else holds them. */
static void op_release(struct rt_sched *s, const struct rt_tier_op *op)
{
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        int32_t n = op_pages(op, r);
        int rc = kv_pool_push(&s->pools[r], n, op->dev + op->off[r]);
        TG_ASSERT(rc == 0); /* one ownership each, taken at issue */
        if (op->kind == RT_TIER_OFFLOAD)
            s->tier_pending[r] -= n;
    }
}

/* Requeues the request waiting for restore op `op` (it goes back to the
 * front of the queue holding nothing; its conversation's KV is gone, so it
 * is prefilled from scratch and counts no cached tokens). */
static void requeue_waiter(struct rt_sched *s, const struct rt_tier_op *op)
{
    struct rt_sched_req *req = rt_sched__find(s, op->req);
    if (req == NULL || req->restoring != op->id)
        return; /* it ended, or was preempted, meanwhile */
    rt_sched__preempt(s, req);
    req->admitted = 0;
    req->cached = 0;
}

static void offload_ended(struct rt_sched *s, const struct rt_tier_op *op)
{
    for (struct rt_prefix_entry *e = rt_prefix_newest(&s->cache); e != NULL;
         e = rt_prefix_older(e))
        if (e->offload_op == op->id) {
            if (op->failed) /* its host copy cannot be trusted */
                rt_prefix_drop(&s->cache, s->pools, e);
            else
                e->offload_op = 0;
            break;
        }
    for (int32_t i = 0; i < s->n_tier_ops; i++) {
        struct rt_tier_op *x = s->tier_ops[i];
        if (x->after == op->id) {
            x->failed |= op->failed;
            x->after = 0;
        }
    }
    if (op->failed)
        s->tier_stats.offload_failures++;
}

static void restore_ended(struct rt_sched *s, const struct rt_tier_op *op)
{
    if (op->failed) {
        s->tier_stats.restore_failures++;
        requeue_waiter(s, op);
        return;
    }
    struct rt_sched_req *req = rt_sched__find(s, op->req);
    if (req != NULL && req->restoring == op->id)
        req->restoring = 0; /* planned from the next step on */
    s->tier_stats.restores++;
    s->tier_stats.restored_pages += op->off[s->cfg.n_ranks];
}

int rt_sched_tier_done(struct rt_sched *s, int rank, uint64_t id, int ok,
                       struct rt_tier_event *ev)
{
    if (rank < 0 || rank >= s->cfg.n_ranks)
        return TG_EPROTO;
    int32_t i = 0;
    while (i < s->n_tier_ops && s->tier_ops[i]->id != id)
        i++;
    /* An op not sent yet cannot have been answered either. */
    if (i == s->n_tier_ops || i >= s->n_tier_ops - s->tier_unsent)
        return i == s->n_tier_ops ? TG_ENOTFOUND : TG_EPROTO;
    struct rt_tier_op *op = s->tier_ops[i];
    if (op->reported[rank])
        return TG_EPROTO;
    op->reported[rank] = 1;
    op->failed |= !ok;
    if (--op->pending > 0)
        return 0;
    op_release(s, op);
    if (op->kind == RT_TIER_OFFLOAD)
        offload_ended(s, op);
    else
        restore_ended(s, op);
    if (ev != NULL)
        *ev = (struct rt_tier_event){.kind = op->kind, .ok = !op->failed,
                                     .issued = op->issued,
                                     .pages = op->off[s->cfg.n_ranks]};
    op_remove(s, i);
    return 1;
}

void rt_sched_tier_lost(struct rt_sched *s)
{
    if (s->host_pools == NULL)
        return;
    s->tier_stats.drops_lost += rt_prefix_clear_host(&s->cache);
    /* Newest first, so the oldest waiter ends up at the front. */
    while (s->n_tier_ops > 0) {
        struct rt_tier_op *op = s->tier_ops[s->n_tier_ops - 1];
        op_release(s, op);
        if (op->kind == RT_TIER_RESTORE)
            requeue_waiter(s, op);
        op_remove(s, s->n_tier_ops - 1);
    }
    s->tier_unsent = 0;
}

void rt_sched_get_tier(const struct rt_sched *s,
                       struct rt_sched_tier_stats *out)
{
    *out = s->tier_stats;
    out->drops_lru = s->cache.n_host_evictions;
    out->host_entries = s->cache.n_host_entries;
    out->ops_in_flight = s->n_tier_ops;
}
