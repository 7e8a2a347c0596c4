// prefill_attn.cu — attention of one prefill chunk over the ragged history
// pages plus the chunk's causal keys, on bf16 tensor cores (see
// prefill_attn.h). Three layers: the static kernel, its static launcher on
// a stream, the checked extern "C" entry.
//
// Tiling follows FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning"): a CTA owns a
// tile of kBM query rows and streams kBN-key tiles of K/V through shared
// memory, keeping an online softmax per row (running max m, sum l, output
// rescaled by e^(m_old - m_new); Milakov & Gimelshein 2018) so the n x keys
// score matrix never exists in memory.
//
// Work decomposition. grid = (row tiles, Hkv): one CTA per (tile of kBM
// packed query rows, KV head h). GQA packing: the G query heads of KV head
// h are extra rows, packed token-major (row R = token i * G + head g), so
// a tile spans kBM / G tokens and every K/V tile loaded serves all G heads.
// Tiles are handed out last-first (the latest tokens see the most keys) so
// the longest CTAs start in the first wave.
//
// Per CTA (4 warps, warp w owns tile rows 16w .. 16w + 15):
//  1. Q tile -> shared memory (bf16) -> per-warp wmma A fragments, kept in
//     registers for the whole CTA.
//  2. Key tiles: first the head's history (group row g = head_group[h],
//     tokens gathered one by one from their pages, so P need not divide
//     kBN), then the chunk's keys 0 .. last token of the tile. Each tile:
//       S = Q K^T     wmma 16x16x16 bf16 -> fp32, stored to shared memory
//       softmax       2 lanes per row, fp32, base-2 exponent (the scale is
//                     folded with log2 e), masked keys -> -inf; P rounded
//                     to bf16 into the warp's P rows; l sums the rounded P
//       O = O*alpha + P V   wmma into fp32 accumulator fragments held in
//                     registers; alpha is looked up per fragment element
//                     through its row index (below).
//  3. O fragments -> shared memory -> O / l -> bf16 output rows.
//
// Row of an accumulator element. The wmma fragment layout is unspecified,
// but fixed per fragment type; loading a 16x16 matrix whose (r, c) element
// is r into an accumulator fragment tells each lane the row of each of its
// elements, which is all the per-row rescaling needs.
//
// Shared memory (bytes): D = 128: 17408 (Q, then S) + 2 x 17408 (K, V; O
// staging at the end) + 9216 (P) + 1536 (row index, alpha, l) = 62976,
// above the 48 KiB default, so the D = 128 kernel gets the opt-in
// attribute once per device; D = 64: 46592. Registers (ptxas, no spills):
// 190 per thread on sm_80 (2 CTAs = 8 warps per SM), 168 (D = 128) and
// 128 (D = 64) on sm_90.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/prefill_attn.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

static constexpr int kWarps = 4;
static constexpr int kThreads = 32 * kWarps;
static constexpr int kBM = 16 * kWarps; // packed query rows per CTA
static constexpr int kBN = 64;          // keys per tile
static constexpr int kPadH = 8;         // bf16 row padding (16 bytes)
static constexpr int kPadF = 4;         // fp32 row padding (16 bytes)
static constexpr int kMaxG = 16;
static constexpr int kMaxHp = 16;
static constexpr int kMaxN = 65535;
static constexpr int kMaxDevices = 64;
static constexpr float kLog2e = 1.4426950408889634f;

// Shared-memory carve-up for head dim D; every offset is a multiple of 128
// bytes (wmma needs 32-byte aligned tile pointers).
template <int D> struct pfa_smem {
    static constexpr int ldq = D + kPadH;   // Q/K/V row stride, bf16 elements
    static constexpr int lds = kBN + kPadF; // S row stride, floats
    static constexpr int ldp = kBN + kPadH; // P row stride, bf16 elements
    static constexpr int ldo = D + kPadF;   // O staging row stride, floats
    static constexpr int q_bytes = kBM * ldq * 2;
    static constexpr int s_bytes = kBM * lds * 4;
    static constexpr int qs_bytes = q_bytes > s_bytes ? q_bytes : s_bytes;
    static constexpr int kv_bytes = kBN * ldq * 2;
    static constexpr int qs_off = 0;
    static constexpr int k_off = (qs_off + qs_bytes + 127) / 128 * 128;
    static constexpr int v_off = (k_off + kv_bytes + 127) / 128 * 128;
    static constexpr int o_off = k_off; // after the key loop, K/V are dead
    static constexpr int p_off = (v_off + kv_bytes + 127) / 128 * 128;
    static constexpr int p_bytes = kBM * ldp * 2;
    static constexpr int idx_off = (p_off + p_bytes + 127) / 128 * 128;
    static constexpr int alpha_off = idx_off + 16 * 16 * 4;
    static constexpr int l_off = alpha_off + kBM * 4;
    static constexpr int total = l_off + kBM * 4;
    static_assert(kBM * ldo * 4 <= p_off - o_off, "O staging overflows K/V");
    static_assert(ldq % 8 == 0 && ldp % 8 == 0 && lds % 4 == 0 &&
                      ldo % 4 == 0, "wmma ldm multiples");
    static_assert((16 * ldq * 2) % 32 == 0 && (16 * lds * 4) % 32 == 0 &&
                      (16 * ldp * 2) % 32 == 0 &&
                      (16 * ldo * 4) % 32 == 0, "32-byte aligned warp tiles");
};

