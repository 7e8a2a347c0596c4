/* st_safetensors.c — validating .safetensors reader and model directory
 * lookup (contracts in st_safetensors.h). */
#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"
#include "common/json/tg_json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tensor bytes are little-endian; F32/F64 are copied as host words. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "st_safetensors assumes a little-endian host");

/* ---- dtypes ------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} dtype_table[ST_DTYPE_COUNT] = {
    [ST_DTYPE_F64] = {"F64", 8},         [ST_DTYPE_F32] = {"F32", 4},
    [ST_DTYPE_F16] = {"F16", 2},         [ST_DTYPE_BF16] = {"BF16", 2},
    [ST_DTYPE_I64] = {"I64", 8},         [ST_DTYPE_I32] = {"I32", 4},
    [ST_DTYPE_I16] = {"I16", 2},         [ST_DTYPE_I8] = {"I8", 1},
    [ST_DTYPE_U8] = {"U8", 1},           [ST_DTYPE_BOOL] = {"BOOL", 1},
    [ST_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [ST_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [ST_DTYPE_U16] = {"U16", 2},         [ST_DTYPE_U32] = {"U32", 4},
    [ST_DTYPE_U64] = {"U64", 8},
};

const char *st_dtype_name(enum st_dtype dt)
{
    if ((unsigned)dt >= ST_DTYPE_COUNT)
        return "?";
    return dtype_table[dt].name;
}

int st_dtype_parse(const char *name, enum st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (enum st_dtype)i;
            return 0;
        }
    }
    return TG_EUNSUPPORTED;
}

size_t st_dtype_size(enum st_dtype dt)
{
    if ((unsigned)dt >= ST_DTYPE_COUNT)
        return 0;
    return dtype_table[dt].size;
}

/* ---- scalar conversions ------------------------------------------------ */

static float f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

float st_bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / NaN: keep the payload */
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0) /* normal: rebias 15 -> 127 */
        return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24 is exact in binary32 */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
}

uint16_t st_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet it, keep the sign */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest even on the 16 dropped bits; a carry into the
     * exponent is the right result (up to and including infinity). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

uint16_t st_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x1ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds to infinity (or is inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal half: |x| >= 2^-14 */
        uint32_t r = a - (112u << 23); /* rebias the exponent */
        r += 0xfffu + ((r >> 13) & 1u);  /* round to nearest even */
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) /* < 2^-25: rounds to zero (2^-25 ties to 0) */
        return sign;
    /* Subnormal half: value = m * 2^-24 with m = round(|x| * 2^24). The
     * product is exact (power of two scaling), and rint() rounds to nearest
     * even in the default rounding mode. */
    float m = rintf(f32_from_bits(a) * 0x1p24f);
    return (uint16_t)(sign | (uint16_t)m);
}

/* ---- file -------------------------------------------------------------- */

static uint64_t rd_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const struct st_tensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

static int cmp_tensor_ptr_offset(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return 0;
}

/* Validates one tensor entry `v` named `name` and fills *t (name set by the
 * caller). */
static int parse_tensor(const struct st_file *f, const char *name,
                        const json_t *v, struct st_tensor *t, char *err,
                        size_t errlen)
{
    const char *p = f->path;
    if (!json_is_object(v))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': expected an object", p, name);
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': 'dtype' missing or not a string",
                          p, name);
    if (st_dtype_parse(json_string_value(jd), &t->dtype) != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "%s: tensor '%s': unknown dtype '%s'", p, name,
                          json_string_value(jd));
    if (!json_is_array(js))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': 'shape' missing or not an array",
                          p, name);
    size_t rank = json_array_size(js);
    if (rank > ST_MAX_RANK)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': rank %zu exceeds %d", p, name,
                          rank, ST_MAX_RANK);
    t->rank = (int)rank;
    uint64_t numel = 1;
    for (size_t i = 0; i < rank; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: tensor '%s': shape[%zu] is not a "
                              "non-negative integer", p, name, i);
        t->shape[i] = (int64_t)json_integer_value(d);
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel))
            return tg_err_set(err, errlen, TG_EFORMAT,
                              "%s: tensor '%s': element count overflows", p,
                              name);
    }
    t->numel = numel;
    if (__builtin_mul_overflow(numel, (uint64_t)st_dtype_size(t->dtype),
                               &t->nbytes))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': byte count overflows", p, name);
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': 'data_offsets' must be two "
                          "integers", p, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0));
    json_int_t e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': bad data_offsets [%lld, %lld]", p,
                          name, (long long)b, (long long)e);
    if ((uint64_t)e > f->data_len)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] past "
                          "the end of the data region (%llu bytes)", p, name,
                          (long long)b, (long long)e,
                          (unsigned long long)f->data_len);
    if ((uint64_t)(e - b) != t->nbytes)
        return tg_err_set(err, errlen, TG_EFORMAT,
                          "%s: tensor '%s': data_offsets span %lld bytes but "
                          "%s shape needs %llu", p, name, (long long)(e - b),
                          st_dtype_name(t->dtype),
                          (unsigned long long)t->nbytes);
    t->offset = (uint64_t)b;
    t->data = f->data + b;
    return 0;
}

