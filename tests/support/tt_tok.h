/*
 * tt_tok.h — helpers shared by the tokenizer tests (test_tokenizer.c with
 * the shipped tokenizers, test_tokenizer_synth.c with small synthetic
 * ones): the GPT-2 byte alphabet, encoding that must succeed, and id
 * comparison with a readable diff. Test code only; single thread.
 */
#ifndef TT_TOK_H
#define TT_TOK_H

#include "common/tok/tok_tokenizer.h"

/* Writes the GPT-2 byte-level character of byte b (0..255) as UTF-8 into
 * out (at least 2 bytes, not NUL-terminated) and returns its length, 1 or
 * 2. Printable Latin-1 maps to itself, every other byte to U+0100 + its
 * rank among those (bytes_to_unicode in OpenAI's GPT-2 encoder.py). */
int tt_tok_byte_char(int b, char *out);

/* Sets out->n to 0 and encodes the NUL-terminated s with tok_encode (no
 * cache, the given TOK_ENCODE_* flags) into out, failing the current
 * cmocka test unless it returns 0. The caller frees out with tok_ids_free. */
void tt_tok_encode(const struct tok_tokenizer *tok, const char *s,
                   unsigned flags, struct tok_ids *out);

/* Fails the current cmocka test unless got and want hold the same ids,
 * printing both lists and `what` on stderr when they differ. */
void tt_tok_check_ids(const struct tok_ids *got, const struct tok_ids *want,
                      const char *what);

#endif /* TT_TOK_H */
