/* gw_worker.c — one worker rank's plan execution (see gw_worker.h). */
#include "gpu_worker/serve/gw_worker.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/kv/kv_budget.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "gpu_worker/model/gw_rank.h"
#include "gpu_worker/serve/gw_worker_internal.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static void slot_free(struct gw_wslot *s)
{
    kv_seq_clear(&s->kv); /* a mirror: the ids are the router's */
    kv_seq_free(&s->kv, NULL);
    free(s->rowp);
    free(s->hist);
    free(s->dstart);
    memset(s, 0, sizeof(*s));
}

void gw_worker_free(struct gw_worker *w)
{
    if (w->slots != NULL)
        for (int i = 0; i < w->max_slots; i++)
            slot_free(&w->slots[i]);
    free(w->slots);
    free(w->seqs);
    free(w->seq_ptrs);
    free(w->ids);
    free(w->sim_n);
    free(w->sim_len);
    free(w->sim_pos);
    free(w->sim_active);
    free(w->sim_stamp);
    free(w->touched);
    free(w->entry_of);
    free(w->cp_src);
    free(w->cp_dst);
    free(w->draws);
    free(w->draw_of);
    free(w->tok);
    free(w->top_ids);
    free(w->top_lps);
    free(w->serr);
    free(w->serr_text);
    free(w->sp_bad);
    free(w->hrep);
    free(w->row_max);
    if (w->rank == 0)
        gw_grammar_log_stats(&w->gram);
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
    int maxt = o->prefill_chunk > o->max_slots ? o->prefill_chunk : o->max_slots;
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
        .model = &w->model, .layout = &w->layout, .profile = &w->profile,
        .method = w->method,
        .gvote = o->gvote != NULL ? *o->gvote : gw_gvote_params_default(),
        .trig = trig ? &w->trig : NULL,
        .max_slots = o->max_slots, .max_tokens = maxt,
        .rank = o->rank, .world_size = o->world_size,
        .comm_timeout_ms = o->comm_timeout_ms, .n_threads = o->n_threads,
        .kv_pages = o->kv_pages, .kv_memory = o->kv_memory,
        .device = o->device, .cuda_graphs = o->cuda_graphs,
        .step_timeout_ms = o->step_timeout_ms,
        .host_tier_bytes = o->kv_host_memory > INT64_MAX
                               ? INT64_MAX
                               : (int64_t)o->kv_host_memory,
    };
    rc = gw_backend_new(o->backend, &bc, &w->be, err, errlen);
    if (rc == 0)
        rc = gw_host_tier_init(&w->tier, w->be, o->kv_host_memory, err,
                               errlen);
    if (rc != 0)
        goto fail;

    size_t S = (size_t)o->max_slots, R = (size_t)w->rows;
    size_t K = GW_WORKER_MAX_LOGPROBS;
    w->slots = calloc(S, sizeof(*w->slots));
    w->seqs = calloc(S, sizeof(*w->seqs));
    w->seq_ptrs = calloc(S, sizeof(*w->seq_ptrs));
    w->ids = malloc((size_t)maxt * sizeof(int32_t));
    w->sim_n = malloc(S * R * sizeof(int32_t));
    w->sim_len = malloc(S * R * sizeof(int32_t));
    w->sim_pos = malloc(S * sizeof(int64_t));
    w->sim_active = malloc(S * sizeof(int32_t));
    w->sim_stamp = calloc(S, sizeof(uint64_t));
    w->touched = malloc(S * sizeof(int32_t));
    w->entry_of = malloc(S * sizeof(int32_t));
    w->cp_src = malloc(R * sizeof(int32_t));
    w->cp_dst = malloc(R * sizeof(int32_t));
    w->draws = calloc(S, sizeof(*w->draws));
    w->draw_of = malloc(S * sizeof(int32_t));
    w->tok = calloc(S, sizeof(*w->tok));
    w->top_ids = malloc(S * K * sizeof(int32_t));
    w->top_lps = malloc(S * K * sizeof(float));
    w->serr = calloc(S, sizeof(*w->serr));
    w->serr_text = calloc(S, GW_WORKER_SLOT_ERROR_MAX);
    w->sp_bad = calloc(S, GW_WORKER_SLOT_ERROR_MAX);
    w->hrep = calloc(S, sizeof(*w->hrep));
    w->row_max = calloc(R, sizeof(int32_t));
    if (!w->slots || !w->seqs || !w->seq_ptrs || !w->ids || !w->sim_n ||
        !w->sim_len || !w->sim_pos || !w->sim_active || !w->sim_stamp ||
        !w->touched || !w->entry_of || !w->cp_src || !w->cp_dst || !w->draws ||
        !w->draw_of || !w->tok || !w->top_ids || !w->top_lps || !w->serr ||
        !w->serr_text || !w->sp_bad || !w->hrep || !w->row_max) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory for %d slots",
                        o->max_slots);
        goto fail;
    }
    for (size_t i = 0; i < S; i++) {
        rc = kv_seq_init(&w->slots[i].kv, &w->layout, err, errlen);
        if (rc == 0 && w->per_head)
            rc = kv_seq_heads_enable(&w->slots[i].kv, &w->layout, err,
                                     errlen);
        if (rc != 0)
            goto fail;
        w->slots[i].rowp = calloc(R, sizeof(*w->slots[i].rowp));
        if (trig)
            w->slots[i].dstart = calloc((size_t)w->layout.n_layers *
                                            (size_t)w->layout.n_kv_heads,
                                        sizeof(int32_t));
        if (w->slots[i].rowp == NULL || (trig && w->slots[i].dstart == NULL)) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            goto fail;
        }
    }
    const char *prof = ro.profile_path == NULL ? "none" : ro.profile_path;
    snprintf(w->model_name, sizeof(w->model_name), "%s", o->model_dir);
    snprintf(w->profile_name, sizeof(w->profile_name), "%s", prof);
    if (w->rank == 0 &&
        (gw_grammar_init(&w->gram, o->model_dir, w->model.vocab, o->max_slots,
                         (size_t)o->grammar_cache_bytes) != 0 ||
         gw_grammar_preload(&w->gram) != 0)) {
        rc = tg_err_set(err, errlen, TG_ENOMEM,
                        "out of memory or threads for structured outputs");
        goto fail;
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
                          "%d of %d", cs->world_size, w->rank, w->world_size);
    int rc = w->be->ops->comm_join(w->be, cs, err, errlen);
    if (rc == 0)
        w->joined = 1;
    return rc;
}

