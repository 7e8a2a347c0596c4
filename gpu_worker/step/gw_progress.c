/* gw_progress.c — a step loop's progress marks (gw_progress.h). */
#include "gpu_worker/step/gw_progress.h"

#include <time.h>

int64_t gw_progress_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void gw_progress_init(struct gw_progress *p)
{
    atomic_store(&p->step, 0);
    atomic_store(&p->mark_ms, gw_progress_now_ms());
}

void gw_progress_mark(struct gw_progress *p)
{
    if (p != NULL)
        atomic_store_explicit(&p->mark_ms, gw_progress_now_ms(),
                              memory_order_release);
}

void gw_progress_step(struct gw_progress *p, uint64_t step)
{
    if (p == NULL)
        return;
    atomic_store_explicit(&p->step, step, memory_order_release);
    gw_progress_mark(p);
}

int64_t gw_progress_stalled_ms(const struct gw_progress *p, int64_t now_ms)
{
    int64_t d = now_ms -
                atomic_load_explicit(&p->mark_ms, memory_order_acquire);
    return d > 0 ? d : 0;
}
