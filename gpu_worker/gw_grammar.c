/* gw_grammar.c — per-slot matchers and masks of rank 0 (gw_grammar.h). */
#include "gpu_worker/gw_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/tg_err.h"
#include "common/base/tg_log.h"
#include "common/grammar/gm_spec.h"
#include "common/tok/tok_tokenizer.h"

/* The process's compiled grammars: enough distinct schemas for a busy
 * server's working set; the bytes bound keeps a flood of large schemas
 * from holding more than a bounded share of host memory. */
#define GRAMMAR_CACHE_ENTRIES 64
#define GRAMMAR_CACHE_BYTES ((size_t)1 << 30)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int gw_grammar_init(struct gw_grammar *g, const char *model_dir, int vocab,
                    int max_slots)
{
    memset(g, 0, sizeof(*g));
    g->model_dir = strdup(model_dir != NULL ? model_dir : "");
    g->vocab = vocab;
    g->words = ((size_t)vocab + 31) / 32;
    g->max_slots = max_slots;
    g->slots = calloc((size_t)max_slots, sizeof(*g->slots));
    pthread_mutex_init(&g->jobs_mu, NULL);
    pthread_cond_init(&g->jobs_cv, NULL);
    return g->slots != NULL && g->model_dir != NULL ? 0 : TG_ENOMEM;
}

void gw_grammar_free(struct gw_grammar *g)
{
    if (g->slots == NULL && g->model_dir == NULL)
        return; /* zeroed */
    for (int i = 0; g->slots != NULL && i < g->max_slots; i++) {
        gw_grammar_slot_clear(g, (uint32_t)i);
        free(g->slots[i].mask);
        free(g->slots[i].replay);
    }
    /* The helper threads use the cache: it outlives them. */
    pthread_mutex_lock(&g->jobs_mu);
    while (g->jobs > 0)
        pthread_cond_wait(&g->jobs_cv, &g->jobs_mu);
    pthread_mutex_unlock(&g->jobs_mu);
    pthread_mutex_destroy(&g->jobs_mu);
    pthread_cond_destroy(&g->jobs_cv);
    free(g->slots);
    free(g->model_dir);
    if (g->loaded == 1) {
        gm_cache_free(&g->cache);
        gm_vocab_free(&g->v);
    }
    memset(g, 0, sizeof(*g));
}

/* The vocabulary and the cache, on the first constrained request (a
 * worker that never sees one never reads the tokenizer). */
static int load(struct gw_grammar *g)
{
    if (g->loaded != 0)
        return g->loaded == 1 ? 0 : TG_EINVAL;
    struct tok_tokenizer tok = {0};
    char err[224];
    double t0 = now_s();
    int rc = tok_tokenizer_load(&tok, g->model_dir, err, sizeof(err));
    if (rc == 0) {
        rc = gm_vocab_init(&g->v, &tok, err, sizeof(err));
        tok_tokenizer_free(&tok);
    }
    if (rc == 0 && gm_vocab_mask_words(&g->v) > g->words)
        g->words = gm_vocab_mask_words(&g->v); /* more ids than logits */
    if (rc == 0) {
        rc = gm_cache_init(&g->cache, &g->v, NULL, GRAMMAR_CACHE_ENTRIES,
                           GRAMMAR_CACHE_BYTES);
        if (rc != 0) {
            gm_vocab_free(&g->v);
            snprintf(err, sizeof(err), "out of memory");
        }
    }
    if (rc != 0) {
        g->loaded = -1;
        snprintf(g->load_err, sizeof(g->load_err),
                 "structured outputs are unavailable: the vocabulary of %.100s "
                 "could not be read (%.200s)",
                 g->model_dir, err);
        log_err("%s", g->load_err);
        return rc;
    }
    g->loaded = 1;
    log_info("structured outputs: vocabulary of %d ids read in %.3f s",
             (int)g->v.n_ids, now_s() - t0);
    return 0;
}

/* One grammar fetched on a helper thread for one slot. Two references:
 * the thread's and the slot's (dropped by resolve or a clear); the last
 * frees it. */
