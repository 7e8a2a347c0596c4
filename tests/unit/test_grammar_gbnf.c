/* test_grammar_gbnf.c — GBNF grammars (common/grammar/gm_gbnf.h) and the
 * spec kinds regex, choice and grammar (gm_spec.h):
 * - grammars as users write them (llama.cpp's JSON and arithmetic
 *   grammars, lists, classes with ranges, negation, UTF-8 and escapes,
 *   `.`, every repetition, comments, alternatives over several lines)
 *   accept and refuse sample texts;
 * - random regular GBNF grammars (several rules, groups, classes,
 *   quantifiers) rendered also as PCRE2 patterns: on random strings the
 *   grammar accepts exactly what PCRE2 matches as a whole;
 * - refusals name the line and column or the rules (left recursion names
 *   its cycle);
 * - the spec kinds compile, gm_spec_check refuses bad ones with the
 *   reason, and over the real Qwen3 vocabulary the fast masks of a choice,
 *   a regex and a GBNF grammar equal the brute-force oracle's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/grammar/gm_gbnf.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_grammar.h"

#if defined(__SANITIZE_ADDRESS__)
#define N_RANDOM 60
#define MASK_STEPS 4
#else
#define N_RANDOM 500
#define MASK_STEPS 20
#endif

static struct gm_vocab bytes_vocab, qwen;

static int setup(void **state)
{
    (void)state;
    static const char *const pieces[] = {"ab", "\xce\xb1", "\":", "{\""};
    return tt_grammar_byte_vocab(&bytes_vocab, pieces, 4) != 0 ||
                   tt_grammar_vocab("qwen3", &qwen) != 0
               ? -1
               : 0;
}

static int teardown(void **state)
{
    (void)state;
    gm_vocab_free(&bytes_vocab);
    gm_vocab_free(&qwen);
    return 0;
}

/* The grammar of a GBNF text over a vocabulary, or NULL with err set. */
static struct gm_grammar *gbnf(const char *text, const struct gm_vocab *v,
                               char *err, size_t errlen, int *code)
{
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    int32_t root = gm_gbnf_compile(&ir, text, strlen(text), err, errlen);
    struct gm_grammar *g = NULL;
    *code = root < 0 ? root : 0;
    if (root >= 0 && gm_ir_root_set(&ir, root) == 0) {
        struct gm_limits lim;
        tt_grammar_limits(&lim);
        *code = gm_grammar_compile_ir(&ir, v, &lim, &g, err, errlen);
    }
    gm_ir_free(&ir);
    return g;
}

static int accepts(struct gm_grammar *g, const char *s, size_t n)
{
    struct gm_matcher m;
    assert_int_equal(gm_matcher_init(&m, g), 0);
    int ok = gm_matcher_accept_bytes(&m, s, n) == 0 && gm_matcher_can_end(&m);
    gm_matcher_free(&m);
    return ok;
}

static void expect(const char *grammar, const char *const *yes,
                   const char *const *no)
{
    char err[300];
    int code;
    struct gm_grammar *g = gbnf(grammar, &bytes_vocab, err, sizeof err, &code);
    if (g == NULL)
        fail_msg("%s\n%s", grammar, err);
    for (; yes != NULL && *yes != NULL; yes++)
        if (!accepts(g, *yes, strlen(*yes)))
            fail_msg("%s\nrefuses %s", grammar, *yes);
    for (; no != NULL && *no != NULL; no++)
        if (accepts(g, *no, strlen(*no)))
            fail_msg("%s\naccepts %s", grammar, *no);
    gm_grammar_unref(g);
}

