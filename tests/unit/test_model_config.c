/* test_model_config.c — config.json parsing, validation, writing and RoPE
 * frequencies (common/model/mc_model_config.h). With TANGRAM_TEST_MODEL_DIR set
 * (tests/integration/test_make_model.sh does), it also checks that model
 * directory end to end: config plus every expected weight. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/mc_model_config.h"
#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_support.h"

static char errbuf[512];

/* ---- every real config ---------------------------------------------------- */

struct expect {
    const char *file;
    enum mc_arch arch;
    int layers, hidden, ffn, heads, kv, head_dim, vocab;
    int64_t max_pos;
    double eps, theta;
    double llama3_factor; /* 0 = default rope */
    bool tie, qkv_bias, qk_norm;
    int bos, n_eos, eos0;
};

static const struct expect expected[] = {
    {"Qwen--Qwen2.5-7B-Instruct_config.json", MC_ARCH_QWEN2, 28, 3584, 18944,
     28, 4, 128, 152064, 32768, 1e-6, 1e6, 0, false, true, false, 151643, 1,
     151645},
    {"Qwen--Qwen3-0.6B_config.json", MC_ARCH_QWEN3, 28, 1024, 3072, 16, 8,
     128, 151936, 40960, 1e-6, 1e6, 0, true, false, true, 151643, 1, 151645},
    {"Qwen--Qwen3-1.7B_config.json", MC_ARCH_QWEN3, 28, 2048, 6144, 16, 8,
     128, 151936, 40960, 1e-6, 1e6, 0, true, false, true, 151643, 1, 151645},
    {"Qwen--Qwen3-4B_config.json", MC_ARCH_QWEN3, 36, 2560, 9728, 32, 8, 128,
     151936, 40960, 1e-6, 1e6, 0, true, false, true, 151643, 1, 151645},
    {"Qwen--Qwen3-8B_config.json", MC_ARCH_QWEN3, 36, 4096, 12288, 32, 8, 128,
     151936, 40960, 1e-6, 1e6, 0, false, false, true, 151643, 1, 151645},
    {"Qwen--Qwen3-32B_config.json", MC_ARCH_QWEN3, 64, 5120, 25600, 64, 8,
     128, 151936, 40960, 1e-6, 1e6, 0, false, false, true, 151643, 1, 151645},
    {"meta-llama--Llama-3.1-8B-Instruct_config.json", MC_ARCH_LLAMA, 32, 4096,
     14336, 32, 8, 128, 128256, 131072, 1e-5, 5e5, 8, false, false, false,
     128000, 3, 128001},
    {"meta-llama--Llama-3.2-3B-Instruct_config.json", MC_ARCH_LLAMA, 28, 3072,
     8192, 24, 8, 128, 128256, 131072, 1e-5, 5e5, 32, true, false, false,
     128000, 3, 128001},
    {"meta-llama--Llama-3.3-70B-Instruct_config.json", MC_ARCH_LLAMA, 80,
     8192, 28672, 64, 8, 128, 128256, 131072, 1e-5, 5e5, 8, false, false,
     false, 128000, 3, 128001},
    {"meta-llama--Meta-Llama-3.1-70B_config.json", MC_ARCH_LLAMA, 80, 8192,
     28672, 64, 8, 128, 128256, 131072, 1e-5, 5e5, 8, false, false, false,
     128000, 1, 128001},
    {"meta-llama--Meta-Llama-3.1-8B_config.json", MC_ARCH_LLAMA, 32, 4096,
     14336, 32, 8, 128, 128256, 131072, 1e-5, 5e5, 8, false, false, false,
     128000, 1, 128001},
};
#define N_EXPECTED (sizeof expected / sizeof expected[0])

