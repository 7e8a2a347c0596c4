/* test_config.c — the declarative config table (common/base/tg_config.h) and the
 * tangramd option table (daemon/td_options.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/tg_config.h"
#include "common/base/tg_err.h"
#include "daemon/td_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a test table with one field of every type ------------------------ */

struct t_opts {
    bool verbose;
    int64_t count;
    double ratio;
    char *name;
    uint64_t buf;
    struct tg_config_amount mem;
    int color;
    char *secret;
    char *nodef;
};

#define T_OFF(f, ctype) TG_CONFIG_OFFSET(struct t_opts, f, ctype)
static const char *const colors[] = {"red", "green", "blue", NULL};

static const struct tg_config_entry ttab[] = {
    {.name = "verbose", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = T_OFF(verbose, bool), .help = "Talk more."},
    {.name = "count", .type = TG_CONFIG_INT, .def = "3", .min = -5,
     .max = 100, .offset = T_OFF(count, int64_t), .help = "How many."},
    {.name = "ratio", .type = TG_CONFIG_DOUBLE, .def = "0.5", .min = 0,
     .max = 1, .offset = T_OFF(ratio, double), .help = "A share."},
    {.name = "name", .type = TG_CONFIG_STRING, .def = "anon",
     .offset = T_OFF(name, char *), .help = "Who."},
    {.name = "buf", .type = TG_CONFIG_SIZE, .def = "4KiB",
     .offset = T_OFF(buf, uint64_t), .help = "Buffer bytes."},
    {.name = "mem", .type = TG_CONFIG_SIZE_FRAC, .def = "0.9", .min = 1024,
     .max = 1099511627776.0, .offset = T_OFF(mem, struct tg_config_amount),
     .help = "Memory."},
    {.name = "color", .type = TG_CONFIG_ENUM, .def = "green",
     .offset = T_OFF(color, int), .choices = colors, .help = "Paint."},
    {.name = "secret", .type = TG_CONFIG_STRING, .def = "",
     .offset = T_OFF(secret, char *), .flags = TG_CONFIG_SECRET,
     .help = "Hidden."},
    {.name = "nodef", .type = TG_CONFIG_STRING,
     .offset = T_OFF(nodef, char *), .help = "No default."},
};
#define NT (sizeof ttab / sizeof ttab[0])

static char errbuf[512];

/* Parses a NULL-terminated list of flags (program name prepended) with the
 * given environment into *o. */
