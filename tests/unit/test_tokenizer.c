/* test_tokenizer.c — the byte-level BPE tokenizer (common/tok/tok_tokenizer.h)
 * with the shipped Llama-3 and Qwen tokenizers: llama.cpp's vocab tests,
 * round trips, special tokens, invalid UTF-8, NFC, streaming decode and
 * concurrent encoding. BPE/pre-tokenizer semantics on small synthetic
 * tokenizers and malformed files are in test_tokenizer_synth.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "tests/support/tt_support.h"
#include "tests/support/tt_tok.h"

static char errbuf[512];

/* The three project tokenizers, loaded once by the group setup. */
static struct tok_tokenizer g_llama, g_qwen25, g_qwen3;

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b != NULL && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b != NULL) {
        b[n] = '\0';
        *len = (size_t)n;
    }
    return b;
}

static int group_setup(void **state)
{
    (void)state;
    static const struct {
        struct tok_tokenizer *t;
        const char *rel;
    } toks[] = {{&g_llama, "tokenizers/llama3"},
                {&g_qwen25, "tokenizers/qwen2.5/tokenizer.json"},
                {&g_qwen3, "tokenizers/qwen3"}};
    for (size_t i = 0; i < sizeof(toks) / sizeof(toks[0]); i++) {
        char p[1024];
        tt_data_path(toks[i].rel, p, sizeof p);
        if (tok_tokenizer_load(toks[i].t, p, errbuf, sizeof errbuf) != 0) {
            fprintf(stderr, "test_tokenizer: %s: %s\n", p, errbuf);
            return -1;
        }
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    tok_tokenizer_free(&g_llama);
    tok_tokenizer_free(&g_qwen25);
    tok_tokenizer_free(&g_qwen3);
    return 0;
}

/* ------------------------------------------------------ vocab test files */

struct vcase {
    char *text;
    size_t len;
    struct tok_ids want;
};

/* Reads ggml-vocab-<name>.gguf.{inp,out}: cases separated by
 * "\n__ggml_vocab_test__\n", one line of ids per case. */
static size_t load_cases(const char *name, struct vcase **out)
{
    char rel[256], p[1024];
    size_t ilen, olen;
    snprintf(rel, sizeof rel,
             "llamacpp_vocab_tests/ggml-vocab-%s.gguf.inp", name);
    tt_data_path(rel, p, sizeof p);
    char *inp = read_file(p, &ilen);
    snprintf(rel, sizeof rel,
             "llamacpp_vocab_tests/ggml-vocab-%s.gguf.out", name);
    tt_data_path(rel, p, sizeof p);
    char *outp = read_file(p, &olen);
    assert_non_null(inp);
    assert_non_null(outp);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    struct vcase *c = NULL;
    size_t n = 0;
    char *at = inp, *line = outp;
    for (char *e; (e = strstr(at, sep)) != NULL; at = e + strlen(sep)) {
        c = realloc(c, (n + 1) * sizeof(*c));
        assert_non_null(c);
        memset(&c[n], 0, sizeof(c[n]));
        c[n].len = (size_t)(e - at);
        c[n].text = malloc(c[n].len + 1);
        memcpy(c[n].text, at, c[n].len);
        c[n].text[c[n].len] = '\0';
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        for (char *q = line, *end; *q; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q)
                break;
            if (c[n].want.n == c[n].want.cap) {
                c[n].want.cap = c[n].want.cap ? 2 * c[n].want.cap : 16;
                c[n].want.v = realloc(c[n].want.v, c[n].want.cap * 4);
            }
            c[n].want.v[c[n].want.n++] = (int32_t)v;
        }
        line = nl + 1;
        n++;
    }
    free(inp);
    free(outp);
    *out = c;
    return n;
}

static void free_cases(struct vcase *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(c[i].text);
        tok_ids_free(&c[i].want);
    }
    free(c);
}

