/*
 * bench_template.c — chat-template rendering (common/chat/ct_template.h over the
 * jj_ Jinja engine) against its peer, python3-jinja2 configured as
 * transformers configures it (tests/reference/render_jinja.py), side by
 * side in one run on the same conversations and templates.
 *
 *   bench-template [--quick]
 *
 * Templates: the Qwen3, Qwen2.5 and Llama-3.2 tokenizer folders and the
 * Llama-3.3 and Hermes-3 (tool_use) .jinja files of the data folder; the
 * tool_use template only renders chats with tools, as the router uses it.
 * Conversations (all generated here, deterministic):
 *   chat-8     a system prompt and 7 short turns;
 *   chat-64    64 messages of ~600 bytes (a long multi-turn chat);
 *   tools-16   4 tool definitions and a history with single tool calls and
 *              tool results (16 messages; a calling turn's content is "",
 *              as the router normalizes null, since Qwen3's template
 *              cannot test `in` on None);
 *   chat-512   512 messages of ~600 bytes (not in --quick).
 * Each cell is the best of R runs of N renders (R = 3, N = 200, 20 for
 * chat-512; --quick: R = 1, N = 5). Ours is timed as the router renders:
 * the conversation value (common/chat/ct_chat.h, ct_template_render_chat,
 * which builds the template's variables from it), and beside it the JSON
 * form alone (ct_template_render): the "value" column is the share of the
 * time the conversion takes, and both must give the same bytes. The
 * template is compiled once before
 * timing on both sides (the router compiles at start-up; transformers caches
 * compiled templates). Prints renders per second of each engine, output
 * MB/s of ours and the speedup, and fails unless both engines produced the
 * same bytes for every cell. The peer runs as one $TANGRAM_PYTHON process
 * for all cells (startup excluded).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/chat/ct_template.h"
#include "tests/support/tt_support.h"

#define PROG "bench-template"

struct tmpl_src {
    const char *name, *rel;
    int is_dir;
    int tools_only; /* a tool_use template: it iterates `tools` */
};

static const struct tmpl_src TEMPLATES[] = {
    {"qwen3", "tokenizers/qwen3", 1, 0},
    {"qwen2.5", "tokenizers/qwen2.5", 1, 0},
    {"llama-3.2", "tokenizers/llama3", 1, 0},
    {"llama-3.3", "chat_templates/meta-llama-Llama-3.3-70B-Instruct.jinja", 0, 0},
    {"hermes-3", "chat_templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
     0, 1},
};
#define N_TEMPLATES (sizeof(TEMPLATES) / sizeof(TEMPLATES[0]))

enum conv { CONV_CHAT8, CONV_CHAT64, CONV_TOOLS16, CONV_CHAT512, N_CONV };
static const char *const CONV_NAMES[N_CONV] = {"chat-8", "chat-64",
                                               "tools-16", "chat-512"};

static void die(const char *what)
{
    fprintf(stderr, PROG ": %s\n", what);
    exit(1);
}

static json_t *msg(const char *role, const char *content)
{
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    if (m == NULL)
        die("out of memory");
    return m;
}

/* ~600 bytes of prose that differs per turn. */
static void prose(char *buf, size_t cap, int turn)
{
    static const char *const words[] = {
        "the", "scheduler", "reserves", "pages", "for", "every", "head",
        "group", "before", "a", "turn", "runs", "so", "admission", "stays",
        "exact", "and", "decode", "never", "waits", "on", "reclaim", "über",
        "größe", "缓存", "κλειδί", "\"quoted\"", "{braces}", "new\nline"};
    size_t n = 0;
    unsigned x = 2463534242u ^ (unsigned)turn * 2654435761u;
    while (n + 16 < cap && n < 600) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        const char *w = words[x % (sizeof(words) / sizeof(words[0]))];
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? " " : "", w);
    }
}

static json_t *tool_def(const char *name, const char *desc)
{
    json_t *t = json_pack(
        "{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s, s:s}, s:{s:s, s:[s,s]}}, "
        "s:[s]}}}",
        "type", "function", "function", "name", name, "description", desc,
        "parameters", "type", "object", "properties", "city", "type",
        "string", "description", "The city", "unit", "type", "string",
        "enum", "celsius", "fahrenheit", "required", "city");
    if (t == NULL)
        die("out of memory");
    return t;
}

