"""Per-key statuses from the master become the typed errors users catch (client/outcomes.py)."""

from __future__ import annotations

import pytest
from state_helpers import mount, new_state, publish, put

from kvpool.client.outcomes import error_for
from kvpool.common.status import KeyStatus
from kvpool.errors import KVPoolError, ObjectBeingWritten, ObjectExists, ObjectNotFound


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


@pytest.mark.parametrize(
    "key",
    ["plain", "this client's own", "x is being written y", "being written", "é'\"", " exists"],
)
def test_which_put_holds_a_key_is_told_by_the_master_s_words_not_the_key_s(key):
    """The master's refusal quotes the key first, and a key may hold any words: the three
    cases (published; another put's reservation; this client's own) come from its end."""
    state, clock = new_state()  # (the refusals a master core makes)
    mount(state, "n1")
    publish(state, f"t/{key}-published")
    put(state, f"t/{key}-other", client="c2")
    put(state, f"t/{key}-own")
    clock.advance(1.0)
    errors = {
        case: error_for(slot.status, f"{key}-{case}", slot.message)
        for case, slot in (
            (case, put(state, f"t/{key}-{case}")) for case in ("published", "other", "own")
        )
    }
    assert type(errors["published"]) is ObjectExists
    assert type(errors["other"]) is ObjectBeingWritten and "another put" in str(errors["other"])
    own = errors["own"]
    assert type(own) is ObjectBeingWritten and "another put" not in str(own)
    assert str(own).count("this client's own earlier put") == 1, "said once, after the key"
    assert str(own).endswith("put the key again then"), str(own)
