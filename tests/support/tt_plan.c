/* tt_plan.c — worker plans for tests (see tt_plan.h). */
#include "tests/support/tt_plan.h"

#include <stdlib.h>
#include <string.h>

void tt_plan_reset(struct tt_plan *p, uint64_t step)
{
    memset(p, 0, sizeof(*p));
    p->plan.version = GW_PROTOCOL_VERSION;
    p->plan.step_id = step;
    p->plan.entries = p->e;
    p->plan.deltas = p->d;
    p->plan.frees = p->frees;
}

int tt_plan_deltas(struct tt_plan *p, struct tt_req *r,
                   const struct kv_layout *kv)
{
    for (int l = 0; l < kv->n_layers; l++)
        for (int g = 0; g < kv->n_groups; g++) {
            int row = l * kv->n_groups + g;
            int32_t n;
            const int32_t *ids = kv_seq_row_ids(&r->seq, kv, l, g, &n);
            if (n <= r->sent[row])
                continue;
            if (p->plan.n_deltas >= TT_PLAN_MAX_DELTAS ||
                p->n_ids + (size_t)(n - r->sent[row]) > TT_PLAN_MAX_IDS)
                return -1;
            struct gw_delta *d = &p->d[p->plan.n_deltas++];
            memset(d, 0, sizeof(*d));
            d->slot = r->slot;
            d->layer = (uint32_t)l;
            d->group = (uint32_t)g;
            d->page_ids = p->ids + p->n_ids;
            for (int32_t k = r->sent[row]; k < n; k++) {
                p->ids[p->n_ids++] = (uint32_t)ids[k];
                d->n_page_ids++;
            }
            r->sent[row] = n;
        }
    return 0;
}

struct gw_entry *tt_plan_entry(struct tt_plan *p, struct tt_req *r, int kind,
                               const int32_t *toks, int n, int sample)
{
    if (p->plan.n_entries >= TT_PLAN_SLOTS || n < 0 || n > TT_PLAN_CHUNK)
        return NULL;
    size_t i = p->plan.n_entries++;
    struct gw_entry *e = &p->e[i];
    memset(e, 0, sizeof(*e));
    e->slot = r->slot;
    e->request_id = "req";
    e->kind = (enum gw_entry_kind)kind;
    for (int t = 0; t < n; t++)
        p->tok[i][t] = (uint32_t)toks[t];
    e->tokens = p->tok[i];
    e->n_tokens = (size_t)n;
    e->start_pos = (uint32_t)r->pos;
    e->sampling = TG_SAMPLING_OFF;
    e->sample = sample;
    e->num_prompt_tokens = (uint32_t)r->n_prompt;
    e->fresh = r->fresh;
    r->fresh = 0;
    return e;
}

int tt_req_init(struct tt_req *r, const struct kv_layout *kv, uint32_t slot,
                const int32_t *prompt, int n_prompt)
{
    char err[256];
    memset(r, 0, sizeof(*r));
    if (kv_seq_init(&r->seq, kv, err, sizeof(err)) != 0)
        return -1;
    r->sent = calloc((size_t)(kv->n_layers * kv->n_groups), sizeof(int32_t));
    if (r->sent == NULL)
        return -1;
    r->slot = slot;
    r->prompt = prompt;
    r->n_prompt = n_prompt;
    r->fresh = 1;
    return 0;
}

void tt_req_free(struct tt_req *r, struct kv_pool *pool)
{
    kv_seq_free(&r->seq, pool);
    free(r->sent);
    r->sent = NULL;
}
