"""One process at a time holds a persistent segment: an exclusive ``flock`` of the segment's
own directory (storage_node/private_files.py), which nothing can remove while the segment's
files are in it. A lock file beside them (``segment.index.lock``, which names the holder's
pid for the message) can be removed as "stale" by an operator or a script: that must not let
a second process in, whose open would rewrite the log under the first one's appends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvpool.storage_node.object_index import DurableIndex
from kvpool.storage_node.private_files import SegmentInUse, make_private_directory

HEADER = {"segment_id": "n1/nvme-0001", "size": 1 << 30, "tier": "nvme"}

HOLD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from kvpool.storage_node.object_index import DurableIndex

    index = DurableIndex(Path(sys.argv[1]), {"segment_id": "n1/nvme-0001", "size": 1 << 30,
                                             "tier": "nvme"})
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
    index.close()
    """
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return make_private_directory(tmp_path / "segment") / "segment.index"


def test_a_segment_another_process_holds_is_refused_with_its_pid_lock_file_or_not(path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(SegmentInUse, match=f"in use by another process \\(pid {holder.pid}\\)"):
            DurableIndex(path, HEADER)
        path.with_name("segment.index.lock").unlink()  # "stale"
        with pytest.raises(SegmentInUse, match="in use by another process"):
            DurableIndex(path, HEADER)
    finally:
        holder.communicate("", timeout=30)
    assert holder.returncode == 0
    DurableIndex(path, HEADER).close()  # free once its holder is gone


def test_a_second_open_in_the_same_process_is_refused_without_the_lock_file_too(path):
    first = DurableIndex(path, HEADER)
    path.with_name("segment.index.lock").unlink()
    with pytest.raises(SegmentInUse):
        DurableIndex(path, HEADER)
    first.close()
    DurableIndex(path, HEADER).close()
