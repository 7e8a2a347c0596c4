// trig.cu — decode-time compression on the device: the trigonometric score
// of each head's decode region and the order-preserving compaction of the
// survivors (see trig.h). Three layers per op: the static kernels, their
// static launchers on a stream, the checked extern "C" entries.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/trig.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

static constexpr int kThreads = 128;
static constexpr int kMaxHalf = 128; // d <= 256
static constexpr int kMaxG = 16;
static constexpr int kChunk = TG_CUDA_TRIG_CHUNK;

static __device__ __forceinline__ float bf16_bits_to_f32(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

// Page id of slot t of `row`, or -1 when the row does not own it.
static __device__ __forceinline__ int64_t page_of(const tg_cuda_trig_pages &pg,
                                                  int32_t row, int64_t t)
{
    int64_t owned = (int64_t)pg.indptr[row + 1] - pg.indptr[row];
    int64_t i = t / pg.page_size;
    if (t < 0 || i >= owned)
        return -1;
    int64_t page = pg.indices[pg.indptr[row] + i];
    return page >= 0 && page < pg.n_pages ? page : -1;
}

// Element offset of slot t (page `page`) of the slot's K (kv = 0) or V row.
static __device__ __forceinline__ size_t row_off(const tg_cuda_trig_pages &pg,
                                                 int64_t page, int slot,
                                                 int64_t t, int kv)
{
    const size_t P = (size_t)pg.page_size, d = (size_t)pg.head_dim;
    return (((size_t)page * pg.heads_per_group + (size_t)slot) * 2 +
            (size_t)kv) * P * d + (size_t)(t % pg.page_size) * d;
}

// Whether an item's row, slot and region [first, first + n) exist; every
// page of the region is checked once, by the CTA's threads.
static __device__ bool item_ok(const tg_cuda_trig_pages &pg,
                               const tg_cuda_trig_item &it)
{
    __shared__ int bad;
    if (threadIdx.x == 0)
        bad = it.row < 0 || it.row >= pg.n_rows || it.slot < 0 ||
              it.slot >= pg.heads_per_group || it.first < 0 || it.n < 0 ||
              it.n_keep < 0 || it.n_keep > it.n;
    __syncthreads();
    if (!bad && it.n > 0) {
        int64_t p0 = it.first / pg.page_size;
        int64_t p1 = ((int64_t)it.first + it.n - 1) / pg.page_size;
        for (int64_t p = p0 + threadIdx.x; p <= p1; p += blockDim.x)
            if (page_of(pg, it.row, p * pg.page_size) < 0)
                bad = 1; // benign race: every writer writes 1
    }
    __syncthreads();
    return !bad;
}

// Score kernel: grid.x = n_items, block = kThreads.
static __global__ void __launch_bounds__(kThreads)
trig_score_kernel(const tg_cuda_trig_score_args a)
{
    __shared__ float U[kMaxHalf], V[kMaxHalf], A[kMaxHalf];
    const tg_cuda_trig_item it = a.items[blockIdx.x];
    const tg_cuda_trig_pages &pg = a.pg;
    bool ok = item_ok(pg, it) && it.head >= 0 &&
              (it.head + 1) * a.n_q_per_kv <= a.n_q_heads && it.layer >= 0 &&
              it.layer < a.n_layers;
    if (!ok) {
        if (threadIdx.x == 0 && a.fault != nullptr)
            *a.fault = 1;
        return;
    }
    const int half = pg.head_dim / 2, G = a.n_q_per_kv;
    // U + iV = sum over query heads and offsets of qbar e^{i w (t + o)};
    // A = |O| sum over query heads of (abs - |qbar|).
    for (int f = threadIdx.x; f < half; f += blockDim.x) {
        double u = 0.0, v = 0.0, an = 0.0;
        double w = (double)a.inv_freq[f];
        for (int g = 0; g < G; g++) {
            size_t si = ((size_t)it.layer * a.n_q_heads +
                         (size_t)(it.head * G + g)) * (size_t)half + (size_t)f;
            double re = a.re[si], im = a.im[si];
            an += (double)a.abs[si] - sqrt(re * re + im * im);
            for (int o = 0; o < TG_CUDA_TRIG_OFFSETS; o++) {
                double s, c;
                sincos(w * (double)(it.t + ((int64_t)1 << o)), &s, &c);
                u += re * c - im * s;
                v += re * s + im * c;
            }
        }
        U[f] = (float)u;
        V[f] = (float)v;
        A[f] = (float)(an * TG_CUDA_TRIG_OFFSETS);
    }
    __syncthreads();
    const float norm =
        (float)(1.0 / ((double)G * TG_CUDA_TRIG_OFFSETS * sqrt((double)pg.head_dim)));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j = warp; j < it.n; j += kThreads / 32) {
        int64_t t = (int64_t)it.first + j;
        int64_t page = page_of(pg, it.row, t);
        const uint16_t *k = pg.pool + row_off(pg, page, it.slot, t, 0);
        float acc = 0.f;
        for (int f = lane; f < half; f += 32) {
            float kx = bf16_bits_to_f32(k[f]), ky = bf16_bits_to_f32(k[f + half]);
            acc += kx * U[f] + ky * V[f] + A[f] * sqrtf(kx * kx + ky * ky);
        }
        for (int s = 16; s > 0; s >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, s);
        if (lane == 0)
            a.score[(size_t)it.off + (size_t)j] = acc * norm;
    }
}

