"""kvpool's own processes turn off gRPC's EventEngine client and listener (a much shorter
round trip on small machines), unless the user chose otherwise or gRPC is already loaded;
importing kvpool into another program changes nothing in it, and ``kvpool.tune_grpc()``
opts in. The master's gRPC connections are capped within its descriptor limit.

(The master's bounds at work: tests/integration/test_grpc_connections.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

from kvpool.common.grpc_tuning import EXPERIMENTS, MIN_CONNECTIONS, RESERVED_DESCRIPTORS

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


CAP = (
    "import resource; from kvpool.common.grpc_tuning import connection_cap; "
    "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, hard)); print(connection_cap({others}))"
)


def test_the_master_s_grpc_connections_leave_its_other_listeners_their_descriptors():
    """What the descriptor limit leaves once the lane's and the HTTP side door's connections
    (``others``) and a reserve are counted: gRPC connections alone never take the master to
    its limit. However little that is, a floor of them (a limit that low is the operator's
    to raise: the master says so as it starts)."""
    assert _run(CAP.format(limit=6000, others=4608)) == str(6000 - 4608 - RESERVED_DESCRIPTORS)
    assert _run(CAP.format(limit=1024, others=0)) == str(1024 - RESERVED_DESCRIPTORS)
    assert _run(CAP.format(limit=1024, others=4608)) == str(MIN_CONNECTIONS)


OPTIONS = (
    "from kvpool.common.grpc_tuning import server_connection_options\n"
    "try:\n    print(sorted(server_connection_options(0)))\n"
    "except ValueError as error:\n    print(error)"
)


def test_the_master_s_grpc_bounds_are_set_from_the_environment_and_nonsense_is_refused():
    assert _run(
        OPTIONS,
        KVPOOL_MASTER_GRPC_MAX_CONNECTIONS="40",
        KVPOOL_MASTER_GRPC_HANDSHAKE_TIMEOUT_MS="1500",
        KVPOOL_MASTER_GRPC_IDLE_MS="2500",
    ) == repr(
        [
            ("grpc.max_allowed_incoming_connections", 40),
            ("grpc.max_connection_idle_ms", 2500),
            ("grpc.server_handshake_timeout_ms", 1500),
        ]
    )
    refused = _run(OPTIONS, KVPOOL_MASTER_GRPC_HANDSHAKE_TIMEOUT_MS="10s")
    assert (
        refused
        == "KVPOOL_MASTER_GRPC_HANDSHAKE_TIMEOUT_MS must be a positive whole number, got '10s'"
    )
