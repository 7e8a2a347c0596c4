/* test_serve_opts.c — the one serving option table (common/base/tg_serve_opts.h)
 * and what tangramd derives from it: every row marked for a child and
 * tangramd is forwarded by td_sup_router_argv / td_sup_worker_argv, parses
 * back with that child's table to tangramd's value, and is accepted by the
 * real tangram-router and tangram-worker programs, so the forwarding cannot
 * rot when a row is added or re-marked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/tg_config.h"
#include "common/base/tg_err.h"
#include "common/base/tg_serve_opts.h"
#include "daemon/td_options.h"
#include "daemon/td_supervisor.h"
#include "gpu_worker/model/gw_model.h"
#include "tests/support/tt_support.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ARGS 256

static const struct tg_config_entry *find(const struct tg_config_entry *t,
                                          size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return &t[i];
    return NULL;
}

static void test_marks(void **state)
{
    (void)state;
    size_t na, nd, nr, nw;
    const struct tg_config_entry *all = tg_serve_opts_table(0, &na);
    const struct tg_config_entry *d = tg_serve_opts_table(TG_SERVE_DAEMON, &nd);
    const struct tg_config_entry *r = tg_serve_opts_table(TG_SERVE_ROUTER, &nr);
    const struct tg_config_entry *w = tg_serve_opts_table(TG_SERVE_WORKER, &nw);
    const unsigned any = TG_SERVE_DAEMON | TG_SERVE_ROUTER | TG_SERVE_WORKER;
    for (size_t i = 0; i < na; i++) {
        const struct tg_config_entry *e = &all[i];
        if ((e->flags & any) == 0)
            fail_msg("--%s is marked for no program", e->name);
        /* The router takes every tangramd flag (tangramd forwards them
         * all but the key, which goes in the environment). */
        if ((e->flags & TG_SERVE_DAEMON) && !(e->flags & TG_SERVE_ROUTER))
            fail_msg("tangramd's --%s is not marked for the router", e->name);
        /* A key never reaches a worker. */
        if ((e->flags & TG_CONFIG_SECRET) && (e->flags & TG_SERVE_WORKER))
            fail_msg("secret --%s is marked for the worker", e->name);
        /* Each program's table holds exactly its rows. */
        assert_true(((e->flags & TG_SERVE_DAEMON) != 0) ==
                    (find(d, nd, e->name) != NULL));
        assert_true(((e->flags & TG_SERVE_ROUTER) != 0) ==
                    (find(r, nr, e->name) != NULL));
        assert_true(((e->flags & TG_SERVE_WORKER) != 0) ==
                    (find(w, nw, e->name) != NULL));
    }
    /* Every tangramd row of DESIGN.md §5 is there, and the router's and
     * worker's own rows are not tangramd's. */
    /* clang-format off */
    static const char *const daemon_rows[] = {
        "model", "profile", "profile-force", "backend", "cpu-weights", "tp",
        "host",
        "http-port",
        "grpc-port", "heads-per-group", "page-size", "prefill-chunk",
        "method", "gvote-p", "gvote-samples", "gvote-future",
        "decode-compress", "decode-budget", "decode-budget-uniform",
        "decode-every", "decode-window", "trig-stats", "max-num-seqs", "max-batched-tokens", "kv-memory", "kv-host-memory",
        "max-queued", "max-grammar-compiles", "structured-whitespace",
        "grammar-compile-timeout", "grammar-cache-memory",
        "tokenizer-threads",
        "api-key", "log-format", "log-level", "shutdown-timeout",
        "served-model-name", "max-model-len", "worker-heartbeat-ms",
        "worker-stall-ms", "router-stall-ms", "http-max-connections", "http-max-connections-per-ip",
        "http-header-timeout", "http-body-timeout", "http-min-body-rate",
        "http-idle-timeout",
        "http-send-timeout", "http-max-body", "metrics-auth",
        "responses-db", "responses-max-entries", "responses-max-bytes",
        "responses-ttl", "responses-rerender",
        "grpc-recv-timeout", "grpc-idle-timeout", "grpc-max-streams",
        "grpc-max-message", "grpc-max-connections",
        "grpc-max-connections-per-ip", "max-body-memory",
        "max-request-memory"};
    /* clang-format on */
    assert_int_equal(nd, sizeof daemon_rows / sizeof daemon_rows[0]);
    for (size_t i = 0; i < nd; i++)
        assert_string_equal(d[i].name, daemon_rows[i]);
    assert_null(find(d, nd, "ipc-endpoint"));
    assert_null(find(d, nd, "rank"));
    assert_non_null(find(r, nr, "ipc-endpoint"));
    assert_non_null(find(r, nr, "notify-fd"));
    assert_null(find(r, nr, "rank"));
    assert_non_null(find(w, nw, "router"));
    assert_non_null(find(w, nw, "step-timeout-ms"));
    /* The CPU weight format: tangramd's (its memory plan), forwarded to
     * the workers, its choices in the order of enum gw_weights
     * (tangram-worker casts the index). */
    const struct tg_config_entry *cw = find(w, nw, "cpu-weights");
    assert_non_null(cw);
    assert_non_null(find(d, nd, "cpu-weights"));
    assert_string_equal(cw->def, "auto");
    for (int i = 0; gw_weights_choices[i] != NULL || cw->choices[i] != NULL;
         i++) {
        assert_non_null(cw->choices[i]);
        assert_non_null(gw_weights_choices[i]);
        assert_string_equal(cw->choices[i], gw_weights_choices[i]);
    }
    assert_null(find(w, nw, "http-port"));
    assert_null(find(w, nw, "api-key"));
    /* The worker alone keeps its cautious defaults; tangramd's stay. */
    assert_string_equal(find(w, nw, "heads-per-group")->def, "1");
    assert_string_equal(find(w, nw, "kv-memory")->def, "0.5");
    assert_string_equal(find(d, nd, "heads-per-group")->def, "4");
    assert_string_equal(find(d, nd, "kv-memory")->def, "0.9");
    assert_string_equal(find(r, nr, "kv-memory")->def, "0.9");
    /* The host tier (DESIGN.md §4.10): a documented default, 0 = off. */
    assert_string_equal(find(d, nd, "kv-host-memory")->def, "2GiB");
    assert_string_equal(find(w, nw, "kv-host-memory")->def, "0");
    /* Same row otherwise: type and range come from the one declaration. */
    const struct tg_config_entry *wk = find(w, nw, "kv-memory");
    const struct tg_config_entry *dk = find(d, nd, "kv-memory");
    assert_int_equal(wk->type, dk->type);
    assert_true(wk->min == dk->min && wk->max == dk->max);
    assert_int_equal(wk->offset, dk->offset);
}

