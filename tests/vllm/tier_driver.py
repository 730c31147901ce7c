"""The tests' end of ``tier_host.py``: a vLLM scheduler process and the tiers built in it."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
HOST_SCRIPT = Path(__file__).with_name("tier_host.py")
TIER = {"type": "KVPoolTierManager", "module_path": "kvpool.vllm"}
#: Importing vLLM on a busy 2-core machine.
START_TIMEOUT = 180.0
CALL_TIMEOUT = 120.0


class HostError(RuntimeError):
    """A call the host answered with an exception: ``kind`` is its type's name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@functools.cache
def vllm_python() -> Path:
    """The interpreter of .venv-vllm; an error with the fix when it is missing (never a skip:
    scripts/test.sh installs it, so CI has it), or when the kvpool it imports is not this
    checkout's: the virtualenv is shared by the machine's checkouts (install_vllm.sh), and
    tests run against another one's code would pass or fail for that code."""
    if not VLLM_PYTHON.exists():
        raise RuntimeError(
            f"{VLLM_PYTHON} is missing: run scripts/install_vllm.sh (scripts/test.sh does)"
        )
    found = subprocess.run(
        [str(VLLM_PYTHON), "-c", FIND_KVPOOL], capture_output=True, text=True, timeout=60
    )
    origin = found.stdout.strip()
    if found.returncode != 0 or not Path(origin).resolve().is_relative_to(ROOT):
        raise RuntimeError(
            f"{VLLM_PYTHON} imports kvpool from {origin or 'nowhere'} "
            f"({found.stderr.strip()[-200:] or 'not this checkout'}), not from {ROOT}: run "
            "scripts/install_vllm.sh here (seconds: it installs only kvpool again)"
        )
    return VLLM_PYTHON


#: Where .venv-vllm's kvpool lives, found without importing it (that would import vLLM).
FIND_KVPOOL = "import importlib.util as u; print(u.find_spec('kvpool').origin)"


class TierHost:
    """One ``tier_host.py`` process; ``call`` sends one operation and returns its answer."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [str(vllm_python()), str(HOST_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # vLLM's and kvpool's logs: shown by pytest on failure
            text=True,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        )
        self._read(START_TIMEOUT)

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.process.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(timeout)
        if not box or not box[0]:
            self.process.kill()
            raise RuntimeError(f"the vLLM host gave no answer within {timeout} s (or exited)")
        return json.loads(box[0])

    def call(self, op: str, timeout: float = CALL_TIMEOUT, **arguments: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        with self._lock:
            self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
            self.process.stdin.flush()
            answer = self._read(timeout)
        if not answer.pop("ok"):
            raise HostError(answer["error"], answer["message"])
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Tier:
    """A kvpool tier built by vLLM inside ``host``, and the primary slots it moves."""

    def __init__(self, host: TierHost, **create: Any) -> None:
        self.host = host
        self.info = host.call("create", **create)
        self.id = self.info["tier_id"]
        self.closed = False

    def __getattr__(self, op: str) -> Any:
        return lambda **arguments: self.host.call(op, tier_id=self.id, **arguments)

    def run(self, op: str, job_id: int, keys: list[int], slots: list[int]) -> dict[str, Any]:
        """Submits one store or load job and waits for its answer; the answer's fields plus
        ``submit_s`` (how long the submit call took) and ``longest_poll_s``."""
        submitted = self.host.call(op, tier_id=self.id, job_id=job_id, keys=keys, slots=slots)
        waited = self.host.call("wait", tier_id=self.id, job_ids=[job_id])
        assert not waited["unanswered"], f"job {job_id} unanswered: {waited}"
        (result,) = [r for r in waited["results"] if r["job_id"] == job_id]
        return {**result, **submitted, "longest_poll_s": waited["longest_poll_s"]}

    def shutdown(self) -> dict[str, Any]:
        self.closed = True
        return self.host.call("shutdown", tier_id=self.id)
