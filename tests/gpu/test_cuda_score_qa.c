/* test_cuda_score_qa.c — the device query-agnostic scores (kernels/cuda/
 * score_qa.h) against the CPU reference tg_ops_cpu.score on the same
 * bf16-rounded data:
 *  - keydiff over fixed edge shapes (one key, d not a multiple of 32,
 *    d = 256, the 2048-key limit, zero keys, identical keys) and random
 *    shapes (n 1..2048, d 64/96/128, Hkv 1..8, G 1..8):
 *    |gpu - cpu| <= 2e-5 (scores are cosines in [-1, 1]);
 *  - expected_attention over the same kind of shapes and windows 32, 5, 1
 *    and 0 (whole chunk), zero value rows:
 *    |gpu - cpu| <= 2e-5 |cpu| + 1e-7 max_j |cpu_h|;
 *  - tg_cuda_score_qa_score routing: snapkv through it equals
 *    tg_cuda_compress_score_snapkv bit for bit; every method is deterministic
 *    (two runs bit-identical); n = 0 queues nothing and leaves the output
 *    alone;
 *  - argument errors, which need no device: in a CUDA build they run even
 *    without one, then the program reports skipped (77).
 * Built without CUDA: skipped (77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/tg_ops.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/score_qa.h"
#endif

#ifdef TANGRAM_CUDA
static struct tt_xrng rng = {0x5851f42d4c957f2dull};

/* Special contents of a chunk, to reach the zero branches. */
enum special {
    SP_NONE = 0,
    SP_ZERO_ROWS,  /* a few keys (keydiff) / value rows (EA) all zero */
    SP_SAME_KEYS,  /* every key of a head equal: keydiff scores all -1 */
};

struct shape {
    int n, Hq, Hkv, d, window;
    enum special sp;
};

/* One chunk on the host and the device. */
struct chunk_data {
    size_t nq, nk;
    uint16_t *qb, *kb, *vb;
    float *qf, *kf, *vf;
    uint16_t *dq, *dk, *dv;
};

static void chunk_make(struct chunk_data *cd, const struct shape *sh)
{
    const int n = sh->n, d = sh->d, Hkv = sh->Hkv;
    cd->nq = (size_t)n * sh->Hq * d;
    cd->nk = (size_t)n * Hkv * d;
    cd->qb = tt_xmalloc(cd->nq * 2);
    cd->kb = tt_xmalloc(cd->nk * 2);
    cd->vb = tt_xmalloc(cd->nk * 2);
    cd->qf = tt_xmalloc(cd->nq * 4);
    cd->kf = tt_xmalloc(cd->nk * 4);
    cd->vf = tt_xmalloc(cd->nk * 4);
    tt_fill_bf16(&rng, cd->qb, cd->qf, cd->nq, -2.0f, 2.0f);
    /* Keys with a shared offset, as real keys have a dominant direction,
     * plus noise: keydiff scores then spread over a real range. */
    float bias = tt_xrng_int(&rng, 0, 1) ? 0.0f : 0.4f;
    tt_fill_bf16(&rng, cd->kb, cd->kf, cd->nk, -1.0f + bias, 1.0f + bias);
    tt_fill_bf16(&rng, cd->vb, cd->vf, cd->nk, -3.0f, 3.0f);
    if (sh->sp == SP_ZERO_ROWS && n > 0) {
        for (int t = 0; t < 3; t++) {
            int j = tt_xrng_int(&rng, 0, n - 1),
                h = tt_xrng_int(&rng, 0, Hkv - 1);
            size_t o = ((size_t)j * Hkv + h) * d;
            memset(cd->kb + o, 0, (size_t)d * 2);
            memset(cd->kf + o, 0, (size_t)d * 4);
            j = tt_xrng_int(&rng, 0, n - 1);
            o = ((size_t)j * Hkv + h) * d;
            memset(cd->vb + o, 0, (size_t)d * 2);
            memset(cd->vf + o, 0, (size_t)d * 4);
        }
    }
    if (sh->sp == SP_SAME_KEYS)
        for (int j = 1; j < n; j++) {
            memcpy(cd->kb + (size_t)j * Hkv * d, cd->kb, (size_t)Hkv * d * 2);
            memcpy(cd->kf + (size_t)j * Hkv * d, cd->kf, (size_t)Hkv * d * 4);
        }
    cd->dq = tt_cuda_alloc(cd->nq * 2);
    cd->dk = tt_cuda_alloc(cd->nk * 2);
    cd->dv = tt_cuda_alloc(cd->nk * 2);
    tt_cuda_to_dev(cd->dq, cd->qb, cd->nq * 2);
    tt_cuda_to_dev(cd->dk, cd->kb, cd->nk * 2);
    tt_cuda_to_dev(cd->dv, cd->vb, cd->nk * 2);
}

