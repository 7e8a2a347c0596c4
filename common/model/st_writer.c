/* st_writer.c — atomic .safetensors writer (contracts in st_writer.h). */
#include "common/model/st_writer.h"
#include "common/base/tg_err.h"
#include "common/base/tg_grow.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bytes produced per fill call / write(2): big enough to amortise calls,
 * small enough not to matter next to the weights themselves. */
#define CHUNK ((size_t)1 << 20)

/* Header strings must be valid UTF-8 (the header is JSON). */
static int is_utf8(const char *s)
{
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

void st_writer_init(struct st_writer *w)
{
    memset(w, 0, sizeof *w);
}

void st_writer_free(struct st_writer *w)
{
    for (size_t i = 0; i < w->n; i++)
        free(w->entries[i].name);
    for (size_t i = 0; i < 2 * w->n_meta; i++)
        free(w->meta[i]);
    free(w->entries);
    free(w->meta);
    memset(w, 0, sizeof *w);
}

int st_writer_add_metadata(struct st_writer *w, const char *key,
                           const char *value, char *err, size_t errlen)
{
    if (!is_utf8(key) || !is_utf8(value))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "metadata key or value is not valid UTF-8");
    for (size_t i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta[2 * i], key) == 0)
            return tg_err_set(err, errlen, TG_EEXIST,
                              "metadata key '%s' added twice", key);
    /* meta holds (key, value) pairs: cap_meta counts pairs. */
    if (tg_grow((void **)&w->meta, &w->cap_meta, w->n_meta + 1,
                2 * sizeof *w->meta))
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    char *k = strdup(key), *v = strdup(value);
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    }
    w->meta[2 * w->n_meta] = k;
    w->meta[2 * w->n_meta + 1] = v;
    w->n_meta++;
    return 0;
}

