"""Servers collect garbage in rarer, larger passes and never walk what start-up allocated."""

from __future__ import annotations

import subprocess
import sys

from kvpool.common.gc_tuning import YOUNG_THRESHOLD


def test_a_tuned_server_process_collects_less_often_and_freezes_start_up():
    script = (
        "import gc\n"
        "from kvpool.common.gc_tuning import tune_for_server\n"
        "default = gc.get_threshold()\n"
        "tune_for_server()\n"
        "print(default[0], gc.get_threshold()[0], gc.get_freeze_count())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    default, tuned, frozen = map(int, result.stdout.split())
    assert tuned == YOUNG_THRESHOLD > default
    assert frozen > 1000, "start-up objects are out of every collection"
