"""Group commit: records of one segment that arrive while another is being made durable wait
for it, then share one commit.

Making a record durable is a wait for the disk: the sync of the object's bytes (with the file
system's journal commit when the write allocated blocks) and the sync of its index record.
Each wait costs about the same whether it covers one object or many, so objects whose records
arrive together should share it. The first caller leads: it commits what is queued; callers
arriving meanwhile queue behind it and the next leader, one of them, commits them all at once.
A caller returns when its own objects are durable, or raises what the commit of its group
raised (then none of its objects counts as recorded).

A caller alone commits at once, with no added wait. Callers are the node's command threads,
so the queue holds at most one batch per thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")


@dataclass(slots=True)
class _Batch(Generic[Item]):
    items: list[Item]
    done: bool = False
    error: BaseException | None = field(default=None)


class GroupCommit(Generic[Item]):
    """Calls ``commit`` with the items of every caller queued since its last call, one call
    at a time."""

    def __init__(self, commit: Callable[[list[Item]], None]) -> None:
        self._commit = commit
        self._changed = threading.Condition()
        self._queue: list[_Batch[Item]] = []
        self._leading = False
        #: Commits made, and batches they carried (a group of one is a batch alone).
        self.commits = 0
        self.batches = 0

    def __call__(self, items: list[Item]) -> None:
        """Returns once ``items`` are committed (raises what their commit raised)."""
        mine = _Batch(items)
        with self._changed:
            self._queue.append(mine)
            while not mine.done:
                if self._leading:
                    self._changed.wait()
                else:
                    self._lead()
        if mine.error is not None:
            raise mine.error

    def _lead(self) -> None:
        """Commits the queue (called, and returning, with the lock held)."""
        group, self._queue = self._queue, []
        self._leading = True
        error: BaseException | None = None
        self._changed.release()
        try:
            self._commit([item for batch in group for item in batch.items])
        except BaseException as failure:  # every caller of the group raises it
            error = failure
        finally:
            self._changed.acquire()
            self._leading = False
            self.commits += 1
            self.batches += len(group)
            for batch in group:
                batch.done, batch.error = True, error
            self._changed.notify_all()
