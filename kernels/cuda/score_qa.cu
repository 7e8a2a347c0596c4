// score_qa.cu — keydiff and expected_attention chunk scores on the device,
// and the tg_cuda_score_qa_score dispatcher (see score_qa.h; DESIGN.md §4.4).
// Three layers per op: static __global__ kernels, static launchers on a stream,
// checked extern "C" entries. The CPU reference is kernels/cpu/cpu_score.c.
//
// keydiff, two kernels:
//  1. kd_partial_kernel: one block per (tile of kKdTile keys, KV head) sums
//     the tile's unit keys k_j / ||k_j|| (a zero key adds 0) into a partial
//     anchor in the workspace.
//  2. kd_score_kernel: every block of a head first adds the partial anchors
//     in tile order (so all blocks hold the same anchor bit for bit),
//     divides by n and takes ||a||; then one warp per key computes
//     -(k_j . a) / (||k_j|| ||a||).
// expected_attention, four kernels:
//  1. ea_mu_kernel: per query head, the mean of the last W queries (double
//     sum, as the CPU).
//  2. ea_logit_kernel: per (tile of 32 keys, query head), lane l owns key
//     j0 + l and warp w takes window queries w, w + 8, ...; each lane adds
//     ((q_i - mu) . k_j)^2 over its queries, the warps' partials are added
//     in warp order, and z_j = mu.k_j * scale + 0.5 scale^2 quad / W goes to
//     the workspace (Hq, n).
//  3. ea_stats_kernel: per query head, max and sum of exp(z - max) over the
//     n keys.
//  4. ea_final_kernel: one warp per (key, KV head): ||v_j|| times the mean
//     over the G query heads of exp(z - max) / sum.
// All sums run in a fixed order: the scores are deterministic.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/score_qa.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 8;
constexpr int kThreads = kWarp * kWarps;
constexpr int kRegs =
    TG_CUDA_COMPRESS_MAX_HEAD_DIM / kWarp;      // key elements per lane
constexpr int kKdTile = 64;                     // keys per keydiff block
constexpr int kEaKeys = kWarp;                  // keys per logit block (one per lane)
constexpr int kMaxGridY = 65535;                // query heads ride grid.y
constexpr size_t kAlign = 256;                  // workspace part alignment

static_assert(kThreads >= TG_CUDA_COMPRESS_MAX_HEAD_DIM,
              "one thread per anchor element");

} // namespace

