/* test_supervisor.c — the tangramd supervisor's helpers (backoff, notify
 * lines, child command lines and environment, runtime directory) and its
 * start-up failure path. The running loop (restarts, signals, systemd) is
 * covered by tests/integration/test_supervisor.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "daemon/td_options.h"
#include "daemon/td_supervisor.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_backoff(void **state)
{
    (void)state;
    struct td_backoff b = {0};
    const uint64_t want[] = {100, 200, 400, 800, 1600, 3200, 6400, 10000,
                             10000};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        assert_int_equal(td_backoff_next(&b, 10), want[i]);
    /* Just under a minute of uptime keeps growing; a minute resets. */
    assert_int_equal(td_backoff_next(&b, TD_BACKOFF_RESET_MS - 1), 10000);
    assert_int_equal(td_backoff_next(&b, TD_BACKOFF_RESET_MS), 100);
    assert_int_equal(td_backoff_next(&b, 0), 200);
}

static void parse_ok(const char *line, enum td_notify_kind want,
                     const char *want_reason)
{
    enum td_notify_kind k;
    const char *r;
    size_t rl;
    assert_int_equal(td_notify_parse(line, strlen(line), &k, &r, &rl), 0);
    assert_int_equal(k, want);
    if (want_reason == NULL) {
        assert_null(r);
        assert_int_equal(rl, 0);
    } else {
        assert_int_equal(rl, strlen(want_reason));
        assert_memory_equal(r, want_reason, rl);
    }
}

static void test_notify_parse(void **state)
{
    (void)state;
    parse_ok("READY", TD_NOTIFY_READY, NULL);
    parse_ok("READY\r", TD_NOTIFY_READY, NULL);
    parse_ok("WATCHDOG", TD_NOTIFY_WATCHDOG, NULL);
    parse_ok("DRAINED", TD_NOTIFY_DRAINED, NULL);
    parse_ok("NOTREADY", TD_NOTIFY_NOTREADY, NULL);
    parse_ok("NOTREADY rank 1 down", TD_NOTIFY_NOTREADY, "rank 1 down");
    parse_ok("NOTREADY ", TD_NOTIFY_NOTREADY, "");
    const char *bad[] = {"", "ready", "READYX", "READY now", "NOTREADYx",
                         "WATCHDOG 1", " READY", "HELLO"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        enum td_notify_kind k;
        const char *r;
        size_t rl;
        assert_int_equal(td_notify_parse(bad[i], strlen(bad[i]), &k, &r,
                                         &rl), TG_EFORMAT);
    }
    /* Length, not NUL, ends the line. */
    enum td_notify_kind k;
    const char *r;
    size_t rl;
    assert_int_equal(td_notify_parse("READYREADY", 5, &k, &r, &rl), 0);
    assert_int_equal(k, TD_NOTIFY_READY);
}

static void parse_opts(struct tg_serve_opts *o, char **argv, int argc)
{
    char err[512];
    memset(o, 0, sizeof *o);
    int rc = td_options_parse(o, argc, argv, NULL, err, sizeof err);
    if (rc != 0)
        fail_msg("td_options_parse: %s", err);
}

static const char *find_flag(char **argv, size_t argc, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < argc; i++) {
        if (strncmp(argv[i], name, nl) == 0 && argv[i][nl] == '=')
            return argv[i] + nl + 1;
        if (strcmp(argv[i], name) == 0 && i + 1 < argc)
            return argv[i + 1];
    }
    return NULL;
}

