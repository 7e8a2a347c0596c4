/*
 * cpu_basic.c — the elementwise and dense ops of the CPU backend:
 * embedding, rmsnorm, add, gemm (small m: cpu_gemv.c; else OpenBLAS),
 * silu_mul and NeoX RoPE.
 *
 * fp32 arithmetic throughout (bf16 weights are converted exactly). Rows are
 * independent, so OpenMP splits rows (or plain element ranges) once the
 * work is large enough to pay for a team; inner loops are contiguous,
 * marked `omp simd` and compiled once per ISA level (CPU_CLONES).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/cpu/cpu_internal.h"

CPU_CLONES void cpu__bf16_to_f32(const uint16_t *src, size_t n, float *dst)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        union {
            uint32_t u;
            float f;
        } v = {.u = (uint32_t)src[i] << 16};
        dst[i] = v.f;
    }
}

int cpu__embedding_bf16(struct tg_backend *b, const uint16_t *table, int vocab,
                        int hidden, const int32_t *ids, int n, float *out)
{
    if (table == NULL || ids == NULL || out == NULL || vocab <= 0 ||
        hidden <= 0 || n < 0)
        return TG_EINVAL;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return TG_EINVAL;
    size_t row = (size_t)hidden;
    int par = (size_t)n * row >= CPU_PAR_MIN_WORK;
#pragma omp parallel for num_threads(b->n_threads) if (par) schedule(static)
    for (int i = 0; i < n; i++)
        cpu__bf16_to_f32(table + (size_t)ids[i] * row, row,
                         out + (size_t)i * row);
    return 0;
}

int cpu__embedding(struct tg_backend *b, const float *table, int vocab,
                   int hidden, const int32_t *ids, int n, float *out)
{
    if (table == NULL || ids == NULL || out == NULL || vocab <= 0 ||
        hidden <= 0 || n < 0)
        return TG_EINVAL;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return TG_EINVAL;
    size_t row = (size_t)hidden;
    int par = (size_t)n * row >= CPU_PAR_MIN_WORK;
#pragma omp parallel for num_threads(b->n_threads) if (par) schedule(static)
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * row, table + (size_t)ids[i] * row,
               row * sizeof(float));
    return 0;
}

/* Rows [i0, i1) of rmsnorm. */
CPU_CLONES static void rmsnorm_rows(const float *x, const float *w, int i0,
                                    int i1, int dim, float eps, float *out)
{
    for (int i = i0; i < i1; i++) {
        const float *xr = x + (size_t)i * (size_t)dim;
        float *o = out + (size_t)i * (size_t)dim;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < dim; j++)
            ss += xr[j] * xr[j];
        /* HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps), then * weight. */
        float r = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma omp simd
        for (int j = 0; j < dim; j++)
            o[j] = xr[j] * r * w[j];
    }
}

int cpu__rmsnorm(struct tg_backend *b, const float *x, const float *w, int n,
                 int dim, float eps, float *out)
{
    if (x == NULL || w == NULL || out == NULL || n < 0 || dim <= 0 ||
        !(eps >= 0.0f))
        return TG_EINVAL;
    int par = (size_t)n * (size_t)dim >= CPU_PAR_MIN_WORK;
    if (!par) {
        rmsnorm_rows(x, w, 0, n, dim, eps, out);
        return 0;
    }
#pragma omp parallel for num_threads(b->n_threads) schedule(static)
    for (int i = 0; i < n; i++)
        rmsnorm_rows(x, w, i, i + 1, dim, eps, out);
    return 0;
}

CPU_CLONES int cpu__add(struct tg_backend *b, float *y, const float *x,
                        size_t len)
{
    if ((y == NULL || x == NULL) && len > 0)
        return TG_EINVAL;
    int par = len >= 4 * CPU_PAR_MIN_WORK;
#pragma omp parallel for simd num_threads(b->n_threads) if (par) schedule(static)
    for (size_t i = 0; i < len; i++)
        y[i] += x[i];
    return 0;
}

/* Thread t's rows of W among T threads on the BLAS path: whole blocks of
 * 16 rows (y's 64-byte lines), the last thread taking the remainder. */
static void blas_rows(int n, int t, int T, int *j0, int *j1)
{
    int blocks = (n + 15) / 16;
    int b0 = (int)((long)blocks * t / T),
        b1 = (int)((long)blocks * (t + 1) / T);
    *j0 = b0 * 16 < n ? b0 * 16 : n;
    *j1 = b1 * 16 < n ? b1 * 16 : n;
}

/* Rows of bf16 W converted per sgemm call on the BLAS path. */
#define BF16_BLOCK 128

/* y (m, n) = x W^T by sgemm over column slices, one per thread: OpenBLAS
 * runs single-threaded (tg_backend_cpu_new) inside the team, so no thread
 * of another pool waits or spins beside it. bf16 W goes through the
 * thread's scratch BF16_BLOCK rows at a time. */
