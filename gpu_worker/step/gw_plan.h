/*
 * gw_plan.h — one step in plain C, as the step loop runs it (gw_step.h):
 * the BatchPlan of proto/worker.proto decoded by the worker's link
 * (gpu_worker/serve/gw_wlink.c), or the one-entry plans of in-process
 * generation; the result a worker encodes back into a StepResult, what a
 * Hello announces. Nothing past the link sees protobuf.
 *
 * A token drawn (gw_token) and the group a CommSetup names
 * (gw_comm_setup) are the backend's (gpu_worker/backend/gw_backend.h).
 *
 * Strings and arrays borrowed by a decoded plan point into the message the
 * link received; they stay valid until the link receives the next
 * message. A result borrows from the worker (gw_worker_step) until its
 * next step.
 */
#ifndef GW_PLAN_H
#define GW_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_worker/backend/gw_backend.h" /* gw_token, gw_comm_setup */
#include "kernels/tg_ops.h"

enum gw_entry_kind {
    GW_ENTRY_PREFILL = 1, /* one prefill chunk (at most one per request) */
    GW_ENTRY_DECODE = 2,  /* one decode token */
    GW_ENTRY_FORK = 3,    /* a parallel sample of another slot's prompt
                             (proto/worker.proto ENTRY_KIND_FORK) */
};

struct gw_entry {
    uint32_t slot;              /* the request's row of the block tables */
    const char *request_id;     /* for errors; never NULL ("" at least) */
    enum gw_entry_kind kind;
    const uint32_t *tokens;     /* (n_tokens): the chunk, or one token */
    size_t n_tokens;
    uint32_t start_pos;         /* position of tokens[0] */
    struct tg_sampling sampling; /* how rank 0 draws the entry's token
                                    (its seed the request's RNG seed;
                                    bias arrays borrowed from the plan
                                    message); checked once per plan by the
                                    worker's plan check */
    int sample;                 /* draw the next token after this entry */
    int last_chunk;             /* prefill: the prompt ends here */
    uint32_t num_prompt_tokens; /* the client's prompt (penalties) */
    int fresh;                  /* clear the slot first (a new request, a
                                   restart after preemption, adopted KV) */
    const uint32_t *row_lens;   /* (n_row_lens) fresh entries adopting
                                   stored KV: tokens per (layer, group) row
                                   already written; 0 or L * G values */
    size_t n_row_lens;
    const uint32_t *head_lens;  /* (n_head_lens) with row_lens, for a
                                   worker keeping per-head lengths: tokens
                                   of each KV head (L * Hkv, layer-major,
                                   the rank's head order); or 0 values */
    size_t n_head_lens;
    uint32_t fork_from;         /* GW_ENTRY_FORK: the source slot */
    const char *grammar;        /* fresh entries of a constrained request:
                                   its spec text (gm_spec.h, grammar_len
                                   bytes); NULL: none */
    size_t grammar_len;
    const uint32_t *grammar_tokens; /* (n_grammar_tokens) with grammar: the
                                   tokens it generated before this entry */
    size_t n_grammar_tokens;
    uint64_t grammar_pin;       /* with grammar: the prepare id rank 0
                                   holds its grammar under (gw_grammar.h) */
    const int32_t *lp_targets;  /* PREFILL, in process only (the link
                                   never sets it; gw_engine): (n_tokens)
                                   the token following each, or -1, whose
                                   log-probability rank 0 writes into
                                   lp[i]; NULL: none */
    float *lp;                  /* with lp_targets: (n_tokens) */
    gw_logits_row_fn lp_row;    /* PREFILL, in process only, with
                                   lp_targets or prompt_lp: rank 0 shows
                                   it the raw logits of each row that
                                   predicts a position >= lp_row_from
                                   (gw_prefill_out.on_row); NULL: none */
    void *lp_row_ud;
    int64_t lp_row_from;
    int prompt_lp;              /* PREFILL (proto PlanEntry.prompt_logprobs):
                                   asks rank 0 for the log-probability of
                                   every position the chunk predicts
                                   (tokens[i + 1], and lp_next after the
                                   last one), its rank and prompt_top
                                   alternatives, listed in the step's
                                   plps; 0: none */
    int32_t prompt_top;         /* with prompt_lp: 0 .. GW_PROMPT_MAX_TOP */
    int32_t lp_next;            /* with prompt_lp: the token after the
                                   chunk, or -1 (none asked for there) */
};

