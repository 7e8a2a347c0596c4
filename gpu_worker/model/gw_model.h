/*
 * gw_model.h — a model shard's shape and its host weights.
 *
 * Two steps: gw_model_open reads config.json and fixes the shard (sizes,
 * rank, head map, RoPE table) without touching the weights;
 * gw_model_load_weights then streams the checkpoint into host memory
 * (gw_load.h: tensor by tensor through a bounded staging buffer, pread,
 * never a second whole-model copy). The host weights are one slab
 * carved into tensors (llm.c's malloc_and_point_parameters), converted
 * from the checkpoint's bf16/fp16/fp32 per slice: what the CPU backend
 * computes with. Norms and biases are fp32; the matrices (embedding, LM
 * head, projections) are m->wtype: fp32, or bf16 kept as the checkpoint
 * stores it (half the bytes a decode step streams; the ops convert it
 * exactly, gw_model_gemm). A backend with its own memory (CUDA) needs only the
 * shape: it streams the same checkpoint into its upload op (gw_cuda.h).
 * Shapes follow Hugging Face checkpoints: a linear layer's weight is
 * (out_features, in_features).
 *
 * Tensor parallelism (DESIGN.md §4.7, Megatron-LM's split, Shoeybi et al.
 * 2019): rank r of T holds the KV heads a pf_profile_rank() layout gives
 * it and their query heads, so q/k/v (and their biases) are split by rows
 * (column-parallel), o_proj by columns (row-parallel: each rank computes a
 * partial hidden that an all-reduce sums), gate/up by rows and down by
 * columns over the ffn range [r*F/T, (r+1)*F/T). Norms and the embedding
 * are whole on every rank; o_proj's bias only on rank 0 (added once to
 * the sum). The LM head is vocab-parallel (Megatron-LM's vocab-parallel
 * output layer): with Vp = ceil(V/T), rank r holds rows
 * [r*Vp, min((r+1)*Vp, V)) of lm_head (of the embedding for a tied model,
 * whose embedding itself stays whole), computes that slice of the logits,
 * and gw_forward.h gathers the slices on rank 0. Local KV head i of layer l is the model's head
 * kv_heads[l*H/T + i]; its G query heads are global*G .. global*G + G-1 in
 * that order, so local query head j still belongs to local KV head j / G.
 */
#ifndef GW_MODEL_H
#define GW_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/mc_model_config.h"
#include "gpu_worker/model/gw_load.h"
#include "kernels/tg_ops.h"

#define GW_MODEL_MAX_KV_HEADS 4096 /* KV heads per layer of a model */

/* The host weights' format: what gw_model_load_weights makes of the
 * checkpoint's matrices (gw_shard.weights). */
enum gw_weights {
    GW_WEIGHTS_AUTO = 0, /* the checkpoint's: bf16 stays bf16 (exact, half
                            the bytes), fp16 and fp32 become fp32 */
    GW_WEIGHTS_F32 = 1,  /* fp32 whatever the checkpoint holds */
    GW_WEIGHTS_BF16 = 2, /* bf16; fp32 and fp16 rounded to nearest even */
};

/* The names of enum gw_weights in its order, NULL-terminated: "auto",
 * "f32", "bf16" (a tg_config enum's choices). */
extern const char *const gw_weights_choices[4];

/* One of gw_weights_choices into *out. Returns 0 or TG_EINVAL. */
int gw_weights_parse(const char *s, enum gw_weights *out);

/* A layer's weights. The matrices' elements are the model's wtype (fp32 or
 * bf16 bits); everything else is fp32. */
struct gw_layer {
    float *attn_norm; /* (hidden) */
    void *wq;         /* (Hq*d, hidden) */
    void *wk;         /* (Hkv*d, hidden) */
    void *wv;         /* (Hkv*d, hidden) */
    float *bq;        /* (Hq*d) or NULL */
    float *bk;        /* (Hkv*d) or NULL */
    float *bv;        /* (Hkv*d) or NULL */
    float *q_norm;    /* (d) or NULL (Qwen3 only) */
    float *k_norm;    /* (d) or NULL (Qwen3 only) */
    void *wo;         /* (hidden, Hq*d) */
    float *bo;        /* (hidden) or NULL (attention_bias only) */
    float *ffn_norm;  /* (hidden) */
    void *w_gate;     /* (ffn, hidden) */
    void *w_up;       /* (ffn, hidden) */
    void *w_down;     /* (hidden, ffn) */
};

