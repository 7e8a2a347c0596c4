/*
 * tok_tokenizer.c — loading tokenizer.json (tok_tokenizer.h): the BPE
 * model's vocabulary and merges, added tokens, the special ids of
 * tokenizer_config.json / generation_config.json, and the lookups. The
 * normalizer / pre-tokenizer / post-processor / decoder sections are read by
 * tok_pipeline.c, the encode path is tok_encode.c, decoding tok_decode.c.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tok/tok_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/base/tg_path.h"
#include "common/json/tg_json.h"

#include <glob.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* bytes_to_unicode() of openai/gpt-2 src/encoder.py. */
const uint16_t tok__byte_cp[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10A,
    0x10B, 0x10C, 0x10D, 0x10E, 0x10F, 0x110, 0x111, 0x112, 0x113, 0x114, 0x115,
    0x116, 0x117, 0x118, 0x119, 0x11A, 0x11B, 0x11C, 0x11D, 0x11E, 0x11F, 0x120,
    0x021, 0x022, 0x023, 0x024, 0x025, 0x026, 0x027, 0x028, 0x029, 0x02A, 0x02B,
    0x02C, 0x02D, 0x02E, 0x02F, 0x030, 0x031, 0x032, 0x033, 0x034, 0x035, 0x036,
    0x037, 0x038, 0x039, 0x03A, 0x03B, 0x03C, 0x03D, 0x03E, 0x03F, 0x040, 0x041,
    0x042, 0x043, 0x044, 0x045, 0x046, 0x047, 0x048, 0x049, 0x04A, 0x04B, 0x04C,
    0x04D, 0x04E, 0x04F, 0x050, 0x051, 0x052, 0x053, 0x054, 0x055, 0x056, 0x057,
    0x058, 0x059, 0x05A, 0x05B, 0x05C, 0x05D, 0x05E, 0x05F, 0x060, 0x061, 0x062,
    0x063, 0x064, 0x065, 0x066, 0x067, 0x068, 0x069, 0x06A, 0x06B, 0x06C, 0x06D,
    0x06E, 0x06F, 0x070, 0x071, 0x072, 0x073, 0x074, 0x075, 0x076, 0x077, 0x078,
    0x079, 0x07A, 0x07B, 0x07C, 0x07D, 0x07E, 0x121, 0x122, 0x123, 0x124, 0x125,
    0x126, 0x127, 0x128, 0x129, 0x12A, 0x12B, 0x12C, 0x12D, 0x12E, 0x12F, 0x130,
    0x131, 0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13A, 0x13B,
    0x13C, 0x13D, 0x13E, 0x13F, 0x140, 0x141, 0x142, 0x0A1, 0x0A2, 0x0A3, 0x0A4,
    0x0A5, 0x0A6, 0x0A7, 0x0A8, 0x0A9, 0x0AA, 0x0AB, 0x0AC, 0x143, 0x0AE, 0x0AF,
    0x0B0, 0x0B1, 0x0B2, 0x0B3, 0x0B4, 0x0B5, 0x0B6, 0x0B7, 0x0B8, 0x0B9, 0x0BA,
    0x0BB, 0x0BC, 0x0BD, 0x0BE, 0x0BF, 0x0C0, 0x0C1, 0x0C2, 0x0C3, 0x0C4, 0x0C5,
    0x0C6, 0x0C7, 0x0C8, 0x0C9, 0x0CA, 0x0CB, 0x0CC, 0x0CD, 0x0CE, 0x0CF, 0x0D0,
    0x0D1, 0x0D2, 0x0D3, 0x0D4, 0x0D5, 0x0D6, 0x0D7, 0x0D8, 0x0D9, 0x0DA, 0x0DB,
    0x0DC, 0x0DD, 0x0DE, 0x0DF, 0x0E0, 0x0E1, 0x0E2, 0x0E3, 0x0E4, 0x0E5, 0x0E6,
    0x0E7, 0x0E8, 0x0E9, 0x0EA, 0x0EB, 0x0EC, 0x0ED, 0x0EE, 0x0EF, 0x0F0, 0x0F1,
    0x0F2, 0x0F3, 0x0F4, 0x0F5, 0x0F6, 0x0F7, 0x0F8, 0x0F9, 0x0FA, 0x0FB, 0x0FC,
    0x0FD, 0x0FE, 0x0FF,
};

