"""Importing kvpool turns off gRPC's EventEngine client and listener (half the round trip on
small machines), unless the user chose otherwise or gRPC is already loaded."""

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


def test_importing_kvpool_sets_the_default_before_grpc_loads():
    assert _run(f"import kvpool, sys; assert 'grpc' not in sys.modules; {SHOW}") == repr(
        EXPERIMENTS
    )


def test_a_users_own_setting_wins_even_an_empty_one():
    assert _run(f"import kvpool; {SHOW}", GRPC_EXPERIMENTS="") == repr("")
    assert _run(f"import kvpool; {SHOW}", GRPC_EXPERIMENTS="-x") == repr("-x")


def test_nothing_changes_when_grpc_was_imported_first():
    """Too late then: gRPC read its settings when it was imported."""
    assert _run(f"import grpc, kvpool; {SHOW}") == "None"
