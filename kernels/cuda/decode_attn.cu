// decode_attn.cu — split-map decode attention over ragged head-group pages
// and its log-sum-exp combine (see decode_attn.h). Three layers per op: the
// static kernels, their static launchers on a stream, the checked extern
// "C" entries.
//
// Inside a CTA (4 warps, one (sequence, group, split)): for each slot j of
// the group, the warps take 16-token tiles of the split's token range in
// turn (warp w: tiles w, w + 4, ...), each warp keeping its own online
// softmax state for the G query heads of KV head h(j); the four states are
// merged through shared memory at the end of the slot.
//  - Scores: lane = (tok, half) with tok = lane % 16, half = lane / 16;
//    the lane dots its token's K half-row (d/2 bf16, 16-byte loads) with
//    the G scaled queries held in shared memory (broadcast reads), and one
//    xor-16 shuffle completes the dot.
//  - Softmax: per query head, max and sum over the 16 lanes of the tile by
//    xor shuffles; the running (m, l, acc) are rescaled by e^(m - m_new).
//  - PV: lane = d/32 output elements; for each token of the tile the warp
//    reads one V row (coalesced) and each lane updates its elements of the
//    G accumulators with the probabilities staged in shared memory.
// fp32 everywhere except the bf16 loads.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/decode_attn.h"
#include "kernels/cuda/kv_csr.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

static constexpr int kWarps = 4;
static constexpr int kThreads = 32 * kWarps;
static constexpr int kTile = 16;   // tokens per warp step (lanes 0..15, 16..31)
static constexpr int kMaxHp = 16;  // heads per group the kernel handles
static constexpr int kMaxG = 16;   // query heads per KV head
static constexpr int kMaxSplitsPerLayer = 1 << 20;

// Everything both kernels read; passed by value (kernel parameter space).
struct dec_params {
    const __nv_bfloat16 *q;    // (n_seq, Hq, d)
    const __nv_bfloat16 *pool; // (n_pages, H_p, 2, P, d)
    const int32_t *head_group; // (Hkv)
    const int32_t *head_slot;  // (Hkv)
    tg_cuda_kv_csr table;      // the layer's rows
    const int32_t *offsets;    // (n_groups + 1) this layer's split prefix
    float *ws;                 // (n_seq, Hq, max_splits, d + 2)
    void *out;                 // (n_seq, Hq, d) bf16 or fp32
    int n_seq, n_q_heads, n_kv_heads, n_groups, hp, page_size, head_dim, g;
    int total_splits; // sum_g S[g]: CTAs per sequence
    int max_splits;   // max_g S[g]: workspace stride
    int out_f32;
    float scale;
};

// bf16 is the top half of a binary32, so widening is a shift (exact).
static __device__ __forceinline__ float bf_lo(uint32_t w)
{
    return __uint_as_float(w << 16);
}

static __device__ __forceinline__ float bf_hi(uint32_t w)
{
    return __uint_as_float(w & 0xffff0000u);
}

static __device__ __forceinline__ void unpack_v(uint2 r, float *v)
{
    v[0] = bf_lo(r.x);
    v[1] = bf_hi(r.x);
    v[2] = bf_lo(r.y);
    v[3] = bf_hi(r.y);
}

static __device__ __forceinline__ void unpack_v(unsigned int r, float *v)
{
    v[0] = bf_lo(r);
    v[1] = bf_hi(r);
}

static __device__ __forceinline__ void store_out(const dec_params &p,
                                                 size_t i, float v)
{
    if (p.out_f32)
        static_cast<float *>(p.out)[i] = v;
    else
        static_cast<__nv_bfloat16 *>(p.out)[i] = __float2bfloat16(v);
}

