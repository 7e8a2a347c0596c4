/*
 * gw_wlink.h — a worker's ZeroMQ link to the router (DESIGN.md §2).
 *
 * One ZMQ_DEALER socket with routing id "rank-<r>" connects to the
 * router's ZMQ_ROUTER endpoint (ipc:///path or tcp://host:port). Every
 * ZeroMQ message is one WorkerMessage envelope of proto/worker.proto (a
 * router sending [identity][payload] reaches the dealer as [payload]; when
 * a message has several frames the last one is the payload).
 *
 * gw_wlink_serve is the worker's main loop: Hello first, then the
 * heartbeat thread of gw_beat.h starts (a Heartbeat every heartbeat_ms from
 * its own socket, routing id "beat-<r>", whatever the main thread does; the
 * main thread marks progress after each backend call of a step and on every
 * turn of its loop), then zmq_poll with a heartbeat timer: the main socket
 * also sends a Heartbeat every heartbeat_ms between steps (also while the
 * worker waits for its CommSetup); a CommSetup joins the communicator group
 * (gw_worker_comm_join) and is answered with a CommReady — a failed join
 * is reported there and ends the loop with GW_WLINK_EXIT_COMM, and so does
 * no CommSetup within comm_setup_timeout_ms of the Hello; a BatchPlan runs
 * gw_worker_step and the StepResult goes back; a Shutdown ends the loop
 * after the step in flight (steps run to completion, so every shutdown
 * drains); once the router has sent anything, its silence for
 * router_timeout_ms while the loop listens (the time a step or a join
 * takes does not count: what the router sent meanwhile waits in the
 * socket) ends it with GW_WLINK_EXIT_TIMEOUT
 * (the supervisor restarts the worker). A message
 * that does not parse ends it with GW_WLINK_EXIT_PROTOCOL; one that parses
 * but has the wrong version gets a StepResult with ok = false when it is a
 * plan (its step id is known) and ends the loop otherwise. Host-tier
 * commands and reports: see gw_wlink__tier_command below; structured
 * outputs' prepares: gw_wlink__grammar_command.
 *
 * The link is where protobuf stops: a BatchPlan is decoded into the plain
 * struct gw_plan (gw_plan.h) the worker runs, and the worker's gw_result,
 * Hello information and CommSetup answer are encoded here.
 *
 * Logs through common/base/tg_log.h. One thread owns a link (the beat thread
 * owns only its own socket).
 */
#ifndef GW_WLINK_H
#define GW_WLINK_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu_worker/serve/gw_beat.h"
#include "gpu_worker/step/gw_plan.h"
#include "gpu_worker/serve/gw_worker.h"
#include "worker.pb-c.h"

/* Short names of the protocol's types, for the link and its tests (the
 * protocol stops here: the worker itself sees gw_plan.h). */
typedef Tangram__Worker__V1__WorkerMessage GwWorkerMessage;
typedef Tangram__Worker__V1__Hello GwHello;
typedef Tangram__Worker__V1__BatchPlan GwBatchPlan;
typedef Tangram__Worker__V1__PlanEntry GwPlanEntry;
typedef Tangram__Worker__V1__PageDelta GwPageDelta;
typedef Tangram__Worker__V1__StepResult GwStepResult;
typedef Tangram__Worker__V1__SampledToken GwSampledToken;
typedef Tangram__Worker__V1__CommSetup GwCommSetup;

/* Exit statuses of tangram-worker, returned by gw_wlink_serve. */
enum gw_wlink_exit {
    GW_WLINK_EXIT_OK = 0,       /* Shutdown received, or stop requested */
    GW_WLINK_EXIT_ERROR = 1,    /* socket or memory failure */
    GW_WLINK_EXIT_TIMEOUT = 3,  /* the router went silent */
    GW_WLINK_EXIT_PROTOCOL = 4, /* unparsable message from the router */
    /* 5 is GW_WORKER_EXIT_PEERS_LOST (gw_worker.h) */
    GW_WLINK_EXIT_COMM = 6,     /* no CommSetup in time, or the join failed */
};

