/*
 * rt_link.h — the router's side of the router <-> worker link: one ZeroMQ
 * ROUTER socket driven by the router's libuv loop (DESIGN.md §2; the
 * protocol is proto/worker.proto).
 *
 * Topology. The router binds a ZMQ_ROUTER socket (ipc:// by default, under
 * a runtime directory; tcp:// works too). Each of the T tensor-parallel
 * workers connects a ZMQ_DEALER whose routing id is "rank-<r>" and sends a
 * Hello first. Every ZeroMQ message is one WorkerMessage envelope. The
 * socket sets ZMQ_ROUTER_HANDOVER (a restarted worker takes its routing id
 * over from the dead connection) and ZMQ_ROUTER_MANDATORY (a send to a peer
 * that is not connected fails instead of vanishing).
 *
 * Ranks. A Hello is checked against the layout the router's accounting
 * assumes (world size, rank, num_layers, groups_per_layer, heads_per_group,
 * page_size, head_dim, vocab_size, and pages_total >= the pages the
 * router's pools count; rank 0's must carry a comm_id of at most
 * RT_LINK_COMM_ID_MAX bytes when T > 1); a mismatch is logged, counted
 * (n_refused, last_error) and answered with a Shutdown, and the rank stays
 * down. An accepted Hello makes the rank alive and is acknowledged with a
 * Heartbeat.
 *
 * Communicator. Rank 0's Hello names the group its ranks all-reduce in
 * (comm_id, opaque bytes: a shared-memory name on the CPU backend, an
 * ncclUniqueId on CUDA, whose bootstrap listener rank 0 opened). Once
 * every rank is alive, each rank that has not had one for its current
 * incarnation gets a CommSetup with rank 0's id and kind (rank 0 too, so
 * T = 1 goes the same path; an empty id is relayed as is). Waiting for all
 * Hellos, not just rank 0's, means every rank has loaded its weights
 * before any joins, so joins meet at once. Each rank joins and answers
 * CommReady; ok = false, a CommReady that was not asked for, or none within
 * comm_setup_ms declares the rank dead like any failure (with shared_fate
 * the whole group; the supervisor restarts it). rt_link_ready() is true
 * while all T ranks are alive and have answered CommReady ok; on_ready
 * fires each time the link becomes ready (first start, and again after a
 * dead rank came back). A rank that comes back alone (no shared_fate) is
 * sent the id of the current rank 0: that only joins where the backend
 * lets one rank rejoin, so tensor-parallel routers set shared_fate.
 *
 * Steps. rt_link_send_plan() encodes one scheduler step (rt_step.h, which
 * carries everything a plan needs) as a BatchPlan and sends it to every
 * rank; each rank receives the same entries but only its own page deltas
 * (and, for fresh slots adopting stored KV, its own row lengths). Every rank answers with a StepResult;
 * rank 0's carries the sampled tokens. When every rank has answered the
 * step in flight, on_result fires exactly once: ok when every rank said ok
 * and rank 0 answered every sampled entry exactly once — with a token, or
 * with a slot error that fails that entry's request alone (entries[i].error)
 * — and every rank's head-length reports name a slot of the step's entries
 * at most once with one length per KV head of the rank (L x G x H_p) —
 * else not ok with the first error. One step is in flight at a time.
 *
 * The host tier (DESIGN.md §4.10, rt_link_tier.c). rt_link_send_tier sends
 * the scheduler's copy ops as one TierCommand per rank (its own pages), at
 * any time, also while a step is in flight; each rank answers every op it
 * got with a TierDone in a TierReport, which on_tier receives. An op's
 * answers from a rank that dies never come: the caller learns of the
 * death through on_dead (rt_sched_tier_lost).
 *
 * Structured outputs (DESIGN.md §4.11, rt_link_grammar.c).
 * rt_link_send_grammar sends rank 0 (the rank that samples) the grammars
 * to prepare and the ids to release as one GrammarCommand, at any time,
 * also while a step is in flight; rank 0 answers each prepare once, with
 * a GrammarReady in a GrammarReport, which on_grammar receives. Other
 * ranks take no part. A rank 0 that dies holds nothing any more: the
 * caller learns of it through on_dead and prepares again.
 *
 * Liveness. A worker beats from a thread of its own on a second
 * connection (routing id "beat-<r>", proto Heartbeat): the beats flow
 * while its main thread runs a step of any length, each carrying the
 * worker's pid (a beat of another incarnation is ignored, and nothing is
 * ever sent to a beat connection), the step it runs and how long its
 * compute thread has shown no progress (stalled_ms). So a rank is alive
 * while its process runs, however long a step takes; a stopped (SIGSTOP)
 * or dead process falls silent; a compute thread wedged inside one call
 * keeps beating with a growing stalled_ms.
 *
 * Failures are errors, never silence or a hang. A rank is declared dead
 * when no message came from it (on either connection) for dead_ms, when a
 * beat reports no progress for longer than stall_ms, when a send of a plan
 * to it
 * fails, when it answers out of order (a step id other than the next one
 * it owes: a lost or duplicated message), when it sends something
 * unparsable or of another protocol version, or when it says Hello again
 * while alive (it restarted). A dead rank gets a Shutdown (so a stray,
 * still running worker exits and the supervisor starts a clean one); if a
 * step was in flight it completes at once through on_result with ok = 0
 * ("rank r died: ..."), then on_dead(rank) fires once. With
 * cfg.shared_fate (tensor parallelism, T > 1) every other alive rank then
 * follows the same way (Shutdown, killed, on_dead), since its peers in the
 * all-reduce group are gone: the supervisor restarts the group as a whole.
 * The rank is alive again after its next valid Hello. Answers a rank still owed for a step
 * that was completed early are recognised by their step id and dropped.
 *
 * Event loop. uv_poll watches ZMQ_FD, which is edge-triggered: every
 * readable event drains the socket with ZMQ_DONTWAIT receives until it
 * would block, and every send made outside the loop's callbacks schedules
 * another drain (a uv_idle tick), because a send may consume the edge of a
 * message that arrived meanwhile. A uv timer ticks every
 * min(heartbeat_ms, RT_LINK_TICK_MS_MAX): it checks the deadlines on every
 * tick (so a silent rank is declared dead at most one tick after dead_ms)
 * and sends Heartbeats every heartbeat_ms.
 *
 * Threading: every function and every callback runs on the loop thread.
 * Callbacks may call rt_link_send_plan, rt_link_shutdown and rt_link_close.
 * Library code: logs through tg_log, never prints.
 *
 * Implementation: rt_link.c (socket, loop, ranks, results),
 * rt_link_plan.c (plan building) and rt_link_comm.c (communicator
 * set-up), sharing rt_link_internal.h.
 */
