/*
 * profile_evaluate.c — `tangram-profile evaluate` (docs/PROFILES.md
 * "Choosing a profile"): its flags, the run (gpu_worker/engine/
 * gw_evaluate.h) and its exit status (130 when interrupted, the partial
 * report written). See profile_cli.h.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_config.h"
#include "common/profile/pf_profile.h"
#include "gpu_worker/engine/gw_engine.h" /* gw_method_parse */
#include "gpu_worker/engine/gw_evaluate.h"
#include "profiles/profile_cli.h"

struct eval_args {
    char *model, *data, *profiles, *json_out, *plot, *ratios, *samples, *method,
        *tmp_dir;
    double alpha;
    int backend;
    int64_t chunk, page, hpg, threads, cont, max_tokens, max_conv;
};

#define EV_OFF(f, t) TG_CONFIG_OFFSET(struct eval_args, f, t)
static const struct tg_config_entry eval_table[] = {
    {.name = "model",
     .type = TG_CONFIG_STRING,
     .offset = EV_OFF(model, char *),
     .metavar = "DIR",
     .flags = TG_CONFIG_REQUIRED,
     .help = "Hugging Face model directory (tokenizer and chat template)."},
    {.name = "data",
     .type = TG_CONFIG_STRING,
     .offset = EV_OFF(data, char *),
     .metavar = "FILE.jsonl",
     .flags = TG_CONFIG_REQUIRED,
     .help = "Conversations, one JSON object per line: {\"messages\": [...]} "
             "(OpenAI) or {\"conversations\": [{\"from\", \"value\"}]} "
             "(ShareGPT)."},
    {.name = "profile",
     .type = TG_CONFIG_STRING,
     .offset = EV_OFF(profiles, char *),
     .metavar = "P.json",
     .help = "Profile to compare with full KV; give it several times (or "
             "a comma-separated list) for several."},
    {.name = "ratio",
     .type = TG_CONFIG_STRING,
     .offset = EV_OFF(ratios, char *),
     .metavar = "r,r,...",
     .help = "Also calibrate the model's profile at each ratio in (0, 1] "
             "(as `calibrate --ratio r` with --samples, --method, --alpha "
             "and --heads-per-group) and compare it; no file is kept."},
    {.name = "samples",
     .type = TG_CONFIG_STRING,
     .offset = EV_OFF(samples, char *),
     .metavar = "FILE.jsonl",
     .help = "Calibration samples of the --ratio profiles (text, messages "
             "or prompt_ids lines); default --data."},
    {.name = "method",
     .type = TG_CONFIG_STRING,
     .def = "snapkv",
     .offset = EV_OFF(method, char *),
     .metavar = "M",
     .help = "Scoring method of the --ratio profiles: snapkv, keydiff or "
             "expected_attention."},
    {.name = "alpha",
     .type = TG_CONFIG_DOUBLE,
     .def = "2",
     .min = 0,
     .max = 1e9,
     .offset = EV_OFF(alpha, double),
     .metavar = "A",
     .help = "Alpha of the --ratio profiles: budget = min(1, mean + A x "
             "std)."},
    {.name = "tmp-dir",
     .type = TG_CONFIG_STRING,
     .offset = EV_OFF(tmp_dir, char *),
     .metavar = "DIR",
     .help = "Where full KV's logits rows (4 x vocab bytes per assistant "
             "token, for the exact KL) and the --ratio profiles go while "
             "the run lasts; default $TMPDIR, else /tmp."},
    {.name = "backend",
     .type = TG_CONFIG_ENUM,
     .def = "cpu",
     .offset = EV_OFF(backend, int),
     .choices = gw_backend_choices,
     .help = "Forward pass: cpu, or cuda (one GPU)."},
    {.name = "prefill-chunk",
     .type = TG_CONFIG_INT,
     .def = "512",
     .min = 1,
     .max = 1 << 20,
     .offset = EV_OFF(chunk, int64_t),
     .metavar = "C",
     .help = "Chunk length, as the server's --prefill-chunk."},
    {.name = "page-size",
     .type = TG_CONFIG_INT,
     .def = "16",
     .min = 1,
     .max = 4096,
     .offset = EV_OFF(page, int64_t),
     .metavar = "P",
     .help = "KV page size in tokens, as the server's."},
    {.name = "heads-per-group",
     .type = TG_CONFIG_INT,
     .def = "1",
     .min = 1,
     .max = PF_MAX_HEADS,
     .offset = EV_OFF(hpg, int64_t),
     .metavar = "N",
     .help = "H_p of the full-KV run and of the --ratio profiles "
             "(profile files carry their own)."},
    {.name = "threads",
     .type = TG_CONFIG_INT,
     .def = "0",
     .min = 0,
     .max = 1024,
     .offset = EV_OFF(threads, int64_t),
     .metavar = "N",
     .help = "CPU threads (0 = all)."},
    {.name = "continuation",
     .type = TG_CONFIG_INT,
     .def = "16",
     .min = 0,
     .max = 256,
     .offset = EV_OFF(cont, int64_t),
     .metavar = "N",
     .help = "Greedy tokens generated at each turn's start and compared "
             "with full KV's (0: none)."},
    {.name = "max-tokens",
     .type = TG_CONFIG_INT,
     .def = "4096",
     .min = 2,
     .max = 1 << 20,
     .offset = EV_OFF(max_tokens, int64_t),
     .metavar = "N",
     .help = "Turns that end beyond this many tokens are dropped."},
    {.name = "max-conversations",
     .type = TG_CONFIG_INT,
     .def = "0",
     .min = 0,
     .max = 1 << 30,
     .offset = EV_OFF(max_conv, int64_t),
     .metavar = "N",
     .help = "Read at most N conversations (0: all)."},
    {.name = "json",
     .type = TG_CONFIG_STRING,
     .offset = EV_OFF(json_out, char *),
     .metavar = "FILE",
     .help = "Also write the report as JSON (- for stdout, then without "
             "the table)."},
    {.name = "plot",
     .type = TG_CONFIG_STRING,
     .offset = EV_OFF(plot, char *),
     .metavar = "FILE.svg",
     .help = "Also draw quality loss against memory saved and against the "
             "turn index (SVG)."},
};
#undef EV_OFF

