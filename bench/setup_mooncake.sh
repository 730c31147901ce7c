#!/usr/bin/env bash
# Installs what `kvpool bench --compare` needs besides kvpool itself, none of it a kvpool
# dependency:
#   .venv-mooncake/  Mooncake Store (non-CUDA wheel) in its own virtualenv: its processes run
#                    there, never inside kvpool's interpreter. Its Python dependencies
#                    (aiohttp, requests, msgpack) would not clash with .venv's, but it bundles
#                    its own native libraries and console scripts, and LMCache in .venv ships
#                    Mooncake connectors that import it when it is there: kept apart, .venv
#                    stays what CI installs
#   .venv            matplotlib (the plot) and py-spy (profiles), bench-time only
#   libibverbs1      a shared library Mooncake's transfer engine links against, even for TCP
# Idempotent: a second run only checks. Run as root (apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

MOONCAKE_PACKAGE="${MOONCAKE_PACKAGE:-mooncake-transfer-engine-non-cuda==0.3.13.post1}"
PYTHON="${PYTHON:-python3}"

if ! ldconfig -p | grep -q 'libibverbs\.so\.1'; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null
fi

if [ ! -x .venv-mooncake/bin/python ]; then
    "$PYTHON" -m venv .venv-mooncake
    .venv-mooncake/bin/python -m pip install --quiet --upgrade pip
fi
.venv-mooncake/bin/python -m pip install --quiet "$MOONCAKE_PACKAGE" numpy
.venv-mooncake/bin/python -c 'from mooncake.store import MooncakeDistributedStore'

if [ ! -x .venv/bin/python ]; then
    echo "kvpool's .venv is missing: run scripts/test.sh (or scripts/demo.sh) first" >&2
    exit 1
fi
.venv/bin/python -m pip install --quiet matplotlib py-spy

version=$(.venv-mooncake/bin/python -m pip show mooncake-transfer-engine-non-cuda 2>/dev/null | awk '/^Version:/{print $2}')
echo "ready: Mooncake ${version} in .venv-mooncake; matplotlib and py-spy in .venv"
