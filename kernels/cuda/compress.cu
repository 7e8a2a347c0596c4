// compress.cu — fused per-chunk KV compression on the device: snapkv key
// scoring, per-head top-k selection with forced keys, and the append of the
// kept rows into the group pages (see compress.h; DESIGN.md §4.3-4.4).
// Three layers per op: static __global__ kernel, static launcher on a
// stream, checked extern "C" entry. The CPU reference is
// kernels/cpu/cpu_score.c.
//
// Scoring runs in two kernels so that every block has independent work:
//  1. snap_stats_kernel: one block per query row (KV head h, query head g of
//     its group, window query i) computes the softmax statistics of that row
//     over keys j <= i: the max m and the sum s of exp(z_j - m), with
//     z_j = q_i . k_j * scale (online rescaling, Milakov & Gimelshein 2018,
//     "Online normalizer calculation for softmax").
//  2. snap_pool_kernel: one block per (head, tile of keys) recomputes z_j
//     for its keys against every query row, accumulates
//     sum_rows exp(z_j - m) / s, and applies the width-5 average pooling on
//     the tile (it carries a halo of 2 keys on each side, so no second pass
//     over global memory is needed).
// Recomputing the dot products costs one extra pass of G*W*n*d
// multiply-adds per head but needs only Hkv*G*W*2 floats of workspace and
// keeps every sum in a fixed order (deterministic scores).
#include "kernels/cuda/compress.h"
#include "kernels/cuda/cuda_check.cuh"

#include <cuda_bf16.h>
#include <cstdint>

namespace {

constexpr int kWarp = 32;
constexpr int kStatsThreads = 128;           // 4 warps per query row
constexpr int kPoolThreads = 256;            // 8 warps per key tile
constexpr int kPoolKeys = kWarp;             // keys per tile, halo included
constexpr int kPoolOut = kPoolKeys - 4;      // pooled outputs per tile
constexpr int kQRegs =
    TG_CUDA_COMPRESS_MAX_HEAD_DIM / kWarp;   // q elements per lane
constexpr int kAppendWarps = 4;              // kept rows per append block

// Per-head arrays of the append and select launches, passed by value in the
// kernel parameters (2 KB of the 4 KB limit for TG_CUDA_COMPRESS_MAX_KV_HEADS =
// 256).
struct heads_arg {
    int32_t keep[TG_CUDA_COMPRESS_MAX_KV_HEADS];  // rows kept per head
    int16_t group[TG_CUDA_COMPRESS_MAX_KV_HEADS]; // group of each head
    int16_t
        slot[TG_CUDA_COMPRESS_MAX_KV_HEADS]; // slot of each head in its pages
};

} // namespace

