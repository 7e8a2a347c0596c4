// sample.cu — logprobs, argmax, top-K logprobs and seeded sampling over
// fp32 logits (see sample.h for the semantics and the generator).
//
// Every kernel gives one block of BS threads to one row and walks the row
// in coalesced strides; cross-thread work is cub block reductions and
// scans in fp32. Selection ties are broken by id through one total order,
// (value desc, id asc), with NaN mapped to -inf, the order of the CPU
// reference's cpu__pair_before.
//
// Sampling with top-k/top-p sorts rows with cub's (stable) radix sort on
// 64-bit keys (local row << 32 | descending-order bits of the scaled
// logit), so each row's segment comes out in (value desc, id asc) order;
// top-k is then a prefix length, top-p a prefix found by a block scan, and
// the draw another scan for the first prefix sum above u * Z (inverse CDF).
// Rows without top-k/top-p skip the sort: the draw is order-independent.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/sample.h"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <curand_kernel.h>

#define BS 512 // threads per row block

// vLLM's _SAMPLING_EPS, as in the CPU reference: below it, greedy.
#define GREEDY_EPS 1e-5f

struct tg_cuda_sampler {
    int vocab;
    int max_rows;
    int sort_rows; // rows per radix-sort pass
    tg_cuda_sample_params *params; // device (max_rows)
    uint64_t *keys_in, *keys_out;  // device (sort_rows * vocab)
    int32_t *ids_in, *ids_out;     // device (sort_rows * vocab)
    void *sort_tmp;                // device cub temporary storage
    size_t sort_tmp_bytes;
};

// ---------------------------------------------------------------- helpers

struct best_pair {
    float v;
    int id;
};

// (v desc, id asc): true when a comes first.
static __device__ __forceinline__ bool pair_before(best_pair a, best_pair b)
{
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

struct pair_min_op {
    __device__ __forceinline__ best_pair operator()(const best_pair &a,
                                                    const best_pair &b) const
    {
        return pair_before(a, b) ? a : b;
    }
};

static __device__ __forceinline__ float nan_to_ninf(float x)
{
    return isnan(x) ? -INFINITY : x;
}

// Each helper starts with a barrier so its shared storage is free to reuse
// (every thread has read the previous result), and ends with one so the
// broadcast value is visible.
static __device__ float block_max(float v)
{
    typedef cub::BlockReduce<float, BS> reduce_t;
    __shared__ typename reduce_t::TempStorage tmp;
    __shared__ float out;
    __syncthreads();
    // fmaxf skips NaN, as the CPU's `x > mx` scan does.
    float r = reduce_t(tmp).Reduce(v, [](float a, float b) {
        return fmaxf(a, b);
    });
    if (threadIdx.x == 0)
        out = r;
    __syncthreads();
    return out;
}

static __device__ float block_sum(float v)
{
    typedef cub::BlockReduce<float, BS> reduce_t;
    __shared__ typename reduce_t::TempStorage tmp;
    __shared__ float out;
    __syncthreads();
    float r = reduce_t(tmp).Sum(v);
    if (threadIdx.x == 0)
        out = r;
    __syncthreads();
    return out;
}

static __device__ int block_max_int(int v)
{
    typedef cub::BlockReduce<int, BS> reduce_t;
    __shared__ typename reduce_t::TempStorage tmp;
    __shared__ int out;
    __syncthreads();
    int r = reduce_t(tmp).Reduce(v, [](int a, int b) { return a > b ? a : b; });
    if (threadIdx.x == 0)
        out = r;
    __syncthreads();
    return out;
}

static __device__ int block_min_int(int v)
{
    typedef cub::BlockReduce<int, BS> reduce_t;
    __shared__ typename reduce_t::TempStorage tmp;
    __shared__ int out;
    __syncthreads();
    int r = reduce_t(tmp).Reduce(v, [](int a, int b) { return a < b ? a : b; });
    if (threadIdx.x == 0)
        out = r;
    __syncthreads();
    return out;
}

static __device__ best_pair block_best(best_pair p)
{
    typedef cub::BlockReduce<best_pair, BS> reduce_t;
    __shared__ typename reduce_t::TempStorage tmp;
    __shared__ best_pair out;
    __syncthreads();
    best_pair r = reduce_t(tmp).Reduce(p, pair_min_op());
    if (threadIdx.x == 0)
        out = r;
    __syncthreads();
    return out;
}

// Max and log-sum-exp of row x[0..V): lse = max + log(sum exp(x - max)),
// or the max itself when it is +-inf (the CPU reference's row_lse).
static __device__ float row_lse(const float *__restrict__ x, int V)
{
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += BS)
        mx = fmaxf(mx, x[j]);
    mx = block_max(mx);
    if (isinf(mx))
        return mx;
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += BS)
        s += expf(x[j] - mx);
    s = block_sum(s);
    return mx + logf(s);
}

