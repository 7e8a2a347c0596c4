/*
 * gw_backend.h — the worker runtime interface: what one worker rank asks
 * of its compute backend, as one table of functions with a CPU and a CUDA
 * implementation (gw_backend_cpu.c, gw_backend_cuda.c). The worker's plan
 * logic (gw_worker.c) calls only these, so it has no backend branches.
 *
 *   comm_id / comm_join  the tensor-parallel group (DESIGN.md §4.7): rank 0
 *                        names it (a shared-memory segment on the CPU, an
 *                        NCCL unique id on CUDA) for its Hello; every rank
 *                        joins what the router's CommSetup relays
 *   prefill              one chunk of one sequence with fused compression
 *                        (§4.3), logits of its last token into a row
 *   decode               one token of each of n sequences (§4.5, §4.6),
 *                        logits into consecutive rows
 *   sample               one token from a row (rank 0)
 *   copy_pages           page contents to other pages of the pool (a
 *                        parallel sample's private copy of a partly
 *                        filled page, proto ENTRY_KIND_FORK)
 *   compact              decode-time compression (§4.9) of n sequences
 *                        right after their trigger step (CPU: gw_trig
 *                        over the host pool; CUDA: kernels/cuda/trig.h,
 *                        one round of launches for the batch)
 *   comm_failed          the group is broken (a collective timed out)
 *   tier_*               the host tier of stored conversations (DESIGN.md
 *                        §4.10): its host slab (CPU: ordinary memory;
 *                        CUDA: pinned), and page copies between the pool
 *                        and the slab made on the tier's own thread beside
 *                        the step loop (CPU: memcpy; CUDA: cudaMemcpyAsync
 *                        on a copy stream after an event that marks where
 *                        the step loop stood when the copy was asked for)
 *
 * Logits rows. A step's logits live in the backend, addressed by row: the
 * worker gives each sampled prefill entry the next row, then the decode
 * batch the rows after. Rows are host memory (max_slots, V) on rank 0 of
 * the CPU backend; the CUDA backend may keep decode rows on the device and
 * draw them there (decode sees the draws it will be asked for, so it can
 * tell whether every one can be drawn on the device: no penalties, at
 * most GW_CUDA_MAX_TOP alternatives), and copies the others to the host.
 * Either way `sample` answers for any row. Whether logits are computed at
 * all (row >= 0, first_row >= 0) must be the same on every rank: the
 * vocab-parallel LM head gathers them collectively.
 *
 * Draws. Every backend draws in vLLM's order (penalties, temperature,
 * top-k, top-p, min-p) from an RNG stream keyed by the request's seed and
 * the index of the token drawn (seed + index * 0x9E3779B97F4A7C15 on the
 * host, splitmix64 (Steele, Lea & Flood 2014); a Philox stream keyed the
 * same way on the device), so a request sampled through plans, restarted
 * after preemption or run in process (gw_engine) draws the same tokens on
 * the host. Log-probabilities are of the raw logits.
 *
 * The sequences' pages are the router's (gw_seq, kv_seq mirrors); the
 * physical pool is the backend's. One thread per backend.
 */
#ifndef GW_BACKEND_H
#define GW_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_layout.h"
#include "common/profile/pf_profile.h"
#include "common/base/tg_config.h"
#include "gpu_worker/cpu/gw_comm.h"
#include "gpu_worker/model/gw_gvote.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/model/gw_seq.h"
#include "gpu_worker/model/gw_trig.h"
#include "kernels/cuda/compress.h" /* plain C: TG_CUDA_COMPRESS_MAX_CHUNK */
#include "kernels/tg_ops.h"

#define GW_BACKEND_MAX_TOP \
    TG_SAMPLING_MAX_TOP /* top alternatives of one draw */
/* Ranks of one tensor-parallel group and the default bound of a join or
 * collective wait, the same for every backend (the CPU group's). */
#define GW_BACKEND_MAX_RANKS GW_COMM_MAX_RANKS
#define GW_BACKEND_COMM_TIMEOUT_MS GW_COMM_DEFAULT_TIMEOUT_MS
/* Tokens of one prefill chunk the CUDA backend scores at most (its
 * scoring kernels' bound; every build knows it). */
