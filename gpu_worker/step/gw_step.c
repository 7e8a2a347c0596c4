/* gw_step.c — the one step loop (see gw_step.h). */
#include "gpu_worker/step/gw_step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void slot_free(struct gw_slot *sl)
{
    kv_seq_clear(&sl->kv); /* a mirror: the ids are the caller's */
    kv_seq_free(&sl->kv, NULL);
    free(sl->rowp);
    free(sl->hist);
    free(sl->dstart);
    memset(sl, 0, sizeof(*sl));
}

void gw_step_free(struct gw_step *s)
{
    if (s->slots != NULL)
        for (int i = 0; i < s->cfg.max_slots; i++)
            slot_free(&s->slots[i]);
    free(s->slots);
    free(s->seqs);
    free(s->seq_ptrs);
    free(s->ids);
    free(s->row);
    free(s->cp_src);
    free(s->cp_dst);
    free(s->draws);
    free(s->hrep);
    free(s->plps);
    free(s->lp_tgt);
    free(s->plp_f);
    free(s->plp_i);
    free(s->tok);
    free(s->top_ids);
    free(s->top_lps);
    free(s->serr);
    free(s->serr_text);
    memset(s, 0, sizeof(*s));
}

int gw_step_init(struct gw_step *s, const struct gw_step_cfg *cfg, char *err,
                 size_t errlen)
{
    memset(s, 0, sizeof(*s));
    TG_ASSERT(cfg->be != NULL && cfg->layout != NULL && cfg->max_slots >= 1 &&
              cfg->max_tokens >= cfg->max_slots);
    s->cfg = *cfg;
    const struct kv_layout *lay = cfg->layout;
    s->rows = lay->n_layers * lay->n_groups;
    size_t S = (size_t)cfg->max_slots, R = (size_t)s->rows;
    size_t K = GW_STEP_MAX_TOP;
    s->slots = calloc(S, sizeof(*s->slots));
    s->seqs = calloc(S, sizeof(*s->seqs));
    s->seq_ptrs = calloc(S, sizeof(*s->seq_ptrs));
    s->ids = malloc((size_t)cfg->max_tokens * sizeof(int32_t));
    s->row = malloc(S * sizeof(int32_t));
    s->cp_src = malloc(R * sizeof(int32_t));
    s->cp_dst = malloc(R * sizeof(int32_t));
    s->draws = calloc(S, sizeof(*s->draws));
    s->hrep = calloc(S, sizeof(*s->hrep));
    s->plps = calloc(S, sizeof(*s->plps));
    s->lp_tgt = malloc((size_t)cfg->max_tokens * sizeof(int32_t));
    s->tok = calloc(S, sizeof(*s->tok));
    s->top_ids = malloc(S * K * sizeof(int32_t));
    s->top_lps = malloc(S * K * sizeof(float));
    s->serr = calloc(S, sizeof(*s->serr));
    s->serr_text = calloc(S, GW_STEP_ERROR_MAX);
    int rc = 0;
    if (!s->slots || !s->seqs || !s->seq_ptrs || !s->ids || !s->row ||
        !s->cp_src || !s->cp_dst || !s->draws || !s->hrep || !s->plps ||
        !s->lp_tgt || !s->tok || !s->top_ids || !s->top_lps || !s->serr ||
        !s->serr_text) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory for %d slots",
                        cfg->max_slots);
        goto fail;
    }
    for (size_t i = 0; i < S; i++) {
        struct gw_slot *sl = &s->slots[i];
        rc = kv_seq_init(&sl->kv, lay, err, errlen);
        if (rc == 0 && cfg->per_head)
            rc = kv_seq_heads_enable(&sl->kv, lay, err, errlen);
        if (rc != 0)
            goto fail;
        sl->rowp = calloc(R, sizeof(*sl->rowp));
        if (cfg->trig != NULL)
            sl->dstart = calloc((size_t)lay->n_layers * (size_t)lay->n_kv_heads,
                                sizeof(int32_t));
        if (sl->rowp == NULL || (cfg->trig != NULL && sl->dstart == NULL)) {
            rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
            goto fail;
        }
    }
    return 0;
fail:
    gw_step_free(s);
    return rc;
}

void gw_step_slot_clear(struct gw_step *s, uint32_t slot)
{
    struct gw_slot *sl = &s->slots[slot];
    kv_seq_clear(&sl->kv); /* renews the epoch: cached tables are stale */
    sl->active = 0;
    sl->pos = 0;
    sl->num_prompt = 0;
    sl->hist_from = 0;
}

