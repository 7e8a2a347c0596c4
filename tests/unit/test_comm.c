/* test_comm.c — gw_comm, the shared-memory all-reduce and gather: T = 2
 * and 3 forked ranks all-reduce random vectors (sizes from 1 to beyond one
 * slot) many times and each gets, bit for bit, the serial sum in rank
 * order, with a gather onto rank 0 between every two all-reduces that
 * puts every rank's vector in rank order (also beyond one slot); world 1
 * is a no-op (gather: a copy); a peer that never arrives (at join or in a
 * later call, all-reduce or gather, rank 0 or not) gives TG_ETIMEDOUT
 * within the timeout; mismatched world sizes do not join; bad arguments
 * are refused; free is safe on a zeroed comm; group ids carry the pid and
 * differ per call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "gpu_worker/cpu/gw_comm.h"

#define SLOT 1000 /* floats per slot: vectors up to 2.5 slots get chunked */
#define ITERS 200

static char errbuf[512];

static void comm_name(char *out, size_t len, const char *tag)
{
    static unsigned serial;
    snprintf(out, len, "/tangram-test-%d-%s-%u", (int)getpid(), tag, serial++);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A stuck peer's life: far beyond every bound below, so that a wait that
 * ends only when the peer goes is told from one that ends on its own
 * timeout. end_stuck_peer kills it. */
#define STUCK_S 60
/* How late a timed wait may end: a loaded 2-core machine under ctest -j4
 * and ASan can keep a process off the CPU for a second or more, so the
 * bound is generous; what it must catch (a wait that ignores its timeout,
 * or lasts until the peer goes) takes STUCK_S or forever. */
#define SLACK_S 10.0
/* The timeout of the calls whose second, failed-already attempt must not
 * wait again: a wait lasts at least this long, and no scheduling delay of
 * an immediate return comes near it. */
#define FAIL_TIMEOUT_MS 1500

/* A call that began at t0 ended on its own timeout of timeout_ms: not
 * earlier (10% for the clock's rounding), at most SLACK_S later. */
static void assert_timed_out(double t0, int timeout_ms)
{
    double dt = now_s() - t0;
    if (!(dt >= 0.9e-3 * timeout_ms && dt < 1e-3 * timeout_ms + SLACK_S))
        fail_msg("a wait with a timeout of %d ms took %.3f s", timeout_ms,
                 dt);
}

/* A call that began at t0 returned without waiting its timeout of
 * timeout_ms (as a call on a failed group must). */
static void assert_no_wait(double t0, int timeout_ms)
{
    double dt = now_s() - t0;
    if (!(dt < 1e-3 * timeout_ms))
        fail_msg("a call that must fail at once took %.3f s (its timeout "
                 "is %d ms)", dt, timeout_ms);
}

/* Kills a peer that sleeps STUCK_S and checks that it was still there,
 * stuck as meant, not gone early with an error. */
static void end_stuck_peer(pid_t pid)
{
    assert_int_equal(kill(pid, SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

/* Deterministic operand of `rank` in call `it`: any process can rebuild
 * every rank's vector. Values of mixed magnitude make the sum order matter. */
static void operand(float *x, size_t n, int rank, int it)
{
    uint64_t s = (uint64_t)rank * 0x9E3779B97F4A7C15ull + (uint64_t)it * 7919u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(s >> 11) / 9007199254740992.0 - 0.5;
        x[i] = (float)(u * ((i % 7 == 0) ? 1e4 : 1.0));
    }
}

static size_t iter_len(int it)
{
    static const size_t lens[] = {1, 7, 64, SLOT - 1, SLOT, SLOT + 1, 2500, 333};
    return lens[it % (int)(sizeof(lens) / sizeof(lens[0]))];
}

/* Body of one forked rank: returns the process exit status (0 = all good). */
static int rank_main(const char *name, int rank, int world)
{
    struct gw_comm c;
    char err[512];
    if (gw_comm_init(&c, name, rank, world, SLOT, 5000, err, sizeof(err)) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 10;
    }
    float *x = malloc(2500 * sizeof(float));
    float *want = malloc(2500 * sizeof(float));
    float *tmp = malloc(2500 * sizeof(float));
    float *all = malloc((size_t)world * 2500 * sizeof(float));
    int status = 0;
    for (int it = 0; it < ITERS && status == 0; it++) {
        size_t n = iter_len(it);
        operand(x, n, rank, it);
        operand(want, n, 0, it);
        for (int r = 1; r < world; r++) {
            operand(tmp, n, r, it);
            for (size_t i = 0; i < n; i++)
                want[i] += tmp[i];
        }
        if (gw_comm_allreduce_sum(&c, x, n) != 0)
            status = 11;
        else if (memcmp(x, want, n * sizeof(float)) != 0)
            status = 12;
        if (status != 0)
            break;
        /* A gather of another length between all-reduces: rank 0 gets
         * every rank's operand at recv + r * m; the others pass NULL. */
        size_t m = iter_len(it + 3);
        operand(x, m, rank, it + 1000);
        if (gw_comm_gather(&c, x, m, rank == 0 ? all : NULL) != 0) {
            status = 13;
            break;
        }
        for (int r = 0; rank == 0 && r < world && status == 0; r++) {
            operand(tmp, m, r, it + 1000);
            if (memcmp(all + (size_t)r * m, tmp, m * sizeof(float)) != 0)
                status = 14;
        }
    }
    free(x);
    free(want);
    free(tmp);
    free(all);
    gw_comm_free(&c);
    return status;
}

static void run_group(int world)
{
    char name[128];
    comm_name(name, sizeof(name), "group");
    pid_t pids[3];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(rank_main(name, r, world));
    }
    for (int r = 0; r < world; r++) {
        int st;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        assert_true(WIFEXITED(st));
        if (WEXITSTATUS(st) != 0)
            fprintf(stderr, "rank %d exited with %d\n", r, WEXITSTATUS(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    /* rank 0 removed the name */
    char path[200];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    assert_int_not_equal(access(path, F_OK), 0);
}

static void test_two_ranks(void **state)
{
    (void)state;
    run_group(2);
}

static void test_three_ranks(void **state)
{
    (void)state;
    run_group(3);
}

static void test_world_one_noop(void **state)
{
    (void)state;
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, NULL, 0, 1, 4, 100, errbuf, sizeof(errbuf)), 0);
    float x[3] = {1.5f, -2.0f, 3.25f};
    assert_int_equal(gw_comm_allreduce_sum(&c, x, 3), 0);
    assert_true(x[0] == 1.5f && x[1] == -2.0f && x[2] == 3.25f);
    assert_null(c.shm);
    gw_comm_free(&c);
}

static void test_gather_world_one(void **state)
{
    (void)state;
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, NULL, 0, 1, 4, 100, errbuf, sizeof(errbuf)), 0);
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {0};
    assert_int_equal(gw_comm_gather(&c, x, 6, y), 0); /* beyond one slot */
    assert_memory_equal(x, y, sizeof(x));
    assert_int_equal(gw_comm_gather(&c, x, 6, x), 0); /* in place */
    assert_int_equal(gw_comm_gather(&c, x, 6, NULL), TG_EINVAL);
    assert_int_equal(gw_comm_gather(&c, x, 0, NULL), 0);
    gw_comm_free(&c);
    /* a zeroed comm counts as one rank, like the all-reduce */
    struct gw_comm z;
    memset(&z, 0, sizeof(z));
    y[0] = 0;
    assert_int_equal(gw_comm_gather(&z, x, 1, y), 0);
    assert_true(y[0] == 1);
}

/* Rank 0 gathers while rank 1 (joined, alive) never calls: TG_ETIMEDOUT
 * within the timeout, then at once. */
static void test_gather_peer_missing(void **state)
{
    (void)state;
    char name[128];
    comm_name(name, sizeof(name), "gather-missing");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct gw_comm c;
        char err[256];
        if (gw_comm_init(&c, name, 1, 2, 16, 2000, err, sizeof(err)) != 0)
            _exit(10);
        float x[3] = {7, 8, 9};
        if (gw_comm_gather(&c, x, 3, NULL) != 0)
            _exit(11);
        sleep(STUCK_S);
        _exit(0); /* stuck: no further call */
    }
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, name, 0, 2, 16, FAIL_TIMEOUT_MS, errbuf,
                                  sizeof(errbuf)), 0);
    float x[3] = {1, 2, 3}, all[6];
    assert_int_equal(gw_comm_gather(&c, x, 3, all), 0);
    assert_true(all[0] == 1 && all[2] == 3 && all[3] == 7 && all[5] == 9);
    double t0 = now_s();
    assert_int_equal(gw_comm_gather(&c, x, 3, all), TG_ETIMEDOUT);
    assert_timed_out(t0, FAIL_TIMEOUT_MS);
    t0 = now_s();
    assert_int_equal(gw_comm_gather(&c, x, 3, all), TG_ETIMEDOUT);
    assert_int_equal(gw_comm_allreduce_sum(&c, x, 3), TG_ETIMEDOUT);
    assert_no_wait(t0, FAIL_TIMEOUT_MS);
    gw_comm_free(&c);
    end_stuck_peer(pid);
}

