// elementwise.cu — embedding, RMSNorm (+ fused residual add), NeoX RoPE
// (+ fused Qwen3 per-head RMSNorm), SiLU-mul and bf16 <-> fp32 conversion
// (see elementwise.h). Each op has three layers: a static __global__
// kernel templated on the element types, a static launcher on a stream,
// and the checked extern "C" entry that maps the dtype enums to template
// arguments.
//
// The kernels are deliberately plain: one thread per element (grid-stride
// loops), one block per row for row reductions, one warp per head row for
// RoPE. Every thread writes only the elements it read, so the in-place
// forms documented in the header are race-free by construction.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/elementwise.h"

namespace {

// fp32 view of a stored element, and the store that rounds once (to
// nearest even for bf16: __float2bfloat16_rn, the IEEE default that
// st_f32_to_bf16 also implements).
__device__ __forceinline__ float load_f32(const float *p, int64_t i)
{
    return p[i];
}
__device__ __forceinline__ float load_f32(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store_f32(float *p, int64_t i, float v)
{
    p[i] = v;
}
__device__ __forceinline__ void store_f32(__nv_bfloat16 *p, int64_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}

// Rounds v to what storing it as T keeps (identity for float).
__device__ __forceinline__ float round_as(float v, const float *)
{
    return v;
}
__device__ __forceinline__ float round_as(float v, const __nv_bfloat16 *)
{
    return __bfloat162float(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum of v over the block. blockDim.x must be a multiple of 32 (<= 1024);
// every thread of the block must call it, and gets the total.
__device__ float block_sum(float v)
{
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0)
        partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < n_warps ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0)
            total = s;
    }
    __syncthreads();
    return total;
}

// Maps a dtype enum to a null pointer of the element type, so a generic
// lambda can recover the type with tensor_type<decltype(tag)>.
template <typename F> int with_dtype(enum tg_cuda_elementwise_dtype dt, F &&f)
{
    if (dt == TG_CUDA_ELEMENTWISE_F32)
        return f(static_cast<float *>(nullptr));
    return f(static_cast<__nv_bfloat16 *>(nullptr));
}
template <typename Tag> using tensor_type = std::remove_pointer_t<Tag>;

bool dtype_ok(enum tg_cuda_elementwise_dtype dt)
{
    return dt == TG_CUDA_ELEMENTWISE_F32 || dt == TG_CUDA_ELEMENTWISE_BF16;
}

size_t dtype_size(enum tg_cuda_elementwise_dtype dt)
{
    return dt == TG_CUDA_ELEMENTWISE_F32 ? sizeof(float)
                                         : sizeof(__nv_bfloat16);
}

bool aligned(const void *p, size_t a)
{
    return (reinterpret_cast<uintptr_t>(p) % a) == 0;
}

const int kThreads = 256;
// Grid-stride kernels need no more blocks than this to fill any current
// GPU many times over; larger tensors loop.
const int64_t kMaxBlocks = 1 << 16;

int flat_blocks(int64_t total)
{
    int64_t b = (total + kThreads - 1) / kThreads;
    return (int)(b < kMaxBlocks ? b : kMaxBlocks);
}

// Threads for one block per row of `len` elements: a multiple of 32, at
// least one warp, at most 1024.
int row_threads(int64_t len)
{
    int64_t t = (len + 31) / 32 * 32;
    if (t > 1024)
        t = 1024;
    return (int)(t < 32 ? 32 : t);
}

} // namespace

// ---------------------------------------------------------------- embedding

// One block per token: a coalesced copy of one table row.
template <typename TO>
static __global__ void embedding_kernel(const __nv_bfloat16 *__restrict__ table,
                                        int vocab, int hidden,
                                        const int32_t *__restrict__ ids,
                                        TO *__restrict__ out)
{
    const int64_t i = blockIdx.x;
    const int32_t id = ids[i];
    const bool valid = id >= 0 && id < vocab;
    const __nv_bfloat16 *src = table + (int64_t)(valid ? id : 0) * hidden;
    TO *dst = out + i * hidden;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x)
        store_f32(dst, j, valid ? load_f32(src, j) : 0.0f);
}