void gw_step_slot_start(struct gw_step *s, const struct gw_entry *e)
{
    struct gw_slot *sl = &s->slots[e->slot];
    gw_step_slot_clear(s, e->slot);
    sl->active = 1;
    sl->pos = e->start_pos;
    sl->hist_from = e->start_pos;
    for (size_t r = 0; r < e->n_row_lens; r++)
        sl->kv.filled[r] = (int32_t)e->row_lens[r];
    if (sl->kv.head_len != NULL) {
        /* Adopted heads as the router counts them; without them (whole
         * rows) every head holds its row. */
        for (size_t h = 0; h < e->n_head_lens; h++)
            sl->kv.head_len[h] = (int32_t)e->head_lens[h];
        if (e->n_head_lens == 0)
            kv_seq_heads_from_rows(&sl->kv, s->cfg.layout);
    }
}

/* The prefill entry a fork entry samples from (the caller's invariant:
 * it exists). */
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

int gw_step_reserve(struct gw_step *s, const struct gw_plan *plan)
{
    /* The rows' slabs grow when the caller appends ids; kv_seq_row_append
     * changes nothing when it fails. */
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        struct gw_slot *sl = &s->slots[e->slot];
        int64_t from = e->fresh ? e->start_pos : sl->hist_from;
        if (e->kind == GW_ENTRY_FORK) {
            /* The source's history. */
            const struct gw_entry *se = fork_source(plan, e);
            from = se->fresh ? se->start_pos : s->slots[se->slot].hist_from;
        }
        if (TG_GROW(sl->hist, &sl->hist_cap,
                    (int64_t)e->start_pos + (int64_t)e->n_tokens - from) != 0)
            return TG_ENOMEM;
    }
    /* Prompt log-probabilities: per chunk token a value and a rank, plus
     * its alternatives' ids and values (rank 0 fills them). */
    size_t nf = 0, ni = 0;
    for (size_t i = 0; s->cfg.rank == 0 && i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->kind != GW_ENTRY_PREFILL || !e->prompt_lp)
            continue;
        nf += e->n_tokens * (1 + (size_t)e->prompt_top);
        ni += e->n_tokens * (1 + (size_t)e->prompt_top);
    }
    if (nf > 0 && (TG_GROW(s->plp_f, &s->plp_cap_f, nf) != 0 ||
                   TG_GROW(s->plp_i, &s->plp_cap_i, ni) != 0))
        return TG_ENOMEM;
    return 0;
}

