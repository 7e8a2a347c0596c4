#!/bin/sh
# Runs the whole test suite: installs missing packages, builds (warnings are
# errors), runs every ctest test, then rebuilds the host code with ASan +
# UBSan and runs the unit tests again under the sanitizers.
# GPU tests report "skipped" on machines without an NVIDIA device.
set -eu
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)

sh deploy/install-deps.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$JOBS"
(cd build && ctest --output-on-failure -j"$JOBS")

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTANGRAM_SANITIZE=ON -DTANGRAM_CUDA=OFF
cmake --build build-asan -j"$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest -L unit --output-on-failure -j"$JOBS")