static int tparse_env(struct t_opts *o, char **envp, const char *const *args)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"prog";
    for (size_t i = 0; args != NULL && args[i] != NULL; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    errbuf[0] = '\0';
    return tg_config_parse(ttab, NT, o, argc, argv, envp, errbuf,
                           sizeof errbuf);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define TPARSE(o, ...) tparse_env((o), NULL, ARGS(__VA_ARGS__))

/* Asserts parsing `flag value` fails with code rc and a message containing
 * `needle`. */
static void expect_fail(int rc, const char *needle, const char *const *args)
{
    struct t_opts o = {0};
    int got = tparse_env(&o, NULL, args);
    if (got != rc || strstr(errbuf, needle) == NULL)
        fail_msg("args[0]=%s: got %d '%s', want %d containing '%s'",
                 args[0], got, errbuf, rc, needle);
    tg_config_free(ttab, NT, &o);
}

static void test_defaults(void **state)
{
    (void)state;
    struct t_opts o = {0};
    assert_int_equal(tparse_env(&o, NULL, NULL), 0);
    assert_false(o.verbose);
    assert_int_equal(o.count, 3);
    assert_true(o.ratio == 0.5);
    assert_string_equal(o.name, "anon");
    assert_int_equal(o.buf, 4096);
    assert_true(o.mem.is_fraction);
    assert_true(o.mem.fraction == 0.9);
    assert_int_equal(o.color, 1);
    assert_string_equal(o.secret, "");
    assert_null(o.nodef);
    tg_config_free(ttab, NT, &o);
    assert_null(o.name);
    assert_null(o.secret);
}

static void test_env_and_precedence(void **state)
{
    (void)state;
    char *envp[] = {"PATH=/bin", "TANGRAM_COUNT=7", "TANGRAM_NAME=envname",
                    "TANGRAM_VERBOSE=yes", "TANGRAM_MEM=2GiB",
                    "TANGRAM_COLOR=blue", "TANGRAM_UNKNOWN_THING=1",
                    "TANGRAM_COUNT=99", /* later duplicate: getenv order */
                    NULL};
    struct t_opts o = {0};
    assert_int_equal(tparse_env(&o, envp, NULL), 0);
    assert_int_equal(o.count, 7);
    assert_string_equal(o.name, "envname");
    assert_true(o.verbose);
    assert_false(o.mem.is_fraction);
    assert_int_equal(o.mem.bytes, 2ull << 30);
    assert_int_equal(o.color, 2);

    /* Flags win over the environment; the environment over defaults. */
    assert_int_equal(tparse_env(&o, envp, ARGS("--count", "9", "--no-verbose",
                                               "--name=flagname")),
                     0);
    assert_int_equal(o.count, 9);
    assert_false(o.verbose);
    assert_string_equal(o.name, "flagname");
    assert_int_equal(o.color, 2);          /* env still applies */
    assert_true(o.ratio == 0.5);           /* default still applies */

    /* envp == NULL consults no environment at all. */
    assert_int_equal(tparse_env(&o, NULL, NULL), 0);
    assert_int_equal(o.count, 3);
    assert_string_equal(o.name, "anon");

    /* A bad environment value names the variable. */
    char *bad[] = {"TANGRAM_COUNT=lots", NULL};
    assert_int_equal(tparse_env(&o, bad, NULL), TG_EFORMAT);
    assert_non_null(strstr(errbuf, "TANGRAM_COUNT"));
    assert_non_null(strstr(errbuf, "lots"));
    char *empty[] = {"TANGRAM_RATIO=", NULL};
    assert_int_equal(tparse_env(&o, empty, NULL), TG_EFORMAT);
    assert_non_null(strstr(errbuf, "TANGRAM_RATIO"));
    tg_config_free(ttab, NT, &o);
}

static void test_env_name(void **state)
{
    (void)state;
    struct tg_config_entry e = {.name = "max-batched-tokens"};
    char buf[64];
    assert_int_equal(tg_config_env_name(&e, buf, sizeof buf), 0);
    assert_string_equal(buf, "TANGRAM_MAX_BATCHED_TOKENS");
    assert_int_equal(tg_config_env_name(&e, buf, 10), TG_ETOOBIG);
}

static void test_bool(void **state)
{
    (void)state;
    struct t_opts o = {0};
    assert_int_equal(TPARSE(&o, "--verbose"), 0);
    assert_true(o.verbose);
    assert_int_equal(TPARSE(&o, "--verbose", "--no-verbose"), 0);
    assert_false(o.verbose);
    assert_int_equal(TPARSE(&o, "--verbose=TRUE"), 0);
    assert_true(o.verbose);
    assert_int_equal(TPARSE(&o, "--verbose=off"), 0);
    assert_false(o.verbose);
    assert_int_equal(TPARSE(&o, "--verbose=1"), 0);
    assert_true(o.verbose);
    tg_config_free(ttab, NT, &o);
    expect_fail(TG_EFORMAT, "--verbose: 'maybe' is not a boolean",
                ARGS("--verbose=maybe"));
    expect_fail(TG_EINVAL, "--no-verbose does not take a value",
                ARGS("--no-verbose=1"));
    /* Bools never take a separate value: "true" is a stray argument. */
    expect_fail(TG_EINVAL, "unexpected argument 'true'",
                ARGS("--verbose", "true"));
    /* --no- only exists for bools. */
    expect_fail(TG_EINVAL, "unknown flag '--no-count'", ARGS("--no-count"));
}

static void test_int(void **state)
{
    (void)state;
    struct t_opts o = {0};
    assert_int_equal(TPARSE(&o, "--count", "-5"), 0);
    assert_int_equal(o.count, -5);
    assert_int_equal(TPARSE(&o, "--count=+100"), 0);
    assert_int_equal(o.count, 100);
    tg_config_free(ttab, NT, &o);
    expect_fail(TG_EFORMAT, "--count: '12x' is not an integer",
                ARGS("--count", "12x"));
    expect_fail(TG_EFORMAT, "is not an integer", ARGS("--count", " 5"));
    expect_fail(TG_EFORMAT, "is not an integer", ARGS("--count="));
    expect_fail(TG_EFORMAT, "is not an integer", ARGS("--count=1.5"));
    expect_fail(TG_ERANGE, "--count: 101 is out of range [-5, 100]",
                ARGS("--count", "101"));
    expect_fail(TG_ERANGE, "--count: -6 is out of range",
                ARGS("--count=-6"));
    expect_fail(TG_ERANGE, "out of range",
                ARGS("--count", "99999999999999999999999"));
}

static void test_double(void **state)
{
    (void)state;
    struct t_opts o = {0};
    assert_int_equal(TPARSE(&o, "--ratio", "0.25"), 0);
    assert_true(o.ratio == 0.25);
    assert_int_equal(TPARSE(&o, "--ratio=1e-3"), 0);
    assert_true(o.ratio == 1e-3);
    assert_int_equal(TPARSE(&o, "--ratio=1"), 0);
    assert_true(o.ratio == 1.0);
    tg_config_free(ttab, NT, &o);
    expect_fail(TG_EFORMAT, "--ratio: 'half' is not a number",
                ARGS("--ratio", "half"));
    expect_fail(TG_EFORMAT, "is not a number", ARGS("--ratio=nan"));
    expect_fail(TG_ERANGE, "out of range", ARGS("--ratio=inf"));
    expect_fail(TG_ERANGE, "--ratio: 1.5 is out of range [0, 1]",
                ARGS("--ratio=1.5"));
    expect_fail(TG_ERANGE, "out of range", ARGS("--ratio=-0.1"));
}

static void test_string(void **state)
{
    (void)state;
    struct t_opts o = {0};
    char val[] = "alice";
    assert_int_equal(TPARSE(&o, "--name", val, "--name", "bob",
                            "--nodef=x=y"),
                     0);
    assert_string_equal(o.name, "bob");
    assert_string_equal(o.nodef, "x=y"); /* only the first '=' splits */
    assert_int_equal(TPARSE(&o, "--name", val), 0);
    val[0] = 'A'; /* the struct holds its own copy */
    assert_string_equal(o.name, "alice");
    assert_null(o.nodef); /* re-parse resets to defaults */
    /* Values starting with "--" need the = form. */
    assert_int_equal(TPARSE(&o, "--name=--odd"), 0);
    assert_string_equal(o.name, "--odd");
    assert_int_equal(TPARSE(&o, "--name", "-"), 0); /* "-" is a value */
    assert_string_equal(o.name, "-");
    tg_config_free(ttab, NT, &o);
}

static void test_size(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        uint64_t want;
    } ok[] = {
        {"0", 0},
        {"10", 10},
        {"1B", 1},
        {"1K", 1000},
        {"1kb", 1000},
        {"1Ki", 1024},
        {"1KiB", 1024},
        {"512m", 512000000ull},
        {"8GiB", 8ull << 30},
        {"1.5G", 1500000000ull},
        {"1.5Ki", 1536},
        {"0.5", 0}, /* rounds down to whole bytes */
        {"2Ti", 2ull << 40},
        {"18446744073709551615", UINT64_MAX},
    };
    struct t_opts o = {0};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--buf=%s", ok[i].in);
        int rc = TPARSE(&o, flag);
        if (rc != 0 || o.buf != ok[i].want)
            fail_msg("%s: rc %d (%s) got %llu want %llu", ok[i].in, rc,
                     errbuf, (unsigned long long)o.buf,
                     (unsigned long long)ok[i].want);
    }
    tg_config_free(ttab, NT, &o);
    static const char *const bad[] = {"8GX", "-1", "G", "1e3", "0x10",
                                      "1 GiB", "", "1.2.3", "1KiBB",
                                      "1iB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--buf=%s", bad[i]);
        expect_fail(TG_EFORMAT, "is not a size", ARGS(flag));
    }
    expect_fail(TG_ERANGE, "out of range", ARGS("--buf=100000000Ti"));
    expect_fail(TG_ERANGE, "out of range",
                ARGS("--buf=99999999999999999999"));
}

