#!/usr/bin/env bash
# test_model_load_rss.sh — streaming weight loading keeps host memory
# bounded on real-sized checkpoints (bench-model-load, each load in a child
# process of its own, its VmHWM read right after the load):
#  (1) the CUDA runtime's host path (the device weight slab's upload with a
#      checksum in place of the device copy) on a Qwen3-8B-shaped bf16
#      checkpoint written by tangram-make-model from
#      data/configs/Qwen--Qwen3-8B_config.json, 2 of its 36 layers (3.26 GB:
#      the embedding and the LM head are 2.5 GB of it; full depth, 16 GB,
#      takes minutes to write and is measured by hand in
#      docs/PERFORMANCE.md), peaks under 2 GiB and uploads exactly the
#      bytes an independent plain read of every tensor gives;
#  (2) the CPU backend's load of a Qwen3-0.6B-shaped checkpoint (8 of 28
#      layers, 0.56 GB of bf16) peaks at most 256 MiB over its fp32
#      weights. The old loader read through the file's mapping and peaked
#      at the weights plus the whole file (536 MiB here), which fails this
#      bound; the staging buffer is 64 MiB.
# Both bounds are on memory, not time, so machine load cannot break them.
set -euo pipefail

BIN=${TANGRAM_BIN:?TANGRAM_BIN not set}
DATA=${TANGRAM_DATA:?TANGRAM_DATA not set}
B="$BIN/bench-model-load"
fail() { echo "FAIL: $*" >&2; exit 1; }

[[ -x "$B" ]] || fail "$B is not built"
[[ -x "$BIN/tangram-make-model" ]] || fail "$BIN/tangram-make-model is not built"
for c in Qwen--Qwen3-8B_config.json Qwen--Qwen3-0.6B_config.json; do
    [[ -f "$DATA/configs/$c" ]] || fail "missing $DATA/configs/$c"
done
tmp=${TMPDIR:-/tmp}
free_kib=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
(( free_kib > 4 * 1024 * 1024 )) ||
    fail "$tmp has $((free_kib / 1024)) MiB free; the 8B-shaped checkpoint needs 4 GiB"

echo "== Qwen3-8B shape, 2 layers: the CUDA path's host side under 2 GiB"
"$B" --config Qwen--Qwen3-8B_config.json --layers 2 --only slab --verify \
    --max-hwm-mib 2048 || fail "8B-shaped slab load (see above)"

echo "== Qwen3-0.6B shape, 8 layers: the CPU load within fp32 + 256 MiB"
"$B" --config Qwen--Qwen3-0.6B_config.json --layers 8 --only host \
    --max-over-mib 256 || fail "0.6B-shaped host load (see above)"
echo "PASS"
