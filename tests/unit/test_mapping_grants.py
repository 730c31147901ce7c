"""The same-host mapping rule (security/mapping_grants.py): who may map which segment, and
the grant a node checks before it hands a segment's file over."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvpool.security import capabilities as caps
from kvpool.security import mapping_grants as mg
from kvpool.security.identity import INSECURE, Identity, Role

RING = caps.KeyRing([(1, b"k" * 32)], current=1)
NOW = 1_000_000
SEGMENT, SIZE = "node-a/dram-1", 1 << 30
ALICE = Identity(name="alice", role=Role.CLIENT, tenant="a")


def _grant(tenant: str = "a", expiry_ms: int = NOW + mg.GRANT_TTL_MS, ring=RING) -> bytes:
    return mg.grant(ring, segment_id=SEGMENT, size=SIZE, tenant=tenant, term=7, expiry_ms=expiry_ms)


def _check(grant: bytes, *, writable: bool = False, ring=RING, **changes) -> None:
    arguments = dict(
        writable=writable,
        segment_id=SEGMENT,
        size=SIZE,
        tenant="a",
        now_ms=NOW,
        min_term=7,
        max_skew_ms=1000,
    )
    arguments.update(changes)
    mg.check(ring, grant, **arguments)


@pytest.mark.parametrize(
    ("names", "identity", "segment_tenant", "allowed"),
    [
        ({"alice"}, ALICE, "a", True),
        ({"*"}, ALICE, "a", True),
        ({"bob"}, ALICE, "a", False),  # not named
        ({"alice"}, ALICE, "", False),  # a segment shared by tenants
        ({"alice"}, ALICE, "b", False),  # another tenant's segment
        ({"*"}, Identity(name="root", role=Role.ADMIN), "a", False),
        ({"*"}, Identity(name="n", role=Role.NODE, node_id="n"), "a", False),
        (set(), INSECURE, "", True),  # an insecure cluster: everyone, as before
    ],
)
def test_who_may_map_which_segment(names, identity, segment_tenant, allowed):
    assert mg.SameHostPolicy.parse(",".join(names)).allows(identity, segment_tenant) is allowed


def test_a_grant_for_the_whole_segment_of_its_tenant_passes_for_reads_and_writes():
    grant = _grant()
    _check(grant)
    _check(grant, writable=True)


@pytest.mark.parametrize(
    ("why", "grant", "changes"),
    [
        ("another tenant", lambda: _grant(tenant="b"), {}),
        ("expired", lambda: _grant(expiry_ms=NOW - 5000), {}),
        ("another segment", _grant, {"segment_id": "node-a/dram-2"}),
        ("not the whole segment", _grant, {"size": SIZE * 2}),
        ("an older term", _grant, {"min_term": 8}),
        ("a node shared by tenants", _grant, {"tenant": ""}),
        ("another key", lambda: _grant(ring=caps.KeyRing([(1, b"x" * 32)], current=1)), {}),
    ],
)
def test_a_node_refuses_a_grant_that_does_not_fit(why, grant, changes):
    with pytest.raises(mg.MapRefused):
        _check(grant(), **changes)


def test_every_altered_byte_of_a_grant_is_refused():
    grant = _grant()
    for i in range(len(grant)):
        altered = bytearray(grant)
        altered[i] ^= 0x01
        with pytest.raises(mg.MapRefused):
            _check(bytes(altered))


def test_map_grants_and_transfer_capabilities_are_never_taken_for_each_other():
    transfer = RING.grant(
        segment_id=SEGMENT,
        offset=0,
        length=SIZE,
        rights=caps.Rights.READ | caps.Rights.WRITE,
        expiry_ms=NOW + 1000,
        term=7,
        tenant="a",
    )
    with pytest.raises(mg.MapRefused, match="forged"):
        _check(transfer)
    with pytest.raises(caps.Forged):
        RING.verify(
            _grant(),
            now_ms=NOW,
            segment=caps.segment_digest(SEGMENT),
            offset=0,
            length=4096,
            rights=caps.Rights.READ,
        )


def test_a_node_without_keys_yet_refuses_and_says_to_try_again():
    with pytest.raises(mg.MapRefused, match="try again"):
        _check(_grant(), ring=None)


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"KVM1",
        mg.request(True, _grant())[:-1],
        mg.request(True, _grant()) + b"x",
        b"XXXX" + mg.request(True, _grant())[4:],
        mg.REQUEST_MAGIC + b"x" + _grant(),
    ],
)
def test_a_request_that_is_not_one_is_refused(message):
    with pytest.raises(mg.MapRefused):
        mg.parse_request(message)


def test_a_request_says_its_mode_and_carries_the_grant():
    grant = _grant()
    assert mg.parse_request(mg.request(True, grant)) == (True, grant)
    assert mg.parse_request(mg.request(False, grant)) == (False, grant)


def test_not_dumpable_turns_off_dumping_as_a_secure_node_does_at_start():
    code = (
        "import ctypes, ctypes.util\n"
        "from kvpool.common.process import not_dumpable\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'))\n"
        "assert libc.prctl(3, 0, 0, 0, 0) == 1\n"  # PR_GET_DUMPABLE
        "not_dumpable()\n"
        "print(libc.prctl(3, 0, 0, 0, 0))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
