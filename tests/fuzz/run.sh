#!/bin/sh
# tests/fuzz/run.sh BUILD_DIR SECONDS [JOBS] [KEEP_DIR]
#
# Runs every libFuzzer harness built in BUILD_DIR/fuzz (cmake
# -DTANGRAM_FUZZ=ON, target `fuzz`) for SECONDS each, JOBS at a time
# (default 2), each over a scratch copy of its seed corpus
# tests/fuzz/corpus/<name> (the checked-in seeds are never modified), with
# a memory limit (-rss_limit_mb=2048) and a per-input time limit
# (-timeout=10: a slower input is reported as a hang). Prints one line per
# harness: executions, edges covered (cov), features (ft), the corpus it
# grew to, and ok or FAILED with the reproducer file libFuzzer wrote
# (crash-, leak-, timeout- or oom-). Exits 1 when any harness failed.
# With KEEP_DIR the grown corpora, logs and reproducers are kept there
# (KEEP_DIR/<name>/); otherwise they go to a temporary folder that is
# removed unless something failed.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [JOBS] [KEEP_DIR]}
SECS=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [JOBS] [KEEP_DIR]}
JOBS=${3:-2}
KEEP=${4:-}
if [ -n "$KEEP" ]; then
    WORK=$KEEP
    mkdir -p "$WORK"
else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/tangram-fuzz.XXXXXX")
fi
# Leak checks per input; UBSan reports are fatal (-fno-sanitize-recover)
# and print a stack.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

names=""
for f in tests/fuzz/fuzz_*.c; do
    n=$(basename "$f" .c)
    n=${n#fuzz_}
    if [ ! -x "$BUILD/fuzz/fuzz_$n" ]; then
        echo "fuzz: $BUILD/fuzz/fuzz_$n is not built (cmake --build $BUILD --target fuzz)" >&2
        exit 1
    fi
    names="$names $n"
done

# run_one NAME: fuzzes NAME into $WORK/NAME; writes its exit status there.
run_one() {
    n=$1
    d=$WORK/$n
    rm -rf "$d/corpus"
    mkdir -p "$d/corpus"
    cp tests/fuzz/corpus/"$n"/* "$d/corpus/"
    rc=0
    "$BUILD/fuzz/fuzz_$n" -max_total_time="$SECS" -rss_limit_mb=2048 \
        -timeout=10 -print_final_stats=1 -artifact_prefix="$d/" \
        "$d/corpus" >"$d/log" 2>&1 || rc=$?
    echo "$rc" >"$d/rc"
}

# summary NAME: the one-line result of NAME.
summary() {
    n=$1
    d=$WORK/$n
    rc=$(cat "$d/rc")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$d/log" | tail -n 1)
    last=$(grep -E '^#[0-9]+[[:space:]]+(DONE|INITED|NEW|REDUCE|pulse)' "$d/log" | tail -n 1)
    cov=$(printf '%s\n' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(printf '%s\n' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(printf '%s\n' "$last" | sed -n 's/.* corp: \([^ ]*\).*/\1/p')
    if [ "$rc" = 0 ]; then
        result=ok
    else
        repro=$(ls "$d"/crash-* "$d"/leak-* "$d"/timeout-* "$d"/oom-* \
            2>/dev/null | head -n 1)
        result="FAILED (exit $rc) reproducer: ${repro:-none written, see $d/log}"
    fi
    printf 'fuzz: %-12s %10s execs  cov %5s  ft %6s  corpus %-12s %s\n' \
        "$n" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
    [ "$rc" = 0 ]
}

set -- $names
while [ $# -gt 0 ]; do
    i=0
    while [ $# -gt 0 ] && [ $i -lt "$JOBS" ]; do
        run_one "$1" &
        shift
        i=$((i + 1))
    done
    wait
done

failed=0
for n in $names; do
    summary "$n" || failed=1
done
if [ $failed -ne 0 ]; then
    echo "fuzz: FAILED; logs and reproducers in $WORK" >&2
    for n in $names; do
        if [ "$(cat "$WORK/$n/rc")" != 0 ]; then
            echo "---- $WORK/$n/log (tail)" >&2
            tail -n 40 "$WORK/$n/log" >&2
        fi
    done
    exit 1
fi
[ -n "$KEEP" ] || rm -rf "$WORK"
