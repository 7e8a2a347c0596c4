/* gm_regex_dfa.c — the DFA of a term by derivatives over the classes of
 * code points its derivative cannot tell apart, dead states removed,
 * minimised by Moore's partition refinement (gm_regex_internal.h). */
#include "common/grammar/gm_regex_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

#define DERIV_MEMO_MAX (1u << 20) /* derivatives remembered (~24 MiB) */

struct bld {
    struct gm__rx *rx;
    int32_t *term; /* (n) state -> term */
    uint8_t *ctx;  /* (n) state -> context before it */
    size_t n, cap, cap_ctx;
    struct gm__kset states; /* (term, ctx) -> state */
    struct gm__rx_tr *tr;   /* transitions of states 0.., in order */
    size_t n_tr, cap_tr;
    size_t *t0; /* (n + 1) */
    size_t cap_t0;
    uint8_t *acc;
    size_t cap_acc;
    /* scratch of one state */
    uint32_t *vis; /* (terms) visit stamps */
    size_t cap_vis;
    uint32_t stamp;
    uint32_t *setvis; /* (sets) */
    size_t cap_setvis;
    int32_t *stk, *sets;
    size_t n_stk, cap_stk, n_sets, cap_sets;
    uint32_t *bnd; /* boundaries */
    size_t n_bnd, cap_bnd;
    uint64_t *sig; /* (intervals x words) signatures */
    size_t cap_sig;
    size_t *ord;
    size_t cap_ord;
    int32_t *tgt;
    size_t cap_tgt;
    uint32_t (*iv)[2]; /* intervals */
    size_t cap_iv;
    int32_t word; /* set index of \w, or -1 */
};

static int bfail(struct gm__rx *rx, int code, const char *msg)
{
    if (rx->err == 0) {
        rx->err = code;
        snprintf(rx->errmsg, sizeof rx->errmsg, "%s", msg);
    }
    return rx->err;
}

#define LATE "grammar compile took longer than its time limit"

static int late(const struct gm__rx *rx)
{
    return rx->deadline > 0 && gm__now() > rx->deadline;
}

/* The state of (term, ctx), added when new. */
static int32_t state_of(struct bld *b, int32_t t, int ctx)
{
    struct gm__rx *rx = b->rx;
    int32_t v;
    int rc = gm__kset_put(&b->states, t, ctx, 0, (int32_t)b->n, &v);
    if (rc < 0)
        return bfail(rx, TG_ENOMEM, "out of memory");
    if (rc == 0)
        return v;
    if (b->n >= rx->max_states) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "the pattern needs more than %u automaton states (the "
                 "limit of a pattern)",
                 rx->max_states);
        return bfail(rx, TG_ETOOBIG, msg);
    }
    if (TG_GROW(b->term, &b->cap, b->n + 1) ||
        TG_GROW(b->ctx, &b->cap_ctx, b->n + 1))
        return bfail(rx, TG_ENOMEM, "out of memory");
    b->term[b->n] = t;
    b->ctx[b->n] = (uint8_t)ctx;
    return (int32_t)b->n++;
}

/* Grows a stamp array to `need` entries, the new ones zero. */
static int grow_zero(uint32_t **v, size_t *cap, size_t need)
{
    size_t old = *cap;
    if (TG_GROW(*v, cap, need ? need : 1))
        return TG_ENOMEM;
    if (*cap > old)
        memset(*v + old, 0, (*cap - old) * sizeof(**v));
    return 0;
}

