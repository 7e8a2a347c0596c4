/* ct_template.c — chat templates rendered as their Jinja sources do
 * (ct_template.h). Each render function below follows its template's
 * statements in order; comments quote the Jinja they mirror. */
#include "common/ct_template.h"
#include "common/tg_err.h"
#include "common/tg_json.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- names */

static const struct {
    const char *name;
    enum ct_family family;
} family_names[] = {
    {"chatml-qwen2.5", CT_FAMILY_QWEN25},
    {"qwen3", CT_FAMILY_QWEN3},
    {"llama3", CT_FAMILY_LLAMA3},
    {"llama3.2", CT_FAMILY_LLAMA32},
    /* aliases */
    {"qwen2.5", CT_FAMILY_QWEN25},
    {"llama3.1", CT_FAMILY_LLAMA3},
    {"llama3.3", CT_FAMILY_LLAMA3},
};

#define VALID_NAMES "chatml-qwen2.5, qwen3, llama3, llama3.2"

const char *ct_family_name(enum ct_family f)
{
    for (size_t i = 0; i < sizeof family_names / sizeof family_names[0]; i++)
        if (family_names[i].family == f)
            return family_names[i].name;
    return "unknown";
}

int ct_family_parse(const char *name, enum ct_family *out, char *err,
                    size_t errlen)
{
    *out = CT_FAMILY_UNKNOWN;
    if (name == NULL)
        return tg_err_set(err, errlen, TG_EINVAL, "no template name given");
    for (size_t i = 0; i < sizeof family_names / sizeof family_names[0]; i++)
        if (strcmp(family_names[i].name, name) == 0) {
            *out = family_names[i].family;
            return 0;
        }
    return tg_err_set(err, errlen, TG_EINVAL,
                      "unknown chat template name '%s' (valid: " VALID_NAMES
                      ")",
                      name);
}

/* ------------------------------------------------------------ detection */

static int is_ascii_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

