/*
 * fuzz_tokenizer.c — loading an untrusted tokenizer (common/
 * tok_tokenizer.c, tok_tokenizer_load): tokenizer.json (model, vocabulary,
 * merges, added tokens, normalizer, pre-tokenizer regexes, post-processor)
 * and its side files tokenizer_config.json and generation_config.json,
 * written to a scratch directory as a model directory holds them. A
 * tokenizer that loads then encodes and decodes the input's text (the
 * checks of fz_tok.h).
 *
 * Input layout: NUL-separated parts (JSON cannot hold a raw NUL)
 *   tokenizer.json \0 tokenizer_config.json \0 generation_config.json \0
 *   text
 * An empty or missing side part leaves that file out. The first byte of
 * the text part selects the encode flags (& 3: TOK_ENCODE_ADD_SPECIAL,
 * TOK_ENCODE_SPLIT_SPECIAL); the rest is encoded.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/tok/tok_tokenizer.h"
#include "tests/fuzz/fz_tok.h"
#include "tests/fuzz/fz_util.h"

static char dir[256];

static void put(const char *name, const struct fz_part *p, size_t n_parts,
                size_t i)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (i < n_parts && p[i].n > 0)
        fz_write_file(dir, name, p[i].p, p[i].n);
    else
        unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0])
        fz_scratch_dir("fuzz_tokenizer.", dir, sizeof(dir));
    struct fz_part p[4];
    size_t n = fz_split(data, size, 0, p, 4);
    fz_write_file(dir, "tokenizer.json", p[0].p, p[0].n);
    put("tokenizer_config.json", p, n, 1);
    put("generation_config.json", p, n, 2);
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    struct tok_tokenizer tok;
    memset(&tok, 0, sizeof(tok));
    int rc = tok_tokenizer_load(&tok, path, err, sizeof(err));
    if (rc != 0) {
        tok_tokenizer_free(&tok); /* safe on a failed load */
        return 0;
    }
    if (n == 4 && p[3].n > 0) {
        struct tok_cache c;
        if (tok_cache_init(&c, &tok, 64, err, sizeof(err)) != 0)
            fz_fail("tok_cache_init: %s", err);
        fz_tok_encode(&tok, &c, (const char *)p[3].p + 1, p[3].n - 1,
                      p[3].p[0] & 3u);
        tok_cache_free(&c);
    }
    /* Every id up to the vocabulary size and a few beyond. */
    int32_t ids[64];
    int32_t nid = tok_vocab_size(&tok);
    size_t k = 0;
    for (int32_t id = -2; id < nid + 2 && k < 64; id++)
        ids[k++] = id;
    fz_tok_decode(&tok, ids, k, 0);
    fz_tok_decode(&tok, ids, k, TOK_DECODE_SKIP_SPECIAL);
    tok_tokenizer_free(&tok);
    return 0;
}
