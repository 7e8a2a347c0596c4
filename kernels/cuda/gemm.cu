// gemm.cu — y = x W^T (+ bias) in bf16 with fp32 accumulation through
// cuBLASLt, with the heuristic answer cached per shape (see gemm.h).
//
// Layout mapping. cuBLASLt is column-major; a row-major (r, c) matrix is
// the column-major (c, r) matrix with the same bytes. So the row-major
// product y (m, n) = x (m, k) W^T is, in column-major terms,
//     y^T (n, m) = W (n, k) x^T (k, m),
// where W's bytes are the column-major (k, n) matrix W^T (ld k), used with
// op T, and x's bytes are the column-major (k, m) matrix x^T (ld k), used
// with op N. This is the "TN" case that every cuBLASLt kernel family
// supports. The bias epilogue adds a vector over the rows of D (n), i.e.
// over y's columns, as nn.Linear does.
//
// The bias rides on the cuBLASLt BIAS epilogue when its pointer is 16-byte
// aligned (misaligned bias vectors make the epilogue fault on A100, as
// Marian's cublasLt path found); otherwise a separate bias kernel adds it.
//
// Three layers as everywhere in kernels/cuda: the bias kernel (also the
// k == 0 product), its launcher, and the checked extern "C" entry.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm.h"

#include "common/base/tg_hmap.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cuda_bf16.h>

// One cached shape: descriptors built once and the algorithm cuBLASLt's
// heuristic chose for them.
struct gemm_plan {
    int used; // slot holds a plan
    int m, n, k;
    int ydt;      // enum tg_cuda_gemm_dtype
    int has_bias; // BIAS epilogue
    uint8_t align[4]; // log2 of the byte alignment of x, w, y, bias (<= 8)
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a; // W as column-major (k, n), op T
    cublasLtMatrixLayout_t b; // x as column-major (k, m), op N
    cublasLtMatrixLayout_t d; // y as column-major (n, m); also C (beta 0)
    cublasLtMatmulAlgo_t algo;
};

struct tg_cuda_gemm {
    cublasLtHandle_t lt;
    void *ws;        // device workspace (ws_bytes), reserved once
    size_t ws_bytes;
    struct tg_hmap plans; // gemm_plan slots, by shape (plan_type)
};

// ---------------------------------------------------------------- kernel

// y[i, j] = (accumulate ? y[i, j] : 0) + (bias ? bias[j] : 0), summed in
// fp32: the k == 0 product (cuBLASLt rejects an empty inner dimension), and
// the bias when it is too misaligned for the fused epilogue. Grid-stride
// over m*n.
template <typename T>
static __global__ void bias_kernel(T *__restrict__ y,
                                   const T *__restrict__ bias, int64_t total,
                                   int n, bool accumulate)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         i < total; i += stride) {
        float v = accumulate ? (float)y[i] : 0.0f;
        if (bias != nullptr)
            v += (float)bias[i % n];
        y[i] = (T)v;
    }
}

static int launch_bias(void *y, const void *bias, int m, int n, int ydt,
                       bool accumulate, cudaStream_t stream)
{
    int64_t total = (int64_t)m * n;
    const int threads = 256;
    int64_t want = (total + threads - 1) / threads;
    int blocks = (int)(want < 4096 ? want : 4096);
    if (ydt == TG_CUDA_GEMM_BF16)
        bias_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
            (__nv_bfloat16 *)y, (const __nv_bfloat16 *)bias, total, n,
            accumulate);
    else
        bias_kernel<float><<<blocks, threads, 0, stream>>>(
            (float *)y, (const float *)bias, total, n, accumulate);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// ---------------------------------------------------------------- plans

// log2 of the largest power of two (<= 256) dividing the address; cuBLASLt
// asks for alignments up to 256 bytes (its default assumption).
static uint8_t align_log2(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint8_t r = 0;
    while (r < 8 && (a & ((uintptr_t)1 << r)) == 0)
        r++;
    return r;
}

static uint64_t plan_hash(int m, int n, int k, int ydt, int has_bias,
                          const uint8_t align[4])
{
    // splitmix64's finaliser (Steele, Lea & Flood 2014) over the packed key.
    uint64_t h = (uint64_t)(uint32_t)m * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)(uint32_t)n << 32) | (uint32_t)k;
    h ^= (uint64_t)(ydt | has_bias << 1 | align[0] << 2 | align[1] << 6 |
                    align[2] << 10 | align[3] << 14) << 40;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
}

// A lookup's key is a plan with only its key fields set.
static int plan_probe(const void *slot, const void *key)
{
    const gemm_plan *p = (const gemm_plan *)slot;
    const gemm_plan *q = (const gemm_plan *)key;
    if (!p->used)
        return TG_HMAP_EMPTY;
    return p->m == q->m && p->n == q->n && p->k == q->k && p->ydt == q->ydt &&
                   p->has_bias == q->has_bias &&
                   memcmp(p->align, q->align, 4) == 0
               ? TG_HMAP_HIT
               : TG_HMAP_MISS;
}

