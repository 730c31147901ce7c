"""Whether an address is this host's loopback: what may run without credentials."""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; False for everything else, the wildcard
    addresses (0.0.0.0, ::, "") included: they listen on every interface."""
    host = host.strip().strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
