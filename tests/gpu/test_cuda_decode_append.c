/* test_cuda_decode_append.c — the batched decode-step KV append
 * (kernels/cuda/decode_append.h) against the CPU reference
 * tg_ops_cpu.kv_append (one token per sequence, idx NULL), bit for bit:
 *  - a range of shapes (one sequence and head, GQA layouts with shuffled
 *    head -> (group, slot) maps, P = 1, d = 36 (scalar copies), d = 256,
 *    256 sequences, a later layer of a multi-layer table, padded rows
 *    with -1 gaps) on the vector path and, with the pool one element off,
 *    on the scalar path; the whole pool is compared, so writes to any
 *    other place are caught;
 *  - missing destinations (empty row, page id outside the pool, a -1 gap,
 *    token past the row's id slots, bad head_group / head_slot, a row past
 *    the table): those items are skipped, the fault flag is set, every
 *    other item is still written (checked against a host model of the
 *    contract that is itself checked against the CPU op on valid data);
 *  - capture of the append in a CUDA graph, replayed;
 *  - argument errors, which need no device: in a CUDA build they run even
 *    without one, then the program reports skipped (77).
 * Built without CUDA: skipped (77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"
#include "kernels/tg_ops.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/decode_append.h"
#endif

#ifdef TANGRAM_CUDA
static struct tt_xrng rng = {0xda3e39cb94b95bdbull};

struct shape {
    int n_seq, Hkv, Hp, d, P, L, layer;
};

/* A decode table of n_seq sequences x L layers x NG groups (rows
 * (s, l, g) = (s * L + l) * NG + g, as kv_table), every row with 1..5P
 * tokens (the new one included), its pages plus 0..2 slack slots of -1,
 * page ids a random permutation of the pool; the heads shuffled onto
 * (group, slot) pairs. */
struct layout {
    struct shape sh;
    int NG;
    int32_t n_rows;
    int64_t n_slots, n_pages;
    int32_t *head_group, *head_slot; /* (Hkv) */
    int32_t *indptr, *indices, *lens;
};

static void layout_make(struct layout *lo, const struct shape *sh)
{
    memset(lo, 0, sizeof(*lo));
    lo->sh = *sh;
    const int Hkv = sh->Hkv, Hp = sh->Hp, P = sh->P;
    lo->NG = Hkv / Hp;
    lo->n_rows = sh->n_seq * sh->L * lo->NG;
    lo->head_group = tt_xmalloc((size_t)Hkv * sizeof(int32_t));
    lo->head_slot = tt_xmalloc((size_t)Hkv * sizeof(int32_t));
    tt_heads_scatter(&rng, Hkv, Hp, lo->head_group, lo->head_slot);
    lo->indptr = tt_xmalloc((size_t)(lo->n_rows + 1) * sizeof(int32_t));
    lo->lens = tt_xmalloc((size_t)lo->n_rows * sizeof(int32_t));
    int32_t *npg = tt_xmalloc((size_t)lo->n_rows * sizeof(int32_t));
    lo->indptr[0] = 0;
    int64_t pages = 0;
    for (int32_t r = 0; r < lo->n_rows; r++) {
        lo->lens[r] = tt_xrng_int(&rng, 1, 5 * P);
        npg[r] = (lo->lens[r] + P - 1) / P;
        pages += npg[r];
        lo->indptr[r + 1] = lo->indptr[r] + npg[r] + tt_xrng_int(&rng, 0, 2);
    }
    lo->n_slots = lo->indptr[lo->n_rows];
    lo->n_pages = pages + 3; /* a few pages nobody owns */
    int32_t *ids = tt_xmalloc((size_t)lo->n_pages * sizeof(int32_t));
    tt_xrng_perm(&rng, ids, lo->n_pages);
    lo->indices = tt_xmalloc((size_t)lo->n_slots * sizeof(int32_t));
    int64_t next = 0;
    for (int32_t r = 0; r < lo->n_rows; r++)
        for (int32_t i = lo->indptr[r]; i < lo->indptr[r + 1]; i++)
            lo->indices[i] = i - lo->indptr[r] < npg[r] ? ids[next++] : -1;
    free(ids);
    free(npg);
}

