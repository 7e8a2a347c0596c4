// logit_mask.cu — token masks applied to logits rows (see logit_mask.h).
//
// Grid (blocks over the vocabulary, masked rows): each thread reads one
// mask word per 32 ids through a coalesced stride of the row; a fully
// allowed word (the common case inside free text) costs one load.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/logit_mask.h"

#include <cmath>

#define MASK_THREADS 256
#define MASK_MAX_BLOCKS_X 64 // per row: enough to fill the device with a batch

static __global__ void logit_mask_kernel(float *__restrict__ logits, int V,
                                         const int32_t *__restrict__ rows,
                                         const uint32_t *__restrict__ masks,
                                         int words)
{
    const uint32_t *m = masks + (size_t)blockIdx.y * words;
    float *x = logits + (size_t)rows[blockIdx.y] * V;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < V;
         j += gridDim.x * blockDim.x)
        if (!((m[j >> 5] >> (j & 31)) & 1u))
            x[j] = -INFINITY;
}

static int launch_logit_mask(float *logits, int V, const int32_t *rows,
                             const uint32_t *masks, int words, int n,
                             cudaStream_t stream)
{
    int bx = (V + MASK_THREADS - 1) / MASK_THREADS;
    if (bx > MASK_MAX_BLOCKS_X)
        bx = MASK_MAX_BLOCKS_X;
    dim3 grid((unsigned)bx, (unsigned)n);
    logit_mask_kernel<<<grid, MASK_THREADS, 0, stream>>>(logits, V, rows, masks,
                                                         words);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_logit_mask_apply(float *logits, int vocab,
                                        const int32_t *rows,
                                        const uint32_t *masks, int words, int n,
                                        void *stream)
{
    if (n < 0 || vocab < 1 || words < (vocab + 31) / 32 || n > 65535)
        return TG_EINVAL;
    if (n == 0)
        return 0;
    if (logits == nullptr || rows == nullptr || masks == nullptr)
        return TG_EINVAL;
    return launch_logit_mask(logits, vocab, rows, masks, words, n,
                             (cudaStream_t)stream);
}
