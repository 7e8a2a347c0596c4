/* gm_walk.c — the graph-structured stack, the walker's key sets, and the
 * walker that steps closed sets of configurations over bytes
 * (gm_internal.h). */
#include "common/grammar/gm_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

/* ---- the GSS -------------------------------------------------------------- */

void gm__gss_free(struct gm__gss *g)
{
    free(g->v);
    free(g->l);
    memset(g, 0, sizeof(*g));
}

int gm__gss_copy(struct gm__gss *dst, const struct gm__gss *src)
{
    struct gm__gss d = {0};
    if (TG_GROW(d.v, &d.cap_v, (int64_t)src->n_v + 1) ||
        TG_GROW(d.l, &d.cap_l, (int64_t)src->n_l + 1)) {
        gm__gss_free(&d);
        return TG_ENOMEM;
    }
    /* a grammar without calls has no vertex: nothing to copy */
    if (src->n_v > 0)
        memcpy(d.v, src->v, (size_t)src->n_v * sizeof(*d.v));
    if (src->n_l > 0)
        memcpy(d.l, src->l, (size_t)src->n_l * sizeof(*d.l));
    d.n_v = src->n_v;
    d.n_l = src->n_l;
    gm__gss_free(dst);
    *dst = d;
    return 0;
}

/* ---- key sets ----------------------------------------------------------- */

int gm__kset_init(struct gm__kset *k)
{
    memset(k, 0, sizeof(*k));
    k->key = malloc(256 * sizeof(*k->key));
    k->stamp = calloc(256, sizeof(*k->stamp));
    if (k->key == NULL || k->stamp == NULL) {
        gm__kset_free(k);
        return TG_ENOMEM;
    }
    k->mask = 255;
    k->epoch = 1;
    return 0;
}

void gm__kset_free(struct gm__kset *k)
{
    free(k->key);
    free(k->stamp);
    memset(k, 0, sizeof(*k));
}

/* Twice the slots, the keys of the current epoch moved over. */
int gm__kset_grow(struct gm__kset *k)
{
    uint32_t cap = (k->mask + 1) * 2;
    if (cap == 0)
        return TG_ENOMEM;
    int32_t(*key)[4] = malloc((size_t)cap * sizeof(*key));
    uint32_t *stamp = calloc(cap, sizeof(*stamp));
    if (key == NULL || stamp == NULL) {
        free(key);
        free(stamp);
        return TG_ENOMEM;
    }
    for (uint32_t i = 0; i <= k->mask; i++) {
        if (k->stamp[i] != k->epoch)
            continue;
        uint32_t h = gm__key_hash(k->key[i][0], k->key[i][1], k->key[i][2]) &
                     (cap - 1);
        while (stamp[h] == 1)
            h = (h + 1) & (cap - 1);
        stamp[h] = 1;
        memcpy(key[h], k->key[i], sizeof(key[h]));
    }
    free(k->key);
    free(k->stamp);
    k->key = key;
    k->stamp = stamp;
    k->mask = cap - 1;
    k->epoch = 1;
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
    w->lv_end = calloc((size_t)max_depth + 1, sizeof(*w->lv_end));
    w->ll_end = calloc((size_t)max_depth + 1, sizeof(*w->ll_end));
    w->cap_cfg = 256;
    w->cfg = malloc(w->cap_cfg * sizeof(*w->cfg));
    if (w->off == NULL || w->kern == NULL || w->flags == NULL ||
        w->lv_end == NULL || w->ll_end == NULL || w->cfg == NULL ||
        gm__kset_init(&w->cset) != 0 || gm__kset_init(&w->vset) != 0) {
        gm__walk_free(w);
        return TG_ENOMEM;
    }
    return 0;
}

void gm__walk_free(struct gm__walker *w)
{
    free(w->cfg);
    free(w->off);
    free(w->kern);
    free(w->flags);
    free(w->lv_first);
    free(w->ll);
    free(w->lv_end);
    free(w->ll_end);
    gm__kset_free(&w->cset);
    gm__kset_free(&w->vset);
    memset(w, 0, sizeof(*w));
}

/* Starts a new set: empties the key sets. */
static void set_begin(struct gm__walker *w)
{
    gm__kset_clear(&w->cset);
    gm__kset_clear(&w->vset);
}

/* Appends (node, stk) to the set being built unless it is there already
 * (either way one unit of work). Returns 0, TG_ENOMEM or TG_ETIMEDOUT. */
static int set_add(struct gm__walker *w, int32_t node, int32_t stk)
{
    int32_t v;
    int rc = gm__walk_spend(w);
    if (rc == 0)
        rc = gm__kset_put(&w->cset, node, stk, 0, 0, &v);
    if (rc <= 0)
        return rc;
    if (TG_GROW(w->cfg, &w->cap_cfg, w->n_cfg + 1))
        return TG_ENOMEM;
    w->cfg[w->n_cfg++] = (struct gm__cfg){.node = node, .stk = stk};
    return 0;
}

