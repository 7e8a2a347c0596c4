/* ct_template.c — a model's chat template: sources, special tokens,
 * compilation and rendering (ct_template.h). The selection rules follow
 * transformers' PreTrainedTokenizerBase.get_chat_template and
 * apply_chat_template (special_tokens_map, tools / documents = None,
 * continue_final_message). */
#include "common/chat/ct_template.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja/jj_template.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

/* ---- sources ------------------------------------------------------------- */

static int read_all(const char *path, char **out, size_t *out_len, char *err,
                    size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        return tg_err_set(err, errlen, e == ENOENT ? TG_ENOENT : TG_EIO,
                          "%s: %s", path, strerror(e));
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    int rc = buf != NULL ? 0 : TG_ENOMEM;
    while (rc == 0) {
        if (n + 1 >= cap) {
            if (cap > JJ_MAX_TEMPLATE_BYTES * 8u) {
                rc = tg_err_set(err, errlen, TG_ETOOBIG, "%s: file too large",
                                path);
                break;
            }
            if (TG_GROW(buf, &cap, cap + 1)) {
                rc = TG_ENOMEM;
                break;
            }
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                rc = tg_err_set(err, errlen, TG_EIO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc == TG_ENOMEM)
        tg_err_set(err, errlen, rc, "out of memory reading %s", path);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    if (out_len != NULL)
        *out_len = n;
    return 0;
}

/* The chat_template member: a string, or a list of {name, template}. */
static int config_template(const json_t *cfg, const char *path,
                           const char *want, char **out, char *err,
                           size_t errlen)
{
    json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_string(t)) {
        if (strcmp(want, "default") != 0)
            return TG_ENOTFOUND;
        *out = strdup(json_string_value(t));
        return *out ? 0 : tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    if (json_is_array(t)) {
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e)
        {
            json_t *name = json_object_get(e, "name");
            json_t *tmpl = json_object_get(e, "template");
            if (json_is_string(name) && json_is_string(tmpl) &&
                strcmp(json_string_value(name), want) == 0) {
                *out = strdup(json_string_value(tmpl));
                return *out ? 0
                            : tg_err_set(err, errlen, TG_ENOMEM,
                                         "out of memory");
            }
        }
        if (strcmp(want, "default") != 0)
            return TG_ENOTFOUND;
        return tg_err_set(err, errlen, TG_ENOTFOUND,
                          "%s: chat_template is a list without a \"default\" "
                          "entry",
                          path);
    }
    if (strcmp(want, "default") != 0)
        return TG_ENOTFOUND;
    return tg_err_set(err, errlen, TG_ENOTFOUND,
                      "%s: no chat_template string or list", path);
}

static int load_config(const char *path, json_t **cfg, char *err,
                       size_t errlen)
{
    json_error_t je;
    *cfg = json_load_file(path, 0, &je);
    if (*cfg == NULL) {
        FILE *f = fopen(path, "rb");
        if (f == NULL)
            return tg_err_set(err, errlen,
                              errno == ENOENT ? TG_ENOENT : TG_EIO, "%s: %s",
                              path, strerror(errno));
        fclose(f);
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: invalid JSON at line %d: %s", path, je.line,
                          je.text);
    }
    if (!json_is_object(*cfg)) {
        json_decref(*cfg);
        *cfg = NULL;
        return tg_err_set(err, errlen, TG_EFORMAT, "%s: not a JSON object",
                          path);
    }
    return 0;
}

static bool is_json_path(const char *path)
{
    size_t n = strlen(path);
    return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}

int ct_template_read_file(const char *path, char **out, char *err,
                          size_t errlen)
{
    *out = NULL;
    if (!is_json_path(path))
        return read_all(path, out, NULL, err, errlen);
    json_t *cfg;
    int rc = load_config(path, &cfg, err, errlen);
    if (rc != 0)
        return rc;
    rc = config_template(cfg, path, "default", out, err, errlen);
    json_decref(cfg);
    return rc;
}

static bool file_exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    fclose(f);
    return true;
}

/* The tokenizer_config of dir: tokenizer_config.json or the single
 * tokenizer_config.*.json. Returns 0 with *found set, TG_ENOENT when none,
 * or an error. */