static void layout_free(struct layout *lo)
{
    free(lo->head_group);
    free(lo->head_slot);
    free(lo->indptr);
    free(lo->indices);
    free(lo->lens);
}

static size_t pool_elems(const struct layout *lo)
{
    return (size_t)lo->n_pages * (size_t)lo->sh.Hp * 2 * (size_t)lo->sh.P *
           (size_t)lo->sh.d;
}

static int32_t row_of(const struct layout *lo, int s, int g)
{
    return (s * lo->sh.L + lo->sh.layer) * lo->NG + g;
}

/* The CPU op, one sequence at a time: pool (bf16 bits) is updated. */
static void cpu_append(struct tg_backend *b, const struct layout *lo,
                       uint16_t *pool, const float *k, const float *v)
{
    const int Hkv = lo->sh.Hkv, d = lo->sh.d, NG = lo->NG;
    size_t np = pool_elems(lo);
    float *fp = tt_xmalloc(np * sizeof(float));
    for (size_t i = 0; i < np; i++)
        fp[i] = st_bf16_to_f32(pool[i]);
    const int32_t **gp = tt_xmalloc((size_t)NG * sizeof(*gp));
    int32_t *glen = tt_xmalloc((size_t)NG * sizeof(int32_t));
    for (int s = 0; s < lo->sh.n_seq; s++) {
        for (int g = 0; g < NG; g++) {
            int32_t r = row_of(lo, s, g);
            gp[g] = lo->indices + lo->indptr[r];
            glen[g] = lo->lens[r] - 1; /* the append offset */
        }
        struct tg_kv_rows rows = {
            .pool = fp, .heads_per_group = lo->sh.Hp, .page_size = lo->sh.P,
            .head_dim = d, .n_kv_heads = Hkv, .head_group = lo->head_group,
            .head_slot = lo->head_slot, .group_pages = gp, .group_len = glen,
        };
        size_t o = (size_t)s * Hkv * d;
        assert_int_equal(tg_ops_cpu.kv_append(b, &rows, k + o, v + o, 1, NULL,
                                              NULL), 0);
    }
    for (size_t i = 0; i < np; i++)
        pool[i] = st_f32_to_bf16(fp[i]);
    free(fp);
    free(gp);
    free(glen);
}

/* The header's contract on the host, faults included: returns 1 when
 * some item was skipped. hg / hs may differ from the layout's maps (to
 * model bad entries). */
static int model_append(const struct layout *lo, const int32_t *hg,
                        const int32_t *hs, uint16_t *pool, const uint16_t *k,
                        const uint16_t *v)
{
    const int Hkv = lo->sh.Hkv, d = lo->sh.d, P = lo->sh.P, Hp = lo->sh.Hp;
    int fault = 0;
    for (int s = 0; s < lo->sh.n_seq; s++)
        for (int h = 0; h < Hkv; h++) {
            int64_t row = (int64_t)(s * lo->sh.L + lo->sh.layer) * lo->NG + hg[h];
            if (hg[h] < 0 || hs[h] < 0 || hs[h] >= Hp || row >= lo->n_rows) {
                fault = 1;
                continue;
            }
            int64_t t = (int64_t)lo->lens[row] - 1;
            int64_t owned = lo->indptr[row + 1] - lo->indptr[row];
            if (t < 0 || t / P >= owned) {
                fault = 1;
                continue;
            }
            int64_t page = lo->indices[lo->indptr[row] + t / P];
            if (page < 0 || page >= lo->n_pages) {
                fault = 1;
                continue;
            }
            size_t base = (((size_t)page * Hp + (size_t)hs[h]) * 2 * (size_t)P +
                           (size_t)(t % P)) * (size_t)d;
            size_t so = ((size_t)s * Hkv + h) * (size_t)d;
            memcpy(pool + base, k + so, (size_t)d * 2);
            memcpy(pool + base + (size_t)P * d, v + so, (size_t)d * 2);
        }
    return fault;
}

/* Device copies of a layout. */
struct dev {
    int32_t *head_group, *head_slot, *indptr, *indices, *lens, *fault;
    uint16_t *buf, *pool, *k, *v; /* pool = buf (+1 when unaligned) */
};

