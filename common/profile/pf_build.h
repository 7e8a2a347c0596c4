/*
 * pf_build.h — building a profile from calibration retention samples and
 * grouping heads (DESIGN.md §4.2).
 *
 * A retention file records, for each of S calibration samples, the fraction
 * of its keys every (layer, KV head) kept under the non-uniform method:
 *   { "format": "tangram-retention", "version": 1,
 *     "model": {"architecture", "num_layers": L, "num_kv_heads": H,
 *               "head_dim": d, "identity": "sha256:<hex>"},
 *     "method": "snapkv", "target_ratio": r,
 *     "samples": [S][L][H] ratios in [0, 1] }
 * (model.identity, pf_identity.h, is optional: calibrate writes it and the
 * built profile carries it on.)
 * From it a profile takes, per head, the mean and the population standard
 * deviation (divide by S) of the ratio, and the budget
 *   B = max(1/1024, min(1, mean + alpha * std))
 * (TANGRAM, Kim et al., arXiv 2606.06302, §Budget Reservation: an upper
 * confidence bound so that a request rarely needs more than reserved).
 * Heads are then grouped H_p at a time, clustered by budget or adjacent.
 *
 * All functions are pure apart from the memory they allocate; any thread.
 */
#ifndef PF_BUILD_H
#define PF_BUILD_H

#include "common/profile/pf_profile.h"

#include <jansson.h>
#include <stddef.h>

#define PF_RETENTION_FORMAT "tangram-retention"
#define PF_RETENTION_VERSION 1
#define PF_MAX_SAMPLES 1000000

struct pf_retention {
    char *architecture; /* model.architecture, owned */
    char *model_identity; /* model.identity (pf_identity.h), owned; NULL
                             when the file has none */
    char *method;       /* method that produced the ratios, owned */
    int num_layers;     /* L */
    int num_kv_heads;   /* H */
    int head_dim;       /* d */
    int samples;        /* S >= 1 */
    double target_ratio;
    double *ratio;      /* (S, L, H) kept / total per head, in [0, 1] */
};

/* Fills *r from the parsed retention document `doc` (borrowed); every field
 * is checked and named in errors ("samples[2][0][5]: expected a number").
 * Returns 0, TG_ENOTFOUND, TG_EFORMAT, TG_ERANGE or TG_ENOMEM; on failure
 * *r is left freed. The caller owns *r (pf_retention_free). */
int pf_retention_from_json(struct pf_retention *r, const json_t *doc,
                           char *err, size_t errlen);

/* Builds the retention document of *r ({"format": "tangram-retention",
 * "version": 1, "model": {...}, "method", "target_ratio", "samples":
 * [S][L][H]}); *out is a new reference. Returns 0 or TG_ENOMEM. */
int pf_retention_to_json(const struct pf_retention *r, json_t **out,
                         char *err, size_t errlen);

/* Writes *r to `path` atomically. Returns 0, TG_EIO or TG_ENOMEM. */
int pf_retention_save(const struct pf_retention *r, const char *path,
                      char *err, size_t errlen);

/* Loads the retention file at `path` (pf_retention_from_json); also
 * TG_ENOENT / TG_EIO / TG_EFORMAT for unreadable or malformed files. */
int pf_retention_load(struct pf_retention *r, const char *path, char *err,
                      size_t errlen);

/* Releases what *r owns and zeroes it; safe on a zeroed or freed object. */
void pf_retention_free(struct pf_retention *r);

/* Computes mean[h] and population std[h] of the S values x[s * stride + h],
 * h in [0, H), in double: two passes (mean first, then the mean of squared
 * deviations), each a compensated (Neumaier) sum over the values sorted
 * ascending, so the result does not depend on sample order and heads whose
 * samples are permutations of each other get bit-identical statistics.
 * Returns 0 or TG_ENOMEM (scratch of S doubles). */
int pf_stats_compute(const double *x, int samples, size_t stride, int H,
                     double *mean, double *std);

/* Returns max(1/1024, min(1, mean + alpha * std)) (§4.2). */
double pf_budget_from_stats(double mean, double std, double alpha);

/* Writes the G = H / H_p groups of one layer to groups[G * H_p]: clustered
 * sorts heads by (budget ascending, head index ascending) and takes H_p
 * consecutive heads per group, groups in that order; adjacent takes heads
 * 0..H_p-1, H_p..2H_p-1, ... `budget` has H entries. Returns 0, TG_EINVAL
 * (H_p not dividing H) or TG_ENOMEM. */
int pf_layer_group(const double *budget, int H, int heads_per_group,
                   enum pf_grouping grouping, int *groups, char *err,
                   size_t errlen);

/* Re-groups every layer of *p with `heads_per_group` heads per group and
 * `grouping`, keeping the budgets (e.g. a daemon run with another
 * --heads-per-group). Reallocates the group arrays; on failure *p is
 * unchanged. Returns 0, TG_EINVAL or TG_ENOMEM. */
int pf_profile_regroup(struct pf_profile *p, int heads_per_group,
                       enum pf_grouping grouping, char *err, size_t errlen);

/* Initializes *out as the profile built from retention *r with `alpha`
 * (>= 0), `heads_per_group` and `grouping`; it carries r's model identity
 * (if any). Returns 0, TG_EINVAL or
 * TG_ENOMEM; on failure *out is left freed. The caller owns *out
 * (pf_profile_free). */
int pf_profile_build(struct pf_profile *out, const struct pf_retention *r,
                     double alpha, int heads_per_group,
                     enum pf_grouping grouping, char *err, size_t errlen);

#endif /* PF_BUILD_H */
