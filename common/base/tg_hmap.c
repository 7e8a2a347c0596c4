/* tg_hmap.c — creation, growth, clearing and iteration of the hash table
 * (tg_hmap.h); lookups, insertions and deletions are inline in the
 * header. */
#include "common/base/tg_hmap.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

static unsigned char *slot_at(const struct tg_hmap *m, size_t i)
{
    return m->slots + i * m->esize;
}

/* Slots for n entries at most half full: a power of two >= the minimum,
 * or 0 when its byte size would not fit. */
static size_t slots_for(size_t n, size_t esize)
{
    size_t cap = TG_HMAP_MIN_SLOTS;
    while (cap / 2 < n) {
        if (cap > SIZE_MAX / 2 / esize)
            return 0;
        cap *= 2;
    }
    return cap;
}

int tg_hmap_init(struct tg_hmap *m, const struct tg_hmap_type *t, void *ctx,
                 size_t n)
{
    memset(m, 0, sizeof(*m));
    TG_ASSERT(t->esize > 0);
    size_t cap = slots_for(n, t->esize);
    m->slots = cap > 0 ? malloc(cap * t->esize) : NULL;
    if (m->slots == NULL)
        return TG_ENOMEM;
    memset(m->slots, t->empty_byte, cap * t->esize);
    m->mask = cap - 1;
    m->esize = t->esize;
    m->type = t;
    m->ctx = ctx;
    return 0;
}

void tg_hmap_free(struct tg_hmap *m)
{
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

int tg_hmap_reserve(struct tg_hmap *m, size_t n)
{
    size_t cap = slots_for(n, m->esize);
    if (cap == 0)
        return TG_ENOMEM;
    if (cap <= m->mask + 1)
        return 0;
    unsigned char *s = malloc(cap * m->esize);
    if (s == NULL)
        return TG_ENOMEM;
    memset(s, m->type->empty_byte, cap * m->esize);
    /* Reinsert every entry: the probe runs of a larger table differ. */
    struct tg_hmap old = *m;
    m->slots = s;
    m->mask = cap - 1;
    for (size_t i = 0; i <= old.mask; i++) {
        const unsigned char *e = slot_at(&old, i);
        if (m->type->is_empty(e))
            continue;
        size_t j = (size_t)m->type->hash(e, m->ctx) & m->mask;
        while (!m->type->is_empty(slot_at(m, j)))
            j = (j + 1) & m->mask;
        memcpy(slot_at(m, j), e, m->esize);
    }
    free(old.slots);
    return 0;
}

void tg_hmap_clear(struct tg_hmap *m)
{
    if (m->slots != NULL)
        memset(m->slots, m->type->empty_byte, (m->mask + 1) * m->esize);
    m->n = 0;
}

void *tg_hmap_next(const struct tg_hmap *m, size_t *pos)
{
    for (size_t i = *pos; m->slots != NULL && i <= m->mask; i++) {
        unsigned char *e = slot_at(m, i);
        if (!m->type->is_empty(e)) {
            *pos = i + 1;
            return e;
        }
    }
    *pos = m->mask + 1;
    return NULL;
}

uint64_t tg_hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        b += 8;
        n -= 8;
    }
    /* The 0..7 bytes left, every one of them in w (the length is already
     * in h): two overlapping 4-byte loads, or the first, middle and last
     * byte, instead of a memcpy of a variable size. */
    uint64_t w = 0;
    if (n >= 4) {
        uint32_t lo, hi;
        memcpy(&lo, b, 4);
        memcpy(&hi, b + n - 4, 4);
        w = (uint64_t)lo | (uint64_t)hi << 32;
    } else if (n > 0) {
        w = (uint64_t)b[0] | (uint64_t)b[n >> 1] << 8 |
            (uint64_t)b[n - 1] << 16;
    }
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull; /* murmur3's fmix64 finish */
    h ^= h >> 32;
    return h;
}
