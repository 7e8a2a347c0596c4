/* rt_sched.c — budget-reserving continuous-batching scheduler over the page
 * pools of every rank (see rt_sched.h). */
#include "router/core/rt_sched.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "router/core/rt_sched_internal.h"


/* ---- small helpers ---------------------------------------------------- */

int rt_sched__running(const struct rt_sched_req *req)
{
    return req->state == RT_SCHED_PREFILLING || req->state == RT_SCHED_DECODING;
}

static void wait_unlink(struct rt_sched *s, struct rt_sched_req *req)
{
    tg_list_remove(&s->waiting, &req->wait_link);
    s->n_waiting--;
}

static void wait_push_back(struct rt_sched *s, struct rt_sched_req *req)
{
    tg_list_push_back(&s->waiting, &req->wait_link);
    s->n_waiting++;
}

static void wait_push_front(struct rt_sched *s, struct rt_sched_req *req)
{
    tg_list_push_front(&s->waiting, &req->wait_link);
    s->n_waiting++;
}

/* Removes a running request from the running list and vacates its slot. */
void rt_sched__running_remove(struct rt_sched *s, struct rt_sched_req *req)
{
    int32_t i = 0;
    while (i < s->n_running && s->running[i] != req)
        i++;
    TG_ASSERT(i < s->n_running);
    memmove(&s->running[i], &s->running[i + 1],
            (size_t)(s->n_running - i - 1) * sizeof(s->running[0]));
    s->n_running--;
    s->slot_used[req->slot] = 0;
    TG_ASSERT(s->n_released < s->cfg.max_num_seqs);
    s->released[s->n_released++] = req->slot;
    req->slot = -1;
}

void rt_sched__release_pages(struct rt_sched *s, struct rt_sched_req *req)
{
    if (req->seqs == NULL)
        return;
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        int rc = kv_seq_release(&req->seqs[r], &s->pools[r]);
        TG_ASSERT(rc == 0); /* the pages came from this pool */
    }
    req->bounds.n = 0; /* nothing left to rewind to */
}

static void req_free(struct rt_sched *s, struct rt_sched_req *req)
{
    if (req->seqs != NULL) {
        for (int r = 0; r < s->cfg.n_ranks; r++)
            kv_seq_free(&req->seqs[r], &s->pools[r]);
        free(req->seqs);
    }
    free(req->sent);
    free(req->cut);
    free(req->bound_pages);
    free(req->dstart);
    free(req->sibs);
    rt_prefix_bounds_free(&req->bounds);
    free(req->tokens);
    free(req->session);
    free(req->request_id);
    free(req->grammar);
    free(req);
}

struct rt_sched_event *rt_sched__push_event(struct rt_step *step,
                                            const struct rt_sched_req *req,
                                            int32_t token,
                                            enum rt_sched_end finish)
{
    TG_ASSERT(step->n_events < step->cap_events); /* reserved up front */
    struct rt_sched_event *ev = &step->events[step->n_events++];
    ev->id = req->id;
    ev->user = req->user;
    ev->token = token;
    ev->finish = finish;
    ev->prompt_tokens = req->n_prompt;
    ev->completion_tokens = req->n_generated;
    ev->cached_prompt_tokens = req->cached;
    return ev;
}

/* Ends `req`: an event into `ev_step` when non-NULL, its slot released,
 * its pages stored for multi-turn reuse (STOP / LENGTH with KV held) or
 * given back, and the request freed. */
void rt_sched__retire(struct rt_sched *s, struct rt_sched_req *req,
                      enum rt_sched_end finish, struct rt_step *ev_step)
{
    /* A group not yet forked ends as a whole. */
    while (req->n_sibs > 0)
        rt_sched__retire(s, req->sibs[req->n_sibs - 1], finish, ev_step);
    int attached = req->leader != NULL;
    if (attached)
        rt_sched__sample_detach(s, req);
    if (ev_step != NULL)
        rt_sched__push_event(ev_step, req, -1, finish);
    int store = 0;
    if (rt_sched__running(req)) {
        rt_sched__running_remove(s, req);
        store = (finish == RT_SCHED_END_STOP ||
                 finish == RT_SCHED_END_LENGTH) &&
                req->state == RT_SCHED_DECODING && !req->is_sample;
    } else if (req->state == RT_SCHED_WAITING && !attached) {
        wait_unlink(s, req);
    }
    if (store) {
        /* The last sampled token was never fed back: the KV covers
         * tokens[0 .. n_tokens - 1). */
        int64_t held = req->n_tokens - 1;
        TG_ASSERT(req->seqs[0].pos == held);
        if (rt_prefix_insert_bounds(&s->cache, s->pools, req->tokens, held,
                                    req->scope, req->session, req->seqs,
                                    &req->bounds, NULL, 0) != 0)
            rt_sched__release_pages(s, req);
    } else {
        rt_sched__release_pages(s, req);
    }
    req->state = finish == RT_SCHED_END_STOP || finish == RT_SCHED_END_LENGTH
                     ? RT_SCHED_FINISHED
                     : RT_SCHED_ABORTED;
    rt_sched__map_del(s, req->id);
    req_free(s, req);
}

