"""The helper threads of one call that touch its caller's memory, waited for through
interrupts.

A call that hands parts of a copy to helper threads must not return, or raise, while they
still read or write the caller's buffer. A ``KeyboardInterrupt`` (Ctrl-C), or an exception a
signal handler raises, lands in the caller's thread wherever it is: while it submits the
helpers, copies its own share or waits for theirs. Raised at once, it would leave helpers
copying into memory the caller may reuse or free (silent corruption of unrelated data, or a
crash). ``Helpers`` counts the helpers that have started; ``stop_and_wait`` keeps those not
started yet from starting and waits for the others (each is bounded by its call's
deadline) whatever is raised meanwhile; ``wait`` waits for all and raises an interrupt it
held only then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any


class Helpers:
    """Usage: ``with Helpers(pool) as helpers: helpers.submit(...); own share``: leaving the
    block waits for every helper (``wait``), or, when the block raised, for those that
    started (``stop_and_wait``) before the exception goes on. ``stopped``: tells helpers
    that look at it to end early.

    An interrupt can land as ``__exit__`` is entered, before it waits (Python runs signal
    handlers at a function's entry too): it would leave the block with helpers running.
    So the block goes inside ``try: ... except BaseException: helpers.stop_and_wait();
    raise``, which waits for them then. (tests/integration/test_interrupted_calls.py, which
    interrupts reads at random points, twice saw bytes written into a buffer after the call
    had raised: this window is the one found that allows it.)"""

    def __init__(self, pool: futures.Executor) -> None:
        self._pool = pool
        self._changed = threading.Condition()
        self._running = 0
        self.stopped = False
        self.futures: list[futures.Future[Any]] = []

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.wait()
        else:  # (an interrupt, or an error of the caller's own share: raised once none runs)
            self.stop_and_wait()

    def submit(self, work: Callable[..., Any], *args: Any) -> None:
        self.futures.append(self._pool.submit(self._run, work, args))

    def _run(self, work: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        with self._changed:
            if self.stopped:
                return None  # (the caller has given up: it touches nothing)
            self._running += 1
        try:
            return work(*args)
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def wait(self) -> None:
        """Returns once every helper is done; raises, after that, an exception raised in
        this thread while it waited (an interrupt), the helpers told to stop early."""
        held: BaseException | None = None
        for future in self.futures:
            while not future.done():
                try:
                    futures.wait([future])
                except BaseException as interrupt:  # (raised in this thread)
                    if held is None:
                        held = interrupt
                        self.stopped = True
        if held is not None:
            raise held

    def stop_and_wait(self) -> None:
        """Keeps the helpers not started yet from starting; returns once those that
        started have ended, whatever is raised in this thread meanwhile."""
        self.stopped = True
        while True:
            try:
                with self._changed:
                    self._changed.wait_for(lambda: self._running == 0)
                return
            except BaseException:  # (a second interrupt: the memory is still in use)
                continue
