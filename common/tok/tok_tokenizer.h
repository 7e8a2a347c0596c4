/*
 * tok_tokenizer.h — Hugging Face tokenizer.json byte-level BPE, as used by
 * Llama-3 and Qwen2/2.5/3: prompt encoding, decoding and streaming decode.
 *
 * Encoding follows the `tokenizers` library pipeline:
 *   1. added tokens (special and not) are cut out of the raw text first,
 *      leftmost-longest, honouring lstrip / rstrip / single_word; tokens with
 *      "normalized": true are matched again after normalization;
 *   2. the rest is normalized (NFC/NFD/NFKC/NFKD through utf8proc) when the
 *      file asks for it;
 *   3. the pre-tokenizer's Split regexes (PCRE2, UTF + UCP, JIT) cut it into
 *      words (behaviours Isolated, Removed, MergedWithPrevious,
 *      MergedWithNext; invert); ByteLevel maps bytes to the GPT-2 byte
 *      alphabet (with use_regex it also applies the GPT-2 split regex);
 *   4. each word is merged by BPE rank: a (left id, right id) -> (rank,
 *      merged id) hash table and a binary heap over a linked list of symbols,
 *      so a word of n bytes costs O(n log n); with "ignore_merges" a word
 *      that is itself in the vocabulary is emitted directly;
 *   5. with TOK_ENCODE_ADD_SPECIAL the post-processor's template ids are put
 *      around the result (TemplateProcessing, Bert/RobertaProcessing).
 * Supported: model "BPE" without dropout, byte fallback or subword affixes;
 * anything else in the file is rejected at load with TG_EUNSUPPORTED.
 *
 * Decoding maps ids to bytes (the inverse byte table for vocabulary tokens,
 * the literal content for added tokens) and replaces each maximal ill-formed
 * UTF-8 subsequence by U+FFFD, like Rust's String::from_utf8_lossy (what HF
 * returns). The streaming decoder emits only complete UTF-8 sequences; its
 * concatenated output equals tok_decode() of all ids at once. No
 * "clean_up_tokenization_spaces" is applied: decode(encode(x)) == x.
 *
 * Threads: a loaded tokenizer is immutable; tok_encode / tok_decode / the
 * lookups may run on any number of threads at once. A struct tok_cache
 * (word cache + scratch) and a struct tok_stream belong to one thread at a
 * time.
 */
#ifndef TOK_TOKENIZER_H
#define TOK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/tg_buf.h"
#include "common/base/tg_hmap.h"

#define TOK_ENCODE_ADD_SPECIAL 1u /* add the post-processor's ids (BOS) */
#define TOK_ENCODE_SPLIT_SPECIAL                                               \
    2u                             /* special tokens in the text are plain     \
                                      text (non-special added tokens still     \
                                      match), like HF encode_special_tokens */
#define TOK_DECODE_SKIP_SPECIAL 1u /* drop special added tokens */

#define TOK_MAX_ID (1 << 22) /* ids must be below this */
#define TOK_MAX_STEPS 4      /* pre-tokenizer regex steps */
#define TOK_MAX_TEMPLATE 8   /* ids before / after the sequence */
#define TOK_MAX_EOS 8

/* A growable id array the caller owns; zeroed is empty. */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};

/* Frees the storage and zeroes the array. Safe on a zeroed array. */
void tok_ids_free(struct tok_ids *ids);

/* ---- internal types (read-only after load; layout may change) ---- */
struct tok__span {
    uint32_t off, len; /* bytes in tok_tokenizer.arena */
};

struct tok__added {
    int32_t id;
    struct tok__span content; /* as written in the file */
    uint8_t special, lstrip, rstrip, single_word, normalized;
};

struct tok__trie_node {
    int32_t child;   /* first child node, -1 none */
    int32_t sibling; /* next sibling node, -1 none */
    int32_t added;   /* index into tok_tokenizer.added ending here, -1 none */
    uint8_t byte;
};

struct tok__trie {
    struct tok__trie_node *node; /* node[0] is the root */
    size_t n, cap;
    uint8_t first[32]; /* bitmap of bytes that start some key */
};

struct tok__merge_slot {
    uint64_t key; /* left id << 32 | right id; UINT64_MAX = empty */
    uint32_t rank;
    int32_t id; /* the merged token */
};

struct tok__step {
    void *re;         /* pcre2_code_8 * */
    uint8_t behavior; /* TOK__SPLIT_* */
    uint8_t invert;
};

/* A loaded tokenizer. Caller owns the storage; fill with
 * tok_tokenizer_load(), release with tok_tokenizer_free(). Public fields are
 * read-only. */
