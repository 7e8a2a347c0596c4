/*
 * gw_seq.h — what every forward pass (the CPU's, gpu_worker/cpu/gw_forward.h;
 * the device's, gpu_worker/cuda/gw_cuda.h) is handed and asked, so that
 * both speak one language and neither includes the other: one sequence's
 * KV as a forward pass sees it (gw_seq: its position, its rows' page ids
 * and fills, per-head lengths), what a prefill chunk should produce
 * besides the KV (gw_prefill_out), the calibration hooks a chunk calls,
 * and the accounting of one chunk (DESIGN.md §4.3 step 4: what each row
 * keeps, the room it needs, the advance), which exists once.
 *
 * The page ids are the caller's (a worker's slot, the engine's mirror of
 * its accounting); the physical pool is the forward pass's. Plain data
 * and pure functions; any thread.
 */
#ifndef GW_SEQ_H
#define GW_SEQ_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "common/kv/kv_seq.h"
#include "kernels/tg_ops.h"

/* One sequence's KV as the forward pass sees it. */
struct gw_seq {
    int64_t pos;                 /* tokens processed so far (next position) */
    int32_t *len;                /* (L, n_groups) tokens stored per row */
    const int32_t *const *pages; /* (L * n_groups) page ids of each row */
    const int32_t *n_pages;      /* (L * n_groups) pages available per row */
    const struct kv_seq *kv;     /* the rows' owner, whose slab, counts
                                    and epoch pages/n_pages/len view: the
                                    CUDA decode path keeps its block table
                                    (kv_table) in step with it. NULL where
                                    no block table is built (the CPU
                                    forward pass reads the rows above) */
    int32_t *hlen;               /* (L, Hkv) tokens held by each KV head
                                    (rank order), required with gvote,
                                    whose heads of one group keep
                                    different counts (len is then the
                                    longest head of the group); NULL for
                                    the other methods */
    uint64_t seed;               /* the request's seed: gvote's synthetic
                                    query stream */
    int32_t *slot_pos;           /* (L, Hkv, slot_cap) absolute position
                                    of each head's slot, written on every
                                    append (--dump-kept); or NULL */
    int32_t slot_cap;            /* slots per head in slot_pos */
    int32_t *dstart;             /* (L, Hkv) first slot of each head's
                                    decode region of the current turn
                                    (decode-time compression, §4.9: what
                                    decode appended after the turn's
                                    prefill); NULL without it */
};

/* Called once per layer of a prefill chunk with that layer's key scores
 * (before forced keys), for calibration. scores (Hkv, n). */
typedef void (*gw_on_scores_fn)(void *ud, int layer, const float *scores, int n,
                                int n_kv_heads);

/* Called once per layer of a prefill chunk with the chunk's pre-RoPE
 * queries (after q_norm where the model has one), for calibration of the
 * decode-time statistics (§4.9). q (n, Hq, d), heads in the runtime's
 * (rank) order. */
typedef void (*gw_on_queries_fn)(void *ud, int layer, const float *q, int n,
                                 int n_q_heads, int head_dim);

/* Called on rank 0 with the raw logits (vocab floats, host memory valid
 * during the call only) of one prefill row that predicts prompt position
 * pos (the chunk's start + row + 1), for callers that need the whole
 * next-token distribution (an exact KL divergence) rather than a few
 * values. Rows come in position order. */
typedef void (*gw_logits_row_fn)(void *ud, int64_t pos, const float *logits,
                                 int vocab);

/* What a prefill chunk should produce besides the KV. The decisions
 * (want_logits, lp_targets non-NULL) must be the same on every rank; the
 * outputs are written on rank 0 only (required there, TG_EINVAL when
 * missing) and ignored on the others (pass NULL). */
struct gw_prefill_out {
    int want_logits;           /* compute the logits after the last token */
    float *last_logits;        /* (V) those logits (rank 0) */
    const int32_t *lp_targets; /* (n) token following row i, or -1; NULL: no
                                  prompt logprobs. Needed on every rank
                                  (blocks without a target are skipped) */
    float *lp;                 /* (n) log P(lp_targets[i] | tokens <= i)
                                  (rank 0) */
    /* With lp_targets, optional (rank 0; NULL: not asked): each target's
     * rank (1 + the ids more likely), and top_ids / top_lps (n, n_top) the
     * n_top most likely ids after row i (logit desc, id asc) with their
     * log-probabilities, computed as lp is (the target's value equals its
     * own entry among them). Rows without a target are left untouched.
     * 0 <= n_top <= GW_PROMPT_MAX_TOP. */
    int32_t *rank;
    int n_top;
    int32_t *top_ids;
    float *top_lps;
    /* With lp_targets, optional (rank 0; NULL: none): on_row(row_ud, ...)
     * for every row with a target whose position is >= row_from, before
     * its values are computed. The CUDA backend then copies those rows'
     * blocks of logits to the host (V floats per row). */
    gw_logits_row_fn on_row;
    void *row_ud;
    int64_t row_from;
};

/* Alternatives per prompt position a prefill chunk returns at most
 * (gw_prefill_out.n_top; the API's bound, RT_OPENAI_MAX_LOGPROBS). */
#define GW_PROMPT_MAX_TOP 20

/* Returns 1 when `method` lets the heads of one group keep different
 * counts (gvote): the forward pass then needs gw_seq.hlen and its callers
 * must count per head (kv_seq heads); 0 for the methods that keep the
 * §4.3 count in every head. Pure. */
int gw_method_per_head(enum tg_score_method method);

/* Checks that every row of `seq` at layer l owns the pages for add[g]
 * more tokens (add: n_groups counts). Returns 0 or TG_ENOSPC naming the
 * layer, group and page counts. Pure. */
int gw_seq_room(const struct kv_layout *lay, const struct gw_seq *seq, int l,
                const int32_t *add, char *err, size_t errlen);

/* The accounting of one prefill chunk, shared by the CPU and CUDA forward
 * passes so that it exists once (§4.3 step 4): the chunk of n tokens at
 * seq->pos keeps keep[l * G + g] = min(n, max(ceil(b[l][g] * n), f))
 * tokens in row (l, g), f the chunk's forced keys (*forced). Checks first
 * that every row owns the pages for what it keeps; TG_ENOSPC (naming the
 * row) before anything changes otherwise. keep has L * G entries. */
int gw_chunk_plan(const struct kv_layout *lay, const struct gw_seq *seq, int n,
                  int32_t *keep, int *forced, char *err, size_t errlen);

/* After a chunk ran: every row grew by its keep, the position by n. */
void gw_chunk_advance(struct gw_seq *seq, const struct kv_layout *lay,
                      const int32_t *keep, int n);

#endif /* GW_SEQ_H */
