"""The SGLang backend's benchmark runs against a cluster and prints its table (small pages,
one round: the figures themselves are for people, in docs/sglang.md)."""

from __future__ import annotations

from bench import sglang_plugin


def test_the_benchmark_compares_every_backend_path_with_the_raw_client(sg_cluster, capsys):
    argv = ["--master", sg_cluster.master_address, "--page-tokens", "4", "--layers", "2"]
    assert sglang_plugin.main([*argv, "--batch", "4", "--rounds", "1"]) == 0
    table = capsys.readouterr().out
    for path in ("raw store", "raw load", "raw exists+load"):
        assert f"| {path} " in table
    for path in ("backend store", "backend load", "backend exists+load"):
        assert f"| {path} " in table
