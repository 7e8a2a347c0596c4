/* gw_worker_internal.h — what gw_worker.c and gw_worker_check.c share:
 * plan validation. Not part of the worker's interface (gw_worker.h). */
#ifndef GW_WORKER_INTERNAL_H
#define GW_WORKER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_worker/serve/gw_worker.h"

/* Checks `plan` against the worker's slots without changing them (a
 * simulated copy of their state, renewed per call): version and step id,
 * frees, entries (slots, kinds, chunk sizes, positions, sampling, adopted
 * row and head lengths, forks), page deltas and the room every row needs.
 * Returns 0, TG_EPROTO (version or step id) or TG_EINVAL naming the entry,
 * slot and request in err. */
int gw_worker__check_plan(struct gw_worker *w, const struct gw_plan *plan,
                          char *err, size_t errlen);

#endif /* GW_WORKER_INTERNAL_H */
