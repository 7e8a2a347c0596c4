/*
 * rt_step.h — one scheduler step as plain data: what the scheduler
 * (router/core/rt_sched.h) plans and the link (rt_link.h) encodes for every
 * rank, the ranks' head-length reports it applies back, the events it hands
 * the server, and the host tier's copy ops the link sends after a plan.
 * Value types only; the scheduler owns and fills them.
 */
#ifndef RT_STEP_H
#define RT_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_sampling.h"

/* How a request ended. */
enum rt_sched_end {
    RT_SCHED_END_NONE = 0, /* still running */
    RT_SCHED_END_STOP,     /* the caller flagged a stop (EOS, stop string) */
    RT_SCHED_END_LENGTH,   /* max_tokens reached */
    RT_SCHED_END_ABORT,    /* rt_sched_abort */
    RT_SCHED_END_ERROR,    /* internal failure (out of memory, lost
                              worker) */
    RT_SCHED_END_KV,       /* the sequence outgrew a whole page pool and
                              can never run again: not a length the client
                              asked for (vLLM refuses such a context at
                              start-up; the router caps max_model_len to
                              rt_sched_max_tokens, so a request within it
                              does not get here). Maps to an error, never
                              to finish_reason "length". */
};

enum rt_step_kind {
    RT_STEP_PREFILL = 0, /* one chunk of the request's current turn */
    RT_STEP_DECODE,      /* the last sampled token, fed back */
    RT_STEP_FORK,        /* a parallel sample (n > 1) starts from the
                            prompt its group's first request prefills in
                            the same step: no tokens (n = 0), fresh, its
                            rows share that request's full pages (the
                            worker copies the partly filled last pages),
                            and it samples its first token from that
                            request's logits with its own seed */
};

struct rt_step_entry {
    uint64_t id;             /* request id */
    void *user;
    uint64_t serial;         /* the scheduler's submission serial */
    int32_t slot;            /* block-table slot in [0, max_num_seqs) */
    int32_t fresh;           /* 1: slot newly assigned, clear its rows
                                before applying the deltas */
    enum rt_step_kind kind;
    int64_t pos;             /* absolute position of the first token */
    int64_t n;               /* tokens: chunk length, or 1 for decode */
    const int32_t *tokens;   /* (n) token ids at [pos, pos + n); borrowed
                                until rt_sched_complete / abort */
    int32_t sample;          /* 1: sample the next token from the last
                                position (decode, or the turn's last
                                chunk) */
    const char *request_id;  /* the request's (borrowed like tokens) */
    const struct tg_sampling *sampling; /* the request's, checked by its
                                           front end (borrowed) */
    int64_t num_prompt;      /* the client's prompt length (penalties) */
    int64_t row_lens_off;    /* fresh entry adopting stored KV (pos > 0):
                                each rank's tokens per (layer, group) row
                                at row_lens[off + rank * L * G ..]; -1
                                otherwise */
    int32_t has_head_lens;   /* such an entry of a per-head scheduler: each
                                rank's head lengths at head_lens[
                                head_lens_off + rank * n_heads ..] */
    int64_t head_lens_off;
    int32_t fork_from;       /* RT_STEP_FORK: the slot of the request it
                                samples from (its last chunk comes earlier
                                in the step); -1 otherwise */
    const char *grammar;     /* fresh entry of a constrained request: its
                                spec text (common/grammar/gm_spec.h,
                                NUL-terminated, borrowed like tokens);
                                NULL otherwise */
    const int32_t *grammar_tokens; /* with grammar: the tokens it generated
                                before (n_grammar_tokens, borrowed) */
    int64_t n_grammar_tokens;
    uint64_t grammar_prepare; /* with grammar: the id rank 0 holds the
                                compiled grammar under (proto
                                GrammarPrepare) */
    int32_t prompt_lp;        /* RT_STEP_PREFILL: 1 asks rank 0 for the
                                log-probabilities of the positions the
                                chunk predicts (pos + 1 ..), with ranks
                                and prompt_top alternatives each (proto
                                PlanEntry.prompt_logprobs); 0: none */
    int32_t prompt_top;       /* with prompt_lp: 0 .. 20 */
    int32_t lp_next;          /* with prompt_lp: the token at pos + n (the
                                last row's target), or -1 */
    int64_t delta_begin;     /* its records: deltas[delta_begin ..
                                delta_end) */
    int64_t delta_end;
};

