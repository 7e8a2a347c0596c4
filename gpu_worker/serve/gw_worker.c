/* gw_worker.c — one worker rank's plan execution (see gw_worker.h). */
#include "gpu_worker/serve/gw_worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "gpu_worker/model/gw_rank.h"
#include "gpu_worker/serve/gw_worker_internal.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void gw_worker_free(struct gw_worker *w)
{
    gw_step_free(&w->step);
    free(w->sim_n);
    free(w->sim_len);
    free(w->sim_pos);
    free(w->sim_active);
    free(w->sim_stamp);
    free(w->touched);
    free(w->entry_of);
    free(w->sp_bad);
    free(w->row_max);
    gw_grammar_free(&w->gram);
    gw_host_tier_free(&w->tier); /* its copies use the backend */
    gw_backend_free(w->be);
    gw_trig_cfg_free(&w->trig);
    pf_trig_free(&w->trig_stats);
    kv_layout_free(&w->layout);
    pf_profile_free(&w->profile);
    gw_model_free(&w->model);
    memset(w, 0, sizeof(*w));
}

/* The step loop's gate of a draw (rank 0): the plan check's verdict on
 * the slot's sampling, then its structured output (a failed constraint,
 * else the mask of its next token). */
static const char *draw_gate(void *ud, uint32_t slot, const uint32_t **mask)
{
    struct gw_worker *w = ud;
    const char *v = w->sp_bad + (size_t)slot * GW_WORKER_SLOT_ERROR_MAX;
    if (v[0] != '\0')
        return v;
    const char *gerr = gw_grammar_slot_error(&w->gram, slot);
    if (gerr != NULL)
        return gerr;
    *mask = gw_grammar_slot_mask(&w->gram, slot);
    /* The mask, when it was stale, was computed just now and may have
     * failed (its budget): never draw without it. */
    return gw_grammar_slot_error(&w->gram, slot);
}

/* Every token drawn (rank 0): a triggered constraint watches its free
 * text too (a no-op for an unconstrained slot). */
static const char *draw_accept(void *ud, uint32_t slot, int32_t token,
                               int masked)
{
    struct gw_worker *w = ud;
    if (gw_grammar_slot_accept(&w->gram, slot, token) != 0)
        return gw_grammar_slot_error(&w->gram, slot);
    if (masked)
        w->gram.st.draws++;
    return NULL;
}

