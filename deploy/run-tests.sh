#!/bin/sh
# Runs the whole test suite: installs missing packages, checks the format of
# the lines the last commit changed, builds (warnings are errors), runs
# every ctest test, then rebuilds the host code with ASan + UBSan and runs the unit tests again under the sanitizers (the ctest run
# includes the soak test, tests/integration/test_soak.py, in its short form:
# TANGRAM_SOAK_SECONDS of load, default 48), checks that the unit tests
# catch a handful of deliberate bugs (tests/mutation), then builds the
# libFuzzer harnesses with clang and fuzzes each for a bounded time
# (TANGRAM_FUZZ_SECONDS, default 25; tests/fuzz/README.md). After each ctest
# run it prints how many tests ran and skipped: only GPU tests may skip
# (without an NVIDIA device); any other skip fails the run, and so does a
# ctest run that finds no test (--no-tests=error).
set -eu
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
PY=${TANGRAM_PYTHON:-/usr/bin/python3}

sh deploy/install-deps.sh

# Format: the C and CUDA lines the last commit or merge changed follow
# .clang-format (deploy/check-format.sh; the rest of the tree is left as
# it is).
sh deploy/check-format.sh

# run_ctest DIR [ctest args...]: ctest in DIR, then the summary; fails if
# either does.
run_ctest() {
    dir=$1
    shift
    rc=0
    (cd "$dir" && ctest --output-on-failure --no-tests=error -j"$JOBS" \
        --output-junit ctest-junit.xml "$@") || rc=$?
    "$PY" tests/ctest_summary.py "$dir" "$dir/ctest-junit.xml" || rc=1
    return $rc
}

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANGRAM_PYTHON="$PY"
cmake --build build -j"$JOBS"
run_ctest build

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTANGRAM_SANITIZE=ON \
    -DTANGRAM_CUDA=OFF -DTANGRAM_PYTHON="$PY"
cmake --build build-asan -j"$JOBS"
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
run_ctest build-asan -L unit

# Mutation check (tests/mutation/README.md): a handful of deliberate bugs
# in the admission and budget code, each of which the unit tests must
# catch; its own CPU-only build in build-mutation.
"$PY" tests/mutation/mutate.py --work build-mutation

# Fuzzing: the harnesses of tests/fuzz in their own build (clang,
# fuzzer-no-link + ASan + UBSan), each for a bounded time over a scratch
# copy of its seed corpus, two at a time; a crash, leak, hang or sanitizer
# report fails the run and names the reproducer.
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTANGRAM_FUZZ=ON -DTANGRAM_CUDA=OFF -DTANGRAM_PYTHON="$PY"
cmake --build build-fuzz -j"$JOBS" --target fuzz
sh tests/fuzz/run.sh build-fuzz "${TANGRAM_FUZZ_SECONDS:-25}" 2
