/* test_config_argv.c — tg_config_to_argv: options back to flags, checked by
 * parsing the flags again with the same table (round trip). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/tg_config.h"
#include "common/base/tg_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct opts {
    bool flag;
    int64_t count;
    double ratio;
    char *name;
    char *secret;
    uint64_t bytes;
    struct tg_config_amount mem;
    int color;
};

#define OFF(f, t) TG_CONFIG_OFFSET(struct opts, f, t)
static const char *const colors[] = {"red", "green", "blue", NULL};
static const struct tg_config_entry table[] = {
    {.name = "flag", .type = TG_CONFIG_BOOL, .def = "false",
     .offset = OFF(flag, bool), .help = "A bool."},
    {.name = "count", .type = TG_CONFIG_INT, .def = "3",
     .offset = OFF(count, int64_t), .help = "An int."},
    {.name = "ratio", .type = TG_CONFIG_DOUBLE, .def = "0.5",
     .offset = OFF(ratio, double), .help = "A double."},
    {.name = "name", .type = TG_CONFIG_STRING, .def = NULL,
     .offset = OFF(name, char *), .help = "A string."},
    {.name = "secret", .type = TG_CONFIG_STRING, .def = "",
     .offset = OFF(secret, char *), .flags = TG_CONFIG_SECRET,
     .help = "A secret."},
    {.name = "bytes", .type = TG_CONFIG_SIZE, .def = "1KiB",
     .offset = OFF(bytes, uint64_t), .help = "A size."},
    {.name = "mem", .type = TG_CONFIG_SIZE_FRAC, .def = "0.9",
     .offset = OFF(mem, struct tg_config_amount), .help = "A share."},
    {.name = "color", .type = TG_CONFIG_ENUM, .def = "red",
     .offset = OFF(color, int), .choices = colors, .help = "An enum."},
};
#define N (sizeof table / sizeof table[0])

/* Emits *src, parses the flags into a fresh struct and compares. */
static void round_trip(struct opts *src, unsigned skip)
{
    char **argv = NULL;
    size_t argc = 0;
    char err[256];
    assert_int_equal(tg_config_argv_push(&argv, &argc, "prog"), 0);
    assert_int_equal(tg_config_to_argv(table, N, src, NULL, skip, &argv,
                                       &argc, err, sizeof err), 0);
    assert_null(argv[argc]);
    struct opts back = {0};
    int rc = tg_config_parse(table, N, &back, (int)argc, argv, NULL, err,
                             sizeof err);
    if (rc != 0)
        fail_msg("parse failed: %s", err);
    assert_int_equal(back.flag, src->flag);
    assert_int_equal(back.count, src->count);
    assert_true(back.ratio == src->ratio);
    if (src->name == NULL)
        assert_null(back.name);
    else
        assert_string_equal(back.name, src->name);
    if (skip & TG_CONFIG_SECRET)
        assert_string_equal(back.secret, "");
    else
        assert_string_equal(back.secret, src->secret);
    assert_true(back.bytes == src->bytes);
    assert_int_equal(back.mem.is_fraction, src->mem.is_fraction);
    if (src->mem.is_fraction)
        assert_true(back.mem.fraction == src->mem.fraction);
    else
        assert_true(back.mem.bytes == src->mem.bytes);
    assert_int_equal(back.color, src->color);
    tg_config_free(table, N, &back);
    tg_config_argv_free(argv, argc);
}

static void test_round_trip_plain(void **state)
{
    (void)state;
    struct opts o = {.flag = true, .count = -42, .ratio = 0.1,
                     .name = "a b", .secret = "k",
                     .bytes = UINT64_MAX,
                     .mem = {.is_fraction = true, .fraction = 0.9},
                     .color = 2};
    round_trip(&o, 0);
    round_trip(&o, TG_CONFIG_SECRET);
}

static void test_round_trip_edges(void **state)
{
    (void)state;
    /* Values a naive "%g" would break: a string that looks like a flag, an
     * exponent-only fraction, 1 byte (a plain "1" reads as a fraction),
     * the extreme integers and doubles. */
    struct opts o = {.flag = false, .count = INT64_MIN,
                     .ratio = 1.0 / 3.0, .name = "--flag",
                     .secret = "=x=", .bytes = 0,
                     .mem = {.is_fraction = true, .fraction = 1e-7},
                     .color = 0};
    round_trip(&o, 0);
    o.count = INT64_MAX;
    o.ratio = -1e300;
    o.name = "";
    o.mem = (struct tg_config_amount){.is_fraction = false, .bytes = 1};
    round_trip(&o, 0);
    o.mem = (struct tg_config_amount){.is_fraction = false, .bytes = 0};
    o.ratio = 5e-324; /* the smallest subnormal */
    round_trip(&o, 0);
    o.mem = (struct tg_config_amount){.is_fraction = true, .fraction = 1.0};
    o.name = NULL;
    round_trip(&o, 0);
}

static void test_format(void **state)
{
    (void)state;
    struct opts o = {.flag = true, .count = 7, .ratio = 0.25, .name = NULL,
                     .secret = "s", .bytes = 1024,
                     .mem = {.is_fraction = false, .bytes = 8589934592ull},
                     .color = 1};
    char **argv = NULL;
    size_t argc = 0;
    char err[256];
    assert_int_equal(tg_config_to_argv(table, N, &o, NULL, TG_CONFIG_SECRET,
                                       &argv, &argc, err, sizeof err), 0);
    const char *want[] = {"--flag=true", "--count=7", "--ratio=0.25",
                          "--bytes=1024", "--mem=8589934592B",
                          "--color=green"};
    assert_int_equal(argc, 6); /* NULL name and the secret left out */
    for (size_t i = 0; i < argc; i++)
        assert_string_equal(argv[i], want[i]);
    tg_config_argv_free(argv, argc);
}

static void test_only(void **state)
{
    (void)state;
    struct opts o = {.count = 1, .ratio = 2, .name = "n", .secret = "",
                     .mem = {.is_fraction = true, .fraction = 0.5}};
    char **argv = NULL;
    size_t argc = 0;
    char err[256];
    const char *const only[] = {"color", "count", NULL};
    assert_int_equal(tg_config_to_argv(table, N, &o, only, 0, &argv, &argc,
                                       err, sizeof err), 0);
    assert_int_equal(argc, 2);
    assert_string_equal(argv[0], "--count=1"); /* table order */
    assert_string_equal(argv[1], "--color=red");
    const char *const bad[] = {"count", "nope", NULL};
    assert_int_equal(tg_config_to_argv(table, N, &o, bad, 0, &argv, &argc,
                                       err, sizeof err), TG_EINVAL);
    assert_non_null(strstr(err, "nope"));
    assert_int_equal(argc, 2); /* unchanged: names are checked first */
    tg_config_argv_free(argv, argc);
}

static void test_bad_enum(void **state)
{
    (void)state;
    struct opts o = {.name = "x", .secret = "", .color = 3};
    char **argv = NULL;
    size_t argc = 0;
    char err[256];
    assert_int_equal(tg_config_to_argv(table, N, &o, NULL, 0, &argv, &argc,
                                       err, sizeof err), TG_EINVAL);
    assert_non_null(strstr(err, "--color"));
    /* What came before the bad entry stays valid and freeable. */
    assert_true(argc > 0);
    assert_null(argv[argc]);
    tg_config_argv_free(argv, argc);
    tg_config_argv_free(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_plain),
        cmocka_unit_test(test_round_trip_edges),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_only),
        cmocka_unit_test(test_bad_enum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
