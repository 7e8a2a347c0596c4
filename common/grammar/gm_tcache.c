/* gm_tcache.c — the token-mask cache of every node class (gm_internal.h).
 *
 * For a class, one of its nodes u is walked over the vocabulary trie with
 * the stack below u's rule unknown (base GM__BOUNDARY):
 *   - a token whose bytes keep some configuration alive is accepted
 *     whatever the stack below ("context-independent");
 *   - a token that dies, after some configuration left u's rule at byte
 *     k >= 1 (the rule ended there) with token[k] among the bytes that
 *     may follow the rule anywhere (FOLLOW), is "uncertain": it is kept
 *     with its suffix token[k..], decided per step by walking the suffix
 *     from the configurations the real stack pops to;
 *   - any other token is rejected.
 * A rule ending at byte 0 is not recorded: the matcher keeps the
 * configuration the rule returns to as a head of its own (gm_matcher.c),
 * so its tokens are that head's.
 * A rejected prefix skips its whole trie subtree; a prefix after which
 * nothing survives inside the rule but an earlier exit is live makes its
 * whole subtree uncertain at once. The idea and the names are XGrammar's
 * (Dong et al., "XGrammar: Flexible and Efficient Structured Generation
 * Engine for Large Language Models", 2024, §3.1-3.2: adaptive token mask
 * cache, context expansion); the suffix trie is ours. */
#include "common/grammar/gm_internal.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

#define LIST_MAX 2048 /* accepted sets above this are stored as bitmaps */

struct unc {
    int32_t tok;
    uint16_t k; /* the suffix starts at token byte k */
};

/* One thread's scratch. */
struct scratch {
    struct gm__walker w;
    int32_t *acc;
    size_t n_acc, cap_acc;
    struct unc *unc;
    size_t n_unc, cap_unc;
    int32_t *pk;     /* live exits on the current path */
    int32_t *pcount; /* (max_len + 1) live exits for the node at depth d */
};

/* One class's cache before it is merged into the grammar's pools: the
 * accepted tokens (a sorted id list, or a bitmap when long), the raw
 * uncertain entries (kept for the classes that take this one as donor),
 * and the suffix trie built from them, whose `end` and token ranges are
 * relative to its own arrays. */
struct cres {
    uint8_t kind;
    uint32_t n_acc;
    void *acc; /* LIST: int32 ids; BITMAP: mask words */
    struct unc *unc;
    size_t n_unc;
    struct gm__sfx *sfx;
    size_t n_sfx, cap_sfx;
    int32_t *ids;
    size_t n_ids, cap_ids;
};


static int has_byte(const uint8_t *set, uint8_t b)
{
    return (set[b >> 3] >> (b & 7)) & 1;
}

/* Walks the vocabulary trie from node u; fills s->acc and s->unc with
 * the tokens of at least `skip` bytes (the shorter ones come from the
 * class's donor: subtrees without a token that long are not entered). */
static int walk_class(const struct gm_grammar *g, struct scratch *s,
                      int32_t u, int skip, double deadline)
{
    const struct gm_vocab *v = g->vocab;
    const struct gm__pda *p = &g->pda;
    struct gm__walker *w = &s->w;
    const uint8_t *follow = p->follow[p->node[u].rule];
    struct gm__cfg c0 = {.node = u, .stk = GM__BOUNDARY};
    s->n_acc = s->n_unc = 0;
    if (gm__walk_start(w, &c0, 1, NULL) != 0)
        return TG_ENOMEM;
    s->pcount[0] = 0;
    w->flags[0] &= (uint8_t)~GM__POPPED; /* exits at byte 0: not ours */
    for (int32_t i = 1; i < v->n_node;) {
        if ((i & 0xffff) == 0 && deadline > 0 && gm__now() > deadline)
            return TG_ETIMEDOUT;
        if (v->t_maxlen[i] < skip) {
            i = v->t_end[i];
            continue;
        }
        int d = v->t_depth[i];
        uint8_t b = v->t_byte[i];
        int32_t np = s->pcount[d - 1];
        if ((w->flags[d - 1] & GM__POPPED) && has_byte(follow, b))
            s->pk[np++] = d - 1;
        s->pcount[d] = np;
        int alive = gm__walk_step(w, d - 1, b);
        if (alive < 0)
            return alive;
        int32_t t0 = v->t_first[i];
        if (!alive) {
            int32_t t1 = v->t_first[v->t_end[i]];
            if (np > 0) {
                if (tg_grow((void **)&s->unc, &s->cap_unc,
                            s->n_unc + (size_t)(t1 - t0) * (size_t)np,
                            sizeof(*s->unc)))
                    return TG_ENOMEM;
                for (int32_t t = t0; t < t1; t++) {
                    int32_t id = v->sorted[t];
                    if ((int)(v->off[id + 1] - v->off[id]) < skip)
                        continue;
                    for (int32_t q = 0; q < np; q++)
                        s->unc[s->n_unc++] =
                            (struct unc){.tok = id, .k = (uint16_t)s->pk[q]};
                }
            }
            i = v->t_end[i];
            continue;
        }
        int32_t t1 = v->t_first[i + 1];
        if (t1 > t0 && d >= skip) {
            if (tg_grow((void **)&s->acc, &s->cap_acc,
                        s->n_acc + (size_t)(t1 - t0), sizeof(*s->acc)))
                return TG_ENOMEM;
            for (int32_t t = t0; t < t1; t++)
                s->acc[s->n_acc++] = v->sorted[t];
        }
        i++;
    }
    return 0;
}

