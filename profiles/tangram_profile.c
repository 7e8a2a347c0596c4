/*
 * tangram-profile — build, inspect and apply budget profiles
 * (DESIGN.md §4.2, §4.6, §4.7; docs/PROFILES.md).
 *
 *   tangram-profile build  --retention FILE [--alpha A] --heads-per-group N
 *                          [--grouping clustered|adjacent] -o OUT
 *   tangram-profile show   --profile P [--context N] [--page-size P]
 *                          [--prefill-chunk C]
 *   tangram-profile splits --profile P --n-cta N
 *   tangram-profile pages  --profile P --tokens N [--page-size 16]
 *                          [--prefill-chunk 512]
 *   tangram-profile tp     --profile P --ranks T
 *   tangram-profile calibrate --model DIR --ratio r --samples FILE.jsonl
 *                          [--method M] [--alpha A] [--heads-per-group N] -o OUT
 *
 * JSON results go to stdout, errors to stderr; exit status 0 on success, 1
 * on bad input (files, values), 2 on bad usage.
 */
#include "common/kv/kv_budget.h"
#include "common/pf_build.h"
#include "common/pf_profile.h"
#include "common/pf_split.h"
#include "common/tg_err.h"
#include "gpu_worker/gw_calibrate.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "tangram-profile"
#define EXIT_USAGE 2

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    const char *usage;
};

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

/* Parses a whole-string integer in [lo, hi]; returns 0 or -1. */
static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (s == NULL || *s == '\0')
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_f64(const char *s, double *out)
{
    if (s == NULL || *s == '\0')
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v))
        return -1;
    *out = v;
    return 0;
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

/* Options shared by the sub-commands; each accepts its own subset. */
enum {
    OPT_RETENTION = 256, OPT_ALPHA, OPT_HPG, OPT_GROUPING, OPT_PROFILE,
    OPT_NCTA, OPT_TOKENS, OPT_PAGE, OPT_CHUNK, OPT_CONTEXT, OPT_RANKS,
    OPT_MODEL, OPT_METHOD, OPT_RATIO, OPT_SAMPLES, OPT_RETOUT, OPT_MAXTOK,
    OPT_THREADS,
};

static const struct command *current;

/* Runs getopt_long over argv with `opts`, calling `take` per option. */
static int parse_opts(int argc, char **argv, const struct option *opts,
                      int (*take)(int opt, const char *arg, void *ctx),
                      void *ctx)
{
    optind = 1;
    opterr = 0;
    for (;;) {
        int idx = 0;
        int c = getopt_long(argc, argv, ":ho:", opts, &idx);
        if (c == -1)
            break;
        if (c == 'h') {
            printf("usage: %s\n%s\n", current->usage, current->summary);
            return -1;
        }
        if (c == '?') {
            char msg[128];
            snprintf(msg, sizeof(msg), "unknown option '%s'", argv[optind - 1]);
            return usage_error(current, msg);
        }
        if (c == ':') {
            char msg[128];
            snprintf(msg, sizeof(msg), "option '%s' needs a value",
                     argv[optind - 1]);
            return usage_error(current, msg);
        }
        int rc = take(c, optarg, ctx);
        if (rc != 0)
            return rc;
    }
    if (optind < argc) {
        char msg[128];
        snprintf(msg, sizeof(msg), "unexpected argument '%s'", argv[optind]);
        return usage_error(current, msg);
    }
    return 0;
}

static int bad_value(const char *opt, const char *arg, const char *want)
{
    char msg[256];
    snprintf(msg, sizeof(msg), "%s: '%s' is not %s", opt, arg, want);
    return usage_error(current, msg);
}

/* ---- build ------------------------------------------------------------- */

struct build_args {
    const char *retention, *out;
    double alpha;
    int64_t hpg;
    enum pf_grouping grouping;
};

