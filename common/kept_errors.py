"""Errors an adapter keeps after catching them, without the frames of the call that failed.

The engine adapters (LMCache, SGLang, vLLM) turn a batch call that fails as a whole into one
error per key, ``results = [error] * n``, so that the per-key code handles both alike; and
they keep per-key errors to count and log them. A caught exception carries its
``__traceback__``, which holds every frame the error went through: the adapter's own frame,
whose ``results`` holds the error again (a reference cycle), and the client's frames, whose
locals are views of the engine's memory (LMCache's L1, SGLang's host pool, vLLM's primary
tier) and cffi buffers exported from those views. Only the garbage collector frees such a
cycle, at a time no one chooses, on whatever thread allocates then; and CPython's collector
cannot clear a memoryview that still has a buffer exported: it reports ``BufferError:
memoryview has 1 exported buffer`` and then crashes the engine process (a segfault). Freed
by reference counting instead, in order, the same objects go without harm.

``forget_tracebacks`` drops the tracebacks of kept errors (and of their causes and
contexts), so that no cycle forms: the type and message are all an adapter uses.
"""

from __future__ import annotations

from collections.abc import Iterable


def forget_tracebacks(results: Iterable[object]) -> None:
    """Drops the traceback of every exception among ``results`` (a batch call's per-key
    results: errors mixed with successes, which are left alone), and of the exceptions
    chained to it (its cause, its context, an exception group's members), which hold
    frames of the same call. Call it as soon as the errors are in hand: until then they keep
    the failed call's frames, and the memory those frames view, alive."""
    pending = [result for result in results if isinstance(result, BaseException)]
    seen: set[int] = set()
    while pending:
        error = pending.pop()
        if id(error) in seen:  # ([error] * n: one error, n entries)
            continue
        seen.add(id(error))
        error.__traceback__ = None
        pending.extend(e for e in (error.__cause__, error.__context__) if e is not None)
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