static void test_size_frac(void **state)
{
    (void)state;
    struct t_opts o = {0};
    assert_int_equal(TPARSE(&o, "--mem", "0.5"), 0);
    assert_true(o.mem.is_fraction);
    assert_true(o.mem.fraction == 0.5);
    assert_int_equal(TPARSE(&o, "--mem", "90%"), 0);
    assert_true(o.mem.is_fraction);
    assert_true(o.mem.fraction > 0.8999999 && o.mem.fraction < 0.9000001);
    assert_int_equal(TPARSE(&o, "--mem", "1"), 0); /* all of it */
    assert_true(o.mem.is_fraction);
    assert_true(o.mem.fraction == 1.0);
    assert_int_equal(TPARSE(&o, "--mem", "8GiB"), 0);
    assert_false(o.mem.is_fraction);
    assert_int_equal(o.mem.bytes, 8ull << 30);
    assert_int_equal(TPARSE(&o, "--mem", "1073741824"), 0);
    assert_false(o.mem.is_fraction);
    assert_int_equal(o.mem.bytes, 1ull << 30);
    assert_int_equal(TPARSE(&o, "--mem", "1KiB"), 0); /* the minimum */
    assert_int_equal(o.mem.bytes, 1024);
    tg_config_free(ttab, NT, &o);
    expect_fail(TG_ERANGE, "fraction in (0, 1]", ARGS("--mem=0"));
    expect_fail(TG_ERANGE, "fraction in (0, 1]", ARGS("--mem=1.5"));
    expect_fail(TG_ERANGE, "(0%, 100%]", ARGS("--mem=150%"));
    expect_fail(TG_ERANGE, "(0%, 100%]", ARGS("--mem=0%"));
    expect_fail(TG_EFORMAT, "--mem: 'lots' is not a fraction",
                ARGS("--mem=lots"));
    expect_fail(TG_EFORMAT, "is not a fraction", ARGS("--mem=-0.5"));
    expect_fail(TG_EFORMAT, "is not a fraction", ARGS("--mem=x%"));
    expect_fail(TG_ERANGE, "out of range [1KiB, 1TiB] bytes",
                ARGS("--mem=2TiB"));
    expect_fail(TG_ERANGE, "out of range [1KiB, 1TiB] bytes",
                ARGS("--mem=100"));
}