/* The prompt log-probabilities of one prefill chunk (rank 0): values for
 * the positions first_pos .. first_pos + n - 1, each the log-probability
 * of the token at that position given all before it, its rank (1 + the
 * ids more likely) and the n_top most likely ids with theirs. Arrays
 * borrowed from the step until its next run. */
struct gw_prompt_lps {
    uint32_t slot;
    uint32_t first_pos; /* the chunk's start_pos + 1 */
    size_t n;
    const float *lp;     /* (n) */
    const int32_t *rank; /* (n) */
    int n_top;
    const int32_t *top_ids; /* (n, n_top) most likely first */
    const float *top_lps;   /* (n, n_top) */
};

/* Page ids appended to one (layer, group) row of a slot, after an optional
 * cut of the row to truncate_to pages. */
struct gw_delta {
    uint32_t slot, layer, group;
    const uint32_t *page_ids;   /* (n_page_ids) */
    size_t n_page_ids;
    int has_truncate;
    uint32_t truncate_to;
};

struct gw_plan {
    uint32_t version;           /* protocol version of the message */
    uint64_t step_id;           /* strictly increasing */
    const struct gw_entry *entries;
    size_t n_entries;
    const struct gw_delta *deltas;  /* applied before the entries run */
    size_t n_deltas;
    const uint32_t *frees;      /* slots vacated since the last plan */
    size_t n_frees;
};

/* A sampled entry whose request fails alone (its parameters could not be
 * used or its draw failed); the step stands for everything else. */
struct gw_slot_error {
    uint32_t slot;
    const char *error;
};

/* The per-head lengths of one slot after the step (a slot whose heads
 * kept counts the router cannot predict: an adaptive method's chunk). */
struct gw_head_lens {
    uint32_t slot;
    const int32_t *lens;        /* (n) L * Hkv, layer-major, rank order */
    size_t n;
};

struct gw_result {
    uint64_t step_id;
    int rank;
    int ok;
    const char *error;          /* "" when ok */
    const struct gw_token *tokens;  /* (n_tokens) rank 0, plan order */
    size_t n_tokens;
    const struct gw_slot_error *slot_errors; /* (n_slot_errors) rank 0 */
    size_t n_slot_errors;
    double step_seconds;        /* this rank's time in gw_worker_step: plan
                                   check, block tables, the forward pass,
                                   sampling */
    double backend_seconds;     /* of which inside the backend's calls
                                   (forward, compaction, page copies,
                                   sampling); the rest is host work */
    const struct gw_head_lens *head_lens; /* (n_head_lens) every rank */
    size_t n_head_lens;
    const struct gw_prompt_lps *plps; /* (n_plps) rank 0: the prefill
                                   entries that asked (prompt_lp) */
    size_t n_plps;
};

/* What a Hello announces (the link adds version and pid). */
struct gw_hello_info {
    int rank, world_size;
    int32_t pages_total;
    int num_layers, num_kv_heads, heads_per_group, groups_per_layer;
    int page_size, head_dim;
    int64_t page_bytes;
    const char *profile, *backend, *model;
    int max_model_len, vocab_size;
    int per_head_lens;          /* slots keep (and report) head lengths */
    int32_t host_pages_total;   /* pages of its host tier (§4.10), 0: none */
    const char *comm_kind;      /* "shm" or "nccl" */
    const uint8_t *comm_id;     /* rank 0's group id, or NULL */
    size_t comm_id_len;
};

#endif /* GW_PLAN_H */
