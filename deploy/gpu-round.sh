#!/bin/bash
# One GPU round as budgeted phases, each one command that ends well inside
# a lent machine's 600-second limit (docs/PERFORMANCE.md "GPU rounds" says
# which phases make which round and how long each takes on a 16-core H100):
#
#   PHASE=1 bash deploy/gpu-round.sh  # round 1: environment, configure,
#                                     # build, every gpu unit test, the gpu
#                                     # bench smoke runs, the CUDA daemon tests
#   PHASE=2 ...                       # round 1: compute-sanitizer memcheck on
#                                     # every kernel test, racecheck on decode
#                                     # and prefill attention, compression, trig
#   PHASE=3 ...                       # round 2: transformers reference, decode
#                                     # attention vs copy and vs torch SDPA
#   PHASE=4 ...                       # round 2: an 8B-shaped daemon serving
#   PHASE=5 ...                       # round 3: serving at 8B, full KV vs 0.5
#                                     # vs 0.25 at the same KV memory
#   PHASE=6 ...                       # round 3: generate vs transformers,
#                                     # calibrate at 8B, trig and model benches
#   PHASE=x bash deploy/gpu-round.sh 'name:command' ...   # your own stages
#
# Every stage runs under `timeout` with its own cap, cut to what the
# phase's BUDGET (seconds) has left; a stage that would get under 10 s is
# skipped and says so. After every stage two files are rewritten in $OUT
# (default ./gpu-round-out): summary.txt (one line per stage: exit status,
# seconds, cap) and logs.tgz (every stage's log), so a command killed at
# its limit still returns what it finished. Phases 3-6 build first when
# $BUILD lacks the programs (a fresh machine), so each can open a lease.
#
# Environment: sources .device/setup.sh when present (TANGRAM_GPU_SETUP
# names another; it exports the library paths, TANGRAM_PYTHON and
# TANGRAM_CMAKE_ARGS on a machine without the Debian packages). BUILD
# (default build-gpu) and WORK (default /tmp/tg-gpu-round: generated models
# and profiles) are kept between phases on one machine.
# TANGRAM_ROUND_CMAKE_ARGS replaces the round's own configure flags
# (default: -DTANGRAM_WERROR=OFF -DTANGRAM_CUDA_LINEINFO=ON
# -DCMAKE_CUDA_ARCHITECTURES=90, H100/H200 only, half the CUDA build). With an
# NVIDIA GPU, TANGRAM_REQUIRE_GPU=1 is exported: a gpu test that cannot
# reach the device fails instead of skipping. Without one (a dry run on a
# CPU machine) the stages that need a device are skipped with that reason
# and the rest run in their CPU form (gpu tests report skipped, the serving
# benchmark runs --quick on the CPU backend). No non-GPU suite runs here.
# Exit status: 0 when every stage passed (or was skipped for want of a GPU).
set -u
cd "$(dirname "$0")/.." || exit 1
PHASE=${PHASE:-1}
OUT=${OUT:-$PWD/gpu-round-out}
B=${BUILD:-build-gpu}
WORK=${WORK:-/tmp/tg-gpu-round}
LOGS=/tmp/gpu-round-logs.$$
rm -rf "$LOGS" && mkdir -p "$LOGS" || exit 1
case "$PHASE" in
1) BUDGET=${BUDGET:-450} ;;
2) BUDGET=${BUDGET:-250} ;;
*) BUDGET=${BUDGET:-560} ;;
esac
mkdir -p "$OUT" "$WORK"
SUM=$OUT/summary.txt
: > "$SUM"
END=$(($(date +%s) + BUDGET))
status=0

pack() { tar -C "$LOGS" -czf "$OUT/logs.tgz" . 2> /dev/null; }

# stage NAME CAP CMD...: runs CMD under timeout with min(CAP, time left -
# 15 s), its output in NAME.log; one summary line.
stage() {
    local name=$1 cap=$2 left t0 rc
    shift 2
    left=$((END - $(date +%s) - 15))
    if [ "$left" -lt 10 ]; then
        printf '%-28s skipped: no time left in the phase budget\n' "$name" >> "$SUM"
        status=1
        pack
        return 1
    fi
    [ "$cap" -le "$left" ] || cap=$left
    t0=$(date +%s)
    # through bash -c: a stage may be one of the functions exported below
    timeout -k 5 "$cap" bash -c '"$@"' "$name" "$@" > "$LOGS/$name.log" 2>&1
    rc=$?
    printf '%-28s rc=%-3d %4ds (cap %ds)%s\n' "$name" "$rc" \
        $(($(date +%s) - t0)) "$cap" \
        "$([ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo ' TIMED OUT')" >> "$SUM"
    [ "$rc" -eq 0 ] || status=1
    pack
    return "$rc"
}

