/*
 * tok_encode.c — text -> ids (tok_tokenizer.h): added-token splitting,
 * normalization, the pre-tokenizer's regex splits and BPE merging, plus the
 * per-thread word cache.
 *
 * BPE follows HF tokenizers models/bpe/word.rs: the word starts as one
 * symbol per byte (its GPT-2 byte-alphabet token); candidate merges of
 * adjacent symbols sit in a min-heap keyed by (rank, position); the best one
 * is applied if its pair is still current, then the new symbol's pairs with
 * its neighbours are pushed. O(n log n) for a word of n bytes.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tok/tok_internal.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

_Static_assert(sizeof(struct tok__cache_entry) == 64,
               "a word-cache entry is one cache line");

int tok_cache_init(struct tok_cache *c, const struct tok_tokenizer *tok,
                   size_t entries, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->tok = tok;
    c->stop_n = SIZE_MAX;
    c->md = pcre2_match_data_create(1, NULL);
    if (c->md == NULL)
        goto fail;
    if (entries > 0) {
        if (entries > ((size_t)1 << 26))
            entries = (size_t)1 << 26;
        size_t n = 1;
        while (n < entries)
            n *= 2;
        c->ent = calloc(n, sizeof(*c->ent));
        if (c->ent == NULL)
            goto fail;
        c->mask = n - 1;
    }
    return 0;
fail:
    tok_cache_free(c);
    return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
}

void tok_cache_free(struct tok_cache *c)
{
    pcre2_match_data_free(c->md);
    free(c->ent);
    free(c->sym);
    free(c->heap);
    free(c->piece[0]);
    free(c->piece[1]);
    tg_buf_free(&c->norm);
    tg_buf_free(&c->pre);
    memset(c, 0, sizeof(*c));
}

static int push_id(struct tok_ids *out, int32_t id)
{
    if (out->n == out->cap && tok__ids_reserve(out, 1) != 0)
        return TG_ENOMEM;
    out->v[out->n++] = id;
    return 0;
}

#define NFC_OPTS (UTF8PROC_STABLE | UTF8PROC_COMPOSE)

static void clear_bit(uint8_t *bits, int32_t cp)
{
    if (cp >= 0 && cp < TOK__NFC_LIMIT)
        bits[cp >> 3] &= (uint8_t) ~(1u << (cp & 7));
}

int tok__nfc_prepare(struct tok_tokenizer *tok, char *err, size_t errlen)
{
    if (tok->n_norm != 1 || tok->norm[0] != NFC_OPTS)
        return 0;
    uint8_t *safe = malloc(TOK__NFC_LIMIT / 8);
    if (safe == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    memset(safe, 0xff, TOK__NFC_LIMIT / 8);
    /* Unicode UAX #15 quick check: a character with canonical combining
     * class 0 that NFC maps to itself and that is never the second part of
     * a canonical composition starts a stretch NFC cannot touch. Second
     * parts are the non-first characters of canonical decompositions
     * (Hangul V and T jamo included, via the syllables). */
    for (int32_t cp = 0; cp < TOK__NFC_LIMIT; cp++) {
        const utf8proc_property_t *pr = utf8proc_get_property(cp);
        if (pr->combining_class != 0)
            clear_bit(safe, cp);
        int hangul = cp >= 0xAC00 && cp <= 0xD7A3;
        if (pr->decomp_seqindex == UINT16_MAX && !hangul)
            continue;
        utf8proc_int32_t d[32];
        int last = 0;
        utf8proc_ssize_t k =
            utf8proc_decompose_char(cp, d, 32, UTF8PROC_DECOMPOSE, &last);
        if (k < 1 || (k == 1 && d[0] == cp))
            continue; /* compatibility-only mappings: NFC ignores them */
        for (utf8proc_ssize_t i = 1; i < k && i < 32; i++)
            clear_bit(safe, d[i]);
        utf8proc_uint8_t enc[4], *nfc = NULL;
        utf8proc_ssize_t n = utf8proc_encode_char(cp, enc);
        utf8proc_ssize_t m = utf8proc_map(enc, n, &nfc, NFC_OPTS);
        if (m != n || memcmp(nfc, enc, (size_t)n) != 0)
            clear_bit(safe, cp);
        free(nfc);
    }
    tok->nfc_safe = safe;
    return 0;
}

