/* test_gw_cuda_table.c — the host side of the CUDA runtime's decode block
 * table, which runs in every build: the worker's slots (kv_seq mirrors of
 * the router's rows) go through kv_table_refresh and gw_cuda_table_stage
 * exactly as gw_cuda__table_decode sends them, and a "device" array that
 * only ever receives what is staged (the whole table, or the counts plus
 * the scattered ids) must equal the table after every step: the first
 * batch whole, appends as scatters of only the new ids, padding slots on
 * the scratch page, a slot taken by another request laid out again in
 * place, a batch of another size, a scatter list too long for the staging
 * and an invalidated table sent whole; capacities are enforced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/kv/kv_seq.h"
#include "common/kv/kv_table.h"
#include "common/base/tg_err.h"
#include "gpu_worker/cuda/gw_cuda.h"

#define L 2
#define G 2
#define P 16
#define MAXB 4       /* slots of a batch */
#define SCRATCH 4096 /* the padding page, past the pool */

static char err[256];

struct fix {
    struct kv_layout lay;
    struct kv_pool pool;           /* the router's */
    struct kv_seq router[MAXB + 2], worker[MAXB + 2];
    struct kv_table k;             /* the worker's host CSR */
    struct gw_cuda_table t;        /* its pinned mirrors (malloc here) */
    int32_t *d_indptr, *d_npages, *d_lens, *d_indices; /* the "device" */
    int32_t sc_pos[4096], sc_val[4096];
};

static void fix_init(struct fix *f, int64_t cap_rows, int64_t cap_ids)
{
    memset(f, 0, sizeof(*f));
    double b[L * G] = {0.5, 1.0, 0.25, 0.75};
    struct kv_forced_rule rule = kv_forced_rule_snapkv();
    assert_int_equal(kv_layout_init(&f->lay, L, G, 2, 8, P, 64, &rule, b, err,
                                    sizeof(err)), 0);
    assert_int_equal(kv_pool_init(&f->pool, 4000, err, sizeof(err)), 0);
    for (int i = 0; i < MAXB + 2; i++) {
        assert_int_equal(kv_seq_init(&f->router[i], &f->lay, err,
                                     sizeof(err)), 0);
        assert_int_equal(kv_seq_init(&f->worker[i], &f->lay, err,
                                     sizeof(err)), 0);
    }
    assert_int_equal(kv_table_init(&f->k, 0, 0, err, sizeof(err)), 0);
    assert_int_equal(kv_table_set_rows(&f->k, 1, SCRATCH), 0);
    assert_int_equal(kv_table_track(&f->k, 1), 0);
    f->t.cap_rows = cap_rows;
    f->t.cap_ids = cap_ids;
    size_t rb = (size_t)(cap_rows + 1) * 4, ib = (size_t)cap_ids * 4;
    f->t.h_indptr = malloc(rb);
    f->t.h_npages = malloc(rb);
    f->t.h_lens = malloc(rb);
    f->t.h_indices = malloc(ib);
    f->d_indptr = malloc(rb);
    f->d_npages = malloc(rb);
    f->d_lens = malloc(rb);
    f->d_indices = malloc(ib);
    assert_true(f->t.h_indptr && f->t.h_npages && f->t.h_lens &&
                f->t.h_indices && f->d_indptr && f->d_npages && f->d_lens &&
                f->d_indices);
}

static void fix_free(struct fix *f)
{
    for (int i = 0; i < MAXB + 2; i++) {
        kv_seq_free(&f->router[i], &f->pool);
        kv_seq_clear(&f->worker[i]);
        kv_seq_free(&f->worker[i], NULL);
    }
    kv_table_free(&f->k);
    free(f->t.h_indptr);
    free(f->t.h_npages);
    free(f->t.h_lens);
    free(f->t.h_indices);
    free(f->d_indptr);
    free(f->d_npages);
    free(f->d_lens);
    free(f->d_indices);
    kv_pool_free(&f->pool);
    kv_layout_free(&f->lay);
}

