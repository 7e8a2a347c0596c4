/*
 * gw_cuda.h — the forward pass on the CUDA backend (DESIGN.md §6): the
 * same prefill-chunk and decode semantics as gw_forward.h, with bf16
 * weights, activations and KV pages on one device, fp32 accumulation, and
 * the kernels of kernels/cuda/.
 *
 * One layer of m rows (prefill: one chunk of one sequence; decode: one
 * token of each of m sequences):
 *   x (fp32 residual) --rmsnorm(+ residual add of the previous block)--> h
 *   q, k, v = h W^T + b   (cuBLASLt, bf16 out)
 *   q, k <- RoPE (with Qwen3's q/k norm fused)
 *   prefill: tg_cuda_prefill_attn over the sequence's ragged history and
 *            the causal chunk, then the scoring of score_qa.h/compress.h,
 *            per-head top-k and the append of the kept K/V into the
 *            group pages (§4.3);
 *   decode:  tg_cuda_decode_append of every head's new K/V, then
 *            tg_cuda_decode_attn driven by the static split map (§4.6);
 *   part = att Wo^T (+ bo) in fp32, all-reduced over the ranks (NCCL);
 *   x += part; h = rmsnorm(x); gate|up = h [Wg;Wu]^T (one fused GEMM);
 *   mlp = silu(gate) * up; part = mlp Wd^T in fp32, all-reduced.
 * After the last layer x += part; h = rmsnorm(x) and the LM head gives fp32
 * logits. With T > 1 ranks each hold a vocabulary slice of the LM head
 * (gw_model.h) and an NCCL all-gather assembles the logits; rank 0
 * reorders them into (rows, V) on the host.
 *
 * Block tables (§4.5): the CSR of the sequences a call runs — rows
 * (sequence, layer, group), page ids and token counts — is built in
 * pinned host memory and copied to the device; kernels read it there.
 * The decode table persists across steps: while the batch keeps its
 * sequences (gw_seq pointer and epoch), a step only scatters the page ids
 * appended since the last one into spare slots and re-sends the token
 * counts, so the host work per step is O(rows), not O(pages). The split map
 * (S[l][g], computed by the caller with pf_split_map from the occupancy
 * API's N_CTA, tg_cuda_decode_attn_n_cta) is uploaded once at init.
 *
 * CUDA graphs: with opts.graphs, a decode batch of n sequences runs the
 * graph captured for the smallest bucket >= n (1, 2, 4, 8, 16, 24, 32, 48,
 * 64, then multiples of 32 up to max_seqs). The batch is padded with dummy
 * sequences whose single row per group points at a scratch page beyond the
 * pool, so the padded rows write and read only that page. A graph is
 * captured on first use of its bucket (after one eager warm-up run of the
 * bucket, which also settles cuBLASLt's plan cache); inputs (ids,
 * positions, the block table) live at fixed device addresses, copied in
 * before each launch. Buckets are padded only up to max_seqs.
 *
 * Sampling: a decode's logits either go back to the host (the worker's
 * CPU sampler: penalties, prefill rows) or stay on the device for
 * gw_cuda_sample (penalty-free rows: only tokens and log-probabilities
 * cross); see gw_worker.h for which rows take which path.
 *
 * Memory is planned at init (gw_mem.h): weights, activations, the
 * kernels' workspaces, staging and the pool sized from --kv-pages /
 * --kv-memory against cudaMemGetInfo; a plan that does not fit fails
 * before the large allocations with TG_ENOMEM naming the numbers.
 *
 * Per-head lengths (opts.per_head, gw_cuda_heads.c): with gvote or
 * decode-time compression a group's heads hold different counts
 * (gw_seq.hlen; the row's len is its longest head). Each prefill uploads
 * the sequence's (L, Hkv) head counts and each decode step the batch's
 * (plus the step's token) to fixed device buffers, and prefill attention,
 * the chunk append, the decode append and decode attention read a head's
 * own count. gvote's selection (gw_gvote.h) runs on the host: per layer
 * the chunk's normed input, queries and keys come back as fp32, the
 * synthetic inputs go up as bf16 and are projected by the device's q_proj
 * (one GEMM with fp32 output; the host holds no copy of the weights, only
 * each layer's q bias and q_norm, read back from the slab at init), and
 * the chosen indices go up for the append. Decode-time compaction
 * (gw_cuda_compact) runs the kernels of kernels/cuda/trig.h.
 *
 * Every call synchronises its stream before returning (the caller's host
 * arrays and the pinned staging are reused by the next call) and checks
 * the KV append's fault flag. Calibration hooks (opts.on_scores,
 * opts.on_queries; gw_cuda_hooks.c) see what the CPU forward pass shows
 * its hooks, from the device: a prefill chunk's key scores per layer
 * (scored even where the chunk keeps every key) and its normed, not yet
 * rotated queries, both as fp32 host arrays in the rank's head order; each
 * costs a copy and a wait per layer, so only calibration sets them.
 * Functions exist in CUDA builds (TANGRAM_CUDA); one
 * thread per runtime, which owns the current device for its life, except
 * the host tier's copies (gw_cuda_tier_copy), which run on the tier's
 * thread and touch only their copy stream and pages.
 */
