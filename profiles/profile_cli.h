/*
 * profile_cli.h — what tangram-profile's sub-commands share across its
 * files: tangram_profile.c (the program, most sub-commands, the dispatch)
 * and profile_evaluate.c (`evaluate`), built into one program
 * (cmake/tangram.cmake: a program tangram_X.c takes the X_*.c beside it).
 */
#ifndef PROFILE_CLI_H
#define PROFILE_CLI_H

#include <stddef.h>

#include "common/base/tg_config.h"

#define PROG "tangram-profile"
#define EXIT_USAGE 2

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    const char *usage;
};

/* "tangram-profile: <fmt with detail>" on stderr; returns EXIT_FAILURE. */
int profile_cli_fail(const char *fmt, const char *detail);

/* The running sub-command's usage error (message and usage line on
 * stderr); returns EXIT_USAGE. */
int profile_cli_usage_error(const char *msg);

/* Parses the running sub-command's flags with `table` into dst. Returns
 * -1 to go on, else the exit status to end with (0 after --help). */
int profile_cli_parse_flags(const struct tg_config_entry *table, size_t n,
                            void *dst, int argc, char **argv);

/* `tangram-profile evaluate` (profile_evaluate.c). */
int profile_cli_evaluate(int argc, char **argv);

#endif /* PROFILE_CLI_H */
