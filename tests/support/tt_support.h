/*
 * tt_support.h — helpers shared by the C tests (tests/unit, tests/gpu) and
 * benchmarks (tests/bench): scratch directories, the project's programs
 * and shared data, tiny generated models and hand-made profiles; a
 * reproducible xorshift64* stream with the draws the tests make from it
 * (integers, floats, permutations, bf16 data); a monotonic clock, medians
 * and a finiteness check; allocation that fails the current cmocka test
 * or stops a benchmark program; the common flags of a benchmark program.
 * Test code only; single thread (one stream per thread).
 */
#ifndef TT_SUPPORT_H
#define TT_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

/* Formats a path (or another value that must stay whole) like
 * snprintf(out, cap, fmt, ...); one that does not fit ends the program
 * with status 1 and a message naming it and the buffer's size (a cut path
 * names another file: the test would fail far from the cause, or test
 * the wrong thing). */
void tt_path(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Creates a fresh directory $TMPDIR/<prefix>XXXXXX (/tmp without TMPDIR)
 * into out (cap bytes). Returns 0, or -1 (a TMPDIR too long for out is
 * said on stderr). */
int tt_tmpdir_make(const char *prefix, char *out, size_t cap);

/* Removes `dir` and everything below it (no shell). Returns 0 or -1;
 * an empty string is a no-op. */
int tt_tmpdir_remove(const char *dir);

/* Writes $TANGRAM_BIN/<name> (default build/bin under $TANGRAM_SOURCE or
 * the current directory) into out (tt_path: whole, or the program ends).
 * Returns 1 when it is executable. */
int tt_program(const char *name, char *out, size_t cap);

/* Writes $TANGRAM_DATA/<rel> (default ./data: the project data folder)
 * into out (tt_path: whole, or the program ends). */
void tt_data_path(const char *rel, char *out, size_t cap);

/* Returns the Python interpreter of the test clients: $TANGRAM_PYTHON
 * (CMake's TANGRAM_PYTHON), default /usr/bin/python3. */
const char *tt_python(void);

/* Runs tangram-make-model with `args` (a NULL-terminated list of extra
 * flags such as "--arch", "qwen3", ...; the tokenizer defaults to the
 * project's qwen3 one unless args name --tokenizer) writing to out_dir,
 * with its output discarded. Returns 0, or -1 on failure (a program that
 * is not built, or more than 56 flags, is a failure, named on stderr). */
int tt_make_model(const char *out_dir, const char *const *args);

/* Writes a profile file for L layers x H heads of dimension d with
 * heads_per_group hp: budget[L*H] as mean and budget, groups[L*H] the
 * head order of each layer's groups (NULL: adjacent). Returns 0 or -1
 * (the reason on stderr). */
int tt_write_profile(const char *path, const char *arch, int L, int H, int d,
                     int hp, const double *budget, const int *groups,
                     double target_ratio);

/* The number of elements of array a (not a pointer). */
#define TT_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ---- reproducible random numbers ---------------------------------------- */

/* One xorshift64* stream (Vigna 2016, "An experimental exploration of
 * Marsaglia's xorshift generators, scrambled": shifts 12, 25, 27, output
 * times 2685821657736338717). Seed it in place, `struct tt_xrng r = {s}`,
 * with any s != 0 (0 is the one state it never leaves). The GPU tests'
 * random shapes, data and so their tolerances come from this exact
 * sequence, which is why it stays apart from tt_model's tt_rng (plain
 * xorshift64, another sequence). */
struct tt_xrng {
    uint64_t state; /* never 0 */
};

/* Returns the next 64 bits of the stream. */
uint64_t tt_xrng_next(struct tt_xrng *r);

/* Returns the top 53 bits of the next value as a double in [0, 1):
 * (next >> 11) * 2^-53, exact. */
double tt_xrng_unit(struct tt_xrng *r);

/* Returns lo + (hi - lo) * (float)u for u = tt_xrng_unit, in float
 * arithmetic: in [lo, hi] (hi itself only through float rounding). */
float tt_xrng_float(struct tt_xrng *r, float lo, float hi);

/* Returns (float)(2u - 1) for u = tt_xrng_unit (computed in double): in
 * [-1, 1). */
float tt_xrng_sym(struct tt_xrng *r);

/* Returns lo + next % (hi - lo + 1), an integer in [lo, hi] (lo <= hi;
 * the modulo bias is negligible for test ranges and kept so the values
 * are the ones the tests were written against). */
int tt_xrng_int(struct tt_xrng *r, int lo, int hi);
int64_t tt_xrng_int64(struct tt_xrng *r, int64_t lo, int64_t hi);

/* Shuffles a[0..n) in place, Fisher-Yates from the end: for i = n-1 .. 1
 * swaps a[i] with a[next % (i + 1)]. n <= 1 draws nothing. */
void tt_xrng_shuffle(struct tt_xrng *r, int32_t *a, int64_t n);

/* Writes a random permutation of 0..n-1 to a: the identity, shuffled by
 * tt_xrng_shuffle. */
void tt_xrng_perm(struct tt_xrng *r, int32_t *a, int64_t n);

/* Random placements of n_heads KV heads on the (group, slot) pairs of
 * groups of hp heads (pair p = (p / hp, p % hp)), both from one
 * permutation perm of 0..n_heads-1 drawn by tt_xrng_perm:
 * tt_heads_scatter gives pair p to head perm[p]; tt_heads_gather gives
 * head h the pair perm[h]. Each is a bijection, but they are different
 * maps of the same stream, so each test keeps the one its data was drawn
 * with. head_group and head_slot hold n_heads entries. For cmocka tests
 * (out of memory fails the test). */
void tt_heads_scatter(struct tt_xrng *r, int n_heads, int hp,
                      int32_t *head_group, int32_t *head_slot);
void tt_heads_gather(struct tt_xrng *r, int n_heads, int hp,
                     int32_t *head_group, int32_t *head_slot);

/* Fills n bf16 values drawn as tt_xrng_float(r, lo, hi) each, rounded to
 * nearest even (st_f32_to_bf16): their bits go to bits[i] and, when f is
 * not NULL, their exact fp32 values to f[i], so a device kernel and a CPU
 * reference see the same numbers. One draw per element, in order. */
void tt_fill_bf16(struct tt_xrng *r, uint16_t *bits, float *f, size_t n,
                  float lo, float hi);

/* Returns x rounded to the nearest bf16, as a float. Pure. */
float tt_bf16_round(float x);

/* ---- measuring ---------------------------------------------------------- */

/* Returns seconds on CLOCK_MONOTONIC (an arbitrary origin). */
double tt_now_s(void);

/* Sorts v[0..n) ascending and returns its median (the mean of the two
 * middle values for even n). n >= 1. */
double tt_median(double *v, int n);

/* Returns 1 when every x[0..n) is finite (no NaN, no infinity), else 0. */
int tt_all_finite(const float *x, size_t n);

/* Returns this process's peak resident set (VmHWM of /proc/self/status)
 * in bytes, or -1 when it cannot be read. */
int64_t tt_vm_hwm(void);

/* ---- allocation that cannot fail ---------------------------------------- */

/* Returns malloc(bytes) (at least 1 byte, so 0 gives a pointer too); a
 * cmocka assertion fails the current test when it runs out. For cmocka
 * tests only. The caller frees. */
void *tt_xmalloc(size_t bytes);

/* The same for benchmark programs: out of memory prints "<prog>: out of
 * memory" on stderr and exits 1. The caller frees. */
void *tt_bench_malloc(const char *prog, size_t bytes);

/* ---- benchmark flags ---------------------------------------------------- */

/* An integer flag of a benchmark program: `name N` with lo <= N <= hi. */
struct tt_bench_opt {
    const char *name; /* "--reps" */
    int lo, hi;
    int *value;       /* written when the flag is given */
};

/* Parses a benchmark's argv[1..argc): "--quick" sets *quick to 1, "--bench"
 * (the full run, the default anyway) is accepted, each of opts[0..n_opts)
 * reads its integer. Returns 0, or 2 (bad usage: the program exits 2)
 * after printing on stderr "<prog>: <flag> needs a value", "<prog>: <flag>
 * must be an integer in <lo>..<hi>" or, for an unknown argument,
 * "usage: <argv[0]> <usage>". */
int tt_bench_args(const char *prog, int argc, char **argv, int *quick,
                  const struct tt_bench_opt *opts, size_t n_opts,
                  const char *usage);

#endif /* TT_SUPPORT_H */
