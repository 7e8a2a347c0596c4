/*
 * cpu_mask.c — a structured-output token mask applied to a logits row
 * (DESIGN.md §4.11): every id whose bit is 0 gets -inf, so neither the
 * draw nor the log-probabilities computed from the row afterwards can name
 * it. Bit i of mask[i >> 5] (1u << (i & 31)) stands for id i, the layout
 * of common/grammar/gm_matcher.h's masks.
 */
#include <math.h>

#include "common/base/tg_err.h"
#include "kernels/cpu/cpu_internal.h"

int cpu__logits_mask(struct tg_backend *b, float *logits, int vocab,
                     const uint32_t *mask)
{
    (void)b;
    if (logits == NULL || mask == NULL || vocab < 1)
        return TG_EINVAL;
    int words = (vocab + 31) / 32;
    for (int w = 0; w < words; w++) {
        uint32_t m = mask[w];
        if (m == 0xFFFFFFFFu)
            continue;
        int end = w * 32 + 32 < vocab ? w * 32 + 32 : vocab;
        for (int j = w * 32; j < end; j++)
            if (!(m >> (j & 31) & 1u))
                logits[j] = -INFINITY;
    }
    return 0;
}
