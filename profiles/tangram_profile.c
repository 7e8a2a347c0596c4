/*
 * tangram-profile — build, inspect and apply budget profiles
 * (DESIGN.md §4.2, §4.6, §4.7; docs/PROFILES.md).
 *
 *   tangram-profile build  --retention FILE [--alpha A] --heads-per-group N
 *                          [--grouping clustered|adjacent] [--model DIR]
 *                          -o OUT
 *   tangram-profile identity --model DIR
 *   tangram-profile show   --profile P [--context N] [--page-size P]
 *                          [--prefill-chunk C]
 *   tangram-profile splits --profile P --n-cta N
 *   tangram-profile pages  --profile P --tokens N [--page-size 16]
 *                          [--prefill-chunk 512]
 *   tangram-profile tp     --profile P --ranks T
 *   tangram-profile calibrate --model DIR --ratio r --samples FILE.jsonl
 *                          [--method M] [--alpha A] [--heads-per-group N] -o OUT
 *   tangram-profile calibrate --model DIR --method gvote --samples FILE.jsonl
 *                          [--gvote-p P] [--gvote-samples S] [--gvote-future N]
 *                          [--prefill-chunk C] [--seed N] ... -o OUT
 *   (calibrate also takes --backend cpu|cuda: the forward pass of the runs)
 *   tangram-profile evaluate --model DIR --data FILE.jsonl --profile A.json
 *                          [--profile B.json ...] [--ratio 0.5,0.25
 *                          [--samples FILE.jsonl]] [--backend cpu|cuda]
 *                          [--json FILE] [--plot FILE.svg] ...
 *
 * JSON results go to stdout, errors to stderr; exit status 0 on success, 1
 * on bad input (files, values), 2 on bad usage (an unknown flag, a bad or
 * missing flag value). Each sub-command's flags are one tg_config table
 * (common/base/tg_config.h), so `tangram-profile COMMAND --help` is generated
 * from it; no TANGRAM_* variables are read (names such as --profile,
 * --model and --page-size would collide with the daemon's).
 */
#include "common/kv/kv_budget.h"
#include "common/kv/kv_prompt.h"
#include "common/profile/pf_build.h"
#include "common/profile/pf_identity.h"
#include "common/profile/pf_profile.h"
#include "common/profile/pf_split.h"
#include "common/base/tg_config.h"
#include "common/base/tg_err.h"
#include "common/base/tg_path.h"
#include "gpu_worker/engine/gw_calibrate.h"
#include "profiles/profile_cli.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static int fail(const char *fmt, const char *detail)
{
    fprintf(stderr, PROG ": ");
    fprintf(stderr, fmt, detail);
    fputc('\n', stderr);
    return EXIT_FAILURE;
}

static int usage_error(const struct command *c, const char *msg)
{
    fprintf(stderr, PROG " %s: %s\nusage: %s\n", c->name, msg, c->usage);
    return EXIT_USAGE;
}

static int print_json(json_t *doc)
{
    if (doc == NULL)
        return fail("%s", "out of memory");
    int rc = json_dumpf(doc, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                         JSON_REAL_PRECISION(17));
    json_decref(doc);
    if (rc != 0 || fputc('\n', stdout) == EOF || fflush(stdout) != 0)
        return fail("%s", "cannot write to stdout");
    return 0;
}

/* Reports a load error; tg_json names the file itself, field errors do
 * not, so prefix the path when it is missing. */
static int file_fail(const char *path, const char *err)
{
    if (strstr(err, path) == err)
        fprintf(stderr, PROG ": %s\n", err);
    else
        fprintf(stderr, PROG ": %s: %s\n", path, err);
    return EXIT_FAILURE;
}

static int load_profile(const char *path, struct pf_profile *p)
{
    char err[512];
    if (pf_profile_load(p, path, err, sizeof(err)) != 0)
        return file_fail(path, err);
    return 0;
}

static const struct command *current;

/* Parses the flags of the current sub-command with its table into dst.
 * Returns -1 to go on, else the exit status to end with: 0 after --help
 * (printed to stdout), EXIT_USAGE after a usage error (the message and the
 * usage line on stderr), EXIT_FAILURE when out of memory. */
static int parse_flags(const struct tg_config_entry *table, size_t n,
                       void *dst, int argc, char **argv)
{
    char usage[1024], err[512];
    snprintf(usage, sizeof(usage), "usage: %s\n\n%s", current->usage,
             current->summary);
    struct tg_config_cli cli = {.usage = usage, .help_out = stdout,
                                .no_env = true};
    int rc = tg_config_parse_cli(table, n, dst, &cli, argc, argv, NULL, err,
                                 sizeof(err));
    if (rc == TG_EDONE)
        return 0;
    if (rc == TG_ENOMEM)
        return fail("%s", "out of memory");
    if (rc != 0)
        return usage_error(current, err);
    return -1;
}

/* What the sub-commands in other files use (profile_cli.h). */
int profile_cli_fail(const char *fmt, const char *detail)
{
    return fail(fmt, detail);
}