static void test_enum(void **state)
{
    (void)state;
    struct t_opts o = {0};
    assert_int_equal(TPARSE(&o, "--color", "red"), 0);
    assert_int_equal(o.color, 0);
    assert_int_equal(TPARSE(&o, "--color=BLUE"), 0);
    assert_int_equal(o.color, 2);
    tg_config_free(ttab, NT, &o);
    expect_fail(TG_EINVAL, "--color: 'pink' is not one of red|green|blue",
                ARGS("--color", "pink"));
}

static void test_unknown_and_missing(void **state)
{
    (void)state;
    expect_fail(TG_EINVAL, "unknown flag '--cuont' (did you mean --count?)",
                ARGS("--cuont", "3"));
    expect_fail(TG_EINVAL, "unknown flag '--verbos' (did you mean --verbose?)",
                ARGS("--verbos"));
    expect_fail(TG_EINVAL, "(did you mean --no-verbose?)",
                ARGS("--no-verbos"));
    expect_fail(TG_EINVAL, "unknown flag '--zzzzzz' (see --help)",
                ARGS("--zzzzzz"));
    /* The value of a mistyped flag is never echoed (it may be a secret). */
    expect_fail(TG_EINVAL, "unknown flag '--secrte' (did you mean --secret?)",
                ARGS("--secrte=hunter2"));
    {
        struct t_opts o = {0};
        assert_int_equal(TPARSE(&o, "--secrte=hunter2"), TG_EINVAL);
        assert_null(strstr(errbuf, "hunter2"));
        tg_config_free(ttab, NT, &o);
    }
    expect_fail(TG_EINVAL, "unknown option '-v'", ARGS("-v"));
    expect_fail(TG_EINVAL, "--count: missing value", ARGS("--count"));
    expect_fail(TG_EINVAL, "--count: missing value (next argument is "
                           "'--verbose'",
                ARGS("--count", "--verbose"));
    expect_fail(TG_EINVAL, "--help does not take a value", ARGS("--help=1"));
    expect_fail(TG_EINVAL, "unexpected argument 'stray'", ARGS("stray"));
    expect_fail(TG_EINVAL, "unexpected argument 'x'", ARGS("--", "x"));
}

static void test_positional(void **state)
{
    (void)state;
    char *argv[] = {"prog", "a", "--count", "4", "b", "--", "--count", NULL};
    int pos[4];
    struct tg_config_cli cli = {.positional = pos, .positional_cap = 4};
    struct t_opts o = {0};
    assert_int_equal(tg_config_parse_cli(ttab, NT, &o, &cli, 7, argv, NULL,
                                         errbuf, sizeof errbuf),
                     0);
    assert_int_equal(o.count, 4);
    assert_int_equal(cli.npositional, 3);
    assert_int_equal(pos[0], 1);
    assert_int_equal(pos[1], 4);
    assert_int_equal(pos[2], 6); /* after "--" even flags are positional */
    cli.positional_cap = 2;
    assert_int_equal(tg_config_parse_cli(ttab, NT, &o, &cli, 7, argv, NULL,
                                         errbuf, sizeof errbuf),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "too many arguments"));
    tg_config_free(ttab, NT, &o);
}

/* Runs tg_config_parse_cli with help captured; returns the text (caller
 * frees) and the code in *rc. */