/* ---- life cycle ------------------------------------------------------- */

int rt_sched_init(struct rt_sched *s, const struct rt_sched_config *cfg,
                  char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    if (cfg == NULL || (cfg->layout == NULL && cfg->layouts == NULL))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: configuration or layout missing");
    if (cfg->n_ranks < 1 || cfg->n_ranks > 4096)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: %d ranks", cfg->n_ranks);
    const struct kv_layout *l0 =
        cfg->layouts != NULL ? cfg->layouts[0] : cfg->layout;
    for (int r = 0; r < cfg->n_ranks; r++) {
        const struct kv_layout *l =
            cfg->layouts != NULL ? cfg->layouts[r] : cfg->layout;
        if (l == NULL || l->n_layers < 1)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "rt_sched: layout of rank %d missing", r);
        /* Deltas, row lengths and chunk plans are shared by all ranks of
         * a step: only the group budgets may differ between ranks. */
        if (l->n_layers != l0->n_layers || l->n_groups != l0->n_groups ||
            l->page_size != l0->page_size ||
            l->prefill_chunk != l0->prefill_chunk)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "rt_sched: rank %d layout (L=%d G=%d P=%d C=%d) "
                              "differs from rank 0 (L=%d G=%d P=%d C=%d)", r,
                              l->n_layers, l->n_groups, l->page_size,
                              l->prefill_chunk, l0->n_layers, l0->n_groups,
                              l0->page_size, l0->prefill_chunk);
    }
    if (cfg->pages_per_rank < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: %d pages per rank",
                          (int)cfg->pages_per_rank);
    if (cfg->max_num_seqs < 1 || cfg->max_num_seqs > (1 << 20))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: max_num_seqs %d", cfg->max_num_seqs);
    if (cfg->max_queued < 1 || cfg->max_queued > (1 << 24))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: max_queued %d", cfg->max_queued);
    if (cfg->max_batched_tokens < l0->prefill_chunk)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: max_batched_tokens %d is below the "
                          "prefill chunk %d, so a chunk could never run",
                          cfg->max_batched_tokens, l0->prefill_chunk);
    s->cfg = *cfg;
    s->cfg.layout = l0;
    s->cfg.layouts = NULL; /* the caller's array need not outlive init */
    s->rows = l0->n_layers * l0->n_groups;
    int rc = rt_prefix_init(&s->cache, cfg->n_ranks, err, errlen);
    if (rc != 0)
        goto fail;
    rc = TG_ENOMEM;
    s->lay = malloc((size_t)cfg->n_ranks * sizeof(s->lay[0]));
    if (s->lay == NULL)
        goto oom;
    for (int r = 0; r < cfg->n_ranks; r++)
        s->lay[r] = cfg->layouts != NULL ? cfg->layouts[r] : cfg->layout;
    s->pools = calloc((size_t)cfg->n_ranks, sizeof(struct kv_pool));
    if (s->pools == NULL)
        goto oom;
    for (int r = 0; r < cfg->n_ranks; r++) {
        rc = kv_pool_init(&s->pools[r], cfg->pages_per_rank, err, errlen);
        if (rc == 0 && cfg->debug_track)
            rc = kv_pool_debug_track(&s->pools[r], err, errlen);
        if (rc != 0)
            goto fail;
    }
    /* Live requests never exceed max_queued + max_num_seqs (preemption
     * only moves running ones back), so the map never fills past half. */
    int64_t live = (int64_t)cfg->max_queued + cfg->max_num_seqs;
    rc = rt_sched__tier_init(s, err, errlen);
    if (rc != 0)
        goto fail;
    if (rt_sched__map_init(s, live) != 0)
        goto oom;
    s->running = calloc((size_t)cfg->max_num_seqs, sizeof(s->running[0]));
    s->slot_used = calloc((size_t)cfg->max_num_seqs, 1);
    s->released = calloc((size_t)cfg->max_num_seqs, sizeof(int32_t));
    s->released_pages = calloc((size_t)cfg->n_ranks, sizeof(int64_t));
    if (s->running == NULL || s->slot_used == NULL || s->released == NULL ||
        s->released_pages == NULL)
        goto oom;
    if (cfg->per_head) {
        for (int r = 0; r < cfg->n_ranks; r++)
            if (s->lay[r]->head_group == NULL ||
                s->lay[r]->n_kv_heads != s->lay[0]->n_kv_heads) {
                rc = tg_err_set(err, errlen, TG_EINVAL,
                                "rt_sched: per-head lengths need every "
                                "rank's head maps, with equal head counts");
                goto fail;
            }
        s->head_of = malloc((size_t)cfg->max_num_seqs *
                            (size_t)cfg->n_ranks * sizeof(int32_t));
        if (s->head_of == NULL)
            goto oom;
    }
    if (cfg->trig != NULL) {
        if (!cfg->per_head) {
            rc = tg_err_set(err, errlen, TG_EINVAL,
                            "rt_sched: decode-time compression needs "
                            "per-head lengths");
            goto fail;
        }
        s->trig = malloc((size_t)cfg->n_ranks * sizeof(s->trig[0]));
        s->trig_scratch = malloc((size_t)s->lay[0]->n_layers *
                                 (size_t)s->lay[0]->n_kv_heads *
                                 sizeof(int32_t));
        if (s->trig == NULL || s->trig_scratch == NULL)
            goto oom;
        for (int r = 0; r < cfg->n_ranks; r++) {
            const struct kv_trig *t = cfg->trig[r];
            if (t == NULL || t->cap == NULL ||
                t->n_layers != s->lay[r]->n_layers ||
                t->n_groups != s->lay[r]->n_groups ||
                t->n_kv_heads != s->lay[r]->n_kv_heads ||
                t->every != cfg->trig[0]->every) {
                rc = tg_err_set(err, errlen, TG_EINVAL,
                                "rt_sched: decode caps of rank %d do not fit "
                                "its layout", r);
                goto fail;
            }
            s->trig[r] = t;
        }
    }
    s->cfg.trig = NULL; /* the caller's array need not outlive init */
    s->next_serial = 1;
    s->next_step = 1;
    return 0;
