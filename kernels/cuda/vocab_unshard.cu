// vocab_unshard.cu — vocab-parallel logits back in model order (see
// vocab_unshard.h). Three layers: kernel, launcher, checked entry.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/vocab_unshard.h"

#include <cstdint>

namespace {
constexpr int kThreads = 256;
}

// One thread per output element e = i * V + c (grid-stride): c belongs to
// rank r = c / Vp at column j = c % Vp of that rank's slice.
static __global__ void __launch_bounds__(kThreads)
vocab_unshard_kernel(const float *__restrict__ gathered, int rows, int Vp,
                     int V, float *__restrict__ out)
{
    const int64_t total = (int64_t)rows * V;
    for (int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * kThreads) {
        const int64_t i = e / V, c = e % V;
        const int64_t r = c / Vp, j = c % Vp;
        out[e] = gathered[(r * rows + i) * Vp + j];
    }
}

static int launch_unshard(const float *gathered, int rows, int Vp, int V,
                          float *out, cudaStream_t stream)
{
    const int64_t total = (int64_t)rows * V;
    int64_t blocks = (total + kThreads - 1) / kThreads;
    if (blocks > 65535 * 8) // grid-stride covers the rest
        blocks = 65535 * 8;
    vocab_unshard_kernel<<<(unsigned)blocks, kThreads, 0, stream>>>(
        gathered, rows, Vp, V, out);
    TG_CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int tg_cuda_vocab_unshard(const float *gathered, int T, int rows,
                                     int Vp, int V, float *out, void *stream)
{
    if (T < 1 || rows < 0 || Vp < 1 || V < 1 || (int64_t)T * Vp < V ||
        (int64_t)rows * V >= ((int64_t)1 << 31))
        return TG_EINVAL;
    if (rows == 0)
        return 0;
    if (gathered == nullptr || out == nullptr)
        return TG_EINVAL;
    const char *g = (const char *)gathered, *o = (const char *)out;
    size_t gb = (size_t)T * rows * Vp * sizeof(float);
    size_t ob = (size_t)rows * V * sizeof(float);
    if (g < o + ob && o < g + gb)
        return TG_EINVAL; // overlapping buffers
    return launch_unshard(gathered, rows, Vp, V, out, (cudaStream_t)stream);
}
