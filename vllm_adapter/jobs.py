"""Job plumbing of the kvpool tier: a thread per kind of job, results collected once.

vLLM calls a secondary tier from its scheduler thread and forbids blocking there: a submit
only queues the job; a ``Worker`` thread runs it (the transfer itself, through kvpool's
client, with its own deadline), and ``Finished`` keeps each job's result until the scheduler
polls for it. ``Finished`` also counts the jobs not yet answered, which is what ``drain_jobs``
waits for. A job that never runs (its worker stopped first) is still answered, by its
``cancel``, without touching its buffers: vLLM expects a result for every job it submitted.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

R = TypeVar("R")


class Finished(Generic[R]):
    """Results of finished jobs, each handed out once, and the count of unanswered jobs."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._results: list[R] = []
        self._open = 0

    def opened(self) -> None:
        """A job was submitted: it is unanswered until ``finish``."""
        with self._changed:
            self._open += 1

    def finish(self, result: R) -> None:
        with self._changed:
            self._results.append(result)
            self._open -= 1
            self._changed.notify_all()

    def take(self) -> list[R]:
        """Every result finished since the last call (never blocks)."""
        with self._changed:
            results, self._results = self._results, []
            return results

    def unanswered(self) -> int:
        with self._changed:
            return self._open

    def wait_answered(self, timeout: float | None = None) -> bool:
        """Waits until every submitted job is answered; False if ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: self._open == 0, timeout)


@dataclass(slots=True)
class Job(Generic[R]):
    """``run`` does the job and returns its result; ``cancel`` returns a failure result
    without touching the job's buffers (for a job that never ran, or whose run raised)."""

    run: Callable[[], R]
    cancel: Callable[[], R]


class Worker(Generic[R]):
    """One thread running jobs in submission order (so jobs of one kind never compete for a
    kvpool client), answering each into ``finished``."""

    def __init__(self, name: str, finished: Finished[R]) -> None:
        self.name = name
        self._finished = finished
        self._queue: queue.SimpleQueue[Job[R] | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job[R]) -> None:
        self._finished.opened()
        if self._stopping.is_set():
            self._answer(job.cancel)
            return
        self._queue.put(job)

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    def stop(self) -> None:
        """Cancels the queued jobs and waits for the running one (bounded by its deadline)."""
        self._stopping.set()
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                break
            self._answer(job.cancel if self._stopping.is_set() else job.run, job.cancel)
        while True:  # submitted after the sentinel
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._answer(job.cancel)

    def _answer(self, step: Callable[[], R], fallback: Callable[[], R] | None = None) -> None:
        try:
            result = step()
        except Exception:  # a job must never kill its worker, nor go unanswered
            logger.exception("kvpool tier: a %s job failed", self.name)
            if fallback is None:
                raise
            result = fallback()
        self._finished.finish(result)
