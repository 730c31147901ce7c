"""Where the master is: ``--master HOST:PORT`` or ``$KVPOOL_MASTER``."""

from __future__ import annotations

import os

ENV_VAR = "KVPOOL_MASTER"


def resolve_master(explicit: str | None) -> str:
    """The master address to dial; ValueError says how to give one when none is set."""
    address = explicit or os.environ.get(ENV_VAR, "")
    address = address.strip()
    if not address:
        raise ValueError(
            f"no master address: pass --master HOST:PORT (or master='HOST:PORT' in Python) "
            f"or set {ENV_VAR}=HOST:PORT"
        )
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"master address {address!r} is not HOST:PORT (e.g. 127.0.0.1:50051)")
    return address
