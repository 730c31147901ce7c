"""The checks run on a history, without I/O: what the clients saw must be possible.

- **wrong bytes**: a get that returned bytes other than the value put under its key (each key
  is put once, with a value that is a function of the key);
- **untyped errors**: a call that failed with an exception that is not a ``KVPoolError``;
- **deadlines**: a call that took longer than the client's timeout plus ``slack``, unless it
  overlapped a stall (SIGSTOP) of its own client process, which freezes its clock's reader;
- **acknowledged objects**: ``must_exist`` names the keys whose put succeeded and that no
  remove could have removed (every remove of theirs answered ``ObjectHasLease``): after the
  faults heal each must read back exact. This suite never destroys a node's memory (its
  faults stop, cut off or slow processes, which all come back), so every replica's node
  "stayed alive or came back", and each such key lost is a finding. The cluster is sized
  so that nothing is evicted (``docs/reliability.md``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from bench.chaos.history import Op

#: Results a remove can give that say for certain the object is still there.
REMOVE_REFUSED = {"ObjectHasLease"}


@dataclass(frozen=True)
class Stall:
    process: str
    start: float
    end: float


@dataclass
class Findings:
    operations: int = 0
    by_result: Counter = field(default_factory=Counter)
    wrong_bytes: list[Op] = field(default_factory=list)
    untyped: list[Op] = field(default_factory=list)
    late: list[Op] = field(default_factory=list)
    longest: Op | None = None  # the longest call not exempt from its deadline
    exempt: int = 0  # calls that overlapped their own client's stall
    #: gets of an acknowledged, not removed object answered ObjectNotFound during the run
    #: (its replicas' nodes declared dead for a while: allowed, if it reads back later)
    not_found_acknowledged: int = 0

    def summary(self) -> dict:
        return {
            "operations": self.operations,
            "by_result": dict(sorted(self.by_result.items())),
            "wrong_bytes": len(self.wrong_bytes),
            "untyped_errors": len(self.untyped),
            "past_deadline": len(self.late),
            "longest_call_s": round(self.longest.duration, 3) if self.longest else 0.0,
            "longest_call": _describe(self.longest) if self.longest else "",
            "exempt_stalled": self.exempt,
            "not_found_acknowledged": self.not_found_acknowledged,
        }


def _describe(op: Op) -> str:
    return f"{op.client} {op.op} {op.key} -> {op.result} {op.detail[:120]}".strip()


def check(ops: Iterable[Op], timeout: float, slack: float, stalls: list[Stall]) -> Findings:
    findings = Findings()
    stalls_of: dict[str, list[Stall]] = defaultdict(list)
    for stall in stalls:
        stalls_of[stall.process].append(stall)
    ops = list(ops)
    acknowledged = {op.key: op.end for op in ops if op.op == "put" and op.ok}
    first_remove: dict[str, float] = {}
    for op in ops:
        if op.op == "remove":
            first_remove[op.key] = min(op.start, first_remove.get(op.key, op.start))
    for op in ops:
        if (
            op.op == "get"
            and op.result == "ObjectNotFound"
            and acknowledged.get(op.key, float("inf")) < op.start
            and first_remove.get(op.key, float("inf")) > op.end
        ):
            findings.not_found_acknowledged += 1
        findings.operations += 1
        findings.by_result[f"{op.op}:{op.result}"] += 1
        if op.op == "get" and op.ok and op.digest != op.expected:
            findings.wrong_bytes.append(op)
        if op.result.startswith("untyped:"):
            findings.untyped.append(op)
        if any(s.start < op.end and op.start < s.end for s in stalls_of[op.client]):
            findings.exempt += 1
            continue
        if op.duration > timeout + slack:
            findings.late.append(op)
        if findings.longest is None or op.duration > findings.longest.duration:
            findings.longest = op
    return findings


def must_exist(ops: Iterable[Op], before: float = float("inf")) -> dict[str, int]:
    """Keys (with their sizes) whose put was acknowledged and that nothing removed, among
    calls begun before ``before``."""
    acknowledged: dict[str, int] = {}
    maybe_removed: set[str] = set()
    for op in ops:
        if op.start >= before:
            continue
        if op.op == "put" and op.ok:
            acknowledged[op.key] = op.size
        elif op.op == "remove" and op.result not in REMOVE_REFUSED:
            maybe_removed.add(op.key)
    return {k: size for k, size in acknowledged.items() if k not in maybe_removed}


def removed_since(ops: Iterable[Op], keys: set[str]) -> set[str]:
    """Which of ``keys`` a remove (of any outcome but a refusal) was issued for."""
    return {
        op.key
        for op in ops
        if op.op == "remove" and op.key in keys and op.result not in REMOVE_REFUSED
    }
