"""Type-checks kvpool with mypy: ``.venv/bin/python scripts/typecheck.py [mypy options]``.

mypy cannot find kvpool's modules by itself: ``[tool.setuptools] package-dir`` in
pyproject.toml maps ``kvpool.common`` to ``common/``, ``kvpool.client`` to ``client/`` and so
on, and the editable install resolves those names with an import hook, which a static checker
does not run. So this script hands mypy every module of the packages pyproject.toml lists,
each file under its ``kvpool.*`` name (a ``.pyi`` stub in place of its ``.py``). Everything
else is ``[tool.mypy]`` there: the options, and the packages whose errors are not reported
yet. Exits as mypy does: 0 when there is no error.

This drives mypy through ``mypy.main`` (the only way to name a file's module), which is not a
stable API: the ``test`` extra pins mypy's version, and a new one is taken deliberately.
"""

from __future__ import annotations

import os
import sys
import time
import tomllib
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def folder_of(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools takes ``package`` from: its own package-dir entry, else its parent's
    folder (or the root's, ``""``) and its own name."""
    if package in package_dir:
        return ROOT / package_dir[package]
    parent, _, name = package.rpartition(".")
    if not parent:
        return ROOT / package_dir.get("", "") / name
    return folder_of(parent, package_dir) / name


def sources() -> list[BuildSource]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir = setuptools.get("package-dir", {})
    found: list[BuildSource] = []
    for package in setuptools["packages"]:
        modules: dict[str, Path] = {}
        for path in sorted(folder_of(package, package_dir).iterdir()):
            if path.suffix not in (".py", ".pyi") or not path.is_file():
                continue
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            if path.suffix == ".pyi" or module not in modules:
                modules[module] = path
        found += [BuildSource(str(p.relative_to(ROOT)), m) for m, p in modules.items()]
    return found


def main(argv: list[str]) -> int:
    os.chdir(ROOT)  # where mypy finds pyproject.toml, and reports paths from
    fscache = FileSystemCache()
    targets, options = process_options(argv, require_targets=False, fscache=fscache)
    if targets:
        sys.exit("typecheck: give options only; the modules are the packages pyproject.toml lists")
    checked = sources()
    _, messages, blockers = run_build(
        checked, options, fscache, time.time(), sys.stdout, sys.stderr
    )
    n_errors, n_notes, n_files = util.count_stats(messages)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    if n_errors:
        summary = formatter.format_error(
            n_errors, n_files, len(checked), blockers=blockers, use_color=options.color_output
        )
        print(summary)
    else:
        print(formatter.format_success(len(checked), options.color_output))
    if messages and n_notes < len(messages):
        return 2 if blockers else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
