/*
 * tangram-make-model — writes a small, randomly initialised but real
 * Hugging Face model directory (config.json, model.safetensors, tokenizer
 * files) for tests and benchmarks.
 *
 *   tangram-make-model --arch qwen3|qwen2|llama|mistral --tokenizer DIR -o DIR
 *       [--hidden N] [--layers N] [--heads N] [--kv-heads N] [--head-dim N]
 *       [--ffn N] [--tie] [--dtype bf16|fp16|fp32] [--seed S]
 *       [--rope-theta X] [--rope-scaling-llama3 FACTOR]
 *       [--rope-original-max N] [--max-position N] [--rms-eps X]
 *
 * vocab_size is the tokenizer's (largest id in tokenizer.json's model.vocab
 * and added_tokens, plus one); bos/eos ids come from the tokenizer dir's
 * generation_config (else from tokenizer_config's bos_token / eos_token).
 *
 * Weights are deterministic in (seed, tensor name): element i of a tensor
 * is a Box-Muller normal drawn from splitmix64 at counter (base + 2i,
 * base + 2i + 1), base = splitmix64(seed ^ FNV-1a(name)). Linear weights
 * are N(0, 1/sqrt(fan_in)) so activations keep unit scale and attention
 * logits have unit spread (peaky, unlike the usual 0.02 init which makes
 * attention near-uniform and top-k selection fragile); embeddings N(0, 1);
 * norm weights 1 + N(0, 0.1); biases N(0, 0.1).
 *
 * The flags are one tg_config table (common/base/tg_config.h): --help is
 * generated from it; an unknown flag or a bad value exits with status 2 and
 * a message naming the flag. No TANGRAM_* variables are read (a one-shot
 * tool; names such as --seed or --layers mean nothing to the daemon).
 */
#include "common/model/mc_model_config.h"
#include "common/model/st_safetensors.h"
#include "common/model/st_writer.h"
#include "common/base/tg_config.h"
#include "common/base/tg_err.h"
#include "common/base/tg_path.h"
#include "common/json/tg_json.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ERRLEN 512

/* The model to write, after the flags are checked. */
struct opts {
    enum mc_arch arch;
    int hidden, layers, heads, kv_heads, head_dim, ffn;
    int tie;
    const char *tokenizer;  /* borrowed from struct flags */
    const char *out;        /* borrowed from struct flags */
    enum st_dtype dtype;
    uint64_t seed;
    double rope_theta;
    double llama3_factor;   /* 0 = no rope scaling */
    int64_t rope_orig_max;
    int64_t max_position;
    double rms_eps;         /* 0 = architecture default */
};

/* The flags as tg_config fills them. */
struct flags {
    int arch;               /* index into arch_choices */
    int64_t hidden, layers, heads, kv_heads, head_dim, ffn;
    bool tie;
    char *tokenizer, *out, *seed;
    int dtype;              /* index into dtype_choices */
    double rope_theta, llama3_factor, rms_eps;
    int64_t rope_orig_max, max_position;
};

static const char *const arch_choices[] = {"qwen3", "qwen2", "llama",
                                           "mistral", NULL};
static const enum mc_arch arch_values[] = {MC_ARCH_QWEN3, MC_ARCH_QWEN2,
                                           MC_ARCH_LLAMA, MC_ARCH_MISTRAL};
static const char *const dtype_choices[] = {"bf16", "fp16", "fp32", NULL};
static const enum st_dtype dtype_values[] = {ST_DTYPE_BF16, ST_DTYPE_F16,
                                             ST_DTYPE_F32};

