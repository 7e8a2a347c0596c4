/*
 * fuzz_safetensors.c — the safetensors reader (common/model/st_safetensors.c)
 * on untrusted files: st_file_open validates the 8-byte header length,
 * the JSON header (dtypes, shapes, data_offsets, overlaps, __metadata__)
 * against the file size. The input is the whole file, handed over as an
 * in-memory file (memfd, opened by its /proc/self/fd path) so the public
 * file API is the one exercised. A file that opens must be safe to read
 * through without further checks (the header's promise): every tensor is
 * looked up by name and, for the float dtypes, converted row by row with
 * st_tensor_read_f32; every metadata key is looked up.
 */
#include <stdlib.h>
#include <string.h>

#include "common/model/st_safetensors.h"
#include "common/base/tg_err.h"
#include "tests/fuzz/fz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_memfile mf;
    fz_memfile_open(&mf, data, size);
    struct st_file f;
    char err[512];
    int rc = st_file_open(&f, mf.path, err, sizeof(err));
    fz_memfile_close(&mf); /* the mapping outlives the descriptor */
    if (rc != 0) {
        if (memchr(err, '\0', sizeof(err)) == NULL)
            fz_fail("unterminated error");
        return 0;
    }
    float *row = NULL;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const struct st_tensor *t = &f.tensors[i];
        if (st_file_find(&f, t->name) != t)
            fz_fail("tensor %s not found by name", t->name);
        if (t->offset + t->nbytes > f.data_len ||
            t->nbytes != t->numel * st_dtype_size(t->dtype))
            fz_fail("tensor %s outside the data region", t->name);
        if (t->dtype != ST_DTYPE_F32 && t->dtype != ST_DTYPE_F16 &&
            t->dtype != ST_DTYPE_BF16 && t->dtype != ST_DTYPE_F64)
            continue;
        uint64_t rows = st_tensor_rows(t);
        uint64_t per = rows ? t->numel / rows : 0;
        /* Rows of no elements cost nothing to read but there may be 2^62
         * of them; rows with elements are bounded by the file's size. */
        uint64_t read = per == 0 && rows > 4 ? 4 : rows;
        float *r = realloc(row, (per ? per : 1) * sizeof(float));
        if (!r)
            fz_fail("out of memory");
        row = r;
        for (uint64_t k = 0; k < read; k++)
            if (st_tensor_read_f32(t, k, k + 1, row, err, sizeof(err)) != 0)
                fz_fail("read of row %llu of %s: %s", (unsigned long long)k,
                        t->name, err);
        if (st_tensor_read_f32(t, rows, rows + 1, row, err, sizeof(err)) !=
            TG_ERANGE)
            fz_fail("a row past the end of %s was read", t->name);
    }
    free(row);
    for (size_t i = 0; i < f.n_meta; i++)
        if (st_file_metadata(&f, f.meta_keys[i]) == NULL)
            fz_fail("metadata key %s not found", f.meta_keys[i]);
    st_file_close(&f);
    st_file_close(&f); /* safe twice */
    return 0;
}
