/* rt_sched_fork.c — parallel samples (OpenAI n > 1) in the scheduler:
 * a sample joins its waiting leader (attached, in no list), the group is
 * admitted once (the prompt's pages once, each sample forked from the
 * leader's reservation with kv_seq_fork), its fork entries go into the
 * step of the leader's last chunk, and a group preempted before that goes
 * back to the queue whole. rt_sched.c calls these at those points
 * (rt_sched_internal.h); the rules are in rt_sched.h (fork_of). Loop
 * thread, as the scheduler. */
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "router/core/rt_sched_internal.h"

/* A parallel sample may join `req->fork_of` when that request waits, was
 * never admitted, leads no other group, has the same prompt, and the
 * group still fits a step's slots and a pool: its prompt's pages plus one
 * private page per row for each other sample (the admission bound). */
int rt_sched__sample_check(struct rt_sched *s,
                           const struct rt_sched_request *req,
                           struct rt_sched_req **leader, char *err,
                           size_t errlen)
{
    struct rt_sched_req *l = rt_sched__find(s, req->fork_of);
    if (l == NULL || l->state != RT_SCHED_WAITING || l->admitted ||
        l->leader != NULL || l->is_sample)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: request %llu is not a waiting request "
                          "to sample in parallel with",
                          (unsigned long long)req->fork_of);
    if (s->cfg.per_head && s->trig == NULL)
        /* A sample forks its leader's reservation, which per-head commits
         * shrink after each chunk by counts only the workers know. */
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: parallel samples are not supported with "
                          "per-head lengths (an adaptive method)");
    if (req->session_id != NULL || l->n_prompt != req->n_prompt ||
        memcmp(l->tokens, req->prompt,
               (size_t)req->n_prompt * sizeof(int32_t)) != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: a parallel sample needs its group's "
                          "prompt and no session");
    int64_t k = (int64_t)l->n_sibs + 1; /* samples besides the leader */
    if (1 + k > s->cfg.max_num_seqs)
        return tg_err_set(err, errlen, TG_ETOOBIG,
                          "rt_sched: %lld parallel samples exceed "
                          "max_num_seqs %d",
                          (long long)(1 + k), s->cfg.max_num_seqs);
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        int64_t pages = 0;
        int rc = kv_seq_prompt_pages(NULL, s->lay[r], 0, req->n_prompt, &pages,
                                     err, errlen);
        if (rc != 0)
            return rc;
        /* With decode-time compression every sample's bounded decode is
         * reserved at admission too. */
        pages += (1 + k) * rt_sched__trig_extra(s, r, req->max_tokens);
        if (pages + k * s->rows > s->cfg.pages_per_rank)
            return tg_err_set(err, errlen, TG_ETOOBIG,
                              "rt_sched: %lld parallel samples of a %lld-"
                              "token prompt need %lld pages on rank %d, a "
                              "pool has %d",
                              (long long)(1 + k), (long long)req->n_prompt,
                              (long long)(pages + k * s->rows), r,
                              (int)s->cfg.pages_per_rank);
    }
    *leader = l;
    return 0;
}

/* Takes an attached parallel sample off its leader's list. */
void rt_sched__sample_detach(struct rt_sched *s, struct rt_sched_req *req)
{
    struct rt_sched_req *l = req->leader;
    int32_t i = 0;
    while (i < l->n_sibs && l->sibs[i] != req)
        i++;
    TG_ASSERT(i < l->n_sibs);
    memmove(&l->sibs[i], &l->sibs[i + 1],
            (size_t)(l->n_sibs - i - 1) * sizeof(l->sibs[0]));
    l->n_sibs--;
    if (req->state == RT_SCHED_WAITING)
        s->n_attached--;
    req->leader = NULL;
    req->fork_pending = 0;
}

/* Room in the step for the fork entries of `leader`'s samples (their
 * deltas carry every page they hold) and the tokens they sample, checked
 * with the leader's last chunk so that the chunk and the forks go
 * together. */
int rt_sched__forks_room(struct rt_sched *s, struct rt_step *out,
                         struct rt_sched_req *leader)
{
    if (leader->n_sibs == 0)
        return 0;
    int64_t ids = 0;
    for (int32_t i = 0; i < leader->n_sibs; i++) {
        ids += rt_sched__unsent_ids(s, leader->sibs[i], 0);
        if (rt_sched__token_room(leader->sibs[i]) != 0)
            return TG_ENOMEM;
    }
    int64_t recs = (int64_t)(leader->n_sibs + 1) * s->cfg.n_ranks * s->rows;
    if (tg_grow_i64((void **)&out->deltas, &out->cap_deltas,
                    out->n_deltas + recs, sizeof(struct rt_step_delta)) != 0)
        return TG_ENOMEM;
    return tg_grow_i64((void **)&out->delta_ids, &out->cap_ids,
                       out->n_ids + ids + rt_sched__unsent_ids(s, leader, 0),
                       sizeof(int32_t));
}

/* After `leader`'s last chunk entry: one fork entry per sample (room made
 * by forks_room), and the group dissolves into ordinary requests. */
