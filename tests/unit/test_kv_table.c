/* test_kv_table.c — the CSR block table: a worked example, the OpenMP
 * build against the plain serial reference (tests/support/tt_kv.h, bit for
 * bit) and against the seqs
 * directly on random batches, token resolution, buffer reuse, and bad
 * input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_budget.h"
#include "common/kv/kv_pool.h"
#include "common/kv/kv_seq.h"
#include "common/kv/kv_table.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_kv.h"

static char err[256];

static void assert_tables_equal(const struct kv_table *a,
                                const struct kv_table *b)
{
    assert_int_equal(a->n_rows, b->n_rows);
    assert_int_equal(a->n_seqs, b->n_seqs);
    assert_int_equal(a->rows_per_seq, b->rows_per_seq);
    assert_int_equal(a->nnz, b->nnz);
    assert_int_equal(a->n_slots, b->n_slots);
    assert_int_equal(a->slack, b->slack);
    assert_memory_equal(a->indptr, b->indptr,
                        ((size_t)a->n_rows + 1) * sizeof(int32_t));
    if (a->n_rows > 0) {
        assert_memory_equal(a->lens, b->lens,
                            (size_t)a->n_rows * sizeof(int32_t));
        assert_memory_equal(a->npages, b->npages,
                            (size_t)a->n_rows * sizeof(int32_t));
    }
    if (a->nnz > 0)
        assert_memory_equal(a->indices, b->indices,
                            (size_t)a->nnz * sizeof(int32_t));
}

/* A dense table equals the reference's CSR. */
static void assert_table_is_csr(const struct kv_table *a,
                                const struct tt_csr *b)
{
    assert_int_equal(a->n_rows, b->n_rows);
    assert_int_equal(a->n_seqs, b->n_seqs);
    assert_int_equal(a->rows_per_seq, b->rows_per_seq);
    assert_int_equal(a->nnz, b->nnz);
    assert_int_equal(a->n_slots, b->nnz);
    assert_int_equal(a->slack, 0);
    assert_memory_equal(a->indptr, b->indptr,
                        ((size_t)a->n_rows + 1) * sizeof(int32_t));
    if (a->n_rows > 0) {
        assert_memory_equal(a->lens, b->lens,
                            (size_t)a->n_rows * sizeof(int32_t));
        assert_memory_equal(a->npages, b->npages,
                            (size_t)a->n_rows * sizeof(int32_t));
    }
    if (a->nnz > 0)
        assert_memory_equal(a->indices, b->indices,
                            (size_t)a->nnz * sizeof(int32_t));
}

/* The table must say exactly what the seqs hold: per row the pages in
 * order, the count and the length; a dense table has no gaps, a padded
 * one -1 in every spare slot. */
static void assert_table_matches(const struct kv_table *t,
                                 const struct kv_layout *lo,
                                 const struct kv_seq *const *seqs, int n)
{
    int32_t row = 0;
    int64_t nnz = 0;
    assert_int_equal(t->n_rows, (int64_t)n * lo->n_layers * lo->n_groups);
    for (int b = 0; b < n; b++)
        for (int l = 0; l < lo->n_layers; l++)
            for (int g = 0; g < lo->n_groups; g++, row++) {
                int32_t room = t->indptr[row + 1] - t->indptr[row];
                int32_t np = 0;
                const int32_t *ids = NULL;
                if (seqs[b] != NULL) {
                    ids = kv_seq_row_ids(seqs[b], lo, l, g, &np);
                    assert_int_equal(t->lens[row],
                                     seqs[b]->filled[l * lo->n_groups + g]);
                } else {
                    assert_int_equal(t->lens[row], 0);
                }
                assert_int_equal(t->npages[row], np);
                if (t->slack == 0)
                    assert_int_equal(room, np);
                else
                    assert_true(room >= np); /* slack shrinks as rows grow */
                if (np > 0)
                    assert_memory_equal(t->indices + t->indptr[row], ids,
                                        (size_t)np * sizeof(int32_t));
                for (int32_t k = np; k < room; k++)
                    assert_int_equal(t->indices[t->indptr[row] + k], -1);
                nnz += np;
            }
    assert_int_equal(row, t->n_rows);
    assert_int_equal(t->nnz, nnz);
    assert_int_equal(t->indptr[row], t->n_slots);
    if (t->slack == 0)
        assert_int_equal(t->n_slots, t->nnz);
}