struct tok_tokenizer {
    int32_t n_ids;  /* max id + 1 (vocabulary incl. added tokens) */
    int32_t bos_id; /* from tokenizer_config.json, -1 when none */
    int32_t eos_id; /* from tokenizer_config.json, -1 when none */
    int32_t pad_id; /* from tokenizer_config.json, -1 when none */
    int32_t eos_ids[TOK_MAX_EOS]; /* eos_id, then generation_config.json's
                                     eos_token_id(s), without repeats */
    int n_eos;

    /* ---- internal ---- */
    char *arena; /* token strings and their raw bytes */
    size_t arena_len, arena_cap;
    struct tok__span *str; /* (n_ids) token as written ("Ġthe"); len
                              UINT32_MAX when the id has no token */
    struct tok__span *raw; /* (n_ids) the bytes the token decodes to */
    uint8_t *flags;        /* (n_ids) TOK__F_* */
    struct tg_hmap by_str; /* model vocab: string -> id (int32_t slots) */
    struct tg_hmap by_raw; /* model vocab: raw bytes -> id */
    struct tg_hmap merge;  /* struct tok__merge_slot slots; slots NULL
                              without merges */
    size_t n_merges;
    int32_t byte_id[256]; /* id of each single byte, -1 when missing */
    struct tok__added *added;
    size_t n_added;
    struct tok__trie trie_raw;  /* added tokens with normalized == false */
    struct tok__trie trie_norm; /* normalized == true, by normalized key */
    struct tok__step step[TOK_MAX_STEPS];
    int n_steps;
    int norm[4]; /* utf8proc option sets applied in order */
    int n_norm;
    uint8_t *nfc_safe; /* NFC only: bitmap over code points < 0x30000 of
                          those that never change under NFC nor merge with
                          what precedes them; NULL otherwise */
    int add_prefix_space;
    int ignore_merges;
    int32_t unk_id; /* model unk_token id, -1 none */
    int32_t prefix[TOK_MAX_TEMPLATE], suffix[TOK_MAX_TEMPLATE];
    int n_prefix, n_suffix;
};

/* Loads `path`: a tokenizer.json file, or a directory holding one. Special
 * ids come from tokenizer_config.json and generation_config.json in the same
 * directory when present (if missing, the first tokenizer_config*.json /
 * generation_config*.json there is used). On failure *tok is left zeroed and
 * the return is TG_ENOENT, TG_EIO, TG_EFORMAT (malformed file, with the
 * field named in err), TG_EUNSUPPORTED (a feature this module lacks) or
 * TG_ENOMEM. `tok` must be zeroed or freed. Any thread. */
int tok_tokenizer_load(struct tok_tokenizer *tok, const char *path, char *err,
                       size_t errlen);

/* Releases everything and zeroes *tok. Safe on a zeroed or half-loaded one. */
void tok_tokenizer_free(struct tok_tokenizer *tok);

/* Returns n_ids (max id + 1 over the vocabulary and added tokens). */
int32_t tok_vocab_size(const struct tok_tokenizer *tok);

/* Returns the id of the token written as `s` (`len` bytes: an added token's
 * content or a vocabulary string such as "Ġthe"), or -1. Added tokens are
 * searched first, linearly; vocabulary lookups are O(len). Any thread. */
int32_t tok_token_to_id(const struct tok_tokenizer *tok, const char *s,
                        size_t len);

/* Returns the token string of `id` as written in the file (borrowed, lives as
 * long as tok, not NUL-terminated) and its length in *len, or NULL when the
 * id has no token. Any thread. */
const char *tok_id_to_token(const struct tok_tokenizer *tok, int32_t id,
                            size_t *len);

/* Returns the raw bytes `id` decodes to (borrowed, *len bytes, maybe not
 * valid UTF-8 on its own), or NULL when the id has no token. Any thread. */
const char *tok_id_bytes(const struct tok_tokenizer *tok, int32_t id,
                         size_t *len);

/* Returns 1 when `id` is a special added token, else 0. */
int tok_id_is_special(const struct tok_tokenizer *tok, int32_t id);

/* Per-thread encoder state: a bounded word -> ids cache (direct-mapped,
 * words up to 26 bytes giving up to 8 ids) and reusable scratch buffers.
 * Bound to one tokenizer. */
