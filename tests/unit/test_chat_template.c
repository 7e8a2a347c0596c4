/* test_chat_template.c — ct_template: names, hashing, detection of the
 * shipped templates, unknown templates, fixed render vectors (expected
 * strings produced by the real templates via tests/reference/render_jinja.py)
 * and error paths. The exhaustive byte-for-byte comparison against jinja2 is
 * tests/integration/test_chat_template.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/ct_template.h"
#include "common/tg_err.h"
#include "tests/support/tt_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Renders and returns the malloc'd prompt, asserting success. */
static char *render_ok(enum ct_family f, const struct ct_message *m, size_t n,
                       const struct ct_options *opt)
{
    struct ct_template t = {.family = f, .match = CT_MATCH_NAMED};
    char err[256] = "";
    char *out = NULL;
    size_t len = 0;
    int rc = ct_render(&t, m, n, opt, &out, &len, err, sizeof err);
    if (rc != 0)
        fail_msg("render failed: %s", err);
    assert_non_null(out);
    assert_int_equal(len, strlen(out));
    return out;
}

static void expect_render(enum ct_family f, const struct ct_message *m,
                          size_t n, const struct ct_options *opt,
                          const char *want)
{
    char *got = render_ok(f, m, n, opt);
    assert_string_equal(got, want);
    free(got);
}

static int render_err(enum ct_family f, const struct ct_message *m, size_t n,
                      const struct ct_options *opt, const char *needle)
{
    struct ct_template t = {.family = f};
    char err[256] = "";
    char *out = (char *)1;
    int rc = ct_render(&t, m, n, opt, &out, NULL, err, sizeof err);
    assert_null(out);
    if (needle != NULL && strstr(err, needle) == NULL)
        fail_msg("error '%s' lacks '%s'", err, needle);
    return rc;
}

static void test_family_names(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        enum ct_family f;
    } cases[] = {{"chatml-qwen2.5", CT_FAMILY_QWEN25},
                 {"qwen2.5", CT_FAMILY_QWEN25},
                 {"qwen3", CT_FAMILY_QWEN3},
                 {"llama3", CT_FAMILY_LLAMA3},
                 {"llama3.1", CT_FAMILY_LLAMA3},
                 {"llama3.3", CT_FAMILY_LLAMA3},
                 {"llama3.2", CT_FAMILY_LLAMA32}};
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        enum ct_family f = CT_FAMILY_UNKNOWN;
        assert_int_equal(ct_family_parse(cases[i].name, &f, err, sizeof err),
                         0);
        assert_int_equal(f, cases[i].f);
    }
    assert_string_equal(ct_family_name(CT_FAMILY_QWEN25), "chatml-qwen2.5");
    assert_string_equal(ct_family_name(CT_FAMILY_LLAMA32), "llama3.2");
    assert_string_equal(ct_family_name(CT_FAMILY_UNKNOWN), "unknown");
    enum ct_family f = CT_FAMILY_QWEN3;
    assert_int_equal(ct_family_parse("Qwen3", &f, err, sizeof err),
                     TG_EINVAL);
    assert_int_equal(f, CT_FAMILY_UNKNOWN);
    assert_non_null(strstr(err, "'Qwen3'"));
    assert_non_null(strstr(err, "llama3.2"));
    assert_int_equal(ct_family_parse("", &f, err, sizeof err), TG_EINVAL);
    assert_int_equal(ct_family_parse(NULL, &f, err, sizeof err), TG_EINVAL);
}

static void test_hash_normalization(void **state)
{
    (void)state;
    uint64_t h = ct_template_hash("{{ a }}\n{{ b }}");
    assert_true(h == ct_template_hash("\n  {{ a }}\r\n{{ b }}\n\n"));
    assert_true(h != ct_template_hash("{{ a }} {{ b }}"));
    assert_true(h != ct_template_hash("{{ a }}\n\n{{ b }}"));
    /* FNV-1a of the empty string is the offset basis. */
    assert_true(ct_template_hash("") == 0xcbf29ce484222325ULL);
    assert_true(ct_template_hash(" \n") == 0xcbf29ce484222325ULL);
}

