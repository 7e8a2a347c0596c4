/* gw_wlink_plp.c — a step's prompt log-probabilities as the StepResult's
 * PromptLogprobs records (gw_wlink.h, proto/worker.proto): one per
 * prefill entry that asked, ranks and alternatives' ids widened to the
 * message's uint32, the values borrowed from the step. */
#include "gpu_worker/serve/gw_wlink.h"

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

int gw_wlink__encode_plps(struct gw_wlink *l, const struct gw_result *r,
                          Tangram__Worker__V1__StepResult *out)
{
    out->n_prompt_logprobs = 0;
    out->prompt_logprobs = NULL;
    if (r->n_plps == 0)
        return 0;
    size_t need = 0, pcap = l->cap_plp;
    for (size_t i = 0; i < r->n_plps; i++)
        need += r->plps[i].n * (1 + (size_t)r->plps[i].n_top);
    if (tg_grow((void **)&l->plp, &l->cap_plp, r->n_plps, sizeof(*l->plp)) ||
        tg_grow((void **)&l->plp_ptrs, &pcap, r->n_plps,
                sizeof(*l->plp_ptrs)) ||
        tg_grow((void **)&l->plp_u32, &l->cap_plp_u32, need,
                sizeof(*l->plp_u32)))
        return TG_ENOMEM;
    uint32_t *u = l->plp_u32;
    for (size_t i = 0; i < r->n_plps; i++) {
        const struct gw_prompt_lps *p = &r->plps[i];
        Tangram__Worker__V1__PromptLogprobs *o = &l->plp[i];
        tangram__worker__v1__prompt_logprobs__init(o);
        size_t nt = p->n * (size_t)p->n_top;
        o->slot = p->slot;
        o->first_pos = p->first_pos;
        o->n_top = (uint32_t)p->n_top;
        o->n_logprobs = o->n_ranks = p->n;
        o->logprobs = p->n > 0 ? (float *)p->lp : NULL;
        for (size_t k = 0; k < p->n; k++) /* ranks are >= 1 */
            u[k] = (uint32_t)p->rank[k];
        o->ranks = p->n > 0 ? u : NULL;
        u += p->n;
        for (size_t k = 0; k < nt; k++) /* ids are in the vocabulary */
            u[k] = (uint32_t)p->top_ids[k];
        o->n_top_ids = o->n_top_logprobs = nt;
        o->top_ids = nt > 0 ? u : NULL;
        o->top_logprobs = nt > 0 ? (float *)p->top_lps : NULL;
        u += nt;
        l->plp_ptrs[i] = o;
    }
    out->n_prompt_logprobs = r->n_plps;
    out->prompt_logprobs = l->plp_ptrs;
    return 0;
}
