"""Process-wide gRPC settings that must be in place before gRPC is first imported.

gRPC's C core reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is imported. Its EventEngine
client and listener add thread hand-offs to every call; on the 2-core machines kvpool was
measured on, turning them off (back to the classic poller, which is what gRPC used for years)
made a unary round trip between two processes much shorter, and every kvpool call is such a
round trip (docs/benchmarks.md has the figures). So kvpool's own processes (the ``kvpool``
command) set that default, and ``kvpool.tune_grpc()`` lets another program opt in; importing
kvpool sets nothing. It applies unless ``GRPC_EXPERIMENTS`` is already set (set it, even to
an empty string, to keep gRPC's own defaults), or gRPC was imported first (then it is too
late, and nothing changes), or the installed grpcio is one this was not measured with (the
experiments come and go between releases).
"""

from __future__ import annotations

import os
import re
import sys
from importlib.util import find_spec
from pathlib import Path

EXPERIMENTS = "-event_engine_client,-event_engine_listener"
#: grpcio releases whose experiments include both names (measured on 1.85).
MEASURED = ((1, 80), (1, 89))


def apply() -> bool:
    """Sets the default where it can take effect; returns whether it did."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules:
        return False
    version = grpcio_version()
    if version is None or not MEASURED[0] <= version <= MEASURED[1]:
        return False
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return True


def grpcio_version() -> tuple[int, int] | None:
    """(major, minor) of the installed grpcio, from the name of its ``.dist-info`` (or
    ``.egg-info``) folder beside the ``grpc`` package, without importing it.
    (``importlib.metadata`` would say the same, but importing it costs every ``kvpool``
    command a noticeable share of its run time.)"""
    try:
        spec = find_spec("grpc")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    for info in Path(spec.origin).parent.parent.glob("grpcio-*-info"):
        found = re.fullmatch(r"grpcio-(\d+)\.(\d+)\b.*\.(dist|egg)-info", info.name)
        if found:
            return int(found[1]), int(found[2])
    return None