/* The sets a derivative of t reads (Owens et al.'s C(t)), into b->sets. */
static int relevant_sets(struct bld *b, int32_t t)
{
    struct gm__rx *rx = b->rx;
    if (grow_zero(&b->vis, &b->cap_vis, rx->n_t) != 0 ||
        grow_zero(&b->setvis, &b->cap_setvis, rx->n_set) != 0)
        return TG_ENOMEM;
    if (++b->stamp == 0) {
        memset(b->vis, 0, b->cap_vis * sizeof(*b->vis));
        memset(b->setvis, 0, b->cap_setvis * sizeof(*b->setvis));
        b->stamp = 1;
    }
    b->n_sets = 0;
    b->n_stk = 0;
    if (TG_GROW(b->stk, &b->cap_stk, 1))
        return TG_ENOMEM;
    b->stk[b->n_stk++] = t;
    while (b->n_stk > 0) {
        int32_t x = b->stk[--b->n_stk];
        if (b->vis[x] == b->stamp)
            continue;
        b->vis[x] = b->stamp;
        const struct gm__rxt *e = &rx->t[x];
        int32_t kids[2];
        int nk = 0;
        switch (e->kind) {
        case GM__RXT_SET:
            if (b->setvis[e->a] != b->stamp) {
                b->setvis[e->a] = b->stamp;
                if (TG_GROW(b->sets, &b->cap_sets, b->n_sets + 1))
                    return TG_ENOMEM;
                b->sets[b->n_sets++] = e->a;
            }
            break;
        case GM__RXT_CAT:
            kids[nk++] = e->a;
            if (rx->t[e->a].null != 0)
                kids[nk++] = e->b;
            break;
        case GM__RXT_OR:
        case GM__RXT_AND:
            kids[nk++] = e->a;
            kids[nk++] = e->b;
            break;
        case GM__RXT_NOT:
        case GM__RXT_REP: kids[nk++] = e->a; break;
        default: break;
        }
        if (TG_GROW(b->stk, &b->cap_stk, b->n_stk + 2))
            return TG_ENOMEM;
        for (int i = 0; i < nk; i++)
            b->stk[b->n_stk++] = kids[i];
    }
    if (b->word >= 0 && b->setvis[b->word] != b->stamp) {
        if (TG_GROW(b->sets, &b->cap_sets, b->n_sets + 1))
            return TG_ENOMEM;
        b->sets[b->n_sets++] = b->word;
    }
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static _Thread_local const uint64_t *sort_sig;
static _Thread_local size_t sort_words;

static int by_sig(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int c = memcmp(sort_sig + x * sort_words, sort_sig + y * sort_words,
                   sort_words * sizeof(uint64_t));
    if (c != 0)
        return c;
    return x < y ? -1 : x > y;
}

/* The transitions of state s, appended to b->tr. */
static int expand(struct bld *b, int32_t s)
{
    struct gm__rx *rx = b->rx;
    int32_t t = b->term[s];
    int ctx = b->ctx[s];
    /* the derivatives' memo serves the subterms of one state's
     * derivatives; across states it only grows: emptied past a bound */
    if (rx->memo.n > DERIV_MEMO_MAX)
        gm__kset_clear(&rx->memo);
    if (relevant_sets(b, t) != 0)
        return bfail(rx, TG_ENOMEM, "out of memory");
    /* elementary intervals of the alphabet between set boundaries */
    b->n_bnd = 0;
    size_t need = 2 * rx->alpha.n + 2;
    for (size_t i = 0; i < b->n_sets; i++)
        need += 2 * rx->set[b->sets[i]].n;
    if (TG_GROW(b->bnd, &b->cap_bnd, need))
        return bfail(rx, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < rx->alpha.n; i++) {
        b->bnd[b->n_bnd++] = rx->alpha.r[i][0];
        b->bnd[b->n_bnd++] = rx->alpha.r[i][1] + 1;
    }
    for (size_t i = 0; i < b->n_sets; i++) {
        const struct gm__cset *cs = &rx->set[b->sets[i]];
        for (size_t j = 0; j < cs->n; j++) {
            b->bnd[b->n_bnd++] = cs->r[j][0];
            b->bnd[b->n_bnd++] = cs->r[j][1] + 1;
        }
    }
    qsort(b->bnd, b->n_bnd, sizeof(*b->bnd), cmp_u32);
    size_t m = 0;
    for (size_t i = 0; i < b->n_bnd; i++)
        if (m == 0 || b->bnd[i] != b->bnd[m - 1])
            b->bnd[m++] = b->bnd[i];
    b->n_bnd = m;
    /* intervals [bnd[i], bnd[i+1] - 1] inside the alphabet (each is
     * wholly in or out: the alphabet's bounds are among the boundaries),
     * and which of the sets hold them */
    size_t words = (b->n_sets + 63) / 64;
    if (words == 0)
        words = 1;
    size_t ni = b->n_bnd > 0 ? b->n_bnd - 1 : 0;
    if (TG_GROW(b->sig, &b->cap_sig, (ni ? ni : 1) * words) ||
        TG_GROW(b->ord, &b->cap_ord, ni ? ni : 1) ||
        TG_GROW(b->tgt, &b->cap_tgt, ni ? ni : 1) ||
        TG_GROW(b->iv, &b->cap_iv, ni ? ni : 1))
        return bfail(rx, TG_ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < ni; i++) {
        uint32_t lo = b->bnd[i];
        if (!gm__cset_has(&rx->alpha, lo))
            continue;
        uint64_t *sg = b->sig + k * words;
        memset(sg, 0, words * sizeof(*sg));
        for (size_t j = 0; j < b->n_sets; j++)
            if (gm__cset_has(&rx->set[b->sets[j]], lo))
                sg[j / 64] |= 1ull << (j % 64);
        b->iv[k][0] = lo;
        b->iv[k][1] = b->bnd[i + 1] - 1;
        k++;
    }
    for (size_t i = 0; i < k; i++)
        b->ord[i] = i;
    sort_sig = b->sig;
    sort_words = words;
    qsort(b->ord, k, sizeof(*b->ord), by_sig);
    sort_sig = NULL;
    int wb = rx->wb;
    for (size_t g = 0; g < k;) {
        size_t e = g + 1;
        while (e < k &&
               memcmp(b->sig + b->ord[e] * words, b->sig + b->ord[g] * words,
                      words * sizeof(uint64_t)) == 0)
            e++;
        uint32_t c = b->iv[b->ord[g]][0];
        int32_t d = gm__rx_deriv(rx, t, ctx, c);
        int32_t to = -1;
        if (d < 0)
            return d;
        if (d != 0) {
            int nctx = wb && ((c >= '0' && c <= '9') ||
                              (c >= 'A' && c <= 'Z') ||
                              (c >= 'a' && c <= 'z') || c == '_')
                           ? GM__P_WORD
                           : GM__P_OTHER;
            to = state_of(b, d, nctx);
            if (to < 0)
                return to;
        }
        for (size_t i = g; i < e; i++)
            b->tgt[b->ord[i]] = to;
        g = e;
    }
    /* transitions in order of lo, adjacent ones to one target merged */
    for (size_t i = 0; i < k; i++) {
        if (b->tgt[i] < 0)
            continue;
        if (b->n_tr > b->t0[s] && b->tr[b->n_tr - 1].to == b->tgt[i] &&
            b->tr[b->n_tr - 1].hi + 1 == b->iv[i][0]) {
            b->tr[b->n_tr - 1].hi = b->iv[i][1];
            continue;
        }
        if (TG_GROW(b->tr, &b->cap_tr, b->n_tr + 1))
            return bfail(rx, TG_ENOMEM, "out of memory");
        b->tr[b->n_tr++] = (struct gm__rx_tr){
            .lo = b->iv[i][0], .hi = b->iv[i][1], .to = b->tgt[i]};
    }
    return 0;
}

static void bld_free(struct bld *b)
{
    free(b->term);
    free(b->ctx);
    gm__kset_free(&b->states);
    free(b->tr);
    free(b->t0);
    free(b->acc);
    free(b->vis);
    free(b->setvis);
    free(b->stk);
    free(b->sets);
    free(b->bnd);
    free(b->sig);
    free(b->ord);
    free(b->tgt);
    free(b->iv);
}

void gm__rx_dfa_free(struct gm__rx_dfa *d)
{
    free(d->accept);
    free(d->t0);
    free(d->tr);
    memset(d, 0, sizeof(*d));
}

int gm__rx_dfa_prune(struct gm__rx_dfa *d)
{
    size_t n = (size_t)d->n;
    if (n == 0)
        return 0;
    int32_t *map = malloc(n * sizeof(*map));
    size_t *rc0 = calloc(n + 1, sizeof(*rc0));
    size_t *fill = calloc(n, sizeof(*fill));
    int32_t *radj = malloc((d->n_tr ? d->n_tr : 1) * sizeof(*radj));
    int32_t *q = malloc(n * sizeof(*q));
    int rc = 0;
    if (map == NULL || rc0 == NULL || fill == NULL || radj == NULL ||
        q == NULL) {
        rc = TG_ENOMEM;
        goto out;
    }
    /* reverse edges in CSR */
    for (size_t i = 0; i < d->n_tr; i++)
        rc0[d->tr[i].to + 1]++;
    for (size_t s = 0; s < n; s++)
        rc0[s + 1] += rc0[s];
    for (size_t s = 0; s < n; s++)
        for (size_t i = d->t0[s]; i < d->t0[s + 1]; i++) {
            int32_t to = d->tr[i].to;
            radj[rc0[to] + fill[to]++] = (int32_t)s;
        }
    size_t qh = 0, qt = 0;
    for (size_t s = 0; s < n; s++) {
        map[s] = -1;
        if (d->accept[s]) {
            map[s] = 0;
            q[qt++] = (int32_t)s;
        }
    }
    while (qh < qt) {
        int32_t s = q[qh++];
        for (size_t i = rc0[s]; i < rc0[s + 1]; i++)
            if (map[radj[i]] < 0) {
                map[radj[i]] = 0;
                q[qt++] = radj[i];
            }
    }
    if (map[d->start] < 0) { /* no string */
        gm__rx_dfa_free(d);
        goto out;
    }
    /* renumber: live states in order, the start's number kept relative */
    int32_t m = 0;
    for (size_t s = 0; s < n; s++)
        if (map[s] >= 0)
            map[s] = m++;
    size_t nt = 0, w = 0;
    for (size_t s = 0; s < n; s++) {
        size_t a = d->t0[s], z = d->t0[s + 1];
        if (map[s] < 0)
            continue;
        d->accept[map[s]] = d->accept[s];
        d->t0[map[s]] = w;
        for (size_t i = a; i < z; i++)
            if (map[d->tr[i].to] >= 0) {
                d->tr[w] = d->tr[i];
                d->tr[w++].to = map[d->tr[i].to];
            }
        nt = w;
    }
    d->t0[m] = nt;
    d->n_tr = nt;
    d->start = map[d->start];
    d->n = m;
out:
    free(map);
    free(rc0);
    free(fill);
    free(radj);
    free(q);
    return rc;
}

/* ---- minimisation -------------------------------------------------------- */

/* Writes state s's signature under classes cls (its class, then its
 * transitions with targets as classes, adjacent equal ones merged) at
 * buf[*len..); returns 0 or TG_ENOMEM. */
static int signature(const struct gm__rx_dfa *d, const int32_t *cls, int32_t s,
                     uint32_t **buf, size_t *len, size_t *cap)
{
    if (TG_GROW(*buf, cap, *len + 1 + 3 * (d->t0[s + 1] - d->t0[s])))
        return TG_ENOMEM;
    uint32_t *o = *buf;
    o[(*len)++] = (uint32_t)cls[s];
    size_t first = *len;
    for (size_t i = d->t0[s]; i < d->t0[s + 1]; i++) {
        uint32_t c = (uint32_t)cls[d->tr[i].to];
        if (*len > first && o[*len - 1] == c &&
            o[*len - 2] + 1 == d->tr[i].lo) {
            o[*len - 2] = d->tr[i].hi;
            continue;
        }
        o[(*len)++] = d->tr[i].lo;
        o[(*len)++] = d->tr[i].hi;
        o[(*len)++] = c;
    }
    return 0;
}

static uint64_t hash_u32(const uint32_t *v, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ v[i]) * 0x100000001B3ull;
    return h ^ (h >> 29);
}

