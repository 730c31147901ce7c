"""Task plumbing of an L2 adapter: ids, one worker thread per kind, results handed out once.

LMCache drives an adapter asynchronously: it submits a task, waits for the kind's event fd
to become readable, then collects the result, exactly once. ``Completions`` is one kind's
result box and event fd; ``Worker`` is one kind's thread, which runs tasks in submission
order (so a kind's tasks never compete for the same UCX worker) and cancels what is still
queued when it stops.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from lmcache.logging import init_logger
from lmcache.v1.platform import create_event_notifier

logger = init_logger(__name__)

R = TypeVar("R")


class TaskIds:
    """Task ids unique across every kind of one adapter."""

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            return next(self._counter)


class Completions(Generic[R]):
    """Finished tasks of one kind, each result handed out once; signals its own event fd."""

    def __init__(self) -> None:
        self._notifier = create_event_notifier()
        self._results: dict[int, R] = {}
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        return self._notifier.fileno()

    def finish(self, task_id: int, result: R) -> None:
        with self._lock:
            if self._closed:
                return
            self._results[task_id] = result
            self._notifier.notify()

    def pop(self, task_id: int) -> R | None:
        with self._lock:
            return self._results.pop(task_id, None)

    def pop_all(self) -> dict[int, R]:
        with self._lock:
            results, self._results = self._results, {}
            return results

    def pending(self) -> int:
        with self._lock:
            return len(self._results)

    def close(self) -> None:
        """Drops uncollected results and closes the event fd (after the workers stopped)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._results.clear()
            self._notifier.close()


@dataclass(slots=True)
class Task:
    """Work for a ``Worker``: ``run`` does it and reports its result; ``cancel`` reports it
    undone (a failure, or all misses) without touching its buffers. ``cancel`` also answers
    for a ``run`` that raised, so that no task goes unanswered."""

    run: Callable[[], None]
    cancel: Callable[[], None]


class Worker:
    """One thread running ``Task`` s in order until ``stop``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, task: Task) -> None:
        if self._stopping.is_set():
            task.cancel()
            return
        self._queue.put(task)

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    def backlog(self) -> int:
        return self._queue.qsize() + (1 if self._busy.is_set() else 0)

    def stop(self) -> None:
        """Cancels queued tasks, waits for the running one (bounded by its deadline)."""
        self._stopping.set()
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                break
            if self._stopping.is_set():
                self._guard(task.cancel)
                continue
            self._busy.set()
            try:
                task.run()
            except Exception:  # a task must never kill its worker, nor go unanswered
                logger.exception("kvpool L2 adapter: %s task failed", self.name)
                self._guard(task.cancel)
            finally:
                self._busy.clear()
        while True:  # anything submitted after the sentinel
            try:
                task = self._queue.get_nowait()
            except queue.Empty:
                return
            if task is not None:
                self._guard(task.cancel)

    def _guard(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:
            logger.exception("kvpool L2 adapter: cancelling a %s task failed", self.name)
