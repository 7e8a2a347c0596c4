/* td_options.c — tangramd's command line over the serving option table
 * (td_options.h). */
#include "daemon/td_options.h"
#include "common/base/tg_err.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char usage[] =
    "usage: tangramd --model DIR [options]\n\n"
    "tangramd serves a Llama-family model over an OpenAI-compatible HTTP API "
    "and gRPC,\nwith per-head (non-uniform) KV-cache compression.";

const struct tg_config_entry *td_options_table(size_t *n)
{
    return tg_serve_opts_table(TG_SERVE_DAEMON, n);
}

/* Sets *dst to a fresh copy of s[0..len). */
static int replace_string(char **dst, const char *s, size_t len, char *err,
                          size_t errlen)
{
    char *copy = strndup(s, len);
    if (copy == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    free(*dst);
    *dst = copy;
    return 0;
}

static int normalize(struct tg_serve_opts *o, char *err, size_t errlen)
{
    if (o->profile != NULL &&
        (o->profile[0] == '\0' || strcasecmp(o->profile, "none") == 0)) {
        free(o->profile);
        o->profile = NULL;
    }
    if (o->served_model_name == NULL || o->served_model_name[0] == '\0') {
        /* Last path component of --model, ignoring trailing slashes. */
        const char *m = o->model;
        size_t end = strlen(m);
        while (end > 1 && m[end - 1] == '/')
            end--;
        size_t start = end;
        while (start > 0 && m[start - 1] != '/')
            start--;
        if (start == end) /* "/" alone */
            return tg_err_set(err, errlen, TG_EINVAL,
                              "--model '%s' has no directory name; set "
                              "--served-model-name", m);
        int rc = replace_string(&o->served_model_name, m + start,
                                end - start, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int cross_check(const struct tg_serve_opts *o, char *err, size_t errlen)
{
    if (o->max_batched_tokens < o->prefill_chunk)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--max-batched-tokens (%lld) must be at least "
                          "--prefill-chunk (%lld): a chunk runs in one step",
                          (long long)o->max_batched_tokens,
                          (long long)o->prefill_chunk);
    if (o->max_batched_tokens < o->max_num_seqs)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--max-batched-tokens (%lld) must be at least "
                          "--max-num-seqs (%lld): every running request "
                          "decodes one token per step",
                          (long long)o->max_batched_tokens,
                          (long long)o->max_num_seqs);
    if (o->router_stall_ms > 0 && o->router_stall_ms < TD_ROUTER_STALL_MIN_MS)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "--router-stall-ms (%lld) must be 0 (never) or at "
                          "least %d: the router reports its loop alive once "
                          "a second",
                          (long long)o->router_stall_ms,
                          TD_ROUTER_STALL_MIN_MS);
    return 0;
}

int td_options_parse(struct tg_serve_opts *o, int argc, char **argv,
                     char **envp, char *err, size_t errlen)
{
    size_t n;
    const struct tg_config_entry *table = td_options_table(&n);
    int rc = tg_config_parse(table, n, o, argc, argv, envp, err, errlen);
    if (rc != 0)
        return rc;
    rc = normalize(o, err, errlen);
    if (rc != 0)
        return rc;
    tg_serve_opts_resolve(o);
    return cross_check(o, err, errlen);
}

int td_options_help(FILE *out)
{
    size_t n;
    const struct tg_config_entry *table = td_options_table(&n);
    return tg_config_help(table, n, usage, out);
}

json_t *td_options_dump_json(const struct tg_serve_opts *o)
{
    size_t n;
    const struct tg_config_entry *table = td_options_table(&n);
    return tg_config_dump_json(table, n, o);
}

void td_options_free(struct tg_serve_opts *o)
{
    tg_serve_opts_free(o);
}
