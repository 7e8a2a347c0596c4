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

#include "common/chat/ct_template.h"
#include "common/kv/kv_seq.h"
#include "common/model/mc_model_config.h"
#include "common/profile/pf_profile.h"
#include "router/core/rt_gprep.h"
#include "router/core/rt_metrics_tier.h"
#include "router/core/rt_sched.h"
#include "router/core/rt_server.h"
#include "router/core/rt_text.h"
#include "router/link/rt_link.h"

/* The core's state of a request (struct rt_req.core), allocated with it
 * by rt_req_new. */
struct rt_req_core {
    int32_t *prompt; /* (n_prompt) token ids, owned */
    /* with q.opts.prompt_lp: the prompt's log-probabilities
     * (rt_server_plp.c), owned; NULL otherwise */
    struct rt_prompt_lps *plp;
    struct rt_text text;
    int32_t *out_ids;                    /* (n_out) generated ids */
    float *out_lps;                      /* (n_out) their logprobs */
    int32_t *out_top_ids;                /* (n_out, n_top) */
    float *out_top_lps;                  /* (n_out, n_top) */
    struct rt_top_logprob *top_scratch;  /* (n_top) */
    struct rt_token_logprob *lp_scratch; /* (max_tokens) */
    int32_t cap_out, n_top;
    int32_t lp_sent; /* tokens whose logprobs were delivered */
    double t_arrival, t_first, t_last; /* seconds, loop clock */
    int submitted;                     /* the scheduler knows it */
    int done;                          /* finished; freed after the step */
    int in_step;                       /* part of the step in flight */
    /* inside its sink: a cancel from there (a client gone while writing)
     * must not free it under the sink's feet */
    int in_deliver;
    /* finished, its last delivery held for a client that is not reading
     * (blocked); freed once delivered or cancelled */
    int holding;
    int held_fin;         /* enum rt_finish of that delivery */
    char held_error[160]; /* its error text, "" for none */
    int no_hold;          /* deliver even when blocked (drain cut) */
    /* its encode job while one runs; a request cancelled meanwhile is freed
     * when the job ends */
    struct rt_encode_job *job;
    /* a parallel sample other than choice 0: the id of the request it
     * shares the prompt with; 0 otherwise */
    uint64_t fork_of;
    /* Structured outputs (DESIGN.md §4.11, rt_server_grammar.c): the
     * grammar prepared on worker rank 0 that the request holds (one
     * reference, rt_gprep.h; a sample shares its leader's), or NULL.
     * gwait: it waits, outside the scheduler, for that grammar to be
     * ready (rt_req_submit returned TG_EAGAIN). resubmit: it waits again
     * because a worker restart lost the grammar while it was queued; the
     * front end knows it was submitted, so the outcome goes to its sink,
     * not to on_submitted. */
    struct rt_gprep *gprep;
    int gwait;
    int resubmit;
    int counted;         /* its prompt tokens were counted */
    struct rt_req *next; /* in the server's list */
};

/* One allocation of rt_req_new: the shared part and the core's. */
struct rt_req_full {
    struct rt_req pub;
    struct rt_req_core core;
};

struct rt_server {
    uv_loop_t *loop;
    /* the router's rows of the serving table (tg_serve_opts_table
     * (TG_SERVE_ROUTER)); not owned */
    const struct tg_serve_opts *opts;
    /* what the front ends read (rt_server_info); info.model_name points
     * into model_name */
    struct rt_server_info info;
    char model_name[256];
    struct mc_model_config mc;
    struct pf_profile profile; /* the whole model's (file or full KV) */
    /* rank 0's layout: L, G/T, H_p, d, P and C are those of every rank */
    struct kv_layout layout;
    /* (T) rank r's own layout: the group budgets of pf_profile_rank(r) */
    struct kv_layout *rank_layouts;
    const struct kv_layout **rank_layout_ptrs; /* (T) into rank_layouts */
    /* (T) rank r's decode caps with --decode-compress trig, else NULL */
    struct kv_trig *rank_trig;
    const struct kv_trig **rank_trig_ptrs; /* (T) into rank_trig */
    struct tok_tokenizer tok;
    struct ct_template tmpl; /* the model's chat template */
    int have_tmpl;
    char tmpl_error[512];         /* why chat is disabled, when it is */
    struct rt_server_hooks hooks; /* the app's (rt_server_set_hooks) */
    struct rt_link link;
    struct rt_sched sched;
    int sched_ready; /* initialized from the workers' pools */
    struct rt_step step;
    int step_in_flight;
    /* rt_server_now() when the step in flight began to be planned */
    double step_t0;
    double step_plan_s; /* its planning and sending, seconds */
    struct rt_metrics_tangram metrics;
    struct rt_metrics_tier tier_metrics; /* in metrics.reg (§4.10) */
    struct rt_req *reqs;                 /* live requests */
    int n_reqs;
    uint64_t next_id;
    uint64_t rng; /* seeds for requests without one */
    /* random per process: keys the multi-turn cache scopes (rt_server.c),
     * so a scope cannot be computed from outside */
    uint64_t scope_key;
    int draining;
    int stopping;
    uv_signal_t sig_term, sig_int;
    uv_timer_t drain_timer;
    uv_timer_t tick; /* watchdog pings, drain checks */
    uv_idle_t pump;  /* runs the step loop outside callbacks */
    /* end-of-file on the notify pipe: tangramd is gone, so drain and exit */
    uv_poll_t notify_poll;
    int notify_watch;
    int pump_on;
    int exit_code;
    struct tg_list jobs;     /* pool jobs queued or running */
    int n_jobs;              /* their count: a drain waits for them */
    struct rt_gpreps gpreps; /* grammars prepared on rank 0 (§4.11) */
    int32_t n_gwait;         /* requests with gwait set */
    /* the request memory budget the front ends charge large requests to
     * until their prompt is tokenized (rt_reqmem.h); the app's
     * (rt_server_set_reqmem); NULL = none */
    struct rt_reqmem *reqmem;
    /* the responses held for later turns (rt_respstore.h): the app's
     * (rt_server_set_respstore), the front ends use it; NULL = none (a
     * server made for conversions alone) */
    struct rt_respstore *respstore;
};

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

/* rt_server_plp.c: the prompt log-probabilities of requests that ask
 * (rt_request.h struct rt_prompt_lps).
 *   plp_alloc  at submission: r->core->plp for its n_prompt tokens (0, or
 *              TG_ENOMEM with *e filled); no-op without prompt_lp.
 *   plp_take   a chunk's values from rank 0 (rt_link.h): positions not
 *              yet filled and inside the prompt are copied (a restart
 *              after preemption computes some again: the first values
 *              stand).
 *   plp_free   frees r->core->plp. */
int rt_server__plp_alloc(struct rt_req *r, struct rt_request_error *e);
void rt_server__plp_take(struct rt_req *r, const struct rt_link_plp *p);
void rt_server__plp_free(struct rt_req *r);

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
