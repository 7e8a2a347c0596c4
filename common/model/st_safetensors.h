/*
 * st_safetensors.h — read-only access to .safetensors files and to sharded
 * Hugging Face model directories.
 *
 * File format (huggingface/safetensors, "Format" section of its README):
 *   bytes [0, 8)        little-endian u64 N, the header length
 *   bytes [8, 8+N)      a UTF-8 JSON object: tensor name -> {"dtype": "BF16",
 *                       "shape": [d0, ...], "data_offsets": [begin, end]},
 *                       plus an optional "__metadata__" string->string map
 *   bytes [8+N, EOF)    the data region; offsets are relative to its start
 *
 * st_file_open() maps the file read-only and validates everything before it
 * returns: the header length (<= file size - 8 and <= ST_MAX_HEADER), the
 * JSON (an object, no duplicate keys), every dtype, every shape (rank <=
 * ST_MAX_RANK, non-negative dims, no overflow in the element or byte count),
 * every data_offsets pair (begin <= end <= data size, end - begin == bytes of
 * the shape) and that no two non-empty tensors overlap. Gaps between
 * tensors are tolerated. A file that passes can be read through
 * st_tensor.data without further checks. Malformed input gives TG_EFORMAT
 * (or TG_ETOOBIG / TG_EUNSUPPORTED) with a message naming the file and the
 * tensor, never a crash. (Truncating a file while it is mapped is outside
 * this contract: the kernel then raises SIGBUS.)
 *
 * st_model_open() opens a model directory: model.safetensors.index.json
 * (its "weight_map" names the shard of every tensor) or else a single
 * model.safetensors, and looks tensors up across shards.
 *
 * Two ways to read a tensor's bytes: through the mapping (st_tensor.data,
 * st_tensor_read_f32), where every page touched stays in the process's
 * resident set until the file is closed, or with st_file_pread into the
 * caller's buffer (the file stays open for it), which leaves the resident
 * set alone: a loader that streams a checkpoint through a bounded buffer
 * (gpu_worker/gw_load.h) uses that.
 *
 * Threads: open/close on one thread; lookups and reads of an opened file or
 * model are read-only and safe from any number of threads.
 */
#ifndef ST_SAFETENSORS_H
#define ST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_RANK 8
/* The header length limit: the reference implementation uses 100 MB, and a
 * larger value is far more likely corruption than a real checkpoint. */
#define ST_MAX_HEADER ((uint64_t)100 << 20)

/* Element types, named as in the format ("F32", "BF16", ...). */
enum st_dtype {
    ST_DTYPE_F64 = 0,
    ST_DTYPE_F32,
    ST_DTYPE_F16,
    ST_DTYPE_BF16,
    ST_DTYPE_I64,
    ST_DTYPE_I32,
    ST_DTYPE_I16,
    ST_DTYPE_I8,
    ST_DTYPE_U8,
    ST_DTYPE_BOOL,
    ST_DTYPE_F8_E4M3,
    ST_DTYPE_F8_E5M2,
    ST_DTYPE_U16,
    ST_DTYPE_U32,
    ST_DTYPE_U64,
    ST_DTYPE_COUNT
};

/* Returns the format's name of `dt` ("BF16"), or "?" when out of range. */
const char *st_dtype_name(enum st_dtype dt);

/* Parses a format dtype name (case-sensitive, as the format spells it) into
 * *out. Returns 0 or TG_EUNSUPPORTED for an unknown name. */
int st_dtype_parse(const char *name, enum st_dtype *out);

/* Returns the size of one element of `dt` in bytes (0 when out of range). */
size_t st_dtype_size(enum st_dtype dt);

/* One tensor of an opened file. Everything points into the owning
 * st_file and lives until st_file_close(). */
struct st_tensor {
    const char *name;            /* NUL-terminated */
    enum st_dtype dtype;
    int rank;                    /* 0 (a scalar) .. ST_MAX_RANK */
    int64_t shape[ST_MAX_RANK];  /* (rank) dims, row-major; unused ones 0 */
    uint64_t numel;              /* product of the dims (1 for a scalar) */
    uint64_t nbytes;             /* numel * st_dtype_size(dtype) */
    uint64_t offset;             /* bytes from the start of the data region */
    const void *data;            /* (nbytes) bytes, read-only; NOT aligned in
                                    general: read elements with memcpy */
};

/* An opened, validated .safetensors file. Fields are read-only for users. */
struct st_file {
    char *path;                  /* copy of the path given to open */
    int fd;                      /* the open file (O_RDONLY) for
                                    st_file_pread; valid while map is */
    void *map;                   /* whole file, PROT_READ */
    size_t map_len;              /* bytes */
    const uint8_t *data;         /* start of the data region (in map) */
    uint64_t data_len;           /* bytes in the data region */
    struct st_tensor *tensors;   /* (n_tensors), sorted by name (strcmp) */
    size_t n_tensors;
    char **meta_keys;            /* (n_meta) "__metadata__" keys, file order */
    char **meta_vals;            /* (n_meta) their string values */
    size_t n_meta;
    char *strings;               /* storage for the names above */
};