static char *parse_with_help(const char *const *args, int *rc)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)"prog";
    for (size_t i = 0; args[i] != NULL; i++)
        argv[argc++] = (char *)args[i];
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    struct tg_config_cli cli = {.usage = "usage: prog [options]",
                                .help_out = f};
    struct t_opts o = {0};
    *rc = tg_config_parse_cli(ttab, NT, &o, &cli, argc, argv, NULL, errbuf,
                              sizeof errbuf);
    fclose(f);
    if (*rc == TG_EDONE) /* defaults are in place */
        assert_int_equal(o.count, 3);
    tg_config_free(ttab, NT, &o);
    return text;
}

static void test_help(void **state)
{
    (void)state;
    int rc;
    char *text = parse_with_help(ARGS("--help"), &rc);
    assert_int_equal(rc, TG_EDONE);
    assert_true(strncmp(text, "usage: prog [options]\n", 22) == 0);
    for (size_t i = 0; i < NT; i++) {
        char env[64], flag[80];
        assert_int_equal(tg_config_env_name(&ttab[i], env, sizeof env), 0);
        snprintf(flag, sizeof flag, "--%s%s",
                 ttab[i].type == TG_CONFIG_BOOL ? "[no-]" : "", ttab[i].name);
        if (strstr(text, flag) == NULL || strstr(text, env) == NULL ||
            strstr(text, ttab[i].help) == NULL)
            fail_msg("help lacks %s / %s:\n%s", flag, env, text);
    }
    assert_non_null(strstr(text, "red|green|blue"));
    assert_non_null(strstr(text, "[-5, 100]"));
    assert_non_null(strstr(text, "4KiB"));
    assert_non_null(strstr(text, "(0, 1] or [1KiB, 1TiB]"));
    assert_non_null(strstr(text, "--help, -h"));
    /* Columns are aligned: the env column starts at the same offset on
     * every row that has one. */
    const char *rows[] = {"--count N", "--[no-]verbose", "--mem BYTES|FRAC"};
    long col = -1;
    for (size_t i = 0; i < 3; i++) {
        const char *p = strstr(text, rows[i]);
        assert_non_null(p);
        const char *bol = p;
        while (bol > text && bol[-1] != '\n')
            bol--;
        const char *env = strstr(p, "TANGRAM_");
        long c = (long)(env - bol);
        if (col >= 0)
            assert_int_equal(c, col);
        col = c;
    }
    free(text);

    /* -h works too, and help wins over a bad value elsewhere; a flag's
     * separate value is not mistaken for -h. */
    text = parse_with_help(ARGS("--count", "oops", "-h"), &rc);
    assert_int_equal(rc, TG_EDONE);
    assert_non_null(strstr(text, "--count"));
    free(text);
    text = parse_with_help(ARGS("--name", "-h"), &rc);
    assert_int_equal(rc, 0);
    assert_true(text == NULL || text[0] == '\0');
    free(text);
    /* A flag missing its value does not swallow a following --help. */
    text = parse_with_help(ARGS("--count", "--help"), &rc);
    assert_int_equal(rc, TG_EDONE);
    free(text);
    /* After "--", --help is a positional argument. */
    text = parse_with_help(ARGS("--", "--help"), &rc);
    assert_int_equal(rc, TG_EINVAL);
    free(text);

    /* The plain parse reports help without writing anything. */
    struct t_opts o = {0};
    assert_int_equal(TPARSE(&o, "--help"), TG_EDONE);
    tg_config_free(ttab, NT, &o);
}

