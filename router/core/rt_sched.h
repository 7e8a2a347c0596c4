/*
 * rt_sched.h — the router's budget-reserving scheduler: continuous batching
 * over the page accounting of every tensor-parallel rank, as pure logic with
 * no I/O (DESIGN.md §2, §4.3, §4.5).
 *
 * Requests arrive with their prompt token ids (rt_sched_submit) and wait in
 * a bounded FIFO. Each call of rt_sched_plan builds the next step (one
 * BatchPlan of §2), in this order:
 *   1. every DECODING request (oldest admission first) contributes one
 *      token; its decode pages are reserved (kv_seq_reserve_decode). When a
 *      pool runs dry, stored multi-turn entries are evicted first (LRU),
 *      then the most recently admitted running request is preempted by
 *      recompute: its pages are released and it goes back to the front of
 *      the queue with its generated tokens appended to its prompt;
 *   2. every PREFILLING request contributes its next chunk: exactly C
 *      tokens counted from the start of its turn (the last one may be
 *      shorter), at most one chunk per request per step;
 *   3. WAITING requests are admitted strictly FIFO while the pages of their
 *      whole prompt can be reserved on every rank (kv_seq_prompt_pages,
 *      exact §4.3 reservation; all ranks or none) and the limits hold: at
 *      most max_num_seqs running, at most max_batched_tokens tokens per
 *      step (decode tokens + chunk tokens). An admitted request's first
 *      chunk runs in the same step. A prompt that extends a stored
 *      sequence takes that entry's pages over (rt_prefix.h) and only its
 *      new suffix is prefilled, as a new turn.
 * Every step entry names the request's slot (a stable index in
 * [0, max_num_seqs) while it runs: the row of the worker's persistent
 * block tables), its kind, its token range and start position, its
 * sampling parameters and the page-table deltas: the page ids appended to
 * each (layer, group) row of each rank since the previous step. A slot
 * newly assigned has `fresh` set: the worker clears the slot's rows and
 * the deltas then carry every page the request holds (a reused entry's
 * history included), and the step carries each rank's row lengths of that
 * history. So a step is everything a plan needs: the link only encodes
 * it.
 *
 * Per-head lengths (cfg.per_head, an adaptive method such as gvote,
 * DESIGN.md §4.8): every request keeps each rank's head lengths
 * (kv_seq_heads_enable). A worker reports, for a slot whose heads kept
 * less than the §4.3 keep of its chunk, each head's length after the step
 * (struct rt_step_heads); rt_sched_complete_heads commits such a chunk with
 * kv_seq_commit_heads (rows = their longest heads, the unused reservation
 * back to the pool at once, counted in rt_sched_pages.released) instead of
 * kv_seq_commit, which stays the rule for a rank that reports nothing. A
 * row that lost pages so is cut on the worker by a delta of the request's
 * next entry (has_truncate: the worker's copy keeps the stale tail ids
 * until then, unread, since the slot runs nothing before that entry). A
 * fresh entry adopting stored KV carries every rank's head lengths too.
 *
 * Decode-time compression (cfg.trig, `--decode-compress trig`, DESIGN.md
 * §4.9; needs per_head). A request's decode KV is bounded per row by
 * kv_trig_row_bound (min(max_tokens, the group's largest cap + beta)), so
 * admission takes, on top of its prompt pages, the pages of that bound
 * (kv_trig_decode_pages, with the max_tokens left) and keeps them as
 * headroom: a request is admitted only while every pool's free and
 * cached pages cover its prompt, its own bound and what the running trig
 * requests may still take (bound_pages - used). So decode growth never
 * finds a pool short after the cache is evicted and a trig request is
 * never preempted for it (pages a compaction gives back stay its
 * headroom). rt_sched_submit refuses a request whose prompt plus bound
 * exceed a pool, and rt_sched_max_tokens no longer caps the context: the
 * sequence length does not bound the KV. A decode entry whose append makes
 * the turn's decoded count (positions past the end of its last prefill
 * chunk) a multiple of beta is a trigger step: each rank reports the
 * slot's head lengths (rt_step_heads), which must be exactly what the cap
 * rule leaves (kv_trig_head_after from the head lengths when the turn's
 * decode began); they are applied with kv_seq_compact_heads (rows shrink
 * to their longest heads, pages no longer filled go back at once, counted
 * in rt_sched_pages.released) and the rows are cut on the worker by the
 * next entry's deltas, as for gvote. A rank that reports nothing is taken
 * to follow the rule. Rewind boundaries are the committed prefill chunks
 * only, which precede every decode region compacted after them, so
 * multi-turn reuse never rewinds into a compacted region; a stored
 * conversation carries its compacted rows and heads whole and a new turn
 * continues at its true positions.
 *
 * The host tier (cfg.host_pages_per_rank > 0, `--kv-host-memory`,
 * DESIGN.md §4.10). Every rank then also has a pool of host page ids
 * (host_pools), and where the scheduler would drop a stored entry to free
 * device pages (admission, decode growth) it moves the entry to the host
 * instead when the host pools can take it (making room there by dropping
 * their least recent host entries; an entry larger than the tier is
 * dropped as before): kv_seq_move_pages swaps the entry's ids for host
 * ids, and an offload op (struct rt_tier_op) holds the device pages until
 * every rank reported the copy done (rt_sched_tier_done), only then do
 * they go back to the pool. Admission and decode count those pages as
 * coming: a request that needs them waits (the step goes on without it)
 * rather than evicting more. A prompt whose match is a host entry gets,
 * at admission, device pages for the entry's pages (counted with its
 * prompt's, §4.3) and a restore op that holds them too (one more owner,
 * kv_pool_ref) until every rank copied them in; the entry's host pages go
 * back to the host pools at once (the workers run their ops in order, so
 * a later op never overtakes this one's reads). The request takes its
 * slot but gets no entry until its restore is done: then its fresh entry
 * adopts the KV like any stored conversation, so only the new suffix is
 * prefilled, and usage counts the restored prefix as cached. A restore
 * that follows an offload still in flight (the entry was matched right
 * after it left) fails with it. A failed restore sends its request back to
 * the front of the queue to be prefilled from scratch. Ops go to the
 * workers through rt_sched_tier_take (the caller sends them after each
 * plan). A lost worker loses its tier: rt_sched_tier_lost.
 *
 * rt_sched_complete applies the step's results: commits the prefill chunks,
 * appends the sampled tokens, finishes requests on max_tokens or when the
 * caller flags a stop, and frees or stores (multi-turn cache) the pages of
 * finished requests at once. rt_sched_abort ends a request in any state
 * immediately. One step may be outstanding at a time.
 *
 * Positions: a request's token sequence is prompt + generated tokens and
 * token i always sits at absolute position i (reused history included), so
 * an entry's token range is also its position range.
 *
 * Not thread-safe: one owner (the router loop thread).
 */
