/* tt_support.c — shared helpers of the C tests (see tt_support.h). */
#include "tests/support/tt_support.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/profile/pf_profile.h"
#include "common/model/st_safetensors.h"

void tt_path(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < cap)
        return;
    fprintf(stderr,
            "tt_path: '%.120s...' is %d bytes, longer than the %zu of this "
            "test's buffer (a checkout, build or TMPDIR path too long for "
            "it): stopping\n",
            out, n, cap - 1);
    exit(1);
}

int tt_tmpdir_make(const char *prefix, char *out, size_t cap)
{
    const char *base = getenv("TMPDIR");
    int n = snprintf(out, cap, "%s/%sXXXXXX", base && base[0] ? base : "/tmp", prefix);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr,
                "tt_tmpdir_make: '%s/%sXXXXXX' is longer than the "
                "%zu bytes of this test's buffer: set a shorter TMPDIR\n",
                base && base[0] ? base : "/tmp", prefix, cap - 1);
        return -1;
    }
    return mkdtemp(out) != NULL ? 0 : -1;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int tt_tmpdir_remove(const char *dir)
{
    if (dir == NULL || dir[0] == '\0')
        return 0;
    return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

int tt_program(const char *name, char *out, size_t cap)
{
    const char *bin = getenv("TANGRAM_BIN");
    if (bin != NULL && bin[0] != '\0') {
        tt_path(out, cap, "%s/%s", bin, name);
    } else {
        const char *src = getenv("TANGRAM_SOURCE");
        tt_path(out, cap, "%s/build/bin/%s", src && src[0] ? src : ".", name);
    }
    return access(out, X_OK) == 0;
}

void tt_data_path(const char *rel, char *out, size_t cap)
{
    const char *sh = getenv("TANGRAM_DATA");
    tt_path(out, cap, "%s/%s", sh && sh[0] ? sh : "data", rel);
}

const char *tt_python(void)
{
    const char *p = getenv("TANGRAM_PYTHON");
    return p != NULL && p[0] != '\0' ? p : "/usr/bin/python3";
}

int tt_make_model(const char *out_dir, const char *const *args)
{
    char prog[4096], tok[4096];
    if (!tt_program("tangram-make-model", prog, sizeof(prog))) {
        fprintf(stderr, "tt_make_model: %s is not built\n", prog);
        return -1;
    }
    tt_data_path("tokenizers/qwen3", tok, sizeof(tok));
    const char *argv[64];
    int n = 0, has_tok = 0;
    argv[n++] = prog;
    for (int i = 0; args != NULL && args[i] != NULL; i++) {
        if (n == 57) { /* room for --tokenizer T -o DIR and the NULL */
            fprintf(stderr, "tt_make_model: more than 56 flags\n");
            return -1;
        }
        if (strcmp(args[i], "--tokenizer") == 0)
            has_tok = 1;
        argv[n++] = args[i];
    }
    if (!has_tok) {
        argv[n++] = "--tokenizer";
        argv[n++] = tok;
    }
    argv[n++] = "-o";
    argv[n++] = out_dir;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL)
            _exit(127);
        execv(prog, (char *const *)argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int tt_write_profile(const char *path, const char *arch, int L, int H, int d,
                     int hp, const double *budget, const int *groups,
                     double target_ratio)
{
    char err[512];
    struct pf_profile p;
    if (pf_profile_init(&p, arch, "snapkv", L, H, d, hp, err, sizeof(err)) != 0) {
        fprintf(stderr, "profile: %s\n", err);
        return -1;
    }
    for (int i = 0; i < L * H; i++) {
        p.budget[i] = budget[i];
        p.mean[i] = budget[i];
        if (groups != NULL)
            p.groups[i] = groups[i];
    }
    p.samples = 1;
    p.target_ratio = target_ratio;
    int rc = pf_profile_finish(&p, err, sizeof(err));
    if (rc == 0)
        rc = pf_profile_save(&p, path, err, sizeof(err));
    pf_profile_free(&p);
    if (rc != 0)
        fprintf(stderr, "profile: %s\n", err);
    return rc == 0 ? 0 : -1;
}

/* ---- reproducible random numbers ---------------------------------------- */

uint64_t tt_xrng_next(struct tt_xrng *r)
{
    /* xorshift64* (Vigna 2016): the state steps by xorshift, the output is
     * the state times an odd constant. */
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return r->state * 2685821657736338717ull;
}

double tt_xrng_unit(struct tt_xrng *r)
{
    return (double)(tt_xrng_next(r) >> 11) * 0x1.0p-53;
}

float tt_xrng_float(struct tt_xrng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)tt_xrng_unit(r);
}

float tt_xrng_sym(struct tt_xrng *r)
{
    return (float)(2.0 * tt_xrng_unit(r) - 1.0);
}

int64_t tt_xrng_int64(struct tt_xrng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(tt_xrng_next(r) % (uint64_t)(hi - lo + 1));
}

int tt_xrng_int(struct tt_xrng *r, int lo, int hi)
{
    return (int)tt_xrng_int64(r, lo, hi);
}

void tt_xrng_shuffle(struct tt_xrng *r, int32_t *a, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(tt_xrng_next(r) % (uint64_t)(i + 1));
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

void tt_xrng_perm(struct tt_xrng *r, int32_t *a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        a[i] = (int32_t)i;
    tt_xrng_shuffle(r, a, n);
}

void tt_heads_scatter(struct tt_xrng *r, int n_heads, int hp,
                      int32_t *head_group, int32_t *head_slot)
{
    int32_t *perm = tt_xmalloc((size_t)n_heads * sizeof(int32_t));
    tt_xrng_perm(r, perm, n_heads);
    for (int p = 0; p < n_heads; p++) {
        head_group[perm[p]] = p / hp;
        head_slot[perm[p]] = p % hp;
    }
    free(perm);
}

void tt_heads_gather(struct tt_xrng *r, int n_heads, int hp,
                     int32_t *head_group, int32_t *head_slot)
{
    int32_t *perm = tt_xmalloc((size_t)n_heads * sizeof(int32_t));
    tt_xrng_perm(r, perm, n_heads);
    for (int h = 0; h < n_heads; h++) {
        head_group[h] = perm[h] / hp;
        head_slot[h] = perm[h] % hp;
    }
    free(perm);
}

void tt_fill_bf16(struct tt_xrng *r, uint16_t *bits, float *f, size_t n,
                  float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        bits[i] = st_f32_to_bf16(tt_xrng_float(r, lo, hi));
        if (f != NULL)
            f[i] = st_bf16_to_f32(bits[i]);
    }
}

float tt_bf16_round(float x)
{
    return st_bf16_to_f32(st_f32_to_bf16(x));
}

/* ---- measuring ---------------------------------------------------------- */

double tt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tt_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int tt_all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

int64_t tt_vm_hwm(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL)
        return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmHWM:", 6) == 0 && sscanf(line + 6, "%lld", &kib) != 1)
            kib = -1;
    fclose(f);
    return kib < 0 ? -1 : (int64_t)kib * 1024;
}

