/*
 * td_options.h — tangramd's command line: the rows of the serving option
 * table marked for tangramd (common/base/tg_serve_opts.h, which declares every
 * flag, its TANGRAM_* variable, default and range once), tangramd's usage
 * text, and what tangramd checks beyond the table.
 *
 * Precedence: flag > environment > default (TANGRAM_API_KEY keeps the key
 * out of `ps`). After the table is applied, td_options_parse normalizes a
 * few values and checks the options that constrain each other.
 */
#ifndef TD_OPTIONS_H
#define TD_OPTIONS_H

#include "common/base/tg_config.h"
#include "common/base/tg_serve_opts.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The shortest --router-stall-ms: twice the router's 1 s WATCHDOG period
 * (router/core/rt_server.c), so one late tick never kills it. */
#define TD_ROUTER_STALL_MIN_MS 2000

/* tangramd's rows of the serving table (static, read-only) and their
 * number. */
const struct tg_config_entry *td_options_table(size_t *n);

/* Parses argv/envp into *o (see tg_config_parse for the syntax; envp is
 * `environ` in the daemon, NULL to ignore the environment). *o must be
 * zeroed or hold a previous parse. Afterwards: profile "none" (any case) or
 * "" becomes NULL; an empty served_model_name becomes the last component of
 * model ("/models/llama-3-8b/" -> "llama-3-8b"). Cross-checks:
 * max_batched_tokens >= prefill_chunk (a chunk must fit in one step) and
 * max_batched_tokens >= max_num_seqs (every running request may decode),
 * router_stall_ms 0 or at least TD_ROUTER_STALL_MIN_MS.
 * Positional arguments are rejected. --help / -h returns TG_EDONE and
 * writes nothing: the caller prints td_options_help(stdout) and exits 0.
 * Returns 0 or a negative TG_E* code with detail in err naming the flag or
 * environment variable. On every return *o may own strings: call
 * td_options_free. Thread: any, one *o at a time. */
int td_options_parse(struct tg_serve_opts *o, int argc, char **argv,
                     char **envp, char *err, size_t errlen);

/* Writes tangramd's --help to `out`. Returns 0 or TG_EIO. */
int td_options_help(FILE *out);

/* Returns the effective options as a new JSON object (caller decrefs; the
 * API key is masked), for the start-up log line; NULL when out of memory. */
json_t *td_options_dump_json(const struct tg_serve_opts *o);

/* Frees the strings of *o and sets them to NULL (tg_serve_opts_free). Safe
 * on a zeroed struct, after a failed parse, and twice. */
void td_options_free(struct tg_serve_opts *o);

#endif /* TD_OPTIONS_H */
