/*
 * tangramd — the serving daemon's supervisor (DESIGN.md §2, §5).
 *
 * Parses its options (daemon/td_options.h over the serving table of
 * common/base/tg_serve_opts.h: flags and TANGRAM_* variables),
 * checks that the configuration can serve (daemon/td_preflight.h: model,
 * tokenizer, weights, profile, listen addresses, host memory), creates the
 * runtime directory, then runs the supervisor of daemon/td_supervisor.h:
 * the router and --tp workers are started, restarted with backoff when they
 * die after the server was first ready, and drained on SIGTERM/SIGINT.
 *
 * Exit status: 0 after a drain; 1 when a second signal cut the drain short
 * or the supervisor itself failed; 2 for bad options; 3 when the start-up
 * failed (a check above, or a child that exited before the server was
 * ready) — the same configuration would fail again, so the shipped systemd
 * unit does not restart on 2 or 3 (RestartPreventExitStatus).
 */
#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "daemon/td_options.h"
#include "daemon/td_preflight.h"
#include "daemon/td_supervisor.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <systemd/sd-daemon.h>

extern char **environ;

#define EXIT_STARTUP 3 /* see the top of this file */

/* A start-up failure: on stderr, in the log and in systemd's status. */
static int startup_failed(const char *what)
{
    log_err("start-up failed: %s", what);
    fprintf(stderr, "tangramd: start-up failed: %s\n", what);
    char status[1200];
    snprintf(status, sizeof status, "STATUS=start-up failed: %s", what);
    sd_notify(0, status);
    return EXIT_STARTUP;
}

int main(int argc, char **argv)
{
    struct tg_serve_opts o = {0};
    char err[1024] = "";
    int rc = td_options_parse(&o, argc, argv, environ, err, sizeof err);
    if (rc == TG_EDONE) {
        td_options_free(&o);
        return td_options_help(stdout) == 0 ? 0 : 1;
    }
    if (rc != 0) {
        fprintf(stderr, "tangramd: %s\n(see tangramd --help)\n", err);
        td_options_free(&o);
        return 2;
    }
    tg_log_init("supervisor", -1, (enum tg_log_level)o.log_level,
                (enum tg_log_format)o.log_format);
    /* A write to a child's closed pipe must be an error, not a death. */
    signal(SIGPIPE, SIG_IGN);

    json_t *dump = td_options_dump_json(&o);
    char *text = dump != NULL ? json_dumps(dump, JSON_COMPACT) : NULL;
    log_info("tangramd starting: %s", text != NULL ? text : "{}");
    free(text);
    json_decref(dump);

    struct td_sup_paths paths;
    rc = td_sup_paths_init(&paths, environ, NULL, err, sizeof err);
    if (rc != 0) {
        td_options_free(&o);
        return startup_failed(err);
    }
    struct td_preflight pre;
    rc = td_preflight_run(&o, &pre, err, sizeof err);
    if (rc != 0) {
        td_sup_paths_cleanup(&paths);
        td_options_free(&o);
        return startup_failed(err);
    }
    if (o.backend == TG_SERVE_BACKEND_CPU) {
        /* Every CPU rank gets the bytes planned for all ranks together
         * (a fraction read by each rank alone would not add up). */
        log_info("CPU backend: KV pool %lld MiB per rank x %lld (host "
                 "memory available %lld MiB, weights ~%lld MiB)",
                 (long long)(pre.kv_bytes_per_rank >> 20), (long long)o.tp,
                 (long long)(pre.host_available >> 20),
                 (long long)(pre.cpu_weight_bytes >> 20));
        o.kv_memory.is_fraction = false;
        o.kv_memory.bytes = (uint64_t)pre.kv_bytes_per_rank;
    }

    rc = td_sup_run(&o, &paths, environ, err, sizeof err);
    td_sup_paths_cleanup(&paths);
    td_options_free(&o);
    if (rc == TG_ECANCELED) {
        log_warn("stopped by a second signal: children killed");
        return 1;
    }
    if (rc == TG_ESTARTUP)
        return startup_failed(err);
    if (rc != 0) {
        fprintf(stderr, "tangramd: %s\n", err);
        return 1;
    }
    log_info("tangramd stopped");
    return 0;
}
