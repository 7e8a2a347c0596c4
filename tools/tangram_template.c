/* tangram-template — render a conversation with a model's own chat template.
 *
 *   tangram-template (--tokenizer DIR | --model DIR | --template-file F)
 *                    [--no-generation-prompt] [--continue-final-message]
 *                    [--enable-thinking true|false] [--date-string YYYY-MM-DD]
 *                    [--bos-token S] [--eos-token S]
 *
 * Reads {"messages": [...], "tools": [...]} on stdin ("tools" optional, and
 * an optional "chat_template_kwargs" object of extra template variables)
 * and writes the prompt to stdout exactly (no newline added), rendered as
 * transformers' apply_chat_template renders it (common/chat/ct_template.h): the
 * template and special tokens come from DIR (chat_template.jinja or
 * tokenizer_config.json) or from F (a .jinja template or a
 * tokenizer_config .json). --date-string fixes the date strftime_now()
 * formats (midnight local time of that day); it does not set the template
 * variable date_string, which stays undefined as in transformers.
 * Exit status: 0 ok, 1 render or input error (the message names it), 2
 * usage. A template the engine cannot render fails; it never prints a
 * different prompt. */
#include "common/chat/ct_template.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/json/tg_json.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fputs("usage: tangram-template (--tokenizer DIR | --model DIR | "
          "--template-file F)\n"
          "                        [--no-generation-prompt] "
          "[--continue-final-message]\n"
          "                        [--enable-thinking true|false] "
          "[--date-string YYYY-MM-DD]\n"
          "                        [--bos-token S] [--eos-token S]\n"
          "Reads {\"messages\": [...], \"tools\": [...]} JSON on stdin and "
          "prints the prompt\n"
          "rendered with the model's own chat template (Jinja, as "
          "transformers does).\n"
          "Exit status: 0 ok, 1 render or input error, 2 usage.\n",
          f);
}