uint64_t ct_template_hash(const char *text)
{
    /* FNV-1a, 64-bit (Fowler/Noll/Vo): offset basis 14695981039346656037,
     * prime 1099511628211. */
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t b = 0, e = strlen(text);
    while (b < e && is_ascii_space(text[b]))
        b++;
    while (e > b && is_ascii_space(text[e - 1]))
        e--;
    for (size_t i = b; i < e; i++) {
        if (text[i] == '\r' && i + 1 < e && text[i + 1] == '\n')
            continue;
        h ^= (unsigned char)text[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Hashes of the templates in the project data folder (data/SOURCES.tsv). */
static const struct {
    uint64_t hash;
    enum ct_family family;
} known_templates[] = {
    {0xe642ce246d7f2e3dULL, CT_FAMILY_QWEN25},  /* Qwen2.5-*-Instruct */
    {0x2bfdb7aa9754484eULL, CT_FAMILY_QWEN3},   /* Qwen3-4B (hybrid) */
    {0x368f4c34b8554414ULL, CT_FAMILY_LLAMA32}, /* Llama-3.2-3B-Instruct */
    {0xcc0368e1ffb6b958ULL, CT_FAMILY_LLAMA3},  /* Llama-3.3-70B-Instruct */
};

static bool has(const char *text, const char *needle)
{
    return strstr(text, needle) != NULL;
}

/* Markers that only the supported templates carry together. They are
 * strict on purpose: a look-alike that differs in behaviour (Qwen2.5-Math's
 * system prompt, QwQ's forced <think>, Llama-3.0 without the date preamble)
 * must stay unknown rather than render wrongly. String literals are matched
 * as they appear in the template source, where "\n" is written escaped. */
static enum ct_family fingerprint(const char *t)
{
    if (has(t, "<|im_start|>") && has(t, "<|im_end|>")) {
        if (has(t, "enable_thinking") && has(t, "reasoning_content") &&
            has(t, "last_query_index") &&
            has(t, "'<think>\\n\\n</think>\\n\\n'"))
            return CT_FAMILY_QWEN3;
        if (has(t, "You are Qwen, created by Alibaba Cloud. You are a "
                   "helpful assistant.") &&
            !has(t, "think"))
            return CT_FAMILY_QWEN25;
        return CT_FAMILY_UNKNOWN;
    }
    if (has(t, "bos_token") && has(t, "<|start_header_id|>") &&
        has(t, "<|end_header_id|>\\n\\n") && has(t, "<|eot_id|>") &&
        has(t, "Cutting Knowledge Date: December 2023\\n") &&
        has(t, "Today Date: ") && has(t, "| trim")) {
        if (has(t, "strftime_now"))
            return CT_FAMILY_LLAMA32;
        if (has(t, "\"26 Jul 2024\""))
            return CT_FAMILY_LLAMA3;
    }
    return CT_FAMILY_UNKNOWN;
}

int ct_template_detect(const char *text, struct ct_template *out, char *err,
                       size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (text == NULL)
        return tg_err_set(err, errlen, TG_EINVAL, "no chat template text");
    out->hash = ct_template_hash(text);
    for (size_t i = 0; i < sizeof known_templates / sizeof known_templates[0];
         i++)
        if (known_templates[i].hash == out->hash) {
            out->family = known_templates[i].family;
            out->match = CT_MATCH_EXACT;
            return 0;
        }
    out->family = fingerprint(text);
    if (out->family != CT_FAMILY_UNKNOWN) {
        out->match = CT_MATCH_FINGERPRINT;
        return 0;
    }
    /* Name the template by its hash and first non-blank line (cut short). */
    const char *p = text;
    while (*p != '\0' && is_ascii_space(*p))
        p++;
    int n = (int)strcspn(p, "\r\n");
    if (n > 60)
        n = 60;
    return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                      "unknown chat template (fnv1a64 %016llx, first line "
                      "'%.*s'); pass a template name (" VALID_NAMES ")",
                      (unsigned long long)out->hash, n, p);
}

int ct_template_select(const char *text, const char *name,
                       struct ct_template *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (name != NULL) {
        int rc = ct_family_parse(name, &out->family, err, errlen);
        if (rc != 0)
            return rc;
        out->match = CT_MATCH_NAMED;
        out->hash = text != NULL ? ct_template_hash(text) : 0;
        return 0;
    }
    if (text == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "no chat template and no template name");
    return ct_template_detect(text, out, err, errlen);
}

/* -------------------------------------------------------------- loading */

static int read_all(const char *path, char **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        return tg_err_set(err, errlen, e == ENOENT ? TG_ENOENT : TG_EIO,
                          "%s: %s", path, strerror(e));
    }
    size_t cap = 8192, len = 0;
    char *buf = malloc(cap);
    int rc = 0;
    if (buf == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto out;
    }
    for (;;) {
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
                goto out;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: read error", path);
        goto out;
    }
    buf[len] = '\0';
    if (strlen(buf) != len) {
        rc = tg_err_set(err, errlen, TG_EFORMAT, "%s: contains NUL bytes",
                        path);
        goto out;
    }
    *out = buf;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}

static int template_from_config(const char *path, char **out, char *err,
                                size_t errlen)
{
    json_t *doc = NULL;
    int rc = tg_json_load_file(path, &doc, err, errlen);
    if (rc != 0)
        return rc;
    const char *text = NULL;
    json_t *ct = json_object_get(doc, "chat_template");
    if (json_is_string(ct)) {
        text = json_string_value(ct);
    } else if (json_is_array(ct)) {
        /* transformers' multi-template form: [{"name", "template"}, ...] */
        size_t i;
        json_t *item;
        json_array_foreach(ct, i, item)
        {
            json_t *nm = json_object_get(item, "name");
            json_t *tp = json_object_get(item, "template");
            if (json_is_string(nm) && json_is_string(tp) &&
                strcmp(json_string_value(nm), "default") == 0)
                text = json_string_value(tp);
        }
    }
    if (text == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOTFOUND,
                        "%s: no \"chat_template\" string (or \"default\" "
                        "entry)",
                        path);
        goto out;
    }
    *out = strdup(text);
    if (*out == NULL)
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
out:
    json_decref(doc);
    return rc;
}

int ct_template_read_file(const char *path, char **out, char *err,
                          size_t errlen)
{
    *out = NULL;
    size_t n = strlen(path);
    if (n >= 5 && strcmp(path + n - 5, ".json") == 0)
        return template_from_config(path, out, err, errlen);
    return read_all(path, out, err, errlen);
}

static int file_exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return 0;
    fclose(f);
    return 1;
}

