/* gw_worker_check.c — validation of a plan against a worker's slots before
 * anything runs (gw_worker_internal.h): every entry, page delta, the room
 * each row needs and the forks are checked on a simulated copy of the
 * slots' state, so a plan that is refused changes nothing. The worker's
 * thread only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/base/tg_err.h"
#include "gpu_worker/serve/gw_worker.h"
#include "gpu_worker/serve/gw_worker_internal.h"

/* Brings slot s's simulated state up to date with its real one, once per
 * validation pass. */
static void sim_touch(struct gw_worker *w, uint32_t s)
{
    if (w->sim_stamp[s] == w->sim_serial)
        return;
    w->sim_stamp[s] = w->sim_serial;
    w->touched[w->n_touched++] = (int32_t)s;
    const struct gw_slot *sl = &w->step.slots[s];
    size_t R = (size_t)w->rows;
    w->sim_active[s] = sl->active;
    w->sim_pos[s] = sl->pos;
    memcpy(w->sim_n + s * R, sl->kv.n_pages, R * sizeof(int32_t));
    memcpy(w->sim_len + s * R, sl->kv.filled, R * sizeof(int32_t));
}

static void sim_clear(struct gw_worker *w, uint32_t s)
{
    size_t R = (size_t)w->rows;
    sim_touch(w, s);
    w->sim_active[s] = 0;
    w->sim_pos[s] = 0;
    memset(w->sim_n + s * R, 0, R * sizeof(int32_t));
    memset(w->sim_len + s * R, 0, R * sizeof(int32_t));
}

/* Head lengths of a fresh entry adopting stored KV (row_lens checked by
 * the caller): a worker keeping them, L * Hkv values, none beyond
 * start_pos, and each row as long as its longest head (kv_heads_row_max,
 * the router's own rule). */
static int check_head_lens(struct gw_worker *w, const struct gw_entry *e,
                           const char *rid, char *err, size_t errlen)
{
    const struct kv_layout *kv = &w->layout;
    size_t heads = (size_t)kv->n_layers * (size_t)kv->n_kv_heads;
    if (!w->per_head || e->n_head_lens != heads ||
        e->n_row_lens != (size_t)w->rows)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): %zu head lengths; this "
                          "worker %s", e->slot, rid, e->n_head_lens,
                          w->per_head ? "needs them with row_lens, one per "
                                        "KV head of the rank"
                                      : "keeps whole rows only");
    for (size_t h = 0; h < heads; h++)
        if (e->head_lens[h] > e->start_pos)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "slot %u (request '%s'): head %zu holds %u "
                              "tokens, more than start_pos %u", e->slot, rid,
                              h, e->head_lens[h], e->start_pos);
    /* Bounded by start_pos (a uint32) above, so the int32 view is exact
     * for every position a model reaches (check_entry bounds it). */
    kv_heads_row_max(kv, (const int32_t *)e->head_lens, w->row_max);
    for (size_t r = 0; r < (size_t)w->rows; r++)
        if ((uint32_t)w->row_max[r] != e->row_lens[r])
            return tg_err_set(err, errlen, TG_EINVAL,
                              "slot %u (request '%s'): row %zu holds %u "
                              "tokens but its longest head %d", e->slot, rid,
                              r, e->row_lens[r], (int)w->row_max[r]);
    return 0;
}

/* A fork entry (a parallel sample, proto ENTRY_KIND_FORK): fresh, no
 * tokens, rows given, a draw, and an earlier entry of the plan that runs
 * the source slot's last prefill chunk (with a draw) ending where the
 * fork starts. The rows themselves are checked against the source's once
 * the deltas are known (check_forks). */
