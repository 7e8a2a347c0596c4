/* test_tokenizer_synth.c — the byte-level BPE tokenizer
 * (common/tok/tok_tokenizer.h) on small synthetic tokenizer.json files: merge
 * rank order, split behaviours, added-token options, normalizer and prefix
 * space, malformed and fuzzed files, bad paths and side configs. The
 * shipped tokenizers are tested in test_tokenizer.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "tests/support/tt_support.h"
#include "tests/support/tt_tok.h"

static char errbuf[512];
static char tmpdir[256];

static int group_setup(void **state)
{
    (void)state;
    return tt_tmpdir_make("tg_tok_test.", tmpdir, sizeof tmpdir);
}

static int group_teardown(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

/* --------------------------------------------------- synthetic tokenizers */

/* A tokenizer.json: the 256 byte tokens (id = byte), then `extra` tokens
 * (ids 256..), the given merges, one Split step + ByteLevel, ByteLevel
 * decoder. Tests edit the returned document. */
static json_t *synth_doc(const char *const *extra, const char *const *merges,
                         const char *regex, const char *behavior)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[3] = {0};
        tt_tok_byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    int id = 256;
    for (; extra && *extra; extra++)
        json_object_set_new(vocab, *extra, json_integer(id++));
    json_t *m = json_array();
    for (; merges && *merges; merges++)
        json_array_append_new(m, json_string(*merges));
    return json_pack("{s:n, s:[], s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, "
                     "{s:s, s:b, s:b, s:b}]}, s:n, s:{s:s}, "
                     "s:{s:s, s:o, s:o, s:b}}",
                     "version", "added_tokens", "normalizer", "pre_tokenizer",
                     "type", "Sequence", "pretokenizers", "type", "Split",
                     "pattern", "Regex", regex, "behavior", behavior, "invert",
                     0, "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 0, "use_regex", 0, "post_processor",
                     "decoder", "type", "ByteLevel", "model", "type", "BPE",
                     "vocab", vocab, "merges", m, "ignore_merges", 0);
}

static int load_doc(json_t *doc, struct tok_tokenizer *tok)
{
    char path[512];
    snprintf(path, sizeof path, "%s/synth.json", tmpdir);
    assert_int_equal(json_dump_file(doc, path, 0), 0);
    json_decref(doc);
    errbuf[0] = '\0';
    return tok_tokenizer_load(tok, path, errbuf, sizeof errbuf);
}

/* Encodes s and compares the tokens' strings to want (NULL-terminated). */
static void expect_tokens(const struct tok_tokenizer *tok, const char *s,
                          unsigned flags, const char *const *want)
{
    struct tok_ids ids = {0};
    tt_tok_encode(tok, s, flags, &ids);
    size_t n = 0;
    while (want[n])
        n++;
    if (ids.n != n)
        fprintf(stderr, "'%s': %zu tokens, want %zu\n", s, ids.n, n);
    assert_int_equal(ids.n, n);
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *t = tok_id_to_token(tok, ids.v[i], &len);
        assert_non_null(t);
        assert_int_equal(len, strlen(want[i]));
        assert_memory_equal(t, want[i], len);
    }
    tok_ids_free(&ids);
}

