/*
 * tangram-tokenize — encode UTF-8 text from stdin to a JSON array of token
 * ids, or (--decode) a JSON id array from stdin back to text, with a Hugging
 * Face tokenizer.json (common/tok/tok_tokenizer.h).
 *
 *   tangram-tokenize --tokenizer DIR|FILE [--add-special] [--split-special]
 *   tangram-tokenize --tokenizer DIR|FILE --decode [--skip-special]
 *
 * Encoding adds no BOS/EOS unless --add-special; special tokens written in
 * the text are recognized unless --split-special. Decoding prints the text
 * exactly, without a trailing newline. Exit 0 on success, 1 on bad input or
 * a load failure, 2 on bad usage.
 */
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/json/tg_json.h"
#include "common/tok/tok_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: tangram-tokenize --tokenizer DIR|FILE [--add-special] "
        "[--split-special]\n"
        "       tangram-tokenize --tokenizer DIR|FILE --decode "
        "[--skip-special]\n"
        "Encodes UTF-8 text read from stdin and prints a JSON array of ids,\n"
        "or with --decode reads a JSON array of ids and prints the text.\n"
        "  --tokenizer P     tokenizer.json, or a model directory holding it\n"
        "  --add-special     add the template's special ids (Llama-3: BOS)\n"
        "  --split-special   treat special tokens in the text as plain text\n"
        "  --decode          ids -> text\n"
        "  --skip-special    drop special tokens when decoding\n");
}

/* Reads all of stdin into *buf (NUL-terminated); returns 0 or -1. */
static int read_stdin(char **buf, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (b == NULL)
        return -1;
    for (;;) {
        if (cap - n < 4096) {
            if (TG_GROW(b, &cap, cap + 1)) {
                free(b);
                return -1;
            }
        }
        size_t got = fread(b + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(stdin)) {
        free(b);
        return -1;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

static int do_encode(const struct tok_tokenizer *tok, const char *in,
                     size_t len, unsigned flags)
{
    char err[256];
    struct tok_ids ids = {0};
    struct tok_cache cache;
    int rc = tok_cache_init(&cache, tok, 1 << 14, err, sizeof(err));
    if (rc == 0)
        rc = tok_encode(tok, &cache, in, len, flags, &ids, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tangram-tokenize: %s\n", err);
    } else {
        putchar('[');
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? ", %d" : "%d", (int)ids.v[i]);
        printf("]\n");
    }
    tok_cache_free(&cache);
    tok_ids_free(&ids);
    return rc == 0 ? 0 : 1;
}

static int do_decode(const struct tok_tokenizer *tok, const char *in,
                     size_t len, unsigned flags)
{
    char err[256];
    json_t *doc;
    if (tg_json_load_buf(in, len, &doc, err, sizeof(err)) != 0) {
        fprintf(stderr, "tangram-tokenize: %s\n", err);
        return 1;
    }
    int status = 1;
    size_t n = json_array_size(doc);
    int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    struct tg_buf text = {0};
    if (!json_is_array(doc)) {
        fprintf(stderr, "tangram-tokenize: expected a JSON array of ids\n");
        goto out;
    }
    if (ids == NULL) {
        fprintf(stderr, "tangram-tokenize: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(doc, i);
        size_t tl;
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX ||
            tok_id_to_token(tok, (int32_t)json_integer_value(v), &tl) == NULL) {
            fprintf(stderr,
                    "tangram-tokenize: element %zu is not a token id "
                    "of this tokenizer\n",
                    i);
            goto out;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (tok_decode(tok, ids, n, flags, &text, err, sizeof(err)) != 0) {
        fprintf(stderr, "tangram-tokenize: %s\n", err);
        goto out;
    }
    if (text.len > 0 && fwrite(text.data, 1, text.len, stdout) != text.len) {
        fprintf(stderr, "tangram-tokenize: write failed\n");
        goto out;
    }
    status = 0;
out:
    tg_buf_free(&text);
    free(ids);
    json_decref(doc);
    return status;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int decode = 0;
    unsigned eflags = 0, dflags = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else if (strcmp(argv[i], "--add-special") == 0) {
            eflags |= TOK_ENCODE_ADD_SPECIAL;
        } else if (strcmp(argv[i], "--split-special") == 0) {
            eflags |= TOK_ENCODE_SPLIT_SPECIAL;
        } else if (strcmp(argv[i], "--decode") == 0) {
            decode = 1;
        } else if (strcmp(argv[i], "--skip-special") == 0) {
            dflags |= TOK_DECODE_SKIP_SPECIAL;
        } else if (strcmp(argv[i], "--help") == 0 ||
                   strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr,
                    "tangram-tokenize: unknown or incomplete option "
                    "'%s'\n",
                    argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (path == NULL) {
        fprintf(stderr, "tangram-tokenize: --tokenizer is required\n");
        usage(stderr);
        return 2;
    }
    char err[512];
    struct tok_tokenizer tok;
    if (tok_tokenizer_load(&tok, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "tangram-tokenize: %s\n", err);
        return 1;
    }
    char *in;
    size_t len;
    int status;
    if (read_stdin(&in, &len) != 0) {
        fprintf(stderr, "tangram-tokenize: cannot read stdin\n");
        status = 1;
    } else {
        status = decode ? do_decode(&tok, in, len, dflags)
                        : do_encode(&tok, in, len, eflags);
        free(in);
    }
    tok_tokenizer_free(&tok);
    if (fflush(stdout) != 0)
        status = 1;
    return status;
}