static int read_stdin(char **out, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return TG_ENOMEM;
    for (;;) {
        if (n == cap) {
            if (TG_GROW(buf, &cap, cap + 1)) {
                free(buf);
                return TG_ENOMEM;
            }
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(stdin)) {
        free(buf);
        return TG_EIO;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* "YYYY-MM-DD" into midnight of that day. */
static bool parse_date(const char *s, struct tm *tm)
{
    int y, m, d;
    char tail;
    if (sscanf(s, "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 ||
        strlen(s) != 10 || m < 1 || m > 12 || d < 1 || d > 31 || y < 1)
        return false;
    memset(tm, 0, sizeof(*tm));
    tm->tm_year = y - 1900;
    tm->tm_mon = m - 1;
    tm->tm_mday = d;
    tm->tm_isdst = -1;
    struct tm check = *tm;
    if (mktime(&check) == (time_t)-1 || check.tm_mday != d ||
        check.tm_mon != m - 1)
        return false;
    *tm = check;
    return true;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *file = NULL, *bos = NULL, *eos = NULL;
    int thinking = -1;
    bool gen_prompt = true, cont = false, have_date = false;
    struct tm date;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(a, "--model") || !strcmp(a, "--tokenizer")) && has_val) {
            dir = argv[++i];
        } else if (!strcmp(a, "--template-file") && has_val) {
            file = argv[++i];
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen_prompt = false;
        } else if (!strcmp(a, "--continue-final-message")) {
            cont = true;
        } else if (!strcmp(a, "--bos-token") && has_val) {
            bos = argv[++i];
        } else if (!strcmp(a, "--eos-token") && has_val) {
            eos = argv[++i];
        } else if (!strcmp(a, "--enable-thinking") && has_val) {
            const char *v = argv[++i];
            if (!strcmp(v, "true")) {
                thinking = 1;
            } else if (!strcmp(v, "false")) {
                thinking = 0;
            } else {
                fprintf(stderr,
                        "tangram-template: --enable-thinking takes true or "
                        "false, not '%s'\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--date-string") && has_val) {
            const char *v = argv[++i];
            if (!parse_date(v, &date)) {
                fprintf(stderr,
                        "tangram-template: --date-string takes a date "
                        "YYYY-MM-DD, not '%s'\n",
                        v);
                return 2;
            }
            have_date = true;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "tangram-template: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if ((dir != NULL) + (file != NULL) != 1) {
        fprintf(stderr, "tangram-template: give exactly one of --tokenizer, "
                        "--model, --template-file\n");
        usage(stderr);
        return 2;
    }
    if (cont && gen_prompt) {
        /* as transformers: continuing the final message and opening a new
         * assistant turn exclude each other */
        gen_prompt = false;
    }

    char err[1024] = "";
    char *input = NULL, *prompt = NULL;
    json_t *doc = NULL, *kwargs = NULL;
    struct ct_template t = {0};
    int rc = dir != NULL ? ct_template_load_dir(&t, dir, err, sizeof err)
                         : ct_template_load_file(&t, file, err, sizeof err);
    if (rc == 0 && bos != NULL &&
        json_object_set_new(t.specials, "bos_token", json_string(bos)))
        rc = tg_err_set(err, sizeof err, TG_ENOMEM, "out of memory");
    if (rc == 0 && eos != NULL &&
        json_object_set_new(t.specials, "eos_token", json_string(eos)))
        rc = tg_err_set(err, sizeof err, TG_ENOMEM, "out of memory");
    size_t in_len = 0;
    if (rc == 0 && (rc = read_stdin(&input, &in_len)) != 0)
        tg_err_set(err, sizeof err, rc, "reading stdin: %s", tg_strerror(rc));
    if (rc == 0)
        rc = tg_json_load_buf(input, in_len, &doc, err, sizeof err);
    json_t *messages = NULL, *tools = NULL;
    if (rc == 0 && !json_is_object(doc))
        rc = tg_err_set(err, sizeof err, TG_EFORMAT,
                        "stdin: expected a JSON object {\"messages\": [...]}");
    if (rc == 0) {
        messages = json_object_get(doc, "messages");
        tools = json_object_get(doc, "tools");
        if (!json_is_array(messages))
            rc = tg_err_set(err, sizeof err, TG_EFORMAT,
                            "stdin: \"messages\" must be an array");
        else if (tools != NULL && !json_is_array(tools) &&
                 !json_is_null(tools))
            rc = tg_err_set(err, sizeof err, TG_EFORMAT,
                            "stdin: \"tools\" must be an array");
        if (json_is_null(tools))
            tools = NULL;
    }
    if (rc == 0) {
        json_t *kw = json_object_get(doc, "chat_template_kwargs");
        kwargs = json_is_object(kw) ? json_deep_copy(kw) : json_object();
        if (kw != NULL && !json_is_object(kw) && !json_is_null(kw))
            rc = tg_err_set(err, sizeof err, TG_EFORMAT,
                            "stdin: \"chat_template_kwargs\" must be an "
                            "object");
        else if (kwargs == NULL ||
                 (thinking >= 0 &&
                  json_object_set_new(kwargs, "enable_thinking",
                                      json_boolean(thinking)) != 0))
            rc = tg_err_set(err, sizeof err, TG_ENOMEM, "out of memory");
    }
    size_t len = 0;
    if (rc == 0) {
        struct ct_render_opts o = {
            .add_generation_prompt = gen_prompt,
            .continue_final_message = cont,
            .kwargs = kwargs,
            .now = have_date ? &date : NULL,
        };
        rc = ct_template_render(&t, messages, tools, &o, &prompt, &len, err,
                                sizeof err);
    }
    if (rc == 0 &&
        (fwrite(prompt, 1, len, stdout) != len || fflush(stdout) != 0))
        rc = tg_err_set(err, sizeof err, TG_EIO, "writing stdout failed");
    if (rc != 0)
        fprintf(stderr, "tangram-template: %s (%s)\n", err, tg_err_name(rc));
    free(prompt);
    json_decref(kwargs);
    json_decref(doc);
    free(input);
    ct_template_free(&t);
    return rc == 0 ? 0 : 1;
}
