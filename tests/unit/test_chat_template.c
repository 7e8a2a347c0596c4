/* test_chat_template.c — ct_template: reading templates from files and
 * model directories (chat_template.jinja first, tokenizer_config.json
 * strings and named lists, renamed configs), special tokens as
 * transformers' special_tokens_map holds them (AddedToken objects, unset
 * and empty ones left out), the tool_use template for requests with tools,
 * tool-call format recognition, fixed render vectors of the shipped Qwen3
 * and Llama-3.2 configs (expected strings produced by the real templates
 * through tests/reference/render_jinja.py), chat_template_kwargs,
 * continue_final_message, and the error paths. The byte-for-byte
 * comparison against jinja2 over many conversations is
 * tests/integration/test_chat_template.py. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/chat/ct_template.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *data_path(const char *rel)
{
    static char buf[4096];
    const char *d = getenv("TANGRAM_DATA");
    tt_path(buf, sizeof buf, "%s/%s", d ? d : "data", rel);
    return buf;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *tmpdir(void)
{
    char *d = strdup("/tmp/tangram-ct-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void rmdir_all(char *d)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

/* Renders with template t; returns the malloc'd prompt or NULL (then *rc
 * and err hold the failure). */
static char *render(const struct ct_template *t, const char *messages,
                    const char *tools, const struct ct_render_opts *o,
                    int *rc, char *err, size_t errlen)
{
    json_error_t je;
    json_t *m = json_loads(messages, 0, &je);
    json_t *tl = tools != NULL ? json_loads(tools, 0, &je) : NULL;
    assert_non_null(m);
    char *out = NULL;
    size_t len = 0;
    *rc = ct_template_render(t, m, tl, o, &out, &len, err, errlen);
    if (*rc == 0)
        assert_int_equal(len, strlen(out));
    else
        assert_null(out);
    json_decref(m);
    json_decref(tl);
    return out;
}

static void expect(const struct ct_template *t, const char *messages,
                   const char *tools, const struct ct_render_opts *o,
                   const char *want)
{
    char err[512] = "";
    int rc;
    char *got = render(t, messages, tools, o, &rc, err, sizeof err);
    if (rc != 0)
        fail_msg("render failed: %s", err);
    assert_string_equal(got, want);
    free(got);
}

static void test_read_sources(void **state)
{
    (void)state;
    char *d = tmpdir(), path[512], err[512];
    char *text = NULL;
    /* a .jinja file is the template itself */
    snprintf(path, sizeof path, "%s/t.jinja", d);
    write_file(path, "{{ x }}\n");
    assert_int_equal(ct_template_read_file(path, &text, err, sizeof err), 0);
    assert_string_equal(text, "{{ x }}\n");
    free(text);
    /* a config: its chat_template string, or the "default" of a list */
    snprintf(path, sizeof path, "%s/a.json", d);
    write_file(path, "{\"chat_template\": \"A{{ 1 }}\"}");
    assert_int_equal(ct_template_read_file(path, &text, err, sizeof err), 0);
    assert_string_equal(text, "A{{ 1 }}");
    free(text);
    write_file(path, "{\"chat_template\": [{\"name\": \"tool_use\", "
                     "\"template\": \"T\"}, {\"name\": \"default\", "
                     "\"template\": \"D\"}]}");
    assert_int_equal(ct_template_read_file(path, &text, err, sizeof err), 0);
    assert_string_equal(text, "D");
    free(text);
    write_file(path, "{\"chat_template\": [{\"name\": \"x\", \"template\": "
                     "\"X\"}]}");
    assert_int_equal(ct_template_read_file(path, &text, err, sizeof err),
                     TG_ENOTFOUND);
    assert_non_null(strstr(err, "default"));
    write_file(path, "{\"bos_token\": \"<s>\"}");
    assert_int_equal(ct_template_read_file(path, &text, err, sizeof err),
                     TG_ENOTFOUND);
    write_file(path, "{not json");
    assert_int_equal(ct_template_read_file(path, &text, err, sizeof err),
                     TG_EFORMAT);
    snprintf(path, sizeof path, "%s/missing.jinja", d);
    assert_int_equal(ct_template_read_file(path, &text, err, sizeof err),
                     TG_ENOENT);
    /* a directory: one renamed tokenizer_config.*.json is found ... */
    snprintf(path, sizeof path, "%s/tokenizer_config.m.json", d);
    write_file(path, "{\"chat_template\": \"M\"}");
    assert_int_equal(ct_template_read_dir(d, &text, err, sizeof err), 0);
    assert_string_equal(text, "M");
    free(text);
    /* ... two are ambiguous ... */
    snprintf(path, sizeof path, "%s/tokenizer_config.n.json", d);
    write_file(path, "{\"chat_template\": \"N\"}");
    assert_int_equal(ct_template_read_dir(d, &text, err, sizeof err),
                     TG_EINVAL);
    /* ... tokenizer_config.json decides, and chat_template.jinja wins */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", d);
    write_file(path, "{\"chat_template\": \"C\"}");
    assert_int_equal(ct_template_read_dir(d, &text, err, sizeof err), 0);
    assert_string_equal(text, "C");
    free(text);
    snprintf(path, sizeof path, "%s/chat_template.jinja", d);
    write_file(path, "J");
    assert_int_equal(ct_template_read_dir(d, &text, err, sizeof err), 0);
    assert_string_equal(text, "J");
    free(text);
    rmdir_all(d);
    char *e = tmpdir();
    assert_int_equal(ct_template_read_dir(e, &text, err, sizeof err),
                     TG_ENOENT);
    rmdir_all(e);
}

