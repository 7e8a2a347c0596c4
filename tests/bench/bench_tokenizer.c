/*
 * bench_tokenizer.c — encode / decode throughput of the byte-level BPE
 * tokenizer (common/tok/tok_tokenizer.h) with the Llama-3 and Qwen2.5
 * tokenizers, word cache on vs off, measured side by side in one run.
 *
 *   bench-tokenizer [--quick] [--mb N] [--file PATH]
 *
 * The text is llama.cpp's vocab test inputs followed by generated
 * multilingual text (English prose, code, German, Russian, Greek, Chinese,
 * Japanese, Arabic, emoji, numbers) up to N MB (default 10; --quick: 0.25).
 * --file PATH benchmarks that text instead (repeated up to N MB when
 * shorter). Each measurement is the best of R runs (R = 3; --quick: 1). Prints MB/s of
 * input text for encoding, MB/s of output text for decoding, and checks that
 * cache on/off give identical ids and that decoding restores the text.
 */
#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "tests/support/tt_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *shared(void)
{
    const char *s = getenv("TANGRAM_DATA");
    return s ? s : "data";
}

static int append(struct tg_buf *t, const char *s, size_t n)
{
    return tg_buf_append(t, s, n) != 0 ? -1 : 0;
}

static int append_file(struct tg_buf *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    char buf[4096];
    size_t got;
    int rc = 0;
    while (rc == 0 && (got = fread(buf, 1, sizeof buf, f)) > 0)
        rc = append(t, buf, got);
    fclose(f);
    return rc;
}

/* Word lists per kind of text; a line draws words from one list. */
static const char *const english[] = {"the",
                                      "of",
                                      "and",
                                      "to",
                                      "in",
                                      "serving",
                                      "memory",
                                      "cache",
                                      "request",
                                      "throughput",
                                      "latency",
                                      "model",
                                      "attention",
                                      "compression",
                                      "budget",
                                      "however,",
                                      "which",
                                      "because",
                                      "scheduler",
                                      "tokens.",
                                      "It's",
                                      "we'll",
                                      "reclaimed",
                                      "heads",
                                      "multi-turn",
                                      "conversation",
                                      "GPU",
                                      "kernel",
                                      "pages",
                                      "\"quoted\"",
                                      "(parenthesized)",
                                      "e.g.",
                                      "state-of-the-art"};
static const char *const code[] = {"int",
                                   "main(void)",
                                   "{",
                                   "}",
                                   "return",
                                   "0;",
                                   "for",
                                   "(size_t i = 0;",
                                   "i < n;",
                                   "i++)",
                                   "x->next",
                                   "=",
                                   "NULL;",
                                   "if",
                                   "(rc != 0)",
                                   "\tgoto",
                                   "fail;",
                                   "def",
                                   "__init__(self):",
                                   "self.cache",
                                   "= {}",
                                   "#include",
                                   "<stdio.h>",
                                   "//",
                                   "TODO:",
                                   "0x7fff",
                                   "::",
                                   "std::vector<int>",
                                   "=>"};
static const char *const german[] = {
    "Größe",   "über",     "Straße",    "Mädchen",     "schön",
    "Prüfung", "Bäckerei", "fünf",      "Übersetzung", "und",
    "die",     "der",      "Schlüssel", "Fußgänger"};
static const char *const russian[] = {
    "привет", "мир", "память", "запрос",  "модель", "внимание",
    "сжатие", "кэш", "и",      "в",       "не",     "на",
    "что",    "это", "быстро", "страница"};
static const char *const greek[] = {"αλφα", "βήτα", "γάμμα", "δέλτα", "λόγος",
                                    "και",  "το",   "της",   "μνήμη", "ψυχή"};
static const char *const chinese[] = {
    "我们", "模型", "内存", "缓存", "请求",   "注意力", "压缩", "的", "是",
    "在",   "服务", "多轮", "对话", "吞吐量", "延迟",   "。",   "，"};
static const char *const japanese[] = {
    "こんにちは", "世界", "メモリ", "キャッシュ", "モデル", "です", "ます",
    "の",         "は",   "を",     "トークン",   "東京",   "、",   "。"};
static const char *const arabic[] = {"مرحبا", "العالم", "ذاكرة", "نموذج", "في",
                                     "من",    "على",    "طلب",   "سريع"};