# gstage NAME CAP CMD...: a stage that needs the device.
gstage() {
    if [ "$have_gpu" -eq 0 ]; then
        printf '%-28s skipped: no NVIDIA GPU\n' "$1" >> "$SUM"
        pack
        return 0
    fi
    stage "$@"
}

finish() {
    pack
    cat "$SUM"
    rm -rf "$LOGS"
    exit "$status"
}

setup=${TANGRAM_GPU_SETUP:-.device/setup.sh}
if [ -f "$setup" ]; then
    # shellcheck disable=SC1090 # the staged set-up of the machine
    . "$setup" > "$LOGS/setup.log" 2>&1 ||
        { echo "setup: $setup failed (setup.log)" >> "$SUM"; status=1; finish; }
fi
PY=${TANGRAM_PYTHON:-$(command -v python3)}
export TANGRAM_PYTHON=$PY
have_gpu=0
if nvidia-smi -L > /dev/null 2>&1; then
    have_gpu=1
    export TANGRAM_REQUIRE_GPU=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
fi
BIN=$PWD/$B/bin
case "$B" in /*) BIN=$B/bin ;; esac
export TANGRAM_BIN=$BIN TANGRAM_DATA=$PWD/data TANGRAM_SOURCE=$PWD
{ git rev-parse HEAD && git status --short | head -20; } > "$LOGS/commit.log" 2>&1
echo "phase $PHASE, budget ${BUDGET}s, build $B, GPU: $([ $have_gpu -eq 1 ] && nvidia-smi -L | head -1 || echo none)" > "$LOGS/phase.log"

env_report() {
    nvidia-smi || echo "nvidia-smi: none"
    nvcc --version | tail -2
    cmake --version | head -1
    cc --version | head -1
    for p in ninja protoc-c pkg-config compute-sanitizer ncu; do
        echo "$p: $(command -v $p || echo missing)"
    done
    "$PY" -c 'import sys; print("python", sys.version.split()[0])'
    "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)' ||
        echo "torch/transformers: not importable from $PY"
    "$PY" -c 'import grpc, numpy; print("grpcio", grpc.__version__, "numpy", numpy.__version__)' ||
        echo "grpcio/numpy: not importable from $PY"
    echo "cmake args: ${TANGRAM_CMAKE_ARGS:-}"
}

configure() {
    local gen=""
    command -v ninja > /dev/null 2>&1 && gen="-G Ninja"
    local own="-DTANGRAM_WERROR=OFF -DTANGRAM_CUDA_LINEINFO=ON -DCMAKE_CUDA_ARCHITECTURES=90"
    # shellcheck disable=SC2086 # several arguments in each variable
    cmake -S . -B "$B" $gen ${TANGRAM_CMAKE_ARGS:-} \
        ${TANGRAM_ROUND_CMAKE_ARGS:-$own} -DTANGRAM_PYTHON="$PY"
}

build() { cmake --build "$B" -j"$(nproc)"; }

# Phases 3-6 on a fresh machine: configure and build first.
ensure_build() {
    if [ -x "$BIN/tangramd" ] && [ -x "$BIN/tangram-generate" ]; then
        echo "build $B kept" > "$LOGS/build.log"
        return 0
    fi
    stage configure 90 configure || finish
    stage build 300 build || { tail -40 "$LOGS/build.log" >> "$SUM"; finish; }
}

in_build() { (cd "$B" && "$@"); }

# The serving benchmark: at 8B on a GPU, its --quick CPU form otherwise.
serving() { # NAME ARGS...
    local name=$1
    shift
    if [ "$have_gpu" -eq 1 ]; then
        "$PY" tests/bench/bench_serving.py --bin "$BIN" --backend cuda \
            --shape Qwen--Qwen3-8B --workdir "$WORK/serving" \
            --json "$LOGS/$name.json" "$@"
    else
        "$PY" tests/bench/bench_serving.py --bin "$BIN" --quick \
            --targets 0.5,0.25 --json "$LOGS/$name.json"
    fi
}

# 50 samples of about 2K tokens (the words of the serving benchmark).
calib_samples() {
    "$PY" - "$1" << 'EOF'
import json, random, sys
w = ("the of and to in is was for on that with as by at from his it an were "
     "are which this be or has had not but first one their its new after "
     "who they two her she been other when time during there into school "
     "more may years over only year most would world city some").split()
r = random.Random(50)
with open(sys.argv[1], "w") as f:
    for _ in range(50):
        f.write(json.dumps({"text": " ".join(r.choice(w) for _ in range(2000))}) + "\n")
EOF
}

calibrate_8b() {
    local m=$WORK/serving/model
    [ -f "$m/model.safetensors" ] || { echo "no 8B model in $m: run PHASE=4 first"; return 1; }
    calib_samples "$WORK/calib50.jsonl" || return 1
    time "$BIN/tangram-profile" calibrate --model "$m" --backend cuda \
        --ratio 0.25 --samples "$WORK/calib50.jsonl" --max-sample-tokens 2048 \
        --heads-per-group 2 -o "$WORK/calib50.json"
}

export B BIN PY WORK LOGS have_gpu
export -f env_report configure build in_build serving calib_samples calibrate_8b

case "$PHASE" in
1)
    stage env 30 env_report
    stage configure 90 configure || finish
    stage build 240 build || { tail -40 "$LOGS/build.log" >> "$SUM"; finish; }
    stage gpu-unit 200 in_build ctest -L gpu -LE 'bench|integration' -j6 --output-on-failure
    stage gpu-bench-quick 90 in_build ctest -R '^bench-cuda-' --output-on-failure
    stage gpu-daemon 150 in_build ctest -R 'test_daemon_cuda' -j2 --output-on-failure
    ;;
2)
    [ -d "$B/tests" ] || { echo "no $B: run PHASE=1 first on this machine" >> "$SUM"; status=1; finish; }
    for t in "$B"/tests/test_cuda_* "$B"/tests/test_kv_table_dev; do
        [ -x "$t" ] || continue
        n=$(basename "$t")
        case "$n" in test_cuda_sample | test_cuda_model | test_cuda_engine) continue ;; esac
        gstage "memcheck-$n" 45 compute-sanitizer --tool memcheck --error-exitcode 9 "$t"
    done
    # test_cuda_sample's scans take minutes under racecheck: memcheck only,
    # last, with what the budget has left.
    for n in decode_attn prefill_attn compress trig; do
        gstage "racecheck-$n" 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_cuda_$n"
    done
    gstage memcheck-test_cuda_sample 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_cuda_sample"
    ;;
3)
    ensure_build
    stage hf-reference 300 in_build ctest -R test_reference_hf_cuda --output-on-failure
    gstage decode-attn 120 "$BIN/bench-cuda-decode-attn"
    gstage sdpa-peer 150 "$PY" tests/bench/bench_peer_sdpa.py --bin "$BIN" --json "$LOGS/sdpa.json"
    ;;
4)
    ensure_build
    # full depth, 64 conversations at once (two turns each: the second
    # reuses the first's KV), full KV then a compressing profile
    stage serve-8b 500 serving serve-8b --targets 0.5 --num-conversations 64 \
        --turns 2 --request-rate 0 --user-words 300,600 --max-tokens 64 \
        --kv-memory 0.5 --prefill-chunk 2048 --max-num-seqs 64
    ;;
5)
    ensure_build
    # same GPU memory for KV and the same Poisson arrivals for every run
    stage serving-ratios 540 serving serving-ratios --targets 0.5,0.25 \
        --num-conversations 48 --turns 3 --request-rate 2 \
        --user-words 400,800 --max-tokens 64 --kv-memory 8GiB \
        --prefill-chunk 2048 --max-num-seqs 64
    ;;
6)
    ensure_build
    gstage peer-generate 300 "$PY" tests/bench/bench_peer_generate.py --bin "$BIN" \
        --workdir "$WORK/peer" --json "$LOGS/peer-generate.json"
    gstage calibrate-8b 150 calibrate_8b
    gstage trig-bench 60 "$BIN/bench-cuda-trig"
    gstage model-bench 200 "$BIN/bench-cuda-model"
    ;;
x)
    for spec in "$@"; do
        stage "${spec%%:*}" 600 bash -c "${spec#*:}"
    done
    ;;
*)
    echo "PHASE must be 1-6 or x (got '$PHASE')" >> "$SUM"
    status=2
    ;;
esac
finish
