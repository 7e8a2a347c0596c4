#!/usr/bin/python3
"""bench_peer_sdpa — the peer of bench-cuda-decode-attn: PyTorch's
scaled_dot_product_attention doing decode attention over full KV at the
same shapes, and tangram's split-map kernel on the same shapes, side by
side in one run (DESIGN.md §7).

Shapes (bench_cuda_decode_attn.c's): Llama-3.1-8B (32 query / 8 KV heads,
d 128) and Qwen3-32B (64 / 8, d 128), batch 1, 8, 32, 64, context 8K, 32K,
128K, bf16, one decode token per sequence. torch: q (B, Hkv, G, d) against
contiguous K and V (B, Hkv, ctx, d) with no mask, so the G query heads of a
KV head share its keys (grouped-query attention without copying K/V), the
fastest layout torch offers (its flash or memory-efficient kernel). Bytes
per call: the K and V it reads, B * Hkv * ctx * d * 2 * 2; GB/s over the
median of --reps timed calls (CUDA events) after a warm-up, and that as a
fraction of the device-to-device copy bandwidth torch measures in the same
run (a 1 GiB clone, read + write bytes).

tangram: `bench-cuda-decode-attn --target-pct 100` (full KV: every group
holds ctx tokens in shuffled 16-token pages) run as a subprocess; its
split-map and no-split lines are parsed and printed beside torch's:
GB/s, % of copy, and time ratio torch / tangram (above 1: tangram faster).

On a machine without a GPU it still runs where it can: torch's SDPA on the
CPU (a copy measured there), at the --quick shapes, and tangram's column
reads "skipped: no CUDA device". Without torch it says so and exits 1.

Usage: bench_peer_sdpa.py [--quick] [--bin DIR] [--reps N] [--max-gib X]
       [--json FILE]
--quick: the 8B shape, batch 1 and 8, context 8K (what ctest's quick runs
of bench-cuda-decode-attn time); configurations whose K + V exceed
--max-gib (default 40) are skipped and reported.
"""
import argparse
import json
import os
import re
import subprocess
import sys

MODELS = (("llama-3.1-8b", 8, 4, 128), ("qwen3-32b", 8, 8, 128))
BATCHES = (1, 8, 32, 64)
CTXS = (8192, 32768, 131072)
LINE = re.compile(r"^(\S+)\s+batch\s+(\d+)\s+ctx\s+(\d+)\s+(split-map|uniform|"
                  r"no-split)\s+([\d.]+) us/layer\s+([\d.]+) GB/s\s+([\d.]+)%")


def tangram_lines(bin_dir, quick, reps):
    """{(model, batch, ctx, variant): (us, GB/s, % of copy)} from
    bench-cuda-decode-attn, or (None, why) when it did not run."""
    prog = os.path.join(bin_dir, "bench-cuda-decode-attn")
    if not os.access(prog, os.X_OK):
        return None, "%s is not built" % prog
    cmd = [prog, "--target-pct", "100", "--reps", str(reps)]
    if quick:
        cmd.append("--quick")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode == 77:
        return None, p.stdout.strip() or "skipped"
    if p.returncode != 0:
        return None, "failed (rc %d): %s" % (p.returncode, p.stderr[-500:])
    out = {}
    for line in p.stdout.splitlines():
        m = LINE.match(line.strip())
        if m:
            out[(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4))] = (
                float(m.group(5)), float(m.group(6)), float(m.group(7)))
    head = p.stdout.splitlines()[0] if p.stdout else ""
    return out, head