// First element of x[0..V) in (value desc, id asc) order among those
// strictly after `prev` in that order (prev = {+inf, -1}: the very first).
static __device__ best_pair row_best_after(const float *__restrict__ x, int V,
                                           best_pair prev)
{
    best_pair b = {-INFINITY, INT_MAX};
    for (int j = threadIdx.x; j < V; j += BS) {
        best_pair c = {nan_to_ninf(x[j]), j};
        if (pair_before(prev, c) && pair_before(c, b))
            b = c;
    }
    return block_best(b);
}

// ---------------------------------------------------------------- logprobs

static __global__ void logprobs_kernel(const float *__restrict__ logits, int V,
                                       const int32_t *__restrict__ target,
                                       float *__restrict__ lp)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    float lse = row_lse(x, V);
    if (threadIdx.x == 0) {
        int t = target[blockIdx.x];
        lp[blockIdx.x] = (t >= 0 && t < V) ? x[t] - lse : NAN;
    }
}

static int launch_logprobs(const float *logits, int n, int V,
                           const int32_t *target, float *lp,
                           cudaStream_t stream)
{
    logprobs_kernel<<<n, BS, 0, stream>>>(logits, V, target, lp);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_logprobs(const float *logits, int n, int vocab,
                                const int32_t *target, float *lp, void *stream)
{
    if (n < 0 || vocab < 1)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (logits == nullptr || target == nullptr || lp == nullptr)
        return TG_EINVAL;
    return launch_logprobs(logits, n, vocab, target, lp, (cudaStream_t)stream);
}

// ---------------------------------------------------------------- argmax

static __global__ void argmax_kernel(const float *__restrict__ logits, int V,
                                     int32_t *__restrict__ ids)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    best_pair b = row_best_after(x, V, best_pair{INFINITY, -1});
    if (threadIdx.x == 0)
        ids[blockIdx.x] = b.id < V ? b.id : 0;
}

static int launch_argmax(const float *logits, int n, int V, int32_t *ids,
                         cudaStream_t stream)
{
    argmax_kernel<<<n, BS, 0, stream>>>(logits, V, ids);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_argmax(const float *logits, int n, int vocab,
                              int32_t *ids, void *stream)
{
    if (n < 0 || vocab < 1)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (logits == nullptr || ids == nullptr)
        return TG_EINVAL;
    return launch_argmax(logits, n, vocab, ids, (cudaStream_t)stream);
}

// ---------------------------------------------------------------- finiteness

// first[row] = the smallest id whose logit is NaN or +-inf, else -1;
// value[row] = that logit, else 0.
static __global__ void first_nonfinite_kernel(const float *__restrict__ logits,
                                              int V, int32_t *__restrict__ first,
                                              float *__restrict__ value)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    int bad = INT_MAX;
    for (int j = threadIdx.x; j < V && bad == INT_MAX; j += BS)
        if (!isfinite(x[j]))
            bad = j;
    bad = block_min_int(bad);
    if (threadIdx.x == 0) {
        first[blockIdx.x] = bad == INT_MAX ? -1 : bad;
        value[blockIdx.x] = bad == INT_MAX ? 0.0f : x[bad];
    }
}