// Everything the kernel reads; passed by value (kernel parameter space).
struct pfa_params {
    const __nv_bfloat16 *q;    // (n, Hq, D)
    const __nv_bfloat16 *k;    // (n, Hkv, D)
    const __nv_bfloat16 *v;    // (n, Hkv, D)
    const __nv_bfloat16 *pool; // (n_pages, H_p, 2, P, D)
    const int32_t *head_group; // (Hkv)
    const int32_t *head_slot;  // (Hkv)
    const int32_t *indptr;     // (n_groups)
    const int32_t *indices;    // page ids
    const int32_t *lens;       // (n_groups)
    const int32_t *head_lens;  // (Hkv) or nullptr: the row's lens
    __nv_bfloat16 *out;        // (n, Hq, D)
    int n, hq, hkv, g, hp, page_size, n_tiles;
    float scale_log2; // scale * log2(e): exp(x*scale) = exp2(x*scale_log2)
};

namespace wm = nvcuda::wmma;
typedef wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major>
    frag_a;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major>
    frag_bt; // K^T: K rows read as the columns of B
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major>
    frag_b;
typedef wm::fragment<wm::accumulator, 16, 16, 16, float> frag_c;

// One key tile for one warp's 16 rows. Ks/Vs hold kBN keys (invalid ones
// zero-filled); lane (sr = lane / 2, half = lane % 2) owns row sr and
// columns half, half + 2, ...; a column c is visible iff c <= lim (lim is
// per row: the causal limit, or the tile's valid-key count - 1).
template <int D>
static __device__ __forceinline__ void
tile_step(const frag_a (&qf)[D / 16], frag_c (&of)[D / 16],
          const int (&row_of)[frag_c::num_elements],
          const __nv_bfloat16 *Ks, const __nv_bfloat16 *Vs, float *Sw,
          __nv_bfloat16 *Pw, float *alpha_w, int lim, float scale_log2,
          float &m_run, float &l_run)
{
    typedef pfa_smem<D> L;
    const int lane = (int)threadIdx.x % 32, sr = lane >> 1, half = lane & 1;

    // S = Q K^T for this warp's 16 rows x kBN keys.
#pragma unroll
    for (int nb = 0; nb < kBN / 16; nb++) {
        frag_c sf;
        wm::fill_fragment(sf, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            frag_bt kf;
            wm::load_matrix_sync(kf, Ks + nb * 16 * L::ldq + kk * 16, L::ldq);
            wm::mma_sync(sf, qf[kk], kf, sf);
        }
        wm::store_matrix_sync(Sw + nb * 16, sf, L::lds, wm::mem_row_major);
    }
    __syncwarp();

    // Online softmax of row sr over this tile (the lane pair shares it):
    // pass 1 finds the tile max, pass 2 writes p = 2^(x - m) as bf16 to the
    // warp's P rows (two passes over shared memory instead of keeping the
    // row in registers, which the O and Q fragments already crowd).
    constexpr int kCols = kBN / 2;
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < kCols; c++) {
        const int col = 2 * c + half;
        if (col <= lim)
            mx = fmaxf(mx, Sw[sr * L::lds + col] * scale_log2);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m_run, mx);
    // A row with nothing visible yet keeps m = -inf; subtracting 0 then
    // gives p = 0 and alpha = 0 instead of the NaN of (-inf) - (-inf).
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = exp2f(m_run - m_use);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kCols; c++) {
        const int col = 2 * c + half;
        const float x = Sw[sr * L::lds + col] * scale_log2;
        const __nv_bfloat16 pb =
            __float2bfloat16(col <= lim ? exp2f(x - m_use) : 0.0f);
        Pw[sr * L::ldp + col] = pb;
        sum += __bfloat162float(pb); // normalise by what PV really sums
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l_run = l_run * alpha + sum;
    m_run = m_new;
    if (half == 0)
        alpha_w[sr] = alpha;
    __syncwarp();

    // O = O * alpha(row) + P V. Every accumulator fragment has the same
    // element -> row mapping, so the lane's factors are read once.
    float al[frag_c::num_elements];
#pragma unroll
    for (int e = 0; e < frag_c::num_elements; e++)
        al[e] = alpha_w[row_of[e]];
#pragma unroll
    for (int f = 0; f < D / 16; f++)
#pragma unroll
        for (int e = 0; e < frag_c::num_elements; e++)
            of[f].x[e] *= al[e];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; kk++) {
        frag_a pf;
        wm::load_matrix_sync(pf, Pw + kk * 16, L::ldp);
#pragma unroll
        for (int c = 0; c < D / 16; c++) {
            frag_b vf;
            wm::load_matrix_sync(vf, Vs + kk * 16 * L::ldq + c * 16, L::ldq);
            wm::mma_sync(of[c], pf, vf, of[c]);
        }
    }
}