static void test_router_argv(void **state)
{
    (void)state;
    char *in[] = {"tangramd", "--model", "/m/llama/", "--tp", "2",
                  "--api-key", "sekrit", "--kv-memory", "75%",
                  "--shutdown-timeout", "2.5", "--log-format", "json",
                  "--profile", "/p.json"};
    struct tg_serve_opts o;
    parse_opts(&o, in, (int)(sizeof in / sizeof in[0]));
    char **argv = NULL;
    size_t argc = 0;
    char err[256];
    assert_int_equal(td_sup_router_argv(&o, "/bin/router", "ipc:///x/w.sock",
                                        &argv, &argc, err, sizeof err), 0);
    assert_string_equal(argv[0], "/bin/router");
    assert_null(argv[argc]);
    for (size_t i = 0; i < argc; i++)
        assert_null(strstr(argv[i], "sekrit"));
    assert_null(find_flag(argv, argc, "--api-key"));
    assert_string_equal(argv[argc - 4], "--ipc-endpoint");
    assert_string_equal(argv[argc - 3], "ipc:///x/w.sock");
    assert_string_equal(argv[argc - 2], "--notify-fd");
    assert_string_equal(argv[argc - 1], "3");
    /* Without the router-only tail, the flags parse back to tangramd's own
     * options (the key aside). */
    struct tg_serve_opts back;
    parse_opts(&back, argv, (int)argc - 4);
    assert_string_equal(back.model, "/m/llama/");
    assert_string_equal(back.profile, "/p.json");
    assert_string_equal(back.served_model_name, "llama");
    assert_int_equal(back.tp, 2);
    assert_true(back.kv_memory.is_fraction);
    assert_true(back.kv_memory.fraction == 0.75);
    assert_true(back.shutdown_timeout == 2.5);
    assert_int_equal(back.log_format, TG_LOG_JSON);
    assert_int_equal(back.http_port, o.http_port);
    assert_int_equal(back.max_batched_tokens, o.max_batched_tokens);
    assert_string_equal(back.api_key, "");
    td_options_free(&back);
    tg_config_argv_free(argv, argc);
    td_options_free(&o);
}

static void test_worker_argv(void **state)
{
    (void)state;
    char *in[] = {"tangramd", "--model", "/m", "--tp", "3", "--page-size",
                  "32", "--kv-memory", "8GiB", "--backend", "cuda",
                  "--log-level", "debug", "--http-port", "9000"};
    struct tg_serve_opts o;
    parse_opts(&o, in, (int)(sizeof in / sizeof in[0]));
    char **argv = NULL;
    size_t argc = 0;
    char err[256];
    assert_int_equal(td_sup_worker_argv(&o, "/bin/w", 2, "ipc:///e",
                                        &argv, &argc, err, sizeof err), 0);
    const char *want[] = {"/bin/w", "--rank", "2", "--world-size", "3",
                          "--router", "ipc:///e"};
    for (size_t i = 0; i < 7; i++)
        assert_string_equal(argv[i], want[i]);
    assert_string_equal(find_flag(argv, argc, "--model"), "/m");
    assert_string_equal(find_flag(argv, argc, "--profile"), "none");
    assert_string_equal(find_flag(argv, argc, "--profile-force"), "false");
    assert_string_equal(find_flag(argv, argc, "--backend"), "cuda");
    assert_string_equal(find_flag(argv, argc, "--page-size"), "32");
    assert_string_equal(find_flag(argv, argc, "--kv-memory"),
                        "8589934592B");
    assert_string_equal(find_flag(argv, argc, "--log-level"), "debug");
    assert_string_equal(find_flag(argv, argc, "--log-format"), "text");
    assert_non_null(find_flag(argv, argc, "--prefill-chunk"));
    assert_non_null(find_flag(argv, argc, "--heads-per-group"));
    assert_non_null(find_flag(argv, argc, "--max-num-seqs"));
    assert_null(find_flag(argv, argc, "--http-port")); /* router-only */
    /* The worker beats at the router's period. */
    assert_string_equal(find_flag(argv, argc, "--heartbeat-ms"), "1000");
    assert_null(find_flag(argv, argc, "--api-key"));
    /* --method is unset (the profile's): not forwarded; gvote's three
     * parameters are. */
    assert_null(find_flag(argv, argc, "--method"));
    assert_non_null(find_flag(argv, argc, "--gvote-p"));
    assert_non_null(find_flag(argv, argc, "--gvote-samples"));
    assert_non_null(find_flag(argv, argc, "--gvote-future"));
    /* Decode-time compression's rows travel too (§4.9): the workers
     * compact. */
    assert_string_equal(find_flag(argv, argc, "--decode-compress"), "none");
    assert_non_null(find_flag(argv, argc, "--decode-budget"));
    assert_non_null(find_flag(argv, argc, "--decode-budget-uniform"));
    assert_non_null(find_flag(argv, argc, "--decode-every"));
    assert_non_null(find_flag(argv, argc, "--decode-window"));
    assert_non_null(find_flag(argv, argc, "--trig-stats"));
    /* The workers hold the host tier (§4.10). */
    assert_non_null(find_flag(argv, argc, "--kv-host-memory"));
    /* The worker rank 0 bounds its grammar cache (DESIGN.md §4.11). */
    assert_non_null(find_flag(argv, argc, "--grammar-cache-memory"));
    /* and the wall time of a compile */
    assert_string_equal(find_flag(argv, argc, "--grammar-compile-timeout"),
                        "10");
    /* The CPU backend's weight format travels to the workers. */
    assert_non_null(find_flag(argv, argc, "--cpu-weights"));
    /* 23 rows, --heartbeat-ms, --kv-host-memory */
    assert_int_equal(argc, 7 + 25);
    /* The communicator is named by worker rank 0, never on a command
     * line (proto/worker.proto CommSetup). */
    assert_null(find_flag(argv, argc, "--comm-id"));
    tg_config_argv_free(argv, argc);
    argv = NULL;
    argc = 0;
    assert_int_equal(td_sup_worker_argv(&o, "/bin/w", 3, "ipc:///e",
                                        &argv, &argc, err, sizeof err),
                     TG_EINVAL);
    assert_int_equal(td_sup_worker_argv(&o, "/bin/w", -1, "ipc:///e",
                                        &argv, &argc, err, sizeof err),
                     TG_EINVAL);
    tg_config_argv_free(argv, argc);
    td_options_free(&o);
}

