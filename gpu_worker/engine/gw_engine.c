/* gw_engine.c — in-process generation over one KV pool (see gw_engine.h). */
#include "gpu_worker/engine/gw_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kv/kv_seq.h"
#include "common/base/tg_err.h"
#include "common/kv/kv_layout.h"

void gw_engine_free(struct gw_engine *e)
{
    gw_step_free(&e->step);
    gw_backend_free(e->bk);
    kv_pool_free(&e->pool);
    kv_layout_free(&e->layout);
    pf_profile_free(&e->profile);
    gw_model_free(&e->model);
    free(e->global_head);
    gw_trig_cfg_free(&e->trig);
    pf_trig_free(&e->trig_stats);
    memset(e, 0, sizeof(*e));
}

int gw_engine_init(struct gw_engine *e, const struct gw_engine_opts *o,
                   char *err, size_t errlen)
{
    memset(e, 0, sizeof(*e));
    if (o->world_size > 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "in-process generation runs one rank (world size "
                          "%d asked)",
                          o->world_size);
    /* A CUDA backend streams the checkpoint to its device itself: the
     * host keeps the model's shape only. */
    struct gw_rank_opts ro = {
        .model_dir = o->model_dir,
        .profile_path = o->profile_path,
        .profile_force = o->profile_force,
        .heads_per_group = o->heads_per_group,
        .page_size = o->page_size,
        .prefill_chunk = o->prefill_chunk,
        .method = o->method,
        .rank = 0,
        .world_size = 1,
        .no_host_weights = o->backend == GW_BACKEND_CUDA,
        .weights = o->weights,
    };
    int rc = gw_rank_load_map(&e->model, &e->profile, &e->layout, &e->method,
                              &e->global_head, &ro, err, errlen);
    if (rc != 0)
        return rc;
    const struct gw_model *m = &e->model;

    if (o->max_context < 1) {
        rc = tg_err_set(err, errlen, TG_EINVAL, "max_context must be >= 1");
        goto fail;
    }
    e->max_context = o->max_context;
    int64_t rows = (int64_t)m->n_layers * e->layout.n_groups;
    int64_t pages = rows * kv_pages_for(o->max_context, o->page_size);
    if (pages > INT32_MAX) {
        rc = tg_err_set(err, errlen, TG_ETOOBIG, "%lld pages do not fit a pool",
                        (long long)pages);
        goto fail;
    }
    rc = kv_pool_init(&e->pool, (int32_t)pages, err, errlen);
    if (rc != 0)
        goto fail;
    if (o->trig != NULL && o->trig->enabled) {
        rc = gw_rank_trig_init(&e->trig, &e->trig_stats, o->trig,
                               o->trig_stats_path, &e->profile, &e->layout,
                               &e->model, e->global_head, err, errlen);
        if (rc != 0)
            goto fail;
    }
    /* The backend a one-slot worker of this rank would run, with a pool
     * of exactly the accounting's pages and logits row 0. */
    int chunk = o->prefill_chunk;
    struct gw_backend_cfg bc = {
        .model = &e->model,
        .layout = &e->layout,
        .profile = &e->profile,
        .method = e->method,
        .gvote = o->gvote != NULL ? *o->gvote : gw_gvote_params_default(),
        .trig = e->trig.cap != NULL ? &e->trig : NULL,
        .max_slots = 1,
        .max_tokens = chunk > 1 ? chunk : 1,
        .rank = 0,
        .world_size = 1,
        .n_threads = o->n_threads,
        .kv_pages = pages,
        .device = o->device > 0 ? o->device : 0,
        .cuda_graphs = 1,
        .on_scores = o->on_scores,
        .on_scores_ud = o->on_scores_ud,
        .on_queries = o->on_queries,
        .on_queries_ud = o->on_queries_ud,
    };
    e->backend = o->backend;
    rc = gw_backend_new(o->backend, &bc, &e->bk, err, errlen);
    if (rc != 0)
        goto fail;
    if (e->bk->n_pages < pages) {
        /* every page id the accounting hands out must exist there */
        rc = tg_err_set(err, errlen, TG_EINTERNAL,
                        "the %s backend's pool has %d pages, the accounting "
                        "%lld",
                        e->bk->ops->name, (int)e->bk->n_pages,
                        (long long)pages);
        goto fail;
    }
    /* One rank joins its group alone, as a worker of --tp 1 does. */
    const uint8_t *id = NULL;
    size_t id_len = 0;
    e->bk->ops->comm_id(e->bk, &id, &id_len);
    struct gw_comm_setup cs = {.world_size = 1,
                               .kind = e->bk->ops->comm_kind,
                               .id = id,
                               .id_len = id_len};
    rc = e->bk->ops->comm_join(e->bk, &cs, err, errlen);
    if (rc != 0)
        goto fail;
    /* The step loop of a one-slot worker: the same code drives the model
     * here as in the daemon. */
    int per_head = gw_method_per_head(e->method);
    struct gw_step_cfg sc = {
        .be = e->bk,
        .layout = &e->layout,
        .trig = e->trig.cap != NULL ? &e->trig : NULL,
        .per_head = per_head || e->trig.cap != NULL,
        .per_head_prefill = per_head,
        .max_slots = 1,
        .max_tokens = bc.max_tokens,
        .rank = 0,
    };
    rc = gw_step_init(&e->step, &sc, err, errlen);
    if (rc != 0)
        goto fail;
    return 0;
fail:
    gw_engine_free(e);
    return rc;
}