#ifndef GW_CUDA_H
#define GW_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "common/kv/kv_table.h"
#include "common/base/tg_config.h"
#include "gpu_worker/cuda/gw_mem.h"
#include "gpu_worker/cuda/gw_wslab.h"
#include "gpu_worker/model/gw_gvote.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/model/gw_seq.h"
#include "gpu_worker/model/gw_trig.h"
#include "kernels/cuda/sample.h" /* plain C: struct tg_cuda_sample_params */

#define GW_CUDA_MAX_BUCKETS 32
#define GW_CUDA_LP_BLOCK 64 /* prompt-logprob rows per LM-head GEMM */
#define GW_CUDA_MAX_TOP 20  /* top logprobs per row sampled on the device */
#define GW_CUDA_MAX_BIAS 8192 /* logit-bias entries per device-sampled batch
                                 (all rows together); more: host sampler */
#define GW_CUDA_BOUNCE_BYTES ((size_t)16 << 20) /* each of the two pinned
                                 buffers the weight upload alternates */


struct tg_nccl;
struct tg_cuda_gemm;

#define GW_CUDA_ROW_SLACK 8 /* spare page-id slots per decode table row */

/* One block table: CSR over rows (indptr, page ids, pages, token counts)
 * in device buffers at fixed addresses and their pinned host mirrors. */
struct gw_cuda_table {
    int64_t cap_rows, cap_ids;
    int32_t *indptr, *indices, *npages, *lens;         /* device */
    int32_t *h_indptr, *h_indices, *h_npages, *h_lens; /* pinned: (cap_rows
                                       + 1), (cap_ids), (cap_rows + 1) x2 */
};

struct tg_cuda_sampler;

struct gw_cuda_opts {
    int device;                    /* CUDA device ordinal */
    enum tg_score_method method;   /* scoring of chunk keys */
    int max_chunk;                 /* largest prefill chunk, 1..2048 */
    int max_seqs;                  /* largest decode batch */
    int64_t kv_pages;              /* > 0: exactly this many pages */
    struct tg_config_amount kv_memory; /* else: bytes or fraction */
    uint64_t reserve_bytes;        /* 0: 1 GiB kept for the runtime */
    int step_timeout_ms;           /* T > 1: a call waiting longer for its
                                      stream aborts the NCCL group (a dead
                                      peer); <= 0: 120 s */
    int graphs;                    /* capture decode as CUDA graphs; read
                                      at every decode call, so it may be
                                      switched between calls (benchmarks
                                      compare both on one runtime) */
    const int *splits;             /* (L, n_groups) split map S[l][g] */
    int per_head;                  /* the slots keep per-head lengths
                                      (gw_seq.hlen: gvote, decode-time
                                      compression): every call uploads
                                      them and the kernels read each
                                      head's own count */
    struct gw_gvote_params gvote;  /* with method gvote */
    const struct tg_ops *host_ops; /* gvote: the host ops and context its
                                      synthetic queries run on (borrowed) */
    struct tg_backend *host_be;
    const struct gw_trig_cfg *trig; /* decode-time compression (borrowed,
                                      outlives the runtime), or NULL */
    gw_on_scores_fn on_scores;     /* calibration: a prefill chunk's key
                                      scores per layer (Hkv, n), or NULL */
    void *on_scores_ud;
    gw_on_queries_fn on_queries;   /* calibration: its pre-RoPE queries
                                      (n, Hq, d) per layer, or NULL */
    void *on_queries_ud;
    struct tg_nccl *nccl;          /* borrowed; a shard of T > 1 ranks
                                      needs it before its first forward
                                      call (the worker sets it when it
                                      joins; TG_EPROTO until then) */
};