static void chunk_free(struct chunk_data *cd)
{
    free(cd->qb); free(cd->kb); free(cd->vb);
    free(cd->qf); free(cd->kf); free(cd->vf);
    cudaFree(cd->dq);
    cudaFree(cd->dk);
    cudaFree(cd->dv);
}

static struct tg_cuda_compress_chunk chunk_view(const struct chunk_data *cd,
                                                const struct shape *sh)
{
    struct tg_cuda_compress_chunk c = {
        .q = cd->dq, .k = cd->dk, .v = cd->dv, .n = sh->n,
        .n_q_heads = sh->Hq, .n_kv_heads = sh->Hkv, .head_dim = sh->d,
        .start = 0, .window = sh->window, .n_sink = 4,
        .scale = 1.0f / sqrtf((float)sh->d),
    };
    return c;
}

/* Runs `method` on the device (twice, checking determinism) and on the CPU
 * and compares within the method's tolerance. */
static void run_shape(struct tg_backend *cpu, enum tg_score_method method,
                      const struct shape *sh)
{
    const int n = sh->n, Hkv = sh->Hkv;
    struct chunk_data cd;
    chunk_make(&cd, sh);
    struct tg_cuda_compress_chunk c = chunk_view(&cd, sh);
    if (method == TG_SCORE_KEYDIFF)
        c.q = c.v = NULL; /* keydiff must not read them */
    size_t wsb = tg_cuda_score_qa_workspace_bytes(method, n, sh->Hq, Hkv, sh->d,
                                                  sh->window);
    assert_true(wsb > 0);
    void *ws = tt_cuda_alloc(wsb);
    const size_t sb = (size_t)Hkv * n * sizeof(float);
    float *ds = tt_cuda_alloc(sb);
    assert_int_equal(cudaMemset(ds, 0xff, sb), cudaSuccess); /* NaN */
    assert_int_equal(tg_cuda_score_qa_score(method, &c, ds, ws, wsb, NULL), 0);
    float *gs = tt_xmalloc(sb), *gs2 = tt_xmalloc(sb), *rs = tt_xmalloc(sb);
    tt_cuda_to_host(gs, ds, sb);
    assert_int_equal(cudaMemset(ds, 0xff, sb), cudaSuccess);
    assert_int_equal(tg_cuda_score_qa_score(method, &c, ds, ws, wsb, NULL), 0);
    tt_cuda_to_host(gs2, ds, sb);
    if (memcmp(gs, gs2, sb) != 0)
        fail_msg("method %d n=%d: two runs differ", (int)method, n);

    assert_int_equal(tg_ops_cpu.score(cpu, method, cd.qf, cd.kf, cd.vf, n,
                                      sh->Hq, Hkv, sh->d, sh->window, c.scale,
                                      rs), 0);
    for (int h = 0; h < Hkv; h++) {
        float mx = 0.0f;
        for (int j = 0; j < n; j++)
            mx = fmaxf(mx, fabsf(rs[(size_t)h * n + j]));
        for (int j = 0; j < n; j++) {
            float a = gs[(size_t)h * n + j], r = rs[(size_t)h * n + j];
            float tol = method == TG_SCORE_KEYDIFF
                            ? 2e-5f
                            : 2e-5f * fabsf(r) + 1e-7f * mx;
            if (!(fabsf(a - r) <= tol))
                fail_msg("method %d n=%d Hq=%d Hkv=%d d=%d window=%d: "
                         "score[%d][%d] gpu %.9g cpu %.9g", (int)method, n,
                         sh->Hq, Hkv, sh->d, sh->window, h, j, (double)a,
                         (double)r);
        }
    }
    if (method == TG_SCORE_KEYDIFF && sh->sp == SP_SAME_KEYS)
        for (size_t i = 0; i < (size_t)Hkv * n; i++)
            assert_true(fabsf(gs[i] + 1.0f) <= 1e-5f);

    cudaFree(ws);
    cudaFree(ds);
    free(gs);
    free(gs2);
    free(rs);
    chunk_free(&cd);
}