#ifndef RT_SCHED_H
#define RT_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_hmap.h"
#include "common/base/tg_list.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/kv/kv_trig.h"
#include "router/core/rt_prefix.h"
#include "router/link/rt_step.h"

enum rt_sched_state {
    RT_SCHED_WAITING = 0, /* queued, holds no pages */
    RT_SCHED_PREFILLING,  /* admitted, pages reserved, turn not yet run */
    RT_SCHED_DECODING,    /* prompt done, one token per step */
    RT_SCHED_FINISHED,    /* ended by stop or length (reported in events) */
    RT_SCHED_ABORTED,     /* ended by abort or error */
};

struct rt_sched_config {
    const struct kv_layout *layout; /* every rank's layout when layouts is
                                       NULL (T = 1, or ranks with equal
                                       budgets); borrowed, must outlive the
                                       scheduler */
    const struct kv_layout *const *layouts; /* (n_ranks) rank r's layout
                                       (pf_profile_rank of r: its own group
                                       budgets), or NULL; the array is
                                       copied, the layouts are borrowed
                                       like layout. All must agree on L, G, P
                                       and C, so rows (L * G) and chunk
                                       boundaries match across ranks */
    int n_ranks;                    /* T >= 1, one page pool each */
    int32_t pages_per_rank;         /* pages in each rank's pool, >= 1 */
    int max_num_seqs;               /* running requests, >= 1 */
    int max_batched_tokens;         /* tokens per step, >= prefill chunk C
                                       so that any chunk fits a step */
    int max_queued;                 /* WAITING requests accepted, >= 1 */
    int debug_track;                /* nonzero: pools check every push for
                                       double frees (tests) */
    int per_head;                   /* nonzero: requests keep per-head
                                       lengths (an adaptive method; the
                                       layouts need head maps) */
    int32_t host_pages_per_rank;    /* pages of each rank's host tier
                                       (§4.10, the smallest any worker
                                       announced); 0: no tier */
    const struct kv_trig *const *trig; /* (n_ranks) rank r's decode caps
                                       (`--decode-compress trig`), or
                                       NULL: none. Needs per_head; the
                                       array is copied, the caps borrowed
                                       like the layouts */
};

