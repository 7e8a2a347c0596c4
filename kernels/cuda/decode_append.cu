// decode_append.cu — batched KV append of one decode step (see
// decode_append.h). Three layers: a static __global__ kernel templated on
// the copy unit, a static launcher on a stream, the checked extern "C"
// entry. The CPU reference is tg_ops_cpu.kv_append (kernels/cpu/
// cpu_score.c) with one token per sequence.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/decode_append.h"
#include "kernels/cuda/kv_csr.cuh"

#include <climits>
#include <cstdint>

namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 4; // (sequence, head) items per block
constexpr int kThreads = kWarp * kWarps;

// Everything the kernel reads besides the tensors; passed by value.
struct append_params {
    const int32_t *head_group; // (Hkv)
    const int32_t *head_slot;  // (Hkv)
    tg_cuda_kv_csr table;      // the layer's rows, lens incl. the token
    int32_t *fault;            // (1) or NULL
    int64_t n_pages;
    int64_t n_items; // n_seq * Hkv
    int n_kv_heads;
    int du;                    // head_dim in copy units
    int hp, page_size;
};

} // namespace

// grid ceil(n_items / kWarps), block kThreads: warp w of block b copies
// item b * kWarps + w = s * Hkv + h. T is the copy unit: uint4 (8 bf16)
// on the aligned path, uint16_t otherwise; all offsets count T units.
template <typename T>
static __global__ void __launch_bounds__(kThreads)
decode_append_kernel(const append_params p, const T *__restrict__ k,
                     const T *__restrict__ v, T *__restrict__ pool)
{
    const int warp = (int)threadIdx.x / kWarp, lane = (int)threadIdx.x % kWarp;
    const int64_t item = (int64_t)blockIdx.x * kWarps + warp;
    if (item >= p.n_items) // the same for the whole warp
        return;
    const int s = (int)(item / p.n_kv_heads), h = (int)(item % p.n_kv_heads);
    const int grp = p.head_group[h], slot = p.head_slot[h];
    const tg_cuda_kv_csr &tb = p.table;
    const int64_t row = kv_csr_row(tb, s, grp);
    const int P = p.page_size;
    bool ok = grp >= 0 && slot >= 0 && slot < p.hp && row < tb.n_rows;
    int64_t t = -1, page = -1;
    if (ok) {
        // lens (or the head's own count) already include the new token
        t = kv_csr_head_len(tb, s, h, tb.lens[row]) - 1;
        const int64_t first = tb.indptr[row];
        const int64_t owned = (int64_t)tb.indptr[row + 1] - first;
        ok = t >= 0 && t / P < owned;
        if (ok) {
            page = tb.indices[first + t / P];
            ok = page >= 0 && page < p.n_pages;
        }
    }
    if (!ok) {
        if (lane == 0 && p.fault != nullptr)
            *p.fault = 1;
        return;
    }
    const size_t du = (size_t)p.du;
    T *dk = pool + (((size_t)page * p.hp + slot) * 2 * (size_t)P +
                    (size_t)(t % P)) * du;
    T *dv = dk + (size_t)P * du; // V rows sit P rows after the K rows
    const T *sk = k + (size_t)item * du, *sv = v + (size_t)item * du;
    // K in units [0, du), V in [du, 2 du): all 32 lanes busy for d >= 128.
    for (int c = lane; c < 2 * p.du; c += kWarp) {
        if (c < p.du)
            dk[c] = sk[c];
        else
            dv[c - p.du] = sv[c - p.du];
    }
}

static int launch_append(const append_params &p, bool vec, const uint16_t *k,
                         const uint16_t *v, uint16_t *pool, cudaStream_t stream)
{
    const unsigned blocks = (unsigned)((p.n_items + kWarps - 1) / kWarps);
    if (vec)
        decode_append_kernel<uint4><<<blocks, kThreads, 0, stream>>>(
            p, reinterpret_cast<const uint4 *>(k),
            reinterpret_cast<const uint4 *>(v), reinterpret_cast<uint4 *>(pool));
    else
        decode_append_kernel<uint16_t><<<blocks, kThreads, 0, stream>>>(
            p, k, v, pool);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

static bool aligned16(const void *ptr)
{
    return ((uintptr_t)ptr % 16) == 0;
}

extern "C" int tg_cuda_decode_append(const struct tg_cuda_decode_append_args *a,
                                     char *err, size_t errlen)
{
    if (a == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "decode_append: no arguments");
    if (a->n_seq < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_append: n_seq %d < 0", a->n_seq);
    if (a->n_kv_heads < 1 || a->head_dim < 1 || a->heads_per_group < 1 ||
        a->page_size < 1 || a->n_pages < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_append: Hkv %d, d %d, H_p %d, P %d, "
                          "%lld pages", a->n_kv_heads, a->head_dim,
                          a->heads_per_group, a->page_size,
                          (long long)a->n_pages);
    const struct tg_cuda_kv_csr *t = &a->table;
    if (t->row_stride < 1 || t->row_offset < 0 || t->n_rows < 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_append: table stride %d, offset %d, %d rows",
                          t->row_stride, t->row_offset, t->n_rows);
    const int64_t n_items = (int64_t)a->n_seq * a->n_kv_heads;
    if (n_items / kWarps >= (int64_t)INT_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_append: %d sequences x %d heads: grid too "
                          "big", a->n_seq, a->n_kv_heads);
    if (a->n_seq == 0)
        return 0;
    if (a->k == nullptr || a->v == nullptr || a->pool == nullptr ||
        a->head_group == nullptr || a->head_slot == nullptr ||
        t->indptr == nullptr || t->indices == nullptr || t->lens == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "decode_append: a device pointer is NULL");
    // The first row of the last sequence must exist (a span of 1); each
    // item's own row (which adds head_group, unknown here) is checked on
    // the device.
    int rc = kv_csr_check(t, a->n_seq, 1, a->n_kv_heads, "decode_append", err,
                          errlen);
    if (rc != 0)
        return rc;
    append_params p;
    p.head_group = a->head_group;
    p.head_slot = a->head_slot;
    p.table = *t;
    p.fault = a->fault;
    p.n_pages = a->n_pages;
    p.n_items = n_items;
    p.n_kv_heads = a->n_kv_heads;
    p.hp = a->heads_per_group;
    p.page_size = a->page_size;
    const bool vec = a->head_dim % 8 == 0 && aligned16(a->k) &&
                     aligned16(a->v) && aligned16(a->pool);
    p.du = vec ? a->head_dim / 8 : a->head_dim;
    return launch_append(p, vec, a->k, a->v, a->pool, (cudaStream_t)a->stream);
}
