/*
 * gw_beat.h — a worker's liveness: the heartbeat thread that reports the
 * progress marks of its compute thread (gpu_worker/step/gw_progress.h) to
 * the router (proto/worker.proto, Heartbeat; DESIGN.md §2).
 *
 * Why a thread of its own. A step may take any time: a long prefill chunk
 * on the CPU backend, the first steps of a GPU (module loading, graph
 * capture, GEMM plans). Heartbeats sent by the main thread between steps
 * made the router take a busy worker for a dead one. The beat thread owns
 * nothing but its own ZeroMQ DEALER socket (ZeroMQ sockets are not
 * thread-safe, so it never touches the main link's), whose routing id is
 * "beat-<rank>", connected to the router's endpoint; it reads the progress
 * marks, which the compute thread writes as C11 atomics. Every period it
 * sends a Heartbeat with the worker's pid, the step in flight and how long
 * the compute thread has shown no progress, so the router tells apart
 *   - a process that is stopped (SIGSTOP), dead or cut off: no beat comes;
 *   - a compute thread wedged inside one call: beats whose stalled_ms grows
 *     past the router's stall deadline;
 *   - a long step: beats whose stalled_ms stays within one backend call.
 * Sends never block (ZMQ_DONTWAIT, a small high-water mark): a beat that
 * cannot go is dropped and the next one carries the current state.
 *
 * The marks are the step loop's (gpu_worker/step/gw_progress.h). Threads:
 * gw_beat_start and gw_beat_stop by the thread that owns the
 * worker's link, which must stop the beat before it terminates the ZeroMQ
 * context.
 */
#ifndef GW_BEAT_H
#define GW_BEAT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu_worker/step/gw_progress.h"

/* The heartbeat thread. Fields are private except the counters, which may
 * be read after gw_beat_stop. */
struct gw_beat {
    pthread_t thread;
    void *sock;                    /* DEALER "beat-<rank>", the thread's */
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* signalled by gw_beat_stop */
    int running, stop;
    int rank, period_ms;
    uint32_t pid;
    const struct gw_progress *prog; /* borrowed */
    uint64_t seq;
    uint64_t n_sent, n_dropped;    /* readable after gw_beat_stop */
};

/* Opens the beat socket in ZeroMQ context zctx (borrowed; it must outlive
 * the beat), connects it to `endpoint` (the router's, as the main link)
 * and starts the thread, which sends a Heartbeat at once and then every
 * period_ms (>= 1) carrying rank, this process's pid and prog's state.
 * Returns 0, TG_EINVAL (bad arguments) or TG_EIO (socket or thread),
 * with the reason in err; on failure nothing is left running and
 * gw_beat_stop is still safe. */
int gw_beat_start(struct gw_beat *b, void *zctx, const char *endpoint,
                  int rank, int period_ms, const struct gw_progress *prog,
                  char *err, size_t errlen);

/* Stops and joins the thread and closes its socket. Safe on a zeroed
 * beat, a failed start, and twice. */
void gw_beat_stop(struct gw_beat *b);

#endif /* GW_BEAT_H */
