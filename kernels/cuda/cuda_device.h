/*
 * cuda_device.h — probing for a CUDA device without requiring one.
 *
 * The CUDA runtime is linked statically and loads libcuda on first use, so
 * these calls are safe on machines without an NVIDIA driver: they report
 * TG_ENODEV instead of failing to start.
 */
#ifndef TG_CUDA_DEVICE_H
#define TG_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

struct tg_cuda_device_info {
    char name[256];
    int sm_count;           /* streaming multiprocessors */
    int cc_major, cc_minor; /* compute capability */
    unsigned long long total_mem; /* bytes */
};

/* Stores the number of usable devices in *count. Returns 0, or TG_ENODEV
 * (with *count = 0) when there is no driver or no device. Any thread. */
int tg_cuda_device_count(int *count);

/* Fills *info for device `dev`. Returns 0, TG_ENODEV or TG_EINVAL. */
int tg_cuda_device_query(int dev, struct tg_cuda_device_info *info);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_DEVICE_H */