static int gemm_blas(struct tg_backend *b, const float *x, const void *w,
                     enum tg_wtype wt, int m, int n, int k, float *y)
{
    if (wt == TG_WTYPE_BF16 &&
        cpu__scratch_reserve(b, (size_t)BF16_BLOCK * (size_t)k *
                                    sizeof(float)) != 0)
        return TG_ENOMEM;
    int par = b->n_threads > 1 &&
              (size_t)m * (size_t)n * (size_t)k >= 16 * CPU_PAR_MIN_WORK;
#pragma omp parallel num_threads(b->n_threads) if (par)
    {
        int j0, j1;
        blas_rows(n, omp_get_thread_num(), omp_get_num_threads(), &j0, &j1);
        if (wt == TG_WTYPE_F32 && j1 > j0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, j1 - j0, k,
                        1.0f, x, k, (const float *)w + (size_t)j0 * k, k, 0.0f,
                        y + j0, n);
        } else if (j1 > j0) {
            float *wf = cpu__scratch(b, omp_get_thread_num());
            for (int j = j0; j < j1; j += BF16_BLOCK) {
                int nb = j1 - j < BF16_BLOCK ? j1 - j : BF16_BLOCK;
                cpu__bf16_to_f32((const uint16_t *)w + (size_t)j * k,
                                 (size_t)nb * (size_t)k, wf);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nb, k,
                            1.0f, x, k, wf, k, 0.0f, y + j, n);
            }
        }
    }
    return 0;
}

/* gemm and gemm_bf16: the product by the path m calls for, then the bias. */
static int linear(struct tg_backend *b, const float *x, const void *w,
                  enum tg_wtype wt, const float *bias, int m, int n, int k,
                  float *y)
{
    if (x == NULL || w == NULL || y == NULL || m < 0 || n < 0 || k < 0)
        return TG_EINVAL;
    if (m == 0 || n == 0)
        return 0;
    if (k == 0) {
        /* BLAS rejects lda = 0; an empty inner product is 0 (+ bias). */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                y[(size_t)i * n + j] = bias != NULL ? bias[j] : 0.0f;
        return 0;
    }
    int rc = m <= b->gemv_rows ? cpu__gemv(b, x, w, wt, m, n, k, y)
                               : gemm_blas(b, x, w, wt, m, n, k, y);
    if (rc != 0 || bias == NULL)
        return rc;
    for (int i = 0; i < m; i++)
        cpu__add(b, y + (size_t)i * (size_t)n, bias, (size_t)n);
    return 0;
}

int cpu__gemm(struct tg_backend *b, const float *x, const float *w,
              const float *bias, int m, int n, int k, float *y)
{
    return linear(b, x, w, TG_WTYPE_F32, bias, m, n, k, y);
}

int cpu__gemm_bf16(struct tg_backend *b, const float *x, const uint16_t *w,
                   const float *bias, int m, int n, int k, float *y)
{
    return linear(b, x, w, TG_WTYPE_BF16, bias, m, n, k, y);
}

CPU_CLONES int cpu__silu_mul(struct tg_backend *b, const float *gate,
                             const float *up, size_t len, float *out)
{
    if ((gate == NULL || up == NULL || out == NULL) && len > 0)
        return TG_EINVAL;
    int par = len >= CPU_PAR_MIN_WORK;
    /* silu(g) = g * sigmoid(g) = g / (1 + e^-g). */
#pragma omp parallel for simd num_threads(b->n_threads) if (par) schedule(static)
    for (size_t i = 0; i < len; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
    return 0;
}

CPU_CLONES int cpu__rope(struct tg_backend *b, float *x, int n, int heads,
                         int d, const int32_t *pos, const float *inv_freq)
{
    if (x == NULL || pos == NULL || inv_freq == NULL || n < 0 || heads <= 0 ||
        d <= 0 || d % 2 != 0)
        return TG_EINVAL;
    int half = d / 2;
    if (cpu__scratch_reserve(b, (size_t)d * sizeof(float)) != 0)
        return TG_ENOMEM;
    int par = (size_t)n * (size_t)heads * (size_t)d >= CPU_PAR_MIN_WORK;
#pragma omp parallel num_threads(b->n_threads) if (par)
    {
        float *cs = cpu__scratch(b, omp_get_thread_num());
        float *sn = cs + half;
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++) {
            /* The angle is formed in fp32 as HF does (inv_freq * pos in
             * float), and cos/sin are taken once per token for all heads. */
            float p = (float)pos[i];
            for (int j = 0; j < half; j++) {
                float a = p * inv_freq[j];
                cs[j] = cosf(a);
                sn[j] = sinf(a);
            }
            for (int h = 0; h < heads; h++) {
                float *r = x + ((size_t)i * (size_t)heads + (size_t)h) * (size_t)d;
                /* NeoX half rotation: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s). */
#pragma omp simd
                for (int j = 0; j < half; j++) {
                    float x1 = r[j], x2 = r[j + half];
                    r[j] = x1 * cs[j] - x2 * sn[j];
                    r[j + half] = x2 * cs[j] + x1 * sn[j];
                }
            }
        }
    }
    return 0;
}