#define GW_WLINK_SETUP_TIMEOUT_MS_DEFAULT 300000 /* the slowest rank's load */
/* The router's heartbeats come from its event loop, which a burst of big
 * requests may hold for seconds on a loaded machine: a worker does not
 * leave over a shorter silence, whatever the heartbeat period. */
#define GW_WLINK_ROUTER_TIMEOUT_MIN_MS 10000

#define GW_WLINK_EXTRA_FDS 2

struct gw_wlink {
    void *ctx;        /* zmq context, owned */
    void *sock;       /* ZMQ_DEALER, owned */
    int rank;
    char *endpoint;   /* the router's, owned (the beat connects to it) */
    uint64_t hb_seq;  /* heartbeats sent */
    struct gw_progress progress; /* the compute thread's marks */
    double rx_s;                 /* CLOCK_MONOTONIC seconds at which the
                                    latest message was received */
    struct gw_beat beat;         /* the heartbeat thread while serving */
    uint8_t *buf;     /* (buf_cap) pack buffer, owned */
    size_t buf_cap;
    /* the decoded plan (gw_wlink_decode_plan), reused */
    struct gw_entry *entries;
    size_t cap_entries;
    struct gw_delta *deltas;
    size_t cap_deltas;
    /* the encoded result (gw_wlink_encode_result), reused */
    Tangram__Worker__V1__SampledToken *tok, **tok_ptrs;
    Tangram__Worker__V1__SlotError *serr, **serr_ptrs;
    uint32_t *top_ids;  /* (cap_tok * GW_WORKER_MAX_LOGPROBS) */
    size_t cap_tok, cap_serr;
    Tangram__Worker__V1__SlotHeadLens *heads, **heads_ptrs;
    uint32_t *head_vals;  /* (cap_head_vals) every report's values */
    size_t cap_heads, cap_head_vals;
    Tangram__Worker__V1__PromptLogprobs *plp, **plp_ptrs;
    uint32_t *plp_u32; /* (cap_plp_u32) every record's ranks and ids */
    size_t cap_plp, cap_plp_u32;
    int extra_fd[GW_WLINK_EXTRA_FDS]; /* polled with the socket by
                             gw_wlink_recv, each when >= 0 (the host tier's
                             and the grammar pool's eventfds); -1 after
                             open */
};

struct gw_wlink_opts {
    int heartbeat_ms;       /* period of our heartbeats, >= 1 */
    int router_timeout_ms;  /* silence that ends the loop once the router
                               has spoken; <= 0: 10 x heartbeat_ms, at
                               least GW_WLINK_ROUTER_TIMEOUT_MIN_MS */
    volatile sig_atomic_t *stop; /* optional: nonzero ends the loop with
                                    GW_WLINK_EXIT_OK (signal handlers) */
    int comm_setup_timeout_ms;   /* longest wait for the CommSetup after the
                                    Hello (every rank must have loaded);
                                    <= 0: GW_WLINK_SETUP_TIMEOUT_MS_DEFAULT */
};

/* Creates the context and the DEALER socket (routing id "rank-<rank>",
 * linger 0) and connects it to `endpoint`. Returns 0, TG_EINVAL (bad
 * endpoint, detail from zmq) or TG_EIO; on failure *l is left closed. */
int gw_wlink_open(struct gw_wlink *l, const char *endpoint, int rank,
                  char *err, size_t errlen);

/* Closes the socket and the context; safe on a zeroed or closed link. */
void gw_wlink_close(struct gw_wlink *l);

/* Packs `m` (its version is set to the protocol's) and sends it as one
 * frame. Returns 0, TG_ENOMEM or TG_EIO. */
int gw_wlink_send(struct gw_wlink *l, GwWorkerMessage *m, char *err,
                  size_t errlen);

/* Waits up to timeout_ms (0: no wait, < 0: forever) for one message and
 * unpacks it into *out (caller frees with gw_wlink_msg_free). Returns 0,
 * TG_EAGAIN (nothing arrived, an l->extra_fd became readable, or a signal
 * interrupted the wait: check your stop flag), TG_EFORMAT (a message
 * arrived but does not parse; *out NULL), or TG_EIO (socket error). The
 * envelope's version is not checked here. */