#define F_OFF(f, t) TG_CONFIG_OFFSET(struct flags, f, t)
static const struct tg_config_entry table[] = {
    {.name = "arch", .type = TG_CONFIG_ENUM, .choices = arch_choices,
     .offset = F_OFF(arch, int), .flags = TG_CONFIG_REQUIRED,
     .help = "Architecture of config.json (Qwen3ForCausalLM, "
             "Qwen2ForCausalLM, LlamaForCausalLM, MistralForCausalLM)."},
    {.name = "tokenizer", .type = TG_CONFIG_STRING,
     .offset = F_OFF(tokenizer, char *), .metavar = "DIR",
     .flags = TG_CONFIG_REQUIRED,
     .help = "Tokenizer directory (tokenizer.json, tokenizer_config*.json, "
             "optional generation_config*.json); sets vocab_size, bos and "
             "eos."},
    {.name = "output", .short_flag = 'o', .type = TG_CONFIG_STRING,
     .offset = F_OFF(out, char *), .metavar = "DIR",
     .flags = TG_CONFIG_REQUIRED,
     .help = "Model directory to write (created)."},
    {.name = "hidden", .type = TG_CONFIG_INT, .def = "64", .min = 1,
     .max = 65536, .offset = F_OFF(hidden, int64_t), .metavar = "N",
     .help = "hidden_size."},
    {.name = "layers", .type = TG_CONFIG_INT, .def = "2", .min = 1,
     .max = 1024, .offset = F_OFF(layers, int64_t), .metavar = "N",
     .help = "num_hidden_layers."},
    {.name = "heads", .type = TG_CONFIG_INT, .def = "4", .min = 1,
     .max = 1024, .offset = F_OFF(heads, int64_t), .metavar = "N",
     .help = "num_attention_heads."},
    {.name = "kv-heads", .type = TG_CONFIG_INT, .def = "2", .min = 1,
     .max = 1024, .offset = F_OFF(kv_heads, int64_t), .metavar = "N",
     .help = "num_key_value_heads; must divide --heads."},
    {.name = "head-dim", .type = TG_CONFIG_INT, .min = 2, .max = 1024,
     .offset = F_OFF(head_dim, int64_t), .metavar = "N",
     .help = "head_dim, even; default hidden / heads."},
    {.name = "ffn", .type = TG_CONFIG_INT, .def = "128", .min = 1,
     .max = 262144, .offset = F_OFF(ffn, int64_t), .metavar = "N",
     .help = "intermediate_size."},
    {.name = "tie", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = F_OFF(tie, bool),
     .help = "Tie the LM head to the embeddings (no lm_head.weight)."},
    {.name = "dtype", .type = TG_CONFIG_ENUM, .def = "bf16",
     .choices = dtype_choices, .offset = F_OFF(dtype, int),
     .help = "Weight dtype of model.safetensors."},
    {.name = "seed", .type = TG_CONFIG_STRING, .def = "0",
     .offset = F_OFF(seed, char *), .metavar = "S",
     .help = "Seed of the weights: a non-negative integer (decimal, 0x hex "
             "or 0 octal, up to 2^64 - 1)."},
    {.name = "rope-theta", .type = TG_CONFIG_DOUBLE, .def = "10000",
     .min = 1.0000001, .max = 1e12, .offset = F_OFF(rope_theta, double),
     .metavar = "X", .help = "rope_theta."},
    {.name = "rope-scaling-llama3", .type = TG_CONFIG_DOUBLE, .min = 1e-3,
     .max = 1e6, .offset = F_OFF(llama3_factor, double), .metavar = "FACTOR",
     .help = "Add Llama-3.1 rope_scaling with this factor (low 1, high 4); "
             "default none."},
    {.name = "rope-original-max", .type = TG_CONFIG_INT, .def = "8192",
     .min = 1, .max = INT32_MAX, .offset = F_OFF(rope_orig_max, int64_t),
     .metavar = "N",
     .help = "original_max_position_embeddings of the rope scaling."},
    {.name = "max-position", .type = TG_CONFIG_INT, .def = "32768", .min = 1,
     .max = INT32_MAX, .offset = F_OFF(max_position, int64_t),
     .metavar = "N", .help = "max_position_embeddings."},
    {.name = "rms-eps", .type = TG_CONFIG_DOUBLE, .min = 1e-12, .max = 1.0,
     .offset = F_OFF(rms_eps, double), .metavar = "X",
     .help = "rms_norm_eps; default 1e-6 for qwen, 1e-5 for llama and "
             "mistral."},
};
#undef F_OFF
#define N_TABLE (sizeof table / sizeof table[0])

static const char usage[] =
    "usage: tangram-make-model --arch qwen3|qwen2|llama|mistral "
    "--tokenizer DIR -o DIR [options]\n\n"
    "Writes a small, randomly initialised Hugging Face model directory "
    "(config.json,\nmodel.safetensors, tokenizer files) for tests and "
    "benchmarks.";