static int by_id(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* qsort has no context argument: the comparator reads this (one per
 * thread). */
static _Thread_local const struct gm_vocab *sort_v;

static int by_suffix(const void *a, const void *b)
{
    const struct unc *x = a, *y = b;
    const struct gm_vocab *v = sort_v;
    const uint8_t *px = v->bytes + v->off[x->tok] + x->k;
    const uint8_t *py = v->bytes + v->off[y->tok] + y->k;
    size_t lx = v->off[x->tok + 1] - v->off[x->tok] - x->k;
    size_t ly = v->off[y->tok + 1] - v->off[y->tok] - y->k;
    int c = memcmp(px, py, lx < ly ? lx : ly);
    if (c != 0)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x->tok < y->tok ? -1 : x->tok > y->tok;
}

/* The suffix trie of r->unc (sorted here) into r, in preorder. */
static int build_sfx(const struct gm_vocab *v, struct cres *r)
{
    if (r->n_unc == 0)
        return 0;
    sort_v = v;
    qsort(r->unc, r->n_unc, sizeof(*r->unc), by_suffix);
    int32_t path[GM_TOKEN_MAX_BYTES + 1];
    int depth = 0;
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (size_t i = 0; i < r->n_unc; i++) {
        const struct unc *u = &r->unc[i];
        const uint8_t *b = v->bytes + v->off[u->tok] + u->k;
        size_t len = v->off[u->tok + 1] - v->off[u->tok] - u->k;
        size_t lcp = 0;
        while (prev != NULL && lcp < len && lcp < prev_len && b[lcp] == prev[lcp])
            lcp++;
        while (depth > (int)lcp)
            r->sfx[path[depth--]].end = (int32_t)r->n_sfx;
        if (tg_grow((void **)&r->sfx, &r->cap_sfx, r->n_sfx + (len - lcp),
                    sizeof(*r->sfx)) ||
            tg_grow((void **)&r->ids, &r->cap_ids, r->n_ids + 1,
                    sizeof(*r->ids)))
            return TG_ENOMEM;
        for (size_t d = lcp; d < len; d++) {
            r->sfx[r->n_sfx] = (struct gm__sfx){.byte = b[d],
                                                .depth = (uint16_t)(d + 1),
                                                .tok0 = (uint32_t)r->n_ids,
                                                .tok1 = (uint32_t)r->n_ids};
            path[++depth] = (int32_t)r->n_sfx++;
        }
        /* the token ends at the deepest node of the path (a token with
         * several exits appears once per exit, each a different suffix) */
        r->ids[r->n_ids++] = u->tok;
        r->sfx[path[depth]].tok1 = (uint32_t)r->n_ids;
        prev = b;
        prev_len = len;
    }
    while (depth > 0)
        r->sfx[path[depth--]].end = (int32_t)r->n_sfx;
    return 0;
}

static size_t token_len(const struct gm_vocab *v, int32_t id)
{
    return v->off[id + 1] - v->off[id];
}

/* The cache of a class from its walk (s) and, with a donor, the donor's
 * decisions on the tokens shorter than `skip` bytes (lt: the bitmap of
 * the normal tokens that short). */
static int take_walk(const struct gm_vocab *v, struct scratch *s,
                     const struct cres *donor, int skip, const uint32_t *lt,
                     struct cres *r)
{
    size_t words = gm_vocab_mask_words(v);
    size_t n_d = 0, n_du = 0;
    if (donor != NULL) {
        if (donor->kind == GM__TC_LIST) {
            const int32_t *ids = donor->acc;
            for (uint32_t i = 0; i < donor->n_acc; i++)
                n_d += token_len(v, ids[i]) < (size_t)skip;
        } else {
            const uint32_t *m = donor->acc;
            for (size_t i = 0; i < words; i++)
                n_d += (size_t)__builtin_popcount(m[i] & lt[i]);
        }
        for (size_t i = 0; i < donor->n_unc; i++)
            n_du += token_len(v, donor->unc[i].tok) < (size_t)skip;
    }
    size_t total = n_d + s->n_acc;
    r->n_acc = (uint32_t)total;
    if (total <= LIST_MAX) {
        int32_t *ids = malloc((total ? total : 1) * sizeof(*ids));
        if (ids == NULL)
            return TG_ENOMEM;
        size_t k = 0;
        if (donor != NULL && donor->kind == GM__TC_LIST) {
            const int32_t *d = donor->acc;
            for (uint32_t i = 0; i < donor->n_acc; i++)
                if (token_len(v, d[i]) < (size_t)skip)
                    ids[k++] = d[i];
        } else if (donor != NULL) {
            const uint32_t *m = donor->acc;
            for (size_t i = 0; i < words; i++)
                for (uint32_t w = m[i] & lt[i]; w != 0; w &= w - 1)
                    ids[k++] = (int32_t)(i * 32 + (size_t)__builtin_ctz(w));
        }
        if (s->n_acc > 0)
            memcpy(ids + k, s->acc, s->n_acc * sizeof(*ids));
        qsort(ids, total, sizeof(*ids), by_id);
        r->kind = GM__TC_LIST;
        r->acc = ids;
    } else {
        uint32_t *m = calloc(words, sizeof(*m));
        if (m == NULL)
            return TG_ENOMEM;
        if (donor != NULL && donor->kind == GM__TC_LIST) {
            const int32_t *d = donor->acc;
            for (uint32_t i = 0; i < donor->n_acc; i++)
                if (token_len(v, d[i]) < (size_t)skip)
                    m[d[i] >> 5] |= 1u << (d[i] & 31);
        } else if (donor != NULL) {
            const uint32_t *dm = donor->acc;
            for (size_t i = 0; i < words; i++)
                m[i] = dm[i] & lt[i];
        }
        for (size_t i = 0; i < s->n_acc; i++)
            m[s->acc[i] >> 5] |= 1u << (s->acc[i] & 31);
        r->kind = GM__TC_BITMAP;
        r->acc = m;
    }
    r->n_unc = n_du + s->n_unc;
    r->unc = malloc((r->n_unc ? r->n_unc : 1) * sizeof(*r->unc));
    if (r->unc == NULL)
        return TG_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; donor != NULL && i < donor->n_unc; i++)
        if (token_len(v, donor->unc[i].tok) < (size_t)skip)
            r->unc[k++] = donor->unc[i];
    if (s->n_unc > 0)
        memcpy(r->unc + k, s->unc, s->n_unc * sizeof(*s->unc));
    return 0;
}

