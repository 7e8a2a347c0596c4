/* tt_cuda.c — device helpers of the CUDA tests and benchmarks (see
 * tt_cuda.h). Compiled in every build; without CUDA it holds only the
 * skip decision (tt_cuda_skip). */
#include "tests/support/tt_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tt_cuda_required(void)
{
    const char *v = getenv("TANGRAM_REQUIRE_GPU");
    return v != NULL && strcmp(v, "1") == 0;
}

int tt_cuda_skip(const char *why)
{
    if (tt_cuda_required()) {
        printf("FAIL: TANGRAM_REQUIRE_GPU=1 but %s\n", why);
        return 1;
    }
#ifndef TANGRAM_CUDA
    /* A machine with a device whose build left CUDA out (no nvcc found at
     * configure time) would skip every GPU test for want of a build. */
    FILE *drv = fopen("/proc/driver/nvidia/version", "r");
    if (drv != NULL) {
        fclose(drv);
        printf("FAIL: an NVIDIA driver is loaded but %s (configure with "
               "nvcc on PATH)\n", why);
        return 1;
    }
#endif
    printf("skipped: %s\n", why);
    return 77;
}

#ifdef TANGRAM_CUDA
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/tg_err.h"

/* The size actually requested for a buffer of `bytes`: see tt_cuda_alloc. */
static size_t alloc_size(size_t bytes)
{
    return bytes > 0 ? bytes : 16;
}

int tt_cuda_have_device(const char *skip_msg)
{
    int n = 0;
    char why[512] = "";
    int rc = tg_cuda_device_probe(&n, why, sizeof(why));
    if (rc == 0)
        return 1;
    if (rc != TG_ENODEV) {
        printf("FAIL: the CUDA runtime cannot count the devices: %s\n", why);
        fflush(stdout);
        exit(1);
    }
    if (tt_cuda_required()) {
        printf("FAIL: TANGRAM_REQUIRE_GPU=1 but no CUDA device: %s\n", why);
        fflush(stdout);
        exit(1);
    }
    if (skip_msg != NULL)
        printf("%s (%s)\n", skip_msg, why);
    return 0;
}

/* ---- cmocka tests ------------------------------------------------------- */

int tt_cuda_run_tests(const char *host_name, const struct CMUnitTest *host,
                      size_t n_host, const char *skip_msg,
                      const char *dev_name, const struct CMUnitTest *dev,
                      size_t n_dev)
{
    /* _cmocka_run_group_tests is what cmocka_run_group_tests_name expands
     * to; the macro needs the array itself (for its length), this takes a
     * pointer and a count. */
    if (n_host > 0) {
        int rc = _cmocka_run_group_tests(host_name, host, n_host, NULL, NULL);
        if (rc != 0)
            return rc;
    }
    if (!tt_cuda_have_device(skip_msg))
        return 77;
    return _cmocka_run_group_tests(dev_name, dev, n_dev, NULL, NULL);
}

/* Fails the current test when a CUDA call returned e, naming the call. */
static void check(cudaError_t e, const char *what, size_t bytes)
{
    if (e != cudaSuccess)
        fail_msg("%s (%zu bytes): %s", what, bytes, cudaGetErrorString(e));
}

void *tt_cuda_alloc(size_t bytes)
{
    void *p = NULL;
    check(cudaMalloc(&p, alloc_size(bytes)), "cudaMalloc", bytes);
    return p;
}

void *tt_cuda_upload(const void *src, size_t bytes)
{
    void *d = tt_cuda_alloc(bytes);
    tt_cuda_to_dev(d, src, bytes);
    return d;
}

void tt_cuda_to_dev(void *dst, const void *src, size_t bytes)
{
    if (bytes > 0)
        check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
              "cudaMemcpy to the device", bytes);
}

void tt_cuda_to_host(void *dst, const void *src, size_t bytes)
{
    if (bytes > 0)
        check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost),
              "cudaMemcpy to the host", bytes);
}

void tt_cuda_sync_to_host(void *dst, const void *src, size_t bytes)
{
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before a copy",
          bytes);
    tt_cuda_to_host(dst, src, bytes);
}

/* ---- benchmark programs ------------------------------------------------- */

void tt_cuda_die(const char *prog, const char *what, cudaError_t e)
{
    fprintf(stderr, "%s: %s: %s\n", prog, what, cudaGetErrorString(e));
    exit(1);
}

int tt_cuda_bench_device(const char *prog, struct tg_cuda_device_info *info)
{
    if (!tt_cuda_have_device("skipped: no CUDA device"))
        return 0;
    if (tg_cuda_device_query(0, info) != 0) {
        fprintf(stderr, "%s: device query failed\n", prog);
        exit(1);
    }
    return 1;
}

void *tt_cuda_bench_alloc(const char *prog, size_t bytes)
{
    void *p = NULL;
    TT_CUDA_CK(prog, cudaMalloc(&p, alloc_size(bytes)));
    return p;
}

void *tt_cuda_bench_upload(const char *prog, const void *src, size_t bytes)
{
    void *d = tt_cuda_bench_alloc(prog, bytes);
    if (bytes > 0)
        TT_CUDA_CK(prog, cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

double tt_cuda_copy_bandwidth(const char *prog, size_t bytes, int reps)
{
    void *a = tt_cuda_bench_alloc(prog, bytes);
    void *b = tt_cuda_bench_alloc(prog, bytes);
    TT_CUDA_CK(prog, cudaMemset(a, 1, bytes));
    /* One untimed copy: first-touch and clock ramp-up stay out. */
    TT_CUDA_CK(prog, cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    struct tt_cuda_timer t;
    tt_cuda_timer_init(&t, prog);
    tt_cuda_timer_start(&t, NULL);
    for (int i = 0; i < reps; i++)
        TT_CUDA_CK(prog, cudaMemcpyAsync(b, a, bytes,
                                         cudaMemcpyDeviceToDevice, NULL));
    double ms = tt_cuda_timer_ms(&t, NULL);
    tt_cuda_timer_free(&t);
    TT_CUDA_CK(prog, cudaFree(a));
    TT_CUDA_CK(prog, cudaFree(b));
    return 2.0 * (double)bytes * reps / (ms * 1e-3); /* read + write */
}

void tt_cuda_timer_init(struct tt_cuda_timer *t, const char *prog)
{
    t->prog = prog;
    TT_CUDA_CK(prog, cudaEventCreate(&t->start));
    TT_CUDA_CK(prog, cudaEventCreate(&t->stop));
}

void tt_cuda_timer_start(struct tt_cuda_timer *t, cudaStream_t stream)
{
    TT_CUDA_CK(t->prog, cudaEventRecord(t->start, stream));
}

double tt_cuda_timer_ms(struct tt_cuda_timer *t, cudaStream_t stream)
{
    float ms = 0.0f;
    TT_CUDA_CK(t->prog, cudaEventRecord(t->stop, stream));
    TT_CUDA_CK(t->prog, cudaEventSynchronize(t->stop));
    TT_CUDA_CK(t->prog, cudaEventElapsedTime(&ms, t->start, t->stop));
    return (double)ms;
}

void tt_cuda_timer_free(struct tt_cuda_timer *t)
{
    TT_CUDA_CK(t->prog, cudaEventDestroy(t->start));
    TT_CUDA_CK(t->prog, cudaEventDestroy(t->stop));
}
#endif /* TANGRAM_CUDA */
