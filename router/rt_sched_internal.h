/*
 * rt_sched_internal.h — what rt_sched.c shares with rt_sched_query.c (the
 * read-only queries and the invariant check). Not for other modules.
 */
#ifndef RT_SCHED_INTERNAL_H
#define RT_SCHED_INTERNAL_H

#include "router/rt_sched.h"

struct rt_sched_req {
    uint64_t id;
    uint64_t serial;
    void *user;
    char *session;            /* owned copy, or NULL */
    uint64_t scope;           /* multi-turn cache scope (rt_prefix.h) */
    char *request_id;         /* owned copy ("" at least) */
    struct rt_step_sampling sampling;
    int32_t *tokens;          /* (cap) prompt + generated, token i at
                                 position i */
    int64_t n_tokens;
    int64_t cap;              /* grows in plan (token_room), never beyond
                                 client prompt + max_tokens, so a huge
                                 max_tokens costs nothing up front */
    int64_t n_prompt;         /* the client's prompt length */
    int32_t max_tokens;
    int32_t n_generated;
    enum rt_sched_state state;
    int admitted;             /* admitted at least once */
    int64_t cached;           /* tokens reused at the first admission */
    struct kv_seq *seqs;      /* (T) zeroed until first admission */
    int32_t *sent;            /* (T, rows) pages already in the slot's
                                 block-table rows on the worker */
    int32_t slot;             /* -1 unless running */
    int fresh;                /* slot assigned since its last entry */
    struct rt_prefix_bounds bounds; /* its committed chunk boundaries, for
                                       partial multi-turn reuse */
    /* Parallel samples (OpenAI n > 1). A group's first request (the
     * leader) waits in the queue with its other samples attached (they
     * are in no list); at its admission they are forked from its
     * reservation (kv_seq_fork) and take slots, and in the step of its
     * last chunk they get fork entries, after which every sample is an
     * ordinary request. */
    struct rt_sched_req *leader;    /* an attached sample: its leader */
    struct rt_sched_req **sibs;     /* a leader: its attached samples */
    int32_t n_sibs, cap_sibs;
    int fork_pending;               /* admitted, forked, fork entry not yet
                                       planned */
    int is_sample;                  /* a parallel sample other than the
                                       first: never stored for multi-turn
                                       reuse */
    struct rt_sched_req *prev;      /* WAITING list links */
    struct rt_sched_req *next;
};

/* Returns the live request `id`, or NULL. */
struct rt_sched_req *rt_sched__find(const struct rt_sched *s, uint64_t id);

/* Returns 1 when the request is PREFILLING or DECODING. */
int rt_sched__running(const struct rt_sched_req *req);

#endif /* RT_SCHED_INTERNAL_H */
