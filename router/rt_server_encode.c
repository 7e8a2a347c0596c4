/* rt_server_encode.c — text and chat prompts to token ids for the router's
 * front ends and the generation path (see rt_server.h). Loop thread. */
#include <stdlib.h>
#include <string.h>

#include "common/tg_err.h"
#include "router/rt_server.h"

int rt_server_encode(struct rt_server *s, const char *text, size_t len,
                     const struct ct_message *msgs, size_t n_msgs,
                     const struct ct_options *co, int add_special,
                     struct tok_ids *ids, struct rt_api_error *e)
{
    char err[512];
    int rc;
    unsigned flags = add_special ? TOK_ENCODE_ADD_SPECIAL : 0;
    if (msgs == NULL) {
        rc = tok_encode(&s->tok, NULL, text, len, flags, ids, err, sizeof(err));
        if (rc != 0)
            rt_api_error_set(e, rc == TG_ENOMEM ? 500 : 400, "invalid_prompt",
                             "prompt", "%s", err);
        return rc;
    }
    if (!s->have_tmpl) {
        rt_api_error_set(e, 400, "chat_template_unsupported", "messages",
                         "this model has no supported chat template: %s",
                         s->tmpl_error);
        return TG_EUNSUPPORTED;
    }
    char *rendered = NULL;
    size_t rlen = 0;
    rc = ct_render(&s->tmpl, msgs, n_msgs, co, &rendered, &rlen, err, sizeof(err));
    if (rc != 0) {
        rt_api_error_set(e, rc == TG_ENOMEM ? 500 : 400, "invalid_messages",
                         "messages", "%s", err);
        return rc;
    }
    rc = tok_encode(&s->tok, NULL, rendered, rlen, flags, ids, err, sizeof(err));
    free(rendered);
    if (rc != 0)
        rt_api_error_set(e, rc == TG_ENOMEM ? 500 : 400, "invalid_messages",
                         "messages", "%s", err);
    return rc;
}

int rt_server_encode_chat(struct rt_server *s, const struct rt_message *m,
                          size_t n, const struct rt_chat_opts *chat,
                          int add_special, struct tok_ids *ids,
                          struct rt_api_error *e)
{
    struct ct_message *cm = calloc(n + 1, sizeof(*cm));
    if (cm == NULL) {
        rt_api_error_set(e, 500, "internal_error", NULL, "out of memory");
        return TG_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        cm[i].role = rt_role_name(m[i].role);
        cm[i].content = m[i].content;
        cm[i].reasoning_content = m[i].reasoning_content;
    }
    struct ct_options co = {
        .add_generation_prompt = chat->add_generation_prompt,
        .enable_thinking = chat->enable_thinking,
    };
    int rc = rt_server_encode(s, NULL, 0, cm, n, &co, add_special, ids, e);
    free(cm);
    return rc;
}
