/* test_gw_grammar.c — rank 0's structured-output state (gpu_worker/
 * gw_grammar.h) over the Qwen3 tokenizer of the project's data folder,
 * with a logits row wider than the vocabulary (as Qwen3's 151,936):
 *   - a json_object slot: its first mask allows "{" and whitespace, not
 *     "}" or EOS; after "{}" only whitespace and EOS; after EOS, EOS again;
 *     the bits past the tokenizer's ids are 0;
 *   - replay: a slot started with tokens already generated masks exactly as
 *     a slot that accepted them one by one; a replayed token the grammar
 *     rejects fails that slot alone, with the reason;
 *   - a spec that does not compile: its prepare is reported failed with
 *     the reason and is not pinned; a slot naming it fails alone;
 *   - statistics: masks computed by gw_grammar_prepare are not waits, a
 *     stale mask a draw needs is one;
 *   - prepares never block a step: with the pool held (a compile that
 *     never ends), a slot of a ready pin starts, masks, accepts and
 *     prepares its masks; a slot naming the pin still compiling, or an
 *     unknown pin, fails alone at once (a protocol error, never a wait);
 *     no outcome comes out for the held pin until the pool runs it;
 *   - releases: a slot keeps its matcher after its pin is released; a
 *     pin released while queued is never compiled or reported, one
 *     released after its fetch ended is not reported; a second prepare
 *     of a held id is refused;
 *   - the compile pool: jobs start in FIFO order, at most GW_GRAMMAR_POOL
 *     at once; a job whose pin was released before it started never runs;
 *     past GW_GRAMMAR_QUEUE waiting jobs a prepare is refused at once
 *     (busy) with the reason; identical specs in flight compile once;
 *   - the vocabulary is loaded on the pool: a prepare returns before it
 *     is loaded; a failed load fails the prepares with the reason, the
 *     first after its fetch, later ones at once;
 *   - every prepare's outcome comes out exactly once;
 *   - a triggered spec (strict tools under "auto"): free text has no
 *     mask; the trigger (split over tokens, or one token after text)
 *     starts the mask at the next draw, which then holds a call to its
 *     schema; after the call the slot is free again and a second call is
 *     constrained again; a replay lands in the same state; a token with
 *     bytes after the trigger that the grammar rejects fails the slot
 *     with the reason; anchored (Llama-3 JSON) holds to the end.
 * Runs under ASan in CI's sanitizer build (the matchers' lifetimes).
 * Each test's gw_grammar (and hook record) is static: a failed assertion
 * leaves that test's pool threads running on it, so no later test may
 * reuse its memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_spec.h"
#include "common/tok/tok_tokenizer.h"
#include <jansson.h>
#include "gpu_worker/serve/gw_grammar.h"
#include "tests/support/tt_support.h"

#define ROW 151936 /* Qwen3's logits row: wider than its 151,669 ids */

static struct tok_tokenizer tok;
static char dir[512];