// grid (n_tiles, Hkv), block kThreads, dynamic shared memory
// pfa_smem<D>::total.
template <int D>
static __global__ void __launch_bounds__(kThreads)
    prefill_attn_kernel(const pfa_params p)
{
    typedef pfa_smem<D> L;
    constexpr int kChunks = D / 8; // 16-byte pieces per row
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(smem + L::qs_off);
    float *Ss = reinterpret_cast<float *>(smem + L::qs_off); // aliases Qs
    __nv_bfloat16 *Ks = reinterpret_cast<__nv_bfloat16 *>(smem + L::k_off);
    __nv_bfloat16 *Vs = reinterpret_cast<__nv_bfloat16 *>(smem + L::v_off);
    __nv_bfloat16 *Ps = reinterpret_cast<__nv_bfloat16 *>(smem + L::p_off);
    float *Os = reinterpret_cast<float *>(smem + L::o_off); // aliases K, V
    float *idx_s = reinterpret_cast<float *>(smem + L::idx_off);
    float *alpha_s = reinterpret_cast<float *>(smem + L::alpha_off);
    float *l_s = reinterpret_cast<float *>(smem + L::l_off);

    const int tid = (int)threadIdx.x, w = tid / 32, lane = tid % 32;
    const int h = (int)blockIdx.y, G = p.g;
    const int tile = p.n_tiles - 1 - (int)blockIdx.x; // heaviest first
    const int rows = p.n * G, row0 = tile * kBM;
    const int row_end = min(row0 + kBM, rows);
    const int key_end = (row_end - 1) / G + 1; // chunk keys 0 .. last token

    // Q tile (rows past the chunk are zero and never written out).
    for (int c = tid; c < kBM * kChunks; c += kThreads) {
        const int r = c / kChunks, col = (c % kChunks) * 8, R = row0 + r;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (R < rows) {
            const int i = R / G, gg = R % G;
            x = *reinterpret_cast<const uint4 *>(
                p.q + ((size_t)i * p.hq + (size_t)h * G + gg) * D + col);
        }
        *reinterpret_cast<uint4 *>(Qs + r * L::ldq + col) = x;
    }
    for (int e = tid; e < 16 * 16; e += kThreads)
        idx_s[e] = (float)(e / 16);
    __syncthreads();

    frag_a qf[D / 16];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wm::load_matrix_sync(qf[kk], Qs + w * 16 * L::ldq + kk * 16, L::ldq);
    int row_of[frag_c::num_elements];
    {
        frag_c fi;
        wm::load_matrix_sync(fi, idx_s, 16, wm::mem_row_major);
#pragma unroll
        for (int e = 0; e < frag_c::num_elements; e++)
            row_of[e] = (int)fi.x[e];
    }
    frag_c of[D / 16];
#pragma unroll
    for (int f = 0; f < D / 16; f++)
        wm::fill_fragment(of[f], 0.0f);
    float m_run = -INFINITY, l_run = 0.0f;
    float *Sw = Ss + w * 16 * L::lds;
    __nv_bfloat16 *Pw = Ps + w * 16 * L::ldp;
    float *alpha_w = alpha_s + w * 16;
    // The softmax row of this lane and its token (for the causal limit).
    const int my_tok = (row0 + w * 16 + (lane >> 1)) / G;

    // 1. History of head h: its group's row, token by token from pages.
    const int grp = p.head_group[h], slot = p.head_slot[h];
    const int hlen = p.head_lens != nullptr ? p.head_lens[h] : p.lens[grp];
    const int32_t *pages = p.indices + p.indptr[grp];
    const int P = p.page_size;
    const size_t page_elems = (size_t)p.hp * 2 * (size_t)P * D;
    const size_t slot_elems = (size_t)slot * 2 * (size_t)P * D;
    // The step is min(kBN, hlen - t0), never past hlen: t0 + kBN would
    // overflow int for rows within kBN of INT32_MAX (the header allows them).
    for (int t0 = 0; t0 < hlen; t0 += min(kBN, hlen - t0)) {
        __syncthreads(); // every warp is done with the previous K/V and Q
        for (int c = tid; c < kBN * kChunks; c += kThreads) {
            const int r = c / kChunks, col = (c % kChunks) * 8, t = t0 + r;
            uint4 kx = make_uint4(0u, 0u, 0u, 0u), vx = kx;
            if (t < hlen) {
                const __nv_bfloat16 *kr =
                    p.pool + (size_t)pages[t / P] * page_elems + slot_elems +
                    (size_t)(t % P) * D + col;
                kx = *reinterpret_cast<const uint4 *>(kr);
                vx = *reinterpret_cast<const uint4 *>(kr + (size_t)P * D);
            }
            *reinterpret_cast<uint4 *>(Ks + r * L::ldq + col) = kx;
            *reinterpret_cast<uint4 *>(Vs + r * L::ldq + col) = vx;
        }
        __syncthreads();
        const int lim = min(hlen - t0, kBN) - 1;
        tile_step<D>(qf, of, row_of, Ks, Vs, Sw, Pw, alpha_w, lim, p.scale_log2,
                     m_run, l_run);
    }

    // 2. The chunk's own keys 0 .. key_end - 1, causal (j <= token).
    for (int j0 = 0; j0 < key_end; j0 += kBN) {
        __syncthreads();
        for (int c = tid; c < kBN * kChunks; c += kThreads) {
            const int r = c / kChunks, col = (c % kChunks) * 8, j = j0 + r;
            uint4 kx = make_uint4(0u, 0u, 0u, 0u), vx = kx;
            if (j < key_end) {
                const size_t off = ((size_t)j * p.hkv + h) * D + col;
                kx = *reinterpret_cast<const uint4 *>(p.k + off);
                vx = *reinterpret_cast<const uint4 *>(p.v + off);
            }
            *reinterpret_cast<uint4 *>(Ks + r * L::ldq + col) = kx;
            *reinterpret_cast<uint4 *>(Vs + r * L::ldq + col) = vx;
        }
        __syncthreads();
        const int lim = min(my_tok, key_end - 1) - j0;
        tile_step<D>(qf, of, row_of, Ks, Vs, Sw, Pw, alpha_w, lim, p.scale_log2,
                     m_run, l_run);
    }

    // 3. O / l -> bf16. Every row saw at least its own key, so l > 0.
    __syncthreads(); // K/V are dead in every warp before O overwrites them
    float *Ow = Os + w * 16 * L::ldo;
#pragma unroll
    for (int f = 0; f < D / 16; f++)
        wm::store_matrix_sync(Ow + f * 16, of[f], L::ldo, wm::mem_row_major);
    if ((lane & 1) == 0)
        l_s[w * 16 + (lane >> 1)] = l_run;
    __syncwarp();
    for (int e = lane; e < 16 * kChunks; e += 32) {
        const int r = e / kChunks, col = (e % kChunks) * 8;
        const int R = row0 + w * 16 + r;
        if (R >= rows)
            continue;
        const float l = l_s[w * 16 + r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const float *o = Ow + r * L::ldo + col;
        __align__(16) __nv_bfloat162 h2[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            h2[u] = __floats2bfloat162_rn(o[2 * u] * inv, o[2 * u + 1] * inv);
        const int i = R / G, gg = R % G;
        *reinterpret_cast<uint4 *>(p.out + ((size_t)i * p.hq +
                                            (size_t)h * G + gg) * D + col) =
            *reinterpret_cast<const uint4 *>(h2);
    }
}

// The D = 128 kernel needs more than the 48 KiB default of dynamic shared
// memory; the attribute is set once per (device, kernel) rather than per
// call (it is host-side state, not stream work, so a captured step never
// depends on it after warm-up).
template <int D> static int ensure_smem(void)
{
    if (pfa_smem<D>::total <= 48 * 1024)
        return 0;
    static std::atomic<unsigned long long> done{0};
    int dev = 0;
    TG_CUDA_TRY(cudaGetDevice(&dev));
    const unsigned long long bit =
        dev >= 0 && dev < kMaxDevices ? 1ull << dev : 0ull;
    if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0)
        return 0;
    TG_CUDA_TRY(cudaFuncSetAttribute(prefill_attn_kernel<D>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     pfa_smem<D>::total));
    done.fetch_or(bit, std::memory_order_acq_rel);
    return 0;
}

template <int D>
static int launch_prefill(const pfa_params &p, cudaStream_t stream)
{
    int rc = ensure_smem<D>();
    if (rc != 0)
        return rc;
    const dim3 grid((unsigned)p.n_tiles, (unsigned)p.hkv);
    prefill_attn_kernel<D><<<grid, kThreads, pfa_smem<D>::total, stream>>>(p);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

static bool misaligned(const void *ptr)
{
    return ((uintptr_t)ptr & 15u) != 0;
}

extern "C" int tg_cuda_prefill_attn(const struct tg_cuda_prefill_attn_args *a,
                                    char *err, size_t errlen)
{
    if (a == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "prefill_attn: no arguments");
    if (a->n < 0 || a->n > kMaxN)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_attn: n %d outside 0..%d", a->n, kMaxN);
    if (a->head_dim != 64 && a->head_dim != 128)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_attn: head_dim %d (supported: 64, 128)",
                          a->head_dim);
    if (a->n_kv_heads < 1 || a->n_kv_heads > 65535 || a->n_q_heads < 1 ||
        a->n_q_heads % a->n_kv_heads != 0 ||
        a->n_q_heads / a->n_kv_heads > kMaxG)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_attn: Hq %d / Hkv %d must be a whole G in "
                          "1..%d", a->n_q_heads, a->n_kv_heads, kMaxG);
    if (a->heads_per_group < 1 || a->heads_per_group > kMaxHp ||
        a->n_groups < 1 ||
        (int64_t)a->n_groups * a->heads_per_group != a->n_kv_heads)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_attn: %d groups x H_p %d != Hkv %d (H_p in "
                          "1..%d)", a->n_groups, a->heads_per_group,
                          a->n_kv_heads, kMaxHp);
    if (a->page_size < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_attn: page size %d < 1", a->page_size);
    if (!std::isfinite(a->scale))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_attn: scale not finite");
    if (a->n == 0)
        return 0;
    if (a->q == nullptr || a->k == nullptr || a->v == nullptr ||
        a->pool == nullptr || a->head_group == nullptr ||
        a->head_slot == nullptr || a->indptr == nullptr ||
        a->indices == nullptr || a->lens == nullptr || a->out == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_attn: a device pointer is NULL");
    if (misaligned(a->q) || misaligned(a->k) || misaligned(a->v) ||
        misaligned(a->pool) || misaligned(a->out))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "prefill_attn: q, k, v, pool and out must be "
                          "16-byte aligned");

    pfa_params p;
    memset(&p, 0, sizeof(p));
    p.q = reinterpret_cast<const __nv_bfloat16 *>(a->q);
    p.k = reinterpret_cast<const __nv_bfloat16 *>(a->k);
    p.v = reinterpret_cast<const __nv_bfloat16 *>(a->v);
    p.pool = reinterpret_cast<const __nv_bfloat16 *>(a->pool);
    p.head_group = a->head_group;
    p.head_slot = a->head_slot;
    p.indptr = a->indptr;
    p.indices = a->indices;
    p.lens = a->lens;
    p.head_lens = a->head_lens;
    p.out = reinterpret_cast<__nv_bfloat16 *>(a->out);
    p.n = a->n;
    p.hq = a->n_q_heads;
    p.hkv = a->n_kv_heads;
    p.g = a->n_q_heads / a->n_kv_heads;
    p.hp = a->heads_per_group;
    p.page_size = a->page_size;
    p.n_tiles = (p.n * p.g + kBM - 1) / kBM; // <= 65535 * 16 / 64
    p.scale_log2 = a->scale * kLog2e;

    cudaStream_t st = (cudaStream_t)a->stream;
    return a->head_dim == 64 ? launch_prefill<64>(p, st)
                             : launch_prefill<128>(p, st);
}