/* ---- application ------------------------------------------------------- */

/* The prefill entry a fork entry samples from (validated to exist). */
static const struct gw_entry *fork_source(const struct gw_plan *plan,
                                          const struct gw_entry *e)
{
    for (size_t j = 0; j < plan->n_entries; j++)
        if (plan->entries[j].slot == e->fork_from &&
            plan->entries[j].kind == GW_ENTRY_PREFILL)
            return &plan->entries[j];
    TG_ASSERT(0);
    return NULL;
}

/* Reserves the token history the plan appends before anything changes, so
 * an allocation failure leaves the worker as it was. (The rows' slabs grow
 * in apply_plan; kv_seq_row_append changes nothing when it fails, and the
 * step then fails as a whole.) */
static int reserve_all(struct gw_worker *w, const struct gw_plan *plan)
{
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        struct gw_wslot *sl = &w->slots[e->slot];
        int64_t from = e->fresh ? e->start_pos : sl->hist_from;
        if (e->kind == GW_ENTRY_FORK) {
            /* The source's history (its entry validated). */
            const struct gw_entry *se = fork_source(plan, e);
            from = se->fresh ? se->start_pos : w->slots[se->slot].hist_from;
        }
        if (TG_GROW(sl->hist, &sl->hist_cap,
                    (int64_t)e->start_pos + (int64_t)e->n_tokens - from) != 0)
            return TG_ENOMEM;
    }
    return 0;
}

static void slot_clear(struct gw_wslot *s)
{
    kv_seq_clear(&s->kv); /* renews the epoch: cached tables are stale */
    s->active = 0;
    s->pos = 0;
    s->num_prompt = 0;
    s->hist_from = 0;
}