#define NO_TOKEN UINT32_MAX

static int oom(char *err, size_t errlen)
{
    return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
}

/* Copies n bytes into the arena; *sp gets their place. */
static int arena_add(struct tok_tokenizer *t, const void *p, size_t n,
                     struct tok__span *sp)
{
    /* Offsets into the arena are uint32_t. */
    if (t->arena_len + n + 1 >= NO_TOKEN ||
        TG_GROW(t->arena, &t->arena_cap, t->arena_len + n + 1))
        return TG_ENOMEM;
    memcpy(t->arena + t->arena_len, p, n);
    sp->off = (uint32_t)t->arena_len;
    sp->len = (uint32_t)n;
    t->arena_len += n;
    return 0;
}

/* The vocabulary tables map bytes to ids: a slot is an int32_t id (-1
 * empty) whose bytes are t->str[id] (by_str) or t->raw[id] (by_raw) in the
 * arena. A lookup's key carries the bytes sought and the spans to compare
 * against. */
struct vocab_key {
    const struct tok_tokenizer *t;
    const struct tok__span *sp; /* t->str or t->raw */
    const void *p;
    size_t n;
};

static inline int vocab_probe(const void *slot, const void *key)
{
    int32_t id = *(const int32_t *)slot;
    const struct vocab_key *k = key;
    if (id < 0)
        return TG_HMAP_EMPTY;
    const struct tok__span *s = &k->sp[id];
    return s->len == k->n && memcmp(k->t->arena + s->off, k->p, k->n) == 0
               ? TG_HMAP_HIT
               : TG_HMAP_MISS;
}

static int vocab_empty(const void *slot)
{
    return *(const int32_t *)slot < 0;
}

/* Rehashing needs the bytes: ctx is the tokenizer, read only while it
 * loads (the tables are sized for the whole vocabulary first and never
 * grow after). */
static uint64_t str_hash(const void *slot, void *ctx)
{
    const struct tok_tokenizer *t = ctx;
    const struct tok__span *s = &t->str[*(const int32_t *)slot];
    return tg_hash_bytes(t->arena + s->off, s->len);
}

static uint64_t raw_hash(const void *slot, void *ctx)
{
    const struct tok_tokenizer *t = ctx;
    const struct tok__span *s = &t->raw[*(const int32_t *)slot];
    return tg_hash_bytes(t->arena + s->off, s->len);
}

static const struct tg_hmap_type str_type = {
    .esize = sizeof(int32_t),
    .empty_byte = 0xff,
    .probe = vocab_probe,
    .is_empty = vocab_empty,
    .hash = str_hash,
};

static const struct tg_hmap_type raw_type = {
    .esize = sizeof(int32_t),
    .empty_byte = 0xff,
    .probe = vocab_probe,
    .is_empty = vocab_empty,
    .hash = raw_hash,
};

/* Looks up n bytes in by_str (use_raw == 0) or by_raw. */
static int32_t table_find(const struct tok_tokenizer *t, int use_raw,
                          const void *p, size_t n)
{
    if (t->by_str.slots == NULL)
        return -1;
    struct vocab_key k = {t, use_raw ? t->raw : t->str, p, n};
    uint64_t h = tg_hash_bytes(p, n);
    const int32_t *slot;
    if (use_raw)
        slot = tg_hmap_find(&t->by_raw, &raw_type, h, &k);
    else
        slot = tg_hmap_find(&t->by_str, &str_type, h, &k);
    return slot != NULL ? *slot : -1;
}

/* Inserts id unless its bytes are already there (first one wins). The
 * table has room for every id: no growth, no failure. */
