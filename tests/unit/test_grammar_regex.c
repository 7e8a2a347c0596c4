/* test_grammar_regex.c — regular expressions in the grammar engine
 * (common/grammar/gm_regex.h), checked against an independent matcher,
 * PCRE2:
 * - random patterns from a small generator (literals, escapes, classes,
 *   \d \w \s and their complements, `.`, groups, alternation, every
 *   quantifier, anchors, word boundaries, lookaheads), each written twice:
 *   in ECMA-262 for gm_regex and in an equivalent PCRE2 form (`.` and \s
 *   as explicit classes, since PCRE2's differ); for each, random strings
 *   (escapes, multi-byte UTF-8, quotes, backslashes, control characters)
 *   are fed as JSON string literals to a matcher of the compiled grammar:
 *   it accepts exactly the strings PCRE2 finds the pattern in (JSON
 *   Schema's unanchored search); the same with a length range, and in
 *   whole-string mode over raw UTF-8; and random walks of the grammar
 *   produce strings that PCRE2 must match;
 * - the JSON-Schema-Test-Suite's pattern tests (draft 2020-12 pattern.json,
 *   optional/ecmascript-regex.json and non-bmp-regex.json, vendored in
 *   data/json-schema-test-suite) on their string instances;
 * - refusals name the construct and its position (back-references,
 *   lookbehind, a lookahead in a repetition, syntax errors), the state
 *   limit names itself, a pattern that matches nothing is an error;
 * - zod's .email() pattern with its lookaheads, and the token masks of a
 *   few pattern grammars over the real Qwen3 vocabulary equal the
 *   brute-force oracle's at every step of random walks. */
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

#include "common/grammar/gm_json.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_regex.h"
#include "common/grammar/gm_regex_internal.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_grammar.h"

#if defined(__SANITIZE_ADDRESS__)
#define N_PATTERNS 60 /* ASan + UBSan at -O0: fewer, same checks */
#define MASK_STEPS 4
#else
#define N_PATTERNS 1000
#define MASK_STEPS 16 /* per walk: each step runs the ~30 ms oracle */
#endif
#define N_STRINGS 120
#define N_WALKS 12

/* A small vocabulary: the bytes, a few pieces that cross the JSON
 * encoding's boundaries, a special token and EOS. */
static const char *const pieces[] = {"\\n",      "\\\"", "\\\\", "\\u00",
                                     "\xc3\xa9", "ab",   "a\"",  "\xf0\x9f"};
#define N_PIECES (sizeof pieces / sizeof *pieces)
#define ID_EOS (257 + (int32_t)N_PIECES)
static struct gm_vocab bytes_vocab, qwen;

static int setup(void **state)
{
    (void)state;
    return tt_grammar_byte_vocab(&bytes_vocab, pieces, N_PIECES) != 0 ||
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

/* ---- helpers ------------------------------------------------------------- */

struct buf {
    char s[2048];
    size_t n;
};

static void put(struct buf *b, const char *s)
{
    size_t k = strlen(s);
    assert_true(b->n + k < sizeof b->s);
    memcpy(b->s + b->n, s, k + 1);
    b->n += k;
}

/* JSON string content of UTF-8 text t[0..n): the form gm_regex writes. */
static void json_content(struct buf *o, const char *t, size_t n,
                         struct tt_xrng *r)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        char tmp[8];
        switch (c) {
        case '"': put(o, "\\\""); break;
        case '\\': put(o, "\\\\"); break;
        case 8: put(o, "\\b"); break;
        case 9: put(o, "\\t"); break;
        case 10: put(o, "\\n"); break;
        case 12: put(o, "\\f"); break;
        case 13: put(o, "\\r"); break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp,
                         tt_xrng_int(r, 0, 1) ? "\\u%04x" : "\\u%04X", c);
            } else {
                tmp[0] = (char)c;
                tmp[1] = '\0';
            }
            put(o, tmp);
        }
    }
}

static size_t n_codepoints(const char *t, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)t[i] & 0xC0) != 0x80;
    return k;
}

