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
    return x->base < y->base ? -1 : x->base > y->base;
}

/* Turns the configurations m->tmp[0..n_tmp) (local frames already moved
 * to m->frames) into the heads of a new state appended to the history:
 * a configuration at the end of its rule is replaced by the one its stack
 * returns to (and kept too when it can read on); the document end sets
 * can_end. */
static int push_state(struct gm_matcher *m)
{
    const struct gm__pda *p = &m->g->pda;
    size_t h0 = m->n_log;
    uint8_t can_end = 0;
    for (size_t i = 0; i < m->n_tmp; i++) {
        struct gm__cfg c = m->tmp[i];
        const struct gm__node *n = &p->node[c.node];
        if (n->final) {
            if (c.base == GM__EMPTY) {
                can_end = 1;
            } else {
                const struct gm__frame *f = &m->frames.f[c.base];
                if (tg_grow((void **)&m->tmp, &m->cap_tmp, m->n_tmp + 1,
                            sizeof(*m->tmp)))
                    return TG_ENOMEM;
                m->tmp[m->n_tmp++] = (struct gm__cfg){
                    .node = f->ret, .local = GM__EMPTY, .base = f->parent};
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
    if (nh > 1) {
        qsort(m->log + h0, nh, sizeof(*m->log), by_cfg);
        size_t k = 1;
        for (size_t i = 1; i < nh; i++)
            if (by_cfg(&m->log[h0 + i], &m->log[h0 + k - 1]) != 0)
                m->log[h0 + k++] = m->log[h0 + i];
        nh = k;
        m->n_log = h0 + nh;
    }
    if (tg_grow((void **)&m->hist, &m->cap_hist, m->n_hist + 1,
                sizeof(*m->hist)))
        return TG_ENOMEM;
    m->hist[m->n_hist++] = (struct gm_matcher_state){
        .h0 = h0, .nh = nh, .can_end = can_end, .done = 0};
    return 0;
}

static int start_state(struct gm_matcher *m)
{
    m->n_log = m->n_hist = 0;
    gm__frames_clear(&m->frames);
    m->n_tmp = 0;
    if (tg_grow((void **)&m->tmp, &m->cap_tmp, 1, sizeof(*m->tmp)))
        return TG_ENOMEM;
    m->tmp[m->n_tmp++] = (struct gm__cfg){
        .node = m->g->pda.start, .local = GM__EMPTY, .base = GM__EMPTY};
    return push_state(m);
}

int gm_matcher_init(struct gm_matcher *m, struct gm_grammar *g)
{
    memset(m, 0, sizeof(*m));
    m->g = gm_grammar_ref(g);
    int max_depth = g->vocab->max_len > 0 ? g->vocab->max_len : 1;
    if (gm__walk_init(&m->w, &g->pda, max_depth) != 0 ||
        start_state(m) != 0) {
        gm_matcher_free(m);
        return TG_ENOMEM;
    }
    return 0;
}

void gm_matcher_free(struct gm_matcher *m)
{
    gm__frames_free(&m->frames);
    gm__walk_free(&m->w);
    free(m->log);
    free(m->hist);
    free(m->tmp);
    free(m->pairs);
    free(m->chain);
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
    int max_depth = src->g->vocab->max_len > 0 ? src->g->vocab->max_len : 1;
    if (gm__walk_init(&d.w, &src->g->pda, max_depth) != 0 ||
        gm__frames_copy(&d.frames, &src->frames) != 0 ||
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

/* The real stack of walker config c: its local frames pushed on its base,
 * bottom first; a negative code when out of memory. */
static int32_t real_stack(struct gm_matcher *m, const struct gm__cfg *c)
{
    size_t n = 0;
    for (int32_t x = c->local; x != GM__EMPTY; x = m->w.local.f[x].parent)
        n++;
    if (tg_grow((void **)&m->chain, &m->cap_chain, n + 1, sizeof(*m->chain)))
        return TG_ENOMEM;
    n = 0;
    for (int32_t x = c->local; x != GM__EMPTY; x = m->w.local.f[x].parent)
        m->chain[n++] = x;
    int32_t base = c->base;
    while (n-- > 0) {
        base = gm__frames_push(&m->frames, m->w.local.f[m->chain[n]].ret, base);
        if (base < 0)
            return TG_ENOMEM;
    }
    return base;
}

/* Moves the kernel of walker set d into m->tmp as real configurations. */
static int take_kernel(struct gm_matcher *m, int d)
{
    size_t k0 = m->w.off[d], k1 = k0 + m->w.kern[d];
    m->n_tmp = 0;
    if (tg_grow((void **)&m->tmp, &m->cap_tmp, k1 - k0 + 1, sizeof(*m->tmp)))
        return TG_ENOMEM;
    for (size_t i = k0; i < k1; i++) {
        struct gm__cfg c = m->w.cfg[i];
        int32_t s = real_stack(m, &c);
        if (s < GM__EMPTY)
            return TG_ENOMEM;
        m->tmp[m->n_tmp++] =
            (struct gm__cfg){.node = c.node, .local = GM__EMPTY, .base = s};
    }
    return 0;
}

int gm_matcher_accept_bytes(struct gm_matcher *m, const void *bytes, size_t n)
{
    const uint8_t *b = bytes;
    if (cur(m)->done)
        return TG_EDONE;
    if (n == 0)
        return 0;
    const struct gm_matcher_state *s = cur(m);
    if (gm__walk_start(&m->w, m->log + s->h0, s->nh, &m->frames) != 0)
        return TG_ENOMEM;
    int d = 0;
    for (size_t i = 0; i < n; i++) {
        if (d == m->w.max_depth) {
            /* a long byte string: restart the walker from the kernel */
            if (take_kernel(m, d) != 0 ||
                gm__walk_start(&m->w, m->tmp, m->n_tmp, &m->frames) != 0)
                return TG_ENOMEM;
            d = 0;
        }
        int alive = gm__walk_step(&m->w, d, b[i]);
        if (alive < 0)
            return alive;
        if (!alive)
            return TG_EINVAL;
        d++;
    }
    if (take_kernel(m, d) != 0)
        return TG_ENOMEM;
    return push_state(m);
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
    m->n_log = cur(m)->h0 + cur(m)->nh;
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
    uint64_t best = UINT32_MAX;
    for (size_t i = 0; i < s->nh; i++) {
        const struct gm__cfg *c = &m->log[s->h0 + i];
        uint64_t need = p->minfin[c->node];
        for (int32_t f = c->base; f != GM__EMPTY && need < best;
             f = m->frames.f[f].parent)
            need += p->minfin[m->frames.f[f].ret];
        if (need < best)
            best = need;
    }
    return (uint32_t)best;
}

static void set_eos(const struct gm_vocab *v, uint32_t *mask)
{
    for (int i = 0; i < v->n_eos; i++)
        mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
}

/* Walks the suffix trie of class `sig` from the configurations that
 * `stack` returns to, setting the tokens whose suffix is accepted. */
static int walk_suffixes(struct gm_matcher *m, const struct gm__tcache *tc,
                         int32_t stack, uint32_t *mask)
{
    const struct gm_grammar *g = m->g;
    const struct gm__frame *f = &m->frames.f[stack];
    struct gm__cfg c = {.node = f->ret, .local = GM__EMPTY, .base = f->parent};
    if (gm__walk_start(&m->w, &c, 1, &m->frames) != 0)
        return TG_ENOMEM;
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

int gm_matcher_fill_mask(struct gm_matcher *m, uint32_t *mask, size_t n_words)
{
    const struct gm_grammar *g = m->g;
    const struct gm_vocab *v = g->vocab;
    int rc0 = mask_begin(m, mask, n_words);
    if (rc0 != 0)
        return rc0;
    const struct gm_matcher_state *s = cur(m);
    /* one pass per distinct (class, stack): equal classes give equal
     * masks for equal stacks */
    if (tg_grow((void **)&m->pairs, &m->cap_pairs, s->nh + 1,
                sizeof(*m->pairs)))
        return TG_ENOMEM;
    for (size_t i = 0; i < s->nh; i++) {
        const struct gm__cfg *c = &m->log[s->h0 + i];
        m->pairs[i] = (int64_t)g->pda.sig[c->node] << 32 |
                      (uint32_t)(c->base - GM__EMPTY);
    }
    if (s->nh > 1)
        qsort(m->pairs, s->nh, sizeof(*m->pairs), by_i64);
    for (size_t i = 0; i < s->nh; i++) {
        if (i > 0 && m->pairs[i] == m->pairs[i - 1])
            continue;
        int32_t sig = (int32_t)(m->pairs[i] >> 32);
        int32_t stack = (int32_t)(uint32_t)m->pairs[i] + GM__EMPTY;
        gm__tcache_apply(g, sig, mask);
        const struct gm__tcache *tc = &g->tc[sig];
        if (tc->n_sfx > 0 && stack != GM__EMPTY) {
            int rc = walk_suffixes(m, tc, stack, mask);
            if (rc != 0)
                return rc;
        }
    }
    if (s->can_end)
        set_eos(v, mask);
    return 0;
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
    int rc = gm__walk_start(&m->w, m->log + s->h0, s->nh, &m->frames);
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
