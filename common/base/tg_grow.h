/*
 * tg_grow.h — the one growable-array helper of tangram.
 *
 * An array is a pointer and a capacity counted in elements; the count of
 * elements in use is the caller's. tg_grow makes room for at least `need`
 * elements: it doubles the capacity (from TG_GROW_MIN for an empty array)
 * until it covers `need`, so appending one at a time is amortised O(1),
 * and reallocates with the C library's realloc (jemalloc where linked).
 * Elements already there keep their values; new ones are uninitialised.
 *
 * On failure nothing changes: *p and *cap are as they were, the old block
 * is still owned by the caller and must still be freed by it. A capacity
 * whose byte size (cap * elem) would not fit size_t, or the capacity type
 * of the signed variants, is refused with TG_ENOMEM before any allocation;
 * doubling stops at the largest capacity that fits when `need` still does.
 *
 * The variants take the capacity types the project's structs use (size_t,
 * int64_t, int32_t); TG_GROW picks the one for the capacity's type and
 * the element size from the array's type:
 *
 *     if (TG_GROW(v->items, &v->cap, v->n + 1))
 *         return TG_ENOMEM;
 *     v->items[v->n++] = x;
 *
 * Thread-safety: none of its own; the caller owns the array.
 */
#ifndef TG_GROW_H
#define TG_GROW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The capacity an empty array grows to first (or `need`, if larger). */
#define TG_GROW_MIN 16

/* Grows *p (*cap elements of `elem` bytes each) to hold at least `need`
 * elements. Returns 0 (also when *cap already covers need), TG_ENOMEM
 * (overflow or allocation failure: *p and *cap unchanged) or TG_EINVAL
 * (elem == 0). */
int tg_grow(void **p, size_t *cap, size_t need, size_t elem);

/* The same for a signed capacity: need and *cap must be >= 0 (TG_EINVAL
 * otherwise) and the capacity stays within the type's range. */
int tg_grow_i64(void **p, int64_t *cap, int64_t need, size_t elem);
int tg_grow_i32(void **p, int32_t *cap, int64_t need, size_t elem);

/* Typed convenience: arr is an lvalue of pointer type, capp points to a
 * size_t, int64_t or int32_t capacity. */
/* Laid out by hand: clang-format 14 does not parse _Generic. */
/* clang-format off */
#define TG_GROW(arr, capp, need)                                       \
    _Generic((capp), size_t *: tg_grow, int64_t *: tg_grow_i64,        \
             int32_t *: tg_grow_i32)((void **)&(arr), (capp), (need),  \
                                     sizeof(*(arr)))
/* clang-format on */

#ifdef __cplusplus
}
#endif

#endif /* TG_GROW_H */
