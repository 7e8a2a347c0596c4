/*
 * tg_err.h — the one table of error codes used across tangram.
 *
 * Every function that can fail returns 0 on success or one of the negative
 * TG_E* codes below. Detail for humans goes to a caller-provided buffer
 * (char *err, size_t errlen), never to a global. "Would block" (TG_EAGAIN) and
 * "finished" (TG_EDONE) are codes too, so loops can be driven by them.
 *
 * The table is an X-macro (libuv's UV_ERRNO_MAP pattern): adding a row adds
 * the enum value, its name for tg_err_name() and its message for
 * tg_strerror() in one place.
 */
#ifndef TG_ERR_H
#define TG_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* XX(name, value, message) */
#define TG_ERR_MAP(XX)                                                   \
    XX(EINVAL, -1, "invalid argument")                                   \
    XX(ENOMEM, -2, "out of memory")                                      \
    XX(EIO, -3, "input/output error")                                    \
    XX(ENOENT, -4, "no such file or directory")                          \
    XX(EFORMAT, -5, "malformed input")                                   \
    XX(ERANGE, -6, "value out of range")                                 \
    XX(EUNSUPPORTED, -7, "not supported")                                \
    XX(EAGAIN, -8, "resource temporarily unavailable")                   \
    XX(EDONE, -9, "finished")                                            \
    XX(ENOSPC, -10, "no free pages")                                     \
    XX(ETOOBIG, -11, "too large")                                        \
    XX(EEXIST, -12, "already exists")                                    \
    XX(ENOTFOUND, -13, "not found")                                      \
    XX(ETIMEDOUT, -14, "timed out")                                      \
    XX(ECANCELED, -15, "canceled")                                       \
    XX(EPROTO, -16, "protocol error")                                    \
    XX(EBUSY, -17, "busy")                                               \
    XX(ENODEV, -18, "no device")                                         \
    XX(EDEVICE, -19, "device error")                                     \
    XX(EINTERNAL, -20, "internal error")                                 \
    XX(ESTARTUP, -21, "start-up failed")

enum tg_err {
    TG_OK = 0,
#define TG__ERR_ENUM(name, value, msg) TG_##name = (value),
    TG_ERR_MAP(TG__ERR_ENUM)
#undef TG__ERR_ENUM
};

/* Returns a static, human-readable message for code `err` (0 gives
 * "success"; an unknown code gives "unknown error"). Thread-safe. */
const char *tg_strerror(int err);

/* Returns the static symbolic name of `err` without the TG_ prefix
 * ("EINVAL", "OK"), or "UNKNOWN". Thread-safe. */
const char *tg_err_name(int err);

/* Writes printf-style detail into err[0..errlen) when err is non-NULL and
 * errlen > 0, then returns `code` unchanged, so failures read
 *     return tg_err_set(err, errlen, TG_EFORMAT, "bad dtype '%s'", s);
 * Thread-safe. */
int tg_err_set(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The one generic checked call (DESIGN.md §8.5; the host-C counterpart of
 * kernels/cuda/cuda_check.cuh): evaluates `expr` once into a local
 * `tg__st` of type `ctype` and, when it differs from `ok`, returns `ret`
 * from the enclosing function (`ret` may use tg__st, e.g. to add detail).
 * Used only through prefixed instances: TG_TRY below, GW_CU_TRY and the
 * others of gpu_worker/gw_cuda_internal.h. */
#define TG__TRY_GEN(ctype, expr, ok, ret)                                \
    do {                                                                 \
        ctype tg__st = (expr);                                           \
        if (tg__st != (ok))                                              \
            return (ret);                                                \
    } while (0)

/* Passes a failure on: when `expr` (a function returning 0 or a TG_E*
 * code) fails, returns its code from the enclosing function. */
#define TG_TRY(expr) TG__TRY_GEN(int, expr, 0, tg__st)

/* Broken invariants (never input errors) stop the process with the
 * statement, function, file and line. */
#define TG_ASSERT(expr)                                                  \
    do {                                                                 \
        if (!(expr))                                                     \
            tg__assert_fail(#expr, __func__, __FILE__, __LINE__);        \
    } while (0)

#ifdef __cplusplus
[[noreturn]]
#else
_Noreturn
#endif
void tg__assert_fail(const char *expr, const char *func,
                               const char *file, int line);

#ifdef __cplusplus
}
#endif
#endif /* TG_ERR_H */
