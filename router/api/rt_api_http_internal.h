/*
 * rt_api_http_internal.h — what the HTTP front end's files share:
 * rt_api_http.c (routes, generation, health, metrics) and
 * rt_api_http_body.c (request bodies parsed off the loop, /tokenize,
 * /detokenize). Not for other modules. Loop thread only.
 */
#ifndef RT_API_HTTP_INTERNAL_H
#define RT_API_HTTP_INTERNAL_H

#include "common/base/tg_buf.h"
#include "router/api/rt_api.h"
#include "router/api/rt_responses.h"

/* Request bodies of more bytes than this are parsed — and /tokenize and
 * /detokenize answered — on the thread pool, not the loop thread: the
 * same bound as prompts encoded inline (a body this small has strings no
 * larger), so a megabyte of JSON never holds up /health, /metrics or a
 * stream. */
#define RT_API_BODY_INLINE_BYTES RT_ENCODE_INLINE_BYTES

/* Answers req with the OpenAI error *e (Retry-After on 429 and 503). */
void rt_api_http__send_error(struct rt_http_req *req,
                             const struct rt_request_error *e);

/* The outcome of r's submission (rc, *e: rt_req.on_submitted's, or
 * rt_req_submit's 0): 0 when r is with the scheduler and its answer
 * context made (rt_api_gen_started); otherwise r is dropped (not
 * submitted) or cancelled, e answers the client and the result is
 * nonzero. Loop thread. */
int rt_api_http__started(struct rt_req *r, int rc, struct rt_request_error *e);

/* Answers req with `status` and the JSON `body` (owned, freed here), or
 * with a 500 when rc != 0. */
void rt_api_http__send_owned(struct rt_http_req *req, int status, char *body,
                             size_t len, int rc);

/* Generation goes on with a parsed request (rt_api_http.c): rc 0 and *g
 * (moved out, *g left empty), or rc != 0 and the error *e (*g freed). */
void rt_api_http__generate_parsed(struct rt_server *s, struct rt_http_req *req,
                                  int rc, struct rt_gen_request *g,
                                  struct rt_request_error *e, size_t mem);

/* Parses the completions or chat body of req — on the loop when it is
 * small, else on the thread pool — then calls
 * rt_api_http__generate_parsed on the loop; a client gone meanwhile
 * cancels the job (rt_api_http_body.c). */
void rt_api_http__generate(struct rt_server *s, struct rt_http_req *req,
                           enum rt_endpoint ep);

/* Route handlers of rt_api_http_body.c; ud is the server. */
void rt_api_http__tokenize(struct rt_http_req *req, void *ud);
void rt_api_http__detokenize(struct rt_http_req *req, void *ud);

/* The Responses API: POST /v1/responses (rt_api_http_resp.c), GET
 * /v1/responses/{id} and .../input_items, DELETE /v1/responses/{id}
 * (rt_api_http_resp_out.c); ud is the server. */
void rt_api_http__responses(struct rt_http_req *req, void *ud);
void rt_api_http__responses_get(struct rt_http_req *req, void *ud);
void rt_api_http__responses_delete(struct rt_http_req *req, void *ud);

/* What the two files of the Responses API share. */
/* The state of one POST /v1/responses (rt_api_gen.ext). */
struct rt_api_http__resp {
    struct rt_server *s;
    struct rt_responses_request rq;
    struct rt_resp_scope scope;
    char id[RT_RESP_ID_MAX];
    char msg_id[RT_RESP_ID_MAX];
    json_t *history; /* the items before this turn's input (array) */
    /* streaming */
    int64_t seq;
    int out_index;      /* the next output item's index */
    int msg_open;       /* the message item was announced, not yet done */
    int msg_index;      /* its output_index */
    struct tg_buf text; /* the message's text so far */
    json_t *calls;      /* function_call items sent (array) */
    /* a thinking template's reasoning item (rt_responses_split_think) */
    int think; /* the template has a think section */
    char rs_id[RT_RESP_ID_MAX];
    int think_state;     /* stream: 0 before it is known whether the
                           output starts with one, 1 inside, 2 after */
    int rs_open;         /* 1 announced, 2 done */
    int rs_index;        /* its output_index */
    int strip_nl;        /* the answer's leading newlines are dropped */
    struct tg_buf pend;  /* output held while a tag may be starting */
    struct tg_buf rtext; /* the reasoning so far */
};

/* Frees a state (rt_api_gen.ext_free); safe on NULL. */
void rt_api_http__resp_free(void *p);

/* r's state (r a Responses request). */
struct rt_api_http__resp *rt_api_http__resp_of(const struct rt_req *r);

/* The caller's scope: the API key and X-Session-Id (else the body's
 * session_id `body_session`, may be NULL). */
void rt_api_http__resp_scope(struct rt_server *s, const struct rt_http_req *req,
                             const char *body_session,
                             struct rt_resp_scope *out);

/* The sinks of a Responses request: the JSON answer, the event stream. */
extern const struct rt_sink rt_api_http__resp_json_sink;
extern const struct rt_sink rt_api_http__resp_sse_sink;

/* The stream's first events (response.created, .in_progress), once the
 * request is with the scheduler. */
void rt_api_http__resp_stream_begin(struct rt_req *r);

#endif /* RT_API_HTTP_INTERNAL_H */
