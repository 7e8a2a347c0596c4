/* test_grammar_ir.c — the grammar engine below JSON Schema
 * (common/grammar): the IR builder and its sticky errors, the printed
 * grammar, the automaton compiler (left recursion refused, unproductive
 * alternatives dropped, a start rule without documents refused, nullable
 * rules called, limits), literal tries (one head for an enum of 1000
 * values sharing a prefix), JSON's own grammars byte by byte (strings with
 * every escape and UTF-8 form, numbers, the whitespace bound, compact
 * mode), the matcher's EOS, rollback, copy and "bytes left", and the
 * fast token mask against the brute-force oracle on random walks over a
 * small synthetic vocabulary whose tokens cross rule boundaries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_grammar.h"
#include "common/grammar/gm_json.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_grammar.h"

/* A synthetic vocabulary: the 256 single bytes, multi-byte pieces that
 * cross JSON's rule boundaries, one special token and EOS. */
static const char *const pieces[] = {
    "true", "false", "null", "\":", "\": ", ", \"", "{\"", "\"}", "\"]",
    "}}", "]]", "[[", "{}", "[]", "},", "],", "\",", "\", \"", "\n  ",
    "\n    ", "  ", " \"", "12", "3.5", "e+", "-0", "ab", "\\u00", "\\n",
    "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98", "\x80", "\":\"", "\"a\"",
    "a\"}", "1,", "1]", "1}", "\"b\":[", "<call>", "</call>", "x\", \"y"};
#define N_PIECES (sizeof pieces / sizeof *pieces)
#define ID_SPECIAL (256 + (int32_t)N_PIECES)
#define ID_EOS (ID_SPECIAL + 1)
#define N_IDS (ID_EOS + 1)

static struct gm_vocab vocab;

static int setup(void **state)
{
    (void)state;
    return tt_grammar_byte_vocab(&vocab, pieces, N_PIECES);
}

static int teardown(void **state)
{
    (void)state;
    gm_vocab_free(&vocab);
    return 0;
}

static struct gm_grammar *compile_ir(const struct gm_ir *ir)
{
    struct gm_grammar *g = NULL;
    char err[256];
    int rc = gm_grammar_compile_ir(ir, &vocab, NULL, &g, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "compile: %s\n", err);
    assert_int_equal(rc, 0);
    return g;
}

static struct gm_grammar *compile_spec(const char *spec, int ws_indent)
{
    struct gm_limits lim;
    gm_limits_default(&lim);
    lim.ws_indent = ws_indent;
    struct gm_grammar *g = NULL;
    char err[256];
    int rc = gm_spec_compile(spec, strlen(spec), &vocab, &lim, &g, err,
                             sizeof err);
    if (rc != 0)
        fprintf(stderr, "compile %s: %s\n", spec, err);
    assert_int_equal(rc, 0);
    return g;
}

/* 1 when the whole text is a document of g (accepted and may end). */
static int accepts(struct gm_grammar *g, const char *text, size_t n)
{
    struct gm_matcher m;
    assert_int_equal(gm_matcher_init(&m, g), 0);
    int rc = gm_matcher_accept_bytes(&m, text, n);
    int ok = rc == 0 && gm_matcher_can_end(&m);
    assert_true(rc == 0 || rc == TG_EINVAL);
    gm_matcher_free(&m);
    return ok;
}

static void expect(struct gm_grammar *g, const char *text, int want)
{
    int got = accepts(g, text, strlen(text));
    if (got != want)
        fprintf(stderr, "expected %s: [%s]\n", want ? "accept" : "reject",
                text);
    assert_int_equal(got, want);
}