static int setup(void **state)
{
    (void)state;
    tt_data_path("tokenizers/qwen3", dir, sizeof(dir));
    char err[256];
    if (tok_tokenizer_load(&tok, dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "cannot load %s: %s\n", dir, err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tok_tokenizer_free(&tok);
    return 0;
}

static int32_t id_of(const char *s)
{
    int32_t id = tok_token_to_id(&tok, s, strlen(s));
    assert_true(id >= 0);
    return id;
}

static int bit(const uint32_t *m, int32_t id)
{
    return (m[id >> 5] >> (id & 31)) & 1u;
}

/* Every outcome taken so far, by prepare id (the tests use ids < 512). */
static struct {
    int have;
    struct gw_gready r;
} got[512];

static void got_reset(void)
{
    memset(got, 0, sizeof(got));
}

/* Takes every outcome ready now; each id must come out once at most. */
static void collect(struct gw_grammar *g)
{
    struct gw_gready out[8];
    size_t n;
    do {
        n = gw_grammar_take_ready(g, out, 8);
        for (size_t i = 0; i < n; i++) {
            assert_true(out[i].id < 512);
            if (got[out[i].id].have)
                fail_msg("prepare %llu reported twice",
                         (unsigned long long)out[i].id);
            got[out[i].id].have = 1;
            got[out[i].id].r = out[i];
        }
    } while (n == 8);
}

/* The outcome of prepare `id`, polling the pool's eventfd as the worker's
 * loop does. Bound: 300 s, for compiles of under a second each on a
 * loaded 2-core machine (a hang is the failure it catches). */
static const struct gw_gready *wait_for(struct gw_grammar *g, uint64_t id)
{
    time_t end = time(NULL) + 300;
    while (!got[id].have) {
        collect(g);
        if (got[id].have)
            break;
        if (time(NULL) > end)
            fail_msg("no outcome of prepare %llu", (unsigned long long)id);
        struct pollfd pfd = {.fd = gw_grammar_fd(g), .events = POLLIN};
        (void)poll(&pfd, 1, 1000);
    }
    return &got[id].r;
}

/* Prepares spec under id and waits until it is pinned. */
static void pin_ready(struct gw_grammar *g, uint64_t id, const char *spec)
{
    gw_grammar_pin(g, id, spec, strlen(spec));
    const struct gw_gready *r = wait_for(g, id);
    if (!r->ok)
        fail_msg("prepare %llu failed: %s", (unsigned long long)id, r->error);
}

static char *json_object_spec(void)
{
    char *spec = NULL;
    size_t len = 0;
    assert_int_equal(gm_spec_json(1, &spec, &len), 0);
    return spec;
}

static void test_json_object_slot(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 4, 0), 0);
    char *spec = json_object_spec();
    pin_ready(&g, 1, spec);
    assert_int_equal(gw_grammar_pins(&g), 1);
    assert_int_equal(
        gw_grammar_slot_start(&g, 2, 1, spec, strlen(spec), NULL, 0), 0);
    assert_null(gw_grammar_slot_error(&g, 2));
    assert_null(gw_grammar_slot_mask(&g, 1)); /* unconstrained */
    int32_t open = id_of("{"), close = id_of("}"), sp = id_of("Ġ");
    int32_t eos = g.v.eos[0];
    const uint32_t *m = gw_grammar_slot_mask(&g, 2);
    assert_non_null(m);
    /* compact JSON (the default policy): no space before the document */
    assert_true(bit(m, open));
    assert_false(bit(m, close) || bit(m, eos) || bit(m, sp));
    for (int32_t id = g.v.n_ids; id < ROW; id++)
        assert_false(bit(m, id));
    assert_int_equal(g.st.waits, 1); /* computed when the draw needed it */
    assert_int_equal(gw_grammar_slot_accept(&g, 2, open), 0);
    gw_grammar_prepare(&g); /* after the step: not a wait */
    assert_int_equal(g.st.masks, 2);
    assert_int_equal(g.st.waits, 1);
    assert_int_equal(gw_grammar_slot_accept(&g, 2, close), 0);
    m = gw_grammar_slot_mask(&g, 2);
    assert_true(bit(m, eos));
    assert_false(bit(m, open) || bit(m, close) || bit(m, sp));
    assert_int_equal(gw_grammar_slot_accept(&g, 2, eos), 0);
    m = gw_grammar_slot_mask(&g, 2); /* after EOS: EOS only */
    assert_true(bit(m, eos));
    assert_false(bit(m, sp));
    assert_int_equal(gw_grammar_slot_accept(&g, 2, eos), 0);
    /* A token the grammar rejects (the mask was not applied): the slot
     * fails with the reason. One pin serves any number of starts. */
    assert_int_equal(
        gw_grammar_slot_start(&g, 2, 1, spec, strlen(spec), NULL, 0), 0);
    assert_int_equal(gw_grammar_slot_accept(&g, 2, close), TG_EINVAL);
    assert_non_null(gw_grammar_slot_error(&g, 2));
    assert_null(gw_grammar_slot_mask(&g, 2));
    gw_grammar_slot_clear(&g, 2);
    assert_null(gw_grammar_slot_error(&g, 2));
    /* The entry's spec text must be the pin's. */
    const char *other = "{\"type\": \"json_value\"}";
    assert_int_equal(
        gw_grammar_slot_start(&g, 3, 1, other, strlen(other), NULL, 0),
        TG_EPROTO);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 3), "another"));
    free(spec);
    gw_grammar_free(&g);
}

