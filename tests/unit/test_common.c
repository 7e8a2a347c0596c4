/* test_common.c — error table, logging, JSON helpers and the §4.3
 * reservation math of common/. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/kv/kv_budget.h"
#include "common/base/tg_err.h"
#include "common/json/tg_json.h"
#include "common/base/tg_path.h"
#include "common/base/tg_log.h"

static void test_err_table(void **state)
{
    (void)state;
    assert_string_equal(tg_strerror(0), "success");
    assert_string_equal(tg_err_name(0), "OK");
    assert_string_equal(tg_err_name(TG_EINVAL), "EINVAL");
    assert_string_equal(tg_strerror(TG_ENOSPC), "no free pages");
    assert_string_equal(tg_strerror(12345), "unknown error");
    assert_string_equal(tg_err_name(-999), "UNKNOWN");
    /* every code has a distinct name and a message */
    for (int c = -1; c >= TG_EINTERNAL; c--) {
        assert_string_not_equal(tg_err_name(c), "UNKNOWN");
        assert_string_not_equal(tg_strerror(c), "unknown error");
        for (int d = c - 1; d >= TG_EINTERNAL; d--)
            assert_string_not_equal(tg_err_name(c), tg_err_name(d));
    }
    char buf[16];
    assert_int_equal(tg_err_set(buf, sizeof(buf), TG_EFORMAT, "bad %s value", "dtype"),
                     TG_EFORMAT);
    assert_string_equal(buf, "bad dtype value"); /* 15 bytes + NUL fits */
    assert_int_equal(tg_err_set(buf, 4, TG_EIO, "truncated"), TG_EIO);
    assert_string_equal(buf, "tru");
    assert_int_equal(tg_err_set(NULL, 0, TG_EIO, "ignored"), TG_EIO);
}

/* Runs fn with stderr captured into out (NUL-terminated). */
static void capture_stderr(void (*fn)(void), char *out, size_t cap)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    dup2(fds[1], STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], out, cap - 1);
    close(fds[0]);
    out[n > 0 ? n : 0] = '\0';
}

static void log_lines(void)
{
    log_info("hello \"quoted\"\n\tand a tab");
    log_debug("hidden at info level");
    log_err("code %d", 42);
}

static void test_log_json(void **state)
{
    (void)state;
    tg_log_init("router", 3, TG_LOG_INFO, TG_LOG_JSON);
    char out[4096];
    capture_stderr(log_lines, out, sizeof(out));
    char *line2 = strchr(out, '\n');
    assert_non_null(line2);
    *line2++ = '\0';
    json_error_t je;
    json_t *a = json_loads(out, 0, &je);
    assert_non_null(a);
    assert_string_equal(json_string_value(json_object_get(a, "level")), "info");
    assert_string_equal(json_string_value(json_object_get(a, "role")), "router");
    assert_int_equal(json_integer_value(json_object_get(a, "rank")), 3);
    assert_int_equal(json_integer_value(json_object_get(a, "pid")), getpid());
    assert_string_equal(json_string_value(json_object_get(a, "msg")),
                        "hello \"quoted\"\n\tand a tab");
    json_decref(a);
    json_t *b = json_loads(line2, JSON_DISABLE_EOF_CHECK, &je);
    assert_non_null(b);
    assert_string_equal(json_string_value(json_object_get(b, "level")), "error");
    assert_string_equal(json_string_value(json_object_get(b, "msg")), "code 42");
    json_decref(b);
    assert_null(strstr(out, "hidden"));
    assert_null(strstr(line2, "hidden"));
}

static void test_log_text_and_parse(void **state)
{
    (void)state;
    tg_log_init("worker", 1, TG_LOG_DEBUG, TG_LOG_TEXT);
    char out[4096];
    capture_stderr(log_lines, out, sizeof(out));
    assert_non_null(strstr(out, "worker/1["));
    assert_non_null(strstr(out, "hidden at info level"));
    enum tg_log_level lv;
    enum tg_log_format fm;
    assert_int_equal(tg_log_level_parse("warn", &lv), 0);
    assert_int_equal(lv, TG_LOG_WARN);
    assert_int_equal(tg_log_level_parse("err", &lv), 0);
    assert_int_equal(lv, TG_LOG_ERR);
    assert_int_equal(tg_log_level_parse("loud", &lv), TG_EINVAL);
    assert_int_equal(tg_log_format_parse("json", &fm), 0);
    assert_int_equal(fm, TG_LOG_JSON);
    assert_int_equal(tg_log_format_parse("xml", &fm), TG_EINVAL);
    tg_log_init("tool", -1, TG_LOG_INFO, TG_LOG_TEXT);
}