static void test_ir_build_and_print(void **state)
{
    (void)state;
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    int32_t r = gm_ir_rule(&ir, "start");
    int32_t item = gm_ir_alt2(&ir, gm_ir_str(&ir, "a\"b"),
                              gm_ir_range(&ir, '0', '9'));
    assert_int_equal(
        gm_ir_rule_define(&ir, r,
                          gm_ir_seq2(&ir, gm_ir_repeat(&ir, item, 1, 3),
                                     gm_ir_opt(&ir, gm_ir_chars(&ir, "\n-")))),
        0);
    assert_int_equal(gm_ir_root_set(&ir, r), 0);
    char *text;
    size_t len;
    assert_int_equal(gm_ir_format(&ir, &text, &len), 0);
    assert_string_equal(text,
                        "start ::= ( ( ( \"a\\\"b\" | [0-9] ) ){1,3} ( "
                        "[\\n\\-] ){0,1} )\n");
    free(text);
    struct gm_grammar *g = compile_ir(&ir);
    expect(g, "a\"b", 1);
    expect(g, "1a\"b9-", 1);
    expect(g, "1234", 0);
    expect(g, "", 0);
    gm_grammar_unref(g);
    gm_ir_free(&ir);
}

static void test_ir_sticky_errors(void **state)
{
    (void)state;
    struct gm_ir ir;
    char err[256];
    gm_ir_init(&ir, 0);
    int32_t bad = gm_ir_repeat(&ir, gm_ir_str(&ir, "a"), 3, 2);
    assert_int_equal(bad, TG_ERANGE);
    /* later calls pass the error on */
    assert_int_equal(gm_ir_seq2(&ir, bad, gm_ir_str(&ir, "b")), TG_ERANGE);
    int32_t r = gm_ir_rule(&ir, "r");
    assert_int_equal(gm_ir_rule_define(&ir, r, bad), TG_ERANGE);
    assert_int_equal(gm_ir_root_set(&ir, r), TG_ERANGE);
    assert_int_equal(gm_ir_error(&ir, err, sizeof err), TG_ERANGE);
    assert_non_null(strstr(err, "min 3 > max 2"));
    gm_ir_free(&ir);

    gm_ir_init(&ir, 0);
    assert_int_equal(
        gm_ir_repeat(&ir, gm_ir_str(&ir, "a"), 0, GM_REPEAT_MAX + 1),
        TG_ERANGE);
    gm_ir_free(&ir);

    gm_ir_init(&ir, 0);
    int32_t a = gm_ir_rule(&ir, "a");
    int32_t b = gm_ir_rule(&ir, "never-defined");
    gm_ir_rule_define(&ir, a, gm_ir_ref(&ir, b));
    assert_int_equal(gm_ir_root_set(&ir, a), TG_EINVAL);
    gm_ir_error(&ir, err, sizeof err);
    assert_non_null(strstr(err, "never-defined"));
    gm_ir_free(&ir);

    /* the expression limit */
    gm_ir_init(&ir, 10);
    int32_t e = 0;
    for (int i = 0; i < 20 && e >= 0; i++)
        e = gm_ir_str(&ir, "x");
    assert_int_equal(e, TG_ETOOBIG);
    gm_ir_free(&ir);
}