static volatile sig_atomic_t eval_stop;

static void eval_signal(int sig)
{
    (void)sig;
    eval_stop = 1;
}

static int eval_run(struct eval_args *a)
{
    size_t n = strlen(a->plot != NULL ? a->plot : "");
    if (a->plot != NULL && (n < 4 || strcmp(a->plot + n - 4, ".svg") != 0))
        return profile_cli_usage_error("--plot writes SVG: name a .svg file");
    const char *list[64];
    double ratios[64];
    int np = 0, nr = 0;
    for (char *tok = a->profiles != NULL ? strtok(a->profiles, ",") : NULL;
         tok != NULL; tok = strtok(NULL, ","))
        if (*tok != '\0' && np < 64)
            list[np++] = tok;
    for (char *tok = a->ratios != NULL ? strtok(a->ratios, ",") : NULL;
         tok != NULL; tok = strtok(NULL, ",")) {
        char *end;
        double r = strtod(tok, &end);
        if (end == tok || *end != '\0' || !(r > 0 && r <= 1) || nr == 64)
            return profile_cli_usage_error(
                "--ratio: a comma-separated list of at most 64 keep ratios "
                "in (0, 1]");
        ratios[nr++] = r;
    }
    if (np + nr == 0)
        return profile_cli_usage_error("no profile given: name profile files "
                                       "with --profile or ratios with "
                                       "--ratio");
    enum tg_score_method m;
    if (nr > 0 && (gw_method_parse(a->method, &m) != 0 || m == TG_SCORE_GVOTE))
        return profile_cli_usage_error(
            "--method: snapkv, keydiff or expected_attention (a --ratio "
            "profile needs a scoring method: gvote has no ratio)");
    struct gw_eval_opts o = {
        .model_dir = a->model,
        .data_path = a->data,
        .profiles = list,
        .n_profiles = np,
        .ratios = ratios,
        .n_ratios = nr,
        .samples_path = a->samples,
        .calib_method = a->method,
        .calib_alpha = a->alpha,
        .tmp_dir = a->tmp_dir,
        .backend = (enum gw_backend_kind)a->backend,
        .prefill_chunk = (int)a->chunk,
        .page_size = (int)a->page,
        .heads_per_group = (int)a->hpg,
        .n_threads = (int)a->threads,
        .continuation = (int)a->cont,
        .max_tokens = (int)a->max_tokens,
        .max_conversations = (int)a->max_conv,
        .stop = &eval_stop,
        .progress = gw_eval_progress_bar,
    };
    signal(SIGINT, eval_signal);
    signal(SIGTERM, eval_signal);
    char err[1024];
    struct gw_eval_result r;
    int rc = gw_evaluate_run(&o, &r, err, sizeof(err));
    if (rc == 0)
        rc = gw_eval_write(&r, a->json_out, a->plot, stdout, err, sizeof(err));
    if (rc != 0)
        rc = profile_cli_fail("evaluate: %s", err);
    if (rc == 0 && r.interrupted) {
        fprintf(stderr, PROG " evaluate: interrupted; partial results "
                             "written\n");
        rc = 130;
    }
    gw_eval_result_free(&r);
    return rc;
}

/* --profile may be given several times: joined into one list. */
int profile_cli_evaluate(int argc, char **argv)
{
    static const size_t n = sizeof(eval_table) / sizeof(eval_table[0]);
    char **av = calloc((size_t)argc + 3, sizeof(char *));
    char *joined = calloc(1, 1);
    int ac = 0, rc = av == NULL || joined == NULL ? 1 : -1;
    for (int i = 0; rc < 0 && i < argc; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--profile") == 0 && i + 1 < argc)
            v = argv[++i];
        else if (strncmp(argv[i], "--profile=", 10) == 0)
            v = argv[i] + 10;
        if (v == NULL) {
            av[ac++] = argv[i];
            continue;
        }
        size_t l = strlen(joined);
        char *j = realloc(joined, l + strlen(v) + 2);
        if (j == NULL) {
            rc = 1;
            break;
        }
        joined = j;
        snprintf(joined + l, strlen(v) + 2, "%s%s", l ? "," : "", v);
    }
    if (rc < 0 && joined[0] != '\0') {
        av[ac++] = "--profile";
        av[ac++] = joined;
    }
    struct eval_args a;
    memset(&a, 0, sizeof(a));
    if (rc < 0)
        rc = profile_cli_parse_flags(eval_table, n, &a, ac, av);
    if (rc < 0)
        rc = eval_run(&a);
    tg_config_free(eval_table, n, &a);
    free(av);
    free(joined);
    return rc;
}