static void dev_make(struct dev *dv, const struct layout *lo,
                     const uint16_t *pool, const uint16_t *k,
                     const uint16_t *v, int unaligned)
{
    const int Hkv = lo->sh.Hkv;
    size_t np = pool_elems(lo), nk = (size_t)lo->sh.n_seq * Hkv * lo->sh.d;
    dv->head_group = tt_cuda_alloc((size_t)Hkv * 4);
    dv->head_slot = tt_cuda_alloc((size_t)Hkv * 4);
    dv->indptr = tt_cuda_alloc((size_t)(lo->n_rows + 1) * 4);
    dv->indices = tt_cuda_alloc((size_t)lo->n_slots * 4);
    dv->lens = tt_cuda_alloc((size_t)lo->n_rows * 4);
    dv->fault = tt_cuda_alloc(4);
    dv->buf = tt_cuda_alloc((np + 1) * 2);
    dv->pool = dv->buf + (unaligned ? 1 : 0);
    dv->k = tt_cuda_alloc(nk * 2);
    dv->v = tt_cuda_alloc(nk * 2);
    tt_cuda_to_dev(dv->head_group, lo->head_group, (size_t)Hkv * 4);
    tt_cuda_to_dev(dv->head_slot, lo->head_slot, (size_t)Hkv * 4);
    tt_cuda_to_dev(dv->indptr, lo->indptr, (size_t)(lo->n_rows + 1) * 4);
    tt_cuda_to_dev(dv->indices, lo->indices, (size_t)lo->n_slots * 4);
    tt_cuda_to_dev(dv->lens, lo->lens, (size_t)lo->n_rows * 4);
    assert_int_equal(cudaMemset(dv->fault, 0, 4), cudaSuccess);
    tt_cuda_to_dev(dv->pool, pool, np * 2);
    tt_cuda_to_dev(dv->k, k, nk * 2);
    tt_cuda_to_dev(dv->v, v, nk * 2);
}

static void dev_free(struct dev *dv)
{
    cudaFree(dv->head_group);
    cudaFree(dv->head_slot);
    cudaFree(dv->indptr);
    cudaFree(dv->indices);
    cudaFree(dv->lens);
    cudaFree(dv->fault);
    cudaFree(dv->buf);
    cudaFree(dv->k);
    cudaFree(dv->v);
}

static struct tg_cuda_decode_append_args args_of(const struct layout *lo,
                                                 const struct dev *dv)
{
    struct tg_cuda_decode_append_args a;
    memset(&a, 0, sizeof(a));
    a.k = dv->k;
    a.v = dv->v;
    a.n_seq = lo->sh.n_seq;
    a.n_kv_heads = lo->sh.Hkv;
    a.head_dim = lo->sh.d;
    a.heads_per_group = lo->sh.Hp;
    a.page_size = lo->sh.P;
    a.pool = dv->pool;
    a.n_pages = lo->n_pages;
    a.head_group = dv->head_group;
    a.head_slot = dv->head_slot;
    a.table.indptr = dv->indptr;
    a.table.indices = dv->indices;
    a.table.lens = dv->lens;
    a.table.n_rows = lo->n_rows;
    a.table.row_stride = lo->sh.L * lo->NG;
    a.table.row_offset = lo->sh.layer * lo->NG;
    a.fault = dv->fault;
    a.stream = NULL;
    return a;
}

static int32_t fault_read(const struct dev *dv)
{
    int32_t f = -1;
    tt_cuda_to_host(&f, dv->fault, 4);
    return f;
}

/* Random data for one layout: pool junk (bits), k and v bits + floats. */
struct data {
    uint16_t *pool, *kb, *vb;
    float *kf, *vf;
};

static void data_make(struct data *dt, const struct layout *lo)
{
    size_t np = pool_elems(lo), nk = (size_t)lo->sh.n_seq * lo->sh.Hkv * lo->sh.d;
    dt->pool = tt_xmalloc(np * 2);
    dt->kb = tt_xmalloc(nk * 2);
    dt->vb = tt_xmalloc(nk * 2);
    dt->kf = tt_xmalloc(nk * 4);
    dt->vf = tt_xmalloc(nk * 4);
    tt_fill_bf16(&rng, dt->pool, NULL, np, -5.0f, 5.0f);
    tt_fill_bf16(&rng, dt->kb, dt->kf, nk, -1.0f, 1.0f);
    tt_fill_bf16(&rng, dt->vb, dt->vf, nk, -3.0f, 3.0f);
}

