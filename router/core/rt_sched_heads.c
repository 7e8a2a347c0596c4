/* rt_sched_heads.c — the scheduler's side of per-head lengths: checking
 * the workers' head-length reports and committing a chunk with them (see
 * "Per-head lengths" in rt_sched.h). */
#include <stdio.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_sched.h"
#include "router/core/rt_sched_internal.h"

int rt_sched_check_heads(const struct rt_sched *s, const struct rt_step *step,
                         const struct rt_step_heads *heads, int32_t n_heads,
                         char *err, size_t errlen)
{
    if (n_heads == 0)
        return 0;
    if (heads == NULL || n_heads < 0)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "head-length reports missing");
    if (s->outstanding == 0 || step->step_id != s->outstanding)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "head lengths for step %llu, which is not "
                          "outstanding", (unsigned long long)step->step_id);
    for (int32_t k = 0; k < n_heads; k++) {
        const struct rt_step_heads *h = &heads[k];
        if (h->entry < 0 || h->entry >= step->n_entries || h->rank < 0 ||
            h->rank >= s->cfg.n_ranks)
            return tg_err_set(err, errlen, TG_EPROTO,
                              "head lengths for entry %d of rank %d: no such "
                              "entry or rank", (int)h->entry, (int)h->rank);
        for (int32_t j = 0; j < k; j++)
            if (heads[j].entry == h->entry && heads[j].rank == h->rank)
                return tg_err_set(err, errlen, TG_EPROTO,
                                  "rank %d reported the head lengths of slot "
                                  "%d twice", (int)h->rank,
                                  (int)step->entries[h->entry].slot);
        const struct rt_step_entry *e = &step->entries[h->entry];
        const struct rt_sched_req *req = rt_sched__find(s, e->id);
        if (req == NULL || req->serial != e->serial)
            continue; /* aborted since the plan: nothing to commit */
        const struct kv_seq *q = &req->seqs[h->rank];
        char why[200];
        if (e->kind == RT_STEP_DECODE && q->head_len != NULL &&
            s->trig != NULL) {
            int rc = rt_sched__trig_check(s, req, e, h, err, errlen);
            if (rc != 0)
                return rc;
            continue;
        }
        if (e->kind != RT_STEP_PREFILL || q->head_len == NULL)
            return tg_err_set(err, errlen, TG_EPROTO,
                              "rank %d reported head lengths for slot %d "
                              "(request %s), a %s entry the router keeps "
                              "%s", (int)h->rank, (int)e->slot,
                              req->request_id,
                              e->kind == RT_STEP_PREFILL ? "prefill"
                                                         : "decode",
                              q->head_len == NULL ? "no head lengths for"
                                                  : "predicted lengths for");
        if (kv_seq_heads_fit(q, s->lay[h->rank], e->n, h->head_lens, h->n, why,
                             sizeof why) != 0)
            return tg_err_set(err, errlen, TG_EPROTO,
                              "rank %d, slot %d (request %s): %s", (int)h->rank,
                              (int)e->slot, req->request_id, why);
    }
    return 0;
}

void rt_sched__commit_chunk(struct rt_sched *s, struct rt_sched_req *req,
                            const struct rt_step_entry *e,
                            const struct rt_step_heads *heads,
                            const int32_t *head_of)
{
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        struct kv_seq *q = &req->seqs[r];
        int32_t k = head_of != NULL ? head_of[r] : -1;
        int rc;
        if (k < 0) {
            rc = kv_seq_commit(q, s->lay[r], e->n, NULL, 0);
            TG_ASSERT(rc == 0); /* chunks are planned on boundaries */
            continue;
        }
        int64_t freed = 0;
        rc = kv_seq_commit_heads(q, s->lay[r], &s->pools[r], e->n,
                                 heads[k].head_lens, heads[k].n, &freed, NULL,
                                 0);
        TG_ASSERT(rc == 0); /* checked by rt_sched_check_heads */
        s->released_pages[r] += freed;
        if (freed == 0)
            continue;
        rt_sched__mark_cuts(s, req, r);
    }
}

void rt_sched__mark_cuts(struct rt_sched *s, struct rt_sched_req *req,
                         int rank)
{
    const struct kv_seq *q = &req->seqs[rank];
    int32_t *sent = req->sent + (int64_t)rank * s->rows;
    uint8_t *cut = req->cut + (int64_t)rank * s->rows;
    for (int32_t w = 0; w < s->rows; w++)
        if (q->n_pages[w] < sent[w]) {
            sent[w] = q->n_pages[w];
            cut[w] = 1;
        }
}