int gw_wlink_recv(struct gw_wlink *l, int timeout_ms, GwWorkerMessage **out,
                  char *err, size_t errlen);

/* Frees a message from gw_wlink_recv; NULL is allowed. */
void gw_wlink_msg_free(GwWorkerMessage *m);

/* Decodes BatchPlan bp into *out. The entries and deltas arrays are the
 * link's (valid until the next decode); strings and id arrays borrow from
 * bp. Entries without sampling parameters get TG_SAMPLING_OFF. Returns
 * 0 or TG_ENOMEM. */
int gw_wlink_decode_plan(struct gw_wlink *l, const Tangram__Worker__V1__BatchPlan *bp,
                         struct gw_plan *out);

/* Encodes result r into *out (initialized here): the arrays are the
 * link's, valid until the next encode; strings borrow from r. Returns 0 or
 * TG_ENOMEM. */
int gw_wlink_encode_result(struct gw_wlink *l, const struct gw_result *r,
                           Tangram__Worker__V1__StepResult *out);

/* gw_wlink_encode_result's prompt log-probabilities (gw_wlink_plp.c):
 * r's plps as StepResult.prompt_logprobs (arrays the link's, floats
 * borrowed from r). Returns 0 or TG_ENOMEM. */
int gw_wlink__encode_plps(struct gw_wlink *l, const struct gw_result *r,
                          Tangram__Worker__V1__StepResult *out);

/* The host tier (DESIGN.md §4.10, gw_wlink_tier.c). A TierCommand's ops
 * are checked and queued on w's tier (gw_host_tier_submit); ops that
 * finished go back to the router in one TierReport every loop turn and
 * right before each StepResult. The serve loop polls the tier's eventfd
 * with the socket, so a copy that completes while the worker is idle is
 * reported at once, and one that completes during a step just ahead of
 * that step's result (the router's next plan then sees it). */

/* Queues the ops of `cmd` (a command of another version is refused: the
 * loop ends with GW_WLINK_EXIT_PROTOCOL). Returns -1 to keep serving, or
 * the exit status. */
int gw_wlink__tier_command(struct gw_wlink *l, struct gw_worker *w,
                           const Tangram__Worker__V1__TierCommand *cmd);

/* Sends one TierReport with the ops the tier finished since the last one
 * (none: nothing sent). Returns -1 to keep serving, or the exit status
 * (the socket failed). */
int gw_wlink__tier_flush(struct gw_wlink *l, struct gw_worker *w);

/* Structured outputs' prepares (DESIGN.md §4.11, gw_wlink_grammar.c,
 * proto GrammarCommand / GrammarReport; rank 0 only). A GrammarCommand's
 * prepares are pinned (gw_grammar_pin: queued on the compile pool) and
 * its releases unpinned, in that order; the prepares whose fetch ended go
 * back in GrammarReports every loop turn and right before each
 * StepResult, never from inside a step. The serve loop polls the pool's
 * eventfd with the socket, so a grammar that becomes ready while the
 * worker is idle is reported at once. */

/* Pins and releases what `cmd` says (another version ends the loop with
 * GW_WLINK_EXIT_PROTOCOL; on a rank other than 0 the command is ignored
 * with a warning). Returns -1 to keep serving, or the exit status. */
int gw_wlink__grammar_command(struct gw_wlink *l, struct gw_worker *w,
                              const Tangram__Worker__V1__GrammarCommand *cmd);

/* Sends the outcomes of the prepares taken since the last call, in
 * GrammarReports (none: nothing sent). Returns -1 to keep serving, or the
 * exit status (the socket failed). */
int gw_wlink__grammar_flush(struct gw_wlink *l, struct gw_worker *w);

/* The worker's main loop described above. Returns an enum gw_wlink_exit
 * value (the process's exit status). */
int gw_wlink_serve(struct gw_wlink *l, struct gw_worker *w,
                   const struct gw_wlink_opts *o);

#endif /* GW_WLINK_H */
