#!/bin/sh
# One round of work on a GPU machine, as one command whose logs all land in
# $OUT (default ./gpu-round): the GPU's nvidia-smi line, the CUDA build
# (sm_80 and sm_90 unless TANGRAM_CMAKE_ARGS says otherwise), every `gpu`
# test verbosely, the rest of the suite, then compute-sanitizer: memcheck
# on every kernel test, racecheck and synccheck on decode attention,
# prefill attention, compression, decode-time compaction and sampling.
# Every GPU test must reach a device (TANGRAM_REQUIRE_GPU=1, unless the
# caller sets it to 0: then, without an NVIDIA GPU, it still builds and
# runs the suite, the gpu tests skip, and it says that the sanitizer stage
# did not run).
#
# On the lent machine: `. .device/setup.sh && sh deploy/gpu-round.sh`
# (setup.sh exports the library paths, $TANGRAM_CMAKE_ARGS and
# $TANGRAM_PYTHON). Exit status: 0 when every stage passed; the summary
# of each stage is in $OUT/summary.txt.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-round}
BUILD=${TANGRAM_GPU_BUILD:-build-gpu}
PY=${TANGRAM_PYTHON:-/usr/bin/python3}
JOBS=$(nproc 2>/dev/null || echo 2)
mkdir -p "$OUT"
: > "$OUT/summary.txt"
status=0

# stage NAME LOG CMD...: runs CMD with its output in $OUT/LOG and records
# the exit status in the summary.
stage() {
    name=$1
    log=$2
    shift 2
    start=$(date +%s)
    "$@" > "$OUT/$log" 2>&1
    rc=$?
    end=$(date +%s)
    printf '%-28s rc=%d  %4ds  %s\n' "$name" "$rc" "$((end - start))" \
        "$log" >> "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || status=1
    return "$rc"
}

# A GPU test that cannot reach a device fails here instead of skipping
# (tests/README.md); TANGRAM_REQUIRE_GPU=0 runs the round on a machine
# without one.
export TANGRAM_REQUIRE_GPU="${TANGRAM_REQUIRE_GPU:-1}"

have_gpu=0
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1; then
    have_gpu=1
    nvidia-smi >> "$OUT/nvidia-smi.txt" 2>&1
fi
{ git rev-parse HEAD; git status --short; } > "$OUT/commit.txt" 2>&1

# shellcheck disable=SC2086 # TANGRAM_CMAKE_ARGS holds several arguments
stage configure configure.log cmake -S . -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANGRAM_PYTHON="$PY" \
    ${TANGRAM_CMAKE_ARGS:-} || { cat "$OUT/summary.txt"; exit 1; }
stage build build.log cmake --build "$BUILD" -j"$JOBS" ||
    { tail -40 "$OUT/build.log"; cat "$OUT/summary.txt"; exit 1; }
stage "ctest gpu" ctest-gpu.log sh -c \
    "cd '$BUILD' && ctest -L gpu -V --no-tests=error --timeout 1200 --output-junit gpu-junit.xml"
stage "ctest rest" ctest-rest.log sh -c \
    "cd '$BUILD' && ctest -LE gpu -j'$JOBS' --no-tests=error --output-on-failure --output-junit rest-junit.xml"

san=$(command -v compute-sanitizer 2>/dev/null || true)
if [ "$have_gpu" -eq 1 ] && [ -n "$san" ]; then
    for t in "$BUILD"/tests/test_cuda_* "$BUILD"/tests/test_kv_table_dev; do
        [ -x "$t" ] || continue
        n=$(basename "$t")
        stage "memcheck $n" "san-memcheck-$n.log" \
            "$san" --tool memcheck --error-exitcode 1 "$t"
    done
    for n in test_cuda_decode_attn test_cuda_prefill_attn test_cuda_compress \
             test_cuda_trig test_cuda_sample; do
        for tool in racecheck synccheck; do
            stage "$tool $n" "san-$tool-$n.log" \
                "$san" --tool "$tool" --error-exitcode 1 "$BUILD/tests/$n"
        done
    done
else
    echo "sanitizers not run: no GPU or no compute-sanitizer" >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
exit $status
