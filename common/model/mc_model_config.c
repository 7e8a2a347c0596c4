/* mc_model_config.c — HF config.json parsing, validation, writing and RoPE
 * frequencies (contracts in mc_model_config.h). */
#include "common/model/mc_model_config.h"
#include "common/base/tg_err.h"
#include "common/json/tg_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct {
    const char *cls;
    const char *model_type;
    int64_t default_max_pos; /* the transformers config class defaults */
} arch_table[MC_ARCH_COUNT] = {
    [MC_ARCH_LLAMA] = {"LlamaForCausalLM", "llama", 2048},
    [MC_ARCH_MISTRAL] = {"MistralForCausalLM", "mistral", 4096 * 32},
    [MC_ARCH_QWEN2] = {"Qwen2ForCausalLM", "qwen2", 32768},
    [MC_ARCH_QWEN3] = {"Qwen3ForCausalLM", "qwen3", 32768},
};

const char *mc_arch_name(enum mc_arch a)
{
    return (unsigned)a < MC_ARCH_COUNT ? arch_table[a].cls : "?";
}

const char *mc_arch_model_type(enum mc_arch a)
{
    return (unsigned)a < MC_ARCH_COUNT ? arch_table[a].model_type : "?";
}

int mc_arch_parse(const char *name, enum mc_arch *out)
{
    for (int i = 0; i < MC_ARCH_COUNT; i++) {
        if (strcmp(name, arch_table[i].cls) == 0) {
            *out = (enum mc_arch)i;
            return 0;
        }
    }
    return TG_EUNSUPPORTED;
}

/* ---- parsing helpers ----------------------------------------------------- */

/* A member that is absent or JSON null counts as absent for optional
 * fields (HF configs write null for "use the default"). */
static int present(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v != NULL && !json_is_null(v);
}

static int get_size(const json_t *doc, const char *key, const char *ctx,
                    int *out, char *err, size_t errlen)
{
    int64_t v;
    int rc = tg_json_get_int(doc, key, ctx, 1, INT32_MAX, &v, err, errlen);
    if (rc == 0)
        *out = (int)v;
    return rc;
}

static int opt_bool(const json_t *doc, const char *key, const char *ctx,
                    bool dflt, bool *out, char *err, size_t errlen)
{
    *out = dflt;
    if (!present(doc, key))
        return 0;
    int b;
    int rc = tg_json_get_bool(doc, key, ctx, &b, err, errlen);
    if (rc == 0)
        *out = b != 0;
    return rc;
}

static int opt_double(const json_t *doc, const char *key, const char *ctx,
                      double dflt, double *out, char *err, size_t errlen)
{
    *out = dflt;
    if (!present(doc, key))
        return 0;
    return tg_json_get_double(doc, key, ctx, -INFINITY, INFINITY, out, err,
                              errlen);
}

static int token_id(const json_t *v, const char *ctx, const char *what,
                    int *out, char *err, size_t errlen)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > INT32_MAX)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: %s: expected a non-negative integer token id",
                          ctx, what);
    *out = (int)json_integer_value(v);
    return 0;
}

static int parse_eos(struct mc_model_config *cfg, const json_t *doc,
                     const char *ctx, char *err, size_t errlen)
{
    cfg->n_eos = 0;
    if (!present(doc, "eos_token_id"))
        return 0;
    const json_t *v = json_object_get(doc, "eos_token_id");
    if (json_is_array(v)) {
        if (json_array_size(v) > MC_MAX_EOS)
            return tg_err_set(err, errlen, TG_ERANGE,
                              "%s: eos_token_id: more than %d ids", ctx,
                              MC_MAX_EOS);
        for (size_t i = 0; i < json_array_size(v); i++) {
            char what[48];
            snprintf(what, sizeof what, "eos_token_id[%zu]", i);
            int rc = token_id(json_array_get(v, i), ctx, what,
                              &cfg->eos_token_ids[cfg->n_eos], err, errlen);
            if (rc != 0)
                return rc;
            cfg->n_eos++;
        }
        return 0;
    }
    int rc = token_id(v, ctx, "eos_token_id", &cfg->eos_token_ids[0], err,
                      errlen);
    if (rc == 0)
        cfg->n_eos = 1;
    return rc;
}

