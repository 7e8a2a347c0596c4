/* gm_sig.c — token-cache classes of automaton nodes by bounded
 * bisimulation (gm_internal.h).
 *
 * Round 0 splits nodes by where their rule may end (not final, or final
 * with the rule's FOLLOW set: a token-cache walk records a pop there and
 * filters it by that set). Round r splits each class by the sets of
 * (byte class, class of target) and (callee, class of return node) of its
 * members, so nodes in one class after r rounds cannot be told apart by
 * any walk of r bytes (every edge and every call consumes at least one
 * byte). With r = the longest token + 1 their token-mask caches are
 * equal. This is Moore's partition refinement cut off at a depth; for a
 * counted repetition such as a string of at most N characters it merges
 * the positions more than a token away from both bounds.
 *
 * The history of the splits also says how far two classes agree: a class
 * gets a "donor", an earlier class that behaves alike on every string
 * shorter than sig_skip bytes, so its cache copies the donor's decisions
 * for the tokens that short and walks only the longer ones (the positions
 * of a string of at most 64 characters differ only for tokens long
 * enough to reach its end). */
#include "common/grammar/gm_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "common/base/tg_hmap.h"

/* Class ids kept for the split history (donors below), about 4 bytes each. */
#define SIG_HISTORY_MAX (32u << 20)

double gm__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Interned keys: a slot holds a key's hash, where its words are in
 * table.keys and its id; a lookup's key is the words being interned. */
struct slot {
    uint64_t h;
    size_t off; /* key in keys[] */
    uint32_t len;
    int32_t id; /* -1 empty */
};

struct table {
    struct tg_hmap map; /* struct slot */
    uint32_t *keys;
    size_t n_keys, cap_keys;
    int32_t n_ids;
};

struct sig_key {
    const struct table *t;
    const uint32_t *k;
    uint32_t n;
    uint64_t h;
};

static inline int slot_probe(const void *slot, const void *key)
{
    const struct slot *s = slot;
    const struct sig_key *q = key;
    if (s->id < 0)
        return TG_HMAP_EMPTY;
    return s->h == q->h && s->len == q->n &&
                   memcmp(q->t->keys + s->off, q->k, q->n * sizeof(*q->k)) == 0
               ? TG_HMAP_HIT
               : TG_HMAP_MISS;
}

static int slot_empty(const void *slot)
{
    return ((const struct slot *)slot)->id < 0;
}

static uint64_t slot_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return ((const struct slot *)slot)->h;
}

static const struct tg_hmap_type slot_type = {
    .esize = sizeof(struct slot),
    .empty_byte = 0xff,
    .probe = slot_probe,
    .is_empty = slot_empty,
    .hash = slot_hash,
};

static uint64_t hash_key(const uint32_t *k, uint32_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t i = 0; i < n; i++) {
        h ^= k[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h;
}

/* Empties the table, with room for n_items keys (interning them never
 * grows it). */
static int table_reset(struct table *t, size_t n_items)
{
    if (t->map.slots == NULL) {
        if (tg_hmap_init(&t->map, &slot_type, NULL, n_items) != 0)
            return TG_ENOMEM;
    } else {
        if (tg_hmap_reserve(&t->map, n_items) != 0)
            return TG_ENOMEM;
        tg_hmap_clear(&t->map);
    }
    t->n_keys = 0;
    t->n_ids = 0;
    return 0;
}

/* The id of key k[0..n), a new one when unseen. The key must already be
 * at t->keys[t->n_keys ..] (it is kept when new). */
static int32_t intern(struct table *t, uint32_t n)
{
    const uint32_t *k = t->keys + t->n_keys;
    struct sig_key q = {t, k, n, hash_key(k, n)};
    int added = 0;
    struct slot *s = tg_hmap_put(&t->map, &slot_type, q.h, &q, &added);
    TG_ASSERT(s != NULL); /* table_reset made room for every key */
    if (!added)
        return s->id;
    *s = (struct slot){.h = q.h, .off = t->n_keys, .len = n, .id = t->n_ids};
    t->n_keys += n;
    return t->n_ids++;
}

/* Sorts pairs p[0..n) (a, b) and drops repeats; returns the count left. */
static uint32_t sort_pairs(uint32_t *p, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        uint32_t a = p[2 * i], b = p[2 * i + 1];
        uint32_t j = i;
        while (j > 0 && (p[2 * (j - 1)] > a ||
                         (p[2 * (j - 1)] == a && p[2 * (j - 1) + 1] > b))) {
            p[2 * j] = p[2 * (j - 1)];
            p[2 * j + 1] = p[2 * (j - 1) + 1];
            j--;
        }
        p[2 * j] = a;
        p[2 * j + 1] = b;
    }
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (m == 0 || p[2 * i] != p[2 * (m - 1)] ||
            p[2 * i + 1] != p[2 * (m - 1) + 1]) {
            p[2 * m] = p[2 * i];
            p[2 * m + 1] = p[2 * i + 1];
            m++;
        }
    return m;
}