int gw_worker_init(struct gw_worker *w, const struct gw_worker_opts *o,
                   char *err, size_t errlen)
{
    memset(w, 0, sizeof(*w));
    if (o->world_size < 1 || o->world_size > GW_BACKEND_MAX_RANKS ||
        o->rank < 0 || o->rank >= o->world_size)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--rank %d is outside [0, %d) (world size 1 .. %d)",
                          o->rank, o->world_size, GW_BACKEND_MAX_RANKS);
    if (o->max_slots < 1 || o->page_size < 1 || o->prefill_chunk < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "max slots, page size and prefill chunk must be "
                          ">= 1");
    int maxt = o->prefill_chunk > o->max_slots ? o->prefill_chunk
                                               : o->max_slots;
    w->peer_lost_flag = o->peer_lost_flag;
    struct gw_rank_opts ro = {
        .model_dir = o->model_dir,
        .profile_path = o->profile_path,
        .profile_force = o->profile_force,
        .heads_per_group = o->heads_per_group,
        .page_size = o->page_size,
        .prefill_chunk = o->prefill_chunk,
        .method = o->method,
        .rank = o->rank,
        .world_size = o->world_size,
        /* a CUDA backend streams the checkpoint to its device itself */
        .no_host_weights = o->backend == GW_BACKEND_CUDA,
        .weights = o->weights,
    };
    int *global_head = NULL;
    int trig = o->trig != NULL && o->trig->enabled;
    int rc = gw_rank_load_map(&w->model, &w->profile, &w->layout, &w->method,
                              &global_head, &ro, err, errlen);
    if (rc != 0)
        goto fail;
    if (trig) {
        /* Caps from common/kv (the router's admission bound uses the same
         * rule), statistics in the rank's head order. */
        rc = gw_rank_trig_init(&w->trig, &w->trig_stats, o->trig,
                               o->trig_stats_path, &w->profile, &w->layout,
                               &w->model, global_head, err, errlen);
        if (rc != 0) {
            free(global_head);
            goto fail;
        }
    }
    free(global_head);
    /* An adaptive method's heads keep counts only the worker learns: its
     * slots keep per-head lengths and every step reports them. Decode-time
     * compression shrinks heads by their own caps: per-head lengths too,
     * reported after each trigger. */
    w->per_head_prefill = gw_method_per_head(w->method);
    w->per_head = w->per_head_prefill || trig;
    w->rank = o->rank;
    w->world_size = o->world_size;
    w->max_slots = o->max_slots;
    w->max_tokens = maxt;
    w->rows = w->layout.n_layers * w->layout.n_groups;
    struct gw_backend_cfg bc = {
        .model = &w->model,
        .layout = &w->layout,
        .profile = &w->profile,
        .method = w->method,
        .gvote = o->gvote != NULL ? *o->gvote : gw_gvote_params_default(),
        .trig = trig ? &w->trig : NULL,
        .max_slots = o->max_slots,
        .max_tokens = maxt,
        .rank = o->rank,
        .world_size = o->world_size,
        .comm_timeout_ms = o->comm_timeout_ms,
        .n_threads = o->n_threads,
        .kv_pages = o->kv_pages,
        .kv_memory = o->kv_memory,
        .device = o->device,
        .cuda_graphs = o->cuda_graphs,
        .step_timeout_ms = o->step_timeout_ms,
        .host_tier_bytes = o->kv_host_memory > INT64_MAX
                               ? INT64_MAX
                               : (int64_t)o->kv_host_memory,
    };
    rc = gw_backend_new(o->backend, &bc, &w->be, err, errlen);
    if (rc == 0)
        rc = gw_host_tier_init(&w->tier, w->be, o->kv_host_memory, err, errlen);
    if (rc != 0)
        goto fail;

    struct gw_step_cfg sc = {
        .be = w->be,
        .layout = &w->layout,
        .trig = trig ? &w->trig : NULL,
        .per_head = w->per_head,
        .per_head_prefill = w->per_head_prefill,
        .max_slots = o->max_slots,
        .max_tokens = maxt,
        .rank = o->rank,
        .hooks = {.gate = draw_gate, .accept = draw_accept, .ud = w},
    };
    rc = gw_step_init(&w->step, &sc, err, errlen);
    if (rc != 0)
        goto fail;
    size_t S = (size_t)o->max_slots, R = (size_t)w->rows;
    w->sim_n = malloc(S * R * sizeof(int32_t));
    w->sim_len = malloc(S * R * sizeof(int32_t));
    w->sim_pos = malloc(S * sizeof(int64_t));
    w->sim_active = malloc(S * sizeof(int32_t));
    w->sim_stamp = calloc(S, sizeof(uint64_t));
    w->touched = malloc(S * sizeof(int32_t));
    w->entry_of = malloc(S * sizeof(int32_t));
    w->sp_bad = calloc(S, GW_WORKER_SLOT_ERROR_MAX);
    w->row_max = calloc(R, sizeof(int32_t));
    if (!w->sim_n || !w->sim_len || !w->sim_pos || !w->sim_active ||
        !w->sim_stamp || !w->touched || !w->entry_of || !w->sp_bad ||
        !w->row_max) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory for %d slots",
                        o->max_slots);
        goto fail;
    }
    const char *prof = ro.profile_path == NULL ? "none" : ro.profile_path;
    snprintf(w->model_name, sizeof(w->model_name), "%s", o->model_dir);
    snprintf(w->profile_name, sizeof(w->profile_name), "%s", prof);
    if (w->rank == 0) {
        int grc = gw_grammar_init(&w->gram, o->model_dir, w->model.vocab,
                                  o->max_slots, (size_t)o->grammar_cache_bytes);
        if (grc == 0 && o->grammar_compile_s > 0)
            w->gram.compile_s = o->grammar_compile_s;
        if (grc != 0 || gw_grammar_preload(&w->gram) != 0) {
            rc = tg_err_set(err, errlen, TG_ENOMEM,
                            "out of memory or threads for structured outputs");
            goto fail;
        }
    }
    return 0;
fail:
    gw_worker_free(w);
    return rc;
}

void gw_worker_hello(const struct gw_worker *w, struct gw_hello_info *h)
{
    memset(h, 0, sizeof(*h));
    h->rank = w->rank;
    h->world_size = w->world_size;
    h->pages_total = w->be->n_pages;
    h->num_layers = w->model.n_layers;
    h->num_kv_heads = w->layout.n_kv_heads;
    h->heads_per_group = w->layout.heads_per_group;
    h->groups_per_layer = w->layout.n_groups;
    h->page_size = w->layout.page_size;
    h->head_dim = w->layout.head_dim;
    h->page_bytes = w->be->page_bytes;
    h->profile = w->profile_name;
    h->backend = w->be->ops->name;
    h->model = w->model_name;
    h->max_model_len = w->model.max_positions;
    h->vocab_size = w->model.vocab;
    h->per_head_lens = w->per_head;
    h->host_pages_total = w->tier.n_pages;
    h->comm_kind = w->be->ops->comm_kind;
    w->be->ops->comm_id(w->be, &h->comm_id, &h->comm_id_len);
}