/* Fixed edge shapes plus `n_random` random ones. */
static void run_method(enum tg_score_method method, int n_random)
{
    struct tg_backend *cpu = NULL;
    assert_int_equal(tg_backend_cpu_new(2, &cpu), 0);
    static const struct shape fixed[] = {
        /* n, Hq, Hkv, d, window, special */
        {1, 4, 2, 64, 32, SP_NONE},         /* one key */
        {2, 1, 1, 64, 32, SP_NONE},         /* G = 1, Hkv = 1 */
        {7, 8, 4, 36, 5, SP_NONE},          /* d % 32 != 0, short window */
        {65, 6, 3, 80, 1, SP_ZERO_ROWS},    /* tile edge, W = 1, zero rows */
        {129, 8, 8, 128, 32, SP_ZERO_ROWS}, /* zero keys / values */
        {40, 16, 2, 64, 32, SP_SAME_KEYS},  /* identical keys */
        {64, 4, 2, 256, 32, SP_NONE},       /* largest head_dim */
        {300, 12, 4, 96, 0, SP_NONE},       /* window 0: whole chunk */
        {512, 32, 8, 128, 32, SP_NONE},     /* Llama-3-8B chunk */
        {2048, 8, 2, 128, 32, SP_NONE},     /* the chunk limit */
    };
    for (size_t s = 0; s < sizeof(fixed) / sizeof(fixed[0]); s++)
        run_shape(cpu, method, &fixed[s]);
    static const int ds[] = {64, 96, 128};
    for (int t = 0; t < n_random; t++) {
        struct shape sh;
        sh.Hkv = tt_xrng_int(&rng, 1, 8);
        sh.Hq = sh.Hkv * tt_xrng_int(&rng, 1, 8);
        sh.d = ds[tt_xrng_int(&rng, 0, 2)];
        /* Mostly short chunks, some long (the CPU reference of
         * expected_attention costs G * W * n * d per head). */
        sh.n = tt_xrng_int(&rng, 0, 3) == 0 ? tt_xrng_int(&rng, 1000, 2048)
                                            : tt_xrng_int(&rng, 1, 600);
        sh.window = tt_xrng_int(&rng, 0, 4) == 0 && sh.n <= 256 ? 0 : 32;
        sh.sp = tt_xrng_int(&rng, 0, 3) == 0 ? SP_ZERO_ROWS : SP_NONE;
        run_shape(cpu, method, &sh);
    }
    tg_backend_cpu_free(cpu);
}

static void test_keydiff_vs_cpu(void **state)
{
    (void)state;
    run_method(TG_SCORE_KEYDIFF, 16);
}

static void test_expected_attention_vs_cpu(void **state)
{
    (void)state;
    run_method(TG_SCORE_EXPECTED_ATTENTION, 12);
}

/* snapkv through tg_cuda_score_qa_score is tg_cuda_compress_score_snapkv; n = 0
 * writes nothing. */