static void table_put(struct tok_tokenizer *t, int use_raw, int32_t id)
{
    const struct tok__span *sp = use_raw ? t->raw : t->str;
    struct vocab_key k = {t, sp, t->arena + sp[id].off, sp[id].len};
    uint64_t h = tg_hash_bytes(k.p, k.n);
    int added = 0;
    int32_t *slot;
    if (use_raw)
        slot = tg_hmap_put(&t->by_raw, &raw_type, h, &k, &added);
    else
        slot = tg_hmap_put(&t->by_str, &str_type, h, &k, &added);
    TG_ASSERT(slot != NULL);
    if (added)
        *slot = id;
}

/* Sets raw[id]: the bytes behind a byte-level string; a string with a
 * character outside the byte alphabet stands for its own UTF-8 bytes (what
 * HF's ByteLevel decoder does). */
static int set_raw(struct tok_tokenizer *t, const int16_t *inv, int32_t id)
{
    const uint8_t *s = (const uint8_t *)t->arena + t->str[id].off;
    size_t n = t->str[id].len, m = 0;
    uint8_t local[256], *out = n <= sizeof(local) ? local : malloc(n);
    if (out == NULL)
        return TG_ENOMEM;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        int b = (k > 0 && cp < 0x144) ? inv[cp] : -1;
        if (b < 0) {
            m = NO_TOKEN;
            break;
        }
        out[m++] = (uint8_t)b;
        i += (size_t)k;
    }
    int rc = 0;
    if (m == NO_TOKEN || (m == n && memcmp(out, s, n) == 0))
        t->raw[id] = t->str[id];
    else
        rc = arena_add(t, out, m, &t->raw[id]);
    if (out != local)
        free(out);
    return rc;
}

/* ---------------------------------------------------------------- vocab */

static int load_vocab(struct tok_tokenizer *t, json_t *model, json_t *added,
                      char *err, size_t errlen)
{
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "model.vocab: expected an object");
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= TOK_MAX_ID)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "model.vocab[\"%s\"]: expected an id in [0, %d)",
                              key, TOK_MAX_ID);
        if (json_integer_value(v) > max_id)
            max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v)
    {
        json_t *id = json_object_get(v, "id");
        json_t *content = json_object_get(v, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= TOK_MAX_ID || !json_is_string(content) ||
            json_string_length(content) == 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "added_tokens[%zu]: needs an id in [0, %d) and "
                              "a non-empty content",
                              i, TOK_MAX_ID);
        if (json_integer_value(id) > max_id)
            max_id = json_integer_value(id);
    }
    if (max_id < 0)
        return tg_err_set(err, errlen, TG_EFORMAT, "model.vocab: empty");
    t->n_ids = (int32_t)(max_id + 1);
    t->str = malloc((size_t)t->n_ids * sizeof(*t->str));
    t->raw = malloc((size_t)t->n_ids * sizeof(*t->raw));
    t->flags = calloc((size_t)t->n_ids, 1);
    size_t n_vocab = json_object_size(vocab);
    if (!t->str || !t->raw || !t->flags ||
        tg_hmap_init(&t->by_str, &str_type, t, n_vocab) != 0 ||
        tg_hmap_init(&t->by_raw, &raw_type, t, n_vocab) != 0)
        return oom(err, errlen);
    for (int32_t id = 0; id < t->n_ids; id++)
        t->str[id].len = t->raw[id].len = NO_TOKEN;
    int16_t inv[0x144]; /* code point -> byte, the inverse of tok__byte_cp */
    for (int c = 0; c < 0x144; c++)
        inv[c] = -1;
    for (int b = 0; b < 256; b++)
        inv[tok__byte_cp[b]] = (int16_t)b;

    json_object_foreach(vocab, key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        if (t->flags[id] & TOK__F_VOCAB)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "model.vocab[\"%s\"]: id %d is used twice", key,
                              (int)id);
        size_t n = strlen(key);
        if (n == 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "model.vocab: empty token for id %d", (int)id);
        if (arena_add(t, key, n, &t->str[id]) != 0 || set_raw(t, inv, id) != 0)
            return oom(err, errlen);
        t->flags[id] = TOK__F_VOCAB;
        table_put(t, 0, id);
        table_put(t, 1, id);
    }
    for (int b = 0; b < 256; b++) {
        char c[4];
        int n = (int)utf8proc_encode_char(tok__byte_cp[b], (uint8_t *)c);
        t->byte_id[b] = table_find(t, 0, c, (size_t)n);
    }
    return 0;
}