struct rt_sched_request {
    uint64_t id;            /* unique among live requests */
    const char *request_id; /* the client-visible id, for worker logs and
                               errors (copied; NULL: "") */
    /* checked by the front end (rt_req_submit asserts it); the bias
     * arrays are borrowed, not copied: they stay valid until the request
     * leaves the scheduler (its end event, rt_sched_abort, rt_sched_free).
     * The router's request owns them (rt_request.sampling), so one copy
     * serves the parse, the scheduler and the plans. */
    struct tg_sampling sampling;
    const int32_t *prompt;  /* (n_prompt) token ids >= 0, copied */
    int64_t n_prompt;       /* >= 1 */
    int32_t max_tokens;     /* tokens to generate at most, >= 1 */
    const char *session_id; /* optional multi-turn key (copied), or NULL */
    uint64_t cache_scope;   /* multi-turn cache scope: only entries stored
                               by requests of the same scope are reused or
                               replaced (rt_prefix.h); 0 is a scope too */
    void *user;             /* caller's handle, echoed in entries/events */
    const char *grammar;    /* structured outputs: the constraint's spec
                               text (common/grammar/gm_spec.h, checked by
                               the front end; copied), or NULL. Its fresh
                               entries carry it with the tokens generated
                               so far (rt_step_entry.grammar). */
    uint64_t grammar_prepare; /* with grammar: the id of the prepare rank 0
                               holds it ready under (the caller submits a
                               constrained request only then), carried on
                               its fresh entries */
    uint64_t fork_of;       /* nonzero: a parallel sample (OpenAI n > 1)
                               of the WAITING, never admitted request
                               fork_of, submitted right after it with the
                               same prompt and no session. It is admitted
                               with that request, shares its prompt's
                               pages and draws its first token from the
                               same prefill (RT_STEP_FORK); from then on
                               it runs, ends and is preempted (alone, by
                               recompute) as a request of its own. Before
                               that, a preemption or end of either ends or
                               requeues the whole group. */
};

struct rt_sched_stats {
    int32_t running;               /* PREFILLING + DECODING */
    int32_t waiting;
    int64_t preemptions;           /* total, by recompute */
    int64_t cached_prompt_tokens;  /* total prompt tokens reused over all
                                      admissions */
    int64_t cache_entries;         /* stored multi-turn entries */
    int64_t cache_evictions;       /* entries dropped (pressure,
                                      replacement) */
    int64_t steps;                 /* non-empty steps planned */
};

/* Counters of the host tier (§4.10), totals since start. */
struct rt_sched_tier_stats {
    int64_t offloads;        /* entries moved to the host (ops issued) */
    int64_t restores;        /* restores completed on every rank */
    int64_t restore_failures; /* restores a rank failed (the request was
                                 prefilled from scratch) */
    int64_t restored_pages;  /* pages of the completed restores, all ranks */
    int64_t offload_failures; /* offloads a rank failed (entry dropped) */
    int64_t drops_lru;       /* host entries dropped to make room */
    int64_t drops_lost;      /* host entries lost with a worker */
    int64_t host_entries;    /* entries in the host tier now */
    int32_t ops_in_flight;   /* ops not yet reported by every rank */
};