oom:
    rc = tg_err_set(err, errlen, TG_ENOMEM,
                    "rt_sched: cannot allocate the scheduler");
fail:
    rt_sched_free(s);
    return rc;
}

void rt_sched_free(struct rt_sched *s)
{
    size_t pos = 0;
    for (struct rt_sched_req **q; (q = tg_hmap_next(&s->map, &pos)) != NULL;)
        req_free(s, *q);
    if (s->pools != NULL) {
        rt_prefix_free(&s->cache, s->pools);
        for (int r = 0; r < s->cfg.n_ranks; r++)
            kv_pool_free(&s->pools[r]);
    } else {
        rt_prefix_free(&s->cache, NULL);
    }
    rt_sched__tier_free(s);
    free(s->pools);
    free(s->lay);
    tg_hmap_free(&s->map);
    free(s->running);
    free(s->slot_used);
    free(s->released);
    free(s->released_pages);
    free(s->head_of);
    free((void *)s->trig);
    free(s->trig_scratch);
    free(s->bits);
    memset(s, 0, sizeof(*s));
}

void rt_step_init(struct rt_step *step)
{
    memset(step, 0, sizeof(*step));
}

void rt_step_free(struct rt_step *step)
{
    free(step->entries);
    free(step->deltas);
    free(step->delta_ids);
    free(step->released);
    free(step->events);
    free(step->row_lens);
    free(step->head_lens);
    memset(step, 0, sizeof(*step));
}

/* ---- submission --------------------------------------------------------- */

