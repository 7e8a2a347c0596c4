/* fz_gram.c — driving a grammar matcher from fuzzed bytes (fz_gram.h). */
#include "tests/fuzz/fz_gram.h"

#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_matcher.h"
#include "tests/fuzz/fz_util.h"
#include "tests/support/tt_grammar.h"

static int bit(const uint32_t *m, int32_t id)
{
    return (m[id >> 5] >> (id & 31)) & 1;
}

void fz_gram_drive(struct gm_grammar *g, const struct gm_vocab *v, int32_t eos,
                   const uint8_t *d, size_t n)
{
    size_t W = gm_vocab_mask_words(v);
    uint32_t *a = malloc(W * sizeof(*a)), *b = malloc(W * sizeof(*b));
    struct gm_matcher m;
    if (a == NULL || b == NULL || gm_matcher_init(&m, g) != 0)
        fz_fail("out of memory");
    for (size_t i = 0; i < n && i < 256; i++) {
        int ra = gm_matcher_fill_mask(&m, a, W);
        int rb = gm_matcher_fill_mask_naive(&m, b, W);
        if (ra != rb)
            fz_fail("fill_mask %d, naive %d", ra, rb);
        if (ra != 0)
            break;
        if (memcmp(a, b, W * sizeof(*a)) != 0) {
            char diff[512];
            tt_mask_diff(v, a, b, W, diff, sizeof diff);
            fz_fail("fast mask differs from the oracle: %s", diff);
        }
        if (bit(a, eos) != gm_matcher_can_end(&m))
            fz_fail("EOS allowed %d, can_end %d", bit(a, eos),
                    gm_matcher_can_end(&m));
        int allowed = bit(a, d[i]);
        int rc = gm_matcher_accept_token(&m, d[i]);
        if ((rc == 0) != allowed)
            fz_fail("byte 0x%02x: mask %d, accept %d", d[i], allowed, rc);
    }
    gm_matcher_free(&m);
    free(a);
    free(b);
}

int fz_gram_accepts(struct gm_grammar *g, const void *s, size_t n)
{
    struct gm_matcher m;
    if (gm_matcher_init(&m, g) != 0)
        fz_fail("out of memory");
    int ok = gm_matcher_accept_bytes(&m, s, n) == 0 && gm_matcher_can_end(&m);
    gm_matcher_free(&m);
    return ok;
}
