#!/usr/bin/env bash
# test_make_model.sh — tangram-make-model writes loadable HF model
# directories: for each architecture, generate a tiny model, then check it
# (1) with an independent numpy reader of the safetensors file and config
# (names, shapes, dtypes, layout, init statistics, vocab/bos/eos from the
# tokenizer), and (2) with our own C reader and config parser
# (test_model_config's TANGRAM_TEST_MODEL_DIR check). Also: determinism per
# seed, and clear failures for bad flags.
set -euo pipefail

BIN=${TANGRAM_BIN:?TANGRAM_BIN not set}
DATA=${TANGRAM_DATA:?TANGRAM_DATA not set}
MAKE="$BIN/tangram-make-model"
CHECK_C="$BIN/../tests/test_model_config"
TOK="$DATA/tokenizers"
PY=${TANGRAM_PYTHON:-/usr/bin/python3}

[[ -x "$MAKE" ]] || { echo "FAIL: $MAKE is not built"; exit 1; }
[[ -d "$TOK/qwen3" ]] || { echo "FAIL: project tokenizers missing: $TOK/qwen3"; exit 1; }
"$PY" -c 'import numpy' 2>/dev/null ||
    { echo "FAIL: python3-numpy is not installed (sh deploy/install-deps.sh)"; exit 1; }

tmp=$(mktemp -d /tmp/tg_make_model.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# Independent check: parse the safetensors header by hand with numpy.
pycheck() { # dir tokenizer_dir
    "$PY" - "$1" "$2" <<'EOF'
import glob, json, os, struct, sys
import numpy as np

d, tokdir = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(d, "config.json")))
raw = open(os.path.join(d, "model.safetensors"), "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert (8 + n) % 8 == 0, "data region not 8-byte aligned"
hdr = json.loads(raw[8:8 + n].decode("utf-8"))
data = raw[8 + n:]
meta = hdr.pop("__metadata__", {})
assert meta.get("format") == "pt", meta

arch = cfg["architectures"][0]
H, F = cfg["hidden_size"], cfg["intermediate_size"]
nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
V, L = cfg["vocab_size"], cfg["num_hidden_layers"]
dt = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[cfg["torch_dtype"]]

# vocab_size / bos / eos straight from the tokenizer folder.
tok = json.load(open(os.path.join(tokdir, "tokenizer.json")))
ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]
assert V == max(ids) + 1, (V, max(ids) + 1)
gc = glob.glob(os.path.join(tokdir, "generation_config*.json"))
if gc:
    g = json.load(open(gc[0]))
    assert cfg["bos_token_id"] == g.get("bos_token_id"), cfg["bos_token_id"]
    assert cfg["eos_token_id"] == g["eos_token_id"], cfg["eos_token_id"]

want = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
if not cfg["tie_word_embeddings"]:
    want["lm_head.weight"] = [V, H]
for l in range(L):
    p = f"model.layers.{l}."
    want.update({
        p + "input_layernorm.weight": [H],
        p + "post_attention_layernorm.weight": [H],
        p + "self_attn.q_proj.weight": [nh * hd, H],
        p + "self_attn.k_proj.weight": [nkv * hd, H],
        p + "self_attn.v_proj.weight": [nkv * hd, H],
        p + "self_attn.o_proj.weight": [H, nh * hd],
        p + "mlp.gate_proj.weight": [F, H],
        p + "mlp.up_proj.weight": [F, H],
        p + "mlp.down_proj.weight": [H, F],
    })
    if arch == "Qwen2ForCausalLM":
        want.update({p + "self_attn.q_proj.bias": [nh * hd],
                     p + "self_attn.k_proj.bias": [nkv * hd],
                     p + "self_attn.v_proj.bias": [nkv * hd]})
    if arch == "Qwen3ForCausalLM":
        want.update({p + "self_attn.q_norm.weight": [hd],
                     p + "self_attn.k_norm.weight": [hd]})
