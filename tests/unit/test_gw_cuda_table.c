/* test_gw_cuda_table.c — the host side of the CUDA runtime's decode block
 * table (gw_cuda_table_prepare / put_seq / put_pad / commit, gw_cuda.h),
 * which runs in every build: the first batch is built whole with spare
 * slots; the same batch again only stages the page ids appended since;
 * any change of batch size, order, sequence or epoch, a shrunk row, a row
 * outgrowing its slots, a staging buffer too small or a step that was
 * never committed rebuilds; capacities are enforced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"
#include "gpu_worker/gw_cuda.h"

#define ROWS 3      /* table rows per sequence (L * groups) */
#define MAXB 4      /* cache capacity (max_seqs) */
#define MAXP 32     /* pages a test row may hold */
#define SCRATCH 999 /* the padding page */

struct tseq {
    int32_t len[ROWS], n_pages[ROWS], ids[ROWS][MAXP];
    const int32_t *pages[ROWS];
    struct gw_seq seq;
};

static void tseq_init(struct tseq *q, int32_t base, int np, uint64_t epoch)
{
    memset(q, 0, sizeof(*q));
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < MAXP; i++)
            q->ids[r][i] = base + r * MAXP + i;
        q->pages[r] = q->ids[r];
        q->n_pages[r] = np;
        q->len[r] = np * 16 - 3 - r;
    }
    q->seq = (struct gw_seq){.pos = 100, .len = q->len, .pages = q->pages,
                             .n_pages = q->n_pages, .epoch = epoch};
}

struct fixture {
    struct gw_cuda_table t;
    struct gw_cuda_table_cache cache;
    const struct gw_seq *cseq[MAXB];
    uint64_t cepoch[MAXB];
    int32_t sc_pos[64], sc_val[64];
};

static void fixture_init(struct fixture *f, int64_t cap_ids)
{
    memset(f, 0, sizeof(*f));
    f->t.cap_rows = MAXB * ROWS;
    f->t.cap_ids = cap_ids;
    f->t.h_indptr = calloc((size_t)f->t.cap_rows + 1, sizeof(int32_t));
    f->t.h_npages = calloc((size_t)f->t.cap_rows + 1, sizeof(int32_t));
    f->t.h_lens = calloc((size_t)f->t.cap_rows + 1, sizeof(int32_t));
    f->t.h_indices = calloc((size_t)cap_ids, sizeof(int32_t));
    assert_non_null(f->t.h_indices);
    f->cache.seq = f->cseq;
    f->cache.epoch = f->cepoch;
    f->cache.cap = MAXB;
}

static void fixture_free(struct fixture *f)
{
    free(f->t.h_indptr);
    free(f->t.h_npages);
    free(f->t.h_lens);
    free(f->t.h_indices);
}

static int prep(struct fixture *f, struct gw_seq *const *seqs, int n_seq,
                int B, int64_t sc_cap, int64_t *n)
{
    char err[256] = "";
    return gw_cuda_table_prepare(&f->t, &f->cache, seqs, n_seq, B, ROWS,
                                 SCRATCH, f->sc_pos, f->sc_val, sc_cap, n, err,
                                 sizeof(err));
}

/* The mirror holds exactly the rows of the batch, each followed by its
 * spare slots (-1), padding rows on the scratch page. */
static void check_layout(const struct fixture *f, struct tseq **qs, int n_seq,
                         int B)
{
    int64_t at = 0;
    for (int s = 0; s < B; s++)
        for (int r = 0; r < ROWS; r++) {
            int64_t row = (int64_t)s * ROWS + r;
            assert_int_equal(f->t.h_indptr[row], at);
            if (s < n_seq) {
                const struct tseq *q = qs[s];
                assert_int_equal(f->t.h_npages[row], q->n_pages[r]);
                assert_int_equal(f->t.h_lens[row], q->len[r] + 1);
                for (int i = 0; i < q->n_pages[r]; i++)
                    assert_int_equal(f->t.h_indices[at + i], q->ids[r][i]);
                for (int i = 0; i < GW_CUDA_ROW_SLACK; i++)
                    assert_int_equal(f->t.h_indices[at + q->n_pages[r] + i], -1);
                at += q->n_pages[r] + GW_CUDA_ROW_SLACK;
            } else {
                assert_int_equal(f->t.h_npages[row], 1);
                assert_int_equal(f->t.h_lens[row], 1);
                assert_int_equal(f->t.h_indices[at], SCRATCH);
                at += 1;
            }
        }
    assert_int_equal(f->t.h_indptr[(int64_t)B * ROWS], at);
}