/* Reads merge `i` into its two strings. */
static int merge_parts(json_t *m, size_t i, const char **a, size_t *na,
                       const char **b, size_t *nb, char *err, size_t errlen)
{
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp = strchr(s, ' ');
        if (sp == NULL || sp == s || sp[1] == '\0' || strchr(sp + 1, ' '))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "model.merges[%zu]: expected \"left right\"", i);
        *a = s;
        *na = (size_t)(sp - s);
        *b = sp + 1;
        *nb = strlen(sp + 1);
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 &&
        json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *na = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *nb = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return tg_err_set(err, errlen, TG_EFORMAT,
                      "model.merges[%zu]: expected \"left right\" or "
                      "[left, right]",
                      i);
}

static int load_merges(struct tok_tokenizer *t, json_t *model, char *err,
                       size_t errlen)
{
    json_t *merges = json_object_get(model, "merges");
    if (merges == NULL || json_is_null(merges))
        return 0;
    if (!json_is_array(merges))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "model.merges: expected an array");
    size_t n = json_array_size(merges);
    if (tg_hmap_init(&t->merge, &tok__merge_type, NULL, n) != 0)
        return oom(err, errlen);
    char local[512];
    for (size_t i = 0; i < n; i++) {
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        int rc = merge_parts(json_array_get(merges, i), i, &a, &na, &b, &nb,
                             err, errlen);
        if (rc != 0)
            return rc;
        int32_t ia = table_find(t, 0, a, na), ib = table_find(t, 0, b, nb);
        if (ia < 0 || ib < 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "model.merges[%zu]: token '%.*s' is not in the "
                              "vocabulary",
                              i, (int)(ia < 0 ? na : nb), ia < 0 ? a : b);
        if (na + nb > sizeof(local))
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "model.merges[%zu]: token too long", i);
        memcpy(local, a, na);
        memcpy(local + na, b, nb);
        int32_t im = table_find(t, 0, local, na + nb);
        if (im < 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "model.merges[%zu]: merged token '%.*s' is not "
                              "in the vocabulary",
                              i, (int)(na + nb), local);
        uint64_t key = (uint64_t)ia << 32 | (uint32_t)ib;
        int added = 0;
        struct tok__merge_slot *s = tg_hmap_put(
            &t->merge, &tok__merge_type, tok__merge_hash(key), &key, &added);
        TG_ASSERT(s != NULL); /* room for every merge was made above */
        t->n_merges += (size_t)added;
        /* A repeated pair keeps the later rank, as a HashMap built from the
         * list does in HF. */
        s->key = key;
        s->rank = (uint32_t)i;
        s->id = im;
    }
    return 0;
}

/* --------------------------------------------------------- added tokens */

static int trie_insert(struct tok__trie *tr, const uint8_t *k, size_t n,
                       int32_t added)
{
    if (tr->node == NULL) {
        tr->cap = 64;
        tr->node = malloc(tr->cap * sizeof(*tr->node));
        if (tr->node == NULL)
            return TG_ENOMEM;
        tr->node[0] = (struct tok__trie_node){-1, -1, -1, 0};
        tr->n = 1;
    }
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = tr->node[cur].child;
        while (c >= 0 && tr->node[c].byte != k[i])
            c = tr->node[c].sibling;
        if (c < 0) {
            if (TG_GROW(tr->node, &tr->cap, tr->n + 1))
                return TG_ENOMEM;
            c = (int32_t)tr->n++;
            tr->node[c] =
                (struct tok__trie_node){-1, tr->node[cur].child, -1, k[i]};
            tr->node[cur].child = c;
        }
        cur = c;
    }
    if (tr->node[cur].added < 0)
        tr->node[cur].added = added;
    tr->first[k[0] >> 3] |= (uint8_t)(1u << (k[0] & 7));
    return 0;
}

