/* rt_sched_trig.c — the scheduler's side of decode-time compression
 * (`--decode-compress trig`, DESIGN.md §4.9): the bounded decode
 * reservation at admission, and the trigger steps whose head lengths the
 * workers report (see "Decode-time compression" in rt_sched.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_trig.h"
#include "common/base/tg_err.h"
#include "router/core/rt_sched.h"
#include "router/core/rt_sched_internal.h"

int64_t rt_sched__trig_extra(const struct rt_sched *s, int rank,
                             int64_t max_tokens)
{
    if (s->trig == NULL)
        return 0;
    return kv_trig_decode_pages(s->trig[rank], s->lay[rank]->page_size,
                                max_tokens);
}

int64_t rt_sched__trig_headroom(const struct rt_sched *s, int rank)
{
    if (s->trig == NULL)
        return 0;
    int64_t sum = 0;
    for (int32_t i = 0; i < s->n_running; i++) {
        const struct rt_sched_req *q = s->running[i];
        if (q->bound_pages == NULL)
            continue;
        int64_t left = q->bound_pages[rank] - q->seqs[rank].used_pages;
        if (left > 0)
            sum += left;
    }
    return sum;
}

int rt_sched__trig_admitted(struct rt_sched *s, struct rt_sched_req *req)
{
    if (s->trig == NULL)
        return 0;
    const int T = s->cfg.n_ranks;
    if (req->bound_pages == NULL &&
        (req->bound_pages = calloc((size_t)T, sizeof(int64_t))) == NULL)
        return TG_ENOMEM;
    int64_t heads = (int64_t)T * s->lay[0]->n_layers * s->lay[0]->n_kv_heads;
    if (req->dstart == NULL &&
        (req->dstart = calloc((size_t)heads, sizeof(int32_t))) == NULL)
        return TG_ENOMEM;
    int64_t left = (int64_t)req->max_tokens - req->n_generated;
    for (int r = 0; r < T; r++)
        req->bound_pages[r] = req->seqs[r].used_pages +
                              rt_sched__trig_extra(s, r, left);
    return 0;
}

void rt_sched__trig_decode_begin(struct rt_sched *s, struct rt_sched_req *req)
{
    if (s->trig == NULL || req->dstart == NULL)
        return;
    int32_t H = s->lay[0]->n_layers * s->lay[0]->n_kv_heads;
    for (int r = 0; r < s->cfg.n_ranks; r++)
        memcpy(req->dstart + (int64_t)r * H, req->seqs[r].head_len,
               (size_t)H * sizeof(int32_t));
    req->dbase = req->seqs[0].pos;
}

int rt_sched__trig_fires(const struct rt_sched *s,
                         const struct rt_sched_req *req,
                         const struct rt_step_entry *e)
{
    if (s->trig == NULL || req->dstart == NULL || e->kind != RT_STEP_DECODE)
        return 0;
    int64_t decoded = e->pos + 1 - req->dbase;
    return decoded > 0 && decoded % s->trig[0]->every == 0;
}

/* The head lengths rank r's compaction of req leaves: the cap rule of
 * kv_trig_head_after on every head's decode region. */
static void predict(const struct rt_sched *s, const struct rt_sched_req *req,
                    int r, int32_t *out)
{
    const struct kv_layout *lay = s->lay[r];
    const int H = lay->n_kv_heads;
    const int32_t n = lay->n_layers * H;
    const int32_t *ds = req->dstart + (int64_t)r * n;
    const int32_t *hl = req->seqs[r].head_len;
    for (int l = 0; l < lay->n_layers; l++)
        for (int h = 0; h < H; h++) {
            int32_t i = l * H + h;
            out[i] = kv_trig_head_after(s->trig[r], l, h, ds[i], hl[i]);
        }
}

int rt_sched__trig_check(const struct rt_sched *s,
                         const struct rt_sched_req *req,
                         const struct rt_step_entry *e,
                         const struct rt_step_heads *h, char *err,
                         size_t errlen)
{
    if (!rt_sched__trig_fires(s, req, e))
        return tg_err_set(err, errlen, TG_EPROTO,
                          "rank %d reported head lengths for slot %d "
                          "(request %s) after a decode step that compacts "
                          "nothing (%lld tokens decoded this turn, beta %d)",
                          (int)h->rank, (int)e->slot, req->request_id,
                          (long long)(e->pos + 1 - req->dbase),
                          s->trig != NULL ? s->trig[0]->every : 0);
    const struct kv_seq *q = &req->seqs[h->rank];
    if (h->n != q->n_heads)
        return tg_err_set(err, errlen, TG_EPROTO,
                          "rank %d, slot %d (request %s): %lld head lengths, "
                          "expected %d", (int)h->rank, (int)e->slot,
                          req->request_id, (long long)h->n, (int)q->n_heads);
    const struct kv_layout *lay = s->lay[h->rank];
    const int H = lay->n_kv_heads;
    const int32_t *ds = req->dstart + (int64_t)h->rank * q->n_heads;
    for (int32_t i = 0; i < q->n_heads; i++) {
        int32_t want = kv_trig_head_after(s->trig[h->rank], i / H, i % H,
                                          ds[i], q->head_len[i]);
        if (h->head_lens[i] != want)
            return tg_err_set(err, errlen, TG_EPROTO,
                              "rank %d, slot %d (request %s): layer %d head "
                              "%d reports %d tokens; it held %d (decode "
                              "region from %d) and its cap leaves %d",
                              (int)h->rank, (int)e->slot, req->request_id,
                              (int)(i / H), (int)(i % H), (int)h->head_lens[i],
                              (int)q->head_len[i], (int)ds[i], (int)want);
    }
    return 0;
}

void rt_sched__trig_compact(struct rt_sched *s, struct rt_sched_req *req,
                            const struct rt_step_heads *heads,
                            const int32_t *head_of)
{
    for (int r = 0; r < s->cfg.n_ranks; r++) {
        struct kv_seq *q = &req->seqs[r];
        int32_t k = head_of != NULL ? head_of[r] : -1;
        const int32_t *after;
        if (k >= 0) {
            after = heads[k].head_lens; /* checked: equals the rule */
        } else {
            /* A rank that reports nothing is taken to follow the rule. */
            predict(s, req, r, s->trig_scratch);
            after = s->trig_scratch;
        }
        int64_t freed = 0;
        int rc = kv_seq_compact_heads(q, s->lay[r], &s->pools[r], after,
                                      q->n_heads, &freed, NULL, 0);
        TG_ASSERT(rc == 0); /* heads only shrink, no prefill pending */
        s->released_pages[r] += freed;
        if (freed == 0)
            continue;
        rt_sched__mark_cuts(s, req, r);
    }
}
