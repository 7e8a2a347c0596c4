/*
 * rt_metrics.h — a Prometheus metrics registry (DESIGN.md §5 "Metrics"),
 * generic: the metrics tangram exports are rt_metrics_tangram.h.
 *
 * A registry holds metric families (counter, gauge, histogram), each with a
 * fixed list of label names, and under each family a fixed set of series
 * (one per label-value tuple, e.g. rank="0"). Everything is registered once
 * at start-up; registration allocates and validates (metric and label name
 * grammar, UTF-8, duplicate names, histogram bounds). Updates go through a
 * series handle (`struct rt_metrics_series *`) and never allocate: a counter
 * add or gauge set is a store, a histogram observation a binary search over
 * at most a few dozen bounds plus three stores.
 *
 * Rendering writes the Prometheus text exposition format, version 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/):
 *   # HELP <name> <help, with \ and newline escaped as \\ and \n>
 *   # TYPE <name> counter|gauge|histogram
 *   <name>{<label>="<value, with \ " newline escaped as \\ \" \n>",...} <v>
 * and for a histogram, per series, cumulative buckets in increasing `le`
 * order ending with le="+Inf", then <name>_sum and <name>_count (the +Inf
 * bucket always equals _count). Families appear in registration order and
 * series in registration order within a family. Values are printed so that
 * they read back to the same double (integers as integers, others as the
 * shortest of %.15g/%.16g/%.17g that round-trips, so 0.1 prints "0.1" as in
 * vLLM's output and dashboards matching le="0.1" keep working); infinities
 * print "+Inf"/"-Inf" and NaN "NaN", the spellings Prometheus parses.
 * Number formatting uses printf/strtod, so the process must keep the "C"
 * LC_NUMERIC locale (the default; the daemon never calls setlocale).
 *
 * Threads: a registry and its series belong to one thread, the router's
 * libuv loop thread (DESIGN.md §2: one loop thread). Updates and rendering
 * are not synchronised; never touch them from another thread.
 */
#ifndef RT_METRICS_H
#define RT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_buf.h"

/* HTTP Content-Type of the rendered text (exposition format 0.0.4). */
#define RT_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Most label names one family may carry. */
#define RT_METRICS_MAX_LABELS 8

/* Most histogram bounds (finite `le` values) of one family. */
#define RT_METRICS_MAX_BOUNDS 64

enum rt_metrics_type {
    RT_METRICS_COUNTER,   /* monotonic, >= 0; name should end in _total */
    RT_METRICS_GAUGE,     /* any value, may go up and down */
    RT_METRICS_HISTOGRAM, /* observations counted into fixed buckets */
};

/* One labelled time series of a family. The handle stays valid until the
 * registry is freed. Fields are read-only outside rt_metrics.c (change
 * them only through the update functions below). */
struct rt_metrics_series {
    struct rt_metrics_family *family;
    char *labels;       /* pre-rendered `k="v",k2="v2"` (escaped), "" if none */
    double value;       /* counter or gauge value; histogram: unused */
    double sum;         /* histogram: sum of observations */
    uint64_t count;     /* histogram: number of observations */
    uint64_t *buckets;  /* histogram: (n_bounds + 1) non-cumulative counts;
                           [i] counts bounds[i-1] < v <= bounds[i], the last
                           one v > bounds[n_bounds-1] (the +Inf overflow) */
};

/* One metric family: name, help, type, label names and its series.
 * Read-only outside rt_metrics.c. */
struct rt_metrics_family {
    char *name;
    char *help;                 /* raw (unescaped) help text */
    enum rt_metrics_type type;
    int n_labels;
    char *label_names[RT_METRICS_MAX_LABELS];
    int n_bounds;               /* histogram: finite bounds, may be 0 */
    double *bounds;             /* (n_bounds) strictly increasing, finite */
    char **bound_text;          /* (n_bounds) le="..." text of each bound */
    int n_series;
    int cap_series;
    struct rt_metrics_series **series; /* (n_series) owned, stable */
};

/* The registry: families in registration order. Zero-initialise (or call
 * rt_metrics_registry_init) before use. */
struct rt_metrics_registry {
    int n_families;
    int cap_families;
    struct rt_metrics_family **families; /* (n_families) owned, stable */
};

/* ---- registry -------------------------------------------------------- */

/* Initialises an empty registry (same as zeroing it). */
void rt_metrics_registry_init(struct rt_metrics_registry *reg);

/* Releases every family and series; all handles become invalid. Safe on a
 * zeroed registry; leaves it zeroed. */
void rt_metrics_registry_free(struct rt_metrics_registry *reg);

