/* rt_server_encode.c — text and chat prompts to token ids for the router's
 * front ends and the generation path (see rt_server.h). Chat prompts are
 * rendered with the model's own chat template (common/ct_template.h).
 * Loop thread. */
#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"
#include "router/rt_server.h"

int rt_server_encode(struct rt_server *s, const char *text, size_t len,
                     int add_special, struct tok_ids *ids,
                     struct rt_api_error *e)
{
    char err[512];
    unsigned flags = add_special ? TOK_ENCODE_ADD_SPECIAL : 0;
    int rc = tok_encode(&s->tok, NULL, text, len, flags, ids, err, sizeof(err));
    if (rc != 0)
        rt_api_error_set(e, rc == TG_ENOMEM ? 500 : 400, "invalid_prompt",
                         "prompt", "%s", err);
    return rc;
}

int rt_server_encode_chat(struct rt_server *s, json_t *messages,
                          json_t *tools, const struct rt_chat_opts *chat,
                          int add_special, struct tok_ids *ids,
                          struct rt_api_error *e)
{
    if (!s->have_tmpl) {
        rt_api_error_set(e, 400, "chat_template_unsupported", "messages",
                         "this model has no usable chat template: %s",
                         s->tmpl_error);
        return TG_EUNSUPPORTED;
    }
    char err[512];
    char *rendered = NULL;
    size_t rlen = 0;
    struct ct_render_opts o = {
        .add_generation_prompt = chat->add_generation_prompt,
        .continue_final_message = chat->continue_final_message,
        .kwargs = chat->kwargs,
    };
    int rc = ct_template_render(&s->tmpl, messages, tools, &o, &rendered,
                                &rlen, err, sizeof(err));
    if (rc != 0) {
        const char *code = rc == TG_EUNSUPPORTED ? "chat_template_unsupported"
                           : rc == TG_ETOOBIG    ? "prompt_too_large"
                                                 : "invalid_messages";
        rt_api_error_set(e, rc == TG_ENOMEM ? 500 : 400, code, "messages",
                         "%s", err);
        return rc;
    }
    unsigned flags = add_special ? TOK_ENCODE_ADD_SPECIAL : 0;
    rc = tok_encode(&s->tok, NULL, rendered, rlen, flags, ids, err, sizeof(err));
    free(rendered);
    if (rc != 0)
        rt_api_error_set(e, rc == TG_ENOMEM ? 500 : 400, "invalid_messages",
                         "messages", "%s", err);
    return rc;
}
