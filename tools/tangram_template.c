/* tangram-template — render a chat conversation with a model's chat template.
 *
 *   tangram-template (--model DIR | --tokenizer DIR | --template-file F)
 *                    [--template NAME] [--no-generation-prompt]
 *                    [--enable-thinking true|false] [--date-string S]
 *                    [--detect]
 *
 * Reads {"messages": [{"role", "content", "reasoning_content"?}, ...]} on
 * stdin and writes the rendered prompt to stdout exactly (no newline added).
 * The template comes from the model/tokenizer directory (chat_template.jinja
 * or tokenizer_config.json) or from a .jinja / tokenizer_config .json file;
 * --template NAME picks the family instead of detecting it (then no source
 * is needed). --detect prints "<family> <exact|fingerprint|named> <hash>"
 * and reads no stdin. Exit status: 0 ok, 1 render/input error, 2 usage. */
#include "common/ct_template.h"
#include "common/tg_err.h"
#include "common/tg_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: tangram-template (--model DIR | --tokenizer DIR | "
          "--template-file F)\n"
          "                        [--template NAME] "
          "[--no-generation-prompt]\n"
          "                        [--enable-thinking true|false] "
          "[--date-string S] [--detect]\n"
          "Reads {\"messages\": [...]} JSON on stdin, prints the prompt.\n"
          "Template names: chatml-qwen2.5, qwen3, llama3, llama3.2\n",
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
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                return TG_ENOMEM;
            }
            buf = nb;
            cap *= 2;
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

/* Converts the request JSON into messages borrowing strings from doc;
 * *msgs is malloc'd (caller frees). */
static int parse_request(json_t *doc, struct ct_message **msgs, size_t *n,
                         struct ct_options *opt, char *err, size_t errlen)
{
    *msgs = NULL;
    *n = 0;
    if (!json_is_object(doc))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "request: expected a JSON object");
    json_t *tools = json_object_get(doc, "tools");
    if (tools != NULL && !json_is_null(tools))
        opt->tools = true;
    json_t *arr = NULL;
    int rc = tg_json_get_array(doc, "messages", "", -1, &arr, err, errlen);
    if (rc != 0)
        return rc;
    size_t count = json_array_size(arr);
    struct ct_message *m = calloc(count ? count : 1, sizeof *m);
    if (m == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        json_t *jm = json_array_get(arr, i);
        char ctx[48];
        snprintf(ctx, sizeof ctx, "messages[%zu]", i);
        if (!json_is_object(jm)) {
            rc = tg_err_set(err, errlen, TG_EFORMAT,
                            "%s: expected an object", ctx);
            goto fail;
        }
        rc = tg_json_get_string(jm, "role", ctx, &m[i].role, err, errlen);
        if (rc != 0)
            goto fail;
        json_t *c = json_object_get(jm, "content");
        if (json_is_array(c)) {
            rc = tg_err_set(err, errlen, TG_EUNSUPPORTED,
                            "%s.content: content parts are not supported; "
                            "pass a string",
                            ctx);
            goto fail;
        }
        rc = tg_json_get_string(jm, "content", ctx, &m[i].content, err,
                                errlen);
        if (rc != 0)
            goto fail;
        json_t *rcj = json_object_get(jm, "reasoning_content");
        if (rcj != NULL && !json_is_null(rcj)) {
            if (!json_is_string(rcj)) {
                rc = tg_err_set(err, errlen, TG_EFORMAT,
                                "%s.reasoning_content: expected a string",
                                ctx);
                goto fail;
            }
            m[i].reasoning_content = json_string_value(rcj);
        }
        m[i].tool_calls = json_object_get(jm, "tool_calls") != NULL;
    }
    *msgs = m;
    *n = count;
    return 0;
fail:
    free(m);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *file = NULL, *name = NULL;
    struct ct_options opt = {.add_generation_prompt = true};
    bool detect_only = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if ((strcmp(a, "--model") == 0 || strcmp(a, "--tokenizer") == 0) &&
            has_val) {
            dir = argv[++i];
        } else if (strcmp(a, "--template-file") == 0 && has_val) {
            file = argv[++i];
        } else if (strcmp(a, "--template") == 0 && has_val) {
            name = argv[++i];
        } else if (strcmp(a, "--no-generation-prompt") == 0) {
            opt.add_generation_prompt = false;
        } else if (strcmp(a, "--enable-thinking") == 0 && has_val) {
            const char *v = argv[++i];
            if (strcmp(v, "true") == 0) {
                opt.enable_thinking = CT_THINKING_ON;
            } else if (strcmp(v, "false") == 0) {
                opt.enable_thinking = CT_THINKING_OFF;
            } else {
                fprintf(stderr,
                        "tangram-template: --enable-thinking takes true or "
                        "false, not '%s'\n",
                        v);
                return 2;
            }
        } else if (strcmp(a, "--date-string") == 0 && has_val) {
            opt.date_string = argv[++i];
        } else if (strcmp(a, "--detect") == 0) {
            detect_only = true;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "tangram-template: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if ((dir != NULL) + (file != NULL) > 1 ||
        (dir == NULL && file == NULL && name == NULL)) {
        fprintf(stderr, "tangram-template: give exactly one of --model, "
                        "--tokenizer, --template-file (or --template NAME)\n");
        usage(stderr);
        return 2;
    }

    char err[512] = "";
    char *text = NULL, *input = NULL, *prompt = NULL;
    struct ct_message *msgs = NULL;
    json_t *doc = NULL;
    int status = 1, rc = 0;
    if (dir != NULL)
        rc = ct_template_read_dir(dir, &text, err, sizeof err);
    else if (file != NULL)
        rc = ct_template_read_file(file, &text, err, sizeof err);
    if (rc != 0)
        goto out;
    struct ct_template t;
    rc = ct_template_select(text, name, &t, err, sizeof err);
    if (rc != 0)
        goto out;
    if (detect_only) {
        static const char *const how[] = {"none", "exact", "fingerprint",
                                          "named"};
        printf("%s %s %016llx\n", ct_family_name(t.family), how[t.match],
               (unsigned long long)t.hash);
        status = 0;
        goto out;
    }
    size_t in_len = 0;
    rc = read_stdin(&input, &in_len);
    if (rc != 0) {
        tg_err_set(err, sizeof err, rc, "reading stdin: %s",
                   tg_strerror(rc));
        goto out;
    }
    rc = tg_json_load_buf(input, in_len, &doc, err, sizeof err);
    if (rc != 0)
        goto out;
    size_t n = 0;
    rc = parse_request(doc, &msgs, &n, &opt, err, sizeof err);
    if (rc != 0)
        goto out;
    size_t len = 0;
    rc = ct_render(&t, msgs, n, &opt, &prompt, &len, err, sizeof err);
    if (rc != 0)
        goto out;
    if (fwrite(prompt, 1, len, stdout) != len || fflush(stdout) != 0) {
        rc = tg_err_set(err, sizeof err, TG_EIO, "writing stdout failed");
        goto out;
    }
    status = 0;
out:
    if (status != 0)
        fprintf(stderr, "tangram-template: %s (%s)\n", err,
                tg_err_name(rc));
    free(prompt);
    free(msgs);
    json_decref(doc);
    free(input);
    free(text);
    return status;
}
