// kv_table_dev.cu — device copy of the block table and the (row, token) ->
// (page, slot) lookup kernel (see kv_table_dev.h). Three layers: the
// static kernel, its static launcher on a stream, the checked extern "C"
// entries.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/kv_table_dev.h"

#include <cstring>

// One thread per query. Out-of-range queries answer -1 so a caller can
// tell "no page" from page 0.
static __global__ void resolve_kernel(const int32_t *__restrict__ indptr,
                                      const int32_t *__restrict__ indices,
                                      const int32_t *__restrict__ npages,
                                      int32_t n_rows, int32_t page_size,
                                      int32_t n,
                                      const int32_t *__restrict__ rows,
                                      const int32_t *__restrict__ tokens,
                                      int32_t *__restrict__ page,
                                      int32_t *__restrict__ slot)
{
    int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n)
        return;
    int32_t r = rows[i], t = tokens[i];
    if (r < 0 || r >= n_rows || t < 0 || t / page_size >= npages[r]) {
        page[i] = -1;
        slot[i] = -1;
        return;
    }
    page[i] = indices[indptr[r] + t / page_size];
    slot[i] = t % page_size;
}

static int launch_resolve(const struct tg_cuda_kv_table_dev *dt, int32_t n,
                          const int32_t *rows, const int32_t *tokens,
                          int32_t *page, int32_t *slot, cudaStream_t stream)
{
    const int threads = 256;
    int blocks = (n + threads - 1) / threads;
    resolve_kernel<<<blocks, threads, 0, stream>>>(
        dt->indptr, dt->indices, dt->npages, dt->n_rows, dt->page_size, n,
        rows, tokens, page, slot);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

// One thread per update (grid-stride): dst[pos[i]] = val[i].
static __global__ void scatter_kernel(int32_t *__restrict__ dst,
                                      const int32_t *__restrict__ pos,
                                      const int32_t *__restrict__ val,
                                      int32_t n)
{
    for (int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
         i += (int32_t)(gridDim.x * blockDim.x))
        dst[pos[i]] = val[i];
}

static int launch_scatter(int32_t *dst, const int32_t *pos,
                          const int32_t *val, int32_t n, cudaStream_t st)
{
    const int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    if (blocks > 4096)
        blocks = 4096;
    scatter_kernel<<<blocks, threads, 0, st>>>(dst, pos, val, n);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_kv_table_dev_scatter(int32_t *dst, const int32_t *pos,
                                            const int32_t *val, int32_t n,
                                            void *stream)
{
    if (n < 0 || (n > 0 && (dst == nullptr || pos == nullptr ||
                            val == nullptr)))
        return TG_EINVAL;
    if (n == 0)
        return 0;
    return launch_scatter(dst, pos, val, n, (cudaStream_t)stream);
}

extern "C" void tg_cuda_kv_table_dev_init(struct tg_cuda_kv_table_dev *dt)
{
    memset(dt, 0, sizeof(*dt));
}

extern "C" void tg_cuda_kv_table_dev_free(struct tg_cuda_kv_table_dev *dt)
{
    // cudaFree(NULL) is a no-op; errors on teardown have no one to go to.
    (void)cudaFree(dt->indptr);
    (void)cudaFree(dt->indices);
    (void)cudaFree(dt->npages);
    (void)cudaFree(dt->lens);
    memset(dt, 0, sizeof(*dt));
}

// Replaces *buf with a device buffer of at least `want` int32s, growing
// by half again so repeated uploads of a growing table stay amortised.
static int grow_dev(int32_t **buf, int64_t *cap, int64_t want)
{
    if (want <= *cap && *buf != nullptr)
        return 0;
    int64_t n = *cap + *cap / 2;
    if (n < want)
        n = want;
    if (n < 64)
        n = 64;
    int32_t *p = nullptr;
    TG_CUDA_TRY(cudaMalloc(&p, (size_t)n * sizeof(int32_t)));
    if (*buf != nullptr) {
        // The old buffer may still be read by queued work: cudaFree waits.
        cudaError_t st = cudaFree(*buf);
        if (st != cudaSuccess) {
            (void)cudaFree(p);
            TG_CUDA_TRY(st);
        }
    }
    *buf = p;
    *cap = n;
    return 0;
}

extern "C" int tg_cuda_kv_table_dev_upload(struct tg_cuda_kv_table_dev *dt,
                                           const struct kv_table *table,
                                           void *stream)
{
    if (dt == nullptr || table == nullptr || table->n_rows < 0 ||
        table->n_slots < 0 || (table->n_rows > 0 && table->indptr == nullptr))
        return TG_EINVAL;
    int64_t rows = table->n_rows;
    // Row arrays share one capacity: grow all three against the same want.
    int64_t cap_rows = dt->cap_rows;
    if (rows + 1 > dt->cap_rows || dt->indptr == nullptr) {
        int64_t c1 = dt->cap_rows, c2 = dt->cap_rows, c3 = dt->cap_rows;
        int rc = grow_dev(&dt->indptr, &c1, rows + 1);
        if (rc == 0)
            rc = grow_dev(&dt->npages, &c2, c1);
        if (rc == 0)
            rc = grow_dev(&dt->lens, &c3, c1);
        if (rc != 0)
            return rc;
        cap_rows = c1;
    }
    dt->cap_rows = cap_rows;
    int rc = grow_dev(&dt->indices, &dt->cap_slots,
                      table->n_slots > 0 ? table->n_slots : 1);
    if (rc != 0)
        return rc;
    cudaStream_t st = (cudaStream_t)stream;
    TG_CUDA_TRY(cudaMemcpyAsync(dt->indptr, table->indptr,
                                (size_t)(rows + 1) * sizeof(int32_t),
                                cudaMemcpyHostToDevice, st));
    if (rows > 0) {
        TG_CUDA_TRY(cudaMemcpyAsync(dt->npages, table->npages,
                                    (size_t)rows * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, st));
        TG_CUDA_TRY(cudaMemcpyAsync(dt->lens, table->lens,
                                    (size_t)rows * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, st));
    }
    if (table->n_slots > 0)
        TG_CUDA_TRY(cudaMemcpyAsync(dt->indices, table->indices,
                                    (size_t)table->n_slots * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, st));
    dt->n_rows = table->n_rows;
    dt->page_size = table->page_size;
    dt->n_slots = table->n_slots;
    return 0;
}

extern "C" int
tg_cuda_kv_table_dev_resolve(const struct tg_cuda_kv_table_dev *dt, int32_t n,
                             const int32_t *rows, const int32_t *tokens,
                             int32_t *page, int32_t *slot, void *stream)
{
    if (dt == nullptr || n < 0)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (rows == nullptr || tokens == nullptr || page == nullptr ||
        slot == nullptr || dt->indptr == nullptr || dt->page_size < 1)
        return TG_EINVAL;
    return launch_resolve(dt, n, rows, tokens, page, slot,
                          (cudaStream_t)stream);
}

extern "C" int tg_cuda_kv_table_dev_resolve_host(
    const struct tg_cuda_kv_table_dev *dt, int32_t n, const int32_t *rows,
    const int32_t *tokens, int32_t *page, int32_t *slot)
{
    if (dt == nullptr || n < 0 ||
        (n > 0 && (rows == nullptr || tokens == nullptr || page == nullptr ||
                   slot == nullptr)))
        return TG_EINVAL;
    if (n == 0)
        return 0;
    // One buffer for the four arrays: rows, tokens, page, slot.
    int32_t *buf = nullptr;
    size_t bytes = (size_t)n * sizeof(int32_t);
    TG_CUDA_TRY(cudaMalloc(&buf, 4 * bytes));
    int rc = 0;
    cudaError_t st = cudaMemcpy(buf, rows, bytes, cudaMemcpyHostToDevice);
    if (st == cudaSuccess)
        st = cudaMemcpy(buf + n, tokens, bytes, cudaMemcpyHostToDevice);
    if (st == cudaSuccess) {
        rc = tg_cuda_kv_table_dev_resolve(dt, n, buf, buf + n,
                                          buf + 2 * (size_t)n,
                                          buf + 3 * (size_t)n, nullptr);
        if (rc == 0)
            st = cudaMemcpy(page, buf + 2 * (size_t)n, bytes,
                            cudaMemcpyDeviceToHost);
        if (rc == 0 && st == cudaSuccess)
            st = cudaMemcpy(slot, buf + 3 * (size_t)n, bytes,
                            cudaMemcpyDeviceToHost);
    }
    (void)cudaFree(buf);
    if (rc != 0)
        return rc;
    TG_CUDA_TRY(st);
    return 0;
}
