/*
 * rt_server_internal.h — what the core's rt_server*.c files share and
 * nothing outside router/core/ calls: the server's own steps (wake the
 * step loop, the drain check, the seed stream), the pool jobs' drain cut,
 * and the parts of a request's life kept in rt_server_grammar.c,
 * rt_server_req.c, rt_server_tier.c and rt_server_trig.c. The public
 * interface is rt_server.h. Loop thread unless said otherwise.
 */
#ifndef RT_SERVER_INTERNAL_H
#define RT_SERVER_INTERNAL_H

#include "router/core/rt_server.h"

/* Idle prepared grammars the router keeps pinned on rank 0 for the next
 * request with the same spec (rt_gprep.h `keep`): a working set of
 * schemas used over and over is prepared once, and never waits behind
 * another schema's compile. Each holds one compiled grammar on the
 * worker (typically tens of KB to a few MB). */
#define RT_SERVER_GRAMMAR_KEEP 16

/* Cancels every job still queued (the drain's cut). Loop thread. */
void rt_server__cancel_jobs(struct rt_server *s);

/* Called after a job ended: a drain waiting for it may stop. */
void rt_server__jobs_changed(struct rt_server *s);

/* Internal to rt_server*.c: schedule a step at the next loop turn; stop a
 * drain whose last request just ended; the next value of a splitmix64
 * stream (Steele, Lea and Flood 2014) at *x. Loop thread. */
void rt_server__wake(struct rt_server *s);
void rt_server__drain_check(struct rt_server *s);
uint64_t rt_server__splitmix(uint64_t *x);

/* rt_server_trig.c: with --decode-compress trig, checks the start-up
 * conditions (CPU backend, trig statistics in the profile or
 * --trig-stats, option values) and builds every rank's caps for the
 * scheduler's admission bound (common/kv/kv_trig.h, the workers' own
 * rule). Returns 0 or TG_EINVAL / TG_EUNSUPPORTED / TG_ENOMEM with the
 * reason. rt_server__trig_free is safe on a server without caps. */
int rt_server__trig_init(struct rt_server *s, char *err, size_t errlen);
void rt_server__trig_free(struct rt_server *s);

/* rt_server_grammar.c: structured outputs' grammars, prepared on rank 0
 * before a constrained request is submitted (§4.11).
 *   grammar_hold   called by the submission once the request is set up:
 *                  0 when it may go to the scheduler now (no constraint,
 *                  its grammar ready, or a sample holding its leader's),
 *                  TG_EAGAIN when it waits (r->gwait; its prepare sent),
 *                  else the refusal in *e (429 grammar_queue_full at
 *                  --max-grammar-compiles, 429 queue_full past
 *                  --max-queued waiting requests, 500).
 *   grammar_put    r ends: gives its reference back (rt_req_drop).
 *   grammar_flush  sends rank 0 what is to prepare or release.
 *   on_grammar     the link's callback for rank 0's reports: the waiting
 *                  requests of each answered prepare are submitted, oldest
 *                  first, or fail (400 with the compile's reason; 429 when
 *                  rank 0's queue was full).
 *   grammar_lost   rank 0 died: its grammars are gone. Requests that wait
 *                  for theirs keep waiting (prepared again on the next
 *                  group); queued ones that generated nothing yet go back
 *                  to waiting (taken out of the scheduler); any other
 *                  constrained request left in the scheduler fails like
 *                  the running ones ("a worker died").
 *   grammar_gauges refreshes the metrics.
 * Loop thread. */
int rt_server__grammar_hold(struct rt_req *r, struct rt_request_error *e);
void rt_server__grammar_put(struct rt_req *r);
void rt_server__grammar_flush(struct rt_server *s);
void rt_server__on_grammar(void *ud, const struct rt_link_gready *rd, size_t n);
void rt_server__grammar_lost(struct rt_server *s);
void rt_server__grammar_gauges(struct rt_server *s);

/* rt_server_req.c: hands r (set up by the submission, its grammar ready
 * if it has one) to the scheduler. Returns 0 (r->submitted set) or the
 * refusal in *e. */
int rt_server__sched_submit(struct rt_req *r, struct rt_request_error *e);

/* rt_server.c: r fails with `why` (a final error delivery; out of the
 * scheduler first when it is in it); freed unless a step or a delivery
 * holds it. */
void rt_server__fail(struct rt_req *r, const char *why);

/* rt_server_tier.c: the host tier of stored conversations (§4.10).
 * tier_send hands the ops the last plan made to every rank (after each
 * plan); on_tier is the link's callback for a rank's reports (each op
 * ends in the scheduler once every rank reported it; restore latency
 * observed); tier_gauges refreshes the tier's metrics from the
 * scheduler. Loop thread, with the scheduler ready. */
void rt_server__tier_send(struct rt_server *s);
void rt_server__on_tier(void *ud, int rank,
                        const struct rt_link_tier_done *done, size_t n);
void rt_server__tier_gauges(struct rt_server *s);

#endif /* RT_SERVER_INTERNAL_H */