void rt_sched__plan_forks(struct rt_sched *s, struct rt_step *out,
                          struct rt_sched_req *leader)
{
    for (int32_t i = 0; i < leader->n_sibs; i++) {
        struct rt_sched_req *q = leader->sibs[i];
        TG_ASSERT(q->fork_pending && q->fresh);
        int32_t idx = out->n_entries;
        rt_sched__add_entry(s, out, q, RT_STEP_FORK, q->seqs[0].pos, 0, 1);
        out->entries[idx].fork_from = leader->slot;
        q->fork_pending = 0;
        q->leader = NULL;
    }
    leader->n_sibs = 0;
}

/* At `leader`'s admission, its reservation made: every attached sample
 * forks it on every rank (shared full pages, a private last page per
 * partly filled row) and takes a slot after it. The caller checked the
 * slots and pages. Returns 0 or TG_ENOMEM (the sample that failed holds
 * nothing; the caller ends the group). */
int rt_sched__admit_samples(struct rt_sched *s, struct rt_sched_req *leader,
                            int64_t start)
{
    const int T = s->cfg.n_ranks;
    for (int32_t i = 0; i < leader->n_sibs; i++) {
        struct rt_sched_req *q = leader->sibs[i];
        if (q->sent == NULL && (q->sent = calloc((size_t)T * (size_t)s->rows,
                                                 sizeof(int32_t))) == NULL)
            return TG_ENOMEM;
        if (q->cut == NULL &&
            (q->cut = calloc((size_t)T * (size_t)s->rows, 1)) == NULL)
            return TG_ENOMEM;
        if (q->seqs == NULL &&
            (q->seqs = calloc((size_t)T, sizeof(struct kv_seq))) == NULL)
            return TG_ENOMEM;
        for (int r = 0; r < T; r++) {
            if ((q->seqs[r].n_rows == 0 &&
                 kv_seq_init(&q->seqs[r], s->lay[r], NULL, 0) != 0) ||
                kv_seq_fork(&q->seqs[r], &leader->seqs[r], s->lay[r],
                            &s->pools[r], NULL, NULL, 0) != 0 ||
                /* With heads kept (decode-time compression; gvote takes
                 * no samples) each head starts as its source's will. */
                (s->cfg.per_head &&
                 kv_seq_fork_heads(&q->seqs[r], &leader->seqs[r], s->lay[r],
                                   NULL, 0) != 0)) {
                rt_sched__release_pages(s, q);
                return TG_ENOMEM;
            }
        }
        int32_t slot = 0;
        while (s->slot_used[slot])
            slot++;
        s->slot_used[slot] = 1;
        q->slot = slot;
        q->fresh = 1;
        memset(q->sent, 0, (size_t)T * (size_t)s->rows * sizeof(int32_t));
        memset(q->cut, 0, (size_t)T * (size_t)s->rows);
        q->state = RT_SCHED_PREFILLING;
        q->fork_pending = 1;
        s->n_attached--;
        s->running[s->n_running++] = q;
        if (!q->admitted) {
            q->admitted = 1;
            q->cached = start;
        }
    }
    return 0;
}

int rt_sched__sample_attach(struct rt_sched *s, struct rt_sched_req *leader,
                            struct rt_sched_req *q)
{
    if (tg_grow_i32((void **)&leader->sibs, &leader->cap_sibs,
                    leader->n_sibs + 1, sizeof(leader->sibs[0])) != 0)
        return TG_ENOMEM;
    leader->sibs[leader->n_sibs++] = q;
    q->leader = leader;
    q->is_sample = 1;
    s->n_attached++;
    return 0;
}

struct rt_sched_req *rt_sched__group_requeue(struct rt_sched *s,
                                             struct rt_sched_req *req)
{
    /* Its samples hold only shares of the leader's prompt, which a
     * recompute prefills again; they wait attached once more. */
    if (req->fork_pending)
        req = req->leader;
    for (int32_t i = 0; i < req->n_sibs; i++) {
        struct rt_sched_req *q = req->sibs[i];
        TG_ASSERT(q->fork_pending);
        rt_sched__running_remove(s, q);
        rt_sched__release_pages(s, q);
        q->state = RT_SCHED_WAITING;
        q->fork_pending = 0;
        q->fresh = 0;
        s->n_attached++;
    }
    return req;
}

int rt_sched__forks_admit_room(struct rt_sched *s, struct rt_step *out,
                               struct rt_sched_req *req, int64_t ids_one)
{
    if (req->n_sibs == 0)
        return 0;
    /* The forks run in this step: room for their entries (pages not yet
     * taken count as the leader's whole prompt, a bound). */
    const int T = s->cfg.n_ranks;
    int64_t ids = (int64_t)req->n_sibs * ids_one;
    int64_t recs = (int64_t)(req->n_sibs + 1) * T * s->rows;
    for (int32_t i = 0; i < req->n_sibs; i++)
        if (rt_sched__token_room(req->sibs[i]) != 0)
            return TG_ENOMEM;
    if (tg_grow_i64((void **)&out->deltas, &out->cap_deltas,
                    out->n_deltas + recs, sizeof(struct rt_step_delta)) != 0 ||
        tg_grow_i64((void **)&out->delta_ids, &out->cap_ids,
                    out->n_ids + ids + ids_one, sizeof(int32_t)) != 0)
        return TG_ENOMEM;
    return 0;
}
