/* test_hmap.c — the hash table (common/base/tg_hmap.h): an empty map,
 * insertion, update and lookup through growth; random insertions and
 * deletions against a model under a well-mixed hash, a clustering one and
 * one that sends every key to the last five slots (probe runs that wrap,
 * backward-shift deletion across the wrap); a reservation that keeps
 * insertions from moving slots; an index table whose slots refer to keys
 * kept elsewhere (the hash callback reads them through ctx); iteration;
 * clear; and a reservation too large to fit refused with the map
 * unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/base/tg_hmap.h"

struct kv {
    uint32_t key; /* UINT32_MAX: empty */
    uint32_t val;
};

enum { MIXED, CLUSTERED, LAST_SLOTS };
static int hash_mode;

static uint64_t key_hash(uint32_t k)
{
    switch (hash_mode) {
    case CLUSTERED: return (uint64_t)(k / 8);   /* runs of 8 equal homes */
    case LAST_SLOTS: return UINT64_MAX - k % 5; /* homes: the last 5 slots */
    default: return tg_hash_u64(k);
    }
}

static int kv_empty(const void *slot)
{
    return ((const struct kv *)slot)->key == UINT32_MAX;
}

static uint64_t kv_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return key_hash(((const struct kv *)slot)->key);
}

static int kv_probe(const void *slot, const void *key)
{
    uint32_t k = ((const struct kv *)slot)->key;
    return k == *(const uint32_t *)key ? TG_HMAP_HIT
           : k == UINT32_MAX           ? TG_HMAP_EMPTY
                                       : TG_HMAP_MISS;
}

static const struct tg_hmap_type kv_type = {
    .esize = sizeof(struct kv),
    .empty_byte = 0xff,
    .probe = kv_probe,
    .is_empty = kv_empty,
    .hash = kv_hash,
};

static struct kv *find(const struct tg_hmap *m, uint32_t k)
{
    return tg_hmap_find(m, &kv_type, key_hash(k), &k);
}

/* Sets k -> v; returns 1 when k was new. */
static int put(struct tg_hmap *m, uint32_t k, uint32_t v)
{
    int added = -1;
    struct kv *e = tg_hmap_put(m, &kv_type, key_hash(k), &k, &added);
    assert_non_null(e);
    assert_true(added == 0 || added == 1);
    if (added)
        e->key = k;
    else
        assert_int_equal(e->key, k);
    e->val = v;
    return added;
}

static void test_empty(void **state)
{
    (void)state;
    struct tg_hmap m;
    assert_int_equal(tg_hmap_init(&m, &kv_type, NULL, 0), 0);
    hash_mode = MIXED;
    assert_null(find(&m, 7));
    assert_int_equal(tg_hmap_count(&m), 0);
    size_t pos = 0;
    assert_null(tg_hmap_next(&m, &pos));
    tg_hmap_clear(&m);
    tg_hmap_free(&m);
    tg_hmap_free(&m); /* twice is fine */
}

static void test_put_find_grow(void **state)
{
    (void)state;
    hash_mode = MIXED;
    struct tg_hmap m;
    assert_int_equal(tg_hmap_init(&m, &kv_type, NULL, 0), 0);
    for (uint32_t k = 0; k < 5000; k++)
        assert_int_equal(put(&m, k * 7919u, k), 1);
    assert_int_equal(tg_hmap_count(&m), 5000);
    /* At most half full. */
    assert_true(2 * tg_hmap_count(&m) <= m.mask + 1);
    for (uint32_t k = 0; k < 5000; k++) {
        struct kv *e = find(&m, k * 7919u);
        assert_non_null(e);
        assert_int_equal(e->val, k);
        assert_null(find(&m, k * 7919u + 1));
    }
    /* An update changes the value in place. */
    assert_int_equal(put(&m, 7919u * 3, 42), 0);
    assert_int_equal(find(&m, 7919u * 3)->val, 42);
    assert_int_equal(tg_hmap_count(&m), 5000);
    tg_hmap_free(&m);
}

/* Every key of the model is found with its value, no other key is, and
 * iteration visits exactly the model's keys. */
