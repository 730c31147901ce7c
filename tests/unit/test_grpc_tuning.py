"""kvpool's own processes turn off gRPC's EventEngine client and listener (a much shorter
round trip on small machines), unless the user chose otherwise or gRPC is already loaded;
importing kvpool into another program changes nothing in it, and ``kvpool.tune_grpc()``
opts in."""

from __future__ import annotations

import os
import subprocess
import sys

from kvpool.common.grpc_tuning import EXPERIMENTS

SHOW = "import os; print(repr(os.environ.get('GRPC_EXPERIMENTS')))"


def _run(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environment.update(env)
    result = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def test_importing_kvpool_changes_nothing_in_the_importing_process():
    code = (
        "import os, sys; before = dict(os.environ); import kvpool; kvpool.Client; "
        "assert dict(os.environ) == before, 'environment changed'; "
        "assert 'torch' not in sys.modules, 'torch imported'; print('clean')"
    )
    assert _run(code) == "clean"


def test_the_kvpool_command_sets_the_default_before_grpc_loads():
    code = f"import kvpool.cli.main, sys; assert 'grpc' not in sys.modules; {SHOW}"
    assert _run(code) == repr(EXPERIMENTS)


def test_a_program_opts_in_with_tune_grpc():
    assert _run(f"import kvpool; assert kvpool.tune_grpc(); {SHOW}") == repr(EXPERIMENTS)


def test_a_users_own_setting_wins_even_an_empty_one():
    assert _run(f"import kvpool; kvpool.tune_grpc(); {SHOW}", GRPC_EXPERIMENTS="") == repr("")
    assert _run(f"import kvpool; kvpool.tune_grpc(); {SHOW}", GRPC_EXPERIMENTS="-x") == "'-x'"


def test_nothing_changes_when_grpc_was_imported_first():
    """Too late then: gRPC read its settings when it was imported."""
    assert _run(f"import grpc, kvpool; kvpool.tune_grpc(); {SHOW}") == "None"