static void data_free(struct data *dt)
{
    free(dt->pool);
    free(dt->kb);
    free(dt->vb);
    free(dt->kf);
    free(dt->vf);
}

/* ---- vs the CPU op ------------------------------------------------------ */

static void run_shape(struct tg_backend *cpu, const struct shape *sh,
                      int unaligned)
{
    struct layout lo;
    layout_make(&lo, sh);
    struct data dt;
    data_make(&dt, &lo);
    size_t np = pool_elems(&lo);
    struct dev dv;
    dev_make(&dv, &lo, dt.pool, dt.kb, dt.vb, unaligned);
    struct tg_cuda_decode_append_args a = args_of(&lo, &dv);
    char err[256] = "";
    if (tg_cuda_decode_append(&a, err, sizeof(err)) != 0)
        fail_msg("decode_append: %s", err);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    uint16_t *gpool = tt_xmalloc(np * 2);
    tt_cuda_to_host(gpool, dv.pool, np * 2);
    assert_int_equal(fault_read(&dv), 0);

    /* The CPU op, and the host model agreeing with it on valid data. */
    uint16_t *mpool = tt_xmalloc(np * 2);
    memcpy(mpool, dt.pool, np * 2);
    assert_int_equal(model_append(&lo, lo.head_group, lo.head_slot, mpool,
                                  dt.kb, dt.vb), 0);
    cpu_append(cpu, &lo, dt.pool, dt.kf, dt.vf);
    assert_memory_equal(mpool, dt.pool, np * 2);
    if (memcmp(gpool, dt.pool, np * 2) != 0) {
        size_t i = 0;
        while (gpool[i] == dt.pool[i])
            i++;
        fail_msg("n_seq=%d Hkv=%d Hp=%d d=%d P=%d layer %d/%d%s: pool "
                 "element %zu differs (gpu 0x%04x cpu 0x%04x)", sh->n_seq,
                 sh->Hkv, sh->Hp, sh->d, sh->P, sh->layer, sh->L,
                 unaligned ? " unaligned" : "", i, gpool[i], dt.pool[i]);
    }
    free(gpool);
    free(mpool);
    dev_free(&dv);
    data_free(&dt);
    layout_free(&lo);
}

static void test_append_vs_cpu(void **state)
{
    (void)state;
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(2, &cpu), 0);
    static const struct shape shapes[] = {
        /* n_seq, Hkv, Hp, d, P, L, layer */
        {1, 1, 1, 64, 16, 1, 0},    /* one item */
        {3, 8, 2, 128, 16, 2, 1},   /* later layer of two */
        {17, 8, 4, 128, 16, 4, 3},  /* Llama-3-8B, H_p 4 */
        {64, 4, 1, 64, 1, 1, 0},    /* one token per page */
        {5, 6, 3, 36, 8, 2, 1},     /* d % 8 != 0: scalar copies */
        {9, 8, 8, 256, 32, 1, 0},   /* one group, largest d */
        {256, 8, 2, 128, 16, 1, 0}, /* a big batch */
        {33, 2, 2, 96, 7, 3, 2},    /* odd page size */
    };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        run_shape(cpu, &shapes[s], 0);
        run_shape(cpu, &shapes[s], 1);
    }
    tg_backend_cpu_free(cpu);
}

/* ---- per-head lengths --------------------------------------------------- */

/* Heads of one group holding different counts (adaptive budgets,
 * decode-time compaction): each head's token goes to its own count - 1,
 * not its row's. Checked against a host copy at those slots, and the
 * same model with every head at its row's length is checked against the
 * CPU op first, so the model is the op's contract. */
