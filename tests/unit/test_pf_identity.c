/* test_pf_identity.c — a model's identity (common/profile/pf_identity.h) and the
 * profile's check against the model served (pf_profile_check_model):
 *   - the canonical text of the quick start's tiny qwen3 config, and its
 *     SHA-256 as Python's hashlib gives it for that text;
 *   - fields that change the computation change the identity, the ones
 *     left out on purpose (dtype, token ids, context, unknown keys) do not;
 *   - identity strings: valid and invalid forms;
 *   - profiles: model.identity saved and loaded, a malformed one refused
 *     naming the field; the check accepts a match, warns for a profile
 *     without one, refuses a mismatch naming both identities unless
 *     forced (then warns), refuses another shape. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/model/mc_model_config.h"
#include "common/profile/pf_identity.h"
#include "common/profile/pf_profile.h"
#include "common/base/tg_err.h"

static char err[1024], warn[1024];

/* profiles/make-tiny.sh's tiny-qwen3 as tangram-make-model writes it. */
static const char *const tiny_qwen3 =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\","
    " \"hidden_act\": \"silu\", \"hidden_size\": 128,"
    " \"intermediate_size\": 384, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4,"
    " \"head_dim\": 32, \"vocab_size\": 151669,"
    " \"max_position_embeddings\": 32768,"
    " \"rms_norm_eps\": 9.9999999999999995e-7, \"rope_theta\": 10000.0,"
    " \"rope_scaling\": null, \"tie_word_embeddings\": true,"
    " \"attention_bias\": false, \"torch_dtype\": \"bfloat16\","
    " \"bos_token_id\": 151643, \"eos_token_id\": [151645, 151643]}";

static const char *const tiny_text =
    "tangram-model-identity 1\n"
    "architecture=Qwen3ForCausalLM\n"
    "hidden_size=128\n"
    "intermediate_size=384\n"
    "num_hidden_layers=4\n"
    "num_attention_heads=8\n"
    "num_key_value_heads=4\n"
    "head_dim=32\n"
    "vocab_size=151669\n"
    "rms_norm_eps=9.9999999999999995e-07\n"
    "rope_theta=10000\n"
    "rope_scaling=none\n"
    "tie_word_embeddings=true\n"
    "qkv_bias=false\n"
    "o_bias=false\n"
    "qk_norm=true\n"
    "sliding_window=0\n";

/* python3 -c 'import hashlib; print(hashlib.sha256(TEXT).hexdigest())' */
static const char *const tiny_id =
    "sha256:b251da1740f2054d4c72a803119bdc5811c820cbedd5a08f5489817f33e80236";

/* Parses `json` after replacing the first `from` by `to` (NULL: as is). */
static void config_of(struct mc_model_config *c, const char *from,
                      const char *to)
{
    char buf[2048];
    const char *src = tiny_qwen3;
    if (from != NULL) {
        const char *at = strstr(tiny_qwen3, from);
        assert_non_null(at);
        snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(at - tiny_qwen3),
                 tiny_qwen3, to, at + strlen(from));
        src = buf;
    }
    json_error_t je;
    json_t *doc = json_loads(src, 0, &je);
    assert_non_null(doc);
    assert_int_equal(mc_model_config_from_json(c, doc, "test", err,
                                               sizeof(err)), 0);
    json_decref(doc);
}

static void id_of(const char *from, const char *to, char *out)
{
    struct mc_model_config c;
    config_of(&c, from, to);
    assert_int_equal(pf_identity_of_config(&c, out), 0);
}

static void test_text_and_hash(void **state)
{
    (void)state;
    struct mc_model_config c;
    config_of(&c, NULL, NULL);
    char text[PF_IDENTITY_TEXT_MAX], id[PF_IDENTITY_LEN + 1];
    assert_int_equal(pf_identity_text(&c, text, sizeof(text)), 0);
    assert_string_equal(text, tiny_text);
    assert_int_equal(pf_identity_text(&c, text, 10), TG_ETOOBIG);
    assert_int_equal(pf_identity_of_config(&c, id), 0);
    assert_string_equal(id, tiny_id);
    assert_true(pf_identity_valid(id));
    char desc[160];
    pf_identity_describe(&c, desc, sizeof(desc));
    assert_string_equal(desc, "Qwen3ForCausalLM, 4 layers, 4 KV heads of 32, "
                              "vocabulary 151669");
}

static void test_what_counts(void **state)
{
    (void)state;
    char base[PF_IDENTITY_LEN + 1], id[PF_IDENTITY_LEN + 1];
    id_of(NULL, NULL, base);
    /* Same model: another dtype, context, token ids, an unknown key. */
    static const char *const same[][2] = {
        {"\"bfloat16\"", "\"float32\""},
        {"32768", "131072"},
        {"\"bos_token_id\": 151643", "\"bos_token_id\": 1"},
        {"\"model_type\"", "\"transformers_version\": \"4.57.0\", "
                           "\"model_type\""},
        {"10000.0", "1e4"},
    };
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
        id_of(same[i][0], same[i][1], id);
        if (strcmp(id, base) != 0)
            fail_msg("'%s' -> '%s' changed the identity", same[i][0],
                     same[i][1]);
    }
    /* Another model: anything that changes what it computes. */
    static const char *const other[][2] = {
        {"\"hidden_size\": 128", "\"hidden_size\": 256"},
        {"384", "512"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 1000000.0"},
        {"9.9999999999999995e-7", "1e-5"},
        {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false"},
        {"151669", "151670"},
        {"Qwen3ForCausalLM", "Qwen2ForCausalLM"},
    };
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        id_of(other[i][0], other[i][1], id);
        if (strcmp(id, base) == 0)
            fail_msg("'%s' -> '%s' kept the identity", other[i][0],
                     other[i][1]);
    }
}