static void check_expect(const struct mc_model_config *c,
                         const struct expect *e)
{
    assert_int_equal(c->arch, e->arch);
    assert_int_equal(c->num_layers, e->layers);
    assert_int_equal(c->hidden_size, e->hidden);
    assert_int_equal(c->intermediate_size, e->ffn);
    assert_int_equal(c->num_heads, e->heads);
    assert_int_equal(c->num_kv_heads, e->kv);
    assert_int_equal(c->head_dim, e->head_dim);
    assert_int_equal(c->vocab_size, e->vocab);
    assert_int_equal(c->max_position_embeddings, e->max_pos);
    assert_true(c->rms_norm_eps == e->eps);
    assert_true(c->rope_theta == e->theta);
    if (e->llama3_factor > 0) {
        assert_int_equal(c->rope_scaling.type, MC_ROPE_LLAMA3);
        assert_true(c->rope_scaling.factor == e->llama3_factor);
        assert_true(c->rope_scaling.low_freq_factor == 1.0);
        assert_true(c->rope_scaling.high_freq_factor == 4.0);
        assert_int_equal(c->rope_scaling.original_max_position_embeddings,
                         8192);
    } else {
        assert_int_equal(c->rope_scaling.type, MC_ROPE_DEFAULT);
    }
    assert_int_equal(c->tie_word_embeddings, e->tie);
    assert_int_equal(c->qkv_bias, e->qkv_bias);
    assert_false(c->o_bias);
    assert_int_equal(c->qk_norm, e->qk_norm);
    assert_int_equal(c->sliding_window, 0);
    assert_string_equal(c->torch_dtype, "bfloat16");
    assert_int_equal(c->bos_token_id, e->bos);
    assert_int_equal(c->n_eos, e->n_eos);
    assert_int_equal(c->eos_token_ids[0], e->eos0);
    if (e->n_eos == 3) {
        assert_int_equal(c->eos_token_ids[1], 128008);
        assert_int_equal(c->eos_token_ids[2], 128009);
    }
}

static void assert_same(const struct mc_model_config *a,
                        const struct mc_model_config *b)
{
    assert_int_equal(a->arch, b->arch);
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->num_layers, b->num_layers);
    assert_int_equal(a->num_heads, b->num_heads);
    assert_int_equal(a->num_kv_heads, b->num_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_true(a->rope_theta == b->rope_theta);
    assert_int_equal(a->rope_scaling.type, b->rope_scaling.type);
    assert_true(a->rope_scaling.factor == b->rope_scaling.factor);
    assert_true(a->rope_scaling.low_freq_factor ==
                b->rope_scaling.low_freq_factor);
    assert_true(a->rope_scaling.high_freq_factor ==
                b->rope_scaling.high_freq_factor);
    assert_int_equal(a->rope_scaling.original_max_position_embeddings,
                     b->rope_scaling.original_max_position_embeddings);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->qkv_bias, b->qkv_bias);
    assert_int_equal(a->o_bias, b->o_bias);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->sliding_window, b->sliding_window);
    assert_string_equal(a->torch_dtype, b->torch_dtype);
    assert_int_equal(a->bos_token_id, b->bos_token_id);
    assert_int_equal(a->n_eos, b->n_eos);
    for (int i = 0; i < a->n_eos; i++)
        assert_int_equal(a->eos_token_ids[i], b->eos_token_ids[i]);
}