/* Device copies of one layer's weights (bf16 unless noted). */
struct gw_cuda_layer {
    uint16_t *attn_norm;        /* (hidden) */
    uint16_t *wq, *wk, *wv;     /* (Hq*d | Hkv*d, hidden) */
    uint16_t *bq, *bk, *bv;     /* (Hq*d | Hkv*d) or NULL */
    uint16_t *q_norm, *k_norm;  /* (d) or NULL */
    uint16_t *wo;               /* (hidden, Hq*d) */
    float *bo;                  /* fp32 (hidden) or NULL */
    uint16_t *ffn_norm;         /* (hidden) */
    uint16_t *w_gu;             /* (2F, hidden): gate rows then up rows */
    uint16_t *w_down;           /* (hidden, F) */
};

struct gw_cuda {
    const struct gw_model *model;      /* borrowed (host copy) */
    const struct kv_layout *layout; /* borrowed */
    struct gw_cuda_opts opts;
    void *stream;                      /* cudaStream_t, owned */
    void *tier_stream;                 /* cudaStream_t of the host tier's
                                          copies (gw_cuda_tier.c), owned,
                                          or NULL */
    struct tg_cuda_gemm *gemm;         /* owned */
    struct gw_mem_plan mem;            /* what init planned */
    int n_cta;                         /* unused by the runtime; for logs */

    void *wslab;                       /* device, owns all weights */
    struct gw_wslab ws;                /* its layout (gw_wslab.h) */
    struct gw_load_stats load;         /* what filling it took */
    struct gw_cuda_layer *layers;      /* host (L) */
    uint16_t *embed;                   /* (V, hidden) */
    uint16_t *final_norm;              /* (hidden) */
    uint16_t *lm_head;                 /* (lm_rows, hidden) */
    int lm_rows;                       /* V, or the padded slice Vp */
    float *inv_freq;                   /* fp32 (d/2) */
    int32_t *head_group, *head_slot;   /* device (L, Hkv) */

    uint16_t *pool;                    /* (n_pages + 1, H_p, 2, P, d); the
                                          last page is the padding scratch */
    int32_t n_pages;                   /* usable pages */
    int max_rows;                      /* max(max_chunk, max_seqs) */

    /* activations (device) */
    float *x, *part;                   /* fp32 (max_rows, hidden) */
    uint16_t *h;                       /* (max_rows, hidden) */
    uint16_t *q, *att;                 /* (max_rows, Hq*d) */
    uint16_t *k, *v;                   /* (max_rows, Hkv*d) */
    uint16_t *gu;                      /* (max_rows, 2F) */
    uint16_t *mlp;                     /* (max_rows, F) */
    float *logits;                     /* (logit_rows, lm_rows) */
    float *gathered;                   /* (T, logit_rows, lm_rows) or NULL */
    int logit_rows;                    /* max(max_seqs, GW_CUDA_LP_BLOCK) */
    float *scores;                     /* (Hkv, max_chunk) */
    int32_t *idx;                      /* (Hkv, max_chunk) */
    void *cmp_ws;                      /* scoring workspace */
    size_t cmp_ws_bytes;
    float *dec_ws;                     /* decode split partials */
    size_t dec_ws_bytes;
    int32_t *ids_d, *pos_d, *tgt_d;    /* (max_rows) */
    float *lp_d;                       /* (GW_CUDA_LP_BLOCK) */
    int32_t *rank_d;                   /* (GW_CUDA_LP_BLOCK) rank 0: the
                                          API's prompt ranks */
    int32_t *ptop_ids_d;               /* (GW_CUDA_LP_BLOCK,
                                          GW_PROMPT_MAX_TOP) rank 0 */
    float *ptop_lps_d;                 /* likewise */
    int32_t *fault_d;                  /* (1) */