struct rt_sched_pages {
    int64_t total;       /* pages in the pool */
    int64_t used;        /* pages taken (running + cached) */
    int64_t cached;      /* of which held by stored multi-turn entries */
    int64_t monolithic;  /* pages an all-heads layout would need for the
                            same sequences (§4.5) */
    int64_t released;    /* pages per-head commits gave back early, total
                            since start (tangram_kv_pages_released_total) */
    int64_t offloading;  /* of used: pages offloads still copy out (back
                            to the pool once every rank reported) */
    int64_t host_total;  /* pages of the rank's host tier (0: none) */
    int64_t host_used;   /* of which held by entries on the host */
};

/* An op every rank has reported (rt_sched_tier_done). */
struct rt_tier_event {
    enum rt_tier_kind kind;
    int ok;
    double issued;           /* as taken */
    int64_t pages;           /* over all ranks */
};

struct rt_sched_req_info {
    enum rt_sched_state state;
    int32_t slot;                  /* -1 unless running */
    int64_t prompt_tokens;         /* the client's prompt */
    int64_t n_tokens;              /* prompt + generated */
    int64_t completion_tokens;
    int32_t max_tokens;
    int64_t cached_prompt_tokens;  /* reused at the first admission */
    int64_t turn_start;            /* running: first position of its turn */
    int64_t committed;             /* running: positions of the turn done */
    int restoring;                 /* running: waits for its restore */
};

struct rt_sched_req; /* private to rt_sched.c */

/* The scheduler. Fields are private; use the functions below. */
struct rt_sched {
    struct rt_sched_config cfg;
    const struct kv_layout **lay;  /* (n_ranks) rank r's layout (borrowed
                                      pointers, owned array) */
    int32_t rows;                  /* L * G, the same on every rank */
    struct kv_pool *pools;         /* (n_ranks) */
    struct rt_prefix cache;
    struct tg_hmap map;     /* request id -> struct rt_sched_req *
                                      (rt_sched_map.c) */
    struct tg_list waiting; /* FIFO of WAITING requests */
    int32_t n_waiting;
    struct rt_sched_req **running; /* (max_num_seqs) by admission order */
    int32_t n_running;
    uint8_t *slot_used;            /* (max_num_seqs) */
    int32_t *released;             /* (max_num_seqs) slots vacated since the
                                      last plan */
    int32_t n_released;
    uint64_t next_serial;
    uint64_t next_step;
    uint64_t outstanding;          /* step id awaiting complete, or 0 */
    int64_t preemptions;
    int64_t cached_tokens;
    int64_t steps;
    uint64_t *bits;                /* scratch bitmap for validate */
    int64_t *released_pages;       /* (n_ranks) rt_sched_pages.released */
    int32_t *head_of;              /* per_head: (max_num_seqs, n_ranks)
                                      report index of each (entry, rank),
                                      complete's scratch */
    int32_t n_attached;            /* parallel samples attached to a
                                      waiting leader (in no list) */
    const struct kv_trig **trig;   /* (n_ranks) or NULL: cfg.trig */
    int32_t *trig_scratch;         /* (L * Hkv) predicted head lengths */
    /* the host tier (§4.10; rt_sched_tier.c) */
    struct kv_pool *host_pools;    /* (n_ranks) host page ids, or NULL */
    struct rt_tier_op **tier_ops;  /* (n_tier_ops) in flight, by id */
    int32_t n_tier_ops, cap_tier_ops;
    int32_t tier_unsent;           /* the last ones, not yet taken */
    uint64_t tier_next;            /* the next op's id */
    int64_t *tier_pending;         /* (n_ranks) device pages offloads hold */
    struct rt_sched_tier_stats tier_stats;
};

/* Initialises `s` with T pools of cfg->pages_per_rank pages each; every
 * kv_seq operation of rank r uses rank r's layout (cfg->layouts[r], or
 * cfg->layout for all). Returns 0, TG_EINVAL naming the bad field (also
 * rank layouts that disagree on L, G, P or C), or TG_ENOMEM; on failure
 * `s` is zeroed. The caller owns `s`; the layouts stay borrowed. */
int rt_sched_init(struct rt_sched *s, const struct rt_sched_config *cfg,
                  char *err, size_t errlen);