/* Checks what the table cannot (sizes that constrain each other, the seed)
 * and fills *o from *f; o borrows f's strings. Returns 0, or -1 after a
 * message on stderr. */
static int check_flags(const struct flags *f, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->arch = arch_values[f->arch];
    o->hidden = (int)f->hidden;
    o->layers = (int)f->layers;
    o->heads = (int)f->heads;
    o->kv_heads = (int)f->kv_heads;
    o->head_dim = (int)f->head_dim;
    o->ffn = (int)f->ffn;
    o->tie = f->tie;
    o->tokenizer = f->tokenizer;
    o->out = f->out;
    o->dtype = dtype_values[f->dtype];
    o->rope_theta = f->rope_theta;
    o->llama3_factor = f->llama3_factor;
    o->rope_orig_max = f->rope_orig_max;
    o->max_position = f->max_position;
    o->rms_eps = f->rms_eps;
    const char *a = f->seed;
    char *end;
    errno = 0;
    unsigned long long seed = strtoull(a, &end, 0);
    if (errno != 0 || end == a || *end != '\0' || a[0] == '-') {
        fprintf(stderr, "tangram-make-model: --seed: '%s' is not a "
                        "non-negative integer\n", a);
        return -1;
    }
    o->seed = seed;
    if (o->head_dim == 0) {
        if (o->hidden % o->heads != 0) {
            fprintf(stderr, "tangram-make-model: --hidden %d is not a "
                            "multiple of --heads %d; give --head-dim\n",
                    o->hidden, o->heads);
            return -1;
        }
        o->head_dim = o->hidden / o->heads;
    }
    if (o->heads % o->kv_heads != 0) {
        fprintf(stderr, "tangram-make-model: --heads %d is not a multiple "
                        "of --kv-heads %d\n", o->heads, o->kv_heads);
        return -1;
    }
    if (o->head_dim % 2 != 0) {
        fprintf(stderr, "tangram-make-model: --head-dim %d must be even "
                        "(RoPE rotates pairs)\n", o->head_dim);
        return -1;
    }
    if (o->rms_eps == 0.0)
        o->rms_eps = (o->arch == MC_ARCH_QWEN2 || o->arch == MC_ARCH_QWEN3)
                         ? 1e-6 : 1e-5;
    return 0;
}

/* ---- tokenizer directory ------------------------------------------------- */

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "tangram-make-model: out of memory\n");
        exit(1);
    }
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Finds "<stem>.json" in dir, else the alphabetically first
 * "<stem>.*.json" (the shared llama3 folder names its files
 * tokenizer_config.llama-3.2-3b-instruct.json). Returns a malloc'd path or
 * NULL when none exists. */
static char *find_variant(const char *dir, const char *stem)
{
    char exact[128];
    snprintf(exact, sizeof exact, "%s.json", stem);
    char *p = join(dir, exact);
    if (is_file(p))
        return p;
    free(p);
    DIR *d = opendir(dir);
    if (d == NULL)
        return NULL;
    char *best = NULL;
    size_t sl = strlen(stem);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        size_t nl = strlen(n);
        if (nl > sl + 6 && strncmp(n, stem, sl) == 0 && n[sl] == '.' &&
            strcmp(n + nl - 5, ".json") == 0 &&
            (best == NULL || strcmp(n, best) < 0)) {
            free(best);
            best = strdup(n);
        }
    }
    closedir(d);
    if (best == NULL)
        return NULL;
    p = join(dir, best);
    free(best);
    return p;
}

/* Largest token id in tokenizer.json (model.vocab and added_tokens). */
static int tokenizer_vocab(const json_t *tok, const char *path, int64_t *max_id,
                           char *err, size_t errlen)
{
    json_t *model = json_object_get(tok, "model");
    json_t *vocab = model ? json_object_get(model, "vocab") : NULL;
    if (!json_is_object(vocab))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: model.vocab is missing or not an object", path);
    int64_t mx = -1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: model.vocab.%s: expected a token id", path,
                              k);
        if (json_integer_value(v) > mx)
            mx = json_integer_value(v);
    }
    json_t *added = json_object_get(tok, "added_tokens");
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: added_tokens[%zu].id: expected a token id",
                              path, i);
        if (json_integer_value(id) > mx)
            mx = json_integer_value(id);
    }
    if (mx < 0 || mx >= INT32_MAX - 1)
        return tg_err_set(err, errlen, TG_EFORMAT, "%s: no usable vocabulary",
                          path);
    *max_id = mx;
    return 0;
}

