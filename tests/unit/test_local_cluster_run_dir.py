"""A local cluster's run directory (``kvpool up --run-dir``, the tests' clusters) is made
private: its logs may name keys, which are as sensitive as the prompts they come from."""

from __future__ import annotations

import stat

from kvpool.local_cluster import LocalCluster


def test_a_run_directory_made_for_the_cluster_is_private(tmp_path):
    run_dir = tmp_path / "new" / "run"
    LocalCluster(1, "64MiB", run_dir=run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
