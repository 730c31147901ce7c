"""Addresses to listen on and to advertise, IPv6 as well as IPv4: ``--host ::`` on an
IPv6-only pod network, ``--listen ::1``. An IPv6 address is written in brackets wherever a
port follows it (``[::1]:50051``), and bare where a socket takes it."""

from __future__ import annotations

import socket


def bare(host: str) -> str:
    """The host without the brackets an IPv6 address may be written in."""
    host = host.strip()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def family_of(host: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 address (a wildcard ``::`` listens on IPv4 too, where the host
    allows), else AF_INET (names resolve as IPv4, as ``socket.create_server`` does)."""
    return socket.AF_INET6 if ":" in bare(host) else socket.AF_INET


def listening_socket(host: str, port: int, backlog: int | None = None) -> socket.socket:
    """A TCP socket bound and listening on ``host`` (IPv4 or IPv6) and ``port``."""
    return socket.create_server((bare(host), port), family=family_of(host), backlog=backlog)


def host_port(host: str, port: int) -> str:
    """``HOST:PORT``, with an IPv6 host in brackets."""
    host = bare(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
