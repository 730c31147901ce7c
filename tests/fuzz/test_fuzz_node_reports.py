"""What a storage node reports when it mounts a segment, generated and sent to a real
``kvpool master``: segments of every shape, and the objects they say they hold (overlapping,
past the segment's end, repeated, with keys of every kind).

The master adopts only what fits: every object it keeps on the reported segment lies inside
it and overlaps no other it kept there, and ``dropped_keys`` names only reported keys. The
node is a fake one with a real node token (what a broken or taken-over node holds), and its
mount a remount, so that the master fences the segment's space.
"""

from __future__ import annotations

import itertools

import grpc
import pytest
from fuzzing import FUZZ_NODE, Watch, fuzz_settings, integers, messages, share, steer_clear
from hypothesis import event, given
from hypothesis import strategies as st

from kvpool.proto import master_pb2 as pb
from kvpool.security.identity import Role

SURFACE = "node_reports"
pytestmark = pytest.mark.fuzz
SETTINGS = fuzz_settings(share(1))

UNEXPECTED = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
numbers = itertools.count()

small_offsets = st.one_of(integers(0, 2**64 - 1), st.integers(0, 1 << 20), st.integers(0, 4096))
objects = st.one_of(
    messages(pb.StoredObject.DESCRIPTOR),
    st.builds(
        pb.StoredObject,
        key=st.text(min_size=1, max_size=3),
        offset=small_offsets,
        size=small_offsets,
        generation=integers(0, 2**64 - 1),
    ),
)


#: Segments the master takes, and generated ones that it may refuse.
segments = st.one_of(
    st.builds(
        pb.Segment,
        host=st.sampled_from(["", "fuzzhost"]),
        worker_address=st.binary(min_size=1, max_size=8),
        base_address=st.one_of(integers(0, 2**64 - 1), st.just(1 << 40)),
        rkey=st.binary(max_size=8),
        tier=st.sampled_from([pb.TIER_UNSPECIFIED, pb.DRAM, pb.NVME]),
        persistent=st.booleans(),
    ),
    messages(pb.Segment.DESCRIPTOR),
)


@SETTINGS
@given(
    segment=segments,
    size=st.one_of(integers(0, 2**64 - 1), st.integers(1, 1 << 20)),
    stored=st.lists(objects, max_size=24),
    silent_ms=integers(0, 2**64 - 1),
    then=st.sampled_from(["stay", "heartbeat", "unmount"]),
)
def test_generated_mounts_adopt_only_objects_that_fit(
    watch: Watch, segment, size, stored, silent_ms, then
):
    number = next(numbers)
    segment.node_id = FUZZ_NODE
    segment.segment_id = f"fuzz-segment-{number}"
    segment.size = size
    request = pb.MountSegmentRequest(segment=segment, objects=stored, remount=True)
    request.silent_ms = silent_ms
    steer_clear(request, watch.node_ids)
    try:
        answer = watch.stub.MountSegment(request, timeout=30, metadata=watch.metadata[Role.NODE])
    except grpc.RpcError as error:
        event(f"mount refused: {error.code().name} {error.details()[:30]}")
        assert error.code() not in UNEXPECTED, f"{error.code()} {error.details()}"
    else:
        reported = {o.key for o in request.objects}
        assert set(answer.dropped_keys) <= reported, "dropped keys it was not told of"
        kept_here(watch, segment, reported - set(answer.dropped_keys))
        if then == "heartbeat":
            watch.stub.Heartbeat(
                pb.HeartbeatRequest(node_id=segment.node_id, segment_ids=[segment.segment_id]),
                timeout=30,
                metadata=watch.metadata[Role.NODE],
            )
        left = [segment.segment_id] if then == "unmount" else []
        if not left:
            mounted.append(segment.segment_id)
            if len(mounted) >= 32:  # (a node has a bounded number of segments mounted)
                left, mounted[:] = list(mounted), []
        for segment_id in left:
            watch.stub.UnmountSegment(
                pb.UnmountSegmentRequest(node_id=FUZZ_NODE, segment_id=segment_id),
                timeout=30,
                metadata=watch.metadata[Role.NODE],
            )
    watch.after_case()


#: The fuzz node's segments still mounted (unmounted in bunches: a node holds at most 64).
mounted: list[str] = []


def kept_here(watch: Watch, segment: pb.Segment, keys: set[str]) -> None:
    """The objects kept on ``segment`` lie inside it and do not overlap."""
    spans = []
    for key in keys:
        stat = watch.stub.Stat(pb.StatRequest(key=key), timeout=30, metadata=watch.admin)
        for replica in stat.replicas:
            if replica.segment_id == segment.segment_id:
                start = replica.address - segment.base_address
                spans.append((start, start + stat.size, key))
                assert replica.address >= segment.base_address, (key, replica, segment.size)
                assert start + stat.size <= segment.size, (key, start, stat.size, segment.size)
    event(f"objects kept on the segment: {min(len(spans), 3)}{'+' if len(spans) >= 3 else ''}")
    spans.sort()
    for (_, end, key), (start, _, other) in itertools.pairwise(spans):
        assert end <= start, f"{key} and {other} overlap on the segment"
