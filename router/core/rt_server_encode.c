/* rt_server_encode.c — text and chat prompts to token ids for the router's
 * front ends and the generation path (see rt_server.h), and the jobs the
 * front ends run on libuv's thread pool (rt_pool_job: parsing a large
 * request body, encoding, formatting a large answer). Chat prompts are
 * rendered with the model's own chat template (common/chat/ct_template.h).
 *
 * Encode jobs run the rendering and the tokenization on libuv's thread
 * pool (uv_queue_work; its size is UV_THREADPOOL_SIZE, which the router's
 * --tokenizer-threads sets before the loop starts), so a multi-megabyte
 * prompt never stalls the loop thread: /health, the step loop and every
 * stream keep going while it is encoded. What a worker thread touches:
 * the tokenizer and the template (immutable after load, documented as
 * safe for any number of threads in tok_tokenizer.h, jj_template.h and
 * ct_template.h; each job uses its own scratch, no word cache is shared),
 * the job's inputs (the owner keeps them alive and unmodified until the
 * job's done callback; jansson's reference counts are atomic, so the
 * template taking references to the messages is safe) and the job's
 * outputs. Everything else — the job list, the gauge, the done callback —
 * stays on the loop thread. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/base/tg_err.h"
#include "router/core/rt_server_internal.h"

/* Renders `chat` with s's template into *out; errors into *e. */
static int render_chat(const struct rt_server *s, const struct ct_chat *chat,
                       char **out, size_t *len, struct rt_request_error *e)
{
    char err[512];
    if (!s->have_tmpl) {
        rt_request_error_set(
            e, RT_REQ_ERR_INVALID, "chat_template_unsupported", "messages",
            "this model has no usable chat template: %s", s->tmpl_error);
        return TG_EUNSUPPORTED;
    }
    int rc = ct_template_render_chat(&s->tmpl, chat, out, len, err,
                                     sizeof(err));
    if (rc != 0) {
        const char *code = rc == TG_EUNSUPPORTED ? "chat_template_unsupported"
                           : rc == TG_ETOOBIG    ? "prompt_too_large"
                                                 : "invalid_messages";
        rt_request_error_set(
            e, rc == TG_ENOMEM ? RT_REQ_ERR_INTERNAL : RT_REQ_ERR_INVALID, code,
            "messages", "%s", err);
    }
    return rc;
}

/* Renders (chat) and tokenizes what `j` names into j->ids; any thread. */
static int encode_now(const struct rt_server *s, struct rt_encode_job *j)
{
    char err[512];
    unsigned flags = j->add_special ? TOK_ENCODE_ADD_SPECIAL : 0;
    struct rt_request_error *e = &j->e;
    if (!j->is_chat) {
        int rc = tok_encode_max(&s->tok, NULL, j->text, j->len, flags,
                                j->max_ids, &j->ids, err, sizeof(err));
        if (rc != 0)
            rt_request_error_set(
                e, rc == TG_ENOMEM ? RT_REQ_ERR_INTERNAL : RT_REQ_ERR_INVALID,
                rc == TG_ERANGE ? "context_length_exceeded" : "invalid_prompt",
                "prompt", "%s", err);
        return rc;
    }
    char *rendered = NULL;
    size_t rlen = 0;
    int rc = render_chat(s, &j->chat, &rendered, &rlen, e);
    if (rc != 0)
        return rc;
    rc = tok_encode_max(&s->tok, NULL, rendered, rlen, flags, j->max_ids,
                        &j->ids, err, sizeof(err));
    free(rendered);
    if (rc != 0)
        rt_request_error_set(
            e, rc == TG_ENOMEM ? RT_REQ_ERR_INTERNAL : RT_REQ_ERR_INVALID,
            rc == TG_ERANGE ? "context_length_exceeded" : "invalid_messages",
            "messages", "%s", err);
    return rc;
}

int rt_server_render_chat(struct rt_server *s, const struct ct_chat *chat,
                          char **out, size_t *len, struct rt_request_error *e)
{
    return render_chat(s, chat, out, len, e);
}

int rt_server_encode(struct rt_server *s, const char *text, size_t len,
                     int add_special, struct tok_ids *ids,
                     struct rt_request_error *e)
{
    struct rt_encode_job j = {
        .text = text, .len = len, .add_special = add_special,
        .max_ids = SIZE_MAX, .ids = *ids,
    };
    int rc = encode_now(s, &j);
    *ids = j.ids;
    if (rc != 0)
        *e = j.e;
    return rc;
}

int rt_server_encode_chat(struct rt_server *s, const struct ct_chat *chat,
                          int add_special, struct tok_ids *ids,
                          struct rt_request_error *e)
{
    struct rt_encode_job j = {
        .is_chat = 1,
        .chat = *chat,
        .add_special = add_special,
        .max_ids = SIZE_MAX,
        .ids = *ids,
    };
    int rc = encode_now(s, &j);
    *ids = j.ids;
    if (rc != 0)
        *e = j.e;
    return rc;
}