/* Every case encodes exactly; decoding gives the text back; streaming
 * decode gives the same text in valid UTF-8 pieces. */
static void run_vocab(const struct tok_tokenizer *tok, const char *name,
                      size_t want_cases)
{
    struct vcase *c;
    size_t n = load_cases(name, &c);
    assert_int_equal(n, want_cases);
    struct tok_cache cache;
    assert_int_equal(tok_cache_init(&cache, tok, 1024, errbuf, sizeof errbuf),
                     0);
    for (size_t i = 0; i < n; i++) {
        for (int pass = 0; pass < 2; pass++) { /* no cache, then cache */
            struct tok_ids got = {0};
            assert_int_equal(tok_encode(tok, pass ? &cache : NULL, c[i].text,
                                        c[i].len, 0, &got, errbuf,
                                        sizeof errbuf),
                             0);
            tt_tok_check_ids(&got, &c[i].want, c[i].text);
            tok_ids_free(&got);
        }
        struct tg_buf txt = {0}, st = {0};
        assert_int_equal(tok_decode(tok, c[i].want.v, c[i].want.n, 0, &txt,
                                    errbuf, sizeof errbuf),
                         0);
        assert_int_equal(txt.len, c[i].len);
        assert_memory_equal(txt.len ? txt.data : "", c[i].text, c[i].len);
        struct tok_stream s;
        tok_stream_init(&s, tok, 0);
        for (size_t k = 0; k < c[i].want.n; k++) {
            size_t before = st.len;
            assert_int_equal(
                tok_stream_put(&s, c[i].want.v[k], &st, errbuf, sizeof errbuf),
                0);
            assert_true(
                tok_utf8_valid(st.data + before, st.len - before, NULL));
        }
        assert_int_equal(tok_stream_finish(&s, &st, errbuf, sizeof errbuf), 0);
        assert_int_equal(st.len, c[i].len);
        assert_memory_equal(st.len ? st.data : "", c[i].text, c[i].len);
        tg_buf_free(&txt);
        tg_buf_free(&st);
    }
    assert_true(cache.hits > 0);
    tok_cache_free(&cache);
    free_cases(c, n);
}

static void test_vocab_llama3(void **state)
{
    (void)state;
    run_vocab(&g_llama, "llama-bpe", 44);
}

static void test_vocab_qwen25(void **state)
{
    (void)state;
    run_vocab(&g_qwen25, "qwen2", 43);
}

static void test_vocab_qwen3(void **state)
{
    (void)state;
    run_vocab(&g_qwen3, "qwen2", 43);
}

/* ----------------------------------------------------- lookups and ids */

static void expect(const struct tok_tokenizer *tok, const char *s,
                   unsigned flags, const int32_t *want, size_t n)
{
    struct tok_ids got = {0};
    tt_tok_encode(tok, s, flags, &got);
    struct tok_ids w = {(int32_t *)want, n, n};
    tt_tok_check_ids(&got, &w, s);
    tok_ids_free(&got);
}