// Split kernel: grid.x = n_seq * total_splits, block = kThreads.
// D = head_dim, GM >= G rounds G up so the accumulators stay in registers
// (query rows gi >= G are zero and never written out).
template <int D, int GM>
static __global__ void __launch_bounds__(kThreads)
decode_split_kernel(const dec_params p)
{
    constexpr int HALF = D / 2; // K elements per lane in the score phase
    constexpr int VPL = D / 32; // output elements per lane in the PV phase
    constexpr int QS = D + 4;   // padded q row: the two halves hit other banks
    static_assert(HALF % 8 == 0 && (VPL == 2 || VPL == 4), "d is 64 or 128");
    // A lane's VPL bf16 of one V row: 8 bytes (d = 128) or 4 (d = 64).
    using vraw_t = typename std::conditional<VPL == 4, uint2, unsigned int>::type;

    __shared__ __align__(16) float q_s[GM][QS];
    __shared__ float p_s[kWarps][GM][kTile];
    __shared__ long long voff_s[kWarps][kTile];
    __shared__ float mrg_acc[kWarps][GM][D];
    __shared__ float mrg_m[kWarps][GM];
    __shared__ float mrg_l[kWarps][GM];
    __shared__ int slot_head[kMaxHp];

    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int seq = (int)(blockIdx.x / (unsigned)p.total_splits);
    const int k = (int)(blockIdx.x % (unsigned)p.total_splits);
    // Which group and split this CTA is: offsets[g] <= k < offsets[g + 1].
    int g = 0;
    while (g + 1 < p.n_groups && p.offsets[g + 1] <= k)
        g++;
    const int split = k - p.offsets[g];
    const int n_split = p.offsets[g + 1] - p.offsets[g];

    const int P = p.page_size;
    const int64_t row = kv_csr_row(p.table, seq, g);
    const int64_t len = p.table.lens[row];
    const int64_t n_pages = (len + P - 1) / P;
    // Contiguous, nearly equal page ranges; empty when split >= n_pages.
    const int64_t pg0 = (int64_t)split * n_pages / n_split;
    const int64_t pg1 = (int64_t)(split + 1) * n_pages / n_split;
    const int64_t t_begin = pg0 * P;
    const int64_t t_end = pg1 * P < len ? pg1 * P : len;
    const int32_t *pages = p.table.indices + p.table.indptr[row];

    // Invert (head_group, head_slot) for this group: slot -> KV head.
    if (threadIdx.x < kMaxHp)
        slot_head[threadIdx.x] = -1;
    __syncthreads();
    for (int h = (int)threadIdx.x; h < p.n_kv_heads; h += kThreads) {
        int j = p.head_slot[h];
        if (p.head_group[h] == g && j >= 0 && j < p.hp)
            slot_head[j] = h;
    }
    __syncthreads();

    const int tok = lane % kTile, half = lane / kTile;
    const unsigned full = 0xffffffffu;
    for (int j = 0; j < p.hp; j++) {
        const int h = slot_head[j]; // the same in every thread
        if (h < 0)
            continue;
        // A head shorter than its row reads only its own tokens.
        const int64_t hl = kv_csr_head_len(p.table, seq, h, t_end);
        const int64_t h_end = hl < t_end ? hl : t_end;
        // The G query rows of KV head h, pre-scaled.
        for (int i = (int)threadIdx.x; i < GM * D; i += kThreads) {
            int gi = i / D, e = i % D;
            float v = 0.0f;
            if (gi < p.g)
                v = __bfloat162float(
                        p.q[((size_t)seq * p.n_q_heads + (size_t)h * p.g + gi) *
                                D + e]) * p.scale;
            q_s[gi][e] = v;
        }
        __syncthreads();

        float m[GM], l[GM], acc[GM][VPL];
#pragma unroll
        for (int gi = 0; gi < GM; gi++) {
            m[gi] = -INFINITY;
            l[gi] = 0.0f;
#pragma unroll
            for (int c = 0; c < VPL; c++)
                acc[gi][c] = 0.0f;
        }

        for (int64_t t0 = t_begin + (int64_t)warp * kTile; t0 < h_end;
             t0 += (int64_t)kWarps * kTile) {
            const int64_t t = t0 + tok;
            const bool valid = t < h_end;
            const int64_t left = h_end - t0;
            const int n_valid = left < kTile ? (int)left : kTile;
            long long koff = 0;
            if (valid) {
                const int64_t page = pages[t / P];
                koff = (((page * p.hp + j) * 2) * P + t % P) * (int64_t)D;
            }
            if (half == 0) // the V row sits P*d elements after the K row
                voff_s[warp][tok] = koff + (long long)P * D;
            __syncwarp();
            // Issue the tile's V loads now so they are in flight together
            // with the K loads instead of one row at a time in the PV loop.
            // Invalid tokens read as 0 (their probability is 0 too).
            vraw_t vraw[kTile];
#pragma unroll
            for (int u = 0; u < kTile; u++)
                vraw[u] = u < n_valid
                              ? __ldg(reinterpret_cast<const vraw_t *>(
                                    p.pool + voff_s[warp][u] + lane * VPL))
                              : vraw_t{};
            float dot[GM];
#pragma unroll
            for (int gi = 0; gi < GM; gi++)
                dot[gi] = 0.0f;
            if (valid) {
                const uint4 *kp =
                    reinterpret_cast<const uint4 *>(p.pool + koff + half * HALF);
#pragma unroll
                for (int c = 0; c < HALF / 8; c++) {
                    const uint4 raw = __ldg(kp + c);
                    const float kf[8] = {bf_lo(raw.x), bf_hi(raw.x),
                                         bf_lo(raw.y), bf_hi(raw.y),
                                         bf_lo(raw.z), bf_hi(raw.z),
                                         bf_lo(raw.w), bf_hi(raw.w)};
#pragma unroll
                    for (int gi = 0; gi < GM; gi++) {
                        const float4 *qa = reinterpret_cast<const float4 *>(
                            &q_s[gi][half * HALF + c * 8]);
                        const float4 a = qa[0], b = qa[1];
                        dot[gi] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] +
                                   a.w * kf[3] + b.x * kf[4] + b.y * kf[5] +
                                   b.z * kf[6] + b.w * kf[7];
                    }
                }
            }
#pragma unroll
            for (int gi = 0; gi < GM; gi++) {
                float s = dot[gi] + __shfl_xor_sync(full, dot[gi], 16);
                s = valid ? s : -INFINITY;
                float mx = s;
#pragma unroll
                for (int o = kTile / 2; o > 0; o >>= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(full, mx, o));
                // Finite: token t0 (lane 0) is always valid.
                const float m_new = fmaxf(m[gi], mx);
                const float pr = valid ? expf(s - m_new) : 0.0f;
                float sum = pr;
#pragma unroll
                for (int o = kTile / 2; o > 0; o >>= 1)
                    sum += __shfl_xor_sync(full, sum, o);
                const float alpha = expf(m[gi] - m_new); // 0 when m = -inf
                l[gi] = l[gi] * alpha + sum;
                m[gi] = m_new;
#pragma unroll
                for (int c = 0; c < VPL; c++)
                    acc[gi][c] *= alpha;
                if (half == 0)
                    p_s[warp][gi][tok] = pr;
            }
            __syncwarp();

#pragma unroll
            for (int u = 0; u < kTile; u++) {
                float vf[VPL];
                unpack_v(vraw[u], vf);
#pragma unroll
                for (int gi = 0; gi < GM; gi++) {
                    const float pr = p_s[warp][gi][u];
#pragma unroll
                    for (int c = 0; c < VPL; c++)
                        acc[gi][c] += pr * vf[c];
                }
            }
            __syncwarp(); // p_s / voff_s are rewritten by the next tile
        }

        // Merge the four warps' states (a warp with no tile is neutral).
#pragma unroll
        for (int gi = 0; gi < GM; gi++) {
            if (lane == 0) {
                mrg_m[warp][gi] = m[gi];
                mrg_l[warp][gi] = l[gi];
            }
#pragma unroll
            for (int c = 0; c < VPL; c++)
                mrg_acc[warp][gi][lane * VPL + c] = acc[gi][c];
        }
        __syncthreads();
        for (int i = (int)threadIdx.x; i < p.g * D; i += kThreads) {
            const int gi = i / D, e = i % D;
            float M = -INFINITY;
#pragma unroll
            for (int w = 0; w < kWarps; w++)
                M = fmaxf(M, mrg_m[w][gi]);
            float L = 0.0f, A = 0.0f;
            if (M != -INFINITY) {
#pragma unroll
                for (int w = 0; w < kWarps; w++) {
                    const float c = expf(mrg_m[w][gi] - M);
                    L += c * mrg_l[w][gi];
                    A += c * mrg_acc[w][gi][e];
                }
            }
            const size_t qrow = (size_t)seq * p.n_q_heads + (size_t)h * p.g + gi;
            if (n_split == 1) {
                store_out(p, qrow * D + e, L > 0.0f ? A / L : 0.0f);
            } else {
                float *w = p.ws + (qrow * p.max_splits + split) * (size_t)(D + 2);
                w[e] = A;
                if (e == 0) {
                    w[D] = M;
                    w[D + 1] = L;
                }
            }
        }
        __syncthreads(); // q_s and the merge buffers are reused by slot j + 1
    }
}