/* Pages appended to one (layer, group) row of one rank of an entry's slot. */
struct rt_step_delta {
    int32_t entry;           /* index into entries */
    int32_t rank;
    int32_t row;             /* l * G + g */
    int32_t first;           /* index within the row of the first new page
                                (the row's length before this delta, after
                                its cut) */
    int32_t n;               /* pages appended (may be 0 after a cut) */
    int32_t has_truncate;    /* cut the worker's row to truncate_to pages
                                first (pages a per-head commit gave back) */
    int32_t truncate_to;
    int64_t off;             /* ids at delta_ids[off .. off + n) */
};

/* Something the caller tells a client: a sampled token and/or an end. */
struct rt_sched_event {
    uint64_t id;
    void *user;
    int32_t token;                 /* sampled token id, or -1 */
    enum rt_sched_end finish;      /* RT_SCHED_END_NONE while running */
    int64_t prompt_tokens;         /* the client's prompt length */
    int64_t completion_tokens;     /* generated so far */
    int64_t cached_prompt_tokens;  /* prompt tokens reused at its first
                                      admission */
};

/* One step. Caller-owned storage; buffers grow as needed and are reused. */
struct rt_step {
    uint64_t step_id;              /* increasing; 0 = no step planned yet */
    int32_t n_entries;
    struct rt_step_entry *entries; /* (n_entries) decodes, then chunks */
    int64_t n_tokens;              /* sum of entries' n */
    int64_t n_deltas;
    struct rt_step_delta *deltas;  /* (n_deltas) grouped by entry */
    int64_t n_ids;
    int32_t *delta_ids;            /* (n_ids) page ids of the deltas */
    int32_t n_released;
    int32_t *released;             /* (n_released) slots vacated since the
                                      previous plan (finish, abort,
                                      preemption) */
    int64_t n_row_lens;
    int32_t *row_lens;             /* (n_row_lens) see entries' row_lens_off */
    int32_t n_heads;               /* per-head scheduler: L * Hkv of a rank,
                                      else 0 */
    int64_t n_head_lens;
    int32_t *head_lens;            /* (n_head_lens) see entries'
                                      head_lens_off */
    int32_t n_events;
    struct rt_sched_event *events; /* (n_events) from the last plan
                                      (requests ended while planning) or
                                      complete (tokens and ends) */
    int32_t cap_entries, cap_released, cap_events;
    int64_t cap_deltas, cap_ids, cap_row_lens, cap_head_lens;
};

/* One rank's report of the head lengths of one entry's slot after the
 * step (proto StepResult.head_lens): n values, L * Hkv of that rank,
 * layer-major in the rank's head order. Borrowed by the calls below. */
struct rt_step_heads {
    int32_t entry;           /* index into the step's entries */
    int32_t rank;
    const int32_t *head_lens;
    int64_t n;
};

enum rt_tier_kind {
    RT_TIER_OFFLOAD = 1, /* device pages -> host pages */
    RT_TIER_RESTORE = 2, /* host pages -> device pages */
};

/* One copy of one stored conversation between the device pools and the
 * host tier, every page of every rank (proto TierOp, one per rank). */
struct rt_tier_op {
    uint64_t id;             /* from 1, increasing, never reused */
    enum rt_tier_kind kind;
    int32_t pending;         /* ranks that have not reported it */
    uint8_t *reported;       /* (n_ranks) */
    int failed;              /* a rank failed it, or the offload it
                                follows failed */
    double issued;           /* the caller's clock at rt_sched_tier_take */
    uint64_t req;            /* restore: the request waiting for it */
    uint64_t after;          /* restore: the offload still in flight when
                                its entry was taken, or 0 */
    int64_t *off;            /* (n_ranks + 1) rank r's pages are
                                dev/host[off[r] .. off[r + 1]) */
    int32_t *dev;            /* device page ids, page i of the entry; the op
                                holds one ownership of each */
    int32_t *host;           /* host page ids, parallel to dev */
};

#endif /* RT_STEP_H */