static int launch_first_nonfinite(const float *logits, int n, int V,
                                  int32_t *first, float *value,
                                  cudaStream_t stream)
{
    first_nonfinite_kernel<<<n, BS, 0, stream>>>(logits, V, first, value);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_first_nonfinite(const float *logits, int n, int vocab,
                                       int32_t *first, float *value,
                                       void *stream)
{
    if (n < 0 || vocab < 1)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (logits == nullptr || first == nullptr || value == nullptr)
        return TG_EINVAL;
    return launch_first_nonfinite(logits, n, vocab, first, value,
                                  (cudaStream_t)stream);
}

// ---------------------------------------------------------------- logit bias

// One thread per (row, id, value) entry. Entries of one row name distinct
// ids (the router refuses repeats), so no two threads touch one logit.
static __global__ void logit_bias_kernel(float *__restrict__ logits, int V,
                                         const int32_t *__restrict__ rows,
                                         const int32_t *__restrict__ ids,
                                         const float *__restrict__ vals, int n,
                                         float scale)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int id = ids[i];
        if (id >= 0 && id < V)
            logits[(size_t)rows[i] * V + id] += scale * vals[i];
    }
}

static int launch_logit_bias(float *logits, int V, const int32_t *rows,
                             const int32_t *ids, const float *vals, int n,
                             float scale, cudaStream_t stream)
{
    const int threads = 256;
    logit_bias_kernel<<<(n + threads - 1) / threads, threads, 0, stream>>>(
        logits, V, rows, ids, vals, n, scale);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_logit_bias(float *logits, int vocab,
                                  const int32_t *rows, const int32_t *ids,
                                  const float *vals, int n, float scale,
                                  void *stream)
{
    if (n < 0 || vocab < 1 || !std::isfinite(scale))
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (logits == nullptr || rows == nullptr || ids == nullptr ||
        vals == nullptr)
        return TG_EINVAL;
    return launch_logit_bias(logits, vocab, rows, ids, vals, n, scale,
                             (cudaStream_t)stream);
}

// ---------------------------------------------------------------- top-K

// K rounds of "best element after the previous pick": a selection sort
// over the strict total order, so no scratch and no exclusion marks.
static __global__ void topk_kernel(const float *__restrict__ logits, int V,
                                   int k, int32_t *__restrict__ ids,
                                   float *__restrict__ lps)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    float lse = row_lse(x, V);
    best_pair prev = {INFINITY, -1};
    for (int r = 0; r < k; r++) {
        prev = row_best_after(x, V, prev);
        if (threadIdx.x == 0) {
            // k <= V, so a pick always exists (INT_MAX never survives).
            ids[(size_t)blockIdx.x * k + r] = prev.id;
            lps[(size_t)blockIdx.x * k + r] = x[prev.id] - lse;
        }
    }
}

static int launch_topk(const float *logits, int n, int V, int k, int32_t *ids,
                       float *lps, cudaStream_t stream)
{
    topk_kernel<<<n, BS, 0, stream>>>(logits, V, k, ids, lps);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_topk_logprobs(const float *logits, int n, int vocab,
                                     int k, int32_t *ids, float *lps,
                                     void *stream)
{
    if (n < 0 || vocab < 1 || k < 1 || k > vocab)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (logits == nullptr || ids == nullptr || lps == nullptr)
        return TG_EINVAL;
    return launch_topk(logits, n, vocab, k, ids, lps, (cudaStream_t)stream);
}

// ---------------------------------------------------------------- ranks

// 1 + the ids whose logit is strictly greater than the target's; a NaN
// logit is never greater, a NaN target ranks after every other id. The
// counts are summed as floats: exact below 2^24 ids.
static __global__ void rank_kernel(const float *__restrict__ logits, int V,
                                   const int32_t *__restrict__ target,
                                   int32_t *__restrict__ rank)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    int t = target[blockIdx.x];
    float xt = (t >= 0 && t < V) ? x[t] : NAN;
    bool tnan = isnan(xt);
    float c = 0.0f;
    for (int j = threadIdx.x; j < V; j += BS)
        c += (x[j] > xt || (tnan && !isnan(x[j]))) ? 1.0f : 0.0f;
    c = block_sum(c);
    if (threadIdx.x == 0)
        rank[blockIdx.x] = (t >= 0 && t < V) ? (int32_t)c + 1 : -1;
}