static void detect_path(const char *rel, int is_dir, enum ct_family want)
{
    char sub[1024], path[2048], err[512] = "";
    snprintf(sub, sizeof sub, "%s", rel);
    tt_data_path(sub, path, sizeof path);
    if (access(path, R_OK) != 0)
        fail_msg("project data file missing: %s", path);
    char *text = NULL;
    int rc = is_dir ? ct_template_read_dir(path, &text, err, sizeof err)
                    : ct_template_read_file(path, &text, err, sizeof err);
    if (rc != 0)
        fail_msg("%s: %s", path, err);
    struct ct_template t;
    assert_int_equal(ct_template_detect(text, &t, err, sizeof err), 0);
    assert_int_equal(t.family, want);
    assert_int_equal(t.match, CT_MATCH_EXACT);
    assert_true(t.hash == ct_template_hash(text));
    free(text);
}

static void test_detect_shipped(void **state)
{
    (void)state;
    detect_path("tokenizers/qwen2.5", 1, CT_FAMILY_QWEN25);
    detect_path("tokenizers/qwen3", 1, CT_FAMILY_QWEN3);
    detect_path("tokenizers/llama3", 1, CT_FAMILY_LLAMA32);
    detect_path("tokenizers/qwen3/tokenizer_config.json", 0, CT_FAMILY_QWEN3);
    detect_path("chat_templates/meta-llama-Llama-3.3-70B-Instruct.jinja", 0,
                CT_FAMILY_LLAMA3);
}

static void test_detect_fingerprint(void **state)
{
    (void)state;
    char err[512];
    struct ct_template t;
    const char *qwen25 =
        "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
        "You are a helpful assistant.<|im_end|>\\n' }}";
    assert_int_equal(ct_template_detect(qwen25, &t, err, sizeof err), 0);
    assert_int_equal(t.family, CT_FAMILY_QWEN25);
    assert_int_equal(t.match, CT_MATCH_FINGERPRINT);

    const char *qwen3 =
        "<|im_start|> <|im_end|> reasoning_content ns.last_query_index "
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}";
    assert_int_equal(ct_template_detect(qwen3, &t, err, sizeof err), 0);
    assert_int_equal(t.family, CT_FAMILY_QWEN3);

    const char *llama =
        "{{- bos_token }}<|start_header_id|>system<|end_header_id|>\\n\\n "
        "Cutting Knowledge Date: December 2023\\n Today Date: "
        "message['content'] | trim <|eot_id|>";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s {%%- set date_string = \"26 Jul 2024\" %%}",
             llama);
    assert_int_equal(ct_template_detect(buf, &t, err, sizeof err), 0);
    assert_int_equal(t.family, CT_FAMILY_LLAMA3);
    snprintf(buf, sizeof buf, "%s strftime_now(\"%%d %%b %%Y\")", llama);
    assert_int_equal(ct_template_detect(buf, &t, err, sizeof err), 0);
    assert_int_equal(t.family, CT_FAMILY_LLAMA32);

    /* Look-alikes that render differently stay unknown. */
    static const char *const lookalikes[] = {
        /* Qwen2.5-Math: another default system prompt */
        "<|im_start|>system\\nPlease reason step by step.<|im_end|>",
        /* QwQ: Qwen prompt but forces <think> */
        "<|im_start|> You are Qwen, created by Alibaba Cloud. You are a "
        "helpful assistant. <|im_end|> '<think>\\n'",
        /* Llama-3.0: headers without the date preamble */
        "{{ bos_token }}<|start_header_id|>' + message['role'] + "
        "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>'",
        "",
    };
    for (size_t i = 0; i < sizeof lookalikes / sizeof lookalikes[0]; i++) {
        assert_int_equal(
            ct_template_detect(lookalikes[i], &t, err, sizeof err),
            TG_EUNSUPPORTED);
        assert_int_equal(t.family, CT_FAMILY_UNKNOWN);
    }
}

