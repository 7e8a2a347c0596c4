/* tt_wsum.c — checksum sink and plain-read reference of the device weight
 * slab (see tt_wsum.h). */
#include "tests/support/tt_wsum.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* splitmix64's output function (Steele, Lea & Flood 2014). */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const struct tt_wsum *sort_ctx;

static int cmp_lo(const void *a, const void *b)
{
    uint64_t x = sort_ctx->lo[*(const int *)a], y = sort_ctx->lo[*(const int *)b];
    return x < y ? -1 : x > y;
}

void tt_wsum_free(struct tt_wsum *w)
{
    free(w->lo);
    free(w->hi);
    free(w->by_lo);
    free(w->sum);
    memset(w, 0, sizeof(*w));
}

int tt_wsum_init(struct tt_wsum *w, const struct gw_wslab *slab,
                 const struct gw_load_plan *plan)
{
    memset(w, 0, sizeof(*w));
    w->slab = slab;
    w->plan = plan;
    w->n = plan->n;
    size_t n = (size_t)(plan->n > 0 ? plan->n : 1);
    w->lo = calloc(n, sizeof(uint64_t));
    w->hi = calloc(n, sizeof(uint64_t));
    w->by_lo = calloc(n, sizeof(int));
    w->sum = calloc(n, sizeof(uint64_t));
    if (!w->lo || !w->hi || !w->by_lo || !w->sum) {
        tt_wsum_free(w);
        return -1;
    }
    for (int i = 0; i < plan->n; i++) {
        int elem;
        const struct gw_load_tensor *t = &plan->t[i];
        uint64_t off = gw_wslab_offset(slab, (int)t->kind, t->layer, &elem);
        if (off == GW_WSLAB_NONE) {
            fprintf(stderr, "tt_wsum: the slab has no %s\n", t->name);
            tt_wsum_free(w);
            return -1;
        }
        w->lo[i] = off;
        w->hi[i] = off + t->numel * (uint64_t)elem;
        w->by_lo[i] = i;
    }
    sort_ctx = w;
    qsort(w->by_lo, (size_t)plan->n, sizeof(int), cmp_lo);
    return 0;
}

