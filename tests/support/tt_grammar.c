/* tt_grammar.c — helpers of the grammar engine's tests (tt_grammar.h). */
#include "tests/support/tt_grammar.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_spec.h"
#include "common/tok/tok_tokenizer.h"
#include "tests/support/tt_support.h"

int tt_grammar_tokenizer(const char *name, struct tok_tokenizer *tok,
                         struct gm_vocab *v)
{
    char path[4096], rel[256], err[512];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    tt_data_path(rel, path, sizeof path);
    memset(tok, 0, sizeof(*tok));
    if (tok_tokenizer_load(tok, path, err, sizeof err) != 0) {
        fprintf(stderr, "tt_grammar_vocab: %s: %s\n", path, err);
        return -1;
    }
    if (gm_vocab_init(v, tok, err, sizeof err) != 0) {
        fprintf(stderr, "tt_grammar_vocab: %s: %s\n", path, err);
        tok_tokenizer_free(tok);
        return -1;
    }
    return 0;
}

int tt_grammar_vocab(const char *name, struct gm_vocab *v)
{
    struct tok_tokenizer tok;
    int rc = tt_grammar_tokenizer(name, &tok, v);
    if (rc == 0)
        tok_tokenizer_free(&tok);
    return rc;
}

int tt_grammar_byte_vocab(struct gm_vocab *v, const char *const *pieces,
                          size_t n)
{
    size_t n_ids = 258 + n;
    const char **tok = calloc(n_ids, sizeof(*tok));
    size_t *len = calloc(n_ids, sizeof(*len));
    uint8_t *special = calloc(n_ids, 1);
    static char bytes[256];
    int rc = -1;
    if (tok != NULL && len != NULL && special != NULL) {
        for (int i = 0; i < 256; i++) {
            bytes[i] = (char)i;
            tok[i] = &bytes[i];
            len[i] = 1;
        }
        for (size_t i = 0; i < n; i++) {
            tok[256 + i] = pieces[i];
            len[256 + i] = strlen(pieces[i]);
        }
        tok[256 + n] = "<|special|>";
        tok[257 + n] = "<|eos|>";
        len[256 + n] = strlen(tok[256 + n]);
        len[257 + n] = strlen(tok[257 + n]);
        special[256 + n] = special[257 + n] = 1;
        int32_t eos = (int32_t)(257 + n);
        char err[256];
        rc = gm_vocab_init_bytes(v, (int32_t)n_ids, tok, len, special, &eos,
                                 1, err, sizeof err) == 0
                 ? 0
                 : -1;
    }
    free(tok);
    free(len);
    free(special);
    return rc;
}

json_t *tt_grammar_corpus(void)
{
    const char *src = getenv("TANGRAM_SOURCE");
    char path[4096];
    tt_path(path, sizeof path, "%s/tests/grammar/schemas.json",
            src != NULL && src[0] ? src : ".");
    json_error_t je;
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (doc == NULL || !json_is_array(json_object_get(doc, "schemas"))) {
        fprintf(stderr, "tt_grammar_corpus: %s: %s\n", path,
                doc == NULL ? je.text : "no \"schemas\" array");
        json_decref(doc);
        return NULL;
    }
    return doc;
}

char *tt_grammar_spec(const json_t *schema, size_t *len)
{
    char *s = NULL;
    if (gm_spec_json_schema(schema, &s, len) != 0)
        return NULL;
    return s;
}

int tt_gsampler_init(struct tt_gsampler *s, const struct gm_vocab *v)
{
    memset(s, 0, sizeof(*s));
    s->v = v;
    s->words = gm_vocab_mask_words(v);
    s->closing = calloc(s->words, sizeof(*s->closing));
    s->tmp = calloc(s->words, sizeof(*s->tmp));
    if (s->closing == NULL || s->tmp == NULL) {
        tt_gsampler_free(s);
        return -1;
    }
    for (int32_t id = 0; id < v->n_ids; id++) {
        size_t len;
        const uint8_t *b = gm_vocab_token(v, id, &len);
        int c = v->kind[id] == GM_TOK_EOS;
        for (size_t k = 0; b != NULL && k < len && !c; k++)
            c = b[k] == '"' || b[k] == ']' || b[k] == '}';
        if (c)
            s->closing[id >> 5] |= 1u << (id & 31);
    }
    return 0;
}

