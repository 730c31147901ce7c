"""Batches larger than the master takes in one call, sent as several calls and answered as one.

The master refuses a call of more than ``lp.MAX_BATCH_KEYS`` keys: each call runs on its event
loop between every other, and a bound on its keys bounds how long it holds the rest. A caller
of ``put_many`` or ``get_many`` should not have to know that number: the client cuts each
per-key request into parts that size, calls the master once per part (in order, each within
the call's deadline) and joins the answers, entry i still answering key i.

Only the per-key calls are cut: the request's per-key fields are sliced together, the other
fields go with every part. The answers join per-key lists in order; segments are told once
each; a timeout measured from when the request was sent (a write window, a lease) is the
shortest of the parts', so that it holds for every part's keys.

The client's own batch calls (``put_many``, ``get_many``, ``exists_many``, ``remove_many``)
go part by part themselves (``answer_each_part``) rather than through ``call_in_parts``: once a
part has been answered its keys are stored, leased or removed, so a later part that fails gives
its error to its own keys (``part_failed``) instead of the call raising and the answered parts'
results (and leases, to be given back) being lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvpool.common import lane_protocol as lp
from kvpool.common.keys import shown_key
from kvpool.errors import KVPoolError
from kvpool.proto import master_pb2 as pb

#: Per method: the request's per-key fields (sliced together), and the response's per-key
#: field (joined in order).
PER_KEY: dict[str, tuple[tuple[str, ...], str]] = {
    "PutStart": (("keys", "sizes"), "slots"),
    "PutEnd": (("commits",), "statuses"),
    "PutRevoke": (("keys", "put_ids"), "statuses"),
    "GetReplicas": (("keys",), "objects"),
    "Exists": (("keys",), "statuses"),
    "Remove": (("keys",), "statuses"),
    "ReleaseLeases": (("keys",), ""),
}


def too_many_keys(method: str, request: Any, most: int = lp.MAX_BATCH_KEYS) -> bool:
    """Whether ``request`` carries more keys than the master takes in one call."""
    fields = PER_KEY.get(method)
    return fields is not None and len(getattr(request, fields[0][0])) > most


def call_in_parts(
    method: str,
    request: Any,
    call: Callable[[Any], Any],
    most: int = lp.MAX_BATCH_KEYS,
) -> Any:
    """``call(part)`` for each part of ``request`` of at most ``most`` keys, in order; the
    answers joined into one response of ``method``'s type."""
    answers = [call(part) for part in _parts(method, request, most)]
    return _joined(method, answers)


def each_part(count: int, most: int = lp.MAX_BATCH_KEYS) -> Iterator[range]:
    """The positions of each part of a batch of ``count`` keys, in order."""
    for start in range(0, count, most):
        yield range(start, min(start + most, count))


def answer_each_part(
    valid: Sequence[int],
    key_of: Callable[[int], str],
    results: list[Any],
    call: Callable[[Sequence[int]], bool],
    most: int = lp.MAX_BATCH_KEYS,
) -> None:
    """``call(positions)`` for each part of the batch positions ``valid``, in order, each
    part at most ``most`` of them; ``call`` fills ``results`` for its positions and returns
    whether to go on (False: it answered the positions left itself). A part's KVPoolError
    raises when it is the first (nothing is done yet: the call fails as a whole), else it is
    given to each of its keys (``key_of(i)``: position i's key) whose result ``call`` had not
    filled yet (one the master had answered, a refusal, keeps it) and the next part goes on."""
    for part in each_part(len(valid), most):
        positions = valid if len(part) == len(valid) else valid[part.start : part.stop]
        try:
            if not call(positions):
                return
        except KVPoolError as error:
            if not part.start:
                raise
            first, last = positions[0], positions[-1]
            for i in positions:
                if results[i] is None:
                    results[i] = part_failed(error, key_of(i), first, last)


def part_failed(error: KVPoolError, key: str, first: int, last: int) -> KVPoolError:
    """``key``'s error when the part of a batch that held it (the caller's entries ``first``
    to ``last``) failed as a whole: that error, of its type, named for the key."""
    message = (
        f"the part of this batch that held {shown_key(key)} (entries {first} to {last}) "
        f"failed: {error}"
    )
    try:
        return type(error)(message, key=key)
    except TypeError:  # (an error that takes other arguments: itself, shared)
        return error


def _parts(method: str, request: Any, most: int) -> Iterator[Any]:
    fields, _ = PER_KEY[method]
    count = len(getattr(request, fields[0]))
    shell = type(request)()  # the fields every part carries
    shell.CopyFrom(request)
    for name in fields:
        del getattr(shell, name)[:]
    for start in range(0, count, most):
        part = type(request)()
        part.CopyFrom(shell)
        for name in fields:
            getattr(part, name).extend(getattr(request, name)[start : start + most])
        yield part


def _joined(method: str, answers: list[Any]) -> Any:
    _, per_key = PER_KEY[method]
    response = type(answers[0])()
    if method == "ReleaseLeases":
        response.released = sum(a.released for a in answers)
        return response
    for answer in answers:
        getattr(response, per_key).extend(getattr(answer, per_key))
    if method == "PutEnd" and any(a.messages for a in answers):  # (sent only when any has one)
        for answer in answers:
            response.messages.extend(answer.messages or [""] * len(answer.statuses))
    if method in ("PutStart", "GetReplicas"):
        told: dict[str, pb.Segment] = {}
        for answer in answers:
            for segment in answer.segments:
                told[segment.segment_id] = segment  # (the latest word on each)
        response.segments.extend(told.values())
    if method == "PutStart":
        windows = [a.write_timeout_ms for a in answers if a.write_timeout_ms]
        response.write_timeout_ms = min(windows) if windows else 0
    if method == "GetReplicas":
        response.lease_ms = min(a.lease_ms for a in answers)
    if method in ("GetReplicas", "Exists"):
        response.quota_refusal = next((a.quota_refusal for a in answers if a.quota_refusal), "")
    return response
