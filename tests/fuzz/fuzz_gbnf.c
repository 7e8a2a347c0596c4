/*
 * fuzz_gbnf.c — GBNF grammars (common/grammar/gm_gbnf.h) on untrusted
 * text: the parser and its checks, the IR and the automaton compiler
 * under tight limits; the spec of the same text (gm_spec_grammar) is
 * refused or accepted alike by gm_spec_check; a compiled grammar is
 * driven by the rest of the input over a byte vocabulary with the fast
 * token mask equal to the brute-force one at every step.
 *
 * Input: the GBNF text, a NUL, the drive bytes.
 * Limits: 20,000 IR expressions and automaton nodes, 2 s per compile.
 */
#include <stdlib.h>
#include <string.h>

#include "common/grammar/gm_gbnf.h"
#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_spec.h"
#include "common/base/tg_err.h"
#include "tests/fuzz/fz_gram.h"
#include "tests/fuzz/fz_util.h"
#include "tests/support/tt_grammar.h"

static const char *const pieces[] = {"ab", "\":", "{\"", "\xce\xb1", "12"};
#define N_PIECES (sizeof pieces / sizeof *pieces)
#define EOS_ID ((int32_t)(257 + N_PIECES))

static struct gm_vocab vocab;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (vocab.n_ids == 0 && tt_grammar_byte_vocab(&vocab, pieces, N_PIECES))
        fz_fail("vocabulary");
    if (size > 8192)
        return 0;
    struct fz_part part[2];
    size_t np = fz_split(data, size, 0, part, 2);
    struct gm_limits lim;
    gm_limits_default(&lim);
    lim.max_exprs = 20000;
    lim.max_nodes = 20000;
    lim.max_compile_s = 2;
    lim.threads = 1;
    struct gm_ir ir;
    gm_ir_init(&ir, lim.max_exprs);
    gm_ir_set_deadline(&ir, gm__now() + lim.max_compile_s);
    char err[300] = "";
    int32_t root = gm_gbnf_compile(&ir, (const char *)part[0].p, part[0].n, err,
                                   sizeof err);
    int rc = root < 0 ? root : gm_ir_root_set(&ir, root);
    if (rc < 0 && (err[0] == '\0' ||
                   (rc != TG_EFORMAT && rc != TG_EINVAL && rc != TG_ETOOBIG &&
                    rc != TG_ETIMEDOUT && rc != TG_ERANGE)))
        fz_fail("gbnf failed with %s: \"%s\"", tg_err_name(rc), err);
    if (rc >= 0 && gm_ir_error(&ir, NULL, 0) != 0)
        fz_fail("root returned but the IR failed");
    if (rc < 0 && gm_ir_error(&ir, NULL, 0) != rc)
        fz_fail("gbnf error %s not recorded in the IR", tg_err_name(rc));
    struct gm_grammar *g = NULL;
    if (rc == 0)
        rc = gm_grammar_compile_ir(&ir, &vocab, &lim, &g, err, sizeof err);
    gm_ir_free(&ir);
    /* the spec of the same text: refused exactly when this was, unless a
     * limit or the clock decided (the spec's limits are the defaults) */
    char *spec;
    size_t sl;
    if (gm_spec_grammar((const char *)part[0].p, part[0].n, &spec, &sl) == 0) {
        char err2[300];
        int rc2 = gm_spec_check(spec, sl, &lim, err2, sizeof err2);
        if ((rc2 == 0) != (rc == 0) && rc != TG_ETIMEDOUT &&
            rc2 != TG_ETIMEDOUT)
            fz_fail("compile %s (%s) but spec check %s (%s)", tg_err_name(rc),
                    err, tg_err_name(rc2), err2);
        free(spec);
    }
    if (g != NULL) {
        fz_gram_drive(g, &vocab, EOS_ID, np > 1 ? part[1].p : NULL,
                      np > 1 ? part[1].n : 0);
        gm_grammar_unref(g);
    }
    return 0;
}