assert set(hdr) == set(want), sorted(set(hdr) ^ set(want))

def values(name):
    t = hdr[name]
    b, e = t["data_offsets"]
    buf = np.frombuffer(data[b:e], dtype={"BF16": "<u2", "F16": "<f2", "F32": "<f4"}[t["dtype"]])
    if t["dtype"] == "BF16":
        buf = (buf.astype(np.uint32) << 16).view(np.float32)
    return buf.astype(np.float64).reshape(t["shape"])

end = 0
spans = []
for name, t in hdr.items():
    assert t["dtype"] == dt, (name, t["dtype"])
    assert t["shape"] == want[name], (name, t["shape"], want[name])
    b, e = t["data_offsets"]
    assert e - b == int(np.prod(t["shape"])) * {"BF16": 2, "F16": 2, "F32": 4}[dt]
    spans.append((b, e))
spans.sort()
for (b0, e0), (b1, e1) in zip(spans, spans[1:]):
    assert e0 == b1, "tensors not contiguous"
assert spans[0][0] == 0 and spans[-1][1] == len(data)

emb = values("model.embed_tokens.weight")
assert abs(emb.std() - 1.0) < 0.02 and abs(emb.mean()) < 0.02, emb.std()
q = values("model.layers.0.self_attn.q_proj.weight")
assert abs(q.std() * np.sqrt(H) - 1) < 0.1, q.std()
down = values(f"model.layers.{L-1}.mlp.down_proj.weight")
assert abs(down.std() * np.sqrt(F) - 1) < 0.1, down.std()
nw = values("model.norm.weight")
assert abs(nw.mean() - 1) < 0.1 and 0.03 < nw.std() < 0.2, (nw.mean(), nw.std())
if arch == "Qwen2ForCausalLM":
    bias = values("model.layers.0.self_attn.q_proj.bias")
    assert abs(bias.mean()) < 0.1 and 0.03 < bias.std() < 0.2
# Different tensors get different streams.
assert not np.array_equal(values("model.layers.0.mlp.gate_proj.weight"),
                          values("model.layers.0.mlp.up_proj.weight"))
for f in ("tokenizer.json", "tokenizer_config.json"):
    assert os.path.isfile(os.path.join(d, f)), f
print("ok", arch, len(hdr), "tensors")
EOF
}

ccheck() { # dir
    [[ -x "$CHECK_C" ]] || fail "$CHECK_C is not built"
    TANGRAM_TEST_MODEL_DIR="$1" "$CHECK_C" >"$tmp/ccheck.log" 2>&1 ||
        { cat "$tmp/ccheck.log"; fail "C reader rejected $1"; }
    grep -q "OK \] test_generated_model" "$tmp/ccheck.log" ||
        { cat "$tmp/ccheck.log"; fail "C check did not run for $1"; }
}

gen() { # name tokenizer args...
    local name=$1 tokd=$2
    shift 2
    "$MAKE" --tokenizer "$TOK/$tokd" -o "$tmp/$name" "$@" ||
        fail "generation of $name failed"
    pycheck "$tmp/$name" "$TOK/$tokd" || fail "numpy check of $name"
    ccheck "$tmp/$name"
}

gen qwen3 qwen3 --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
    --head-dim 32 --ffn 96 --seed 7
gen qwen2 qwen2.5 --arch qwen2 --hidden 48 --layers 3 --heads 6 --kv-heads 2 \
    --ffn 64 --tie --seed 1 --rope-theta 1000000
gen llama llama3 --arch llama --hidden 64 --layers 2 --heads 8 --kv-heads 2 \
    --ffn 128 --dtype fp16 --rope-theta 500000 --rope-scaling-llama3 8
gen mistral llama3 --arch mistral --hidden 32 --layers 1 --heads 4 \
    --kv-heads 4 --ffn 64 --dtype fp32 --tie