int profile_cli_usage_error(const char *msg)
{
    return usage_error(current, msg);
}

int profile_cli_parse_flags(const struct tg_config_entry *table, size_t n,
                            void *dst, int argc, char **argv)
{
    return parse_flags(table, n, dst, argc, argv);
}

static const char *const grouping_choices[] = {"clustered", "adjacent",
                                               NULL};

/* A --grouping choice index as the enum (via its name, so the two lists
 * cannot drift apart). */
static enum pf_grouping grouping_of(int idx)
{
    enum pf_grouping g = PF_GROUPING_CLUSTERED;
    TG_ASSERT(pf_grouping_parse(grouping_choices[idx], &g) == 0);
    return g;
}

#define ROW_ALPHA(S)                                                       \
    {.name = "alpha", .type = TG_CONFIG_DOUBLE, .def = "2", .min = 0,      \
     .max = INFINITY, .offset = TG_CONFIG_OFFSET(S, alpha, double),        \
     .metavar = "A",                                                       \
     .help = "Budget = min(1, mean + A x std) of each head's retention."}
#define ROW_GROUPING(S)                                                    \
    {.name = "grouping", .type = TG_CONFIG_ENUM, .def = "clustered",       \
     .choices = grouping_choices,                                          \
     .offset = TG_CONFIG_OFFSET(S, grouping, int),                         \
     .help = "clustered: heads of similar budget share a page group; "     \
             "adjacent: heads in index order (ablation)."}
#define ROW_OUTPUT(S, what)                                                \
    {.name = "output", .short_flag = 'o', .type = TG_CONFIG_STRING,        \
     .offset = TG_CONFIG_OFFSET(S, out, char *), .metavar = "OUT",         \
     .flags = TG_CONFIG_REQUIRED, .help = what}

/* ---- build ------------------------------------------------------------- */

struct build_args {
    char *retention, *out, *model;
    double alpha;
    int64_t hpg;
    int grouping;
};

static const struct tg_config_entry build_table[] = {
    {.name = "retention", .type = TG_CONFIG_STRING,
     .offset = TG_CONFIG_OFFSET(struct build_args, retention, char *),
     .metavar = "FILE", .flags = TG_CONFIG_REQUIRED,
     .help = "Per-head retention samples (tangram-retention JSON)."},
    ROW_ALPHA(struct build_args),
    {.name = "heads-per-group", .type = TG_CONFIG_INT, .min = 1,
     .max = PF_MAX_HEADS,
     .offset = TG_CONFIG_OFFSET(struct build_args, hpg, int64_t),
     .metavar = "N", .flags = TG_CONFIG_REQUIRED,
     .help = "KV heads per page group (H_p); must divide the KV heads."},
    ROW_GROUPING(struct build_args),
    {.name = "model", .type = TG_CONFIG_STRING,
     .offset = TG_CONFIG_OFFSET(struct build_args, model, char *),
     .metavar = "DIR",
     .help = "The model the retention was measured on: its identity goes "
             "into the profile (a retention file from calibrate names it "
             "already; the two must agree)."},
    ROW_OUTPUT(struct build_args, "Profile to write; - writes it to stdout."),
};

/* The identity the built profile names: --model's, which must agree with
 * the retention file's when that has one, else the retention file's (or
 * none). Returns 0 with id set ("" for none), else the exit status. */
static int build_identity(const struct build_args *a,
                          const struct pf_retention *r, char *id)
{
    char err[512];
    id[0] = '\0';
    if (a->model != NULL) {
        struct mc_model_config cfg;
        if (mc_model_config_load(&cfg, a->model, err, sizeof(err)) != 0)
            return file_fail(a->model, err);
        if (cfg.num_layers != r->num_layers ||
            cfg.num_kv_heads != r->num_kv_heads ||
            cfg.head_dim != r->head_dim) {
            fprintf(stderr, PROG ": build: %s is for L=%d H=%d d=%d, --model "
                    "%s has L=%d H=%d d=%d\n", a->retention, r->num_layers,
                    r->num_kv_heads, r->head_dim, a->model, cfg.num_layers,
                    cfg.num_kv_heads, cfg.head_dim);
            return EXIT_FAILURE;
        }
        if (pf_identity_of_config(&cfg, id) != 0)
            return fail("%s", "cannot hash the model's config");
        if (r->model_identity != NULL && strcmp(r->model_identity, id) != 0) {
            fprintf(stderr, PROG ": build: %s was measured on model %s, not "
                    "on --model %s (%s)\n", a->retention, r->model_identity,
                    a->model, id);
            return EXIT_FAILURE;
        }
    } else if (r->model_identity != NULL) {
        snprintf(id, PF_IDENTITY_LEN + 1, "%s", r->model_identity);
    }
    return 0;
}