static void test_valid(void **state)
{
    (void)state;
    assert_true(pf_identity_valid(tiny_id));
    assert_false(pf_identity_valid(NULL));
    assert_false(pf_identity_valid(""));
    assert_false(pf_identity_valid(tiny_id + 7)); /* no prefix */
    char bad[PF_IDENTITY_LEN + 2];
    snprintf(bad, sizeof(bad), "%s", tiny_id);
    bad[10] = 'B'; /* upper case */
    assert_false(pf_identity_valid(bad));
    bad[10] = 'g';
    assert_false(pf_identity_valid(bad));
    snprintf(bad, sizeof(bad), "%s0", tiny_id); /* too long */
    assert_false(pf_identity_valid(bad));
    assert_false(pf_identity_valid("md5:0123"));
}

static void test_profile_check(void **state)
{
    (void)state;
    struct mc_model_config c, other;
    config_of(&c, NULL, NULL);
    config_of(&other, "384", "512"); /* same shape, another model */
    char other_id[PF_IDENTITY_LEN + 1];
    assert_int_equal(pf_identity_of_config(&other, other_id), 0);

    struct pf_profile p;
    assert_int_equal(pf_profile_init_full(&p, 4, 4, 32, 2, err, sizeof(err)),
                     0);
    /* No identity: accepted, with a warning naming the model's. */
    assert_int_equal(pf_profile_check_model(&p, "p.json", &c, 0, warn,
                                            sizeof(warn), err, sizeof(err)),
                     0);
    assert_non_null(strstr(warn, "records no model identity"));
    assert_non_null(strstr(warn, tiny_id));
    /* Its own model: nothing to say. */
    assert_int_equal(pf_profile_set_identity(&p, tiny_id, err, sizeof(err)),
                     0);
    assert_int_equal(pf_profile_check_model(&p, "p.json", &c, 0, warn,
                                            sizeof(warn), err, sizeof(err)),
                     0);
    assert_string_equal(warn, "");
    /* Another model of the same shape: refused naming both, unless
     * forced. */
    assert_int_equal(pf_profile_check_model(&p, "p.json", &other, 0, warn,
                                            sizeof(warn), err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, tiny_id));
    assert_non_null(strstr(err, other_id));
    assert_non_null(strstr(err, "--profile-force"));
    assert_int_equal(pf_profile_check_model(&p, "p.json", &other, 1, warn,
                                            sizeof(warn), err, sizeof(err)),
                     0);
    assert_non_null(strstr(warn, "used anyway"));
    /* Another shape: refused even when forced. */
    struct mc_model_config wide;
    config_of(&wide, "\"num_hidden_layers\": 4", "\"num_hidden_layers\": 6");
    assert_int_equal(pf_profile_check_model(&p, "p.json", &wide, 1, warn,
                                            sizeof(warn), err, sizeof(err)),
                     TG_EINVAL);
    assert_non_null(strstr(err, "L=4 H=4 d=32"));
    assert_int_equal(pf_profile_set_identity(&p, "sha256:xyz", err,
                                             sizeof(err)), TG_EINVAL);

    /* Saved and loaded with the profile. */
    char path[64];
    snprintf(path, sizeof(path), "/tmp/tg_test_identity_%d.json",
             (int)getpid());
    assert_int_equal(pf_profile_save(&p, path, err, sizeof(err)), 0);
    struct pf_profile q;
    assert_int_equal(pf_profile_load(&q, path, err, sizeof(err)), 0);
    assert_string_equal(q.model_identity, tiny_id);
    pf_profile_free(&q);
    /* pf_profile_for_model: the same checks from the file. */
    assert_int_equal(pf_profile_for_model(&q, path, &other, 2, 0, warn,
                                          sizeof(warn), err, sizeof(err)),
                     TG_EINVAL);
    assert_null(q.model_identity); /* freed on failure */
    assert_int_equal(pf_profile_for_model(&q, path, &c, 2, 0, warn,
                                          sizeof(warn), err, sizeof(err)),
                     0);
    pf_profile_free(&q);
    /* A malformed identity is refused naming the field. */
    json_t *doc;
    assert_int_equal(pf_profile_to_json(&p, &doc, err, sizeof(err)), 0);
    json_object_set_new(json_object_get(doc, "model"), "identity",
                        json_string("sha256:0123"));
    assert_int_not_equal(pf_profile_from_json(&q, doc, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "model.identity"));
    json_object_set_new(json_object_get(doc, "model"), "identity",
                        json_integer(7));
    assert_int_not_equal(pf_profile_from_json(&q, doc, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "model.identity"));
    json_decref(doc);
    unlink(path);
    pf_profile_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_and_hash),
        cmocka_unit_test(test_what_counts),
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_profile_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
