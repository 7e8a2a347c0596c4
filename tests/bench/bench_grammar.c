/*
 * bench_grammar.c — structured outputs: the time to compute one token mask
 * (common/grammar/gm_matcher.h) at the Qwen3 vocabulary (151,669 ids),
 * side by side with the brute-force mask over the whole vocabulary (the
 * test oracle), and the compile time of the grammars.
 *
 *   bench-grammar [--quick] [--steps N] [--tokenizer NAME]
 *
 * Cases: a nested JSON Schema (an order: objects four deep, arrays of
 * objects, enums, $ref, anyOf, oneOf, strings of bounded length), any
 * JSON value, any JSON object (OpenAI json_object), and Hermes tool calls
 * of two functions. For each: compile time (median of 3; --quick 1) with
 * the default threads (OpenMP) and with one, and sizes; then random walks
 * (random logits: tests/support/tt_grammar.h, bias 2 toward closing
 * tokens, a new walk when one finishes) for N steps (default 4000;
 * --quick 300), timing gm_matcher_fill_mask at every step in thread CPU
 * time (median, p90, p99, max, in microseconds: what the mask costs,
 * whatever else the machine runs) and in wall time (median, p99), and
 * gm_matcher_accept_token; every 25th step also runs
 * gm_matcher_fill_mask_naive (checking that the two masks are equal) and
 * prints its median and the ratio oracle / mask on those same steps
 * (CPU time). A second table compiles strings of growing maxLength (one
 * thread): the token-cache classes stop growing past the longest token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_grammar.h"

static const char NESTED[] =
    "{\"type\":\"json_schema\",\"schema\":{"
    "\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"string\",\"minLength\":8,\"maxLength\":16},"
    "\"customer\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":64},"
    "\"email\":{\"type\":\"string\"},"
    "\"billing\":{\"$ref\":\"#/$defs/address\"},"
    "\"shipping\":{\"anyOf\":[{\"$ref\":\"#/$defs/address\"},{\"type\":"
    "\"null\"}]}},"
    "\"required\":[\"name\",\"email\",\"billing\"],"
    "\"additionalProperties\":false},"
    "\"items\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":20,\"items\":{"
    "\"type\":\"object\",\"properties\":{"
    "\"sku\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":12},"
    "\"quantity\":{\"type\":\"integer\"},"
    "\"price\":{\"type\":\"number\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"gift\",\"fragile\","
    "\"bulk\",\"digital\"]},\"maxItems\":4}},"
    "\"required\":[\"sku\",\"quantity\",\"price\"],"
    "\"additionalProperties\":false}},"
    "\"status\":{\"enum\":[\"pending\",\"paid\",\"shipped\",\"cancelled\"]},"
    "\"payment\":{\"oneOf\":["
    "{\"type\":\"object\",\"properties\":{\"method\":{\"const\":\"card\"},"
    "\"last4\":{\"type\":\"string\",\"minLength\":4,\"maxLength\":4}},"
    "\"required\":[\"method\",\"last4\"],\"additionalProperties\":false},"
    "{\"type\":\"object\",\"properties\":{\"method\":{\"const\":\"invoice\"},"
    "\"due_days\":{\"type\":\"integer\"}},"
    "\"required\":[\"method\"],\"additionalProperties\":false}]},"
    "\"notes\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},"
    "\"required\":[\"id\",\"customer\",\"items\",\"status\",\"payment\"],"
    "\"additionalProperties\":false,"
    "\"$defs\":{\"address\":{\"type\":\"object\",\"properties\":{"
    "\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"minLength\":5,\"maxLength\":10},"
    "\"country\":{\"enum\":[\"US\",\"DE\",\"FR\",\"JP\",\"CN\"]}},"
    "\"required\":[\"street\",\"city\",\"country\"],"
    "\"additionalProperties\":false}}}}";

static const char TOOLS[] =
    "{\"type\":\"tool_calls\",\"format\":\"hermes\",\"min_calls\":1,"
    "\"max_calls\":0,\"tools\":["
    "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"location\":{\"type\":\"string\"},\"unit\":{\"enum\":["
    "\"celsius\",\"fahrenheit\"]}},\"required\":[\"location\"],"
    "\"additionalProperties\":false}},"
    "{\"name\":\"search\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"query\":{\"type\":\"string\"},\"top_k\":{\"type\":\"integer\"}},"
    "\"required\":[\"query\"]}}]}";

static const struct {
    const char *name;
    const char *spec;
} cases[] = {
    {"nested-schema", NESTED},
    {"free-json", "{\"type\":\"json_value\"}"},
    {"json-object", "{\"type\":\"json_object\"}"},
    {"tool-calls", TOOLS},
};

/* Seconds of CPU time of the calling thread. */
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

