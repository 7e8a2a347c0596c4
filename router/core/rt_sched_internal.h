/*
 * rt_sched_internal.h — what rt_sched.c shares with rt_sched_query.c (the
 * read-only queries and the invariant check) and rt_sched_fork.c (parallel
 * samples). Not for other modules. Loop thread, as the scheduler.
 */
#ifndef RT_SCHED_INTERNAL_H
#define RT_SCHED_INTERNAL_H

#include "router/core/rt_sched.h"

struct rt_sched_req {
    uint64_t id;
    uint64_t serial;
    void *user;
    char *session;            /* owned copy, or NULL */
    uint64_t scope;           /* multi-turn cache scope (rt_prefix.h) */
    char *request_id;         /* owned copy ("" at least) */
    struct tg_sampling sampling; /* bias arrays borrowed from the caller
                                    (rt_sched_request.sampling) */
    char *grammar;            /* owned spec text, or NULL (no constraint) */
    uint64_t grammar_prepare; /* its prepare id on rank 0 */
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
    /* Decode-time compression (s->trig): the bound of §4.9 and where the
     * current turn's decode began. */
    int64_t *bound_pages;           /* (T) pages it may hold at most on
                                       each rank until it ends or its next
                                       admission: its pages at admission
                                       plus kv_trig_decode_pages */
    int32_t *dstart;                /* (T, L * Hkv) head lengths when its
                                       turn's decode began */
    int64_t dbase;                  /* position where it began */
    uint64_t restoring;             /* the restore op it waits for before
                                       its first entry (§4.10), or 0 */
    struct tg_list_node wait_link;  /* in s->waiting while WAITING */
};

/* Returns the live request `id`, or NULL. */
struct rt_sched_req *rt_sched__find(const struct rt_sched *s, uint64_t id);
/* rt_sched_map.c: make the map with room for `live` requests (0 or
 * TG_ENOMEM), enter a request (its id not yet present; the map has room
 * for every live request) and remove the one of `id` (present). */
int rt_sched__map_init(struct rt_sched *s, int64_t live);
void rt_sched__map_put(struct rt_sched *s, struct rt_sched_req *req);
void rt_sched__map_del(struct rt_sched *s, uint64_t id);

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

/* ---- rt_sched_trig.c: decode-time compression (§4.9) ---- */

/* Pages the decode of a request with max_tokens tokens left may take on
 * `rank` beyond its pages at the end of its prefill (0 without trig). */
int64_t rt_sched__trig_extra(const struct rt_sched *s, int rank,
                             int64_t max_tokens);

/* Pages the running trig requests may still take on `rank`: the sum of
 * bound_pages - used pages (the headroom admission keeps free). */
int64_t rt_sched__trig_headroom(const struct rt_sched *s, int rank);

/* After req's reservation at admission: its bound on every rank. 0 or
 * TG_ENOMEM. No-op without trig. */
int rt_sched__trig_admitted(struct rt_sched *s, struct rt_sched_req *req);

/* req's turn has committed its prefill (or its fork): its decode region
 * starts at every head's present length. */
void rt_sched__trig_decode_begin(struct rt_sched *s, struct rt_sched_req *req);

/* 1 when decode entry e of req is a trigger step (its append makes the
 * tokens decoded this turn a multiple of beta). */
int rt_sched__trig_fires(const struct rt_sched *s,
                         const struct rt_sched_req *req,
                         const struct rt_step_entry *e);

/* Checks rank h->rank's report for decode entry e of req: a trigger step,
 * and exactly the cap rule's lengths. 0 or TG_EPROTO. */
int rt_sched__trig_check(const struct rt_sched *s,
                         const struct rt_sched_req *req,
                         const struct rt_step_entry *e,
                         const struct rt_step_heads *h, char *err,
                         size_t errlen);

/* Applies a trigger step of req on every rank (the report, or the rule
 * where a rank reported nothing): kv_seq_compact_heads, pages counted in
 * released, rows marked to cut on the worker. */
void rt_sched__trig_compact(struct rt_sched *s, struct rt_sched_req *req,
                            const struct rt_step_heads *heads,
                            const int32_t *head_of);

/* rt_sched_heads.c: after rank `rank`'s rows of req gave pages back, the
 * worker's rows still hold what was sent; marks every row holding fewer
 * pages than sent to be cut back in the request's next entry (a truncate
 * delta) and lowers its sent count. */
void rt_sched__mark_cuts(struct rt_sched *s, struct rt_sched_req *req,
                         int rank);

/* ---- rt_sched.c helpers used by rt_sched_fork.c and rt_sched_complete.c ---- */

/* Grows *buf (of elem-byte elements, capacity *cap) to hold `need`,
 * doubling; 0 or TG_ENOMEM (then unchanged). */

/* Appends an event for `req` to step (room reserved when the step was
 * planned) and returns it. */
struct rt_sched_event *rt_sched__push_event(struct rt_step *step,
                                            const struct rt_sched_req *req,
                                            int32_t token,
                                            enum rt_sched_end finish);

/* Ends `req`: an event into `ev_step` when non-NULL, its slot released,
 * its pages stored for multi-turn reuse (STOP / LENGTH with KV held) or
 * given back, and the request freed (with its group's unforked samples). */
void rt_sched__retire(struct rt_sched *s, struct rt_sched_req *req,
                      enum rt_sched_end finish, struct rt_step *ev_step);

/* Removes a running request from the running list and vacates its slot. */
void rt_sched__running_remove(struct rt_sched *s, struct rt_sched_req *req);

