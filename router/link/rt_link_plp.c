/*
 * rt_link_plp.c — the prompt log-probabilities of a step's prefill chunks
 * (PlanEntry.prompt_logprobs, StepResult.prompt_logprobs of
 * proto/worker.proto): what each entry that asked must get back, and rank
 * 0's records checked against it. See rt_link.h (struct rt_link_plp).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>

#include "router/link/rt_link.h"
#include "router/link/rt_link_internal.h"

void rt_link__plp_expect(struct rt_link *link, const struct rt_step *step)
{
    for (int32_t i = 0; i < step->n_entries; i++) {
        const struct rt_step_entry *e = &step->entries[i];
        struct rt_link_plp *w = &link->entry_plp[i];
        *w = (struct rt_link_plp){.n_top = SIZE_MAX};
        if (!e->prompt_lp)
            continue;
        w->first_pos = e->pos + 1;
        w->n = (size_t)e->n - (e->lp_next >= 0 ? 0 : 1);
        w->n_top = (size_t)e->prompt_top;
    }
}

int rt_link__plp_result(struct rt_link *link,
                        const Tangram__Worker__V1__StepResult *sr, char *why,
                        size_t n)
{
    int32_t want = 0, got = 0;
    for (int32_t i = 0; i < link->n_entries; i++)
        want += link->entry_plp[i].n_top != SIZE_MAX;
    uint32_t V = link->cfg.layout.vocab_size;
    for (size_t k = 0; sr != NULL && k < sr->n_prompt_logprobs; k++) {
        const Tangram__Worker__V1__PromptLogprobs *p = sr->prompt_logprobs[k];
        if (p == NULL)
            return snprintf(why, n,
                            "rank 0: an empty prompt log-probability "
                            "record"),
                   -1;
        int32_t i = 0;
        while (i < link->n_entries && link->entry_slot[i] != p->slot)
            i++;
        struct rt_link_plp *w = i < link->n_entries ? &link->entry_plp[i]
                                                    : NULL;
        if (w == NULL || w->n_top == SIZE_MAX ||
            link->res_tokens[i].plp != NULL)
            return snprintf(why, n,
                            "rank 0: prompt log-probabilities for "
                            "slot %" PRIu32 ", which did not ask for them "
                            "(or twice)",
                            p->slot),
                   -1;
        if ((int64_t)p->first_pos != w->first_pos || p->n_logprobs != w->n ||
            p->n_ranks != w->n || p->n_top != w->n_top ||
            p->n_top_ids != w->n * w->n_top ||
            p->n_top_logprobs != w->n * w->n_top)
            return snprintf(
                       why, n,
                       "rank 0: slot %" PRIu32 "'s prompt "
                       "log-probabilities have the wrong shape (from "
                       "%" PRIu32 ", %zu values, %zu ranks, %" PRIu32
                       " x %zu alternatives; want from %" PRId64 ", %zu x %zu)",
                       p->slot, p->first_pos, p->n_logprobs, p->n_ranks,
                       p->n_top, p->n_top_ids, w->first_pos, w->n, w->n_top),
                   -1;
        for (size_t j = 0; j < p->n_top_ids; j++)
            if (V != 0 && p->top_ids[j] >= V)
                return snprintf(why, n,
                                "rank 0: slot %" PRIu32 "'s prompt "
                                "alternative %" PRIu32 " is outside the "
                                "vocabulary",
                                p->slot, p->top_ids[j]),
                       -1;
        w->logprobs = p->logprobs;
        w->ranks = p->ranks;
        w->top_ids = p->top_ids;
        w->top_logprobs = p->top_logprobs;
        link->res_tokens[i].plp = w;
        got++;
    }
    if (got != want)
        return snprintf(why, n,
                        "rank 0 returned the prompt "
                        "log-probabilities of %d of %d chunks",
                        (int)got, (int)want),
               -1;
    return 0;
}
