/* rt_request.c — the core's request value: the error a request fails
 * with, fitting max_tokens to the context, the copy a parallel sample
 * gets, and freeing. */
#include "router/core/rt_request.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

void rt_request_error_vset(struct rt_request_error *e, enum rt_req_err kind,
                           const char *code, const char *param, const char *fmt,
                           va_list ap)
{
    e->kind = kind;
    e->code = code;
    snprintf(e->param, sizeof(e->param), "%s", param != NULL ? param : "");
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
}

void rt_request_error_set(struct rt_request_error *e, enum rt_req_err kind,
                          const char *code, const char *param, const char *fmt,
                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_request_error_vset(e, kind, code, param, fmt, ap);
    va_end(ap);
}

/* Fills *e (400 and `code` naming `param`) and returns rc. */
static int fail(struct rt_request_error *e, int rc, const char *code,
                const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(struct rt_request_error *e, int rc, const char *code,
                const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_request_error_vset(e, RT_REQ_ERR_INVALID, code, param, fmt, ap);
    va_end(ap);
    return rc;
}

int rt_request_fit(struct rt_request *r, int32_t max_model_len,
                   int64_t n_prompt_tokens, struct rt_request_error *e)
{
    const char *pp = r->is_chat ? "messages" : "prompt";
    if (n_prompt_tokens <= 0)
        return fail(e, TG_EFORMAT, "invalid_value", pp,
                    "the prompt is empty after tokenization");
    if (max_model_len <= 0)
        return 0;
    if (n_prompt_tokens >= max_model_len)
        return fail(e, TG_ETOOBIG, "context_length_exceeded", pp,
                    "the prompt has %" PRId64 " tokens; this model's context "
                    "is %d tokens, which must also hold at least one "
                    "generated token",
                    n_prompt_tokens, (int)max_model_len);
    int64_t room = max_model_len - n_prompt_tokens;
    struct rt_gen_opts *s = &r->opts;
    if (s->max_tokens < 0) {
        s->max_tokens = (int32_t)room;
    } else if (s->max_tokens > room) {
        return fail(e, TG_ETOOBIG, "context_length_exceeded",
                    r->max_tokens_param,
                    "this model's context is %d tokens, but %" PRId64
                    " prompt tokens plus %d requested in '%s' make %" PRId64
                    "; reduce the prompt or '%s'",
                    (int)max_model_len, n_prompt_tokens, (int)s->max_tokens,
                    r->max_tokens_param, n_prompt_tokens + s->max_tokens,
                    r->max_tokens_param);
    }
    if (s->min_tokens > s->max_tokens)
        return fail(e, TG_ERANGE, "invalid_value", "min_tokens",
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

int rt_request_copy_sample(const struct rt_request *src, struct rt_request *out)
{
    int bad = 0;
    memset(out, 0, sizeof(*out));
    out->is_chat = src->is_chat;
    out->n = 1;
    out->chat.add_generation_prompt = src->chat.add_generation_prompt;
    out->chat.continue_final_message = src->chat.continue_final_message;
    out->chat.tools = ct_tools_ref(src->chat.tools);
    out->add_special_tokens = src->add_special_tokens;
    out->max_tokens_param = src->max_tokens_param;
    out->user = dup_or_null(src->user, &bad);
    out->request_id = dup_or_null(src->request_id, &bad);
    out->grammar = dup_or_null(src->grammar, &bad);
    out->grammar_param = src->grammar_param;
    out->sampling = src->sampling;
    bad |= tg_sampling_bias_copy(&out->sampling, &src->sampling) != 0;
    struct rt_gen_opts *d = &out->opts;
    const struct rt_gen_opts *f = &src->opts;
    *d = *f;
    d->stop = NULL;
    d->n_stop = 0;
    d->stop_token_ids = dup_bytes(f->stop_token_ids,
                                  f->n_stop_token_ids * sizeof(int32_t), &bad);
    d->n_stop_token_ids = d->stop_token_ids != NULL ? f->n_stop_token_ids : 0;
    if (f->n_stop > 0) {
        d->stop = calloc(f->n_stop, sizeof(char *));
        bad |= d->stop == NULL;
        for (size_t i = 0; d->stop != NULL && i < f->n_stop; i++) {
            d->stop[i] = dup_or_null(f->stop[i], &bad);
            d->n_stop += d->stop[i] != NULL;
        }
    }
    if (bad) {
        rt_request_free(out);
        return TG_ENOMEM;
    }
    return 0;
}

void rt_request_free(struct rt_request *r)
{
    free(r->prompt);
    free(r->prompt_ids);
    ct_chat_free(&r->chat);
    for (size_t i = 0; i < r->opts.n_stop; i++)
        free(r->opts.stop[i]);
    free(r->opts.stop);
    free(r->opts.stop_token_ids);
    tg_sampling_bias_free(&r->sampling);
    free(r->user);
    free(r->session_id);
    free(r->request_id);
    free(r->grammar);
    memset(r, 0, sizeof(*r));
}