// Combine kernel: one warp per (sequence, query head) whose group has
// S > 1; grid.x = ceil(n_seq * Hq / kWarps).
static __global__ void __launch_bounds__(kThreads)
decode_combine_kernel(const dec_params p)
{
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int64_t item = (int64_t)blockIdx.x * kWarps + warp;
    if (item >= (int64_t)p.n_seq * p.n_q_heads)
        return;
    const int qh = (int)(item % p.n_q_heads);
    const int grp = p.head_group[qh / p.g];
    const int S = p.offsets[grp + 1] - p.offsets[grp];
    if (S == 1) // written directly by the split kernel
        return;
    const int D = p.head_dim;
    const float *w = p.ws + (size_t)item * p.max_splits * (size_t)(D + 2);
    float M = -INFINITY;
    for (int s = 0; s < S; s++)
        M = fmaxf(M, w[(size_t)s * (D + 2) + D]);
    for (int e = lane; e < D; e += 32) {
        float A = 0.0f, L = 0.0f;
        if (M != -INFINITY) {
            for (int s = 0; s < S; s++) {
                const float *ws = w + (size_t)s * (D + 2);
                const float c = expf(ws[D] - M); // neutral partials give 0
                A += c * ws[e];
                L += c * ws[D + 1];
            }
        }
        store_out(p, (size_t)item * D + e, L > 0.0f ? A / L : 0.0f);
    }
}