struct gw_model {
    struct mc_model_config cfg; /* the parsed config.json (global sizes) */
    int rank, world;     /* tensor-parallel shard: rank of T (0 of 1) */
    int n_layers;        /* L */
    int hidden;          /* model width */
    int n_q_heads;       /* Hq on this rank (Hq_model / T) */
    int n_kv_heads;      /* Hkv on this rank (Hkv_model / T) */
    int head_dim;        /* d */
    int ffn;             /* intermediate size on this rank (F / T) */
    int vocab;           /* V */
    int max_positions;   /* usable context: max_position_embeddings, or
                            the sliding window when smaller */
    float norm_eps;      /* rms_norm_eps */
    int tied;            /* lm_head shares the embedding table */

    enum gw_weights weights; /* the format asked for (gw_shard.weights) */
    enum tg_wtype wtype;     /* the matrices' elements (fp32 for a model
                               built in memory, which sets them itself) */
    void *slab;              /* owns every weight below */
    size_t slab_elems;       /* elements of every kind in the slab */
    size_t slab_bytes;
    void *embed;            /* (V, hidden) */
    float *final_norm;      /* (hidden) */
    void *lm_head;          /* (count, hidden) this rank's vocab slice,
                               rows first .. first + count - 1 of the
                               model's head (gw_model_vocab_slice); points
                               into embed when tied; NULL when count = 0 */
    float *inv_freq;        /* (d/2) RoPE inverse frequencies (with scaling) */
    struct gw_layer *layers; /* (L) */

    char *dir;              /* the checkpoint's directory (owned); NULL for
                               a model built in memory */
    int32_t *head_map;      /* (L, n_kv_heads) the model KV head of each
                               local head (owned); NULL: model order */
    struct gw_load_stats load; /* what gw_model_load_weights did (zero when
                                  the host holds no weights) */
};

/* Loads the Hugging Face model directory `dir` (config.json and
 * model.safetensors or a sharded index) into `m`, converting weights to
 * fp32 host memory (gw_model_load_shard of the whole model). Returns 0, or
 * TG_ENOENT / TG_EFORMAT / TG_EUNSUPPORTED / TG_ENOMEM / TG_EIO with a
 * message naming the file, tensor or field. On failure `m` is left freed.
 * Not thread-safe for the same `m`. */
int gw_model_load(struct gw_model *m, const char *dir, char *err, size_t errlen);

/* Which part of the model one tensor-parallel rank loads. */
struct gw_shard {
    int rank;              /* 0 .. world - 1 */
    int world;             /* T >= 1 */
    const int *kv_heads;   /* (L, Hkv/T) model KV head of each local head
                              (pf_profile_rank's global_head); NULL only
                              with world 1: heads in model order */
    enum gw_weights weights; /* the host weights' format (AUTO when 0) */
};

/* Reads the config of the model in `dir` and fixes rank sh->rank's shard
 * (sh == NULL: the whole model): every size, the head map, the RoPE table,
 * the layer array with every weight pointer NULL (no weight is read; the
 * checkpoint is not opened). Requires Hkv, Hq and F to be multiples of T,
 * kv_heads entries in [0, Hkv) and distinct within a layer. Returns 0,
 * TG_EINVAL (bad shard: the message gives the numbers), TG_ENOMEM or the
 * config's codes; on failure `m` is left freed. The borrowed kv_heads
 * need not outlive the call. */
int gw_model_open(struct gw_model *m, const char *dir,
                  const struct gw_shard *sh, char *err, size_t errlen);

/* Streams the shard's weights from m->dir into host memory (gw_load_run
 * with the host sink: one slab of gw_load_plan's elements, each slice
 * converted in place, OpenMP over its elements) through a staging buffer
 * of `staging` bytes (0: GW_LOAD_STAGING_DEFAULT) and records m->load.
 * The matrices become m->wtype: bf16 for GW_WEIGHTS_BF16, and for
 * GW_WEIGHTS_AUTO when every matrix the shard keeps is bf16 in the
 * checkpoint; fp32 otherwise. Peak host memory: the slab plus the
 * staging buffer. Returns 0, or
 * TG_ENOENT / TG_EFORMAT / TG_EUNSUPPORTED / TG_ENOMEM / TG_EIO naming the
 * file or tensor; on failure the weights are freed again (the shape
 * stays). */
