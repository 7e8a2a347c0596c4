/* gw_backend_kind.c — a worker backend chosen by its kind (gw_backend.h):
 * the one place that knows both implementations. */
#include "gpu_worker/backend/gw_backend.h"

#include "common/base/tg_err.h"

const char *const gw_backend_choices[3] = {"cpu", "cuda", NULL};

int gw_backend_new(enum gw_backend_kind kind, const struct gw_backend_cfg *cfg,
                   struct gw_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    switch (kind) {
    case GW_BACKEND_CPU: return gw_backend_cpu_new(cfg, out, err, errlen);
    case GW_BACKEND_CUDA: return gw_backend_cuda_new(cfg, out, err, errlen);
    }
    return tg_err_set(err, errlen, TG_EINVAL, "unknown backend %d", (int)kind);
}