struct gw_gjob {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int done; /* the fetch ended: gr or rc/err set */
    struct gw_grammar *g;
    char *spec;
    size_t len;
    struct gm_grammar *gr; /* one reference, until taken */
    int rc;
    char err[GW_GRAMMAR_ERR_MAX - 64];
    double seconds; /* the fetch's */
};

static void job_release(struct gw_gjob *j)
{
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0)
        return;
    gm_grammar_unref(j->gr);
    free(j->spec);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void *job_main(void *arg)
{
    struct gw_gjob *j = arg;
    struct gw_grammar *g = j->g;
    struct gm_grammar *gr = NULL;
    char err[sizeof(j->err)];
    double t0 = now_s();
    int rc = gm_cache_get(&g->cache, j->spec, j->len, &gr, err, sizeof(err));
    pthread_mutex_lock(&j->mu);
    j->gr = gr;
    j->rc = rc;
    memcpy(j->err, err, sizeof(err));
    j->seconds = now_s() - t0;
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_release(j);
    pthread_mutex_lock(&g->jobs_mu);
    g->jobs--;
    pthread_cond_broadcast(&g->jobs_cv);
    pthread_mutex_unlock(&g->jobs_mu);
    return NULL;
}

void gw_grammar_slot_clear(struct gw_grammar *g, uint32_t slot)
{
    struct gw_gslot *s = &g->slots[slot];
    if (s->job != NULL)
        job_release(s->job); /* its thread finishes and frees it */
    s->job = NULL;
    s->n_replay = 0;
    if (s->on)
        gm_matcher_free(&s->m);
    s->on = 0;
    s->ready = 0;
    gw_callwatch_free(&s->watch);
    s->free_text = 0;
    s->err[0] = '\0';
}

/* Accepts one token into the slot's state machine (gw_grammar.h):
 * constrained, the matcher takes it, and a complete call of a triggered
 * spec that is not anchored frees the slot again; free, its bytes go to
 * the trigger watch, and a trigger starts the matcher on the bytes from
 * the trigger's first byte. Returns 0, TG_EDONE (EOS after the end), or
 * an error: the matcher's code, with s->err set when the reason is more
 * than "the token breaks the constraint". */
static int step(struct gw_grammar *g, struct gw_gslot *s, int32_t token)
{
    s->ready = 0;
    if (!s->free_text) {
        int rc = gm_matcher_accept_token(&s->m, token);
        if (rc == 0 && s->watch.trigger != NULL && !s->watch.anchored &&
            gm_matcher_is_finished(&s->m)) {
            s->free_text = 1; /* the call is complete: free text again */
            gw_callwatch_reset(&s->watch);
        }
        return rc;
    }
    size_t n = 0;
    const uint8_t *b = gm_vocab_token(&g->v, token, &n);
    if (b == NULL || n == 0)
        return 0; /* EOS or a special token: no text to watch */
    const uint8_t *call = NULL;
    size_t n_call = 0;
    int rc = gw_callwatch_feed(&s->watch, b, n, &call, &n_call);
    if (rc == TG_ENOMEM)
        snprintf(s->err, sizeof(s->err), "out of memory for a constraint");
    if (rc <= 0)
        return rc;
    gm_matcher_reset(&s->m);
    rc = gm_matcher_accept_bytes(&s->m, call, n_call);
    if (rc != 0) {
        snprintf(s->err, sizeof(s->err),
                 "token %d starts a tool call with bytes the strict tools' "
                 "grammar rejects (\"%.*s\"): the call cannot be kept to "
                 "its schema",
                 (int)token, (int)(n_call < 80 ? n_call : 80),
                 (const char *)call);
        return TG_EINVAL;
    }
    s->free_text = 0;
    if (!s->watch.anchored && gm_matcher_is_finished(&s->m)) {
        s->free_text = 1;
        gw_callwatch_reset(&s->watch);
    }
    return 0;
}

