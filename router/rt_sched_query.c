/* rt_sched_query.c — read-only views of the scheduler (statistics, page
 * counts, one request's state) and the full invariant check used by tests
 * (see rt_sched.h). */
#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"
#include "router/rt_sched_internal.h"

int64_t rt_sched_max_tokens(const struct rt_sched *s)
{
    int64_t best = INT64_MAX;
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
static int32_t mark_seq(const struct kv_seq *q, uint64_t *bits)
{
    for (int32_t w = 0; w < q->n_rows; w++) {
        const int32_t *ids = q->ids + q->off[w];
        for (int32_t k = 0; k < q->n_pages[w]; k++) {
            int32_t id = ids[k];
            if (bits[id >> 6] >> (id & 63) & 1)
                return id;
            bits[id >> 6] |= 1ULL << (id & 63);
        }
    }
    return -1;
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
    for (const struct rt_sched_req *q = s->wait_head; q != NULL; q = q->next) {
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
        memset(s->bits, 0, words * 8);
        const struct kv_pool *p = &s->pools[r];
        const int32_t *free_ids = p->stack + (p->n_total - p->n_free);
        for (int32_t k = 0; k < p->n_free; k++)
            s->bits[free_ids[k] >> 6] |= 1ULL << (free_ids[k] & 63);
        int64_t owned = 0, cached = 0;
        int32_t dup = -1;
        for (int32_t i = 0; i < s->n_running && dup < 0; i++) {
            dup = mark_seq(&s->running[i]->seqs[r], s->bits);
            owned += s->running[i]->seqs[r].used_pages;
        }
        for (const struct rt_prefix_entry *e = s->cache.newest;
             e != NULL && dup < 0; e = e->older) {
            dup = mark_seq(&e->seqs[r], s->bits);
            cached += e->seqs[r].used_pages;
        }
        if (dup >= 0)
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: rank %d page %d is owned twice or "
                              "owned and free", r, (int)dup);
        if (cached != rt_prefix_pages(&s->cache, r))
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: rank %d cache holds %lld pages, "
                              "counter says %lld", r, (long long)cached,
                              (long long)rt_prefix_pages(&s->cache, r));
        if (owned + cached != kv_pool_n_used(p))
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "rt_sched: rank %d uses %d pages, requests hold "
                              "%lld and the cache %lld", r,
                              (int)kv_pool_n_used(p), (long long)owned,
                              (long long)cached);
    }
    return 0;
}
