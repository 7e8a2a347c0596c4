/* gw_grammar.c — per-slot matchers and masks of rank 0 (gw_grammar.h). */
#include "gpu_worker/gw_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* One job of the pool: a slot's grammar fetched, or (slot NULL-spec) the
 * vocabulary's load alone. References: the pool's while queued or
 * running, and the slot's (dropped by resolve or a clear); the last frees
 * it. */
enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct gw_gjob {
    struct gw_gjob *next; /* in the queue; under pool_mu */
    int state;            /* JOB_*; under pool_mu until done */
    uint32_t slot;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int done; /* the fetch ended: gr or rc/err set */
    struct gw_grammar *g;
    char *spec; /* NULL: the vocabulary's load alone */
    size_t len;
    struct gm_grammar *gr; /* one reference, until taken */
    int rc;
    int no_vocab; /* rc is the vocabulary's failure (g->load_err) */
    char err[GW_GRAMMAR_ERR_MAX - 64];
    double seconds; /* the fetch's, the wait for the vocabulary included */
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

/* The vocabulary and the cache, read once on a pool thread. Returns 0 or
 * the failure's code with g->load_err set. */
static int load(struct gw_grammar *g)
{
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
        struct gm_limits lim;
        gm_limits_default(&lim);
        lim.threads = g->omp_threads;
        rc = gm_cache_init(&g->cache, &g->v, &lim, GRAMMAR_CACHE_ENTRIES,
                           GRAMMAR_CACHE_BYTES);
        if (rc != 0) {
            gm_vocab_free(&g->v);
            snprintf(err, sizeof(err), "out of memory");
        }
    }
    if (rc != 0) {
        snprintf(g->load_err, sizeof(g->load_err),
                 "structured outputs are unavailable: the vocabulary of %.100s "
                 "could not be read (%.200s)",
                 g->model_dir, err);
        log_warn("%s", g->load_err);
        return rc;
    }
    log_info("structured outputs: vocabulary of %d ids read in %.3f s on the "
             "compile pool",
             (int)g->v.n_ids, now_s() - t0);
    return 0;
}

/* The vocabulary, loading it if no pool thread has yet (the others wait
 * for that one). Returns 0 or TG_EINVAL (g->load_err says why). */
static int pool_vocab(struct gw_grammar *g)
{
    pthread_mutex_lock(&g->pool_mu);
    while (g->loading)
        pthread_cond_wait(&g->pool_cv, &g->pool_mu);
    if (g->loaded != 0) {
        int rc = g->loaded == 1 ? 0 : TG_EINVAL;
        pthread_mutex_unlock(&g->pool_mu);
        return rc;
    }
    g->loading = 1;
    pthread_mutex_unlock(&g->pool_mu);
    int rc = load(g);
    pthread_mutex_lock(&g->pool_mu);
    g->loaded = rc == 0 ? 1 : -1;
    g->loading = 0;
    pthread_cond_broadcast(&g->pool_cv);
    pthread_mutex_unlock(&g->pool_mu);
    return rc == 0 ? 0 : TG_EINVAL;
}

