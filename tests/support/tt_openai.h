/*
 * tt_openai.h — the OpenAI request parser's tests' one way in
 * (router/api/rt_openai.h): parse a body at an endpoint, check that a
 * failed parse leaves the request empty, free what succeeded. Shared by
 * test_openai.c (valid requests, defaults, fields) and
 * test_openai_invalid.c (the table of refused requests). Test code only;
 * any thread.
 */
#ifndef TT_OPENAI_H
#define TT_OPENAI_H

#include <stddef.h>

#include "router/api/rt_openai.h"

/* The endpoints: completions, chat, tokenize, detokenize. */
enum tt_ep { TT_EP_COMPLETION, TT_EP_CHAT, TT_EP_TOKENIZE, TT_EP_DETOKENIZE };

/* The limits both test files parse under: model "tiny", a context of 128,
 * a vocabulary of 1,000, bodies of at most 4,096 bytes. */
extern const struct rt_openai_cfg tt_openai_cfg;

/* Parses `body` (len bytes) at endpoint ep under tt_openai_cfg and frees
 * the result; returns the parser's code, its detail in *e. Fails the
 * current cmocka test when a failed completion or chat parse left
 * anything in the request. */
int tt_openai_parse(enum tt_ep ep, const char *body, size_t len,
                    struct rt_request_error *e);

#endif /* TT_OPENAI_H */