/* The messages (and *tools, NULL for none) of conversation c. */
static json_t *conversation(enum conv c, json_t **tools)
{
    json_t *m = json_array();
    char buf[1024];
    *tools = NULL;
    if (m == NULL)
        die("out of memory");
    switch (c) {
    case CONV_CHAT8:
        json_array_append_new(m, msg("system", "You are a concise assistant."));
        for (int i = 0; i < 7; i++) {
            snprintf(buf, sizeof buf, "Turn %d: what does step %d do?", i, i);
            json_array_append_new(m, msg(i % 2 ? "assistant" : "user", buf));
        }
        break;
    case CONV_CHAT64:
    case CONV_CHAT512: {
        int n = c == CONV_CHAT64 ? 64 : 512;
        json_array_append_new(m, msg("system", "You are a careful assistant."));
        for (int i = 1; i < n; i++) {
            prose(buf, sizeof buf, i);
            json_array_append_new(m, msg(i % 2 ? "user" : "assistant", buf));
        }
        break;
    }
    case CONV_TOOLS16:
        *tools = json_array();
        if (*tools == NULL)
            die("out of memory");
        json_array_append_new(*tools, tool_def("get_weather", "Weather now"));
        json_array_append_new(*tools, tool_def("get_forecast", "Next days"));
        json_array_append_new(*tools, tool_def("get_air", "Air quality"));
        json_array_append_new(*tools, tool_def("get_tide", "Tide times"));
        json_array_append_new(m, msg("system", "You can call tools."));
        for (int i = 0; i < 5; i++) {
            snprintf(buf, sizeof buf, "What is the weather in city %d?", i);
            json_array_append_new(m, msg("user", buf));
            char city[32];
            snprintf(city, sizeof city, "City-%d", i);
            json_t *call = json_pack(
                "{s:s, s:s, s:[{s:s, s:s, s:{s:s, s:{s:s, s:s}}}]}", "role",
                "assistant", "content", "", "tool_calls", "id", "call_1", "type",
                "function", "function", "name", "get_weather", "arguments",
                "city", city, "unit", "celsius");
            if (call == NULL)
                die("out of memory");
            json_array_append_new(m, call);
            json_t *res = json_pack("{s:s, s:s, s:s}", "role", "tool",
                                    "tool_call_id", "call_1", "content",
                                    "{\"temperature\": 21, \"sky\": \"clear\"}");
            if (res == NULL)
                die("out of memory");
            json_array_append_new(m, res);
        }
        break;
    default:
        die("bad conversation");
    }
    return m;
}

/* s as a malloc'd string (a JSON string's text, any other value's JSON
 * text), or NULL for NULL. */
static char *text_of(const json_t *v)
{
    if (v == NULL || json_is_null(v))
        return NULL;
    char *t = json_is_string(v) ? strdup(json_string_value(v))
                                : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (t == NULL)
        die("out of memory");
    return t;
}

/* The conversation value of messages (and tools) as the router's front
 * ends build it. */
static void chat_of(const json_t *messages, const json_t *tools,
                    struct ct_chat *c)
{
    memset(c, 0, sizeof(*c));
    c->add_generation_prompt = true;
    size_t n = json_array_size(messages);
    c->messages = calloc(n, sizeof(*c->messages));
    if (c->messages == NULL)
        die("out of memory");
    c->n_messages = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(messages, i);
        struct ct_message *o = &c->messages[i];
        if (ct_role_from_name(json_string_value(json_object_get(m, "role")),
                              &o->role) != 0)
            die("bad role");
        o->content = text_of(json_object_get(m, "content"));
        if (o->content == NULL && (o->content = strdup("")) == NULL)
            die("out of memory");
        o->tool_call_id = text_of(json_object_get(m, "tool_call_id"));
        const json_t *calls = json_object_get(m, "tool_calls");
        o->n_calls = json_array_size(calls);
        if (o->n_calls > 0 &&
            (o->calls = calloc(o->n_calls, sizeof(*o->calls))) == NULL)
            die("out of memory");
        for (size_t k = 0; k < o->n_calls; k++) {
            const json_t *x = json_array_get(calls, k);
            const json_t *fn = json_object_get(x, "function");
            o->calls[k].id = text_of(json_object_get(x, "id"));
            o->calls[k].name = text_of(json_object_get(fn, "name"));
            o->calls[k].arguments = text_of(json_object_get(fn, "arguments"));
        }
    }
    if (tools == NULL)
        return;
    if ((c->tools = ct_tools_new(json_array_size(tools))) == NULL)
        die("out of memory");
    for (size_t i = 0; i < c->tools->n; i++) {
        const json_t *t = json_array_get(tools, i);
        c->tools->v[i].name = text_of(
            json_object_get(json_object_get(t, "function"), "name"));
        c->tools->v[i].spec = text_of(t);
    }
}