extern "C" int tg_cuda_token_rank(const float *logits, int n, int vocab,
                                  const int32_t *target, int32_t *rank,
                                  void *stream)
{
    if (n < 0 || vocab < 1 || vocab >= (1 << 24))
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (logits == nullptr || target == nullptr || rank == nullptr)
        return TG_EINVAL;
    rank_kernel<<<n, BS, 0, (cudaStream_t)stream>>>(logits, vocab, target,
                                                    rank);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// ---------------------------------------------------------------- sampling

// The logit as the sampler sees it: NaN -> -inf, times 1/T (the CPU
// multiplies by the rounded reciprocal too), -0 -> +0 so the radix order
// of equal values is the id order.
static __device__ __forceinline__ float scaled_logit(float x, float inv_t)
{
    float v = nan_to_ninf(x);
    if (inv_t != 1.0f)
        v *= inv_t;
    if (v == 0.0f)
        v = 0.0f;
    return v;
}

// Bits whose unsigned ascending order is the float descending order
// (non-NaN): the usual sign-flip map, then complemented.
static __device__ __forceinline__ uint32_t desc_bits(float v)
{
    uint32_t u = __float_as_uint(v);
    uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~ord;
}

static __device__ __forceinline__ float from_desc_bits(uint32_t d)
{
    uint32_t ord = ~d;
    uint32_t u = (ord & 0x80000000u) ? (ord & 0x7FFFFFFFu) : ~ord;
    return __uint_as_float(u);
}

static __device__ __forceinline__ float inv_temperature(
    const tg_cuda_sample_params &p)
{
    return p.temperature < GREEDY_EPS || p.temperature == 1.0f
               ? 1.0f
               : 1.0f / p.temperature;
}

// Top-k or top-p needs the (value desc, id asc) order; greedy rows and
// rows with only temperature/min-p are drawn in id order. The host makes
// the same decision (row_needs_sort) to skip sorting when no row needs it.
static __host__ __device__ __forceinline__ bool row_needs_sort(
    const tg_cuda_sample_params &p, int V)
{
    return !(p.temperature < GREEDY_EPS) &&
           ((p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f);
}

// Sort keys for `rows` rows starting at the chunk's first row. Grid-stride.
static __global__ void sort_prep_kernel(const float *__restrict__ logits,
                                        const tg_cuda_sample_params *params,
                                        int rows, int V,
                                        uint64_t *__restrict__ keys,
                                        int32_t *__restrict__ ids)
{
    int64_t total = (int64_t)rows * V;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         i < total; i += stride) {
        int r = (int)(i / V), j = (int)(i % V);
        float v = scaled_logit(logits[i], inv_temperature(params[r]));
        keys[i] = (uint64_t)r << 32 | desc_bits(v);
        ids[i] = j;
    }
}

// One row's candidates: either the sorted (keys, ids) segment, or the raw
// logits in id order, scaled on the fly.
struct row_view {
    const float *logits;   // (V) raw row
    const uint64_t *keys;  // (V) sorted keys, or nullptr
    const int32_t *ids;    // (V) sorted ids, or nullptr
    float inv_t;

    __device__ float val(int j) const
    {
        return keys != nullptr ? from_desc_bits((uint32_t)keys[j])
                               : scaled_logit(logits[j], inv_t);
    }
    __device__ int id(int j) const { return ids != nullptr ? ids[j] : j; }
};

// Weight exp(val - m) of candidate j, 0 below the min-p floor.
struct weight_fn {
    const row_view *rv;
    float m, floor_v;
    __device__ float operator()(int j) const
    {
        float v = rv->val(j);
        return v >= floor_v ? expf(v - m) : 0.0f;
    }
};

// Walks w(0..nc) in tiles of BS with an inclusive block scan. Returns the
// first j with w(j) > 0 whose prefix sum reaches `target` (>= when ge,
// else >), or -1 (then *total is the full sum, accumulated tile by tile,
// and *last_pos the last j with w(j) > 0, or -1). Only positive weights
// may hit: the block scan is not sequential (cub's raking scan restarts
// every 16 items from a tree-summed prefix), so the prefix at a zero-weight
// j can round an ulp above that of j - 1, and a target in that gap would
// otherwise pick a token of weight 0 (a -inf logit or one below min-p),
// which the CPU reference (positive weights only) never does.
static __device__ int scan_find(int nc, const weight_fn &w, float target,
                                bool ge, float *total, int *last_pos)
{
    typedef cub::BlockScan<float, BS> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    float carry = 0.0f;
    int last = -1;
    for (int base = 0; base < nc; base += BS) {
        int j = base + (int)threadIdx.x;
        float wj = j < nc ? w(j) : 0.0f;
        if (wj > 0.0f)
            last = j;
        float incl, agg;
        __syncthreads(); // tmp free again
        scan_t(tmp).InclusiveSum(wj, incl, agg);
        float cum = carry + incl;
        bool hit = wj > 0.0f && (ge ? cum >= target : cum > target);
        int first = block_min_int(hit ? j : INT_MAX);
        if (first != INT_MAX) {
            *total = carry + agg;
            *last_pos = block_max_int(last);
            return first;
        }
        carry += agg;
    }
    *total = carry;
    *last_pos = block_max_int(last);
    return -1;
}

// One block per row. keys/ids: the sorted chunk (row r's segment at r*V),
// or nullptr for rows drawn in id order (then no row uses top-k/top-p).
static __global__ void draw_kernel(const float *__restrict__ logits, int V,
                                   const tg_cuda_sample_params *params,
                                   const uint64_t *__restrict__ keys,
                                   const int32_t *__restrict__ ids,
                                   int32_t *__restrict__ tokens)
{
    const int r = blockIdx.x;
    const tg_cuda_sample_params p = params[r];
    // A row reads the sorted segment only when it needs the order, so its
    // token never depends on whether other rows made the batch sort.
    const bool sorted = keys != nullptr && row_needs_sort(p, V);
    row_view rv;
    rv.logits = logits + (size_t)r * V;
    rv.keys = sorted ? keys + (size_t)r * V : nullptr;
    rv.ids = sorted ? ids + (size_t)r * V : nullptr;
    rv.inv_t = inv_temperature(p);
    const bool greedy = p.temperature < GREEDY_EPS;
    __shared__ float target_sh; // u * Z, drawn by thread 0

    int nc = V;
    float m;
    int best_id;
    if (rv.keys != nullptr) {
        // Sorted: candidate 0 is the best.
        m = rv.val(0);
        best_id = rv.id(0);
        if (p.top_k > 0 && p.top_k < V)
            nc = p.top_k;
    } else {
        best_pair b = {-INFINITY, INT_MAX};
        for (int j = threadIdx.x; j < V; j += BS) {
            best_pair c = {rv.val(j), j};
            if (pair_before(c, b))
                b = c;
        }
        b = block_best(b);
        m = b.v;
        best_id = b.id < V ? b.id : 0;
    }
    // Greedy, or no finite weight to draw from: the best candidate.
    if (greedy || isinf(m)) {
        if (threadIdx.x == 0)
            tokens[r] = best_id;
        return;
    }
    float total;
    int last;
    if (rv.keys != nullptr && p.top_p < 1.0f) {
        // Smallest prefix whose mass reaches top_p of the top-k mass.
        weight_fn all = {&rv, m, -INFINITY};
        scan_find(nc, all, INFINITY, true, &total, &last);
        int keep = scan_find(nc, all, p.top_p * total, true, &total, &last);
        if (keep >= 0)
            nc = keep + 1;
    }
    // min-p: p >= min_p * p_max  <=>  v >= m + log(min_p).
    float floor_v = p.min_p > 0.0f ? m + logf(p.min_p) : -INFINITY;
    weight_fn w = {&rv, m, floor_v};
    scan_find(nc, w, INFINITY, true, &total, &last);
    if (threadIdx.x == 0) {
        curandStatePhilox4_32_10_t st;
        curand_init((unsigned long long)p.seed, (unsigned long long)p.step, 0,
                    &st);
        // The first 32-bit output as a fraction: u in [0, 1), 2^-32 steps.
        double u = (double)curand(&st) * 0x1.0p-32;
        target_sh = (float)(u * (double)total);
    }
    __syncthreads();
    float target = target_sh;
    int hit = scan_find(nc, w, target, false, &total, &last);
    // Rounding can leave the target at or above the last prefix sum: the
    // last positive weight takes it (the CPU reference does the same).
    // The maximum has weight 1, so last >= 0.
    int pick = hit >= 0 ? hit : last;
    if (threadIdx.x == 0)
        tokens[r] = rv.id(pick);
}

static int launch_sort_prep(const float *logits,
                            const tg_cuda_sample_params *params, int rows,
                            int V, uint64_t *keys, int32_t *ids,
                            cudaStream_t stream)
{
    int64_t total = (int64_t)rows * V;
    const int threads = 256;
    int64_t want = (total + threads - 1) / threads;
    int blocks = (int)(want < 8192 ? want : 8192);
    sort_prep_kernel<<<blocks, threads, 0, stream>>>(logits, params, rows, V,
                                                     keys, ids);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

static int launch_draw(const float *logits, int rows, int V,
                       const tg_cuda_sample_params *params,
                       const uint64_t *keys, const int32_t *ids,
                       int32_t *tokens, cudaStream_t stream)
{
    draw_kernel<<<rows, BS, 0, stream>>>(logits, V, params, keys, ids, tokens);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// Bits of the local row index in a sort key (0 for one row).
static int row_bits(int rows)
{
    int b = 0;
    while ((1 << b) < rows)
        b++;
    return b;
}

extern "C" void tg_cuda_sampler_free(struct tg_cuda_sampler *s)
{
    if (s == nullptr)
        return;
    (void)cudaDeviceSynchronize(); // queued kernels may still use scratch
    (void)cudaFree(s->params);
    (void)cudaFree(s->keys_in);
    (void)cudaFree(s->keys_out);
    (void)cudaFree(s->ids_in);
    (void)cudaFree(s->ids_out);
    (void)cudaFree(s->sort_tmp);
    free(s);
}

extern "C" int tg_cuda_sampler_new(int vocab, int max_rows,
                                   struct tg_cuda_sampler **out, char *err,
                                   size_t errlen)
{
    if (out == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "sampler: out is NULL");
    *out = nullptr;
    if (vocab < 1 || max_rows < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "sampler: vocab %d and max_rows %d must be >= 1",
                          vocab, max_rows);
    int sort_rows = max_rows < TG_CUDA_SAMPLE_SORT_ROWS
                        ? max_rows
                        : TG_CUDA_SAMPLE_SORT_ROWS;
    int64_t items = (int64_t)sort_rows * vocab;
    if (items > INT_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "sampler: %d rows x vocab %d exceed 2^31 items",
                          sort_rows, vocab);
    tg_cuda_sampler *s = (tg_cuda_sampler *)calloc(1, sizeof(*s));
    if (s == nullptr)
        return tg_err_set(err, errlen, TG_ENOMEM,
                          "sampler: out of host memory");
    s->vocab = vocab;
    s->max_rows = max_rows;
    s->sort_rows = sort_rows;
    size_t nk = (size_t)items;
    cudaError_t st = cudaMalloc(&s->params, (size_t)max_rows *
                                                sizeof(tg_cuda_sample_params));
    if (st == cudaSuccess)
        st = cudaMalloc(&s->keys_in, nk * sizeof(uint64_t));
    if (st == cudaSuccess)
        st = cudaMalloc(&s->keys_out, nk * sizeof(uint64_t));
    if (st == cudaSuccess)
        st = cudaMalloc(&s->ids_in, nk * sizeof(int32_t));
    if (st == cudaSuccess)
        st = cudaMalloc(&s->ids_out, nk * sizeof(int32_t));
    if (st == cudaSuccess)
        st = cub::DeviceRadixSort::SortPairs(
            nullptr, s->sort_tmp_bytes, s->keys_in, s->keys_out, s->ids_in,
            s->ids_out, (int)items, 0, 32 + row_bits(sort_rows));
    if (st == cudaSuccess)
        st = cudaMalloc(&s->sort_tmp, s->sort_tmp_bytes > 0 ? s->sort_tmp_bytes
                                                            : 1);
    if (st != cudaSuccess) {
        int rc = tg_err_set(err, errlen, TG_EDEVICE,
                            "sampler: %zu bytes of scratch for %d x %d: %s",
                            nk * 24 + s->sort_tmp_bytes, sort_rows, vocab,
                            cudaGetErrorString(st));
        tg_cuda_sampler_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

// What tg_sampling_check established for the value a row's parameters
// were built from (the caller's trust boundary checked it once): an
// assertion of the draw's invariants, never an input check.
static bool params_in_range(const tg_cuda_sample_params *p)
{
    return p->temperature >= 0.0f && std::isfinite(p->temperature) &&
           p->top_p > 0.0f && p->top_p <= 1.0f && p->min_p >= 0.0f &&
           p->min_p <= 1.0f;
}

extern "C" int tg_cuda_sample(struct tg_cuda_sampler *s, const float *logits,
                              int n, int vocab,
                              const struct tg_cuda_sample_params *params,
                              int32_t *tokens, float *lps, void *stream)
{
    if (s == nullptr || n < 0 || n > s->max_rows || vocab != s->vocab)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (logits == nullptr || params == nullptr || tokens == nullptr)
        return TG_EINVAL;
    bool need_sort = false;
    for (int i = 0; i < n; i++) {
        TG_ASSERT(params_in_range(&params[i]));
        if (row_needs_sort(params[i], vocab))
            need_sort = true;
    }
    cudaStream_t st = (cudaStream_t)stream;
    // Pageable source: staged before return, so the caller may reuse it.
    TG_CUDA_TRY(cudaMemcpyAsync(s->params, params,
                                (size_t)n * sizeof(tg_cuda_sample_params),
                                cudaMemcpyHostToDevice, st));
    int rc = 0;
    if (!need_sort) {
        rc = launch_draw(logits, n, vocab, s->params, nullptr, nullptr, tokens,
                         st);
    } else {
        for (int r0 = 0; r0 < n && rc == 0; r0 += s->sort_rows) {
            int rows = n - r0 < s->sort_rows ? n - r0 : s->sort_rows;
            const float *lg = logits + (size_t)r0 * vocab;
            rc = launch_sort_prep(lg, s->params + r0, rows, vocab, s->keys_in,
                                  s->ids_in, st);
            if (rc != 0)
                break;
            size_t need = 0;
            int items = rows * vocab;
            int end_bit = 32 + row_bits(rows);
            TG_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
                nullptr, need, s->keys_in, s->keys_out, s->ids_in, s->ids_out,
                items, 0, end_bit, st));
            if (need > s->sort_tmp_bytes)
                return TG_EINTERNAL; // sized at creation for the most items
            size_t have = s->sort_tmp_bytes;
            TG_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
                s->sort_tmp, have, s->keys_in, s->keys_out, s->ids_in,
                s->ids_out, items, 0, end_bit, st));
            rc = launch_draw(lg, rows, vocab, s->params + r0, s->keys_out,
                             s->ids_out, tokens + r0, st);
        }
    }
    if (rc != 0)
        return rc;
    if (lps != nullptr)
        return launch_logprobs(logits, n, vocab, tokens, lps, st);
    return 0;
}