static const char JSON_GBNF[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | "
    "\"null\") ws\n"
    "\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? "
    "([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "\n"
    "# Optional space: by convention, applied in this grammar after literal "
    "chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_grammars_users_write(void **state)
{
    (void)state;
    expect(
        JSON_GBNF,
        (const char *const[]){"{}", "{\"a\": [1, 2.5, \"x\\n\"], \"b\": null}",
                              "{\"\xc3\xa9\": {\"k\": [true, false]}}", NULL},
        (const char *const[]){"[]", "{a: 1}", "{\"a\" 1}", "{\"\x01\": 1}",
                              NULL});
    expect(
        "root ::= expr\n"
        "expr ::= term ([-+*/] term)*\n"
        "term ::= num | \"(\" space expr \")\" space\n"
        "num  ::= [0-9]+ space\n"
        "space ::= \" \"?\n",
        (const char *const[]){"1+2", "(1+2)*3", "( 1 +2 ) *3", "((4))", NULL},
        (const char *const[]){"1+", "(1", "a", NULL});
    /* the escapes, UTF-8 and negated classes, `.`, counted repetition */
    expect("root ::= \"\\x41\\u00e9\\U0001F600\\t\" [\xce\xb1-\xcf\x89]{2} "
           "[^a-z\\n] . \"\\\\\\\"\\[\\]\"{1,2}",
           (const char *const[]){"A\xc3\xa9\xf0\x9f\x98\x80\t\xce\xb1\xcf\x89"
                                 "Z\xe6\x97\xa5\\\"[]",
                                 "A\xc3\xa9\xf0\x9f\x98\x80\t\xce\xb2\xce\xb3"
                                 "\xc3\xa9"
                                 "x\\\"[]\\\"[]",
                                 NULL},
           (const char *const[]){"A\xc3\xa9\xf0\x9f\x98\x80\t\xce\xb1\xcf\x89"
                                 "zx\\\"[]",
                                 "A\xc3\xa9\xf0\x9f\x98\x80\t\xce\xb1\xcf\x89"
                                 "\nx\\\"[]",
                                 NULL});
    /* alternatives over lines, comments, names with - and _, {m,} */
    expect("# a list\n"
           "root ::= item-list   # the start\n"
           "item-list ::= item (\", \" item)*\n"
           "item ::= \"apple\"\n"
           "       | \"pear\" |\n"
           "         digit_s\n"
           "digit_s ::= [0-9]{2,}\n",
           (const char *const[]){"apple", "pear, 12, apple", "123456", NULL},
           (const char *const[]){"1", "apple,pear", "", NULL});
    /* an empty alternative, the empty class, [^] */
    expect("root ::= (\"x\" | ) [] | \"y\" ([^] | \"\")",
           (const char *const[]){"y", "yz", "y\n", NULL},
           (const char *const[]){"x", "", NULL});
}

static void refused(const char *text, int code, const char *needle)
{
    char err[300] = "";
    int got;
    struct gm_grammar *g = gbnf(text, &bytes_vocab, err, sizeof err, &got);
    gm_grammar_unref(g);
    if (got != code || strstr(err, needle) == NULL)
        fail_msg("%s: want %s with \"%s\", got %s: %s", text, tg_err_name(code),
                 needle, tg_err_name(got), err);
}

static void test_refusals(void **state)
{
    (void)state;
    refused("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]",
            TG_EINVAL, "rule expr is left-recursive (expr -> expr");
    refused("root ::= a\na ::= b? c\nb ::= \"x\"\nc ::= d | \"y\"\nd ::= a "
            "\"z\"",
            TG_EINVAL, "a -> c -> d -> a");
    refused("root ::= item\n", TG_EINVAL,
            "rule item is used but never defined at line 1 column 10");
    refused("start ::= \"a\"", TG_EINVAL, "no rule named root");
    refused("root ::= \"a\"\nroot ::= \"b\"", TG_EINVAL,
            "root is defined twice at line 2 column 1");
    refused("root ::= \"a\\q\"", TG_EFORMAT, "unknown escape \\q");
    refused("root ::= \"abc", TG_EFORMAT, "unterminated string");
    refused("root ::= [z-a]", TG_EFORMAT, "range out of order");
    refused("root ::= [abc", TG_EFORMAT, "unterminated character class");
    refused("root ::= \"a\"{3,2}", TG_EFORMAT, "n < m");
    refused("root ::= \"a\"{x}", TG_EFORMAT, "expecting a count");
    refused("root ::= \"a\"{99999}", TG_ETOOBIG, "over the limit");
    refused("root ::= (\"a\"", TG_EFORMAT, "missing )");
    refused("root ::= \"a\")", TG_EFORMAT, "unmatched )");
    refused("root = \"a\"", TG_EFORMAT, "expecting ::=");
    refused("root ::= \"\\uD800\"", TG_EFORMAT, "surrogate");
    refused("root ::= \"a\" @", TG_EFORMAT,
            "unexpected '@' at line 1 column 14");
    refused("root ::= \"\xff\"", TG_EFORMAT, "not UTF-8");
    refused("root ::= [^\\x00-\\U0010FFFF]", TG_EINVAL, "no document");
    char deep[600];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "root ::= ");
    for (int i = 0; i < 250; i++)
        deep[k++] = '(';
    deep[k] = '\0';
    refused(deep, TG_ETOOBIG, "nested more than 200");
}

