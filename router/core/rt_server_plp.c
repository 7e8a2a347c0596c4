/*
 * rt_server_plp.c — the prompt log-probabilities of requests that ask for
 * them (rt_server.h, struct rt_prompt_lps of rt_request.h): the store
 * sized at submission, filled from rank 0's records of each prefill chunk
 * (router/link/rt_link.h struct rt_link_plp), freed with the request.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "router/core/rt_server.h"
#include "router/core/rt_server_internal.h"

void rt_server__plp_free(struct rt_req *r)
{
    struct rt_prompt_lps *p = r->core->plp;
    if (p == NULL)
        return;
    free(p->lp);
    free(p->rank);
    free(p->top_ids);
    free(p->top_lps);
    free(p);
    r->core->plp = NULL;
}

int rt_server__plp_alloc(struct rt_req *r, struct rt_request_error *e)
{
    if (!r->q.opts.prompt_lp || r->core->plp != NULL)
        return 0;
    size_t n = (size_t)r->n_prompt, k = (size_t)r->q.opts.prompt_top;
    struct rt_prompt_lps *p = calloc(1, sizeof(*p));
    if (p != NULL) {
        p->n = r->n_prompt;
        p->k = r->q.opts.prompt_top;
        p->lp = malloc(n * sizeof(float));
        p->rank = malloc(n * sizeof(int32_t));
        p->top_ids = malloc(n * k * sizeof(int32_t) + 1);
        p->top_lps = malloc(n * k * sizeof(float) + 1);
    }
    r->core->plp = p;
    if (p == NULL || !p->lp || !p->rank || !p->top_ids || !p->top_lps) {
        rt_server__plp_free(r);
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory for the prompt's "
                             "log-probabilities");
        return TG_ENOMEM;
    }
    p->lp[0] = NAN;
    p->rank[0] = 0;
    return 0;
}

void rt_server__plp_take(struct rt_req *r, const struct rt_link_plp *c)
{
    struct rt_prompt_lps *p = r->core->plp;
    if (p == NULL)
        return;
    size_t k = (size_t)p->k, ck = c->n_top;
    for (size_t i = 0; i < c->n; i++) {
        int64_t pos = c->first_pos + (int64_t)i;
        /* Chunks come in position order; a restart after preemption
         * computes positions again (the first values stand) and its
         * chunks may run past the prompt into generated tokens. */
        if (pos != p->have + 1 || pos >= p->n)
            continue;
        p->lp[pos] = c->logprobs[i];
        p->rank[pos] = (int32_t)c->ranks[i];
        for (size_t t = 0; t < k; t++) {
            p->top_ids[(size_t)pos * k + t] =
                t < ck ? (int32_t)c->top_ids[i * ck + t] : -1;
            p->top_lps[(size_t)pos * k + t] = t < ck
                                                  ? c->top_logprobs[i * ck + t]
                                                  : -INFINITY;
        }
        p->have = pos;
    }
}

const struct rt_prompt_lps *rt_req_prompt_lps(const struct rt_req *r,
                                              const int32_t **ids)
{
    if (ids != NULL)
        *ids = r->core->prompt;
    return r->core->plp;
}