static void test_build_then_delta(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f, 512);
    struct tseq a, b;
    tseq_init(&a, 0, 3, 7);
    tseq_init(&b, 1000, 5, 8);
    struct tseq *qs[2] = {&a, &b};
    struct gw_seq *seqs[2] = {&a.seq, &b.seq};
    int64_t n = -1;

    /* first batch (2 sequences padded to 3): built whole */
    assert_int_equal(prep(&f, seqs, 2, 3, 64, &n), 0);
    check_layout(&f, qs, 2, 3);
    assert_int_equal(n, (3 + 5 + 2 * GW_CUDA_ROW_SLACK) * ROWS + ROWS);
    assert_int_equal(f.cache.B, 0); /* not trusted before the commit */
    gw_cuda_table_commit(&f.cache, 3);

    /* the same batch: a decode token per row, a page appended to a's row 1
     * and two to b's row 2 -> only those three ids are staged */
    for (int r = 0; r < ROWS; r++) {
        a.len[r]++;
        b.len[r]++;
    }
    a.n_pages[1] = 4;
    b.n_pages[2] = 7;
    assert_int_equal(prep(&f, seqs, 2, 3, 64, &n), 1);
    assert_int_equal(n, 3);
    int32_t row_a1 = f.t.h_indptr[1], row_b2 = f.t.h_indptr[ROWS + 2];
    assert_int_equal(f.sc_pos[0], row_a1 + 3);
    assert_int_equal(f.sc_val[0], a.ids[1][3]);
    assert_int_equal(f.sc_pos[1], row_b2 + 5);
    assert_int_equal(f.sc_val[1], b.ids[2][5]);
    assert_int_equal(f.sc_pos[2], row_b2 + 6);
    assert_int_equal(f.sc_val[2], b.ids[2][6]);
    /* the mirror now says what the device will hold after the scatter */
    for (int i = 0; i < 3; i++)
        f.t.h_indices[f.sc_pos[i]] = f.sc_val[i];
    {
        for (int r = 0; r < ROWS; r++) {
            assert_int_equal(f.t.h_npages[r], a.n_pages[r]);
            assert_int_equal(f.t.h_lens[r], a.len[r] + 1);
            assert_int_equal(f.t.h_npages[ROWS + r], b.n_pages[r]);
            assert_int_equal(f.t.h_lens[ROWS + r], b.len[r] + 1);
        }
    }
    gw_cuda_table_commit(&f.cache, 3);

    /* nothing appended: an update with nothing to scatter */
    assert_int_equal(prep(&f, seqs, 2, 3, 64, &n), 1);
    assert_int_equal(n, 0);
    gw_cuda_table_commit(&f.cache, 3);

    /* a staging buffer too small for what was appended: rebuild */
    a.n_pages[0] = 5;
    assert_int_equal(prep(&f, seqs, 2, 3, 1, &n), 0);
    check_layout(&f, qs, 2, 3);
    gw_cuda_table_commit(&f.cache, 3);
    fixture_free(&f);
}

static void test_rebuild_rules(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f, 512);
    struct tseq a, b, c;
    tseq_init(&a, 0, 3, 1);
    tseq_init(&b, 1000, 2, 2);
    tseq_init(&c, 2000, 4, 3);
    struct gw_seq *ab[2] = {&a.seq, &b.seq}, *ba[2] = {&b.seq, &a.seq};
    struct gw_seq *ac[2] = {&a.seq, &c.seq};
    struct tseq *qab[2] = {&a, &b};
    int64_t n;
