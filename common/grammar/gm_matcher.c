/* gm_matcher.c — the state of one constrained generation, its token masks
 * and rollback (gm_matcher.h). */
#include "common/grammar/gm_matcher.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

static const struct gm_matcher_state *cur(const struct gm_matcher *m)
{
    return &m->hist[m->n_hist - 1];
}

static int by_cfg(const void *a, const void *b)
{
    const struct gm__cfg *x = a, *y = b;
    if (x->node != y->node)
        return x->node < y->node ? -1 : 1;
    return x->stk < y->stk ? -1 : x->stk > y->stk;
}

/* Fewest bytes that empty stack s. */
static uint32_t rest_of(const struct gm_matcher *m, int32_t s)
{
    return s == GM__EMPTY ? 0 : m->gss.v[s].rest;
}

static uint32_t sat_add(uint32_t a, uint32_t b)
{
    return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

/* Starts the budget of one call. */
static void budget_begin(struct gm_matcher *m)
{
    m->w.work = 0;
    m->w.work_limit = m->budget_work;
    m->w.deadline = m->budget_s > 0 ? gm__now() + m->budget_s : 0;
}

/* Drops what a failed call added past the present state. */
static void undo(struct gm_matcher *m)
{
    const struct gm_matcher_state *s = cur(m);
    m->n_log = s->h0 + s->nh;
    m->gss.n_v = s->nv;
    m->gss.n_l = s->nl;
    m->last_work = m->w.work;
}

/* Turns the configurations m->tmp[0..n_tmp) (stacks already in m->gss)
 * into the heads of a new state appended to the history: a configuration
 * at the end of its rule is replaced by those its stack returns to (and
 * kept too when it can read on); the document end sets can_end. */
static int push_state(struct gm_matcher *m)
{
    const struct gm__pda *p = &m->g->pda;
    size_t h0 = m->n_log;
    uint8_t can_end = 0;
    gm__kset_clear(&m->seen);
    for (size_t i = 0; i < m->n_tmp; i++) {
        struct gm__cfg c = m->tmp[i];
        int32_t dummy;
        int rc = gm__walk_spend(&m->w);
        if (rc == 0)
            rc = gm__kset_put(&m->seen, c.node, c.stk, 0, 0, &dummy);
        if (rc < 0)
            return rc;
        if (rc == 0)
            continue; /* seen */
        const struct gm__node *n = &p->node[c.node];
        if (n->final) {
            if (c.stk == GM__EMPTY) {
                can_end = 1;
            } else {
                const struct gm__vtx *v = &m->gss.v[c.stk];
                if (tg_grow((void **)&m->tmp, &m->cap_tmp,
                            m->n_tmp + (size_t)v->nl, sizeof(*m->tmp)))
                    return TG_ENOMEM;
                for (int32_t l = v->l0; l < v->l0 + v->nl; l++)
                    m->tmp[m->n_tmp++] = (struct gm__cfg){
                        .node = m->gss.l[l].ret, .stk = m->gss.l[l].parent};
            }
        }
        if (n->ne == 0 && n->nc == 0)
            continue;
        if (tg_grow((void **)&m->log, &m->cap_log, m->n_log + 1,
                    sizeof(*m->log)))
            return TG_ENOMEM;
        m->log[m->n_log++] = c;
    }
    size_t nh = m->n_log - h0;
    if (nh > 1)
        qsort(m->log + h0, nh, sizeof(*m->log), by_cfg);
    if (tg_grow((void **)&m->hist, &m->cap_hist, m->n_hist + 1,
                sizeof(*m->hist)))
        return TG_ENOMEM;
    m->hist[m->n_hist++] = (struct gm_matcher_state){.h0 = h0,
                                                     .nh = nh,
                                                     .nv = m->gss.n_v,
                                                     .nl = m->gss.n_l,
                                                     .can_end = can_end,
                                                     .done = 0};
    return 0;
}

static int start_state(struct gm_matcher *m)
{
    m->n_log = m->n_hist = 0;
    m->gss.n_v = m->gss.n_l = 0;
    m->n_tmp = 0;
    if (tg_grow((void **)&m->tmp, &m->cap_tmp, 1, sizeof(*m->tmp)))
        return TG_ENOMEM;
    m->tmp[m->n_tmp++] = (struct gm__cfg){.node = m->g->pda.start,
                                          .stk = GM__EMPTY};
    budget_begin(m);
    m->w.work_limit = 0; /* the start state is the grammar's, not a call's */
    m->w.deadline = 0;
    return push_state(m);
}

static int walker_init(struct gm_matcher *m, struct gm_grammar *g)
{
    int max_depth = g->vocab->max_len > 0 ? g->vocab->max_len : 1;
    if (gm__walk_init(&m->w, &g->pda, max_depth) != 0 ||
        gm__kset_init(&m->seen) != 0)
        return TG_ENOMEM;
    return 0;
}

int gm_matcher_init(struct gm_matcher *m, struct gm_grammar *g)
{
    memset(m, 0, sizeof(*m));
    m->g = gm_grammar_ref(g);
    m->budget_work = GM_MATCHER_WORK_DEFAULT;
    /* the heads' log exists even when no state has a head (a grammar of
     * the empty string alone): the walker is given m->log + h0 */
    if (walker_init(m, g) != 0 ||
        tg_grow((void **)&m->log, &m->cap_log, 1, sizeof(*m->log)) != 0 ||
        start_state(m) != 0) {
        gm_matcher_free(m);
        return TG_ENOMEM;
    }
    return 0;
}

void gm_matcher_set_budget(struct gm_matcher *m, uint64_t work, double seconds)
{
    m->budget_work = work;
    m->budget_s = seconds > 0 ? seconds : 0;
}

uint64_t gm_matcher_last_work(const struct gm_matcher *m)
{
    return m->last_work;
}

void gm_matcher_free(struct gm_matcher *m)
{
    gm__gss_free(&m->gss);
    gm__walk_free(&m->w);
    gm__kset_free(&m->seen);
    free(m->log);
    free(m->hist);
    free(m->tmp);
    free(m->pairs);
    free(m->lmap);
    free(m->todo);
    gm_grammar_unref(m->g);
    memset(m, 0, sizeof(*m));
}

void gm_matcher_reset(struct gm_matcher *m)
{
    /* cannot fail: the buffers already hold one state */
    start_state(m);
}

int gm_matcher_copy(struct gm_matcher *dst, const struct gm_matcher *src)
{
    struct gm_matcher d;
    memset(&d, 0, sizeof d);
    d.g = gm_grammar_ref(src->g);
    d.budget_work = src->budget_work;
    d.budget_s = src->budget_s;
    if (walker_init(&d, src->g) != 0 || gm__gss_copy(&d.gss, &src->gss) != 0 ||
        tg_grow((void **)&d.log, &d.cap_log, src->n_log + 1, sizeof(*d.log)) ||
        tg_grow((void **)&d.hist, &d.cap_hist, src->n_hist + 1,
                sizeof(*d.hist))) {
        gm_matcher_free(&d);
        memset(dst, 0, sizeof(*dst));
        return TG_ENOMEM;
    }
    memcpy(d.log, src->log, src->n_log * sizeof(*d.log));
    memcpy(d.hist, src->hist, src->n_hist * sizeof(*d.hist));
    d.n_log = src->n_log;
    d.n_hist = src->n_hist;
    *dst = d;
    return 0;
}

/* The GSS vertex of walker stack s: the walker's local vertices it rests
 * on become vertices of m->gss (each once per conversion, parents
 * first, so a vertex's links are written in one run); a negative code
 * when out of memory. */
static int32_t to_gss(struct gm_matcher *m, int32_t s)
{
    if (!GM__IS_LOCAL(s))
        return s;
    const struct gm__walker *w = &m->w;
    const uint32_t *minfin = m->g->pda.minfin;
    size_t n_todo = 0;
    if (tg_grow((void **)&m->todo, &m->cap_todo, 1, sizeof(*m->todo)))
        return TG_ENOMEM;
    m->todo[n_todo++] = GM__LOCAL_ID(s);
    while (n_todo > 0) {
        int32_t x = m->todo[n_todo - 1];
        if (m->lmap[x] >= 0) {
            n_todo--;
            continue;
        }
        int pending = 0, nl = 0;
        for (int32_t l = w->lv_first[x]; l >= 0; l = w->ll[l].next) {
            int32_t par = w->ll[l].parent;
            nl++;
            if (!GM__IS_LOCAL(par) || m->lmap[GM__LOCAL_ID(par)] >= 0)
                continue;
            if (tg_grow((void **)&m->todo, &m->cap_todo, n_todo + 1,
                        sizeof(*m->todo)))
                return TG_ENOMEM;
            m->todo[n_todo++] = GM__LOCAL_ID(par);
            pending = 1;
        }
        if (pending)
            continue;
        if (m->gss.n_v >= INT32_MAX - 1 || m->gss.n_l > INT32_MAX - nl ||
            TG_GROW(m->gss.v, &m->gss.cap_v, (int64_t)m->gss.n_v + 1) ||
            TG_GROW(m->gss.l, &m->gss.cap_l, (int64_t)m->gss.n_l + nl))
            return TG_ENOMEM;
        struct gm__vtx v = {.l0 = m->gss.n_l, .nl = nl, .rest = UINT32_MAX};
        for (int32_t l = w->lv_first[x]; l >= 0; l = w->ll[l].next) {
            int32_t par = w->ll[l].parent;
            if (GM__IS_LOCAL(par))
                par = m->lmap[GM__LOCAL_ID(par)];
            m->gss.l[m->gss.n_l++] = (struct gm__link){.ret = w->ll[l].ret,
                                                       .parent = par};
            uint32_t r = sat_add(minfin[w->ll[l].ret], rest_of(m, par));
            if (r < v.rest)
                v.rest = r;
        }
        m->gss.v[m->gss.n_v] = v;
        m->lmap[x] = m->gss.n_v++;
        n_todo--;
    }
    return m->lmap[GM__LOCAL_ID(s)];
}

/* Moves the kernel of walker set d into m->tmp as configurations over
 * m->gss. */
static int take_kernel(struct gm_matcher *m, int d)
{
    size_t k0 = m->w.off[d], k1 = k0 + m->w.kern[d];
    m->n_tmp = 0;
    if (tg_grow((void **)&m->tmp, &m->cap_tmp, k1 - k0 + 1, sizeof(*m->tmp)) ||
        tg_grow((void **)&m->lmap, &m->cap_lmap, m->w.n_lv + 1,
                sizeof(*m->lmap)))
        return TG_ENOMEM;
    for (size_t i = 0; i < m->w.n_lv; i++)
        m->lmap[i] = -1;
    for (size_t i = k0; i < k1; i++) {
        struct gm__cfg c = m->w.cfg[i];
        int32_t s = to_gss(m, c.stk);
        if (s < GM__EMPTY)
            return TG_ENOMEM;
        m->tmp[m->n_tmp++] = (struct gm__cfg){.node = c.node, .stk = s};
    }
    return 0;
}

static int accept_bytes(struct gm_matcher *m, const uint8_t *b, size_t n)
{
    const struct gm_matcher_state *s = cur(m);
    int rc = gm__walk_start(&m->w, m->log + s->h0, s->nh, &m->gss);
    if (rc != 0)
        return rc;
    int d = 0;
    for (size_t i = 0; i < n; i++) {
        if (d == m->w.max_depth) {
            /* a long byte string: restart the walker from the kernel */
            if ((rc = take_kernel(m, d)) != 0 ||
                (rc = gm__walk_start(&m->w, m->tmp, m->n_tmp, &m->gss)) != 0)
                return rc;
            d = 0;
        }
        int alive = gm__walk_step(&m->w, d, b[i]);
        if (alive < 0)
            return alive;
        if (!alive)
            return TG_EINVAL;
        d++;
    }
    if ((rc = take_kernel(m, d)) != 0)
        return rc;
    return push_state(m);
}

int gm_matcher_accept_bytes(struct gm_matcher *m, const void *bytes, size_t n)
{
    if (cur(m)->done)
        return TG_EDONE;
    if (n == 0)
        return 0;
    budget_begin(m);
    int rc = accept_bytes(m, bytes, n);
    if (rc != 0)
        undo(m);
    m->last_work = m->w.work;
    return rc;
}

int gm_matcher_accept_token(struct gm_matcher *m, int32_t id)
{
    const struct gm_vocab *v = m->g->vocab;
    if (cur(m)->done)
        return TG_EDONE;
    if (id < 0 || id >= v->n_ids)
        return TG_EINVAL;
    if (v->kind[id] == GM_TOK_EOS) {
        if (!cur(m)->can_end)
            return TG_EINVAL;
        struct gm_matcher_state st = *cur(m);
        st.done = 1;
        if (tg_grow((void **)&m->hist, &m->cap_hist, m->n_hist + 1,
                    sizeof(*m->hist)))
            return TG_ENOMEM;
        m->hist[m->n_hist++] = st;
        return 0;
    }
    size_t len;
    const uint8_t *b = gm_vocab_token(v, id, &len);
    if (b == NULL)
        return TG_EINVAL;
    return gm_matcher_accept_bytes(m, b, len);
}

int gm_matcher_rollback(struct gm_matcher *m, size_t n)
{
    if (n >= m->n_hist)
        return TG_ERANGE;
    m->n_hist -= n;
    undo(m);
    return 0;
}

size_t gm_matcher_n_accepted(const struct gm_matcher *m)
{
    return m->n_hist - 1;
}

int gm_matcher_can_end(const struct gm_matcher *m)
{
    return cur(m)->can_end;
}

int gm_matcher_is_finished(const struct gm_matcher *m)
{
    const struct gm_matcher_state *s = cur(m);
    return s->done || (s->can_end && s->nh == 0);
}

uint32_t gm_matcher_min_bytes_left(const struct gm_matcher *m)
{
    const struct gm_matcher_state *s = cur(m);
    const struct gm__pda *p = &m->g->pda;
    if (s->can_end || s->done)
        return 0;
    uint32_t best = UINT32_MAX;
    for (size_t i = 0; i < s->nh; i++) {
        const struct gm__cfg *c = &m->log[s->h0 + i];
        uint32_t need = sat_add(p->minfin[c->node], rest_of(m, c->stk));
        if (need < best)
            best = need;
    }
    return best;
}

static void set_eos(const struct gm_vocab *v, uint32_t *mask)
{
    for (int i = 0; i < v->n_eos; i++)
        mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
}

/* Walks the suffix trie of class `sig` from the configurations that
 * vertex `stack` returns to, setting the tokens whose suffix is
 * accepted. */
static int walk_suffixes(struct gm_matcher *m, const struct gm__tcache *tc,
                         int32_t stack, uint32_t *mask)
{
    const struct gm_grammar *g = m->g;
    const struct gm__vtx *v = &m->gss.v[stack];
    if (tg_grow((void **)&m->tmp, &m->cap_tmp, (size_t)v->nl + 1,
                sizeof(*m->tmp)))
        return TG_ENOMEM;
    for (int32_t l = 0; l < v->nl; l++)
        m->tmp[l] = (struct gm__cfg){.node = m->gss.l[v->l0 + l].ret,
                                     .stk = m->gss.l[v->l0 + l].parent};
    int rc = gm__walk_start(&m->w, m->tmp, (size_t)v->nl, &m->gss);
    if (rc != 0)
        return rc;
    int32_t end = tc->sfx0 + tc->n_sfx;
    for (int32_t i = tc->sfx0; i < end;) {
        const struct gm__sfx *x = &g->sfx[i];
        int alive = gm__walk_step(&m->w, x->depth - 1, x->byte);
        if (alive < 0)
            return alive;
        if (!alive) {
            i = x->end;
            continue;
        }
        for (uint32_t k = x->tok0; k < x->tok1; k++) {
            int32_t id = g->sfx_ids[k];
            mask[id >> 5] |= 1u << (id & 31);
        }
        i++;
    }
    return 0;
}

static int by_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Checks the row size and clears it; TG_EDONE once EOS was accepted. */
static int mask_begin(const struct gm_matcher *m, uint32_t *mask,
                      size_t n_words)
{
    if (n_words < gm_vocab_mask_words(m->g->vocab))
        return TG_EINVAL;
    memset(mask, 0, n_words * sizeof(*mask));
    return cur(m)->done ? TG_EDONE : 0;
}

/* The work of ORing class sig's accepted tokens: 1 + a unit per 16 ids
 * or words. */
static int spend_apply(struct gm_matcher *m, int32_t sig)
{
    const struct gm__tcache *tc = &m->g->tc[sig];
    size_t n = tc->kind == GM__TC_LIST ? tc->n_acc
                                       : gm_vocab_mask_words(m->g->vocab);
    int rc = 0;
    for (size_t u = 0; u <= n / 16 && rc == 0; u++)
        rc = gm__walk_spend(&m->w);
    return rc;
}

static int fill_mask(struct gm_matcher *m, uint32_t *mask)
{
    const struct gm_grammar *g = m->g;
    const struct gm_matcher_state *s = cur(m);
    /* one pass per distinct (class, stack): equal classes give equal
     * masks for equal stacks */
    if (tg_grow((void **)&m->pairs, &m->cap_pairs, s->nh + 1,
                sizeof(*m->pairs)))
        return TG_ENOMEM;
    for (size_t i = 0; i < s->nh; i++) {
        const struct gm__cfg *c = &m->log[s->h0 + i];
        m->pairs[i] = (int64_t)g->pda.sig[c->node] << 32 |
                      (uint32_t)(c->stk - GM__EMPTY);
    }
    if (s->nh > 1)
        qsort(m->pairs, s->nh, sizeof(*m->pairs), by_i64);
    for (size_t i = 0; i < s->nh; i++) {
        if (i > 0 && m->pairs[i] == m->pairs[i - 1])
            continue;
        int32_t sig = (int32_t)(m->pairs[i] >> 32);
        int32_t stack = (int32_t)(uint32_t)m->pairs[i] + GM__EMPTY;
        int rc = spend_apply(m, sig);
        if (rc != 0)
            return rc;
        gm__tcache_apply(g, sig, mask);
        const struct gm__tcache *tc = &g->tc[sig];
        if (tc->n_sfx > 0 && stack != GM__EMPTY &&
            (rc = walk_suffixes(m, tc, stack, mask)) != 0)
            return rc;
    }
    if (s->can_end)
        set_eos(g->vocab, mask);
    return 0;
}

int gm_matcher_fill_mask(struct gm_matcher *m, uint32_t *mask, size_t n_words)
{
    int rc = mask_begin(m, mask, n_words);
    if (rc != 0)
        return rc;
    budget_begin(m);
    rc = fill_mask(m, mask);
    m->last_work = m->w.work;
    return rc;
}

int gm_matcher_fill_mask_naive(struct gm_matcher *m, uint32_t *mask,
                               size_t n_words)
{
    const struct gm_vocab *v = m->g->vocab;
    int rc0 = mask_begin(m, mask, n_words);
    if (rc0 != 0)
        return rc0;
    const struct gm_matcher_state *s = cur(m);
    m->w.naive = 1;
    m->w.work = 0;
    m->w.work_limit = 0; /* the oracle is for tests: no budget */
    m->w.deadline = 0;
    int rc = gm__walk_start(&m->w, m->log + s->h0, s->nh, &m->gss);
    for (int32_t id = 0; id < v->n_ids && rc == 0; id++) {
        if (v->kind[id] != GM_TOK_NORMAL)
            continue;
        size_t len = v->off[id + 1] - v->off[id];
        const uint8_t *b = v->bytes + v->off[id];
        int alive = 1;
        for (size_t k = 0; k < len && alive > 0; k++)
            alive = gm__walk_step(&m->w, (int)k, b[k]);
        if (alive < 0)
            rc = alive;
        else if (alive)
            mask[id >> 5] |= 1u << (id & 31);
    }
    m->w.naive = 0;
    if (rc == 0 && s->can_end)
        set_eos(v, mask);
    return rc;
}
