#!/bin/bash
# tangram-generate as a user runs it: text prompts, --max-tokens 0, seeded
# sampling reproducibility, JSON shape, and clear errors for bad input.
set -u
BIN=${TANGRAM_BIN:-build/bin}
DATA=${TANGRAM_DATA:-data}
PY=${TANGRAM_PYTHON:-/usr/bin/python3}
for p in tangram-generate tangram-make-model; do
    [ -x "$BIN/$p" ] || { echo "FAIL: $BIN/$p is not built"; exit 1; }
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

"$BIN/tangram-make-model" --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
    --head-dim 16 --ffn 128 --tokenizer "$DATA/tokenizers/qwen3" --dtype bf16 \
    --seed 3 -o "$tmp/m" >/dev/null || { echo "FAIL: make-model"; exit 1; }
G="$BIN/tangram-generate --model $tmp/m"

# Text prompt, JSON output with every field.
out=$($G --prompt "Hello there, how are you?" --max-tokens 5 --json) || bad "text prompt"
echo "$out" | "$PY" -c '
import json,sys
d=json.load(sys.stdin)
assert set(d)>={"prompt_token_ids","prompt_logprobs","token_ids","text","logprobs","finish_reason"}, d.keys()
assert d["prompt_token_ids"]==[9707,1052,11,1246,525,498,30], d["prompt_token_ids"]
assert len(d["token_ids"])==5 and d["finish_reason"] in ("length","stop")
' && ok || bad "json shape"

# --max-tokens 0: prompt logprobs only.
out=$($G --prompt-ids '[1,2,3,4,5]' --max-tokens 0 --prompt-logprobs --json) || bad "max-tokens 0"
echo "$out" | "$PY" -c '
import json,sys
d=json.load(sys.stdin)
assert d["token_ids"]==[] and d["prompt_logprobs"][0] is None and len(d["prompt_logprobs"])==5
assert all(x<0 for x in d["prompt_logprobs"][1:])
' && ok || bad "max-tokens 0 output"

# Seeded sampling is reproducible; another seed differs.
a=$($G --prompt-ids '[10,20,30]' --max-tokens 12 --temperature 1.0 --top-p 0.95 --seed 5 --json --ignore-eos)
b=$($G --prompt-ids '[10,20,30]' --max-tokens 12 --temperature 1.0 --top-p 0.95 --seed 5 --json --ignore-eos)
c=$($G --prompt-ids '[10,20,30]' --max-tokens 12 --temperature 1.0 --top-p 0.95 --seed 6 --json --ignore-eos)
[ "$a" = "$b" ] && ok || bad "same seed, different output"
[ "$a" != "$c" ] && ok || bad "different seeds, same output"

# Top logprobs: K entries, descending, the chosen token's logprob finite.
$G --prompt-ids '[10,20,30]' --max-tokens 3 --logprobs 4 --json | "$PY" -c '
import json,sys
d=json.load(sys.stdin)
for e in d["logprobs"]:
    t=[x["logprob"] for x in e["top_logprobs"]]
    assert len(t)==4 and t==sorted(t,reverse=True) and e["logprob"]<=t[0]+1e-6
' && ok || bad "top logprobs"

# Bad input: clear message, non-zero exit, no crash.
expect_err() { # pattern, args...
    local pat=$1; shift
    local msg; msg=$("$@" 2>&1 >/dev/null); local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && echo "$msg" | grep -qi -- "$pat"; then ok; else bad "expected '$pat' (rc $rc): $msg"; fi
}
expect_err "vocabulary" $G --prompt-ids '[1, 999999999]' --max-tokens 1
expect_err "prompt-ids" $G --prompt-ids '[1, -2]' --max-tokens 1
expect_err "invalid JSON" $G --prompt-ids '[1, 2' --max-tokens 1
expect_err "exactly one" $G --max-tokens 1
expect_err "config.json" $BIN/tangram-generate --model "$tmp/nope" --prompt-ids '[1]'
expect_err "temperature" $G --prompt-ids '[1]' --temperature -1
expect_err "unknown" $G --prompt-ids '[1]' --bogus-flag 1
expect_err "missing.json" $G --prompt-ids '[1]' --profile "$tmp/missing.json"
echo '{"format": "tangram-profile", "version": 1}' > "$tmp/badprof.json"
expect_err "model" $G --prompt-ids '[1]' --profile "$tmp/badprof.json"
# A profile for another shape is refused, naming both shapes.
SRC=${TANGRAM_SOURCE:-.}
expect_err "L=4" $G --prompt-ids '[1]' --profile "$SRC/profiles/tiny-qwen3.json"
expect_err "context" $G --prompt-ids '[1]' --max-tokens 40000
expect_err "cpu|cuda" $G --prompt-ids '[1]' --backend tpu