static void test_project_configs(void **state)
{
    (void)state;
    char dir[512];
    tt_data_path("configs", dir, sizeof dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        fail_msg("project data folder missing: %s", dir);
    size_t seen = 0;
    struct dirent *de;
    char tmp[256];
    assert_int_equal(tt_tmpdir_make("tg_mc_test.", tmp, sizeof tmp), 0);
    char out[600];
    snprintf(out, sizeof out, "%s/config.json", tmp);
    while ((de = readdir(d)) != NULL) {
        if (strstr(de->d_name, ".json") == NULL)
            continue;
        const struct expect *e = NULL;
        for (size_t i = 0; i < N_EXPECTED; i++)
            if (strcmp(expected[i].file, de->d_name) == 0)
                e = &expected[i];
        if (e == NULL)
            fail_msg("%s: a config without expectations; add it", de->d_name);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct mc_model_config c, c2;
        if (mc_model_config_load(&c, path, errbuf, sizeof errbuf) != 0)
            fail_msg("%s: %s", path, errbuf);
        check_expect(&c, e);
        /* Written back, it loads into the same struct (also via the
         * directory form of the path). */
        assert_int_equal(mc_model_config_write_json(&c, out, errbuf,
                                                    sizeof errbuf), 0);
        assert_int_equal(mc_model_config_load(&c2, tmp, errbuf,
                                              sizeof errbuf), 0);
        assert_same(&c, &c2);
        seen++;
    }
    closedir(d);
    assert_int_equal(seen, N_EXPECTED);
    tt_tmpdir_remove(tmp);
}

/* ---- malformed and edge-case configs -------------------------------------- */

#define BASE                                                                  \
    "\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"   \
    "\"num_attention_heads\":4,\"vocab_size\":1000"

static int parse(const char *text, struct mc_model_config *c)
{
    json_error_t je;
    json_t *doc = json_loads(text, 0, &je);
    if (doc == NULL)
        fail_msg("test JSON invalid: %s: %s", text, je.text);
    errbuf[0] = '\0';
    int rc = mc_model_config_from_json(c, doc, "cfg", errbuf, sizeof errbuf);
    json_decref(doc);
    return rc;
}

static void test_defaults(void **state)
{
    (void)state;
    struct mc_model_config c;
    assert_int_equal(parse("{\"architectures\":[\"LlamaForCausalLM\"]," BASE
                           "}", &c), 0);
    assert_int_equal(c.num_kv_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_true(c.rope_theta == 10000.0);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_int_equal(c.rope_scaling.type, MC_ROPE_DEFAULT);
    assert_false(c.tie_word_embeddings);
    assert_false(c.qkv_bias);
    assert_false(c.qk_norm);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos, 0);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_string_equal(c.torch_dtype, "");
    /* Nulls mean "default". */
    assert_int_equal(parse("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE
                           ",\"head_dim\":null,\"num_key_value_heads\":null,"
                           "\"rope_scaling\":null,\"eos_token_id\":null,"
                           "\"bos_token_id\":null,\"sliding_window\":null}",
                           &c), 0);
    assert_int_equal(c.head_dim, 16);
    assert_true(c.qk_norm);
    /* Qwen2 always has q/k/v biases; Llama follows attention_bias. */
    assert_int_equal(parse("{\"architectures\":[\"Qwen2ForCausalLM\"]," BASE
                           "}", &c), 0);
    assert_true(c.qkv_bias);
    assert_false(c.o_bias);
    assert_int_equal(parse("{\"architectures\":[\"LlamaForCausalLM\"]," BASE
                           ",\"attention_bias\":true}", &c), 0);
    assert_true(c.qkv_bias);
    assert_true(c.o_bias);
    /* Mistral: sliding window kept when set. */
    assert_int_equal(parse("{\"architectures\":[\"MistralForCausalLM\"]," BASE
                           ",\"num_key_value_heads\":2,\"sliding_window\":4096,"
                           "\"rope_theta\":1000000.0,\"torch_dtype\":\"float16\","
                           "\"eos_token_id\":2,\"bos_token_id\":1}", &c), 0);
    assert_int_equal(c.arch, MC_ARCH_MISTRAL);
    assert_int_equal(c.sliding_window, 4096);
    assert_string_equal(c.torch_dtype, "float16");
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
    /* Qwen: sliding window only with use_sliding_window. */
    assert_int_equal(parse("{\"architectures\":[\"Qwen2ForCausalLM\"]," BASE
                           ",\"sliding_window\":4096,"
                           "\"use_sliding_window\":false}", &c), 0);
    assert_int_equal(c.sliding_window, 0);
    /* Explicit head_dim that does not divide hidden (Qwen3 style). */
    assert_int_equal(parse("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE
                           ",\"head_dim\":128,\"num_key_value_heads\":2}", &c),
                     0);
    assert_int_equal(c.head_dim, 128);
    /* rope_scaling spelled with "type", and type "default". */
    assert_int_equal(parse("{\"architectures\":[\"LlamaForCausalLM\"]," BASE
                           ",\"rope_scaling\":{\"type\":\"llama3\","
                           "\"factor\":8.0,\"low_freq_factor\":1.0,"
                           "\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":8192}}", &c),
                     0);
    assert_int_equal(c.rope_scaling.type, MC_ROPE_LLAMA3);
    assert_int_equal(parse("{\"architectures\":[\"LlamaForCausalLM\"]," BASE
                           ",\"rope_scaling\":{\"rope_type\":\"default\"}}",
                           &c), 0);
    assert_int_equal(c.rope_scaling.type, MC_ROPE_DEFAULT);
    /* transformers 5 "rope_parameters" with the theta inside; "dtype". */
    assert_int_equal(parse("{\"architectures\":[\"LlamaForCausalLM\"]," BASE
                           ",\"rope_parameters\":{\"rope_type\":\"llama3\","
                           "\"rope_theta\":500000.0,\"factor\":32.0,"
                           "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":8192},"
                           "\"dtype\":\"bfloat16\"}", &c), 0);
    assert_true(c.rope_theta == 5e5);
    assert_true(c.rope_scaling.factor == 32.0);
    assert_string_equal(c.torch_dtype, "bfloat16");
    /* Integral reals are accepted as sizes. */
    assert_int_equal(parse("{\"architectures\":[\"LlamaForCausalLM\"],"
                           "\"hidden_size\":64.0,\"intermediate_size\":128,"
                           "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                           "\"vocab_size\":1000}", &c), 0);
    assert_string_equal(mc_arch_name(MC_ARCH_QWEN3), "Qwen3ForCausalLM");
    assert_string_equal(mc_arch_model_type(MC_ARCH_QWEN2), "qwen2");
    assert_string_equal(mc_arch_name(MC_ARCH_COUNT), "?");
}