static void test_detect_unknown(void **state)
{
    (void)state;
    char err[512] = "";
    struct ct_template t;
    const char *text = "\n\n{% for m in messages %}{{ m.content }}\n"
                       "{% endfor %}";
    assert_int_equal(ct_template_detect(text, &t, err, sizeof err),
                     TG_EUNSUPPORTED);
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx",
             (unsigned long long)ct_template_hash(text));
    assert_non_null(strstr(err, hash));
    assert_non_null(strstr(err, "'{% for m in messages %}{{ m.content }}'"));
    assert_non_null(strstr(err, "pass a template name"));
    assert_int_equal(ct_template_detect(NULL, &t, err, sizeof err),
                     TG_EINVAL);

    /* A name overrides detection, with or without a text. */
    assert_int_equal(ct_template_select(text, "qwen3", &t, err, sizeof err),
                     0);
    assert_int_equal(t.family, CT_FAMILY_QWEN3);
    assert_int_equal(t.match, CT_MATCH_NAMED);
    assert_int_equal(ct_template_select(NULL, "llama3", &t, err, sizeof err),
                     0);
    assert_int_equal(t.family, CT_FAMILY_LLAMA3);
    assert_int_equal(ct_template_select(text, NULL, &t, err, sizeof err),
                     TG_EUNSUPPORTED);
    assert_int_equal(ct_template_select(text, "gpt", &t, err, sizeof err),
                     TG_EINVAL);
    assert_int_equal(ct_template_select(NULL, NULL, &t, err, sizeof err),
                     TG_EINVAL);
}

static const struct ct_message conv3[] = {
    {.role = "user", .content = "Hi"},
    {.role = "assistant", .content = "Hello!"},
    {.role = "user", .content = "2+2?"},
};

static void test_render_qwen25(void **state)
{
    (void)state;
    struct ct_options opt = {.add_generation_prompt = true};
    expect_render(CT_FAMILY_QWEN25, conv3, 3, &opt,
                  "<|im_start|>system\nYou are Qwen, created by Alibaba "
                  "Cloud. You are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n"
                  "<|im_start|>user\n2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n");
    /* Unknown roles render nothing; NULL options = zeroed options. */
    const struct ct_message m[] = {{.role = "system", .content = ""},
                                   {.role = "developer", .content = "x"},
                                   {.role = "user", .content = ""}};
    expect_render(CT_FAMILY_QWEN25, m, 3, NULL,
                  "<|im_start|>system\n<|im_end|>\n"
                  "<|im_start|>user\n<|im_end|>\n");
}

static void test_render_qwen3(void **state)
{
    (void)state;
    const struct ct_message m[] = {
        {.role = "system", .content = "S"},
        {.role = "user", .content = "q1"},
        {.role = "assistant", .content = "<think>\nold\n</think>\n\na1"},
        {.role = "user", .content = "q2"},
        {.role = "assistant", .content = "a2", .reasoning_content = "\nr2\n"},
    };
    /* Past reasoning is dropped; the turn after the last query keeps it. */
    expect_render(CT_FAMILY_QWEN3, m, 5, NULL,
                  "<|im_start|>system\nS<|im_end|>\n"
                  "<|im_start|>user\nq1<|im_end|>\n"
                  "<|im_start|>assistant\na1<|im_end|>\n"
                  "<|im_start|>user\nq2<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\nr2\n</think>\n\n"
                  "a2<|im_end|>\n");
    struct ct_options off = {.add_generation_prompt = true,
                             .enable_thinking = CT_THINKING_OFF};
    expect_render(CT_FAMILY_QWEN3, conv3, 3, &off,
                  "<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n"
                  "<|im_start|>user\n2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    struct ct_options on = {.add_generation_prompt = true,
                            .enable_thinking = CT_THINKING_ON};
    char *a = render_ok(CT_FAMILY_QWEN3, conv3, 3, &on);
    char *b = render_ok(CT_FAMILY_QWEN3, conv3, 3, NULL);
    assert_true(strlen(a) > strlen(b)); /* NULL opts: no generation prompt */
    assert_non_null(strstr(a, b));
    assert_null(strstr(a, "<think>"));
    free(a);
    free(b);
    /* A wrapped tool response is not a query: the assistant after it is
     * still "after the last query" and keeps (empty) think tags when last. */
    const struct ct_message t[] = {
        {.role = "user", .content = "q"},
        {.role = "user", .content = "<tool_response>\n1\n</tool_response>"},
        {.role = "assistant", .content = "done"},
    };
    expect_render(CT_FAMILY_QWEN3, t, 3, NULL,
                  "<|im_start|>user\nq<|im_end|>\n"
                  "<|im_start|>user\n<tool_response>\n1\n</tool_response>"
                  "<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\n"
                  "done<|im_end|>\n");
}