static void test_routing(void **state)
{
    (void)state;
    const struct shape sh = {100, 8, 2, 64, 32, SP_NONE};
    struct chunk_data cd;
    chunk_make(&cd, &sh);
    struct tg_cuda_compress_chunk c = chunk_view(&cd, &sh);
    size_t wsb = tg_cuda_score_qa_workspace_bytes(TG_SCORE_SNAPKV, sh.n, sh.Hq,
                                                  sh.Hkv, sh.d, sh.window);
    assert_int_equal(
        wsb, tg_cuda_compress_workspace_bytes(sh.n, sh.Hq, sh.Hkv, sh.window));
    void *ws = tt_cuda_alloc(wsb);
    const size_t sb = (size_t)sh.Hkv * sh.n * sizeof(float);
    float *ds = tt_cuda_alloc(sb);
    float *a = tt_xmalloc(sb), *b = tt_xmalloc(sb);
    assert_int_equal(
        tg_cuda_score_qa_score(TG_SCORE_SNAPKV, &c, ds, ws, wsb, NULL), 0);
    tt_cuda_to_host(a, ds, sb);
    assert_int_equal(cudaMemset(ds, 0, sb), cudaSuccess);
    assert_int_equal(tg_cuda_compress_score_snapkv(&c, ds, ws, wsb, NULL), 0);
    tt_cuda_to_host(b, ds, sb);
    assert_memory_equal(a, b, sb);

    /* An empty chunk queues nothing: the scores keep their bytes. */
    const enum tg_score_method ms[] = {TG_SCORE_SNAPKV, TG_SCORE_KEYDIFF,
                                       TG_SCORE_EXPECTED_ATTENTION};
    for (int m = 0; m < 3; m++) {
        struct tg_cuda_compress_chunk e = c;
        e.n = 0;
        assert_int_equal(tg_cuda_score_qa_score(ms[m], &e, ds, ws, wsb, NULL),
                         0);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        tt_cuda_to_host(a, ds, sb);
        assert_memory_equal(a, b, sb);
    }
    cudaFree(ws);
    cudaFree(ds);
    free(a);
    free(b);
    chunk_free(&cd);
}

