/* test_grammar_format.c — JSON Schema formats as string languages
 * (common/grammar/gm_format.h) against the JSON-Schema-Test-Suite's
 * optional/format tests (draft 2020-12, vendored in
 * data/json-schema-test-suite): every string instance the suite marks
 * invalid is refused by the compiled grammar (soundness), and the valid
 * ones refused are exactly the documented subsets, counted per format
 * (a change in either direction fails). Also: formats combined with a
 * pattern and lengths, unknown formats, random walks of each format's
 * grammar over a byte vocabulary whose results are checked by
 * independent code (dates, times and IPv4 parsed here), and the token
 * masks of a format grammar over the real Qwen3 vocabulary against the
 * brute-force oracle. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_format.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_regex.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_grammar.h"

#if defined(__SANITIZE_ADDRESS__)
#define N_WALKS 40
#define MASK_STEPS 4
#else
#define N_WALKS 400
#define MASK_STEPS 24
#endif

static struct gm_vocab bytes_vocab, qwen;

static int setup(void **state)
{
    (void)state;
    return tt_grammar_byte_vocab(&bytes_vocab, NULL, 0) != 0 ||
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

static struct gm_grammar *format_grammar(const char *name, uint32_t lo,
                                         uint32_t hi, const struct gm_vocab *v)
{
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    char err[300];
    int32_t r = gm_format_json_string(&ir, name, strlen(name), lo, hi, err,
                                      sizeof err);
    if (r < 0)
        fail_msg("format %s: %s", name, err);
    struct gm_grammar *g = tt_grammar_compile_rule(&ir, r, v);
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

/* The valid instances each format refuses: its documented subset. */
static const struct {
    const char *name;
    int valid_refused;
} expect[] = {
    {"date-time", 0},     {"date", 0},          {"time", 0},
    {"duration", 0},      {"email", 8}, /* the addresses common clients' own checks
                                   refuse: quoted local parts, IP literals,
                                   tildes and other RFC 5321 atext */
    {"uuid", 0},          {"ipv4", 0},          {"ipv6", 0},
    {"hostname", 16}, /* 15 xn-- A-labels; one of 67 characters */
    {"uri", 0},           {"uri-reference", 0}, {"iri", 5}, /* non-ASCII IRIs */
    {"iri-reference", 5}, {"json-pointer", 0},  {"relative-json-pointer", 0},
};

static void test_suite_formats(void **state)
{
    (void)state;
    const char *data = getenv("TANGRAM_DATA");
    int total_valid = 0, total_refused = 0, total_invalid = 0;
    for (size_t f = 0; f < TT_COUNT(expect); f++) {
        char path[1024];
        snprintf(path, sizeof path,
                 "%s/json-schema-test-suite/tests/draft2020-12/optional/"
                 "format/%s.json",
                 data != NULL ? data : "data", expect[f].name);
        json_error_t je;
        json_t *doc = json_load_file(path, JSON_ALLOW_NUL, &je);
        if (doc == NULL)
            fail_msg("cannot read %s (TANGRAM_DATA): %s", path, je.text);
        struct gm_grammar *g = format_grammar(expect[f].name, 0, GM_REPEAT_INF,
                                              &bytes_vocab);
        int valid = 0, refused = 0, invalid = 0;
        char refused_list[2048] = "";
        size_t i, k;
        json_t *grp, *t;
        json_array_foreach(doc, i, grp)
        {
            json_array_foreach(json_object_get(grp, "tests"), k, t)
            {
                const json_t *x = json_object_get(t, "data");
                if (!json_is_string(x))
                    continue;
                char *enc = json_dumps(x, JSON_ENCODE_ANY);
                int got = accepts(g, enc, strlen(enc));
                if (json_is_true(json_object_get(t, "valid"))) {
                    valid++;
                    if (!got) {
                        refused++;
                        size_t l = strlen(refused_list);
                        snprintf(refused_list + l, sizeof refused_list - l,
                                 " %.60s", enc);
                    }
                } else {
                    invalid++;
                    if (got)
                        fail_msg("format %s accepts %s, which the suite "
                                 "marks invalid (%s)",
                                 expect[f].name, enc,
                                 json_string_value(
                                     json_object_get(t, "description")));
                }
                free(enc);
            }
        }
        print_message("format %-22s %3d valid (%d refused:%s), %3d invalid "
                      "(all refused)\n",
                      expect[f].name, valid, refused, refused_list, invalid);
        if (refused != expect[f].valid_refused)
            fail_msg("format %s refuses %d valid instances, documented %d",
                     expect[f].name, refused, expect[f].valid_refused);
        total_valid += valid;
        total_refused += refused;
        total_invalid += invalid;
        gm_grammar_unref(g);
        json_decref(doc);
    }
    print_message("all formats: %d valid, %d of them refused; %d invalid, "
                  "none accepted\n",
                  total_valid, total_refused, total_invalid);
}