static int minimise(struct gm__rx *rx, struct gm__rx_dfa *d)
{
    int32_t n = d->n;
    if (n <= 1)
        return 0;
    int32_t *cls = malloc((size_t)n * sizeof(*cls));
    int32_t *ncls = malloc((size_t)n * sizeof(*ncls));
    size_t *off = malloc(((size_t)n + 1) * sizeof(*off));
    int32_t *rep = malloc((size_t)n * sizeof(*rep));
    uint32_t *buf = NULL;
    size_t cap = 0;
    struct gm__kset ks;
    int rc = gm__kset_init(&ks);
    if (cls == NULL || ncls == NULL || off == NULL || rep == NULL || rc != 0) {
        rc = TG_ENOMEM;
        goto out;
    }
    int any[2] = {0, 0};
    for (int32_t s = 0; s < n; s++) {
        cls[s] = d->accept[s];
        any[d->accept[s]] = 1;
    }
    int32_t k = any[0] + any[1];
    for (;;) {
        if (late(rx)) {
            rc = TG_ETIMEDOUT;
            goto out;
        }
        size_t len = 0;
        for (int32_t s = 0; s < n; s++) {
            off[s] = len;
            if (signature(d, cls, s, &buf, &len, &cap) != 0) {
                rc = TG_ENOMEM;
                goto out;
            }
        }
        off[n] = len;
        gm__kset_clear(&ks);
        int32_t nk = 0;
        for (int32_t s = 0; s < n; s++) {
            const uint32_t *sg = buf + off[s];
            size_t sl = off[s + 1] - off[s];
            uint64_t h = hash_u32(sg, sl);
            for (int32_t salt = 0;; salt++) {
                int32_t v;
                int r = gm__kset_put(&ks, (int32_t)h, (int32_t)(h >> 32),
                                     (int32_t)sl + (salt << 24), nk, &v);
                if (r < 0) {
                    rc = TG_ENOMEM;
                    goto out;
                }
                if (r == 1) {
                    rep[nk] = s;
                    ncls[s] = nk++;
                    break;
                }
                int32_t o = rep[v];
                if (off[o + 1] - off[o] == sl &&
                    memcmp(buf + off[o], sg, sl * sizeof(*sg)) == 0) {
                    ncls[s] = v;
                    break;
                }
            }
        }
        memcpy(cls, ncls, (size_t)n * sizeof(*cls));
        if (nk == k)
            break;
        k = nk;
    }
    if (k == n)
        goto out;
    /* the quotient: class c is state c, from its representative */
    struct gm__rx_dfa q = {0};
    q.n = k;
    q.start = cls[d->start];
    q.accept = malloc((size_t)k);
    q.t0 = calloc((size_t)k + 1, sizeof(*q.t0));
    q.tr = malloc((d->n_tr ? d->n_tr : 1) * sizeof(*q.tr));
    if (q.accept == NULL || q.t0 == NULL || q.tr == NULL) {
        gm__rx_dfa_free(&q);
        rc = TG_ENOMEM;
        goto out;
    }
    for (int32_t c = 0; c < k; c++) {
        int32_t s = rep[c];
        q.accept[c] = d->accept[s];
        for (size_t i = d->t0[s]; i < d->t0[s + 1]; i++) {
            int32_t to = cls[d->tr[i].to];
            if (q.n_tr > q.t0[c] && q.tr[q.n_tr - 1].to == to &&
                q.tr[q.n_tr - 1].hi + 1 == d->tr[i].lo) {
                q.tr[q.n_tr - 1].hi = d->tr[i].hi;
                continue;
            }
            q.tr[q.n_tr] = d->tr[i];
            q.tr[q.n_tr++].to = to;
        }
        q.t0[c + 1] = q.n_tr;
    }
    gm__rx_dfa_free(d);
    *d = q;
out:
    free(cls);
    free(ncls);
    free(off);
    free(rep);
    free(buf);
    gm__kset_free(&ks);
    if (rc == TG_ETIMEDOUT)
        bfail(rx, rc, LATE);
    else if (rc != 0)
        bfail(rx, rc, "out of memory");
    return rc;
}