/* Gives every page req holds back to the pools (one owner each). */
void rt_sched__release_pages(struct rt_sched *s, struct rt_sched_req *req);


/* Room for the token an entry of `req` samples; 0 or TG_ENOMEM. */
int rt_sched__token_room(struct rt_sched_req *req);

/* Page ids the slot lacks now plus `extra` pages per rank still to come. */
int64_t rt_sched__unsent_ids(const struct rt_sched *s,
                             const struct rt_sched_req *req, int64_t extra);

/* Appends an entry for `req` with the deltas of every row (room made by
 * rt_sched.c's delta_room). */
void rt_sched__add_entry(struct rt_sched *s, struct rt_step *out,
                         struct rt_sched_req *req, enum rt_step_kind kind,
                         int64_t pos, int64_t n, int sample);

/* Preemption by recompute: req (a running request, or the group it
 * belongs to) gives its pages back and waits at the front of the queue. */
void rt_sched__preempt(struct rt_sched *s, struct rt_sched_req *req);

/* ---- rt_sched_tier.c: the host tier (§4.10) ---- */

/* Host pools for cfg.host_pages_per_rank > 0 (none otherwise). 0,
 * TG_EINVAL or TG_ENOMEM. */
int rt_sched__tier_init(struct rt_sched *s, char *err, size_t errlen);

/* Frees the ops and the host pools (the cache must be freed first). */
void rt_sched__tier_free(struct rt_sched *s);

/* Device pages of `rank` that offloads in flight will give back. */
int64_t rt_sched__tier_pending(const struct rt_sched *s, int rank);

/* Frees device pages: the least recent device entry other than `keep`
 * goes to the host tier when it can (an offload op; its pages come back
 * when every rank reported), else it is dropped (its pages back at once).
 * Returns 1 when an entry left the device, 0 when none is left. */
int rt_sched__tier_evict(struct rt_sched *s,
                         const struct rt_prefix_entry *keep);

/* Makes `need` device pages free on `rank` by moving stored entries other
 * than `keep` off the device (rt_sched__tier_evict). Pages offloads are
 * still copying out are waited for, not made up by evicting more: returns
 * 0 when the pages are free now, TG_EAGAIN when the caller must wait (for
 * those copies, or because nothing is left to evict: an entry sharing
 * pages with a running sample frees fewer than it holds). */
int rt_sched__make_room(struct rt_sched *s, int rank, int64_t need,
                        const struct rt_prefix_entry *keep);

/* 1 when the next decode token of running `req`, which some pool cannot
 * give now, is covered on every rank by free pages plus the pages
 * offloads will give back within a step or so: the token waits for them
 * rather than the cache emptying further or a request being preempted. */
int rt_sched__tier_decode_waits(const struct rt_sched *s,
                                const struct rt_sched_req *req);

/* Admission of `req` whose match `m` is a host entry (its prompt's pages
 * are reserved after this): m's seqs and boundaries become req's, moved to
 * device pages, and a restore op is queued; req waits for it. The free
 * device pages must cover m's on every rank. 0, or TG_ENOMEM with nothing
 * changed. */
int rt_sched__tier_restore(struct rt_sched *s, struct rt_sched_req *req,
                           struct rt_prefix_entry *m);

/* ---- rt_sched_fork.c: parallel samples (OpenAI n > 1) ---- */

/* Checks that `req` (fork_of set) may join its leader: a waiting request
 * never admitted, leading no other group, with the same prompt and no
 * session, and the grown group fits max_num_seqs and a pool (the prompt's
 * pages plus one private page per row per other sample). Returns 0 with
 * *leader set, TG_EINVAL or TG_ETOOBIG (err filled). */
int rt_sched__sample_check(struct rt_sched *s,
                           const struct rt_sched_request *req,
                           struct rt_sched_req **leader, char *err,
                           size_t errlen);

/* Attaches the new sample q to leader (q is in no list); 0 or TG_ENOMEM
 * (nothing changed). */
int rt_sched__sample_attach(struct rt_sched *s, struct rt_sched_req *leader,
                            struct rt_sched_req *q);

/* Takes an attached (or admitted, not yet forked) sample off its leader's
 * list. */
void rt_sched__sample_detach(struct rt_sched *s, struct rt_sched_req *req);

/* Before `req` (or its leader, when req is a sample not yet forked) is
 * preempted: its samples leave the running list, give back their shares
 * and wait attached again. Returns the request to preempt (the leader). */
struct rt_sched_req *rt_sched__group_requeue(struct rt_sched *s,
                                             struct rt_sched_req *req);

/* Room in `out` for the fork entries of req's samples when req's first
 * chunk is also its last; ids_one bounds the page ids of one member.
 * 0 or TG_ENOMEM (do not admit now). */
int rt_sched__forks_admit_room(struct rt_sched *s, struct rt_step *out,
                               struct rt_sched_req *req, int64_t ids_one);

/* The same for a running leader's last chunk; 0 or TG_ENOMEM. */
int rt_sched__forks_room(struct rt_sched *s, struct rt_step *out,
                         struct rt_sched_req *leader);

/* After the leader's last chunk entry: one fork entry per sample, and the
 * group dissolves into ordinary requests. */
void rt_sched__plan_forks(struct rt_sched *s, struct rt_step *out,
                          struct rt_sched_req *leader);

/* At the leader's admission (its reservation made): every attached sample
 * forks it on every rank and takes a slot. 0 or TG_ENOMEM (the caller
 * ends the group). */
int rt_sched__admit_samples(struct rt_sched *s, struct rt_sched_req *leader,
                            int64_t start);

#endif /* RT_SCHED_INTERNAL_H */
