/* test_server_deliver.c — how the router hands a request's output to its
 * sink (rt_req_deliver, rt_req_resume in router/core/rt_server*.c) when the
 * client applies backpressure (rt_req.blocked).
 *
 * Covered: output that piled up goes out in deliveries of at most
 * RT_DELIVER_MAX_TOKENS tokens (logprobs in order, none lost or repeated)
 * and RT_DELIVER_MAX_TEXT bytes cut on a UTF-8 character boundary; a
 * blocked client stops deliveries at once; a final delivery that meets a
 * blocked client is held (nothing sent, the request kept) and goes out,
 * after the rest, on rt_req_resume(), which then frees the request; a
 * held request that is cancelled is freed without any delivery; an
 * unblocked client sees the usual one delivery per call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/tok/tok_tokenizer.h"
#include "router/core/rt_server_internal.h"
#include "tests/support/tt_support.h"

static struct tok_tokenizer tok;

/* What the sink saw. */
static struct {
    int calls;
    int blocked_after;      /* blocked once calls reach it; -1: never */
    size_t max_lp, max_text;
    int32_t next_token;     /* index of the next logprob expected */
    char *text;             /* everything delivered */
    size_t text_len;
    enum rt_finish fin;
    int fins;
    const int32_t *ids;     /* the ids pushed, to check the logprobs */
} seen;

static void sink_deliver(struct rt_req *r, const char *text, size_t len,
                         const struct rt_token_logprob *lps, size_t n_lp,
                         enum rt_finish fin, const char *error)
{
    (void)r;
    (void)error;
    seen.calls++;
    if (n_lp > seen.max_lp)
        seen.max_lp = n_lp;
    if (len > seen.max_text)
        seen.max_text = len;
    for (size_t i = 0; i < n_lp; i++) {
        assert_int_equal(lps[i].id, seen.ids[seen.next_token]);
        assert_int_equal(lps[i].n_top, 2);
        assert_int_equal(lps[i].top[1].id, seen.ids[seen.next_token] + 1);
        seen.next_token++;
    }
    seen.text = realloc(seen.text, seen.text_len + len + 1);
    memcpy(seen.text + seen.text_len, text, len);
    seen.text_len += len;
    seen.text[seen.text_len] = '\0';
    if (fin != RT_FINISH_NONE) {
        seen.fin = fin;
        seen.fins++;
    }
}

static const struct rt_sink sink = {sink_deliver, NULL};

static int sink_blocked(struct rt_req *r)
{
    (void)r;
    return seen.blocked_after >= 0 && seen.calls >= seen.blocked_after;
}

static int setup(void **state)
{
    (void)state;
    char path[4096];
    tt_data_path("tokenizers/qwen3/tokenizer.json", path, sizeof(path));
    char err[512];
    int rc = tok_tokenizer_load(&tok, path, err, sizeof(err));
    if (rc != 0)
        fprintf(stderr, "test_server_deliver: %s: %s\n", path, err);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    tok_tokenizer_free(&tok);
    return 0;
}

/* A request as rt_req_submit leaves it, with room for `cap` tokens and
 * two alternatives each when `logprobs`. */
static struct rt_req *new_req(struct rt_server *s, int cap, int logprobs)
{
    memset(&seen, 0, sizeof(seen));
    seen.blocked_after = -1;
    struct rt_req *r = rt_req_new(s, &sink, NULL);
    assert_non_null(r);
    assert_int_equal(rt_text_init(&r->core->text, &tok, NULL, 0), 0);
    r->blocked = sink_blocked;
    r->q.opts.logprobs = logprobs ? 2 : -1;
    r->core->n_top = logprobs ? 2 : 0;
    r->core->cap_out = cap;
    r->core->out_ids = malloc((size_t)cap * sizeof(int32_t));
    r->core->out_lps = malloc((size_t)cap * sizeof(float));
    r->core->lp_scratch = calloc((size_t)cap, sizeof(*r->core->lp_scratch));
    r->core->out_top_ids = malloc(((size_t)cap * r->core->n_top + 1) *
                                  sizeof(int32_t));
    r->core->out_top_lps = malloc(((size_t)cap * r->core->n_top + 1) *
                                  sizeof(float));
    r->core->top_scratch = calloc((size_t)cap * r->core->n_top + 1,
                                  sizeof(*r->core->top_scratch));
    assert_true(r->core->out_ids && r->core->out_lps && r->core->lp_scratch &&
                r->core->out_top_ids && r->core->out_top_lps &&
                r->core->top_scratch);
    return r;
}

