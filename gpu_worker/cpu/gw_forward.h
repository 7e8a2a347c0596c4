/*
 * gw_forward.h — the CPU forward pass over ragged group pages with fused
 * per-chunk compression (DESIGN.md §4.3), over the ops table of
 * kernels/tg_ops.h. What it is handed and asked (the sequence view, a
 * chunk's outputs, the calibration hooks, a chunk's accounting) is
 * gpu_worker/model/gw_seq.h, which the CUDA forward pass shares.
 *
 * A prefill chunk of one sequence runs every layer: Q/K/V with RoPE at
 * absolute positions, attention over the sequence's retained history plus
 * the chunk's causal keys, then scoring of the chunk's keys, per-head top-k
 * selection with k = min(n, max(ceil(b[l][g] * n), f)) and appending of the
 * kept K/V to each head's group row. Decode steps batch one token of many
 * sequences and append to every head uncompressed.
 *
 * The runtime owns scratch activations and the physical KV pool; page ids
 * (which pages a sequence's rows use) are owned by the caller's page
 * accounting and handed in through struct gw_seq. One runtime per thread.
 *
 * Tensor parallelism (§4.7): with a model shard (gw_model_load_shard) and
 * a comm, the o_proj and down_proj GEMMs produce partial (m, hidden) sums
 * that gw_comm_allreduce_sum adds up before each residual add (Megatron's
 * row-parallel layers); o_proj's bias is on rank 0's shard only, so it is
 * added once. The LM head is vocab-parallel (gw_model.h): every rank
 * computes its (m, Vp) slice of the logits, columns past V padded with
 * -INFINITY, in blocks of GW_LP_BLOCK rows; gw_comm_gather collects the
 * (T, m, Vp) slices on rank 0, which transposes them into (m, V). So every
 * rank must run the same prefill and decode calls in the same order with
 * the same decision to compute logits (want_logits, lp_targets): their
 * collectives pair up. Only rank 0 receives logits; the others pass NULL
 * outputs but still take part. T = 1 runs the same code (the gather is a
 * copy). A collective that times out fails the call with TG_ETIMEDOUT.
 */
#ifndef GW_FORWARD_H
#define GW_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "gpu_worker/cpu/gw_comm.h"
#include "gpu_worker/model/gw_gvote.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/model/gw_seq.h"
#include "gpu_worker/model/gw_trig.h"
#include "kernels/tg_ops.h"

#define GW_LP_BLOCK 16     /* rows of logits materialized at once */


struct gw_forward_opts {
    enum tg_score_method method;  /* scoring of chunk keys */
    struct gw_gvote_params gvote; /* with TG_SCORE_GVOTE */
    int max_tokens;               /* largest chunk or decode batch */
    gw_on_scores_fn on_scores;    /* optional */
    void *on_scores_ud;
    gw_on_queries_fn on_queries;  /* optional */
    void *on_queries_ud;
    struct gw_comm *comm;         /* borrowed: the collectives of a sharded
                                     model (required then, joined by the
                                     first forward call); NULL or a
                                     one-rank comm with one rank */
};

struct gw_runtime {
    const struct gw_model *model;      /* borrowed */
    const struct kv_layout *layout; /* borrowed */
    const struct tg_ops *ops;          /* borrowed */
    struct tg_backend *be;             /* borrowed */
    struct gw_forward_opts opts;
    float *pool;     /* (n_pages, H_p, 2, P, d): owned */
    int32_t n_pages;
    /* scratch, owned, sized for opts.max_tokens rows */
    float *x, *h, *q, *k, *v, *att, *gate, *up, *scores;
    int32_t *pos, *idx, *keep;
    int32_t *keep_rows;         /* (L * n_groups) a chunk's keep per row */
    int32_t *kcap;              /* (Hkv) gvote's per-head cap */
    const int32_t **gp_scratch; /* (n_groups) */
    struct tg_kv_rows *rows;    /* (max_tokens) decode row views */
    const int32_t **rows_pages; /* (max_tokens * n_groups) */
    float *lp_logits;           /* (GW_LP_BLOCK, V) prompt-logprob
                                   scratch; rank 0 only */
    float *lg_local;            /* (lg_rows, Vp) this rank's logits slice */
    float *lg_all;              /* (T, lg_rows, Vp) gathered slices; rank 0
                                   only */
    int lg_rows;                /* min(GW_LP_BLOCK, max_tokens) */
    struct gw_gvote gv;         /* gvote scratch (method gvote only) */
    struct gw_trig_work trig;   /* decode-time compression scratch */
};

