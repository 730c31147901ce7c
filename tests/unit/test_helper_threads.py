"""The helper threads of one call, waited for through interrupts (common/helper_threads.py):
the caller's thread goes on only once no helper touches its memory any more, and then
raises the interrupt."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvpool.common.helper_threads import Helpers


class Interrupted(BaseException):
    pass


def _raise(signum, frame):
    raise Interrupted


@pytest.fixture
def alarm():
    previous = signal.signal(signal.SIGALRM, _raise)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_an_interrupt_while_waiting_is_raised_once_every_helper_is_done(alarm):
    with ThreadPoolExecutor(2) as pool:
        helpers = Helpers(pool)
        for _ in range(2):
            helpers.submit(time.sleep, 0.3)
        alarm(0.05)
        with pytest.raises(Interrupted):
            helpers.wait()
        assert all(f.done() for f in helpers.futures)
        assert helpers.stopped, "the helpers were told to end early"


def test_a_helper_not_started_when_the_caller_gives_up_never_starts():
    started = []
    with ThreadPoolExecutor(1) as pool:
        blocker = threading.Event()
        pool.submit(blocker.wait, 5)  # (the pool's one thread is busy)
        helpers = Helpers(pool)
        helpers.submit(started.append, "touched the memory")
        helpers.stop_and_wait()  # returns at once: nothing of this call has started
        blocker.set()
        assert helpers.futures[0].result(timeout=5) is None
    assert started == []


def test_stop_and_wait_waits_for_a_started_helper_through_a_second_interrupt(alarm):
    running = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        helpers = Helpers(pool)
        helpers.submit(lambda: (running.set(), time.sleep(0.3)))
        assert running.wait(5)
        alarm(0.05)
        helpers.stop_and_wait()
        assert helpers.futures[0].done()


def test_without_an_interrupt_every_helper_s_result_stands():
    with ThreadPoolExecutor(2) as pool:
        helpers = Helpers(pool)
        for n in range(3):
            helpers.submit(pow, n, 2)
        helpers.wait()
        assert [f.result() for f in helpers.futures] == [0, 1, 4]