#define GW_BACKEND_CUDA_MAX_CHUNK TG_CUDA_COMPRESS_MAX_CHUNK

enum gw_backend_kind {
    GW_BACKEND_CPU = 0,
    GW_BACKEND_CUDA = 1,
};

/* The kinds' names indexed by enum gw_backend_kind, NULL-terminated: the
 * choices of the tools' --backend flags (TG_CONFIG_ENUM). */
extern const char *const gw_backend_choices[3];

/* A token rank 0 drew. */
struct gw_token {
    uint32_t slot;
    int32_t token;
    float logprob; /* natural log, of the raw distribution */
    int n_top;
    const int32_t *top_ids; /* (n_top) most likely first */
    const float *top_lps;   /* (n_top) */
};

/* The group a CommSetup names (the worker's link decodes it). */
struct gw_comm_setup {
    uint32_t version;
    uint32_t world_size;
    const char *kind; /* never NULL ("" at least) */
    const uint8_t *id;
    size_t id_len;
};

/* One token to draw (rank 0). */
struct gw_draw {
    uint32_t slot;                       /* for messages */
    int row;                             /* the step's logits row */
    const struct tg_sampling *sampling;  /* checked by the caller; its
                                            seed is the request's RNG seed */
    uint64_t index;                      /* tokens it drew before */
    struct tg_sample_history hist;       /* for penalties (host) */
    const uint32_t *mask;                /* structured outputs: the ids
                                            allowed (bit i of mask[i >> 5]),
                                            applied before the draw and its
                                            log-probabilities; NULL: all */
};

struct gw_backend_cfg {
    const struct gw_model *model;        /* borrowed, outlives the backend */
    const struct kv_layout *layout;      /* borrowed */
    const struct pf_profile *profile;    /* borrowed: the rank's (splits) */
    enum tg_score_method method;         /* scoring of chunk keys */
    struct gw_gvote_params gvote;        /* with method gvote */
    const struct gw_trig_cfg *trig;      /* borrowed: decode-time
                                            compression (outlives the
                                            backend), or NULL */
    int max_slots;                       /* sequences, logits rows */
    int max_tokens;                      /* max(prefill chunk, max_slots) */
    int rank, world_size;
    int comm_timeout_ms;                 /* joins and collective waits;
                                            <= 0:
                                            GW_BACKEND_COMM_TIMEOUT_MS */
    int n_threads;                       /* host threads; <= 0: default */
    int64_t kv_pages;                    /* > 0: exactly this many pages */
    struct tg_config_amount kv_memory;   /* else: bytes or a fraction */
    int device;                          /* CUDA: ordinal (< 0: the rank) */
    int cuda_graphs;                     /* CUDA: capture decode graphs */
    int step_timeout_ms;                 /* CUDA, T > 1: bounded waits */
    int64_t host_tier_bytes;             /* --kv-host-memory of this rank:
                                            comes out of the host memory a
                                            CPU pool fraction is of */
    /* Calibration hooks of the in-process engine (gw_seq.h's
     * contracts, heads in the rank's order; NULL in a worker): every
     * backend calls them from its prefill chunks. */
    gw_on_scores_fn on_scores;
    void *on_scores_ud;
    gw_on_queries_fn on_queries;
    void *on_queries_ud;
};

struct gw_backend;

