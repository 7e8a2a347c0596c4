/* gw_grammar.c — per-slot matchers and masks of rank 0 (gw_grammar.h). */
#include "gpu_worker/serve/gw_grammar.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"
#include "common/base/tg_log.h"
#include "common/grammar/gm_spec.h"
#include "common/tok/tok_tokenizer.h"

/* The process's compiled grammars: enough distinct schemas for a busy
 * server's working set; the bytes bound keeps a flood of large schemas
 * from holding more than a bounded share of host memory. */
#define GRAMMAR_CACHE_ENTRIES 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One job of the pool: a prepare's grammar fetched, or (spec NULL) the
 * vocabulary's load alone. References: the pool's while queued, running
 * or on the done list, and the pin's while it fetches (dropped when the
 * outcome is taken or the pin is released); the last frees it. */
enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct gw_gjob {
    struct gw_gjob *next; /* in the queue or the done list; under pool_mu */
    int state;            /* JOB_*; under pool_mu */
    uint64_t pin;
    pthread_mutex_t mu; /* guards refs */
    int refs;
    struct gw_grammar *g;
    char *spec; /* NULL: the vocabulary's load alone */
    size_t len;
    /* The outcome, written by the pool thread before the job goes on the
     * done list (pool_mu orders it before the main thread reads it). */
    struct gm_grammar *gr; /* one reference, until taken */
    int rc;
    int no_vocab; /* rc is the vocabulary's failure (g->load_err) */
    char err[GW_GRAMMAR_ERR_MAX - 64];
    char *trigger; /* a triggered spec's trigger (owned), or NULL */
    int anchored;
    double seconds; /* the fetch's, the wait for the vocabulary included */
};

/* A prepared grammar, pinned under the router's id: fetching while job
 * is set, ready once gr is. */
struct gw_gpin {
    uint64_t id;
    struct gw_gjob *job;   /* the fetch in flight (one reference), or NULL */
    struct gm_grammar *gr; /* ready: one reference */
    char *spec;            /* owned: the entries must name this text */
    size_t len;
    char *trigger; /* a triggered spec's trigger (owned), or NULL */
    int anchored;
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
    free(j->trigger);
    pthread_mutex_destroy(&j->mu);
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
        if (g->compile_s > 0)
            lim.max_compile_s = g->compile_s;
        if (lim.max_cache_bytes > g->cache_bytes / 2)
            lim.max_cache_bytes = g->cache_bytes / 2;
        rc = gm_cache_init(&g->cache, &g->v, &lim, GRAMMAR_CACHE_ENTRIES,
                           g->cache_bytes);
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

/* Fetches j's grammar (after the vocabulary) and reads its trigger. */
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
    if (rc == 0 && j->spec != NULL) {
        /* The slot's start then parses no JSON on the step path. */
        rc = gm_spec_trigger(j->spec, j->len, &j->trigger, &j->anchored);
        if (rc != 0) {
            gm_grammar_unref(gr);
            gr = NULL;
            snprintf(err, sizeof(err), "%s",
                     rc == TG_ENOMEM ? "out of memory for a constraint"
                                     : "the spec's trigger is not valid");
        }
    }
    j->gr = gr;
    j->rc = rc;
    j->no_vocab = no_vocab;
    memcpy(j->err, err, sizeof(err));
    j->seconds = now_s() - t0;
}

/* Wakes the worker's poll loop: a fetch ended. */
static void poke(struct gw_grammar *g)
{
    uint64_t one = 1;
    ssize_t w = write(g->efd, &one, sizeof(one));
    (void)w; /* a full counter is readable too */
}