/* ---- random regular grammars against PCRE2 ------------------------------- */

struct two {
    char g[16384], p[16384]; /* GBNF, PCRE2 */
    size_t ng, np;
};

static void put2(struct two *x, const char *g, const char *p)
{
    size_t a = strlen(g), b = strlen(p);
    assert_true(x->ng + a < sizeof x->g && x->np + b < sizeof x->p);
    memcpy(x->g + x->ng, g, a + 1);
    memcpy(x->p + x->np, p, b + 1);
    x->ng += a;
    x->np += b;
}

static const char *const atoms[][2] = {
    {"\"a\"", "a"},
    {"\"bc\"", "bc"},
    {"[a-c]", "[a-c]"},
    {"[^a\\n]", "[^a\\n]"},
    {"\".\"", "\\."},
    {"\"\\\\\"", "\\\\"},
    {"\"\\n\"", "\\n"},
    {"\"\\x41\"", "A"},
    {"\"\\u00e9\"", "\\x{e9}"},
    {"[\\u00e0-\\u00ff]", "[\\x{e0}-\\x{ff}]"},
    {".", "(?s:.)"},
    {"\"\xce\xb1\"", "\xce\xb1"},
    {"\"\"", ""},
    {"[0-9]", "[0-9]"},
};

/* Inside a repeated group everything reads at least one character
 * (`nonnull`): PCRE2's backtracking explodes on repeated groups that may
 * match the empty string, which the grammar handles like any other. */
static void gen_alt(struct two *x, struct tt_xrng *r, int depth, int rules,
                    int self, int nonnull);

static void gen_item(struct two *x, struct tt_xrng *r, int depth, int rules,
                     int self, int nonnull)
{
    int k = tt_xrng_int(r, 0, depth < 2 ? 5 : 3);
    static const char *const q[] = {"+", "{2}", "{1,}", "*", "?", "{0,2}"};
    const char *qs = NULL;
    if (tt_xrng_int(r, 0, 3) == 0)
        qs = q[tt_xrng_int(r, 0, nonnull ? 2 : (int)TT_COUNT(q) - 1)];
    if (k == 3 && (nonnull || qs != NULL))
        k = 0;
    if (k <= 2) {
        int i = tt_xrng_int(r, 0, (int)TT_COUNT(atoms) - 1);
        if (nonnull && atoms[i][1][0] == '\0')
            i = 0;
        put2(x, atoms[i][0], "(?:");
        put2(x, "", atoms[i][1]);
        put2(x, "", ")");
    } else if (k == 3 && self + 1 < rules) {
        /* a later rule (no recursion): in PCRE2 its pattern is a named
         * group called by (?&rN) */
        char g[16], p[24];
        int to = tt_xrng_int(r, self + 1, rules - 1);
        snprintf(g, sizeof g, "r%d", to);
        snprintf(p, sizeof p, "(?&r%d)", to);
        put2(x, g, p);
    } else {
        put2(x, "(", "(?:");
        gen_alt(x, r, depth + 1, rules, self, nonnull || qs != NULL);
        put2(x, ")", ")");
    }
    if (qs != NULL)
        put2(x, qs, qs);
}

static void gen_alt(struct two *x, struct tt_xrng *r, int depth, int rules,
                    int self, int nonnull)
{
    int n = tt_xrng_int(r, 1, 3);
    for (int i = 0; i < n; i++) {
        if (i > 0)
            put2(x, " | ", "|");
        int m = tt_xrng_int(r, nonnull, 3);
        for (int j = 0; j < m; j++) {
            if (j > 0)
                put2(x, " ", "");
            gen_item(x, r, depth, rules, self, nonnull);
        }
    }
}

