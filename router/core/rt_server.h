/*
 * rt_server.h — the router's core: on one libuv loop thread, the requests,
 * tokenization, the budget-reserving scheduler, the link to the workers and
 * the metrics (DESIGN.md §2). Which network servers exist, their listeners
 * and connections are the app's (router/app/rt_app.h): the core knows them
 * only through the hooks the app registers (struct rt_server_hooks).
 *
 * A request's life: a front end parses it into a struct rt_req, the server
 * tokenizes it and submits it to the scheduler; each step the scheduler
 * plans, the link sends the plan to every rank, rank 0's sampled tokens come
 * back, the server turns them into text (stop strings, UTF-8 safe) and hands
 * deltas to the request's sink until it finishes. A client that goes away
 * aborts its request and its pages are freed at once. A dead worker fails
 * every running request with an error; admission resumes when all ranks are
 * back. SIGTERM drains: new requests get 503, running ones finish within
 * --shutdown-timeout, then the process exits.
 *
 * Everything here runs on the loop thread.
 */
#ifndef RT_SERVER_H
#define RT_SERVER_H

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "common/chat/ct_template.h"
#include "common/kv/kv_seq.h"
#include "common/model/mc_model_config.h"
#include "common/profile/pf_profile.h"
#include "common/base/tg_list.h"
#include "common/base/tg_serve_opts.h"
#include "common/tok/tok_tokenizer.h"
#include "router/link/rt_link.h"
#include "router/core/rt_gprep.h"
#include "router/core/rt_metrics_tangram.h"
#include "router/core/rt_metrics_tier.h"
#include "router/core/rt_reqmem.h"
#include "router/core/rt_respstore.h"
#include "router/core/rt_request.h"
#include "router/core/rt_sched.h"
#include "router/core/rt_text.h"

struct rt_req;
struct rt_server;
struct rt_encode_job;

/* What the app (router/app/) does for the core at the moments the core
 * decides them. Called on the loop thread with `ud`; either may be NULL.
 *   close   the drain ended (or a second signal cut it): stop accepting
 *           and close every listener and connection; the handles finish
 *           closing as the loop runs on.
 *   scrape  a metrics scrape is about to render the registry: copy the
 *           counters kept outside the core (connections, body memory)
 *           into s->metrics. */
struct rt_server_hooks {
    void (*close)(void *ud);
    void (*scrape)(void *ud);
    void *ud;
};

/* Where a request's output goes (HTTP/SSE or gRPC). `deliver` is called
 * after every step that produced output for the request, and a last time
 * with fin != RT_FINISH_NONE; the server frees the request after that last
 * call. `text` is the newly released text (len bytes, may be 0); lps are
 * the tokens sampled since the last call (n_lp). `release` (optional) is
 * called once when the request is freed, whatever ended it, for the front
 * end to free its state of the request (rt_req.fe). */
struct rt_sink {
    void (*deliver)(struct rt_req *r, const char *text, size_t len,
                    const struct rt_token_logprob *lps, size_t n_lp,
                    enum rt_finish fin, const char *error);
    void (*release)(struct rt_req *r);
};

/* Most tokens (with their logprobs) and text bytes one delivery carries
 * when output piled up behind a blocked client (rt_req.blocked). */
#define RT_DELIVER_MAX_TOKENS 64
#define RT_DELIVER_MAX_TEXT 65536

