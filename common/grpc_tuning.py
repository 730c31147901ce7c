"""Process-wide gRPC settings that must be in place before gRPC is first imported.

gRPC's C core reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is imported. Its EventEngine
client and listener add thread hand-offs to every call; on the 2-core machines kvpool was
measured on, turning them off (back to the classic poller, which is what gRPC used for years)
made a unary round trip between two processes much shorter, and every kvpool call is such a
round trip (docs/benchmarks.md has the figures). So importing kvpool sets that default,
unless ``GRPC_EXPERIMENTS`` is already set (set it, even to an empty string, to keep gRPC's
own defaults), or gRPC was imported before kvpool (then it is too late, and nothing changes),
or the installed grpcio is one this was not measured with (the experiments come and go
between releases).
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

EXPERIMENTS = "-event_engine_client,-event_engine_listener"
#: grpcio releases whose experiments include both names (measured on 1.85).
MEASURED = ((1, 80), (1, 89))


def apply() -> bool:
    """Sets the default where it can take effect; returns whether it did."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules:
        return False
    try:
        major, minor = (int(part) for part in metadata.version("grpcio").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    if not MEASURED[0] <= (major, minor) <= MEASURED[1]:
        return False
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return True