static void test_lookups_and_special_ids(void **state)
{
    (void)state;
    assert_int_equal(tok_vocab_size(&g_llama), 128256);
    assert_int_equal(tok_vocab_size(&g_qwen25), 151665);
    assert_int_equal(tok_vocab_size(&g_qwen3), 151669);
    assert_int_equal(tok_token_to_id(&g_llama, "\xC4\xA0the", 5), 279);
    assert_int_equal(tok_token_to_id(&g_llama, "<|begin_of_text|>", 17),
                     128000);
    assert_int_equal(tok_token_to_id(&g_llama, "no-such-token!!", 15), -1);
    size_t n;
    const char *s = tok_id_to_token(&g_llama, 279, &n);
    assert_non_null(s);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "\xC4\xA0the", 5);
    s = tok_id_bytes(&g_llama, 279, &n);
    assert_int_equal(n, 4);
    assert_memory_equal(s, " the", 4);
    assert_null(tok_id_to_token(&g_llama, -1, &n));
    assert_null(tok_id_to_token(&g_llama, 128256, &n));
    assert_null(tok_id_bytes(&g_qwen25, 151665, &n));
    assert_true(tok_id_is_special(&g_llama, 128000));
    assert_false(tok_id_is_special(&g_llama, 279));
    assert_false(tok_id_is_special(&g_qwen25, 151657)); /* <tool_call> */
    /* tokenizer_config.*.json / generation_config*.json of the folders */
    assert_int_equal(g_llama.bos_id, 128000);
    assert_int_equal(g_llama.eos_id, 128009);
    assert_int_equal(g_llama.n_eos, 3);
    assert_int_equal(g_llama.eos_ids[0], 128009);
    assert_int_equal(g_llama.eos_ids[1], 128001);
    assert_int_equal(g_llama.eos_ids[2], 128008);
    assert_int_equal(g_llama.pad_id, -1);
    assert_int_equal(g_qwen25.bos_id, -1);
    assert_int_equal(g_qwen25.eos_id, 151645);
    assert_int_equal(g_qwen25.pad_id, 151643);
    assert_int_equal(g_qwen25.n_eos, 2);
    assert_int_equal(g_qwen25.eos_ids[1], 151643);
}

static void test_special_tokens_in_text(void **state)
{
    (void)state;
    static const int32_t l1[] = {128006, 882, 128007, 271};
    expect(&g_llama, "<|start_header_id|>user<|end_header_id|>\n\n", 0, l1, 4);
    static const int32_t l2[] = {128000, 9906, 1917};
    expect(&g_llama, "Hello world", TOK_ENCODE_ADD_SPECIAL, l2, 3);
    static const int32_t l3[] = {128000, 128000, 9906};
    expect(&g_llama, "<|begin_of_text|>Hello", TOK_ENCODE_ADD_SPECIAL, l3, 3);
    static const int32_t q1[] = {151644, 872, 198, 9707, 151645, 198, 151657};
    expect(&g_qwen25, "<|im_start|>user\nHello<|im_end|>\n<tool_call>", 0, q1,
           7);
    /* Qwen's template adds nothing. */
    expect(&g_qwen3, "<|im_start|>user\nHello<|im_end|>\n<tool_call>",
           TOK_ENCODE_ADD_SPECIAL, q1, 7);
    /* Adjacent specials, and a truncated one that is only text. */
    static const int32_t q2[] = {151645, 151644};
    expect(&g_qwen25, "<|im_end|><|im_start|>", 0, q2, 2);
    struct tok_ids ids = {0};
    tt_tok_encode(&g_qwen25, "<|im_sta", 0, &ids);
    assert_true(ids.n > 1);
    for (size_t i = 0; i < ids.n; i++)
        assert_true(ids.v[i] < 151643);
    /* SPLIT_SPECIAL: specials are text, the non-special <tool_call> is not. */
    tt_tok_encode(&g_qwen25, "<|im_start|>user<tool_call>",
               TOK_ENCODE_SPLIT_SPECIAL, &ids);
    assert_true(ids.n > 3);
    assert_int_equal(ids.v[ids.n - 1], 151657);
    for (size_t i = 0; i + 1 < ids.n; i++)
        assert_true(ids.v[i] < 151643);
    struct tg_buf t = {0};
    assert_int_equal(
        tok_decode(&g_qwen25, ids.v, ids.n, 0, &t, errbuf, sizeof errbuf), 0);
    assert_string_equal(t.data, "<|im_start|>user<tool_call>");
    /* Skip-special decoding drops special tokens only. */
    static const int32_t mix[] = {151644, 872, 151657, 151645};
    tg_buf_reset(&t);
    assert_int_equal(tok_decode(&g_qwen25, mix, 4, TOK_DECODE_SKIP_SPECIAL, &t,
                                errbuf, sizeof errbuf),
                     0);
    assert_string_equal(t.data, "user<tool_call>");
    /* Ids without a token are skipped. */
    static const int32_t holes[] = {-5, 872, 999999, 151700};
    tg_buf_reset(&t);
    assert_int_equal(
        tok_decode(&g_qwen25, holes, 4, 0, &t, errbuf, sizeof errbuf), 0);
    assert_string_equal(t.data, "user");
    tg_buf_free(&t);
    tok_ids_free(&ids);
}