static void test_required_and_table_checks(void **state)
{
    (void)state;
    struct req {
        char *path;
    } r = {0};
    const struct tg_config_entry rt[] = {
        {.name = "path", .type = TG_CONFIG_STRING, .flags = TG_CONFIG_REQUIRED,
         .offset = TG_CONFIG_OFFSET(struct req, path, char *)},
    };
    char *argv[] = {"p", "--path", "", NULL};
    assert_int_equal(tg_config_parse(rt, 1, &r, 1, argv, NULL, errbuf,
                                     sizeof errbuf),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "missing required --path (or environment "
                                   "variable TANGRAM_PATH)"));
    assert_int_equal(tg_config_parse(rt, 1, &r, 3, argv, NULL, errbuf,
                                     sizeof errbuf),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "must not be empty"));
    char *envp[] = {"TANGRAM_PATH=/x", NULL};
    assert_int_equal(tg_config_parse(rt, 1, &r, 1, argv, envp, errbuf,
                                     sizeof errbuf),
                     0);
    assert_string_equal(r.path, "/x");
    tg_config_free(rt, 1, &r);

    /* Broken tables are reported, not crashed on. */
    struct t_opts o = {0};
    struct tg_config_entry dup[2] = {ttab[1], ttab[1]};
    assert_int_equal(tg_config_parse(dup, 2, &o, 1, argv, NULL, errbuf,
                                     sizeof errbuf),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "listed twice"));
    struct tg_config_entry bad = ttab[1];
    bad.def = "many";
    assert_int_equal(tg_config_parse(&bad, 1, &o, 1, argv, NULL, errbuf,
                                     sizeof errbuf),
                     TG_EFORMAT);
    assert_non_null(strstr(errbuf, "default of --count"));
    bad = ttab[1];
    bad.name = "help";
    assert_int_equal(tg_config_parse(&bad, 1, &o, 1, argv, NULL, errbuf,
                                     sizeof errbuf),
                     TG_EINVAL);
    bad.name = "Bad_Name";
    assert_int_equal(tg_config_parse(&bad, 1, &o, 1, argv, NULL, errbuf,
                                     sizeof errbuf),
                     TG_EINVAL);
    bad = ttab[6];
    bad.choices = NULL;
    assert_int_equal(tg_config_parse(&bad, 1, &o, 1, argv, NULL, errbuf,
                                     sizeof errbuf),
                     TG_EINVAL);
    tg_config_free(ttab, NT, &o);
}

static void test_dump_json(void **state)
{
    (void)state;
    struct t_opts o = {0};
    assert_int_equal(TPARSE(&o, "--verbose", "--secret", "hunter2",
                            "--buf=1MiB", "--color=red"),
                     0);
    json_t *j = tg_config_dump_json(ttab, NT, &o);
    assert_non_null(j);
    assert_true(json_is_true(json_object_get(j, "verbose")));
    assert_int_equal(json_integer_value(json_object_get(j, "count")), 3);
    assert_true(json_real_value(json_object_get(j, "ratio")) == 0.5);
    assert_string_equal(json_string_value(json_object_get(j, "name")), "anon");
    assert_int_equal(json_integer_value(json_object_get(j, "buf")), 1 << 20);
    assert_true(json_real_value(json_object_get(j, "mem")) == 0.9);
    assert_string_equal(json_string_value(json_object_get(j, "color")), "red");
    assert_string_equal(json_string_value(json_object_get(j, "secret")), "***");
    assert_true(json_is_null(json_object_get(j, "nodef")));
    char *s = json_dumps(j, 0);
    assert_null(strstr(s, "hunter2"));
    free(s);
    json_decref(j);
    assert_int_equal(TPARSE(&o, "--mem=3GiB"), 0);
    j = tg_config_dump_json(ttab, NT, &o);
    assert_int_equal(json_integer_value(json_object_get(j, "mem")), 3ll << 30);
    assert_string_equal(json_string_value(json_object_get(j, "secret")), "");
    json_decref(j);
    tg_config_free(ttab, NT, &o);
}

static void test_free_zeroed(void **state)
{
    (void)state;
    struct t_opts o;
    memset(&o, 0, sizeof o);
    tg_config_free(ttab, NT, &o);
    tg_config_free(ttab, NT, &o);
    tg_config_free(ttab, NT, NULL);
    struct tg_serve_opts t;
    memset(&t, 0, sizeof t);
    td_options_free(&t);
    td_options_free(&t);
    /* Free after a failed parse releases what was set before the error. */
    assert_int_equal(TPARSE(&o, "--name", "x", "--nodef", "y", "--count=z"),
                     TG_EFORMAT);
    tg_config_free(ttab, NT, &o);
    assert_null(o.name);
    assert_null(o.nodef);
}

/* ---- tangramd options ------------------------------------------------- */