int rt_sched_submit(struct rt_sched *s, const struct rt_sched_request *req,
                    char *err, size_t errlen)
{
    if (req == NULL || req->prompt == NULL || req->n_prompt < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: request has an empty prompt");
    if (req->max_tokens < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "rt_sched: max_tokens %d must be >= 1",
                          (int)req->max_tokens);
    if (req->n_prompt > INT32_MAX - (int64_t)req->max_tokens)
        return tg_err_set(err, errlen, TG_ETOOBIG,
                          "rt_sched: prompt of %lld tokens is too long",
                          (long long)req->n_prompt);
    for (int64_t i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "rt_sched: prompt token %lld is %d",
                              (long long)i, (int)req->prompt[i]);
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        int64_t pages = 0;
        int rc = kv_seq_prompt_pages(NULL, s->lay[r], 0, req->n_prompt,
                                     &pages, err, errlen);
        if (rc != 0)
            return rc;
        if (pages > s->cfg.pages_per_rank)
            return tg_err_set(err, errlen, TG_ETOOBIG,
                              "rt_sched: prompt of %lld tokens needs %lld "
                              "pages on rank %d, a pool has %d",
                              (long long)req->n_prompt, (long long)pages, r,
                              (int)s->cfg.pages_per_rank);
        /* Decode-time compression bounds the decode KV: the prompt and
         * that bound must fit together. */
        int64_t dec = rt_sched__trig_extra(s, r, req->max_tokens);
        if (pages + dec > s->cfg.pages_per_rank)
            return tg_err_set(err, errlen, TG_ETOOBIG,
                              "rt_sched: prompt of %lld tokens needs %lld "
                              "pages on rank %d and its compressed decode "
                              "(max_tokens %d) up to %lld more, a pool has "
                              "%d", (long long)req->n_prompt,
                              (long long)pages, r, (int)req->max_tokens,
                              (long long)dec, (int)s->cfg.pages_per_rank);
    }
    if (rt_sched__find(s, req->id) != NULL)
        return tg_err_set(err, errlen, TG_EEXIST,
                          "rt_sched: request %llu is already live",
                          (unsigned long long)req->id);
    struct rt_sched_req *leader = NULL;
    if (req->fork_of != 0) {
        int rc = rt_sched__sample_check(s, req, &leader, err, errlen);
        if (rc != 0)
            return rc;
    } else if (s->n_waiting >= s->cfg.max_queued)
        return tg_err_set(err, errlen, TG_EBUSY,
                          "rt_sched: %d requests queued already",
                          (int)s->n_waiting);

    struct rt_sched_req *q = calloc(1, sizeof(*q));
    if (q == NULL)
        goto oom;
    q->cap = req->n_prompt + (req->max_tokens < 64 ? req->max_tokens : 64);
    q->tokens = malloc((size_t)q->cap * sizeof(int32_t));
    if (q->tokens == NULL)
        goto oom;
    q->scope = req->cache_scope;
    if (req->session_id != NULL &&
        (q->session = strdup(req->session_id)) == NULL)
        goto oom;
    if ((q->request_id = strdup(req->request_id != NULL ? req->request_id
                                                        : "")) == NULL)
        goto oom;
    if (req->grammar != NULL && (q->grammar = strdup(req->grammar)) == NULL)
        goto oom;
    q->grammar_prepare = req->grammar_prepare;
    q->sampling = req->sampling; /* the bias arrays borrowed */
    memcpy(q->tokens, req->prompt, (size_t)req->n_prompt * sizeof(int32_t));
    q->id = req->id;
    q->serial = s->next_serial++;
    q->user = req->user;
    q->n_tokens = q->n_prompt = req->n_prompt;
    q->max_tokens = req->max_tokens;
    q->state = RT_SCHED_WAITING;
    q->slot = -1;
    if (leader != NULL) {
        if (rt_sched__sample_attach(s, leader, q) != 0)
            goto oom;
        rt_sched__map_put(s, q);
        return 0;
    }
    rt_sched__map_put(s, q);
    wait_push_back(s, q);
    return 0;
oom:
    if (q != NULL)
        req_free(s, q);
    return tg_err_set(err, errlen, TG_ENOMEM,
                      "rt_sched: cannot queue a request of %lld tokens",
                      (long long)req->n_prompt);
}

int rt_sched_abort(struct rt_sched *s, uint64_t id)
{
    struct rt_sched_req *req = rt_sched__find(s, id);
    if (req == NULL)
        return TG_ENOTFOUND;
    rt_sched__retire(s, req, RT_SCHED_END_ABORT, NULL);
    return 0;
}

/* ---- planning ------------------------------------------------------- */

/* Room in the step for one more entry's deltas: every row of every rank,
 * and `ids` page ids. */
static int delta_room(const struct rt_sched *s, struct rt_step *out,
                      int64_t ids)
{
    int64_t recs = (int64_t)s->cfg.n_ranks * s->rows;
    if (tg_grow_i64((void **)&out->deltas, &out->cap_deltas,
                    out->n_deltas + recs, sizeof(struct rt_step_delta)) != 0)
        return TG_ENOMEM;
    return tg_grow_i64((void **)&out->delta_ids, &out->cap_ids,
                       out->n_ids + ids, sizeof(int32_t));
}

/* Room for the token an entry of `req` samples, made while planning so
 * that rt_sched_complete never allocates. */
int rt_sched__token_room(struct rt_sched_req *req)
{
    if (req->n_tokens < req->cap)
        return 0;
    int64_t limit = req->n_prompt + req->max_tokens;
    int64_t cap = req->cap * 2 < limit ? req->cap * 2 : limit;
    TG_ASSERT(cap > req->n_tokens); /* finished at max_tokens before */
    int32_t *t = realloc(req->tokens, (size_t)cap * sizeof(int32_t));
    if (t == NULL)
        return TG_ENOMEM;
    req->tokens = t;
    req->cap = cap;
    return 0;
}

/* Page ids the slot lacks now plus `extra` pages per rank still to come. */
int64_t rt_sched__unsent_ids(const struct rt_sched *s,
                          const struct rt_sched_req *req, int64_t extra)
{
    int64_t total = 0;
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        int64_t sent = 0;
        for (int32_t w = 0; w < s->rows; w++)
            sent += req->sent[(int64_t)r * s->rows + w];
        total += req->seqs[r].used_pages - sent + extra;
    }
    return total;
}