static int find_config(const char *dir, char *found, size_t cap, char *err,
                       size_t errlen)
{
    if ((size_t)snprintf(found, cap, "%s/tokenizer_config.json", dir) >= cap)
        return tg_err_set(err, errlen, TG_EINVAL, "%s: path too long", dir);
    if (file_exists(found))
        return 0;
    DIR *d = opendir(dir);
    if (d == NULL) {
        int e = errno;
        return tg_err_set(err, errlen, e == ENOENT ? TG_ENOENT : TG_EIO,
                          "%s: %s", dir, strerror(e));
    }
    char name[256] = "";
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, "tokenizer_config.", 17) == 0 && len > 22 &&
            strcmp(de->d_name + len - 5, ".json") == 0 && len < sizeof name) {
            count++;
            memcpy(name, de->d_name, len + 1);
        }
    }
    closedir(d);
    if (count == 0)
        return TG_ENOENT;
    if (count > 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: several tokenizer_config.*.json files; pass "
                          "one with --template-file",
                          dir);
    if ((size_t)snprintf(found, cap, "%s/%s", dir, name) >= cap)
        return tg_err_set(err, errlen, TG_EINVAL, "%s: path too long", dir);
    return 0;
}

int ct_template_read_dir(const char *dir, char **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/chat_template.jinja", dir) >=
        sizeof path)
        return tg_err_set(err, errlen, TG_EINVAL, "%s: path too long", dir);
    if (file_exists(path))
        return ct_template_read_file(path, out, err, errlen);
    int rc = find_config(dir, path, sizeof path, err, errlen);
    if (rc == TG_ENOENT)
        return tg_err_set(err, errlen, TG_ENOENT,
                          "%s: no chat_template.jinja or "
                          "tokenizer_config.json",
                          dir);
    if (rc != 0)
        return rc;
    return ct_template_read_file(path, out, err, errlen);
}

/* ---- special tokens -------------------------------------------------------- */

/* special_tokens_map of a tokenizer_config: each token as a string (the
 * "content" of an AddedToken), only when set and non-empty. */
static int specials_of(const json_t *cfg, json_t **out)
{
    static const char *const names[] = {"bos_token", "eos_token",
                                        "unk_token", "sep_token",
                                        "pad_token", "cls_token",
                                        "mask_token"};
    json_t *o = json_object();
    if (o == NULL)
        return TG_ENOMEM;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        json_t *v = json_object_get(cfg, names[i]);
        if (json_is_object(v))
            v = json_object_get(v, "content");
        if (json_is_string(v) && json_string_length(v) > 0 &&
            json_object_set(o, names[i], v) != 0) {
            json_decref(o);
            return TG_ENOMEM;
        }
    }
    json_t *extra = json_object_get(cfg, "additional_special_tokens");
    if (json_is_array(extra) && json_array_size(extra) > 0) {
        json_t *list = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(extra, i, e)
        {
            json_t *s = json_is_object(e) ? json_object_get(e, "content") : e;
            if (json_is_string(s))
                json_array_append(list, s);
        }
        if (list == NULL ||
            (json_array_size(list) > 0 &&
             json_object_set(o, "additional_special_tokens", list) != 0)) {
            json_decref(list);
            json_decref(o);
            return TG_ENOMEM;
        }
        json_decref(list);
    }
    *out = o;
    return 0;
}

/* ---- loading ------------------------------------------------------------------- */

void ct_template_free(struct ct_template *t)
{
    if (t == NULL)
        return;
    jj_template_free(t->tmpl);
    jj_template_free(t->tmpl_tools);
    free(t->source);
    json_decref(t->specials);
    memset(t, 0, sizeof(*t));
}

static int compile(const char *text, const char *what, struct jj_template **out,
                   char *err, size_t errlen)
{
    char msg[400];
    int rc = jj_template_parse(text, strlen(text), out, msg, sizeof msg);
    if (rc != 0)
        tg_err_set(err, errlen, rc, "%s: %s", what, msg);
    return rc;
}