static int plan_empty(const void *slot)
{
    return !((const gemm_plan *)slot)->used;
}

static uint64_t plan_slot_hash(const void *slot, void *ctx)
{
    (void)ctx;
    const gemm_plan *p = (const gemm_plan *)slot;
    return plan_hash(p->m, p->n, p->k, p->ydt, p->has_bias, p->align);
}

// Plans live in their slots (moving one is a copy: its descriptors are
// opaque handles); a zeroed slot is empty.
static const struct tg_hmap_type plan_type = {
    sizeof(gemm_plan), 0, plan_probe, plan_empty, plan_slot_hash,
};

// Releases whatever part of the plan was built; safe on a zeroed plan.
static void plan_destroy(gemm_plan *p)
{
    if (p->d != nullptr)
        (void)cublasLtMatrixLayoutDestroy(p->d);
    if (p->b != nullptr)
        (void)cublasLtMatrixLayoutDestroy(p->b);
    if (p->a != nullptr)
        (void)cublasLtMatrixLayoutDestroy(p->a);
    if (p->op != nullptr)
        (void)cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof(*p));
}

// Creates the descriptors of *p (key fields already set). On failure the
// caller destroys the half-built plan.
static int plan_describe(gemm_plan *p)
{
    TG_CUBLAS_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F,
                                           CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    TG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    TG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // The bias vector's type defaults to D's type, which is what gemm.h
    // promises (bias dtype = y dtype).
    cublasLtEpilogue_t epi =
        p->has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    TG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    cudaDataType_t dt = p->ydt == TG_CUDA_GEMM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    TG_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, (uint64_t)p->k,
                                             (uint64_t)p->n, (int64_t)p->k));
    TG_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, (uint64_t)p->k,
                                             (uint64_t)p->m, (int64_t)p->k));
    TG_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->d, dt, (uint64_t)p->n,
                                             (uint64_t)p->m, (int64_t)p->n));
    return 0;
}

// Asks cuBLASLt's heuristic for the best algorithm under the workspace and
// the pointers' real alignments (its default assumes 256-byte alignment and
// would pick kernels that fault on offset views).
static int plan_choose(const tg_cuda_gemm *g, gemm_plan *p,
                       cublasLtMatmulPreference_t pref)
{
    uint64_t ws = g->ws_bytes;
    TG_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    uint32_t ax = 1u << p->align[0], aw = 1u << p->align[1],
             ay = 1u << p->align[2];
    TG_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw)));
    TG_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof(ax)));
    TG_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof(ay)));
    TG_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof(ay)));
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof(res));
    int got = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        g->lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &res, &got);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS &&
                                              got == 0))
        return TG_EUNSUPPORTED;
    TG_CUBLAS_TRY(st);
    if (res.state != CUBLAS_STATUS_SUCCESS)
        return TG_EUNSUPPORTED;
    p->algo = res.algo;
    return 0;
}

// Builds a complete plan into *p (zeroed, key set) or leaves it zeroed.
static int plan_build(const tg_cuda_gemm *g, gemm_plan *p, const void *bias)
{
    int rc = plan_describe(p);
    // Set the bias before the heuristic so it sees the epilogue complete.
    if (rc == 0 && p->has_bias &&
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                       &bias, sizeof(bias)) !=
            CUBLAS_STATUS_SUCCESS)
        rc = TG_EDEVICE;
    if (rc == 0) {
        cublasLtMatmulPreference_t pref = nullptr;
        cublasStatus_t st = cublasLtMatmulPreferenceCreate(&pref);
        if (st != CUBLAS_STATUS_SUCCESS) {
            rc = TG_EDEVICE;
        } else {
            rc = plan_choose(g, p, pref);
            (void)cublasLtMatmulPreferenceDestroy(pref);
        }
    }
    if (rc != 0) {
        plan_destroy(p);
        return rc;
    }
    p->used = 1;
    return 0;
}

// Finds the cached plan for the key or builds and inserts it.
static int plan_get(tg_cuda_gemm *g, int m, int n, int k, int ydt,
                    const void *x, const void *w, const void *bias, void *y,
                    gemm_plan **out)
{
    gemm_plan fresh;
    memset(&fresh, 0, sizeof(fresh));
    fresh.m = m;
    fresh.n = n;
    fresh.k = k;
    fresh.ydt = ydt;
    fresh.has_bias = bias != nullptr;
    fresh.align[0] = align_log2(x);
    fresh.align[1] = align_log2(w);
    fresh.align[2] = align_log2(y);
    fresh.align[3] = bias != nullptr ? align_log2(bias) : (uint8_t)0;
    uint64_t h = plan_hash(m, n, k, ydt, fresh.has_bias, fresh.align);
    gemm_plan *p = (gemm_plan *)tg_hmap_find(&g->plans, &plan_type, h, &fresh);
    if (p != nullptr) {
        *out = p;
        return 0;
    }
    int rc = plan_build(g, &fresh, bias);
    if (rc != 0)
        return rc; // plan_build released what it had made
    p = (gemm_plan *)tg_hmap_put(&g->plans, &plan_type, h, &fresh, nullptr);
    if (p == nullptr) {
        plan_destroy(&fresh);
        return TG_ENOMEM;
    }
    *p = fresh;
    *out = p;
    return 0;
}