struct rt_req {
    uint64_t id;
    struct rt_server *srv;
    const struct rt_sink *sink;
    void *client;               /* the front end's handle */
    void *fe;                   /* the front end's state of this request
                                   (what it needs to format the answer),
                                   freed by sink->release */
    /* Optional backpressure, set by the front end: nonzero while the
     * client takes no more output (its send queue is full). The server
     * then keeps the output in the request (the token arrays are sized for
     * max_tokens at submit, so nothing grows), a final delivery that falls
     * due included, and the front end calls rt_req_resume() once the
     * client drains. Output that piled up goes out in deliveries of at
     * most RT_DELIVER_MAX_TOKENS tokens and RT_DELIVER_MAX_TEXT bytes,
     * asking `blocked` again between them. NULL: never blocked. */
    int (*blocked)(struct rt_req *r);
    struct rt_request q;                      /* what to generate (owned) */
    char id_str[RT_REQUEST_MAX_ID_BYTES + 1]; /* the id the answer
                                   carries, set by the front end before
                                   rt_req_submit ("cmpl-...", a gRPC
                                   client's whole request_id) */
    int64_t created;                          /* unix seconds */
    int32_t *prompt;            /* (n_prompt) token ids, owned */
    int64_t n_prompt;
    struct rt_text text;
    int32_t *out_ids;           /* (n_out) generated ids */
    float *out_lps;             /* (n_out) their logprobs */
    int32_t *out_top_ids;       /* (n_out, n_top) */
    float *out_top_lps;         /* (n_out, n_top) */
    struct rt_top_logprob *top_scratch; /* (n_top) */
    struct rt_token_logprob *lp_scratch; /* (max_tokens) */
    int32_t n_out, cap_out, n_top;
    int32_t lp_sent;            /* tokens whose logprobs were delivered */
    int64_t cached_tokens;      /* prompt tokens reused from stored KV */
    double t_arrival, t_first, t_last; /* seconds, loop clock */
    int submitted;              /* the scheduler knows it */
    int done;                   /* finished; freed after the step */
    int in_step;                /* part of the step in flight */
    int in_deliver;             /* inside its sink: a cancel from there
                                   (a client gone while writing) must not
                                   free it under the sink's feet */
    int holding;                /* finished, its last delivery held for a
                                   client that is not reading (blocked);
                                   freed once delivered or cancelled */
    int held_fin;               /* enum rt_finish of that delivery */
    char held_error[160];       /* its error text, "" for none */
    int no_hold;                /* deliver even when blocked (drain cut) */
    /* Set by the front end before rt_req_submit to have the prompt
     * rendered and tokenized off the loop thread: rt_req_submit then
     * returns TG_EAGAIN and this is called once, on the loop thread, with
     * the outcome of the submission (0, or a code with *e filled: the
     * front end then reports e and calls rt_req_drop). It is not called
     * for a request cancelled or aborted meanwhile. NULL: rt_req_submit
     * tokenizes on the calling thread. */
    void (*on_submitted)(struct rt_req *r, int rc, struct rt_request_error *e);
    struct rt_encode_job *job; /* its encode job while one runs; a request
                                   cancelled meanwhile is freed when the
                                   job ends */
    /* Parallel samples (OpenAI n > 1, docs/API.md "n"): choice `choice`
     * of the client's request; a sample other than choice 0 names the
     * request it shares the prompt with (fork_of, its id) and shares its
     * client, sink, id_str and created time. `group` is the front end's
     * (opaque here). */
    int32_t choice;
    uint64_t fork_of;
    void *group;
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
    int counted;                /* its prompt tokens were counted */
    struct rt_req *next;        /* in the server's list */
};

struct rt_server {
    uv_loop_t *loop;
    const struct tg_serve_opts *opts; /* the router's rows of the serving
                                   table (tg_serve_opts_table
                                   (TG_SERVE_ROUTER)); not owned */
    char model_name[256];
    int32_t max_model_len;
    struct mc_model_config mc;
    struct pf_profile profile;  /* the whole model's (file or full KV) */
    struct kv_layout layout;    /* rank 0's layout: L, G/T, H_p, d, P and
                                   C are those of every rank */
    struct kv_layout *rank_layouts; /* (T) rank r's own layout: the group
                                   budgets of pf_profile_rank(r) */
    const struct kv_layout **rank_layout_ptrs; /* (T) into rank_layouts */
    struct kv_trig *rank_trig;  /* (T) rank r's decode caps with
                                   --decode-compress trig, else NULL */
    const struct kv_trig **rank_trig_ptrs; /* (T) into rank_trig */
    struct tok_tokenizer tok;
    struct ct_template tmpl;    /* the model's chat template */
    int have_tmpl;
    char tmpl_error[512];       /* why chat is disabled, when it is */
    struct rt_server_hooks hooks; /* the app's (rt_server_set_hooks) */
    struct rt_link link;
    struct rt_sched sched;
    int sched_ready;            /* initialized from the workers' pools */
    struct rt_step step;
    int step_in_flight;
    double step_t0;               /* rt_server_now() when the step in flight
                                     began to be planned */
    double step_plan_s;           /* its planning and sending, seconds */
    struct rt_metrics_tangram metrics;
    struct rt_metrics_tier tier_metrics; /* in metrics.reg (§4.10) */
    struct rt_req *reqs;        /* live requests */
    int n_reqs;
    uint64_t next_id;
    uint64_t rng;               /* seeds for requests without one */
    uint64_t scope_key;         /* random per process: keys the multi-turn
                                   cache scopes (rt_server.c), so a scope
                                   cannot be computed from outside */
    int draining;
    int stopping;
    uv_signal_t sig_term, sig_int;
    uv_timer_t drain_timer;
    uv_timer_t tick;            /* watchdog pings, drain checks */
    uv_idle_t pump;             /* runs the step loop outside callbacks */
    uv_poll_t notify_poll;      /* end-of-file on the notify pipe: tangramd
                                   is gone, so drain and exit */
    int notify_watch;
    int pump_on;
    int exit_code;
    int64_t started;            /* unix seconds */
    struct tg_list jobs;        /* pool jobs queued or running */
    int n_jobs;                 /* their count: a drain waits for them */
    struct rt_gpreps gpreps;    /* grammars prepared on rank 0 (§4.11) */
    int32_t n_gwait;            /* requests with gwait set */
    struct rt_reqmem *reqmem;   /* the request memory budget the front ends
                                   charge large requests to until their
                                   prompt is tokenized (rt_reqmem.h); the
                                   app's, set before they register; NULL =
                                   none */
    struct rt_respstore *respstore; /* the responses held for later turns
                                   (rt_respstore.h): the app's, the front
                                   ends use it; NULL = none (a server made
                                   for conversions alone) */
};