/* rope_scaling (or transformers v5 rope_parameters) object `rs`. */
static int parse_rope_scaling(struct mc_model_config *cfg, const json_t *rs,
                              const char *ctx, char *err, size_t errlen)
{
    struct mc_rope_scaling *r = &cfg->rope_scaling;
    if (!json_is_object(rs))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: expected an object or null", ctx);
    /* Older configs spell the key "type", newer ones "rope_type". */
    const json_t *t = json_object_get(rs, "rope_type");
    if (t == NULL)
        t = json_object_get(rs, "type");
    if (t != NULL && !json_is_string(t))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s.rope_type: expected a string", ctx);
    const char *type = t != NULL ? json_string_value(t) : "default";
    if (strcmp(type, "default") == 0) {
        r->type = MC_ROPE_DEFAULT;
        return 0;
    }
    if (strcmp(type, "llama3") != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "%s.rope_type: '%s' is not supported (only "
                          "default and llama3)", ctx, type);
    r->type = MC_ROPE_LLAMA3;
    int rc;
    if ((rc = tg_json_get_double(rs, "factor", ctx, 1e-9, 1e9, &r->factor,
                                 err, errlen)) != 0 ||
        (rc = tg_json_get_double(rs, "low_freq_factor", ctx, 1e-9, 1e9,
                                 &r->low_freq_factor, err, errlen)) != 0 ||
        (rc = tg_json_get_double(rs, "high_freq_factor", ctx, 1e-9, 1e9,
                                 &r->high_freq_factor, err, errlen)) != 0 ||
        (rc = tg_json_get_int(rs, "original_max_position_embeddings", ctx, 1,
                              INT32_MAX, &r->original_max_position_embeddings,
                              err, errlen)) != 0)
        return rc;
    return 0;
}

/* ---- config -------------------------------------------------------------- */

