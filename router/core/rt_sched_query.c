/* rt_sched_query.c — read-only views of the scheduler (statistics, page
 * counts, one request's state) and the full invariant check used by tests
 * (see rt_sched.h). */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_sched_internal.h"

int64_t rt_sched_max_tokens(const struct rt_sched *s)
{
    int64_t best = INT64_MAX;
    if (s->trig != NULL)
        return best; /* the decode KV is bounded; submit checks each */
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        const struct kv_layout *l = s->lay[r];
        int64_t rows = (int64_t)l->n_layers * l->n_groups;
        int64_t cap = kv_pool_n_total(&s->pools[r]) / rows * l->page_size;
        if (cap < best)
            best = cap;
    }
    return best;
}

void rt_sched_get_stats(const struct rt_sched *s, struct rt_sched_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->running = s->n_running;
    out->waiting = s->n_waiting;
    out->preemptions = s->preemptions;
    out->cached_prompt_tokens = s->cached_tokens;
    out->cache_entries = s->cache.n_entries;
    out->cache_evictions = s->cache.n_evictions;
    out->steps = s->steps;
}

void rt_sched_rank_pages(const struct rt_sched *s, int rank,
                         struct rt_sched_pages *out)
{
    TG_ASSERT(rank >= 0 && rank < s->cfg.n_ranks);
    const struct kv_pool *p = &s->pools[rank];
    out->total = kv_pool_n_total(p);
    out->used = kv_pool_n_used(p);
    out->cached = rt_prefix_pages(&s->cache, rank);
    out->monolithic = p->mono_pages;
    out->released = s->released_pages[rank];
    out->offloading = rt_sched__tier_pending(s, rank);
    out->host_total =
        s->host_pools != NULL ? kv_pool_n_total(&s->host_pools[rank]) : 0;
    out->host_used =
        s->host_pools != NULL ? kv_pool_n_used(&s->host_pools[rank]) : 0;
}

int rt_sched_req_info(const struct rt_sched *s, uint64_t id,
                      struct rt_sched_req_info *out)
{
    const struct rt_sched_req *req = rt_sched__find(s, id);
    if (req == NULL)
        return TG_ENOTFOUND;
    memset(out, 0, sizeof(*out));
    out->state = req->state;
    out->slot = req->slot;
    out->prompt_tokens = req->n_prompt;
    out->n_tokens = req->n_tokens;
    out->completion_tokens = req->n_generated;
    out->max_tokens = req->max_tokens;
    out->cached_prompt_tokens = req->cached;
    if (rt_sched__running(req)) {
        out->turn_start = req->seqs[0].turn_start;
        out->committed = req->seqs[0].committed;
        out->restoring = req->restoring != 0;
    }
    return 0;
}

const struct kv_seq *rt_sched_req_seq(const struct rt_sched *s, uint64_t id,
                                      int rank)
{
    const struct rt_sched_req *req = rt_sched__find(s, id);
    if (req == NULL || !rt_sched__running(req) || rank < 0 ||
        rank >= s->cfg.n_ranks)
        return NULL;
    return &req->seqs[rank];
}

/* ---- validation --------------------------------------------------------- */

/* Marks the pages of `q` in `bits`; returns the first page marked twice,
 * or -1. */
/* Counts one ownership of every page `q` holds. */
static void count_seq(const struct kv_seq *q, int32_t *cnt)
{
    for (int32_t w = 0; w < q->n_rows; w++) {
        const int32_t *ids = q->ids + q->off[w];
        for (int32_t k = 0; k < q->n_pages[w]; k++)
            cnt[ids[k]]++;
    }
}

/* Rank r's host pool: every taken host page held once, by a host entry
 * (restores give theirs back at issue), and the cache's counter right. */
static int validate_host(const struct rt_sched *s, int r, char *err,
                         size_t errlen)
{
    const struct kv_pool *hp = &s->host_pools[r];
    int rc = kv_pool_validate(hp, err, errlen);
    if (rc != 0)
        return rc;
    int32_t *cnt = calloc((size_t)hp->n_total + 1, sizeof(int32_t));
    if (cnt == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "rt_sched: cannot allocate the check counts");
    int64_t held = 0;
    for (const struct rt_prefix_entry *e = rt_prefix_newest(&s->cache);
         e != NULL; e = rt_prefix_older(e))
        if (e->on_host) {
            count_seq(&e->seqs[r], cnt);
            held += e->seqs[r].used_pages;
        }
    int32_t bad = -1;
    for (int32_t id = 0; id < hp->n_total && bad < 0; id++)
        if (cnt[id] > 1)
            bad = id;
    free(cnt);
    if (bad >= 0)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "rt_sched: rank %d host page %d held twice", r,
                          (int)bad);
    if (held != kv_pool_n_used(hp) || held != rt_prefix_host_pages(&s->cache, r))
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "rt_sched: rank %d host entries hold %lld pages, "
                          "the host pool uses %d, the cache counts %lld", r,
                          (long long)held, (int)kv_pool_n_used(hp),
                          (long long)rt_prefix_host_pages(&s->cache, r));
    return 0;
}

