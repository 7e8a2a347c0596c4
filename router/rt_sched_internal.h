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
    uint8_t *cut;             /* (T, rows) 1: a per-head commit shrank the
                                 row below what the worker holds; its next
                                 delta cuts it to sent first */
    int32_t slot;             /* -1 unless running */
    int fresh;                /* slot assigned since its last entry */
    struct rt_prefix_bounds bounds; /* its committed chunk boundaries, for
                                       partial multi-turn reuse */
    struct rt_sched_req *prev;      /* WAITING list links */
    struct rt_sched_req *next;
};

/* Returns the live request `id`, or NULL. */
struct rt_sched_req *rt_sched__find(const struct rt_sched *s, uint64_t id);

/* Returns 1 when the request is PREFILLING or DECODING. */
int rt_sched__running(const struct rt_sched_req *req);

/* rt_sched_heads.c: commits prefill entry `e` of live `req` on every rank,
 * with kv_seq_commit_heads where heads[head_of[rank]] reports it (checked
 * by rt_sched_check_heads) and kv_seq_commit elsewhere; counts the pages
 * given back and marks the rows to cut on the worker. head_of may be NULL
 * (no reports). */
void rt_sched__commit_chunk(struct rt_sched *s, struct rt_sched_req *req,
                            const struct rt_step_entry *e,
                            const struct rt_step_heads *heads,
                            const int32_t *head_of);

#endif /* RT_SCHED_INTERNAL_H */
