/*
 * tg_log.h — process-wide logging: text or JSON lines on stderr.
 *
 * Each line carries the time, level, role ("router", "worker", "tool" ...),
 * pid and rank (-1 when the process has none). The level is checked before
 * any formatting happens, so disabled debug lines cost one compare.
 * Logging state is process-wide by nature (one stderr); it is set once at
 * start-up by tg_log_init() before threads start, then only read.
 * kernels/ and proto/ never log.
 */
#ifndef TG_LOG_H
#define TG_LOG_H

enum tg_log_level {
    TG_LOG_ERR = 0,
    TG_LOG_WARN = 1,
    TG_LOG_INFO = 2,
    TG_LOG_DEBUG = 3,
};

enum tg_log_format {
    TG_LOG_TEXT = 0,
    TG_LOG_JSON = 1,
};

/* Sets role (copied, at most 31 bytes kept), rank, level and format.
 * Call once at start-up, before other threads exist. */
void tg_log_init(const char *role, int rank, enum tg_log_level level,
                 enum tg_log_format format);

/* Parses "err|warn|info|debug" and "text|json"; return 0 or TG_EINVAL. */
int tg_log_level_parse(const char *s, enum tg_log_level *out);
int tg_log_format_parse(const char *s, enum tg_log_format *out);

/* The current level; read by the log_* macros before formatting. */
extern enum tg_log_level tg__log_level;

/* Formats and writes one line (thread-safe: one write(2) per line). Use the
 * macros below instead of calling this directly. */
void tg__log_write(enum tg_log_level level, const char *file, int line,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define TG__LOG(lvl, ...)                                          \
    do {                                                           \
        if ((lvl) <= tg__log_level)                                \
            tg__log_write((lvl), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#define log_err(...) TG__LOG(TG_LOG_ERR, __VA_ARGS__)
#define log_warn(...) TG__LOG(TG_LOG_WARN, __VA_ARGS__)
#define log_info(...) TG__LOG(TG_LOG_INFO, __VA_ARGS__)
#define log_debug(...) TG__LOG(TG_LOG_DEBUG, __VA_ARGS__)

#endif /* TG_LOG_H */