/* ---- independent checks of generated values ------------------------------- */

static int digits(const char *s, int n)
{
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return -1;
    int v = 0;
    for (int i = 0; i < n; i++)
        v = v * 10 + (s[i] - '0');
    return v;
}

static int date_ok(const char *s, size_t n)
{
    if (n != 10 || s[4] != '-' || s[7] != '-')
        return 0;
    int y = digits(s, 4), m = digits(s + 5, 2), d = digits(s + 8, 2);
    if (y < 0 || m < 1 || m > 12 || d < 1)
        return 0;
    static const int dim[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= dim[m - 1] + (m == 2 && leap);
}

/* RFC 3339 full-time; a leap second only at 23:59 UTC. */
static int time_ok(const char *s, size_t n)
{
    if (n < 9 || s[2] != ':' || s[5] != ':')
        return 0;
    int h = digits(s, 2), mi = digits(s + 3, 2), se = digits(s + 6, 2);
    if (h < 0 || h > 23 || mi < 0 || mi > 59 || se < 0 || se > 60)
        return 0;
    size_t i = 8;
    if (s[i] == '.') {
        size_t j = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == j)
            return 0;
    }
    int off = 0;
    if (i + 1 == n && (s[i] == 'Z' || s[i] == 'z')) {
        off = 0;
    } else if (i + 6 == n && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':') {
        int oh = digits(s + i + 1, 2), om = digits(s + i + 4, 2);
        if (oh < 0 || oh > 23 || om < 0 || om > 59)
            return 0;
        off = (s[i] == '+' ? 1 : -1) * (oh * 60 + om);
    } else {
        return 0;
    }
    if (se == 60) {
        int utc = ((h * 60 + mi - off) % 1440 + 1440) % 1440;
        return utc == 23 * 60 + 59;
    }
    return 1;
}

static int ipv4_ok(const char *s, size_t n)
{
    int parts = 0;
    size_t i = 0;
    while (i <= n) {
        size_t j = i;
        while (j < n && s[j] != '.')
            j++;
        if (j == i || j - i > 3 || (j - i > 1 && s[i] == '0'))
            return 0;
        int v = digits(s + i, (int)(j - i));
        if (v < 0 || v > 255)
            return 0;
        parts++;
        i = j + 1;
    }
    return parts == 4;
}

static int check_value(const char *name, const char *s, size_t n)
{
    if (strcmp(name, "date") == 0)
        return date_ok(s, n);
    if (strcmp(name, "time") == 0)
        return time_ok(s, n);
    if (strcmp(name, "date-time") == 0)
        return n > 11 && (s[10] == 'T' || s[10] == 't') && date_ok(s, 10) &&
               time_ok(s + 11, n - 11);
    if (strcmp(name, "ipv4") == 0)
        return ipv4_ok(s, n);
    return 1;
}

/* Random walks over the bytes: a decoded value must pass check_value and
 * its length the range. */
static void walk_format(const char *name, uint32_t lo, uint32_t hi,
                        uint64_t seed)
{
    struct gm_grammar *g = format_grammar(name, lo, hi, &bytes_vocab);
    size_t W = gm_vocab_mask_words(&bytes_vocab);
    uint32_t *mask = tt_xmalloc(W * sizeof(*mask));
    struct tt_xrng r = {seed};
    int finished = 0;
    for (int w = 0; w < N_WALKS; w++) {
        struct gm_matcher m;
        assert_int_equal(gm_matcher_init(&m, g), 0);
        char doc[512];
        size_t n = 0;
        int done = 0;
        while (n < 300) {
            assert_int_equal(gm_matcher_fill_mask(&m, mask, W), 0);
            if (gm_matcher_can_end(&m) && tt_xrng_int(&r, 0, 7) == 0) {
                done = 1;
                break;
            }
            int32_t ids[256];
            int k = 0;
            for (int32_t id = 0; id < 256; id++)
                if ((mask[id >> 5] >> (id & 31)) & 1)
                    ids[k++] = id;
            if (k == 0) {
                done = gm_matcher_can_end(&m);
                break;
            }
            int32_t id = ids[tt_xrng_int(&r, 0, k - 1)];
            doc[n++] = (char)id;
            assert_int_equal(gm_matcher_accept_token(&m, id), 0);
        }
        gm_matcher_free(&m);
        if (!done)
            continue;
        finished++;
        json_t *v = json_loadb(doc, n, JSON_DECODE_ANY, NULL);
        if (!json_is_string(v))
            fail_msg("%s: the walk wrote %.*s", name, (int)n, doc);
        const char *s = json_string_value(v);
        size_t sl = json_string_length(v), cps = 0;
        for (size_t i = 0; i < sl; i++)
            cps += ((unsigned char)s[i] & 0xC0) != 0x80;
        if (!check_value(name, s, sl) || cps < lo || cps > hi)
            fail_msg("format %s [%u, %u] generated an invalid value %s", name,
                     lo, hi, s);
        json_decref(v);
    }
    assert_true(finished > N_WALKS / 4);
    free(mask);
    gm_grammar_unref(g);
}