/* A slot whose matching work for one token is over its budget fails
 * alone with the reason; a slot of the same grammar under the budget goes
 * on. */
static void test_over_budget(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 4, 0), 0);
    assert_int_equal(g.token_work, GW_GRAMMAR_TOKEN_WORK);
    char *spec = json_object_spec();
    pin_ready(&g, 1, spec);
    for (uint32_t k = 0; k < 3; k++) {
        assert_int_equal(
            gw_grammar_slot_start(&g, k, 1, spec, strlen(spec), NULL, 0), 0);
        assert_non_null(gw_grammar_slot_mask(&g, k));
        assert_int_equal(gw_grammar_slot_accept(&g, k, id_of("{")), 0);
    }
    /* the slots' matchers have the worker's budget */
    assert_int_equal(g.slots[0].m.budget_work, GW_GRAMMAR_TOKEN_WORK);
    /* slot 1: a mask over its budget (after "{" a mask takes tens of
     * units) */
    gm_matcher_set_budget(&g.slots[1].m, 2, 0);
    assert_null(gw_grammar_slot_mask(&g, 1));
    const char *e = gw_grammar_slot_error(&g, 1);
    assert_non_null(e);
    assert_non_null(strstr(e, "budget"));
    assert_int_equal(g.st.over_budget, 1);
    /* slot 2: an accept over its budget */
    gm_matcher_set_budget(&g.slots[2].m, 1, 0);
    assert_int_equal(gw_grammar_slot_accept(&g, 2, id_of("}")), TG_EINVAL);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 2), "budget"));
    assert_int_equal(g.st.over_budget, 2);
    /* slot 0, the same grammar under its budget, goes on */
    const uint32_t *m = gw_grammar_slot_mask(&g, 0);
    assert_non_null(m);
    assert_true(bit(m, id_of("}")));
    assert_int_equal(gw_grammar_slot_accept(&g, 0, id_of("}")), 0);
    assert_null(gw_grammar_slot_error(&g, 0));
    /* a slot started later takes the worker's budget as it is then */
    g.token_work = 7;
    assert_int_equal(
        gw_grammar_slot_start(&g, 3, 1, spec, strlen(spec), NULL, 0), 0);
    assert_int_equal(g.slots[3].m.budget_work, 7);
    free(spec);
    gw_grammar_free(&g);
}

static void test_replay(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 3, 0), 0);
    char *spec = json_object_spec();
    pin_ready(&g, 7, spec);
    const char *text[] = {"{\"", "a", "\":", "Ġ[", "1", ","};
    uint32_t ids[6];
    for (int i = 0; i < 6; i++)
        ids[i] = (uint32_t)id_of(text[i]);
    assert_int_equal(
        gw_grammar_slot_start(&g, 0, 7, spec, strlen(spec), NULL, 0), 0);
    for (int i = 0; i < 6; i++) {
        assert_non_null(gw_grammar_slot_mask(&g, 0));
        assert_int_equal(gw_grammar_slot_accept(&g, 0, (int32_t)ids[i]), 0);
    }
    assert_int_equal(
        gw_grammar_slot_start(&g, 1, 7, spec, strlen(spec), ids, 6), 0);
    const uint32_t *a = gw_grammar_slot_mask(&g, 0);
    const uint32_t *b = gw_grammar_slot_mask(&g, 1);
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(a, b, g.words * sizeof(uint32_t));
    /* A replay the grammar rejects fails that slot alone. */
    uint32_t bad[2] = {(uint32_t)id_of("{"), (uint32_t)id_of("{")};
    assert_int_equal(
        gw_grammar_slot_start(&g, 2, 7, spec, strlen(spec), bad, 2), TG_EINVAL);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 2), "token 1"));
    assert_null(gw_grammar_slot_mask(&g, 2));
    assert_non_null(gw_grammar_slot_mask(&g, 1));
    free(spec);
    gw_grammar_free(&g);
}

