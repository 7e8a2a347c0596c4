/*
 * jj_filter_internal.h — helpers shared by the filter files (jj_filter.c,
 * jj_filter_seq.c, jj_test.c). Not for other modules. Same conventions as
 * jj_internal.h: results are new references, failures are reported in the
 * render context and returned as codes.
 */
#ifndef JJ_FILTER_INTERNAL_H
#define JJ_FILTER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "common/jinja/jj_internal.h"

/* Binds a filter's or method's arguments to the named parameters into
 * local arrays p[] / hv[] (returns from the enclosing function on error). */
#define BIND(fname, ...)                                                     \
    static const char *const params_[] = {__VA_ARGS__};                      \
    enum { NP_ = sizeof params_ / sizeof params_[0] };                       \
    struct jj_val p[NP_];                                                     \
    bool hv[NP_];                                                             \
    if ((rc = jj_bind_args(c, line, fname, params_, NP_, args, nargs,        \
                           kwnames, kwvals, nkw, p, hv)))                    \
        return rc;

#define NOARGS(fname)                                                        \
    if (nargs > 0 || nkw > 0)                                                \
        return jj_fail(c, line, TG_EINVAL,                                   \
                       "TypeError: %s() takes no arguments", fname);

/* An iterator value over l (stolen). */
int jj__f_make_iter(struct jj_ctx *c, int line, struct jj_list *l,
                    struct jj_val *out);

/* The sequence filters; arguments as jj_apply_filter. */
#define JJ_FILTER_ARGS                                                       \
    struct jj_ctx *c, int line, struct jj_val v, const struct jj_val *args, \
        size_t nargs, const char *const *kwnames,                           \
        const struct jj_val *kwvals, size_t nkw, struct jj_val *out
int jj__f_select_reject(struct jj_ctx *c, struct jj_scope *sc, int line,
                        struct jj_val v, const struct jj_val *args,
                        size_t nargs, const char *const *kwnames,
                        const struct jj_val *kwvals, size_t nkw, bool attr,
                        bool keep, struct jj_val *out);
int jj__f_do_map(struct jj_ctx *c, struct jj_scope *sc, int line,
                 struct jj_val v, const struct jj_val *args, size_t nargs,
                 const char *const *kwnames, const struct jj_val *kwvals,
                 size_t nkw, struct jj_val *out);
int jj__f_do_first_last(struct jj_ctx *c, int line, struct jj_val v,
                        bool last, struct jj_val *out);
int jj__f_do_minmax(struct jj_ctx *c, int line, struct jj_val v, bool max,
                    const struct jj_val *args, size_t nargs,
                    const char *const *kwnames, const struct jj_val *kwvals,
                    size_t nkw, struct jj_val *out);
int jj__f_do_sort(JJ_FILTER_ARGS);
int jj__f_do_dictsort(JJ_FILTER_ARGS);
int jj__f_do_unique(JJ_FILTER_ARGS);
int jj__f_do_sum(JJ_FILTER_ARGS);
int jj__f_do_join(JJ_FILTER_ARGS);
int jj__f_do_reverse(struct jj_ctx *c, int line, struct jj_val v,
                     struct jj_val *out);

#endif /* JJ_FILTER_INTERNAL_H */