/* The forward pass's view of slot `slot`: its position and rows. */
static struct gw_seq *seq_view(struct gw_step *s, uint32_t slot)
{
    struct gw_slot *sl = &s->slots[slot];
    struct gw_seq *q = &s->seqs[slot];
    for (int r = 0; r < s->rows; r++)
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
static void hist_add(struct gw_slot *sl, const struct gw_entry *e)
{
    int64_t at = (int64_t)e->start_pos - sl->hist_from;
    for (size_t t = 0; t < e->n_tokens; t++)
        sl->hist[at + (int64_t)t] = (int32_t)e->tokens[t];
}

/* The draw of entry e (rank 0) from logits row `row` with `sampling`,
 * once the slot has taken `fed` more tokens than its position says (1
 * for a decode entry whose forward pass has not run yet, 0 after it): the
 * RNG index is the tokens the request sampled before; penalties see the
 * known history, positions [hist_from, pos + fed), split at the prompt's
 * end (hist_add has recorded the fed tokens). */
static void make_draw(const struct gw_step *s, const struct gw_entry *e,
                      int row, int64_t fed, const struct tg_sampling *sampling,
                      const uint32_t *mask, struct gw_draw *d)
{
    const struct gw_slot *sl = &s->slots[e->slot];
    int64_t pos = sl->pos + fed;
    int64_t np = sl->num_prompt;
    int64_t p_end = np < pos ? np : pos;
    int64_t o_beg = np > sl->hist_from ? np : sl->hist_from;
    d->slot = e->slot;
    d->row = row;
    d->sampling = sampling;
    d->index = pos > np ? (uint64_t)(pos - np) : 0;
    d->mask = mask;
    d->hist = (struct tg_sample_history){
        .prompt = sl->hist,
        .n_prompt = p_end > sl->hist_from ? (int)(p_end - sl->hist_from) : 0,
        .output = sl->hist + (o_beg - sl->hist_from),
        .n_output = pos > o_beg ? (int)(pos - o_beg) : 0,
    };
}

/* Why slot's draw cannot be made (the caller's gate), or NULL with *mask
 * set. */
static const char *gate(const struct gw_step *s, uint32_t slot,
                        const uint32_t **mask)
{
    *mask = NULL;
    const struct gw_step_hooks *h = &s->cfg.hooks;
    return h->gate != NULL ? h->gate(h->ud, slot, mask) : NULL;
}

/* Times a backend call and marks progress after it. */
static void backend_done(struct gw_step *s, double t0)
{
    s->backend_s += now_s() - t0;
    gw_progress_mark(s->progress);
}

/* A turn's decode begins for slot sl (its last prefill chunk ran, or a
 * fork copied its source): with trig, each head's decode region starts at
 * its present length and the decoded count at the present position. */
static void decode_region_begin(const struct gw_step *s, struct gw_slot *sl)
{
    if (s->cfg.trig == NULL)
        return;
    memcpy(sl->dstart, sl->kv.head_len,
           (size_t)sl->kv.n_heads * sizeof(int32_t));
    sl->dbase = sl->pos;
}

static int copy_pages(struct gw_step *s, int n, char *err, size_t errlen)
{
    double t0 = now_s();
    int rc = s->cfg.be->ops->copy_pages(s->cfg.be, s->cp_src, s->cp_dst, n, err,
                                        errlen);
    s->backend_s += now_s() - t0;
    return rc;
}

/* A fork entry once its source's last chunk has run (see the top of
 * gw_step.h); a draw may use its row as scratch, so two draws never share
 * one. */
static int run_fork(struct gw_step *s, const struct gw_plan *plan,
                    const struct gw_entry *e, char *err, size_t errlen)
{
    const struct gw_entry *se = fork_source(plan, e);
    struct gw_slot *src = &s->slots[se->slot], *dst = &s->slots[e->slot];
    int n_cp = 0, rc;
    for (int32_t r = 0; r < s->rows; r++) {
        const int32_t *a = src->kv.ids + src->kv.off[r];
        const int32_t *b = dst->kv.ids + dst->kv.off[r];
        for (int32_t k = 0; k < dst->kv.n_pages[r]; k++) {
            if (a[k] == b[k])
                continue;
            if (n_cp == s->rows) {
                if ((rc = copy_pages(s, n_cp, err, errlen)) != 0)
                    return rc;
                n_cp = 0;
            }
            s->cp_src[n_cp] = a[k];
            s->cp_dst[n_cp++] = b[k];
        }
    }
    if (n_cp > 0 && (rc = copy_pages(s, n_cp, err, errlen)) != 0)
        return rc;
    int64_t n_hist = src->pos - src->hist_from;
    if (n_hist > 0)
        memcpy(dst->hist, src->hist, (size_t)n_hist * sizeof(int32_t));
    dst->hist_from = src->hist_from;
    dst->pos = src->pos;
    if (dst->kv.head_len != NULL) {
        /* The fork holds exactly what its source holds, head by head. */
        memcpy(dst->kv.head_len, src->kv.head_len,
               (size_t)dst->kv.n_heads * sizeof(int32_t));
        decode_region_begin(s, dst);
    }
    const struct gw_backend *be = s->cfg.be;
    int32_t si = s->row[se - plan->entries], di = s->row[e - plan->entries];
    if (s->cfg.rank == 0 && be->logits != NULL && si >= 0 && di >= 0) {
        size_t V = (size_t)be->cfg.model->vocab;
        memcpy(be->logits + (size_t)di * V, be->logits + (size_t)si * V,
               V * sizeof(float));
    }
    return 0;
}

/* Step 4: the decode entries whose append made their turn's decoded count
 * a multiple of beta are compacted together through the backend; each
 * lists its heads. */
static int compact_triggered(struct gw_step *s, const struct gw_plan *plan,
                             char *err, size_t errlen)
{
    int n = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->kind != GW_ENTRY_DECODE)
            continue;
        struct gw_slot *sl = &s->slots[e->slot];
        int64_t decoded = sl->pos - sl->dbase;
        if (decoded <= 0 || decoded % s->cfg.trig->every != 0)
            continue;
        s->seq_ptrs[n++] = seq_view(s, e->slot);
        s->hrep[s->n_hrep++] = (struct gw_head_lens){
            .slot = e->slot,
            .lens = sl->kv.head_len,
            .n = (size_t)sl->kv.n_heads};
    }
    if (n == 0)
        return 0;
    int64_t heads = 0;
    double t0 = now_s();
    int rc = s->cfg.be->ops->compact(s->cfg.be, s->cfg.trig, s->seq_ptrs, n,
                                     &heads, err, errlen);
    s->compact_s = now_s() - t0;
    backend_done(s, t0);
    s->n_compacted = n;
    return rc;
}