template <typename TO>
static int launch_embedding(const __nv_bfloat16 *table, int vocab, int hidden,
                            const int32_t *ids, int n, TO *out,
                            cudaStream_t stream)
{
    embedding_kernel<TO><<<n, row_threads(hidden), 0, stream>>>(
        table, vocab, hidden, ids, out);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_elementwise_embedding(
    const uint16_t *table, int vocab, int hidden, const int32_t *ids, int n,
    void *out, enum tg_cuda_elementwise_dtype out_dtype, void *stream)
{
    if (vocab <= 0 || hidden <= 0 || n < 0 || !dtype_ok(out_dtype))
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (table == nullptr || ids == nullptr || out == nullptr ||
        !aligned(table, 2) || !aligned(ids, 4) ||
        !aligned(out, dtype_size(out_dtype)))
        return TG_EINVAL;
    const auto *tab = reinterpret_cast<const __nv_bfloat16 *>(table);
    return with_dtype(out_dtype, [&](auto tag) {
        using TO = tensor_type<decltype(tag)>;
        return launch_embedding(tab, vocab, hidden, ids, n,
                                static_cast<TO *>(out),
                                (cudaStream_t)stream);
    });
}

// ------------------------------------------------------------------ rmsnorm

// One block per row. Pass 1 (with a residual) adds, rounds to TX, stores
// back into x and accumulates the square of the stored value; pass 2
// rereads x (the same thread wrote the elements it rereads) and scales.
// Formula: HF LlamaRMSNorm, x * rsqrt(mean(x^2) + eps) * w, in fp32.
template <typename TX, typename TR, typename TO>
static __global__ void rmsnorm_kernel(TX *x, const TR *residual,
                                      const __nv_bfloat16 *__restrict__ w,
                                      int dim, float eps, TO *out)
{
    const int64_t base = (int64_t)blockIdx.x * dim;
    TX *xr = x + base;
    float ss = 0.0f;
    if (residual != nullptr) {
        const TR *rr = residual + base;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            float v = round_as(load_f32(xr, j) + load_f32(rr, j), xr);
            store_f32(xr, j, v);
            ss += v * v;
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            float v = load_f32(xr, j);
            ss += v * v;
        }
    }
    ss = block_sum(ss);
    // 1/sqrtf (IEEE-rounded without fast-math) rather than rsqrtf, to stay
    // within an ulp of the CPU reference.
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    TO *o = out + base;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        store_f32(o, j, load_f32(xr, j) * r * __bfloat162float(w[j]));
}

