/* test_nccl_comm.c — the NCCL wrapper (kernels/cuda/nccl_comm.h):
 *  - argument errors and an init on a device that does not exist, which
 *    need no device (in a CUDA build they run even without one, then the
 *    program reports skipped (77));
 *  - one rank: a unique id, init of a 1-rank communicator, in-place
 *    all-reduce as the identity on fp32 and bf16, all-gather as a copy,
 *    count 0, capture of an all-reduce in a CUDA graph, check, free;
 *  - a peer that never arrives: rank 0 of a 2-rank communicator alone
 *    returns TG_ETIMEDOUT after about timeout_ms instead of hanging;
 *  - two ranks (only with >= 2 devices, else skipped inside the test):
 *    the parent makes the id and fork()s two children that exec this
 *    program as ranks 0 and 1 (a fresh image, since CUDA does not survive
 *    fork in a process that already initialised it); each checks sums and
 *    gathers of exactly representable values on fp32 and bf16.
 * Built without CUDA: skipped (77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_cuda.h"
#include "tests/support/tt_support.h"
#ifdef TANGRAM_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/nccl_comm.h"
#endif

#ifdef TANGRAM_CUDA
static const char child_flag[] = "--nccl-child";

static void hex_encode(const uint8_t *id, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < TG_NCCL_ID_BYTES; i++) {
        hex[2 * i] = digits[id[i] >> 4];
        hex[2 * i + 1] = digits[id[i] & 15];
    }
    hex[2 * TG_NCCL_ID_BYTES] = '\0';
}

static int hex_decode(const char *hex, uint8_t *id)
{
    if (strlen(hex) != 2 * TG_NCCL_ID_BYTES)
        return -1;
    for (int i = 0; i < 2 * TG_NCCL_ID_BYTES; i++) {
        char c = hex[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return -1;
        if (i % 2 == 0)
            id[i / 2] = (uint8_t)(v << 4);
        else
            id[i / 2] |= (uint8_t)v;
    }
    return 0;
}

/* ---- argument errors (no device needed) --------------------------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    char err[256];
    uint8_t id[TG_NCCL_ID_BYTES];
    memset(id, 0, sizeof(id));
    struct tg_nccl *c = (struct tg_nccl *)(uintptr_t)0x1; /* must be reset */
    void *fb = (void *)(uintptr_t)0x1000;

    assert_int_equal(tg_nccl_unique_id(NULL, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_nccl_init(NULL, id, 0, 1, 0, 1000, err, sizeof(err)),
                     TG_EINVAL);
    struct { int rank, world, device, timeout_ms; } bad[] = {
        {0, 0, 0, 1000},  /* world < 1 */
        {-1, 2, 0, 1000}, /* rank < 0 */
        {2, 2, 0, 1000},  /* rank >= world */
        {0, 1, -1, 1000}, /* device < 0 */
        {0, 1, 0, 0},     /* timeout < 1 */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        c = (struct tg_nccl *)(uintptr_t)0x1;
        err[0] = '\0';
        assert_int_equal(tg_nccl_init(&c, id, bad[i].rank, bad[i].world,
                                      bad[i].device, bad[i].timeout_ms, err,
                                      sizeof(err)), TG_EINVAL);
        assert_null(c);
        assert_true(strlen(err) > 0);
    }
    c = (struct tg_nccl *)(uintptr_t)0x1;
    assert_int_equal(tg_nccl_init(&c, NULL, 0, 1, 0, 1000, err, sizeof(err)),
                     TG_EINVAL);
    assert_null(c);

    /* A device that does not exist (none at all on a machine without one). */
    c = (struct tg_nccl *)(uintptr_t)0x1;
    double t0 = tt_now_s();
    assert_int_equal(tg_nccl_init(&c, id, 0, 1, 1000, 1000, err, sizeof(err)),
                     TG_ENODEV);
    assert_null(c);
    assert_true(tt_now_s() - t0 < 30.0);

    /* No communicator. */
    assert_int_equal(tg_nccl_allreduce_sum(NULL, fb, 8, 0, NULL, err,
                                           sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_nccl_allgather(NULL, fb, fb, 8, 1, NULL, err,
                                       sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_nccl_check(NULL, err, sizeof(err)), TG_EINVAL);
    assert_int_equal(tg_nccl_rank(NULL), -1);
    assert_int_equal(tg_nccl_world(NULL), -1);
    tg_nccl_free(NULL);
}

/* ---- one rank ----------------------------------------------------------- */

static void fill_pattern(float *f, uint16_t *b, size_t n, int salt)
{
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)((int)(i % 1000) - 500 + salt) * 0.25f;
        b[i] = st_f32_to_bf16((float)((int)(i % 64) - 32 + salt));
    }
}

