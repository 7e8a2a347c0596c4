/* rt_server_deliver.c — handing a request's output to its sink (see
 * rt_server.h, rt_req_deliver): the text and logprobs produced since the
 * last delivery, in pieces of bounded size while the client takes them,
 * and the final delivery held back for a client that is not reading. */
#include "router/core/rt_server_internal.h"

#include <stdio.h>

void rt_req_token_logprob(struct rt_req *r, int32_t i,
                          struct rt_token_logprob *t)
{
    t->id = r->core->out_ids[i];
    t->logprob = r->core->out_lps[i];
    t->top = r->core->top_scratch + (size_t)i * (size_t)r->core->n_top;
    /* A structured output's step may allow fewer ids than were asked
     * for: the worker sends only those (id -1 here after them), and so
     * does the response. */
    t->n_top = 0;
    for (int k = 0; k < r->core->n_top; k++) {
        size_t at = (size_t)i * (size_t)r->core->n_top + (size_t)k;
        if (r->core->out_top_ids[at] < 0)
            break;
        r->core->top_scratch[at].id = r->core->out_top_ids[at];
        r->core->top_scratch[at].logprob = r->core->out_top_lps[at];
        t->n_top++;
    }
}

const struct rt_token_logprob *rt_req_logprobs(struct rt_req *r)
{
    for (int32_t i = 0; i < r->n_out; i++)
        rt_req_token_logprob(r, i, &r->core->lp_scratch[i]);
    return r->core->lp_scratch;
}

const char *rt_req_text(const struct rt_req *r, size_t *len)
{
    const struct tg_buf *out = &r->core->text.out;
    *len = out->len;
    return tg_buf_str(out);
}

static int sink_blocked(struct rt_req *r)
{
    return !r->core->no_hold && r->blocked != NULL && r->blocked(r);
}

/* Keeps the final delivery for when the client drains (rt_req.blocked). */
static void hold(struct rt_req *r, enum rt_finish fin, const char *error)
{
    r->core->holding = 1;
    r->core->held_fin = (int)fin;
    if (error != r->core->held_error)
        snprintf(r->core->held_error, sizeof(r->core->held_error), "%s",
                 error ? error : "");
}

void rt_req_deliver(struct rt_req *r, enum rt_finish fin, const char *error)
{
    if (r->core->done || r->core->holding)
        return;
    for (;;) {
        if (sink_blocked(r)) {
            if (fin != RT_FINISH_NONE)
                hold(r, fin, error);
            return;
        }
        size_t ready = rt_text_ready(&r->core->text, fin != RT_FINISH_NONE);
        size_t from = r->core->text.emitted, upto = ready;
        if (upto - from > RT_DELIVER_MAX_TEXT) {
            /* Cut before a UTF-8 continuation byte, never inside a
             * character. */
            upto = from + RT_DELIVER_MAX_TEXT;
            while (upto > from &&
                   ((unsigned char)r->core->text.out.data[upto] & 0xC0) == 0x80)
                upto--;
        }
        size_t n_lp = 0, avail = 0;
        if (r->q.opts.logprobs >= 0) {
            avail = (size_t)(r->n_out - r->core->lp_sent);
            n_lp = avail < RT_DELIVER_MAX_TOKENS ? avail
                                                 : RT_DELIVER_MAX_TOKENS;
            for (size_t j = 0; j < n_lp; j++) {
                size_t i = (size_t)r->core->lp_sent + j;
                rt_req_token_logprob(r, (int32_t)i, &r->core->lp_scratch[j]);
            }
        }
        int last = upto == ready && n_lp == avail;
        enum rt_finish f = last ? fin : RT_FINISH_NONE;
        if (upto == from && n_lp == 0 && f == RT_FINISH_NONE)
            return;
        r->core->lp_sent = r->q.opts.logprobs >= 0
                               ? r->core->lp_sent + (int32_t)n_lp
                               : r->n_out;
        rt_text_mark(&r->core->text, upto);
        if (f != RT_FINISH_NONE)
            r->core->done = 1;
        r->core->in_deliver = 1;
        r->sink->deliver(
            r, r->core->text.out.data ? r->core->text.out.data + from : "",
            upto - from, r->core->lp_scratch, n_lp, f, error);
        r->core->in_deliver = 0;
        if (last || r->core->done)
            return;
    }
}