/* Samples the ids of `text` into r as the step loop does. */
static void push_text(struct rt_req *r, const char *text)
{
    struct tok_ids ids = {0};
    assert_int_equal(
        tok_encode(&tok, NULL, text, strlen(text), 0, &ids, NULL, 0), 0);
    assert_true(r->n_out + (int32_t)ids.n <= r->core->cap_out);
    for (size_t i = 0; i < ids.n; i++) {
        int32_t t = ids.v[i];
        r->core->out_ids[r->n_out] = t;
        r->core->out_lps[r->n_out] = -0.5f;
        for (int k = 0; k < r->core->n_top; k++) {
            r->core->out_top_ids[(size_t)r->n_out * r->core->n_top + k] = t + k;
            r->core->out_top_lps[(size_t)r->n_out * r->core->n_top + k] =
                -0.5f - k;
        }
        r->n_out++;
        int hit = 0;
        assert_int_equal(rt_text_push(&r->core->text, t, &hit), 0);
    }
    tok_ids_free(&ids);
    seen.ids = r->core->out_ids;
}

/* A long stretch of words (about `words` tokens). */
static char *words(int n)
{
    char *s = malloc((size_t)n * 8 + 1);
    size_t k = 0;
    for (int i = 0; i < n; i++)
        k += (size_t)sprintf(s + k, " w%d", i % 97);
    return s;
}

static void test_pieces_and_hold(void **state)
{
    (void)state;
    static struct rt_server s;
    memset(&s, 0, sizeof(s));
    struct rt_req *r = new_req(&s, 4096, 1);
    char *a = words(300);
    push_text(r, a);
    int32_t n1 = r->n_out;
    assert_true(n1 > 3 * RT_DELIVER_MAX_TOKENS);
    /* Not blocked: the backlog goes out in pieces of at most 64 tokens. */
    rt_req_deliver(r, RT_FINISH_NONE, NULL);
    assert_int_equal(seen.calls, (n1 + RT_DELIVER_MAX_TOKENS - 1) /
                                     RT_DELIVER_MAX_TOKENS);
    assert_int_equal(seen.max_lp, RT_DELIVER_MAX_TOKENS);
    assert_int_equal(seen.next_token, n1);
    assert_string_equal(seen.text, a);
    /* Nothing new: no call. */
    rt_req_deliver(r, RT_FINISH_NONE, NULL);
    assert_int_equal(seen.calls, (n1 + RT_DELIVER_MAX_TOKENS - 1) /
                                     RT_DELIVER_MAX_TOKENS);

    /* Blocked after two more pieces: the rest stays in the request. */
    char *b = words(400);
    push_text(r, b);
    int32_t n2 = r->n_out;
    int calls0 = seen.calls;
    seen.blocked_after = calls0 + 2;
    rt_req_deliver(r, RT_FINISH_NONE, NULL);
    assert_int_equal(seen.calls, calls0 + 2);
    assert_int_equal(seen.next_token, n1 + 2 * RT_DELIVER_MAX_TOKENS);
    /* The request ends while blocked: the final delivery is held. */
    assert_int_equal(rt_text_finish(&r->core->text), 0);
    rt_req_deliver(r, RT_FINISH_LENGTH, NULL);
    assert_int_equal(seen.calls, calls0 + 2);
    assert_true(r->core->holding);
    assert_false(r->core->done);
    assert_int_equal(s.n_reqs, 1);
    /* Later calls do nothing while it is held. */
    rt_req_deliver(r, RT_FINISH_NONE, NULL);
    assert_int_equal(seen.calls, calls0 + 2);
    /* Drained a little: two more pieces, then held again. */
    seen.blocked_after = calls0 + 4;
    rt_req_resume(r);
    assert_int_equal(seen.calls, calls0 + 4);
    assert_int_equal(seen.fins, 0);
    assert_true(r->core->holding);
    /* Drained: the rest, then the final delivery; the request is freed. */
    seen.blocked_after = -1;
    rt_req_resume(r);
    assert_int_equal(seen.fins, 1);
    assert_int_equal(seen.fin, RT_FINISH_LENGTH);
    assert_int_equal(seen.next_token, n2);
    assert_int_equal(s.n_reqs, 0);
    assert_null(s.reqs);
    size_t la = strlen(a), lb = strlen(b);
    assert_int_equal(seen.text_len, la + lb);
    assert_memory_equal(seen.text, a, la);
    assert_memory_equal(seen.text + la, b, lb);
    assert_int_equal(seen.max_lp, RT_DELIVER_MAX_TOKENS);
    free(a);
    free(b);
    free(seen.text);
}