static const char *const strs[] = {"a", "b",        "c",        ".", "\\", "\n",
                                   "A", "\xc3\xa9", "\xce\xb1", "0", "7"};

static void test_random_against_pcre2(void **state)
{
    (void)state;
    struct tt_xrng r = {99};
    for (int t = 0; t < N_RANDOM; t++) {
        struct two x = {.ng = 0, .np = 0};
        int rules = tt_xrng_int(&r, 1, 3);
        /* PCRE2: the definitions in a (?(DEFINE)...) group, then root */
        struct two defs = {.ng = 0, .np = 0};
        put2(&defs, "", "(?(DEFINE)");
        char rootp[16384] = "";
        for (int k = 0; k < rules; k++) {
            struct two body = {.ng = 0, .np = 0};
            gen_alt(&body, &r, 0, rules, k, 0);
            char head[32];
            snprintf(head, sizeof head, k == 0 ? "root ::= " : "r%d ::= ", k);
            put2(&x, head, "");
            put2(&x, body.g, "");
            put2(&x, "\n", "");
            if (k == 0) {
                snprintf(rootp, sizeof rootp, "%s", body.p);
            } else {
                char h[32];
                snprintf(h, sizeof h, "(?<r%d>", k);
                put2(&defs, "", h);
                put2(&defs, "", body.p);
                put2(&defs, "", ")");
            }
        }
        put2(&defs, "", ")");
        char pat[40000];
        snprintf(pat, sizeof pat, "%s(?:%s)", rules > 1 ? defs.p : "", rootp);
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF, &ec, &eo, NULL);
        if (re == NULL)
            fail_msg("pcre2 refuses %s", pat);
        char err[300];
        int code;
        struct gm_grammar *g = gbnf(x.g, &bytes_vocab, err, sizeof err, &code);
        pcre2_match_data *md = pcre2_match_data_create(4, NULL);
        for (int i = 0; i < 150; i++) {
            char s[64];
            size_t n = 0;
            int len = tt_xrng_int(&r, 0, 5);
            for (int j = 0; j < len; j++) {
                const char *c =
                    strs[tt_xrng_int(&r, 0, (int)TT_COUNT(strs) - 1)];
                memcpy(s + n, c, strlen(c));
                n += strlen(c);
            }
            /* where nested repetitions of empty-matching groups make the
             * backtracking exceed PCRE2's default step limit (10^7), once
             * more with 100 times the limit */
            int pr = pcre2_match(re, (PCRE2_SPTR)s, n, 0,
                                 PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
            if (pr == PCRE2_ERROR_MATCHLIMIT) {
                pcre2_match_context *mc = pcre2_match_context_create(NULL);
                pcre2_set_match_limit(mc, 1000000000u);
                pr = pcre2_match(re, (PCRE2_SPTR)s, n, 0,
                                 PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, mc);
                pcre2_match_context_free(mc);
            }
            if (pr < 0 && pr != PCRE2_ERROR_NOMATCH)
                fail_msg("pcre2 on %s: %d", pat, pr);
            int want = pr >= 0;
            if (g == NULL) {
                /* only "no document" is a refusal of a regular grammar */
                if (code != TG_EINVAL || want)
                    fail_msg("%s: %s (PCRE2 %s matches \"%.*s\": %d)", x.g, err,
                             pat, (int)n, s, want);
                continue;
            }
            int got = accepts(g, s, n);
            if (got != want)
                fail_msg("grammar\n%s\nPCRE2 %s\non \"%.*s\": PCRE2 %d, "
                         "grammar %d",
                         x.g, pat, (int)n, s, want, got);
        }
        pcre2_match_data_free(md);
        pcre2_code_free(re);
        gm_grammar_unref(g);
    }
}

/* ---- spec kinds ---------------------------------------------------------------- */

