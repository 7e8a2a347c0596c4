/*
 * tt_support.h — helpers shared by the C tests (tests/unit, tests/gpu):
 * scratch directories, the project's programs and shared data, tiny
 * generated models and hand-made profiles. Test code only; single thread.
 */
#ifndef TT_SUPPORT_H
#define TT_SUPPORT_H

#include <stddef.h>

/* Creates a fresh directory /tmp/<prefix>XXXXXX into out (cap bytes).
 * Returns 0 or -1. */
int tt_tmpdir_make(const char *prefix, char *out, size_t cap);

/* Removes `dir` and everything below it (no shell). Returns 0 or -1;
 * an empty string is a no-op. */
int tt_tmpdir_remove(const char *dir);

/* Writes $TANGRAM_BIN/<name> (default build/bin under $TANGRAM_SOURCE or
 * the current directory) into out. Returns 1 when it is executable. */
int tt_program(const char *name, char *out, size_t cap);

/* Writes $TANGRAM_SHARED/<rel> (default ../shared) into out. */
void tt_shared_path(const char *rel, char *out, size_t cap);

/* Runs tangram-make-model with `args` (a NULL-terminated list of extra
 * flags such as "--arch", "qwen3", ...; the tokenizer defaults to the
 * shared qwen3 one unless args name --tokenizer) writing to out_dir, with
 * its output discarded. Returns 0, -1 on failure, or 77 when the program
 * is not built (the caller skips). */
int tt_make_model(const char *out_dir, const char *const *args);

/* Writes a profile file for L layers x H heads of dimension d with
 * heads_per_group hp: budget[L*H] as mean and budget, groups[L*H] the
 * head order of each layer's groups (NULL: adjacent). Returns 0 or -1
 * (the reason on stderr). */
int tt_write_profile(const char *path, const char *arch, int L, int H, int d,
                     int hp, const double *budget, const int *groups,
                     double target_ratio);

#endif /* TT_SUPPORT_H */
