/*
 * pf_trig.h — the optional decode-time compression statistics of a profile
 * (DESIGN.md §4.9): for every layer and query head, over the calibration
 * samples' pre-RoPE query vectors (after q_norm where the model has one)
 * with the rotate-half pairing z_f = x_f + i x_{f + d/2} (f < d/2):
 *   re[f] = mean Re z_f, im[f] = mean Im z_f, abs[f] = mean |z_f|.
 * On disk, inside the profile (version stays 1; the object is optional):
 *   "trig": { "layers": [ { "re":  [[d/2] x Hq],
 *                           "im":  [[d/2] x Hq],
 *                           "abs": [[d/2] x Hq] } x L ] }
 * Hq is read from the file (the profile does not otherwise name it); it
 * must be a positive multiple of the profile's KV heads (GQA), the same in
 * every layer and array, and d must be even. Every value is finite and
 * every abs >= 0.
 *
 * The statistics live in struct pf_profile (pf_profile.h) as a struct
 * pf_trig; pf_profile_load / pf_profile_save read and write them and
 * pf_profile_rank keeps the rank's query heads. Plain data, read-only
 * after loading, any thread.
 */
#ifndef PF_TRIG_H
#define PF_TRIG_H

#include <jansson.h>
#include <stddef.h>

struct pf_trig {
    int num_q_heads;   /* Hq; 0: the profile has no statistics */
    int half;          /* d/2 */
    float *re;         /* (L, Hq, d/2) mean real part (pre-RoPE query) */
    float *im;         /* (L, Hq, d/2) mean imaginary part */
    float *abs;        /* (L, Hq, d/2) mean modulus, >= 0 */
};

/* Allocates zeroed statistics for L layers of Hq query heads of dimension
 * d (even). Returns 0, TG_EINVAL (bad sizes) or TG_ENOMEM; *t is freed on
 * failure. */
int pf_trig_init(struct pf_trig *t, int num_layers, int num_q_heads,
                 int head_dim, char *err, size_t errlen);

/* Frees and zeroes *t; safe on a zeroed one. */
void pf_trig_free(struct pf_trig *t);

/* Checks shape (Hq a positive multiple of num_kv_heads, half = d/2) and
 * values (finite, abs >= 0) of present statistics; absent (Hq 0) is
 * valid. Errors name the field as in the file ("trig.layers[1].abs[3][0]").
 * Returns 0, TG_EFORMAT or TG_ERANGE. */
int pf_trig_validate(const struct pf_trig *t, int num_layers,
                     int num_kv_heads, int head_dim, char *err,
                     size_t errlen);

/* Reads the "trig" object `obj` (borrowed) for a model of L layers, H KV
 * heads, head_dim d into *t (initialised here). Returns 0, TG_EFORMAT,
 * TG_ERANGE, TG_ENOTFOUND (a missing member) or TG_ENOMEM, naming the
 * field; *t is freed on failure. */
int pf_trig_from_json(struct pf_trig *t, const json_t *obj, int num_layers,
                      int num_kv_heads, int head_dim, char *err,
                      size_t errlen);

/* Returns the "trig" object of present statistics as a new reference
 * (NULL when out of memory). */
json_t *pf_trig_to_json(const struct pf_trig *t, int num_layers);

/* Copies the statistics of one rank into *out: the rank's KV head `local`
 * of layer l is model head global_head[l * H_rank + local], and its G =
 * Hq / H query heads are taken in order (local * G + j <- global * G + j),
 * as the model shard orders them. Absent statistics stay absent. Returns
 * 0, TG_EINVAL or TG_ENOMEM. */
int pf_trig_rank(struct pf_trig *out, const struct pf_trig *whole,
                 int num_layers, int num_kv_heads, int heads_rank,
                 const int *global_head, char *err, size_t errlen);

#endif /* PF_TRIG_H */