struct tok_cache {
    const struct tok_tokenizer *tok;
    struct tok__cache_entry *ent; /* (mask + 1) entries, NULL = no cache */
    size_t mask;
    void *md; /* pcre2_match_data_8 * */
    struct tok__sym *sym;
    size_t sym_cap;
    struct tok__heap_ent *heap;
    size_t heap_cap;
    struct tok__piece *piece[2]; /* pieces between pre-tokenizer steps */
    size_t n_piece[2], piece_cap[2];
    struct tg_buf norm;    /* the normalized segment */
    struct tg_buf pre;     /* a segment with ByteLevel's prefix space */
    uint64_t hits, misses; /* word cache statistics */
    size_t stop_n;         /* internal: tok_encode_max's bound on out->n */
};

/* Prepares `c` for encoding with `tok` (which must outlive it). `entries`
 * word-cache entries of 64 bytes are allocated, rounded up to a power of
 * two; 0 disables the word cache (scratch reuse remains). Returns 0 or
 * TG_ENOMEM. One thread at a time may use `c`. */
int tok_cache_init(struct tok_cache *c, const struct tok_tokenizer *tok,
                   size_t entries, char *err, size_t errlen);

/* Releases `c` and zeroes it. Safe on a zeroed one. */
void tok_cache_free(struct tok_cache *c);

/* Encodes `len` bytes of UTF-8 `text` and appends the ids to `out` (which
 * keeps what it held). `flags`: TOK_ENCODE_*. `cache` may be NULL (scratch
 * is then allocated per call) or a cache initialised for this tokenizer.
 * Returns 0, TG_EINVAL (text is not valid UTF-8, or a cache of another
 * tokenizer; err says where), TG_ETOOBIG (a single word over 2^31 bytes,
 * or a pre-tokenizer regex hit PCRE2's match limit) or TG_ENOMEM; on
 * failure `out->n` is unchanged. Thread-safe for distinct
 * caches. */
int tok_encode(const struct tok_tokenizer *tok, struct tok_cache *cache,
               const char *text, size_t len, unsigned flags,
               struct tok_ids *out, char *err, size_t errlen);

/* tok_encode with a bound: when the text gives more than `max_ids` ids
 * (the post-processor's included) it returns TG_ERANGE, `out->n`
 * unchanged, having stopped at the first word that starts past the bound,
 * so a text far over the bound costs about max_ids ids of work, not its
 * whole length (UTF-8 validation, one linear pass, still covers it all).
 * Byte length alone cannot prove a text over the bound: a token may span
 * many bytes, so the bound is checked on the ids as they come. max_ids =
 * SIZE_MAX is tok_encode. Same codes and threads as tok_encode. */
int tok_encode_max(const struct tok_tokenizer *tok, struct tok_cache *cache,
                   const char *text, size_t len, unsigned flags,
                   size_t max_ids, struct tok_ids *out, char *err,
                   size_t errlen);

/* Decodes `n` ids and appends the text to `out` (always valid UTF-8: ill-
 * formed byte sequences become U+FFFD). Ids without a token (negative, too
 * large, or holes) are skipped, as HF does. `flags`: TOK_DECODE_*. Returns 0
 * or TG_ENOMEM (out keeps its text and is marked failed, tg_buf.h). Any
 * thread. The text outputs of this header are struct tg_buf (the caller's,
 * zeroed or holding text to append to). */
int tok_decode(const struct tok_tokenizer *tok, const int32_t *ids, size_t n,
               unsigned flags, struct tg_buf *out, char *err, size_t errlen);

/* Streaming decoder for one generated sequence. Holds at most 3 bytes of an
 * incomplete UTF-8 sequence between calls. */
struct tok_stream {
    const struct tok_tokenizer *tok;
    unsigned flags;  /* TOK_DECODE_* */
    uint8_t pend[4]; /* the incomplete tail */
    uint8_t npend;
};

/* Starts a stream over `tok` (borrowed) with TOK_DECODE_* `flags`. */
void tok_stream_init(struct tok_stream *s, const struct tok_tokenizer *tok,
                     unsigned flags);

/* Feeds one id and appends to `out` only the text that is now complete:
 * never a broken UTF-8 sequence. Bytes that can never complete a sequence
 * become U+FFFD at once. Returns 0 or TG_ENOMEM. */
int tok_stream_put(struct tok_stream *s, int32_t id, struct tg_buf *out,
                   char *err, size_t errlen);

/* Ends the stream: an incomplete tail becomes one U+FFFD appended to `out`;
 * the stream is then empty and may be reused. Returns 0 or TG_ENOMEM. */
int tok_stream_finish(struct tok_stream *s, struct tg_buf *out, char *err,
                      size_t errlen);

/* Returns 1 when `n` bytes at `s` are well-formed UTF-8, else 0 and, when
 * `bad` is non-NULL, the offset of the first ill-formed byte in *bad. */
int tok_utf8_valid(const char *s, size_t n, size_t *bad);

#endif /* TOK_TOKENIZER_H */