static int tdparse(struct tg_serve_opts *o, char **envp, const char *const *args)
{
    char *argv[40];
    int argc = 0;
    argv[argc++] = (char *)"tangramd";
    for (size_t i = 0; args != NULL && args[i] != NULL; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    errbuf[0] = '\0';
    return td_options_parse(o, argc, argv, envp, errbuf, sizeof errbuf);
}

static void test_td_defaults(void **state)
{
    (void)state;
    struct tg_serve_opts o = {0};
    assert_int_equal(tdparse(&o, NULL, ARGS("--model", "/models/tiny-llama/")),
                     0);
    assert_string_equal(o.model, "/models/tiny-llama/");
    assert_null(o.profile);
    assert_int_equal(o.backend, TG_SERVE_BACKEND_CPU);
    assert_int_equal(o.tp, 1);
    assert_string_equal(o.host, "127.0.0.1");
    assert_int_equal(o.http_port, 8000);
    assert_int_equal(o.grpc_port, 50051);
    assert_int_equal(o.heads_per_group, 4);
    assert_int_equal(o.page_size, 16);
    assert_int_equal(o.prefill_chunk, 512);
    assert_int_equal(o.max_num_seqs, 256);
    assert_int_equal(o.max_batched_tokens, 2048); /* the cpu backend's */
    assert_true(o.kv_memory.is_fraction);
    assert_true(o.kv_memory.fraction == 0.9);
    assert_int_equal(o.max_queued, 1024);
    assert_string_equal(o.api_key, "");
    assert_int_equal(o.log_format, 0); /* TG_LOG_TEXT */
    assert_int_equal(o.log_level, 2);  /* TG_LOG_INFO */
    assert_true(o.shutdown_timeout == 30.0);
    assert_string_equal(o.served_model_name, "tiny-llama");
    assert_int_equal(o.max_model_len, 0);
    assert_int_equal(o.worker_heartbeat_ms, 1000);
    td_options_free(&o);
    assert_null(o.model);
    assert_null(o.host);

    /* --model is required. */
    assert_int_equal(tdparse(&o, NULL, NULL), TG_EINVAL);
    assert_non_null(strstr(errbuf, "--model"));
    assert_non_null(strstr(errbuf, "TANGRAM_MODEL"));
    td_options_free(&o);
}

static void test_td_env_flags(void **state)
{
    (void)state;
    char *envp[] = {"TANGRAM_MODEL=/m/qwen", "TANGRAM_API_KEY=sk-env",
                    "TANGRAM_HTTP_PORT=9000", "TANGRAM_KV_MEMORY=12GiB",
                    "TANGRAM_LOG_FORMAT=json", "TANGRAM_TP=2", NULL};
    struct tg_serve_opts o = {0};
    assert_int_equal(tdparse(&o, envp, ARGS("--tp", "4", "--backend=cuda",
                                            "--profile", "p.json",
                                            "--log-level", "debug",
                                            "--served-model-name", "qwen-x",
                                            "--shutdown-timeout", "2.5")),
                     0);
    assert_string_equal(o.model, "/m/qwen");
    assert_string_equal(o.api_key, "sk-env");
    assert_int_equal(o.http_port, 9000);
    assert_false(o.kv_memory.is_fraction);
    assert_int_equal(o.kv_memory.bytes, 12ull << 30);
    assert_int_equal(o.log_format, 1);
    assert_int_equal(o.log_level, 3);
    assert_int_equal(o.tp, 4); /* flag over env */
    assert_int_equal(o.backend, TG_SERVE_BACKEND_CUDA);
    assert_string_equal(o.profile, "p.json");
    assert_string_equal(o.served_model_name, "qwen-x");
    assert_true(o.shutdown_timeout == 2.5);
    assert_int_equal(o.max_batched_tokens, 8192); /* the cuda backend's */

    json_t *j = td_options_dump_json(&o);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "api-key")),
                        "***");
    assert_string_equal(json_string_value(json_object_get(j, "backend")),
                        "cuda");
    assert_int_equal(json_integer_value(json_object_get(j, "kv-memory")),
                     12ll << 30);
    size_t n;
    td_options_table(&n);
    assert_int_equal(json_object_size(j), n);
    json_decref(j);

    /* --profile none (any case) means no profile. */
    assert_int_equal(tdparse(&o, envp, ARGS("--profile", "NONE")), 0);
    assert_null(o.profile);
    assert_string_equal(o.served_model_name, "qwen");
    td_options_free(&o);
}