void tt_gsampler_free(struct tt_gsampler *s)
{
    free(s->closing);
    free(s->tmp);
    memset(s, 0, sizeof(*s));
}

size_t tt_mask_count(const uint32_t *mask, size_t words)
{
    size_t n = 0;
    for (size_t i = 0; i < words; i++)
        n += (size_t)__builtin_popcount(mask[i]);
    return n;
}

/* The k-th (0-based) set bit of m[0..words). */
static int32_t kth_bit(const uint32_t *m, size_t words, size_t k)
{
    for (size_t i = 0; i < words; i++) {
        size_t c = (size_t)__builtin_popcount(m[i]);
        if (k < c) {
            uint32_t w = m[i];
            while (k-- > 0)
                w &= w - 1;
            return (int32_t)(i * 32 + (size_t)__builtin_ctz(w));
        }
        k -= c;
    }
    return -1;
}

int32_t tt_gsampler_pick(struct tt_gsampler *s, const uint32_t *mask,
                         double bias, struct tt_xrng *r)
{
    /* Gumbel-max over logits bias * closing(i) is the categorical draw
     * with weights exp(bias) for closing tokens and 1 for the others:
     * pick the group by its total weight, then uniformly inside it. */
    size_t n_close = 0, n_other = 0;
    for (size_t i = 0; i < s->words; i++) {
        n_close += (size_t)__builtin_popcount(mask[i] & s->closing[i]);
        n_other += (size_t)__builtin_popcount(mask[i] & ~s->closing[i]);
    }
    if (n_close + n_other == 0)
        return -1;
    double wc = exp(bias) * (double)n_close;
    int closing = tt_xrng_unit(r) * (wc + (double)n_other) < wc;
    for (size_t i = 0; i < s->words; i++)
        s->tmp[i] = mask[i] & (closing ? s->closing[i] : ~s->closing[i]);
    size_t n = closing ? n_close : n_other;
    return kth_bit(s->tmp, s->words, (size_t)(tt_xrng_unit(r) * (double)n));
}

size_t tt_mask_diff(const struct gm_vocab *v, const uint32_t *a,
                    const uint32_t *b, size_t words, char *out, size_t cap)
{
    size_t n = 0, at = 0;
    if (cap > 0)
        out[0] = '\0';
    for (size_t i = 0; i < words * 32; i++) {
        int x = (a[i >> 5] >> (i & 31)) & 1, y = (b[i >> 5] >> (i & 31)) & 1;
        if (x == y)
            continue;
        if (n++ < 8 && at < cap) {
            size_t len = 0;
            const uint8_t *t = (int32_t)i < v->n_ids
                                   ? gm_vocab_token(v, (int32_t)i, &len)
                                   : NULL;
            int k = snprintf(out + at, cap - at, "id %zu '%.*s': fast %d naive %d; ",
                             i, (int)(len > 40 ? 40 : len),
                             t != NULL ? (const char *)t : "", x, y);
            if (k > 0)
                at += (size_t)k < cap - at ? (size_t)k : cap - at - 1;
        }
    }
    return n;
}

void tt_grammar_limits(struct gm_limits *lim)
{
    gm_limits_default(lim);
    lim->threads = 1;
    lim->max_compile_s = 0;
}

struct gm_grammar *tt_grammar_compile_rule(struct gm_ir *ir, int32_t rule,
                                           const struct gm_vocab *v)
{
    assert_int_equal(gm_ir_root_set(ir, rule), 0);
    struct gm_grammar *g = NULL;
    char err[256];
    struct gm_limits lim;
    tt_grammar_limits(&lim);
    if (gm_grammar_compile_ir(ir, v, &lim, &g, err, sizeof err) != 0)
        fail_msg("compile: %s", err);
    return g;
}