static void test_world_one(void **state)
{
    (void)state;
    char err[256] = "";
    uint8_t id[TG_NCCL_ID_BYTES];
    memset(id, 0, sizeof(id));
    if (tg_nccl_unique_id(id, err, sizeof(err)) != 0)
        fail_msg("unique id: %s", err);
    int nonzero = 0;
    for (int i = 0; i < TG_NCCL_ID_BYTES; i++)
        nonzero |= id[i];
    assert_true(nonzero != 0);

    struct tg_nccl *c = NULL;
    if (tg_nccl_init(&c, id, 0, 1, 0, 30000, err, sizeof(err)) != 0)
        fail_msg("init world 1: %s", err);
    assert_non_null(c);
    assert_int_equal(tg_nccl_rank(c), 0);
    assert_int_equal(tg_nccl_world(c), 1);

    const size_t n = 4099; /* not a multiple of anything NCCL likes */
    float *hf = malloc(n * 4), *hf2 = malloc(n * 4);
    uint16_t *hb = malloc(n * 2), *hb2 = malloc(n * 2);
    assert_true(hf && hf2 && hb && hb2);
    fill_pattern(hf, hb, n, 0);
    float *df = tt_cuda_upload(hf, n * 4), *df2 = tt_cuda_alloc(n * 4);
    uint16_t *db = tt_cuda_upload(hb, n * 2), *db2 = tt_cuda_alloc(n * 2);
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking),
                     cudaSuccess);

    /* All-reduce of one rank: the identity. */
    if (tg_nccl_allreduce_sum(c, df, n, 0, st, err, sizeof(err)) != 0)
        fail_msg("all-reduce fp32: %s", err);
    if (tg_nccl_allreduce_sum(c, db, n, 1, st, err, sizeof(err)) != 0)
        fail_msg("all-reduce bf16: %s", err);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    tt_cuda_to_host(hf2, df, n * 4);
    tt_cuda_to_host(hb2, db, n * 2);
    assert_memory_equal(hf, hf2, n * 4);
    assert_memory_equal(hb, hb2, n * 2);

    /* All-gather of one rank: a copy. */
    assert_int_equal(cudaMemset(df2, 0, n * 4), cudaSuccess);
    assert_int_equal(cudaMemset(db2, 0, n * 2), cudaSuccess);
    if (tg_nccl_allgather(c, df, df2, n, 0, st, err, sizeof(err)) != 0)
        fail_msg("all-gather fp32: %s", err);
    if (tg_nccl_allgather(c, db, db2, n, 1, st, err, sizeof(err)) != 0)
        fail_msg("all-gather bf16: %s", err);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    tt_cuda_to_host(hf2, df2, n * 4);
    tt_cuda_to_host(hb2, db2, n * 2);
    assert_memory_equal(hf, hf2, n * 4);
    assert_memory_equal(hb, hb2, n * 2);

    /* Count 0 enqueues nothing (NULL buffers are then fine); a NULL buffer
     * with a count is refused without failing the communicator. */
    assert_int_equal(tg_nccl_allreduce_sum(c, NULL, 0, 0, st, err, sizeof(err)), 0);
    assert_int_equal(tg_nccl_allgather(c, NULL, NULL, 0, 1, st, err, sizeof(err)), 0);
    assert_int_equal(tg_nccl_allreduce_sum(c, NULL, 8, 0, st, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tg_nccl_allgather(c, df, NULL, 8, 0, st, err, sizeof(err)),
                     TG_EINVAL);
    assert_int_equal(tg_nccl_check(c, err, sizeof(err)), 0);

    /* Captured in a CUDA graph (thread-local mode, as the header advises;
     * the eager all-reduce above set up the connections) and replayed
     * twice: still the identity. */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_int_equal(cudaStreamBeginCapture(st,
                                            cudaStreamCaptureModeThreadLocal),
                     cudaSuccess);
    int rc = tg_nccl_allreduce_sum(c, df, n, 0, st, err, sizeof(err));
    assert_int_equal(cudaStreamEndCapture(st, &graph), cudaSuccess);
    if (rc != 0)
        fail_msg("all-reduce under capture: %s", err);
    assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    tt_cuda_to_host(hf2, df, n * 4);
    assert_memory_equal(hf, hf2, n * 4);
    assert_int_equal(tg_nccl_check(c, err, sizeof(err)), 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    tg_nccl_free(c);
    cudaStreamDestroy(st);
    cudaFree(df);
    cudaFree(df2);
    cudaFree(db);
    cudaFree(db2);
    free(hf);
    free(hf2);
    free(hb);
    free(hb2);
}

/* ---- a peer that never arrives ------------------------------------------ */

static void test_peer_timeout(void **state)
{
    (void)state;
    char err[256] = "";
    uint8_t id[TG_NCCL_ID_BYTES];
    if (tg_nccl_unique_id(id, err, sizeof(err)) != 0)
        fail_msg("unique id: %s", err);
    struct tg_nccl *c = (struct tg_nccl *)(uintptr_t)0x1;
    const int timeout_ms = 1500;
    double t0 = tt_now_s();
    int rc = tg_nccl_init(&c, id, 0, 2, 0, timeout_ms, err, sizeof(err));
    double dt = tt_now_s() - t0;
    printf("alone in a 2-rank communicator: %s after %.2f s (%s)\n",
           tg_err_name(rc), dt, err);
    assert_int_equal(rc, TG_ETIMEDOUT);
    assert_null(c);
    assert_true(dt >= timeout_ms * 1e-3 * 0.9);
    assert_true(dt < timeout_ms * 1e-3 + 20.0); /* the abort did not hang */
}

/* ---- two ranks, two processes ------------------------------------------- */

/* One rank of the 2-rank test; returns the process exit code. */
static int child_main(int rank, const char *hex)
{
    uint8_t id[TG_NCCL_ID_BYTES];
    char err[256] = "";
    if (hex_decode(hex, id) != 0) {
        fprintf(stderr, "rank %d: bad id\n", rank);
        return 2;
    }
    struct tg_nccl *c = NULL;
    if (tg_nccl_init(&c, id, rank, 2, rank, 60000, err, sizeof(err)) != 0) {
        fprintf(stderr, "rank %d: init: %s\n", rank, err);
        return 1;
    }
    const size_t n = 4099;
    float *hf = malloc(2 * n * 4);
    uint16_t *hb = malloc(2 * n * 2);
    float *df = NULL, *dg = NULL;
    uint16_t *db = NULL, *dgb = NULL;
    int bad = hf == NULL || hb == NULL;
    bad |= cudaMalloc((void **)&df, n * 4) != cudaSuccess;
    bad |= cudaMalloc((void **)&dg, 2 * n * 4) != cudaSuccess;
    bad |= cudaMalloc((void **)&db, n * 2) != cudaSuccess;
    bad |= cudaMalloc((void **)&dgb, 2 * n * 2) != cudaSuccess;
    if (bad) {
        fprintf(stderr, "rank %d: allocation failed\n", rank);
        return 1;
    }
    /* Sums of small integers (times 1/4) are exact in fp32 and bf16. */
    for (size_t i = 0; i < n; i++) {
        hf[i] = (float)((rank + 1) * (int)(i % 100)) * 0.25f;
        hb[i] = st_f32_to_bf16((float)(rank + 1 + (int)(i % 7)));
    }
    cudaMemcpy(df, hf, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, n * 2, cudaMemcpyHostToDevice);
    int rc = tg_nccl_allreduce_sum(c, df, n, 0, NULL, err, sizeof(err));
    if (rc == 0)
        rc = tg_nccl_allreduce_sum(c, db, n, 1, NULL, err, sizeof(err));
    if (rc != 0 || cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "rank %d: all-reduce: %s\n", rank, err);
        return 1;
    }
    cudaMemcpy(hf, df, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb, db, n * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) {
        float ef = (float)(3 * (int)(i % 100)) * 0.25f; /* (1 + 2) * x */
        float eb = (float)(3 + 2 * (int)(i % 7));
        if (hf[i] != ef || st_bf16_to_f32(hb[i]) != eb) {
            fprintf(stderr, "rank %d: all-reduce [%zu]: %g / %g, want %g / "
                    "%g\n", rank, i, (double)hf[i],
                    (double)st_bf16_to_f32(hb[i]), (double)ef, (double)eb);
            return 1;
        }
    }
    /* All-gather: rank r contributes r * 10000 + i. */
    for (size_t i = 0; i < n; i++) {
        hf[i] = (float)(rank * 10000 + (int)i);
        hb[i] = st_f32_to_bf16((float)(rank * 8 + (int)(i % 8)));
    }
    cudaMemcpy(df, hf, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, n * 2, cudaMemcpyHostToDevice);
    rc = tg_nccl_allgather(c, df, dg, n, 0, NULL, err, sizeof(err));
    if (rc == 0)
        rc = tg_nccl_allgather(c, db, dgb, n, 1, NULL, err, sizeof(err));
    if (rc != 0 || cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "rank %d: all-gather: %s\n", rank, err);
        return 1;
    }
    cudaMemcpy(hf, dg, 2 * n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb, dgb, 2 * n * 2, cudaMemcpyDeviceToHost);
    for (int r = 0; r < 2; r++)
        for (size_t i = 0; i < n; i++) {
            float ef = (float)(r * 10000 + (int)i);
            float eb = (float)(r * 8 + (int)(i % 8));
            if (hf[r * n + i] != ef || st_bf16_to_f32(hb[r * n + i]) != eb) {
                fprintf(stderr, "rank %d: all-gather [%d][%zu] wrong\n", rank,
                        r, i);
                return 1;
            }
        }
    if (tg_nccl_check(c, err, sizeof(err)) != 0) {
        fprintf(stderr, "rank %d: check: %s\n", rank, err);
        return 1;
    }
    tg_nccl_free(c);
    cudaFree(df);
    cudaFree(dg);
    cudaFree(db);
    cudaFree(dgb);
    free(hf);
    free(hb);
    return 0;
}

