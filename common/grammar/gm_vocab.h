/*
 * gm_vocab.h — a tokenizer's vocabulary as the grammar engine sees it:
 * the raw bytes of every token, which ids end the output (EOS), which
 * are never allowed, and a trie of the token byte strings for the mask
 * computation.
 *
 * Token kinds: NORMAL tokens stand for their bytes (byte-level BPE
 * tokens, and added tokens that are not special, such as Qwen's
 * "<tool_call>"); EOS ids (the tokenizer's eos_ids) are allowed only
 * where the document may end; every other special token, an id without a
 * token, an empty token and a token over GM_TOKEN_MAX_BYTES bytes is
 * never allowed.
 *
 * The trie: the normal tokens sorted by their bytes (memcmp order, a
 * prefix before its extensions), and one node per distinct prefix in
 * preorder, so a walk that rejects a prefix skips its whole subtree by
 * jumping to t_end (XGrammar's trie walk with shared-prefix pruning). The
 * tokens of node i's subtree are sorted[t_first[i] .. t_first[t_end[i]]),
 * those ending exactly at i are sorted[t_first[i] .. t_first[i + 1]).
 *
 * A vocabulary is immutable after init and may be used by any number of
 * threads and grammars at once; it must outlive them.
 */
#ifndef GM_VOCAB_H
#define GM_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "common/tok/tok_tokenizer.h"

#define GM_TOKEN_MAX_BYTES 512 /* longer tokens are never allowed */
#define GM_MAX_EOS 8

enum gm_tok_kind {
    GM_TOK_NONE = 0, /* never allowed */
    GM_TOK_NORMAL,   /* its bytes */
    GM_TOK_EOS,      /* ends the document */
};

struct gm_vocab {
    int32_t n_ids;   /* ids 0 .. n_ids - 1 */
    uint32_t *off;   /* (n_ids + 1) token i's bytes: bytes[off[i] .. off[i+1]) */
    uint8_t *bytes;
    uint8_t *kind;   /* (n_ids) enum gm_tok_kind */
    int32_t eos[GM_MAX_EOS];
    int n_eos;
    int max_len;     /* longest normal token, bytes */
    int32_t n_normal;
    int32_t *sorted; /* (n_normal) normal ids in byte order */
    int32_t n_node;  /* trie nodes, node 0 the root */
    uint8_t *t_byte; /* (n_node) the byte leading to the node */
    uint16_t *t_depth;
    int32_t *t_end;   /* (n_node) */
    int32_t *t_first; /* (n_node + 1) */
    uint16_t *t_maxlen; /* (n_node) longest token of the node's subtree */
};

/* The words of a token mask over n_ids ids: (n_ids + 31) / 32. */
size_t gm_vocab_mask_words(const struct gm_vocab *v);

/* Builds *v (zeroed) from a loaded tokenizer (borrowed only during the
 * call). Returns 0 or TG_ENOMEM / TG_EINVAL (no tokens) with err. */
int gm_vocab_init(struct gm_vocab *v, const struct tok_tokenizer *tok,
                  char *err, size_t errlen);

/* Builds *v from n_ids byte strings tok[i] of len[i] bytes (NULL: no
 * token), special[i] != 0 marking special tokens (NULL: none), and the
 * n_eos ids eos[] (at most GM_MAX_EOS). For tests and synthetic
 * vocabularies. Same returns. */
int gm_vocab_init_bytes(struct gm_vocab *v, int32_t n_ids,
                        const char *const *tok, const size_t *len,
                        const uint8_t *special, const int32_t *eos, int n_eos,
                        char *err, size_t errlen);

/* Releases everything and zeroes *v. Safe on a zeroed one. */
void gm_vocab_free(struct gm_vocab *v);

/* Token i's bytes (borrowed) and length; NULL unless it is NORMAL. */
const uint8_t *gm_vocab_token(const struct gm_vocab *v, int32_t id,
                              size_t *len);

#endif /* GM_VOCAB_H */
