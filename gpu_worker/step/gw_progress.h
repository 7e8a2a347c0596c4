/*
 * gw_progress.h — the progress marks of a step loop's thread: it marks
 * after every backend call of a step (gw_step.h) and on every turn of its
 * loop between steps, as C11 atomics, so that another thread (the
 * worker's heartbeat, gpu_worker/serve/gw_beat.h) can tell a long step
 * from a wedged one without touching anything else.
 *
 * Threads: gw_progress_init, _mark and _step by the marking thread; any
 * thread may read (gw_progress_stalled_ms).
 */
#ifndef GW_PROGRESS_H
#define GW_PROGRESS_H

#include <stdatomic.h>
#include <stdint.h>

/* What the marking thread publishes. */
struct gw_progress {
    _Atomic uint64_t step;   /* step id in flight, 0 between steps */
    _Atomic int64_t mark_ms; /* CLOCK_MONOTONIC ms of the last mark */
};

/* Sets no step in flight and a mark at the present time. */
void gw_progress_init(struct gw_progress *p);

/* Records a sign of progress now (after each backend call of a step, and
 * on every turn of the loop between steps). p may be NULL (no-op). */
void gw_progress_mark(struct gw_progress *p);

/* A step starts (step > 0) or ends (step 0); marks progress too. p may be
 * NULL. */
void gw_progress_step(struct gw_progress *p, uint64_t step);

/* Milliseconds between the last mark and now_ms (CLOCK_MONOTONIC ms, as
 * gw_progress_now_ms gives), at least 0. */
int64_t gw_progress_stalled_ms(const struct gw_progress *p, int64_t now_ms);

/* CLOCK_MONOTONIC in milliseconds. */
int64_t gw_progress_now_ms(void);

#endif /* GW_PROGRESS_H */