int gw_worker_comm_join(struct gw_worker *w, const struct gw_comm_setup *cs,
                        char *err, size_t errlen)
{
    if (w->joined)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "CommSetup: the communicator group is joined "
                          "already");
    if (cs->version != GW_PROTOCOL_VERSION)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "CommSetup version %u, this worker speaks %u",
                          cs->version, GW_PROTOCOL_VERSION);
    if (cs->world_size != (uint32_t)w->world_size)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "CommSetup for world size %u, this worker is rank "
                          "%d of %d",
                          cs->world_size, w->rank, w->world_size);
    int rc = w->be->ops->comm_join(w->be, cs, err, errlen);
    if (rc == 0)
        w->joined = 1;
    return rc;
}

/* ---- application ------------------------------------------------------- */

static int apply_plan(struct gw_worker *w, const struct gw_plan *plan)
{
    for (size_t i = 0; i < plan->n_frees; i++) {
        gw_step_slot_clear(&w->step, plan->frees[i]);
        if (w->rank == 0)
            gw_grammar_slot_clear(&w->gram, plan->frees[i]);
    }
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->fresh && w->rank == 0) {
            /* From the grammar the router had prepared, at once; a
             * failure fails this request alone, at its draw. */
            if (e->grammar != NULL)
                (void)gw_grammar_slot_start(
                    &w->gram, e->slot, e->grammar_pin, e->grammar,
                    e->grammar_len, e->grammar_tokens, e->n_grammar_tokens);
            else
                gw_grammar_slot_clear(&w->gram, e->slot);
        }
        if (e->fresh)
            gw_step_slot_start(&w->step, e);
    }
    for (size_t i = 0; i < plan->n_deltas; i++) {
        const struct gw_delta *d = &plan->deltas[i];
        struct kv_seq *kv = &w->step.slots[d->slot].kv;
        int32_t r = (int32_t)(d->layer * (uint32_t)w->layout.n_groups +
                              d->group);
        /* Validated: the cut is within the row, ids within the pool. Cuts
         * renew the epoch, appends keep it. */
        if (d->has_truncate)
            TG_ASSERT(kv_seq_row_cut(kv, r, (int32_t)d->truncate_to) == 0);
        if (d->n_page_ids > 0 &&
            kv_seq_row_append(kv, r, (const int32_t *)d->page_ids,
                              (int32_t)d->n_page_ids) != 0)
            return TG_ENOMEM;
    }
    return 0;
}

void gw_worker_after_step(struct gw_worker *w)
{
    if (w->rank == 0)
        gw_grammar_prepare(&w->gram);
}

int gw_worker_step(struct gw_worker *w, const struct gw_plan *plan,
                   struct gw_result *out)
{
    memset(out, 0, sizeof(*out));
    out->step_id = plan->step_id;
    out->rank = w->rank;
    out->error = w->error;
    w->error[0] = '\0';
    double t0 = now_s();
    struct gw_step *st = &w->step;
    st->backend_s = 0;
    st->progress = w->progress;
    char *err = w->error;
    size_t errlen = sizeof(w->error);
    int rc = w->joined ? gw_worker__check_plan(w, plan, err, errlen)
                       : tg_err_set(err, errlen, TG_EPROTO,
                                    "plan before the communicator group "
                                    "was joined (no CommSetup yet)");
    if (rc == 0 && gw_step_reserve(st, plan) != 0)
        rc = tg_err_set(err, errlen, TG_ENOMEM,
                        "out of memory for the token history");
    if (rc != 0)
        goto done;
    w->last_step = plan->step_id;
    if (apply_plan(w, plan) != 0) {
        rc = tg_err_set(err, errlen, TG_ENOMEM,
                        "out of memory for the block tables");
        goto done;
    }
    rc = gw_step_run(st, plan, 1, err, errlen);
    if (rc != 0 && w->be->ops->comm_failed(w->be)) {
        /* The peers are gone or out of step: nothing more can run. */
        w->peers_lost = 1;
        if (w->peer_lost_flag != NULL)
            *w->peer_lost_flag = 1;
    }
    if (rc == 0 && st->n_hrep > 0) {
        out->head_lens = st->hrep;
        out->n_head_lens = (size_t)st->n_hrep;
    }
    if (rc != 0 || w->rank != 0)
        goto done;
    gw_step_draw_all(st, plan);
    out->n_tokens = st->n_tok;
    out->tokens = st->n_tok > 0 ? st->tok : NULL;
    out->n_slot_errors = st->n_serr;
    out->slot_errors = st->n_serr > 0 ? st->serr : NULL;
done:
    out->ok = rc == 0;
    if (rc != 0) {
        out->n_tokens = 0;
        out->tokens = NULL;
        out->n_slot_errors = 0;
        out->slot_errors = NULL;
        out->n_head_lens = 0;
        out->head_lens = NULL;
        if (w->error[0] == '\0')
            tg_err_set(err, errlen, rc, "%s", tg_strerror(rc));
    }
    out->step_seconds = now_s() - t0;
    out->backend_seconds = st->backend_s;
    return rc;
}
