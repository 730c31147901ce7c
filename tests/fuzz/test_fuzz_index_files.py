"""Index files of a persistent segment, generated and damaged, opened by the storage node's
``DurableIndex`` (in this process: the file is the input, no cluster is needed).

An open either refuses the file with its documented refusal (``LogDamaged``, when neither
copy of the header survives) or succeeds with exactly the objects that the records it could
still read say: every record left intact is recovered, nothing damaged is adopted, the
entries recorded before a lost record that intact ones follow are in doubt (it may have been
their removal), and the log it rewrites opens again to the same objects and the same doubt.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest
from fuzzing import Figures, fuzz_settings, integers, share
from hypothesis import event, example, given
from hypothesis import strategies as st

from kvpool.storage_node.index_log import (
    HEADER_SLOT,
    OP_DELETE,
    OP_PUT,
    SALT_BYTES,
    Entry,
    LogDamaged,
    encode,
    frame,
    header_slots,
)
from kvpool.storage_node.object_index import DurableIndex

SURFACE = "index_files"
pytestmark = pytest.mark.fuzz
SETTINGS = fuzz_settings(share(2))

keys = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12),
    st.sampled_from(["LPVK", "LPVK\x1e\0\0\0", "a" * 1024, "k"]),  # the magic number in a key
)
entries = st.builds(
    Entry,
    key=keys,
    offset=st.one_of(integers(0, 2**64 - 1), st.integers(0, 64)),
    size=integers(0, 2**64 - 1),
    generation=st.one_of(integers(0, 2**64 - 1), st.integers(0, 3)),
    crc32c=st.none() | integers(0, 2**32 - 1),
    replicas=st.one_of(st.just(0), integers(0, 2**32 - 1)),  # (a uint32 on the wire)
)
records = st.lists(st.tuples(st.sampled_from([OP_PUT, OP_PUT, OP_DELETE]), entries), max_size=12)
damage = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(1, 255)),
        st.tuples(st.just("zero"), st.integers(0, 1 << 16), st.integers(1, 64)),
        st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(0)),
        st.tuples(st.just("append"), st.binary(max_size=48), st.just(0)),
    ),
    max_size=4,
)


@pytest.fixture(scope="module")
def place():
    """A private directory on tmpfs where one exists (an open syncs its rewrite)."""
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    figures = Figures(SURFACE)
    with tempfile.TemporaryDirectory(dir=root, prefix="kvpool-fuzz-") as directory:
        os.chmod(directory, 0o700)
        yield Path(directory) / "index", figures
    figures.publish()


def write_log(records: list[tuple[int, Entry]], salt: bytes) -> tuple[bytearray, list]:
    data = bytearray(header_slots(HEADER, salt))
    spans = []
    for op, entry in records:
        start = len(data)
        data += frame(encode(op, entry), salt)
        spans.append((start, len(data), op, entry))
    return data, spans


HEADER = {"segment_id": "fuzz/nvme0", "size": 1 << 30}
NEW_HEADER = {"segment_id": "a new log's header"}


def apply(data: bytearray, damage: list) -> bytes:
    damaged = bytearray(data)
    for kind, where, amount in damage:
        if kind == "append":
            damaged += where
            continue
        at = where % (len(damaged) + 1)
        if kind == "flip" and at < len(damaged):
            damaged[at] ^= amount
        elif kind == "zero":
            damaged[at : at + amount] = bytes(len(damaged[at : at + amount]))
        elif kind == "truncate":
            del damaged[at:]
    return bytes(damaged)


def replay(records: list[tuple[int, Entry]]) -> dict[str, Entry]:
    return {key: entry for key, (entry, _) in replay_with_origins(records).items()}


def replay_with_origins(records: list[tuple[int, Entry]]) -> dict[str, tuple[Entry, int]]:
    """Key -> its live entry and the index of the record that put it there."""
    held: dict[str, tuple[Entry, int]] = {}
    for i, (op, entry) in enumerate(records):
        current = held.get(entry.key)
        if op == OP_PUT:
            if current is None or entry.generation >= current[0].generation:  # (never older)
                held[entry.key] = (entry, i)
        elif current is not None and (current[0].offset, current[0].generation) == (
            entry.offset,
            entry.generation,
        ):
            del held[entry.key]
    return held


def in_doubt(spans: list, kept: list[bool]) -> set[str]:
    """The keys whose live entry was put by an intact record lying before the last lost one
    that intact records follow (that one may have been their removal)."""
    lost_then_kept = [i for i in range(len(spans)) if not kept[i] and any(kept[i + 1 :])]
    if not lost_then_kept:
        return set()
    before = sum(kept[: lost_then_kept[-1]])  # intact records ahead of it
    intact = [(op, e) for (_, _, op, e), whole in zip(spans, kept, strict=True) if whole]
    return {key for key, (_, i) in replay_with_origins(intact).items() if i < before}


def open_index(path: Path) -> DurableIndex | None:
    try:
        return DurableIndex(path, NEW_HEADER)
    except LogDamaged:
        return None


@SETTINGS
@given(records=records, damage=damage, seed=st.integers(0, 2**32 - 1))
@example(  # a damaged byte of a's length stretches its span over b, up to c: b is kept
    records=[(OP_PUT, Entry(key, 8 * i, 1, 1)) for i, key in enumerate("abc")],
    damage=[("flip", 2 * HEADER_SLOT + 4, 31 ^ 74)],
    seed=0,
)
@example(  # a's removal is damaged and c follows: a is back, in doubt
    records=[
        (OP_PUT, Entry("a", 0, 1, 1)),
        (OP_DELETE, Entry("a", 0, 1, 1)),
        (OP_PUT, Entry("c", 8, 1, 2)),
    ],
    damage=[("flip", 2 * HEADER_SLOT + 2 * 43 - 1, 1)],  # (records of 43 bytes: the key's)
    seed=0,
)
def test_a_damaged_index_recovers_every_intact_record_and_adopts_no_other(
    place, records, damage, seed
):
    path, figures = place
    salt = random.Random(seed).randbytes(SALT_BYTES)
    original, spans = write_log(records, salt)
    data = apply(original, damage)
    path.write_bytes(data)
    os.chmod(path, 0o600)

    index = open_index(path)
    headers_left = sum(
        data[s : s + HEADER_SLOT] == original[s : s + HEADER_SLOT] for s in (0, HEADER_SLOT)
    )
    if index is None:
        event("refused: no header")
        assert headers_left == 0, "refused a log whose header survives"
    else:
        kept = [data[start:end] == original[start:end] for start, end, _, _ in spans]
        intact = [(op, e) for (_, _, op, e), whole in zip(spans, kept, strict=True) if whole]
        event(f"records lost: {min(len(spans) - len(intact), 2)}")
        doubt = in_doubt(spans, kept)
        event(f"entries in doubt: {min(len(doubt), 2)}")
        try:
            assert index.header == (HEADER if data else NEW_HEADER)  # empty: a new log
            assert dict_of(index) == replay(intact)
            assert index.unconfirmed == doubt
        finally:
            index.close()
        reopened = open_index(path)
        assert reopened is not None, "the rewritten log is refused"
        try:
            assert dict_of(reopened) == replay(intact), "the rewrite lost or changed objects"
            assert reopened.unconfirmed == doubt, "the rewrite lost the doubt"
        finally:
            reopened.close()
    figures.cases += 1


@SETTINGS
@given(data=st.one_of(st.binary(max_size=10_000), st.binary(max_size=64).map(lambda b: b * 200)))
def test_any_bytes_as_an_index_are_refused_or_read(place, data):
    path, figures = place
    path.write_bytes(data)
    os.chmod(path, 0o600)
    index = open_index(path)
    if index is not None:
        event("opened")
        index.close()
    figures.cases += 1


def dict_of(index: DurableIndex) -> dict[str, Entry]:
    return {entry.key: entry for entry in index.entries()}