// Compaction kernel: grid.x = n_items, block = kThreads. Shared staging of
// kChunk survivors' K and V rows (bf16 bits), d <= 256: 32 KiB.
static __global__ void __launch_bounds__(kThreads)
trig_compact_kernel(const tg_cuda_trig_compact_args a)
{
    __shared__ uint16_t stage[kChunk][2][2 * kMaxHalf];
    __shared__ int bad_src;
    const tg_cuda_trig_item it = a.items[blockIdx.x];
    const tg_cuda_trig_pages &pg = a.pg;
    bool ok = item_ok(pg, it);
    if (threadIdx.x == 0)
        bad_src = 0;
    __syncthreads();
    // Survivors strictly ascending inside the region, so each moves forward
    // (src[i] >= i) and no two share a destination.
    if (ok)
        for (int i = threadIdx.x; i < it.n_keep; i += blockDim.x) {
            int32_t s = a.src[(size_t)it.off + (size_t)i];
            if (s < i || s >= it.n ||
                (i > 0 && a.src[(size_t)it.off + (size_t)i - 1] >= s))
                bad_src = 1;
        }
    __syncthreads();
    if (!ok || bad_src) {
        if (threadIdx.x == 0 && a.fault != nullptr)
            *a.fault = 1;
        return;
    }
    const int d = pg.head_dim;
    const int per = 2 * d; // elements of one survivor (K row, V row)
    for (int c0 = 0; c0 < it.n_keep; c0 += kChunk) {
        const int m = it.n_keep - c0 < kChunk ? it.n_keep - c0 : kChunk;
        // Read the chunk's survivors...
        for (int e = threadIdx.x; e < m * per; e += blockDim.x) {
            int i = e / per, kv = (e / d) % 2, x = e % d;
            int64_t t = (int64_t)it.first + a.src[(size_t)it.off + (size_t)(c0 + i)];
            int64_t page = page_of(pg, it.row, t);
            stage[i][kv][x] = pg.pool[row_off(pg, page, it.slot, t, kv) + (size_t)x];
        }
        __syncthreads();
        // ...then write them: every later source lies past these slots.
        for (int e = threadIdx.x; e < m * per; e += blockDim.x) {
            int i = e / per, kv = (e / d) % 2, x = e % d;
            int64_t t = (int64_t)it.first + c0 + i;
            int64_t page = page_of(pg, it.row, t);
            pg.pool[row_off(pg, page, it.slot, t, kv) + (size_t)x] = stage[i][kv][x];
        }
        __syncthreads();
    }
}