/* Donors from the refinement history: par[j][x] is the round-j class of
 * round-(j+1) class x, for j < R; the final classes are round R's. The
 * classes form a tree; a final class c whose round-j ancestor has a
 * leftmost leaf (smallest final id) other than c agrees with that leaf on
 * every string of up to j bytes. The deepest such j gives c's donor and
 * D = j + 1: tokens shorter than D behave alike from both. */
static int donors(struct gm__pda *p, int32_t **par, const int32_t *n_at,
                  int R)
{
    int32_t n = p->n_sig;
    p->sig_donor = malloc((size_t)n * sizeof(*p->sig_donor));
    p->sig_skip = calloc((size_t)n, sizeof(*p->sig_skip));
    int32_t **lm = calloc((size_t)R + 1, sizeof(*lm));
    int rc = 0;
    if (p->sig_donor == NULL || p->sig_skip == NULL || lm == NULL) {
        rc = TG_ENOMEM;
        goto out;
    }
    for (int32_t c = 0; c < n; c++)
        p->sig_donor[c] = -1;
    for (int j = 0; j <= R; j++) {
        lm[j] = malloc((size_t)n_at[j] * sizeof(*lm[j]));
        if (lm[j] == NULL) {
            rc = TG_ENOMEM;
            goto out;
        }
        for (int32_t x = 0; x < n_at[j]; x++)
            lm[j][x] = j == R ? x : INT32_MAX;
    }
    for (int j = R - 1; j >= 0; j--)
        for (int32_t y = 0; y < n_at[j + 1]; y++) {
            int32_t x = par[j][y];
            if (lm[j + 1][y] < lm[j][x])
                lm[j][x] = lm[j + 1][y];
        }
    for (int32_t c = 0; c < n; c++) {
        int32_t x = c;
        for (int j = R - 1; j >= 1; j--) {
            x = par[j][x];
            if (lm[j][x] != c) {
                p->sig_donor[c] = lm[j][x];
                p->sig_skip[c] = (uint16_t)(j + 1);
                break;
            }
        }
    }
out:
    if (lm != NULL)
        for (int j = 0; j <= R; j++)
            free(lm[j]);
    free(lm);
    return rc;
}

