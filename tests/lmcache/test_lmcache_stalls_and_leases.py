"""A stalled master, lock leases and odd keys, against real clusters:

- a master that stalls under steady traffic costs a handful of log lines, not one per task;
- unlock (and close) give the lock leases back at once: unlocked chunks are neither pinned
  against eviction nor counted against the tenant's leases quota for ``lock_ttl_s``;
- a lookup refused for the tenant's leases quota is a failed lookup of chunks that are still
  there, not "gone" (listeners and usage are left alone);
- a store of a key another put is still writing is not a success: that write may fail;
- keys that are no kvpool key are misses the master is never asked about, said once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from helpers import wait_until
from lmcache.v1.distributed.api import ObjectKey
from lmcache_support import Arena, bits, load, lookup, object_keys, store, wait_fd

from kvpool.client.outcomes import error_for
from kvpool.common.status import KeyStatus
from kvpool.errors import ObjectBeingWritten, ObjectExists

MIB = 1024 * 1024
#: The adapter's loggers (LMCache's loggers do not propagate to the root logger).
LOGGERS = ("kvpool.lmcache.adapter", "kvpool.lmcache.locks", "kvpool.lmcache.tasks")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@contextlib.contextmanager
def adapter_logs() -> Iterator[Records]:
    handler = Records()
    for name in LOGGERS:
        logging.getLogger(name).addHandler(handler)
    try:
        yield handler
    finally:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(handler)


def quota_cluster(cluster_factory, tmp_path: Path, leases: int):
    """A one-node cluster whose tenant "lm" may hold ``leases`` objects under lease."""
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"version": 1, "tenants": {"lm": {"leases": leases}}}))
    return cluster_factory(
        1, "128MiB", tenants=("default", "lm"), master_args=["--quotas", str(path)]
    )


class Listener:
    def __init__(self) -> None:
        self.deleted: list[ObjectKey] = []

    def on_l2_keys_stored(self, keys, sizes=None) -> None:
        pass

    def on_l2_keys_accessed(self, keys) -> None:
        pass

    def on_l2_keys_deleted(self, keys) -> None:
        self.deleted.extend(keys)


# ---------------------------------------------------------------------- a stalled master


def test_a_stalled_master_under_steady_traffic_logs_a_handful_of_lines(
    cluster_factory, make_adapter, arena
):
    cluster = cluster_factory(1, "64MiB")
    adapter = make_adapter(master=cluster.master_address, store_timeout_s=1.0, lookup_timeout_s=0.5)
    keys, objs = object_keys(4), arena.objs(4, 4096)
    assert store(adapter, keys, objs).is_successful()
    with adapter_logs() as logs:
        cluster.master.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            while time.monotonic() - started < 4.0:  # an engine's steady stores and lookups
                adapter.submit_store_task(object_keys(4), objs)
                adapter.submit_lookup_and_lock_task(keys, {})
                adapter.pop_completed_store_tasks()
                time.sleep(0.02)
            submitted = adapter.report_status()
        finally:
            cluster.master.signal(signal.SIGCONT)
    warnings = logs.at(logging.WARNING)
    # One line per kind and reason every 10 s: stores and lookups, each failing on the
    # master, and skipped (deadline, stall). Before: one per task, ~100 a second.
    assert len(warnings) <= 8, "\n".join(warnings)
    assert not logs.at(logging.ERROR)
    assert submitted["lookup_failures"] >= 50  # (they did fail: the lines were not lost)


# ---------------------------------------------------------------------- lock leases


def test_unlocked_chunks_are_evictable_at_once_not_after_the_lock_ttl(
    cluster_factory, make_adapter
):
    # No quotas: a full node whose chunks were looked up, loaded and unlocked. Before the
    # leases were given back, new stores failed for lock_ttl_s (30 s): nothing was evictable.
    cluster = cluster_factory(1, "64MiB")
    arena = Arena(96 * MIB)
    adapter = make_adapter(master=cluster.master_address, l1_memory_desc=arena.desc)
    old = object_keys(56)
    sources = arena.objs(56, MIB)
    for i in range(0, 56, 8):
        assert store(adapter, old[i : i + 8], sources[i : i + 8]).is_successful()
    assert sum(bits(lookup(adapter, old), 56)) == 56
    assert sum(bits(load(adapter, old, sources), 56)) == 56  # (the same bytes, read back)
    adapter.submit_unlock(old)
    fresh = arena.objs(24, MIB)
    unlocked = time.monotonic()
    assert wait_until(
        lambda: store(adapter, object_keys(24), fresh).is_successful(), timeout=5.0
    ), "new chunks found no room: the unlocked chunks' leases still pin them"
    assert time.monotonic() - unlocked < 5.0
    assert adapter._locks.released >= 56


def test_unlock_and_close_give_the_tenants_leases_quota_back(
    cluster_factory, make_adapter, arena, tmp_path
):
    cluster = quota_cluster(cluster_factory, tmp_path, leases=64)
    params = dict(master=cluster.master_address, **cluster.client_credentials("lm"))
    adapter = make_adapter(**params)
    a, b = object_keys(64), object_keys(64)
    assert store(adapter, a, arena.objs(64, 16 * 1024)).is_successful()
    assert store(adapter, b, arena.objs(64, 16 * 1024)).is_successful()
    assert sum(bits(lookup(adapter, a), 64)) == 64
    assert sum(bits(load(adapter, a, arena.objs(64, 16 * 1024, random=False)), 64)) == 64
    adapter.submit_unlock(a)

    def all_locked(keys) -> bool:
        """Looks ``keys`` up; keeps them locked if every one was leased, else unlocks."""
        if sum(bits(lookup(adapter, keys), 64)) == 64:
            return True
        adapter.submit_unlock(keys)
        return False

    # (the leases go back right after the unlock, from another thread: soon, not at once)
    assert wait_until(lambda: all_locked(b), timeout=5.0), "a's leases still count after unlock"
    adapter.submit_unlock(b)
    # Locked, never unlocked, then closed (an engine stopping): close gives them back.
    assert wait_until(lambda: all_locked(a), timeout=5.0)
    adapter.close()
    again = make_adapter(**params)
    assert sum(bits(lookup(again, b), 64)) == 64, "the closed adapter's leases still count"


def test_a_lookup_refused_for_the_leases_quota_is_a_failure_not_a_deletion(
    cluster_factory, make_adapter, arena, tmp_path
):
    cluster = quota_cluster(cluster_factory, tmp_path, leases=8)
    adapter = make_adapter(master=cluster.master_address, **cluster.client_credentials("lm"))
    listener = Listener()
    adapter.register_listener(listener)
    a, b = object_keys(8), object_keys(8)
    assert store(adapter, a, arena.objs(8, 16 * 1024)).is_successful()
    assert store(adapter, b, arena.objs(8, 16 * 1024)).is_successful()
    used = adapter.get_usage().total_bytes_used
    assert sum(bits(lookup(adapter, a), 8)) == 8  # the quota, all held
    with adapter_logs() as logs:
        for _ in range(3):
            assert sum(bits(lookup(adapter, b), 8)) == 0
    assert listener.deleted == [], "chunks refused a lease were reported deleted"
    assert adapter.get_usage().total_bytes_used == used
    assert adapter.report_status()["lookup_failures"] == 3
    quota_lines = [line for line in logs.at(logging.WARNING) if "QUOTA_EXCEEDED" in line]
    assert len(quota_lines) == 1, logs.at(logging.WARNING)
    assert "at its leases quota of 8 objects under read lease (8 held)" in quota_lines[0]
    adapter.submit_unlock(a)
    assert wait_until(lambda: sum(bits(lookup(adapter, b), 8)) == 8, timeout=5.0)


# ---------------------------------------------------------------------- stores


def test_error_for_a_key_being_written_is_an_object_being_written_and_still_exists():
    error = error_for(KeyStatus.ALREADY_EXISTS, "k", "object is being written")
    assert isinstance(error, ObjectBeingWritten)
    assert isinstance(error, ObjectExists)
    assert not isinstance(error_for(KeyStatus.ALREADY_EXISTS, "k", "exists"), ObjectBeingWritten)


def test_a_store_of_keys_another_put_is_still_writing_is_not_a_success(
    cluster_factory, make_adapter
):
    # Engine A's store stalls (its node is stopped, TCP); engine B stores the same keys
    # meanwhile. A's store then fails: B must not have been told the keys are stored.
    cluster = cluster_factory(1, "128MiB")
    arena = Arena(64 * MIB)
    tcp = dict(
        master=cluster.master_address,
        store_timeout_s=2.0,
        ucx_config={"TLS": "tcp"},
        same_host_mapping=False,
    )
    first, second = make_adapter(**tcp), make_adapter(**tcp)
    assert store(first, object_keys(1), arena.objs(1, MIB)).is_successful()
    assert store(second, object_keys(1), arena.objs(1, MIB)).is_successful()
    keys = object_keys(4)
    node = cluster.nodes[0]
    node.signal(signal.SIGSTOP)
    try:
        stalled = first.submit_store_task(keys, arena.objs(4, 4 * MIB))
        time.sleep(0.3)
        meanwhile = store(second, keys, arena.objs(4, 4 * MIB))
        done: dict = {}
        deadline = time.monotonic() + 20
        while stalled not in done and time.monotonic() < deadline:
            wait_fd(first.get_store_event_fd(), 0.2)
            done.update(first.pop_completed_store_tasks())
    finally:
        node.signal(signal.SIGCONT)
    assert not meanwhile.is_successful(), "a store of keys still being written succeeded"
    assert second.report_status()["store_failures"] == 4
    assert not done[stalled].is_successful()


# ---------------------------------------------------------------------- keys


def _keys(model: str, count: int) -> list[ObjectKey]:
    return object_keys(count, model=model)


def test_keys_that_are_no_kvpool_keys_are_misses_said_once_and_never_sent(make_adapter, arena):
    adapter = make_adapter()
    good = object_keys(2)
    too_long = _keys("m" * 2000, 2)  # over 1024 bytes: the master refuses a whole batch
    surrogate = _keys("bad\udc80", 2)  # protobuf cannot even encode it
    assert store(adapter, good, arena.objs(2, 4096)).is_successful()
    batch = good + too_long + surrogate
    with adapter_logs() as logs:
        for _ in range(3):
            assert bits(lookup(adapter, batch), 6) == [True, True] + [False] * 4
            adapter.submit_unlock(batch)
        adapter.delete(batch)
        assert bits(lookup(adapter, good), 2) == [False, False]  # deleted
    assert not logs.at(logging.ERROR), logs.at(logging.ERROR)
    invalid = [line for line in logs.at(logging.WARNING) if "not kvpool keys" in line]
    assert len(invalid) == 4, invalid  # once per model: lookups, then the delete
    status = adapter.report_status()
    assert status["lookup_failures"] == 0
    assert status["deleted_keys"] == 2


def test_renewals_and_deletes_never_send_invalid_keys(make_adapter):
    adapter = make_adapter()
    control = adapter._control
    bad = ["x" * 2000, "bad\udc80"]
    leased = control.lease(bad, 0.4, 5.0)  # no call: would raise (encode) or be refused
    assert leased.sizes == [None, None] and leased.gone(0) and leased.gone(1)
    assert control.remove(bad, 5.0, force=True) == [KeyStatus.INVALID_KEY] * 2
    assert control.release(bad, 5.0) == 0