static void test_td_errors(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        int rc;
        const char *needle;
    } cases[] = {
        {"--tp", "0", TG_ERANGE, "--tp: 0 is out of range [1, 64]"},
        {"--tp", "65", TG_ERANGE, "[1, 64]"},
        {"--heads-per-group", "129", TG_ERANGE, "[1, 128]"},
        {"--http-port", "70000", TG_ERANGE, "[1, 65535]"},
        {"--backend", "gpu", TG_EINVAL, "is not one of cpu|cuda"},
        {"--log-level", "trace", TG_EINVAL, "err|warn|info|debug"},
        {"--log-format", "xml", TG_EINVAL, "text|json"},
        {"--kv-memory", "1.2", TG_ERANGE, "fraction in (0, 1]"},
        {"--kv-memory", "1KiB", TG_ERANGE, "[1MiB, 1PiB] bytes"},
        {"--htp-port", "1", TG_EINVAL, "did you mean --http-port?"},
        {"--port", "1", TG_EINVAL, "unknown flag '--port' (did you mean"},
        {"--max-batched-tokens", "256", TG_EINVAL,
         "--max-batched-tokens (256) must be at least --prefill-chunk"},
        {"--max-batched-tokens", "-1", TG_ERANGE, "[0, 16777216]"},
        {"--shutdown-timeout", "-1", TG_ERANGE, "--shutdown-timeout"},
        {"--worker-heartbeat-ms", "5", TG_ERANGE, "[10, 600000]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tg_serve_opts o = {0};
        int rc = tdparse(&o, NULL, ARGS("--model", "m", cases[i].a,
                                        cases[i].b));
        if (rc != cases[i].rc || strstr(errbuf, cases[i].needle) == NULL)
            fail_msg("%s %s: got %d '%s', want %d containing '%s'",
                     cases[i].a, cases[i].b, rc, errbuf, cases[i].rc,
                     cases[i].needle);
        td_options_free(&o);
    }
    struct tg_serve_opts o = {0};
    /* An explicit budget below the running requests is refused; the
     * backend's budget (0) rises to the chunk and the running requests. */
    assert_int_equal(tdparse(&o, NULL, ARGS("--model", "m",
                                            "--max-batched-tokens", "600",
                                            "--max-num-seqs", "1000")),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "--max-num-seqs (1000)"));
    assert_int_equal(tdparse(&o, NULL, ARGS("--model", "m",
                                            "--prefill-chunk", "9000")), 0);
    assert_int_equal(o.max_batched_tokens, 9000);
    assert_int_equal(tdparse(&o, NULL, ARGS("--model", "m",
                                            "--max-num-seqs", "4096")), 0);
    assert_int_equal(o.max_batched_tokens, 4096);
    /* A model path with no name needs an explicit served name. */
    assert_int_equal(tdparse(&o, NULL, ARGS("--model", "/")), TG_EINVAL);
    assert_non_null(strstr(errbuf, "--served-model-name"));
    assert_int_equal(tdparse(&o, NULL, ARGS("--model", "/",
                                            "--served-model-name", "root")),
                     0);
    assert_int_equal(tdparse(&o, NULL, ARGS("--model", "m", "extra")),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "unexpected argument 'extra'"));
    /* --help: TG_EDONE, nothing printed by the library. */
    assert_int_equal(tdparse(&o, NULL, ARGS("--help")), TG_EDONE);
    td_options_free(&o);
}

static void test_td_help(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(td_options_help(f), 0);
    fclose(f);
    assert_non_null(strstr(text, "usage: tangramd"));
    size_t n;
    const struct tg_config_entry *t = td_options_table(&n);
    assert_true(n >= 21);
    /* Every flag of DESIGN.md §5 plus the daemon extras. */
    static const char *const want[] = {
        "model", "profile", "backend", "tp", "host", "http-port",
        "grpc-port", "heads-per-group", "page-size", "prefill-chunk",
        "max-num-seqs", "max-batched-tokens", "kv-memory", "max-queued",
        "api-key", "log-format", "log-level", "shutdown-timeout",
        "served-model-name", "max-model-len", "worker-heartbeat-ms"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s ", want[i]);
        if (strstr(text, flag) == NULL)
            fail_msg("help lacks %s", flag);
    }
    for (size_t i = 0; i < n; i++) {
        char env[64];
        assert_int_equal(tg_config_env_name(&t[i], env, sizeof env), 0);
        if (strstr(text, env) == NULL)
            fail_msg("help lacks %s", env);
    }
    assert_non_null(strstr(text, "TANGRAM_API_KEY"));
    assert_non_null(strstr(text, "(required)"));
    assert_non_null(strstr(text, "cpu|cuda"));
    /* No line is absurdly long: help wraps in its column. */
    for (const char *p = text; *p != '\0';) {
        size_t l = strcspn(p, "\n");
        if (l > 160)
            fail_msg("help line of %zu chars: %.*s", l, (int)l, p);
        p += l + (p[l] == '\n');
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_env_and_precedence),
        cmocka_unit_test(test_env_name),
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_double),
        cmocka_unit_test(test_string),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_size_frac),
        cmocka_unit_test(test_enum),
        cmocka_unit_test(test_unknown_and_missing),
        cmocka_unit_test(test_positional),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_required_and_table_checks),
        cmocka_unit_test(test_dump_json),
        cmocka_unit_test(test_free_zeroed),
        cmocka_unit_test(test_td_defaults),
        cmocka_unit_test(test_td_env_flags),
        cmocka_unit_test(test_td_errors),
        cmocka_unit_test(test_td_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
