#!/usr/bin/env bash
# test_tokenize_cli.sh — tangram-tokenize end to end: encode / decode with the
# project's Llama-3 and Qwen tokenizers, --add-special, special tokens in
# text, every llama.cpp vocab test case through the CLI, and bad input / bad
# usage exit codes. Missing data fails the test.
set -u
BIN="${TANGRAM_BIN:?TANGRAM_BIN not set}/tangram-tokenize"
DATA="${TANGRAM_DATA:?TANGRAM_DATA not set}"
PY=${TANGRAM_PYTHON:-/usr/bin/python3}
TOK="$DATA/tokenizers"
VT="$DATA/llamacpp_vocab_tests"
[ -x "$BIN" ] || { echo "missing $BIN"; exit 1; }
[ -f "$TOK/llama3/tokenizer.json" ] || { echo "FAIL: project data missing: $TOK/llama3/tokenizer.json"; exit 1; }
[ -d "$VT" ] || { echo "FAIL: project data missing: $VT"; exit 1; }

fail=0
check() { # name got want
    if [ "$2" != "$3" ]; then
        echo "FAIL $1: got [$2] want [$3]"
        fail=1
    else
        echo "ok   $1"
    fi
}

check "llama3 encode" "$(printf 'Hello world' | "$BIN" --tokenizer "$TOK/llama3")" "[9906, 1917]"
check "llama3 add-special" \
    "$(printf 'Hello world' | "$BIN" --tokenizer "$TOK/llama3/tokenizer.json" --add-special)" \
    "[128000, 9906, 1917]"
check "llama3 header tokens" \
    "$(printf '<|start_header_id|>user<|end_header_id|>\n\n' | "$BIN" --tokenizer "$TOK/llama3")" \
    "[128006, 882, 128007, 271]"
check "qwen specials, no BOS added" \
    "$(printf '<|im_start|>user\nHello<|im_end|>\n' | "$BIN" --tokenizer "$TOK/qwen2.5" --add-special)" \
    "[151644, 872, 198, 9707, 151645, 198]"
check "qwen3 split-special" \
    "$(printf '<|im_end|>' | "$BIN" --tokenizer "$TOK/qwen3" --split-special | grep -c 151645)" "0"
check "empty input" "$(printf '' | "$BIN" --tokenizer "$TOK/qwen3")" "[]"
check "decode" "$(printf '[420, 374, 11410, 99, 247, 13, 11055]' | "$BIN" --tokenizer "$TOK/llama3" --decode)" \
    " this is 🦙.cpp"
check "decode skip-special" \
    "$(printf '[151644, 872, 151645]' | "$BIN" --tokenizer "$TOK/qwen2.5" --decode --skip-special)" "user"

# Vocab test cases through the CLI and back: the longest case (it mixes
# whitespace runs, emoji, scripts, digits and contractions) and one short one
# per tokenizer; test_tokenizer checks all of them in-process.
"$PY" - "$BIN" "$TOK" "$VT" <<'EOF' || fail=1
import json, subprocess, sys
bin_, tok, vt = sys.argv[1:4]
bad = 0
for name, toks in (("llama-bpe", ["llama3"]), ("qwen2", ["qwen2.5", "qwen3"])):
    text = open(f"{vt}/ggml-vocab-{name}.gguf.inp", "rb").read().decode()
    cases = text.split("\n__ggml_vocab_test__\n")[:-1]
    want = open(f"{vt}/ggml-vocab-{name}.gguf.out").read().split("\n")
    picked = sorted(range(len(cases)), key=lambda i: -len(cases[i]))[:1] + [12]
    for t in toks:
        for case, line in ((cases[i], want[i]) for i in picked):
            r = subprocess.run([bin_, "--tokenizer", f"{tok}/{t}"],
                               input=case.encode(), capture_output=True, check=True)
            ids = json.loads(r.stdout)
            if ids != [int(x) for x in line.split()]:
                bad += 1
                print(f"FAIL {t}: {case!r}")
            r = subprocess.run([bin_, "--tokenizer", f"{tok}/{t}", "--decode"],
                               input=json.dumps(ids).encode(), capture_output=True,
                               check=True)
            if r.stdout.decode() != case:
                bad += 1
                print(f"FAIL {t} round trip: {case!r}")
        print(f"ok   {t}: vocab cases {picked}")
sys.exit(1 if bad else 0)
EOF

# Errors: exit 1 for bad input or files, 2 for bad usage, message on stderr.
expect_rc() { # name want_rc cmd...
    local name=$1 want=$2
    shift 2
    local err
    err=$("$@" 2>&1 >/dev/null)
    local rc=$?
    if [ "$rc" != "$want" ] || [ -z "$err" ]; then
        echo "FAIL $name: rc $rc (want $want), stderr [$err]"
        fail=1
    else
        echo "ok   $name"
    fi
}
expect_rc "invalid UTF-8" 1 bash -c "printf 'a\\xff' | '$BIN' --tokenizer '$TOK/llama3'"
expect_rc "decode not JSON" 1 bash -c "printf '[1, 2' | '$BIN' --tokenizer '$TOK/llama3' --decode"
expect_rc "decode not an array" 1 bash -c "printf '{}' | '$BIN' --tokenizer '$TOK/llama3' --decode"
expect_rc "decode unknown id" 1 bash -c "printf '[1, 999999]' | '$BIN' --tokenizer '$TOK/llama3' --decode"
expect_rc "decode non-integer" 1 bash -c "printf '[1.5]' | '$BIN' --tokenizer '$TOK/llama3' --decode"
expect_rc "missing tokenizer" 1 bash -c "printf 'x' | '$BIN' --tokenizer /nonexistent"
expect_rc "no --tokenizer" 2 bash -c "printf 'x' | '$BIN'"
expect_rc "unknown flag" 2 bash -c "printf 'x' | '$BIN' --tokenizer '$TOK/llama3' --bogus"
"$BIN" --help | grep -q -- "--add-special" && echo "ok   --help" || { echo "FAIL --help"; fail=1; }

exit $fail