static void test_bpe_rank_order(void **state)
{
    (void)state;
    static const char *extra[] = {"ab", "bc", "abc", "aa", "aaa", NULL};
    struct tok_tokenizer tok;
    /* "b c" outranks "a b": abc -> a bc -> abc. */
    static const char *m1[] = {"b c", "a b", "a bc", "a a", NULL};
    assert_int_equal(
        load_doc(synth_doc(extra, m1, "\\s+|\\S+", "Isolated"), &tok), 0);
    expect_tokens(&tok, "abc", 0, (const char *[]){"abc", NULL});
    /* Equal pairs merge leftmost first: aaa -> aa a. */
    expect_tokens(&tok, "aaa", 0, (const char *[]){"aa", "a", NULL});
    expect_tokens(&tok, "aaaa", 0, (const char *[]){"aa", "aa", NULL});
    tok_tokenizer_free(&tok);
    /* Without "a bc" the word stops at a + bc even though "ab" exists. */
    static const char *m2[] = {"b c", "a b", NULL};
    assert_int_equal(
        load_doc(synth_doc(extra, m2, "\\s+|\\S+", "Isolated"), &tok), 0);
    expect_tokens(&tok, "abc", 0, (const char *[]){"a", "bc", NULL});
    expect_tokens(&tok, "abab", 0, (const char *[]){"ab", "ab", NULL});
    tok_tokenizer_free(&tok);
    /* ignore_merges: a word that is a token is kept whole. */
    json_t *doc = synth_doc(extra, m2, "\\s+|\\S+", "Isolated");
    json_object_set_new(json_object_get(doc, "model"), "ignore_merges",
                        json_true());
    assert_int_equal(load_doc(doc, &tok), 0);
    expect_tokens(&tok, "abc", 0, (const char *[]){"abc", NULL});
    expect_tokens(&tok, "aaa", 0, (const char *[]){"aaa", NULL});
    expect_tokens(&tok, "abcab", 0, (const char *[]){"a", "bc", "ab", NULL});
    tok_tokenizer_free(&tok);
}

