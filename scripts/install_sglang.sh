#!/usr/bin/env bash
# Installs kvpool's optional SGLang integration (the `sglang` extra) into .venv, so that
# kvpool.sglang and its tests run against SGLang's own HiCache storage interface and backend
# factory on a machine without a GPU.
#
# sglang 0.5.23 must be installed with --no-deps (its requirements are CUDA builds: flashinfer,
# sglang-kernel, torch 2.14 with CUDA, ...), which pip cannot express through an extra; so this
# script installs sglang itself and then the extra's modules from pyproject.toml: what
# `sglang.srt.mem_cache.storage.backend_factory` and `sglang.srt.mem_cache.hicache_storage`
# import, through `sglang/__init__.py` (triton included: sglang.srt.utils imports it at the
# top, as every SGLang install has it). SGLang's host KV pools are not importable without a
# CUDA build of torchvision, so they are not installed for. Idempotent: when everything is
# already there it installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || python3 -m venv .venv
SGLANG_VERSION=0.5.23

mapfile -t EXTRA < <("$PY" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["sglang"]))
')

if "$PY" - "$SGLANG_VERSION" "${EXTRA[@]}" <<'PYCODE'; then
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

try:
    if md.version("sglang") != sys.argv[1]:
        sys.exit(1)
    for line in sys.argv[2:]:
        requirement = Requirement(line)
        if not requirement.specifier.contains(md.version(requirement.name), prereleases=True):
            sys.exit(1)
except (md.PackageNotFoundError, ImportError):
    sys.exit(1)
PYCODE
    echo "sglang integration already installed"
    exit 0
fi
"$PY" -m pip install --quiet "${EXTRA[@]}"
"$PY" -m pip install --quiet --no-deps "sglang==$SGLANG_VERSION"
"$PY" -c "import sglang.srt.mem_cache.storage.backend_factory" \
    || { echo "sglang installed but its storage backend factory does not import" >&2; exit 1; }
echo "sglang integration installed"