#define BUILT(seqs, ns, B)                                      \
    do {                                                        \
        assert_int_equal(prep(&f, seqs, ns, B, 64, &n), 0);     \
        gw_cuda_table_commit(&f.cache, B);                      \
    } while (0)
#define UPDATED(seqs, ns, B)                                    \
    do {                                                        \
        assert_int_equal(prep(&f, seqs, ns, B, 64, &n), 1);     \
        gw_cuda_table_commit(&f.cache, B);                      \
    } while (0)
    BUILT(ab, 2, 2);
    UPDATED(ab, 2, 2);
    BUILT(ba, 2, 2);    /* another order */
    BUILT(ab, 2, 2);
    BUILT(ac, 2, 2);    /* another sequence */
    BUILT(ab, 2, 2);
    BUILT(ab, 2, 3);    /* another padded size */
    UPDATED(ab, 2, 3);
    BUILT(ab, 1, 3);    /* padding where a sequence was */
    BUILT(ab, 2, 3);
    b.seq.epoch = 42;   /* the slot's page lists were replaced */
    BUILT(ab, 2, 3);
    UPDATED(ab, 2, 3);
    b.n_pages[1] = 1;   /* a row shrank */
    BUILT(ab, 2, 3);
    b.n_pages[1] += GW_CUDA_ROW_SLACK + 1; /* outgrew its spare slots */
    BUILT(ab, 2, 3);
    b.n_pages[1] += GW_CUDA_ROW_SLACK;     /* exactly fills them */
    UPDATED(ab, 2, 3);
    assert_int_equal(n, GW_CUDA_ROW_SLACK);
    /* a step that never committed is not trusted */
    assert_int_equal(prep(&f, ab, 2, 3, 64, &n), 1);
    assert_int_equal(prep(&f, ab, 2, 3, 64, &n), 0);
    check_layout(&f, qab, 2, 3);
#undef BUILT
#undef UPDATED
    fixture_free(&f);
}

static void test_capacity(void **state)
{
    (void)state;
    struct fixture f;
    struct tseq a, b;
    tseq_init(&a, 0, 3, 1);
    tseq_init(&b, 1000, 3, 2);
    struct gw_seq *ab[2] = {&a.seq, &b.seq};
    int64_t n;
    char err[256] = "";
    /* ids: two sequences need 2 * ROWS * (3 + slack); one id short fails,
     * and so does the padding row that no longer fits */
    int64_t need = 2 * ROWS * (3 + GW_CUDA_ROW_SLACK);
    fixture_init(&f, need - 1);
    assert_int_equal(prep(&f, ab, 2, 2, 64, &n), TG_EINVAL);
    assert_int_equal(f.cache.B, 0);
    fixture_free(&f);
    fixture_init(&f, need + ROWS - 1);
    assert_int_equal(gw_cuda_table_prepare(&f.t, &f.cache, ab, 2, 3, ROWS,
                                           SCRATCH, f.sc_pos, f.sc_val, 64, &n,
                                           err, sizeof(err)), TG_EINVAL);
    assert_non_null(strstr(err, "overflow"));
    fixture_free(&f);
    fixture_init(&f, need + ROWS);
    assert_int_equal(prep(&f, ab, 2, 3, 64, &n), 0);
    assert_int_equal(n, need + ROWS);
    /* batch sizes beyond the cache, or fewer rows than sequences */
    assert_int_equal(prep(&f, ab, 2, MAXB + 1, 64, &n), TG_EINVAL);
    assert_int_equal(prep(&f, ab, 2, 1, 64, &n), TG_EINVAL);
    /* put_seq refuses rows past the table */
    int64_t at = 0;
    assert_int_equal(gw_cuda_table_put_seq(&f.t, &a.seq, ROWS,
                                           (MAXB - 1) * ROWS + 1, &at, 0, 0,
                                           err, sizeof(err)), TG_EINVAL);
    fixture_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_then_delta),
        cmocka_unit_test(test_rebuild_rules),
        cmocka_unit_test(test_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
