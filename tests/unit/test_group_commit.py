"""Records of one segment that arrive while another is being made durable share the next
commit; a caller returns once its own items are committed, or raises what their commit raised."""

from __future__ import annotations

import threading

import pytest

from kvpool.storage_node.group_commit import GroupCommit

WAIT = 10.0  # seconds: a deadline for every wait below, never reached when all is well


class Disk:
    """A commit that the test holds until it lets it go, and that remembers what it got."""

    def __init__(self) -> None:
        self.commits: list[list[str]] = []
        self.entered = threading.Semaphore(0)
        self.gate = threading.Event()

    def commit(self, items: list[str]) -> None:
        self.entered.release()
        assert self.gate.wait(WAIT)
        if "bad" in items:
            raise OSError("the disk failed")
        self.commits.append(items)


def start(group: GroupCommit[str], items: list[str], outcomes: dict[str, object]):
    def call() -> None:
        try:
            group(items)
            outcomes[items[0]] = "committed"
        except OSError as error:
            outcomes[items[0]] = error

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def queued(group: GroupCommit[str], count: int) -> bool:
    """Whether ``count`` callers wait behind the running commit (polled, with a deadline)."""
    event = threading.Event()
    for _ in range(int(WAIT / 0.005)):
        with group._changed:
            if len(group._queue) == count:
                return True
        event.wait(0.005)
    return False


def test_a_caller_alone_commits_at_once_with_nothing_added():
    disk = Disk()
    disk.gate.set()
    group = GroupCommit(disk.commit)
    group(["a"])
    group(["b", "c"])
    assert disk.commits == [["a"], ["b", "c"]]
    assert (group.commits, group.batches) == (2, 2)


def test_callers_arriving_during_a_commit_share_the_next_one():
    disk = Disk()
    group = GroupCommit(disk.commit)
    outcomes: dict[str, object] = {}
    first = start(group, ["a"], outcomes)
    assert disk.entered.acquire(timeout=WAIT), "the first caller commits at once"
    others = [start(group, [key, key + "2"], outcomes) for key in ("b", "c", "d")]
    assert queued(group, 3)
    disk.gate.set()
    for thread in [first, *others]:
        thread.join(WAIT)
    assert outcomes == dict.fromkeys("abcd", "committed")
    assert disk.commits[0] == ["a"]
    assert sorted(disk.commits[1]) == ["b", "b2", "c", "c2", "d", "d2"], "one commit for three"
    assert (group.commits, group.batches) == (2, 4)


def test_a_failed_commit_fails_every_caller_of_its_group_and_no_other():
    disk = Disk()
    group = GroupCommit(disk.commit)
    outcomes: dict[str, object] = {}
    first = start(group, ["a"], outcomes)
    assert disk.entered.acquire(timeout=WAIT)
    failing = [start(group, ["bad"], outcomes), start(group, ["b"], outcomes)]
    assert queued(group, 2)
    disk.gate.set()
    for thread in [first, *failing]:
        thread.join(WAIT)
    assert outcomes["a"] == "committed"
    assert isinstance(outcomes["bad"], OSError) and isinstance(outcomes["b"], OSError)
    group(["later"])  # the group is not stuck after a failure
    assert disk.commits == [["a"], ["later"]]


def test_an_empty_batch_is_committed_too():
    disk = Disk()
    disk.gate.set()
    group = GroupCommit(disk.commit)
    group([])
    assert disk.commits == [[]]


@pytest.mark.parametrize("callers", [16])
def test_many_callers_each_return_once_their_items_are_committed(callers):
    committed: set[str] = set()
    lock = threading.Lock()

    def commit(items: list[str]) -> None:
        with lock:
            committed.update(items)

    group = GroupCommit(commit)
    seen_committed: dict[str, bool] = {}

    def call(key: str) -> None:
        group([key])
        with lock:
            seen_committed[key] = key in committed

    threads = [threading.Thread(target=call, args=(f"k{i}",)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert seen_committed == {f"k{i}": True for i in range(callers)}
    assert group.batches == callers and group.commits <= callers