/* Token id of the token text `tokv` (a string or {"content": ...}) via
 * added_tokens, then model.vocab; -1 when absent or null. */
static int token_by_text(const json_t *tok, const json_t *tokv)
{
    if (json_is_object(tokv))
        tokv = json_object_get(tokv, "content");
    if (!json_is_string(tokv))
        return -1;
    const char *s = json_string_value(tokv);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, v) {
        json_t *c = json_object_get(v, "content");
        if (json_is_string(c) && strcmp(json_string_value(c), s) == 0)
            return (int)json_integer_value(json_object_get(v, "id"));
    }
    json_t *id = json_object_get(json_object_get(json_object_get(tok, "model"),
                                                 "vocab"), s);
    return json_is_integer(id) ? (int)json_integer_value(id) : -1;
}

static int ids_from(const json_t *v, struct mc_model_config *cfg, int eos)
{
    if (eos) {
        cfg->n_eos = 0;
        if (json_is_integer(v)) {
            cfg->eos_token_ids[cfg->n_eos++] = (int)json_integer_value(v);
        } else if (json_is_array(v)) {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                if (!json_is_integer(x) || cfg->n_eos == MC_MAX_EOS)
                    return -1;
                cfg->eos_token_ids[cfg->n_eos++] = (int)json_integer_value(x);
            }
        } else if (v != NULL && !json_is_null(v)) {
            return -1;
        }
    } else {
        if (json_is_integer(v))
            cfg->bos_token_id = (int)json_integer_value(v);
        else if (v != NULL && !json_is_null(v))
            return -1;
    }
    return 0;
}

/* Copies src to dst atomically (temp name + rename). */
static int copy_file(const char *src, const char *dst, char *err,
                     size_t errlen)
{
    int rc = 0;
    char tmp[4096];
    TG_TRY(tg_path_fmt(tmp, sizeof tmp, err, errlen, "%s.tmp.%d", dst,
                       (int)getpid()));
    FILE *in = fopen(src, "rb"), *out = NULL;
    if (in == NULL)
        return tg_err_set(err, errlen, TG_EIO, "%s: %s", src, strerror(errno));
    out = fopen(tmp, "wb");
    if (out == NULL) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (fwrite(buf, 1, n, out) != n) {
            rc = tg_err_set(err, errlen, TG_EIO, "%s: write failed", tmp);
            goto done;
        }
    }
    if (ferror(in))
        rc = tg_err_set(err, errlen, TG_EIO, "%s: read failed", src);
done:
    fclose(in);
    if (out != NULL && fclose(out) != 0 && rc == 0)
        rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, dst) != 0)
        rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", dst, strerror(errno));
    if (rc != 0)
        unlink(tmp);
    return rc;
}

static int mkdir_p(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
    struct stat sb;
    return stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode) ? 0 : -1;
}

/* ---- weights ------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
    /* Steele, Lea, Flood, "Fast splittable pseudorandom number generators"
     * (OOPSLA 2014): golden-ratio increment plus the MurmurHash3-style
     * finaliser with Stafford's "mix13" constants. */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64-bit offset basis */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

struct gen {
    uint64_t base;
    float mean, std;
    enum st_dtype dtype;
};

