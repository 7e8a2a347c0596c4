/* test_gw_grammar.c — rank 0's structured-output state per slot
 * (gpu_worker/gw_grammar.h) over the Qwen3 tokenizer of the project's data
 * folder, with a logits row wider than the vocabulary (as Qwen3's 151,936):
 *   - a json_object slot: its first mask allows "{" and whitespace, not
 *     "}" or EOS; after "{}" only whitespace and EOS; after EOS, EOS again;
 *     the bits past the tokenizer's ids are 0;
 *   - replay: a slot started with tokens already generated masks exactly as
 *     a slot that accepted them one by one; a replayed token the grammar
 *     rejects fails that slot alone, with the reason;
 *   - a spec that does not compile fails its slot (NULL mask, the reason
 *     kept); another slot is unaffected; clear and restart reuse the slot;
 *   - statistics: masks computed by gw_grammar_prepare are not waits, a
 *     stale mask a draw needs is one;
 *   - a slot cleared while its grammar is still compiling on the pool
 *     (a request aborted at once), and a free with compiles in flight,
 *     leak nothing and crash nothing (ASan);
 *   - the compile pool: jobs start in FIFO order, at most GW_GRAMMAR_POOL
 *     at once; a job whose slot was cleared before it started never runs;
 *     past GW_GRAMMAR_QUEUE waiting jobs a start fails with the reason;
 *     identical specs in flight compile once;
 *   - the vocabulary is loaded on the pool: a start returns before it is
 *     loaded, the draw waits for it (a compile wait); a failed load fails
 *     the constrained slots, the first at its draw, later ones at start.
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"
#include "common/grammar/gm_spec.h"
#include "common/tok/tok_tokenizer.h"
#include <jansson.h>
#include "gpu_worker/gw_grammar.h"
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
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 4), 0);
    char *spec = json_object_spec();
    assert_int_equal(gw_grammar_slot_start(&g, 2, spec, strlen(spec), NULL, 0),
                     0);
    assert_null(gw_grammar_slot_error(&g, 2));
    assert_null(gw_grammar_slot_mask(&g, 1)); /* unconstrained */
    int32_t open = id_of("{"), close = id_of("}"), sp = id_of("Ġ");
    int32_t eos = g.v.eos[0];
    const uint32_t *m = gw_grammar_slot_mask(&g, 2);
    assert_non_null(m);
    assert_true(bit(m, open) && bit(m, sp));
    assert_false(bit(m, close) || bit(m, eos));
    for (int32_t id = g.v.n_ids; id < ROW; id++)
        assert_false(bit(m, id));
    assert_int_equal(g.st.waits, 1); /* computed when the draw needed it */
    assert_int_equal(gw_grammar_slot_accept(&g, 2, open), 0);
    gw_grammar_prepare(&g); /* after the step: not a wait */
    assert_int_equal(g.st.masks, 2);
    assert_int_equal(g.st.waits, 1);
    assert_int_equal(gw_grammar_slot_accept(&g, 2, close), 0);
    m = gw_grammar_slot_mask(&g, 2);
    assert_true(bit(m, eos) && bit(m, sp));
    assert_false(bit(m, open) || bit(m, close));
    assert_int_equal(gw_grammar_slot_accept(&g, 2, eos), 0);
    m = gw_grammar_slot_mask(&g, 2); /* after EOS: EOS only */
    assert_true(bit(m, eos));
    assert_false(bit(m, sp));
    assert_int_equal(gw_grammar_slot_accept(&g, 2, eos), 0);
    /* A token the grammar rejects (the mask was not applied): the slot
     * fails with the reason. */
    assert_int_equal(gw_grammar_slot_start(&g, 2, spec, strlen(spec), NULL, 0),
                     0);
    assert_int_equal(gw_grammar_slot_accept(&g, 2, close), TG_EINVAL);
    assert_non_null(gw_grammar_slot_error(&g, 2));
    assert_null(gw_grammar_slot_mask(&g, 2));
    gw_grammar_slot_clear(&g, 2);
    assert_null(gw_grammar_slot_error(&g, 2));
    free(spec);
    gw_grammar_free(&g);
}