static void test_json_getters(void **state)
{
    (void)state;
    const char *src = "{\"a\": 3, \"b\": 2.5, \"s\": \"x\", \"t\": true,"
                      " \"arr\": [0.1, 0.2, 7], \"o\": {}, \"f\": 4.0}";
    json_t *doc;
    char err[256];
    assert_int_equal(tg_json_load_buf(src, strlen(src), &doc, err, sizeof(err)), 0);
    int64_t i;
    double d;
    const char *s;
    int b;
    json_t *arr, *o;
    assert_int_equal(tg_json_get_int(doc, "a", "cfg", 0, 10, &i, err, sizeof(err)), 0);
    assert_int_equal(i, 3);
    assert_int_equal(tg_json_get_int(doc, "f", "cfg", 0, 10, &i, err, sizeof(err)), 0);
    assert_int_equal(i, 4);
    assert_int_equal(tg_json_get_int(doc, "b", "cfg", 0, 10, &i, err, sizeof(err)), TG_EFORMAT);
    assert_string_equal(err, "cfg.b: expected an integer");
    assert_int_equal(tg_json_get_int(doc, "a", "cfg", 5, 10, &i, err, sizeof(err)), TG_ERANGE);
    assert_non_null(strstr(err, "cfg.a: 3 is out of range"));
    assert_int_equal(tg_json_get_int(doc, "zz", "", 0, 1, &i, err, sizeof(err)), TG_ENOTFOUND);
    assert_string_equal(err, "zz: missing required field");
    assert_int_equal(tg_json_get_double(doc, "b", "", 0, 3, &d, err, sizeof(err)), 0);
    assert_true(d == 2.5);
    assert_int_equal(tg_json_get_string(doc, "s", "", &s, err, sizeof(err)), 0);
    assert_string_equal(s, "x");
    assert_int_equal(tg_json_get_string(doc, "a", "", &s, err, sizeof(err)), TG_EFORMAT);
    assert_int_equal(tg_json_get_bool(doc, "t", "", &b, err, sizeof(err)), 0);
    assert_int_equal(b, 1);
    assert_int_equal(tg_json_get_array(doc, "arr", "", 3, &arr, err, sizeof(err)), 0);
    assert_int_equal(tg_json_get_array(doc, "arr", "", 2, &arr, err, sizeof(err)), TG_EFORMAT);
    assert_int_equal(tg_json_get_object(doc, "o", "", &o, err, sizeof(err)), 0);
    double v[3];
    assert_int_equal(tg_json_read_doubles(arr, "layers[2].budget", 3, 0, 1, v, err,
                                          sizeof(err)), TG_ERANGE);
    assert_non_null(strstr(err, "layers[2].budget[2]"));
    json_decref(doc);
    assert_int_equal(tg_json_load_buf("{\"a\": 1, \"a\": 2}", 16, &doc, err, sizeof(err)),
                     TG_EFORMAT); /* duplicate keys are refused */
    assert_int_equal(tg_json_load_buf("[1,", 3, &doc, err, sizeof(err)), TG_EFORMAT);
    assert_non_null(strstr(err, "line 1"));
    assert_int_equal(tg_json_load_file("/nonexistent/x.json", &doc, err, sizeof(err)),
                     TG_ENOENT);

    /* dump and reload */
    char path[] = "/tmp/tg_json_testXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    double w[3] = {0.1, 1.0 / 3.0, 1e-300};
    json_t *out = json_object();
    json_object_set_new(out, "w", tg_json_doubles(w, 3));
    assert_int_equal(tg_json_dump_file(out, path, err, sizeof(err)), 0);
    json_decref(out);
    assert_int_equal(tg_json_load_file(path, &doc, err, sizeof(err)), 0);
    assert_int_equal(tg_json_read_doubles(json_object_get(doc, "w"), "w", 3, 0, 1, v, err,
                                          sizeof(err)), 0);
    for (int k = 0; k < 3; k++)
        assert_true(v[k] == w[k]); /* 17 significant digits round-trip */
    json_decref(doc);
    unlink(path);
}

/* DESIGN.md §4.3 by hand: forced keys and kept counts. */
static void test_reservation_math(void **state)
{
    (void)state;
    struct kv_forced_rule r = kv_forced_rule_snapkv();
    /* first chunk of 512: window 32 + sinks 0..3 */
    assert_int_equal(kv_chunk_forced(0, 512, &r), 36);
    /* a chunk of 3 at position 0: window covers all */
    assert_int_equal(kv_chunk_forced(0, 3, &r), 3);
    /* chunk of 34 at 0: window [2, 34) + sinks 0, 1 */
    assert_int_equal(kv_chunk_forced(0, 34, &r), 34);
    /* chunk of 35 at 0: window [3, 35) + sinks 0..2 */
    assert_int_equal(kv_chunk_forced(0, 35, &r), 35);
    /* chunk of 40 at 0: window [8, 40) + sinks 0..3 */
    assert_int_equal(kv_chunk_forced(0, 40, &r), 36);
    /* a later chunk has no sinks */
    assert_int_equal(kv_chunk_forced(512, 512, &r), 32);
    /* a chunk starting at 2: sinks 2, 3 */
    assert_int_equal(kv_chunk_forced(2, 100, &r), 34);
    assert_int_equal(kv_chunk_forced(0, 0, &r), 0);
    /* k = min(n, max(ceil(b n), f)) */
    assert_int_equal(kv_chunk_keep(512, 0.25, 36), 128);
    assert_int_equal(kv_chunk_keep(512, 0.05, 36), 36);
    assert_int_equal(kv_chunk_keep(100, 0.333, 0), 34); /* ceil(33.3) */
    assert_int_equal(kv_chunk_keep(10, 0.99, 0), 10);
    assert_int_equal(kv_chunk_keep(10, 1.0, 0), 10);
    assert_int_equal(kv_chunk_keep(0, 0.5, 0), 0);
    /* a turn: 1100 tokens in chunks of 512 from position 0, b = 0.25:
     * 128 + 128 + max(ceil(19), 32) = 288 */
    assert_int_equal(kv_turn_keep(0, 1100, 512, 0.25, &r), 288);
    assert_int_equal(kv_turn_keep(0, 1100, 512, 1.0, &r), 1100);
    assert_int_equal(kv_pages_for(288, 16), 18);
    assert_int_equal(kv_pages_for(289, 16), 19);
    assert_int_equal(kv_pages_for(0, 16), 0);
}