/* The local vertex of `rule` entered at the set being built, made if new,
 * with link (ret, parent) added if new. Returns the vertex's stack value,
 * TG_ENOMEM or TG_ETIMEDOUT. */
static int32_t call_vertex(struct gm__walker *w, int32_t rule, int32_t ret,
                           int32_t parent)
{
    int32_t v;
    int rc = gm__walk_spend(w);
    if (rc == 0)
        rc = gm__kset_put(&w->vset, rule, INT32_MIN, INT32_MIN,
                          (int32_t)w->n_lv, &v);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        if (w->n_lv >= INT32_MAX / 2 ||
            TG_GROW(w->lv_first, &w->cap_lv, w->n_lv + 1))
            return TG_ENOMEM;
        w->lv_first[w->n_lv++] = -1;
    }
    int32_t dummy;
    rc = gm__kset_put(&w->vset, v, ret, parent, 0, &dummy);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        if (w->n_ll >= INT32_MAX || TG_GROW(w->ll, &w->cap_ll, w->n_ll + 1))
            return TG_ENOMEM;
        w->ll[w->n_ll] = (struct gm__llink){
            .ret = ret, .parent = parent, .next = w->lv_first[v]};
        w->lv_first[v] = (int32_t)w->n_ll++;
    }
    return GM__LOCAL(v);
}

/* Expands the set [from, n_cfg) in place: a call enters the callee above
 * its vertex; a final node pops (every link of its vertex); popping
 * GM__BOUNDARY or finishing the document only sets a flag. A vertex made
 * here is not popped here: every call consumes a byte before its rule may
 * end, so its links are complete before anyone reads them. */
static int closure(struct gm__walker *w, size_t from, uint8_t *flags)
{
    const struct gm__pda *p = w->p;
    int rc;
    for (size_t i = from; i < w->n_cfg; i++) {
        struct gm__cfg c = w->cfg[i];
        const struct gm__node *n = &p->node[c.node];
        for (uint32_t k = 0; k < n->nc; k++) {
            const struct gm__call *cl = &p->call[n->c0 + k];
            int32_t v = call_vertex(w, cl->rule, cl->ret, c.stk);
            if (v >= GM__EMPTY)
                return v; /* an error: local vertices are <= -3 */
            if ((rc = set_add(w, cl->entry, v)) != 0)
                return rc;
        }
        if (!n->final)
            continue;
        if (GM__IS_LOCAL(c.stk)) {
            for (int32_t l = w->lv_first[GM__LOCAL_ID(c.stk)]; l >= 0;
                 l = w->ll[l].next)
                if ((rc = set_add(w, w->ll[l].ret, w->ll[l].parent)) != 0)
                    return rc;
        } else if (c.stk == GM__BOUNDARY) {
            *flags |= GM__POPPED;
        } else if (c.stk == GM__EMPTY) {
            *flags |= GM__CAN_END;
        } else {
            const struct gm__vtx *v = &w->base->v[c.stk];
            for (int32_t l = v->l0; l < v->l0 + v->nl; l++)
                if ((rc = set_add(w, w->base->l[l].ret,
                                  w->base->l[l].parent)) != 0)
                    return rc;
        }
    }
    return 0;
}

int gm__walk_start(struct gm__walker *w, const struct gm__cfg *c, size_t n,
                   const struct gm__gss *base)
{
    w->base = base;
    w->n_lv = w->n_ll = 0;
    w->n_cfg = 0;
    w->off[0] = 0;
    w->flags[0] = 0;
    set_begin(w);
    int rc;
    for (size_t i = 0; i < n; i++)
        if ((rc = set_add(w, c[i].node, c[i].stk)) != 0)
            return rc;
    w->kern[0] = w->n_cfg;
    rc = closure(w, 0, &w->flags[0]);
    w->off[1] = w->n_cfg;
    w->lv_end[0] = w->n_lv;
    w->ll_end[0] = w->n_ll;
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
    w->n_lv = w->lv_end[d];
    w->n_ll = w->ll_end[d];
    w->flags[d + 1] = 0;
    set_begin(w);
    int rc;
    for (size_t i = s0; i < s1; i++) {
        const struct gm__cfg c = w->cfg[i];
        const struct gm__node *n = &p->node[c.node];
        for (uint32_t k = 0; k < n->ne; k++) {
            const struct gm__edge *e = &p->edge[n->e0 + k];
            if (has_byte(p->cls[e->cls], b) &&
                (rc = set_add(w, e->to, c.stk)) != 0)
                return rc;
        }
    }
    w->kern[d + 1] = w->n_cfg - s1;
    if ((rc = closure(w, s1, &w->flags[d + 1])) != 0)
        return rc;
    w->off[d + 2] = w->n_cfg;
    w->lv_end[d + 1] = w->n_lv;
    w->ll_end[d + 1] = w->n_ll;
    return w->n_cfg > s1;
}