static void test_replay(void **state)
{
    (void)state;
    static struct gw_grammar g;
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 3), 0);
    char *spec = json_object_spec();
    const char *text[] = {"{\"", "a", "\":", "Ġ[", "1", ","};
    uint32_t ids[6];
    for (int i = 0; i < 6; i++)
        ids[i] = (uint32_t)id_of(text[i]);
    assert_int_equal(gw_grammar_slot_start(&g, 0, spec, strlen(spec), NULL, 0),
                     0);
    for (int i = 0; i < 6; i++) {
        assert_non_null(gw_grammar_slot_mask(&g, 0));
        assert_int_equal(gw_grammar_slot_accept(&g, 0, (int32_t)ids[i]), 0);
    }
    assert_int_equal(gw_grammar_slot_start(&g, 1, spec, strlen(spec), ids, 6),
                     0);
    const uint32_t *a = gw_grammar_slot_mask(&g, 0);
    const uint32_t *b = gw_grammar_slot_mask(&g, 1);
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(a, b, g.words * sizeof(uint32_t));
    /* A replay the grammar rejects fails that slot alone. */
    uint32_t bad[2] = {(uint32_t)id_of("{"), (uint32_t)id_of("{")};
    assert_int_equal(gw_grammar_slot_start(&g, 2, spec, strlen(spec), bad, 2),
                     0);
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
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 2), 0);
    const char *bad = "{\"type\": \"json_schema\", \"schema\": {\"type\": "
                      "\"string\", \"pattern\": \"a\"}}";
    /* The compile runs on a helper thread: the failure shows when the
     * draw asks. */
    assert_int_equal(gw_grammar_slot_start(&g, 0, bad, strlen(bad), NULL, 0),
                     0);
    const char *why = gw_grammar_slot_error(&g, 0);
    assert_non_null(why);
    assert_non_null(strstr(why, "pattern"));
    assert_null(gw_grammar_slot_mask(&g, 0));
    assert_int_equal(gw_grammar_slot_accept(&g, 0, 5), 0); /* no-op */
    /* The same slot serves a good spec afterwards; the other never saw
     * the failure. */
    char *spec = json_object_spec();
    assert_null(gw_grammar_slot_error(&g, 1));
    assert_int_equal(gw_grammar_slot_start(&g, 0, spec, strlen(spec), NULL, 0),
                     0);
    assert_null(gw_grammar_slot_error(&g, 0));
    assert_non_null(gw_grammar_slot_mask(&g, 0));
    free(spec);
    gw_grammar_free(&g);
}

/* A model directory without a tokenizer: every constrained slot fails
 * with the reason, nothing else breaks. The load runs on the pool: the
 * first start returns, its draw sees the failure; later starts fail at
 * once. */
static void test_no_vocabulary(void **state)
{
    (void)state;
    static struct gw_grammar g;
    assert_int_equal(gw_grammar_init(&g, "/nonexistent/model", ROW, 2), 0);
    char *spec = json_object_spec();
    assert_int_equal(gw_grammar_slot_start(&g, 0, spec, strlen(spec), NULL, 0),
                     0);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 0), "vocabulary"));
    assert_null(gw_grammar_slot_mask(&g, 0));
    assert_int_equal(gw_grammar_slot_start(&g, 1, spec, strlen(spec), NULL, 0),
                     TG_EINVAL);
    assert_non_null(strstr(gw_grammar_slot_error(&g, 1), "vocabulary"));
    free(spec);
    gw_grammar_free(&g);
}

/* The slots whose jobs the pool took, in order, and the most running at
 * once (written under the pool's lock by the hook). */
struct taken {
    uint32_t slot[64];
    int n, running_max;
};

