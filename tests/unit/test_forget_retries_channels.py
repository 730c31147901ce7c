"""Failed Forgets sent again (master/forget_retries.py): those a same-host writer's lock
failed wait on a channel of their own, and a Forget that fails on one channel and then on
the other leaves neither waiting on it for good."""

from __future__ import annotations

import types

from kvpool.master.forget_retries import WRITER, ForgetRetries
from kvpool.master.records import ForgetCommand

SEGMENT = types.SimpleNamespace(node_id="n1")


def current(segment_id: str):
    return SEGMENT


def forget(command_id: int) -> ForgetCommand:
    return ForgetCommand(command_id, "n1", "n1/dram0", ())


def test_a_writers_forget_is_not_sent_again_when_another_forget_succeeds():
    retries = ForgetRetries()
    retries.failed(forget(1), current, 0.0, WRITER)
    assert retries.succeeded(forget(2), current) == [], "the disk log's success says nothing"
    assert [f.command_id for f in retries.due(1.0, current)] == [1]


def test_a_probe_that_fails_on_the_other_channel_leaves_neither_stuck():
    retries = ForgetRetries()
    retries.failed(forget(1), current, 0.0, WRITER)
    [probe] = retries.due(1.0, current)
    retries.failed(forget(3), current, 1.0, WRITER)  # (another, waiting behind the probe)
    retries.failed(probe, current, 1.5, "")  # (its retry failed for the log this time)
    # each channel plans its own next probe: the log's (Forget 1), the writers' (Forget 3)
    assert [f.command_id for f in retries.due(10.0, current)] == [1, 3]
    assert retries.succeeded(forget(1), current) == []  # (the log's probe: nothing waits)
    retries.failed(forget(5), current, 200.0, "")  # a later failure of the log is probed
    assert [f.command_id for f in retries.due(300.0, current)] == [5]
    assert retries.succeeded(forget(3), current) == [], "the writers' probe settles its own"
    assert retries.succeeded(forget(5), current) == [] and not retries
