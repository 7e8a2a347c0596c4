/*
 * gw_evaluate.h — what compression costs on an operator's conversations
 * (`tangram-profile evaluate`, docs/PROFILES.md "Choosing a profile"):
 * each conversation rendered with the model's chat template and run
 * teacher-forced through the in-process engine (gw_engine.h) once with
 * full KV and once per profile, in the serving chunks of DESIGN.md §4.3
 * (each chunk attends to the compressed KV of every chunk before it, so a
 * turn is scored over the compressed KV of the turns before it, as
 * `tangram-generate --prompt-logprobs` computes it). Per profile and
 * assistant turn index it accumulates the quality of the assistant tokens
 * against full KV and the KV pages held.
 *
 * Runs profile by profile (one engine, hence one copy of the weights, at
 * a time): full KV over every conversation first, keeping what the
 * comparisons need of it (per assistant token its value, its top-1 id and
 * its log-normalizer in memory, 16 bytes; its whole logits row, 4 x vocab
 * bytes, in an unlinked temporary file; per turn the greedy continuation
 * and the pages), then each profile, whose rows meet full KV's read back
 * one at a time: the KL divergence is exact over the whole vocabulary
 * with one row of memory. Profiles asked for by ratio are calibrated
 * first, in process, as `tangram-profile calibrate` makes them
 * (gw_calibrate_files). Deterministic: greedy, seed 0, the same chunks.
 */
#ifndef GW_EVALUATE_H
#define GW_EVALUATE_H

#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu_worker/backend/gw_backend.h"

/* Sums over the assistant turns of one turn index (or all of them) of
 * one profile; every mean below is a ratio of two of them. */
struct gw_eval_acc {
    int64_t turns;      /* assistant turns counted */
    int64_t tokens;     /* their tokens */
    double nll;         /* sum of -log P(token) under the profile */
    double nll_full;    /* the same tokens under full KV */
    int64_t top1_agree; /* tokens whose most likely id equals full KV's */
    double kl;          /* sum of KL(full || profile) of the next-token
                           distributions, exact over the whole vocabulary
                           (in double, from the raw logits rows) */
    double pages;       /* sum of the pages held at the turn's end */
    double pages_full;  /* the same under full KV */
    int64_t greedy;     /* sum of the greedy agreement lengths */
};

struct gw_eval_profile {
    char *path;          /* the profile file; "none" for full KV; for a
                            --ratio profile "ratio R (METHOD)" */
    double target_ratio; /* the profile's (1 for full KV) */
    double calibrated;   /* the ratio it was calibrated at (0: a file) */
    double calib_seconds; /* wall time of that calibration */
    int conversations;   /* evaluated (fewer when interrupted) */
    int64_t prefilled;   /* tokens run through the model: every
                                  turn's rendering and request, and the
                                  continuations */
    double seconds;      /* wall time of this profile's runs */
    double kl_seconds;   /* of which in the exact KL's host work: full
                            KV's rows written (its run) or read back and
                            met (a profile's), log-sum-exps included */
    struct gw_eval_acc all;
    struct gw_eval_acc *turn; /* (n_turn) by assistant turn index */
    int n_turn;
};

struct gw_eval_result {
    struct gw_eval_profile *profiles; /* (n_profiles) [0] is full KV */
    int n_profiles;
    int conversations; /* read from the data file */
    int skipped;       /* not scorable (see gw_evaluate_run) */
    int interrupted;   /* *stop was seen: partial results */
    int continuation;  /* greedy tokens compared per turn end */
    int vocab;         /* the model's: the KL's support */
    int64_t row_bytes; /* temporary file space full KV's rows took */
};

typedef void (*gw_eval_progress_fn)(void *ud, int profile, int n_profiles,
                                    int done, int total);

/* Shown every scored assistant token of a compared profile (profile >= 1
 * in the result's order): the turn's ids, the token's position q in them
 * and its KL(full || profile); for tests and per-token dumps. */