/* Writes into buf a value of e that differs from its default and lies in
 * its range, so a row that did not travel would show. */
static void other_value(const struct tg_config_entry *e, char *buf,
                        size_t len)
{
    switch (e->type) {
    case TG_CONFIG_BOOL:
        snprintf(buf, len, "%s",
                 e->def != NULL && strcmp(e->def, "true") == 0 ? "false"
                                                                : "true");
        return;
    case TG_CONFIG_INT: {
        long long v = (long long)e->min + 1;
        /* The step budget must hold a chunk and every running request
         * (2 each here); its default 0 picks the backend's. */
        if (strcmp(e->name, "max-batched-tokens") == 0)
            v = 4096;
        /* 0 (never) or at least 2 s (TD_ROUTER_STALL_MIN_MS) */
        if (strcmp(e->name, "router-stall-ms") == 0)
            v = 5000;
        if (e->def != NULL && atoll(e->def) == v)
            v++;
        snprintf(buf, len, "%lld", v);
        return;
    }
    case TG_CONFIG_DOUBLE:
        /* A narrow range (gvote-p's (0, 1]) takes its middle. */
        snprintf(buf, len, "%g",
                 e->max > e->min + 1.5 ? e->min + 1.5
                                       : e->min + (e->max - e->min) / 2);
        return;
    case TG_CONFIG_STRING:
        snprintf(buf, len, "x-%s", e->name);
        return;
    case TG_CONFIG_SIZE:
        snprintf(buf, len, "%.0f", e->min + 4096);
        return;
    case TG_CONFIG_SIZE_FRAC:
        snprintf(buf, len, "0.25");
        return;
    case TG_CONFIG_ENUM: {
        size_t k = 0, def = 0;
        while (e->choices[k] != NULL) {
            if (e->def != NULL && strcmp(e->choices[k], e->def) == 0)
                def = k;
            k++;
        }
        snprintf(buf, len, "%s", e->choices[(def + 1) % k]);
        return;
    }
    }
    fail_msg("--%s: unknown type", e->name);
}