typedef void (*split_kernel_fn)(const dec_params);

// The instantiation for head_dim d and G query heads per KV head, or NULL.
static split_kernel_fn pick_split_kernel(int d, int g)
{
    if (g < 1 || g > kMaxG)
        return nullptr;
    int gm = g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : g <= 8 ? 8 : 16;
    if (d == 64) {
        switch (gm) {
        case 1: return decode_split_kernel<64, 1>;
        case 2: return decode_split_kernel<64, 2>;
        case 4: return decode_split_kernel<64, 4>;
        case 8: return decode_split_kernel<64, 8>;
        default: return decode_split_kernel<64, 16>;
        }
    }
    if (d == 128) {
        switch (gm) {
        case 1: return decode_split_kernel<128, 1>;
        case 2: return decode_split_kernel<128, 2>;
        case 4: return decode_split_kernel<128, 4>;
        case 8: return decode_split_kernel<128, 8>;
        default: return decode_split_kernel<128, 16>;
        }
    }
    return nullptr;
}

static int launch_split(split_kernel_fn fn, const dec_params &p,
                        cudaStream_t stream)
{
    const unsigned blocks = (unsigned)p.n_seq * (unsigned)p.total_splits;
    fn<<<blocks, kThreads, 0, stream>>>(p);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

static int launch_combine(const dec_params &p, cudaStream_t stream)
{
    const int64_t items = (int64_t)p.n_seq * p.n_q_heads;
    const unsigned blocks = (unsigned)((items + kWarps - 1) / kWarps);
    decode_combine_kernel<<<blocks, kThreads, 0, stream>>>(p);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" size_t tg_cuda_decode_attn_ws_bytes(int n_seq, int n_q_heads,
                                               int head_dim, int max_splits)
{
    if (max_splits <= 1 || n_seq <= 0 || n_q_heads <= 0 || head_dim <= 0)
        return 0;
    return (size_t)n_seq * (size_t)n_q_heads * (size_t)max_splits *
           (size_t)(head_dim + 2) * sizeof(float);
}

extern "C" int tg_cuda_decode_attn(const struct tg_cuda_decode_attn_args *a,
                                   char *err, size_t errlen)
{
    if (a == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "decode_attn: no arguments");
    if (a->n_seq < 0)
        return tg_err_set(err, errlen, TG_EINVAL, "decode_attn: n_seq %d < 0",
                          a->n_seq);
    if (a->out_dtype != TG_CUDA_DECODE_OUT_BF16 &&
        a->out_dtype != TG_CUDA_DECODE_OUT_F32)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: output dtype %d is not bf16 or f32",
                          (int)a->out_dtype);
    if (a->head_dim != 64 && a->head_dim != 128)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: head_dim %d (supported: 64, 128)",
                          a->head_dim);
    if (a->n_kv_heads < 1 || a->n_q_heads < 1 ||
        a->n_q_heads % a->n_kv_heads != 0 ||
        a->n_q_heads / a->n_kv_heads > kMaxG)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: Hq %d / Hkv %d must be a whole G in "
                          "1..%d", a->n_q_heads, a->n_kv_heads, kMaxG);
    if (a->heads_per_group < 1 || a->heads_per_group > kMaxHp ||
        a->n_groups < 1 ||
        (int64_t)a->n_groups * a->heads_per_group != a->n_kv_heads)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: %d groups x H_p %d != Hkv %d "
                          "(H_p in 1..%d)", a->n_groups, a->heads_per_group,
                          a->n_kv_heads, kMaxHp);
    if (a->page_size < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: page size %d < 1", a->page_size);
    if (!std::isfinite(a->scale))
        return tg_err_set(err, errlen, TG_EINVAL, "decode_attn: scale not finite");
    const struct tg_cuda_split_map *sm = a->splits;
    if (sm == nullptr || sm->offsets == nullptr || sm->total == nullptr ||
        sm->max == nullptr || sm->n_groups != a->n_groups || a->layer < 0 ||
        a->layer >= sm->n_layers)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: split map missing or not for %d "
                          "groups / layer %d", a->n_groups, a->layer);
    if (a->n_seq == 0)
        return 0;
    if (a->q == nullptr || a->pool == nullptr || a->head_group == nullptr ||
        a->head_slot == nullptr || a->table.indptr == nullptr ||
        a->table.indices == nullptr || a->table.lens == nullptr ||
        a->out == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: a device pointer is NULL");
    if (((uintptr_t)a->pool & 15u) != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: pool not 16-byte aligned");
    const struct tg_cuda_kv_csr *t = &a->table;
    int rc = kv_csr_check(t, a->n_seq, a->n_groups, a->n_kv_heads,
                          "decode_attn", err, errlen);
    if (rc != 0)
        return rc;
    const int total = sm->total[a->layer], max_s = sm->max[a->layer];
    if ((int64_t)a->n_seq * total > (int64_t)INT32_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_attn: %d sequences x %d splits: grid too big",
                          a->n_seq, total);
    if (max_s > 1) {
        size_t need = tg_cuda_decode_attn_ws_bytes(a->n_seq, a->n_q_heads,
                                                   a->head_dim, max_s);
        if (a->ws == nullptr || a->ws_bytes < need)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "decode_attn: workspace of %zu bytes, need %zu",
                              a->ws == nullptr ? (size_t)0 : a->ws_bytes, need);
    }

    dec_params p;
    memset(&p, 0, sizeof(p));
    p.q = reinterpret_cast<const __nv_bfloat16 *>(a->q);
    p.pool = reinterpret_cast<const __nv_bfloat16 *>(a->pool);
    p.head_group = a->head_group;
    p.head_slot = a->head_slot;
    p.table = *t;
    p.offsets = sm->offsets + (size_t)a->layer * (size_t)(a->n_groups + 1);
    p.ws = a->ws;
    p.out = a->out;
    p.n_seq = a->n_seq;
    p.n_q_heads = a->n_q_heads;
    p.n_kv_heads = a->n_kv_heads;
    p.n_groups = a->n_groups;
    p.hp = a->heads_per_group;
    p.page_size = a->page_size;
    p.head_dim = a->head_dim;
    p.g = a->n_q_heads / a->n_kv_heads;
    p.total_splits = total;
    p.max_splits = max_s;
    p.out_f32 = a->out_dtype == TG_CUDA_DECODE_OUT_F32;
    p.scale = a->scale;

    split_kernel_fn fn = pick_split_kernel(p.head_dim, p.g);
    if (fn == nullptr) // unreachable after the checks above
        return tg_err_set(err, errlen, TG_EINVAL, "decode_attn: no kernel");
    cudaStream_t st = (cudaStream_t)a->stream;
    rc = launch_split(fn, p, st);
    if (rc == 0 && max_s > 1)
        rc = launch_combine(p, st);
    return rc;
}