static int apply_plan(struct gw_worker *w, const struct gw_plan *plan)
{
    for (size_t i = 0; i < plan->n_frees; i++) {
        slot_clear(&w->slots[plan->frees[i]]);
        if (w->rank == 0)
            gw_grammar_slot_clear(&w->gram, plan->frees[i]);
    }
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        struct gw_wslot *sl = &w->slots[e->slot];
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
        if (e->fresh) {
            slot_clear(sl);
            sl->active = 1;
            sl->pos = e->start_pos;
            sl->hist_from = e->start_pos;
            for (size_t r = 0; r < e->n_row_lens; r++)
                sl->kv.filled[r] = (int32_t)e->row_lens[r];
            if (sl->kv.head_len != NULL) {
                /* Adopted heads as the router counts them; without them
                 * (whole rows) every head holds its row. */
                for (size_t h = 0; h < e->n_head_lens; h++)
                    sl->kv.head_len[h] = (int32_t)e->head_lens[h];
                if (e->n_head_lens == 0)
                    kv_seq_heads_from_rows(&sl->kv, &w->layout);
            }
        }
        sl->num_prompt = (int32_t)(e->num_prompt_tokens > INT32_MAX
                                       ? INT32_MAX
                                       : e->num_prompt_tokens);
    }
    for (size_t i = 0; i < plan->n_deltas; i++) {
        const struct gw_delta *d = &plan->deltas[i];
        struct kv_seq *kv = &w->slots[d->slot].kv;
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

/* The forward pass's view of slot `slot`: its position and rows. */
static struct gw_seq *seq_view(struct gw_worker *w, uint32_t slot)
{
    struct gw_wslot *sl = &w->slots[slot];
    struct gw_seq *q = &w->seqs[slot];
    for (int r = 0; r < w->rows; r++)
        sl->rowp[r] = sl->kv.ids + sl->kv.off[r];
    q->pos = sl->pos;
    q->len = sl->kv.filled;
    q->pages = sl->rowp;
    q->n_pages = sl->kv.n_pages;
    q->kv = &sl->kv;
    q->hlen = sl->kv.head_len; /* NULL unless heads are kept */
    q->dstart = sl->dstart;    /* NULL without trig */
    return q;
}

/* Records the tokens an entry fed (positions start_pos ..). */
static void hist_add(struct gw_wslot *sl, const struct gw_entry *e)
{
    int64_t at = (int64_t)e->start_pos - sl->hist_from;
    for (size_t t = 0; t < e->n_tokens; t++)
        sl->hist[at + (int64_t)t] = (int32_t)e->tokens[t];
}

/* The draw of entry e (rank 0) from logits row `row`, once the slot has
 * taken `fed` more tokens than its position says (1 for a decode entry
 * whose forward pass has not run yet, 0 after it): the RNG index is the
 * tokens the request sampled before; penalties see the known history,
 * positions [hist_from, pos + fed), split at the prompt's end (hist_add
 * has recorded the fed tokens). */
static void make_draw(struct gw_worker *w, const struct gw_entry *e, int row,
                      int64_t fed, struct gw_draw *d)
{
    const struct gw_wslot *sl = &w->slots[e->slot];
    int64_t pos = sl->pos + fed;
    int64_t np = sl->num_prompt;
    int64_t p_end = np < pos ? np : pos;
    int64_t o_beg = np > sl->hist_from ? np : sl->hist_from;
    d->slot = e->slot;
    d->row = row;
    d->sampling = &e->sampling;
    d->index = pos > np ? (uint64_t)(pos - np) : 0;
    d->mask = gw_grammar_slot_mask(&w->gram, e->slot);
    d->hist = (struct tg_sample_history){
        .prompt = sl->hist,
        .n_prompt = p_end > sl->hist_from ? (int)(p_end - sl->hist_from) : 0,
        .output = sl->hist + (o_beg - sl->hist_from),
        .n_output = pos > o_beg ? (int)(pos - o_beg) : 0,
    };
}

/* Rank 0: why sampled entry e's sampling cannot be used (the plan
 * check's verdict), or NULL when it can. */
static const char *sampling_bad(const struct gw_worker *w,
                                const struct gw_entry *e)
{
    const char *v = w->sp_bad + (size_t)e->slot * GW_WORKER_SLOT_ERROR_MAX;
    return v[0] != '\0' ? v : NULL;
}

/* Fails entry i's request alone (rank 0): a slot error with the reason. */
static void slot_error(struct gw_worker *w, size_t *n_err, uint32_t slot,
                       const char *why)
{
    char *text = w->serr_text + *n_err * GW_WORKER_SLOT_ERROR_MAX;
    if (why != text)
        snprintf(text, GW_WORKER_SLOT_ERROR_MAX, "%s", why);
    w->serr[*n_err] = (struct gw_slot_error){.slot = slot, .error = text};
    (*n_err)++;
}

/* A turn's decode begins for slot sl (its last prefill chunk ran, or a
 * fork copied its source): with trig, each head's decode region starts at
 * its present length and the decoded count at the present position. */
static void decode_region_begin(struct gw_worker *w, struct gw_wslot *sl)
{
    if (w->trig.cap == NULL)
        return;
    memcpy(sl->dstart, sl->kv.head_len,
           (size_t)sl->kv.n_heads * sizeof(int32_t));
    sl->dbase = sl->pos;
}

/* A fork entry once its source's last chunk has run: the pages of its
 * rows that differ from the source's (the private copies of the partly
 * filled last pages) get the source's content, it takes the source's
 * position and token history (penalties), and rank 0 gives it a copy of
 * the source's logits row to draw from with its own seed (a draw may use
 * its row as scratch, so two draws never share one). */
static int run_fork(struct gw_worker *w, const struct gw_plan *plan,
                    const struct gw_entry *e, const int32_t *row, char *err,
                    size_t errlen)
{
    const struct gw_entry *se = fork_source(plan, e);
    struct gw_wslot *src = &w->slots[se->slot], *dst = &w->slots[e->slot];
    int n_cp = 0;
    for (int32_t r = 0; r < w->rows; r++) {
        const int32_t *a = src->kv.ids + src->kv.off[r];
        const int32_t *b = dst->kv.ids + dst->kv.off[r];
        for (int32_t k = 0; k < dst->kv.n_pages[r]; k++) {
            if (a[k] == b[k])
                continue;
            if (n_cp == w->rows) {
                double tb = now_s();
                int rc = w->be->ops->copy_pages(w->be, w->cp_src, w->cp_dst,
                                                n_cp, err, errlen);
                w->backend_s += now_s() - tb;
                if (rc != 0)
                    return rc;
                n_cp = 0;
            }
            w->cp_src[n_cp] = a[k];
            w->cp_dst[n_cp++] = b[k];
        }
    }
    if (n_cp > 0) {
        double tb = now_s();
        int rc = w->be->ops->copy_pages(w->be, w->cp_src, w->cp_dst, n_cp,
                                        err, errlen);
        w->backend_s += now_s() - tb;
        if (rc != 0)
            return rc;
    }
    int64_t n_hist = src->pos - src->hist_from;
    if (n_hist > 0)
        memcpy(dst->hist, src->hist, (size_t)n_hist * sizeof(int32_t));
    dst->hist_from = src->hist_from;
    dst->pos = src->pos;
    if (dst->kv.head_len != NULL) {
        /* The fork holds exactly what its source holds, head by head. */
        memcpy(dst->kv.head_len, src->kv.head_len,
               (size_t)dst->kv.n_heads * sizeof(int32_t));
        decode_region_begin(w, dst);
    }
    int32_t si = (int32_t)(se - plan->entries), di = (int32_t)(e - plan->entries);
    if (w->rank == 0 && w->be->logits != NULL && row[si] >= 0 && row[di] >= 0) {
        size_t V = (size_t)w->model.vocab;
        memcpy(w->be->logits + (size_t)row[di] * V,
               w->be->logits + (size_t)row[si] * V, V * sizeof(float));
    }
    return 0;
}

/* §4.9 trigger, after the decode batch ran: the slots whose append made
 * their turn's decoded count a multiple of beta are compacted together
 * through the backend, and each reports its heads (every rank). */
static int compact_triggered(struct gw_worker *w, const struct gw_plan *plan,
                             char *err, size_t errlen)
{
    int n = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->kind != GW_ENTRY_DECODE)
            continue;
        struct gw_wslot *sl = &w->slots[e->slot];
        int64_t decoded = sl->pos - sl->dbase;
        if (decoded <= 0 || decoded % w->trig.every != 0)
            continue;
        w->seq_ptrs[n++] = seq_view(w, e->slot);
        w->hrep[w->n_hrep++] = (struct gw_head_lens){
            .slot = e->slot, .lens = sl->kv.head_len,
            .n = (size_t)sl->kv.n_heads};
    }
    if (n == 0)
        return 0;
    int64_t heads = 0;
    double tb = now_s();
    int rc = w->be->ops->compact(w->be, &w->trig, w->seq_ptrs, n, &heads,
                                 err, errlen);
    w->backend_s += now_s() - tb;
    gw_progress_mark(w->progress);
    return rc;
}

