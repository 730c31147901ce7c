"""``python -m bench.checked_vs_ucx``: a call of 32 x 4 KiB puts or gets over the checked stream
against the same over UCX on TCP, through ``kvpool.Client``, master round trips included.

One secure master and one storage node on this host serving the checked stream
(``--data-port 0``), UCX held to TCP in both (``UCX_TLS=tcp``), the client kept from mapping
the node's memory (``same_host_mapping=False``): what a client on another host would see,
less the wire. Two clients of one process: one on the checked stream, one opted out of it
(``KVPOOL_CHECKED_STREAM=0``: UCX). Calls alternate between the two ways (the machine's load
moves); ``--rounds`` rounds of ``--calls`` calls each. Prints one JSON line: the median
microseconds per call of each way and op, and each round's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid

from kvpool import Client
from kvpool.local_cluster import LocalCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    os.environ["UCX_TLS"] = "tcp"
    with LocalCluster(
        1, "1GiB", node_args=("--data-port", "0", "--ucx-tcp"), env={"UCX_TLS": "tcp"}
    ) as cluster:
        options = {
            "timeout": 30,
            "same_host_mapping": False,
            "ucx_config": {"TLS": "tcp"},
            **cluster.client_credentials(),
        }
        os.environ["KVPOOL_CHECKED_STREAM"] = "1"
        checked = Client(cluster.master_address, **options)
        os.environ["KVPOOL_CHECKED_STREAM"] = "0"
        ucx = Client(cluster.master_address, **options)
        os.environ.pop("KVPOOL_CHECKED_STREAM")
        data = [os.urandom(args.size) for _ in range(args.count)]
        buffers = [bytearray(args.size) for _ in range(args.count)]
        ways = {"checked": checked, "ucx": ucx}
        keys = {way: [f"{way}-{i}" for i in range(args.count)] for way in ways}
        for way, client in ways.items():
            for _ in range(20):  # (warm: connections, endpoints)
                client.put_many(list(zip(keys[way], data, strict=True)))
                client.get_into_many(keys[way], buffers)
        rounds: list[dict[str, float]] = []
        for _ in range(args.rounds):
            figures: dict[str, list[float]] = {}
            for call in range(args.calls):
                order = list(ways) if call % 2 else list(reversed(ways))
                for way in order:
                    client = ways[way]
                    fresh = [f"{way}-{uuid.uuid4().hex[:8]}" for _ in range(args.count)]
                    began = time.perf_counter()
                    stored = client.put_many(list(zip(fresh, data, strict=True)))
                    figures.setdefault(f"{way}_put", []).append(time.perf_counter() - began)
                    assert all(r == 1 for r in stored), stored
                    began = time.perf_counter()
                    got = client.get_into_many(fresh, buffers)
                    figures.setdefault(f"{way}_get", []).append(time.perf_counter() - began)
                    assert all(r == args.size for r in got), got
                    assert buffers[-1] == data[-1]
                    client.remove_many(fresh, force=True)
            rounds.append({k: round(statistics.median(v) * 1e6, 1) for k, v in figures.items()})
        checked.close()
        ucx.close()
    medians = {k: round(statistics.median(r[k] for r in rounds), 1) for k in rounds[0]}
    print(
        json.dumps({"count": args.count, "size": args.size, "median_us": medians, "rounds": rounds})
    )


if __name__ == "__main__":
    main()
