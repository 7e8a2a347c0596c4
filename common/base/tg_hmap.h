/*
 * tg_hmap.h — the one hash table of tangram: open addressing with linear
 * probing over a power-of-two array of fixed-size slots, at most half
 * full, with backward-shift deletion (no tombstones: a table that sees
 * many deletions probes as short as a fresh one).
 *
 * A slot is the caller's entry type, stored in place (a key and its value,
 * a pointer to an object that holds its key, or the index of an element of
 * the caller's own array). The table never looks inside a slot itself:
 * a struct tg_hmap_type, one static const per table kind, gives the slot
 * size, the byte every byte of an empty slot holds, and three callbacks —
 * a probe that compares a slot with the key sought (TG_HMAP_HIT,
 * TG_HMAP_MISS for another key, TG_HMAP_EMPTY for an empty slot: the key
 * is absent), whether a slot is empty, and the hash of a stored entry
 * (given the map's `ctx`, for slots that only refer to keys kept
 * elsewhere).
 *
 * Lookup, insertion and deletion are inline and name the kind again, so
 * the compiler sees its size and callbacks as constants and inlines the
 * probe into the loop: the hot path costs what a hand-written table costs
 * (tests/bench/bench_hmap.c measures it against the tables this one
 * replaced). A module wraps them in small typed functions:
 *
 *     static int merge_probe(const void *slot, const void *key)
 *     {
 *         const struct merge *m = slot;
 *         uint64_t k = *(const uint64_t *)key;
 *         return m->key == k ? TG_HMAP_HIT
 *                : m->key == EMPTY_KEY ? TG_HMAP_EMPTY : TG_HMAP_MISS;
 *     }
 *     static const struct tg_hmap_type merge_type = {
 *         sizeof(struct merge), 0xff, merge_probe, merge_empty, merge_hash};
 *     const struct merge *m = tg_hmap_find(&t->merges, &merge_type, h, &k);
 *
 * Hashes: the table uses the low bits of the 64-bit hash it is given, so
 * they must be well mixed (tg_hash_u64 for integer keys, tg_hash_bytes for
 * byte strings). Every lookup, insertion and the type's hash callback must
 * agree on an entry's hash.
 *
 * Ownership: the map owns its slot array only. Pointers to slots are
 * valid until the next insertion (which may grow the array) or deletion
 * (which may move later entries back); what a slot points to stays the
 * caller's.
 *
 * Thread-safety: none of its own. Lookups may run on any number of threads
 * at once while nobody modifies the map; everything else needs the
 * caller's exclusion.
 */
#ifndef TG_HMAP_H
#define TG_HMAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a probe function returns for one slot. */
#define TG_HMAP_EMPTY (-1) /* an empty slot: the key is not in the map */
#define TG_HMAP_MISS 0     /* a slot holding another key */
#define TG_HMAP_HIT 1      /* the slot holding the key */

/* A table kind, shared by every map of that kind: a static const, named
 * again in every operation on such a map. Inline operations then read its
 * size and callbacks as constants and inline them. */
struct tg_hmap_type {
    size_t esize;             /* bytes per slot (entry), > 0 */
    unsigned char empty_byte; /* an empty slot is esize bytes of this */
    /* Compares `slot` with `key` (whatever the caller passes to find or
     * put): TG_HMAP_HIT, TG_HMAP_MISS or TG_HMAP_EMPTY. */
    int (*probe)(const void *slot, const void *key);
    /* 1 when `slot` is empty. */
    int (*is_empty)(const void *slot);
    /* The hash of the entry in `slot`, the same the caller gave when it
     * inserted it; `ctx` is the map's. */
    uint64_t (*hash)(const void *slot, void *ctx);
};

/* The smallest slot array a map allocates. */
#define TG_HMAP_MIN_SLOTS 16

struct tg_hmap {
    unsigned char *slots; /* (mask + 1) slots */
    size_t mask;          /* slots - 1 (a power of two minus one) */
    size_t esize;         /* the type's esize */
    size_t n;             /* entries */
    const struct tg_hmap_type *type;
    void *ctx; /* given to type->hash */
};

/* Makes *m an empty map of kind `t` (borrowed: static) passing `ctx` to
 * its hash callback, with room for `n` entries (tg_hmap_reserve; at least
 * TG_HMAP_MIN_SLOTS / 2). Returns 0 or TG_ENOMEM (*m zeroed). A map is
 * used only after a successful init: its slot array always exists, so a
 * lookup never tests for a missing one. */
