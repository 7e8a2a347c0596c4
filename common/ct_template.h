/*
 * ct_template.h — chat templates of the supported model families, rendered
 * in C byte-for-byte as the models' own Jinja templates render them under
 * Hugging Face's apply_chat_template (trim_blocks, lstrip_blocks).
 *
 * We do not embed a Jinja interpreter. Instead each supported template is
 * re-implemented as straight-line C that mirrors its control flow, and the
 * template text shipped with a model is identified (ct_template_detect) by
 * the hash of its known text or, failing that, by distinctive substrings.
 * An unknown template is an error that names it, unless the caller names
 * the family explicitly (ct_template_select). The integration test
 * tests/integration/test_chat_template.py checks the output against the real
 * templates rendered with jinja2 (tests/reference/render_jinja.py).
 *
 * Families (canonical names as accepted by ct_family_parse):
 *   "chatml-qwen2.5"  Qwen2.5-Instruct ChatML; default system prompt
 *                     "You are Qwen, created by Alibaba Cloud. You are a
 *                     helpful assistant." when messages[0] is not system.
 *   "qwen3"           Qwen3 (hybrid thinking): no default system prompt;
 *                     assistant turns after the last real user query carry
 *                     <think>…</think> built from reasoning_content (or from
 *                     a <think> block inside content); earlier turns drop it;
 *                     enable_thinking=false appends an empty think block to
 *                     the generation prompt.
 *   "llama3"          Llama-3.1 / 3.3 Instruct: <|begin_of_text|>, a system
 *                     header with "Cutting Knowledge Date: December 2023" and
 *                     "Today Date: <date_string>" (default "26 Jul 2024", the
 *                     template's literal), contents trimmed.
 *   "llama3.2"        Llama-3.2 Instruct: as llama3, but the default
 *                     date_string is today's local date "%d %b %Y" (the
 *                     template calls strftime_now, which transformers defines
 *                     as datetime.now().strftime).
 *
 * Tool calling (tool definitions, assistant tool_calls, tool/ipython role
 * messages) is not implemented: such requests fail with TG_EUNSUPPORTED
 * rather than render differently from the template.
 *
 * Everything here is pure computation on caller data: any thread.
 */
#ifndef CT_TEMPLATE_H
#define CT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ct_family {
    CT_FAMILY_UNKNOWN = 0,
    CT_FAMILY_QWEN25,  /* "chatml-qwen2.5" */
    CT_FAMILY_QWEN3,   /* "qwen3" */
    CT_FAMILY_LLAMA3,  /* "llama3" (Llama-3.1 / 3.3 text) */
    CT_FAMILY_LLAMA32, /* "llama3.2" */
};

/* How a template's family was decided. */
enum ct_match {
    CT_MATCH_NONE = 0,
    CT_MATCH_EXACT,       /* normalized text hash equals a known template */
    CT_MATCH_FINGERPRINT, /* unknown text carrying the family's markers */
    CT_MATCH_NAMED,       /* the caller named the family */
};

struct ct_template {
    enum ct_family family;
    enum ct_match match;
    uint64_t hash; /* ct_template_hash of the text; 0 when no text given */
};

/* One chat message. Strings are borrowed, NUL-terminated UTF-8. */
struct ct_message {
    const char *role;              /* "system", "user", "assistant", ... */
    const char *content;           /* required (never NULL) */
    const char *reasoning_content; /* NULL = absent (same as JSON null) */
    bool tool_calls;               /* message carries tool calls */
};

/* The Jinja variable enable_thinking: only an explicit false changes the
 * output (qwen3 tests `enable_thinking is defined and is false`). */
enum ct_thinking {
    CT_THINKING_DEFAULT = 0, /* variable undefined: thinking on */
    CT_THINKING_ON,
    CT_THINKING_OFF,
};

/* Render options; a zeroed struct is valid (no generation prompt, default
 * thinking, template's default date, no tools). */
struct ct_options {
    bool add_generation_prompt; /* append the assistant header */
    enum ct_thinking enable_thinking; /* qwen3 only; ignored otherwise */
    const char *date_string;    /* llama3*: "Today Date"; NULL = default */
    bool tools;                 /* the request defines tools */
};

/* Returns the canonical name of family f ("qwen3"), or "unknown". */
const char *ct_family_name(enum ct_family f);

/* Parses a family name into *out. Accepts the canonical names plus the
 * aliases "qwen2.5", "llama3.1" and "llama3.3". Returns 0, or TG_EINVAL with
 * a message listing the valid names. Any thread. */
int ct_family_parse(const char *name, enum ct_family *out, char *err,
                    size_t errlen);

/* Returns the 64-bit FNV-1a hash of `text` normalized the way Jinja sees it:
 * leading and trailing ASCII whitespace removed and CR of CRLF dropped
 * (Jinja normalizes newlines, and trim_blocks eats the final one). */
uint64_t ct_template_hash(const char *text);

/* Identifies the family of the chat template source `text`. On success
 * fills *out (match EXACT or FINGERPRINT) and returns 0. An unrecognized
 * template gives TG_EUNSUPPORTED with a message naming its hash and first
 * line; NULL text gives TG_EINVAL. Any thread. */
int ct_template_detect(const char *text, struct ct_template *out, char *err,
                       size_t errlen);

/* Chooses the template to render with: the family `name` when non-NULL
 * (match NAMED; text may then be anything, including NULL or unknown),
 * otherwise ct_template_detect(text). Returns 0, TG_EINVAL (bad name, or
 * neither text nor name) or TG_EUNSUPPORTED (unknown text, no name). */
int ct_template_select(const char *text, const char *name,
                       struct ct_template *out, char *err, size_t errlen);

/* Reads a chat template source from `path`: a .json file is read as a
 * tokenizer_config.json (its "chat_template" string, or the entry named
 * "default" of a list of {name, template}); any other file is the template
 * text itself (.jinja). On success *out is a malloc'd NUL-terminated string
 * the caller frees. Returns 0, TG_ENOENT, TG_EIO, TG_EFORMAT, TG_ENOTFOUND
 * (JSON without a chat template) or TG_ENOMEM. */
int ct_template_read_file(const char *path, char **out, char *err,
                          size_t errlen);

/* Reads the chat template of a model or tokenizer directory: the first of
 * DIR/chat_template.jinja, DIR/tokenizer_config.json, or the single
 * DIR/tokenizer_config.*.json (so a folder holding one renamed config works).
 * Same ownership and codes as ct_template_read_file. */
int ct_template_read_dir(const char *dir, char **out, char *err,
                         size_t errlen);

/* Renders messages[0..n) with template t and options opt (NULL = zeroed
 * options) into *out, a malloc'd NUL-terminated string the caller frees;
 * *out_len (when non-NULL) gets its length in bytes. Fails, leaving *out
 * NULL, with TG_EINVAL where the Jinja template itself fails (an empty
 * message list: every supported template reads messages[0]) or on NULL
 * role/content; TG_EUNSUPPORTED for tools, tool calls, tool/ipython roles or
 * an unknown family; TG_ENOMEM. Roles a template ignores are ignored the same
 * way (Qwen drops unknown roles; Llama renders any role as a header).
 * Any thread. */
int ct_render(const struct ct_template *t, const struct ct_message *messages,
              size_t n, const struct ct_options *opt, char **out,
              size_t *out_len, char *err, size_t errlen);

#endif /* CT_TEMPLATE_H */