/* The entry whose range holds slab offset p, or -1. */
static int entry_at(const struct tt_wsum *w, uint64_t p)
{
    int lo = 0, hi = w->n - 1, found = -1;
    while (lo <= hi) { /* last entry with lo <= p */
        int mid = (lo + hi) / 2;
        if (w->lo[w->by_lo[mid]] <= p) {
            found = w->by_lo[mid];
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found >= 0 && p < w->hi[found] ? found : -1;
}

void tt_wsum_add(struct tt_wsum *w, uint64_t dst, const void *src,
                 size_t bytes)
{
    const uint8_t *b = src;
    size_t i = 0;
    while (i < bytes) {
        int e = entry_at(w, dst + i);
        if (e < 0) {
            w->stray = 1;
            return;
        }
        size_t end = (size_t)(w->hi[e] - dst) < bytes ? (size_t)(w->hi[e] - dst)
                                                     : bytes;
        uint64_t s = 0;
        int64_t lo = (int64_t)i, hi = (int64_t)(end & ~(size_t)1);
        /* A sum modulo 2^64: the threads' order changes nothing. */
#pragma omp parallel for reduction(+ : s) schedule(static) if (hi - lo > (1 << 20))
        for (int64_t j = lo; j < hi; j += 2) {
            uint64_t u = (uint64_t)b[j] | (uint64_t)b[j + 1] << 8;
            s += mix((dst + (uint64_t)j) << 16 | u);
        }
        w->sum[e] += s;
        w->bytes += (uint64_t)(hi - lo);
        i = (size_t)hi;
        if (i < end) { /* an odd byte count: never from gw_wslab */
            w->stray = 1;
            return;
        }
    }
}

int tt_wsum_copy(void *ctx, uint64_t dst, const void *src, size_t bytes,
                 int buf, char *err, size_t errlen)
{
    (void)buf;
    (void)err;
    (void)errlen;
    tt_wsum_add(ctx, dst, src, bytes);
    return 0;
}

/* The source index of element (r, c) of the kept part, from the
 * selection's definition. */
static uint64_t source_index(const struct gw_load_tensor *t, uint64_t r,
                             uint64_t c)
{
    uint64_t cols = (uint64_t)(t->cols > 0 ? t->cols : 1);
    const struct gw_load_sel *s = &t->sel;
    uint64_t blk = (uint64_t)s->blk;
    switch (s->pick) {
    case GW_PICK_RANGE:
        return ((uint64_t)s->first + r) * cols + c;
    case GW_PICK_ROWS:
        return ((uint64_t)s->block[r / blk] * blk + r % blk) * cols + c;
    case GW_PICK_COLS:
        return r * cols + (uint64_t)s->block[c / blk] * blk + c % blk;
    default:
        return r * cols + c;
    }
}

/* The slab's bits of source element p: bf16 as it is (the device gets the
 * checkpoint's bits), anything else through fp32 (rounded to bf16 unless
 * the slab keeps fp32). */
static uint32_t slab_bits(const uint8_t *p, enum st_dtype dt, int elem)
{
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    if (dt == ST_DTYPE_BF16 && elem == 2)
        return h;
    float x;
    if (dt == ST_DTYPE_F32)
        memcpy(&x, p, 4);
    else
        x = dt == ST_DTYPE_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
    if (elem == 2)
        return st_f32_to_bf16(x);
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

int tt_wsum_reference(struct tt_wsum *w, const struct st_model *st)
{
    for (int k = 0; k < w->n; k++) {
        const struct gw_load_tensor *t = &w->plan->t[k];
        const struct st_file *f = t->src != NULL ? st_model_file_of(st, t->src)
                                                 : NULL;
        if (f == NULL) {
            fprintf(stderr, "tt_wsum_reference: %s is not bound\n", t->name);
            return -1;
        }
        /* A plain read of the whole tensor, on a descriptor of our own. */
        int fd = open(f->path, O_RDONLY | O_CLOEXEC);
        uint8_t *raw = malloc(t->src->nbytes > 0 ? t->src->nbytes : 1);
        uint64_t at = (uint64_t)(f->data - (const uint8_t *)f->map) + t->src->offset;
        size_t got = 0;
        while (fd >= 0 && raw != NULL && got < t->src->nbytes) {
            ssize_t r = pread(fd, raw + got, t->src->nbytes - got, (off_t)(at + got));
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (fd >= 0)
            close(fd);
        if (raw == NULL || got != t->src->nbytes) {
            fprintf(stderr, "tt_wsum_reference: cannot read %s from %s\n",
                    t->name, f->path);
            free(raw);
            return -1;
        }
        int elem;
        uint64_t base = gw_wslab_offset(w->slab, (int)t->kind, t->layer, &elem);
        size_t es = st_dtype_size(t->src->dtype);
        uint64_t sum = 0;
        int64_t rows = t->out_rows;
        uint64_t oc = (uint64_t)(t->out_cols > 0 ? t->out_cols : 1);
#pragma omp parallel for reduction(+ : sum) schedule(static) if (t->numel > (1 << 20))
        for (int64_t r = 0; r < rows; r++) {
            for (uint64_t c = 0; c < oc; c++) {
                uint32_t u = slab_bits(raw + source_index(t, (uint64_t)r, c) * es,
                                       t->src->dtype, elem);
                uint64_t pos = base + ((uint64_t)r * oc + c) * (uint64_t)elem;
                sum += mix(pos << 16 | (u & 0xffffu));
                if (elem == 4)
                    sum += mix((pos + 2) << 16 | (u >> 16));
            }
        }
        w->sum[k] += sum;
        w->bytes += t->numel * (uint64_t)elem;
        free(raw);
    }
    return 0;
}

int tt_wsum_diff(const struct tt_wsum *a, const struct tt_wsum *b)
{
    int bad = 0;
    for (int i = 0; i < a->n && i < b->n; i++) {
        if (a->sum[i] == b->sum[i])
            continue;
        if (bad++ == 0)
            fprintf(stderr, "tt_wsum: %s differs (%016llx vs %016llx)\n",
                    a->plan->t[i].name, (unsigned long long)a->sum[i],
                    (unsigned long long)b->sum[i]);
    }
    if (a->n != b->n || a->stray || b->stray) {
        fprintf(stderr, "tt_wsum: %d vs %d entries, stray bytes %d / %d\n",
                a->n, b->n, a->stray, b->stray);
        bad++;
    }
    return bad;
}