static int add_entry(struct st_writer *w, const char *name,
                     enum st_dtype dtype, int rank, const int64_t *shape,
                     const void *data, st_fill_fn fill, void *ctx, char *err,
                     size_t errlen)
{
    if (name == NULL || name[0] == '\0' || strcmp(name, "__metadata__") == 0)
        return tg_err_set(err, errlen, TG_EINVAL, "invalid tensor name '%s'",
                          name ? name : "(null)");
    if (!is_utf8(name))
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tensor name is not valid UTF-8");
    if ((unsigned)dtype >= ST_DTYPE_COUNT)
        return tg_err_set(err, errlen, TG_EINVAL, "tensor '%s': bad dtype %d",
                          name, (int)dtype);
    if (rank < 0 || rank > ST_MAX_RANK || (rank > 0 && shape == NULL))
        return tg_err_set(err, errlen, TG_EINVAL, "tensor '%s': bad rank %d",
                          name, rank);
    uint64_t numel = 1, nbytes;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0)
            return tg_err_set(err, errlen, TG_EINVAL,
                              "tensor '%s': shape[%d] = %lld is negative",
                              name, i, (long long)shape[i]);
        if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
            return tg_err_set(err, errlen, TG_EINVAL,
                              "tensor '%s': element count overflows", name);
    }
    uint64_t total;
    if (__builtin_mul_overflow(numel, (uint64_t)st_dtype_size(dtype),
                               &nbytes) ||
        __builtin_add_overflow(w->data_bytes, nbytes, &total) ||
        total > (uint64_t)INT64_MAX)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tensor '%s': byte count overflows", name);
    if (nbytes > 0 && data == NULL && fill == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tensor '%s': no data", name);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->entries[i].name, name) == 0)
            return tg_err_set(err, errlen, TG_EEXIST,
                              "tensor '%s' added twice", name);
    if (TG_GROW(w->entries, &w->cap, w->n + 1))
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    struct st_writer_entry *e = &w->entries[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (e->name == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    e->dtype = dtype;
    e->rank = rank;
    for (int i = 0; i < rank; i++)
        e->shape[i] = shape[i];
    e->nbytes = nbytes;
    e->data = data;
    e->fill = fill;
    e->fill_ctx = ctx;
    w->data_bytes = total;
    w->n++;
    return 0;
}

int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dtype,
                  int rank, const int64_t *shape, const void *data, char *err,
                  size_t errlen)
{
    return add_entry(w, name, dtype, rank, shape, data, NULL, NULL, err,
                     errlen);
}

int st_writer_add_fill(struct st_writer *w, const char *name,
                       enum st_dtype dtype, int rank, const int64_t *shape,
                       st_fill_fn fill, void *ctx, char *err, size_t errlen)
{
    if (fill == NULL)
        return tg_err_set(err, errlen, TG_EINVAL,
                          "tensor '%s': NULL fill callback",
                          name ? name : "(null)");
    return add_entry(w, name, dtype, rank, shape, NULL, fill, ctx, err,
                     errlen);
}

/* Builds the header JSON (compact, insertion order). */
static char *build_header(const struct st_writer *w)
{
    json_t *doc = json_object();
    if (doc == NULL)
        return NULL;
    int bad = 0;
    if (w->n_meta > 0) {
        json_t *m = json_object();
        bad |= json_object_set_new(doc, "__metadata__", m) != 0;
        for (size_t i = 0; !bad && i < w->n_meta; i++)
            bad |= json_object_set_new(m, w->meta[2 * i],
                                       json_string(w->meta[2 * i + 1])) != 0;
    }
    uint64_t off = 0;
    for (size_t i = 0; !bad && i < w->n; i++) {
        const struct st_writer_entry *e = &w->entries[i];
        json_t *t = json_object(), *shape = json_array(), *offs = json_array();
        bad |= json_object_set_new(doc, e->name, t) != 0;
        bad |= json_object_set_new(t, "dtype",
                                   json_string(st_dtype_name(e->dtype))) != 0;
        bad |= json_object_set_new(t, "shape", shape) != 0;
        for (int d = 0; !bad && d < e->rank; d++)
            bad |= json_array_append_new(shape, json_integer(e->shape[d])) != 0;
        bad |= json_object_set_new(t, "data_offsets", offs) != 0;
        bad |= json_array_append_new(offs, json_integer((json_int_t)off)) != 0;
        off += e->nbytes;
        bad |= json_array_append_new(offs, json_integer((json_int_t)off)) != 0;
    }
    char *s = bad ? NULL
                  : json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                        JSON_ENSURE_ASCII);
    json_decref(doc);
    return s;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int st_writer_write(struct st_writer *w, const char *path, char *err,
                    size_t errlen)
{
    int rc = 0, fd = -1;
    char *hdr = NULL, *tmp = NULL;
    uint8_t *buf = NULL;
    size_t tl = strlen(path) + 32;
    tmp = malloc(tl);
    hdr = build_header(w);
    buf = malloc(CHUNK);
    if (tmp == NULL || hdr == NULL || buf == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto out;
    }
    snprintf(tmp, tl, "%s.tmp.%d", path, (int)getpid());
    size_t hl = strlen(hdr);
    size_t padded = (8 + hl + 7) / 8 * 8 - 8;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    if (write_all(fd, len8, 8) != 0 || write_all(fd, hdr, hl) != 0 ||
        write_all(fd, spaces, padded - hl) != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < w->n; i++) {
        const struct st_writer_entry *e = &w->entries[i];
        for (uint64_t off = 0; off < e->nbytes;) {
            size_t n = e->nbytes - off < CHUNK ? (size_t)(e->nbytes - off)
                                               : CHUNK;
            const void *src;
            if (e->fill != NULL) {
                rc = e->fill(e->fill_ctx, off, buf, n);
                if (rc != 0) {
                    rc = tg_err_set(err, errlen, rc < 0 ? rc : TG_EINTERNAL,
                                    "tensor '%s': fill failed: %s", e->name,
                                    tg_strerror(rc));
                    goto out;
                }
                src = buf;
            } else {
                src = (const uint8_t *)e->data + off;
            }
            if (write_all(fd, src, n) != 0) {
                rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", tmp,
                                strerror(errno));
                goto out;
            }
            off += n;
        }
    }
    if (fsync(fd) != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: fsync: %s", tmp,
                        strerror(errno));
        goto out;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: close: %s", tmp,
                        strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0)
        rc = tg_err_set(err, errlen, TG_EIO, "%s: rename: %s", path,
                        strerror(errno));
out:
    if (fd >= 0)
        close(fd);
    if (rc != 0 && tmp != NULL)
        unlink(tmp);
    free(tmp);
    free(buf);
    free(hdr);
    return rc;
}
