/* rt_gprep.c — the grammars prepared on worker rank 0, as bookkeeping
 * (see rt_gprep.h). */
#include "router/core/rt_gprep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

static uint64_t fnv(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 0x100000001b3ULL;
    return h;
}

void rt_gpreps_init(struct rt_gpreps *t, int32_t max_pending, int32_t keep)
{
    memset(t, 0, sizeof(*t));
    t->next_id = 1;
    t->max_pending = max_pending >= 1 ? max_pending : 1;
    t->keep = keep >= 0 ? keep : 0;
}

static void rec_free(struct rt_gprep *p)
{
    free(p->spec);
    free(p);
}

void rt_gpreps_free(struct rt_gpreps *t)
{
    for (int32_t i = 0; i < t->n; i++)
        rec_free(t->v[i]);
    free(t->v);
    free(t->rel);
    free(t->out);
    free(t->out_rec);
    memset(t, 0, sizeof(*t));
}

/* Forgets p (index found by scan: records are few), keeping the counts. */
static void rec_drop(struct rt_gpreps *t, struct rt_gprep *p)
{
    for (int32_t i = 0; i < t->n; i++) {
        if (t->v[i] != p)
            continue;
        t->v[i] = t->v[--t->n];
        break;
    }
    if (p->state == RT_GPREP_UNSENT || p->state == RT_GPREP_PENDING)
        t->n_pending--;
    if (p->state == RT_GPREP_UNSENT)
        t->n_unsent--;
    rec_free(p);
}

/* Queues the release of p's id (the worker holds it or fetches it). A
 * release that cannot be queued leaves the grammar pinned on the worker
 * until it restarts: memory, not correctness. */
static void release_id(struct rt_gpreps *t, uint64_t id)
{
    if (TG_GROW(t->rel, &t->cap_rel, t->n_rel + 1) == 0)
        t->rel[t->n_rel++] = id;
}

int rt_gpreps_acquire(struct rt_gpreps *t, const char *spec,
                      struct rt_gprep **out)
{
    *out = NULL;
    size_t len = strlen(spec);
    uint64_t h = fnv(spec, len);
    for (int32_t i = 0; i < t->n; i++) {
        struct rt_gprep *p = t->v[i];
        if (p->hash != h || p->len != len || p->state == RT_GPREP_FAILED ||
            memcmp(p->spec, spec, len) != 0)
            continue;
        if (p->state == RT_GPREP_READY && p->refs == 0)
            t->n_idle--;
        p->refs++;
        *out = p;
        if (p->state == RT_GPREP_READY) {
            t->st.ready_hits++;
            return 0;
        }
        t->st.joined++;
        return TG_EAGAIN;
    }
    if (t->n_pending >= t->max_pending) {
        t->st.refused++;
        return TG_EBUSY;
    }
    struct rt_gprep *p = calloc(1, sizeof(*p));
    char *copy = malloc(len + 1);
    if (p == NULL || copy == NULL || TG_GROW(t->v, &t->cap, t->n + 1) != 0) {
        free(p);
        free(copy);
        return TG_ENOMEM;
    }
    memcpy(copy, spec, len + 1);
    p->id = t->next_id++;
    p->hash = h;
    p->spec = copy;
    p->len = len;
    p->state = RT_GPREP_UNSENT;
    p->refs = 1;
    t->v[t->n++] = p;
    t->n_pending++;
    t->n_unsent++;
    t->st.prepares++;
    *out = p;
    return TG_EAGAIN;
}

void rt_gpreps_ref(struct rt_gprep *p)
{
    p->refs++;
}

/* More idle records than `keep`: the least recently used one goes. */
static void evict_idle(struct rt_gpreps *t)
{
    while (t->n_idle > t->keep) {
        struct rt_gprep *old = NULL;
        for (int32_t i = 0; i < t->n; i++) {
            struct rt_gprep *p = t->v[i];
            if (p->state == RT_GPREP_READY && p->refs == 0 &&
                (old == NULL || p->used < old->used))
                old = p;
        }
        if (old == NULL)
            return; /* counts and records disagree: nothing to evict */
        release_id(t, old->id);
        t->n_idle--;
        rec_drop(t, old);
    }
}

void rt_gpreps_put(struct rt_gpreps *t, struct rt_gprep *p)
{
    if (--p->refs > 0)
        return;
    switch (p->state) {
    case RT_GPREP_READY:
        p->used = ++t->clock;
        t->n_idle++;
        evict_idle(t);
        return;
    case RT_GPREP_PENDING:
        release_id(t, p->id); /* cancels the compile if not started */
        break;
    case RT_GPREP_UNSENT: /* the worker never heard of it */
    case RT_GPREP_FAILED: /* the worker forgot it */ break;
    }
    rec_drop(t, p);
}

