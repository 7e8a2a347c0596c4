/*
 * cpu_gemv.c — the small-m linear layers of the CPU backend: y = x W^T for
 * m <= b->gemv_rows rows of x (a decode step's tokens), W fp32 or bf16,
 * row-major (n, k) as in Hugging Face checkpoints.
 *
 * Why not BLAS: a decode step reads every weight once and does one
 * multiply-add with it per row of x, so it runs at the speed W streams
 * from DRAM. OpenBLAS 0.3.21's sgemm with m = 1 packs W as for a full GEMM
 * (about 5 GB/s here, where a plain streaming read reaches ~17 GB/s on one
 * core); these kernels read W once, in place (docs/PERFORMANCE.md "CPU
 * linear layers").
 *
 * Shape of the kernels: a tile of NR rows of W and MR rows of x keeps
 * NR x MR vector accumulators in registers; each vector of W loaded is used
 * MR times, each vector of x NR times. NR rows of W are NR sequential
 * streams, enough for the hardware prefetchers to keep DRAM busy; for
 * m > 4 the x rows are taken 4 at a time over the same NR rows of W, which
 * are then in L1. Accumulation is fp32 in vector lanes, summed across the
 * lanes at the end of a row (the order differs from BLAS and between ISA
 * levels by rounding only).
 *
 * bf16 weights are the high halves of fp32 values. A 32-bit lane holding
 * the pair (w[c], w[c+1]) gives w[c] as fp32 by a left shift of 16 and
 * w[c+1] by clearing the low half, so x is split once per call into its
 * even and odd elements (b->xsplit) and each vector of W costs one shift
 * and one and for two vectors of fp32 weights. The products are exact
 * conversions of the stored weights, accumulated in fp32.
 *
 * One variant per ISA level (AVX-512, AVX2+FMA, plain C), the level of
 * the backend context (b->isa, tg_backend_cpu_set_isa).
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/base/tg_err.h"
#include "kernels/cpu/cpu_internal.h"

/* Rows of x per tile, at most. */
#define MR_MAX 4

/* Each kernel computes y[i * ldy + j] for every row i < m of x and the
 * rows j0 <= j < j1 of W. xs is x split into even and odd halves (bf16
 * kernels only; see split_x). */
typedef void (*gemv_f32_fn)(const float *x, const float *w, int m, int k,
                            int j0, int j1, float *y, int ldy);
typedef void (*gemv_bf16_fn)(const float *x, const float *xs, const uint16_t *w,
                             int m, int k, int j0, int j1, float *y, int ldy);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ---- plain C ----------------------------------------------------------- */

static void f32_generic(const float *x, const float *w, int m, int k, int j0,
                        int j1, float *y, int ldy)
{
    for (int j = j0; j < j1; j++) {
        const float *wr = w + (size_t)j * (size_t)k;
        for (int i = 0; i < m; i++) {
            const float *xr = x + (size_t)i * (size_t)k;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int c = 0; c < k; c++)
                s += xr[c] * wr[c];
            y[(size_t)i * (size_t)ldy + (size_t)j] = s;
        }
    }
}

static void bf16_generic(const float *x, const float *xs, const uint16_t *w,
                         int m, int k, int j0, int j1, float *y, int ldy)
{
    (void)xs;
    for (int j = j0; j < j1; j++) {
        const uint16_t *wr = w + (size_t)j * (size_t)k;
        for (int i = 0; i < m; i++) {
            const float *xr = x + (size_t)i * (size_t)k;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int c = 0; c < k; c++)
                s += xr[c] * bf16_to_f32(wr[c]);
            y[(size_t)i * (size_t)ldy + (size_t)j] = s;
        }
    }
}

/* The scalar tail of a tile: columns c0 .. k-1, added to the sums. */
static inline void tail_f32(const float *x, const float *w, int k, int c0,
                            int nr, int mr, float s[][MR_MAX])
{
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < mr; i++)
            for (int c = c0; c < k; c++)
                s[r][i] += x[(size_t)i * (size_t)k + (size_t)c] *
                           w[(size_t)r * (size_t)k + (size_t)c];
}

static inline void tail_bf16(const float *x, const uint16_t *w, int k, int c0,
                             int nr, int mr, float s[][MR_MAX])
{
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < mr; i++)
            for (int c = c0; c < k; c++)
                s[r][i] += x[(size_t)i * (size_t)k + (size_t)c] *
                           bf16_to_f32(w[(size_t)r * (size_t)k + (size_t)c]);
}

