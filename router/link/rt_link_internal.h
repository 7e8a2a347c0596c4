/*
 * rt_link_internal.h — what rt_link.c (socket, loop, ranks, results),
 * rt_link_plan.c (BatchPlan building and sending) and rt_link_comm.c
 * (communicator set-up) share. Not a public interface: everything here
 * is private to the rt_link module.
 */
#ifndef RT_LINK_INTERNAL_H
#define RT_LINK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "router/link/rt_link.h"
#include "worker.pb-c.h"

typedef Tangram__Worker__V1__WorkerMessage wmsg_t;

#define PROTO_V1 TANGRAM__WORKER__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_1
#define RANK_OWED_MAX 8  /* abandoned steps a rank may still owe */

enum rank_state {
    RANK_DOWN = 0, /* never said Hello, or refused */
    RANK_ALIVE,
    RANK_DEAD,     /* declared dead; waits for a new Hello */
};

/* Watches a same-host worker process through a pidfd: readable when the
 * process exits, so a killed worker is noticed at once instead of after
 * the heartbeat deadline. Heap-allocated so that its close callback may
 * outlive the rank table. */
struct rt_link_pidwatch {
    uv_poll_t poll;
    struct rt_link *link;    /* NULL once detached */
    int rank;
    int fd;                  /* the pidfd */
};

struct rt_link_rank {
    enum rank_state state;
    struct rt_link_pidwatch *pw; /* same-host workers only, else NULL */
    uint64_t last_seen;      /* uv_now() of its last message, ms */
    uint64_t owed[RANK_OWED_MAX]; /* unanswered step ids, oldest first */
    int n_owed;
    uint32_t pid;            /* from its Hello: logs, and its beats
                                must carry it */
    uint64_t busy_step;      /* its last beat's step_id */
    uint32_t stalled_ms;     /* its last beat's stalled_ms */
    uint32_t pages_total;    /* from its Hello */
    uint32_t host_pages;     /* from its Hello: its host tier's pages */
    uint64_t page_bytes;     /* from its Hello's layout */
    int shutdown_sent;       /* a Shutdown went to this incarnation */
    int kill_pending;        /* a send failed: declare dead from the loop */
    int setup_sent;          /* this incarnation got its CommSetup */
    uint64_t setup_at;       /* uv_now() of that CommSetup, ms */
    int comm_ready;          /* it answered CommReady ok */
    char kill_reason[160];
};

/* Packs `msg` and sends it to routing id "rank-<rank>" without blocking.
 * Returns 0, or TG_EIO / TG_ENOMEM with detail in err. */
int rt_link__send_rank(struct rt_link *link, int rank, const wmsg_t *msg,
                       char *err, size_t errlen);

/* Schedules a drain of the socket (and the deaths of ranks marked
 * kill_pending) on the next loop iteration. */
void rt_link__kick(struct rt_link *link);

/* Declares an alive rank dead for `reason` (Shutdown to it, the step in
 * flight fails, on_dead, shared fate). The link may be closed after. */
void rt_link__declare_dead(struct rt_link *link, int rank, const char *reason);

/* Declares an alive rank dead because its process exited (no Shutdown:
 * its routing id may already belong to a new incarnation). */
void rt_link__declare_exited(struct rt_link *link, int rank);

/* rt_link_pidwatch.c: starts watching the process of a rank that connected
 * over ipc:// (the same host, so its pid is ours to watch); its exit
 * declares the rank dead at once. Without pidfd support the heartbeat
 * deadline remains the only detector. Replaces any earlier watch. */
void rt_link__pidwatch_start(struct rt_link *link, int rank, uint32_t pid);

/* Stops and releases the watch of `rank` (if any). */
void rt_link__pidwatch_stop(struct rt_link *link, int rank);

/* A rank declared dead while its process lives on (hung, or talking
 * nonsense) is killed, so that the supervisor restarts it: a stuck process
 * would never act on the Shutdown it was sent. No-op without a watch. */
void rt_link__pidwatch_kill(struct rt_link *link, int rank);

/* rt_link_comm.c: once every rank is alive, sends CommSetup to each rank
 * that has not had one in its incarnation; marks the link ready (and calls
 * on_ready) once every rank joined. The link may be closed after. */
void rt_link__advance_group(struct rt_link *link);

/* rt_link_heads.c: copies the head-length reports of rank `rank`'s ok
 * StepResult for the step in flight into the link's buffers. Returns 0, or
 * -1 with the reason in why (a report for a slot without an entry, twice
 * for one slot, with the wrong count or a length over INT32_MAX, from a
 * worker that keeps no head lengths, or no memory). */
int rt_link__collect_heads(struct rt_link *link, int rank,
                           const Tangram__Worker__V1__StepResult *sr,
                           char *why, size_t n);

/* rt_link_heads.c: points the reports at their values for on_result. */
void rt_link__heads_result(struct rt_link *link, struct rt_link_result *res);

/* rt_link_heads.c: frees the report buffers. */
void rt_link__heads_free(struct rt_link *link);

/* rt_link_plp.c: records what the prompt log-probabilities of the step's
 * entries must be (rt_link_send_plan, once the plan is sent). */
void rt_link__plp_expect(struct rt_link *link, const struct rt_step *step);

/* rt_link_plp.c: checks rank 0's PromptLogprobs records of an ok
 * StepResult against the entries that asked (each exactly once, its
 * first position, count, alternatives and ids) and points those entries'
 * res_tokens at them. Returns 0, or -1 with the reason in why. */
int rt_link__plp_result(struct rt_link *link,
                        const Tangram__Worker__V1__StepResult *sr, char *why,
                        size_t n);

/* rt_link_comm.c: handles a CommReady from alive rank `rank`. */
/* Checks that a message `what` from `rank` carries the protocol's version
 * and names that rank; otherwise declares the rank dead (the link may be
 * closed after) and returns -1. */
int rt_link__check_from(struct rt_link *link, int rank, const char *what,
                        uint32_t version, uint32_t msg_rank);

/* rt_link_grammar.c: a GrammarReport of alive `rank` (message still
 * owned by the caller): checked (version, rank 0, no empty entry: else
 * the rank is declared dead) and handed to on_grammar. */
void rt_link__on_grammar_report(struct rt_link *link, int rank,
                                const Tangram__Worker__V1__GrammarReport *gr);

/* rt_link_tier.c: a rank's TierReport (alive rank; message still owned
 * by the caller). Checks it and hands it to on_tier; a malformed one
 * declares the rank dead. */
void rt_link__on_tier_report(struct rt_link *link, int rank,
                             const Tangram__Worker__V1__TierReport *tr);

void rt_link__on_comm_ready(struct rt_link *link, int rank,
                            const Tangram__Worker__V1__CommReady *cr);

#endif /* RT_LINK_INTERNAL_H */