/* Standard normal number i of stream `base` (Box-Muller, cosine branch). */
static double normal_at(uint64_t base, uint64_t i)
{
    uint64_t a = splitmix64(base + 2 * i), b = splitmix64(base + 2 * i + 1);
    double u1 = (double)((a >> 11) + 1) * 0x1p-53; /* (0, 1] */
    double u2 = (double)(b >> 11) * 0x1p-53;       /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Element k depends on (base, first + k) alone, so the threads of the
 * loop write exactly the bytes one thread would: an 8B-shaped checkpoint
 * (16 GB of bf16) is written in seconds per core, not minutes. */
static int gen_fill(void *ctx, uint64_t byte_offset, void *dst, size_t nbytes)
{
    const struct gen *g = ctx;
    size_t es = st_dtype_size(g->dtype);
    uint64_t first = byte_offset / es;
    size_t n = nbytes / es;
    uint8_t *p = dst;
    /* Element k depends only on its counter: threads change no byte. */
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t k = 0; k < n; k++) {
        float x = (float)(g->mean + g->std * normal_at(g->base, first + k));
        if (g->dtype == ST_DTYPE_F32) {
            memcpy(p + 4 * k, &x, 4);
        } else {
            uint16_t h = g->dtype == ST_DTYPE_BF16 ? st_f32_to_bf16(x)
                                                   : st_f32_to_f16(x);
            p[2 * k] = (uint8_t)h;
            p[2 * k + 1] = (uint8_t)(h >> 8);
        }
    }
    return 0;
}

struct model_builder {
    struct st_writer w;
    struct gen *gens;    /* (cap) stable storage for fill contexts */
    size_t n, cap;
    uint64_t seed;
    enum st_dtype dtype;
    uint64_t params;
};

static int add_tensor(struct model_builder *b, const char *name, int rank,
                      int64_t d0, int64_t d1, float mean, float std,
                      char *err, size_t errlen)
{
    TG_ASSERT(b->n < b->cap);
    struct gen *g = &b->gens[b->n++];
    g->base = splitmix64(b->seed ^ fnv1a(name));
    g->mean = mean;
    g->std = std;
    g->dtype = b->dtype;
    int64_t shape[2] = {d0, d1};
    b->params += (uint64_t)d0 * (uint64_t)(rank == 2 ? d1 : 1);
    return st_writer_add_fill(&b->w, name, b->dtype, rank, shape, gen_fill, g,
                              err, errlen);
}

static int add_linear(struct model_builder *b, const char *name, int64_t out,
                      int64_t in, char *err, size_t errlen)
{
    return add_tensor(b, name, 2, out, in, 0.0f, (float)(1.0 / sqrt((double)in)),
                      err, errlen);
}