static void test_append_head_lens(void **state)
{
    (void)state;
    static const struct shape shapes[] = {
        {7, 8, 4, 128, 16, 2, 1},
        {5, 6, 3, 36, 8, 3, 2}, /* scalar copies */
    };
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const struct shape *sh = &shapes[si];
        struct layout lo;
        layout_make(&lo, sh);
        struct data dt;
        data_make(&dt, &lo);
        const int Hkv = sh->Hkv, d = sh->d, P = sh->P, Hp = sh->Hp, L = sh->L;
        int32_t *hl = tt_xmalloc((size_t)sh->n_seq * L * Hkv * 4);
        for (int s = 0; s < sh->n_seq; s++)
            for (int l = 0; l < L; l++)
                for (int h = 0; h < Hkv; h++) {
                    int64_t row = (int64_t)(s * L + l) * lo.NG + lo.head_group[h];
                    hl[(s * L + l) * Hkv + h] = tt_xrng_int(&rng, 1, lo.lens[row]);
                }
        struct dev dv;
        dev_make(&dv, &lo, dt.pool, dt.kb, dt.vb, 0);
        int32_t *d_hl = tt_cuda_upload(hl, (size_t)sh->n_seq * L * Hkv * 4);
        struct tg_cuda_decode_append_args a = args_of(&lo, &dv);
        a.table.head_lens = d_hl;
        a.table.head_stride = L * Hkv;
        a.table.head_offset = sh->layer * Hkv;
        char err[256] = "";
        if (tg_cuda_decode_append(&a, err, sizeof(err)) != 0)
            fail_msg("decode_append: %s", err);
        size_t np = pool_elems(&lo);
        uint16_t *gpool = tt_xmalloc(np * 2);
        tt_cuda_to_host(gpool, dv.pool, np * 2);
        assert_int_equal(fault_read(&dv), 0);
        for (int s = 0; s < sh->n_seq; s++)
            for (int h = 0; h < Hkv; h++) {
                int64_t row = (int64_t)(s * L + sh->layer) * lo.NG + lo.head_group[h];
                int64_t t = hl[(s * L + sh->layer) * Hkv + h] - 1;
                int64_t page = lo.indices[lo.indptr[row] + t / P];
                size_t base = (((size_t)page * Hp + (size_t)lo.head_slot[h]) *
                               2 * (size_t)P + (size_t)(t % P)) * (size_t)d;
                size_t so = ((size_t)s * Hkv + h) * (size_t)d;
                memcpy(dt.pool + base, dt.kb + so, (size_t)d * 2);
                memcpy(dt.pool + base + (size_t)P * d, dt.vb + so, (size_t)d * 2);
            }
        if (memcmp(gpool, dt.pool, np * 2) != 0)
            fail_msg("shape %zu: pool differs from the per-head model", si);
        /* A stride that cannot hold the layer's heads is refused. */
        a.table.head_stride = sh->layer * Hkv + Hkv - 1;
        assert_int_equal(tg_cuda_decode_append(&a, err, sizeof(err)),
                         TG_EINVAL);
        cudaFree(d_hl);
        free(gpool);
        free(hl);
        dev_free(&dv);
        data_free(&dt);
        layout_free(&lo);
    }
}

/* ---- missing destinations ----------------------------------------------- */

enum fault_kind {
    F_EMPTY_ROW,   /* lens 0: t = -1 */
    F_PAGE_RANGE,  /* page id n_pages */
    F_GAP,         /* page id -1 */
    F_PAST_SLOTS,  /* t / P beyond the row's id slots */
    F_BAD_SLOT,    /* head_slot = H_p */
    F_BAD_GROUP,   /* head_group = -1 */
    F_ROW_RANGE,   /* head_group so large the row passes n_rows */
    F_COUNT
};

