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
 * back. SIGTERM drains: new requests are refused (RT_REQ_ERR_UNAVAILABLE),
 * running ones finish within --shutdown-timeout, then the process exits.
 *
 * Everything here runs on the loop thread.
 */
#ifndef RT_SERVER_H
#define RT_SERVER_H

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "common/base/tg_list.h"
#include "common/base/tg_serve_opts.h"
#include "common/chat/ct_chat.h"
#include "common/tok/tok_tokenizer.h"
#include "router/core/rt_metrics_tangram.h"
#include "router/core/rt_reqmem.h"
#include "router/core/rt_respstore.h"
#include "router/core/rt_request.h"

struct rt_req;
/* the core: opaque outside router/core/ (its fields are in
 * rt_server_internal.h); the functions below are what the app and the front
 * ends reach it by */
struct rt_server;
struct rt_encode_job;

/* What the front ends tell clients about the served model (ModelInfo,
 * /v1/models, the parsers' limits). Owned by the server; valid as long as
 * it lives. max_model_len may shrink once, when the workers' pools turn
 * out smaller than the context. */
struct rt_server_info {
    const char *model_name; /* the served name (--served-model-name) */
    int64_t started;        /* unix seconds */
    int32_t max_model_len;  /* tokens a request may span */
    int32_t vocab_size;     /* token ids are below it */
    int32_t num_layers, num_kv_heads, head_dim; /* the model's shape */
    int32_t page_size;                          /* tokens per KV page */
    int32_t heads_per_group;                    /* KV heads per page group */
    /* how the chat template writes tool calls (CT_TOOLS_NONE: it does not) */
    enum ct_tool_format tool_format;
    bool chat;   /* the model has a usable chat template */
    bool thinks; /* its template writes <think> (a reasoning model's
                    output opens with a thought) */
};

/* What the app (router/app/) does for the core at the moments the core
 * decides them. Called on the loop thread with `ud`; either may be NULL.
 *   close   the drain ended (or a second signal cut it): stop accepting
 *           and close every listener and connection; the handles finish
 *           closing as the loop runs on.
 *   scrape  a metrics scrape is about to render the registry: copy the
 *           counters kept outside the core (connections, body memory)
 *           into the server's metrics (rt_server_metrics). */
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

/* the core's own state of a request (router/core/rt_server_internal.h) */
struct rt_req_core;

/* A request as the front ends and the core share it. The front end sets
 * the first block (before rt_req_submit unless said otherwise); the core
 * sets the second, which the front end only reads; everything else about
 * the request (its prompt ids, output arrays, text, scheduling state) is
 * the core's, behind `core`, and reached through the functions below. */
struct rt_req {
    /* ---- the front end's ---- */
    const struct rt_sink *sink;
    void *client;               /* the front end's handle */
    /* the front end's state of this request (what it needs to format the
     * answer), freed by sink->release */
    void *fe;
    /* Optional backpressure: nonzero while the client takes no more
     * output (its send queue is full). The server then keeps the output
     * in the request (the token arrays are sized for max_tokens at
     * submit, so nothing grows), a final delivery that falls due
     * included, and the front end calls rt_req_resume() once the client
     * drains. Output that piled up goes out in deliveries of at most
     * RT_DELIVER_MAX_TOKENS tokens and RT_DELIVER_MAX_TEXT bytes, asking
     * `blocked` again between them. NULL: never blocked. */
    int (*blocked)(struct rt_req *r);
    /* Set to have the prompt rendered and tokenized off the loop thread:
     * rt_req_submit then returns TG_EAGAIN and this is called once, on
     * the loop thread, with the outcome of the submission (0, or a code
     * with *e filled: the front end then reports e and calls
     * rt_req_drop). It is not called for a request cancelled or aborted
     * meanwhile. NULL: rt_req_submit tokenizes on the calling thread. */
    void (*on_submitted)(struct rt_req *r, int rc, struct rt_request_error *e);
    /* what to generate (owned; the core resolves max_tokens and the seed at
     * submission) */
    struct rt_request q;
    /* the id the answer carries ("cmpl-...", a gRPC client's whole
     * request_id) */
    char id_str[RT_REQUEST_MAX_ID_BYTES + 1];
    /* parallel samples: the front end's (opaque here), shared by a
     * request's samples */
    void *group;
    /* ---- the core's, read-only outside it ---- */
    struct rt_server *srv;
    uint64_t id;     /* unique in the process */
    int64_t created; /* unix seconds */
    /* parallel samples (OpenAI n > 1): which choice of the client's
     * request; a sample shares its leader's client, sink, id_str, group and
     * created time */
    int32_t choice;
    int64_t n_prompt;      /* prompt tokens, once tokenized */
    int32_t n_out;         /* tokens generated so far */
    int64_t cached_tokens; /* prompt tokens reused from stored KV */
    struct rt_req_core *core;
};

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
    struct ct_chat chat; /* is_chat: a shallow copy, borrowed (its
                                   tools and kwargs always; its messages
                                   unless free_messages) */
    int free_messages;   /* the job owns chat.messages and frees
                                   them once rendered, on the pool thread
                                   (a large chat's parsed form is freed
                                   off the loop) */
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