template <typename TX, typename TR, typename TO>
static int launch_rmsnorm(TX *x, const TR *residual, const __nv_bfloat16 *w,
                          int n, int dim, float eps, TO *out,
                          cudaStream_t stream)
{
    rmsnorm_kernel<TX, TR, TO><<<n, row_threads(dim), 0, stream>>>(
        x, residual, w, dim, eps, out);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_elementwise_rmsnorm(
    void *x, enum tg_cuda_elementwise_dtype x_dtype, const void *residual,
    enum tg_cuda_elementwise_dtype res_dtype, const uint16_t *w, int n, int dim,
    float eps, void *out, enum tg_cuda_elementwise_dtype out_dtype,
    void *stream)
{
    if (n < 0 || dim <= 0 || !(eps >= 0.0f) || !dtype_ok(x_dtype) ||
        !dtype_ok(out_dtype) || (residual != nullptr && !dtype_ok(res_dtype)))
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (x == nullptr || w == nullptr || out == nullptr ||
        !aligned(x, dtype_size(x_dtype)) || !aligned(w, 2) ||
        !aligned(out, dtype_size(out_dtype)) ||
        (residual != nullptr && !aligned(residual, dtype_size(res_dtype))))
        return TG_EINVAL;
    // The fused add writes x, which the caller keeps as the residual
    // stream; writing the norm over it (or over the addend) would lose it.
    if (residual != nullptr && (out == x || out == residual))
        return TG_EINVAL;
    if (out == x && out_dtype != x_dtype)
        return TG_EINVAL;
    // Without a residual the kernel never reads it: reuse x's type so no
    // extra instantiation is needed.
    const enum tg_cuda_elementwise_dtype rt =
        residual != nullptr ? res_dtype : x_dtype;
    const auto *wb = reinterpret_cast<const __nv_bfloat16 *>(w);
    cudaStream_t st = (cudaStream_t)stream;
    return with_dtype(x_dtype, [&](auto xtag) {
        using TX = tensor_type<decltype(xtag)>;
        return with_dtype(rt, [&](auto rtag) {
            using TR = tensor_type<decltype(rtag)>;
            return with_dtype(out_dtype, [&](auto otag) {
                using TO = tensor_type<decltype(otag)>;
                return launch_rmsnorm(static_cast<TX *>(x),
                                      static_cast<const TR *>(residual), wb,
                                      n, dim, eps, static_cast<TO *>(out), st);
            });
        });
    });
}

// --------------------------------------------------------------------- rope

const int kRopeWarps = 8; // head rows per block

// One warp per (token, head) row; lane l owns the pairs (j, j + d/2) with
// j = l, l + 32, ... Rows are warp-uniform, so a whole warp either returns
// or takes part in the shuffle reduction of the optional norm.
// RoPE: NeoX half rotation (GPT-NeoX / HF rotate_half); the per-head norm
// is HF Qwen3RMSNorm (same formula as LlamaRMSNorm) applied before RoPE.
template <typename T>
static __global__ void rope_kernel(T *x, int n, int heads, int d,
                                   int64_t row_stride,
                                   const int32_t *__restrict__ pos,
                                   const float *__restrict__ inv_freq,
                                   const __nv_bfloat16 *__restrict__ norm_w,
                                   float eps)
{
    const int64_t row = (int64_t)blockIdx.x * kRopeWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)n * heads)
        return;
    const int64_t i = row / heads;
    const int h = (int)(row % heads);
    T *r = x + i * row_stride + (int64_t)h * d;
    const int half = d / 2;
    float scale = 1.0f;
    if (norm_w != nullptr) {
        float ss = 0.0f;
        for (int j = lane; j < d; j += 32) {
            float v = load_f32(r, j);
            ss += v * v;
        }
        ss = warp_sum(ss);
        scale = 1.0f / sqrtf(ss / (float)d + eps);
    }
    const float p = (float)pos[i];
    for (int j = lane; j < half; j += 32) {
        float x1 = load_f32(r, j), x2 = load_f32(r, j + half);
        if (norm_w != nullptr) {
            x1 = x1 * scale * __bfloat162float(norm_w[j]);
            x2 = x2 * scale * __bfloat162float(norm_w[j + half]);
        }
        // Full-precision sincosf (no fast-math): angles reach 1e5 rad at
        // long context, where the intrinsic __sincosf loses all accuracy.
        float s, c;
        sincosf(p * inv_freq[j], &s, &c);
        store_f32(r, j, x1 * c - x2 * s);
        store_f32(r, j + half, x2 * c + x1 * s);
    }
}

template <typename T>
static int launch_rope(T *x, int n, int heads, int d, int64_t row_stride,
                       const int32_t *pos, const float *inv_freq,
                       const __nv_bfloat16 *norm_w, float eps,
                       cudaStream_t stream)
{
    const int64_t rows = (int64_t)n * heads;
    const int64_t blocks = (rows + kRopeWarps - 1) / kRopeWarps;
    rope_kernel<T><<<(unsigned)blocks, kRopeWarps * 32, 0, stream>>>(
        x, n, heads, d, row_stride, pos, inv_freq, norm_w, eps);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int
tg_cuda_elementwise_rope(void *x, enum tg_cuda_elementwise_dtype x_dtype, int n,
                         int heads, int d, int64_t row_stride,
                         const int32_t *pos, const float *inv_freq,
                         const uint16_t *norm_w, float eps, void *stream)
{
    if (n < 0 || heads <= 0 || d <= 0 || d % 2 != 0 || !dtype_ok(x_dtype) ||
        row_stride < (int64_t)heads * d || !(eps >= 0.0f))
        return TG_EINVAL;
    // One block per kRopeWarps rows: the grid's x dimension bounds rows.
    if ((int64_t)n * heads > (int64_t)kRopeWarps * 0x7fffffff)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (x == nullptr || pos == nullptr || inv_freq == nullptr ||
        !aligned(x, dtype_size(x_dtype)) || !aligned(pos, 4) ||
        !aligned(inv_freq, 4) || (norm_w != nullptr && !aligned(norm_w, 2)))
        return TG_EINVAL;
    const auto *nw = reinterpret_cast<const __nv_bfloat16 *>(norm_w);
    return with_dtype(x_dtype, [&](auto tag) {
        using T = tensor_type<decltype(tag)>;
        return launch_rope(static_cast<T *>(x), n, heads, d, row_stride, pos,
                           inv_freq, nw, eps, (cudaStream_t)stream);
    });
}

// ----------------------------------------------------------------- silu_mul

// Grid-stride over the n * width logical elements; (row, col) from the
// flat index so strided gate/up/out views cost one division per element
// (the op is memory-bound).
template <typename TI, typename TO>
static __global__ void silu_mul_kernel(const TI *gate, const TI *up,
                                       int64_t total, int width,
                                       int64_t ld_in, TO *out, int64_t ld_out)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = e / width, col = e % width;
        const float g = load_f32(gate, row * ld_in + col);
        const float u = load_f32(up, row * ld_in + col);
        // silu(g) = g * sigmoid(g) = g / (1 + e^-g); for g -> -inf the
        // quotient is -0, not NaN.
        store_f32(out, row * ld_out + col, g / (1.0f + expf(-g)) * u);
    }
}

