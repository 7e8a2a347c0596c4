/*
 * rt_link_plan.c — rt_link_send_plan: one scheduler step (rt_step.h) to
 * one BatchPlan per rank (proto/worker.proto), each rank receiving the
 * common entries plus its own page deltas and row lengths. See rt_link.h
 * for the contract.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "router/link/rt_link.h"
#include "router/link/rt_link_internal.h"
#include "worker.pb-c.h"

/* Five arrays, one capacity: cap_entries moves once all have grown. */
static int grow_entries(struct rt_link *link, int32_t n)
{
    int32_t c1 = link->cap_entries, c2 = c1, c3 = c1, c4 = c1, c5 = c1;
    if (TG_GROW(link->entry_slot, &c1, n) ||
        TG_GROW(link->entry_sample, &c2, n) ||
        TG_GROW(link->res_tokens, &c3, n) || TG_GROW(link->res_ids, &c4, n) ||
        TG_GROW(link->entry_plp, &c5, n))
        return TG_ENOMEM;
    link->cap_entries = c1;
    return 0;
}

static int check_step(const struct rt_link *link, const struct rt_step *s,
                      char *err, size_t errlen)
{
    int64_t rows = (int64_t)link->cfg.layout.num_layers *
                   link->cfg.layout.groups_per_layer;
    if (s->n_entries < 1 || !s->entries)
        return tg_err_set(err, errlen, TG_EINVAL, "step without entries");
    if (s->step_id <= link->last_step)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "step id %" PRIu64 " not after %" PRIu64,
                          s->step_id, link->last_step);
    for (int32_t i = 0; i < s->n_entries; i++) {
        const struct rt_step_entry *e = &s->entries[i];
        /* A fork entry has no tokens; the others at least one. */
        int fork = e->kind == RT_STEP_FORK;
        if (e->slot < 0 || e->n < (fork ? 0 : 1) || (fork && e->n != 0) ||
            !e->tokens || e->pos < 0 || e->pos + e->n > (int64_t)UINT32_MAX ||
            (e->kind != RT_STEP_PREFILL && e->kind != RT_STEP_DECODE &&
             !fork) ||
            (fork && (e->fork_from < 0 || e->fork_from == e->slot ||
                      !e->sample || !e->fresh || e->row_lens_off < 0)))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "entry %d: bad slot, kind or token range", i);
        for (int64_t t = 0; t < e->n; t++)
            if (e->tokens[t] < 0)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "entry %d: negative token id", i);
        for (int32_t j = 0; j < i; j++)
            if (s->entries[j].slot == e->slot)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "slot %d appears twice", e->slot);
        if (e->sampling == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "entry %d: no sampling parameters", i);
        if (e->row_lens_off >= 0 &&
            (!e->fresh || e->row_lens_off + (int64_t)link->cfg.world_size *
                                                rows > s->n_row_lens))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "entry %d: row lengths out of range", i);
        if (e->prompt_lp && (e->kind != RT_STEP_PREFILL || e->prompt_top < 0 ||
                             e->prompt_top > 20 || e->lp_next < -1))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "entry %d: bad prompt log-probabilities", i);
        if (e->has_head_lens &&
            (e->row_lens_off < 0 || s->n_heads < 1 || e->head_lens_off < 0 ||
             e->head_lens_off + (int64_t)link->cfg.world_size * s->n_heads >
                 s->n_head_lens))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "entry %d: head lengths out of range", i);
    }
    if (s->n_deltas < 0 || (s->n_deltas && (!s->deltas || !s->delta_ids)))
        return tg_err_set(err, errlen, TG_EINVAL, "bad delta arrays");
    for (int64_t i = 0; i < s->n_deltas; i++) {
        const struct rt_step_delta *d = &s->deltas[i];
        if (d->entry < 0 || d->entry >= s->n_entries || d->rank < 0 ||
            d->rank >= link->cfg.world_size || d->row < 0 || d->row >= rows ||
            d->n < 0 || d->off < 0 || d->off + d->n > s->n_ids ||
            (d->has_truncate && d->truncate_to < 0))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "delta %" PRId64 ": entry, rank, row or id "
                              "range out of bounds", i);
        for (int32_t k = 0; k < d->n; k++)
            if (s->delta_ids[d->off + k] < 0)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "delta %" PRId64 ": negative page id", i);
    }
    if (s->n_released < 0 || (s->n_released && !s->released))
        return tg_err_set(err, errlen, TG_EINVAL, "bad released array");
    for (int32_t i = 0; i < s->n_released; i++)
        if (s->released[i] < 0)
            return tg_err_set(err, errlen, TG_EINVAL, "negative freed slot");
    return 0;
}

/* Scratch of one send_plan call. */
struct plan_build {
    Tangram__Worker__V1__PlanEntry *pe;       /* (n_entries) */
    Tangram__Worker__V1__PlanEntry **pep;     /* (n_entries) */
    Tangram__Worker__V1__WorkerSampling *ws;  /* (n_entries) */

    Tangram__Worker__V1__PageDelta *pd;       /* (n_deltas) by rank */
    Tangram__Worker__V1__PageDelta **pdp;     /* (n_deltas) */
    int64_t *rank_start;                      /* (T + 1) */
};