/* Runs the normalizers over s[0..n) and appends the result. */
static int map_all(const struct tok_tokenizer *tok, const char *s, size_t n,
                   struct tg_buf *out)
{
    utf8proc_uint8_t *cur = NULL;
    utf8proc_ssize_t len = (utf8proc_ssize_t)n;
    for (int i = 0; i < tok->n_norm; i++) {
        utf8proc_uint8_t *next;
        const utf8proc_uint8_t *in = cur ? cur : (const utf8proc_uint8_t *)s;
        len = utf8proc_map(in, len, &next, (utf8proc_option_t)tok->norm[i]);
        free(cur);
        if (len < 0)
            return len == UTF8PROC_ERROR_NOMEM ? TG_ENOMEM : TG_EINVAL;
        cur = next;
    }
    int rc = tg_buf_append(out, cur, (size_t)len);
    free(cur);
    return rc;
}

/* Byte length of the character at s[i] and whether NFC leaves it alone
 * and cannot merge it into what precedes it. */
static size_t nfc_char(const struct tok_tokenizer *tok, const char *s, size_t n,
                       size_t i, int *safe)
{
    if ((unsigned char)s[i] < 0x80) {
        *safe = 1;
        return 1;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                          (utf8proc_ssize_t)(n - i), &cp);
    *safe = k > 0 && cp < TOK__NFC_LIMIT &&
            (tok->nfc_safe[cp >> 3] & (1u << (cp & 7)));
    return k > 0 ? (size_t)k : 1;
}

int tok__normalize(const struct tok_tokenizer *tok, const char *s, size_t n,
                   struct tg_buf *out)
{
    tg_buf_reset(out);
    if (tg_buf_reserve(out, n) != 0)
        return TG_ENOMEM;
    if (tok->nfc_safe == NULL) {
        int ascii = 1;
        for (size_t i = 0; i < n && ascii; i++)
            ascii = (unsigned char)s[i] < 0x80;
        /* Every normalization form leaves ASCII unchanged. */
        if (ascii || tok->n_norm == 0)
            return tg_buf_append(out, s, n);
        return map_all(tok, s, n, out);
    }
    /* NFC: copy safe stretches; run utf8proc only from the character
     * before an unsafe one (it may compose with it) up to the next safe
     * character (nothing after it can reach back across it). */
    size_t i = 0;
    while (i < n) {
        size_t u = i, prev = SIZE_MAX, k;
        int safe = 1;
        while (u < n) {
            k = nfc_char(tok, s, n, u, &safe);
            if (!safe)
                break;
            prev = u;
            u += k;
        }
        if (u == n)
            return tg_buf_append(out, s + i, n - i);
        size_t a = prev == SIZE_MAX ? u : prev;
        int rc = tg_buf_append(out, s + i, a - i);
        if (rc != 0)
            return rc;
        size_t b = u;
        while (b < n) {
            k = nfc_char(tok, s, n, b, &safe);
            if (safe)
                break;
            b += k;
        }
        if ((rc = map_all(tok, s + a, b - a, out)) != 0)
            return rc;
        i = b;
    }
    return 0;
}

/* ------------------------------------------------------------------ BPE */

static const struct tok__merge_slot *merge_find(const struct tok_tokenizer *t,
                                                int32_t a, int32_t b)
{
    if (t->merge.slots == NULL)
        return NULL;
    uint64_t key = (uint64_t)a << 32 | (uint32_t)b;
    return tg_hmap_find(&t->merge, &tok__merge_type, tok__merge_hash(key),
                        &key);
}