/* Appends an entry for `req` with the deltas of every row (room reserved
 * by delta_room). */
void rt_sched__add_entry(struct rt_sched *s, struct rt_step *out,
                      struct rt_sched_req *req, enum rt_step_kind kind,
                      int64_t pos, int64_t n, int sample)
{
    int32_t idx = out->n_entries++;
    struct rt_step_entry *e = &out->entries[idx];
    e->id = req->id;
    e->user = req->user;
    e->serial = req->serial;
    e->slot = req->slot;
    e->fresh = req->fresh;
    e->kind = kind;
    e->pos = pos;
    e->n = n;
    e->tokens = req->tokens + pos;
    e->sample = sample;
    e->request_id = req->request_id;
    e->sampling = &req->sampling;
    e->num_prompt = req->n_prompt;
    e->row_lens_off = -1;
    e->fork_from = -1;
    /* A fresh slot on a worker starts its matcher from the spec and the
     * tokens generated so far (a restart after preemption replays them). */
    e->grammar = req->fresh ? req->grammar : NULL;
    e->grammar_tokens = req->tokens + req->n_prompt;
    e->n_grammar_tokens = e->grammar != NULL ? req->n_tokens - req->n_prompt
                                             : 0;
    e->grammar_prepare = e->grammar != NULL ? req->grammar_prepare : 0;
    if (req->fresh && pos > 0) {
        /* Stored KV adopted: the worker learns how much each row holds
         * (room reserved by rt_sched_plan). */
        e->row_lens_off = out->n_row_lens;
        for (int r = 0; r < s->cfg.n_ranks; r++) {
            memcpy(out->row_lens + out->n_row_lens, req->seqs[r].filled,
                   (size_t)s->rows * sizeof(int32_t));
            out->n_row_lens += s->rows;
        }
    }
    e->has_head_lens = 0;
    e->head_lens_off = 0;
    if (req->fresh && pos > 0 && req->seqs[0].head_len != NULL) {
        /* ... and how much each of its heads holds. */
        e->has_head_lens = 1;
        e->head_lens_off = out->n_head_lens;
        for (int r = 0; r < s->cfg.n_ranks; r++) {
            memcpy(out->head_lens + out->n_head_lens, req->seqs[r].head_len,
                   (size_t)out->n_heads * sizeof(int32_t));
            out->n_head_lens += out->n_heads;
        }
    }
    e->delta_begin = out->n_deltas;
    req->fresh = 0;
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        const struct kv_layout *lay = s->lay[r];
        int32_t *sent = req->sent + (int64_t)r * s->rows;
        uint8_t *cut = req->cut + (int64_t)r * s->rows;
        for (int32_t w = 0; w < s->rows; w++) {
            int32_t have = 0;
            const int32_t *ids = kv_seq_row_ids(&req->seqs[r], lay,
                                                w / lay->n_groups,
                                                w % lay->n_groups, &have);
            if (have <= sent[w] && !cut[w])
                continue;
            struct rt_step_delta *d = &out->deltas[out->n_deltas++];
            d->entry = idx;
            d->rank = r;
            d->row = w;
            d->has_truncate = cut[w];
            d->truncate_to = cut[w] ? sent[w] : 0;
            cut[w] = 0;
            d->first = sent[w];
            d->n = have - sent[w];
            d->off = out->n_ids;
            memcpy(out->delta_ids + out->n_ids, ids + sent[w],
                   (size_t)d->n * sizeof(int32_t));
            out->n_ids += d->n;
            sent[w] = have;
        }
    }
    e->delta_end = out->n_deltas;
    out->n_tokens += n;
}

/* Preemption by recompute (vLLM's RECOMPUTE mode): the pages go back, the
 * generated tokens become part of the prompt, and the request waits at the
 * front of the queue so that it is the next one admitted. */
void rt_sched__preempt(struct rt_sched *s, struct rt_sched_req *req)
{
    /* A group not yet forked goes back whole. */
    req = rt_sched__group_requeue(s, req);
    rt_sched__running_remove(s, req);
    rt_sched__release_pages(s, req);
    req->state = RT_SCHED_WAITING;
    req->fresh = 0;
    req->restoring = 0; /* its restore op, if any, ends without it */
    wait_push_front(s, req);
    s->preemptions++;
}

enum { DEC_SCHEDULED, DEC_PREEMPTED, DEC_SKIPPED, DEC_ENDED };

/* Reserves one decode token for running[idx] on every rank, evicting
 * stored entries and then preempting the newest running requests while a
 * pool is short. */