int32_t rt_gpreps_take(struct rt_gpreps *t, const struct rt_link_gprep **prep,
                       const uint64_t **rel, int32_t *n_rel)
{
    t->n_out = 0;
    *prep = NULL;
    *rel = t->rel;
    *n_rel = t->n_rel;
    if (t->n_unsent == 0)
        return 0;
    if (TG_GROW(t->out, &t->cap_out, t->n_unsent) != 0)
        return TG_ENOMEM;
    if (TG_GROW(t->out_rec, &t->cap_out_rec, t->n_unsent) != 0)
        return TG_ENOMEM;
    for (int32_t i = 0; i < t->n && t->n_out < t->n_unsent; i++) {
        struct rt_gprep *p = t->v[i];
        if (p->state != RT_GPREP_UNSENT)
            continue;
        t->out[t->n_out] = (struct rt_link_gprep){.id = p->id, .spec = p->spec};
        t->out_rec[t->n_out++] = p;
    }
    /* Oldest first: ids increase with age. */
    for (int32_t i = 1; i < t->n_out; i++)
        for (int32_t j = i; j > 0 && t->out[j - 1].id > t->out[j].id; j--) {
            struct rt_link_gprep a = t->out[j];
            struct rt_gprep *b = t->out_rec[j];
            t->out[j] = t->out[j - 1];
            t->out_rec[j] = t->out_rec[j - 1];
            t->out[j - 1] = a;
            t->out_rec[j - 1] = b;
        }
    *prep = t->out;
    return t->n_out;
}

void rt_gpreps_sent(struct rt_gpreps *t)
{
    for (int32_t i = 0; i < t->n_out; i++) {
        t->out_rec[i]->state = RT_GPREP_PENDING;
        t->n_unsent--;
    }
    t->n_out = 0;
    t->n_rel = 0;
}

struct rt_gprep *rt_gpreps_answer(struct rt_gpreps *t, uint64_t id, int ok,
                                  int busy, const char *error)
{
    struct rt_gprep *p = NULL;
    for (int32_t i = 0; i < t->n && p == NULL; i++)
        if (t->v[i]->id == id && t->v[i]->state == RT_GPREP_PENDING)
            p = t->v[i];
    if (p == NULL)
        return NULL;
    t->n_pending--;
    if (ok) {
        p->state = RT_GPREP_READY;
        if (p->refs == 0) { /* no holder: a put would have released it */
            p->used = ++t->clock;
            t->n_idle++;
            evict_idle(t);
        }
        return p;
    }
    p->state = RT_GPREP_FAILED;
    p->busy = busy != 0;
    snprintf(p->error, sizeof(p->error), "%s",
             error != NULL && error[0] != '\0' ? error : "no reason given");
    t->st.failed++;
    return p;
}

static int by_id(const void *a, const void *b)
{
    uint64_t x = (*(struct rt_gprep *const *)a)->id;
    uint64_t y = (*(struct rt_gprep *const *)b)->id;
    return x < y ? -1 : x > y;
}

void rt_gpreps_lost(struct rt_gpreps *t)
{
    t->n_rel = 0;
    t->n_out = 0;
    for (int32_t i = 0; i < t->n;) {
        struct rt_gprep *p = t->v[i];
        if (p->refs == 0) {
            /* Idle: the next request with its spec prepares it anew. */
            t->v[i] = t->v[--t->n];
            rec_free(p);
            continue;
        }
        i++;
    }
    /* New ids in the old order, so the oldest is prepared first again. */
    qsort(t->v, (size_t)t->n, sizeof(t->v[0]), by_id);
    for (int32_t i = 0; i < t->n; i++) {
        struct rt_gprep *p = t->v[i];
        if (p->state != RT_GPREP_FAILED) {
            p->state = RT_GPREP_UNSENT;
            p->id = t->next_id++;
        }
    }
    t->n_idle = 0;
    t->n_pending = t->n_unsent = 0;
    for (int32_t i = 0; i < t->n; i++)
        if (t->v[i]->state == RT_GPREP_UNSENT) {
            t->n_pending++;
            t->n_unsent++;
        }
}

void rt_gpreps_stats(const struct rt_gpreps *t, struct rt_gprep_stats *out)
{
    *out = t->st;
    out->pending = t->n_pending;
    out->idle = t->n_idle;
    out->records = t->n;
}