static void test_split_behaviors(void **state)
{
    (void)state;
    static const char *extra[] = {"a-", "-b", NULL};
    static const char *merges[] = {"a -", "- b", NULL};
    static const struct {
        const char *behavior;
        const char *want[4];
    } cases[] = {
        {"Isolated", {"a", "-", "b", NULL}},
        {"Removed", {"a", "b", NULL}},
        {"MergedWithPrevious", {"a-", "b", NULL}},
        {"MergedWithNext", {"a", "-b", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct tok_tokenizer tok;
        assert_int_equal(
            load_doc(synth_doc(extra, merges, "-", cases[i].behavior), &tok),
            0);
        expect_tokens(&tok, "a-b", 0, cases[i].want);
        tok_tokenizer_free(&tok);
    }
    /* invert: the regex names the pieces to keep apart from the rest. */
    json_t *doc = synth_doc(extra, merges, "[ab]", "Isolated");
    json_t *steps =
        json_object_get(json_object_get(doc, "pre_tokenizer"), "pretokenizers");
    json_object_set_new(json_array_get(steps, 0), "invert", json_true());
    struct tok_tokenizer tok;
    assert_int_equal(load_doc(doc, &tok), 0);
    expect_tokens(&tok, "a-b", 0, (const char *[]){"a", "-", "b", NULL});
    tok_tokenizer_free(&tok);
}

static void test_added_token_options(void **state)
{
    (void)state;
    static const char *merges[] = {NULL};
    json_t *doc = synth_doc(NULL, merges, "\\s+|\\S+", "Isolated");
    json_t *added = json_pack(
        "[{s:i, s:s, s:b, s:b, s:b, s:b, s:b},"
        " {s:i, s:s, s:b, s:b, s:b, s:b, s:b},"
        " {s:i, s:s, s:b, s:b, s:b, s:b, s:b}]",
        "id", 300, "content", "<m>", "special", 1, "lstrip", 1, "rstrip", 1,
        "single_word", 0, "normalized", 0, "id", 301, "content", "cat",
        "special", 0, "lstrip", 0, "rstrip", 0, "single_word", 1, "normalized",
        0, "id", 302, "content", "<m>x", "special", 0, "lstrip", 0, "rstrip", 0,
        "single_word", 0, "normalized", 0);
    json_object_set_new(doc, "added_tokens", added);
    /* A template that puts <m> before and cat after. */
    json_object_set_new(
        doc, "post_processor",
        json_pack("{s:s, s:[{s:{s:s}}, {s:{s:s}}, {s:{s:s}}], s:{s:{s:[i]}, "
                  "s:{s:[i]}}}",
                  "type", "TemplateProcessing", "single", "SpecialToken", "id",
                  "<m>", "Sequence", "id", "A", "SpecialToken", "id", "cat",
                  "special_tokens", "<m>", "ids", 300, "cat", "ids", 301));
    struct tok_tokenizer tok;
    assert_int_equal(load_doc(doc, &tok), 0);
    assert_int_equal(tok_vocab_size(&tok), 303);
    /* lstrip/rstrip swallow the spaces around <m>. */
    expect_tokens(&tok, "x  <m>  y", 0,
                  (const char *[]){"x", "<m>", "y", NULL});
    /* longest match wins: <m>x over <m>. */
    expect_tokens(&tok, "<m>x", 0, (const char *[]){"<m>x", NULL});
    /* single_word: cat alone matches, inside a word it does not. */
    expect_tokens(&tok, "cat", 0, (const char *[]){"cat", NULL});
    expect_tokens(&tok, "a cat.", 0,
                  (const char *[]){"a", "\xC4\xA0", "cat", ".", NULL});
    expect_tokens(&tok, "cats", 0, (const char *[]){"c", "a", "t", "s", NULL});
    /* SPLIT_SPECIAL leaves <m> as text but still finds cat. */
    expect_tokens(&tok, "<m> cat", TOK_ENCODE_SPLIT_SPECIAL,
                  (const char *[]){"<", "m", ">", "\xC4\xA0", "cat", NULL});
    /* The template: prefix and suffix. */
    expect_tokens(&tok, "y", TOK_ENCODE_ADD_SPECIAL,
                  (const char *[]){"<m>", "y", "cat", NULL});
    tok_tokenizer_free(&tok);
}

static void test_normalizer_and_prefix_space(void **state)
{
    (void)state;
    static const char *extra[] = {"\xC3\x83\xC2\xA9",
                                  "\xC4\xA0"
                                  "e",
                                  NULL}; /* "Ã©" (the bytes of é), "Ġe" */
    static const char *merges[] = {"\xC3\x83 \xC2\xA9", "\xC4\xA0 e", NULL};
    json_t *doc = synth_doc(extra, merges, "\\s+|\\S+", "Isolated");
    json_object_set_new(doc, "normalizer",
                        json_pack("{s:s, s:[{s:s}]}", "type", "Sequence",
                                  "normalizers", "type", "NFC"));
    struct tok_tokenizer tok;
    assert_int_equal(load_doc(doc, &tok), 0);
    struct tok_ids a = {0}, b = {0};
    tt_tok_encode(&tok, "e\xCC\x81", 0, &a); /* e + combining acute */
    tt_tok_encode(&tok, "\xC3\xA9", 0, &b);  /* precomposed */
    assert_int_equal(a.n, 1);
    tt_tok_check_ids(&a, &b, "NFC");
    tok_tokenizer_free(&tok);
    /* GPT-2 style: ByteLevel with its own regex and a prefix space. */
    doc = synth_doc(extra, merges, "x", "Isolated");
    json_t *pt = json_pack("{s:s, s:b, s:b}", "type", "ByteLevel",
                           "add_prefix_space", 1, "use_regex", 1);
    json_object_set_new(doc, "pre_tokenizer", pt);
    assert_int_equal(load_doc(doc, &tok), 0);
    expect_tokens(&tok, "e e", 0,
                  (const char *[]){"\xC4\xA0"
                                   "e",
                                   "\xC4\xA0"
                                   "e",
                                   NULL});
    expect_tokens(&tok, " e", 0,
                  (const char *[]){"\xC4\xA0"
                                   "e",
                                   NULL});
    tt_tok_encode(&tok, "e\xCC\x81", 0, &a); /* no normalizer now: 3 bytes */
    assert_int_equal(a.n, 3);
    tok_tokenizer_free(&tok);
    tok_ids_free(&a);
    tok_ids_free(&b);
}

/* ----------------------------------------------------------- malformed */

static void expect_load_error(json_t *doc, int code, const char *what)
{
    struct tok_tokenizer tok;
    memset(&tok, 0x5a, sizeof tok);
    int rc = load_doc(doc, &tok);
    if (rc != code)
        fprintf(stderr, "%s: got %s (%s)\n", what, tg_err_name(rc), errbuf);
    assert_int_equal(rc, code);
    assert_true(errbuf[0] != '\0');
    assert_int_equal(tok.n_ids, 0); /* left zeroed */
    assert_null(tok.arena);
    tok_tokenizer_free(&tok);
}

static json_t *base(void)
{
    static const char *extra[] = {"ab", NULL};
    static const char *merges[] = {"a b", NULL};
    return synth_doc(extra, merges, "\\s+|\\S+", "Isolated");
}

/* One malformed variant of base(): member `key` of object `obj` ("" = the
 * root, "vocab" = model.vocab) set to the JSON text `value` ("-" deletes). */
static const struct bad_file {
    const char *obj, *key, *value;
    int code;
} bad_files[] = {
    {"", "model", "-", TG_EFORMAT},
    {"", "model", "[]", TG_EFORMAT},
    {"model", "type", "\"WordPiece\"", TG_EUNSUPPORTED},
    {"model", "vocab", "[\"a\"]", TG_EFORMAT},
    {"model", "vocab", "{}", TG_EFORMAT},
    {"vocab", "zz", "-3", TG_EFORMAT},
    {"vocab", "zz", "\"7\"", TG_EFORMAT},
    {"vocab", "zz", "1073741824", TG_EFORMAT},
    {"vocab", "zz", "7", TG_EFORMAT}, /* id used twice */
    {"model", "merges", "[\"a zzz\"]", TG_EFORMAT},
    {"model", "merges", "[\"ab\"]", TG_EFORMAT},
    {"model", "merges", "[\"a  b\"]", TG_EFORMAT},
    {"model", "merges", "[\"b a\"]", TG_EFORMAT}, /* "ba" not a token */
    {"model", "merges", "[[1, 2]]", TG_EFORMAT},
    {"model", "merges", "[[\"a\"]]", TG_EFORMAT},
    {"model", "merges", "\"a b\"", TG_EFORMAT},
    {"model", "byte_fallback", "true", TG_EUNSUPPORTED},
    {"model", "ignore_merges", "1", TG_EFORMAT},
    {"model", "continuing_subword_prefix", "\"##\"", TG_EUNSUPPORTED},
    {"model", "dropout", "0.1", TG_EUNSUPPORTED},
    {"model", "unk_token", "\"<unk>\"", TG_EFORMAT},
    {"", "added_tokens", "{}", TG_EFORMAT},
    {"", "added_tokens", "[{\"id\": 400}]", TG_EFORMAT},
    {"", "added_tokens", "[{\"id\": 400, \"content\": \"\"}]", TG_EFORMAT},
    {"", "added_tokens", "[{\"id\": -1, \"content\": \"<x>\"}]", TG_EFORMAT},
    {"", "added_tokens",
     "[{\"id\": 400, \"content\": \"<x>\", \"special\": \"yes\"}]", TG_EFORMAT},
    {"", "normalizer", "{\"type\": \"Lowercase\"}", TG_EUNSUPPORTED},
    {"", "normalizer", "{\"type\": 3}", TG_EFORMAT},
    {"", "normalizer", "{\"type\": \"Sequence\", \"normalizers\": 1}",
     TG_EFORMAT},
    {"", "pre_tokenizer", "null", TG_EUNSUPPORTED},
    {"", "pre_tokenizer", "{\"type\": \"Metaspace\"}", TG_EUNSUPPORTED},
    {"", "pre_tokenizer",
     "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(x\"}, "
     "\"behavior\": \"Isolated\"}",
     TG_EFORMAT},
    {"", "pre_tokenizer",
     "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}, "
     "\"behavior\": \"Contiguous\"}",
     TG_EUNSUPPORTED},
    {"", "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": 5}", TG_EFORMAT},
    {"", "pre_tokenizer",
     "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
     "\"ByteLevel\"}, {\"type\": \"Digits\"}]}",
     TG_EUNSUPPORTED}, /* a split after ByteLevel */
    {"", "decoder", "{\"type\": \"WordPiece\"}", TG_EUNSUPPORTED},
    {"", "post_processor",
     "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
     "{\"id\": \"<no>\"}}], \"special_tokens\": {}}",
     TG_EFORMAT},
    {"", "post_processor",
     "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
     "{\"id\": \"x\"}}], \"special_tokens\": {\"x\": {\"ids\": [99999]}}}",
     TG_EFORMAT},
    {"", "post_processor", "{\"type\": \"Bogus\"}", TG_EUNSUPPORTED},
};

static void test_malformed_files(void **state)
{
    (void)state;
    expect_load_error(json_array(), TG_EFORMAT, "top-level array");
    for (size_t i = 0; i < sizeof bad_files / sizeof *bad_files; i++) {
        const struct bad_file *b = &bad_files[i];
        json_t *d = base(), *o = d;
        if (strcmp(b->obj, "vocab") == 0)
            o = json_object_get(json_object_get(d, "model"), "vocab");
        else if (b->obj[0] != '\0')
            o = json_object_get(d, b->obj);
        if (strcmp(b->value, "-") == 0) {
            json_object_del(o, b->key);
        } else {
            json_t *v = json_loads(b->value, JSON_DECODE_ANY, NULL);
            assert_non_null(v);
            json_object_set_new(o, b->key, v);
        }
        char what[160];
        snprintf(what, sizeof what, "%s.%s = %s", b->obj, b->key, b->value);
        expect_load_error(d, b->code, what);
    }
}

/* A template id below the largest id but without a token (a hole in the
 * ids) is refused like one past the end: encoding would emit it (found by
 * tests/fuzz/fuzz_tokenizer.c; reproducer in
 * tests/fuzz/corpus/tokenizer/repro-template-id-hole). An id that is a
 * token still works. */
static void test_template_id_hole(void **state)
{
    (void)state;
    static const char pp[] =
        "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
        "{\"id\": \"x\"}}, {\"Sequence\": {\"id\": \"A\"}}], "
        "\"special_tokens\": {\"x\": {\"ids\": [%d]}}}";
    char text[512];
    for (int id = 299; id <= 300; id++) {
        json_t *d = base();
        /* Ids 0..256 are tokens, then a hole up to "zz" at 300. */
        json_object_set_new(
            json_object_get(json_object_get(d, "model"), "vocab"), "zz",
            json_integer(300));
        snprintf(text, sizeof text, pp, id);
        json_object_set_new(d, "post_processor", json_loads(text, 0, NULL));
        struct tok_tokenizer tok;
        int rc = load_doc(d, &tok);
        if (id == 299) {
            assert_int_equal(rc, TG_EFORMAT);
            assert_non_null(strstr(errbuf, "out of the vocabulary"));
            continue;
        }
        assert_int_equal(rc, 0);
        struct tok_ids ids = {0};
        tt_tok_encode(&tok, "ab", TOK_ENCODE_ADD_SPECIAL, &ids);
        assert_int_equal(ids.n, 2);
        assert_int_equal(ids.v[0], 300);
        assert_int_equal(ids.v[1], 256);
        tok_ids_free(&ids);
        tok_tokenizer_free(&tok);
    }
}

/* Truncated and byte-flipped versions of a valid file: loading either fails
 * cleanly or gives a tokenizer that encodes and decodes (ASan checks). */
static void test_fuzzed_files(void **state)
{
    (void)state;
    json_t *doc = base();
    json_object_set_new(doc, "added_tokens",
                        json_pack("[{s:i, s:s, s:b}]", "id", 300, "content",
                                  "<s>", "special", 1));
    char *good = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    size_t n = strlen(good);
    char *buf = malloc(n + 1), path[512];
    snprintf(path, sizeof path, "%s/fuzz.json", tmpdir);
    unsigned seed = 99;
    int loaded = 0;
    for (int trial = 0; trial < 400; trial++) {
        memcpy(buf, good, n + 1);
        size_t len = n;
        if (trial % 2 == 0) {
            len = (size_t)rand_r(&seed) % n;
        } else {
            static const char flips[] = "{}[]\",:0a\\ -9";
            buf[(size_t)rand_r(&seed) % n] =
                flips[(size_t)rand_r(&seed) % (sizeof flips - 1)];
        }
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fwrite(buf, 1, len, f);
        fclose(f);
        struct tok_tokenizer tok;
        int rc = tok_tokenizer_load(&tok, path, errbuf, sizeof errbuf);
        if (rc == 0) {
            loaded++;
            struct tok_ids ids = {0};
            struct tg_buf t = {0};
            assert_int_equal(tok_encode(&tok, NULL, "ab <s>c", 7,
                                        TOK_ENCODE_ADD_SPECIAL, &ids, errbuf,
                                        sizeof errbuf),
                             0);
            assert_int_equal(
                tok_decode(&tok, ids.v, ids.n, 0, &t, errbuf, sizeof errbuf),
                0);
            tok_ids_free(&ids);
            tg_buf_free(&t);
        } else {
            assert_true(rc == TG_EFORMAT || rc == TG_EUNSUPPORTED);
            assert_int_equal(tok.n_ids, 0);
        }
        tok_tokenizer_free(&tok);
    }
    assert_true(loaded > 0);
    free(buf);
    free(good);
}

static void write_text(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_bad_paths_and_files(void **state)
{
    (void)state;
    struct tok_tokenizer tok;
    char p[512];
    assert_int_equal(tok_tokenizer_load(&tok, "/nonexistent/tokenizer.json",
                                        errbuf, sizeof errbuf),
                     TG_ENOENT);
    snprintf(p, sizeof p, "%s/emptydir", tmpdir);
    mkdir(p, 0700);
    assert_int_equal(tok_tokenizer_load(&tok, p, errbuf, sizeof errbuf),
                     TG_ENOENT);
    static const char *junk[] = {
        "",         "{",     "{\"model\": }",
        "\x01\x02", "[1,2]", "{\"model\": {\"vocab\": {\"a\": 0, \"a\": 1}}}"};
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
        write_text("junk.json", junk[i]);
        snprintf(p, sizeof p, "%s/junk.json", tmpdir);
        assert_int_equal(tok_tokenizer_load(&tok, p, errbuf, sizeof errbuf),
                         TG_EFORMAT);
        assert_int_equal(tok.n_ids, 0);
    }
    /* A broken tokenizer_config.json next to a good file is an error too;
     * a good one sets the special ids. */
    write_text("tokenizer_config.json", "{\"bos_token\": ");
    json_t *d = base();
    assert_int_equal(load_doc(d, &tok), TG_EFORMAT);
    write_text("tokenizer_config.json",
               "{\"bos_token\": {\"content\": \"ab\"}, \"eos_token\": \"a\", "
               "\"pad_token\": null}");
    write_text("generation_config.json", "{\"eos_token_id\": [97, 256, 98]}");
    assert_int_equal(load_doc(base(), &tok), 0);
    assert_int_equal(tok.bos_id, 256);
    assert_int_equal(tok.eos_id, 97);
    assert_int_equal(tok.pad_id, -1);
    assert_int_equal(tok.n_eos, 3);
    assert_int_equal(tok.eos_ids[2], 98);
    tok_tokenizer_free(&tok);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", tmpdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/generation_config.json", tmpdir);
    unlink(p);
}

/* A directory whose path fits but whose tokenizer.json path would not
 * (the loader's buffers hold 4096 bytes) is refused saying so; it used to
 * look for the cut path and report a missing file. */
static void test_path_too_long(void **state)
{
    (void)state;
    char *p = malloc(8192);
    assert_non_null(p);
    int n = snprintf(p, 8192, "%s", tmpdir);
    char seg[201];
    memset(seg, 'd', 200);
    seg[200] = '\0';
    while (n + 201 < 4080) {
        n += snprintf(p + n, (size_t)(8192 - n), "/%s", seg);
        assert_int_equal(mkdir(p, 0700), 0);
    }
    int pad = 4090 - n - 1; /* the directory's path: 4090 bytes */
    p[n] = '/';
    memset(p + n + 1, 'e', (size_t)pad);
    p[4090] = '\0';
    assert_int_equal(mkdir(p, 0700), 0);
    struct tok_tokenizer tok;
    assert_int_equal(tok_tokenizer_load(&tok, p, errbuf, sizeof errbuf),
                     TG_ETOOBIG);
    assert_non_null(strstr(errbuf, "longer than the 4095"));
    /* the directories go with tmpdir */
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_rank_order),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_added_token_options),
        cmocka_unit_test(test_normalizer_and_prefix_space),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_template_id_hole),
        cmocka_unit_test(test_bad_paths_and_files),
        cmocka_unit_test(test_path_too_long),
        cmocka_unit_test(test_fuzzed_files),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
