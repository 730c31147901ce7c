#!/usr/bin/env bash
# The chaos suite's long run (docs/reliability.md, "Chaos"): a cluster in network namespaces
# under load, rounds of faults drawn from the seed, then the verdict. Needs root.
#   scripts/chaos.sh                       # 30 minutes, seed 1
#   scripts/chaos.sh --minutes 10 --seed 7 --json verdict.json
# The same seed replays the same schedule. Exits 1 if the checker found a problem.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    echo "no .venv: run ./scripts/test.sh (or pip install -e '.[test]') first" >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then
    echo "the chaos suite needs root (network namespaces, a loop device, signals to its processes)" >&2
    exit 2
fi
PYTHONPATH=. exec .venv/bin/python -m bench.chaos "$@"