static void test_left_recursion_refused(void **state)
{
    (void)state;
    char err[256];
    struct gm_grammar *g = NULL;
    /* r ::= r "a" | "b" */
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    int32_t r = gm_ir_rule(&ir, "lr");
    gm_ir_rule_define(
        &ir, r,
        gm_ir_alt2(&ir, gm_ir_seq2(&ir, gm_ir_ref(&ir, r), gm_ir_str(&ir, "a")),
                   gm_ir_str(&ir, "b")));
    gm_ir_root_set(&ir, r);
    assert_int_equal(
        gm_grammar_compile_ir(&ir, &vocab, NULL, &g, err, sizeof err),
        TG_EINVAL);
    assert_non_null(strstr(err, "lr is left-recursive"));
    assert_null(g);
    gm_ir_free(&ir);

    /* indirect, through a nullable prefix: a ::= "x"? b "y"; b ::= a | "z" */
    gm_ir_init(&ir, 0);
    int32_t ra = gm_ir_rule(&ir, "a");
    int32_t rb = gm_ir_rule(&ir, "b");
    gm_ir_rule_define(
        &ir, ra,
        gm_ir_seq(&ir,
                  (int32_t[]){gm_ir_opt(&ir, gm_ir_str(&ir, "x")),
                              gm_ir_ref(&ir, rb), gm_ir_str(&ir, "y")},
                  3));
    gm_ir_rule_define(&ir, rb,
                      gm_ir_alt2(&ir, gm_ir_ref(&ir, ra), gm_ir_str(&ir, "z")));
    gm_ir_root_set(&ir, ra);
    assert_int_equal(
        gm_grammar_compile_ir(&ir, &vocab, NULL, &g, err, sizeof err),
        TG_EINVAL);
    assert_non_null(strstr(err, "left-recursive"));
    gm_ir_free(&ir);

    /* recursion after a byte is fine: p ::= "(" p ")" | "" */
    gm_ir_init(&ir, 0);
    int32_t p = gm_ir_rule(&ir, "p");
    gm_ir_rule_define(
        &ir, p,
        gm_ir_alt2(&ir,
                   gm_ir_seq(&ir,
                             (int32_t[]){gm_ir_str(&ir, "("), gm_ir_ref(&ir, p),
                                         gm_ir_str(&ir, ")")},
                             3),
                   gm_ir_empty(&ir)));
    gm_ir_root_set(&ir, p);
    g = compile_ir(&ir);
    expect(g, "", 1);
    expect(g, "((()))", 1);
    expect(g, "(()", 0);
    expect(g, "())", 0);
    gm_grammar_unref(g);
    gm_ir_free(&ir);
}

static void test_productivity(void **state)
{
    (void)state;
    char err[256];
    struct gm_grammar *g = NULL;
    /* loop ::= "a" loop: no finite document */
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    int32_t loop = gm_ir_rule(&ir, "loop");
    gm_ir_rule_define(&ir, loop,
                      gm_ir_seq2(&ir, gm_ir_str(&ir, "a"), gm_ir_ref(&ir, loop)));
    int32_t top = gm_ir_rule(&ir, "top");
    gm_ir_rule_define(&ir, top, gm_ir_ref(&ir, loop));
    gm_ir_root_set(&ir, top);
    assert_int_equal(
        gm_grammar_compile_ir(&ir, &vocab, NULL, &g, err, sizeof err),
        TG_EINVAL);
    assert_non_null(strstr(err, "no document"));
    gm_ir_free(&ir);

    /* an unproductive alternative is dropped, the rest stays:
     * top ::= "b" | loop | "c" [] | "e" loop{0,2} */
    gm_ir_init(&ir, 0);
    loop = gm_ir_rule(&ir, "loop");
    gm_ir_rule_define(&ir, loop,
                      gm_ir_seq2(&ir, gm_ir_str(&ir, "a"), gm_ir_ref(&ir, loop)));
    top = gm_ir_rule(&ir, "top");
    int32_t alts[4] = {
        gm_ir_str(&ir, "b"), gm_ir_ref(&ir, loop),
        gm_ir_seq2(&ir, gm_ir_str(&ir, "c"), gm_ir_alt(&ir, NULL, 0)),
        gm_ir_seq2(&ir, gm_ir_str(&ir, "e"),
                   gm_ir_repeat(&ir, gm_ir_ref(&ir, loop), 0, 2))};
    gm_ir_rule_define(&ir, top, gm_ir_alt(&ir, alts, 4));
    gm_ir_root_set(&ir, top);
    g = compile_ir(&ir);
    expect(g, "b", 1);
    expect(g, "e", 1);
    expect(g, "a", 0);
    expect(g, "c", 0);
    expect(g, "ea", 0);
    /* nothing but what leads to a document is ever allowed */
    struct gm_matcher m;
    uint32_t mask[(N_IDS + 31) / 32];
    gm_matcher_init(&m, g);
    assert_int_equal(gm_matcher_fill_mask(&m, mask, TT_COUNT(mask)), 0);
    assert_int_equal(tt_mask_count(mask, TT_COUNT(mask)), 2);
    assert_true(mask['b' >> 5] & (1u << ('b' & 31)));
    gm_matcher_free(&m);
    gm_grammar_unref(g);
    gm_ir_free(&ir);
}