/* Checks that no two non-empty tensors share a byte. */
static int check_overlap(const struct st_file *f, char *err, size_t errlen)
{
    if (f->n_tensors < 2)
        return 0;
    const struct st_tensor **by_off = malloc(f->n_tensors * sizeof *by_off);
    if (by_off == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].nbytes > 0)
            by_off[n++] = &f->tensors[i];
    qsort(by_off, n, sizeof *by_off, cmp_tensor_ptr_offset);
    int rc = 0;
    for (size_t i = 1; i < n; i++) {
        const struct st_tensor *a = by_off[i - 1], *b = by_off[i];
        if (b->offset < a->offset + a->nbytes) {
            rc = tg_err_set(err, errlen, TG_EFORMAT,
                            "%s: tensors '%s' and '%s' overlap", f->path,
                            a->name, b->name);
            break;
        }
    }
    free(by_off);
    return rc;
}

/* Parses the header JSON and fills tensors/metadata of f. */
static int parse_header(struct st_file *f, const char *hdr, size_t n,
                        char *err, size_t errlen)
{
    json_t *doc = NULL;
    char jerr[160];
    if (tg_json_load_buf(hdr, n, &doc, jerr, sizeof jerr) != 0)
        return tg_err_set(err, errlen, TG_EFORMAT, "%s: header: %s", f->path,
                          jerr);
    int rc = 0;
    if (!json_is_object(doc)) {
        rc = tg_err_set(err, errlen, TG_EFORMAT,
                        "%s: header is not a JSON object", f->path);
        goto out;
    }
    /* Sizes first, so all strings live in one allocation. */
    const json_t *meta = json_object_get(doc, "__metadata__");
    size_t n_meta = 0, n_t = 0, bytes = 0;
    if (meta != NULL) {
        if (!json_is_object(meta)) {
            rc = tg_err_set(err, errlen, TG_EFORMAT,
                            "%s: __metadata__ is not an object", f->path);
            goto out;
        }
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)meta, k, v) {
            if (!json_is_string(v)) {
                rc = tg_err_set(err, errlen, TG_EFORMAT,
                                "%s: __metadata__.%s is not a string",
                                f->path, k);
                goto out;
            }
            bytes += strlen(k) + 1 + json_string_length(v) + 1;
            n_meta++;
        }
    }
    const char *key;
    json_t *val;
    json_object_foreach(doc, key, val) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        bytes += strlen(key) + 1;
        n_t++;
    }
    f->strings = malloc(bytes > 0 ? bytes : 1);
    f->tensors = calloc(n_t > 0 ? n_t : 1, sizeof *f->tensors);
    f->meta_keys = calloc(n_meta > 0 ? n_meta : 1, sizeof *f->meta_keys);
    f->meta_vals = calloc(n_meta > 0 ? n_meta : 1, sizeof *f->meta_vals);
    if (!f->strings || !f->tensors || !f->meta_keys || !f->meta_vals) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto out;
    }
    char *s = f->strings;
    if (meta != NULL) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)meta, k, v) {
            size_t kl = strlen(k), vl = json_string_length(v);
            memcpy(s, k, kl + 1);
            f->meta_keys[f->n_meta] = s;
            s += kl + 1;
            /* Metadata values may hold NUL in JSON ("\u0000"); they are
             * exposed as C strings, i.e. up to the first NUL. */
            memcpy(s, json_string_value(v), vl);
            s[vl] = '\0';
            f->meta_vals[f->n_meta++] = s;
            s += vl + 1;
        }
    }
    json_object_foreach(doc, key, val) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        struct st_tensor *t = &f->tensors[f->n_tensors];
        size_t kl = strlen(key);
        if (kl == 0) {
            rc = tg_err_set(err, errlen, TG_EFORMAT,
                            "%s: a tensor has an empty name", f->path);
            goto out;
        }
        memcpy(s, key, kl + 1);
        t->name = s;
        s += kl + 1;
        rc = parse_tensor(f, key, val, t, err, errlen);
        if (rc != 0)
            goto out;
        f->n_tensors++;
    }
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
    /* Keys of a JSON object are unique (duplicates were rejected at parse
     * time), but two keys may still be equal as C strings when one holds an
     * escaped NUL; lookups by name need them distinct. */
    for (size_t i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            rc = tg_err_set(err, errlen, TG_EFORMAT,
                            "%s: duplicate tensor name '%s'", f->path,
                            f->tensors[i].name);
            goto out;
        }
    }
    rc = check_overlap(f, err, errlen);