/* 1 when the grammar accepts bytes b[0..n) as a whole document. */
static int accepts(struct gm_grammar *g, const void *b, size_t n)
{
    struct gm_matcher m;
    assert_int_equal(gm_matcher_init(&m, g), 0);
    int ok = gm_matcher_accept_bytes(&m, b, n) == 0 && gm_matcher_can_end(&m);
    gm_matcher_free(&m);
    return ok;
}

static pcre2_code *pcre(const char *p)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &ec, &eo,
                                   NULL);
    if (re == NULL) {
        PCRE2_UCHAR msg[200];
        pcre2_get_error_message(ec, msg, sizeof msg);
        fail_msg("pcre2 refuses %s: %s at %zu", p, (char *)msg, (size_t)eo);
    }
    return re;
}

/* PCRE2's backtracking matcher, and where nested quantifiers of a random
 * pattern make it exceed its step limit (exponential backtracking on a
 * short string), PCRE2's other matcher (pcre2_dfa_match: every path at
 * once), which supports everything the generator writes. */
static int pcre_match(pcre2_code *re, const char *s, size_t n, int full)
{
    uint32_t opt = full ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0;
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, opt, md, NULL);
    if (rc == PCRE2_ERROR_MATCHLIMIT) {
        int ws[4096];
        rc = pcre2_dfa_match(re, (PCRE2_SPTR)s, n, 0, opt, md, NULL, ws,
                             TT_COUNT(ws));
    }
    pcre2_match_data_free(md);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        PCRE2_UCHAR msg[200];
        pcre2_get_error_message(rc, msg, sizeof msg);
        fail_msg("pcre2_match on \"%.*s\": %s", (int)n, s, (char *)msg);
    }
    return rc >= 0;
}

/* ---- the random pattern generator ---------------------------------------- */

struct pat {
    struct buf e, p; /* ECMA-262, PCRE2 */
};

static void put2(struct pat *x, const char *e, const char *p)
{
    put(&x->e, e);
    put(&x->p, p);
}

#define SPACE_P                                                        \
    "\\t\\n\\x{0b}\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}" \
    "\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}"