/* A rank > 0 waits in a gather until rank 0 has read its slot: a rank 0
 * that never gathers makes it time out in that call. */
static void test_gather_root_missing(void **state)
{
    (void)state;
    char name[128];
    comm_name(name, sizeof(name), "gather-root");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct gw_comm c;
        char err[256];
        if (gw_comm_init(&c, name, 0, 2, 16, 2000, err, sizeof(err)) != 0)
            _exit(10);
        sleep(STUCK_S);
        _exit(0); /* joined, then never gathers */
    }
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, name, 1, 2, 16, FAIL_TIMEOUT_MS, errbuf,
                                  sizeof(errbuf)), 0);
    float x[2] = {1, 2};
    double t0 = now_s();
    assert_int_equal(gw_comm_gather(&c, x, 2, NULL), TG_ETIMEDOUT);
    assert_timed_out(t0, FAIL_TIMEOUT_MS);
    t0 = now_s(); /* failed stays failed */
    assert_int_equal(gw_comm_gather(&c, x, 2, NULL), TG_ETIMEDOUT);
    assert_no_wait(t0, FAIL_TIMEOUT_MS);
    gw_comm_free(&c);
    end_stuck_peer(pid);
}

/* The last gather of a group: rank 1 leaves (free marks the group over)
 * as soon as its gather returns, while rank 2 arrives late. Nobody may
 * fail: rank 1's gather returns only once rank 0 has read every slot. */
