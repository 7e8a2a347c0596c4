/*
 * grammar_accept.c — the engine's verdict on given documents, for
 * drivers in other languages (tests/integration/test_schema_suite.py).
 *
 *   grammar-accept < CASES.jsonl > VERDICTS.jsonl
 *
 * Each input line: {"spec": <spec JSON>, "texts": [<document text>, ...]}.
 * Each output line: {"rc": <code name, "OK" when it compiled>, "error":
 * <message>, "accepted": [<bool per text>]}: a text is accepted when the
 * grammar takes all its bytes and may end there. The vocabulary is one
 * token per byte (tests/support/tt_grammar.h): the verdicts are the
 * grammar's, not a tokenizer's.
 * Exit status: 0, 2 on bad input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "tests/support/tt_grammar.h"

int main(void)
{
    static const char *const pieces[] = {"\":", "\",\""};
    struct gm_vocab v;
    if (tt_grammar_byte_vocab(&v, pieces, 2) != 0) {
        fprintf(stderr, "grammar-accept: no vocabulary\n");
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *in = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        const json_t *spec = json_object_get(in, "spec");
        const json_t *texts = json_object_get(in, "texts");
        if (spec == NULL || !json_is_array(texts)) {
            fprintf(stderr, "grammar-accept: bad line: %s\n", je.text);
            json_decref(in);
            free(line);
            gm_vocab_free(&v);
            return 2;
        }
        char *st = json_dumps(spec, JSON_COMPACT | JSON_REAL_PRECISION(17));
        struct gm_grammar *g = NULL;
        char err[512] = "";
        int rc = st != NULL ? gm_spec_compile(st, strlen(st), &v, NULL, &g, err,
                                              sizeof err)
                            : TG_ENOMEM;
        free(st);
        json_t *acc = json_array();
        size_t i;
        const json_t *t;
        json_array_foreach(texts, i, t)
        {
            int ok = 0;
            if (rc == 0) {
                struct gm_matcher m;
                if (gm_matcher_init(&m, g) == 0) {
                    int r = gm_matcher_accept_bytes(&m, json_string_value(t),
                                                    json_string_length(t));
                    ok = r == 0 && gm_matcher_can_end(&m);
                    gm_matcher_free(&m);
                }
            }
            json_array_append_new(acc, json_boolean(ok));
        }
        json_t *out = json_pack("{sssssO}", "rc",
                                rc == 0 ? "OK" : tg_err_name(rc), "error", err,
                                "accepted", acc);
        char *os = json_dumps(out, JSON_COMPACT);
        printf("%s\n", os != NULL ? os : "{}");
        fflush(stdout);
        free(os);
        json_decref(out);
        json_decref(acc);
        gm_grammar_unref(g);
        json_decref(in);
    }
    free(line);
    gm_vocab_free(&v);
    return 0;
}