/* Logits rows: the sampled prefill entries take rows 0 .. n_pf - 1 in plan
 * order, the decode batch rows n_pf .. n_pf + nd - 1; both together are at
 * most one row per slot (validated), so they fit the backend's
 * (max_slots, V) rows. row[i] is entry i's row or -1. Rank 0 prepares the
 * draws of the decode batch before it runs, so a backend can draw them
 * where the logits are. */
static int run_plan(struct gw_worker *w, const struct gw_plan *plan,
                    int32_t *row, char *err, size_t errlen)
{
    int rc, n_pf = 0, nd = 0, d_sample = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        row[i] = -1;
        if ((e->kind == GW_ENTRY_PREFILL || e->kind == GW_ENTRY_FORK) &&
            e->sample)
            row[i] = n_pf++;
    }
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->kind != GW_ENTRY_PREFILL)
            continue;
        struct gw_wslot *sl = &w->slots[e->slot];
        for (size_t t = 0; t < e->n_tokens; t++)
            w->ids[t] = (int32_t)e->tokens[t];
        /* Every rank knows which entries sample (same plan), so all take
         * part in the logits of exactly those. */
        struct gw_seq *q = seq_view(w, e->slot);
        q->seed = e->sampling.seed; /* gvote's synthetic-query stream */
        double tb = now_s();
        rc = gw_backend_prefill(w->be, q, w->ids, (int)e->n_tokens, row[i],
                                NULL, NULL, err, errlen);
        w->backend_s += now_s() - tb;
        gw_progress_mark(w->progress);
        if (rc != 0)
            return rc;
        hist_add(sl, e);
        sl->pos = q->pos;
        if (e->last_chunk)
            decode_region_begin(w, sl);
        if (w->per_head_prefill) {
            /* The heads kept what the method chose, which the router
             * cannot predict: report every head after the chunk. */
            w->hrep[w->n_hrep++] = (struct gw_head_lens){
                .slot = e->slot, .lens = sl->kv.head_len,
                .n = (size_t)sl->kv.n_heads};
        }
    }
    for (size_t i = 0; i < plan->n_entries; i++)
        if (plan->entries[i].kind == GW_ENTRY_FORK &&
            (rc = run_fork(w, plan, &plan->entries[i], row, err, errlen)) != 0)
            return rc;
    int n_draws = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->kind != GW_ENTRY_DECODE)
            continue;
        w->seq_ptrs[nd] = seq_view(w, e->slot);
        w->ids[nd] = (int32_t)e->tokens[0];
        row[i] = n_pf + nd;
        d_sample |= e->sample != 0;
        hist_add(&w->slots[e->slot], e); /* reserved; read by the draw */
        if (w->rank == 0 && e->sample && sampling_bad(w, e) == NULL)
            make_draw(w, e, row[i], 1, &w->draws[n_draws++]);
        nd++;
    }
    if (nd > 0) {
        double tb = now_s();
        rc = gw_backend_decode(
            w->be, w->seq_ptrs, w->ids, nd, d_sample ? n_pf : -1,
            n_draws > 0 ? w->draws : NULL, n_draws, err, errlen);
        w->backend_s += now_s() - tb;
        gw_progress_mark(w->progress);
        if (rc != 0)
            return rc;
        for (size_t i = 0; i < plan->n_entries; i++) {
            const struct gw_entry *e = &plan->entries[i];
            if (e->kind == GW_ENTRY_DECODE)
                w->slots[e->slot].pos = w->seqs[e->slot].pos;
        }
        if (w->trig.cap != NULL)
            return compact_triggered(w, plan, err, errlen);
    }
    return 0;
}