static void test_gather_then_leave(void **state)
{
    (void)state;
    char name[128];
    comm_name(name, sizeof(name), "gather-leave");
    pid_t pid[3];
    for (int r = 1; r < 3; r++) {
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) {
            struct gw_comm c;
            char err[256];
            if (gw_comm_init(&c, name, r, 3, 16, 2000, err, sizeof(err)) != 0)
                _exit(10);
            if (r == 2)
                usleep(200000);
            float x[2] = {(float)r, (float)(10 * r)};
            int rc = gw_comm_gather(&c, x, 2, NULL);
            gw_comm_free(&c);
            _exit(rc == 0 ? 0 : 11);
        }
    }
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, name, 0, 3, 16, 2000, errbuf, sizeof(errbuf)), 0);
    float x[2] = {0, 0}, all[6];
    assert_int_equal(gw_comm_gather(&c, x, 2, all), 0);
    assert_true(all[2] == 1 && all[3] == 10 && all[4] == 2 && all[5] == 20);
    gw_comm_free(&c);
    for (int r = 1; r < 3; r++) {
        int st;
        assert_int_equal(waitpid(pid[r], &st, 0), pid[r]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

static void test_new_id(void **state)
{
    (void)state;
    char a[GW_COMM_ID_MAX], b[GW_COMM_ID_MAX], prefix[64];
    assert_int_equal(gw_comm_new_id(a, sizeof(a)), 0);
    assert_int_equal(gw_comm_new_id(b, sizeof(b)), 0);
    snprintf(prefix, sizeof(prefix), "/tangram-%d-", (int)getpid());
    assert_memory_equal(a, prefix, strlen(prefix));
    assert_int_equal(strlen(a), strlen(prefix) + 16);
    assert_null(strchr(a + 1, '/'));
    assert_string_not_equal(a, b);
    /* usable as a group name */
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, a, 0, 2, 4, 100, errbuf, sizeof(errbuf)),
                     TG_ETIMEDOUT);
    char small[8];
    assert_int_equal(gw_comm_new_id(small, sizeof(small)), TG_ETOOBIG);
    assert_string_equal(small, "");
}