# --backend cuda drives the CUDA runtime through the worker's backend ops
# table; where it cannot run it fails at once with the reason and prints
# nothing on stdout: no device (or no driver), a build without CUDA, or on
# a GPU the tiny model's head_dim 16, which the CUDA kernels lack.
cuda_why='no CUDA device is usable\|no CUDA backend\|head_dim 64 and 128'
expect_err "$cuda_why" $G --prompt-ids '[1,2,3]' --max-tokens 2 --backend cuda --json
out=$($G --prompt-ids '[1,2,3]' --max-tokens 2 --backend cuda --json 2>/dev/null)
[ -z "$out" ] && ok || bad "--backend cuda printed a result where it cannot run: $out"
if ! nvidia-smi -L >/dev/null 2>&1; then
    expect_err "use --backend cpu" $G --prompt-ids '[1,2,3]' --backend cuda
fi

# --timing: prefill and decode wall and process CPU times on any backend;
# the JSON names its backend.
$G --prompt-ids '[1,2,3,4]' --max-tokens 3 --timing --json | "$PY" -c '
import json,sys
d=json.load(sys.stdin)
t=d["timing"]
assert d["backend"]=="cpu", d["backend"]
for k in ("prefill_seconds","decode_seconds","compact_seconds","prefill_cpu_seconds","decode_cpu_seconds","prefill_tokens_per_second","decode_tokens_per_second"):
    assert isinstance(t[k],float) and t[k]>=0, (k,t)
assert t["prefill_seconds"]>0 and t["decode_seconds"]>0, t
assert t["prefill_cpu_seconds"]>0 and t["decode_cpu_seconds"]>0, t
' && ok || bad "--timing JSON"
$G --prompt-ids '[1,2,3,4]' --max-tokens 3 --json | "$PY" -c '
import json,sys
assert "timing" not in json.load(sys.stdin)
' && ok || bad "timing only when asked"

# --cpu-weights: auto keeps this bf16 checkpoint's matrices bf16; f32
# converts them (exactly). Same weights either way, so the prompt's
# log-probabilities agree up to fp32 summation order (1e-4 relative).
for w in auto f32 bf16; do
    $G --prompt-ids '[5,6,7,8,9,10]' --max-tokens 0 --prompt-logprobs \
        --cpu-weights $w --json > "$tmp/w-$w.json" || bad "--cpu-weights $w"
done
"$PY" - "$tmp" <<'PYEOF' && ok || bad "--cpu-weights JSON"
import json, sys
d = {w: json.load(open("%s/w-%s.json" % (sys.argv[1], w))) for w in ("auto", "f32", "bf16")}
assert d["auto"]["cpu_weights"] == "bf16", d["auto"].get("cpu_weights")
assert d["f32"]["cpu_weights"] == "f32", d["f32"].get("cpu_weights")
assert d["bf16"]["cpu_weights"] == "bf16", d["bf16"].get("cpu_weights")
a, b = d["f32"]["prompt_logprobs"], d["bf16"]["prompt_logprobs"]
assert len(a) == len(b) == 6, (a, b)
for x, y in zip(a[1:], b[1:]):
    assert abs(x - y) <= 1e-4 * max(1.0, abs(x)), (a, b)
PYEOF
expect_err "bf16" $G --prompt-ids '[1]' --cpu-weights fp8

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