/* Idle prepared grammars the router keeps pinned on rank 0 for the next
 * request with the same spec (rt_gprep.h `keep`): a working set of
 * schemas used over and over is prepared once, and never waits behind
 * another schema's compile. Each holds one compiled grammar on the
 * worker (typically tens of KB to a few MB). */
#define RT_SERVER_GRAMMAR_KEEP 16

/* Work of one request on libuv's thread pool (rt_server_encode.c): `run`
 * on a pool thread, then `done` exactly once on the loop thread, with
 * `ran` 0 when the job was cancelled before `run` started. The owner keeps
 * the job (and what `run` reads) alive until `done`, and frees it there or
 * after. Jobs in flight are listed on the server: a drain waits for them,
 * and tangram_tokenize_jobs_in_flight counts them. */
struct rt_pool_job {
    uv_work_t work;             /* internal */
    struct rt_server *srv;      /* set by rt_pool_job_start */
    void (*run)(struct rt_pool_job *j);           /* pool thread */
    void (*done)(struct rt_pool_job *j, int ran); /* loop thread, once */
    atomic_int cancelled;       /* internal */
    int skipped;                /* internal: run was not called */
    struct tg_list_node link;   /* internal: in s->jobs */
};

/* Queues `j` (run and done set) on the thread pool. Returns 0, or
 * TG_EINTERNAL with the reason in err (then `done` is never called). Loop
 * thread. */
int rt_pool_job_start(struct rt_server *s, struct rt_pool_job *j, char *err,
                      size_t errlen);

/* The owner gives up on `j`: a job still waiting for a thread is skipped
 * (done with ran 0), a running one finishes; `done` follows either way.
 * Loop thread. */
void rt_pool_job_cancel(struct rt_pool_job *j);

/* One prompt rendered and tokenized on the thread pool (an rt_pool_job).
 * The owner fills the inputs, starts it, and gets `done` exactly once on
 * the loop thread (also after a cancel); it keeps the inputs alive and
 * unmodified until then and frees the job (and ids) afterwards. */
struct rt_encode_job {
    struct rt_pool_job pool;    /* internal (first) */
    struct rt_server *srv;      /* set by rt_encode_job_start / _run */
    /* inputs */
    int is_chat;
    const char *text;           /* !is_chat: len bytes, borrowed */
    size_t len;
    json_t *messages;           /* is_chat: JSON array, borrowed, or owned
                                   with free_messages */
    int free_messages;          /* the job drops its reference to messages
                                   once rendered, on the pool thread (a
                                   large chat's parsed form is freed off
                                   the loop) */
    json_t *tools;              /* is_chat: JSON array or NULL, borrowed */
    struct rt_chat_opts chat;   /* is_chat: a copy; kwargs borrowed */
    int add_special;
    size_t max_ids;             /* stop once the prompt has more ids than
                                   this (TG_ERANGE, tok_encode_max);
                                   SIZE_MAX: no bound */
    void (*done)(struct rt_encode_job *j); /* loop thread, once */
    void *owner;
    /* outputs, valid in done */
    struct tok_ids ids;         /* owned by the job's owner from done on */
    int rc;                     /* 0, TG_ECANCELED, or the encode error */
    struct rt_request_error e;  /* rc != 0: the error to report */
};