static void test_peer_never_joins(void **state)
{
    (void)state;
    char name[128];
    comm_name(name, sizeof(name), "lonely");
    struct gw_comm c;
    double t0 = now_s();
    assert_int_equal(gw_comm_init(&c, name, 0, 2, 16, 300, errbuf, sizeof(errbuf)),
                     TG_ETIMEDOUT);
    assert_timed_out(t0, 300);
    assert_non_null(strstr(errbuf, "rank 1"));
    assert_null(c.shm);
    /* a non-zero rank without a rank 0 times out too, naming the reason */
    t0 = now_s();
    assert_int_equal(gw_comm_init(&c, name, 1, 2, 16, 300, errbuf, sizeof(errbuf)),
                     TG_ETIMEDOUT);
    assert_timed_out(t0, 300);
    assert_non_null(strstr(errbuf, "has not created"));
}

static void test_peer_stops_arriving(void **state)
{
    (void)state;
    char name[128];
    comm_name(name, sizeof(name), "stuck");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* rank 1: one all-reduce, then stays alive but never calls again */
        struct gw_comm c;
        char err[256];
        if (gw_comm_init(&c, name, 1, 2, 16, 2000, err, sizeof(err)) != 0)
            _exit(10);
        float x[4] = {1, 2, 3, 4};
        if (gw_comm_allreduce_sum(&c, x, 4) != 0)
            _exit(11);
        sleep(STUCK_S);
        _exit(0); /* without gw_comm_free: like a stuck or killed peer */
    }
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, name, 0, 2, 16, FAIL_TIMEOUT_MS, errbuf,
                                  sizeof(errbuf)), 0);
    float x[4] = {10, 20, 30, 40};
    assert_int_equal(gw_comm_allreduce_sum(&c, x, 4), 0);
    assert_true(x[0] == 11 && x[1] == 22 && x[2] == 33 && x[3] == 44);
    double t0 = now_s();
    assert_int_equal(gw_comm_allreduce_sum(&c, x, 4), TG_ETIMEDOUT);
    assert_timed_out(t0, FAIL_TIMEOUT_MS);
    /* a failed comm stays failed, immediately */
    t0 = now_s();
    assert_int_equal(gw_comm_allreduce_sum(&c, x, 4), TG_ETIMEDOUT);
    assert_no_wait(t0, FAIL_TIMEOUT_MS);
    gw_comm_free(&c);
    end_stuck_peer(pid);
}

static void test_peer_gives_up_fast(void **state)
{
    (void)state;
    /* rank 1 leaves (frees) after one call; rank 0's next call fails at
     * once instead of waiting out its long timeout. */
    char name[128];
    comm_name(name, sizeof(name), "left");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct gw_comm c;
        char err[256];
        if (gw_comm_init(&c, name, 1, 2, 16, 2000, err, sizeof(err)) != 0)
            _exit(10);
        float x[2] = {1, 2};
        int rc = gw_comm_allreduce_sum(&c, x, 2);
        gw_comm_free(&c);
        _exit(rc == 0 ? 0 : 11);
    }
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, name, 0, 2, 16, 10000, errbuf, sizeof(errbuf)), 0);
    float x[2] = {1, 2};
    assert_int_equal(gw_comm_allreduce_sum(&c, x, 2), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(WEXITSTATUS(st), 0);
    /* Half its 10 s timeout: far from a wait, far beyond any delay of a
     * return at once on a loaded machine. */
    double t0 = now_s();
    assert_int_equal(gw_comm_allreduce_sum(&c, x, 2), TG_ETIMEDOUT);
    assert_no_wait(t0, 5000);
    gw_comm_free(&c);
}

