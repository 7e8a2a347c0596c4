// nccl_comm.cu — the checked NCCL wrapper of the worker's tensor
// parallelism (see nccl_comm.h). Only NCCL's public API of the headers in
// the build (2.28) is used: ncclGetUniqueId, ncclCommInitRankConfig with a
// non-blocking config, ncclCommGetAsyncError, ncclAllReduce,
// ncclAllGather, ncclCommFinalize, ncclCommDestroy, ncclCommAbort,
// ncclGetErrorString, ncclGetLastError.
//
// Non-blocking protocol (NCCL user guide, "Non-blocking communicators"):
// any call may return ncclInProgress, after which the communicator's
// state must be polled with ncclCommGetAsyncError until it leaves
// ncclInProgress before the next NCCL call; a state other than
// ncclSuccess is an error, after which only ncclCommAbort is safe.
// wait_ready() is that poll, bounded by the communicator's timeout, with
// a short exponential back-off (10 us .. 1 ms) so a quick enqueue costs
// little and a slow init does not spin a core. Nothing here prints:
// detail goes to the caller's err buffer.
#include "kernels/cuda/nccl_comm.h"

#include "common/base/tg_err.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

static_assert(sizeof(ncclUniqueId) == TG_NCCL_ID_BYTES,
              "TG_NCCL_ID_BYTES must be sizeof(ncclUniqueId)");

struct tg_nccl {
    ncclComm_t comm; // NULL only while init builds it
    int rank, world, device;
    int timeout_ms;  // init timeout, also bounds later in-progress polls
    int failed;      // 0, or the sticky TG_E* code of the first failure
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// Polls comm until it leaves ncclInProgress, at most timeout_ms. Returns 0
// (ready), TG_EDEVICE (an error state, in *state) or TG_ETIMEDOUT.
static int wait_ready(ncclComm_t comm, int timeout_ms, ncclResult_t *state)
{
    const int64_t deadline = now_ms() + timeout_ms;
    long nap = 10;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) {
            *state = r;
            return TG_EDEVICE;
        }
        *state = st;
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress)
            return TG_EDEVICE;
        if (now_ms() >= deadline)
            return TG_ETIMEDOUT;
        sleep_us(nap);
        nap = nap < 1000 ? nap * 2 : 1000;
    }
}

// NCCL's own explanation of the last error ("" when it has none).
static const char *last_error(ncclComm_t comm)
{
    const char *s = ncclGetLastError(comm);
    return s != nullptr ? s : "";
}

// Marks c failed with `code` (the first failure sticks) and describes it.
static int fail(struct tg_nccl *c, int code, ncclResult_t r, const char *what,
                char *err, size_t errlen)
{
    if (c->failed == 0)
        c->failed = code;
    if (code == TG_ETIMEDOUT)
        return tg_err_set(err, errlen, code,
                          "nccl rank %d/%d: %s did not finish within %d ms",
                          c->rank, c->world, what, c->timeout_ms);
    const char *last = last_error(c->comm);
    return tg_err_set(err, errlen, code, "nccl rank %d/%d: %s: %s%s%s",
                      c->rank, c->world, what, ncclGetErrorString(r),
                      *last != '\0' ? ": " : "", last);
}

// The common tail of every enqueueing call: r is what NCCL returned.
static int finish_call(struct tg_nccl *c, ncclResult_t r, const char *what,
                       char *err, size_t errlen)
{
    if (r == ncclSuccess)
        return 0;
    if (r == ncclInProgress) {
        ncclResult_t st = ncclInProgress;
        int rc = wait_ready(c->comm, c->timeout_ms, &st);
        if (rc == 0)
            return 0;
        return fail(c, rc, st, what, err, errlen);
    }
    return fail(c, TG_EDEVICE, r, what, err, errlen);
}

static int usable(struct tg_nccl *c, const char *what, char *err,
                  size_t errlen)
{
    if (c == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "nccl: %s: no communicator",
                          what);
    if (c->failed != 0)
        return tg_err_set(err, errlen, c->failed,
                          "nccl rank %d/%d: %s: the communicator failed "
                          "earlier (%s)", c->rank, c->world, what,
                          tg_strerror(c->failed));
    return 0;
}

extern "C" int tg_nccl_unique_id(uint8_t id[TG_NCCL_ID_BYTES], char *err,
                                 size_t errlen)
{
    if (id == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "nccl: unique id: id NULL");
    ncclUniqueId uid;
    memset(&uid, 0, sizeof(uid));
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess)
        return tg_err_set(err, errlen, TG_EDEVICE,
                          "nccl: ncclGetUniqueId: %s: %s",
                          ncclGetErrorString(r), last_error(nullptr));
    memcpy(id, uid.internal, TG_NCCL_ID_BYTES);
    return 0;
}

