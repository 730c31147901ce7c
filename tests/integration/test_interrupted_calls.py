"""A call interrupted in the caller's thread (Ctrl-C's KeyboardInterrupt, or an exception a
signal handler raises) moves no byte into the caller's memory once it has raised.

Reads of large objects share their copying with helper threads: the client's own copier
(same-host mapping, 8 MiB and more) and the checked stream's connections (several at once
for large transfers). An interrupt lands in the caller's thread while it waits for them;
were it raised at once, they would go on writing into a buffer the caller reuses or frees
(silent corruption of other data, or a crash). Here each read is interrupted at a random
moment; the caller then fills its buffer with a canary, and nothing may change it.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import wait_until

from kvpool import Client
from kvpool.errors import KVPoolError

SIZE = 64 << 20
CANARY = 0xEE


class Interrupted(BaseException):
    """What a signal handler raises in the caller's thread (as KeyboardInterrupt is)."""


@pytest.fixture
def interrupt_after() -> Iterator[callable]:
    armed = [False]

    def handler(signum, frame):
        if armed[0]:
            armed[0] = False
            raise Interrupted

    previous = signal.signal(signal.SIGALRM, handler)

    def arm(seconds: float) -> None:
        armed[0] = True
        signal.setitimer(signal.ITIMER_REAL, seconds)

    yield arm
    armed[0] = False
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("mapping", [True, False], ids=["mapped segment", "checked stream"])
def test_an_interrupted_read_writes_nothing_into_the_buffer_after_it_raised(
    shared_cluster, interrupt_after, mapping
):
    rng = random.Random(7)
    with Client(shared_cluster.master_address, same_host_mapping=mapping, timeout=20) as client:
        key = f"interrupted-{int(mapping)}"
        client.put(key, np.full(SIZE, 0x5A, dtype=np.uint8))
        buffer = np.zeros(SIZE, dtype=np.uint8)
        started = time.monotonic()
        client.get_into(key, buffer)
        one_read = time.monotonic() - started
        assert bool(mapping) == bool(client.mapped_segments)
        interrupted, late = 0, []
        for attempt in range(30):
            buffer = np.zeros(SIZE, dtype=np.uint8)
            try:
                interrupt_after(rng.uniform(0.0002, one_read))
                client.get_into(key, buffer)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupted:
                interrupted += 1
                buffer[:] = CANARY  # the caller reuses its buffer at once
                time.sleep(0.05)
                if changed := int((buffer != CANARY).sum()):
                    late.append((attempt, changed))
        assert interrupted >= 5, "the reads were interrupted (else this shows nothing)"
        assert late == [], "(attempt, bytes written after the call raised)"
        assert client.get(key) == b"\x5a" * SIZE, "the client still reads right"
    with Client(shared_cluster.master_address) as other:
        other.remove(key)  # (no force: the reader gave back its leases, interrupted reads' too)


def _reserved(client: Client, key: str) -> bool:
    return any(event.event == "reserved" for event in client.story(key))


def _put_start_answers(client: Client) -> list[None]:
    """Grows by one each time the master's answer to a PutStart of ``client`` came back."""
    answers: list[None] = []
    link = client._session.link
    call = link.call

    def counted(method, request, deadline):
        answer = call(method, request, deadline)
        if method == "PutStart":
            answers.append(None)
        return answer

    link.call = counted
    return answers


def _last_event(client: Client, key: str) -> str:
    """The last event of the key's story ("" where it has none)."""
    events = client.story(key)
    return events[-1].event if events else ""


def _still_reserved(client: Client, key: str) -> bool:
    """Whether the key's last put is reserved still: its writer never committed it."""
    events = [event.event for event in client.story(key)]
    return bool(events) and events[-1] == "reserved"


def test_a_put_whose_deadline_passes_mid_write_leaves_its_key_free(shared_cluster):
    """Its PutEnd still goes (the writes failed as timed out), so the master frees the
    reservation at once: a put of the same key right after succeeds, rather than being
    refused as "already being written" until the write timeout runs out."""
    value = np.full(SIZE, 0x33, dtype=np.uint8)
    address = shared_cluster.master_address
    with Client(address, same_host_mapping=False) as patient:
        patient.put("warm-up", value)  # (connections made, segments known)
        patient.remove("warm-up", force=True)
        missed = 0
        for attempt, timeout in enumerate([0.005, 0.01, 0.02, 0.03, 0.05, 0.08] * 2):
            key = f"hurried-{attempt}"
            with Client(address, same_host_mapping=False, timeout=timeout) as hurried:
                try:
                    hurried.put(key, value)
                except KVPoolError:
                    if _still_reserved(patient, key):
                        # (its PutStart's answer came after the deadline, on a loaded
                        # machine: the client never learned its put, which its write
                        # timeout ends; not what this test is about)
                        patient.remove(key, force=True)
                    else:
                        missed += _reserved(patient, key)  # (reserved, then out of time)
                else:
                    patient.remove(key, force=True)  # (it made it)
            assert patient.put(key, value) >= 1, "the key is free again at once"
            assert patient.get(key) == value.tobytes()
            patient.remove(key, force=True)
        assert missed, "some put reserved and then missed its deadline (else this shows nothing)"


def test_an_interrupted_put_gives_its_reservation_back(shared_cluster, interrupt_after):
    rng = random.Random(11)
    value = np.full(SIZE, 0x44, dtype=np.uint8)
    with Client(shared_cluster.master_address, same_host_mapping=False) as client:
        answered = _put_start_answers(client)
        started = time.monotonic()
        client.put("timed-put", value)
        one_put = time.monotonic() - started
        client.remove("timed-put", force=True)
        interrupted = 0
        for attempt in range(12):
            key = f"interrupted-put-{attempt}"
            before = len(answered)
            try:
                interrupt_after(rng.uniform(0.0002, one_put))
                client.put(key, value)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupted:
                interrupted += _reserved(client, key)
            # An interrupt after the commit was sent leaves it to the master, which may still
            # await its node (under load): settled, it is published (removed here) or gone.
            assert wait_until(lambda key=key: _last_event(client, key) != "committed", 10)
            if len(answered) == before and _last_event(client, key) == "reserved":
                # (interrupted before PutStart's answer came: the client never learnt of
                # its reservation, which runs out at the write timeout)
                client.remove(key, force=True)
            if client.exists(key, lease=False):  # (it had committed when interrupted)
                client.remove(key, force=True)
            assert client.put(key, value) >= 1, "the key is free again at once"
            client.remove(key, force=True)
        assert interrupted, "some put was interrupted after its reservation"


def test_the_leases_of_a_read_cut_short_are_given_back_when_its_client_closes(shared_cluster):
    """A read cancelled (or interrupted) after the master granted its leases, before its
    bytes came: closing the client gives those leases back too, so that the object can be
    removed at once rather than when the lease runs out."""
    from kvpool.client.cancellation import CallCancelled, CancelScope, run_in_scope

    address = shared_cluster.master_address
    with Client(address) as owner:
        owner.put("cut-short", b"z" * 4096)
        reader = Client(address, lease_ttl=60)
        scope = CancelScope()
        link = reader._session.link
        call = link.call

        def cancelled_once_leased(method, request, deadline):
            answer = call(method, request, deadline)
            if method == "GetReplicas":
                scope.cancel()  # (as an asyncio cancel landing during the lookup does)
            return answer

        link.call = cancelled_once_leased
        with pytest.raises(CallCancelled):
            run_in_scope(scope, lambda: reader.get("cut-short"))
        reader.close()
        owner.remove("cut-short")  # (no force: no lease is left)