out:
    json_decref(doc);
    return rc;
}

int st_file_open(struct st_file *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    int rc = 0;
    int fd = -1;
    f->path = strdup(path);
    if (f->path == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        rc = tg_err_set(err, errlen, e == ENOENT ? TG_ENOENT : TG_EIO,
                        "%s: %s", path, strerror(e));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = tg_err_set(err, errlen, TG_EIO, "%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        rc = tg_err_set(err, errlen, TG_EFORMAT,
                        "%s: %llu bytes is too short for the 8-byte header "
                        "length", path, (unsigned long long)size);
        goto fail;
    }
    f->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        rc = tg_err_set(err, errlen, TG_EIO, "%s: mmap: %s", path,
                        strerror(errno));
        goto fail;
    }
    f->map_len = (size_t)size;
    f->fd = fd; /* kept for st_file_pread; closed with the mapping */
    fd = -1;
    const uint8_t *base = f->map;
    uint64_t n = rd_le64(base);
    if (n > ST_MAX_HEADER) {
        rc = tg_err_set(err, errlen, TG_ETOOBIG,
                        "%s: header length %llu exceeds the %llu-byte limit",
                        path, (unsigned long long)n,
                        (unsigned long long)ST_MAX_HEADER);
        goto fail;
    }
    if (n > size - 8) {
        rc = tg_err_set(err, errlen, TG_EFORMAT,
                        "%s: truncated: header length %llu but only %llu "
                        "bytes follow", path, (unsigned long long)n,
                        (unsigned long long)(size - 8));
        goto fail;
    }
    if (n < 2 || base[8] != '{') {
        rc = tg_err_set(err, errlen, TG_EFORMAT,
                        "%s: header does not start with '{'", path);
        goto fail;
    }
    f->data = base + 8 + n;
    f->data_len = size - 8 - n;
    rc = parse_header(f, (const char *)base + 8, (size_t)n, err, errlen);
    if (rc != 0)
        goto fail;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    st_file_close(f);
    return rc;
}

void st_file_close(struct st_file *f)
{
    if (f->map != NULL) {
        munmap(f->map, f->map_len);
        close(f->fd);
    }
    free(f->path);
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->strings);
    memset(f, 0, sizeof *f);
}

int st_file_pread(const struct st_file *f, uint64_t data_offset, void *buf,
                  size_t n, char *err, size_t errlen)
{
    if (data_offset > f->data_len || n > f->data_len - data_offset)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "%s: bytes [%llu, +%zu) outside the %llu-byte data "
                          "region", f->path, (unsigned long long)data_offset,
                          n, (unsigned long long)f->data_len);
    uint64_t pos = (uint64_t)(f->data - (const uint8_t *)f->map) + data_offset;
    uint8_t *out = buf;
    while (n > 0) {
        /* Linux moves at most 0x7ffff000 bytes per call. */
        size_t want = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t got = pread(f->fd, out, want, (off_t)pos);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return tg_err_set(err, errlen, TG_EIO,
                              "%s: read at byte %llu: %s", f->path,
                              (unsigned long long)pos,
                              got < 0 ? strerror(errno)
                                      : "end of file (truncated since open?)");
        out += got;
        pos += (uint64_t)got;
        n -= (size_t)got;
    }
    return 0;
}