static void on_job(void *arg, uint32_t slot, int running)
{
    struct taken *t = arg;
    if (t->n < 64)
        t->slot[t->n++] = slot;
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

/* Six distinct schemas queued while the pool is held, one slot cleared
 * before its job starts: the others start oldest first, at most
 * GW_GRAMMAR_POOL at once, the cleared one never; the starts returned
 * before the vocabulary was loaded and the first draw waited for it. */
static void test_pool_fifo_bound_cancel(void **state)
{
    (void)state;
    static struct gw_grammar g;
    static struct taken t;
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 6), 0);
    g.on_job = on_job;
    g.on_job_arg = &t;
    gw_grammar_hold(&g, 1);
    char spec[256];
    for (int i = 0; i < 6; i++) {
        int n = schema_spec(spec, sizeof(spec), i);
        assert_int_equal(
            gw_grammar_slot_start(&g, (uint32_t)i, spec, (size_t)n, NULL, 0),
            0);
    }
    assert_int_equal(g.loaded, 0); /* the starts did not load it */
    assert_int_equal(g.queued, 6);
    gw_grammar_slot_clear(&g, 2);
    assert_int_equal(g.st.cancelled, 1);
    assert_int_equal(g.queued, 5);
    gw_grammar_hold(&g, 0);
    for (int i = 0; i < 6; i++) {
        if (i == 2)
            continue;
        assert_null(gw_grammar_slot_error(&g, (uint32_t)i));
        assert_non_null(gw_grammar_slot_mask(&g, (uint32_t)i));
    }
    assert_int_equal(g.loaded, 1);
    /* Slot 0's draw, at least: released, the pool needs ~1 s of CPU for
     * the vocabulary before its job is done, the main thread microseconds
     * to reach the draw (not a wall-clock bound: an ordering of 10^4). */
    assert_true(g.st.compile_waits >= 1);
    assert_int_equal(g.st.compiles, 5);
    assert_int_equal(t.n, 5);
    const uint32_t order[5] = {0, 1, 3, 4, 5};
    for (int i = 0; i < 5; i++)
        assert_int_equal(t.slot[i], order[i]);
    assert_true(t.running_max >= 1 && t.running_max <= GW_GRAMMAR_POOL);
    struct gm_cache_stats cs;
    gm_cache_stats(&g.cache, &cs);
    assert_int_equal(cs.misses, 5); /* the cleared one was never compiled */
    gw_grammar_free(&g);
}

/* GW_GRAMMAR_QUEUE jobs waiting: one more start fails with the reason,
 * nothing else does; a cancelled job frees its place; the identical specs
 * compile once. */
static void test_queue_limit(void **state)
{
    (void)state;
    static struct gw_grammar g;
    const int q = GW_GRAMMAR_QUEUE;
    assert_int_equal(gw_grammar_init(&g, dir, ROW, q + 1), 0);
    gw_grammar_hold(&g, 1);
    char *spec = json_object_spec();
    for (int i = 0; i < q; i++)
        assert_int_equal(
            gw_grammar_slot_start(&g, (uint32_t)i, spec, strlen(spec), NULL, 0),
            0);
    assert_int_equal(
        gw_grammar_slot_start(&g, (uint32_t)q, spec, strlen(spec), NULL, 0),
        TG_EBUSY);
    assert_non_null(strstr(gw_grammar_slot_error(&g, (uint32_t)q), "too many"));
    assert_null(gw_grammar_slot_mask(&g, (uint32_t)q));
    assert_int_equal(g.st.rejected, 1);
    gw_grammar_slot_clear(&g, 0);
    assert_int_equal(
        gw_grammar_slot_start(&g, (uint32_t)q, spec, strlen(spec), NULL, 0), 0);
    gw_grammar_hold(&g, 0);
    for (int i = 1; i <= q; i++)
        assert_non_null(gw_grammar_slot_mask(&g, (uint32_t)i));
    struct gm_cache_stats cs;
    gm_cache_stats(&g.cache, &cs);
    assert_int_equal(cs.misses, 1);
    free(spec);
    gw_grammar_free(&g);
}

