/*
 * st_writer.h — builds a .safetensors file (format described in
 * st_safetensors.h).
 *
 * Tensors are declared first (name, dtype, shape and either a data pointer
 * or a fill callback), then st_writer_write() emits the whole file: the
 * header lists "__metadata__" (when any) and the tensors in the order they
 * were added, the data region stores them contiguously in the same order,
 * and the header is padded with spaces so the data region starts at a
 * multiple of 8 bytes (the format allows trailing whitespace in the header
 * JSON for exactly this). The file is written to a temporary name in the
 * same directory and renamed into place, so readers never see half a file.
 *
 * A writer is used by one thread at a time.
 */
#ifndef ST_WRITER_H
#define ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/st_safetensors.h"

/* Produces the bytes of one tensor in order: called with byte_offset 0, then
 * with increasing offsets until the tensor's nbytes are produced; each call
 * fills dst[0, nbytes) (nbytes is a multiple of 8 except possibly for the
 * last call, so elements are never split). Returns 0 or a negative TG_E*
 * code, which aborts the write and is returned by st_writer_write(). */
typedef int (*st_fill_fn)(void *ctx, uint64_t byte_offset, void *dst,
                          size_t nbytes);

struct st_writer_entry {
    char *name;
    enum st_dtype dtype;
    int rank;
    int64_t shape[ST_MAX_RANK];
    uint64_t nbytes;
    const void *data;   /* borrowed; NULL when fill is used */
    st_fill_fn fill;
    void *fill_ctx;     /* borrowed */
};

struct st_writer {
    struct st_writer_entry *entries; /* (n, cap) in add order */
    size_t n, cap;
    char **meta;                     /* (2 * n_meta) key, value, ... */
    size_t n_meta, cap_meta;
    uint64_t data_bytes;             /* sum of entries' nbytes */
};

/* Prepares an empty writer in caller-owned *w. Cannot fail. */
void st_writer_init(struct st_writer *w);

/* Frees everything the writer owns (not borrowed data or fill contexts);
 * safe on a zeroed writer and after a failed write. */
void st_writer_free(struct st_writer *w);

/* Adds the "__metadata__" entry key = value (both copied). Returns 0,
 * TG_EEXIST for a repeated key or TG_ENOMEM. */
int st_writer_add_metadata(struct st_writer *w, const char *key,
                           const char *value, char *err, size_t errlen);

/* Adds tensor `name` (copied) of `dtype` with `rank` dims `shape` whose
 * bytes (little-endian, row-major, numel * element size of them) are at
 * `data`; the pointer is borrowed and must stay valid until
 * st_writer_write() returns. Returns 0, TG_EINVAL (empty or reserved name,
 * bad dtype, rank > ST_MAX_RANK, negative dim, size overflow, NULL data
 * for a non-empty tensor), TG_EEXIST (name already added) or TG_ENOMEM. */
int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dtype,
                  int rank, const int64_t *shape, const void *data, char *err,
                  size_t errlen);

/* Same as st_writer_add(), but the bytes come from fill(ctx, ...) during
 * st_writer_write() (see st_fill_fn); ctx is borrowed. */
int st_writer_add_fill(struct st_writer *w, const char *name,
                       enum st_dtype dtype, int rank, const int64_t *shape,
                       st_fill_fn fill, void *ctx, char *err, size_t errlen);

/* Writes the file to `path` atomically (temp file in the same directory,
 * fsync, rename). Returns 0, TG_EIO, TG_ENOMEM, or the code of a failing
 * fill callback; on failure no file is left at `path` or at the temp name.
 * The writer stays valid and can be written again or freed. */
int st_writer_write(struct st_writer *w, const char *path, char *err,
                    size_t errlen);

#endif /* ST_WRITER_H */