static void *pool_main(void *arg)
{
    struct gw_grammar *g = arg;
    /* Compiles are background work: the step loop's threads mostly come
     * first when the cores are short (Linux nice is per thread, and the
     * OpenMP threads a compile starts inherit it). Failing that, they
     * compete. */
    id_t tid = (id_t)syscall(SYS_gettid);
    if (setpriority(PRIO_PROCESS, tid, GW_GRAMMAR_NICE) != 0)
        log_debug("structured outputs: compile thread at normal priority "
                  "(%s)",
                  strerror(errno));
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
            g->on_job(g->on_job_arg, j->pin, g->running);
        pthread_mutex_unlock(&g->pool_mu);
        job_run(g, j);
        pthread_mutex_lock(&g->pool_mu);
        j->state = JOB_DONE;
        g->running--;
        if (j->spec == NULL) {
            pthread_mutex_unlock(&g->pool_mu);
            job_release(j); /* the pool's reference */
            pthread_mutex_lock(&g->pool_mu);
            continue;
        }
        /* A prepare: the pool's reference goes to the done list, for the
         * main thread to report between steps. */
        j->next = NULL;
        if (g->d_tail != NULL)
            g->d_tail->next = j;
        else
            g->d_head = j;
        g->d_tail = j;
        poke(g);
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

static struct gw_gjob *job_new(struct gw_grammar *g, uint64_t pin,
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
    j->refs = refs;
    j->g = g;
    j->pin = pin;
    j->spec = copy;
    j->len = len;
    return j;
}

int gw_grammar_init(struct gw_grammar *g, const char *model_dir, int vocab,
                    int max_slots, size_t cache_bytes)
{
    memset(g, 0, sizeof(*g));
    g->cache_bytes = cache_bytes > 0 ? cache_bytes : GW_GRAMMAR_CACHE_BYTES;
    g->token_work = GW_GRAMMAR_TOKEN_WORK;
    g->token_s = GW_GRAMMAR_TOKEN_S;
    g->compile_s = GM_LIMIT_COMPILE_S;
    g->efd = -1;
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
    g->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->efd < 0) {
        log_err("structured outputs: eventfd: %s", strerror(errno));
        return TG_EIO;
    }
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

static void pin_free(struct gw_grammar *g, struct gw_gpin *p)
{
    if (p->job != NULL) {
        if (pool_cancel(g, p->job)) {
            job_release(p->job); /* the pool's: it never ran */
            g->st.cancelled++;
        }
        job_release(p->job); /* a running job's thread frees it */
    }
    gm_grammar_unref(p->gr);
    free(p->spec);
    free(p->trigger);
    free(p);
}

int gw_grammar_shutdown(struct gw_grammar *g, int ms)
{
    if ((g->slots == NULL && g->model_dir == NULL) || g->abandoned)
        return 0;
    pthread_mutex_lock(&g->pool_mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->pool_cv);
    pthread_mutex_unlock(&g->pool_mu);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    int busy = 0;
    for (int i = 0; i < g->n_threads; i++) {
        if (pthread_timedjoin_np(g->threads[i], NULL, &dl) != 0) {
            pthread_detach(g->threads[i]);
            busy = 1;
        }
    }
    if (busy) {
        g->abandoned = 1; /* the detached threads keep using *g */
        log_info("structured outputs: a vocabulary load or compile is still "
                 "running at exit: left to end with the process");
        return TG_EBUSY;
    }
    g->n_threads = 0; /* joined */
    gw_grammar_free(g);
    return 0;
}

void gw_grammar_free(struct gw_grammar *g)
{
    if ((g->slots == NULL && g->model_dir == NULL) || g->abandoned)
        return; /* zeroed, or left to running threads */
    for (int i = 0; g->slots != NULL && i < g->max_slots; i++) {
        gw_grammar_slot_clear(g, (uint32_t)i);
        free(g->slots[i].mask);
    }
    for (size_t i = 0; i < g->n_pins; i++)
        pin_free(g, g->pins[i]);
    free(g->pins);
    free(g->refused);
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
    while (g->d_head != NULL) { /* ended fetches never taken */
        struct gw_gjob *j = g->d_head;
        g->d_head = j->next;
        job_release(j);
    }
    pthread_mutex_destroy(&g->pool_mu);
    pthread_cond_destroy(&g->pool_cv);
    if (g->efd >= 0)
        close(g->efd);
    free(g->slots);
    free(g->model_dir);
    if (g->loaded == 1) {
        gm_cache_free(&g->cache);
        gm_vocab_free(&g->v);
    }
    memset(g, 0, sizeof(*g));
}

/* ---- pins ----------------------------------------------------------------- */

/* The index of the first pin whose id is >= id (binary search). */
static size_t pin_index(const struct gw_grammar *g, uint64_t id)
{
    size_t lo = 0, hi = g->n_pins;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->pins[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct gw_gpin *pin_find(const struct gw_grammar *g, uint64_t id)
{
    size_t i = pin_index(g, id);
    return i < g->n_pins && g->pins[i]->id == id ? g->pins[i] : NULL;
}

static void pin_remove(struct gw_grammar *g, uint64_t id)
{
    size_t i = pin_index(g, id);
    if (i >= g->n_pins || g->pins[i]->id != id)
        return;
    struct gw_gpin *p = g->pins[i];
    memmove(&g->pins[i], &g->pins[i + 1],
            (g->n_pins - i - 1) * sizeof(g->pins[0]));
    g->n_pins--;
    pin_free(g, p);
}

/* A prepare refused at once: its outcome waits for the next take. */
static void refuse(struct gw_grammar *g, uint64_t id, int busy, const char *why)
{
    g->st.failed++;
    if (TG_GROW(g->refused, &g->cap_refused, g->n_refused + 1) != 0) {
        /* The router then waits for this id until the client leaves or
         * the worker restarts: logged, as nothing better is possible
         * without memory. */
        log_err("structured outputs: prepare %llu refused (%s) and no "
                "memory to report it",
                (unsigned long long)id, why);
        return;
    }
    struct gw_gready *r = &g->refused[g->n_refused++];
    r->id = id;
    r->ok = 0;
    r->busy = busy;
    snprintf(r->error, sizeof(r->error), "%s", why);
}

void gw_grammar_pin(struct gw_grammar *g, uint64_t id, const char *spec,
                    size_t len)
{
    g->st.prepares++;
    if (pin_find(g, id) != NULL) {
        refuse(g, id, 0, "this prepare id is held already (protocol error)");
        return;
    }
    pthread_mutex_lock(&g->pool_mu);
    int loaded = g->loaded, queued = g->queued;
    pthread_mutex_unlock(&g->pool_mu);
    if (loaded == -1) { /* load_err is final */
        refuse(g, id, 0, g->load_err);
        return;
    }
    if (queued >= GW_GRAMMAR_QUEUE) {
        g->st.rejected++;
        char why[160];
        snprintf(why, sizeof(why),
                 "too many output constraints compiling (%d waiting for "
                 "the worker's %d compile threads): retry later",
                 queued, GW_GRAMMAR_POOL);
        refuse(g, id, 1, why);
        return;
    }
    struct gw_gpin *p = calloc(1, sizeof(*p));
    char *copy = malloc(len + 1);
    struct gw_gjob *j = job_new(g, id, spec, len, 2);
    if (p == NULL || copy == NULL || j == NULL ||
        TG_GROW(g->pins, &g->cap_pins, g->n_pins + 1) != 0) {
        free(p);
        free(copy);
        if (j != NULL) {
            job_release(j);
            job_release(j);
        }
        refuse(g, id, 0, "out of memory for a constraint");
        return;
    }
    if (len > 0)
        memcpy(copy, spec, len);
    copy[len] = '\0';
    p->id = id;
    p->spec = copy;
    p->len = len;
    p->job = j;
    size_t at = pin_index(g, id);
    memmove(&g->pins[at + 1], &g->pins[at],
            (g->n_pins - at) * sizeof(g->pins[0]));
    g->pins[at] = p;
    g->n_pins++;
    pool_push(g, j);
}

void gw_grammar_unpin(struct gw_grammar *g, uint64_t id)
{
    pin_remove(g, id);
}

int gw_grammar_fd(const struct gw_grammar *g)
{
    return g->slots != NULL ? g->efd : -1;
}

size_t gw_grammar_pins(const struct gw_grammar *g)
{
    return g->n_pins;
}

/* The ended fetch j of a pin that still waits for it: ready, or reported
 * failed and forgotten. Fills *out. */
static void pin_ended(struct gw_grammar *g, struct gw_gpin *p,
                      struct gw_gjob *j, struct gw_gready *out)
{
    out->id = p->id;
    out->busy = 0;
    out->error[0] = '\0';
    g->st.fetched++;
    g->st.fetch_s += j->seconds;
    if (j->seconds > 0.05)
        log_info("structured outputs: prepare %llu ready in %.3f s beside "
                 "the steps",
                 (unsigned long long)p->id, j->seconds);
    if (j->rc != 0) {
        out->ok = 0;
        g->st.failed++;
        if (j->no_vocab) /* load_err was set before the job ended */
            snprintf(out->error, sizeof(out->error), "%s", g->load_err);
        else
            snprintf(out->error, sizeof(out->error),
                     "the output constraint cannot be compiled: %s", j->err);
        pin_remove(g, p->id); /* drops the pin's reference to j */
        return;
    }
    out->ok = 1;
    p->gr = j->gr; /* the job's reference moves to the pin */
    j->gr = NULL;
    p->trigger = j->trigger;
    j->trigger = NULL;
    p->anchored = j->anchored;
    p->job = NULL;
    job_release(j); /* the pin's */
}

size_t gw_grammar_take_ready(struct gw_grammar *g, struct gw_gready *out,
                             size_t cap)
{
    if (g->slots == NULL)
        return 0;
    uint64_t cnt;
    ssize_t r = read(g->efd, &cnt, sizeof(cnt)); /* resets the counter */
    (void)r;
    size_t n = 0;
    size_t k = g->n_refused < cap ? g->n_refused : cap;
    if (k > 0) { /* refused may still be NULL: memcpy(NULL, 0) is UB */
        memcpy(out, g->refused, k * sizeof(*out));
        memmove(g->refused, g->refused + k,
                (g->n_refused - k) * sizeof(*g->refused));
        g->n_refused -= k;
    }
    n = k;
    while (n < cap) {
        pthread_mutex_lock(&g->pool_mu);
        struct gw_gjob *j = g->d_head;
        if (j != NULL) {
            g->d_head = j->next;
            if (g->d_head == NULL)
                g->d_tail = NULL;
        }
        pthread_mutex_unlock(&g->pool_mu);
        if (j == NULL)
            break;
        struct gw_gpin *p = pin_find(g, j->pin);
        if (p != NULL && p->job == j)
            pin_ended(g, p, j, &out[n++]);
        /* else released meanwhile: nothing to report */
        job_release(j); /* the pool's reference, from the done list */
    }
    return n;
}

/* ---- slots ---------------------------------------------------------------- */

void gw_grammar_slot_clear(struct gw_grammar *g, uint32_t slot)
{
    struct gw_gslot *s = &g->slots[slot];
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
/* Keeps the reason of a matcher call over its budget; returns rc. */
static int over_budget(struct gw_grammar *g, struct gw_gslot *s, int rc,
                       const char *what)
{
    if (rc != TG_ETIMEDOUT)
        return rc;
    g->st.over_budget++;
    snprintf(s->err, sizeof(s->err),
             "output_constraint_too_complex: the output constraint needed "
             "more matching work for one %s "
             "than its budget (%llu units, %.0f ms): the schema is too "
             "ambiguous to follow token by token",
             what, (unsigned long long)g->token_work, g->token_s * 1e3);
    return rc;
}

static int step(struct gw_grammar *g, struct gw_gslot *s, int32_t token)
{
    s->ready = 0;
    if (!s->free_text) {
        int rc = over_budget(g, s, gm_matcher_accept_token(&s->m, token),
                             "token");
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
    if (over_budget(g, s, rc, "tool call's start") == TG_ETIMEDOUT)
        return rc;
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

int gw_grammar_slot_start(struct gw_grammar *g, uint32_t slot, uint64_t pin,
                          const char *spec, size_t len, const uint32_t *tokens,
                          size_t n)
{
    gw_grammar_slot_clear(g, slot);
    struct gw_gslot *s = &g->slots[slot];
    struct gw_gpin *p = pin_find(g, pin);
    if (p == NULL || p->gr == NULL) {
        /* The router plans a constrained request only once its prepare
         * was reported ready: this is its error, and costs this request
         * alone, never a wait. */
        g->st.unpinned++;
        snprintf(s->err, sizeof(s->err),
                 "the output constraint was not prepared on this worker "
                 "(prepare %llu %s): protocol error",
                 (unsigned long long)pin,
                 p == NULL ? "unknown" : "still compiling");
        return TG_EPROTO;
    }
    if (spec != NULL && (len != p->len || memcmp(spec, p->spec, len) != 0)) {
        g->st.unpinned++;
        snprintf(s->err, sizeof(s->err),
                 "the plan names prepare %llu with another output "
                 "constraint: protocol error",
                 (unsigned long long)pin);
        return TG_EPROTO;
    }
    int rc = 0;
    if (p->trigger != NULL) {
        rc = gw_callwatch_init(&s->watch, p->trigger, strlen(p->trigger),
                               p->anchored);
        s->free_text = 1;
    }
    if (rc == 0 && s->mask == NULL) /* g->words is final once pinned */
        s->mask = malloc(g->words * sizeof(uint32_t));
    if (rc == 0)
        rc = s->mask != NULL ? gm_matcher_init(&s->m, p->gr) : TG_ENOMEM;
    if (rc == 0)
        gm_matcher_set_budget(&s->m, g->token_work, g->token_s);
    if (rc != 0) {
        gw_callwatch_free(&s->watch);
        s->free_text = 0;
        snprintf(s->err, sizeof(s->err), "out of memory for a matcher");
        return TG_ENOMEM;
    }
    s->on = 1;
    for (size_t i = 0; i < n; i++) {
        rc = step(g, s, (int32_t)tokens[i]);
        if (rc != 0 && rc != TG_EDONE) {
            gm_matcher_free(&s->m);
            s->on = 0;
            if (s->err[0] == '\0')
                snprintf(s->err, sizeof(s->err),
                         "generated token %zu (id %u) "
                         "does not follow the output constraint",
                         i, tokens[i]);
            return TG_EINVAL;
        }
    }
    return 0;
}

const char *gw_grammar_slot_error(struct gw_grammar *g, uint32_t slot)
{
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
    if (over_budget(g, s, rc, "token mask") == TG_ETIMEDOUT)
        return rc;
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
        if (s->on && !s->ready && s->err[0] == '\0' && !s->free_text)
            (void)fill(g, s);
    }
}

void gw_grammar_log_stats(const struct gw_grammar *g)
{
    const struct gw_grammar_stats *st = &g->st;
    if (st->prepares == 0)
        return;
    log_info("structured outputs: %llu constrained draws, %llu masks of "
             "%.1f us on average; draws waited for %llu masks, %.3f ms in "
             "all (%.2f us per draw); %llu prepares, %llu grammars fetched "
             "beside the steps (%.3f s on average), %llu failed, %llu "
             "cancelled, %llu refused (queue full), %llu starts unprepared, "
             "%llu requests over the matching budget",
             (unsigned long long)st->draws, (unsigned long long)st->masks,
             st->masks > 0 ? st->mask_s * 1e6 / (double)st->masks : 0.0,
             (unsigned long long)st->waits, st->wait_s * 1e3,
             st->draws > 0 ? st->wait_s * 1e6 / (double)st->draws : 0.0,
             (unsigned long long)st->prepares, (unsigned long long)st->fetched,
             st->fetched > 0 ? st->fetch_s / (double)st->fetched : 0.0,
             (unsigned long long)st->failed, (unsigned long long)st->cancelled,
             (unsigned long long)st->rejected, (unsigned long long)st->unpinned,
             (unsigned long long)st->over_budget);
}