static void test_nullable_calls(void **state)
{
    (void)state;
    /* top ::= as "b" as; as ::= "a"* */
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    int32_t as = gm_ir_rule(&ir, "as");
    gm_ir_rule_define(&ir, as,
                      gm_ir_repeat(&ir, gm_ir_str(&ir, "a"), 0, GM_REPEAT_INF));
    int32_t top = gm_ir_rule(&ir, "top");
    gm_ir_rule_define(&ir, top,
                      gm_ir_seq(&ir,
                                (int32_t[]){gm_ir_ref(&ir, as), gm_ir_str(&ir, "b"),
                                            gm_ir_ref(&ir, as)},
                                3));
    gm_ir_root_set(&ir, top);
    struct gm_grammar *g = compile_ir(&ir);
    expect(g, "b", 1);
    expect(g, "aab", 1);
    expect(g, "baaa", 1);
    expect(g, "aba", 1);
    expect(g, "", 0);
    expect(g, "abab", 0);
    gm_grammar_unref(g);
    gm_ir_free(&ir);
}

static void test_literal_trie(void **state)
{
    (void)state;
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    const char *s[] = {"get_time", "get_weather", "get_time", "x", "get_"};
    size_t len[5];
    for (int i = 0; i < 5; i++)
        len[i] = strlen(s[i]);
    int32_t cont[5] = {gm_ir_str(&ir, "1"), gm_ir_str(&ir, "2"),
                       gm_ir_str(&ir, "3"), gm_ir_empty(&ir),
                       gm_ir_str(&ir, "4")};
    int32_t r = gm_ir_rule(&ir, "names");
    gm_ir_rule_define(&ir, r, gm_ir_literals(&ir, s, len, cont, 5));
    gm_ir_root_set(&ir, r);
    struct gm_grammar *g = compile_ir(&ir);
    expect(g, "get_time1", 1);
    expect(g, "get_time3", 0); /* a repeated literal keeps its first */
    expect(g, "get_weather2", 1);
    expect(g, "get_4", 1);
    expect(g, "x", 1);
    expect(g, "get_time", 0);
    expect(g, "get_", 0);
    gm_grammar_unref(g);
    gm_ir_free(&ir);

    /* 1000 enum values that share "CA-": one head while they agree */
    json_t *vals = json_array();
    for (int i = 0; i < 1000; i++) {
        char v[16];
        snprintf(v, sizeof v, "CA-%03d", i);
        json_array_append_new(vals, json_string(v));
    }
    json_t *schema = json_pack("{so}", "enum", vals);
    char *spec;
    size_t n;
    assert_int_equal(gm_spec_json_schema(schema, &spec, &n), 0);
    json_decref(schema);
    char err[256];
    assert_int_equal(gm_spec_compile(spec, n, &vocab, NULL, &g, err, sizeof err),
                     0);
    free(spec);
    struct gm_matcher m;
    gm_matcher_init(&m, g);
    assert_int_equal(gm_matcher_accept_bytes(&m, "\"CA-4", 5), 0);
    assert_int_equal(m.hist[m.n_hist - 1].nh, 1);
    assert_int_equal(gm_matcher_accept_bytes(&m, "2", 1), 0);
    assert_int_equal(gm_matcher_accept_bytes(&m, "7\"", 2), 0);
    assert_true(gm_matcher_can_end(&m));
    gm_matcher_free(&m);
    expect(g, "\"CA-999\"", 1);
    expect(g, "\"CA-1000\"", 0);
    gm_grammar_unref(g);
}