void gw_gen_result_free(struct gw_gen_result *r)
{
    free(r->tokens);
    free(r->lps);
    free(r->top_ids);
    free(r->top_lps);
    free(r->prompt_lp);
    free(r->prompt_rank);
    free(r->prompt_top_ids);
    free(r->prompt_top_lps);
    free(r->kept);
    free(r->forced_lps);
    free(r->kept_n);
    free(r->kept_pos);
    memset(r, 0, sizeof(*r));
}

/* Brings the step's slot (the backend's mirror: page ids per row, and its
 * filled counts, which the forward pass advances) up to the accounting
 * `seq`, as a router's page deltas bring a worker's: rows the accounting
 * cut lose their tails, rows it grew get the new ids appended (the epoch
 * stays, so a CUDA decode table only takes the new tail). */
static int sync_view(const struct kv_seq *seq, struct kv_seq *view, char *err,
                     size_t errlen)
{
    for (int32_t r = 0; r < seq->n_rows; r++) {
        int32_t have = view->n_pages[r], want = seq->n_pages[r];
        int rc = 0;
        if (have > want)
            rc = kv_seq_row_cut(view, r, want);
        else if (have < want)
            rc = kv_seq_row_append(view, r, seq->ids + seq->off[r] + have,
                                   want - have);
        if (rc != 0)
            return tg_err_set(err, errlen, rc,
                              "cannot mirror row %d's %d pages", (int)r,
                              (int)want);
    }
    return 0;
}

/* The physical fill must equal what the accounting says was written. */
static int check_fill(const struct kv_seq *s, const int32_t *len, int rows,
                      char *err, size_t errlen)
{
    for (int r = 0; r < rows; r++)
        if (len[r] != s->filled[r])
            return tg_err_set(err, errlen, TG_EINTERNAL,
                              "row %d holds %d tokens, accounting says %d", r,
                              len[r], s->filled[r]);
    return 0;
}

static int is_stop(const struct gw_engine *e, const struct gw_gen_params *p,
                   int32_t tok)
{
    if (!p->ignore_eos)
        for (int i = 0; i < e->model.cfg.n_eos; i++)
            if (tok == e->model.cfg.eos_token_ids[i])
                return 1;
    for (int i = 0; i < p->n_stop; i++)
        if (tok == p->stop_ids[i])
            return 1;
    return 0;
}

