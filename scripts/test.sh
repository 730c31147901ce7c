#!/usr/bin/env bash
# Installs kvpool and its test dependencies into .venv, checks style and types, and runs the
# test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
bash scripts/install_lmcache.sh  # lmcache 0.5.6 needs --no-deps, which an extra cannot say
bash scripts/install_vllm.sh  # vLLM in its own .venv-vllm (its pins clash with LMCache's)
bash scripts/install_sglang.sh  # sglang 0.5.23 likewise (its requirements are CUDA builds)
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python scripts/typecheck.py  # mypy, configured by [tool.mypy] in pyproject.toml
# The suite writes segment files under TMPDIR (an NVMe segment is reserved on disk whole; one
# test fills 3 GiB of a sparse one): say so at once, not with ENOSPC minutes into the run.
.venv/bin/python - <<'PY'
import shutil, sys, tempfile
NEEDED = 6 << 30
where = tempfile.gettempdir()
free = shutil.disk_usage(where).free
if free < NEEDED:
    sys.exit(f"error: the tests write up to about {NEEDED >> 30} GiB under {where}, which has "
             f"{free / 2**30:.1f} GiB free: free some space there, or set TMPDIR to a folder "
             "on a disk with room")
PY
# One string-hash seed for the run, printed, so that a failure that depends on the order of
# a set or dict of strings (the model test's, say) replays with it.
export PYTHONHASHSEED=${PYTHONHASHSEED:-$((RANDOM % 4096 + 1))}
echo "PYTHONHASHSEED=$PYTHONHASHSEED"
for arg in "$@"; do
    case "$arg" in -*) ;; *) exec .venv/bin/python -m pytest "$@" ;; esac  # paths: just those
done
# The chaos slice first, in a pytest process of its own: it makes and removes network devices,
# and UCX in a process that lived through that (or through the benchmarks' namespaces) can
# fail to start later. Both runs must pass.
.venv/bin/python -m pytest tests/chaos "$@"
# The rest on two workers (KVPOOL_TEST_WORKERS), a test file each at a time: most tests wait
# on processes, timeouts and sockets more than they compute, so two share the 2 cores well.
exec .venv/bin/python -m pytest -n "${KVPOOL_TEST_WORKERS:-2}" --dist loadfile \
    --ignore=tests/chaos "$@"