    /* block tables (§4.5) at fixed device addresses, with pinned mirrors:
     * `dec` for decode batches (rows (sequence, layer, group), each row
     * with GW_CUDA_ROW_SLACK spare id slots, kept across steps: when a
     * batch holds the same sequences (same gw_seq and epoch) as the last
     * one, only the page ids appended since are scattered into place and
     * the lengths re-sent), `pre` for the sequence of a prefill chunk */
    struct gw_cuda_table dec, pre;
    struct kv_table dec_kv;            /* the host CSR `dec` copies
                                          (kv_table.h: padded, tracked,
                                          decode lengths, padding slots on
                                          the scratch page) */
    struct kv_table pre_kv;            /* the host CSR of a prefill */
    const struct kv_seq **dec_seqs;    /* (max_seqs) a batch's sequences */
    int32_t *keep_rows;                /* (L * G) a prefill chunk's keep per
                                          row (gw_chunk_plan) */
    int32_t *sc_pos, *sc_val;          /* device (cap_rows) scatter */
    int32_t *h_sc_pos, *h_sc_val;      /* pinned mirrors */
    int64_t table_builds, table_deltas; /* full uploads / delta steps */
    int64_t table_scattered;           /* page ids sent by delta steps */
    int32_t *p_ids, *p_pos, *p_fault;  /* pinned (max_rows), (1) */
    float *p_logits;                   /* pinned (T, logit_rows, lm_rows) */
    float *p_lp;                       /* pinned (GW_CUDA_LP_BLOCK) */
    int32_t *p_rank, *p_ptop_ids;      /* pinned mirrors of rank_d, */
    float *p_ptop_lps;                 /* ptop_ids_d and ptop_lps_d */
    float *lp_host;                    /* (GW_CUDA_LP_BLOCK, V), T > 1 or
                                          whole rows asked (on_row) */

    struct tg_cuda_split_map *splits;  /* owned */

    /* device sampling (rank 0): the last decode's logits stay on the
     * device when the caller passes no host buffer */
    struct tg_cuda_sampler *sampler;   /* owned; NULL on ranks > 0 */
    float *full;                       /* (logit_rows, V) T > 1 rank 0:
                                          the unsharded logits */
    int dev_rows;                      /* rows of device logits ready */
    int32_t *s_tok;                    /* device (max_seqs) */
    float *s_lp;                       /* device (max_seqs) */
    int32_t *s_bad;                    /* device (max_seqs): first
                                          non-finite id per row, or -1 */
    float *s_bad_val;                  /* device (max_seqs): its logit */
    int32_t *p_bad;                    /* pinned mirrors */
    float *p_bad_val;
    int32_t *s_top_ids;                /* device (max_seqs, MAX_TOP) */
    float *s_top_lps;                  /* device (max_seqs, MAX_TOP) */
    int32_t *p_tok, *p_top_ids;        /* pinned mirrors */
    float *p_slp, *p_top_lps;
    int32_t *s_bias_rows, *s_bias_ids; /* device (GW_CUDA_MAX_BIAS) */
    float *s_bias_vals;                /* device (GW_CUDA_MAX_BIAS) */
    int32_t *p_bias_rows, *p_bias_ids; /* pinned mirrors */
    float *p_bias_vals;
    int32_t *s_mask_rows; /* device (max_seqs) masked rows */
    uint32_t *s_masks;    /* device (max_seqs, mask_words) */
    int32_t *p_mask_rows; /* pinned mirrors */
    uint32_t *p_masks;
    int mask_words; /* (vocab + 31) / 32 */