static void plan_build_free(struct plan_build *b)
{
    free(b->pe);
    free(b->pep);
    free(b->ws);
    free(b->pd);
    free(b->pdp);
    free(b->rank_start);
}

/* An entry's sampling into its WorkerSampling ws (and the seed into the
 * entry p): the one place the value becomes protobuf. The arrays are only
 * read during pack (the casts drop const), like request_id. */
static void encode_sampling(const struct tg_sampling *sp,
                            Tangram__Worker__V1__PlanEntry *p,
                            Tangram__Worker__V1__WorkerSampling *ws)
{
    tangram__worker__v1__worker_sampling__init(ws);
    ws->temperature = sp->temperature;
    ws->top_p = sp->top_p;
    ws->top_k = sp->top_k;
    ws->min_p = sp->min_p;
    ws->presence_penalty = sp->presence_penalty;
    ws->frequency_penalty = sp->frequency_penalty;
    ws->repetition_penalty = sp->repetition_penalty;
    ws->n_top = (uint32_t)sp->n_top;
    ws->n_bias_ids = (size_t)sp->n_bias;
    ws->bias_ids = (int32_t *)(uintptr_t)sp->bias_ids;
    ws->n_bias_vals = (size_t)sp->n_bias;
    ws->bias_vals = (float *)(uintptr_t)sp->bias_vals;
    p->sampling = ws;
    p->seed = sp->seed;
}

