/*
 * cpu_backend.c — the CPU backend context and the tg_ops_cpu table.
 *
 * The context only holds scratch: one slab per OpenMP thread, grown when an
 * op needs more than it has, so a warmed-up backend never allocates. It is
 * not shared between threads (tg_ops.h: one backend context per thread).
 */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "kernels/cpu/cpu_internal.h"

const struct tg_ops tg_ops_cpu = {
    .name = "cpu",
    .embedding = cpu__embedding,
    .embedding_bf16 = cpu__embedding_bf16,
    .rmsnorm = cpu__rmsnorm,
    .add = cpu__add,
    .gemm = cpu__gemm,
    .gemm_bf16 = cpu__gemm_bf16,
    .silu_mul = cpu__silu_mul,
    .rope = cpu__rope,
    .attn_chunk = cpu__attn_chunk,
    .attn_decode = cpu__attn_decode,
    .score = cpu__score,
    .select_topk = cpu__select_topk,
    .kv_append = cpu__kv_append,
    .logprobs = cpu__logprobs,
    .logprobs_top = cpu__logprobs_top,
    .sample = cpu__sample,
    .logits_mask = cpu__logits_mask,
};

static enum tg_cpu_isa detected;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

/* The levels of x86-64 psABI that GCC's target_clones resolver tests for
 * the CPU_CLONES loops, so both kinds of code run at one level. clang 14
 * knows no level names: there the features one by one, those its builtin
 * knows (not f16c) and the hand-written kernels use (cpu_gemv.c: avx2,
 * fma; avx512f/bw/dq/vl); its build has no clones. */
static void detect(void)
{
    detected = TG_CPU_ISA_GENERIC;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
#if defined(__clang__)
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi2");
    int v4 = v3 && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#else
    int v3 = __builtin_cpu_supports("x86-64-v3");
    int v4 = __builtin_cpu_supports("x86-64-v4");
#endif
    if (v4)
        detected = TG_CPU_ISA_AVX512;
    else if (v3)
        detected = TG_CPU_ISA_AVX2;
#endif
}

enum tg_cpu_isa tg_cpu_isa_detect(void)
{
    pthread_once(&detect_once, detect);
    return detected;
}

const char *tg_cpu_isa_name(enum tg_cpu_isa isa)
{
    switch (isa) {
    case TG_CPU_ISA_AVX512: return "avx512";
    case TG_CPU_ISA_AVX2: return "avx2";
    default: return "generic";
    }
}

enum tg_cpu_isa tg_backend_cpu_isa(const struct tg_backend *b)
{
    return b->isa;
}

int tg_backend_cpu_set_isa(struct tg_backend *b, enum tg_cpu_isa isa)
{
    if (isa < TG_CPU_ISA_GENERIC || isa > tg_cpu_isa_detect())
        return TG_EUNSUPPORTED;
    b->isa = isa;
    return 0;
}

int tg_backend_cpu_set_gemv_rows(struct tg_backend *b, int rows)
{
    if (rows < 0 || rows > TG_CPU_GEMV_ROWS_MAX)
        return TG_EINVAL;
    b->gemv_rows = rows;
    return 0;
}

int tg_backend_cpu_new(int n_threads, struct tg_backend **out)
{
    *out = NULL;
    struct tg_backend *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return TG_ENOMEM;
    /* One pool: the ops split work over OpenMP's threads and call BLAS
     * from inside the team, so OpenBLAS's own threads stay idle. */
    openblas_set_num_threads(1);
    b->isa = tg_cpu_isa_detect();
    b->gemv_rows = TG_CPU_GEMV_ROWS;
    b->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    if (b->n_threads < 1)
        b->n_threads = 1;
    b->scratch = calloc((size_t)b->n_threads, sizeof(*b->scratch));
    if (b->scratch == NULL)
        goto fail;
    /* A small first slab covers the common shapes without a later regrow. */
    if (cpu__scratch_reserve(b, 64 * 1024) != 0)
        goto fail;
    *out = b;
    return 0;
fail:
    tg_backend_cpu_free(b);
    return TG_ENOMEM;
}

void tg_backend_cpu_free(struct tg_backend *b)
{
    if (b == NULL)
        return;
    if (b->scratch != NULL) {
        for (int t = 0; t < b->n_threads; t++)
            free(b->scratch[t]);
        free(b->scratch);
    }
    free(b->xsplit);
    free(b->pairs);
    free(b->counts);
    free(b->seen);
    free(b);
}

int cpu__scratch_reserve(struct tg_backend *b, size_t bytes)
{
    if (bytes <= b->scratch_bytes)
        return 0;
    /* Grow geometrically and keep 64-byte multiples for aligned_alloc. */
    size_t want = b->scratch_bytes * 2 > bytes ? b->scratch_bytes * 2 : bytes;
    want = (want + 63) & ~(size_t)63;
    void **fresh = calloc((size_t)b->n_threads, sizeof(*fresh));
    if (fresh == NULL)
        return TG_ENOMEM;
    for (int t = 0; t < b->n_threads; t++) {
        fresh[t] = aligned_alloc(64, want);
        if (fresh[t] == NULL) {
            for (int u = 0; u < t; u++)
                free(fresh[u]);
            free(fresh);
            return TG_ENOMEM;
        }
    }
    for (int t = 0; t < b->n_threads; t++) {
        free(b->scratch[t]);
        b->scratch[t] = fresh[t];
    }
    free(fresh);
    b->scratch_bytes = want;
    return 0;
}

void *cpu__scratch(struct tg_backend *b, int tid)
{
    TG_ASSERT(tid >= 0 && tid < b->n_threads);
    return b->scratch[tid];
}

int cpu__vocab_reserve(struct tg_backend *b, size_t len)
{
    if (len <= b->vocab_len)
        return 0;
    struct cpu_pair *p = malloc(len * sizeof(*p));
    int32_t *c = calloc(len, sizeof(*c));
    uint8_t *s = calloc(len, 1);
    if (p == NULL || c == NULL || s == NULL) {
        free(p);
        free(c);
        free(s);
        return TG_ENOMEM;
    }
    free(b->pairs);
    free(b->counts);
    free(b->seen);
    b->pairs = p;
    b->counts = c;
    b->seen = s;
    b->vocab_len = len;
    return 0;
}
