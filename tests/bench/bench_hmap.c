/*
 * bench_hmap.c — the shared hash table (common/base/tg_hmap.h) against
 * the hand-written open-addressing tables it replaced, side by side in
 * one run, on the workloads those tables served:
 *
 *   merges   the tokenizer's BPE merge table: (left, right) id pair ->
 *            (rank, merged id), slots in place, lookups half of which
 *            miss (common/tok/tok_encode.c, the encode hot path);
 *   vocab    an index of int32 ids over byte strings kept in an arena
 *            (the tokenizer's string -> id tables; the Jinja dict index
 *            and the grammar's byte-class index have the same shape);
 *   reqs     request id -> request pointer with a steady churn of
 *            insertions and backward-shift deletions (the router
 *            scheduler's map);
 *   kset     the grammar walker's per-step key sets: emptied every step,
 *            mostly small with an occasional large step; the walker keeps
 *            its epoch-stamped set (gm_walk.c), which empties in O(1),
 *            and this case is why: the generic map's clear costs a pass
 *            over its slots.
 *
 *   bench-hmap [--quick]
 *
 * The hand-written tables are reproduced here as they were (the product
 * no longer has them). Each cell is the best of R runs (R = 5; --quick:
 * 1, with smaller tables); prints ns per operation of each and the ratio
 * ours / hand (< 1: ours faster), and fails unless both give the same
 * checksums. Wall-clock ratios on a shared machine are noisy: for the
 * figures in docs/RELIABILITY.md compare instruction counts instead
 * (valgrind --tool=callgrind, the *_hand / *_ours functions).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_hmap.h"

#define NOINLINE __attribute__((noinline))

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
    /* xorshift64* (Vigna 2016) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "bench-hmap: out of memory\n");
        exit(1);
    }
    return p;
}

struct cell {
    const char *name;
    double hand, ours; /* seconds, best run */
    double ops;
    uint64_t sum_hand, sum_ours;
};

/* ---- merges ----------------------------------------------------------- */

struct merge {
    uint64_t key; /* UINT64_MAX empty */
    uint32_t rank;
    int32_t id;
};

static uint64_t merge_hash(uint64_t key)
{
    return (key * 0x9E3779B97F4A7C15ull) >> 17;
}

struct merges_hand {
    struct merge *m;
    uint64_t mask;
};

static void merges_hand_build(struct merges_hand *t, const uint64_t *keys,
                              size_t n)
{
    uint64_t slots = 64;
    while (slots < 2 * (uint64_t)n)
        slots *= 2;
    t->m = xmalloc(slots * sizeof(*t->m));
    memset(t->m, 0xff, slots * sizeof(*t->m));
    t->mask = slots - 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = merge_hash(keys[i]) & t->mask;
        while (t->m[s].key != UINT64_MAX && t->m[s].key != keys[i])
            s = (s + 1) & t->mask;
        t->m[s] = (struct merge){keys[i], (uint32_t)i, (int32_t)(i * 3)};
    }
}

static const struct merge *merges_hand_find(const struct merges_hand *t,
                                            uint64_t key)
{
    for (uint64_t s = merge_hash(key) & t->mask;; s = (s + 1) & t->mask) {
        const struct merge *m = &t->m[s];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
    }
}

static int merge_empty(const void *slot)
{
    return ((const struct merge *)slot)->key == UINT64_MAX;
}

static uint64_t merge_slot_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return merge_hash(((const struct merge *)slot)->key);
}

static int merge_probe(const void *slot, const void *key)
{
    uint64_t k = ((const struct merge *)slot)->key;
    return k == *(const uint64_t *)key ? TG_HMAP_HIT
           : k == UINT64_MAX           ? TG_HMAP_EMPTY
                                       : TG_HMAP_MISS;
}

static const struct tg_hmap_type merge_type = {
    .esize = sizeof(struct merge),
    .empty_byte = 0xff,
    .probe = merge_probe,
    .is_empty = merge_empty,
    .hash = merge_slot_hash,
};