/* Registers a family. `name` must match [a-zA-Z_:][a-zA-Z0-9_:]*, `help`
 * be valid UTF-8 (NULL or "" means no # HELP line), and
 * label_names[0..n_labels) match [a-zA-Z_][a-zA-Z0-9_]*, not start with
 * "__", be distinct and, for a histogram, not be "le". For a histogram,
 * bounds[0..n_bounds) are the finite upper bounds, strictly increasing
 * (the +Inf bucket is implicit); other types must pass n_bounds = 0.
 * Names are copied.
 * Returns 0 with *out set (owned by the registry), TG_EINVAL for a bad
 * name, label, bound or count, TG_EEXIST when the name, or one of the
 * sample names a histogram adds (_bucket, _sum, _count), collides with an
 * existing family, or TG_ENOMEM; on failure the registry is unchanged. */
int rt_metrics_family_add(struct rt_metrics_registry *reg, const char *name,
                          const char *help, enum rt_metrics_type type,
                          int n_labels, const char *const *label_names,
                          const double *bounds, int n_bounds,
                          struct rt_metrics_family **out, char *err,
                          size_t errlen);

/* Adds the series with label values values[0..family->n_labels) (valid
 * UTF-8; copied, escaped once here). A family without labels takes
 * values = NULL and has at most one series. Values start at zero.
 * Returns 0 with *out set (owned by the family), TG_EINVAL for a NULL or
 * non-UTF-8 value, TG_EEXIST when a series with the same values exists,
 * or TG_ENOMEM; on failure the family is unchanged. */
int rt_metrics_series_add(struct rt_metrics_family *family,
                          const char *const *values,
                          struct rt_metrics_series **out, char *err,
                          size_t errlen);

/* Shorthand: registers an unlabelled family and its one series. Same
 * contract as rt_metrics_family_add; *out is the series. */
int rt_metrics_single_add(struct rt_metrics_registry *reg, const char *name,
                          const char *help, enum rt_metrics_type type,
                          const double *bounds, int n_bounds,
                          struct rt_metrics_series **out, char *err,
                          size_t errlen);

/* Returns the family named `name`, or NULL. O(families). */
struct rt_metrics_family *rt_metrics_family_find(
    const struct rt_metrics_registry *reg, const char *name);

/* ---- updates (loop thread only, no allocation) ------------------------ */

/* Adds `v` to a counter. Returns 0, or TG_EINVAL (counter unchanged) when
 * v is negative, NaN or infinite: counters only go up. The series must be
 * a counter (asserted). */
int rt_metrics_counter_add(struct rt_metrics_series *s, double v);

/* Adds 1 to a counter (asserted to be a counter). */
void rt_metrics_counter_inc(struct rt_metrics_series *s);

/* Sets a gauge to `v` (any value, NaN and infinities included). */
void rt_metrics_gauge_set(struct rt_metrics_series *s, double v);

/* Adds `v` (may be negative) to a gauge. */
void rt_metrics_gauge_add(struct rt_metrics_series *s, double v);

/* Records one observation `v` in a histogram: the first bucket whose bound
 * is >= v (le is inclusive), or +Inf; adds v to the sum and 1 to the count.
 * Returns 0, or TG_EINVAL (nothing recorded) when v is NaN. The series
 * must be a histogram (asserted). */
int rt_metrics_histogram_observe(struct rt_metrics_series *s, double v);

/* Value of a counter or gauge. */
double rt_metrics_series_value(const struct rt_metrics_series *s);

/* Histogram: number of observations with value <= bounds[i] (cumulative;
 * i == n_bounds gives the +Inf bucket, equal to the total count). */
uint64_t rt_metrics_histogram_cumulative(const struct rt_metrics_series *s,
                                         int i);

/* ---- rendering ------------------------------------------------------- */

/* Appends the whole registry in text format 0.0.4 to `out`, the caller's
 * buffer (tg_buf.h: zeroed, or holding text; tg_buf_reset it to reuse its
 * storage for the next scrape), leaving it NUL-terminated even for an
 * empty registry. Returns 0 or TG_ENOMEM, in which case out is restored
 * to its state on entry (the text appended so far is dropped). */
int rt_metrics_render(const struct rt_metrics_registry *reg, struct tg_buf *out,
                      char *err, size_t errlen);

/* Writes the text form of `v` used for sample values and bounds into
 * dst[0..dstlen) and returns its length: integral values of magnitude
 * < 2^53 as integers, other finite values as the shortest of %.15g, %.16g,
 * %.17g that strtod reads back exactly, and "+Inf", "-Inf", "NaN".
 * dstlen >= 32 always suffices. Thread-safe. */
int rt_metrics_format_double(double v, char *dst, size_t dstlen);

#endif /* RT_METRICS_H */