static void test_walks(void **state)
{
    (void)state;
    walk_format("date", 0, GM_REPEAT_INF, 1);
    walk_format("time", 0, GM_REPEAT_INF, 2);
    walk_format("date-time", 0, GM_REPEAT_INF, 3);
    walk_format("date-time", 20, 24, 4);
    walk_format("ipv4", 0, GM_REPEAT_INF, 5);
    walk_format("ipv4", 0, 9, 6);
    /* the rest: only well-formed JSON strings of their lengths */
    walk_format("email", 0, 30, 7);
    walk_format("hostname", 0, GM_REPEAT_INF, 8);
    walk_format("uri", 0, 40, 9);
    walk_format("ipv6", 0, GM_REPEAT_INF, 10);
    walk_format("duration", 0, GM_REPEAT_INF, 11);
}

static void test_combined_and_unknown(void **state)
{
    (void)state;
    /* format "email" with a pattern (a company's domain) and maxLength */
    struct gm_rx_item it[2];
    assert_int_equal(gm_format_item("email", 5, &it[0]), 0);
    it[1] = (struct gm_rx_item){
        .text = "@example\\.com$", .len = 14, .kind = GM_RX_SEARCH};
    struct gm_ir ir;
    gm_ir_init(&ir, 0);
    char err[300];
    int32_t r = gm_regex_json_string_items(&ir, it, 2, 0, 24, err, sizeof err);
    assert_true(r >= 0);
    struct gm_grammar *g = tt_grammar_compile_rule(&ir, r, &bytes_vocab);
    gm_ir_free(&ir);
    assert_true(accepts(g, "\"ann@example.com\"", 17));
    assert_false(accepts(g, "\"ann@example.org\"", 17));
    assert_false(accepts(g, "\"ann.@example.com\"", 18));
    assert_false(accepts(g, "\"anne.marie.long@example.com\"", 29));
    gm_grammar_unref(g);
    /* unknown: nothing written, nothing recorded */
    gm_ir_init(&ir, 0);
    assert_int_equal(gm_format_json_string(&ir, "regex", 5, 0, GM_REPEAT_INF,
                                           err, sizeof err),
                     TG_ENOTFOUND);
    assert_int_equal(ir.n_expr, 0);
    assert_int_equal(gm_ir_error(&ir, NULL, 0), 0);
    assert_null(gm_format_find("Date", 4));
    /* a length no value has: the message names the format */
    r = gm_format_json_string(&ir, "uuid", 4, 0, 20, err, sizeof err);
    assert_int_equal(r, TG_EINVAL);
    assert_non_null(strstr(err, "0 to 20"));
    gm_ir_free(&ir);
    gm_ir_init(&ir, 0);
    assert_true(gm_format_json_string(&ir, "ipv6", 4, 0, 0, err, sizeof err) ==
                TG_EINVAL);
    gm_ir_free(&ir);
}

static void test_masks_qwen3(void **state)
{
    (void)state;
    static const char *const names[] = {"date-time", "email", "uuid"};
    size_t W = gm_vocab_mask_words(&qwen);
    uint32_t *a = tt_xmalloc(W * sizeof(*a)), *b = tt_xmalloc(W * sizeof(*b));
    char diff[1024];
    for (size_t f = 0; f < TT_COUNT(names); f++) {
        struct gm_grammar *g = format_grammar(names[f], 0, GM_REPEAT_INF,
                                              &qwen);
        struct tt_gsampler s;
        struct tt_xrng r = {100 + f};
        assert_int_equal(tt_gsampler_init(&s, &qwen), 0);
        struct gm_matcher m;
        assert_int_equal(gm_matcher_init(&m, g), 0);
        for (int i = 0; i < MASK_STEPS; i++) {
            assert_int_equal(gm_matcher_fill_mask(&m, a, W), 0);
            assert_int_equal(gm_matcher_fill_mask_naive(&m, b, W), 0);
            if (tt_mask_diff(&qwen, a, b, W, diff, sizeof diff) != 0)
                fail_msg("%s step %d: %s", names[f], i, diff);
            int32_t id = tt_gsampler_pick(&s, a, 0.0, &r);
            assert_true(id >= 0);
            assert_int_equal(gm_matcher_accept_token(&m, id), 0);
            if (qwen.kind[id] == GM_TOK_EOS)
                break;
        }
        gm_matcher_free(&m);
        tt_gsampler_free(&s);
        gm_grammar_unref(g);
    }
    free(a);
    free(b);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_suite_formats),
        cmocka_unit_test(test_combined_and_unknown),
        cmocka_unit_test(test_walks),
        cmocka_unit_test(test_masks_qwen3),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