static void test_load_specials(void **state)
{
    (void)state;
    char *d = tmpdir(), path[512], err[512];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", d);
    write_file(path,
               "{\"bos_token\": {\"content\": \"<B>\", \"lstrip\": false}, "
               "\"eos_token\": \"<E>\", \"unk_token\": null, "
               "\"pad_token\": \"\", \"additional_special_tokens\": "
               "[\"<x>\", {\"content\": \"<y>\"}], "
               "\"chat_template\": [{\"name\": \"default\", \"template\": "
               "\"D{{ bos_token }}{{ eos_token }}{{ unk_token is defined }}"
               "{{ pad_token is defined }}{{ additional_special_tokens }}"
               "{{ tools is none }}{{ documents is none }}\"}, "
               "{\"name\": \"tool_use\", \"template\": \"T{{ tools|length "
               "}}\"}]}");
    struct ct_template t;
    assert_int_equal(ct_template_load_dir(&t, d, err, sizeof err), 0);
    assert_non_null(t.tmpl_tools);
    assert_int_equal(t.tool_format, CT_TOOLS_NONE);
    struct ct_render_opts o = {.add_generation_prompt = true};
    expect(&t, "[]", NULL, &o, "D<B><E>FalseFalse['<x>', '<y>']TrueTrue");
    expect(&t, "[]", "[{\"type\": \"function\"}]", &o, "T1");
    ct_template_free(&t);
    ct_template_free(&t); /* safe twice */
    /* chat_template.jinja takes the config's special tokens along */
    snprintf(path, sizeof path, "%s/chat_template.jinja", d);
    write_file(path, "J{{ bos_token }}\n");
    assert_int_equal(ct_template_load_dir(&t, d, err, sizeof err), 0);
    assert_null(t.tmpl_tools);
    expect(&t, "[]", NULL, &o, "J<B>");
    ct_template_free(&t);
    /* a template the engine refuses names the file and the line */
    write_file(path, "ok\n{% include 'x' %}");
    assert_int_equal(ct_template_load_dir(&t, d, err, sizeof err),
                     TG_EUNSUPPORTED);
    assert_non_null(strstr(err, "chat_template.jinja"));
    assert_non_null(strstr(err, "line 2"));
    assert_non_null(strstr(err, "include"));
    assert_null(t.tmpl);
    rmdir_all(d);
}

static void test_tool_formats(void **state)
{
    (void)state;
    static const struct {
        const char *path;
        enum ct_tool_format want;
    } cases[] = {
        {"tokenizers/qwen2.5/tokenizer_config.json", CT_TOOLS_HERMES},
        {"tokenizers/qwen3/tokenizer_config.json", CT_TOOLS_HERMES},
        {"tokenizers/llama3/tokenizer_config.llama-3.2-3b-instruct.json",
         CT_TOOLS_LLAMA_JSON},
        {"chat_templates/meta-llama-Llama-3.3-70B-Instruct.jinja",
         CT_TOOLS_LLAMA_JSON},
        {"chat_templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
         CT_TOOLS_HERMES},
        {"chat_templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
         CT_TOOLS_NONE},
        {"chat_templates/google-gemma-3-it.jinja", CT_TOOLS_NONE},
    };
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct ct_template t;
        int rc = ct_template_load_file(&t, data_path(cases[i].path), err,
                                       sizeof err);
        if (rc != 0)
            fail_msg("%s: %s", cases[i].path, err);
        assert_int_equal(t.tool_format, cases[i].want);
        ct_template_free(&t);
    }
    assert_string_equal(ct_tool_format_name(CT_TOOLS_HERMES), "hermes");
    assert_string_equal(ct_tool_format_name(CT_TOOLS_LLAMA_JSON),
                        "llama3_json");
    assert_string_equal(ct_tool_format_name(CT_TOOLS_NONE), "none");
}

