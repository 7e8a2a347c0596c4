/*
 * nccl_comm.h — a thin, checked wrapper over NCCL for the worker's tensor
 * parallelism (DESIGN.md §4.7: an all-reduce after the row-split o_proj and
 * down projections; all-gather for column-split outputs), prefix tg_nccl_.
 *
 * Start-up: rank 0 calls tg_nccl_unique_id and ships the TG_NCCL_ID_BYTES
 * bytes to the other ranks over the worker link; every rank then calls
 * tg_nccl_init with the same id. The communicator is NON-blocking
 * (ncclConfig_t.blocking = 0): initialisation proceeds in the background
 * while tg_nccl_init polls ncclCommGetAsyncError, so a peer that never
 * arrives costs at most timeout_ms and then an ncclCommAbort and
 * TG_ETIMEDOUT, never a hung worker. world == 1 runs through the same
 * code (a one-rank NCCL communicator; its collectives are copies).
 *
 * Step path: tg_nccl_allreduce_sum / tg_nccl_allgather only enqueue the
 * collective on the caller's stream and return; they neither allocate nor
 * synchronise the device, so they can be captured in a CUDA graph
 * (NCCL >= 2.9 supports stream capture; the build's headers are 2.28).
 * Capture with cudaStreamCaptureModeThreadLocal (or Relaxed): NCCL's own
 * helper threads may call the CUDA runtime while the capture is open,
 * which the global mode would refuse; run one eager collective of each
 * shape before capturing, so NCCL's lazy connection setup happens outside.
 * When NCCL answers ncclInProgress (the non-blocking mode may finish
 * enqueuing in the background), the call polls the communicator on the
 * host until it is ready (bounded by the init timeout), as NCCL requires
 * before the next call. tg_nccl_check is the cheap asynchronous-error poll
 * for the worker's step loop. After any failure the communicator is
 * "failed": every later call returns that error and tg_nccl_free aborts
 * it instead of destroying it.
 *
 * Errors: TG_EINVAL (bad arguments, checked before NCCL or CUDA is
 * touched), TG_ENODEV (no such CUDA device), TG_ENOMEM, TG_EDEVICE (NCCL or
 * CUDA failure, or a peer failed), TG_ETIMEDOUT. Detail goes to err.
 * Thread: one thread at a time per communicator; tg_nccl_init and
 * tg_nccl_free make `device` the calling thread's current device (NCCL
 * binds a communicator to the device current at creation). The functions
 * exist only in CUDA builds (TANGRAM_CUDA); the header is plain C.
 */
#ifndef TG_CUDA_NCCL_COMM_H
#define TG_CUDA_NCCL_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* sizeof(ncclUniqueId); nccl_comm.cu static-asserts it. */
#define TG_NCCL_ID_BYTES 128

struct tg_nccl; /* opaque: the communicator and its failure state */

/* Generates a fresh communicator id into id[0 .. TG_NCCL_ID_BYTES)
 * (ncclGetUniqueId; it also starts NCCL's bootstrap root in this process,
 * which must stay alive until every rank has initialised). Called by rank
 * 0 only. Needs no device. Returns 0, TG_EINVAL (id NULL) or TG_EDEVICE. */
int tg_nccl_unique_id(uint8_t id[TG_NCCL_ID_BYTES], char *err, size_t errlen);

/* Creates this rank's communicator of `world` ranks from `id` on CUDA
 * device `device`, waiting at most timeout_ms (> 0) for the other ranks.
 * On success *out owns the communicator (tg_nccl_free). On failure *out is
 * NULL and everything is released: TG_EINVAL (out or id NULL, world < 1,
 * rank outside [0, world), device < 0, timeout_ms < 1), TG_ENODEV,
 * TG_ENOMEM, TG_EDEVICE (NCCL reported an error) or TG_ETIMEDOUT (a peer
 * did not arrive in time; the partial communicator was aborted). */
int tg_nccl_init(struct tg_nccl **out, const uint8_t id[TG_NCCL_ID_BYTES],
                 int rank, int world, int device, int timeout_ms, char *err,
                 size_t errlen);

/* Enqueues an in-place sum all-reduce of count elements at device buffer
 * buf (bf16 != 0: bf16, else fp32) on `stream` (cudaStream_t, NULL = the
 * default stream). count == 0 enqueues nothing. Returns 0, TG_EINVAL
 * (nothing enqueued), TG_EDEVICE or TG_ETIMEDOUT (the communicator is then
 * failed). Graph-capturable. */
int tg_nccl_allreduce_sum(struct tg_nccl *c, void *buf, size_t count,
                          int bf16, void *stream, char *err, size_t errlen);

/* Enqueues an all-gather: recv (device, world * count_per_rank elements)
 * receives every rank's send (device, count_per_rank elements) in rank
 * order; in place when send == recv + rank * count_per_rank elements.
 * bf16 != 0: bf16, else fp32. count_per_rank == 0 enqueues nothing.
 * Returns as tg_nccl_allreduce_sum. Graph-capturable. */
int tg_nccl_allgather(struct tg_nccl *c, const void *send, void *recv,
                      size_t count_per_rank, int bf16, void *stream, char *err,
                      size_t errlen);

/* Polls the communicator for an asynchronous error without blocking (for
 * the worker's step loop, e.g. while a step is overdue). Returns 0 when
 * healthy, else the failure: TG_EDEVICE (NCCL reported an error, e.g. a
 * peer failed or a remote connection broke) or TG_ETIMEDOUT (an earlier
 * call timed out); TG_EINVAL for c NULL. */
int tg_nccl_check(struct tg_nccl *c, char *err, size_t errlen);

/* Aborts the communicator now (ncclCommAbort) and marks it failed with
 * TG_ETIMEDOUT: NCCL kernels still spinning on a dead or out-of-step peer
 * return, so a stream waiting on them drains and the process can exit.
 * Every later call fails; tg_nccl_free then only releases memory. Safe on
 * NULL and on an already aborted communicator. */
void tg_nccl_abort(struct tg_nccl *c);

/* The communicator's rank and world size (-1 for c NULL). */
int tg_nccl_rank(const struct tg_nccl *c);
int tg_nccl_world(const struct tg_nccl *c);

/* Releases the communicator: ncclCommAbort when it failed (or when the
 * orderly ncclCommFinalize does not finish within the init timeout, as
 * when a peer died), else ncclCommFinalize + ncclCommDestroy, which wait
 * for the collectives already enqueued. Safe on NULL. */
void tg_nccl_free(struct tg_nccl *c);

#ifdef __cplusplus
}
#endif
#endif /* TG_CUDA_NCCL_COMM_H */
