#!/bin/sh
# The README's first command: installs what is needed, builds, generates the
# tiny test model and runs it on the CPU backend with its calibrated
# profile (ragged, compressed KV). Run from anywhere, as root on Debian 12.
set -eu
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
sh deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$JOBS"
sh profiles/make-tiny.sh build models
echo
echo "== tangram-generate: tiny Qwen3 model, calibrated profile, CPU backend =="
build/bin/tangram-generate --model models/tiny-qwen3 --profile profiles/tiny-qwen3.json \
    --prompt "Multi-turn chat keeps a growing KV cache per conversation." \
    --max-tokens 16 --temperature 0.8 --seed 1
echo
echo "The model has random weights, so the text is noise; the KV line shows the"
echo "pages the ragged layout used against an all-heads (monolithic) layout."
echo "Try:  build/bin/tangram-profile show --profile profiles/tiny-qwen3.json"
