/* gm_walk.c — interned stack frames and the walker that steps closed sets
 * of configurations over bytes (gm_internal.h). */
#include "common/grammar/gm_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

/* ---- frames ---------------------------------------------------------------- */

static uint32_t frame_hash(int32_t ret, int32_t parent)
{
    uint64_t h = ((uint64_t)(uint32_t)ret << 32 | (uint32_t)parent) *
                 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static int frames_rehash(struct gm__frames *fs, uint32_t cap)
{
    int32_t *h = malloc((size_t)cap * sizeof(*h));
    if (h == NULL)
        return TG_ENOMEM;
    for (uint32_t i = 0; i < cap; i++)
        h[i] = -1;
    for (int32_t id = 0; id < fs->n; id++) {
        uint32_t k = frame_hash(fs->f[id].ret, fs->f[id].parent) & (cap - 1);
        while (h[k] >= 0)
            k = (k + 1) & (cap - 1);
        h[k] = id;
    }
    free(fs->hash);
    fs->hash = h;
    fs->hmask = cap - 1;
    return 0;
}

int32_t gm__frames_push(struct gm__frames *fs, int32_t ret, int32_t parent)
{
    if (fs->hash == NULL || (uint32_t)(fs->n + 1) * 2 > fs->hmask + 1) {
        uint32_t cap = fs->hash == NULL ? 256 : (fs->hmask + 1) * 2;
        if (cap > (1u << 30) || frames_rehash(fs, cap) != 0)
            return TG_ENOMEM;
    }
    uint32_t k = frame_hash(ret, parent) & fs->hmask;
    while (fs->hash[k] >= 0) {
        const struct gm__frame *f = &fs->f[fs->hash[k]];
        if (f->ret == ret && f->parent == parent)
            return fs->hash[k];
        k = (k + 1) & fs->hmask;
    }
    if (TG_GROW(fs->f, &fs->cap, (int64_t)fs->n + 1))
        return TG_ENOMEM;
    fs->f[fs->n] = (struct gm__frame){.ret = ret, .parent = parent};
    fs->hash[k] = fs->n;
    return fs->n++;
}

void gm__frames_clear(struct gm__frames *fs)
{
    if (fs->hash != NULL && fs->n > 0)
        for (uint32_t i = 0; i <= fs->hmask; i++)
            fs->hash[i] = -1;
    fs->n = 0;
}

void gm__frames_free(struct gm__frames *fs)
{
    free(fs->f);
    free(fs->hash);
    memset(fs, 0, sizeof(*fs));
}

int gm__frames_copy(struct gm__frames *dst, const struct gm__frames *src)
{
    struct gm__frames d = {0};
    if (src->cap > 0) {
        d.f = malloc((size_t)src->cap * sizeof(*d.f));
        if (d.f == NULL)
            return TG_ENOMEM;
        memcpy(d.f, src->f, (size_t)src->n * sizeof(*d.f));
    }
    if (src->hash != NULL) {
        d.hash = malloc(((size_t)src->hmask + 1) * sizeof(*d.hash));
        if (d.hash == NULL) {
            free(d.f);
            return TG_ENOMEM;
        }
        memcpy(d.hash, src->hash, ((size_t)src->hmask + 1) * sizeof(*d.hash));
    }
    d.n = src->n;
    d.cap = src->cap;
    d.hmask = src->hmask;
    gm__frames_free(dst);
    *dst = d;
    return 0;
}

/* ---- the walker ------------------------------------------------------------ */

int gm__walk_init(struct gm__walker *w, const struct gm__pda *p,
                  int max_depth)
{
    memset(w, 0, sizeof(*w));
    w->p = p;
    w->max_depth = max_depth;
    w->off = calloc((size_t)max_depth + 2, sizeof(*w->off));
    w->kern = calloc((size_t)max_depth + 1, sizeof(*w->kern));
    w->flags = calloc((size_t)max_depth + 1, 1);
    w->cap_cfg = 256;
    w->cfg = malloc(w->cap_cfg * sizeof(*w->cfg));
    w->hmask = 255;
    w->hkey = malloc(256 * sizeof(*w->hkey));
    w->hstamp = calloc(256, sizeof(*w->hstamp));
    w->epoch = 1;
    if (w->off == NULL || w->kern == NULL || w->flags == NULL ||
        w->cfg == NULL || w->hkey == NULL || w->hstamp == NULL) {
        gm__walk_free(w);
        return TG_ENOMEM;
    }
    return 0;
}

void gm__walk_free(struct gm__walker *w)
{
    gm__frames_free(&w->local);
    free(w->cfg);
    free(w->off);
    free(w->kern);
    free(w->flags);
    free(w->hkey);
    free(w->hstamp);
    memset(w, 0, sizeof(*w));
}

static uint32_t cfg_hash(const struct gm__cfg *c)
{
    uint64_t h = (uint64_t)(uint32_t)c->node * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uint32_t)c->local * 0xC2B2AE3D27D4EB4Full;
    h ^= (uint64_t)(uint32_t)c->base * 0x165667B19E3779F9ull;
    return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

/* Starts a new set for dedupe: bumps the epoch (clearing on wrap). */
static void set_begin(struct gm__walker *w)
{
    if (++w->epoch == 0) {
        memset(w->hstamp, 0, ((size_t)w->hmask + 1) * sizeof(*w->hstamp));
        w->epoch = 1;
    }
}

/* Rehashes the dedupe table, twice as large, to hold the set [from, n_cfg)
 * at half load. */
static int set_rehash(struct gm__walker *w, size_t from)
{
    uint32_t cap = (w->hmask + 1) * 2;
    struct gm__cfg *k = malloc((size_t)cap * sizeof(*k));
    uint32_t *s = calloc(cap, sizeof(*s));
    if (k == NULL || s == NULL) {
        free(k);
        free(s);
        return TG_ENOMEM;
    }
    free(w->hkey);
    free(w->hstamp);
    w->hkey = k;
    w->hstamp = s;
    w->hmask = cap - 1;
    w->epoch = 1;
    for (size_t i = from; i < w->n_cfg; i++) {
        uint32_t h = cfg_hash(&w->cfg[i]) & w->hmask;
        while (w->hstamp[h] == w->epoch)
            h = (h + 1) & w->hmask;
        w->hstamp[h] = w->epoch;
        w->hkey[h] = w->cfg[i];
    }
    return 0;
}

/* Appends c to the set that starts at `from` unless it is there already.
 * Returns 0 or TG_ENOMEM. */
static int set_add(struct gm__walker *w, size_t from, int32_t node,
                   int32_t local, int32_t base)
{
    struct gm__cfg c = {.node = node, .local = local, .base = base};
    if ((w->n_cfg - from + 1) * 2 > (size_t)w->hmask + 1 &&
        set_rehash(w, from) != 0)
        return TG_ENOMEM;
    uint32_t h = cfg_hash(&c) & w->hmask;
    while (w->hstamp[h] == w->epoch) {
        const struct gm__cfg *k = &w->hkey[h];
        if (k->node == node && k->local == local && k->base == base)
            return 0;
        h = (h + 1) & w->hmask;
    }
    if (TG_GROW(w->cfg, &w->cap_cfg, w->n_cfg + 1))
        return TG_ENOMEM;
    w->hstamp[h] = w->epoch;
    w->hkey[h] = c;
    w->cfg[w->n_cfg++] = c;
    return 0;
}

/* Expands the set [from, n_cfg) in place: calls push a local frame and
 * enter the callee; a final node pops (a local frame, else the base);
 * popping GM__BOUNDARY or finishing the document only sets a flag. */
static int closure(struct gm__walker *w, size_t from, uint8_t *flags)
{
    const struct gm__pda *p = w->p;
    for (size_t i = from; i < w->n_cfg; i++) {
        struct gm__cfg c = w->cfg[i];
        const struct gm__node *n = &p->node[c.node];
        for (uint32_t k = 0; k < n->nc; k++) {
            const struct gm__call *cl = &p->call[n->c0 + k];
            int32_t fr = gm__frames_push(&w->local, cl->ret, c.local);
            if (fr < 0 || set_add(w, from, cl->entry, fr, c.base) != 0)
                return TG_ENOMEM;
        }
        if (!n->final)
            continue;
        if (c.local != GM__EMPTY) {
            const struct gm__frame *f = &w->local.f[c.local];
            if (set_add(w, from, f->ret, f->parent, c.base) != 0)
                return TG_ENOMEM;
        } else if (c.base == GM__BOUNDARY) {
            *flags |= GM__POPPED;
        } else if (c.base == GM__EMPTY) {
            *flags |= GM__CAN_END;
        } else {
            const struct gm__frame *f = &w->base->f[c.base];
            if (set_add(w, from, f->ret, GM__EMPTY, f->parent) != 0)
                return TG_ENOMEM;
        }
    }
    return 0;
}

int gm__walk_start(struct gm__walker *w, const struct gm__cfg *c, size_t n,
                   const struct gm__frames *base)
{
    w->base = base;
    gm__frames_clear(&w->local);
    w->n_cfg = 0;
    w->off[0] = 0;
    w->flags[0] = 0;
    set_begin(w);
    for (size_t i = 0; i < n; i++)
        if (set_add(w, 0, c[i].node, c[i].local, c[i].base) != 0)
            return TG_ENOMEM;
    w->kern[0] = w->n_cfg;
    int rc = closure(w, 0, &w->flags[0]);
    w->off[1] = w->n_cfg;
    return rc;
}

static int has_byte(const uint8_t *set, uint8_t b)
{
    return (set[b >> 3] >> (b & 7)) & 1;
}

int gm__walk_step_general(struct gm__walker *w, int d, uint8_t b)
{
    const struct gm__pda *p = w->p;
    size_t s0 = w->off[d], s1 = w->off[d + 1];
    w->n_cfg = s1;
    w->flags[d + 1] = 0;
    set_begin(w);
    for (size_t i = s0; i < s1; i++) {
        const struct gm__cfg c = w->cfg[i];
        const struct gm__node *n = &p->node[c.node];
        for (uint32_t k = 0; k < n->ne; k++) {
            const struct gm__edge *e = &p->edge[n->e0 + k];
            if (has_byte(p->cls[e->cls], b) &&
                set_add(w, s1, e->to, c.local, c.base) != 0)
                return TG_ENOMEM;
        }
    }
    w->kern[d + 1] = w->n_cfg - s1;
    if (closure(w, s1, &w->flags[d + 1]) != 0)
        return TG_ENOMEM;
    w->off[d + 2] = w->n_cfg;
    return w->n_cfg > s1;
}
