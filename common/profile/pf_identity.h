/*
 * pf_identity.h — the identity of a model, as a profile records it
 * (docs/PROFILES.md "Model identity", DESIGN.md §4.2).
 *
 * A profile's budgets were measured on one model; one made for another
 * model of the same shape would still load (L, H and d agree) and reserve
 * wrong pages. So a profile carries "model.identity", and every program
 * that serves with a profile compares it with the model's.
 *
 * The identity is "sha256:" and the lowercase hex SHA-256 (libsodium's
 * crypto_hash_sha256) of a canonical text of the config.json fields that
 * decide what the model computes, as tangram parses them
 * (mc_model_config.h), one "name=value" line each, in this order:
 *
 *   tangram-model-identity 1
 *   architecture=Qwen3ForCausalLM
 *   hidden_size=128
 *   intermediate_size=384
 *   num_hidden_layers=4
 *   num_attention_heads=8
 *   num_key_value_heads=4
 *   head_dim=32
 *   vocab_size=151669
 *   rms_norm_eps=9.9999999999999995e-07
 *   rope_theta=10000
 *   rope_scaling=none
 *   tie_word_embeddings=true
 *   qkv_bias=false
 *   o_bias=false
 *   qk_norm=true
 *   sliding_window=0
 *
 * Numbers are printed with %.17g (reals) and %d (integers), so the value
 * read decides the text, not the file's spelling; rope_scaling is "none"
 * or "llama3 factor=F low_freq_factor=F high_freq_factor=F
 * original_max_position_embeddings=N". Defaults the file leaves out are
 * applied first (num_key_value_heads, head_dim ...). Left out on purpose:
 * torch_dtype (a bf16 and an fp32 copy of one model are one model), token
 * ids, max_position_embeddings and everything tangram does not read (keys
 * a newer transformers writes, _name_or_path). What the identity cannot
 * tell apart: two models with the same config and different weights (a
 * base model and its fine-tune) — a profile's budgets measure attention
 * patterns, which the weights decide, so calibrate each.
 *
 * Pure functions; any thread.
 */
#ifndef PF_IDENTITY_H
#define PF_IDENTITY_H

#include <stdbool.h>
#include <stddef.h>

#include "common/model/mc_model_config.h"

#define PF_IDENTITY_PREFIX "sha256:"
#define PF_IDENTITY_LEN (7 + 64) /* characters, without the NUL */
#define PF_IDENTITY_TEXT_MAX 1024 /* bytes of the canonical text */

/* Writes the canonical text of cfg (above) into buf. Returns 0, or
 * TG_ETOOBIG when it does not fit n bytes. */
int pf_identity_text(const struct mc_model_config *cfg, char *buf, size_t n);

/* Writes cfg's identity ("sha256:<64 hex>") into out (at least
 * PF_IDENTITY_LEN + 1 bytes). Returns 0 or TG_EINTERNAL (libsodium could
 * not start). */
int pf_identity_of_config(const struct mc_model_config *cfg, char *out);

/* True when s is an identity: "sha256:" and 64 lowercase hex digits. */
bool pf_identity_valid(const char *s);

/* A short description of cfg for messages ("Qwen3ForCausalLM, 4 layers, 4
 * KV heads of 32, vocabulary 151669") into buf. */
void pf_identity_describe(const struct mc_model_config *cfg, char *buf,
                          size_t n);

#endif /* PF_IDENTITY_H */
