"""A node-like target for tests/integration/test_ucp_active_messages.py, run as a process.

``python ucp_am_target.py CONFIG_JSON``: a UCX context (active messages only unless the
config asks for RMA), one 16 MiB segment filled with a canary pattern and served through
``ucp_am.AmServer`` under the test's key, a progress thread. It writes its worker address,
the segment's address and rkey to ``config["file"]``, then answers commands on stdin, one
JSON line each: ``{"read": [offset, length]}`` (the segment's bytes, hex), ``{"counters":
1}``, ``{"quit": 1}``, one JSON line each on the file descriptor ``config["answers"]`` (its
stdout carries its logs).
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import sys
from pathlib import Path

from kvpool.security import capabilities
from kvpool.transport import ucp, ucp_am

SEGMENT_SIZE = 16 << 20
CANARY = bytes(range(251))  # a prime period: a shifted copy never matches


def canary(offset: int, length: int) -> bytes:
    """The canary's bytes at ``offset`` of the segment."""
    start = offset % len(CANARY)
    repeat = (CANARY * ((start + length) // len(CANARY) + 2))[start : start + length]
    return repeat


def main(config: dict) -> None:
    context = ucp.Context(config.get("ucx"), rma=config.get("rma", False), active_messages=True)
    worker = context.create_worker()
    memory = mmap.mmap(-1, SEGMENT_SIZE)
    memory[:] = canary(0, SEGMENT_SIZE)
    region = context.register(memory)
    server = ucp_am.AmServer(worker, max_inflight=config.get("max_inflight", 64))
    server.set_key(config["key_id"], bytes.fromhex(config["key"]))
    server.set_policy(max_skew_ms=config.get("max_skew_ms", 1000), min_term=config["min_term"])
    server.add_segment(capabilities.segment_digest(config["segment_id"]), region)
    progress = ucp.ProgressThread(worker)
    progress.start()
    info = {"worker": worker.address.hex(), "base": region.address, "rkey": region.rkey.hex()}
    tmp = Path(config["file"] + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(config["file"])
    answers = os.fdopen(config["answers"], "w")
    for line in sys.stdin:
        command = json.loads(line)
        if "read" in command:
            offset, length = command["read"]
            answer: object = memory[offset : offset + length].hex()
        elif "counters" in command:
            answer = dataclasses.asdict(server.counters())
        else:
            break
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    progress.stop()
    server.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
