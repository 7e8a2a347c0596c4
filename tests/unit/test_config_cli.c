/* test_config_cli.c — the command-line conveniences of the declarative
 * config table (common/base/tg_config.h) that one-shot tools use: one-letter
 * short flags, programs that read no environment (no_env), one-sided
 * ranges, bounds shown exactly, and owner marks that the parser ignores. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/tg_config.h"
#include "common/base/tg_err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct c_opts {
    char *out;
    bool tie;
    int64_t n;
    double alpha;
    double theta;
};

#define C_OFF(f, ctype) TG_CONFIG_OFFSET(struct c_opts, f, ctype)

static const struct tg_config_entry ctab[] = {
    {.name = "output", .type = TG_CONFIG_STRING, .short_flag = 'o',
     .offset = C_OFF(out, char *), .metavar = "OUT",
     .flags = TG_CONFIG_REQUIRED | TG_CONFIG_MARK(3),
     .help = "Where to write."},
    {.name = "tie", .type = TG_CONFIG_BOOL, .def = "false", .short_flag = 't',
     .offset = C_OFF(tie, bool), .flags = TG_CONFIG_MARK(7),
     .help = "Tie them."},
    {.name = "n", .type = TG_CONFIG_INT, .def = "1", .min = 1, .max = 9,
     .short_flag = 'n', .offset = C_OFF(n, int64_t), .help = "How many."},
    {.name = "alpha", .type = TG_CONFIG_DOUBLE, .def = "2", .min = 0,
     .max = INFINITY, .offset = C_OFF(alpha, double),
     .help = "Any number >= 0."},
    {.name = "theta", .type = TG_CONFIG_DOUBLE, .def = "10000",
     .min = 1.0000001, .max = 1e12, .offset = C_OFF(theta, double),
     .help = "Above 1."},
};
#define NC (sizeof ctab / sizeof ctab[0])

static char errbuf[512];

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Parses args (program name prepended) with environment envp; no_env as
 * given; help goes to *help (malloc'ed, may be NULL). */
static int cparse(struct c_opts *o, bool no_env, char **envp,
                  const char *const *args, char **help)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"tool";
    for (size_t i = 0; args != NULL && args[i] != NULL; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    size_t len = 0;
    char *text = NULL;
    FILE *f = help != NULL ? open_memstream(&text, &len) : NULL;
    struct tg_config_cli cli = {.usage = "usage: tool -o OUT", .help_out = f,
                                .no_env = no_env};
    errbuf[0] = '\0';
    int rc = tg_config_parse_cli(ctab, NC, o, &cli, argc, argv, envp, errbuf,
                                 sizeof errbuf);
    if (f != NULL) {
        fclose(f);
        *help = text;
    }
    return rc;
}

static void test_short_flags(void **state)
{
    (void)state;
    struct c_opts o = {0};
    assert_int_equal(cparse(&o, false, NULL, ARGS("-o", "a.json"), NULL), 0);
    assert_string_equal(o.out, "a.json");
    assert_false(o.tie);
    /* Attached value, a value "-" (stdout), bool short flag, long forms. */
    assert_int_equal(cparse(&o, false, NULL, ARGS("-ob.json", "-t", "-n7"),
                            NULL), 0);
    assert_string_equal(o.out, "b.json");
    assert_true(o.tie);
    assert_int_equal(o.n, 7);
    assert_int_equal(cparse(&o, false, NULL, ARGS("-o", "-"), NULL), 0);
    assert_string_equal(o.out, "-");
    assert_int_equal(cparse(&o, false, NULL,
                            ARGS("--output=c", "-o", "d", "--no-tie"), NULL),
                     0);
    assert_string_equal(o.out, "d"); /* last wins */
    assert_false(o.tie);
    /* Errors name the short flag and its long name. */
    assert_int_equal(cparse(&o, false, NULL, ARGS("-o"), NULL), TG_EINVAL);
    assert_non_null(strstr(errbuf, "-o (--output): missing value"));
    assert_int_equal(cparse(&o, false, NULL, ARGS("-o", "--tie"), NULL),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "--output=VALUE"));
    assert_int_equal(cparse(&o, false, NULL, ARGS("-o", "x", "-n", "12"),
                            NULL), TG_ERANGE);
    assert_non_null(strstr(errbuf, "-n (--n): 12 is out of range [1, 9]"));
    assert_int_equal(cparse(&o, false, NULL, ARGS("-o", "x", "-tx"), NULL),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "does not take a value"));
    assert_int_equal(cparse(&o, false, NULL, ARGS("-o", "x", "-q"), NULL),
                     TG_EINVAL);
    assert_non_null(strstr(errbuf, "unknown option '-q'"));
    /* Required: the message names both forms. */
    assert_int_equal(cparse(&o, true, NULL, ARGS("-t"), NULL), TG_EINVAL);
    assert_string_equal(errbuf, "missing required -o, --output");
    /* -o's value is skipped when looking for --help ... */
    char *help = NULL;
    assert_int_equal(cparse(&o, false, NULL, ARGS("-o", "-h"), &help), 0);
    assert_string_equal(o.out, "-h");
    free(help);
    /* ... but -h alone is help. */
    help = NULL;
    assert_int_equal(cparse(&o, false, NULL, ARGS("-t", "-h"), &help),
                     TG_EDONE);
    assert_non_null(strstr(help, "-o, --output OUT"));
    assert_non_null(strstr(help, "-t, --[no-]tie"));
    free(help);
    tg_config_free(ctab, NC, &o);
}