static void test_invalid_utf8_input(void **state)
{
    (void)state;
    struct tok_ids ids = {0};
    assert_int_equal(
        tok_encode(&g_llama, NULL, "ab", 2, 0, &ids, errbuf, sizeof errbuf), 0);
    size_t n0 = ids.n;
    static const char *bad[] = {"a\xff", "\xC3", "\xED\xA0\x80",
                                "\xF4\x90\x80\x80", "ok\xE2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        errbuf[0] = '\0';
        assert_int_equal(tok_encode(&g_llama, NULL, bad[i], strlen(bad[i]), 0,
                                    &ids, errbuf, sizeof errbuf),
                         TG_EINVAL);
        assert_int_equal(ids.n, n0);
        assert_non_null(strstr(errbuf, "UTF-8"));
    }
    /* A cache bound to another tokenizer is refused. */
    struct tok_cache c;
    assert_int_equal(tok_cache_init(&c, &g_qwen25, 16, errbuf, sizeof errbuf),
                     0);
    assert_int_equal(
        tok_encode(&g_llama, &c, "x", 1, 0, &ids, errbuf, sizeof errbuf),
        TG_EINVAL);
    tok_cache_free(&c);
    tok_ids_free(&ids);
}

/* Empty text, NUL bytes and long runs that stress the regex and BPE. */
static void test_edge_texts(void **state)
{
    (void)state;
    struct tok_ids ids = {0};
    assert_int_equal(
        tok_encode(&g_qwen25, NULL, "", 0, 0, &ids, errbuf, sizeof errbuf), 0);
    assert_int_equal(ids.n, 0);
    assert_int_equal(
        tok_encode(&g_llama, NULL, "a\0b", 3, 0, &ids, errbuf, sizeof errbuf),
        0);
    struct tg_buf t = {0};
    assert_int_equal(
        tok_decode(&g_llama, ids.v, ids.n, 0, &t, errbuf, sizeof errbuf), 0);
    assert_int_equal(t.len, 3);
    assert_memory_equal(t.data, "a\0b", 3);
    static const char fill[] = {'a', ' ', '7', '\n', '!'};
    size_t n = 200000;
    char *big = malloc(n);
    for (size_t f = 0; f < sizeof fill; f++) {
        memset(big, fill[f], n);
        const struct tok_tokenizer *tk[] = {&g_llama, &g_qwen25};
        for (int k = 0; k < 2; k++) {
            ids.n = 0;
            tg_buf_reset(&t);
            assert_int_equal(
                tok_encode(tk[k], NULL, big, n, 0, &ids, errbuf, sizeof errbuf),
                0);
            assert_true(ids.n > 0 && ids.n <= n);
            assert_int_equal(
                tok_decode(tk[k], ids.v, ids.n, 0, &t, errbuf, sizeof errbuf),
                0);
            assert_int_equal(t.len, n);
            assert_memory_equal(t.data, big, n);
        }
    }
    free(big);
    tg_buf_free(&t);
    tok_ids_free(&ids);
}

/* Qwen's NFC normalizer (utf8proc behind a quick-check fast path) against
 * utf8proc_NFC on random strings of characters that compose, reorder,
 * decompose or block: decoding the ids must give exactly NFC(s). */