static void merges_ours_build(struct tg_hmap *t, const uint64_t *keys, size_t n)
{
    if (tg_hmap_init(t, &merge_type, NULL, n) != 0)
        exit(1);
    for (size_t i = 0; i < n; i++) {
        struct merge *m = tg_hmap_put(t, &merge_type, merge_hash(keys[i]),
                                      &keys[i], NULL);
        *m = (struct merge){keys[i], (uint32_t)i, (int32_t)(i * 3)};
    }
}

static inline const struct merge *merges_ours_find(const struct tg_hmap *t,
                                                   uint64_t key)
{
    return tg_hmap_find(t, &merge_type, merge_hash(key), &key);
}

static NOINLINE uint64_t merges_hand(const struct merges_hand *t,
                                     const uint64_t *q, size_t nq)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < nq; i++) {
        const struct merge *m = merges_hand_find(t, q[i]);
        sum += m != NULL ? m->rank + (uint64_t)m->id : 1;
    }
    return sum;
}

static NOINLINE uint64_t merges_ours(const struct tg_hmap *t, const uint64_t *q,
                                     size_t nq)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < nq; i++) {
        const struct merge *m = merges_ours_find(t, q[i]);
        sum += m != NULL ? m->rank + (uint64_t)m->id : 1;
    }
    return sum;
}

static void run_merges(struct cell *c, size_t n, size_t nq, int reps)
{
    uint64_t *keys = xmalloc(n * sizeof(*keys));
    uint64_t *q = xmalloc(nq * sizeof(*q));
    for (size_t i = 0; i < n; i++)
        keys[i] = (next() % 150000) << 32 | (next() % 150000);
    for (size_t i = 0; i < nq; i++)
        q[i] = (i & 1) ? keys[next() % n]
                       : ((next() % 150000) << 32 | (next() % 150000));
    struct merges_hand th;
    struct tg_hmap to;
    merges_hand_build(&th, keys, n);
    merges_ours_build(&to, keys, n);
    c->name = "merges";
    c->ops = (double)nq;
    c->hand = c->ours = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        c->sum_hand = merges_hand(&th, q, nq);
        double t1 = now();
        c->sum_ours = merges_ours(&to, q, nq);
        double t2 = now();
        c->hand = t1 - t0 < c->hand ? t1 - t0 : c->hand;
        c->ours = t2 - t1 < c->ours ? t2 - t1 : c->ours;
    }
    free(th.m);
    tg_hmap_free(&to);
    free(keys);
    free(q);
}

/* ---- vocab ------------------------------------------------------------ */

struct span {
    uint32_t off, len;
};

struct vocab {
    char *arena;
    struct span *sp;
    int32_t n;
    int32_t *tab; /* hand: slots of ids, -1 empty */
    uint32_t mask;
    struct tg_hmap index; /* ours: the same slots */
};

static int32_t vocab_hand_find(const struct vocab *v, const void *p, size_t n)
{
    for (uint32_t i = (uint32_t)tg_hash_bytes(p, n) & v->mask;;
         i = (i + 1) & v->mask) {
        int32_t id = v->tab[i];
        if (id < 0)
            return -1;
        if (v->sp[id].len == n && memcmp(v->arena + v->sp[id].off, p, n) == 0)
            return id;
    }
}

struct vkey {
    const struct vocab *v;
    const void *p;
    size_t n;
};

static int vocab_empty(const void *slot)
{
    return *(const int32_t *)slot < 0;
}

static uint64_t vocab_slot_hash(const void *slot, void *ctx)
{
    const struct vocab *v = ctx;
    const struct span *s = &v->sp[*(const int32_t *)slot];
    return tg_hash_bytes(v->arena + s->off, s->len);
}

static int vocab_probe(const void *slot, const void *key)
{
    int32_t id = *(const int32_t *)slot;
    const struct vkey *k = key;
    if (id < 0)
        return TG_HMAP_EMPTY;
    const struct span *s = &k->v->sp[id];
    return s->len == k->n && memcmp(k->v->arena + s->off, k->p, k->n) == 0
               ? TG_HMAP_HIT
               : TG_HMAP_MISS;
}