/* Copies the counts (and, with slot_pos, the positions) each head holds
 * into res, in model head order (the engine's heads are the profile's
 * group order). */
static int dump_kept(const struct gw_engine *e, const int32_t *len,
                     const int32_t *hlen, const int32_t *slot_pos,
                     int32_t slot_cap, struct gw_gen_result *res, char *err,
                     size_t errlen)
{
    const struct kv_layout *kv = &e->layout;
    int H = kv->n_kv_heads;
    size_t heads = (size_t)kv->n_layers * (size_t)H;
    res->kept_n = calloc(heads, sizeof(int32_t));
    if (res->kept_n == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    if (slot_pos != NULL) {
        res->kept_cap = slot_cap;
        res->kept_pos = malloc(heads * (size_t)slot_cap * sizeof(int32_t));
        if (res->kept_pos == NULL)
            return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    for (int l = 0; l < kv->n_layers; l++)
        for (int i = 0; i < H; i++) {
            size_t li = (size_t)l * (size_t)H + (size_t)i;
            int g = kv->head_group[li];
            int32_t cnt = hlen != NULL ? hlen[li]
                                       : len[(size_t)l * kv->n_groups + g];
            size_t mh = (size_t)l * (size_t)H + (size_t)e->global_head[li];
            res->kept_n[mh] = cnt;
            /* Appends are in position order (chunks ascending, decode
             * after), so the slots are already sorted. */
            if (slot_pos != NULL)
                memcpy(res->kept_pos + mh * (size_t)slot_cap,
                       slot_pos + li * (size_t)slot_cap,
                       (size_t)cnt * sizeof(int32_t));
        }
    return 0;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the whole process (every thread), for the *_cpu_seconds
 * results. */
static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One generation's state: the page accounting and the one-entry plan the
 * step loop runs (slot 0 of the engine's step is the accounting's mirror). */
struct gen_run {
    struct kv_seq seq;  /* the accounting (pages from e->pool) */
    struct gw_entry en; /* the step's entry */
    struct gw_plan plan;
    uint32_t tok; /* a decode entry's token */
};

/* Runs g's entry through the step loop (its history reserved first). */
static int run_entry(struct gw_engine *e, struct gen_run *g, int announce,
                     char *err, size_t errlen)
{
    if (gw_step_reserve(&e->step, &g->plan) != 0)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "out of memory for the token history");
    return gw_step_run(&e->step, &g->plan, announce, err, errlen);
}

/* §4.9 trigger: the step just run compacted the slot (its decoded count
 * this turn reached a multiple of beta). The rows shrank to their longest
 * heads; the accounting follows and its tail pages go back at once. */
static int decode_compacted(struct gw_engine *e, struct gen_run *g,
                            struct gw_gen_result *res, char *err, size_t errlen)
{
    double t0 = now_seconds();
    int64_t freed = 0;
    struct kv_seq *view = &e->step.slots[0].kv;
    int rc = kv_seq_compact_rows(&g->seq, &e->layout, &e->pool, view->filled,
                                 &freed, err, errlen);
    if (rc == 0)
        rc = sync_view(&g->seq, view, err, errlen);
    res->decode_triggers++;
    res->decode_pages_released += freed;
    res->compact_seconds += e->step.compact_s + (now_seconds() - t0);
    return rc;
}

/* Token t from the entry's logits row (the prompt's last, then each
 * decode step's). A forced id takes the sampled token's place: its
 * log-probability under the raw distribution comes from the host row (a
 * step run without announced draws leaves it there on every backend)
 * before a greedy draw, which may use the row as scratch, lists the top
 * alternatives. */
static int draw(struct gw_engine *e, struct gen_run *g,
                const struct gw_gen_params *p, int t, int32_t *top_ids,
                float *top_lps, int32_t *tok, float *lp, char *err,
                size_t errlen)
{
    struct gw_backend *b = e->bk;
    struct gw_token out;
    if (p->forced_ids != NULL) {
        *tok = p->forced_ids[t];
        const float *row = b->logits +
                           (size_t)e->step.row[0] * (size_t)e->model.vocab;
        int rc = tg_ops_cpu.logprobs(b->host, row, 1, e->model.vocab, tok, lp);
        if (rc != 0)
            return tg_err_set(err, errlen, rc,
                              "forced id %d: log-"
                              "probability failed",
                              (int)*tok);
        if (p->sampling.n_top == 0)
            return 0;
        struct tg_sampling greedy = TG_SAMPLING_OFF;
        greedy.n_top = p->sampling.n_top;
        return gw_step_draw(&e->step, &g->plan, 0, &greedy, &out, top_ids,
                            top_lps, err, errlen);
    }
    int rc = gw_step_draw(&e->step, &g->plan, 0, NULL, &out, top_ids, top_lps,
                          err, errlen);
    if (rc == 0) {
        *tok = out.token;
        *lp = out.logprob;
    }
    return rc;
}

/* The checks of gw_engine_generate's arguments: the in-process trust
 * boundary (what the worker's plan check is to plans). */
static int check_args(const struct gw_engine *e, const int32_t *prompt,
                      int n_prompt, const struct gw_gen_params *p, char *err,
                      size_t errlen)
{
    const struct gw_model *m = &e->model;
    if (n_prompt < 1 || p->max_tokens < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "need at least one prompt token and max_tokens >= 0");
    /* The one check of the sampling value the draws will use (the
     * samplers only assert): the request's, or a forced run's greedy one
     * with its alternatives; none without draws (max_tokens 0). */
    struct tg_sampling drawn = p->sampling;
    if (p->forced_ids != NULL) {
        drawn = TG_SAMPLING_OFF;
        drawn.n_top = p->sampling.n_top;
    }
    if (p->max_tokens > 0)
        TG_TRY(tg_sampling_check(&drawn, m->vocab, NULL, err, errlen));
    if (p->prompt_top < 0 || p->prompt_top > GW_PROMPT_MAX_TOP)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prompt alternatives %d outside 0 .. %d",
                          p->prompt_top, GW_PROMPT_MAX_TOP);
    if (p->dump_kept && e->backend != GW_BACKEND_CPU)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "kept positions (--dump-kept) are recorded by the "
                          "CPU backend only; use --backend cpu");
    if (p->forced_ids != NULL && p->n_forced != p->max_tokens)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%d forced ids with max_tokens %d: teacher-forced "
                          "decode generates exactly the forced ids",
                          p->n_forced, p->max_tokens);
    for (int i = 0; p->forced_ids != NULL && i < p->n_forced; i++)
        if (p->forced_ids[i] < 0 || p->forced_ids[i] >= m->vocab)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "forced id %d at index %d is outside the "
                              "vocabulary [0, %d)",
                              p->forced_ids[i], i, m->vocab);
    if ((int64_t)n_prompt + p->max_tokens > e->max_context)
        return tg_err_set(
            err, errlen, TG_EINVAL,
            "prompt (%d) + max_tokens (%d) exceeds the context of "
            "%lld tokens",
            n_prompt, p->max_tokens, (long long)e->max_context);
    if ((int64_t)n_prompt + p->max_tokens > m->max_positions)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prompt (%d) + max_tokens (%d) exceeds the model's "
                          "context of %d tokens",
                          n_prompt, p->max_tokens, m->max_positions);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= m->vocab)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "prompt token %d at index %d is outside the "
                              "vocabulary [0, %d)",
                              prompt[i], i, m->vocab);
    return 0;
}

