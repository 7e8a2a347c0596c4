/* rt_api_gen.c — a generation request's state on the front ends' side
 * (rt_api.h, struct rt_api_gen): handed over from the parse, made for a
 * parallel sample, completed once the core took the request, freed with
 * it. */
#include "router/api/rt_api.h"

#include <stdlib.h>
#include <string.h>

#include "common/base/tg_err.h"

static int oom(struct rt_request_error *e)
{
    rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                         "out of memory");
    return TG_ENOMEM;
}

int rt_api_gen_attach(struct rt_req *r, struct rt_gen_request *g,
                      struct rt_request_error *e)
{
    struct rt_api_gen *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        rt_gen_request_free(g);
        return oom(e);
    }
    r->q = g->q;
    memset(&g->q, 0, sizeof(g->q));
    if (g->tool_choice == RT_TOOL_CHOICE_NONE && r->q.chat.tools != NULL) {
        ct_tools_unref(r->q.chat.tools);
        r->q.chat.tools = NULL;
    }
    a->g = *g;
    memset(g, 0, sizeof(*g));
    r->fe = a;
    rt_openai_make_id(r->id_str, sizeof(r->id_str), a->g.endpoint,
                      rt_server_random(r->srv));
    return 0;
}

int rt_api_gen_attach_sample(struct rt_req *q, const struct rt_req *leader,
                             struct rt_request_error *e)
{
    const struct rt_gen_request *f = &rt_api_gen_of(leader)->g;
    struct rt_api_gen *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return oom(e);
    q->fe = a;
    a->slot = q->choice;
    struct rt_gen_request *d = &a->g;
    d->endpoint = f->endpoint;
    d->tool_choice = f->tool_choice;
    d->stream = f->stream;
    d->include_usage = f->include_usage;
    d->continuous_usage = f->continuous_usage;
    d->echo = f->echo;
    if (f->model != NULL && (d->model = strdup(f->model)) == NULL)
        return oom(e);
    if (f->echo_text != NULL) {
        if ((d->echo_text = malloc(f->echo_len + 1)) == NULL)
            return oom(e);
        memcpy(d->echo_text, f->echo_text, f->echo_len + 1);
        d->echo_len = f->echo_len;
    }
    return rt_api_gen_started(q, e);
}

void rt_api_gen_mem_give(struct rt_server *s, size_t mem)
{
    struct rt_reqmem *m = rt_server_reqmem(s);
    if (mem != 0 && m != NULL)
        rt_reqmem_give(m, mem);
}

int rt_api_gen_started(struct rt_req *r, struct rt_request_error *e)
{
    struct rt_server *s = r->srv;
    struct rt_api_gen *a = rt_api_gen_of(r);
    /* The prompt is tokenized: what the request costs from now on is its
     * ids and its answer, which the scheduler bounds. */
    rt_api_gen_mem_give(s, a->mem);
    a->mem = 0;
    const int32_t *prompt_ids = NULL;
    a->ctx = (struct rt_resp_ctx){
        .endpoint = a->g.endpoint,
        .id = r->id_str,
        .model = rt_server_info(s)->model_name,
        .created = r->created,
        .logprobs = r->q.opts.logprobs >= 0,
        .token_text = rt_server_token_text,
        .token_user = s,
        .include_usage = a->g.include_usage,
        .continuous_usage = a->g.continuous_usage,
        .index = a->slot,
        .plp = rt_req_prompt_lps(r, &prompt_ids),
        .prompt_ids = prompt_ids,
        .echo_top = a->g.echo_top,
        .prompt_top = a->g.prompt_top,
    };
    /* Tool calls are parsed out of the output when the template told the
     * model how to write them and the request offered tools. */
    if (a->tc == NULL && a->g.endpoint == RT_ENDPOINT_CHAT &&
        r->q.chat.tools != NULL && r->q.chat.tools->n > 0 &&
        a->g.tool_choice != RT_TOOL_CHOICE_NONE &&
        rt_server_info(s)->tool_format != CT_TOOLS_NONE) {
        if ((a->tc = malloc(sizeof(*a->tc))) == NULL)
            return oom(e);
        rt_tc_init(a->tc, rt_server_info(s)->tool_format, rt_server_random(s));
    }
    return 0;
}

void rt_api_gen_error(struct rt_request_error *e, const char *error)
{
    static const char kv[] = "kv_cache_exhausted: ";
    static const char gm[] = "output_constraint_too_complex: ";
    if (error != NULL && strncmp(error, kv, sizeof(kv) - 1) == 0)
        rt_request_error_set(e, RT_REQ_ERR_UNAVAILABLE, "kv_cache_exhausted",
                             NULL, "%s", error + sizeof(kv) - 1);
    else if (error != NULL && strncmp(error, gm, sizeof(gm) - 1) == 0)
        rt_request_error_set(e, RT_REQ_ERR_INVALID,
                             "output_constraint_too_complex", NULL, "%s",
                             error + sizeof(gm) - 1);
    else
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "generation_failed", NULL,
                             "%s", error ? error : "the request failed");
}

void rt_api_gen_release(struct rt_req *r)
{
    struct rt_api_gen *a = rt_api_gen_of(r);
    if (a == NULL)
        return;
    rt_api_gen_mem_give(r->srv, a->mem);
    if (a->ext != NULL)
        a->ext_free(a->ext);
    if (a->tc != NULL) {
        rt_tc_free(a->tc);
        free(a->tc);
    }
    rt_gen_request_free(&a->g);
    free(a);
    r->fe = NULL;
}

struct rt_openai_cfg rt_api_openai_cfg(const struct rt_server *s)
{
    const struct rt_server_info *m = rt_server_info(s);
    const struct tg_serve_opts *o = rt_server_opts(s);
    return (struct rt_openai_cfg){
        .served_model = m->model_name,
        .max_model_len = m->max_model_len,
        .vocab_size = m->vocab_size,
        .max_body_bytes = (size_t)o->http_max_body,
        .tool_format = m->tool_format,
        .ws = o->structured_whitespace,
    };
}

int rt_api_session(struct rt_request *q, const char *field,
                   const char *field_param, const char *hdr, size_t n_hdr,
                   const char *hdr_param, struct rt_request_error *e)
{
    if (n_hdr > 1) {
        rt_request_error_set(e, RT_REQ_ERR_INVALID, "invalid_value", hdr_param,
                             "%s is given more than once; send one session "
                             "id",
                             hdr_param);
        return TG_EINVAL;
    }
    if (hdr != NULL && rt_openai_check_id(hdr, strlen(hdr), hdr_param, e) != 0)
        return TG_EINVAL;
    if (q->session_id != NULL)
        return 0;
    const char *sid = field != NULL && field[0] != '\0' ? field : hdr;
    if (sid == NULL)
        return 0;
    if (sid == field &&
        rt_openai_check_id(sid, strlen(sid), field_param, e) != 0)
        return TG_EINVAL;
    if ((q->session_id = strdup(sid)) == NULL) {
        rt_request_error_set(e, RT_REQ_ERR_INTERNAL, "internal_error", NULL,
                             "out of memory");
        return TG_ENOMEM;
    }
    return 0;
}