/* Start-up is three steps, run by the app (router/app/rt_app.h):
 *   rt_server_init    loads the model's config, tokenizer, chat template
 *                     and profile and binds the worker link;
 *   the app           creates its network servers, registers the front
 *                     ends on them and its hooks here, binds the
 *                     listeners;
 *   rt_server_start   starts serving: timers, SIGTERM/SIGINT, the notify
 *                     pipe.
 * rt_server_init makes the server in *out and returns 0, or an error with
 * detail in err; on failure everything is released, running `loop` until
 * the handles opened so far are closed (call it before anything else uses
 * the loop), and *out is NULL. `o` must outlive the server. */
int rt_server_init(struct rt_server **out, uv_loop_t *loop,
                   const struct tg_serve_opts *o, char *err, size_t errlen);

/* Registers the app's hooks (copied); call before rt_server_start. */
void rt_server_set_hooks(struct rt_server *s, const struct rt_server_hooks *h);

/* Starts serving once the app's listeners are bound: the tick and drain
 * timers, SIGTERM/SIGINT (drain), the notify pipe's watch. Call once,
 * after rt_server_init succeeded. Loop thread. */
void rt_server_start(struct rt_server *s);

/* Runs the app's scrape hook, if any: call before rendering the metrics
 * (rt_server_metrics). Loop thread. */
void rt_server_scrape(struct rt_server *s);

/* The request memory budget the front ends charge large requests to
 * (rt_reqmem.h): the app's, set before the front ends register; NULL (the
 * default) is none. Loop thread. */
void rt_server_set_reqmem(struct rt_server *s, struct rt_reqmem *m);
struct rt_reqmem *rt_server_reqmem(const struct rt_server *s);

/* The served model (struct rt_server_info). Any thread that the loop
 * keeps the server alive for (a pool job of a front end). */
const struct rt_server_info *rt_server_info(const struct rt_server *s);

/* The router's rows of the serving option table (tg_serve_opts_table
 * (TG_SERVE_ROUTER)), as rt_server_init got them. Any thread, as above. */
const struct tg_serve_opts *rt_server_opts(const struct rt_server *s);

/* The model's tokenizer (immutable while serving: any thread, as above;
 * tok_tokenizer.h). */
const struct tok_tokenizer *rt_server_tok(const struct rt_server *s);

/* The tangram metric set (rt_metrics_tangram.h): the front ends count
 * their events in it and render it for /metrics. Loop thread. */
struct rt_metrics_tangram *rt_server_metrics(struct rt_server *s);

/* 1 once a drain began (SIGTERM, SIGINT, tangramd gone): new requests are
 * refused (RT_REQ_ERR_UNAVAILABLE). Loop thread. */
int rt_server_draining(const struct rt_server *s);

/* The endpoint the workers connect to, as bound ("ipc://..." or
 * "tcp://host:port"). Loop thread. */
const char *rt_server_link_endpoint(const struct rt_server *s);

/* The first worker rank silent for more than two heartbeat periods (a
 * worker stopped or hung that the link has not declared dead yet, which
 * takes five), with its silence in *ms; -1 when every rank is speaking.
 * Loop thread. */
int rt_server_stalled_rank(const struct rt_server *s, int64_t *ms);

/* The first live request (not yet finished) for which match(r, ud) is
 * nonzero, or NULL; match must not change the server's requests. Loop
 * thread. */
struct rt_req *
rt_server_find_req(struct rt_server *s,
                   int (*match)(const struct rt_req *r, void *ud), void *ud);

/* 0, or 1 once the core stopped on a fatal condition (the scheduler could
 * not start) or a second signal cut the drain: the process's exit status
 * after the loop ran out. Loop thread. */
int rt_server_exit_code(const struct rt_server *s);

/* Releases a server that rt_server_init made but that will never start
 * (the app failed to set up or bind its servers): closes its handles, runs
 * the loop until they are closed (the app's own closes included) and frees
 * everything, s included. */
void rt_server_discard(struct rt_server *s);

