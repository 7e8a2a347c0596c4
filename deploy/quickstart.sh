#!/bin/sh
# The README's first command: installs what is needed, builds, generates
# the tiny test model and serves it with tangramd on the CPU backend on
# 127.0.0.1 (HTTP 8000, gRPC 50051), with its calibrated profile (ragged,
# compressed KV). Runs in the foreground; Ctrl-C drains and stops it.
# Run as root on Debian 12 (the package install needs it).
set -eu
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
HTTP_PORT=${TANGRAM_HTTP_PORT:-8000}
sh deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$JOBS"
sh profiles/make-tiny.sh build models
cat <<EOT

== tangramd: tiny Qwen3 model (random weights), calibrated profile, CPU backend ==
Try, from another terminal:

  curl -s http://127.0.0.1:$HTTP_PORT/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "tiny-qwen3", "prompt": "Multi-turn chat keeps", "max_tokens": 16}'
  curl -s http://127.0.0.1:$HTTP_PORT/metrics | grep tangram_kv

The text is noise (random weights); the KV metrics show the ragged layout at work.
Ctrl-C drains and stops the server.

EOT
exec build/bin/tangramd --model models/tiny-qwen3 --profile profiles/tiny-qwen3.json \
    --host 127.0.0.1 --http-port "$HTTP_PORT" --kv-memory 256MiB
