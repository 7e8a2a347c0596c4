/*
 * rt_link_heads.c — the head-length reports of a step's results
 * (StepResult.head_lens, proto/worker.proto): checked against the step in
 * flight and copied out of each rank's message, so on_result can hand all
 * ranks' reports to the scheduler (rt_sched_complete_heads). See rt_link.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "router/link/rt_link.h"
#include "router/link/rt_link_internal.h"

int rt_link__collect_heads(struct rt_link *link, int rank,
                           const Tangram__Worker__V1__StepResult *sr,
                           char *why, size_t n)
{
    if (sr->n_head_lens == 0)
        return 0;
    if (link->per_head != 1)
        return snprintf(why, n, "head lengths from a worker whose Hello "
                        "keeps none"), -1;
    const struct rt_link_layout *lay = &link->cfg.layout;
    const uint64_t want = (uint64_t)lay->num_layers * lay->groups_per_layer *
                          lay->heads_per_group;
    int64_t need = link->n_res_heads + (int64_t)sr->n_head_lens;
    int32_t cap = link->cap_res_heads, cap2 = link->cap_res_heads;
    int64_t vals = link->n_res_head_vals;
    for (size_t k = 0; k < sr->n_head_lens; k++)
        if (sr->head_lens[k] != NULL)
            vals += (int64_t)sr->head_lens[k]->n_head_lens;
    if (need > INT32_MAX || TG_GROW(link->res_heads, &cap, need) ||
        TG_GROW(link->res_head_off, &cap2, need) ||
        TG_GROW(link->res_head_vals, &link->cap_res_head_vals, vals)) {
        /* Whichever grew keeps its larger buffer; the count is the
         * smaller of the two, so both always hold it. */
        link->cap_res_heads = (int32_t)(cap < cap2 ? cap : cap2);
        return snprintf(why, n, "no memory for %zu head-length reports",
                        sr->n_head_lens), -1;
    }
    link->cap_res_heads = (int32_t)(cap < cap2 ? cap : cap2);
    for (size_t k = 0; k < sr->n_head_lens; k++) {
        const Tangram__Worker__V1__SlotHeadLens *h = sr->head_lens[k];
        if (h == NULL)
            return snprintf(why, n, "an empty head-length report"), -1;
        int32_t i = 0;
        while (i < link->n_entries && link->entry_slot[i] != h->slot)
            i++;
        if (i == link->n_entries)
            return snprintf(why, n, "head lengths for slot %" PRIu32
                            ", which has no entry in step %" PRIu64,
                            h->slot, link->inflight), -1;
        for (int32_t j = 0; j < link->n_res_heads; j++)
            if (link->res_heads[j].entry == i &&
                link->res_heads[j].rank == rank)
                return snprintf(why, n, "head lengths for slot %" PRIu32
                                " twice", h->slot), -1;
        if ((uint64_t)h->n_head_lens != want)
            return snprintf(why, n, "%zu head lengths for slot %" PRIu32
                            ", expected %" PRIu64 " (L x G x H_p)",
                            h->n_head_lens, h->slot, want), -1;
        int32_t *dst = link->res_head_vals + link->n_res_head_vals;
        for (size_t v = 0; v < h->n_head_lens; v++) {
            if (h->head_lens[v] > INT32_MAX)
                return snprintf(why, n, "head length %" PRIu32 " for slot "
                                "%" PRIu32, h->head_lens[v], h->slot), -1;
            dst[v] = (int32_t)h->head_lens[v];
        }
        int32_t at = link->n_res_heads++;
        link->res_heads[at] = (struct rt_step_heads){
            .entry = i, .rank = rank, .head_lens = NULL,
            .n = (int64_t)h->n_head_lens};
        link->res_head_off[at] = link->n_res_head_vals;
        link->n_res_head_vals += (int64_t)h->n_head_lens;
    }
    return 0;
}

void rt_link__heads_result(struct rt_link *link, struct rt_link_result *res)
{
    /* The values buffer may have moved while ranks answered: point the
     * reports at it only now. */
    for (int32_t k = 0; k < link->n_res_heads; k++)
        link->res_heads[k].head_lens =
            link->res_head_vals + link->res_head_off[k];
    res->heads = link->n_res_heads > 0 ? link->res_heads : NULL;
    res->n_heads = link->n_res_heads;
}

void rt_link__heads_free(struct rt_link *link)
{
    free(link->res_heads);
    free(link->res_head_off);
    free(link->res_head_vals);
    link->res_heads = NULL;
    link->res_head_off = NULL;
    link->res_head_vals = NULL;
    link->n_res_heads = link->cap_res_heads = 0;
    link->n_res_head_vals = link->cap_res_head_vals = 0;
}