static int check_fork(struct gw_worker *w, const struct gw_entry *e,
                      char *err, size_t errlen)
{
    const char *rid = e->request_id != NULL ? e->request_id : "";
    uint32_t s = e->slot, src = e->fork_from;
    if (e->n_tokens != 0 || !e->fresh || !e->sample ||
        e->n_row_lens != (size_t)w->rows)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): a fork entry is fresh, "
                          "samples, has no tokens and %d row lengths", s,
                          rid, w->rows);
    if (src >= (uint32_t)w->max_slots || src == s || w->entry_of[src] < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): fork from slot %u, which "
                          "has no earlier entry in this plan", s, rid, src);
    const struct gw_entry *se = &w->plan_entries[w->entry_of[src]];
    if (se->kind != GW_ENTRY_PREFILL || !se->last_chunk || !se->sample ||
        (uint64_t)se->start_pos + se->n_tokens != e->start_pos)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): fork from slot %u at "
                          "position %u, which is not the end of a last "
                          "prefill chunk with a draw in this plan", s, rid,
                          src, e->start_pos);
    return 0;
}

static int check_entry(struct gw_worker *w, size_t i, const struct gw_entry *e,
                       char *err, size_t errlen)
{
    const struct gw_model *m = &w->model;
    const char *rid = e->request_id != NULL ? e->request_id : "";
    if (e->slot >= (uint32_t)w->max_slots)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "entry %zu (request '%s'): unknown slot %u (the "
                          "worker has %d)", i, rid, e->slot, w->max_slots);
    uint32_t s = e->slot;
    if (w->entry_of[s] >= 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "entry %zu (request '%s'): slot %u already has "
                          "entry %d in this plan", i, rid, s, w->entry_of[s]);
    w->entry_of[s] = (int32_t)i;
    size_t n = e->n_tokens;
    if (e->kind == GW_ENTRY_PREFILL) {
        if (n < 1 || n > (size_t)w->layout.prefill_chunk)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "slot %u (request '%s'): prefill chunk of %zu "
                              "tokens, allowed 1 .. %d", s, rid, n,
                              w->layout.prefill_chunk);
    } else if (e->kind == GW_ENTRY_DECODE) {
        if (n != 1)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "slot %u (request '%s'): a decode entry has "
                              "one token, got %zu", s, rid, n);
    } else if (e->kind == GW_ENTRY_FORK) {
        int rc = check_fork(w, e, err, errlen);
        if (rc != 0)
            return rc;
    } else {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): unknown entry kind %d", s,
                          rid, (int)e->kind);
    }
    if (e->prompt_lp &&
        (e->kind != GW_ENTRY_PREFILL || e->prompt_top < 0 ||
         e->prompt_top > GW_PROMPT_MAX_TOP || e->lp_next >= m->vocab))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): prompt log-probabilities "
                          "need a prefill entry, 0 .. %d alternatives and a "
                          "next token in the vocabulary (got kind %d, %d, "
                          "%d)",
                          s, rid, GW_PROMPT_MAX_TOP, (int)e->kind,
                          (int)e->prompt_top, (int)e->lp_next);
    for (size_t t = 0; t < n; t++)
        if (e->tokens[t] >= (uint32_t)m->vocab)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "slot %u (request '%s'): token %u at index %zu "
                              "is outside the vocabulary [0, %d)", s, rid,
                              e->tokens[t], t, m->vocab);
    if ((uint64_t)e->start_pos + n > (uint64_t)m->max_positions)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): positions up to %llu "
                          "exceed the model's context of %d", s, rid,
                          (unsigned long long)e->start_pos + n,
                          m->max_positions);
    if (e->n_row_lens != 0 && (!e->fresh || e->n_row_lens != (size_t)w->rows))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): row_lens needs fresh and "
                          "%d values, got %zu", s, rid, w->rows,
                          e->n_row_lens);
    if (e->n_head_lens != 0) {
        int rc = check_head_lens(w, e, rid, err, errlen);
        if (rc != 0)
            return rc;
    }
    sim_touch(w, s);
    if (e->fresh) {
        sim_clear(w, s);
        w->sim_active[s] = 1;
        w->sim_pos[s] = e->start_pos;
        for (size_t r = 0; r < e->n_row_lens; r++) {
            if (e->row_lens[r] > e->start_pos)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "slot %u (request '%s'): row %zu holds %u "
                                  "tokens, more than start_pos %u", s, rid,
                                  r, e->row_lens[r], e->start_pos);
            w->sim_len[(size_t)s * (size_t)w->rows + r] =
                (int32_t)e->row_lens[r];
        }
    } else if (!w->sim_active[s]) {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): the slot is not assigned "
                          "(no fresh entry since it was freed)", s, rid);
    } else if ((int64_t)e->start_pos != w->sim_pos[s]) {
        return tg_err_set(err, errlen, TG_EINVAL,
                          "slot %u (request '%s'): entry starts at position "
                          "%u, the slot is at %lld", s, rid, e->start_pos,
                          (long long)w->sim_pos[s]);
    }
    /* Sampling parameters are the request's own: rank 0 checks them here,
     * once per plan, and a bad one fails only that request (a slot error
     * when it draws), never the plan. */
    if (w->rank == 0 && e->sample) {
        char *v = w->sp_bad + (size_t)s * GW_WORKER_SLOT_ERROR_MAX;
        int pre = snprintf(v, GW_WORKER_SLOT_ERROR_MAX, "slot %u: ", s);
        if (tg_sampling_check(&e->sampling, m->vocab, NULL, v + pre,
                              GW_WORKER_SLOT_ERROR_MAX - (size_t)pre) == 0)
            v[0] = '\0';
    }
    return 0;
}

