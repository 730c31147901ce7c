"""A lone master's tombstone records in a file (master/tombstone_file.py): what one run
writes, the next reads back; a record emptied leaves the file; old records are dropped; a
file no master wrote stops the master with what to do; a write that fails refuses the
answers waiting on it."""

from __future__ import annotations

import asyncio
import json
import stat
import time
from pathlib import Path

import pytest

from kvpool.master.tombstone_file import TombstoneFile, TombstoneFileError
from kvpool.master.tombstones import MAX_AGE, DurableRecord


async def written(store: TombstoneFile, segment_ids: set[str]) -> bool:
    outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    store.write(segment_ids, outcome.set_result)
    return await asyncio.wait_for(outcome, 10)


def test_what_one_run_writes_the_next_reads(tmp_path: Path):
    path = tmp_path / "tombstones.json"
    records = {
        "node0/dram-1": DurableRecord(False, {"team/k1": 7}, frozenset({("team/k2", 3)})),
        "node1/dram-2": DurableRecord(True, {}),
    }
    current = dict(records)

    async def scenario() -> tuple[dict, dict, dict]:
        first = TombstoneFile(path)
        assert await first.load() == {}  # (no file yet)
        first.begin(current.get)
        assert await written(first, set(records))
        loaded = await TombstoneFile(path).load()
        del current["node0/dram-1"]  # its segment mounted and was reconciled
        assert await written(first, {"node0/dram-1"})
        first.end()
        after = await TombstoneFile(path).load()
        third = TombstoneFile(path)
        await third.load()
        del current["node1/dram-2"]
        third.begin(current.get)
        assert await written(third, {"node1/dram-2"})
        third.end()
        return loaded, after, await TombstoneFile(path).load()

    loaded, after, emptied = asyncio.run(scenario())
    assert loaded == records
    assert after == {"node1/dram-2": records["node1/dram-2"]}
    assert emptied == {}
    assert not (tmp_path / "tombstones.json.tmp").exists()


def test_a_record_not_written_for_max_age_is_dropped(tmp_path: Path):
    path = tmp_path / "tombstones.json"
    long_ago, lately = time.time() - MAX_AGE - 60, time.time() - 60
    fields = {"distrusted": False, "keys": {"team/k": 1}}
    path.write_text(
        json.dumps(
            {"records": {"gone": {"at": long_ago, **fields}, "away": {"at": lately, **fields}}}
        )
    )
    assert asyncio.run(TombstoneFile(path).load()) == {"away": DurableRecord(False, {"team/k": 1})}


@pytest.mark.parametrize(
    "content",
    [b"", b"not json", b"[]", b'{"records": {"s": {"at": 1}}}', b'{"records": []}', b"{}"],
)
def test_a_file_no_master_wrote_stops_the_master_with_what_to_do(tmp_path: Path, content: bytes):
    path = tmp_path / "tombstones.json"
    path.write_bytes(content)
    with pytest.raises(TombstoneFileError, match="move it away to start without it"):
        asyncio.run(TombstoneFile(path).load())


def test_a_write_that_fails_refuses_its_answers(tmp_path: Path):
    store = TombstoneFile(tmp_path / "no-such-directory" / "tombstones.json")

    async def scenario() -> bool:
        store.begin(lambda _: DurableRecord(False, {"team/k": 1}))
        ok = await written(store, {"node0/dram-1"})
        store.end()
        return ok

    assert asyncio.run(scenario()) is False


def test_a_path_the_master_cannot_write_stops_it_at_start(tmp_path: Path):
    with pytest.raises(TombstoneFileError, match="give --tombstone-file a path in a directory"):
        asyncio.run(TombstoneFile(tmp_path / "no-such-directory" / "tombstones.json").load())


def test_records_past_max_age_leave_the_file_when_it_is_read(tmp_path: Path):
    path = tmp_path / "tombstones.json"
    fields = {"at": time.time() - MAX_AGE - 60, "distrusted": False, "keys": {"team/k": 1}}
    path.write_text(json.dumps({"records": {"gone": fields}}))
    assert asyncio.run(TombstoneFile(path).load()) == {}
    assert json.loads(path.read_text()) == {"records": {}}


def test_only_the_masters_user_may_read_the_file(tmp_path: Path):
    path = tmp_path / "tombstones.json"
    store = TombstoneFile(path)

    async def scenario() -> None:
        await store.load()
        store.begin(lambda _: DurableRecord(False, {"team/secret-prompt-hash": 1}))
        assert await written(store, {"node0/dram-1"})
        store.end()

    asyncio.run(scenario())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not path.with_name(path.name + ".tmp").exists()


def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path: Path):
    path = tmp_path / "tombstones.json"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not the master's")
    path.with_name(path.name + ".tmp").symlink_to(elsewhere)

    assert asyncio.run(TombstoneFile(path).load()) == {}
    assert elsewhere.read_text() == "not the master's"
    assert json.loads(path.read_text()) == {"records": {}}


def test_a_write_that_raises_unexpectedly_refuses_its_answers_and_the_next_one_is_written(
    tmp_path: Path,
):
    # (a bug in building a record must not leave the calls waiting on it unanswered)
    path = tmp_path / "tombstones.json"
    store = TombstoneFile(path)
    calls = [0]

    def record_of(_: str) -> DurableRecord:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyError("a bug")
        return DurableRecord(False, {"team/k": 1})

    async def scenario() -> tuple[bool, bool]:
        store.begin(record_of)
        first = await written(store, {"node0/dram-1"})
        second = await written(store, {"node0/dram-1"})
        store.end()
        return first, second

    assert asyncio.run(scenario()) == (False, True)
