/*
 * bench_grammar_pattern.c — structured outputs with patterns, formats and
 * the other constraint kinds (common/grammar/gm_regex.h, gm_format.h,
 * gm_gbnf.h): compile time and the time of one token mask at the Qwen3
 * vocabulary (151,669 ids).
 *
 *   bench-grammar-pattern [--quick] [--steps N]
 *
 * Cases: a JSON string of zod's .email() pattern (lookaheads); an object
 * of ten format-typed strings (date-time, date, time, duration, email,
 * uuid, ipv4, ipv6, hostname, uri); an object of eight patterns users
 * write (phone, zip, slug, colour, password with lookaheads, semver,
 * currency, username); patterns with maxLength (a name of at most 256
 * characters, an email of at most 254); a raw regex spec (vLLM's
 * `regex`), a choice of 50 strings, and llama.cpp's JSON grammar as GBNF.
 * The object cases are built as IR the way the schema compiler will
 * (compact JSON, properties in order), the others as specs.
 * For each: the time to write the IR (patterns to DFAs to IR, wall ms),
 * the whole compile with one thread (median of 3; --quick 1) and its
 * automaton size; then random walks (random logits biased toward closing
 * tokens, tests/support/tt_grammar.h) for N steps (default 2000; --quick
 * 200) timing gm_matcher_fill_mask in thread CPU time (median, p99, max,
 * microseconds), with the brute-force mask compared on every 50th step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/grammar/gm_format.h"
#include "common/grammar/gm_json.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_regex.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_grammar.h"

#define ZOD_EMAIL                                                            \
    "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9]" \
    "[A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"

/* One property: a pattern or a format, with lengths. */
struct prop {
    const char *key;
    const char *pattern; /* NULL: format */
    const char *format;
    uint32_t lo, hi;
};

static const struct prop email_props[] = {
    {"email", ZOD_EMAIL, NULL, 0, GM_REPEAT_INF}};
/* What z.email() really writes: the pattern and "format": "email", both
 * enforced (their intersection). */
static const struct prop email_fmt_props[] = {
    {"email", ZOD_EMAIL, "email", 0, GM_REPEAT_INF}};
static const struct prop format_props[] = {
    {"created", NULL, "date-time", 0, GM_REPEAT_INF},
    {"day", NULL, "date", 0, GM_REPEAT_INF},
    {"at", NULL, "time", 0, GM_REPEAT_INF},
    {"ttl", NULL, "duration", 0, GM_REPEAT_INF},
    {"email", NULL, "email", 0, GM_REPEAT_INF},
    {"id", NULL, "uuid", 0, GM_REPEAT_INF},
    {"ip", NULL, "ipv4", 0, GM_REPEAT_INF},
    {"ip6", NULL, "ipv6", 0, GM_REPEAT_INF},
    {"host", NULL, "hostname", 0, GM_REPEAT_INF},
    {"url", NULL, "uri", 0, GM_REPEAT_INF},
};
static const struct prop pattern_props[] = {
    {"phone", "^\\+?[1-9]\\d{1,14}$", NULL, 0, GM_REPEAT_INF},
    {"zip", "^\\d{5}(-\\d{4})?$", NULL, 0, GM_REPEAT_INF},
    {"slug", "^[a-z0-9]+(?:-[a-z0-9]+)*$", NULL, 0, GM_REPEAT_INF},
    {"color", "^#[0-9a-fA-F]{6}$", NULL, 0, GM_REPEAT_INF},
    {"password", "^(?=.*[A-Z])(?=.*[a-z])(?=.*\\d).{8,64}$", NULL, 0,
     GM_REPEAT_INF},
    {"version", "^\\d+\\.\\d+\\.\\d+(-[0-9A-Za-z.-]+)?$", NULL, 0,
     GM_REPEAT_INF},
    {"currency", "^[A-Z]{3}$", NULL, 0, GM_REPEAT_INF},
    {"user", "^[A-Za-z][A-Za-z0-9_]{2,15}$", NULL, 0, GM_REPEAT_INF},
};
static const struct prop length_props[] = {
    {"name", "^[A-Za-z][A-Za-z .'-]*$", NULL, 1, 256},
    {"email", NULL, "email", 3, 254},
};

static const struct {
    const char *name;
    const struct prop *props;
    size_t n;
} objects[] = {
    {"zod-email", email_props, 1},
    {"zod-email+format", email_fmt_props, 1},
    {"formats-10", format_props, sizeof format_props / sizeof *format_props},
    {"patterns-8", pattern_props, sizeof pattern_props / sizeof *pattern_props},
    {"maxLength", length_props, sizeof length_props / sizeof *length_props},
};

/* {"k1":v1,"k2":v2,...} (compact), every value a string of its
 * condition. Returns 0 or prints why not. */
