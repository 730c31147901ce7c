"""A reopened NVMe segment whose bytes the disk cannot read drops the objects there, says so,
and serves the others: it never dies of SIGBUS.

A block the disk cannot read (an I/O error) is an ``OSError`` to ``pread``, but a SIGBUS to a
read through the segment's mapping, which kills the node before it logs a word, at every
start. The check of a reopened segment's objects reads with ``pread``. A data file that ends
before an object's bytes stands in for the unreadable block here (a read of them through the
mapping is a SIGBUS as well, ``pread`` comes short): both are what the check must survive.
The check runs in a process of its own, so that a SIGBUS fails the test instead of killing
pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvpool.common.status import Tier
from kvpool.storage_node.object_index import Entry, live_entries
from kvpool.storage_node.segment import INDEX_SUFFIX, open_persistent_segment
from kvpool.transport import ucp

SIZE = 16 << 20
KEPT = Entry("kept", 0, 1 << 20, 1)
LOST = Entry("lost", 8 << 20, 1 << 20, 2)

REOPEN = """
import json, os, sys
from pathlib import Path
from kvpool.common.status import Tier
from kvpool.storage_node import segment as segments
from kvpool.transport import ucp

context = ucp.Context({"TLS": "tcp"})
base, size = Path(sys.argv[1]), int(sys.argv[2])
segment = segments.open_persistent_segment(context, "n1", base, size, Tier.NVME)
assert len(segment.index.entries()) == 2, "both intact at first"
os.ftruncate(segment.fd, 4 << 20)  # (what follows cannot be read any more)
segments._verify(segment)
print(json.dumps({
    "unreadable": segment.unreadable_on_open,
    "damaged": segment.dropped_on_open,
    "error": segment.read_error,
    "kept": [entry.key for entry in segment.index.entries()],
}))
"""


def test_objects_that_cannot_be_read_are_dropped_and_named_and_the_rest_kept(tmp_path: Path):
    base = tmp_path / "nvme"
    context = ucp.Context({"TLS": "tcp"})
    segment = open_persistent_segment(context, "n1", base, SIZE, Tier.NVME)
    for entry in (KEPT, LOST):
        segment.memory[entry.offset : entry.offset + entry.size] = os.urandom(entry.size)
        segment.record([entry])
    segment.close()
    context.close()

    child = subprocess.run(
        [sys.executable, "-c", REOPEN, str(base), str(SIZE)],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert child.returncode == 0, f"the check died ({child.returncode}): {child.stderr[-2000:]}"
    verified = json.loads(child.stdout.splitlines()[-1])
    assert verified["unreadable"] == ["lost"]
    assert verified["damaged"] == []
    assert verified["kept"] == ["kept"]
    assert "'lost' at 8388608+1048576" in verified["error"]
    index = base.with_name(base.name + INDEX_SUFFIX)
    assert set(live_entries(index)) == {"kept"}, "the drop is recorded in the index"
