"""The master's capability keys: a shared file, and rotation without refused transfers.

A new key is delivered to nodes at once but signs only once every live node has had time to
get it (one node TTL of heartbeats); the older keys stay valid for what they signed.
"""

from __future__ import annotations

import os
import stat

import pytest

from kvpool.master.capability_keys import (
    KeyFileError,
    MasterKeys,
    load_or_create,
    read_key_file,
    rotate,
)
from kvpool.security import capabilities as caps


def test_the_file_is_created_private_with_one_key_and_read_back_the_same(tmp_path):
    path = tmp_path / "keys.json"
    made = load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(made.keys) == 1 and made.current == made.keys[0][0]
    assert load_or_create(path) == made, "a second master reads the same keys"


def test_a_damaged_file_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"id": 1, "secret": "abcd"}], "current": 1}')
    with pytest.raises(KeyFileError, match="Remove it"):
        read_key_file(path)


def test_rotation_adds_a_current_key_and_keeps_at_most_max_keys(tmp_path):
    path = tmp_path / "keys.json"
    first = load_or_create(path)
    for _ in range(caps.MAX_KEYS + 2):
        rotated = rotate(path)
    assert len(rotated.keys) == caps.MAX_KEYS
    assert rotated.current == rotated.keys[-1][0]
    assert first.keys[0] not in rotated.keys, "the oldest key goes first"
    assert read_key_file(path) == rotated


def test_a_rotated_key_signs_only_once_nodes_have_had_time_to_get_it(tmp_path):
    path = tmp_path / "keys.json"
    keys = MasterKeys(load_or_create(path), activate_after=5.0)
    old = keys.ring.current
    before = keys.ring.grant(
        segment_id="n/s",
        offset=0,
        length=64,
        rights=caps.Rights.READ,
        expiry_ms=10,
        term=1,
        tenant="t",
    )
    new_file = rotate(path)
    keys.reload(new_file, now=100.0)
    delivered = {k.key_id for k in keys.delivery(term=1, node_id="n").keys}
    assert delivered == {k for k, _ in new_file.keys}, "nodes get the new key at once"
    assert keys.ring.current == old, "grants still use the key every node holds"
    keys.tick(104.9)
    assert keys.ring.current == old
    keys.tick(105.0)
    assert keys.ring.current == new_file.current
    node = caps.KeyRing(new_file.keys)
    node.verify(
        before,
        now_ms=0,
        segment=caps.segment_digest("n/s"),
        offset=0,
        length=64,
        rights=caps.Rights.READ,
    )  # (what the old key signed stays valid at a node holding the rotated file)


def _node_ring(keys: MasterKeys, node_id: str) -> caps.KeyRing:
    """The key ring a node builds from what the master delivers to it (able to sign too,
    as a node that turned against the others would)."""
    delivered = keys.delivery(term=1, node_id=node_id)
    pairs = [(k.key_id, k.secret) for k in delivered.keys]
    return caps.KeyRing(pairs, current=pairs[-1][0])


def _read_grant(ring: caps.KeyRing, segment_id: str) -> bytes:
    return ring.grant(
        segment_id=segment_id,
        offset=0,
        length=1 << 20,
        rights=caps.Rights.READ,
        expiry_ms=2**40,
        term=1,
        tenant="t",
    )


def _verifies(ring: caps.KeyRing, capability: bytes, segment_id: str) -> bool:
    try:
        ring.verify(
            capability,
            now_ms=0,
            segment=caps.segment_digest(segment_id),
            offset=0,
            length=1 << 20,
            rights=caps.Rights.READ,
        )
    except caps.Forged:
        return False
    return True


def test_each_node_gets_keys_of_its_own_that_sign_for_no_other_node(tmp_path):
    """A node holds the keys it verifies with: were they the masters' own, one node (or a
    stolen node token) could sign capabilities for every other node's segments and read
    or overwrite every tenant's objects there."""
    keys = MasterKeys(load_or_create(tmp_path / "keys.json"), activate_after=5.0)
    node_a, node_b = _node_ring(keys, "node-a"), _node_ring(keys, "node-b")
    file_secrets = {secret for _, secret in keys.keys.keys}
    for ring in (node_a, node_b):
        assert ring.key_ids() == keys.ring.key_ids()
        assert not file_secrets & {ring.secret(k) for k in ring.key_ids()}

    granted = _read_grant(keys.for_node("node-a"), "node-a/dram-1")
    assert _verifies(node_a, granted, "node-a/dram-1"), "what the master signs for a node"
    forged = _read_grant(node_a, "node-b/dram-1")  # node a signs for node b's segment
    assert not _verifies(node_b, forged, "node-b/dram-1")
    assert _verifies(node_b, _read_grant(keys.for_node("node-b"), "node-b/dram-1"), "node-b/dram-1")


