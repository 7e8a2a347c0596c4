/*
 * fuzz_grammar.c — the structured-output engine (common/grammar) on
 * untrusted constraints: a JSON Schema or a whole spec is compiled
 * (gm_spec_check and gm_spec_compile must agree), then a matcher is
 * driven by the rest of the input over a small vocabulary (the 256 bytes,
 * multi-byte pieces that cross JSON's rule boundaries, a special token,
 * EOS).
 *
 * Input: one mode byte, the constraint, a NUL, the drive bytes.
 *   mode bit 0: the constraint is a spec (gm_spec.h), else a JSON Schema
 *   mode bit 1: compact JSON (no whitespace)
 * Each drive byte b is a step: first the fast mask must equal the
 * brute-force one (gm_matcher_fill_mask_naive); then byte token b is
 * accepted exactly when the mask allows it; every 8th step also accepts
 * the mask's first allowed multi-byte piece (must succeed), rolls the
 * byte back (the mask before it returns) and accepts it again, copies the
 * matcher (the copy's mask is the same), or accepts EOS where the
 * document may end. EOS is allowed exactly where the document may end,
 * the special token never.
 * Limits are tight (20,000 automaton nodes, counts up to 32) so each
 * input stays fast.
 */
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "tests/fuzz/fz_util.h"
#include "tests/support/tt_grammar.h"

static const char *const pieces[] = {
    "true", "false", "null", "\":", "\": ", ", \"", "{\"", "\"}", "\"]",
    "}}", "]]", "[[", "{}", "[]", "},", "],", "\",", "\n  ", "  ", " \"",
    "12", "3.5", "e+", "-0", "ab", "\\u00", "\\n", "\xc3\xa9",
    "\xe6\x97\xa5", "\xf0\x9f\x98", "\x80", "\":\"", "1,", "1]", "1}",
    "<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>"};
#define N_PIECES (sizeof pieces / sizeof *pieces)
#define EOS_ID ((int32_t)(257 + N_PIECES))

static struct gm_vocab vocab;
static size_t W;

static int bit(const uint32_t *m, int32_t id)
{
    return (m[id >> 5] >> (id & 31)) & 1;
}

static void check_masks(struct gm_matcher *m, uint32_t *a, uint32_t *b)
{
    int ra = gm_matcher_fill_mask(m, a, W);
    int rb = gm_matcher_fill_mask_naive(m, b, W);
    if (ra != rb)
        fz_fail("fill_mask %d, naive %d", ra, rb);
    if (ra == 0 && memcmp(a, b, W * sizeof(*a)) != 0) {
        char diff[512];
        tt_mask_diff(&vocab, a, b, W, diff, sizeof diff);
        fz_fail("fast mask differs from the oracle: %s", diff);
    }
    if (ra == 0 && bit(a, EOS_ID) != gm_matcher_can_end(m))
        fz_fail("EOS allowed %d, can_end %d", bit(a, EOS_ID),
                gm_matcher_can_end(m));
    if (ra == 0 && bit(a, EOS_ID - 1))
        fz_fail("special token allowed");
}