/* Every token's logprobs arrive exactly once, in order, across holds. */
static void test_tokens_complete(void **state)
{
    (void)state;
    static struct rt_server s;
    memset(&s, 0, sizeof(s));
    struct rt_req *r = new_req(&s, 4096, 1);
    char *a = words(500);
    seen.blocked_after = 1;
    push_text(r, a);
    int32_t n = r->n_out;
    rt_req_deliver(r, RT_FINISH_NONE, NULL);
    assert_int_equal(rt_text_finish(&r->core->text), 0);
    rt_req_deliver(r, RT_FINISH_STOP, NULL);
    assert_true(r->core->holding);
    for (int i = 0; i < 100 && s.n_reqs; i++) {
        seen.blocked_after = seen.calls + 1; /* one piece per drain */
        rt_req_resume(r);
    }
    assert_int_equal(s.n_reqs, 0);
    assert_int_equal(seen.next_token, n);
    assert_int_equal(seen.fins, 1);
    assert_int_equal(seen.fin, RT_FINISH_STOP);
    assert_string_equal(seen.text, a);
    free(a);
    free(seen.text);
}

/* Text alone: pieces of at most 64 KiB, never splitting a character. */
static void test_text_pieces(void **state)
{
    (void)state;
    static struct rt_server s;
    memset(&s, 0, sizeof(s));
    /* 3-byte characters, so a cut at 65536 would fall inside one. */
    size_t n = 30000;
    char *t = malloc(n * 3 + 1);
    for (size_t i = 0; i < n; i++)
        memcpy(t + 3 * i, "\xe6\x97\xa5", 3); /* U+65E5 */
    t[n * 3] = '\0';
    struct tok_ids ids = {0};
    assert_int_equal(tok_encode(&tok, NULL, t, strlen(t), 0, &ids, NULL, 0),
                     0);
    struct rt_req *r = new_req(&s, (int)ids.n + 16, 0);
    tok_ids_free(&ids);
    push_text(r, t);
    rt_req_deliver(r, RT_FINISH_NONE, NULL);
    assert_int_equal(seen.calls, 2);
    assert_true(seen.max_text <= RT_DELIVER_MAX_TEXT);
    assert_int_equal(seen.max_text % 3, 0); /* whole characters */
    assert_int_equal(seen.text_len, 3 * n);
    assert_memory_equal(seen.text, t, 3 * n);
    /* A cancelled held request goes without a delivery. There is no loop
     * here: stopping keeps the step pump off. */
    s.stopping = 1;
    push_text(r, "and the end");
    assert_int_equal(rt_text_finish(&r->core->text), 0);
    seen.blocked_after = seen.calls;
    rt_req_deliver(r, RT_FINISH_STOP, NULL);
    assert_true(r->core->holding);
    int calls = seen.calls;
    rt_req_cancel(r);
    assert_int_equal(seen.calls, calls);
    assert_int_equal(s.n_reqs, 0);
    free(t);
    free(seen.text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_and_hold),
        cmocka_unit_test(test_tokens_complete),
        cmocka_unit_test(test_text_pieces),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
