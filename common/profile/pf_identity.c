/* pf_identity.c — a model's identity for profiles (pf_identity.h). */
#include "common/profile/pf_identity.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "common/base/tg_err.h"

static const char *yes_no(bool b)
{
    return b ? "true" : "false";
}

int pf_identity_text(const struct mc_model_config *c, char *buf, size_t n)
{
    char rope[256];
    if (c->rope_scaling.type == MC_ROPE_LLAMA3)
        snprintf(rope, sizeof(rope),
                 "llama3 factor=%.17g low_freq_factor=%.17g "
                 "high_freq_factor=%.17g original_max_position_embeddings=%lld",
                 c->rope_scaling.factor, c->rope_scaling.low_freq_factor,
                 c->rope_scaling.high_freq_factor,
                 (long long)c->rope_scaling.original_max_position_embeddings);
    else
        snprintf(rope, sizeof(rope), "none");
    int w = snprintf(buf, n,
                     "tangram-model-identity 1\n"
                     "architecture=%s\n"
                     "hidden_size=%d\n"
                     "intermediate_size=%d\n"
                     "num_hidden_layers=%d\n"
                     "num_attention_heads=%d\n"
                     "num_key_value_heads=%d\n"
                     "head_dim=%d\n"
                     "vocab_size=%d\n"
                     "rms_norm_eps=%.17g\n"
                     "rope_theta=%.17g\n"
                     "rope_scaling=%s\n"
                     "tie_word_embeddings=%s\n"
                     "qkv_bias=%s\n"
                     "o_bias=%s\n"
                     "qk_norm=%s\n"
                     "sliding_window=%lld\n",
                     mc_arch_name(c->arch), c->hidden_size,
                     c->intermediate_size, c->num_layers, c->num_heads,
                     c->num_kv_heads, c->head_dim, c->vocab_size,
                     c->rms_norm_eps, c->rope_theta, rope,
                     yes_no(c->tie_word_embeddings), yes_no(c->qkv_bias),
                     yes_no(c->o_bias), yes_no(c->qk_norm),
                     (long long)c->sliding_window);
    return w < 0 || (size_t)w >= n ? TG_ETOOBIG : 0;
}

int pf_identity_of_config(const struct mc_model_config *cfg, char *out)
{
    char text[PF_IDENTITY_TEXT_MAX];
    unsigned char h[crypto_hash_sha256_BYTES];
    if (sodium_init() < 0 || pf_identity_text(cfg, text, sizeof(text)) != 0)
        return TG_EINTERNAL;
    crypto_hash_sha256(h, (const unsigned char *)text, strlen(text));
    memcpy(out, PF_IDENTITY_PREFIX, 7);
    sodium_bin2hex(out + 7, 65, h, sizeof(h));
    return 0;
}

bool pf_identity_valid(const char *s)
{
    if (s == NULL || strncmp(s, PF_IDENTITY_PREFIX, 7) != 0 ||
        strlen(s) != PF_IDENTITY_LEN)
        return false;
    for (const char *c = s + 7; *c != '\0'; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return false;
    return true;
}

void pf_identity_describe(const struct mc_model_config *c, char *buf,
                          size_t n)
{
    snprintf(buf, n, "%s, %d layers, %d KV heads of %d, vocabulary %d",
             mc_arch_name(c->arch), c->num_layers, c->num_kv_heads,
             c->head_dim, c->vocab_size);
}