int gw_model_load_weights(struct gw_model *m, size_t staging, char *err,
                          size_t errlen);

/* gw_model_open then gw_model_load_weights (default staging): rank
 * sh->rank's shard with host weights (see the top of this file); sh == NULL
 * loads the whole model (gw_model_load). Returns 0 or either's codes; on
 * failure `m` is left freed. */
int gw_model_load_shard(struct gw_model *m, const char *dir,
                        const struct gw_shard *sh, char *err, size_t errlen);

/* The host fp32 array of destination (kind, layer) (layer ignored for the
 * model-wide kinds), or NULL when m holds none (no host weights, a tensor
 * the architecture or rank lacks, or a matrix held as bf16: see
 * gw_model_weight_any). Pure. */
const float *gw_model_weight(const struct gw_model *m, enum gw_wkind kind,
                             int layer);

/* The host array of destination (kind, layer) whatever its elements, and
 * their type in *wt (the matrices: m->wtype; the rest fp32), or NULL as
 * gw_model_weight. Pure. */
const void *gw_model_weight_any(const struct gw_model *m, enum gw_wkind kind,
                                int layer, enum tg_wtype *wt);

/* Whether destinations of `kind` are matrices (stored as the model's
 * wtype) rather than fp32 norms and biases. Pure. */
int gw_wkind_is_matrix(enum gw_wkind kind);

/* y (rows, n) = x (rows, k) W^T (+ bias) with W one of m's matrices (its
 * wtype): ops->gemm or ops->gemm_bf16. */
int gw_model_gemm(const struct gw_model *m, const struct tg_ops *ops,
                  struct tg_backend *be, const float *x, const void *w,
                  const float *bias, int rows, int n, int k, float *y);

/* out (n, hidden) = the embedding rows of ids (m's wtype). */
int gw_model_embed(const struct gw_model *m, const struct tg_ops *ops,
                   struct tg_backend *be, const int32_t *ids, int n,
                   float *out);

/* The vocab-parallel LM head slice of rank m->rank of m->world (a world
 * below 1, as in a hand-built model, counts as one rank): *per_rank =
 * Vp = ceil(V/T), *first = rank * Vp and *count = the rows this rank holds,
 * min(Vp, V - first) and at least 0 (only with V < T*Vp can the last ranks
 * hold fewer, or none). Thread-safe. */
void gw_model_vocab_slice(const struct gw_model *m, int *first, int *count,
                          int *per_rank);

/* Lists what m's shard keeps, in *p (m from gw_model_open: sizes, rank,
 * world, head map; gw_load.h has the plan): every kind the architecture
 * has, per layer; o_proj's bias on rank 0 only; the LM head as this
 * rank's vocabulary rows (gw_model_vocab_slice) of lm_head.weight, none
 * when the rank holds none. A tied model has no LM head entry unless
 * tied_head is set, which lists the rows from the embedding (for a
 * destination that keeps the slice apart from the whole embedding).
 * Returns 0, or TG_ENOMEM; on failure *p is left freed. */
int gw_model_load_plan(struct gw_load_plan *p, const struct gw_model *m,
                       int tied_head, char *err, size_t errlen);

/* gw_load_run_host over m's host weights (m->slab, fp32, as
 * gw_model_weight finds them): plan p's slices handed to sink without
 * reading a file. Returns 0, TG_EINVAL (m lacks a tensor the plan lists),
 * TG_EUNSUPPORTED (m's matrices are bf16) or the sink's code. */
int gw_model_run_host(const struct gw_load_plan *p, const struct gw_model *m,
                      size_t staging, const struct gw_load_sink *sink,
                      struct gw_load_stats *stats, char *err, size_t errlen);

/* Frees everything `m` owns; safe on a zeroed or already-freed model. */
void gw_model_free(struct gw_model *m);

#endif /* GW_MODEL_H */