static const char *const lits[][2] = {
    {"a", "a"},
    {"b", "b"},
    {"c", "c"},
    {"1", "1"},
    {"_", "_"},
    {" ", " "},
    {"\xc3\xa9", "\xc3\xa9"},
    {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
    {"\\n", "\\n"},
    {"\\\"", "\\\""},
    {"\\\\", "\\\\"},
    {"\\u0001", "\\x{1}"},
    {"\\u00e9", "\\x{e9}"},
    {"\\u{1F600}", "\\x{1f600}"},
    {"\\t", "\\t"},
    {"\\x01", "\\x{01}"},
    {"\\.", "\\."},
    {"\\cA", "\\x{01}"},
    {"\\uD83D\\uDE00", "\\x{1f600}"},
    {"\\/", "/"},
    {"\\0", "\\x{0}"},
    {"{", "\\{"},
};

static const char *const classes[][2] = {
    {"[ab]", "[ab]"},
    {"[^a]", "[^a]"},
    {"[a-c]", "[a-c]"},
    {"\\d", "\\d"},
    {"\\w", "\\w"},
    {"\\W", "\\W"},
    {"\\D", "\\D"},
    {"\\s", "[" SPACE_P "]"},
    {"\\S", "[^" SPACE_P "]"},
    {".", "[^\\n\\r\\x{2028}\\x{2029}]"},
    {"[^\\n\"]", "[^\\n\"]"},
    {"[\\w.]", "[\\w.]"},
    {"[^]", "[\\s\\S]"},
    {"[]", "(?!)"},
    {"[\\s\\d]", "[\\d" SPACE_P "]"},
    {"[\\u00e0-\\u{1F600}]", "[\\x{e0}-\\x{1f600}]"},
    {"[\\b]", "\\x{08}"},
    {"[^\\W_]", "[^\\W_]"},
};

static void alt(struct pat *x, struct tt_xrng *r, int depth, int in_rep);

static void term(struct pat *x, struct tt_xrng *r, int depth, int in_rep)
{
    int kind = tt_xrng_int(r, 0, depth < 3 ? 9 : 5);
    /* decide the quantifier first: what it repeats holds no lookahead */
    static const char *const quants[] = {"*",     "+",    "?",     "{2}",
                                         "{1,3}", "{2,}", "{0,2}", "*?",
                                         "+?",    "??",   "{1,2}?"};
    const char *q = NULL;
    if (kind <= 5 || kind >= 8) {
        if (tt_xrng_int(r, 0, 9) < 4)
            q = quants[tt_xrng_int(r, 0, (int)TT_COUNT(quants) - 1)];
    }
    if (kind <= 2) {
        int i = tt_xrng_int(r, 0, (int)TT_COUNT(lits) - 1);
        put2(x, lits[i][0], lits[i][1]);
    } else if (kind <= 5) {
        int i = tt_xrng_int(r, 0, (int)TT_COUNT(classes) - 1);
        put2(x, classes[i][0], classes[i][1]);
    } else if (kind == 6) {
        static const char *const an[] = {"^", "$", "\\b", "\\B"};
        const char *a = an[tt_xrng_int(r, 0, 3)];
        put2(x, a, a);
    } else if (kind == 7 && !in_rep) {
        const char *o = tt_xrng_int(r, 0, 1) ? "(?=" : "(?!";
        put2(x, o, o);
        alt(x, r, depth + 1, in_rep);
        put2(x, ")", ")");
    } else {
        const char *o = tt_xrng_int(r, 0, 1) ? "(" : "(?:";
        put2(x, o, o);
        alt(x, r, depth + 1, in_rep || q != NULL);
        put2(x, ")", ")");
    }
    if (q != NULL && kind != 6 && !(kind == 7 && !in_rep))
        put2(x, q, q);
}

static void alt(struct pat *x, struct tt_xrng *r, int depth, int in_rep)
{
    int n = tt_xrng_int(r, 1, depth == 0 ? 3 : 2);
    for (int i = 0; i < n; i++) {
        if (i > 0)
            put2(x, "|", "|");
        int k = tt_xrng_int(r, 0, 3);
        for (int j = 0; j < k; j++)
            term(x, r, depth, in_rep);
    }
}

static const char *const chars[] = {
    "a",  "b",  "c",  "1",    "_",  " ", "\xc3\xa9", "\xf0\x9f\x98\x80",
    "\n", "\"", "\\", "\x01", "\t", ".", "\r",       "\x08"};

static size_t random_string(char *s, struct tt_xrng *r)
{
    size_t n = 0;
    int k = tt_xrng_int(r, 0, 6);
    for (int i = 0; i < k; i++) {
        const char *c = chars[tt_xrng_int(r, 0, (int)TT_COUNT(chars) - 1)];
        memcpy(s + n, c, strlen(c));
        n += strlen(c);
    }
    s[n] = '\0';
    return n;
}

/* Random walks of g (a JSON string rule, or raw text when raw) over the
 * byte vocabulary: every finished document must satisfy the pattern by
 * PCRE2, with its length in lo..hi. */
static void walks(struct gm_grammar *g, pcre2_code *re, int raw, uint32_t lo,
                  uint32_t hi, struct tt_xrng *r, const char *pat)
{
    size_t W = gm_vocab_mask_words(&bytes_vocab);
    uint32_t *mask = tt_xmalloc(W * sizeof(*mask));
    for (int w = 0; w < N_WALKS; w++) {
        struct gm_matcher m;
        assert_int_equal(gm_matcher_init(&m, g), 0);
        char doc[256];
        size_t n = 0;
        int done = 0;
        while (n < 120) {
            assert_int_equal(gm_matcher_fill_mask(&m, mask, W), 0);
            if (gm_matcher_can_end(&m) && tt_xrng_int(r, 0, 3) == 0) {
                done = 1;
                break;
            }
            int32_t ids[300];
            int k = 0;
            for (int32_t id = 0; id < 256 + (int32_t)N_PIECES; id++)
                if ((mask[id >> 5] >> (id & 31)) & 1)
                    ids[k++] = id;
            if (k == 0) {
                done = gm_matcher_can_end(&m);
                break;
            }
            int32_t id = ids[tt_xrng_int(r, 0, k - 1)];
            size_t tl;
            const uint8_t *tb = gm_vocab_token(&bytes_vocab, id, &tl);
            if (n + tl >= sizeof doc)
                break;
            memcpy(doc + n, tb, tl);
            n += tl;
            assert_int_equal(gm_matcher_accept_token(&m, id), 0);
        }
        gm_matcher_free(&m);
        if (!done)
            continue;
        const char *s = doc;
        size_t sl = n;
        json_t *v = NULL;
        if (!raw) {
            v = json_loadb(doc, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            if (!json_is_string(v))
                fail_msg("%s: walk wrote %.*s, not a JSON string", pat, (int)n,
                         doc);
            s = json_string_value(v);
            sl = json_string_length(v);
        }
        size_t cps = n_codepoints(s, sl);
        if (!pcre_match(re, s, sl, raw) || cps < lo || cps > hi)
            fail_msg("%s [%u, %u]: the grammar generated %.*s, which does "
                     "not match",
                     pat, lo, hi, (int)n, doc);
        json_decref(v);
    }
    free(mask);
}

/* One random pattern against PCRE2 in the three modes. */
static void check_pattern(const struct pat *x, struct tt_xrng *r)
{
    pcre2_code *re = pcre(x->p.s);
    char err[300];
    for (int mode = 0; mode < 3; mode++) {
        /* 0: search, JSON; 1: search with lengths, JSON; 2: whole, raw */
        uint32_t lo = 0, hi = GM_REPEAT_INF;
        if (mode == 1) {
            lo = (uint32_t)tt_xrng_int(r, 0, 3);
            hi = lo + (uint32_t)tt_xrng_int(r, 0, 3);
        }
        struct gm_rx_item it = {.text = x->e.s,
                                .len = x->e.n,
                                .kind = mode == 2 ? GM_RX_FULL : GM_RX_SEARCH};
        struct gm_rx_opts o;
        gm_rx_opts_default(&o);
        o.min_len = lo;
        o.max_len = hi;
        o.enc = mode == 2 ? GM_RX_RAW : GM_RX_JSON;
        struct gm_ir ir;
        gm_ir_init(&ir, 0);
        int32_t c = gm_regex_expr(&ir, &it, 1, &o, err, sizeof err);
        int none = c == TG_EINVAL;
        if (c < 0 && !none)
            fail_msg("%s (PCRE2 %s): %s", x->e.s, x->p.s, err);
        struct gm_grammar *g = NULL;
        if (!none) {
            int32_t rule = gm_ir_rule(&ir, "doc");
            int32_t q = gm_ir_str(&ir, "\"");
            gm_ir_rule_define(
                &ir, rule,
                mode == 2 ? c : gm_ir_seq(&ir, (int32_t[]){q, c, q}, 3));
            g = tt_grammar_compile_rule(&ir, rule, &bytes_vocab);
        }
        gm_ir_free(&ir);
        for (int i = 0; i < N_STRINGS; i++) {
            char s[64];
            size_t n = random_string(s, r);
            size_t cps = n_codepoints(s, n);
            int want = pcre_match(re, s, n, mode == 2) && cps >= lo &&
                       cps <= hi;
            if (none) {
                if (want)
                    fail_msg("%s [%u,%u] mode %d: refused as matching "
                             "nothing (%s) but PCRE2 matches \"%s\"",
                             x->e.s, lo, hi, mode, err, s);
                continue;
            }
            struct buf doc = {.n = 0};
            if (mode == 2) {
                memcpy(doc.s, s, n + 1);
                doc.n = n;
            } else {
                put(&doc, "\"");
                json_content(&doc, s, n, r);
                put(&doc, "\"");
            }
            int got = accepts(g, doc.s, doc.n);
            if (got != want)
                fail_msg("pattern %s (PCRE2 %s) mode %d [%u,%u]: on \"%s\" "
                         "(as %s) PCRE2 says %d, the grammar %d",
                         x->e.s, x->p.s, mode, lo, hi, s, doc.s, want, got);
        }
        if (g != NULL) {
            walks(g, re, mode == 2, lo, hi, r, x->e.s);
            gm_grammar_unref(g);
        }
    }
    pcre2_code_free(re);
}

static void test_random_patterns_against_pcre2(void **state)
{
    (void)state;
    struct tt_xrng r = {20260822};
    int compiled = 0;
    for (int i = 0; i < N_PATTERNS; i++) {
        struct pat x;
        memset(&x, 0, sizeof x);
        alt(&x, &r, 0, 0);
        check_pattern(&x, &r);
        compiled++;
    }
    assert_int_equal(compiled, N_PATTERNS);
}

/* Fixed patterns: what users write, with strings each way. */
static void test_fixed_patterns(void **state)
{
    (void)state;
    static const struct {
        const char *e, *p; /* ECMA, PCRE2 (NULL: the same) */
    } cases[] = {
        {"^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9]"
         "[A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$",
         NULL},
        {"^(?=.*[A-Z])(?=.*\\d)(?!.*\\s).{6,12}$",
         "^(?=.*[A-Z])(?=.*\\d)(?!.*[" SPACE_P "])[^\\n\\r\\x{2028}"
         "\\x{2029}]{6,12}$"},
        {"^\\d{3}-\\d{4}$", NULL},
        {"\\bcat\\b", NULL},
        {"^[^\"\\\\]*$", NULL},
        {"^(a|ab)(c|bcd)(d*)$", NULL},
        {"^(?:(?=a)\\w){1,3}b$", NULL},
        {"x*$", NULL},
    };
    struct tt_xrng r = {7};
    for (size_t i = 0; i < TT_COUNT(cases); i++) {
        struct pat x;
        memset(&x, 0, sizeof x);
        put2(&x, cases[i].e, cases[i].p ? cases[i].p : cases[i].e);
        check_pattern(&x, &r);
    }
}

/* ---- the JSON-Schema-Test-Suite ----------------------------------------- */

static json_t *suite_file(const char *rel)
{
    const char *data = getenv("TANGRAM_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/json-schema-test-suite/tests/%s",
             data != NULL ? data : "data", rel);
    json_error_t je;
    json_t *d = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (d == NULL)
        fail_msg("cannot read %s (TANGRAM_DATA): %s", path, je.text);
    return d;
}

static void suite_patterns(const char *rel, int *n_ok)
{
    json_t *d = suite_file(rel);
    size_t i, k;
    json_t *grp, *t;
    json_array_foreach(d, i, grp)
    {
        const json_t *pat = json_object_get(json_object_get(grp, "schema"),
                                            "pattern");
        if (!json_is_string(pat))
            continue;
        struct gm_ir ir;
        gm_ir_init(&ir, 0);
        char err[300];
        int32_t rule = gm_regex_json_string(&ir, json_string_value(pat),
                                            json_string_length(pat), 0,
                                            GM_REPEAT_INF, err, sizeof err);
        if (rule < 0)
            fail_msg("%s: %s: %s", rel, json_string_value(pat), err);
        struct gm_grammar *g = tt_grammar_compile_rule(&ir, rule, &bytes_vocab);
        gm_ir_free(&ir);
        json_array_foreach(json_object_get(grp, "tests"), k, t)
        {
            const json_t *data = json_object_get(t, "data");
            if (!json_is_string(data))
                continue;
            char *doc = json_dumps(data, JSON_ENCODE_ANY);
            int got = accepts(g, doc, strlen(doc));
            int want = json_is_true(json_object_get(t, "valid"));
            if (got != want)
                fail_msg("%s: pattern %s on %s: valid %d, grammar %d", rel,
                         json_string_value(pat), doc, want, got);
            free(doc);
            (*n_ok)++;
        }
        gm_grammar_unref(g);
    }
    json_decref(d);
}

static void test_suite_patterns(void **state)
{
    (void)state;
    int n = 0;
    suite_patterns("draft2020-12/pattern.json", &n);
    suite_patterns("draft2020-12/optional/ecmascript-regex.json", &n);
    suite_patterns("draft2020-12/optional/non-bmp-regex.json", &n);
    assert_true(n >= 40); /* every string instance of the three files */
}

/* ---- refusals -------------------------------------------------------------- */

static void refused(const char *pat, int code, const char *needle)
{
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    char err[300] = "";
    int32_t r = gm_regex_json_string(&ir, pat, strlen(pat), 0, GM_REPEAT_INF,
                                     err, sizeof err);
    if (r != code || strstr(err, needle) == NULL)
        fail_msg("%s: want %s with \"%s\", got %d: %s", pat, tg_err_name(code),
                 needle, (int)r, err);
    /* the pattern's own errors are left for the caller to record */
    if (code != TG_ETIMEDOUT)
        assert_int_equal(gm_ir_error(&ir, NULL, 0), 0);
    char err2[300];
    int c2 = gm_regex_check(pat, strlen(pat), GM_RX_SEARCH, err2, sizeof err2);
    if (code == TG_EFORMAT || code == TG_EUNSUPPORTED)
        assert_int_equal(c2, code);
    gm_ir_free(&ir);
}

static void test_refusals(void **state)
{
    (void)state;
    refused("(a)\\1", TG_EUNSUPPORTED, "back-reference \\1");
    refused("(a)\\1", TG_EUNSUPPORTED, "at position 3");
    refused("(?<x>a)\\k<x>", TG_EUNSUPPORTED, "back-reference \\k<name>");
    refused("a(?<=b)", TG_EUNSUPPORTED, "lookbehind");
    refused("a(?<!b)", TG_EUNSUPPORTED, "at position 1");
    refused("(?:a(?=b))+", TG_EUNSUPPORTED, "lookahead inside a repetition");
    refused("\\p{Script=Greek}", TG_EUNSUPPORTED, "\\p{Script=Greek}");
    refused("[z-a]", TG_EFORMAT, "range out of order");
    refused("a{3,2}", TG_EFORMAT, "n below m");
    refused("(ab", TG_EFORMAT, "missing )");
    refused("ab)", TG_EFORMAT, "unmatched )");
    refused("[ab", TG_EFORMAT, "missing ]");
    refused("*a", TG_EFORMAT, "nothing to repeat");
    refused("a**", TG_EFORMAT, "nothing to repeat");
    refused("^*", TG_EFORMAT, "after an assertion");
    refused("\\e", TG_EFORMAT, "unknown escape \\e");
    refused("(?i)a", TG_EFORMAT, "unknown group syntax");
    refused("a\\", TG_EFORMAT, "at the end");
    refused("\xff", TG_EFORMAT, "not UTF-8");
    refused("a{99999}", TG_ETOOBIG, "over the limit");
    refused("a^b", TG_EINVAL, "no string matches");
    refused("(?=a)b", TG_EINVAL, "no string matches");
    /* more states than the limit: the 21st character from the end */
    refused("a[ab]{20}$", TG_ETOOBIG, "automaton states");
    /* lengths that no match has */
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    char err[300];
    int32_t r = gm_regex_json_string(&ir, "^abc$", 5, 4, 9, err, sizeof err);
    assert_int_equal(r, TG_EINVAL);
    assert_non_null(strstr(err, "4 to 9"));
    gm_ir_free(&ir);
}

/* The deadline of the IR is honoured and recorded there. */
static void test_deadline(void **state)
{
    (void)state;
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    gm_ir_set_deadline(&ir, gm__now() - 1.0);
    char err[300];
    int32_t r = gm_regex_json_string(&ir, "a", 1, 0, GM_REPEAT_INF, err,
                                     sizeof err);
    assert_int_equal(r, TG_ETIMEDOUT);
    assert_int_equal(gm_ir_error(&ir, NULL, 0), TG_ETIMEDOUT);
    gm_ir_free(&ir);
}

/* Several conditions at once: patternProperties' keys. */
static void test_items(void **state)
{
    (void)state;
    struct gm_rx_item it[3] = {
        {.text = "^[a-z]+$", .len = 8, .kind = GM_RX_SEARCH},
        {.text = "x", .len = 1, .kind = GM_RX_SEARCH, .negate = 1},
        {.text = "name", .len = 4, .kind = GM_RX_LITERAL, .negate = 1},
    };
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    char err[300];
    int32_t r = gm_regex_json_string_items(&ir, it, 3, 2, 6, err, sizeof err);
    assert_true(r >= 0);
    struct gm_grammar *g = tt_grammar_compile_rule(&ir, r, &bytes_vocab);
    gm_ir_free(&ir);
    assert_true(accepts(g, "\"names\"", 7));
    assert_true(accepts(g, "\"ab\"", 4));
    assert_false(accepts(g, "\"name\"", 6));
    assert_false(accepts(g, "\"a\"", 3));
    assert_false(accepts(g, "\"abcdefg\"", 9));
    assert_false(accepts(g, "\"box\"", 5));
    assert_false(accepts(g, "\"Ab\"", 4));
    gm_grammar_unref(g);
    /* the same conditions on literal strings */
    const char *s[] = {"names",   "ab",  "name", "a",
                       "abcdefg", "box", "Ab",   "\xff"};
    const size_t l[] = {5, 2, 4, 1, 7, 3, 2, 1};
    uint8_t out[8];
    assert_int_equal(
        gm_regex_test_many(it, 3, 2, 6, s, l, 8, out, err, sizeof err), 0);
    static const uint8_t want[8] = {1, 1, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(out, want, 8);
    assert_int_equal(
        gm_regex_test(it, 1, 0, GM_REPEAT_INF, "abc", 3, err, sizeof err), 1);
    assert_int_equal(
        gm_regex_test(it, 1, 0, GM_REPEAT_INF, "a1", 2, err, sizeof err), 0);
    struct gm_rx_item bad = {.text = "(a)\\1", .len = 5};
    assert_int_equal(
        gm_regex_test(&bad, 1, 0, GM_REPEAT_INF, "aa", 2, err, sizeof err),
        TG_EUNSUPPORTED);
}

/* Length ranges: one every string meets anyway costs nothing; one whose
 * product with the automaton is over its limit writes shorter strings. */
static void test_lengths(void **state)
{
    (void)state;
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    char err[300];
    /* a date is 10 characters: maxLength 254 changes nothing */
    const char *date = "^\\d{4}-\\d{2}-\\d{2}$";
    int32_t r1 = gm_regex_json_string(&ir, date, strlen(date), 0, 254, err,
                                      sizeof err);
    size_t n1 = ir.n_expr;
    int32_t r2 = gm_regex_json_string(&ir, date, strlen(date), 0, GM_REPEAT_INF,
                                      err, sizeof err);
    assert_true(r1 >= 0 && r2 >= 0);
    assert_int_equal(ir.n_expr - n1, n1); /* the same IR twice */
    gm_ir_free(&ir);
    /* 151 states × 1025 lengths: over GM_REGEX_MAX_PRODUCT, so at most a
     * shorter length (still within 0..1024) is written */
    gm_ir_init(&ir, 0);
    const char *runs = "^(?:a{150}|b)*$";
    int32_t r = gm_regex_json_string(&ir, runs, strlen(runs), 0, 1024, err,
                                     sizeof err);
    if (r < 0)
        fail_msg("%s", err);
    struct gm_grammar *g = tt_grammar_compile_rule(&ir, r, &bytes_vocab);
    gm_ir_free(&ir);
    char doc[1100];
    doc[0] = '"';
    memset(doc + 1, 'b', 100);
    memcpy(doc + 101, "\"", 1);
    assert_true(accepts(g, doc, 102));
    memset(doc + 1, 'b', 1024);
    memcpy(doc + 1025, "\"", 1);
    assert_false(accepts(g, doc, 1026)); /* valid, but no longer written */
    memset(doc + 1, 'a', 151);
    memcpy(doc + 152, "\"", 1);
    assert_false(accepts(g, doc, 153)); /* invalid */
    gm_grammar_unref(g);
}

/* ---- token masks over the real vocabulary ---------------------------------- */

static void mask_walks(const char *pat, int kind, int enc, uint32_t lo,
                       uint32_t hi, uint64_t seed)
{
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    struct gm_rx_item it = {
        .text = pat, .len = strlen(pat), .kind = (uint8_t)kind};
    struct gm_rx_opts o;
    gm_rx_opts_default(&o);
    o.min_len = lo;
    o.max_len = hi;
    o.enc = (uint8_t)enc;
    char err[300];
    int32_t c = gm_regex_expr(&ir, &it, 1, &o, err, sizeof err);
    if (c < 0)
        fail_msg("%s: %s", pat, err);
    int32_t q = gm_ir_str(&ir, "\"");
    int32_t rule = gm_ir_rule(&ir, "doc");
    gm_ir_rule_define(
        &ir, rule,
        enc == GM_RX_RAW ? c : gm_ir_seq(&ir, (int32_t[]){q, c, q}, 3));
    struct gm_grammar *g = tt_grammar_compile_rule(&ir, rule, &qwen);
    gm_ir_free(&ir);
    size_t W = gm_vocab_mask_words(&qwen);
    uint32_t *a = tt_xmalloc(W * sizeof(*a)), *b = tt_xmalloc(W * sizeof(*b));
    struct tt_gsampler s;
    struct tt_xrng r = {seed};
    char diff[1024];
    assert_int_equal(tt_gsampler_init(&s, &qwen), 0);
    for (int walk = 0; walk < 2; walk++) {
        struct gm_matcher m;
        assert_int_equal(gm_matcher_init(&m, g), 0);
        for (int i = 0; i < MASK_STEPS; i++) {
            assert_int_equal(gm_matcher_fill_mask(&m, a, W), 0);
            assert_int_equal(gm_matcher_fill_mask_naive(&m, b, W), 0);
            if (tt_mask_diff(&qwen, a, b, W, diff, sizeof diff) != 0)
                fail_msg("%s, walk %d step %d: %s", pat, walk, i, diff);
            int32_t id = tt_gsampler_pick(&s, a, walk ? 3.0 : -1.0, &r);
            assert_true(id >= 0);
            assert_int_equal(gm_matcher_accept_token(&m, id), 0);
            if (qwen.kind[id] == GM_TOK_EOS)
                break;
        }
        gm_matcher_free(&m);
    }
    tt_gsampler_free(&s);
    free(a);
    free(b);
    gm_grammar_unref(g);
}

static void test_masks_qwen3(void **state)
{
    (void)state;
    mask_walks("^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@"
               "([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$",
               GM_RX_SEARCH, GM_RX_JSON, 0, GM_REPEAT_INF, 1);
    mask_walks("^[A-Z]{3}-\\d{4}$", GM_RX_SEARCH, GM_RX_JSON, 0, GM_REPEAT_INF,
               2);
    mask_walks("\\w+( \\w+)*", GM_RX_SEARCH, GM_RX_JSON, 3, 40, 3);
    mask_walks("[^\"]*\"[^\\\\]{0,8}", GM_RX_SEARCH, GM_RX_JSON, 0, 24, 4);
    mask_walks("(yes|no|maybe)[.!]?", GM_RX_FULL, GM_RX_RAW, 0, GM_REPEAT_INF,
               5);
    mask_walks("\\d+(\\.\\d+)?( (USD|EUR))?", GM_RX_FULL, GM_RX_RAW, 0,
               GM_REPEAT_INF, 6);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_items),
        cmocka_unit_test(test_lengths),
        cmocka_unit_test(test_fixed_patterns),
        cmocka_unit_test(test_suite_patterns),
        cmocka_unit_test(test_random_patterns_against_pcre2),
        cmocka_unit_test(test_masks_qwen3),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