typedef void (*gw_eval_token_fn)(void *ud, int profile, const int32_t *ids,
                                 int q, double kl);

struct gw_eval_opts {
    const char *model_dir;
    const char *data_path;       /* JSONL: {"messages": [...]} (OpenAI) or
                                  {"conversations": [{"from", "value"}]}
                                  (ShareGPT: human/user, gpt/assistant,
                                  system) */
    const char *const *profiles; /* (n_profiles) profile files */
    int n_profiles;
    const double *ratios; /* (n_ratios) in (0, 1]: profiles calibrated
                              at these ratios, evaluated after the files */
    int n_ratios;
    const char *samples_path; /* their calibration samples (gw_calibrate.h
                                 format); NULL: data_path */
    const char *calib_method; /* their scoring method; NULL: snapkv */
    double calib_alpha;       /* their alpha (B = mean + alpha x std) */
    const char *tmp_dir;      /* full KV's rows and the calibrated profiles go
                            in a new folder here, removed at the end;
                            NULL: $TMPDIR, else /tmp */
    enum gw_backend_kind backend;
    int prefill_chunk;     /* C, as the server's --prefill-chunk */
    int page_size;         /* P */
    int heads_per_group;   /* H_p of the full-KV run and of the
                              calibrated profiles */
    int n_threads;         /* <= 0: all */
    int continuation;      /* greedy tokens at each turn end, 0..256 */
    int max_tokens;        /* conversations longer are cut here
                                  (their last turns dropped) */
    int max_conversations; /* 0: all */
    const volatile sig_atomic_t *stop; /* nonzero: finish the conversation
                                  running and return the partial result */
    gw_eval_progress_fn progress;
    void *progress_ud;
    gw_eval_token_fn on_token; /* optional */
    void *on_token_ud;
};

/* Runs the evaluation (above) into *res (freed with gw_eval_result_free,
 * also after a failure). A conversation is skipped (counted) when it has
 * no assistant turn or when its template does not render turn by turn as
 * prefixes of the whole (then its turn boundaries are unknown). Full
 * KV's rows need 4 x vocab bytes per assistant token of temporary space:
 * checked against the folder's free space before they are written
 * (TG_ENOSPC naming both). Returns 0 (also when interrupted) or the first
 * error naming the file, line, profile or ratio. */
int gw_evaluate_run(const struct gw_eval_opts *o, struct gw_eval_result *res,
                    char *err, size_t errlen);

void gw_eval_result_free(struct gw_eval_result *res);

/* Output (gw_evaluate_out.c). Means of an accumulator: */
double gw_eval_nll(const struct gw_eval_acc *a);   /* mean NLL */
double gw_eval_dnll(const struct gw_eval_acc *a);  /* minus full KV's */
double gw_eval_saved(const struct gw_eval_acc *a); /* 1 - pages ratio */

/* The report as a table (stdout-ready text into f). */
void gw_eval_print(const struct gw_eval_result *r, FILE *f);

/* The report as JSON ("format": "tangram-evaluate"), a new reference or
 * NULL when out of memory. */
json_t *gw_eval_json(const struct gw_eval_result *r);

/* An SVG picture: quality loss (mean NLL difference) against memory
 * saved, one point per profile, and against the turn index, one line per
 * profile. Returns 0 or an error naming the file. */
int gw_eval_svg(const struct gw_eval_result *r, const char *path, char *err,
                size_t errlen);

/* tangram-profile evaluate's output: a progress bar on stderr (a
 * gw_eval_progress_fn), and the report: the table into `table` unless
 * json_path is "-" (then the JSON alone, on stdout), the JSON into
 * json_path and the SVG into plot_path (each NULL: none). Returns 0 or
 * TG_EIO naming the file. */
void gw_eval_progress_bar(void *ud, int profile, int n_profiles, int done,
                          int total);
int gw_eval_write(const struct gw_eval_result *r, const char *json_path,
                  const char *plot_path, FILE *table, char *err, size_t errlen);

#endif /* GW_EVALUATE_H */
