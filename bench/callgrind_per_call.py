"""``python -m bench.callgrind_per_call``: instructions per client call of kvpool's master and
client, counted by callgrind, secure or ``--insecure``.

Wall-clock figures on a small shared machine move by 10-20 % between runs; instructions
executed in user space do not depend on the load. This starts a master under ``valgrind
--tool=callgrind`` and a storage node (bench/kvpool_runner.py's ``KvpoolServers`` set-up:
a throwaway CA, tokens, TLS on the master's gRPC port and lane; or everything
``--insecure``), stores the keys, then runs a client process (under callgrind too, unless
``--no-client``) that makes ``--calls`` calls of ``--op``:

- ``exists``: ``exists_many`` of 256 stored keys, no lease (the ``--compare`` workload);
- ``exists1``: the same with one key (what a call costs beyond its keys);
- ``get``: ``get_into_many`` of 32 x 4 KiB; ``put``: ``put_many`` of 32 new 4 KiB objects.

``--mapping``: the client maps the node's segment and moves the bytes itself, as the bench's
same-host clients do (``same_host_mapping``); without it, they go over UCX.

``--cpu-time``: no callgrind; the same processes at full speed, and per call the wall time and
each process's CPU time (user and system, every thread: ``/proc/PID/stat``), its context
switches and minor page faults, and the master's resident size after the calls. Where
instructions are level and the time is not, this says which process spends it.

Counters are zeroed (``callgrind_control -z``) when both processes are warm, dumped after the
calls, and the master's idle cost over as long (heartbeats, sweeps: about 3.4M instructions
a second) is dumped next and subtracted. Prints one JSON line: instructions per call of each
process, and the dump files, for ``callgrind_annotate`` (whose self costs of Python code
are those of the interpreter's functions: compare two dumps function by function).
Under callgrind a call is ~50 times slower: 300 calls of ``exists`` take about 2 minutes.

``--tree DIR`` measures another checkout of kvpool (an older commit, with its own ``DIR/.venv``)
the same way: its master, node and client run on that venv's python, this script's client
code included (it only uses ``Client``'s long-standing calls). A tree older than kvpool's
security (its master has no ``--insecure``) runs with no security flags at all, which is
what ``--security insecure`` means for it. The keys are stored by a client process of the
tree (not under callgrind, which would miss the master's write timeout), so the parent never
speaks the other tree's protocol. As ``bench/kvpool_runner.py`` does, the gets read into one
registered arena.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: Runs the client process's ``client_main`` from this file, whatever the tree's own ``bench``
#: holds: started in the tree's root, its python imports that tree's ``kvpool``.
CLIENT_LOADER = (
    "import importlib.util, json, sys; "
    "spec = importlib.util.spec_from_file_location('callgrind_per_call', sys.argv[1]); "
    "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
    "module.client_main(json.loads(sys.argv[2]))"
)
VALGRIND = ["valgrind", "--tool=callgrind", "--vgdb=yes", "--vgdb-poll=1000"]
KEYS = {"exists": 256, "exists1": 1, "get": 32, "put": 32}
SIZE = 4096


def _instructions(dump: Path) -> int:
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def _control(flag: str, pid: int) -> None:
    subprocess.run(
        ["callgrind_control", flag, str(pid)], check=True, capture_output=True, timeout=300
    )


def _last_dump(out: Path, pid: int, back: int = 1) -> Path:
    dumps = sorted(out.glob(f"cg.{pid}.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    return dumps[-back]


def _wait_for(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    while not path.exists():
        if process.poll() is not None:
            raise RuntimeError(f"the client exited:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)


def _has_security(kvpool: list[str]) -> bool:
    """Whether that kvpool's master knows ``--insecure`` (trees before kvpool's security do
    not, and run insecure with no flag)."""
    help_text = subprocess.run(
        [*kvpool, "master", "--help"],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    return "--insecure" in help_text


def measure(
    op: str,
    secure: bool,
    calls: int,
    out: Path,
    client_too: bool,
    tree: Path | None = None,
    mapping: bool = False,
    cpu_time: bool = False,
    master_args: tuple[str, ...] = (),
    key_prefix: str = "",
    client_profile: Path | None = None,
) -> dict[str, Any]:
    from bench.kvpool_runner import CALLER_ENV, NODE_ID, KvpoolServers
    from bench.processes import resident_mib
    from kvpool.local_cluster import ManagedProcess

    root = tree.resolve() if tree is not None else Path(__file__).resolve().parent.parent
    python = str(tree / ".venv" / "bin" / "python") if tree is not None else sys.executable
    # the venv's console script: its sys.path starts in .venv/bin, not in this process's
    # working folder (whose kvpool/ would shadow the tree's)
    kvpool = [python, str(Path(python).parent / "kvpool")]
    flags = _has_security(kvpool)
    if secure and not flags:
        raise SystemExit(f"{tree} predates kvpool's security: measure it --security insecure")

    out.mkdir(parents=True, exist_ok=True)
    sync = out / "sync"
    shutil.rmtree(sync, ignore_errors=True)
    sync.mkdir()
    placement = SimpleNamespace(
        server_ip="127.0.0.1", client_ip="127.0.0.1", server_prefix=[], client_prefix=[],
        tcp_only=False,
    )  # fmt: skip
    servers = KvpoolServers(placement, out, "1GiB", dict(os.environ), secure=secure, name="cg")
    if secure:
        servers._prepare_credentials()
    master_flags = servers._master_security_args() if flags else []
    node_flags = [] if secure or not flags else ["--insecure"]
    valgrind = [] if cpu_time else [*VALGRIND, f"--callgrind-out-file={out}/cg.%p"]
    master = ManagedProcess(
        "cg-master",
        [*valgrind, *kvpool, "master", "--host",
         "127.0.0.1", "--port", "0", "--lane-port", "0", "--http-port", "0",
         "--log-format", "json", *master_flags, *master_args],
        out, servers.env,
    )  # fmt: skip
    node = client = None
    try:
        address = f"127.0.0.1:{master.wait_ready(time.monotonic() + 600)['grpc_port']}"
        node = ManagedProcess(
            "cg-node",
            [*kvpool, "node", "--master", address, "--dram", "1GiB", "--listen", "127.0.0.1",
             "--http-port", "0", "--node-id", NODE_ID, "--drain-timeout", "1",
             "--log-format", "json", *node_flags],
            out, servers._node_env(),
        )  # fmt: skip
        node.wait_ready(time.monotonic() + 300)
        config = {
            "master": address, "tls_ca": servers.ca if secure else None,
            "token": servers.client_token if secure else None, "op": op, "calls": calls,
            "prefix": f"{key_prefix}cg-{op}", "sync": str(sync), "mapping": mapping,
            "profile": str(client_profile.resolve()) if client_profile else None,
        }  # fmt: skip
        argv = [python, "-c", CLIENT_LOADER, str(Path(__file__).resolve())]
        env = {k: v for k, v in servers.env.items() if k not in CALLER_ENV}
        # the keys, stored by the tree's client at full speed (one under callgrind may miss
        # the master's write timeout)
        subprocess.run(
            [*argv, json.dumps({**config, "store": True})],
            env=env, cwd=root, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        argv.append(json.dumps(config))
        if client_too:
            argv = [*valgrind, *argv]
        log = out / "client.log"
        with log.open("wb") as log_file:
            client = subprocess.Popen(
                argv, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                cwd=root,
            )  # fmt: skip
        _wait_for(sync / "ready", client, log)
        time.sleep(1)
        if cpu_time:
            pids = {"master": master.pid, "node": node.pid, "client": client.pid}
            result = _cpu_per_call(pids, sync, client, log, calls)
            result.update(op=op, security=servers.security, mapping=mapping, tree=str(root))
            result["master_resident_mib"] = round(resident_mib(master.pid))
            (sync / "exit").write_text("")
            client.wait(300)
            return result
        _control("-z", master.pid)
        if client_too:
            _control("-z", client.pid)
        started = time.monotonic()
        (sync / "go").write_text("")
        _wait_for(sync / "done", client, log)
        busy = time.monotonic() - started
        _control("-d", master.pid)
        if client_too:
            _control("-d", client.pid)
        _control("-z", master.pid)
        time.sleep(busy)
        _control("-d", master.pid)
        master_busy = _instructions(_last_dump(out, master.pid, 2))
        master_idle = _instructions(_last_dump(out, master.pid, 1))
        result = {
            "op": op, "security": servers.security, "calls": calls, "mapping": mapping,
            "tree": str(root),
            "seconds": round(busy, 1),
            "master_per_call": round((master_busy - master_idle) / calls),
            "master_idle_per_second": round(master_idle / busy),
            "master_dump": str(_last_dump(out, master.pid, 2)),
        }  # fmt: skip
        if client_too:
            result["client_per_call"] = round(_instructions(_last_dump(out, client.pid)) / calls)
            result["client_dump"] = str(_last_dump(out, client.pid))
        (sync / "exit").write_text("")
        client.wait(300)
        return result
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        for process in (node, master):
            if process is not None:
                process.stop(30)
        if servers._secrets is not None:
            servers._secrets.cleanup()


def _switches_and_faults(pid: int) -> tuple[int, int]:
    """A process's context switches (every thread) and minor page faults so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # (a thread that ended meanwhile)
            continue
        for line in status.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                switches += int(line.split()[1])
    return switches, int(stat[stat.rindex(")") + 2 :].split()[7])