/* The q-quantile (0..1) of sorted v[0..n), nearest rank. */
static double quantile(const double *v, int n, double q)
{
    int i = (int)(q * n + 0.999999) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

int main(int argc, char **argv)
{
    int quick = 0, steps = 0;
    struct tt_bench_opt opts[] = {{"--steps", 10, 10000000, &steps}};
    const char *tokenizer = "qwen3";
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
            tokenizer = argv[i + 1];
            memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 2) * sizeof(*argv));
            argc -= 2;
            i--;
        }
    if (tt_bench_args("bench-grammar", argc, argv, &quick, opts, 1,
                      "[--quick] [--steps N] [--tokenizer NAME]") != 0)
        return 2;
    if (steps == 0)
        steps = quick ? 300 : 4000;
    int reps = quick ? 1 : 3;
    const int oracle_every = 25;

    struct gm_vocab v;
    double t0 = tt_now_s();
    if (tt_grammar_vocab(tokenizer, &v) != 0)
        return 1;
    double t_vocab = tt_now_s() - t0;
    size_t W = gm_vocab_mask_words(&v);
    uint32_t *mask = tt_bench_malloc("bench-grammar", W * sizeof(*mask));
    uint32_t *oracle = tt_bench_malloc("bench-grammar", W * sizeof(*oracle));
    double *t_mask = tt_bench_malloc("bench-grammar", (size_t)steps * sizeof(double));
    double *t_wall = tt_bench_malloc("bench-grammar", (size_t)steps * sizeof(double));
    double *t_acc = tt_bench_malloc("bench-grammar", (size_t)steps * sizeof(double));
    double *t_fast = tt_bench_malloc("bench-grammar", (size_t)steps * sizeof(double));
    double *t_slow = tt_bench_malloc("bench-grammar", (size_t)steps * sizeof(double));
    struct tt_gsampler smp;
    if (tt_gsampler_init(&smp, &v) != 0) {
        fprintf(stderr, "bench-grammar: out of memory\n");
        return 1;
    }
    printf("# bench-grammar: %s vocabulary, %d ids, %d trie nodes, longest "
           "token %d bytes (tokenizer + vocabulary loaded in %.0f ms)\n",
           tokenizer, (int)v.n_ids, (int)v.n_node, v.max_len, t_vocab * 1e3);
    printf("# compile: ms of wall time, all threads / one thread; mask = "
           "gm_matcher_fill_mask per decode step of random walks (%d steps),\n"
           "# microseconds of thread CPU time (cpu) and of wall time (wall); "
           "acc = gm_matcher_accept_token (cpu);\n# oracle = brute force over "
           "the vocabulary on every %dth step (cpu ms), x = oracle / mask on "
           "those steps.\n",
           steps, oracle_every);
    printf("%-13s %8s %8s %6s %7s %7s | %7s %7s %7s %7s | %7s %7s | %6s | "
           "%9s %6s\n",
           "case", "compile", "comp1T", "nodes", "classes", "cacheKB",
           "cpu_med", "cpu_p90", "cpu_p99", "cpu_max", "wall_md", "wall99",
           "acc", "oracle_ms", "x");
    int rc = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases && rc == 0; c++) {
        double tc[3];
        struct gm_grammar *g = NULL;
        char err[512];
        for (int r = 0; r < reps; r++) {
            gm_grammar_unref(g);
            double a = tt_now_s();
            if (gm_spec_compile(cases[c].spec, strlen(cases[c].spec), &v, NULL,
                                &g, err, sizeof err) != 0) {
                fprintf(stderr, "bench-grammar: %s: %s\n", cases[c].name, err);
                return 1;
            }
            tc[r] = tt_now_s() - a;
        }
        double compile_ms = tt_median(tc, reps) * 1e3;
        struct gm_limits one;
        gm_limits_default(&one);
        one.threads = 1;
        for (int r = 0; r < reps; r++) {
            struct gm_grammar *g1 = NULL;
            double a = tt_now_s();
            if (gm_spec_compile(cases[c].spec, strlen(cases[c].spec), &v, &one,
                                &g1, err, sizeof err) != 0) {
                fprintf(stderr, "bench-grammar: %s: %s\n", cases[c].name, err);
                return 1;
            }
            tc[r] = tt_now_s() - a;
            gm_grammar_unref(g1);
        }
        double compile1_ms = tt_median(tc, reps) * 1e3;
        const struct gm_grammar_stats *st = gm_grammar_stats(g);
        struct gm_matcher m;
        struct tt_xrng rng = {0x5eed + c};
        gm_matcher_init(&m, g);
        int n_oracle = 0, walks = 1;
        for (int i = 0; i < steps; i++) {
            double aw = tt_now_s(), a = cpu_now();
            gm_matcher_fill_mask(&m, mask, W);
            t_mask[i] = (cpu_now() - a) * 1e6;
            t_wall[i] = (tt_now_s() - aw) * 1e6;
            if (i % oracle_every == 0) {
                double b = cpu_now();
                gm_matcher_fill_mask_naive(&m, oracle, W);
                t_slow[n_oracle] = (cpu_now() - b) * 1e6;
                t_fast[n_oracle++] = t_mask[i];
                if (memcmp(mask, oracle, W * sizeof(*mask)) != 0) {
                    fprintf(stderr, "bench-grammar: %s: mask differs from "
                                    "the oracle at step %d\n",
                            cases[c].name, i);
                    rc = 1;
                    break;
                }
            }
            int32_t id = tt_gsampler_pick(&smp, mask, 2.0, &rng);
            double b = cpu_now();
            int arc = gm_matcher_accept_token(&m, id);
            t_acc[i] = (cpu_now() - b) * 1e6;
            if (id < 0 || arc != 0) {
                fprintf(stderr, "bench-grammar: %s: token %d not accepted\n",
                        cases[c].name, (int)id);
                rc = 1;
                break;
            }
            if (gm_matcher_is_finished(&m)) {
                gm_matcher_reset(&m);
                walks++;
            }
        }
        gm_matcher_free(&m);
        if (rc != 0)
            break;
        qsort(t_mask, (size_t)steps, sizeof(double), cmp_double);
        qsort(t_wall, (size_t)steps, sizeof(double), cmp_double);
        qsort(t_acc, (size_t)steps, sizeof(double), cmp_double);
        double fast = tt_median(t_fast, n_oracle);
        double slow = tt_median(t_slow, n_oracle);
        printf("%-13s %8.1f %8.1f %6d %7d %7zu | %7.2f %7.2f %7.2f %7.2f | "
               "%7.2f %7.2f | %6.2f | %9.2f %6.0f\n",
               cases[c].name, compile_ms, compile1_ms, (int)st->n_nodes,
               (int)st->n_classes, st->bytes / 1024,
               quantile(t_mask, steps, 0.5), quantile(t_mask, steps, 0.9),
               quantile(t_mask, steps, 0.99), t_mask[steps - 1],
               quantile(t_wall, steps, 0.5), quantile(t_wall, steps, 0.99),
               quantile(t_acc, steps, 0.5), slow / 1e3,
               slow / (fast > 0 ? fast : 1e-3));
        printf("#   %s: %d walks; compile stages ms: ir %.2f automaton %.2f "
               "classes %.2f caches %.2f\n",
               cases[c].name, walks, st->t_ir_s * 1e3, st->t_pda_s * 1e3,
               st->t_sig_s * 1e3, st->t_cache_s * 1e3);
        gm_grammar_unref(g);
    }
    static const int lens[] = {0, 16, 128, 1000};
    printf("\n%-22s %9s %6s %7s %9s\n", "string schema", "comp1T_ms", "nodes",
           "classes", "walks_ms");
    for (size_t i = 0; i < sizeof lens / sizeof *lens && rc == 0; i++) {
        char spec[160];
        if (lens[i] == 0)
            snprintf(spec, sizeof spec,
                     "{\"type\":\"json_schema\",\"schema\":{\"type\":"
                     "\"string\"}}");
        else
            snprintf(spec, sizeof spec,
                     "{\"type\":\"json_schema\",\"schema\":{\"type\":"
                     "\"string\",\"maxLength\":%d}}",
                     lens[i]);
        struct gm_limits one;
        gm_limits_default(&one);
        one.threads = 1;
        struct gm_grammar *g = NULL;
        char err[512];
        double a = tt_now_s();
        if (gm_spec_compile(spec, strlen(spec), &v, &one, &g, err,
                            sizeof err) != 0) {
            fprintf(stderr, "bench-grammar: %s\n", err);
            rc = 1;
            break;
        }
        double t = tt_now_s() - a;
        const struct gm_grammar_stats *st = gm_grammar_stats(g);
        char name[32];
        snprintf(name, sizeof name, lens[i] ? "maxLength %d" : "no maxLength",
                 lens[i]);
        printf("%-22s %9.1f %6d %7d %9.1f\n", name, t * 1e3, (int)st->n_nodes,
               (int)st->n_classes, st->t_cache_s * 1e3);
        gm_grammar_unref(g);
    }
    tt_gsampler_free(&smp);
    free(mask);
    free(oracle);
    free(t_mask);
    free(t_wall);
    free(t_acc);
    free(t_fast);
    free(t_slow);
    gm_vocab_free(&v);
    return rc;
}