static void test_malformed(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int want;
        const char *needle; /* must appear in the message */
    } cases[] = {
        {"{\"architectures\":[\"GPT2LMHeadModel\"]," BASE "}",
         TG_EUNSUPPORTED, "GPT2LMHeadModel"},
        {"{" BASE "}", TG_ENOTFOUND, "architectures"},
        {"{\"architectures\":[]," BASE "}", TG_EFORMAT, "architectures"},
        {"{\"architectures\":[7]," BASE "}", TG_EFORMAT, "architectures"},
        {"{\"architectures\":\"LlamaForCausalLM\"," BASE "}", TG_EFORMAT,
         "architectures"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"intermediate_size\":128,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"vocab_size\":1000}", TG_ENOTFOUND, "hidden_size"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":0,"
         "\"intermediate_size\":128,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"vocab_size\":1000}", TG_ERANGE,
         "hidden_size"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":\"64\","
         "\"intermediate_size\":128,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"vocab_size\":1000}", TG_EFORMAT,
         "hidden_size"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,"
         "\"intermediate_size\":128,\"num_hidden_layers\":-2,"
         "\"num_attention_heads\":4,\"vocab_size\":1000}", TG_ERANGE,
         "num_hidden_layers"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"num_key_value_heads\":3}", TG_ERANGE, "num_key_value_heads"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"num_key_value_heads\":0}", TG_ERANGE, "num_key_value_heads"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"head_dim\":15}", TG_ERANGE, "head_dim"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":66,"
         "\"intermediate_size\":128,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"vocab_size\":1000}", TG_ERANGE,
         "head_dim"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}",
         TG_EUNSUPPORTED, "yarn"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}",
         TG_EUNSUPPORTED, "linear"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
         "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0}}", TG_ENOTFOUND,
         "original_max_position_embeddings"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
         "\"low_freq_factor\":4.0,\"high_freq_factor\":4.0,"
         "\"original_max_position_embeddings\":8192}}", TG_ERANGE,
         "high_freq_factor"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":-1.0,"
         "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
         "\"original_max_position_embeddings\":8192}}", TG_ERANGE, "factor"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rope_scaling\":\"llama3\"}", TG_EFORMAT, "rope_scaling"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rope_scaling\":{\"rope_type\":3}}", TG_EFORMAT, "rope_type"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rope_theta\":0}", TG_ERANGE, "rope_theta"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"rms_norm_eps\":-1e-5}", TG_ERANGE, "rms_norm_eps"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"hidden_act\":\"gelu\"}", TG_EUNSUPPORTED, "hidden_act"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"mlp_bias\":true}", TG_EUNSUPPORTED, "mlp_bias"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"tie_word_embeddings\":\"yes\"}", TG_EFORMAT,
         "tie_word_embeddings"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"eos_token_id\":\"</s>\"}", TG_EFORMAT, "eos_token_id"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"eos_token_id\":[1,-2]}", TG_EFORMAT, "eos_token_id[1]"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", TG_ERANGE, "eos_token_id"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"eos_token_id\":1000}", TG_ERANGE, "eos_token_id"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"bos_token_id\":5000}", TG_ERANGE, "bos_token_id"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"torch_dtype\":\"an-extremely-long-dtype\"}", TG_EFORMAT,
         "torch_dtype"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]," BASE
         ",\"max_position_embeddings\":0}", TG_ERANGE,
         "max_position_embeddings"},
        {"[1,2]", TG_EFORMAT, "object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct mc_model_config c;
        int rc = parse(cases[i].json, &c);
        if (rc != cases[i].want || strstr(errbuf, cases[i].needle) == NULL)
            fail_msg("case %zu: got %s '%s', want %s naming '%s'", i,
                     tg_err_name(rc), errbuf, tg_err_name(cases[i].want),
                     cases[i].needle);
    }
}