const struct st_tensor *st_file_find(const struct st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->tensors[mid].name);
        if (c == 0)
            return &f->tensors[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *st_file_metadata(const struct st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0)
            return f->meta_vals[i];
    return NULL;
}

/* ---- model directory --------------------------------------------------- */

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p != NULL)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int cmp_tensor_pp_name(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A weight_map value must name a file inside the directory. */
static int plain_file_name(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 &&
           strcmp(s, "..") != 0;
}

static int open_single(struct st_model *m, const char *path, char *err,
                       size_t errlen)
{
    m->files = calloc(1, sizeof *m->files);
    if (m->files == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    int rc = st_file_open(&m->files[0], path, err, errlen);
    if (rc != 0)
        return rc;
    m->n_files = 1;
    const struct st_file *f = &m->files[0];
    m->tensors = calloc(f->n_tensors > 0 ? f->n_tensors : 1,
                        sizeof *m->tensors);
    if (m->tensors == NULL)
        return tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
    for (size_t i = 0; i < f->n_tensors; i++)
        m->tensors[i] = &f->tensors[i]; /* already sorted by name */
    m->n_tensors = f->n_tensors;
    return 0;
}

static int open_index(struct st_model *m, const char *index_path, char *err,
                      size_t errlen)
{
    json_t *doc = NULL;
    int rc = tg_json_load_file(index_path, &doc, err, errlen);
    if (rc != 0)
        return rc; /* TG_ENOENT, TG_EIO or TG_EFORMAT */
    json_t *wm = NULL;
    rc = tg_json_get_object(doc, "weight_map", index_path, &wm, err, errlen);
    if (rc != 0) {
        rc = TG_EFORMAT;
        goto out;
    }
    size_t n = json_object_size(wm);
    if (n == 0) {
        rc = tg_err_set(err, errlen, TG_EFORMAT, "%s: weight_map is empty",
                        index_path);
        goto out;
    }
    /* Distinct shard names, in first-seen order. */
    const char **names = calloc(n > 0 ? n : 1, sizeof *names);
    m->files = calloc(n > 0 ? n : 1, sizeof *m->files);
    m->tensors = calloc(n > 0 ? n : 1, sizeof *m->tensors);
    if (names == NULL || m->files == NULL || m->tensors == NULL) {
        free(names);
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val) || !plain_file_name(json_string_value(val))) {
            rc = tg_err_set(err, errlen, TG_EFORMAT,
                            "%s: weight_map.%s: expected a file name in the "
                            "model directory", index_path, key);
            break;
        }
        const char *fn = json_string_value(val);
        size_t fi = 0;
        while (fi < m->n_files && strcmp(names[fi], fn) != 0)
            fi++;
        if (fi == m->n_files) {
            char *p = path_join(m->dir, fn);
            if (p == NULL) {
                rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
                break;
            }
            if (!file_exists(p)) {
                rc = tg_err_set(err, errlen, TG_ENOENT,
                                "%s: shard '%s' (of tensor '%s') does not "
                                "exist", index_path, fn, key);
                free(p);
                break;
            }
            rc = st_file_open(&m->files[fi], p, err, errlen);
            free(p);
            if (rc != 0)
                break;
            names[fi] = fn;
            m->n_files++;
        }
        const struct st_tensor *t = st_file_find(&m->files[fi], key);
        if (t == NULL) {
            rc = tg_err_set(err, errlen, TG_EFORMAT,
                            "%s: tensor '%s' is not in its shard '%s'",
                            index_path, key, fn);
            break;
        }
        m->tensors[m->n_tensors++] = t;
    }
    free(names);
    if (rc == 0)
        qsort(m->tensors, m->n_tensors, sizeof *m->tensors,
              cmp_tensor_pp_name);
out:
    json_decref(doc);
    return rc;
}