/* Appends the per-class results to the grammar's pools, in class order. */
static int merge(struct gm_grammar *g, struct cres *res, int32_t n)
{
    size_t words = gm_vocab_mask_words(g->vocab);
    size_t n_ids = 0, n_words = 0, n_sfx = 0, n_sfx_ids = 0;
    for (int32_t c = 0; c < n; c++) {
        if (res[c].kind == GM__TC_LIST)
            n_ids += res[c].n_acc;
        else
            n_words += words;
        n_sfx += res[c].n_sfx;
        n_sfx_ids += res[c].n_ids;
    }
    g->tc_ids = malloc((n_ids ? n_ids : 1) * sizeof(*g->tc_ids));
    g->tc_words = malloc((n_words ? n_words : 1) * sizeof(*g->tc_words));
    g->sfx = malloc((n_sfx ? n_sfx : 1) * sizeof(*g->sfx));
    g->sfx_ids = malloc((n_sfx_ids ? n_sfx_ids : 1) * sizeof(*g->sfx_ids));
    if (g->tc_ids == NULL || g->tc_words == NULL || g->sfx == NULL ||
        g->sfx_ids == NULL)
        return TG_ENOMEM;
    for (int32_t c = 0; c < n; c++) {
        struct cres *r = &res[c];
        struct gm__tcache *tc = &g->tc[c];
        tc->kind = r->kind;
        tc->n_acc = r->n_acc;
        if (r->kind == GM__TC_LIST) {
            tc->acc = g->n_tc_ids;
            memcpy(g->tc_ids + g->n_tc_ids, r->acc, r->n_acc * sizeof(int32_t));
            g->n_tc_ids += r->n_acc;
        } else {
            tc->acc = g->n_tc_words;
            memcpy(g->tc_words + g->n_tc_words, r->acc, words * sizeof(uint32_t));
            g->n_tc_words += words;
        }
        tc->sfx0 = (int32_t)g->n_sfx;
        tc->n_sfx = (int32_t)r->n_sfx;
        for (size_t i = 0; i < r->n_sfx; i++) {
            struct gm__sfx x = r->sfx[i];
            x.end += tc->sfx0;
            x.tok0 += (uint32_t)g->n_sfx_ids;
            x.tok1 += (uint32_t)g->n_sfx_ids;
            g->sfx[g->n_sfx++] = x;
        }
        if (r->n_ids > 0)
            memcpy(g->sfx_ids + g->n_sfx_ids, r->ids, r->n_ids * sizeof(int32_t));
        g->n_sfx_ids += r->n_ids;
    }
    return 0;
}