static int build_weights(const struct mc_model_config *c, const struct opts *o,
                         const char *path, uint64_t *params, char *err,
                         size_t errlen)
{
    struct model_builder b;
    memset(&b, 0, sizeof b);
    st_writer_init(&b.w);
    b.seed = o->seed;
    b.dtype = o->dtype;
    b.cap = 3 + (size_t)c->num_layers * 16;
    b.gens = calloc(b.cap, sizeof *b.gens);
    if (b.gens == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    int64_t H = c->hidden_size, q = (int64_t)c->num_heads * c->head_dim;
    int64_t kv = (int64_t)c->num_kv_heads * c->head_dim;
    int rc = add_tensor(&b, "model.embed_tokens.weight", 2, c->vocab_size, H,
                        0.0f, 1.0f, err, errlen);
    char name[128];
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
    for (int l = 0; rc == 0 && l < c->num_layers; l++) {
        if ((rc = add_tensor(&b, NAME("input_layernorm.weight"), 1, H, 0, 1.0f,
                             0.1f, err, errlen)) != 0 ||
            (rc = add_linear(&b, NAME("self_attn.q_proj.weight"), q, H, err,
                             errlen)) != 0 ||
            (rc = add_linear(&b, NAME("self_attn.k_proj.weight"), kv, H, err,
                             errlen)) != 0 ||
            (rc = add_linear(&b, NAME("self_attn.v_proj.weight"), kv, H, err,
                             errlen)) != 0 ||
            (rc = add_linear(&b, NAME("self_attn.o_proj.weight"), H, q, err,
                             errlen)) != 0)
            break;
        if (c->qkv_bias &&
            ((rc = add_tensor(&b, NAME("self_attn.q_proj.bias"), 1, q, 0, 0.0f,
                              0.1f, err, errlen)) != 0 ||
             (rc = add_tensor(&b, NAME("self_attn.k_proj.bias"), 1, kv, 0,
                              0.0f, 0.1f, err, errlen)) != 0 ||
             (rc = add_tensor(&b, NAME("self_attn.v_proj.bias"), 1, kv, 0,
                              0.0f, 0.1f, err, errlen)) != 0))
            break;
        if (c->o_bias &&
            (rc = add_tensor(&b, NAME("self_attn.o_proj.bias"), 1, H, 0, 0.0f,
                             0.1f, err, errlen)) != 0)
            break;
        if (c->qk_norm &&
            ((rc = add_tensor(&b, NAME("self_attn.q_norm.weight"), 1,
                              c->head_dim, 0, 1.0f, 0.1f, err, errlen)) != 0 ||
             (rc = add_tensor(&b, NAME("self_attn.k_norm.weight"), 1,
                              c->head_dim, 0, 1.0f, 0.1f, err, errlen)) != 0))
            break;
        if ((rc = add_tensor(&b, NAME("post_attention_layernorm.weight"), 1, H,
                             0, 1.0f, 0.1f, err, errlen)) != 0 ||
            (rc = add_linear(&b, NAME("mlp.gate_proj.weight"),
                             c->intermediate_size, H, err, errlen)) != 0 ||
            (rc = add_linear(&b, NAME("mlp.up_proj.weight"),
                             c->intermediate_size, H, err, errlen)) != 0 ||
            (rc = add_linear(&b, NAME("mlp.down_proj.weight"), H,
                             c->intermediate_size, err, errlen)) != 0)
            break;
    }
#undef NAME
    if (rc == 0)
        rc = add_tensor(&b, "model.norm.weight", 1, H, 0, 1.0f, 0.1f, err,
                        errlen);
    if (rc == 0 && !c->tie_word_embeddings)
        rc = add_linear(&b, "lm_head.weight", c->vocab_size, H, err, errlen);
    if (rc == 0)
        rc = st_writer_add_metadata(&b.w, "format", "pt", err, errlen);
    if (rc == 0)
        rc = st_writer_write(&b.w, path, err, errlen);
    *params = b.params;
    st_writer_free(&b.w);
    free(b.gens);
    return rc;
}

/* ---- main ---------------------------------------------------------------- */

static int die(const char *msg)
{
    fprintf(stderr, "tangram-make-model: %s\n", msg);
    return 1;
}

/* Writes the model directory described by *o. Returns the exit status. */
static int make_model(const struct opts *o)
{
    char err[ERRLEN];
    struct stat sb;
    if (stat(o->tokenizer, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "tangram-make-model: --tokenizer: '%s' is not a "
                        "directory\n", o->tokenizer);
        return 2;
    }
    char *tok_path = join(o->tokenizer, "tokenizer.json");
    char *tcfg_path = find_variant(o->tokenizer, "tokenizer_config");
    char *gcfg_path = find_variant(o->tokenizer, "generation_config");
    json_t *tok = NULL, *tcfg = NULL, *gcfg = NULL;
    int status = 1;
    if (!is_file(tok_path)) {
        fprintf(stderr, "tangram-make-model: %s: no such file\n", tok_path);
        status = 2;
        goto out;
    }
    if (tcfg_path == NULL) {
        fprintf(stderr, "tangram-make-model: %s: no tokenizer_config.json\n",
                o->tokenizer);
        status = 2;
        goto out;
    }
    int64_t max_id = 0;
    if (tg_json_load_file(tok_path, &tok, err, sizeof err) != 0 ||
        tokenizer_vocab(tok, tok_path, &max_id, err, sizeof err) != 0 ||
        tg_json_load_file(tcfg_path, &tcfg, err, sizeof err) != 0 ||
        (gcfg_path != NULL &&
         tg_json_load_file(gcfg_path, &gcfg, err, sizeof err) != 0)) {
        status = die(err);
        goto out;
    }

    struct mc_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = o->arch;
    c.hidden_size = o->hidden;
    c.intermediate_size = o->ffn;
    c.num_layers = o->layers;
    c.num_heads = o->heads;
    c.num_kv_heads = o->kv_heads;
    c.head_dim = o->head_dim;
    c.vocab_size = (int)(max_id + 1);
    c.max_position_embeddings = o->max_position;
    c.rms_norm_eps = o->rms_eps;
    c.rope_theta = o->rope_theta;
    if (o->llama3_factor > 0.0) {
        /* The Llama-3.1 release values apart from the factor. */
        c.rope_scaling.type = MC_ROPE_LLAMA3;
        c.rope_scaling.factor = o->llama3_factor;
        c.rope_scaling.low_freq_factor = 1.0;
        c.rope_scaling.high_freq_factor = 4.0;
        c.rope_scaling.original_max_position_embeddings = o->rope_orig_max;
    }
    c.tie_word_embeddings = o->tie != 0;
    c.qkv_bias = o->arch == MC_ARCH_QWEN2;
    c.o_bias = false;
    c.qk_norm = o->arch == MC_ARCH_QWEN3;
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "%s",
             o->dtype == ST_DTYPE_BF16  ? "bfloat16"
             : o->dtype == ST_DTYPE_F16 ? "float16"
                                       : "float32");
    c.bos_token_id = -1;
    if (gcfg != NULL) {
        if (ids_from(json_object_get(gcfg, "bos_token_id"), &c, 0) != 0 ||
            ids_from(json_object_get(gcfg, "eos_token_id"), &c, 1) != 0) {
            fprintf(stderr, "tangram-make-model: %s: bad bos/eos_token_id\n",
                    gcfg_path);
            goto out;
        }
    }
    if (c.bos_token_id < 0)
        c.bos_token_id = token_by_text(tok, json_object_get(tcfg, "bos_token"));
    if (c.n_eos == 0) {
        int e = token_by_text(tok, json_object_get(tcfg, "eos_token"));
        if (e >= 0)
            c.eos_token_ids[c.n_eos++] = e;
    }
    if (mc_model_config_validate(&c, err, sizeof err) != 0) {
        status = die(err);
        goto out;
    }
    if (mkdir_p(o->out) != 0) {
        fprintf(stderr, "tangram-make-model: -o %s: cannot create directory: "
                        "%s\n", o->out, strerror(errno));
        goto out;
    }
    char *p = join(o->out, "config.json");
    int rc = mc_model_config_write_json(&c, p, err, sizeof err);
    free(p);
    if (rc != 0) {
        status = die(err);
        goto out;
    }
    const struct {
        const char *src;
        const char *dst;
    } copies[] = {
        {tok_path, "tokenizer.json"},
        {tcfg_path, "tokenizer_config.json"},
        {gcfg_path, "generation_config.json"},
    };
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++) {
        if (copies[i].src == NULL)
            continue;
        p = join(o->out, copies[i].dst);
        rc = copy_file(copies[i].src, p, err, sizeof err);
        free(p);
        if (rc != 0) {
            status = die(err);
            goto out;
        }
    }
    uint64_t params = 0;
    p = join(o->out, "model.safetensors");
    rc = build_weights(&c, o, p, &params, err, sizeof err);
    free(p);
    if (rc != 0) {
        status = die(err);
        goto out;
    }
    printf("%s: %s, %d layers, hidden %d, heads %d/%d x %d, ffn %d, vocab "
           "%d, %llu parameters (%s)\n",
           o->out, mc_arch_name(c.arch), c.num_layers, c.hidden_size,
           c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
           c.vocab_size, (unsigned long long)params, st_dtype_name(o->dtype));
    status = 0;
out:
    json_decref(tok);
    json_decref(tcfg);
    json_decref(gcfg);
    free(tok_path);
    free(tcfg_path);
    free(gcfg_path);
    return status;
}

int main(int argc, char **argv)
{
    struct flags f;
    memset(&f, 0, sizeof f);
    char err[ERRLEN];
    struct tg_config_cli cli = {.usage = usage, .help_out = stdout,
                                .no_env = true};
    int rc = tg_config_parse_cli(table, N_TABLE, &f, &cli, argc, argv, NULL,
                                 err, sizeof err);
    int status;
    struct opts o;
    if (rc == TG_EDONE) {
        status = 0;
    } else if (rc != 0) {
        fprintf(stderr, "tangram-make-model: %s\n(see tangram-make-model "
                        "--help)\n", err);
        status = 2;
    } else if (check_flags(&f, &o) != 0) {
        status = 2;
    } else {
        status = make_model(&o);
    }
    tg_config_free(table, N_TABLE, &f);
    return status;
}