struct gw_backend_ops {
    const char *name;       /* "cpu", "cuda" */
    const char *comm_kind;  /* the Hello's comm_kind: "shm", "nccl" */
    /* Rank 0's group id for its Hello (*len 0 when none is needed), valid
     * for the backend's life. */
    void (*comm_id)(const struct gw_backend *b, const uint8_t **id,
                    size_t *len);
    /* Joins the group of a CommSetup (kind and id checked here; one rank
     * joins alone whatever the id). 0 or an error with the reason. */
    int (*comm_join)(struct gw_backend *b, const struct gw_comm_setup *cs,
                     char *err, size_t errlen);
    /* 1 once a collective failed: the peers are gone or out of step. */
    int (*comm_failed)(struct gw_backend *b);
    /* gw_backend_prefill's work with its host row resolved: a chunk of n
     * tokens of seq at seq->pos with what `out` asks (gw_prefill_out;
     * out->last_logits is the host row, or NULL off rank 0). */
    int (*prefill)(struct gw_backend *b, struct gw_seq *seq, const int32_t *ids,
                   int n, const struct gw_prefill_out *out, char *err,
                   size_t errlen);
    /* gw_backend_decode's work with its host rows resolved: `logits` is
     * host row first_row (NULL without logits or off rank 0), where the
     * batch's logits go unless the backend draws them itself. */
    int (*decode)(struct gw_backend *b, struct gw_seq *const *seqs,
                  const int32_t *ids, int n, int first_row, float *logits,
                  const struct gw_draw *draws, int n_draws, char *err,
                  size_t errlen);
    /* Draws d's token into *out (slot, token, logprob, n_top; top_ids and
     * top_lps are the caller's GW_BACKEND_MAX_TOP arrays, which out points
     * to). Rank 0, after the step's forward calls. A row with a
     * non-finite logit gives TG_ERANGE (gw_backend__nonfinite). */
    int (*sample)(struct gw_backend *b, const struct gw_draw *d,
                  struct gw_token *out, int32_t *top_ids, float *top_lps,
                  char *err, size_t errlen);
    /* Copies the content of pool page src[i] to page dst[i] for i < n
     * (every rank, its own pool), ordered after the forward calls made
     * before it and before those made after it. Ids must be distinct
     * pages of the pool, no dst among the srcs. 0, TG_EINVAL (an id
     * outside the pool) or TG_EDEVICE. */
    int (*copy_pages)(struct gw_backend *b, const int32_t *src,
                      const int32_t *dst, int n, char *err, size_t errlen);
    /* Decode-time compression (gw_forward_trig's contract) of the n
     * sequences, each right after the decode step that triggered it:
     * heads over their caps are compacted in place, hlen and len shrink;
     * *heads gets the heads compacted. 0, TG_EINVAL, TG_ENOMEM, or
     * TG_EUNSUPPORTED where the backend has no compaction. */
    int (*compact)(struct gw_backend *b, const struct gw_trig_cfg *c,
                   struct gw_seq *const *seqs, int n, int64_t *heads,
                   char *err, size_t errlen);
    /* The host tier (DESIGN.md §4.10; gw_host_tier.h drives these).
     * tier_alloc: `bytes` of host memory for the tier's pages (CPU:
     * ordinary; CUDA: pinned, and the copy stream), *base set; 0,
     * TG_ENOMEM or TG_EDEVICE. tier_release frees it (NULL: no-op). Main
     * thread, once each. */
    int (*tier_alloc)(struct gw_backend *b, size_t bytes, void **base,
                      char *err, size_t errlen);
    void (*tier_release)(struct gw_backend *b, void *base);
    /* Main thread, when a copy is asked for: *fence marks everything the
     * step loop queued so far, which the copy then follows (CUDA: an event
     * recorded on the compute stream; CPU: NULL, a step has completed
     * before the next message is read). 0 or TG_EDEVICE. */
    int (*tier_fence)(struct gw_backend *b, void **fence, char *err,
                      size_t errlen);
    /* Drops a fence no copy consumed. */
    void (*tier_fence_drop)(struct gw_backend *b, void *fence);
    /* The tier's copy thread: copies pool page dev[i] to host page
     * host[i] of `base` (to_host), or back, for i < n (ids checked by the
     * caller), after `fence`, and returns once the copies are complete.
     * Consumes the fence, also on failure. Runs while the step loop runs
     * on other pages. 0 or TG_EDEVICE. */
    int (*tier_copy)(struct gw_backend *b, void *base, int to_host,
                     const int32_t *dev, const int32_t *host, int n,
                     void *fence, char *err, size_t errlen);
    /* Frees the backend (and b itself). */
    void (*free)(struct gw_backend *b);
};

/* The fields every backend has; each implementation embeds it first. */
struct gw_backend {
    const struct gw_backend_ops *ops;
    struct gw_backend_cfg cfg;
    int32_t n_pages;         /* pages in the pool */
    int64_t page_bytes;      /* bytes of one page */
    float *logits;           /* (max_slots, V) host rows; rank 0 only */
    struct tg_backend *host; /* CPU ops context of the host sampler */
    struct gw_load_stats load; /* what loading the weights took: the
                                  model's host load (CPU), the device
                                  upload (CUDA) */
};