static void test_json_strings_numbers(void **state)
{
    (void)state;
    struct gm_grammar *g = compile_spec("{\"type\":\"json_value\"}",
                                        GM_WS_INDENT_DEFAULT);
    static const char *const ok[] = {
        "\"\"", "\"plain\"", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
        "\"\\u0041\\uD7FF\\uE000\\uffff\"", "\"\\ud83d\\ude00\"",
        ("\"\xc2\xa9 \xe2\x82\xac \xed\x9f\xbf \xef\xbf\xbd \xf0\x9f\x98\x80 "
         "\xf4\x8f\xbf\xbf\""),
        "\"\x7f\"", "0", "-0", "12", "-3.25", "1e5", "1E+5", "2.5e-3", "true",
        "false", "null", "[]", "{}", "[1,\"a\",[{}]]",
        "{\"a\":{\"b\":[null,true]}}"};
    for (size_t i = 0; i < TT_COUNT(ok); i++)
        expect(g, ok[i], 1);
    static const char *const bad[] = {
        "\"\\ud800\"",          /* lone high surrogate */
        "\"\\udc00\"",          /* lone low surrogate */
        "\"\\ud83d\\u0041\"",   /* high then non-low */
        "\"\\x\"", "\"\\u12\"", "\"\x01\"", "\"\t\"", "\"\n\"",
        "\"\xc0\xaf\"",         /* overlong */
        "\"\xe0\x80\xaf\"",     /* overlong */
        "\"\xed\xa0\x80\"",     /* UTF-8 surrogate */
        "\"\xf4\x90\x80\x80\"", /* above U+10FFFF */
        "\"\x80\"", "\"\xff\"", "01", "1.", ".5", "-", "1e", "+1", "tru",
        "nulll", "[1,]", "{\"a\"}", "{\"a\":1,}", "'a'", "\"open"};
    for (size_t i = 0; i < TT_COUNT(bad); i++)
        expect(g, bad[i], 0);
    gm_grammar_unref(g);
}

static void test_json_whitespace(void **state)
{
    (void)state;
    /* pretty: a gap is empty, one space, or a newline and an indent */
    struct gm_grammar *g = compile_spec(
        "{\"type\":\"json_value\",\"whitespace\":\"pretty\"}",
        GM_WS_INDENT_DEFAULT);
    char text[256];
    expect(g, " [ 1 , 2 ] ", 1);
    expect(g, "{\n  \"a\": [\n    1\n  ]\n}\n", 1);
    expect(g, "[\n\t\t1]", 1);
    expect(g, "[  1]", 0);     /* two spaces: one space or a newline */
    expect(g, "[\n\n1]", 0);   /* one newline per gap */
    expect(g, "[\r\n1]", 0);
    /* at most 20 spaces or tabs after the newline */
    snprintf(text, sizeof text, "[\n%20s1]", "");
    expect(g, text, 1);
    snprintf(text, sizeof text, "[\n%21s1]", "");
    expect(g, text, 0);
    gm_grammar_unref(g);

    /* compact, the default: one optional space after ':' and ',' only */
    g = compile_spec("{\"type\":\"json_value\"}", GM_WS_INDENT_DEFAULT);
    expect(g, "[1,{\"a\":null}]", 1);
    expect(g, "[1, {\"a\": null}]", 1);
    expect(g, "[1,  2]", 0);
    expect(g, "[ 1]", 0);
    expect(g, "[1 ]", 0);
    expect(g, "{\"a\" :1}", 0);
    expect(g, " 1", 0);
    expect(g, "1 ", 0);
    expect(g, "[1,\n2]", 0);
    gm_grammar_unref(g);

    /* none: no whitespace at all (also ws_indent < 0) */
    g = compile_spec("{\"type\":\"json_value\",\"whitespace\":\"none\"}",
                     GM_WS_INDENT_DEFAULT);
    expect(g, "[1,{\"a\":null}]", 1);
    expect(g, "[1, 2]", 0);
    gm_grammar_unref(g);
    g = compile_spec("{\"type\":\"json_value\",\"whitespace\":\"pretty\"}", -1);
    expect(g, "[1,2]", 1);
    expect(g, "[1, 2]", 0);
    gm_grammar_unref(g);

    /* free: any JSON whitespace, at most ws_indent characters a gap */
    g = compile_spec("{\"type\":\"json_value\",\"whitespace\":\"free\"}", 4);
    expect(g, "\r\n[\t 1 ,\n\n2]  ", 1);
    expect(g, "[     1]", 0);
    gm_grammar_unref(g);

    g = compile_spec("{\"type\":\"json_object\"}", GM_WS_INDENT_DEFAULT);
    expect(g, "{}", 1);
    expect(g, "[]", 0);
    expect(g, "1", 0);
    gm_grammar_unref(g);

    /* a policy the engine does not know is refused */
    struct gm_grammar *bad = NULL;
    char err[256];
    const char *spec = "{\"type\":\"json_value\",\"whitespace\":\"wide\"}";
    assert_int_equal(gm_spec_compile(spec, strlen(spec), &vocab, NULL, &bad,
                                     err, sizeof err),
                     TG_EFORMAT);
    assert_non_null(strstr(err, "whitespace"));
}