static void cres_free(struct cres *r)
{
    free(r->acc);
    free(r->unc);
    free(r->sfx);
    free(r->ids);
}

/* The normal tokens shorter than `skip` bytes, as a mask (new). */
static uint32_t *shorter_than(const struct gm_vocab *v, int skip)
{
    uint32_t *m = calloc(gm_vocab_mask_words(v), sizeof(*m));
    if (m == NULL)
        return NULL;
    for (int32_t id = 0; id < v->n_ids; id++)
        if (v->kind[id] == GM_TOK_NORMAL && token_len(v, id) < (size_t)skip)
            m[id >> 5] |= 1u << (id & 31);
    return m;
}

/* The memory a class's cache will take (its raw entries included: they
 * live as long as the build). */
static size_t cres_bytes(const struct gm_vocab *v, const struct cres *r)
{
    size_t acc = r->kind == GM__TC_LIST ? r->n_acc * sizeof(int32_t)
                                        : gm_vocab_mask_words(v) * 4;
    return acc + r->n_unc * (sizeof(struct unc) + sizeof(struct gm__sfx) +
                             sizeof(int32_t));
}

int gm__tcache_build(struct gm_grammar *g, double deadline, int threads,
                     size_t max_bytes, char *err, size_t errlen)
{
    const struct gm__pda *p = &g->pda;
    const struct gm_vocab *v = g->vocab;
    int max_depth = v->max_len > 0 ? v->max_len : 1;
    int32_t n = p->n_sig;
    size_t total = 0; /* bytes of the caches so far */
    int32_t *rep = malloc((size_t)n * sizeof(*rep));
    int32_t *wave = malloc((size_t)n * sizeof(*wave));
    int32_t *order = malloc((size_t)n * sizeof(*order));
    struct cres *res = calloc((size_t)n, sizeof(*res));
    uint32_t **lt = calloc((size_t)max_depth + 2, sizeof(*lt));
    g->tc = calloc((size_t)n, sizeof(*g->tc));
    int rc = 0;
    if (rep == NULL || wave == NULL || order == NULL || res == NULL ||
        lt == NULL || g->tc == NULL) {
        rc = TG_ENOMEM;
        goto out;
    }
    for (int32_t c = 0; c < n; c++)
        rep[c] = -1;
    for (int32_t u = 0; u < p->n_node; u++)
        if (rep[p->sig[u]] < 0)
            rep[p->sig[u]] = u;
    /* A class is computed after its donor (donors have smaller ids):
     * wave 0 walks the whole trie, wave k copies from wave k - 1. */
    int32_t n_waves = 1;
    for (int32_t c = 0; c < n && rc == 0; c++) {
        int32_t d = p->sig_donor[c];
        int skip = p->sig_skip[c];
        wave[c] = d >= 0 && skip <= max_depth ? wave[d] + 1 : 0;
        if (wave[c] + 1 > n_waves)
            n_waves = wave[c] + 1;
        if (wave[c] > 0 && lt[skip] == NULL && (lt[skip] = shorter_than(v, skip)) == NULL)
            rc = TG_ENOMEM;
    }
    if (rc != 0)
        goto out;
    {
        /* order: classes by wave (counting sort); wave k is
         * order[first[k] .. first[k + 1]) */
        int32_t *first = calloc((size_t)n_waves + 1, sizeof(*first));
        if (first == NULL) {
            rc = TG_ENOMEM;
            goto out;
        }
        for (int32_t c = 0; c < n; c++)
            first[wave[c] + 1]++;
        for (int32_t k = 0; k < n_waves; k++)
            first[k + 1] += first[k];
        int32_t *at = malloc((size_t)n_waves * sizeof(*at));
        if (at == NULL) {
            free(first);
            rc = TG_ENOMEM;
            goto out;
        }
        memcpy(at, first, (size_t)n_waves * sizeof(*at));
        for (int32_t c = 0; c < n; c++)
            order[at[wave[c]]++] = c;
        free(at);
        if (threads <= 0)
            threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
        {
            struct scratch s;
            memset(&s, 0, sizeof s);
            s.pk = malloc(((size_t)max_depth + 1) * sizeof(*s.pk));
            s.pcount = malloc(((size_t)max_depth + 1) * sizeof(*s.pcount));
            int mine = s.pk == NULL || s.pcount == NULL ||
                               gm__walk_init(&s.w, p, max_depth) != 0
                           ? TG_ENOMEM
                           : 0;
            for (int32_t k = 0; k < n_waves; k++) {
#pragma omp for schedule(dynamic, 1)
                for (int32_t i = first[k]; i < first[k + 1]; i++) {
                    int32_t c = order[i];
                    int failed;
#pragma omp atomic read
                    failed = rc;
                    if (mine != 0 || failed != 0 || rep[c] < 0)
                        continue;
                    if (deadline > 0 && gm__now() > deadline)
                        mine = TG_ETIMEDOUT;
                    int skip = wave[c] > 0 ? p->sig_skip[c] : 0;
                    if (mine == 0)
                        mine = walk_class(g, &s, rep[c], skip, deadline);
                    if (mine == 0)
                        mine = take_walk(v, &s,
                                         wave[c] > 0 ? &res[p->sig_donor[c]]
                                                     : NULL,
                                         skip, lt[skip], &res[c]);
                    if (mine == 0) {
                        size_t now, add = cres_bytes(v, &res[c]);
#pragma omp atomic capture
                        now = total += add;
                        if (max_bytes != 0 && now > max_bytes)
                            mine = TG_ETOOBIG;
                    }
                    if (mine != 0) {
#pragma omp atomic write
                        rc = mine;
                    }
                }
            }
#pragma omp for schedule(dynamic, 1)
            for (int32_t c = 0; c < n; c++) {
                int failed;
#pragma omp atomic read
                failed = rc;
                if (mine == 0 && failed == 0)
                    mine = build_sfx(v, &res[c]);
            }
            if (mine != 0) {
#pragma omp atomic write
                rc = mine;
            }
            gm__walk_free(&s.w);
            free(s.acc);
            free(s.unc);
            free(s.pk);
            free(s.pcount);
        }
        free(first);
    }
    if (rc == 0)
        rc = merge(g, res, n);
out:
    if (res != NULL)
        for (int32_t c = 0; c < n; c++)
            cres_free(&res[c]);
    if (lt != NULL)
        for (int d = 0; d <= max_depth + 1; d++)
            free(lt[d]);
    free(lt);
    free(res);
    free(rep);
    free(wave);
    free(order);
    if (rc == TG_ETIMEDOUT)
        return tg_err_set(err, errlen, rc,
                          "grammar compile took longer than its time limit");
    if (rc == TG_ETOOBIG)
        return tg_err_set(err, errlen, rc,
                          "grammar's token-mask caches are over the limit of "
                          "%zu MiB",
                          max_bytes >> 20);
    if (rc != 0)
        return tg_err_set(err, errlen, rc, "grammar: out of memory");
    g->stats.n_uncertain = g->n_sfx;
    g->stats.cache_bytes = g->n_tc_ids * sizeof(*g->tc_ids) +
                           g->n_tc_words * sizeof(*g->tc_words) +
                           g->n_sfx * sizeof(*g->sfx) +
                           g->n_sfx_ids * sizeof(*g->sfx_ids) +
                           (size_t)n * sizeof(*g->tc);
    return 0;
}

void gm__tcache_apply(const struct gm_grammar *g, int32_t sig, uint32_t *mask)
{
    const struct gm__tcache *tc = &g->tc[sig];
    if (tc->kind == GM__TC_LIST) {
        const int32_t *ids = g->tc_ids + tc->acc;
        for (uint32_t i = 0; i < tc->n_acc; i++)
            mask[ids[i] >> 5] |= 1u << (ids[i] & 31);
        return;
    }
    const uint32_t *m = g->tc_words + tc->acc;
    size_t words = gm_vocab_mask_words(g->vocab);
    for (size_t i = 0; i < words; i++)
        mask[i] |= m[i];
}