static void test_table_worked_example(void **state)
{
    (void)state;
    /* L = 1, G = 2, P = 4, C = 8, no forced keys; budgets 0.5 and 1. */
    const double b[2] = {0.5, 1.0};
    struct kv_forced_rule none = {0, 0};
    struct kv_layout lo;
    assert_int_equal(kv_layout_init(&lo, 1, 2, 1, 4, 4, 8, &none, b, err,
                                    sizeof(err)), 0);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 64, err, sizeof(err)), 0);
    struct kv_seq s0, s2;
    assert_int_equal(kv_seq_init(&s0, &lo, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_init(&s2, &lo, err, sizeof(err)), 0);
    /* s0: 10 tokens -> chunks 8 + 2 -> group 0 keeps 4 + 1 = 5 tokens
     * (2 pages: ids 0, 1), group 1 keeps 10 (3 pages: ids 2, 3, 4). */
    assert_int_equal(kv_seq_reserve_prompt(&s0, &lo, &pool, 0, 10, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_seq_commit(&s0, &lo, 8, err, sizeof(err)), 0);
    /* s2: 3 tokens -> group 0 keeps 2 (id 5), group 1 keeps 3 (id 6). */
    assert_int_equal(kv_seq_reserve_prompt(&s2, &lo, &pool, 0, 3, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_seq_commit(&s2, &lo, 3, err, sizeof(err)), 0);
    const struct kv_seq *batch[3] = {&s0, NULL, &s2};

    struct kv_table t;
    assert_int_equal(kv_table_init(&t, 0, 0, err, sizeof(err)), 0);
    assert_int_equal(kv_table_build(&t, &lo, batch, 3, err, sizeof(err)), 0);
    const int32_t indptr[7] = {0, 2, 5, 5, 5, 6, 7};
    const int32_t indices[7] = {0, 1, 2, 3, 4, 5, 6};
    /* Only chunk 1 of s0 is written: 4 of 5 and 8 of 10 tokens. */
    const int32_t lens[6] = {4, 8, 0, 0, 2, 3};
    assert_int_equal(t.n_rows, 6);
    assert_int_equal(t.nnz, 7);
    assert_memory_equal(t.indptr, indptr, sizeof(indptr));
    assert_memory_equal(t.indices, indices, sizeof(indices));
    assert_memory_equal(t.lens, lens, sizeof(lens));

    /* Token 9 of row 1 (s0, group 1) is page 4, slot 1; token 11 is the
     * last slot reserved; token 12 has no page. */
    int32_t page, slot;
    assert_int_equal(kv_table_resolve(&t, 1, 9, &page, &slot), 0);
    assert_int_equal(page, 4);
    assert_int_equal(slot, 1);
    assert_int_equal(kv_table_resolve(&t, 1, 11, &page, &slot), 0);
    assert_int_equal(kv_table_resolve(&t, 1, 12, &page, &slot), TG_ERANGE);
    assert_int_equal(kv_table_resolve(&t, 2, 0, &page, &slot), TG_ERANGE);
    assert_int_equal(kv_table_resolve(&t, 6, 0, &page, &slot), TG_ERANGE);
    assert_int_equal(kv_table_resolve(&t, -1, 0, &page, &slot), TG_ERANGE);
    assert_int_equal(kv_table_resolve(&t, 0, -1, &page, &slot), TG_ERANGE);

    struct tt_csr plain;
    memset(&plain, 0, sizeof(plain));
    assert_int_equal(tt_csr_build(&plain, &lo, batch, 3, err, sizeof(err)), 0);
    assert_table_is_csr(&t, &plain);

    /* An empty batch is a table with no rows. */
    assert_int_equal(kv_table_build(&t, &lo, NULL, 0, err, sizeof(err)), 0);
    assert_int_equal(t.n_rows, 0);
    assert_int_equal(t.nnz, 0);
    assert_int_equal(t.indptr[0], 0);
    assert_int_equal(tt_csr_build(&plain, &lo, NULL, 0, err, sizeof(err)), 0);
    assert_table_is_csr(&t, &plain);

    kv_table_free(&t);
    tt_csr_free(&plain);
    kv_seq_free(&s0, &pool);
    kv_seq_free(&s2, &pool);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

static void test_table_invalid(void **state)
{
    (void)state;
    struct kv_table t;
    memset(&t, 0, sizeof(t));
    kv_table_free(&t);
    kv_table_free(&t);
    assert_int_equal(kv_table_init(&t, -1, 0, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_table_init(&t, 0, (int64_t)INT32_MAX + 1, err,
                                   sizeof(err)), TG_EINVAL);
    kv_table_free(&t);
    assert_int_equal(kv_table_init(&t, 100, 1000, err, sizeof(err)), 0);

    const double b[2] = {0.5, 1.0};
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    struct kv_layout lo, lo3;
    assert_int_equal(kv_layout_init(&lo, 1, 2, 1, 4, 16, 64, &rule, b, err,
                                    sizeof(err)), 0);
    const double b3[3] = {0.5, 1.0, 1.0};
    assert_int_equal(kv_layout_init(&lo3, 1, 3, 1, 4, 16, 64, &rule, b3, err,
                                    sizeof(err)), 0);
    struct kv_seq s;
    assert_int_equal(kv_seq_init(&s, &lo, err, sizeof(err)), 0);
    const struct kv_seq *batch[1] = {&s};
    assert_int_equal(kv_table_build(&t, &lo3, batch, 1, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(kv_table_build(&t, &lo, batch, -1, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(kv_table_build(&t, &lo, NULL, 1, err, sizeof(err)),
                     TG_EINVAL);
    /* A failed build leaves an empty table that still works. */
    assert_int_equal(t.n_rows, 0);
    assert_int_equal(t.nnz, 0);
    assert_int_equal(kv_table_build(&t, &lo, batch, 1, err, sizeof(err)), 0);
    assert_int_equal(t.n_rows, 2);
    assert_int_equal(t.nnz, 0);
    assert_int_equal(kv_table_build_padded(&t, &lo, batch, 1, 2, err,
                                           sizeof(err)), 0);
    assert_int_equal(kv_table_build_padded(&t, &lo3, batch, 1, 2, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(t.n_rows, 0);
    /* The refresh after the failure rebuilds (slack kept) and is right. */
    int64_t builds = t.n_builds;
    assert_int_equal(kv_table_refresh(&t, &lo, batch, 1, err, sizeof(err)), 0);
    assert_int_equal(t.n_builds, builds + 1);
    assert_int_equal(t.n_rows, 2);
    assert_int_equal(t.slack, 2);
    assert_int_equal(t.n_slots, 4);
    kv_seq_free(&s, NULL);
    kv_table_free(&t);
    kv_layout_free(&lo);
    kv_layout_free(&lo3);
}

static uint64_t rng_state;

static uint64_t rng(void)
{
    /* xorshift64* (Vigna 2016). */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static int64_t rnd(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rng() % (uint64_t)(hi - lo + 1));
}

/* Random layouts and batches (with empty slots, truncated rows, decode
 * growth and half-committed prefills); the OpenMP build equals the plain
 * build and the seqs, across rebuilds of the same table object. Large
 * enough batches take the parallel path. */
static void test_table_random_vs_reference(void **state)
{
    (void)state;
    rng_state = 0xdeadbeefcafef00dull;
    struct kv_table t;
    struct tt_csr plain;
    memset(&plain, 0, sizeof(plain));
    assert_int_equal(kv_table_init(&t, 0, 0, err, sizeof(err)), 0);
    for (int iter = 0; iter < 12; iter++) {
        int L = (int)rnd(1, 8), G = (int)rnd(1, 8);
        int P = (int)rnd(1, 32), C = (int)rnd(16, 600);
        double *b = malloc((size_t)(L * G) * sizeof(double));
        assert_non_null(b);
        for (int r = 0; r < L * G; r++)
            b[r] = rnd(0, 5) == 0 ? 1.0 : (double)rnd(5, 1000) / 1000.0;
        struct kv_forced_rule rule = kv_forced_rule_snapkv();
        struct kv_layout lo;
        assert_int_equal(kv_layout_init(&lo, L, G, 1, 8, P, C, &rule, b, err,
                                        sizeof(err)), 0);
        free(b);
        int n = (int)rnd(1, iter % 3 == 0 ? 200 : 20);
        struct kv_pool pool;
        assert_int_equal(kv_pool_init(&pool, 1 << 22, err, sizeof(err)), 0);
        struct kv_seq *seqs = calloc((size_t)n, sizeof(*seqs));
        const struct kv_seq **batch = calloc((size_t)n, sizeof(*batch));
        assert_non_null(seqs);
        assert_non_null(batch);
        for (int s = 0; s < n; s++) {
            assert_int_equal(kv_seq_init(&seqs[s], &lo, err, sizeof(err)), 0);
            if (rnd(0, 6) == 0)
                continue; /* empty slot */
            batch[s] = &seqs[s];
            int64_t n_new = rnd(0, 2000);
            assert_int_equal(kv_seq_reserve_prompt(&seqs[s], &lo, &pool, 0,
                                                   n_new, err, sizeof(err)),
                             0);
            if (n_new > C && rnd(0, 2) == 0) {
                /* Mid-prefill: one chunk written. */
                assert_int_equal(kv_seq_commit(&seqs[s], &lo, C, err,
                                               sizeof(err)), 0);
                continue;
            }
            if (n_new > 0)
                assert_int_equal(kv_seq_commit(&seqs[s], &lo, n_new, err,
                                               sizeof(err)), 0);
            int l = (int)rnd(0, L - 1), g = (int)rnd(0, G - 1);
            assert_int_equal(kv_seq_truncate_row(&seqs[s], &lo, &pool, l, g,
                                                 seqs[s].tokens[l * G + g] / 2,
                                                 err, sizeof(err)), 0);
            assert_int_equal(kv_seq_reserve_decode(&seqs[s], &lo, &pool,
                                                   rnd(1, 40), err,
                                                   sizeof(err)), 0);
        }
        for (int rep = 0; rep < 3; rep++) {
            assert_int_equal(kv_table_build(&t, &lo, batch, n, err,
                                            sizeof(err)), 0);
            assert_int_equal(
                tt_csr_build(&plain, &lo, batch, n, err, sizeof(err)), 0);
            assert_table_is_csr(&t, &plain);
            assert_table_matches(&t, &lo, batch, n);
            assert_int_equal(t.nnz, kv_pool_n_used(&pool));
            /* Every written token resolves to one of the row's pages. */
            for (int k = 0; k < 50 && t.n_rows > 0; k++) {
                int32_t row = (int32_t)rnd(0, t.n_rows - 1);
                if (t.lens[row] == 0)
                    continue;
                int32_t tok = (int32_t)rnd(0, t.lens[row] - 1), page, slot;
                assert_int_equal(kv_table_resolve(&t, row, tok, &page, &slot),
                                 0);
                assert_int_equal(page,
                                 t.indices[t.indptr[row] + tok / P]);
                assert_int_equal(slot, tok % P);
            }
            /* A decode step for every complete request, then rebuild. */
            for (int s = 0; s < n; s++)
                if (batch[s] != NULL &&
                    seqs[s].committed == seqs[s].turn_len)
                    assert_int_equal(kv_seq_reserve_decode(&seqs[s], &lo,
                                                           &pool, 1, err,
                                                           sizeof(err)), 0);
        }
        /* Steady state: rebuilding the same batch does not reallocate. */
        int32_t *ip = t.indptr, *ix = t.indices, *ln = t.lens;
        assert_int_equal(kv_table_build(&t, &lo, batch, n, err, sizeof(err)),
                         0);
        assert_ptr_equal(ip, t.indptr);
        assert_ptr_equal(ix, t.indices);
        assert_ptr_equal(ln, t.lens);
        for (int s = 0; s < n; s++)
            kv_seq_free(&seqs[s], &pool);
        assert_int_equal(kv_pool_n_used(&pool), 0);
        free(seqs);
        free(batch);
        kv_pool_free(&pool);
        kv_layout_free(&lo);
    }
    kv_table_free(&t);
    tt_csr_free(&plain);
}

/* A padded table refreshed through decode steps, new turns, truncations,
 * releases and slot changes always equals the seqs (and a fresh dense
 * build row by row); pure decode steps within the slack never rebuild. */
static void test_table_padded_refresh(void **state)
{
    (void)state;
    rng_state = 0x1234567887654321ull;
    const int L = 3, G = 4, P = 16, n = 24;
    double b[12];
    for (int r = 0; r < L * G; r++)
        b[r] = (double)rnd(10, 1000) / 1000.0;
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    struct kv_layout lo;
    assert_int_equal(kv_layout_init(&lo, L, G, 2, 8, P, 256, &rule, b, err,
                                    sizeof(err)), 0);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 1 << 20, err, sizeof(err)), 0);
    assert_int_equal(kv_pool_debug_track(&pool, err, sizeof(err)), 0);
    struct kv_seq seqs[2 * 24];
    const struct kv_seq *batch[24];
    for (int i = 0; i < 2 * n; i++)
        assert_int_equal(kv_seq_init(&seqs[i], &lo, err, sizeof(err)), 0);
    for (int i = 0; i < n; i++) {
        batch[i] = i % 5 == 4 ? NULL : &seqs[i];
        assert_int_equal(kv_seq_reserve_prompt(&seqs[i], &lo, &pool, 0,
                                               rnd(1, 3000), err, sizeof(err)),
                         0);
        assert_int_equal(kv_seq_commit(&seqs[i], &lo, seqs[i].turn_len, err,
                                       sizeof(err)), 0);
    }
    struct kv_table t, dense;
    memset(&t, 0, sizeof(t));
    assert_int_equal(kv_table_init(&dense, 0, 0, err, sizeof(err)), 0);
    /* Refreshing a zeroed table builds it (dense: slack 0). */
    assert_int_equal(kv_table_refresh(&t, &lo, batch, n, err, sizeof(err)), 0);
    assert_int_equal(t.slack, 0);
    assert_table_matches(&t, &lo, batch, n);
    assert_int_equal(kv_table_build_padded(&t, &lo, batch, n, 4, err,
                                           sizeof(err)), 0);
    assert_table_matches(&t, &lo, batch, n);
    assert_int_equal(kv_table_build_padded(&t, &lo, batch, n, -1, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(kv_table_build_padded(&t, &lo, batch, n, 4, err,
                                           sizeof(err)), 0);
    for (int32_t row = 0; row < t.n_rows; row++)
        assert_true(t.indptr[row + 1] - t.indptr[row] >= t.npages[row] + 4);

    /* 3 * 16 decode tokens need at most 3 new pages per row: no rebuild. */
    int64_t builds = t.n_builds;
    for (int step = 0; step < 48; step++) {
        for (int i = 0; i < n; i++)
            if (batch[i] != NULL)
                assert_int_equal(kv_seq_reserve_decode(&seqs[i], &lo, &pool, 1,
                                                       err, sizeof(err)), 0);
        assert_int_equal(kv_table_refresh(&t, &lo, batch, n, err,
                                          sizeof(err)), 0);
        assert_table_matches(&t, &lo, batch, n);
    }
    assert_int_equal(t.n_builds, builds);
    int32_t page, slot;
    for (int32_t row = 0; row < t.n_rows; row++) {
        if (t.lens[row] == 0)
            continue;
        assert_int_equal(kv_table_resolve(&t, row, t.lens[row] - 1, &page,
                                          &slot), 0);
        assert_int_equal(page, t.indices[t.indptr[row] +
                                         (t.lens[row] - 1) / P]);
        assert_int_equal(kv_table_resolve(&t, row, t.npages[row] * P, &page,
                                          &slot), TG_ERANGE);
    }

    /* Random mix of everything, checked after each refresh. Most rounds
     * are absorbed in place (slot relayout or tail append). */
    builds = t.n_builds;
    for (int round = 0; round < 60; round++) {
        int i = (int)rnd(0, n - 1);
        int kind = (int)rnd(0, 5);
        struct kv_seq *s = (struct kv_seq *)batch[i];
        if (kind == 0 && s != NULL) {
            /* Request ends; its slot gets a fresh, smaller request. */
            assert_int_equal(kv_seq_release(s, &pool), 0);
            assert_int_equal(kv_seq_reserve_prompt(s, &lo, &pool, 0,
                                                   rnd(0, 500), err,
                                                   sizeof(err)), 0);
        } else if (kind == 1) {
            /* Swap the slot to another seq or to empty. */
            int j = (int)rnd(0, 2 * n - 1);
            int used = 0;
            for (int k = 0; k < n; k++)
                used |= batch[k] == &seqs[j];
            batch[i] = rnd(0, 3) == 0 || used ? NULL : &seqs[j];
        } else if (kind == 2 && s != NULL && s->committed == s->turn_len) {
            int l = (int)rnd(0, L - 1), g = (int)rnd(0, G - 1);
            assert_int_equal(kv_seq_truncate_row(s, &lo, &pool, l, g,
                                                 s->tokens[l * G + g] / 3, err,
                                                 sizeof(err)), 0);
        } else if (kind == 3 && s != NULL && s->committed == s->turn_len) {
            assert_int_equal(kv_seq_reserve_prompt(s, &lo, &pool, s->pos,
                                                   rnd(0, 700), err,
                                                   sizeof(err)), 0);
        } else if (s != NULL && s->committed < s->turn_len) {
            assert_int_equal(kv_seq_commit(s, &lo, s->turn_len - s->committed,
                                           err, sizeof(err)), 0);
        } else if (s != NULL) {
            assert_int_equal(kv_seq_reserve_decode(s, &lo, &pool, rnd(1, 20),
                                                   err, sizeof(err)), 0);
        }
        assert_int_equal(kv_table_refresh(&t, &lo, batch, n, err,
                                          sizeof(err)), 0);
        assert_table_matches(&t, &lo, batch, n);
        assert_int_equal(kv_table_build(&dense, &lo, batch, n, err,
                                        sizeof(err)), 0);
        assert_int_equal(dense.nnz, t.nnz);
        assert_memory_equal(dense.lens, t.lens, (size_t)n * L * G * 4);
    }
    assert_true(t.n_builds - builds < 30);
    /* Fewer slots than before: a full rebuild, still exact. */
    assert_int_equal(kv_table_refresh(&t, &lo, batch, n - 3, err,
                                      sizeof(err)), 0);
    assert_table_matches(&t, &lo, batch, n - 3);
    assert_int_equal(kv_table_refresh(&t, &lo, NULL, 1, err, sizeof(err)),
                     TG_EINVAL);

    kv_table_free(&t);
    kv_table_free(&dense);
    for (int i = 0; i < 2 * n; i++)
        kv_seq_free(&seqs[i], &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    assert_int_equal(kv_pool_validate(&pool, err, sizeof(err)), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

/* A device copy kept in step through kv_table_track: starting from a
 * copy of a rebuilt table, taking indptr, npages and lens whole and only
 * the listed ids after each in-place refresh must give the table again.
 * The rows say what a decode table says (kv_table_set_rows: lengths with
 * the appended token, one scratch page per padding slot), and the slots
 * are worker mirrors (kv_seq_row_append / cut / clear of the router's
 * ids), so this is the CUDA decode path's table on the host. */
struct mirror {
    int32_t *indptr, *npages, *lens, *indices;
    int64_t n_rows, n_slots;
};

static void mirror_take(struct mirror *m, const struct kv_table *t)
{
    if (t->rebuilt) {
        free(m->indices);
        m->indices = malloc((size_t)(t->n_slots + 1) * sizeof(int32_t));
        assert_non_null(m->indices);
        memcpy(m->indices, t->indices, (size_t)t->n_slots * sizeof(int32_t));
        m->n_slots = t->n_slots;
    } else {
        assert_int_equal(m->n_slots, t->n_slots); /* regions stay */
        for (int64_t i = 0; i < t->n_dirty; i++) {
            assert_true(t->dirty[i] >= 0 && t->dirty[i] < t->n_slots);
            m->indices[t->dirty[i]] = t->indices[t->dirty[i]];
        }
    }
    size_t rb = (size_t)(t->n_rows + 1) * sizeof(int32_t);
    m->indptr = realloc(m->indptr, rb);
    m->npages = realloc(m->npages, rb);
    m->lens = realloc(m->lens, rb);
    assert_true(m->indptr && m->npages && m->lens);
    memcpy(m->indptr, t->indptr, rb);
    memcpy(m->npages, t->npages, (size_t)t->n_rows * sizeof(int32_t));
    memcpy(m->lens, t->lens, (size_t)t->n_rows * sizeof(int32_t));
    m->n_rows = t->n_rows;
}

/* Every page a reader can reach is the same in the copy. */
static void mirror_check(const struct mirror *m, const struct kv_table *t)
{
    for (int64_t r = 0; r < t->n_rows; r++) {
        assert_int_equal(m->npages[r], t->npages[r]);
        for (int32_t i = 0; i < t->npages[r]; i++)
            assert_int_equal(m->indices[t->indptr[r] + i],
                             t->indices[t->indptr[r] + i]);
    }
}

/* The worker's copy of a router seq, from the ids alone. */
static void mirror_seq(struct kv_seq *w, const struct kv_seq *src,
                       const struct kv_layout *lo)
{
    for (int32_t r = 0; r < src->n_rows; r++) {
        int32_t have = w->n_pages[r], np = src->n_pages[r];
        if (np < have)
            assert_int_equal(kv_seq_row_cut(w, r, np), 0);
        else if (np > have)
            assert_int_equal(kv_seq_row_append(w, r, src->ids + src->off[r] +
                                                      have, np - have), 0);
        w->filled[r] = src->filled[r];
    }
    (void)lo;
}

static void test_table_device_mirror(void **state)
{
    (void)state;
    rng_state = 0x0ddba11cafef00dull;
    const int L = 2, G = 3, P = 16, n = 12, PAD = 1 << 19;
    double b[6] = {0.2, 0.5, 1.0, 0.3, 0.9, 0.05};
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    struct kv_layout lo;
    assert_int_equal(kv_layout_init(&lo, L, G, 2, 8, P, 128, &rule, b, err,
                                    sizeof(err)), 0);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 1 << 18, err, sizeof(err)), 0);
    struct kv_seq router[12], worker[12];
    const struct kv_seq *batch[12];
    for (int i = 0; i < n; i++) {
        assert_int_equal(kv_seq_init(&router[i], &lo, err, sizeof(err)), 0);
        assert_int_equal(kv_seq_init(&worker[i], &lo, err, sizeof(err)), 0);
        assert_int_equal(kv_seq_reserve_prompt(&router[i], &lo, &pool, 0,
                                               rnd(1, 900), err, sizeof(err)),
                         0);
        assert_int_equal(kv_seq_commit(&router[i], &lo, router[i].turn_len,
                                       err, sizeof(err)), 0);
        mirror_seq(&worker[i], &router[i], &lo);
        batch[i] = i % 4 == 3 ? NULL : &worker[i]; /* padding slots */
    }
    /* The worker's mirror reads exactly like the router's seq. */
    struct kv_table a, c;
    assert_int_equal(kv_table_init(&a, 0, 0, err, sizeof(err)), 0);
    assert_int_equal(kv_table_init(&c, 0, 0, err, sizeof(err)), 0);
    const struct kv_seq *rb[12], *wb[12];
    for (int i = 0; i < n; i++) {
        rb[i] = &router[i];
        wb[i] = &worker[i];
    }
    assert_int_equal(kv_table_build(&a, &lo, rb, n, err, sizeof(err)), 0);
    assert_int_equal(kv_table_build(&c, &lo, wb, n, err, sizeof(err)), 0);
    assert_tables_equal(&a, &c);

    struct kv_table t;
    assert_int_equal(kv_table_init(&t, 0, 0, err, sizeof(err)), 0);
    assert_int_equal(kv_table_set_rows(&t, 1, PAD), 0);
    assert_int_equal(kv_table_set_rows(&t, -1, PAD), TG_EINVAL);
    assert_int_equal(kv_table_track(&t, 1), 0);
    assert_int_equal(kv_table_build_padded(&t, &lo, batch, n, 4, err,
                                           sizeof(err)), 0);
    assert_true(t.rebuilt);
    struct mirror m = {0};
    mirror_take(&m, &t);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < L * G; r++) {
            int64_t row = (int64_t)i * L * G + r;
            if (batch[i] == NULL) {
                /* a padding slot: one scratch page, one token */
                assert_int_equal(t.npages[row], 1);
                assert_int_equal(t.lens[row], 1);
                assert_int_equal(t.indices[t.indptr[row]], PAD);
            } else {
                assert_int_equal(t.lens[row], worker[i].filled[r] + 1);
            }
        }
    int in_place = 0, rebuilds = 0;
    for (int step = 0; step < 120; step++) {
        int i = (int)rnd(0, n - 1), kind = (int)rnd(0, 9);
        if (kind == 0) {
            /* the slot's request ends and a new one takes it */
            assert_int_equal(kv_seq_release(&router[i], &pool), 0);
            kv_seq_clear(&worker[i]);
            assert_int_equal(kv_seq_reserve_prompt(&router[i], &lo, &pool, 0,
                                                   rnd(1, 400), err,
                                                   sizeof(err)), 0);
            assert_int_equal(kv_seq_commit(&router[i], &lo,
                                           router[i].turn_len, err,
                                           sizeof(err)), 0);
            batch[i] = &worker[i];
        } else if (kind == 1) {
            batch[i] = batch[i] == NULL ? &worker[i] : NULL;
        } else if (kind == 2) {
            /* a row cut back (decode-time compaction, GVote) */
            int r = (int)rnd(0, L * G - 1);
            assert_int_equal(kv_seq_truncate_row(&router[i], &lo, &pool,
                                                 r / G, r % G,
                                                 router[i].filled[r] / 2, err,
                                                 sizeof(err)), 0);
        } else {
            /* a decode step for everybody in the batch */
            for (int k = 0; k < n; k++)
                if (batch[k] != NULL) {
                    assert_int_equal(kv_seq_reserve_decode(&router[k], &lo,
                                                           &pool, 1, err,
                                                           sizeof(err)), 0);
                    for (int r = 0; r < L * G; r++)
                        router[k].filled[r]++;
                }
        }
        for (int k = 0; k < n; k++)
            mirror_seq(&worker[k], &router[k], &lo);
        uint64_t before = worker[i].epoch;
        (void)before;
        assert_int_equal(kv_table_refresh(&t, &lo, batch, n, err,
                                          sizeof(err)), 0);
        if (t.rebuilt)
            rebuilds++;
        else
            in_place++;
        mirror_take(&m, &t);
        mirror_check(&m, &t);
        /* and the table says what the router's seqs say */
        for (int k = 0; k < n; k++) {
            if (batch[k] == NULL)
                continue;
            for (int r = 0; r < L * G; r++) {
                int64_t row = (int64_t)k * L * G + r;
                assert_int_equal(t.npages[row], router[k].n_pages[r]);
                assert_int_equal(t.lens[row], router[k].filled[r] + 1);
                assert_memory_equal(t.indices + t.indptr[row],
                                    router[k].ids + router[k].off[r],
                                    (size_t)router[k].n_pages[r] * 4);
            }
        }
    }
    assert_true(in_place > rebuilds); /* the per-step path is in place */
    /* A copy that could not be updated forces a rebuild. */
    kv_table_invalidate(&t);
    assert_int_equal(kv_table_refresh(&t, &lo, batch, n, err, sizeof(err)),
                     0);
    assert_true(t.rebuilt);
    /* Other row semantics force one too. */
    assert_int_equal(kv_table_refresh(&t, &lo, batch, n, err, sizeof(err)),
                     0);
    assert_false(t.rebuilt);
    assert_int_equal(kv_table_set_rows(&t, 0, -1), 0);
    assert_int_equal(kv_table_refresh(&t, &lo, batch, n, err, sizeof(err)),
                     0);
    assert_true(t.rebuilt);
    assert_table_matches(&t, &lo, batch, n);
    /* Cutting more than a row holds, or another row, is refused. */
    assert_int_equal(kv_seq_row_cut(&worker[0], 0, worker[0].n_pages[0] + 1),
                     TG_EINVAL);
    assert_int_equal(kv_seq_row_cut(&worker[0], L * G, 0), TG_EINVAL);
    assert_int_equal(kv_seq_row_append(&worker[0], -1, NULL, 0), TG_EINVAL);
    uint64_t e = worker[0].epoch;
    assert_int_equal(kv_seq_row_append(&worker[0], 0, (const int32_t[]){7}, 1),
                     0);
    assert_true(worker[0].epoch == e); /* appends keep the epoch */
    assert_int_equal(kv_seq_row_cut(&worker[0], 0, 0), 0);
    assert_true(worker[0].epoch != e); /* cuts renew it */
    assert_int_equal(worker[0].filled[0], 0);

    free(m.indptr);
    free(m.npages);
    free(m.lens);
    free(m.indices);
    kv_table_free(&t);
    kv_table_free(&a);
    kv_table_free(&c);
    for (int i = 0; i < n; i++) {
        kv_seq_free(&router[i], &pool);
        kv_seq_clear(&worker[i]); /* a mirror's ids are the router's */
        kv_seq_free(&worker[i], NULL);
    }
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

/* A tracked table whose batch grows between in-place refreshes: the
 * refresh scratch (the previous page counts and moved slots) follows the
 * rows and slots of the table now, not of the first tracked refresh. */
static void test_table_track_grows(void **state)
{
    (void)state;
    rng_state = 0x5eedf00d1234ull;
    const int L = 2, G = 3, P = 16, n = 40;
    double b[6] = {0.2, 0.5, 1.0, 0.3, 0.9, 0.05};
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    struct kv_layout lo;
    assert_int_equal(
        kv_layout_init(&lo, L, G, 2, 8, P, 128, &rule, b, err, sizeof(err)), 0);
    struct kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, 1 << 16, err, sizeof(err)), 0);
    struct kv_seq seqs[40];
    const struct kv_seq *batch[40];
    for (int i = 0; i < n; i++) {
        assert_int_equal(kv_seq_init(&seqs[i], &lo, err, sizeof(err)), 0);
        assert_int_equal(kv_seq_reserve_prompt(&seqs[i], &lo, &pool, 0,
                                               rnd(1, 300), err, sizeof(err)),
                         0);
        assert_int_equal(
            kv_seq_commit(&seqs[i], &lo, seqs[i].turn_len, err, sizeof(err)),
            0);
        batch[i] = &seqs[i];
    }
    struct kv_table t;
    assert_int_equal(kv_table_init(&t, 0, 0, err, sizeof(err)), 0);
    assert_int_equal(kv_table_track(&t, 1), 0);
    for (int m = 1; m <= n; m *= 2) {
        /* A batch of m: rebuilt, then refreshed in place twice. */
        assert_int_equal(
            kv_table_build_padded(&t, &lo, batch, m, 4, err, sizeof(err)), 0);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(
                kv_table_refresh(&t, &lo, batch, m, err, sizeof(err)), 0);
            assert_false(t.rebuilt);
            assert_int_equal(t.n_dirty, 0); /* nothing changed */
            assert_true(t.cap_prev >= t.n_rows);
            assert_true(t.cap_moved >= m);
            assert_table_matches(&t, &lo, batch, m);
        }
    }
    kv_table_free(&t);
    for (int i = 0; i < n; i++)
        kv_seq_free(&seqs[i], &pool);
    assert_int_equal(kv_pool_n_used(&pool), 0);
    kv_pool_free(&pool);
    kv_layout_free(&lo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_worked_example),
        cmocka_unit_test(test_table_invalid),
        cmocka_unit_test(test_table_random_vs_reference),
        cmocka_unit_test(test_table_padded_refresh),
        cmocka_unit_test(test_table_device_mirror),
        cmocka_unit_test(test_table_track_grows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