static inline void store_tile(float s[][MR_MAX], int nr, int mr, int j, int i0,
                              float *y, int ldy)
{
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < mr; i++)
            y[(size_t)(i0 + i) * (size_t)ldy + (size_t)(j + r)] = s[r][i];
}

#if defined(__x86_64__)

/* ---- AVX-512 ------------------------------------------------------------ */

#define T512 \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define INLINE inline __attribute__((always_inline))

/* One tile, NR <= 16 rows of W at j and MR <= 4 rows of x at row i0.
 * NR and MR are constants at every call, so the accumulator array lives
 * in registers. */
T512 static INLINE void tile_f32_512(const float *x, const float *w, int k,
                                     int j, int i0, const int NR, const int MR,
                                     float *y, int ldy)
{
    __m512 acc[16][MR_MAX];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++)
            acc[r][i] = _mm512_setzero_ps();
    const float *wj = w + (size_t)j * (size_t)k;
    const float *xi = x + (size_t)i0 * (size_t)k;
    int c = 0;
    for (; c + 16 <= k; c += 16) {
        __m512 xv[MR_MAX];
        for (int i = 0; i < MR; i++)
            xv[i] = _mm512_loadu_ps(xi + (size_t)i * (size_t)k + c);
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            __m512 wv = _mm512_loadu_ps(wj + (size_t)r * (size_t)k + c);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++)
                acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
        }
    }
    float s[16][MR_MAX];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++)
            s[r][i] = _mm512_reduce_add_ps(acc[r][i]);
    tail_f32(xi, wj, k, c, NR, MR, s);
    store_tile(s, NR, MR, j, i0, y, ldy);
}

/* xs: for each row i of x, k/2 even elements then k/2 odd ones. */
T512 static INLINE void tile_bf16_512(const float *x, const float *xs,
                                      const uint16_t *w, int k, int j, int i0,
                                      const int NR, const int MR, float *y,
                                      int ldy)
{
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    const int k2 = k / 2;
    __m512 acc[16][MR_MAX];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++)
            acc[r][i] = _mm512_setzero_ps();
    const uint16_t *wj = w + (size_t)j * (size_t)k;
    const float *xsi = xs + (size_t)i0 * (size_t)(2 * k2);
    int c = 0;
    for (; c + 32 <= k; c += 32) {
        __m512 xe[MR_MAX], xo[MR_MAX];
        for (int i = 0; i < MR; i++) {
            xe[i] = _mm512_loadu_ps(xsi + (size_t)i * (size_t)(2 * k2) + c / 2);
            xo[i] = _mm512_loadu_ps(xsi + (size_t)i * (size_t)(2 * k2) + k2 +
                                    c / 2);
        }
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            __m512i v = _mm512_loadu_si512(
                (const void *)(wj + (size_t)r * (size_t)k + c));
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                acc[r][i] = _mm512_fmadd_ps(we, xe[i], acc[r][i]);
                acc[r][i] = _mm512_fmadd_ps(wo, xo[i], acc[r][i]);
            }
        }
    }
    float s[16][MR_MAX];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++)
            s[r][i] = _mm512_reduce_add_ps(acc[r][i]);
    tail_bf16(x + (size_t)i0 * (size_t)k, wj, k, c, NR, MR, s);
    store_tile(s, NR, MR, j, i0, y, ldy);
}

/* Every tile of rows [ja, jz) of W for x rows i0 .. i0 + MR - 1: NR rows
 * of W at a time, the rest one by one. */
#define ROWS(tile, NR, MR, ja, jz, ...)                \
    do {                                               \
        int j_ = (ja);                                 \
        for (; j_ + (NR) <= (jz); j_ += (NR))          \
            tile(__VA_ARGS__, j_, i0, NR, MR, y, ldy); \
        for (; j_ < (jz); j_++)                        \
            tile(__VA_ARGS__, j_, i0, 1, MR, y, ldy);  \
    } while (0)

/* The x rows of a call. Rows of W per tile: more streams when each is
 * used by fewer rows of x (m = 1: NR1, 8 for fp32 and 16 for bf16, whose
 * rows are half as long, on AVX2; 1 on AVX-512, see f32_avx512; m = 2: 8;
 * else 4, measured in docs/PERFORMANCE.md "CPU linear layers"). For m > 2, blocks of 64 rows of W (L2-resident)
 * see the x rows 4 at a time, then the remainder. */
