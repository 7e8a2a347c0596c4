/*
 * fuzz_regex.c — regular expressions (common/grammar/gm_regex.h) on
 * untrusted patterns: the parser, the derivatives and the DFA under tight
 * limits, the IR in both encodings, and three answers that must agree on
 * the subject string: the DFA, the grammar of the JSON encoding and the
 * grammar of the raw encoding; where the pattern uses only characters
 * whose meaning PCRE2 shares (letters a-c, digits, | ( ) * + ? ^ $ [ ] -
 * { } , = ! : and the escapes \d \D \w \W \b \B), PCRE2 must agree too.
 * Along the subject's JSON encoding the fast token mask equals the
 * brute-force one.
 *
 * Input: one mode byte, the pattern, a NUL, the subject (UTF-8; another
 * subject is not compared).
 *   mode bit 0: whole-string pattern (GM_RX_FULL), else JSON Schema search
 *   mode bit 1: a length range, lo = bits 2-3, hi = lo + bits 4-6
 * Limits: 2,000 DFA states, 20,000 automaton nodes, 2 s per compile.
 */
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/grammar/gm_matcher.h"
#include "common/grammar/gm_regex.h"
#include "common/grammar/gm_regex_internal.h"
#include "common/base/tg_err.h"
#include "tests/fuzz/fz_gram.h"
#include "tests/fuzz/fz_util.h"
#include "tests/support/tt_grammar.h"

static const char *const pieces[] = {"\\n", "\\\"", "\\u00", "ab", "\xc3\xa9"};
#define N_PIECES (sizeof pieces / sizeof *pieces)
#define EOS_ID ((int32_t)(257 + N_PIECES))

static struct gm_vocab vocab;

static struct gm_grammar *grammar(const struct gm_rx_item *it,
                                  const struct gm_rx_opts *o, int *code)
{
    struct gm_ir ir;
    gm_ir_init(&ir, 20000);
    gm_ir_set_deadline(&ir, gm__now() + 2.0);
    char err[300];
    int32_t c = gm_regex_expr(&ir, it, 1, o, err, sizeof err);
    struct gm_grammar *g = NULL;
    *code = c < 0 ? c : 0;
    if (c >= 0) {
        int32_t q = gm_ir_str(&ir, "\"");
        int32_t r = gm_ir_rule(&ir, "doc");
        gm_ir_rule_define(
            &ir, r,
            o->enc == GM_RX_RAW ? c : gm_ir_seq(&ir, (int32_t[]){q, c, q}, 3));
        struct gm_limits lim;
        gm_limits_default(&lim);
        lim.max_nodes = 20000;
        lim.max_compile_s = 2;
        lim.threads = 1;
        if (gm_ir_root_set(&ir, r) == 0)
            *code = gm_grammar_compile_ir(&ir, &vocab, &lim, &g, err,
                                          sizeof err);
        else
            *code = gm_ir_error(&ir, NULL, 0);
    } else if (err[0] == '\0') {
        fz_fail("gm_regex_expr failed (%s) without a message", tg_err_name(c));
    }
    gm_ir_free(&ir);
    return g;
}

/* The JSON string literal of UTF-8 text s[0..n) as gm_regex writes it. */
static size_t json_encode(const uint8_t *s, size_t n, char *out)
{
    size_t k = 0;
    out[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case 8: e = "\\b"; break;
        case 9: e = "\\t"; break;
        case 10: e = "\\n"; break;
        case 12: e = "\\f"; break;
        case 13: e = "\\r"; break;
        default: break;
        }
        if (e != NULL) {
            memcpy(out + k, e, 2);
            k += 2;
        } else if (c < 0x20) {
            static const char hx[] = "0123456789abcdef";
            memcpy(out + k, "\\u00", 4);
            out[k + 4] = hx[c >> 4];
            out[k + 5] = hx[c & 15];
            k += 6;
        } else {
            out[k++] = (char)c;
        }
    }
    out[k++] = '"';
    return k;
}