struct cell {
    int t;
    enum conv c;
    json_t *messages, *tools;
    struct ct_chat chat; /* the same conversation as the router holds it */
    int iters;
    double ours_s, json_s;
    char *out;
    size_t out_len;
    char out_path[600];
};

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    if (argc > 2 || (argc == 2 && !quick)) {
        fprintf(stderr, "usage: " PROG " [--quick]\n");
        return 2;
    }
    int repeats = quick ? 1 : 3;
    int n_conv = quick ? CONV_CHAT512 : N_CONV;
    char dir[256];
    if (tt_tmpdir_make("bench-template-", dir, sizeof dir) != 0)
        die("cannot make a scratch directory");

    static struct ct_template tmpl[N_TEMPLATES];
    char path[512], err[512];
    for (size_t t = 0; t < N_TEMPLATES; t++) {
        tt_data_path(TEMPLATES[t].rel, path, sizeof path);
        int rc = TEMPLATES[t].is_dir
                     ? ct_template_load_dir(&tmpl[t], path, err, sizeof err)
                     : ct_template_load_file(&tmpl[t], path, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, PROG ": %s: %s\n", path, err);
            return 1;
        }
    }

    /* Cells and the peer's job. */
    size_t n_cells = 0;
    struct cell *cells = calloc(N_TEMPLATES * (size_t)n_conv, sizeof *cells);
    json_t *job = json_pack("{s:i, s:[]}", "repeats", repeats, "cases");
    if (cells == NULL || job == NULL)
        die("out of memory");
    json_t *cases = json_object_get(job, "cases");
    for (size_t k = 0; k < N_TEMPLATES * (size_t)n_conv; k++) {
        int t = (int)(k / (size_t)n_conv);
        enum conv c = (enum conv)(k % (size_t)n_conv);
        if (TEMPLATES[t].tools_only && c != CONV_TOOLS16)
            continue;
        size_t i = n_cells++;
        struct cell *x = &cells[i];
        x->t = t;
        x->c = c;
        x->messages = conversation(x->c, &x->tools);
        chat_of(x->messages, x->tools, &x->chat);
        x->iters = quick ? 5 : x->c == CONV_CHAT512 ? 20 : 200;
        tt_path(x->out_path, sizeof x->out_path, "%s/peer-%zu.txt", dir, i);
        tt_data_path(TEMPLATES[x->t].rel, path, sizeof path);
        json_t *cs = json_pack("{s:s, s:b, s:O, s:O?, s:s, s:i}", "source",
                               path, "is_dir", TEMPLATES[x->t].is_dir,
                               "messages", x->messages, "tools", x->tools,
                               "out", x->out_path, "iters", x->iters);
        if (cs == NULL || json_array_append_new(cases, cs) != 0)
            die("out of memory");
    }

    /* Ours: the conversation value as the router renders it, and the JSON
     * form alone (the same bytes). */
    const struct ct_render_opts ro = {.add_generation_prompt = true};
    int bad = 0;
    for (size_t i = 0; i < n_cells; i++) {
        struct cell *x = &cells[i];
        char *js = NULL;
        size_t js_len = 0;
        if (ct_template_render_chat(&tmpl[x->t], &x->chat, &x->out,
                                    &x->out_len, err, sizeof err) != 0 ||
            ct_template_render(&tmpl[x->t], x->messages, x->tools, &ro, &js,
                               &js_len, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": %s %s: %s\n", TEMPLATES[x->t].name,
                    CONV_NAMES[x->c], err);
            return 1;
        }
        if (js_len != x->out_len || memcmp(js, x->out, js_len) != 0) {
            fprintf(stderr, PROG ": %s %s: the conversation value renders "
                            "differently from its JSON form\n",
                    TEMPLATES[x->t].name, CONV_NAMES[x->c]);
            bad = 1;
        }
        free(js);
        for (int form = 0; form < 2; form++) {
            double best = 0;
            for (int r = 0; r < repeats; r++) {
                double t0 = tt_now_s();
                for (int k = 0; k < x->iters; k++) {
                    char *o = NULL;
                    size_t n = 0;
                    int rc = form == 0
                                 ? ct_template_render_chat(&tmpl[x->t],
                                                           &x->chat, &o, &n,
                                                           err, sizeof err)
                                 : ct_template_render(&tmpl[x->t], x->messages,
                                                      x->tools, &ro, &o, &n,
                                                      err, sizeof err);
                    if (rc != 0)
                        die(err);
                    free(o);
                }
                double dt = tt_now_s() - t0;
                best = r == 0 || dt < best ? dt : best;
            }
            *(form == 0 ? &x->ours_s : &x->json_s) = best;
        }
    }

    /* The peer, one process for every cell. */
    char job_path[600], cmd[2048], src[512];
    tt_path(job_path, sizeof job_path, "%s/job.json", dir);
    if (json_dump_file(job, job_path, 0) != 0)
        die("cannot write the peer's job");
    const char *root = getenv("TANGRAM_SOURCE");
    tt_path(src, sizeof src, "%s/tests/bench/bench_template_peer.py",
            root ? root : ".");
    tt_path(cmd, sizeof cmd, "'%s' '%s' '%s'", tt_python(), src, job_path);
    FILE *peer = popen(cmd, "r");
    if (peer == NULL)
        die("cannot start the peer (python3-jinja2)");

    printf("%-10s %-9s %5s %9s %12s %12s %9s %8s %6s %5s\n", "template",
           "chat", "msgs", "bytes", "ours r/s", "jinja2 r/s", "ours MB/s",
           "speedup", "value", "same");
    double log_sum = 0;
    for (size_t i = 0; i < n_cells; i++) {
        struct cell *x = &cells[i];
        char line[512];
        if (fgets(line, sizeof line, peer) == NULL) {
            fprintf(stderr, PROG ": the peer stopped (is python3-jinja2 "
                            "installed? run %s)\n", cmd);
            return 1;
        }
        json_error_t je;
        json_t *res = json_loads(line, 0, &je);
        double peer_s = res ? json_number_value(json_object_get(res, "seconds")) : 0;
        json_decref(res);
        if (peer_s <= 0)
            die("the peer printed no time");
        /* Same bytes? */
        FILE *f = fopen(x->out_path, "rb");
        int same = 0;
        if (f != NULL) {
            char *buf = tt_bench_malloc(PROG, x->out_len + 1);
            size_t got = fread(buf, 1, x->out_len + 1, f);
            same = got == x->out_len && memcmp(buf, x->out, got) == 0;
            free(buf);
            fclose(f);
        }
        bad |= !same;
        double ours_rps = x->iters / x->ours_s, peer_rps = x->iters / peer_s;
        double mbs = (double)x->out_len * x->iters / x->ours_s / 1e6;
        double speedup = ours_rps / peer_rps;
        log_sum += log(speedup);
        /* the conversion's share of the serving path's time */
        double value = x->ours_s > x->json_s ? 1.0 - x->json_s / x->ours_s : 0;
        printf("%-10s %-9s %5zu %9zu %12.0f %12.0f %9.1f %7.2fx %5.1f%% %5s\n",
               TEMPLATES[x->t].name, CONV_NAMES[x->c],
               json_array_size(x->messages), x->out_len, ours_rps, peer_rps,
               mbs, speedup, 100.0 * value, same ? "yes" : "NO");
    }
    int prc = pclose(peer);
    printf("geometric mean speedup over %zu cells: %.2fx\n", n_cells,
           exp(log_sum / (double)n_cells));
    if (prc != 0) {
        fprintf(stderr, PROG ": the peer failed (status %d)\n", prc);
        bad = 1;
    }
    if (bad)
        fprintf(stderr, PROG ": the engines disagree on at least one cell\n");

    for (size_t i = 0; i < n_cells; i++) {
        json_decref(cells[i].messages);
        json_decref(cells[i].tools);
        ct_chat_free(&cells[i].chat);
        free(cells[i].out);
    }
    free(cells);
    json_decref(job);
    for (size_t t = 0; t < N_TEMPLATES; t++)
        ct_template_free(&tmpl[t]);
    tt_tmpdir_remove(dir);
    return bad ? 1 : 0;
}
