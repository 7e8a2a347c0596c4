// cuda_device.cu — device probe (see cuda_device.h).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.h"

#include <cstdio>
#include <cstring>

extern "C" int tg_cuda_device_count(int *count)
{
    *count = 0;
    int n = 0;
    cudaError_t st = cudaGetDeviceCount(&n);
    if (st != cudaSuccess) {
        (void)cudaGetLastError(); // clear the sticky "no driver" error
        return TG_ENODEV;
    }
    *count = n;
    return n > 0 ? 0 : TG_ENODEV;
}

extern "C" int tg_cuda_device_probe(int *count, char *err, size_t errlen)
{
    *count = 0;
    int n = 0;
    cudaError_t st = cudaGetDeviceCount(&n);
    if (st == cudaSuccess && n > 0) {
        *count = n;
        return 0;
    }
    (void)cudaGetLastError(); // clear a sticky error
    FILE *drv = fopen("/proc/driver/nvidia/version", "r");
    if (drv == NULL || st == cudaSuccess || st == cudaErrorNoDevice) {
        if (drv != NULL)
            fclose(drv);
        return tg_err_set(err, errlen, TG_ENODEV,
                          drv == NULL ? "no NVIDIA driver loaded "
                                        "(/proc/driver/nvidia/version is "
                                        "absent)"
                                      : "the NVIDIA driver reports no "
                                        "device");
    }
    fclose(drv);
    return tg_err_set(err, errlen, TG_EDEVICE,
                      "an NVIDIA driver is loaded but cudaGetDeviceCount "
                      "failed: %s (%s)",
                      cudaGetErrorName(st), cudaGetErrorString(st));
}

extern "C" int tg_cuda_device_query(int dev, struct tg_cuda_device_info *info)
{
    int n = 0;
    int rc = tg_cuda_device_count(&n);
    if (rc != 0)
        return rc;
    if (dev < 0 || dev >= n)
        return TG_EINVAL;
    cudaDeviceProp p;
    TG_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    memset(info, 0, sizeof(*info));
    snprintf(info->name, sizeof(info->name), "%s", p.name);
    info->sm_count = p.multiProcessorCount;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->total_mem = p.totalGlobalMem;
    return 0;
}
