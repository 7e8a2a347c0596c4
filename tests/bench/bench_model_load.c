/*
 * bench_model_load.c — start-up weight loading (gpu_worker/model/gw_load.h), side
 * by side in one run, each variant in a child process of its own so its
 * peak resident set (VmHWM) is its alone:
 *
 *   read  the streaming loader with a sink that takes nothing: pread of
 *         every kept byte through the staging buffer, the ceiling of the
 *         two below;
 *   slab  the CUDA runtime's host path (gw_wslab_upload: bf16 kept as is,
 *         converted into two 16 MiB bounce buffers) with the device copy
 *         left out (with --verify, a checksum of every byte instead, then
 *         compared with tests/support/tt_wsum's plain-read reference);
 *   host  the CPU backend's load (gw_model_load_weights: fp32 per slice
 *         into the model's arrays).
 *
 * Each prints its seconds, GB/s of checkpoint bytes, its time over the read
 * variant's, its VmHWM and, for host, VmHWM minus the fp32 weights.
 * The checkpoint: --model DIR, or a model tangram-make-model writes into a
 * temporary directory from a Hugging Face config of the project
 * ($TANGRAM_DATA/configs/NAME, default Qwen--Qwen3-0.6B_config.json) with
 * random weights (--layers N overrides its depth), removed at exit. The
 * file is in the page cache after being written: the numbers are the
 * loader's, not a cold disk's.
 *
 * usage: bench-model-load [--quick] [--model DIR | --config NAME]
 *            [--layers N] [--only read|slab|host] [--tp T --rank R]
 *            [--staging-mib N] [--verify] [--max-hwm-mib N]
 *            [--max-over-mib N]
 *   --quick          a tiny generated model, every variant, --verify (the
 *                    ctest run)
 *   --verify         slab: checksums against the plain-read reference
 *   --max-hwm-mib N  exit 1 when read's or slab's VmHWM exceeds N MiB
 *   --max-over-mib N exit 1 when host's VmHWM exceeds its fp32 weights by
 *                    more than N MiB
 * Exit status 0, 1 (a failed load, check or bound), 2 (bad usage).
 */
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/model/st_safetensors.h"
#include "gpu_worker/model/gw_load.h"
#include "gpu_worker/model/gw_model.h"
#include "gpu_worker/cuda/gw_wslab.h"
#include "tests/support/tt_support.h"
#include "tests/support/tt_wsum.h"

#define PROG "bench-model-load"
#define BOUNCE ((size_t)16 << 20) /* as GW_CUDA_BOUNCE_BYTES */
#define MIB (1024.0 * 1024.0)

enum variant { V_READ, V_SLAB, V_HOST, V_COUNT };
static const char *const vname[V_COUNT] = {"read", "slab", "host"};

struct opts {
    const char *model, *config;
    int layers, tp, rank, verify, quick;
    size_t staging;
    int only;              /* -1: all */
    long max_hwm, max_over; /* MiB; -1: none */
};

/* What a child reports through its pipe. */
struct result {
    int ok;
    double seconds;
    uint64_t bytes;        /* checkpoint bytes read */
    int64_t hwm;           /* VmHWM after the load, bytes */
    int64_t weights;       /* host: the fp32 weights' bytes */
    int verified;          /* slab with --verify: 1 equal, 0 not */
};

static int nothing(void *ctx, const struct gw_load_slice *s, char *err,
                   size_t errlen)
{
    (void)ctx;
    (void)s;
    (void)err;
    (void)errlen;
    return 0;
}

static int no_copy(void *ctx, uint64_t dst, const void *src, size_t bytes,
                   int buf, char *err, size_t errlen)
{
    (void)ctx;
    (void)dst;
    (void)src;
    (void)bytes;
    (void)buf;
    (void)err;
    (void)errlen;
    return 0;
}