static __device__ __forceinline__ float warp_sum(float x)
{
    for (int o = kWarp / 2; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

static __device__ __forceinline__ float warp_max(float x)
{
    for (int o = kWarp / 2; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// ---- keydiff ------------------------------------------------------------

// grid (ceil(n / kKdTile), Hkv), block kThreads. part (Hkv, ntiles, d)
// receives sum over the tile's keys of k_j / ||k_j||.
static __global__ void kd_partial_kernel(const __nv_bfloat16 *__restrict__ k,
                                         int n, int Hkv, int d,
                                         float *__restrict__ part)
{
    __shared__ float wpart[kWarps][TG_CUDA_COMPRESS_MAX_HEAD_DIM];
    const int h = blockIdx.y, tile = blockIdx.x, ntiles = gridDim.x;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int j0 = tile * kKdTile;
    float acc[kRegs];
#pragma unroll
    for (int e = 0; e < kRegs; e++)
        acc[e] = 0.0f;
    for (int r = warp; r < kKdTile; r += kWarps) {
        const int j = j0 + r;
        if (j >= n) // the same for the whole warp
            break;
        const __nv_bfloat16 *kj = k + ((size_t)j * Hkv + h) * d;
        float x[kRegs];
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < kRegs; e++) {
            const int c = lane + kWarp * e;
            x[e] = c < d ? __bfloat162float(kj[c]) : 0.0f;
            ss += x[e] * x[e];
        }
        ss = warp_sum(ss);
        const float inv = ss > 0.0f ? 1.0f / sqrtf(ss) : 0.0f;
#pragma unroll
        for (int e = 0; e < kRegs; e++)
            acc[e] += x[e] * inv;
    }
#pragma unroll
    for (int e = 0; e < kRegs; e++) {
        const int c = lane + kWarp * e;
        if (c < d)
            wpart[warp][c] = acc[e];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < kWarps; w++)
            s += wpart[w][c];
        part[((size_t)h * ntiles + tile) * d + c] = s;
    }
}

// grid (ceil(n / kKdTile), Hkv), block kThreads; scores (Hkv, n).
static __global__ void kd_score_kernel(const __nv_bfloat16 *__restrict__ k,
                                       int n, int Hkv, int d,
                                       const float *__restrict__ part,
                                       float *__restrict__ scores)
{
    __shared__ float a[TG_CUDA_COMPRESS_MAX_HEAD_DIM];
    __shared__ float red[kWarps];
    const int h = blockIdx.y, ntiles = gridDim.x;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float s = 0.0f;
        for (int t = 0; t < ntiles; t++)
            s += part[((size_t)h * ntiles + t) * d + c];
        s /= (float)n;
        a[c] = s;
        sq += s * s;
    }
    sq = warp_sum(sq);
    if (lane == 0)
        red[warp] = sq;
    __syncthreads(); // a and red are complete
    float an2 = 0.0f;
    for (int w = 0; w < kWarps; w++)
        an2 += red[w];
    const float inv_an = an2 > 0.0f ? 1.0f / sqrtf(an2) : 0.0f;
    const int j0 = blockIdx.x * kKdTile;
    for (int r = warp; r < kKdTile; r += kWarps) {
        const int j = j0 + r;
        if (j >= n) // the same for the whole warp
            break;
        const __nv_bfloat16 *kj = k + ((size_t)j * Hkv + h) * d;
        float ss = 0.0f, dot = 0.0f;
        for (int c = lane; c < d; c += kWarp) {
            const float x = __bfloat162float(kj[c]);
            ss += x * x;
            dot += x * a[c];
        }
        ss = warp_sum(ss);
        dot = warp_sum(dot);
        if (lane == 0) {
            const float inv = ss > 0.0f ? 1.0f / sqrtf(ss) : 0.0f;
            scores[(size_t)h * n + j] = -(dot * inv) * inv_an;
        }
    }
}

static int kd_tiles(int n)
{
    return (n + kKdTile - 1) / kKdTile;
}

static int launch_keydiff(const struct tg_cuda_compress_chunk *c, float *scores,
                          float *part, cudaStream_t stream)
{
    const __nv_bfloat16 *k = reinterpret_cast<const __nv_bfloat16 *>(c->k);
    dim3 grid((unsigned)kd_tiles(c->n), (unsigned)c->n_kv_heads);
    kd_partial_kernel<<<grid, kThreads, 0, stream>>>(k, c->n, c->n_kv_heads,
                                                     c->head_dim, part);
    TG_CUDA_LAUNCH_TRY();
    kd_score_kernel<<<grid, kThreads, 0, stream>>>(k, c->n, c->n_kv_heads,
                                                   c->head_dim, part, scores);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// ---- expected attention -------------------------------------------------

// grid (Hq), block kThreads. mu (Hq, d) = mean of queries n-W .. n-1.
static __global__ void ea_mu_kernel(const __nv_bfloat16 *__restrict__ q,
                                    int n, int Hq, int d, int W,
                                    float *__restrict__ mu)
{
    const int qh = blockIdx.x;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        double s = 0.0;
#pragma unroll 8
        for (int i = n - W; i < n; i++)
            s += (double)__bfloat162float(q[((size_t)i * Hq + qh) * d + c]);
        mu[(size_t)qh * d + c] = (float)(s / W);
    }
}

// grid (ceil(n / kEaKeys), Hq), block kThreads, dynamic shared memory
// ea_logit_smem_bytes(d). z (Hq, n).
static __global__ void ea_logit_kernel(const __nv_bfloat16 *__restrict__ q,
                                       const __nv_bfloat16 *__restrict__ k,
                                       int n, int Hq, int Hkv, int d, int W,
                                       float scale,
                                       const float *__restrict__ mu,
                                       float *__restrict__ z)
{
    extern __shared__ float smem[];
    const int kst = d + 1;                   // padded: lanes hit distinct banks
    float *ks = smem;                        // (kEaKeys, d + 1) the tile's keys
    float *cs = ks + kEaKeys * kst;          // (kWarps, d) a centred query per warp
    float *mus = cs + kWarps * d;            // (d)
    float *part = mus + d;                   // (kWarps, kEaKeys)
    const int qh = blockIdx.y, G = Hq / Hkv, h = qh / G;
    const int j0 = blockIdx.x * kEaKeys;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;

    for (int x = threadIdx.x; x < kEaKeys * d; x += blockDim.x) {
        const int jj = x / d, c = x % d, j = j0 + jj;
        ks[jj * kst + c] =
            j < n ? __bfloat162float(k[((size_t)j * Hkv + h) * d + c]) : 0.0f;
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        mus[c] = mu[(size_t)qh * d + c];
    __syncthreads();

    // Keys past n are zero rows: they add 0 and are never written.
    const float *kj = ks + lane * kst;
    float *cw = cs + warp * d;
    float quad = 0.0f;
    for (int r = warp; r < W; r += kWarps) {
        const __nv_bfloat16 *qi = q + ((size_t)(n - W + r) * Hq + qh) * d;
        for (int c = lane; c < d; c += kWarp)
            cw[c] = __bfloat162float(qi[c]) - mus[c];
        __syncwarp();
        float t = 0.0f;
        for (int c = 0; c < d; c++)
            t += cw[c] * kj[c];
        quad += t * t;
        __syncwarp(); // cw is rewritten by the next query
    }
    part[warp * kEaKeys + lane] = quad;
    __syncthreads();
    if (threadIdx.x < kEaKeys && j0 + (int)threadIdx.x < n) {
        const int jj = threadIdx.x;
        float m1 = 0.0f;
        for (int c = 0; c < d; c++)
            m1 += mus[c] * ks[jj * kst + c];
        float qs = 0.0f;
        for (int w = 0; w < kWarps; w++)
            qs += part[w * kEaKeys + jj];
        qs /= (float)W;
        z[(size_t)qh * n + j0 + jj] = m1 * scale + 0.5f * scale * scale * qs;
    }
}

static size_t ea_logit_smem_bytes(int d)
{
    return sizeof(float) * ((size_t)kEaKeys * (d + 1) + (size_t)kWarps * d +
                            (size_t)d + (size_t)kWarps * kEaKeys);
}

// grid (Hq), block kThreads. stats[qh] = (max_j z, sum_j exp(z - max)).
static __global__ void ea_stats_kernel(const float *__restrict__ z, int n,
                                       float2 *__restrict__ stats)
{
    __shared__ float red[kWarps];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const float *zr = z + (size_t)blockIdx.x * n;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        m = fmaxf(m, zr[j]);
    m = warp_max(m);
    if (lane == 0)
        red[warp] = m;
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; w++)
        mx = fmaxf(mx, red[w]);
    __syncthreads(); // every thread has read red before it is reused
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        s += expf(zr[j] - mx);
    s = warp_sum(s);
    if (lane == 0)
        red[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < kWarps; w++)
            sum += red[w];
        stats[blockIdx.x] = make_float2(mx, sum);
    }
}