int ct_template_load_text(struct ct_template *t, const char *text,
                          size_t len, json_t *specials, char *err,
                          size_t errlen)
{
    memset(t, 0, sizeof(*t));
    t->source = malloc(len + 1);
    if (t->source == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    memcpy(t->source, text, len);
    t->source[len] = '\0';
    int rc = jj_template_parse(text, len, &t->tmpl, err, errlen);
    if (rc != 0) {
        ct_template_free(t);
        return rc;
    }
    t->specials = specials != NULL ? json_incref(specials) : json_object();
    if (t->specials == NULL) {
        ct_template_free(t);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    t->tool_format = ct_tool_format_detect(t->source);
    snprintf(t->path, sizeof t->path, "(text)");
    return 0;
}

/* Loads the template of config file `cfg_path` (may be NULL: no config)
 * with the template text from `jinja_path` when non-NULL. */
static int load(struct ct_template *t, const char *jinja_path,
                const char *cfg_path, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    json_t *cfg = NULL;
    int rc = 0;
    if (cfg_path != NULL && (rc = load_config(cfg_path, &cfg, err, errlen)))
        return rc;
    char *text = NULL, *tools_text = NULL;
    size_t len = 0;
    if (jinja_path != NULL) {
        rc = read_all(jinja_path, &text, &len, err, errlen);
    } else {
        rc = config_template(cfg, cfg_path, "default", &text, err, errlen);
        if (rc == 0) {
            len = strlen(text);
            int r2 = config_template(cfg, cfg_path, "tool_use", &tools_text,
                                     err, errlen);
            if (r2 != 0 && r2 != TG_ENOTFOUND)
                rc = r2;
        }
    }
    json_t *specials = NULL;
    if (rc == 0 && cfg != NULL && specials_of(cfg, &specials) != 0)
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    const char *where = jinja_path != NULL ? jinja_path : cfg_path;
    if (rc == 0) {
        char msg[512];
        rc = ct_template_load_text(t, text, len, specials, msg, sizeof msg);
        if (rc != 0)
            tg_err_set(err, errlen, rc, "%s: %s", where, msg);
    }
    if (rc == 0 && tools_text != NULL &&
        (rc = compile(tools_text, where, &t->tmpl_tools, err, errlen)) != 0)
        ct_template_free(t);
    if (rc == 0)
        snprintf(t->path, sizeof t->path, "%s", where);
    json_decref(specials);
    json_decref(cfg);
    free(text);
    free(tools_text);
    return rc;
}

int ct_template_load_file(struct ct_template *t, const char *path, char *err,
                          size_t errlen)
{
    if (is_json_path(path))
        return load(t, NULL, path, err, errlen);
    return load(t, path, NULL, err, errlen);
}

int ct_template_load_dir(struct ct_template *t, const char *dir, char *err,
                         size_t errlen)
{
    memset(t, 0, sizeof(*t));
    char jinja[4096], cfg[4096];
    if ((size_t)snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir) >=
        sizeof jinja)
        return tg_err_set(err, errlen, TG_EINVAL, "%s: path too long", dir);
    bool have_jinja = file_exists(jinja);
    int rc = find_config(dir, cfg, sizeof cfg, err, errlen);
    if (rc != 0 && rc != TG_ENOENT)
        return rc;
    bool have_cfg = rc == 0;
    if (!have_jinja && !have_cfg)
        return tg_err_set(err, errlen, TG_ENOENT,
                          "%s: no chat_template.jinja or "
                          "tokenizer_config.json",
                          dir);
    return load(t, have_jinja ? jinja : NULL, have_cfg ? cfg : NULL, err,
                errlen);
}

/* ---- rendering -------------------------------------------------------------------- */

static bool reserved(const char *name)
{
    return !strcmp(name, "messages") || !strcmp(name, "tools") ||
           !strcmp(name, "documents") ||
           !strcmp(name, "add_generation_prompt");
}

/* transformers' continue_final_message: keep the output up to the end of
 * the final message's content (its stripped text, found last). */
static int cut_final(json_t *messages, char *out, size_t *len, char *err,
                     size_t errlen)
{
    json_t *last = json_array_get(messages, json_array_size(messages) - 1);
    json_t *content = json_object_get(last, "content");
    const char *msg = NULL;
    if (json_is_string(content)) {
        msg = json_string_value(content);
    } else if (json_is_array(content)) {
        for (size_t i = json_array_size(content); i-- > 0 && msg == NULL;) {
            json_t *t = json_object_get(json_array_get(content, i), "text");
            if (json_is_string(t))
                msg = json_string_value(t);
        }
    }
    if (msg == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "continue_final_message: the final message has no "
                          "text content");
    size_t n = strlen(msg), a, b;
    jj_py_strip(msg, n, &a, &b);
    size_t sl = b - a;
    const char *hit = NULL;
    if (sl <= *len)
        for (size_t i = *len - sl + 1; i-- > 0;)
            if (memcmp(out + i, msg + a, sl) == 0) {
                hit = out + i;
                break;
            }
    if (hit == NULL)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "continue_final_message is set but the final "
                          "message does not appear in the rendered chat");
    size_t loc = (size_t)(hit - out);
    size_t lstripped = n - a;
    if (loc + lstripped <= *len && memcmp(out + loc, msg + a, lstripped) == 0 &&
        a == 0)
        *len = loc + lstripped;
    else
        *len = loc + sl;
    out[*len] = '\0';
    return 0;
}

