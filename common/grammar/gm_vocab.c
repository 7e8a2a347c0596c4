/* gm_vocab.c — token bytes, kinds and the preorder trie (gm_vocab.h). */
#include "common/grammar/gm_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

size_t gm_vocab_mask_words(const struct gm_vocab *v)
{
    return ((size_t)v->n_ids + 31) / 32;
}

void gm_vocab_free(struct gm_vocab *v)
{
    free(v->off);
    free(v->bytes);
    free(v->kind);
    free(v->sorted);
    free(v->t_byte);
    free(v->t_depth);
    free(v->t_end);
    free(v->t_first);
    free(v->t_maxlen);
    memset(v, 0, sizeof(*v));
}

const uint8_t *gm_vocab_token(const struct gm_vocab *v, int32_t id,
                              size_t *len)
{
    if (id < 0 || id >= v->n_ids || v->kind[id] != GM_TOK_NORMAL)
        return NULL;
    *len = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

/* qsort has no context argument: the comparator reads these. */
static _Thread_local const struct gm_vocab *sort_v;

static int by_bytes(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const struct gm_vocab *v = sort_v;
    size_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y],
                   lx < ly ? lx : ly);
    if (c != 0)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Builds the sorted list and the preorder trie from the kinds. */
static int build_trie(struct gm_vocab *v)
{
    size_t n = 0, total = 0;
    for (int32_t i = 0; i < v->n_ids; i++)
        if (v->kind[i] == GM_TOK_NORMAL) {
            n++;
            total += v->off[i + 1] - v->off[i];
        }
    v->n_normal = (int32_t)n;
    v->sorted = malloc((n ? n : 1) * sizeof(*v->sorted));
    size_t cap = total + 1; /* nodes: at most one per byte, plus the root */
    v->t_byte = malloc(cap);
    v->t_depth = malloc(cap * sizeof(*v->t_depth));
    v->t_end = malloc(cap * sizeof(*v->t_end));
    v->t_first = malloc((cap + 1) * sizeof(*v->t_first));
    if (v->sorted == NULL || v->t_byte == NULL || v->t_depth == NULL ||
        v->t_end == NULL || v->t_first == NULL)
        return TG_ENOMEM;
    n = 0;
    for (int32_t i = 0; i < v->n_ids; i++)
        if (v->kind[i] == GM_TOK_NORMAL)
            v->sorted[n++] = i;
    sort_v = v;
    qsort(v->sorted, n, sizeof(*v->sorted), by_bytes);
    sort_v = NULL;
    /* path[d]: the node at depth d on the current path. */
    int32_t path[GM_TOKEN_MAX_BYTES + 1];
    int depth = 0;
    int32_t nn = 1;
    v->t_byte[0] = 0;
    v->t_depth[0] = 0;
    v->t_first[0] = 0;
    path[0] = 0;
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (size_t k = 0; k < n; k++) {
        int32_t id = v->sorted[k];
        const uint8_t *b = v->bytes + v->off[id];
        size_t len = v->off[id + 1] - v->off[id];
        size_t lcp = 0;
        while (prev != NULL && lcp < len && lcp < prev_len && b[lcp] == prev[lcp])
            lcp++;
        /* close the nodes below the common prefix */
        while (depth > (int)lcp) {
            v->t_end[path[depth]] = nn;
            depth--;
        }
        for (size_t d = lcp; d < len; d++) {
            v->t_byte[nn] = b[d];
            v->t_depth[nn] = (uint16_t)(d + 1);
            v->t_first[nn] = (int32_t)k;
            path[++depth] = nn++;
        }
        prev = b;
        prev_len = len;
    }
    while (depth > 0) {
        v->t_end[path[depth]] = nn;
        depth--;
    }
    v->t_end[0] = nn;
    v->t_first[nn] = (int32_t)n;
    v->n_node = nn;
    v->t_maxlen = calloc((size_t)nn, sizeof(*v->t_maxlen));
    if (v->t_maxlen == NULL)
        return TG_ENOMEM;
    for (int32_t i = 0; i < nn; i++)
        for (int32_t t = v->t_first[i]; t < v->t_first[v->t_end[i]]; t++) {
            uint32_t len = v->off[v->sorted[t] + 1] - v->off[v->sorted[t]];
            if (len > v->t_maxlen[i])
                v->t_maxlen[i] = (uint16_t)len;
        }
    return 0;
}

int gm_vocab_init_bytes(struct gm_vocab *v, int32_t n_ids,
                        const char *const *tok, const size_t *len,
                        const uint8_t *special, const int32_t *eos, int n_eos,
                        char *err, size_t errlen)
{
    memset(v, 0, sizeof(*v));
    if (n_ids <= 0 || n_eos < 0 || n_eos > GM_MAX_EOS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "vocabulary: %d ids, %d EOS ids", (int)n_ids, n_eos);
    size_t total = 0;
    for (int32_t i = 0; i < n_ids; i++)
        if (tok[i] != NULL && len[i] <= GM_TOKEN_MAX_BYTES)
            total += len[i];
    if (total > UINT32_MAX / 2)
        return tg_err_set(err, errlen, TG_ETOOBIG, "vocabulary too large");
    v->n_ids = n_ids;
    v->off = malloc(((size_t)n_ids + 1) * sizeof(*v->off));
    v->bytes = malloc(total ? total : 1);
    v->kind = calloc((size_t)n_ids, 1);
    if (v->off == NULL || v->bytes == NULL || v->kind == NULL)
        goto oom;
    uint32_t at = 0;
    for (int32_t i = 0; i < n_ids; i++) {
        v->off[i] = at;
        if (tok[i] == NULL || len[i] == 0 || len[i] > GM_TOKEN_MAX_BYTES ||
            (special != NULL && special[i]))
            continue;
        memcpy(v->bytes + at, tok[i], len[i]);
        at += (uint32_t)len[i];
        v->kind[i] = GM_TOK_NORMAL;
        if ((int)len[i] > v->max_len)
            v->max_len = (int)len[i];
    }
    v->off[n_ids] = at;
    for (int i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= n_ids)
            continue;
        v->kind[eos[i]] = GM_TOK_EOS;
        v->eos[v->n_eos++] = eos[i];
    }
    if (build_trie(v) != 0)
        goto oom;
    return 0;
oom:
    gm_vocab_free(v);
    return tg_err_set(err, errlen, TG_ENOMEM, "vocabulary: out of memory");
}

int gm_vocab_init(struct gm_vocab *v, const struct tok_tokenizer *tok,
                  char *err, size_t errlen)
{
    int32_t n = tok_vocab_size(tok);
    if (n <= 0)
        return tg_err_set(err, errlen, TG_EINVAL, "tokenizer has no tokens");
    const char **s = calloc((size_t)n, sizeof(*s));
    size_t *len = calloc((size_t)n, sizeof(*len));
    uint8_t *special = calloc((size_t)n, 1);
    if (s == NULL || len == NULL || special == NULL) {
        free(s);
        free(len);
        free(special);
        return tg_err_set(err, errlen, TG_ENOMEM, "vocabulary: out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        s[i] = tok_id_bytes(tok, i, &len[i]);
        special[i] = (uint8_t)tok_id_is_special(tok, i);
    }
    int rc = gm_vocab_init_bytes(v, n, s, len, special, tok->eos_ids,
                                 tok->n_eos < GM_MAX_EOS ? tok->n_eos
                                                         : GM_MAX_EOS,
                                 err, errlen);
    free(s);
    free(len);
    free(special);
    return rc;
}