/* ---- allocation that cannot fail ---------------------------------------- */

void *tt_xmalloc(size_t bytes)
{
    void *p = malloc(bytes > 0 ? bytes : 1);
    assert_non_null(p);
    return p;
}

void *tt_bench_malloc(const char *prog, size_t bytes)
{
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "%s: out of memory\n", prog);
        exit(1);
    }
    return p;
}

/* ---- benchmark flags ---------------------------------------------------- */

/* Reads opt's integer after argv[*i]. Returns 0 (and moves *i past the
 * value) or 2 after printing why. */
static int opt_read(const char *prog, int argc, char **argv, int *i,
                    const struct tt_bench_opt *opt)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", prog, opt->name);
        return 2;
    }
    const char *s = argv[*i + 1];
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < opt->lo || v > opt->hi) {
        fprintf(stderr, "%s: %s must be an integer in %d..%d\n", prog,
                opt->name, opt->lo, opt->hi);
        return 2;
    }
    *opt->value = (int)v;
    (*i)++;
    return 0;
}

int tt_bench_args(const char *prog, int argc, char **argv, int *quick,
                  const struct tt_bench_opt *opts, size_t n_opts,
                  const char *usage)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            *quick = 1;
            continue;
        }
        if (strcmp(argv[i], "--bench") == 0)
            continue;
        size_t k = 0;
        while (k < n_opts && strcmp(argv[i], opts[k].name) != 0)
            k++;
        if (k == n_opts) {
            fprintf(stderr, "usage: %s %s\n", argv[0], usage);
            return 2;
        }
        if (opt_read(prog, argc, argv, &i, &opts[k]) != 0)
            return 2;
    }
    return 0;
}
