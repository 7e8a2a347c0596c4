/*
 * fuzz_tok_encode.c — the real Qwen3 tokenizer (data/tokenizers/qwen3,
 * loaded once) on untrusted text and ids: tok_encode of prompt text
 * (added-token matching, NFC normalization, the pre-tokenizer's Split
 * regex, byte-level BPE, the word cache) and tok_decode / the streaming
 * decoder of generated ids (the checks of fz_tok.h).
 *
 * Input layout:
 *   byte 0      bit 7 clear: text mode, bits 0-1 the encode flags
 *               (TOK_ENCODE_ADD_SPECIAL, TOK_ENCODE_SPLIT_SPECIAL), the
 *               rest is the text; bit 7 set: ids mode, the rest is a
 *               little-endian int32 array decoded with bit 0 as
 *               TOK_DECODE_SKIP_SPECIAL
 */
#include <stdlib.h>
#include <string.h>

#include "common/tok/tok_tokenizer.h"
#include "tests/fuzz/fz_tok.h"
#include "tests/fuzz/fz_util.h"

static struct tok_tokenizer tok;
static struct tok_cache cache;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        char path[4096], err[512];
        fz_data_path("tokenizers/qwen3", path, sizeof(path));
        if (tok_tokenizer_load(&tok, path, err, sizeof(err)) != 0)
            fz_fail("%s: %s", path, err);
        /* One cache for every input, as a long-lived encoder keeps it:
         * what a word cached earlier must not change later results. */
        if (tok_cache_init(&cache, &tok, 4096, err, sizeof(err)) != 0)
            fz_fail("tok_cache_init: %s", err);
        ready = 1;
    }
    if (size < 1)
        return 0;
    if (!(data[0] & 0x80)) {
        fz_tok_encode(&tok, &cache, (const char *)data + 1, size - 1,
                      data[0] & 3u);
        return 0;
    }
    size_t n = (size - 1) / sizeof(int32_t);
    int32_t *ids = malloc((n ? n : 1) * sizeof(int32_t));
    if (!ids)
        fz_fail("out of memory");
    memcpy(ids, data + 1, n * sizeof(int32_t));
    fz_tok_decode(&tok, ids, n, data[0] & 1u);
    free(ids);
    return 0;
}