static void test_no_env(void **state)
{
    (void)state;
    char *envp[] = {"TANGRAM_OUTPUT=env.json", "TANGRAM_N=3", NULL};
    struct c_opts o = {0};
    /* With the environment: variables count. */
    assert_int_equal(cparse(&o, false, envp, NULL, NULL), 0);
    assert_string_equal(o.out, "env.json");
    assert_int_equal(o.n, 3);
    /* Without: ignored, and the messages and help do not mention them. */
    assert_int_equal(cparse(&o, true, envp, NULL, NULL), TG_EINVAL);
    assert_null(strstr(errbuf, "TANGRAM_"));
    assert_int_equal(cparse(&o, true, envp, ARGS("-o", "x"), NULL), 0);
    assert_int_equal(o.n, 1);
    assert_int_equal(cparse(&o, true, envp, ARGS("-o", ""), NULL), TG_EINVAL);
    assert_string_equal(errbuf, "--output must not be empty");
    char *help = NULL;
    assert_int_equal(cparse(&o, true, NULL, ARGS("--help"), &help), TG_EDONE);
    assert_non_null(strstr(help, "usage: tool -o OUT"));
    assert_null(strstr(help, "TANGRAM_"));
    assert_null(strstr(help, "ENVIRONMENT"));
    assert_null(strstr(help, "environment variable"));
    assert_non_null(strstr(help, "DEFAULT"));
    free(help);
    /* The same table with the environment shows the column. */
    help = NULL;
    assert_int_equal(cparse(&o, false, NULL, ARGS("--help"), &help),
                     TG_EDONE);
    assert_non_null(strstr(help, "TANGRAM_OUTPUT"));
    free(help);
    tg_config_free(ctab, NC, &o);
}

static void test_ranges_shown_exactly(void **state)
{
    (void)state;
    struct c_opts o = {0};
    /* One-sided: anything >= 0 goes, below is refused naming "inf". */
    assert_int_equal(cparse(&o, true, NULL, ARGS("-o", "x", "--alpha",
                                                 "1e300"), NULL), 0);
    assert_true(o.alpha == 1e300);
    assert_int_equal(cparse(&o, true, NULL, ARGS("-o", "x", "--alpha", "-1"),
                            NULL), TG_ERANGE);
    assert_non_null(strstr(errbuf, "--alpha: -1 is out of range [0, inf]"));
    /* A bound that %g would round to 1 is shown as it is. */
    assert_int_equal(cparse(&o, true, NULL, ARGS("-o", "x", "--theta", "1"),
                            NULL), TG_ERANGE);
    assert_non_null(strstr(errbuf, "[1.0000001, 1e+12]"));
    char *help = NULL;
    assert_int_equal(cparse(&o, true, NULL, ARGS("-h"), &help), TG_EDONE);
    assert_non_null(strstr(help, "[0, inf]"));
    assert_non_null(strstr(help, "[1.0000001, 1e+12]"));
    free(help);
    tg_config_free(ctab, NC, &o);
}

static void test_table_checks(void **state)
{
    (void)state;
    struct c_opts o = {0};
    char *argv[] = {"tool", NULL};
    struct tg_config_entry bad[2];
    memcpy(bad, ctab, sizeof bad);
    bad[1].short_flag = 'o'; /* twice */
    assert_int_equal(tg_config_parse(bad, 2, &o, 1, argv, NULL, errbuf,
                                     sizeof errbuf), TG_EINVAL);
    assert_non_null(strstr(errbuf, "-o given to --output and --tie"));
    bad[1].short_flag = 'h'; /* reserved for help */
    assert_int_equal(tg_config_parse(bad, 2, &o, 1, argv, NULL, errbuf,
                                     sizeof errbuf), TG_EINVAL);
    assert_non_null(strstr(errbuf, "bad short flag"));
    bad[1].short_flag = '-';
    assert_int_equal(tg_config_parse(bad, 2, &o, 1, argv, NULL, errbuf,
                                     sizeof errbuf), TG_EINVAL);
    tg_config_free(ctab, NC, &o);
    /* Marks are the owner's: they change nothing in parsing, the dump or
     * the flags written back. */
    char *args[] = {"tool", "-o", "x", "-t"};
    assert_int_equal(tg_config_parse(ctab, NC, &o, 4, args, NULL, errbuf,
                                     sizeof errbuf), 0);
    json_t *j = tg_config_dump_json(ctab, NC, &o);
    assert_string_equal(json_string_value(json_object_get(j, "output")), "x");
    assert_true(json_is_true(json_object_get(j, "tie")));
    json_decref(j);
    char **out = NULL;
    size_t n = 0;
    assert_int_equal(tg_config_to_argv(ctab, 2, &o, NULL, 0, &out, &n, errbuf,
                                       sizeof errbuf), 0);
    assert_int_equal(n, 2);
    assert_string_equal(out[0], "--output=x");
    assert_string_equal(out[1], "--tie=true");
    tg_config_argv_free(out, n);
    tg_config_free(ctab, NC, &o);
    assert_true(TG_CONFIG_MARK(0) > (TG_CONFIG_REQUIRED | TG_CONFIG_SECRET));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_flags),
        cmocka_unit_test(test_no_env),
        cmocka_unit_test(test_ranges_shown_exactly),
        cmocka_unit_test(test_table_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
