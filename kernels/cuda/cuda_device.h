/*
 * cuda_device.h — probing for a CUDA device without requiring one.
 *
 * The CUDA runtime is linked statically and loads libcuda on first use, so
 * these calls are safe on machines without an NVIDIA driver: they report
 * TG_ENODEV instead of failing to start.
 */
#ifndef TG_CUDA_DEVICE_H
#define TG_CUDA_DEVICE_H

#include <stddef.h>

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

/* Counts the usable devices as tg_cuda_device_count does, but tells
 * "there is no device" from "the runtime cannot count them": returns 0
 * with *count >= 1; TG_ENODEV (*count = 0) when the machine has no
 * device: no NVIDIA kernel driver is loaded (/proc/driver/nvidia/version
 * is absent, whatever the runtime says), or the driver is loaded and the
 * runtime reports no device (cudaErrorNoDevice); TG_EDEVICE for any
 * other failure of a loaded driver (broken, too old, mismatched), with
 * the runtime's error in err. Test harnesses use it so that a broken
 * driver fails a GPU test instead of skipping it. Any thread. */
int tg_cuda_device_probe(int *count, char *err, size_t errlen);

/* Fills *info for device `dev`. Returns 0, TG_ENODEV or TG_EINVAL. */
int tg_cuda_device_query(int dev, struct tg_cuda_device_info *info);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_DEVICE_H */