/* Creates a runtime with a KV pool of n_pages pages. Returns 0, TG_EINVAL
 * (layout does not match the model, or a sharded model without a comm)
 * or TG_ENOMEM (message gives the bytes). The comm may still be unjoined
 * (zeroed) here: it is checked against the model's world size and rank at
 * every forward call (TG_EINVAL there), so a worker can size its pool
 * before its group exists. Slots of max_tokens * hidden floats (and
 * min(GW_LP_BLOCK, max_tokens) * Vp for the logits) avoid extra pieces.
 * `model`, `layout`, `ops`, `be` and the comm must outlive the runtime. */
int gw_runtime_init(struct gw_runtime *rt, const struct gw_model *model,
                    const struct kv_layout *layout, const struct tg_ops *ops,
                    struct tg_backend *be, int32_t n_pages,
                    const struct gw_forward_opts *opts, char *err,
                    size_t errlen);

/* Frees what the runtime owns; safe on a zeroed runtime. */
void gw_runtime_free(struct gw_runtime *rt);

/* Runs one prefill chunk of n tokens (n <= max_tokens) of `seq` at
 * positions seq->pos .. seq->pos + n - 1, appends the kept K/V and advances
 * seq->pos and seq->len (and seq->hlen). With gvote a row may grow by less
 * than the §4.3 keep (never more): the caller compares seq->len with its
 * reservation and gives the difference back (kv_seq_commit_kept). Every row must already own the pages for what the
 * chunk keeps (kv_budget math); otherwise it returns TG_ENOSPC before
 * touching anything. `out` may be NULL. */
int gw_forward_prefill(struct gw_runtime *rt, struct gw_seq *seq,
                       const int32_t *ids, int n,
                       const struct gw_prefill_out *out, char *err,
                       size_t errlen);

/* Runs one decode token for each of n_seq sequences (ids[i] at
 * seqs[i]->pos), appending it to every head. With want_logits (the same on
 * every rank) every rank computes its vocab slice and rank 0 receives the
 * logits (n_seq, V) in `logits` (required on rank 0, TG_EINVAL when NULL;
 * ignored, may be NULL, on the others). Every row needs room for one more
 * token. */
int gw_forward_decode(struct gw_runtime *rt, struct gw_seq *const *seqs,
                      const int32_t *ids, int n_seq, int want_logits,
                      float *logits, char *err, size_t errlen);

/* Decode-time compression (§4.9) of n_seq sequences, each right after
 * the decode step that made its count of tokens decoded this turn a
 * multiple of c->every (the caller decides which): per layer, heads whose
 * decode region [dstart, hlen) exceeds the cap are compacted in place
 * (gw_trig_compact_layer, scores for the next position seq->pos), then
 * each row's len becomes its longest head. Needs hlen and dstart. The
 * caller hands the new lens to its page accounting (kv_seq_compact_rows)
 * and returns the freed tail pages. *heads gets the heads compacted.
 * Returns 0, TG_EINVAL or TG_ENOMEM. */
int gw_forward_trig(struct gw_runtime *rt, const struct gw_trig_cfg *c,
                    struct gw_seq *const *seqs, int n_seq, int64_t *heads,
                    char *err, size_t errlen);

#endif /* GW_FORWARD_H */
