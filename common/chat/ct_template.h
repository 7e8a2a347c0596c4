/*
 * ct_template.h — a model's own chat template: found in a model or
 * tokenizer directory, compiled with the Jinja engine (jj_template.h) and
 * rendered the way transformers' apply_chat_template renders it.
 *
 * Sources, in transformers' order of precedence: DIR/chat_template.jinja
 * (newer Hugging Face models), else the "chat_template" of
 * DIR/tokenizer_config.json (a string, or a list of {name, template} where
 * "default" is used, and "tool_use" when the request has tools and the list
 * has one), else the single DIR/tokenizer_config.*.json. The special tokens
 * come from that tokenizer_config (a string or an AddedToken object with
 * "content"), as transformers' special_tokens_map holds them: bos_token,
 * eos_token, unk_token, sep_token, pad_token, cls_token, mask_token and
 * additional_special_tokens, each bound only when set and non-empty.
 *
 * Template variables of a render, as transformers passes them: messages,
 * tools (the list, or None when the request has none), documents (None),
 * add_generation_prompt, the special tokens, and the caller's extra keyword
 * arguments (chat_template_kwargs: enable_thinking and any other). The
 * messages and tools are the caller's JSON as it is: the template sees
 * exactly what the client sent (content strings or lists of parts,
 * tool_calls with arguments as given). date_string stays undefined unless
 * an extra argument sets it; strftime_now() formats the render time (or a
 * time fixed by the caller). continue_final_message cuts the output after
 * the final message's content as transformers does.
 *
 * Tool-call output formats (ct_tool_format) are recognized from the
 * template text: "<tool_call>" (Qwen2.5, Qwen3, Hermes, QwQ) means the model
 * writes <tool_call>{json}</tool_call> blocks; a Llama-3.x template (its
 * "<|start_header_id|>" headers and the '"parameters"' call shape) means the
 * whole answer is one JSON object {"name", "parameters"}. Anything else has
 * no known output format: tools are rendered, the output stays text.
 *
 * Thread: a loaded template is immutable; renders may run on any thread.
 */
#ifndef CT_TEMPLATE_H
#define CT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "common/chat/ct_chat.h"
#include "common/jinja/jj_template.h"


struct ct_template {
    struct jj_template *tmpl;      /* the default template */
    struct jj_template *tmpl_tools; /* "tool_use" of a template list, or
                                       NULL */
    char *source;                  /* text of the default template */
    struct json_t *specials;       /* object: special token name -> value */
    enum ct_tool_format tool_format;
    char path[512];                /* where the template came from */
};

/* Reads a chat template source from `path`: a .json file is read as a
 * tokenizer_config.json (its "chat_template" string, or the entry named
 * "default" of a list of {name, template}); any other file is the template
 * text itself (.jinja). On success *out is a malloc'd NUL-terminated string
 * the caller frees. Returns 0, TG_ENOENT, TG_EIO, TG_EFORMAT, TG_ENOTFOUND
 * (JSON without a chat template) or TG_ENOMEM. Any thread. */
int ct_template_read_file(const char *path, char **out, char *err,
                          size_t errlen);

/* Reads the chat template of a model or tokenizer directory: the first of
 * DIR/chat_template.jinja, DIR/tokenizer_config.json, or the single
 * DIR/tokenizer_config.*.json (so a folder holding one renamed config
 * works). Same ownership and codes as ct_template_read_file. */
int ct_template_read_dir(const char *dir, char **out, char *err,
                         size_t errlen);

/* Loads and compiles the chat template of directory `dir` (see above) into
 * *t, which the call zeroes first. Returns 0; TG_ENOENT / TG_EIO /
 * TG_EFORMAT / TG_ENOTFOUND for missing or malformed sources; the codes of
 * jj_template_parse for a template the engine cannot compile (the message
 * names the construct and line); TG_ENOMEM. On failure *t is empty.
 * Free with ct_template_free. */
int ct_template_load_dir(struct ct_template *t, const char *dir, char *err,
                         size_t errlen);

/* The same for a single file: a tokenizer_config .json (template and
 * special tokens) or a .jinja template (no special tokens). */
int ct_template_load_file(struct ct_template *t, const char *path, char *err,
                          size_t errlen);

/* Compiles template text (len bytes) with the special tokens of `specials`
 * (an object or NULL; a new reference is taken). Same codes. */
int ct_template_load_text(struct ct_template *t, const char *text, size_t len,
                          struct json_t *specials, char *err, size_t errlen);

/* Releases everything t holds; safe on a zeroed template. */
void ct_template_free(struct ct_template *t);

struct ct_render_opts {
    bool add_generation_prompt;
    bool continue_final_message; /* exclusive with add_generation_prompt */
    struct json_t *kwargs;   /* extra template variables (an object, borrowed;
                                NULL = none): chat_template_kwargs */
    const struct tm *now;    /* strftime_now time; NULL = now, local */
    struct jj_limits limits; /* zero = the engine's defaults */
};

/* Renders `messages` (a JSON array, borrowed) and `tools` (a JSON array or
 * NULL) with template t into *out, a malloc'd NUL-terminated string of
 * *out_len bytes the caller frees. Returns 0; TG_EINVAL when the template
 * fails (its raise_exception, an undefined value, a type error) or a
 * kwargs name collides with a reserved variable (messages, tools,
 * documents, add_generation_prompt); TG_EFORMAT for continue_final_message
 * whose final message the output does not contain; TG_EUNSUPPORTED,
 * TG_ETOOBIG (a limit) and TG_ENOMEM from the engine. Any thread. */
int ct_template_render(const struct ct_template *t, struct json_t *messages,
                       struct json_t *tools, const struct ct_render_opts *o,
                       char **out, size_t *out_len, char *err, size_t errlen);

/* Renders the conversation c (ct_chat.h: its messages, tools and options;
 * the engine's default limits, the current local time) with template t,
 * as ct_template_render renders their JSON form: each message as an
 * object of role, content, then name, reasoning_content, tool_calls ({id,
 * type "function", function {name, arguments}}, the arguments parsed from
 * their text) and tool_call_id where present; each tool as its spec; the
 * kwargs as extra variables. Returns as ct_template_render does, and
 * TG_EINVAL for a tool spec or kwargs that is not a JSON object. Any
 * thread. */
int ct_template_render_chat(const struct ct_template *t,
                            const struct ct_chat *c, char **out,
                            size_t *out_len, char *err, size_t errlen);

#endif /* CT_TEMPLATE_H */