def test_a_rotated_key_signs_for_each_node_once_it_is_active(tmp_path):
    path = tmp_path / "keys.json"
    keys = MasterKeys(load_or_create(path), activate_after=5.0)
    old = keys.for_node("n").current
    new_file = rotate(path)
    keys.reload(new_file, now=100.0)
    assert keys.for_node("n").current == old
    assert new_file.current in _node_ring(keys, "n").key_ids(), "nodes get the new key at once"
    keys.tick(105.0)
    assert keys.for_node("n").current == new_file.current
    node = _node_ring(keys, "n")
    assert _verifies(node, _read_grant(keys.for_node("n"), "n/s"), "n/s")


def test_the_file_is_written_through_no_name_another_user_could_have_planted(tmp_path):
    """The new file is made under a name chosen as it is created: a file or link planted
    beforehand at a guessable name (``.NAME.new.PID``) is neither written through nor
    renamed into place."""
    path = tmp_path / "keys.json"
    planted = tmp_path / f".keys.json.new.{os.getpid()}"
    target = tmp_path / "target"
    target.write_bytes(b"untouched")
    planted.symlink_to(target)
    load_or_create(path)
    rotate(path)
    assert target.read_bytes() == b"untouched"
    assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".keys")] == [planted.name]


def test_a_node_takes_keys_of_the_same_ids_and_term_when_their_secrets_differ():
    """A master of the previous version delivered its own keys; one of this version, in
    the same term (a lone master restarted within the second its term is named after),
    delivers the node's own under the same ids: the node must take them, or it refuses
    every capability as forged."""
    from types import SimpleNamespace

    from kvpool.proto import master_pb2 as pb
    from kvpool.storage_node.node import StorageNode

    def answer(secret: bytes) -> pb.HeartbeatResponse:
        keys = pb.CapabilityKeys(
            keys=[pb.CapabilityKey(key_id=1, secret=secret)], term=7, max_skew_ms=1000
        )
        return pb.HeartbeatResponse(capability_keys=keys)

    node = SimpleNamespace(capability_keys=None)
    StorageNode._learn_keys(node, answer(b"a" * 32))  # type: ignore[arg-type]
    StorageNode._learn_keys(node, answer(b"b" * 32))  # type: ignore[arg-type]
    assert node.capability_keys.ring.secret(1) == b"b" * 32


def test_four_quick_rotations_never_sign_with_a_key_nodes_have_not_had_time_to_get(tmp_path):
    """``rotate`` run ``caps.MAX_KEYS`` times within a node TTL drops the key the master
    signs with: it must go on with the key nodes have held longest, not the file's brand-new
    current (no node holds it before its next heartbeat: every transfer refused UNKNOWN_KEY)."""
    path = tmp_path / "keys.json"
    keys = MasterKeys(load_or_create(path), activate_after=5.0)
    start = keys.ring.current
    first_seen = {start: float("-inf")}
    now = 100.0
    for _ in range(caps.MAX_KEYS + 2):
        now += 0.15
        rotated = rotate(path)
        keys.reload(rotated, now=now)
        held = [k for k, _ in rotated.keys]
        for key_id in held:
            first_seen.setdefault(key_id, now)
        signing = keys.ring.current
        assert signing in held
        settled = [k for k in held if now - first_seen[k] >= 5.0]
        if settled:
            assert signing in settled, f"key {signing} first seen {now - first_seen[signing]}s ago"
        else:
            assert first_seen[signing] == min(first_seen[k] for k in held), "the oldest held"
        assert signing != rotated.current, "the brand-new key signs only once delivered"
        assert keys.for_node("n").current == signing
    assert start not in held
    keys.tick(now + 4.9)
    assert keys.ring.current != rotated.current
    keys.tick(now + 5.0)
    assert keys.ring.current == rotated.current


def test_a_dropped_signing_key_gives_way_to_the_newest_key_held_for_activate_after(tmp_path):
    path = tmp_path / "keys.json"
    keys = MasterKeys(load_or_create(path), activate_after=5.0)
    first = keys.ring.current
    keys.reload(rotate(path), now=100.0)
    third = rotate(path)  # (named current before the second ever signs)
    keys.reload(third, now=101.0)
    keys.reload(rotate(path), now=105.5)
    assert keys.ring.current == first, "the third is not yet delivered for sure"
    fifth = rotate(path)
    keys.reload(fifth, now=106.5)
    assert first not in dict(fifth.keys)
    assert keys.ring.current == third.current, "the newest held for activate_after"


def test_a_key_whose_secret_changed_under_its_id_signs_only_once_nodes_have_had_time(
    tmp_path,
):
    """A file made again (or edited) may hold an id it held before with another secret:
    nodes hold the old secret under that id until their next heartbeat."""
    import json

    path = tmp_path / "keys.json"
    load_or_create(path)
    keys = MasterKeys(rotate(path), activate_after=5.0)
    (one, _), (two, secret_two) = keys.keys.keys
    assert keys.ring.current == two
    body = {
        "keys": [{"id": one, "secret": (b"x" * 32).hex()}, {"id": two, "secret": secret_two.hex()}],
        "current": one,
    }
    path.write_text(json.dumps(body))
    keys.reload(read_key_file(path), now=100.0)
    assert keys.ring.current == two, "key 1's new secret is no node's yet"
    keys.tick(105.0)
    assert keys.ring.current == one and keys.ring.secret(one) == b"x" * 32