int tg_hmap_init(struct tg_hmap *m, const struct tg_hmap_type *t, void *ctx,
                 size_t n);

/* Frees the slot array and zeroes *m (init again to reuse it). Safe on a
 * zeroed map. */
void tg_hmap_free(struct tg_hmap *m);

/* Makes room for `n` entries in all: after it, insertions never grow the
 * map (never fail, never move slots) while it holds at most n entries.
 * Returns 0 or TG_ENOMEM (overflow or allocation failure: the map is
 * unchanged). */
int tg_hmap_reserve(struct tg_hmap *m, size_t n);

/* Empties the map, keeping its slot array: O(slots). */
void tg_hmap_clear(struct tg_hmap *m);

/* Iteration: the first entry at slot index >= *pos, with *pos moved past
 * it, or NULL at the end. Start with *pos = 0; the order is the slots'.
 * The map must not change during a walk. */
void *tg_hmap_next(const struct tg_hmap *m, size_t *pos);

/* Entries in the map. */
static inline size_t tg_hmap_count(const struct tg_hmap *m)
{
    return m->n;
}

#if defined(__GNUC__)
#define TG_HMAP__INLINE static inline __attribute__((always_inline))
#else
#define TG_HMAP__INLINE static inline
#endif

/* In the three operations below, t is the kind m was initialised with. */

/* The slot holding `key` (hash h), or NULL. */
TG_HMAP__INLINE void *tg_hmap_find(const struct tg_hmap *m,
                                   const struct tg_hmap_type *t, uint64_t h,
                                   const void *key)
{
    unsigned char *slots = m->slots;
    size_t mask = m->mask;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        unsigned char *s = slots + i * t->esize;
        int r = t->probe(s, key);
        if (r > 0)
            return s;
        if (r < 0)
            return NULL;
    }
}

/* The slot holding `key` (hash h); when absent, an empty slot now counted
 * as an entry, which the caller must fill with the key's entry before the
 * next call on m (*added = 1, else 0; added may be NULL). Grows the map
 * when it would pass half full. NULL: out of memory, map unchanged. */
TG_HMAP__INLINE void *tg_hmap_put(struct tg_hmap *m,
                                  const struct tg_hmap_type *t, uint64_t h,
                                  const void *key, int *added)
{
    if ((m->n + 1) * 2 > m->mask + 1 && tg_hmap_reserve(m, m->n + 1) != 0)
        return NULL;
    unsigned char *slots = m->slots;
    size_t mask = m->mask;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        unsigned char *s = slots + i * t->esize;
        int r = t->probe(s, key);
        if (r == 0)
            continue;
        if (r < 0)
            m->n++;
        if (added != NULL)
            *added = r < 0;
        return s;
    }
}

/* Removes the entry in `slot` (a slot of m holding an entry) and moves
 * later entries of its probe run back over the hole: other slot pointers
 * into m become stale. */
TG_HMAP__INLINE void tg_hmap_del(struct tg_hmap *m,
                                 const struct tg_hmap_type *t, void *slot)
{
    const size_t esize = t->esize;
    unsigned char *slots = m->slots;
    size_t mask = m->mask;
    size_t i = (size_t)((unsigned char *)slot - slots) / esize;
    memset(slot, t->empty_byte, esize);
    m->n--;
    /* An entry after the hole stays when its home slot lies cyclically in
     * (hole, j]: its probe run never crossed the hole. Otherwise it moves
     * into the hole, and the hole to where it was. */
    for (size_t j = (i + 1) & mask; !t->is_empty(slots + j * esize);
         j = (j + 1) & mask) {
        size_t home = (size_t)t->hash(slots + j * esize, m->ctx) & mask;
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        memcpy(slots + i * esize, slots + j * esize, esize);
        memset(slots + j * esize, t->empty_byte, esize);
        i = j;
    }
}

/* ---- hashes ------------------------------------------------------------ */

/* A 64-bit integer mixed so that every output bit depends on every input
 * bit (the splitmix64 finaliser: Steele, Lea and Flood 2014). */
static inline uint64_t tg_hash_u64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A 64-bit hash of n bytes (multiply-xorshift over 8-byte words, a
 * murmur3 finish; p may be NULL when n == 0). Unkeyed and the same in every process: a table whose
 * keys come from clients relies on its caller's bound on their number. */
uint64_t tg_hash_bytes(const void *p, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* TG_HMAP_H */