#ifndef RT_LINK_H
#define RT_LINK_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "router/link/rt_step.h"

#define RT_LINK_HEARTBEAT_MS_DEFAULT 1000u
#define RT_LINK_DEAD_FACTOR_DEFAULT 5u   /* dead_ms = 5 heartbeats */
#define RT_LINK_LINGER_MS_DEFAULT 200u
#define RT_LINK_RUNTIME_DIR_DEFAULT "/run/tangram"
#define RT_LINK_SOCKET_NAME "router.sock"
#define RT_LINK_MAX_RANKS 1024
#define RT_LINK_COMM_ID_MAX 256          /* bytes of a Hello.comm_id */
#define RT_LINK_COMM_SETUP_MS_DEFAULT 30000u /* CommSetup -> CommReady */
#define RT_LINK_STALL_MS_DEFAULT 60000u  /* no progress inside one call */
#define RT_LINK_TICK_MS_MAX 250u         /* deadline check period, at most */

/* The per-rank KV layout the router's accounting assumes; a worker's Hello
 * must match it (pages_total: at least). */
struct rt_link_layout {
    uint32_t num_layers;       /* L */
    uint32_t groups_per_layer; /* G on one rank */
    uint32_t heads_per_group;  /* H_p */
    uint32_t page_size;        /* P, tokens per page */
    uint32_t head_dim;         /* d */
    uint32_t pages_total;      /* pages the router's pool of a rank counts */
    uint32_t vocab_size;       /* sampled token ids must be below it */
    uint32_t host_pages_total; /* host-tier pages the router counts per
                                  rank (§4.10); a Hello must offer at
                                  least this many. 0 at start */
};

