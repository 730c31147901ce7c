"""``kvpool bench --nvme-disk`` measures a real cluster's NVMe tier beside dd on the same file
system: every workload gets a figure from every round, compared with dd of its direction;
and the cold reads are cold (the node keeps no recorded object's pages mapped, so the bench
can drop them from the page cache)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import nvme_disk, throughput


def test_every_workload_has_a_figure_per_round_beside_dd(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(nvme_disk, "DD_BYTES", 64 << 20)  # dd's share of the test: small
    out = tmp_path / "nvme.json"
    argv = ["--nvme-disk", "--nvme-dir", str(tmp_path), "--nvme-size", "256MiB", "--dram"]
    argv += ["64MiB", "--nodes", "1", "--sizes", "256KiB", "--bytes", "8MiB", "--runs", "2"]
    assert throughput.main([*argv, "--in-flight", "3", "--batch", "4", "--json", str(out)]) == 0

    result = json.loads(out.read_text())
    assert len(result["dd"]["write"]) == len(result["dd"]["read"]) == 2
    assert all(gbps > 0 for gbps in result["dd"]["write"] + result["dd"]["read"])
    rows = {row["workload"]: row for row in result["rows"]}
    assert list(rows) == ["put", "put x3 threads", "put_many x4, 3 threads", "get cold", "get warm"]
    assert [rows[w]["in_flight"] for w in rows] == [1, 3, 12, 3, 3]
    assert all(len(row["gbps"]) == 2 and min(row["gbps"]) > 0 for row in rows.values())
    assert rows["get cold"]["direction"] == "read" and rows["put"]["direction"] == "write"
    printed = capsys.readouterr().out
    assert "% of dd" in printed
    assert "stayed in the page cache" not in printed, "the cold reads came from the disk"


def test_cached_bytes_sees_what_a_read_brought_in_and_a_drop_let_go(tmp_path: Path):
    path = tmp_path / "file"
    path.write_bytes(b"x" * (4 << 20))
    path.read_bytes()
    assert nvme_disk.cached_bytes(path) == 4 << 20
    nvme_disk._drop_page_cache([path])
    assert nvme_disk.cached_bytes(path) == 0
