/*
 * fz_tok.h — the checks both tokenizer harnesses (fuzz_tokenizer.c,
 * fuzz_tok_encode.c) run on a loaded tokenizer: encoding text with and
 * without a word cache, decoding the ids at once and through the
 * streaming decoder, decoding arbitrary ids.
 */
#ifndef FZ_TOK_H
#define FZ_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "common/tok/tok_tokenizer.h"

/* Encodes text[0..n) with `flags` (TOK_ENCODE_*), with the word cache c
 * and without: both must agree, ids must be tokens of tok, and the ids
 * then go through fz_tok_decode. Aborts on a broken invariant. */
void fz_tok_encode(const struct tok_tokenizer *tok, struct tok_cache *c,
                   const char *text, size_t n, unsigned flags);

/* Decodes ids[0..n) with `flags` (TOK_DECODE_*) at once and through a
 * tok_stream: the output must be valid UTF-8 and the two must be equal.
 * Aborts on a broken invariant. */
void fz_tok_decode(const struct tok_tokenizer *tok, const int32_t *ids,
                   size_t n, unsigned flags);

#endif /* FZ_TOK_H */
