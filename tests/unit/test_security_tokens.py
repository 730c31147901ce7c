"""Bearer tokens: made once, stored as a hash, checked in a dictionary lookup, revoked
within a second without a restart."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from kvpool.security import tokens
from kvpool.security.identity import Identity, Role
from kvpool.security.tokens import (
    CredentialError,
    CredentialStore,
    TokenRecord,
    new_token,
    token_from,
    token_problem,
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    CredentialStore.create(tmp_path / "credentials.json")
    return tmp_path / "credentials.json"


def store_of(path: Path) -> CredentialStore:
    """A store that looks at its file on every call: what a master sees a second later."""
    return CredentialStore(path, check_interval=0.0)


def issue(path: Path, name: str, role: Role = Role.CLIENT, **kwargs: str) -> str:
    if role is Role.CLIENT:
        kwargs.setdefault("tenant", "acme")
    token, record = new_token(name, role, **kwargs)
    CredentialStore(path).add(record)
    return token


# --- the token ------------------------------------------------------------------------------


def test_a_token_is_kvp1_a_12_hex_digit_id_and_a_secret():
    token, record = new_token("alice", Role.CLIENT, tenant="acme")
    prefix, token_id, secret = token.split(".")
    assert prefix == "kvp1"
    assert token_id == record.token_id and len(token_id) == 12
    assert int(token_id, 16) >= 0
    assert len(secret) >= 43  # 256 random bits
    assert token_problem(token) is None


def test_the_record_holds_the_hash_of_the_secret_and_whom_it_stands_for():
    token, record = new_token("node-0", Role.NODE, node_id="node-0")
    assert record.digest != token.split(".")[2]
    assert len(record.digest) == 64
    assert record.identity() == Identity(name="node-0", role=Role.NODE, node_id="node-0")
    assert abs(record.created - time.time()) < 5


@pytest.mark.parametrize(
    ("name", "role", "tenant", "node_id", "says"),
    [
        ("alice", Role.CLIENT, "", "", "give --tenant"),
        ("alice", Role.CLIENT, "Acme/Corp", "", "not a valid tenant name"),
        ("node-0", Role.NODE, "", "", "give --node-id"),
        ("node-0", Role.NODE, "acme", "node-0", "leave --tenant out"),
        ("root", Role.ADMIN, "acme", "", "leave --tenant out"),
        ("root", Role.ADMIN, "", "node-0", "leave --node-id out"),
        ("has space", Role.ADMIN, "", "", "not a valid identity name"),
        ("", Role.ADMIN, "", "", "not a valid identity name"),
        ("alice", "superuser", "", "", "not one of node, client, admin"),
    ],
)
def test_a_token_that_would_stand_for_no_valid_identity_is_refused_saying_what_to_fix(
    name, role, tenant, node_id, says
):
    with pytest.raises(CredentialError, match=says):
        new_token(name, role, tenant=tenant, node_id=node_id)


@pytest.mark.parametrize(
    ("token", "says"),
    [
        (None, "a token is a string"),
        ("", "empty"),
        ("Bearer xyz", "not a kvpool token"),
        ("kvp1.abcdefabcdef", "has 2 parts"),
        ("kvp1.ABCDEF.secretsecretsecretsecretsecretsecret", "not 12 hex digits"),
        ("kvp1.abcdefabcdef.short", "secret"),
        ("kvp1.abcdefabcdef." + "s" * 43 + ".extra", "has 4 parts"),
    ],
)
def test_a_malformed_token_gets_a_message_that_does_not_repeat_it(token, says):
    problem = token_problem(token)
    assert problem is not None and says in problem
    if token:
        assert token not in problem


# --- the store ------------------------------------------------------------------------------


def test_a_token_authenticates_as_its_identity(path):
    token = issue(path, "alice", tenant="acme")
    identity = store_of(path).authenticate(token)
    assert identity == Identity(name="alice", role=Role.CLIENT, tenant="acme")


def test_a_wrong_secret_an_unknown_id_and_garbage_authenticate_as_nobody(path):
    token = issue(path, "alice")
    prefix, token_id, secret = token.split(".")
    store = store_of(path)
    wrong_secret = f"{prefix}.{token_id}.{secret[::-1]}"
    unknown_id = f"{prefix}.{'0' * 12 if token_id != '0' * 12 else '1' * 12}.{secret}"
    for caller in (wrong_secret, unknown_id, "", "kvp1..", "nonsense", token + "x" * 200):
        assert store.authenticate(caller) is None
    assert store.authenticate(None) is None  # type: ignore[arg-type]
    assert store.authenticate(token) is not None


def test_the_file_keeps_only_the_hash_never_the_secret(path):
    token = issue(path, "alice")
    secret = token.split(".")[2]
    text = path.read_text()
    assert secret not in text and token not in text
    [entry] = json.loads(text)["tokens"]
    assert set(entry) == {"token_id", "digest", "name", "role", "tenant", "node_id", "created"}


def test_the_file_is_readable_by_its_owner_only(path):
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    issue(path, "alice")  # rewritten whole
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_create_never_overwrites_a_file(path):
    issue(path, "alice")
    with pytest.raises(CredentialError, match="exists already"):
        CredentialStore.create(path)
    assert [r.name for r in CredentialStore(path).records()] == ["alice"]


def test_revoking_takes_effect_on_a_running_store_without_restart(path):
    token = issue(path, "alice")
    running = store_of(path)
    assert running.authenticate(token) is not None  # and now cached
    assert len(CredentialStore(path).revoke("alice")) == 1  # another process: `kvpool token revoke`
    assert running.authenticate(token) is None


def test_a_new_token_is_accepted_by_a_running_store_without_restart(path):
    running = store_of(path)
    token = issue(path, "bob")
    assert running.authenticate(token) is not None


def test_the_file_is_looked_at_once_a_second_at_most(path):
    token = issue(path, "alice")
    running = CredentialStore(path)  # the default interval: a second
    assert running.authenticate(token) is not None
    CredentialStore(path).revoke("alice")
    assert running.authenticate(token) is not None  # not looked at yet
    deadline = time.monotonic() + 3
    while running.authenticate(token) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running.authenticate(token) is None
    assert time.monotonic() < deadline


def test_revoke_by_id_or_by_every_token_of_a_name(path):
    first = issue(path, "alice")
    second = issue(path, "alice")  # a rotation: the new one made before the old one goes
    third = issue(path, "bob")
    store = store_of(path)
    assert [r.token_id for r in store.revoke(first.split(".")[1])] == [first.split(".")[1]]
    assert store.authenticate(first) is None and store.authenticate(second) is not None
    assert len(store.revoke("alice")) == 1
    assert store.revoke("alice") == []
    assert [r.name for r in store.records()] == ["bob"]
    assert store.authenticate(third) is not None


def test_a_hot_token_costs_a_lookup(path):
    token = issue(path, "alice")
    store = CredentialStore(path)
    store.authenticate(token)
    started = time.perf_counter()
    for _ in range(100_000):
        store.authenticate(token)
    assert time.perf_counter() - started < 1.0  # about 0.1 µs each on a laptop


def test_the_cache_is_bounded(path, monkeypatch):
    monkeypatch.setattr(tokens, "CACHE_SIZE", 8)
    store = store_of(path)
    issued = [issue(path, f"client-{n}") for n in range(20)]
    for token in issued:
        assert store.authenticate(token) is not None
        assert store.cached_tokens <= 8
    assert all(store.authenticate(token) is not None for token in issued)  # evicted: checked


def test_a_file_holds_a_bounded_number_of_tokens(path, monkeypatch):
    monkeypatch.setattr(tokens, "MAX_TOKENS", 3)
    for n in range(3):
        issue(path, f"client-{n}")
    with pytest.raises(CredentialError, match="the limit"):
        issue(path, "one-too-many")


def test_a_missing_or_malformed_file_is_refused_at_start_saying_how_to_make_one(tmp_path):
    with pytest.raises(CredentialError, match="does not exist: create it with `kvpool token"):
        CredentialStore(tmp_path / "nothing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CredentialError, match="is not JSON"):
        CredentialStore(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(CredentialError, match="not a kvpool credentials file"):
        CredentialStore(tmp_path / "other.json")
    (tmp_path / "newer.json").write_text('{"version": 2, "tokens": []}')
    with pytest.raises(CredentialError, match="version 2"):
        CredentialStore(tmp_path / "newer.json")
    entry = {"token_id": "abcdefabcdef", "digest": "0" * 64, "name": "x", "role": "client"}
    (tmp_path / "tenantless.json").write_text(json.dumps({"version": 1, "tokens": [entry]}))
    with pytest.raises(CredentialError, match="give --tenant"):
        CredentialStore(tmp_path / "tenantless.json")


def test_a_file_broken_or_removed_later_keeps_the_tokens_read_before(path):
    token = issue(path, "alice")
    running = store_of(path)
    path.write_text("{half a json")
    assert running.authenticate(token) is not None
    os.unlink(path)
    assert running.authenticate(token) is not None
    CredentialStore.create(path)  # back, empty: that is what counts now
    assert running.authenticate(token) is None


def test_records_round_trip_through_the_file(path):
    _, record = new_token("node-7", Role.NODE, node_id="node-7")
    CredentialStore(path).add(record)
    assert CredentialStore(path).records() == [record]
    assert isinstance(TokenRecord.from_json(record.to_json()).role, Role)


# --- where a caller's token comes from -------------------------------------------------------


def test_token_from_a_value_a_file_or_the_environment(tmp_path, monkeypatch):
    token, _ = new_token("alice", Role.CLIENT, tenant="acme")
    token_file = tmp_path / "token"
    token_file.write_text(f"  {token}\n")
    for variable in ("KVPOOL_TOKEN", "KVPOOL_TOKEN_FILE"):
        monkeypatch.delenv(variable, raising=False)
    assert token_from(None) is None
    assert token_from(token) == token
    assert token_from(f"@{token_file}") == token
    monkeypatch.setenv("KVPOOL_TOKEN_FILE", str(token_file))
    assert token_from(None) == token
    monkeypatch.setenv("KVPOOL_TOKEN", f"@{token_file}")
    assert token_from(None) == token
    monkeypatch.setenv("KVPOOL_TOKEN", token)
    assert token_from(None) == token
    other, _ = new_token("bob", Role.CLIENT, tenant="acme")
    assert token_from(other) == other  # the one given wins


def test_token_from_an_unusable_source_says_which_and_why(tmp_path, monkeypatch):
    monkeypatch.delenv("KVPOOL_TOKEN_FILE", raising=False)
    with pytest.raises(CredentialError, match=r"cannot read the token file .*missing"):
        token_from(f"@{tmp_path / 'missing'}")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CredentialError, match="is empty"):
        token_from(f"@{tmp_path / 'empty'}")
    monkeypatch.setenv("KVPOOL_TOKEN", "password123")
    with pytest.raises(CredentialError, match=r"\$KVPOOL_TOKEN\) is not usable") as raised:
        token_from(None)
    assert "password123" not in str(raised.value)