static void test_two_ranks(void **state)
{
    (void)state;
    int n_dev = 0;
    if (tg_cuda_device_count(&n_dev) != 0 || n_dev < 2) {
        printf("two-rank test skipped: %d CUDA device(s), needs 2\n", n_dev);
        skip();
    }
    char err[256] = "";
    uint8_t id[TG_NCCL_ID_BYTES];
    /* The id's bootstrap root runs in this process, which outlives both
     * ranks. */
    if (tg_nccl_unique_id(id, err, sizeof(err)) != 0)
        fail_msg("unique id: %s", err);
    char hex[2 * TG_NCCL_ID_BYTES + 1];
    hex_encode(id, hex);
    /* Everything the children need is built before fork: between fork
     * and exec a child of this multi-threaded process only calls
     * async-signal-safe functions. */
    char ranks[2][2] = {"0", "1"};
    char *const argv0[] = {(char *)"test_nccl_comm", (char *)child_flag,
                           ranks[0], hex, NULL};
    char *const argv1[] = {(char *)"test_nccl_comm", (char *)child_flag,
                           ranks[1], hex, NULL};
    pid_t pids[2];
    fflush(NULL);
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            execv("/proc/self/exe", r == 0 ? argv0 : argv1);
            _exit(127);
        }
    }
    int status[2] = {-1, -1}, done = 0;
    double t0 = tt_now_s();
    while (done < 2 && tt_now_s() - t0 < 120.0) {
        for (int r = 0; r < 2; r++) {
            if (status[r] != -1)
                continue;
            int s = 0;
            if (waitpid(pids[r], &s, WNOHANG) == pids[r]) {
                status[r] = s;
                done++;
            }
        }
        usleep(10000);
    }
    for (int r = 0; r < 2; r++)
        if (status[r] == -1) { /* hung: kill our own child, then reap it */
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &status[r], 0);
            fail_msg("rank %d did not finish within 120 s", r);
        }
    for (int r = 0; r < 2; r++)
        if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0)
            fail_msg("rank %d failed (status 0x%x)", r, status[r]);
}
#endif

int main(int argc, char **argv)
{
#ifdef TANGRAM_CUDA
    if (argc == 4 && strcmp(argv[1], child_flag) == 0)
        return child_main(atoi(argv[2]), argv[3]);
    /* Argument checks run everywhere: they never need a device. */
    const struct CMUnitTest host_tests[] = {
        cmocka_unit_test(test_bad_arguments),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_one),
        cmocka_unit_test(test_peer_timeout),
        cmocka_unit_test(test_two_ranks),
    };
    return tt_cuda_run_tests("nccl_args", host_tests, TT_COUNT(host_tests),
                             "no CUDA device: device tests skipped",
                             "nccl_device", tests, TT_COUNT(tests));
#else
    (void)argc;
    (void)argv;
    return tt_cuda_skip("built without CUDA");
#endif
}
