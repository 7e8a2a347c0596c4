/*
 * grammar_walk.c — the random-walk driver of the structured-output proof
 * (tests/integration/test_grammar_walk.py): for every schema and tool
 * case of a corpus, it samples token sequences under the grammar's token
 * mask with random logits (tests/support/tt_grammar.h: Gumbel noise plus
 * a bias toward tokens that close strings and containers) until the
 * grammar is finished or --max-tokens is reached, detokenizes the ids
 * with the tokenizer (tok_decode, special tokens skipped, as a server
 * answers) and prints each output as one JSON line. A validator outside
 * the engine then checks them.
 *
 *   grammar-walk [--tokenizer NAME] [--walks N] [--seed S]
 *                [--max-tokens M] [--check] CORPUS.json
 *
 * Lines: {"kind": "schema"|"tools", "name", "walk", "bias", "finished",
 * "tokens", "text"}; "finished" is false when the walk ran out of tokens
 * (the finish reason "length"), and then "min_bytes_left" says how far
 * the document was from an end. Walk k uses bias 2 + 2 * (k mod 4).
 * --check also compares every mask with the brute-force oracle (slow).
 * Exit status: 0, 1 on a broken invariant (a drawn token the matcher
 * rejects, an empty mask, a mismatch under --check), 2 on bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/tok/tok_tokenizer.h"
#include "tests/support/tt_grammar.h"

struct opts {
    const char *tokenizer;
    int walks, max_tokens, check;
    uint64_t seed;
};

static int fail(const char *name, int walk, const char *what)
{
    fprintf(stderr, "grammar-walk: %s, walk %d: %s\n", name, walk, what);
    return 1;
}

/* One walk; prints its line. Returns 0 or 1. */
static int one_walk(const struct tok_tokenizer *tok, const struct gm_vocab *v,
                    struct gm_grammar *g, const char *kind, const char *name,
                    int k, const struct opts *o, struct tt_gsampler *s,
                    uint32_t *mask, uint32_t *oracle)
{
    size_t W = gm_vocab_mask_words(v);
    double bias = 2.0 + 2.0 * (k % 4);
    /* a stream of its own per (seed, case, walk): splitmix64's finalizer
     * over the three mixed */
    uint64_t h = o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)k;
    for (const char *c = name; *c != '\0'; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001B3ull;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    struct tt_xrng r = {(h ^ (h >> 31)) | 1};
    struct gm_matcher m;
    struct tok_ids ids = {0};
    struct tg_buf text = {0};
    int tokens = 0, rc = 0;
    if (gm_matcher_init(&m, g) != 0)
        return fail(name, k, "out of memory");
    while (tokens < o->max_tokens && !gm_matcher_is_finished(&m)) {
        if (gm_matcher_fill_mask(&m, mask, W) != 0) {
            rc = fail(name, k, "fill_mask failed");
            break;
        }
        if (o->check) {
            char diff[1024];
            gm_matcher_fill_mask_naive(&m, oracle, W);
            if (tt_mask_diff(v, mask, oracle, W, diff, sizeof diff) != 0) {
                rc = fail(name, k, diff);
                break;
            }
        }
        int32_t id = tt_gsampler_pick(s, mask, bias, &r);
        if (id < 0) {
            rc = fail(name, k, "empty mask");
            break;
        }
        if (gm_matcher_accept_token(&m, id) != 0) {
            rc = fail(name, k, "an allowed token was rejected");
            break;
        }
        tokens++;
        if (TG_GROW(ids.v, &ids.cap, ids.n + 1)) {
            rc = fail(name, k, "out of memory");
            break;
        }
        ids.v[ids.n++] = id;
    }
    /* the decoded text must be the tokens' bytes, and valid UTF-8 (a
     * decoder would hide a broken sequence behind U+FFFD) */
    char derr[256];
    if (rc == 0 && tok_decode(tok, ids.v, ids.n, TOK_DECODE_SKIP_SPECIAL,
                              &text, derr, sizeof derr) != 0)
        rc = fail(name, k, derr);
    size_t at = 0;
    for (size_t i = 0; rc == 0 && i < ids.n; i++) {
        size_t len;
        const uint8_t *b = gm_vocab_token(v, ids.v[i], &len);
        if (b == NULL)
            continue; /* EOS */
        if (at + len > text.len || memcmp(text.data + at, b, len) != 0)
            rc = fail(name, k, "the decoded text differs from the tokens' "
                               "bytes (not UTF-8)");
        at += len;
    }
    if (rc == 0 &&
        (at != text.len || !tok_utf8_valid(text.data, text.len, NULL)))
        rc = fail(name, k, "the output is not UTF-8");
    if (rc == 0) {
        int finished = gm_matcher_is_finished(&m);
        json_t *t = json_stringn(tg_buf_str(&text), text.len);
        if (t == NULL) {
            rc = fail(name, k, "the output is not UTF-8");
        } else {
            json_t *line = json_pack(
                "{sssssisfsbsisoso}", "kind", kind, "name", name, "walk", k,
                "bias", bias, "finished", finished, "tokens", tokens, "text", t,
                "min_bytes_left",
                json_integer(gm_matcher_min_bytes_left(&m)));
            char *s2 = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII);
            printf("%s\n", s2);
            free(s2);
            json_decref(line);
        }
    }
    tg_buf_free(&text);
    tok_ids_free(&ids);
    gm_matcher_free(&m);
    return rc;
}