static void test_render_vectors(void **state)
{
    (void)state;
    char err[512];
    struct ct_template t;
    assert_int_equal(ct_template_load_dir(&t, data_path("tokenizers/qwen3"),
                                          err, sizeof err),
                     0);
    json_error_t je;
    json_t *kw = json_loads("{\"enable_thinking\": false}", 0, &je);
    struct ct_render_opts o = {.add_generation_prompt = true, .kwargs = kw};
    expect(&t,
           "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
           "\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":"
           "\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
           "\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":"
           "\"Paris\"}}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
           "\"content\":\"21C\"}]",
           "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
           "\"description\":\"Weather.\",\"parameters\":{\"type\":"
           "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
           "\"required\":[\"city\"]}}}]",
           &o,
           "<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more "
           "functions to assist with the user query.\n\nYou are provided "
           "with function signatures within <tools></tools> XML tags:\n"
           "<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
           "\"get_weather\", \"description\": \"Weather.\", \"parameters\": "
           "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
           "\"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each "
           "function call, return a json object with function name and "
           "arguments within <tool_call></tool_call> XML tags:\n<tool_call>"
           "\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\n"
           "Weather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
           "{\"name\": \"get_weather\", \"arguments\": {\"city\": "
           "\"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
           "<tool_response>\n21C\n</tool_response><|im_end|>\n"
           "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    /* continue_final_message keeps the final message open */
    struct ct_render_opts c = {.continue_final_message = true};
    expect(&t,
           "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
           "\"content\":\"partial answer  \"}]",
           NULL, &c,
           "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n"
           "\n</think>\n\npartial answer  ");
    ct_template_free(&t);

    assert_int_equal(ct_template_load_dir(&t, data_path("tokenizers/llama3"),
                                          err, sizeof err),
                     0);
    struct tm day = {.tm_year = 125, .tm_mon = 1, .tm_mday = 3};
    struct ct_render_opts l = {.add_generation_prompt = true, .now = &day};
    expect(&t, "[{\"role\":\"user\",\"content\":\" hi \"}]", NULL, &l,
           "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
           "Cutting Knowledge Date: December 2023\nToday Date: 03 Feb 2025"
           "\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi"
           "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    ct_template_free(&t);
    json_decref(kw);
}

static void test_render_errors(void **state)
{
    (void)state;
    char err[512];
    struct ct_template t;
    const char *src =
        "{% if messages|length == 0 %}{{ raise_exception('no messages') }}"
        "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
        "{{ extra|default('-') }}";
    assert_int_equal(ct_template_load_text(&t, src, strlen(src), NULL, err,
                                           sizeof err),
                     0);
    int rc;
    char *out = render(&t, "[]", NULL, NULL, &rc, err, sizeof err);
    assert_int_equal(rc, TG_EINVAL);
    assert_non_null(strstr(err, "no messages"));
    /* extra keyword arguments are template variables ... */
    json_error_t je;
    json_t *kw = json_loads("{\"extra\": 7}", 0, &je);
    struct ct_render_opts o = {.kwargs = kw};
    expect(&t, "[{\"content\": \"a\"}]", NULL, &o, "a7");
    json_decref(kw);
    /* ... but may not replace what the request sets */
    kw = json_loads("{\"messages\": []}", 0, &je);
    o.kwargs = kw;
    out = render(&t, "[{\"content\": \"a\"}]", NULL, &o, &rc, err,
                 sizeof err);
    assert_int_equal(rc, TG_EINVAL);
    assert_non_null(strstr(err, "messages"));
    json_decref(kw);
    /* messages must be an array, tools an array */
    json_t *obj = json_object();
    assert_int_equal(ct_template_render(&t, obj, NULL, NULL, &out, NULL, err,
                                        sizeof err),
                     TG_EINVAL);
    json_t *arr = json_array();
    assert_int_equal(ct_template_render(&t, arr, obj, NULL, &out, NULL, err,
                                        sizeof err),
                     TG_EINVAL);
    /* continue_final_message needs the final text in the output */
    struct ct_render_opts c = {.continue_final_message = true};
    out = render(&t, "[{\"content\": \"abc\"}, {\"content\": [{\"type\": "
                     "\"image\"}]}]",
                 NULL, &c, &rc, err, sizeof err);
    assert_int_equal(rc, TG_EFORMAT);
    assert_int_equal(ct_template_render(&t, arr, NULL, &c, &out, NULL, err,
                                        sizeof err),
                     TG_EFORMAT);
    json_decref(obj);
    json_decref(arr);
    ct_template_free(&t);
    /* a zeroed template renders nothing */
    struct ct_template z = {0};
    out = render(&z, "[]", NULL, NULL, &rc, err, sizeof err);
    assert_int_equal(rc, TG_EINVAL);
    /* parse errors come with their line */
    const char *bad = "a\n\n{% for %}";
    assert_int_equal(ct_template_load_text(&t, bad, strlen(bad), NULL, err,
                                           sizeof err),
                     TG_EFORMAT);
    assert_non_null(strstr(err, "line 3"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_sources),
        cmocka_unit_test(test_load_specials),
        cmocka_unit_test(test_tool_formats),
        cmocka_unit_test(test_render_vectors),
        cmocka_unit_test(test_render_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