    int n_buckets;
    int bucket[GW_CUDA_MAX_BUCKETS];   /* ascending batch sizes */
    void *graph_exec[GW_CUDA_MAX_BUCKETS]; /* cudaGraphExec_t or NULL */
    int graph_failed[GW_CUDA_MAX_BUCKETS]; /* capture failed: eager */
    char graph_error[384];             /* why the last capture failed */
    int64_t graph_launches, eager_steps;   /* counters for tests/logs */

    /* Per-head lengths (opts.per_head; gw_cuda_heads.c). */
    int32_t *hl_pre, *h_hl_pre;        /* device / pinned (L * Hkv): a
                                          prefill's heads before the chunk */
    int32_t *hl_dec, *h_hl_dec;        /* device / pinned (max_seqs, L *
                                          Hkv): decode heads counting the
                                          step's token (padding rows: 1) */
    int32_t *hkeep;                    /* host (L * Hkv) what each head of
                                          a prefill chunk appended */
    /* gvote's selection on the host (method gvote) */
    struct gw_gvote gv;
    uint16_t *p_gv;                    /* pinned bf16 (max_chunk, hidden +
                                          Hq*d + Hkv*d): h, q, k of a layer */
    float *gv_x, *gv_q, *gv_k;         /* host fp32 copies of them */
    int32_t *p_gv_idx;                 /* pinned (Hkv, max_chunk) selection */
    /* its synthetic queries: q_proj on the device (the slab's wq), the
     * bias and q_norm on the host (gw_gvote_proj) */
    uint16_t *gv_xs_d;                 /* device bf16 (S, hidden) inputs */
    float *gv_qs_d;                    /* device fp32 (S, Hq*d) x W_q^T */
    uint16_t *p_gv_xs;                 /* pinned mirrors */
    float *p_gv_qs;
    struct gw_layer *gv_w;             /* host (L): bq and q_norm only,
                                          fp32 copies of the device's */
    float *gv_small;                   /* owns gv_w's arrays */
    /* decode-time compression (opts.trig) */
    float *trig_re, *trig_im, *trig_abs; /* device (L, Hq, d/2) statistics */
    void *trig_items;                  /* device tg_cuda_trig_item (cap) */
    void *p_trig_items;                /* pinned mirror */
    int64_t trig_cap_items;
    float *trig_score;                 /* device (trig_cap_slots) */
    int32_t *trig_src;                 /* device (trig_cap_slots) */
    int64_t trig_cap_slots;            /* scored slots per launch round */
    int64_t trig_rounds;               /* launch rounds so far (tests) */
    /* calibration hooks (opts.on_scores / on_queries; gw_cuda_hooks.c),
     * allocated at their first use */
    int hook_rows;                     /* rows of the prefill chunk being
                                          run while on_queries is set; 0
                                          otherwise (decode, captures) */
    void *p_hook;                      /* pinned: a layer's scores or
                                          bf16 queries */
    size_t p_hook_bytes;
    float *hook_f32;                   /* host (max_chunk, Hq * d) */
};

/* Sets up the runtime on opts->device: plans memory (gw_mem_plan against
 * cudaMemGetInfo), loads the weights into the device slab (gw_wslab.h:
 * bf16, gate and up fused) through its upload op, the head maps and the
 * split map, and allocates the pool, activations and staging. The
 * weights come from the checkpoint at model->dir, streamed by gw_load
 * (pread into a bounded staging buffer, then two pinned bounce buffers of
 * GW_CUDA_BOUNCE_BYTES whose copies overlap the next read): a model from
 * gw_model_open needs no host weights at all. A model that already holds
 * host weights (model->slab: one built in memory, or loaded for the CPU
 * too) is uploaded from them instead, through the same op. c->load says
 * what the load took. `model` and `layout` must outlive the runtime.
 * Returns 0, TG_EINVAL (unsupported shape or options, detail in err),
 * TG_ENODEV, TG_ENOMEM (the plan does not fit: every term in MiB), the
 * checkpoint's codes (TG_ENOENT, TG_EFORMAT, TG_EUNSUPPORTED, TG_EIO) or
 * TG_EDEVICE; on failure *c is left freed. */
int gw_cuda_init(struct gw_cuda *c, const struct gw_model *model,
                 const struct kv_layout *layout,
                 const struct gw_cuda_opts *opts, char *err, size_t errlen);

