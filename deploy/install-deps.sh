#!/bin/sh
# Installs every Debian 12 package tangram needs to build, test and serve.
# Idempotent and non-interactive: safe to run again; installs nothing twice.
# clang, libclang-rt-14-dev (libFuzzer and clang's sanitizer runtimes, only
# recommended by clang) and libomp-dev (clang's OpenMP) build the fuzzing
# harnesses (tests/fuzz); clang-format (with git-clang-format) checks the
# format of changed lines (deploy/check-format.sh). prometheus provides promtool, which CI runs on a
# live /metrics (tests/integration/test_metrics_promtool.py); on a host
# with systemd the package also enables a Prometheus server on :9090
# (systemctl disable --now prometheus when it is not wanted; a container's
# policy-rc.d keeps it from starting). CUDA 13, cuBLAS and NCCL are not
# Debian packages; the build uses them from /usr/local/cuda when nvcc is
# found and builds without them otherwise. python3-jsonschema is the
# independent validator of the structured-output tests
# (tests/integration/test_grammar_walk.py).
set -eu

PKGS="build-essential cmake pkg-config git ca-certificates curl
libuv1-dev libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
libjemalloc-dev libjansson-dev libpcre2-dev libutf8proc-dev
libnghttp2-dev libhttp-parser-dev libopenblas-dev libcmocka-dev
libsystemd-dev libsodium-dev libsqlite3-dev clang libclang-rt-14-dev libomp-dev clang-format
python3 python3-numpy python3-jinja2 python3-grpcio python3-yaml
python3-protobuf python3-jsonschema protobuf-compiler nodejs npm prometheus"

# Names that installed packages provide (e.g. NodeSource's nodejs provides
# and conflicts with npm): such a name counts as present, installing it
# would fail.
provided=$(dpkg-query -W -f='${Status}|${Provides}\n' 2>/dev/null |
    sed -n 's/^install ok installed|//p' | tr ',' '\n' |
    sed 's/^ *//; s/ .*//' | sort -u)

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" &&
        ! printf '%s\n' "$provided" | grep -qx "$p"; then
        missing="$missing $p"
    fi
done

if [ -n "$missing" ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    echo "install-deps: installing:$missing" >&2
    $SUDO apt-get update -q
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -q --no-install-recommends $missing
else
    echo "install-deps: all packages present" >&2
fi