/* tg_json_loadb_wide: integers beyond 64 bits become reals of the same
 * value, every other number stays exact, the caller's bytes are not
 * written, and an error after widened literals is placed in those bytes. */
static void test_json_loadb_wide(void **state)
{
    (void)state;
    json_error_t je;
    const char *src = "{\"big\": 18446744073709551616, \"neg\": "
                      "-9223372036854775809, \"s\": \"99999999999999999999\", "
                      "\"exact\": 9223372036854775807, \"a\": "
                      "[99999999999999999999, 1e3, -0]}";
    char *copy = strdup(src);
    assert_non_null(copy);
    json_t *doc = tg_json_loadb_wide(copy, strlen(copy), 0, &je);
    assert_non_null(doc);
    assert_string_equal(copy, src);
    assert_true(json_is_real(json_object_get(doc, "big")));
    assert_true(json_real_value(json_object_get(doc, "big")) == 0x1p64);
    assert_true(json_real_value(json_object_get(doc, "neg")) == -0x1p63);
    assert_string_equal(json_string_value(json_object_get(doc, "s")),
                        "99999999999999999999");
    assert_true(json_integer_value(json_object_get(doc, "exact")) == INT64_MAX);
    json_t *a = json_object_get(doc, "a");
    assert_true(json_real_value(json_array_get(a, 0)) == 1e20);
    assert_true(json_is_real(json_array_get(a, 1)));
    assert_true(json_is_integer(json_array_get(a, 2)));
    json_decref(doc);
    free(copy);

    /* a later error: column and position as in the bytes given */
    const char *bad = "[99999999999999999999, 99999999999999999999, x]";
    assert_null(tg_json_loadb_wide(bad, strlen(bad), 0, &je));
    assert_int_equal(json_error_code(&je), json_error_invalid_syntax);
    assert_int_equal(je.column, 46);
    assert_int_equal(je.position, 46);
    /* a real beyond a double, and one widening too many */
    assert_null(tg_json_loadb_wide("[1e400]", 7, 0, &je));
    assert_int_equal(json_error_code(&je), json_error_numeric_overflow);
    char many[512] = "[";
    for (int i = 0; i <= TG_JSON_MAX_WIDE; i++)
        strcat(many, i ? ",10000000000000000000" : "10000000000000000000");
    strcat(many, "]");
    assert_null(tg_json_loadb_wide(many, strlen(many), 0, &je));
    assert_int_equal(json_error_code(&je), json_error_numeric_overflow);
    assert_int_equal(je.position, 1 + 21 * (TG_JSON_MAX_WIDE + 1) - 1);
    many[strlen(many) - 22] = ']'; /* one fewer: read */
    many[strlen(many) - 21] = '\0';
    doc = tg_json_loadb_wide(many, strlen(many), 0, &je);
    assert_non_null(doc);
    assert_int_equal(json_array_size(doc), TG_JSON_MAX_WIDE);
    json_decref(doc);
}

/* tg_path_fmt: a whole path, or TG_ETOOBIG saying how long it is. */
static void test_path_fmt(void **state)
{
    (void)state;
    char out[16], err[256];
    assert_int_equal(tg_path_fmt(out, sizeof out, err, sizeof err, "%s/%s",
                                 "/data", "configs"),
                     0);
    assert_string_equal(out, "/data/configs");
    /* 15 bytes fit a 16-byte buffer, 16 do not */
    assert_int_equal(
        tg_path_fmt(out, sizeof out, err, sizeof err, "%s/x", "/abcdefghijkl"),
        0);
    assert_int_equal(
        tg_path_fmt(out, sizeof out, err, sizeof err, "%s/xy", "/abcdefghijkl"),
        TG_ETOOBIG);
    assert_string_equal(err, "path '/abcdefghijkl/x...' is 16 bytes, longer "
                             "than the 15 this program holds");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_table),
        cmocka_unit_test(test_log_json),
        cmocka_unit_test(test_log_text_and_parse),
        cmocka_unit_test(test_json_getters),
        cmocka_unit_test(test_json_loadb_wide),
        cmocka_unit_test(test_path_fmt),
        cmocka_unit_test(test_reservation_math),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
