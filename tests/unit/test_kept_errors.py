"""Errors the engine adapters keep: without their tracebacks, a batch call's failure frees the
memory its frames viewed by reference counting, never through the garbage collector (which
crashes on views with buffers exported; tests/lmcache, tests/sglang and tests/vllm show it
with the adapters themselves)."""

from __future__ import annotations

import gc
import weakref

from kvpool.common.kept_errors import forget_tracebacks
from kvpool.errors import KVPoolError, MasterUnavailable


class Buffer:
    """Stands for the memory a failed call's frames view (weakly referenceable)."""


def _failing_call(buffer: Buffer) -> None:
    view = buffer  # a local of the failed call's frame, as a client's memoryviews are
    try:
        raise ConnectionError("the channel broke")
    except ConnectionError as cause:
        raise MasterUnavailable(f"no answer for {view!r}") from cause


def _as_an_adapter_does(buffer: Buffer, forget: bool) -> list[object]:
    results: list[object]
    try:
        _failing_call(buffer)
        results = [1, 1]
    except KVPoolError as error:
        results = [error] * 2  # one entry per key, each the batch's error
    if forget:
        forget_tracebacks(results)
    return results


def test_errors_kept_without_tracebacks_free_the_failed_calls_frames_at_once():
    gc.disable()  # only reference counting, as between two collections
    try:
        buffer = Buffer()
        gone = weakref.ref(buffer)
        results = _as_an_adapter_does(buffer, forget=True)
        del buffer
        assert gone() is None, "a frame of the failed call is still alive"
        (error, same) = results
        assert error is same and isinstance(error, MasterUnavailable)
        assert error.__traceback__ is None and error.__cause__ is not None
        assert error.__cause__.__traceback__ is None
        assert "no answer" in str(error)  # the message is kept: it is what gets logged
    finally:
        gc.enable()


def test_kept_with_their_tracebacks_only_the_garbage_collector_would_free_them():
    # (what the adapters did: the frames stay until a collection clears the cycle)
    gc.disable()
    try:
        buffer = Buffer()
        gone = weakref.ref(buffer)
        results = _as_an_adapter_does(buffer, forget=False)
        del buffer, results
        assert gone() is not None
        gc.collect()
        assert gone() is None
    finally:
        gc.enable()


def test_successes_and_errors_without_a_traceback_are_left_as_they_are():
    never_raised = KVPoolError("per-key error made, not raised")
    results: list[object] = [3, None, True, never_raised, b"bytes"]
    forget_tracebacks(results)
    assert results == [3, None, True, never_raised, b"bytes"]
    assert never_raised.__traceback__ is None


def test_an_exception_group_and_a_context_lose_their_tracebacks_too():
    try:
        try:
            raise ValueError("first")
        except ValueError:
            raise ExceptionGroup("several", [KeyError("inner")]) from None
    except ExceptionGroup as caught:
        group = caught
    try:
        raise RuntimeError("member")
    except RuntimeError as member:
        group.exceptions[0].__context__ = member
    forget_tracebacks([group])
    assert group.__traceback__ is None
    assert group.__context__ is not None and group.__context__.__traceback__ is None
    assert group.exceptions[0].__context__.__traceback__ is None