/* Frees everything (synchronising the device first); safe on a zeroed or
 * half-built runtime. */
void gw_cuda_free(struct gw_cuda *c);

/* gw_forward_prefill on the device, with the same contract: runs one
 * chunk of n tokens (n <= max_chunk) of `seq`, appends the kept K/V,
 * advances seq->pos and seq->len, and computes what `out` asks for
 * (out->want_logits, out->lp_targets: the same decisions on every rank,
 * whose collectives pair up; outputs written on rank 0 only). Returns 0,
 * TG_EINVAL, TG_ENOSPC (a row lacks pages; nothing changed) or TG_EDEVICE
 * (the sequence's device rows are then undefined: the caller drops it). */
int gw_cuda_prefill(struct gw_cuda *c, struct gw_seq *seq, const int32_t *ids,
                    int n, const struct gw_prefill_out *out, char *err,
                    size_t errlen);

/* gw_forward_decode on the device: one token for each of n_seq
 * (<= max_seqs) sequences; with want_logits (the same on every rank)
 * rank 0 receives the logits (n_seq, V) in host `logits`, or, when
 * `logits` is NULL, keeps them on the device for gw_cuda_sample (no
 * (n_seq, V) copy to the host). Returns 0, TG_EINVAL, TG_ENOSPC,
 * TG_ETIMEDOUT (T > 1: a peer is gone; the group is aborted) or
 * TG_EDEVICE. */
int gw_cuda_decode(struct gw_cuda *c, struct gw_seq *const *seqs,
                   const int32_t *ids, int n_seq, int want_logits,
                   float *logits, char *err, size_t errlen);

/* Samples rows 0 .. n-1 of the logits the last gw_cuda_decode kept on the
 * device (rank 0; n <= its n_seq): tokens[i] drawn under params[i]
 * (kernels/cuda/sample.h: temperature, top-k, top-p, min-p, then one
 * Philox draw keyed by (seed, step); greedy is the argmax with ties to the
 * lower id, as on the CPU), lps[i] its log-probability under the raw
 * logits, and with n_top > 0 (<= GW_CUDA_MAX_TOP) the n_top most likely
 * ids and log-probabilities per row in top_ids/top_lps (n, n_top). Host
 * outputs. Penalties are not applied here: rows that need them go
 * through the host sampler. OpenAI logit bias is: bias (NULL = none, else
 * n entries, NULL for a row without) gives each row's tg_sampling, whose
 * bias_ids/bias_vals are added to that row's device logits before the
 * draw and taken off again after it, so lps and the top logprobs stay
 * those of the raw logits as on the CPU; at most GW_CUDA_MAX_BIAS entries
 * over all rows. Structured outputs: masks (NULL = none, else n entries,
 * NULL for an unconstrained row) gives a row's allowed ids (bit j of
 * word j >> 5, host memory of (vocab + 31) / 32 words), applied to its
 * device logits after the finiteness check and before the draw and every
 * log-probability (kernels/cuda/logit_mask.h). bad[i] (host, n) gets the first id whose raw logit is NaN
 * or +-inf, or -1, and bad_val[i] (host, n) that logit: such a row's token
 * means nothing and the caller fails its request. The parameters come
 * from sampling values checked where they entered (tg_sampling_check);
 * the sampler asserts their range. Returns 0, TG_EINVAL (nothing kept, n
 * too large, too many bias entries) or TG_EDEVICE. */
int gw_cuda_sample(struct gw_cuda *c, int n,
                   const struct tg_cuda_sample_params *params,
                   const struct tg_sampling *const *bias,
                   const uint32_t *const *masks, int n_top, int32_t *tokens,
                   float *lps, int32_t *top_ids, float *top_lps, int32_t *bad,
                   float *bad_val, char *err, size_t errlen);

/* The decode batch bucket that n sequences run in (the smallest bucket
 * >= n), or -1 when n is outside 1..max_seqs. Pure. */
int gw_cuda_bucket_of(const int *buckets, int n_buckets, int n);