/* One rank's answer to one host-tier op (proto TierDone). */
struct rt_link_tier_done {
    uint64_t id;
    int ok;
    const char *error;           /* "" when ok; valid during the callback */
};

/* The prompt log-probabilities rank 0 returned for one prefill entry
 * that asked (rt_step_entry.prompt_lp; proto PromptLogprobs): n values
 * for the positions first_pos .. first_pos + n - 1, each with its rank
 * and n_top alternatives (position-major, most likely first). Checked
 * against the entry: first_pos is its pos + 1, n its chunk (less one
 * without lp_next), n_top its prompt_top, ids in the vocabulary. Pointers
 * borrow from the result being delivered. */
struct rt_link_plp {
    int64_t first_pos;
    size_t n;
    const float *logprobs; /* (n) natural log */
    const uint32_t *ranks; /* (n) >= 1 */
    size_t n_top;
    const uint32_t *top_ids;   /* (n, n_top) */
    const float *top_logprobs; /* (n, n_top) */
};

/* One sampled token of a step, in step-entry order. Pointers borrow from
 * the result being delivered. */
struct rt_link_token {
    int32_t sampled;             /* 1 when the entry asked for a sample */
    uint32_t slot;
    int32_t token;               /* sampled id, -1 when not sampled */
    const char *error;           /* non-NULL: rank 0 could not draw for
                                    this entry (its sampling parameters);
                                    only its request fails, token is -1 */
    float logprob;               /* natural log */
    size_t n_top;                /* alternatives, most likely first */
    const uint32_t *top_ids;     /* (n_top) */
    const float *top_logprobs;   /* (n_top) natural log */
    const struct rt_link_plp *plp; /* the entry's prompt log-probabilities
                                    (it asked, the step is ok), or NULL */
};

/* What on_result receives. Everything it points to is valid only during
 * the callback. */
struct rt_link_result {
    uint64_t step_id;
    int ok;                      /* 1: every rank ok and tokens consistent */
    const char *error;           /* "" when ok, else "rank r: ..." */
    int32_t n_entries;           /* entries of the step */
    const struct rt_link_token *entries; /* (n_entries) in step order */
    const int32_t *tokens;       /* (n_entries) token sampled for entry i or
                                    -1: the array rt_sched_complete takes
                                    (all -1 when !ok) */
    const struct rt_step_heads *heads; /* (n_heads) every rank's head-length
                                    reports (StepResult.head_lens) by entry
                                    index, what rt_sched_complete_heads
                                    takes; none when !ok */
    int32_t n_heads;
    double step_seconds;         /* slowest rank's time running the plan,
                                    seconds */
    double host_seconds;         /* the most host work of a rank in the
                                    step (StepResult.host_seconds) */
};

/* One grammar rank 0 is to prepare (proto GrammarPrepare). */
struct rt_link_gprep {
    uint64_t id;      /* the caller's, never reused with one process */
    const char *spec; /* NUL-terminated, borrowed during the call */
};

/* Rank 0's answer to one prepare (proto GrammarReady). */
struct rt_link_gready {
    uint64_t id;
    int ok;            /* the grammar is held ready under id */
    int busy;          /* !ok: the worker's queue was full */
    const char *error; /* "" when ok; valid during the callback */
};

typedef void (*rt_link_result_fn)(void *ud, const struct rt_link_result *res);
/* Rank 0's GrammarReport: r[0 .. n) in the order the prepares ended. */
typedef void (*rt_link_grammar_fn)(void *ud, const struct rt_link_gready *r,
                                   size_t n);