static int build_run(const struct build_args *a)
{
    char err[512];
    struct pf_retention r;
    if (pf_retention_load(&r, a->retention, err, sizeof(err)) != 0)
        return file_fail(a->retention, err);
    char id[PF_IDENTITY_LEN + 1];
    int rc = build_identity(a, &r, id);
    if (rc != 0) {
        pf_retention_free(&r);
        return rc;
    }
    struct pf_profile p;
    rc = pf_profile_build(&p, &r, a->alpha, (int)a->hpg,
                          grouping_of(a->grouping), err, sizeof(err));
    pf_retention_free(&r);
    if (rc == 0 && id[0] != '\0')
        rc = pf_profile_set_identity(&p, id, err, sizeof(err));
    if (rc != 0) {
        pf_profile_free(&p);
        return fail("build: %s", err);
    }
    if (strcmp(a->out, "-") == 0) {
        json_t *doc;
        rc = pf_profile_to_json(&p, &doc, err, sizeof(err));
        pf_profile_free(&p);
        return rc != 0 ? fail("%s", err) : print_json(doc);
    }
    rc = pf_profile_save(&p, a->out, err, sizeof(err));
    pf_profile_free(&p);
    return rc != 0 ? fail("%s", err) : 0;
}

static int cmd_build(int argc, char **argv)
{
    static const size_t n = sizeof(build_table) / sizeof(build_table[0]);
    struct build_args a;
    memset(&a, 0, sizeof(a));
    int rc = parse_flags(build_table, n, &a, argc, argv);
    if (rc < 0)
        rc = build_run(&a);
    tg_config_free(build_table, n, &a);
    return rc;
}

/* ---- profile-reading commands ------------------------------------------ */

struct use_args {
    char *profile;
    int64_t n_cta, tokens, page, chunk, context, ranks;
};

#define USE_OFF(f) TG_CONFIG_OFFSET(struct use_args, f, int64_t)
#define ROW_PROFILE                                                        \
    {.name = "profile", .type = TG_CONFIG_STRING,                          \
     .offset = TG_CONFIG_OFFSET(struct use_args, profile, char *),         \
     .metavar = "P", .flags = TG_CONFIG_REQUIRED,                          \
     .help = "The profile (tangram-profile JSON)."}
#define ROW_PAGE                                                           \
    {.name = "page-size", .type = TG_CONFIG_INT, .def = "16", .min = 1,    \
     .max = INT32_MAX, .offset = USE_OFF(page), .metavar = "TOKENS",       \
     .help = "Tokens per KV page (P)."}
#define ROW_CHUNK                                                          \
    {.name = "prefill-chunk", .type = TG_CONFIG_INT, .def = "512",         \
     .min = 1, .max = INT32_MAX, .offset = USE_OFF(chunk),                 \
     .metavar = "TOKENS",                                                  \
     .help = "Prefill chunk length C; compression runs per chunk."}

/* Parses the flags and loads the profile. Returns -1 to go on (then p is
 * loaded and the caller frees it), else the exit status. */
static int use_begin(const struct tg_config_entry *table, size_t n,
                     int argc, char **argv, struct use_args *a,
                     struct pf_profile *p)
{
    int rc = parse_flags(table, n, a, argc, argv);
    if (rc >= 0)
        return rc;
    rc = load_profile(a->profile, p);
    return rc != 0 ? rc : -1;
}

/* Runs a profile-reading sub-command: its flags, the profile, then `run`
 * (which frees the profile). */
static int use_command(const struct tg_config_entry *table, size_t n,
                       int argc, char **argv,
                       int (*run)(const struct use_args *a,
                                  struct pf_profile *p))
{
    struct use_args a;
    struct pf_profile p;
    memset(&a, 0, sizeof(a));
    int rc = use_begin(table, n, argc, argv, &a, &p);
    if (rc < 0)
        rc = run(&a, &p);
    tg_config_free(table, n, &a);
    return rc;
}

/* Appends `v` to array `arr` (stolen); returns 0 or -1, as jansson does. */
static int push(json_t *arr, json_t *v)
{
    return json_array_append_new(arr, v);
}

/* rows x cols integers (row-major) as nested JSON arrays; NULL on OOM. */
static json_t *int_rows(const int64_t *v, int rows, int cols)
{
    json_t *outer = json_array();
    int bad = outer == NULL;
    for (int r = 0; r < rows && !bad; r++) {
        json_t *row = json_array();
        bad |= push(outer, row);
        const int64_t *src = v + (size_t)r * (size_t)cols;
        for (int c = 0; c < cols && !bad; c++)
            bad |= push(row, json_integer(src[c]));
    }
    if (bad) {
        json_decref(outer);
        return NULL;
    }
    return outer;
}

