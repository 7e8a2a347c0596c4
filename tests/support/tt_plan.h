/*
 * tt_plan.h — building worker plans (gpu_worker/step/gw_plan.h) in tests the way
 * the router does: a request's page accounting (kv_seq) and what has been
 * handed to the worker so far, page deltas for the rows that grew, and
 * plan entries. Used by the worker tests (one process) and the
 * tensor-parallel tests (forked ranks, which cannot use cmocka asserts),
 * so every function reports overflow by its return value instead of
 * asserting.
 */
#ifndef TT_PLAN_H
#define TT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_seq.h"
#include "gpu_worker/step/gw_plan.h"
#include "gpu_worker/serve/gw_worker.h"

#define TT_PLAN_SLOTS 8         /* entries (and frees) per plan */
#define TT_PLAN_CHUNK 64        /* tokens per entry */
#define TT_PLAN_MAX_DELTAS 64   /* page deltas per plan */
#define TT_PLAN_MAX_IDS 2048    /* page ids over all deltas */

/* One request as the router would track it. */
struct tt_req {
    struct kv_seq seq;
    int32_t *sent;      /* (rows) pages already handed to the worker */
    uint32_t slot;
    const int32_t *prompt;
    int n_prompt;
    int64_t pos;        /* tokens fed */
    int fresh;          /* the next entry starts the slot afresh */
};

/* A plan and the storage its pointers refer to. plan.entries is e,
 * plan.deltas is d, plan.frees is frees: set the counts in plan. */
struct tt_plan {
    struct gw_plan plan;
    struct gw_entry e[TT_PLAN_SLOTS];
    uint32_t tok[TT_PLAN_SLOTS][TT_PLAN_CHUNK];
    struct gw_delta d[TT_PLAN_MAX_DELTAS];
    uint32_t ids[TT_PLAN_MAX_IDS];
    size_t n_ids;
    uint32_t frees[TT_PLAN_SLOTS];
};

/* Empties *p into a plan of `step` (protocol version 1). */
void tt_plan_reset(struct tt_plan *p, uint64_t step);

/* Adds a delta for every row of r whose page list grew since last sent.
 * Returns 0, or -1 when the plan's delta or id storage is full. */
int tt_plan_deltas(struct tt_plan *p, struct tt_req *r,
                   const struct kv_layout *kv);

/* Adds an entry of `kind` (GW_ENTRY_PREFILL / GW_ENTRY_DECODE) feeding
 * toks[0..n) of r at r->pos (fresh when r->fresh, which it clears),
 * sampling greedily without logprobs (the caller may change the entry's
 * sampling). Returns the entry, or NULL when the plan is full or
 * n > TT_PLAN_CHUNK. */
struct gw_entry *tt_plan_entry(struct tt_plan *p, struct tt_req *r, int kind,
                               const int32_t *toks, int n, int sample);

/* Starts a request in `slot` with its prompt (borrowed). Returns 0, or
 * -1 (kv_seq_init failed or out of memory). */
int tt_req_init(struct tt_req *r, const struct kv_layout *kv, uint32_t slot,
                const int32_t *prompt, int n_prompt);

/* Returns r's pages to pool and frees it. */
void tt_req_free(struct tt_req *r, struct kv_pool *pool);

#endif /* TT_PLAN_H */
