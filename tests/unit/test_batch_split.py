"""A per-key request larger than the master takes goes as several calls, answered as one."""

from __future__ import annotations

import pytest

from kvpool.client import batch_split
from kvpool.errors import TransferError
from kvpool.proto import master_pb2 as pb


def test_parts_carry_the_keys_in_order_and_every_other_field_each():
    request = pb.PutStartRequest(
        client_id="c", keys=[f"k{i}" for i in range(7)], sizes=list(range(7)), replicas=2
    )
    sent: list[pb.PutStartRequest] = []

    def call(part: pb.PutStartRequest) -> pb.PutStartResponse:
        sent.append(part)
        return pb.PutStartResponse(
            slots=[pb.PutSlot(put_id=size) for size in part.sizes],
            segments=[pb.Segment(segment_id="s1", size=len(sent)), pb.Segment(segment_id="s2")],
            write_timeout_ms=10_000 - len(sent),
        )

    response = batch_split.call_in_parts("PutStart", request, call, most=3)

    assert [list(p.keys) for p in sent] == [["k0", "k1", "k2"], ["k3", "k4", "k5"], ["k6"]]
    assert [list(p.sizes) for p in sent] == [[0, 1, 2], [3, 4, 5], [6]]
    assert {(p.client_id, p.replicas) for p in sent} == {("c", 2)}
    assert [slot.put_id for slot in response.slots] == list(range(7))
    # each segment once, as last told; the shortest write window holds for every key
    assert [(s.segment_id, s.size) for s in response.segments] == [("s1", 3), ("s2", 0)]
    assert response.write_timeout_ms == 10_000 - 3


def test_commits_and_leases_split_and_join_too():
    commits = pb.PutEndRequest(
        client_id="c", commits=[pb.PutCommit(key=f"k{i}", put_id=i) for i in range(5)]
    )
    response = batch_split.call_in_parts(
        "PutEnd",
        commits,
        lambda part: pb.PutEndResponse(statuses=[c.put_id % 3 for c in part.commits]),
        most=2,
    )
    assert list(response.statuses) == [0, 1, 2, 0, 1]

    release = pb.ReleaseLeasesRequest(keys=[f"k{i}" for i in range(5)])
    released = batch_split.call_in_parts(
        "ReleaseLeases", release, lambda part: pb.ReleaseLeasesResponse(released=len(part.keys)), 2
    )
    assert released.released == 5


def test_only_per_key_calls_over_the_limit_are_split():
    keys = [f"k{i}" for i in range(4)]
    assert batch_split.too_many_keys("Exists", pb.ExistsRequest(keys=keys), most=3)
    assert not batch_split.too_many_keys("Exists", pb.ExistsRequest(keys=keys[:3]), most=3)
    assert not batch_split.too_many_keys("ListKeys", pb.ListKeysRequest(), most=0)


def test_a_batch_goes_part_by_part_and_a_later_part_failing_answers_for_its_own_keys():
    keys = [f"k{i}" for i in range(7)]
    results: list[object] = [None] * 7
    calls: list[list[int]] = []

    def call(positions):
        calls.append(list(positions))
        if positions[0] == 3:
            raise TransferError("the master did not answer")
        for i in positions:
            results[i] = "done"
        return True

    batch_split.answer_each_part([0, 1, 3, 4, 6], keys.__getitem__, results, call, most=2)
    assert calls == [[0, 1], [3, 4], [6]]
    assert results[0] == results[1] == results[6] == "done"
    for i in (3, 4):
        assert isinstance(results[i], TransferError) and results[i].key == keys[i]
        assert "entries 3 to 4" in str(results[i]) and "did not answer" in str(results[i])


def test_the_first_part_failing_fails_the_whole_batch():
    def call(positions):
        raise TransferError("the master did not answer")

    with pytest.raises(TransferError, match="did not answer"):
        batch_split.answer_each_part([0, 1, 2], str, [None] * 3, call, most=2)


def test_a_part_may_stop_the_batch_having_answered_the_rest_itself():
    calls: list[list[int]] = []

    def call(positions):
        calls.append(list(positions))
        return len(calls) < 2

    batch_split.answer_each_part(list(range(6)), str, [None] * 6, call, most=2)
    assert calls == [[0, 1], [2, 3]]
