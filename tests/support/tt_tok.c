/* tt_tok.c — helpers shared by the tokenizer tests (see tt_tok.h). */
#include "tests/support/tt_tok.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

/* The GPT-2 byte alphabet (bytes_to_unicode): printable Latin-1 maps to
 * itself, the rest to U+0100 + its rank. Writes UTF-8, returns length. */
int tt_tok_byte_char(int b, char *out)
{
    int cp;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) {
        cp = b;
    } else {
        int rank = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) ||
                  x >= 0xAE))
                rank++;
        cp = 0x100 + rank;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

void tt_tok_encode(const struct tok_tokenizer *tok, const char *s,
                   unsigned flags, struct tok_ids *out)
{
    char errbuf[512];
    out->n = 0;
    assert_int_equal(
        tok_encode(tok, NULL, s, strlen(s), flags, out, errbuf, sizeof errbuf),
        0);
}

void tt_tok_check_ids(const struct tok_ids *got, const struct tok_ids *want,
                      const char *what)
{
    int same = got->n == want->n &&
               (got->n == 0 || memcmp(got->v, want->v, got->n * 4) == 0);
    if (!same) {
        fprintf(stderr, "mismatch on %s: got", what);
        for (size_t i = 0; i < got->n; i++)
            fprintf(stderr, " %d", got->v[i]);
        fprintf(stderr, "\n  want");
        for (size_t i = 0; i < want->n; i++)
            fprintf(stderr, " %d", want->v[i]);
        fprintf(stderr, "\n");
    }
    assert_true(same);
}