/* The shard of rank r of T: heads in model order, r's block of them. */
static int *head_block(const char *dir, int T, int r)
{
    struct gw_model m;
    char err[512];
    if (gw_model_open(&m, dir, NULL, err, sizeof(err)) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return NULL;
    }
    int L = m.n_layers, Hl = m.n_kv_heads / T;
    gw_model_free(&m);
    int *map = malloc((size_t)L * (size_t)Hl * sizeof(int) + 1);
    for (int l = 0; map != NULL && l < L; l++)
        for (int i = 0; i < Hl; i++)
            map[l * Hl + i] = r * Hl + i;
    return map;
}

/* One variant, in the child. */
static void run_variant(enum variant v, const struct opts *o, const char *dir,
                        struct result *res)
{
    char err[512];
    memset(res, 0, sizeof(*res));
    int *map = o->tp > 1 ? head_block(dir, o->tp, o->rank) : NULL;
    struct gw_shard sh = {.rank = o->rank, .world = o->tp, .kv_heads = map};
    struct gw_model m;
    double t0 = tt_now_s();
    if (v == V_HOST) {
        int rc = gw_model_load_shard(&m, dir, &sh, err, sizeof(err));
        res->seconds = tt_now_s() - t0;
        res->hwm = tt_vm_hwm();
        if (rc != 0) {
            fprintf(stderr, PROG ": host: %s\n", err);
            free(map);
            return;
        }
        res->bytes = m.load.bytes;
        res->weights = (int64_t)m.slab_bytes;
        res->ok = 1;
        gw_model_free(&m);
        free(map);
        return;
    }
    struct gw_wslab slab = {0};
    struct gw_load_plan plan = {0};
    struct st_model st = {0};
    struct tt_wsum sum = {0}, ref = {0};
    void *b0 = NULL, *b1 = NULL;
    int rc = gw_model_open(&m, dir, &sh, err, sizeof(err));
    if (rc == 0)
        rc = gw_wslab_init(&slab, &m, err, sizeof(err));
    if (rc == 0)
        rc = gw_model_load_plan(&plan, &m, gw_wslab_tied_head(&m), err,
                                sizeof(err));
    if (rc == 0)
        rc = st_model_open(&st, dir, err, sizeof(err));
    if (rc == 0)
        rc = gw_load_plan_bind(&plan, &st, err, sizeof(err));
    if (rc == 0 && o->verify && v == V_SLAB &&
        (tt_wsum_init(&sum, &slab, &plan) != 0 || tt_wsum_init(&ref, &slab, &plan) != 0))
        rc = -1;
    struct gw_load_stats stats;
    if (rc == 0 && v == V_READ) {
        struct gw_load_sink sink = {.upload = nothing, .ctx = NULL};
        rc = gw_load_run(&plan, &st, o->staging, &sink, &stats, err, sizeof(err));
    } else if (rc == 0) {
        b0 = malloc(BOUNCE);
        b1 = malloc(BOUNCE);
        struct gw_wslab_upload up = {
            .slab = &slab, .bounce = {b0, b1}, .bounce_bytes = BOUNCE,
            .out = {o->verify ? tt_wsum_copy : no_copy, NULL, &sum}};
        struct gw_load_sink sink = {.upload = gw_wslab_upload, .ctx = &up};
        rc = b0 == NULL || b1 == NULL ? -1
                                      : gw_load_run(&plan, &st, o->staging, &sink,
                                                    &stats, err, sizeof(err));
        if (rc == 0)
            rc = gw_wslab_upload_finish(&up, err, sizeof(err));
    }
    res->seconds = tt_now_s() - t0;
    res->hwm = tt_vm_hwm(); /* before the reference reads anything */
    if (rc != 0) {
        fprintf(stderr, PROG ": %s: %s\n", vname[v], rc == -1 ? "out of memory" : err);
    } else {
        res->bytes = stats.bytes;
        res->ok = 1;
        if (o->verify && v == V_SLAB) {
            res->verified = tt_wsum_reference(&ref, &st) == 0 &&
                            tt_wsum_diff(&sum, &ref) == 0 && sum.bytes == ref.bytes;
            res->ok = res->verified;
        }
    }
    free(b0);
    free(b1);
    tt_wsum_free(&sum);
    tt_wsum_free(&ref);
    st_model_close(&st);
    gw_load_plan_free(&plan);
    gw_wslab_free(&slab);
    gw_model_free(&m);
    free(map);
}

