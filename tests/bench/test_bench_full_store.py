"""The full-store latency bench fills a real cluster's store past its watermark with every put
succeeding, and reports percentiles in order."""

from __future__ import annotations

import json
from pathlib import Path

from bench import full_store


def test_a_store_kept_full_reports_ordered_percentiles_for_each_size(tmp_path: Path):
    out = tmp_path / "full_store.json"
    assert (
        full_store.main(
            ["--store", "16MiB", "--sizes", "4KiB", "--seconds", "1", "--json", str(out)]
        )
        == 0
    )
    [row] = json.loads(out.read_text()).values()
    percentiles = [row[f"p{p * 100:g} (ms)"] for p in full_store.PERCENTILES]
    assert 0 < percentiles[0] <= percentiles[1] <= percentiles[2] <= percentiles[3]
    assert percentiles[3] <= row["max (ms)"]
    assert row["batches/s"] > 0
