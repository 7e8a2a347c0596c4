/*
 * tok_pipeline.c — the tokenizer.json sections around the BPE model
 * (tok_tokenizer.h): normalizer, pre-tokenizer (compiled to PCRE2 splits),
 * post-processor template and decoder.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tok/tok_internal.h"
#include "common/base/tg_err.h"

#include <jansson.h>
#include <pcre2.h>
#include <string.h>
#include <utf8proc.h>

/* The GPT-2 split regex, used by a ByteLevel pre-tokenizer with
 * use_regex (HF tokenizers pre_tokenizers/byte_level.rs). */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
    "|\\s+(?!\\S)|\\s+";

/* Optional boolean member with a default. */
int tok__opt_bool(json_t *o, const char *key, int def, const char *ctx,
                  int *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return tg_err_set(err, errlen, TG_EFORMAT, "%s.%s: expected a boolean",
                          ctx, key);
    *out = json_is_true(v);
    return 0;
}

int tok__load_normalizer(struct tok_tokenizer *t, json_t *nz, char *err,
                         size_t errlen)
{
    if (nz == NULL || json_is_null(nz))
        return 0;
    const char *type = json_string_value(json_object_get(nz, "type"));
    if (type == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT, "normalizer.type: missing");
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(nz, "normalizers");
        if (!json_is_array(list))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "normalizer.normalizers: expected an array");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v)
        {
            int rc = tok__load_normalizer(t, v, err, errlen);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    int opts = UTF8PROC_STABLE;
    if (strcmp(type, "NFC") == 0)
        opts |= UTF8PROC_COMPOSE;
    else if (strcmp(type, "NFD") == 0)
        opts |= UTF8PROC_DECOMPOSE;
    else if (strcmp(type, "NFKC") == 0)
        opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (strcmp(type, "NFKD") == 0)
        opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "normalizer type '%s' is not supported", type);
    if (t->n_norm == (int)(sizeof(t->norm) / sizeof(t->norm[0])))
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "normalizer: too many steps");
    t->norm[t->n_norm++] = opts;
    return 0;
}

static int add_step(struct tok_tokenizer *t, const char *pat, size_t len,
                    int literal, int behavior, int invert, char *err,
                    size_t errlen)
{
    if (t->n_steps == TOK_MAX_STEPS)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "pre_tokenizer: more than %d splits", TOK_MAX_STEPS);
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ec, &eo, NULL);
    if (re == NULL) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "pre_tokenizer: regex error at offset %zu: %s",
                          (size_t)eo, (const char *)msg);
    }
    /* JIT is an optimisation; without it pcre2_match interprets. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    struct tok__step *s = &t->step[t->n_steps++];
    s->re = re;
    s->behavior = (uint8_t)behavior;
    s->invert = (uint8_t)invert;
    return 0;
}

static int load_pretok(struct tok_tokenizer *t, json_t *pt, int *byte_level,
                       char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (type == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "pre_tokenizer.type: missing");
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "pre_tokenizer.pretokenizers: expected an array");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v)
        {
            int rc = load_pretok(t, v, byte_level, err, errlen);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    if (*byte_level)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "pre_tokenizer: '%s' after ByteLevel", type);
    int rc;
    if (strcmp(type, "ByteLevel") == 0) {
        int prefix = 0, use_regex = 0;
        rc = tok__opt_bool(pt, "add_prefix_space", 1, "pre_tokenizer", &prefix,
                           err, errlen);
        if (rc == 0)
            rc = tok__opt_bool(pt, "use_regex", 1, "pre_tokenizer", &use_regex,
                               err, errlen);
        if (rc != 0)
            return rc;
        /* The prefix space is put before each segment, which is the piece
         * ByteLevel sees only when no split ran before it. */
        if (prefix && t->n_steps > 0)
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "pre_tokenizer: ByteLevel add_prefix_space after "
                              "a split");
        t->add_prefix_space = prefix;
        *byte_level = 1;
        if (use_regex)
            return add_step(t, GPT2_REGEX, sizeof(GPT2_REGEX) - 1, 0,
                            TOK__SPLIT_ISOLATED, 0, err, errlen);
        return 0;
    }
    if (strcmp(type, "Digits") == 0) {
        int single = 0;
        rc = tok__opt_bool(pt, "individual_digits", 0, "pre_tokenizer", &single,
                           err, errlen);
        if (rc != 0)
            return rc;
        const char *re = single ? "\\p{N}" : "\\p{N}+";
        return add_step(t, re, strlen(re), 0, TOK__SPLIT_ISOLATED, 0, err,
                        errlen);
    }
    if (strcmp(type, "Split") != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "pre_tokenizer type '%s' is not supported", type);
    json_t *pat = json_object_get(pt, "pattern");
    json_t *re = json_object_get(pat, "Regex");
    json_t *lit = json_object_get(pat, "String");
    json_t *p = json_is_string(re) ? re : lit;
    if (!json_is_string(p))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "pre_tokenizer.pattern: expected {\"Regex\": ...} or "
                          "{\"String\": ...}");
    const char *beh = json_string_value(json_object_get(pt, "behavior"));
    static const char *const names[] = {"Isolated", "Removed",
                                        "MergedWithPrevious", "MergedWithNext"};
    int behavior = -1;
    for (int i = 0; beh != NULL && i < 4; i++)
        if (strcmp(beh, names[i]) == 0)
            behavior = i;
    if (behavior < 0)
        return tg_err_set(err, errlen, beh ? TG_EUNSUPPORTED : TG_EFORMAT,
                          "pre_tokenizer.behavior: '%s' is not supported",
                          beh ? beh : "(missing)");
    int invert = 0;
    rc = tok__opt_bool(pt, "invert", 0, "pre_tokenizer", &invert, err, errlen);
    if (rc != 0)
        return rc;
    return add_step(t, json_string_value(p), json_string_length(p), p == lit,
                    behavior, invert, err, errlen);
}

