#!/usr/bin/env bash
# The full fuzzing run (tests/fuzz, docs/reliability.md): CASES generated cases per surface
# (default 10000) against real processes, then each surface's figures, one JSON line each.
# The test suite runs a short slice of the same fuzzers (KVPOOL_FUZZ_CASES unset: 300).
# Extra arguments go to pytest (e.g. scripts/fuzz.sh 2000 -k lane).
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-10000}"
shift || true
report="$(mktemp --suffix .jsonl)"
status=0
KVPOOL_FUZZ_CASES="$cases" KVPOOL_FUZZ_REPORT="$report" \
    .venv/bin/python -m pytest tests/fuzz -q --timeout 3600 --hypothesis-show-statistics "$@" \
    || status=$?
echo "== figures (cases per surface: $cases) =="
cat "$report"
rm -f "$report"
exit "$status"