static void test_append_faults(void **state)
{
    (void)state;
    const struct shape sh = {6, 8, 2, 64, 4, 2, 1};
    for (int kind = 0; kind < F_COUNT; kind++) {
        for (int unaligned = 0; unaligned < 2; unaligned++) {
            struct layout lo;
            layout_make(&lo, &sh);
            struct data dt;
            data_make(&dt, &lo);
            int32_t *hg = tt_xmalloc((size_t)sh.Hkv * 4);
            int32_t *hs = tt_xmalloc((size_t)sh.Hkv * 4);
            memcpy(hg, lo.head_group, (size_t)sh.Hkv * 4);
            memcpy(hs, lo.head_slot, (size_t)sh.Hkv * 4);
            const int s = tt_xrng_int(&rng, 0, sh.n_seq - 1),
                      g = tt_xrng_int(&rng, 0, lo.NG - 1);
            const int h = tt_xrng_int(&rng, 0, sh.Hkv - 1);
            const int32_t r = row_of(&lo, s, g);
            const int32_t last = lo.indptr[r] + (lo.lens[r] - 1) / sh.P;
            switch (kind) {
            case F_EMPTY_ROW: lo.lens[r] = 0; break;
            case F_PAGE_RANGE: lo.indices[last] = (int32_t)lo.n_pages; break;
            case F_GAP: lo.indices[last] = -1; break;
            case F_PAST_SLOTS:
                lo.lens[r] = (lo.indptr[r + 1] - lo.indptr[r]) * sh.P + 1;
                break;
            case F_BAD_SLOT: hs[h] = sh.Hp; break;
            case F_BAD_GROUP: hg[h] = -1; break;
            default: hg[h] = lo.n_rows; break; /* F_ROW_RANGE */
            }
            struct dev dv;
            dev_make(&dv, &lo, dt.pool, dt.kb, dt.vb, unaligned);
            tt_cuda_to_dev(dv.head_group, hg, (size_t)sh.Hkv * 4);
            tt_cuda_to_dev(dv.head_slot, hs, (size_t)sh.Hkv * 4);
            struct tg_cuda_decode_append_args a = args_of(&lo, &dv);
            char err[256] = "";
            assert_int_equal(tg_cuda_decode_append(&a, err, sizeof(err)), 0);
            size_t np = pool_elems(&lo);
            uint16_t *gpool = tt_xmalloc(np * 2);
            tt_cuda_to_host(gpool, dv.pool, np * 2);
            assert_int_equal(fault_read(&dv), 1);
            assert_int_equal(model_append(&lo, hg, hs, dt.pool, dt.kb, dt.vb),
                             1);
            if (memcmp(gpool, dt.pool, np * 2) != 0)
                fail_msg("fault kind %d%s: pool differs from the model", kind,
                         unaligned ? " unaligned" : "");
            /* Without a fault pointer the same call is fine too. */
            a.fault = NULL;
            assert_int_equal(tg_cuda_decode_append(&a, err, sizeof(err)), 0);
            assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
            free(gpool);
            free(hg);
            free(hs);
            dev_free(&dv);
            data_free(&dt);
            layout_free(&lo);
        }
    }
}

/* ---- graph capture ------------------------------------------------------ */

static void test_append_graph(void **state)
{
    (void)state;
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(1, &cpu), 0);
    const struct shape sh = {12, 8, 2, 128, 16, 2, 0};
    struct layout lo;
    layout_make(&lo, &sh);
    struct data dt;
    data_make(&dt, &lo);
    struct dev dv;
    dev_make(&dv, &lo, dt.pool, dt.kb, dt.vb, 0);
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking),
                     cudaSuccess);
    struct tg_cuda_decode_append_args a = args_of(&lo, &dv);
    a.stream = st;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    char err[256] = "";
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal),
                     cudaSuccess);
    int rc = tg_cuda_decode_append(&a, err, sizeof(err));
    assert_int_equal(cudaStreamEndCapture(st, &graph), cudaSuccess);
    assert_int_equal(rc, 0);
    assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    /* Nothing ran during capture: the pool is still the input. */
    size_t np = pool_elems(&lo);
    uint16_t *gpool = tt_xmalloc(np * 2);
    tt_cuda_to_host(gpool, dv.pool, np * 2);
    assert_memory_equal(gpool, dt.pool, np * 2);
    assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    tt_cuda_to_host(gpool, dv.pool, np * 2);
    cpu_append(cpu, &lo, dt.pool, dt.kf, dt.vf);
    assert_memory_equal(gpool, dt.pool, np * 2);
    assert_int_equal(fault_read(&dv), 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    free(gpool);
    dev_free(&dv);
    data_free(&dt);
    layout_free(&lo);
    tg_backend_cpu_free(cpu);
}

