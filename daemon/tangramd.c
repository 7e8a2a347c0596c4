/*
 * tangramd — the serving daemon's supervisor (DESIGN.md §2, §5).
 *
 * Parses every option of daemon/td_options.h (flags and TANGRAM_* variables),
 * creates the runtime directory, then runs the supervisor of
 * daemon/td_supervisor.h: the router and --tp workers are started, restarted
 * with backoff when they die, and drained on SIGTERM/SIGINT.
 *
 * Exit status: 0 after a drain, 1 when start-up failed or a second signal
 * cut the drain short, 2 for bad options.
 */
#include "common/tg_err.h"
#include "common/tg_log.h"
#include "daemon/td_options.h"
#include "daemon/td_supervisor.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

extern char **environ;

int main(int argc, char **argv)
{
    struct td_options o = {0};
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
        fprintf(stderr, "tangramd: %s\n", err);
        td_options_free(&o);
        return 1;
    }
    rc = td_sup_run(&o, &paths, environ, err, sizeof err);
    td_sup_paths_cleanup(&paths);
    td_options_free(&o);
    if (rc == TG_ECANCELED) {
        log_warn("stopped by a second signal: children killed");
        return 1;
    }
    if (rc != 0) {
        fprintf(stderr, "tangramd: %s\n", err);
        return 1;
    }
    log_info("tangramd stopped");
    return 0;
}