/* Stops everything and frees it, s included; NULL is a no-op. Run the
 * loop until it is empty afterwards so that handles close. */
void rt_server_free(struct rt_server *s);

/* Creates a request owned by the server (listed, id assigned). */
struct rt_req *rt_req_new(struct rt_server *s, const struct rt_sink *sink,
                          void *client);

/* Tokenizes r->q (prompt text, ids or chat messages), checks the context,
 * and submits it. On failure fills *e (rt_request.h) and
 * the caller must rt_req_drop it. With r->on_submitted set and a text or
 * chat prompt, the tokenization runs on the thread pool and the return is
 * TG_EAGAIN: the outcome comes through on_submitted. The encoding stops as
 * soon as the prompt has more tokens than the context leaves it
 * (max_model_len minus max_tokens when given, else minus one), so an
 * over-long prompt costs about a context's worth of tokenization before
 * it is refused with context_length_exceeded. */
int rt_req_submit(struct rt_req *r, struct rt_request_error *e);

/* Why n parallel samples of one request cannot run here, as an invalid
 * request naming `n`: more than --max-num-seqs, or a scoring method whose rows shrink by
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
 * filled (invalid, naming `n`, when the samples do not fit a worker's
 * pool, else internal); the caller then cancels the leader and the samples made so
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

/* Renders the conversation `chat` (borrowed) with the model's chat
 * template, then tokenizes the prompt, appending to *ids. On failure fills
 * *e and returns the code: RT_REQ_ERR_INVALID for a template failure (its
 * message, e.g. a template's raise_exception) or a chat model without a
 * usable template (TG_EUNSUPPORTED, naming why), RT_REQ_ERR_INTERNAL out
 * of memory. Any thread (reads only immutable server state). */
int rt_server_encode_chat(struct rt_server *s, const struct ct_chat *chat,
                          int add_special, struct tok_ids *ids,
                          struct rt_request_error *e);

/* Renders `chat` (borrowed) with the model's chat template into *out, a
 * malloc'd NUL-terminated string of *len bytes (the caller frees). Errors
 * as rt_server_encode_chat's. Any thread. */
int rt_server_render_chat(struct rt_server *s, const struct ct_chat *chat,
                          char **out, size_t *len, struct rt_request_error *e);

/* Readiness for /health and the gRPC health service. */
int rt_server_ready(const struct rt_server *s);

/* The next of the server's random numbers (splitmix64, seeded per
 * process): ids and seeds the front ends draw. Loop thread. */
uint64_t rt_server_random(struct rt_server *s);

/* Token text for logprobs (rt_token_text_fn). */
const char *rt_server_token_text(void *user, int32_t id, size_t *len);

/* Fills *t with output token i of r (i < r->n_out) and its alternatives
 * (t->top points into r's scratch, valid until the next call for token
 * i): as many as the worker sent (a structured output's step may allow
 * fewer ids than were asked for). Loop thread. */
void rt_req_token_logprob(struct rt_req *r, int32_t i,
                          struct rt_token_logprob *t);

/* Every output token of r so far, with its alternatives (r->n_out of
 * them, in r's scratch: valid until r's next delivery). Loop thread. */
const struct rt_token_logprob *rt_req_logprobs(struct rt_req *r);

/* The text r produced so far (its stop strings cut, *len bytes,
 * NUL-terminated; at the final delivery, the whole answer). Valid until
 * r's next delivery. Loop thread. */
const char *rt_req_text(const struct rt_req *r, size_t *len);

/* The prompt's log-probabilities of r (rt_request.h; a request that asked
 * for them, rt_gen_opts.prompt_lp, else NULL) and, in *ids when not NULL,
 * its prompt's token ids (r->n_prompt of them). Complete once the first
 * token is delivered or the request finished. Loop thread. */
const struct rt_prompt_lps *rt_req_prompt_lps(const struct rt_req *r,
                                              const int32_t **ids);

/* Loop-clock seconds. */
double rt_server_now(const struct rt_server *s);

/* The responses held for later turns (rt_respstore.h): the app's, set
 * before the front ends serve; NULL (the default) is none. Loop thread. */
void rt_server_set_respstore(struct rt_server *s, struct rt_respstore *st);
struct rt_respstore *rt_server_respstore(const struct rt_server *s);

/* r's prompt ids (r->n_prompt of them, once tokenized) and its generated
 * ids (r->n_out): what its KV holds, e.g. for a front end that stores the
 * conversation. Valid until r is freed. Loop thread. */
const int32_t *rt_req_prompt_ids(const struct rt_req *r);
const int32_t *rt_req_out_ids(const struct rt_req *r);

#endif /* RT_SERVER_H */