static void test_world_mismatch(void **state)
{
    (void)state;
    char name[128];
    comm_name(name, sizeof(name), "mismatch");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct gw_comm c;
        char err[256];
        int rc = gw_comm_init(&c, name, 1, 3, 16, 400, err, sizeof(err));
        _exit(rc == TG_ETIMEDOUT && strstr(err, "world size 2") != NULL ? 0 : 1);
    }
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, name, 0, 2, 16, 600, errbuf, sizeof(errbuf)),
                     TG_ETIMEDOUT);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_restart_same_name(void **state)
{
    (void)state;
    /* A segment left by a killed rank 0 under the same name: a new rank 0
     * supersedes it and a new rank 1 joins the new one. */
    char name[128];
    comm_name(name, sizeof(name), "restart");
    struct gw_comm old;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (gw_comm_init(&old, name, 1, 2, 8, 2000, errbuf, sizeof(errbuf)) != 0)
            _exit(10);
        _exit(0); /* leaves the old group without freeing */
    }
    assert_int_equal(gw_comm_init(&old, name, 0, 2, 8, 2000, errbuf, sizeof(errbuf)), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(WEXITSTATUS(st), 0);
    /* "kill" the old rank 0: drop the mapping, keep the name */
    old.rank = 1;
    gw_comm_free(&old);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct gw_comm c;
        if (gw_comm_init(&c, name, 1, 2, 8, 2000, errbuf, sizeof(errbuf)) != 0)
            _exit(10);
        float x[3] = {1, 2, 3};
        int rc = gw_comm_allreduce_sum(&c, x, 3);
        gw_comm_free(&c);
        _exit(rc == 0 && x[0] == 5 && x[1] == 7 && x[2] == 9 ? 0 : 11);
    }
    usleep(20000); /* let the new rank 1 find the stale segment first */
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, name, 0, 2, 8, 2000, errbuf, sizeof(errbuf)), 0);
    float x[3] = {4, 5, 6};
    assert_int_equal(gw_comm_allreduce_sum(&c, x, 3), 0);
    assert_true(x[0] == 5 && x[1] == 7 && x[2] == 9);
    gw_comm_free(&c);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    struct gw_comm c;
    assert_int_equal(gw_comm_init(&c, "/x", 2, 2, 8, 100, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_int_equal(gw_comm_init(&c, "/x", -1, 2, 8, 100, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_int_equal(gw_comm_init(&c, "/x", 0, 0, 8, 100, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_int_equal(gw_comm_init(&c, "/x", 0, GW_COMM_MAX_RANKS + 1, 8, 100,
                                  errbuf, sizeof(errbuf)), TG_EINVAL);
    assert_int_equal(gw_comm_init(&c, "/x", 0, 2, 0, 100, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_int_equal(gw_comm_init(&c, NULL, 0, 2, 8, 100, errbuf, sizeof(errbuf)),
                     TG_EINVAL);
    assert_int_equal(gw_comm_init(&c, "no-slash", 0, 2, 8, 100, errbuf,
                                  sizeof(errbuf)), TG_EINVAL);
    assert_int_equal(gw_comm_init(&c, "/a/b", 0, 2, 8, 100, errbuf,
                                  sizeof(errbuf)), TG_EINVAL);
    assert_non_null(strstr(errbuf, "shared-memory name"));
    assert_int_equal(gw_comm_init(&c, "/x", 0, 2, SIZE_MAX / 4, 100, errbuf,
                                  sizeof(errbuf)), TG_EINVAL);
    struct gw_comm z;
    memset(&z, 0, sizeof(z));
    gw_comm_free(&z);
    gw_comm_free(&z);
    float x[1] = {1};
    assert_int_equal(gw_comm_allreduce_sum(&z, x, 1), 0); /* zeroed: no-op */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks),
        cmocka_unit_test(test_three_ranks),
        cmocka_unit_test(test_world_one_noop),
        cmocka_unit_test(test_gather_world_one),
        cmocka_unit_test(test_gather_peer_missing),
        cmocka_unit_test(test_gather_root_missing),
        cmocka_unit_test(test_gather_then_leave),
        cmocka_unit_test(test_new_id),
        cmocka_unit_test(test_peer_never_joins),
        cmocka_unit_test(test_peer_stops_arriving),
        cmocka_unit_test(test_peer_gives_up_fast),
        cmocka_unit_test(test_world_mismatch),
        cmocka_unit_test(test_restart_same_name),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
