"""The installed package is the library alone: the benchmark harness (bench/) and the chaos
driver stay in the source checkout, and ``kvpool bench`` finds them there or says where they are.

No wheel is built: setuptools' own ``build_py`` lists the files a wheel would hold.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kvpool.cli import client_commands
from kvpool.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _under_bench(path: str | Path) -> bool:
    return (ROOT / path).resolve().is_relative_to(BENCH)


def test_pyproject_lists_no_benchmark_package():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = setuptools["packages"]
    assert "kvpool" in packages
    assert not [p for p in packages if "bench" in p.split(".")]
    assert not [d for d in setuptools["package-dir"].values() if _under_bench(d)]


def test_the_wheel_would_hold_no_file_of_the_harness(monkeypatch: pytest.MonkeyPatch):
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # package-dir is relative to the project root
    dist = Distribution({"script_name": "setup.py"})
    apply_configuration(dist, ROOT / "pyproject.toml")
    build_py = dist.get_command_obj("build_py")
    build_py.ensure_finalized()
    modules = [path for _, _, path in build_py.find_all_modules()]
    data = [Path(src, name) for _, src, _, names in build_py.data_files for name in names]
    assert "kvpool/cli/main.py" in modules  # the listing is the real one
    assert not [path for path in [*modules, *data] if _under_bench(path)]


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter of this environment, outside the checkout (so that
    only what is installed can be imported)."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_the_installed_kvpool_has_no_bench_module(tmp_path: Path):
    done = _python("import kvpool, kvpool.bench", tmp_path)
    assert done.returncode != 0
    assert "ModuleNotFoundError: No module named 'kvpool.bench'" in done.stderr, done.stderr


def test_kvpool_help_does_not_import_the_harness(tmp_path: Path):
    code = (
        "import sys\n"
        "from kvpool.cli.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "loaded = sorted(m for m in sys.modules if m == 'bench' or m.startswith('bench.'))\n"
        "assert not loaded, loaded\n"
    )
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "bench" in done.stdout


def test_kvpool_bench_runs_the_harness_of_the_checkout(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kvpool bench")
    assert "--compare" in out and "--metadata" in out


def test_kvpool_bench_without_a_checkout_says_where_the_harness_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setattr(client_commands, "_checkout", lambda: tmp_path)  # like site-packages
    assert main(["bench", "--sizes", "1MiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "source checkout" in err and "python -m bench.throughput" in err
    assert main(["bench", "--help"]) == 0
    assert "python -m bench.throughput" in capsys.readouterr().out


def test_other_commands_still_refuse_unknown_arguments(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_:
        main(["stat", "key", "--bogus"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