static const struct tg_hmap_type vocab_type = {
    .esize = sizeof(int32_t),
    .empty_byte = 0xff,
    .probe = vocab_probe,
    .is_empty = vocab_empty,
    .hash = vocab_slot_hash,
};

static inline int32_t vocab_ours_find(const struct vocab *v, const void *p,
                                      size_t n)
{
    struct vkey k = {v, p, n};
    const int32_t *slot = tg_hmap_find(&v->index, &vocab_type,
                                       tg_hash_bytes(p, n), &k);
    return slot != NULL ? *slot : -1;
}

static NOINLINE uint64_t vocab_hand(const struct vocab *v, const int32_t *q,
                                    size_t nq)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < nq; i++) {
        const struct span *s = &v->sp[q[i]];
        sum += (uint64_t)vocab_hand_find(v, v->arena + s->off, s->len + 1);
        sum += (uint64_t)vocab_hand_find(v, v->arena + s->off, s->len);
    }
    return sum;
}

static NOINLINE uint64_t vocab_ours(const struct vocab *v, const int32_t *q,
                                    size_t nq)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < nq; i++) {
        const struct span *s = &v->sp[q[i]];
        sum += (uint64_t)vocab_ours_find(v, v->arena + s->off, s->len + 1);
        sum += (uint64_t)vocab_ours_find(v, v->arena + s->off, s->len);
    }
    return sum;
}

static void run_vocab(struct cell *c, int32_t n, size_t nq, int reps)
{
    struct vocab v = {0};
    v.arena = xmalloc((size_t)n * 16);
    v.sp = xmalloc((size_t)n * sizeof(*v.sp));
    uint32_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t len = 2 + (uint32_t)(next() % 11);
        for (uint32_t k = 0; k < len; k++)
            v.arena[off + k] = (char)('a' + next() % 26);
        v.sp[i] = (struct span){off, len};
        off += len;
    }
    v.n = n;
    uint32_t slots = 64;
    while (slots < 2 * (uint32_t)n)
        slots *= 2;
    v.mask = slots - 1;
    v.tab = xmalloc(slots * sizeof(int32_t));
    memset(v.tab, 0xff, slots * sizeof(int32_t));
    if (tg_hmap_init(&v.index, &vocab_type, &v, (size_t)n) != 0)
        exit(1);
    for (int32_t id = 0; id < n; id++) {
        const char *p = v.arena + v.sp[id].off;
        size_t len = v.sp[id].len;
        if (vocab_hand_find(&v, p, len) < 0) { /* first one wins */
            uint32_t i = (uint32_t)tg_hash_bytes(p, len) & v.mask;
            while (v.tab[i] >= 0)
                i = (i + 1) & v.mask;
            v.tab[i] = id;
        }
        struct vkey k = {&v, p, len};
        int added;
        int32_t *slot = tg_hmap_put(&v.index, &vocab_type,
                                    tg_hash_bytes(p, len), &k, &added);
        if (added)
            *slot = id;
    }
    int32_t *q = xmalloc(nq * sizeof(*q));
    for (size_t i = 0; i < nq; i++)
        q[i] = (int32_t)(next() % (uint64_t)n);
    c->name = "vocab";
    c->ops = 2.0 * (double)nq;
    c->hand = c->ours = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        c->sum_hand = vocab_hand(&v, q, nq);
        double t1 = now();
        c->sum_ours = vocab_ours(&v, q, nq);
        double t2 = now();
        c->hand = t1 - t0 < c->hand ? t1 - t0 : c->hand;
        c->ours = t2 - t1 < c->ours ? t2 - t1 : c->ours;
    }
    free(q);
    free(v.tab);
    tg_hmap_free(&v.index);
    free(v.arena);
    free(v.sp);
}

/* ---- reqs ------------------------------------------------------------- */

struct req {
    uint64_t id;
    uint64_t payload;
};