/* The slot's grammar once fetched (waiting for it when `wait`; else only
 * if done): the matcher, then the replayed tokens. */
static void resolve(struct gw_grammar *g, uint32_t slot, int wait)
{
    struct gw_gslot *s = &g->slots[slot];
    struct gw_gjob *j = s->job;
    if (j == NULL)
        return;
    double t0 = now_s();
    pthread_mutex_lock(&j->mu);
    if (!j->done && !wait) {
        pthread_mutex_unlock(&j->mu);
        return;
    }
    int waited = !j->done;
    while (!j->done)
        pthread_cond_wait(&j->cv, &j->mu);
    struct gm_grammar *gr = j->gr;
    j->gr = NULL;
    int rc = j->rc;
    double secs = j->seconds;
    if (rc != 0)
        snprintf(s->err, sizeof(s->err),
                 "the output constraint cannot be "
                 "compiled: %s",
                 j->err);
    pthread_mutex_unlock(&j->mu);
    s->job = NULL;
    job_release(j);
    g->st.compiles++;
    if (waited) {
        g->st.compile_waits++;
        g->st.compile_wait_s += now_s() - t0;
    }
    if (secs > 0.05)
        log_info("slot %u: grammar ready in %.3f s (the draw waited %.3f s)",
                 slot, secs, waited ? now_s() - t0 : 0.0);
    if (rc != 0)
        return;
    rc = gm_matcher_init(&s->m, gr);
    gm_grammar_unref(gr); /* the matcher holds its own reference */
    if (rc != 0) {
        snprintf(s->err, sizeof(s->err), "out of memory for a matcher");
        return;
    }
    s->on = 1;
    for (size_t i = 0; i < s->n_replay; i++) {
        rc = step(g, s, (int32_t)s->replay[i]);
        if (rc != 0 && rc != TG_EDONE) {
            gm_matcher_free(&s->m);
            s->on = 0;
            if (s->err[0] == '\0')
                snprintf(s->err, sizeof(s->err),
                         "generated token %zu (id %u) "
                         "does not follow the output constraint",
                         i, s->replay[i]);
            return;
        }
    }
}

int gw_grammar_slot_start(struct gw_grammar *g, uint32_t slot, const char *spec,
                          size_t len, const uint32_t *tokens, size_t n)
{
    gw_grammar_slot_clear(g, slot);
    struct gw_gslot *s = &g->slots[slot];
    int rc = load(g);
    if (rc != 0) {
        snprintf(s->err, sizeof(s->err), "%s", g->load_err);
        return rc;
    }
    if (s->mask == NULL)
        s->mask = malloc(g->words * sizeof(uint32_t));
    if (n > s->cap_replay) {
        uint32_t *r = realloc(s->replay, n * sizeof(uint32_t));
        if (r != NULL) {
            s->replay = r;
            s->cap_replay = n;
        }
    }
    struct gw_gjob *j = calloc(1, sizeof(*j));
    char *copy = malloc(len + 1);
    if (s->mask == NULL || n > s->cap_replay || j == NULL || copy == NULL) {
        free(j);
        free(copy);
        snprintf(s->err, sizeof(s->err), "out of memory for a constraint");
        return TG_ENOMEM;
    }
    char *trig = NULL;
    int anchored = 0;
    rc = gm_spec_trigger(spec, len, &trig, &anchored);
    if (rc == 0 && trig != NULL) {
        rc = gw_callwatch_init(&s->watch, trig, strlen(trig), anchored);
        s->free_text = 1;
    }
    free(trig);
    if (rc != 0) {
        free(j);
        free(copy);
        gw_callwatch_free(&s->watch);
        s->free_text = 0;
        snprintf(s->err, sizeof(s->err), "%s",
                 rc == TG_ENOMEM ? "out of memory for a constraint"
                                 : "the output constraint is not valid JSON");
        return rc;
    }
    if (n > 0)
        memcpy(s->replay, tokens, n * sizeof(uint32_t));
    s->n_replay = n;
    memcpy(copy, spec, len);
    copy[len] = '\0';
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->g = g;
    j->spec = copy;
    j->len = len;
    s->job = j;
    pthread_mutex_lock(&g->jobs_mu);
    g->jobs++;
    pthread_mutex_unlock(&g->jobs_mu);
    pthread_attr_t at;
    pthread_t th;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&th, &at, job_main, j);
    pthread_attr_destroy(&at);
    if (rc != 0)
        job_main(j); /* no thread to be had: fetch it here */
    return 0;
}