static __device__ __forceinline__ float warp_sum(float x)
{
    for (int o = kWarp / 2; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// ---- scoring: per-row softmax statistics -------------------------------

// grid (G*W, Hkv), block kStatsThreads. Row r = g*W + w is query i = n-W+w
// of query head h*G + g. stats (Hkv, G*W) gets (max, sum of exp(z - max)).
static __global__ void snap_stats_kernel(const __nv_bfloat16 *__restrict__ q,
                                         const __nv_bfloat16 *__restrict__ k,
                                         int n, int Hq, int Hkv, int d, int W,
                                         float scale,
                                         float2 *__restrict__ stats)
{
    __shared__ float wm[kStatsThreads / kWarp], ws[kStatsThreads / kWarp];
    const int h = blockIdx.y, r = blockIdx.x;
    const int G = Hq / Hkv, g = r / W, i = n - W + r % W;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int nwarps = blockDim.x / kWarp;
    const __nv_bfloat16 *qi = q + ((size_t)i * Hq + (size_t)h * G + g) * d;
    float qv[kQRegs];
#pragma unroll
    for (int e = 0; e < kQRegs; e++) {
        int c = lane + kWarp * e;
        qv[e] = c < d ? __bfloat162float(qi[c]) : 0.0f;
    }
    // One warp per key: lanes split d, a butterfly sum gives every lane z.
    float m = -INFINITY, s = 0.0f;
    for (int j = warp; j <= i; j += nwarps) {
        const __nv_bfloat16 *kj = k + ((size_t)j * Hkv + h) * d;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kQRegs; e++) {
            int c = lane + kWarp * e;
            if (c < d)
                dot += qv[e] * __bfloat162float(kj[c]);
        }
        // Rounded product, no FMA contraction: z as the CPU computes it.
        float z = __fmul_rn(warp_sum(dot), scale);
        if (z > m) {
            s = s * expf(m - z) + 1.0f; // m = -inf at first: 0 * 0 + 1
            m = z;
        } else {
            s += expf(z - m);
        }
    }
    if (lane == 0) {
        wm[warp] = m;
        ws[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
        for (int w = 0; w < nwarps; w++)
            mx = fmaxf(mx, wm[w]);
        float sum = 0.0f;
        for (int w = 0; w < nwarps; w++)
            if (ws[w] > 0.0f) // a warp that saw no key holds (-inf, 0)
                sum += ws[w] * expf(wm[w] - mx);
        stats[(size_t)h * gridDim.x + r] = make_float2(mx, sum);
    }
}

// ---- scoring: accumulation over rows and pooling ------------------------

// grid (ceil(n / kPoolOut), Hkv), block kPoolThreads, dynamic shared memory
// pool_smem_bytes(d). The tile covers keys j0 .. j0+kPoolKeys with
// j0 = blockIdx.x * kPoolOut - 2; lane l of every warp owns key j0 + l and
// warp w takes query rows w, w + 8, ...; the partial sums are added in warp
// order, so scores do not depend on scheduling.
static __global__ void snap_pool_kernel(const __nv_bfloat16 *__restrict__ q,
                                        const __nv_bfloat16 *__restrict__ k,
                                        int n, int Hq, int Hkv, int d, int W,
                                        float scale,
                                        const float2 *__restrict__ stats,
                                        float *__restrict__ scores)
{
    extern __shared__ float smem[];
    const int nwarps = kPoolThreads / kWarp;
    const int kst = d + 1; // padded row stride: lanes hit distinct banks
    float *ks = smem;                          // (kPoolKeys, d + 1)
    float *qs = ks + kPoolKeys * kst;          // (nwarps, d)
    float *part = qs + nwarps * d;             // (nwarps, kPoolKeys)
    float *acc = part + nwarps * kPoolKeys;    // (kPoolKeys)
    const int h = blockIdx.y, G = Hq / Hkv, rows = G * W;
    const int j0 = (int)blockIdx.x * kPoolOut - 2;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;

    for (int x = threadIdx.x; x < kPoolKeys * d; x += blockDim.x) {
        int jj = x / d, c = x % d, j = j0 + jj;
        ks[jj * kst + c] = (j >= 0 && j < n)
                               ? __bfloat162float(k[((size_t)j * Hkv + h) * d + c])
                               : 0.0f;
    }
    __syncthreads();

    const int j = j0 + lane;
    const bool valid = j >= 0 && j < n;
    const float *kj = ks + lane * kst;
    float *qw = qs + warp * d;
    float a = 0.0f;
    for (int r = warp; r < rows; r += nwarps) {
        const int g = r / W, i = n - W + r % W;
        const __nv_bfloat16 *qi = q + ((size_t)i * Hq + (size_t)h * G + g) * d;
        for (int c = lane; c < d; c += kWarp)
            qw[c] = __bfloat162float(qi[c]);
        __syncwarp();
        if (valid && j <= i) {
            float dot = 0.0f;
            for (int c = 0; c < d; c++)
                dot += qw[c] * kj[c];
            float2 st = stats[(size_t)h * rows + r];
            a += expf(__fmul_rn(dot, scale) - st.x) / st.y;
        }
        __syncwarp(); // qw is rewritten by the next row
    }
    part[warp * kPoolKeys + lane] = a;
    __syncthreads();
    if (threadIdx.x < kPoolKeys) {
        float t = 0.0f;
        for (int w = 0; w < nwarps; w++)
            t += part[w * kPoolKeys + threadIdx.x];
        acc[threadIdx.x] = t;
    }
    __syncthreads();
    if (threadIdx.x < kPoolOut) {
        // Output key jo = j0 + 2 + t sits at tile index t + 2; its pooling
        // window is tile indices t .. t + 4, zero outside [0, n) because
        // invalid keys accumulated nothing (count_include_pad).
        const int t = threadIdx.x, jo = j0 + 2 + t;
        if (jo < n) {
            float p = acc[t] + acc[t + 1] + acc[t + 2] + acc[t + 3] + acc[t + 4];
            scores[(size_t)h * n + jo] = p / (float)rows / 5.0f;
        }
    }
}

static size_t pool_smem_bytes(int d)
{
    const int nwarps = kPoolThreads / kWarp;
    return sizeof(float) * ((size_t)kPoolKeys * (d + 1) + (size_t)nwarps * d +
                            (size_t)nwarps * kPoolKeys + kPoolKeys);
}

static int score_window(int n, int window)
{
    return window > 0 && window < n ? window : n;
}

static int launch_score(const struct tg_cuda_compress_chunk *c, float *scores,
                        float2 *stats, cudaStream_t stream)
{
    const int W = score_window(c->n, c->window);
    const int G = c->n_q_heads / c->n_kv_heads;
    const __nv_bfloat16 *q = reinterpret_cast<const __nv_bfloat16 *>(c->q);
    const __nv_bfloat16 *k = reinterpret_cast<const __nv_bfloat16 *>(c->k);
    dim3 g1((unsigned)(G * W), (unsigned)c->n_kv_heads);
    snap_stats_kernel<<<g1, kStatsThreads, 0, stream>>>(
        q, k, c->n, c->n_q_heads, c->n_kv_heads, c->head_dim, W, c->scale,
        stats);
    TG_CUDA_LAUNCH_TRY();
    dim3 g2((unsigned)((c->n + kPoolOut - 1) / kPoolOut), (unsigned)c->n_kv_heads);
    snap_pool_kernel<<<g2, kPoolThreads, pool_smem_bytes(c->head_dim), stream>>>(
        q, k, c->n, c->n_q_heads, c->n_kv_heads, c->head_dim, W, c->scale,
        stats, scores);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// ---- selection ----------------------------------------------------------

// Sort key of a score for an ascending sort that yields (score desc, index
// asc): the float's bits mapped to an unsigned order (negatives flipped,
// positives offset), inverted for descending, index in the low word.
static __device__ __forceinline__ uint64_t rank_key(float x, int i)
{
    uint32_t u = __float_as_uint(x);
    uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)~asc << 32) | (uint32_t)i;
}

// Bitonic sort of a[0..n2) ascending, n2 a power of two (Batcher 1968,
// "Sorting networks and their applications"). All threads of the block
// call it; it ends synchronised.
static __device__ void bitonic_sort(uint64_t *a, int n2)
{
    __syncthreads();
    for (int kk = 2; kk <= n2; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n2; i += blockDim.x) {
                int l = i ^ j;
                if (l > i) {
                    uint64_t x = a[i], y = a[l];
                    bool up = (i & kk) == 0;
                    if ((x > y) == up) {
                        a[i] = y;
                        a[l] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// grid (Hkv), block min(1024, n2 / 2) (at least one warp), dynamic shared
// memory n2 * 8 bytes. Sorts the head's keys by rank, keeps the first
// keep[h], then sorts those indices ascending (padding sorts last).
static __global__ void select_kernel(const float *__restrict__ scores, int n,
                                     int n2, int64_t start, int Wf, int n_sink,
                                     heads_arg heads, int32_t *__restrict__ idx)
{
    extern __shared__ uint64_t keys[];
    const int h = blockIdx.x, kk = heads.keep[h];
    const float *s = scores + (size_t)h * n;
    for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        if (i < n) {
            float x = s[i];
            if (i >= n - Wf || start + i < (int64_t)n_sink)
                x = INFINITY; // forced
            else if (isnan(x))
                x = -INFINITY; // NaN ranks last: the order stays total
            else if (x == 0.0f)
                x = 0.0f; // -0 ties with +0, as a float compare does
            keys[i] = rank_key(x, i);
        } else {
            keys[i] = ~0ull; // padding: after every real key
        }
    }
    bitonic_sort(keys, n2);
    for (int i = threadIdx.x; i < n2; i += blockDim.x)
        keys[i] = i < kk ? (keys[i] & 0xffffffffull) : ~0ull;
    bitonic_sort(keys, n2);
    for (int i = threadIdx.x; i < kk; i += blockDim.x)
        idx[(size_t)h * n + i] = (int32_t)keys[i];
}

static int next_pow2(int n)
{
    int p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

static int launch_select(const float *scores, int n, int n_kv_heads,
                         int64_t start, int window, int n_sink,
                         const heads_arg &heads, int32_t *idx,
                         cudaStream_t stream)
{
    const int n2 = next_pow2(n);
    int threads = n2 / 2 > 1024 ? 1024 : n2 / 2;
    if (threads < kWarp)
        threads = kWarp;
    const int Wf = window > 0 ? (window < n ? window : n) : 0;
    select_kernel<<<n_kv_heads, threads, (size_t)n2 * sizeof(uint64_t), stream>>>(
        scores, n, n2, start, Wf, n_sink, heads, idx);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// ---- append -------------------------------------------------------------

struct append_geom {
    int n, Hkv, d, Hp, P;
    int64_t n_pages;
};

// grid (ceil(max keep / kAppendWarps), Hkv), block kAppendWarps warps; one
// warp copies one kept row's K and V. T is the copy unit (uint4 = 8 bf16
// when rows are 16-byte aligned, else uint16_t); d counts T units here.
template <typename T>
static __global__ void append_kernel(append_geom gm, heads_arg heads,
                                     const T *__restrict__ k,
                                     const T *__restrict__ v,
                                     const int32_t *__restrict__ idx,
                                     const int32_t *__restrict__ indptr,
                                     const int32_t *__restrict__ indices,
                                     const int32_t *__restrict__ npages,
                                     const int32_t *__restrict__ lens,
                                     const int32_t *__restrict__ head_lens,
                                     T *__restrict__ pool,
                                     int32_t *__restrict__ fault)
{
    const int h = blockIdx.y;
    const int t = (int)blockIdx.x * kAppendWarps + (int)threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (t >= heads.keep[h])
        return;
    const int src = idx != nullptr ? idx[(size_t)h * gm.n + t] : t;
    const int g = heads.group[h], slot = heads.slot[h];
    const int64_t len = head_lens != nullptr ? head_lens[h] : lens[g];
    const int64_t pos = len + t;
    bool ok = src >= 0 && src < gm.n && len >= 0 && pos / gm.P < npages[g];
    int64_t page = -1;
    if (ok) {
        page = indices[indptr[g] + pos / gm.P];
        ok = page >= 0 && page < gm.n_pages;
    }
    if (!ok) {
        if (lane == 0 && fault != nullptr)
            *fault = 1;
        return;
    }
    const size_t d = (size_t)gm.d, P = (size_t)gm.P;
    T *dk = pool + (((size_t)page * gm.Hp + slot) * 2 * P + (size_t)(pos % gm.P)) * d;
    T *dv = dk + P * d;
    const size_t so = ((size_t)src * gm.Hkv + h) * d;
    for (size_t c = lane; c < d; c += kWarp) {
        dk[c] = k[so + c];
        dv[c] = v[so + c];
    }
}

static int launch_append(const struct tg_cuda_compress_dst *dst,
                         const uint16_t *k, const uint16_t *v, int n,
                         const int32_t *idx, const heads_arg &heads,
                         int max_keep, cudaStream_t stream)
{
    if (max_keep == 0)
        return 0;
    append_geom gm = {n, dst->n_kv_heads, dst->head_dim, dst->heads_per_group,
                      dst->page_size, dst->n_pages};
    dim3 grid((unsigned)((max_keep + kAppendWarps - 1) / kAppendWarps),
              (unsigned)dst->n_kv_heads);
    const int threads = kAppendWarps * kWarp;
    auto aligned = [](const void *p) { return ((uintptr_t)p % 16) == 0; };
    if (dst->head_dim % 8 == 0 && aligned(k) && aligned(v) && aligned(dst->pool)) {
        gm.d = dst->head_dim / 8;
        append_kernel<uint4><<<grid, threads, 0, stream>>>(
            gm, heads, reinterpret_cast<const uint4 *>(k),
            reinterpret_cast<const uint4 *>(v), idx, dst->indptr, dst->indices,
            dst->npages, dst->lens, dst->head_lens,
            reinterpret_cast<uint4 *>(dst->pool),
            dst->fault);
    } else {
        append_kernel<uint16_t><<<grid, threads, 0, stream>>>(
            gm, heads, k, v, idx, dst->indptr, dst->indices, dst->npages,
            dst->lens, dst->head_lens, dst->pool, dst->fault);
    }
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// ---- argument checks (host, before anything is queued) ------------------

static int check_chunk(const struct tg_cuda_compress_chunk *c)
{
    if (c == nullptr || c->n < 0 || c->n > TG_CUDA_COMPRESS_MAX_CHUNK ||
        c->n_kv_heads < 1 || c->n_kv_heads > TG_CUDA_COMPRESS_MAX_KV_HEADS ||
        c->n_q_heads < 1 || c->n_q_heads % c->n_kv_heads != 0 ||
        c->head_dim < 1 || c->head_dim > TG_CUDA_COMPRESS_MAX_HEAD_DIM ||
        c->start < 0)
        return TG_EINVAL;
    if (c->n > 0 && (c->q == nullptr || c->k == nullptr))
        return TG_EINVAL;
    return 0;
}

static int check_keep(const int32_t *keep, int n, int n_kv_heads,
                      heads_arg *heads, int *max_keep)
{
    if (keep == nullptr || n_kv_heads < 1 ||
        n_kv_heads > TG_CUDA_COMPRESS_MAX_KV_HEADS)
        return TG_EINVAL;
    int mx = 0;
    for (int h = 0; h < n_kv_heads; h++) {
        if (keep[h] < 0 || keep[h] > n)
            return TG_EINVAL;
        heads->keep[h] = keep[h];
        mx = keep[h] > mx ? keep[h] : mx;
    }
    *max_keep = mx;
    return 0;
}

// Validates dst and fills the group/slot arrays; keep must already be in
// heads (without per-head lengths a group's heads must keep the same
// count: they append at one shared offset).
static int check_dst(const struct tg_cuda_compress_dst *dst, heads_arg *heads,
                     int max_keep)
{
    if (dst == nullptr || dst->n_kv_heads < 1 ||
        dst->n_kv_heads > TG_CUDA_COMPRESS_MAX_KV_HEADS || dst->head_dim < 1 ||
        dst->head_dim > TG_CUDA_COMPRESS_MAX_HEAD_DIM ||
        dst->heads_per_group < 1 || dst->page_size < 1 || dst->n_groups < 1 ||
        dst->n_pages < 0 || dst->head_group == nullptr ||
        dst->head_slot == nullptr)
        return TG_EINVAL;
    if (max_keep > 0 &&
        (dst->pool == nullptr || dst->indptr == nullptr ||
         dst->indices == nullptr || dst->npages == nullptr ||
         dst->lens == nullptr))
        return TG_EINVAL;
    int group_keep[TG_CUDA_COMPRESS_MAX_KV_HEADS];
    for (int g = 0; g < dst->n_groups && g < TG_CUDA_COMPRESS_MAX_KV_HEADS; g++)
        group_keep[g] = -1;
    for (int h = 0; h < dst->n_kv_heads; h++) {
        int g = dst->head_group[h], s = dst->head_slot[h];
        if (g < 0 || g >= dst->n_groups || g >= TG_CUDA_COMPRESS_MAX_KV_HEADS ||
            s < 0 || s >= dst->heads_per_group ||
            s >= TG_CUDA_COMPRESS_MAX_KV_HEADS)
            return TG_EINVAL;
        // Two heads in one slot of one group would overwrite each other.
        for (int h2 = 0; h2 < h; h2++)
            if (dst->head_group[h2] == g && dst->head_slot[h2] == s)
                return TG_EINVAL;
        if (dst->head_lens == nullptr && group_keep[g] >= 0 &&
            group_keep[g] != heads->keep[h])
            return TG_EINVAL; // a group's heads share one length
        group_keep[g] = heads->keep[h];
        heads->group[h] = (int16_t)g;
        heads->slot[h] = (int16_t)s;
    }
    return 0;
}

// ---- entries ------------------------------------------------------------

extern "C" size_t tg_cuda_compress_workspace_bytes(int n, int n_q_heads,
                                                   int n_kv_heads, int window)
{
    if (n <= 0 || n_kv_heads < 1 || n_q_heads < 1 ||
        n_q_heads % n_kv_heads != 0)
        return 0;
    return (size_t)n_q_heads * (size_t)score_window(n, window) * sizeof(float2);
}

// The scoring workspace is read as float2: a misaligned pointer would
// fault on the device (a sticky error) instead of failing the call.
static bool ws_ok(const struct tg_cuda_compress_chunk *c, const void *ws,
                  size_t ws_bytes)
{
    return ws != nullptr && ((uintptr_t)ws % alignof(float2)) == 0 &&
           ws_bytes >= tg_cuda_compress_workspace_bytes(
                           c->n, c->n_q_heads, c->n_kv_heads, c->window);
}

extern "C" int
tg_cuda_compress_score_snapkv(const struct tg_cuda_compress_chunk *c,
                              float *scores, void *ws, size_t ws_bytes,
                              void *stream)
{
    int rc = check_chunk(c);
    if (rc != 0)
        return rc;
    if (c->n == 0)
        return 0;
    if (scores == nullptr || !ws_ok(c, ws, ws_bytes))
        return TG_EINVAL;
    return launch_score(c, scores, static_cast<float2 *>(ws),
                        (cudaStream_t)stream);
}

extern "C" int tg_cuda_compress_select_topk(const float *scores, int n,
                                            int n_kv_heads, const int32_t *keep,
                                            int64_t start, int window,
                                            int n_sink, int32_t *idx,
                                            void *stream)
{
    if (n < 0 || n > TG_CUDA_COMPRESS_MAX_CHUNK || start < 0)
        return TG_EINVAL;
    heads_arg heads = {};
    int max_keep = 0;
    int rc = check_keep(keep, n, n_kv_heads, &heads, &max_keep);
    if (rc != 0)
        return rc;
    if (n == 0)
        return 0;
    if (scores == nullptr || idx == nullptr)
        return TG_EINVAL;
    return launch_select(scores, n, n_kv_heads, start, window, n_sink, heads,
                         idx, (cudaStream_t)stream);
}

extern "C" int
tg_cuda_compress_kv_append(const struct tg_cuda_compress_dst *dst,
                           const uint16_t *k, const uint16_t *v, int n,
                           const int32_t *idx, const int32_t *n_keep,
                           void *stream)
{
    if (dst == nullptr || n < 0 || dst->n_kv_heads < 1 ||
        dst->n_kv_heads > TG_CUDA_COMPRESS_MAX_KV_HEADS ||
        (idx != nullptr && n_keep == nullptr))
        return TG_EINVAL;
    heads_arg heads = {};
    int max_keep = n;
    if (idx != nullptr) {
        int rc = check_keep(n_keep, n, dst->n_kv_heads, &heads, &max_keep);
        if (rc != 0)
            return rc;
    } else {
        for (int h = 0; h < dst->n_kv_heads; h++)
            heads.keep[h] = n;
    }
    int rc = check_dst(dst, &heads, max_keep);
    if (rc != 0)
        return rc;
    if (max_keep == 0)
        return 0;
    if (k == nullptr || v == nullptr)
        return TG_EINVAL;
    return launch_append(dst, k, v, n, idx, heads, max_keep,
                         (cudaStream_t)stream);
}

extern "C" int tg_cuda_compress_chunk_compress(
    const struct tg_cuda_compress_chunk *c, const int32_t *keep,
    const struct tg_cuda_compress_dst *dst, float *scores, int32_t *idx,
    void *ws, size_t ws_bytes, void *stream)
{
    int rc = check_chunk(c);
    if (rc != 0)
        return rc;
    heads_arg heads = {};
    int max_keep = 0;
    rc = check_keep(keep, c->n, c->n_kv_heads, &heads, &max_keep);
    if (rc != 0)
        return rc;
    rc = check_dst(dst, &heads, max_keep);
    if (rc != 0)
        return rc;
    if (dst->n_kv_heads != c->n_kv_heads || dst->head_dim != c->head_dim)
        return TG_EINVAL;
    if (c->n == 0)
        return 0;
    if (scores == nullptr || idx == nullptr || c->v == nullptr ||
        !ws_ok(c, ws, ws_bytes))
        return TG_EINVAL;
    cudaStream_t st = (cudaStream_t)stream;
    rc = launch_score(c, scores, static_cast<float2 *>(ws), st);
    if (rc == 0)
        rc = launch_select(scores, c->n, c->n_kv_heads, c->start, c->window,
                           c->n_sink, heads, idx, st);
    if (rc == 0)
        rc = launch_append(dst, c->k, c->v, c->n, idx, heads, max_keep, st);
    return rc;
}