static void job_run(struct gw_grammar *g, struct gw_gjob *j)
{
    struct gm_grammar *gr = NULL;
    char err[sizeof(j->err)];
    err[0] = '\0';
    double t0 = now_s();
    int rc = pool_vocab(g);
    int no_vocab = rc != 0;
    if (rc == 0 && j->spec != NULL)
        rc = gm_cache_get(&g->cache, j->spec, j->len, &gr, err, sizeof(err));
    pthread_mutex_lock(&j->mu);
    j->gr = gr;
    j->rc = rc;
    j->no_vocab = no_vocab;
    memcpy(j->err, err, sizeof(err));
    j->seconds = now_s() - t0;
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void *pool_main(void *arg)
{
    struct gw_grammar *g = arg;
    pthread_mutex_lock(&g->pool_mu);
    for (;;) {
        while (!g->stop && (g->hold || g->q_head == NULL))
            pthread_cond_wait(&g->pool_cv, &g->pool_mu);
        if (g->stop)
            break;
        struct gw_gjob *j = g->q_head;
        g->q_head = j->next;
        if (g->q_head == NULL)
            g->q_tail = NULL;
        g->queued--;
        g->running++;
        j->state = JOB_RUNNING;
        if (j->spec != NULL && g->on_job != NULL)
            g->on_job(g->on_job_arg, j->slot, g->running);
        pthread_mutex_unlock(&g->pool_mu);
        job_run(g, j);
        pthread_mutex_lock(&g->pool_mu);
        j->state = JOB_DONE;
        g->running--;
        pthread_mutex_unlock(&g->pool_mu);
        job_release(j); /* the pool's reference */
        pthread_mutex_lock(&g->pool_mu);
    }
    pthread_mutex_unlock(&g->pool_mu);
    return NULL;
}

/* Appends j to the queue (the pool's reference) and wakes a thread. */
static void pool_push(struct gw_grammar *g, struct gw_gjob *j)
{
    pthread_mutex_lock(&g->pool_mu);
    j->state = JOB_QUEUED;
    j->next = NULL;
    if (g->q_tail != NULL)
        g->q_tail->next = j;
    else
        g->q_head = j;
    g->q_tail = j;
    g->queued++;
    pthread_cond_signal(&g->pool_cv);
    pthread_mutex_unlock(&g->pool_mu);
}

/* Takes j out of the queue if it is still there. Returns 1 if it was
 * (the pool's reference is the caller's now). */
static int pool_cancel(struct gw_grammar *g, struct gw_gjob *j)
{
    int out = 0;
    pthread_mutex_lock(&g->pool_mu);
    if (j->state == JOB_QUEUED) {
        struct gw_gjob **pp = &g->q_head, *prev = NULL;
        while (*pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        *pp = j->next;
        if (g->q_tail == j)
            g->q_tail = prev;
        g->queued--;
        j->state = JOB_DONE;
        out = 1;
    }
    pthread_mutex_unlock(&g->pool_mu);
    return out;
}

static struct gw_gjob *job_new(struct gw_grammar *g, uint32_t slot,
                               const char *spec, size_t len, int refs)
{
    struct gw_gjob *j = calloc(1, sizeof(*j));
    char *copy = spec != NULL ? malloc(len + 1) : NULL;
    if (j == NULL || (spec != NULL && copy == NULL)) {
        free(j);
        free(copy);
        return NULL;
    }
    if (spec != NULL) {
        memcpy(copy, spec, len);
        copy[len] = '\0';
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = refs;
    j->g = g;
    j->slot = slot;
    j->spec = copy;
    j->len = len;
    return j;
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
    pthread_mutex_init(&g->pool_mu, NULL);
    pthread_cond_init(&g->pool_cv, NULL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    g->omp_threads = cores > 1 ? (int)((cores - 1) / GW_GRAMMAR_POOL) : 1;
    if (g->omp_threads < 1)
        g->omp_threads = 1;
    if (g->slots == NULL || g->model_dir == NULL)
        return TG_ENOMEM;
    for (int i = 0; i < GW_GRAMMAR_POOL; i++) {
        if (pthread_create(&g->threads[i], NULL, pool_main, g) != 0) {
            log_err("structured outputs: cannot start compile thread %d", i);
            return TG_EAGAIN;
        }
        g->n_threads++;
    }
    return 0;
}

int gw_grammar_preload(struct gw_grammar *g)
{
    struct gw_gjob *j = job_new(g, 0, NULL, 0, 1);
    if (j == NULL)
        return TG_ENOMEM;
    pool_push(g, j);
    return 0;
}

void gw_grammar_hold(struct gw_grammar *g, int hold)
{
    pthread_mutex_lock(&g->pool_mu);
    g->hold = hold;
    pthread_cond_broadcast(&g->pool_cv);
    pthread_mutex_unlock(&g->pool_mu);
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
    /* The pool's threads use the cache: it outlives them. */
    pthread_mutex_lock(&g->pool_mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->pool_cv);
    pthread_mutex_unlock(&g->pool_mu);
    for (int i = 0; i < g->n_threads; i++)
        pthread_join(g->threads[i], NULL);
    while (g->q_head != NULL) { /* a preload never started */
        struct gw_gjob *j = g->q_head;
        g->q_head = j->next;
        job_release(j);
    }
    pthread_mutex_destroy(&g->pool_mu);
    pthread_cond_destroy(&g->pool_cv);
    free(g->slots);
    free(g->model_dir);
    if (g->loaded == 1) {
        gm_cache_free(&g->cache);
        gm_vocab_free(&g->v);
    }
    memset(g, 0, sizeof(*g));
}

void gw_grammar_slot_clear(struct gw_grammar *g, uint32_t slot)
{
    struct gw_gslot *s = &g->slots[slot];
    if (s->job != NULL) {
        if (pool_cancel(g, s->job)) {
            job_release(s->job); /* the pool's: it never ran */
            g->st.cancelled++;
        }
        job_release(s->job); /* a running job's thread frees it */
    }
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
    if (rc != 0 && j->no_vocab) /* load_err was set before the job ended */
        snprintf(s->err, sizeof(s->err), "%s", g->load_err);
    else if (rc != 0)
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
    if (s->mask == NULL) /* g->words is final once the vocabulary is */
        s->mask = malloc(g->words * sizeof(uint32_t));
    rc = s->mask != NULL ? gm_matcher_init(&s->m, gr) : TG_ENOMEM;
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
    pthread_mutex_lock(&g->pool_mu);
    int loaded = g->loaded, queued = g->queued;
    pthread_mutex_unlock(&g->pool_mu);
    if (loaded == -1) { /* load_err is final */
        snprintf(s->err, sizeof(s->err), "%s", g->load_err);
        return TG_EINVAL;
    }
    if (queued >= GW_GRAMMAR_QUEUE) {
        g->st.rejected++;
        snprintf(s->err, sizeof(s->err),
                 "too many output constraints compiling (%d waiting for "
                 "the worker's %d compile threads): retry later",
                 queued, GW_GRAMMAR_POOL);
        return TG_EBUSY;
    }
    char *trig = NULL;
    int anchored = 0;
    int rc = gm_spec_trigger(spec, len, &trig, &anchored);
    if (rc == 0 && trig != NULL) {
        rc = gw_callwatch_init(&s->watch, trig, strlen(trig), anchored);
        s->free_text = 1;
    }
    free(trig);
    if (rc != 0) {
        gw_callwatch_free(&s->watch);
        s->free_text = 0;
        snprintf(s->err, sizeof(s->err), "%s",
                 rc == TG_ENOMEM ? "out of memory for a constraint"
                                 : "the output constraint is not valid JSON");
        return rc;
    }
    if (n > s->cap_replay) {
        uint32_t *r = realloc(s->replay, n * sizeof(uint32_t));
        if (r != NULL) {
            s->replay = r;
            s->cap_replay = n;
        }
    }
    struct gw_gjob *j = n > s->cap_replay ? NULL
                                          : job_new(g, slot, spec, len, 2);
    if (j == NULL) {
        gw_callwatch_free(&s->watch);
        s->free_text = 0;
        snprintf(s->err, sizeof(s->err), "out of memory for a constraint");
        return TG_ENOMEM;
    }
    if (n > 0)
        memcpy(s->replay, tokens, n * sizeof(uint32_t));
    s->n_replay = n;
    s->job = j;
    pool_push(g, j);
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
    log_info(
        "structured outputs: %llu constrained draws, %llu masks of "
        "%.1f us on average; draws waited for %llu masks, %.3f ms in "
        "all (%.2f us per draw); %llu grammars fetched beside the "
        "steps, draws waited for %llu of them, %.3f s in all; %llu "
        "fetches cancelled, %llu refused (queue full)",
        (unsigned long long)st->draws, (unsigned long long)st->masks,
        st->masks > 0 ? st->mask_s * 1e6 / (double)st->masks : 0.0,
        (unsigned long long)st->waits, st->wait_s * 1e3,
        st->wait_s * 1e6 / (double)st->draws, (unsigned long long)st->compiles,
        (unsigned long long)st->compile_waits, st->compile_wait_s,
        (unsigned long long)st->cancelled, (unsigned long long)st->rejected);
}
