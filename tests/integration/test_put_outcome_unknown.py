"""A put whose commit (PutEnd) the master received but did not answer in time (its process
stopped) says that the put's outcome is unknown, not that the master was merely unavailable:
once it runs again, the master reads the commit waiting in its socket and publishes the
object. Whatever the outcome, it is the one the error leaves open: published with the exact
bytes (a put again then gets ObjectExists), or not published at all.

The master is stopped (SIGSTOP) once PutStart is answered and the bytes written, just before
PutEnd is sent: between ``Reservation.write`` and ``commit``, and for ``put`` by a hook on
the put path's commit.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from helpers import wait_until

from kvpool import Client
from kvpool.client import put_path
from kvpool.errors import (
    MasterUnavailable,
    ObjectExists,
    ObjectNotFound,
    PutAborted,
    PutOutcomeUnknown,
)

TIMEOUT = 2.0


def check_unknown(error: BaseException, key: str) -> None:
    assert isinstance(error, PutOutcomeUnknown) and isinstance(error, MasterUnavailable)
    assert error.key == key and error.keys == (key,)
    message = str(error)
    assert message.startswith("the outcome of the put is unknown"), message
    assert f"{key!r} may have been published" in message, message
    assert "did not answer PutEnd before the deadline" in message, message


def test_a_reservation_commit_the_stopped_master_did_not_answer_says_its_outcome_is_unknown(
    cluster_factory,
):
    cluster = cluster_factory(1, "64MiB")
    data = os.urandom(100_000)
    with Client(cluster.master_address, timeout=TIMEOUT) as client:
        reservation = client.reserve("r", len(data))
        reservation.write(data)
        cluster.master.signal(signal.SIGSTOP)
        try:
            with pytest.raises(PutOutcomeUnknown) as raised:
                reservation.commit()
        finally:
            cluster.master.signal(signal.SIGCONT)
        check_unknown(raised.value, "r")
        assert "Call commit() again" in str(raised.value)

        # The commit again answers as the first (which the master read once it ran again).
        try:
            replicas = reservation.commit()
        except PutAborted:  # (not published: the reservation ran out first)
            with pytest.raises(ObjectNotFound):
                client.get("r")
        else:
            assert replicas == 1 and client.get("r") == data


def test_a_put_whose_commit_the_stopped_master_did_not_answer_says_its_outcome_is_unknown(
    cluster_factory, monkeypatch
):
    cluster = cluster_factory(1, "64MiB")
    data = os.urandom(100_000)
    real_commit = put_path.commit

    def commit_with_the_master_stopped(*args: Any, **kwargs: Any) -> Any:
        cluster.master.signal(signal.SIGSTOP)  # (PutStart answered, the bytes written)
        return real_commit(*args, **kwargs)

    with Client(cluster.master_address, timeout=TIMEOUT) as client:
        monkeypatch.setattr(put_path, "commit", commit_with_the_master_stopped)
        try:
            with pytest.raises(MasterUnavailable) as raised:
                client.put("p", data)
        finally:
            cluster.master.signal(signal.SIGCONT)
            monkeypatch.undo()
        check_unknown(raised.value, "p")
        assert "exists('p')" in str(raised.value)

        # Either outcome is one the error allowed: published whole, or not at all.
        if wait_until(lambda: client.exists("p"), 10.0):
            assert client.get("p") == data
            with pytest.raises(ObjectExists):
                client.put("p", data)
        else:
            with pytest.raises(ObjectNotFound):
                client.get("p")


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "grpc"])
def test_a_revoke_after_an_unanswered_commit_never_reports_a_published_key_free(
    cluster_factory, lane
):
    """A cleanup's ``revoke()`` after a commit that went unanswered: where the master
    published the object meanwhile (it read the commit once it ran again), the revoke says
    the outcome is unknown rather than returning as if the key were free; where it returns,
    the key is free."""
    cluster = cluster_factory(1, "64MiB")
    data = os.urandom(4096)
    with Client(cluster.master_address, timeout=TIMEOUT, metadata_lane=lane) as client:
        reservation = client.reserve("v", len(data))
        reservation.write(data)
        cluster.master.signal(signal.SIGSTOP)
        try:
            with pytest.raises(PutOutcomeUnknown):
                reservation.commit()
        finally:
            cluster.master.signal(signal.SIGCONT)
        client.exists("nothing")  # (the master answers again, the commit read where it came)
        try:
            reservation.revoke()
        except PutOutcomeUnknown as error:
            assert error.key == "v" and "may have reached the master" in str(error)
            # (the reservation stays: a commit again learns the first one's outcome)
            try:
                replicas = reservation.commit()
            except PutAborted:  # (not published: the reservation ran out first)
                assert not client.exists("v")
            else:
                assert replicas == 1 and client.get("v") == data
        else:
            assert not client.exists("v"), "revoke() returned, yet the object is published"
