/*
 * gw_model.h — model weights in the backend's memory, and their loader.
 *
 * Weights are reserved as one slab at start-up and carved into tensors
 * (llm.c's malloc_and_point_parameters). The CPU backend keeps fp32 copies
 * of the checkpoint's bf16/fp16/fp32 tensors. Shapes follow Hugging Face
 * checkpoints: a linear layer's weight is (out_features, in_features).
 */
#ifndef GW_MODEL_H
#define GW_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/mc_model_config.h"

struct gw_layer {
    float *attn_norm; /* (hidden) */
    float *wq;        /* (Hq*d, hidden) */
    float *wk;        /* (Hkv*d, hidden) */
    float *wv;        /* (Hkv*d, hidden) */
    float *bq;        /* (Hq*d) or NULL */
    float *bk;        /* (Hkv*d) or NULL */
    float *bv;        /* (Hkv*d) or NULL */
    float *q_norm;    /* (d) or NULL (Qwen3 only) */
    float *k_norm;    /* (d) or NULL (Qwen3 only) */
    float *wo;        /* (hidden, Hq*d) */
    float *bo;        /* (hidden) or NULL (attention_bias only) */
    float *ffn_norm;  /* (hidden) */
    float *w_gate;    /* (ffn, hidden) */
    float *w_up;      /* (ffn, hidden) */
    float *w_down;    /* (hidden, ffn) */
};

struct gw_model {
    struct mc_model_config cfg; /* the parsed config.json */
    int n_layers;        /* L */
    int hidden;          /* model width */
    int n_q_heads;       /* Hq */
    int n_kv_heads;      /* Hkv */
    int head_dim;        /* d */
    int ffn;             /* intermediate size */
    int vocab;           /* V */
    int max_positions;   /* usable context: max_position_embeddings, or
                            the sliding window when smaller */
    float norm_eps;      /* rms_norm_eps */
    int tied;            /* lm_head shares the embedding table */

    float *slab;            /* owns every weight below */
    size_t slab_floats;
    float *embed;           /* (V, hidden) */
    float *final_norm;      /* (hidden) */
    float *lm_head;         /* (V, hidden); == embed when tied */
    float *inv_freq;        /* (d/2) RoPE inverse frequencies (with scaling) */
    struct gw_layer *layers; /* (L) */
};

/* Loads the Hugging Face model directory `dir` (config.json and
 * model.safetensors or a sharded index) into `m`, converting weights to
 * fp32 host memory. Returns 0, or TG_ENOENT / TG_EFORMAT / TG_EUNSUPPORTED /
 * TG_ENOMEM with a message naming the file, tensor or field. On failure `m`
 * is left freed. Not thread-safe for the same `m`. */
int gw_model_load(struct gw_model *m, const char *dir, char *err, size_t errlen);

/* Frees everything `m` owns; safe on a zeroed or already-freed model. */
void gw_model_free(struct gw_model *m);

#endif /* GW_MODEL_H */