/* tangramd's options with every row of its table set to a non-default
 * value, then `extra` (NULL-terminated flag/value pairs, winning). */
static void daemon_opts(struct tg_serve_opts *o, const char *const *extra)
{
    static char flags[64][224], vals[64][128];
    char *argv[MAX_ARGS];
    int argc = 0;
    argv[argc++] = "tangramd";
    size_t nd;
    const struct tg_config_entry *d = tg_serve_opts_table(TG_SERVE_DAEMON, &nd);
    assert_true(nd <= 64);
    for (size_t i = 0; i < nd; i++) {
        other_value(&d[i], vals[i], sizeof vals[i]);
        if (d[i].type == TG_CONFIG_BOOL) { /* booleans take --name=value */
            snprintf(flags[i], sizeof flags[i], "--%s=%s", d[i].name,
                     vals[i]);
            argv[argc++] = flags[i];
            continue;
        }
        snprintf(flags[i], sizeof flags[i], "--%s", d[i].name);
        argv[argc++] = flags[i];
        argv[argc++] = vals[i];
    }
    for (size_t i = 0; extra != NULL && extra[i] != NULL; i++) {
        assert_true(argc + 1 < MAX_ARGS);
        argv[argc++] = (char *)extra[i];
    }
    argv[argc] = NULL;
    char err[512];
    memset(o, 0, sizeof *o);
    int rc = td_options_parse(o, argc, argv, NULL, err, sizeof err);
    if (rc != 0)
        fail_msg("td_options_parse: %s", err);
}

/* Parses a child's argv with that child's table (no environment). */
static void child_parse(unsigned who, char **argv, size_t argc,
                        struct tg_serve_opts *out)
{
    size_t n;
    const struct tg_config_entry *t = tg_serve_opts_table(who, &n);
    char err[512];
    memset(out, 0, sizeof *out);
    int rc = tg_config_parse(t, n, out, (int)argc, argv, NULL, err,
                             sizeof err);
    if (rc != 0)
        fail_msg("the child's table refuses tangramd's argv: %s", err);
}

/* Every row marked for tangramd and `who` (secrets aside) has the same
 * value in the child's parse as in tangramd's. */
static void same_forwarded(unsigned who, const struct tg_serve_opts *d,
                           const struct tg_serve_opts *c)
{
    size_t na;
    const struct tg_config_entry *all = tg_serve_opts_table(0, &na);
    json_t *jd = tg_config_dump_json(all, na, d);
    json_t *jc = tg_config_dump_json(all, na, c);
    assert_non_null(jd);
    assert_non_null(jc);
    int forwarded = 0;
    for (size_t i = 0; i < na; i++) {
        const struct tg_config_entry *e = &all[i];
        if (!(e->flags & TG_SERVE_DAEMON) || !(e->flags & who) ||
            (e->flags & TG_CONFIG_SECRET))
            continue;
        forwarded++;
        if (!json_equal(json_object_get(jd, e->name),
                        json_object_get(jc, e->name))) {
            char *a = json_dumps(json_object_get(jd, e->name),
                                 JSON_ENCODE_ANY);
            char *b = json_dumps(json_object_get(jc, e->name),
                                 JSON_ENCODE_ANY);
            fail_msg("--%s: tangramd has %s, the child parsed %s", e->name,
                     a, b);
        }
    }
    assert_true(forwarded >= 10);
    json_decref(jd);
    json_decref(jc);
}

static void test_worker_gets_its_rows(void **state)
{
    (void)state;
    struct tg_serve_opts d, w;
    daemon_opts(&d, NULL);
    char **argv = NULL;
    size_t argc = 0;
    char err[256];
    assert_int_equal(td_sup_worker_argv(&d, "tangram-worker", 1, "ipc:///e",
                                        &argv, &argc, err, sizeof err), 0);
    child_parse(TG_SERVE_WORKER, argv, argc, &w);
    same_forwarded(TG_SERVE_WORKER, &d, &w);
    /* The worker's own rows come from tangramd's head of the line. */
    assert_int_equal(w.rank, 1);
    assert_int_equal(w.world_size, d.tp);
    assert_string_equal(w.router, "ipc:///e");
    for (size_t i = 0; i < argc; i++)
        assert_null(strstr(argv[i], "x-api-key"));
    tg_config_argv_free(argv, argc);
    tg_serve_opts_free(&w);
    tg_serve_opts_free(&d);
}

