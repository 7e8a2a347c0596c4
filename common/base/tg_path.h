/*
 * tg_path.h — a path (or any other value that must stay whole) formatted
 * into a fixed buffer, or an error saying that it does not fit: never a
 * silently cut one, which names another file (".../tokenizer.json" cut to
 * ".../tokeni") or another value.
 */
#ifndef TG_PATH_H
#define TG_PATH_H

#include <stddef.h>

/* Formats like snprintf(out, cap, fmt, ...). Returns 0 when the whole text
 * fits (strlen(out) < cap), else TG_ETOOBIG (TG_EINVAL for an encoding
 * error) with err saying so: "path '<its first 96 bytes>...' is N bytes,
 * longer than the M this program holds". On failure out holds the cut
 * text, which must not be used. cap must be > 0. Thread: any. */
int tg_path_fmt(char *out, size_t cap, char *err, size_t errlen,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif /* TG_PATH_H */