// ---------------------------------------------------------------- entries

extern "C" int tg_cuda_gemm_new(size_t workspace_bytes,
                                struct tg_cuda_gemm **out, char *err,
                                size_t errlen)
{
    if (out == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "gemm: out is NULL");
    *out = nullptr;
    if (workspace_bytes == 0)
        workspace_bytes = TG_CUDA_GEMM_WORKSPACE_DEFAULT;
    tg_cuda_gemm *g = (tg_cuda_gemm *)calloc(1, sizeof(*g));
    if (g == nullptr)
        return tg_err_set(err, errlen, TG_ENOMEM, "gemm: out of host memory");
    int rc = 0;
    cublasStatus_t bst = cublasLtCreate(&g->lt);
    if (bst != CUBLAS_STATUS_SUCCESS) {
        rc = tg_err_set(err, errlen, TG_EDEVICE, "gemm: cublasLtCreate: %s",
                        cublasLtGetStatusString(bst));
        goto fail;
    }
    {
        cudaError_t cst = cudaMalloc(&g->ws, workspace_bytes);
        if (cst != cudaSuccess) {
            g->ws = nullptr;
            rc = tg_err_set(err, errlen, TG_EDEVICE,
                            "gemm: workspace of %zu bytes: %s",
                            workspace_bytes, cudaGetErrorString(cst));
            goto fail;
        }
    }
    g->ws_bytes = workspace_bytes;
    if (tg_hmap_init(&g->plans, &plan_type, nullptr, 32) != 0) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "gemm: out of host memory");
        goto fail;
    }
    *out = g;
    return 0;
fail:
    tg_cuda_gemm_free(g);
    return rc;
}

extern "C" void tg_cuda_gemm_free(struct tg_cuda_gemm *g)
{
    if (g == nullptr)
        return;
    // Queued matmuls may still read the workspace and descriptors.
    (void)cudaDeviceSynchronize();
    size_t pos = 0;
    for (gemm_plan *p;
         (p = (gemm_plan *)tg_hmap_next(&g->plans, &pos)) != nullptr;)
        plan_destroy(p);
    tg_hmap_free(&g->plans);
    (void)cudaFree(g->ws);
    if (g->lt != nullptr)
        (void)cublasLtDestroy(g->lt);
    free(g);
}

extern "C" size_t tg_cuda_gemm_cached(const struct tg_cuda_gemm *g)
{
    return g != nullptr ? tg_hmap_count(&g->plans) : 0;
}

extern "C" int tg_cuda_gemm_bf16(struct tg_cuda_gemm *g, const void *x,
                                 const void *w, const void *bias, int m,
                                 int n, int k, void *y,
                                 enum tg_cuda_gemm_dtype y_dtype, void *stream)
{
    if (g == nullptr || m < 0 || n < 0 || k < 0 ||
        (y_dtype != TG_CUDA_GEMM_BF16 && y_dtype != TG_CUDA_GEMM_F32))
        return TG_EINVAL;
    if (m == 0 || n == 0)
        return 0;
    if (y == nullptr || (k > 0 && (x == nullptr || w == nullptr)))
        return TG_EINVAL;
    // Element alignment is the one layout requirement we cannot relax.
    size_t esz = y_dtype == TG_CUDA_GEMM_BF16 ? 2 : 4;
    if (((uintptr_t)x | (uintptr_t)w) % 2 != 0 || (uintptr_t)y % esz != 0 ||
        (uintptr_t)bias % esz != 0)
        return TG_EINVAL;
    cudaStream_t st = (cudaStream_t)stream;
    if (k == 0)
        return launch_bias(y, bias, m, n, y_dtype, false, st);
    const void *fused = bias != nullptr && (uintptr_t)bias % 16 == 0
                            ? bias : nullptr;
    gemm_plan *p = nullptr;
    int rc = plan_get(g, m, n, k, y_dtype, x, w, fused, y, &p);
    if (rc != 0)
        return rc;
    if (p->has_bias)
        TG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
            p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &fused, sizeof(fused)));
    const float alpha = 1.0f, beta = 0.0f;
    // beta = 0: C is never read, so it may alias D.
    TG_CUBLAS_TRY(cublasLtMatmul(g->lt, p->op, &alpha, w, p->a, x, p->b,
                                 &beta, y, p->d, y, p->d, &p->algo, g->ws,
                                 g->ws_bytes, st));
    if (bias != nullptr && fused == nullptr)
        return launch_bias(y, bias, m, n, y_dtype, true, st);
    return 0;
}