/* Prompts of at most this many bytes (text, or the strings of a chat's
 * messages, tools and template arguments; a template may still expand
 * them, within its limits) are encoded on the loop thread: it takes
 * microseconds, and they never queue behind megabyte prompts on the
 * pool. */
#define RT_ENCODE_INLINE_BYTES (16u * 1024u)

/* Returns 1 when j's input is small enough to encode inline. */
int rt_encode_job_small(const struct rt_encode_job *j);

/* Encodes j on the calling thread (the owner then calls its own done
 * logic; j->done is not called). */
void rt_encode_job_run(struct rt_server *s, struct rt_encode_job *j);

/* Queues `j` on the thread pool. Returns 0, or TG_EINTERNAL with j->e set
 * (then `done` is never called). Loop thread. */
int rt_encode_job_start(struct rt_server *s, struct rt_encode_job *j);

/* The owner gives up on `j`: a job still waiting for a thread is skipped,
 * a running one finishes; either way `done` follows with j->rc ==
 * TG_ECANCELED when it never ran. Loop thread. */
void rt_encode_job_cancel(struct rt_encode_job *j);

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

/* Start-up is three steps, run by the app (router/app/rt_app.h):
 *   rt_server_init    loads the model's config, tokenizer, chat template
 *                     and profile and binds the worker link;
 *   the app           creates its network servers, registers the front
 *                     ends on them and its hooks here, binds the
 *                     listeners;
 *   rt_server_start   starts serving: timers, SIGTERM/SIGINT, the notify
 *                     pipe.
 * rt_server_init returns 0 or an error with detail in err; on failure
 * everything is released, running `loop` until the handles opened so far
 * are closed (call it before anything else uses the loop), and
 * rt_server_free is still safe. `o` must outlive the server. */
int rt_server_init(struct rt_server *s, uv_loop_t *loop,
                   const struct tg_serve_opts *o, char *err, size_t errlen);

/* Registers the app's hooks (copied); call before rt_server_start. */
void rt_server_set_hooks(struct rt_server *s, const struct rt_server_hooks *h);

/* Starts serving once the app's listeners are bound: the tick and drain
 * timers, SIGTERM/SIGINT (drain), the notify pipe's watch. Call once,
 * after rt_server_init succeeded. Loop thread. */
void rt_server_start(struct rt_server *s);

/* Runs the app's scrape hook, if any: call before rendering s->metrics.
 * Loop thread. */
void rt_server_scrape(struct rt_server *s);

/* Releases a server that rt_server_init set up but that will never start
 * (the app failed to set up or bind its servers): closes its handles, runs
 * the loop until they are closed (the app's own closes included) and frees
 * everything; rt_server_free stays safe. */
void rt_server_discard(struct rt_server *s);

/* Stops everything and frees; safe on a zeroed server. Run the loop until
 * it is empty afterwards so that handles close. */
void rt_server_free(struct rt_server *s);

/* Creates a request owned by the server (listed, id assigned). */
struct rt_req *rt_req_new(struct rt_server *s, const struct rt_sink *sink,
                          void *client);

/* Tokenizes r->q (prompt text, ids or chat messages), checks the context,
 * and submits it. On failure fills *e (HTTP status and OpenAI error) and
 * the caller must rt_req_drop it. With r->on_submitted set and a text or
 * chat prompt, the tokenization runs on the thread pool and the return is
 * TG_EAGAIN: the outcome comes through on_submitted. The encoding stops as
 * soon as the prompt has more tokens than the context leaves it
 * (max_model_len minus max_tokens when given, else minus one), so an
 * over-long prompt costs about a context's worth of tokenization before
 * it is refused with context_length_exceeded. */
int rt_req_submit(struct rt_req *r, struct rt_request_error *e);

/* Why n parallel samples of one request cannot run here, as a 400 naming
 * `n`: more than --max-num-seqs, or a scoring method whose rows shrink by
 * what the worker keeps after each chunk (gvote), which a sample forked
 * from the reservation cannot follow. Returns 0 (n <= 1 always) or
 * TG_EUNSUPPORTED with *e filled. Loop thread. */
int rt_server_check_n(const struct rt_server *s, int32_t n,
                      struct rt_request_error *e);

