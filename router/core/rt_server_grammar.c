/* rt_server_grammar.c — structured outputs' grammars prepared on worker
 * rank 0 before a constrained request enters the scheduler (DESIGN.md
 * §4.11 "Serving"; see rt_server.h and rt_gprep.h). A request whose
 * grammar is not ready waits here, never in a step: its first plan entry
 * comes only after rank 0 reported the grammar ready, so a first-seen
 * schema's compile never stalls the batch. Loop thread. */
#include "router/core/rt_server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/base/tg_log.h"

void rt_server__grammar_gauges(struct rt_server *s)
{
    struct rt_gprep_stats st;
    rt_gpreps_stats(&s->gpreps, &st);
    struct rt_metrics_tangram *m = &s->metrics;
    rt_metrics_gauge_set(m->grammar_requests_waiting, (double)s->n_gwait);
    rt_metrics_gauge_set(m->grammar_prepares_pending, (double)st.pending);
    /* The table keeps monotonic totals; counters follow them. */
    double d = (double)st.prepares -
               rt_metrics_series_value(m->grammar_prepares_total);
    if (d > 0)
        rt_metrics_counter_add(m->grammar_prepares_total, d);
    d = (double)st.failed -
        rt_metrics_series_value(m->grammar_prepare_failures_total);
    if (d > 0)
        rt_metrics_counter_add(m->grammar_prepare_failures_total, d);
    d = (double)st.refused -
        rt_metrics_series_value(m->grammar_prepares_refused_total);
    if (d > 0)
        rt_metrics_counter_add(m->grammar_prepares_refused_total, d);
}

void rt_server__grammar_flush(struct rt_server *s)
{
    if (s->stopping || !rt_link_ready(&s->link))
        return; /* sent once the group is ready (on_ready) */
    const struct rt_link_gprep *prep;
    const uint64_t *rel;
    int32_t n_rel;
    int32_t n = rt_gpreps_take(&s->gpreps, &prep, &rel, &n_rel);
    if (n < 0) {
        log_err("structured outputs: no memory to list the grammars to "
                "prepare; retried at the next flush");
        return;
    }
    if (n == 0 && n_rel == 0)
        return;
    char err[256];
    int rc = rt_link_send_grammar(&s->link, prep, (size_t)n, rel, (size_t)n_rel,
                                  err, sizeof(err));
    if (rc != 0) {
        log_warn("structured outputs: grammar command not sent (%s); "
                 "retried at the next flush",
                 err);
        return;
    }
    rt_gpreps_sent(&s->gpreps);
    if (n > 0)
        log_debug("structured outputs: %d grammars to prepare, %d released",
                  (int)n, (int)n_rel);
}

int rt_server__grammar_hold(struct rt_req *r, struct rt_request_error *e)
{
    struct rt_server *s = r->srv;
    if (r->q.grammar == NULL || r->core->gprep != NULL)
        return 0; /* none, or a sample holding its leader's */
    struct rt_gprep *p = NULL;
    int rc = rt_gpreps_acquire(&s->gpreps, r->q.grammar, &p);
    if (rc == 0) {
        r->core->gprep = p; /* ready on rank 0: straight to the scheduler */
        return 0;
    }
    if (rc == TG_EBUSY) {
        rt_server__grammar_gauges(s);
        rt_request_error_set(e, RT_REQ_ERR_BUSY, "grammar_queue_full", NULL,
                             "too many output constraints are being "
                             "compiled (--max-grammar-compiles %lld); "
                             "retry later",
                             (long long)s->opts->max_grammar_compiles);
        return rc;
    }
    if (rc != TG_EAGAIN) {
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return rc;
    }
    /* It will wait: bounded with the scheduler's queue, and only for a
     * front end that takes its outcome later. */
    struct rt_sched_stats st;
    rt_sched_get_stats(&s->sched, &st);
    if (r->on_submitted == NULL ||
        (int64_t)s->n_gwait + st.waiting >= s->opts->max_queued) {
        rt_gpreps_put(&s->gpreps, p);
        rt_server__grammar_flush(s);
        if (r->on_submitted == NULL) {
            rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                                 "a constrained request needs an "
                                 "asynchronous submission");
            return TG_EINVAL;
        }
        rt_request_error_set(
            e, RT_REQ_ERR_BUSY, "queue_full", NULL,
            "too many requests are waiting (--max-queued %lld)",
            (long long)s->opts->max_queued);
        return TG_EBUSY;
    }
    r->core->gprep = p;
    r->core->gwait = 1;
    s->n_gwait++;
    rt_server__grammar_flush(s);
    rt_server__grammar_gauges(s);
    return TG_EAGAIN;
}

void rt_server__grammar_put(struct rt_req *r)
{
    struct rt_server *s = r->srv;
    if (r->core->gprep == NULL)
        return;
    if (r->core->gwait) {
        r->core->gwait = 0;
        s->n_gwait--;
    }
    rt_gpreps_put(&s->gpreps, r->core->gprep);
    r->core->gprep = NULL;
    rt_server__grammar_flush(s);
    rt_server__grammar_gauges(s);
}