int32_t tok__trie_longest(const struct tok_tokenizer *tok,
                          const struct tok__trie *tr, const uint8_t *p,
                          size_t n, int skip_special, size_t *klen)
{
    if (tr->node == NULL || !(tr->first[p[0] >> 3] & (1u << (p[0] & 7))))
        return -1;
    int32_t cur = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = tr->node[cur].child;
        while (c >= 0 && tr->node[c].byte != p[i])
            c = tr->node[c].sibling;
        if (c < 0)
            break;
        cur = c;
        int32_t a = tr->node[c].added;
        if (a >= 0 && !(skip_special && tok->added[a].special)) {
            best = a;
            *klen = i + 1;
        }
    }
    return best;
}

static int load_added(struct tok_tokenizer *t, json_t *added, char *err,
                      size_t errlen)
{
    size_t n = json_array_size(added);
    if (n == 0)
        return 0;
    t->added = calloc(n, sizeof(*t->added));
    if (t->added == NULL)
        return oom(err, errlen);
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(added, i);
        struct tok__added *a = &t->added[i];
        char ctx[48];
        snprintf(ctx, sizeof(ctx), "added_tokens[%zu]", i);
        int special = 0, lstrip = 0, rstrip = 0, single = 0, norm = 0;
        int rc = tok__opt_bool(o, "special", 0, ctx, &special, err, errlen);
        if (rc == 0)
            rc = tok__opt_bool(o, "lstrip", 0, ctx, &lstrip, err, errlen);
        if (rc == 0)
            rc = tok__opt_bool(o, "rstrip", 0, ctx, &rstrip, err, errlen);
        if (rc == 0)
            rc = tok__opt_bool(o, "single_word", 0, ctx, &single, err, errlen);
        if (rc == 0) /* HF: normalized defaults to !special */
            rc = tok__opt_bool(o, "normalized", !special, ctx, &norm, err,
                               errlen);
        if (rc != 0)
            return rc;
        json_t *content = json_object_get(o, "content");
        a->id = (int32_t)json_integer_value(json_object_get(o, "id"));
        a->special = (uint8_t)special;
        a->lstrip = (uint8_t)lstrip;
        a->rstrip = (uint8_t)rstrip;
        a->single_word = (uint8_t)single;
        a->normalized = (uint8_t)(norm && t->n_norm > 0);
        if (arena_add(t, json_string_value(content),
                      json_string_length(content), &a->content) != 0)
            return oom(err, errlen);
        /* The added token's content is what the id is and decodes to. */
        t->str[a->id] = t->raw[a->id] = a->content;
        t->flags[a->id] |=
            (uint8_t)(TOK__F_ADDED | (special ? TOK__F_SPECIAL : 0));
        t->n_added = i + 1;
        const uint8_t *key = (const uint8_t *)t->arena + a->content.off;
        if (!a->normalized) {
            rc = trie_insert(&t->trie_raw, key, a->content.len, (int32_t)i);
        } else {
            struct tg_buf nk = {0};
            rc = tok__normalize(t, (const char *)key, a->content.len, &nk);
            if (rc == 0 && nk.len > 0)
                rc = trie_insert(&t->trie_norm, (const uint8_t *)nk.data,
                                 nk.len, (int32_t)i);
            tg_buf_free(&nk);
        }
        if (rc != 0)
            return oom(err, errlen);
    }
    return 0;
}