/* Runs v in a child; 0 with *res filled, or -1. */
static int fork_variant(enum variant v, const struct opts *o, const char *dir,
                        struct result *res)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fd[0]);
        struct result r;
        run_variant(v, o, dir, &r);
        ssize_t w = write(fd[1], &r, sizeof(r));
        _exit(w == (ssize_t)sizeof(r) ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got = read(fd[0], res, sizeof(*res));
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return got == (ssize_t)sizeof(*res) && WIFEXITED(st) && WEXITSTATUS(st) == 0
               ? 0
               : -1;
}

/* tangram-make-model's flags for a Hugging Face config (Qwen3, Qwen2,
 * Llama, Mistral), the depth overridden by layers > 0. argv (cap + 1
 * entries) gets pointers into store (cap values of ARG_BYTES: flags and
 * numbers) and tok (tok_cap bytes: the tokenizer's path, which is as long
 * as the checkout's). A value that does not fit is an error naming it,
 * never a cut one. Returns the count or -1. */
#define ARG_BYTES 64
static int config_flags(const char *path, int layers, const char **argv,
                        char (*store)[ARG_BYTES], int cap, char *tok,
                        size_t tok_cap)
{
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    if (c == NULL) {
        fprintf(stderr, PROG ": %s: %s\n", path, je.text);
        return -1;
    }
    const char *arch = json_string_value(json_array_get(json_object_get(c, "architectures"), 0));
    static const char *const archs[][3] = {
        {"Qwen3ForCausalLM", "qwen3", "tokenizers/qwen3"},
        {"Qwen2ForCausalLM", "qwen2", "tokenizers/qwen2.5"},
        {"LlamaForCausalLM", "llama", "tokenizers/llama3"},
        {"MistralForCausalLM", "mistral", "tokenizers/llama3"}};
    int a = -1;
    for (int i = 0; i < 4 && arch != NULL; i++)
        if (strcmp(arch, archs[i][0]) == 0)
            a = i;
    if (a < 0) {
        fprintf(stderr, PROG ": %s: architecture %s is not generated\n", path,
                arch ? arch : "(none)");
        json_decref(c);
        return -1;
    }
    int n = 0, k = 0;
#define ARG(...)                                                            \
    do {                                                                    \
        int w_ = k < cap ? snprintf(store[k], ARG_BYTES, __VA_ARGS__) : -1; \
        if (w_ < 0 || w_ >= ARG_BYTES) {                                    \
            fprintf(stderr, PROG ": %s: flag %d does not fit %d bytes\n",   \
                    path, n + 1, ARG_BYTES);                                \
            json_decref(c);                                                 \
            return -1;                                                      \
        }                                                                   \
        argv[n++] = store[k++];                                             \
    } while (0)
    long long hidden = json_integer_value(json_object_get(c, "hidden_size"));
    long long heads = json_integer_value(json_object_get(c, "num_attention_heads"));
    json_t *hd = json_object_get(c, "head_dim");
    json_t *rs = json_object_get(c, "rope_scaling");
    ARG("--arch");
    ARG("%s", archs[a][1]);
    ARG("--tokenizer");
    tt_data_path(archs[a][2], tok, tok_cap); /* whole, or the program ends */
    argv[n++] = tok;
    ARG("--hidden");
    ARG("%lld", hidden);
    ARG("--layers");
    ARG("%lld", layers > 0 ? (long long)layers
                           : json_integer_value(json_object_get(c, "num_hidden_layers")));
    ARG("--heads");
    ARG("%lld", heads);
    ARG("--kv-heads");
    ARG("%lld", json_integer_value(json_object_get(c, "num_key_value_heads")));
    ARG("--head-dim");
    ARG("%lld", json_is_integer(hd) ? json_integer_value(hd) : hidden / heads);
    ARG("--ffn");
    ARG("%lld", json_integer_value(json_object_get(c, "intermediate_size")));
    ARG("--rope-theta");
    ARG("%.17g", json_number_value(json_object_get(c, "rope_theta")));
    ARG("--rms-eps");
    ARG("%.17g", json_number_value(json_object_get(c, "rms_norm_eps")));
    ARG("--max-position");
    ARG("%lld", json_integer_value(json_object_get(c, "max_position_embeddings")));
    if (json_is_true(json_object_get(c, "tie_word_embeddings")))
        ARG("--tie");
    if (json_is_object(rs) && json_is_number(json_object_get(rs, "factor"))) {
        ARG("--rope-scaling-llama3");
        ARG("%.17g", json_number_value(json_object_get(rs, "factor")));
        ARG("--rope-original-max");
        ARG("%lld", json_integer_value(
                        json_object_get(rs, "original_max_position_embeddings")));
    }
#undef ARG
    json_decref(c);
    argv[n] = NULL;
    return n;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: " PROG " [--quick] [--model DIR | --config NAME] "
            "[--layers N] [--only read|slab|host] [--tp T --rank R] "
            "[--staging-mib N] [--verify] [--max-hwm-mib N] "
            "[--max-over-mib N]\n");
    return 2;
}