static int splits_run(const struct use_args *a, struct pf_profile *p)
{
    int rc = 0;
    size_t n = (size_t)p->num_layers * (size_t)p->num_groups;
    int *s = malloc(n * sizeof(int));
    int64_t *s64 = malloc(n * sizeof(int64_t));
    char err[256];
    if (s == NULL || s64 == NULL) {
        rc = fail("%s", "out of memory");
    } else if (pf_split_map(p, (int)a->n_cta, s, err, sizeof(err)) != 0) {
        rc = fail("splits: %s", err);
    } else {
        for (size_t i = 0; i < n; i++)
            s64[i] = s[i];
        json_t *doc = json_object();
        int bad = doc == NULL;
        if (!bad) {
            bad |= json_object_set_new(doc, "n_cta", json_integer(a->n_cta));
            bad |= json_object_set_new(
                doc, "splits", int_rows(s64, p->num_layers, p->num_groups));
        }
        if (bad) {
            json_decref(doc);
            doc = NULL;
        }
        rc = print_json(doc);
    }
    free(s);
    free(s64);
    pf_profile_free(p);
    return rc;
}

static int cmd_splits(int argc, char **argv)
{
    static const struct tg_config_entry table[] = {
        ROW_PROFILE,
        {.name = "n-cta", .type = TG_CONFIG_INT, .min = 1, .max = INT32_MAX,
         .offset = USE_OFF(n_cta), .metavar = "N",
         .flags = TG_CONFIG_REQUIRED,
         .help = "N_CTA of DESIGN.md 4.6: the decode kernel's active CTAs "
                 "per SM times the SM count."},
    };
    return use_command(table, sizeof(table) / sizeof(table[0]), argc, argv,
                       splits_run);
}

static int pages_run(const struct use_args *a, struct pf_profile *p)
{
    struct kv_prompt_pages pg;
    char err[256];
    if (kv_prompt_pages_compute(&pg, p, a->tokens, a->chunk, a->page, err,
                         sizeof(err)) != 0) {
        pf_profile_free(p);
        return fail("pages: %s", err);
    }
    size_t L = (size_t)p->num_layers, G = (size_t)p->num_groups;
    json_t *doc = json_object();
    int bad = doc == NULL;
    if (!bad) {
        bad |= json_object_set_new(doc, "tokens",
                                   int_rows(pg.tokens, (int)L, (int)G));
        bad |= json_object_set_new(doc, "pages",
                                   int_rows(pg.pages, (int)L, (int)G));
        bad |= json_object_set_new(doc, "total_pages",
                                   json_integer(pg.total_pages));
        bad |= json_object_set_new(doc, "monolithic_pages",
                                   json_integer(pg.monolithic_pages));
    }
    if (bad) {
        json_decref(doc);
        doc = NULL;
    }
    kv_prompt_pages_free(&pg);
    pf_profile_free(p);
    return print_json(doc);
}

static int cmd_pages(int argc, char **argv)
{
    static const struct tg_config_entry table[] = {
        ROW_PROFILE,
        {.name = "tokens", .type = TG_CONFIG_INT, .min = 0,
         .max = 1099511627776.0, .offset = USE_OFF(tokens), .metavar = "N",
         .flags = TG_CONFIG_REQUIRED, .help = "Prompt length in tokens."},
        ROW_PAGE,
        ROW_CHUNK,
    };
    return use_command(table, sizeof(table) / sizeof(table[0]), argc, argv,
                       pages_run);
}

static int tp_run(const struct use_args *a, struct pf_profile *p)
{
    int rc = 0;
    struct pf_tp_plan plan;
    char err[256];
    rc = pf_tp_assign(&plan, p, (int)a->ranks, err, sizeof(err));
    pf_profile_free(p);
    if (rc != 0)
        return fail("%s", err);
    json_t *doc = json_object();
    json_t *heads = json_array(), *groups = json_array(), *bud = json_array();
    int bad = doc == NULL || heads == NULL || groups == NULL || bud == NULL;
    int L = plan.num_layers;
    for (int r = 0; r < plan.ranks && !bad; r++) {
        json_t *hr = json_array(), *gr = json_array(), *br = json_array();
        bad |= push(heads, hr);
        bad |= push(groups, gr);
        bad |= push(bud, br);
        for (int l = 0; l < L && !bad; l++) {
            json_t *hl = json_array(), *gl = json_array();
            bad |= push(hr, hl);
            bad |= push(gr, gl);
            const int *hh = pf_tp_heads(&plan, r, l);
            const int *gg = pf_tp_groups(&plan, r, l);
            for (int j = 0; j < plan.heads_per_rank && !bad; j++)
                bad |= push(hl, json_integer(hh[j]));
            for (int j = 0; j < plan.groups_per_rank && !bad; j++)
                bad |= push(gl, json_integer(gg[j]));
            bad |= push(br, json_real(plan.rank_budget[(size_t)r * L + l]));
        }
    }
    if (!bad) {
        bad |= json_object_set_new(doc, "ranks", json_integer(plan.ranks));
        bad |= json_object_set_new(doc, "heads", heads);
        bad |= json_object_set_new(doc, "groups", groups);
        bad |= json_object_set_new(doc, "rank_budget", bud);
        heads = groups = bud = NULL;
    }
    json_decref(heads);
    json_decref(groups);
    json_decref(bud);
    pf_tp_free(&plan);
    if (bad) {
        json_decref(doc);
        doc = NULL;
    }
    return print_json(doc);
}