/* ---- argument errors (no device needed) --------------------------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    /* Fake device pointers: every call below must fail before using them. */
    uint16_t *fq = (uint16_t *)(uintptr_t)0x1000;
    float *fs = (float *)(uintptr_t)0x2000;
    void *fw = (void *)(uintptr_t)0x4000;
    struct tg_cuda_compress_chunk c = {
        .q = fq, .k = fq, .v = fq, .n = 100, .n_q_heads = 8, .n_kv_heads = 2,
        .head_dim = 64, .start = 0, .window = 32, .n_sink = 4,
        .scale = 0.125f,
    };
    const enum tg_score_method KD = TG_SCORE_KEYDIFF;
    const enum tg_score_method EA = TG_SCORE_EXPECTED_ATTENTION;

    /* Workspace sizes. */
    size_t kd = tg_cuda_score_qa_workspace_bytes(KD, 100, 8, 2, 64, 32);
    assert_int_equal(kd, (size_t)2 * 2 * 64 * sizeof(float)); /* 2 tiles */
    assert_int_equal(tg_cuda_score_qa_workspace_bytes(KD, 64, 8, 2, 64, 32),
                     (size_t)2 * 1 * 64 * sizeof(float));
    size_t ea = tg_cuda_score_qa_workspace_bytes(EA, 100, 8, 2, 64, 32);
    /* mu 8*64 floats = 2048 B, z 8*100 floats = 3200 -> 3328 B, stats
     * 64 -> 256 B. */
    assert_int_equal(ea, (size_t)2048 + 3328 + 256);
    assert_int_equal(
        tg_cuda_score_qa_workspace_bytes(TG_SCORE_SNAPKV, 100, 8, 2, 64, 32),
        tg_cuda_compress_workspace_bytes(100, 8, 2, 32));
    assert_int_equal(tg_cuda_score_qa_workspace_bytes(KD, 0, 8, 2, 64, 32), 0);
    assert_int_equal(tg_cuda_score_qa_workspace_bytes(KD, 100, 6, 4, 64, 32),
                     0);
    assert_int_equal(tg_cuda_score_qa_workspace_bytes(
                         EA, TG_CUDA_COMPRESS_MAX_CHUNK + 1, 8, 2, 64, 32),
                     0);
    assert_int_equal(tg_cuda_score_qa_workspace_bytes(
                         EA, 100, 8, 2, TG_CUDA_COMPRESS_MAX_HEAD_DIM + 1, 32),
                     0);
    assert_int_equal(tg_cuda_score_qa_workspace_bytes((enum tg_score_method)7,
                                                      100, 8, 2, 64, 32),
                     0);

    const enum tg_score_method ms[] = {KD, EA};
    for (int m = 0; m < 2; m++) {
        enum tg_score_method me = ms[m];
        size_t wsb = me == KD ? kd : ea;
        struct tg_cuda_compress_chunk b = c;
        assert_int_equal(tg_cuda_score_qa_score(me, NULL, fs, fw, wsb, NULL),
                         TG_EINVAL);
        b.n = TG_CUDA_COMPRESS_MAX_CHUNK + 1;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, fs, fw, wsb, NULL),
                         TG_EINVAL);
        b = c; b.n = -1;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, fs, fw, wsb, NULL),
                         TG_EINVAL);
        b = c; b.n_q_heads = 7;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, fs, fw, wsb, NULL),
                         TG_EINVAL);
        b = c; b.n_kv_heads = 0;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, fs, fw, wsb, NULL),
                         TG_EINVAL);
        b = c;
        b.n_kv_heads = TG_CUDA_COMPRESS_MAX_KV_HEADS + 1;
        b.n_q_heads = b.n_kv_heads;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, fs, fw, wsb, NULL),
                         TG_EINVAL);
        b = c; b.head_dim = 0;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, fs, fw, wsb, NULL),
                         TG_EINVAL);
        b = c;
        b.head_dim = TG_CUDA_COMPRESS_MAX_HEAD_DIM + 1;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, fs, fw, wsb, NULL),
                         TG_EINVAL);
        b = c; b.k = NULL;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, fs, fw, wsb, NULL),
                         TG_EINVAL);
        assert_int_equal(tg_cuda_score_qa_score(me, &c, NULL, fw, wsb, NULL),
                         TG_EINVAL);
        assert_int_equal(tg_cuda_score_qa_score(me, &c, fs, NULL, wsb, NULL),
                         TG_EINVAL);
        assert_int_equal(tg_cuda_score_qa_score(me, &c, fs, fw, wsb - 1, NULL),
                         TG_EINVAL);
        assert_int_equal(
            tg_cuda_score_qa_score(me, &c, fs, (char *)fw + 4, wsb, NULL),
            TG_EINVAL); /* misaligned workspace */
        /* An empty chunk is valid and needs nothing. */
        b = c; b.n = 0; b.q = b.k = b.v = NULL;
        assert_int_equal(tg_cuda_score_qa_score(me, &b, NULL, NULL, 0, NULL),
                         0);
    }
    /* keydiff reads neither q nor v; expected_attention needs both. */
    struct tg_cuda_compress_chunk b = c;
    b.q = NULL;
    b.v = NULL;
    assert_int_equal(tg_cuda_score_qa_score(EA, &b, fs, fw, ea, NULL),
                     TG_EINVAL);
    b = c; b.v = NULL;
    assert_int_equal(tg_cuda_score_qa_score(EA, &b, fs, fw, ea, NULL),
                     TG_EINVAL);
    b = c; b.q = NULL;
    assert_int_equal(tg_cuda_score_qa_score(EA, &b, fs, fw, ea, NULL),
                     TG_EINVAL);
    b = c; b.scale = NAN;
    assert_int_equal(tg_cuda_score_qa_score(EA, &b, fs, fw, ea, NULL),
                     TG_EINVAL);
    b = c; b.n_q_heads = 70000; b.n_kv_heads = 2; /* grid.y limit */
    assert_int_equal(tg_cuda_score_qa_score(EA, &b, fs, fw, ea, NULL),
                     TG_EINVAL);
    /* Unknown method; snapkv's own checks through the router. */
    assert_int_equal(
        tg_cuda_score_qa_score((enum tg_score_method)7, &c, fs, fw, ea, NULL),
        TG_EINVAL);
    assert_int_equal(tg_cuda_score_qa_score((enum tg_score_method) - 1, &c, fs,
                                            fw, ea, NULL),
                     TG_EINVAL);
    size_t sn = tg_cuda_compress_workspace_bytes(100, 8, 2, 32);
    assert_int_equal(
        tg_cuda_score_qa_score(TG_SCORE_SNAPKV, &c, fs, fw, sn - 1, NULL),
        TG_EINVAL);
    b = c; b.q = NULL;
    assert_int_equal(
        tg_cuda_score_qa_score(TG_SCORE_SNAPKV, &b, fs, fw, sn, NULL),
        TG_EINVAL);
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
        cmocka_unit_test(test_routing),
        cmocka_unit_test(test_keydiff_vs_cpu),
        cmocka_unit_test(test_expected_attention_vs_cpu),
    };
    return tt_cuda_run_tests("score_qa_args", host_tests, TT_COUNT(host_tests),
                             "no CUDA device: device tests skipped",
                             "score_qa_device", tests, TT_COUNT(tests));
#else
    return tt_cuda_skip("built without CUDA");
#endif
}
