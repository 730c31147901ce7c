"""The files admins edit while a master runs (credentials, quotas, capability keys) are read,
changed and written back whole by one process at a time.

Each change reads the whole file and renames a new copy over it: two changes at once, in two
processes, both read the old file, and the second rename wrote the first change away, a
token printed by ``kvpool token create`` the file did not know, a revoked token back. These
run the changes in real processes, at once, and check every one of them landed.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

from kvpool.cli.main import main as kvpool_main
from kvpool.master.capability_keys import load_or_create, read_key_file, rotate
from kvpool.master.quota_file import read_quotas
from kvpool.security.identity import Role
from kvpool.security.tokens import CredentialStore, new_token

#: Fork: the workers run the functions below with what the test made (no import again).
CONTEXT = multiprocessing.get_context("fork")
WORKERS = 8


def _run_all(target, args_of, count: int = WORKERS) -> None:
    """Runs ``target(*args_of(i), barrier)`` in ``count`` processes, released together;
    each must exit 0."""
    barrier = CONTEXT.Barrier(count)
    workers = [CONTEXT.Process(target=target, args=(*args_of(i), barrier)) for i in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0, f"a worker failed ({worker.exitcode})"


def _add_tokens(path: str, name: str, count: int, barrier: Barrier) -> None:
    barrier.wait()
    for i in range(count):
        _, record = new_token(f"{name}-{i}", Role.ADMIN)
        CredentialStore(path).add(record)


def _quota_sets(path: str, worker: int, count: int, barrier: Barrier) -> None:
    barrier.wait()
    for i in range(count):
        argv = ["quota", "set", "--quotas", path, "--tenant", f"t{worker}-{i}", "--objects", "1"]
        assert kvpool_main(argv) == 0


def _rotations(path: str, count: int, barrier: Barrier) -> None:
    barrier.wait()
    for _ in range(count):
        rotate(Path(path))


def _no_lock_left(folder: Path) -> None:
    assert [p.name for p in folder.iterdir() if p.name.endswith(".lock")] == []


def test_token_creates_in_many_processes_at_once_all_land(tmp_path):
    path = tmp_path / "credentials.json"
    CredentialStore.create(path)
    _run_all(_add_tokens, lambda i: (str(path), f"w{i}", 20))
    names = {record.name for record in CredentialStore(path).records()}
    assert names == {f"w{i}-{j}" for i in range(WORKERS) for j in range(20)}
    _no_lock_left(tmp_path)


def test_a_revoke_while_others_create_tokens_stays_revoked(tmp_path):
    path = tmp_path / "credentials.json"
    CredentialStore.create(path)
    for round_ in range(4):
        victim, record = new_token(f"victim-{round_}", Role.ADMIN)
        CredentialStore(path).add(record)
        barrier = CONTEXT.Barrier(5)
        creators = [
            CONTEXT.Process(target=_add_tokens, args=(str(path), f"r{round_}-{i}", 15, barrier))
            for i in range(4)
        ]
        for creator in creators:
            creator.start()
        barrier.wait()
        time.sleep(random.uniform(0.0, 0.05))  # (somewhere among the creates)
        assert len(CredentialStore(path).revoke(f"victim-{round_}")) == 1
        for creator in creators:
            creator.join(120)
            assert creator.exitcode == 0
        store = CredentialStore(path)
        assert store.authenticate(victim) is None, f"round {round_}: the revoke was undone"
        names = {r.name for r in store.records()}
        assert {f"r{round_}-{i}-{j}" for i in range(4) for j in range(15)} <= names


def test_a_change_waits_for_the_process_that_holds_the_file(tmp_path):
    from kvpool.security.file_lock import exclusive_change

    path = tmp_path / "credentials.json"
    CredentialStore.create(path)
    barrier = CONTEXT.Barrier(2)
    other = CONTEXT.Process(target=_add_tokens, args=(str(path), "late", 1, barrier))
    other.start()  # (before the lock is taken: a fork would hold it too)
    with exclusive_change(path, lambda error: error):
        barrier.wait()
        other.join(0.5)
        assert other.is_alive(), "it wrote while another process held the file"
        assert CredentialStore(path).records() == []
    other.join(60)
    assert other.exitcode == 0
    assert [r.name for r in CredentialStore(path).records()] == ["late-0"]
    _no_lock_left(tmp_path)


def test_quota_sets_in_many_processes_at_once_all_land(tmp_path):
    path = tmp_path / "quotas.json"
    _run_all(_quota_sets, lambda i: (str(path), i, 8))
    tenants = set(read_quotas(path).tenants)
    assert tenants == {f"t{i}-{j}" for i in range(WORKERS) for j in range(8)}
    _no_lock_left(tmp_path)


def test_quota_unset_racing_sets_is_not_undone(tmp_path):
    path = tmp_path / "quotas.json"
    assert (
        kvpool_main(["quota", "set", "--quotas", str(path), "--tenant", "gone", "--objects", "1"])
        == 0
    )
    barrier = CONTEXT.Barrier(4)
    setters = [
        CONTEXT.Process(target=_quota_sets, args=(str(path), i, 10, barrier)) for i in range(3)
    ]
    for setter in setters:
        setter.start()
    barrier.wait()
    time.sleep(0.05)
    assert kvpool_main(["quota", "unset", "--quotas", str(path), "--tenant", "gone"]) == 0
    for setter in setters:
        setter.join(120)
        assert setter.exitcode == 0
    tenants = set(read_quotas(path).tenants)
    assert "gone" not in tenants
    assert tenants == {f"t{i}-{j}" for i in range(3) for j in range(10)}


def test_rotations_in_many_processes_at_once_each_add_a_key(tmp_path):
    path = tmp_path / "keys.json"
    load_or_create(path)
    _run_all(_rotations, lambda i: (str(path), 5), count=4)
    keys = read_key_file(path)
    assert keys.current == 1 + 4 * 5, "a rotation was written away by another"
    _no_lock_left(tmp_path)


def test_first_creates_of_a_missing_credentials_file_at_once_all_land(tmp_path):
    workers = 4
    path = tmp_path / "credentials.json"
    _run_all(_first_create, lambda i: (str(path), f"n{i}"), count=workers)
    assert sorted(r.name for r in CredentialStore(path).records()) == [
        f"n{i}" for i in range(workers)
    ]


def _first_create(path: str, name: str, barrier: Barrier) -> None:
    barrier.wait()
    argv = ["token", "create", "--credentials", path, "--name", name, "--role", "admin"]
    assert kvpool_main(argv) == 0