/* The step's prompt log-probabilities of the chunk just run (one record,
 * slot 0) into res at their positions. */
static int take_prompt_lps(const struct gw_engine *e, struct gw_gen_result *res,
                           char *err, size_t errlen)
{
    const struct gw_step *st = &e->step;
    if (st->n_plps != 1)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "the step returned %d prompt log-probability "
                          "records for one chunk",
                          st->n_plps);
    const struct gw_prompt_lps *q = &st->plps[0];
    size_t K = (size_t)res->prompt_n_top;
    if (q->first_pos + q->n > (size_t)res->n_prompt || (size_t)q->n_top != K)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "prompt log-probabilities out of the prompt");
    for (size_t i = 0; i < q->n; i++) {
        size_t p = q->first_pos + i;
        res->prompt_lp[p] = q->lp[i];
        res->prompt_rank[p] = q->rank[i];
        memcpy(res->prompt_top_ids + p * K, q->top_ids + i * K,
               K * sizeof(int32_t));
        memcpy(res->prompt_top_lps + p * K, q->top_lps + i * K,
               K * sizeof(float));
    }
    return 0;
}

/* Chunked prefill (§4.3): chunks of exactly C from the turn start, each a
 * step of the one-slot plan; the accounting follows every chunk. */
static int prefill(struct gw_engine *e, struct gen_run *g,
                   const int32_t *prompt, int n_prompt, int32_t *targets,
                   const struct gw_gen_params *p, struct gw_gen_result *res,
                   char *err, size_t errlen)
{
    const struct kv_layout *kv = &e->layout;
    struct kv_seq *view = &e->step.slots[0].kv;
    int C = kv->prefill_chunk, rc = 0;
    if (res->prompt_lp != NULL)
        res->prompt_lp[0] = NAN;
    for (int off = 0; off < n_prompt && rc == 0; off += C) {
        int n = n_prompt - off < C ? n_prompt - off : C;
        int last = off + n == n_prompt;
        for (int i = 0; i < n; i++)
            targets[i] = off + i + 1 < n_prompt ? prompt[off + i + 1] : -1;
        /* Token ids were checked non-negative: their uint32 view is
         * exact. lp[i] belongs to prompt position off + i + 1; the last
         * row of the prompt has no target, so the write stays inside
         * prompt_lp. */
        g->en.kind = GW_ENTRY_PREFILL;
        g->en.tokens = (const uint32_t *)(prompt + off);
        g->en.n_tokens = (size_t)n;
        g->en.start_pos = (uint32_t)off;
        g->en.sample = last;
        g->en.last_chunk = last;
        int detail = res->prompt_rank != NULL;
        g->en.lp_targets = res->prompt_lp != NULL && !detail ? targets : NULL;
        g->en.lp = res->prompt_lp != NULL && !detail ? res->prompt_lp + off + 1
                                                     : NULL;
        /* With ranks and alternatives: the plan's own prompt_lp request,
         * a worker's path for the API's prompt log-probabilities. */
        g->en.prompt_lp = detail;
        g->en.prompt_top = detail ? res->prompt_n_top : 0;
        g->en.lp_next = detail && !last ? prompt[off + n] : -1;
        g->en.lp_row = res->prompt_lp != NULL ? p->prompt_rows : NULL;
        g->en.lp_row_ud = p->prompt_rows_ud;
        g->en.lp_row_from = p->prompt_rows_from;
        rc = run_entry(e, g, 1, err, errlen);
        if (rc == 0 && detail)
            rc = take_prompt_lps(e, res, err, errlen);
        if (rc != 0)
            break;
        if (gw_method_per_head(e->method)) {
            /* §4.8 step 5: the rows hold what their longest heads filled;
             * what the chunk's reservation did not use goes back now. */
            int64_t freed = 0;
            rc = kv_seq_commit_kept(&g->seq, kv, &e->pool, n, view->filled,
                                    &freed, err, errlen);
            res->pages_released += freed;
            if (rc == 0)
                rc = sync_view(&g->seq, view, err, errlen);
        } else {
            rc = kv_seq_commit(&g->seq, kv, n, err, errlen);
        }
        if (rc == 0)
            rc = check_fill(&g->seq, view->filled, g->seq.n_rows, err, errlen);
    }
    g->en.lp_targets = NULL;
    g->en.lp = NULL;
    g->en.prompt_lp = 0;
    g->en.prompt_top = 0;
    g->en.lp_next = -1;
    g->en.lp_row = NULL;
    g->en.lp_row_ud = NULL;
    return rc;
}