/* Creates the backend of `kind` for cfg (copied; the pointers it holds are
 * borrowed): sizes the pool (CPU: tg_hostmem.h; CUDA: the device memory
 * plan), loads what it needs and, on rank 0 of a group, names the group.
 * Weights: the CPU backend computes with cfg->model's host weights
 * (gw_model_load_weights; TG_EINVAL without them); the CUDA backend
 * streams them from the model's checkpoint into device memory itself
 * (gw_cuda_init), so its model needs only gw_model_open's shape.
 * Returns 0 with *out set, or TG_EUNSUPPORTED (a build without CUDA, a
 * shape the kernels lack), TG_ENODEV, TG_EINVAL, TG_ENOMEM (naming the
 * numbers) with the reason in err. */
int gw_backend_new(enum gw_backend_kind kind, const struct gw_backend_cfg *cfg,
                   struct gw_backend **out, char *err, size_t errlen);

/* Frees b; safe on NULL. */
void gw_backend_free(struct gw_backend *b);

/* Runs a chunk of n tokens of seq at seq->pos through b (gw_forward_prefill's
 * contract: rows must hold the pages; TG_ENOSPC otherwise before anything
 * changes), logits of its last token into logits row `row` (< 0: none;
 * written on rank 0). lp (NULL: no prompt log-probabilities) asks for
 * them as gw_prefill_out's lp fields say: lp_targets (n ids, -1 for none,
 * the same on every rank), lp[i] = log P(lp_targets[i] | tokens <= i) and
 * optionally ranks and alternatives (rank 0); its want_logits and
 * last_logits are ignored. */
int gw_backend_prefill(struct gw_backend *b, struct gw_seq *seq,
                       const int32_t *ids, int n, int row,
                       const struct gw_prefill_out *lp, char *err,
                       size_t errlen);

/* One token of each of n sequences through b (gw_forward_decode's
 * contract), logits into rows first_row .. first_row + n - 1 (first_row
 * < 0: none). draws[0 .. n_draws) are the rows of this batch rank 0 will
 * ask `sample` for (NULL/0 elsewhere), which a backend may draw where the
 * logits are. */
int gw_backend_decode(struct gw_backend *b, struct gw_seq *const *seqs,
                      const int32_t *ids, int n, int first_row,
                      const struct gw_draw *draws, int n_draws, char *err,
                      size_t errlen);

/* The two implementations (gw_backend_new picks one). */
int gw_backend_cpu_new(const struct gw_backend_cfg *cfg,
                       struct gw_backend **out, char *err, size_t errlen);
int gw_backend_cuda_new(const struct gw_backend_cfg *cfg,
                        struct gw_backend **out, char *err, size_t errlen);

/* ---- for implementations ---------------------------------------------- */

/* Fills the common part: cfg, the host logits rows (rank 0) and the host
 * sampler's context. Returns 0 or TG_ENOMEM. */
int gw_backend__base_init(struct gw_backend *b, const struct gw_backend_cfg *cfg,
                          char *err, size_t errlen);

/* Writes the error of a logits row whose first non-finite value is
 * `value` at token id `id` for `slot` into err; returns TG_ERANGE. Every
 * backend reports such a row this way: the worker turns it into a slot
 * error, which fails that request alone. */
int gw_backend__nonfinite(uint32_t slot, int64_t id, float value, char *err,
                          size_t errlen);

/* Frees the common part (not b). */
void gw_backend__base_free(struct gw_backend *b);

/* Draws d's token from host row d->row with the CPU sampler (the host
 * RNG stream of the top of this file). A row holding a non-finite logit
 * (NaN, +-inf: activations that overflowed, or a poisoned weight the
 * request's tokens reached) is not drawn from: TG_ERANGE, naming the
 * first such id (gw_backend__nonfinite). */
int gw_backend__host_sample(struct gw_backend *b, const struct gw_draw *d,
                            struct gw_token *out, int32_t *top_ids,
                            float *top_lps, char *err, size_t errlen);

#endif /* GW_BACKEND_H */
