/*
 * tt_cuda.h — device helpers shared by the CUDA tests (tests/gpu) and the
 * CUDA benchmarks (tests/bench/bench_cuda_*.c):
 *  - whether there is a device to run on (the "skipped" preamble): a
 *    test skips only when the machine has no device, and never under
 *    TANGRAM_REQUIRE_GPU=1;
 *  - for cmocka tests: device buffers and copies whose failures fail the
 *    current test with the CUDA error's text;
 *  - for benchmark programs: the same, plus a device query, a CUDA event
 *    timer and the device-to-device copy bandwidth (the usual ceiling of
 *    a memory-bound kernel), where a failure prints "<prog>: <what>:
 *    <CUDA error>" on stderr and exits 1 — a benchmark has nothing to
 *    report after a failed CUDA call.
 * Host-only helpers (the random stream, bf16 data, clocks, medians, flags)
 * are in tt_support.h.
 *
 * Everything but tt_cuda_skip / tt_cuda_required exists only in a CUDA
 * build (TANGRAM_CUDA); the header may be included by any build (a CUDA
 * test's main built without CUDA returns tt_cuda_skip("built without
 * CUDA")). Test code only; one thread, the current
 * device (device 0 unless the caller chose another).
 */
#ifndef TT_CUDA_H
#define TT_CUDA_H

/* ---- skipping: only for want of a device -------------------------------- */

/* 1 when the environment has TANGRAM_REQUIRE_GPU=1 (the GPU round sets
 * it): a GPU test that cannot reach a device then fails instead of
 * skipping. */
int tt_cuda_required(void);

/* The exit code of a GPU test (or a CUDA benchmark's --quick run) that
 * has no device to run on, `why` saying what is missing ("built without
 * CUDA", "no CUDA device"): prints "skipped: <why>" and returns 77, or,
 * under TANGRAM_REQUIRE_GPU=1, prints "FAIL: TANGRAM_REQUIRE_GPU=1 but
 * <why>" and returns 1. A build without CUDA on a machine whose NVIDIA
 * driver is loaded fails too (the test could have run). Any build. */
int tt_cuda_skip(const char *why);

#ifdef TANGRAM_CUDA
#include <stddef.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.h"

/* Returns 1 when the CUDA runtime sees a device. Without one (no NVIDIA
 * driver loaded, or the driver reports no device: tg_cuda_device_probe's
 * TG_ENODEV) it prints skip_msg (when not NULL) and a newline on stdout
 * and returns 0, and the caller exits with its skip code (77 for a ctest
 * test, 0 for a benchmark's --quick run). A driver that is loaded but
 * fails (TG_EDEVICE), or no device under TANGRAM_REQUIRE_GPU=1, is no
 * reason to skip: it prints "FAIL: ..." with the runtime's error and
 * exits the program with status 1. */
int tt_cuda_have_device(const char *skip_msg);

struct CMUnitTest; /* cmocka.h */

/* The main of a CUDA test: runs the cmocka group host_name of the n_host
 * tests that need no device (argument checks; none when n_host is 0)
 * on any machine, then, when tt_cuda_have_device(skip_msg) finds a
 * device, the group dev_name of the n_dev device tests. Returns the exit
 * code: the failure count of a failing group, 77 (skipped) without a
 * device, else 0. */
int tt_cuda_run_tests(const char *host_name, const struct CMUnitTest *host,
                      size_t n_host, const char *skip_msg,
                      const char *dev_name, const struct CMUnitTest *dev,
                      size_t n_dev);

/* ---- cmocka tests: a failed CUDA call fails the current test ------------ */

/* Returns a new device buffer of `bytes` (16 bytes when 0, so an empty
 * input still has a distinct, aligned address a kernel's vector load may
 * touch). The caller frees it with cudaFree. */
void *tt_cuda_alloc(size_t bytes);

/* Returns a new device buffer (as tt_cuda_alloc) holding a copy of the
 * host bytes src[0..bytes). The caller frees it with cudaFree. */
void *tt_cuda_upload(const void *src, size_t bytes);

/* Copies bytes from host src to device dst (synchronous; nothing when
 * bytes is 0). */
void tt_cuda_to_dev(void *dst, const void *src, size_t bytes);

/* Copies bytes from device src to host dst (synchronous on the default
 * stream; nothing when bytes is 0). */
void tt_cuda_to_host(void *dst, const void *src, size_t bytes);

/* Waits for the whole device first (so the error of a kernel on any
 * stream surfaces here, named), then copies as tt_cuda_to_host. */
void tt_cuda_sync_to_host(void *dst, const void *src, size_t bytes);

/* ---- benchmark programs: a failed CUDA call ends the program ------------ */

/* Prints "<prog>: <what>: <cudaGetErrorString(e)>" on stderr and exits 1. */
_Noreturn void tt_cuda_die(const char *prog, const char *what,
                           cudaError_t e);

/* Evaluates the CUDA runtime call `expr` once; unless it returns
 * cudaSuccess, ends the program through tt_cuda_die with the call's text.
 * A benchmark defines its own one-line CK(expr) over this. */
#define TT_CUDA_CK(prog, expr)                                            \
    do {                                                                  \
        cudaError_t tt_ck_err_ = (expr);                                  \
        if (tt_ck_err_ != cudaSuccess)                                    \
            tt_cuda_die((prog), #expr, tt_ck_err_);                       \
    } while (0)

/* Returns 1 with *info describing device 0; 0 after printing "skipped: no
 * CUDA device" on stdout when there is none (the benchmark then exits 77,
 * so its --quick test reports skipped on machines without a GPU). A device that is
 * there but cannot be queried prints "<prog>: device query failed" and
 * exits 1. */
int tt_cuda_bench_device(const char *prog, struct tg_cuda_device_info *info);

/* Returns a new device buffer of `bytes` (16 when 0). The caller frees it
 * with cudaFree. */
void *tt_cuda_bench_alloc(const char *prog, size_t bytes);

/* Returns a new device buffer holding a copy of host src[0..bytes). The
 * caller frees it with cudaFree. */
void *tt_cuda_bench_upload(const char *prog, const void *src, size_t bytes);

/* Device-to-device cudaMemcpy bandwidth in bytes per second, counting the
 * bytes read and the bytes written (2 * bytes per copy): `reps` copies of
 * a `bytes` buffer on the default stream after one untimed copy, between
 * two CUDA events. The usual ceiling a memory-bound kernel is held
 * against. Allocates 2 * bytes of device memory for the measurement. */
double tt_cuda_copy_bandwidth(const char *prog, size_t bytes, int reps);

/* A pair of CUDA events around work enqueued on one stream. */
struct tt_cuda_timer {
    const char *prog;  /* names the program in failure messages */
    cudaEvent_t start; /* recorded by tt_cuda_timer_start */
    cudaEvent_t stop;  /* recorded by tt_cuda_timer_ms */
};

/* Creates the two events. tt_cuda_timer_free releases them. */
void tt_cuda_timer_init(struct tt_cuda_timer *t, const char *prog);

/* Records the start event on `stream` (NULL: the default stream). */
void tt_cuda_timer_start(struct tt_cuda_timer *t, cudaStream_t stream);

/* Records the stop event on `stream`, waits for it and returns the
 * milliseconds between the two events (the event timer's resolution is
 * about half a microsecond). */
double tt_cuda_timer_ms(struct tt_cuda_timer *t, cudaStream_t stream);

/* Destroys the two events. */
void tt_cuda_timer_free(struct tt_cuda_timer *t);

#endif /* TANGRAM_CUDA */
#endif /* TT_CUDA_H */