int gm__sig_build(struct gm__pda *p, int depth, double deadline)
{
    int32_t n = p->n_node;
    int32_t *cls = malloc((size_t)n * sizeof(*cls));
    int32_t *nxt = malloc((size_t)n * sizeof(*nxt));
    int32_t *fid = malloc((size_t)p->n_rule * sizeof(*fid));
    int32_t **par = calloc((size_t)depth + 2, sizeof(*par));
    int32_t *n_at = calloc((size_t)depth + 3, sizeof(*n_at));
    size_t tracked = 0;
    int track = 1, R = 0;
    struct table t = {0};
    int rc = 0;
    if (cls == NULL || nxt == NULL || fid == NULL || par == NULL ||
        n_at == NULL || table_reset(&t, (size_t)n + (size_t)p->n_rule) != 0) {
        rc = TG_ENOMEM;
        goto out;
    }
    /* round 0: 0 = not final; 1 + the id of the rule's FOLLOW set */
    for (int32_t r = 0; r < p->n_rule; r++) {
        if (TG_GROW(t.keys, &t.cap_keys, t.n_keys + 8) != 0) {
            rc = TG_ENOMEM;
            goto out;
        }
        memcpy(t.keys + t.n_keys, p->follow[r], 32);
        fid[r] = intern(&t, 8);
    }
    int32_t count = 0;
    for (int32_t u = 0; u < n; u++) {
        cls[u] = p->node[u].final ? 1 + fid[p->node[u].rule] : 0;
        if (cls[u] + 1 > count)
            count = cls[u] + 1;
    }
    n_at[0] = count; /* ids may have gaps: harmless */
    for (int round = 0; round <= depth; round++) {
        if (deadline > 0 && gm__now() > deadline) {
            rc = TG_ETIMEDOUT;
            goto out;
        }
        if (table_reset(&t, (size_t)n) != 0) {
            rc = TG_ENOMEM;
            goto out;
        }
        for (int32_t u = 0; u < n; u++) {
            const struct gm__node *nd = &p->node[u];
            uint32_t len = 3 + 2 * (nd->ne + nd->nc);
            if (TG_GROW(t.keys, &t.cap_keys, t.n_keys + len) != 0) {
                rc = TG_ENOMEM;
                goto out;
            }
            uint32_t *k = t.keys + t.n_keys;
            k[0] = (uint32_t)cls[u];
            uint32_t *e = k + 2;
            for (uint32_t i = 0; i < nd->ne; i++) {
                e[2 * i] = p->edge[nd->e0 + i].cls;
                e[2 * i + 1] = (uint32_t)cls[p->edge[nd->e0 + i].to];
            }
            uint32_t ne = sort_pairs(e, nd->ne);
            k[1] = ne;
            uint32_t *c = e + 2 * ne;
            for (uint32_t i = 0; i < nd->nc; i++) {
                c[1 + 2 * i] = (uint32_t)p->call[nd->c0 + i].rule;
                c[2 + 2 * i] = (uint32_t)cls[p->call[nd->c0 + i].ret];
            }
            uint32_t nc = sort_pairs(c + 1, nd->nc);
            c[0] = nc;
            nxt[u] = intern(&t, 3 + 2 * (ne + nc));
        }
        /* the history of splits, while it fits its budget */
        tracked += (size_t)t.n_ids;
        if (track && tracked <= SIG_HISTORY_MAX) {
            par[R] = malloc((size_t)t.n_ids * sizeof(*par[R]));
            if (par[R] == NULL) {
                rc = TG_ENOMEM;
                goto out;
            }
            for (int32_t u = 0; u < n; u++)
                par[R][nxt[u]] = cls[u];
            n_at[++R] = t.n_ids;
        } else {
            track = 0;
        }
        int32_t *sw = cls;
        cls = nxt;
        nxt = sw;
        int stable = t.n_ids == count;
        count = t.n_ids;
        if (stable && round > 0)
            break;
    }
    free(p->sig);
    p->sig = cls;
    cls = NULL;
    p->n_sig = count;
    if (track)
        rc = donors(p, par, n_at, R);
    else
        rc = donors(p, par, n_at, 0);
out:
    free(cls);
    free(nxt);
    free(fid);
    if (par != NULL)
        for (int j = 0; j < R; j++)
            free(par[j]);
    free(par);
    free(n_at);
    tg_hmap_free(&t.map);
    free(t.keys);
    return rc;
}
