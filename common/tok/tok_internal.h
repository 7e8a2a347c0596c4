/*
 * tok_internal.h — what the tok_*.c files share and nobody else uses:
 * per-id flags, scratch record types, hashing, UTF-8 classification and
 * growable-buffer helpers. Not part of the tokenizer's public API.
 */
#ifndef TOK_INTERNAL_H
#define TOK_INTERNAL_H

#include "common/tok/tok_tokenizer.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

enum {
    TOK__F_VOCAB = 1,   /* in the model vocabulary */
    TOK__F_ADDED = 2,   /* an added token (content is literal) */
    TOK__F_SPECIAL = 4, /* a special added token */
};

enum {
    TOK__SPLIT_ISOLATED = 0,
    TOK__SPLIT_REMOVED = 1,
    TOK__SPLIT_MERGED_PREV = 2,
    TOK__SPLIT_MERGED_NEXT = 3,
};

#define TOK__CACHE_KEY 26 /* longest cached word, bytes */
#define TOK__CACHE_IDS 8  /* most ids of a cached word */

/* One word-cache line (64 bytes). */
struct tok__cache_entry {
    uint32_t tag; /* high hash bits, to skip most key compares */
    uint8_t len;  /* key bytes; 0 = empty slot */
    uint8_t n_ids;
    uint8_t key[TOK__CACHE_KEY];
    int32_t ids[TOK__CACHE_IDS];
};

/* A BPE symbol: a run of the word's bytes that is currently one token. */
struct tok__sym {
    int32_t id;   /* token id, -1 once merged into its left neighbour */
    int32_t prev; /* index of the previous live symbol, -1 none */
    int32_t next; /* index of the next live symbol, -1 none */
};

/* A candidate merge of symbol `pos` with its right neighbour. Ordered by
 * (rank, pos) — lowest rank first, leftmost on ties, as HF's BPE does. */
struct tok__heap_ent {
    uint64_t key; /* rank << 32 | pos */
    int32_t left, right, merged;
};

/* A piece of text (bytes [off, off + len) of the current subject). */
struct tok__piece {
    size_t off, len;
};

/* The GPT-2 byte -> code point table (bytes_to_unicode of openai/gpt-2
 * encoder.py): printable Latin-1 bytes map to themselves, the other 68
 * bytes to U+0100.. in byte order. */
extern const uint16_t tok__byte_cp[256];

/* Classifies the UTF-8 sequence at p[0..n), n >= 1. Returns its length
 * (1..4) when well-formed; 0 when p is a valid but incomplete prefix cut by
 * the end; -k when ill-formed, k >= 1 being the length of the maximal
 * subpart to replace by one U+FFFD (Unicode §3.9, "U+FFFD Substitution of
 * Maximal Subparts", which Rust's from_utf8_lossy implements). */
int tok__utf8_seq(const uint8_t *p, size_t n);

/* Makes room for `extra` more ids. Returns 0 or TG_ENOMEM. */
int tok__ids_reserve(struct tok_ids *ids, size_t extra);

/* Longest key of `trie` that starts at p[0..n) and whose token passes the
 * filter (`skip_special`: ignore special tokens). Returns the index into
 * tok->added and the key length in *klen, or -1. */
int32_t tok__trie_longest(const struct tok_tokenizer *tok,
                          const struct tok__trie *trie, const uint8_t *p,
                          size_t n, int skip_special, size_t *klen);

/* Slot hash of a merge key (left id << 32 | right id). */
static inline uint64_t tok__merge_hash(uint64_t key)
{
    return (key * 0x9E3779B97F4A7C15ull) >> 17;
}

/* The merge table's kind (tok_tokenizer.h, tok__merge_slot): keyed by a
 * uint64_t merge key; empty slots hold the key UINT64_MAX. */
static inline int tok__merge_probe(const void *slot, const void *key)
{
    uint64_t k = ((const struct tok__merge_slot *)slot)->key;
    return k == *(const uint64_t *)key ? TG_HMAP_HIT
           : k == UINT64_MAX           ? TG_HMAP_EMPTY
                                       : TG_HMAP_MISS;
}

static inline int tok__merge_empty(const void *slot)
{
    return ((const struct tok__merge_slot *)slot)->key == UINT64_MAX;
}

static inline uint64_t tok__merge_slot_hash(const void *slot, void *ctx)
{
    (void)ctx;
    return tok__merge_hash(((const struct tok__merge_slot *)slot)->key);
}

static const struct tg_hmap_type tok__merge_type = {
    .esize = sizeof(struct tok__merge_slot),
    .empty_byte = 0xff,
    .probe = tok__merge_probe,
    .is_empty = tok__merge_empty,
    .hash = tok__merge_slot_hash,
};

/* Applies the tokenizer's normalizers to n bytes of valid UTF-8 and puts the
 * result in out (replacing what it held, a failure mark included). Returns
 * 0, TG_ENOMEM or TG_EINVAL (utf8proc refused the text). */
int tok__normalize(const struct tok_tokenizer *tok, const char *s, size_t n,
                   struct tg_buf *out);

/* When the only normalizer is NFC, builds tok->nfc_safe so that
 * tok__normalize can copy text that NFC leaves alone (nearly all of it)
 * instead of running utf8proc over everything. Returns 0 or TG_ENOMEM. */
int tok__nfc_prepare(struct tok_tokenizer *tok, char *err, size_t errlen);

#define TOK__NFC_LIMIT 0x30000 /* code points covered by nfc_safe */

/* The model-vocabulary id whose raw bytes are p[0..n), or -1. */
int32_t tok__vocab_raw(const struct tok_tokenizer *tok, const void *p,
                       size_t n);

/* Optional boolean member `key` of `o` (path `ctx` for errors); *out gets
 * `def` when absent or null. Returns 0 or TG_EFORMAT. */
int tok__opt_bool(json_t *o, const char *key, int def, const char *ctx,
                  int *out, char *err, size_t errlen);

/* Loads the "normalizer" section (null/absent = none). Returns 0,
 * TG_EFORMAT or TG_EUNSUPPORTED. Must run before added tokens load. */
int tok__load_normalizer(struct tok_tokenizer *t, json_t *nz, char *err,
                         size_t errlen);

/* Loads "pre_tokenizer", "post_processor" and "decoder" of document `doc`
 * (after the vocabulary: templates refer to ids). Returns 0, TG_EFORMAT,
 * TG_EUNSUPPORTED or TG_ENOMEM. */
int tok__load_pipeline(struct tok_tokenizer *t, json_t *doc, char *err,
                       size_t errlen);

#endif /* TOK_INTERNAL_H */