static void test_bad_spec(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 2, 0), 0);
    const char *bad = "{\"type\": \"json_schema\", \"schema\": {\"type\": "
                      "\"string\", \"pattern\": \"(a\"}}";
    /* The compile runs on a pool thread: the failure is its outcome,
     * and the id is not pinned. */
    gw_grammar_pin(&g, 1, bad, strlen(bad));
    const struct gw_gready *r = wait_for(&g, 1);
    assert_false(r->ok);
    assert_false(r->busy);
    assert_non_null(strstr(r->error, "pattern"));
    assert_int_equal(gw_grammar_pins(&g), 0);
    assert_int_equal(g.st.failed, 1);
    /* A plan naming it anyway fails that slot alone, at once. */
    assert_int_equal(gw_grammar_slot_start(&g, 0, 1, bad, strlen(bad), NULL, 0),
                     TG_EPROTO);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 0), "not prepared"));
    assert_null(gw_grammar_slot_mask(&g, 0));
    assert_int_equal(gw_grammar_slot_accept(&g, 0, 5), 0); /* no-op */
    /* The same slot serves a good spec afterwards; the other never saw
     * the failure. */
    char *spec = json_object_spec();
    pin_ready(&g, 2, spec);
    assert_null(gw_grammar_slot_error(&g, 1));
    assert_int_equal(
        gw_grammar_slot_start(&g, 0, 2, spec, strlen(spec), NULL, 0), 0);
    assert_null(gw_grammar_slot_error(&g, 0));
    assert_non_null(gw_grammar_slot_mask(&g, 0));
    free(spec);
    gw_grammar_free(&g);
}

/* The compile's wall-time limit is the worker's (--grammar-compile-timeout,
 * set before the vocabulary loads): past it the prepare fails naming
 * the limit; nothing else changes. */
static void test_compile_limit(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 2, 0), 0);
    assert_true(g.compile_s == GM_LIMIT_COMPILE_S); /* the default */
    g.compile_s = 1e-6; /* any compile takes longer */
    const char *spec = "{\"type\": \"json_schema\", \"schema\": {\"type\": "
                       "\"string\", \"format\": \"email\"}}";
    gw_grammar_pin(&g, 1, spec, strlen(spec));
    const struct gw_gready *r = wait_for(&g, 1);
    assert_false(r->ok);
    assert_non_null(strstr(r->error, "time limit"));
    assert_int_equal(g.st.failed, 1);
    gw_grammar_free(&g);
}

/* A model directory without a tokenizer: every prepare fails with the
 * reason, nothing else breaks. The load runs on the pool: the first
 * prepare's outcome says so after its fetch, later ones at once. */
static void test_no_vocabulary(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, "/nonexistent/model", ROW, 2, 0), 0);
    char *spec = json_object_spec();
    gw_grammar_pin(&g, 1, spec, strlen(spec));
    const struct gw_gready *r = wait_for(&g, 1);
    assert_false(r->ok);
    assert_non_null(strstr(r->error, "vocabulary"));
    gw_grammar_pin(&g, 2, spec, strlen(spec));
    collect(&g); /* refused at once: no fetch */
    assert_true(got[2].have);
    assert_false(got[2].r.ok);
    assert_non_null(strstr(got[2].r.error, "vocabulary"));
    assert_int_equal(gw_grammar_pins(&g), 0);
    assert_int_equal(
        gw_grammar_slot_start(&g, 0, 2, spec, strlen(spec), NULL, 0),
        TG_EPROTO);
    free(spec);
    gw_grammar_free(&g);
}

/* The pins whose jobs the pool took, in order, and the most running at
 * once (written under the pool's lock by the hook). */
struct taken {
    uint64_t pin[64];
    int n, running_max;
};

static void on_job(void *arg, uint64_t pin, int running)
{
    struct taken *t = arg;
    if (t->n < 64)
        t->pin[t->n++] = pin;
    if (running > t->running_max)
        t->running_max = running;
}

static int schema_spec(char *spec, size_t cap, int i)
{
    return snprintf(spec, cap,
                    "{\"type\": \"json_schema\", "
                    "\"schema\": {\"type\": \"object\", \"properties\": "
                    "{\"p%d\": {\"type\": \"string\", \"maxLength\": %d}}}}",
                    i, 10 + i);
}

/* The step path while a compile never ends (the pool held): a ready pin's
 * slot runs every per-step call, a slot naming the held pin or an unknown
 * one fails alone at once. Before prepares existed, a slot's first draw
 * waited for its compile on the step thread: here that wait would never
 * end (ctest's timeout is the failure). */