/* Choice `index` (1 .. n-1) of `leader`, which rt_req_submit submitted
 * and whose scheduler entry still waits (call it right after the
 * submission, before the loop turns): a new request with leader's
 * sink, client, group, id_str, prompt and a copy of its parameters
 * (rt_request_copy_sample), seeded with leader's seed + index
 * (modulo 2^64), submitted as a parallel sample (rt_sched_request.
 * fork_of) so it shares the prompt's KV. Returns it, or NULL with *e
 * filled (a 400 naming `n` when the samples do not fit a worker's pool,
 * else 500); the caller then cancels the leader and the samples made so
 * far. Loop thread. */
struct rt_req *rt_req_new_sample(struct rt_req *leader, int32_t index,
                                 struct rt_request_error *e);

/* The client is gone or cancelled: aborts the request (its pages return to
 * the pools at once); no further deliver calls happen. */
void rt_req_cancel(struct rt_req *r);

/* Aborts a running request on behalf of the server or an Abort call: its
 * pages return at once and the sink gets a last delivery with
 * RT_FINISH_ABORT. */
void rt_req_abort(struct rt_req *r);

/* Hands r's output since the last delivery to its sink: text and
 * logprobs in pieces of at most RT_DELIVER_MAX_TOKENS tokens and
 * RT_DELIVER_MAX_TEXT bytes while r->blocked allows, then (once all went
 * out) the final delivery when fin != RT_FINISH_NONE, which marks r done.
 * A final delivery that meets a blocked client is held (r->holding) for
 * rt_req_resume(). No-op on a done or holding request. Loop thread. */
void rt_req_deliver(struct rt_req *r, enum rt_finish fin, const char *error);

/* The client of a blocked request drained: delivers what was held (in
 * pieces, while the sink stays unblocked), the final delivery included;
 * a request whose final delivery went out is freed before this returns.
 * Loop thread, never from inside the request's own sink. */
void rt_req_resume(struct rt_req *r);

/* Frees a request that was never submitted or already finished. */
void rt_req_drop(struct rt_req *r);

/* Tokenizes `text` (len bytes) on the calling thread, appending to *ids.
 * On failure fills *e (400 for bad input, 500 out of memory) and returns
 * the code. Any thread (reads only immutable server state). */
int rt_server_encode(struct rt_server *s, const char *text, size_t len,
                     int add_special, struct tok_ids *ids,
                     struct rt_request_error *e);

/* Renders the chat `messages` (JSON array, rt_request.chat_messages) and
 * `tools` (JSON array or NULL) with the model's chat template and options
 * `chat`, then tokenizes the prompt, appending to *ids. On failure fills *e
 * and returns the code: 400 for a template failure (its message, e.g. a
 * template's raise_exception) or a chat model without a usable template
 * (TG_EUNSUPPORTED, naming why), 500 out of memory. */
int rt_server_encode_chat(struct rt_server *s, json_t *messages, json_t *tools,
                          const struct rt_chat_opts *chat, int add_special,
                          struct tok_ids *ids, struct rt_request_error *e);

/* Readiness for /health and the gRPC health service. */
int rt_server_ready(const struct rt_server *s);

/* The next of the server's random numbers (splitmix64, seeded per
 * process): ids and seeds the front ends draw. Loop thread. */
uint64_t rt_server_random(struct rt_server *s);

/* Token text for logprobs (rt_token_text_fn). */
const char *rt_server_token_text(void *user, int32_t id, size_t *len);

/* Fills *t with output token i of r (i < r->n_out) and its alternatives,
 * in r->top_scratch: as many as the worker sent (a structured output's
 * step may allow fewer ids than were asked for). Loop thread. */
void rt_req_token_logprob(struct rt_req *r, int32_t i,
                          struct rt_token_logprob *t);

/* Loop-clock seconds. */
double rt_server_now(const struct rt_server *s);

/* The responses held for later turns (rt_respstore.h): the app's, set
 * before the front ends serve; NULL (the default) is none. Loop thread. */
void rt_server_set_respstore(struct rt_server *s, struct rt_respstore *st);
struct rt_respstore *rt_server_respstore(const struct rt_server *s);

/* The model's chat template, or NULL when chat is disabled (no usable
 * template). Immutable while serving: any thread that the loop keeps the
 * server alive for. */
const struct ct_template *rt_server_template(const struct rt_server *s);

/* r's prompt ids (r->n_prompt of them, once tokenized) and its generated
 * ids (r->n_out): what its KV holds, e.g. for a front end that stores the
 * conversation. Valid until r is freed. Loop thread. */
const int32_t *rt_req_prompt_ids(const struct rt_req *r);
const int32_t *rt_req_out_ids(const struct rt_req *r);

#endif /* RT_SERVER_H */