static void test_render_llama3(void **state)
{
    (void)state;
    /* System and contents are trimmed of Unicode whitespace (str.strip). */
    const struct ct_message m[] = {
        {.role = "system", .content = "\xe3\x80\x80 Be nice.\n"},
        {.role = "user", .content = " \tHi \xf0\x9f\x99\x82\xc2\xa0\n"},
    };
    struct ct_options opt = {.add_generation_prompt = true};
    expect_render(CT_FAMILY_LLAMA3, m, 2, &opt,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"
                  "\n\nCutting Knowledge Date: December 2023\nToday Date: 26 "
                  "Jul 2024\n\nBe nice.<|eot_id|><|start_header_id|>user<|end_"
                  "header_id|>\n\nHi \xf0\x9f\x99\x82<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    struct ct_options dated = {.date_string = "01 Mar 2025"};
    expect_render(CT_FAMILY_LLAMA32, conv3, 1, &dated,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"
                  "\n\nCutting Knowledge Date: December 2023\nToday Date: 01 "
                  "Mar 2025\n\n<|eot_id|><|start_header_id|>user<|end_header_"
                  "id|>\n\nHi<|eot_id|>");
    /* Llama-3.2 defaults to today as "DD Mon YYYY". */
    char *s = render_ok(CT_FAMILY_LLAMA32, conv3, 1, NULL);
    const char *d = strstr(s, "Today Date: ");
    assert_non_null(d);
    d += 12;
    int day = 0, year = 0;
    char mon[4] = "";
    assert_int_equal(sscanf(d, "%2d %3s %4d", &day, mon, &year), 3);
    assert_true(d[0] >= '0' && d[0] <= '3' && d[2] == ' ' && d[6] == ' ');
    assert_true(day >= 1 && day <= 31 && year >= 2024);
    assert_non_null(strstr("JanFebMarAprMayJunJulAugSepOctNovDec", mon));
    free(s);
    /* Whitespace-only content trims to nothing; bytes that are not UTF-8
     * are kept. */
    const struct ct_message w[] = {
        {.role = "user", .content = "\xe2\x80\xa8\x1f \xc2\x85"},
        {.role = "assistant", .content = " \xff\x80 "},
    };
    char *x = render_ok(CT_FAMILY_LLAMA3, w, 2, NULL);
    assert_non_null(strstr(x, "user<|end_header_id|>\n\n<|eot_id|>"));
    assert_non_null(
        strstr(x, "assistant<|end_header_id|>\n\n\xff\x80<|eot_id|>"));
    free(x);
}

static void test_render_errors(void **state)
{
    (void)state;
    const struct ct_message ok = {.role = "user", .content = "x"};
    for (enum ct_family f = CT_FAMILY_QWEN25; f <= CT_FAMILY_LLAMA32; f++) {
        assert_int_equal(render_err(f, &ok, 0, NULL, "empty"), TG_EINVAL);
        const struct ct_message no_content = {.role = "user"};
        assert_int_equal(render_err(f, &no_content, 1, NULL, "content"),
                         TG_EINVAL);
        const struct ct_message no_role = {.content = "x"};
        assert_int_equal(render_err(f, &no_role, 1, NULL, "role"),
                         TG_EINVAL);
        struct ct_options tools = {.tools = true};
        assert_int_equal(render_err(f, &ok, 1, &tools, "tool"),
                         TG_EUNSUPPORTED);
        const struct ct_message calls[] = {
            ok, {.role = "assistant", .content = "", .tool_calls = true}};
        assert_int_equal(render_err(f, calls, 2, NULL, "messages[1]"),
                         TG_EUNSUPPORTED);
        const struct ct_message tool[] = {ok,
                                          {.role = "tool", .content = "4"}};
        assert_int_equal(render_err(f, tool, 2, NULL, "'tool'"),
                         TG_EUNSUPPORTED);
        const struct ct_message ipy[] = {ok,
                                         {.role = "ipython", .content = "4"}};
        assert_int_equal(render_err(f, ipy, 2, NULL, "'ipython'"),
                         TG_EUNSUPPORTED);
    }
    assert_int_equal(render_err(CT_FAMILY_UNKNOWN, &ok, 1, NULL, NULL),
                     TG_EUNSUPPORTED);
    char *out = NULL;
    char err[128];
    assert_int_equal(ct_render(NULL, &ok, 1, NULL, &out, NULL, err,
                               sizeof err),
                     TG_EUNSUPPORTED);
    assert_null(out);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_read_sources(void **state)
{
    (void)state;
    char dir[128];
    assert_int_equal(tt_tmpdir_make("ct_test_", dir, sizeof dir), 0);
    char path[256], p2[256], err[512];
    char *text = NULL;

    assert_int_equal(ct_template_read_dir(dir, &text, err, sizeof err),
                     TG_ENOENT);
    snprintf(path, sizeof path, "%s/missing.jinja", dir);
    assert_int_equal(ct_template_read_file(path, &text, err, sizeof err),
                     TG_ENOENT);
    assert_null(text);

    /* A config without a template, then the list form. */
    snprintf(path, sizeof path, "%s/tokenizer_config.a.json", dir);
    write_file(path, "{\"bos_token\": null}");
    assert_int_equal(ct_template_read_dir(dir, &text, err, sizeof err),
                     TG_ENOTFOUND);
    write_file(path, "{\"chat_template\": [{\"name\": \"tool_use\", "
                     "\"template\": \"T\"}, {\"name\": \"default\", "
                     "\"template\": \"D\"}]}");
    assert_int_equal(ct_template_read_dir(dir, &text, err, sizeof err), 0);
    assert_string_equal(text, "D");
    free(text);
    text = NULL;
    snprintf(p2, sizeof p2, "%s/tokenizer_config.b.json", dir);
    write_file(p2, "{\"chat_template\": \"B\"}");
    assert_int_equal(ct_template_read_dir(dir, &text, err, sizeof err),
                     TG_EINVAL);
    assert_non_null(strstr(err, "several"));
    unlink(p2);
    write_file(p2, "{not json");
    assert_int_equal(ct_template_read_file(p2, &text, err, sizeof err),
                     TG_EFORMAT);
    unlink(p2);

    /* chat_template.jinja wins over tokenizer_config*.json. */
    char jpath[256];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    write_file(jpath, "{{ messages }}\n");
    assert_int_equal(ct_template_read_dir(dir, &text, err, sizeof err), 0);
    assert_string_equal(text, "{{ messages }}\n");
    free(text);
    tt_tmpdir_remove(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_family_names),
        cmocka_unit_test(test_hash_normalization),
        cmocka_unit_test(test_detect_shipped),
        cmocka_unit_test(test_detect_fingerprint),
        cmocka_unit_test(test_detect_unknown),
        cmocka_unit_test(test_render_qwen25),
        cmocka_unit_test(test_render_qwen3),
        cmocka_unit_test(test_render_llama3),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_read_sources),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