extern "C" int tg_cuda_decode_csr_layer(struct tg_cuda_kv_csr *csr,
                                        const struct tg_cuda_kv_table_dev *dt,
                                        int n_layers, int n_groups, int layer,
                                        char *err, size_t errlen)
{
    if (csr == nullptr || dt == nullptr || dt->indptr == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_csr_layer: no uploaded table");
    if (n_layers < 1 || n_groups < 1 || layer < 0 || layer >= n_layers)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_csr_layer: layer %d of %d, %d groups", layer,
                          n_layers, n_groups);
    const int64_t per_seq = (int64_t)n_layers * n_groups;
    if (per_seq > INT32_MAX || dt->n_rows % per_seq != 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_csr_layer: %d rows are not whole sequences "
                          "of %d layers x %d groups", dt->n_rows, n_layers,
                          n_groups);
    csr->indptr = dt->indptr;
    csr->indices = dt->indices;
    csr->lens = dt->lens;
    csr->n_rows = dt->n_rows;
    csr->row_stride = (int32_t)per_seq;
    csr->row_offset = layer * n_groups;
    csr->head_lens = nullptr; // per-head lengths are the caller's to add
    csr->head_stride = 0;
    csr->head_offset = 0;
    return 0;
}

extern "C" void tg_cuda_split_map_free(struct tg_cuda_split_map *map)
{
    if (map == nullptr)
        return;
    (void)cudaFree(map->offsets); // no-op on NULL; teardown has no one to tell
    free(map->total);
    free(map->max);
    memset(map, 0, sizeof(*map));
}