static void spec_refused(const char *spec, int code, const char *needle)
{
    char err[400] = "";
    int rc = gm_spec_check(spec, strlen(spec), NULL, err, sizeof err);
    if (rc != code || strstr(err, needle) == NULL)
        fail_msg("%s: want %s with \"%s\", got %s: %s", spec, tg_err_name(code),
                 needle, tg_err_name(rc), err);
}

static struct gm_grammar *spec_grammar(const char *spec,
                                       const struct gm_vocab *v)
{
    char err[400];
    struct gm_grammar *g = NULL;
    assert_int_equal(gm_spec_check(spec, strlen(spec), NULL, err, sizeof err),
                     0);
    if (gm_spec_compile(spec, strlen(spec), v, NULL, &g, err, sizeof err) != 0)
        fail_msg("%s: %s", spec, err);
    return g;
}

static void test_spec_kinds(void **state)
{
    (void)state;
    char *s;
    size_t n;
    assert_int_equal(gm_spec_regex("\\d{3}-[A-Z]+", 12, &s, &n), 0);
    assert_string_equal(s,
                        "{\"type\":\"regex\",\"pattern\":\"\\\\d{3}-[A-Z]+\"}");
    struct gm_grammar *g = spec_grammar(s, &bytes_vocab);
    free(s);
    assert_true(accepts(g, "123-AB", 6));
    assert_false(accepts(g, "123-AB ", 7));    /* whole output: no more */
    assert_false(accepts(g, "x123-AB", 7));    /* and no less */
    assert_false(accepts(g, "\"123-AB\"", 8)); /* raw text, not JSON */
    /* a copy of a matcher whose grammar has no call (no stack vertex) */
    struct gm_matcher c0, c1;
    assert_int_equal(gm_matcher_init(&c0, g), 0);
    assert_int_equal(gm_matcher_accept_bytes(&c0, "12", 2), 0);
    assert_int_equal(gm_matcher_copy(&c1, &c0), 0);
    assert_int_equal(gm_matcher_accept_bytes(&c1, "3-Z", 3), 0);
    assert_true(gm_matcher_can_end(&c1));
    assert_false(gm_matcher_can_end(&c0));
    gm_matcher_free(&c0);
    gm_matcher_free(&c1);
    gm_grammar_unref(g);

    const char *ch[] = {"yes", "no", "y\xc3\xa9s", "no"};
    const size_t chl[] = {3, 2, 4, 2};
    assert_int_equal(gm_spec_choice(ch, chl, 4, &s, &n), 0);
    g = spec_grammar(s, &bytes_vocab);
    free(s);
    assert_true(accepts(g, "yes", 3));
    assert_true(accepts(g, "no", 2));
    assert_true(accepts(g, "y\xc3\xa9s", 4));
    assert_false(accepts(g, "ye", 2));
    assert_false(accepts(g, "nono", 4));
    gm_grammar_unref(g);

    const char *words = "root ::= [a-z]+ (\" \" [a-z]+)*";
    assert_int_equal(gm_spec_grammar(words, strlen(words), &s, &n), 0);
    g = spec_grammar(s, &bytes_vocab);
    free(s);
    assert_true(accepts(g, "hello world", 11));
    assert_false(accepts(g, "hello  world", 12));
    gm_grammar_unref(g);

    /* grammars of the empty output alone: an automaton without a byte
     * edge or a head (qsort / memcpy of nothing, the heads' log) */
    g = spec_grammar("{\"type\":\"regex\",\"pattern\":\"\"}", &bytes_vocab);
    assert_true(accepts(g, "", 0));
    assert_false(accepts(g, "a", 1));
    size_t W = gm_vocab_mask_words(&bytes_vocab);
    uint32_t *m1 = tt_xmalloc(W * sizeof(*m1)), *m2 = tt_xmalloc(W * 4);
    struct gm_matcher mm;
    assert_int_equal(gm_matcher_init(&mm, g), 0);
    assert_int_equal(gm_matcher_fill_mask(&mm, m1, W), 0);
    assert_int_equal(gm_matcher_fill_mask_naive(&mm, m2, W), 0);
    assert_memory_equal(m1, m2, W * sizeof(*m1));
    assert_int_equal(tt_mask_count(m1, W), 1); /* EOS alone */
    gm_matcher_free(&mm);
    free(m1);
    free(m2);
    gm_grammar_unref(g);
    g = spec_grammar("{\"type\":\"grammar\",\"gbnf\":\"root ::= \\\"\\\"\"}",
                     &bytes_vocab);
    assert_true(accepts(g, "", 0));
    gm_grammar_unref(g);

    assert_int_equal(gm_spec_choice(ch, chl, 0, &s, &n), TG_EINVAL);
    assert_int_equal(gm_spec_regex("a\0b", 3, &s, &n), TG_EINVAL);
    assert_int_equal(gm_spec_grammar("\xff", 1, &s, &n), TG_EINVAL);

    spec_refused("{\"type\":\"regex\"}", TG_EFORMAT,
                 "regex needs a \"pattern\" string");
    spec_refused("{\"type\":\"regex\",\"pattern\":\"(a)\\\\1\"}",
                 TG_EUNSUPPORTED, "back-reference \\1");
    spec_refused("{\"type\":\"regex\",\"pattern\":\"a^b\"}", TG_EINVAL,
                 "no string matches");
    spec_refused("{\"type\":\"choice\",\"choices\":[]}", TG_EFORMAT,
                 "non-empty \"choices\" array of strings");
    spec_refused("{\"type\":\"choice\",\"choices\":[\"a\",1]}", TG_EFORMAT,
                 "array of strings");
    spec_refused("{\"type\":\"grammar\",\"gbnf\":5}", TG_EFORMAT,
                 "grammar needs a \"gbnf\" string");
    spec_refused("{\"type\":\"grammar\",\"gbnf\":\"root ::= x\\nx ::= x "
                 "\\\"a\\\"\"}",
                 TG_EINVAL, "rule x is left-recursive");
    spec_refused("{\"type\":\"grammar\",\"gbnf\":\"root ::= \\\"a\\\" ((\"}",
                 TG_EFORMAT, "line 1 column");
}