/* The worker's start-up: the vocabulary is queued first; a start while it
 * waits returns at once and the draw waits for both. A free with the
 * load still queued drops it (ASan: no leak). */
static void test_preload(void **state)
{
    (void)state;
    static struct gw_grammar g;
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 1), 0);
    gw_grammar_hold(&g, 1);
    assert_int_equal(gw_grammar_preload(&g), 0);
    char *spec = json_object_spec();
    assert_int_equal(gw_grammar_slot_start(&g, 0, spec, strlen(spec), NULL, 0),
                     0);
    assert_int_equal(g.loaded, 0);
    gw_grammar_hold(&g, 0);
    assert_non_null(gw_grammar_slot_mask(&g, 0));
    assert_int_equal(g.st.compile_waits, 1); /* as above */
    gw_grammar_free(&g);
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 1), 0);
    gw_grammar_hold(&g, 1);
    assert_int_equal(gw_grammar_preload(&g), 0);
    gw_grammar_free(&g);
    free(spec);
}

/* Clears and frees while helper threads still compile distinct schemas
 * (each a first-seen compile of a few hundred ms at the Qwen3 vocabulary):
 * the jobs finish on their own, the free waits for the running ones. */
static void test_clear_while_compiling(void **state)
{
    (void)state;
    static struct gw_grammar g;
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 3), 0);
    char spec[256];
    for (int i = 0; i < 3; i++) {
        int n = snprintf(
            spec, sizeof(spec),
            "{\"type\": \"json_schema\", "
            "\"schema\": {\"type\": \"object\", \"properties\": "
            "{\"k%d\": {\"type\": \"string\", \"maxLength\": %d}}}}",
            i, 20 + i);
        assert_int_equal(
            gw_grammar_slot_start(&g, (uint32_t)i, spec, (size_t)n, NULL, 0),
            0);
    }
    gw_grammar_slot_clear(&g, 0);
    assert_null(gw_grammar_slot_mask(&g, 0));
    assert_non_null(gw_grammar_slot_mask(&g, 1)); /* waits for its grammar */
    gw_grammar_free(&g); /* slot 2 may still be compiling */
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
    struct gw_grammar g;
    assert_int_equal(gw_grammar_init(&g, dir, ROW, 4), 0);
    char *spec = triggered_spec(0);
    assert_int_equal(gw_grammar_slot_start(&g, 0, spec, strlen(spec), NULL, 0),
                     0);
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
    assert_int_equal(gw_grammar_slot_start(&g, 1, spec, strlen(spec),
                                           (const uint32_t *)ids.v,
                                           call_at + 1),
                     0);
    const uint32_t *m = gw_grammar_slot_mask(&g, 1);
    assert_non_null(m); /* replayed into the call */
    assert_false(bit(m, id_of("}")));
    /* A second call after text is constrained again (replayed whole). */
    encode(" Now <tool_", &ids);
    encode("call>\n{\"name\": \"get_weather\", \"arguments\": {", &ids);
    assert_int_equal(gw_grammar_slot_start(&g, 2, spec, strlen(spec),
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
    assert_int_equal(gw_grammar_slot_start(&g, 3, spec, strlen(spec), NULL, 0),
                     0);
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
    ids.n = 0;
    encode("Sure {", &ids);
    assert_int_equal(gw_grammar_slot_start(&g, 0, spec, strlen(spec), NULL, 0),
                     0);
    memset(want, 'f', ids.n);
    run(&g, 0, ids.v, ids.n, want);
    ids.n = 0;
    encode(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"A\"}}",
           &ids);
    assert_int_equal(gw_grammar_slot_start(&g, 1, spec, strlen(spec), NULL, 0),
                     0);
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
        cmocka_unit_test(test_bad_spec),
        cmocka_unit_test(test_no_vocabulary),
        cmocka_unit_test(test_clear_while_compiling),
        cmocka_unit_test(test_pool_fifo_bound_cancel),
        cmocka_unit_test(test_queue_limit),
        cmocka_unit_test(test_preload),
        cmocka_unit_test(test_triggered),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
