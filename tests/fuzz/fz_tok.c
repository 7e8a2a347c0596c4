/* fz_tok.c — tokenizer checks shared by the tokenizer harnesses (see
 * fz_tok.h). */
#include "tests/fuzz/fz_tok.h"

#include <string.h>

#include "common/base/tg_err.h"
#include "tests/fuzz/fz_util.h"

void fz_tok_decode(const struct tok_tokenizer *tok, const int32_t *ids,
                   size_t n, unsigned flags)
{
    char err[512];
    struct tg_buf all = {0}, streamed = {0};
    if (tok_decode(tok, ids, n, flags, &all, err, sizeof(err)) != 0)
        fz_fail("tok_decode: %s", err);
    if (all.len > 0 && !tok_utf8_valid(all.data, all.len, NULL))
        fz_fail("tok_decode wrote ill-formed UTF-8");
    struct tok_stream st;
    tok_stream_init(&st, tok, flags);
    for (size_t i = 0; i < n; i++)
        if (tok_stream_put(&st, ids[i], &streamed, err, sizeof(err)) != 0)
            fz_fail("tok_stream_put: %s", err);
    if (tok_stream_finish(&st, &streamed, err, sizeof(err)) != 0)
        fz_fail("tok_stream_finish: %s", err);
    if (all.len != streamed.len ||
        (all.len > 0 && memcmp(all.data, streamed.data, all.len) != 0))
        fz_fail("streaming decode (%zu bytes) differs from tok_decode "
                "(%zu bytes)",
                streamed.len, all.len);
    tg_buf_free(&all);
    tg_buf_free(&streamed);
}

void fz_tok_encode(const struct tok_tokenizer *tok, struct tok_cache *c,
                   const char *text, size_t n, unsigned flags)
{
    char err[512];
    struct tok_ids a = {0}, b = {0};
    int ra = tok_encode(tok, c, text, n, flags, &a, err, sizeof(err));
    int rb = tok_encode(tok, NULL, text, n, flags, &b, err, sizeof(err));
    if (ra != rb)
        fz_fail("tok_encode with and without a cache: %d vs %d", ra, rb);
    if (ra == 0) {
        if (a.n != b.n ||
            (a.n > 0 && memcmp(a.v, b.v, a.n * sizeof(int32_t)) != 0))
            fz_fail("the word cache changed the ids");
        for (size_t i = 0; i < a.n; i++)
            if (a.v[i] < 0 || a.v[i] >= tok_vocab_size(tok) ||
                tok_id_bytes(tok, a.v[i], &(size_t){0}) == NULL)
                fz_fail("tok_encode gave id %d, not a token", (int)a.v[i]);
        fz_tok_decode(tok, a.v, a.n, 0);
        fz_tok_decode(tok, a.v, a.n, TOK_DECODE_SKIP_SPECIAL);
    } else if (ra != TG_EINVAL && ra != TG_ETOOBIG) {
        fz_fail("tok_encode: %d %s", ra, err);
    } else if (a.n != 0) {
        fz_fail("a failed tok_encode left ids behind");
    }
    tok_ids_free(&a);
    tok_ids_free(&b);
}