/* A request of `tokens` prompt tokens in router seq i, mirrored by the
 * worker from the ids alone (what the plan's page deltas carry). */
static void admit(struct fix *f, int i, int64_t tokens)
{
    assert_int_equal(kv_seq_release(&f->router[i], &f->pool), 0);
    kv_seq_clear(&f->worker[i]);
    assert_int_equal(kv_seq_reserve_prompt(&f->router[i], &f->lay, &f->pool,
                                           0, tokens, err, sizeof(err)), 0);
    assert_int_equal(kv_seq_commit(&f->router[i], &f->lay, tokens, err,
                                   sizeof(err)), 0);
}

static void mirror(struct fix *f, int i)
{
    struct kv_seq *r = &f->router[i], *w = &f->worker[i];
    for (int32_t row = 0; row < r->n_rows; row++) {
        int32_t have = w->n_pages[row], np = r->n_pages[row];
        if (np < have)
            assert_int_equal(kv_seq_row_cut(w, row, np), 0);
        else if (np > have)
            assert_int_equal(kv_seq_row_append(w, row,
                                               r->ids + r->off[row] + have,
                                               np - have), 0);
        w->filled[row] = r->filled[row];
    }
}

/* One decode table step for slots batch[0..B) (NULL: padding), as
 * gw_cuda__table_decode does it; the "device" takes only what is staged.
 * Returns the scatter count (-1: sent whole). */
static int64_t step(struct fix *f, const struct kv_seq **batch, int B,
                    int64_t sc_cap)
{
    int rc = f->k.slack > 0
                 ? kv_table_refresh(&f->k, &f->lay, batch, B, err, sizeof(err))
                 : kv_table_build_padded(&f->k, &f->lay, batch, B, 8, err,
                                         sizeof(err));
    assert_int_equal(rc, 0);
    int64_t n = 0;
    rc = gw_cuda_table_stage(&f->t, &f->k, f->sc_pos, f->sc_val, sc_cap, &n,
                             err, sizeof(err));
    assert_int_equal(rc, 0);
    size_t rows = (size_t)f->k.n_rows;
    memcpy(f->d_indptr, f->t.h_indptr, (rows + 1) * 4);
    memcpy(f->d_npages, f->t.h_npages, rows * 4);
    memcpy(f->d_lens, f->t.h_lens, rows * 4);
    if (n < 0)
        memcpy(f->d_indices, f->t.h_indices, (size_t)f->k.n_slots * 4);
    else
        for (int64_t i = 0; i < n; i++)
            f->d_indices[f->sc_pos[i]] = f->sc_val[i];
    /* What a kernel reads: every real row's pages and its length with the
     * appended token; padding rows one token on the scratch page. */
    for (int b = 0; b < B; b++)
        for (int r = 0; r < L * G; r++) {
            int64_t row = (int64_t)b * L * G + r;
            const int32_t *ids = f->d_indices + f->d_indptr[row];
            if (batch[b] == NULL) {
                assert_int_equal(f->d_npages[row], 1);
                assert_int_equal(f->d_lens[row], 1);
                assert_int_equal(ids[0], SCRATCH);
                continue;
            }
            const struct kv_seq *s = batch[b];
            assert_int_equal(f->d_npages[row], s->n_pages[r]);
            assert_int_equal(f->d_lens[row], s->filled[r] + 1);
            assert_memory_equal(ids, s->ids + s->off[r],
                                (size_t)s->n_pages[r] * 4);
        }
    return n;
}

static void decode_token(struct fix *f, int i)
{
    assert_int_equal(kv_seq_reserve_decode(&f->router[i], &f->lay, &f->pool,
                                           1, err, sizeof(err)), 0);
    for (int r = 0; r < L * G; r++)
        f->router[i].filled[r]++;
    mirror(f, i);
}

