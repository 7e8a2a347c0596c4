/*
 * fz_gram.h — driving a grammar matcher from fuzzed bytes, for the
 * harnesses of the grammar engine's parsers (fuzz_regex.c, fuzz_gbnf.c).
 * Fuzzing code only; aborts through fz_fail when an invariant breaks.
 */
#ifndef FZ_GRAM_H
#define FZ_GRAM_H

#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_grammar.h"

/* Drives a matcher of g over d[0..n), one byte token per byte (v built
 * by tt_grammar_byte_vocab: ids 0..255 are the bytes, `eos` its EOS id):
 * at every step the fast mask equals the brute-force one
 * (gm_matcher_fill_mask_naive), EOS is allowed exactly where the document
 * may end, and a byte is accepted exactly when the mask allows it (a
 * refused byte is skipped). At most 256 steps. */
void fz_gram_drive(struct gm_grammar *g, const struct gm_vocab *v, int32_t eos,
                   const uint8_t *d, size_t n);

/* 1 when a fresh matcher of g accepts bytes s[0..n) as a whole document
 * (every byte accepted and the document may end there). */
int fz_gram_accepts(struct gm_grammar *g, const void *s, size_t n);

#endif /* FZ_GRAM_H */