static int load_model(struct tok_tokenizer *t, json_t *doc, char *err,
                      size_t errlen)
{
    json_t *model = json_object_get(doc, "model");
    if (!json_is_object(model))
        return tg_err_set(err, errlen, TG_EFORMAT, "model: expected an object");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type != NULL && strcmp(type, "BPE") != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "model type '%s' is not supported (BPE only)", type);
    json_t *drop = json_object_get(model, "dropout");
    if (drop != NULL && !json_is_null(drop) && json_number_value(drop) != 0.0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED, "model.dropout");
    static const char *const affix[] = {"continuing_subword_prefix",
                                        "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, affix[i]);
        if (v != NULL && !json_is_null(v) &&
            !(json_is_string(v) && json_string_length(v) == 0))
            return tg_err_set(err, errlen, TG_EUNSUPPORTED, "model.%s",
                              affix[i]);
    }
    int fallback = 0, rc;
    rc = tok__opt_bool(model, "byte_fallback", 0, "model", &fallback, err,
                       errlen);
    if (rc == 0 && fallback)
        rc = tg_err_set(err, errlen, TG_EUNSUPPORTED, "model.byte_fallback");
    if (rc == 0)
        rc = tok__opt_bool(model, "ignore_merges", 0, "model",
                           &t->ignore_merges, err, errlen);
    if (rc != 0)
        return rc;
    json_t *added = json_object_get(doc, "added_tokens");
    if (added != NULL && !json_is_null(added) && !json_is_array(added))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "added_tokens: expected an array");
    if ((rc = tok__load_normalizer(t, json_object_get(doc, "normalizer"), err,
                                   errlen)) != 0 ||
        (rc = tok__nfc_prepare(t, err, errlen)) != 0 ||
        (rc = load_vocab(t, model, added, err, errlen)) != 0 ||
        (rc = load_merges(t, model, err, errlen)) != 0 ||
        (rc = load_added(t, added, err, errlen)) != 0)
        return rc;
    t->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) {
        t->unk_id =
            table_find(t, 0, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "model.unk_token: not in the vocabulary");
    }
    return tok__load_pipeline(t, doc, err, errlen);
}

/* ------------------------------------------------------- special ids */

/* A token named in tokenizer_config.json: "text", {"content": "text"} or
 * null. Returns its id or -1. */
static int32_t config_token(const struct tok_tokenizer *t, json_t *v)
{
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return -1;
    return tok_token_to_id(t, json_string_value(v), json_string_length(v));
}

static void add_eos(struct tok_tokenizer *t, json_int_t id)
{
    if (id < 0 || id >= t->n_ids || t->n_eos == TOK_MAX_EOS)
        return;
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id)
            return;
    t->eos_ids[t->n_eos++] = (int32_t)id;
}

/* Loads dir/name, or else the first dir/pattern match; *doc stays NULL when
 * neither exists. */
static int load_side_file(const char *dir, const char *name,
                          const char *pattern, json_t **doc, char *err,
                          size_t errlen)
{
    char path[4096];
    *doc = NULL;
    TG_TRY(tg_path_fmt(path, sizeof(path), err, errlen, "%s/%s", dir, name));
    struct stat st;
    if (stat(path, &st) != 0) {
        glob_t g;
        TG_TRY(tg_path_fmt(path, sizeof(path), err, errlen, "%s/%s", dir,
                           pattern));
        if (glob(path, 0, NULL, &g) != 0)
            return 0;
        int rc = tg_path_fmt(path, sizeof(path), err, errlen, "%s",
                             g.gl_pathv[0]);
        globfree(&g);
        if (rc != 0)
            return rc;
    }
    return tg_json_load_file(path, doc, err, errlen);
}

static int load_specials(struct tok_tokenizer *t, const char *dir, char *err,
                         size_t errlen)
{
    json_t *cfg, *gen;
    int rc = load_side_file(dir, "tokenizer_config.json",
                            "tokenizer_config*.json", &cfg, err, errlen);
    if (rc != 0)
        return rc;
    t->bos_id = config_token(t, json_object_get(cfg, "bos_token"));
    t->eos_id = config_token(t, json_object_get(cfg, "eos_token"));
    t->pad_id = config_token(t, json_object_get(cfg, "pad_token"));
    json_decref(cfg);
    add_eos(t, t->eos_id);
    rc = load_side_file(dir, "generation_config.json",
                        "generation_config*.json", &gen, err, errlen);
    if (rc != 0)
        return rc;
    json_t *e = json_object_get(gen, "eos_token_id");
    if (json_is_integer(e))
        add_eos(t, json_integer_value(e));
    size_t i;
    json_t *v;
    json_array_foreach(e, i, v) add_eos(t, json_integer_value(v));
    json_decref(gen);
    return 0;
}