struct reqmap_hand {
    struct req **map;
    int64_t cap;
};

static int64_t reqmap_slot(const struct reqmap_hand *s, uint64_t id)
{
    int64_t mask = s->cap - 1;
    int64_t i = (int64_t)(tg_hash_u64(id) & (uint64_t)mask);
    while (s->map[i] != NULL && s->map[i]->id != id)
        i = (i + 1) & mask;
    return i;
}

static void reqmap_hand_del(struct reqmap_hand *s, uint64_t id)
{
    int64_t mask = s->cap - 1;
    int64_t i = reqmap_slot(s, id);
    s->map[i] = NULL;
    for (int64_t j = (i + 1) & mask; s->map[j] != NULL; j = (j + 1) & mask) {
        int64_t home = (int64_t)(tg_hash_u64(s->map[j]->id) & (uint64_t)mask);
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            s->map[i] = s->map[j];
            s->map[j] = NULL;
            i = j;
        }
    }
}

static int req_empty(const void *slot)
{
    return *(struct req *const *)slot == NULL;
}

static uint64_t req_slot_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return tg_hash_u64((*(struct req *const *)slot)->id);
}

static int req_probe(const void *slot, const void *key)
{
    const struct req *r = *(struct req *const *)slot;
    if (r == NULL)
        return TG_HMAP_EMPTY;
    return r->id == *(const uint64_t *)key ? TG_HMAP_HIT : TG_HMAP_MISS;
}

static const struct tg_hmap_type req_type = {
    .esize = sizeof(struct req *),
    .empty_byte = 0,
    .probe = req_probe,
    .is_empty = req_empty,
    .hash = req_slot_hash,
};

/* Live requests r[0..live) in a ring: each op admits one, looks up four
 * and retires the oldest. */
static NOINLINE uint64_t reqs_hand(struct req *r, size_t live, size_t ops)
{
    struct reqmap_hand s;
    s.cap = 64;
    while ((size_t)s.cap < 2 * live)
        s.cap *= 2;
    s.map = calloc((size_t)s.cap, sizeof(*s.map));
    uint64_t sum = 0;
    for (size_t i = 0; i < live; i++)
        s.map[reqmap_slot(&s, r[i].id)] = &r[i];
    for (size_t k = 0; k < ops; k++) {
        struct req *old = &r[k % live];
        reqmap_hand_del(&s, old->id);
        old->id += live;
        s.map[reqmap_slot(&s, old->id)] = old;
        for (int j = 0; j < 4; j++) {
            uint64_t id = r[(k * 7 + (size_t)j * 131) % live].id;
            sum += s.map[reqmap_slot(&s, id)]->payload;
        }
    }
    free(s.map);
    return sum;
}

static NOINLINE uint64_t reqs_ours(struct req *r, size_t live, size_t ops)
{
    struct tg_hmap m;
    if (tg_hmap_init(&m, &req_type, NULL, live) != 0)
        exit(1);
    uint64_t sum = 0;
    for (size_t i = 0; i < live; i++)
        *(struct req **)tg_hmap_put(&m, &req_type, tg_hash_u64(r[i].id),
                                    &r[i].id, NULL) = &r[i];
    for (size_t k = 0; k < ops; k++) {
        struct req *old = &r[k % live];
        tg_hmap_del(
            &m, &req_type,
            tg_hmap_find(&m, &req_type, tg_hash_u64(old->id), &old->id));
        old->id += live;
        *(struct req **)tg_hmap_put(&m, &req_type, tg_hash_u64(old->id),
                                    &old->id, NULL) = old;
        for (int j = 0; j < 4; j++) {
            uint64_t id = r[(k * 7 + (size_t)j * 131) % live].id;
            struct req **slot = tg_hmap_find(&m, &req_type, tg_hash_u64(id),
                                             &id);
            sum += (*slot)->payload;
        }
    }
    tg_hmap_free(&m);
    return sum;
}

