"""A promotion (``Segment.copy_from``, NVMe to DRAM) of an object whose bytes the disk cannot
read fails cleanly and tells the master, whether or not a bounce buffer is free.

The copy reads the NVMe bytes past the page cache when a bounce buffer is free; when every
one is busy with other transfers it used to load them through the segment's mapping, where a
block the disk cannot read is a SIGBUS that kills the node, silently. It reads them from the
file (``preadv``) instead: such a block is an OSError, a failed copy (the object stays where
it was), and the source object is noted as unreadable for the next heartbeat, by either
path. A readable object beside it is still promoted byte for byte.

A data file cut short stands in for the unreadable block, as in
test_nvme_unreadable_on_open.py; the copies run in a process of their own, so that a SIGBUS
fails the test instead of killing pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool.storage_node.direct_writes import BOUNCE_COUNT

PROMOTE = """
import json, os, sys
from pathlib import Path
import google_crc32c
from kvpool.common.status import Tier
from kvpool.storage_node import segment as segments
from kvpool.storage_node.direct_writes import BOUNCES
from kvpool.storage_node.index_log import Entry
from kvpool.transport import ucp

context = ucp.Context({"TLS": "tcp"})
base, busy = Path(sys.argv[1]), sys.argv[2] == "busy"
nvme = segments.open_persistent_segment(context, "n1", base, 16 << 20, Tier.NVME)
dram = segments.allocate_dram_segment(context, "n1", 16 << 20, prefault=False)
readable, lost = Entry("readable", 0, 1 << 20, 1), Entry("lost", 8 << 20, 1 << 20, 2)
data = os.urandom(1 << 20)
for entry in (readable, lost):
    nvme.memory[entry.offset : entry.offset + entry.size] = data
    nvme.record([entry])
os.posix_fadvise(nvme.fd, 0, 0, os.POSIX_FADV_DONTNEED)  # (read from the disk, not the cache)
os.ftruncate(nvme.fd, 4 << 20)  # (the lost object's blocks cannot be read any more)
held = []
while busy and (bounce := BOUNCES.take()) is not None:
    held.append(bounce)  # (busy with other transfers)
result = {"busy": len(held)}
crcs = dram.copy_from(nvme, readable.offset, Entry("readable", 0, 1 << 20, 1))
result["readable"] = dram.memory[: 1 << 20] == data and crcs == [google_crc32c.value(data)]
try:
    dram.copy_from(nvme, lost.offset, Entry("lost", 4 << 20, 1 << 20, 2))
    result["error"] = None
except OSError as error:
    result["error"] = str(error)
result["noted"] = [entry.key for entry in nvme.unreadable.take(nvme.index.entries)]
result["promoted"] = sorted(entry.key for entry in dram.index.entries())
print(json.dumps(result))
"""


@pytest.mark.parametrize("bounces", ["free", "busy"])
def test_a_promotion_of_unreadable_bytes_fails_cleanly_and_notes_them_for_the_master(
    tmp_path: Path, bounces: str
):
    child = subprocess.run(
        [sys.executable, "-c", PROMOTE, str(tmp_path / "nvme"), bounces],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert child.returncode == 0, f"the copy died ({child.returncode}): {child.stderr[-2000:]}"
    result = json.loads(child.stdout.splitlines()[-1])
    assert result["busy"] == (BOUNCE_COUNT if bounces == "busy" else 0)
    assert result["readable"], "a readable object is promoted byte for byte"
    assert result["error"] is not None and "ends before" in result["error"]
    assert result["promoted"] == ["readable"], "the failed copy records nothing"
    assert result["noted"] == ["lost"], "the master hears of the unreadable source"