# The tokenizer_config variant name is copied as tokenizer_config.json, and
# generation_config travels along.
cmp -s "$TOK/llama3/tokenizer_config.llama-3.2-3b-instruct.json" \
    "$tmp/llama/tokenizer_config.json" || fail "llama tokenizer_config copy"
cmp -s "$TOK/llama3/generation_config.llama-3.2-3b-instruct.json" \
    "$tmp/llama/generation_config.json" || fail "llama generation_config copy"
cmp -s "$TOK/qwen3/tokenizer.json" "$tmp/qwen3/tokenizer.json" ||
    fail "tokenizer.json copy"
"$PY" - "$tmp/llama/config.json" <<'EOF' || fail "llama config fields"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["rope_scaling"]["rope_type"] == "llama3" and c["rope_scaling"]["factor"] == 8
assert c["rope_theta"] == 500000 and c["head_dim"] == 8
assert c["eos_token_id"] == [128001, 128008, 128009] and c["bos_token_id"] == 128000
assert c["vocab_size"] == 128256 and c["torch_dtype"] == "float16"
EOF

# Same seed, same bytes; another seed, other weights.
"$MAKE" --arch qwen3 --tokenizer "$TOK/qwen3" -o "$tmp/qwen3b" --hidden 64 \
    --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ffn 96 --seed 7 >/dev/null
cmp -s "$tmp/qwen3/model.safetensors" "$tmp/qwen3b/model.safetensors" ||
    fail "same seed gave different weights"
cmp -s "$tmp/qwen3/config.json" "$tmp/qwen3b/config.json" ||
    fail "same flags gave a different config"
"$MAKE" --arch qwen3 --tokenizer "$TOK/qwen3" -o "$tmp/qwen3b" --hidden 64 \
    --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ffn 96 --seed 8 >/dev/null
if cmp -s "$tmp/qwen3/model.safetensors" "$tmp/qwen3b/model.safetensors"; then
    fail "different seeds gave identical weights"
fi

# Bad flags fail with a message naming the problem, and write nothing.
expect_fail() { # pattern args...
    local pat=$1
    shift
    if "$MAKE" "$@" >"$tmp/out.log" 2>"$tmp/err.log"; then
        fail "accepted: $*"
    fi
    grep -qi -- "$pat" "$tmp/err.log" ||
        { cat "$tmp/err.log"; fail "message for '$*' lacks '$pat'"; }
}
Q=(--tokenizer "$TOK/qwen3" -o "$tmp/bad")
expect_fail "kv-heads" --arch qwen3 "${Q[@]}" --heads 4 --kv-heads 3
expect_fail "tokenizer" --arch qwen3 --tokenizer "$tmp/nope" -o "$tmp/bad"
expect_fail "tokenizer.json" --arch qwen3 --tokenizer "$tmp" -o "$tmp/bad"
expect_fail "arch" --arch gpt2 "${Q[@]}"
expect_fail "required" "${Q[@]}"
expect_fail "dtype" --arch qwen3 "${Q[@]}" --dtype int8
expect_fail "head-dim" --arch qwen3 "${Q[@]}" --head-dim 15
expect_fail "hidden" --arch qwen3 "${Q[@]}" --hidden 12x
expect_fail "hidden" --arch qwen3 "${Q[@]}" --hidden 0
expect_fail "heads" --arch qwen3 "${Q[@]}" --hidden 66 --heads 4
expect_fail "rope-theta" --arch qwen3 "${Q[@]}" --rope-theta -5
expect_fail "unknown flag '--bogus'" --arch qwen3 "${Q[@]}" --bogus
expect_fail "seed" --arch qwen3 "${Q[@]}" --seed -1
[[ ! -e "$tmp/bad" ]] || fail "a failed run left $tmp/bad behind"
"$MAKE" --help | grep -q "usage" || fail "--help"

echo "test_make_model: all checks passed"
