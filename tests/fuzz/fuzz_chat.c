/*
 * fuzz_chat.c — the chat path of the router from an untrusted request to
 * prompt token ids: the /v1/chat/completions body parsed by
 * rt_openai_parse_chat (messages, tools, tool_choice), the messages and
 * tools rendered with a model's Jinja chat template and tokenized by
 * rt_server_encode_chat (router/core/rt_server_encode.c: ct_template_render of
 * common/chat/ct_template.h over the jj_ engine, then tok_encode with the real
 * Qwen3 tokenizer), and the context check rt_request_fit on the
 * resulting length.
 *
 * The templates are loaded the way the router loads them at start
 * (ct_template_load_dir / ct_template_load_file) from the project's data
 * folder: the three tokenizer folders (Qwen3, Qwen2.5, Llama-3.2) and
 * every .jinja file of data/chat_templates, in the order of src[] below.
 * A template's own raise_exception (role alternation and the like) is a
 * 400, as it is for a client.
 *
 * Input layout:
 *   byte 0      bits 0-3: the template (index modulo the number loaded);
 *               bit 4: add the tokenizer's special tokens as a request
 *               with "add_special_tokens": true would
 *   bytes 1..   the request body (JSON)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/chat/ct_template.h"
#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "router/api/rt_openai.h"
#include "router/core/rt_server_internal.h"
#include "tests/fuzz/fz_util.h"

#define N_TEMPLATES 15

/* Only the fields rt_server_encode reads are set: tok, tmpl, have_tmpl. */
static struct rt_server *srv[N_TEMPLATES];
static struct tok_tokenizer tok;

/* Loads chat template `which` from the data folder into *s as
 * rt_server_init does. */
static void template_load(struct rt_server *s, int which)
{
    static const struct {
        const char *rel;
        int is_dir;
    } src[N_TEMPLATES] = {
        {"tokenizers/qwen3", 1},
        {"tokenizers/qwen2.5", 1},
        {"tokenizers/llama3", 1},
        {"chat_templates/meta-llama-Llama-3.3-70B-Instruct.jinja", 0},
        {"chat_templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", 0},
        {"chat_templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", 0},
        {"chat_templates/deepseek-ai-DeepSeek-V3.1.jinja", 0},
        {"chat_templates/google-gemma-2-2b-it.jinja", 0},
        {"chat_templates/google-gemma-3-it.jinja", 0},
        {"chat_templates/meetkai-functionary-medium-v3.2.jinja", 0},
        {"chat_templates/microsoft-Phi-3.5-mini-instruct.jinja", 0},
        {"chat_templates/microsoft-Phi-4-mini-instruct.jinja", 0},
        {"chat_templates/microsoft-phi-4.jinja", 0},
        {"chat_templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", 0},
        {"chat_templates/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja", 0},
    };
    char path[4096], err[512];
    fz_data_path(src[which].rel, path, sizeof(path));
    int rc = src[which].is_dir
                 ? ct_template_load_dir(&s->tmpl, path, err, sizeof(err))
                 : ct_template_load_file(&s->tmpl, path, err, sizeof(err));
    if (rc != 0)
        fz_fail("chat template %s: %s", path, err);
    s->have_tmpl = 1;
}

static void setup(void)
{
    char path[4096], err[512];
    fz_data_path("tokenizers/qwen3", path, sizeof(path));
    if (tok_tokenizer_load(&tok, path, err, sizeof(err)) != 0)
        fz_fail("tokenizer %s: %s", path, err);
    for (int i = 0; i < N_TEMPLATES; i++) {
        srv[i] = calloc(1, sizeof(*srv[i]));
        if (!srv[i])
            fz_fail("out of memory");
        srv[i]->tok = tok; /* shared, read-only */
        template_load(srv[i], i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    if (size < 1)
        return 0;
    struct rt_server *s = srv[(data[0] & 15) % N_TEMPLATES];
    int add_special = (data[0] & 16) != 0;
    const struct rt_openai_cfg cfg = {.served_model = "tiny",
                                      .max_model_len = 4096,
                                      .vocab_size = tok_vocab_size(&tok),
                                      .max_body_bytes = 1u << 20};
    struct rt_gen_request g;
    struct rt_request_error e;
    if (rt_openai_parse_chat(&cfg, (const char *)data + 1, size - 1, &g,
                             &e) != 0) {
        rt_gen_request_free(&g);
        return 0;
    }
    struct tok_ids ids = {0};
    int rc = rt_server_encode_chat(
        s, &g.q.chat, add_special || g.q.add_special_tokens, &ids, &e);
    if (rc == 0) {
        for (size_t i = 0; i < ids.n; i++)
            if (ids.v[i] < 0 || ids.v[i] >= tok_vocab_size(&tok))
                fz_fail("token id %d out of the vocabulary", (int)ids.v[i]);
        rc = rt_request_fit(&g.q, cfg.max_model_len, (int64_t)ids.n, &e);
    } else if (e.kind != RT_REQ_ERR_INVALID && e.kind != RT_REQ_ERR_INTERNAL) {
        fz_fail("encode failed with error kind %d", (int)e.kind);
    }
    tok_ids_free(&ids);
    rt_gen_request_free(&g);
    return 0;
}
