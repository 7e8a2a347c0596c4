/* tg_sampling.c — the one check of a sampling value and its bias arrays'
 * copy and release. */
#include "common/base/tg_sampling.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

int tg_sampling_check(const struct tg_sampling *s, int32_t vocab,
                      const char **field, char *msg, size_t cap)
{
    /* Each test is written so that NaN fails it. */
    const struct {
        const char *name;
        float v;
        int ok;
        const char *range;
    } f[] = {
        {"temperature", s->temperature,
         s->temperature >= 0.0f && isfinite(s->temperature),
         "a finite number >= 0"},
        {"top_p", s->top_p, s->top_p > 0.0f && s->top_p <= 1.0f, "in (0, 1]"},
        {"min_p", s->min_p, s->min_p >= 0.0f && s->min_p <= 1.0f, "in [0, 1]"},
        {"repetition_penalty", s->repetition_penalty,
         s->repetition_penalty > 0.0f && isfinite(s->repetition_penalty),
         "a finite number > 0"},
        {"presence_penalty", s->presence_penalty, isfinite(s->presence_penalty),
         "finite"},
        {"frequency_penalty", s->frequency_penalty,
         isfinite(s->frequency_penalty), "finite"},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        if (f[i].ok)
            continue;
        if (field != NULL)
            *field = f[i].name;
        return tg_err_set(msg, cap, TG_EINVAL,
                          "%s %g is out of range for the sampler (single "
                          "precision): it must be %s",
                          f[i].name, (double)f[i].v, f[i].range);
    }
    int32_t kmax = vocab > 0 && vocab < TG_SAMPLING_MAX_TOP
                       ? vocab
                       : TG_SAMPLING_MAX_TOP;
    if (s->n_top < 0 || s->n_top > kmax) {
        if (field != NULL)
            *field = "logprobs";
        return tg_err_set(msg, cap, TG_EINVAL,
                          "%d logprobs asked per token, allowed 0 .. %d",
                          (int)s->n_top, (int)kmax);
    }
    if (s->n_bias < 0 || (vocab > 0 && s->n_bias > vocab) ||
        (s->n_bias > 0 && (s->bias_ids == NULL || s->bias_vals == NULL))) {
        if (field != NULL)
            *field = "logit_bias";
        return tg_err_set(
            msg, cap, TG_EINVAL,
            "logit_bias with %d entries (arrays %s) for a "
            "vocabulary of %d",
            (int)s->n_bias,
            s->bias_ids != NULL && s->bias_vals != NULL ? "given" : "missing",
            (int)vocab);
    }
    for (int32_t k = 0; k < s->n_bias; k++) {
        int32_t id = s->bias_ids[k];
        if (id < 0 || (vocab > 0 && id >= vocab) ||
            (k > 0 && id <= s->bias_ids[k - 1]) || !isfinite(s->bias_vals[k])) {
            if (field != NULL)
                *field = "logit_bias";
            return tg_err_set(msg, cap, TG_EINVAL,
                              "logit_bias %g for token %d: ids must be "
                              "ascending, distinct and below the "
                              "vocabulary (%d), values finite",
                              (double)s->bias_vals[k], (int)id, (int)vocab);
        }
    }
    return 0;
}

int tg_sampling_bias_copy(struct tg_sampling *dst,
                          const struct tg_sampling *src)
{
    dst->bias_ids = NULL;
    dst->bias_vals = NULL;
    dst->n_bias = 0;
    if (src->n_bias <= 0)
        return 0;
    size_t n = (size_t)src->n_bias;
    int32_t *ids = malloc(n * sizeof(*ids));
    float *vals = malloc(n * sizeof(*vals));
    if (ids == NULL || vals == NULL) {
        free(ids);
        free(vals);
        return TG_ENOMEM;
    }
    memcpy(ids, src->bias_ids, n * sizeof(*ids));
    memcpy(vals, src->bias_vals, n * sizeof(*vals));
    dst->bias_ids = ids;
    dst->bias_vals = vals;
    dst->n_bias = src->n_bias;
    return 0;
}

void tg_sampling_bias_free(struct tg_sampling *s)
{
    /* The owner's arrays, const in the value so borrowers cannot write. */
    free((void *)(uintptr_t)s->bias_ids);
    free((void *)(uintptr_t)s->bias_vals);
    s->bias_ids = NULL;
    s->bias_vals = NULL;
    s->n_bias = 0;
}