template <typename TI, typename TO>
static int launch_silu_mul(const TI *gate, const TI *up, int n, int width,
                           int64_t ld_in, TO *out, int64_t ld_out,
                           cudaStream_t stream)
{
    const int64_t total = (int64_t)n * width;
    silu_mul_kernel<TI, TO><<<flat_blocks(total), kThreads, 0, stream>>>(
        gate, up, total, width, ld_in, out, ld_out);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_elementwise_silu_mul(
    const void *gate, const void *up, enum tg_cuda_elementwise_dtype in_dtype,
    int n, int width, int64_t ld_in, void *out,
    enum tg_cuda_elementwise_dtype out_dtype, int64_t ld_out, void *stream)
{
    if (n < 0 || width < 0 || ld_in < width || ld_out < width ||
        !dtype_ok(in_dtype) || !dtype_ok(out_dtype))
        return TG_EINVAL;
    if (n == 0 || width == 0)
        return 0;
    if (gate == nullptr || up == nullptr || out == nullptr ||
        !aligned(gate, dtype_size(in_dtype)) ||
        !aligned(up, dtype_size(in_dtype)) ||
        !aligned(out, dtype_size(out_dtype)))
        return TG_EINVAL;
    // In place is safe only when every output element lands exactly on
    // the input element its thread just read.
    if ((out == gate || out == up) &&
        (out_dtype != in_dtype || ld_out != ld_in))
        return TG_EINVAL;
    cudaStream_t st = (cudaStream_t)stream;
    return with_dtype(in_dtype, [&](auto itag) {
        using TI = tensor_type<decltype(itag)>;
        return with_dtype(out_dtype, [&](auto otag) {
            using TO = tensor_type<decltype(otag)>;
            return launch_silu_mul(static_cast<const TI *>(gate),
                                   static_cast<const TI *>(up), n, width,
                                   ld_in, static_cast<TO *>(out), ld_out, st);
        });
    });
}

// -------------------------------------------------------------- conversion

template <typename TI, typename TO>
static __global__ void convert_kernel(const TI *__restrict__ in,
                                      TO *__restrict__ out, int64_t len)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
         i += (int64_t)gridDim.x * blockDim.x)
        store_f32(out, i, load_f32(in, i));
}

template <typename TI, typename TO>
static int launch_convert(const TI *in, TO *out, int64_t len,
                          cudaStream_t stream)
{
    convert_kernel<TI, TO><<<flat_blocks(len), kThreads, 0, stream>>>(in, out,
                                                                      len);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_elementwise_f32_to_bf16(const float *in, uint16_t *out,
                                               size_t len, void *stream)
{
    if (len > (size_t)INT64_MAX)
        return TG_EINVAL;
    if (len == 0)
        return 0;
    if (in == nullptr || out == nullptr || !aligned(in, 4) || !aligned(out, 2))
        return TG_EINVAL;
    return launch_convert(in, reinterpret_cast<__nv_bfloat16 *>(out),
                          (int64_t)len, (cudaStream_t)stream);
}

extern "C" int tg_cuda_elementwise_bf16_to_f32(const uint16_t *in, float *out,
                                               size_t len, void *stream)
{
    if (len > (size_t)INT64_MAX)
        return TG_EINVAL;
    if (len == 0)
        return 0;
    if (in == nullptr || out == nullptr || !aligned(in, 2) || !aligned(out, 4))
        return TG_EINVAL;
    return launch_convert(reinterpret_cast<const __nv_bfloat16 *>(in), out,
                          (int64_t)len, (cudaStream_t)stream);
}