// Order-preserving key of a score: larger score, larger key. NaN counts
// as -inf and -0 as +0, as the host's comparison (gw_trig_select) has it.
static __device__ __forceinline__ uint32_t score_key(float s)
{
    if (s != s)
        s = -INFINITY;
    if (s == 0.0f)
        s = 0.0f; // -0 ties with +0, as the host's comparison has it
    uint32_t u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static constexpr int kSelThreads = 256;

// Exclusive prefix of a per-thread 0/1 flag over the CTA, in thread order;
// *total gets the CTA's sum. All threads call it.
static __device__ int cta_exclusive(int flag, int *total, int *warp_sums)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    const int in_warp = __popc(ballot & ((1u << lane) - 1u));
    if (lane == 0)
        warp_sums[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, sum = 0;
    for (int w = 0; w < kSelThreads / 32; w++) {
        before += w < warp ? warp_sums[w] : 0;
        sum += warp_sums[w];
    }
    __syncthreads(); // warp_sums is rewritten by the next call
    *total = sum;
    return before + in_warp;
}

// Select kernel: grid.x = n_items, block = kSelThreads.
static __global__ void __launch_bounds__(kSelThreads)
trig_select_kernel(const tg_cuda_trig_select_args a)
{
    __shared__ unsigned hist[256];
    __shared__ int warp_sums[kSelThreads / 32];
    __shared__ uint32_t s_prefix;
    __shared__ int s_left;
    const tg_cuda_trig_item it = a.items[blockIdx.x];
    if (it.n < 0 || it.n_keep < a.window || it.n_keep > it.n) {
        if (threadIdx.x == 0 && a.fault != nullptr)
            *a.fault = 1;
        return;
    }
    const float *sc = a.score + it.off;
    const int m = it.n - a.window;     // slots chosen by score
    const int want = it.n_keep - a.window;
    // Radix select, most significant byte first: after the passes, T is
    // the want-th largest key and `left` how many keys equal to T survive
    // (the earliest ones).
    uint32_t prefix = 0, mask = 0;
    int left = want;
    for (int shift = 24; shift >= 0 && want > 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < m; i += blockDim.x) {
            uint32_t k = score_key(sc[i]);
            if ((k & mask) == prefix)
                atomicAdd(&hist[(k >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int need = left, b = 255;
            for (; b > 0 && (int)hist[b] < need; b--)
                need -= (int)hist[b];
            s_prefix = prefix | ((uint32_t)b << shift);
            s_left = need;
        }
        __syncthreads();
        prefix = s_prefix;
        left = s_left;
        mask |= 0xffu << shift;
        __syncthreads();
    }
    const uint32_t T = prefix;
    // Survivors in slot order: score above T, the first `left` equal to T,
    // and the window.
    int eq_before = 0, kept_before = 0;
    for (int base = 0; base < it.n; base += blockDim.x) {
        const int i = base + (int)threadIdx.x;
        uint32_t k = i < m ? score_key(sc[i]) : 0u;
        const int eq = want > 0 && i < m && k == T;
        const int gt = want > 0 && i < m && k > T;
        int eq_total;
        const int eq_rank = eq_before + cta_exclusive(eq, &eq_total, warp_sums);
        const int keep = gt || (eq && eq_rank < left) || (i >= m && i < it.n);
        int kept_total;
        const int pos = kept_before + cta_exclusive(keep, &kept_total, warp_sums);
        if (keep)
            a.src[(size_t)it.off + (size_t)pos] = i;
        eq_before += eq_total;
        kept_before += kept_total;
    }
    if (threadIdx.x == 0 && kept_before != it.n_keep && a.fault != nullptr)
        *a.fault = 1; // unreachable: the radix passes count exactly
}

static cudaError_t launch_select(const tg_cuda_trig_select_args &a)
{
    trig_select_kernel<<<a.n_items, kSelThreads, 0, (cudaStream_t)a.stream>>>(a);
    return cudaGetLastError();
}

static cudaError_t launch_score(const tg_cuda_trig_score_args &a)
{
    trig_score_kernel<<<a.n_items, kThreads, 0, (cudaStream_t)a.stream>>>(a);
    return cudaGetLastError();
}

static cudaError_t launch_compact(const tg_cuda_trig_compact_args &a)
{
    trig_compact_kernel<<<a.n_items, kThreads, 0, (cudaStream_t)a.stream>>>(a);
    return cudaGetLastError();
}

static int check_pages(const tg_cuda_trig_pages *pg, char *err, size_t errlen)
{
    if (pg->pool == nullptr || pg->indptr == nullptr || pg->indices == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig: pool, indptr and indices are required");
    if (pg->heads_per_group < 1 || pg->page_size < 1 || pg->n_pages < 1 ||
        pg->n_rows < 1 || pg->head_dim < 2 || pg->head_dim % 2 != 0 ||
        pg->head_dim > 2 * kMaxHalf)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig: bad page shape (H_p %d, P %d, d %d, %lld "
                          "pages, %d rows; d must be even and <= %d)",
                          pg->heads_per_group, pg->page_size, pg->head_dim,
                          (long long)pg->n_pages, (int)pg->n_rows,
                          2 * kMaxHalf);
    return 0;
}

extern "C" int tg_cuda_trig_score(const struct tg_cuda_trig_score_args *a,
                                  char *err, size_t errlen)
{
    if (a == nullptr || a->n_items < 0)
        return tg_err_set(err, errlen, TG_EINVAL, "trig score: bad arguments");
    if (a->n_items == 0)
        return 0;
    int rc = check_pages(&a->pg, err, errlen);
    if (rc != 0)
        return rc;
    if (a->items == nullptr || a->re == nullptr || a->im == nullptr ||
        a->abs == nullptr || a->inv_freq == nullptr || a->score == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig score: items, statistics, frequencies and "
                          "scores are required");
    if (a->n_q_per_kv < 1 || a->n_q_per_kv > kMaxG || a->n_q_heads < 1 ||
        a->n_layers < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig score: G %d (1..%d), %d query heads, %d "
                          "layers", a->n_q_per_kv, kMaxG, a->n_q_heads,
                          a->n_layers);
    TG_CUDA_TRY(launch_score(*a));
    return 0;
}

extern "C" int tg_cuda_trig_compact(const struct tg_cuda_trig_compact_args *a,
                                    char *err, size_t errlen)
{
    if (a == nullptr || a->n_items < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig compact: bad arguments");
    if (a->n_items == 0)
        return 0;
    int rc = check_pages(&a->pg, err, errlen);
    if (rc != 0)
        return rc;
    if (a->items == nullptr || a->src == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig compact: items and survivors are required");
    TG_CUDA_TRY(launch_compact(*a));
    return 0;
}

extern "C" int tg_cuda_trig_select(const struct tg_cuda_trig_select_args *a,
                                   char *err, size_t errlen)
{
    if (a == nullptr || a->n_items < 0 || a->window < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig select: bad arguments (items %d, window %d)",
                          a == nullptr ? 0 : a->n_items,
                          a == nullptr ? 0 : a->window);
    if (a->n_items == 0)
        return 0;
    if (a->items == nullptr || a->score == nullptr || a->src == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "trig select: items, scores and survivors are "
                          "required");
    TG_CUDA_TRY(launch_select(*a));
    return 0;
}
