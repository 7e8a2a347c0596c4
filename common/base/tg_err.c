/* tg_err.c — messages and names for the TG_ERR_MAP table. */
#include "common/base/tg_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

const char *tg_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define TG__ERR_MSG(name, value, msg) \
    case (value):                     \
        return msg;
        TG_ERR_MAP(TG__ERR_MSG)
#undef TG__ERR_MSG
    default:
        return "unknown error";
    }
}

const char *tg_err_name(int err)
{
    switch (err) {
    case 0:
        return "OK";
#define TG__ERR_NAME(name, value, msg) \
    case (value):                      \
        return #name;
        TG_ERR_MAP(TG__ERR_NAME)
#undef TG__ERR_NAME
    default:
        return "UNKNOWN";
    }
}

int tg_err_set(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void tg__assert_fail(const char *expr, const char *func, const char *file,
                     int line)
{
    fprintf(stderr, "tangram: assertion failed: %s in %s() at %s:%d\n", expr,
            func, file, line);
    fflush(stderr);
    abort();
}
