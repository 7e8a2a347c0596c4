/* rt_openai_gen.c — the parsed request value of rt_openai.h after the
 * parse: the sampling defaults, the checks that hold once values are
 * converted to what the scheduler and workers take (single precision),
 * fitting max_tokens to the context, the copy a parallel sample gets, and
 * freeing. */
#include "router/api/rt_openai.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/api/rt_openai_internal.h"

void rt_sampling_init(struct rt_sampling *s)
{
    memset(s, 0, sizeof(*s));
    s->max_tokens = -1;
    s->temperature = 1.0;
    s->top_p = 1.0;
    s->repetition_penalty = 1.0;
    s->skip_special_tokens = true;
    s->logprobs = -1;
}

int rt_sampling_check_converted(const struct rt_sampling *sp,
                                struct rt_api_error *e)
{
    const struct {
        const char *name;
        double v;
        int ok; /* of the single-precision value */
    } f[] = {
        {"temperature", sp->temperature,
         isfinite((float)sp->temperature) && (float)sp->temperature >= 0.0f},
        {"top_p", sp->top_p,
         (float)sp->top_p > 0.0f && (float)sp->top_p <= 1.0f},
        {"min_p", sp->min_p,
         (float)sp->min_p >= 0.0f && (float)sp->min_p <= 1.0f},
        {"presence_penalty", sp->presence_penalty,
         isfinite((float)sp->presence_penalty)},
        {"frequency_penalty", sp->frequency_penalty,
         isfinite((float)sp->frequency_penalty)},
        {"repetition_penalty", sp->repetition_penalty,
         isfinite((float)sp->repetition_penalty) &&
             (float)sp->repetition_penalty > 0.0f},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (!f[i].ok)
            return rt_openai__fail(e, TG_EINVAL, 400, "invalid_value",
                                   f[i].name,
                                   "%s %.17g is out of range once converted "
                                   "to single precision (%g)", f[i].name,
                                   f[i].v, (double)(float)f[i].v);
    return 0;
}

int rt_gen_request_fit(struct rt_gen_request *r, int32_t max_model_len,
                       int64_t n_prompt_tokens, struct rt_api_error *e)
{
    const char *pp = r->endpoint == RT_ENDPOINT_CHAT ? "messages" : "prompt";
    if (n_prompt_tokens <= 0)
        return rt_openai__fail(e, TG_EFORMAT, 400, "invalid_value", pp,
                               "the prompt is empty after tokenization");
    if (max_model_len <= 0)
        return 0;
    if (n_prompt_tokens >= max_model_len)
        return rt_openai__fail(
            e, TG_ETOOBIG, 400, "context_length_exceeded", pp,
            "the prompt has %" PRId64 " tokens; this model's context "
            "is %d tokens, which must also hold at least one "
            "generated token",
            n_prompt_tokens, (int)max_model_len);
    int64_t room = max_model_len - n_prompt_tokens;
    struct rt_sampling *s = &r->sampling;
    if (s->max_tokens < 0) {
        s->max_tokens = (int32_t)room;
    } else if (s->max_tokens > room) {
        return rt_openai__fail(
            e, TG_ETOOBIG, 400, "context_length_exceeded", r->max_tokens_param,
            "this model's context is %d tokens, but %" PRId64
            " prompt tokens plus %d requested in '%s' make %" PRId64
            "; reduce the prompt or '%s'",
            (int)max_model_len, n_prompt_tokens, (int)s->max_tokens,
            r->max_tokens_param, n_prompt_tokens + s->max_tokens,
            r->max_tokens_param);
    }
    if (s->min_tokens > s->max_tokens)
        return rt_openai__fail(
            e, TG_ERANGE, 400, "invalid_value", "min_tokens",
            "'min_tokens' (%d) exceeds the %d tokens that fit in the "
            "context",
            (int)s->min_tokens, (int)s->max_tokens);
    return 0;
}

static char *dup_or_null(const char *p, int *bad)
{
    char *d = p != NULL ? strdup(p) : NULL;
    *bad |= p != NULL && d == NULL;
    return d;
}

static void *dup_bytes(const void *p, size_t n, int *bad)
{
    if (p == NULL || n == 0)
        return NULL;
    void *d = malloc(n);
    if (d == NULL)
        *bad = 1;
    else
        memcpy(d, p, n);
    return d;
}

int rt_gen_request_copy_sample(const struct rt_gen_request *src,
                               struct rt_gen_request *out)
{
    int bad = 0;
    memset(out, 0, sizeof(*out));
    out->endpoint = src->endpoint;
    out->n = 1;
    out->tool_choice = src->tool_choice;
    out->chat.add_generation_prompt = src->chat.add_generation_prompt;
    out->chat.continue_final_message = src->chat.continue_final_message;
    out->add_special_tokens = src->add_special_tokens;
    out->max_tokens_param = src->max_tokens_param;
    out->stream = src->stream;
    out->include_usage = src->include_usage;
    out->continuous_usage = src->continuous_usage;
    out->echo = src->echo;
    out->model = dup_or_null(src->model, &bad);
    out->user = dup_or_null(src->user, &bad);
    out->request_id = dup_or_null(src->request_id, &bad);
    out->grammar = dup_or_null(src->grammar, &bad);
    if (src->tools != NULL)
        out->tools = json_incref(src->tools);
    out->echo_text = dup_bytes(src->echo_text, src->echo_len + 1, &bad);
    out->echo_len = out->echo_text != NULL ? src->echo_len : 0;
    struct rt_sampling *d = &out->sampling;
    const struct rt_sampling *f = &src->sampling;
    *d = *f;
    d->stop = NULL;
    d->n_stop = 0;
    d->stop_token_ids = dup_bytes(f->stop_token_ids,
                                  f->n_stop_token_ids * sizeof(int32_t), &bad);
    d->n_stop_token_ids = d->stop_token_ids != NULL ? f->n_stop_token_ids : 0;
    d->bias_ids = dup_bytes(f->bias_ids, f->n_bias * sizeof(int32_t), &bad);
    d->bias_vals = dup_bytes(f->bias_vals, f->n_bias * sizeof(float), &bad);
    d->n_bias = d->bias_ids != NULL && d->bias_vals != NULL ? f->n_bias : 0;
    if (f->n_stop > 0) {
        d->stop = calloc(f->n_stop, sizeof(char *));
        bad |= d->stop == NULL;
        for (size_t i = 0; d->stop != NULL && i < f->n_stop; i++) {
            d->stop[i] = dup_or_null(f->stop[i], &bad);
            d->n_stop += d->stop[i] != NULL;
        }
    }
    if (bad) {
        rt_gen_request_free(out);
        return TG_ENOMEM;
    }
    return 0;
}

void rt_gen_request_free(struct rt_gen_request *r)
{
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    rt_openai_chat_messages_free(r->messages, r->n_messages);
    json_decref(r->chat_messages);
    json_decref(r->tools);
    json_decref(r->chat.kwargs);
    for (size_t i = 0; i < r->sampling.n_stop; i++)
        free(r->sampling.stop[i]);
    free(r->sampling.stop);
    free(r->sampling.stop_token_ids);
    free(r->echo_text);
    free(r->sampling.bias_ids);
    free(r->sampling.bias_vals);
    free(r->user);
    free(r->session_id);
    free(r->request_id);
    free(r->grammar);
    memset(r, 0, sizeof(*r));
}