int ct_template_read_dir(const char *dir, char **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    char path[4096];
    static const char *const names[] = {"chat_template.jinja",
                                        "tokenizer_config.json"};
    for (size_t i = 0; i < 2; i++) {
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, names[i]) >=
            sizeof path)
            return tg_err_set(err, errlen, TG_EINVAL, "%s: path too long",
                              dir);
        if (file_exists(path))
            return ct_template_read_file(path, out, err, errlen);
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        int e = errno;
        return tg_err_set(err, errlen, e == ENOENT ? TG_ENOENT : TG_EIO,
                          "%s: %s", dir, strerror(e));
    }
    char found[1024] = "";
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, "tokenizer_config.", 17) == 0 && len > 22 &&
            strcmp(de->d_name + len - 5, ".json") == 0 &&
            len < sizeof found) {
            count++;
            memcpy(found, de->d_name, len + 1);
        }
    }
    closedir(d);
    if (count == 0)
        return tg_err_set(err, errlen, TG_ENOENT,
                          "%s: no chat_template.jinja or "
                          "tokenizer_config.json",
                          dir);
    if (count > 1)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "%s: several tokenizer_config.*.json files; pass "
                          "one with --template-file",
                          dir);
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, found) >=
        sizeof path)
        return tg_err_set(err, errlen, TG_EINVAL, "%s: path too long", dir);
    return ct_template_read_file(path, out, err, errlen);
}

/* ------------------------------------------------------- string builder */

struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void sb_add(struct sbuf *s, const char *x, size_t n)
{
    if (s->oom)
        return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *np = realloc(s->p, cap);
        if (np == NULL) {
            s->oom = true;
            return;
        }
        s->p = np;
        s->cap = cap;
    }
    memcpy(s->p + s->len, x, n);
    s->len += n;
    s->p[s->len] = '\0';
}

static void sb_str(struct sbuf *s, const char *x)
{
    sb_add(s, x, strlen(x));
}

/* A borrowed byte range of a message string. */
struct span {
    const char *p;
    size_t n;
};

static void sb_span(struct sbuf *s, struct span x)
{
    sb_add(s, x.p, x.n);
}

static struct span span_of(const char *x)
{
    return (struct span){x, strlen(x)};
}

/* -------------------------------------------- Python string operations */

