/*
 * gw_load.h — streaming weight loading: a model shard's tensors go from
 * the checkpoint's files to their destination one tensor at a time,
 * through one bounded staging buffer, into a sink (the destination's
 * upload op). Nothing holds a whole-model copy on the way.
 *
 * Plan. A plan lists what one destination keeps (gw_model_load_plan
 * builds a tensor-parallel rank's, gw_model.h has the split; this file
 * knows no model): per entry the checkpoint tensor's name and shape
 * there, the part kept (all of it; blocks of rows; blocks of columns of
 * every row; one range of rows) and the destination (kind, layer). The
 * kept part is a row-major (out_rows, out_cols) tensor, its elements in
 * the destination's order. gw_load_plan_bind finds every entry in an
 * opened checkpoint (single file or sharded index) and checks its shape
 * and dtype (bf16, fp16 or fp32) before anything is read.
 *
 * Streaming. gw_load_run reads what the rank keeps (whole rows of a
 * column split) with pread (st_file_pread), never through the file's
 * mapping, so the resident set
 * holds the staging buffer and not the file: mapped pages would count
 * against the process until the file is closed. Tensors are read in file
 * order (shard, then offset) so the disk sees one forward pass. Each
 * kept tensor reaches the sink as slices: consecutive element ranges
 * [offset, offset + n) of the kept layout in increasing offset order, in
 * the checkpoint's dtype, one tensor finished before the next begins.
 * A slice's bytes live in the staging buffer and are valid only during
 * the call.
 *
 * Staging: `staging` bytes (GW_LOAD_STAGING_DEFAULT when 0, at least
 * GW_LOAD_STAGING_MIN) in two halves: a reader thread preads the next
 * piece into one half while the caller's thread hands the other to the
 * sink, so reading overlaps converting and copying. Blocks of rows and row
 * ranges are contiguous in the file and read as they are, in slices of at
 * most half the staging; a column split (o_proj, down_proj of a shard)
 * reads batches of whole rows into the upper part of a half and gathers
 * the kept columns into its lower part. The staging grows only when a row
 * of a column-split tensor is wider than a quarter of it (to four such
 * rows). gw_load_run_host feeds a sink the same slices from weights
 * already in host memory (fp32, found through a lookup function:
 * gw_model_run_host passes a model's), for callers that built the weights
 * themselves (tests, benchmarks).
 *
 * Threads: gw_load_run calls the sink on the caller's thread only; the
 * reader thread only reads files.
 *
 * Sinks: the CPU backend's converts bf16/fp16 to fp32 per slice into the
 * model's own arrays (gw_model_load_weights); the CUDA runtime's keeps bf16
 * and copies to device memory (gw_wslab.h, gw_cuda.c); tests checksum.
 *
 * Progress: a load that runs longer than GW_LOAD_PROGRESS_S seconds logs
 * its progress (tg_log, info) every GW_LOAD_PROGRESS_S seconds.
 *
 * Plans are read-only once built; one run at a time per sink.
 */
#ifndef GW_LOAD_H
#define GW_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/st_safetensors.h"

#define GW_LOAD_STAGING_DEFAULT ((size_t)64 << 20) /* 64 MiB */
#define GW_LOAD_STAGING_MIN ((size_t)64 << 10)     /* 64 KiB */
#define GW_LOAD_PROGRESS_S 10.0

/* Where a kept tensor goes: a model-wide tensor or one of a layer's. */
enum gw_wkind {
    GW_W_EMBED = 0,   /* (V, hidden) */
    GW_W_FINAL_NORM,  /* (hidden) */
    GW_W_LM_HEAD,     /* (count, hidden): this rank's vocabulary rows */
    GW_W_ATTN_NORM,   /* per layer from here on */
    GW_W_WQ,
    GW_W_WK,
    GW_W_WV,
    GW_W_BQ,
    GW_W_BK,
    GW_W_BV,
    GW_W_Q_NORM,
    GW_W_K_NORM,
    GW_W_WO,
    GW_W_BO,
    GW_W_FFN_NORM,
    GW_W_GATE,
    GW_W_UP,
    GW_W_DOWN,
    GW_W_COUNT
};

#define GW_W_FIRST_LAYER_KIND GW_W_ATTN_NORM

/* The checkpoint's name format of a kind ("model.layers.%d.mlp.up_proj
 * .weight"); pure. */
const char *gw_wkind_name(enum gw_wkind k);

/* Which part of a checkpoint tensor a rank keeps. */
enum gw_load_pick {
    GW_PICK_ALL = 0,  /* the whole tensor */
    GW_PICK_ROWS,     /* blocks of blk rows, block[k] in keep order */
    GW_PICK_COLS,     /* blocks of blk columns of every row */
    GW_PICK_RANGE,    /* the blk rows starting at row `first` */
};

struct gw_load_sel {
    enum gw_load_pick pick;
    int64_t blk;          /* rows or columns per block */
    const int32_t *block; /* (n_blk) block indices in the source; points
                             into the plan */
    int n_blk;
    int64_t first;        /* GW_PICK_RANGE: first row */
};