/* ---- encode jobs on the thread pool ------------------------------------- */

int rt_encode_job_small(const struct rt_encode_job *j)
{
    if (!j->is_chat)
        return j->len <= RT_ENCODE_INLINE_BYTES;
    return ct_chat_bytes(&j->chat, RT_ENCODE_INLINE_BYTES) <=
           RT_ENCODE_INLINE_BYTES;
}

void rt_encode_job_run(struct rt_server *s, struct rt_encode_job *j)
{
    j->srv = s;
    j->rc = encode_now(s, j);
}

/* ---- jobs on the thread pool ------------------------------------------- */

/* The pool's threads run at this nice value (Linux: per thread), below
 * the loop thread's: under a burst of large requests the loop, which
 * answers /health and streams tokens, gets the CPU first. */
#define POOL_NICE 10

static void pool_work(uv_work_t *w)
{
    struct rt_pool_job *j = w->data;
    static _Thread_local int niced;
    if (!niced) {
        niced = 1;
        /* Best effort: without it the jobs merely compete as equals. */
        (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), POOL_NICE);
    }
    /* An owner that gave up while the job waited: skip the work. */
    j->skipped = atomic_load_explicit(&j->cancelled, memory_order_relaxed);
    if (!j->skipped)
        j->run(j);
}

static void pool_after(uv_work_t *w, int status)
{
    struct rt_pool_job *j = w->data;
    struct rt_server *s = j->srv;
    tg_list_remove(&s->jobs, &j->link);
    s->n_jobs--;
    rt_metrics_gauge_set(s->metrics.tokenize_jobs_in_flight, (double)s->n_jobs);
    /* libuv orders the work function before this callback. */
    int ran = status != UV_ECANCELED && !j->skipped;
    j->done(j, ran);
    rt_server__jobs_changed(s);
}

int rt_pool_job_start(struct rt_server *s, struct rt_pool_job *j, char *err,
                      size_t errlen)
{
    j->srv = s;
    atomic_store(&j->cancelled, 0);
    j->skipped = 0;
    j->work.data = j;
    int rc = uv_queue_work(s->loop, &j->work, pool_work, pool_after);
    if (rc != 0)
        return tg_err_set(err, errlen, TG_EINTERNAL,
                          "cannot queue work on the thread pool: %s",
                          uv_strerror(rc));
    tg_list_push_front(&s->jobs, &j->link);
    s->n_jobs++;
    rt_metrics_gauge_set(s->metrics.tokenize_jobs_in_flight, (double)s->n_jobs);
    return 0;
}

void rt_pool_job_cancel(struct rt_pool_job *j)
{
    atomic_store_explicit(&j->cancelled, 1, memory_order_relaxed);
    /* Succeeds only while the job waits for a thread; a running job ends
     * on its own and its result is dropped by its owner. */
    (void)uv_cancel((uv_req_t *)&j->work);
}

void rt_server__cancel_jobs(struct rt_server *s)
{
    struct tg_list_node *n;
    TG_LIST_FOREACH(n, &s->jobs)
    {
        rt_pool_job_cancel(TG_LIST_ENTRY(n, struct rt_pool_job, link));
    }
}

/* ---- encode jobs --------------------------------------------------------- */

/* Drops the job's own reference to its messages (free_messages). */
static void drop_messages(struct rt_encode_job *j)
{
    if (j->free_messages) {
        ct_messages_free(j->chat.messages, j->chat.n_messages);
        j->chat.messages = NULL;
        j->chat.n_messages = 0;
        j->free_messages = 0;
    }
}

static void encode_run(struct rt_pool_job *p)
{
    struct rt_encode_job *j = (struct rt_encode_job *)p;
    j->rc = encode_now(j->srv, j);
    drop_messages(j);
}

static void encode_done(struct rt_pool_job *p, int ran)
{
    struct rt_encode_job *j = (struct rt_encode_job *)p;
    drop_messages(j); /* a job cancelled before it ran */
    if (!ran)
        j->rc = TG_ECANCELED;
    if (j->rc == TG_ECANCELED)
        rt_request_error_set(&j->e, RT_REQ_ERR_UNAVAILABLE, "server_draining",
                             NULL,
                             "the request was cancelled before its prompt was "
                             "tokenized");
    j->done(j);
}

int rt_encode_job_start(struct rt_server *s, struct rt_encode_job *j)
{
    char err[160];
    j->srv = s;
    j->rc = 0;
    j->pool.run = encode_run;
    j->pool.done = encode_done;
    if (rt_pool_job_start(s, &j->pool, err, sizeof(err)) != 0) {
        rt_request_error_set(&j->e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "%s", err);
        return TG_EINTERNAL;
    }
    return 0;
}

void rt_encode_job_cancel(struct rt_encode_job *j)
{
    rt_pool_job_cancel(&j->pool);
}