/* The prompt log-probabilities a chunk asks for: its targets (each
 * row's next token) and, on rank 0, the step's room for the values
 * (gw_step_reserve sized it for the plan; *used advances past them). */
static void prompt_lp_out(struct gw_step *s, const struct gw_entry *e,
                          size_t *used_f, size_t *used_i,
                          struct gw_prefill_out *po)
{
    size_t n = e->n_tokens, K = (size_t)e->prompt_top;
    for (size_t t = 0; t + 1 < n; t++)
        s->lp_tgt[t] = (int32_t)e->tokens[t + 1];
    s->lp_tgt[n - 1] = e->lp_next;
    po->lp_targets = s->lp_tgt;
    if (s->cfg.rank != 0)
        return;
    float *f = s->plp_f + *used_f;
    int32_t *iv = s->plp_i + *used_i;
    *used_f += n * (1 + K);
    *used_i += n * (1 + K);
    po->lp = f;
    po->rank = iv;
    po->n_top = (int)K;
    po->top_ids = iv + n;
    po->top_lps = f + n;
    size_t values = e->lp_next >= 0 ? n : n - 1;
    s->plps[s->n_plps++] = (struct gw_prompt_lps){
        .slot = e->slot,
        .first_pos = e->start_pos + 1,
        .n = values,
        .lp = po->lp,
        .rank = po->rank,
        .n_top = (int)K,
        .top_ids = po->top_ids,
        .top_lps = po->top_lps,
    };
}

static int run_prefill(struct gw_step *s, const struct gw_entry *e, int row,
                       size_t *used_f, size_t *used_i, char *err, size_t errlen)
{
    struct gw_slot *sl = &s->slots[e->slot];
    for (size_t t = 0; t < e->n_tokens; t++)
        s->ids[t] = (int32_t)e->tokens[t];
    struct gw_seq *q = seq_view(s, e->slot);
    q->seed = e->sampling.seed; /* gvote's synthetic-query stream */
    struct gw_prefill_out po = {.lp_targets = e->lp_targets, .lp = e->lp};
    if (e->prompt_lp && e->lp_targets == NULL)
        prompt_lp_out(s, e, used_f, used_i, &po);
    if (s->cfg.rank == 0) {
        po.on_row = e->lp_row;
        po.row_ud = e->lp_row_ud;
        po.row_from = e->lp_row_from;
    }
    double t0 = now_s();
    int rc = gw_backend_prefill(s->cfg.be, q, s->ids, (int)e->n_tokens, row,
                                po.lp_targets != NULL ? &po : NULL, err,
                                errlen);
    backend_done(s, t0);
    if (rc != 0)
        return rc;
    hist_add(sl, e);
    sl->pos = q->pos;
    if (e->last_chunk)
        decode_region_begin(s, sl);
    if (s->cfg.per_head_prefill) {
        /* The heads kept what the method chose, which the caller cannot
         * predict: list every head after the chunk. */
        s->hrep[s->n_hrep++] = (struct gw_head_lens){
            .slot = e->slot,
            .lens = sl->kv.head_len,
            .n = (size_t)sl->kv.n_heads};
    }
    return 0;
}

