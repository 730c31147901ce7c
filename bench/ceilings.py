"""``python -m bench.ceilings``: what this machine allows beneath any store.

For each placement of ``kvpool bench --compare`` (same-host; netns: two network namespaces
over a veth pair), between two bare processes:

- UCX one-sided put/get of 32 MiB with kvpool's own binding (TCP forced in netns, as there),
  with plain endpoints and with peer error handling (kvpool's force-closable endpoints);
- a kernel TCP stream: Python sockets, 32 MiB ``sendall``s;
- the round trip of a near-empty unary gRPC call: a grpc.aio server and a blocking client, the
  stack of kvpool's master and client; once with gRPC's defaults and once with the settings
  kvpool applies on import (kvpool.common.grpc_tuning);
- the round trip of a near-empty call over the metadata lane's framing: an asyncio server
  answering every frame at once and kvpool's blocking lane client (the floor of a call over
  kvpool's lane, before any handler);
- both round trips again as a secure kvpool makes them (``TLS + token``): TLS with a
  throwaway CA's certificate for the placement's addresses, served with kvpool's own server
  credentials and contexts (security/tls.py, rotation included), and a bearer token on every
  call (gRPC metadata; the lane's AUTH frame, once per connection). The servers echo and
  check nothing: what is measured is the transport's cost, next to the plain figure.

Run as root (namespaces); prints a table and writes bench/results/ceilings.json. Each role
below also runs as ``ceilings.py ROLE CONFIG_JSON`` in its own process; servers hand their
address to clients through a file in a temporary folder (namespaces share the file system).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvpool.common import grpc_tuning

HERE = Path(__file__).resolve().parent
SIZE = 32 * 1024 * 1024
REPEATS = 8


# ---------------------------------------------------------------- roles (each a process)


def _publish(config: dict, info: dict) -> None:
    tmp = Path(config["file"] + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(config["file"])


def _ucx_target(config: dict) -> None:
    import mmap

    from kvpool.transport import ucp

    context = ucp.Context({"TLS": "tcp"} if config["tcp_only"] else None)
    worker = context.create_worker()
    memory = mmap.mmap(-1, 2 * SIZE)
    memory.write(b"\1" * len(memory))  # faults every page in
    region = context.register(memory)
    progress = ucp.ProgressThread(worker)
    progress.start()
    _publish(
        config,
        {"worker": worker.address.hex(), "rkey": region.rkey.hex(), "base": region.address},
    )
    sys.stdin.read()  # until the orchestrator closes our stdin
    progress.stop()


def _ucx_initiator(config: dict) -> dict:
    import numpy as np

    from kvpool.transport import ucp

    target = json.loads(Path(config["file"]).read_text())
    context = ucp.Context({"TLS": "tcp"} if config["tcp_only"] else None)
    worker = context.create_worker()
    local = np.ones(SIZE, dtype=np.uint8)
    region = context.register(local)
    results: dict[str, list[float]] = {}
    for _ in range(2):  # alternate the two kinds of endpoint
        for peer_errors in (False, True):
            endpoint = worker.connect(bytes.fromhex(target["worker"]), peer_errors=peer_errors)
            rkey = endpoint.unpack_rkey(bytes.fromhex(target["rkey"]))
            kind = "peer errors" if peer_errors else "plain"
            for is_get in (False, True):
                elapsed = 0.0
                for i in range(REPEATS + 1):
                    op = ucp.Op(
                        endpoint, rkey, region.address, target["base"] + i % 2 * SIZE, SIZE,
                        region.memh,
                    )  # fmt: skip
                    start = time.perf_counter()
                    [status] = worker.transfer([op], is_get=is_get, timeout=60)
                    if status != ucp.UCS_OK:
                        raise RuntimeError(f"UCX transfer failed: {ucp.status_string(status)}")
                    if i:  # the first one connects
                        elapsed += time.perf_counter() - start
                name = f"UCX {'get' if is_get else 'put'}, {kind} endpoint"
                results.setdefault(name, []).append(REPEATS * SIZE / elapsed / 1e9)
            endpoint.close()
    return {name: max(values) for name, values in results.items()}


def _socket_server(config: dict) -> None:
    import socket

    with socket.socket() as server:
        server.bind((config["ip"], 0))
        server.listen(1)
        _publish(config, {"port": server.getsockname()[1]})
        connection, _ = server.accept()
        buffer = memoryview(bytearray(SIZE))
        with connection:
            while connection.recv_into(buffer):
                pass


def _socket_client(config: dict) -> dict:
    import socket

    port = json.loads(Path(config["file"]).read_text())["port"]
    data = bytes(SIZE)
    with socket.create_connection((config["ip"], port)) as connection:
        connection.sendall(data)  # warm
        start = time.perf_counter()
        for _ in range(REPEATS * 2):
            connection.sendall(data)
        elapsed = time.perf_counter() - start
    return {"TCP stream (Python sockets)": REPEATS * 2 * SIZE / elapsed / 1e9}


def _grpc_settings(config: dict) -> None:
    """Before ``import grpc``: the experiments this run compares (it reads them on import)."""
    import os

    os.environ["GRPC_EXPERIMENTS"] = config["grpc_experiments"]


def _tls_suffix(config: dict) -> str:
    return ", TLS + token" if config.get("tls") else ""


def _caller(config: dict):
    """kvpool's caller credentials of a TLS probe: the CA and a token (None: plaintext)."""
    from kvpool.security.caller import ANONYMOUS, CallerCredentials
    from kvpool.security.tls import TlsFiles

    tls = config.get("tls")
    if not tls:
        return ANONYMOUS
    return CallerCredentials(tls["token"], TlsFiles(ca=Path(tls["ca"])))