/* Ends every request without events, drops the cache and frees
 * everything. Safe on a zeroed or failed-init scheduler. */
void rt_sched_free(struct rt_sched *s);

/* Initialises an empty step (no allocation). */
void rt_step_init(struct rt_step *step);

/* Frees a step's buffers. Safe on a zeroed step. */
void rt_step_free(struct rt_step *step);

/* Queues a request (copying prompt and session id). Returns 0, TG_EINVAL
 * (empty prompt, negative token id, max_tokens < 1, NULL fields),
 * TG_ETOOBIG when the prompt's pages exceed a whole pool of some rank (it
 * could never run), TG_EEXIST when the id is live, or TG_EBUSY when max_queued
 * requests wait already (HTTP 429 / RESOURCE_EXHAUSTED). */
int rt_sched_submit(struct rt_sched *s, const struct rt_sched_request *req,
                    char *err, size_t errlen);

/* Builds the next step into `out` (see the top of this file), replacing
 * its previous contents. out->events lists requests ended while planning
 * (RT_SCHED_END_KV for a preempted sequence that outgrew the pool,
 * RT_SCHED_END_ERROR on allocation failure); they are gone afterwards. A
 * step with entries must be answered by rt_sched_complete before the next
 * plan; an empty step needs no answer. Returns 0, TG_EBUSY when a step is
 * outstanding, or TG_ENOMEM with nothing changed. */
int rt_sched_plan(struct rt_sched *s, struct rt_step *out, char *err,
                  size_t errlen);

/* Applies the results of the outstanding `step`: tokens[i] is the token
 * sampled for entry i (read only where entries[i].sample), stop (may be
 * NULL) flags entries whose token ends the request (the caller matched EOS
 * or a stop sequence). Entries of requests aborted since the plan are
 * skipped, and their tokens may be -1 (none was drawn). step->events is replaced by one event per sampled token
 * (with the finish reason when the request ended); ended requests are gone
 * afterwards and their pages freed or stored for multi-turn reuse. Returns
 * 0, or TG_EINVAL (not the outstanding step, a negative token) with
 * nothing changed. */
int rt_sched_complete(struct rt_sched *s, struct rt_step *step,
                      const int32_t *tokens, const uint8_t *stop, char *err,
                      size_t errlen);

/* Checks head-length reports against the outstanding `step` without
 * changing anything: every report names an entry of the step (reports of
 * requests aborted since the plan are ignored) that is a prefill chunk of
 * a request keeping per-head lengths or a trigger step (decode-time
 * compression, exactly the cap rule's lengths), a rank in range, at most one report
 * per (entry, rank), and lengths that fit the chunk's reservation
 * (kv_seq_heads_fit: L * Hkv values, no head shorter than before or longer
 * than its row's §4.3 keep allows). Returns 0 or TG_EPROTO naming the
 * rank, slot and head: the worker's accounting and the router's disagree,
 * to be handled like any malformed result. */
int rt_sched_check_heads(const struct rt_sched *s, const struct rt_step *step,
                         const struct rt_step_heads *heads, int32_t n_heads,
                         char *err, size_t errlen);

/* rt_sched_complete with the workers' head-length reports (may be NULL
 * with n_heads 0): a reported prefill chunk commits with
 * kv_seq_commit_heads on that rank. The reports are checked first
 * (rt_sched_check_heads); a failure returns TG_EPROTO with nothing
 * changed. */
int rt_sched_complete_heads(struct rt_sched *s, struct rt_step *step,
                            const int32_t *tokens, const uint8_t *stop,
                            const struct rt_step_heads *heads,
                            int32_t n_heads, char *err, size_t errlen);

/* Ends request `id` in any state at once: its pages go back to the pools
 * (nothing is stored), its slot is released, no event is produced. Returns
 * 0 or TG_ENOTFOUND. */
int rt_sched_abort(struct rt_sched *s, uint64_t id);

/* For a failed step or a lost worker: ends every running request with
 * RT_SCHED_END_ERROR (events in step->events), drops the device entries of
 * the multi-turn cache (the workers' KV is gone or unknown) and forgets
 * the outstanding step. WAITING requests stay queued, and so do requests
 * waiting for a restore (their copy is the host tier's business: done, or
 * lost with the worker, rt_sched_tier_lost). Returns 0 or TG_ENOMEM
 * (nothing changed). */