static void touch(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
}

static bool exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* What a killed worker rank 0 leaves in /dev/shm goes, and only that. */
static void test_shm_forget(void **state)
{
    (void)state;
    char dir[] = "/tmp/tg_test_shm.XXXXXX";
    assert_non_null(mkdtemp(dir));
    touch(dir, "tangram-4242-00000000deadbeef");
    touch(dir, "tangram-4242-1");
    touch(dir, "tangram-42420-0123");   /* another pid with that prefix */
    touch(dir, "tangram-424-77");
    touch(dir, "other-4242-1");
    char err[256];
    assert_int_equal(td_sup_shm_forget(dir, 4242, err, sizeof err), 2);
    assert_false(exists(dir, "tangram-4242-00000000deadbeef"));
    assert_false(exists(dir, "tangram-4242-1"));
    assert_true(exists(dir, "tangram-42420-0123"));
    assert_true(exists(dir, "tangram-424-77"));
    assert_true(exists(dir, "other-4242-1"));
    assert_int_equal(td_sup_shm_forget(dir, 4242, err, sizeof err), 0);
    /* A missing directory has nothing left behind. */
    assert_int_equal(td_sup_shm_forget("/nonexistent-tg-shm", 1, err,
                                       sizeof err), 0);
    assert_int_equal(td_sup_shm_forget(dir, 42420, err, sizeof err), 1);
    assert_int_equal(td_sup_shm_forget(dir, 424, err, sizeof err), 1);
    char left[600];
    snprintf(left, sizeof left, "%s/other-4242-1", dir);
    assert_int_equal(unlink(left), 0);
    assert_int_equal(rmdir(dir), 0);
}

static bool env_has(char **env, size_t n, const char *kv)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(env[i], kv) == 0)
            return true;
    return false;
}

static void test_child_env(void **state)
{
    (void)state;
    char *in[] = {"tangramd", "--model", "/m", "--api-key", "flagkey"};
    struct tg_serve_opts o;
    parse_opts(&o, in, 5);
    char *envp[] = {"PATH=/bin", "NOTIFY_SOCKET=/run/n", "WATCHDOG_USEC=5",
                    "WATCHDOG_PID=1", "TANGRAM_API_KEY=envkey",
                    "TANGRAM_HTTP_PORT=1", "NOTIFY_SOCKETX=keep", NULL};
    char **env = NULL;
    size_t n = 0;
    char err[128];
    assert_int_equal(td_sup_child_env(&o, envp, true, &env, &n, err,
                                      sizeof err), 0);
    assert_int_equal(n, 4);
    assert_true(env_has(env, n, "PATH=/bin"));
    assert_true(env_has(env, n, "TANGRAM_HTTP_PORT=1"));
    assert_true(env_has(env, n, "NOTIFY_SOCKETX=keep"));
    /* The effective key (flag beats environment) replaces the variable. */
    assert_true(env_has(env, n, "TANGRAM_API_KEY=flagkey"));
    assert_null(env[n]);
    tg_config_argv_free(env, n);
    env = NULL;
    n = 0;
    assert_int_equal(td_sup_child_env(&o, envp, false, &env, &n, err,
                                      sizeof err), 0);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        assert_null(strstr(env[i], "TANGRAM_API_KEY"));
    tg_config_argv_free(env, n);
    env = NULL;
    n = 0;
    assert_int_equal(td_sup_child_env(&o, NULL, true, &env, &n, err,
                                      sizeof err), 0);
    assert_int_equal(n, 1);
    tg_config_argv_free(env, n);
    td_options_free(&o);
}