// grid (ceil(n / kWarps), Hkv), block kThreads; one warp per key.
static __global__ void ea_final_kernel(const __nv_bfloat16 *__restrict__ v,
                                       const float *__restrict__ z,
                                       const float2 *__restrict__ stats,
                                       int n, int Hq, int Hkv, int d,
                                       float *__restrict__ scores)
{
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int h = blockIdx.y, j = blockIdx.x * kWarps + warp;
    if (j >= n) // the same for the whole warp; no block barrier follows
        return;
    const __nv_bfloat16 *vj = v + ((size_t)j * Hkv + h) * d;
    float ss = 0.0f;
    for (int c = lane; c < d; c += kWarp) {
        const float x = __bfloat162float(vj[c]);
        ss += x * x;
    }
    ss = warp_sum(ss);
    if (lane == 0) {
        const int G = Hq / Hkv;
        float acc = 0.0f;
        for (int g = 0; g < G; g++) {
            const int qh = h * G + g;
            const float2 st = stats[qh];
            acc += expf(z[(size_t)qh * n + j] - st.x) / st.y;
        }
        scores[(size_t)h * n + j] = acc / (float)G * sqrtf(ss);
    }
}

static int score_window(int n, int window)
{
    return window > 0 && window < n ? window : n;
}

static size_t align_up(size_t x)
{
    return (x + kAlign - 1) / kAlign * kAlign;
}