int mc_model_config_from_json(struct mc_model_config *cfg, const json_t *doc,
                              const char *ctx, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_token_id = -1;
    if (ctx == NULL || ctx[0] == '\0')
        ctx = "config";
    if (!json_is_object(doc))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s: expected an object",
                          ctx);
    json_t *archs = NULL;
    int rc = tg_json_get_array(doc, "architectures", ctx, -1, &archs, err,
                               errlen);
    if (rc != 0)
        return rc;
    if (json_array_size(archs) < 1 || !json_is_string(json_array_get(archs, 0)))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s.architectures: expected a non-empty list of "
                          "names", ctx);
    const char *aname = json_string_value(json_array_get(archs, 0));
    if (mc_arch_parse(aname, &cfg->arch) != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "%s.architectures[0]: '%s' is not supported "
                          "(Llama, Mistral, Qwen2, Qwen3 ForCausalLM)", ctx,
                          aname);

    if ((rc = get_size(doc, "hidden_size", ctx, &cfg->hidden_size, err,
                       errlen)) != 0 ||
        (rc = get_size(doc, "intermediate_size", ctx,
                       &cfg->intermediate_size, err, errlen)) != 0 ||
        (rc = get_size(doc, "num_hidden_layers", ctx, &cfg->num_layers, err,
                       errlen)) != 0 ||
        (rc = get_size(doc, "num_attention_heads", ctx, &cfg->num_heads, err,
                       errlen)) != 0 ||
        (rc = get_size(doc, "vocab_size", ctx, &cfg->vocab_size, err,
                       errlen)) != 0)
        return rc;
    cfg->num_kv_heads = cfg->num_heads;
    if (present(doc, "num_key_value_heads") &&
        (rc = get_size(doc, "num_key_value_heads", ctx, &cfg->num_kv_heads,
                       err, errlen)) != 0)
        return rc;
    if (present(doc, "head_dim")) {
        if ((rc = get_size(doc, "head_dim", ctx, &cfg->head_dim, err,
                           errlen)) != 0)
            return rc;
    } else {
        if (cfg->hidden_size % cfg->num_heads != 0)
            return tg_err_set(err, errlen, TG_ERANGE,
                              "%s.head_dim: absent and hidden_size %d is not "
                              "a multiple of num_attention_heads %d", ctx,
                              cfg->hidden_size, cfg->num_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    }
    cfg->max_position_embeddings = arch_table[cfg->arch].default_max_pos;
    if (present(doc, "max_position_embeddings") &&
        (rc = tg_json_get_int(doc, "max_position_embeddings", ctx, 1,
                              INT32_MAX, &cfg->max_position_embeddings, err,
                              errlen)) != 0)
        return rc;
    if ((rc = opt_double(doc, "rms_norm_eps", ctx, 1e-6, &cfg->rms_norm_eps,
                         err, errlen)) != 0 ||
        (rc = opt_double(doc, "rope_theta", ctx, 10000.0, &cfg->rope_theta,
                         err, errlen)) != 0)
        return rc;

    /* RoPE scaling: "rope_scaling" (transformers 4.x) or "rope_parameters"
     * (5.x, which also carries rope_theta). */
    char sub[256];
    if (present(doc, "rope_parameters")) {
        const json_t *rp = json_object_get(doc, "rope_parameters");
        snprintf(sub, sizeof sub, "%s.rope_parameters", ctx);
        if ((rc = parse_rope_scaling(cfg, rp, sub, err, errlen)) != 0 ||
            (rc = opt_double(rp, "rope_theta", sub, cfg->rope_theta,
                             &cfg->rope_theta, err, errlen)) != 0)
            return rc;
    } else if (present(doc, "rope_scaling")) {
        snprintf(sub, sizeof sub, "%s.rope_scaling", ctx);
        if ((rc = parse_rope_scaling(cfg, json_object_get(doc, "rope_scaling"),
                                     sub, err, errlen)) != 0)
            return rc;
    }

    if (present(doc, "hidden_act")) {
        const char *act;
        if ((rc = tg_json_get_string(doc, "hidden_act", ctx, &act, err,
                                     errlen)) != 0)
            return rc;
        if (strcmp(act, "silu") != 0)
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "%s.hidden_act: '%s' is not supported (silu)",
                              ctx, act);
    }
    bool mlp_bias, attn_bias, use_sw;
    if ((rc = opt_bool(doc, "mlp_bias", ctx, false, &mlp_bias, err,
                       errlen)) != 0 ||
        (rc = opt_bool(doc, "attention_bias", ctx, false, &attn_bias, err,
                       errlen)) != 0 ||
        (rc = opt_bool(doc, "tie_word_embeddings", ctx, false,
                       &cfg->tie_word_embeddings, err, errlen)) != 0 ||
        (rc = opt_bool(doc, "use_sliding_window", ctx, false, &use_sw, err,
                       errlen)) != 0)
        return rc;
    if (mlp_bias)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "%s.mlp_bias: true is not supported", ctx);
    switch (cfg->arch) {
    case MC_ARCH_QWEN2:
        /* transformers' Qwen2Attention: q/k/v Linear(bias=True), o_proj
         * bias=False, whatever attention_bias says. */
        cfg->qkv_bias = true;
        cfg->o_bias = false;
        break;
    case MC_ARCH_MISTRAL:
        /* MistralAttention has no biases. */
        cfg->qkv_bias = cfg->o_bias = false;
        break;
    default:
        /* Llama, Qwen3: attention_bias covers q/k/v and o_proj. */
        cfg->qkv_bias = cfg->o_bias = attn_bias;
        break;
    }
    cfg->qk_norm = cfg->arch == MC_ARCH_QWEN3;
    /* Sliding window: Mistral applies it whenever set; Qwen only with
     * use_sliding_window. */
    int64_t sw = 0;
    if (present(doc, "sliding_window") &&
        (rc = tg_json_get_int(doc, "sliding_window", ctx, 0, INT64_MAX, &sw,
                              err, errlen)) != 0)
        return rc;
    if (cfg->arch == MC_ARCH_MISTRAL ||
        ((cfg->arch == MC_ARCH_QWEN2 || cfg->arch == MC_ARCH_QWEN3) && use_sw))
        cfg->sliding_window = sw;

    const char *dkey = present(doc, "torch_dtype") ? "torch_dtype"
                       : present(doc, "dtype")     ? "dtype"
                                                   : NULL;
    if (dkey != NULL) {
        const char *dt;
        if ((rc = tg_json_get_string(doc, dkey, ctx, &dt, err, errlen)) != 0)
            return rc;
        if (strlen(dt) >= MC_DTYPE_LEN)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s.%s: '%s' is too long", ctx, dkey, dt);
        strcpy(cfg->torch_dtype, dt);
    }
    if (present(doc, "bos_token_id") &&
        (rc = token_id(json_object_get(doc, "bos_token_id"), ctx,
                       "bos_token_id", &cfg->bos_token_id, err, errlen)) != 0)
        return rc;
    if ((rc = parse_eos(cfg, doc, ctx, err, errlen)) != 0)
        return rc;
    char verr[256];
    rc = mc_model_config_validate(cfg, verr, sizeof verr);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "%s: %s", ctx, verr);
    return 0;
}