static void heap_push(struct tok__heap_ent *h, size_t *n,
                      struct tok__heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (h[up].key <= e.key)
            break;
        h[i] = h[up];
        i = up;
    }
    h[i] = e;
}

static struct tok__heap_ent heap_pop(struct tok__heap_ent *h, size_t *n)
{
    struct tok__heap_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n)
            break;
        if (l + 1 < *n && h[l + 1].key < h[l].key)
            l++;
        if (last.key <= h[l].key)
            break;
        h[i] = h[l];
        i = l;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Pushes the merge of symbol i with its right neighbour, if any. */
static void candidate(const struct tok_tokenizer *t, struct tok__sym *sym,
                      int32_t i, struct tok__heap_ent *h, size_t *nh)
{
    if (i < 0 || sym[i].next < 0)
        return;
    const struct tok__merge_slot *m =
        merge_find(t, sym[i].id, sym[sym[i].next].id);
    if (m != NULL)
        heap_push(h, nh,
                  (struct tok__heap_ent){(uint64_t)m->rank << 32 | (uint32_t)i,
                                         sym[i].id, sym[sym[i].next].id,
                                         m->id});
}

/* Encodes one pre-tokenized word of n raw bytes. */
static int bpe_word(const struct tok_tokenizer *t, struct tok_cache *c,
                    const uint8_t *p, size_t n, struct tok_ids *out)
{
    if (n == 0)
        return 0;
    /* tok_encode_max: past the caller's bound, stop at the next word. */
    if (out->n > c->stop_n)
        return TG_ERANGE;
    if (n > INT32_MAX)
        return TG_ETOOBIG;
    if (t->ignore_merges) { /* HF: a word in the vocabulary is kept whole */
        int32_t id = tok__vocab_raw(t, p, n);
        if (id >= 0)
            return push_id(out, id);
    }
    struct tok__cache_entry *ce = NULL;
    uint64_t h = 0;
    if (c->ent != NULL && n <= TOK__CACHE_KEY) {
        h = tg_hash_bytes(p, n);
        ce = &c->ent[h & c->mask];
        if (ce->len == n && ce->tag == (uint32_t)(h >> 32) &&
            memcmp(ce->key, p, n) == 0) {
            c->hits++;
            if (tok__ids_reserve(out, ce->n_ids) != 0)
                return TG_ENOMEM;
            memcpy(out->v + out->n, ce->ids, ce->n_ids * sizeof(int32_t));
            out->n += ce->n_ids;
            return 0;
        }
        c->misses++;
    }
    if (TG_GROW(c->sym, &c->sym_cap, n) != 0)
        return TG_ENOMEM;
    struct tok__sym *sym = c->sym;
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[p[i]];
        if (id < 0)
            id = t->unk_id;
        if (id < 0)
            continue; /* no token and no unk: HF drops the byte */
        sym[ns] = (struct tok__sym){id, ns - 1, ns + 1};
        ns++;
    }
    if (ns == 0)
        return 0;
    sym[ns - 1].next = -1;
    /* The heap starts with at most ns - 1 candidates; each applied merge
     * pops one and pushes at most two, and there are at most ns - 1 merges,
     * so it never holds more than 2 (ns - 1) entries. */
    if (TG_GROW(c->heap, &c->heap_cap, 2 * (size_t)ns) != 0)
        return TG_ENOMEM;
    struct tok__heap_ent *heap = c->heap;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        candidate(t, sym, i, heap, &nh);
    while (nh > 0) {
        struct tok__heap_ent e = heap_pop(heap, &nh);
        int32_t i = (int32_t)(uint32_t)e.key, j = sym[i].next;
        /* Stale when either side has changed since it was pushed. */
        if (sym[i].id != e.left || j < 0 || sym[j].id != e.right)
            continue;
        sym[i].id = e.merged;
        sym[i].next = sym[j].next;
        if (sym[j].next >= 0)
            sym[sym[j].next].prev = i;
        sym[j].id = -1;
        candidate(t, sym, sym[i].prev, heap, &nh);
        candidate(t, sym, i, heap, &nh);
    }
    size_t start = out->n;
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if (push_id(out, sym[i].id) != 0)
            return TG_ENOMEM;
    size_t got = out->n - start;
    if (ce != NULL && got <= TOK__CACHE_IDS) {
        ce->tag = (uint32_t)(h >> 32);
        ce->len = (uint8_t)n;
        ce->n_ids = (uint8_t)got;
        memcpy(ce->key, p, n);
        memcpy(ce->ids, out->v + start, got * sizeof(int32_t));
    }
    return 0;
}