static void test_prepare_never_blocks(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 4, 0), 0);
    char *spec = json_object_spec();
    pin_ready(&g, 1, spec);
    gw_grammar_hold(&g, 1);
    char slow[256];
    int n = schema_spec(slow, sizeof(slow), 40);
    gw_grammar_pin(&g, 2, slow, (size_t)n);
    assert_int_equal(g.queued, 1);
    assert_int_equal(gw_grammar_pins(&g), 2);
    /* Slot 0: a whole generation's calls while pin 2 cannot compile. */
    assert_int_equal(
        gw_grammar_slot_start(&g, 0, 1, spec, strlen(spec), NULL, 0), 0);
    const char *text[] = {"{\"", "a", "\":", "1", "}"};
    for (int i = 0; i < 5; i++) {
        const uint32_t *m = gw_grammar_slot_mask(&g, 0);
        assert_non_null(m);
        assert_true(bit(m, id_of(text[i])));
        assert_int_equal(gw_grammar_slot_accept(&g, 0, id_of(text[i])), 0);
        gw_grammar_prepare(&g);
    }
    /* Slot 1 names the pin still compiling, slot 2 one never prepared:
     * each fails alone, now. */
    assert_int_equal(gw_grammar_slot_start(&g, 1, 2, slow, (size_t)n, NULL, 0),
                     TG_EPROTO);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 1), "still compiling"));
    assert_null(gw_grammar_slot_mask(&g, 1));
    assert_int_equal(
        gw_grammar_slot_start(&g, 2, 99, spec, strlen(spec), NULL, 0),
        TG_EPROTO);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 2), "unknown"));
    assert_null(gw_grammar_slot_error(&g, 0));
    assert_non_null(gw_grammar_slot_mask(&g, 0));
    assert_int_equal(g.st.unpinned, 2);
    collect(&g);
    assert_false(got[2].have); /* held: nothing to report */
    gw_grammar_hold(&g, 0);
    assert_true(wait_for(&g, 2)->ok);
    assert_int_equal(gw_grammar_slot_start(&g, 1, 2, slow, (size_t)n, NULL, 0),
                     0);
    assert_non_null(gw_grammar_slot_mask(&g, 1));
    free(spec);
    gw_grammar_free(&g);
}

/* Releases: a started slot keeps its matcher; a pin released while
 * queued never runs and is never reported; one released after its fetch
 * ended but before its outcome was taken is not reported; unknown ids
 * are ignored; a held id cannot be prepared twice. */
static void test_release(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 2, 0), 0);
    char *spec = json_object_spec();
    pin_ready(&g, 1, spec);
    assert_int_equal(
        gw_grammar_slot_start(&g, 0, 1, spec, strlen(spec), NULL, 0), 0);
    gw_grammar_unpin(&g, 1);
    gw_grammar_unpin(&g, 1);  /* again: ignored */
    gw_grammar_unpin(&g, 77); /* never prepared: ignored */
    assert_int_equal(gw_grammar_pins(&g), 0);
    assert_non_null(gw_grammar_slot_mask(&g, 0)); /* its own reference */
    assert_int_equal(gw_grammar_slot_accept(&g, 0, id_of("{")), 0);
    gw_grammar_prepare(&g);
    assert_int_equal(
        gw_grammar_slot_start(&g, 1, 1, spec, strlen(spec), NULL, 0),
        TG_EPROTO);
    /* Released while queued. */
    gw_grammar_hold(&g, 1);
    char sp[256];
    int n = schema_spec(sp, sizeof(sp), 50);
    gw_grammar_pin(&g, 2, sp, (size_t)n);
    gw_grammar_unpin(&g, 2);
    assert_int_equal(g.st.cancelled, 1);
    assert_int_equal(g.queued, 0);
    gw_grammar_hold(&g, 0);
    /* Released after its fetch ended, before the outcome was taken. */
    gw_grammar_pin(&g, 3, spec, strlen(spec));
    struct pollfd pfd = {.fd = gw_grammar_fd(&g), .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 300000), 1); /* the fetch ended */
    gw_grammar_unpin(&g, 3);
    /* A held id prepared again: refused, the pin stays. */
    pin_ready(&g, 4, spec);
    gw_grammar_pin(&g, 4, spec, strlen(spec));
    got[4].have = 0;
    collect(&g);
    assert_true(got[4].have);
    assert_false(got[4].r.ok);
    assert_int_equal(gw_grammar_pins(&g), 1);
    assert_false(got[2].have || got[3].have);
    free(spec);
    gw_grammar_free(&g);
}