static void test_load_errors(void **state)
{
    (void)state;
    struct mc_model_config c;
    char tmp[256];
    assert_int_equal(tt_tmpdir_make("tg_mc_err.", tmp, sizeof tmp), 0);
    /* A directory without config.json. */
    assert_int_equal(mc_model_config_load(&c, tmp, errbuf, sizeof errbuf),
                     TG_ENOENT);
    assert_int_equal(mc_model_config_load(&c, "/nonexistent/config.json",
                                          errbuf, sizeof errbuf), TG_ENOENT);
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", tmp);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ", f);
    fclose(f);
    assert_int_equal(mc_model_config_load(&c, tmp, errbuf, sizeof errbuf),
                     TG_EFORMAT);
    assert_non_null(strstr(errbuf, "config.json"));
    /* Writing refuses an invalid struct. */
    memset(&c, 0, sizeof c);
    assert_int_equal(mc_model_config_write_json(&c, p, errbuf, sizeof errbuf),
                     TG_ERANGE);
    tt_tmpdir_remove(tmp);
}

/* ---- RoPE ----------------------------------------------------------------- */

static void test_rope(void **state)
{
    (void)state;
    struct mc_model_config c;
    memset(&c, 0, sizeof c);
    c.head_dim = 128;
    c.rope_theta = 10000.0;
    float inv[64];
    assert_int_equal(mc_rope_inv_freq(&c, inv), 0);
    for (int i = 0; i < 64; i++) {
        double want = pow(10000.0, -2.0 * i / 128.0);
        assert_true(fabs(inv[i] - want) <= 1e-6 * want);
    }
    assert_true(inv[0] == 1.0f);

    /* Llama-3.1-8B: theta 5e5, factor 8, low 1, high 4, L 8192. Reference
     * values from a numpy transcription of transformers'
     * _compute_llama3_parameters (float64). */
    char path[512];
    tt_data_path("configs/meta-llama--Llama-3.1-8B-Instruct_config.json",
                   path, sizeof path);
    if (mc_model_config_load(&c, path, errbuf, sizeof errbuf) != 0) {
        /* Without the shared data, build the same parameters by hand. */
        memset(&c, 0, sizeof c);
        c.head_dim = 128;
        c.rope_theta = 500000.0;
        c.rope_scaling = (struct mc_rope_scaling){MC_ROPE_LLAMA3, 8.0, 1.0,
                                                  4.0, 8192};
    }
    assert_int_equal(mc_rope_inv_freq(&c, inv), 0);
    static const struct {
        int i;
        double v;
    } ref[] = {
        {0, 1.0},
        {1, 8.146172339e-01},
        {20, 1.656044008e-02},
        {28, 3.211445995e-03},  /* last unscaled (high frequency) */
        {29, 2.166570764e-03},  /* smooth band */
        {30, 1.371893568e-03},
        {31, 8.567514129e-04},
        {32, 5.248461610e-04},
        {33, 3.126937504e-04},
        {34, 1.785078128e-04},
        {35, 9.556212354e-05},  /* first divided by the factor */
        {50, 4.411534675e-06},
        {63, 3.068925989e-07},
    };
    for (size_t k = 0; k < sizeof ref / sizeof ref[0]; k++) {
        double got = inv[ref[k].i];
        if (fabs(got - ref[k].v) > 2e-6 * ref[k].v)
            fail_msg("inv_freq[%d] = %.9e, want %.9e", ref[k].i, got,
                     ref[k].v);
    }
    /* Scaling never raises a frequency and the result stays decreasing. */
    for (int i = 1; i < 64; i++)
        assert_true(inv[i] < inv[i - 1]);
    for (int i = 0; i < 64; i++) {
        double base = pow(500000.0, -2.0 * i / 128.0);
        assert_true(inv[i] <= base * (1 + 1e-6));
        assert_true(inv[i] >= base / 8 * (1 - 1e-6));
    }
    c.head_dim = 7;
    assert_int_equal(mc_rope_inv_freq(&c, inv), TG_EINVAL);
    c.head_dim = 0;
    assert_int_equal(mc_rope_inv_freq(&c, inv), TG_EINVAL);
}