static int plan_decode(struct rt_sched *s, struct rt_step *out, int32_t idx)
{
    struct rt_sched_req *req = s->running[idx];
    int64_t most = 0;
    for (;;) {
        int short_of_pages = 0;
        most = 0;
        for (int r = 0; r < s->cfg.n_ranks; r++) {
            int64_t need = 0;
            int rc = kv_seq_decode_pages(&req->seqs[r], s->lay[r], 1, &need);
            TG_ASSERT(rc == 0); /* DECODING implies a committed turn */
            short_of_pages |= need > kv_pool_n_free(&s->pools[r]);
            most = need > most ? need : most;
        }
        if (!short_of_pages)
            break;
        if (rt_sched__tier_decode_waits(s, req))
            return DEC_SKIPPED;
        if (rt_sched__tier_evict(s, NULL))
            continue;
        struct rt_sched_req *victim = s->running[s->n_running - 1];
        rt_sched__preempt(s, victim);
        if (victim == req)
            return DEC_PREEMPTED;
    }
    if (delta_room(s, out, rt_sched__unsent_ids(s, req, most)) != 0 ||
        rt_sched__token_room(req) != 0)
        return DEC_SKIPPED;
    int64_t pos = req->seqs[0].pos;
    TG_ASSERT(pos == req->n_tokens - 1);
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        if (kv_seq_reserve_decode(&req->seqs[r], s->lay[r], &s->pools[r], 1,
                                  NULL, 0) != 0) {
            /* Only out of memory can get here (pages were checked); the
             * ranks already advanced cannot be rolled back, so the request
             * ends. */
            rt_sched__retire(s, req, RT_SCHED_END_ERROR, out);
            return DEC_ENDED;
        }
    }
    rt_sched__add_entry(s, out, req, RT_STEP_DECODE, pos, 1, 1);
    return DEC_SCHEDULED;
}

/* Pages on `rank` that the prompt of `req` takes on top of what `m` (the
 * matched entry, or NULL) holds. */
static int64_t prompt_need(const struct rt_sched *s,
                           const struct rt_sched_req *req,
                           const struct rt_prefix_entry *m, int rank)
{
    int64_t start = m != NULL ? m->n_tokens : 0, need = 0;
    int rc = kv_seq_prompt_pages(m != NULL ? &m->seqs[rank] : NULL,
                                 s->lay[rank], start, req->n_tokens - start,
                                 &need, NULL, 0);
    TG_ASSERT(rc == 0);
    return need;
}

enum { ADM_ADMITTED, ADM_RESTORING, ADM_ENDED, ADM_STOP };

/* Tries to admit the request at the front of the queue with `budget`
 * tokens left in the step. */
