/*
 * cpu_basic.c — the elementwise and dense ops of the CPU backend:
 * embedding, rmsnorm, add, gemm (OpenBLAS), silu_mul and NeoX RoPE.
 *
 * fp32 throughout. Rows are independent, so OpenMP splits rows (or plain
 * element ranges) once the work is large enough to pay for a team; inner
 * loops are contiguous and marked `omp simd`.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/cpu/cpu_internal.h"

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

int cpu__rmsnorm(struct tg_backend *b, const float *x, const float *w, int n,
                 int dim, float eps, float *out)
{
    if (x == NULL || w == NULL || out == NULL || n < 0 || dim <= 0 ||
        !(eps >= 0.0f))
        return TG_EINVAL;
    int par = (size_t)n * (size_t)dim >= CPU_PAR_MIN_WORK;
#pragma omp parallel for num_threads(b->n_threads) if (par) schedule(static)
    for (int i = 0; i < n; i++) {
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
    return 0;
}

int cpu__add(struct tg_backend *b, float *y, const float *x, size_t len)
{
    if ((y == NULL || x == NULL) && len > 0)
        return TG_EINVAL;
    int par = len >= 4 * CPU_PAR_MIN_WORK;
#pragma omp parallel for simd num_threads(b->n_threads) if (par) schedule(static)
    for (size_t i = 0; i < len; i++)
        y[i] += x[i];
    return 0;
}

int cpu__gemm(struct tg_backend *b, const float *x, const float *w,
              const float *bias, int m, int n, int k, float *y)
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
    /* y (m, n) = x (m, k) * w^T with w (n, k) row-major: NoTrans x Trans.
     * OpenBLAS threads internally; this call is never inside an OpenMP team. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k,
                w, k, 0.0f, y, n);
    if (bias != NULL) {
        int par = (size_t)m * (size_t)n >= 4 * CPU_PAR_MIN_WORK;
#pragma omp parallel for num_threads(b->n_threads) if (par) schedule(static)
        for (int i = 0; i < m; i++) {
            float *yr = y + (size_t)i * (size_t)n;
#pragma omp simd
            for (int j = 0; j < n; j++)
                yr[j] += bias[j];
        }
    }
    return 0;
}

int cpu__silu_mul(struct tg_backend *b, const float *gate, const float *up,
                  size_t len, float *out)
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

int cpu__rope(struct tg_backend *b, float *x, int n, int heads, int d,
              const int32_t *pos, const float *inv_freq)
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