static const char *const emoji[] = {
    "🦙", "😀", "👍🏽", "🚀", "❤️", "🇯🇵", "👨‍👩‍👧",
    "✅",    "→", "∑",        "©", "½"};
static const char *const numbers[] = {
    "0",         "7",   "42",      "1234",       "2024-05-17", "3.14159",
    "1,000,000", "99%", "-273.15", "0xDEADBEEF", "v1.2.3",     "10:45"};

struct list {
    const char *const *w;
    size_t n;
    int weight;
    const char *sep;
};

#define L(a, wt, sp)                                                           \
    {                                                                          \
        a, sizeof(a) / sizeof(a[0]), wt, sp                                    \
    }
static const struct list lists[] = {
    L(english, 50, " "), L(code, 10, " "),  L(german, 5, " "),
    L(russian, 6, " "),  L(greek, 3, " "),  L(chinese, 8, ""),
    L(japanese, 5, ""),  L(arabic, 3, " "), L(emoji, 4, " "),
    L(numbers, 6, " "),
};

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static int generate(struct tg_buf *t, size_t target)
{
    uint64_t seed = 42;
    int total = 0;
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++)
        total += lists[i].weight;
    while (t->len < target) {
        int pick = (int)(rng(&seed) % (uint64_t)total);
        size_t li = 0;
        while (pick >= lists[li].weight)
            pick -= lists[li++].weight;
        const struct list *l = &lists[li];
        size_t words = 4 + rng(&seed) % 16;
        for (size_t w = 0; w < words; w++) {
            const char *s = l->w[rng(&seed) % l->n];
            if ((w > 0 && append(t, l->sep, strlen(l->sep)) != 0) ||
                append(t, s, strlen(s)) != 0)
                return -1;
        }
        static const char *const ends[] = {"\n", "\n\n", ". ", " ", "\n    "};
        const char *e = ends[rng(&seed) % 5];
        if (append(t, e, strlen(e)) != 0)
            return -1;
    }
    return 0;
}

struct result {
    double enc_mbs[2]; /* cache off, on */
    double dec_mbs, stream_mbs, load_s, hit_rate;
    size_t n_ids;
};