static int check_delta(struct gw_worker *w, size_t i, const struct gw_delta *d,
                       char *err, size_t errlen)
{
    const struct kv_layout *kv = &w->layout;
    if (d->slot >= (uint32_t)w->max_slots || d->layer >= (uint32_t)kv->n_layers ||
        d->group >= (uint32_t)kv->n_groups)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page delta %zu: (slot %u, layer %u, group %u) "
                          "outside (%d, %d, %d)", i, d->slot, d->layer,
                          d->group, w->max_slots, kv->n_layers, kv->n_groups);
    sim_touch(w, d->slot);
    if (!w->sim_active[d->slot])
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page delta %zu: slot %u is not assigned", i,
                          d->slot);
    size_t r = (size_t)d->slot * (size_t)w->rows +
               (size_t)d->layer * (size_t)kv->n_groups + d->group;
    int64_t n = w->sim_n[r];
    if (d->has_truncate) {
        if ((int64_t)d->truncate_to > n)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "page delta %zu: truncate_to %u but slot %u "
                              "layer %u group %u holds %lld pages", i,
                              d->truncate_to, d->slot, d->layer, d->group,
                              (long long)n);
        n = d->truncate_to;
    }
    for (size_t k = 0; k < d->n_page_ids; k++)
        if (d->page_ids[k] >= (uint32_t)w->be->n_pages)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "page delta %zu: page id %u outside the pool of "
                              "%d pages", i, d->page_ids[k], w->be->n_pages);
    n += (int64_t)d->n_page_ids;
    if (n > w->be->n_pages)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "page delta %zu: a row of %lld pages exceeds the "
                          "pool of %d", i, (long long)n, w->be->n_pages);
    w->sim_n[r] = (int32_t)n;
    return 0;
}

/* Rows must hold what they store, and the entries must have room for what
 * they add (the forward pass checks too, but only after earlier entries
 * ran; checking here keeps a rejected plan from changing anything). */