extern "C" int tg_nccl_init(struct tg_nccl **out,
                            const uint8_t id[TG_NCCL_ID_BYTES], int rank,
                            int world, int device, int timeout_ms, char *err,
                            size_t errlen)
{
    if (out == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "nccl init: out NULL");
    *out = nullptr;
    if (id == nullptr || world < 1 || rank < 0 || rank >= world ||
        device < 0 || timeout_ms < 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "nccl init: id %s, rank %d of world %d, device %d, "
                          "timeout %d ms", id == nullptr ? "NULL" : "set",
                          rank, world, device, timeout_ms);
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev < 1) {
        (void)cudaGetLastError(); // clear the sticky "no driver" error
        return tg_err_set(err, errlen, TG_ENODEV, "nccl init: no CUDA device");
    }
    if (device >= n_dev)
        return tg_err_set(err, errlen, TG_ENODEV,
                          "nccl init: device %d, but only %d present", device,
                          n_dev);
    ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return tg_err_set(err, errlen, TG_EDEVICE,
                          "nccl init: cudaSetDevice(%d): %s", device,
                          cudaGetErrorString(ce));
    struct tg_nccl *c = static_cast<struct tg_nccl *>(calloc(1, sizeof(*c)));
    if (c == nullptr)
        return tg_err_set(err, errlen, TG_ENOMEM, "nccl init: out of memory");
    c->rank = rank;
    c->world = world;
    c->device = device;
    c->timeout_ms = timeout_ms;

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; // never block inside NCCL: we poll with a deadline
    ncclUniqueId uid;
    memcpy(uid.internal, id, TG_NCCL_ID_BYTES);
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, world, uid, rank, &cfg);
    int rc = 0;
    ncclResult_t st = r;
    if (r == ncclInProgress || r == ncclSuccess)
        rc = c->comm != nullptr ? wait_ready(c->comm, timeout_ms, &st)
                                : TG_EDEVICE;
    else
        rc = TG_EDEVICE;
    if (rc != 0) {
        if (rc == TG_ETIMEDOUT)
            tg_err_set(err, errlen, rc,
                       "nccl init: rank %d of %d on device %d: the other "
                       "ranks did not join within %d ms", rank, world, device,
                       timeout_ms);
        else
            tg_err_set(err, errlen, rc,
                       "nccl init: rank %d of %d on device %d: %s: %s", rank,
                       world, device, ncclGetErrorString(st),
                       last_error(c->comm));
        if (c->comm != nullptr)
            (void)ncclCommAbort(c->comm); // also stops a pending init
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

extern "C" int tg_nccl_allreduce_sum(struct tg_nccl *c, void *buf,
                                     size_t count, int bf16, void *stream,
                                     char *err, size_t errlen)
{
    int rc = usable(c, "all-reduce", err, errlen);
    if (rc != 0)
        return rc;
    if (count == 0)
        return 0;
    if (buf == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL, "nccl all-reduce: buf NULL");
    ncclResult_t r = ncclAllReduce(buf, buf, count,
                                   bf16 ? ncclBfloat16 : ncclFloat32, ncclSum,
                                   c->comm, (cudaStream_t)stream);
    return finish_call(c, r, "all-reduce", err, errlen);
}

extern "C" int tg_nccl_allgather(struct tg_nccl *c, const void *send,
                                 void *recv, size_t count_per_rank, int bf16,
                                 void *stream, char *err, size_t errlen)
{
    int rc = usable(c, "all-gather", err, errlen);
    if (rc != 0)
        return rc;
    if (count_per_rank == 0)
        return 0;
    if (send == nullptr || recv == nullptr)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "nccl all-gather: send or recv NULL");
    ncclResult_t r = ncclAllGather(send, recv, count_per_rank,
                                   bf16 ? ncclBfloat16 : ncclFloat32, c->comm,
                                   (cudaStream_t)stream);
    return finish_call(c, r, "all-gather", err, errlen);
}

extern "C" int tg_nccl_check(struct tg_nccl *c, char *err, size_t errlen)
{
    int rc = usable(c, "check", err, errlen);
    if (rc != 0)
        return rc;
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
    if (r != ncclSuccess)
        return fail(c, TG_EDEVICE, r, "async error query", err, errlen);
    // ncclInProgress cannot persist here (every call waits it out); treat
    // it as healthy rather than block.
    if (st == ncclSuccess || st == ncclInProgress)
        return 0;
    return fail(c, TG_EDEVICE, st, "asynchronous error", err, errlen);
}

extern "C" int tg_nccl_rank(const struct tg_nccl *c)
{
    return c != nullptr ? c->rank : -1;
}

extern "C" int tg_nccl_world(const struct tg_nccl *c)
{
    return c != nullptr ? c->world : -1;
}

extern "C" void tg_nccl_abort(struct tg_nccl *c)
{
    if (c == nullptr || c->comm == nullptr)
        return;
    (void)cudaSetDevice(c->device);
    (void)ncclCommAbort(c->comm);
    c->comm = nullptr;
    if (c->failed == 0)
        c->failed = TG_ETIMEDOUT;
}

extern "C" void tg_nccl_free(struct tg_nccl *c)
{
    if (c == nullptr)
        return;
    if (c->comm != nullptr) {
        (void)cudaSetDevice(c->device);
        bool abort_it = c->failed != 0;
        if (!abort_it) {
            // Orderly: flush what is enqueued, then release. A finalize
            // that cannot finish (a dead peer) falls back to the abort.
            ncclResult_t r = ncclCommFinalize(c->comm);
            ncclResult_t st = r;
            if (r == ncclInProgress)
                abort_it = wait_ready(c->comm, c->timeout_ms, &st) != 0;
            else
                abort_it = r != ncclSuccess;
            if (!abort_it)
                (void)ncclCommDestroy(c->comm); // nothing left to report to
        }
        if (abort_it)
            (void)ncclCommAbort(c->comm);
    }
    free(c);
}