static void test_matcher_eos_rollback_copy(void **state)
{
    (void)state;
    struct gm_grammar *g = compile_spec(
        "{\"type\":\"json_value\",\"whitespace\":\"pretty\"}",
        GM_WS_INDENT_DEFAULT);
    struct gm_matcher m, c;
    uint32_t a[(N_IDS + 31) / 32], b[(N_IDS + 31) / 32];
    size_t W = TT_COUNT(a);
    assert_int_equal(gm_matcher_init(&m, g), 0);
    /* EOS only where the document may end; the special token never */
    assert_int_equal(gm_matcher_accept_token(&m, ID_EOS), TG_EINVAL);
    assert_int_equal(gm_matcher_accept_token(&m, ID_SPECIAL), TG_EINVAL);
    assert_int_equal(gm_matcher_accept_token(&m, N_IDS), TG_EINVAL);
    assert_int_equal(gm_matcher_fill_mask(&m, a, W), 0);
    assert_false(a[ID_EOS >> 5] & (1u << (ID_EOS & 31)));
    assert_false(a[ID_SPECIAL >> 5] & (1u << (ID_SPECIAL & 31)));
    assert_int_equal(gm_matcher_min_bytes_left(&m), 1);
    assert_int_equal(gm_matcher_fill_mask(&m, a, W - 1), TG_EINVAL);

    assert_int_equal(gm_matcher_accept_token(&m, '['), 0);
    assert_int_equal(gm_matcher_min_bytes_left(&m), 1); /* "]" */
    assert_int_equal(gm_matcher_accept_token(&m, 256 + 0), 0); /* true */
    assert_int_equal(gm_matcher_fill_mask(&m, a, W), 0);
    /* a copy goes its own way */
    assert_int_equal(gm_matcher_copy(&c, &m), 0);
    assert_int_equal(gm_matcher_accept_token(&c, ']'), 0);
    assert_true(gm_matcher_can_end(&c));
    assert_int_equal(gm_matcher_min_bytes_left(&c), 0);
    assert_int_equal(gm_matcher_fill_mask(&c, b, W), 0);
    assert_true(b[ID_EOS >> 5] & (1u << (ID_EOS & 31)));
    assert_false(gm_matcher_can_end(&m));
    /* rejected tokens leave the state alone */
    assert_int_equal(gm_matcher_accept_token(&m, '}'), TG_EINVAL);
    assert_int_equal(gm_matcher_accept_bytes(&m, ",1,2", 4), 0);
    assert_int_equal(gm_matcher_n_accepted(&m), 3);
    assert_int_equal(gm_matcher_rollback(&m, 1), 0);
    assert_int_equal(gm_matcher_fill_mask(&m, b, W), 0);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(gm_matcher_rollback(&m, 3), TG_ERANGE);
    assert_int_equal(gm_matcher_rollback(&m, 2), 0);
    assert_int_equal(gm_matcher_n_accepted(&m), 0);
    /* EOS ends it: nothing after */
    assert_int_equal(gm_matcher_accept_token(&c, ID_EOS), 0);
    assert_true(gm_matcher_is_finished(&c));
    assert_int_equal(gm_matcher_accept_token(&c, ' '), TG_EDONE);
    assert_int_equal(gm_matcher_fill_mask(&c, b, W), TG_EDONE);
    assert_int_equal(tt_mask_count(b, W), 0);
    assert_int_equal(gm_matcher_rollback(&c, 1), 0);
    assert_false(gm_matcher_is_finished(&c));
    gm_matcher_reset(&c);
    assert_int_equal(gm_matcher_n_accepted(&c), 0);
    gm_matcher_free(&c);
    gm_matcher_free(&m);

    /* a document that cannot go on is finished before EOS */
    gm_grammar_unref(g);
    g = compile_spec("{\"type\":\"json_value\"}", -1);
    gm_matcher_init(&m, g);
    assert_int_equal(gm_matcher_accept_bytes(&m, "[1]", 3), 0);
    assert_true(gm_matcher_is_finished(&m));
    assert_int_equal(gm_matcher_fill_mask(&m, a, W), 0);
    assert_int_equal(tt_mask_count(a, W), 1);
    gm_matcher_free(&m);
    gm_grammar_unref(g);
}

