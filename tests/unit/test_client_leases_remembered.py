"""Which read leases a client remembers, to give back when it closes (``Client.close``).

A client notes the keys its gets and lookups leased, the latest ``LEASES_REMEMBERED`` at least
(a bound on its memory) and every key of the call at hand; ``release_leases`` forgets its keys
as it sends them, and notes them again where the master did not take the release. These are
the rules on the client's own table; tests/integration/test_client_read_batches_parts.py and
test_leases_of_exited_readers.py show the leases given back on a real cluster.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kvpool.client.client import LEASES_REMEMBERED, Client
from kvpool.errors import MasterUnavailable


def bare_client() -> Client:
    """A client reduced to its table of leases (no master, no session)."""
    client = Client.__new__(Client)
    client._leases_lock = threading.Lock()
    client._leased = {}
    client._session = type("Session", (), {"client_id": "c"})()
    return client


def test_every_key_of_a_call_is_remembered_even_those_noted_long_before():
    client = bare_client()
    older = [f"old{i}" for i in range(2 * LEASES_REMEMBERED)]
    client._remember_leases(older)
    call = older[:100] + [f"new{i}" for i in range(4900)]  # (100 leased again, at the start)
    client._remember_leases(call)
    assert all(key in client._leased for key in call)
    assert len(client._leased) <= LEASES_REMEMBERED + len(call)


def test_a_key_leased_again_while_its_release_is_under_way_stays_remembered():
    """Another thread's read may lease the key again after the release chose it: its lease
    may reach the master after the release, and is close()'s to give back."""
    client = bare_client()
    client._remember_leases(["k"])
    in_call, go = threading.Event(), threading.Event()

    def call(method: str, request: Any) -> Any:
        in_call.set()
        go.wait(10)
        return type("Answer", (), {"released": 1})()

    client._call = call  # type: ignore[method-assign]
    release = threading.Thread(target=client.release_leases, args=(["k"],))
    release.start()
    assert in_call.wait(10)
    client._remember_leases(["k"])  # (another thread's get)
    go.set()
    release.join(10)
    assert "k" in client._leased


def test_keys_whose_release_failed_are_remembered_for_close():
    client = bare_client()
    client._remember_leases(["a", "b"])

    def call(method: str, request: Any) -> Any:
        raise MasterUnavailable("the master did not answer (made up by the test)")

    client._call = call  # type: ignore[method-assign]
    with pytest.raises(MasterUnavailable):
        client.release_leases(["a", "b"])
    assert set(client._leased) == {"a", "b"}


def test_a_key_leased_again_and_again_stays_among_the_latest():
    client = bare_client()
    client._remember_leases(["hot"])
    for i in range(2 * LEASES_REMEMBERED + 10):
        client._remember_leases([f"k{i}", "hot"] if i % 2 else [f"k{i}"])
    assert "hot" in client._leased