static int admit_front(struct rt_sched *s, struct rt_step *out, int64_t budget)
{
    struct rt_sched_req *req = TG_LIST_ENTRY(s->waiting.first,
                                             struct rt_sched_req, wait_link);
    const int T = s->cfg.n_ranks;
    const int64_t C = s->cfg.layout->prefill_chunk;
    /* Attached parallel samples come along: a slot each, and at most one
     * private page per row each (the exact count, rows whose reserved
     * tokens end inside a page, is taken by kv_seq_fork). */
    const int64_t sib_pages = (int64_t)req->n_sibs * s->rows;
    if (s->n_running + 1 + req->n_sibs > s->cfg.max_num_seqs)
        return ADM_STOP;
    struct rt_prefix_entry *m = NULL;
    if (rt_prefix_match_rewind(&s->cache, s->pools, s->lay, req->tokens,
                               req->n_tokens, req->scope, req->session,
                               &m) != 0)
        m = NULL; /* no reuse without scratch memory; still correct */
    /* A reused entry plus its new turn may need more pages than a fresh
     * prefill (compression runs per chunk of each turn); never let reuse
     * make a request impossible. */
    for (int r = 0; m != NULL && r < T; r++)
        if (m->seqs[r].used_pages + prompt_need(s, req, m, r) >
            kv_pool_n_total(&s->pools[r]))
            m = NULL;
    /* A host entry (§4.10) comes back into device pages counted like the
     * prompt's own; a device entry's pages are the request's already. */
    const int restore = m != NULL && m->on_host;
    int64_t need_max = 0;
    for (int r = 0; r < T; r++) {
        int64_t need = prompt_need(s, req, m, r) +
                       (restore ? m->seqs[r].used_pages : 0);
        if (m == NULL && need > kv_pool_n_total(&s->pools[r])) {
            /* Only a preempted request can outgrow the pool: submit
             * rejects prompts that never fit. It did not reach a length
             * the client asked for: the KV ran out. */
            rt_sched__retire(s, req, RT_SCHED_END_KV, out);
            return ADM_ENDED;
        }
        int64_t spare = kv_pool_n_free(&s->pools[r]) +
                        rt_prefix_pages(&s->cache, r) +
                        rt_sched__tier_pending(s, r) -
                        (m != NULL && !restore ? m->seqs[r].used_pages : 0);
        /* With decode-time compression the group's bounded decode is
         * reserved too, and the running requests' headroom stays free. */
        int64_t dec = (1 + (int64_t)req->n_sibs) *
                          rt_sched__trig_extra(s, r, (int64_t)req->max_tokens -
                                                         req->n_generated) +
                      rt_sched__trig_headroom(s, r);
        if (need + sib_pages + dec > spare)
            return ADM_STOP;
        need_max = need > need_max ? need : need_max;
    }
    int64_t start = m != NULL ? m->n_tokens : 0;
    int64_t n_new = req->n_tokens - start;
    int64_t first = n_new < C ? n_new : C;
    if (first > budget)
        return ADM_STOP;
    int64_t held = 0;
    for (int r = 0; m != NULL && !restore && r < T; r++)
        held += m->seqs[r].used_pages;
    /* A restoring request gets no entry before its pages are back. */
    if (!restore && (delta_room(s, out, held + need_max * T) != 0 ||
                     (first == n_new && rt_sched__token_room(req) != 0)))
        return ADM_STOP;
    if (!restore && first == n_new &&
        rt_sched__forks_admit_room(s, out, req, held + need_max * T) != 0)
        return ADM_STOP;
    if (req->sent == NULL &&
        (req->sent = calloc((size_t)T * (size_t)s->rows, sizeof(int32_t))) ==
            NULL)
        return ADM_STOP;
    if (req->cut == NULL &&
        (req->cut = calloc((size_t)T * (size_t)s->rows, 1)) == NULL)
        return ADM_STOP;
    if (req->seqs == NULL &&
        (req->seqs = calloc((size_t)T, sizeof(struct kv_seq))) == NULL)
        return ADM_STOP;

    /* Make room: stored entries leave the device, least recent first
     * (never the one being reused). The spare check above guarantees
     * this ends. */
    for (int r = 0; r < T; r++)
        if (rt_sched__make_room(s, r,
                                prompt_need(s, req, m, r) + sib_pages +
                                    (restore ? m->seqs[r].used_pages : 0),
                                m) != 0)
            return ADM_STOP;

    if (m != NULL) {
        for (int r = 0; r < T; r++)
            kv_seq_free(&req->seqs[r], &s->pools[r]); /* empty buffers */
        if (!restore)
            rt_prefix_take_bounds(&s->cache, m, req->seqs, &req->bounds);
        else if (rt_sched__tier_restore(s, req, m) != 0)
            return ADM_STOP;
    } else if (req->seqs[0].n_rows == 0) {
        for (int r = 0; r < T; r++)
            if (kv_seq_init(&req->seqs[r], s->lay[r], NULL, 0) != 0 ||
                (s->cfg.per_head &&
                 kv_seq_heads_enable(&req->seqs[r], s->lay[r], NULL, 0) !=
                     0)) {
                rt_sched__retire(s, req, RT_SCHED_END_ERROR, out);
                return ADM_ENDED;
            }
    }
    for (int r = 0; r < T; r++)
        if (kv_seq_reserve_prompt(&req->seqs[r], s->lay[r], &s->pools[r],
                                  start, n_new, NULL, 0) != 0) {
            rt_sched__retire(s, req, RT_SCHED_END_ERROR, out);
            return ADM_ENDED;
        }

    wait_unlink(s, req);
    int32_t slot = 0;
    while (s->slot_used[slot])
        slot++;
    s->slot_used[slot] = 1;
    req->slot = slot;
    req->fresh = 1;
    memset(req->sent, 0, (size_t)T * (size_t)s->rows * sizeof(int32_t));
    memset(req->cut, 0, (size_t)T * (size_t)s->rows);
    req->state = RT_SCHED_PREFILLING;
    s->running[s->n_running++] = req;
    if (!req->admitted) {
        req->admitted = 1;
        req->cached = start;
    }
    s->cached_tokens += start;
    if (req->n_sibs > 0 && rt_sched__admit_samples(s, req, start) != 0) {
        rt_sched__retire(s, req, RT_SCHED_END_ERROR, out);
        return ADM_ENDED;
    }
    int trc = rt_sched__trig_admitted(s, req);
    for (int32_t i = 0; trc == 0 && i < req->n_sibs; i++)
        trc = rt_sched__trig_admitted(s, req->sibs[i]);
    if (trc != 0) {
        rt_sched__retire(s, req, RT_SCHED_END_ERROR, out);
        return ADM_ENDED;
    }
    if (req->restoring != 0)
        return ADM_RESTORING; /* its first chunk follows the copy */
    rt_sched__add_entry(s, out, req, RT_STEP_PREFILL, start, first, first == n_new);
    if (first == n_new)
        rt_sched__plan_forks(s, out, req);
    return ADM_ADMITTED;
}