/* A scratch directory with an executable "prog", a plain "data" file and a
 * subdirectory "sub". */
struct scratch {
    char dir[256], prog[300], data[300], sub[300];
};

static void scratch_make(struct scratch *s)
{
    snprintf(s->dir, sizeof s->dir, "/tmp/tgsupXXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->prog, sizeof s->prog, "%s/prog", s->dir);
    snprintf(s->data, sizeof s->data, "%s/data", s->dir);
    snprintf(s->sub, sizeof s->sub, "%s/sub", s->dir);
    FILE *f = fopen(s->prog, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\nexec sleep 30\n", f);
    fclose(f);
    assert_int_equal(chmod(s->prog, 0755), 0);
    f = fopen(s->data, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(mkdir(s->sub, 0700), 0);
}

static void scratch_free(struct scratch *s)
{
    rmdir(s->sub);
    unlink(s->prog);
    unlink(s->data);
    assert_int_equal(rmdir(s->dir), 0); /* nothing else left behind */
}

static void test_paths(void **state)
{
    (void)state;
    struct scratch sc;
    scratch_make(&sc);
    char kv_r[400], kv_w[400], kv_tmp[400], kv_rd[400];
    snprintf(kv_r, sizeof kv_r, "TANGRAM_ROUTER_BIN=%s", sc.prog);
    snprintf(kv_w, sizeof kv_w, "TANGRAM_WORKER_BIN=%s", sc.prog);
    snprintf(kv_tmp, sizeof kv_tmp, "TMPDIR=%s", sc.dir);
    char *envp[] = {kv_r, kv_w, kv_tmp, NULL};
    struct td_sup_paths p;
    char err[512];
    assert_int_equal(td_sup_paths_init(&p, envp, "/nonexistent", err,
                                       sizeof err), 0);
    assert_string_equal(p.router_bin, sc.prog);
    assert_true(p.own_dir);
    assert_int_equal(strncmp(p.runtime_dir, sc.dir, strlen(sc.dir)), 0);
    struct stat st;
    assert_int_equal(stat(p.runtime_dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "ipc://%s/workers.sock", p.runtime_dir);
    assert_string_equal(p.endpoint, want);
    /* What a router leaves there is removed with the directory. */
    char sock[PATH_MAX + 32];
    snprintf(sock, sizeof sock, "%s/workers.sock", p.runtime_dir);
    FILE *f = fopen(sock, "w");
    assert_non_null(f);
    fclose(f);
    td_sup_paths_cleanup(&p);
    assert_int_not_equal(stat(sock, &st), 0);
    td_sup_paths_cleanup(&p); /* twice is fine */

    /* Programs next to tangramd by default: none there. */
    char *envp2[] = {kv_tmp, NULL};
    assert_int_equal(td_sup_paths_init(&p, envp2, sc.dir, err, sizeof err),
                     TG_ENOENT);
    assert_non_null(strstr(err, "tangram-router"));
    /* Not executable, a directory. */
    char bad[400];
    snprintf(bad, sizeof bad, "TANGRAM_WORKER_BIN=%s", sc.data);
    char *envp3[] = {kv_r, bad, kv_tmp, NULL};
    assert_int_equal(td_sup_paths_init(&p, envp3, "/x", err, sizeof err),
                     TG_ENOENT);
    assert_non_null(strstr(err, sc.data));
    snprintf(bad, sizeof bad, "TANGRAM_WORKER_BIN=%s", sc.sub);
    assert_int_equal(td_sup_paths_init(&p, envp3, "/x", err, sizeof err),
                     TG_ENOENT);

    /* systemd's RUNTIME_DIRECTORY is used as is and only the socket goes. */
    snprintf(kv_rd, sizeof kv_rd, "RUNTIME_DIRECTORY=%s:/other", sc.sub);
    char *envp4[] = {kv_r, kv_w, kv_rd, NULL};
    assert_int_equal(td_sup_paths_init(&p, envp4, "/x", err, sizeof err), 0);
    assert_false(p.own_dir);
    assert_string_equal(p.runtime_dir, sc.sub);
    td_sup_paths_cleanup(&p);
    assert_int_equal(stat(sc.sub, &st), 0);
    snprintf(kv_rd, sizeof kv_rd, "RUNTIME_DIRECTORY=%s/missing", sc.dir);
    assert_int_equal(td_sup_paths_init(&p, envp4, "/x", err, sizeof err),
                     TG_ENOENT);

    /* A TMPDIR too long for an AF_UNIX socket path: clear error, nothing
     * left on disk. */
    char longdir[300];
    int w = snprintf(longdir, sizeof longdir, "%s/", sc.sub);
    memset(longdir + w, 'd', 90);
    longdir[w + 90] = '\0';
    assert_int_equal(mkdir(longdir, 0700), 0);
    snprintf(kv_tmp, sizeof kv_tmp, "TMPDIR=%s", longdir);
    char *envp5[] = {kv_r, kv_w, kv_tmp, NULL};
    assert_int_equal(td_sup_paths_init(&p, envp5, "/x", err, sizeof err),
                     TG_ETOOBIG);
    assert_non_null(strstr(err, "TMPDIR"));
    assert_int_equal(rmdir(longdir), 0); /* empty: the mkdtemp dir is gone */
    scratch_free(&sc);
}

/* Start-up failure: the router starts, a worker cannot be spawned (its
 * program is a directory); td_sup_run kills the router, reaps it and
 * returns an error without leaking. */
static void test_run_spawn_failure(void **state)
{
    (void)state;
    struct scratch sc;
    scratch_make(&sc);
    char *in[] = {"tangramd", "--model", "/m", "--tp", "2",
                  "--log-level", "err"};
    struct tg_serve_opts o;
    parse_opts(&o, in, 7);
    tg_log_init("test", -1, TG_LOG_ERR, TG_LOG_TEXT);
    struct td_sup_paths p;
    memset(&p, 0, sizeof p);
    snprintf(p.router_bin, sizeof p.router_bin, "%s", sc.prog);
    snprintf(p.worker_bin, sizeof p.worker_bin, "%s", sc.sub);
    snprintf(p.endpoint, sizeof p.endpoint, "ipc://%s/workers.sock",
             sc.dir);
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};
    char err[512] = "";
    assert_int_equal(td_sup_run(&o, &p, envp, err, sizeof err), TG_EIO);
    assert_non_null(strstr(err, "cannot start"));
    td_options_free(&o);
    scratch_free(&sc);
}

/* Makes base/name as a tangramd runtime directory with a socket file and,
 * when `lock` is set, a tangramd.lock naming pid 4242 (unlocked). */
static void fake_runtime_dir(const char *base, const char *name, bool lock)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", base, name);
    assert_int_equal(mkdir(dir, 0700), 0);
    touch(dir, "workers.sock");
    if (lock) {
        char path[450];
        snprintf(path, sizeof path, "%s/tangramd.lock", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("4242\n", f);
        fclose(f);
    }
}

static void remove_fake(const char *base, const char *name)
{
    char dir[400], path[450];
    snprintf(dir, sizeof dir, "%s/%s", base, name);
    snprintf(path, sizeof path, "%s/workers.sock", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tangramd.lock", dir);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

/* Stale runtime directories go, and only those: a lock nobody holds proves
 * its tangramd gone; a held lock (another live process), no lock file, a
 * name mkdtemp did not make, a link, are all left alone. td_sup_paths_init
 * cleans before it makes its own directory, whose lock it holds. */
static void test_stale_runtime_dirs(void **state)
{
    (void)state;
    char base[] = "/tmp/tg_test_stale.XXXXXX";
    assert_non_null(mkdtemp(base));
    fake_runtime_dir(base, "tangramd.AbC123", true);  /* stale */
    fake_runtime_dir(base, "tangramd.live01", true);  /* held below */
    fake_runtime_dir(base, "tangramd.nolock", false); /* unprovable */
    fake_runtime_dir(base, "tangramd.toolong1", true); /* not mkdtemp's */
    fake_runtime_dir(base, "other.AbC123", true);
    char link[400];
    snprintf(link, sizeof link, "%s/tangramd.link01", base);
    assert_int_equal(symlink("tangramd.AbC123", link), 0);
    /* A live owner: a child process holds the lock until told to go. */
    int go[2], ready[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char path[450];
        snprintf(path, sizeof path, "%s/tangramd.live01/tangramd.lock", base);
        int fd = open(path, O_RDONLY);
        char c = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) < 0)
            _exit(1);
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, 'y');

    assert_int_equal(td_sup_clean_stale_dirs(base), 1);
    assert_false(exists(base, "tangramd.AbC123"));
    assert_true(exists(base, "tangramd.live01/workers.sock"));
    assert_true(exists(base, "tangramd.nolock/workers.sock"));
    assert_true(exists(base, "tangramd.toolong1/workers.sock"));
    assert_true(exists(base, "other.AbC123/workers.sock"));
    assert_int_equal(unlink(link), 0);
    assert_int_equal(td_sup_clean_stale_dirs("/nonexistent/dir"), 0);

    /* Its owner gone, the live one is stale too; td_sup_paths_init finds
     * it and makes its own directory, locked while the paths live. */
    assert_int_equal(write(go[1], "x", 1), 1);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    close(go[0]);
    close(go[1]);
    close(ready[0]);
    close(ready[1]);
    char kv_tmp[400], prog[400];
    snprintf(prog, sizeof prog, "%s/prog", base);
    FILE *f = fopen(prog, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(chmod(prog, 0755), 0);
    char kv_r[450], kv_w[450];
    snprintf(kv_r, sizeof kv_r, "TANGRAM_ROUTER_BIN=%s", prog);
    snprintf(kv_w, sizeof kv_w, "TANGRAM_WORKER_BIN=%s", prog);
    snprintf(kv_tmp, sizeof kv_tmp, "TMPDIR=%s", base);
    char *envp[] = {kv_r, kv_w, kv_tmp, NULL};
    struct td_sup_paths p;
    char err[512];
    assert_int_equal(td_sup_paths_init(&p, envp, "/x", err, sizeof err), 0);
    assert_false(exists(base, "tangramd.live01"));
    assert_true(p.locked);
    char lock[PATH_MAX + 32];
    snprintf(lock, sizeof lock, "%s/tangramd.lock", p.runtime_dir);
    int fd = open(lock, O_RDONLY);
    assert_true(fd >= 0);
    char pidtxt[32] = "";
    assert_true(read(fd, pidtxt, sizeof pidtxt - 1) > 0);
    assert_int_equal(atol(pidtxt), (long)getpid());
    /* Held: another open file cannot take it, and a cleaner leaves it. */
    assert_int_not_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    close(fd);
    assert_int_equal(td_sup_clean_stale_dirs(base), 0);
    struct stat sb;
    assert_int_equal(stat(p.runtime_dir, &sb), 0);
    char own[PATH_MAX];
    snprintf(own, sizeof own, "%s", p.runtime_dir);
    td_sup_paths_cleanup(&p);
    assert_int_not_equal(stat(own, &sb), 0);

    remove_fake(base, "tangramd.nolock");
    remove_fake(base, "tangramd.toolong1");
    remove_fake(base, "other.AbC123");
    unlink(prog);
    assert_int_equal(rmdir(base), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_notify_parse),
        cmocka_unit_test(test_router_argv),
        cmocka_unit_test(test_worker_argv),
        cmocka_unit_test(test_shm_forget),
        cmocka_unit_test(test_child_env),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_stale_runtime_dirs),
        cmocka_unit_test(test_run_spawn_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