extern "C" int tg_cuda_split_map_init(struct tg_cuda_split_map *map,
                                      const int *splits, int n_layers,
                                      int n_groups, char *err, size_t errlen)
{
    if (map == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "split_map: no map");
    memset(map, 0, sizeof(*map));
    if (splits == nullptr || n_layers < 1 || n_groups < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "split_map: %d layers x %d groups", n_layers,
                          n_groups);
    for (int l = 0; l < n_layers; l++) {
        int64_t sum = 0;
        for (int g = 0; g < n_groups; g++) {
            int s = splits[(size_t)l * n_groups + g];
            if (s < 1)
                return tg_err_set(err, errlen, TG_EINVAL,
                                  "split_map: S[%d][%d] = %d < 1", l, g, s);
            sum += s;
        }
        if (sum > kMaxSplitsPerLayer)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "split_map: layer %d has %lld splits (max %d)", l,
                              (long long)sum, kMaxSplitsPerLayer);
    }
    const size_t n_off = (size_t)n_layers * (size_t)(n_groups + 1);
    int32_t *host = (int32_t *)malloc(n_off * sizeof(int32_t));
    map->total = (int32_t *)malloc((size_t)n_layers * sizeof(int32_t));
    map->max = (int32_t *)malloc((size_t)n_layers * sizeof(int32_t));
    if (host == nullptr || map->total == nullptr || map->max == nullptr) {
        free(host);
        tg_cuda_split_map_free(map);
        return tg_err_set(err, errlen, TG_ENOMEM, "split_map: out of memory");
    }
    for (int l = 0; l < n_layers; l++) {
        int32_t acc = 0, mx = 1;
        int32_t *o = host + (size_t)l * (n_groups + 1);
        for (int g = 0; g < n_groups; g++) {
            int s = splits[(size_t)l * n_groups + g];
            o[g] = acc;
            acc += s;
            mx = s > mx ? s : mx;
        }
        o[n_groups] = acc;
        map->total[l] = acc;
        map->max[l] = mx;
    }
    map->n_layers = n_layers;
    map->n_groups = n_groups;
    cudaError_t st = cudaMalloc(&map->offsets, n_off * sizeof(int32_t));
    if (st == cudaSuccess)
        st = cudaMemcpy(map->offsets, host, n_off * sizeof(int32_t),
                        cudaMemcpyHostToDevice);
    free(host);
    if (st != cudaSuccess) {
        tg_cuda_split_map_free(map);
        return tg_err_set(err, errlen, TG_EDEVICE, "split_map: upload: %s",
                          cudaGetErrorString(st));
    }
    return 0;
}

