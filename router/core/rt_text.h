/*
 * rt_text.h — the text side of one generation: incremental detokenization
 * that never splits a UTF-8 sequence, stop strings, and the hold-back that
 * keeps a streamed delta from ever showing the start of a stop string that
 * later completes (OpenAI / vLLM semantics: the stop string itself is not
 * part of the output).
 *
 * Feed sampled tokens with rt_text_push; after each push, bytes
 * [emitted, rt_text_ready()) may be sent to the client and then marked with
 * rt_text_mark. Router loop thread only; one object per request.
 */
#ifndef RT_TEXT_H
#define RT_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "common/tok/tok_tokenizer.h"

struct rt_text {
    struct tok_stream ts;     /* incremental, UTF-8 safe */
    struct tg_buf out;        /* all output text so far (stop-truncated) */
    size_t emitted;           /* bytes already released to the client */
    char **stops;             /* (n_stops) owned copies */
    int n_stops;
    size_t max_stop;          /* longest stop string, bytes */
    int stopped;              /* a stop string matched; out ends before it */
};

/* Starts the text of one request over `tok` (borrowed). Special tokens are
 * skipped in the text. Copies the n_stops stop strings (non-empty).
 * Returns 0, TG_EINVAL (empty stop string) or TG_ENOMEM; *t is zeroed on
 * failure. */
int rt_text_init(struct rt_text *t, const struct tok_tokenizer *tok,
                 const char *const *stops, int n_stops);

/* Frees everything; safe on a zeroed object. */
void rt_text_free(struct rt_text *t);

/* Appends the text of `token`. When a stop string now occurs in the text,
 * cuts the text at its first occurrence and sets *hit (and t->stopped);
 * tokens pushed after that add nothing. Returns 0 or TG_ENOMEM. */
int rt_text_push(struct rt_text *t, int32_t token, int *hit);

/* Flushes an incomplete UTF-8 tail as U+FFFD (call when the request ends
 * without a stop string). Returns 0 or TG_ENOMEM. */
int rt_text_finish(struct rt_text *t);

/* Returns how many bytes of t->out.data may be released now: everything once
 * `final` or stopped, else all but the longest tail that is a proper prefix
 * of some stop string. */
size_t rt_text_ready(const struct rt_text *t, int final);

/* Records that bytes up to `upto` were released. */
void rt_text_mark(struct rt_text *t, size_t upto);

#endif /* RT_TEXT_H */