static void test_limits(void **state)
{
    (void)state;
    struct gm_limits lim;
    struct gm_grammar *g = NULL;
    char err[256];
    const char *spec = "{\"type\":\"json_schema\",\"schema\":{\"type\":"
                       "\"string\",\"maxLength\":200}}";
    gm_limits_default(&lim);
    lim.max_nodes = 1000;
    assert_int_equal(gm_spec_compile(spec, strlen(spec), &vocab, &lim, &g, err,
                                     sizeof err),
                     TG_ETOOBIG);
    assert_non_null(strstr(err, "limit"));
    gm_limits_default(&lim);
    lim.max_compile_s = 1e-9;
    assert_int_equal(gm_spec_compile(spec, strlen(spec), &vocab, &lim, &g, err,
                                     sizeof err),
                     TG_ETIMEDOUT);
    gm_limits_default(&lim);
    lim.max_spec_bytes = 10;
    assert_int_equal(gm_spec_compile(spec, strlen(spec), &vocab, &lim, &g, err,
                                     sizeof err),
                     TG_ETOOBIG);
    gm_limits_default(&lim);
    lim.max_cache_bytes = 1000;
    assert_int_equal(gm_spec_compile(spec, strlen(spec), &vocab, &lim, &g, err,
                                     sizeof err),
                     TG_ETOOBIG);
    assert_non_null(strstr(err, "token-mask caches"));
    gm_limits_default(&lim);
    lim.max_exprs = 50;
    assert_int_equal(gm_spec_compile(spec, strlen(spec), &vocab, &lim, &g, err,
                                     sizeof err),
                     TG_ETOOBIG);
    assert_null(g);

    /* expressions nested deeper than the compiler recurses are refused */
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    int32_t e = gm_ir_str(&ir, "x");
    for (int i = 0; i < 25000; i++)
        e = gm_ir_seq2(&ir, gm_ir_str(&ir, "y"), gm_ir_alt2(&ir, e, gm_ir_str(&ir, "z")));
    int32_t r = gm_ir_rule(&ir, "deep");
    gm_ir_rule_define(&ir, r, e);
    gm_ir_root_set(&ir, r);
    assert_int_equal(gm_grammar_compile_ir(&ir, &vocab, NULL, &g, err, sizeof err),
                     TG_ETOOBIG);
    assert_non_null(strstr(err, "nested too deeply"));
    gm_ir_free(&ir);
}