static int cmd_tp(int argc, char **argv)
{
    static const struct tg_config_entry table[] = {
        ROW_PROFILE,
        {.name = "ranks", .type = TG_CONFIG_INT, .min = 1, .max = PF_MAX_HEADS,
         .offset = USE_OFF(ranks), .metavar = "T", .flags = TG_CONFIG_REQUIRED,
         .help = "Tensor-parallel ranks."},
    };
    return use_command(table, sizeof(table) / sizeof(table[0]), argc, argv,
                       tp_run);
}

/* ---- show --------------------------------------------------------------- */

static void show_layers(const struct pf_profile *p)
{
    int H = p->num_kv_heads, hp = p->heads_per_group;
    for (int l = 0; l < p->num_layers; l++) {
        const double *b = p->budget + (size_t)l * (size_t)H;
        printf("layer %d\n  budgets:", l);
        for (int h = 0; h < H; h++)
            printf(" %.4f", b[h]);
        printf("\n  groups: ");
        for (int g = 0; g < p->num_groups; g++) {
            const int *heads = pf_profile_group(p, l, g);
            printf(" [");
            for (int j = 0; j < hp; j++)
                printf(j ? " %d" : "%d", heads[j]);
            printf("]=%.4f", pf_profile_group_budget(p, l, g));
        }
        printf("\n");
    }
}

static double pct(int64_t part, int64_t whole)
{
    return whole > 0 ? 100.0 * (double)part / (double)whole : 0.0;
}

static int show_run(const struct use_args *a, struct pf_profile *p)
{
    struct kv_prompt_pages pg;
    char err[256];
    if (kv_prompt_pages_compute(&pg, p, a->context, a->chunk, a->page, err,
                         sizeof(err)) != 0) {
        pf_profile_free(p);
        return fail("show: %s", err);
    }
    printf("profile %s: %s, %d layers x %d KV heads, head_dim %d\n",
           a->profile, p->architecture, p->num_layers, p->num_kv_heads,
           p->head_dim);
    printf("model identity %s\n",
           p->model_identity != NULL ? p->model_identity
                                     : "none (not checked when serving)");
    printf("method %s, target_ratio %g, alpha %g, %d samples\n", p->method,
           p->target_ratio, p->alpha, p->samples);
    printf("grouping %s, %d heads per group, %d groups per layer\n",
           pf_grouping_name(p->grouping), p->heads_per_group, p->num_groups);
    show_layers(p);
    /* One page = H_p heads x 2 (K, V) x P tokens x d elements; bytes for
     * bf16, the CUDA backend's KV dtype. */
    int64_t groups = (int64_t)p->num_layers * p->num_groups;
    int64_t full = kv_pages_for(a->context, a->page) * groups;
    double page_mib = (double)p->heads_per_group * 2.0 * (double)a->page *
                      (double)p->head_dim * 2.0 / (1024.0 * 1024.0);
    printf("KV memory for one %lld-token prompt (page %lld tokens, prefill "
           "chunk %lld, bf16):\n",
           (long long)a->context, (long long)a->page, (long long)a->chunk);
    printf("  full KV:          %10lld pages %12.2f MiB\n", (long long)full,
           (double)full * page_mib);
    printf("  monolithic:       %10lld pages %12.2f MiB\n",
           (long long)pg.monolithic_pages,
           (double)pg.monolithic_pages * page_mib);
    printf("  ragged (grouped): %10lld pages %12.2f MiB\n",
           (long long)pg.total_pages, (double)pg.total_pages * page_mib);
    printf("reclaimable: %.2f%% of the monolithic layout, %.2f%% of full KV\n",
           pct(pg.monolithic_pages - pg.total_pages, pg.monolithic_pages),
           pct(full - pg.total_pages, full));
    kv_prompt_pages_free(&pg);
    pf_profile_free(p);
    return fflush(stdout) == 0 ? 0 : fail("%s", "cannot write to stdout");
}

static int cmd_show(int argc, char **argv)
{
    static const struct tg_config_entry table[] = {
        ROW_PROFILE,
        {.name = "context", .type = TG_CONFIG_INT, .def = "32768", .min = 0,
         .max = 1099511627776.0, .offset = USE_OFF(context), .metavar = "N",
         .help = "Prompt length of the memory estimate, in tokens."},
        ROW_PAGE,
        ROW_CHUNK,
    };
    return use_command(table, sizeof(table) / sizeof(table[0]), argc, argv,
                       show_run);
}

/* ---- calibrate ----------------------------------------------------------- */

struct calib_args {
    char *model, *method, *samples, *retention_out, *out;
    double ratio, alpha;
    int64_t hpg, max_sample_tokens, threads;
    int grouping, backend;
    bool trig;
    double gvote_p;
    int64_t gvote_samples, gvote_future, prefill_chunk, seed;
};

/* The defaults of the gvote rows below, also what "not given" looks like
 * to calib_run (a flag given with its default value changes nothing). */