static void run_reqs(struct cell *c, size_t live, size_t ops, int reps)
{
    struct req *r = xmalloc(live * sizeof(*r));
    c->name = "reqs";
    c->ops = (double)ops * 6;
    c->hand = c->ours = 1e30;
    for (int k = 0; k < reps; k++) {
        for (size_t i = 0; i < live; i++)
            r[i] = (struct req){i + 1, i * 11};
        double t0 = now();
        c->sum_hand = reqs_hand(r, live, ops);
        double t1 = now();
        for (size_t i = 0; i < live; i++)
            r[i] = (struct req){i + 1, i * 11};
        double t2 = now();
        c->sum_ours = reqs_ours(r, live, ops);
        double t3 = now();
        c->hand = t1 - t0 < c->hand ? t1 - t0 : c->hand;
        c->ours = t3 - t2 < c->ours ? t3 - t2 : c->ours;
    }
    free(r);
}

/* ---- kset ------------------------------------------------------------- */

static uint32_t key3_hash(int32_t a, int32_t b, int32_t c)
{
    uint64_t h = (uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uint32_t)b * 0xC2B2AE3D27D4EB4Full;
    h ^= (uint64_t)(uint32_t)c * 0x165667B19E3779F9ull;
    return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

/* The walker's set: a slot is live when its stamp is the current epoch,
 * so emptying is one increment. */
struct kset_hand {
    int32_t (*key)[4];
    uint32_t *stamp;
    uint32_t mask, epoch;
    size_t n;
};

static void kset_hand_grow(struct kset_hand *k)
{
    uint32_t cap = k->mask ? (k->mask + 1) * 2 : 64;
    int32_t(*key)[4] = xmalloc((size_t)cap * sizeof(*key));
    uint32_t *stamp = calloc(cap, sizeof(*stamp));
    for (uint32_t i = 0; k->stamp != NULL && i <= k->mask; i++) {
        if (k->stamp[i] != k->epoch)
            continue;
        uint32_t h = key3_hash(k->key[i][0], k->key[i][1], k->key[i][2]) &
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
}

static inline int kset_hand_put(struct kset_hand *k, int32_t a, int32_t b,
                                int32_t c, int32_t v0, int32_t *v)
{
    if ((k->n + 1) * 2 > (size_t)k->mask + 1)
        kset_hand_grow(k);
    uint32_t h = key3_hash(a, b, c) & k->mask;
    while (k->stamp[h] == k->epoch) {
        const int32_t *x = k->key[h];
        if (x[0] == a && x[1] == b && x[2] == c) {
            *v = x[3];
            return 0;
        }
        h = (h + 1) & k->mask;
    }
    k->stamp[h] = k->epoch;
    k->key[h][0] = a;
    k->key[h][1] = b;
    k->key[h][2] = c;
    k->key[h][3] = v0;
    k->n++;
    *v = v0;
    return 1;
}

static inline void kset_hand_clear(struct kset_hand *k)
{
    if (k->n == 0)
        return;
    if (++k->epoch == 0) {
        memset(k->stamp, 0, ((size_t)k->mask + 1) * sizeof(*k->stamp));
        k->epoch = 1;
    }
    k->n = 0;
}

struct key4 {
    int32_t k[4]; /* k[0] == -1: empty (the walker's keys are >= 0) */
};

static int key4_empty(const void *slot)
{
    return ((const struct key4 *)slot)->k[0] == -1;
}

static uint64_t key4_hash(const void *slot, void *ctx)
{
    (void)ctx;
    const int32_t *k = ((const struct key4 *)slot)->k;
    return key3_hash(k[0], k[1], k[2]);
}

static int key4_probe(const void *slot, const void *key)
{
    const int32_t *x = ((const struct key4 *)slot)->k;
    const int32_t *k = key;
    if (x[0] == -1)
        return TG_HMAP_EMPTY;
    return x[0] == k[0] && x[1] == k[1] && x[2] == k[2] ? TG_HMAP_HIT
                                                        : TG_HMAP_MISS;
}

static const struct tg_hmap_type key4_type = {
    .esize = sizeof(struct key4),
    .empty_byte = 0xff,
    .probe = key4_probe,
    .is_empty = key4_empty,
    .hash = key4_hash,
};

/* Step sizes: mostly `small` keys, every 50th step `large` (a state with
 * many heads); a third of the puts repeat a key of the step. */
static size_t step_keys(size_t s, size_t small, size_t large)
{
    return s % 50 == 49 ? large : small;
}

static NOINLINE uint64_t kset_hand(size_t steps, size_t small, size_t large)
{
    struct kset_hand k = {0};
    kset_hand_grow(&k);
    uint64_t sum = 0, r = 12345;
    for (size_t s = 0; s < steps; s++) {
        kset_hand_clear(&k);
        size_t n = step_keys(s, small, large);
        for (size_t i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int32_t a = (int32_t)((r >> 33) % (n * 2 / 3 + 1));
            int32_t v;
            sum += (uint64_t)kset_hand_put(&k, a, a * 3, 7, (int32_t)i, &v);
            sum += (uint64_t)v;
        }
    }
    free(k.key);
    free(k.stamp);
    return sum;
}

static NOINLINE uint64_t kset_ours(size_t steps, size_t small, size_t large)
{
    struct tg_hmap m;
    if (tg_hmap_init(&m, &key4_type, NULL, 0) != 0)
        exit(1);
    uint64_t sum = 0, r = 12345;
    for (size_t s = 0; s < steps; s++) {
        if (tg_hmap_count(&m) > 0)
            tg_hmap_clear(&m);
        size_t n = step_keys(s, small, large);
        for (size_t i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int32_t a = (int32_t)((r >> 33) % (n * 2 / 3 + 1));
            int32_t key[3] = {a, a * 3, 7};
            int added;
            struct key4 *e = tg_hmap_put(&m, &key4_type, key3_hash(a, a * 3, 7),
                                         key, &added);
            if (added)
                *e = (struct key4){{a, a * 3, 7, (int32_t)i}};
            sum += (uint64_t)added + (uint64_t)e->k[3];
        }
    }
    tg_hmap_free(&m);
    return sum;
}

static void run_kset(struct cell *c, size_t steps, int reps)
{
    c->name = "kset";
    c->hand = c->ours = 1e30;
    double keys = 0;
    for (size_t s = 0; s < steps; s++)
        keys += (double)step_keys(s, 24, 3000);
    c->ops = keys;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        c->sum_hand = kset_hand(steps, 24, 3000);
        double t1 = now();
        c->sum_ours = kset_ours(steps, 24, 3000);
        double t2 = now();
        c->hand = t1 - t0 < c->hand ? t1 - t0 : c->hand;
        c->ours = t2 - t1 < c->ours ? t2 - t1 : c->ours;
    }
}

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr, "usage: bench-hmap [--quick]\n");
            return 2;
        }
    }
    int reps = quick ? 1 : 5;
    struct cell cells[4];
    run_merges(&cells[0], quick ? 20000 : 150000, quick ? 200000 : 4000000,
               reps);
    run_vocab(&cells[1], quick ? 20000 : 150000, quick ? 100000 : 2000000,
              reps);
    run_reqs(&cells[2], 1024, quick ? 20000 : 1000000, reps);
    run_kset(&cells[3], quick ? 2000 : 100000, reps);
    printf("%-8s %12s %12s %10s\n", "case", "hand ns/op", "ours ns/op",
           "ours/hand");
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        const struct cell *c = &cells[i];
        printf("%-8s %12.2f %12.2f %10.3f\n", c->name, 1e9 * c->hand / c->ops,
               1e9 * c->ours / c->ops, c->ours / c->hand);
        if (c->sum_hand != c->sum_ours) {
            fprintf(stderr, "bench-hmap: %s: checksums differ (%llu, %llu)\n",
                    c->name, (unsigned long long)c->sum_hand,
                    (unsigned long long)c->sum_ours);
            bad = 1;
        }
    }
    return bad;
}