static void test_nfc_fast_path(void **state)
{
    (void)state;
    static const int32_t alphabet[] = {
        'e',    'a',    '=',    ' ',    0x0301, 0x0308,  0x0304, 0x0323, 0x0338,
        0x00E9, 0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01,  0x212B, 0x0958, 0x304B,
        0x3099, 0x0F73, 0x0344, 0x1E0A, 0x0B47, 0x0B3E,  0x4E2D, 0x0410, 0x0306,
        0x1F00, 0x0345, 0x2126, 0x0CC6, 0x0CD5, 0x1D15E, 0x2F800};
    struct tok_ids ids = {0};
    struct tg_buf back = {0};
    unsigned seed = 7;
    int changed = 0;
    for (int trial = 0; trial < 3000; trial++) {
        char s[64];
        size_t n = 0, len = 1 + (size_t)(rand_r(&seed) % 10);
        for (size_t i = 0; i < len; i++)
            n += (size_t)utf8proc_encode_char(
                alphabet[rand_r(&seed) % (sizeof alphabet / sizeof *alphabet)],
                (utf8proc_uint8_t *)s + n);
        s[n] = '\0';
        utf8proc_uint8_t *want = utf8proc_NFC((const utf8proc_uint8_t *)s);
        assert_non_null(want);
        changed += strcmp((const char *)want, s) != 0;
        ids.n = 0;
        tg_buf_reset(&back);
        assert_int_equal(
            tok_encode(&g_qwen3, NULL, s, n, 0, &ids, errbuf, sizeof errbuf),
            0);
        assert_int_equal(
            tok_decode(&g_qwen3, ids.v, ids.n, 0, &back, errbuf, sizeof errbuf),
            0);
        if (strcmp(back.data, (const char *)want) != 0)
            fprintf(stderr, "NFC mismatch on trial %d\n", trial);
        assert_string_equal(back.data, (const char *)want);
        free(want);
    }
    assert_true(changed > 500); /* the strings really exercised NFC */
    tok_ids_free(&ids);
    tg_buf_free(&back);
}

/* ------------------------------------------------------------ streaming */

static void test_stream_multibyte(void **state)
{
    (void)state;
    /* " this is 🦙.cpp": the llama emoji's 4 bytes span 11410 99 247. */
    static const int32_t ids[] = {420, 374, 11410, 99, 247, 13, 11055};
    static const char *want[] = {" this", " is", " ", "", "\xF0\x9F\xA6\x99",
                                 ".",     "cpp"};
    struct tok_stream s;
    struct tg_buf out = {0};
    tok_stream_init(&s, &g_llama, 0);
    for (int i = 0; i < 7; i++) {
        size_t before = out.len;
        assert_int_equal(
            tok_stream_put(&s, ids[i], &out, errbuf, sizeof errbuf), 0);
        assert_int_equal(out.len - before, strlen(want[i]));
        assert_memory_equal(out.data + before, want[i], strlen(want[i]));
    }
    assert_int_equal(tok_stream_finish(&s, &out, errbuf, sizeof errbuf), 0);
    assert_string_equal(out.data, " this is \xF0\x9F\xA6\x99.cpp");
    /* Ending inside a sequence gives one U+FFFD at the end only. */
    tg_buf_reset(&out);
    tok_stream_init(&s, &g_llama, 0);
    assert_int_equal(tok_stream_put(&s, 420, &out, errbuf, sizeof errbuf), 0);
    assert_int_equal(tok_stream_put(&s, 11410, &out, errbuf, sizeof errbuf), 0);
    assert_int_equal(tok_stream_put(&s, 99, &out, errbuf, sizeof errbuf), 0);
    assert_string_equal(out.data, " this ");
    assert_int_equal(tok_stream_finish(&s, &out, errbuf, sizeof errbuf), 0);
    assert_string_equal(out.data, " this \xEF\xBF\xBD");
    assert_int_equal(s.npend, 0);
    tg_buf_free(&out);
}

