/*
 * tt_prom.h — a validating reader of the Prometheus text exposition format
 * 0.0.4 for the tests of the router's metrics (router/core/rt_metrics.h). It
 * checks the grammar of every line, # HELP before # TYPE before samples,
 * contiguous families, no duplicate series, counters non-negative, and
 * histogram buckets increasing in le and in count, ending with +Inf equal
 * to _count, with _sum and _count present. Test code only; single thread
 * (the reader's state is one static object).
 */
#ifndef TT_PROM_H
#define TT_PROM_H

#include <stddef.h>

struct rt_metrics_registry;

/* Validates `text` (NUL-terminated). Returns 0 when it is valid, or -1 with
 * the reason ("line N: ...") written into why (cap bytes; why may be NULL
 * when cap is 0). Allocates nothing that outlives the call. */
int tt_prom_validate(const char *text, char *why, size_t cap);

/* Fails the current cmocka test, printing the reason and the text, unless
 * `text` is valid exposition text. */
void tt_prom_assert_valid(const char *text);

/* Fails the current cmocka test unless `text` is invalid and the reason
 * contains `why_part`. */
void tt_prom_assert_invalid(const char *text, const char *why_part);

/* Renders `reg` with rt_metrics_render into a fresh NUL-terminated string,
 * failing the current cmocka test on error. The caller frees the result
 * with free(). */
char *tt_prom_render(const struct rt_metrics_registry *reg);

#endif /* TT_PROM_H */
