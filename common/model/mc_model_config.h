/*
 * mc_model_config.h — the Hugging Face config.json of a supported model,
 * parsed and validated into one plain struct.
 *
 * Supported architectures (DESIGN §4.1): LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM
 * (per-head RMSNorm of q and k). Defaults follow the transformers config
 * classes: num_key_value_heads = num_attention_heads, head_dim =
 * hidden_size / num_attention_heads, rope_theta = 10000,
 * tie_word_embeddings = false. RoPE scaling: none / "default" / "llama3";
 * any other type is refused with TG_EUNSUPPORTED rather than silently run
 * with wrong positions. The same goes for hidden_act other than "silu" and
 * for mlp_bias = true.
 *
 * Errors name the offending field ("config.json: num_key_value_heads: 5
 * does not divide num_attention_heads 32"). All functions are pure apart
 * from file I/O and are safe on any thread.
 */
#ifndef MC_MODEL_CONFIG_H
#define MC_MODEL_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum mc_arch {
    MC_ARCH_LLAMA = 0,
    MC_ARCH_MISTRAL,
    MC_ARCH_QWEN2,
    MC_ARCH_QWEN3,
    MC_ARCH_COUNT
};

enum mc_rope_type {
    MC_ROPE_DEFAULT = 0, /* inv_freq = theta^(-2i/d) */
    MC_ROPE_LLAMA3,      /* Llama-3.1 frequency-dependent scaling */
};

#define MC_MAX_EOS 8
#define MC_DTYPE_LEN 16

struct mc_rope_scaling {
    enum mc_rope_type type;
    /* Llama-3 parameters (meaningful for MC_ROPE_LLAMA3 only). */
    double factor;               /* > 0, e.g. 8 */
    double low_freq_factor;      /* > 0, e.g. 1 */
    double high_freq_factor;     /* > low_freq_factor, e.g. 4 */
    int64_t original_max_position_embeddings; /* tokens, e.g. 8192 */
};

struct mc_model_config {
    enum mc_arch arch;
    int hidden_size;             /* model width */
    int intermediate_size;       /* SwiGLU width */
    int num_layers;              /* num_hidden_layers */
    int num_heads;               /* query heads, num_attention_heads */
    int num_kv_heads;            /* num_key_value_heads (GQA) */
    int head_dim;                /* per head; even */
    int vocab_size;              /* rows of embed_tokens / lm_head */
    int64_t max_position_embeddings; /* tokens */
    double rms_norm_eps;
    double rope_theta;
    struct mc_rope_scaling rope_scaling;
    bool tie_word_embeddings;    /* lm_head shares embed_tokens */
    bool qkv_bias;               /* q/k/v projections have a bias */
    bool o_bias;                 /* o_proj has a bias (attention_bias) */
    bool qk_norm;                /* per-head RMSNorm on q, k (Qwen3) */
    int64_t sliding_window;      /* tokens, 0 = full attention */
    char torch_dtype[MC_DTYPE_LEN]; /* "bfloat16", ...; "" when absent */
    int bos_token_id;            /* -1 when absent */
    int eos_token_ids[MC_MAX_EOS]; /* (n_eos) */
    int n_eos;
};

/* Returns the HF class name of `a` ("Qwen3ForCausalLM"), or "?". */
const char *mc_arch_name(enum mc_arch a);

/* Returns the HF model_type of `a` ("qwen3"), or "?". */
const char *mc_arch_model_type(enum mc_arch a);

/* Maps an HF class name to *out. Returns 0 or TG_EUNSUPPORTED. */
int mc_arch_parse(const char *name, enum mc_arch *out);

/* Fills *cfg (caller-owned) from the parsed config.json `doc`; `ctx` names
 * the source in messages (e.g. the path). Applies the defaults above, then
 * mc_model_config_validate(). Returns 0, TG_EUNSUPPORTED (architecture,
 * rope type, activation), TG_ENOTFOUND (required field missing),
 * TG_EFORMAT / TG_ERANGE (bad value or inconsistent fields). */
int mc_model_config_from_json(struct mc_model_config *cfg, const json_t *doc,
                              const char *ctx, char *err, size_t errlen);

/* Loads `path`, which is a config.json file or a model directory holding
 * one, into *cfg. Returns what mc_model_config_from_json() returns, plus
 * TG_ENOENT / TG_EIO for the file and TG_EFORMAT for invalid JSON. */
int mc_model_config_load(struct mc_model_config *cfg, const char *path,
                         char *err, size_t errlen);

/* Checks consistency: positive sizes, num_heads % num_kv_heads == 0, even
 * head_dim, eps and theta > 0, Llama-3 rope parameters sane, token ids in
 * [0, vocab_size). Returns 0 or TG_ERANGE / TG_EINVAL naming the field. */
int mc_model_config_validate(const struct mc_model_config *cfg, char *err,
                             size_t errlen);

/* Builds the HF config.json document of cfg into *out (new reference,
 * caller decrefs). It loads back into an equal struct. Returns 0 or
 * TG_ENOMEM. */
int mc_model_config_to_json(const struct mc_model_config *cfg, json_t **out,
                            char *err, size_t errlen);

/* Validates cfg and writes its config.json to `path` atomically. Returns 0,
 * a validation error, TG_ENOMEM or TG_EIO. */
int mc_model_config_write_json(const struct mc_model_config *cfg,
                               const char *path, char *err, size_t errlen);

/* Writes the RoPE inverse frequencies of cfg into inv_freq (head_dim / 2
 * floats, radians per position): theta^(-2i/head_dim), then the Llama-3
 * scaling when configured. Returns 0, or TG_EINVAL when head_dim is not a
 * positive even number. */
int mc_rope_inv_freq(const struct mc_model_config *cfg, float *inv_freq);

#endif /* MC_MODEL_CONFIG_H */
