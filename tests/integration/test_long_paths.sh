#!/usr/bin/env bash
# test_long_paths.sh — the programs and the test tools work from a checkout
# whose path is long (a CI workspace, a build folder named after a commit
# hash): bench-model-load, the tool test_model_load_rss.sh runs, kept its
# tangram-make-model arguments in 64-byte slots, so a data folder path of
# about 50 bytes or more cut the tokenizer's path to ".../dat" and the
# checkpoint could not be written.
#
# Here the data folder, the programs and TMPDIR are reached through a
# directory whose path is over 200 bytes (links to the real ones), and
# bench-model-load generates and loads a small Qwen3-shaped checkpoint
# from a config there, the way test_model_load_rss.sh does with real
# shapes (writing a few MB instead of 3 GB). Then a value that must stay
# whole and does not fit its buffer is an error that says so (a served
# model name of 300 bytes). Fails when a program or the data is missing.
# A few seconds.
set -euo pipefail

BIN=${TANGRAM_BIN:?TANGRAM_BIN not set}
DATA=${TANGRAM_DATA:?TANGRAM_DATA not set}
fail() { echo "FAIL: $*" >&2; exit 1; }

[[ -x "$BIN/bench-model-load" ]] || fail "$BIN/bench-model-load is not built"
[[ -x "$BIN/tangram-make-model" ]] || fail "$BIN/tangram-make-model is not built"
[[ -d "$DATA/tokenizers/qwen3" ]] || fail "missing $DATA/tokenizers/qwen3"

top=$(mktemp -d "${TMPDIR:-/tmp}/tg-long.XXXXXX")
trap 'rm -rf "$top"' EXIT
seg=$(printf 'segment%.0s' {1..8})                # 56 bytes
long="$top/$seg/build-0123456789abcdef0123456789abcdef01234567/$seg/$seg"
mkdir -p "$long/data/configs" "$long/tmp"
ln -s "$(cd "$DATA" && pwd)/tokenizers" "$long/data/tokenizers"
ln -s "$(cd "$BIN" && pwd)" "$long/bin"
(( ${#long} > 200 )) || fail "the long path is only ${#long} bytes"
echo "== from $long (${#long} bytes)"

# Qwen3-0.6B's config at a tiny width: the generator's path through the
# arguments is the one real shapes take, with a checkpoint of a few MB.
cat > "$long/data/configs/tiny-qwen3_config.json" <<'EOF'
{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "intermediate_size": 128, "num_hidden_layers": 2,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
 "rope_theta": 1000000, "tie_word_embeddings": true, "vocab_size": 151936,
 "torch_dtype": "bfloat16"}
EOF

TANGRAM_DATA="$long/data" TANGRAM_BIN="$long/bin" TMPDIR="$long/tmp" \
    "$long/bin/bench-model-load" --config tiny-qwen3_config.json \
    --only host --max-over-mib 256 ||
    fail "bench-model-load from a long path (see above)"

# A value that must stay whole and does not fit is refused saying so:
# tangramd with a served model name of 300 bytes (the router holds 255)
# exits 3 naming it, instead of serving a cut name that no client sends
# (TMPDIR short: the worker socket must fit an AF_UNIX address, which
# tangramd already says when it does not).
echo "== --served-model-name of 300 bytes"
"$long/bin/tangram-make-model" --arch qwen3 --hidden 64 --layers 2 \
    --heads 4 --kv-heads 2 --head-dim 16 --ffn 128 \
    --tokenizer "$long/data/tokenizers/qwen3" -o "$long/model" >/dev/null ||
    fail "tangram-make-model into $long/model"
read -r hp gp < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
name=$(printf 'n%.0s' {1..300})
set +e
out=$(env -u TANGRAM_API_KEY TMPDIR="$top" timeout 120 \
    "$long/bin/tangramd" --model "$long/model" --served-model-name "$name" \
    --http-port "$hp" --grpc-port "$gp" --kv-memory 64MiB \
    --heads-per-group 2 2>&1)
rc=$?
set -e
[[ $rc -eq 3 ]] || fail "tangramd exited $rc, not 3: ${out: -2000}"
grep -q -- "--served-model-name 'nnnn.*' is 300 bytes; at most 255" <<<"$out" ||
    fail "no message naming the served model name: ${out: -2000}"
echo "PASS"