int st_model_open(struct st_model *m, const char *dir, char *err,
                  size_t errlen)
{
    memset(m, 0, sizeof *m);
    int rc;
    char *index = NULL, *single = NULL;
    m->dir = strdup(dir);
    index = path_join(dir, "model.safetensors.index.json");
    single = path_join(dir, "model.safetensors");
    if (m->dir == NULL || index == NULL || single == NULL) {
        rc = tg_err_set(err, errlen, TG_ENOMEM, "out of memory");
        goto out;
    }
    if (file_exists(index))
        rc = open_index(m, index, err, errlen);
    else if (file_exists(single))
        rc = open_single(m, single, err, errlen);
    else
        rc = tg_err_set(err, errlen, TG_ENOENT,
                        "%s: neither model.safetensors.index.json nor "
                        "model.safetensors exists", dir);
out:
    free(index);
    free(single);
    if (rc != 0)
        st_model_close(m);
    return rc;
}

void st_model_close(struct st_model *m)
{
    if (m->files != NULL)
        for (size_t i = 0; i < m->n_files; i++)
            st_file_close(&m->files[i]);
    free(m->files);
    free(m->tensors);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

const struct st_tensor *st_model_find(const struct st_model *m,
                                      const char *name)
{
    size_t lo = 0, hi = m->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, m->tensors[mid]->name);
        if (c == 0)
            return m->tensors[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const struct st_file *st_model_file_of(const struct st_model *m,
                                       const struct st_tensor *t)
{
    for (size_t i = 0; i < m->n_files; i++) {
        const struct st_file *f = &m->files[i];
        /* Addresses as integers: t may point into another shard's array. */
        uintptr_t a = (uintptr_t)t, lo = (uintptr_t)f->tensors;
        if (f->n_tensors > 0 && a >= lo &&
            a < lo + f->n_tensors * sizeof(*f->tensors))
            return f;
    }
    return NULL;
}

/* ---- conversion -------------------------------------------------------- */

uint64_t st_tensor_rows(const struct st_tensor *t)
{
    return t->rank == 0 ? 1 : (uint64_t)t->shape[0];
}

int st_convert_f32(enum st_dtype dt, const void *src, size_t n, float *dst)
{
    const uint8_t *p = src;
    switch (dt) {
    case ST_DTYPE_F32:
        if (n > 0)
            memcpy(dst, p, n * 4);
        return 0;
    case ST_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = st_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return 0;
    case ST_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = st_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return 0;
    case ST_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        return 0;
    default:
        return TG_EUNSUPPORTED;
    }
}

int st_convert_bf16(enum st_dtype dt, const void *src, size_t n, uint16_t *dst)
{
    const uint8_t *p = src;
    if (dt == ST_DTYPE_BF16) {
        if (n > 0)
            memcpy(dst, p, n * 2); /* the bits as they are */
        return 0;
    }
    if (dt != ST_DTYPE_F32 && dt != ST_DTYPE_F16 && dt != ST_DTYPE_F64)
        return TG_EUNSUPPORTED;
    for (size_t i = 0; i < n; i++) {
        float x;
        if (dt == ST_DTYPE_F32) {
            memcpy(&x, p + 4 * i, 4);
        } else if (dt == ST_DTYPE_F16) {
            x = st_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        } else {
            double d;
            memcpy(&d, p + 8 * i, 8);
            x = (float)d;
        }
        dst[i] = st_f32_to_bf16(x);
    }
    return 0;
}

int st_tensor_read_f32(const struct st_tensor *t, uint64_t row_begin,
                       uint64_t row_end, float *out, char *err, size_t errlen)
{
    uint64_t rows = st_tensor_rows(t);
    if (row_begin > row_end || row_end > rows)
        return tg_err_set(err, errlen, TG_ERANGE,
                          "tensor '%s': row range [%llu, %llu) outside "
                          "[0, %llu)", t->name, (unsigned long long)row_begin,
                          (unsigned long long)row_end,
                          (unsigned long long)rows);
    uint64_t row_len = rows > 0 ? t->numel / rows : 0;
    uint64_t first = row_begin * row_len, cnt = (row_end - row_begin) * row_len;
    const uint8_t *src = t->data;
    if (st_convert_f32(t->dtype, src + first * st_dtype_size(t->dtype),
                       (size_t)cnt, out) != 0)
        return tg_err_set(err, errlen, TG_EUNSUPPORTED,
                          "tensor '%s': cannot convert %s to float32",
                          t->name, st_dtype_name(t->dtype));
    return 0;
}
