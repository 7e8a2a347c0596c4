/*
 * tangram-generate — offline, in-process generation (DESIGN.md §5).
 *
 *   tangram-generate --model DIR [--profile FILE|none] (--prompt TEXT |
 *       --prompt-ids JSON) [--max-tokens N] [--temperature T] [--top-k K]
 *       [--top-p P] [--min-p P] [--seed S] [--logprobs K] [--prompt-logprobs]
 *       [--prefill-chunk C] [--method M] [--gvote-p P] [--gvote-samples S]
 *       [--gvote-future N] [--decode-compress none|trig] [--decode-budget c]
 *       [--decode-budget-uniform] [--decode-every B] [--decode-window W]
 *       [--trig-stats FILE] [--forced-ids JSON] [--dump-kept]
 *       [--backend cpu|cuda] [--cpu-weights auto|f32|bf16] [--timing]
 *       [--json]
 *
 * --backend picks the forward pass: the CPU backend or the CUDA runtime,
 * through the same backend ops table a daemon worker uses (gw_engine.h);
 * the JSON is the same on both. Without a usable GPU --backend cuda
 * fails at once with the reason (exit status 1). --timing adds "timing"
 * (prefill and decode wall seconds and tokens per second); decode-time
 * compression always adds it. --cpu-weights is the CPU backend's weight
 * format (gw_model.h: auto keeps a bf16 checkpoint's matrices bf16, else
 * fp32); the JSON names the one used ("cpu_weights").
 *
 * --forced-ids teacher-forces the decode (DESIGN.md §5): the m ids take the
 * places of m sampled tokens (the first from the prompt's last logits, m-1
 * decode steps feed the first m-1) and the JSON gets forced_logprobs, the
 * log-probability of each given all before it; --max-tokens becomes m.
 * --dump-kept adds kept_positions[layer][kv_head], the sorted absolute
 * positions every KV head holds at the end.
 *
 * With --prompt-logprobs it prints, for every prompt position after the
 * first, log P(prompt[p] | prompt[<p]) under the chunked, compressed
 * semantics of §4.3 — how outside references check the math. Errors go to
 * stderr with exit status 1 (2 for bad flags).
 */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/tg_config.h"
#include "common/base/tg_err.h"
#include "common/base/tg_path.h"
#include "common/json/tg_json.h"
#include "common/tok/tok_tokenizer.h"
#include "gpu_worker/engine/gw_engine.h"

extern char **environ;

struct gen_options {
    char *model;
    char *profile;
    bool profile_force;
    char *prompt;
    char *prompt_ids;
    int64_t max_tokens;
    double temperature;
    int64_t top_k;
    double top_p;
    double min_p;
    double repetition_penalty;
    double presence_penalty;
    double frequency_penalty;
    int64_t seed;
    int64_t logprobs;
    bool prompt_logprobs;
    int64_t prefill_chunk;
    int64_t page_size;
    int64_t heads_per_group;
    char *method;
    double gvote_p;
    int64_t gvote_samples;
    int64_t gvote_future;
    char *decode_compress;
    int64_t decode_budget;
    bool decode_budget_uniform;
    int64_t decode_every;
    int64_t decode_window;
    char *trig_stats;
    char *forced_ids;
    bool dump_kept;
    bool ignore_eos;
    int64_t threads;
    int backend;
    int cpu_weights;
    bool timing;
    bool json;
};