/* A rank's TierReport: done[0 .. n) in the order its copies completed. */
typedef void (*rt_link_tier_fn)(void *ud, int rank,
                                const struct rt_link_tier_done *done,
                                size_t n);
typedef void (*rt_link_dead_fn)(void *ud, int rank);
typedef void (*rt_link_ready_fn)(void *ud);

struct rt_link_config {
    const char *endpoint;       /* "ipc:///path" or "tcp://host:port"
                                   ("tcp://127.0.0.1:*" picks a port); NULL:
                                   ipc://<runtime_dir>/router.sock */
    const char *runtime_dir;    /* NULL: RT_LINK_RUNTIME_DIR_DEFAULT */
    int world_size;             /* T, 1 .. RT_LINK_MAX_RANKS */
    struct rt_link_layout layout;
    uint32_t heartbeat_ms;      /* 0: RT_LINK_HEARTBEAT_MS_DEFAULT */
    uint32_t dead_ms;           /* silence that kills a rank; 0: 5 beats;
                                   must be > heartbeat_ms */
    uint32_t stall_ms;          /* a beat reporting no progress of the
                                   rank's compute thread for longer kills
                                   it; 0: RT_LINK_STALL_MS_DEFAULT */
    uint32_t linger_ms;         /* how long close may wait to flush queued
                                   messages (Shutdown); 0: default 200 */
    uint32_t comm_setup_ms;     /* longest wait for a rank's CommReady
                                   after its CommSetup; 0:
                                   RT_LINK_COMM_SETUP_MS_DEFAULT */
    int shared_fate;            /* nonzero: the ranks form one tensor-
                                   parallel group (T > 1) whose all-reduces
                                   pair up, so when one rank dies every
                                   other alive rank is declared dead too
                                   (Shutdown, process killed) rather than
                                   left blocked in a collective */
    rt_link_result_fn on_result;/* required */
    rt_link_dead_fn on_dead;    /* may be NULL */
    rt_link_ready_fn on_ready;  /* may be NULL */
    rt_link_tier_fn on_tier;    /* host-tier reports of alive ranks; may
                                   be NULL (reports dropped) */
    rt_link_grammar_fn on_grammar; /* rank 0's grammar reports; may be
                                   NULL (reports dropped) */
    void *ud;                   /* passed to the callbacks */
};

struct rt_link_rank; /* private to rt_link.c */

/* The link. The caller owns the storage; fields are private to rt_link.c
 * except where a comment says a caller may read them. */
struct rt_link {
    uv_loop_t *loop;
    struct rt_link_config cfg;
    char endpoint[256];          /* readable: the bound endpoint (a tcp
                                    wildcard port resolved) */
    void *zctx, *sock;           /* ZeroMQ context and ROUTER socket */
    uv_poll_t poll;              /* on ZMQ_FD */
    uv_timer_t timer;            /* heartbeats and deadlines */
    uint64_t next_beat;          /* uv_now() of the next heartbeats */
    uv_idle_t kick;              /* deferred drain after sends */
    int n_handles;               /* uv handles not yet closed */
    int initialized, closed, shut, ready, kicking;
    struct rt_link_rank *ranks;  /* (world_size) */
    uint64_t hb_seq;             /* heartbeats sent (sequence number) */
    uint64_t last_step;          /* last step id sent */
    uint64_t inflight;           /* step id awaiting answers, or 0 */
    int n_answered;              /* ranks that answered the step */
    int failed;                  /* some rank said !ok */
    char step_error[512];        /* first error of the step */
    double step_seconds;
    double host_seconds;
    void *rank0_result;          /* rank 0's unpacked WorkerMessage */
    int32_t n_entries, cap_entries;
    uint32_t *entry_slot;        /* (cap_entries) slots of the step */
    uint8_t *entry_sample;       /* (cap_entries) sample flags */
    struct rt_link_plp *entry_plp;    /* (cap_entries) what each entry's
                                    prompt log-probabilities must be
                                    (n_top SIZE_MAX: none asked), then
                                    rank 0's (rt_link_plp.c) */
    struct rt_link_token *res_tokens; /* (cap_entries) result buffers */
    int32_t *res_ids;            /* (cap_entries) */
    uint8_t comm_id[RT_LINK_COMM_ID_MAX]; /* rank 0's group id */
    size_t comm_id_len;
    char comm_kind[32];          /* rank 0's Hello.comm_kind */
    int per_head;                /* -1 until the first accepted Hello says
                                    whether the workers keep per-head
                                    lengths (LayoutSummary.per_head_lens);
                                    later Hellos must agree */
    struct rt_step_heads *res_heads; /* (cap_res_heads) the step's reports */
    int64_t *res_head_off;       /* (cap_res_heads) their values at
                                    res_head_vals + off */
    int32_t n_res_heads, cap_res_heads;
    int32_t *res_head_vals;      /* (cap_res_head_vals) */
    int64_t n_res_head_vals, cap_res_head_vals;
    uint64_t n_refused;          /* readable: Hellos refused */
    uint64_t n_deaths;           /* readable: ranks declared dead */
    uint64_t n_results;          /* readable: on_result calls */
    char last_error[256];        /* readable: last refusal or death */
};