static void test_router_gets_its_rows(void **state)
{
    (void)state;
    struct tg_serve_opts d, r;
    daemon_opts(&d, NULL);
    char **argv = NULL;
    size_t argc = 0;
    char err[256];
    assert_int_equal(td_sup_router_argv(&d, "tangram-router", "ipc:///e",
                                        &argv, &argc, err, sizeof err), 0);
    child_parse(TG_SERVE_ROUTER, argv, argc, &r);
    same_forwarded(TG_SERVE_ROUTER, &d, &r);
    assert_string_equal(r.ipc_endpoint, "ipc:///e");
    assert_int_equal(r.notify_fd, TD_NOTIFY_FD);
    /* The key is not on the command line (it travels in the environment). */
    assert_string_equal(r.api_key, "");
    for (size_t i = 0; i < argc; i++)
        assert_null(strstr(argv[i], "x-api-key"));
    tg_config_argv_free(argv, argc);
    tg_serve_opts_free(&r);
    tg_serve_opts_free(&d);
}

static void test_forward_bad_child(void **state)
{
    (void)state;
    struct tg_serve_opts o;
    memset(&o, 0, sizeof o);
    char **argv = NULL;
    size_t argc = 0;
    char err[128];
    assert_int_equal(tg_serve_opts_forward(&o, TG_SERVE_DAEMON, &argv, &argc,
                                           err, sizeof err),
                     TG_EINVAL);
    assert_int_equal(argc, 0);
    tg_serve_opts_free(&o);
    tg_serve_opts_free(&o);
}

/* Runs argv (a real program) with an empty environment; returns its exit
 * status and its stderr in out. */
static int run(char **argv, char *out, size_t cap)
{
    char path[] = "/tmp/tg_test_serve_opts.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd, 2);
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(nul, 1);
        char *envp[] = {"PATH=/usr/bin:/bin", NULL};
        execve(argv[0], argv, envp);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    ssize_t got = pread(fd, out, cap - 1, 0);
    out[got > 0 ? got : 0] = '\0';
    close(fd);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* The real programs accept the command lines tangramd builds: with every
 * row at a non-default value they get past their flags (exit status 2
 * means bad flags) and stop only at the missing model (status 1). */
static void test_programs_accept_forwarded(void **state)
{
    (void)state;
    char router[512], worker[512];
    if (!tt_program("tangram-router", router, sizeof router))
        fail_msg("%s is not built", router);
    if (!tt_program("tangram-worker", worker, sizeof worker))
        fail_msg("%s is not built", worker);
    /* The CPU backend, so that a worker without a GPU fails only on the
     * model; a model directory that does not exist. */
    static const char *const extra[] = {
        "--backend", "cpu", "--model", "/nonexistent/tg-test-model",
        "--profile", "none", "--log-level", "info", NULL};
    struct tg_serve_opts d;
    daemon_opts(&d, extra);
    char err[256], out[8192];

    char **argv = NULL;
    size_t argc = 0;
    assert_int_equal(td_sup_worker_argv(&d, worker, 0, "ipc:///nonexistent/w",
                                        &argv, &argc, err, sizeof err), 0);
    int st = run(argv, out, sizeof out);
    if (st != 1 || strstr(out, "cannot start") == NULL)
        fail_msg("tangram-worker exited %d: %s", st, out);
    tg_config_argv_free(argv, argc);

    argv = NULL;
    argc = 0;
    assert_int_equal(td_sup_router_argv(&d, router, "ipc:///nonexistent/w",
                                        &argv, &argc, err, sizeof err), 0);
    st = run(argv, out, sizeof out);
    if (st != 1 || strstr(out, "cannot start") == NULL)
        fail_msg("tangram-router exited %d: %s", st, out);
    tg_config_argv_free(argv, argc);

    /* And a flag a program does not take is refused with status 2, so the
     * checks above can fail. */
    char *bad[] = {worker, "--model", "/m", "--router", "ipc:///x",
                   "--http-port", "1", NULL};
    st = run(bad, out, sizeof out);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "unknown flag '--http-port'"));
    tg_serve_opts_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_marks),
        cmocka_unit_test(test_worker_gets_its_rows),
        cmocka_unit_test(test_router_gets_its_rows),
        cmocka_unit_test(test_forward_bad_child),
        cmocka_unit_test(test_programs_accept_forwarded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