int mc_model_config_validate(const struct mc_model_config *cfg, char *err,
                             size_t errlen)
{
    if ((unsigned)cfg->arch >= MC_ARCH_COUNT)
        return tg_err_set(err, errlen, TG_EINVAL, "arch: %d is not valid",
                          (int)cfg->arch);
    const struct {
        const char *name;
        int v;
    } sizes[] = {
        {"hidden_size", cfg->hidden_size},
        {"intermediate_size", cfg->intermediate_size},
        {"num_hidden_layers", cfg->num_layers},
        {"num_attention_heads", cfg->num_heads},
        {"num_key_value_heads", cfg->num_kv_heads},
        {"head_dim", cfg->head_dim},
        {"vocab_size", cfg->vocab_size},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].v <= 0)
            return tg_err_set(err, errlen, TG_ERANGE,
                              "%s: %d must be positive", sizes[i].name,
                              sizes[i].v);
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "num_key_value_heads: %d does not divide "
                          "num_attention_heads %d", cfg->num_kv_heads,
                          cfg->num_heads);
    if (cfg->head_dim % 2 != 0)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "head_dim: %d must be even for RoPE", cfg->head_dim);
    if (cfg->max_position_embeddings <= 0)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "max_position_embeddings: must be positive");
    if (!(cfg->rms_norm_eps > 0.0) || !isfinite(cfg->rms_norm_eps))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "rms_norm_eps: %g must be positive",
                          cfg->rms_norm_eps);
    if (!(cfg->rope_theta > 1.0) || !isfinite(cfg->rope_theta))
        return tg_err_set(err, errlen, TG_ERANGE,
                          "rope_theta: %g must be greater than 1",
                          cfg->rope_theta);
    if (cfg->sliding_window < 0)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "sliding_window: must not be negative");
    const struct mc_rope_scaling *r = &cfg->rope_scaling;
    if (r->type == MC_ROPE_LLAMA3) {
        if (!(r->factor > 0.0) || !(r->low_freq_factor > 0.0))
            return tg_err_set(err, errlen, TG_ERANGE,
                              "rope_scaling: factor and low_freq_factor must "
                              "be positive");
        if (!(r->high_freq_factor > r->low_freq_factor))
            return tg_err_set(err, errlen, TG_ERANGE,
                              "rope_scaling.high_freq_factor: %g must exceed "
                              "low_freq_factor %g", r->high_freq_factor,
                              r->low_freq_factor);
        if (r->original_max_position_embeddings <= 0)
            return tg_err_set(err, errlen, TG_ERANGE,
                              "rope_scaling.original_max_position_embeddings:"
                              " must be positive");
    } else if (r->type != MC_ROPE_DEFAULT) {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rope_scaling: type %d is not valid", (int)r->type);
    }
    if (cfg->bos_token_id < -1 || cfg->bos_token_id >= cfg->vocab_size)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "bos_token_id: %d is outside [0, vocab_size %d)",
                          cfg->bos_token_id, cfg->vocab_size);
    if (cfg->n_eos < 0 || cfg->n_eos > MC_MAX_EOS)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "eos_token_id: bad count %d", cfg->n_eos);
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_token_ids[i] < 0 ||
            cfg->eos_token_ids[i] >= cfg->vocab_size)
            return tg_err_set(err, errlen, TG_ERANGE,
                              "eos_token_id: %d is outside [0, vocab_size "
                              "%d)", cfg->eos_token_ids[i], cfg->vocab_size);
    if (memchr(cfg->torch_dtype, '\0', MC_DTYPE_LEN) == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "torch_dtype: not NUL-terminated");
    return 0;
}