/* gw_forward_trig on the device (DESIGN.md §4.9), for n (<= max_seqs)
 * sequences right after the decode step that triggered them: every head
 * whose decode region [dstart, hlen) is longer than its cap keeps its cap
 * (the last `window` entries, the rest by kernels/cuda/trig.h's score at
 * the next position seq->pos, ties to the earlier slot) and is compacted
 * in order in place; hlen and the rows' len shrink on the host, *heads
 * counts the heads compacted. One round of three launches (score,
 * select, compact) covers the batch unless its regions exceed the
 * runtime's workspace (trig_cap_slots), then several. Needs opts.trig
 * (the same cfg as tc) and per-head lengths. slot_pos is not kept on
 * this backend. Returns 0, TG_EINVAL or TG_EDEVICE (the sequences' device
 * rows are then undefined: the caller drops them). */
int gw_cuda_compact(struct gw_cuda *c, const struct gw_trig_cfg *tc,
                    struct gw_seq *const *seqs, int n, int64_t *heads,
                    char *err, size_t errlen);

/* Copies pool page src[i] to page dst[i] for i < n, device to device on
 * the runtime's stream (so after the forward calls before it and before
 * those after it), and waits. Returns 0, TG_EINVAL (an id outside the
 * pool) or TG_EDEVICE. */
int gw_cuda_copy_pages(struct gw_cuda *c, const int32_t *src,
                       const int32_t *dst, int n, char *err, size_t errlen);

/* ---- the host tier (DESIGN.md §4.10; gw_cuda_tier.c) ------------------
 * The backend's tier ops (gw_backend.h) on CUDA: a pinned host slab and a
 * non-blocking copy stream of its own, so the copies overlap the compute
 * stream's work. */

/* Pinned host memory of `bytes` (cudaHostAlloc) into *base, and the copy
 * stream. Main thread. 0, TG_ENOMEM or TG_EDEVICE naming the size. */
int gw_cuda_tier_alloc(struct gw_cuda *c, size_t bytes, void **base,
                       char *err, size_t errlen);

/* Frees the slab and the copy stream; safe on NULL / never allocated. */
void gw_cuda_tier_release(struct gw_cuda *c, void *base);

/* An event recorded on the compute stream (*fence): the point a copy asked
 * for now must follow. Main thread. 0 or TG_EDEVICE. */
int gw_cuda_tier_fence(struct gw_cuda *c, void **fence, char *err,
                       size_t errlen);

/* Destroys a fence no copy consumed. */
void gw_cuda_tier_fence_drop(struct gw_cuda *c, void *fence);

/* The tier thread: the copy stream waits for `fence` (consumed here), then
 * pool page dev[i] <-> host page host[i] of `base` for i < n by
 * cudaMemcpyAsync (consecutive ids on both sides in one call), and the
 * thread waits for the copy stream. 0 or TG_EDEVICE. */
int gw_cuda_tier_copy(struct gw_cuda *c, void *base, int to_host,
                      const int32_t *dev, const int32_t *host, int n,
                      void *fence, char *err, size_t errlen);

/* ---- block tables on the host (every build; gw_cuda_table.c) ---------- */

/* Stages host table k (just built or refreshed by kv_table) in t's pinned
 * mirrors for the device copy: when k was rebuilt (or the changed ids do
 * not fit sc_cap) the whole table, *n_scatter = -1; otherwise indptr,
 * npages and lens whole (O(rows)) and the ids k->dirty lists as
 * (sc_pos[i], sc_val[i]) pairs, *n_scatter of them, for the device
 * scatter. Returns 0, or TG_EINVAL when k exceeds t's capacities (nothing
 * staged). Pure. */
int gw_cuda_table_stage(struct gw_cuda_table *t, const struct kv_table *k,
                        int32_t *sc_pos, int32_t *sc_val, int64_t sc_cap,
                        int64_t *n_scatter, char *err, size_t errlen);

/* Fills buckets with the batch sizes graphs are captured for up to
 * max_seqs (see the top of this file) and returns their count (<= cap).
 * Pure; exists in every build so the rule is unit-tested in CI. */
int gw_cuda_buckets(int max_seqs, int *buckets, int cap);

#endif /* GW_CUDA_H */
