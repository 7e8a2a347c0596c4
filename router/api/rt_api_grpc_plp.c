/* rt_api_grpc_plp.c — the prompt's log-probabilities of a gRPC Generate
 * (GenerateRequest.prompt_logprobs) as its final GenerateResponse's
 * prompt_logprobs: the core's values (struct rt_prompt_lps) with each
 * token's text. See rt_api_grpc_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "router/api/rt_api.h"
#include "router/api/rt_api_grpc_internal.h"

void rt_api_grpc__plp_free(struct rt_api_grpc_plp *b)
{
    for (size_t i = 0; i < b->n_txt; i++)
        free(b->txt[i]);
    free(b->txt);
    free(b->v);
    free(b->vp);
    free(b->top);
    free(b->topp);
    memset(b, 0, sizeof(*b));
}

/* The token text of id, owned by b (NULL: out of memory). A protobuf
 * string must be UTF-8: a token that is part of a UTF-8 sequence shows
 * its bytes as "<0x..>" (tangram.proto TopLogprob.text). */
static char *text_of(const struct rt_req *r, struct rt_api_grpc_plp *b,
                     int32_t id)
{
    size_t len = 0, bad;
    const char *t = rt_server_token_text(r->srv, id, &len);
    if (t == NULL)
        t = "", len = 0;
    char *c;
    if (tok_utf8_valid(t, len, &bad)) {
        c = strndup(t, len);
    } else if ((c = malloc(len * 6 + 1)) != NULL) {
        for (size_t i = 0; i < len; i++)
            snprintf(c + i * 6, 7, "<0x%02X>", (unsigned char)t[i]);
        c[len * 6] = '\0';
    }
    if (c != NULL)
        b->txt[b->n_txt++] = c;
    return c;
}

int rt_api_grpc__plp(const struct rt_req *r, Tangram__V1__GenerateResponse *m,
                     struct rt_api_grpc_plp *b)
{
    const int32_t *prompt = NULL;
    const struct rt_prompt_lps *p = rt_req_prompt_lps(r, &prompt);
    size_t n = p->have > 0 ? (size_t)p->have : 0, k = (size_t)p->k;
    b->v = calloc(n + 1, sizeof(*b->v));
    b->vp = calloc(n + 1, sizeof(*b->vp));
    b->top = calloc(n * k + 1, sizeof(*b->top));
    b->topp = calloc(n * k + 1, sizeof(*b->topp));
    b->txt = calloc(n * (k + 1) + 1, sizeof(*b->txt));
    if (!b->v || !b->vp || !b->top || !b->topp || !b->txt)
        return TG_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        size_t pos = i + 1;
        Tangram__V1__PromptLogprob *o = &b->v[i];
        tangram__v1__prompt_logprob__init(o);
        o->token_id = (uint32_t)prompt[pos];
        o->logprob = p->lp[pos];
        o->rank = (uint32_t)p->rank[pos];
        if ((o->text = text_of(r, b, prompt[pos])) == NULL)
            return TG_ENOMEM;
        o->top = b->topp + i * k;
        for (size_t t = 0; t < k; t++) {
            int32_t id = p->top_ids[pos * k + t];
            if (id < 0)
                break;
            Tangram__V1__TopLogprob *tp = &b->top[i * k + t];
            tangram__v1__top_logprob__init(tp);
            tp->token_id = (uint32_t)id;
            tp->logprob = p->top_lps[pos * k + t];
            if ((tp->text = text_of(r, b, id)) == NULL)
                return TG_ENOMEM;
            o->top[o->n_top++] = tp;
        }
        b->vp[i] = o;
    }
    m->n_prompt_logprobs = n;
    m->prompt_logprobs = b->vp;
    return 0;
}