/* ---- a generated model directory (TANGRAM_TEST_MODEL_DIR) ------------------ */

static void expect_tensor(const struct st_model *m, const char *name,
                          enum st_dtype dt, int rank, int64_t d0, int64_t d1)
{
    const struct st_tensor *t = st_model_find(m, name);
    if (t == NULL)
        fail_msg("missing tensor %s", name);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->rank, rank);
    assert_int_equal(t->shape[0], d0);
    if (rank == 2)
        assert_int_equal(t->shape[1], d1);
}

/* Mean and standard deviation of a tensor's values. */
static void stats(const struct st_tensor *t, double *mean, double *sd)
{
    uint64_t rows = st_tensor_rows(t), n = t->numel;
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    assert_int_equal(st_tensor_read_f32(t, 0, rows, v, errbuf, sizeof errbuf),
                     0);
    double s = 0, s2 = 0;
    for (uint64_t i = 0; i < n; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
    free(v);
}

static void test_generated_model(void **state)
{
    (void)state;
    const char *dir = getenv("TANGRAM_TEST_MODEL_DIR");
    assert_non_null(dir); /* main registers this test only when it is set */
    struct mc_model_config c;
    if (mc_model_config_load(&c, dir, errbuf, sizeof errbuf) != 0)
        fail_msg("%s", errbuf);
    struct st_model m;
    if (st_model_open(&m, dir, errbuf, sizeof errbuf) != 0)
        fail_msg("%s", errbuf);
    enum st_dtype dt = strcmp(c.torch_dtype, "bfloat16") == 0 ? ST_DTYPE_BF16
                       : strcmp(c.torch_dtype, "float16") == 0
                           ? ST_DTYPE_F16
                           : ST_DTYPE_F32;
    int64_t H = c.hidden_size, q = (int64_t)c.num_heads * c.head_dim,
            kv = (int64_t)c.num_kv_heads * c.head_dim, F = c.intermediate_size;
    size_t want = 2 + (c.tie_word_embeddings ? 0 : 1);
    expect_tensor(&m, "model.embed_tokens.weight", dt, 2, c.vocab_size, H);
    expect_tensor(&m, "model.norm.weight", dt, 1, H, 0);
    if (c.tie_word_embeddings)
        assert_null(st_model_find(&m, "lm_head.weight"));
    else
        expect_tensor(&m, "lm_head.weight", dt, 2, c.vocab_size, H);
    for (int l = 0; l < c.num_layers; l++) {
        char n[128];
#define L(s) (snprintf(n, sizeof n, "model.layers.%d.%s", l, s), n)
        expect_tensor(&m, L("input_layernorm.weight"), dt, 1, H, 0);
        expect_tensor(&m, L("post_attention_layernorm.weight"), dt, 1, H, 0);
        expect_tensor(&m, L("self_attn.q_proj.weight"), dt, 2, q, H);
        expect_tensor(&m, L("self_attn.k_proj.weight"), dt, 2, kv, H);
        expect_tensor(&m, L("self_attn.v_proj.weight"), dt, 2, kv, H);
        expect_tensor(&m, L("self_attn.o_proj.weight"), dt, 2, H, q);
        expect_tensor(&m, L("mlp.gate_proj.weight"), dt, 2, F, H);
        expect_tensor(&m, L("mlp.up_proj.weight"), dt, 2, F, H);
        expect_tensor(&m, L("mlp.down_proj.weight"), dt, 2, H, F);
        want += 9;
        if (c.qkv_bias) {
            expect_tensor(&m, L("self_attn.q_proj.bias"), dt, 1, q, 0);
            expect_tensor(&m, L("self_attn.k_proj.bias"), dt, 1, kv, 0);
            expect_tensor(&m, L("self_attn.v_proj.bias"), dt, 1, kv, 0);
            want += 3;
        } else {
            assert_null(st_model_find(&m, L("self_attn.q_proj.bias")));
        }
        if (c.qk_norm) {
            expect_tensor(&m, L("self_attn.q_norm.weight"), dt, 1,
                          c.head_dim, 0);
            expect_tensor(&m, L("self_attn.k_norm.weight"), dt, 1,
                          c.head_dim, 0);
            want += 2;
        } else {
            assert_null(st_model_find(&m, L("self_attn.q_norm.weight")));
        }
#undef L
    }
    assert_int_equal(m.n_tensors, want);
    /* The initialisation the generator promises (loose bounds: the smallest
     * tensors have only a few dozen elements). */
    double mean, sd;
    stats(st_model_find(&m, "model.embed_tokens.weight"), &mean, &sd);
    assert_true(fabs(mean) < 0.05 && fabs(sd - 1.0) < 0.05);
    stats(st_model_find(&m, "model.layers.0.mlp.down_proj.weight"), &mean,
          &sd);
    double want_sd = 1.0 / sqrt((double)F);
    assert_true(fabs(sd - want_sd) < 0.15 * want_sd);
    stats(st_model_find(&m, "model.layers.0.self_attn.q_proj.weight"), &mean,
          &sd);
    want_sd = 1.0 / sqrt((double)H);
    assert_true(fabs(sd - want_sd) < 0.15 * want_sd);
    stats(st_model_find(&m, "model.norm.weight"), &mean, &sd);
    assert_true(fabs(mean - 1.0) < 0.1 && sd > 0.03 && sd < 0.2);
    st_model_close(&m);
}

int main(void)
{
    /* With TANGRAM_TEST_MODEL_DIR (test_make_model.sh) only that directory
     * is checked; ctest runs the rest. */
    const char *dir = getenv("TANGRAM_TEST_MODEL_DIR");
    if (dir != NULL && dir[0] != '\0') {
        const struct CMUnitTest one[] = {
            cmocka_unit_test(test_generated_model),
        };
        return cmocka_run_group_tests(one, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_project_configs),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_rope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
