"""An NVMe segment's index log on a disk that another process filled up (storage_node/
object_index.py):

- an append that finds no room left for the log fails before it writes any record: the log
  never holds a torn record of it, and a node killed then starts again on the still full disk
  with every object it had acknowledged;
- a log whose last record was torn by a crash (an append that never returned) is kept on a
  full disk too: that record is cut off, and later appends follow the intact ones, so that the
  next open finds no damage at all; damage anywhere else still needs the log rewritten;
- the removal of an object whose put the log never took needs no room: the master's Forget
  of a put that failed for space succeeds at once, and the space comes back to the segment
  while the disk is still full.

The logs here are opened by the real ``DurableIndex``, in processes of their own where a
crash is part of the story.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import cluster_status, fill_disk, wait_until

from kvpool import Client
from kvpool.errors import KVPoolError
from kvpool.storage_node.index_log import FRAME, OP_PUT, Entry, encode
from kvpool.storage_node.object_index import DurableIndex, live_entries
from kvpool.storage_node.private_files import make_private_directory

MiB = 1 << 20
HEADER = {"segment_id": "n1/nvme-0001", "size": 1 << 30, "tier": "nvme"}
LONG = "x" * 900  # (keys that fill the log's room in about a thousand records)


def _entry(n: int) -> Entry:
    return Entry(f"default/k{n:06d}-{LONG}", n * 4096, 100, 1, 0x1234)


#: Run in a process of its own: opens the log, fills the disk, puts until the log has no
#: room left, and dies without closing it (a node killed), printing what it recorded.
FILL_AND_CRASH = textwrap.dedent(
    """
    import errno, json, os, sys
    from pathlib import Path
    from kvpool.storage_node.index_log import Entry
    from kvpool.storage_node.object_index import DurableIndex

    path, hog, header = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    index = DurableIndex(path, header)
    fd = os.open(hog, os.O_WRONLY | os.O_CREAT, 0o600)
    for chunk in (1 << 20, 4096, 512):
        try:
            while True:
                os.write(fd, bytes(chunk))
        except OSError:
            pass
    os.fsync(fd)
    recorded, refused = [], []
    n = 0
    while len(refused) < 3:
        entry = Entry(f"default/k{n:06d}-" + "x" * 900, n * 4096, 100, 1, 0x1234)
        try:
            index.put([entry])
            recorded.append(entry.key)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
            refused.append(entry)
        n += 1
    index.delete(refused)  # (the master's Forgets of the failed puts: they need no room)
    index.delete(refused)  # (and may come twice)
    keys = [entry.key for entry in refused]
    print(json.dumps({"recorded": recorded, "refused": keys}), flush=True)
    os._exit(0)
    """
)


#: Run in a process of its own: puts 20 entries and dies without closing the log, which
#: keeps the room written ahead of its appends.
PUT_AND_CRASH = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from kvpool.storage_node.index_log import Entry
    from kvpool.storage_node.object_index import DurableIndex

    index = DurableIndex(Path(sys.argv[1]), json.loads(sys.argv[2]))
    x = "x" * 900
    index.put([Entry(f"default/k{n:06d}-{x}", n * 4096, 100, 1, 0x1234) for n in range(20)])
    os._exit(0)
    """
)