/* Writes "ipc://<runtime_dir>/router.sock" (runtime_dir NULL: the default)
 * into out. Returns 0 or TG_ETOOBIG when it does not fit out or a Unix
 * socket path (107 bytes). */
int rt_link_default_endpoint(const char *runtime_dir, char *out,
                             size_t outlen, char *err, size_t errlen);

/* Creates the context and socket, binds cfg->endpoint and starts polling
 * and the heartbeat timer on `loop`. cfg is copied (the endpoint string
 * too). Returns 0, TG_EINVAL naming the bad field, TG_EIO when the bind or
 * socket setup fails (detail from zmq_strerror) or TG_ENOMEM. On failure
 * nothing is left open and rt_link_close is still safe. The caller owns
 * `link` and must keep it valid until rt_link_close's handles are closed. */
int rt_link_init(struct rt_link *link, uv_loop_t *loop,
                 const struct rt_link_config *cfg, char *err, size_t errlen);

/* Encodes `step` (the scheduler's, which holds everything a plan needs)
 * as the BatchPlan of each rank and sends it: the entries (tokens, start
 * position, sample and last_chunk flags, fresh, request id, sampling
 * parameters) to every rank, the deltas of step->deltas whose rank is r
 * (row -> layer row / G, group row % G) and the row lengths of adopted
 * entries for rank r to rank r only, and step->released as frees. The
 * step must have at least one entry and a step_id greater than every step
 * sent before. Returns 0 when the plan is on its way; its answer then
 * always arrives through on_result (a send that fails kills that rank,
 * which completes the step with an error from the loop, never from inside
 * this call). Returns TG_EAGAIN when not every rank is ready, TG_EBUSY
 * when a step is in flight, TG_ECANCELED after rt_link_shutdown,
 * TG_EINVAL for a bad step (detail in err) or TG_ENOMEM; nothing is sent
 * then and on_result will not fire. Reads `step` only during the call. */
int rt_link_send_plan(struct rt_link *link, const struct rt_step *step,
                      char *err, size_t errlen);

/* Returns 1 when every rank is alive and has joined the communicator
 * group (CommReady ok), and shutdown has not started. */
int rt_link_ready(const struct rt_link *link);

/* Returns 1 when `rank` is alive and answered its CommSetup with
 * CommReady ok, 0 otherwise (also out of range). */
int rt_link_rank_joined(const struct rt_link *link, int rank);

/* Returns 1 when `rank` is alive, 0 otherwise (also out of range). */
int rt_link_rank_alive(const struct rt_link *link, int rank);

/* Returns the milliseconds since the last message of any kind from alive
 * `rank` (the loop's clock, uv_now), or -1 when the rank is not alive (or
 * out of range). A healthy rank beats every heartbeat_ms, during steps
 * too; a longer silence means its process is stopped or cut off, long
 * before dead_ms declares it dead. */