static void test_stream_lossy(void **state)
{
    (void)state;
    int32_t byte_tok[256];
    for (int b = 0; b < 256; b++) {
        char c[3];
        int n = tt_tok_byte_char(b, c);
        byte_tok[b] = tok_token_to_id(&g_qwen25, c, (size_t)n);
        assert_true(byte_tok[b] >= 0);
    }
    /* Maximal-subpart replacement (Unicode §3.9, Rust from_utf8_lossy). */
    static const struct {
        const char *in;
        const char *want;
    } fixed[] = {
        {"\xE2\x28\xA1", "\xEF\xBF\xBD(\xEF\xBF\xBD"},
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xF0\x9F\x98", "\xEF\xBF\xBD"},
        {"\xF0\x9F\x98"
         "a",
         "\xEF\xBF\xBD"
         "a"},
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xF4\x90\x80\x80",
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"a\xE2\x82\xAC", "a\xE2\x82\xAC"},
    };
    for (size_t f = 0; f < sizeof fixed / sizeof *fixed; f++) {
        size_t n = strlen(fixed[f].in);
        int32_t ids[8];
        for (size_t i = 0; i < n; i++)
            ids[i] = byte_tok[(uint8_t)fixed[f].in[i]];
        struct tg_buf t = {0};
        assert_int_equal(
            tok_decode(&g_qwen25, ids, n, 0, &t, errbuf, sizeof errbuf), 0);
        assert_string_equal(t.data, fixed[f].want);
        tg_buf_free(&t);
    }
    /* Random byte soups fed one byte per token: the stream's output equals
     * the batch decode and every piece it emits is valid UTF-8. */
    static const uint8_t alphabet[] = {'a',  0x80, 0x9F, 0xA0, 0xBF, 0xC2,
                                       0xC0, 0xDF, 0xE0, 0xE2, 0xED, 0xEF,
                                       0xF0, 0xF4, 0xF5, 0xFF, 0x82, 0xAC};
    unsigned seed = 12345;
    for (int trial = 0; trial < 3000; trial++) {
        int32_t ids[16];
        size_t n = 1 + (size_t)(rand_r(&seed) % 16);
        for (size_t i = 0; i < n; i++)
            ids[i] = byte_tok[alphabet[rand_r(&seed) % sizeof alphabet]];
        struct tg_buf batch = {0}, st = {0};
        assert_int_equal(
            tok_decode(&g_qwen25, ids, n, 0, &batch, errbuf, sizeof errbuf), 0);
        assert_true(tok_utf8_valid(batch.data, batch.len, NULL));
        struct tok_stream s;
        tok_stream_init(&s, &g_qwen25, 0);
        for (size_t i = 0; i < n; i++) {
            size_t before = st.len;
            assert_int_equal(
                tok_stream_put(&s, ids[i], &st, errbuf, sizeof errbuf), 0);
            assert_true(
                tok_utf8_valid(st.data + before, st.len - before, NULL));
        }
        assert_int_equal(tok_stream_finish(&s, &st, errbuf, sizeof errbuf), 0);
        assert_int_equal(st.len, batch.len);
        assert_memory_equal(st.data, batch.data, batch.len);
        tg_buf_free(&batch);
        tg_buf_free(&st);
    }
}

/* ------------------------------------------------------ threads, caches */

struct job {
    const struct tok_tokenizer *tok;
    const char *text;
    size_t len;
    const struct tok_ids *want;
    int ok;
};