#define CAL_GVOTE_P_DEF "0.95"
#define CAL_GVOTE_SAMPLES_DEF "8"
#define CAL_GVOTE_FUTURE_DEF "32"
#define CAL_CHUNK_DEF "512"
#define CAL_SEED_DEF "0"

#define CAL_OFF(f, t) TG_CONFIG_OFFSET(struct calib_args, f, t)
static const struct tg_config_entry calib_table[] = {
    {.name = "model", .type = TG_CONFIG_STRING,
     .offset = CAL_OFF(model, char *), .metavar = "DIR",
     .flags = TG_CONFIG_REQUIRED,
     .help = "Hugging Face model directory (with tokenizer.json)."},
    {.name = "method", .type = TG_CONFIG_STRING, .def = "snapkv",
     .offset = CAL_OFF(method, char *), .metavar = "M",
     .help = "Scoring method: snapkv, keydiff or expected_attention (the "
             "paper's global top-k per layer), or gvote (its own adaptive "
             "keep counts, DESIGN.md 4.8)."},
    /* No default: 0 means "not given" (the range starts above it). */
    {.name = "ratio", .type = TG_CONFIG_DOUBLE, .min = 1e-9, .max = 1,
     .offset = CAL_OFF(ratio, double), .metavar = "r",
     .help = "Target keep ratio r, in (0, 1]; required with a scoring "
             "method, refused with gvote."},
    /* gvote's flags: the names, ranges and defaults of tangram-generate's
     * and tangramd's (common/base/tg_serve_opts.c). */
    {.name = "gvote-p", .type = TG_CONFIG_DOUBLE, .def = CAL_GVOTE_P_DEF,
     .min = 1e-9, .max = 1, .offset = CAL_OFF(gvote_p, double),
     .metavar = "P",
     .help = "gvote: attention mass of the real query's nucleus."},
    {.name = "gvote-samples", .type = TG_CONFIG_INT,
     .def = CAL_GVOTE_SAMPLES_DEF, .min = 0, .max = GW_GVOTE_MAX_SAMPLES,
     .offset = CAL_OFF(gvote_samples, int64_t), .metavar = "S",
     .help = "gvote: synthetic queries per query head (0: deterministic)."},
    {.name = "gvote-future", .type = TG_CONFIG_INT,
     .def = CAL_GVOTE_FUTURE_DEF, .min = 1, .max = GW_GVOTE_MAX_FUTURE,
     .offset = CAL_OFF(gvote_future, int64_t), .metavar = "N",
     .help = "gvote: future positions averaged into the synthetic queries' "
             "rotation."},
    {.name = "prefill-chunk", .type = TG_CONFIG_INT, .def = CAL_CHUNK_DEF,
     .min = 1, .max = 1 << 20, .offset = CAL_OFF(prefill_chunk, int64_t),
     .metavar = "TOKENS",
     .help = "gvote: chunk length C the samples are cut into, as when "
             "serving (use the server's --prefill-chunk)."},
    {.name = "seed", .type = TG_CONFIG_INT, .def = CAL_SEED_DEF, .min = 0,
     .max = 9007199254740991.0, .offset = CAL_OFF(seed, int64_t),
     .metavar = "N",
     .help = "gvote: sample i (0-based) runs with request seed N + i, the "
             "seed of its synthetic queries."},
    {.name = "samples", .type = TG_CONFIG_STRING,
     .offset = CAL_OFF(samples, char *), .metavar = "FILE.jsonl",
     .flags = TG_CONFIG_REQUIRED,
     .help = "Calibration samples, one JSON object per line: text, messages "
             "or prompt_ids."},
    ROW_ALPHA(struct calib_args),
    {.name = "heads-per-group", .type = TG_CONFIG_INT, .def = "4", .min = 1,
     .max = PF_MAX_HEADS, .offset = CAL_OFF(hpg, int64_t), .metavar = "N",
     .help = "KV heads per page group (H_p) of the profile."},
    ROW_GROUPING(struct calib_args),
    {.name = "max-sample-tokens", .type = TG_CONFIG_INT, .def = "4096",
     .min = 1, .max = 1 << 20, .offset = CAL_OFF(max_sample_tokens, int64_t),
     .metavar = "N", .help = "Longer samples are cut to this many tokens."},
    {.name = "threads", .type = TG_CONFIG_INT, .def = "0", .min = 0,
     .max = 1024, .offset = CAL_OFF(threads, int64_t), .metavar = "N",
     .help = "CPU threads (0 = all)."},
    {.name = "backend", .type = TG_CONFIG_ENUM, .def = "cpu",
     .offset = CAL_OFF(backend, int), .choices = gw_backend_choices,
     .help = "Forward pass of the samples: cpu, or cuda (one GPU; scoring "
             "methods then take samples of at most 2048 tokens)."},
    {.name = "retention-out", .type = TG_CONFIG_STRING,
     .offset = CAL_OFF(retention_out, char *), .metavar = "FILE",
     .help = "Retention file to write; default OUT with .retention.json for "
             ".json."},
    {.name = "trig", .type = TG_CONFIG_BOOL,
     .def = "false", .offset = CAL_OFF(trig, bool),
     .help = "Also record the decode-time compression statistics (re, im, "
             "abs of the pre-RoPE queries per layer and query head, DESIGN.md "
             "4.9) into the profile's trig object."},
    ROW_OUTPUT(struct calib_args, "Profile to write."),
};
#undef CAL_OFF

