/*
 * tg_config.h — one declarative configuration table from which command-line
 * flags, TANGRAM_* environment variables, --help and a JSON dump of the
 * effective configuration are all derived (DESIGN.md §8.11; the pattern of
 * redis config.c, written from scratch here).
 *
 * A program describes the fields of its own options struct once:
 *
 *     static const struct tg_config_entry table[] = {
 *         { .name = "tp", .type = TG_CONFIG_INT, .def = "1", .min = 1,
 *           .max = 64, .offset = TG_CONFIG_OFFSET(struct opts, tp, int64_t),
 *           .metavar = "N", .help = "Tensor-parallel ranks." },
 *     };
 *
 * and tg_config_parse() fills the struct in three layers, later layers
 * winning: the table default, then the environment variable TANGRAM_<NAME>
 * (name upper-cased, '-' -> '_': "http-port" -> TANGRAM_HTTP_PORT), then the
 * flags `--name value` / `--name=value` (bools: `--name`, `--no-name`,
 * `--name=true|false`). A flag given twice keeps the last value. Unknown
 * TANGRAM_* variables are ignored (tests and scripts use TANGRAM_DATA etc.);
 * unknown flags are errors that suggest the closest known name.
 *
 * Value syntax per type (the C type of the field is in brackets):
 *   BOOL      [bool]     true|false|1|0|yes|no|on|off (any case)
 *   INT       [int64_t]  decimal integer, optional sign
 *   DOUBLE    [double]   finite decimal number (strtod syntax, no inf/nan)
 *   STRING    [char *]   any text, copied; owned by the struct
 *   SIZE      [uint64_t] bytes: a number with an optional unit K M G T
 *                        (powers of 1000) or Ki Mi Gi Ti (powers of 1024),
 *                        optionally followed by B, any case ("8GiB", "512m",
 *                        "1.5G"); fractional results round down to whole bytes
 *   SIZE_FRAC [struct tg_config_amount] either a fraction of a whole (a plain
 *                        number in (0, 1] such as "0.9", or a percentage
 *                        "90%") or bytes (a SIZE with a unit, or a plain
 *                        integer > 1)
 *   ENUM      [int]      one of the entry's choices; the field gets its index
 *
 * Ranges: for INT, DOUBLE and SIZE (and the bytes form of SIZE_FRAC) the
 * value must lie in [min, max] when max > min; with max <= min (e.g. both
 * left 0) there is no range check. The fraction form of SIZE_FRAC must be in
 * (0, 1]. Bounds are doubles, so exact up to 2^53; INFINITY as max bounds
 * one side only (shown as "inf").
 *
 * Errors name the flag ("--tp") or the variable ("TANGRAM_TP") and the
 * reason. Codes: TG_EINVAL for usage errors (unknown flag, missing value,
 * unexpected positional argument, missing required option, bad choice),
 * TG_EFORMAT for a malformed value, TG_ERANGE for a value out of range,
 * TG_ENOMEM, and TG_EDONE when --help or -h was given.
 *
 * Nothing here prints on its own: help text goes only to a FILE* the caller
 * hands in. No global state; any thread, one dst per thread.
 */
#ifndef TG_CONFIG_H
#define TG_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum tg_config_type {
    TG_CONFIG_BOOL = 0,      /* bool */
    TG_CONFIG_INT = 1,       /* int64_t */
    TG_CONFIG_DOUBLE = 2,    /* double */
    TG_CONFIG_STRING = 3,    /* char * (owned by the struct) */
    TG_CONFIG_SIZE = 4,      /* uint64_t bytes */
    TG_CONFIG_SIZE_FRAC = 5, /* struct tg_config_amount */
    TG_CONFIG_ENUM = 6,      /* int index into choices */
};

/* Entry flags. */
#define TG_CONFIG_REQUIRED 0x1u /* parse fails unless env or a flag sets it */
#define TG_CONFIG_SECRET 0x2u   /* value is masked in the JSON dump */

