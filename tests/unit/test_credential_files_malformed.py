"""A malformed credentials, quotas or capability key file is answered with the file's own
error, whatever is wrong with it, and one that goes bad under a running store keeps what was
read before.

Only ValueError was caught: deeply nested JSON (a RecursionError), a number too large for an
int (``int(1e400)``: an OverflowError) escaped, crashing a master's start with a traceback,
or, when the file changed under it, into its event loop on every call: nodes were dropped.
``created`` of 1e300 or NaN was taken, and ``kvpool token list`` crashed on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool.master import main as master_main
from kvpool.master.capability_keys import (
    KeyFileError,
    MasterKeys,
    load_or_create,
    read_key_file,
    rotate,
)
from kvpool.master.quota_file import QuotaFile, QuotaFileError, read_quotas
from kvpool.security import tokens
from kvpool.security.identity import Role
from kvpool.security.tokens import CredentialError, CredentialStore, TokenRecord, new_token

KVPOOL = str(Path(sys.executable).parent / "kvpool")
DEEP = "[" * 100_000 + "]" * 100_000
GOOD = {"token_id": "0123456789ab", "digest": "0" * 64, "name": "a", "role": "admin"}


def _credentials(tokens_json: str) -> str:
    return '{"version": 1, "tokens": ' + tokens_json + "}"


def _entry(**changes: object) -> str:
    return _credentials(json.dumps([{**GOOD, **changes}]))


def _created(number: str) -> str:
    """A file whose one token was created at ``number``, as written (JSON or not)."""
    return _entry().replace('"admin"', '"admin", "created": ' + number)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (_credentials(DEEP), "nested too deeply"),
        ('{"version": 1, "tokens": [], "x": ' + DEEP + "}", "nested too deeply"),
        (_entry(created=1e300), "'created' (1e+300) is not a time"),
        (_entry(created=-1.0), "'created' (-1.0) is not a time"),
        (_created("9" * 4000), "is not a time"),
        (_created("NaN"), "'created' (nan) is not"),
        (_created("Infinity"), "'created' (inf) is not a time"),
    ],
)
def test_a_malformed_credentials_file_is_a_credential_error(tmp_path, content, says):
    path = tmp_path / "credentials.json"
    path.write_text(content)
    with pytest.raises(CredentialError, match="credentials file") as error:
        CredentialStore(path)
    assert says in str(error.value)


def test_created_in_range_is_taken():
    record = TokenRecord.from_json({**GOOD, "created": 1_700_000_000})
    assert record.created == 1_700_000_000.0


def test_a_credentials_file_that_goes_deep_later_keeps_the_tokens_read_before(tmp_path):
    path = tmp_path / "credentials.json"
    CredentialStore.create(path)
    token, record = new_token("alice", Role.ADMIN)
    CredentialStore(path).add(record)
    running = CredentialStore(path, check_interval=0)
    assert running.authenticate(token) is not None
    path.write_text(_credentials(DEEP))
    assert running.authenticate(token) is not None, "the tokens read before stay"
    path.write_text(_entry(created=float("1e300")))
    assert running.authenticate(token) is not None


def test_anything_raised_reading_the_file_again_keeps_the_tokens(tmp_path, monkeypatch):
    """The look again runs on every authenticated call: nothing it meets may reach it."""
    path = tmp_path / "credentials.json"
    CredentialStore.create(path)
    token, record = new_token("alice", Role.ADMIN)
    CredentialStore(path).add(record)
    running = CredentialStore(path, check_interval=0)

    def broken(data: bytes, where: Path) -> dict[str, TokenRecord]:
        raise RuntimeError("a parser bug")

    monkeypatch.setattr(tokens, "_parse_file", broken)
    path.write_text(_credentials("[]"))
    assert running.authenticate(token) is not None


@pytest.mark.parametrize(
    "content",
    [
        '{"version": 1, "tenants": ' + DEEP + "}",
        '{"version": 1, "tenants": {"a": {"objects": 1e400}}}',
        '{"version": 1, "tenants": {"a": {"objects": NaN}}}',
    ],
)
def test_a_malformed_quotas_file_is_a_quota_file_error_and_keeps_the_last_good(tmp_path, content):
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"version": 1, "tenants": {"a": {"objects": 1}}}))
    running = QuotaFile(path, check_interval=0)
    path.write_text(content)
    with pytest.raises(QuotaFileError, match="quotas file"):
        read_quotas(path)
    assert running.current().of("a").objects == 1, "the last good quotas stay"


def test_anything_raised_reading_the_quotas_again_keeps_them(tmp_path, monkeypatch):
    from kvpool.master import quota_file

    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"version": 1, "tenants": {"a": {"objects": 1}}}))
    running = QuotaFile(path, check_interval=0)

    def broken(data: bytes, where: Path) -> None:
        raise RuntimeError("a parser bug")

    monkeypatch.setattr(quota_file, "_parse", broken)
    path.write_text(json.dumps({"version": 1, "tenants": {"a": {"objects": 2}}}))
    assert running.current().of("a").objects == 1


def _bad_key_files(good: dict) -> list[str]:
    huge_id = {**good, "keys": [{**good["keys"][0], "id": "ID"}]}
    return [
        '{"keys": ' + DEEP + "}",
        json.dumps(huge_id).replace('"ID"', "1e400"),
        json.dumps({**good, "current": "CUR"}).replace('"CUR"', "1e400"),
        json.dumps(huge_id).replace('"ID"', "NaN"),
    ]


def test_a_malformed_key_file_is_a_key_file_error(tmp_path):
    path = tmp_path / "keys.json"
    load_or_create(path)
    good = json.loads(path.read_text())
    for content in _bad_key_files(good):
        path.write_text(content)
        with pytest.raises(KeyFileError, match="Remove it"):
            read_key_file(path)


def test_a_key_file_that_goes_bad_under_a_master_keeps_its_keys(tmp_path, monkeypatch):
    path = tmp_path / "keys.json"
    keys = MasterKeys(load_or_create(path), activate_after=5.0)
    before = keys.ring.key_ids()
    watch = master_main._KeyFileWatch(path)
    good = json.loads(path.read_text())
    for now, content in enumerate(_bad_key_files(good)):
        path.write_text(content)
        os.utime(path, ns=(now * 10**9, now * 10**9))  # (a change the watch sees)
        watch.apply(keys, float(now))
        assert keys.ring.key_ids() == before

    def broken(where: Path) -> None:
        raise RuntimeError("a reader bug")

    monkeypatch.setattr(master_main, "read_key_file", broken)
    path.write_text(json.dumps(good))
    watch.apply(keys, 10.0)
    assert keys.ring.key_ids() == before
    monkeypatch.undo()
    rotate(path)
    watch.apply(keys, 11.0)
    assert len(keys.ring.key_ids()) == 2, "a good file is taken again"


def test_token_list_of_an_out_of_range_created_is_a_one_line_error(tmp_path):
    path = tmp_path / "credentials.json"
    path.write_text(_entry(created=1e300))
    done = subprocess.run(
        [KVPOOL, "token", "list", "--credentials", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and "'created' (1e+300) is not a time" in line


@pytest.mark.parametrize("created", [1e300, float("nan"), float("inf"), -1e300])
def test_a_listing_shows_any_created_it_is_given(created):
    from kvpool.cli.token_command import _shown_time

    assert _shown_time(created) == repr(created)
    assert _shown_time(0.0).startswith("19")