static void test_build_then_delta(void **state)
{
    (void)state;
    static struct fix f;
    fix_init(&f, 64, 4096);
    admit(&f, 0, 40);
    admit(&f, 1, 100);
    mirror(&f, 0);
    mirror(&f, 1);
    const struct kv_seq *batch[3] = {&f.worker[0], &f.worker[1], NULL};
    assert_int_equal(step(&f, batch, 3, 4096), -1); /* first: whole */
    int64_t scattered = 0, deltas = 0;
    for (int s = 0; s < 40; s++) {
        decode_token(&f, 0);
        decode_token(&f, 1);
        int64_t n = step(&f, batch, 3, 4096);
        assert_true(n >= 0); /* appends fit the slack: a scatter */
        scattered += n;
        deltas++;
    }
    /* 40 tokens cross 2 or 3 page boundaries per row: only those ids. */
    assert_true(scattered > 0 && scattered <= 2 * L * G * 3);
    assert_int_equal(deltas, 40);
    fix_free(&f);
}

static void test_changes(void **state)
{
    (void)state;
    static struct fix f;
    fix_init(&f, 64, 4096);
    for (int i = 0; i < 3; i++) {
        admit(&f, i, 30 + 20 * i);
        mirror(&f, i);
    }
    const struct kv_seq *batch[4] = {&f.worker[0], &f.worker[1],
                                     &f.worker[2], NULL};
    assert_int_equal(step(&f, batch, 4, 4096), -1);
    /* Slot 1's request ends and a shorter one takes it: laid out again in
     * its own region, sent as the ids of that slot alone. */
    admit(&f, 1, 10);
    mirror(&f, 1);
    int64_t n = step(&f, batch, 4, 4096);
    assert_true(n >= 0);
    /* A padding slot gets a request, a request becomes padding. */
    admit(&f, 3, 20);
    mirror(&f, 3);
    batch[3] = &f.worker[3];
    batch[0] = NULL;
    assert_true(step(&f, batch, 4, 4096) >= -1);
    /* A row cut back (decode-time compaction): the cut renews the epoch. */
    assert_int_equal(kv_seq_truncate_row(&f.router[2], &f.lay, &f.pool, 0, 0,
                                         4, err, sizeof(err)), 0);
    mirror(&f, 2);
    assert_true(step(&f, batch, 4, 4096) >= -1);
    /* A batch of another size: whole. */
    assert_int_equal(step(&f, batch, 3, 4096), -1);
    /* More changed ids than the staging holds: whole. */
    admit(&f, 2, 200);
    mirror(&f, 2);
    assert_int_equal(step(&f, batch, 3, 1), -1);
    /* A step that failed after staging: the table is invalidated and the
     * next one sent whole even with nothing changed. */
    kv_table_invalidate(&f.k);
    assert_int_equal(step(&f, batch, 3, 4096), -1);
    assert_int_equal(step(&f, batch, 3, 4096), 0); /* nothing changed */
    fix_free(&f);
}

static void test_capacity(void **state)
{
    (void)state;
    static struct fix f;
    fix_init(&f, 2 * L * G, 4096); /* two slots' rows */
    admit(&f, 0, 40);
    mirror(&f, 0);
    const struct kv_seq *batch[3] = {&f.worker[0], NULL, NULL};
    assert_int_equal(kv_table_build_padded(&f.k, &f.lay, batch, 3, 8, err,
                                           sizeof(err)), 0);
    int64_t n = 0;
    assert_int_equal(gw_cuda_table_stage(&f.t, &f.k, f.sc_pos, f.sc_val, 64,
                                         &n, err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "overflow"));
    fix_free(&f);
    fix_init(&f, 64, 8); /* too few ids */
    admit(&f, 0, 400);
    mirror(&f, 0);
    assert_int_equal(kv_table_build_padded(&f.k, &f.lay, batch, 1, 8, err,
                                           sizeof(err)), 0);
    assert_int_equal(gw_cuda_table_stage(&f.t, &f.k, f.sc_pos, f.sc_val, 64,
                                         &n, err, sizeof(err)), TG_EINVAL);
    fix_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_then_delta),
        cmocka_unit_test(test_changes),
        cmocka_unit_test(test_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