static int build_take(int opt, const char *arg, void *ctx)
{
    struct build_args *a = ctx;
    switch (opt) {
    case OPT_RETENTION:
        a->retention = arg;
        return 0;
    case 'o':
        a->out = arg;
        return 0;
    case OPT_ALPHA:
        if (parse_f64(arg, &a->alpha) != 0 || a->alpha < 0.0)
            return bad_value("--alpha", arg, "a number >= 0");
        return 0;
    case OPT_HPG:
        if (parse_i64(arg, 1, PF_MAX_HEADS, &a->hpg) != 0)
            return bad_value("--heads-per-group", arg, "a positive integer");
        return 0;
    case OPT_GROUPING:
        if (pf_grouping_parse(arg, &a->grouping) != 0)
            return bad_value("--grouping", arg, "clustered or adjacent");
        return 0;
    default:
        return usage_error(current, "option not accepted here");
    }
}

static int cmd_build(int argc, char **argv)
{
    static const struct option opts[] = {
        {"retention", required_argument, NULL, OPT_RETENTION},
        {"alpha", required_argument, NULL, OPT_ALPHA},
        {"heads-per-group", required_argument, NULL, OPT_HPG},
        {"grouping", required_argument, NULL, OPT_GROUPING},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct build_args a = {NULL, NULL, 2.0, 0, PF_GROUPING_CLUSTERED};
    int rc = parse_opts(argc, argv, opts, build_take, &a);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (a.retention == NULL)
        return usage_error(current, "--retention is required");
    if (a.hpg == 0)
        return usage_error(current, "--heads-per-group is required");
    if (a.out == NULL)
        return usage_error(current, "-o OUT is required");
    char err[512];
    struct pf_retention r;
    if (pf_retention_load(&r, a.retention, err, sizeof(err)) != 0)
        return file_fail(a.retention, err);
    struct pf_profile p;
    rc = pf_profile_build(&p, &r, a.alpha, (int)a.hpg, a.grouping, err,
                          sizeof(err));
    pf_retention_free(&r);
    if (rc != 0)
        return fail("build: %s", err);
    if (strcmp(a.out, "-") == 0) {
        json_t *doc;
        rc = pf_profile_to_json(&p, &doc, err, sizeof(err));
        pf_profile_free(&p);
        return rc != 0 ? fail("%s", err) : print_json(doc);
    }
    rc = pf_profile_save(&p, a.out, err, sizeof(err));
    pf_profile_free(&p);
    return rc != 0 ? fail("%s", err) : 0;
}

/* ---- profile-reading commands ------------------------------------------ */

struct use_args {
    const char *profile;
    int64_t n_cta, tokens, page, chunk, context, ranks;
};

static int use_take(int opt, const char *arg, void *ctx)
{
    struct use_args *a = ctx;
    switch (opt) {
    case OPT_PROFILE:
        a->profile = arg;
        return 0;
    case OPT_NCTA:
        if (parse_i64(arg, 1, INT32_MAX, &a->n_cta) != 0)
            return bad_value("--n-cta", arg, "an integer >= 1");
        return 0;
    case OPT_TOKENS:
        if (parse_i64(arg, 0, (int64_t)1 << 40, &a->tokens) != 0)
            return bad_value("--tokens", arg, "an integer in [0, 2^40]");
        return 0;
    case OPT_CONTEXT:
        if (parse_i64(arg, 0, (int64_t)1 << 40, &a->context) != 0)
            return bad_value("--context", arg, "an integer in [0, 2^40]");
        return 0;
    case OPT_PAGE:
        if (parse_i64(arg, 1, INT32_MAX, &a->page) != 0)
            return bad_value("--page-size", arg, "an integer >= 1");
        return 0;
    case OPT_CHUNK:
        if (parse_i64(arg, 1, INT32_MAX, &a->chunk) != 0)
            return bad_value("--prefill-chunk", arg, "an integer >= 1");
        return 0;
    case OPT_RANKS:
        if (parse_i64(arg, 1, PF_MAX_HEADS, &a->ranks) != 0)
            return bad_value("--ranks", arg, "an integer >= 1");
        return 0;
    default:
        return usage_error(current, "option not accepted here");
    }
}

#define UNSET (-1)

/* Parses the options, checks the required ones, loads the profile. */
static int use_begin(int argc, char **argv, const struct option *opts,
                     struct use_args *a, struct pf_profile *p, int *done)
{
    *done = 0;
    int rc = parse_opts(argc, argv, opts, use_take, a);
    if (rc != 0) {
        *done = 1;
        return rc < 0 ? 0 : rc;
    }
    *done = 1;
    if (a->profile == NULL)
        return usage_error(current, "--profile is required");
    for (const struct option *o = opts; o->name != NULL; o++) {
        int64_t v = o->val == OPT_NCTA     ? a->n_cta
                    : o->val == OPT_TOKENS ? a->tokens
                    : o->val == OPT_RANKS  ? a->ranks
                                           : 0;
        if (v == UNSET) {
            char msg[64];
            snprintf(msg, sizeof(msg), "--%s is required", o->name);
            return usage_error(current, msg);
        }
    }
    rc = load_profile(a->profile, p);
    if (rc != 0)
        return rc;
    *done = 0;
    return 0;
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

static int cmd_splits(int argc, char **argv)
{
    static const struct option opts[] = {
        {"profile", required_argument, NULL, OPT_PROFILE},
        {"n-cta", required_argument, NULL, OPT_NCTA},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct use_args a = {NULL, UNSET, 0, 16, 512, 32768, 0};
    struct pf_profile p;
    int done, rc = use_begin(argc, argv, opts, &a, &p, &done);
    if (done)
        return rc;
    size_t n = (size_t)p.num_layers * (size_t)p.num_groups;
    int *s = malloc(n * sizeof(int));
    int64_t *s64 = malloc(n * sizeof(int64_t));
    char err[256];
    if (s == NULL || s64 == NULL) {
        rc = fail("%s", "out of memory");
    } else if (pf_split_map(&p, (int)a.n_cta, s, err, sizeof(err)) != 0) {
        rc = fail("splits: %s", err);
    } else {
        for (size_t i = 0; i < n; i++)
            s64[i] = s[i];
        json_t *doc = json_object();
        int bad = doc == NULL;
        if (!bad) {
            bad |= json_object_set_new(doc, "n_cta", json_integer(a.n_cta));
            bad |= json_object_set_new(
                doc, "splits", int_rows(s64, p.num_layers, p.num_groups));
        }
        if (bad) {
            json_decref(doc);
            doc = NULL;
        }
        rc = print_json(doc);
    }
    free(s);
    free(s64);
    pf_profile_free(&p);
    return rc;
}

static int cmd_pages(int argc, char **argv)
{
    static const struct option opts[] = {
        {"profile", required_argument, NULL, OPT_PROFILE},
        {"tokens", required_argument, NULL, OPT_TOKENS},
        {"page-size", required_argument, NULL, OPT_PAGE},
        {"prefill-chunk", required_argument, NULL, OPT_CHUNK},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct use_args a = {NULL, 0, UNSET, 16, 512, 32768, 0};
    struct pf_profile p;
    int done, rc = use_begin(argc, argv, opts, &a, &p, &done);
    if (done)
        return rc;
    struct pf_pages pg;
    char err[256];
    if (pf_pages_compute(&pg, &p, a.tokens, a.chunk, a.page, err,
                         sizeof(err)) != 0) {
        pf_profile_free(&p);
        return fail("pages: %s", err);
    }
    size_t L = (size_t)p.num_layers, G = (size_t)p.num_groups;
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
    pf_pages_free(&pg);
    pf_profile_free(&p);
    return print_json(doc);
}

static int cmd_tp(int argc, char **argv)
{
    static const struct option opts[] = {
        {"profile", required_argument, NULL, OPT_PROFILE},
        {"ranks", required_argument, NULL, OPT_RANKS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct use_args a = {NULL, 0, 0, 16, 512, 32768, UNSET};
    struct pf_profile p;
    int done, rc = use_begin(argc, argv, opts, &a, &p, &done);
    if (done)
        return rc;
    struct pf_tp_plan plan;
    char err[256];
    rc = pf_tp_assign(&plan, &p, (int)a.ranks, err, sizeof(err));
    pf_profile_free(&p);
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

static int cmd_show(int argc, char **argv)
{
    static const struct option opts[] = {
        {"profile", required_argument, NULL, OPT_PROFILE},
        {"context", required_argument, NULL, OPT_CONTEXT},
        {"page-size", required_argument, NULL, OPT_PAGE},
        {"prefill-chunk", required_argument, NULL, OPT_CHUNK},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct use_args a = {NULL, 0, 0, 16, 512, 32768, 0};
    struct pf_profile p;
    int done, rc = use_begin(argc, argv, opts, &a, &p, &done);
    if (done)
        return rc;
    struct pf_pages pg;
    char err[256];
    if (pf_pages_compute(&pg, &p, a.context, a.chunk, a.page, err,
                         sizeof(err)) != 0) {
        pf_profile_free(&p);
        return fail("show: %s", err);
    }
    printf("profile %s: %s, %d layers x %d KV heads, head_dim %d\n",
           a.profile, p.architecture, p.num_layers, p.num_kv_heads, p.head_dim);
    printf("method %s, target_ratio %g, alpha %g, %d samples\n", p.method,
           p.target_ratio, p.alpha, p.samples);
    printf("grouping %s, %d heads per group, %d groups per layer\n",
           pf_grouping_name(p.grouping), p.heads_per_group, p.num_groups);
    show_layers(&p);
    /* One page = H_p heads x 2 (K, V) x P tokens x d elements; bytes for
     * bf16, the CUDA backend's KV dtype. */
    int64_t groups = (int64_t)p.num_layers * p.num_groups;
    int64_t full = kv_pages_for(a.context, a.page) * groups;
    double page_mib = (double)p.heads_per_group * 2.0 * (double)a.page *
                      (double)p.head_dim * 2.0 / (1024.0 * 1024.0);
    printf("KV memory for one %lld-token prompt (page %lld tokens, prefill "
           "chunk %lld, bf16):\n",
           (long long)a.context, (long long)a.page, (long long)a.chunk);
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
    pf_pages_free(&pg);
    pf_profile_free(&p);
    return fflush(stdout) == 0 ? 0 : fail("%s", "cannot write to stdout");
}

/* ---- calibrate ----------------------------------------------------------- */

struct calib_args {
    struct gw_calib_opts o;
    const char *out, *retention_out;
    int ratio_set;
};

static int calib_take(int opt, const char *arg, void *ctx)
{
    struct calib_args *a = ctx;
    int64_t v;
    switch (opt) {
    case OPT_MODEL:
        a->o.model_dir = arg;
        return 0;
    case OPT_METHOD:
        a->o.method = arg;
        return 0;
    case OPT_SAMPLES:
        a->o.samples_path = arg;
        return 0;
    case OPT_RETOUT:
        a->retention_out = arg;
        return 0;
    case 'o':
        a->out = arg;
        return 0;
    case OPT_RATIO:
        if (parse_f64(arg, &a->o.ratio) != 0 || !(a->o.ratio > 0.0 && a->o.ratio <= 1.0))
            return bad_value("--ratio", arg, "a number in (0, 1]");
        a->ratio_set = 1;
        return 0;
    case OPT_ALPHA:
        if (parse_f64(arg, &a->o.alpha) != 0 || a->o.alpha < 0.0)
            return bad_value("--alpha", arg, "a number >= 0");
        return 0;
    case OPT_HPG:
        if (parse_i64(arg, 1, PF_MAX_HEADS, &v) != 0)
            return bad_value("--heads-per-group", arg, "a positive integer");
        a->o.heads_per_group = (int)v;
        return 0;
    case OPT_GROUPING:
        if (pf_grouping_parse(arg, &a->o.grouping) != 0)
            return bad_value("--grouping", arg, "clustered or adjacent");
        return 0;
    case OPT_MAXTOK:
        if (parse_i64(arg, 1, 1 << 20, &v) != 0)
            return bad_value("--max-sample-tokens", arg, "an integer in [1, 1048576]");
        a->o.max_sample_tokens = (int)v;
        return 0;
    case OPT_THREADS:
        if (parse_i64(arg, 0, 1024, &v) != 0)
            return bad_value("--threads", arg, "an integer in [0, 1024]");
        a->o.n_threads = (int)v;
        return 0;
    default:
        return usage_error(current, "option not accepted here");
    }
}

static void calib_progress(void *ud, int done, int total, int n_tokens)
{
    (void)ud;
    fprintf(stderr, PROG " calibrate: sample %d/%d (%d tokens)\n", done, total,
            n_tokens);
}

static int cmd_calibrate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"method", required_argument, NULL, OPT_METHOD},
        {"ratio", required_argument, NULL, OPT_RATIO},
        {"samples", required_argument, NULL, OPT_SAMPLES},
        {"alpha", required_argument, NULL, OPT_ALPHA},
        {"heads-per-group", required_argument, NULL, OPT_HPG},
        {"grouping", required_argument, NULL, OPT_GROUPING},
        {"max-sample-tokens", required_argument, NULL, OPT_MAXTOK},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"retention-out", required_argument, NULL, OPT_RETOUT},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct calib_args a = {
        .o = {.method = "snapkv", .alpha = 2.0, .heads_per_group = 4,
              .grouping = PF_GROUPING_CLUSTERED, .max_sample_tokens = 4096,
              .progress = calib_progress},
    };
    int rc = parse_opts(argc, argv, opts, calib_take, &a);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (a.o.model_dir == NULL)
        return usage_error(current, "--model is required");
    if (a.o.samples_path == NULL)
        return usage_error(current, "--samples is required");
    if (!a.ratio_set)
        return usage_error(current, "--ratio is required");
    if (a.out == NULL)
        return usage_error(current, "-o OUT is required");
    char retpath[4096];
    if (a.retention_out == NULL) {
        size_t n = strlen(a.out);
        if (n > 5 && strcmp(a.out + n - 5, ".json") == 0)
            n -= 5;
        snprintf(retpath, sizeof(retpath), "%.*s.retention.json", (int)n, a.out);
        a.retention_out = retpath;
    }
    char err[1024];
    struct pf_retention r;
    struct pf_profile p;
    rc = gw_calibrate_files(&a.o, &r, &p, err, sizeof(err));
    if (rc != 0)
        return fail("calibrate: %s", err);
    rc = pf_retention_save(&r, a.retention_out, err, sizeof(err));
    if (rc == 0)
        rc = pf_profile_save(&p, a.out, err, sizeof(err));
    if (rc == 0)
        fprintf(stderr, PROG " calibrate: %d samples -> %s, %s\n", r.samples,
                a.retention_out, a.out);
    pf_retention_free(&r);
    pf_profile_free(&p);
    return rc != 0 ? fail("calibrate: %s", err) : 0;
}

/* ---- dispatch ------------------------------------------------------------ */

static const struct command commands[] = {
    {"build", cmd_build, "Build a profile from per-head retention samples.",
     PROG " build --retention FILE [--alpha A] --heads-per-group N "
          "[--grouping clustered|adjacent] -o OUT"},
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
     "paper's non-uniform compression, and write the retention file and the "
     "profile.",
     PROG " calibrate --model DIR --ratio r --samples FILE.jsonl "
          "[--method snapkv|keydiff|expected_attention] [--alpha 2] "
          "[--heads-per-group 4] [--grouping clustered|adjacent] "
          "[--max-sample-tokens 4096] [--retention-out FILE] -o OUT"},
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
