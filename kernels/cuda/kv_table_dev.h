/*
 * kv_table_dev.h — the block table on the device (DESIGN.md §4.5).
 *
 * A worker keeps one device copy of its rank's kv_table (common/kv/kv_table.h):
 * indptr, indices, npages and lens in device buffers that are allocated
 * once and grown geometrically, refilled by an asynchronous host-to-device
 * copy on the step's stream. tg_cuda_kv_table_dev_resolve is the lookup every
 * attention/append kernel does, as a small kernel: (row, token) -> (page
 * id, slot in page); its CPU reference is kv_table_resolve_batch.
 *
 * The header is plain C without CUDA types (streams are passed as void *,
 * NULL = the default stream), so host C can include it; the functions need
 * a CUDA build (TANGRAM_CUDA) and a device. Errors: TG_EDEVICE from the
 * CUDA runtime, TG_EINVAL for bad arguments. One thread per object.
 */
#ifndef KV_TABLE_DEV_H
#define KV_TABLE_DEV_H

#include <stdint.h>

#include "common/kv/kv_table.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tg_cuda_kv_table_dev {
    int32_t *indptr;    /* device (cap_rows + 1) first slot of each row */
    int32_t *indices;   /* device (cap_slots) page ids, -1 in gaps */
    int32_t *npages;    /* device (cap_rows) pages per row */
    int32_t *lens;      /* device (cap_rows) tokens written per row */
    int64_t cap_rows;   /* rows the device buffers hold */
    int64_t cap_slots;  /* ids the device buffer holds */
    int32_t n_rows;     /* rows of the last upload */
    int32_t page_size;  /* P of the last upload */
    int64_t n_slots;    /* slots of the last upload */
};

/* Zeroes `dt`; no device memory is taken until the first upload. */
void tg_cuda_kv_table_dev_init(struct tg_cuda_kv_table_dev *dt);

/* Frees the device buffers (synchronising the device). Safe on a zeroed
 * object. */
void tg_cuda_kv_table_dev_free(struct tg_cuda_kv_table_dev *dt);

/* Copies `table` to the device on `stream`, growing the buffers by at
 * least half when too small (cudaMalloc, which synchronises). The copy is
 * asynchronous: `table` must stay unchanged until the stream passes this
 * point (and only page-locked host memory overlaps with compute). Returns
 * 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_kv_table_dev_upload(struct tg_cuda_kv_table_dev *dt,
                                const struct kv_table *table, void *stream);

/* Resolves n queries on `stream`: for device arrays rows[n], tokens[n],
 * writes page[i] = the page holding token tokens[i] of row rows[i] and
 * slot[i] = its slot in that page, or -1 and -1 when the row or token is
 * out of range (token >= npages * P). Returns 0, TG_EINVAL or TG_EDEVICE
 * (launch errors are checked; the results are ready when the stream is). */
int tg_cuda_kv_table_dev_resolve(const struct tg_cuda_kv_table_dev *dt,
                                 int32_t n, const int32_t *rows,
                                 const int32_t *tokens, int32_t *page,
                                 int32_t *slot, void *stream);

/* The same for host arrays, synchronously (copies in, launches, copies
 * back, with temporary device buffers): for tests and the benchmark, not
 * the step path. Returns 0, TG_EINVAL or TG_EDEVICE. */
int tg_cuda_kv_table_dev_resolve_host(const struct tg_cuda_kv_table_dev *dt,
                                      int32_t n, const int32_t *rows,
                                      const int32_t *tokens, int32_t *page,
                                      int32_t *slot);

/* Writes dst[pos[i]] = val[i] for i < n on `stream` (device arrays): the
 * incremental update of a block table kept on the device across steps
 * (the page ids a step appended, at their slots). Positions must be
 * distinct and inside dst; the caller guarantees both. n == 0 queues
 * nothing. Never allocates or synchronises. Returns 0, TG_EINVAL (n < 0
 * or a NULL array with n > 0) or TG_EDEVICE. */
int tg_cuda_kv_table_dev_scatter(int32_t *dst, const int32_t *pos,
                                 const int32_t *val, int32_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* KV_TABLE_DEV_H */