def _server_tls_files(config: dict):
    from kvpool.security.tls import TlsFiles

    tls = config["tls"]
    return TlsFiles(cert=Path(tls["cert"]), key=Path(tls["key"]), ca=Path(tls["ca"]))


def _grpc_server(config: dict) -> None:
    import asyncio

    _grpc_settings(config)
    import grpc

    from kvpool.security.tls import grpc_server_credentials

    async def echo(request: bytes, context: object) -> bytes:
        return request

    async def serve() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(echo)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),)
        )
        address = f"{config['ip']}:0"
        if config.get("tls"):
            credentials = grpc_server_credentials(_server_tls_files(config), False)
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        await server.start()
        _publish(config, {"port": port})
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(0)

    asyncio.run(serve())


def _grpc_client(config: dict) -> dict:
    _grpc_settings(config)  # before grpc's import (kvpool.security.caller's)
    port = json.loads(Path(config["file"]).read_text())["port"]
    caller = _caller(config)
    metadata = caller.metadata or None
    with caller.channel(f"{config['ip']}:{port}", options=()) as channel:
        call = channel.unary_unary("/bench.Echo/Echo")
        for _ in range(200):
            call(b"x" * 64, timeout=10, metadata=metadata)
        latencies = []
        end = time.perf_counter() + 2.0
        while time.perf_counter() < end:
            start = time.perf_counter()
            call(b"x" * 64, timeout=10, metadata=metadata)
            latencies.append(time.perf_counter() - start)
    latencies.sort()
    label = config["grpc_label"] + _tls_suffix(config)
    return {f"gRPC unary round trip p50 (us), {label}": latencies[len(latencies) // 2] * 1e6}


def _lane_server(config: dict) -> None:
    import asyncio

    from kvpool.common import lane_protocol as lp

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.decoder = lp.FrameDecoder()

        def data_received(self, data: bytes) -> None:
            for frame in self.decoder.feed(data):
                self.transport.write(lp.encode(frame.call_id, frame.method, b""))

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        context = None
        if config.get("tls"):
            from kvpool.security.tls import ServerContexts

            # as the master's lane serves TLS: a context that follows rotated files
            files = _server_tls_files(config)
            context = ServerContexts(files, require_client_cert=False).listening_context()
        server = await loop.create_server(Echo, config["ip"], 0, ssl=context)
        _publish(config, {"port": server.sockets[0].getsockname()[1]})
        await loop.run_in_executor(None, sys.stdin.read)
        server.close()

    asyncio.run(serve())


def _lane_client(config: dict) -> dict:
    from kvpool.client.lane_client import LaneClient
    from kvpool.proto import master_pb2 as pb

    port = json.loads(Path(config["file"]).read_text())["port"]
    lane = LaneClient(config["ip"], port, _caller(config))
    request = pb.ExistsRequest(keys=["x" * 64])
    for _ in range(200):
        lane.call("Exists", request, pb.ExistsResponse, 10)
    latencies = []
    end = time.perf_counter() + 2.0
    while time.perf_counter() < end:
        start = time.perf_counter()
        lane.call("Exists", request, pb.ExistsResponse, 10)
        latencies.append(time.perf_counter() - start)
    lane.close()
    latencies.sort()
    label = "metadata lane round trip p50 (us)" + _tls_suffix(config)
    return {label: latencies[len(latencies) // 2] * 1e6}


ROLES = {
    "ucx-target": _ucx_target,
    "ucx-initiator": _ucx_initiator,
    "socket-server": _socket_server,
    "socket-client": _socket_client,
    "grpc-server": _grpc_server,
    "grpc-client": _grpc_client,
    "lane-server": _lane_server,
    "lane-client": _lane_client,
}
PAIRS = (
    ("ucx-target", "ucx-initiator", {}),
    ("socket-server", "socket-client", {}),
    ("grpc-server", "grpc-client", {"grpc_experiments": "", "grpc_label": "gRPC defaults"}),
    (
        "grpc-server",
        "grpc-client",
        {"grpc_experiments": grpc_tuning.EXPERIMENTS, "grpc_label": "kvpool's settings"},
    ),
    (
        "grpc-server",
        "grpc-client",
        {
            "grpc_experiments": grpc_tuning.EXPERIMENTS,
            "grpc_label": "kvpool's settings",
            "tls": True,
        },
    ),
    ("lane-server", "lane-client", {}),
    ("lane-server", "lane-client", {"tls": True}),
)
#: Round trips measured plain and with TLS + token: (plain figure, TLS figure) names.
TLS_PAIRS = (
    (
        "gRPC unary round trip p50 (us), kvpool's settings",
        "gRPC unary round trip p50 (us), kvpool's settings, TLS + token",
    ),
    ("metadata lane round trip p50 (us)", "metadata lane round trip p50 (us), TLS + token"),
)


# ---------------------------------------------------------------- orchestration


def measure(placement, work_dir: Path, pairs: tuple = PAIRS) -> dict:
    """Every pair of roles across ``placement``: server side, then client side."""
    results = {}
    tls = _tls_material(placement, work_dir) if any(p[2].get("tls") for p in pairs) else None
    for number, (server_role, client_role, extra) in enumerate(pairs):
        config = {
            "file": str(work_dir / f"{server_role}-{number}.json"),
            "ip": placement.server_ip,
            "tcp_only": placement.tcp_only,
            **extra,
        }
        if extra.get("tls"):
            config["tls"] = tls
        server = subprocess.Popen(
            [*placement.server_prefix, *_argv(server_role, config)],
            stdin=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not Path(config["file"]).exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{server_role} did not start")
                time.sleep(0.05)
            done = subprocess.run(
                [*placement.client_prefix, *_argv(client_role, config)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{client_role} failed:\n{done.stderr[-2000:]}")
            results.update(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            assert server.stdin is not None
            server.stdin.close()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return results


def _tls_material(placement, work_dir: Path) -> dict:
    """A throwaway CA, a server certificate for every address of ``placement`` and a client
    token (made as a secure kvpool's are; the echo servers check none of it)."""
    from kvpool.security.dev_pki import make_dev_pki
    from kvpool.security.identity import Role
    from kvpool.security.tokens import new_token

    hosts = dict.fromkeys((placement.server_ip, placement.client_ip, "127.0.0.1", "localhost"))
    pki = make_dev_pki(work_dir / "pki", hosts=tuple(hosts))
    token, _ = new_token("bench-client", Role.CLIENT, tenant="bench")
    return {
        "cert": str(pki.server_cert),
        "key": str(pki.server_key),
        "ca": str(pki.ca),
        "token": token,
    }


def tls_costs(values: dict) -> list[tuple[str, float, float]]:
    """(what, plain us, TLS us) of each round trip measured both ways in ``values``."""
    out = []
    for plain, tls in TLS_PAIRS:
        if plain in values and tls in values:
            out.append((plain.split(" p50")[0], values[plain], values[tls]))
    return out


def _argv(role: str, config: dict) -> list[str]:
    return [sys.executable, str(HERE / "ceilings.py"), role, json.dumps(config)]


def main(argv: list[str] | None = None) -> int:
    from bench import environment
    from bench.compare import PLACEMENTS, open_placement

    parser = argparse.ArgumentParser(prog="python -m bench.ceilings")
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--json", default=str(HERE / "results" / "ceilings.json"))
    args = parser.parse_args(argv)
    out = {"environment": environment.describe(), "placements": {}}
    for name in args.placements.split(","):
        with open_placement(name) as placement, tempfile.TemporaryDirectory() as work_dir:
            print(f"[{name}] measuring", flush=True)
            out["placements"][name] = measure(placement, Path(work_dir))
    for name, values in out["placements"].items():
        for what, value in values.items():
            unit = "" if "(us)" in what else " GB/s"
            print(f"{name:10} {what:64} {value:8.2f}{unit}")
    for name, values in out["placements"].items():
        for what, plain, tls in tls_costs(values):
            print(
                f"{name:10} {what}: {plain:.1f} us plain, {tls:.1f} us with TLS + token "
                f"({tls - plain:+.1f} us, {tls / plain - 1:+.0%})"
            )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


def _role_main() -> int:
    role, config = sys.argv[1], json.loads(sys.argv[2])
    result = ROLES[role](config)
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ROLES:
        sys.exit(_role_main())
    sys.exit(main())