static void walk_masks(const char *spec, uint64_t seed, double bias)
{
    struct gm_grammar *g = spec_grammar(spec, &qwen);
    size_t W = gm_vocab_mask_words(&qwen);
    uint32_t *a = tt_xmalloc(W * sizeof(*a)), *b = tt_xmalloc(W * sizeof(*b));
    struct tt_gsampler smp;
    struct tt_xrng r = {seed};
    char diff[1024];
    assert_int_equal(tt_gsampler_init(&smp, &qwen), 0);
    struct gm_matcher m;
    assert_int_equal(gm_matcher_init(&m, g), 0);
    for (int i = 0; i < MASK_STEPS; i++) {
        assert_int_equal(gm_matcher_fill_mask(&m, a, W), 0);
        assert_int_equal(gm_matcher_fill_mask_naive(&m, b, W), 0);
        if (tt_mask_diff(&qwen, a, b, W, diff, sizeof diff) != 0)
            fail_msg("%s step %d: %s", spec, i, diff);
        int32_t id = tt_gsampler_pick(&smp, a, bias, &r);
        assert_true(id >= 0);
        assert_int_equal(gm_matcher_accept_token(&m, id), 0);
        if (qwen.kind[id] == GM_TOK_EOS)
            break;
    }
    gm_matcher_free(&m);
    tt_gsampler_free(&smp);
    free(a);
    free(b);
    gm_grammar_unref(g);
}

static void test_masks_qwen3(void **state)
{
    (void)state;
    walk_masks("{\"type\":\"choice\",\"choices\":[\"positive\",\"negative\","
               "\"neutral\",\"mixed feelings\"]}",
               1, 0.0);
    walk_masks("{\"type\":\"regex\",\"pattern\":\"(Mr|Mrs|Ms)\\\\. "
               "[A-Z][a-z]+( [A-Z][a-z]+){0,2}\"}",
               2, 0.0);
    char *s;
    size_t n;
    assert_int_equal(gm_spec_grammar(JSON_GBNF, strlen(JSON_GBNF), &s, &n), 0);
    walk_masks(s, 3, 2.0);
    free(s);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammars_users_write),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_random_against_pcre2),
        cmocka_unit_test(test_spec_kinds),
        cmocka_unit_test(test_masks_qwen3),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