const char *gw_grammar_slot_error(struct gw_grammar *g, uint32_t slot)
{
    resolve(g, slot, 1);
    return g->slots[slot].err[0] != '\0' ? g->slots[slot].err : NULL;
}

/* Computes the slot's mask; the EOS ids alone once EOS was accepted. */
static int fill(struct gw_grammar *g, struct gw_gslot *s)
{
    double t0 = now_s();
    int rc = gm_matcher_fill_mask(&s->m, s->mask, g->words);
    if (rc == TG_EDONE) {
        memset(s->mask, 0, g->words * sizeof(uint32_t));
        for (int k = 0; k < g->v.n_eos; k++)
            s->mask[g->v.eos[k] >> 5] |= 1u << (g->v.eos[k] & 31);
        rc = 0;
    }
    if (rc != 0) {
        snprintf(s->err, sizeof(s->err), "the token mask failed (%s)",
                 tg_strerror(rc));
        return rc;
    }
    s->ready = 1;
    g->st.masks++;
    g->st.mask_s += now_s() - t0;
    return 0;
}

const uint32_t *gw_grammar_slot_mask(struct gw_grammar *g, uint32_t slot)
{
    struct gw_gslot *s = &g->slots[slot];
    resolve(g, slot, 1);
    if (!s->on || s->err[0] != '\0' || s->free_text)
        return NULL;
    if (!s->ready) {
        double t0 = now_s();
        if (fill(g, s) != 0)
            return NULL;
        g->st.waits++;
        g->st.wait_s += now_s() - t0;
    }
    return s->mask;
}

int gw_grammar_slot_accept(struct gw_grammar *g, uint32_t slot, int32_t token)
{
    struct gw_gslot *s = &g->slots[slot];
    resolve(g, slot, 1);
    if (!s->on || s->err[0] != '\0')
        return 0;
    int rc = step(g, s, token);
    if (rc == TG_EDONE)
        return 0; /* EOS again after the end: the mask allowed only EOS */
    if (rc != 0 && s->err[0] != '\0')
        return TG_EINVAL; /* the reason is kept */
    if (rc != 0) {
        snprintf(s->err, sizeof(s->err),
                 "slot %u: token %d breaks the "
                 "output constraint",
                 slot, (int)token);
        return TG_EINVAL;
    }
    return 0;
}

void gw_grammar_prepare(struct gw_grammar *g)
{
    for (int i = 0; i < g->max_slots; i++) {
        struct gw_gslot *s = &g->slots[i];
        resolve(g, (uint32_t)i, 0);
        if (s->on && !s->ready && s->err[0] == '\0' && !s->free_text)
            (void)fill(g, s);
    }
}

void gw_grammar_log_stats(const struct gw_grammar *g)
{
    const struct gw_grammar_stats *st = &g->st;
    if (st->draws == 0)
        return;
    log_info("structured outputs: %llu constrained draws, %llu masks of "
             "%.1f us on average; draws waited for %llu masks, %.3f ms in "
             "all (%.2f us per draw); %llu grammars fetched beside the "
             "steps, draws waited for %llu of them, %.3f s in all",
             (unsigned long long)st->draws, (unsigned long long)st->masks,
             st->masks > 0 ? st->mask_s * 1e6 / (double)st->masks : 0.0,
             (unsigned long long)st->waits, st->wait_s * 1e3,
             st->wait_s * 1e6 / (double)st->draws,
             (unsigned long long)st->compiles,
             (unsigned long long)st->compile_waits, st->compile_wait_s);
}
