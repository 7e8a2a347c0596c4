/* tg_path.c — whole paths in fixed buffers or an error (tg_path.h). */
#include "common/base/tg_path.h"
#include "common/base/tg_err.h"

#include <stdarg.h>
#include <stdio.h>

int tg_path_fmt(char *out, size_t cap, char *err, size_t errlen,
                const char *fmt, ...)
{
    TG_ASSERT(cap > 0);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0) {
        out[0] = '\0';
        return tg_err_set(err, errlen, TG_EINVAL,
                          "cannot format a path from '%s'", fmt);
    }
    if ((size_t)n >= cap)
        return tg_err_set(err, errlen, TG_ETOOBIG,
                          "path '%.96s...' is %d bytes, longer than the %zu "
                          "this program holds",
                          out, n, cap - 1);
    return 0;
}
