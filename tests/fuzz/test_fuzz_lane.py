"""The metadata lane of a real ``kvpool master``, fed generated frames over raw TCP.

Whatever a peer sends, the master answers every complete frame (an error status for what it
cannot serve, never INTERNAL), closes the connection at a header announcing more than a
request may hold, and goes on serving everyone else: the watch's probe, canaries, memory
bound and logs (tests/fuzz/fuzzing.py) hold after every case.
"""

from __future__ import annotations

import contextlib
import socket

import pytest
from fuzzing import (
    BINARY,
    FUZZ_NODE,
    FUZZ_NODE_TOKEN,
    Watch,
    frame,
    fuzz_settings,
    integers,
    lane_connect,
    messages,
    read_answers,
    share,
    steer_clear,
)
from hypothesis import given
from hypothesis import strategies as st

from kvpool.common import lane_protocol as lp
from kvpool.proto import master_pb2 as pb

SURFACE = "lane"
pytestmark = pytest.mark.fuzz
SETTINGS = fuzz_settings(share(4))

METHODS = sorted(lp.LANE_METHODS)
requests = st.sampled_from(METHODS).flatmap(
    lambda method: st.tuples(st.just(method), messages(lp.LANE_METHODS[method][1].DESCRIPTOR))
)
call_ids = st.lists(integers(0, 2**32 - 1), min_size=1, max_size=4, unique=True)


def not_utf8(junk: bytes) -> bytes:
    """A client_id (field 1 of every lane request) whose bytes are not UTF-8."""
    text = bytes([0xFF]) + junk[:100]
    return bytes([0x0A, len(text)]) + text


# A complete frame whose header is well formed and whose body or method is not.
junk_frames = st.one_of(
    st.tuples(st.sampled_from(METHODS), BINARY),  # a body that may not parse
    st.tuples(st.sampled_from(METHODS), st.binary(max_size=16).map(not_utf8)),
    st.tuples(  # no such method
        st.integers(0, 255).filter(
            lambda m: m not in lp.LANE_METHODS and m not in (lp.NODE_SESSION, lp.AUTH)
        ),
        st.binary(max_size=64),
    ),
)


def answered(watch: Watch, sock: socket.socket, sent: dict[int, int]) -> None:
    """Every call in ``sent`` (call id -> method) is answered, with a response of its type or
    an error status other than INTERNAL."""
    answers = read_answers(sock, set(sent))
    for call_id, answer in answers.items():
        assert answer.method == sent[call_id], answer
        assert answer.status != lp.INTERNAL, answer.error()
        if answer.status == lp.OK:
            lp.LANE_METHODS[answer.method][2].FromString(answer.body)


def lane_probe(watch: Watch) -> None:
    """The lane still serves: a fresh connection's Exists of the canaries finds them all."""
    request = pb.ExistsRequest(client_id="fuzz-probe", keys=list(watch.canaries), no_lease=True)
    with lane_connect(watch.lane_port) as sock:
        sock.sendall(frame(7, lp.METHOD_IDS["Exists"], request.SerializeToString()))
        answer = read_answers(sock, {7})[7]
    assert answer.status == lp.OK, answer.error()
    assert list(pb.ExistsResponse.FromString(answer.body).statuses) == [pb.OK] * len(watch.canaries)


def finish_case(watch: Watch) -> None:
    lane_probe(watch)
    watch.after_case()


@SETTINGS
@given(calls=st.lists(requests, min_size=1, max_size=4), ids=call_ids, cut=st.integers(0, 64))
def test_generated_requests_of_every_lane_method_are_answered(watch, calls, ids, cut):
    sent: dict[int, int] = {}
    stream = b""
    for call_id, (method, message) in zip(ids, calls, strict=False):
        body = steer_clear(message, watch.node_ids).SerializeToString()
        if len(body) > lp.REQUEST_LIMIT:
            continue
        stream += frame(call_id, method, body)
        sent[call_id] = method
    with lane_connect(watch.lane_port) as sock:
        sock.sendall(stream[:cut])  # pipelined, cut anywhere
        sock.sendall(stream[cut:])
        answered(watch, sock, sent)
    finish_case(watch)