/* Six distinct schemas prepared while the pool is held, one released
 * before its job starts: the others start oldest first, at most
 * GW_GRAMMAR_POOL at once, the released one never; the prepares returned
 * before the vocabulary was loaded. */
static void test_pool_fifo_bound_cancel(void **state)
{
    (void)state;
    static struct gw_grammar g;
    static struct taken t;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 6, 0), 0);
    g.on_job = on_job;
    g.on_job_arg = &t;
    gw_grammar_hold(&g, 1);
    char spec[256];
    for (int i = 1; i <= 6; i++) {
        int n = schema_spec(spec, sizeof(spec), i);
        gw_grammar_pin(&g, (uint64_t)i, spec, (size_t)n);
    }
    assert_int_equal(g.loaded, 0); /* the prepares did not load it */
    assert_int_equal(g.queued, 6);
    gw_grammar_unpin(&g, 3);
    assert_int_equal(g.st.cancelled, 1);
    assert_int_equal(g.queued, 5);
    gw_grammar_hold(&g, 0);
    for (int i = 1; i <= 6; i++) {
        if (i == 3)
            continue;
        assert_true(wait_for(&g, (uint64_t)i)->ok);
        int n = schema_spec(spec, sizeof(spec), i);
        assert_int_equal(gw_grammar_slot_start(&g, (uint32_t)(i - 1),
                                               (uint64_t)i, spec, (size_t)n,
                                               NULL, 0),
                         0);
        assert_non_null(gw_grammar_slot_mask(&g, (uint32_t)(i - 1)));
    }
    assert_int_equal(g.loaded, 1);
    assert_false(got[3].have);
    assert_int_equal(g.st.fetched, 5);
    assert_int_equal(t.n, 5);
    const uint64_t order[5] = {1, 2, 4, 5, 6};
    for (int i = 0; i < 5; i++)
        assert_int_equal(t.pin[i], order[i]);
    assert_true(t.running_max >= 1 && t.running_max <= GW_GRAMMAR_POOL);
    struct gm_cache_stats cs;
    gm_cache_stats(&g.cache, &cs);
    assert_int_equal(cs.misses, 5); /* the released one was never compiled */
    gw_grammar_free(&g);
}

/* GW_GRAMMAR_QUEUE jobs waiting: one more prepare is refused at once
 * (busy) with the reason, nothing else is; a released job frees its
 * place; the identical specs compile once. */
static void test_queue_limit(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    const int q = GW_GRAMMAR_QUEUE;
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 2, 0), 0);
    gw_grammar_hold(&g, 1);
    char *spec = json_object_spec();
    for (int i = 1; i <= q; i++)
        gw_grammar_pin(&g, (uint64_t)i, spec, strlen(spec));
    gw_grammar_pin(&g, (uint64_t)q + 1, spec, strlen(spec));
    collect(&g);
    assert_true(got[q + 1].have);
    assert_false(got[q + 1].r.ok);
    assert_true(got[q + 1].r.busy);
    assert_non_null(strstr(got[q + 1].r.error, "too many"));
    assert_int_equal(g.st.rejected, 1);
    for (int i = 1; i <= q; i++)
        assert_false(got[i].have);
    gw_grammar_unpin(&g, 1);
    gw_grammar_pin(&g, (uint64_t)q + 2, spec, strlen(spec));
    gw_grammar_hold(&g, 0);
    for (int i = 2; i <= q + 2; i++)
        if (i != q + 1)
            assert_true(wait_for(&g, (uint64_t)i)->ok);
    struct gm_cache_stats cs;
    gm_cache_stats(&g.cache, &cs);
    assert_int_equal(cs.misses, 1);
    free(spec);
    gw_grammar_free(&g);
}

/* The worker's start-up: the vocabulary is queued first; a prepare while
 * it waits returns at once and is ready after both. A free with the load
 * still queued drops it (ASan: no leak). */