int tok_tokenizer_load(struct tok_tokenizer *tok, const char *path, char *err,
                       size_t errlen)
{
    memset(tok, 0, sizeof(*tok));
    char file[4096], dir[4096];
    struct stat st;
    if (stat(path, &st) != 0)
        return tg_err_set(err, errlen, TG_ENOENT,
                          "%s: no such file or "
                          "directory",
                          path);
    if (S_ISDIR(st.st_mode)) {
        TG_TRY(tg_path_fmt(dir, sizeof(dir), err, errlen, "%s", path));
        TG_TRY(tg_path_fmt(file, sizeof(file), err, errlen, "%s/tokenizer.json",
                           path));
    } else {
        TG_TRY(tg_path_fmt(file, sizeof(file), err, errlen, "%s", path));
        const char *slash = strrchr(path, '/');
        if (slash == NULL)
            snprintf(dir, sizeof(dir), ".");
        else
            TG_TRY(tg_path_fmt(dir, sizeof(dir), err, errlen, "%.*s",
                               (int)(slash - path + (slash == path)), path));
    }
    json_t *doc;
    int rc = tg_json_load_file(file, &doc, err, errlen);
    if (rc != 0)
        return rc;
    if (!json_is_object(doc))
        rc =
            tg_err_set(err, errlen, TG_EFORMAT, "%s: expected an object", file);
    else
        rc = load_model(tok, doc, err, errlen);
    json_decref(doc);
    if (rc == 0)
        rc = load_specials(tok, dir, err, errlen);
    if (rc != 0)
        tok_tokenizer_free(tok);
    return rc;
}

void tok_tokenizer_free(struct tok_tokenizer *tok)
{
    for (int i = 0; i < tok->n_steps; i++)
        pcre2_code_free(tok->step[i].re);
    free(tok->arena);
    free(tok->str);
    free(tok->raw);
    free(tok->flags);
    tg_hmap_free(&tok->by_str);
    tg_hmap_free(&tok->by_raw);
    tg_hmap_free(&tok->merge);
    free(tok->added);
    free(tok->nfc_safe);
    free(tok->trie_raw.node);
    free(tok->trie_norm.node);
    memset(tok, 0, sizeof(*tok));
}

int32_t tok_vocab_size(const struct tok_tokenizer *tok)
{
    return tok->n_ids;
}

int32_t tok_token_to_id(const struct tok_tokenizer *tok, const char *s,
                        size_t len)
{
    for (size_t i = 0; i < tok->n_added; i++) {
        const struct tok__added *a = &tok->added[i];
        if (a->content.len == len &&
            memcmp(tok->arena + a->content.off, s, len) == 0)
            return a->id;
    }
    return table_find(tok, 0, s, len);
}

const char *tok_id_to_token(const struct tok_tokenizer *tok, int32_t id,
                            size_t *len)
{
    if (id < 0 || id >= tok->n_ids || tok->str[id].len == NO_TOKEN)
        return NULL;
    *len = tok->str[id].len;
    return tok->arena + tok->str[id].off;
}

const char *tok_id_bytes(const struct tok_tokenizer *tok, int32_t id,
                         size_t *len)
{
    if (id < 0 || id >= tok->n_ids || tok->str[id].len == NO_TOKEN)
        return NULL;
    *len = tok->raw[id].len;
    return tok->arena + tok->raw[id].off;
}

int tok_id_is_special(const struct tok_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_ids && (tok->flags[id] & TOK__F_SPECIAL);
}

int32_t tok__vocab_raw(const struct tok_tokenizer *tok, const void *p, size_t n)
{
    return table_find(tok, 1, p, n);
}
