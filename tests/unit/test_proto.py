"""The committed protobuf modules match proto/*.proto, and shared enums match the wire."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvpool.common.status import KeyStatus, Tier
from kvpool.proto import master_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh():
    result = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_key_status_values_are_the_wire_values():
    assert {s.name: s.value for s in KeyStatus} == dict(pb.KeyStatus.items())


def test_tier_values_are_the_wire_values():
    wire = {name.removeprefix("TIER_"): value for name, value in pb.Tier.items()}
    assert {t.name: t.value for t in Tier} == wire
