#!/usr/bin/env bash
# Installs kvpool's optional LMCache integration (the `lmcache` extra) into .venv.
#
# lmcache 0.5.6 must be installed with --no-deps (its own requirements pull CUDA builds that
# this project does not use), which pip cannot express through an extra; so this script
# installs lmcache itself and then the extra's modules from pyproject.toml (torch CPU build,
# what LMCache's L2-adapter path and its `lmcache server` command import). Idempotent: when
# everything is already there it installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || python3 -m venv .venv

mapfile -t EXTRA < <("$PY" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["lmcache"]))
')

if "$PY" - "${EXTRA[@]}" <<'PYCODE'; then
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

try:
    if md.version("lmcache") != "0.5.6":
        sys.exit(1)
    for line in sys.argv[1:]:
        requirement = Requirement(line)
        if not requirement.specifier.contains(md.version(requirement.name), prereleases=True):
            sys.exit(1)
except (md.PackageNotFoundError, ImportError):
    sys.exit(1)
PYCODE
    echo "lmcache integration already installed"
    exit 0
fi
"$PY" -m pip install --quiet "${EXTRA[@]}"
"$PY" -m pip install --quiet --no-deps "lmcache==0.5.6"
echo "lmcache integration installed"