int64_t rt_link_rank_silence_ms(const struct rt_link *link, int rank);

/* Returns the smallest pages_total that the alive ranks reported in their
 * Hellos (clamped to INT32_MAX), or 0 when no rank is alive. Read it in
 * on_ready to size the scheduler's pools from what the workers hold. */
int32_t rt_link_min_pages(const struct rt_link *link);

/* Raises the pages a Hello must report (cfg.layout.pages_total) to
 * `pages`, e.g. once the scheduler was sized from rt_link_min_pages, so a
 * restarted worker with a smaller pool is refused. Never lowers it.
 * Returns 0, or TG_EINVAL when the link is not open. */
int rt_link_require_pages(struct rt_link *link, uint32_t pages);

/* The host tier (DESIGN.md §4.10, rt_link_tier.c). Each Hello names its
 * rank's host pages (Hello.host_pages_total) and the bytes of a page
 * (LayoutSummary.page_bytes). */

/* Returns the smallest host_pages_total the alive ranks reported (0 when
 * one has no tier, or none is alive). */
int32_t rt_link_min_host_pages(const struct rt_link *link);

/* Raises the host pages a Hello must report to `pages` (a restarted worker
 * with a smaller tier is refused). Never lowers it. Returns 0, or
 * TG_EINVAL when the link is not open. */
int rt_link_require_host_pages(struct rt_link *link, uint32_t pages);

/* Returns the bytes of one page (rank 0's last Hello), or 0 before any. */
int64_t rt_link_page_bytes(const struct rt_link *link);

/* Sends ops[0 .. n) (rt_sched_tier_take's) to every rank, each rank its
 * own pages (off[r] .. off[r + 1]) as one TierCommand. Every op is
 * answered through on_tier by every rank that stays alive. A send that
 * fails kills that rank (from the loop, as for plans). Returns 0,
 * TG_EAGAIN when not every rank is ready, TG_EINVAL or TG_ENOMEM (nothing
 * sent). */
int rt_link_send_tier(struct rt_link *link, struct rt_tier_op *const *ops,
                      int32_t n, char *err, size_t errlen);

/* Sends rank 0 the prepares prep[0 .. n_prep) and the releases
 * release[0 .. n_release) as one GrammarCommand (prepares first). Every
 * prepare is answered through on_grammar while rank 0 stays alive. A send
 * that fails kills rank 0 (from the loop, as for plans). Returns 0,
 * TG_EAGAIN when not every rank is ready, TG_EINVAL or TG_ENOMEM (nothing
 * sent). */
int rt_link_send_grammar(struct rt_link *link, const struct rt_link_gprep *prep,
                         size_t n_prep, const uint64_t *release,
                         size_t n_release, char *err, size_t errlen);

/* Returns 1 when the workers keep per-head lengths (their Hellos said so;
 * every rank agrees, or is refused), 0 when they keep whole rows or no
 * Hello was accepted yet. Read it in on_ready to configure the
 * scheduler (rt_sched_config.per_head). */
int rt_link_per_head(const struct rt_link *link);

/* Returns the step id in flight, or 0. */
uint64_t rt_link_in_flight(const struct rt_link *link);

/* Sends Shutdown (with `reason`, NULL: "router shutdown", and the drain
 * flag: finish the step in flight first) to every rank that said Hello,
 * then stops heartbeats and refuses new plans and Hellos. A step in flight
 * still completes through on_result (deadlines stay armed for it). Returns
 * 0, or TG_EINVAL when the link is not initialised. */
int rt_link_shutdown(struct rt_link *link, int drain, const char *reason);

/* Stops polling and the timer, closes the socket (waiting at most
 * linger_ms to flush queued messages) and the context, and frees the
 * link's memory. No callback fires from or after it (a step in flight is
 * dropped). The uv handles close asynchronously: keep `link` valid until
 * the loop has run again (uv_run). Safe on a zeroed, failed-init or
 * already closed link. */
void rt_link_close(struct rt_link *link);

#endif /* RT_LINK_H */