int mc_model_config_load(struct mc_model_config *cfg, const char *path,
                         char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    struct stat sb;
    char *file = NULL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path) + sizeof "/config.json";
        file = malloc(n);
        if (file == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        snprintf(file, n, "%s/config.json", path);
    }
    const char *p = file != NULL ? file : path;
    json_t *doc = NULL;
    int rc = tg_json_load_file(p, &doc, err, errlen);
    if (rc == 0)
        rc = mc_model_config_from_json(cfg, doc, p, err, errlen);
    json_decref(doc);
    free(file);
    return rc;
}

/* ---- writing ------------------------------------------------------------- */

int mc_model_config_to_json(const struct mc_model_config *cfg, json_t **out,
                            char *err, size_t errlen)
{
    *out = NULL;
    json_t *d = json_object();
    if (d == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    /* SET evaluates v only while nothing failed, so no value leaks. */
#define SET(k, v) (bad = bad || json_object_set_new(d, (k), (v)) != 0)
    int bad = 0;
    json_t *archs = json_array();
    SET("architectures", archs);
    bad = bad || json_array_append_new(
                     archs, json_string(mc_arch_name(cfg->arch))) != 0;
    SET("model_type", json_string(mc_arch_model_type(cfg->arch)));
    SET("hidden_act", json_string("silu"));
    SET("hidden_size", json_integer(cfg->hidden_size));
    SET("intermediate_size", json_integer(cfg->intermediate_size));
    SET("num_hidden_layers", json_integer(cfg->num_layers));
    SET("num_attention_heads", json_integer(cfg->num_heads));
    SET("num_key_value_heads", json_integer(cfg->num_kv_heads));
    SET("head_dim", json_integer(cfg->head_dim));
    SET("vocab_size", json_integer(cfg->vocab_size));
    SET("max_position_embeddings",
        json_integer((json_int_t)cfg->max_position_embeddings));
    SET("rms_norm_eps", json_real(cfg->rms_norm_eps));
    SET("rope_theta", json_real(cfg->rope_theta));
    if (cfg->rope_scaling.type == MC_ROPE_LLAMA3) {
        const struct mc_rope_scaling *r = &cfg->rope_scaling;
        json_t *rs = bad ? NULL : json_object();
        SET("rope_scaling", rs);
        if (!bad) {
            bad = json_object_set_new(rs, "factor", json_real(r->factor)) ||
                  json_object_set_new(rs, "low_freq_factor",
                                      json_real(r->low_freq_factor)) ||
                  json_object_set_new(rs, "high_freq_factor",
                                      json_real(r->high_freq_factor)) ||
                  json_object_set_new(rs, "original_max_position_embeddings",
                                      json_integer((json_int_t)r->original_max_position_embeddings)) ||
                  json_object_set_new(rs, "rope_type", json_string("llama3"));
        }
    } else {
        SET("rope_scaling", json_null());
    }
    SET("tie_word_embeddings", json_boolean(cfg->tie_word_embeddings));
    /* Qwen2's biases are implied by the architecture; Mistral has none. */
    if (cfg->arch == MC_ARCH_LLAMA || cfg->arch == MC_ARCH_QWEN3)
        SET("attention_bias", json_boolean(cfg->qkv_bias));
    if (cfg->arch == MC_ARCH_LLAMA)
        SET("mlp_bias", json_false());
    if (cfg->arch == MC_ARCH_QWEN2 || cfg->arch == MC_ARCH_QWEN3) {
        SET("use_sliding_window", json_boolean(cfg->sliding_window > 0));
        SET("sliding_window", cfg->sliding_window > 0
                                  ? json_integer((json_int_t)cfg->sliding_window)
                                  : json_null());
    } else if (cfg->arch == MC_ARCH_MISTRAL) {
        SET("sliding_window", cfg->sliding_window > 0
                                  ? json_integer((json_int_t)cfg->sliding_window)
                                  : json_null());
    }
    if (cfg->torch_dtype[0] != '\0')
        SET("torch_dtype", json_string(cfg->torch_dtype));
    SET("bos_token_id",
        cfg->bos_token_id >= 0 ? json_integer(cfg->bos_token_id) : json_null());
    if (cfg->n_eos == 1) {
        SET("eos_token_id", json_integer(cfg->eos_token_ids[0]));
    } else if (cfg->n_eos > 1) {
        json_t *e = bad ? NULL : json_array();
        SET("eos_token_id", e);
        for (int i = 0; !bad && i < cfg->n_eos; i++)
            bad = json_array_append_new(e, json_integer(cfg->eos_token_ids[i])) != 0;
    } else {
        SET("eos_token_id", json_null());
    }
    SET("use_cache", json_true());
#undef SET
    if (bad) {
        json_decref(d);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    *out = d;
    return 0;
}

int mc_model_config_write_json(const struct mc_model_config *cfg,
                               const char *path, char *err, size_t errlen)
{
    int rc = mc_model_config_validate(cfg, err, errlen);
    if (rc != 0)
        return rc;
    json_t *doc;
    if ((rc = mc_model_config_to_json(cfg, &doc, err, errlen)) != 0)
        return rc;
    rc = tg_json_dump_file(doc, path, err, errlen);
    json_decref(doc);
    return rc;
}

/* ---- RoPE ---------------------------------------------------------------- */

/*
 * Default RoPE (Su et al., "RoFormer", eq. 15): inv_freq[i] =
 * theta^(-2i/d) for i in [0, d/2).
 *
 * Llama-3 scaling, as in Hugging Face transformers
 * modeling_rope_utils._compute_llama3_parameters (and Meta's
 * llama-models apply_scaling): with L = original_max_position_embeddings,
 * wavelen = 2*pi / inv_freq,
 *   wavelen < L / high_freq_factor  -> unchanged (high frequencies)
 *   wavelen > L / low_freq_factor   -> inv_freq / factor (low frequencies)
 *   otherwise, with s = (L / wavelen - low_freq_factor) /
 *                       (high_freq_factor - low_freq_factor):
 *                                    (1 - s) * inv_freq / factor + s * inv_freq
 * Computed in double and rounded once to float.
 */
int mc_rope_inv_freq(const struct mc_model_config *cfg, float *inv_freq)
{
    int d = cfg->head_dim;
    if (d <= 0 || d % 2 != 0)
        return TG_EINVAL;
    const struct mc_rope_scaling *r = &cfg->rope_scaling;
    for (int i = 0; i < d / 2; i++) {
        double f = pow(cfg->rope_theta, -(double)(2 * i) / (double)d);
        if (r->type == MC_ROPE_LLAMA3) {
            double L = (double)r->original_max_position_embeddings;
            double low_wavelen = L / r->low_freq_factor;
            double high_wavelen = L / r->high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / r->factor;
            } else if (wavelen >= high_wavelen) {
                double s = (L / wavelen - r->low_freq_factor) /
                           (r->high_freq_factor - r->low_freq_factor);
                f = (1.0 - s) * f / r->factor + s * f;
            }
        }
        inv_freq[i] = (float)f;
    }
    return 0;
}