/* The spec of a tool case {name, format, min_calls, max_calls, tools}. */
static char *tool_spec(const json_t *c, size_t *len)
{
    json_t *spec = json_pack("{sssOsOsOsO}", "type", "tool_calls", "format",
                             json_object_get(c, "format"), "min_calls",
                             json_object_get(c, "min_calls"), "max_calls",
                             json_object_get(c, "max_calls"), "tools",
                             json_object_get(c, "tools"));
    if (spec == NULL)
        return NULL;
    char *s = json_dumps(spec, JSON_COMPACT);
    json_decref(spec);
    if (s != NULL)
        *len = strlen(s);
    return s;
}

int main(int argc, char **argv)
{
    struct opts o = {.tokenizer = "qwen3", .walks = 4, .max_tokens = 4000};
    const char *corpus = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--check") == 0) {
            o.check = 1;
        } else if (strcmp(a, "--tokenizer") == 0 && val != NULL) {
            o.tokenizer = val;
            i++;
        } else if (strcmp(a, "--walks") == 0 && val != NULL) {
            o.walks = atoi(val);
            i++;
        } else if (strcmp(a, "--max-tokens") == 0 && val != NULL) {
            o.max_tokens = atoi(val);
            i++;
        } else if (strcmp(a, "--seed") == 0 && val != NULL) {
            o.seed = strtoull(val, NULL, 10);
            i++;
        } else if (a[0] != '-' && corpus == NULL) {
            corpus = a;
        } else {
            fprintf(stderr,
                    "usage: grammar-walk [--tokenizer NAME] [--walks N] "
                    "[--seed S] [--max-tokens M] [--check] CORPUS.json\n");
            return 2;
        }
    }
    if (corpus == NULL || o.walks < 1 || o.max_tokens < 1) {
        fprintf(stderr, "grammar-walk: a corpus, --walks >= 1 and "
                        "--max-tokens >= 1 are needed\n");
        return 2;
    }
    json_error_t je;
    json_t *doc = json_load_file(corpus, JSON_REJECT_DUPLICATES, &je);
    if (doc == NULL) {
        fprintf(stderr, "grammar-walk: %s: %s\n", corpus, je.text);
        return 1;
    }
    struct gm_vocab v;
    struct tok_tokenizer tok;
    if (tt_grammar_tokenizer(o.tokenizer, &tok, &v) != 0) {
        json_decref(doc);
        return 1;
    }
    struct tt_gsampler s;
    size_t W = gm_vocab_mask_words(&v);
    uint32_t *mask = malloc(W * sizeof(*mask));
    uint32_t *oracle = malloc(W * sizeof(*oracle));
    if (mask == NULL || oracle == NULL || tt_gsampler_init(&s, &v) != 0) {
        fprintf(stderr, "grammar-walk: out of memory\n");
        return 1;
    }
    int rc = 0;
    static const char *const kinds[] = {"schemas", "tools"};
    for (int kind = 0; kind < 2 && rc == 0; kind++) {
        size_t i;
        const json_t *e;
        json_array_foreach(json_object_get(doc, kinds[kind]), i, e)
        {
            const char *name = json_string_value(json_object_get(e, "name"));
            size_t len = 0;
            char *spec = kind == 0 ? tt_grammar_spec(json_object_get(e, "schema"),
                                                     &len)
                                   : tool_spec(e, &len);
            struct gm_grammar *g = NULL;
            char err[512];
            if (spec == NULL ||
                gm_spec_compile(spec, len, &v, NULL, &g, err, sizeof err) != 0) {
                rc = fail(name, -1, spec == NULL ? "bad case" : err);
                free(spec);
                break;
            }
            free(spec);
            for (int k = 0; k < o.walks && rc == 0; k++)
                rc = one_walk(&tok, &v, g, kind == 0 ? "schema" : "tools",
                              name, k, &o, &s, mask, oracle);
            gm_grammar_unref(g);
            if (rc != 0)
                break;
        }
    }
    fflush(stdout);
    tt_gsampler_free(&s);
    free(mask);
    free(oracle);
    gm_vocab_free(&v);
    tok_tokenizer_free(&tok);
    json_decref(doc);
    return rc;
}
