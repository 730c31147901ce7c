"""Where the benchmark's processes run: one host, or two network namespaces joined by a veth.

A ``Placement`` says on which address servers listen and clients live, and which argv prefix
starts a process on each side. ``same_host()`` is plain loopback. ``veth_pair()`` creates two
namespaces (``kvpool-a-PID`` with 10.77.0.1, ``kvpool-b-PID`` with 10.77.0.2) joined by a veth
pair, and removes them on exit. ``ip netns exec`` shares the pid, mount and IPC namespaces, so
shared-memory transports could still cross it: a netns placement is ``tcp_only`` and its users
must force TCP themselves. Needs root.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SERVER_IP = "10.77.0.1"
CLIENT_IP = "10.77.0.2"
NAMESPACE_PREFIX = "kvpool-"


@dataclass(frozen=True)
class Placement:
    name: str
    server_ip: str  # storage node, masters and stores listen here
    client_ip: str  # clients run with this address
    server_prefix: tuple[str, ...] = ()  # argv prefix of a server-side process
    client_prefix: tuple[str, ...] = ()  # argv prefix of a client-side process
    tcp_only: bool = False
    description: str = ""


def same_host() -> Placement:
    return Placement(
        "same-host",
        "127.0.0.1",
        "127.0.0.1",
        description="client and storage in two processes on one host, loopback",
    )


@contextmanager
def veth_pair(mtu: int = 1500) -> Iterator[Placement]:
    """Two fresh network namespaces joined by a veth pair; removed on exit."""
    _remove_stale()
    pid = os.getpid()
    server_ns, client_ns = f"{NAMESPACE_PREFIX}a-{pid}", f"{NAMESPACE_PREFIX}b-{pid}"
    server_if, client_if = f"kvpa{pid}"[:15], f"kvpb{pid}"[:15]
    try:
        _ip("netns", "add", server_ns)
        _ip("netns", "add", client_ns)
        _ip("link", "add", server_if, "type", "veth", "peer", "name", client_if)
        for ns, interface, address in (
            (server_ns, server_if, SERVER_IP),
            (client_ns, client_if, CLIENT_IP),
        ):
            _ip("link", "set", interface, "netns", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", interface, "mtu", str(mtu))
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", interface)
            _ip("-n", ns, "link", "set", interface, "up")
        yield Placement(
            "netns",
            SERVER_IP,
            CLIENT_IP,
            ("ip", "netns", "exec", server_ns),
            ("ip", "netns", "exec", client_ns),
            tcp_only=True,
            description=f"client and storage in two network namespaces, veth (MTU {mtu}), TCP",
        )
    finally:
        for ns in (server_ns, client_ns):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()} (needs root)")


def _remove_stale() -> None:
    """Removes namespaces that an earlier, killed benchmark left behind."""
    for name in namespaces():
        owner = name.rsplit("-", 1)[-1]
        if name.startswith(NAMESPACE_PREFIX) and owner.isdigit() and not _alive(int(owner)):
            delete_namespace(name)


def namespaces() -> list[str]:
    """The names of this machine's named network namespaces."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in listing.stdout.splitlines() if line.strip()]


def delete_namespace(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


def remove_stale_owned(prefix: str) -> list[str]:
    """Deletes namespaces named ``PREFIX<pid>-...`` whose owner ``pid`` has exited (a run
    that was killed before it cleaned up); returns their names."""
    removed = []
    for name in namespaces():
        owner = name[len(prefix) :].split("-", 1)[0]
        if name.startswith(prefix) and owner.isdigit() and not _alive(int(owner)):
            delete_namespace(name)
            removed.append(name)
    return removed


def enter_prefix(namespace: str) -> tuple[str, ...]:
    """The argv prefix that runs a command in ``namespace``. ``ip netns exec`` gives it a
    mount namespace of its own with that network's ``/sys`` (UCX lists its devices in
    ``/sys/class/net``), a slave of ours, so file systems mounted or unmounted here later
    are seen there; it execs, so the pid is the command's."""
    return ("ip", "netns", "exec", namespace)


def ip(*args: str) -> None:
    """Runs ``ip ARGS``; raises with its message when it fails."""
    _ip(*args)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