int rt_sched_plan(struct rt_sched *s, struct rt_step *out, char *err,
                  size_t errlen)
{
    if (s->outstanding != 0)
        return tg_err_set(err, errlen, TG_EBUSY,
                          "rt_sched: step %llu awaits its results",
                          (unsigned long long)s->outstanding);
    /* Everything whose size is known is reserved before anything
     * changes: entries and events are bounded by the live requests. */
    int64_t live = (int64_t)s->n_running + s->n_waiting + s->n_attached;
    if (tg_grow_i32((void **)&out->entries, &out->cap_entries,
                    s->cfg.max_num_seqs, sizeof(struct rt_step_entry)) != 0 ||
        tg_grow_i32((void **)&out->released, &out->cap_released,
                    s->cfg.max_num_seqs, sizeof(int32_t)) != 0 ||
        tg_grow_i32((void **)&out->events, &out->cap_events,
                    live > 0 ? live : 1, sizeof(struct rt_sched_event)) != 0 ||
        tg_grow_i64((void **)&out->row_lens, &out->cap_row_lens,
                    (int64_t)s->cfg.max_num_seqs * s->cfg.n_ranks * s->rows,
                    sizeof(int32_t)) != 0 ||
        (s->cfg.per_head &&
         tg_grow_i64((void **)&out->head_lens, &out->cap_head_lens,
                     (int64_t)s->cfg.max_num_seqs * s->cfg.n_ranks *
                         s->cfg.layout->n_layers * s->cfg.layout->n_kv_heads,
                     sizeof(int32_t)) != 0))
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "rt_sched: cannot grow the step buffers");
    out->n_entries = 0;
    out->n_tokens = 0;
    out->n_deltas = 0;
    out->n_ids = 0;
    out->n_events = 0;
    out->n_released = 0;
    out->n_row_lens = 0;
    out->n_head_lens = 0;
    out->n_heads = s->cfg.per_head ? s->cfg.layout->n_layers *
                                         s->cfg.layout->n_kv_heads
                                   : 0;
    int64_t budget = s->cfg.max_batched_tokens;

    /* 1. Decode tokens, oldest admission first: preemption takes the
     * newest, which has not been planned yet. */
    for (int32_t i = 0; i < s->n_running && budget > 0;) {
        struct rt_sched_req *req = s->running[i];
        if (req->state != RT_SCHED_DECODING) {
            i++;
            continue;
        }
        int r = plan_decode(s, out, i);
        if (r == DEC_SCHEDULED || r == DEC_SKIPPED) {
            budget -= r == DEC_SCHEDULED;
            /* A group preempted whole may have held earlier slots of the
             * list: find the request again. */
            if (i >= s->n_running || s->running[i] != req)
                for (i = 0; s->running[i] != req; i++)
                    ;
            i++;
        } else if (r == DEC_PREEMPTED) {
            break; /* it was the newest: nothing after it */
        }
        /* DEC_ENDED: running[i] is now the next request. */
    }

    /* 2. One chunk per prefilling request, exactly C tokens from the
     * start of its turn. */
    const int64_t C = s->cfg.layout->prefill_chunk;
    for (int32_t i = 0; i < s->n_running && budget > 0; i++) {
        struct rt_sched_req *req = s->running[i];
        if (req->state != RT_SCHED_PREFILLING || req->fork_pending ||
            req->restoring != 0)
            continue;
        const struct kv_seq *q = &req->seqs[0];
        int64_t left = q->turn_len - q->committed;
        int64_t n = left < C ? left : C;
        if (left == 0)
            continue; /* a sample forked in this step: no prefill */
        if (n > budget || delta_room(s, out, rt_sched__unsent_ids(s, req, 0)) != 0 ||
            (n == left && (rt_sched__token_room(req) != 0 ||
                           rt_sched__forks_room(s, out, req) != 0)))
            continue;
        rt_sched__add_entry(s, out, req, RT_STEP_PREFILL, q->turn_start + q->committed,
                  n, n == left);
        if (n == left)
            rt_sched__plan_forks(s, out, req);
        budget -= n;
    }

    /* 3. Admission, strictly FIFO. */
    while (!tg_list_empty(&s->waiting) && s->n_running < s->cfg.max_num_seqs &&
           budget > 0) {
        int32_t before = out->n_entries;
        int r = admit_front(s, out, budget);
        if (r == ADM_STOP)
            break;
        if (r == ADM_ADMITTED)
            budget -= out->entries[before].n;
    }

    memcpy(out->released, s->released, (size_t)s->n_released * sizeof(int32_t));
    out->n_released = s->n_released;
    s->n_released = 0;
    out->step_id = s->next_step++;
    if (out->n_entries > 0) {
        s->outstanding = out->step_id;
        s->steps++;
    }
    return 0;
}