static int parse(struct opts *o, int argc, char **argv)
{
    *o = (struct opts){.config = "Qwen--Qwen3-0.6B_config.json", .tp = 1,
                       .only = -1, .max_hwm = -1, .max_over = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        long n = v != NULL ? strtol(v, &end, 10) : 0;
        int num_ok = v != NULL && end != v && *end == '\0' && n >= 0;
        if (strcmp(a, "--quick") == 0) {
            o->quick = o->verify = 1;
        } else if (strcmp(a, "--bench") == 0) {
            /* the full run, the default */
        } else if (strcmp(a, "--verify") == 0) {
            o->verify = 1;
        } else if (strcmp(a, "--model") == 0 && v != NULL) {
            o->model = v;
            i++;
        } else if (strcmp(a, "--config") == 0 && v != NULL) {
            o->config = v;
            i++;
        } else if (strcmp(a, "--only") == 0 && v != NULL) {
            o->only = -2;
            for (int k = 0; k < V_COUNT; k++)
                if (strcmp(v, vname[k]) == 0)
                    o->only = k;
            if (o->only == -2)
                return usage();
            i++;
        } else if (num_ok && strcmp(a, "--layers") == 0 && n >= 1) {
            o->layers = (int)n;
            i++;
        } else if (num_ok && strcmp(a, "--tp") == 0 && n >= 1) {
            o->tp = (int)n;
            i++;
        } else if (num_ok && strcmp(a, "--rank") == 0) {
            o->rank = (int)n;
            i++;
        } else if (num_ok && strcmp(a, "--staging-mib") == 0 && n >= 1) {
            o->staging = (size_t)n << 20;
            i++;
        } else if (num_ok && strcmp(a, "--max-hwm-mib") == 0) {
            o->max_hwm = n;
            i++;
        } else if (num_ok && strcmp(a, "--max-over-mib") == 0) {
            o->max_over = n;
            i++;
        } else {
            return usage();
        }
    }
    if (o->rank >= o->tp)
        return usage();
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* rows between the children's logs */
    struct opts o;
    int rc = parse(&o, argc, argv);
    if (rc != 0)
        return rc;
    char tmp[PATH_MAX] = "", dir[PATH_MAX];
    if (o.model != NULL) {
        tt_path(dir, sizeof(dir), "%s", o.model);
    } else {
        if (tt_tmpdir_make("tg_bench_model_load.", tmp, sizeof(tmp)) != 0) {
            fprintf(stderr, PROG ": cannot make a temporary directory\n");
            return 1;
        }
        tt_path(dir, sizeof(dir), "%s/model", tmp);
        const char *args[49];
        char store[48][ARG_BYTES], path[PATH_MAX], tok[PATH_MAX];
        static const char *const tiny[] = {
            "--arch", "qwen3", "--hidden", "64", "--layers", "2", "--heads",
            "4", "--kv-heads", "2", "--head-dim", "16", "--ffn", "256", NULL};
        const char *const *use = tiny;
        if (!o.quick) {
            char rel[PATH_MAX];
            tt_path(rel, sizeof(rel), "configs/%s", o.config);
            tt_data_path(rel, path, sizeof(path));
            if (config_flags(path, o.layers, args, store, 48, tok,
                             sizeof(tok)) < 0) {
                tt_tmpdir_remove(tmp);
                return 1;
            }
            use = args;
        }
        printf("# writing the checkpoint (tangram-make-model%s%s)...\n",
               o.quick ? ", tiny" : " from ", o.quick ? "" : o.config);
        fflush(stdout);
        double t0 = tt_now_s();
        if (tt_make_model(dir, use) != 0) {
            fprintf(stderr, PROG ": tangram-make-model failed\n");
            tt_tmpdir_remove(tmp);
            return 1;
        }
        printf("# written in %.1f s\n", tt_now_s() - t0);
    }
    struct gw_model shape;
    char err[512];
    if (gw_model_open(&shape, dir, NULL, err, sizeof(err)) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        tt_tmpdir_remove(tmp);
        return 1;
    }
    printf("# %s: %d layers, hidden %d, heads %d/%d x %d, ffn %d, vocab %d%s; "
           "rank %d of %d; staging %zu MiB\n", dir, shape.n_layers,
           shape.hidden, shape.n_q_heads, shape.n_kv_heads, shape.head_dim,
           shape.ffn, shape.vocab, shape.tied ? ", tied" : "", o.rank, o.tp,
           (o.staging > 0 ? o.staging : GW_LOAD_STAGING_DEFAULT) >> 20);
    gw_model_free(&shape);
    printf("%-6s %9s %8s %9s %11s %15s %s\n", "sink", "seconds", "GB/s",
           "vs read", "VmHWM MiB", "over fp32 MiB", "check");
    int status = 0;
    double t_read = 0;
    for (int v = 0; v < V_COUNT; v++) {
        if (o.only >= 0 && o.only != v)
            continue;
        struct result r;
        if (fork_variant((enum variant)v, &o, dir, &r) != 0 || !r.ok) {
            printf("%-6s failed%s\n", vname[v],
                   o.verify && v == V_SLAB ? " (or differs from the reference)" : "");
            status = 1;
            continue;
        }
        if (v == V_READ)
            t_read = r.seconds;
        char ratio[32] = "-", over[32] = "-";
        if (t_read > 0 && v != V_READ)
            snprintf(ratio, sizeof(ratio), "%.2fx", r.seconds / t_read);
        if (v == V_HOST)
            snprintf(over, sizeof(over), "%.0f", (double)(r.hwm - r.weights) / MIB);
        printf("%-6s %9.3f %8.2f %9s %11.0f %15s %s\n", vname[v], r.seconds,
               r.seconds > 0 ? (double)r.bytes / 1e9 / r.seconds : 0.0, ratio,
               (double)r.hwm / MIB, over,
               o.verify && v == V_SLAB ? "checksums equal the plain read" : "");
        if (o.max_hwm >= 0 && v != V_HOST && (double)r.hwm / MIB > (double)o.max_hwm) {
            printf("FAIL: %s peaked at %.0f MiB, over the %ld MiB bound\n",
                   vname[v], (double)r.hwm / MIB, o.max_hwm);
            status = 1;
        }
        if (o.max_over >= 0 && v == V_HOST &&
            (double)(r.hwm - r.weights) / MIB > (double)o.max_over) {
            printf("FAIL: host peaked %.0f MiB over its fp32 weights, over the "
                   "%ld MiB bound\n", (double)(r.hwm - r.weights) / MIB, o.max_over);
            status = 1;
        }
    }
    tt_tmpdir_remove(tmp);
    return status;
}