int rt_sched_fail_running(struct rt_sched *s, struct rt_step *step);

/* Drops every stored multi-turn entry, returning its pages. */
void rt_sched_drop_cache(struct rt_sched *s);

/* ---- the host tier (§4.10, rt_sched_tier.c) ----------------------------- */

/* The ops created since the last call (by rt_sched_plan), in id order, for
 * the caller to send to every rank: *ops points to n of them, each stamped
 * with issued = now (the caller's clock, seconds). Borrowed until the op
 * ends (rt_sched_tier_done, rt_sched_tier_lost). Returns n. */
int32_t rt_sched_tier_take(struct rt_sched *s, double now,
                           struct rt_tier_op *const **ops);

/* Rank `rank` reports op `id` completed (ok) or failed. When every rank has
 * reported, the op ends: an offload's device pages go back to the pools
 * (a failed offload's entry is dropped, and a restore taken from it
 * fails too); a restore's pages stay with its request alone, which is
 * planned from the next step on, or (failed) goes back to the front of the
 * queue holding nothing, to be prefilled from scratch. *ev (may be NULL)
 * then describes the op. Returns 1 when the op ended, 0 while ranks are
 * still to report, TG_ENOTFOUND for an op not in flight (a report from
 * before a worker was lost: ignore it) or TG_EPROTO for a rank out of
 * range or reporting twice. */
int rt_sched_tier_done(struct rt_sched *s, int rank, uint64_t id, int ok,
                       struct rt_tier_event *ev);

/* A worker was lost, and with it its host tier (the others' are of no use
 * alone): every host entry is dropped (drops_lost), every op ends with its
 * device pages back in the pools, and requests waiting for a restore go
 * back to the front of the queue to be prefilled from scratch. No-op
 * without a tier. */
void rt_sched_tier_lost(struct rt_sched *s);

/* Fills *out with the host tier's counters. */
void rt_sched_get_tier(const struct rt_sched *s,
                       struct rt_sched_tier_stats *out);

/* The longest sequence (prompt plus generated tokens, the whole
 * conversation for a multi-turn request) that every rank's pool can hold
 * for one request alone, whatever its budgets: floor(pages / (L * G)) * P
 * per rank, the minimum over ranks. The bound assumes no key is dropped
 * (decode tokens are kept whole, and a turn of one token keeps that
 * token), so a request within it always runs to its own end once the
 * others have finished. The router clamps max_model_len to it. With
 * decode-time compression (cfg.trig) it is INT64_MAX: the KV no longer
 * grows with the sequence, and rt_sched_submit checks each request's
 * prompt plus its decode bound instead. */
int64_t rt_sched_max_tokens(const struct rt_sched *s);

/* Fills *out with the counters for metrics. */
void rt_sched_get_stats(const struct rt_sched *s, struct rt_sched_stats *out);

/* Fills *out with the page counters of `rank` (0 <= rank < T). */
void rt_sched_rank_pages(const struct rt_sched *s, int rank,
                         struct rt_sched_pages *out);

/* Fills *out for live request `id`. Returns 0 or TG_ENOTFOUND. */
int rt_sched_req_info(const struct rt_sched *s, uint64_t id,
                      struct rt_sched_req_info *out);

/* Returns the kv_seq of live request `id` on `rank` (borrowed, read only,
 * valid until the next plan, complete or abort), or NULL when the request
 * is unknown or holds no pages (WAITING). */
const struct kv_seq *rt_sched_req_seq(const struct rt_sched *s, uint64_t id,
                                      int rank);

/* Checks the invariants: every pool valid; pages used on each rank equal
 * the pages of running requests plus stored entries; no page owned twice
 * or both owned and free; running/waiting/slot bookkeeping consistent.
 * Returns 0, TG_EINTERNAL naming the first violation, or TG_ENOMEM.
 * O(pages + requests); for tests and debugging. */
int rt_sched_validate(struct rt_sched *s, char *err, size_t errlen);

#endif /* RT_SCHED_H */