/* Decodes one UTF-8 sequence of exactly n bytes at p; -1 if not one. */
static long utf8_decode(const unsigned char *p, size_t n)
{
    if (n == 1 && p[0] < 0x80)
        return p[0];
    if (n == 2 && (p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80)
        return ((long)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    if (n == 3 && (p[0] & 0xF0) == 0xE0 && (p[1] & 0xC0) == 0x80 &&
        (p[2] & 0xC0) == 0x80)
        return ((long)(p[0] & 0x0F) << 12) | ((long)(p[1] & 0x3F) << 6) |
               (p[2] & 0x3F);
    if (n == 4 && (p[0] & 0xF8) == 0xF0 && (p[1] & 0xC0) == 0x80 &&
        (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80)
        return ((long)(p[0] & 0x07) << 18) | ((long)(p[1] & 0x3F) << 12) |
               ((long)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    return -1;
}

static size_t utf8_len(unsigned char lead)
{
    if (lead < 0x80)
        return 1;
    if ((lead & 0xE0) == 0xC0)
        return 2;
    if ((lead & 0xF0) == 0xE0)
        return 3;
    if ((lead & 0xF8) == 0xF0)
        return 4;
    return 0;
}

/* Python's str.isspace() set, which str.strip() with no argument removes
 * (Unicode White_Space plus the separators U+001C..U+001F). */
static bool py_isspace(long c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) ||
           c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Jinja's `| trim` filter: Python str.strip() on the decoded string. Bytes
 * that are not valid UTF-8 count as non-space. */
static struct span py_strip(struct span s)
{
    const unsigned char *p = (const unsigned char *)s.p;
    size_t b = 0, e = s.n;
    while (b < e) {
        size_t k = utf8_len(p[b]);
        if (k == 0 || b + k > e || !py_isspace(utf8_decode(p + b, k)))
            break;
        b += k;
    }
    while (e > b) {
        size_t st = e - 1, back = 0;
        while (st > b && (p[st] & 0xC0) == 0x80 && back < 3) {
            st--;
            back++;
        }
        if (!py_isspace(utf8_decode(p + st, e - st)))
            break;
        e = st;
    }
    return (struct span){s.p + b, e - b};
}

static struct span lstrip_nl(struct span s)
{
    while (s.n > 0 && s.p[0] == '\n') {
        s.p++;
        s.n--;
    }
    return s;
}

static struct span rstrip_nl(struct span s)
{
    while (s.n > 0 && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}

/* First / last occurrence of needle in s, or NULL. */
static const char *find_first(struct span s, const char *needle)
{
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= s.n; i++)
        if (memcmp(s.p + i, needle, m) == 0)
            return s.p + i;
    return NULL;
}

static const char *find_last(struct span s, const char *needle)
{
    size_t m = strlen(needle);
    if (m > s.n)
        return NULL;
    for (size_t i = s.n - m + 1; i-- > 0;)
        if (memcmp(s.p + i, needle, m) == 0)
            return s.p + i;
    return NULL;
}

static bool starts_with(const char *s, const char *pre)
{
    return strncmp(s, pre, strlen(pre)) == 0;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && memcmp(s + n - m, suf, m) == 0;
}

static bool is_role(const struct ct_message *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

/* ------------------------------------------------------------ Qwen2.5 */

#define QWEN25_DEFAULT_SYSTEM                                            \
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

static void render_qwen25(struct sbuf *o, const struct ct_message *m,
                          size_t n, const struct ct_options *opt)
{
    /* {%- if messages[0]['role'] == 'system' %} ... {%- else %} default */
    if (is_role(&m[0], "system")) {
        sb_str(o, "<|im_start|>system\n");
        sb_str(o, m[0].content);
        sb_str(o, "<|im_end|>\n");
    } else {
        sb_str(o, "<|im_start|>system\n" QWEN25_DEFAULT_SYSTEM
                  "<|im_end|>\n");
    }
    /* user, later system, and assistant without tool_calls render alike;
     * any other role matches no branch and renders nothing. */
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i > 0) ||
            is_role(&m[i], "assistant")) {
            sb_str(o, "<|im_start|>");
            sb_str(o, m[i].role);
            sb_str(o, "\n");
            sb_str(o, m[i].content);
            sb_str(o, "<|im_end|>\n");
        }
    }
    if (opt->add_generation_prompt)
        sb_str(o, "<|im_start|>assistant\n");
}

/* --------------------------------------------------------------- Qwen3 */

static void render_qwen3(struct sbuf *o, const struct ct_message *m, size_t n,
                         const struct ct_options *opt)
{
    if (is_role(&m[0], "system")) {
        sb_str(o, "<|im_start|>system\n");
        sb_str(o, m[0].content);
        sb_str(o, "<|im_end|>\n");
    }
    /* ns.last_query_index: the last user message that is not a wrapped
     * tool response (scanning backwards); messages|length - 1 if none. */
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        if (is_role(&m[k], "user") &&
            !(starts_with(m[k].content, "<tool_response>") &&
              ends_with(m[k].content, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i > 0)) {
            sb_str(o, "<|im_start|>");
            sb_str(o, m[i].role);
            sb_str(o, "\n");
            sb_str(o, m[i].content);
            sb_str(o, "<|im_end|>\n");
            continue;
        }
        if (!is_role(&m[i], "assistant"))
            continue;
        struct span content = span_of(m[i].content);
        struct span reasoning = {"", 0};
        if (m[i].reasoning_content != NULL) {
            reasoning = span_of(m[i].reasoning_content);
        } else if (find_first(content, "</think>") != NULL) {
            /* content = content.split('</think>')[-1].lstrip('\n')
             * reasoning = content.split('</think>')[0].rstrip('\n')
             *                    .split('<think>')[-1].lstrip('\n') */
            const char *first = find_first(content, "</think>");
            const char *last = find_last(content, "</think>");
            struct span after = {last + 8,
                                 (size_t)(content.p + content.n - last - 8)};
            struct span before = {content.p, (size_t)(first - content.p)};
            before = rstrip_nl(before);
            const char *open = find_last(before, "<think>");
            if (open != NULL)
                before = (struct span){open + 7,
                                       (size_t)(before.p + before.n - open -
                                                7)};
            reasoning = lstrip_nl(before);
            content = lstrip_nl(after);
        }
        sb_str(o, "<|im_start|>assistant\n");
        if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
            sb_str(o, "<think>\n");
            sb_span(o, lstrip_nl(rstrip_nl(reasoning)));
            sb_str(o, "\n</think>\n\n");
            sb_span(o, lstrip_nl(content));
        } else {
            sb_span(o, content);
        }
        sb_str(o, "<|im_end|>\n");
    }
    if (opt->add_generation_prompt) {
        sb_str(o, "<|im_start|>assistant\n");
        if (opt->enable_thinking == CT_THINKING_OFF)
            sb_str(o, "<think>\n\n</think>\n\n");
    }
}

/* -------------------------------------------------------------- Llama-3 */

/* strftime_now("%d %b %Y") in the C locale, local time, as transformers'
 * datetime.now().strftime gives it. */
static void today_string(char *buf, size_t n)
{
    static const char *const mon[12] = {"Jan", "Feb", "Mar", "Apr",
                                        "May", "Jun", "Jul", "Aug",
                                        "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm) == NULL) {
        snprintf(buf, n, "26 Jul 2024");
        return;
    }
    snprintf(buf, n, "%02d %s %d", tm.tm_mday, mon[tm.tm_mon % 12],
             tm.tm_year + 1900);
}

static void render_llama3(struct sbuf *o, const struct ct_message *m,
                          size_t n, const struct ct_options *opt,
                          bool date_today)
{
    char today[32];
    const char *date = opt->date_string;
    if (date == NULL) {
        if (date_today) {
            today_string(today, sizeof today);
            date = today;
        } else {
            date = "26 Jul 2024";
        }
    }
    sb_str(o, "<|begin_of_text|>");
    /* The system message is lifted out, trimmed, after the preamble. */
    size_t start = 0;
    struct span system = {"", 0};
    if (is_role(&m[0], "system")) {
        system = py_strip(span_of(m[0].content));
        start = 1;
    }
    sb_str(o, "<|start_header_id|>system<|end_header_id|>\n\n"
              "Cutting Knowledge Date: December 2023\n"
              "Today Date: ");
    sb_str(o, date);
    sb_str(o, "\n\n");
    sb_span(o, system);
    sb_str(o, "<|eot_id|>");
    /* Every remaining message, whatever its role, gets a header. */
    for (size_t i = start; i < n; i++) {
        sb_str(o, "<|start_header_id|>");
        sb_str(o, m[i].role);
        sb_str(o, "<|end_header_id|>\n\n");
        sb_span(o, py_strip(span_of(m[i].content)));
        sb_str(o, "<|eot_id|>");
    }
    if (opt->add_generation_prompt)
        sb_str(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* --------------------------------------------------------------- render */

static int check_messages(const struct ct_template *t,
                          const struct ct_message *m, size_t n,
                          const struct ct_options *opt, char *err,
                          size_t errlen)
{
    if (opt->tools)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "tool definitions are not supported by the %s "
                          "chat template renderer",
                          ct_family_name(t->family));
    if (n > 0 && m == NULL)
        return tg_err_set(err, errlen, TG_EINVAL, "messages is NULL");
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "messages[%zu]: missing role", i);
        if (m[i].content == NULL)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "messages[%zu]: missing content", i);
        if (m[i].tool_calls)
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "messages[%zu]: tool calls are not supported",
                              i);
        if (is_role(&m[i], "tool") || is_role(&m[i], "ipython"))
            return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                              "messages[%zu]: role '%s' (tool results) is "
                              "not supported",
                              i, m[i].role);
    }
    /* Every supported template reads messages[0]; Jinja fails on an empty
     * list ("list object has no element 0"). */
    if (n == 0)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "messages is empty (the %s template needs at "
                          "least one message)",
                          ct_family_name(t->family));
    return 0;
}

int ct_render(const struct ct_template *t, const struct ct_message *messages,
              size_t n, const struct ct_options *opt, char **out,
              size_t *out_len, char *err, size_t errlen)
{
    static const struct ct_options zero_opts;
    *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (opt == NULL)
        opt = &zero_opts;
    if (t == NULL || t->family == CT_FAMILY_UNKNOWN)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "no known chat template family to render with");
    int rc = check_messages(t, messages, n, opt, err, errlen);
    if (rc != 0)
        return rc;
    struct sbuf o = {0};
    switch (t->family) {
    case CT_FAMILY_QWEN25:
        render_qwen25(&o, messages, n, opt);
        break;
    case CT_FAMILY_QWEN3:
        render_qwen3(&o, messages, n, opt);
        break;
    case CT_FAMILY_LLAMA3:
        render_llama3(&o, messages, n, opt, false);
        break;
    case CT_FAMILY_LLAMA32:
        render_llama3(&o, messages, n, opt, true);
        break;
    default:
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "chat template family %d is not supported",
                          (int)t->family);
    }
    if (o.oom || o.p == NULL) {
        free(o.p);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    *out = o.p;
    if (out_len != NULL)
        *out_len = o.len;
    return 0;
}