/* ---- argument errors (no device needed) --------------------------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    /* Fake device pointers: every call below must fail before using them. */
    uint16_t *fb = (uint16_t *)(uintptr_t)0x1000;
    int32_t *fi = (int32_t *)(uintptr_t)0x3000;
    struct tg_cuda_decode_append_args g;
    memset(&g, 0, sizeof(g));
    g.k = fb;
    g.v = fb;
    g.n_seq = 4;
    g.n_kv_heads = 8;
    g.head_dim = 128;
    g.heads_per_group = 2;
    g.page_size = 16;
    g.pool = fb;
    g.n_pages = 100;
    g.head_group = fi;
    g.head_slot = fi;
    g.table.indptr = fi;
    g.table.indices = fi;
    g.table.lens = fi;
    g.table.n_rows = 4 * 2 * 4; /* 4 seqs x 2 layers x 4 groups */
    g.table.row_stride = 8;
    g.table.row_offset = 4;
    char err[256];
    struct tg_cuda_decode_append_args b;
#define EXPECT_EINVAL(args)                                                 \
    do {                                                                    \
        err[0] = '\0';                                                      \
        assert_int_equal(tg_cuda_decode_append((args), err, sizeof(err)),  \
                         TG_EINVAL);                                        \
        assert_true(strlen(err) > 0);                                       \
    } while (0)
    EXPECT_EINVAL(NULL);
    b = g; b.n_seq = -1; EXPECT_EINVAL(&b);
    b = g; b.n_kv_heads = 0; EXPECT_EINVAL(&b);
    b = g; b.head_dim = 0; EXPECT_EINVAL(&b);
    b = g; b.heads_per_group = 0; EXPECT_EINVAL(&b);
    b = g; b.page_size = 0; EXPECT_EINVAL(&b);
    b = g; b.n_pages = -1; EXPECT_EINVAL(&b);
    b = g; b.table.row_stride = 0; EXPECT_EINVAL(&b);
    b = g; b.table.row_offset = -1; EXPECT_EINVAL(&b);
    b = g; b.table.n_rows = -1; EXPECT_EINVAL(&b);
    b = g; b.k = NULL; EXPECT_EINVAL(&b);
    b = g; b.v = NULL; EXPECT_EINVAL(&b);
    b = g; b.pool = NULL; EXPECT_EINVAL(&b);
    b = g; b.head_group = NULL; EXPECT_EINVAL(&b);
    b = g; b.head_slot = NULL; EXPECT_EINVAL(&b);
    b = g; b.table.indptr = NULL; EXPECT_EINVAL(&b);
    b = g; b.table.indices = NULL; EXPECT_EINVAL(&b);
    b = g; b.table.lens = NULL; EXPECT_EINVAL(&b);
    /* The last sequence's first row (3 * 8 + 4 = 28) must be < n_rows. */
    b = g; b.table.n_rows = 28; EXPECT_EINVAL(&b);
    b = g; b.n_seq = 5; EXPECT_EINVAL(&b);
    b = g; b.n_seq = 1 << 30; b.n_kv_heads = 64; EXPECT_EINVAL(&b);
#undef EXPECT_EINVAL
    /* An empty batch is valid and queues nothing, even without tables. */
    b = g;
    b.n_seq = 0;
    b.k = b.v = b.pool = NULL;
    b.table.indptr = b.table.indices = b.table.lens = NULL;
    assert_int_equal(tg_cuda_decode_append(&b, NULL, 0), 0);
}
#endif

int main(void)
{
#ifdef TANGRAM_CUDA
    /* Argument checks run everywhere: they never reach the device. */
    const struct CMUnitTest host_tests[] = {
        cmocka_unit_test(test_bad_arguments),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_vs_cpu),
        cmocka_unit_test(test_append_faults),
        cmocka_unit_test(test_append_head_lens),
        cmocka_unit_test(test_append_graph),
    };
    return tt_cuda_run_tests("decode_append_args", host_tests,
                             TT_COUNT(host_tests),
                             "no CUDA device: device tests skipped",
                             "decode_append_device", tests, TT_COUNT(tests));
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