int ct_template_render(const struct ct_template *t, json_t *messages,
                       json_t *tools, const struct ct_render_opts *o,
                       char **out, size_t *out_len, char *err, size_t errlen)
{
    static const struct ct_render_opts zero;
    *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (o == NULL)
        o = &zero;
    if (t == NULL || t->tmpl == NULL)
        return tg_err_set(err, errlen, TG_EINVAL, "no chat template loaded");
    if (!json_is_array(messages))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "messages must be a JSON array");
    if (tools != NULL && !json_is_array(tools) && !json_is_null(tools))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tools must be a JSON array");
    if (o->kwargs != NULL && !json_is_object(o->kwargs))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "chat_template_kwargs must be an object");
    if (o->continue_final_message && json_array_size(messages) == 0)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "continue_final_message needs a final message");
    struct jj_vars *v = jj_vars_new();
    if (v == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    int rc = 0;
    const char *key;
    json_t *val;
    json_object_foreach(t->specials, key, val)
    {
        if (rc == 0)
            rc = jj_vars_set_json(v, key, val);
    }
    if (o->kwargs != NULL) {
        json_object_foreach(o->kwargs, key, val)
        {
            if (rc == 0 && reserved(key)) {
                rc = tg_err_set(err, errlen, TG_EINVAL,
                                "chat_template_kwargs may not set '%s'", key);
                break;
            }
            if (rc == 0)
                rc = jj_vars_set_json(v, key, val);
        }
    }
    json_t *none = json_null();
    bool has_tools = tools != NULL && json_is_array(tools);
    if (rc == 0)
        rc = jj_vars_set_json(v, "messages", messages);
    if (rc == 0)
        rc = jj_vars_set_json(v, "tools", has_tools ? tools : none);
    if (rc == 0)
        rc = jj_vars_set_json(v, "documents", none);
    if (rc == 0)
        rc = jj_vars_set_bool(v, "add_generation_prompt",
                              o->add_generation_prompt);
    if (rc == TG_ENOMEM)
        tg_err_set(err, errlen, rc, "out of memory");
    const struct jj_template *tmpl =
        has_tools && t->tmpl_tools != NULL ? t->tmpl_tools : t->tmpl;
    char *text = NULL;
    size_t len = 0;
    if (rc == 0) {
        struct jj_render_opts ro = {.limits = o->limits, .now = o->now};
        rc = jj_render(tmpl, v, &ro, &text, &len, err, errlen);
    }
    jj_vars_free(v);
    if (rc == 0 && o->continue_final_message)
        rc = cut_final(messages, text, &len, err, errlen);
    if (rc != 0) {
        free(text);
        return rc;
    }
    *out = text;
    if (out_len != NULL)
        *out_len = len;
    return 0;
}

/* ---- the conversation value --------------------------------------------- */

/* A JSON string of s, which the conversation's contract holds to be UTF-8
 * (ct_chat.h; the front ends checked it): not validated again, since a
 * long conversation's text is most of what rendering it reads. */
static json_t *str(const char *s)
{
    return s != NULL ? json_stringn_nocheck(s, strlen(s)) : NULL;
}

/* obj[key] = v (stolen); 0 or -1 (out of memory: v NULL or not set). */
static int put(json_t *obj, const char *key, json_t *v)
{
    return v != NULL && json_object_set_new(obj, key, v) == 0 ? 0 : -1;
}

