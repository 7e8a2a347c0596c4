/* rt_sched_complete.c — applying a step's results to the scheduler: the
 * sampled tokens, the prefill chunks committed (with the workers' per-head
 * reports where an adaptive method keeps them), decode-time compaction
 * reports, requests that end; and failing every running request when a
 * worker is lost (rt_sched.h). One thread: the router loop. */
#include <stdint.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "router/core/rt_sched.h"
#include "router/core/rt_sched_internal.h"

int rt_sched_complete(struct rt_sched *s, struct rt_step *step,
                      const int32_t *tokens, const uint8_t *stop, char *err,
                      size_t errlen)
{
    return rt_sched_complete_heads(s, step, tokens, stop, NULL, 0, err,
                                   errlen);
}

int rt_sched_complete_heads(struct rt_sched *s, struct rt_step *step,
                            const int32_t *tokens, const uint8_t *stop,
                            const struct rt_step_heads *heads,
                            int32_t n_heads, char *err, size_t errlen)
{
    if (step->n_entries == 0) {
        step->n_events = 0;
        return 0;
    }
    if (s->outstanding == 0 || step->step_id != s->outstanding)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: step %llu is not the outstanding step",
                          (unsigned long long)step->step_id);
    for (int32_t i = 0; i < step->n_entries; i++) {
        if (!step->entries[i].sample)
            continue;
        if (tokens == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "rt_sched: step %llu samples but no tokens "
                              "were given",
                              (unsigned long long)step->step_id);
        /* An entry whose request was aborted since the plan (a client
         * gone, or a request the worker failed alone) has no token. */
        const struct rt_sched_req *live =
            rt_sched__find(s, step->entries[i].id);
        if (live == NULL || live->serial != step->entries[i].serial)
            continue;
        if (tokens[i] < 0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "rt_sched: sampled token %d for entry %d",
                              (int)tokens[i], (int)i);
    }
    int rc = rt_sched_check_heads(s, step, heads, n_heads, err, errlen);
    if (rc != 0)
        return rc;
    const int T = s->cfg.n_ranks;
    if (n_heads > 0) {
        /* Checked: the reports' entries exist and only per-head
         * schedulers have prefill reports, so head_of exists. */
        TG_ASSERT(s->head_of != NULL);
        for (int64_t i = 0; i < (int64_t)step->n_entries * T; i++)
            s->head_of[i] = -1;
        for (int32_t k = 0; k < n_heads; k++)
            s->head_of[(int64_t)heads[k].entry * T + heads[k].rank] = k;
    }
    /* The plan reserved events for every request live at that time, which
     * bounds the entries. */
    TG_ASSERT(step->cap_events >= step->n_entries);
    step->n_events = 0;
    for (int32_t i = 0; i < step->n_entries; i++) {
        const struct rt_step_entry *e = &step->entries[i];
        struct rt_sched_req *req = rt_sched__find(s, e->id);
        if (req == NULL || req->serial != e->serial)
            continue; /* aborted since the plan */
        TG_ASSERT(rt_sched__running(req));
        if (e->kind == RT_STEP_PREFILL) {
            rt_sched__commit_chunk(s, req, e, heads,
                                   n_heads > 0 ? s->head_of + (int64_t)i * T
                                               : NULL);
            /* A committed chunk is a point the KV can be rewound to, so
             * a later prompt sharing only part of this one still reuses
             * it (best effort: without memory there is just less reuse). */
            (void)rt_prefix_bounds_push(&req->bounds, e->pos + e->n, req->seqs,
                                        s->cfg.n_ranks);
            if (!e->sample)
                continue;
            req->state = RT_SCHED_DECODING;
            rt_sched__trig_decode_begin(s, req);
        } else if (e->kind == RT_STEP_FORK) {
            req->state = RT_SCHED_DECODING; /* its pages are the forked
                                                prompt's, committed */
            rt_sched__trig_decode_begin(s, req);
        } else if (rt_sched__trig_fires(s, req, e)) {
            /* §4.9 trigger step: the heads as the workers compacted them
             * (checked), before the request can end and be stored. */
            rt_sched__trig_compact(s, req, heads,
                                   n_heads > 0 ? s->head_of + (int64_t)i * T
                                               : NULL);
        }
        TG_ASSERT(req->n_tokens < req->cap);
        req->tokens[req->n_tokens++] = tokens[i];
        req->n_generated++;
        enum rt_sched_end fin = RT_SCHED_END_NONE;
        if (stop != NULL && stop[i])
            fin = RT_SCHED_END_STOP;
        else if (req->n_generated >= req->max_tokens)
            fin = RT_SCHED_END_LENGTH;
        rt_sched__push_event(step, req, tokens[i], fin);
        if (fin != RT_SCHED_END_NONE)
            rt_sched__retire(s, req, fin, NULL);
    }
    s->outstanding = 0;
    return 0;
}

int rt_sched_fail_running(struct rt_sched *s, struct rt_step *step)
{
    if (tg_grow_i32((void **)&step->events, &step->cap_events,
                    s->n_running > 0 ? s->n_running : 1,
                    sizeof(struct rt_sched_event)) != 0)
        return TG_ENOMEM;
    step->n_events = 0;
    /* Requests waiting for a restore ran nothing yet: they go on when
     * their copy is done (or are requeued if the tier is lost). */
    for (;;) {
        int32_t i = s->n_running - 1;
        while (i >= 0 && s->running[i]->restoring != 0)
            i--;
        if (i < 0)
            break;
        rt_sched__retire(s, s->running[i], RT_SCHED_END_ERROR, step);
    }
    while (rt_prefix_evict_lru(&s->cache, s->pools, NULL))
        ; /* device entries; the host tier keeps its own */
    s->outstanding = 0;
    return 0;
}

void rt_sched_drop_cache(struct rt_sched *s)
{
    rt_prefix_clear(&s->cache, s->pools);
}

