"""Per-key statuses from the master become the typed errors users catch (client/outcomes.py)."""

from __future__ import annotations

import pytest

from kvpool.client.outcomes import error_for
from kvpool.common.status import KeyStatus
from kvpool.errors import KVPoolError, ObjectNotFound


@pytest.mark.parametrize("status", [s for s in KeyStatus if s is not KeyStatus.OK])
def test_every_status_but_ok_has_its_error_naming_the_key(status):
    error = error_for(status, "the-key", "why")
    assert isinstance(error, KVPoolError)
    assert error.key == "the-key"
    assert "the-key" in str(error)


def test_a_status_this_client_does_not_know_is_an_error_saying_to_upgrade():
    # (protobuf passes a status a newer master added through as a plain number)
    unknown = max(KeyStatus) + 1
    error = error_for(unknown, "the-key", "a newer reason")
    assert type(error) is KVPoolError
    assert f"status {unknown}" in str(error)
    assert "upgrade the client" in str(error)
    assert "a newer reason" in str(error)


def test_not_found_says_what_may_have_happened():
    error = error_for(KeyStatus.NOT_FOUND, "k")
    assert isinstance(error, ObjectNotFound)
    assert "never put" in str(error)