// The three parts of the expected_attention workspace.
struct ea_ws {
    float *mu;     // (Hq, d)
    float *z;      // (Hq, n)
    float2 *stats; // (Hq)
};

static size_t ea_ws_layout(int n, int Hq, int d, void *base, ea_ws *out)
{
    const size_t b_mu = align_up((size_t)Hq * d * sizeof(float));
    const size_t b_z = align_up((size_t)Hq * n * sizeof(float));
    const size_t b_st = align_up((size_t)Hq * sizeof(float2));
    if (out != nullptr) {
        char *p = static_cast<char *>(base);
        out->mu = reinterpret_cast<float *>(p);
        out->z = reinterpret_cast<float *>(p + b_mu);
        out->stats = reinterpret_cast<float2 *>(p + b_mu + b_z);
    }
    return b_mu + b_z + b_st;
}

static int launch_ea(const struct tg_cuda_compress_chunk *c, float *scores,
                     void *ws, cudaStream_t stream)
{
    const int n = c->n, Hq = c->n_q_heads, Hkv = c->n_kv_heads;
    const int d = c->head_dim, W = score_window(n, c->window);
    const __nv_bfloat16 *q = reinterpret_cast<const __nv_bfloat16 *>(c->q);
    const __nv_bfloat16 *k = reinterpret_cast<const __nv_bfloat16 *>(c->k);
    const __nv_bfloat16 *v = reinterpret_cast<const __nv_bfloat16 *>(c->v);
    ea_ws w;
    ea_ws_layout(n, Hq, d, ws, &w);
    ea_mu_kernel<<<Hq, kThreads, 0, stream>>>(q, n, Hq, d, W, w.mu);
    TG_CUDA_LAUNCH_TRY();
    dim3 g2((unsigned)((n + kEaKeys - 1) / kEaKeys), (unsigned)Hq);
    ea_logit_kernel<<<g2, kThreads, ea_logit_smem_bytes(d), stream>>>(
        q, k, n, Hq, Hkv, d, W, c->scale, w.mu, w.z);
    TG_CUDA_LAUNCH_TRY();
    ea_stats_kernel<<<Hq, kThreads, 0, stream>>>(w.z, n, w.stats);
    TG_CUDA_LAUNCH_TRY();
    dim3 g4((unsigned)((n + kWarps - 1) / kWarps), (unsigned)Hkv);
    ea_final_kernel<<<g4, kThreads, 0, stream>>>(v, w.z, w.stats, n, Hq, Hkv,
                                                 d, scores);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// ---- argument checks (host, before anything is queued) ------------------

static bool shape_ok(int n, int n_q_heads, int n_kv_heads, int head_dim)
{
    return n >= 0 && n <= TG_CUDA_COMPRESS_MAX_CHUNK && n_kv_heads >= 1 &&
           n_kv_heads <= TG_CUDA_COMPRESS_MAX_KV_HEADS && n_q_heads >= 1 &&
           n_q_heads <= kMaxGridY && n_q_heads % n_kv_heads == 0 &&
           head_dim >= 1 && head_dim <= TG_CUDA_COMPRESS_MAX_HEAD_DIM;
}

static int check_chunk(const struct tg_cuda_compress_chunk *c, bool need_q,
                       bool need_v)
{
    if (c == nullptr ||
        !shape_ok(c->n, c->n_q_heads, c->n_kv_heads, c->head_dim))
        return TG_EINVAL;
    if (c->n > 0 && (c->k == nullptr || (need_q && c->q == nullptr) ||
                     (need_v && c->v == nullptr)))
        return TG_EINVAL;
    return 0;
}

static int check_out(const struct tg_cuda_compress_chunk *c,
                     enum tg_score_method method, const float *scores,
                     const void *ws, size_t ws_bytes)
{
    const size_t need = tg_cuda_score_qa_workspace_bytes(
        method, c->n, c->n_q_heads, c->n_kv_heads, c->head_dim, c->window);
    if (scores == nullptr || ws == nullptr || ws_bytes < need ||
        ((uintptr_t)ws % 16) != 0)
        return TG_EINVAL;
    return 0;
}

// ---- entries ------------------------------------------------------------

extern "C" size_t tg_cuda_score_qa_workspace_bytes(enum tg_score_method method,
                                                   int n, int n_q_heads,
                                                   int n_kv_heads, int head_dim,
                                                   int window)
{
    if (n <= 0 || !shape_ok(n, n_q_heads, n_kv_heads, head_dim))
        return 0;
    switch (method) {
    case TG_SCORE_SNAPKV:
        return tg_cuda_compress_workspace_bytes(n, n_q_heads, n_kv_heads,
                                                window);
    case TG_SCORE_KEYDIFF:
        return (size_t)n_kv_heads * (size_t)kd_tiles(n) * (size_t)head_dim *
               sizeof(float);
    case TG_SCORE_EXPECTED_ATTENTION:
        return ea_ws_layout(n, n_q_heads, head_dim, nullptr, nullptr);
    case TG_SCORE_GVOTE: // selects by votes, not by a score (gw_gvote)
        return 0;
    }
    return 0;
}

extern "C" int tg_cuda_score_qa_keydiff(const struct tg_cuda_compress_chunk *c,
                                        float *scores, void *ws,
                                        size_t ws_bytes, void *stream)
{
    int rc = check_chunk(c, false, false);
    if (rc != 0)
        return rc;
    if (c->n == 0)
        return 0;
    rc = check_out(c, TG_SCORE_KEYDIFF, scores, ws, ws_bytes);
    if (rc != 0)
        return rc;
    return launch_keydiff(c, scores, static_cast<float *>(ws),
                          (cudaStream_t)stream);
}

extern "C" int
tg_cuda_score_qa_expected_attention(const struct tg_cuda_compress_chunk *c,
                                    float *scores, void *ws, size_t ws_bytes,
                                    void *stream)
{
    int rc = check_chunk(c, true, true);
    if (rc != 0)
        return rc;
    if (!std::isfinite(c->scale))
        return TG_EINVAL;
    if (c->n == 0)
        return 0;
    rc = check_out(c, TG_SCORE_EXPECTED_ATTENTION, scores, ws, ws_bytes);
    if (rc != 0)
        return rc;
    return launch_ea(c, scores, ws, (cudaStream_t)stream);
}

extern "C" int tg_cuda_score_qa_score(enum tg_score_method method,
                                      const struct tg_cuda_compress_chunk *c,
                                      float *scores, void *ws, size_t ws_bytes,
                                      void *stream)
{
    switch (method) {
    case TG_SCORE_SNAPKV:
        return tg_cuda_compress_score_snapkv(c, scores, ws, ws_bytes, stream);
    case TG_SCORE_KEYDIFF:
        return tg_cuda_score_qa_keydiff(c, scores, ws, ws_bytes, stream);
    case TG_SCORE_EXPECTED_ATTENTION:
        return tg_cuda_score_qa_expected_attention(c, scores, ws, ws_bytes,
                                                   stream);
    case TG_SCORE_GVOTE: // selects by votes, not by a score (gw_gvote)
        return TG_EINVAL;
    }
    return TG_EINVAL;
}