int rt_link_send_plan(struct rt_link *link, const struct rt_step *step,
                      char *err, size_t errlen)
{
    if (!link || !link->initialized || link->closed)
        return tg_err_set(err, errlen, TG_EINVAL, "link not open");
    if (link->shut)
        return tg_err_set(err, errlen, TG_ECANCELED, "link shut down");
    if (!link->ready)
        return tg_err_set(err, errlen, TG_EAGAIN, "not every rank is ready");
    if (link->inflight)
        return tg_err_set(err, errlen, TG_EBUSY,
                          "step %" PRIu64 " still in flight", link->inflight);
    if (!step)
        return tg_err_set(err, errlen, TG_EINVAL, "no step");
    int rc = check_step(link, step, err, errlen);
    if (rc)
        return rc;
    const int T = link->cfg.world_size;
    const uint32_t G = link->cfg.layout.groups_per_layer;
    const size_t rows = (size_t)link->cfg.layout.num_layers * G;
    const int32_t n = step->n_entries;
    const int64_t nd = step->n_deltas;
    if (grow_entries(link, n))
        return tg_err_set(err, errlen, TG_ENOMEM, "no memory for entries");

    struct plan_build b = {0};
    b.pe = calloc((size_t)n, sizeof *b.pe);
    b.pep = calloc((size_t)n, sizeof *b.pep);
    b.ws = calloc((size_t)n, sizeof *b.ws);
    b.pd = calloc((size_t)(nd ? nd : 1), sizeof *b.pd);
    b.pdp = calloc((size_t)(nd ? nd : 1), sizeof *b.pdp);
    b.rank_start = calloc((size_t)T + 1, sizeof *b.rank_start);
    if (!b.pe || !b.pep || !b.ws || !b.pd || !b.pdp || !b.rank_start) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "no memory for the plan");
        goto out;
    }

    /* Entries: the same for every rank but the row lengths of adopted
     * KV, set per rank below. */
    for (int32_t i = 0; i < n; i++) {
        const struct rt_step_entry *e = &step->entries[i];
        Tangram__Worker__V1__PlanEntry *p = &b.pe[i];
        tangram__worker__v1__plan_entry__init(p);
        p->slot = (uint32_t)e->slot;
        /* protobuf-c only reads these during pack (casts drop const; the
         * int32 -> uint32 views are signed/unsigned variants of one type,
         * which C11 6.5p7 lets alias, and every value was checked >= 0). */
        p->request_id = (char *)(uintptr_t)(e->request_id ? e->request_id
                                                          : "");
        p->kind = e->kind == RT_STEP_PREFILL
                      ? TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_PREFILL
                  : e->kind == RT_STEP_FORK
                      ? TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_FORK
                      : TANGRAM__WORKER__V1__ENTRY_KIND__ENTRY_KIND_DECODE;
        if (e->kind == RT_STEP_FORK)
            p->fork_from = (uint32_t)e->fork_from;
        p->n_token_ids = (size_t)e->n;
        p->token_ids = (uint32_t *)(uintptr_t)e->tokens;
        p->start_pos = (uint32_t)e->pos;
        encode_sampling(e->sampling, p, &b.ws[i]);
        p->sample = e->sample ? 1 : 0;
        p->last_chunk = e->kind == RT_STEP_PREFILL && e->sample;
        p->num_prompt_tokens = e->num_prompt < 0 ? 0
                               : e->num_prompt > UINT32_MAX
                                   ? UINT32_MAX
                                   : (uint32_t)e->num_prompt;
        p->fresh = e->fresh ? 1 : 0;
        if (e->fresh && e->grammar != NULL) {
            p->grammar = (char *)(uintptr_t)e->grammar;
            p->n_grammar_tokens = (size_t)e->n_grammar_tokens;
            p->grammar_tokens = (uint32_t *)(uintptr_t)e->grammar_tokens;
            p->grammar_prepare = e->grammar_prepare;
        }
        if (e->prompt_lp) {
            p->prompt_logprobs = 1;
            p->prompt_top = (uint32_t)e->prompt_top;
            if (e->lp_next >= 0) {
                p->next_token_opt_case =
                    TANGRAM__WORKER__V1__PLAN_ENTRY__NEXT_TOKEN_OPT_NEXT_TOKEN;
                p->next_token = (uint32_t)e->lp_next;
            }
        }
        b.pep[i] = p;
    }

    /* Deltas bucketed by rank, keeping the step's order within a rank. */
    for (int64_t i = 0; i < nd; i++)
        b.rank_start[step->deltas[i].rank + 1]++;
    for (int r = 0; r < T; r++)
        b.rank_start[r + 1] += b.rank_start[r];
    {
        int64_t *fill = calloc((size_t)T, sizeof *fill);
        if (!fill) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "no memory for deltas");
            goto out;
        }
        for (int64_t i = 0; i < nd; i++) {
            const struct rt_step_delta *d = &step->deltas[i];
            int64_t at = b.rank_start[d->rank] + fill[d->rank]++;
            Tangram__Worker__V1__PageDelta *pd = &b.pd[at];
            tangram__worker__v1__page_delta__init(pd);
            pd->slot = (uint32_t)step->entries[d->entry].slot;
            pd->layer = (uint32_t)d->row / G;
            pd->group = (uint32_t)d->row % G;
            pd->n_page_ids = (size_t)d->n;
            pd->page_ids = (uint32_t *)(uintptr_t)(step->delta_ids + d->off);
            if (d->has_truncate) {
                pd->truncate_to_opt_case =
                    TANGRAM__WORKER__V1__PAGE_DELTA__TRUNCATE_TO_OPT_TRUNCATE_TO;
                pd->truncate_to = (uint32_t)d->truncate_to;
            }
            b.pdp[at] = pd;
        }
        free(fill);
    }

    Tangram__Worker__V1__BatchPlan plan = TANGRAM__WORKER__V1__BATCH_PLAN__INIT;
    plan.version = PROTO_V1;
    plan.step_id = step->step_id;
    plan.n_entries = (size_t)n;
    plan.entries = b.pep;
    plan.n_frees = (size_t)step->n_released;
    plan.frees = (uint32_t *)(uintptr_t)step->released;
    wmsg_t m = TANGRAM__WORKER__V1__WORKER_MESSAGE__INIT;
    m.version = PROTO_V1;
    m.body_case = TANGRAM__WORKER__V1__WORKER_MESSAGE__BODY_PLAN;
    m.plan = &plan;

    /* From here the plan is committed: failures become deaths. */
    for (int r = 0; r < T; r++) {
        for (int32_t i = 0; i < n; i++)
            if (step->entries[i].row_lens_off >= 0) {
                b.pe[i].n_row_lens = rows;
                b.pe[i].row_lens = (uint32_t *)(uintptr_t)(
                    step->row_lens + step->entries[i].row_lens_off +
                    (int64_t)r * (int64_t)rows);
                if (step->entries[i].has_head_lens) {
                    b.pe[i].n_head_lens = (size_t)step->n_heads;
                    b.pe[i].head_lens = (uint32_t *)(uintptr_t)(
                        step->head_lens + step->entries[i].head_lens_off +
                        (int64_t)r * step->n_heads);
                }
            }
        plan.n_page_deltas = (size_t)(b.rank_start[r + 1] - b.rank_start[r]);
        plan.page_deltas = b.pdp + b.rank_start[r];
        struct rt_link_rank *k = &link->ranks[r];
        char e[128];
        if (k->n_owed == RANK_OWED_MAX) {
            snprintf(k->kill_reason, sizeof k->kill_reason,
                     "%d steps unanswered", RANK_OWED_MAX);
            k->kill_pending = 1;
        } else if (rt_link__send_rank(link, r, &m, e, sizeof e) < 0) {
            snprintf(k->kill_reason, sizeof k->kill_reason,
                     "plan %" PRIu64 " not delivered: %s", step->step_id, e);
            k->kill_pending = 1;
        } else {
            k->owed[k->n_owed++] = step->step_id;
        }
    }
    link->last_step = step->step_id;
    link->inflight = step->step_id;
    link->n_answered = 0;
    link->failed = 0;
    link->step_error[0] = '\0';
    link->step_seconds = 0;
    link->host_seconds = 0;
    link->n_entries = n;
    link->n_res_heads = 0;
    link->n_res_head_vals = 0;
    for (int32_t i = 0; i < n; i++) {
        link->entry_slot[i] = (uint32_t)step->entries[i].slot;
        link->entry_sample[i] = step->entries[i].sample ? 1 : 0;
    }
    rt_link__plp_expect(link, step);
    rt_link__kick(link);
    rc = 0;
out:
    plan_build_free(&b);
    return rc;
}