#define GROUPS(tile, NR1, ...)                                         \
    do {                                                               \
        if (m <= 2) {                                                  \
            int i0 = 0;                                                \
            if (m == 1)                                                \
                ROWS(tile, NR1, 1, j0, j1, __VA_ARGS__);               \
            else                                                       \
                ROWS(tile, 8, 2, j0, j1, __VA_ARGS__);                 \
            return;                                                    \
        }                                                              \
        for (int jb = j0; jb < j1; jb += 64) {                         \
            int je = jb + 64 < j1 ? jb + 64 : j1;                      \
            for (int i0 = 0; i0 < m; i0 += MR_MAX) {                   \
                switch (m - i0 < MR_MAX ? m - i0 : MR_MAX) {           \
                case 1: ROWS(tile, 4, 1, jb, je, __VA_ARGS__); break;  \
                case 2: ROWS(tile, 4, 2, jb, je, __VA_ARGS__); break;  \
                case 3: ROWS(tile, 4, 3, jb, je, __VA_ARGS__); break;  \
                default: ROWS(tile, 4, 4, jb, je, __VA_ARGS__); break; \
                }                                                      \
            }                                                          \
        }                                                              \
    } while (0)

/* m = 1 reads W one row at a time: the rows are contiguous, so that is one
 * sequential stream, which the prefetchers serve faster than 8 or 16 rows
 * read side by side (fp32: 28-30 against 20-22 GB/s of weights on the
 * 2-vCPU EPYC of docs/PERFORMANCE.md, with the slab's 2 MiB pages; a
 * bf16 decode step 1.5x faster than with 16 rows, 2 rows being slower
 * still); a row's sum is the same chain of fmadds either way, so the
 * results do not change. */
T512 static void f32_avx512(const float *x, const float *w, int m, int k,
                            int j0, int j1, float *y, int ldy)
{
    GROUPS(tile_f32_512, 1, x, w, k);
}

T512 static void bf16_avx512(const float *x, const float *xs, const uint16_t *w,
                             int m, int k, int j0, int j1, float *y, int ldy)
{
    GROUPS(tile_bf16_512, 1, x, xs, w, k);
}

/* ---- AVX2 + FMA --------------------------------------------------------- */

#define T256 __attribute__((target("avx2,fma")))

T256 static INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T256 static INLINE void tile_f32_256(const float *x, const float *w, int k,
                                     int j, int i0, const int NR, const int MR,
                                     float *y, int ldy)
{
    __m256 acc[16][MR_MAX];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++)
            acc[r][i] = _mm256_setzero_ps();
    const float *wj = w + (size_t)j * (size_t)k;
    const float *xi = x + (size_t)i0 * (size_t)k;
    int c = 0;
    for (; c + 8 <= k; c += 8) {
        __m256 xv[MR_MAX];
        for (int i = 0; i < MR; i++)
            xv[i] = _mm256_loadu_ps(xi + (size_t)i * (size_t)k + c);
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            __m256 wv = _mm256_loadu_ps(wj + (size_t)r * (size_t)k + c);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++)
                acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
        }
    }
    float s[16][MR_MAX];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++)
            s[r][i] = hsum256(acc[r][i]);
    tail_f32(xi, wj, k, c, NR, MR, s);
    store_tile(s, NR, MR, j, i0, y, ldy);
}

T256 static INLINE void tile_bf16_256(const float *x, const float *xs,
                                      const uint16_t *w, int k, int j, int i0,
                                      const int NR, const int MR, float *y,
                                      int ldy)
{
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    const int k2 = k / 2;
    __m256 acc[16][MR_MAX];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++)
            acc[r][i] = _mm256_setzero_ps();
    const uint16_t *wj = w + (size_t)j * (size_t)k;
    const float *xsi = xs + (size_t)i0 * (size_t)(2 * k2);
    int c = 0;
    for (; c + 16 <= k; c += 16) {
        __m256 xe[MR_MAX], xo[MR_MAX];
        for (int i = 0; i < MR; i++) {
            xe[i] = _mm256_loadu_ps(xsi + (size_t)i * (size_t)(2 * k2) + c / 2);
            xo[i] = _mm256_loadu_ps(xsi + (size_t)i * (size_t)(2 * k2) + k2 +
                                    c / 2);
        }
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            __m256i v = _mm256_loadu_si256(
                (const __m256i *)(wj + (size_t)r * (size_t)k + c));
            __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                acc[r][i] = _mm256_fmadd_ps(we, xe[i], acc[r][i]);
                acc[r][i] = _mm256_fmadd_ps(wo, xo[i], acc[r][i]);
            }
        }
    }
    float s[16][MR_MAX];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++)
            s[r][i] = hsum256(acc[r][i]);
    tail_bf16(x + (size_t)i0 * (size_t)k, wj, k, c, NR, MR, s);
    store_tile(s, NR, MR, j, i0, y, ldy);
}