#define OFF(f, t) TG_CONFIG_OFFSET(struct gen_options, f, t)
/* clang-format off */
static const struct tg_config_entry gen_table[] = {
    {.name = "model", .type = TG_CONFIG_STRING, .offset = OFF(model, char *),
     .metavar = "DIR", .flags = TG_CONFIG_REQUIRED,
     .help = "Hugging Face model directory."},
    {.name = "profile", .type = TG_CONFIG_STRING, .def = "none",
     .offset = OFF(profile, char *), .metavar = "FILE|none",
     .help = "Tangram profile; none keeps full KV."},
    {.name = "profile-force", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(profile_force, bool),
     .help = "Use a profile made for another model (its model identity "
             "differs) with a warning instead of refusing."},
    {.name = "prompt", .type = TG_CONFIG_STRING, .offset = OFF(prompt, char *),
     .metavar = "TEXT", .help = "Prompt text (tokenized with the model's tokenizer.json)."},
    {.name = "prompt-ids", .type = TG_CONFIG_STRING,
     .offset = OFF(prompt_ids, char *), .metavar = "JSON",
     .help = "Prompt as a JSON array of token ids (instead of --prompt)."},
    {.name = "max-tokens", .type = TG_CONFIG_INT, .def = "16", .min = 0,
     .max = 1 << 24, .offset = OFF(max_tokens, int64_t),
     .help = "Tokens to generate (0 allowed)."},
    {.name = "temperature", .type = TG_CONFIG_DOUBLE, .def = "0", .min = 0,
     .max = 100, .offset = OFF(temperature, double),
     .help = "Sampling temperature; 0 is greedy."},
    {.name = "top-k", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 1 << 24, .offset = OFF(top_k, int64_t), .help = "Top-k (0 = off)."},
    {.name = "top-p", .type = TG_CONFIG_DOUBLE, .def = "1", .min = 1e-9,
     .max = 1, .offset = OFF(top_p, double), .help = "Nucleus sampling mass."},
    {.name = "min-p", .type = TG_CONFIG_DOUBLE, .def = "0", .min = 0, .max = 1,
     .offset = OFF(min_p, double), .help = "Min-p relative to the top token."},
    {.name = "repetition-penalty", .type = TG_CONFIG_DOUBLE, .def = "1",
     .min = 1e-3, .max = 100, .offset = OFF(repetition_penalty, double),
     .help = "Repetition penalty over prompt and output (1 = off)."},
    {.name = "presence-penalty", .type = TG_CONFIG_DOUBLE, .def = "0",
     .min = -2, .max = 2, .offset = OFF(presence_penalty, double),
     .help = "Presence penalty over the output."},
    {.name = "frequency-penalty", .type = TG_CONFIG_DOUBLE, .def = "0",
     .min = -2, .max = 2, .offset = OFF(frequency_penalty, double),
     .help = "Frequency penalty over the output."},
    {.name = "seed", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 9007199254740991.0, .offset = OFF(seed, int64_t),
     .help = "Sampling seed."},
    {.name = "logprobs", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 64, .offset = OFF(logprobs, int64_t), .metavar = "K",
     .help = "Top-K log-probabilities per generated token."},
    {.name = "prompt-logprobs", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(prompt_logprobs, bool),
     .help = "Print log P(prompt[p] | prompt[<p]) for every prompt position."},
    {.name = "prefill-chunk", .type = TG_CONFIG_INT, .def = "512", .min = 1,
     .max = 1 << 20, .offset = OFF(prefill_chunk, int64_t),
     .metavar = "TOKENS", .help = "Prefill chunk length C."},
    {.name = "page-size", .type = TG_CONFIG_INT, .def = "16", .min = 1,
     .max = 1024, .offset = OFF(page_size, int64_t), .metavar = "TOKENS",
     .help = "Tokens per KV page."},
    {.name = "heads-per-group", .type = TG_CONFIG_INT, .def = "1", .min = 1,
     .max = 128, .offset = OFF(heads_per_group, int64_t),
     .help = "Heads per page group without a profile."},
    {.name = "method", .type = TG_CONFIG_STRING,
     .offset = OFF(method, char *),
     .help = "Scoring method: snapkv, keydiff, expected_attention or gvote "
             "(default: the profile's)."},
    {.name = "gvote-p", .type = TG_CONFIG_DOUBLE, .def = "0.95",
     .min = 1e-9, .max = 1, .offset = OFF(gvote_p, double),
     .help = "gvote: attention mass of the real query's nucleus."},
    {.name = "gvote-samples", .type = TG_CONFIG_INT, .def = "8", .min = 0,
     .max = GW_GVOTE_MAX_SAMPLES, .offset = OFF(gvote_samples, int64_t),
     .help = "gvote: synthetic queries per query head (0: deterministic)."},
    {.name = "gvote-future", .type = TG_CONFIG_INT, .def = "32", .min = 1,
     .max = GW_GVOTE_MAX_FUTURE, .offset = OFF(gvote_future, int64_t),
     .metavar = "TOKENS",
     .help = "gvote: future positions averaged into the synthetic queries' "
             "rotation."},
    {.name = "decode-compress", .type = TG_CONFIG_STRING, .def = "none",
     .offset = OFF(decode_compress, char *), .metavar = "none|trig",
     .help = "Decode-time compression of the KV decode appends (DESIGN.md "
             "4.9): trig keeps each head's decode region at its cap, scored "
             "with the profile's trig statistics."},
    {.name = "decode-budget", .type = TG_CONFIG_INT, .def = "2048", .min = 1,
     .max = INT32_MAX, .offset = OFF(decode_budget, int64_t),
     .metavar = "TOKENS",
     .help = "trig: average decode cap c per head (>= 4 + --decode-window)."},
    {.name = "decode-budget-uniform", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(decode_budget_uniform, bool),
     .help = "trig: every head gets cap c (no profile scaling)."},
    {.name = "decode-every", .type = TG_CONFIG_INT, .def = "128", .min = 1,
     .max = 1 << 20, .offset = OFF(decode_every, int64_t),
     .metavar = "TOKENS",
     .help = "trig: compact after every this many decoded tokens (beta)."},
    {.name = "decode-window", .type = TG_CONFIG_INT, .def = "32", .min = 0,
     .max = 1 << 20, .offset = OFF(decode_window, int64_t),
     .metavar = "TOKENS",
     .help = "trig: the last entries of the decode region always kept."},
    {.name = "trig-stats", .type = TG_CONFIG_STRING,
     .offset = OFF(trig_stats, char *), .metavar = "FILE",
     .help = "trig: profile file whose trig statistics score the keys "
             "(default: --profile's own; needed with --profile none)."},
    {.name = "forced-ids", .type = TG_CONFIG_STRING,
     .offset = OFF(forced_ids, char *), .metavar = "JSON",
     .help = "Teacher-forced decode of these ids (JSON array; sets "
             "--max-tokens to their count); the JSON gets forced_logprobs."},
    {.name = "dump-kept", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(dump_kept, bool),
     .help = "Add kept_positions[layer][kv_head] (absolute positions held "
             "at the end) to the JSON."},
    {.name = "ignore-eos", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(ignore_eos, bool), .help = "Do not stop at eos tokens."},
    {.name = "threads", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 1024, .offset = OFF(threads, int64_t),
     .help = "CPU threads (0 = all)."},
    {.name = "backend", .type = TG_CONFIG_ENUM, .def = "cpu",
     .offset = OFF(backend, int), .choices = gw_backend_choices,
     .help = "Forward pass: cpu, or cuda (one GPU, device 0 of "
             "CUDA_VISIBLE_DEVICES)."},
    {.name = "cpu-weights", .type = TG_CONFIG_ENUM, .def = "auto",
     .offset = OFF(cpu_weights, int), .choices = gw_weights_choices,
     .help = "CPU backend: the weight matrices in host memory. auto keeps a "
             "bf16 checkpoint's bf16 (exact, half the bytes per token) and "
             "makes fp16/fp32 ones fp32; f32 or bf16 (rounded to nearest "
             "even) whatever the checkpoint holds."},
    {.name = "timing", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(timing, bool),
     .help = "Add prefill and decode wall times and tokens per second to "
             "the JSON (\"timing\")."},
    {.name = "json", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(json, bool), .help = "Print one JSON object."},
};
/* clang-format on */
#undef OFF
#define N_GEN (sizeof(gen_table) / sizeof(gen_table[0]))