/* The template's form of an assistant's calls. */
static json_t *calls_json(const struct ct_message *m)
{
    json_t *arr = json_array();
    for (size_t k = 0; arr != NULL && k < m->n_calls; k++) {
        const struct ct_tool_call *c = &m->calls[k];
        const char *a = c->arguments != NULL ? c->arguments : "";
        /* arguments: the value their text holds (vLLM), else the text */
        json_error_t je;
        json_t *args = json_loadb(a, strlen(a), JSON_DECODE_ANY, &je);
        if (args == NULL)
            args = str(a);
        json_t *fn = json_object(), *call = json_object();
        int bad = fn == NULL || call == NULL || args == NULL ||
                  put(fn, "name", str(c->name));
        if (bad)
            json_decref(args);
        else
            bad = put(fn, "arguments", args); /* args stolen */
        bad = bad || put(call, "id", str(c->id)) ||
              put(call, "type", json_string("function"));
        if (!bad) {
            bad = put(call, "function", fn);
            fn = NULL;
        }
        if (!bad) {
            bad = json_array_append_new(arr, call) != 0;
            call = NULL;
        }
        json_decref(fn);
        json_decref(call);
        if (bad) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *messages_json(const struct ct_chat *c)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr != NULL && i < c->n_messages; i++) {
        const struct ct_message *m = &c->messages[i];
        json_t *o = json_object();
        int bad = o == NULL || json_array_append_new(arr, o) != 0 ||
                  put(o, "role", json_string(ct_role_name(m->role))) ||
                  put(o, "content", str(m->content != NULL ? m->content : ""));
        if (!bad && m->name != NULL)
            bad = put(o, "name", str(m->name));
        if (!bad && m->reasoning_content != NULL)
            bad = put(o, "reasoning_content", str(m->reasoning_content));
        if (!bad && m->n_calls > 0)
            bad = put(o, "tool_calls", calls_json(m));
        if (!bad && m->tool_call_id != NULL)
            bad = put(o, "tool_call_id", str(m->tool_call_id));
        if (bad) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

/* A JSON object's text into *out; TG_EINVAL naming `what` otherwise. */
static int object_text(const char *text, const char *what, json_t **out,
                       char *err, size_t errlen)
{
    json_error_t je;
    *out = json_loadb(text, strlen(text), 0, &je);
    if (json_is_object(*out))
        return 0;
    int rc = *out == NULL && json_error_code(&je) == json_error_out_of_memory
                 ? TG_ENOMEM
                 : TG_EINVAL;
    json_decref(*out);
    *out = NULL;
    return tg_err_set(err, errlen, rc, "%s is not a JSON object", what);
}

int ct_template_render_chat(const struct ct_template *t,
                            const struct ct_chat *c, char **out,
                            size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    json_t *msgs = messages_json(c), *tools = NULL, *kwargs = NULL;
    int rc = msgs != NULL ? 0 : TG_ENOMEM;
    if (rc == 0 && c->tools != NULL && (tools = json_array()) == NULL)
        rc = TG_ENOMEM;
    for (size_t i = 0; rc == 0 && tools != NULL && i < c->tools->n; i++) {
        json_t *x = NULL;
        char what[96];
        snprintf(what, sizeof(what), "tools[%zu]", i);
        rc = object_text(c->tools->v[i].spec != NULL ? c->tools->v[i].spec : "",
                         what, &x, err, errlen);
        if (rc == 0 && json_array_append_new(tools, x) != 0)
            rc = TG_ENOMEM;
    }
    if (rc == 0 && c->kwargs != NULL)
        rc = object_text(c->kwargs, "chat_template_kwargs", &kwargs, err,
                         errlen);
    if (rc == 0) {
        struct ct_render_opts o = {
            .add_generation_prompt = c->add_generation_prompt,
            .continue_final_message = c->continue_final_message,
            .kwargs = kwargs,
        };
        rc = ct_template_render(t, msgs, tools, &o, out, out_len, err, errlen);
    } else if (rc == TG_ENOMEM) {
        tg_err_set(err, errlen, rc, "out of memory");
    }
    json_decref(msgs);
    json_decref(tools);
    json_decref(kwargs);
    return rc;
}