/* Random walks over the synthetic vocabulary: the fast mask equals the
 * oracle's at every step, and every token it allows is accepted. */
static void walk_compare(struct gm_grammar *g, uint64_t seed, int steps,
                         double bias)
{
    struct tt_gsampler s;
    struct tt_xrng r = {seed};
    struct gm_matcher m;
    uint32_t a[(N_IDS + 31) / 32], b[(N_IDS + 31) / 32];
    char diff[1024];
    assert_int_equal(tt_gsampler_init(&s, &vocab), 0);
    assert_int_equal(gm_matcher_init(&m, g), 0);
    for (int i = 0; i < steps; i++) {
        assert_int_equal(gm_matcher_fill_mask(&m, a, TT_COUNT(a)), 0);
        assert_int_equal(gm_matcher_fill_mask_naive(&m, b, TT_COUNT(b)), 0);
        if (tt_mask_diff(&vocab, a, b, TT_COUNT(a), diff, sizeof diff) != 0)
            fail_msg("step %d: %s", i, diff);
        int32_t id = tt_gsampler_pick(&s, a, bias, &r);
        assert_true(id >= 0);
        assert_int_equal(gm_matcher_accept_token(&m, id), 0);
        if (gm_matcher_is_finished(&m)) {
            if (!(vocab.kind[id] == GM_TOK_EOS))
                assert_int_equal(gm_matcher_accept_token(&m, ID_EOS), 0);
            gm_matcher_reset(&m);
        }
    }
    gm_matcher_free(&m);
    tt_gsampler_free(&s);
}

static void test_fast_mask_equals_oracle(void **state)
{
    (void)state;
    static const char *const specs[] = {
        "{\"type\":\"json_value\"}",
        "{\"type\":\"json_schema\",\"schema\":{\"anyOf\":[{\"type\":\"object\","
        "\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3},\"b\":{"
        "\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}},{\"type\":"
        "\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"$ref\":"
        "\"#\"}}}]}}",
        "{\"type\":\"json_schema\",\"schema\":{\"type\":\"array\",\"items\":{"
        "\"enum\":[\"a\",\"ab\",\"abc\",1,12,[],{}]},\"minItems\":2,"
        "\"maxItems\":4}}",
        "{\"type\":\"tool_calls\",\"format\":{\"begin\":\"<call>{\\\"name\\\":"
        " \",\"middle\":\", \\\"args\\\": \",\"end\":\"}</call>\",\"sep\":\"\\n"
        "\"},\"max_calls\":3,\"tools\":[{\"name\":\"a\"},{\"name\":\"b\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":"
        "\"string\"}},\"required\":[\"x\"]}}]}",
    };
    for (size_t i = 0; i < TT_COUNT(specs); i++) {
        for (int ws = -1; ws <= 2; ws += 3) {
            struct gm_grammar *g = compile_spec(specs[i], ws);
            walk_compare(g, 1000 + i, 300, 0.0);
            walk_compare(g, 2000 + i, 300, 3.0);
            gm_grammar_unref(g);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ir_build_and_print),
        cmocka_unit_test(test_ir_sticky_errors),
        cmocka_unit_test(test_left_recursion_refused),
        cmocka_unit_test(test_productivity),
        cmocka_unit_test(test_nullable_calls),
        cmocka_unit_test(test_literal_trie),
        cmocka_unit_test(test_json_strings_numbers),
        cmocka_unit_test(test_json_whitespace),
        cmocka_unit_test(test_matcher_eos_rollback_copy),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_fast_mask_equals_oracle),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
