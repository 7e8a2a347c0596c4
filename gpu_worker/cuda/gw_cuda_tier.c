/* gw_cuda_tier.c — the host tier's copies on the CUDA backend (DESIGN.md
 * §4.10): pinned host pages, a copy stream of their own, and an event per
 * copy that orders it after the compute stream's work queued before it
 * (see gw_cuda.h). The copies run on the tier's thread (gw_host_tier.c),
 * which sets the device itself and touches nothing but the copy stream,
 * the fence it was handed and the pages of its op; decode graphs are
 * captured in thread-local mode, so these calls never disturb a capture. */
#include "gpu_worker/cuda/gw_cuda.h"

#ifdef TANGRAM_CUDA
#include <stdint.h>
#include <string.h>

#include "gpu_worker/cuda/gw_cuda_internal.h"

#define TIER_STREAM(c) ((cudaStream_t)(c)->tier_stream)

int gw_cuda_tier_alloc(struct gw_cuda *c, size_t bytes, void **base,
                       char *err, size_t errlen)
{
    *base = NULL;
    cudaStream_t st;
    GW_CU_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    c->tier_stream = st;
    /* Pinned, so cudaMemcpyAsync runs as DMA beside the compute stream. */
    cudaError_t e = cudaHostAlloc(base, bytes > 0 ? bytes : 1,
                                  cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *base = NULL;
        return tg_err_set(err, errlen,
                          e == cudaErrorMemoryAllocation ? TG_ENOMEM
                                                         : TG_EDEVICE,
                          "cannot pin %zu MiB of host memory for the host "
                          "tier (--kv-host-memory): %s", bytes >> 20,
                          cudaGetErrorString(e));
    }
    return 0;
}

void gw_cuda_tier_release(struct gw_cuda *c, void *base)
{
    if (base != NULL)
        cudaFreeHost(base);
    if (c->tier_stream != NULL) {
        cudaStreamSynchronize(TIER_STREAM(c));
        cudaStreamDestroy(TIER_STREAM(c));
        c->tier_stream = NULL;
    }
}

int gw_cuda_tier_fence(struct gw_cuda *c, void **fence, char *err,
                       size_t errlen)
{
    *fence = NULL;
    cudaEvent_t ev;
    GW_CU_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, STREAM(c));
    if (e != cudaSuccess) {
        cudaEventDestroy(ev);
        return tg_err_set(err, errlen, TG_EDEVICE, "cudaEventRecord: %s",
                          cudaGetErrorString(e));
    }
    *fence = ev;
    return 0;
}

void gw_cuda_tier_fence_drop(struct gw_cuda *c, void *fence)
{
    (void)c;
    if (fence != NULL)
        cudaEventDestroy((cudaEvent_t)fence);
}

/* Queues the copies of pages dev[0 .. n) <-> host[0 .. n), one call per
 * run of ids consecutive on both sides. */
static int enqueue(struct gw_cuda *c, char *slab, int to_host,
                   const int32_t *dev, const int32_t *host, int n,
                   size_t bytes, char *err, size_t errlen)
{
    char *pool = (char *)c->pool;
    for (int i = 0; i < n;) {
        int k = 1;
        while (i + k < n && dev[i + k] == dev[i] + k &&
               host[i + k] == host[i] + k)
            k++;
        char *d = pool + (size_t)dev[i] * bytes;
        char *h = slab + (size_t)host[i] * bytes;
        size_t len = (size_t)k * bytes;
        if (to_host)
            GW_CU_TRY(cudaMemcpyAsync(h, d, len, cudaMemcpyDeviceToHost,
                                      TIER_STREAM(c)));
        else
            GW_CU_TRY(cudaMemcpyAsync(d, h, len, cudaMemcpyHostToDevice,
                                      TIER_STREAM(c)));
        i += k;
    }
    return 0;
}

int gw_cuda_tier_copy(struct gw_cuda *c, void *base, int to_host,
                      const int32_t *dev, const int32_t *host, int n,
                      void *fence, char *err, size_t errlen)
{
    cudaEvent_t ev = (cudaEvent_t)fence;
    int rc = 0;
    cudaError_t e = cudaSetDevice(c->opts.device);
    if (e == cudaSuccess && ev != NULL)
        e = cudaStreamWaitEvent(TIER_STREAM(c), ev, 0);
    if (e != cudaSuccess)
        rc = tg_err_set(err, errlen, TG_EDEVICE, "host tier copy: %s",
                        cudaGetErrorString(e));
    /* A page is [H_p][2][P][d] bf16 elements, contiguous in the pool. */
    size_t bytes = (size_t)kv_layout_page_elems(c->layout) * 2;
    if (rc == 0)
        rc = enqueue(c, (char *)base, to_host, dev, host, n, bytes, err,
                     errlen);
    if (rc == 0 && (e = cudaStreamSynchronize(TIER_STREAM(c))) != cudaSuccess)
        rc = tg_err_set(err, errlen, TG_EDEVICE,
                        "host tier copy of %d pages: %s", n,
                        cudaGetErrorString(e));
    if (ev != NULL)
        cudaEventDestroy(ev);
    return rc;
}

#endif /* TANGRAM_CUDA */