static void drive(struct gm_grammar *g, const uint8_t *d, size_t n)
{
    uint32_t *a = malloc(W * sizeof(*a));
    uint32_t *b = malloc(W * sizeof(*b));
    if (a == NULL || b == NULL)
        fz_fail("out of memory");
    struct gm_matcher m;
    if (gm_matcher_init(&m, g) != 0)
        fz_fail("matcher init");
    for (size_t i = 0; i < n && i < 256; i++) {
        check_masks(&m, a, b);
        int allowed = bit(a, d[i]);
        int rc = gm_matcher_accept_token(&m, d[i]);
        if ((rc == 0) != allowed)
            fz_fail("byte 0x%02x: mask %d, accept %d", d[i], allowed, rc);
        if (i % 8 != 7)
            continue;
        switch ((d[i] >> 3) % 4) {
        case 0: /* the first allowed piece */
            check_masks(&m, a, b);
            for (int32_t id = 256; id < 256 + (int32_t)N_PIECES; id++)
                if (bit(a, id)) {
                    if (gm_matcher_accept_token(&m, id) != 0)
                        fz_fail("allowed piece %d rejected", (int)id);
                    break;
                }
            break;
        case 1: /* back one: the mask before it; forward again */
            if (rc == 0) {
                if (gm_matcher_rollback(&m, 1) != 0)
                    fz_fail("rollback");
                gm_matcher_fill_mask(&m, b, W);
                if (memcmp(a, b, W * sizeof(*a)) != 0)
                    fz_fail("rollback did not restore the mask");
                if (gm_matcher_accept_token(&m, d[i]) != 0)
                    fz_fail("byte 0x%02x rejected the second time", d[i]);
            }
            break;
        case 2: { /* a copy has the same mask */
            struct gm_matcher c;
            if (gm_matcher_copy(&c, &m) != 0)
                fz_fail("copy");
            int r1 = gm_matcher_fill_mask(&m, a, W);
            int r2 = gm_matcher_fill_mask(&c, b, W);
            if (r1 != r2 || (r1 == 0 && memcmp(a, b, W * sizeof(*a)) != 0))
                fz_fail("copy's mask differs");
            gm_matcher_free(&c);
            break;
        }
        case 3: /* EOS where the document may end */
            if (gm_matcher_can_end(&m) &&
                gm_matcher_accept_token(&m, EOS_ID) == 0) {
                check_masks(&m, a, b);
                gm_matcher_rollback(&m, 1);
            }
            break;
        }
    }
    gm_matcher_free(&m);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (vocab.n_ids == 0) {
        if (tt_grammar_byte_vocab(&vocab, pieces, N_PIECES) != 0)
            fz_fail("vocabulary");
        W = gm_vocab_mask_words(&vocab);
    }
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    struct fz_part part[2];
    size_t np = fz_split(data + 1, size - 1, 0, part, 2);
    struct gm_limits lim;
    gm_limits_default(&lim);
    lim.max_nodes = 20000;
    lim.max_exprs = 20000;
    lim.max_count = 32;
    lim.max_depth = 16;
    lim.max_compile_s = 5;
    lim.threads = 1;
    lim.ws_indent = mode & 2 ? -1 : 2;
    char *spec = NULL;
    size_t len = 0;
    if (mode & 1) {
        spec = malloc(part[0].n + 1);
        if (spec == NULL)
            fz_fail("out of memory");
        memcpy(spec, part[0].p, part[0].n);
        len = part[0].n;
    } else {
        json_t *schema = json_loadb((const char *)part[0].p, part[0].n,
                                    JSON_DECODE_ANY | JSON_REJECT_DUPLICATES,
                                    NULL);
        if (schema == NULL)
            return 0;
        int rc = gm_spec_json_schema(schema, &spec, &len);
        json_decref(schema);
        if (rc != 0)
            fz_fail("gm_spec_json_schema: %d", rc);
    }
    char err[512], err2[512];
    struct gm_grammar *g = NULL;
    int rc = gm_spec_compile(spec, len, &vocab, &lim, &g, err, sizeof err);
    int rc2 = gm_spec_check(spec, len, &lim, err2, sizeof err2);
    if (rc != rc2 && rc != TG_ETIMEDOUT)
        fz_fail("compile %d (%s) but check %d (%s)", rc, err, rc2, err2);
    if (rc != 0 && (err[0] == '\0' || (rc != TG_EUNSUPPORTED &&
                                       rc != TG_EFORMAT && rc != TG_EINVAL &&
                                       rc != TG_ETOOBIG && rc != TG_ERANGE &&
                                       rc != TG_ETIMEDOUT)))
        fz_fail("compile failed with %s and message \"%s\"", tg_err_name(rc),
                err);
    if (rc == 0) {
        drive(g, np > 1 ? part[1].p : (const uint8_t *)"", np > 1 ? part[1].n : 0);
        gm_grammar_unref(g);
    }
    free(spec);
    return 0;
}
