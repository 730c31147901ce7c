"""The switch between the suite's network namespaces: a process that forwards IP packets
between TUN devices, one per site, and applies ``links.Links`` to each.

``python -m bench.chaos.switch CONFIG`` (JSON: ``sites`` name -> IPv4 address, ``devices``
name -> TUN device name, ``seed``) opens one TUN device per site in the namespace it runs in
and prints ``{"ready": true}``; whoever started it moves each device into its site's
namespace (the open file keeps it attached). Then it reads commands, one JSON object a line
on stdin, and answers each with one line on stdout:

- ``{"op": "add", "id": ID, "pairs": [[SRC, DST], ...], "impairment": {...}}``
- ``{"op": "remove", "id": ID}``, ``{"op": "clear"}``, ``{"op": "stats"}``

The devices are not persistent: they vanish when the switch exits, however it exits. A
userspace switch instead of veth pairs and ``tc netem``: see ``links.py`` for why.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import selectors
import socket
import struct
import sys
import time

from bench.chaos.links import Impairment, Links

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MTU = 65000
#: Packets read from one device before the others get their turn.
BURST = 64


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


class Switch:
    def __init__(self, sites: dict[str, str], devices: dict[str, str], seed: int) -> None:
        self.links = Links(seed)
        self.site_of_ip = {socket.inet_aton(ip): name for name, ip in sites.items()}
        self.fd_of_site = {name: open_tun(devices[name]) for name in sites}
        self.site_of_fd = {fd: name for name, fd in self.fd_of_site.items()}
        self.pending: list[tuple[float, int, int, bytes]] = []  # (due, seq, fd, packet)
        self.seq = 0
        self.full = 0  # packets a device's queue had no room for

    def handle(self, source: str, packet: bytes, now: float) -> None:
        if len(packet) < 20 or packet[0] >> 4 != 4:
            return  # only IPv4 travels here
        target = self.site_of_ip.get(packet[16:20])
        if target is None:
            return
        out = self.fd_of_site[target]
        for due in self.links.fate(source, target, len(packet), now):
            if due <= now:
                self.write(out, packet)
            else:
                self.seq += 1
                heapq.heappush(self.pending, (due, self.seq, out, packet))

    def write(self, fd: int, packet: bytes) -> None:
        try:
            os.write(fd, packet)
        except (BlockingIOError, OSError):
            self.full += 1

    def flush_due(self, now: float) -> None:
        while self.pending and self.pending[0][0] <= now:
            _, _, fd, packet = heapq.heappop(self.pending)
            self.write(fd, packet)

    def command(self, line: str) -> dict:
        request = json.loads(line)
        op = request.get("op")
        if op == "add":
            pairs = [(a, b) for a, b in request["pairs"]]
            self.links.add(request["id"], pairs, Impairment.from_dict(request["impairment"]))
        elif op == "remove":
            self.links.remove(request["id"])
        elif op == "clear":
            self.links.clear()
        elif op == "stats":
            c = self.links.counters
            return {
                "ok": True,
                "delivered": c.delivered,
                "dropped": c.dropped,
                "duplicated": c.duplicated,
                "delayed": c.delayed,
                "queue_full": self.full,
                "layers": sorted({i for by_id in self.links.layers.values() for i in by_id}),
            }
        else:
            return {"ok": False, "error": f"unknown op {op!r}"}
        return {"ok": True}

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        for fd in self.site_of_fd:
            selector.register(fd, selectors.EVENT_READ)
        stdin = sys.stdin.fileno()
        os.set_blocking(stdin, False)
        selector.register(stdin, selectors.EVENT_READ)
        buffered = b""
        while True:
            now = time.monotonic()
            timeout = max(0.0, self.pending[0][0] - now) if self.pending else 1.0
            for key, _ in selector.select(timeout):
                fd = key.fd
                if fd == stdin:
                    chunk = os.read(stdin, 65536)
                    if not chunk:
                        return  # whoever started us is gone: the devices go with us
                    buffered += chunk
                    while b"\n" in buffered:
                        line, buffered = buffered.split(b"\n", 1)
                        answer = self.command(line.decode())
                        sys.stdout.write(json.dumps(answer) + "\n")
                        sys.stdout.flush()
                    continue
                source = self.site_of_fd[fd]
                for _ in range(BURST):
                    try:
                        packet = os.read(fd, MTU + 64)
                    except BlockingIOError:
                        break
                    except OSError:  # its namespace was deleted: the run is ending
                        selector.unregister(fd)
                        break
                    self.handle(source, packet, time.monotonic())
            self.flush_due(time.monotonic())


def main() -> int:
    config = json.loads(sys.argv[1])
    switch = Switch(config["sites"], config["devices"], config.get("seed", 0))
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    switch.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