/* Rank 0, after the forward passes: every sampled entry in plan order
 * gets a token, or a slot error that fails its request alone. */
static void draw_all(struct gw_worker *w, const struct gw_plan *plan,
                     const int32_t *row, size_t *n_tok, size_t *n_err)
{
    const struct gw_backend_ops *ops = w->be->ops;
    size_t K = GW_WORKER_MAX_LOGPROBS;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (!e->sample)
            continue;
        const char *bad = sampling_bad(w, e);
        if (bad != NULL) {
            slot_error(w, n_err, e->slot, bad);
            continue;
        }
        char *why = w->serr_text + *n_err * GW_WORKER_SLOT_ERROR_MAX;
        const char *gerr = gw_grammar_slot_error(&w->gram, e->slot);
        if (gerr != NULL) {
            snprintf(why, GW_WORKER_SLOT_ERROR_MAX, "%s", gerr);
            slot_error(w, n_err, e->slot, why);
            continue;
        }
        struct gw_draw d;
        make_draw(w, e, row[i], 0, &d);
        /* The mask, when it was stale, was computed just now and may
         * have failed (its budget): never draw without it. */
        if ((gerr = gw_grammar_slot_error(&w->gram, e->slot)) != NULL) {
            snprintf(why, GW_WORKER_SLOT_ERROR_MAX, "%s", gerr);
            slot_error(w, n_err, e->slot, why);
            continue;
        }
        double tb = now_s();
        int src = ops->sample(w->be, &d, &w->tok[*n_tok],
                              w->top_ids + *n_tok * K, w->top_lps + *n_tok * K,
                              why, GW_WORKER_SLOT_ERROR_MAX);
        w->backend_s += now_s() - tb;
        gw_progress_mark(w->progress);
        if (src != 0) {
            slot_error(w, n_err, e->slot, why);
            continue;
        }
        struct gw_token *t = &w->tok[*n_tok];
        /* Every draw: a triggered constraint watches its free text too
         * (a no-op for an unconstrained slot). */
        if (gw_grammar_slot_accept(&w->gram, e->slot, t->token) != 0) {
            slot_error(w, n_err, e->slot,
                       gw_grammar_slot_error(&w->gram, e->slot));
            continue;
        }
        if (d.mask != NULL) {
            w->gram.st.draws++;
            /* Masked ids have no probability: alternatives end at the
             * first of them (they sort last). */
            while (t->n_top > 0 && t->top_lps[t->n_top - 1] == -INFINITY)
                t->n_top--;
        }
        (*n_tok)++;
    }
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
    w->backend_s = 0;
    char *err = w->error;
    size_t errlen = sizeof(w->error);
    int rc = w->joined ? gw_worker__check_plan(w, plan, err, errlen)
                       : tg_err_set(err, errlen, TG_EPROTO,
                                    "plan before the communicator group "
                                    "was joined (no CommSetup yet)");
    if (rc == 0 && reserve_all(w, plan) != 0)
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
    /* entry_of is free again after validation: reuse it as the row map. */
    int32_t *row = w->entry_of;
    w->n_hrep = 0;
    rc = run_plan(w, plan, row, err, errlen);
    if (rc != 0 && w->be->ops->comm_failed(w->be)) {
        /* The peers are gone or out of step: nothing more can run. */
        w->peers_lost = 1;
        if (w->peer_lost_flag != NULL)
            *w->peer_lost_flag = 1;
    }
    if (rc == 0 && w->n_hrep > 0) {
        out->head_lens = w->hrep;
        out->n_head_lens = (size_t)w->n_hrep;
    }
    if (rc != 0 || w->rank != 0)
        goto done;
    size_t n_tok = 0, n_err = 0;
    draw_all(w, plan, row, &n_tok, &n_err);
    out->n_tokens = n_tok;
    out->tokens = n_tok > 0 ? w->tok : NULL;
    out->n_slot_errors = n_err;
    out->slot_errors = n_err > 0 ? w->serr : NULL;
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
    out->backend_seconds = w->backend_s;
    return rc;
}
