"""A file rewritten by another user than its owner stays its owner's.

The master runs as a service user and owns its credentials file; an operator runs ``sudo
kvpool token revoke``. The new copy was root's, mode 0600: the master could no longer read
it and kept the tokens it had read before, the revoked one too. A new copy now keeps the
owner, group and mode of the file it replaces, or is not written at all.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvpool.master.capability_keys import load_or_create, rotate
from kvpool.security import file_lock
from kvpool.security.identity import Role
from kvpool.security.tls import write_atomically
from kvpool.security.tokens import CredentialStore, new_token

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files away needs root")

KVPOOL = str(Path(sys.executable).parent / "kvpool")
#: The service user (nobody on most systems).
SERVICE = 65534


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder every user reaches (pytest's own are its owner's alone)."""
    path = Path(tempfile.mkdtemp(prefix="kvpool-owner-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def _owned(path: Path, uid: int, gid: int, mode: int) -> None:
    os.chown(path, uid, gid)
    path.chmod(mode)


def _owner_and_mode(path: Path) -> tuple[int, int, int]:
    status = path.stat()
    return status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode)


def _as_service(work: Callable[[], bool]) -> bool:
    """Whether ``work`` returns True run in a child process as the service user."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(SERVICE)
            os.setuid(SERVICE)
            code = 0 if work() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def test_a_rewrite_keeps_the_owner_group_and_mode_of_the_file_it_replaces(folder):
    path = folder / "file"
    path.write_bytes(b"old")
    _owned(path, SERVICE, SERVICE, 0o640)
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    assert _owner_and_mode(path) == (SERVICE, SERVICE, 0o640)
    write_atomically(path, b"key", mode=0o600)  # (a mode asked for: a private key's)
    assert _owner_and_mode(path) == (SERVICE, SERVICE, 0o600)
    fresh = folder / "fresh"
    write_atomically(fresh, b"x", mode=0o600)
    assert _owner_and_mode(fresh) == (0, os.getegid(), 0o600), "a new file is the writer's"


def test_a_revoke_run_as_root_leaves_the_file_readable_by_its_service_owner(folder):
    path = folder / "credentials.json"
    CredentialStore.create(path)
    victim, record = new_token("victim", Role.ADMIN)
    CredentialStore(path).add(record)
    _owned(path, SERVICE, SERVICE, 0o600)
    done = subprocess.run(
        [KVPOOL, "token", "revoke", "--credentials", str(path), "victim"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert _owner_and_mode(path) == (SERVICE, SERVICE, 0o600)
    assert _as_service(lambda: CredentialStore(path).authenticate(victim) is None)
    assert [p.name for p in folder.iterdir()] == [path.name], "no temporary or lock left"


def test_a_quota_set_and_a_rotation_run_as_root_keep_the_owner(folder):
    quotas = folder / "quotas.json"
    quotas.write_text(json.dumps({"version": 1, "tenants": {}}))
    _owned(quotas, SERVICE, SERVICE, 0o600)
    done = subprocess.run(
        [KVPOOL, "quota", "set", "--quotas", str(quotas), "--tenant", "a", "--objects", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert _owner_and_mode(quotas) == (SERVICE, SERVICE, 0o600)

    keys = folder / "keys.json"
    load_or_create(keys)
    _owned(keys, SERVICE, SERVICE, 0o600)
    rotate(keys)
    assert _owner_and_mode(keys) == (SERVICE, SERVICE, 0o600)


def test_a_writer_that_cannot_keep_the_owner_writes_nothing_and_says_why(folder):
    path = folder / "credentials.json"
    path.write_bytes(b"root's")
    _owned(path, 0, 0, 0o666)  # (writable by all, but root's: a copy by another is not)

    def write() -> bool:
        try:
            write_atomically(path, b"service's")
        except PermissionError as error:
            return "belongs to uid 0" in str(error.strerror) and "run this as" in str(
                error.strerror
            )
        return False

    assert _as_service(write)
    assert path.read_bytes() == b"root's"
    assert _owner_and_mode(path) == (0, 0, 0o666)
    assert [p.name for p in folder.iterdir()] == [path.name], "no temporary left"


def test_the_owner_writing_its_file_keeps_it_though_its_group_is_not_the_owner_s(folder):
    path = folder / "credentials.json"
    path.write_bytes(b"old")
    _owned(path, SERVICE, 0, 0o640)  # (provisioned nobody:root 0640)

    def write() -> bool:
        write_atomically(path, b"new")
        return True

    assert _as_service(write)
    assert path.read_bytes() == b"new"
    uid, _, mode = _owner_and_mode(path)
    assert (uid, mode) == (SERVICE, 0o640)


def test_a_lock_a_killed_root_change_left_does_not_lock_the_file_s_owner_out(folder):
    path = folder / "credentials.json"
    CredentialStore.create(path)
    _owned(path, SERVICE, SERVICE, 0o600)
    left = file_lock._lock(path.with_name(path.name + file_lock.LOCK_SUFFIX))
    os.close(left)  # (root's change killed while it held the lock: the lock file stays)
    lock = path.with_name(path.name + file_lock.LOCK_SUFFIX)
    assert _owner_and_mode(lock)[::2] == (0, 0o644)
    _, record = new_token("later", Role.ADMIN)

    def add() -> bool:
        CredentialStore(path).add(record)
        return True

    assert _as_service(add), "the owner opens root's lock file and takes its turn"
    assert record in CredentialStore(path).records()
