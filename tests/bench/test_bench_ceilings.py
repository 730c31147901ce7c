"""The ceilings' round-trip probes run between two real processes and report a figure."""

from __future__ import annotations

from pathlib import Path

from bench import ceilings, netns


def test_the_lane_and_grpc_round_trips_are_measured_between_two_processes(tmp_path: Path):
    probes = tuple(pair for pair in ceilings.PAIRS if pair[0] in ("lane-server", "grpc-server"))
    results = ceilings.measure(netns.same_host(), tmp_path, probes)
    assert set(results) == {
        "gRPC unary round trip p50 (us), gRPC defaults",
        "gRPC unary round trip p50 (us), kvpool's settings",
        "gRPC unary round trip p50 (us), kvpool's settings, TLS + token",
        "metadata lane round trip p50 (us)",
        "metadata lane round trip p50 (us), TLS + token",
    }
    assert all(0 < us < 1_000_000 for us in results.values())
    costs = ceilings.tls_costs(results)
    assert [what for what, _, _ in costs] == [
        "gRPC unary round trip",
        "metadata lane round trip",
    ]