/* ------------------------------------------------------- pre-tokenizer */

/* The fold of one split: items (gaps and matches) arrive left to right and
 * leave as pieces per the behaviour (HF normalizer.rs split()). One item is
 * held back so MergedWithPrevious / MergedWithNext can extend it. */
struct fold {
    const struct tok_tokenizer *t;
    struct tok_cache *c;
    struct tok_ids *out;
    const char *subj; /* bytes the offsets refer to */
    int level;        /* pre-tokenizer step */
    int behavior;
    int have, held_match, prev_match;
    size_t hs, he; /* the held piece */
};

static int emit(struct fold *f, size_t s, size_t e)
{
    if (s == e)
        return 0;
    if (f->level + 1 == f->t->n_steps)
        return bpe_word(f->t, f->c, (const uint8_t *)f->subj + s, e - s,
                        f->out);
    int k = f->level & 1;
    struct tok_cache *c = f->c;
    if (TG_GROW(c->piece[k], &c->piece_cap[k], c->n_piece[k] + 1) != 0)
        return TG_ENOMEM;
    c->piece[k][c->n_piece[k]++] = (struct tok__piece){s, e - s};
    return 0;
}

static int flush(struct fold *f)
{
    if (!f->have)
        return 0;
    f->have = 0;
    return emit(f, f->hs, f->he);
}

static int hold(struct fold *f, size_t s, size_t e, int is_match)
{
    int rc = flush(f);
    f->have = 1;
    f->hs = s;
    f->he = e;
    f->held_match = is_match;
    return rc;
}

static int item(struct fold *f, size_t s, size_t e, int is_match)
{
    int rc = 0;
    switch (f->behavior) {
    case TOK__SPLIT_ISOLATED:
        rc = emit(f, s, e);
        break;
    case TOK__SPLIT_REMOVED:
        if (!is_match)
            rc = emit(f, s, e);
        break;
    case TOK__SPLIT_MERGED_PREV: /* a match joins the gap before it */
        if (is_match && !f->prev_match && f->have)
            f->he = e;
        else
            rc = hold(f, s, e, is_match);
        break;
    default: /* TOK__SPLIT_MERGED_NEXT: a match joins the gap after it */
        if (!is_match && f->have && f->held_match) {
            f->he = e;
            rc = flush(f);
        } else {
            rc = hold(f, s, e, is_match);
        }
        break;
    }
    f->prev_match = is_match;
    return rc;
}

