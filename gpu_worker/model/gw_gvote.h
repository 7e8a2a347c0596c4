/*
 * gw_gvote.h — GVote adaptive per-head key selection of one prefill chunk
 * (DESIGN.md §4.8), on host memory, shared by the forward passes.
 *
 * Per KV head h of a layer, for a chunk of n tokens at absolute positions
 * start .. start + n - 1:
 *   1. every query head q of h takes the chunk's last (real, post-RoPE)
 *      query q0, A0 = softmax_j(q0 . k_j * scale) over the chunk's n keys
 *      (fp32), sorts it descending (ties: earlier position) and sets
 *      B_q = (number of prefix sums strictly below p) + 1, at most n
 *      (prefix sums in double);
 *   2. S synthetic queries: X = the chunk's rows of q_proj's input (after
 *      the input RMSNorm); per channel mu = mean, sigma = sample std (n-1;
 *      0 when n = 1); x_s = mu + sigma * z_s with z_s standard normal
 *      (Box-Muller over splitmix64, one stream per (request seed, layer,
 *      chunk start)); q_s = q_proj(x_s) (+ bias, + q_norm) rotated by the
 *      averaged RoPE of positions t+1 .. t+n_f (t = position of the chunk's
 *      last token): cos and sin of each frequency averaged, applied as RoPE
 *      applies them;
 *   3. each (q, s) votes for its top-B_q keys by q_s . k_j (fp32 dot,
 *      ties: earlier position), each q also votes its real top-B_q set;
 *      U = union of the voted keys and the forced keys (§4.4);
 *   4. with k_cap the §4.3 keep count of the head's group: |U| <= k_cap
 *      keeps U, else the forced keys, then the keys of U with the most
 *      votes (ties: earlier position) up to k_cap.
 * Source: the GVote paper (2025: adaptive KV-cache budgets from the votes
 * of sampled future queries) for the synthetic-query and voting formulas;
 * every exact choice (ties, streams, the real query's vote) is DESIGN.md
 * §4.8's.
 *
 * One gw_gvote per thread (it owns scratch). Host memory only.
 */
#ifndef GW_GVOTE_H
#define GW_GVOTE_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_budget.h"
#include "gpu_worker/model/gw_model.h"
#include "kernels/tg_ops.h"

#define GW_GVOTE_P_DEFAULT 0.95   /* --gvote-p */
#define GW_GVOTE_SAMPLES_DEFAULT 8 /* --gvote-samples */
#define GW_GVOTE_FUTURE_DEFAULT 32 /* --gvote-future */
#define GW_GVOTE_MAX_SAMPLES 256
#define GW_GVOTE_MAX_FUTURE 65536

struct gw_gvote_params {
    double p;    /* nucleus mass of the real query, in (0, 1] */
    int samples; /* S synthetic queries per query head, >= 0 */
    int future;  /* n_f future positions averaged into the rotation, >= 1 */
};

/* The defaults of §4.8: p 0.95, S 8, n_f 32. */
struct gw_gvote_params gw_gvote_params_default(void);

/* Checks ranges; returns 0 or TG_EINVAL with the field named in err. */
int gw_gvote_params_check(const struct gw_gvote_params *p, char *err,
                          size_t errlen);

struct gw_gvote_pair {
    float v;
    int32_t i;
};

struct gw_gvote {
    struct gw_gvote_params par;
    int max_n;       /* largest chunk */
    float *xs;       /* (S, hidden) synthetic q_proj inputs */
    float *qs;       /* (S, Hq, d) synthetic queries */
    double *mu;      /* (hidden) */
    double *m2;      /* (hidden) */
    float *cs, *sn;  /* (d/2) averaged rotation */
    float *a;        /* (n) logits / probabilities of one query */
    int32_t *ord;    /* (n) key order of one query */
    int32_t *votes;  /* (n) votes of one KV head's keys */
    uint8_t *forced; /* (n) */
    struct gw_gvote_pair *pr; /* (n) sort scratch */
};

/* Sizes the scratch for chunks of up to max_n tokens of `md`. Returns 0,
 * TG_EINVAL (bad params) or TG_ENOMEM. Free with gw_gvote_free (safe on a
 * zeroed object). */
int gw_gvote_init(struct gw_gvote *g, const struct gw_model *md, int max_n,
                  const struct gw_gvote_params *par, char *err, size_t errlen);
void gw_gvote_free(struct gw_gvote *g);

/* Step 2's projection where q_proj's weight is not in host memory (the
 * CUDA runtime keeps it only on the device): run(ctx, layer, xs, S, qs)
 * writes xs W_q^T, without the bias, for the S rows of xs (S, hidden)
 * into qs (S, Hq*d) and returns 0 or an error code. */
struct gw_gvote_proj {
    int (*run)(void *ctx, int layer, const float *xs, int S, float *qs);
    void *ctx;
};

/* What one layer's selection needs. */
struct gw_gvote_chunk {
    const struct gw_layer *w;     /* the layer's host weights: wq (unless
                                     proj), bq and q_norm where the model
                                     has them */
    const struct gw_gvote_proj *proj; /* NULL: q_s = ops->gemm over w->wq
                                     (with w->bq); else proj, then w->bq
                                     added on the host */
    const float *x;               /* (n, hidden) q_proj's input rows */
    const float *q;               /* (n, Hq, d) real queries, post-RoPE */
    const float *k;               /* (n, Hkv, d) keys, post-RoPE */
    int n;                        /* chunk tokens, 1..max_n */
    int64_t start;                /* absolute position of row 0 */
    int layer;                    /* for the random stream */
    uint64_t seed;                /* the request's seed */
    const struct kv_forced_rule *rule;
    const int32_t *kcap;          /* (Hkv) §4.3 keep count of each head */
};

/* Selects the kept keys of every KV head of one chunk: keep[h] (<=
 * kcap[h]) keys, their chunk indices ascending in idx[h * n ..]. The
 * synthetic queries go through ops->gemm (or c->proj) and ops->rmsnorm on
 * `be`.
 * Returns 0, TG_EINVAL (shapes) or an op's error. */
int gw_gvote_select(struct gw_gvote *g, const struct gw_model *md,
                    const struct tg_ops *ops, struct tg_backend *be,
                    const struct gw_gvote_chunk *c, int32_t *keep,
                    int32_t *idx);

/* The random stream of (seed, layer, chunk start): standard normals by
 * Box-Muller over splitmix64. Exposed for tests. */
uint64_t gw_gvote_stream(uint64_t seed, int layer, int64_t start);
double gw_gvote_normal(uint64_t *state);

#endif /* GW_GVOTE_H */
