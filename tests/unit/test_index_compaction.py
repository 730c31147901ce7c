"""A durable index compacts its log while the node runs, not only when it opens: puts and
removals that go on for weeks leave a log a few times the size of its live entries, never
one record per operation ever made. A compaction is atomic (a new file renamed over the
log), so the log a crash leaves reads back whole, before or after one; a file system with no
room for the new file leaves the old log serving, and the appends go on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpool.storage_node import object_index
from kvpool.storage_node.index_log import Entry
from kvpool.storage_node.object_index import DurableIndex, live_entries
from kvpool.storage_node.private_files import make_private_directory

HEADER = {"segment_id": "n1/nvme-0001", "size": 1 << 30, "tier": "nvme"}
COMPACT_AT = 64 << 10


@pytest.fixture
def path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(object_index, "COMPACT_AT", COMPACT_AT)
    return make_private_directory(tmp_path / "segment") / "segment.index"


def entry(n: int, generation: int) -> Entry:
    return Entry(f"key-{n % 100}", 4096 * (n % 100), 4096, generation, 7)


def churn(index: DurableIndex, rounds: int) -> dict[str, Entry]:
    """Puts over 100 keys again and again, removing every third: what stays live."""
    live: dict[str, Entry] = {}
    for n in range(rounds):
        put = entry(n, n + 1)
        index.put([put])
        live[put.key] = put
        if n % 3 == 0:
            index.delete([put])
            del live[put.key]
    return live


def test_a_long_run_of_puts_and_removals_keeps_the_log_near_its_live_entries(path):
    index = DurableIndex(path, HEADER)
    live = churn(index, 20_000)  # some 2 MiB of records, for 100 keys
    assert index.compactions >= 5
    logged = path.stat().st_size - object_index.ROOM  # (less the zeros written ahead)
    assert logged < COMPACT_AT + object_index.COMPACT_RATIO * 100 * 200, "bounded"
    assert {e.key: e for e in index.entries()} == live
    index.close()
    assert live_entries(path) == live
    reopened = DurableIndex(path, HEADER)
    assert {e.key: e for e in reopened.entries()} == live
    assert (reopened.damaged_records, reopened.undecodable_records) == (0, 0)
    reopened.close()


def test_the_log_a_crash_leaves_after_a_compaction_reads_back_whole(path):
    index = DurableIndex(path, HEADER)
    live = churn(index, 5_000)
    assert index.compactions >= 1
    crashed = path.read_bytes()  # as a killed node leaves it
    index.close()
    path.write_bytes(crashed)
    reopened = DurableIndex(path, HEADER)
    assert {e.key: e for e in reopened.entries()} == live
    assert reopened.damaged_records == 0
    reopened.close()


def test_an_older_generation_still_never_replaces_a_newer_one_across_a_compaction(path):
    index = DurableIndex(path, HEADER)
    newer = Entry("kept", 0, 4096, 10**6, 9)
    index.put([newer])
    churn(index, 5_000)
    assert index.compactions >= 1
    assert index.put([Entry("kept", 8192, 4096, 5, 1)]) == [], "a late Persist of an older put"
    index.close()
    assert live_entries(path)["kept"] == newer


def test_no_room_for_the_new_log_leaves_the_old_one_serving(path, monkeypatch):
    index = DurableIndex(path, HEADER)

    def no_room(_: object) -> int:
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(object_index.private_files, "create_new", no_room)
    live = churn(index, 5_000)
    assert index.compactions == 0
    assert not path.with_name(path.name + object_index.TMP_SUFFIX).exists()
    index.close()
    assert live_entries(path) == live


def no_room_for_new_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file system is full: a new file cannot be made (the log's own blocks stay)."""

    def no_room(_: object) -> int:
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(object_index.private_files, "create_new", no_room)


def test_a_full_disk_at_open_keeps_an_intact_log_and_appends_after_its_last_record(
    path, monkeypatch
):
    index = DurableIndex(path, HEADER)
    live = churn(index, 300)
    index.close()
    no_room_for_new_files(monkeypatch)

    reopened = DurableIndex(path, HEADER)  # (the compaction on open has no room: it opens)

    assert {e.key: e for e in reopened.entries()} == live
    later = Entry("later", 1 << 20, 4096, 10_000, 7)
    reopened.put([later])
    gone = live.pop(next(iter(live)))
    reopened.delete([gone])
    reopened.close()
    monkeypatch.undo()
    assert live_entries(path) == {**live, "later": later}, "the appends read back"
    assert {e.key for e in DurableIndex(path, HEADER).entries()} == {*live, "later"}


@pytest.mark.parametrize("append", [True, False], ids=["then appended to", "then closed"])
def test_a_kept_log_whose_last_key_ends_in_zeros_keeps_that_record_whole(path, monkeypatch, append):
    """Where the kept log goes on is where its last record ends, not where the zeros after
    it begin: a key may end in NUL bytes, and its record would be cut (by the next append,
    or by the truncation at close) and its object lost."""
    index = DurableIndex(path, HEADER)
    live = {"a": Entry("a", 0, 4096, 1, 5), "zeros\0\0": Entry("zeros\0\0", 4096, 4096, 2, 6)}
    index.put(list(live.values()))
    index.close()
    no_room_for_new_files(monkeypatch)

    reopened = DurableIndex(path, HEADER)
    if append:
        live["later"] = Entry("later", 8192, 4096, 3, 7)
        reopened.put([live["later"]])
    reopened.close()
    monkeypatch.undo()

    assert live_entries(path) == live
    again = DurableIndex(path, HEADER)
    assert again.damaged_records == 0 and not again.unconfirmed
    again.close()


def test_a_full_disk_at_open_with_a_damaged_log_names_the_log_and_the_room_to_free(
    path, monkeypatch
):
    index = DurableIndex(path, HEADER)
    churn(index, 300)
    index.close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # (a record in the middle rots: the log must be rewritten)
    path.write_bytes(data)
    no_room_for_new_files(monkeypatch)

    with pytest.raises(OSError) as refused:
        DurableIndex(path, HEADER)

    message = str(refused.value)
    assert str(path) in message
    assert "damaged" in message
    assert f"about {len(data) + object_index.ROOM} bytes free" in message
