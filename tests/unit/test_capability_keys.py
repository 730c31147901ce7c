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
    delivered = {k.key_id for k in keys.delivery(term=1).keys}
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
