/*
 * tt_grammar.h — helpers of the grammar engine's tests, its benchmark and
 * the random-walk driver (common/grammar): the real tokenizers' vocabularies,
 * the schema corpus tests/grammar/schemas.json, and a sampler of random
 * logits under a token mask. Test code only; one thread per object.
 */
#ifndef TT_GRAMMAR_H
#define TT_GRAMMAR_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_grammar.h"
#include "common/grammar/gm_ir.h"
#include "common/grammar/gm_vocab.h"
#include "tests/support/tt_support.h"

/* Loads data/tokenizers/<name> ($TANGRAM_DATA) into *v (zeroed). Returns
 * 0, or -1 after naming the missing or broken input on stderr. */
int tt_grammar_vocab(const char *name, struct gm_vocab *v);

/* The same, keeping the tokenizer in *tok (zeroed; tok_tokenizer_free it)
 * for decoding. */
int tt_grammar_tokenizer(const char *name, struct tok_tokenizer *tok,
                         struct gm_vocab *v);

/* Builds *v (zeroed) from the 256 single bytes (ids 0..255), then
 * pieces[0..n) (ids 256..), then a special token (id 256 + n) and EOS
 * (id 257 + n, special too): a small vocabulary whose multi-byte pieces
 * can be chosen to cross a grammar's rule boundaries. Returns 0 or -1. */
int tt_grammar_byte_vocab(struct gm_vocab *v, const char *const *pieces,
                          size_t n);

/* The corpus document tests/grammar/schemas.json ($TANGRAM_SOURCE, else
 * the current directory), a new reference; NULL after naming the problem
 * on stderr. Its "schemas" array holds {name, schema, valid, invalid,
 * refused}. */
json_t *tt_grammar_corpus(void);

/* A new spec text (free it) for a JSON Schema, or NULL. */
char *tt_grammar_spec(const json_t *schema, size_t *len);

/* Sampling with random logits: token i gets logit bias * closing(i) plus
 * standard Gumbel noise and the largest allowed logit wins, i.e. it is
 * drawn with probability proportional to exp(bias * closing(i)) among the
 * allowed tokens. closing(i) = 1 when token i's bytes contain '"', ']' or
 * '}' (so a positive bias ends strings and containers sooner), and EOS
 * ids count as closing. */
struct tt_gsampler {
    const struct gm_vocab *v;
    uint32_t *closing; /* mask words of the closing tokens */
    uint32_t *tmp;
    size_t words;
};

int tt_gsampler_init(struct tt_gsampler *s, const struct gm_vocab *v);
void tt_gsampler_free(struct tt_gsampler *s);

/* Draws one allowed token of mask (gm_vocab_mask_words words); -1 when
 * the mask is empty. */
int32_t tt_gsampler_pick(struct tt_gsampler *s, const uint32_t *mask,
                         double bias, struct tt_xrng *r);

/* The number of set bits of mask[0..words). */
size_t tt_mask_count(const uint32_t *mask, size_t words);

/* Writes into out (cap bytes) a readable list of the first ids where the
 * masks a and b differ ("id 123 ' the': fast 1 naive 0"); returns how
 * many ids differ. */
size_t tt_mask_diff(const struct gm_vocab *v, const uint32_t *a,
                    const uint32_t *b, size_t words, char *out, size_t cap);

/* The limits the grammar tests compile under: the defaults, one thread
 * and no wall-time limit (they check masks and verdicts, not the limit,
 * and a Qwen3 compile passed the default 10 s under ASan on a loaded
 * machine). */
void tt_grammar_limits(struct gm_limits *lim);

/* Rule `rule` of ir made its root and compiled against v under
 * tt_grammar_limits; fails the current cmocka test with the reason when
 * it does not compile. The caller frees the grammar. */
struct gm_grammar *tt_grammar_compile_rule(struct gm_ir *ir, int32_t rule,
                                           const struct gm_vocab *v);

#endif /* TT_GRAMMAR_H */
