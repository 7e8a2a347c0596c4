#!/bin/sh
# Checks that the C and CUDA lines a change touched follow .clang-format.
#
#   sh deploy/check-format.sh [BASE]
#
# BASE (default HEAD^1, the first parent: what the last commit or merge
# changed) is compared with the working tree; only the lines that differ
# are checked (git clang-format), never the rest of a file, since the tree
# as a whole is not formatted. Generated and third-party sources are
# skipped (SKIP below). In a shallow clone without HEAD's parent and no
# BASE given it says that nothing was checked and passes. Fails naming
# each file whose changed lines differ from clang-format's output and
# printing that diff; also fails, saying why, without clang-format,
# outside a git checkout, or when a BASE given does not exist. Apply the fix with
# `git clang-format BASE` (it rewrites only the changed lines). A file moved
# with git mv is checked only on the lines changed after the move.
set -eu
cd "$(dirname "$0")/.."

# Paths that are generated or copied from elsewhere: never checked.
SKIP='(^|/)(build[^/]*|third_party|vendor)/|\.pb-c\.[ch]$'
EXTS='c,h,cu,cuh'

if ! command -v clang-format >/dev/null 2>&1 ||
    ! command -v git-clang-format >/dev/null 2>&1; then
    echo "check-format: clang-format and git-clang-format not found" \
        "(Debian package clang-format; deploy/install-deps.sh installs it)" >&2
    exit 1
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "check-format: $(pwd) is not a git checkout: there is no change" \
        "to check (clone the repository, or run clang-format by hand)" >&2
    exit 1
fi
base=${1:-HEAD^1}
if [ $# -eq 0 ] && ! git rev-parse -q --verify "$base^{commit}" >/dev/null &&
    [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    # A clone of depth 1 (what many CI systems make) has no parent to
    # compare with, so no line is known to be changed: say so loudly
    # rather than fail every such run or check the whole unformatted tree.
    echo "check-format: NOT CHECKED: a shallow clone without HEAD's" \
        "parent; run 'git fetch --deepen=1' or pass BASE to check" >&2
    exit 0
fi
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
    echo "check-format: no commit '$base' to compare with (a shallow" \
        "clone without the parent? fetch it, or pass BASE)" >&2
    exit 1
fi

files=$(git diff --name-only --diff-filter=ACMR "$base" -- \
    '*.c' '*.h' '*.cu' '*.cuh' | grep -Ev "$SKIP" || true)
if [ -z "$files" ]; then
    echo "check-format: no C or CUDA change since $base"
    exit 0
fi

out=$(mktemp)
idx=$(mktemp)
trap 'rm -f "$out" "$idx"' EXIT
# A file moved (git mv) is not a changed file: git clang-format compares
# paths, so a moved file would count as new, every line of it changed.
# Compare with BASE's tree in which each renamed file already stands at its
# new path (an unreferenced commit object, never a branch), so only the
# lines a change touched in a moved file are checked.
renames=$(git diff -M --name-status --diff-filter=R "$base" -- \
    '*.c' '*.h' '*.cu' '*.cuh' | cut -f2,3)
shown=$base
if [ -n "$renames" ]; then
    rm -f "$idx"
    GIT_INDEX_FILE=$idx git read-tree "$base"
    echo "$renames" | while IFS="$(printf '\t')" read -r old new; do
        mode=$(git ls-tree "$base" -- "$old" | cut -d' ' -f1)
        GIT_INDEX_FILE=$idx git update-index --add \
            --cacheinfo "$mode,$(git rev-parse "$base:$old"),$new"
        GIT_INDEX_FILE=$idx git update-index --force-remove -- "$old"
    done
    base=$(echo "check-format: $base with its renames" |
        git commit-tree "$(GIT_INDEX_FILE=$idx git write-tree)" -p "$base")
fi
# git clang-format 14 exits 0 whether or not it found something: its
# output decides (a diff, or "did not modify" / "no modified files").
rc=0
# shellcheck disable=SC2086
GIT_PAGER=cat git -c color.ui=never clang-format --diff \
    --extensions "$EXTS" "$base" -- $files >"$out" 2>&1 || rc=$?
bad=$(sed -n 's|^+++ b/||p' "$out")
if [ -z "$bad" ]; then
    if [ "$rc" -ne 0 ] || ! grep -Eq '^(clang-format did not modify any files|no modified files to format)$' "$out"; then
        echo "check-format: git clang-format failed (exit $rc):" >&2
        cat "$out" >&2
        exit 1
    fi
    echo "check-format: the changed lines since $shown follow .clang-format" \
        "($(echo "$files" | wc -l) files)"
    exit 0
fi
echo "check-format: changed lines since $shown differ from .clang-format in:" >&2
echo "$bad" | sed 's/^/    /' >&2
echo "check-format: the fix (apply with: git clang-format $base):" >&2
cat "$out" >&2
exit 1
