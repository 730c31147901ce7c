#!/usr/bin/env bash
# Installs kvpool into .venv, starts a local cluster (a master and two storage nodes as
# separate processes), runs a put/get workload against it and prints the throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/kvpool bench --nodes 2 --dram 1GiB "$@"
