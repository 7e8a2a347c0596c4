/*
 * tangram-router — the router process (started by tangramd; DESIGN.md §2).
 *
 * Takes the rows of the serving table marked for the router
 * (common/base/tg_serve_opts.h): every tangramd flag, which tangramd forwards,
 * plus the router's own --ipc-endpoint (the worker link) and --notify-fd (a
 * pipe to tangramd for READY / NOTREADY / WATCHDOG / DRAINED lines; -1 for
 * none). Sets up the router (router/app/rt_app.h: the server core, the HTTP
 * and gRPC servers and the front ends on them), then listens. Exits 0 after a
 * drain, 1 on a start-up failure, 2 on bad flags. When tangramd goes away
 * (the notify pipe closes) the router drains and exits too, so no orphan
 * keeps serving.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/tg_config.h"
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "common/base/tg_serve_opts.h"
#include "router/app/rt_app.h"

extern char **environ;

int main(int argc, char **argv)
{
    size_t n = 0;
    const struct tg_config_entry *table =
        tg_serve_opts_table(TG_SERVE_ROUTER, &n);
    struct tg_serve_opts o;
    memset(&o, 0, sizeof(o));
    char err[1024] = "";
    struct tg_config_cli cli = {.usage = "usage: tangram-router --model DIR [options]",
                                .help_out = stdout};
    int rc = tg_config_parse_cli(table, n, &o, &cli, argc, argv, environ, err, sizeof(err));
    if (rc == TG_EDONE) {
        tg_serve_opts_free(&o);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "tangram-router: %s\n", err);
        tg_serve_opts_free(&o);
        return 2;
    }
    tg_serve_opts_resolve(&o);
    tg_log_init("router", -1, (enum tg_log_level)o.log_level,
                (enum tg_log_format)o.log_format);
    signal(SIGPIPE, SIG_IGN);
    /* Prompts are rendered and tokenized on libuv's thread pool
     * (rt_server_encode.c), which reads its size from the environment
     * when the first job is queued: set it before anything runs. */
    char threads[32];
    snprintf(threads, sizeof(threads), "%lld", (long long)o.tokenizer_threads);
    setenv("UV_THREADPOOL_SIZE", threads, 1);

    uv_loop_t loop;
    uv_loop_init(&loop);
    struct rt_app app;
    rc = rt_app_init(&app, &loop, &o, err, sizeof(err));
    if (rc == 0)
        rc = rt_app_listen(&app, err, sizeof(err));
    int status = 1;
    if (rc != 0) {
        log_err("cannot start: %s", err);
    } else {
        uv_run(&loop, UV_RUN_DEFAULT);
        status = rt_app_exit_code(&app);
        log_info("stopped");
    }
    rt_app_free(&app);
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_loop_close(&loop);
    tg_serve_opts_free(&o);
    return status;
}