static int bench_one(const char *dir, const struct tg_buf *text, int reps,
                     struct result *r)
{
    char err[512];
    struct tok_tokenizer tok;
    double t0 = now();
    if (tok_tokenizer_load(&tok, dir, err, sizeof err) != 0) {
        fprintf(stderr, "bench-tokenizer: %s\n", err);
        return -1;
    }
    r->load_s = now() - t0;
    struct tok_ids ids[2] = {{0}, {0}};
    int rc = 0;
    for (int cached = 0; cached < 2 && rc == 0; cached++) {
        double best = 1e30;
        for (int rep = 0; rep < reps && rc == 0; rep++) {
            /* A fresh (cold) cache per run: repeats must not find the
             * previous run's words. */
            struct tok_cache c;
            rc = tok_cache_init(&c, &tok, cached ? 1 << 16 : 0, err,
                                sizeof err);
            ids[cached].n = 0;
            t0 = now();
            if (rc == 0)
                rc = tok_encode(&tok, &c, text->data, text->len, 0,
                                &ids[cached], err, sizeof err);
            double dt = now() - t0;
            best = dt < best ? dt : best;
            if (cached)
                r->hit_rate =
                    (double)c.hits / (double)(c.hits + c.misses + 1);
            tok_cache_free(&c);
        }
        r->enc_mbs[cached] = (double)text->len / best / 1e6;
    }
    if (rc != 0) {
        fprintf(stderr, "bench-tokenizer: %s\n", err);
        goto out;
    }
    r->n_ids = ids[0].n;
    if (ids[0].n != ids[1].n ||
        memcmp(ids[0].v, ids[1].v, ids[0].n * sizeof(int32_t)) != 0) {
        fprintf(stderr, "bench-tokenizer: cache on/off disagree\n");
        rc = -1;
        goto out;
    }
    struct tg_buf out = {0};
    double best = 1e30;
    for (int rep = 0; rep < reps && rc == 0; rep++) {
        tg_buf_reset(&out);
        t0 = now();
        rc = tok_decode(&tok, ids[0].v, ids[0].n, 0, &out, err, sizeof err);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    r->dec_mbs = (double)out.len / best / 1e6;
    /* Without a normalizer decoding must give the text back exactly; with
     * NFC it gives the NFC form, so only the length is comparable loosely. */
    if (rc == 0 && tok.n_norm == 0 &&
        (out.len != text->len ||
         memcmp(out.data, text->data, text->len) != 0)) {
        fprintf(stderr, "bench-tokenizer: round trip failed\n");
        rc = -1;
    }
    best = 1e30;
    for (int rep = 0; rep < reps && rc == 0; rep++) {
        struct tok_stream s;
        tok_stream_init(&s, &tok, 0);
        tg_buf_reset(&out);
        t0 = now();
        for (size_t i = 0; i < ids[0].n && rc == 0; i++)
            rc = tok_stream_put(&s, ids[0].v[i], &out, err, sizeof err);
        if (rc == 0)
            rc = tok_stream_finish(&s, &out, err, sizeof err);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    r->stream_mbs = (double)out.len / best / 1e6;
    tg_buf_free(&out);
out:
    tok_ids_free(&ids[0]);
    tok_ids_free(&ids[1]);
    tok_tokenizer_free(&tok);
    return rc;
}

int main(int argc, char **argv)
{
    double mb = 10.0;
    int reps = 3;
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            mb = 0.25;
            reps = 1;
        } else if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) {
            mb = atof(argv[++i]);
        } else if (strcmp(argv[i], "--file") == 0 && i + 1 < argc) {
            file = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: bench-tokenizer [--quick] [--mb N] [--file PATH]\n");
            return 2;
        }
    }
    if (mb <= 0.0 || mb > 1000.0) {
        fprintf(stderr, "bench-tokenizer: --mb must be in (0, 1000]\n");
        return 2;
    }
    struct tg_buf text = {0};
    char p[1024];
    static const char *const inputs[] = {"llama-bpe", "qwen2"};
    for (int i = 0; i < 2 && file == NULL; i++) {
        tt_path(p, sizeof p, "%s/llamacpp_vocab_tests/ggml-vocab-%s.gguf.inp",
                shared(), inputs[i]);
        if (append_file(&text, p) != 0) {
            fprintf(stderr, "bench-tokenizer: cannot read %s\n", p);
            return 1;
        }
    }
    if (file != NULL) {
        if (append_file(&text, file) != 0 || text.len == 0) {
            fprintf(stderr, "bench-tokenizer: cannot read %s\n", file);
            return 1;
        }
        /* Repeat the file in place up to N MB (one allocation, so the
         * source of each copy stays valid). */
        size_t one = text.len, copies = (size_t)(mb * 1e6) / one;
        copies = copies ? copies : 1;
        if (tg_buf_reserve(&text, one * (copies - 1)) != 0) {
            fprintf(stderr, "bench-tokenizer: out of memory\n");
            return 1;
        }
        for (size_t c = 1; c < copies; c++)
            tg_buf_append(&text, text.data, one);
    } else if (generate(&text, (size_t)(mb * 1e6)) != 0) {
        fprintf(stderr, "bench-tokenizer: out of memory\n");
        return 1;
    }
    printf("text: %.2f MB (%s), best of %d\n", (double)text.len / 1e6,
           file ? file : "vocab test inputs + generated multilingual", reps);
    printf("%-8s %7s %9s %8s %12s %12s %7s %6s %10s %10s\n", "tokenizer",
           "load_s", "tokens", "B/token", "enc_MB/s", "enc_MB/s", "cache",
           "hit", "dec_MB/s", "stream");
    printf("%-8s %7s %9s %8s %12s %12s %7s %6s %10s %10s\n", "", "", "", "",
           "(no cache)", "(cache)", "ratio", "rate", "", "MB/s");
    static const char *const toks[] = {"llama3", "qwen2.5"};
    int status = 0;
    for (int i = 0; i < 2; i++) {
        struct result r;
        memset(&r, 0, sizeof r);
        tt_path(p, sizeof p, "%s/tokenizers/%s", shared(), toks[i]);
        if (bench_one(p, &text, reps, &r) != 0) {
            status = 1;
            continue;
        }
        printf(
            "%-8s %7.2f %9zu %8.2f %12.2f %12.2f %7.2f %5.0f%% %10.1f %10.1f\n",
            toks[i], r.load_s, r.n_ids, (double)text.len / (double)r.n_ids,
            r.enc_mbs[0], r.enc_mbs[1], r.enc_mbs[1] / r.enc_mbs[0],
            100.0 * r.hit_rate, r.dec_mbs, r.stream_mbs);
    }
    tg_buf_free(&text);
    return status;
}