def _fill_and_crash(path: Path, hog: Path) -> dict:
    child = subprocess.run(
        [sys.executable, "-c", FILL_AND_CRASH, str(path), str(hog), json.dumps(HEADER)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_a_log_that_runs_out_of_room_writes_nothing_torn_and_reopens_on_the_full_disk(
    small_disk,
):
    path = make_private_directory(small_disk / "segment") / "segment.index"
    result = _fill_and_crash(path, small_disk / "hog")
    assert len(result["recorded"]) > 500 and len(result["refused"]) == 3
    data = path.read_bytes()
    room = os.statvfs(small_disk)
    assert room.f_bavail * room.f_frsize < MiB, "the disk is still full"

    reopened = DurableIndex(path, HEADER)  # (no room to compact: appends go on in place)
    assert sorted(e.key for e in reopened.entries()) == sorted(result["recorded"])
    assert (reopened.damaged_records, reopened.undecodable_records) == (0, 0), "nothing torn"
    assert reopened.unconfirmed == set()
    assert path.read_bytes() == data, "an intact log is appended to as it is"

    os.unlink(small_disk / "hog")  # the operator frees the disk: appends go on
    reopened.put([_entry(999_999)])
    reopened.close()
    assert set(live_entries(path)) == {*result["recorded"], _entry(999_999).key}


def _torn(path: Path, last: Entry) -> int:
    """Writes the first half of a record again after the log's last one, as a crash in the
    middle of an append leaves it; returns where the torn bytes end."""
    data = path.read_bytes()
    end = len(data.rstrip(b"\0"))
    length = FRAME.size + len(encode(OP_PUT, last))  # (the last record: a whole frame)
    torn = data[end - length : end - length // 2]
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, torn, end)
        os.fsync(fd)
    finally:
        os.close(fd)
    return end + len(torn)


def test_a_log_whose_last_append_was_torn_by_a_crash_is_kept_on_a_full_disk(small_disk):
    path = make_private_directory(small_disk / "segment") / "segment.index"
    subprocess.run(
        [sys.executable, "-c", PUT_AND_CRASH, str(path), json.dumps(HEADER)], check=True, timeout=60
    )
    assert [_entry(n).key for n in range(20)] == sorted(live_entries(path))
    torn_end = _torn(path, _entry(19))
    fill_disk(small_disk / "hog")

    reopened = DurableIndex(path, HEADER)
    assert sorted(e.key for e in reopened.entries()) == sorted(_entry(n).key for n in range(20))
    assert reopened.damaged_records == 1, "the torn record, counted and skipped"
    assert path.read_bytes()[torn_end - 8 : torn_end] == bytes(8), "the torn bytes are gone"
    reopened.put([_entry(20), _entry(21)])  # (in place of the torn record: no room taken)
    reopened.delete([_entry(0)])
    reopened.close()

    again = DurableIndex(path, HEADER)
    assert sorted(e.key for e in again.entries()) == sorted(_entry(n).key for n in range(1, 22))
    assert (again.damaged_records, again.undecodable_records) == (0, 0)
    assert again.unconfirmed == set(), "no damage that intact records follow"
    again.close()


def test_damage_before_the_last_record_still_needs_the_log_rewritten(small_disk):
    """Never read around: a record that fails its check ahead of intact ones may have been a
    removal, so the log must be rewritten (its entries unconfirmed), and a full disk stops the
    open with an error that says what room to free."""
    path = make_private_directory(small_disk / "segment") / "segment.index"
    index = DurableIndex(path, HEADER)
    index.put([_entry(n) for n in range(5)])
    index.close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 3000] ^= 0xFF  # inside a record in the middle
    path.write_bytes(bytes(data))
    fill_disk(small_disk / "hog")

    with pytest.raises(OSError, match="the log is damaged or of an older format") as refused:
        DurableIndex(path, HEADER)
    assert refused.value.errno == errno.ENOSPC
    os.unlink(small_disk / "hog")
    reopened = DurableIndex(path, HEADER)
    assert reopened.damaged_records == 1 and reopened.unconfirmed, "read, not trusted"
    reopened.close()


def _nvme_segment(client: Client):
    [segment] = [s for s in cluster_status(client.master).segments if s.tier == 2]
    return segment


def test_a_put_that_fails_for_room_in_the_log_gives_its_space_back_on_a_full_disk(
    cluster_factory, small_disk
):
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=["--nvme", str(small_disk / "nvme"), "--nvme-size", "32MiB"])
    fill_disk(small_disk / "hog")
    with Client(cluster.master_address, timeout=30) as client:
        for n in range(5000):  # until the log's room is spent
            try:
                client.put(f"k{n:05d}-{LONG}", b"v" * 64, tier="nvme")
            except KVPoolError as error:
                refused = error
                break
        else:
            pytest.fail("the index log never ran out of room")
        held = _nvme_segment(client)
        # the writer hears why: the node's words, through the master
        assert "storage node 'node0' could not record it" in str(refused), refused
        assert "No space left on device" in str(refused), refused

        landed = 0  # (a block the file system frees meanwhile may take a record or two)
        for n in range(8):  # the client retries: 8 MiB of puts that fail
            with contextlib.suppress(KVPoolError):
                landed += client.put(f"big{n}-{LONG}", os.urandom(MiB), tier="nvme")
        assert landed < 8
        # Each failed put's Forget succeeds though the disk is still full: its space is free
        # again at once, not set aside until the node remounts.
        expected = held.used + landed * MiB
        assert wait_until(lambda: _nvme_segment(client).used == expected, timeout=10), (
            _nvme_segment(client),
            held,
            landed,
        )
        assert _nvme_segment(client).objects == held.objects + landed

        os.unlink(small_disk / "hog")  # the operator frees the disk
        client.remove_all(force=True)
        assert wait_until(lambda: _nvme_segment(client).used == 0, timeout=10)
        values = {f"after{n}": os.urandom(MiB) for n in range(24)}
        for key, value in values.items():
            assert client.put(key, value, tier="nvme") == 1, key
        assert all(client.get(key) == value for key, value in values.items())
    assert node.alive()


def test_a_removal_the_full_log_could_not_record_takes_effect_once_room_returns(
    cluster_factory, small_disk
):
    """A removal of a published object needs a record in the log: on a full disk the node
    answers its Forget with a failure, and the space stays out of use (the node still lists
    the object). The master sends the Forget again until the node can write it: once the
    operator frees the disk, the space returns with no remount."""
    cluster = cluster_factory(0, "64MiB")
    node = cluster.add_node(extra=["--nvme", str(small_disk / "nvme"), "--nvme-size", "32MiB"])
    with Client(cluster.master_address, timeout=30) as client:
        value = os.urandom(MiB)
        assert client.put("kept", value, tier="nvme") == 1
        fill_disk(small_disk / "hog")
        for fillers in (f"k{n:05d}-{LONG}" for n in range(5000)), (f"{n:04d}" for n in range(9999)):
            for filler in fillers:  # until the log's room is spent, to the last record of a
                try:  # key as long as "kept"
                    client.put(filler, b"v" * 64, tier="nvme")
                except KVPoolError:
                    break
            else:
                pytest.fail("the index log never ran out of room")
        full = _nvme_segment(client)

        client.remove("kept")
        time.sleep(3)  # (the Forget failed, and was sent again, at least once)
        assert _nvme_segment(client).used >= full.used - 1024, "quarantined, not reused"

        os.unlink(small_disk / "hog")  # the operator frees the disk
        assert wait_until(lambda: _nvme_segment(client).used < full.used - MiB // 2, timeout=40)
        assert not client.exists("kept")
    assert node.alive()
