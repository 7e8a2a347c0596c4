/*
 * gm_gbnf.h — llama.cpp's GBNF grammars (what its server's `grammar`,
 * vLLM's `guided_grammar` / `structured_outputs.grammar` and SGLang's
 * `ebnf` users send) parsed into grammar IR.
 *
 * The notation (llama.cpp's grammars/README.md), read leniently:
 *   root ::= "{" ws pair ("," ws pair)* "}"   # a comment
 *   rules        name ::= alternatives; names of letters, digits, '-' and
 *                '_'; a rule may be used before it is defined; `root` is
 *                the start
 *   literals     "text" with the escapes \n \r \t \\ \" \[ \] \xHH \uHHHH
 *                \UHHHHHHHH (code points, written as UTF-8) and \ before
 *                any other ASCII punctuation (itself)
 *   classes      [a-z0-9_], [^"\\], with the same escapes; ranges of code
 *                points; `.` is any code point
 *   groups ( ), alternation |, repetition * + ? {m} {m,} {m,n}
 *   whitespace and comments (# to the end of the line) anywhere between
 *                elements, newlines included: a rule ends where the next
 *                `name ::=` begins (llama.cpp itself ends a rule at a
 *                newline outside parentheses unless a `|` precedes it; every
 *                grammar it reads is read the same here)
 * Every code point is written as its UTF-8 bytes (surrogates, which UTF-8
 * cannot hold, match nothing).
 *
 * Refused (TG_EFORMAT or TG_EINVAL, the message naming the line and
 * column or the rule): syntax errors, an unknown escape, a class range out
 * of order, a rule used but never defined or defined twice, no `root`,
 * repetition counts above GM_REPEAT_MAX or min > max, groups nested more
 * than GM_GBNF_MAX_NESTING deep, and left recursion (a rule that can reach
 * itself before reading a character, e.g. `expr ::= expr "+" term`: the
 * message names the cycle of rules; rewrite it as `expr ::= term ("+"
 * term)*`). Rules no document can complete are the automaton compiler's
 * to refuse (gm_grammar.h).
 *
 * Thread: as the IR written to.
 */
#ifndef GM_GBNF_H
#define GM_GBNF_H

#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_ir.h"

#define GM_GBNF_MAX_NESTING 200 /* parentheses */
#define GM_GBNF_MAX_RULES 65536

/* Parses the GBNF text [text, text + len) into rules of ir, one per GBNF
 * rule with the grammar's own names, and returns the id of `root` (not
 * made the IR's start rule: gm_ir_root_set does that). Returns the rule
 * id or a negative code (TG_EFORMAT, TG_EINVAL, TG_ETOOBIG, TG_ENOMEM,
 * TG_ETIMEDOUT past the IR's deadline) with the message in err, also
 * recorded in the IR. */
int32_t gm_gbnf_compile(struct gm_ir *ir, const char *text, size_t len,
                        char *err, size_t errlen);

#endif /* GM_GBNF_H */