static int check_room(struct gw_worker *w, const struct gw_plan *plan,
                      char *err, size_t errlen)
{
    const struct kv_layout *kv = &w->layout;
    size_t R = (size_t)w->rows;
    for (int t = 0; t < w->n_touched; t++) {
        size_t s = (size_t)w->touched[t];
        if (!w->sim_active[s])
            continue;
        int e = w->entry_of[s];
        const struct gw_entry *en = e >= 0 ? &plan->entries[e] : NULL;
        int64_t forced = en != NULL && en->kind == GW_ENTRY_PREFILL
                             ? kv_chunk_forced(en->start_pos,
                                               (int64_t)en->n_tokens,
                                               &kv->rule)
                             : 0;
        for (size_t r = 0; r < R; r++) {
            int64_t len = w->sim_len[s * R + r], add = 0;
            if (en != NULL && en->kind != GW_ENTRY_FORK)
                add = en->kind == GW_ENTRY_DECODE
                          ? 1
                          : kv_chunk_keep((int64_t)en->n_tokens,
                                          kv->group_budget[r], forced);
            int64_t have = w->sim_n[s * R + r];
            if (kv_pages_for(len, kv->page_size) > have ||
                kv_pages_for(len + add, kv->page_size) > have)
                return tg_err_set(
                    err, errlen, TG_ENOSPC,
                    "slot %zu layer %zu group %zu: %lld + %lld tokens need "
                    "%lld pages, the row has %lld", s, r / (size_t)kv->n_groups,
                    r % (size_t)kv->n_groups, (long long)len, (long long)add,
                    (long long)kv_pages_for(len + add, kv->page_size),
                    (long long)have);
        }
    }
    return 0;
}

/* Every fork's rows, as the plan leaves them, hold exactly the pages and
 * tokens its source's rows will hold after the source's last chunk. */
static int check_forks(struct gw_worker *w, const struct gw_plan *plan,
                       char *err, size_t errlen)
{
    const struct kv_layout *kv = &w->layout;
    size_t R = (size_t)w->rows;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->kind != GW_ENTRY_FORK)
            continue;
        size_t d = e->slot, s = e->fork_from;
        const struct gw_entry *se = &plan->entries[w->entry_of[s]];
        int64_t forced = kv_chunk_forced(se->start_pos,
                                         (int64_t)se->n_tokens, &kv->rule);
        for (size_t r = 0; r < R; r++) {
            int64_t after = w->sim_len[s * R + r] +
                            kv_chunk_keep((int64_t)se->n_tokens,
                                          kv->group_budget[r], forced);
            if (w->sim_n[d * R + r] != w->sim_n[s * R + r] ||
                w->sim_len[d * R + r] != after)
                return tg_err_set(
                    err, errlen, TG_EINVAL,
                    "slot %zu forks slot %zu: row %zu would hold %d pages "
                    "and %d tokens, the source %d pages and %lld tokens", d,
                    s, r, (int)w->sim_n[d * R + r], (int)w->sim_len[d * R + r],
                    (int)w->sim_n[s * R + r], (long long)after);
        }
    }
    return 0;
}

int gw_worker__check_plan(struct gw_worker *w, const struct gw_plan *plan,
                          char *err, size_t errlen)
{
    if (plan->version != GW_PROTOCOL_VERSION)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "plan version %u, this worker speaks %u",
                          plan->version, GW_PROTOCOL_VERSION);
    if (plan->step_id <= w->last_step)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "step id %llu is not above the last step %llu",
                          (unsigned long long)plan->step_id,
                          (unsigned long long)w->last_step);
    w->sim_serial++;
    w->n_touched = 0;
    w->plan_entries = plan->entries;
    for (int s = 0; s < w->max_slots; s++)
        w->entry_of[s] = -1;
    for (size_t i = 0; i < plan->n_frees; i++) {
        if (plan->frees[i] >= (uint32_t)w->max_slots)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "frees[%zu]: unknown slot %u (the worker has "
                              "%d)", i, plan->frees[i], w->max_slots);
        sim_clear(w, plan->frees[i]);
    }
    int rc;
    /* Fresh entries are applied before the deltas, so validate all entries
     * (which performs the fresh clears) first. */
    for (size_t i = 0; i < plan->n_entries; i++)
        if ((rc = check_entry(w, i, &plan->entries[i], err, errlen)) != 0)
            return rc;
    for (size_t i = 0; i < plan->n_deltas; i++)
        if ((rc = check_delta(w, i, &plan->deltas[i], err, errlen)) != 0)
            return rc;
    if ((rc = check_room(w, plan, err, errlen)) != 0)
        return rc;
    return check_forks(w, plan, err, errlen);
}