T256 static void f32_avx2(const float *x, const float *w, int m, int k, int j0,
                          int j1, float *y, int ldy)
{
    GROUPS(tile_f32_256, 8, x, w, k);
}

T256 static void bf16_avx2(const float *x, const float *xs, const uint16_t *w,
                           int m, int k, int j0, int j1, float *y, int ldy)
{
    GROUPS(tile_bf16_256, 16, x, xs, w, k);
}

#endif /* __x86_64__ */

static gemv_f32_fn f32_kernel(enum tg_cpu_isa isa)
{
#if defined(__x86_64__)
    if (isa >= TG_CPU_ISA_AVX512)
        return f32_avx512;
    if (isa >= TG_CPU_ISA_AVX2)
        return f32_avx2;
#endif
    (void)isa;
    return f32_generic;
}

static gemv_bf16_fn bf16_kernel(enum tg_cpu_isa isa)
{
#if defined(__x86_64__)
    if (isa >= TG_CPU_ISA_AVX512)
        return bf16_avx512;
    if (isa >= TG_CPU_ISA_AVX2)
        return bf16_avx2;
#endif
    (void)isa;
    return bf16_generic;
}

/* Writes, for each row i of x, its k/2 even elements then its k/2 odd
 * ones (an odd k's last element is left to the kernels' scalar tail). */
static void split_x(const float *x, int m, int k, float *xs)
{
    int k2 = k / 2;
    for (int i = 0; i < m; i++) {
        const float *xr = x + (size_t)i * (size_t)k;
        float *e = xs + (size_t)i * (size_t)(2 * k2), *o = e + k2;
        for (int c = 0; c < k2; c++) {
            e[c] = xr[2 * c];
            o[c] = xr[2 * c + 1];
        }
    }
}

/* Thread t's rows of n among T threads: whole blocks of 16 rows (64-byte
 * lines of y), the last thread taking the remainder. */
static void thread_rows(int n, int t, int T, int *j0, int *j1)
{
    int blocks = (n + 15) / 16;
    int b0 = (int)((long)blocks * t / T),
        b1 = (int)((long)blocks * (t + 1) / T);
    *j0 = b0 * 16 < n ? b0 * 16 : n;
    *j1 = b1 * 16 < n ? b1 * 16 : n;
}

int cpu__gemv(struct tg_backend *b, const float *x, const void *w,
              enum tg_wtype wt, int m, int n, int k, float *y)
{
    TG_ASSERT(m >= 1 && m <= TG_CPU_GEMV_ROWS_MAX && n >= 1 && k >= 1);
    const float *xs = NULL;
    if (wt == TG_WTYPE_BF16) {
        size_t need = (size_t)m * (size_t)k;
        if (need > b->xsplit_len) {
            float *p = aligned_alloc(64,
                                     (need * sizeof(float) + 63) & ~(size_t)63);
            if (p == NULL)
                return TG_ENOMEM;
            free(b->xsplit);
            b->xsplit = p;
            b->xsplit_len = need;
        }
        split_x(x, m, k, b->xsplit);
        xs = b->xsplit;
    }
    gemv_f32_fn kf = f32_kernel(b->isa);
    gemv_bf16_fn kb = bf16_kernel(b->isa);
    /* Split W's rows once the weights are worth a second stream. */
    int par = b->n_threads > 1 && (size_t)n * (size_t)k >= 4 * CPU_PAR_MIN_WORK;
#pragma omp parallel num_threads(b->n_threads) if (par)
    {
        int j0, j1;
        thread_rows(n, omp_get_thread_num(), omp_get_num_threads(), &j0, &j1);
        if (j1 > j0) {
            if (wt == TG_WTYPE_BF16)
                kb(x, xs, w, m, k, j0, j1, y, n);
            else
                kf(x, w, m, k, j0, j1, y, n);
        }
    }
    return 0;
}