def torch_sdpa(torch, dev, hkv, g, d, batch, ctx, reps):
    """Median seconds of one SDPA decode call (None if it does not fit)."""
    F = torch.nn.functional
    dt = torch.bfloat16
    q = torch.randn(batch, hkv, g, d, device=dev, dtype=dt)
    k = torch.randn(batch, hkv, ctx, d, device=dev, dtype=dt)
    v = torch.randn(batch, hkv, ctx, d, device=dev, dtype=dt)
    times = []
    for i in range(reps + 1):
        if dev == "cuda":
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            F.scaled_dot_product_attention(q, k, v)
            b.record()
            b.synchronize()
            t = a.elapsed_time(b) * 1e-3
        else:
            import time
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v)
            t = time.perf_counter() - t0
        if i > 0:  # the first call warms up
            times.append(t)
    del q, k, v
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth(torch, dev, nbytes):
    """Bytes read + written per second by a device copy of nbytes."""
    import time
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev)
    x.zero_()
    y = x.clone()
    best = None
    for _ in range(5):
        if dev == "cuda":
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            y.copy_(x)
            b.record()
            b.synchronize()
            t = a.elapsed_time(b) * 1e-3
        else:
            t0 = time.perf_counter()
            y.copy_(x)
            t = time.perf_counter() - t0
        best = t if best is None or t < best else best
    del x, y
    return 2.0 * nbytes / best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bin", default=os.environ.get("TANGRAM_BIN", "build/bin"))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-gib", type=float, default=40.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print("bench_peer_sdpa: the peer needs PyTorch in this Python "
              "(%s): %s" % (sys.executable, e), file=sys.stderr)
        return 1
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        print("bench_peer_sdpa: torch %s has no scaled_dot_product_attention "
              "(2.0 or later needed)" % torch.__version__, file=sys.stderr)
        return 1
    quick = a.quick or dev == "cpu"
    models = MODELS[:1] if quick else MODELS
    batches = BATCHES[:2] if quick else BATCHES
    ctxs = CTXS[:1] if quick else CTXS
    if dev == "cpu":
        batches, ctxs = (1,), (2048,)
    # tangram first: torch's caching allocator would keep device memory
    tg, head = tangram_lines(a.bin, quick, max(2, a.reps // 2))
    bw = copy_bandwidth(torch, dev, (1 << 30) if dev == "cuda" else (1 << 28))
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "CPU"
    print("torch %s on %s: copy bandwidth %.1f GB/s (read + write)"
          % (torch.__version__, name, bw * 1e-9))
    print("tangram: %s" % head)
    print("%-13s %5s %6s | %21s | %21s | %21s | %8s" % (
        "shape", "batch", "ctx", "tangram split-map", "tangram no-split",
        "torch SDPA", "torch/tg"))
    rows = []
    for mname, hkv, g, d in models:
        for ctx in ctxs:
            for batch in batches:
                kv = batch * hkv * ctx * d * 2 * 2
                row = {"shape": mname, "batch": batch, "ctx": ctx,
                       "kv_bytes": kv}
                if kv > a.max_gib * (1 << 30):
                    row["torch"] = "skipped: K+V %.1f GiB > --max-gib" % (
                        kv / (1 << 30))
                    t = None
                else:
                    try:
                        t = torch_sdpa(torch, dev, hkv, g, d, batch, ctx,
                                       a.reps)
                    except RuntimeError as e:  # out of memory
                        row["torch"] = "failed: %s" % str(e)[:100]
                        t = None
                        if dev == "cuda":
                            torch.cuda.empty_cache()
                cells = []
                for var in ("split-map", "no-split"):
                    x = tg.get((mname, batch, ctx, var)) if tg else None
                    row["tangram_" + var] = x
                    cells.append("%7.1f GB/s %5.1f%%" % (x[1], x[2])
                                 if x else "%21s" % "-")
                if t is not None:
                    gbs = kv / t
                    row["torch_us"] = t * 1e6
                    row["torch_gbs"] = gbs * 1e-9
                    row["torch_copy_frac"] = gbs / bw
                    cells.append("%7.1f GB/s %5.1f%%" % (gbs * 1e-9,
                                                         100 * gbs / bw))
                else:
                    cells.append("%21s" % row.get("torch", "-")[:21])
                sm = row["tangram_split-map"]
                ratio = "%7.2fx" % (t * 1e6 / sm[0]) if (t and sm) else "-"
                row["torch_over_tangram_time"] = (t * 1e6 / sm[0]
                                                  if (t and sm) else None)
                print("%-13s %5d %6d | %s | %s | %s | %8s" % (
                    mname, batch, ctx, cells[0], cells[1], cells[2], ratio),
                    flush=True)
                rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": name, "copy_bandwidth": bw, "rows": rows,
                       "tangram": head}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