static void check_model(const struct tg_hmap *m, const uint32_t *val,
                        const int *in, uint32_t n_keys)
{
    size_t count = 0;
    for (uint32_t k = 0; k < n_keys; k++) {
        struct kv *e = find(m, k);
        if (in[k]) {
            assert_non_null(e);
            assert_int_equal(e->val, val[k]);
            count++;
        } else {
            assert_null(e);
        }
    }
    assert_int_equal(tg_hmap_count(m), count);
    size_t pos = 0, seen = 0;
    for (struct kv *e; (e = tg_hmap_next(m, &pos)) != NULL; seen++) {
        assert_true(e->key < n_keys);
        assert_true(in[e->key]);
    }
    assert_int_equal(seen, count);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void random_ops(int mode)
{
    enum { KEYS = 200 };
    hash_mode = mode;
    uint32_t val[KEYS];
    int in[KEYS] = {0};
    struct tg_hmap m;
    assert_int_equal(tg_hmap_init(&m, &kv_type, NULL, 0), 0);
    for (int step = 0; step < 6000; step++) {
        uint32_t k = rnd(KEYS);
        if (rnd(3) != 0) {
            uint32_t v = rnd(1000000);
            assert_int_equal(put(&m, k, v), !in[k]);
            in[k] = 1;
            val[k] = v;
        } else {
            struct kv *e = find(&m, k);
            assert_int_equal(e != NULL, in[k]);
            if (e != NULL)
                tg_hmap_del(&m, &kv_type, e);
            in[k] = 0;
        }
        if (step % 7 == 0)
            check_model(&m, val, in, KEYS);
    }
    check_model(&m, val, in, KEYS);
    /* Deleting everything leaves every slot empty. */
    for (uint32_t k = 0; k < KEYS; k++) {
        struct kv *e = find(&m, k);
        if (e != NULL)
            tg_hmap_del(&m, &kv_type, e);
    }
    assert_int_equal(tg_hmap_count(&m), 0);
    for (size_t i = 0; i <= m.mask; i++)
        assert_true(kv_empty(m.slots + i * m.esize));
    tg_hmap_free(&m);
}

static void test_random_mixed(void **state)
{
    (void)state;
    random_ops(MIXED);
}

static void test_random_clustered(void **state)
{
    (void)state;
    random_ops(CLUSTERED);
}

static void test_random_wrapping(void **state)
{
    (void)state;
    random_ops(LAST_SLOTS);
}

static void test_reserve_keeps_slots(void **state)
{
    (void)state;
    hash_mode = MIXED;
    struct tg_hmap m;
    assert_int_equal(tg_hmap_init(&m, &kv_type, NULL, 0), 0);
    assert_int_equal(tg_hmap_reserve(&m, 1000), 0);
    unsigned char *slots = m.slots;
    size_t mask = m.mask;
    for (uint32_t k = 0; k < 1000; k++)
        put(&m, k, k);
    assert_ptr_equal(m.slots, slots);
    assert_int_equal(m.mask, mask);
    /* A smaller reservation changes nothing. */
    assert_int_equal(tg_hmap_reserve(&m, 10), 0);
    assert_ptr_equal(m.slots, slots);
    /* One more may grow. */
    put(&m, 1000, 1000);
    assert_non_null(find(&m, 999));
    /* Clear keeps the storage and empties the map. */
    slots = m.slots;
    tg_hmap_clear(&m);
    assert_ptr_equal(m.slots, slots);
    assert_int_equal(tg_hmap_count(&m), 0);
    assert_null(find(&m, 5));
    put(&m, 5, 6);
    assert_int_equal(find(&m, 5)->val, 6);
    tg_hmap_free(&m);
}

static void test_reserve_too_large(void **state)
{
    (void)state;
    hash_mode = MIXED;
    struct tg_hmap m;
    assert_int_equal(tg_hmap_init(&m, &kv_type, NULL, 0), 0);
    put(&m, 1, 2);
    unsigned char *slots = m.slots;
    size_t mask = m.mask;
    assert_int_equal(tg_hmap_reserve(&m, SIZE_MAX / 2), TG_ENOMEM);
    assert_int_equal(tg_hmap_reserve(&m, SIZE_MAX), TG_ENOMEM);
    assert_ptr_equal(m.slots, slots);
    assert_int_equal(m.mask, mask);
    assert_int_equal(find(&m, 1)->val, 2);
    tg_hmap_free(&m);
}

/* ---- an index table: slots hold indices into the caller's strings ---- */

struct names {
    char text[300][12];
    struct tg_hmap index; /* slot: int32_t index into text, -1 empty */
};

struct name_key {
    const struct names *nm;
    const char *s;
};

static int idx_empty(const void *slot)
{
    return *(const int32_t *)slot < 0;
}

static uint64_t idx_hash(const void *slot, void *ctx)
{
    const struct names *nm = ctx;
    const char *s = nm->text[*(const int32_t *)slot];
    return tg_hash_bytes(s, strlen(s));
}

static int idx_probe(const void *slot, const void *key)
{
    int32_t i = *(const int32_t *)slot;
    const struct name_key *k = key;
    if (i < 0)
        return TG_HMAP_EMPTY;
    return strcmp(k->nm->text[i], k->s) == 0 ? TG_HMAP_HIT : TG_HMAP_MISS;
}

static const struct tg_hmap_type idx_type = {
    .esize = sizeof(int32_t),
    .empty_byte = 0xff,
    .probe = idx_probe,
    .is_empty = idx_empty,
    .hash = idx_hash,
};

static void test_index_table(void **state)
{
    (void)state;
    static struct names nm;
    assert_int_equal(tg_hmap_init(&nm.index, &idx_type, &nm, 0), 0);
    for (int32_t i = 0; i < 300; i++) {
        snprintf(nm.text[i], sizeof nm.text[i], "name-%d", (int)(i * 37));
        struct name_key k = {&nm, nm.text[i]};
        int added = 0;
        int32_t *slot = tg_hmap_put(
            &nm.index, &idx_type, tg_hash_bytes(k.s, strlen(k.s)), &k, &added);
        assert_non_null(slot);
        assert_int_equal(added, 1);
        *slot = i;
    }
    for (int32_t i = 0; i < 300; i++) {
        char s[16];
        snprintf(s, sizeof s, "name-%d", (int)(i * 37));
        struct name_key k = {&nm, s};
        int32_t *slot = tg_hmap_find(&nm.index, &idx_type,
                                     tg_hash_bytes(s, strlen(s)), &k);
        assert_non_null(slot);
        assert_int_equal(*slot, i);
        snprintf(s, sizeof s, "name-%d", (int)(i * 37 + 1));
        assert_null(tg_hmap_find(&nm.index, &idx_type,
                                 tg_hash_bytes(s, strlen(s)), &k));
    }
    tg_hmap_free(&nm.index);
}

static void test_hash_bytes(void **state)
{
    (void)state;
    /* Deterministic, length-sensitive, and every byte counts. */
    char a[40];
    memset(a, 'x', sizeof a);
    assert_true(tg_hash_bytes(a, 40) == tg_hash_bytes(a, 40));
    assert_true(tg_hash_bytes(a, 39) != tg_hash_bytes(a, 40));
    assert_true(tg_hash_bytes("", 0) != tg_hash_bytes("\0", 1));
    for (int i = 0; i < 40; i++) {
        uint64_t h0 = tg_hash_bytes(a, 40);
        a[i] ^= 1;
        assert_true(tg_hash_bytes(a, 40) != h0);
        a[i] ^= 1;
    }
    assert_true(tg_hash_u64(1) != tg_hash_u64(2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_put_find_grow),
        cmocka_unit_test(test_random_mixed),
        cmocka_unit_test(test_random_clustered),
        cmocka_unit_test(test_random_wrapping),
        cmocka_unit_test(test_reserve_keeps_slots),
        cmocka_unit_test(test_reserve_too_large),
        cmocka_unit_test(test_index_table),
        cmocka_unit_test(test_hash_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