static void *encode_job(void *arg)
{
    struct job *j = arg;
    struct tok_cache c;
    char err[128];
    j->ok = tok_cache_init(&c, j->tok, 4096, err, sizeof err) == 0;
    for (int rep = 0; rep < 3 && j->ok; rep++) {
        struct tok_ids ids = {0};
        j->ok = tok_encode(j->tok, &c, j->text, j->len, 0, &ids, err,
                           sizeof err) == 0 &&
                ids.n == j->want->n &&
                memcmp(ids.v, j->want->v, ids.n * 4) == 0;
        tok_ids_free(&ids);
    }
    tok_cache_free(&c);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    char p[1024];
    size_t len;
    tt_data_path("llamacpp_vocab_tests/ggml-vocab-qwen2.gguf.inp", p,
                   sizeof p);
    char *text = read_file(p, &len);
    assert_non_null(text);
    struct tok_ids want = {0};
    assert_int_equal(
        tok_encode(&g_qwen25, NULL, text, len, 0, &want, errbuf, sizeof errbuf),
        0);
    pthread_t th[4];
    struct job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (struct job){&g_qwen25, text, len, &want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(jobs[i].ok);
    }
    tok_ids_free(&want);
    free(text);
}

/* tok_encode_max: at the exact count the ids equal tok_encode's; one
 * below, TG_ERANGE with the array unchanged; a huge text over a small
 * bound stops early and still refuses. */
static void test_encode_max(void **state)
{
    (void)state;
    const char *text = "The quick brown fox jumps over the lazy dog, again "
                       "and again.<|im_end|> And then some more words.";
    struct tok_ids want = {0}, got = {0};
    assert_int_equal(tok_encode(&g_qwen3, NULL, text, strlen(text),
                                TOK_ENCODE_ADD_SPECIAL, &want, errbuf,
                                sizeof errbuf), 0);
    assert_true(want.n > 4);
    assert_int_equal(tok_encode_max(&g_qwen3, NULL, text, strlen(text),
                                    TOK_ENCODE_ADD_SPECIAL, want.n, &got,
                                    errbuf, sizeof errbuf), 0);
    assert_int_equal(got.n, want.n);
    assert_memory_equal(got.v, want.v, want.n * sizeof(int32_t));
    /* Appending: the bound counts from what the array held. */
    assert_int_equal(tok_encode_max(&g_qwen3, NULL, text, strlen(text),
                                    TOK_ENCODE_ADD_SPECIAL, want.n - 1, &got,
                                    errbuf, sizeof errbuf), TG_ERANGE);
    assert_int_equal(got.n, want.n);
    assert_non_null(strstr(errbuf, "more than"));
    struct tok_cache c;
    assert_int_equal(tok_cache_init(&c, &g_qwen3, 256, errbuf,
                                    sizeof errbuf), 0);
    size_t big = 4u << 20;
    char *huge = malloc(big);
    assert_non_null(huge);
    for (size_t i = 0; i < big; i++)
        huge[i] = (i % 6 == 5) ? ' ' : (char)('a' + (int)(i % 23));
    tok_ids_free(&got);
    assert_int_equal(tok_encode_max(&g_qwen3, &c, huge, big, 0, 100, &got,
                                    errbuf, sizeof errbuf), TG_ERANGE);
    assert_int_equal(got.n, 0);
    /* It stopped near the bound rather than encoding 4 MiB: the array
     * never grew to the text's size. */
    assert_true(got.cap < 4096);
    /* The cache works unbounded afterwards. */
    assert_int_equal(tok_encode(&g_qwen3, &c, text, strlen(text),
                                TOK_ENCODE_ADD_SPECIAL, &got, errbuf,
                                sizeof errbuf), 0);
    assert_int_equal(got.n, want.n);
    tok_cache_free(&c);
    free(huge);
    tok_ids_free(&got);
    tok_ids_free(&want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_llama3),
        cmocka_unit_test(test_vocab_qwen25),
        cmocka_unit_test(test_vocab_qwen3),
        cmocka_unit_test(test_lookups_and_special_ids),
        cmocka_unit_test(test_special_tokens_in_text),
        cmocka_unit_test(test_invalid_utf8_input),
        cmocka_unit_test(test_edge_texts),
        cmocka_unit_test(test_nfc_fast_path),
        cmocka_unit_test(test_stream_multibyte),
        cmocka_unit_test(test_stream_lossy),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_encode_max),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
