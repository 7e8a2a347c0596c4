#!/bin/sh
# Generates the tiny test models of the quick start and (with --calibrate)
# recalibrates their shipped profiles. Deterministic: same seed, same bytes.
#   profiles/make-tiny.sh [BUILD_DIR] [OUT_DIR] [--calibrate]
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-build}/bin
OUT=${2:-models}
DATA=${TANGRAM_DATA:-data}
mkdir -p "$OUT"
# qwen3: 4 layers, 8 query heads over 4 KV heads of 32, tied embeddings.
[ -f "$OUT/tiny-qwen3/model.safetensors" ] || "$BIN/tangram-make-model" --arch qwen3 \
    --hidden 128 --layers 4 --heads 8 --kv-heads 4 --head-dim 32 --ffn 384 --tie \
    --tokenizer "$DATA/tokenizers/qwen3" --dtype bf16 --seed 7 -o "$OUT/tiny-qwen3"
# llama: Llama-3 rope scaling, untied head.
[ -f "$OUT/tiny-llama/model.safetensors" ] || "$BIN/tangram-make-model" --arch llama \
    --hidden 128 --layers 4 --heads 8 --kv-heads 4 --head-dim 32 --ffn 384 \
    --rope-scaling-llama3 8 --tokenizer "$DATA/tokenizers/llama3" --dtype bf16 \
    --seed 7 -o "$OUT/tiny-llama"
if [ "${3:-}" = "--calibrate" ]; then
    for m in tiny-qwen3 tiny-llama; do
        "$BIN/tangram-profile" calibrate --model "$OUT/$m" --method snapkv --ratio 0.25 \
            --samples profiles/samples/calib-design.jsonl --alpha 2 --heads-per-group 2 \
            --retention-out "profiles/$m.retention.json" -o "profiles/$m.json"
    done
fi