int gw_step_run(struct gw_step *s, const struct gw_plan *plan, int announce,
                char *err, size_t errlen)
{
    TG_ASSERT(plan->n_entries <= (size_t)s->cfg.max_slots);
    int rc, n_pf = 0, nd = 0, d_sample = 0, n_draws = 0;
    size_t used_f = 0, used_i = 0;
    s->n_hrep = 0;
    s->n_plps = 0;
    s->n_compacted = 0;
    s->compact_s = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        s->slots[e->slot].num_prompt = (int32_t)(e->num_prompt_tokens >
                                                         INT32_MAX
                                                     ? INT32_MAX
                                                     : e->num_prompt_tokens);
        s->row[i] = -1;
        if ((e->kind == GW_ENTRY_PREFILL || e->kind == GW_ENTRY_FORK) &&
            e->sample)
            s->row[i] = n_pf++;
    }
    for (size_t i = 0; i < plan->n_entries; i++)
        if (plan->entries[i].kind == GW_ENTRY_PREFILL &&
            (rc = run_prefill(s, &plan->entries[i], s->row[i], &used_f, &used_i,
                              err, errlen)) != 0)
            return rc;
    for (size_t i = 0; i < plan->n_entries; i++)
        if (plan->entries[i].kind == GW_ENTRY_FORK &&
            (rc = run_fork(s, plan, &plan->entries[i], err, errlen)) != 0)
            return rc;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->kind != GW_ENTRY_DECODE)
            continue;
        s->seq_ptrs[nd] = seq_view(s, e->slot);
        s->ids[nd] = (int32_t)e->tokens[0];
        s->row[i] = n_pf + nd;
        d_sample |= e->sample != 0;
        hist_add(&s->slots[e->slot], e); /* reserved; read by the draw */
        const uint32_t *mask = NULL;
        if (announce && s->cfg.rank == 0 && e->sample &&
            gate(s, e->slot, &mask) == NULL)
            make_draw(s, e, s->row[i], 1, &e->sampling, mask,
                      &s->draws[n_draws++]);
        nd++;
    }
    if (nd == 0)
        return 0;
    double t0 = now_s();
    rc = gw_backend_decode(s->cfg.be, s->seq_ptrs, s->ids, nd,
                           d_sample ? n_pf : -1, n_draws > 0 ? s->draws : NULL,
                           n_draws, err, errlen);
    backend_done(s, t0);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (e->kind == GW_ENTRY_DECODE)
            s->slots[e->slot].pos = s->seqs[e->slot].pos;
    }
    return s->cfg.trig != NULL ? compact_triggered(s, plan, err, errlen) : 0;
}

int gw_step_draw(struct gw_step *s, const struct gw_plan *plan, size_t i,
                 const struct tg_sampling *sampling, struct gw_token *out,
                 int32_t *top_ids, float *top_lps, char *err, size_t errlen)
{
    const struct gw_entry *e = &plan->entries[i];
    const uint32_t *mask;
    const char *why = gate(s, e->slot, &mask);
    if (why != NULL)
        return tg_err_set(err, errlen, TG_EINVAL, "%s", why);
    struct gw_draw d;
    make_draw(s, e, s->row[i], 0, sampling != NULL ? sampling : &e->sampling,
              mask, &d);
    double t0 = now_s();
    int rc = s->cfg.be->ops->sample(s->cfg.be, &d, out, top_ids, top_lps, err,
                                    errlen);
    backend_done(s, t0);
    if (rc != 0)
        return rc;
    const struct gw_step_hooks *h = &s->cfg.hooks;
    /* Every draw: a triggered constraint watches its free text too. */
    if (h->accept != NULL &&
        (why = h->accept(h->ud, e->slot, out->token, mask != NULL)) != NULL)
        return tg_err_set(err, errlen, TG_EINVAL, "%s", why);
    /* Masked ids have no probability: alternatives end at the first of
     * them (they sort last). */
    if (mask != NULL)
        while (out->n_top > 0 && out->top_lps[out->n_top - 1] == -INFINITY)
            out->n_top--;
    return 0;
}

void gw_step_draw_all(struct gw_step *s, const struct gw_plan *plan)
{
    size_t K = GW_STEP_MAX_TOP;
    s->n_tok = s->n_serr = 0;
    for (size_t i = 0; i < plan->n_entries; i++) {
        const struct gw_entry *e = &plan->entries[i];
        if (!e->sample)
            continue;
        char *why = s->serr_text + s->n_serr * GW_STEP_ERROR_MAX;
        if (gw_step_draw(s, plan, i, NULL, &s->tok[s->n_tok],
                         s->top_ids + s->n_tok * K, s->top_lps + s->n_tok * K,
                         why, GW_STEP_ERROR_MAX) == 0) {
            s->n_tok++;
            continue;
        }
        /* Fails entry i's request alone. */
        s->serr[s->n_serr++] = (struct gw_slot_error){.slot = e->slot,
                                                      .error = why};
    }
}