def _cpu_per_call(
    pids: dict[str, int], sync: Path, client: subprocess.Popen[bytes], log: Path, calls: int
) -> dict[str, Any]:
    """Lets the client make its calls; per call, the wall time and each process's counts."""
    from bench.processes import process_cpu

    def counts(pid: int) -> tuple[float, int, int]:
        return (process_cpu(pid), *_switches_and_faults(pid))

    before = {name: counts(pid) for name, pid in pids.items()}
    started = time.monotonic()
    (sync / "go").write_text("")
    _wait_for(sync / "done", client, log)
    wall = time.monotonic() - started
    after = {name: counts(pid) for name, pid in pids.items()}
    result: dict[str, Any] = {"calls": calls, "us_per_call": round(wall / calls * 1e6, 1)}
    for name in pids:
        (cpu0, switches0, faults0), (cpu1, switches1, faults1) = before[name], after[name]
        result[f"{name}_cpu_us_per_call"] = round((cpu1 - cpu0) / calls * 1e6, 1)
        result[f"{name}_switches_per_call"] = round((switches1 - switches0) / calls, 2)
        result[f"{name}_faults_per_call"] = round((faults1 - faults0) / calls, 2)
    return result


def client_main(config: dict[str, Any]) -> None:
    """The client process: warms up, waits for ``go``, makes the calls, says ``done``; or,
    with ``store`` in ``config``, stores the keys and exits. Security arguments only where
    set: an older tree's ``Client`` has none."""
    import numpy as np

    from kvpool import Client

    sync = Path(config["sync"])
    security = {name: config[name] for name in ("tls_ca", "token") if config.get(name)}
    if config.get("mapping"):  # (only where asked: an older tree's Client may not know it)
        security["same_host_mapping"] = True
    client = Client(config["master"], timeout=60, **security)
    op = config["op"]
    keys = [f"{config['prefix']}/{i}" for i in range(KEYS[op])]
    if config.get("store"):
        for i in range(0, len(keys), 32):
            stored = client.put_many([(key, bytes(SIZE)) for key in keys[i : i + 32]])
            if stored != [1] * len(stored):
                raise RuntimeError(f"could not store the keys: {stored[:3]}")
        client.close()
        return
    arena = np.zeros(len(keys) * SIZE, dtype=np.uint8)
    region = client.register_buffer(arena)
    buffers = [arena[i * SIZE : (i + 1) * SIZE] for i in range(len(keys))]
    batches = itertools.count()

    def call() -> None:
        if op in ("exists", "exists1"):
            found = client.exists_many(keys, lease=False)
            assert all(f is True for f in found), found[:3]
        elif op == "get":
            sizes = client.get_into_many(keys, buffers)
            assert sizes == [SIZE] * len(keys), sizes[:3]
        else:
            batch = next(batches)
            stored = client.put_many(
                [(f"{key}-{batch}", b) for key, b in zip(keys, buffers, strict=True)]
            )
            assert stored == [1] * len(keys), stored[:3]

    for _ in range(20):
        call()
    (sync / "ready").write_text("")
    while not (sync / "go").exists():
        time.sleep(0.05)
    profile = None
    if config.get("profile"):
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    for _ in range(config["calls"]):
        call()
    if profile is not None:
        profile.disable()
        profile.dump_stats(config["profile"])
    (sync / "done").write_text("")
    while not (sync / "exit").exists():
        time.sleep(0.05)
    client.unregister_buffer(region)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=sorted(KEYS), default="exists")
    parser.add_argument("--security", choices=("secure", "insecure"), default="secure")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--no-client", action="store_true", help="the master alone")
    parser.add_argument(
        "--mapping",
        action="store_true",
        help="the client maps the node's segment, as the bench's same-host clients do",
    )
    parser.add_argument("--out-dir", type=Path, help="the dumps (default: a new temporary one)")
    parser.add_argument(
        "--tree", type=Path, help="another kvpool checkout to measure, with its own .venv"
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="no callgrind: wall and CPU time, switches and page faults per call",
    )
    parser.add_argument(
        "--master-args", default="", help="more flags for the master, e.g. '--story-events 0'"
    )
    parser.add_argument(
        "--key-prefix",
        default="",
        help="put in front of every key, e.g. to make them as long as the bench's (50 characters)",
    )
    parser.add_argument(
        "--client-profile",
        type=Path,
        help="with --cpu-time: the client's timed calls under cProfile, its stats written here",
    )
    args = parser.parse_args()
    if not args.cpu_time and shutil.which("callgrind_control") is None:
        sys.exit("callgrind_per_call: needs valgrind (apt-get install valgrind)")
    out = args.out_dir or Path(tempfile.mkdtemp(prefix="kvpool-callgrind-"))
    secure = args.security == "secure"
    result = measure(
        args.op, secure, args.calls, out, not args.no_client, args.tree, args.mapping,
        args.cpu_time, tuple(args.master_args.split()), args.key_prefix,
        args.client_profile,
    )  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
