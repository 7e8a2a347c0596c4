/*
 * gw_host_tier.h — one worker rank's host tier of stored conversations
 * (DESIGN.md §4.10): the bytes of the pages the router moved off the
 * device, and the copies between them and the device pool, made beside
 * the step loop.
 *
 * The router owns the directory (which pages hold what, which are free);
 * the worker owns a slab of n_pages host pages, each of the backend's page
 * bytes, and a FIFO of copy ops (proto TierOp): an offload copies pool
 * pages into host pages, a restore host pages into pool pages. One copy
 * thread takes the ops strictly in the order they were submitted and runs
 * each through the backend (gw_backend.h tier_copy: memcpy on the CPU,
 * cudaMemcpyAsync on a copy stream on CUDA), so the step loop never waits
 * for a copy. Two orders make that safe without any lock on the pool:
 *   - every copy follows the steps submitted before it (the fence the
 *     main thread takes at submit: nothing on the CPU, where a step has
 *     completed before the next message is read; an event on the CUDA
 *     compute stream);
 *   - the router never lets a step touch a device page an op holds before
 *     every rank reported that op, and host pages are only touched by ops,
 *     which run in order.
 * A finished op (copied, or refused: ids out of range, no tier) goes to a
 * done list; an eventfd is readable while that list is not empty, so the
 * worker's poll loop wakes at once and reports it (TierReport).
 *
 * Threads: init, submit, take and free on the worker's main thread; the
 * copy thread only inside this module and the backend's tier_copy.
 */
#ifndef GW_HOST_TIER_H
#define GW_HOST_TIER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu_worker/backend/gw_backend.h"

#define GW_TIER_ERROR_MAX 160 /* bytes of a failed op's reason */

/* A finished op, as the report carries it. */
struct gw_tier_done {
    uint64_t id;
    int ok;
    char error[GW_TIER_ERROR_MAX]; /* "" when ok */
};

struct gw_tier_job; /* private: one queued op */

struct gw_host_tier {
    struct gw_backend *be;       /* borrowed, outlives the tier */
    int32_t n_pages;             /* host pages; 0: no tier */
    int64_t page_bytes;          /* the backend's */
    void *base;                  /* (n_pages, page_bytes) from tier_alloc */
    int efd;                     /* eventfd, readable while ops are done and
                                    not taken; -1 before init */
    pthread_t thread;
    int running;                 /* the copy thread was started */
    int busy;                    /* it is copying a job now */
    pthread_mutex_t mu;          /* guards the lists and stop */
    pthread_cond_t cv;           /* signals queued work or stop */
    int sync_init;               /* mu and cv exist */
    struct gw_tier_job *head, *tail;           /* queued, oldest first */
    struct gw_tier_job *done_head, *done_tail; /* finished, in order */
    int stop;
    int64_t n_copied;            /* pages copied (both directions) */
};

/* Sets up the tier of `bytes` (--kv-host-memory; 0: none, everything else
 * still works and every op is refused) over backend `be`: floor(bytes /
 * page bytes) pages, checked against the host's available memory (fail
 * fast, tg_hostmem.h), the slab from the backend, the eventfd and the
 * copy thread. Returns 0, or TG_EINVAL (less than one page, more than
 * INT32_MAX pages), TG_ENOMEM (does not fit the host, naming the numbers),
 * TG_EDEVICE or TG_EIO; *t is freed then. The caller owns t. */
int gw_host_tier_init(struct gw_host_tier *t, struct gw_backend *be,
                      uint64_t bytes, char *err, size_t errlen);

/* Stops the copy thread after the copy it is running (queued ops are
 * dropped: the process is going away, and the router learns that from
 * the worker's death) and frees everything. Safe on a zeroed (never
 * initialised) or failed tier, and twice. */
void gw_host_tier_free(struct gw_host_tier *t);

/* Queues op `id`: to_host copies pool pages dev[i] into host pages
 * host[i], else back, for i < n (n_dev and n_host must be equal). An op
 * that cannot run (no tier, lengths differ, an id outside the pool or the
 * tier, the backend's fence failed) is queued already failed, so reports
 * keep submission order. Main thread. Returns 0, or TG_ENOMEM (nothing
 * queued: the caller reports the op failed itself). */
int gw_host_tier_submit(struct gw_host_tier *t, uint64_t id, int to_host,
                        const uint32_t *dev, size_t n_dev,
                        const uint32_t *host, size_t n_host);

/* The eventfd to poll (readable while finished ops wait), or -1. */
int gw_host_tier_fd(const struct gw_host_tier *t);

/* Moves up to `cap` finished ops, oldest first, into out and returns how
 * many; the eventfd stays readable while more remain. Main thread. */
size_t gw_host_tier_take(struct gw_host_tier *t, struct gw_tier_done *out,
                         size_t cap);

/* Blocks until every op submitted so far has finished (tests and the
 * benchmark; the serving loop never waits). Main thread. */
void gw_host_tier_drain(struct gw_host_tier *t);

#endif /* GW_HOST_TIER_H */