/* One tensor to load. */
struct gw_load_tensor {
    char name[128];                /* the checkpoint's name */
    enum gw_wkind kind;
    int layer;                     /* -1 for model-wide kinds */
    int64_t rows, cols;            /* checkpoint shape; cols 0: a vector */
    struct gw_load_sel sel;
    int64_t out_rows, out_cols;    /* the kept part (out_cols 0: vector) */
    uint64_t numel;                /* out_rows * max(out_cols, 1) */
    const struct st_tensor *src;   /* set by gw_load_plan_bind */
};

struct gw_load_plan {
    struct gw_load_tensor *t;      /* (n) in destination order */
    int n;
    int cap;                       /* entries t has room for */
    int tied;                      /* the model ties lm_head to embed */
    uint64_t numel;                /* kept elements of all entries */
    int32_t *idx;                  /* owned block indices the entries
                                      point into */
};

/* Makes *p an empty plan with room for `cap` entries and `n_idx` block
 * indices in p->idx (owned by the plan; the entries' selections point
 * into it). Returns 0, or TG_ENOMEM with *p left freed. */
int gw_load_plan_alloc(struct gw_load_plan *p, int cap, size_t n_idx, char *err,
                       size_t errlen);

/* Appends the entry of destination (kind, layer) whose checkpoint tensor
 * has shape (rows, cols) (cols 0: a vector), keeping `sel`, named after
 * gw_wkind_name(kind). The caller sized the plan for it
 * (gw_load_plan_alloc's cap: a broken count is an invariant failure). */
void gw_load_plan_add(struct gw_load_plan *p, enum gw_wkind kind, int layer,
                      int64_t rows, int64_t cols, struct gw_load_sel sel);

/* Frees the plan; safe on a zeroed or freed one. */
void gw_load_plan_free(struct gw_load_plan *p);

/* Finds every entry of p in st and checks it: present (an untied model
 * must ship lm_head.weight even on a rank holding no rows of it), shape,
 * dtype bf16 / fp16 / fp32. Sets each entry's src. Returns 0, or
 * TG_EFORMAT / TG_EUNSUPPORTED naming the directory and the tensor. */
int gw_load_plan_bind(struct gw_load_plan *p, const struct st_model *st,
                      char *err, size_t errlen);

/* One piece of a kept tensor handed to a sink. */
struct gw_load_slice {
    const struct gw_load_tensor *t; /* the destination */
    enum st_dtype dtype;            /* BF16, F16 or F32 */
    const void *data;               /* n elements of dtype; valid during
                                       the call only; not aligned */
    uint64_t offset;                /* first element in the kept layout */
    uint64_t n;                     /* elements, >= 1 */
};

/* A destination. upload takes one slice (see the top of this file for the
 * order) and returns 0 or a negative code with the reason in err, which
 * stops the load. */
struct gw_load_sink {
    int (*upload)(void *ctx, const struct gw_load_slice *s, char *err,
                  size_t errlen);
    void *ctx;
};

/* What a load did. */
struct gw_load_stats {
    uint64_t bytes;        /* read from the checkpoint (or handed over) */
    uint64_t elems;        /* elements handed to the sink */
    int n_tensors;
    int n_files;           /* shards read; 0 for gw_load_run_host */
    size_t staging;        /* the staging buffer's bytes */
    double seconds;        /* wall time of the run */
};

/* Streams every entry of the bound plan p from st into sink through a
 * staging buffer of `staging` bytes (0: the default). Fills *stats (may be
 * NULL). Returns 0, TG_EINVAL (an unbound plan), TG_ENOMEM (the staging
 * buffer), TG_EIO (a read; the file and offset named) or the sink's code.
 * The sink may have taken part of the weights when it fails. */
int gw_load_run(const struct gw_load_plan *p, const struct st_model *st,
                size_t staging, const struct gw_load_sink *sink,
                struct gw_load_stats *stats, char *err, size_t errlen);

/* The fp32 host array of destination (kind, layer), or NULL when there is
 * none (for gw_load_run_host). */
typedef const float *(*gw_load_host_fn)(const void *ud, enum gw_wkind kind,
                                        int layer);

/* The same slices from weights already in host memory (fp32 arrays that
 * host(ud, kind, layer) finds, each of the entry's kept layout): no file
 * is read, no staging is allocated (slices of at most `staging` bytes
 * point into the arrays). Returns 0, TG_EINVAL (host finds no array for
 * an entry) or the sink's code. */
int gw_load_run_host(const struct gw_load_plan *p, gw_load_host_fn host,
                     const void *ud, size_t staging,
                     const struct gw_load_sink *sink,
                     struct gw_load_stats *stats, char *err, size_t errlen);

/* Writes "1.19 GB from 1 file in 0.52 s (2.29 GB/s, 64 MiB staging)" into
 * buf. Pure. */
void gw_load_stats_format(const struct gw_load_stats *s, char *buf,
                          size_t cap);

#endif /* GW_LOAD_H */