/* Appends the ids of one template item to the prefix or suffix. */
static int template_ids(struct tok_tokenizer *t, json_t *ids, int suffix,
                        const char *ctx, char *err, size_t errlen)
{
    int32_t *dst = suffix ? t->suffix : t->prefix;
    int *n = suffix ? &t->n_suffix : &t->n_prefix;
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v)
    {
        json_int_t id = json_integer_value(v);
        /* An id below n_ids can still be a hole between tokens (str len
         * UINT32_MAX): encoding would emit an id with no token. */
        if (!json_is_integer(v) || id < 0 || id >= t->n_ids ||
            t->str[id].len == UINT32_MAX)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: id out of the vocabulary", ctx);
        if (*n == TOK_MAX_TEMPLATE)
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "%s: too many template ids", ctx);
        dst[(*n)++] = (int32_t)id;
    }
    return 0;
}

static int load_post(struct tok_tokenizer *t, json_t *pp, char *err,
                     size_t errlen)
{
    if (pp == NULL || json_is_null(pp))
        return 0;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "post_processor.type: missing");
    if (strcmp(type, "ByteLevel") == 0)
        return 0; /* offsets only */
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(pp, "processors");
        if (!json_is_array(list))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "post_processor.processors: expected an array");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v)
        {
            int rc = load_post(t, v, err, errlen);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    if (t->n_prefix > 0 || t->n_suffix > 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "post_processor: more than one template");
    if (strcmp(type, "BertProcessing") == 0 ||
        strcmp(type, "RobertaProcessing") == 0) {
        json_t *cls = json_object_get(pp, "cls"),
               *sep = json_object_get(pp, "sep");
        json_t *a = json_pack("[O]", json_array_get(cls, 1));
        json_t *b = json_pack("[O]", json_array_get(sep, 1));
        int rc = (a && b)
                     ? template_ids(t, a, 0, "post_processor.cls", err, errlen)
                     : tg_err_set(err, errlen, TG_EFORMAT,
                                  "post_processor: cls/sep must be "
                                  "[token, id]");
        if (rc == 0)
            rc = template_ids(t, b, 1, "post_processor.sep", err, errlen);
        json_decref(a);
        json_decref(b);
        return rc;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "post_processor type '%s' is not supported", type);
    json_t *single = json_object_get(pp, "single");
    json_t *specials = json_object_get(pp, "special_tokens");
    if (!json_is_array(single))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "post_processor.single: expected an array");
    int seen_seq = 0;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item)
    {
        json_t *st = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence") != NULL) {
            if (seen_seq++)
                return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                                  "post_processor.single: two sequences");
            continue;
        }
        const char *name = json_string_value(json_object_get(st, "id"));
        json_t *ids =
            json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (name == NULL || !json_is_array(ids))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "post_processor.single[%zu]: unknown special "
                              "token",
                              i);
        int rc = template_ids(t, ids, seen_seq, "post_processor.single", err,
                              errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int tok__load_pipeline(struct tok_tokenizer *t, json_t *doc, char *err,
                       size_t errlen)
{
    int rc;
    json_t *pt = json_object_get(doc, "pre_tokenizer");
    int byte_level = 0;
    if (pt != NULL && !json_is_null(pt) &&
        (rc = load_pretok(t, pt, &byte_level, err, errlen)) != 0)
        return rc;
    if (!byte_level)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "pre_tokenizer: no ByteLevel step (only byte-level "
                          "BPE is supported)");
    if ((rc = load_post(t, json_object_get(doc, "post_processor"), err,
                        errlen)) != 0)
        return rc;
    json_t *dec = json_object_get(doc, "decoder");
    const char *dtype = json_string_value(json_object_get(dec, "type"));
    if (dec != NULL && !json_is_null(dec) &&
        (dtype == NULL || strcmp(dtype, "ByteLevel") != 0))
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "decoder type '%s' is not supported (ByteLevel only)",
                          dtype ? dtype : "(missing)");
    return 0;
}