int gm__rx_dfa_build(struct gm__rx *rx, int32_t t, struct gm__rx_dfa *d)
{
    memset(d, 0, sizeof(*d));
    if (t < 0)
        return rx->err != 0 ? rx->err : t;
    struct bld b;
    memset(&b, 0, sizeof b);
    b.rx = rx;
    b.word = -1;
    int rc = gm__kset_init(&b.states);
    if (rc == 0 && rx->wb) {
        struct gm__cset w = {0};
        if (gm__cset_class(&w, 'w') != 0)
            rc = TG_ENOMEM;
        gm__cset_norm(&w);
        /* interned like the pattern's own sets */
        for (size_t i = 0; rc == 0 && i < rx->n_set; i++)
            if (rx->set[i].n == w.n &&
                memcmp(rx->set[i].r, w.r, w.n * sizeof(*w.r)) == 0)
                b.word = (int32_t)i;
        if (rc == 0 && b.word < 0) {
            if (TG_GROW(rx->set, &rx->cap_set, rx->n_set + 1))
                rc = TG_ENOMEM;
            else {
                rx->set[rx->n_set] = w;
                memset(&w, 0, sizeof w);
                b.word = (int32_t)rx->n_set++;
            }
        }
        gm__cset_free(&w);
    }
    if (rc != 0) {
        bld_free(&b);
        return bfail(rx, TG_ENOMEM, "out of memory");
    }
    if (state_of(&b, t, GM__P_START) < 0)
        goto fail;
    for (size_t s = 0; s < b.n; s++) {
        if ((s & 63) == 63 && late(rx)) {
            bfail(rx, TG_ETIMEDOUT, LATE);
            goto fail;
        }
        if (TG_GROW(b.t0, &b.cap_t0, s + 2) ||
            TG_GROW(b.acc, &b.cap_acc, s + 1)) {
            bfail(rx, TG_ENOMEM, "out of memory");
            goto fail;
        }
        b.t0[s] = b.n_tr;
        b.acc[s] = (rx->t[b.term[s]].null >> (b.ctx[s] * 3 + GM__Q_END)) & 1;
        if (expand(&b, (int32_t)s) != 0)
            goto fail;
        b.t0[s + 1] = b.n_tr;
    }
    /* the built automaton becomes *d */
    d->n = (int32_t)b.n;
    d->start = 0;
    d->accept = b.acc;
    d->t0 = b.t0;
    d->tr = b.tr;
    d->n_tr = b.n_tr;
    b.acc = NULL;
    b.t0 = NULL;
    b.tr = NULL;
    bld_free(&b);
    if (gm__rx_dfa_prune(d) != 0) {
        gm__rx_dfa_free(d);
        return bfail(rx, TG_ENOMEM, "out of memory");
    }
    return minimise(rx, d);
fail:
    bld_free(&b);
    gm__rx_dfa_free(d);
    return rx->err != 0 ? rx->err : TG_ENOMEM;
}

int gm__rx_dfa_run(const struct gm__rx_dfa *d, const uint32_t *cp, size_t n)
{
    if (d->n == 0)
        return 0;
    int32_t s = d->start;
    for (size_t i = 0; i < n; i++) {
        size_t a = d->t0[s], z = d->t0[s + 1];
        while (a < z) {
            size_t mid = (a + z) / 2;
            if (cp[i] > d->tr[mid].hi)
                a = mid + 1;
            else
                z = mid;
        }
        if (a >= d->t0[s + 1] || d->tr[a].lo > cp[i])
            return 0;
        s = d->tr[a].to;
    }
    return d->accept[s];
}