static int pcre_safe(const uint8_t *p, size_t n)
{
    static const char ok[] = "abc0123456789|()*+?^$[]-{},=!:";
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\') {
            if (i + 1 >= n || strchr("dDwWbB", p[i + 1]) == NULL ||
                p[i + 1] == '\0')
                return 0;
            i++;
            continue;
        }
        if (p[i] == '\0' || strchr(ok, p[i]) == NULL)
            return 0;
        /* [] and [^] mean other things in PCRE2; so does {,n} in newer
         * versions */
        if (p[i] == '[' && i + 1 < n &&
            (p[i + 1] == ']' ||
             (p[i + 1] == '^' && i + 2 < n && p[i + 2] == ']')))
            return 0;
        if (p[i] == '{' && i + 1 < n && p[i + 1] == ',')
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (vocab.n_ids == 0 && tt_grammar_byte_vocab(&vocab, pieces, N_PIECES))
        fz_fail("vocabulary");
    if (size < 1 || size > 4096)
        return 0;
    uint8_t mode = data[0];
    struct fz_part part[2];
    size_t np = fz_split(data + 1, size - 1, 0, part, 2);
    const uint8_t *sub = np > 1 ? part[1].p : (const uint8_t *)"";
    size_t sn = np > 1 ? part[1].n : 0;
    if (sn > 64)
        sn = 64;
    struct gm_rx_item it = {.text = (const char *)part[0].p,
                            .len = part[0].n,
                            .kind = mode & 1 ? GM_RX_FULL : GM_RX_SEARCH};
    struct gm_rx_opts o;
    gm_rx_opts_default(&o);
    o.max_states = 2000;
    if (mode & 2) {
        o.min_len = (mode >> 2) & 3;
        o.max_len = o.min_len + ((mode >> 4) & 7);
    }
    /* the syntax check and the compile agree */
    char err[300];
    int chk = gm_regex_check(it.text, it.len, it.kind, err, sizeof err);
    struct gm__rx_dfa d;
    int rc = gm__rx_compile(&it, 1, 2000, gm__now() + 2.0, &d, err, sizeof err);
    if (chk != 0 && rc != chk)
        fz_fail("check says %s, compile %s", tg_err_name(chk), tg_err_name(rc));
    if (rc != 0) {
        if (err[0] == '\0' ||
            (rc != TG_EFORMAT && rc != TG_EUNSUPPORTED && rc != TG_ETOOBIG &&
             rc != TG_EINVAL && rc != TG_ETIMEDOUT))
            fz_fail("compile failed with %s: \"%s\"", tg_err_name(rc), err);
        return 0;
    }
    /* the subject's code points */
    uint32_t cp[64];
    size_t n = 0, ok = 1;
    for (size_t i = 0; i < sn && ok;) {
        size_t k = gm__utf8_dec(sub + i, sn - i, &cp[n]);
        ok = k > 0;
        i += k;
        n += ok;
    }
    int want = ok && gm__rx_dfa_run(&d, cp, n) && n >= o.min_len &&
               (o.max_len == GM_REPEAT_INF || n <= o.max_len);
    int in_dfa = ok && gm__rx_dfa_run(&d, cp, n);
    gm__rx_dfa_free(&d);
    int code;
    struct gm_grammar *gj = grammar(&it, &o, &code);
    if (gj != NULL) {
        char enc[64 * 6 + 2];
        size_t en = ok ? json_encode(sub, sn, enc) : 0;
        if (ok && fz_gram_accepts(gj, enc, en) != want)
            fz_fail("DFA %d but the JSON grammar %d on %.*s", want, !want,
                    (int)en, enc);
        fz_gram_drive(gj, &vocab, EOS_ID, (const uint8_t *)enc, en);
        gm_grammar_unref(gj);
    } else if (code == TG_EINVAL && want) {
        fz_fail("the JSON grammar has no string, the DFA accepts one");
    }
    o.enc = GM_RX_RAW;
    struct gm_grammar *gr = grammar(&it, &o, &code);
    if (gr != NULL) {
        if (ok && fz_gram_accepts(gr, sub, sn) != want)
            fz_fail("DFA %d but the raw grammar %d", want, !want);
        gm_grammar_unref(gr);
    }
    if (ok && pcre_safe(part[0].p, part[0].n)) {
        int ec;
        PCRE2_SIZE eo;
        char *pat = malloc(part[0].n + 1);
        memcpy(pat, part[0].p, part[0].n);
        pat[part[0].n] = '\0';
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, part[0].n,
                                       PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &ec,
                                       &eo, NULL);
        if (re != NULL) {
            pcre2_match_data *md = pcre2_match_data_create(4, NULL);
            int pr = pcre2_match(
                re, sub, sn, 0,
                it.kind == GM_RX_FULL ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0,
                md, NULL);
            if (pr >= 0 || pr == PCRE2_ERROR_NOMATCH) {
                if ((pr >= 0) != in_dfa)
                    fz_fail("pattern %s on %.*s: PCRE2 %d, DFA %d", pat,
                            (int)sn, sub, pr >= 0, in_dfa);
            }
            pcre2_match_data_free(md);
            pcre2_code_free(re);
        }
        free(pat);
    }
    return 0;
}