@SETTINGS
@given(
    junk=st.lists(junk_frames, max_size=4),
    status=integers(0, 255),
    last=st.one_of(
        st.none(),
        st.tuples(st.just("oversized"), integers(lp.REQUEST_LIMIT + 1, 2**32 - 1)),
        st.tuples(st.just("truncated"), st.integers(1, 64)),
    ),
)
def test_malformed_frames_are_refused_and_oversized_headers_close(watch, junk, status, last):
    with lane_connect(watch.lane_port) as sock:
        sent = {}
        for call_id, (method, body) in enumerate(junk, start=1):
            sock.sendall(frame(call_id, method, body, status))
            sent[call_id] = method
        answered(watch, sock, sent)
        if last is not None and last[0] == "oversized":
            with contextlib.suppress(OSError):
                sock.sendall(lp.HEADER.pack(last[1], 1, lp.METHOD_IDS["PutStart"], 0) + b"x" * 64)
            sock.settimeout(10)
            with contextlib.suppress(ConnectionError):
                assert sock.recv(1 << 16) == b"", "a header over the limit closes the connection"
        elif last is not None:
            whole = frame(
                99, lp.METHOD_IDS["Exists"], pb.ExistsRequest(keys=["k"] * 8).SerializeToString()
            )
            sock.sendall(whole[: min(last[1], len(whole) - 1)])  # and hang up
    finish_case(watch)


@SETTINGS
@given(
    calls=st.lists(st.tuples(st.integers(0, 3), requests), min_size=1, max_size=8),
    schedule=st.lists(st.integers(0, 3), max_size=40),
    pieces=st.integers(1, 4),
    abandoned=st.sets(st.integers(0, 3), max_size=2),
)
def test_calls_interleaved_across_connections_are_each_answered(
    watch, calls, schedule, pieces, abandoned
):
    socks = [lane_connect(watch.lane_port) for _ in range(4)]
    try:
        chunks: list[list[bytes]] = [[] for _ in socks]
        sent: list[dict[int, int]] = [{} for _ in socks]
        for call_id, (conn, (method, message)) in enumerate(calls, start=1):
            body = steer_clear(message, watch.node_ids).SerializeToString()
            if len(body) > lp.REQUEST_LIMIT:
                continue
            data = frame(call_id, method, body)
            step = max(1, len(data) // pieces)
            chunks[conn] += [data[i : i + step] for i in range(0, len(data), step)]
            sent[conn][call_id] = method
        for conn in [*schedule, *[c for c in range(4) for _ in chunks[c]]]:
            if chunks[conn]:
                socks[conn].sendall(chunks[conn].pop(0))
        for conn in abandoned:  # gone before its answers came
            socks[conn].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            socks[conn].close()
        for conn, sock in enumerate(socks):
            if conn not in abandoned:
                answered(watch, sock, sent[conn])
    finally:
        for sock in socks:
            sock.close()
    finish_case(watch)


@SETTINGS
@given(
    hello=messages(pb.NodeReport.DESCRIPTOR),
    reports=st.lists(
        st.one_of(messages(pb.NodeReport.DESCRIPTOR).map(lambda m: m.SerializeToString()), BINARY),
        max_size=4,
    ),
)
def test_node_sessions_with_generated_hellos_and_reports(watch, hello, reports):
    hello = steer_clear(hello, watch.node_ids)
    if hello.WhichOneof("kind") == "hello":  # (the one node id the fuzzers' token names)
        hello.hello.node_id = FUZZ_NODE
    with lane_connect(watch.lane_port, FUZZ_NODE_TOKEN) as sock:
        sock.sendall(frame(1, lp.NODE_SESSION, hello.SerializeToString()))
        for report in reports:
            if len(report) <= lp.REPORT_LIMIT:
                with contextlib.suppress(OSError):  # (closed at a report that does not parse)
                    sock.sendall(frame(0, lp.NODE_SESSION, report))
    finish_case(watch)