/* The oldest request waiting for p, or NULL. */
static struct rt_req *oldest_waiter(struct rt_server *s,
                                    const struct rt_gprep *p)
{
    struct rt_req *best = NULL;
    for (struct rt_req *r = s->reqs; r != NULL; r = r->core->next)
        if (r->core->gwait && !r->core->done && r->core->gprep == p &&
            (best == NULL || r->id < best->id))
            best = r;
    return best;
}

/* p was answered: each request waiting for it goes to the scheduler
 * (READY), oldest first, or fails. A request's outcome goes to its
 * front end's on_submitted, which may free it or start others (the
 * samples of n > 1, submitted right after their leader): so the next
 * waiter is looked up again each time. */
static void answered(struct rt_server *s, struct rt_gprep *p)
{
    rt_gpreps_ref(p); /* p outlives its waiters' puts */
    struct rt_req *r;
    while ((r = oldest_waiter(s, p)) != NULL) {
        r->core->gwait = 0;
        s->n_gwait--;
        struct rt_request_error e;
        int rc;
        if (p->state == RT_GPREP_READY) {
            rc = rt_server__sched_submit(r, &e);
        } else if (p->busy) {
            rc = TG_EBUSY;
            rt_request_error_set(&e, RT_REQ_ERR_BUSY, "grammar_queue_full",
                                 NULL, "%s", p->error);
        } else {
            rc = TG_EINVAL;
            rt_request_error_set(&e, RT_REQ_ERR_INVALID, "invalid_schema",
                                 r->q.grammar_param != NULL ? r->q.grammar_param
                                                            : "response_format",
                                 "%s", p->error);
        }
        if (!r->core->resubmit) {
            r->on_submitted(r, rc, &e);
        } else {
            r->core->resubmit = 0;
            if (rc != 0)
                rt_server__fail(r, e.message);
        }
    }
    rt_gpreps_put(&s->gpreps, p);
}

void rt_server__on_grammar(void *ud, const struct rt_link_gready *rd, size_t n)
{
    struct rt_server *s = ud;
    for (size_t i = 0; i < n; i++) {
        struct rt_gprep *p = rt_gpreps_answer(&s->gpreps, rd[i].id, rd[i].ok,
                                              rd[i].busy, rd[i].error);
        if (p == NULL)
            continue; /* released meanwhile, or from a lost worker */
        if (!rd[i].ok)
            log_info("output constraint %llu failed on rank 0: %s",
                     (unsigned long long)rd[i].id, rd[i].error);
        answered(s, p);
    }
    rt_server__grammar_flush(s);
    rt_server__grammar_gauges(s);
    rt_server__wake(s);
}

/* The request with id `id`, or NULL. */
static struct rt_req *find(struct rt_server *s, uint64_t id)
{
    for (struct rt_req *r = s->reqs; r != NULL; r = r->core->next)
        if (r->id == id)
            return r;
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void rt_server__grammar_lost(struct rt_server *s)
{
    rt_gpreps_lost(&s->gpreps);
    /* The constrained requests in the scheduler name grammars rank 0 no
     * longer holds. Ids first: failing one may end others (one failed
     * choice of n fails its group). */
    size_t n = 0, cap = 0;
    uint64_t *ids = NULL;
    for (struct rt_req *r = s->reqs; r != NULL; r = r->core->next) {
        if (r->core->gprep == NULL || !r->core->submitted || r->core->done ||
            r->core->holding)
            continue;
        if (TG_GROW(ids, &cap, n + 1) != 0)
            break; /* the rest fail at their plan entry, alone */
        ids[n++] = r->id;
    }
    qsort(ids, n, sizeof(*ids), cmp_u64); /* leaders before samples */
    int pulled = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        struct rt_req *r = find(s, ids[i]);
        if (r == NULL || r->core->done || r->core->holding ||
            !r->core->submitted)
            continue;
        struct rt_sched_req_info info;
        int queued = s->sched_ready &&
                     rt_sched_req_info(&s->sched, r->id, &info) == 0 &&
                     info.state == RT_SCHED_WAITING &&
                     info.completion_tokens == 0 && r->n_out == 0;
        struct rt_req *lead = r->core->fork_of != 0 ? find(s, r->core->fork_of)
                                                    : NULL;
        if (r->core->fork_of != 0) /* a sample goes back with its leader only */
            queued = lead != NULL && lead->core->gwait &&
                     lead->core->gprep == r->core->gprep;
        if (!queued) {
            rt_server__fail(r, "a worker died");
            failed++;
            continue;
        }
        /* Nothing generated yet: it waits for its grammar again and is
         * submitted anew once the next group has it (a leader's samples
         * leave the scheduler with it and return right after it). */
        rt_sched_abort(&s->sched, r->id);
        r->core->submitted = 0;
        r->core->gwait = 1;
        r->core->resubmit = 1;
        s->n_gwait++;
        pulled++;
    }
    free(ids);
    if (pulled + failed > 0)
        log_warn("structured outputs: worker rank 0 lost its grammars: %d "
                 "queued requests wait for theirs again, %d failed",
                 pulled, failed);
    rt_server__grammar_gauges(s);
}