/* Maps and validates the file at `path` into *f (caller-owned storage,
 * overwritten). Returns 0; TG_ENOENT / TG_EIO when it cannot be opened or
 * mapped; TG_EFORMAT for a malformed file; TG_ETOOBIG for a header longer
 * than ST_MAX_HEADER; TG_EUNSUPPORTED for an unknown dtype; TG_ENOMEM. On
 * failure *f is left closed (zeroed). Release with st_file_close(). */
int st_file_open(struct st_file *f, const char *path, char *err, size_t errlen);

/* Reads n bytes at data_offset (bytes from the start of the data region)
 * into buf with pread(2), retrying short reads and EINTR. The bytes do
 * not pass through the mapping, so the resident set does not grow with
 * what is read. Returns 0, TG_ERANGE (the range leaves the data region)
 * or TG_EIO (a read error, or the file shrank since it was opened), with
 * the file and offset in err. Any thread. */
int st_file_pread(const struct st_file *f, uint64_t data_offset, void *buf,
                  size_t n, char *err, size_t errlen);

/* Unmaps and frees everything; safe on a zeroed or already closed file.
 * Invalidates every st_tensor pointer obtained from f. */
void st_file_close(struct st_file *f);

/* Returns the tensor called `name` (binary search) or NULL when absent.
 * The pointer is owned by f. */
const struct st_tensor *st_file_find(const struct st_file *f, const char *name);

/* Returns the "__metadata__" value of `key` (owned by f) or NULL. */
const char *st_file_metadata(const struct st_file *f, const char *key);

/* An opened model directory. Fields are read-only for users. */
struct st_model {
    char *dir;                         /* copy of the directory path */
    struct st_file *files;             /* (n_files) opened shards */
    size_t n_files;
    const struct st_tensor **tensors;  /* (n_tensors) sorted by name; each
                                          points into one of files[] */
    size_t n_tensors;
};

/* Opens the model directory `dir` into *m (caller-owned storage). With
 * model.safetensors.index.json present, every file named by its weight_map
 * is opened (file names must be plain names inside dir), every named tensor
 * must exist in the file the map names, and m->tensors lists exactly the
 * weight_map's tensors (an empty weight_map is an error; tensors a shard
 * holds but the map does not name are not listed). Otherwise
 * model.safetensors is opened and all its tensors are listed. Returns 0,
 * TG_ENOENT (no weights, or a shard is missing), TG_EFORMAT (bad index,
 * tensor not in its shard), any other error of st_file_open(), TG_ENOMEM.
 * On failure *m is left closed. */
int st_model_open(struct st_model *m, const char *dir, char *err,
                  size_t errlen);

/* Closes every shard and frees m; safe on a zeroed or closed model. */
void st_model_close(struct st_model *m);

/* Returns the tensor `name` of any shard, or NULL (owned by m). */
const struct st_tensor *st_model_find(const struct st_model *m,
                                      const char *name);

/* Returns the shard that holds t (a tensor st_model_find returned from m),
 * or NULL when t is not one of m's. Any thread. */
const struct st_file *st_model_file_of(const struct st_model *m,
                                       const struct st_tensor *t);

/* Scalar conversions. bf16 is the top half of an IEEE binary32; f16 is IEEE
 * binary16. The to-narrow directions round to nearest, ties to even, keep
 * infinities, turn NaN into a quiet NaN and overflow into infinity (the
 * IEEE 754 default). Pure functions, any thread. */
float st_bf16_to_f32(uint16_t h);
float st_f16_to_f32(uint16_t h);
uint16_t st_f32_to_bf16(float x);
uint16_t st_f32_to_f16(float x);

/* Converts n elements of dt at src (little-endian, any alignment) into
 * dst: st_convert_f32 to float32 (F32, F16, BF16, F64); st_convert_bf16
 * to bf16 bits (BF16 copied bit for bit, F32, F16 and F64 through
 * float32 rounded to nearest even). Returns 0 or TG_EUNSUPPORTED for
 * another dtype. Pure, any thread. */
int st_convert_f32(enum st_dtype dt, const void *src, size_t n, float *dst);
int st_convert_bf16(enum st_dtype dt, const void *src, size_t n, uint16_t *dst);

/* Returns the number of rows of t: shape[0], or 1 for a scalar. A row is
 * numel / rows elements (0-sized tensors have row length 0). */
uint64_t st_tensor_rows(const struct st_tensor *t);

/* Converts rows [row_begin, row_end) of t (F32, F16, BF16 or F64) to
 * float32 into out[0 .. (row_end-row_begin) * row length). Returns 0,
 * TG_EUNSUPPORTED for another dtype or TG_ERANGE for a bad row range
 * (row_begin > row_end or row_end > st_tensor_rows(t)). Any thread. */
int st_tensor_read_f32(const struct st_tensor *t, uint64_t row_begin,
                       uint64_t row_end, float *out, char *err, size_t errlen);

#endif /* ST_SAFETENSORS_H */