/* Marks: bits 8..15 of the flags are left to the table's owner, e.g. to say
 * which program of several takes a row (common/base/tg_serve_opts.h). tg_config
 * itself never reads them. k is 0..7. */
#define TG_CONFIG_MARK(k) (0x100u << (k))

/* The value of a SIZE_FRAC field: "a share of something" or "so many
 * bytes". Exactly one of the two forms is meaningful. */
struct tg_config_amount {
    bool is_fraction; /* true: use fraction; false: use bytes */
    double fraction;  /* in (0, 1] when is_fraction */
    uint64_t bytes;   /* when !is_fraction */
};

/* One option. Tables are static const data owned by the program. */
struct tg_config_entry {
    const char *name;         /* flag name without "--": lower case, digits,
                                 '-'; unique; not "help" */
    enum tg_config_type type;
    const char *def;          /* default in the value syntax above; NULL
                                 leaves the field zero (a STRING stays NULL) */
    double min, max;          /* inclusive range, checked when max > min */
    size_t offset;            /* of the field in the caller's struct; use
                                 TG_CONFIG_OFFSET to type-check it */
    const char *const *choices; /* ENUM only: NULL-terminated names */
    const char *help;         /* one sentence for --help */
    const char *metavar;      /* value placeholder in --help ("DIR");
                                 NULL picks one from the type */
    unsigned flags;           /* TG_CONFIG_REQUIRED | TG_CONFIG_SECRET |
                                 TG_CONFIG_MARK(k) */
    char short_flag;          /* 0, or a one-letter alias ('o': "-o OUT",
                                 "-oOUT"; a bool takes no value): a letter
                                 or digit, unique, not 'h' */
};

/* offsetof(s, f), but a compile error unless member f of struct type s has
 * exactly the C type ctype (e.g. int64_t for TG_CONFIG_INT), so a table can
 * never write the wrong width into a field. */
#define TG_CONFIG_OFFSET(s, f, ctype)                                   \
    (offsetof(s, f) +                                                   \
     0 * sizeof(char[_Generic(((s *)0)->f, ctype: 1, default: -1)]))

/* Command-line handling beyond the plain parse. Zero-initialize, set what
 * you need; tg_config_parse_cli fills npositional. */
struct tg_config_cli {
    const char *usage;  /* first line of --help ("usage: tangramd
                           [options]"); NULL for none */
    FILE *help_out;     /* where --help writes; NULL writes nothing */
    int *positional;    /* out: argv indices of positional arguments */
    size_t positional_cap; /* capacity of positional; 0 rejects them all */
    size_t npositional; /* out: how many were stored */
    bool no_env;        /* the program reads no TANGRAM_* variables (a
                           one-shot tool whose flag names would collide
                           with the daemon's variables): envp is ignored,
                           --help has no ENVIRONMENT column and messages
                           name only flags */
};

/* Fills the fields of `dst` described by table[0..n) from defaults, then
 * envp, then argv, as described at the top of this file. argv[0] is the
 * program name and is skipped; "--" ends the flags (everything after it is
 * positional). envp is a NULL-terminated array of "KEY=VALUE" strings (pass
 * `environ` in a daemon) or NULL to consult no environment at all (see also
 * cli->no_env); the first matching KEY wins, as with getenv. An entry with a
 * short_flag also takes "-c VALUE" and "-cVALUE" ("-c" alone for a bool). --help / -h anywhere before "--" wins
 * over every other argument: help goes to cli->help_out (when cli and it are
 * non-NULL) and TG_EDONE is returned with dst holding the defaults.
 *
 * dst must be zeroed or hold the result of an earlier parse with the same
 * table (its strings are freed and replaced). On every return, success or
 * not, dst may own strings: release them with tg_config_free. cli may be
 * NULL (no usage line, no help output, positionals rejected).
 * Returns 0, TG_EDONE, TG_EINVAL, TG_EFORMAT, TG_ERANGE or TG_ENOMEM, with
 * detail in err. Thread: any, one dst per call at a time. */
int tg_config_parse_cli(const struct tg_config_entry *table, size_t n,
                        void *dst, struct tg_config_cli *cli, int argc,
                        char **argv, char **envp, char *err, size_t errlen);