static double calib_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ud: the double start time of the run (CLOCK_MONOTONIC seconds). */
static void calib_progress(void *ud, int done, int total, int n_tokens)
{
    fprintf(stderr, PROG " calibrate: sample %d/%d (%d tokens), %.1f s\n",
            done, total, n_tokens, calib_now() - *(const double *)ud);
}

/* The gvote-only flags given with a value other than their default,
 * named for a usage error; NULL when there is none. */
static const char *calib_gvote_flag_set(const struct calib_args *a)
{
    if (a->gvote_p != atof(CAL_GVOTE_P_DEF))
        return "--gvote-p";
    if (a->gvote_samples != atoll(CAL_GVOTE_SAMPLES_DEF))
        return "--gvote-samples";
    if (a->gvote_future != atoll(CAL_GVOTE_FUTURE_DEF))
        return "--gvote-future";
    if (a->prefill_chunk != atoll(CAL_CHUNK_DEF))
        return "--prefill-chunk";
    if (a->seed != atoll(CAL_SEED_DEF))
        return "--seed";
    return NULL;
}

static int calib_run(const struct calib_args *a)
{
    char msg[256];
    enum tg_score_method method;
    if (gw_method_parse(a->method, &method) != 0) {
        snprintf(msg, sizeof(msg), "--method: unknown method '%s' (snapkv, "
                 "keydiff, expected_attention, gvote)", a->method);
        return usage_error(current, msg);
    }
    int gv = method == TG_SCORE_GVOTE;
    const char *flag = calib_gvote_flag_set(a);
    if (gv && a->ratio != 0.0)
        return usage_error(current,
                           "--ratio does not apply to --method gvote: what "
                           "gvote keeps follows --gvote-p and the text (the "
                           "profile's target_ratio records the mean it "
                           "kept)");
    if (!gv && !(a->ratio > 0.0)) {
        snprintf(msg, sizeof(msg), "--ratio is required with --method %s (a "
                 "target keep ratio in (0, 1])", a->method);
        return usage_error(current, msg);
    }
    if (!gv && flag != NULL) {
        snprintf(msg, sizeof(msg), "%s applies to --method gvote only (%s "
                 "scores each sample as one chunk)", flag, a->method);
        return usage_error(current, msg);
    }
    double t0 = calib_now();
    struct gw_calib_opts o = {
        .model_dir = a->model, .samples_path = a->samples,
        .method = a->method, .ratio = gv ? 0.0 : a->ratio, .alpha = a->alpha,
        .heads_per_group = (int)a->hpg, .grouping = grouping_of(a->grouping),
        .max_sample_tokens = (int)a->max_sample_tokens,
        .n_threads = (int)a->threads, .trig = a->trig,
        .backend = (enum gw_backend_kind)a->backend,
        .gvote = {.p = a->gvote_p, .samples = (int)a->gvote_samples,
                  .future = (int)a->gvote_future},
        .prefill_chunk = gv ? (int)a->prefill_chunk : 0,
        .seed = (uint64_t)a->seed,
        .progress = calib_progress,
        .progress_ud = &t0,
    };
    char retpath[4096];
    const char *retention_out = a->retention_out;
    if (retention_out == NULL) {
        size_t n = strlen(a->out);
        if (n > 5 && strcmp(a->out + n - 5, ".json") == 0)
            n -= 5;
        char perr[256];
        if (tg_path_fmt(retpath, sizeof(retpath), perr, sizeof(perr),
                        "%.*s.retention.json", (int)n, a->out) != 0)
            return fail("calibrate: the retention file next to --out: %s "
                        "(name it with --retention-out)",
                        perr);
        retention_out = retpath;
    }
    char err[1024];
    struct pf_retention r;
    struct pf_profile p;
    int rc = gw_calibrate_files(&o, &r, &p, err, sizeof(err));
    if (rc != 0)
        return fail("calibrate: %s", err);
    rc = pf_retention_save(&r, retention_out, err, sizeof(err));
    if (rc == 0)
        rc = pf_profile_save(&p, a->out, err, sizeof(err));
    if (rc == 0)
        fprintf(stderr, PROG " calibrate: %d samples -> %s, %s (%s, %.1f s)\n",
                r.samples, retention_out, a->out,
                gw_backend_choices[a->backend], calib_now() - t0);
    pf_retention_free(&r);
    pf_profile_free(&p);
    return rc != 0 ? fail("calibrate: %s", err) : 0;
}