static int parse_ids(const char *s, const char *flag, struct tok_ids *ids,
                     char *err, size_t errlen)
{
    json_t *doc;
    int rc = tg_json_load_buf(s, strlen(s), &doc, err, errlen);
    if (rc != 0)
        return rc;
    if (!json_is_array(doc) || json_array_size(doc) == 0) {
        json_decref(doc);
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: expected a non-empty JSON array", flag);
    }
    ids->n = 0;
    ids->cap = json_array_size(doc);
    ids->v = malloc(ids->cap * sizeof(int32_t));
    if (ids->v == NULL) {
        json_decref(doc);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < json_array_size(doc); i++) {
        json_t *v = json_array_get(doc, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX) {
            json_decref(doc);
            return tg_err_set(err, errlen, TG_EINVAL,
                              "%s[%zu]: expected a token id", flag, i);
        }
        ids->v[ids->n++] = (int32_t)json_integer_value(v);
    }
    json_decref(doc);
    return 0;
}

static json_t *lp_value(float x)
{
    return isfinite(x) ? json_real(x) : json_string(x > 0 ? "inf" : "-inf");
}

int main(int argc, char **argv)
{
    struct gen_options o = {0};
    char err[1024] = "";
    struct tg_config_cli cli = {
        .usage = "usage: tangram-generate --model DIR (--prompt TEXT | "
                 "--prompt-ids JSON) [options]",
        .help_out = stdout};
    int rc = tg_config_parse_cli(gen_table, N_GEN, &o, &cli, argc, argv,
                                 environ, err, sizeof(err));
    if (rc == TG_EDONE)
        return 0;
    if (rc != 0) {
        fprintf(stderr, "tangram-generate: %s\n", err);
        tg_config_free(gen_table, N_GEN, &o);
        return 2;
    }
    int status = 1;
    struct tok_tokenizer tok = {0};
    struct tok_ids prompt = {0};
    struct tok_ids forced = {0};
    struct tg_buf text = {0};
    struct gw_engine eng = {0};
    struct gw_gen_result res = {0};
    int have_tok = 0;
    if ((o.prompt == NULL) == (o.prompt_ids == NULL)) {
        fprintf(stderr, "tangram-generate: give exactly one of --prompt and --prompt-ids\n");
        status = 2;
        goto out;
    }
    char path[4096];
    if (tg_path_fmt(path, sizeof(path), err, sizeof(err), "%s/tokenizer.json",
                    o.model) != 0) {
        fprintf(stderr, "tangram-generate: --model: %s\n", err);
        goto out;
    }
    if (access(path, R_OK) == 0) {
        rc = tok_tokenizer_load(&tok, path, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "tangram-generate: %s\n", err);
            goto out;
        }
        have_tok = 1;
    }
    if (o.prompt != NULL) {
        if (!have_tok) {
            fprintf(stderr, "tangram-generate: --prompt needs %s\n", path);
            goto out;
        }
        rc = tok_encode(&tok, NULL, o.prompt, strlen(o.prompt),
                        TOK_ENCODE_ADD_SPECIAL, &prompt, err, sizeof(err));
    } else {
        rc = parse_ids(o.prompt_ids, "--prompt-ids", &prompt, err, sizeof(err));
    }
    if (rc == 0 && prompt.n == 0)
        rc = tg_err_set(err, sizeof(err), TG_EINVAL, "the prompt is empty");
    if (rc == 0 && o.forced_ids != NULL) {
        rc = parse_ids(o.forced_ids, "--forced-ids", &forced, err, sizeof(err));
        if (rc == 0)
            o.max_tokens = (int64_t)forced.n;
    }
    if (rc != 0) {
        fprintf(stderr, "tangram-generate: %s\n", err);
        goto out;
    }

    struct gw_gvote_params gvp = {.p = o.gvote_p,
                                   .samples = (int)o.gvote_samples,
                                   .future = (int)o.gvote_future};
    struct gw_trig_opts tro = {
        .budget = o.decode_budget,
        .uniform = o.decode_budget_uniform,
        .every = (int)o.decode_every,
        .window = (int)o.decode_window,
    };
    if (strcmp(o.decode_compress, "trig") == 0) {
        tro.enabled = 1;
    } else if (strcmp(o.decode_compress, "none") != 0) {
        fprintf(stderr, "tangram-generate: --decode-compress: expected none "
                        "or trig, got '%s'\n", o.decode_compress);
        goto out;
    }
    struct gw_engine_opts eo = {
        .trig = &tro,
        .trig_stats_path = o.trig_stats,
        .model_dir = o.model,
        .profile_path = o.profile,
        .profile_force = o.profile_force,
        .heads_per_group = (int)o.heads_per_group,
        .page_size = (int)o.page_size,
        .prefill_chunk = (int)o.prefill_chunk,
        .method = o.method,
        .gvote = &gvp,
        .max_context = (int64_t)prompt.n + o.max_tokens,
        .n_threads = (int)o.threads,
        .backend = (enum gw_backend_kind)o.backend,
        .weights = (enum gw_weights)o.cpu_weights,
    };
    rc = gw_engine_init(&eng, &eo, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tangram-generate: %s\n", err);
        goto out;
    }
    if (!o.json) { /* the JSON stays byte-identical across runs */
        char loaded[160];
        gw_load_stats_format(&eng.model.load, loaded, sizeof(loaded));
        fprintf(stderr, "weights: %s\n", loaded);
    }
    struct gw_gen_params gp = {
        .max_tokens = (int)o.max_tokens,
        .sampling = {.temperature = (float)o.temperature,
                     .top_k = (int)o.top_k,
                     .top_p = (float)o.top_p,
                     .min_p = (float)o.min_p,
                     .repetition_penalty = (float)o.repetition_penalty,
                     .presence_penalty = (float)o.presence_penalty,
                     .frequency_penalty = (float)o.frequency_penalty,
                     .seed = (uint64_t)o.seed,
                     .n_top = (int32_t)o.logprobs},
        .prompt_logprobs = o.prompt_logprobs,
        .ignore_eos = o.ignore_eos,
        .forced_ids = forced.v,
        .n_forced = (int)forced.n,
        .dump_kept = o.dump_kept,
    };
    rc = gw_engine_generate(&eng, prompt.v, (int)prompt.n, &gp, &res, err,
                            sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tangram-generate: %s\n", err);
        goto out;
    }
    if (have_tok) {
        int n_text = res.n_tokens;
        if (res.finish == GW_FINISH_STOP && n_text > 0)
            n_text--; /* the stop token is not part of the text */
        rc = tok_decode(&tok, res.tokens, (size_t)n_text, TOK_DECODE_SKIP_SPECIAL,
                        &text, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "tangram-generate: %s\n", err);
            goto out;
        }
    }
    const char *finish = res.finish == GW_FINISH_STOP ? "stop" : "length";
    if (o.json) {
        json_t *doc = json_object();
        json_t *a = json_array();
        for (size_t i = 0; i < prompt.n; i++)
            json_array_append_new(a, json_integer(prompt.v[i]));
        json_object_set_new(doc, "prompt_token_ids", a);
        if (res.prompt_lp != NULL) {
            a = json_array();
            json_array_append_new(a, json_null());
            for (int i = 1; i < res.n_prompt; i++)
                json_array_append_new(a, lp_value(res.prompt_lp[i]));
            json_object_set_new(doc, "prompt_logprobs", a);
        } else {
            json_object_set_new(doc, "prompt_logprobs", json_null());
        }
        a = json_array();
        for (int i = 0; i < res.n_tokens; i++)
            json_array_append_new(a, json_integer(res.tokens[i]));
        json_object_set_new(doc, "token_ids", a);
        json_object_set_new(doc, "text",
                            json_stringn(tg_buf_str(&text), text.len));
        a = json_array();
        for (int i = 0; i < res.n_tokens; i++) {
            json_t *e = json_object();
            json_object_set_new(e, "token_id", json_integer(res.tokens[i]));
            json_object_set_new(e, "logprob", lp_value(res.lps[i]));
            json_t *top = json_array();
            for (int k = 0; k < res.n_top; k++) {
                json_t *t = json_object();
                json_object_set_new(t, "token_id", json_integer(res.top_ids[(size_t)i * res.n_top + k]));
                json_object_set_new(t, "logprob", lp_value(res.top_lps[(size_t)i * res.n_top + k]));
                json_array_append_new(top, t);
            }
            json_object_set_new(e, "top_logprobs", top);
            json_array_append_new(a, e);
        }
        json_object_set_new(doc, "logprobs", a);
        json_object_set_new(doc, "finish_reason", json_string(finish));
        json_object_set_new(doc, "backend",
                            json_string(gw_backend_choices[o.backend]));
        if (o.backend == GW_BACKEND_CPU)
            json_object_set_new(
                doc, "cpu_weights",
                json_string(eng.model.wtype == TG_WTYPE_BF16 ? "bf16" : "f32"));
        if (res.forced_lps != NULL) {
            a = json_array();
            for (int i = 0; i < res.n_tokens; i++)
                json_array_append_new(a, lp_value(res.forced_lps[i]));
            json_object_set_new(doc, "forced_logprobs", a);
        }
        if (res.kept_n != NULL) {
            int H = eng.layout.n_kv_heads;
            a = json_array();
            for (int l = 0; l < eng.layout.n_layers; l++) {
                json_t *row = json_array();
                for (int h = 0; h < H; h++) {
                    size_t mh = (size_t)l * (size_t)H + (size_t)h;
                    json_t *ps = json_array();
                    for (int32_t t = 0; t < res.kept_n[mh]; t++)
                        json_array_append_new(
                            ps, json_integer(res.kept_pos[mh * (size_t)res.kept_cap + t]));
                    json_array_append_new(row, ps);
                }
                json_array_append_new(a, row);
            }
            json_object_set_new(doc, "kept_positions", a);
        }
        json_t *kv = json_object();
        json_object_set_new(kv, "pages_used", json_integer(res.pages_used));
        json_object_set_new(kv, "monolithic_pages", json_integer(res.mono_pages));
        json_object_set_new(kv, "pages_released", json_integer(res.pages_released));
        json_object_set_new(kv, "pages_peak", json_integer(res.pages_peak));
        json_object_set_new(kv, "decode_pages_released",
                            json_integer(res.decode_pages_released));
        json_object_set_new(kv, "decode_triggers",
                            json_integer(res.decode_triggers));
        /* Wall times only when asked (and with decode compression, whose
         * benchmark reads them): a plain run's JSON stays byte-identical
         * across runs. */
        if (tro.enabled || o.timing) {
            int n_dec = res.n_tokens > 1 ? res.n_tokens - 1 : 0;
            json_object_set_new(
                doc, "timing",
                json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "prefill_seconds",
                          res.prefill_seconds, "decode_seconds",
                          res.decode_seconds, "compact_seconds",
                          res.compact_seconds, "prefill_cpu_seconds",
                          res.prefill_cpu_seconds, "decode_cpu_seconds",
                          res.decode_cpu_seconds, "prefill_tokens_per_second",
                          res.prefill_seconds > 0
                              ? (double)prompt.n / res.prefill_seconds
                              : 0.0,
                          "decode_tokens_per_second",
                          res.decode_seconds > 0
                              ? (double)n_dec / res.decode_seconds
                              : 0.0));
        }
        a = json_array();
        int G = eng.layout.n_groups;
        for (int l = 0; l < eng.layout.n_layers; l++) {
            json_t *row = json_array();
            for (int g = 0; g < G; g++)
                json_array_append_new(row, json_integer(res.kept[l * G + g]));
            json_array_append_new(a, row);
        }
        json_object_set_new(kv, "prompt_tokens_kept", a);
        json_object_set_new(doc, "kv", kv);
        char *s = json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(9));
        if (s != NULL) {
            puts(s);
            free(s);
        }
        json_decref(doc);
    } else {
        if (text.data != NULL)
            fwrite(text.data, 1, text.len, stdout);
        fputc('\n', stdout);
        if (res.prompt_lp != NULL) {
            for (int i = 1; i < res.n_prompt; i++)
                fprintf(stderr, "prompt[%d] id=%d logprob=%.6f\n", i, prompt.v[i],
                        (double)res.prompt_lp[i]);
        }
        fprintf(stderr, "finish_reason=%s tokens=%d kv_pages=%lld (monolithic %lld)\n",
                finish, res.n_tokens, (long long)res.pages_used,
                (long long)res.mono_pages);
        if (o.timing)
            fprintf(stderr, "backend=%s prefill_seconds=%.6f "
                            "decode_seconds=%.6f\n",
                    gw_backend_choices[o.backend], res.prefill_seconds,
                    res.decode_seconds);
    }
    status = 0;
out:
    gw_gen_result_free(&res);
    gw_engine_free(&eng);
    tg_buf_free(&text);
    tok_ids_free(&prompt);
    tok_ids_free(&forced);
    tok_tokenizer_free(&tok);
    tg_config_free(gen_table, N_GEN, &o);
    return status;
}