/* tg_config_parse_cli with cli == NULL: positional arguments are rejected
 * and --help returns TG_EDONE without writing anything (call
 * tg_config_help to print it). */
int tg_config_parse(const struct tg_config_entry *table, size_t n, void *dst,
                    int argc, char **argv, char **envp, char *err,
                    size_t errlen);

/* Writes the help text for table[0..n) to `out`: the usage line (when
 * non-NULL), then one aligned row per entry with the flag (and its short
 * form) and its metavar, the environment variable, the type, the default,
 * the range or choices and the help sentence (wrapped in its column), then
 * a row for --help. tg_config_parse_cli with cli->no_env writes the same
 * without the environment column. Returns 0 or TG_EIO when writing fails.
 * Thread: any. */
int tg_config_help(const struct tg_config_entry *table, size_t n,
                   const char *usage, FILE *out);

/* Writes the environment variable name of `e` ("TANGRAM_HTTP_PORT") into
 * buf[0..len). Returns 0, or TG_ETOOBIG when it does not fit. */
int tg_config_env_name(const struct tg_config_entry *e, char *buf,
                       size_t len);

/* Frees the STRING fields of `dst` described by the table and sets them to
 * NULL; other fields are left alone. Safe on a zeroed dst and after a failed
 * parse; idempotent. */
void tg_config_free(const struct tg_config_entry *table, size_t n, void *dst);

/* Returns a new JSON object (caller decrefs) mapping each flag name to its
 * effective value in dst: bools, integers, reals, strings (NULL -> null),
 * SIZE as an integer number of bytes, SIZE_FRAC as a real (fraction form) or
 * an integer (bytes form), ENUM as its choice name. SECRET entries show
 * "***" when set to a non-empty string, "" otherwise. Returns NULL when out
 * of memory. Thread: any. */
json_t *tg_config_dump_json(const struct tg_config_entry *table, size_t n,
                            const void *dst);

/* ---- Options back to flags (tg_config_argv.c) --------------------------
 * A supervisor that parsed its own options hands them on to child programs
 * as flags. Each emitted flag is one "--name=value" string (the '=' form, so
 * a value starting with '-' is never taken for a flag), formatted so that
 * tg_config_parse of the same table gives back the same field values:
 * BOOL true|false, INT decimal, DOUBLE the shortest decimal that reads back
 * to the same double, STRING verbatim, SIZE "<bytes>", SIZE_FRAC either a
 * plain decimal fraction ("0.9") or "<bytes>B", ENUM the choice name.
 * A STRING field that is NULL is left out (the child's default applies).
 *
 * The argv arrays below are malloc'ed, NULL-terminated arrays of malloc'ed
 * strings with their length kept beside them (*argc, not counting the
 * terminating NULL); start from *argv == NULL, *argc == 0. */

/* Appends one flag per entry of table[0..n) to *argv: only the entries whose
 * name is in the NULL-terminated list `only` (NULL = every entry), and none
 * whose flags intersect `skip_flags` (e.g. TG_CONFIG_SECRET, to keep a key
 * out of a child's command line). Entries are emitted in table order.
 * Returns 0, TG_EINVAL (an ENUM index outside its choices, or a name in
 * `only` that the table lacks) or TG_ENOMEM, with detail in err; on failure
 * *argv keeps the entries appended so far and stays valid. Thread: any. */
int tg_config_to_argv(const struct tg_config_entry *table, size_t n,
                      const void *src, const char *const *only,
                      unsigned skip_flags, char ***argv, size_t *argc,
                      char *err, size_t errlen);

/* Appends a copy of `s` to *argv. Returns 0 or TG_ENOMEM (then *argv is
 * unchanged). Thread: any. */
int tg_config_argv_push(char ***argv, size_t *argc, const char *s);

/* Frees argv[0..argc) and the array. Safe on NULL. */
void tg_config_argv_free(char **argv, size_t argc);

#endif /* TG_CONFIG_H */
