/*
 * tangram-router — the router process (started by tangramd; DESIGN.md §2).
 *
 * Takes every tangramd flag (daemon/td_options.h) plus --ipc-endpoint (the
 * worker link) and --notify-fd (a pipe to tangramd for READY / NOTREADY /
 * WATCHDOG / DRAINED lines; -1 for none). Exits 0 after a drain, 1 on a
 * start-up failure, 2 on bad flags. When tangramd goes away (the notify pipe
 * closes) the router drains and exits too, so no orphan keeps serving.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tg_config.h"
#include "common/tg_err.h"
#include "common/tg_log.h"
#include "router/rt_server.h"

extern char **environ;

int main(int argc, char **argv)
{
    size_t n_td = 0;
    const struct tg_config_entry *td = td_options_table(&n_td);
    struct tg_config_entry *table = calloc(n_td + 2, sizeof(*table));
    if (table == NULL)
        return 1;
    memcpy(table, td, n_td * sizeof(*table));
    /* struct td_options is the first member of rt_router_opts, so the
     * shared table's offsets hold. */
    table[n_td] = (struct tg_config_entry){
        .name = "ipc-endpoint", .type = TG_CONFIG_STRING,
        .offset = offsetof(struct rt_router_opts, ipc_endpoint),
        .metavar = "ENDPOINT",
        .help = "ZeroMQ endpoint the workers connect to (ipc:// or tcp://)."};
    table[n_td + 1] = (struct tg_config_entry){
        .name = "notify-fd", .type = TG_CONFIG_INT, .def = "-1", .min = -1,
        .max = 65535, .offset = offsetof(struct rt_router_opts, notify_fd),
        .metavar = "FD", .help = "Pipe to tangramd for state lines (-1: none)."};
    size_t n = n_td + 2;

    struct rt_router_opts o;
    memset(&o, 0, sizeof(o));
    char err[1024] = "";
    struct tg_config_cli cli = {.usage = "usage: tangram-router --model DIR [options]",
                                .help_out = stdout};
    int rc = tg_config_parse_cli(table, n, &o, &cli, argc, argv, environ, err, sizeof(err));
    if (rc == TG_EDONE) {
        free(table);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "tangram-router: %s\n", err);
        tg_config_free(table, n, &o);
        free(table);
        return 2;
    }
    tg_log_init("router", -1, (enum tg_log_level)o.td.log_level,
                (enum tg_log_format)o.td.log_format);
    signal(SIGPIPE, SIG_IGN);

    uv_loop_t loop;
    uv_loop_init(&loop);
    struct rt_server s;
    rc = rt_server_init(&s, &loop, &o, err, sizeof(err));
    int status = 1;
    if (rc != 0) {
        log_err("cannot start: %s", err);
    } else {
        uv_run(&loop, UV_RUN_DEFAULT);
        status = s.exit_code;
        log_info("stopped");
    }
    rt_server_free(&s);
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_loop_close(&loop);
    tg_config_free(table, n, &o);
    free(table);
    return status;
}