int rt_sched_validate(struct rt_sched *s, char *err, size_t errlen)
{
    const int T = s->cfg.n_ranks;
    size_t words = ((size_t)s->cfg.pages_per_rank + 63) / 64;
    if (s->bits == NULL && (s->bits = malloc(words * 8)) == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "rt_sched: cannot allocate the check bitmap");
    int32_t n_slots = 0;
    for (int32_t i = 0; i < s->cfg.max_num_seqs; i++)
        n_slots += s->slot_used[i] != 0;
    if (n_slots != s->n_running)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "rt_sched: %d slots used, %d running", (int)n_slots,
                          (int)s->n_running);
    int32_t n_wait = 0;
    const struct tg_list_node *n;
    TG_LIST_FOREACH(n, &s->waiting)
    {
        const struct rt_sched_req *q = TG_LIST_ENTRY(
            n, const struct rt_sched_req, wait_link);
        if (q->state != RT_SCHED_WAITING || q->slot != -1 ||
            (q->seqs != NULL && q->seqs[0].used_pages != 0))
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: queued request %llu is running or "
                              "holds pages", (unsigned long long)q->id);
        if (rt_sched__find(s, q->id) != q)
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: request %llu missing from the map",
                              (unsigned long long)q->id);
        n_wait++;
    }
    if (n_wait != s->n_waiting)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "rt_sched: %d queued, counter says %d", (int)n_wait,
                          (int)s->n_waiting);
    for (int32_t i = 0; i < s->n_running; i++) {
        const struct rt_sched_req *q = s->running[i];
        if (!rt_sched__running(q) || q->slot < 0 || !s->slot_used[q->slot] ||
            rt_sched__find(s, q->id) != q)
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: running request %llu is inconsistent",
                              (unsigned long long)q->id);
    }
    for (int r = 0; r < T; r++) {
        int rc = kv_pool_validate(&s->pools[r], err, errlen);
        if (rc != 0)
            return rc;
        /* Owners per page (parallel samples share pages): every taken
         * page is held exactly as many times as the pool counts owners,
         * and no free page is held. */
        const struct kv_pool *p = &s->pools[r];
        int32_t *cnt = calloc((size_t)p->n_total + 1, sizeof(int32_t));
        if (cnt == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM,
                              "rt_sched: cannot allocate the check counts");
        int64_t cached = 0, offloading = 0;
        for (int32_t i = 0; i < s->n_running; i++)
            count_seq(&s->running[i]->seqs[r], cnt);
        for (const struct rt_prefix_entry *e = rt_prefix_newest(&s->cache);
             e != NULL; e = rt_prefix_older(e)) {
            if (e->on_host)
                continue;
            count_seq(&e->seqs[r], cnt);
            cached += e->seqs[r].used_pages;
        }
        /* Copy ops hold one ownership of each device page they touch. */
        for (int32_t i = 0; i < s->n_tier_ops; i++) {
            const struct rt_tier_op *op = s->tier_ops[i];
            for (int64_t k = op->off[r]; k < op->off[r + 1]; k++)
                cnt[op->dev[k]]++;
            if (op->kind == RT_TIER_OFFLOAD)
                offloading += op->off[r + 1] - op->off[r];
        }
        if (offloading != rt_sched__tier_pending(s, r)) {
            free(cnt);
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: rank %d offloads hold %lld pages, "
                              "counter says %lld", r, (long long)offloading,
                              (long long)rt_sched__tier_pending(s, r));
        }
        const int32_t *free_ids = p->stack + (p->n_total - p->n_free);
        int32_t bad = -1, held = 0, distinct = 0;
        for (int32_t k = 0; k < p->n_free && bad < 0; k++)
            if (cnt[free_ids[k]] != 0)
                bad = free_ids[k], held = cnt[free_ids[k]];
        for (int32_t id = 0; id < p->n_total; id++)
            distinct += cnt[id] > 0;
        for (int32_t id = 0; id < p->n_total && bad < 0; id++)
            if (cnt[id] > 0 && cnt[id] != 1 + p->refs[id])
                bad = id, held = cnt[id];
        free(cnt);
        if (bad >= 0)
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: rank %d page %d is held %d times, "
                              "the pool counts %d owners (or it is free)", r,
                              (int)bad, (int)held, (int)(1 + p->refs[bad]));
        int64_t owned = distinct;
        if (cached != rt_prefix_pages(&s->cache, r))
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: rank %d cache holds %lld pages, "
                              "counter says %lld", r, (long long)cached,
                              (long long)rt_prefix_pages(&s->cache, r));
        if (owned != kv_pool_n_used(p))
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: rank %d uses %d pages, requests and "
                              "the cache hold %lld distinct ones", r,
                              (int)kv_pool_n_used(p), (long long)owned);
        if (s->host_pools != NULL) {
            int hrc = validate_host(s, r, err, errlen);
            if (hrc != 0)
                return hrc;
        }
    }
    return 0;
}
