/* tg_log.c — text/JSON log lines, one write(2) each so lines never interleave. */
#include "common/base/tg_log.h"
#include "common/base/tg_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum tg_log_level tg__log_level = TG_LOG_INFO;
static enum tg_log_format log_format = TG_LOG_TEXT;
static char log_role[32] = "tangram";
static int log_rank = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void tg_log_init(const char *role, int rank, enum tg_log_level level,
                 enum tg_log_format format)
{
    if (role != NULL)
        snprintf(log_role, sizeof(log_role), "%s", role);
    log_rank = rank;
    tg__log_level = level;
    log_format = format;
}

int tg_log_level_parse(const char *s, enum tg_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum tg_log_level)i;
            return 0;
        }
    }
    if (strcmp(s, "err") == 0) {
        *out = TG_LOG_ERR;
        return 0;
    }
    return TG_EINVAL;
}

int tg_log_format_parse(const char *s, enum tg_log_format *out)
{
    if (strcmp(s, "text") == 0)
        *out = TG_LOG_TEXT;
    else if (strcmp(s, "json") == 0)
        *out = TG_LOG_JSON;
    else
        return TG_EINVAL;
    return 0;
}

/* Appends `s` JSON-escaped to buf[*n..cap). Truncates silently at cap. */
static void json_escape(char *buf, size_t cap, size_t *n, const char *s)
{
    for (; *s != '\0' && *n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf[(*n)++] = '\\';
            buf[(*n)++] = (char)c;
        } else if (c < 0x20) {
            *n += (size_t)snprintf(buf + *n, cap - *n, "\\u%04x", c);
        } else {
            buf[(*n)++] = (char)c;
        }
    }
}

void tg__log_write(enum tg_log_level level, const char *file, int line,
                   const char *fmt, ...)
{
    char msg[2048];
    char out[4608];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char tbuf[40];
    size_t tl = strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(tbuf + tl, sizeof(tbuf) - tl, ".%03ldZ", ts.tv_nsec / 1000000);

    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    size_t n;
    if (log_format == TG_LOG_JSON) {
        n = (size_t)snprintf(out, sizeof(out),
                             "{\"ts\":\"%s\",\"level\":\"%s\",\"role\":\"",
                             tbuf, level_names[level]);
        json_escape(out, sizeof(out), &n, log_role);
        n += (size_t)snprintf(out + n, sizeof(out) - n,
                              "\",\"pid\":%d,\"rank\":%d,\"src\":\"%s:%d\",\"msg\":\"",
                              (int)getpid(), log_rank, base, line);
        json_escape(out, sizeof(out), &n, msg);
        if (n + 3 < sizeof(out))
            n += (size_t)snprintf(out + n, sizeof(out) - n, "\"}\n");
    } else {
        char rank[16] = "";
        if (log_rank >= 0)
            snprintf(rank, sizeof(rank), "/%d", log_rank);
        n = (size_t)snprintf(out, sizeof(out), "%s %-5s %s%s[%d] %s\n", tbuf,
                             level_names[level], log_role, rank, (int)getpid(),
                             msg);
    }
    if (n >= sizeof(out)) {
        n = sizeof(out) - 1;
        out[n - 1] = '\n';
    }
    ssize_t w = write(STDERR_FILENO, out, n);
    (void)w;
}
