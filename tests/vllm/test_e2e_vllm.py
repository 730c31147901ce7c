"""vLLM itself, on CPU, with kvpool behind it both ways: scripts/e2e_vllm.sh, as CI runs it.

The script makes a tiny random Llama, starts a secure local kvpool cluster and, for each way
(kvpool's offloading tier; LMCache's server with kvpool as L2), serves one prompt, restarts
every cache and serves it again. It prints a line per check; this test reads them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Four engine starts and two LMCache server starts (~21 s each on an idle 2-core machine).
TIMEOUT = 1200


@pytest.mark.timeout(TIMEOUT + 60)
def test_vllm_serves_the_prompt_s_blocks_from_kvpool_both_ways(tmp_path):
    run = subprocess.run(
        ["bash", "scripts/e2e_vllm.sh", "--work", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    lines = run.stdout.splitlines()
    report = "\n".join(lines[-60:]) + "\n" + run.stderr[-3000:]
    assert run.returncode == 0, report
    assert lines[-1].startswith("E2E OK"), report
    for way in ("tier", "lmcache"):
        checks = [line for line in lines if line.startswith(f"ok: {way}:")]
        # the uncached run found nothing, the restarted engine found the prompt's blocks
        # (vLLM's count and its metric), kvpool served them, and the output is the same
        assert any("cold run found nothing cached" in c for c in checks), report
        assert any("warm run:" in c for c in checks), report
        assert any("external hit tokens" in c for c in checks), report
        assert any("the kvpool master located" in c for c in checks), report
        assert any("warm output equals the uncached run's" in c for c in checks), report
    assert "ok: tier: vLLM counted" in run.stdout, report  # bytes read from the kvpool tier
    assert "ok: lmcache: the restarted server prefetched from L2 (kvpool)" in run.stdout, report
    assert "ok: both ways' uncached runs agree" in run.stdout, report