static void test_preload(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 1, 0), 0);
    gw_grammar_hold(&g, 1);
    assert_int_equal(gw_grammar_preload(&g), 0);
    char *spec = json_object_spec();
    gw_grammar_pin(&g, 1, spec, strlen(spec));
    assert_int_equal(g.loaded, 0);
    gw_grammar_hold(&g, 0);
    assert_true(wait_for(&g, 1)->ok);
    assert_int_equal(g.loaded, 1);
    gw_grammar_free(&g);
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 1, 0), 0);
    gw_grammar_hold(&g, 1);
    assert_int_equal(gw_grammar_preload(&g), 0);
    gw_grammar_pin(&g, 1, spec, strlen(spec)); /* queued at the free */
    gw_grammar_free(&g);
    free(spec);
}

/* Releases and a free while pool threads still compile distinct schemas
 * (each a first-seen compile of a few hundred ms at the Qwen3
 * vocabulary): the jobs finish on their own, the free waits for the
 * running ones. */
static void test_release_while_compiling(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 3, 0), 0);
    char spec[256];
    for (int i = 1; i <= 3; i++) {
        int n = snprintf(
            spec, sizeof(spec),
            "{\"type\": \"json_schema\", "
            "\"schema\": {\"type\": \"object\", \"properties\": "
            "{\"k%d\": {\"type\": \"string\", \"maxLength\": %d}}}}",
            i, 20 + i);
        gw_grammar_pin(&g, (uint64_t)i, spec, (size_t)n);
    }
    gw_grammar_unpin(&g, 1);
    assert_true(wait_for(&g, 2)->ok);
    gw_grammar_free(&g); /* 3 may still be compiling */
}

/* The ids of text in the Qwen3 tokenizer (appended to *out). */
static void encode(const char *text, struct tok_ids *out)
{
    char err[128];
    assert_int_equal(
        tok_encode(&tok, NULL, text, strlen(text), 0, out, err, sizeof err), 0);
}

static char *triggered_spec(int llama)
{
    json_t *params = json_loads(
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
        "\"string\"}},\"required\":[\"city\"],\"additionalProperties\":false}",
        0, NULL);
    struct gm_tool_fn fn = {"get_weather", params};
    char *inner, *spec;
    size_t ilen, len;
    assert_int_equal(
        gm_spec_tools(llama ? &GM_TOOL_LLAMA3_JSON : &GM_TOOL_HERMES, &fn, 1, 1,
                      llama ? 0 : 1, &inner, &ilen),
        0);
    assert_int_equal(gm_spec_triggered(llama ? "{" : "<tool_call>", llama,
                                       inner, ilen, &spec, &len),
                     0);
    free(inner);
    json_decref(params);
    return spec;
}

/* Accepts ids[0..n) into the slot, checking at each draw that the mask
 * is absent (free) or present and allowing the token (constrained), as
 * want[i] says ('f' or 'c'). */
static void run(struct gw_grammar *g, uint32_t slot, const int32_t *ids,
                size_t n, const char *want)
{
    for (size_t i = 0; i < n; i++) {
        const uint32_t *m = gw_grammar_slot_mask(g, slot);
        if (want[i] == 'f') {
            if (m != NULL)
                fail_msg("draw %zu: a mask in free text", i);
        } else {
            if (m == NULL)
                fail_msg("draw %zu: no mask in a call", i);
            if (!bit(m, ids[i]))
                fail_msg("draw %zu: token %d masked", i, (int)ids[i]);
        }
        assert_int_equal(gw_grammar_slot_accept(g, slot, ids[i]), 0);
    }
}

