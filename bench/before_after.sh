#!/usr/bin/env bash
# `kvpool bench --compare` of another checkout (before) against this one (after), alternating
# which goes first, one run each per round; then the table (bench/before_after.py).
#
#   bench/before_after.sh BEFORE_TREE [ROUNDS=12] [OUT=bench/results/before_after]
#       [-- extra arguments for this checkout's bench, e.g. --security insecure]
#
# WORKLOADS and PLACEMENTS in the environment narrow both sides alike (default: every
# workload, both placements), e.g. WORKLOADS=32x4KiB,exists PLACEMENTS=same-host. RUNS (default
# 1) measured runs per invocation, each side's figure their median: the first run after the
# warm-up carries what fresh clients still do in the background (docs/benchmarks.md).
#
# BEFORE_TREE is a checkout with its own .venv (git worktree add DIR COMMIT; then
# python3 -m venv DIR/.venv && DIR/.venv/bin/pip install -e DIR). Run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=$1
ROUNDS=${2:-12}
OUT=${3:-bench/results/before_after}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
WORKLOADS=${WORKLOADS:-32MiB,4MiB,32x1MiB,32x4KiB,exists,4x4MiB}
PLACEMENTS=${PLACEMENTS:-same-host,netns}
RUNS=${RUNS:-1}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
bench() {  # side round
    local tree=. extra=("$@")
    [ "$1" = before ] && tree=$BEFORE && extra=()
    [ "$1" = after ] && extra=("${@:3}")
    (cd "$tree" && .venv/bin/kvpool bench --compare --systems kvpool --runs "$RUNS" --no-ceilings \
        --workloads "$WORKLOADS" --placements "$PLACEMENTS" --json "$OUT/$1-$2.json" --out-dir "$OUT/$1-$2" \
        "${extra[@]}" >"$OUT/$1-$2.log" 2>&1)
    echo "$(date +%T) $1 round $2 done"
}
for i in $(seq 1 "$ROUNDS"); do
    if (( i % 2 )); then bench before "$i"; bench after "$i" "$@"
    else bench after "$i" "$@"; bench before "$i"; fi
done
.venv/bin/python -m bench.before_after "$OUT"