extern "C" int tg_cuda_decode_attn_n_cta(int n_q_per_kv, int head_dim,
                                         int *n_cta)
{
    if (n_cta == nullptr)
        return TG_EINVAL;
    *n_cta = 0;
    split_kernel_fn fn = pick_split_kernel(head_dim, n_q_per_kv);
    if (fn == nullptr)
        return TG_EINVAL;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        (void)cudaGetLastError(); // clear the sticky "no driver" error
        return TG_ENODEV;
    }
    int dev = 0, sms = 0, per_sm = 0;
    TG_CUDA_TRY(cudaGetDevice(&dev));
    TG_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                       dev));
    TG_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, reinterpret_cast<const void *>(fn), kThreads, 0));
    *n_cta = (per_sm > 0 ? per_sm : 1) * sms;
    return 0;
}

extern "C" int tg_cuda_decode_uniform_splits(int n_seq, int n_groups,
                                             int64_t max_row_tokens,
                                             int page_size, int n_cta,
                                             int *splits)
{
    if (n_seq < 1 || n_groups < 1 || max_row_tokens < 1 || page_size < 1 ||
        n_cta < 1 || splits == nullptr)
        return TG_EINVAL;
    const int64_t pages = (max_row_tokens + page_size - 1) / page_size;
    const int64_t blocks = (int64_t)n_seq * n_groups;
    int best_s = 1;
    // Already (nearly) a full wave without splitting: splitting only adds
    // combine work.
    if (blocks * 10 < (int64_t)n_cta * 8) {
        int64_t s_max = n_cta < pages ? n_cta : pages;
        if (s_max > 128)
            s_max = 128;
        double eff[129];
        double best = 0.0;
        for (int64_t s = 1; s <= s_max; s++) {
            // A split count that leaves the pages per split unchanged from
            // s - 1 buys nothing.
            bool ok = s == 1 || (pages + s - 1) / s != (pages + s - 2) / (s - 1);
            double waves = (double)(blocks * s) / (double)n_cta;
            eff[s] = ok ? waves / std::ceil(waves) : 0.0;
            best = eff[s] > best ? eff[s] : best;
        }
        for (int64_t s = 1; s <= s_max; s++) {
            if (eff[s] > 0.0 && eff[s] >= 0.85 * best) {
                best_s = (int)s;
                break;
            }
        }
    }
    for (int g = 0; g < n_groups; g++)
        splits[g] = best_s;
    return best_s;
}
