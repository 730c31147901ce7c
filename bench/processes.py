"""Child processes of the benchmark: servers with a log file, and runners that take commands.

A ``RunnerProcess`` runs one of the runner scripts (see ``workloads.py``): commands go to its
stdin as JSON lines, answers come back as ``@@ {json}`` lines on its stdout, read by a thread
so that every wait has a timeout. Its stderr goes to a log file, shown when something fails.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

PREFIX = "@@ "


class BenchProcessError(RuntimeError):
    pass


class ServerProcess:
    """A long-lived child (a master, a store) with its output in ``log_path``."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str]
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(
            list(argv), env=dict(env), start_new_session=True, **self._streams()
        )

    def _streams(self) -> dict:
        """Where the child's standard streams go: all its output to the log."""
        return {"stdin": subprocess.DEVNULL, "stdout": self._log, "stderr": subprocess.STDOUT}

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 5.0) -> None:
        stop_popen(self.popen, timeout)
        self._log.close()


class RunnerProcess(ServerProcess):
    """A runner: ``request(cmd)`` sends one command and returns its answer."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str]
    ) -> None:
        super().__init__(name, argv, log_path, env)
        self._answers: queue.Queue[dict | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._reader.start()
        self.ready: dict | None = None

    def _streams(self) -> dict:
        """Commands in on stdin, answers out on stdout (line by line), stderr to the log."""
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": self._log}
        return {**pipes, "text": True, "bufsize": 1}

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith(PREFIX):
                self._answers.put(json.loads(line[len(PREFIX) :]))
        self._answers.put(None)  # end of output: the process is gone

    def wait_ready(self, timeout: float = 120.0) -> dict:
        self.ready = self.receive(timeout)
        return self.ready

    def send(self, cmd: dict) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(json.dumps(cmd) + "\n")
            self.popen.stdin.flush()
        except BrokenPipeError:
            raise BenchProcessError(f"{self.name} is gone:\n{self.log_tail()}") from None

    def receive(self, timeout: float = 300.0) -> dict:
        try:
            answer = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise BenchProcessError(
                f"{self.name} did not answer within {timeout:.0f} s:\n{self.log_tail()}"
            ) from None
        if answer is None:
            raise BenchProcessError(f"{self.name} exited ({self.popen.poll()}):\n{self.log_tail()}")
        if "error" in answer:
            raise BenchProcessError(f"{self.name}: {answer['error']}\n{self.log_tail()}")
        return answer

    def request(self, cmd: dict, timeout: float = 300.0) -> dict:
        self.send(cmd)
        return self.receive(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            try:
                self.send({"op": "quit"})
                self.popen.wait(timeout)
            except (BenchProcessError, subprocess.TimeoutExpired, OSError):
                pass
        stop_popen(self.popen, 5.0)
        self._log.close()


def stop_popen(popen: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout``."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def free_port() -> int:
    """A TCP port free on loopback now (for servers that cannot report the one they took)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``extra`` (UCX_* and MC_* settings pass through: the
    results record them)."""
    return {**os.environ, **(extra or {})}


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread, children excluded) of process ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # (the command may hold spaces, parentheses)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def resident_mib(pid: int) -> float:
    """Process ``pid``'s resident memory now (``VmRSS``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")