int gw_engine_generate(struct gw_engine *e, const int32_t *prompt, int n_prompt,
                       const struct gw_gen_params *p, struct gw_gen_result *res,
                       char *err, size_t errlen)
{
    memset(res, 0, sizeof(*res));
    const struct kv_layout *kv = &e->layout;
    int rc = check_args(e, prompt, n_prompt, p, err, errlen);
    if (rc != 0)
        return rc;
    struct gw_step *st = &e->step;
    struct kv_seq *view = &st->slots[0].kv;
    int rows = kv->n_layers * kv->n_groups;
    int heads = kv->n_layers * kv->n_kv_heads;
    int K = p->sampling.n_top;
    int T = p->max_tokens;
    int32_t slot_cap = (int32_t)(n_prompt + T);
    struct gen_run g = {0};
    int32_t *slot_pos = p->dump_kept ? malloc((size_t)heads * (size_t)slot_cap *
                                              sizeof(int32_t))
                                     : NULL;
    if (p->forced_ids != NULL)
        res->forced_lps = malloc(((size_t)T + 1) * sizeof(float));
    int32_t *targets = malloc((size_t)kv->prefill_chunk * sizeof(int32_t));
    res->tokens = malloc(((size_t)T + 1) * sizeof(int32_t));
    res->lps = malloc(((size_t)T + 1) * sizeof(float));
    res->top_ids = malloc(((size_t)T * K + 1) * sizeof(int32_t));
    res->top_lps = malloc(((size_t)T * K + 1) * sizeof(float));
    res->kept = malloc((size_t)rows * sizeof(int32_t));
    res->n_top = K;
    res->n_prompt = n_prompt;
    if (p->prompt_logprobs)
        res->prompt_lp = malloc((size_t)n_prompt * sizeof(float));
    int PK = p->prompt_logprobs ? p->prompt_top : 0;
    if (PK > 0) {
        res->prompt_n_top = PK;
        res->prompt_rank = calloc((size_t)n_prompt, sizeof(int32_t));
        res->prompt_top_ids = calloc((size_t)n_prompt * (size_t)PK,
                                     sizeof(int32_t));
        res->prompt_top_lps = calloc((size_t)n_prompt * (size_t)PK,
                                     sizeof(float));
    }
    int32_t top_ids[GW_BACKEND_MAX_TOP];
    float top_lps[GW_BACKEND_MAX_TOP];
    if (!targets || !res->tokens || !res->lps || !res->top_ids ||
        !res->top_lps || !res->kept || (p->dump_kept && !slot_pos) ||
        (p->forced_ids != NULL && !res->forced_lps) ||
        (p->prompt_logprobs && !res->prompt_lp) ||
        (PK > 0 &&
         (!res->prompt_rank || !res->prompt_top_ids || !res->prompt_top_lps))) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto out;
    }
    /* Slot 0 starts afresh as a request's first plan entry would start
     * it; its rows mirror the accounting's prompt reservation. */
    g.en = (struct gw_entry){.slot = 0,
                             .request_id = "",
                             .kind = GW_ENTRY_PREFILL,
                             .sampling = p->sampling,
                             .num_prompt_tokens = (uint32_t)n_prompt};
    g.plan = (struct gw_plan){.entries = &g.en, .n_entries = 1};
    gw_step_slot_start(st, &g.en);
    st->seqs[0].slot_pos = slot_pos;
    st->seqs[0].slot_cap = slot_pos != NULL ? slot_cap : 0;
    rc = kv_seq_init(&g.seq, kv, err, errlen);
    if (rc == 0)
        rc = kv_seq_reserve_prompt(&g.seq, kv, &e->pool, 0, n_prompt, err,
                                   errlen);
    if (rc == 0)
        rc = sync_view(&g.seq, view, err, errlen);
    if (rc != 0)
        goto out;

    double t_pre = now_seconds(), c_pre = cpu_seconds();
    rc = prefill(e, &g, prompt, n_prompt, targets, p, res, err, errlen);
    if (rc != 0)
        goto out;
    res->prefill_seconds = now_seconds() - t_pre;
    res->prefill_cpu_seconds = cpu_seconds() - c_pre;
    memcpy(res->kept, view->filled, (size_t)rows * sizeof(int32_t));
    res->pages_peak = g.seq.used_pages;

    res->finish = GW_FINISH_LENGTH;
    for (int t = 0; t < T; t++) {
        int32_t tok;
        float lp;
        rc = draw(e, &g, p, t, top_ids, top_lps, &tok, &lp, err, errlen);
        if (rc != 0)
            goto out;
        memcpy(res->top_ids + (size_t)t * K, top_ids,
               (size_t)K * sizeof(int32_t));
        memcpy(res->top_lps + (size_t)t * K, top_lps,
               (size_t)K * sizeof(float));
        if (p->forced_ids != NULL)
            res->forced_lps[t] = lp;
        res->tokens[t] = tok;
        res->lps[t] = lp;
        res->n_tokens = t + 1;
        if (p->forced_ids == NULL && is_stop(e, p, tok)) {
            res->finish = GW_FINISH_STOP;
            break;
        }
        if (t + 1 == T)
            break;
        rc = kv_seq_reserve_decode(&g.seq, kv, &e->pool, 1, err, errlen);
        if (rc == 0)
            rc = sync_view(&g.seq, view, err, errlen);
        if (rc != 0)
            goto out;
        if (g.seq.used_pages > res->pages_peak)
            res->pages_peak = g.seq.used_pages;
        /* kv_seq_reserve_decode already counted the token as written; the
         * step appends it physically and advances the mirror's fill. Its
         * draw is announced (a CUDA backend then draws it on the device);
         * a forced run keeps its logits on the host. */
        g.tok = (uint32_t)tok;
        g.en.kind = GW_ENTRY_DECODE;
        g.en.tokens = &g.tok;
        g.en.n_tokens = 1;
        g.en.start_pos = (uint32_t)(n_prompt + t);
        g.en.sample = 1;
        g.en.last_chunk = 0;
        double t0 = now_seconds(), c0 = cpu_seconds();
        rc = run_entry(e, &g, p->forced_ids == NULL, err, errlen);
        res->decode_seconds += now_seconds() - t0 - st->compact_s;
        res->decode_cpu_seconds += cpu_seconds() - c0;
        if (rc == 0 && st->n_compacted > 0)
            rc = decode_compacted(e, &g, res, err, errlen);
        if (rc == 0)
            rc = check_fill(&g.seq, view->filled, rows, err, errlen);
        if (rc != 0)
            goto out;
    }
    res->pages_used = g.seq.used_pages;
    res->mono_pages = g.seq.mono_pages;
    if (p->dump_kept || p->head_counts) {
        rc = dump_kept(e, view->filled, view->head_len, slot_pos, slot_cap, res,
                       err, errlen);
        if (rc != 0)
            goto out;
    }
out:
    /* The slot mirrors the accounting, whose pages go back to the pool. */
    st->seqs[0].slot_pos = NULL;
    st->seqs[0].slot_cap = 0;
    gw_step_slot_clear(st, 0);
    free(slot_pos);
    kv_seq_free(&g.seq, &e->pool);
    free(targets);
    return rc;
}