/* Runs step `level` over subj[off, off + len). */
static int split_piece(const struct tok_tokenizer *t, struct tok_cache *c,
                       int level, const char *subj, size_t off, size_t len,
                       struct tok_ids *out)
{
    const struct tok__step *st = &t->step[level];
    struct fold f = {.t = t,
                     .c = c,
                     .out = out,
                     .subj = subj,
                     .level = level,
                     .behavior = st->behavior};
    PCRE2_SPTR p = (PCRE2_SPTR)subj + off;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    size_t gap = 0, at = 0;
    int inv = st->invert, rc = 0;
    while (at < len) {
        int r =
            pcre2_match(st->re, p, len, at, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (r == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter uses heap */
            r = pcre2_match(st->re, p, len, at,
                            PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
        if (r == PCRE2_ERROR_NOMATCH)
            break;
        if (r < 0)
            return TG_ETOOBIG; /* match or depth limit: pathological input */
        size_t ms = ov[0], me = ov[1];
        if (ms == me) { /* empty matches make no piece; step one char on */
            if (ms >= len)
                break;
            at = ms + 1;
            while (at < len && (p[at] & 0xC0) == 0x80)
                at++;
            continue;
        }
        if (ms > gap && (rc = item(&f, off + gap, off + ms, inv)) != 0)
            return rc;
        if ((rc = item(&f, off + ms, off + me, !inv)) != 0)
            return rc;
        gap = at = me;
    }
    if (gap < len && (rc = item(&f, off + gap, off + len, inv)) != 0)
        return rc;
    return flush(&f);
}

/* Pre-tokenizes and BPE-encodes one segment (no added tokens inside). */
static int pretok(const struct tok_tokenizer *t, struct tok_cache *c,
                  const char *p, size_t n, struct tok_ids *out)
{
    if (n == 0)
        return 0;
    if (t->add_prefix_space && p[0] != ' ') {
        tg_buf_reset(&c->pre);
        if (tg_buf_putc(&c->pre, ' ') != 0 || tg_buf_append(&c->pre, p, n) != 0)
            return TG_ENOMEM;
        p = c->pre.data;
        n++;
    }
    if (t->n_steps == 0)
        return bpe_word(t, c, (const uint8_t *)p, n, out);
    c->n_piece[0] = c->n_piece[1] = 0;
    int rc = split_piece(t, c, 0, p, 0, n, out);
    for (int level = 1; rc == 0 && level < t->n_steps; level++) {
        int src = (level - 1) & 1;
        c->n_piece[level & 1] = 0;
        for (size_t i = 0; rc == 0 && i < c->n_piece[src]; i++)
            rc = split_piece(t, c, level, p, c->piece[src][i].off,
                             c->piece[src][i].len, out);
    }
    return rc;
}

/* ----------------------------------------------------------- added tokens */

static int is_ws(int32_t cp) /* Unicode White_Space, Rust char::is_whitespace */
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int is_word(int32_t cp) /* \w: letters, marks, Nd, Nl, Pc */
{
    utf8proc_category_t k = utf8proc_category(cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_NL) ||
           k == UTF8PROC_CATEGORY_PC;
}

static int32_t cp_at(const char *s, size_t n, size_t i, size_t *len)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                          (utf8proc_ssize_t)(n - i), &cp);
    *len = k > 0 ? (size_t)k : 1;
    return cp;
}

static size_t prev_start(const char *s, size_t i)
{
    do
        i--;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

static int split_added(const struct tok_tokenizer *t, struct tok_cache *c,
                       int phase, const char *s, size_t n, unsigned flags,
                       struct tok_ids *out);

/* Text between added tokens: phase 0 normalizes it and looks for
 * normalized added tokens; phase 1 pre-tokenizes it. */
static int gap_text(const struct tok_tokenizer *t, struct tok_cache *c,
                    int phase, const char *s, size_t n, unsigned flags,
                    struct tok_ids *out)
{
    if (n == 0)
        return 0;
    if (phase == 1 || t->n_norm == 0)
        return pretok(t, c, s, n, out);
    int rc = tok__normalize(t, s, n, &c->norm);
    if (rc != 0)
        return rc;
    return split_added(t, c, 1, c->norm.data, c->norm.len, flags, out);
}

/* Cuts added tokens out of s, leftmost-longest (HF added_vocabulary.rs
 * find_matches), and encodes the text between them. */
static int split_added(const struct tok_tokenizer *t, struct tok_cache *c,
                       int phase, const char *s, size_t n, unsigned flags,
                       struct tok_ids *out)
{
    const struct tok__trie *tr = phase == 0 ? &t->trie_raw : &t->trie_norm;
    int skip_special = (flags & TOK_ENCODE_SPLIT_SPECIAL) != 0, rc;
    size_t seg = 0, i = 0;
    while (tr->node != NULL && i < n) {
        unsigned char b = (unsigned char)s[i];
        if (!(tr->first[b >> 3] & (1u << (b & 7)))) {
            i++;
            continue;
        }
        size_t klen = 0, cl;
        int32_t a = tok__trie_longest(t, tr, (const uint8_t *)s + i, n - i,
                                      skip_special, &klen);
        if (a < 0) {
            i++;
            continue;
        }
        const struct tok__added *ad = &t->added[a];
        size_t ms = i, me = i + klen;
        if (ad->single_word &&
            ((ms > 0 && is_word(cp_at(s, n, prev_start(s, ms), &cl))) ||
             (me < n && is_word(cp_at(s, n, me, &cl))))) {
            i++;
            continue;
        }
        if (ad->lstrip)
            while (ms > seg && is_ws(cp_at(s, n, prev_start(s, ms), &cl)))
                ms = prev_start(s, ms);
        if (ad->rstrip)
            while (me < n && is_ws(cp_at(s, n, me, &cl)))
                me += cl;
        if ((rc = gap_text(t, c, phase, s + seg, ms - seg, flags, out)) != 0 ||
            (rc = push_id(out, ad->id)) != 0)
            return rc;
        seg = i = me;
    }
    return gap_text(t, c, phase, s + seg, n - seg, flags, out);
}

int tok_encode(const struct tok_tokenizer *tok, struct tok_cache *cache,
               const char *text, size_t len, unsigned flags,
               struct tok_ids *out, char *err, size_t errlen)
{
    return tok_encode_max(tok, cache, text, len, flags, SIZE_MAX, out, err,
                          errlen);
}

int tok_encode_max(const struct tok_tokenizer *tok, struct tok_cache *cache,
                   const char *text, size_t len, unsigned flags,
                   size_t max_ids, struct tok_ids *out, char *err,
                   size_t errlen)
{
    size_t bad;
    if (!tok_utf8_valid(text, len, &bad))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "text is not valid UTF-8 (byte %zu)", bad);
    if (cache != NULL && cache->tok != tok)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "cache belongs to another tokenizer");
    struct tok_cache local;
    if (cache == NULL) {
        if (tok_cache_init(&local, tok, 0, err, errlen) != 0)
            return TG_ENOMEM;
        cache = &local;
    }
    size_t n0 = out->n;
    size_t saved_stop = cache->stop_n;
    cache->stop_n = max_ids > SIZE_MAX - n0 ? SIZE_MAX : n0 + max_ids;
    int rc = 0;
    if (flags & TOK_ENCODE_ADD_SPECIAL)
        for (int i = 0; rc == 0 && i < tok->n_prefix; i++)
            rc = push_id(out, tok->prefix[i]);
    if (rc == 0)
        rc = split_added(tok, cache, 0, text, len, flags, out);
    if (flags & TOK_ENCODE_ADD_SPECIAL)
        for (int i = 0; rc == 0 && i < tok->n_suffix; i++)
            rc = push_id(out, tok->suffix[i]);
    if (rc == 0 && out->n > cache->stop_n)
        rc = TG_ERANGE;
    cache->stop_n = saved_stop;
    if (cache == &local)
        tok_cache_free(&local);
    if (rc == 0)
        return 0;
    out->n = n0;
    if (rc == TG_ERANGE)
        return tg_err_set(err, errlen, rc, "more than %zu tokens", max_ids);
    if (rc == TG_ETOOBIG)
        return tg_err_set(err, errlen, rc,
                          "text too large or pathological "
                          "for the pre-tokenizer");
    if (rc == TG_EINVAL)
        return tg_err_set(err, errlen, rc, "normalization failed");
    return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
}