static void test_triggered(void **state)
{
    (void)state;
    static struct gw_grammar g;
    got_reset();
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 4, 0), 0);
    char *spec = triggered_spec(0);
    pin_ready(&g, 1, spec);
    assert_int_equal(
        gw_grammar_slot_start(&g, 0, 1, spec, strlen(spec), NULL, 0), 0);
    assert_null(gw_grammar_slot_error(&g, 0));
    struct tok_ids ids = {0};
    encode("Let me look.", &ids);
    ids.v[ids.n++] = id_of("<tool_call>"); /* an added normal token */
    size_t call_at = ids.n;
    encode("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
           "\"Oslo\"}}\n</tool_call>",
           &ids);
    size_t call_end = ids.n;
    encode(" Done.", &ids);
    char want[256];
    assert_true(ids.n < sizeof want);
    for (size_t i = 0; i < ids.n; i++)
        want[i] = i < call_at || i >= call_end ? 'f' : 'c';
    run(&g, 0, ids.v, ids.n, want);
    assert_null(gw_grammar_slot_mask(&g, 0)); /* free after the call */
    gw_grammar_prepare(&g); /* computes nothing for a free slot */
    /* In the call the wrong argument is masked: after
     * {"name": "get_weather", "arguments": {" only "city" continues. */
    gw_grammar_slot_clear(&g, 0);
    assert_int_equal(gw_grammar_slot_start(&g, 1, 1, spec, strlen(spec),
                                           (const uint32_t *)ids.v,
                                           call_at + 1),
                     0);
    const uint32_t *m = gw_grammar_slot_mask(&g, 1);
    assert_non_null(m); /* replayed into the call */
    assert_false(bit(m, id_of("}")));
    /* A second call after text is constrained again (replayed whole). */
    encode(" Now <tool_", &ids);
    encode("call>\n{\"name\": \"get_weather\", \"arguments\": {", &ids);
    assert_int_equal(gw_grammar_slot_start(&g, 2, 1, spec, strlen(spec),
                                           (const uint32_t *)ids.v, ids.n),
                     0);
    assert_null(gw_grammar_slot_error(&g, 2));
    m = gw_grammar_slot_mask(&g, 2);
    assert_non_null(m);
    assert_true(bit(m, id_of("\"")));
    assert_false(bit(m, id_of("}"))); /* "city" is required */
    /* Bytes after the trigger the grammar rejects, in the token that
     * completes it: the slot fails with the reason. */
    ids.n = 0;
    encode(" <tool_call", &ids);
    ids.v[ids.n++] = id_of(">{");
    assert_int_equal(
        gw_grammar_slot_start(&g, 3, 1, spec, strlen(spec), NULL, 0), 0);
    for (size_t i = 0; i + 1 < ids.n; i++)
        assert_int_equal(gw_grammar_slot_accept(&g, 3, ids.v[i]), 0);
    assert_int_equal(gw_grammar_slot_accept(&g, 3, ids.v[ids.n - 1]),
                     TG_EINVAL);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 3), "starts a tool call"));
    assert_null(gw_grammar_slot_mask(&g, 3));
    free(spec);

    /* Anchored (Llama-3 JSON): text first frees the whole output; "{"
     * first holds it to the end (more calls after "; ", then EOS). */
    spec = triggered_spec(1);
    pin_ready(&g, 2, spec);
    ids.n = 0;
    encode("Sure {", &ids);
    assert_int_equal(
        gw_grammar_slot_start(&g, 0, 2, spec, strlen(spec), NULL, 0), 0);
    memset(want, 'f', ids.n);
    run(&g, 0, ids.v, ids.n, want);
    ids.n = 0;
    encode(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"A\"}}",
           &ids);
    assert_int_equal(
        gw_grammar_slot_start(&g, 1, 2, spec, strlen(spec), NULL, 0), 0);
    for (size_t i = 0; i < ids.n; i++) {
        const uint32_t *mm = gw_grammar_slot_mask(&g, 1);
        if (i > 0)
            assert_non_null(mm); /* the first token holds the trigger */
        assert_int_equal(gw_grammar_slot_accept(&g, 1, ids.v[i]), 0);
    }
    m = gw_grammar_slot_mask(&g, 1);
    assert_non_null(m); /* still constrained: "; " or EOS */
    assert_true(bit(m, g.v.eos[0]));
    assert_false(bit(m, id_of("Sure")));
    free(spec);
    tok_ids_free(&ids);
    gw_grammar_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_object_slot),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_over_budget),
        cmocka_unit_test(test_bad_spec),
        cmocka_unit_test(test_no_vocabulary),
        cmocka_unit_test(test_prepare_never_blocks),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_release_while_compiling),
        cmocka_unit_test(test_pool_fifo_bound_cancel),
        cmocka_unit_test(test_queue_limit),
        cmocka_unit_test(test_preload),
        cmocka_unit_test(test_triggered),
        cmocka_unit_test(test_compile_limit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