static int object_ir(struct gm_ir *ir, const struct prop *p, size_t n)
{
    struct gm_json j;
    gm_json_init(&j, ir, GM_WS_NONE, -1);
    int32_t *parts = calloc(2 * n + 2, sizeof(*parts));
    size_t k = 0;
    parts[k++] = gm_ir_str(ir, "{");
    for (size_t i = 0; i < n; i++) {
        char err[300];
        int32_t r;
        if (p[i].pattern != NULL && p[i].format != NULL) {
            struct gm_rx_item it[2] = {{.text = p[i].pattern,
                                        .len = strlen(p[i].pattern),
                                        .kind = GM_RX_SEARCH}};
            if (gm_format_item(p[i].format, strlen(p[i].format), &it[1]) != 0)
                r = TG_ENOTFOUND;
            else
                r = gm_regex_json_string_items(ir, it, 2, p[i].lo, p[i].hi, err,
                                               sizeof err);
        } else if (p[i].pattern != NULL)
            r = gm_regex_json_string(ir, p[i].pattern, strlen(p[i].pattern),
                                     p[i].lo, p[i].hi, err, sizeof err);
        else
            r = gm_format_json_string(ir, p[i].format, strlen(p[i].format),
                                      p[i].lo, p[i].hi, err, sizeof err);
        if (r < 0) {
            fprintf(stderr, "bench-grammar-pattern: %s: %s\n", p[i].key, err);
            free(parts);
            return -1;
        }
        char key[64];
        snprintf(key, sizeof key, "%s\"%s\":", i ? "," : "", p[i].key);
        parts[k++] = gm_ir_seq2(ir, gm_ir_str(ir, key), gm_ir_ref(ir, r));
    }
    parts[k++] = gm_ir_str(ir, "}");
    int32_t obj = gm_ir_rule(ir, "object");
    gm_ir_rule_define(ir, obj, gm_ir_seq(ir, parts, k));
    free(parts);
    if (gm_json_document(&j, obj) != 0) {
        char err[300];
        gm_ir_error(ir, err, sizeof err);
        fprintf(stderr, "bench-grammar-pattern: %s\n", err);
        return -1;
    }
    return 0;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *v, int n, double q)
{
    int i = (int)(q * n + 0.999999) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* Compiles case c (an object index, or -1 - spec index) once: the
 * grammar, the IR time in *ir_s. */
static struct gm_grammar *compile_case(int c, const char *spec,
                                       const struct gm_vocab *v, double *ir_s)
{
    struct gm_limits one;
    gm_limits_default(&one);
    one.threads = 1;
    struct gm_grammar *g = NULL;
    char err[512];
    if (spec != NULL) {
        if (gm_spec_compile(spec, strlen(spec), v, &one, &g, err, sizeof err) !=
            0) {
            fprintf(stderr, "bench-grammar-pattern: %s\n", err);
            return NULL;
        }
        *ir_s = gm_grammar_stats(g)->t_ir_s;
        return g;
    }
    struct gm_ir ir;
    gm_ir_init(&ir, one.max_exprs);
    double a = tt_now_s();
    if (object_ir(&ir, objects[c].props, objects[c].n) != 0) {
        gm_ir_free(&ir);
        return NULL;
    }
    *ir_s = tt_now_s() - a;
    if (gm_grammar_compile_ir(&ir, v, &one, &g, err, sizeof err) != 0)
        fprintf(stderr, "bench-grammar-pattern: %s\n", err);
    gm_ir_free(&ir);
    return g;
}

int main(int argc, char **argv)
{
    int quick = 0, steps = 0;
    struct tt_bench_opt opts[] = {{"--steps", 10, 10000000, &steps}};
    if (tt_bench_args("bench-grammar-pattern", argc, argv, &quick, opts, 1,
                      "[--quick] [--steps N]") != 0)
        return 2;
    if (steps == 0)
        steps = quick ? 200 : 2000;
    int reps = quick ? 1 : 3;
    const int oracle_every = 50;
    struct gm_vocab v;
    if (tt_grammar_vocab("qwen3", &v) != 0)
        return 1;
    /* the spec cases */
    char choices[2048] = "{\"type\":\"choice\",\"choices\":[";
    for (int i = 0; i < 50; i++) {
        size_t l = strlen(choices);
        snprintf(choices + l, sizeof choices - l, "%s\"category %02d: %s\"",
                 i ? "," : "", i, i % 2 ? "electronics" : "home & garden");
    }
    strcat(choices, "]}");
    static const char gbnf[] =
        "root ::= object\n"
        "value ::= object | array | string | number | (\"true\" | \"false\" "
        "| \"null\") ws\n"
        "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" "
        "ws value)* )? \"}\" ws\n"
        "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
        "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" "
        "([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
        "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? "
        "([eE] [-+]? [0-9]+)? ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";
    char *gspec = NULL, *rspec = NULL;
    size_t gl, rl;
    const char *rx =
        "(\\+1 )?\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}( ext\\. \\d{1,5})?";
    if (gm_spec_grammar(gbnf, strlen(gbnf), &gspec, &gl) != 0 ||
        gm_spec_regex(rx, strlen(rx), &rspec, &rl) != 0)
        return 1;
    const struct {
        const char *name, *spec;
    } specs[] = {
        {"regex-spec", rspec}, {"choice-50", choices}, {"gbnf-json", gspec}};
    size_t n_cases = sizeof objects / sizeof *objects +
                     sizeof specs / sizeof *specs;

    size_t W = gm_vocab_mask_words(&v);
    uint32_t *mask = tt_bench_malloc("bench-grammar-pattern",
                                     W * sizeof(*mask));
    uint32_t *oracle = tt_bench_malloc("bench-grammar-pattern",
                                       W * sizeof(*oracle));
    double *t_mask = tt_bench_malloc("bench-grammar-pattern",
                                     (size_t)steps * sizeof(double));
    struct tt_gsampler smp;
    if (tt_gsampler_init(&smp, &v) != 0)
        return 1;
    printf("# bench-grammar-pattern: qwen3 vocabulary, %d ids; compile with "
           "one thread (median of %d), ms of wall time; mask = "
           "gm_matcher_fill_mask per decode step of random walks (%d "
           "steps), us of thread CPU time; oracle = brute force, every %dth "
           "step\n",
           (int)v.n_ids, reps, steps, oracle_every);
    printf("%-12s %8s %9s %7s %7s %8s | %7s %7s %7s | %9s\n", "case", "ir_ms",
           "comp1T_ms", "nodes", "classes", "cacheKB", "cpu_med", "cpu_p99",
           "cpu_max", "oracle_ms");
    int rc = 0;
    for (size_t c = 0; c < n_cases && rc == 0; c++) {
        int is_obj = c < sizeof objects / sizeof *objects;
        const char *name =
            is_obj ? objects[c].name
                   : specs[c - sizeof objects / sizeof *objects].name;
        const char *spec =
            is_obj ? NULL : specs[c - sizeof objects / sizeof *objects].spec;
        double tc[3], ti[3];
        struct gm_grammar *g = NULL;
        for (int r = 0; r < reps; r++) {
            gm_grammar_unref(g);
            double a = tt_now_s();
            g = compile_case((int)c, spec, &v, &ti[r]);
            tc[r] = tt_now_s() - a;
            if (g == NULL)
                return 1;
        }
        const struct gm_grammar_stats *st = gm_grammar_stats(g);
        struct gm_matcher m;
        struct tt_xrng rng = {0x5eed + c};
        gm_matcher_init(&m, g);
        double slow = 0;
        int n_oracle = 0;
        for (int i = 0; i < steps; i++) {
            double a = cpu_now();
            if (gm_matcher_fill_mask(&m, mask, W) != 0) {
                fprintf(stderr, "bench-grammar-pattern: %s: mask failed\n",
                        name);
                rc = 1;
                break;
            }
            t_mask[i] = (cpu_now() - a) * 1e6;
            if (i % oracle_every == 0) {
                double b = cpu_now();
                gm_matcher_fill_mask_naive(&m, oracle, W);
                slow += cpu_now() - b;
                n_oracle++;
                if (memcmp(mask, oracle, W * sizeof(*mask)) != 0) {
                    fprintf(stderr,
                            "bench-grammar-pattern: %s: mask differs "
                            "from the oracle at step %d\n",
                            name, i);
                    rc = 1;
                    break;
                }
            }
            int32_t id = tt_gsampler_pick(&smp, mask, 2.0, &rng);
            if (id < 0 || gm_matcher_accept_token(&m, id) != 0) {
                fprintf(stderr, "bench-grammar-pattern: %s: token %d\n", name,
                        (int)id);
                rc = 1;
                break;
            }
            if (gm_matcher_is_finished(&m))
                gm_matcher_reset(&m);
        }
        gm_matcher_free(&m);
        qsort(t_mask, (size_t)steps, sizeof(double), cmp_double);
        printf("%-12s %8.2f %9.1f %7d %7d %8zu | %7.2f %7.2f %7.2f | %9.2f\n",
               name, tt_median(ti, reps) * 1e3, tt_median(tc, reps) * 1e3,
               (int)st->n_nodes, (int)st->n_classes, st->bytes / 1024,
               quantile(t_mask, steps, 0.5), quantile(t_mask, steps, 0.99),
               t_mask[steps - 1], n_oracle ? slow / n_oracle * 1e3 : 0.0);
        gm_grammar_unref(g);
    }
    tt_gsampler_free(&smp);
    free(mask);
    free(oracle);
    free(t_mask);
    free(gspec);
    free(rspec);
    gm_vocab_free(&v);
    return rc;
}