static int cmd_calibrate(int argc, char **argv)
{
    static const size_t n = sizeof(calib_table) / sizeof(calib_table[0]);
    struct calib_args a;
    memset(&a, 0, sizeof(a));
    int rc = parse_flags(calib_table, n, &a, argc, argv);
    if (rc < 0)
        rc = calib_run(&a);
    tg_config_free(calib_table, n, &a);
    return rc;
}

/* ---- identity ------------------------------------------------------------ */

struct identity_args {
    char *model;
};

static int cmd_identity(int argc, char **argv)
{
    static const struct tg_config_entry table[] = {
        {.name = "model", .type = TG_CONFIG_STRING,
         .offset = TG_CONFIG_OFFSET(struct identity_args, model, char *),
         .metavar = "DIR", .flags = TG_CONFIG_REQUIRED,
         .help = "Hugging Face model directory (or its config.json)."},
    };
    static const size_t n = sizeof(table) / sizeof(table[0]);
    struct identity_args a = {0};
    int rc = parse_flags(table, n, &a, argc, argv);
    if (rc >= 0) {
        tg_config_free(table, n, &a);
        return rc;
    }
    char err[512], id[PF_IDENTITY_LEN + 1], text[PF_IDENTITY_TEXT_MAX];
    struct mc_model_config cfg;
    rc = mc_model_config_load(&cfg, a.model, err, sizeof(err));
    if (rc != 0) {
        rc = file_fail(a.model, err);
    } else if (pf_identity_of_config(&cfg, id) != 0 ||
               pf_identity_text(&cfg, text, sizeof(text)) != 0) {
        rc = fail("%s", "cannot hash the model's config");
    } else {
        json_t *doc = json_object();
        if (doc != NULL &&
            (json_object_set_new(doc, "identity", json_string(id)) != 0 ||
             json_object_set_new(doc, "text", json_string(text)) != 0)) {
            json_decref(doc);
            doc = NULL;
        }
        rc = print_json(doc);
    }
    tg_config_free(table, n, &a);
    return rc;
}

/* ---- dispatch ------------------------------------------------------------ */

static const struct command commands[] = {
    {"build", cmd_build, "Build a profile from per-head retention samples.",
     PROG " build --retention FILE [--alpha A] --heads-per-group N "
          "[--grouping clustered|adjacent] [--model DIR] -o OUT"},
    {"identity", cmd_identity,
     "Print a model's identity, the one profiles record and serving checks, "
     "and the text it hashes, as JSON.",
     PROG " identity --model DIR"},
    {"show", cmd_show,
     "Print budgets, groups with group budgets, and the reclaimable memory "
     "for a prompt of --context tokens (default 32768).",
     PROG " show --profile P [--context N] [--page-size 16] "
          "[--prefill-chunk 512]"},
    {"splits", cmd_splits, "Print the decode split map S[l][g] as JSON.",
     PROG " splits --profile P --n-cta N"},
    {"pages", cmd_pages,
     "Print the tokens and pages each (layer, group) reserves for a prompt "
     "of N tokens, and the monolithic equivalent, as JSON.",
     PROG " pages --profile P --tokens N [--page-size 16] "
          "[--prefill-chunk 512]"},
    {"calibrate", cmd_calibrate,
     "Run a model over sample texts, record per-head retention under the "
     "paper's non-uniform compression (or gvote's own keep counts), and "
     "write the retention file and the profile.",
     PROG " calibrate --model DIR --samples FILE.jsonl "
          "(--ratio r [--method snapkv|keydiff|expected_attention] | "
          "--method gvote [--gvote-p 0.95] [--gvote-samples 8] "
          "[--gvote-future 32] [--prefill-chunk 512] [--seed 0]) "
          "[--alpha 2] "
          "[--heads-per-group 4] [--grouping clustered|adjacent] "
          "[--max-sample-tokens 4096] [--retention-out FILE] [--trig] "
          "[--backend cpu|cuda] -o OUT"},
    {"evaluate", profile_cli_evaluate,
     "Measure what profiles cost in quality and save in KV memory on "
     "conversations, against full KV: a table, --json and --plot (SVG).",
     PROG " evaluate --model DIR --data FILE.jsonl (--profile P.json "
          "[--profile Q.json ...] | --ratio r[,r...] | both) [--samples "
          "FILE.jsonl] [--method snapkv] [--alpha 2] [--heads-per-group 1] "
          "[--backend cpu|cuda] [--prefill-chunk 512] [--page-size 16] "
          "[--continuation 16] [--max-tokens 4096] [--max-conversations N] "
          "[--tmp-dir DIR] [--json FILE] [--plot FILE.svg]"},
    {"tp", cmd_tp,
     "Print the heads (and groups) of each tensor-parallel rank as JSON.",
     PROG " tp --profile P --ranks T"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " COMMAND [OPTIONS]   (" PROG
               " COMMAND --help for details)\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        if (strcmp(argv[1], commands[i].name) == 0) {
            current = &commands[i];
            return commands[i].run(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, PROG ": unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
